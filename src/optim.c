/* optim: (to be written) */

#include "internal.h"
