/* ddp: (to be written) */

#include "internal.h"
