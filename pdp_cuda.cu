/* pdp_cuda.cu - the CUDA side of pdp: device memory, kernels, cuBLAS GEMMs, NCCL.

   Every line of CUDA in pdp lives here. pdp.h built with -DPDP_CUDA calls the
   plain C functions declared in its "cuda" section (pdp_cudak_*); this file
   never calls back into pdp.h's implementation: it includes pdp.h WITHOUT
   PDP_IMPLEMENTATION, i.e. the public API plus the shared PDP__HOSTDEV math
   block (activations, dropout hash, optimizer element updates), so the GPU
   runs the very formulas the CPU tests cover.

   Build (sm_90 code plus PTX that later GPUs JIT):
       nvcc -O2 -std=c++17 -gencode arch=compute_90,code=[sm_90,compute_90] -c pdp_cuda.cu
       cc -O2 -DPDP_CUDA app.c -c && nvcc app.o pdp_cuda.o -lcublas -lnccl -o app
   or in one line: nvcc -O2 -arch=sm_90 -DPDP_CUDA app.c pdp_cuda.cu -lcublas -lnccl

   Layout (llm.c's): error mapping; per-device context (stream, cuBLAS handle,
   caching allocator); one section per op, each a __global__ kernel named
   pdp__<op>_<fwd|bwd> beside its extern "C" launcher, which validates, sizes
   the grid with a ceil-div, launches on the device's compute stream, checks
   cudaGetLastError and returns a pdp_status; the losses; the gradient norm;
   the optimizers; NCCL.

   Invariants. Row-major everywhere; cuBLAS (column-major) sees each row-major
   matrix as its transpose, so C = A B is issued as C^T = B^T A^T. Reductions
   are deterministic: no atomics, a fixed tree or a fixed serial order per
   output (bias and LayerNorm parameter gradients are summed over the batch in
   sample order, as on the CPU). Every CUDA, cuBLAS and NCCL call is checked and
   becomes a pdp_status with "<call> failed: <name> (<text>) at pdp_cuda.cu:<line>"
   left in a thread-local buffer (pdp_cudak_error). Nothing here exits or prints.

   References: llm.c (train_gpt2.cu: cudaCheck, multi_gpu_async_reduce_gradient);
   NCCL user guide (ncclCommInitRankConfig non-blocking init, ncclCommAbort);
   cuBLAS row-major trick. */

#include "pdp.h"

#include <cuda_runtime.h>
#include <cublas_v2.h>
#include <nccl.h>

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(PDP_MALLOC) != defined(PDP_FREE)
#  error "pdp_cuda.cu: define both PDP_MALLOC and PDP_FREE, or neither"
#endif
#ifndef PDP_MALLOC
#  define PDP_MALLOC(bytes) malloc(bytes)
#  define PDP_FREE(ptr) free(ptr)
#endif

#define PDP__CU_MAX_DEVICES 64
#define PDP__CU_THREADS 256

/* ---- errors ---- */

static __thread char pdp__cu_msg[512];

extern "C" const char *pdp_cudak_error(void) { return pdp__cu_msg; }

static pdp_status pdp__cu_fail(pdp_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pdp__cu_msg, sizeof pdp__cu_msg, fmt, ap);
    va_end(ap);
    return st;
}

/* "cudaMalloc" from "cudaMalloc(&p, bytes)": the call's name for messages. */
static const char *pdp__cu_name(const char *expr, char *buf, size_t cap)
{
    size_t i = 0;
    while (expr[i] && expr[i] != '(' && i + 1 < cap) {
        buf[i] = expr[i];
        i++;
    }
    buf[i] = '\0';
    return buf;
}

static pdp_status pdp__cu_cuda_fail(cudaError_t e, const char *expr, int line)
{
    char name[64];
    pdp_status st = (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver)
                        ? PDP_ERR_NO_DEVICE
                        : e == cudaErrorMemoryAllocation ? PDP_ERR_OUT_OF_MEMORY : PDP_ERR_CUDA;
    return pdp__cu_fail(st, "%s failed: %s (%s) at pdp_cuda.cu:%d",
                        pdp__cu_name(expr, name, sizeof name), cudaGetErrorName(e),
                        cudaGetErrorString(e), line);
}

static pdp_status pdp__cu_blas_fail(cublasStatus_t s, const char *expr, int line)
{
    char name[64];
    return pdp__cu_fail(s == CUBLAS_STATUS_ALLOC_FAILED ? PDP_ERR_OUT_OF_MEMORY : PDP_ERR_CUDA,
                        "%s failed: %s (%s) at pdp_cuda.cu:%d",
                        pdp__cu_name(expr, name, sizeof name), cublasGetStatusName(s),
                        cublasGetStatusString(s), line);
}

static pdp_status pdp__cu_nccl_fail(ncclResult_t r, const char *expr, int line)
{
    char name[64];
    return pdp__cu_fail(PDP_ERR_COMM, "%s failed: ncclResult %d (%s) at pdp_cuda.cu:%d",
                        pdp__cu_name(expr, name, sizeof name), (int)r, ncclGetErrorString(r),
                        line);
}

#define PDP__CU(call)                                                                      \
    do {                                                                                   \
        cudaError_t pdp__e = (call);                                                       \
        if (pdp__e != cudaSuccess) return pdp__cu_cuda_fail(pdp__e, #call, __LINE__);      \
    } while (0)
#define PDP__BLAS(call)                                                                    \
    do {                                                                                   \
        cublasStatus_t pdp__s = (call);                                                    \
        if (pdp__s != CUBLAS_STATUS_SUCCESS) return pdp__cu_blas_fail(pdp__s, #call, __LINE__); \
    } while (0)
/* After a launch: a bad configuration or an earlier asynchronous fault. */
#define PDP__LAUNCHED(kernel)                                                              \
    do {                                                                                   \
        cudaError_t pdp__e = cudaGetLastError();                                           \
        if (pdp__e != cudaSuccess) return pdp__cu_cuda_fail(pdp__e, #kernel, __LINE__);   \
    } while (0)
#define PDP__ARGS(cond, ...)                                                               \
    do {                                                                                   \
        if (!(cond)) return pdp__cu_fail(PDP_ERR_INVALID, __VA_ARGS__);                     \
    } while (0)

/* ---- device context ----
   One per device, created on first use under a mutex and kept until pdp_cudak_release (or
   the process's end): the compute stream, the cuBLAS handle bound to it, the caching
   allocator's blocks, a grow-only scratch buffer for the losses and norms, and a grow-only
   workspace for bf16 GEMM inputs. A device is normally driven by one host thread at a time
   (DP, thread-rank DDP), but several may share one (DP with more workers than GPUs): their
   kernels interleave on the one stream, each on its own buffers; the shared pieces are
   guarded - the allocator and the math mode by mu, the scratch by scratch_mu from the
   moment a reduction takes it until its result is on the host, the bf16 workspace by
   bf16_mu while a layer enqueues the conversions and the GEMMs that read them (the stream
   then runs them in that order). cuBLAS allows several threads on one handle while its
   settings stay. */

typedef struct pdp__cu_block {
    void *p;
    size_t bytes; /* size class */
    int used;
} pdp__cu_block;

typedef struct pdp__cu_ctx {
    int ready;
    int tf32;                 /* math mode applied to blas */
    cudaStream_t stream;
    cublasHandle_t blas;
    pthread_mutex_t mu;       /* guards the allocator */
    pdp__cu_block *blocks;
    int nblocks, cap_blocks;
    int64_t mallocs;
    size_t reserved, in_use;
    pthread_mutex_t scratch_mu; /* held from taking the scratch until the host has read it */
    void *scratch;            /* losses: labels, per-sample losses, partial sums */
    size_t scratch_bytes;
    pthread_mutex_t bf16_mu;  /* held from the first conversion into bf16 until the last
                                 GEMM that reads it is enqueued (see "bf16") */
    uint16_t *bf16;           /* bf16 precision: the GEMM inputs rounded to bf16 */
    size_t bf16_bytes;
} pdp__cu_ctx;

static pdp__cu_ctx pdp__cu_ctxs[PDP__CU_MAX_DEVICES];
static pthread_mutex_t pdp__cu_init_mu = PTHREAD_MUTEX_INITIALIZER;
static int pdp__cu_tf32_on = 0; /* __atomic_* access */

extern "C" pdp_status pdp_cudak_device_count(int *count)
{
    cudaError_t e = cudaGetDeviceCount(count);
    if (e != cudaSuccess) {
        *count = 0;
        cudaGetLastError(); /* clear the sticky-free error */
        return pdp__cu_cuda_fail(e, "cudaGetDeviceCount", __LINE__);
    }
    if (*count == 0) return pdp__cu_fail(PDP_ERR_NO_DEVICE, "no CUDA device");
    return PDP_OK;
}

extern "C" void pdp_cudak_set_tf32(int on) { __atomic_store_n(&pdp__cu_tf32_on, on ? 1 : 0, __ATOMIC_RELAXED); }

/* Makes dev current and returns its context, creating it the first time. */
static pdp_status pdp__cu_begin(int dev, pdp__cu_ctx **out)
{
    pdp__cu_ctx *c;
    int n = 0, tf32;
    if (dev < 0 || dev >= PDP__CU_MAX_DEVICES)
        return pdp__cu_fail(PDP_ERR_INVALID, "CUDA device %d is outside 0..%d", dev,
                            PDP__CU_MAX_DEVICES - 1);
    c = &pdp__cu_ctxs[dev];
    if (!__atomic_load_n(&c->ready, __ATOMIC_ACQUIRE)) {
        pdp_status st = PDP_OK;
        pthread_mutex_lock(&pdp__cu_init_mu);
        if (!c->ready) {
            cudaError_t e = cudaGetDeviceCount(&n);
            if (e != cudaSuccess) {
                st = pdp__cu_cuda_fail(e, "cudaGetDeviceCount", __LINE__);
            } else if (dev >= n) {
                st = pdp__cu_fail(PDP_ERR_NO_DEVICE, "CUDA device %d does not exist (%d visible)",
                                  dev, n);
            } else if ((e = cudaSetDevice(dev)) != cudaSuccess) {
                st = pdp__cu_cuda_fail(e, "cudaSetDevice", __LINE__);
            } else if ((e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking)) !=
                       cudaSuccess) {
                st = pdp__cu_cuda_fail(e, "cudaStreamCreateWithFlags", __LINE__);
            } else {
                cublasStatus_t s = cublasCreate(&c->blas);
                if (s == CUBLAS_STATUS_SUCCESS) s = cublasSetStream(c->blas, c->stream);
                if (s == CUBLAS_STATUS_SUCCESS) s = cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH);
                if (s != CUBLAS_STATUS_SUCCESS) {
                    st = pdp__cu_blas_fail(s, "cublasCreate", __LINE__);
                } else {
                    pthread_mutex_init(&c->mu, NULL);
                    pthread_mutex_init(&c->scratch_mu, NULL);
                    pthread_mutex_init(&c->bf16_mu, NULL);
                    c->tf32 = 0;
                    __atomic_store_n(&c->ready, 1, __ATOMIC_RELEASE);
                }
            }
        }
        pthread_mutex_unlock(&pdp__cu_init_mu);
        if (st != PDP_OK) return st;
    }
    PDP__CU(cudaSetDevice(dev));
    tf32 = __atomic_load_n(&pdp__cu_tf32_on, __ATOMIC_RELAXED);
    if (tf32 != __atomic_load_n(&c->tf32, __ATOMIC_ACQUIRE)) {
        cublasStatus_t s = CUBLAS_STATUS_SUCCESS;
        pthread_mutex_lock(&c->mu);
        if (tf32 != c->tf32) {
            /* DEFAULT is plain FP32 since CUDA 11 (no TF32 down-conversion) */
            s = cublasSetMathMode(c->blas, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH
                                                : CUBLAS_DEFAULT_MATH);
            if (s == CUBLAS_STATUS_SUCCESS) __atomic_store_n(&c->tf32, tf32, __ATOMIC_RELEASE);
        }
        pthread_mutex_unlock(&c->mu);
        if (s != CUBLAS_STATUS_SUCCESS) return pdp__cu_blas_fail(s, "cublasSetMathMode", __LINE__);
    }
    *out = c;
    return PDP_OK;
}

static unsigned pdp__cu_grid(int64_t n)
{
    int64_t g = (n + PDP__CU_THREADS - 1) / PDP__CU_THREADS;
    if (g < 1) g = 1;
    if (g > 65535LL * 32) g = 65535LL * 32; /* the kernels stride over the rest */
    return (unsigned)g;
}

#define PDP__FOR(i, n) \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
         i += (int64_t)blockDim.x * gridDim.x)

/* The element-wise kernels that stream whole tensors (activations, adds, the optimizers)
   take PDP__VEC elements per thread instead: one 4-byte load per thread keeps too few bytes
   in flight to fill the memory (on an H200, a ReLU written that way moved 2.05 TB/s beside
   a 4.16 TB/s device copy). A thread's elements lie a block apart, so each load is still
   coalesced; it issues all their loads, then computes and stores. Each element's arithmetic
   is unchanged, so are the bits. Lane k of the thread at i is element PDP__LANE(i, k), or
   none when that is n or more. */
#define PDP__VEC 4
#define PDP__FOR_VEC(i, n) \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x * PDP__VEC + threadIdx.x; i < (n); \
         i += (int64_t)blockDim.x * gridDim.x * PDP__VEC)
#define PDP__LANE(i, k) ((i) + (int64_t)(k) * blockDim.x)

static unsigned pdp__cu_grid_vec(int64_t n)
{
    return pdp__cu_grid((n + PDP__VEC - 1) / PDP__VEC);
}

extern "C" pdp_status pdp_cudak_synchronize(int dev)
{
    pdp__cu_ctx *c;
    pdp_status st;
    if ((st = pdp__cu_begin(dev, &c)) != PDP_OK) return st;
    PDP__CU(cudaStreamSynchronize(c->stream));
    return PDP_OK;
}

/* ---- memory: the caching allocator ----
   Size classes: powers of two from 512 bytes to 1 MiB, then multiples of
   2 MiB. A free returns the block to its device's list; an allocation takes
   the first free block of its class, else cudaMalloc. Blocks are never split,
   so the state is a flat table per device; models hold a few dozen blocks. */

static size_t pdp__cu_class(size_t bytes)
{
    size_t c = 512;
    if (bytes > ((size_t)1 << 20)) return (bytes + ((size_t)2 << 20) - 1) & ~(((size_t)2 << 20) - 1);
    while (c < bytes) c <<= 1;
    return c;
}

extern "C" pdp_status pdp_cudak_malloc(int dev, size_t bytes, void **out)
{
    pdp__cu_ctx *c;
    size_t cls = pdp__cu_class(bytes);
    pdp_status st;
    void *p = NULL;
    int i;
    *out = NULL;
    if ((st = pdp__cu_begin(dev, &c)) != PDP_OK) return st;
    pthread_mutex_lock(&c->mu);
    for (i = 0; i < c->nblocks; i++)
        if (!c->blocks[i].used && c->blocks[i].bytes == cls) {
            c->blocks[i].used = 1;
            c->in_use += cls;
            *out = c->blocks[i].p;
            pthread_mutex_unlock(&c->mu);
            return PDP_OK;
        }
    if (c->nblocks == c->cap_blocks) {
        int cap = c->cap_blocks ? 2 * c->cap_blocks : 64;
        pdp__cu_block *b = (pdp__cu_block *)PDP_MALLOC((size_t)cap * sizeof *b);
        if (!b) {
            pthread_mutex_unlock(&c->mu);
            return pdp__cu_fail(PDP_ERR_OUT_OF_MEMORY, "no host memory for the block table");
        }
        if (c->blocks) memcpy(b, c->blocks, (size_t)c->nblocks * sizeof *b);
        PDP_FREE(c->blocks);
        c->blocks = b;
        c->cap_blocks = cap;
    }
    {
        cudaError_t e = cudaMalloc(&p, cls);
        if (e == cudaErrorMemoryAllocation) { /* give the cached blocks back and retry once */
            cudaGetLastError();
            int j = 0;
            for (i = 0; i < c->nblocks; i++) {
                if (!c->blocks[i].used) {
                    cudaFree(c->blocks[i].p);
                    c->reserved -= c->blocks[i].bytes;
                } else {
                    c->blocks[j++] = c->blocks[i];
                }
            }
            c->nblocks = j;
            e = cudaMalloc(&p, cls);
        }
        if (e != cudaSuccess) {
            pthread_mutex_unlock(&c->mu);
            cudaGetLastError();
            return pdp__cu_fail(e == cudaErrorMemoryAllocation ? PDP_ERR_OUT_OF_MEMORY
                                                               : PDP_ERR_CUDA,
                                "cudaMalloc failed: %s (%s) for %zu bytes on CUDA device %d at "
                                "pdp_cuda.cu:%d", cudaGetErrorName(e), cudaGetErrorString(e),
                                cls, dev, __LINE__);
        }
    }
    c->blocks[c->nblocks].p = p;
    c->blocks[c->nblocks].bytes = cls;
    c->blocks[c->nblocks].used = 1;
    c->nblocks++;
    c->mallocs++;
    c->reserved += cls;
    c->in_use += cls;
    pthread_mutex_unlock(&c->mu);
    *out = p;
    return PDP_OK;
}

extern "C" void pdp_cudak_free(int dev, void *p)
{
    pdp__cu_ctx *c;
    int i;
    if (!p || dev < 0 || dev >= PDP__CU_MAX_DEVICES) return;
    c = &pdp__cu_ctxs[dev];
    if (!__atomic_load_n(&c->ready, __ATOMIC_ACQUIRE)) return;
    pthread_mutex_lock(&c->mu);
    for (i = 0; i < c->nblocks; i++)
        if (c->blocks[i].p == p && c->blocks[i].used) {
            c->blocks[i].used = 0;
            c->in_use -= c->blocks[i].bytes;
            break;
        }
    pthread_mutex_unlock(&c->mu);
}

extern "C" pdp_status pdp_cudak_memory_stats(int dev, int64_t *mallocs, size_t *reserved,
                                             size_t *in_use)
{
    pdp__cu_ctx *c;
    pdp_status st;
    if ((st = pdp__cu_begin(dev, &c)) != PDP_OK) return st;
    pthread_mutex_lock(&c->mu);
    *mallocs = c->mallocs;
    *reserved = c->reserved;
    *in_use = c->in_use;
    pthread_mutex_unlock(&c->mu);
    return PDP_OK;
}

extern "C" pdp_status pdp_cudak_empty_cache(int dev)
{
    pdp__cu_ctx *c;
    pdp_status st;
    int i, j = 0;
    if ((st = pdp__cu_begin(dev, &c)) != PDP_OK) return st;
    PDP__CU(cudaStreamSynchronize(c->stream));
    pthread_mutex_lock(&c->mu);
    for (i = 0; i < c->nblocks; i++) {
        if (!c->blocks[i].used) {
            cudaFree(c->blocks[i].p);
            c->reserved -= c->blocks[i].bytes;
        } else {
            c->blocks[j++] = c->blocks[i];
        }
    }
    c->nblocks = j;
    pthread_mutex_unlock(&c->mu);
    return PDP_OK;
}

/* The device's context given back: every cached block, the scratch and bf16 workspaces,
   the cuBLAS handle and the stream (the next call on the device creates them again).
   Refused, changing nothing, while any other block is in use. The caller makes sure no
   other thread uses the device meanwhile (cuda.h). */
extern "C" pdp_status pdp_cudak_release(int dev)
{
    pdp__cu_ctx *c;
    size_t own = 0;
    int i;
    if (dev < 0 || dev >= PDP__CU_MAX_DEVICES)
        return pdp__cu_fail(PDP_ERR_INVALID, "CUDA device %d is outside 0..%d", dev,
                            PDP__CU_MAX_DEVICES - 1);
    c = &pdp__cu_ctxs[dev];
    if (!__atomic_load_n(&c->ready, __ATOMIC_ACQUIRE)) return PDP_OK; /* never used */
    PDP__CU(cudaSetDevice(dev));
    PDP__CU(cudaStreamSynchronize(c->stream));
    pthread_mutex_lock(&pdp__cu_init_mu);
    pthread_mutex_lock(&c->mu);
    for (i = 0; i < c->nblocks; i++) /* the workspaces are the context's own */
        if (c->blocks[i].used && (c->blocks[i].p == c->scratch || c->blocks[i].p == c->bf16))
            own += c->blocks[i].bytes;
    if (c->in_use > own) {
        size_t used = c->in_use - own;
        pthread_mutex_unlock(&c->mu);
        pthread_mutex_unlock(&pdp__cu_init_mu);
        return pdp__cu_fail(PDP_ERR_STATE, "CUDA device %d: %zu bytes are still in use (a "
                            "model, tensor, optimizer or executor lives there: free it first)",
                            dev, used);
    }
    for (i = 0; i < c->nblocks; i++) cudaFree(c->blocks[i].p);
    PDP_FREE(c->blocks);
    cublasDestroy(c->blas);
    cudaStreamDestroy(c->stream);
    pthread_mutex_unlock(&c->mu);
    pthread_mutex_destroy(&c->mu);
    pthread_mutex_destroy(&c->scratch_mu);
    pthread_mutex_destroy(&c->bf16_mu);
    __atomic_store_n(&c->ready, 0, __ATOMIC_RELEASE);
    memset(c, 0, sizeof *c);
    pthread_mutex_unlock(&pdp__cu_init_mu);
    return PDP_OK;
}

/* The device's loss scratch, grown (through the cache) to at least bytes. The
   caller holds c->scratch_mu until it no longer needs the contents. */
static pdp_status pdp__cu_scratch(int dev, pdp__cu_ctx *c, size_t bytes, void **out)
{
    pdp_status st;
    if (c->scratch_bytes < bytes) {
        void *p;
        PDP__CU(cudaStreamSynchronize(c->stream)); /* the old one may still be in use */
        if ((st = pdp_cudak_malloc(dev, bytes, &p)) != PDP_OK) return st;
        pdp_cudak_free(dev, c->scratch);
        c->scratch = p;
        c->scratch_bytes = bytes;
    }
    *out = c->scratch;
    return PDP_OK;
}

/* ---- memory: fill, copy, add ---- */

static __global__ void pdp__fill_fwd(float *p, int64_t n, float v)
{
    PDP__FOR(i, n) p[i] = v;
}

/* out = a + b, or a * b with mul (out may be a or b: each element is read before it is
   written, by the thread that writes it): pdp_cudak_add, _sum2 and the dropout backward */
static __global__ void pdp__zip_fwd(int mul, const float *a, const float *b, float *out,
                                    int64_t n)
{
    PDP__FOR_VEC(i, n) {
        float u[PDP__VEC], v[PDP__VEC];
        for (int k = 0; k < PDP__VEC; k++)
            if (PDP__LANE(i, k) < n) u[k] = a[PDP__LANE(i, k)], v[k] = b[PDP__LANE(i, k)];
        for (int k = 0; k < PDP__VEC; k++)
            if (PDP__LANE(i, k) < n) out[PDP__LANE(i, k)] = mul ? u[k] * v[k] : u[k] + v[k];
    }
}

extern "C" pdp_status pdp_cudak_memset0(int dev, void *p, size_t bytes)
{
    pdp__cu_ctx *c;
    pdp_status st;
    if ((st = pdp__cu_begin(dev, &c)) != PDP_OK) return st;
    if (bytes) PDP__CU(cudaMemsetAsync(p, 0, bytes, c->stream));
    return PDP_OK;
}

extern "C" pdp_status pdp_cudak_fill(int dev, float *p, int64_t count, float value)
{
    pdp__cu_ctx *c;
    pdp_status st;
    if ((st = pdp__cu_begin(dev, &c)) != PDP_OK) return st;
    if (count <= 0) return PDP_OK;
    pdp__fill_fwd<<<pdp__cu_grid(count), PDP__CU_THREADS, 0, c->stream>>>(p, count, value);
    PDP__LAUNCHED(pdp__fill_fwd);
    return PDP_OK;
}

extern "C" pdp_status pdp_cudak_add(int dev, float *dst, const float *src, int64_t count)
{
    pdp__cu_ctx *c;
    pdp_status st;
    if ((st = pdp__cu_begin(dev, &c)) != PDP_OK) return st;
    if (count <= 0) return PDP_OK;
    pdp__zip_fwd<<<pdp__cu_grid_vec(count), PDP__CU_THREADS, 0, c->stream>>>(0, dst, src, dst,
                                                                            count);
    PDP__LAUNCHED(pdp__zip_fwd);
    return PDP_OK;
}

extern "C" pdp_status pdp_cudak_memcpy(int dst_dev, void *dst, int src_dev, const void *src,
                                       size_t bytes)
{
    pdp__cu_ctx *c, *cs;
    pdp_status st;
    if (!bytes) return PDP_OK;
    if (dst_dev < 0 && src_dev < 0) {
        if (dst != src) memmove(dst, src, bytes);
        return PDP_OK;
    }
    if (src_dev < 0) { /* host to device: ordered after the device's queued work */
        if ((st = pdp__cu_begin(dst_dev, &c)) != PDP_OK) return st;
        PDP__CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream));
        PDP__CU(cudaStreamSynchronize(c->stream));
        return PDP_OK;
    }
    if (dst_dev < 0) {
        if ((st = pdp__cu_begin(src_dev, &c)) != PDP_OK) return st;
        PDP__CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream));
        PDP__CU(cudaStreamSynchronize(c->stream));
        return PDP_OK;
    }
    if (dst_dev == src_dev) {
        if ((st = pdp__cu_begin(dst_dev, &c)) != PDP_OK) return st;
        PDP__CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->stream));
        return PDP_OK;
    }
    /* peer: the source's writes are done, then the copy runs on the destination's
       stream and completes before returning (DP's replicate and gather) */
    if ((st = pdp__cu_begin(src_dev, &cs)) != PDP_OK) return st;
    PDP__CU(cudaStreamSynchronize(cs->stream));
    if ((st = pdp__cu_begin(dst_dev, &c)) != PDP_OK) return st;
    PDP__CU(cudaMemcpyPeerAsync(dst, dst_dev, src, src_dev, bytes, c->stream));
    PDP__CU(cudaStreamSynchronize(c->stream));
    return PDP_OK;
}

/* ---- gemm (cuBLAS) ----
   Row-major C [m, n] = op(A) op(B) + beta C is column-major C^T = op(B)^T op(A)^T:
   swap the operands and the m/n roles. The helper takes row-major arguments. */

static pdp_status pdp__cu_sgemm(pdp__cu_ctx *c, bool ta, bool tb, int64_t m, int64_t n,
                                int64_t k, const float *a, int64_t lda, const float *b,
                                int64_t ldb, float beta, float *cm, int64_t ldc)
{
    const float one = 1.0f;
    PDP__BLAS(cublasSgemm(c->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                          (int)n, (int)m, (int)k, &one, b, (int)ldb, a, (int)lda, &beta, cm,
                          (int)ldc));
    return PDP_OK;
}

/* The same for `count` matrices at fixed strides (0 = shared operand). */
static pdp_status pdp__cu_sgemm_batched(pdp__cu_ctx *c, bool ta, bool tb, int64_t m, int64_t n,
                                        int64_t k, const float *a, int64_t lda, int64_t sa,
                                        const float *b, int64_t ldb, int64_t sb, float beta,
                                        float *cm, int64_t ldc, int64_t sc, int64_t count)
{
    const float one = 1.0f;
    PDP__BLAS(cublasSgemmStridedBatched(c->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                                        ta ? CUBLAS_OP_T : CUBLAS_OP_N, (int)n, (int)m, (int)k,
                                        &one, b, (int)ldb, sb, a, (int)lda, sa, &beta, cm,
                                        (int)ldc, sc, (int)count));
    return PDP_OK;
}

/* ---- gemm: bf16 (a model in PDP_PRECISION_BF16) ----
   As on the CPU (pdp_gemm_bf16), a product's two inputs are rounded to bf16 and the
   rest is fp32: pdp__bf16_fwd rounds each input with math.h's pdp__bf16_bits (the
   CPU's rounding, to nearest even) into the device's bf16 workspace, and cuBLAS
   multiplies the copies with cublasGemmEx: CUDA_R_16BF inputs, CUDA_R_32F output,
   CUBLAS_COMPUTE_32F (exact products, fp32 sums; cuBLAS's summation order, not the
   CPU's). The workspace is one buffer per device, grown (through the cache) the
   first time a layer needs more, so steady training allocates nothing; a layer
   takes bf16_mu, converts, enqueues its GEMMs and releases it, and the stream runs
   the next holder's conversions after those GEMMs. */

static __global__ void pdp__bf16_fwd(const float *x, uint16_t *y, int64_t n)
{
    PDP__FOR(i, n) y[i] = pdp__bf16_bits(x[i]);
}

/* bf16 elements from the start of a piece of the workspace to the next: 16-byte
   aligned, as cuBLAS's tensor-core kernels like */
static int64_t pdp__bf16_span(int64_t count) { return (count + 7) / 8 * 8; }

/* The workspace, grown to at least count bf16 elements; the caller holds bf16_mu. */
static pdp_status pdp__cu_bf16_ws(int dev, pdp__cu_ctx *c, int64_t count, uint16_t **out)
{
    size_t bytes = (size_t)count * sizeof(uint16_t);
    pdp_status st;
    if (c->bf16_bytes < bytes) {
        void *p;
        PDP__CU(cudaStreamSynchronize(c->stream)); /* the old one may still be read */
        if ((st = pdp_cudak_malloc(dev, bytes, &p)) != PDP_OK) return st;
        pdp_cudak_free(dev, c->bf16);
        c->bf16 = (uint16_t *)p;
        c->bf16_bytes = bytes;
    }
    *out = c->bf16;
    return PDP_OK;
}

/* dst[0, n) = src[0, n) rounded to bf16; returns dst + its span (the next piece). */
static pdp_status pdp__cu_to_bf16(pdp__cu_ctx *c, const float *src, int64_t n, uint16_t *dst,
                                  uint16_t **next)
{
    pdp__bf16_fwd<<<pdp__cu_grid(n), PDP__CU_THREADS, 0, c->stream>>>(src, dst, n);
    PDP__LAUNCHED(pdp__bf16_fwd);
    *next = dst + pdp__bf16_span(n);
    return PDP_OK;
}

/* pdp__cu_sgemm_batched on bf16 operands (count 1, strides 0: one GEMM). */
static pdp_status pdp__cu_gemm_bf16(pdp__cu_ctx *c, bool ta, bool tb, int64_t m, int64_t n,
                                    int64_t k, const uint16_t *a, int64_t lda, int64_t sa,
                                    const uint16_t *b, int64_t ldb, int64_t sb, float beta,
                                    float *cm, int64_t ldc, int64_t sc, int64_t count)
{
    const float one = 1.0f;
    cublasOperation_t opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    if (count == 1)
        PDP__BLAS(cublasGemmEx(c->blas, opb, opa, (int)n, (int)m, (int)k, &one, b, CUDA_R_16BF,
                               (int)ldb, a, CUDA_R_16BF, (int)lda, &beta, cm, CUDA_R_32F,
                               (int)ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    else
        PDP__BLAS(cublasGemmStridedBatchedEx(c->blas, opb, opa, (int)n, (int)m, (int)k, &one, b,
                                             CUDA_R_16BF, (int)ldb, sb, a, CUDA_R_16BF,
                                             (int)lda, sa, &beta, cm, CUDA_R_32F, (int)ldc, sc,
                                             (int)count, CUBLAS_COMPUTE_32F,
                                             CUBLAS_GEMM_DEFAULT));
    return PDP_OK;
}

extern "C" pdp_status pdp_cudak_gemm(int dev, const float *a, const float *b, float *cm,
                                     int64_t m, int64_t n, int64_t k)
{
    pdp__cu_ctx *c;
    pdp_status st;
    if ((st = pdp__cu_begin(dev, &c)) != PDP_OK) return st;
    return pdp__cu_sgemm(c, false, false, m, n, k, a, k, b, n, 0.0f, cm, n);
}

/* ---- Linear ---- */

/* y[i, j] = b[j] */
static __global__ void pdp__bias_rows_fwd(float *y, const float *b, int64_t rows, int64_t cols)
{
    PDP__FOR(i, rows * cols) y[i] = b[i % cols];
}

/* Column sums in row order (a bias's gradient, LayerNorm's parameters'): each column's adds
   run in the CPU's order, row 0 first into one float, a serial chain per column. A thread per
   column reading its rows itself waits on one load at a time with a few warps on the GPU: on
   an H200 such sums took 225-455 us a call, over half of a GPT step. Here a block takes
   PDP__CS_COLS columns and brings PDP__CS_ROWS rows of them at a time into shared memory,
   every thread loading (each warp a row, coalesced); its first warp adds them, a lane per
   column, in row order, while the threads' loads of the next rows are in flight. The same
   operations in the same order as that one thread, so the same bits. */
#define PDP__CS_COLS 32
#define PDP__CS_ROWS 128
#define PDP__CS_PASS (PDP__CU_THREADS / PDP__CS_COLS) /* rows the block loads at once */
#define PDP__CS_EACH (PDP__CS_ROWS / PDP__CS_PASS)    /* a thread's loads per tile */

static unsigned pdp__cs_grid(int64_t cols)
{
    return (unsigned)((cols + PDP__CS_COLS - 1) / PDP__CS_COLS);
}

/* A thread's part of the tile of rows from r0: column j of rows r0 + row + k PDP__CS_PASS. */
static __device__ void pdp__cs_load(float *v, const float *g, int64_t rows, int64_t cols,
                                    int64_t r0, int row, int64_t j)
{
    for (int k = 0; k < PDP__CS_EACH; k++) {
        int64_t r = r0 + row + (int64_t)k * PDP__CS_PASS;
        v[k] = r < rows && j < cols ? g[r * cols + j] : 0.0f;
    }
}

/* db[j] += sum over rows of g[:, j], in row order */
static __global__ void pdp__colsum_bwd(float *db, const float *g, int64_t rows, int64_t cols)
{
    __shared__ float tile[PDP__CS_ROWS][PDP__CS_COLS];
    float v[PDP__CS_EACH];
    int lane = (int)threadIdx.x % PDP__CS_COLS, row = (int)threadIdx.x / PDP__CS_COLS;
    int64_t j = (int64_t)blockIdx.x * PDP__CS_COLS + lane;
    bool adder = threadIdx.x < PDP__CS_COLS && j < cols;
    float acc = adder ? db[j] : 0.0f;
    pdp__cs_load(v, g, rows, cols, 0, row, j);
    for (int64_t r0 = 0; r0 < rows; r0 += PDP__CS_ROWS) {
        int n = rows - r0 < PDP__CS_ROWS ? (int)(rows - r0) : PDP__CS_ROWS;
        for (int k = 0; k < PDP__CS_EACH; k++) tile[row + k * PDP__CS_PASS][lane] = v[k];
        __syncthreads();
        pdp__cs_load(v, g, rows, cols, r0 + PDP__CS_ROWS, row, j); /* the next tile's */
        if (adder)
            for (int r = 0; r < n; r++) acc += tile[r][lane];
        __syncthreads();
    }
    if (adder) db[j] = acc;
}

/* bf16, under bf16_mu: y (+)= bf16(x) bf16(W)^T */
static pdp_status pdp__cu_linear_fwd_bf16(int dev, pdp__cu_ctx *c, const float *x, const float *w,
                                          float beta, float *y, int64_t batch, int64_t in,
                                          int64_t out)
{
    uint16_t *xb, *wb, *end;
    pdp_status st;
    if ((st = pdp__cu_bf16_ws(dev, c, pdp__bf16_span(batch * in) + pdp__bf16_span(out * in),
                              &xb)) != PDP_OK ||
        (st = pdp__cu_to_bf16(c, x, batch * in, xb, &wb)) != PDP_OK ||
        (st = pdp__cu_to_bf16(c, w, out * in, wb, &end)) != PDP_OK)
        return st;
    return pdp__cu_gemm_bf16(c, false, true, batch, out, in, xb, in, 0, wb, in, 0, beta, y, out, 0,
                             1);
}

/* bf16, under bf16_mu: dW += bf16(dY)^T bf16(X), dX = bf16(dY) bf16(W) */
static pdp_status pdp__cu_linear_bwd_bf16(int dev, pdp__cu_ctx *c, const float *x, const float *w,
                                          const float *dy, float *dw, float *dx, int64_t batch,
                                          int64_t in, int64_t out)
{
    uint16_t *dyb, *xb, *wb, *end;
    int64_t need = pdp__bf16_span(batch * out) + pdp__bf16_span(batch * in) +
                   (dx ? pdp__bf16_span(out * in) : 0);
    pdp_status st;
    if ((st = pdp__cu_bf16_ws(dev, c, need, &dyb)) != PDP_OK ||
        (st = pdp__cu_to_bf16(c, dy, batch * out, dyb, &xb)) != PDP_OK ||
        (st = pdp__cu_to_bf16(c, x, batch * in, xb, &wb)) != PDP_OK ||
        (st = pdp__cu_gemm_bf16(c, true, false, out, in, batch, dyb, out, 0, xb, in, 0, 1.0f, dw,
                                in, 0, 1)) != PDP_OK)
        return st;
    if (!dx) return PDP_OK;
    if ((st = pdp__cu_to_bf16(c, w, out * in, wb, &end)) != PDP_OK) return st;
    return pdp__cu_gemm_bf16(c, false, false, batch, in, out, dyb, out, 0, wb, in, 0, 0.0f, dx, in,
                             0, 1);
}

extern "C" pdp_status pdp_cudak_linear_fwd(int dev, const float *x, const float *w,
                                           const float *b, float *y, int64_t batch, int64_t in,
                                           int64_t out, int bf16)
{
    pdp__cu_ctx *c;
    pdp_status st;
    float beta = 0.0f;
    if ((st = pdp__cu_begin(dev, &c)) != PDP_OK) return st;
    if (b) { /* y = b, then y += x W^T, as on the CPU */
        pdp__bias_rows_fwd<<<pdp__cu_grid(batch * out), PDP__CU_THREADS, 0, c->stream>>>(
            y, b, batch, out);
        PDP__LAUNCHED(pdp__bias_rows_fwd);
        beta = 1.0f;
    }
    if (bf16) {
        pthread_mutex_lock(&c->bf16_mu);
        st = pdp__cu_linear_fwd_bf16(dev, c, x, w, beta, y, batch, in, out);
        pthread_mutex_unlock(&c->bf16_mu);
        return st;
    }
    return pdp__cu_sgemm(c, false, true, batch, out, in, x, in, w, in, beta, y, out);
}

extern "C" pdp_status pdp_cudak_linear_bwd(int dev, const float *x, const float *w,
                                           const float *dy, float *dw, float *db, float *dx,
                                           int64_t batch, int64_t in, int64_t out, int bf16)
{
    pdp__cu_ctx *c;
    pdp_status st;
    if ((st = pdp__cu_begin(dev, &c)) != PDP_OK) return st;
    if (bf16) { /* both products (db below takes the fp32 dY, as on the CPU) */
        pthread_mutex_lock(&c->bf16_mu);
        st = pdp__cu_linear_bwd_bf16(dev, c, x, w, dy, dw, dx, batch, in, out);
        pthread_mutex_unlock(&c->bf16_mu);
        if (st != PDP_OK) return st;
    } else if ((st = pdp__cu_sgemm(c, true, false, out, in, batch, dy, out, x, in, 1.0f, dw,
                                   in)) != PDP_OK) { /* dW [out, in] += dY^T X */
        return st;
    }
    if (db) {
        pdp__colsum_bwd<<<pdp__cs_grid(out), PDP__CU_THREADS, 0, c->stream>>>(db, dy, batch, out);
        PDP__LAUNCHED(pdp__colsum_bwd);
    }
    if (dx && !bf16) /* dX = dY W */
        return pdp__cu_sgemm(c, false, false, batch, in, out, dy, out, w, in, 0.0f, dx, in);
    return PDP_OK;
}

/* ---- activations (math.h formulas) ---- */

static __device__ float pdp__act(int act, float x)
{
    switch (act) {
    case PDP_CUDAK_RELU: return pdp__relu(x);
    case PDP_CUDAK_GELU: return pdp__gelu(x);
    case PDP_CUDAK_TANH: return tanhf(x);
    case PDP_CUDAK_SILU: return pdp__silu(x);
    case PDP_CUDAK_GELU_ERF: return pdp__gelu_erf(x);
    default: return pdp__sigmoid(x);
    }
}

/* GELU's (both forms) and SiLU's gradients read the input x, the others the output y: a =
   that one. */
static __device__ float pdp__act_grad(int act, float dy, float a)
{
    switch (act) {
    case PDP_CUDAK_RELU: return pdp__relu_grad(dy, a);
    case PDP_CUDAK_GELU: return pdp__gelu_grad(dy, a);
    case PDP_CUDAK_TANH: return pdp__tanh_grad(dy, a);
    case PDP_CUDAK_SILU: return pdp__silu_grad(dy, a);
    case PDP_CUDAK_GELU_ERF: return pdp__gelu_erf_grad(dy, a);
    default: return pdp__sigmoid_grad(dy, a);
    }
}

static __global__ void pdp__act_fwd(int act, const float *x, float *y, int64_t n)
{
    PDP__FOR_VEC(i, n) {
        float v[PDP__VEC];
        for (int k = 0; k < PDP__VEC; k++)
            if (PDP__LANE(i, k) < n) v[k] = x[PDP__LANE(i, k)];
        for (int k = 0; k < PDP__VEC; k++)
            if (PDP__LANE(i, k) < n) y[PDP__LANE(i, k)] = pdp__act(act, v[k]);
    }
}

static __global__ void pdp__act_bwd(int act, const float *x, const float *y, const float *dy,
                                    float *dx, int64_t n)
{
    const float *in =
        act == PDP_CUDAK_GELU || act == PDP_CUDAK_SILU || act == PDP_CUDAK_GELU_ERF ? x : y;
    PDP__FOR_VEC(i, n) {
        float a[PDP__VEC], d[PDP__VEC];
        for (int k = 0; k < PDP__VEC; k++)
            if (PDP__LANE(i, k) < n) a[k] = in[PDP__LANE(i, k)], d[k] = dy[PDP__LANE(i, k)];
        for (int k = 0; k < PDP__VEC; k++)
            if (PDP__LANE(i, k) < n) dx[PDP__LANE(i, k)] = pdp__act_grad(act, d[k], a[k]);
    }
}

extern "C" pdp_status pdp_cudak_act_fwd(int dev, pdp_cudak_act act, const float *x, float *y,
                                        int64_t count)
{
    pdp__cu_ctx *c;
    pdp_status st;
    if ((st = pdp__cu_begin(dev, &c)) != PDP_OK) return st;
    if (count <= 0) return PDP_OK;
    pdp__act_fwd<<<pdp__cu_grid_vec(count), PDP__CU_THREADS, 0, c->stream>>>((int)act, x, y, count);
    PDP__LAUNCHED(pdp__act_fwd);
    return PDP_OK;
}

extern "C" pdp_status pdp_cudak_act_bwd(int dev, pdp_cudak_act act, const float *x,
                                        const float *y, const float *dy, float *dx, int64_t count)
{
    pdp__cu_ctx *c;
    pdp_status st;
    if ((st = pdp__cu_begin(dev, &c)) != PDP_OK) return st;
    if (count <= 0) return PDP_OK;
    pdp__act_bwd<<<pdp__cu_grid_vec(count), PDP__CU_THREADS, 0, c->stream>>>((int)act, x, y, dy, dx,
                                                                          count);
    PDP__LAUNCHED(pdp__act_bwd);
    return PDP_OK;
}

/* ---- Dropout: the counter-based mask of math.h, bit-equal to the CPU's ---- */

static __global__ void pdp__dropout_fwd(const float *x, float *y, float *mask, int64_t batch,
                                        int64_t n, uint32_t thr, float scale, uint64_t seed,
                                        int layer, uint64_t step, int64_t sample_base,
                                        int64_t first)
{
    PDP__FOR(i, batch * n) {
        int64_t s = i / n, j = i % n;
        uint64_t key = pdp__dropout_key(seed, layer, step, sample_base + s);
        float m = pdp__dropout_bits(key, first + j) >= thr ? scale : 0.0f;
        mask[i] = m;
        y[i] = x[i] * m;
    }
}

extern "C" pdp_status pdp_cudak_dropout_fwd(int dev, const float *x, float *y, float *mask,
                                            int64_t batch, int64_t n, float p, uint64_t seed,
                                            int layer, uint64_t step, int64_t sample_base,
                                            int64_t first)
{
    pdp__cu_ctx *c;
    pdp_status st;
    if ((st = pdp__cu_begin(dev, &c)) != PDP_OK) return st;
    if (batch * n <= 0) return PDP_OK;
    pdp__dropout_fwd<<<pdp__cu_grid(batch * n), PDP__CU_THREADS, 0, c->stream>>>(
        x, y, mask, batch, n, pdp__dropout_threshold(p), 1.0f / (1.0f - p), seed, layer, step,
        sample_base, first);
    PDP__LAUNCHED(pdp__dropout_fwd);
    return PDP_OK;
}

extern "C" pdp_status pdp_cudak_mul(int dev, const float *dy, const float *mask, float *dx,
                                    int64_t count)
{
    pdp__cu_ctx *c;
    pdp_status st;
    if ((st = pdp__cu_begin(dev, &c)) != PDP_OK) return st;
    if (count <= 0) return PDP_OK;
    pdp__zip_fwd<<<pdp__cu_grid_vec(count), PDP__CU_THREADS, 0, c->stream>>>(1, dy, mask, dx,
                                                                            count);
    PDP__LAUNCHED(pdp__zip_fwd);
    return PDP_OK;
}

/* ---- block reductions (double, fixed tree: deterministic) ---- */

static __device__ double pdp__warp_sum(double v)
{
    for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
    return v;
}

/* Sum of v over the block (blockDim.x a multiple of 32, <= 1024); every thread
   gets the result. shared: 32 doubles. */
static __device__ double pdp__block_sum(double v, double *shared)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = pdp__warp_sum(v);
    __syncthreads(); /* shared may still be read from a previous call */
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = (int)threadIdx.x < nwarps ? shared[threadIdx.x] : 0.0;
    if (warp == 0) v = pdp__warp_sum(v);
    if (threadIdx.x == 0) shared[0] = v;
    __syncthreads();
    return shared[0];
}

/* ---- LayerNorm: one block per sample ---- */

static __global__ void pdp__layernorm_fwd(const float *x, const float *w, const float *b,
                                          float *y, float *saved, int64_t n, float eps)
{
    __shared__ double sh[32];
    const float *xs = x + (int64_t)blockIdx.x * n;
    float *ys = y + (int64_t)blockIdx.x * n;
    double acc = 0.0;
    float mean, rstd;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) acc += xs[j];
    mean = (float)(pdp__block_sum(acc, sh) / (double)n);
    acc = 0.0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
        float d = xs[j] - mean;
        acc += (double)d * (double)d;
    }
    rstd = (float)(1.0 / sqrt(pdp__block_sum(acc, sh) / (double)n + (double)eps));
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) ys[j] = (xs[j] - mean) * rstd * w[j] + b[j];
    if (threadIdx.x == 0) {
        saved[2 * blockIdx.x] = mean;
        saved[2 * blockIdx.x + 1] = rstd;
    }
}

/* dx = rstd (g - mean(g) - xh mean(g xh)), g = dy w, xh = (x - mean) rstd */
static __global__ void pdp__layernorm_bwd(const float *x, const float *w, const float *dy,
                                          const float *saved, float *dx, int64_t n)
{
    __shared__ double sh[32];
    int64_t s = blockIdx.x;
    const float *xs = x + s * n, *gs = dy + s * n;
    float mean = saved[2 * s], rstd = saved[2 * s + 1], mg, mgx;
    double a = 0.0, b = 0.0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
        a += (double)gs[j] * w[j];
        b += (double)gs[j] * w[j] * (xs[j] - mean);
    }
    mg = (float)(pdp__block_sum(a, sh) / (double)n);
    mgx = (float)(pdp__block_sum(b, sh) * (double)rstd / (double)n);
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
        dx[s * n + j] = rstd * (gs[j] * w[j] - mg - (xs[j] - mean) * rstd * mgx);
}

/* dw[j] += sum_s dy xh, db[j] += sum_s dy, samples in order: pdp__colsum_bwd's scheme, each
   loading thread forming its xh = (x - mean) rstd on the way into the tile */
static __global__ void pdp__layernorm_params_bwd(const float *x, const float *dy,
                                                 const float *saved, float *dw, float *db,
                                                 int64_t batch, int64_t n)
{
    __shared__ float gt[PDP__CS_ROWS][PDP__CS_COLS], xt[PDP__CS_ROWS][PDP__CS_COLS];
    float gv[PDP__CS_EACH], xv[PDP__CS_EACH];
    int lane = (int)threadIdx.x % PDP__CS_COLS, row = (int)threadIdx.x / PDP__CS_COLS;
    int64_t j = (int64_t)blockIdx.x * PDP__CS_COLS + lane;
    bool adder = threadIdx.x < PDP__CS_COLS && j < n;
    float aw = adder ? dw[j] : 0.0f, ab = adder ? db[j] : 0.0f;
    pdp__cs_load(gv, dy, batch, n, 0, row, j);
    pdp__cs_load(xv, x, batch, n, 0, row, j);
    for (int64_t s0 = 0; s0 < batch; s0 += PDP__CS_ROWS) {
        int m = batch - s0 < PDP__CS_ROWS ? (int)(batch - s0) : PDP__CS_ROWS;
        for (int k = 0; k < PDP__CS_EACH; k++) {
            int r = row + k * PDP__CS_PASS;
            int64_t s = s0 + r < batch ? s0 + r : 0; /* a row past the end is never added */
            gt[r][lane] = gv[k];
            xt[r][lane] = (xv[k] - saved[2 * s]) * saved[2 * s + 1];
        }
        __syncthreads();
        pdp__cs_load(gv, dy, batch, n, s0 + PDP__CS_ROWS, row, j); /* the next tile's */
        pdp__cs_load(xv, x, batch, n, s0 + PDP__CS_ROWS, row, j);
        if (adder)
            for (int r = 0; r < m; r++) {
                aw += gt[r][lane] * xt[r][lane];
                ab += gt[r][lane];
            }
        __syncthreads();
    }
    if (adder) {
        dw[j] = aw;
        db[j] = ab;
    }
}

extern "C" pdp_status pdp_cudak_layernorm_fwd(int dev, const float *x, const float *w,
                                              const float *b, float *y, float *saved,
                                              int64_t batch, int64_t n, float eps)
{
    pdp__cu_ctx *c;
    pdp_status st;
    if ((st = pdp__cu_begin(dev, &c)) != PDP_OK) return st;
    PDP__ARGS(batch < 2147483647LL, "LayerNorm: batch %lld too large", (long long)batch);
    if (batch <= 0) return PDP_OK;
    pdp__layernorm_fwd<<<(unsigned)batch, PDP__CU_THREADS, 0, c->stream>>>(x, w, b, y, saved, n,
                                                                            eps);
    PDP__LAUNCHED(pdp__layernorm_fwd);
    return PDP_OK;
}

extern "C" pdp_status pdp_cudak_layernorm_bwd(int dev, const float *x, const float *w,
                                              const float *dy, const float *saved, float *dw,
                                              float *db, float *dx, int64_t batch, int64_t n)
{
    pdp__cu_ctx *c;
    pdp_status st;
    if ((st = pdp__cu_begin(dev, &c)) != PDP_OK) return st;
    if (batch <= 0) return PDP_OK;
    pdp__layernorm_params_bwd<<<pdp__cs_grid(n), PDP__CU_THREADS, 0, c->stream>>>(
        x, dy, saved, dw, db, batch, n);
    PDP__LAUNCHED(pdp__layernorm_params_bwd);
    if (dx) {
        pdp__layernorm_bwd<<<(unsigned)batch, PDP__CU_THREADS, 0, c->stream>>>(x, w, dy, saved,
                                                                                dx, n);
        PDP__LAUNCHED(pdp__layernorm_bwd);
    }
    return PDP_OK;
}

/* ---- Conv2d: im2col + cuBLAS, col2im by gathering ----
   The column matrix of the batch is [C k k, batch Ho Wo] (ld = batch Ho Wo), as
   on the CPU. Forward: y_s [O, HoWo] = W [O, Ckk] col_s, one strided-batched
   GEMM. Backward: dyt [O, batch HoWo] = dy transposed; db from its rows; dW +=
   dyt col^T (one GEMM over the batch); dcol_s = W^T dy_s (strided batched), then
   each input element gathers its column entries in (ki, kj) order. */

static __global__ void pdp__im2col_fwd(const float *x, float *col, pdp_cudak_conv g)
{
    int64_t hw = g.Ho * g.Wo, ld = g.batch * hw, rows = g.C * g.k * g.k;
    PDP__FOR(i, rows * ld) {
        int64_t r = i / ld, q = i % ld, s = q / hw, p = q % hw;
        int64_t oh = p / g.Wo, ow = p % g.Wo;
        int64_t c = r / (g.k * g.k), ki = (r / g.k) % g.k, kj = r % g.k;
        int64_t ih = oh * g.stride - g.pad + ki, iw = ow * g.stride - g.pad + kj;
        col[i] = (ih >= 0 && ih < g.H && iw >= 0 && iw < g.W)
                     ? x[((s * g.C + c) * g.H + ih) * g.W + iw]
                     : 0.0f;
    }
}

static __global__ void pdp__col2im_bwd(const float *col, float *dx, pdp_cudak_conv g)
{
    int64_t hw = g.Ho * g.Wo, ld = g.batch * hw, n = g.batch * g.C * g.H * g.W;
    PDP__FOR(i, n) {
        int64_t iw = i % g.W, ih = (i / g.W) % g.H, c = (i / (g.W * g.H)) % g.C;
        int64_t s = i / (g.W * g.H * g.C);
        float acc = 0.0f;
        for (int64_t ki = 0; ki < g.k; ki++) {
            int64_t th = ih + g.pad - ki, oh;
            if (th < 0 || th % g.stride) continue;
            oh = th / g.stride;
            if (oh >= g.Ho) continue;
            for (int64_t kj = 0; kj < g.k; kj++) {
                int64_t tw = iw + g.pad - kj, ow;
                if (tw < 0 || tw % g.stride) continue;
                ow = tw / g.stride;
                if (ow >= g.Wo) continue;
                acc += col[((c * g.k + ki) * g.k + kj) * ld + s * hw + oh * g.Wo + ow];
            }
        }
        dx[i] = acc;
    }
}

/* y[s, o, p] = b[o] */
static __global__ void pdp__conv_bias_fwd(float *y, const float *b, int64_t batch, int64_t O,
                                          int64_t hw)
{
    PDP__FOR(i, batch * O * hw) y[i] = b[(i / hw) % O];
}

/* dyt[o, s hw + p] = dy[s, o, p] */
static __global__ void pdp__conv_dyt_bwd(const float *dy, float *dyt, int64_t batch, int64_t O,
                                         int64_t hw)
{
    PDP__FOR(i, batch * O * hw) {
        int64_t p = i % hw, o = (i / hw) % O, s = i / (hw * O);
        dyt[o * batch * hw + s * hw + p] = dy[i];
    }
}

/* db[o] += sum of row o of dyt: one block per channel */
static __global__ void pdp__rowsum_bwd(const float *dyt, float *db, int64_t cols)
{
    __shared__ double sh[32];
    const float *row = dyt + (int64_t)blockIdx.x * cols;
    double acc = 0.0, total;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) acc += row[j];
    total = pdp__block_sum(acc, sh);
    if (threadIdx.x == 0) db[blockIdx.x] += (float)total;
}

/* bf16, under bf16_mu: y_s (+)= bf16(W) bf16(col_s) */
static pdp_status pdp__cu_conv_fwd_bf16(int dev, pdp__cu_ctx *c, const pdp_cudak_conv *g,
                                        const float *w, const float *col, float beta, float *y)
{
    int64_t hw = g->Ho * g->Wo, ld = g->batch * hw, ckk = g->C * g->k * g->k;
    uint16_t *wb, *colb, *end;
    pdp_status st;
    if ((st = pdp__cu_bf16_ws(dev, c, pdp__bf16_span(g->O * ckk) + pdp__bf16_span(ckk * ld),
                              &wb)) != PDP_OK ||
        (st = pdp__cu_to_bf16(c, w, g->O * ckk, wb, &colb)) != PDP_OK ||
        (st = pdp__cu_to_bf16(c, col, ckk * ld, colb, &end)) != PDP_OK)
        return st;
    return pdp__cu_gemm_bf16(c, false, false, g->O, hw, ckk, wb, ckk, 0, colb, ld, hw, beta, y, hw,
                             g->O * hw, g->batch);
}

/* bf16, under bf16_mu: dW += bf16(dyt) bf16(col)^T; with dx, dcol_s = bf16(W)^T bf16(dy_s)
   into col */
static pdp_status pdp__cu_conv_bwd_bf16(int dev, pdp__cu_ctx *c, const pdp_cudak_conv *g,
                                        const float *w, const float *dy, const float *dyt,
                                        float *col, float *dw, bool dx)
{
    int64_t hw = g->Ho * g->Wo, ld = g->batch * hw, ckk = g->C * g->k * g->k;
    int64_t need = pdp__bf16_span(g->O * ld) + pdp__bf16_span(ckk * ld) +
                   (dx ? pdp__bf16_span(g->O * ckk) + pdp__bf16_span(g->O * ld) : 0);
    uint16_t *dytb, *colb, *wb, *dyb, *end;
    pdp_status st;
    if ((st = pdp__cu_bf16_ws(dev, c, need, &dytb)) != PDP_OK ||
        (st = pdp__cu_to_bf16(c, dyt, g->O * ld, dytb, &colb)) != PDP_OK ||
        (st = pdp__cu_to_bf16(c, col, ckk * ld, colb, &wb)) != PDP_OK ||
        (st = pdp__cu_gemm_bf16(c, false, true, g->O, ckk, ld, dytb, ld, 0, colb, ld, 0, 1.0f, dw,
                                ckk, 0, 1)) != PDP_OK)
        return st;
    if (!dx) return PDP_OK;
    if ((st = pdp__cu_to_bf16(c, w, g->O * ckk, wb, &dyb)) != PDP_OK ||
        (st = pdp__cu_to_bf16(c, dy, g->O * ld, dyb, &end)) != PDP_OK)
        return st;
    return pdp__cu_gemm_bf16(c, true, false, ckk, hw, g->O, wb, ckk, 0, dyb, hw, g->O * hw, 0.0f,
                             col, ld, hw, g->batch);
}

extern "C" pdp_status pdp_cudak_conv_fwd(int dev, const pdp_cudak_conv *g, const float *x,
                                         const float *w, const float *b, float *y, float *work,
                                         int bf16)
{
    pdp__cu_ctx *c;
    pdp_status st;
    int64_t hw = g->Ho * g->Wo, ld = g->batch * hw, ckk = g->C * g->k * g->k;
    float beta = 0.0f;
    if ((st = pdp__cu_begin(dev, &c)) != PDP_OK) return st;
    if (g->batch <= 0) return PDP_OK;
    pdp__im2col_fwd<<<pdp__cu_grid(ckk * ld), PDP__CU_THREADS, 0, c->stream>>>(x, work, *g);
    PDP__LAUNCHED(pdp__im2col_fwd);
    if (b) {
        pdp__conv_bias_fwd<<<pdp__cu_grid(g->batch * g->O * hw), PDP__CU_THREADS, 0, c->stream>>>(
            y, b, g->batch, g->O, hw);
        PDP__LAUNCHED(pdp__conv_bias_fwd);
        beta = 1.0f;
    }
    if (bf16) {
        pthread_mutex_lock(&c->bf16_mu);
        st = pdp__cu_conv_fwd_bf16(dev, c, g, w, work, beta, y);
        pthread_mutex_unlock(&c->bf16_mu);
        return st;
    }
    /* y_s [O, hw] (+)= W [O, ckk] col_s [ckk, hw] (ld ld, stride hw) */
    return pdp__cu_sgemm_batched(c, false, false, g->O, hw, ckk, w, ckk, 0, work, ld, hw, beta, y,
                                 hw, g->O * hw, g->batch);
}

extern "C" pdp_status pdp_cudak_conv_bwd(int dev, const pdp_cudak_conv *g, const float *x,
                                         const float *w, const float *dy, float *dw, float *db,
                                         float *dx, float *work, int bf16)
{
    pdp__cu_ctx *c;
    pdp_status st;
    int64_t hw = g->Ho * g->Wo, ld = g->batch * hw, ckk = g->C * g->k * g->k;
    float *col = work, *dyt = work + ckk * ld;
    if ((st = pdp__cu_begin(dev, &c)) != PDP_OK) return st;
    if (g->batch <= 0) return PDP_OK;
    pdp__im2col_fwd<<<pdp__cu_grid(ckk * ld), PDP__CU_THREADS, 0, c->stream>>>(x, col, *g);
    PDP__LAUNCHED(pdp__im2col_fwd);
    pdp__conv_dyt_bwd<<<pdp__cu_grid(g->O * ld), PDP__CU_THREADS, 0, c->stream>>>(dy, dyt, g->batch,
                                                                                 g->O, hw);
    PDP__LAUNCHED(pdp__conv_dyt_bwd);
    if (db) {
        pdp__rowsum_bwd<<<(unsigned)g->O, PDP__CU_THREADS, 0, c->stream>>>(dyt, db, ld);
        PDP__LAUNCHED(pdp__rowsum_bwd);
    }
    if (bf16) { /* both products (db above took the fp32 dyt, as on the CPU) */
        pthread_mutex_lock(&c->bf16_mu);
        st = pdp__cu_conv_bwd_bf16(dev, c, g, w, dy, dyt, col, dw, dx != NULL);
        pthread_mutex_unlock(&c->bf16_mu);
        if (st != PDP_OK || !dx) return st;
    } else {
        /* dW [O, ckk] += dyt [O, ld] col^T */
        if ((st = pdp__cu_sgemm(c, false, true, g->O, ckk, ld, dyt, ld, col, ld, 1.0f, dw,
                                ckk)) != PDP_OK)
            return st;
        if (!dx) return PDP_OK;
        /* dcol_s [ckk, hw] = W^T [ckk, O] dy_s [O, hw], into the column matrix */
        if ((st = pdp__cu_sgemm_batched(c, true, false, ckk, hw, g->O, w, ckk, 0, dy, hw,
                                        g->O * hw, 0.0f, col, ld, hw, g->batch)) != PDP_OK)
            return st;
    }
    pdp__col2im_bwd<<<pdp__cu_grid(g->batch * g->C * g->H * g->W), PDP__CU_THREADS, 0, c->stream>>>(
        col, dx, *g);
    PDP__LAUNCHED(pdp__col2im_bwd);
    return PDP_OK;
}

/* ---- MaxPool2d: first maximum in window order wins, NaN wins (the CPU's rule);
   the argmax is the index within the channel plane, saved as a float ---- */

static __global__ void pdp__maxpool_fwd(const float *x, float *y, float *arg, pdp_cudak_conv g)
{
    int64_t per = g.Ho * g.Wo;
    PDP__FOR(i, g.batch * g.C * per) {
        int64_t p = i % per, sc = i / per, oh = p / g.Wo, ow = p % g.Wo;
        const float *xp = x + sc * g.H * g.W;
        int64_t best_at = oh * g.stride * g.W + ow * g.stride;
        float best = xp[best_at];
        for (int64_t ki = 0; ki < g.k; ki++)
            for (int64_t kj = 0; kj < g.k; kj++) {
                int64_t at = (oh * g.stride + ki) * g.W + ow * g.stride + kj;
                float v = xp[at];
                if (v > best || v != v) {
                    best = v;
                    best_at = at;
                }
            }
        y[i] = best;
        arg[i] = (float)best_at;
    }
}

/* Each input element gathers the gradients of the windows that chose it, in
   output order (the CPU's accumulation order). */
static __global__ void pdp__maxpool_bwd(const float *dy, const float *arg, float *dx,
                                        pdp_cudak_conv g)
{
    int64_t plane = g.H * g.W, per = g.Ho * g.Wo;
    PDP__FOR(i, g.batch * g.C * plane) {
        int64_t q = i % plane, sc = i / plane, ih = q / g.W, iw = q % g.W;
        int64_t oh0 = ih - g.k + 1 > 0 ? (ih - g.k + 1 + g.stride - 1) / g.stride : 0;
        int64_t ow0 = iw - g.k + 1 > 0 ? (iw - g.k + 1 + g.stride - 1) / g.stride : 0;
        int64_t oh1 = ih / g.stride < g.Ho - 1 ? ih / g.stride : g.Ho - 1;
        int64_t ow1 = iw / g.stride < g.Wo - 1 ? iw / g.stride : g.Wo - 1;
        float acc = 0.0f;
        for (int64_t oh = oh0; oh <= oh1; oh++)
            for (int64_t ow = ow0; ow <= ow1; ow++) {
                int64_t o = sc * per + oh * g.Wo + ow;
                if ((int64_t)arg[o] == q) acc += dy[o];
            }
        dx[i] = acc;
    }
}

extern "C" pdp_status pdp_cudak_maxpool_fwd(int dev, const pdp_cudak_conv *g, const float *x,
                                            float *y, float *argmax)
{
    pdp__cu_ctx *c;
    pdp_status st;
    int64_t n = g->batch * g->C * g->Ho * g->Wo;
    if ((st = pdp__cu_begin(dev, &c)) != PDP_OK) return st;
    if (n <= 0) return PDP_OK;
    pdp__maxpool_fwd<<<pdp__cu_grid(n), PDP__CU_THREADS, 0, c->stream>>>(x, y, argmax, *g);
    PDP__LAUNCHED(pdp__maxpool_fwd);
    return PDP_OK;
}

extern "C" pdp_status pdp_cudak_maxpool_bwd(int dev, const pdp_cudak_conv *g, const float *dy,
                                            const float *argmax, float *dx)
{
    pdp__cu_ctx *c;
    pdp_status st;
    int64_t n = g->batch * g->C * g->H * g->W;
    if ((st = pdp__cu_begin(dev, &c)) != PDP_OK) return st;
    if (n <= 0) return PDP_OK;
    pdp__maxpool_bwd<<<pdp__cu_grid(n), PDP__CU_THREADS, 0, c->stream>>>(dy, argmax, dx, *g);
    PDP__LAUNCHED(pdp__maxpool_bwd);
    return PDP_OK;
}

/* ---- GPT: token and position embedding ----
   Forward: out[b, t, :] = wte[id[b, t], :] + wpe[t, :], one thread per output element.
   The ids are on the device, so their check is too: one block scans them for the first
   (b, t), in row-major order, whose id is outside [0, V), a fixed-tree minimum (no
   atomics), into the loss scratch; the host reads that back after the gather, so a bad
   id is PDP_ERR_INVALID naming its position and value as on the CPU (the forward waits
   for a 16-byte copy; the gather writes 0 for a bad id and never reads outside wte).
   Backward, deterministic with no atomics, in the CPU's order per channel:
   - dwpe[t, c] += dout[b, t, c] over b in order: one thread per (t, c);
   - dwte: the positions are sorted by (id, position) - each position's rank is the
     count of positions before it in that order, a tiled all-pairs count of (B T)^2
     integer compares (one launch, microseconds at a few thousand tokens a batch;
     quadratic beyond) - then one thread per (run of equal ids, channel) adds its run's
     rows in position order: the CPU's additions in the CPU's order (so the tied head's
     gradient, already in dwte, gets the embedding's on top exactly as on the CPU). */

/* The smallest of v over the block (blockDim.x a multiple of 32); every thread gets it.
   shared: 32 values. */
static __device__ int64_t pdp__block_min_i64(int64_t v, int64_t *shared)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    for (int off = 16; off > 0; off >>= 1) {
        int64_t o = __shfl_down_sync(0xffffffffu, v, off);
        v = o < v ? o : v;
    }
    __syncthreads();
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = (int)threadIdx.x < nwarps ? shared[threadIdx.x] : INT64_MAX;
    if (warp == 0)
        for (int off = 16; off > 0; off >>= 1) {
            int64_t o = __shfl_down_sync(0xffffffffu, v, off);
            v = o < v ? o : v;
        }
    if (threadIdx.x == 0) shared[0] = v;
    __syncthreads();
    return shared[0];
}

/* One block: bad[0] = the first position whose id is outside [0, V) (n when none),
   bad[1] = that id. */
static __global__ void pdp__embed_check_fwd(const int32_t *ids, int64_t n, int64_t V,
                                            int64_t *bad)
{
    __shared__ int64_t sh[32];
    int64_t first = n, at;
    for (int64_t p = threadIdx.x; p < n; p += blockDim.x)
        if ((ids[p] < 0 || ids[p] >= V) && p < first) first = p;
    at = pdp__block_min_i64(first, sh);
    if (threadIdx.x == 0) {
        bad[0] = at;
        bad[1] = at < n ? ids[at] : 0;
    }
}

static __global__ void pdp__embed_fwd(const int32_t *ids, const float *wte, const float *wpe,
                                      float *out, int64_t n, int64_t T, int64_t V, int64_t C)
{
    PDP__FOR(i, n * C) {
        int64_t p = i / C, c = i % C;
        int32_t id = ids[p];
        out[i] = id >= 0 && id < V ? wte[(int64_t)id * C + c] + wpe[(p % T) * C + c] : 0.0f;
    }
}

/* order[rank of p] = p, the rank of position p in (id, position) order: the positions
   before it are those with a smaller id, or the same id earlier. Tiles of blockDim.x
   ids go through shared memory. */
static __global__ void pdp__embed_sort_bwd(const int32_t *ids, int64_t n, int32_t *order)
{
    __shared__ int32_t tile[PDP__CU_THREADS];
    for (int64_t base = (int64_t)blockIdx.x * blockDim.x; base < n;
         base += (int64_t)blockDim.x * gridDim.x) {
        int64_t p = base + threadIdx.x, rank = 0;
        int32_t mine = p < n ? ids[p] : 0;
        for (int64_t q0 = 0; q0 < n; q0 += blockDim.x) {
            int64_t m = n - q0 < (int64_t)blockDim.x ? n - q0 : (int64_t)blockDim.x;
            __syncthreads(); /* the previous tile is read */
            if ((int64_t)threadIdx.x < m) tile[threadIdx.x] = ids[q0 + threadIdx.x];
            __syncthreads();
            for (int64_t j = 0; j < m; j++) {
                int32_t o = tile[j];
                rank += o < mine || (o == mine && q0 + j < p);
            }
        }
        if (p < n) order[rank] = (int32_t)p;
    }
}

/* dwte[v, c] += dout[p, c] over the run of positions p with id v, in position order:
   the thread of a run's first entry does the whole run, PDP__VEC2 positions at a time:
   their loads (the positions, then their ids and rows) all issued before the adds, which
   stop at the first position past the run. One position at a time, each add waited on
   two loads in a row (185 us a call on an H200 at 2048 positions of bytes). */
#define PDP__VEC2 8

static __global__ void pdp__embed_wte_bwd(const int32_t *ids, const int32_t *order,
                                          const float *dout, float *dwte, int64_t n, int64_t C)
{
    PDP__FOR(i, n * C) {
        int64_t r = i / C, c = i % C;
        int32_t v = ids[order[r]];
        if (r > 0 && ids[order[r - 1]] == v) continue; /* not the first of its run */
        float acc = dwte[(int64_t)v * C + c];
        for (int64_t j = r; j < n; j += PDP__VEC2) { /* fixed trip counts: registers */
            int32_t p[PDP__VEC2], id[PDP__VEC2];
            float g[PDP__VEC2];
            bool end = false;
            for (int k = 0; k < PDP__VEC2; k++) p[k] = order[j + k < n ? j + k : n - 1];
            for (int k = 0; k < PDP__VEC2; k++)
                id[k] = ids[p[k]], g[k] = dout[(int64_t)p[k] * C + c];
            for (int k = 0; k < PDP__VEC2; k++) {
                end = end || j + k >= n || id[k] != v; /* the run ended, or the positions */
                if (!end) acc += g[k];
            }
            if (end) break;
        }
        dwte[(int64_t)v * C + c] = acc;
    }
}

static __global__ void pdp__embed_wpe_bwd(const float *dout, float *dwpe, int64_t B, int64_t T,
                                          int64_t C)
{
    PDP__FOR(i, T * C) {
        float acc = dwpe[i];
        for (int64_t b = 0; b < B; b++) acc += dout[b * T * C + i];
        dwpe[i] = acc;
    }
}

/* Under scratch_mu: the ids' check (forward: with the gather, backward: before the
   scatter), then its answer on the host; why is added to the message. */
static pdp_status pdp__cu_embed_check(int dev, pdp__cu_ctx *c, const int32_t *ids,
                                      const float *wte, const float *wpe, float *out,
                                      int64_t B, int64_t T, int64_t V, int64_t C,
                                      const char *why)
{
    int64_t n = B * T, bad[2];
    void *scratch;
    pdp_status st;
    if ((st = pdp__cu_scratch(dev, c, sizeof bad, &scratch)) != PDP_OK) return st;
    pdp__embed_check_fwd<<<1, PDP__CU_THREADS, 0, c->stream>>>(ids, n, V, (int64_t *)scratch);
    PDP__LAUNCHED(pdp__embed_check_fwd);
    if (out) {
        pdp__embed_fwd<<<pdp__cu_grid(n * C), PDP__CU_THREADS, 0, c->stream>>>(ids, wte, wpe,
                                                                                out, n, T, V, C);
        PDP__LAUNCHED(pdp__embed_fwd);
    }
    PDP__CU(cudaMemcpyAsync(bad, scratch, sizeof bad, cudaMemcpyDeviceToHost, c->stream));
    PDP__CU(cudaStreamSynchronize(c->stream));
    if (bad[0] < n)
        return pdp__cu_fail(PDP_ERR_INVALID, "token id %lld at position (%lld, %lld) is outside "
                            "[0, %lld)%s", (long long)bad[1], (long long)(bad[0] / T),
                            (long long)(bad[0] % T), (long long)V, why);
    return PDP_OK;
}

extern "C" pdp_status pdp_cudak_embed_fwd(int dev, const int32_t *ids, const float *wte,
                                          const float *wpe, float *out, int64_t B, int64_t T,
                                          int64_t V, int64_t C)
{
    pdp__cu_ctx *c;
    pdp_status st;
    if ((st = pdp__cu_begin(dev, &c)) != PDP_OK) return st;
    if (B * T <= 0) return PDP_OK;
    pthread_mutex_lock(&c->scratch_mu);
    st = pdp__cu_embed_check(dev, c, ids, wte, wpe, out, B, T, V, C, "");
    pthread_mutex_unlock(&c->scratch_mu);
    return st;
}

extern "C" pdp_status pdp_cudak_embed_bwd(int dev, const int32_t *ids, const float *dout,
                                          float *dwte, float *dwpe, int32_t *work, int64_t B,
                                          int64_t T, int64_t V, int64_t C)
{
    pdp__cu_ctx *c;
    pdp_status st;
    int64_t n = B * T;
    if ((st = pdp__cu_begin(dev, &c)) != PDP_OK) return st;
    PDP__ARGS(n < 2147483647LL, "Embedding: %lld positions: positions are int32", (long long)n);
    if (n <= 0) return PDP_OK;
    /* the ids again: the model keeps the forward's input, not a copy, and ids changed since
       would scatter past dwte (layers_gpt.c checks the CPU's alike) */
    pthread_mutex_lock(&c->scratch_mu);
    st = pdp__cu_embed_check(dev, c, ids, NULL, NULL, NULL, B, T, V, C, ": the ids changed "
                             "after the forward (the backward reads the forward's input again)");
    pthread_mutex_unlock(&c->scratch_mu);
    if (st != PDP_OK) return st;
    pdp__embed_wpe_bwd<<<pdp__cu_grid(T * C), PDP__CU_THREADS, 0, c->stream>>>(dout, dwpe, B, T,
                                                                               C);
    PDP__LAUNCHED(pdp__embed_wpe_bwd);
    pdp__embed_sort_bwd<<<pdp__cu_grid(n), PDP__CU_THREADS, 0, c->stream>>>(ids, n, work);
    PDP__LAUNCHED(pdp__embed_sort_bwd);
    pdp__embed_wte_bwd<<<pdp__cu_grid(n * C), PDP__CU_THREADS, 0, c->stream>>>(ids, work, dout,
                                                                               dwte, n, C);
    PDP__LAUNCHED(pdp__embed_wte_bwd);
    return PDP_OK;
}

/* ---- GPT: causal self-attention ----
   layers_gpt.c's formulas (its module comment), for all (b, h) pairs at once: each
   product is cuBLAS strided-batched GEMMs in fp32 (also in a bf16 model, as on the CPU,
   whose attention products are fp32 too): the batch runs over the larger of B and H at a
   fixed stride, the host loops over the smaller (a head's q, k, v are columns of qkv's
   rows, row stride 3C; att, the probabilities, is [B, H, T, T]). The causal softmax and
   its backward are a block per row of scores: the max, then exp(s - max) and its sum
   (double, fixed tree), so no exp overflows; s > t is written 0 (the mask). Attention
   dropout draws the CPU's mask (math.h, keyed by (seed, layer, step, sample_base + b),
   element ((head_base + h) T + t) T + s), so CPU and GPU drop the same probabilities;
   the backward draws it again. work: B H T T floats (Pd with dropout, then dP and dS). */

#define PDP__ATT_THREADS 128

static __device__ float pdp__block_max(float v, float *shared)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    for (int off = 16; off > 0; off >>= 1) {
        float o = __shfl_down_sync(0xffffffffu, v, off);
        v = o > v ? o : v;
    }
    __syncthreads();
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = (int)threadIdx.x < nwarps ? shared[threadIdx.x] : -INFINITY;
    if (warp == 0)
        for (int off = 16; off > 0; off >>= 1) {
            float o = __shfl_down_sync(0xffffffffu, v, off);
            v = o > v ? o : v;
        }
    if (threadIdx.x == 0) shared[0] = v;
    __syncthreads();
    return shared[0];
}

/* The kept-and-rescaled factor of score (t, s) of pair (b, h): M / (1 - p). */
static __device__ float pdp__attn_keep(const pdp_cudak_attn &g, int64_t b, int64_t h, int64_t t,
                                       int64_t s, uint32_t thr, float scale)
{
    uint64_t key = pdp__dropout_key(g.seed, g.layer, g.step, g.sample_base + b);
    return pdp__dropout_bits(key, ((g.head_base + h) * g.T + t) * g.T + s) >= thr ? scale : 0.0f;
}

/* Row r = (b H + h) T + t of att holds the scaled scores: P = causal softmax of it, in
   place; with dropout, pd's row = P o M / (1 - p). */
static __global__ void pdp__attn_softmax_fwd(float *att, float *pd, pdp_cudak_attn g,
                                             uint32_t thr, float keep_scale)
{
    __shared__ double sh[32];
    __shared__ float shf[32];
    int64_t rows = g.B * g.H * g.T;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        int64_t t = r % g.T, bh = r / g.T;
        float *p = att + r * g.T, mx = -INFINITY, sum;
        double acc = 0.0;
        /* THE CAUSAL MASK: s runs over 0..t only; the masked P are the 0s below */
        for (int64_t s = threadIdx.x; s <= t; s += blockDim.x) mx = p[s] > mx ? p[s] : mx;
        mx = pdp__block_max(mx, shf);
        for (int64_t s = threadIdx.x; s <= t; s += blockDim.x) {
            float e = expf(p[s] - mx); /* <= 1: cannot overflow */
            p[s] = e;
            acc += e;
        }
        sum = (float)pdp__block_sum(acc, sh);
        for (int64_t s = threadIdx.x; s < g.T; s += blockDim.x) {
            float v = s <= t ? p[s] / sum : 0.0f;
            p[s] = v;
            if (pd)
                pd[r * g.T + s] =
                    s <= t ? v * pdp__attn_keep(g, bh / g.H, bh % g.H, t, s, thr, keep_scale)
                           : 0.0f;
        }
    }
}

/* pd = P o M / (1 - p), the forward's dropped probabilities drawn again */
static __global__ void pdp__attn_dropout_fwd(const float *att, float *pd, pdp_cudak_attn g,
                                             uint32_t thr, float keep_scale)
{
    PDP__FOR(i, g.B * g.H * g.T * g.T) {
        int64_t s = i % g.T, r = i / g.T, t = r % g.T, bh = r / g.T;
        pd[i] = s <= t ? att[i] * pdp__attn_keep(g, bh / g.H, bh % g.H, t, s, thr, keep_scale)
                       : 0.0f;
    }
}

/* Row r of d holds dPd: dP = dPd o M / (1 - p), then dS = P o (dP - rowsum(dP o P)) times
   the scores' scale, in place; 0 where masked. */
static __global__ void pdp__attn_softmax_bwd(const float *att, float *d, pdp_cudak_attn g,
                                             float scale, uint32_t thr, float keep_scale,
                                             int dropping)
{
    __shared__ double sh[32];
    int64_t rows = g.B * g.H * g.T;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        int64_t t = r % g.T, bh = r / g.T;
        const float *p = att + r * g.T;
        float *dp = d + r * g.T, rowsum;
        double acc = 0.0;
        for (int64_t s = threadIdx.x; s <= t; s += blockDim.x) {
            float v = dp[s];
            if (dropping) v *= pdp__attn_keep(g, bh / g.H, bh % g.H, t, s, thr, keep_scale);
            dp[s] = v;
            acc += (double)(v * p[s]);
        }
        rowsum = (float)pdp__block_sum(acc, sh);
        for (int64_t s = threadIdx.x; s < g.T; s += blockDim.x)
            dp[s] = s <= t ? p[s] * (dp[s] - rowsum) * scale : 0.0f; /* masked: no gradient */
    }
}

/* One operand of the per-pair products: pair (b, h)'s matrix starts at p + b sb + h sh,
   rows ld apart. */
typedef struct pdp__cu_opnd {
    const float *p;
    int64_t ld, sb, sh;
} pdp__cu_opnd;

static pdp__cu_opnd pdp__cu_op(const float *p, int64_t ld, int64_t sb, int64_t sh)
{
    pdp__cu_opnd o;
    o.p = p;
    o.ld = ld;
    o.sb = sb;
    o.sh = sh;
    return o;
}

/* For every pair (b, h): C = alpha op(A) op(B) (row-major [m, k] by [k, n]; beta 0). */
static pdp_status pdp__cu_attn_gemm(pdp__cu_ctx *c, const pdp_cudak_attn *g, bool ta, bool tb,
                                    int64_t m, int64_t n, int64_t k, float alpha, pdp__cu_opnd a,
                                    pdp__cu_opnd b, pdp__cu_opnd out)
{
    const float zero = 0.0f;
    bool over_b = g->B >= g->H; /* cuBLAS batches over b, the host loops over h */
    int64_t outer = over_b ? g->H : g->B, count = over_b ? g->B : g->H;
    for (int64_t o = 0; o < outer; o++) {
        int64_t ao = o * (over_b ? a.sh : a.sb), bo = o * (over_b ? b.sh : b.sb);
        int64_t co = o * (over_b ? out.sh : out.sb);
        PDP__BLAS(cublasSgemmStridedBatched(
            c->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, (int)n, (int)m,
            (int)k, &alpha, b.p + bo, (int)b.ld, over_b ? b.sb : b.sh, a.p + ao, (int)a.ld,
            over_b ? a.sb : a.sh, &zero, (float *)out.p + co, (int)out.ld,
            over_b ? out.sb : out.sh, (int)count));
    }
    return PDP_OK;
}

static unsigned pdp__cu_rows_grid(int64_t rows)
{
    return (unsigned)(rows < 2147483647LL ? rows : 2147483647LL);
}

extern "C" pdp_status pdp_cudak_attention_fwd(int dev, const pdp_cudak_attn *g, const float *qkv,
                                              float *y, float *att, float *work)
{
    pdp__cu_ctx *c;
    pdp_status st;
    int64_t T = g->T, C = g->C, D = g->H > 0 ? g->C / g->H : 1, C3 = 3 * C, TT = T * T;
    int64_t rows = g->B * g->H * T;
    float scale = (float)(1.0 / sqrt((double)D));
    bool dropping = g->p != 0.0f;
    pdp__cu_opnd q = pdp__cu_op(qkv, C3, T * C3, D), k = pdp__cu_op(qkv + C, C3, T * C3, D);
    pdp__cu_opnd v = pdp__cu_op(qkv + 2 * C, C3, T * C3, D), P = pdp__cu_op(att, T, g->H * TT, TT);
    pdp__cu_opnd Pd = pdp__cu_op(dropping ? work : att, T, g->H * TT, TT);
    if ((st = pdp__cu_begin(dev, &c)) != PDP_OK) return st;
    PDP__ARGS(g->H > 0 && C % g->H == 0, "CausalSelfAttention: %lld heads do not divide C = %lld",
              (long long)g->H, (long long)C);
    if (rows <= 0) return PDP_OK;
    /* S = Q K^T / sqrt(D), into att */
    if ((st = pdp__cu_attn_gemm(c, g, false, true, T, T, D, scale, q, k, P)) != PDP_OK) return st;
    pdp__attn_softmax_fwd<<<pdp__cu_rows_grid(rows), PDP__ATT_THREADS, 0, c->stream>>>(
        att, dropping ? work : NULL, *g, pdp__dropout_threshold(g->p), 1.0f / (1.0f - g->p));
    PDP__LAUNCHED(pdp__attn_softmax_fwd);
    /* Y = Pd V, the heads side by side in y's rows */
    return pdp__cu_attn_gemm(c, g, false, false, T, D, T, 1.0f, Pd, v,
                             pdp__cu_op(y, C, T * C, D));
}

extern "C" pdp_status pdp_cudak_attention_bwd(int dev, const pdp_cudak_attn *g, const float *qkv,
                                              const float *att, const float *dy, float *dqkv,
                                              float *work)
{
    pdp__cu_ctx *c;
    pdp_status st;
    int64_t T = g->T, C = g->C, D = g->H > 0 ? g->C / g->H : 1, C3 = 3 * C, TT = T * T;
    int64_t rows = g->B * g->H * T;
    float scale = (float)(1.0 / sqrt((double)D)), keep_scale = 1.0f / (1.0f - g->p);
    uint32_t thr = pdp__dropout_threshold(g->p);
    bool dropping = g->p != 0.0f;
    pdp__cu_opnd q = pdp__cu_op(qkv, C3, T * C3, D), k = pdp__cu_op(qkv + C, C3, T * C3, D);
    pdp__cu_opnd v = pdp__cu_op(qkv + 2 * C, C3, T * C3, D);
    pdp__cu_opnd dq = pdp__cu_op(dqkv, C3, T * C3, D), dk = pdp__cu_op(dqkv + C, C3, T * C3, D);
    pdp__cu_opnd dv = pdp__cu_op(dqkv + 2 * C, C3, T * C3, D), dY = pdp__cu_op(dy, C, T * C, D);
    pdp__cu_opnd W = pdp__cu_op(work, T, g->H * TT, TT);
    if ((st = pdp__cu_begin(dev, &c)) != PDP_OK) return st;
    PDP__ARGS(g->H > 0 && C % g->H == 0, "CausalSelfAttention: %lld heads do not divide C = %lld",
              (long long)g->H, (long long)C);
    if (rows <= 0) return PDP_OK;
    if (dropping) { /* Pd, as the forward had it, into work */
        pdp__attn_dropout_fwd<<<pdp__cu_grid(rows * T), PDP__CU_THREADS, 0, c->stream>>>(
            att, work, *g, thr, keep_scale);
        PDP__LAUNCHED(pdp__attn_dropout_fwd);
    }
    /* dV = Pd^T dY; then dPd = dY V^T over work (the stream runs the dV products first) */
    if ((st = pdp__cu_attn_gemm(c, g, true, false, T, D, T, 1.0f,
                                dropping ? W : pdp__cu_op(att, T, g->H * TT, TT), dY, dv)) !=
            PDP_OK ||
        (st = pdp__cu_attn_gemm(c, g, false, true, T, T, D, 1.0f, dY, v, W)) != PDP_OK)
        return st;
    pdp__attn_softmax_bwd<<<pdp__cu_rows_grid(rows), PDP__ATT_THREADS, 0, c->stream>>>(
        att, work, *g, scale, thr, keep_scale, dropping ? 1 : 0);
    PDP__LAUNCHED(pdp__attn_softmax_bwd);
    /* dQ = dS K / sqrt(D), dK = dS^T Q / sqrt(D) (the scale is in dS) */
    if ((st = pdp__cu_attn_gemm(c, g, false, false, T, D, T, 1.0f, W, k, dq)) != PDP_OK) return st;
    return pdp__cu_attn_gemm(c, g, true, false, T, D, T, 1.0f, W, q, dk);
}

/* ---- GPT: the residual's adds ---- */

static __global__ void pdp__copy2_fwd(const float *src, float *d1, float *d2, int64_t n)
{
    PDP__FOR(i, n) {
        float v = src[i];
        d1[i] = v;
        if (d2) d2[i] = v;
    }
}

extern "C" pdp_status pdp_cudak_sum2(int dev, const float *a, const float *b, float *out,
                                     int64_t count)
{
    pdp__cu_ctx *c;
    pdp_status st;
    if ((st = pdp__cu_begin(dev, &c)) != PDP_OK) return st;
    if (count <= 0) return PDP_OK;
    pdp__zip_fwd<<<pdp__cu_grid_vec(count), PDP__CU_THREADS, 0, c->stream>>>(0, a, b, out, count);
    PDP__LAUNCHED(pdp__zip_fwd);
    return PDP_OK;
}

extern "C" pdp_status pdp_cudak_copy2(int dev, const float *src, float *d1, float *d2,
                                      int64_t count)
{
    pdp__cu_ctx *c;
    pdp_status st;
    if ((st = pdp__cu_begin(dev, &c)) != PDP_OK) return st;
    if (count <= 0) return PDP_OK;
    pdp__copy2_fwd<<<pdp__cu_grid(count), PDP__CU_THREADS, 0, c->stream>>>(src, d1, d2, count);
    PDP__LAUNCHED(pdp__copy2_fwd);
    return PDP_OK;
}

/* ---- losses ----
   Cross-entropy: a block per sample (a thread per sample walked a row of a GPT's
   vocabulary three times alone, its warp's loads a row apart: 185 us a call on an H200
   at 2048 x 256), the CPU's formula: the max in float (the same in any order), exp(z -
   max) summed in double, each thread over its share of the row and then the fixed tree
   of pdp__block_sum (the same bits on every run; the CPU's one serial sum can differ in
   double's last bits), the loss in double; label -1 is an ignored row (loss 0, dlogits 0:
   loss.c's pdp__cross_entropy_rows); the per-sample losses go back to the host, which
   sums them in sample order. MSE: block partial sums in double, summed by the host in
   block order. */

static __global__ void pdp__cross_entropy_fwd(const float *logits, const int32_t *labels,
                                              int64_t batch, int64_t classes, float grad_scale,
                                              double *loss, float *dlogits)
{
    __shared__ double sh[32];
    __shared__ float shf[32];
    for (int64_t i = blockIdx.x; i < batch; i += gridDim.x) {
        const float *z = logits + i * classes;
        float *d = dlogits ? dlogits + i * classes : NULL;
        int32_t label = labels[i];
        float mx = -INFINITY;
        double sum = 0.0, inv;
        if (label == -1) { /* ignored (a GPT's padding): no loss, no gradient */
            if (threadIdx.x == 0) loss[i] = 0.0;
            for (int64_t j = threadIdx.x; d && j < classes; j += blockDim.x) d[j] = 0.0f;
            continue;
        }
        for (int64_t j = threadIdx.x; j < classes; j += blockDim.x) mx = z[j] > mx ? z[j] : mx;
        mx = pdp__block_max(mx, shf);
        for (int64_t j = threadIdx.x; j < classes; j += blockDim.x)
            sum += exp((double)z[j] - (double)mx);
        sum = pdp__block_sum(sum, sh);
        if (threadIdx.x == 0) loss[i] = (double)mx + log(sum) - (double)z[label];
        if (!d) continue;
        inv = 1.0 / sum;
        for (int64_t j = threadIdx.x; j < classes; j += blockDim.x)
            d[j] = (float)(exp((double)z[j] - (double)mx) * inv) * grad_scale;
        __syncthreads(); /* d[label] is written */
        if (threadIdx.x == 0) d[label] -= grad_scale;
    }
}

/* The launchers below run under c->scratch_mu (taken by their public wrapper),
   so that two host threads on one device cannot overwrite each other's labels
   or partial sums between the launch and the copy back. */
static pdp_status pdp__cu_cross_entropy(int dev, pdp__cu_ctx *c, const float *logits,
                                        const int32_t *host_labels, int64_t batch,
                                        int64_t classes, float grad_scale, double *host_loss,
                                        float *dlogits)
{
    pdp_status st;
    void *scratch;
    double *loss;
    int32_t *labels;
    size_t loss_bytes = (size_t)batch * sizeof(double);
    if ((st = pdp__cu_scratch(dev, c, loss_bytes + (size_t)batch * sizeof(int32_t), &scratch)) !=
        PDP_OK)
        return st;
    loss = (double *)scratch;
    labels = (int32_t *)((char *)scratch + loss_bytes);
    PDP__CU(cudaMemcpyAsync(labels, host_labels, (size_t)batch * sizeof(int32_t),
                            cudaMemcpyHostToDevice, c->stream));
    pdp__cross_entropy_fwd<<<batch < 65535LL * 32 ? (unsigned)batch : 65535u * 32,
                             PDP__CU_THREADS, 0, c->stream>>>(logits, labels, batch, classes,
                                                              grad_scale, loss, dlogits);
    PDP__LAUNCHED(pdp__cross_entropy_fwd);
    PDP__CU(cudaMemcpyAsync(host_loss, loss, loss_bytes, cudaMemcpyDeviceToHost, c->stream));
    PDP__CU(cudaStreamSynchronize(c->stream));
    return PDP_OK;
}

extern "C" pdp_status pdp_cudak_cross_entropy(int dev, const float *logits,
                                              const int32_t *host_labels, int64_t batch,
                                              int64_t classes, float grad_scale,
                                              double *host_loss, float *dlogits)
{
    pdp__cu_ctx *c;
    pdp_status st;
    if ((st = pdp__cu_begin(dev, &c)) != PDP_OK) return st;
    if (batch <= 0) return PDP_OK;
    pthread_mutex_lock(&c->scratch_mu);
    st = pdp__cu_cross_entropy(dev, c, logits, host_labels, batch, classes, grad_scale, host_loss,
                               dlogits);
    pthread_mutex_unlock(&c->scratch_mu);
    return st;
}

/* Block partial sums: a fixed grid (a function of the count only) and a fixed
   tree inside each block, summed by the host in block order - the same bits on
   every run. */
#define PDP__SUM_BLOCKS 256

static unsigned pdp__cu_sum_grid(int64_t n)
{
    unsigned blocks = pdp__cu_grid(n);
    return blocks > PDP__SUM_BLOCKS ? PDP__SUM_BLOCKS : blocks;
}

/* Copies the first `blocks` partial sums to the host and adds them in order. */
static pdp_status pdp__cu_sum_partials(pdp__cu_ctx *c, const double *partial_dev,
                                       unsigned blocks, double *host_sum)
{
    double partial[PDP__SUM_BLOCKS], sum = 0.0;
    unsigned i;
    PDP__CU(cudaMemcpyAsync(partial, partial_dev, blocks * sizeof(double), cudaMemcpyDeviceToHost,
                            c->stream));
    PDP__CU(cudaStreamSynchronize(c->stream));
    for (i = 0; i < blocks; i++) sum += partial[i];
    *host_sum = sum;
    return PDP_OK;
}

static __global__ void pdp__mse_fwd(const float *pred, const float *target, int64_t n, float scale,
                                    double *partial, float *dpred)
{
    __shared__ double sh[32];
    double acc = 0.0, total;
    PDP__FOR(i, n) {
        float d = pred[i] - target[i];
        acc += (double)d * (double)d;
        if (dpred) dpred[i] = scale * d;
    }
    total = pdp__block_sum(acc, sh);
    if (threadIdx.x == 0) partial[blockIdx.x] = total;
}

static pdp_status pdp__cu_mse(int dev, pdp__cu_ctx *c, const float *pred, const float *target,
                              int64_t count, float scale, double *host_sum, float *dpred)
{
    pdp_status st;
    void *scratch;
    unsigned blocks = pdp__cu_sum_grid(count);
    if ((st = pdp__cu_scratch(dev, c, PDP__SUM_BLOCKS * sizeof(double), &scratch)) != PDP_OK)
        return st;
    pdp__mse_fwd<<<blocks, PDP__CU_THREADS, 0, c->stream>>>(pred, target, count, scale,
                                                            (double *)scratch, dpred);
    PDP__LAUNCHED(pdp__mse_fwd);
    return pdp__cu_sum_partials(c, (const double *)scratch, blocks, host_sum);
}

extern "C" pdp_status pdp_cudak_mse(int dev, const float *pred, const float *target,
                                    int64_t count, float scale, double *host_sum, float *dpred)
{
    pdp__cu_ctx *c;
    pdp_status st;
    *host_sum = 0.0;
    if ((st = pdp__cu_begin(dev, &c)) != PDP_OK) return st;
    if (count <= 0) return PDP_OK;
    pthread_mutex_lock(&c->scratch_mu);
    st = pdp__cu_mse(dev, c, pred, target, count, scale, host_sum, dpred);
    pthread_mutex_unlock(&c->scratch_mu);
    return st;
}

/* ---- gradient norm and scale (pdp_clip_grad_norm) ----
   The sum of squares in double with the partial-sum scheme above; the host
   takes the square root. The scale is one multiply per element, in float, as
   the CPU does it. */

static __global__ void pdp__sumsq_fwd(const float *x, int64_t n, double *partial)
{
    __shared__ double sh[32];
    double acc = 0.0, total;
    PDP__FOR(i, n) acc += (double)x[i] * (double)x[i];
    total = pdp__block_sum(acc, sh);
    if (threadIdx.x == 0) partial[blockIdx.x] = total;
}

static __global__ void pdp__scale_fwd(float *x, int64_t n, float s)
{
    PDP__FOR_VEC(i, n) {
        float v[PDP__VEC];
        for (int k = 0; k < PDP__VEC; k++)
            if (PDP__LANE(i, k) < n) v[k] = x[PDP__LANE(i, k)];
        for (int k = 0; k < PDP__VEC; k++)
            if (PDP__LANE(i, k) < n) x[PDP__LANE(i, k)] = v[k] * s;
    }
}

static pdp_status pdp__cu_sumsq(int dev, pdp__cu_ctx *c, const float *x, int64_t count,
                                double *host_sum)
{
    pdp_status st;
    void *scratch;
    unsigned blocks = pdp__cu_sum_grid(count);
    if ((st = pdp__cu_scratch(dev, c, PDP__SUM_BLOCKS * sizeof(double), &scratch)) != PDP_OK)
        return st;
    pdp__sumsq_fwd<<<blocks, PDP__CU_THREADS, 0, c->stream>>>(x, count, (double *)scratch);
    PDP__LAUNCHED(pdp__sumsq_fwd);
    return pdp__cu_sum_partials(c, (const double *)scratch, blocks, host_sum);
}

extern "C" pdp_status pdp_cudak_sumsq(int dev, const float *x, int64_t count, double *host_sum)
{
    pdp__cu_ctx *c;
    pdp_status st;
    *host_sum = 0.0;
    if ((st = pdp__cu_begin(dev, &c)) != PDP_OK) return st;
    if (count <= 0) return PDP_OK;
    pthread_mutex_lock(&c->scratch_mu);
    st = pdp__cu_sumsq(dev, c, x, count, host_sum);
    pthread_mutex_unlock(&c->scratch_mu);
    return st;
}

extern "C" pdp_status pdp_cudak_scale(int dev, float *x, int64_t count, float s)
{
    pdp__cu_ctx *c;
    pdp_status st;
    if ((st = pdp__cu_begin(dev, &c)) != PDP_OK) return st;
    if (count <= 0) return PDP_OK;
    pdp__scale_fwd<<<pdp__cu_grid_vec(count), PDP__CU_THREADS, 0, c->stream>>>(x, count, s);
    PDP__LAUNCHED(pdp__scale_fwd);
    return PDP_OK;
}

/* ---- gradient compression: fp32 <-> bf16 / fp16, math.h's conversions ---- */

static __global__ void pdp__to16_fwd(uint16_t *dst, const float *src, int64_t n, float scale,
                                     int bf16)
{
    PDP__FOR(i, n) {
        float v = src[i] * scale;
        dst[i] = bf16 ? pdp__bf16_bits(v) : pdp__f16_bits(v);
    }
}

static __global__ void pdp__from16_fwd(float *dst, const uint16_t *src, int64_t n, int bf16)
{
    PDP__FOR(i, n) dst[i] = bf16 ? pdp__bf16_float(src[i]) : pdp__f16_float(src[i]);
}

extern "C" pdp_status pdp_cudak_to16(int dev, void *dst, const float *src, int64_t count,
                                     float scale, int dtype)
{
    pdp__cu_ctx *c;
    pdp_status st;
    if ((st = pdp__cu_begin(dev, &c)) != PDP_OK) return st;
    if (count <= 0) return PDP_OK;
    pdp__to16_fwd<<<pdp__cu_grid(count), PDP__CU_THREADS, 0, c->stream>>>(
        (uint16_t *)dst, src, count, scale, dtype == 1);
    PDP__LAUNCHED(pdp__to16_fwd);
    return PDP_OK;
}

extern "C" pdp_status pdp_cudak_from16(int dev, float *dst, const void *src, int64_t count,
                                       int dtype)
{
    pdp__cu_ctx *c;
    pdp_status st;
    if ((st = pdp__cu_begin(dev, &c)) != PDP_OK) return st;
    if (count <= 0) return PDP_OK;
    pdp__from16_fwd<<<pdp__cu_grid(count), PDP__CU_THREADS, 0, c->stream>>>(
        dst, (const uint16_t *)src, count, dtype == 1);
    PDP__LAUNCHED(pdp__from16_fwd);
    return PDP_OK;
}

/* ---- optimizers: one fused kernel per update, math.h's element formulas ---- */

static __global__ void pdp__sgd_fwd(float *p, const float *g, float *buf, int64_t n, float lr,
                                    float momentum, float omd, float wd, int nesterov, int first)
{
    PDP__FOR_VEC(i, n) {
        float pk[PDP__VEC], gk[PDP__VEC], bk[PDP__VEC];
        for (int k = 0; k < PDP__VEC; k++)
            if (PDP__LANE(i, k) < n) {
                pk[k] = p[PDP__LANE(i, k)], gk[k] = g[PDP__LANE(i, k)];
                bk[k] = buf ? buf[PDP__LANE(i, k)] : 0.0f;
            }
        for (int k = 0; k < PDP__VEC; k++) {
            if (PDP__LANE(i, k) >= n) continue;
            if (buf) {
                p[PDP__LANE(i, k)] = pdp__sgd_momentum_update(pk[k], gk[k], &bk[k], lr, momentum,
                                                              omd, wd, nesterov, first);
                buf[PDP__LANE(i, k)] = bk[k];
            } else {
                p[PDP__LANE(i, k)] = pdp__sgd_update(pk[k], gk[k], lr, wd);
            }
        }
    }
}

static __global__ void pdp__adam_fwd(float *p, const float *g, float *m, float *v, int64_t n,
                                     float b1, float omb1, float b2, float omb2, float step_size,
                                     float bc2_sqrt, float eps, float l2, float decay)
{
    PDP__FOR_VEC(i, n) {
        float pk[PDP__VEC], gk[PDP__VEC], mk[PDP__VEC], vk[PDP__VEC];
        for (int k = 0; k < PDP__VEC; k++)
            if (PDP__LANE(i, k) < n) {
                pk[k] = p[PDP__LANE(i, k)], gk[k] = g[PDP__LANE(i, k)];
                mk[k] = m[PDP__LANE(i, k)], vk[k] = v[PDP__LANE(i, k)];
            }
        for (int k = 0; k < PDP__VEC; k++) {
            if (PDP__LANE(i, k) >= n) continue;
            p[PDP__LANE(i, k)] = pdp__adam_update(pk[k], gk[k], &mk[k], &vk[k], b1, omb1, b2, omb2,
                                                  step_size, bc2_sqrt, eps, l2, decay);
            m[PDP__LANE(i, k)] = mk[k], v[PDP__LANE(i, k)] = vk[k];
        }
    }
}

extern "C" pdp_status pdp_cudak_sgd(int dev, float *p, const float *g, float *buf, int64_t count,
                                    float lr, float momentum, float one_minus_damp,
                                    float weight_decay, int nesterov, int first)
{
    pdp__cu_ctx *c;
    pdp_status st;
    if ((st = pdp__cu_begin(dev, &c)) != PDP_OK) return st;
    if (count <= 0) return PDP_OK;
    if (momentum == 0.0f) buf = NULL;
    pdp__sgd_fwd<<<pdp__cu_grid_vec(count), PDP__CU_THREADS, 0, c->stream>>>(
        p, g, buf, count, lr, momentum, one_minus_damp, weight_decay, nesterov, first);
    PDP__LAUNCHED(pdp__sgd_fwd);
    return PDP_OK;
}

extern "C" pdp_status pdp_cudak_adam(int dev, float *p, const float *g, float *m, float *v,
                                     int64_t count, float beta1, float one_minus_beta1,
                                     float beta2, float one_minus_beta2, float step_size,
                                     float bc2_sqrt, float eps, float l2, float decay)
{
    pdp__cu_ctx *c;
    pdp_status st;
    if ((st = pdp__cu_begin(dev, &c)) != PDP_OK) return st;
    if (count <= 0) return PDP_OK;
    pdp__adam_fwd<<<pdp__cu_grid_vec(count), PDP__CU_THREADS, 0, c->stream>>>(
        p, g, m, v, count, beta1, one_minus_beta1, beta2, one_minus_beta2, step_size, bc2_sqrt,
        eps, l2, decay);
    PDP__LAUNCHED(pdp__adam_fwd);
    return PDP_OK;
}

/* ---- NCCL ----
   A handle is one rank: its NCCL communicator, its device and a stream of its
   own. A collective waits (on the GPU) for an event recorded on the compute
   stream at launch, so it sees every gradient written so far and overlaps
   whatever the compute stream does afterwards; its completion is recorded
   into a ring of events. Waiting polls the event and ncclCommGetAsyncError
   against a deadline: on an error or timeout the communicator is aborted
   (ncclCommAbort) and every later call fails fast. Process ranks are created
   non-blocking (ncclCommInitRankConfig, blocking = 0) so that even init obeys
   the deadline; every NCCL call is followed by pdp__nccl_settle. */

struct pdp_cudak_nccl {
    ncclComm_t comm;
    int dev;
    int aborted;
    cudaStream_t stream;
    cudaEvent_t ready;
    cudaEvent_t done[PDP_CUDAK_NCCL_SLOTS];
    int nevents;
    int64_t next;
    void *staging;   /* broadcast_bytes */
    size_t staging_bytes;
    int64_t *hdr;    /* point-to-point headers: 3 per event slot */
};

static double pdp__cu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void pdp__cu_nap(void)
{
    struct timespec ts = {0, 50000}; /* 50 us */
    nanosleep(&ts, NULL);
}

static void pdp__nccl_abort(pdp_cudak_nccl *h)
{
    if (h->comm && !h->aborted) ncclCommAbort(h->comm);
    h->aborted = 1;
}

/* Waits while the communicator reports ncclInProgress (non-blocking mode). */
static pdp_status pdp__nccl_settle(pdp_cudak_nccl *h, ncclResult_t r, const char *call, int line,
                                   double timeout_s)
{
    double deadline = pdp__cu_now() + timeout_s;
    if (r != ncclSuccess && r != ncclInProgress) {
        pdp__nccl_abort(h);
        return pdp__cu_nccl_fail(r, call, line);
    }
    for (;;) {
        ncclResult_t a = ncclSuccess;
        ncclResult_t q = ncclCommGetAsyncError(h->comm, &a);
        if (q != ncclSuccess) {
            pdp__nccl_abort(h);
            return pdp__cu_nccl_fail(q, "ncclCommGetAsyncError", __LINE__);
        }
        if (a == ncclSuccess) return PDP_OK;
        if (a != ncclInProgress) {
            pdp__nccl_abort(h);
            return pdp__cu_nccl_fail(a, call, line);
        }
        if (pdp__cu_now() > deadline) {
            pdp__nccl_abort(h);
            return pdp__cu_fail(PDP_ERR_TIMEOUT,
                                "%s did not complete within %g s on CUDA device %d; the NCCL "
                                "communicator was aborted (a rank missing or stuck?)",
                                call, timeout_s, h->dev);
        }
        pdp__cu_nap();
    }
}

#define PDP__NCCL(h, call, timeout)                                                            \
    do {                                                                                       \
        pdp_status pdp__st = pdp__nccl_settle((h), (call), #call, __LINE__, (timeout));        \
        if (pdp__st != PDP_OK) return pdp__st;                                                 \
    } while (0)

extern "C" pdp_status pdp_cudak_nccl_unique_id(int dev, void *id)
{
    pdp__cu_ctx *c;
    pdp_status st;
    ncclUniqueId uid;
    ncclResult_t r;
    if ((st = pdp__cu_begin(dev, &c)) != PDP_OK) return st;
    if ((r = ncclGetUniqueId(&uid)) != ncclSuccess)
        return pdp__cu_nccl_fail(r, "ncclGetUniqueId", __LINE__);
    memcpy(id, &uid, sizeof uid < PDP_CUDAK_NCCL_ID_BYTES ? sizeof uid : PDP_CUDAK_NCCL_ID_BYTES);
    return PDP_OK;
}

/* Stream and events of a new handle (the device is current). */
static pdp_status pdp__nccl_handle_new(int dev, pdp_cudak_nccl **out)
{
    pdp_cudak_nccl *h = (pdp_cudak_nccl *)PDP_MALLOC(sizeof *h);
    *out = NULL;
    if (!h) return pdp__cu_fail(PDP_ERR_OUT_OF_MEMORY, "no host memory for an NCCL handle");
    memset(h, 0, sizeof *h);
    h->dev = dev;
    *out = h;
    PDP__CU(cudaStreamCreateWithFlags(&h->stream, cudaStreamNonBlocking));
    PDP__CU(cudaEventCreateWithFlags(&h->ready, cudaEventDisableTiming));
    for (; h->nevents < PDP_CUDAK_NCCL_SLOTS; h->nevents++)
        PDP__CU(cudaEventCreateWithFlags(&h->done[h->nevents], cudaEventDisableTiming));
    return pdp_cudak_malloc(dev, 3 * sizeof(int64_t) * PDP_CUDAK_NCCL_SLOTS, (void **)&h->hdr);
}

extern "C" void pdp_cudak_nccl_free(pdp_cudak_nccl *h, int abort)
{
    int i;
    if (!h) return;
    cudaSetDevice(h->dev);
    if (h->comm) {
        if (abort || h->aborted) {
            pdp__nccl_abort(h);
        } else {
            cudaStreamSynchronize(h->stream);
            if (pdp__nccl_settle(h, ncclCommFinalize(h->comm), "ncclCommFinalize", __LINE__,
                                 30.0) == PDP_OK)
                ncclCommDestroy(h->comm);
        }
    }
    if (h->stream) cudaStreamDestroy(h->stream);
    if (h->ready) cudaEventDestroy(h->ready);
    for (i = 0; i < h->nevents; i++) cudaEventDestroy(h->done[i]);
    pdp_cudak_free(h->dev, h->staging);
    pdp_cudak_free(h->dev, h->hdr);
    PDP_FREE(h);
}

extern "C" pdp_status pdp_cudak_nccl_init_rank(pdp_cudak_nccl **out, int dev, int nranks,
                                               int rank, const void *id, double timeout_s)
{
    pdp__cu_ctx *c;
    pdp_cudak_nccl *h;
    ncclUniqueId uid;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    pdp_status st;
    *out = NULL;
    if ((st = pdp__cu_begin(dev, &c)) != PDP_OK) return st;
    if ((st = pdp__nccl_handle_new(dev, &h)) != PDP_OK) {
        pdp_cudak_nccl_free(h, 0);
        return st;
    }
    memcpy(&uid, id, sizeof uid < PDP_CUDAK_NCCL_ID_BYTES ? sizeof uid : PDP_CUDAK_NCCL_ID_BYTES);
    cfg.blocking = 0;
    {
        ncclResult_t r = ncclCommInitRankConfig(&h->comm, nranks, uid, rank, &cfg);
        if (r != ncclSuccess && r != ncclInProgress) {
            h->comm = NULL;
            pdp_cudak_nccl_free(h, 1);
            return pdp__cu_nccl_fail(r, "ncclCommInitRankConfig", __LINE__);
        }
        if ((st = pdp__nccl_settle(h, r, "ncclCommInitRankConfig", __LINE__, timeout_s)) != PDP_OK) {
            char msg[sizeof pdp__cu_msg];
            memcpy(msg, pdp__cu_msg, sizeof msg);
            pdp_cudak_nccl_free(h, 1);
            return pdp__cu_fail(st, "%s (rank %d of %d)", msg, rank, nranks);
        }
    }
    *out = h;
    return PDP_OK;
}

/* ncclCommInitAll's work, but non-blocking (ncclCommInitRankConfig with blocking = 0
   for every device, in one group), so that every later call on a thread rank - the
   connection a first message between two ranks makes inside ncclGroupEnd included -
   obeys the communicator's deadline as process ranks do. */
extern "C" pdp_status pdp_cudak_nccl_init_all(pdp_cudak_nccl **out, int ndev, const int *devs)
{
    ncclComm_t comms[PDP__CU_MAX_DEVICES];
    ncclUniqueId uid;
    ncclResult_t r, g;
    pdp_status st;
    int i, j;
    for (i = 0; i < ndev; i++) out[i] = NULL;
    if (ndev < 1 || ndev > PDP__CU_MAX_DEVICES)
        return pdp__cu_fail(PDP_ERR_INVALID, "ndev %d outside 1..%d", ndev, PDP__CU_MAX_DEVICES);
    for (i = 0; i < ndev; i++) {
        pdp__cu_ctx *c;
        comms[i] = NULL;
        if ((st = pdp__cu_begin(devs[i], &c)) != PDP_OK) return st;
        for (j = 0; j < i; j++)
            if (devs[j] == devs[i])
                return pdp__cu_fail(PDP_ERR_INVALID, "ncclCommInitAll: CUDA device %d twice",
                                    devs[i]);
    }
    if ((r = ncclGetUniqueId(&uid)) != ncclSuccess)
        return pdp__cu_nccl_fail(r, "ncclGetUniqueId", __LINE__);
    for (i = 0; i < ndev; i++) {
        cudaSetDevice(devs[i]);
        if ((st = pdp__nccl_handle_new(devs[i], &out[i])) != PDP_OK) {
            for (j = 0; j <= i; j++) pdp_cudak_nccl_free(out[j], 1), out[j] = NULL;
            return st;
        }
    }
    r = ncclGroupStart();
    for (i = 0; i < ndev && (r == ncclSuccess || r == ncclInProgress); i++) {
        ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
        cfg.blocking = 0;
        cudaSetDevice(devs[i]);
        r = ncclCommInitRankConfig(&comms[i], ndev, uid, i, &cfg);
    }
    g = ncclGroupEnd();
    if (r == ncclSuccess || r == ncclInProgress) r = g;
    st = PDP_OK;
    for (i = 0; i < ndev; i++) {
        out[i]->comm = comms[i];
        cudaSetDevice(devs[i]);
        if (st == PDP_OK && (r != ncclSuccess && r != ncclInProgress))
            st = pdp__cu_nccl_fail(r, "ncclCommInitRankConfig", __LINE__);
        if (st == PDP_OK) /* the ranks initialise together: settling the first settles all */
            st = pdp__nccl_settle(out[i], ncclSuccess, "ncclCommInitRankConfig", __LINE__, 60.0);
    }
    if (st != PDP_OK) {
        char msg[sizeof pdp__cu_msg];
        memcpy(msg, pdp__cu_msg, sizeof msg);
        for (i = 0; i < ndev; i++) pdp_cudak_nccl_free(out[i], 1), out[i] = NULL;
        return pdp__cu_fail(st, "%s (ncclCommInitAll of %d devices)", msg, ndev);
    }
    return PDP_OK;
}

/* Enqueues one collective after the compute stream's work so far. */
static pdp_status pdp__nccl_enqueue(pdp_cudak_nccl *h, pdp_cudak_coll kind, const void *send,
                                    void *recv, size_t count, ncclDataType_t type, int op)
{
    pdp__cu_ctx *c;
    pdp_status st;
    ncclRedOp_t red = op == 1 ? ncclAvg : ncclSum;
    if (h->aborted)
        return pdp__cu_fail(PDP_ERR_COMM, "the NCCL communicator on CUDA device %d was aborted "
                            "after an earlier failure", h->dev);
    if ((st = pdp__cu_begin(h->dev, &c)) != PDP_OK) return st;
    PDP__CU(cudaEventRecord(h->ready, c->stream));
    PDP__CU(cudaStreamWaitEvent(h->stream, h->ready, 0));
    switch (kind) {
    case PDP_CUDAK_ALLREDUCE:
        PDP__NCCL(h, ncclAllReduce(send, recv, count, type, red, h->comm, h->stream), 60.0);
        break;
    case PDP_CUDAK_BROADCAST:
        PDP__NCCL(h, ncclBroadcast(send, recv, count, type, op, h->comm, h->stream), 60.0);
        break;
    case PDP_CUDAK_REDUCE_SCATTER:
        PDP__NCCL(h, ncclReduceScatter(send, recv, count, type, red, h->comm, h->stream), 60.0);
        break;
    case PDP_CUDAK_ALLGATHER:
        PDP__NCCL(h, ncclAllGather(send, recv, count, type, h->comm, h->stream), 60.0);
        break;
    }
    return PDP_OK;
}

extern "C" pdp_status pdp_cudak_nccl_launch(pdp_cudak_nccl *h, pdp_cudak_coll kind,
                                            const void *send, void *recv, int64_t count, int op,
                                            int dtype, int *slot)
{
    /* pdp_dtype: F32, BF16, F16 (NCCL reduces the 16-bit types natively) */
    ncclDataType_t type = dtype == 1 ? ncclBfloat16 : dtype == 2 ? ncclFloat16 : ncclFloat32;
    pdp_status st;
    int s;
    *slot = -1;
    if ((st = pdp__nccl_enqueue(h, kind, send, recv, (size_t)count, type, op)) != PDP_OK)
        return st;
    s = (int)(h->next++ % PDP_CUDAK_NCCL_SLOTS);
    PDP__CU(cudaEventRecord(h->done[s], h->stream));
    *slot = s;
    return PDP_OK;
}

extern "C" int pdp_cudak_nccl_query(pdp_cudak_nccl *h, int slot)
{
    cudaError_t e;
    if (h->aborted || slot < 0) return -1;
    e = cudaEventQuery(h->done[slot]);
    if (e == cudaSuccess) return 1;
    if (e == cudaErrorNotReady) return 0;
    return -1;
}

extern "C" pdp_status pdp_cudak_nccl_wait(pdp_cudak_nccl *h, int slot, double timeout_s)
{
    double deadline = pdp__cu_now() + timeout_s;
    pdp__cu_ctx *c;
    pdp_status st;
    if (h->aborted)
        return pdp__cu_fail(PDP_ERR_COMM, "the NCCL communicator on CUDA device %d was aborted "
                            "after an earlier failure", h->dev);
    if (slot < 0 || slot >= PDP_CUDAK_NCCL_SLOTS)
        return pdp__cu_fail(PDP_ERR_INVALID, "bad NCCL slot %d", slot);
    if ((st = pdp__cu_begin(h->dev, &c)) != PDP_OK) return st;
    for (;;) {
        ncclResult_t a = ncclSuccess;
        cudaError_t e = cudaEventQuery(h->done[slot]);
        if (e == cudaSuccess) break;
        if (e != cudaErrorNotReady) {
            pdp__nccl_abort(h);
            return pdp__cu_cuda_fail(e, "cudaEventQuery", __LINE__);
        }
        if (ncclCommGetAsyncError(h->comm, &a) != ncclSuccess ||
            (a != ncclSuccess && a != ncclInProgress)) {
            pdp__nccl_abort(h);
            return pdp__cu_nccl_fail(a, "ncclCommGetAsyncError", __LINE__);
        }
        if (pdp__cu_now() > deadline) {
            pdp__nccl_abort(h);
            return pdp__cu_fail(PDP_ERR_TIMEOUT,
                                "the NCCL collective did not complete within %g s on CUDA device "
                                "%d; ncclCommAbort called (a rank missing or stuck?)",
                                timeout_s, h->dev);
        }
        pdp__cu_nap();
    }
    /* later compute (the optimizer) runs after the collective */
    PDP__CU(cudaStreamWaitEvent(c->stream, h->done[slot], 0));
    return PDP_OK;
}

extern "C" pdp_status pdp_cudak_nccl_broadcast_bytes(pdp_cudak_nccl *h, void *host, size_t bytes,
                                                     int root, double timeout_s)
{
    pdp__cu_ctx *c;
    pdp_status st;
    int s;
    if (!bytes) return PDP_OK;
    if ((st = pdp__cu_begin(h->dev, &c)) != PDP_OK) return st;
    if (h->staging_bytes < bytes) {
        void *p;
        if ((st = pdp_cudak_malloc(h->dev, bytes, &p)) != PDP_OK) return st;
        pdp_cudak_free(h->dev, h->staging);
        h->staging = p;
        h->staging_bytes = bytes;
    }
    PDP__CU(cudaMemcpyAsync(h->staging, host, bytes, cudaMemcpyHostToDevice, c->stream));
    if ((st = pdp__nccl_enqueue(h, PDP_CUDAK_BROADCAST, h->staging, h->staging, bytes, ncclUint8,
                                root)) != PDP_OK)
        return st;
    s = (int)(h->next++ % PDP_CUDAK_NCCL_SLOTS);
    PDP__CU(cudaEventRecord(h->done[s], h->stream));
    if ((st = pdp_cudak_nccl_wait(h, s, timeout_s)) != PDP_OK) return st;
    PDP__CU(cudaMemcpyAsync(host, h->staging, bytes, cudaMemcpyDeviceToHost, c->stream));
    PDP__CU(cudaStreamSynchronize(c->stream));
    return PDP_OK;
}

/* ---- NCCL: point-to-point and split ----
   pdp_cudak_nccl_p2p enqueues a batch in one group: comm_nccl.c collects a rank's
   sends and receives until something needs them on the stream (a wait, a done
   query, a collective), so that every rank's batch holds both halves of a ring
   and no send waits behind its own rank's receive. Each message is preceded by a
   header {magic, tag, count} (NCCL has no tags; the receiver checks both): the
   sender writes it with a one-thread kernel on the compute stream, the receiver
   clears its slot there, before the ready event the NCCL stream waits on. */

#define PDP__P2P_MAGIC 0x7064705f6d736721LL

static __global__ void pdp__p2p_header_fwd(int64_t *hdr, int64_t tag, int64_t count)
{
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        hdr[0] = PDP__P2P_MAGIC;
        hdr[1] = tag;
        hdr[2] = count;
    }
}

extern "C" pdp_status pdp_cudak_nccl_p2p(pdp_cudak_nccl *h, pdp_cudak_p2p *ops, int n,
                                         double timeout_s)
{
    pdp__cu_ctx *c;
    pdp_status st;
    ncclResult_t r = ncclSuccess, g;
    int i;
    for (i = 0; i < n; i++) ops[i].slot = -1;
    if (h->aborted)
        return pdp__cu_fail(PDP_ERR_COMM, "the NCCL communicator on CUDA device %d was aborted "
                            "after an earlier failure", h->dev);
    if ((st = pdp__cu_begin(h->dev, &c)) != PDP_OK) return st;
    for (i = 0; i < n; i++) {
        int64_t *hd = h->hdr + 3 * ((h->next + i) % PDP_CUDAK_NCCL_SLOTS);
        if (ops[i].is_send) {
            pdp__p2p_header_fwd<<<1, 1, 0, c->stream>>>(hd, ops[i].tag, ops[i].count);
            PDP__LAUNCHED(pdp__p2p_header_fwd);
        } else {
            PDP__CU(cudaMemsetAsync(hd, 0, 3 * sizeof *hd, c->stream));
        }
    }
    PDP__CU(cudaEventRecord(h->ready, c->stream));
    PDP__CU(cudaStreamWaitEvent(h->stream, h->ready, 0));
    if ((r = ncclGroupStart()) != ncclSuccess) return pdp__cu_nccl_fail(r, "ncclGroupStart", __LINE__);
    for (i = 0; i < n && (r == ncclSuccess || r == ncclInProgress); i++) {
        int64_t *hd = h->hdr + 3 * ((h->next + i) % PDP_CUDAK_NCCL_SLOTS);
        size_t cnt = (size_t)ops[i].count;
        if (ops[i].is_send) {
            r = ncclSend(hd, 3, ncclInt64, ops[i].peer, h->comm, h->stream);
            if (cnt && (r == ncclSuccess || r == ncclInProgress))
                r = ncclSend(ops[i].buf, cnt, ncclFloat32, ops[i].peer, h->comm, h->stream);
        } else {
            r = ncclRecv(hd, 3, ncclInt64, ops[i].peer, h->comm, h->stream);
            if (cnt && (r == ncclSuccess || r == ncclInProgress))
                r = ncclRecv(ops[i].buf, cnt, ncclFloat32, ops[i].peer, h->comm, h->stream);
        }
    }
    g = ncclGroupEnd();
    if (r != ncclSuccess && r != ncclInProgress) {
        pdp__nccl_abort(h);
        return pdp__cu_nccl_fail(r, ops[i - 1].is_send ? "ncclSend" : "ncclRecv", __LINE__);
    }
    /* non-blocking: a first message between two ranks connects them in here */
    PDP__NCCL(h, g, timeout_s);
    for (i = 0; i < n; i++) {
        int s = (int)(h->next++ % PDP_CUDAK_NCCL_SLOTS);
        PDP__CU(cudaEventRecord(h->done[s], h->stream));
        ops[i].slot = s;
    }
    return PDP_OK;
}

extern "C" pdp_status pdp_cudak_nccl_p2p_header(pdp_cudak_nccl *h, int slot, int *arrived,
                                                int64_t *tag, int64_t *count)
{
    int64_t hd[3];
    pdp_status st;
    *arrived = 0;
    if (slot < 0 || slot >= PDP_CUDAK_NCCL_SLOTS)
        return pdp__cu_fail(PDP_ERR_INVALID, "bad NCCL slot %d", slot);
    if ((st = pdp_cudak_memcpy(-1, hd, h->dev, h->hdr + 3 * slot, sizeof hd)) != PDP_OK)
        return st;
    if (hd[0] != PDP__P2P_MAGIC) return PDP_OK;
    *arrived = 1;
    *tag = hd[1];
    *count = hd[2];
    return PDP_OK;
}

extern "C" pdp_status pdp_cudak_nccl_split(pdp_cudak_nccl *h, int colour, int key,
                                           pdp_cudak_nccl **out, double timeout_s)
{
#if defined(NCCL_VERSION_CODE) && NCCL_VERSION_CODE >= 21800
    pdp__cu_ctx *c;
    pdp_cudak_nccl *nh = NULL;
    ncclComm_t nc = NULL;
    ncclResult_t r;
    pdp_status st;
    *out = NULL;
    if (h->aborted)
        return pdp__cu_fail(PDP_ERR_COMM, "the NCCL communicator on CUDA device %d was aborted "
                            "after an earlier failure", h->dev);
    if ((st = pdp__cu_begin(h->dev, &c)) != PDP_OK) return st;
    if (colour >= 0 && (st = pdp__nccl_handle_new(h->dev, &nh)) != PDP_OK) {
        pdp_cudak_nccl_free(nh, 0);
        return st;
    }
    /* config NULL: the new communicator inherits h's (non-blocking) */
    r = ncclCommSplit(h->comm, colour >= 0 ? colour : NCCL_SPLIT_NOCOLOR, key, &nc, NULL);
    if ((st = pdp__nccl_settle(h, r, "ncclCommSplit", __LINE__, timeout_s)) != PDP_OK) {
        if (nh) nh->comm = nc;
        pdp_cudak_nccl_free(nh, 1);
        return st;
    }
    if (!nh) {
        if (nc) ncclCommDestroy(nc);
        return PDP_OK;
    }
    nh->comm = nc;
    if (!nc || (st = pdp__nccl_settle(nh, ncclSuccess, "ncclCommSplit", __LINE__, timeout_s)) !=
                   PDP_OK) {
        if (!nc) st = pdp__cu_fail(PDP_ERR_COMM, "ncclCommSplit gave no communicator for colour "
                                   "%d", colour);
        pdp_cudak_nccl_free(nh, 1);
        return st;
    }
    *out = nh;
    return PDP_OK;
#else
    (void)h, (void)colour, (void)key, (void)timeout_s;
    *out = NULL;
    return pdp__cu_fail(PDP_ERR_UNSUPPORTED, "ncclCommSplit needs NCCL 2.18 or later (pdp_cuda.cu "
                        "was compiled against an older nccl.h)");
#endif
}
