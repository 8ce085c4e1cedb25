/* PDP_MALLOC / PDP_FREE overrides: every allocation goes through them. This is the
   second translation unit of the PDP_STATIC check (tu_static.c is the first, with main):
   two copies of the library in one program, one of them with its own allocator. */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
static long live;
static void *count_malloc(size_t n) { live++; return malloc(n); }
static void count_free(void *p) { if (p) live--; free(p); }
#define PDP_MALLOC(bytes) count_malloc(bytes)
#define PDP_FREE(ptr) count_free(ptr)
#define PDP_STATIC
#define PDP_IMPLEMENTATION
#include "pdp.h"

int tu_static_b(void); /* 1 when a tensor's two allocations were counted, then freed */
int tu_static_b(void)
{
    pdp_tensor *t;
    int64_t shape[2] = {8, 8};
    if (pdp_tensor_create(&t, pdp_cpu(), 2, shape) != PDP_OK || live != 2) return 0;
    pdp_tensor_free(t);
    return live == 0;
}
