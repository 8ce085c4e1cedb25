/* pdp_impl.c - pdp.h's implementation, compiled once per build mode for the tests and the
   examples (see "building the tests" in the Makefile): at $(OPT) into $(B)/pdp_impl.o (and
   with -DPDP_CUDA for make cuda and the CUDA emulation). PDP__TEST_LINKAGE gives the private functions
   (PDP__PRIVATE) external linkage, so the internal tests call them from their own object.
   Its PDP_MALLOC counts and takes a test's own allocator through hooks
   (tests/counting_alloc.h); the programs linked against it are compiled with
   -DPDP__IMPLEMENTATION_INCLUDED, so their own `#define PDP_IMPLEMENTATION` adds nothing. */
#define _POSIX_C_SOURCE 200809L
#define PDP__TEST_LINKAGE
/* the AMX driver on emulated tiles as well (gemm_amx.c), for test_bf16; a build whose CPU has
   AMX then tests each tile operation's `e` (NULL: the instruction) */
#define PDP__AMX_EMULATE 1
#include "counting_alloc.h"
#define PDP_IMPLEMENTATION
#include "pdp.h"
