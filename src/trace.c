/* trace: (to be written) */

#include "internal.h"
