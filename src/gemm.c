/* gemm: (to be written) */

#include "internal.h"
