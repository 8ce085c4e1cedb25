/* data: (to be written) */

#include "internal.h"
