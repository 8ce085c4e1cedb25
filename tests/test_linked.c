/* Tests of the way `make test` builds the internal tests (see "building the tests" in the
   Makefile): this file brings its own PDP_MALLOC / PDP_FREE, as test_alloc_fail, test_zero
   and others do, and calls private functions (pdp__alloc, pdp__err). Linked against the
   tests' implementation object ($(B)/pdp_impl.o), every allocation of the library must
   still reach this file's allocator (through the hooks of tests/pdp_linked.h), or those tests
   would pass without injecting a single failure; built alone (cc tests/test_linked.c) it
   compiles the implementation itself and checks the same. */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <string.h>

static long own_allocs, own_frees; /* this file's allocator's calls (one thread here) */
static void *own_malloc(size_t n) { own_allocs++; return malloc(n); }
static void own_free(void *p) { if (p) own_frees++; free(p); }
#define PDP_MALLOC(n) own_malloc(n)
#define PDP_FREE(p) own_free(p)
#define PDP_IMPLEMENTATION
#include "pdp.h"
#include "pdp_test.h"

TEST own_allocator_gets_the_library_allocations(void)
{
    int64_t shape[2] = {3, 5};
    pdp_tensor *t = NULL;
    long a0 = own_allocs, f0 = own_frees;
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_create(&t, pdp_cpu(), 2, shape), pdp_status_name);
    ASSERT_GT(own_allocs, a0); /* the struct and its data, at least */
    pdp_tensor_free(t);
    ASSERT_EQ(own_allocs - a0, own_frees - f0);
    PASS();
}

TEST private_functions_are_callable(void)
{
    long a0 = own_allocs;
    void *p = pdp__alloc(100);
    ASSERT(p != NULL);
    ASSERT_EQ(0, (int)((uintptr_t)p % PDP__ALIGN));
    ASSERT_EQ(a0 + 1, own_allocs);
    pdp__dealloc(p);
    ASSERT_ENUM_EQ(PDP_ERR_SHAPE, pdp__err(PDP_ERR_SHAPE, "test_linked: %d", 7), pdp_status_name);
    ASSERT_STR_EQ("test_linked: 7", pdp_last_error());
    PASS();
}

SUITE(linked)
{
    RUN_TEST(own_allocator_gets_the_library_allocations);
    RUN_TEST(private_functions_are_callable);
}

GREATEST_MAIN_DEFS();

int main(int argc, char **argv)
{
    GREATEST_MAIN_BEGIN();
    RUN_SUITE(linked);
    GREATEST_MAIN_END();
}
