/* cuda_emu: a CPU emulation of the CUDA runtime, cuBLAS and NCCL subset that
   pdp_cuda.cu uses, so that the REAL pdp_cuda.cu - its kernels' index math,
   block reductions and warp shuffles, launch configurations, the cuBLAS
   row-major/column-major argument conventions, the caching allocator and the
   NCCL calls - runs and is tested on a machine without a GPU. `make
   emu-cuda-test` rewrites pdp_cuda.cu's launches (rewrite.py), compiles it with
   g++ against tests/cuda_emu/include, links it with this file and runs
   test_cuda, test_optim and test_checkpoint on PDP_EMU_CUDA_DEVICES = 1, 2 and
   3 devices (default 2; 0 reports cudaErrorNoDevice).

   What it checks, each as a GPU would fail (an error code) plus a line
   "cuda_emu: ..." on stderr saying why:
   - Launches. Every block runs on the launching host thread, blocks in order;
     a block's threads are coroutines (fibers) that switch at __syncthreads
     and __shfl_down_sync, so barriers and warp exchanges really meet, in
     thread order and backwards on alternate phases (a missing barrier between
     a write and another thread's read changes the result). A bad
     configuration (a dimension 0, more than 1024 threads, ...) gives
     cudaErrorInvalidConfiguration; a barrier some threads skip or a shuffle
     over a diverged warp fails the launch; a pointer argument that is not
     NULL and not inside a live allocation of the launching device (a host
     pointer, another GPU's or freed memory) gives cudaErrorIllegalAddress.
     __shared__ memory is per host thread and outlives the block (as garbage).
   - Memory. cudaMalloc blocks are malloc'd, tagged with their device and
     filled with NaN bytes, so reads of memory nobody wrote show up; every
     copy and memset checks the direction and that each device range lies in
     one live allocation of the right device (the stream's; for peer copies the
     named ones); kernels, GEMMs and collectives on a stream of another device
     than the current one fail. Under ASan an overrun past an allocation is
     reported where it happens.
   - cuBLAS. cublasSgemm and cublasSgemmStridedBatched are naive column-major
     loops with double accumulation; cublasGemmEx and cublasGemmStridedBatchedEx
     the same on fp32 inputs, and on bf16 inputs (CUDA_R_16BF, fp32 C, a 32F
     compute type; other combinations CUBLAS_STATUS_NOT_SUPPORTED) exact products
     summed in fp32 in k order. All with the documented argument checks
     (m, n, k >= 0, lda >= max(1, rows of op(A) as stored), ...; else
     CUBLAS_STATUS_INVALID_VALUE) and every operand's extent checked against
     its allocation. beta = 0 overwrites C without reading it. TF32 math mode is
     accepted and ignored.
   - NCCL. The ranks of one process form a clique (ncclCommInitAll, or
     ncclCommInitRankConfig calls with one unique id; two ranks on one device
     are ncclInvalidUsage, as NCCL's "Duplicate GPU detected"). A collective is
     asynchronous as on a GPU: it is recorded on its stream and completes when
     the last rank enqueues it (reducing in rank order, so deterministically);
     until then events recorded after it are not ready and the stream's later
     work waits. The n-th collective of every rank must agree on kind, count,
     datatype, op and root, else the clique fails with ncclInvalidUsage.
     Non-blocking communicators answer ncclInProgress to init, each collective
     and finalize, and ncclCommGetAsyncError settles them. ncclSend/ncclRecv
     queue in the thread's ncclGroupStart/End group and match per (sender,
     receiver) pair in issue order; a group completes when all its messages
     have; a count or datatype mismatch is reported and never completes (NCCL
     hangs or corrupts). ncclCommSplit (config NULL) blocks until every rank of
     the clique calls it and ranks the new cliques by (key, old rank).

   What it cannot check: real concurrency between streams (work runs at
   enqueue, except collectives), timing, warp-synchronous code without
   __syncwarp, TF32 and other GPU numerics (exp/log are the host's), memory
   limits and performance; NCCL across processes (ranks of different processes
   never meet: their init times out); a pointer a kernel finds inside a struct
   argument; an overrun that stays inside the caching allocator's size class.
   tests/gpu/run.sh on a GPU is still the real test. */

#include <cuda_runtime.h>
#include <cublas_v2.h>
#include <nccl.h>

#include "src/math.h" /* pdp.h's bf16/fp16 conversions: the 16-bit reductions */

#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <algorithm>
#include <string>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#  include <sanitizer/asan_interface.h>
#  include <sanitizer/common_interface_defs.h>
#  define EMU_ASAN 1
#endif
#if defined(__SANITIZE_THREAD__)
#  include <sanitizer/tsan_interface.h>
#  define EMU_TSAN 1
#endif

thread_local uint3 threadIdx, blockIdx;
thread_local dim3 blockDim, gridDim;

namespace {

const double WAIT_S = 60.0; /* the longest the emulator blocks a host thread */

std::mutex mu; /* guards everything below except the per-thread block state */
std::condition_variable cv;
thread_local int cur_dev = 0;
thread_local cudaError_t last_error = cudaSuccess;

void complain(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("cuda_emu: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

cudaError_t fail(cudaError_t e)
{
    last_error = e;
    return e;
}

int ndev()
{
    static int n = [] {
        const char *s = getenv("PDP_EMU_CUDA_DEVICES");
        return s && *s ? atoi(s) : 2;
    }();
    return n;
}

/* ---- cuda_emu: memory registry ---- */

struct Alloc {
    size_t bytes;
    int dev;
};
std::map<uintptr_t, Alloc> allocs;

/* 1: [p, p + bytes) lies in a live allocation (*dev set); 0: p is no device memory;
   -1: p is in an allocation but the range runs past its end. Under mu. */
int find(const void *p, size_t bytes, int *dev)
{
    uintptr_t a = (uintptr_t)p;
    auto it = allocs.upper_bound(a);
    if (it == allocs.begin()) return 0;
    --it;
    if (a >= it->first + it->second.bytes) return 0;
    *dev = it->second.dev;
    return a + bytes <= it->first + it->second.bytes ? 1 : -1;
}

/* Complains and returns false unless [p, p + bytes) is memory of device dev. */
bool on_dev(const char *what, const void *p, size_t bytes, int dev)
{
    int d = -1, r = find(p, bytes, &d);
    if (r == 1 && d == dev) return true;
    complain("%s: %p (%zu bytes) is %s, not memory of CUDA device %d", what, p, bytes,
             r == 0 ? "host or freed memory" : r < 0 ? "past the end of its allocation"
                                                      : "memory of another device", dev);
    return false;
}

bool on_host(const char *what, const void *p)
{
    int d;
    if (!find(p, 1, &d)) return true;
    complain("%s: the host pointer %p is memory of CUDA device %d", what, p, d);
    return false;
}

/* ---- cuda_emu: asynchronous work (collectives), streams and events ---- */

struct Clique;
struct Group;
/* "collective seq of clique clq": done once clq->completed > seq; or "the send/recv
   group grp": done once all its messages are; empty = done */
struct Pending {
    std::shared_ptr<Clique> clq;
    uint64_t seq = 0;
    std::shared_ptr<Group> grp;
    bool done() const;
};

bool wait_for(std::unique_lock<std::mutex> &lk, const Pending &p, const char *what)
{
    if (cv.wait_for(lk, std::chrono::duration<double>(WAIT_S), [&] { return p.done(); }))
        return true;
    complain("%s: a collective or send/recv group enqueued before it did not complete within %g "
             "s (a rank missing?)", what, WAIT_S);
    return false;
}

} /* namespace */

struct pdp_emu_stream {
    int dev;
    Pending last; /* the last collective enqueued on it */
};
struct pdp_emu_event {
    int dev;
    Pending at;
};

namespace {

std::set<pdp_emu_stream *> streams;
std::set<pdp_emu_event *> events;
pdp_emu_stream default_stream[64];

/* Resolves s (0: the current device's default stream), checks it belongs to the current
   device and waits for the collectives enqueued on it. Under mu. */
cudaError_t stream_begin(std::unique_lock<std::mutex> &lk, const char *what, cudaStream_t *s)
{
    if (!*s) {
        *s = &default_stream[cur_dev];
        (*s)->dev = cur_dev;
    } else if (!streams.count(*s)) {
        complain("%s: %p is no live stream", what, (void *)*s);
        return cudaErrorInvalidResourceHandle;
    } else if ((*s)->dev != cur_dev) {
        complain("%s: the stream is on CUDA device %d, the current device is %d", what,
                 (*s)->dev, cur_dev);
        return cudaErrorInvalidResourceHandle;
    }
    return wait_for(lk, (*s)->last, what) ? cudaSuccess : cudaErrorLaunchTimeout;
}

/* ---- cuda_emu: the block scheduler ----
   One coroutine per thread of the block, each on a stack of its own; they run in
   thread order (backwards every other phase, so that a race between threads with
   no barrier between them changes the result) until each finishes or yields at a
   barrier (F_BAR) or a shuffle (F_WARP). Then the warps whose live lanes all wait
   at a shuffle are released, else, when every thread waits at the barrier, the
   barrier is. */

enum { F_READY, F_BAR, F_WARP, F_DONE };
const size_t STACK = 256 << 10;

/* The switch between fibers. emu_switch(&from, to) saves what the SysV x86-64 ABI makes the
   callee keep (rbx, rbp, r12-r15, the MXCSR and x87 control words) on the current stack,
   stores the stack pointer in from, and resumes the context saved at to; fiber_init writes a
   new stack's first context by hand, returning into fiber_main. No system call: glibc's
   swapcontext sets the signal mask (rt_sigprocmask) at every switch, and getcontext at every
   fiber start: 3.6 million system calls in PDP_SHORT=1 train_mnist -device cuda, which took
   1.71 s of CPU with them and 0.90 s with emu_switch (perf stat). */
#if !defined(__x86_64__)
#  error "cuda_emu runs on x86-64 hosts: its fiber switch (emu_switch) is x86-64 assembly"
#endif
extern "C" void emu_switch(void **from, void *to);
__asm__(".pushsection .text\n"
        ".p2align 4\n"
        ".type emu_switch, @function\n"
        "emu_switch:\n"
        "    pushq %rbp\n"
        "    pushq %rbx\n"
        "    pushq %r12\n"
        "    pushq %r13\n"
        "    pushq %r14\n"
        "    pushq %r15\n"
        "    subq $8, %rsp\n"
        "    stmxcsr (%rsp)\n"
        "    fnstcw 4(%rsp)\n"
        "    movq %rsp, (%rdi)\n"
        "    movq %rsi, %rsp\n"
        "    ldmxcsr (%rsp)\n"
        "    fldcw 4(%rsp)\n"
        "    addq $8, %rsp\n"
        "    popq %r15\n"
        "    popq %r14\n"
        "    popq %r13\n"
        "    popq %r12\n"
        "    popq %rbx\n"
        "    popq %rbp\n"
        "    ret\n"
        ".size emu_switch, .-emu_switch\n"
        ".popsection\n");

struct Fiber {
    void *sp = nullptr; /* its saved context (emu_switch), while it is switched out */
    char *stack = nullptr;
    int state = F_DONE;
    unsigned gen = 0; /* shuffles done: selects the exchange buffer */
    void *fake = nullptr;
    char *parked = nullptr; /* ASan: the frame it last left from (its live frames lie above) */
#ifdef EMU_TSAN
    void *tsan = nullptr;
#endif
};

struct Block {
    std::vector<Fiber> fib;
    std::vector<uint64_t> xchg[2]; /* shuffle values by thread, double-buffered */
    void *main_sp = nullptr; /* the scheduler's saved context, while a fiber runs */
    unsigned n = 0, cur = 0;
    bool running = false;
    const char *error = nullptr;
    void (*body)(void *) = nullptr;
    void *ctx = nullptr;
    const void *main_bottom = nullptr;
    size_t main_size = 0;
    void *main_fake = nullptr;
#ifdef EMU_TSAN
    void *main_tsan = nullptr;
#endif
    ~Block()
    {
        for (Fiber &f : fib) {
            free(f.stack);
#ifdef EMU_TSAN
            if (f.tsan) __tsan_destroy_fiber(f.tsan);
#endif
        }
    }
};
thread_local Block blk;

void set_thread_idx(unsigned t)
{
    threadIdx.x = t % blockDim.x;
    threadIdx.y = t / blockDim.x % blockDim.y;
    threadIdx.z = t / (blockDim.x * blockDim.y);
}

/* from the running fiber back to the scheduler */
void to_main(bool exiting)
{
    Block &b = blk;
    Fiber &f = b.fib[b.cur];
#ifdef EMU_ASAN
    f.parked = (char *)__builtin_frame_address(0);
    __sanitizer_start_switch_fiber(exiting ? nullptr : &f.fake, b.main_bottom, b.main_size);
#endif
#ifdef EMU_TSAN
    __tsan_switch_to_fiber(b.main_tsan, 0);
#endif
    emu_switch(&f.sp, b.main_sp);
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(f.fake, &b.main_bottom, &b.main_size);
#endif
    (void)exiting;
    set_thread_idx(b.cur);
}

[[noreturn]] void fiber_main()
{
    Block &b = blk;
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &b.main_bottom, &b.main_size);
#endif
    b.body(b.ctx);
    b.fib[b.cur].state = F_DONE;
    to_main(true);
    abort(); /* a finished fiber is never resumed (fiber_init starts it afresh) */
}

void resume(Block &b, unsigned t)
{
    Fiber &f = b.fib[t];
    b.cur = t;
    set_thread_idx(t);
#ifdef EMU_ASAN
    __sanitizer_start_switch_fiber(&b.main_fake, f.stack, STACK);
#endif
#ifdef EMU_TSAN
    b.main_tsan = __tsan_get_current_fiber();
    __tsan_switch_to_fiber(f.tsan, 0);
#endif
    emu_switch(&b.main_sp, f.sp);
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(b.main_fake, nullptr, nullptr);
#endif
}

void yield(int state)
{
    Block &b = blk;
    if (!b.running) {
        complain("__syncthreads or a shuffle called outside a kernel");
        abort();
    }
    b.fib[b.cur].state = state;
    to_main(false);
}

/* ASan: a fiber that finished or was abandoned never returned from its last frames, so their
   redzones stay poisoned (every frame that returned unpoisoned itself). Those frames lie
   above where it last switched out (parked), so fiber_init unpoisons [parked - PARK_MARGIN,
   top) only; the margin covers to_main's frame below its frame address. The rest of a stack's
   shadow is left as the fiber's own frames set it: a parked fiber's live locals keep their
   redzones, so an overflow of one after __syncthreads is reported
   (tests/cuda_emu/stack_check.cc). (With glibc's swapcontext, ASan's interceptor cleared the
   whole stack's shadow at every resume: half of an ASan run's time, and it hid that
   overflow.) */
const size_t PARK_MARGIN = 16 << 10;

void fiber_init(Fiber &f)
{
    uint64_t *top = (uint64_t *)(void *)(f.stack + STACK); /* 16-byte aligned (malloc) */
    uint32_t mxcsr;
    uint16_t fpcw;
#ifdef EMU_ASAN
    char *from = f.stack;
    if (f.parked && f.parked >= f.stack + PARK_MARGIN && f.parked <= f.stack + STACK)
        from = f.parked - PARK_MARGIN;
    __asan_unpoison_memory_region(from, (size_t)(f.stack + STACK - from));
#endif
    /* the context emu_switch restores first: the control words it runs under now, six zero
       registers, then a return into fiber_main, entered as a call would (rsp = 8 mod 16) */
    __asm__ volatile("stmxcsr %0\n\tfnstcw %1" : "=m"(mxcsr), "=m"(fpcw));
    top[-1] = 0;                              /* fiber_main's return address: it never returns */
    top[-2] = (uint64_t)(uintptr_t)fiber_main;
    for (int r = 3; r <= 8; r++) top[-r] = 0; /* rbp, rbx, r12-r15 */
    top[-9] = (uint64_t)mxcsr | (uint64_t)fpcw << 32;
    f.sp = top - 9;
    f.state = F_READY;
    f.gen = 0;
}

/* Runs one block; false (b.error set) when its threads cannot meet. */
bool run_block(Block &b)
{
    for (unsigned t = 0; t < b.n; t++) fiber_init(b.fib[t]);
    for (unsigned phase = 0;; phase++) {
        unsigned done = 0, bar = 0, warp = 0;
        for (unsigned i = 0; i < b.n; i++) { /* odd phases backwards: unordered code differs */
            unsigned t = phase & 1 ? b.n - 1 - i : i;
            if (b.fib[t].state == F_READY) resume(b, t);
        }
        if (b.error) return false;
        for (unsigned t = 0; t < b.n; t++) {
            int s = b.fib[t].state;
            done += s == F_DONE;
            bar += s == F_BAR;
            warp += s == F_WARP;
        }
        if (done == b.n) return true;
        if (warp) {
            for (unsigned w = 0; w < b.n; w += 32) {
                unsigned end = w + 32 < b.n ? w + 32 : b.n, waiting = 0;
                for (unsigned t = w; t < end; t++) waiting += b.fib[t].state == F_WARP;
                if (!waiting) continue;
                if (waiting != end - w) {
                    b.error = "__shfl_down_sync: the lanes of a warp diverged (some exited or "
                              "wait at __syncthreads)";
                    return false;
                }
                for (unsigned t = w; t < end; t++) b.fib[t].state = F_READY;
            }
            continue;
        }
        if (done) {
            b.error = "__syncthreads: some threads of the block exited before the barrier";
            return false;
        }
        for (unsigned t = 0; t < b.n; t++) b.fib[t].state = F_READY;
    }
}

} /* namespace */

void __syncthreads(void) { yield(F_BAR); }

void pdp_emu_shfl_down(unsigned mask, const void *mine, void *out, size_t bytes, unsigned delta,
                       int width)
{
    Block &b = blk;
    unsigned t = b.cur, lane = t & 31, slot = b.fib[t].gen++ & 1, src = t;
    if (mask != 0xffffffffu || width < 1 || width > 32 || (width & (width - 1))) {
        b.error = "__shfl_down_sync: only a full mask and a power-of-two width are emulated";
        yield(F_DONE);
    }
    memcpy(&b.xchg[slot][t], mine, bytes);
    yield(F_WARP);
    if (lane % (unsigned)width + delta < (unsigned)width && t + delta < b.n) src = t + delta;
    memcpy(out, &b.xchg[slot][src], bytes);
}

void pdp_emu::launch(const char *kernel, dim3 g, dim3 bd, size_t smem, cudaStream_t stream,
                     int nptr, const void *const *ptrs, const int *arg_index,
                     void (*body)(void *), void *ctx)
{
    Block &b = blk;
    unsigned long long threads = (unsigned long long)bd.x * bd.y * bd.z;
    if (b.running) {
        complain("%s: launched from inside a kernel (dynamic parallelism is not emulated)",
                 kernel);
        abort();
    }
    if (!g.x || !g.y || !g.z || !threads || threads > 1024 || bd.x > 1024 || bd.y > 1024 ||
        bd.z > 64 || g.x > 2147483647u || g.y > 65535 || g.z > 65535 || smem > 48 * 1024) {
        fail(cudaErrorInvalidConfiguration);
        return;
    }
    {
        std::unique_lock<std::mutex> lk(mu);
        cudaError_t e = stream_begin(lk, kernel, &stream);
        if (e != cudaSuccess) {
            fail(e);
            return;
        }
        for (int i = 0; i < nptr; i++) {
            int d = -1;
            if (ptrs[i] && !(find(ptrs[i], 1, &d) == 1 && d == cur_dev)) {
                complain("kernel %s: argument %d (%p) is not memory of CUDA device %d", kernel,
                         arg_index[i], ptrs[i], cur_dev);
                fail(cudaErrorIllegalAddress);
                return;
            }
        }
    }
    b.n = (unsigned)threads;
    if (b.fib.size() < b.n) {
        size_t old = b.fib.size();
        b.fib.resize(b.n);
        for (size_t t = old; t < b.n; t++) {
            b.fib[t].stack = (char *)malloc(STACK);
#ifdef EMU_TSAN
            b.fib[t].tsan = __tsan_create_fiber(0);
#endif
            if (!b.fib[t].stack) abort();
        }
        b.xchg[0].resize(b.n);
        b.xchg[1].resize(b.n);
    }
    b.body = body;
    b.ctx = ctx;
    b.error = nullptr;
    gridDim = g;
    blockDim = bd;
    b.running = true;
    for (unsigned z = 0; z < g.z; z++)
        for (unsigned y = 0; y < g.y; y++)
            for (unsigned x = 0; x < g.x; x++) {
                blockIdx.x = x;
                blockIdx.y = y;
                blockIdx.z = z;
                if (!run_block(b)) {
                    complain("kernel %s, block (%u, %u, %u): %s", kernel, x, y, z, b.error);
                    b.running = false;
                    fail(cudaErrorLaunchFailure);
                    return;
                }
            }
    b.running = false;
}

/* ---- cuda_emu: runtime API ---- */

const char *cudaGetErrorName(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorInsufficientDriver: return "cudaErrorInsufficientDriver";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorLaunchTimeout: return "cudaErrorLaunchTimeout";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    }
    return "cudaErrorUnknown";
}

const char *cudaGetErrorString(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorNotReady: return "device not ready";
    default: return cudaGetErrorName(e);
    }
}

cudaError_t cudaGetLastError(void)
{
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}

cudaError_t cudaGetDeviceCount(int *count)
{
    *count = ndev() > 0 ? ndev() : 0;
    return *count ? cudaSuccess : fail(cudaErrorNoDevice);
}

cudaError_t cudaSetDevice(int device)
{
    if (ndev() <= 0) return fail(cudaErrorNoDevice);
    if (device < 0 || device >= ndev() || device >= 64) return fail(cudaErrorInvalidDevice);
    cur_dev = device;
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **ptr, size_t bytes)
{
    *ptr = nullptr;
    if (ndev() <= 0) return fail(cudaErrorNoDevice);
    if (bytes > ((size_t)4 << 30)) return fail(cudaErrorMemoryAllocation);
    if (!bytes) return cudaSuccess;
    void *p = malloc(bytes);
    if (!p) return fail(cudaErrorMemoryAllocation);
    memset(p, 0xff, bytes); /* NaN as float and as double */
    std::lock_guard<std::mutex> lk(mu);
    allocs[(uintptr_t)p] = Alloc{bytes, cur_dev};
    *ptr = p;
    return cudaSuccess;
}

cudaError_t cudaFree(void *ptr)
{
    if (!ptr) return cudaSuccess;
    {
        std::lock_guard<std::mutex> lk(mu);
        if (!allocs.erase((uintptr_t)ptr)) {
            complain("cudaFree: %p is not the start of a live allocation", ptr);
            return fail(cudaErrorInvalidValue);
        }
    }
    free(ptr);
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream)
{
    std::unique_lock<std::mutex> lk(mu);
    cudaError_t e = stream_begin(lk, "cudaMemcpyAsync", &stream);
    int dev, d;
    bool ok;
    if (e != cudaSuccess) return fail(e);
    dev = stream->dev;
    if (kind == cudaMemcpyDefault) /* UVA: the pointers say */
        kind = (cudaMemcpyKind)((find(src, 1, &d) ? 2 : 0) | (find(dst, 1, &d) ? 1 : 0));
    if (kind > cudaMemcpyDeviceToDevice) return fail(cudaErrorInvalidMemcpyDirection);
    static const char *dir[] = {"HostToHost", "HostToDevice", "DeviceToHost", "DeviceToDevice"};
    char wd[64], ws[64];
    snprintf(wd, sizeof wd, "cudaMemcpyAsync (%s) dst", dir[kind]);
    snprintf(ws, sizeof ws, "cudaMemcpyAsync (%s) src", dir[kind]);
    /* kind: bit 0 = the destination is device memory, bit 1 = the source is */
    ok = (kind & 1 ? on_dev(wd, dst, bytes, dev) : on_host(wd, dst)) &&
         (kind & 2 ? on_dev(ws, src, bytes, dev) : on_host(ws, src));
    if (!ok) return fail(cudaErrorInvalidValue);
    if (bytes) memmove(dst, src, bytes);
    return cudaSuccess;
}

cudaError_t cudaMemcpyPeerAsync(void *dst, int dst_dev, const void *src, int src_dev,
                                size_t bytes, cudaStream_t stream)
{
    std::unique_lock<std::mutex> lk(mu);
    cudaError_t e = stream_begin(lk, "cudaMemcpyPeerAsync", &stream);
    if (e != cudaSuccess) return fail(e);
    if (dst_dev < 0 || dst_dev >= ndev() || src_dev < 0 || src_dev >= ndev())
        return fail(cudaErrorInvalidDevice);
    if (!on_dev("cudaMemcpyPeerAsync dst", dst, bytes, dst_dev) ||
        !on_dev("cudaMemcpyPeerAsync src", src, bytes, src_dev))
        return fail(cudaErrorInvalidValue);
    if (bytes) memmove(dst, src, bytes);
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *ptr, int value, size_t bytes, cudaStream_t stream)
{
    std::unique_lock<std::mutex> lk(mu);
    cudaError_t e = stream_begin(lk, "cudaMemsetAsync", &stream);
    if (e != cudaSuccess) return fail(e);
    if (!on_dev("cudaMemsetAsync", ptr, bytes, stream->dev)) return fail(cudaErrorInvalidValue);
    memset(ptr, value, bytes);
    return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned flags)
{
    if (ndev() <= 0) return fail(cudaErrorNoDevice);
    if (flags > cudaStreamNonBlocking) return fail(cudaErrorInvalidValue);
    std::lock_guard<std::mutex> lk(mu);
    *stream = new pdp_emu_stream{cur_dev, Pending()};
    streams.insert(*stream);
    return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
    std::lock_guard<std::mutex> lk(mu);
    if (!streams.erase(stream)) return fail(cudaErrorInvalidResourceHandle);
    delete stream; /* a pending collective still completes: it holds no stream */
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
    std::unique_lock<std::mutex> lk(mu);
    if (stream && !streams.count(stream)) return fail(cudaErrorInvalidResourceHandle);
    if (stream && !wait_for(lk, stream->last, "cudaStreamSynchronize"))
        return fail(cudaErrorLaunchTimeout);
    return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned flags)
{
    std::unique_lock<std::mutex> lk(mu);
    if ((stream && !streams.count(stream)) || !events.count(event))
        return fail(cudaErrorInvalidResourceHandle);
    if (flags) return fail(cudaErrorInvalidValue);
    /* the stream's later work runs at enqueue: the wait happens here, on the host */
    if (!wait_for(lk, event->at, "cudaStreamWaitEvent")) return fail(cudaErrorLaunchTimeout);
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned flags)
{
    if (ndev() <= 0) return fail(cudaErrorNoDevice);
    if (flags & ~3u) return fail(cudaErrorInvalidValue);
    std::lock_guard<std::mutex> lk(mu);
    *event = new pdp_emu_event{cur_dev, Pending()};
    events.insert(*event);
    return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event)
{
    std::lock_guard<std::mutex> lk(mu);
    if (!events.erase(event)) return fail(cudaErrorInvalidResourceHandle);
    delete event;
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
    std::lock_guard<std::mutex> lk(mu);
    if (!events.count(event) || (stream && !streams.count(stream)))
        return fail(cudaErrorInvalidResourceHandle);
    int sdev = stream ? stream->dev : cur_dev;
    if (sdev != event->dev) {
        complain("cudaEventRecord: the event is on CUDA device %d, the stream on %d",
                 event->dev, sdev);
        return fail(cudaErrorInvalidResourceHandle);
    }
    event->at = stream ? stream->last : Pending();
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event)
{
    std::lock_guard<std::mutex> lk(mu);
    if (!events.count(event)) return fail(cudaErrorInvalidResourceHandle);
    return event->at.done() ? cudaSuccess : cudaErrorNotReady; /* NotReady is no error */
}

/* ---- cuda_emu: cuBLAS ---- */

struct pdp_emu_blas {
    int dev;
    cudaStream_t stream;
};

namespace {
std::set<pdp_emu_blas *> blas_handles;

/* Elements [lo, hi) relative to the base that `count` matrices of `rows` x `cols` at
   leading dimension ld and the given stride touch. */
void extent(int64_t rows, int64_t cols, int64_t ld, int64_t stride, int64_t count, int64_t *lo,
            int64_t *hi)
{
    int64_t one = (cols - 1) * ld + rows, last = (count - 1) * stride;
    *lo = last < 0 ? last : 0;
    *hi = (last > 0 ? last : 0) + one;
}

/* esize: bytes per element (4 fp32, 2 bf16) */
bool operand_ok(const char *fn, const char *name, const void *p, size_t esize, int64_t rows,
                int64_t cols, int64_t ld, int64_t stride, int64_t count, int dev)
{
    int64_t lo, hi;
    char what[96];
    extent(rows, cols, ld, stride, count, &lo, &hi);
    snprintf(what, sizeof what, "%s: operand %s", fn, name);
    return on_dev(what, (const char *)p + lo * (int64_t)esize, (size_t)(hi - lo) * esize, dev);
}

/* A bf16 (the top half of an fp32) widened */
float bf16_at(const void *p, int64_t i)
{
    uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* bf16: A and B hold bf16 (cublasGemmEx with CUDA_R_16BF), summed in fp32 in k order;
   else fp32, summed in double. */
cublasStatus_t gemm(const char *fn, cublasHandle_t h, cublasOperation_t ta,
                    cublasOperation_t tb, int m, int n, int k, const float *alpha,
                    const void *A, int lda, long long sa, const void *B, int ldb, long long sb,
                    const float *beta, float *C, int ldc, long long sc, int batch, bool bf16)
{
    size_t es = bf16 ? 2 : 4;
    bool na = ta == CUBLAS_OP_N, nb = tb == CUBLAS_OP_N;
    int ra = na ? m : k, rb = nb ? k : n; /* rows of A and B as stored */
    {
        std::unique_lock<std::mutex> lk(mu);
        cudaStream_t s;
        int d;
        if (!blas_handles.count(h)) return CUBLAS_STATUS_NOT_INITIALIZED;
        if (ta < CUBLAS_OP_N || ta > CUBLAS_OP_C || tb < CUBLAS_OP_N || tb > CUBLAS_OP_C ||
            m < 0 || n < 0 || k < 0 || batch < 0 || lda < (ra > 1 ? ra : 1) ||
            ldb < (rb > 1 ? rb : 1) || ldc < (m > 1 ? m : 1) || !alpha || !beta)
            return CUBLAS_STATUS_INVALID_VALUE;
        if (cur_dev != h->dev) {
            complain("%s: the handle belongs to CUDA device %d, the current device is %d", fn,
                     h->dev, cur_dev);
            return CUBLAS_STATUS_EXECUTION_FAILED;
        }
        if (find(alpha, 1, &d) || find(beta, 1, &d)) {
            complain("%s: alpha and beta must be host pointers (CUBLAS_POINTER_MODE_HOST)", fn);
            return CUBLAS_STATUS_EXECUTION_FAILED;
        }
        s = h->stream;
        if (stream_begin(lk, fn, &s) != cudaSuccess) return CUBLAS_STATUS_EXECUTION_FAILED;
        if (m == 0 || n == 0 || batch == 0) return CUBLAS_STATUS_SUCCESS;
        if (!operand_ok(fn, "C", C, 4, m, n, ldc, sc, batch, h->dev) ||
            (k > 0 && *alpha != 0.0f &&
             (!operand_ok(fn, "A", A, es, ra, na ? k : m, lda, sa, batch, h->dev) ||
              !operand_ok(fn, "B", B, es, rb, nb ? n : k, ldb, sb, batch, h->dev))))
            return CUBLAS_STATUS_EXECUTION_FAILED;
    }
    for (int64_t q = 0; q < batch; q++) {
        const char *a = (const char *)A + q * sa * (int64_t)es;
        const char *b = (const char *)B + q * sb * (int64_t)es;
        float *c = C + q * sc;
        for (int64_t j = 0; j < n; j++)
            for (int64_t i = 0; i < m; i++) {
                double acc = 0.0;
                float acc32 = 0.0f;
                if (*alpha != 0.0f)
                    for (int64_t l = 0; l < k; l++) {
                        int64_t ia = na ? i + l * lda : l + i * lda;
                        int64_t ib = nb ? l + j * ldb : j + l * ldb;
                        if (bf16)
                            acc32 += bf16_at(a, ia) * bf16_at(b, ib);
                        else
                            acc += (double)((const float *)a)[ia] * (double)((const float *)b)[ib];
                    }
                float r = *alpha * (bf16 ? acc32 : (float)acc);
                if (*beta != 0.0f) r += *beta * c[i + j * ldc];
                c[i + j * ldc] = r;
            }
    }
    return CUBLAS_STATUS_SUCCESS;
}
} /* namespace */

cublasStatus_t cublasCreate(cublasHandle_t *handle)
{
    if (ndev() <= 0) return CUBLAS_STATUS_NOT_INITIALIZED;
    std::lock_guard<std::mutex> lk(mu);
    *handle = new pdp_emu_blas{cur_dev, nullptr};
    blas_handles.insert(*handle);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t handle)
{
    std::lock_guard<std::mutex> lk(mu);
    if (!blas_handles.erase(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream)
{
    std::lock_guard<std::mutex> lk(mu);
    if (!blas_handles.count(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (stream && (!streams.count(stream) || stream->dev != handle->dev)) {
        complain("cublasSetStream: the stream is not a live stream of the handle's device %d",
                 handle->dev);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    handle->stream = stream;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode)
{
    std::lock_guard<std::mutex> lk(mu);
    if (!blas_handles.count(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
    if ((mode & ~16) > CUBLAS_TF32_TENSOR_OP_MATH) return CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS; /* TF32 numerics are not emulated */
}

const char *cublasGetStatusName(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "CUBLAS_STATUS_UNKNOWN";
    }
}

const char *cublasGetStatusString(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    default: return "unknown error";
    }
}

cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                           int n, int k, const float *alpha, const float *A, int lda,
                           const float *B, int ldb, const float *beta, float *C, int ldc)
{
    return gemm("cublasSgemm", h, ta, tb, m, n, k, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0,
                1, false);
}

cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t h, cublasOperation_t ta,
                                         cublasOperation_t tb, int m, int n, int k,
                                         const float *alpha, const float *A, int lda,
                                         long long sa, const float *B, int ldb, long long sb,
                                         const float *beta, float *C, int ldc, long long sc,
                                         int batch)
{
    return gemm("cublasSgemmStridedBatched", h, ta, tb, m, n, k, alpha, A, lda, sa, B, ldb, sb,
                beta, C, ldc, sc, batch, false);
}

namespace {
/* The Ex calls' type table (the subset cuda_emu implements): A and B of one type, fp32
   or bf16, C fp32, a 32F compute type (float scalars); a bad algo is INVALID_VALUE, a
   combination outside the table NOT_SUPPORTED, as cuBLAS answers. */
cublasStatus_t ex_types(const char *fn, cudaDataType at, cudaDataType bt, cudaDataType ct,
                        cublasComputeType_t compute, cublasGemmAlgo_t algo, bool *bf16)
{
    bool f32 = at == CUDA_R_32F && bt == CUDA_R_32F, b16 = at == CUDA_R_16BF && bt == CUDA_R_16BF;
    bool ok;
    if (!((algo >= CUBLAS_GEMM_DEFAULT && algo <= 23) ||
          (algo >= CUBLAS_GEMM_DEFAULT_TENSOR_OP && algo <= 115)))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (b16)
        ok = compute == CUBLAS_COMPUTE_32F || compute == CUBLAS_COMPUTE_32F_PEDANTIC;
    else
        ok = f32 && (compute == CUBLAS_COMPUTE_32F || compute == CUBLAS_COMPUTE_32F_PEDANTIC ||
                     compute == CUBLAS_COMPUTE_32F_FAST_16F ||
                     compute == CUBLAS_COMPUTE_32F_FAST_16BF ||
                     compute == CUBLAS_COMPUTE_32F_FAST_TF32);
    if (!ok || ct != CUDA_R_32F) {
        complain("%s: A type %d, B type %d, C type %d, compute type %d: not a supported "
                 "combination (cuda_emu: A and B fp32 or bf16, C fp32, a 32F compute type)",
                 fn, (int)at, (int)bt, (int)ct, (int)compute);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    *bf16 = b16;
    return CUBLAS_STATUS_SUCCESS;
}
} /* namespace */

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                            int n, int k, const void *alpha, const void *A, cudaDataType at,
                            int lda, const void *B, cudaDataType bt, int ldb, const void *beta,
                            void *C, cudaDataType ct, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t algo)
{
    bool bf16 = false;
    cublasStatus_t s = ex_types("cublasGemmEx", at, bt, ct, compute, algo, &bf16);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    return gemm("cublasGemmEx", h, ta, tb, m, n, k, (const float *)alpha, A, lda, 0, B, ldb, 0,
                (const float *)beta, (float *)C, ldc, 0, 1, bf16);
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t h, cublasOperation_t ta,
                                          cublasOperation_t tb, int m, int n, int k,
                                          const void *alpha, const void *A, cudaDataType at,
                                          int lda, long long sa, const void *B, cudaDataType bt,
                                          int ldb, long long sb, const void *beta, void *C,
                                          cudaDataType ct, int ldc, long long sc, int batch,
                                          cublasComputeType_t compute, cublasGemmAlgo_t algo)
{
    bool bf16 = false;
    cublasStatus_t s = ex_types("cublasGemmStridedBatchedEx", at, bt, ct, compute, algo, &bf16);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    return gemm("cublasGemmStridedBatchedEx", h, ta, tb, m, n, k, (const float *)alpha, A, lda, sa,
                B, ldb, sb, (const float *)beta, (float *)C, ldc, sc, batch, bf16);
}

/* ---- cuda_emu: NCCL ---- */

namespace {
enum { C_ALLREDUCE, C_BROADCAST, C_REDUCE_SCATTER, C_ALLGATHER };
const char *coll_name[] = {"ncclAllReduce", "ncclBroadcast", "ncclReduceScatter",
                           "ncclAllGather"};

struct Op {
    int kind, type, red, root, arrived = 0;
    size_t count;
    std::vector<const void *> send;
    std::vector<void *> recv;
};

/* ncclGroupEnd's unit of completion: its messages still to complete */
struct Group {
    size_t left = 0;
};

/* one ncclSend or ncclRecv, queued per (sender, receiver) pair until matched */
struct P2p {
    pdp_emu_comm *comm;
    int src, dst, type;
    bool is_send;
    const void *send;
    void *recv;
    size_t count;
    cudaStream_t stream;
    std::shared_ptr<Group> grp;
};

struct SplitOp {
    int arrived = 0, taken = 0;
    bool done = false;
    std::vector<int> colour, key;
    std::vector<pdp_emu_comm *> out;
};

struct Clique {
    int nranks, joined = 0;
    ncclResult_t error = ncclSuccess;
    std::vector<pdp_emu_comm *> ranks;
    uint64_t completed = 0; /* collectives 0 .. completed-1 are done */
    std::map<uint64_t, Op> ops;
    std::map<std::pair<int, int>, std::deque<std::shared_ptr<P2p>>> sendq, recvq;
    std::map<uint64_t, SplitOp> splits; /* by split number */
};

bool Pending::done() const
{
    return (!clq || clq->completed > seq) && (!grp || grp->left == 0);
}
} /* namespace */

struct pdp_emu_comm {
    std::shared_ptr<Clique> clq;
    int rank, dev;
    bool blocking, finalizing = false;
    int in_progress = 0; /* non-blocking: polls that still answer ncclInProgress */
    uint64_t next = 0;   /* sequence number of this rank's next collective */
    uint64_t nsplit = 0; /* number of this rank's next ncclCommSplit */
};

namespace {
std::set<pdp_emu_comm *> comms;
thread_local int group_depth = 0;                         /* ncclGroupStart nesting */
thread_local std::vector<std::shared_ptr<P2p>> group_ops; /* queued by ncclSend/ncclRecv */
std::map<std::string, std::shared_ptr<Clique>> joining; /* by unique id, until complete */

size_t type_size(int t)
{
    static const size_t s[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};
    return t >= 0 && t <= 9 ? s[t] : 0;
}

template <typename T> T reduce(int red, T a, T b)
{
    switch (red) {
    case ncclProd: return a * b;
    case ncclMax: return b > a ? b : a;
    case ncclMin: return b < a ? b : a;
    default: return a + b;
    }
}

/* out[i] = send[0][off + i] (op) send[1][off + i] ..., in rank order */
template <typename T>
void reduce_ranks(const Op &op, size_t off, size_t count, int nranks, T *out)
{
    for (size_t i = 0; i < count; i++) {
        T acc = ((const T *)op.send[0])[off + i];
        for (int r = 1; r < nranks; r++)
            acc = reduce(op.red, acc, ((const T *)op.send[r])[off + i]);
        out[i] = op.red == ncclAvg ? acc / (T)nranks : acc;
    }
}

/* The 16-bit sums (ncclFloat16, ncclBfloat16) as a ring rounds them: in rank order, each
   partial sum widened, added in fp32 and rounded to the type (nearest even); ncclAvg
   divides the rounded sum and rounds again. Only ncclSum and ncclAvg are emulated. */
void reduce_ranks16(const Op &op, size_t count, int nranks, uint16_t *out)
{
    bool bf = op.type == ncclBfloat16;
    for (size_t i = 0; i < count; i++) {
        uint16_t acc = ((const uint16_t *)op.send[0])[i];
        for (int r = 1; r < nranks; r++) {
            float b = bf ? pdp__bf16_float(((const uint16_t *)op.send[r])[i])
                         : pdp__f16_float(((const uint16_t *)op.send[r])[i]);
            float a = bf ? pdp__bf16_float(acc) : pdp__f16_float(acc);
            acc = bf ? pdp__bf16_bits(a + b) : pdp__f16_bits(a + b);
        }
        if (op.red == ncclAvg) {
            float a = (bf ? pdp__bf16_float(acc) : pdp__f16_float(acc)) / (float)nranks;
            acc = bf ? pdp__bf16_bits(a) : pdp__f16_bits(a);
        }
        out[i] = acc;
    }
}

/* The last rank has arrived: every rank's buffers are ready. Under mu. */
void execute(Clique &q, Op &op)
{
    int n = q.nranks;
    size_t es = type_size(op.type), bytes = op.count * es;
    size_t total = op.kind == C_ALLREDUCE || op.kind == C_BROADCAST ? bytes : bytes * n;
    std::vector<unsigned char> tmp(total);
    for (int r = 0; r < n; r++) { /* buffers freed while the collective was pending? */
        pdp_emu_comm *c = q.ranks[r];
        size_t sb = op.kind == C_REDUCE_SCATTER ? bytes * n : bytes;
        size_t rb = op.kind == C_ALLGATHER ? bytes * n : bytes;
        int dev = c ? c->dev : -1;
        if (!c || ((op.kind != C_BROADCAST || r == op.root) &&
                   !on_dev(coll_name[op.kind], op.send[r], sb, dev)) ||
            !on_dev(coll_name[op.kind], op.recv[r], rb, dev)) {
            complain("%s: rank %d's buffers are gone before the collective ran", coll_name[op.kind],
                     r);
            q.error = ncclUnhandledCudaError;
            return;
        }
    }
    switch (op.kind) {
    case C_ALLREDUCE:
    case C_REDUCE_SCATTER:
        if (op.type == ncclFloat32) reduce_ranks(op, 0, total / 4, n, (float *)tmp.data());
        else if (op.type == ncclFloat16 || op.type == ncclBfloat16)
            reduce_ranks16(op, total / 2, n, (uint16_t *)tmp.data());
        else reduce_ranks(op, 0, total / 8, n, (double *)tmp.data());
        break;
    case C_BROADCAST: memcpy(tmp.data(), op.send[op.root], bytes); break;
    case C_ALLGATHER:
        for (int r = 0; r < n; r++) memcpy(tmp.data() + r * bytes, op.send[r], bytes);
        break;
    }
    for (int r = 0; r < n; r++) {
        if (op.kind == C_REDUCE_SCATTER) memcpy(op.recv[r], tmp.data() + r * bytes, bytes);
        else memcpy(op.recv[r], tmp.data(), total);
    }
}

ncclResult_t collective(int kind, const void *send, void *recv, size_t count, ncclDataType_t type,
                        int red, int root, ncclComm_t c, cudaStream_t stream)
{
    const char *fn = coll_name[kind];
    std::unique_lock<std::mutex> lk(mu);
    if (!comms.count(c)) return ncclInvalidArgument;
    if (group_depth) {
        complain("%s inside ncclGroupStart/ncclGroupEnd is not emulated", fn);
        return ncclInvalidUsage;
    }
    Clique &q = *c->clq;
    int n = q.nranks;
    size_t es = type_size(type), bytes = count * es;
    if (q.error != ncclSuccess) return q.error;
    if (q.joined < n || c->finalizing) {
        complain("%s: rank %d: the communicator is %s", fn, c->rank,
                 c->finalizing ? "being finalized" : "not initialised yet");
        return ncclInvalidUsage;
    }
    if (!es || red < ncclSum || red > ncclAvg || (kind == C_BROADCAST && (root < 0 || root >= n)))
        return ncclInvalidArgument;
    if ((kind == C_ALLREDUCE || kind == C_REDUCE_SCATTER) && type != ncclFloat32 &&
        type != ncclFloat64 &&
        !((type == ncclFloat16 || type == ncclBfloat16) && (red == ncclSum || red == ncclAvg))) {
        complain("%s: reductions of datatype %d are not emulated", fn, (int)type);
        return ncclInvalidArgument;
    }
    if (!stream || !streams.count(stream) || stream->dev != c->dev) {
        complain("%s: rank %d: the stream is not a live stream of the communicator's device %d",
                 fn, c->rank, c->dev);
        return ncclInvalidArgument;
    }
    if (count && (((kind != C_BROADCAST || c->rank == root) &&
                   !on_dev(fn, send, kind == C_REDUCE_SCATTER ? bytes * n : bytes, c->dev)) ||
                  !on_dev(fn, recv, kind == C_ALLGATHER ? bytes * n : bytes, c->dev)))
        return ncclInvalidArgument;
    if (!wait_for(lk, stream->last, fn)) return ncclSystemError;
    uint64_t seq = c->next++;
    Op &op = q.ops[seq];
    if (!op.arrived) {
        op.kind = kind;
        op.type = type;
        op.red = red;
        op.root = root;
        op.count = count;
        op.send.assign(n, nullptr);
        op.recv.assign(n, nullptr);
    } else if (op.kind != kind || op.type != type || op.count != count ||
               (kind == C_BROADCAST ? op.root != root : kind != C_ALLGATHER && op.red != red)) {
        complain("collective %llu: rank %d calls %s(count %zu, type %d, op/root %d), an earlier "
                 "rank %s(count %zu, type %d, op/root %d)", (unsigned long long)seq, c->rank, fn,
                 count, (int)type, kind == C_BROADCAST ? root : red, coll_name[op.kind], op.count,
                 op.type, op.kind == C_BROADCAST ? op.root : op.red);
        q.error = ncclInvalidUsage;
        cv.notify_all();
        return ncclInvalidUsage;
    }
    op.send[c->rank] = send;
    op.recv[c->rank] = recv;
    stream->last = Pending{c->clq, seq, nullptr};
    if (++op.arrived == n) {
        if (count) execute(q, op);
        q.ops.erase(seq);
        q.completed = seq + 1; /* every rank enqueues in order: so do completions */
        cv.notify_all();
    }
    if (c->blocking) return ncclSuccess;
    c->in_progress = 1;
    return ncclInProgress;
}

void comm_free(pdp_emu_comm *c)
{
    /* its unmatched messages are withdrawn (they never complete) */
    for (auto *qs : {&c->clq->sendq, &c->clq->recvq})
        for (auto &kv : *qs)
            for (auto it = kv.second.begin(); it != kv.second.end();)
                it = (*it)->comm == c ? kv.second.erase(it) : it + 1;
    comms.erase(c);
    c->clq->ranks[c->rank] = nullptr;
    delete c;
}
} /* namespace */

const char *ncclGetErrorString(ncclResult_t r)
{
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    }
    return "unknown result code";
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    static unsigned long long counter;
    std::lock_guard<std::mutex> lk(mu);
    memset(id, 0, sizeof *id);
    snprintf(id->internal, sizeof id->internal, "cuda_emu %ld %llu", (long)getpid(), counter++);
    return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t *config)
{
    bool blocking = !config || config->blocking != 0;
    if (config && config->magic != 0xcafebeef) return ncclInvalidArgument;
    if (nranks < 1 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
    if (ndev() <= 0) return ncclUnhandledCudaError;
    std::unique_lock<std::mutex> lk(mu);
    std::string key(id.internal, sizeof id.internal);
    std::shared_ptr<Clique> &slot = joining[key];
    if (!slot) {
        slot = std::make_shared<Clique>();
        slot->nranks = nranks;
        slot->ranks.assign(nranks, nullptr);
    }
    std::shared_ptr<Clique> q = slot;
    if (q->nranks != nranks || q->ranks[rank]) {
        complain("ncclCommInitRankConfig: rank %d of %d: %s", rank, nranks,
                 q->nranks != nranks ? "another rank gave another nranks" : "rank taken twice");
        return ncclInvalidUsage;
    }
    for (pdp_emu_comm *o : q->ranks)
        if (o && o->dev == cur_dev) {
            complain("ncclCommInitRankConfig: Duplicate GPU detected: rank %d and rank %d both "
                     "on CUDA device %d", rank, o->rank, cur_dev);
            q->error = ncclInvalidUsage;
            cv.notify_all();
            return ncclInvalidUsage;
        }
    pdp_emu_comm *c = new pdp_emu_comm{q, rank, cur_dev, blocking};
    comms.insert(c);
    q->ranks[rank] = c;
    if (++q->joined == nranks) {
        joining.erase(key);
        cv.notify_all();
    }
    *comm = c;
    if (!blocking) return ncclInProgress;
    if (cv.wait_for(lk, std::chrono::duration<double>(WAIT_S),
                    [&] { return q->joined == nranks || q->error != ncclSuccess; }) &&
        q->error == ncclSuccess)
        return ncclSuccess;
    complain("ncclCommInitRankConfig: rank %d of %d: the other ranks did not join within %g s "
             "(ranks of other processes never do here)", rank, nranks, WAIT_S);
    *comm = nullptr;
    comm_free(c);
    return q->error != ncclSuccess ? q->error : ncclSystemError;
}

ncclResult_t ncclCommInitAll(ncclComm_t *out, int ndevs, const int *devlist)
{
    if (ndevs < 1) return ncclInvalidArgument;
    for (int i = 0; i < ndevs; i++) {
        int d = devlist ? devlist[i] : i;
        if (d < 0 || d >= ndev()) return ncclInvalidArgument;
        for (int j = 0; j < i; j++)
            if ((devlist ? devlist[j] : j) == d) {
                complain("ncclCommInitAll: Duplicate GPU detected: CUDA device %d twice", d);
                return ncclInvalidUsage;
            }
    }
    std::lock_guard<std::mutex> lk(mu);
    std::shared_ptr<Clique> q = std::make_shared<Clique>();
    q->nranks = q->joined = ndevs;
    q->ranks.assign(ndevs, nullptr);
    for (int i = 0; i < ndevs; i++) {
        out[i] = new pdp_emu_comm{q, i, devlist ? devlist[i] : i, true};
        q->ranks[i] = out[i];
        comms.insert(out[i]);
    }
    return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *async_error)
{
    std::lock_guard<std::mutex> lk(mu);
    if (!comms.count(c)) return ncclInvalidArgument;
    Clique &q = *c->clq;
    if (q.error != ncclSuccess) *async_error = q.error;
    else if (c->in_progress > 0 || q.joined < q.nranks || (c->finalizing && q.completed < c->next))
        *async_error = ncclInProgress;
    else *async_error = ncclSuccess;
    if (c->in_progress > 0) c->in_progress--;
    return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t c)
{
    std::unique_lock<std::mutex> lk(mu);
    if (!comms.count(c)) return ncclInvalidArgument;
    c->finalizing = true;
    if (!c->blocking) return ncclInProgress;
    Pending p{c->clq, c->next ? c->next - 1 : 0, nullptr};
    if (c->next && !wait_for(lk, p, "ncclCommFinalize")) return ncclSystemError;
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t c)
{
    std::lock_guard<std::mutex> lk(mu);
    if (!comms.count(c)) return ncclInvalidArgument;
    comm_free(c);
    return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t c)
{
    return ncclCommDestroy(c); /* its pending collectives never complete */
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    return collective(C_ALLREDUCE, send, recv, count, type, op, 0, comm, stream);
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t type,
                           int root, ncclComm_t comm, cudaStream_t stream)
{
    return collective(C_BROADCAST, send, recv, count, type, ncclSum, root, comm, stream);
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t recvcount,
                               ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream)
{
    return collective(C_REDUCE_SCATTER, send, recv, recvcount, type, op, 0, comm, stream);
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t sendcount, ncclDataType_t type,
                           ncclComm_t comm, cudaStream_t stream)
{
    return collective(C_ALLGATHER, send, recv, sendcount, type, ncclSum, 0, comm, stream);
}

/* ---- cuda_emu: NCCL point-to-point and split ----
   ncclSend/ncclRecv queue a message in the calling thread's group (a call outside
   ncclGroupStart/End is a group of one). ncclGroupEnd first waits, as every
   enqueue here, for the work already on each message's stream, then enters the
   messages into their clique's queues per (sender, receiver) pair: the n-th send
   from a to b matches the n-th receive of b from a, as in NCCL, whichever group
   they were issued in. A matched pair with the same count and datatype copies
   (also a rank to itself); a different count or datatype is what NCCL would hang
   or corrupt on: it is reported and neither message ever completes. The group,
   and the events recorded after it on its streams, complete when all its
   messages have. A communicator freed or aborted withdraws its unmatched ones. */

namespace {

/* Matches the pair's queued messages, in order. Under mu. */
void p2p_match(Clique &q, std::pair<int, int> key);

/* The calling thread's group: wait for each stream's earlier work, queue, match. */
ncclResult_t group_end()
{
    std::vector<std::shared_ptr<P2p>> ops;
    ops.swap(group_ops);
    if (ops.empty()) return ncclSuccess;
    std::unique_lock<std::mutex> lk(mu);
    for (auto &m : ops) {
        if (!streams.count(m->stream) || !comms.count(m->comm)) {
            complain("ncclGroupEnd: a stream or communicator was destroyed inside the group");
            return ncclInvalidUsage;
        }
        if (!wait_for(lk, m->stream->last, "ncclGroupEnd")) return ncclSystemError;
    }
    bool blocking = true;
    auto grp = std::make_shared<Group>();
    grp->left = ops.size();
    for (auto &m : ops) {
        if (!comms.count(m->comm)) return ncclInvalidUsage; /* aborted while we waited */
        Clique &q = *m->comm->clq;
        if (q.error != ncclSuccess) return q.error;
        m->grp = grp;
        (m->is_send ? q.sendq : q.recvq)[{m->src, m->dst}].push_back(m);
        m->stream->last = Pending{nullptr, 0, grp};
        if (!m->comm->blocking) {
            blocking = false;
            m->comm->in_progress = 1;
        }
    }
    for (auto &m : ops) p2p_match(*m->comm->clq, {m->src, m->dst});
    cv.notify_all();
    return blocking ? ncclSuccess : ncclInProgress;
}

void p2p_match(Clique &q, std::pair<int, int> key)
{
    auto &S = q.sendq[key], &R = q.recvq[key];
    while (!S.empty() && !R.empty()) {
        std::shared_ptr<P2p> s = S.front(), r = R.front();
        S.pop_front();
        R.pop_front();
        size_t bytes = s->count * type_size(s->type);
        if (s->count != r->count || s->type != r->type) {
            complain("ncclSend/ncclRecv: rank %d sends %zu elements of datatype %d to rank %d, "
                     "which receives %zu of datatype %d: NCCL would hang or corrupt; neither "
                     "completes", s->src, s->count, s->type, s->dst, r->count, r->type);
            continue;
        }
        if (bytes && (!on_dev("ncclSend", s->send, bytes, s->comm->dev) ||
                      !on_dev("ncclRecv", r->recv, bytes, r->comm->dev))) {
            complain("ncclSend/ncclRecv: rank %d to rank %d: a buffer is gone before the "
                     "message ran", s->src, s->dst);
            q.error = ncclUnhandledCudaError;
            continue;
        }
        if (bytes) memmove(r->recv, s->send, bytes);
        s->grp->left--;
        r->grp->left--;
    }
}

ncclResult_t p2p(bool is_send, const void *send, void *recv, size_t count, ncclDataType_t type,
                 int peer, ncclComm_t c, cudaStream_t stream)
{
    const char *fn = is_send ? "ncclSend" : "ncclRecv";
    std::unique_lock<std::mutex> lk(mu);
    if (!comms.count(c)) return ncclInvalidArgument;
    Clique &q = *c->clq;
    if (q.error != ncclSuccess) return q.error;
    if (q.joined < q.nranks || c->finalizing) {
        complain("%s: rank %d: the communicator is %s", fn, c->rank,
                 c->finalizing ? "being finalized" : "not initialised yet");
        return ncclInvalidUsage;
    }
    if (!type_size(type) || peer < 0 || peer >= q.nranks) {
        complain("%s: rank %d: peer %d of %d, datatype %d", fn, c->rank, peer, q.nranks,
                 (int)type);
        return ncclInvalidArgument;
    }
    if (!stream || !streams.count(stream) || stream->dev != c->dev) {
        complain("%s: rank %d: the stream is not a live stream of the communicator's device %d",
                 fn, c->rank, c->dev);
        return ncclInvalidArgument;
    }
    if (count && !on_dev(fn, is_send ? send : recv, count * type_size(type), c->dev))
        return ncclInvalidArgument;
    auto m = std::make_shared<P2p>();
    m->comm = c;
    m->src = is_send ? c->rank : peer;
    m->dst = is_send ? peer : c->rank;
    m->type = type;
    m->is_send = is_send;
    m->send = send;
    m->recv = recv;
    m->count = count;
    m->stream = stream;
    group_ops.push_back(m);
    lk.unlock();
    if (group_depth == 0) return group_end();
    return ncclSuccess;
}

} /* namespace */

ncclResult_t ncclGroupStart(void)
{
    group_depth++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void)
{
    if (group_depth <= 0) {
        complain("ncclGroupEnd without ncclGroupStart");
        return ncclInvalidUsage;
    }
    if (--group_depth > 0) return ncclSuccess;
    return group_end();
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream)
{
    return p2p(true, sendbuff, nullptr, count, datatype, peer, comm, stream);
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream)
{
    return p2p(false, nullptr, recvbuff, count, datatype, peer, comm, stream);
}

/* Collective over comm's clique: each rank blocks until every rank has called it (the
   n-th split of each rank is one split); the last to arrive makes the new cliques,
   ranked by (key, old rank), on the same devices. config must be NULL (inherit). */
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                           ncclConfig_t *config)
{
    std::unique_lock<std::mutex> lk(mu);
    *newcomm = nullptr;
    if (!comms.count(comm)) return ncclInvalidArgument;
    if (config || (color < 0 && color != NCCL_SPLIT_NOCOLOR)) {
        complain("ncclCommSplit: rank %d: colour %d%s", comm->rank, color,
                 config ? ", a config (not emulated: pass NULL to inherit the parent's)" : "");
        return ncclInvalidArgument;
    }
    std::shared_ptr<Clique> qp = comm->clq;
    Clique &q = *qp;
    int n = q.nranks, rank = comm->rank;
    if (q.error != ncclSuccess) return q.error;
    if (group_depth || q.joined < n || comm->finalizing) {
        complain("ncclCommSplit: rank %d: %s", rank, group_depth ? "inside a group (not "
                 "emulated)" : "the communicator is not initialised or being finalized");
        return ncclInvalidUsage;
    }
    uint64_t seq = comm->nsplit++;
    SplitOp &op = q.splits[seq];
    if (!op.arrived) {
        op.colour.assign(n, NCCL_SPLIT_NOCOLOR);
        op.key.assign(n, 0);
        op.out.assign(n, nullptr);
    }
    op.colour[rank] = color;
    op.key[rank] = key;
    if (++op.arrived == n) {
        std::map<int, std::vector<int>> members;
        for (int r = 0; r < n; r++)
            if (op.colour[r] >= 0) members[op.colour[r]].push_back(r);
        for (auto &kv : members) {
            std::vector<int> &v = kv.second;
            std::stable_sort(v.begin(), v.end(), [&](int a, int b) { return op.key[a] < op.key[b]; });
            auto nq = std::make_shared<Clique>();
            nq->nranks = nq->joined = (int)v.size();
            nq->ranks.assign(v.size(), nullptr);
            for (size_t i = 0; i < v.size(); i++) {
                pdp_emu_comm *parent = q.ranks[v[i]];
                auto *c = new pdp_emu_comm{nq, (int)i, parent ? parent->dev : -1,
                                           parent ? parent->blocking : true};
                nq->ranks[i] = c;
                comms.insert(c);
                op.out[v[i]] = c;
            }
        }
        op.done = true;
        cv.notify_all();
    } else if (!cv.wait_for(lk, std::chrono::duration<double>(WAIT_S),
                            [&] { return op.done || q.error != ncclSuccess; }) ||
               !op.done) {
        complain("ncclCommSplit: rank %d of %d: the other ranks did not call it within %g s",
                 rank, n, WAIT_S);
        return q.error != ncclSuccess ? q.error : ncclSystemError;
    }
    *newcomm = op.out[rank];
    if (++op.taken == n) q.splits.erase(seq);
    return ncclSuccess;
}
