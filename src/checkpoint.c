/* checkpoint: (to be written) */

#include "internal.h"
