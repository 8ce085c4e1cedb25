/* loss: (to be written) */

#include "internal.h"
