/* layers: (to be written) */

#include "internal.h"
