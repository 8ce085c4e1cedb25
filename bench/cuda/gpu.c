/* bench/cuda/gpu.c: pdp on one GPU, each figure beside a peer measured in the same run.

     GEMM         a Linear layer's forward (cuBLAS through pdp, bias included) beside a bare
                  cublasSgemm of the same shape (cuBLAS's own best for FP32), TF32 off and on
     elementwise  ReLU forward and the fused Adam update, in GB/s, beside a device-to-device
                  copy (the bandwidth ceiling for streaming kernels)
     cross-entropy  a GPT's loss over GPT-2's vocabulary (2048 positions x 50257 logits: the
                  loss and its gradient), in GB/s counting each logit read once and each
                  gradient written once, beside the same copy
     training     MLP and CNN samples/s (forward, cross-entropy, backward, Adam step)

   Build: make cuda (build/cuda/bench_gpu); run on a GPU machine: ./build/cuda/bench_gpu
   [--quick]. Not built by `make bench` (it needs nvcc). tests/gpu/run.sh runs it.
   --smoke runs every path once at toy sizes (make emu-cuda-test does, on the CPU emulation
   of CUDA, so this program is known to run before it meets a GPU). */

#define PDP_IMPLEMENTATION
#include "pdp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define CHECK(call)                                                                      \
    do {                                                                                 \
        pdp_status st_ = (call);                                                         \
        if (st_ != PDP_OK) {                                                             \
            fprintf(stderr, "bench_gpu: %s failed: %s: %s\n", #call, pdp_status_name(st_), \
                    pdp_last_error());                                                   \
            return 1;                                                                    \
        }                                                                                \
    } while (0)
#define CHECKK(call)                                                                     \
    do {                                                                                 \
        pdp_status st_ = (call);                                                         \
        if (st_ != PDP_OK) {                                                             \
            fprintf(stderr, "bench_gpu: %s failed: %s\n", #call, pdp_cudak_error());      \
            return 1;                                                                    \
        }                                                                                \
    } while (0)

static const pdp_device dev0 = {PDP_DEVICE_CUDA, 0};

static int bench_gemm(int64_t n, int reps)
{
    pdp_model_desc md;
    pdp_model *m = NULL;
    pdp_tensor *x = NULL;
    const pdp_tensor *y;
    int64_t shape[2] = {n, n};
    float *c = NULL;
    double t, ours, peer, flops = 2.0 * (double)n * (double)n * (double)n;
    pdp_tensor wt, gt;
    int i, tf32;
    memset(&md, 0, sizeof md);
    md.input_shape[0] = n;
    md.device = dev0;
    CHECK(pdp_model_create(&m, &md));
    CHECK(pdp_model_add_linear(m, n));
    CHECK(pdp_tensor_create(&x, dev0, 2, shape));
    CHECK(pdp_tensor_fill(x, 0.5f));
    CHECKK(pdp_cudak_malloc(0, (size_t)(n * n) * sizeof(float), (void **)&c));
    pdp_model_flat(m, &wt, &gt);
    pdp_model_set_training(m, false);
    for (tf32 = 0; tf32 < 2; tf32++) {
        CHECK(pdp_cuda_set_tf32(tf32 != 0));
        CHECK(pdp_model_forward(m, x, &y)); /* warm-up */
        CHECKK(pdp_cudak_gemm(0, x->data, wt.data, c, n, n, n));
        CHECK(pdp_cuda_synchronize(dev0));
        t = now();
        for (i = 0; i < reps; i++) CHECK(pdp_model_forward(m, x, &y));
        CHECK(pdp_cuda_synchronize(dev0));
        ours = flops * reps / (now() - t) / 1e12;
        t = now();
        for (i = 0; i < reps; i++) CHECKK(pdp_cudak_gemm(0, x->data, wt.data, c, n, n, n));
        CHECK(pdp_cuda_synchronize(dev0));
        peer = flops * reps / (now() - t) / 1e12;
        printf("| GEMM %lld^3 %-5s | pdp Linear forward %8.2f TFLOP/s | cublasSgemm %8.2f TFLOP/s | "
               "ratio %.2f |\n", (long long)n, tf32 ? "TF32" : "FP32", ours, peer, ours / peer);
    }
    CHECK(pdp_cuda_set_tf32(false));
    pdp_cudak_free(0, c);
    pdp_tensor_free(x);
    pdp_model_free(m);
    return 0;
}

static int bench_elementwise(int64_t n, int reps)
{
    float *a, *b, *g, *mm, *v;
    size_t bytes = (size_t)n * sizeof(float);
    double t, relu, copy, adam;
    int i;
    CHECKK(pdp_cudak_malloc(0, bytes, (void **)&a));
    CHECKK(pdp_cudak_malloc(0, bytes, (void **)&b));
    CHECKK(pdp_cudak_malloc(0, bytes, (void **)&g));
    CHECKK(pdp_cudak_malloc(0, bytes, (void **)&mm));
    CHECKK(pdp_cudak_malloc(0, bytes, (void **)&v));
    CHECKK(pdp_cudak_fill(0, a, n, 0.25f));
    CHECKK(pdp_cudak_fill(0, g, n, 0.01f));
    CHECKK(pdp_cudak_memset0(0, mm, bytes));
    CHECKK(pdp_cudak_memset0(0, v, bytes));
    CHECKK(pdp_cudak_act_fwd(0, PDP_CUDAK_RELU, a, b, n));
    CHECKK(pdp_cudak_memcpy(0, b, 0, a, bytes));
    CHECK(pdp_cuda_synchronize(dev0));
    t = now();
    for (i = 0; i < reps; i++) CHECKK(pdp_cudak_act_fwd(0, PDP_CUDAK_RELU, a, b, n));
    CHECK(pdp_cuda_synchronize(dev0));
    relu = 2.0 * (double)bytes * reps / (now() - t) / 1e9;
    t = now();
    for (i = 0; i < reps; i++) CHECKK(pdp_cudak_memcpy(0, b, 0, a, bytes));
    CHECK(pdp_cuda_synchronize(dev0));
    copy = 2.0 * (double)bytes * reps / (now() - t) / 1e9;
    t = now();
    for (i = 0; i < reps; i++)
        CHECKK(pdp_cudak_adam(0, a, g, mm, v, n, 0.9f, 0.1f, 0.999f, 0.001f, 1e-3f, 1.0f, 1e-8f,
                              0.0f, 1.0f));
    CHECK(pdp_cuda_synchronize(dev0));
    adam = 7.0 * (double)bytes * reps / (now() - t) / 1e9; /* p g m v read, p m v written */
    printf("| elementwise %lldM floats | ReLU forward %7.0f GB/s | D2D copy %7.0f GB/s | ratio %.2f |\n",
           (long long)(n >> 20), relu, copy, relu / copy);
    printf("| fused Adam %lldM floats | %7.0f GB/s | D2D copy %7.0f GB/s | ratio %.2f |\n",
           (long long)(n >> 20), adam, copy, adam / copy);
    pdp_cudak_free(0, a);
    pdp_cudak_free(0, b);
    pdp_cudak_free(0, g);
    pdp_cudak_free(0, mm);
    pdp_cudak_free(0, v);
    return 0;
}

static int bench_training(int cnn, int64_t batch, int steps)
{
    pdp_model_desc md;
    pdp_model *m = NULL;
    pdp_optim *o = NULL;
    pdp_optim_desc od;
    pdp_tensor *x = NULL;
    int32_t *labels = (int32_t *)malloc((size_t)batch * sizeof(int32_t));
    int64_t shape[4] = {batch, 1, 28, 28}, i;
    float loss;
    double t;
    if (!labels) return 1;
    memset(&md, 0, sizeof md);
    md.device = dev0;
    md.seed = 1;
    md.input_ndim = cnn ? 3 : 1;
    md.input_shape[0] = cnn ? 1 : 784;
    md.input_shape[1] = cnn ? 28 : 0;
    md.input_shape[2] = cnn ? 28 : 0;
    CHECK(pdp_model_create(&m, &md));
    if (cnn) {
        CHECK(pdp_model_add_conv2d(m, 32, 3, 1, 1));
        CHECK(pdp_model_add_relu(m));
        CHECK(pdp_model_add_maxpool2d(m, 2, 2));
        CHECK(pdp_model_add_conv2d(m, 64, 3, 1, 1));
        CHECK(pdp_model_add_relu(m));
        CHECK(pdp_model_add_maxpool2d(m, 2, 2));
        CHECK(pdp_model_add_flatten(m));
        CHECK(pdp_model_add_linear(m, 10));
    } else {
        CHECK(pdp_model_add_linear(m, 1024));
        CHECK(pdp_model_add_relu(m));
        CHECK(pdp_model_add_linear(m, 1024));
        CHECK(pdp_model_add_relu(m));
        CHECK(pdp_model_add_linear(m, 10));
        shape[1] = 784;
    }
    memset(&od, 0, sizeof od);
    od.kind = PDP_OPTIM_ADAM;
    CHECK(pdp_optim_create(&o, m, &od));
    CHECK(pdp_tensor_create(&x, dev0, cnn ? 4 : 2, shape));
    CHECK(pdp_tensor_fill(x, 0.1f));
    for (i = 0; i < batch; i++) labels[i] = (int32_t)(i % 10);
    CHECK(pdp_model_forward_backward(m, x, labels, &loss));
    CHECK(pdp_optim_step(o));
    CHECK(pdp_cuda_synchronize(dev0));
    t = now();
    for (i = 0; i < steps; i++) {
        pdp_optim_zero_grad(o);
        CHECK(pdp_model_forward_backward(m, x, labels, &loss));
        CHECK(pdp_optim_step(o));
    }
    CHECK(pdp_cuda_synchronize(dev0));
    t = now() - t;
    printf("| %s batch %lld | %10.0f samples/s | %.3f ms/step |\n",
           cnn ? "CNN conv32-pool-conv64-pool-fc10" : "MLP 784-1024-1024-10", (long long)batch,
           (double)(batch * steps) / t, 1e3 * t / steps);
    pdp_tensor_free(x);
    pdp_optim_free(o);
    pdp_model_free(m);
    free(labels);
    return 0;
}

static int bench_cross_entropy(int64_t rows, int64_t vocab, int reps)
{
    size_t bytes = (size_t)(rows * vocab) * sizeof(float);
    float *host = malloc(bytes), *z, *dz;
    int32_t *labels = malloc((size_t)rows * sizeof *labels);
    double *loss = malloc((size_t)rows * sizeof *loss), t, ours, copy;
    uint64_t r = 88172645463325252ull;
    int64_t i;
    int k;
    if (!host || !labels || !loss) return fprintf(stderr, "bench_gpu: out of memory\n"), 1;
    for (i = 0; i < rows * vocab; i++) { /* logits in [-4, 4): xorshift */
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        host[i] = (float)(r >> 40) / (float)(1 << 24) * 8.0f - 4.0f;
    }
    for (i = 0; i < rows; i++) labels[i] = (int32_t)((uint64_t)i * 7919 % (uint64_t)vocab);
    CHECKK(pdp_cudak_malloc(0, bytes, (void **)&z));
    CHECKK(pdp_cudak_malloc(0, bytes, (void **)&dz));
    CHECKK(pdp_cudak_memcpy(0, z, -1, host, bytes));
    CHECKK(pdp_cudak_cross_entropy(0, z, labels, rows, vocab, 1.0f / (float)rows, loss, dz));
    t = now();
    for (k = 0; k < reps; k++) /* each call waits for its losses on the host */
        CHECKK(pdp_cudak_cross_entropy(0, z, labels, rows, vocab, 1.0f / (float)rows, loss, dz));
    ours = now() - t;
    t = now();
    for (k = 0; k < reps; k++) CHECKK(pdp_cudak_memcpy(0, dz, 0, z, bytes));
    CHECK(pdp_cuda_synchronize(dev0));
    copy = now() - t;
    printf("| cross-entropy %lld x %lld | %.3f ms | %7.0f GB/s | D2D copy %7.0f GB/s | "
           "ratio %.2f |\n", (long long)rows, (long long)vocab, 1e3 * ours / reps,
           2.0 * (double)bytes * reps / ours / 1e9, 2.0 * (double)bytes * reps / copy / 1e9,
           copy / ours);
    pdp_cudak_free(0, z);
    pdp_cudak_free(0, dz);
    free(host);
    free(labels);
    free(loss);
    return 0;
}

int main(int argc, char **argv)
{
    int quick = argc > 1 && strcmp(argv[1], "--quick") == 0, n = 0;
    int smoke = argc > 1 && strcmp(argv[1], "--smoke") == 0;
    if (pdp_cuda_device_count(&n) != PDP_OK) {
        printf("bench_gpu: no CUDA device (%s); nothing to measure\n", pdp_last_error());
        return 2; /* not a pass: tests/gpu/run.sh records a failed step */
    }
    printf("pdp %s on CUDA device 0 (%d visible); TF32 off unless marked\n", pdp_version_string(), n);
    if (smoke) /* every path once at toy sizes: make emu-cuda-test runs this on the CPU
                  emulation of CUDA; the figures mean nothing there */
        return bench_gemm(64, 1) || bench_elementwise(1 << 16, 1) ||
               bench_cross_entropy(4, 300, 1) || bench_training(0, 8, 1) ||
               bench_training(1, 4, 1);
    if (bench_gemm(quick ? 2048 : 4096, quick ? 5 : 20)) return 1;
    if (bench_elementwise((int64_t)(quick ? 16 : 64) << 20, quick ? 5 : 20)) return 1;
    if (bench_cross_entropy(quick ? 512 : 2048, 50257, quick ? 3 : 10)) return 1;
    if (bench_training(0, 512, quick ? 20 : 100)) return 1;
    if (bench_training(1, 256, quick ? 10 : 50)) return 1;
    return 0;
}
