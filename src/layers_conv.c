/* layers_conv: the image layers, Conv2d and MaxPool2d, kind by kind as in
   layers.c (setup, init, CPU forward and backward, CUDA entries), listed in
   layers_table.c. Uses layers.c's helpers (sums, batch parts, Kaiming init).

   Conventions (PyTorch's):
   - Conv2d: samples (C, H, W), W [O, C, k, k], b [O], square kernel, zero
     padding, output (O, Ho, Wo) with Ho = (H + 2 pad - k) / stride + 1. Computed
     by im2col + GEMM (Chellapilla et al., "High performance convolutional neural
     networks for document processing", 2006) on cache-sized chunks of samples:
     forward y = W col, backward dW = dy col^T and dcol = W^T dy, then col2im
     (details in "layers: Conv2d").
   - MaxPool2d: square window, no padding, floor output size; the first maximum
     in row-major window order wins ties, NaN wins over numbers (as PyTorch's CPU
     kernel). The winning index is saved as an int32 in the saved floats' memory.
   - A ReLU right after a Conv2d on the CPU is a view (PDP__LAYER_FUSES_RELU): the
     Conv2d applies it (io->fused_relu: forward stores relu(y), backward masks dy
     by y > 0 as it gathers dy), which saves two passes over the largest
     activations and gives the same bits. When a 2x2 stride-2 MaxPool2d follows
     that ReLU (even H and W), the Conv2d applies it too (io->pool_y): forward
     pools two rows of products at a time, each value through the bias and the
     ReLU, into the pool's output and winners (pdp__conv_pool_2x2); backward
     gathers the pool's dy, masked by the pooled value > 0, at each window's
     winner and zeros elsewhere (pdp__conv_unpool_2x2). The full-size output is
     never written, nor read back by the pool, nor its gradient written and read
     (model.c skips the MaxPool2d; same bits).

   Invariants: layers.c's (nothing allocated; dw, db accumulated; dx written, or
   skipped when NULL; fixed reduction order whatever the thread count). */

#include "internal.h"

/* ---- layers: pooling rows (MaxPool2d, and Conv2d's fused pool) ----
   One output row at a time: y and the winner's index (an int32 in the saved
   floats' memory, an offset into the sample's channel plane) start at the
   window's first element and are updated element by element in PyTorch's order
   (ki, then kj): an element replaces the current one when it is greater or NaN,
   so ties keep the first maximum and a NaN wins. The loops run in blocks of 16,
   8 and 4 columns, the remainder as the last 4 columns once more (an update is
   idempotent): constant trip counts, which gcc -O2 vectorises (its cheap cost
   model skips loops that would need a scalar epilogue) into selects instead of
   the branches a scalar loop gets, which mispredict on the half zeros a ReLU
   leaves. (The conditions are spelled out in each select on purpose: gcc 12
   vectorises that form, not an int flag computed once; 10x here.) */
#define PDP__POOL_BLOCKS(...)                                                                  \
    do {                                                                                       \
        for (; ow + 16 <= n; ow += 16)                                                         \
            for (j = 0; j < 16; j++) __VA_ARGS__                                               \
        for (; ow + 8 <= n; ow += 8)                                                           \
            for (j = 0; j < 8; j++) __VA_ARGS__                                                \
        for (; ow + 4 <= n; ow += 4)                                                           \
            for (j = 0; j < 4; j++) __VA_ARGS__                                                \
        if (ow < n && n >= 4) /* the last 4 again: both bodies are idempotent */              \
            for (ow = n - 4, j = 0; j < 4; j++) __VA_ARGS__                                    \
        else                                                                                   \
            for (; ow < n; ow++)                                                               \
                for (j = 0; j < 1; j++) __VA_ARGS__                                            \
    } while (0)

/* Window element (ki, kj) against the running maximum of n outputs. */
PDP__PRIVATE void pdp__maxpool_update(const float *PDP__RESTRICT src, int32_t st, int64_t n,
                                      float *PDP__RESTRICT y, int32_t *PDP__RESTRICT arg,
                                      int32_t at)
{
    int64_t ow = 0;
    int j;
    PDP__POOL_BLOCKS({
        int32_t o = (int32_t)ow + j;
        float v = src[o * st], m = y[o];
        y[o] = (v > m || v != v) ? v : m;
        arg[o] = (v > m || v != v) ? at + o * st : arg[o];
    });
}

/* The common 2 x 2 window with stride 2: the two elements of each input row,
   then the two rows. Same result as the element-by-element order: the second
   row's winner replaces the first's only when greater or NaN. The window of
   output o is (a, b) over (c, d); at is row 0's offset, w the row stride. */
#define PDP__POOL_2X2_WINDOW(a, b, c, d)                                                       \
    do {                                                                                       \
        float m0 = (b > a || b != b) ? b : a, m1 = (d > c || d != d) ? d : c;                  \
        int32_t i0 = (b > a || b != b) ? at + 2 * o + 1 : at + 2 * o;                          \
        int32_t i1 = (d > c || d != d) ? at + w + 2 * o + 1 : at + w + 2 * o;                  \
        int t = (m1 > m0 || m1 != m1);                                                         \
        y[o] = t ? m1 : m0;                                                                    \
        arg[o] = t ? i1 : i0;                                                                  \
    } while (0)

PDP__PRIVATE void pdp__maxpool_2x2(const float *PDP__RESTRICT r0, const float *PDP__RESTRICT r1,
                                   int64_t n, float *PDP__RESTRICT y, int32_t *PDP__RESTRICT arg,
                                   int32_t at, int32_t w)
{
    int64_t ow = 0;
    int j;
    PDP__POOL_BLOCKS({
        int32_t o = (int32_t)ow + j;
        float a = r0[2 * o], b = r0[2 * o + 1], c = r1[2 * o], d = r1[2 * o + 1];
        PDP__POOL_2X2_WINDOW(a, b, c, d);
    });
}

/* Conv2d's fused pool: the windows of two rows of products, each value through the
   bias and the ReLU first; the bits of pdp__maxpool_2x2 on the stored rows. */
PDP__PRIVATE void pdp__conv_pool_2x2(const float *PDP__RESTRICT r0, const float *PDP__RESTRICT r1,
                                     float bo, int64_t n, float *PDP__RESTRICT y,
                                     int32_t *PDP__RESTRICT arg, int32_t at, int32_t w)
{
    int64_t ow = 0;
    int j;
    PDP__POOL_BLOCKS({
        int32_t o = (int32_t)ow + j;
        float a = pdp__relu(r0[2 * o] + bo), b = pdp__relu(r0[2 * o + 1] + bo);
        float c = pdp__relu(r1[2 * o] + bo), d = pdp__relu(r1[2 * o + 1] + bo);
        PDP__POOL_2X2_WINDOW(a, b, c, d);
    });
}

/* The common 2 x 2 window with stride 2 tiling the plane exactly: each window's
   four dx written at once, the output's gradient g at its winner and zeros elsewhere
   (no memset, no scatter; in PDP__POOL_BLOCKS, whose selects gcc vectorises); with
   keep false, zeros only. */
#define PDP__UNPOOL_2X2_WINDOW(g, keep)                                                        \
    do {                                                                                       \
        int32_t a = (keep) ? arg[o] - at - 2 * o : -1;                                         \
        d0[2 * o] = a == 0 ? g : 0.0f;                                                         \
        d0[2 * o + 1] = a == 1 ? g : 0.0f;                                                     \
        d1[2 * o] = a == w ? g : 0.0f;                                                         \
        d1[2 * o + 1] = a == w + 1 ? g : 0.0f;                                                 \
    } while (0)

PDP__PRIVATE void pdp__maxpool_2x2_backward(const float *PDP__RESTRICT dy,
                                            const int32_t *PDP__RESTRICT arg, int64_t n, int32_t at,
                                            int32_t w, float *PDP__RESTRICT d0,
                                            float *PDP__RESTRICT d1)
{
    int64_t ow = 0;
    int j;
    PDP__POOL_BLOCKS({
        int32_t o = (int32_t)ow + j;
        float g = dy[o];
        PDP__UNPOOL_2X2_WINDOW(g, 1);
    });
}

/* Conv2d's fused pool, backward: the pool's dy through the ReLU's backward (the
   ReLU's output at the winner is the pooled value yp), then to the winner. */
PDP__PRIVATE void pdp__conv_unpool_2x2(const float *PDP__RESTRICT dy, const float *PDP__RESTRICT yp,
                                       const int32_t *PDP__RESTRICT arg, int64_t n, int32_t at,
                                       int32_t w, float *PDP__RESTRICT d0, float *PDP__RESTRICT d1)
{
    int64_t ow = 0;
    int j;
    PDP__POOL_BLOCKS({
        int32_t o = (int32_t)ow + j;
        float g = dy[o], yj = yp[o];
        PDP__UNPOOL_2X2_WINDOW(g, !(yj <= 0.0f)); /* pdp__relu_grad's test, as a select
                                                      gcc -O2 vectorises */
    });
}

/* ---- layers: Conv2d ----
   Two paths, both cutting the batch into chunks of `per_chunk` samples, a number
   that depends on the layer's geometry only (so do the results). The intra-op
   threads take whole chunks, each thread reusing one scratch region; each chunk
   leaves its shares of dW and db apart, and backward adds them up in chunk order
   after all chunks are done.

   Implicit GEMM (stride 1, padding <= k - 1; the common case). The n samples of a
   chunk are laid side by side in one zero-padded image, rows of
   Wt = n (W + pad) + pad floats (sample j's columns start at pad + j (W + pad): one
   band of `pad` zeros between neighbours is enough for both of them). Output columns
   are counted on that wide grid, Ho x Wt, so that row (c, ki, kj) of the chunk's
   column matrix is ONE contiguous run of the padded image (Ho Wt floats from
   (c, ki, kj)), and the GEMM packs those runs straight from the image through a
   row-offset table (pdp__sgemm_rows): the column matrix is never written. Per chunk:
     forward   grid [O, Ho Wt] = W [O, C k k] col;  y = each sample's Wo columns + b
     dW share  = dy_grid [O, Ho Wt] col^T           (dy_grid zero in the other columns)
     dx        = the forward convolution of dy, zero-padded by q = k - 1 - pad (laid
                 out the same way, bands of q), with the flipped, transposed weights
                 W'[c, (o, qi, qj)] = W[o, c, k-1-qi, k-1-qj] (Dumoulin and Visin, "A
                 guide to convolution arithmetic for deep learning", 2016, section 4):
                 no col2im.
   For a "same" convolution (q == pad) the padded dy's interior is dy on the grid,
   so the dW share reads it in place. When it makes fewer padded GEMM tiles (O small
   next to C k k), the share is computed transposed, share^T = col dy^T, with the
   column matrix as a gathered A (pdp__sgemm_arows) and summed back transposed. With
   few weights (conv 1 -> 16, k 5: 400) it is O C k k dot products over the grid
   (pdp__sgemm_dots): nothing packed, where packing cost more than the products.
   The grid's columns over the bands compute values nobody reads: pad / (W + pad) more
   GEMM work (12% for a 5x5 "same" convolution on 14x14) for no copies at all. In the dW
   share their dy is 0, which a NaN or an infinity of x there turns into NaN: a share that
   is not finite is summed again over the samples' own columns (pdp__conv_implicit_dw_exact),
   so that it holds them where PyTorch's does and nowhere else.

   im2col (any other stride or padding, and PDP_CBLAS builds): the column matrix
   [C k k, n] of a chunk is materialised with exact Wo columns (Chellapilla et al.,
   "High performance convolutional neural networks for document processing",
   2006): forward y = W col; backward dW = dy col^T and dcol = W^T dy, then col2im.
   Chunks of about PDP__CONV_CHUNK_FLOATS column floats keep a chunk in L2.

   bf16 (io->bf16, pdp_model_desc.precision): the products' inputs are rounded to bf16
   and summed in fp32. im2col: its GEMMs are pdp_gemm_bf16. Implicit, on AVX512-BF16 or
   AMX (PDP__CONV_BF16_PATH: the path AUTO takes for the forward product,
   pdp_bf16_path_for; job->packed16): forward, dx and the dW share are
   pdp__gemm_bf16_rows_h / _arows_h (gemm_bf16.c) through the offset tables (band
   columns included: no _runs variant), on the padded image and padded dy first
   converted to bf16 words in place (pdp__gemm_bf16_convert: each value once, not once
   per kernel tap; the padded dy after the dW share, which reads it as floats in a
   "same" convolution); the packing rounds dy for the dW share and W, W'; only the dW
   dot products (dw_dots, conv 1 -> 16) stay fp32 kernels, on the padded image rounded
   as it is copied in and the grid's dy rounded in db's sum pass (db from the unrounded
   values). On the sgemm-rounded and the emulated paths the fp32 kernels multiply
   bf16-rounded inputs exactly and sum in fp32 (pdp_gemm_bf16's sgemm-rounded arithmetic;
   the emulated path's chain is not run here): the padded image is rounded as it is
   copied in (pdp__conv_copy2d_bf16), the grid's dy in db's sum pass (pdp__conv_sum_bf16:
   in a "same" convolution the grid is the padded dy's interior, which holds all of dy),
   the padded dy apart otherwise, W' when it is built, and W for forward into the
   workspace's fixed region (free in forward). Either way the bits depend on the geometry
   and the path, not on the thread count. */

#ifndef PDP__CONV_CHUNK_FLOATS
#  define PDP__CONV_CHUNK_FLOATS PDP__TEST_KNOB(conv_chunk_floats, 65536)
#endif
/* Samples per chunk on the implicit path: wide GEMMs and few dW shares, and still
   8 chunks for each of two threads at batch 128. */
#ifndef PDP__CONV_IMPLICIT_CHUNK
#  define PDP__CONV_IMPLICIT_CHUNK PDP__TEST_KNOB(conv_implicit_chunk, 8)
#endif

/* Implicit path in bf16: the pdp_bf16_path of the products, the one AUTO takes for the
   forward product's shape (test_bf16 sets its knob to run the emulated path on a CPU with
   a faster one). */
#ifndef PDP__CONV_BF16_PATH
#  define PDP__CONV_BF16_PATH()                                                               \
      ((pdp_bf16_path)PDP__TEST_KNOB(conv_bf16_path,                                           \
                                     pdp_bf16_path_for(PDP_NO_TRANS, PDP_NO_TRANS, job->g.O,   \
                                                       job->g.Ho * job->g.Wo, job->g.ckk)))
#endif

/* Implicit path: products of at least this depth (C k k forward, O k k for dx)
   skip the band columns (pdp__sgemm_runs); shallower ones (conv 1 -> 16, k 5: 25)
   cost less computing the bands than setting up the runs' masked loads. */
#ifndef PDP__CONV_RUNS_MIN_K
#  define PDP__CONV_RUNS_MIN_K 128
#endif

typedef struct pdp__conv_geom {
    int64_t C, H, W, O, k, stride, pad, Ho, Wo;
    int64_t ckk;            /* rows of the column matrix */
    int implicit;           /* the implicit-GEMM path */
    int64_t Hp, q, Hq;      /* implicit: padded heights of x (by pad) and of dy (by q) */
    int64_t cols;           /* im2col: output columns per sample, Ho Wo */
    int64_t fixed;          /* workspace floats before the shares: W' (implicit) */
    int64_t share;          /* floats of one chunk's dW and db shares */
    int64_t per_chunk;      /* samples per chunk */
    int dw_t;               /* implicit: the dW share is computed and kept transposed,
                               [C k k, O] (fewer padded GEMM tiles, A read in place) */
    int dw_dots;            /* implicit: few weights (conv 1 -> 16, k 5), the dW share as
                               O C k k dot products (pdp__sgemm_dots, nothing packed) */
} pdp__conv_geom;

/* Workspace regions start on 64-byte boundaries (the offset tables are int64). */
PDP__PRIVATE int64_t pdp__conv_round16(int64_t floats) { return (floats + 15) / 16 * 16; }

PDP__PRIVATE pdp__conv_geom pdp__conv_geom_of(const pdp__layer *l)
{
    pdp__conv_geom g;
    g.C = l->in_shape[0];
    g.H = l->in_shape[1];
    g.W = l->in_shape[2];
    g.O = l->out_features;
    g.k = l->kernel;
    g.stride = l->stride;
    g.pad = l->padding;
    g.Ho = l->out_shape[1];
    g.Wo = l->out_shape[2];
    g.ckk = g.C * g.k * g.k;
#if defined(PDP_CBLAS)
    g.implicit = 0;
#else
    g.implicit = g.stride == 1 && g.pad <= g.k - 1;
#endif
    g.Hp = g.H + 2 * g.pad;
    g.q = g.k - 1 - g.pad;
    g.Hq = g.Ho + 2 * g.q;
    g.cols = g.Ho * g.Wo;
    g.share = pdp__conv_round16(g.O * g.ckk + g.O);
    g.dw_dots = g.implicit && pdp__sgemm_dots_fits(g.O, g.ckk);
    g.dw_t = g.implicit && !g.dw_dots && pdp__gemm_tiles(g.ckk, g.O) < pdp__gemm_tiles(g.O, g.ckk);
    if (g.implicit) {
        g.fixed = pdp__conv_round16(g.C * g.O * g.k * g.k);
        g.per_chunk = PDP__CONV_IMPLICIT_CHUNK;
    } else {
        g.fixed = 0;
        g.per_chunk = PDP__MAX(1, PDP__CONV_CHUNK_FLOATS / (g.ckk * g.cols));
    }
    return g;
}

/* Implicit path, a chunk of n samples: row widths of the padded image and padded dy. */
PDP__PRIVATE int64_t pdp__conv_wt(const pdp__conv_geom *g, int64_t n)
{
    return n * (g->W + g->pad) + g->pad;
}
PDP__PRIVATE int64_t pdp__conv_wqt(const pdp__conv_geom *g, int64_t n)
{
    return n * (g->Wo + g->q) + g->q;
}

/* Floats of one part's scratch for chunks of at most n samples. Implicit: the two
   offset tables (int64), the padded image and padded dy (the last run of each starts
   at (C - 1, k - 1, k - 1) and ends k - 1 floats past it: + k), and the grid that
   holds the output, dy, then dx. im2col: the column matrix and O rows as long. */
PDP__PRIVATE int64_t pdp__conv_scratch(const pdp__conv_geom *g, int64_t n)
{
    int64_t okk = g->O * g->k * g->k;
    if (!g->implicit) return pdp__conv_round16(n * (g->ckk + g->O) * g->cols);
    return pdp__conv_round16(
        2 * (g->ckk + okk) + g->C * g->Hp * pdp__conv_wt(g, n) + g->k +
        g->O * g->Hq * pdp__conv_wqt(g, n) + g->k +
        PDP__MAX(g->O * g->Ho * pdp__conv_wt(g, n), g->C * g->H * pdp__conv_wqt(g, n)));
}

/* Per sample: W' (once is enough; simpler per sample), one share, and twice a
   one-sample scratch. Enough: chunks <= batch, and scratch(n) <= n scratch(1) (each
   term is affine with a non-negative constant, and the rounding keeps it), so the parts' scratch
   for chunks of cap samples is at most chunks cap scratch(1) <= (batch + cap - 1) scratch(1). */
PDP__PRIVATE int64_t pdp__conv_work_per_sample(const pdp__layer *l)
{
    pdp__conv_geom g = pdp__conv_geom_of(l);
    return g.fixed + g.share + 2 * pdp__conv_scratch(&g, 1);
}


/* Output columns [*lo, *hi) whose input column ow * stride - pad + kj is inside
   [0, W). */
PDP__PRIVATE void pdp__conv_valid(int64_t W, int64_t Wo, int64_t stride, int64_t pad, int64_t kj,
                                  int64_t *lo, int64_t *hi)
{
    int64_t off = pad - kj; /* iw = ow * stride - off */
    *lo = off > 0 ? (off + stride - 1) / stride : 0;
    *hi = (W - 1 + off) >= 0 ? (W - 1 + off) / stride + 1 : 0;
    if (*hi > Wo) *hi = Wo;
    if (*lo > *hi) *lo = *hi;
}

/* One sample's columns into col (row stride ld): row (c, ki, kj), column
   oh * Wo + ow holds x[c, oh s - pad + ki, ow s - pad + kj], zero outside the
   input. */
PDP__PRIVATE void pdp__im2col(const pdp__conv_geom *g, const float *PDP__RESTRICT x,
                              float *PDP__RESTRICT col, int64_t ld)
{
    int64_t c, ki, kj, oh, ow, ih;
    for (c = 0; c < g->C; c++)
        for (ki = 0; ki < g->k; ki++)
            for (kj = 0; kj < g->k; kj++) {
                float *dst = col + ((c * g->k + ki) * g->k + kj) * ld;
                int64_t lo, hi;
                pdp__conv_valid(g->W, g->Wo, g->stride, g->pad, kj, &lo, &hi);
                for (oh = 0; oh < g->Ho; oh++, dst += g->Wo) {
                    int64_t row;
                    ih = oh * g->stride - g->pad + ki;
                    if (ih < 0 || ih >= g->H) {
                        memset(dst, 0, (size_t)g->Wo * sizeof(float));
                        continue;
                    }
                    row = (c * g->H + ih) * g->W + kj - g->pad; /* + ow * stride: in range */
                    for (ow = 0; ow < lo; ow++) dst[ow] = 0.0f;
                    for (ow = lo; ow < hi; ow++) dst[ow] = x[row + ow * g->stride];
                    for (ow = hi; ow < g->Wo; ow++) dst[ow] = 0.0f;
                }
            }
}

/* dx of one sample = the sum of its columns' entries over the positions they were
   copied from, in row order (a fixed summation order). */
PDP__PRIVATE void pdp__col2im(const pdp__conv_geom *g, const float *PDP__RESTRICT col, int64_t ld,
                              float *PDP__RESTRICT dx)
{
    int64_t c, ki, kj, oh, ow, ih;
    memset(dx, 0, (size_t)(g->C * g->H * g->W) * sizeof(float));
    for (c = 0; c < g->C; c++)
        for (ki = 0; ki < g->k; ki++)
            for (kj = 0; kj < g->k; kj++) {
                const float *src = col + ((c * g->k + ki) * g->k + kj) * ld;
                int64_t lo, hi;
                pdp__conv_valid(g->W, g->Wo, g->stride, g->pad, kj, &lo, &hi);
                for (oh = 0; oh < g->Ho; oh++, src += g->Wo) {
                    int64_t row;
                    ih = oh * g->stride - g->pad + ki;
                    if (ih < 0 || ih >= g->H) continue;
                    row = (c * g->H + ih) * g->W + kj - g->pad;
                    for (ow = lo; ow < hi; ow++) dx[row + ow * g->stride] += src[ow];
                }
            }
}

/* planes x rows x n floats from src (plane stride sp, row stride sr) into dst
   (plane stride dp, row stride dr). */
PDP__PRIVATE void pdp__conv_copy2d(const float *src, int64_t sp, int64_t sr, float *dst, int64_t dp,
                                   int64_t dr, int64_t planes, int64_t rows, int64_t n)
{
    int64_t p, r;
    for (p = 0; p < planes; p++)
        for (r = 0; r < rows; r++)
            memcpy(dst + p * dp + r * dr, src + p * sp + r * sr, (size_t)n * sizeof(float));
}

/* The same, each value rounded to bf16 as it is copied (pdp__bf16_round_u32's bits; a row
   is one to two 16-lane vectors with AVX-512): the padded image in bf16 on the fp32
   kernels, without a pass over it (its bands and padding are zeros). */
PDP__PRIVATE void pdp__conv_copy2d_bf16(const float *src, int64_t sp, int64_t sr, float *dst,
                                        int64_t dp, int64_t dr, int64_t planes, int64_t rows,
                                        int64_t n)
{
    int64_t p, r;
    for (p = 0; p < planes; p++)
        for (r = 0; r < rows; r++)
            pdp__gemm_copy(dst + p * dp + r * dr, src + p * sp + r * sr, (int)n, 1);
}

/* `body` for j in [0, n) of a short row (an image row: 28, 14 or 7 floats) in
   blocks of 16, 8 and 4, the remainder as the last 4 once more: constant trip
   counts, which gcc -O2 vectorises where PDP__FOR_BLOCKED's scalar tail would
   carry most of such a row. The body must be idempotent (write what it reads
   elsewhere). */
#define PDP__CONV_ROW(j, n, ...)                                                               \
    do {                                                                                       \
        int64_t pdp__o_ = 0, pdp__n_ = (n);                                                    \
        int pdp__k_;                                                                           \
        for (; pdp__o_ + 16 <= pdp__n_; pdp__o_ += 16)                                         \
            for (pdp__k_ = 0; pdp__k_ < 16; pdp__k_++) {                                       \
                int64_t j = pdp__o_ + pdp__k_;                                                 \
                __VA_ARGS__                                                                    \
            }                                                                                  \
        for (; pdp__o_ + 8 <= pdp__n_; pdp__o_ += 8)                                           \
            for (pdp__k_ = 0; pdp__k_ < 8; pdp__k_++) {                                        \
                int64_t j = pdp__o_ + pdp__k_;                                                 \
                __VA_ARGS__                                                                    \
            }                                                                                  \
        for (; pdp__o_ + 4 <= pdp__n_; pdp__o_ += 4)                                           \
            for (pdp__k_ = 0; pdp__k_ < 4; pdp__k_++) {                                        \
                int64_t j = pdp__o_ + pdp__k_;                                                 \
                __VA_ARGS__                                                                    \
            }                                                                                  \
        if (pdp__o_ < pdp__n_ && pdp__n_ >= 4)                                                 \
            pdp__o_ = pdp__n_ - 4;                                                             \
        if (pdp__o_ < pdp__n_ && pdp__n_ >= 4)                                                 \
            for (pdp__k_ = 0; pdp__k_ < 4; pdp__k_++) {                                        \
                int64_t j = pdp__o_ + pdp__k_;                                                 \
                __VA_ARGS__                                                                    \
            }                                                                                  \
        else                                                                                   \
            for (; pdp__o_ < pdp__n_; pdp__o_++) {                                             \
                int64_t j = pdp__o_;                                                           \
                __VA_ARGS__                                                                    \
            }                                                                                  \
    } while (0)

/* d = dy masked by y > 0 (the fused ReLU's backward), one row. */
PDP__PRIVATE void pdp__conv_relu_grad_row(const float *PDP__RESTRICT g,
                                          const float *PDP__RESTRICT y, float *PDP__RESTRICT d,
                                          int64_t n)
{
    PDP__CONV_ROW(j, n, {
        float gj = g[j], yj = y[j]; /* both loaded first: gcc -O2 then vectorises */
        d[j] = pdp__relu_grad(gj, yj);
    });
}

/* One sample's dy, [O, Ho, Wo], into dst (plane stride dp, row stride dr); with a
   fused ReLU, masked by the layer's output y (same layout as dy): the ReLU's
   backward, done on the way. With a fused pool, dy is the pool's [O, Ho/2, Wo/2],
   masked by the pooled y > 0 and written at each window's winner, zeros elsewhere:
   the pool's backward and the ReLU's (pdp__conv_unpool_2x2). */
PDP__PRIVATE void pdp__conv_copy_dy(const pdp__layer_io *io, int64_t s, const pdp__layer *l,
                                    float *dst, int64_t dp, int64_t dr)
{
    int64_t O = l->out_shape[0], Ho = l->out_shape[1], Wo = l->out_shape[2], p, r;
    if (io->pool_y) {
        int64_t Hp = Ho / 2, Wp = Wo / 2;
        for (p = 0; p < O; p++)
            for (r = 0; r < Hp; r++) {
                int64_t at = ((s * O + p) * Hp + r) * Wp;
                float *d0 = dst + p * dp + 2 * r * dr;
                pdp__conv_unpool_2x2(io->dy + at, io->pool_y + at, io->pool_arg + at, Wp,
                                     (int32_t)(2 * r * Wo), (int32_t)Wo, d0, d0 + dr);
            }
        return;
    }
    if (!io->fused_relu) {
        pdp__conv_copy2d(io->dy + s * l->out_count, Ho * Wo, Wo, dst, dp, dr, O, Ho, Wo);
        return;
    }
    for (p = 0; p < O; p++)
        for (r = 0; r < Ho; r++) {
            const float *PDP__RESTRICT g = io->dy + s * l->out_count + (p * Ho + r) * Wo;
            const float *PDP__RESTRICT y = io->y + s * l->out_count + (p * Ho + r) * Wo;
            float *PDP__RESTRICT d = dst + p * dp + r * dr;
            pdp__conv_relu_grad_row(g, y, d, Wo);
        }
}

/* Row n of y = src + bias, through the fused ReLU when there is one. */
PDP__PRIVATE void pdp__conv_store_row(const float *PDP__RESTRICT src, float bo, bool relu,
                                      float *PDP__RESTRICT dst, int64_t n)
{
    if (relu)
        PDP__CONV_ROW(j, n, dst[j] = pdp__relu(src[j] + bo););
    else
        PDP__CONV_ROW(j, n, dst[j] = src[j] + bo;);
}

/* Channel plane o of sample s of y from the products (row oh at src + oh ldr) plus
   the bias, through the fused ReLU; with a fused pool, two rows at a time straight
   into the pool's output and winners (pdp__conv_pool_2x2). */
PDP__PRIVATE void pdp__conv_store_plane(const pdp__layer_io *io, const pdp__layer *l, int64_t s,
                                        int64_t o, const float *src, int64_t ldr)
{
    int64_t O = l->out_shape[0], Ho = l->out_shape[1], Wo = l->out_shape[2], oh;
    float bo = io->b ? io->b[o] : 0.0f;
    if (!io->pool_y) {
        for (oh = 0; oh < Ho; oh++)
            pdp__conv_store_row(src + oh * ldr, bo, io->fused_relu,
                                io->y + ((s * O + o) * Ho + oh) * Wo, Wo);
        return;
    }
    for (oh = 0; oh < Ho; oh += 2) { /* Ho and Wo are even */
        int64_t at = ((s * O + o) * (Ho / 2) + oh / 2) * (Wo / 2);
        pdp__conv_pool_2x2(src + oh * ldr, src + (oh + 1) * ldr, bo, Wo / 2, io->pool_y + at,
                           io->pool_arg + at, (int32_t)(oh * Wo), (int32_t)Wo);
    }
}

typedef struct pdp__conv_job {
    const pdp__layer *l;
    const pdp__layer_io *io;
    pdp__conv_geom g;
    int64_t chunks;
    int64_t scratch;  /* floats of each part's scratch: pdp__conv_scratch(chunk size) */
    int parts;
    const float *wt;  /* implicit backward: W' [C, O k k] */
    const float *w;   /* implicit forward: W as the products see it (io->w, or in bf16 on
                         the emulated path its rounding in the fixed region) */
    pdp_bf16_path path16; /* bf16: PDP__CONV_BF16_PATH() */
    int packed16;     /* implicit bf16 on AVX512-BF16 or AMX: the products are
                         pdp__gemm_bf16_rows_h / _arows_h on the image and dy converted */
} pdp__conv_job;

/* bf16: pdp__layers_sum(x, n), the same bits (its 16 lanes, then its tail and the lanes
   into a double, in its order), with x rounded in place in the same pass, each value after
   the sum took it: Conv2d's db share from dy, then dy for the products, in one read. */
PDP__PRIVATE double pdp__conv_sum_bf16(float *x, int64_t n)
{
    float lane[16] = {0};
    double s = 0.0;
    int64_t i = 0;
    int k;
#if !defined(PDP_NO_SIMD) && defined(__AVX512F__)
    __m512 acc = _mm512_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        __m512i u = _mm512_loadu_si512((const void *)(x + i));
        acc = _mm512_add_ps(acc, _mm512_castsi512_ps(u));
        _mm512_storeu_si512((void *)(x + i), pdp__gemm_round_zmm(u));
    }
    _mm512_storeu_ps(lane, acc);
#elif !defined(PDP_NO_SIMD) && defined(__AVX2__)
    __m256 lo = _mm256_setzero_ps(), hi = lo; /* lanes 0-7 and 8-15 */
    for (; i + 16 <= n; i += 16) {
        __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
        lo = _mm256_add_ps(lo, a);
        hi = _mm256_add_ps(hi, b);
        _mm256_storeu_ps(x + i, pdp__gemm_round_ymm(a));
        _mm256_storeu_ps(x + i + 8, pdp__gemm_round_ymm(b));
    }
    _mm256_storeu_ps(lane, lo);
    _mm256_storeu_ps(lane + 8, hi);
#endif
    for (; i + 16 <= n; i += 16)
        for (k = 0; k < 16; k++) {
            lane[k] += x[i + k];
            x[i + k] = pdp__bf16_round(x[i + k]);
        }
    for (; i < n; i++) {
        s += x[i];
        x[i] = pdp__bf16_round(x[i]);
    }
    for (k = 0; k < 16; k++) s += lane[k];
    return s;
}

/* Chunk c: its samples [s0, s1), where its dW and db shares go ([O, C k k] then
   [O]), and the scratch of the part that runs it. Workspace: the fixed part, the
   chunks' shares, then one scratch region per part, reused by all of the part's
   chunks so that it stays in cache. Implicit: the padded input, the padded dy and
   the grid; im2col: the column matrix [C k k, n] and O rows of n columns. */
typedef struct pdp__conv_chunk {
    int64_t s0, s1, n;   /* n: im2col columns (samples x Ho Wo) */
    float *share;
    int64_t wt, wqt;     /* implicit: row widths of the padded image and padded dy */
    int64_t *offx, *offdy;
    float *xp, *dyp, *grid;
    float *col, *out;    /* im2col */
} pdp__conv_chunk;

PDP__PRIVATE pdp__conv_chunk pdp__conv_chunk_of(const pdp__conv_job *job, int64_t c, int part)
{
    const pdp__conv_geom *g = &job->g;
    float *base = job->io->work + g->fixed + job->chunks * g->share + part * job->scratch;
    int64_t cap = PDP__MIN(g->per_chunk, job->io->batch), okk = g->O * g->k * g->k;
    pdp__conv_chunk k;
    k.s0 = c * g->per_chunk;
    k.s1 = PDP__MIN(job->io->batch, k.s0 + g->per_chunk);
    k.n = (k.s1 - k.s0) * g->cols;
    k.share = job->io->work + g->fixed + c * g->share;
    k.wt = pdp__conv_wt(g, k.s1 - k.s0);
    k.wqt = pdp__conv_wqt(g, k.s1 - k.s0);
    k.offx = (int64_t *)(void *)base;
    k.offdy = k.offx + g->ckk;
    k.xp = base + 2 * (g->ckk + okk);
    k.dyp = k.xp + g->C * g->Hp * pdp__conv_wt(g, cap) + g->k;
    k.grid = k.dyp + g->O * g->Hq * pdp__conv_wqt(g, cap) + g->k;
    k.col = base;
    k.out = base + g->ckk * k.n;
    return k;
}

/* ---- layers: Conv2d, implicit GEMM ---- */

/* W' for backward, run by the caller before the parts start. */
PDP__PRIVATE void pdp__conv_implicit_setup(pdp__conv_job *job)
{
    const pdp__conv_geom *g = &job->g;
    float *wt = job->io->work;
    int64_t c, o, ki, kj, okk = g->O * g->k * g->k, k1 = g->k - 1;
    for (c = 0; c < g->C; c++)
        for (o = 0; o < g->O; o++)
            for (ki = 0; ki < g->k; ki++)
                for (kj = 0; kj < g->k; kj++)
                    wt[c * okk + (o * g->k + ki) * g->k + kj] =
                        job->io->w[((o * g->C + c) * g->k + k1 - ki) * g->k + k1 - kj];
    if (job->io->bf16 && !job->packed16) pdp__gemm_round16(wt, g->C * okk);
    job->wt = wt;
}

/* The chunk's samples into its zeroed padded image (and their dy into the padded
   dy when dy is not NULL), and the offset tables of both. In bf16 the image is
   rounded for the fp32 kernels: every product on the emulated path, the dW dot
   products (dw_dots) in backward on the packed path. */
PDP__PRIVATE void pdp__conv_implicit_load(const pdp__conv_job *job, const pdp__conv_chunk *k,
                                          const float *dy, bool backward)
{
    const pdp__conv_geom *g = &job->g;
    int64_t c, o, ki, kj, s, ns = k->s1 - k->s0;
    memset(k->xp, 0, (size_t)(g->C * g->Hp * k->wt + g->k) * sizeof(float));
    for (s = 0; s < ns; s++)
        (job->io->bf16 && (!job->packed16 || (backward && g->dw_dots)) ? pdp__conv_copy2d_bf16
                                                                       : pdp__conv_copy2d)(
            job->io->x + (k->s0 + s) * job->l->in_count, g->H * g->W, g->W,
            k->xp + g->pad * k->wt + g->pad + s * (g->W + g->pad), g->Hp * k->wt, k->wt, g->C,
            g->H, g->W);
    for (c = 0; c < g->C; c++)
        for (ki = 0; ki < g->k; ki++)
            for (kj = 0; kj < g->k; kj++)
                k->offx[(c * g->k + ki) * g->k + kj] = (c * g->Hp + ki) * k->wt + kj;
    if (!dy) return;
    memset(k->dyp, 0, (size_t)(g->O * g->Hq * k->wqt + g->k) * sizeof(float));
    for (s = 0; s < ns; s++)
        pdp__conv_copy_dy(job->io, k->s0 + s, job->l,
                          k->dyp + g->q * k->wqt + g->q + s * (g->Wo + g->q), g->Hq * k->wqt,
                          k->wqt);
    for (o = 0; o < g->O; o++)
        for (ki = 0; ki < g->k; ki++)
            for (kj = 0; kj < g->k; kj++)
                k->offdy[(o * g->k + ki) * g->k + kj] = (o * g->Hq + ki) * k->wqt + kj;
}

PDP__PRIVATE void pdp__conv_implicit_forward_part(void *arg, int i, int parts)
{
    const pdp__conv_job *job = (const pdp__conv_job *)arg;
    const pdp__conv_geom *g = &job->g;
    const pdp__layer_io *io = job->io;
    int64_t c, c0 = job->chunks * i / parts, c1 = job->chunks * (i + 1) / parts, s, o;
    for (c = c0; c < c1; c++) {
        pdp__conv_chunk k = pdp__conv_chunk_of(job, c, i);
        int64_t cols = g->Ho * k.wt;
        int64_t ldo = cols, ldr = k.wt, lds = g->W + g->pad;
        pdp__conv_implicit_load(job, &k, NULL, false);
        if (job->packed16) { /* the image in bf16 words, in place; the bands computed too */
            uint16_t *xh = (uint16_t *)(void *)k.xp;
            pdp__gemm_bf16_convert(job->path16, k.xp, xh, g->C * g->Hp * k.wt + g->k);
            pdp__gemm_bf16_rows_h(job->path16, PDP_NO_TRANS, PDP_NO_TRANS, g->O, cols, g->ckk,
                                  1.0f, job->w, g->ckk, xh, k.offx, 0.0f, k.grid, cols);
        } else
#if defined(PDP__GEMM_RUNS)
        if (g->ckk >= PDP__CONV_RUNS_MIN_K) {
            /* only the samples' columns, not the bands: grid [O, Ho, ns, Wo] */
            int64_t ns = k.s1 - k.s0;
            ldo = g->Ho * ns * g->Wo;
            ldr = ns * g->Wo;
            lds = g->Wo;
            pdp__sgemm_runs(g->O, g->ckk, job->w, g->ckk, k.xp, k.offx, g->Ho, ns, g->Wo, k.wt,
                            g->W + g->pad, k.grid, ldo);
        } else
#endif
        pdp__sgemm_rows(PDP_NO_TRANS, PDP_NO_TRANS, g->O, cols, g->ckk, 1.0f, job->w, g->ckk, k.xp,
                        k.offx, 0.0f, k.grid, cols);
        for (s = k.s0; s < k.s1; s++)
            for (o = 0; o < g->O; o++)
                pdp__conv_store_plane(io, job->l, s, o, k.grid + o * ldo + (s - k.s0) * lds, ldr);
    }
}

/* Implicit path: the chunk's dW share again, over the samples' own output columns only,
   when the GEMM's is not finite. The GEMM also runs over the grid's band columns, where dy
   is 0, and those read a sample's edge pixels with taps that reach past it: a NaN or an
   infinity there made 0 x inf = NaN in taps where PyTorch's sum has no such term. Here in
   double, x and dy rounded to bf16 in bf16 (the GEMM's inputs); the grid (row stride wt,
   sample j's columns from j (W + pad)) holds dy as the GEMM read it. A slow path, taken
   only for inputs that are not finite. */
PDP__PRIVATE void pdp__conv_implicit_dw_exact(const pdp__conv_job *job, const pdp__conv_chunk *k,
                                              const float *grid, int64_t ldg)
{
    const pdp__conv_geom *g = &job->g;
    const pdp__layer_io *io = job->io;
    int64_t o, r, s, oh, ow, n = g->O * g->ckk;
    for (r = 0; r < n && isfinite(k->share[r]); r++) {}
    if (r == n) return;
    for (o = 0; o < g->O; o++)
        for (r = 0; r < g->ckk; r++) {
            int64_t c = r / (g->k * g->k), ki = r / g->k % g->k, kj = r % g->k;
            double sum = 0.0;
            for (s = k->s0; s < k->s1; s++) {
                const float *x = io->x + s * job->l->in_count + c * g->H * g->W;
                const float *d = grid + o * ldg + (s - k->s0) * (g->W + g->pad);
                for (oh = 0; oh < g->Ho; oh++) {
                    int64_t ih = oh - g->pad + ki;
                    if (ih < 0 || ih >= g->H) continue;
                    for (ow = 0; ow < g->Wo; ow++) {
                        int64_t iw = ow - g->pad + kj;
                        float xv, dv;
                        if (iw < 0 || iw >= g->W) continue;
                        xv = x[ih * g->W + iw];
                        dv = d[oh * k->wt + ow];
                        if (io->bf16) xv = pdp__bf16_round(xv), dv = pdp__bf16_round(dv);
                        sum += (double)dv * (double)xv;
                    }
                }
            }
            k->share[g->dw_t ? r * g->O + o : o * g->ckk + r] = (float)sum;
        }
}

PDP__PRIVATE void pdp__conv_implicit_backward_part(void *arg, int i, int parts)
{
    const pdp__conv_job *job = (const pdp__conv_job *)arg;
    const pdp__conv_geom *g = &job->g;
    const pdp__layer_io *io = job->io;
    int64_t c, c0 = job->chunks * i / parts, c1 = job->chunks * (i + 1) / parts, s, o;
    int64_t okk = g->O * g->k * g->k;
    for (c = c0; c < c1; c++) {
        pdp__conv_chunk k = pdp__conv_chunk_of(job, c, i);
        int64_t cols = g->Ho * k.wt, ldg = cols;
        float *grid = k.grid;
        pdp__conv_implicit_load(job, &k, io->dx ? io->dy : NULL, true);
        if (io->dx && g->q == g->pad) {
            /* a "same" convolution: the padded dy has the grid's row width (wqt ==
               wt) and zeros in its bands, so its interior IS dy on the grid */
            grid = k.dyp + g->q * k.wqt + g->q;
            ldg = g->Hq * k.wqt;
        } else { /* dy on the output grid, zero in the columns nobody reads */
            memset(k.grid, 0, (size_t)(g->O * cols) * sizeof(float));
            for (s = k.s0; s < k.s1; s++)
                pdp__conv_copy_dy(io, s, job->l, k.grid + (s - k.s0) * (g->W + g->pad), cols,
                                  k.wt);
        }
        /* db's share from dy; in bf16 on the fp32 kernels (and the packed path's dots) dy is
           rounded for the products in the same pass, after db took it: the grid's rows hold
           every value of dy (a "same" convolution's padded dy has zeros elsewhere) */
        for (o = 0; o < g->O; o++)
            k.share[g->O * g->ckk + o] =
                (float)(io->bf16 && (!job->packed16 || g->dw_dots)
                            ? pdp__conv_sum_bf16(grid + o * ldg, cols)
                            : pdp__layers_sum(grid + o * ldg, cols));
        if (io->bf16 && !job->packed16 && io->dx && grid == k.grid) /* the padded dy apart */
            pdp__gemm_round16(k.dyp, g->O * g->Hq * k.wqt + g->k);
        if (g->dw_dots)
            pdp__sgemm_dots(g->O, g->ckk, cols, grid, ldg, k.xp, k.offx, k.share, g->ckk);
        else if (job->packed16) { /* the image in bf16, in place: the column matrix's pairs
                                     are adjacent words */
            uint16_t *xh = (uint16_t *)(void *)k.xp;
            pdp__gemm_bf16_convert(job->path16, k.xp, xh, g->C * g->Hp * k.wt + g->k);
            if (g->dw_t)
                pdp__gemm_bf16_arows_h(job->path16, PDP_TRANS, g->ckk, g->O, cols, 1.0f, xh,
                                       k.offx, grid, ldg, 0.0f, k.share, g->O);
            else
                pdp__gemm_bf16_rows_h(job->path16, PDP_NO_TRANS, PDP_TRANS, g->O, g->ckk, cols,
                                      1.0f, grid, ldg, xh, k.offx, 0.0f, k.share, g->ckk);
        } else if (g->dw_t) /* share^T [C k k, O] = col dy^T: same products, same order */
            pdp__sgemm_arows(PDP_TRANS, g->ckk, g->O, cols, 1.0f, k.xp, k.offx, grid, ldg, 0.0f,
                             k.share, g->O);
        else
            pdp__sgemm_rows(PDP_NO_TRANS, PDP_TRANS, g->O, g->ckk, cols, 1.0f, grid, ldg, k.xp,
                            k.offx, 0.0f, k.share, g->ckk);
        pdp__conv_implicit_dw_exact(job, &k, grid, ldg); /* when not finite */
        if (!io->dx) continue;
#if defined(PDP__GEMM_RUNS)
        if (okk >= PDP__CONV_RUNS_MIN_K && !job->packed16) {
            /* only the samples' columns, not the bands: grid [C, H, ns, W] */
            int64_t ns = k.s1 - k.s0;
            pdp__sgemm_runs(g->C, okk, job->wt, okk, k.dyp, k.offdy, g->H, ns, g->W, k.wqt,
                            g->Wo + g->q, k.grid, g->H * ns * g->W);
            for (s = k.s0; s < k.s1; s++)
                pdp__conv_copy2d(k.grid + (s - k.s0) * g->W, g->H * ns * g->W, ns * g->W,
                                 io->dx + s * job->l->in_count, g->H * g->W, g->W, g->C, g->H,
                                 g->W);
            continue;
        }
#endif
        if (job->packed16) { /* the padded dy in bf16, in place (the dW share is done) */
            uint16_t *dyh = (uint16_t *)(void *)k.dyp;
            pdp__gemm_bf16_convert(job->path16, k.dyp, dyh, g->O * g->Hq * k.wqt + g->k);
            pdp__gemm_bf16_rows_h(job->path16, PDP_NO_TRANS, PDP_NO_TRANS, g->C, g->H * k.wqt,
                                  okk, 1.0f, job->wt, okk, dyh, k.offdy, 0.0f, k.grid,
                                  g->H * k.wqt);
        } else
            pdp__sgemm_rows(PDP_NO_TRANS, PDP_NO_TRANS, g->C, g->H * k.wqt, okk, 1.0f, job->wt,
                            okk, k.dyp, k.offdy, 0.0f, k.grid, g->H * k.wqt);
        for (s = k.s0; s < k.s1; s++)
            pdp__conv_copy2d(k.grid + (s - k.s0) * (g->Wo + g->q), g->H * k.wqt, k.wqt,
                             io->dx + s * job->l->in_count, g->H * g->W, g->W, g->C, g->H, g->W);
    }
}

/* ---- layers: Conv2d, im2col ---- */

/* Forward of the chunks of part i: im2col; out [O, n] = W col; y = out + b. */
PDP__PRIVATE void pdp__conv_forward_part(void *arg, int i, int parts)
{
    const pdp__conv_job *job = (const pdp__conv_job *)arg;
    const pdp__conv_geom *g = &job->g;
    const pdp__layer_io *io = job->io;
    int64_t c, c0 = job->chunks * i / parts, c1 = job->chunks * (i + 1) / parts, s, o;
    for (c = c0; c < c1; c++) {
        pdp__conv_chunk k = pdp__conv_chunk_of(job, c, i);
        for (s = k.s0; s < k.s1; s++)
            pdp__im2col(g, io->x + s * job->l->in_count, k.col + (s - k.s0) * g->cols, k.n);
        (io->bf16 ? pdp_gemm_bf16 : pdp_sgemm)(PDP_NO_TRANS, PDP_NO_TRANS, g->O, k.n, g->ckk, 1.0f,
                                                io->w, g->ckk, k.col, k.n, 0.0f, k.out, k.n);
        for (s = k.s0; s < k.s1; s++)
            for (o = 0; o < g->O; o++)
                pdp__conv_store_plane(io, job->l, s, o, k.out + o * k.n + (s - k.s0) * g->cols,
                                      g->Wo);
    }
}

/* Backward of the chunks of part i: im2col again; dy gathered into out [O, n]; the
   chunk's dW share dy col^T and db share; then dcol = W^T out over col, and col2im
   into dx. */
PDP__PRIVATE void pdp__conv_backward_part(void *arg, int i, int parts)
{
    const pdp__conv_job *job = (const pdp__conv_job *)arg;
    const pdp__conv_geom *g = &job->g;
    const pdp__layer_io *io = job->io;
    int64_t c, c0 = job->chunks * i / parts, c1 = job->chunks * (i + 1) / parts, s, o;
    for (c = c0; c < c1; c++) {
        pdp__conv_chunk k = pdp__conv_chunk_of(job, c, i);
        for (s = k.s0; s < k.s1; s++) {
            pdp__im2col(g, io->x + s * job->l->in_count, k.col + (s - k.s0) * g->cols, k.n);
            pdp__conv_copy_dy(io, s, job->l, k.out + (s - k.s0) * g->cols, k.n, g->Wo);
        }
        (io->bf16 ? pdp_gemm_bf16 : pdp_sgemm)(PDP_NO_TRANS, PDP_TRANS, g->O, g->ckk, k.n, 1.0f,
                                                k.out, k.n, k.col, k.n, 0.0f, k.share, g->ckk);
        for (o = 0; o < g->O; o++)
            k.share[g->O * g->ckk + o] = (float)pdp__layers_sum(k.out + o * k.n, k.n);
        if (!io->dx) continue;
        (io->bf16 ? pdp_gemm_bf16 : pdp_sgemm)(PDP_TRANS, PDP_NO_TRANS, g->ckk, k.n, g->O, 1.0f,
                                                io->w, g->ckk, k.out, k.n, 0.0f, k.col, k.n);
        for (s = k.s0; s < k.s1; s++)
            pdp__col2im(g, k.col + (s - k.s0) * g->cols, k.n, io->dx + s * job->l->in_count);
    }
}

/* ---- layers: Conv2d, driver ---- */

/* Parts: the caller's threads, at most one per chunk (scratch regions are sized
   for as many parts as samples). A single part runs on the caller without taking
   the pool, so its GEMMs can still use the threads. */
PDP__PRIVATE void pdp__conv_job_init(pdp__conv_job *job, const pdp__layer *l,
                                     const pdp__layer_io *io, bool backward)
{
    job->l = l;
    job->io = io;
    job->g = pdp__conv_geom_of(l);
    job->chunks = (io->batch + job->g.per_chunk - 1) / job->g.per_chunk;
    job->scratch = pdp__conv_scratch(&job->g, PDP__MIN(job->g.per_chunk, io->batch));
    job->parts = (int)PDP__MIN((int64_t)pdp__threads_for_caller(), job->chunks);
    job->wt = NULL;
    job->w = io->w;
    job->path16 = io->bf16 ? PDP__CONV_BF16_PATH() : PDP_BF16_PATH_EMULATED;
    job->packed16 = job->g.implicit && io->bf16 &&
                    (job->path16 == PDP_BF16_PATH_AVX512 || job->path16 == PDP_BF16_PATH_AMX);
    if (job->g.implicit && backward && io->dx) pdp__conv_implicit_setup(job);
    if (job->g.implicit && !backward && io->bf16 && !job->packed16) { /* W' in backward */
        memcpy(io->work, io->w, (size_t)(job->g.O * job->g.ckk) * sizeof(float));
        pdp__gemm_round16(io->work, job->g.O * job->g.ckk);
        job->w = io->work;
    }
}

PDP__PRIVATE pdp_status pdp__conv_forward(const pdp__layer *l, const pdp__layer_io *io)
{
    pdp__conv_job job;
    pdp__conv_job_init(&job, l, io, false);
    pdp__parallel_for(job.parts, job.g.implicit ? pdp__conv_implicit_forward_part
                                                : pdp__conv_forward_part, &job);
    return PDP_OK;
}

PDP__PRIVATE pdp_status pdp__conv_backward(const pdp__layer *l, const pdp__layer_io *io)
{
    pdp__conv_job job;
    const pdp__conv_geom *g = &job.g;
    int64_t c, o;
    pdp__conv_job_init(&job, l, io, true);
    pdp__parallel_for(job.parts, g->implicit ? pdp__conv_implicit_backward_part
                                             : pdp__conv_backward_part, &job);
    for (c = 0; c < job.chunks; c++) { /* the chunks' shares, in chunk order */
        const float *PDP__RESTRICT share = io->work + g->fixed + c * g->share;
        float *PDP__RESTRICT dw = io->dw;
        if (g->dw_t) {
            int64_t r;
            for (o = 0; o < g->O; o++)
                for (r = 0; r < g->ckk; r++) dw[o * g->ckk + r] += share[r * g->O + o];
        } else {
            PDP__FOR_BLOCKED(j, g->O * g->ckk, dw[j] += share[j];);
        }
        if (io->db)
            for (o = 0; o < g->O; o++) io->db[o] += share[g->O * g->ckk + o];
    }
    return PDP_OK;
}

/* ---- layers: Conv2d, setup and CUDA ---- */

PDP__PRIVATE pdp_status pdp__conv_setup(pdp__layer *l, pdp__param_shapes *ps, const char *in)
{
    int64_t k = l->kernel, s = l->stride, pad = l->padding, O = l->out_features;
    int64_t C = l->in_shape[0], H = l->in_shape[1], W = l->in_shape[2];
    int64_t pad2 = 0, Hp = 0, Wp = 0, Ho, Wo, out = 0, ckk = 0, weights = 0;
    double work;
    if (O < 1 || k < 1 || s < 1 || pad < 0)
        return pdp__err(PDP_ERR_INVALID,
                        "out_channels %lld, kernel %lld, stride %lld, padding %lld: need "
                        "out_channels, kernel, stride >= 1 and padding >= 0 (input %s)",
                        (long long)O, (long long)k, (long long)s, (long long)pad, in);
    if (l->in_ndim != 3)
        return pdp__err(PDP_ERR_SHAPE, "needs (C, H, W) samples, got %s", in);
    if (!pdp__mul_ok(2, pad, &pad2) || !pdp__add_ok(H, pad2, &Hp) || !pdp__add_ok(W, pad2, &Wp))
        return pdp__err(PDP_ERR_SHAPE, "padding %lld: the padded input has more than %lld rows "
                        "(input %s)", (long long)pad, (long long)PDP__COUNT_MAX, in);
    if (k > Hp || k > Wp)
        return pdp__err(PDP_ERR_SHAPE,
                        "kernel %lld is larger than the padded input %lldx%lld (input %s, "
                        "padding %lld)",
                        (long long)k, (long long)Hp, (long long)Wp, in, (long long)pad);
    Ho = (Hp - k) / s + 1;
    Wo = (Wp - k) / s + 1;
    /* the output, the weights, and an upper bound of every workspace term below
       (pdp__conv_work_per_sample, pdp__conv_cuda_work: each a sum of products of C k k, O,
       Hp + 2k, Wp + 2k and the weight count) must fit, so none of them can overflow */
    if (!pdp__mul3_ok(O, Ho, Wo, &out) || !pdp__mul3_ok(C, k, k, &ckk) ||
        !pdp__mul_ok(O, ckk, &weights))
        return pdp__err(
            PDP_ERR_SHAPE,
            "out_channels %lld, kernel %lld, padding %lld: output "
            "(%lld, %lld, %lld) or weights (%lld, %lld, %lld, %lld) exceed %lld elements "
            "(input %s)",
            (long long)O, (long long)k, (long long)pad, (long long)O, (long long)Ho, (long long)Wo,
            (long long)O, (long long)C, (long long)k, (long long)k, (long long)PDP__COUNT_MAX, in);
    work = 16.0 * ((double)(ckk + O) * (double)(Hp + 2 * k) * (double)(Wp + 2 * k) +
                   (double)weights + (double)O + (double)k + 64.0);
    if (work > (double)PDP__COUNT_MAX)
        return pdp__err(PDP_ERR_SHAPE, "out_channels %lld, kernel %lld, padding %lld: the "
                        "workspace exceeds %lld floats per sample (input %s)", (long long)O,
                        (long long)k, (long long)pad, (long long)PDP__COUNT_MAX, in);
    l->out_shape[0] = l->out_features;
    l->out_shape[1] = Ho;
    l->out_shape[2] = Wo;
    ps->wshape[0] = l->out_features;
    ps->wshape[1] = C;
    ps->wshape[2] = k;
    ps->wshape[3] = k;
    ps->wndim = 4;
    ps->bshape[0] = l->out_features;
    ps->bndim = 1;
    l->work_per_sample = pdp__conv_work_per_sample(l);
    return PDP_OK;
}

PDP__PRIVATE void pdp__conv_init(const pdp__layer *l, float *w, float *b, pdp_rng *r)
{
    int64_t fan_in = l->in_shape[0] * l->kernel * l->kernel;
    pdp__layers_init_kaiming(w, l->out_features * fan_in, b, l->out_features, fan_in, r);
}

/* Workspace floats per sample of pdp_cuda.cu's conv kernels: they unfold the whole
   sample and keep the output beside it, (C k k + O) Ho Wo (cuda.h). */
PDP__PRIVATE int64_t pdp__conv_cuda_work(const pdp__layer *l)
{
    return (l->in_shape[0] * l->kernel * l->kernel + l->out_features) * l->out_shape[1] *
           l->out_shape[2];
}

#ifdef PDP_CUDA
/* The geometry pdp_cuda.cu's Conv2d and MaxPool2d kernels take. */
PDP__PRIVATE pdp_cudak_conv pdp__conv_cuda_geom(const pdp__layer *l, int64_t batch, int64_t O,
                                                int64_t pad)
{
    pdp_cudak_conv g;
    g.batch = batch;
    g.C = l->in_shape[0];
    g.H = l->in_shape[1];
    g.W = l->in_shape[2];
    g.O = O;
    g.k = l->kernel;
    g.stride = l->stride;
    g.pad = pad;
    g.Ho = l->out_shape[1];
    g.Wo = l->out_shape[2];
    return g;
}

PDP__PRIVATE pdp_status pdp__conv_cuda_forward(const pdp__layer *l, const pdp__layer_io *io)
{
    pdp_cudak_conv g = pdp__conv_cuda_geom(l, io->batch, l->out_features, l->padding);
    return pdp_cudak_conv_fwd(io->device.ordinal, &g, io->x, io->w, io->b, io->y, io->work,
                              io->bf16);
}

PDP__PRIVATE pdp_status pdp__conv_cuda_backward(const pdp__layer *l, const pdp__layer_io *io)
{
    pdp_cudak_conv g = pdp__conv_cuda_geom(l, io->batch, l->out_features, l->padding);
    return pdp_cudak_conv_bwd(io->device.ordinal, &g, io->x, io->w, io->dy, io->dw, io->db,
                              io->dx, io->work, io->bf16);
}
#endif

/* ---- layers: MaxPool2d ---- */

typedef struct pdp__pool_job {
    const pdp__layer *l;
    const pdp__layer_io *io;
} pdp__pool_job;

/* The channel planes of part i: first element of each window, then the rest. */
PDP__PRIVATE void pdp__maxpool_forward_part(void *argp, int i, int parts)
{
    const pdp__pool_job *job = (const pdp__pool_job *)argp;
    const pdp__layer *l = job->l;
    const pdp__layer_io *io = job->io;
    int64_t H = l->in_shape[1], W = l->in_shape[2], Ho = l->out_shape[1], Wo = l->out_shape[2];
    int64_t k = l->kernel, st = l->stride, planes = io->batch * l->in_shape[0];
    int64_t plane, oh, ow, ki, kj;
    for (plane = planes * i / parts; plane < planes * (i + 1) / parts; plane++) {
        const float *x = io->x + plane * H * W;
        for (oh = 0; oh < Ho; oh++) {
            float *y = io->y + (plane * Ho + oh) * Wo;
            int32_t *arg = (int32_t *)(void *)(io->saved + (plane * Ho + oh) * Wo);
            int64_t row = oh * st * W;
            if (k == 2 && st == 2) {
                pdp__maxpool_2x2(x + row, x + row + W, Wo, y, arg, (int32_t)row, (int32_t)W);
                continue;
            }
            for (ow = 0; ow < Wo; ow++) {
                y[ow] = x[row + ow * st];
                arg[ow] = (int32_t)(row + ow * st);
            }
            for (ki = 0; ki < k; ki++)
                for (kj = ki ? 0 : 1; kj < k; kj++)
                    pdp__maxpool_update(x + row + ki * W + kj, (int32_t)st, Wo, y, arg,
                                        (int32_t)(row + ki * W + kj));
        }
    }
}

/* Split by channel plane over the intra-op threads. */
PDP__PRIVATE pdp_status pdp__maxpool_forward(const pdp__layer *l, const pdp__layer_io *io)
{
    pdp__pool_job job;
    job.l = l;
    job.io = io;
    pdp__parallel_for(pdp__layers_batch_parts(io->batch), pdp__maxpool_forward_part, &job);
    return PDP_OK;
}

/* The channel planes of part i: zero, then scatter each output's gradient to its
   winner (planes are independent, so any split gives the same bits). */
PDP__PRIVATE void pdp__maxpool_backward_part(void *argp, int i, int parts)
{
    const pdp__pool_job *job = (const pdp__pool_job *)argp;
    const pdp__layer *l = job->l;
    const pdp__layer_io *io = job->io;
    int64_t plane = l->in_shape[1] * l->in_shape[2], per = l->out_shape[1] * l->out_shape[2];
    int64_t planes = io->batch * l->in_shape[0], p0 = planes * i / parts;
    int64_t p1 = planes * (i + 1) / parts, p, j;
    int64_t W = l->in_shape[2], Ho = l->out_shape[1], Wo = l->out_shape[2];
    if (l->kernel == 2 && l->stride == 2 && l->in_shape[1] == 2 * Ho && W == 2 * Wo) {
        for (p = p0; p < p1; p++)
            for (j = 0; j < Ho; j++)
                pdp__maxpool_2x2_backward(
                    io->dy + p * per + j * Wo,
                    (const int32_t *)(const void *)(io->saved + p * per + j * Wo), Wo,
                    (int32_t)(2 * j * W), (int32_t)W, io->dx + p * plane + 2 * j * W,
                    io->dx + p * plane + (2 * j + 1) * W);
        return;
    }
    memset(io->dx + p0 * plane, 0, (size_t)((p1 - p0) * plane) * sizeof(float));
    for (p = p0; p < p1; p++) {
        float *dx = io->dx + p * plane;
        const float *dy = io->dy + p * per;
        const int32_t *arg = (const int32_t *)(const void *)(io->saved + p * per);
        for (j = 0; j < per; j++) dx[arg[j]] += dy[j];
    }
}

PDP__PRIVATE pdp_status pdp__maxpool_backward(const pdp__layer *l, const pdp__layer_io *io)
{
    pdp__pool_job job;
    if (!io->dx) return PDP_OK;
    job.l = l;
    job.io = io;
    pdp__parallel_for(pdp__layers_batch_parts(io->batch), pdp__maxpool_backward_part, &job);
    return PDP_OK;
}

PDP__PRIVATE pdp_status pdp__maxpool_setup(pdp__layer *l, pdp__param_shapes *ps, const char *in)
{
    int64_t k = l->kernel, s = l->stride, C = l->in_shape[0], H = l->in_shape[1];
    int64_t W = l->in_shape[2];
    (void)ps;
    if (k < 1 || s < 1)
        return pdp__err(PDP_ERR_INVALID, "kernel %lld, stride %lld must be >= 1 (input %s)",
                        (long long)k, (long long)s, in);
    if (l->in_ndim != 3)
        return pdp__err(PDP_ERR_SHAPE, "needs (C, H, W) samples, got %s", in);
    if (k > H || k > W)
        return pdp__err(PDP_ERR_SHAPE,
                        "kernel %lld is larger than the input %lldx%lld (input %s)",
                        (long long)k, (long long)H, (long long)W, in);
    l->out_shape[1] = (H - k) / s + 1;
    l->out_shape[2] = (W - k) / s + 1;
    l->saved_per_sample = C * l->out_shape[1] * l->out_shape[2]; /* argmax per output */
    return PDP_OK;
}

#ifdef PDP_CUDA
PDP__PRIVATE pdp_status pdp__maxpool_cuda_forward(const pdp__layer *l, const pdp__layer_io *io)
{
    pdp_cudak_conv g = pdp__conv_cuda_geom(l, io->batch, l->in_shape[0], 0);
    return pdp_cudak_maxpool_fwd(io->device.ordinal, &g, io->x, io->y, io->saved);
}

PDP__PRIVATE pdp_status pdp__maxpool_cuda_backward(const pdp__layer *l, const pdp__layer_io *io)
{
    pdp_cudak_conv g = pdp__conv_cuda_geom(l, io->batch, l->in_shape[0], 0);
    if (!io->dx) return PDP_OK;
    return pdp_cudak_maxpool_bwd(io->device.ordinal, &g, io->dy, io->saved, io->dx);
}
#endif
