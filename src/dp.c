/* dp: (to be written) */

#include "internal.h"
