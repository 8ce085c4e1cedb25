/* comm: (to be written) */

#include "internal.h"
