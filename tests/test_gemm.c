/* test_gemm.c - pdp_sgemm against a naive double-precision loop.

   Odd shapes (1, 7, 33, 129, 257 and mixed ones) in all four layouts, alpha/beta
   variants (beta == 0 over a NaN-filled C), leading dimensions wider than the
   matrices (the padding must stay untouched), and bit-identical results for 1, 2
   and 3 intra-op threads. The error bound is the classic one for a length-k dot
   product: |got - exact| <= (k + 4) * eps * (|alpha| sum |a||b| + |beta c|).
   pdp__sgemm_bf16 (bf16's sgemm-rounded path): its rounding gives pdp_bf16_round's bits
   (ties, NaN payloads, subnormals, every tail length) and the product pdp_sgemm's bits on
   the rounded operands, those values among them; pdp__sgemm_bf16_b (op(A) bf16 already)
   its bits, and a bf16 MLP's weight gradients (the ReLU's backward rounding dY once) those
   of pdp_gemm_bf16 by hand. tests/test_gemm_nosimd.c builds this file again with -DPDP_NO_SIMD, so the
   portable kernel is tested too. */

#define _POSIX_C_SOURCE 200809L
#include <float.h>
#include <math.h>
#include <stdlib.h>

/* Every allocation of the library is counted (from any thread): pdp_test_allocs(). */
#include "counting_alloc.h"

#define PDP_IMPLEMENTATION
#include "pdp.h"
#include "pdp_test.h"

/* ---- helpers ---- */

static uint32_t rng_state = 12345u;

static float rnd(void) /* uniform in [-1, 1) */
{
    rng_state = rng_state * 1664525u + 1013904223u;
    return (float)(rng_state >> 8) / 8388608.0f - 1.0f;
}

typedef struct mat {
    float *p;
    int64_t rows, cols, ld;
} mat;

/* rows x cols with row stride ld = cols + pad; padding filled with a sentinel. */
static mat mat_new(int64_t rows, int64_t cols, int64_t pad)
{
    mat m;
    int64_t i;
    m.rows = rows;
    m.cols = cols;
    m.ld = cols + pad;
    m.p = (float *)malloc(sizeof(float) * (size_t)(rows * m.ld + 1));
    for (i = 0; i < rows * m.ld; i++) m.p[i] = (i % m.ld) < cols ? rnd() : 7777.0f;
    return m;
}

typedef struct gemm_case {
    pdp_trans ta, tb;
    int64_t m, k, n;
    float alpha, beta;
    int64_t pad;   /* extra columns in every leading dimension */
    int nan_c;     /* fill C with NaN (only with beta == 0) */
} gemm_case;

static const char *layout_name(pdp_trans ta, pdp_trans tb)
{
    static const char *names[2][2] = {{"NN", "NT"}, {"TN", "TT"}};
    return names[ta][tb];
}

/* Makes one case's operands from rng_state and runs pdp_sgemm on `threads` intra-op
   threads: A, B, C after the product and C0, C before it (caller frees all four). */
static void run_case(const gemm_case *t, int threads, mat *a, mat *b, mat *c, float **c0)
{
    int64_t i, j;
    *a = t->ta == PDP_NO_TRANS ? mat_new(t->m, t->k, t->pad) : mat_new(t->k, t->m, t->pad);
    *b = t->tb == PDP_NO_TRANS ? mat_new(t->k, t->n, t->pad) : mat_new(t->n, t->k, t->pad);
    *c = mat_new(t->m, t->n, t->pad);
    *c0 = (float *)malloc(sizeof(float) * (size_t)(c->rows * c->ld + 1));
    if (t->nan_c) {
        for (i = 0; i < t->m; i++) {
            for (j = 0; j < t->n; j++) c->p[i * c->ld + j] = NAN;
        }
    }
    memcpy(*c0, c->p, sizeof(float) * (size_t)(c->rows * c->ld));
    pdp_set_num_threads(threads);
    pdp_sgemm(t->ta, t->tb, t->m, t->n, t->k, t->alpha, a->p, a->ld, b->p, b->ld, t->beta, c->p,
              c->ld);
    pdp_set_num_threads(1);
}

/* Runs one case with `threads` intra-op threads; checks values against the naive
   loop and the padding of C; returns C (caller frees) through *out if not NULL. */
static enum greatest_test_res check_case(const gemm_case *t, int threads, float **out)
{
    mat a, b, c;
    float *c0;
    int64_t i, j, p, bad_i = -1, bad_j = -1;
    double worst = 0.0;
    int pad_ok = 1;
    char msg[256];
    run_case(t, threads, &a, &b, &c, &c0);
    for (i = 0; i < t->m; i++) {
        for (j = 0; j < c.ld; j++) {
            double exact = 0.0, mag = 0.0, err, got = c.p[i * c.ld + j];
            if (j >= t->n) { /* padding: untouched */
                if (c.p[i * c.ld + j] != 7777.0f) pad_ok = 0;
                continue;
            }
            for (p = 0; p < t->k; p++) {
                double x = t->ta == PDP_NO_TRANS ? a.p[i * a.ld + p] : a.p[p * a.ld + i];
                double y = t->tb == PDP_NO_TRANS ? b.p[p * b.ld + j] : b.p[j * b.ld + p];
                exact += x * y;
                mag += fabs(x * y);
            }
            exact *= t->alpha;
            mag *= fabs(t->alpha);
            if (t->beta != 0.0f) {
                exact += (double)t->beta * c0[i * c.ld + j];
                mag += fabs((double)t->beta * c0[i * c.ld + j]);
            }
            err = fabs(got - exact) / ((double)(t->k + 4) * FLT_EPSILON * mag + 1e-30);
            if (!(err <= worst)) { /* also catches NaN */
                worst = err != err ? 1e30 : err;
                bad_i = i;
                bad_j = j;
            }
        }
    }
    snprintf(msg, sizeof msg,
             "%s m=%d k=%d n=%d alpha=%g beta=%g pad=%d threads=%d: error %.3g of the bound at "
             "C[%d][%d]", layout_name(t->ta, t->tb), (int)t->m, (int)t->k, (int)t->n,
             (double)t->alpha, (double)t->beta, (int)t->pad, threads, worst, (int)bad_i,
             (int)bad_j);
    free(a.p);
    free(b.p);
    free(c0);
    if (out) {
        *out = c.p;
    } else {
        free(c.p);
    }
    ASSERTm(msg, worst <= 1.0);
    ASSERTm("padding of C was written", pad_ok);
    PASS();
}

static const pdp_trans layouts[4][2] = {
    {PDP_NO_TRANS, PDP_NO_TRANS}, {PDP_TRANS, PDP_NO_TRANS},
    {PDP_NO_TRANS, PDP_TRANS}, {PDP_TRANS, PDP_TRANS}};

/* ---- tests ---- */

TEST gemm_matches_naive_odd_shapes(void)
{
    static const int64_t sizes[] = {1, 7, 33, 129};
    int l, s;
    for (l = 0; l < 4; l++) {
        for (s = 0; s < 4; s++) {
            gemm_case t = {layouts[l][0], layouts[l][1], sizes[s], sizes[s], sizes[s], 1.0f, 0.0f,
                           0, 0};
            CHECK_CALL(check_case(&t, 1, NULL));
        }
    }
    PASS();
}

TEST gemm_matches_naive_257_cube(void)
{
    int l;
    for (l = 0; l < 4; l++) {
        gemm_case t = {layouts[l][0], layouts[l][1], 257, 257, 257, 1.0f, 0.0f, 0, 0};
        CHECK_CALL(check_case(&t, 1, NULL));
    }
    PASS();
}

TEST gemm_matches_naive_mixed_shapes(void)
{
    static const int64_t shapes[][3] = {/* m, k, n */
                                        {1, 257, 33}, {130, 7, 129}, {257, 1, 7},  {33, 129, 1},
                                        {9, 300, 31}, {17, 520, 65}, {128, 784, 10}, {2, 3, 600}};
    int l, s;
    for (l = 0; l < 4; l++) {
        for (s = 0; s < (int)(sizeof shapes / sizeof shapes[0]); s++) {
            gemm_case t = {layouts[l][0], layouts[l][1], shapes[s][0], shapes[s][1], shapes[s][2],
                           1.0f, 0.0f, 0, 0};
            CHECK_CALL(check_case(&t, 1, NULL));
        }
    }
    PASS();
}

TEST gemm_alpha_beta_and_leading_dims(void)
{
    static const float ab[][2] = {{1.0f, 1.0f}, {-1.5f, 0.25f}, {0.5f, 0.0f}, {2.0f, -1.0f}};
    static const int64_t shapes[][3] = {{33, 129, 7}, {130, 7, 129}, {7, 33, 257}};
    int l, v, s;
    for (l = 0; l < 4; l++) {
        for (v = 0; v < 4; v++) {
            for (s = 0; s < 3; s++) {
                gemm_case t = {layouts[l][0], layouts[l][1], shapes[s][0], shapes[s][1],
                               shapes[s][2], ab[v][0], ab[v][1], 1 + 5 * s, 0};
                CHECK_CALL(check_case(&t, 1, NULL));
            }
        }
    }
    PASS();
}

TEST gemm_beta_zero_ignores_nan_in_c(void)
{
    int l;
    for (l = 0; l < 4; l++) {
        gemm_case t = {layouts[l][0], layouts[l][1], 37, 65, 41, 0.75f, 0.0f, 3, 1};
        CHECK_CALL(check_case(&t, 1, NULL));
        t.m = 300; /* big enough to go parallel */
        t.n = 150;
        CHECK_CALL(check_case(&t, 2, NULL));
    }
    PASS();
}

TEST gemm_k_zero_or_alpha_zero_scales_c(void)
{
    float a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {1, 2, 3, 4, 5, 6};
    float c[4] = {1, 2, 3, 4};
    float cn[4] = {NAN, NAN, NAN, NAN};
    pdp_sgemm(PDP_NO_TRANS, PDP_NO_TRANS, 2, 2, 0, 1.0f, a, 1, b, 2, 0.5f, c, 2);
    ASSERT_IN_RANGE(0.5, c[0], 0.0);
    ASSERT_IN_RANGE(2.0, c[3], 0.0);
    pdp_sgemm(PDP_NO_TRANS, PDP_NO_TRANS, 2, 2, 3, 0.0f, a, 3, b, 2, 2.0f, c, 2);
    ASSERT_IN_RANGE(1.0, c[0], 0.0);
    ASSERT_IN_RANGE(4.0, c[3], 0.0);
    pdp_sgemm(PDP_NO_TRANS, PDP_NO_TRANS, 2, 2, 3, 0.0f, a, 3, b, 2, 0.0f, cn, 2);
    ASSERT_IN_RANGE(0.0, cn[0], 0.0);
    ASSERT_IN_RANGE(0.0, cn[3], 0.0);
    PASS();
}

/* Each element is computed by one thread with the same summation order whatever
   the thread count: 1, 2 and 3 threads give the same bits. The shapes are above the
   parallel threshold and split along N (wide) or along M (narrow). */
TEST gemm_threads_bit_identical(void)
{
    static const int64_t shapes[][3] = {{128, 784, 512}, {130, 300, 257}, {600, 300, 20},
                                        {257, 129, 65}};
    int l, s, t;
    for (l = 0; l < 4; l++) {
        for (s = 0; s < 4; s++) {
            float *c[3];
            uint32_t seed = rng_state;
            for (t = 0; t < 3; t++) {
                gemm_case g = {layouts[l][0], layouts[l][1], shapes[s][0], shapes[s][1],
                               shapes[s][2], 1.0f, 0.5f, 3, 0};
                rng_state = seed; /* same inputs each time */
                if (t == 0) {
                    CHECK_CALL(check_case(&g, 1, &c[0]));
                } else { /* held to 1 thread's bits (and padding) below: no naive loop again */
                    mat a, b, cm;
                    float *c0;
                    run_case(&g, t + 1, &a, &b, &cm, &c0);
                    c[t] = cm.p;
                    free(a.p);
                    free(b.p);
                    free(c0);
                }
            }
            for (t = 1; t < 3; t++) {
                size_t bytes = sizeof(float) * (size_t)(shapes[s][0] * (shapes[s][2] + 3));
                ASSERT_MEM_EQm("1 thread and 2 or 3 threads differ", c[0], c[t], bytes);
            }
            for (t = 0; t < 3; t++) free(c[t]);
        }
    }
    PASS();
}

/* The training loop calls the same shapes every step: after the first call (which
   may grow the scratch of the caller and of the workers) nothing is allocated. */
TEST gemm_no_allocation_after_first_call(void)
{
    mat a = mat_new(128, 784, 0), w = mat_new(512, 784, 0), y = mat_new(128, 512, 0);
    mat dx = mat_new(128, 784, 0), dw = mat_new(512, 784, 0);
    int threads, step;
    long before = pdp_test_allocs();
    pdp_tensor *probe;
    int64_t one = 1;
    /* the counter sees the library's allocations (also when it lives in build/pdp_impl.o) */
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_create(&probe, pdp_cpu(), 1, &one), pdp_status_name);
    ASSERT(pdp_test_allocs() > before);
    pdp_tensor_free(probe);
    for (threads = 1; threads <= 2; threads++) {
        pdp_set_num_threads(threads);
        for (step = 0; step < 3; step++) {
            if (step == 1) before = pdp_test_allocs();
            /* forward y = x w^T, backward dw = dy^T x and dx = dy w */
            pdp_sgemm(PDP_NO_TRANS, PDP_TRANS, 128, 512, 784, 1.0f, a.p, 784, w.p, 784, 0.0f,
                      y.p, 512);
            pdp_sgemm(PDP_TRANS, PDP_NO_TRANS, 512, 784, 128, 1.0f, y.p, 512, a.p, 784, 0.0f,
                      dw.p, 784);
            pdp_sgemm(PDP_NO_TRANS, PDP_NO_TRANS, 128, 784, 512, 1.0f, y.p, 512, w.p, 784, 0.0f,
                      dx.p, 784);
        }
        ASSERT_EQ(before, pdp_test_allocs());
    }
    pdp_set_num_threads(1);
    free(a.p);
    free(w.p);
    free(y.p);
    free(dx.p);
    free(dw.p);
    PASS();
}

/* The build picks the kernel the compiler's target allows; PDP_NO_SIMD forces the
   portable one (tests/test_gemm_nosimd.c relies on that). */
TEST gemm_kernel_matches_target(void)
{
#if defined(PDP_CBLAS)
    SKIPm("PDP_CBLAS: the product is cblas_sgemm's");
#elif !defined(PDP_NO_SIMD) && defined(__AVX512F__)
    ASSERT_STR_EQ("avx512 8x32", PDP__GEMM_KERNEL);
#elif !defined(PDP_NO_SIMD) && defined(__AVX2__) && defined(__FMA__)
    ASSERT_STR_EQ("avx2 6x16", PDP__GEMM_KERNEL);
#else
    ASSERT_STR_EQ("portable 4x16", PDP__GEMM_KERNEL);
#endif
    PASS();
}

/* A C tile's elements come out with the same bits whatever the tile's size: a tile of at
   most one vector of columns or half the rows (the AVX-512 kernels' narrow loops) runs the
   FMA chain of a full tile. Columns 32-39 of a product with n = 40 (a last tile of 8
   columns) against the same columns of n = 50 (a last tile of 18: the full loop), and row 8
   of m = 9 (a last tile of 1 row) against row 8 of m = 13 (5 rows: the full loop), and
   both at once, the operands' shared rows and columns the same; every layout, k past one
   block, alpha and beta. */
TEST gemm_narrow_tile_has_the_wide_tiles_bits(void)
{
    enum { M = 13, K = 700, N = 50, MS = 9, NS = 40 };
    static float a[M * K], as[MS * K], b[K * N], bs[K * NS], c[M * N], cs[M * N], c0[M * N];
    int64_t i, j, l;
    for (i = 0; i < M * N; i++) c0[i] = rnd();
    for (l = 0; l < 4; l++) {
        pdp_trans ta = layouts[l][0], tb = layouts[l][1];
        int64_t lda = ta == PDP_NO_TRANS ? K : M, ldas = ta == PDP_NO_TRANS ? K : MS;
        int64_t ldb = tb == PDP_NO_TRANS ? N : K, ldbs = tb == PDP_NO_TRANS ? NS : K;
        for (i = 0; i < M * K; i++) a[i] = rnd();
        for (i = 0; i < K * N; i++) b[i] = rnd();
        for (i = 0; i < MS; i++) /* op(A)'s first MS rows, as A stores them */
            for (j = 0; j < K; j++)
                as[ta == PDP_NO_TRANS ? i * K + j : j * MS + i] =
                    a[ta == PDP_NO_TRANS ? i * K + j : j * M + i];
        for (i = 0; i < K; i++) /* op(B)'s first NS columns */
            for (j = 0; j < NS; j++)
                bs[tb == PDP_NO_TRANS ? i * NS + j : j * K + i] =
                    b[tb == PDP_NO_TRANS ? i * N + j : j * K + i];
        memcpy(c, c0, sizeof c);
        pdp_sgemm(ta, tb, M, N, K, 0.75f, a, lda, b, ldb, 0.5f, c, N);
        for (i = 0; i < M; i++) /* narrow columns: M x NS */
            for (j = 0; j < NS; j++) cs[i * NS + j] = c0[i * N + j];
        pdp_sgemm(ta, tb, M, NS, K, 0.75f, a, lda, bs, ldbs, 0.5f, cs, NS);
        for (i = 0; i < M; i++)
            ASSERT_MEM_EQm(layout_name(ta, tb), c + i * N, cs + i * NS, sizeof(float) * NS);
        memcpy(cs, c0, sizeof(float) * MS * N); /* narrow rows: MS x N */
        pdp_sgemm(ta, tb, MS, N, K, 0.75f, as, ldas, b, ldb, 0.5f, cs, N);
        ASSERT_MEM_EQm(layout_name(ta, tb), c, cs, sizeof(float) * MS * N);
        for (i = 0; i < MS; i++) /* both: MS x NS */
            for (j = 0; j < NS; j++) cs[i * NS + j] = c0[i * N + j];
        pdp_sgemm(ta, tb, MS, NS, K, 0.75f, as, ldas, bs, ldbs, 0.5f, cs, NS);
        for (i = 0; i < MS; i++)
            ASSERT_MEM_EQm(layout_name(ta, tb), c + i * N, cs + i * NS, sizeof(float) * NS);
    }
    PASS();
}

/* pdp__sgemm_dots (Conv2d's dW share of a layer with few weights: m x n dot products
   over a long k, B's rows gathered) against a double-precision loop: within the bound
   of an fp32 sum of k products, |err| <= k eps sum |a b| (Higham, "Accuracy and
   Stability of Numerical Algorithms", 2002, section 3.1), over block edges in m and n
   (shapes that are and are not whole 4 x 5 or, on AVX2, 4 x 3 blocks), k below, at and
   above a vector (16 or 8 lanes) and above a 512-float slice, and C's row stride wider
   than n. */
TEST gemm_dots_match_a_double_loop(void)
{
    static const int64_t cfg[7][3] = {/* m, n, k */
                                      {16, 25, 6776}, {3, 7, 15}, {5, 11, 16}, {1, 1, 1},
                                      {9, 26, 17},    {4, 5, 600}, {17, 24, 1100}};
    int t;
    for (t = 0; t < 7; t++) {
        int64_t m = cfg[t][0], n = cfg[t][1], k = cfg[t][2], i, j, p;
        int64_t lda = k + 3, span = k + 40 * n; /* B's rows overlap, as an image's taps */
        float *a = (float *)malloc((size_t)(m * lda) * sizeof(float));
        float *b = (float *)malloc((size_t)span * sizeof(float));
        float *c = (float *)malloc((size_t)(m * (n + 2)) * sizeof(float));
        int64_t *brow = (int64_t *)malloc((size_t)n * sizeof(int64_t));
        ASSERT(a && b && c && brow);
        for (i = 0; i < m * lda; i++) a[i] = rnd();
        for (i = 0; i < span; i++) b[i] = rnd();
        for (j = 0; j < n; j++) brow[j] = (j * 37) % (40 * n);
        ASSERT(pdp__sgemm_dots_fits(m, n));
        pdp__sgemm_dots(m, n, k, a, lda, b, brow, c, n + 2);
        for (i = 0; i < m; i++)
            for (j = 0; j < n; j++) {
                double want = 0.0, mag = 0.0;
                for (p = 0; p < k; p++) {
                    want += (double)a[i * lda + p] * (double)b[brow[j] + p];
                    mag += fabs((double)a[i * lda + p] * (double)b[brow[j] + p]);
                }
                ASSERT_IN_RANGE(want, c[i * (n + 2) + j], (double)k * FLT_EPSILON * mag + 1e-30);
            }
        free(a);
        free(b);
        free(c);
        free(brow);
    }
    PASS();
}

/* pdp__sgemm_runs (Conv2d's implicit GEMM without the bands) against pdp__sgemm_rows
   on the whole gathered B, bands included: every wanted column the same bits (the
   same FMA chain over k, in the same k blocks). Runs shorter than, equal to and
   longer than a vector, contiguous runs (no band) and bands, one and several rows,
   row tiles with a remainder, k over one and two blocks, the last tile partial. */
TEST gemm_runs_match_rows_on_the_wanted_columns(void)
{
#if !defined(PDP__GEMM_RUNS)
    SKIPm("no band-skipping kernel in this build (needs the AVX-512 kernel)");
#else
    static const int64_t cfg[8][6] = {/* m, k, rows, runs, run, band */
                                      {32, 400, 14, 8, 14, 2}, {16, 800, 14, 8, 14, 4},
                                      {5, 25, 3, 5, 3, 1},     {9, 130, 2, 3, 16, 0},
                                      {13, 700, 1, 2, 17, 3},  {8, 64, 4, 1, 40, 2},
                                      {3, 33, 5, 7, 7, 0},     {17, 1100, 2, 2, 33, 5}};
    int t;
    for (t = 0; t < 8; t++) {
        int64_t m = cfg[t][0], k = cfg[t][1], rows = cfg[t][2], runs = cfg[t][3];
        int64_t run = cfg[t][4], ustride = run + cfg[t][5], rstride = runs * ustride + 3;
        int64_t full = rows * rstride, n = rows * runs * run, width = full + 64, i, p;
        int64_t r, u, x;
        float *a = (float *)malloc(sizeof(float) * (size_t)(m * k));
        float *b = (float *)malloc(sizeof(float) * (size_t)(k * width));
        float *cr = (float *)malloc(sizeof(float) * (size_t)(m * full));
        float *cu = (float *)malloc(sizeof(float) * (size_t)(m * n));
        int64_t *brow = (int64_t *)malloc(sizeof(int64_t) * (size_t)k);
        for (i = 0; i < m * k; i++) a[i] = rnd();
        for (i = 0; i < k * width; i++) b[i] = rnd();
        for (p = 0; p < k; p++) brow[p] = (p * 37) % k * width + p % 5; /* rows anywhere */
        pdp__sgemm_rows(PDP_NO_TRANS, PDP_NO_TRANS, m, full, k, 1.0f, a, k, b, brow, 0.0f, cr,
                        full);
        pdp__sgemm_runs(m, k, a, k, b, brow, rows, runs, run, rstride, ustride, cu, n);
        for (i = 0; i < m; i++)
            for (r = 0; r < rows; r++)
                for (u = 0; u < runs; u++)
                    for (x = 0; x < run; x++) {
                        float want = cr[i * full + r * rstride + u * ustride + x];
                        float got = cu[i * n + (r * runs + u) * run + x];
                        if (memcmp(&want, &got, sizeof got) != 0) {
                            static char msg[160];
                            snprintf(msg, sizeof msg,
                                     "case %d: row %lld, column (%lld, %lld, %lld): %.9g != %.9g",
                                     t, (long long)i, (long long)r, (long long)u, (long long)x,
                                     got, want);
                            FAILm(msg);
                        }
                    }
        free(a);
        free(b);
        free(cr);
        free(cu);
        free(brow);
    }
    PASS();
#endif
}

/* pdp__sgemm_bf16 (gemm_bf16.c's sgemm-rounded path) rounds its operands as it packs
   them: pdp__gemm_round16 (16 lanes at a time where AVX-512 is, then one by one) gives
   pdp_bf16_round's bits on ties, NaNs with payloads only in the low half, Inf,
   overflow, subnormals and random patterns, at every length up to 40 (the tail); and
   the product is pdp_sgemm on the rounded operands, bit for bit, in all layouts, with k
   past one KC block, at 1 and 2 threads, on operands salted with those values (ties
   either way, subnormals, a signalling NaN in A), so that every packing route (the 8 x 8
   register transposes, the vector copies, the scalar tails and ragged edges) rounds
   them. Without the rounding it is pdp_sgemm on the floats, which differs. */
TEST gemm_bf16_rounding_at_packing_is_sgemm_on_rounded_inputs(void)
{
    static const uint32_t special[] = {0x3f808000u, 0x3f818000u, 0x7f800001u, 0xff800001u,
                                       0x7fc00000u, 0x7f800000u, 0xff800000u, 0x7f7fffffu,
                                       0x007f8000u, 0x807fffffu, 0x00000001u, 0x80000000u};
    /* the finite ones, for the product: ties (down, up, at other exponents), subnormals
       rounding up to 2^-126 or down, a subnormal bf16, -0 */
    static const uint32_t salt[] = {0x3f808000u, 0x3f818000u, 0xc0808000u, 0x41018000u,
                                    0x007f8000u, 0x807fffffu, 0x00000001u, 0x80000000u,
                                    0x00408000u, 0xbe7f8000u};
    float x[40], y[40];
    int len, i, ta, tb, threads;
    for (len = 0; len <= 40; len++) {
        for (i = 0; i < len; i++) {
            uint32_t u = i < 12 ? special[i] : (rng_state = rng_state * 1664525u + 1013904223u);
            memcpy(&x[i], &u, sizeof u);
        }
        memcpy(y, x, sizeof x);
        pdp__gemm_round16(y, len);
        for (i = 0; i < len; i++) {
            float r = pdp_bf16_round(x[i]);
            ASSERT_MEM_EQ(&r, &y[i], sizeof r);
        }
    }
    for (ta = 0; ta < 2; ta++)
        for (tb = 0; tb < 2; tb++)
            for (threads = 1; threads <= 2; threads++) {
                int64_t m = 21, n = 37, k = 530, lda = ta ? m : k, ldb = tb ? k : n;
                float *a = (float *)malloc(sizeof(float) * (size_t)(m * k));
                float *b = (float *)malloc(sizeof(float) * (size_t)(k * n));
                float *ar = (float *)malloc(sizeof(float) * (size_t)(m * k));
                float *br = (float *)malloc(sizeof(float) * (size_t)(k * n));
                float *c1 = (float *)malloc(sizeof(float) * (size_t)(m * n));
                float *c2 = (float *)malloc(sizeof(float) * (size_t)(m * n));
                uint32_t snan = 0x7f800001u;
                int same;
                for (i = 0; i < m * k; i++) {
                    a[i] = rnd();
                    if (i % 5 == 0) memcpy(&a[i], &salt[(i / 5) % 10], sizeof(float));
                }
                for (i = 0; i < k * n; i++) {
                    b[i] = rnd();
                    if (i % 3 == 0) memcpy(&b[i], &salt[(i / 3) % 10], sizeof(float));
                }
                memcpy(&a[(m * k) / 2 + 3], &snan, sizeof snan);
                for (i = 0; i < m * k; i++) ar[i] = pdp_bf16_round(a[i]);
                for (i = 0; i < k * n; i++) br[i] = pdp_bf16_round(b[i]);
                for (i = 0; i < m * n; i++) c1[i] = c2[i] = rnd();
                pdp_set_num_threads(threads);
                pdp__sgemm_bf16((pdp_trans)ta, (pdp_trans)tb, m, n, k, 0.5f, a, lda, b, ldb,
                                2.0f, c1, n);
                pdp_sgemm((pdp_trans)ta, (pdp_trans)tb, m, n, k, 0.5f, ar, lda, br, ldb, 2.0f,
                          c2, n);
                pdp_set_num_threads(1);
                same = memcmp(c1, c2, sizeof(float) * (size_t)(m * n)) == 0;
                free(a), free(b), free(ar), free(br), free(c1), free(c2);
                ASSERTm(layout_name((pdp_trans)ta, (pdp_trans)tb), same);
            }
    PASS();
}

/* pdp__sgemm_bf16_b (op(A) bf16 already: only op(B) rounded at packing) is
   pdp__sgemm_bf16's bits when A holds bf16 values, in all layouts, and B's rounding is not
   skipped (B salted with ties). Then the model: a bf16 MLP 37-45-29-10 (two Linears with a
   fused ReLU, whose backward rounds the masked dY as it stores it, and whose products
   then skip op(A)'s rounding where they run sgemm-rounded: in test_gemm_nosimd, where
   AUTO takes it for every product) has the weight gradients of the same GEMMs called by
   hand through pdp_gemm_bf16 on unrounded dY, bit for bit: it fails if the ReLU's pass
   does not round (sgemm-rounded then multiplies unrounded dY). */
TEST gemm_bf16_b_and_the_relu_backward_round_dy_once(void)
{
    enum { B = 13 };
    static const int64_t width[4] = {37, 45, 29, 10};
    float x[B * 37], h[3][B * 45], dh[B * 45], dz[B * 45], dy[B * 10], gw[3][45 * 37];
    int64_t i, L, shape[2] = {B, 37};
    int ta, tb;
    pdp_model_desc d;
    pdp_model *m = NULL;
    pdp_tensor xt, dyt;
    const pdp_tensor *y = NULL;
    for (ta = 0; ta < 2; ta++)
        for (tb = 0; tb < 2; tb++) {
            int64_t mm = 19, n = 35, k = 530, lda = ta ? mm : k, ldb = tb ? k : n;
            float *a = (float *)malloc(sizeof(float) * (size_t)(mm * k));
            float *b = (float *)malloc(sizeof(float) * (size_t)(k * n));
            float *c1 = (float *)malloc(sizeof(float) * (size_t)(mm * n));
            float *c2 = (float *)malloc(sizeof(float) * (size_t)(mm * n));
            uint32_t tie = 0x3f818000u; /* 1.01171875 + half an ulp of bf16: rounds up */
            int same;
            for (i = 0; i < mm * k; i++) a[i] = pdp_bf16_round(rnd());
            for (i = 0; i < k * n; i++) {
                b[i] = rnd();
                if (i % 3 == 0) memcpy(&b[i], &tie, sizeof tie);
            }
            for (i = 0; i < mm * n; i++) c1[i] = c2[i] = rnd();
            pdp__sgemm_bf16_b((pdp_trans)ta, (pdp_trans)tb, mm, n, k, 0.5f, a, lda, b, ldb, 2.0f,
                              c1, n);
            pdp__sgemm_bf16((pdp_trans)ta, (pdp_trans)tb, mm, n, k, 0.5f, a, lda, b, ldb, 2.0f, c2,
                            n);
            same = memcmp(c1, c2, sizeof(float) * (size_t)(mm * n)) == 0;
            free(a), free(b), free(c1), free(c2);
            ASSERTm(layout_name((pdp_trans)ta, (pdp_trans)tb), same);
        }
    memset(&d, 0, sizeof d);
    d.input_shape[0] = 37;
    d.seed = 5;
    d.precision = PDP_PRECISION_BF16;
    ASSERT_EQ(PDP_OK, pdp_model_create(&m, &d));
    ASSERT_EQ(PDP_OK, pdp_model_add_linear(m, 45));
    ASSERT_EQ(PDP_OK, pdp_model_add_relu(m));
    ASSERT_EQ(PDP_OK, pdp_model_add_linear(m, 29));
    ASSERT_EQ(PDP_OK, pdp_model_add_relu(m));
    ASSERT_EQ(PDP_OK, pdp_model_add_linear(m, 10));
    for (i = 0; i < B * 37; i++) x[i] = rnd();
    for (i = 0; i < B * 10; i++) dy[i] = rnd();
    pdp_tensor_wrap(x, pdp_cpu(), 2, shape, &xt);
    ASSERT_EQ(PDP_OK, pdp_model_forward(m, &xt, &y));
    pdp_tensor_wrap(dy, pdp_cpu(), 2, y->shape, &dyt);
    pdp_model_zero_grad(m);
    ASSERT_EQ(PDP_OK, pdp_model_backward(m, &dyt));
    /* by hand: h[L] = relu(h[L-1] W_L^T + b_L) (h[0] the input), then backward */
    memcpy(h[0], x, sizeof x);
    for (L = 0; L < 3; L++) {
        pdp_param w, bb;
        char name[16];
        int64_t in = width[L], out = width[L + 1];
        float *o = L < 2 ? h[L + 1] : dz; /* the output's logits: dz, unused as such */
        snprintf(name, sizeof name, "%d.weight", (int)(2 * L));
        pdp_model_find_param(m, name, &w);
        snprintf(name, sizeof name, "%d.bias", (int)(2 * L));
        pdp_model_find_param(m, name, &bb);
        for (i = 0; i < B * out; i++) o[i] = bb.value.data[i % out];
        pdp_gemm_bf16(PDP_NO_TRANS, PDP_TRANS, B, out, in, 1.0f, L ? h[L] : x, in, w.value.data,
                      in, 1.0f, o, out);
        if (L < 2)
            for (i = 0; i < B * out; i++) o[i] = o[i] > 0.0f ? o[i] : 0.0f;
    }
    memcpy(dz, dy, sizeof dy); /* the last Linear's dY: no ReLU */
    for (L = 2; L >= 0; L--) {
        pdp_param w;
        char name[16];
        int64_t in = width[L], out = width[L + 1];
        snprintf(name, sizeof name, "%d.weight", (int)(2 * L));
        pdp_model_find_param(m, name, &w);
        memset(gw[L], 0, sizeof gw[L]);
        pdp_gemm_bf16(PDP_TRANS, PDP_NO_TRANS, out, in, B, 1.0f, dz, out, L ? h[L] : x, in, 1.0f,
                      gw[L], in);
        ASSERT_MEM_EQ(gw[L], w.grad.data, sizeof(float) * (size_t)(out * in));
        if (L == 0) break;
        pdp_gemm_bf16(PDP_NO_TRANS, PDP_NO_TRANS, B, in, out, 1.0f, dz, out, w.value.data, in,
                      0.0f, dh, in);
        for (i = 0; i < B * in; i++) dz[i] = h[L][i] <= 0.0f ? 0.0f : dh[i];
    }
    pdp_model_free(m);
    PASS();
}

SUITE(gemm)
{
    RUN_TEST(gemm_kernel_matches_target);
    RUN_TEST(gemm_narrow_tile_has_the_wide_tiles_bits);
    RUN_TEST(gemm_matches_naive_odd_shapes);
    RUN_TEST(gemm_matches_naive_257_cube);
    RUN_TEST(gemm_matches_naive_mixed_shapes);
    RUN_TEST(gemm_alpha_beta_and_leading_dims);
    RUN_TEST(gemm_beta_zero_ignores_nan_in_c);
    RUN_TEST(gemm_k_zero_or_alpha_zero_scales_c);
    RUN_TEST(gemm_threads_bit_identical);
    RUN_TEST(gemm_no_allocation_after_first_call);
    RUN_TEST(gemm_dots_match_a_double_loop);
    RUN_TEST(gemm_runs_match_rows_on_the_wanted_columns);
    RUN_TEST(gemm_bf16_rounding_at_packing_is_sgemm_on_rounded_inputs);
    RUN_TEST(gemm_bf16_b_and_the_relu_backward_round_dy_once);
}

GREATEST_MAIN_DEFS();

int main(int argc, char **argv)
{
    GREATEST_MAIN_BEGIN();
    RUN_SUITE(gemm);
    pdp_shutdown_threads();
    GREATEST_MAIN_END();
}
