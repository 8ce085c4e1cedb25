/* ops: (to be written) */

#include "internal.h"
