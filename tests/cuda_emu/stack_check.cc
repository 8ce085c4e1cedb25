/* stack_check.cc - under ASan (make emu-cuda-test with -fsanitize=address), the emulator keeps
   a kernel thread's stack poisoned as a real thread's is: each thread of this kernel fills a
   local array, waits at __syncthreads (its fiber parks and resumes) and reads element i.
   `stack_check` (i = 0) must print "no report"; `stack_check overflow` (i = 8, one past the
   end) must die with ASan's stack-buffer-overflow. Before the emulator took the stacks'
   shadow over from ASan's swapcontext interceptor (which cleared it at every resume), the
   overflow passed unreported. */
#include "cuda_runtime.h"

#include <cstdio>

/* UBSan's checks would stop the read before ASan sees it: this one is ASan's */
__attribute__((noinline, no_sanitize("undefined"))) int read_at(volatile int *p, int i)
{
    return p[i];
}

__global__ void read_after_barrier(int *out, int i)
{
    volatile int a[8];
    for (int j = 0; j < 8; j++) a[j] = j;
    __syncthreads();
    out[threadIdx.x] = read_at(a, i);
}

int main(int argc, char **argv)
{
    int *d = nullptr;
    (void)argv;
    if (cudaMalloc((void **)&d, 64 * sizeof(int)) != cudaSuccess) return 1;
    PDP_EMU_LAUNCH(read_after_barrier, dim3(2), dim3(32), 0, 0)(d, argc > 1 ? 8 : 0);
    if (cudaStreamSynchronize(0) != cudaSuccess) return 1;
    cudaFree(d);
    puts("no report");
    return 0;
}
