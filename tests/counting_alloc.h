/* counting_alloc.h - the tests' counting PDP_MALLOC / PDP_FREE. Include it before pdp.h.

   Every PDP_MALLOC of the library adds one to a counter (atomically: worker threads allocate
   too) that pdp_test_allocs() reads; PDP_FREE is free(). Tests assert on differences, e.g.
   "the hot loop allocates nothing". A test compiled on its own (cc tests/test_dp.c) gets the
   definitions from this header. `make test` compiles the implementation once per build mode,
   from tests/pdp_impl.c, and links the tests against it: those are compiled with
   -DPDP_TEST_SHARED_IMPL, this header then only declares, and the counter is the one in the
   object, which counts every allocation of the library. There a test that brings its own
   PDP_MALLOC / PDP_FREE gets them through the hooks (set by tests/pdp_linked.h): after
   counting, the object's allocations go to pdp_test_malloc_hook / pdp_test_free_hook when
   they are set, to malloc / free otherwise. */
#ifndef PDP_TEST_COUNTING_ALLOC_H
#define PDP_TEST_COUNTING_ALLOC_H

#include <stdlib.h>

void *pdp_test_malloc(size_t bytes);
void pdp_test_free(void *p);
long pdp_test_allocs(void); /* PDP_MALLOC calls so far, from any thread */
extern void *(*pdp_test_malloc_hook)(size_t bytes);
extern void (*pdp_test_free_hook)(void *p);

#define PDP_MALLOC(bytes) pdp_test_malloc(bytes)
#define PDP_FREE(ptr) pdp_test_free(ptr)

#ifndef PDP_TEST_SHARED_IMPL
static long pdp_test__allocs;
void *(*pdp_test_malloc_hook)(size_t bytes);
void (*pdp_test_free_hook)(void *p);

void *pdp_test_malloc(size_t bytes)
{
    __atomic_add_fetch(&pdp_test__allocs, 1, __ATOMIC_RELAXED);
    return pdp_test_malloc_hook ? pdp_test_malloc_hook(bytes) : malloc(bytes);
}

void pdp_test_free(void *p)
{
    if (pdp_test_free_hook)
        pdp_test_free_hook(p);
    else
        free(p);
}

long pdp_test_allocs(void) { return __atomic_load_n(&pdp_test__allocs, __ATOMIC_RELAXED); }
#endif

#endif /* PDP_TEST_COUNTING_ALLOC_H */
