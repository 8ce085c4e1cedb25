/* comm_mpi: (to be written) */

#include "internal.h"
