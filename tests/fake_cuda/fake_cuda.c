/* fake_cuda: a host-memory TEST DOUBLE of pdp_cuda.cu. It is NOT a GPU test.

   It provides every pdp_cudak_* function that src/cuda.h declares, in plain C,
   so that pdp.h's host side of CUDA (cuda_host.c: dispatch of every layer,
   loss and optimizer; dp.c: replicate, scatter, per-worker apply, gather and
   the reduce over devices through staging buffers; gradient clipping; the
   NCCL communicator backend) runs on a machine without a GPU, under gcc, the
   sanitizers and TSan. `make fake-cuda-test` links tests/test_cuda.c,
   tests/test_optim.c and tests/test_checkpoint.c (built with -DPDP_CUDA)
   against it and runs them with PDP_FAKE_CUDA_DEVICES = 1, 2 and 3.

   What it checks (each violation fails the call with PDP_ERR_CUDA and a
   message "fake_cuda: ...", which the host side turns into a failed test):
   - Device-pointer discipline. "Device memory" is malloc'd blocks tagged with
     their device. Every kernel checks that each pointer it is given, with the
     extent the kernel touches, lies inside a live block of the device it runs
     on: a pointer of another device, a host pointer, a freed block or an
     overrun is caught here, where a GPU would fault or silently read another
     GPU's memory through peer access. Copies check both sides, and that a
     "host" side is not fake-device memory.
   - Allocation discipline. The allocator caches freed blocks by exact size on
     their device and counts the mallocs it makes, as the real caching
     allocator counts cudaMalloc calls ("a step allocates nothing").
   - Uninitialised and freed memory. New blocks and freed blocks are filled
     with NaN, and each kernel's scratch (conv's work buffer) is filled with NaN
     before use, so host code that reads memory nobody wrote shows up as NaN.
   - NCCL collectives. The ranks of one process (pdp_nccl_group, or
     init_rank with one id) form a clique; the n-th collective of every rank
     must agree on kind, count and op (NCCL would hang or corrupt otherwise);
     it completes when the last rank launches it, summing in rank order.
     Sends and receives match per (sender, receiver) pair in launch order, with
     the sender's tag and count as the receiver's header; a count mismatch never
     completes (NCCL hangs). Splits rank the new cliques by (key, old rank).

   - Layer calls. Each layer function rebuilds its layer from its arguments and
     sets it up through pdp's table of kinds: arguments that make no such layer
     (a conv output size that is not the layer's) fail, and every pointer is
     checked against the extent that layer implies ("fake_cuda: layers").

   What it cannot check: anything about the GPU itself. Kernels run
   synchronously on the calling thread, the layers as pdp's own CPU layers and
   the rest as naive loops (double accumulators where the CPU uses them), so
   layer numerics are the CPU's (emu-cuda-test runs the real kernels); missing
   stream synchronisation, races between
   streams, cuBLAS/TF32 numerics (pdp_cuda_set_tf32 is accepted and ignored),
   launch configurations and real NCCL transport (process ranks; they time out
   here with a message saying so) need a GPU: tests/gpu/run.sh.

   PDP_FAKE_CUDA_DEVICES: the number of fake devices (default 2; 0 reports no
   device, as cudaErrorNoDevice does, and the GPU tests skip). */

#define _POSIX_C_SOURCE 200809L
/* A private copy of pdp's implementation (PDP_STATIC: every symbol static, so it
   does not clash with the test's): the layer functions run its CPU layers. */
#define PDP_STATIC
#define PDP_IMPLEMENTATION
#if defined(__GNUC__) && !defined(__clang__)
#  pragma GCC diagnostic push
/* all-static inlining makes gcc -O2 see a tensor count "maybe uninitialized" on a path
   that returns an error first */
#  pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include "pdp.h"
#if defined(__GNUC__) && !defined(__clang__)
#  pragma GCC diagnostic pop
#endif

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define FAKE__MAX_DEVICES 16
#define FAKE__MAX_RANKS 64
#define F(n) ((size_t)(n) * sizeof(float))

/* ---- fake_cuda: errors ---- */

static __thread char fake__msg[512];

const char *pdp_cudak_error(void) { return fake__msg; }

static pdp_status fake__fail(pdp_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

static pdp_status fake__fail(pdp_status st, const char *fmt, ...)
{
    va_list ap;
    int n = snprintf(fake__msg, sizeof fake__msg, "fake_cuda: ");
    va_start(ap, fmt);
    vsnprintf(fake__msg + n, sizeof fake__msg - (size_t)n, fmt, ap);
    va_end(ap);
    return st;
}

#define FAKE__NOT_IMPLEMENTED(what) \
    fake__fail(PDP_ERR_UNSUPPORTED, "%s not implemented (needs a GPU: tests/gpu/run.sh)", what)

static int fake__ndev(void)
{
    static int n = -1;
    if (n < 0) {
        const char *e = getenv("PDP_FAKE_CUDA_DEVICES");
        int v = e && *e ? atoi(e) : 2;
        __atomic_store_n(&n, v < 0 ? 0 : v > FAKE__MAX_DEVICES ? FAKE__MAX_DEVICES : v,
                         __ATOMIC_RELAXED);
    }
    return __atomic_load_n(&n, __ATOMIC_RELAXED);
}

#define FAKE__DEV(dev)                                                                      \
    do {                                                                                    \
        if ((dev) < 0 || (dev) >= fake__ndev())                                             \
            return fake__fail(PDP_ERR_CUDA, "%s: device %d does not exist (%d fake devices)", \
                              __func__, (dev), fake__ndev());                               \
    } while (0)

/* ---- fake_cuda: device memory ---- */

typedef struct fake__block {
    char *p;
    size_t bytes;
    int dev, used;
} fake__block;

static pthread_mutex_t fake__mem_mu = PTHREAD_MUTEX_INITIALIZER;
static fake__block *fake__blocks;
static int fake__nblocks, fake__cap;
static int64_t fake__mallocs[FAKE__MAX_DEVICES];

static void fake__poison(void *p, size_t bytes)
{
    size_t i;
    float nan = NAN;
    for (i = 0; i + sizeof(float) <= bytes; i += sizeof(float)) memcpy((char *)p + i, &nan, 4);
}

/* The live block of any device holding [p, p + bytes), or NULL. Caller holds the lock. */
static fake__block *fake__find(const void *p, size_t bytes)
{
    int i;
    for (i = 0; i < fake__nblocks; i++) {
        fake__block *b = &fake__blocks[i];
        if (b->used && (const char *)p >= b->p && (const char *)p < b->p + b->bytes)
            return bytes <= (size_t)(b->p + b->bytes - (const char *)p) ? b : NULL;
    }
    return NULL;
}

/* 0 when [p, p + bytes) lies in a live block of dev; else fills the message. */
static int fake__check(const char *fn, const char *name, int dev, const void *p, size_t bytes)
{
    fake__block *b;
    int i, owner = -1, freed = 0;
    if (bytes == 0) return 0;
    if (!p) {
        fake__fail(PDP_ERR_CUDA, "%s: %s is NULL (%zu bytes on device %d)", fn, name, bytes, dev);
        return -1;
    }
    pthread_mutex_lock(&fake__mem_mu);
    b = fake__find(p, bytes);
    if (b && b->dev == dev) {
        pthread_mutex_unlock(&fake__mem_mu);
        return 0;
    }
    for (i = 0; i < fake__nblocks; i++) {
        const fake__block *q = &fake__blocks[i];
        if ((const char *)p >= q->p && (const char *)p < q->p + q->bytes) {
            owner = q->dev;
            freed = !q->used;
            if (q->used) break;
        }
    }
    pthread_mutex_unlock(&fake__mem_mu);
    if (b)
        fake__fail(PDP_ERR_CUDA, "%s: %s (%zu bytes) is memory of device %d, not of device %d",
                   fn, name, bytes, b->dev, dev);
    else if (owner >= 0 && freed)
        fake__fail(PDP_ERR_CUDA, "%s: %s is a freed block of device %d", fn, name, owner);
    else if (owner >= 0)
        fake__fail(PDP_ERR_CUDA, "%s: %s (%zu bytes) overruns its block on device %d", fn, name,
                   bytes, owner);
    else
        fake__fail(PDP_ERR_CUDA, "%s: %s (%zu bytes) is not device memory (a host pointer?) "
                   "on device %d", fn, name, bytes, dev);
    return -1;
}

/* OWN(dev, p, bytes): p must be device memory of dev, or the calling kernel fails. */
#define OWN(dev, p, bytes)                                                                 \
    do {                                                                                   \
        if (fake__check(__func__, #p, (dev), (p), (size_t)(bytes))) return PDP_ERR_CUDA;   \
    } while (0)

pdp_status pdp_cudak_device_count(int *count)
{
    *count = fake__ndev();
    if (*count == 0) return fake__fail(PDP_ERR_NO_DEVICE, "no CUDA device (PDP_FAKE_CUDA_DEVICES=0)");
    return PDP_OK;
}

void pdp_cudak_set_tf32(int on) { (void)on; }

pdp_status pdp_cudak_synchronize(int dev)
{
    FAKE__DEV(dev);
    return PDP_OK;
}

pdp_status pdp_cudak_malloc(int dev, size_t bytes, void **out)
{
    int i;
    fake__block *b = NULL;
    *out = NULL;
    FAKE__DEV(dev);
    pthread_mutex_lock(&fake__mem_mu);
    for (i = 0; i < fake__nblocks && !b; i++)
        if (!fake__blocks[i].used && fake__blocks[i].dev == dev && fake__blocks[i].bytes == bytes)
            b = &fake__blocks[i];
    if (!b) {
        char *p = (char *)malloc(bytes ? bytes : 1);
        if (p && fake__nblocks == fake__cap) {
            int cap = fake__cap ? 2 * fake__cap : 256;
            fake__block *nb = (fake__block *)realloc(fake__blocks, (size_t)cap * sizeof *nb);
            if (nb) {
                fake__blocks = nb;
                fake__cap = cap;
            }
        }
        if (!p || fake__nblocks == fake__cap) {
            pthread_mutex_unlock(&fake__mem_mu);
            free(p);
            return fake__fail(PDP_ERR_OUT_OF_MEMORY, "cudaMalloc(%zu) on device %d: no host memory",
                              bytes, dev);
        }
        b = &fake__blocks[fake__nblocks++];
        b->p = p;
        b->bytes = bytes;
        b->dev = dev;
        fake__mallocs[dev]++;
    }
    b->used = 1;
    fake__poison(b->p, b->bytes); /* cudaMalloc memory is not initialised */
    *out = b->p;
    pthread_mutex_unlock(&fake__mem_mu);
    return PDP_OK;
}

/* A free of the wrong device or of a pointer that is no live block is reported on
   stderr (the real free has no status to return) and counted: see the destructor. */
static int fake__bad_frees;

void pdp_cudak_free(int dev, void *p)
{
    int i;
    if (!p) return;
    pthread_mutex_lock(&fake__mem_mu);
    for (i = 0; i < fake__nblocks; i++)
        if (fake__blocks[i].p == p && fake__blocks[i].used) break;
    if (i == fake__nblocks || fake__blocks[i].dev != dev) {
        fake__bad_frees++;
        fprintf(stderr, "fake_cuda: pdp_cudak_free(device %d, %p): %s\n", dev, p,
                i == fake__nblocks ? "not a live block (double free?)" : "block of another device");
    } else {
        fake__blocks[i].used = 0;
        fake__poison(p, fake__blocks[i].bytes);
    }
    pthread_mutex_unlock(&fake__mem_mu);
}

pdp_status pdp_cudak_memory_stats(int dev, int64_t *mallocs, size_t *reserved, size_t *in_use)
{
    int i;
    size_t r = 0, u = 0;
    FAKE__DEV(dev);
    pthread_mutex_lock(&fake__mem_mu);
    for (i = 0; i < fake__nblocks; i++)
        if (fake__blocks[i].dev == dev) {
            r += fake__blocks[i].bytes;
            if (fake__blocks[i].used) u += fake__blocks[i].bytes;
        }
    *mallocs = fake__mallocs[dev];
    pthread_mutex_unlock(&fake__mem_mu);
    *reserved = r;
    *in_use = u;
    return PDP_OK;
}

pdp_status pdp_cudak_empty_cache(int dev)
{
    int i, j = 0;
    FAKE__DEV(dev);
    pthread_mutex_lock(&fake__mem_mu);
    for (i = 0; i < fake__nblocks; i++) {
        if (!fake__blocks[i].used && fake__blocks[i].dev == dev)
            free(fake__blocks[i].p);
        else
            fake__blocks[j++] = fake__blocks[i];
    }
    fake__nblocks = j;
    pthread_mutex_unlock(&fake__mem_mu);
    return PDP_OK;
}

/* The fake device's blocks back to the host, refused while one is in use (as the real one). */
pdp_status pdp_cudak_release(int dev)
{
    int i;
    size_t used = 0;
    FAKE__DEV(dev);
    pthread_mutex_lock(&fake__mem_mu);
    for (i = 0; i < fake__nblocks; i++)
        if (fake__blocks[i].used && fake__blocks[i].dev == dev) used += fake__blocks[i].bytes;
    pthread_mutex_unlock(&fake__mem_mu);
    if (used)
        return fake__fail(PDP_ERR_STATE, "CUDA device %d: %zu bytes are still in use", dev, used);
    return pdp_cudak_empty_cache(dev);
}

/* At exit: blocks still in use are device-memory leaks of the program (reported, as
   a leak checker would); wrong frees make the process fail. */
static void fake__at_exit(void) __attribute__((destructor));
static void fake__at_exit(void)
{
    int i, live = 0;
    size_t bytes = 0;
    for (i = 0; i < fake__nblocks; i++) {
        if (fake__blocks[i].used) {
            live++;
            bytes += fake__blocks[i].bytes;
        }
        free(fake__blocks[i].p);
    }
    free(fake__blocks);
    if (live) fprintf(stderr, "fake_cuda: %d device blocks (%zu bytes) never freed\n", live, bytes);
    if (fake__bad_frees) {
        fprintf(stderr, "fake_cuda: %d bad frees\n", fake__bad_frees);
        _Exit(1);
    }
}

pdp_status pdp_cudak_memset0(int dev, void *p, size_t bytes)
{
    FAKE__DEV(dev);
    OWN(dev, p, bytes);
    memset(p, 0, bytes);
    return PDP_OK;
}

pdp_status pdp_cudak_fill(int dev, float *p, int64_t count, float value)
{
    int64_t i;
    FAKE__DEV(dev);
    OWN(dev, p, F(count));
    for (i = 0; i < count; i++) p[i] = value;
    return PDP_OK;
}

/* A side given as host memory (-1) must not be fake-device memory. */
static int fake__check_host(const char *name, const void *p, size_t bytes)
{
    fake__block *b;
    pthread_mutex_lock(&fake__mem_mu);
    b = fake__find(p, 1);
    pthread_mutex_unlock(&fake__mem_mu);
    if (b && bytes) {
        fake__fail(PDP_ERR_CUDA, "pdp_cudak_memcpy: %s is given as host memory but is memory of "
                   "device %d", name, b->dev);
        return -1;
    }
    return 0;
}

pdp_status pdp_cudak_memcpy(int dst_dev, void *dst, int src_dev, const void *src, size_t bytes)
{
    if (dst_dev >= 0) {
        FAKE__DEV(dst_dev);
        OWN(dst_dev, dst, bytes);
    } else if (fake__check_host("dst", dst, bytes)) {
        return PDP_ERR_CUDA;
    }
    if (src_dev >= 0) {
        FAKE__DEV(src_dev);
        OWN(src_dev, src, bytes);
    } else if (fake__check_host("src", src, bytes)) {
        return PDP_ERR_CUDA;
    }
    if (bytes) memmove(dst, src, bytes);
    return PDP_OK;
}

pdp_status pdp_cudak_add(int dev, float *dst, const float *src, int64_t count)
{
    int64_t i;
    FAKE__DEV(dev);
    OWN(dev, dst, F(count));
    OWN(dev, src, F(count));
    for (i = 0; i < count; i++) dst[i] += src[i];
    return PDP_OK;
}

/* ---- fake_cuda: layers ----
   One generic kernel, fake__layer, behind every layer function: it rebuilds the
   layer from the call's arguments, sets it up through pdp's table of kinds (shape
   inference: the output, saved and parameter sizes), checks every pointer against
   the extent the call implies, and runs pdp's own CPU forward or backward (the
   private copy included above) on the fake device's host memory. So a new layer
   kind costs a few lines here per pdp_cudak_* function, and its numerics are
   tested once, on the CPU (tests/test_layers.c; the real kernels in
   emu-cuda-test). The CPU kernels run on the calling thread (this copy's
   intra-op setting is never raised) with their own workspace. */

/* Pointers of a layer call the function's contract requires (not NULL). */
enum { FAKE__X = 1, FAKE__Y = 2, FAKE__DY = 4, FAKE__DX = 8, FAKE__W = 16, FAKE__B = 32,
       FAKE__DW = 64, FAKE__DB = 128, FAKE__SAVED = 256 };

/* A layer of kind k on samples of shape (n) or (C, H, W), for fake__layer. */
static pdp__layer fake__layer_of(pdp__layer_kind k, int ndim, int64_t c, int64_t h, int64_t w)
{
    pdp__layer l;
    memset(&l, 0, sizeof l);
    l.kind = k;
    l.in_ndim = ndim;
    l.in_shape[0] = c;
    l.in_shape[1] = h;
    l.in_shape[2] = w;
    return l;
}

/* Checks p (the io field named name) for count floats when required or given. */
#define FAKE__PTR(bit, p, count)                                                           \
    do {                                                                                   \
        if (((need & (bit)) || (p)) && fake__check(fn, #p, dev, (p), F(count)))            \
            return PDP_ERR_CUDA;                                                           \
    } while (0)

/* Runs layer l's CPU forward (backward = 0) or backward on io, after the checks.
   g, when not NULL, is the call's conv/pool geometry: its output size must be the
   layer's. */
static pdp_status fake__layer(const char *fn, int dev, pdp__layer *l, pdp__layer_io *io,
                              int backward, unsigned need, const pdp_cudak_conv *g)
{
    pdp__param_shapes ps;
    int64_t B = io->batch, nw = 1, nb = 1, i;
    float *work = NULL;
    pdp_status st;
    if (dev < 0 || dev >= fake__ndev())
        return fake__fail(PDP_ERR_CUDA, "%s: device %d does not exist (%d fake devices)", fn, dev,
                          fake__ndev());
    l->in_count = l->in_shape[0] * l->in_shape[1] * l->in_shape[2];
    if (pdp__layer_setup(l, &ps) != PDP_OK)
        return fake__fail(PDP_ERR_CUDA, "%s: the arguments make no %s: %s", fn,
                          pdp__layer_kind_name(l->kind), pdp_last_error());
    if (g && (g->Ho != l->out_shape[1] || g->Wo != l->out_shape[2]))
        return fake__fail(PDP_ERR_CUDA, "%s: output %lldx%lld given, the layer's is %lldx%lld",
                          fn, (long long)g->Ho, (long long)g->Wo, (long long)l->out_shape[1],
                          (long long)l->out_shape[2]);
    for (i = 0; i < ps.wndim; i++) nw *= ps.wshape[i];
    for (i = 0; i < ps.bndim; i++) nb *= ps.bshape[i];
    FAKE__PTR(FAKE__X, io->x, B * l->in_count);
    FAKE__PTR(FAKE__Y, io->y, B * l->out_count);
    FAKE__PTR(FAKE__DY, io->dy, B * l->out_count);
    FAKE__PTR(FAKE__DX, io->dx, B * l->in_count);
    FAKE__PTR(FAKE__W, io->w, nw);
    FAKE__PTR(FAKE__B, io->b, nb);
    FAKE__PTR(FAKE__DW, io->dw, nw);
    FAKE__PTR(FAKE__DB, io->db, nb);
    FAKE__PTR(FAKE__SAVED, io->saved, B * l->saved_per_sample);
    if (l->work_per_sample && !(work = (float *)malloc(F(B * l->work_per_sample))))
        return fake__fail(PDP_ERR_OUT_OF_MEMORY, "%s: no host memory for the workspace", fn);
    io->work = work;
    io->device = pdp_cpu();
    st = backward ? pdp__layer_backward(l, io) : pdp__layer_forward(l, io);
    free(work);
    if (st != PDP_OK) return fake__fail(PDP_ERR_CUDA, "%s: %s", fn, pdp_last_error());
    return PDP_OK;
}

static pdp__layer_io fake__io(int64_t batch)
{
    pdp__layer_io io;
    memset(&io, 0, sizeof io);
    io.batch = batch;
    return io;
}

pdp_status pdp_cudak_linear_fwd(int dev, const float *x, const float *w, const float *b, float *y,
                                int64_t batch, int64_t in, int64_t out, int bf16)
{
    pdp__layer l = fake__layer_of(PDP__LINEAR, 1, in, 1, 1);
    pdp__layer_io io = fake__io(batch);
    l.out_features = out;
    io.x = x, io.w = (float *)w, io.b = (float *)b, io.y = y, io.bf16 = bf16 != 0;
    return fake__layer(__func__, dev, &l, &io, 0, FAKE__X | FAKE__W | FAKE__Y, NULL);
}

pdp_status pdp_cudak_linear_bwd(int dev, const float *x, const float *w, const float *dy,
                                float *dw, float *db, float *dx, int64_t batch, int64_t in,
                                int64_t out, int bf16)
{
    pdp__layer l = fake__layer_of(PDP__LINEAR, 1, in, 1, 1);
    pdp__layer_io io = fake__io(batch);
    l.out_features = out;
    io.x = x, io.w = (float *)w, io.dy = dy, io.dw = dw, io.db = db, io.dx = dx;
    io.bf16 = bf16 != 0;
    return fake__layer(__func__, dev, &l, &io, 1, FAKE__X | FAKE__W | FAKE__DY | FAKE__DW, NULL);
}

/* indexed by pdp_cudak_act */
static const pdp__layer_kind fake__act_kind[] = {PDP__RELU,    PDP__GELU, PDP__TANH,
                                                 PDP__SIGMOID, PDP__SILU, PDP__GELU_ERF};

/* An activation code outside the enum fails fake__layer's setup (kind -1). */
static pdp__layer_kind fake__act(pdp_cudak_act act)
{
    return (unsigned)act < sizeof fake__act_kind / sizeof *fake__act_kind ? fake__act_kind[act]
                                                                          : (pdp__layer_kind)-1;
}

pdp_status pdp_cudak_act_fwd(int dev, pdp_cudak_act act, const float *x, float *y, int64_t count)
{
    pdp__layer l = fake__layer_of(fake__act(act), 1, count, 1, 1);
    pdp__layer_io io = fake__io(1);
    io.x = x, io.y = y;
    return fake__layer(__func__, dev, &l, &io, 0, FAKE__X | FAKE__Y, NULL);
}

pdp_status pdp_cudak_act_bwd(int dev, pdp_cudak_act act, const float *x, const float *y,
                             const float *dy, float *dx, int64_t count)
{
    pdp__layer l = fake__layer_of(fake__act(act), 1, count, 1, 1);
    pdp__layer_io io = fake__io(1);
    io.x = x, io.y = (float *)y, io.dy = dy, io.dx = dx;
    return fake__layer(__func__, dev, &l, &io, 1, FAKE__X | FAKE__Y | FAKE__DY | FAKE__DX, NULL);
}

pdp_status pdp_cudak_dropout_fwd(int dev, const float *x, float *y, float *mask, int64_t batch,
                                 int64_t n, float p, uint64_t seed, int layer, uint64_t step,
                                 int64_t sample_base, int64_t first)
{
    pdp__layer l = fake__layer_of(PDP__DROPOUT, 1, n, 1, 1);
    pdp__layer_io io = fake__io(batch);
    l.p = p;
    l.index = l.mask_index = layer;
    l.mask_first = first;
    io.x = x, io.y = y, io.saved = mask;
    io.training = true, io.seed = seed, io.step = step, io.sample_base = sample_base;
    return fake__layer(__func__, dev, &l, &io, 0, FAKE__X | FAKE__Y | FAKE__SAVED, NULL);
}

pdp_status pdp_cudak_mul(int dev, const float *dy, const float *mask, float *dx, int64_t count)
{
    int64_t i;
    FAKE__DEV(dev);
    OWN(dev, dy, F(count));
    OWN(dev, mask, F(count));
    OWN(dev, dx, F(count));
    for (i = 0; i < count; i++) dx[i] = dy[i] * mask[i];
    return PDP_OK;
}

pdp_status pdp_cudak_layernorm_fwd(int dev, const float *x, const float *w, const float *b,
                                   float *y, float *saved, int64_t batch, int64_t n, float eps)
{
    pdp__layer l = fake__layer_of(PDP__LAYERNORM, 1, n, 1, 1);
    pdp__layer_io io = fake__io(batch);
    l.eps = eps;
    io.x = x, io.w = (float *)w, io.b = (float *)b, io.y = y, io.saved = saved;
    return fake__layer(__func__, dev, &l, &io, 0,
                       FAKE__X | FAKE__W | FAKE__B | FAKE__Y | FAKE__SAVED, NULL);
}

pdp_status pdp_cudak_layernorm_bwd(int dev, const float *x, const float *w, const float *dy,
                                   const float *saved, float *dw, float *db, float *dx,
                                   int64_t batch, int64_t n)
{
    pdp__layer l = fake__layer_of(PDP__LAYERNORM, 1, n, 1, 1);
    pdp__layer_io io = fake__io(batch);
    l.eps = 1e-5f; /* setup checks it; backward does not read it */
    io.x = x, io.w = (float *)w, io.dy = dy, io.saved = (float *)saved;
    io.dw = dw, io.db = db, io.dx = dx;
    return fake__layer(__func__, dev, &l, &io, 1,
                       FAKE__X | FAKE__W | FAKE__DY | FAKE__SAVED | FAKE__DW | FAKE__DB, NULL);
}

/* Conv2d and MaxPool2d take their geometry as a pdp_cudak_conv. */
static pdp__layer fake__conv_layer(pdp__layer_kind k, const pdp_cudak_conv *g)
{
    pdp__layer l = fake__layer_of(k, 3, g->C, g->H, g->W);
    l.kernel = g->k;
    l.stride = g->stride;
    if (k == PDP__CONV2D) {
        l.out_features = g->O;
        l.padding = g->pad;
    }
    return l;
}

/* The work buffer ((C k k + O) Ho Wo floats per sample; forward needs the first
   C k k Ho Wo) is checked and poisoned: the real kernels use it as scratch, so its
   contents must mean nothing to the host. */
static int fake__conv_work(const char *fn, int dev, const pdp_cudak_conv *g, float *work,
                           int64_t per_sample)
{
    if (fake__check(fn, "work", dev, work, F(g->batch * per_sample * g->Ho * g->Wo))) return -1;
    fake__poison(work, F(g->batch * per_sample * g->Ho * g->Wo));
    return 0;
}

pdp_status pdp_cudak_conv_fwd(int dev, const pdp_cudak_conv *g, const float *x, const float *w,
                              const float *b, float *y, float *work, int bf16)
{
    pdp__layer l = fake__conv_layer(PDP__CONV2D, g);
    pdp__layer_io io = fake__io(g->batch);
    FAKE__DEV(dev);
    if (fake__conv_work(__func__, dev, g, work, g->C * g->k * g->k)) return PDP_ERR_CUDA;
    io.x = x, io.w = (float *)w, io.b = (float *)b, io.y = y, io.bf16 = bf16 != 0;
    return fake__layer(__func__, dev, &l, &io, 0, FAKE__X | FAKE__W | FAKE__Y, g);
}

pdp_status pdp_cudak_conv_bwd(int dev, const pdp_cudak_conv *g, const float *x, const float *w,
                              const float *dy, float *dw, float *db, float *dx, float *work,
                              int bf16)
{
    pdp__layer l = fake__conv_layer(PDP__CONV2D, g);
    pdp__layer_io io = fake__io(g->batch);
    FAKE__DEV(dev);
    if (fake__conv_work(__func__, dev, g, work, g->C * g->k * g->k + g->O)) return PDP_ERR_CUDA;
    io.x = x, io.w = (float *)w, io.dy = dy, io.dw = dw, io.db = db, io.dx = dx;
    io.bf16 = bf16 != 0;
    return fake__layer(__func__, dev, &l, &io, 1, FAKE__X | FAKE__W | FAKE__DY | FAKE__DW, g);
}

/* MaxPool2d: the saved argmax is pdp's CPU layout (an int32 index into the channel
   plane), which only these two functions read; backward checks each index. */
pdp_status pdp_cudak_maxpool_fwd(int dev, const pdp_cudak_conv *g, const float *x, float *y,
                                 float *argmax)
{
    pdp__layer l = fake__conv_layer(PDP__MAXPOOL2D, g);
    pdp__layer_io io = fake__io(g->batch);
    io.x = x, io.y = y, io.saved = argmax;
    return fake__layer(__func__, dev, &l, &io, 0, FAKE__X | FAKE__Y | FAKE__SAVED, g);
}

pdp_status pdp_cudak_maxpool_bwd(int dev, const pdp_cudak_conv *g, const float *dy,
                                 const float *argmax, float *dx)
{
    pdp__layer l = fake__conv_layer(PDP__MAXPOOL2D, g);
    pdp__layer_io io = fake__io(g->batch);
    int64_t i, plane = g->H * g->W, n = g->batch * g->C * g->Ho * g->Wo;
    FAKE__DEV(dev);
    OWN(dev, argmax, F(n));
    for (i = 0; i < n; i++) {
        int32_t q;
        memcpy(&q, argmax + i, sizeof q);
        if (q < 0 || q >= plane)
            return fake__fail(PDP_ERR_CUDA, "%s: argmax %ld outside the %lld-element plane",
                              __func__, (long)q, (long long)plane);
    }
    io.dy = dy, io.saved = (float *)argmax, io.dx = dx;
    return fake__layer(__func__, dev, &l, &io, 1, FAKE__DY | FAKE__SAVED | FAKE__DX, g);
}

/* A GPT's layers. Embedding's ids are int32, as many as floats of a [B, T] input;
   its backward's work (B T int32, the real kernels' sort) is checked and poisoned. */
pdp_status pdp_cudak_embed_fwd(int dev, const int32_t *ids, const float *wte, const float *wpe,
                               float *out, int64_t B, int64_t T, int64_t V, int64_t C)
{
    pdp__layer l = fake__layer_of(PDP__EMBEDDING, 1, T, 1, 1);
    pdp__layer_io io = fake__io(B);
    pdp_status st;
    l.vocab = V, l.out_features = C, l.context = T;
    io.x = (const float *)(const void *)ids, io.w = (float *)wte, io.b = (float *)wpe, io.y = out;
    st = fake__layer(__func__, dev, &l, &io, 0, FAKE__X | FAKE__W | FAKE__B | FAKE__Y, NULL);
    if (st != PDP_OK && strstr(fake__msg, "token id")) /* pdp_cuda.cu's status for a bad id */
        return PDP_ERR_INVALID;
    return st;
}

pdp_status pdp_cudak_embed_bwd(int dev, const int32_t *ids, const float *dout, float *dwte,
                               float *dwpe, int32_t *work, int64_t B, int64_t T, int64_t V,
                               int64_t C)
{
    pdp__layer l = fake__layer_of(PDP__EMBEDDING, 1, T, 1, 1);
    pdp__layer_io io = fake__io(B);
    int64_t i;
    FAKE__DEV(dev);
    if (fake__check(__func__, "work", dev, work, F(B * T))) return PDP_ERR_CUDA;
    fake__poison(work, F(B * T));
    OWN(dev, ids, F(B * T));
    for (i = 0; i < B * T; i++) /* changed since the forward: pdp_cuda.cu's check, its status */
        if (ids[i] < 0 || ids[i] >= V)
            return fake__fail(PDP_ERR_INVALID, "token id %ld at position (%lld, %lld) is "
                              "outside [0, %lld): the ids changed after the forward",
                              (long)ids[i], (long long)(i / T), (long long)(i % T),
                              (long long)V);
    l.vocab = V, l.out_features = C, l.context = T;
    io.x = (const float *)(const void *)ids, io.dy = dout, io.dw = dwte, io.db = dwpe;
    return fake__layer(__func__, dev, &l, &io, 1, FAKE__X | FAKE__DY | FAKE__DW | FAKE__DB, NULL);
}

/* The attention's work (B H T T floats) is checked and poisoned like conv's. head_base
   (a shard of the heads) is the CPU layer's tp_lo under a TP state, which it only tests. */
static pdp__layer fake__attn_layer(const pdp_cudak_attn *g, pdp__layer_io *io)
{
    static pdp__tp_state shard; /* never read or written */
    pdp__layer l = fake__layer_of(PDP__CAUSAL_SELF_ATTENTION, 2, g->T, 3 * g->C, 1);
    l.heads = g->H;
    if (g->head_base != 0) l.tp = &shard, l.tp_lo = g->head_base;
    l.p = g->p;
    l.index = l.mask_index = g->layer;
    io->training = g->p != 0.0f;
    io->seed = g->seed, io->step = g->step, io->sample_base = g->sample_base;
    return l;
}

static int fake__attn_work(const char *fn, int dev, const pdp_cudak_attn *g, float *work)
{
    if (fake__check(fn, "work", dev, work, F(g->B * g->H * g->T * g->T))) return -1;
    fake__poison(work, F(g->B * g->H * g->T * g->T));
    return 0;
}

pdp_status pdp_cudak_attention_fwd(int dev, const pdp_cudak_attn *g, const float *qkv, float *y,
                                   float *att, float *work)
{
    pdp__layer_io io = fake__io(g->B);
    pdp__layer l = fake__attn_layer(g, &io);
    FAKE__DEV(dev);
    if (fake__attn_work(__func__, dev, g, work)) return PDP_ERR_CUDA;
    io.x = qkv, io.y = y, io.saved = att;
    return fake__layer(__func__, dev, &l, &io, 0, FAKE__X | FAKE__Y | FAKE__SAVED, NULL);
}

pdp_status pdp_cudak_attention_bwd(int dev, const pdp_cudak_attn *g, const float *qkv,
                                   const float *att, const float *dy, float *dqkv, float *work)
{
    pdp__layer_io io = fake__io(g->B);
    pdp__layer l = fake__attn_layer(g, &io);
    FAKE__DEV(dev);
    if (fake__attn_work(__func__, dev, g, work)) return PDP_ERR_CUDA;
    io.x = qkv, io.saved = (float *)att, io.dy = dy, io.dx = dqkv;
    return fake__layer(__func__, dev, &l, &io, 1, FAKE__X | FAKE__SAVED | FAKE__DY | FAKE__DX,
                       NULL);
}

pdp_status pdp_cudak_sum2(int dev, const float *a, const float *b, float *out, int64_t count)
{
    int64_t i;
    FAKE__DEV(dev);
    OWN(dev, a, F(count));
    OWN(dev, b, F(count));
    OWN(dev, out, F(count));
    for (i = 0; i < count; i++) out[i] = a[i] + b[i];
    return PDP_OK;
}

pdp_status pdp_cudak_copy2(int dev, const float *src, float *d1, float *d2, int64_t count)
{
    int64_t i;
    FAKE__DEV(dev);
    OWN(dev, src, F(count));
    OWN(dev, d1, F(count));
    if (d2) OWN(dev, d2, F(count));
    for (i = 0; i < count; i++) {
        d1[i] = src[i];
        if (d2) d2[i] = src[i];
    }
    return PDP_OK;
}

/* ---- fake_cuda: losses, clipping, optimizers ---- */

pdp_status pdp_cudak_cross_entropy(int dev, const float *logits, const int32_t *host_labels,
                                   int64_t batch, int64_t classes, float grad_scale,
                                   double *host_loss, float *dlogits)
{
    int64_t s, j;
    FAKE__DEV(dev);
    OWN(dev, logits, F(batch * classes));
    if (dlogits) OWN(dev, dlogits, F(batch * classes));
    if (batch > 0 && (fake__check_host("host_labels", host_labels, 1) ||
                      fake__check_host("host_loss", host_loss, 1)))
        return PDP_ERR_CUDA;
    for (s = 0; s < batch; s++) {
        const float *z = logits + s * classes;
        int32_t label = host_labels[s];
        float mx = z[0];
        double sum = 0.0;
        if (label == -1) { /* an ignored row */
            host_loss[s] = 0.0;
            if (dlogits)
                for (j = 0; j < classes; j++) dlogits[s * classes + j] = 0.0f;
            continue;
        }
        if (label < 0 || label >= classes)
            return fake__fail(PDP_ERR_CUDA, "%s: label %d of sample %lld outside [0, %lld) "
                              "(the host must check labels)", __func__, (int)label, (long long)s,
                              (long long)classes);
        for (j = 1; j < classes; j++) mx = z[j] > mx ? z[j] : mx;
        for (j = 0; j < classes; j++) sum += exp((double)z[j] - (double)mx);
        host_loss[s] = (double)mx + log(sum) - (double)z[label];
        if (dlogits) {
            for (j = 0; j < classes; j++)
                dlogits[s * classes + j] = (float)(exp((double)z[j] - (double)mx) / sum) * grad_scale;
            dlogits[s * classes + label] -= grad_scale;
        }
    }
    return PDP_OK;
}

pdp_status pdp_cudak_mse(int dev, const float *pred, const float *target, int64_t count,
                         float scale, double *host_sum, float *dpred)
{
    int64_t i;
    double acc = 0.0;
    FAKE__DEV(dev);
    OWN(dev, pred, F(count));
    OWN(dev, target, F(count));
    if (dpred) OWN(dev, dpred, F(count));
    for (i = 0; i < count; i++) {
        float d = pred[i] - target[i];
        acc += (double)d * (double)d;
        if (dpred) dpred[i] = scale * d;
    }
    *host_sum = acc;
    return PDP_OK;
}

/* Partial sums over 256 strided lanes, then in lane order: a fixed order (the same
   bits every run) that is not the CPU's sequential one, as on the GPU. */
pdp_status pdp_cudak_sumsq(int dev, const float *x, int64_t count, double *host_sum)
{
    double lane[256] = {0}, s = 0.0;
    int64_t i;
    FAKE__DEV(dev);
    OWN(dev, x, F(count));
    for (i = 0; i < count; i++) lane[i % 256] += (double)x[i] * x[i];
    for (i = 0; i < 256; i++) s += lane[i];
    *host_sum = s;
    return PDP_OK;
}

pdp_status pdp_cudak_scale(int dev, float *x, int64_t count, float s)
{
    int64_t i;
    FAKE__DEV(dev);
    OWN(dev, x, F(count));
    for (i = 0; i < count; i++) x[i] *= s;
    return PDP_OK;
}

pdp_status pdp_cudak_to16(int dev, void *dst, const float *src, int64_t count, float scale,
                          int dtype)
{
    int64_t i;
    FAKE__DEV(dev);
    OWN(dev, dst, (size_t)count * 2);
    OWN(dev, src, F(count));
    for (i = 0; i < count; i++)
        ((uint16_t *)dst)[i] = dtype == 1 ? pdp__bf16_bits(src[i] * scale)
                                          : pdp__f16_bits(src[i] * scale);
    return PDP_OK;
}

pdp_status pdp_cudak_from16(int dev, float *dst, const void *src, int64_t count, int dtype)
{
    int64_t i;
    FAKE__DEV(dev);
    OWN(dev, dst, F(count));
    OWN(dev, src, (size_t)count * 2);
    for (i = 0; i < count; i++)
        dst[i] = dtype == 1 ? pdp__bf16_float(((const uint16_t *)src)[i])
                            : pdp__f16_float(((const uint16_t *)src)[i]);
    return PDP_OK;
}

pdp_status pdp_cudak_sgd(int dev, float *p, const float *g, float *buf, int64_t count, float lr,
                         float momentum, float one_minus_damp, float weight_decay, int nesterov,
                         int first)
{
    int64_t i;
    FAKE__DEV(dev);
    OWN(dev, p, F(count));
    OWN(dev, g, F(count));
    if (momentum != 0.0f) OWN(dev, buf, F(count));
    for (i = 0; i < count; i++)
        p[i] = momentum != 0.0f
                   ? pdp__sgd_momentum_update(p[i], g[i], &buf[i], lr, momentum, one_minus_damp,
                                              weight_decay, nesterov, first)
                   : pdp__sgd_update(p[i], g[i], lr, weight_decay);
    return PDP_OK;
}

pdp_status pdp_cudak_adam(int dev, float *p, const float *g, float *m, float *v, int64_t count,
                          float beta1, float one_minus_beta1, float beta2, float one_minus_beta2,
                          float step_size, float bc2_sqrt, float eps, float l2, float decay)
{
    int64_t i;
    FAKE__DEV(dev);
    OWN(dev, p, F(count));
    OWN(dev, g, F(count));
    OWN(dev, m, F(count));
    OWN(dev, v, F(count));
    for (i = 0; i < count; i++)
        p[i] = pdp__adam_update(p[i], g[i], &m[i], &v[i], beta1, one_minus_beta1, beta2,
                                one_minus_beta2, step_size, bc2_sqrt, eps, l2, decay);
    return PDP_OK;
}

pdp_status pdp_cudak_gemm(int dev, const float *a, const float *b, float *c, int64_t m, int64_t n,
                          int64_t k)
{
    (void)dev, (void)a, (void)b, (void)c, (void)m, (void)n, (void)k;
    return FAKE__NOT_IMPLEMENTED("pdp_cudak_gemm (cuBLAS benchmark)");
}

/* ---- fake_cuda: NCCL ----
   A clique is the ranks of one communicator, all threads of this process: made
   whole by init_all, or joined rank by rank by init_rank with one id. Rank r's
   n-th collective goes into op slot n % SLOTS; the last rank to launch it runs it
   (sums in rank order, in float, like a ring of one process would not promise,
   but deterministic) and wakes the waiters. One lock guards every clique. */

#define FAKE__BYTES_BCAST (-1) /* broadcast_bytes, on host memory */

typedef struct fake__op {
    int64_t seq;      /* collective number; -1 before the first */
    int kind, op, arrived, done;
    int dtype;        /* pdp_dtype of the reductions: 0 F32, 1 BF16, 2 F16 */
    int64_t count;    /* elements (bytes for FAKE__BYTES_BCAST) */
    const void *send[FAKE__MAX_RANKS];
    void *recv[FAKE__MAX_RANKS];
} fake__op;

/* a send or receive not yet matched, in the clique's list in launch order */
typedef struct fake__p2pmsg {
    struct pdp_cudak_nccl *h;
    int slot, is_send, src, dst, tag;
    int64_t count;
    float *buf;
    struct fake__p2pmsg *next;
} fake__p2pmsg;

typedef struct fake__clique {
    char id[PDP_CUDAK_NCCL_ID_BYTES];
    int nranks, joined, refs, aborted;
    struct fake__clique *next;
    fake__op ops[PDP_CUDAK_NCCL_SLOTS];
    fake__p2pmsg *msgs;
    /* the split in progress: arrivals, then each rank takes its new handle */
    int split_arrived, split_taken, split_busy;
    int split_colour[FAKE__MAX_RANKS], split_key[FAKE__MAX_RANKS];
    struct pdp_cudak_nccl *split_out[FAKE__MAX_RANKS];
    pdp_status split_st;
} fake__clique;

struct pdp_cudak_nccl {
    fake__clique *q;
    int rank, dev;
    int64_t next;                             /* this rank's next collective number */
    int64_t slot_next;                        /* this rank's next event slot (mod SLOTS) */
    int64_t slot_seq[PDP_CUDAK_NCCL_SLOTS];   /* collective number behind each slot */
    /* point-to-point slots: done, and the header the receive got (tag, count) */
    char slot_p2p[PDP_CUDAK_NCCL_SLOTS], p2p_done[PDP_CUDAK_NCCL_SLOTS];
    char hdr_arrived[PDP_CUDAK_NCCL_SLOTS];
    int64_t hdr_tag[PDP_CUDAK_NCCL_SLOTS], hdr_count[PDP_CUDAK_NCCL_SLOTS];
};

static pthread_mutex_t fake__nccl_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t fake__nccl_cv = PTHREAD_COND_INITIALIZER;
static fake__clique *fake__cliques; /* those made by init_rank, found by id */
static int fake__next_id;

static const char *fake__coll_name(int kind)
{
    static const char *names[] = {"allreduce", "broadcast", "reduce_scatter", "allgather"};
    return kind == FAKE__BYTES_BCAST ? "broadcast_bytes" : kind >= 0 && kind < 4 ? names[kind] : "?";
}

static fake__clique *fake__clique_new(int nranks, const void *id)
{
    fake__clique *q = (fake__clique *)calloc(1, sizeof *q);
    int i;
    if (!q) return NULL;
    q->nranks = nranks;
    if (id) memcpy(q->id, id, sizeof q->id);
    for (i = 0; i < PDP_CUDAK_NCCL_SLOTS; i++) q->ops[i].seq = -1;
    return q;
}

static pdp_status fake__handle_new(pdp_cudak_nccl **out, fake__clique *q, int rank, int dev)
{
    pdp_cudak_nccl *h = (pdp_cudak_nccl *)calloc(1, sizeof *h);
    if (!h) return fake__fail(PDP_ERR_OUT_OF_MEMORY, "no host memory for an NCCL handle");
    h->q = q;
    h->rank = rank;
    h->dev = dev;
    q->refs++;
    *out = h;
    return PDP_OK;
}

/* Absolute deadline timeout_s from now (CLOCK_REALTIME, for pthread_cond_timedwait). */
static struct timespec fake__deadline(double timeout_s)
{
    struct timespec ts;
    double whole;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (timeout_s > 1e6) timeout_s = 1e6;
    whole = floor(timeout_s);
    ts.tv_sec += (time_t)whole;
    ts.tv_nsec += (long)((timeout_s - whole) * 1e9);
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

pdp_status pdp_cudak_nccl_unique_id(int dev, void *id)
{
    int n;
    FAKE__DEV(dev);
    pthread_mutex_lock(&fake__nccl_mu);
    n = ++fake__next_id;
    pthread_mutex_unlock(&fake__nccl_mu);
    memset(id, 0, PDP_CUDAK_NCCL_ID_BYTES);
    snprintf((char *)id, PDP_CUDAK_NCCL_ID_BYTES, "fake_cuda nccl id %d", n);
    return PDP_OK;
}

pdp_status pdp_cudak_nccl_init_rank(pdp_cudak_nccl **out, int dev, int nranks, int rank,
                                    const void *id, double timeout_s)
{
    struct timespec dl = fake__deadline(timeout_s);
    fake__clique *q;
    pdp_status st;
    int rc = 0;
    *out = NULL;
    FAKE__DEV(dev);
    if (nranks < 1 || nranks > FAKE__MAX_RANKS || rank < 0 || rank >= nranks)
        return fake__fail(PDP_ERR_CUDA, "ncclCommInitRank: rank %d of %d", rank, nranks);
    pthread_mutex_lock(&fake__nccl_mu);
    for (q = fake__cliques; q && memcmp(q->id, id, sizeof q->id) != 0; q = q->next) {
    }
    if (!q) {
        if (!(q = fake__clique_new(nranks, id))) {
            pthread_mutex_unlock(&fake__nccl_mu);
            return fake__fail(PDP_ERR_OUT_OF_MEMORY, "no host memory for an NCCL clique");
        }
        q->next = fake__cliques;
        fake__cliques = q;
    }
    if ((st = fake__handle_new(out, q, rank, dev)) != PDP_OK) {
        pthread_mutex_unlock(&fake__nccl_mu);
        return st;
    }
    q->joined++;
    pthread_cond_broadcast(&fake__nccl_cv);
    while (q->joined < q->nranks && rc == 0)
        rc = pthread_cond_timedwait(&fake__nccl_cv, &fake__nccl_mu, &dl);
    if (q->joined < q->nranks) {
        int joined = q->joined;
        pthread_mutex_unlock(&fake__nccl_mu);
        pdp_cudak_nccl_free(*out, 1);
        *out = NULL;
        return fake__fail(PDP_ERR_TIMEOUT, "ncclCommInitRank: %d of %d ranks joined within %g s "
                          "(the fake's NCCL connects the threads of one process only; process "
                          "ranks need a GPU: tests/gpu/run.sh)", joined, nranks, timeout_s);
    }
    pthread_mutex_unlock(&fake__nccl_mu);
    return PDP_OK;
}

pdp_status pdp_cudak_nccl_init_all(pdp_cudak_nccl **out, int ndev, const int *devs)
{
    fake__clique *q;
    int r;
    pdp_status st = PDP_OK;
    if (ndev < 1 || ndev > FAKE__MAX_RANKS)
        return fake__fail(PDP_ERR_CUDA, "ncclCommInitAll: %d devices", ndev);
    for (r = 0; r < ndev; r++) {
        out[r] = NULL;
        FAKE__DEV(devs[r]);
    }
    if (!(q = fake__clique_new(ndev, NULL)))
        return fake__fail(PDP_ERR_OUT_OF_MEMORY, "no host memory for an NCCL clique");
    pthread_mutex_lock(&fake__nccl_mu);
    q->joined = ndev;
    for (r = 0; r < ndev && st == PDP_OK; r++) st = fake__handle_new(&out[r], q, r, devs[r]);
    pthread_mutex_unlock(&fake__nccl_mu);
    if (st != PDP_OK) {
        for (r = 0; r < ndev; r++) pdp_cudak_nccl_free(out[r], 1), out[r] = NULL;
        if (q->refs == 0) free(q);
    }
    return st;
}

void pdp_cudak_nccl_free(pdp_cudak_nccl *h, int abort)
{
    fake__clique *q, **pp;
    if (!h) return;
    pthread_mutex_lock(&fake__nccl_mu);
    q = h->q;
    { /* its unmatched messages are withdrawn */
        fake__p2pmsg **pp = &q->msgs;
        while (*pp)
            if ((*pp)->h == h) {
                fake__p2pmsg *m = *pp;
                *pp = m->next;
                free(m);
            } else {
                pp = &(*pp)->next;
            }
    }
    if (abort) {
        q->aborted = 1;
        pthread_cond_broadcast(&fake__nccl_cv);
    }
    if (--q->refs == 0) {
        for (pp = &fake__cliques; *pp && *pp != q; pp = &(*pp)->next) {
        }
        if (*pp) *pp = q->next;
        free(q);
    }
    pthread_mutex_unlock(&fake__nccl_mu);
    free(h);
}

/* Runs op o of clique q (every rank has launched it). Caller holds the lock. */
static pdp_status fake__run(const fake__clique *q, const fake__op *o)
{
    int n = q->nranks, r, k;
    int64_t i, c = o->count;
    float *tmp;
    if (o->kind == FAKE__BYTES_BCAST) {
        for (r = 0; r < n; r++)
            if (r != o->op) memcpy(o->recv[r], o->send[o->op], (size_t)c);
        return PDP_OK;
    }
    if (o->kind == PDP_CUDAK_BROADCAST) {
        for (r = 0; r < n; r++)
            if (o->recv[r] != o->send[o->op]) memcpy(o->recv[r], o->send[o->op], F(c));
        return PDP_OK;
    }
    if (o->kind == PDP_CUDAK_ALLGATHER) {
        for (r = 0; r < n; r++)
            for (k = 0; k < n; k++) memcpy((float *)o->recv[r] + k * c, o->send[k], F(c));
        return PDP_OK;
    }
    if (o->dtype != 0) { /* 16-bit: widened, summed in fp32 in rank order, rounded once */
        int64_t total = o->kind == PDP_CUDAK_REDUCE_SCATTER ? c * n : c;
        uint16_t *h16 = (uint16_t *)malloc((size_t)total * 2 + 1);
        if (!h16) return fake__fail(PDP_ERR_OUT_OF_MEMORY, "no host memory for a reduction");
        for (i = 0; i < total; i++) {
            float acc = 0.0f;
            for (k = 0; k < n; k++) {
                uint16_t b = ((const uint16_t *)o->send[k])[i];
                float v = o->dtype == 1 ? pdp__bf16_float(b) : pdp__f16_float(b);
                acc = k == 0 ? v : acc + v;
            }
            if (o->op == 1) acc /= (float)n;
            h16[i] = o->dtype == 1 ? pdp__bf16_bits(acc) : pdp__f16_bits(acc);
        }
        for (r = 0; r < n; r++)
            memcpy(o->recv[r], h16 + (o->kind == PDP_CUDAK_REDUCE_SCATTER ? r * c : 0),
                   (size_t)c * 2);
        free(h16);
        return PDP_OK;
    }
    /* the reductions: the sum of every rank's contribution in rank order */
    if (!(tmp = (float *)malloc(F(o->kind == PDP_CUDAK_REDUCE_SCATTER ? c * n : c) + 1)))
        return fake__fail(PDP_ERR_OUT_OF_MEMORY, "no host memory for a reduction");
    for (i = 0; i < (o->kind == PDP_CUDAK_REDUCE_SCATTER ? c * n : c); i++) {
        float acc = ((const float *)o->send[0])[i];
        for (k = 1; k < n; k++) acc += ((const float *)o->send[k])[i];
        tmp[i] = o->op == 1 ? acc / (float)n : acc;
    }
    for (r = 0; r < n; r++)
        memcpy(o->recv[r], tmp + (o->kind == PDP_CUDAK_REDUCE_SCATTER ? r * c : 0), F(c));
    free(tmp);
    return PDP_OK;
}

/* Rank h's next collective: checks it against the other ranks', records it, and
   runs it when it is the last to arrive. *slot gets its slot. */
static pdp_status fake__launch(pdp_cudak_nccl *h, int kind, const void *send, void *recv,
                               int64_t count, int op, int dtype, int *slot)
{
    fake__clique *q = h->q;
    fake__op *o;
    int64_t s;
    pdp_status st = PDP_OK;
    pthread_mutex_lock(&fake__nccl_mu);
    s = h->next;
    o = &q->ops[s % PDP_CUDAK_NCCL_SLOTS];
    if (q->aborted) {
        st = fake__fail(PDP_ERR_COMM, "the NCCL communicator was aborted");
    } else if (o->seq > s || (o->seq >= 0 && o->seq < s && !o->done)) {
        st = fake__fail(PDP_ERR_CUDA, "rank %d: collective #%lld: more than %d collectives in "
                        "flight", h->rank, (long long)s, PDP_CUDAK_NCCL_SLOTS);
    } else if (o->seq == s && (o->kind != kind || o->count != count || o->op != op ||
                               o->dtype != dtype)) {
        st = fake__fail(PDP_ERR_CUDA, "rank %d: collective #%lld is %s of %lld (op %d) but "
                        "another rank launched %s of %lld (op %d): NCCL would hang or corrupt",
                        h->rank, (long long)s, fake__coll_name(kind), (long long)count, op,
                        fake__coll_name(o->kind), (long long)o->count, o->op);
    } else {
        if (o->seq != s) {
            memset(o, 0, sizeof *o);
            o->seq = s;
            o->kind = kind;
            o->count = count;
            o->op = op;
            o->dtype = dtype;
        }
        o->send[h->rank] = send;
        o->recv[h->rank] = recv;
        *slot = (int)(h->slot_next++ % PDP_CUDAK_NCCL_SLOTS);
        h->slot_seq[*slot] = s;
        h->slot_p2p[*slot] = 0;
        h->next++;
        if (++o->arrived == q->nranks) {
            st = fake__run(q, o);
            if (st != PDP_OK) q->aborted = 1;
            o->done = 1;
            pthread_cond_broadcast(&fake__nccl_cv);
        }
    }
    pthread_mutex_unlock(&fake__nccl_mu);
    return st;
}

pdp_status pdp_cudak_nccl_launch(pdp_cudak_nccl *h, pdp_cudak_coll kind, const void *send,
                                 void *recv, int64_t count, int op, int dtype, int *slot)
{
    int n = h->q->nranks;
    int64_t in = kind == PDP_CUDAK_REDUCE_SCATTER ? count * n : count;
    int64_t out = kind == PDP_CUDAK_ALLGATHER ? count * n : count;
    size_t es = dtype == 0 ? 4 : 2;
    *slot = -1;
    if ((int)kind < 0 || (int)kind > 3)
        return fake__fail(PDP_ERR_CUDA, "nccl_launch: unknown collective %d", (int)kind);
    if (dtype < 0 || dtype > 2 || (dtype != 0 && kind != PDP_CUDAK_ALLREDUCE &&
                                   kind != PDP_CUDAK_REDUCE_SCATTER))
        return fake__fail(PDP_ERR_CUDA, "nccl_launch: dtype %d for collective %d", dtype,
                          (int)kind);
    OWN(h->dev, send, (size_t)in * es);
    OWN(h->dev, recv, (size_t)out * es);
    return fake__launch(h, (int)kind, send, recv, count, op, dtype, slot);
}

/* 1 when the collective behind slot is done, 0 pending, -1 failed. Caller holds the lock. */
static int fake__state(const pdp_cudak_nccl *h, int slot)
{
    int64_t s = h->slot_seq[slot];
    const fake__op *o = &h->q->ops[s % PDP_CUDAK_NCCL_SLOTS];
    if (h->slot_p2p[slot]) return h->p2p_done[slot] ? 1 : h->q->aborted ? -1 : 0;
    if (o->seq > s || (o->seq == s && o->done)) return 1;
    return h->q->aborted ? -1 : 0;
}

int pdp_cudak_nccl_query(pdp_cudak_nccl *h, int slot)
{
    int r;
    if (slot < 0 || slot >= PDP_CUDAK_NCCL_SLOTS) return -1;
    pthread_mutex_lock(&fake__nccl_mu);
    r = fake__state(h, slot);
    pthread_mutex_unlock(&fake__nccl_mu);
    return r;
}

pdp_status pdp_cudak_nccl_wait(pdp_cudak_nccl *h, int slot, double timeout_s)
{
    struct timespec dl = fake__deadline(timeout_s);
    int r, rc = 0, arrived;
    if (slot < 0 || slot >= PDP_CUDAK_NCCL_SLOTS)
        return fake__fail(PDP_ERR_INVALID, "bad NCCL slot %d", slot);
    pthread_mutex_lock(&fake__nccl_mu);
    while ((r = fake__state(h, slot)) == 0 && rc == 0)
        rc = pthread_cond_timedwait(&fake__nccl_cv, &fake__nccl_mu, &dl);
    arrived = h->slot_p2p[slot] ? -1 : h->q->ops[h->slot_seq[slot] % PDP_CUDAK_NCCL_SLOTS].arrived;
    if (r == 0) {
        h->q->aborted = 1;
        pthread_cond_broadcast(&fake__nccl_cv);
    }
    pthread_mutex_unlock(&fake__nccl_mu);
    if (r == 1) return PDP_OK;
    if (r < 0)
        return fake__fail(PDP_ERR_COMM, "the NCCL communicator on device %d was aborted after an "
                          "earlier failure", h->dev);
    if (arrived < 0)
        return fake__fail(PDP_ERR_TIMEOUT, "a send/recv group did not complete within %g s on "
                          "device %d (its peer never posted the matching message?)", timeout_s,
                          h->dev);
    return fake__fail(PDP_ERR_TIMEOUT, "collective #%lld did not complete within %g s on device "
                      "%d: %d of %d ranks launched it (a rank missing or stuck?)",
                      (long long)h->slot_seq[slot], timeout_s, h->dev, arrived, h->q->nranks);
}

pdp_status pdp_cudak_nccl_broadcast_bytes(pdp_cudak_nccl *h, void *host, size_t bytes, int root,
                                          double timeout_s)
{
    pdp_status st;
    int slot;
    if (!bytes) return PDP_OK;
    if (fake__check_host("host", host, bytes)) return PDP_ERR_CUDA;
    if ((st = fake__launch(h, FAKE__BYTES_BCAST, host, host, (int64_t)bytes, root, 0, &slot)) !=
        PDP_OK)
        return st;
    return pdp_cudak_nccl_wait(h, slot, timeout_s);
}

/* ---- fake_cuda: NCCL point-to-point and split ----
   A message joins the clique's list and matches the first opposite message of
   the same (sender, receiver) pair, in launch order, as NCCL pairs them. Equal
   counts copy and complete both (each message on its own: the fake's launches
   never block, so grouping cannot matter here); the receiver's header records
   the sender's tag and count. Different counts are what NCCL would hang on:
   the header is recorded, and neither message ever completes. */

static void fake__p2p_match(fake__clique *q, fake__p2pmsg *m)
{
    fake__p2pmsg **pp, *o = NULL;
    for (pp = &q->msgs; *pp; pp = &(*pp)->next)
        if ((*pp)->src == m->src && (*pp)->dst == m->dst && (*pp)->is_send != m->is_send) {
            o = *pp;
            *pp = o->next;
            break;
        }
    if (!o) { /* append: launch order */
        for (pp = &q->msgs; *pp; pp = &(*pp)->next) {
        }
        m->next = NULL;
        *pp = m;
        return;
    }
    {
        fake__p2pmsg *snd = m->is_send ? m : o, *rcv = m->is_send ? o : m;
        rcv->h->hdr_arrived[rcv->slot] = 1;
        rcv->h->hdr_tag[rcv->slot] = snd->tag;
        rcv->h->hdr_count[rcv->slot] = snd->count;
        if (snd->count == rcv->count) {
            if (snd->count > 0 && rcv->buf != snd->buf) memmove(rcv->buf, snd->buf, F(snd->count));
            snd->h->p2p_done[snd->slot] = 1;
            rcv->h->p2p_done[rcv->slot] = 1;
        }
        free(snd);
        free(rcv);
    }
    pthread_cond_broadcast(&fake__nccl_cv);
}

pdp_status pdp_cudak_nccl_p2p(pdp_cudak_nccl *h, pdp_cudak_p2p *ops, int n, double timeout_s)
{
    int i;
    (void)timeout_s;
    for (i = 0; i < n; i++) {
        ops[i].slot = -1;
        if (ops[i].peer < 0 || ops[i].peer >= h->q->nranks || ops[i].count < 0)
            return fake__fail(PDP_ERR_CUDA, "nccl_p2p: peer %d of %d, count %lld", ops[i].peer,
                              h->q->nranks, (long long)ops[i].count);
        if (ops[i].count > 0) OWN(h->dev, ops[i].buf, F(ops[i].count));
    }
    pthread_mutex_lock(&fake__nccl_mu);
    if (h->q->aborted) {
        pthread_mutex_unlock(&fake__nccl_mu);
        return fake__fail(PDP_ERR_COMM, "the NCCL communicator was aborted");
    }
    for (i = 0; i < n; i++) {
        fake__p2pmsg *m = (fake__p2pmsg *)calloc(1, sizeof *m);
        int s = (int)(h->slot_next++ % PDP_CUDAK_NCCL_SLOTS);
        if (!m) {
            h->q->aborted = 1;
            pthread_mutex_unlock(&fake__nccl_mu);
            return fake__fail(PDP_ERR_OUT_OF_MEMORY, "no host memory for a message");
        }
        h->slot_p2p[s] = 1;
        h->p2p_done[s] = 0;
        h->hdr_arrived[s] = 0;
        m->h = h;
        m->slot = s;
        m->is_send = ops[i].is_send;
        m->src = ops[i].is_send ? h->rank : ops[i].peer;
        m->dst = ops[i].is_send ? ops[i].peer : h->rank;
        m->tag = ops[i].tag;
        m->count = ops[i].count;
        m->buf = ops[i].buf;
        ops[i].slot = s;
        fake__p2p_match(h->q, m);
    }
    pthread_mutex_unlock(&fake__nccl_mu);
    return PDP_OK;
}

pdp_status pdp_cudak_nccl_p2p_header(pdp_cudak_nccl *h, int slot, int *arrived, int64_t *tag,
                                     int64_t *count)
{
    *arrived = 0;
    if (slot < 0 || slot >= PDP_CUDAK_NCCL_SLOTS)
        return fake__fail(PDP_ERR_INVALID, "bad NCCL slot %d", slot);
    pthread_mutex_lock(&fake__nccl_mu);
    if (h->slot_p2p[slot] && h->hdr_arrived[slot]) {
        *arrived = 1;
        *tag = h->hdr_tag[slot];
        *count = h->hdr_count[slot];
    }
    pthread_mutex_unlock(&fake__nccl_mu);
    return PDP_OK;
}

/* ncclCommSplit: the last rank to arrive makes every new clique and handle, ranked by
   (key, old rank); each rank takes its own; the next split waits until all have. */
pdp_status pdp_cudak_nccl_split(pdp_cudak_nccl *h, int colour, int key, pdp_cudak_nccl **out,
                                double timeout_s)
{
    struct timespec dl = fake__deadline(timeout_s);
    fake__clique *q = h->q;
    int n = q->nranks, rc = 0, r, i;
    pdp_status st;
    *out = NULL;
    pthread_mutex_lock(&fake__nccl_mu);
    while (q->split_busy && !q->aborted && rc == 0)
        rc = pthread_cond_timedwait(&fake__nccl_cv, &fake__nccl_mu, &dl);
    if (q->aborted || rc != 0) {
        pthread_mutex_unlock(&fake__nccl_mu);
        return fake__fail(q->aborted ? PDP_ERR_COMM : PDP_ERR_TIMEOUT, "ncclCommSplit: the "
                          "communicator was aborted, or an earlier split is still being taken");
    }
    q->split_colour[h->rank] = colour;
    q->split_key[h->rank] = key;
    if (++q->split_arrived == n) {
        q->split_st = PDP_OK;
        for (r = 0; r < n; r++) q->split_out[r] = NULL;
        for (r = 0; r < n && q->split_st == PDP_OK; r++) {
            int size = 0;
            fake__clique *nq;
            if (q->split_colour[r] < 0 || q->split_out[r]) continue;
            for (i = 0; i < n; i++)
                if (q->split_colour[i] == q->split_colour[r]) size++;
            if (!(nq = fake__clique_new(size, NULL))) {
                q->split_st = fake__fail(PDP_ERR_OUT_OF_MEMORY, "no memory for a split clique");
                break;
            }
            nq->joined = size;
            for (i = 0; i < n; i++) { /* each member's rank: its place by (key, old rank) */
                int j, nr = 0;
                if (q->split_colour[i] != q->split_colour[r]) continue;
                for (j = 0; j < n; j++)
                    if (q->split_colour[j] == q->split_colour[r] &&
                        (q->split_key[j] < q->split_key[i] ||
                         (q->split_key[j] == q->split_key[i] && j < i)))
                        nr++;
                if ((st = fake__handle_new(&q->split_out[i], nq, nr, -1)) != PDP_OK) {
                    q->split_st = st;
                    break;
                }
            }
        }
        q->split_busy = 1;
        q->split_taken = 0;
        pthread_cond_broadcast(&fake__nccl_cv);
    } else {
        rc = 0;
        while (!q->split_busy && !q->aborted && rc == 0)
            rc = pthread_cond_timedwait(&fake__nccl_cv, &fake__nccl_mu, &dl);
        if (!q->split_busy) {
            int arrived = q->split_arrived;
            pthread_mutex_unlock(&fake__nccl_mu);
            return fake__fail(q->aborted ? PDP_ERR_COMM : PDP_ERR_TIMEOUT, "ncclCommSplit: %d of "
                              "%d ranks called it within %g s", arrived, n, timeout_s);
        }
    }
    st = q->split_st;
    *out = q->split_out[h->rank];
    if (*out) (*out)->dev = h->dev;
    q->split_out[h->rank] = NULL;
    if (++q->split_taken == n) {
        q->split_busy = 0;
        q->split_arrived = 0;
        pthread_cond_broadcast(&fake__nccl_cv);
    }
    pthread_mutex_unlock(&fake__nccl_mu);
    if (st != PDP_OK) {
        pdp_cudak_nccl_free(*out, 1);
        *out = NULL;
        return fake__fail(st, "ncclCommSplit: no memory for the new communicators");
    }
    return PDP_OK;
}
