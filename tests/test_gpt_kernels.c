/* Tests of the GPT's kernels (src/layers_gpt.c): token and position embedding, causal
   multi-head self-attention, LayerNorm over the last dimension, the tanh GELU and
   cross-entropy with ignored rows, each against a naive double-precision loop written
   here from the formulas, on odd shapes (B 1, 3, T 1, 5, 16, H 1, 2, 4, D 3, 8).

   Gradients against central finite differences through those double loops: f = sum(out
   r) for a fixed random r, df/dv ~ (f(v + h) - f(v - h)) / (2 h), h = 1e-4. In double the
   difference is exact to ~1e-8, so the tolerance 2e-4 (1 + |g|) covers the fp32 kernel's
   rounding (sums of at most 16 terms of order 1) and nothing more. The causal mask has
   its own direct test (a later token changes no earlier output or gradient), dropout is
   checked for p = 0 against none and for reproducibility, 1 and 2 threads give the same
   bits, and every error path is checked by status and message.

   cc -std=c99 -O2 -Itests -I. tests/test_gpt_kernels.c -lm -lpthread (or make) */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#define PDP_IMPLEMENTATION
#include "pdp.h"
#include "pdp_test.h"
#include "fixture.h"

#include <math.h>
#include <string.h>

/* ---- LayerNorm over the last dimension ----
   layers.c's LayerNorm normalises each sample over all of its features with a weight
   and bias of the sample's shape: with rows of C as its samples, that is PyTorch's
   LayerNorm(C) over the last dimension of [N, C]. These call it, nothing copied. */

static void ln_rows_io(pdp__layer *l, pdp__layer_io *io, int64_t N, int64_t C,
                                        float eps)
{
    memset(l, 0, sizeof *l);
    memset(io, 0, sizeof *io);
    l->kind = PDP__LAYERNORM;
    l->in_ndim = l->out_ndim = 1;
    l->in_shape[0] = l->out_shape[0] = C;
    l->in_count = l->out_count = C;
    l->eps = eps;
    l->saved_per_sample = 2;
    l->work_per_sample = pdp__layernorm_work(l); /* as its setup sizes it */
    io->batch = N;
}

/* y = (x - mean) rstd w + b per row of x [N, C]; saved [N, 2]: (mean, rstd) per row. */
static void ln_rows_forward(const float *x, const float *w, const float *b,
                                             int64_t N, int64_t C, float eps, float *y,
                                             float *saved)
{
    pdp__layer l;
    pdp__layer_io io;
    ln_rows_io(&l, &io, N, C, eps);
    io.x = x;
    io.y = y;
    io.w = (float *)w; /* the forward only reads them */
    io.b = (float *)b;
    io.saved = saved;
    (void)pdp__layernorm_forward(&l, &io);
}

/* dx written (skipped when NULL), dw and db accumulated (+=), from dy, x, w, saved; the
   workspace (the chunks' shares) exactly as large as the model would make it, so that ASan
   sees a share written past it. */
static void ln_rows_backward(const float *x, const float *w, const float *saved,
                                              const float *dy, int64_t N, int64_t C, float *dx,
                                              float *dw, float *db)
{
    pdp__layer l;
    pdp__layer_io io;
    ln_rows_io(&l, &io, N, C, 0.0f);
    io.work = (float *)malloc((size_t)(N * l.work_per_sample + 1) * sizeof(float));
    io.x = x;
    io.w = (float *)w; /* read only */
    io.saved = (float *)saved;
    io.dy = dy;
    io.dx = dx;
    io.dw = dw;
    io.db = db;
    (void)pdp__layernorm_backward(&l, &io);
    free(io.work);
}

#define FD_H 1e-4
#define FD_TOL 2e-4

static pdp_rng rng;

static void fill(float *x, int64_t n, float lo, float hi)
{
    int64_t i;
    for (i = 0; i < n; i++) x[i] = lo + (hi - lo) * pdp_rng_uniform(&rng);
}

static double *to_double(const float *x, int64_t n)
{
    double *d = (double *)malloc((size_t)n * sizeof *d);
    int64_t i;
    for (i = 0; i < n; i++) d[i] = x[i];
    return d;
}

static int close_to(double got, double want, double tol)
{
    return fabs(got - want) <= tol * (1.0 + fabs(want));
}

/* ---- naive attention in double, from the formulas ---- */

/* keep factor of (b, h, t, s): the stream documented in layers_gpt.c */
static double keep_of(const pdp__attn_dropout *d, int64_t T, int64_t b, int64_t h, int64_t t,
                      int64_t s)
{
    uint64_t key;
    if (!d || d->p == 0.0f) return 1.0;
    key = pdp__dropout_key(d->seed, d->layer, d->step, d->sample_base + b);
    return pdp__dropout_bits(key, ((h + d->head_base) * T + t) * T + s) >= pdp__dropout_threshold(d->p)
               ? (double)(1.0f / (1.0f - d->p))
               : 0.0;
}

/* y [B, T, C] and P [B, H, T, T] from qkv [B, T, 3C] */
static void naive_attention(const double *qkv, int64_t B, int64_t T, int64_t C, int64_t H,
                            const pdp__attn_dropout *drop, double *y, double *P)
{
    int64_t D = C / H, b, h, t, s, d;
    double scale = 1.0 / sqrt((double)D);
    for (b = 0; b < B; b++)
        for (h = 0; h < H; h++)
            for (t = 0; t < T; t++) {
                double *p = P + ((b * H + h) * T + t) * T, mx = -HUGE_VAL, sum = 0.0;
                for (s = 0; s < T; s++) {
                    double dot = 0.0;
                    for (d = 0; d < D; d++)
                        dot += qkv[(b * T + t) * 3 * C + h * D + d] *
                               qkv[(b * T + s) * 3 * C + C + h * D + d];
                    p[s] = s <= t ? dot * scale : -HUGE_VAL;
                    if (p[s] > mx) mx = p[s];
                }
                for (s = 0; s < T; s++) sum += (p[s] = exp(p[s] - mx));
                for (s = 0; s < T; s++) p[s] /= sum;
                for (d = 0; d < D; d++) y[(b * T + t) * C + h * D + d] = 0.0;
                for (s = 0; s < T; s++) {
                    double pk = p[s] * keep_of(drop, T, b, h, t, s);
                    for (d = 0; d < D; d++)
                        y[(b * T + t) * C + h * D + d] +=
                            pk * qkv[(b * T + s) * 3 * C + 2 * C + h * D + d];
                }
            }
}

static double naive_attention_f(const double *qkv, int64_t B, int64_t T, int64_t C, int64_t H,
                                const pdp__attn_dropout *drop, const double *r, double *y,
                                double *P)
{
    double f = 0.0;
    int64_t i;
    naive_attention(qkv, B, T, C, H, drop, y, P);
    for (i = 0; i < B * T * C; i++) f += y[i] * r[i];
    return f;
}

typedef struct attn_bufs {
    float *qkv, *y, *att, *work, *dy, *dqkv;
} attn_bufs;

static attn_bufs attn_alloc(int64_t B, int64_t T, int64_t C, int64_t H)
{
    attn_bufs a;
    a.qkv = (float *)malloc((size_t)(B * T * 3 * C) * sizeof(float));
    a.dqkv = (float *)malloc((size_t)(B * T * 3 * C) * sizeof(float));
    a.y = (float *)malloc((size_t)(B * T * C) * sizeof(float));
    a.dy = (float *)malloc((size_t)(B * T * C) * sizeof(float));
    a.att = (float *)malloc((size_t)(B * H * T * T) * sizeof(float));
    a.work = (float *)malloc((size_t)(B * H * T * (T + 1)) * sizeof(float));
    return a;
}

static void attn_free(attn_bufs *a)
{
    free(a->qkv);
    free(a->dqkv);
    free(a->y);
    free(a->dy);
    free(a->att);
    free(a->work);
}

static const int64_t Bs[] = {1, 3}, Ts[] = {1, 5, 16}, Hs[] = {1, 2, 4}, Ds[] = {3, 8};

/* Forward y and att against the double loop, with and without dropout. */
TEST gpt_attention_forward_matches_naive(void)
{
    size_t bi, ti, hi, di;
    int pi;
    for (bi = 0; bi < 2; bi++)
        for (ti = 0; ti < 3; ti++)
            for (hi = 0; hi < 3; hi++)
                for (di = 0; di < 2; di++)
                    for (pi = 0; pi < 2; pi++) {
                        int64_t B = Bs[bi], T = Ts[ti], H = Hs[hi], C = H * Ds[di], i;
                        pdp__attn_dropout drop = {0.3f, 7, 2, 1, 5, 0};
                        attn_bufs a = attn_alloc(B, T, C, H);
                        double *q, *y = (double *)malloc((size_t)(B * T * C) * sizeof(double));
                        double *P = (double *)malloc((size_t)(B * H * T * T) * sizeof(double));
                        fill(a.qkv, B * T * 3 * C, -2.0f, 2.0f);
                        q = to_double(a.qkv, B * T * 3 * C);
                        pdp__attention_forward(a.qkv, B, T, C, H, pi ? &drop : NULL, a.y, a.att,
                                               a.work);
                        naive_attention(q, B, T, C, H, pi ? &drop : NULL, y, P);
                        for (i = 0; i < B * T * C; i++)
                            ASSERT_IN_RANGEm("y", y[i], a.y[i], 1e-5 * (1.0 + fabs(y[i])));
                        for (i = 0; i < B * H * T * T; i++)
                            ASSERT_IN_RANGEm("att", P[i], a.att[i], 1e-6);
                        free(q);
                        free(y);
                        free(P);
                        attn_free(&a);
                    }
    PASS();
}

/* dqkv against central differences of f = sum(y r) through the double loop. */
TEST gpt_attention_backward_matches_finite_differences(void)
{
    size_t bi, ti, hi, di;
    int pi;
    for (bi = 0; bi < 2; bi++)
        for (ti = 0; ti < 3; ti++)
            for (hi = 0; hi < 3; hi++)
                for (di = 0; di < 2; di++)
                    for (pi = 0; pi < 2; pi++) {
                        int64_t B = Bs[bi], T = Ts[ti], H = Hs[hi], C = H * Ds[di], i;
                        int64_t n = B * T * 3 * C;
                        pdp__attn_dropout drop = {0.25f, 11, 0, 3, 0, 0};
                        const pdp__attn_dropout *dp = pi ? &drop : NULL;
                        attn_bufs a = attn_alloc(B, T, C, H);
                        double *q, *r, *y = (double *)malloc((size_t)(B * T * C) * sizeof(double));
                        double *P = (double *)malloc((size_t)(B * H * T * T) * sizeof(double));
                        fill(a.qkv, n, -1.5f, 1.5f);
                        fill(a.dy, B * T * C, -1.0f, 1.0f);
                        q = to_double(a.qkv, n);
                        r = to_double(a.dy, B * T * C);
                        pdp__attention_forward(a.qkv, B, T, C, H, dp, a.y, a.att, a.work);
                        fill(a.dqkv, n, 5.0f, 6.0f); /* written, not accumulated */
                        pdp__attention_backward(a.qkv, a.att, a.dy, B, T, C, H, dp, a.dqkv,
                                                a.work);
                        /* every element, or every 7th of the larger inputs (7 is prime to
                           3C here: the visited column moves along from row to row) */
                        for (i = 0; i < n; i += n > 512 ? 7 : 1) {
                            /* qkv of sequence b moves only y of sequence b */
                            int64_t b = i / (T * 3 * C);
                            pdp__attn_dropout db = drop;
                            double v = q[i], fp, fm, *qb = q + b * T * 3 * C, *rb = r + b * T * C;
                            db.sample_base += b;
                            q[i] = v + FD_H;
                            fp = naive_attention_f(qb, 1, T, C, H, dp ? &db : NULL, rb, y, P);
                            q[i] = v - FD_H;
                            fm = naive_attention_f(qb, 1, T, C, H, dp ? &db : NULL, rb, y, P);
                            q[i] = v;
                            if (!close_to(a.dqkv[i], (fp - fm) / (2 * FD_H), FD_TOL)) {
                                fprintf(stderr, "B %lld T %lld H %lld C %lld p %d: dqkv[%lld] %g, "
                                        "differences %g\n", (long long)B, (long long)T,
                                        (long long)H, (long long)C, pi, (long long)i,
                                        (double)a.dqkv[i], (fp - fm) / (2 * FD_H));
                                FAILm("dqkv");
                            }
                        }
                        free(q);
                        free(r);
                        free(y);
                        free(P);
                        attn_free(&a);
                    }
    PASS();
}

/* The causal mask, directly: changing token t0's q, k and v changes no output before
   t0 (bit for bit) and does change t0's; a dy that is zero from t0 on gives zero dqkv
   from t0 on. */
TEST gpt_attention_mask_later_token_changes_no_earlier_output(void)
{
    int64_t B = 2, T = 16, H = 4, C = 32, t0, i, b;
    attn_bufs a = attn_alloc(B, T, C, H), c = attn_alloc(B, T, C, H);
    fill(a.qkv, B * T * 3 * C, -1.0f, 1.0f);
    pdp__attention_forward(a.qkv, B, T, C, H, NULL, a.y, a.att, a.work);
    for (t0 = 1; t0 < T; t0 += 7) {
        memcpy(c.qkv, a.qkv, (size_t)(B * T * 3 * C) * sizeof(float));
        for (b = 0; b < B; b++)
            for (i = 0; i < 3 * C; i++) c.qkv[(b * T + t0) * 3 * C + i] += 0.5f;
        pdp__attention_forward(c.qkv, B, T, C, H, NULL, c.y, c.att, c.work);
        for (b = 0; b < B; b++) {
            size_t before = (size_t)(t0 * C) * sizeof(float), row = (size_t)C * sizeof(float);
            ASSERT_EQ(0, memcmp(a.y + b * T * C, c.y + b * T * C, before));
            ASSERT(memcmp(a.y + (b * T + t0) * C, c.y + (b * T + t0) * C, row));
        }
        for (b = 0; b < B; b++)
            for (i = 0; i < T * C; i++) a.dy[b * T * C + i] = i / C < t0 ? 1.0f : 0.0f;
        pdp__attention_backward(a.qkv, a.att, a.dy, B, T, C, H, NULL, a.dqkv, a.work);
        for (b = 0; b < B; b++)
            for (i = t0 * 3 * C; i < T * 3 * C; i++) ASSERT_EQ(0.0f, a.dqkv[b * T * 3 * C + i]);
    }
    attn_free(&a);
    attn_free(&c);
    PASS();
}

/* Scores of order 1e4: without the max subtraction exp overflows; att rows still sum
   to 1 and y matches the double loop. */
TEST gpt_attention_softmax_safe_with_large_scores(void)
{
    int64_t B = 1, T = 5, H = 1, C = 4, i, t;
    attn_bufs a = attn_alloc(B, T, C, H);
    double *q, y[5 * 4], P[5 * 5];
    fill(a.qkv, B * T * 3 * C, 60.0f, 100.0f);
    q = to_double(a.qkv, B * T * 3 * C);
    pdp__attention_forward(a.qkv, B, T, C, H, NULL, a.y, a.att, a.work);
    naive_attention(q, B, T, C, H, NULL, y, P);
    for (t = 0; t < T; t++) {
        double sum = 0.0;
        for (i = 0; i < T; i++) sum += a.att[t * T + i];
        ASSERT_IN_RANGE(1.0, sum, 1e-6);
    }
    for (i = 0; i < B * T * C; i++) ASSERT_IN_RANGE(y[i], a.y[i], 1e-4 * (1.0 + fabs(y[i])));
    free(q);
    attn_free(&a);
    PASS();
}

/* A sequence longer than the kernel's query blocks (PDP__ATTN_BLOCK, 64: T = 150 is two
   whole blocks and a part), where each block's products stop at its last row's keys and
   the backward adds the blocks' dV and dK in turn: forward against the double loop,
   dqkv against central differences (every 31st element), with and without dropout. */
TEST gpt_attention_blocks_match_naive_and_finite_differences(void)
{
    int64_t B = 1, T = 150, H = 2, C = 6, n = B * T * 3 * C, i;
    int pi;
    ASSERT(T > 2 * PDP__ATTN_BLOCK);
    for (pi = 0; pi < 2; pi++) {
        pdp__attn_dropout drop = {0.2f, 5, 0, 2, 0, 0};
        const pdp__attn_dropout *dp = pi ? &drop : NULL;
        attn_bufs a = attn_alloc(B, T, C, H);
        double *q, *r, *y = (double *)malloc((size_t)(B * T * C) * sizeof(double));
        double *P = (double *)malloc((size_t)(B * H * T * T) * sizeof(double));
        fill(a.qkv, n, -1.5f, 1.5f);
        fill(a.dy, B * T * C, -1.0f, 1.0f);
        q = to_double(a.qkv, n);
        r = to_double(a.dy, B * T * C);
        pdp__attention_forward(a.qkv, B, T, C, H, dp, a.y, a.att, a.work);
        naive_attention(q, B, T, C, H, dp, y, P);
        for (i = 0; i < B * T * C; i++)
            ASSERT_IN_RANGEm("y", y[i], a.y[i], 1e-5 * (1.0 + fabs(y[i])));
        for (i = 0; i < B * H * T * T; i++) ASSERT_IN_RANGEm("att", P[i], a.att[i], 1e-6);
        fill(a.dqkv, n, 5.0f, 6.0f); /* written, not accumulated */
        pdp__attention_backward(a.qkv, a.att, a.dy, B, T, C, H, dp, a.dqkv, a.work);
        for (i = 0; i < n; i += 31) {
            double v = q[i], fp, fm;
            q[i] = v + FD_H;
            fp = naive_attention_f(q, B, T, C, H, dp, r, y, P);
            q[i] = v - FD_H;
            fm = naive_attention_f(q, B, T, C, H, dp, r, y, P);
            q[i] = v;
            ASSERTm("dqkv", close_to(a.dqkv[i], (fp - fm) / (2 * FD_H), FD_TOL));
        }
        free(q);
        free(r);
        free(y);
        free(P);
        attn_free(&a);
    }
    PASS();
}

/* p = 0 gives the bits of no dropout; p > 0 the same bits from the same key and other
   bits from another seed, step or sample_base; eval (NULL) after training is unchanged. */
TEST gpt_attention_dropout_reproducible(void)
{
    int64_t B = 2, T = 16, H = 2, C = 16, n = B * T * C;
    pdp__attn_dropout zero = {0.0f, 1, 0, 0, 0, 0}, d = {0.2f, 1, 0, 4, 0, 0}, e = d;
    attn_bufs a = attn_alloc(B, T, C, H), c = attn_alloc(B, T, C, H);
    fill(a.qkv, B * T * 3 * C, -1.0f, 1.0f);
    memcpy(c.qkv, a.qkv, (size_t)(B * T * 3 * C) * sizeof(float));
    pdp__attention_forward(a.qkv, B, T, C, H, NULL, a.y, a.att, a.work);
    pdp__attention_forward(c.qkv, B, T, C, H, &zero, c.y, c.att, c.work);
    ASSERT_EQ(0, memcmp(a.y, c.y, (size_t)n * sizeof(float)));
    pdp__attention_forward(a.qkv, B, T, C, H, &d, a.y, a.att, a.work);
    pdp__attention_forward(c.qkv, B, T, C, H, &d, c.y, c.att, c.work);
    ASSERT_EQ(0, memcmp(a.y, c.y, (size_t)n * sizeof(float)));
    e.seed = 2;
    pdp__attention_forward(c.qkv, B, T, C, H, &e, c.y, c.att, c.work);
    ASSERT(memcmp(a.y, c.y, (size_t)n * sizeof(float)));
    e = d;
    e.sample_base = 1; /* sequence 1 of this batch is sequence 0 of that one */
    pdp__attention_forward(c.qkv + T * 3 * C, 1, T, C, H, &d, c.y, c.att, c.work);
    pdp__attention_forward(c.qkv + T * 3 * C, 1, T, C, H, &e, c.y + T * C, c.att, c.work);
    ASSERT(memcmp(c.y, c.y + T * C, (size_t)(T * C) * sizeof(float)));
    pdp__attention_forward(a.qkv + T * 3 * C, 1, T, C, H, &e, c.y, c.att, c.work);
    ASSERT_EQ(0, memcmp(a.y + T * C, c.y, (size_t)(T * C) * sizeof(float)));
    attn_free(&a);
    attn_free(&c);
    PASS();
}

/* 1 and 2 threads: the same bits, forward and backward, with dropout. */
TEST gpt_attention_threads_bit_identical(void)
{
    int64_t B = 3, T = 16, H = 4, C = 32, n = B * T * 3 * C;
    pdp__attn_dropout d = {0.1f, 3, 1, 0, 0, 0};
    attn_bufs a = attn_alloc(B, T, C, H), c = attn_alloc(B, T, C, H);
    fill(a.qkv, n, -1.0f, 1.0f);
    fill(a.dy, B * T * C, -1.0f, 1.0f);
    memcpy(c.qkv, a.qkv, (size_t)n * sizeof(float));
    memcpy(c.dy, a.dy, (size_t)(B * T * C) * sizeof(float));
    pdp_set_num_threads(1);
    pdp__attention_forward(a.qkv, B, T, C, H, &d, a.y, a.att, a.work);
    pdp__attention_backward(a.qkv, a.att, a.dy, B, T, C, H, &d, a.dqkv, a.work);
    pdp_set_num_threads(2);
    pdp__attention_forward(c.qkv, B, T, C, H, &d, c.y, c.att, c.work);
    pdp__attention_backward(c.qkv, c.att, c.dy, B, T, C, H, &d, c.dqkv, c.work);
    pdp_set_num_threads(1);
    ASSERT_EQ(0, memcmp(a.y, c.y, (size_t)(B * T * C) * sizeof(float)));
    ASSERT_EQ(0, memcmp(a.att, c.att, (size_t)(B * H * T * T) * sizeof(float)));
    ASSERT_EQ(0, memcmp(a.dqkv, c.dqkv, (size_t)n * sizeof(float)));
    attn_free(&a);
    attn_free(&c);
    PASS();
}

/* PyTorch's attention (tools/gpt_reference.py, nanoGPT's layout, dropout 0): block 0's
   qkv [3, 16, 144] through this kernel with 4 heads against the probabilities act.h.0.att
   and the heads' output act.h.0.attn_y, within 1e-6 (measured: 3.0e-8 and 3.7e-8).
   Skipped while tests/fixtures/gpt_forward.bin (from tools/gpt_reference.py) is absent. */
TEST gpt_attention_matches_pytorch_fixture(void)
{
    fixture f;
    const fixture_tensor *qkv, *att, *y;
    int64_t B, T, C, H = 4, i;
    attn_bufs a;
    FIXTURE_LOAD_OR_SKIP(&f, "gpt_forward.bin");
    qkv = fixture_find(&f, "act.h.0.qkv");
    att = fixture_find(&f, "act.h.0.att");
    y = fixture_find(&f, "act.h.0.attn_y");
    ASSERT(qkv && att && y && qkv->ndim == 3 && att->ndim == 4 && att->shape[1] == H);
    B = qkv->shape[0];
    T = qkv->shape[1];
    C = qkv->shape[2] / 3;
    ASSERT_EQ(B * T * C, y->count);
    a = attn_alloc(B, T, C, H);
    pdp__attention_forward(qkv->data, B, T, C, H, NULL, a.y, a.att, a.work);
    for (i = 0; i < att->count; i++) ASSERT_IN_RANGE(att->data[i], a.att[i], 1e-6);
    for (i = 0; i < y->count; i++)
        ASSERT_IN_RANGE(y->data[i], a.y[i], 1e-6 * (1.0 + fabs(y->data[i])));
    attn_free(&a);
    fixture_free(&f);
    PASS();
}

/* ---- embedding ---- */

/* Forward against the sum, backward against a double scatter-add (ids repeat), the
   gradients accumulated (+=) onto what was there; 1 and 2 threads the same bits. */
TEST gpt_embed_matches_naive_and_threads(void)
{
    int64_t B = 4, T = 64, V = 7, C = 256, ctx = 70, i, b, t, c;
    int32_t *ids = (int32_t *)malloc((size_t)(B * T) * sizeof *ids);
    float *wte = (float *)malloc((size_t)(V * C) * sizeof(float));
    float *wpe = (float *)malloc((size_t)(ctx * C) * sizeof(float));
    float *out = (float *)malloc((size_t)(B * T * C) * sizeof(float));
    float *dwte[2], *dwpe[2];
    double *rte = (double *)calloc((size_t)(V * C), sizeof(double));
    double *rpe = (double *)calloc((size_t)(ctx * C), sizeof(double));
    int th;
    for (i = 0; i < B * T; i++) ids[i] = (int32_t)pdp_rng_below(&rng, (uint32_t)V);
    fill(wte, V * C, -1.0f, 1.0f);
    fill(wpe, ctx * C, -1.0f, 1.0f);
    ASSERT_EQ(PDP_OK, pdp__embed_forward(ids, B, T, ctx, V, C, wte, wpe, out, "f"));
    for (b = 0; b < B; b++)
        for (t = 0; t < T; t++)
            for (c = 0; c < C; c++)
                ASSERT_EQ(wte[ids[b * T + t] * C + c] + wpe[t * C + c], out[(b * T + t) * C + c]);
    fill(out, B * T * C, -1.0f, 1.0f); /* as dout */
    for (th = 0; th < 2; th++) {
        dwte[th] = (float *)malloc((size_t)(V * C) * sizeof(float));
        dwpe[th] = (float *)malloc((size_t)(ctx * C) * sizeof(float));
        for (i = 0; i < V * C; i++) dwte[th][i] = 0.5f;
        for (i = 0; i < ctx * C; i++) dwpe[th][i] = 0.25f;
        pdp_set_num_threads(th + 1);
        pdp__embed_backward(ids, B, T, C, out, dwte[th], dwpe[th]);
        pdp_set_num_threads(1);
    }
    for (b = 0; b < B; b++)
        for (t = 0; t < T; t++)
            for (c = 0; c < C; c++) {
                rte[ids[b * T + t] * C + c] += out[(b * T + t) * C + c];
                rpe[t * C + c] += out[(b * T + t) * C + c];
            }
    for (i = 0; i < V * C; i++) ASSERT_IN_RANGE(0.5 + rte[i], dwte[0][i], 1e-4);
    for (i = 0; i < ctx * C; i++) ASSERT_IN_RANGE(0.25 + rpe[i], dwpe[0][i], 1e-5);
    ASSERT_EQ(0, memcmp(dwte[0], dwte[1], (size_t)(V * C) * sizeof(float)));
    ASSERT_EQ(0, memcmp(dwpe[0], dwpe[1], (size_t)(ctx * C) * sizeof(float)));
    for (th = 0; th < 2; th++) {
        free(dwte[th]);
        free(dwpe[th]);
    }
    free(ids);
    free(wte);
    free(wpe);
    free(out);
    free(rte);
    free(rpe);
    PASS();
}

TEST gpt_embed_errors_name_position_id_and_lengths(void)
{
    int32_t ids[2 * 3] = {0, 1, 2, 3, 4, 0};
    float wte[5 * 2] = {0}, wpe[3 * 2] = {0}, out[2 * 3 * 2];
    ASSERT_EQ(PDP_OK, pdp__embed_forward(ids, 2, 3, 3, 5, 2, wte, wpe, out, "gpt"));
    ids[4] = 5;
    ASSERT_EQ(PDP_ERR_INVALID, pdp__embed_forward(ids, 2, 3, 3, 5, 2, wte, wpe, out, "gpt"));
    ASSERT_STR_EQ("gpt: token id 5 at position (1, 1) is outside [0, 5)", pdp_last_error());
    ids[4] = -1;
    ASSERT_EQ(PDP_ERR_INVALID, pdp__embed_forward(ids, 2, 3, 3, 5, 2, wte, wpe, out, "gpt"));
    ASSERT_STR_EQ("gpt: token id -1 at position (1, 1) is outside [0, 5)", pdp_last_error());
    ids[4] = 0;
    ASSERT_EQ(PDP_ERR_INVALID, pdp__embed_forward(ids, 2, 3, 2, 5, 2, wte, wpe, out, "gpt"));
    ASSERT_STR_EQ("gpt: a sequence of 3 tokens is longer than the context of 2", pdp_last_error());
    PASS();
}

/* ---- LayerNorm over the last dimension ---- */

static double naive_layernorm_f(const double *x, const double *w, const double *b, int64_t N,
                                int64_t C, const double *r, double *y)
{
    int64_t i, j;
    double f = 0.0;
    for (i = 0; i < N; i++) {
        double mean = 0.0, var = 0.0;
        for (j = 0; j < C; j++) mean += x[i * C + j];
        mean /= (double)C;
        for (j = 0; j < C; j++) var += (x[i * C + j] - mean) * (x[i * C + j] - mean);
        var /= (double)C; /* biased, as PyTorch's */
        for (j = 0; j < C; j++) {
            y[i * C + j] = (x[i * C + j] - mean) / sqrt(var + 1e-5) * w[j] + b[j];
            f += y[i * C + j] * r[i * C + j];
        }
    }
    return f;
}

TEST gpt_layernorm_rows_match_naive_and_finite_differences(void)
{
    static const int64_t Ns[] = {1, 15}, Cs[] = {5, 48};
    size_t ni, ci;
    for (ni = 0; ni < 2; ni++)
        for (ci = 0; ci < 2; ci++) {
            int64_t N = Ns[ni], C = Cs[ci], i;
            float *x = (float *)malloc((size_t)(N * C) * sizeof(float)), *y, *dy, *dx, w[48],
                  b[48], dw[48], db[48], *saved;
            double *xd, *wd, *bd, *rd, *yd;
            y = (float *)malloc((size_t)(N * C) * sizeof(float));
            dy = (float *)malloc((size_t)(N * C) * sizeof(float));
            dx = (float *)malloc((size_t)(N * C) * sizeof(float));
            saved = (float *)malloc((size_t)(2 * N) * sizeof(float));
            yd = (double *)malloc((size_t)(N * C) * sizeof(double));
            fill(x, N * C, -2.0f, 3.0f);
            fill(w, C, 0.5f, 1.5f);
            fill(b, C, -0.5f, 0.5f);
            fill(dy, N * C, -1.0f, 1.0f);
            for (i = 0; i < C; i++) dw[i] = db[i] = 1.0f; /* accumulated onto */
            xd = to_double(x, N * C);
            wd = to_double(w, C);
            bd = to_double(b, C);
            rd = to_double(dy, N * C);
            ln_rows_forward(x, w, b, N, C, 1e-5f, y, saved);
            ln_rows_backward(x, w, saved, dy, N, C, dx, dw, db);
            naive_layernorm_f(xd, wd, bd, N, C, rd, yd);
            for (i = 0; i < N * C; i++) ASSERT_IN_RANGE(yd[i], y[i], 1e-5 * (1.0 + fabs(yd[i])));
            for (i = 0; i < N * C + 2 * C; i++) {
                double *v = i < N * C ? xd + i : i < N * C + C ? wd + (i - N * C)
                                                              : bd + (i - N * C - C);
                double g = i < N * C ? dx[i] : i < N * C + C ? dw[i - N * C] - 1.0
                                                            : db[i - N * C - C] - 1.0;
                double keep = *v, fp, fm;
                *v = keep + FD_H;
                fp = naive_layernorm_f(xd, wd, bd, N, C, rd, yd);
                *v = keep - FD_H;
                fm = naive_layernorm_f(xd, wd, bd, N, C, rd, yd);
                *v = keep;
                ASSERT_IN_RANGE((fp - fm) / (2 * FD_H), g, FD_TOL * (1.0 + fabs(g)));
            }
            free(x);
            free(y);
            free(dy);
            free(dx);
            free(saved);
            free(yd);
            free(xd);
            free(wd);
            free(bd);
            free(rd);
        }
    PASS();
}

/* Large enough to be split over the threads (rows x C >= layers.c's PDP__ELEMWISE_PAR_MIN,
   262144): the forward split by rows, the backward by chunks of rows whose dw and db shares
   are added in chunk order. Shapes: 700 x 390 (16 chunks of 43 or 44 rows; C not a whole
   number of 16-float blocks), 2048 x 384 (bench/gpt's: 32 chunks of 64) and 2700 x 390 (the
   cap, 64 chunks). 1, 2 and 3 threads (3 do not divide the chunks) give the same bits, with
   dx and without (the first layer's backward: dw and db alone); dy, dx, dw and db equal a
   double-precision loop written here from the formulas (dw and db accumulated onto 0.5,
   -0.25: a share added twice or lost, a row counted in two chunks or none, shows). And the
   workspace the setup asks for holds the shares for every batch of [T, C] and (F) samples
   it was tried on (ln_rows_backward's is exactly that large, for ASan). */
TEST gpt_layernorm_threads_bit_identical(void)
{
    static const int64_t shapes[3][2] = {{700, 390}, {2048, 384}, {2700, 390}};
    int si;
    for (si = 0; si < 3; si++) {
        int64_t N = shapes[si][0], C = shapes[si][1], i, r;
        float *x = (float *)malloc((size_t)(N * C) * sizeof(float));
        float *dy = (float *)malloc((size_t)(N * C) * sizeof(float));
        float *y[3], *dx[3], *dw[4], *db[4], *saved[3], *w, *b;
        int k;
        w = (float *)malloc((size_t)C * sizeof(float));
        b = (float *)malloc((size_t)C * sizeof(float));
        fill(x, N * C, -2.0f, 3.0f);
        fill(dy, N * C, -1.0f, 1.0f);
        fill(w, C, 0.5f, 1.5f);
        fill(b, C, -0.5f, 0.5f);
        for (k = 0; k < 4; k++) {
            dw[k] = (float *)malloc((size_t)C * sizeof(float));
            db[k] = (float *)malloc((size_t)C * sizeof(float));
            for (i = 0; i < C; i++) dw[k][i] = 0.5f, db[k][i] = -0.25f;
        }
        for (k = 0; k < 3; k++) {
            y[k] = (float *)malloc((size_t)(N * C) * sizeof(float));
            dx[k] = (float *)malloc((size_t)(N * C) * sizeof(float));
            saved[k] = (float *)malloc((size_t)(2 * N) * sizeof(float));
            pdp_set_num_threads(k + 1);
            ln_rows_forward(x, w, b, N, C, 1e-5f, y[k], saved[k]);
            ln_rows_backward(x, w, saved[k], dy, N, C, dx[k], dw[k], db[k]);
        }
        pdp_set_num_threads(2);
        ln_rows_backward(x, w, saved[0], dy, N, C, NULL, dw[3], db[3]);
        pdp_set_num_threads(1);
        for (k = 1; k < 3; k++) {
            ASSERT_MEM_EQ(y[0], y[k], (size_t)(N * C) * sizeof(float));
            ASSERT_MEM_EQ(saved[0], saved[k], (size_t)(2 * N) * sizeof(float));
            ASSERT_MEM_EQ(dx[0], dx[k], (size_t)(N * C) * sizeof(float));
        }
        for (k = 1; k < 4; k++) {
            ASSERT_MEM_EQ(dw[0], dw[k], (size_t)C * sizeof(float));
            ASSERT_MEM_EQ(db[0], db[k], (size_t)C * sizeof(float));
        }
        for (r = 0; r < N; r++) { /* dx = rstd (g - mean(g) - xh mean(g xh)), g = dy w */
            const float *xr = x + r * C, *dyr = dy + r * C;
            double mean = 0.0, var = 0.0, rstd, mg = 0.0, mgx = 0.0;
            for (i = 0; i < C; i++) mean += xr[i];
            mean /= (double)C;
            for (i = 0; i < C; i++) var += (xr[i] - mean) * (xr[i] - mean);
            rstd = 1.0 / sqrt(var / (double)C + 1e-5);
            for (i = 0; i < C; i++) {
                mg += (double)dyr[i] * w[i];
                mgx += (double)dyr[i] * w[i] * (xr[i] - mean) * rstd;
            }
            mg /= (double)C;
            mgx /= (double)C;
            for (i = 0; i < C; i++) {
                double ref = rstd * ((double)dyr[i] * w[i] - mg - (xr[i] - mean) * rstd * mgx);
                ASSERT_IN_RANGE(ref, dx[1][r * C + i], 1e-4 * (1.0 + fabs(ref)));
            }
        }
        for (i = 0; i < C; i++) { /* from the saved mean and rstd: dw's own sums, not those */
            double sw = 0.5, sb = -0.25;
            for (r = 0; r < N; r++) {
                double xh = ((double)x[r * C + i] - saved[0][2 * r]) * saved[0][2 * r + 1];
                sw += (double)dy[r * C + i] * xh;
                sb += dy[r * C + i];
            }
            ASSERT_IN_RANGE(sw, dw[1][i], 1e-4 * (1.0 + fabs(sw)));
            ASSERT_IN_RANGE(sb, db[1][i], 1e-4 * (1.0 + fabs(sb)));
        }
        for (k = 0; k < 4; k++) {
            free(dw[k]);
            free(db[k]);
        }
        for (k = 0; k < 3; k++) {
            free(y[k]);
            free(dx[k]);
            free(saved[k]);
        }
        free(x);
        free(dy);
        free(w);
        free(b);
    }
    { /* the shares fit the workspace: [T, C] and (F) samples, batches 1 to 64 */
        static const int64_t Ts[] = {1, 7, 64, 256, 1024}, Cs[] = {1, 5, 48, 384, 390, 4096,
                                                                   16385, 300000};
        size_t ti, ci;
        int64_t B, k, chunked = 0;
        for (ti = 0; ti < sizeof Ts / sizeof *Ts; ti++)
            for (ci = 0; ci < sizeof Cs / sizeof *Cs; ci++)
                for (B = 1; B <= 64; B++) {
                    pdp__layer l;
                    int64_t T = Ts[ti], C = Cs[ci];
                    memset(&l, 0, sizeof l);
                    l.in_count = T * C;
                    l.positions = T; /* T 1: a (F) sample, one row */
                    k = pdp__layers_chunks(B * T, C); /* 1: no shares */
                    ASSERT(k == 1 || 2 * C * k <= B * pdp__layernorm_work(&l));
                    chunked += k > 1;
                }
        ASSERT(chunked > 1000); /* the bound was tried */
    }
    PASS();
}

/* ---- GELU: pdp's is the tanh form (GPT-2's), not erf ---- */

TEST gpt_gelu_is_the_tanh_form(void)
{
    double x;
    for (x = -6.0; x <= 6.0; x += 0.0625) {
        double c = sqrt(2.0 / acos(-1.0)), tp, tm, h = 1e-5;
        double t = 0.5 * x * (1.0 + tanh(c * (x + 0.044715 * x * x * x)));
        tp = 0.5 * (x + h) * (1.0 + tanh(c * ((x + h) + 0.044715 * pow(x + h, 3))));
        tm = 0.5 * (x - h) * (1.0 + tanh(c * ((x - h) + 0.044715 * pow(x - h, 3))));
        ASSERT_IN_RANGE(t, pdp__gelu((float)x), 1e-6 * (1.0 + fabs(t)));
        ASSERT_IN_RANGE((tp - tm) / (2 * h), pdp__gelu_grad(1.0f, (float)x), 1e-5);
    }
    /* the erf form differs by 1.5e-4 at x = 1: the test tells them apart */
    ASSERT(fabs(pdp__gelu(1.0f) - 0.5 * (1.0 + erf(1.0 / sqrt(2.0)))) > 1e-4);
    PASS();
}

/* The GELU kernels (layers.c: AVX-512, AVX2 and math.h's scalar helpers) against double.
   Inputs: a sweep of [-12, 12] by 1/512, and +-2^k (1 + j/16) for k in [-30, 30] (small,
   where y ~ x / 2, up to huge, where x^3 overflows). Two references per element:
   - "same u": u rounded as the kernels round it (math.h's pdp__gelu_u, five float
     operations), then e, y and the gradient in double from that u. What is left is the
     kernels' own exp, division and products: y within 4 ulps, the gradient within 8 ulps
     of the larger of its two terms s and s 2 x du e s (they cancel near x = -0.75, where
     the gradient crosses zero; the fp32 sum cannot do better than their size);
   - "exact": u in double too. The float u's relative error (<= 3 roundings) moves y by
     |d ln y / du| |u| 3 eps = 2 (1 - s) |u| 3 eps: the test allows that plus 4 ulps.
   Specials: NaN gives NaN, +inf gives y = inf and gradient dy, -inf y = NaN (PyTorch's) and
   gradient 0; huge |x| the limits (y = x or -0, gradient 1 or 0). */
#define GELU_ULP(v) (ldexp(1.0, (fabs(v) < 1.17549435e-38 ? -126 : ilogb(v)) - 23))

static void gelu_ref(double x, double u, double *y, double *g)
{
    double e = exp(-2.0 * u), s = 1.0 / (1.0 + e);
    double du = (double)PDP__GELU_C * (1.0 + 3.0 * (double)PDP__GELU_A * x * x);
    *y = x * s;
    *g = s + s * 2.0 * x * du * e * s; /* its two terms: see gelu_terms */
}

static int64_t gelu_inputs(float *x)
{
    int64_t n = 0, i;
    int k, j;
    for (i = -12 * 512; i <= 12 * 512; i++) x[n++] = (float)i / 512.0f;
    for (k = -30; k <= 30; k++)
        for (j = 0; j < 16; j++) {
            x[n++] = ldexpf(1.0f + (float)j / 16.0f, k);
            x[n++] = -ldexpf(1.0f + (float)j / 16.0f, k);
        }
    return n;
}

TEST gpt_gelu_kernels_match_double_reference(void)
{
    static float x[16384], y[16384], g[16384], dy[16384]; /* gelu_inputs: 14241 */
    static const float special[] = {NAN, INFINITY, -INFINITY, 1e30f, -1e30f, 3.4e38f, -3.4e38f,
                                    1e-40f, -1e-40f, 0.0f, -0.0f, 10.4f, -10.4f, -10.6f};
    int64_t n = gelu_inputs(x), i;
    int simds[3] = {0, 256, 512}, best = pdp__layers_simd(), w, tried = 0;
    double worst_y_same = 0, worst_g_same = 0, worst_y_exact = 0;
    ASSERT(n <= 16384);
    for (i = 0; i < n; i++) dy[i] = 1.0f;
    for (w = 0; w < 3; w++) {
        int simd = simds[w];
        if (simd > best) continue;
        tried++;
        pdp__layers_gelu_simd_run(simd, x, NULL, y, n);
        pdp__layers_gelu_simd_run(simd, x, dy, g, n);
        for (i = 0; i < n; i++) {
            double xd = x[i], uf = pdp__gelu_u(x[i]), ud, ry, rg, e, s, q, du;
            ud = (double)PDP__GELU_C * (xd + (double)PDP__GELU_A * xd * xd * xd);
            if (fabs(uf) > 44.0) { /* beyond: the limits */
                ASSERT_EQ_FMT(uf > 0 ? x[i] : 0.0f, y[i], "%g");
                ASSERT_EQ_FMT(uf > 0 ? 1.0f : 0.0f, g[i], "%g");
                continue;
            }
            gelu_ref(xd, uf, &ry, &rg);
            e = exp(-2.0 * uf), s = 1.0 / (1.0 + e);
            du = (double)PDP__GELU_C * (1.0 + 3.0 * (double)PDP__GELU_A * xd * xd);
            q = fabs(s * 2.0 * xd * du * e * s);
            worst_y_same = fmax(worst_y_same, fabs(y[i] - ry) / GELU_ULP(ry));
            worst_g_same = fmax(worst_g_same, fabs(g[i] - rg) / GELU_ULP(fmax(s, q)));
            if (fabs(y[i] - ry) > 4 * GELU_ULP(ry) || fabs(g[i] - rg) > 8 * GELU_ULP(fmax(s, q)))
                FAILm("GELU (same u) off the double reference by more than 4 / 8 ulps");
            gelu_ref(xd, ud, &ry, &rg);
            e = fabs(y[i] - ry) / GELU_ULP(ry) - 2.0 * (1.0 - s) * fabs(ud) * 3.0 * 2.0;
            worst_y_exact = fmax(worst_y_exact, e);
            if (e > 4.0) FAILm("GELU (exact u) off the double reference by more than 4 ulps");
        }
        for (i = 0; i < (int64_t)(sizeof special / sizeof *special); i++) {
            float sx = special[i], sy, sg, one = 1.0f;
            double u = (double)PDP__GELU_C * ((double)sx + 0.044715 * (double)sx * sx * sx);
            pdp__layers_gelu_simd_run(simd, &sx, NULL, &sy, 1);
            pdp__layers_gelu_simd_run(simd, &sx, &one, &sg, 1);
            if (isnan(sx)) {
                ASSERT(isnan(sy) && isnan(sg));
            } else if (isinf(sx)) {
                ASSERT(sx > 0 ? sy == INFINITY : isnan(sy));
                ASSERT_EQ_FMT(sx > 0 ? 1.0f : 0.0f, sg, "%g");
            } else if (fabs(u) > 44.5) {
                ASSERT_EQ_FMT(sx > 0 ? sx : 0.0f, sy, "%g");
                ASSERT(sx > 0 || signbit(sy)); /* -0, as x 0 */
                ASSERT_EQ_FMT(sx > 0 ? 1.0f : 0.0f, sg, "%g");
            } else {
                ASSERT(isfinite(sy) && isfinite(sg));
                ASSERT(fabs(sy - sx / (1.0 + exp(-2.0 * u))) <= 1e-6 * fabs(sx) + 1e-44);
            }
        }
    }
    printf("    GELU: %d kernel(s) (widest %d); worst same-u error: y %.2f ulps, gradient %.2f "
           "ulps; exact-u excess %.2f ulps\n", tried, best, worst_y_same, worst_g_same,
           worst_y_exact);
    PASS();
}

/* Each element's bits do not depend on where it falls in a range (the vector body or the
   masked / padded tail), so a split over threads changes nothing; the two vector widths
   run the same arithmetic and give the same bits. */
TEST gpt_gelu_kernels_bits_independent_of_split_and_width(void)
{
    enum { N = 101 };
    float x[N], dy[N], whole[2][N], part[2][N], other[2][N];
    int best = pdp__layers_simd(), pass;
    int64_t cut, i;
    fill(x, N, -8.0f, 8.0f);
    fill(dy, N, -1.0f, 1.0f);
    pdp__layers_gelu_simd_run(best, x, NULL, whole[0], N);
    pdp__layers_gelu_simd_run(best, x, dy, whole[1], N);
    for (cut = 1; cut < N; cut += 7)
        for (pass = 0; pass < 2; pass++) {
            pdp__layers_gelu_simd_run(best, x, pass ? dy : NULL, part[pass], cut);
            pdp__layers_gelu_simd_run(best, x + cut, pass ? dy + cut : NULL, part[pass] + cut,
                                      N - cut);
            ASSERT_MEM_EQ(whole[pass], part[pass], sizeof whole[pass]);
        }
    if (best < 512) SKIPm("one vector width on this CPU: nothing to compare the bits with");
    pdp__layers_gelu_simd_run(256, x, NULL, other[0], N);
    pdp__layers_gelu_simd_run(256, x, dy, other[1], N);
    ASSERT_MEM_EQ(whole[0], other[0], sizeof other[0]);
    ASSERT_MEM_EQ(whole[1], other[1], sizeof other[1]);
    for (i = 0; i < N; i++) /* and the scalar helpers agree to rounding */
        ASSERT(fabsf(whole[0][i] - pdp__gelu(x[i])) <= 4e-7f * (fabsf(whole[0][i]) + 1e-30f));
    PASS();
}

/* ---- cross-entropy with ignore_index -1 ---- */

static double naive_ce(const double *z, const int32_t *lab, int64_t N, int64_t V)
{
    double total = 0.0;
    int64_t i, j, n = 0;
    for (i = 0; i < N; i++) {
        double s = 0.0;
        if (lab[i] == -1) continue;
        for (j = 0; j < V; j++) s += exp(z[i * V + j]);
        total += log(s) - z[i * V + lab[i]];
        n++;
    }
    return total / (double)n;
}

TEST gpt_cross_entropy_ignore_matches_naive_and_finite_differences(void)
{
    enum { N = 7, V = 5 };
    int32_t lab[N] = {3, -1, 0, 4, -1, 1, 4};
    float z[N * V], dz[N * V], loss;
    double *zd, g;
    int64_t i, count = -1;
    fill(z, N * V, -3.0f, 3.0f);
    zd = to_double(z, N * V);
    for (i = 0; i < N * V; i++) dz[i] = 9.0f;
    ASSERT_EQ(PDP_OK, pdp__cross_entropy_ignore(z, lab, N, V, &loss, &count, dz, "ce"));
    ASSERT_EQ(5, count);
    ASSERT_IN_RANGE(naive_ce(zd, lab, N, V), loss, 1e-6);
    for (i = 0; i < N * V; i++) {
        double keep = zd[i], fp, fm;
        zd[i] = keep + FD_H;
        fp = naive_ce(zd, lab, N, V);
        zd[i] = keep - FD_H;
        fm = naive_ce(zd, lab, N, V);
        zd[i] = keep;
        g = (fp - fm) / (2 * FD_H);
        ASSERT_IN_RANGE(g, dz[i], 1e-6 + FD_TOL * fabs(g));
        if (lab[i / V] == -1) ASSERT_EQ(0.0f, dz[i]);
    }
    free(zd);
    PASS();
}

TEST gpt_cross_entropy_ignore_edge_cases_and_errors(void)
{
    int32_t lab[3] = {-1, -1, -1};
    float z[3 * 2] = {1, 2, 3, 4, 5, 6}, dz[3 * 2] = {7, 7, 7, 7, 7, 7}, loss = 1.0f;
    int64_t count = -1, i;
    /* every row ignored: loss 0, dlogits 0, count 0 (PyTorch: NaN) */
    ASSERT_EQ(PDP_OK, pdp__cross_entropy_ignore(z, lab, 3, 2, &loss, &count, dz, "ce"));
    ASSERT_EQ(0.0f, loss);
    ASSERT_EQ(0, count);
    for (i = 0; i < 6; i++) ASSERT_EQ(0.0f, dz[i]);
    lab[1] = 2;
    ASSERT_EQ(PDP_ERR_INVALID, pdp__cross_entropy_ignore(z, lab, 3, 2, &loss, &count, dz, "ce"));
    ASSERT_STR_EQ("ce: label 2 at row 1 is outside [0, 2) and not the ignore index -1",
                  pdp_last_error());
    lab[1] = -2;
    ASSERT_EQ(PDP_ERR_INVALID, pdp__cross_entropy_ignore(z, lab, 3, 2, &loss, &count, NULL, "ce"));
    ASSERT_STR_EQ("ce: label -2 at row 1 is outside [0, 2) and not the ignore index -1",
                  pdp_last_error());
    lab[1] = 0;
    lab[2] = 1;
    z[4] = NAN;
    ASSERT_EQ(PDP_ERR_NUMERIC, pdp__cross_entropy_ignore(z, lab, 3, 2, &loss, &count, dz, "ce"));
    ASSERT_STR_EQ("ce: loss is NaN at row 2", pdp_last_error());
    PASS();
}

/* The one-row-at-a-time loop the cross-entropy was before its rows were split over
   threads (and still is, row by row): max in float, exp(z - max) in double twice, the
   loss in double, the sum in row order; -1 ignored. */
static double ce_row_loop(const float *z, const int32_t *lab, int64_t N, int64_t V, float scale,
                          float *dz)
{
    double total = 0.0;
    int64_t i, j;
    for (i = 0; i < N; i++) {
        const float *zi = z + i * V;
        float mx = zi[0];
        double sum = 0.0;
        if (lab[i] == -1) {
            for (j = 0; j < V; j++) dz[i * V + j] = 0.0f;
            continue;
        }
        for (j = 1; j < V; j++) mx = zi[j] > mx ? zi[j] : mx;
        for (j = 0; j < V; j++) sum += exp((double)zi[j] - (double)mx);
        for (j = 0; j < V; j++)
            dz[i * V + j] = (float)(exp((double)zi[j] - (double)mx) * (1.0 / sum)) * scale;
        dz[i * V + lab[i]] -= scale;
        total += (double)mx + log(sum) - (double)zi[lab[i]];
    }
    return total;
}

/* Rows x vocabulary 61 x 509 (past loss.c's PDP__CE_PAR_MIN, 16384: the rows split over
   the threads, a part's exp kept in scratch): 1, 2 and 3 threads give the loss sum and
   dlogits of ce_row_loop bit for bit, with ignored rows and without (pdp__cross_entropy),
   and the errors are the ones a loop that stops at the first failing row reports. */
TEST gpt_cross_entropy_threads_bit_identical_to_the_row_loop(void)
{
    enum { N = 61, V = 509 };
    float *z = (float *)malloc(N * V * sizeof(float)), *dz = (float *)malloc(N * V * sizeof(float));
    float *ref = (float *)malloc(N * V * sizeof(float)), scale = 1.0f / 50.0f, keep;
    int32_t lab[N], all[N];
    double sum, want;
    int64_t i;
    int th;
    fill(z, N * V, -6.0f, 6.0f);
    for (i = 0; i < N; i++) {
        all[i] = (int32_t)pdp_rng_below(&rng, V);
        lab[i] = i % 5 == 2 ? -1 : all[i];
    }
    want = ce_row_loop(z, lab, N, V, scale, ref);
    for (th = 1; th <= 3; th++) {
        pdp_set_num_threads(th);
        memset(dz, 0x7f, N * V * sizeof(float));
        sum = -1.0;
        ASSERT_EQ(PDP_OK, pdp__cross_entropy_rows(z, lab, N, V, scale, &sum, dz, "ce"));
        ASSERT_MEM_EQ(&want, &sum, sizeof sum);
        ASSERT_MEM_EQ(ref, dz, N * V * sizeof(float));
        sum = -1.0;
        ASSERT_EQ(PDP_OK, pdp__cross_entropy_rows(z, lab, N, V, scale, &sum, NULL, "ce"));
        ASSERT_MEM_EQ(&want, &sum, sizeof sum);
    }
    want = ce_row_loop(z, all, N, V, scale, ref);
    for (th = 1; th <= 2; th++) {
        pdp_set_num_threads(th);
        ASSERT_EQ(PDP_OK, pdp__cross_entropy(z, all, N, V, scale, &sum, dz, "ce"));
        ASSERT_MEM_EQ(&want, &sum, sizeof sum);
        ASSERT_MEM_EQ(ref, dz, N * V * sizeof(float));
        /* a NaN at row 40 before a bad label at row 50: the NaN; after it: the label */
        keep = z[40 * V + 3];
        z[40 * V + 3] = NAN;
        all[50] = V;
        ASSERT_EQ(PDP_ERR_NUMERIC, pdp__cross_entropy(z, all, N, V, scale, &sum, dz, "ce"));
        ASSERT_STR_EQ("ce: loss is NaN at sample 40", pdp_last_error());
        all[30] = -1;
        ASSERT_EQ(PDP_ERR_INVALID, pdp__cross_entropy(z, all, N, V, scale, &sum, dz, "ce"));
        ASSERT_STR_EQ("ce: label -1 at sample 30 is outside [0, 509)", pdp_last_error());
        ASSERT_EQ(PDP_ERR_NUMERIC, pdp__cross_entropy_rows(z, all, 50, V, scale, &sum, dz, "ce"));
        ASSERT_STR_EQ("ce: loss is NaN at row 40", pdp_last_error());
        z[40 * V + 3] = keep;
        all[50] = lab[50];
        all[30] = lab[30];
    }
    pdp_set_num_threads(1);
    free(z);
    free(dz);
    free(ref);
    PASS();
}

/* Residual's backward (dx = dy + dskip) and ResidualAdd's forward (y = x + skip) and
   backward (dskip = dy, dx = dy) on 700 x 390 floats (past PDP__ELEMWISE_PAR_MIN: split
   over the threads in ranges of 16, the last short): 1, 2 and 3 threads give a plain
   loop's bits. */
TEST gpt_residual_threads_match_a_plain_loop(void)
{
    enum { B = 700, C = 390, NN = B * C };
    float *a = (float *)malloc(NN * sizeof(float)), *b = (float *)malloc(NN * sizeof(float));
    float *out = (float *)malloc(NN * sizeof(float)), *out2 = (float *)malloc(NN * sizeof(float));
    float *ref = (float *)malloc(NN * sizeof(float));
    pdp__layer l;
    pdp__layer_io io;
    int64_t i;
    int th;
    fill(a, NN, -3.0f, 3.0f);
    fill(b, NN, -3.0f, 3.0f);
    for (i = 0; i < NN; i++) ref[i] = a[i] + b[i];
    memset(&l, 0, sizeof l);
    l.in_ndim = l.out_ndim = 1;
    l.in_shape[0] = l.out_shape[0] = C;
    l.in_count = l.out_count = C;
    for (th = 1; th <= 3; th++) {
        pdp_set_num_threads(th);
        memset(&io, 0, sizeof io);
        io.batch = B;
        io.x = a;
        io.skip = b;
        io.y = out;
        memset(out, 0x7f, NN * sizeof(float));
        ASSERT_EQ(PDP_OK, pdp__residual_add_forward(&l, &io));
        ASSERT_MEM_EQ(ref, out, NN * sizeof(float));
        memset(&io, 0, sizeof io);
        io.batch = B;
        io.dy = a;
        io.dskip = b;
        io.dx = out;
        memset(out, 0x7f, NN * sizeof(float));
        ASSERT_EQ(PDP_OK, pdp__residual_backward(&l, &io));
        ASSERT_MEM_EQ(ref, out, NN * sizeof(float));
        memset(&io, 0, sizeof io);
        io.batch = B;
        io.dy = a;
        io.dskip = out;
        io.dx = out2;
        memset(out, 0x7f, NN * sizeof(float));
        memset(out2, 0x7f, NN * sizeof(float));
        ASSERT_EQ(PDP_OK, pdp__residual_add_backward(&l, &io));
        ASSERT_MEM_EQ(a, out, NN * sizeof(float));
        ASSERT_MEM_EQ(a, out2, NN * sizeof(float));
    }
    pdp_set_num_threads(1);
    free(a);
    free(b);
    free(out);
    free(out2);
    free(ref);
    PASS();
}

SUITE(gpt_kernels)
{
    pdp_rng_seed(&rng, 23, 0);
    RUN_TEST(gpt_attention_forward_matches_naive);
    RUN_TEST(gpt_attention_backward_matches_finite_differences);
    RUN_TEST(gpt_attention_mask_later_token_changes_no_earlier_output);
    RUN_TEST(gpt_attention_softmax_safe_with_large_scores);
    RUN_TEST(gpt_attention_blocks_match_naive_and_finite_differences);
    RUN_TEST(gpt_attention_dropout_reproducible);
    RUN_TEST(gpt_attention_threads_bit_identical);
    RUN_TEST(gpt_attention_matches_pytorch_fixture);
    RUN_TEST(gpt_embed_matches_naive_and_threads);
    RUN_TEST(gpt_embed_errors_name_position_id_and_lengths);
    RUN_TEST(gpt_layernorm_rows_match_naive_and_finite_differences);
    RUN_TEST(gpt_layernorm_threads_bit_identical);
    RUN_TEST(gpt_gelu_is_the_tanh_form);
    RUN_TEST(gpt_gelu_kernels_match_double_reference);
    RUN_TEST(gpt_gelu_kernels_bits_independent_of_split_and_width);
    RUN_TEST(gpt_cross_entropy_ignore_matches_naive_and_finite_differences);
    RUN_TEST(gpt_cross_entropy_ignore_edge_cases_and_errors);
    RUN_TEST(gpt_cross_entropy_threads_bit_identical_to_the_row_loop);
    RUN_TEST(gpt_residual_threads_match_a_plain_loop);
}

GREATEST_MAIN_DEFS();

int main(int argc, char **argv)
{
    GREATEST_MAIN_BEGIN();
    RUN_SUITE(gpt_kernels);
    GREATEST_MAIN_END();
}
