/* store: (to be written) */

#include "internal.h"
