/* cuda_runtime.h (cuda_emu): the part of the CUDA runtime that pdp_cuda.cu uses,
   for running it on the host with g++. See tests/cuda_emu/cuda_emu.cc. Enum values
   are the real ones, so messages read as on a GPU. Device code is plain host code:
   the qualifiers vanish, __shared__ is per host thread (static thread_local) and
   shared by the coroutines that play one block's threads, and a launch
   `k<<<g, b, smem, s>>>(args)` (rewritten by rewrite.py to PDP_EMU_LAUNCH(k, g, b,
   smem, s)(args)) runs every block to completion before it returns. */
#ifndef PDP_CUDA_EMU_RUNTIME_H
#define PDP_CUDA_EMU_RUNTIME_H

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <tuple>
#include <type_traits>
#include <utility>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static thread_local

enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidMemcpyDirection = 21,
    cudaErrorInsufficientDriver = 35,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600,
    cudaErrorIllegalAddress = 700,
    cudaErrorLaunchTimeout = 702,
    cudaErrorLaunchFailure = 719
};
typedef enum cudaError cudaError_t;

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4
};

typedef struct pdp_emu_stream *cudaStream_t;
typedef struct pdp_emu_event *cudaEvent_t;
#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01
#define cudaEventDefault 0x00
#define cudaEventDisableTiming 0x02

struct uint3 {
    unsigned x, y, z;
};
struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
};

/* set by the block scheduler before it resumes a thread */
extern thread_local uint3 threadIdx, blockIdx;
extern thread_local dim3 blockDim, gridDim;

cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetLastError(void);
const char *cudaGetErrorName(cudaError_t e);
const char *cudaGetErrorString(cudaError_t e);
cudaError_t cudaMalloc(void **ptr, size_t bytes);
cudaError_t cudaFree(void *ptr);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream = 0);
cudaError_t cudaMemcpyPeerAsync(void *dst, int dst_dev, const void *src, int src_dev,
                                size_t bytes, cudaStream_t stream = 0);
cudaError_t cudaMemsetAsync(void *ptr, int value, size_t bytes, cudaStream_t stream = 0);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned flags = 0);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = 0);
cudaError_t cudaEventQuery(cudaEvent_t event);

/* ---- device functions: a barrier and a warp shuffle, both switch coroutines ---- */
void __syncthreads(void);
void pdp_emu_shfl_down(unsigned mask, const void *mine, void *out, size_t bytes, unsigned delta,
                       int width);
template <typename T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32)
{
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffle of T");
    T out;
    pdp_emu_shfl_down(mask, &v, &out, sizeof v, delta, width);
    return out;
}

/* ---- launches ---- */
namespace pdp_emu {
/* Validates the configuration, the stream and the pointer arguments (each must be NULL
   or inside a live allocation of the launching device), then runs body(ctx) once per
   thread of every block. Failures become cudaGetLastError's result. */
void launch(const char *kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
            int nptr, const void *const *ptrs, const int *arg_index, void (*body)(void *),
            void *ctx);

template <typename T> void collect(const T &, const void **, int *, int &, int) {}
template <typename T> void collect(T *const &p, const void **ptrs, int *idx, int &n, int arg)
{
    ptrs[n] = (const void *)p;
    idx[n++] = arg;
}

template <typename... P> struct Launcher {
    const char *name;
    void (*fn)(P...);
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;
    template <typename... A> void operator()(A &&...a) const
    {
        static_assert(sizeof...(A) == sizeof...(P), "kernel argument count");
        std::tuple<typename std::decay<P>::type...> args(std::forward<A>(a)...);
        const void *ptrs[sizeof...(P) + 1];
        int idx[sizeof...(P) + 1], n = 0, arg = 0;
        std::apply([&](const auto &...v) { (collect(v, ptrs, idx, n, arg++), ...); }, args);
        auto run = [&]() { std::apply(fn, args); };
        launch(name, grid, block, smem, stream, n, ptrs, idx,
               [](void *c) { (*static_cast<decltype(run) *>(c))(); }, &run);
    }
};

template <typename... P>
Launcher<P...> launcher(const char *name, void (*fn)(P...), dim3 grid, dim3 block,
                        size_t smem = 0, cudaStream_t stream = 0)
{
    return Launcher<P...>{name, fn, grid, block, smem, stream};
}
} /* namespace pdp_emu */

#define PDP_EMU_LAUNCH(kernel, ...) pdp_emu::launcher(#kernel, kernel, __VA_ARGS__)

#endif
