/* pdp_linked.h - what a test linked against the tests' implementation object needs. pdp.h
   includes it, after the public API, when the test is compiled with PDP__INTERNAL_API (the
   Makefile does that for the tests it links against $(B)/pdp_impl.o):
   - the implementation's declarations without their definitions (the generated
     pdp_internal.h): private structs, macros, PDP__PRIVATE prototypes;
   - when the test brought its own PDP_MALLOC / PDP_FREE (allocation budgets, failure
     injection, counters), hooks that route the object's allocations to them: the object's
     PDP_MALLOC is pdp_test_malloc (tests/counting_alloc.h), which counts and then calls
     pdp_test_malloc_hook when set, so the test sees every allocation of the library, from
     any thread, as when it compiled the implementation itself. */
#ifndef PDP_LINKED_H_INCLUDED
#define PDP_LINKED_H_INCLUDED

/* (asked before pdp_internal.h, whose internal.h gives PDP_MALLOC its default) */
#if defined(PDP_MALLOC) && !defined(PDP_TEST_COUNTING_ALLOC_H)
#  define PDP_TEST__OWN_ALLOC 1
#endif

#include "pdp_internal.h"

#ifdef PDP_TEST__OWN_ALLOC
extern void *(*pdp_test_malloc_hook)(size_t bytes);
extern void (*pdp_test_free_hook)(void *p);
static void *pdp_test__own_malloc(size_t bytes) { return PDP_MALLOC(bytes); }
static void pdp_test__own_free(void *p) { PDP_FREE(p); }
/* before main: no allocation of the library can come earlier */
__attribute__((constructor)) static void pdp_test__own_alloc_install(void)
{
    pdp_test_malloc_hook = pdp_test__own_malloc;
    pdp_test_free_hook = pdp_test__own_free;
}
#endif

#endif /* PDP_LINKED_H_INCLUDED */
