/* pdp_impl.c - pdp.h's implementation, compiled once for the tests and examples that use the
   public API only (see "one implementation object" in the Makefile). Its PDP_MALLOC counts
   (tests/counting_alloc.h); the programs linked against it are compiled with
   -DPDP__IMPLEMENTATION_INCLUDED, so their own `#define PDP_IMPLEMENTATION` adds nothing. */
#define _POSIX_C_SOURCE 200809L
#include "counting_alloc.h"
#define PDP_IMPLEMENTATION
#include "pdp.h"
