/* test_bf16.c - bf16 mixed precision (src/gemm_bf16.c, the model switch).

   - Rounding: pdp_bf16_round against a reference written with exact double
     arithmetic (nearest, ties to even) over special values (ties, NaN, Inf,
     overflow, subnormals) and 200k random bit patterns.
   - Each GEMM path against this file's own scalar model of the arithmetic gemm.h
     states (pairs, odd element first, DAZ/FTZ, then alpha acc + beta c): the
     emulated path and AVX512-BF16 must give the model's bits exactly (inputs chosen
     so no product falls below 2^-126, the one place the paths may differ), on odd
     shapes in all four layouts, alpha/beta variants, NaN in C with beta 0, padded
     leading dimensions, subnormal inputs, and 1, 2 and 3 threads. AMX (TDPBF16PS adds
     a pair's even product first, by Intel's pseudo-code, and the SDM does not promise
     the hardware's order) is held to the summation bound around the model's value
     instead of its bits. A path the CPU or build lacks is reported as a skip that
     names it and why.
   - The AMX driver (gemm_amx.c) on emulated tiles (PDP__AMX_EMULATE, defined below),
     with the path's packing and epilogue and with the portable ones, at 1 and 2
     threads, against a loop over the floats that follows Intel's pseudo-code for
     TDPBF16PS (k padded to 16 pairs, the even product first, FMA, DAZ/FTZ): bit for bit,
     on odd shapes (k odd, k = 1, m = 1, n = 1 .. 17), all four layouts, alpha/beta
     (beta 0 with NaN in C), padded strides, subnormal and tiny inputs (sums in the
     subnormal range); gathered operands against the materialised ones; the streaming
     kernels (one side of C at most 16: the other operand converted a k step at a time)
     too, on a scratch of NaN words. Where the CPU has AMX, the hardware path against
     the emulated tiles, within the fp32 summation bound (the hardware does not follow
     the pseudo-code's order: measured, see check_amx_hardware), the same bits at 1 and
     2 threads, and one TDPBF16PS's rounding of a lone pair as measured; skipped, by
     name, elsewhere.
   - The bias and ReLU or GELU in the epilogue (pdp__gemm_bf16_bias, the Linear's
     forward): on every chain kernel the CPU has, AMX and its emulated tiles, the bits of
     the product followed by the old pass relu(b + C) (and of C = b then beta 1), or by
     b + C and then the GELU layer's kernel into G, C's and G's padding kept, odd shapes,
     NaN rows, 1 and 2 threads.
   - The avx512 path's packing (vcvtne2ps2bf16 flushes subnormal inputs) against the
     emulation, bit for bit, on subnormals that round up to the least normal bf16.
   - Bounds: the result against the exact (double) product of the bf16-rounded
     inputs, |got - exact| <= (k + 2) 2^-24 sum |a_bf b_bf| (+ |beta c| 2^-23), an
     fp32 summation of exact products; and against the fp32 inputs,
     + (2^-7 + 2^-16) sum |a b| (bf16 keeps 8 significant bits: rounding moves
     each input by at most 2^-8 of itself).
   - Gathered operands (gemm_bf16.c's pdp__gemm_bf16_rows_h / _arows_h: the operand in
     bf16 words from pdp__gemm_bf16_convert, in place or not, storage rows through an
     offset table): on every available path, the bits of pdp_gemm_bf16_on on the
     materialised operand, at 1 and 2 threads.
   - Conv2d deep enough for the implicit path's GEMMs (C 16 -> O 32, k 5, 14x14 and
     C 15 -> O 32: the dW share transposed; C 8 -> O 8, k 3, pad 0: dW as rows, dy
     apart from the padded dy; C 1 -> O 16: the dW dot products), on the best path and
     forced onto the emulated one (layers_conv.c's PDP__CONV_BF16_PATH, through
     base.c's test knob): y, dW, db and dX (the model's input gradient) against
     double sums of the bf16-rounded inputs within (terms + 2) 2^-24 sum |products|
     (+ chunks), and the same bits at 1 and 2 threads.
   - The model switch: a bf16 Linear model's forward and backward equal the same
     GEMMs called by hand through pdp_gemm_bf16 (bit for bit), and switching back to
     fp32 gives the fp32 bits again; errors name the function; a CUDA model may be bf16
     (its numerics: test_cuda).
   - Suite bf16_paths (the path choice, sgemm-rounded, the vectorised emulation):
     sgemm-rounded against pdp_sgemm on the rounded operands (bits) and against the
     chain within gemm.h's bound (which pdp_sgemm on unrounded inputs breaks); every
     emulation kernel (AVX-512F, AVX2, portable) against the real vdpbf16ps on
     subnormal-heavy inputs (bits, but the portable kernel's corner) and against each
     other, MXCSR restored; the choice as a function of injected CPU ids and shapes,
     every table row's paths on its CPUs; AUTO's bits equal the chosen path's.
   - PyTorch: one SGD step of an MLP under torch.autocast (tests/fixtures/
     autocast_bf16_mlp.bin), and the same step in float64 with pdp's rounding points
     (which an fp32 step fails), tolerances derived above the test; skips without
     the fixture. */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
/* the Conv2d implicit path's bf16 products: the path AUTO takes for the forward product, or
   the one a test forces through base.c's test knob (pdp__test_knobs.conv_bf16_path; 0: not
   forced), which exists under the tests' linkage: compiled alone, this test asks for it too */
#ifndef PDP__TEST_LINKAGE
#  define PDP__TEST_LINKAGE
#endif
/* the AMX driver on emulated tiles too (gemm_amx.c: pdp__amx_gemm_emulated; tests/pdp_impl.c
   defines it as well) */
#define PDP__AMX_EMULATE 1
#define PDP_IMPLEMENTATION
#include "counting_alloc.h"
#include "pdp.h"
#include "pdp_test.h"
#include "fixture.h"

/* ---- helpers ---- */

static uint32_t rng_state = 2024u;
static uint32_t rnd_u32(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 17;
    rng_state ^= rng_state << 5;
    return rng_state;
}
static float rnd(void) { return (float)(rnd_u32() >> 8) / 8388608.0f - 1.0f; } /* [-1, 1) */

static float from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static uint32_t to_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* The nearest bf16 to x in exact double arithmetic, ties to the even mantissa. */
static uint32_t round_ref(float x)
{
    uint32_t u = to_bits(x), lo = u & 0xffff0000u, hi;
    double dx, dlo, dhi;
    if (isnan(x)) return 0xffffffffu; /* any NaN: checked separately */
    if ((u & 0xffffu) == 0) return u;
    hi = lo + 0x10000u; /* next bf16 away from zero (0x7f7f.. + 1 is Inf: right) */
    dx = fabs((double)x);
    dlo = fabs((double)from_bits(lo));
    dhi = isinf(from_bits(hi)) ? 3.40282356779733661637539395458142568448e38 /* 2^128 */
                               : fabs((double)from_bits(hi));
    if (dx - dlo < dhi - dx) return lo;
    if (dx - dlo > dhi - dx) return hi;
    return (lo & 0x10000u) ? hi : lo;
}

TEST bf16_round_matches_reference(void)
{
    static const uint32_t special[] = {
        0x3f808000u, 0x3f818000u, 0xbf808000u, 0x3f808001u, 0x3f807fffu, /* ties, near ties */
        0x00008000u, 0x00018000u, 0x00007fffu, 0x00000001u, 0x807fffffu, /* subnormals */
        0x7f7fffffu, 0x7f7f7fffu, 0x7f7f8000u, 0xff7fffffu,              /* overflow to Inf */
        0x7f800000u, 0xff800000u, 0x00000000u, 0x80000000u, 0x3f800000u};
    int i, bad = 0;
    char msg[128];
    for (i = 0; i < (int)(sizeof special / sizeof special[0]) + 200000; i++) {
        uint32_t u = i < (int)(sizeof special / sizeof special[0]) ? special[i] : rnd_u32();
        float x = from_bits(u);
        uint32_t got = to_bits(pdp_bf16_round(x)), want;
        if (isnan(x)) {
            /* NaN stays NaN (never Inf), sign kept, low half zero */
            if (!isnan(from_bits(got)) || (got & 0xffffu) || (got >> 31) != (u >> 31)) bad++;
            continue;
        }
        want = round_ref(x);
        if (got != want && bad++ == 0)
            snprintf(msg, sizeof msg, "0x%08x -> 0x%08x, want 0x%08x", (unsigned)u,
                     (unsigned)got, (unsigned)want);
    }
    ASSERT_EQm(bad ? msg : "", 0, bad);
    /* the NaN payloads that a truncation would turn into Inf */
    ASSERT(isnan(pdp_bf16_round(from_bits(0x7f800001u))));
    ASSERT(isnan(pdp_bf16_round(from_bits(0xff800001u))));
    ASSERT(isinf(pdp_bf16_round(from_bits(0x7f7fffffu))));
    PASS();
}

/* ---- the scalar model of the arithmetic (gemm.h) ---- */

static float daz(float x) { return fabsf(x) < 1.17549435e-38f ? x * 0.0f : x; }
static float ftz_add(float a, float b)
{
    volatile float r = a + b;
    return fabsf(r) < 1.17549435e-38f ? r * 0.0f : r;
}

typedef struct mat {
    float *p;
    int64_t rows, cols, ld;
} mat;

static mat mat_new(int64_t rows, int64_t cols, int64_t pad, int subnormals)
{
    mat m;
    int64_t i;
    m.rows = rows;
    m.cols = cols;
    m.ld = cols + pad;
    m.p = (float *)malloc(sizeof(float) * (size_t)(rows * m.ld + 1));
    for (i = 0; i < rows * m.ld; i++) {
        m.p[i] = (i % m.ld) < cols ? rnd() : 7777.0f;
        if (subnormals && (i % m.ld) < cols && i % 5 == 0) m.p[i] = rnd() * 1e-39f;
    }
    return m;
}

static float op_at(const mat *x, pdp_trans t, int64_t r, int64_t c)
{
    return t == PDP_NO_TRANS ? x->p[r * x->ld + c] : x->p[c * x->ld + r];
}

typedef struct bcase {
    pdp_trans ta, tb;
    int64_t m, k, n;
    float alpha, beta;
    int64_t pad;
    int nan_c, subnormals;
} bcase;

static const char *layout_name(pdp_trans ta, pdp_trans tb)
{
    static const char *names[2][2] = {{"NN", "NT"}, {"TN", "TT"}};
    return names[ta][tb];
}

/* Runs case t on `path` with 1, 2 and 3 threads; every element must equal the scalar
   model's bits (AMX: lie within 2 ((k + 2) 2^-24 sum |a_bf b_bf| + k 2^-126) of them, as
   its order within a pair is not the model's and FTZ may flush other partial sums) and
   lie within the bounds in the top comment. */
static enum greatest_test_res check_path(pdp_bf16_path path, const bcase *t)
{
    mat a = t->ta == PDP_NO_TRANS ? mat_new(t->m, t->k, t->pad, t->subnormals)
                                  : mat_new(t->k, t->m, t->pad, t->subnormals);
    mat b = t->tb == PDP_NO_TRANS ? mat_new(t->k, t->n, t->pad, t->subnormals)
                                  : mat_new(t->n, t->k, t->pad, t->subnormals);
    mat c = mat_new(t->m, t->n, t->pad, 0);
    float *c0 = (float *)malloc(sizeof(float) * (size_t)(c.rows * c.ld + 1));
    float *cw = (float *)malloc(sizeof(float) * (size_t)(c.rows * c.ld + 1));
    int64_t i, j, p;
    int threads, bad = 0, same_bits = path != PDP_BF16_PATH_AMX;
    char msg[256] = "";
    if (t->nan_c)
        for (i = 0; i < t->m; i++)
            for (j = 0; j < t->n; j++) c.p[i * c.ld + j] = NAN;
    memcpy(c0, c.p, sizeof(float) * (size_t)(c.rows * c.ld));
    for (threads = 1; threads <= 3 && !bad; threads++) {
        pdp_status st;
        memcpy(cw, c0, sizeof(float) * (size_t)(c.rows * c.ld));
        pdp_set_num_threads(threads);
        st = pdp_gemm_bf16_on(path, t->ta, t->tb, t->m, t->n, t->k, t->alpha, a.p, a.ld, b.p,
                              b.ld, t->beta, cw, c.ld);
        pdp_set_num_threads(1);
        if (st != PDP_OK) {
            snprintf(msg, sizeof msg, "status %s: %.160s", pdp_status_name(st), pdp_last_error());
            bad = 1;
            break;
        }
        for (i = 0; i < t->m && !bad; i++)
            for (j = 0; j < c.ld && !bad; j++) {
                float acc = 0.0f, want;
                double exact = 0.0, mag = 0.0, mag32 = 0.0, exact32 = 0.0, got = cw[i * c.ld + j];
                if (j >= t->n) {
                    if (cw[i * c.ld + j] != 7777.0f) {
                        snprintf(msg, sizeof msg, "padding of C row %lld overwritten",
                                 (long long)i);
                        bad = 1;
                    }
                    continue;
                }
                for (p = 0; p < t->k; p += 2) {
                    float a0 = daz(pdp_bf16_round(op_at(&a, t->ta, i, p)));
                    float b0 = daz(pdp_bf16_round(op_at(&b, t->tb, p, j)));
                    float a1 = p + 1 < t->k ? daz(pdp_bf16_round(op_at(&a, t->ta, i, p + 1))) : 0;
                    float b1 = p + 1 < t->k ? daz(pdp_bf16_round(op_at(&b, t->tb, p + 1, j))) : 0;
                    acc = ftz_add(acc, a1 * b1);
                    acc = ftz_add(acc, a0 * b0);
                    exact += (double)a0 * b0 + (double)a1 * b1;
                    mag += fabs((double)a0 * b0) + fabs((double)a1 * b1);
                    exact32 += (double)op_at(&a, t->ta, i, p) * op_at(&b, t->tb, p, j);
                    mag32 += fabs((double)op_at(&a, t->ta, i, p) * op_at(&b, t->tb, p, j));
                    if (p + 1 < t->k) {
                        exact32 += (double)op_at(&a, t->ta, i, p + 1) * op_at(&b, t->tb, p + 1, j);
                        mag32 += fabs((double)op_at(&a, t->ta, i, p + 1) * op_at(&b, t->tb, p + 1, j));
                    }
                }
                {
                    volatile float r = t->alpha * acc;
                    if (t->beta != 0.0f) {
                        volatile float bc = t->beta * c0[i * c.ld + j];
                        r = bc + r;
                    }
                    want = r;
                }
                if (!same_bits) { /* AMX: within both chains' bounds of the model (top comment) */
                    double dt = 2.0 * (((double)t->k + 2.0) * ldexp(1.0, -24) * mag +
                                       (double)t->k * ldexp(1.0, -126)) * fabs(t->alpha) +
                                (t->beta != 0.0f ? fabs((double)t->beta * c0[i * c.ld + j]) *
                                 ldexp(1.0, -23) : 0.0) + 1e-37;
                    if (!(fabs(got - (double)want) <= dt)) {
                        snprintf(msg, sizeof msg, "C[%lld][%lld] = %.9g, model %.9g: more than "
                                 "%.3g apart", (long long)i, (long long)j, got, (double)want, dt);
                        bad = 1;
                        continue;
                    }
                } else if (to_bits(want) != to_bits(cw[i * c.ld + j])) {
                    snprintf(msg, sizeof msg, "C[%lld][%lld] = %.9g (0x%08x), model %.9g (0x%08x)",
                             (long long)i, (long long)j, got, (unsigned)to_bits(cw[i * c.ld + j]),
                             (double)want, (unsigned)to_bits(want));
                    bad = 1;
                    continue;
                }
                if (!t->subnormals) {
                    double bterm = t->beta != 0.0f ? fabs((double)t->beta * c0[i * c.ld + j]) : 0.0;
                    double bc = t->beta != 0.0f ? (double)t->beta * c0[i * c.ld + j] : 0.0;
                    double tol = ((double)t->k + 2.0) * ldexp(1.0, -24) * fabs(t->alpha) * mag +
                                 bterm * ldexp(1.0, -23) + 1e-30;
                    double tol32 = tol + (ldexp(1.0, -7) + ldexp(1.0, -16)) * fabs(t->alpha) * mag32;
                    if (fabs(got - (t->alpha * exact + bc)) > tol ||
                        fabs(got - (t->alpha * exact32 + bc)) > tol32) {
                        snprintf(msg, sizeof msg, "C[%lld][%lld] = %.9g outside the bound (%.9g %.3g, %.9g %.3g)",
                                 (long long)i, (long long)j, got, t->alpha * exact + bc, tol,
                                 t->alpha * exact32 + bc, tol32);
                        bad = 1;
                    }
                }
            }
        if (bad) {
            char where[96];
            snprintf(where, sizeof where, " (%s %s m%lld k%lld n%lld, %d threads)",
                     pdp_bf16_path_name(path), layout_name(t->ta, t->tb), (long long)t->m,
                     (long long)t->k, (long long)t->n, threads);
            strncat(msg, where, sizeof msg - strlen(msg) - 1);
        }
    }
    free(a.p);
    free(b.p);
    free(c.p);
    free(c0);
    free(cw);
    ASSERT_EQm(msg, 0, bad);
    PASS();
}

static enum greatest_test_res check_path_all(pdp_bf16_path path)
{
    static const int64_t shapes[][3] = {{1, 1, 1},   {7, 3, 5},    {33, 17, 9}, {8, 32, 32},
                                        {9, 33, 65}, {129, 31, 70}, {3, 257, 2}, {70, 784, 40}};
    int s, ta, tb;
    char msg[224];
    if (!pdp_bf16_path_available(path)) {
        snprintf(msg, sizeof msg, "bf16 path %s: not available on this CPU or build%s",
                 pdp_bf16_path_name(path),
                 path == PDP_BF16_PATH_AMX ? " (needs x86-64 Linux, CPUID AMX-BF16 and "
                                             "AMX-TILE, the tile state in XCR0 and "
                                             "ARCH_REQ_XCOMP_PERM granted)" : "");
        SKIPm(msg);
    }
    for (s = 0; s < (int)(sizeof shapes / sizeof shapes[0]); s++)
        for (ta = 0; ta < 2; ta++)
            for (tb = 0; tb < 2; tb++) {
                bcase t;
                memset(&t, 0, sizeof t);
                t.ta = (pdp_trans)ta;
                t.tb = (pdp_trans)tb;
                t.m = shapes[s][0];
                t.k = shapes[s][1];
                t.n = shapes[s][2];
                t.alpha = 1.0f;
                t.beta = (s % 3 == 0) ? 0.0f : (s % 3 == 1) ? 1.0f : -0.75f;
                t.nan_c = t.beta == 0.0f;
                t.pad = s % 2 ? 3 : 0;
                if (s == 5) t.alpha = 0.5f;
                if (s == 2) t.subnormals = 1;
                CHECK_CALL(check_path(path, &t));
            }
    PASS();
}

TEST bf16_gemm_emulated_matches_model(void) { return check_path_all(PDP_BF16_PATH_EMULATED); }
TEST bf16_gemm_avx512_matches_model(void) { return check_path_all(PDP_BF16_PATH_AVX512); }
TEST bf16_gemm_amx_matches_model(void) { return check_path_all(PDP_BF16_PATH_AMX); }

/* The avx512 path packs with vcvtne2ps2bf16, which flushes subnormal inputs to zero where
   pdp_bf16_round rounds them: one just below 2^-126 rounds up to the least normal bf16,
   whose products with values near 2^126 are ordinary numbers. The path must still give the
   emulation's bits, through both of its packings (rows along k, rows across k) in all four
   layouts; A mixes such values of both signs, subnormals that round to subnormals and
   small normals. */
TEST bf16_gemm_avx512_rounds_subnormals_as_the_emulation(void)
{
    enum { M = 19, K = 37, N = 41 };
    static float a[M * K], b[K * N], c1[M * N], c2[M * N];
    int i, ta, tb, bad = 0;
    char msg[160] = "";
    if (!pdp_bf16_path_available(PDP_BF16_PATH_AVX512))
        SKIPm("bf16 path avx512-bf16: not available on this CPU or build");
    for (i = 0; i < M * K; i++) {
        uint32_t r = rnd_u32();
        a[i] = from_bits(i % 4 == 0   ? 0x007f8000u + (r & 0x7fffu)
                         : i % 4 == 1 ? 0x807f8000u + (r & 0x7fffu)
                         : i % 4 == 2 ? 0x007f7fffu - (r & 0xffffu)
                                      : 0x00800000u + (r & 0x7fffffu));
    }
    for (i = 0; i < K * N; i++) b[i] = ldexpf(rnd(), 126);
    ASSERT_EQ(to_bits(pdp_bf16_round(from_bits(0x007f8000u))), 0x00800000u);
    for (ta = 0; ta < 2; ta++)
        for (tb = 0; tb < 2; tb++) {
            int64_t lda = ta ? M : K, ldb = tb ? K : N;
            ASSERT_EQ(PDP_OK, pdp_gemm_bf16_on(PDP_BF16_PATH_EMULATED, (pdp_trans)ta,
                                               (pdp_trans)tb, M, N, K, 1.0f, a, lda, b, ldb,
                                               0.0f, c1, N));
            ASSERT_EQ(PDP_OK, pdp_gemm_bf16_on(PDP_BF16_PATH_AVX512, (pdp_trans)ta,
                                               (pdp_trans)tb, M, N, K, 1.0f, a, lda, b, ldb,
                                               0.0f, c2, N));
            for (i = 0; i < M * N && !bad; i++)
                if (to_bits(c1[i]) != to_bits(c2[i])) {
                    snprintf(msg, sizeof msg, "%s: C[%d] = 0x%08x, emulated 0x%08x",
                             layout_name((pdp_trans)ta, (pdp_trans)tb), i,
                             (unsigned)to_bits(c2[i]), (unsigned)to_bits(c1[i]));
                    bad = 1;
                }
            ASSERT_EQm(msg, 0, bad);
            ASSERT(c1[0] != 0.0f); /* the products are not all flushed */
        }
    PASS();
}

TEST bf16_gemm_auto_takes_the_best_path_and_names_missing_ones(void)
{
    float a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {1, 0, 0, 1, 1, 1}, c[4], c2[4];
    int p;
    pdp_gemm_bf16(PDP_NO_TRANS, PDP_NO_TRANS, 2, 2, 3, 1.0f, a, 3, b, 2, 0.0f, c, 2);
    ASSERT_EQ(PDP_OK, pdp_gemm_bf16_on(pdp_bf16_path_for(PDP_NO_TRANS, PDP_NO_TRANS, 2, 2, 3),
                                       PDP_NO_TRANS, PDP_NO_TRANS, 2, 2, 3, 1.0f, a, 3, b, 2, 0.0f,
                                       c2, 2));
    ASSERT_MEM_EQ(c, c2, sizeof c);
    ASSERT_EQ(4.0f, c[0]);
    ASSERT_EQ(5.0f, c[1]);
    ASSERT(pdp_bf16_path_available(PDP_BF16_PATH_EMULATED));
    ASSERT(pdp_bf16_best_path() != PDP_BF16_PATH_AUTO);
    for (p = PDP_BF16_PATH_EMULATED; p <= PDP_BF16_PATH_SGEMM; p++)
        if (!pdp_bf16_path_available((pdp_bf16_path)p)) {
            ASSERT_EQ(PDP_ERR_UNSUPPORTED,
                      pdp_gemm_bf16_on((pdp_bf16_path)p, PDP_NO_TRANS, PDP_NO_TRANS, 2, 2, 3, 1.0f,
                                       a, 3, b, 2, 0.0f, c2, 2));
            ASSERT(strstr(pdp_last_error(), "pdp_gemm_bf16_on"));
            ASSERT(strstr(pdp_last_error(), pdp_bf16_path_name((pdp_bf16_path)p)));
        }
    printf("bf16 path on this CPU: %s\n", pdp_bf16_path_name(pdp_bf16_best_path()));
    PASS();
}

/* ---- the model switch ---- */

static pdp_model *mlp(pdp_precision precision)
{
    pdp_model *m = NULL;
    pdp_model_desc d;
    memset(&d, 0, sizeof d);
    d.input_shape[0] = 37;
    d.seed = 7;
    d.precision = precision;
    if (pdp_model_create(&m, &d) != PDP_OK) return NULL;
    if (pdp_model_add_linear(m, 45) != PDP_OK || pdp_model_add_relu(m) != PDP_OK ||
        pdp_model_add_linear(m, 10) != PDP_OK) {
        pdp_model_free(m);
        return NULL;
    }
    return m;
}

/* One forward/backward with loss; copies the output and the gradients out. */
static pdp_status step(pdp_model *m, const float *xd, int64_t batch, const int32_t *labels,
                       float *out, float *grads)
{
    pdp_tensor x, pv, gv;
    const pdp_tensor *y = NULL;
    int64_t shape[2];
    float loss;
    pdp_status st;
    shape[0] = batch;
    shape[1] = 37;
    pdp_tensor_wrap((float *)xd, pdp_cpu(), 2, shape, &x);
    pdp_model_zero_grad(m);
    if ((st = pdp_model_forward(m, &x, &y)) != PDP_OK) return st;
    memcpy(out, y->data, sizeof(float) * (size_t)y->count);
    if ((st = pdp_model_forward_backward(m, &x, labels, &loss)) != PDP_OK) return st;
    pdp_model_flat(m, &pv, &gv);
    memcpy(grads, gv.data, sizeof(float) * (size_t)gv.count);
    return PDP_OK;
}

TEST bf16_model_linear_uses_bf16_gemms_and_switches_back(void)
{
    enum { B = 13 };
    pdp_model *m = mlp(PDP_PRECISION_FP32), *mb = mlp(PDP_PRECISION_BF16);
    float x[B * 37], out32[B * 10], outb[B * 10], out2[B * 10], h[B * 45], yref[B * 10];
    float *g32, *gb, *g2;
    int32_t labels[B];
    int64_t i, np;
    pdp_param w0, b0, w1, b1;
    ASSERT(m && mb);
    ASSERT_EQ(PDP_PRECISION_BF16, pdp_model_precision(mb));
    np = pdp_model_param_count(m);
    g32 = (float *)malloc(sizeof(float) * (size_t)np);
    gb = (float *)malloc(sizeof(float) * (size_t)np);
    g2 = (float *)malloc(sizeof(float) * (size_t)np);
    for (i = 0; i < B * 37; i++) x[i] = rnd();
    for (i = 0; i < B; i++) labels[i] = (int32_t)(i % 10);
    ASSERT_EQ(PDP_OK, step(m, x, B, labels, out32, g32));
    ASSERT_EQ(PDP_OK, step(mb, x, B, labels, outb, gb));
    ASSERT(memcmp(out32, outb, sizeof out32) != 0);

    /* the bf16 forward is the bf16 GEMMs by hand: h = relu(x W0^T + b0), y = h W1^T + b1 */
    pdp_model_find_param(mb, "0.weight", &w0);
    pdp_model_find_param(mb, "0.bias", &b0);
    pdp_model_find_param(mb, "2.weight", &w1);
    pdp_model_find_param(mb, "2.bias", &b1);
    for (i = 0; i < B * 45; i++) h[i] = b0.value.data[i % 45];
    pdp_gemm_bf16(PDP_NO_TRANS, PDP_TRANS, B, 45, 37, 1.0f, x, 37, w0.value.data, 37, 1.0f, h, 45);
    for (i = 0; i < B * 45; i++) h[i] = h[i] > 0.0f ? h[i] : 0.0f;
    for (i = 0; i < B * 10; i++) yref[i] = b1.value.data[i % 10];
    pdp_gemm_bf16(PDP_NO_TRANS, PDP_TRANS, B, 10, 45, 1.0f, h, 45, w1.value.data, 45, 1.0f, yref, 10);
    ASSERT_MEM_EQ(yref, outb, sizeof yref);
    /* and the output stays near fp32's */
    for (i = 0; i < B * 10; i++) ASSERT_IN_RANGE(out32[i], outb[i], 0.05f);

    /* switching: bf16 on the fp32 model gives the bf16 model's bits, and back gives fp32's */
    ASSERT_EQ(PDP_OK, pdp_model_set_precision(m, PDP_PRECISION_BF16));
    ASSERT_EQ(PDP_OK, step(m, x, B, labels, out2, g2));
    ASSERT_MEM_EQ(outb, out2, sizeof outb);
    ASSERT_MEM_EQ(gb, g2, sizeof(float) * (size_t)np);
    ASSERT_EQ(PDP_OK, pdp_model_set_precision(m, PDP_PRECISION_FP32));
    ASSERT_EQ(PDP_OK, step(m, x, B, labels, out2, g2));
    ASSERT_MEM_EQ(out32, out2, sizeof out32);
    ASSERT_MEM_EQ(g32, g2, sizeof(float) * (size_t)np);
    for (i = 0; i < np; i++) ASSERT_IN_RANGE(g32[i], gb[i], 0.02f);
    free(g32);
    free(gb);
    free(g2);
    pdp_model_free(m);
    pdp_model_free(mb);
    PASS();
}

/* A one-layer Conv2d model in bf16 (implicit path: stride 1, pad 1; im2col: stride 2)
   against double-precision sums of the bf16-rounded inputs: forward y and the weight
   gradient within (terms + 2) 2^-24 sum |products| (fp32 sums of exact products), the
   bias gradient as fp32 sums of the unrounded dy. */
static enum greatest_test_res check_conv(int64_t stride, int threads)
{
    enum { N = 3, C = 3, H = 9, O = 4, K = 3 };
    pdp_model *m = NULL;
    pdp_model_desc d;
    pdp_tensor x, dyt;
    const pdp_tensor *y;
    pdp_param w, b;
    float xd[N * C * H * H], *dy;
    int64_t xs[4] = {N, C, H, H}, Ho, i, n, o, c, ki, kj, oh, ow;
    memset(&d, 0, sizeof d);
    d.input_shape[0] = C;
    d.input_shape[1] = H;
    d.input_shape[2] = H;
    d.seed = 3;
    d.precision = PDP_PRECISION_BF16;
    ASSERT_EQ(PDP_OK, pdp_model_create(&m, &d));
    ASSERT_EQ(PDP_OK, pdp_model_add_conv2d(m, O, K, stride, 1));
    Ho = (H + 2 - K) / stride + 1;
    for (i = 0; i < N * C * H * H; i++) xd[i] = rnd();
    pdp_tensor_wrap(xd, pdp_cpu(), 4, xs, &x);
    pdp_set_num_threads(threads);
    ASSERT_EQ(PDP_OK, pdp_model_forward(m, &x, &y));
    pdp_model_find_param(m, "0.weight", &w);
    pdp_model_find_param(m, "0.bias", &b);
    for (n = 0; n < N; n++)
        for (o = 0; o < O; o++)
            for (oh = 0; oh < Ho; oh++)
                for (ow = 0; ow < Ho; ow++) {
                    double ref = 0.0, mag = 0.0;
                    for (c = 0; c < C; c++)
                        for (ki = 0; ki < K; ki++)
                            for (kj = 0; kj < K; kj++) {
                                int64_t ih = oh * stride - 1 + ki, iw = ow * stride - 1 + kj;
                                double t;
                                if (ih < 0 || ih >= H || iw < 0 || iw >= H) continue;
                                t = (double)pdp_bf16_round(w.value.data[((o * C + c) * K + ki) * K + kj]) *
                                    pdp_bf16_round(xd[((n * C + c) * H + ih) * H + iw]);
                                ref += t;
                                mag += fabs(t);
                            }
                    ref += b.value.data[o];
                    ASSERT_IN_RANGE(ref, y->data[((n * O + o) * Ho + oh) * Ho + ow],
                                    (C * K * K + 2) * ldexp(mag + fabs(b.value.data[o]), -24));
                }
    dy = (float *)malloc(sizeof(float) * (size_t)y->count);
    for (i = 0; i < y->count; i++) dy[i] = rnd();
    pdp_tensor_wrap(dy, pdp_cpu(), 4, y->shape, &dyt);
    pdp_model_zero_grad(m);
    ASSERT_EQ(PDP_OK, pdp_model_backward(m, &dyt));
    pdp_set_num_threads(1);
    for (o = 0; o < O; o++) {
        double db = 0.0, dbm = 0.0;
        for (n = 0; n < N; n++)
            for (i = 0; i < Ho * Ho; i++) {
                db += dy[(n * O + o) * Ho * Ho + i];
                dbm += fabs(dy[(n * O + o) * Ho * Ho + i]);
            }
        ASSERT_IN_RANGE(db, b.grad.data[o], (N * Ho * Ho + 2) * ldexp(dbm, -24));
        for (c = 0; c < C; c++)
            for (ki = 0; ki < K; ki++)
                for (kj = 0; kj < K; kj++) {
                    double ref = 0.0, mag = 0.0;
                    for (n = 0; n < N; n++)
                        for (oh = 0; oh < Ho; oh++)
                            for (ow = 0; ow < Ho; ow++) {
                                int64_t ih = oh * stride - 1 + ki, iw = ow * stride - 1 + kj;
                                double t;
                                if (ih < 0 || ih >= H || iw < 0 || iw >= H) continue;
                                t = (double)pdp_bf16_round(dy[((n * O + o) * Ho + oh) * Ho + ow]) *
                                    pdp_bf16_round(xd[((n * C + c) * H + ih) * H + iw]);
                                ref += t;
                                mag += fabs(t);
                            }
                    ASSERT_IN_RANGE(ref, w.grad.data[((o * C + c) * K + ki) * K + kj],
                                    (N * Ho * Ho + 2) * ldexp(mag, -24));
                }
    }
    free(dy);
    pdp_model_free(m);
    PASS();
}

TEST bf16_model_conv2d_implicit_matches_reference(void)
{
    CHECK_CALL(check_conv(1, 1));
    CHECK_CALL(check_conv(1, 2));
    PASS();
}

TEST bf16_model_conv2d_im2col_matches_reference(void)
{
    CHECK_CALL(check_conv(2, 1));
    CHECK_CALL(check_conv(2, 2));
    PASS();
}

/* ---- gathered operands ---- */

/* pdp__gemm_bf16_rows_h (B's storage rows through a table, tb both ways) and
   pdp__gemm_bf16_arows_h (A's), the operand in bf16 words from
   pdp__gemm_bf16_convert (which must give the same words in place), against
   pdp_gemm_bf16_on on the materialised operand: the same bits, on every path this CPU
   has, at 1 and 2 threads. The storage rows overlap and come in no order, as Conv2d's
   runs of the padded image do. */
static enum greatest_test_res check_gathered(pdp_bf16_path path, int64_t m, int64_t n,
                                             int64_t k, int threads)
{
    int64_t big = 4 * (m + n + k) + 64, rows = PDP__MAX(m, PDP__MAX(n, k)), i, j, r;
    int64_t *off = (int64_t *)malloc(sizeof(int64_t) * (size_t)rows);
    float *pool = (float *)malloc(sizeof(float) * (size_t)(big + rows));
    float *a = (float *)malloc(sizeof(float) * (size_t)(m * k));
    float *mat = (float *)malloc(sizeof(float) * (size_t)PDP__MAX(k * n, m * k)); /* gathered */
    float *bsrc = (float *)malloc(sizeof(float) * (size_t)(k * n)); /* arows' B */
    uint16_t *ph = (uint16_t *)malloc(sizeof(uint16_t) * (size_t)(big + rows)); /* pool, bf16 */
    float *c1 = (float *)malloc(sizeof(float) * (size_t)(m * n));
    float *c2 = (float *)malloc(sizeof(float) * (size_t)(m * n));
    int t, v;
    for (i = 0; i < big + rows; i++) pool[i] = rnd();
    for (r = 0; r < rows; r++) off[r] = (int64_t)(rnd_u32() % (uint32_t)big);
    for (i = 0; i < m * k; i++) a[i] = rnd();
    for (i = 0; i < k * n; i++) bsrc[i] = rnd();
    pdp_set_num_threads(threads);
    { /* pdp__gemm_bf16_convert in place gives the words it writes elsewhere */
        float *copy = (float *)malloc(sizeof(float) * (size_t)(big + rows));
        memcpy(copy, pool, sizeof(float) * (size_t)(big + rows));
        pdp__gemm_bf16_convert(path, pool, ph, big + rows);
        pdp__gemm_bf16_convert(path, copy, (uint16_t *)(void *)copy, big + rows);
        ASSERT_MEM_EQ(ph, copy, sizeof(uint16_t) * (size_t)(big + rows));
        free(copy);
    }
    for (v = 0; v < 3; v++)
        for (t = 0; t < 2; t++) {
            pdp_trans tr = t ? PDP_TRANS : PDP_NO_TRANS;
            for (i = 0; i < m * n; i++) c1[i] = c2[i] = 0.5f;
            if (v == 0) { /* rows_h: B k x n in bf16 words (pool converted) */
                for (i = 0; i < k; i++)
                    for (j = 0; j < n; j++) mat[i * n + j] = pool[off[i] + j];
                pdp__gemm_bf16_rows_h(path, tr, PDP_NO_TRANS, m, n, k, 1.5f, a,
                                      tr == PDP_NO_TRANS ? k : m, ph, off, 0.25f, c1, n);
                ASSERT_EQ(PDP_OK, pdp_gemm_bf16_on(path, tr, PDP_NO_TRANS, m, n, k, 1.5f, a,
                                                   tr == PDP_NO_TRANS ? k : m, mat, n, 0.25f,
                                                   c2, n));
            } else if (v == 1) { /* rows_h: B^T n x k in bf16 words */
                for (j = 0; j < n; j++)
                    for (i = 0; i < k; i++) mat[j * k + i] = pool[off[j] + i];
                pdp__gemm_bf16_rows_h(path, tr, PDP_TRANS, m, n, k, 1.5f, a,
                                      tr == PDP_NO_TRANS ? k : m, ph, off, 0.25f, c1, n);
                ASSERT_EQ(PDP_OK, pdp_gemm_bf16_on(path, tr, PDP_TRANS, m, n, k, 1.5f, a,
                                                   tr == PDP_NO_TRANS ? k : m, mat, k, 0.25f,
                                                   c2, n));
            } else { /* arows_h: A m x k in bf16 words; B k x n or n x k (tr) */
                for (i = 0; i < m; i++)
                    for (j = 0; j < k; j++) mat[i * k + j] = pool[off[i] + j];
                pdp__gemm_bf16_arows_h(path, tr, m, n, k, 1.5f, ph, off, bsrc,
                                       tr == PDP_NO_TRANS ? n : k, 0.25f, c1, n);
                ASSERT_EQ(PDP_OK, pdp_gemm_bf16_on(path, PDP_NO_TRANS, tr, m, n, k, 1.5f, mat, k,
                                                   bsrc, tr == PDP_NO_TRANS ? n : k, 0.25f, c2,
                                                   n));
            }
            for (i = 0; i < m * n; i++)
                if (to_bits(c1[i]) != to_bits(c2[i])) {
                    FAILm("a gathered bf16 product differs from the materialised one");
                }
        }
    pdp_set_num_threads(1);
    free(off);
    free(pool);
    free(a);
    free(mat);
    free(bsrc);
    free(ph);
    free(c1);
    free(c2);
    PASS();
}

TEST bf16_gemm_gathered_rows_match_materialised(void)
{
    static const int64_t shapes[][3] = {{9, 33, 65}, {37, 70, 133}, {3, 257, 2}, {70, 40, 784},
                                        {32, 64, 400}};
    pdp_bf16_path paths[3] = {PDP_BF16_PATH_EMULATED, PDP_BF16_PATH_AVX512, PDP_BF16_PATH_AMX};
    int p, s, t;
    for (p = 0; p < 3; p++) {
        if (!pdp_bf16_path_available(paths[p])) continue; /* bf16_gemm_*_matches_model skip it */
        for (s = 0; s < (int)(sizeof shapes / sizeof shapes[0]); s++)
            for (t = 1; t <= 2; t++)
                CHECK_CALL(check_gathered(paths[p], shapes[s][0], shapes[s][1], shapes[s][2], t));
    }
    PASS();
}

/* ---- the AMX driver on emulated tiles (gemm_amx.c, PDP__AMX_EMULATE) ---- */

/* TDPBF16PS's chain for C[i][j] by Intel's pseudo-code (SDM vol. 2, TDPBF16PS), written
   from the floats with no tiles or packing: over the pairs padded with zeros to a
   multiple of 16, the even product then the odd one, each added by an FMA of the
   DAZ'd bf16 inputs rounded to nearest even, the sum flushed (FTZ); then alpha acc +
   beta c as gemm.h states. */
static float amx_model(const mat *a, pdp_trans ta, const mat *b, pdp_trans tb, int64_t k,
                       int64_t i, int64_t j, float alpha, float beta, float c)
{
    int64_t p, padded = ((k + 1) / 2 + 15) / 16 * 32;
    float acc = 0.0f;
    volatile float r;
    for (p = 0; p < padded; p++) { /* p = 2q: the even product, first */
        float x = p < k ? daz(pdp_bf16_round(op_at(a, ta, i, p))) : 0.0f;
        float y = p < k ? daz(pdp_bf16_round(op_at(b, tb, p, j))) : 0.0f;
        r = fmaf(x, y, acc);
        acc = daz(r);
    }
    r = alpha * acc;
    if (beta != 0.0f) {
        volatile float bc = beta * c;
        r = bc + r;
    }
    return r;
}

/* Operands of case t (subnormals 2: every value times 2^-63, so that products fall
   near and below 2^-126 and sums into the subnormal range, where FTZ acts). */
static void amx_operands(const bcase *t, mat *a, mat *b, mat *c)
{
    int64_t i;
    *a = t->ta == PDP_NO_TRANS ? mat_new(t->m, t->k, t->pad, t->subnormals == 1)
                               : mat_new(t->k, t->m, t->pad, t->subnormals == 1);
    *b = t->tb == PDP_NO_TRANS ? mat_new(t->k, t->n, t->pad, t->subnormals == 1)
                               : mat_new(t->n, t->k, t->pad, t->subnormals == 1);
    *c = mat_new(t->m, t->n, t->pad, 0);
    if (t->subnormals == 2) {
        for (i = 0; i < a->rows * a->ld; i++) a->p[i] = ldexpf(a->p[i], -63);
        for (i = 0; i < b->rows * b->ld; i++) b->p[i] = ldexpf(b->p[i], -63);
    }
    if (t->nan_c)
        for (i = 0; i < c->rows * c->ld; i++)
            if (i % c->ld < t->n) c->p[i] = NAN;
}

/* C of case t by the AMX driver on `how`: 0 the hardware path (pdp_gemm_bf16_on), 1 the
   emulated tiles with the path's packing and epilogue (AVX-512 where it exists), 2 the
   emulated tiles with the portable ones; after amx_poison fills the thread's scratch
   with NaN words, so that a word a kernel reads but this call did not write shows. */
static int amx_poison; /* amx_run fills the caller's scratch with NaN words first */
static void amx_run(int how, const bcase *t, const mat *a, const mat *b, float *c, int64_t ldc)
{
    void *scratch = amx_poison ? pdp__thread_scratch(1 << 16) : NULL;
    if (scratch) memset(scratch, 0xff, 1 << 16);
    if (how == 0)
        (void)pdp_gemm_bf16_on(PDP_BF16_PATH_AMX, t->ta, t->tb, t->m, t->n, t->k, t->alpha, a->p,
                               a->ld, b->p, b->ld, t->beta, c, ldc);
    else
        pdp__amx_gemm_emulated(how == 2, t->ta, t->tb, t->m, t->n, t->k, t->alpha, a->p, NULL,
                               a->ld, NULL, b->p, NULL, b->ld, NULL, t->beta, c, ldc);
}

/* Case t on emulated tiles (both packings) at 1 and 2 threads against amx_model, bit for
   bit, C's padding untouched. */
static enum greatest_test_res check_amx_emulated(const bcase *t)
{
    mat a, b, c;
    float *cw;
    int64_t i, j, size;
    int how, threads, bad = 0;
    char msg[256] = "";
    amx_operands(t, &a, &b, &c);
    size = c.rows * c.ld;
    cw = (float *)malloc(sizeof(float) * (size_t)(size + 1));
    for (how = 1; how <= 2 && !bad; how++)
        for (threads = PDP_TEST_FIRST_THREADS; threads <= 2 && !bad; threads++) {
            memcpy(cw, c.p, sizeof(float) * (size_t)size);
            pdp_set_num_threads(threads);
            amx_run(how, t, &a, &b, cw, c.ld);
            pdp_set_num_threads(1);
            for (i = 0; i < t->m && !bad; i++)
                for (j = 0; j < c.ld && !bad; j++) {
                    float got = cw[i * c.ld + j], want = c.p[i * c.ld + j];
                    if (j < t->n)
                        want = amx_model(&a, t->ta, &b, t->tb, t->k, i, j, t->alpha, t->beta,
                                         c.p[i * c.ld + j]);
                    if (to_bits(got) != to_bits(want)) {
                        snprintf(msg, sizeof msg, "C[%lld][%lld] = %.9g (0x%08x), model %.9g "
                                 "(0x%08x): %s %s m%lld k%lld n%lld, %s, %d threads",
                                 (long long)i, (long long)j, (double)got, (unsigned)to_bits(got),
                                 (double)want, (unsigned)to_bits(want),
                                 layout_name(t->ta, t->tb), t->subnormals ? "tiny" : "",
                                 (long long)t->m, (long long)t->k, (long long)t->n,
                                 how == 1 ? "path packing" : "portable packing", threads);
                        bad = 1;
                    }
                }
        }
    free(a.p);
    free(b.p);
    free(c.p);
    free(cw);
    ASSERT_EQm(msg, 0, bad);
    PASS();
}

/* The AMX cases: odd m, k, n (k odd, k = 1, m = 1, n = 1 .. 17: the 4 x 1 blocks below
   17, the 2 x 2 above; the 1 x 2 at m <= 16: {1, 64, 17}, {10, 64, 66}, and across cache
   blocks {10, 784, 40}), k across several cache blocks (PDP__AMX_KC steps of 32 values),
   whole blocks stored straight to C (alpha 1, beta 0: {129, 31, 70}, {128, 40, 16}),
   all four layouts, alpha and beta (beta 0 with NaN in C), padded strides, subnormal
   inputs, tiny values (FTZ). f is called on each. */
static enum greatest_test_res amx_cases(enum greatest_test_res (*f)(const bcase *t))
{
    static const int64_t shapes[][3] = {
        {1, 1, 1},    {7, 3, 5},    {33, 17, 9},  {1, 64, 17},  {16, 32, 16}, {31, 33, 33},
        {65, 1, 3},   {17, 95, 40}, {70, 784, 40}, {129, 31, 70}, {3, 257, 2}, {40, 600, 18},
        {64, 512, 10}, {10, 64, 66}, {33, 70, 47}, {128, 40, 16}, {100, 130, 90},
        {10, 784, 40}};
    int s, ta, tb, n;
    for (s = 0; s < (int)(sizeof shapes / sizeof shapes[0]); s++)
        for (ta = 0; ta < 2; ta++)
            for (tb = 0; tb < 2; tb++) {
                bcase t;
                memset(&t, 0, sizeof t);
                t.ta = (pdp_trans)ta;
                t.tb = (pdp_trans)tb;
                t.m = shapes[s][0];
                t.k = shapes[s][1];
                t.n = shapes[s][2];
                t.alpha = s % 4 == 1 ? 0.5f : 1.0f;
                t.beta = (s % 3 == 0) ? 0.0f : (s % 3 == 1) ? 1.0f : -0.75f;
                t.nan_c = t.beta == 0.0f;
                t.pad = s % 2 ? 3 : 0;
                t.subnormals = s % 5 == 2 ? 1 : s % 5 == 4 ? 2 : 0;
                CHECK_CALL(f(&t));
            }
    for (n = 1; n <= 17; n++) {
        bcase t;
        memset(&t, 0, sizeof t);
        t.ta = (pdp_trans)(n % 2);
        t.tb = (pdp_trans)(n / 2 % 2);
        t.m = 5 + n;
        t.k = 37;
        t.n = n;
        t.alpha = 1.0f;
        t.beta = n % 3 ? 0.25f : 0.0f;
        CHECK_CALL(f(&t));
    }
    PASS();
}

TEST bf16_amx_emulated_tiles_match_sdm_loop(void) { return amx_cases(check_amx_emulated); }

/* Case t on the hardware's tiles against the emulated ones: bit for bit where the
   hardware follows the pseudo-code's order, else within both chains' fp32 summation
   bound: |hw - emulated| <= 2 (|alpha| ((K + 2) 2^-24 sum |a_bf b_bf| + K 2^-126)) +
   |beta c| 2^-23, K the padded k (each is an fp32 sum of the same exact products; the
   K 2^-126 term covers what FTZ flushes at each step).
   Measured on an Intel Xeon (Sapphire Rapids class, AMX-BF16, 2 cores), one
   TDPBF16PS on random data (bf16_amx_hardware_pair_rounding_recorded below checks the
   first rule on every run): a single pair gives fl(acc + fl(a0 b0 + a1 b1)) in every
   element (the pseudo-code's fl(fl(acc + a0 b0) + a1 b1): 89%); with 2 or more pairs
   per instruction no sequential or tree order of fp32 roundings tried (by hand, on
   512000 elements) matches every element (76-85% at 2 pairs, 39-46% at 16). So here
   the hardware is held to the bound, and amx_hw_same / amx_hw_total count how many
   elements still came out bit for bit. */
static long amx_hw_same, amx_hw_total;
static double amx_hw_worst; /* the largest |hw - emulated| / bound */

static enum greatest_test_res check_amx_hardware(const bcase *t)
{
    mat a, b, c;
    float *c1, *c2;
    int64_t i, j, p, size, kp = ((t->k + 1) / 2 + 15) / 16 * 32;
    char msg[256] = "";
    int bad = 0;
    amx_operands(t, &a, &b, &c);
    size = c.rows * c.ld;
    c1 = (float *)malloc(sizeof(float) * (size_t)(size + 1));
    c2 = (float *)malloc(sizeof(float) * (size_t)(size + 1));
    memcpy(c1, c.p, sizeof(float) * (size_t)size);
    memcpy(c2, c.p, sizeof(float) * (size_t)size);
    pdp_set_num_threads(2); /* the same bits as one thread (2 m n k >= 1e6: two parts) */
    amx_run(0, t, &a, &b, c2, c.ld);
    pdp_set_num_threads(1);
    amx_run(0, t, &a, &b, c1, c.ld);
    if (memcmp(c1, c2, sizeof(float) * (size_t)size) != 0) {
        snprintf(msg, sizeof msg, "the hardware path's bits differ at 1 and 2 threads: %s m%lld "
                 "k%lld n%lld", layout_name(t->ta, t->tb), (long long)t->m, (long long)t->k,
                 (long long)t->n);
        bad = 1;
    }
    memcpy(c2, c.p, sizeof(float) * (size_t)size);
    amx_run(1, t, &a, &b, c2, c.ld);
    for (i = 0; i < t->m && !bad; i++)
        for (j = 0; j < c.ld && !bad; j++) {
            float h = c1[i * c.ld + j], e = c2[i * c.ld + j];
            double mag = 0.0, bound;
            if (j >= t->n) {
                if (to_bits(h) != to_bits(c.p[i * c.ld + j])) {
                    snprintf(msg, sizeof msg, "padding of C row %lld overwritten", (long long)i);
                    bad = 1;
                }
                continue;
            }
            for (p = 0; p < t->k; p++)
                mag += fabs((double)daz(pdp_bf16_round(op_at(&a, t->ta, i, p))) *
                            daz(pdp_bf16_round(op_at(&b, t->tb, p, j))));
            bound = 2.0 * fabs(t->alpha) * (((double)kp + 2.0) * ldexp(1.0, -24) * mag +
                                            (double)kp * ldexp(1.0, -126)) +
                    (t->beta != 0.0f ? fabs((double)t->beta * c.p[i * c.ld + j]) * ldexp(1.0, -23)
                                     : 0.0) + 1e-44;
            amx_hw_total++;
            amx_hw_same += to_bits(h) == to_bits(e);
            if (fabs((double)h - e) / bound > amx_hw_worst) amx_hw_worst = fabs((double)h - e) / bound;
            if (!(fabs((double)h - e) <= bound)) {
                snprintf(msg, sizeof msg, "C[%lld][%lld] = %.9g (0x%08x), emulated %.9g (0x%08x), "
                         "more than %.3g apart: %s m%lld k%lld n%lld%s", (long long)i,
                         (long long)j, (double)h, (unsigned)to_bits(h), (double)e,
                         (unsigned)to_bits(e), bound, layout_name(t->ta, t->tb), (long long)t->m,
                         (long long)t->k, (long long)t->n, t->subnormals == 2 ? " tiny" : "");
                bad = 1;
            }
        }
    free(a.p);
    free(b.p);
    free(c.p);
    free(c1);
    free(c2);
    ASSERT_EQm(msg, 0, bad);
    PASS();
}

TEST bf16_amx_hardware_matches_emulated_tiles(void)
{
    static char msg[128];
    if (!pdp_bf16_path_available(PDP_BF16_PATH_AMX))
        SKIPm("bf16 path amx-bf16: not available on this CPU or build (needs x86-64 Linux, "
              "CPUID AMX-BF16 and AMX-TILE, the tile state in XCR0 and ARCH_REQ_XCOMP_PERM "
              "granted); the driver is checked on emulated tiles");
    amx_hw_same = amx_hw_total = 0;
    amx_hw_worst = 0.0;
    CHECK_CALL(amx_cases(check_amx_hardware));
    snprintf(msg, sizeof msg, "within the bound: %ld of %ld elements bit for bit, worst %.2g of "
             "the bound", amx_hw_same, amx_hw_total, amx_hw_worst);
    PASSm(msg);
}

/* The streaming kernels (gemm_amx.c: one side of C at most 16, the other operand
   converted a k step at a time inside the kernel, on a CPU with AVX512-BF16): n = 1, 15,
   16 with op(A) stored along k, and m = 1, 15, 16 with op(B) stored k x n, against the
   other side across the 4 x 1 and 1 x 2 blocks (1, 15, 16, 17, 33, 64, 65, 130) and k =
   1, 31, 33, 100, 529 (a step's tail; several steps), the other operand in both layouts;
   alpha 1 and beta 0 (whole blocks stored straight to C) or not, padded strides,
   subnormal inputs, tiny values. f on each. */
static enum greatest_test_res amx_stream_cases(enum greatest_test_res (*f)(const bcase *t))
{
    static const int64_t small[] = {1, 15, 16}, other[] = {1, 15, 16, 17, 33, 64, 65, 130};
    static const int64_t ks[] = {1, 31, 33, 100, 529};
    int side, i, j, q, count = 0;
    for (side = 0; side < 2; side++)
        for (i = 0; i < 3; i++)
            for (j = 0; j < 8; j++)
                for (q = 0; q < 5; q++) {
                    bcase t;
                    memset(&t, 0, sizeof t);
                    count++;
                    t.m = side ? small[i] : other[j];
                    t.n = side ? other[j] : small[i];
                    t.k = ks[q];
                    t.ta = side ? (pdp_trans)(count % 2) : PDP_NO_TRANS; /* side 0: A streams */
                    t.tb = side ? PDP_NO_TRANS : (pdp_trans)(count % 2); /* side 1: B */
                    t.alpha = count % 3 ? 1.0f : 0.5f;
                    t.beta = count % 4 == 1 ? 0.25f : 0.0f;
                    t.nan_c = t.beta == 0.0f;
                    t.pad = count % 5 == 0 ? 3 : 0;
                    t.subnormals = count % 7 == 3 ? 1 : count % 7 == 5 ? 2 : 0;
                    CHECK_CALL(f(&t));
                }
    PASS();
}

/* The streaming kernels on emulated tiles against the pseudo-code's loop, bit for bit
   (check_amx_emulated: their words and tile order are those of the packed path), and on
   the hardware against the emulated tiles (check_amx_hardware), each call on a scratch
   of NaN words (amx_poison: the zero pairs past k must be written, not found). */
TEST bf16_amx_streamed_operand_matches_sdm_loop(void)
{
    static char msg[160];
    enum greatest_test_res r;
    amx_poison = 1;
    r = amx_stream_cases(check_amx_emulated);
    amx_poison = 0;
    CHECK_CALL(r);
    if (!pdp_bf16_path_available(PDP_BF16_PATH_AMX))
        SKIPm("the emulated tiles pass; the hardware's: bf16 path amx-bf16 not available on "
              "this CPU or build");
    amx_hw_same = amx_hw_total = 0;
    amx_hw_worst = 0.0;
    amx_poison = 1;
    r = amx_stream_cases(check_amx_hardware);
    amx_poison = 0;
    CHECK_CALL(r);
    snprintf(msg, sizeof msg, "hardware within the bound: %ld of %ld elements bit for bit, "
             "worst %.2g of the bound", amx_hw_same, amx_hw_total, amx_hw_worst);
    PASSm(msg);
}

/* What one TDPBF16PS computes, recorded (gemm_amx.c's top comment): one k step of
   gemm_amx.c's 2 x 2 kernel on the hardware, from random accumulators (values in
   [-1, 1)) and random bf16 pairs (magnitudes in [2^-15, 2^13)). With one pair per row (the
   other 15 zero) every element must be fl(acc + fl(a0 b0 + a1 b1)), one rounding for
   the pair's sum and one for the addition; the pseudo-code's fl(fl(acc + a0 b0) +
   a1 b1) and the 16-pair chain are counted, not required (the message prints the
   fractions: if a CPU ever matches the pseudo-code everywhere, the bound in
   check_amx_hardware can become bits). */
#if PDP__BF16_AMX
static float amx_bf(uint32_t h) { return from_bits(h << 16); }
static uint32_t amx_rnd_bf16(void)
{
    uint32_t r = rnd_u32();
    return (0x3800u + r % 0x0e00u) | (r & 0x8000u); /* +-[2^-15, 2^13): wide, so that */
                                                    /* the orders round differently */
}
#endif

TEST bf16_amx_hardware_pair_rounding_recorded(void)
{
#if PDP__BF16_AMX
    static uint32_t a[2 * 256], b[16 * 32];
    static float acc0[32 * 32], acc[32 * 32];
    static char msg[256];
    const pdp__amx_alay order = {2 * 256, 256, 64}; /* tile order, 2 tiles of A */
    long pair_sum = 0, pseudo1 = 0, pseudo16 = 0, total = 0;
    int pairs, i, j, q;
    if (!pdp_bf16_path_available(PDP_BF16_PATH_AMX))
        SKIPm("bf16 path amx-bf16: not available on this CPU or build");
    for (pairs = 1; pairs <= 16; pairs += 15) {
        for (i = 0; i < 2 * 256; i++)
            a[i] = i % 16 < pairs ? amx_rnd_bf16() | amx_rnd_bf16() << 16 : 0u;
        for (i = 0; i < 16 * 32; i++)
            b[i] = i / 32 < pairs ? amx_rnd_bf16() | amx_rnd_bf16() << 16 : 0u;
        for (i = 0; i < 32 * 32; i++) acc0[i] = rnd();
        pdp__amx_config(NULL);
        pdp__amx_kernel22(NULL, 1, a, &order, b, acc0, acc, 32);
        pdp__amx_release(NULL);
        for (i = 0; i < 32; i++)
            for (j = 0; j < 32; j++) {
                const uint32_t *ar = a + (i / 16) * 256 + (i % 16) * 16; /* row i's pairs */
                float chain = acc0[i * 32 + j], got = acc[i * 32 + j];
                for (q = 0; q < pairs; q++) {
                    uint32_t aw = ar[q], bw = b[q * 32 + j];
                    chain = fmaf(amx_bf(aw & 0xffffu), amx_bf(bw & 0xffffu), chain);
                    chain = fmaf(amx_bf(aw >> 16), amx_bf(bw >> 16), chain);
                }
                if (pairs == 1) {
                    uint32_t aw = ar[0], bw = b[j];
                    /* a1 b1 is exact in fp32 (8-bit significands): one rounding of the sum */
                    volatile float sum = fmaf(amx_bf(aw & 0xffffu), amx_bf(bw & 0xffffu),
                                              amx_bf(aw >> 16) * amx_bf(bw >> 16));
                    volatile float want = acc0[i * 32 + j] + sum;
                    pair_sum += to_bits(got) == to_bits(want);
                    pseudo1 += to_bits(got) == to_bits(chain);
                    total++;
                } else {
                    pseudo16 += to_bits(got) == to_bits(chain);
                }
            }
    }
    snprintf(msg, sizeof msg, "one pair: fl(acc + fl(a0 b0 + a1 b1)) in %ld of %ld, the "
             "pseudo-code's order in %ld; 16 pairs: the pseudo-code's chain in %ld of %ld",
             pair_sum, total, pseudo1, pseudo16, total);
    ASSERT_EQm(msg, total, pair_sum);
    PASSm(msg);
#else
    SKIPm("bf16 path amx-bf16: not compiled in this build (needs x86-64 Linux and gcc 11 or "
          "clang 12)");
#endif
}

/* Gathered operands (Conv2d's implicit GEMM) through the AMX driver on emulated tiles:
   B's storage rows through an offset table (both tb), A's (not transposed), against the
   driver on the materialised floats, bit for bit. */
TEST bf16_amx_emulated_gathered_match_materialised(void)
{
    static const int64_t shapes[][3] = {{9, 33, 65}, {37, 70, 13}, {3, 257, 2}, {33, 40, 100}};
    int s, v, t, how;
    for (s = 0; s < (int)(sizeof shapes / sizeof shapes[0]); s++)
        for (how = 1; how <= 2; how++) {
            int64_t m = shapes[s][0], n = shapes[s][1], k = shapes[s][2], i, j;
            int64_t big = 4 * (m + n + k) + 64, rows = PDP__MAX(m, PDP__MAX(n, k));
            pdp_bf16_path conv = how == 2 || !pdp_bf16_path_available(PDP_BF16_PATH_AVX512)
                                     ? PDP_BF16_PATH_EMULATED : PDP_BF16_PATH_AVX512;
            int64_t *off = (int64_t *)malloc(sizeof(int64_t) * (size_t)rows);
            float *pool = (float *)malloc(sizeof(float) * (size_t)(big + rows));
            uint16_t *ph = (uint16_t *)malloc(sizeof(uint16_t) * (size_t)(big + rows));
            float *x = (float *)malloc(sizeof(float) * (size_t)PDP__MAX(k * n, m * k));
            float *mat = (float *)malloc(sizeof(float) * (size_t)PDP__MAX(k * n, m * k));
            float *c1 = (float *)malloc(sizeof(float) * (size_t)(m * n));
            float *c2 = (float *)malloc(sizeof(float) * (size_t)(m * n));
            for (i = 0; i < big + rows; i++) pool[i] = rnd();
            for (i = 0; i < rows; i++) off[i] = (int64_t)(rnd_u32() % (uint32_t)big);
            for (i = 0; i < PDP__MAX(k * n, m * k); i++) x[i] = rnd();
            pdp__gemm_bf16_convert(conv, pool, ph, big + rows);
            for (v = 0; v < 3; v++)
                for (t = 0; t < 2; t++) {
                    pdp_trans tr = t ? PDP_TRANS : PDP_NO_TRANS;
                    int64_t ldx = tr == PDP_NO_TRANS ? k : m;
                    for (i = 0; i < m * n; i++) c1[i] = c2[i] = 0.5f;
                    if (v == 0) { /* B k x n, rows through off */
                        for (i = 0; i < k; i++)
                            for (j = 0; j < n; j++) mat[i * n + j] = pool[off[i] + j];
                        pdp__amx_gemm_emulated(how == 2, tr, PDP_NO_TRANS, m, n, k, 1.5f, x, NULL,
                                               ldx, NULL, NULL, ph, 0, off, 0.25f, c1, n);
                        pdp__amx_gemm_emulated(how == 2, tr, PDP_NO_TRANS, m, n, k, 1.5f, x, NULL,
                                               ldx, NULL, mat, NULL, n, NULL, 0.25f, c2, n);
                    } else if (v == 1) { /* B^T n x k, rows through off */
                        for (j = 0; j < n; j++)
                            for (i = 0; i < k; i++) mat[j * k + i] = pool[off[j] + i];
                        pdp__amx_gemm_emulated(how == 2, tr, PDP_TRANS, m, n, k, 1.5f, x, NULL,
                                               ldx, NULL, NULL, ph, 0, off, 0.25f, c1, n);
                        pdp__amx_gemm_emulated(how == 2, tr, PDP_TRANS, m, n, k, 1.5f, x, NULL,
                                               ldx, NULL, mat, NULL, k, NULL, 0.25f, c2, n);
                    } else { /* A m x k, rows through off; B = x as k x n or n x k */
                        for (i = 0; i < m; i++)
                            for (j = 0; j < k; j++) mat[i * k + j] = pool[off[i] + j];
                        pdp__amx_gemm_emulated(how == 2, PDP_NO_TRANS, tr, m, n, k, 1.5f, NULL, ph,
                                               0, off, x, NULL, tr == PDP_NO_TRANS ? n : k, NULL,
                                               0.25f, c1, n);
                        pdp__amx_gemm_emulated(how == 2, PDP_NO_TRANS, tr, m, n, k, 1.5f, mat,
                                               NULL, k, NULL, x, NULL, tr == PDP_NO_TRANS ? n : k,
                                               NULL, 0.25f, c2, n);
                    }
                    for (i = 0; i < m * n; i++)
                        if (to_bits(c1[i]) != to_bits(c2[i]))
                            FAILm("a gathered product on emulated AMX tiles differs from the "
                                  "materialised one");
                }
            free(off);
            free(pool);
            free(ph);
            free(x);
            free(mat);
            free(c1);
            free(c2);
        }
    PASS();
}


/* ---- the bias and ReLU or GELU in the epilogue (pdp__gemm_bf16_bias) ---- */

/* C of variant v (0 portable emulation, 1 AVX2, 2 AVX-512F emulation, 3 avx512-bf16, 4 amx
   on the hardware, 5 and 6 the AMX driver on emulated tiles with the path's and the
   portable packing and epilogue), x W^T (x m x k, W n x k, the Linear's layout): with
   bias (NULL: none) and act (1 ReLU, 2 GELU into gl, 0 none) in the epilogue (fused), or
   the way the Linear and the GELU layer do it apart, the product with beta 0, then a pass
   C = relu(bias + C), or C = bias + C and the GELU layer's kernel G = gelu(C) row by row.
   0: v not here. */
static int bias_run(int v, int fused, int64_t m, int64_t n, int64_t k, const float *x,
                    const float *w, const float *bias, int act, float *c, float *gl, int64_t ldc)
{
    int relu = act == 1;
    float *gelu = act == 2 ? gl : NULL;
    static const pdp_bf16_path path[5] = {PDP__BF16_PATH_PORTABLE, PDP__BF16_PATH_EMUL256,
                                          PDP__BF16_PATH_EMUL512, PDP_BF16_PATH_AVX512,
                                          PDP_BF16_PATH_AMX};
    int64_t i, j;
    pdp_bf16_path_available(PDP_BF16_PATH_AUTO); /* CPUID read */
    if ((v == 1 && !pdp__bf16_this.emul256) || (v == 2 && !pdp__bf16_this.emul512) ||
        (v == 3 && !pdp_bf16_path_available(PDP_BF16_PATH_AVX512)) ||
        (v == 4 && !pdp_bf16_path_available(PDP_BF16_PATH_AMX)))
        return 0;
    if (v >= 5)
        pdp__amx_gemm_emulated_bias(v == 6, PDP_NO_TRANS, PDP_TRANS, m, n, k, 1.0f, x, NULL, k,
                                    NULL, w, NULL, k, NULL, 0.0f, fused ? bias : NULL,
                                    fused && relu, fused ? gelu : NULL, c, ldc);
    else if (fused)
        pdp__gemm_bf16_bias(path[v], PDP_NO_TRANS, PDP_TRANS, m, n, k, x, k, w, k, bias, relu,
                            gelu, c, ldc);
    else if (v >= 3)
        pdp_gemm_bf16_on(path[v], PDP_NO_TRANS, PDP_TRANS, m, n, k, 1.0f, x, k, w, k, 0.0f, c,
                         ldc);
    else
        pdp__gemm_bf16_emul(v == 0 ? 0 : v == 1 ? 256 : 512, PDP_NO_TRANS, PDP_TRANS, m, n, k,
                            1.0f, x, k, w, k, 0.0f, c, ldc);
    if (!fused)
        for (i = 0; i < m; i++)
            for (j = 0; j < n; j++) {
                float r = c[i * ldc + j];
                if (bias) r = bias[j] + r;
                c[i * ldc + j] = relu ? pdp__relu(r) : r;
            }
    if (!fused && gelu) /* the GELU layer's kernel on its width */
        for (i = 0; i < m; i++)
            pdp__layers_gelu_simd_run(pdp__layers_simd(), c + i * ldc, NULL, gelu + i * ldc, n);
    return 1;
}

/* The bias and the ReLU in the product's epilogue give the bits of the product followed
   by the Linear's old pass (relu(b + C), and C = b then beta 1 without the ReLU), and a
   GELU there those of C = b + C and the GELU layer's kernel after, C kept, on every chain
   path and kernel this CPU has and on the emulated tiles: odd shapes (n across the AMX
   4 x 1 and 2 x 2 blocks and several panels, k across its cache blocks; m = 130 at n = 10:
   the streamed A's row blocks, each epilogue after the next block's kernel), padded C and G
   whose padding stays untouched, a bias with -0 and values that make sums negative and
   large enough to reach the GELU's saturation, a NaN row of x, 1 and 2 threads. */
TEST bf16_bias_in_epilogue_matches_two_passes(void)
{
    static const int64_t shape[][3] = {{1, 1, 1},    {5, 16, 3},    {37, 17, 19}, {70, 45, 100},
                                       {67, 96, 33}, {33, 130, 401}, {96, 80, 160},
                                       {130, 10, 70}};
    int s, v, act, has_bias, threads, ran = 0;
    char msg[256];
    for (s = 0; s < (int)(sizeof shape / sizeof shape[0]); s++) {
        int64_t m = shape[s][0], n = shape[s][1], k = shape[s][2], ldc = n + 3, i;
        float *x = (float *)malloc(sizeof(float) * (size_t)(m * k));
        float *w = (float *)malloc(sizeof(float) * (size_t)(n * k));
        float *bias = (float *)malloc(sizeof(float) * (size_t)n);
        float *want = (float *)malloc(sizeof(float) * (size_t)(m * ldc));
        float *got = (float *)malloc(sizeof(float) * (size_t)(m * ldc));
        float *gwant = (float *)malloc(sizeof(float) * (size_t)(m * ldc));
        float *ggot = (float *)malloc(sizeof(float) * (size_t)(m * ldc));
        for (i = 0; i < m * k; i++) x[i] = rnd();
        for (i = 0; i < n * k; i++) w[i] = rnd();
        for (i = 0; i < n; i++)
            bias[i] = i % 7 == 3 ? -0.0f : i % 11 == 5 ? 60.0f * rnd() : 2.0f * rnd();
        if (m > 2)
            for (i = 0; i < k; i++) x[2 * k + i] = NAN; /* row 2 of C: NaN */
        for (v = 0; v < 7; v++)
            for (act = 0; act < 3; act++)
                for (has_bias = 0; has_bias < 2; has_bias++)
                    for (threads = PDP_TEST_FIRST_THREADS; threads <= 2; threads++) {
                        const float *bv = has_bias ? bias : NULL;
                        int64_t at, where = -1;
                        for (i = 0; i < m * ldc; i++)
                            want[i] = got[i] = (float)i, gwant[i] = ggot[i] = (float)-i;
                        pdp_set_num_threads(threads);
                        if (!bias_run(v, 0, m, n, k, x, w, bv, act, want, gwant, ldc)) continue;
                        bias_run(v, 1, m, n, k, x, w, bv, act, got, ggot, ldc);
                        ran++;
                        for (at = 0; at < 2 * m * ldc && where < 0; at++)
                            if (at < m * ldc ? to_bits(got[at]) != to_bits(want[at])
                                             : to_bits(ggot[at - m * ldc]) !=
                                                   to_bits(gwant[at - m * ldc]))
                                where = at;
                        if (where >= 0) {
                            int64_t e = where % (m * ldc);
                            const float *gp = where < m * ldc ? got : ggot;
                            const float *wp = where < m * ldc ? want : gwant;
                            snprintf(msg, sizeof msg, "variant %d, m%lld n%lld k%lld, act %d, "
                                     "bias %d, %d threads: %s[%lld][%lld] = 0x%08x, two passes "
                                     "0x%08x", v, (long long)m, (long long)n, (long long)k,
                                     act, has_bias, threads, where < m * ldc ? "C" : "G",
                                     (long long)(e / ldc), (long long)(e % ldc),
                                     (unsigned)to_bits(gp[e]), (unsigned)to_bits(wp[e]));
                            FAILm(msg);
                        }
                        if (!act && has_bias) { /* the old C = b, beta 1 */
                            for (i = 0; i < m * ldc; i++) want[i] = (float)i;
                            for (i = 0; i < m; i++)
                                memcpy(want + i * ldc, bias, sizeof(float) * (size_t)n);
                            if (v >= 5)
                                pdp__amx_gemm_emulated(v == 6, PDP_NO_TRANS, PDP_TRANS, m, n, k,
                                                       1.0f, x, NULL, k, NULL, w, NULL, k, NULL,
                                                       1.0f, want, ldc);
                            else if (v >= 3)
                                pdp_gemm_bf16_on(v == 3 ? PDP_BF16_PATH_AVX512 : PDP_BF16_PATH_AMX,
                                                 PDP_NO_TRANS, PDP_TRANS, m, n, k, 1.0f, x, k, w,
                                                 k, 1.0f, want, ldc);
                            else
                                pdp__gemm_bf16_emul(v == 0 ? 0 : v == 1 ? 256 : 512,
                                                    PDP_NO_TRANS, PDP_TRANS, m, n, k, 1.0f, x, k,
                                                    w, k, 1.0f, want, ldc);
                            if (memcmp(got, want, sizeof(float) * (size_t)(m * ldc))) {
                                snprintf(msg, sizeof msg, "variant %d, m%lld n%lld k%lld: C = b "
                                         "then beta 1 differs from the fused bias", v,
                                         (long long)m, (long long)n, (long long)k);
                                FAILm(msg);
                            }
                        }
                        pdp_set_num_threads(1);
                    }
        free(x), free(w), free(bias), free(want), free(got), free(gwant), free(ggot);
    }
    /* the portable emulation and both emulated tiles at least, at each thread count run */
    ASSERT(ran >= 3 * 7 * 6 * (2 - PDP_TEST_FIRST_THREADS + 1));
    PASS();
}

/* ---- Conv2d through the implicit path's GEMMs ---- */

typedef struct conv_result {
    float *y, *dw, *db, *dx;
    int64_t ny, nw, nb, nx;
    int dw_t, dw_dots;
} conv_result;

static void conv_result_free(conv_result *r)
{
    free(r->y);
    free(r->dw);
    free(r->db);
    free(r->dx);
    memset(r, 0, sizeof *r);
}

/* x rounded to bf16 (pdp_bf16_round), as doubles: a reference's operands */
static double *bf16_rounded(const float *x, int64_t n)
{
    double *r = (double *)malloc(sizeof(double) * (size_t)n);
    int64_t i;
    for (i = 0; i < n; i++) r[i] = pdp_bf16_round(x[i]);
    return r;
}

static float *copy_of(const float *x, int64_t n)
{
    float *c = (float *)malloc(sizeof(float) * (size_t)n);
    memcpy(c, x, sizeof(float) * (size_t)n);
    return c;
}

/* One Conv2d (C -> O, k K, stride 1, padding pad) in bf16 on N samples of H x H, on the
   path pdp__test_knobs.conv_bf16_path names: y, dW, db and dX against double sums of the
   bf16-rounded inputs, (terms + 2 + chunks) 2^-24 sum |products| (fp32 sums of exact
   products; the chunks' dW shares summed once more), at 1 thread; the results kept in *out (the caller
   holds a run on more threads to those bits, so it skips the double sums). */
static enum greatest_test_res check_conv_gemms(int64_t C, int64_t O, int64_t K, int64_t pad,
                                               int64_t H, int64_t N, int threads,
                                               conv_result *out)
{
    pdp_model *m = NULL;
    pdp_model_desc d;
    pdp_tensor x;
    const pdp_tensor *y;
    pdp_param w, b;
    pdp__conv_geom g;
    float *xd, *dy, *dx;
    int64_t xs[4], Ho = H + 2 * pad - K + 1, i, n, o, c, ki, kj, oh, ow, ih, iw, chunks;
    rng_state = 77u; /* the same data at every thread count */
    memset(&d, 0, sizeof d);
    d.input_shape[0] = C;
    d.input_shape[1] = H;
    d.input_shape[2] = H;
    d.seed = 5;
    d.precision = PDP_PRECISION_BF16;
    ASSERT_EQ(PDP_OK, pdp_model_create(&m, &d));
    ASSERT_EQ(PDP_OK, pdp_model_add_conv2d(m, O, K, 1, pad));
    g = pdp__conv_geom_of(&m->layers[0]);
    ASSERT(g.implicit);
    out->dw_t = g.dw_t;
    out->dw_dots = g.dw_dots;
    chunks = (N + g.per_chunk - 1) / g.per_chunk;
    xs[0] = N, xs[1] = C, xs[2] = H, xs[3] = H;
    xd = (float *)malloc(sizeof(float) * (size_t)(N * C * H * H));
    dx = (float *)malloc(sizeof(float) * (size_t)(N * C * H * H));
    for (i = 0; i < N * C * H * H; i++) xd[i] = rnd();
    pdp_tensor_wrap(xd, pdp_cpu(), 4, xs, &x);
    pdp_set_num_threads(threads);
    ASSERT_EQ(PDP_OK, pdp_model_forward(m, &x, &y));
    pdp_model_find_param(m, "0.weight", &w);
    pdp_model_find_param(m, "0.bias", &b);
    dy = (float *)malloc(sizeof(float) * (size_t)y->count);
    for (i = 0; i < y->count; i++) dy[i] = rnd();
    pdp_model_zero_grad(m);
    ASSERT_EQ(PDP_OK, fixture_backward_with_dx(m, dy, dx)); /* the first layer's dX too */
    pdp_set_num_threads(1);
#define W_(o, c, ki, kj) wr[(((o) * C + (c)) * K + (ki)) * K + (kj)]
#define X_(n, c, ih, iw) xr[(((n) * C + (c)) * H + (ih)) * H + (iw)]
#define DY_(n, o, oh, ow) dyr[(((n) * O + (o)) * Ho + (oh)) * Ho + (ow)]
    if (threads == 1) { /* more threads: held to 1 thread's bits by the caller */
        /* the bf16-rounded operands, each value rounded once (not once per product) */
        double *wr = bf16_rounded(w.value.data, O * C * K * K);
        double *xr = bf16_rounded(xd, N * C * H * H), *dyr = bf16_rounded(dy, y->count);
        for (n = 0; n < N; n++)
            for (o = 0; o < O; o++)
                for (oh = 0; oh < Ho; oh++)
                    for (ow = 0; ow < Ho; ow++) {
                        double ref = b.value.data[o], mag = fabs(b.value.data[o]);
                        for (c = 0; c < C; c++)
                            for (ki = 0; ki < K; ki++)
                                for (kj = 0; kj < K; kj++) {
                                    double t;
                                    ih = oh - pad + ki, iw = ow - pad + kj;
                                    if (ih < 0 || ih >= H || iw < 0 || iw >= H) continue;
                                    t = W_(o, c, ki, kj) * X_(n, c, ih, iw);
                                    ref += t;
                                    mag += fabs(t);
                                }
                        ASSERT_IN_RANGE(ref, y->data[((n * O + o) * Ho + oh) * Ho + ow],
                                        (C * K * K + 2) * ldexp(mag, -24));
                    }
        for (o = 0; o < O; o++) {
            double db = 0.0, dbm = 0.0;
            for (n = 0; n < N; n++)
                for (i = 0; i < Ho * Ho; i++) {
                    db += dy[(n * O + o) * Ho * Ho + i];
                    dbm += fabs(dy[(n * O + o) * Ho * Ho + i]);
                }
            ASSERT_IN_RANGE(db, b.grad.data[o], (N * Ho * Ho + 2 + chunks) * ldexp(dbm, -24));
            for (c = 0; c < C; c++)
                for (ki = 0; ki < K; ki++)
                    for (kj = 0; kj < K; kj++) {
                        double ref = 0.0, mag = 0.0;
                        for (n = 0; n < N; n++)
                            for (oh = 0; oh < Ho; oh++)
                                for (ow = 0; ow < Ho; ow++) {
                                    double t;
                                    ih = oh - pad + ki, iw = ow - pad + kj;
                                    if (ih < 0 || ih >= H || iw < 0 || iw >= H) continue;
                                    t = DY_(n, o, oh, ow) * X_(n, c, ih, iw);
                                    ref += t;
                                    mag += fabs(t);
                                }
                        ASSERT_IN_RANGE(ref, w.grad.data[((o * C + c) * K + ki) * K + kj],
                                        (N * Ho * Ho + 2 + chunks) * ldexp(mag, -24));
                    }
        }
        for (n = 0; n < N; n++)
            for (c = 0; c < C; c++)
                for (ih = 0; ih < H; ih++)
                    for (iw = 0; iw < H; iw++) {
                        double ref = 0.0, mag = 0.0;
                        for (o = 0; o < O; o++)
                            for (ki = 0; ki < K; ki++)
                                for (kj = 0; kj < K; kj++) {
                                    double t;
                                    oh = ih + pad - ki, ow = iw + pad - kj;
                                    if (oh < 0 || oh >= Ho || ow < 0 || ow >= Ho) continue;
                                    t = W_(o, c, ki, kj) * DY_(n, o, oh, ow);
                                    ref += t;
                                    mag += fabs(t);
                                }
                        ASSERT_IN_RANGE(ref, dx[((n * C + c) * H + ih) * H + iw],
                                        (O * K * K + 2) * ldexp(mag, -24));
                    }
        free(wr);
        free(xr);
        free(dyr);
    }
#undef W_
#undef X_
#undef DY_
    out->ny = y->count, out->y = copy_of(y->data, y->count);
    out->nw = w.grad.count, out->dw = copy_of(w.grad.data, w.grad.count);
    out->nb = b.grad.count, out->db = copy_of(b.grad.data, b.grad.count);
    out->nx = N * C * H * H, out->dx = copy_of(dx, out->nx);
    free(xd);
    free(dx);
    free(dy);
    pdp_model_free(m);
    PASS();
}

static int same_bits(const float *a, const float *b, int64_t n)
{
    return memcmp(a, b, sizeof(float) * (size_t)n) == 0;
}

TEST bf16_model_conv2d_implicit_gemms_match_reference(void)
{
    /* C, O, K, pad, H, N: the CNN's second layer (dW transposed with the AVX-512 fp32
       tiles), C k k = 375 (transposed with every fp32 kernel's tiles), as rows with dy
       apart from the padded dy (pad 0: not a "same" convolution), as dot products; two
       chunks */
    static const int64_t cases[][6] = {{16, 32, 5, 2, 14, 3}, {15, 32, 5, 2, 9, 3},
                                       {8, 8, 3, 0, 11, 3},   {1, 16, 5, 2, 12, 3},
                                       {16, 32, 5, 2, 14, 11}};
    int paths[4], np = 0, p, s, seen_t = 0, seen_rows = 0, seen_dots = 0;
    paths[np++] = 0; /* the path AUTO takes */
    paths[np++] = PDP_BF16_PATH_EMULATED;
    if (pdp_bf16_path_available(PDP_BF16_PATH_AVX512)) paths[np++] = PDP_BF16_PATH_AVX512;
    if (pdp_bf16_path_available(PDP_BF16_PATH_AMX)) paths[np++] = PDP_BF16_PATH_AMX;
    for (p = 0; p < np; p++)
        for (s = 0; s < (int)(sizeof cases / sizeof cases[0]); s++) {
            const int64_t *k = cases[s];
            conv_result r1, r2;
            enum greatest_test_res res;
            memset(&r1, 0, sizeof r1);
            memset(&r2, 0, sizeof r2);
            pdp__test_knobs.conv_bf16_path = paths[p];
            res = check_conv_gemms(k[0], k[1], k[2], k[3], k[4], k[5], 1, &r1);
            if (res == GREATEST_TEST_RES_PASS)
                res = check_conv_gemms(k[0], k[1], k[2], k[3], k[4], k[5], 2, &r2);
            pdp__test_knobs.conv_bf16_path = 0;
            if (res != GREATEST_TEST_RES_PASS) {
                conv_result_free(&r1);
                conv_result_free(&r2);
                return res;
            }
            seen_t |= r1.dw_t;
            seen_dots |= r1.dw_dots;
            seen_rows |= !r1.dw_t && !r1.dw_dots;
            res = same_bits(r1.y, r2.y, r1.ny) && same_bits(r1.dw, r2.dw, r1.nw) &&
                          same_bits(r1.db, r2.db, r1.nb) && same_bits(r1.dx, r2.dx, r1.nx)
                      ? GREATEST_TEST_RES_PASS
                      : GREATEST_TEST_RES_FAIL;
            conv_result_free(&r1);
            conv_result_free(&r2);
            if (res != GREATEST_TEST_RES_PASS)
                FAILm("Conv2d bf16: different bits at 1 and 2 threads");
        }
    ASSERTm("the cases take the transposed, rows and dots dW shares",
            seen_t && seen_rows && seen_dots);
    PASS();
}

TEST bf16_model_errors_name_the_function(void)
{
    pdp_model *m = mlp(PDP_PRECISION_FP32), *c = NULL;
    pdp_model_desc d;
    pdp_status st32;
    ASSERT(m);
    ASSERT_EQ(PDP_ERR_INVALID, pdp_model_set_precision(m, (pdp_precision)7));
    ASSERT(strstr(pdp_last_error(), "pdp_model_set_precision"));
    ASSERT_EQ(PDP_ERR_INVALID, pdp_model_set_precision(NULL, PDP_PRECISION_BF16));
    ASSERT_EQ(PDP_PRECISION_FP32, pdp_model_precision(m));
    /* bf16 on a CUDA device is accepted as fp32 is (cuBLAS GemmEx; test_cuda checks it):
       the model is created, or not, exactly as an fp32 one on that device */
    memset(&d, 0, sizeof d);
    d.input_shape[0] = 4;
    d.device = pdp_cuda(0);
    st32 = pdp_model_create(&c, &d);
    pdp_model_free(c);
    c = NULL;
    d.precision = PDP_PRECISION_BF16;
    ASSERT_EQ(st32, pdp_model_create(&c, &d));
    if (c) {
        ASSERT_EQ(PDP_PRECISION_BF16, pdp_model_precision(c));
        ASSERT_EQ(PDP_OK, pdp_model_set_precision(c, PDP_PRECISION_BF16));
    }
    pdp_model_free(c);
    pdp_model_free(m);
    PASS();
}

/* ---- against torch.autocast ----
   tests/fixtures/autocast_bf16_mlp.bin (tools/gen_fixtures.py, torch 1.13): one SGD step
   of Linear(64, 32), ReLU, Linear(32, 10) on a batch of 8 under torch.autocast("cpu",
   dtype=torch.bfloat16). Both round the same inputs to bf16 and sum exact products in
   fp32; they differ in two ways:
   - autocast's Linear RETURNS bf16 (its fp32 sums rounded once more), so torch's
     logits and every parameter gradient carry one extra bf16 rounding (at most 2^-8
     of the value, ties to even: 2^-9 relative, 2^-8 to be safe) that pdp, which keeps
     fp32 outputs, does not; (the hidden activations and dh are rounded by both: torch
     at its Linear's output, pdp at the next GEMM's input);
   - autocast casts the bias to bf16 too (pdp adds the fp32 bias): up to 2^-9 of it;
   - oneDNN's bf16 GEMM sums in another order (fp32 rounding, ~k 2^-24 relative), which
     can tip a hidden value across a bf16 rounding boundary: then that one input moves
     by one bf16 step (2^-8 of itself) in one of the k products of the next layer.
   So each tensor is compared within 2^-7 of its largest reference magnitude (one output
   rounding plus the bias's and one tipped input's); the loss (mean cross-entropy, whose gradient in the
   logits has an L1 norm below 2 per sample) within 2 * that of the logits; the updated
   weights within lr times the gradient's bound plus an fp32 rounding of the weight. */

/* The "exact.*" tensors: the same step with pdp's rounding points in float64
   (tools/gen_fixtures.py, bf16_exact): every GEMM input rounded to bf16, nothing else,
   on data with no value to round within 2^-10 ulp of a bf16 tie. pdp then differs
   only by its fp32 sums, gemm.h's (k + 2) 2^-24 sum|a b| with k <= 64, which stays
   within 2^-14 of the tensor's largest magnitude M while sum|a b| <= 15 M (no heavy
   cancellation; the loss and softmax add a few fp32 roundings). Measured: 0.0005 of
   that bound. An fp32 step (nothing rounded to bf16) fails it at the first logit, by
   4x: this comparison tells bf16 from fp32, which the autocast one cannot. */
static double max_abs(const float *x, int64_t n);
static double exact_tol(const fixture *f, const char *name)
{
    const fixture_tensor *t = fixture_find(f, name);
    return t ? ldexp(max_abs(t->data, t->count), -14) : 0.0;
}

static double max_abs(const float *x, int64_t n)
{
    double m = 0.0;
    int64_t i;
    for (i = 0; i < n; i++)
        if (fabs((double)x[i]) > m) m = fabs((double)x[i]);
    return m;
}

static enum greatest_test_res expect_within(const fixture *f, const char *name, const float *ours,
                                            int64_t n, double tol, double *worst)
{
    const fixture_tensor *t = fixture_find(f, name);
    static char msg[768];
    int64_t i;
    snprintf(msg, sizeof msg, "%s: \"%s\" missing or of another size", f->path, name);
    ASSERTm(msg, t != NULL && t->count == n);
    for (i = 0; i < n; i++) {
        double e = fabs((double)ours[i] - t->data[i]);
        if (!(e <= tol)) {
            snprintf(msg, sizeof msg, "%s[%lld]: pdp bf16 %.9g, reference %.9g, more than %.3g "
                     "apart", name, (long long)i, (double)ours[i], (double)t->data[i], tol);
            FAILm(msg);
        }
        if (worst && tol > 0 && e / tol > *worst) *worst = e / tol;
    }
    PASS();
}

TEST bf16_matches_torch_autocast_mlp_step(void)
{
    fixture f;
    const fixture_tensor *x, *lab, *lr, *y;
    pdp_model *m = NULL;
    pdp_model_desc d;
    pdp_optim *o = NULL;
    pdp_optim_desc od;
    pdp_tensor xt;
    const pdp_tensor *yt;
    int32_t labels[8];
    float loss;
    double tol_y, worst = 0.0;
    int64_t i;
    int p;
    FIXTURE_LOAD_OR_SKIP(&f, "autocast_bf16_mlp.bin");
    x = fixture_find(&f, "x");
    lab = fixture_find(&f, "labels");
    lr = fixture_find(&f, "lr");
    y = fixture_find(&f, "y");
    ASSERT(x && lab && lr && y && x->ndim == 2 && x->shape[1] == 64 && lab->count == 8);
    for (i = 0; i < 8; i++) labels[i] = (int32_t)lab->data[i];
    memset(&d, 0, sizeof d);
    d.input_shape[0] = 64;
    d.precision = PDP_PRECISION_BF16;
    ASSERT_EQ(PDP_OK, pdp_model_create(&m, &d));
    ASSERT_EQ(PDP_OK, pdp_model_add_linear(m, 32));
    ASSERT_EQ(PDP_OK, pdp_model_add_relu(m));
    ASSERT_EQ(PDP_OK, pdp_model_add_linear(m, 10));
    for (p = 0; p < pdp_model_num_params(m); p++) {
        pdp_param prm;
        const fixture_tensor *t;
        ASSERT_EQ(PDP_OK, pdp_model_param(m, p, &prm));
        t = fixture_find(&f, prm.name);
        ASSERT(t != NULL && t->count == prm.value.count);
        memcpy(prm.value.data, t->data, (size_t)t->count * sizeof(float));
    }
    pdp_tensor_wrap(x->data, pdp_cpu(), 2, x->shape, &xt);
    ASSERT_EQ(PDP_OK, pdp_model_forward(m, &xt, &yt));
    tol_y = ldexp(max_abs(y->data, y->count), -7);
    CHECK_CALL(expect_within(&f, "y", yt->data, yt->count, tol_y, NULL));
    CHECK_CALL(expect_within(&f, "exact.y", yt->data, yt->count, exact_tol(&f, "exact.y"), &worst));
    pdp_model_zero_grad(m);
    ASSERT_EQ(PDP_OK, pdp_model_forward_backward(m, &xt, labels, &loss));
    CHECK_CALL(expect_within(&f, "loss", &loss, 1, 2.0 * tol_y, NULL));
    CHECK_CALL(expect_within(&f, "exact.loss", &loss, 1, exact_tol(&f, "exact.loss"), &worst));
    memset(&od, 0, sizeof od);
    od.kind = PDP_OPTIM_SGD;
    od.lr = lr->data[0];
    ASSERT_EQ(PDP_OK, pdp_optim_create(&o, m, &od));
    for (p = 0; p < pdp_model_num_params(m); p++) {
        pdp_param prm;
        const fixture_tensor *g;
        char name[64];
        ASSERT_EQ(PDP_OK, pdp_model_param(m, p, &prm));
        snprintf(name, sizeof name, "grad.%s", prm.name);
        ASSERT((g = fixture_find(&f, name)) != NULL);
        CHECK_CALL(expect_within(&f, name, prm.grad.data, prm.grad.count,
                                 ldexp(max_abs(g->data, g->count), -7), NULL));
        snprintf(name, sizeof name, "exact.grad.%s", prm.name);
        CHECK_CALL(expect_within(&f, name, prm.grad.data, prm.grad.count, exact_tol(&f, name),
                                 &worst));
    }
    ASSERT_EQ(PDP_OK, pdp_optim_step(o));
    for (p = 0; p < pdp_model_num_params(m); p++) {
        pdp_param prm;
        const fixture_tensor *g, *w;
        char name[64], gname[64];
        ASSERT_EQ(PDP_OK, pdp_model_param(m, p, &prm));
        snprintf(name, sizeof name, "final.%s", prm.name);
        snprintf(gname, sizeof gname, "grad.%s", prm.name);
        ASSERT((g = fixture_find(&f, gname)) != NULL && (w = fixture_find(&f, name)) != NULL);
        CHECK_CALL(expect_within(&f, name, prm.value.data, prm.value.count,
                                 lr->data[0] * ldexp(max_abs(g->data, g->count), -7) +
                                     ldexp(max_abs(w->data, w->count), -23),
                                 NULL));
    }
    pdp_optim_free(o);
    pdp_model_free(m);
    fixture_free(&f);
    {
        static char msg[96];
        snprintf(msg, sizeof msg, "float64 reference: worst error %.2g of its bound", worst);
        PASSm(msg);
    }
}

/* ---- the sgemm-rounded path, the vectorised emulation, the path choice ----
   (gemm_bf16.c's path choice and PDP_BF16_PATH_SGEMM; kept apart from the AMX cases) */

/* x as its bf16 seen as an fp32 (pdp_bf16_round, checked above) */
static void round_all(const float *x, float *y, int64_t n)
{
    int64_t i;
    for (i = 0; i < n; i++) y[i] = pdp_bf16_round(x[i]);
}

/* sgemm-rounded is pdp_sgemm on the rounded operands, bit for bit (the rounding moved into
   the packing changes nothing else): odd shapes, k past one KC block (512), all layouts,
   alpha and beta, 1 and 2 threads. Skipping the rounding gives pdp_sgemm's bits on the
   unrounded floats, which differ. */
TEST bf16_sgemm_rounded_is_sgemm_on_rounded_inputs(void)
{
    static const int64_t shapes[][3] = {{1, 1, 1}, {7, 33, 5}, {19, 41, 37}, {9, 70, 1030}};
    int s, ta, tb, threads;
    if (!pdp_bf16_path_available(PDP_BF16_PATH_SGEMM))
        SKIPm("bf16 path sgemm-rounded: not in a -DPDP_CBLAS build");
    for (s = 0; s < 4; s++)
        for (ta = 0; ta < 2; ta++)
            for (tb = 0; tb < 2; tb++)
                for (threads = 1; threads <= 2; threads++) {
                    int64_t m = shapes[s][0], n = shapes[s][1], k = shapes[s][2], i;
                    int64_t lda = ta ? m : k, ldb = tb ? k : n;
                    float *a = (float *)malloc(sizeof(float) * (size_t)(m * k));
                    float *b = (float *)malloc(sizeof(float) * (size_t)(k * n));
                    float *ar = (float *)malloc(sizeof(float) * (size_t)(m * k));
                    float *br = (float *)malloc(sizeof(float) * (size_t)(k * n));
                    float *c1 = (float *)malloc(sizeof(float) * (size_t)(m * n));
                    float *c2 = (float *)malloc(sizeof(float) * (size_t)(m * n));
                    float alpha = s == 2 ? 0.75f : 1.0f, beta = s == 2 ? -1.5f : 0.0f;
                    int same;
                    for (i = 0; i < m * k; i++) a[i] = rnd();
                    for (i = 0; i < k * n; i++) b[i] = rnd();
                    for (i = 0; i < m * n; i++) c1[i] = c2[i] = rnd();
                    round_all(a, ar, m * k);
                    round_all(b, br, k * n);
                    pdp_set_num_threads(threads);
                    ASSERT_EQ(PDP_OK, pdp_gemm_bf16_on(PDP_BF16_PATH_SGEMM, (pdp_trans)ta,
                                                       (pdp_trans)tb, m, n, k, alpha, a, lda, b,
                                                       ldb, beta, c1, n));
                    pdp_sgemm((pdp_trans)ta, (pdp_trans)tb, m, n, k, alpha, ar, lda, br, ldb,
                              beta, c2, n);
                    pdp_set_num_threads(1);
                    same = memcmp(c1, c2, sizeof(float) * (size_t)(m * n)) == 0;
                    free(a), free(b), free(ar), free(br), free(c1), free(c2);
                    ASSERTm(layout_name((pdp_trans)ta, (pdp_trans)tb), same);
                }
    PASS();
}

/* gemm.h's bound of sgemm-rounded against the exact chain (the emulated path):
   |sgemm - chain| <= |alpha| (2 gamma_k S + 2 k 2^-126) + 2^-23 (|alpha| S + |beta c|),
   S = sum |a_bf b_bf| (double), gamma_k = k u / (1 - k u), u = 2^-24, on inputs with no
   subnormal bf16; values spread over 2^-64 .. 2^8 so that some products and sums fall
   below 2^-126. pdp_sgemm on the unrounded inputs must break the bound somewhere (the
   test can fail). */
TEST bf16_sgemm_rounded_within_its_bound_of_the_chain(void)
{
    static const int64_t shapes[][3] = {{5, 9, 3}, {19, 41, 37}, {8, 33, 600}};
    int s, ta, tb, unrounded_out = 0;
    double worst = 0.0;
    if (!pdp_bf16_path_available(PDP_BF16_PATH_SGEMM))
        SKIPm("bf16 path sgemm-rounded: not in a -DPDP_CBLAS build");
    for (s = 0; s < 3; s++)
        for (ta = 0; ta < 2; ta++)
            for (tb = 0; tb < 2; tb++) {
                int64_t m = shapes[s][0], n = shapes[s][1], k = shapes[s][2], i, j, p;
                int64_t lda = ta ? m : k, ldb = tb ? k : n;
                float *a = (float *)malloc(sizeof(float) * (size_t)(m * k));
                float *b = (float *)malloc(sizeof(float) * (size_t)(k * n));
                float *c0 = (float *)malloc(sizeof(float) * (size_t)(m * n));
                float *cs = (float *)malloc(sizeof(float) * (size_t)(m * n));
                float *ce = (float *)malloc(sizeof(float) * (size_t)(m * n));
                float *cu = (float *)malloc(sizeof(float) * (size_t)(m * n));
                float alpha = s == 1 ? -2.0f : 1.0f, beta = s == 1 ? 0.5f : 0.0f;
                double u = ldexp(1.0, -24), gk = (double)k * u / (1.0 - (double)k * u);
                int bad = 0;
                for (i = 0; i < m * k; i++) a[i] = ldexpf(rnd(), -(int)(rnd_u32() % 64));
                for (i = 0; i < k * n; i++) b[i] = ldexpf(rnd(), (int)(rnd_u32() % 72) - 64);
                for (i = 0; i < m * k; i++)
                    if (fabsf(pdp_bf16_round(a[i])) < 1.17549435e-38f) a[i] = 0.0f;
                for (i = 0; i < k * n; i++)
                    if (fabsf(pdp_bf16_round(b[i])) < 1.17549435e-38f) b[i] = 0.0f;
                for (i = 0; i < m * n; i++) c0[i] = rnd();
                memcpy(cs, c0, sizeof(float) * (size_t)(m * n));
                memcpy(ce, c0, sizeof(float) * (size_t)(m * n));
                memcpy(cu, c0, sizeof(float) * (size_t)(m * n));
                ASSERT_EQ(PDP_OK, pdp_gemm_bf16_on(PDP_BF16_PATH_SGEMM, (pdp_trans)ta,
                                                   (pdp_trans)tb, m, n, k, alpha, a, lda, b, ldb,
                                                   beta, cs, n));
                ASSERT_EQ(PDP_OK, pdp_gemm_bf16_on(PDP_BF16_PATH_EMULATED, (pdp_trans)ta,
                                                   (pdp_trans)tb, m, n, k, alpha, a, lda, b, ldb,
                                                   beta, ce, n));
                pdp_sgemm((pdp_trans)ta, (pdp_trans)tb, m, n, k, alpha, a, lda, b, ldb, beta,
                          cu, n);
                for (i = 0; i < m; i++)
                    for (j = 0; j < n; j++) {
                        double sum = 0.0, bound, d;
                        for (p = 0; p < k; p++)
                            sum += fabs((double)pdp_bf16_round(ta ? a[p * lda + i] : a[i * lda + p]) *
                                        (double)pdp_bf16_round(tb ? b[j * ldb + p] : b[p * ldb + j]));
                        bound = fabs(alpha) * (2.0 * gk * sum + 2.0 * (double)k * ldexp(1.0, -126)) +
                                ldexp(1.0, -23) * (fabs(alpha) * sum + fabs(beta * c0[i * n + j]));
                        d = fabs((double)cs[i * n + j] - (double)ce[i * n + j]);
                        if (d > bound) bad = 1;
                        if (bound > 0.0 && d / bound > worst) worst = d / bound;
                        if (fabs((double)cu[i * n + j] - (double)ce[i * n + j]) > bound)
                            unrounded_out = 1;
                    }
                free(a), free(b), free(c0), free(cs), free(ce), free(cu);
                ASSERT_EQm(layout_name((pdp_trans)ta, (pdp_trans)tb), 0, bad);
            }
    ASSERTm("pdp_sgemm on unrounded inputs stays within the bound: the test cannot fail",
            unrounded_out);
    {
        static char msg[80];
        snprintf(msg, sizeof msg, "worst |sgemm-rounded - chain| %.2g of its bound", worst);
        PASSm(msg);
    }
}

/* The emulated path's vectorised kernels (AVX-512F, AVX2: FMAs under DAZ and FTZ)
   against the real vdpbf16ps (the avx512 path), bit for bit, on subnormal-heavy inputs:
   products and sums around 2^-126, subnormal bf16 inputs, large values, zeros; odd
   shapes, all layouts, alpha and beta. The caller's MXCSR (here rounding toward zero) is
   restored, and does not reach the kernels' sums (alpha acc + beta c follow it on every
   path). The portable kernel may differ here (it rounds a product below 2^-126 first):
   counted, not asserted. */
static float subnormal_heavy(void)
{
    uint32_t r = rnd_u32() % 100;
    int e = r < 40   ? -75 + (int)(rnd_u32() % 30) /* products near 2^-126 */
            : r < 55 ? -135 + (int)(rnd_u32() % 12) /* subnormal */
            : r < 65 ? 30 + (int)(rnd_u32() % 30)
            : r < 95 ? -70 + (int)(rnd_u32() % 20)
                     : 0;
    return r >= 95 ? 0.0f : ldexpf(rnd(), e);
}

/* the emulation's kernels this CPU runs: 512 (AVX-512F), 256 (AVX2), 0 (portable) */
static int emul_kernels(int simd[3])
{
    int n = 0;
    pdp_bf16_path_available(PDP_BF16_PATH_AUTO); /* CPUID read */
    if (pdp__bf16_this.emul512) simd[n++] = 512;
    if (pdp__bf16_this.emul256) simd[n++] = 256;
    simd[n++] = 0;
    return n;
}

TEST bf16_emulation_vectorised_gives_vdpbf16ps_bits(void)
{
    int trial, ta, tb, diff_portable = 0, portable_runs = 0, fused = 0, simd[3];
    int nk = emul_kernels(simd), v;
#if PDP__BF16_X86
    unsigned csr;
#endif
    if (!pdp_bf16_path_available(PDP_BF16_PATH_AVX512))
        SKIPm("bf16 path avx512-bf16: not available on this CPU or build (the reference)");
    if (nk < 2) SKIPm("no vectorised emulation kernel in this build (AVX2 or AVX-512F)");
    for (trial = 0; trial < 60; trial++)
        for (ta = 0; ta < 2; ta++)
            for (tb = 0; tb < 2; tb++) {
                int64_t m = 1 + rnd_u32() % 20, n = 1 + rnd_u32() % 45, k = 1 + rnd_u32() % 75, i;
                int64_t lda = ta ? m : k, ldb = tb ? k : n;
                float *a = (float *)malloc(sizeof(float) * (size_t)(m * k));
                float *b = (float *)malloc(sizeof(float) * (size_t)(k * n));
                float *c0 = (float *)malloc(sizeof(float) * (size_t)(m * n));
                float *cv = (float *)malloc(sizeof(float) * (size_t)(m * n));
                float *cb = (float *)malloc(sizeof(float) * (size_t)(m * n));
                float alpha = trial % 3 == 0 ? 0.5f : 1.0f, beta = trial % 3 == 0 ? 3.0f : 0.0f;
                int bad = -1;
                for (i = 0; i < m * k; i++) a[i] = subnormal_heavy();
                for (i = 0; i < k * n; i++) b[i] = subnormal_heavy();
                for (i = 0; i < m * n; i++) c0[i] = cb[i] = rnd();
#if PDP__BF16_X86
                csr = _mm_getcsr();
                _mm_setcsr((csr & ~0x6000u) | 0x6000u); /* round toward zero */
#endif
                ASSERT_EQ(PDP_OK, pdp_gemm_bf16_on(PDP_BF16_PATH_AVX512, (pdp_trans)ta,
                                                   (pdp_trans)tb, m, n, k, alpha, a, lda, b, ldb,
                                                   beta, cb, n));
                for (v = 0; v < nk; v++) {
                    memcpy(cv, c0, sizeof(float) * (size_t)(m * n));
                    pdp__gemm_bf16_emul(simd[v], (pdp_trans)ta, (pdp_trans)tb, m, n, k, alpha, a,
                                        lda, b, ldb, beta, cv, n);
#if PDP__BF16_X86
                    if (_mm_getcsr() != ((csr & ~0x6000u) | 0x6000u) && bad < 0)
                        bad = 1000 + simd[v];
#endif
                    if (simd[v] != 0 && memcmp(cv, cb, sizeof(float) * (size_t)(m * n)) && bad < 0)
                        bad = simd[v];
                }
#if PDP__BF16_X86
                _mm_setcsr(csr);
#endif
                if (alpha == 1.0f && beta == 0.0f) { /* cb as under round to nearest; the
                                                        portable kernel's sums follow MXCSR */
                    pdp__gemm_bf16_emul(0, (pdp_trans)ta, (pdp_trans)tb, m, n, k, alpha, a, lda,
                                        b, ldb, beta, cv, n);
                    diff_portable += memcmp(cv, cb, sizeof(float) * (size_t)(m * n)) != 0;
                    portable_runs++;
                }
                for (i = 0; i < m * n; i++) fused |= cb[i] != 0.0f && fabsf(cb[i]) < 1e-30f;
                free(a), free(b), free(c0), free(cv), free(cb);
                if (bad >= 0) {
                    static char msg[96];
                    snprintf(msg, sizeof msg, "%s: the emulation's %d-bit kernel %s",
                             layout_name((pdp_trans)ta, (pdp_trans)tb), bad % 1000,
                             bad >= 1000 ? "left MXCSR changed" : "differs from vdpbf16ps");
                    FAILm(msg);
                }
            }
    ASSERTm("no result near 2^-126: the inputs do not reach the corner", fused);
    {
        static char msg[96];
        snprintf(msg, sizeof msg, "portable kernel differs from vdpbf16ps in %d of %d products",
                 diff_portable, portable_runs);
        PASSm(msg);
    }
}

/* The same on ordinary values: every emulation kernel this CPU runs, and pdp_gemm_bf16_on's
   emulated path, give the same bits (and the avx512 path's, where it exists), at 1 and 3
   threads, on shapes past one MC block. */
TEST bf16_emulation_vectorised_matches_portable(void)
{
    static const int64_t shapes[][3] = {{3, 5, 7}, {17, 65, 33}, {300, 40, 130}};
    int s, ta, tb, simd[3], nk = emul_kernels(simd), v;
    for (s = 0; s < 3; s++)
        for (ta = 0; ta < 2; ta++)
            for (tb = 0; tb < 2; tb++) {
                int64_t m = shapes[s][0], n = shapes[s][1], k = shapes[s][2], i;
                int64_t lda = ta ? m : k, ldb = tb ? k : n;
                float *a = (float *)malloc(sizeof(float) * (size_t)(m * k));
                float *b = (float *)malloc(sizeof(float) * (size_t)(k * n));
                float *c0 = (float *)malloc(sizeof(float) * (size_t)(m * n));
                float *cv = (float *)malloc(sizeof(float) * (size_t)(m * n));
                float *cp = (float *)malloc(sizeof(float) * (size_t)(m * n));
                int bad = -1;
                for (i = 0; i < m * k; i++) a[i] = rnd();
                for (i = 0; i < k * n; i++) b[i] = rnd();
                for (i = 0; i < m * n; i++) c0[i] = cp[i] = rnd();
                pdp__gemm_bf16_emul(0, (pdp_trans)ta, (pdp_trans)tb, m, n, k, 1.0f, a, lda, b,
                                    ldb, 1.0f, cp, n);
                pdp_set_num_threads(s == 2 ? 3 : 1);
                for (v = -2; v < nk; v++) {
                    memcpy(cv, c0, sizeof(float) * (size_t)(m * n));
                    if (v == -2 || (v == -1 && pdp_bf16_path_available(PDP_BF16_PATH_AVX512)))
                        ASSERT_EQ(PDP_OK, pdp_gemm_bf16_on(v == -2 ? PDP_BF16_PATH_EMULATED
                                                                   : PDP_BF16_PATH_AVX512,
                                                           (pdp_trans)ta, (pdp_trans)tb, m, n, k,
                                                           1.0f, a, lda, b, ldb, 1.0f, cv, n));
                    else if (v == -1)
                        continue;
                    else
                        pdp__gemm_bf16_emul(simd[v], (pdp_trans)ta, (pdp_trans)tb, m, n, k, 1.0f,
                                            a, lda, b, ldb, 1.0f, cv, n);
                    if (memcmp(cv, cp, sizeof(float) * (size_t)(m * n)) && bad == -1)
                        bad = v < 0 ? v : simd[v];
                }
                pdp_set_num_threads(1);
                free(a), free(b), free(c0), free(cv), free(cp);
                if (bad != -1) {
                    static char msg[96];
                    snprintf(msg, sizeof msg, "%s: %s differs from the portable kernel",
                             layout_name((pdp_trans)ta, (pdp_trans)tb),
                             bad == -2   ? "the emulated path"
                             : bad == -1 ? "the avx512 path"
                             : bad == 512 ? "the AVX-512F kernel" : "the AVX2 kernel");
                    FAILm(msg);
                }
            }
    PASS();
}

/* The path choice is a function of (cpu, shape) alone: injected CPU ids (pdp__bf16_choose)
   give the table's cells or the default; every row's paths exist on the CPUs it names;
   the classes split where gemm_bf16.c says. */
TEST bf16_path_choice_is_a_function_of_cpu_and_shape(void)
{
    /* vendor, family, model, avx512, amx, emul512, emul256 */
    pdp__bf16_cpu zen4 = {PDP__BF16_AMD, 0x19, 0x61, 1, 0, 1, 1};
    pdp__bf16_cpu zen3 = {PDP__BF16_AMD, 0x19, 0x21, 0, 0, 0, 1};
    pdp__bf16_cpu zen5 = {PDP__BF16_AMD, 0x1a, 0x44, 1, 0, 1, 1};
    pdp__bf16_cpu spr = {PDP__BF16_INTEL, 6, 0x8f, 1, 1, 1, 1};
    pdp__bf16_cpu spr_no_amx = {PDP__BF16_INTEL, 6, 0x8f, 1, 0, 1, 1}; /* Linux refused it */
    pdp__bf16_cpu gnr = {PDP__BF16_INTEL, 6, 0xad, 1, 1, 1, 1};       /* no row: the default */
    pdp__bf16_cpu cpl = {PDP__BF16_INTEL, 6, 0x55, 1, 0, 1, 1};       /* Cooper Lake: no row */
    pdp__bf16_cpu arm = {0, 0, 0, 0, 0, 0, 0};
    static const int64_t shapes[][3] = {{512, 512, 784}, {512, 10, 512}, {10, 512, 512},
                                        {512, 512, 10}, {31, 31, 31}, {32, 32, 32}};
    int ta, tb, s;
    size_t r;
    pdp_bf16_path sg = PDP__BF16_HAS_SGEMM ? PDP_BF16_PATH_SGEMM : PDP_BF16_PATH_EMULATED;
    ASSERT_EQ(PDP__BF16_LARGE, pdp__bf16_class(PDP_NO_TRANS, PDP_NO_TRANS, 32, 32, 32));
    ASSERT_EQ(PDP__BF16_SMALL_MN, pdp__bf16_class(PDP_NO_TRANS, PDP_NO_TRANS, 31, 512, 32));
    ASSERT_EQ(PDP__BF16_SMALL_MN, pdp__bf16_class(PDP_NO_TRANS, PDP_NO_TRANS, 512, 10, 512));
    ASSERT_EQ(PDP__BF16_SMALL_K, pdp__bf16_class(PDP_NO_TRANS, PDP_NO_TRANS, 512, 512, 10));
    ASSERT_EQ(3 * PDP__BF16_SIZES + PDP__BF16_SMALL_K,
              pdp__bf16_class(PDP_TRANS, PDP_TRANS, 5, 5, 5));
    for (ta = 0; ta < 2; ta++)
        for (tb = 0; tb < 2; tb++)
            for (s = 0; s < 6; s++) {
                pdp_trans a = (pdp_trans)ta, b = (pdp_trans)tb;
                int64_t m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
                pdp_bf16_path p = pdp__bf16_choose(&spr, a, b, m, n, k), cell;
                ASSERT_EQ(PDP_BF16_PATH_AVX512, pdp__bf16_choose(&zen4, a, b, m, n, k));
                ASSERT_EQ(sg, pdp__bf16_choose(&zen3, a, b, m, n, k));
                ASSERT_EQ(PDP_BF16_PATH_AVX512, pdp__bf16_choose(&zen5, a, b, m, n, k));
                ASSERT_EQ(PDP_BF16_PATH_AMX, pdp__bf16_choose(&gnr, a, b, m, n, k));
                ASSERT_EQ(sg, pdp__bf16_choose(&cpl, a, b, m, n, k));
                ASSERT_EQ(sg, pdp__bf16_choose(&arm, a, b, m, n, k));
                ASSERT_EQ(p, pdp__bf16_choose(&spr, a, b, m, n, k)); /* the same twice */
                cell = pdp__bf16_cell(pdp__bf16_row_of(&spr)->cells,
                                      pdp__bf16_class(a, b, m, n, k));
                /* a -DPDP_CBLAS build lacks sgemm-rounded: the default, AMX */
                ASSERT_EQ(cell == PDP_BF16_PATH_SGEMM && !PDP__BF16_HAS_SGEMM ? PDP_BF16_PATH_AMX
                                                                              : cell,
                          p);
                ASSERT(pdp__bf16_choose(&spr_no_amx, a, b, m, n, k) != PDP_BF16_PATH_AMX);
            }
    /* every cell of every row: a path the row's CPUs have, and 12 of them */
    for (r = 0; r < pdp__bf16_rows; r++) {
        const pdp__bf16_row *row = &pdp__bf16_table[r];
        pdp__bf16_cpu named = {row->vendor, row->family, row->model_lo, row->avx512, row->amx,
                               row->avx512, 1};
        int c;
        ASSERT_EQ(row, pdp__bf16_row_of(&named));
        for (c = 0; c < PDP__BF16_CLASSES; c++) {
            pdp_bf16_path p = pdp__bf16_cell(row->cells, c);
            ASSERT(p != PDP_BF16_PATH_AUTO);
            ASSERT(p == PDP_BF16_PATH_SGEMM || pdp__bf16_cpu_has(&named, p));
        }
        ASSERT_EQ(PDP_BF16_PATH_AUTO, pdp__bf16_cell(row->cells, PDP__BF16_CLASSES));
    }
    PASS();
}

/* AUTO runs the chosen path: pdp_gemm_bf16's bits are pdp_gemm_bf16_on(pdp_bf16_path_for)'s
   in every class and layout, and pdp_bf16_best_path is the large class's choice. */
TEST bf16_gemm_auto_runs_the_chosen_path(void)
{
    static const int64_t shapes[][3] = {{70, 66, 100}, {70, 10, 64}, {9, 70, 64}, {64, 70, 10}};
    int s, ta, tb;
    ASSERT_EQ(pdp_bf16_path_for(PDP_NO_TRANS, PDP_TRANS, 512, 512, 512), pdp_bf16_best_path());
    for (s = 0; s < 4; s++)
        for (ta = 0; ta < 2; ta++)
            for (tb = 0; tb < 2; tb++) {
                int64_t m = shapes[s][0], n = shapes[s][1], k = shapes[s][2], i;
                int64_t lda = ta ? m : k, ldb = tb ? k : n;
                pdp_bf16_path p = pdp_bf16_path_for((pdp_trans)ta, (pdp_trans)tb, m, n, k);
                float *a = (float *)malloc(sizeof(float) * (size_t)(m * k));
                float *b = (float *)malloc(sizeof(float) * (size_t)(k * n));
                float *c1 = (float *)malloc(sizeof(float) * (size_t)(m * n));
                float *c2 = (float *)malloc(sizeof(float) * (size_t)(m * n));
                int same;
                for (i = 0; i < m * k; i++) a[i] = rnd();
                for (i = 0; i < k * n; i++) b[i] = rnd();
                ASSERT(pdp_bf16_path_available(p));
                pdp_gemm_bf16((pdp_trans)ta, (pdp_trans)tb, m, n, k, 1.0f, a, lda, b, ldb, 0.0f,
                              c1, n);
                ASSERT_EQ(PDP_OK, pdp_gemm_bf16_on(p, (pdp_trans)ta, (pdp_trans)tb, m, n, k, 1.0f,
                                                   a, lda, b, ldb, 0.0f, c2, n));
                same = memcmp(c1, c2, sizeof(float) * (size_t)(m * n)) == 0;
                free(a), free(b), free(c1), free(c2);
                ASSERTm(pdp_bf16_path_name(p), same);
            }
    PASS();
}

SUITE(bf16_paths)
{
    RUN_TEST(bf16_sgemm_rounded_is_sgemm_on_rounded_inputs);
    RUN_TEST(bf16_sgemm_rounded_within_its_bound_of_the_chain);
    RUN_TEST(bf16_emulation_vectorised_gives_vdpbf16ps_bits);
    RUN_TEST(bf16_emulation_vectorised_matches_portable);
    RUN_TEST(bf16_path_choice_is_a_function_of_cpu_and_shape);
    RUN_TEST(bf16_gemm_auto_runs_the_chosen_path);
}

SUITE(bf16)
{
    RUN_TEST(bf16_round_matches_reference);
    RUN_TEST(bf16_gemm_emulated_matches_model);
    RUN_TEST(bf16_gemm_avx512_matches_model);
    RUN_TEST(bf16_gemm_avx512_rounds_subnormals_as_the_emulation);
    RUN_TEST(bf16_gemm_amx_matches_model);
    RUN_TEST(bf16_amx_emulated_tiles_match_sdm_loop);
    RUN_TEST(bf16_amx_emulated_gathered_match_materialised);
    RUN_TEST(bf16_bias_in_epilogue_matches_two_passes);
    RUN_TEST(bf16_amx_hardware_matches_emulated_tiles);
    RUN_TEST(bf16_amx_streamed_operand_matches_sdm_loop);
    RUN_TEST(bf16_amx_hardware_pair_rounding_recorded);
    RUN_TEST(bf16_gemm_auto_takes_the_best_path_and_names_missing_ones);
    RUN_TEST(bf16_model_linear_uses_bf16_gemms_and_switches_back);
    RUN_TEST(bf16_model_conv2d_implicit_matches_reference);
    RUN_TEST(bf16_model_conv2d_im2col_matches_reference);
    RUN_TEST(bf16_gemm_gathered_rows_match_materialised);
    RUN_TEST(bf16_model_conv2d_implicit_gemms_match_reference);
    RUN_TEST(bf16_model_errors_name_the_function);
    RUN_TEST(bf16_matches_torch_autocast_mlp_step);
}

GREATEST_MAIN_DEFS();

int main(int argc, char **argv)
{
    GREATEST_MAIN_BEGIN();
    RUN_SUITE(bf16);
    RUN_SUITE(bf16_paths);
    GREATEST_MAIN_END();
}
