/* layers: every layer kind's code, kind by kind: setup (shape inference and
   validation), parameter initialisation, forward and backward on the CPU, and the
   CUDA entries that hand a CUDA device's work to pdp_cuda.cu. layers_table.c lists
   them in one table of kinds; model.c drives them in order.

   Conventions (PyTorch's, so that state_dicts and results carry over):
   - Linear: y = x W^T + b, W [out, in], on 1-D samples.
   - Conv2d and MaxPool2d: in layers_conv.c.
   - LayerNorm: over all features of a sample, biased variance, y = (x - mean) *
     rstd * w + b with w, b of the sample's shape; mean and rstd are saved.
   - GELU is the tanh form (GELUErf the exact one, with erf); SiLU is x sigmoid(x); the
     element formulas live in math.h (shared with CUDA).
   - Dropout: the mask is a pure function of (seed, layer, step, global sample
     index, element) (math.h), so a batch split across DP replicas, each with its
     sample_base, draws exactly the masks one device draws (and a slice of a sample,
     sequence parallelism's, keys its elements from mask_first). Training: keep with
     probability 1 - p and scale by 1 / (1 - p); the scaled mask is saved for
     backward. Evaluation: identity.
   - Flatten is a view: model.c aliases its output to its input and never calls
     forward or backward for it (they copy, should anything else). So is a ReLU
     right after a Conv2d (layers_conv.c) or a Linear (below) on the CPU.

   Invariants: forward and backward allocate nothing (temporaries live in io->work,
   sized by work_per_sample) and return a status: PDP_OK, or an error whose message
   says what is wrong with the input (model.c names the layer: "pdp_model_forward:
   layer 3 (Linear): ..."); backward accumulates into dw and db (+=) and writes
   dx (=), and skips dx when it is NULL (the first layer). Every reduction runs
   in a fixed order that does not depend on the thread count, so results are
   bit-reproducible. A setup starts from the output shape = the input shape and no
   saved floats, workspace or parameters (layers_table.c's pdp__layer_setup), and
   its messages name what is wrong and the input shape `in`; pdp__model_add adds
   the function and the layer. A CUDA entry returns pdp_cuda.cu's status as it is
   (layers_table.c turns a failure into "pdp_cuda: <its message>"). */

#include "internal.h"

/* ---- layers: small helpers ---- */

/* "(1, 28, 28)" or "(784)": a sample's shape, for messages. */
PDP__PRIVATE const char *pdp__layers_dims_str(int ndim, const int64_t *shape, char *buf,
                                              size_t bytes)
{
    if (ndim == 3)
        snprintf(buf, bytes, "(%lld, %lld, %lld)", (long long)shape[0], (long long)shape[1],
                 (long long)shape[2]);
    else if (ndim == 2)
        snprintf(buf, bytes, "(%lld, %lld)", (long long)shape[0], (long long)shape[1]);
    else
        snprintf(buf, bytes, "(%lld)", (long long)shape[0]);
    return buf;
}

/* Sum of n floats: 16 float lanes (which the compiler vectorises), combined in
   double. Fixed order, so the same bits on every run. */
PDP__PRIVATE double pdp__layers_sum(const float *PDP__RESTRICT x, int64_t n)
{
    float lane[16] = {0};
    double s = 0.0;
    int64_t i = 0;
    int k;
    for (; i + 16 <= n; i += 16)
        for (k = 0; k < 16; k++) lane[k] += x[i + k];
    for (; i < n; i++) s += x[i];
    for (k = 0; k < 16; k++) s += lane[k];
    return s;
}

/* Sum of (x[i] - c)^2, same scheme. */
PDP__PRIVATE double pdp__layers_sumsq_dev(const float *PDP__RESTRICT x, float c, int64_t n)
{
    float lane[16] = {0};
    double s = 0.0;
    int64_t i = 0;
    int k;
    for (; i + 16 <= n; i += 16)
        for (k = 0; k < 16; k++) {
            float d = x[i + k] - c;
            lane[k] += d * d;
        }
    for (; i < n; i++) s += (double)(x[i] - c) * (double)(x[i] - c);
    for (k = 0; k < 16; k++) s += lane[k];
    return s;
}

/* Sum of a[i] * b[i], same scheme. */
PDP__PRIVATE double pdp__layers_dot(const float *PDP__RESTRICT a, const float *PDP__RESTRICT b,
                                    int64_t n)
{
    float lane[16] = {0};
    double s = 0.0;
    int64_t i = 0;
    int k;
    for (; i + 16 <= n; i += 16)
        for (k = 0; k < 16; k++) lane[k] += a[i + k] * b[i + k];
    for (; i < n; i++) s += (double)a[i] * b[i];
    for (k = 0; k < 16; k++) s += lane[k];
    return s;
}

/* Sum of a[i] * b[i] * (c[i] - m), same scheme. */
PDP__PRIVATE double pdp__layers_dot3(const float *PDP__RESTRICT a, const float *PDP__RESTRICT b,
                                     const float *PDP__RESTRICT c, float m, int64_t n)
{
    float lane[16] = {0};
    double s = 0.0;
    int64_t i = 0;
    int k;
    for (; i + 16 <= n; i += 16)
        for (k = 0; k < 16; k++) lane[k] += a[i + k] * b[i + k] * (c[i + k] - m);
    for (; i < n; i++) s += (double)a[i] * b[i] * (c[i] - m);
    for (k = 0; k < 16; k++) s += lane[k];
    return s;
}

/* Element passes over n floats. Each takes its arrays as restrict parameters and
   loads every operand before the select: gcc -O2's vectoriser passes over the same
   loop on restrict locals (io->x + lo) and over a conditional load (-fopt-info-vec,
   gcc 12). Element by element, so the bits are the scalar loop's. */
PDP__PRIVATE void pdp__layers_add(float *PDP__RESTRICT acc, const float *PDP__RESTRICT x, int64_t n)
{
    PDP__FOR_BLOCKED(i, n, acc[i] += x[i];);
}

/* out = a + b in one pass (the residual stream's add: the bits of out = a; out += b). */
PDP__PRIVATE void pdp__layers_add2(const float *PDP__RESTRICT a, const float *PDP__RESTRICT b,
                                   float *PDP__RESTRICT out, int64_t n)
{
    PDP__FOR_BLOCKED(i, n, out[i] = a[i] + b[i];);
}

PDP__PRIVATE void pdp__layers_relu(const float *PDP__RESTRICT x, float *PDP__RESTRICT y, int64_t n)
{
    PDP__FOR_BLOCKED(i, n, y[i] = pdp__relu(x[i]););
}

/* dx = dy where y > 0 (pdp__relu_grad), and its mirror for tanh, sigmoid (from y)
   and dropout (dy times the saved scaled mask). */
PDP__PRIVATE void pdp__layers_relu_grad(const float *PDP__RESTRICT dy, const float *PDP__RESTRICT y,
                                        float *PDP__RESTRICT dx, int64_t n)
{
    PDP__FOR_BLOCKED(i, n, {
        float g = dy[i], v = y[i];
        dx[i] = pdp__relu_grad(g, v);
    });
}

PDP__PRIVATE void pdp__layers_tanh_grad(const float *PDP__RESTRICT dy, const float *PDP__RESTRICT y,
                                        float *PDP__RESTRICT dx, int64_t n)
{
    PDP__FOR_BLOCKED(i, n, dx[i] = pdp__tanh_grad(dy[i], y[i]););
}

PDP__PRIVATE void pdp__layers_sigmoid_grad(const float *PDP__RESTRICT dy,
                                           const float *PDP__RESTRICT y, float *PDP__RESTRICT dx,
                                           int64_t n)
{
    PDP__FOR_BLOCKED(i, n, dx[i] = pdp__sigmoid_grad(dy[i], y[i]););
}

PDP__PRIVATE void pdp__layers_mul(const float *PDP__RESTRICT a, const float *PDP__RESTRICT b,
                                  float *PDP__RESTRICT out, int64_t n)
{
    PDP__FOR_BLOCKED(i, n, out[i] = a[i] * b[i];);
}

/* ---- layers: GELU, vectorised ----
   math.h's pdp__gelu and pdp__gelu_grad (x / (1 + e), e = exp(-2u)) on 16 (AVX-512F)
   or 8 (AVX2 + FMA) lanes: the same operations in the same order, with an exp of
   their own (Cephes's expf: n = round(z log2 e), r = z - n ln 2 in two FMAs, e^r by
   its degree-7 polynomial, 2^n into the exponent bits; z clamped to [-87, 88]: the
   formula uses z = -2u in [-88, 88], and below -87 e only enters 1 + e and 2 x du e s
   beside 1, which e^-87 leaves unchanged in fp32). Both widths run the same instruction
   sequence lane by lane, so they give the same bits (tests/test_gpt_kernels.c holds
   them to that, and both, with the scalar helpers, to a double-precision reference).
   The tail of a range runs through the same vector code (masked loads and stores, or a
   zero-padded copy), so an element's bits do not depend on where a split falls. The
   width is chosen at run time from gemm_bf16.c's CPUID check (compiled under target
   attributes, so a plain x86-64 build has both); without them, math.h's helpers. */
#if PDP__BF16_X86
#  define PDP__GELU_512 PDP__TARGET("avx512f")
#  define PDP__GELU_256 PDP__TARGET("avx2,fma")
#  define PDP__GELU_EXP_CONSTANTS                                                            \
    const float lo = -87.0f, hi = 88.0f, log2e = 1.44269504088896341f;                     \
    const float ln2_hi = 0.693359375f, ln2_lo = -2.12194440e-4f;                            \
    const float p0 = 1.9875691500e-4f, p1 = 1.3981999507e-3f, p2 = 8.3334519073e-3f,       \
                p3 = 4.1665795894e-2f, p4 = 1.6666665459e-1f, p5 = 5.0000001201e-1f

/* e^z, z in [-87, 88] after the clamp; lane by lane. */
/* The zero-masking forms, every lane kept, of min, max, roundscale, cvtps and slli: GCC's
   headers give the plain forms an _mm512_undefined_*() merge source that g++ reports as
   -Wmaybe-uninitialized (as gemm_bf16.c's PDP__BF16_UNPACKLO32 says); the same
   instructions. */
#  define PDP__ALL16 ((__mmask16)0xffff)
PDP__GELU_512 static inline __m512 pdp__exp16(__m512 z)
{
    PDP__GELU_EXP_CONSTANTS;
    __m512 n, r, r2, p;
    __m512i bits;
    z = _mm512_maskz_min_ps(PDP__ALL16, _mm512_maskz_max_ps(PDP__ALL16, z, _mm512_set1_ps(lo)),
                            _mm512_set1_ps(hi));
    n = _mm512_maskz_roundscale_ps(PDP__ALL16, _mm512_mul_ps(z, _mm512_set1_ps(log2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(ln2_hi), z);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(ln2_lo), r);
    r2 = _mm512_mul_ps(r, r);
    p = _mm512_fmadd_ps(_mm512_set1_ps(p0), r, _mm512_set1_ps(p1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(p2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(p3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(p4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(p5));
    p = _mm512_fmadd_ps(p, r2, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    bits = _mm512_maskz_slli_epi32(
        PDP__ALL16,
        _mm512_add_epi32(_mm512_maskz_cvtps_epi32(PDP__ALL16, n), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(bits));
}

/* GELU of 16 lanes (dy NULL: y = gelu(x)) or its gradient (out = dy gelu'(x)). */
PDP__GELU_512 static inline __m512 pdp__gelu16(__m512 x, const __m512 *dy)
{
    const __m512 one = _mm512_set1_ps(1.0f), zero = _mm512_setzero_ps();
    __m512 x2 = _mm512_mul_ps(x, x), u, e, s, du, g;
    __mmask16 big, small;
    u = _mm512_mul_ps(_mm512_set1_ps(PDP__GELU_C),
                      _mm512_add_ps(x, _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(PDP__GELU_A),
                                                                   x2), x)));
    big = _mm512_cmp_ps_mask(u, _mm512_set1_ps(PDP__GELU_UMAX), _CMP_GT_OQ);
    small = _mm512_cmp_ps_mask(u, _mm512_set1_ps(-PDP__GELU_UMAX), _CMP_LT_OQ);
    e = pdp__exp16(_mm512_mul_ps(_mm512_set1_ps(-2.0f), u));
    if (!dy) /* x / (1 + e); x 0 where e overflows */
        return _mm512_mask_mul_ps(_mm512_div_ps(x, _mm512_add_ps(one, e)), small, x, zero);
    s = _mm512_div_ps(one, _mm512_add_ps(one, e));
    du = _mm512_mul_ps(_mm512_set1_ps(PDP__GELU_C),
                       _mm512_add_ps(one, _mm512_mul_ps(_mm512_set1_ps(3.0f * PDP__GELU_A), x2)));
    g = _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(2.0f), x), du),
                      _mm512_mul_ps(e, s));
    g = _mm512_mul_ps(*dy, _mm512_mul_ps(s, _mm512_add_ps(one, g)));
    g = _mm512_mask_mov_ps(g, big, *dy);
    return _mm512_mask_mul_ps(g, small, *dy, zero);
}

/* rows of n floats ld apart (x, dy and out alike): one call per tile of a product's
   epilogue (the constants are set up once per call, not once per row) */
PDP__GELU_512 PDP__PRIVATE void pdp__gelu_avx512(const float *x, const float *dy,
                                                 float *out, int64_t n, int64_t rows, int64_t ld)
{
    int64_t i, r;
    for (r = 0; r < rows; r++, x += ld, dy = dy ? dy + ld : NULL, out += ld) {
        for (i = 0; i + 16 <= n; i += 16) {
            __m512 g = dy ? _mm512_loadu_ps(dy + i) : _mm512_setzero_ps();
            _mm512_storeu_ps(out + i, pdp__gelu16(_mm512_loadu_ps(x + i), dy ? &g : NULL));
        }
        if (i < n) { /* the tail, masked: the same arithmetic on the lanes that exist */
            __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
            __m512 g = dy ? _mm512_maskz_loadu_ps(m, dy + i) : _mm512_setzero_ps();
            _mm512_mask_storeu_ps(out + i, m, pdp__gelu16(_mm512_maskz_loadu_ps(m, x + i),
                                                           dy ? &g : NULL));
        }
    }
}

PDP__GELU_256 static inline __m256 pdp__exp8(__m256 z)
{
    PDP__GELU_EXP_CONSTANTS;
    __m256 n, r, r2, p;
    __m256i bits;
    z = _mm256_min_ps(_mm256_max_ps(z, _mm256_set1_ps(lo)), _mm256_set1_ps(hi));
    n = _mm256_round_ps(_mm256_mul_ps(z, _mm256_set1_ps(log2e)),
                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(ln2_hi), z);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(ln2_lo), r);
    r2 = _mm256_mul_ps(r, r);
    p = _mm256_fmadd_ps(_mm256_set1_ps(p0), r, _mm256_set1_ps(p1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(p2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(p3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(p4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(p5));
    p = _mm256_fmadd_ps(p, r2, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

PDP__GELU_256 static inline __m256 pdp__gelu8(__m256 x, const __m256 *dy)
{
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    __m256 x2 = _mm256_mul_ps(x, x), u, e, s, du, g, big, small;
    u = _mm256_mul_ps(_mm256_set1_ps(PDP__GELU_C),
                      _mm256_add_ps(x, _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(PDP__GELU_A),
                                                                   x2), x)));
    big = _mm256_cmp_ps(u, _mm256_set1_ps(PDP__GELU_UMAX), _CMP_GT_OQ);
    small = _mm256_cmp_ps(u, _mm256_set1_ps(-PDP__GELU_UMAX), _CMP_LT_OQ);
    e = pdp__exp8(_mm256_mul_ps(_mm256_set1_ps(-2.0f), u));
    if (!dy)
        return _mm256_blendv_ps(_mm256_div_ps(x, _mm256_add_ps(one, e)),
                                _mm256_mul_ps(x, zero), small);
    s = _mm256_div_ps(one, _mm256_add_ps(one, e));
    du = _mm256_mul_ps(_mm256_set1_ps(PDP__GELU_C),
                       _mm256_add_ps(one, _mm256_mul_ps(_mm256_set1_ps(3.0f * PDP__GELU_A), x2)));
    g = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(2.0f), x), du),
                      _mm256_mul_ps(e, s));
    g = _mm256_mul_ps(*dy, _mm256_mul_ps(s, _mm256_add_ps(one, g)));
    g = _mm256_blendv_ps(g, *dy, big);
    return _mm256_blendv_ps(g, _mm256_mul_ps(*dy, zero), small);
}

PDP__GELU_256 PDP__PRIVATE void pdp__gelu_avx2(const float *x, const float *dy,
                                               float *out, int64_t n, int64_t rows, int64_t ld)
{
    int64_t i, r;
    for (r = 0; r < rows; r++, x += ld, dy = dy ? dy + ld : NULL, out += ld) {
        for (i = 0; i + 8 <= n; i += 8) {
            __m256 g = dy ? _mm256_loadu_ps(dy + i) : _mm256_setzero_ps();
            _mm256_storeu_ps(out + i, pdp__gelu8(_mm256_loadu_ps(x + i), dy ? &g : NULL));
        }
        if (i < n) { /* the tail through a zero-padded copy: the same arithmetic */
            float xb[8] = {0}, gb[8] = {0}, ob[8];
            __m256 g;
            memcpy(xb, x + i, (size_t)(n - i) * sizeof *xb);
            if (dy) memcpy(gb, dy + i, (size_t)(n - i) * sizeof *gb);
            g = _mm256_loadu_ps(gb);
            _mm256_storeu_ps(ob, pdp__gelu8(_mm256_loadu_ps(xb), dy ? &g : NULL));
            memcpy(out + i, ob, (size_t)(n - i) * sizeof *ob);
        }
    }
}
/* out = exp(x - shift) for n floats, 0 where x - shift < -87 (the softmax's: its
   arguments are <= 0, and what falls below e^-87 is nothing beside the row's 1). */
PDP__GELU_512 PDP__PRIVATE void pdp__exp_shift_avx512(const float *x, float shift, float *out,
                                                      int64_t n)
{
    const __m512 sh = _mm512_set1_ps(shift), lo = _mm512_set1_ps(-87.0f);
    int64_t i = 0;
    for (; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1u);
        __m512 z = _mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), sh);
        __m512 e = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(z, lo, _CMP_GE_OQ), pdp__exp16(z));
        _mm512_mask_storeu_ps(out + i, m, e);
    }
}

PDP__GELU_256 static inline __m256 pdp__exp_shift8(__m256 x, __m256 shift)
{
    __m256 z = _mm256_sub_ps(x, shift);
    return _mm256_and_ps(_mm256_cmp_ps(z, _mm256_set1_ps(-87.0f), _CMP_GE_OQ), pdp__exp8(z));
}

PDP__GELU_256 PDP__PRIVATE void pdp__exp_shift_avx2(const float *x, float shift, float *out,
                                                    int64_t n)
{
    const __m256 sh = _mm256_set1_ps(shift);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, pdp__exp_shift8(_mm256_loadu_ps(x + i), sh));
    if (i < n) { /* the tail through a zero-padded copy */
        float xb[8] = {0}, ob[8];
        memcpy(xb, x + i, (size_t)(n - i) * sizeof *xb);
        _mm256_storeu_ps(ob, pdp__exp_shift8(_mm256_loadu_ps(xb), sh));
        memcpy(out + i, ob, (size_t)(n - i) * sizeof *ob);
    }
}

#  undef PDP__GELU_EXP_CONSTANTS
#  undef PDP__ALL16
#  undef PDP__GELU_512
#  undef PDP__GELU_256
#endif

/* The width of the vectorised element kernels (the GELU, the softmax's exp): 512
   (AVX-512F), 256 (AVX2 + FMA) or 0 (scalar: math.h's helpers, expf), the widest the CPU
   has. */
PDP__PRIVATE int pdp__layers_simd(void)
{
#if PDP__BF16_X86
    pdp__once_run(&pdp__bf16_once, pdp__bf16_detect);
    return pdp__bf16_this.emul512 ? 512 : pdp__bf16_this.emul256 ? 256 : 0;
#else
    return 0;
#endif
}

/* out = gelu(x) (dy NULL) or out = dy gelu'(x) on rows of n floats ld apart (x, dy and
   out alike), on the kernel of width simd (pdp__layers_simd's, or one the CPU has: the
   tests compare them). Each element alone: the bits do not depend on the cut. */
PDP__PRIVATE void pdp__layers_gelu_simd_rows(int simd, const float *x, const float *dy, float *out,
                                             int64_t n, int64_t rows, int64_t ld)
{
    int64_t i, r;
#if PDP__BF16_X86
    if (simd == 512) {
        pdp__gelu_avx512(x, dy, out, n, rows, ld);
        return;
    }
    if (simd == 256) {
        pdp__gelu_avx2(x, dy, out, n, rows, ld);
        return;
    }
#endif
    (void)simd;
    for (r = 0; r < rows; r++, x += ld, dy = dy ? dy + ld : NULL, out += ld) {
        if (dy)
            for (i = 0; i < n; i++) out[i] = pdp__gelu_grad(dy[i], x[i]);
        else
            for (i = 0; i < n; i++) out[i] = pdp__gelu(x[i]);
    }
}

/* pdp__layers_gelu_simd_rows on one row of n floats */
PDP__PRIVATE void pdp__layers_gelu_simd_run(int simd, const float *x, const float *dy, float *out,
                                            int64_t n)
{
    pdp__layers_gelu_simd_rows(simd, x, dy, out, n, 1, n);
}

/* out = exp(x - shift), n floats (out may be x), on the kernel of width simd as
   pdp__layers_gelu_simd_run; 0 below e^-87 on every width. */
PDP__PRIVATE void pdp__layers_exp_shift_run(int simd, const float *x, float shift, float *out,
                                            int64_t n)
{
    int64_t i;
#if PDP__BF16_X86
    if (simd == 512) {
        pdp__exp_shift_avx512(x, shift, out, n);
        return;
    }
    if (simd == 256) {
        pdp__exp_shift_avx2(x, shift, out, n);
        return;
    }
#endif
    (void)simd;
    for (i = 0; i < n; i++) {
        float z = x[i] - shift;
        out[i] = z < -87.0f ? 0.0f : expf(z);
    }
}

/* Parts for a job split by sample: the caller's intra-op threads, at most one
   per sample. */
PDP__PRIVATE int pdp__layers_batch_parts(int64_t batch)
{
    return (int)PDP__MIN((int64_t)pdp__threads_for_caller(), batch);
}

/* Parameters: the product of a shape. */
PDP__PRIVATE int64_t pdp__layers_count(int ndim, const int64_t *shape)
{
    int64_t n = 1;
    int i;
    for (i = 0; i < ndim; i++) n *= shape[i];
    return n;
}

/* PyTorch's reset_parameters for Linear and Conv2d: weight Kaiming uniform with
   a = sqrt(5) (bound 1/sqrt(fan_in)), then bias U(-1/sqrt(fan_in), 1/sqrt(fan_in)),
   in that order from r. w and b are host memory. */
PDP__PRIVATE void pdp__layers_init_kaiming(float *w, int64_t nw, float *b, int64_t nb,
                                           int64_t fan_in, pdp_rng *r)
{
    pdp_tensor t;
    float bound;
    pdp_tensor_wrap(w, pdp_cpu(), 1, &nw, &t);
    pdp_tensor_kaiming_uniform(&t, r, fan_in, sqrtf(5.0f));
    bound = (float)(1.0 / sqrt((double)fan_in));
    pdp_tensor_wrap(b, pdp_cpu(), 1, &nb, &t);
    pdp_tensor_uniform(&t, r, -bound, bound);
}

/* Setup of a layer whose output has its input's shape and that keeps nothing
   (the activations): nothing to check. */
PDP__PRIVATE pdp_status pdp__layers_setup_same(pdp__layer *l, pdp__param_shapes *ps, const char *in)
{
    (void)l, (void)ps, (void)in;
    return PDP_OK;
}

/* Element-wise layers split [0, batch * in_count) into equal ranges (multiples of
   16) over the intra-op threads when there is enough work to pay for the hand-off;
   every element is computed alone, so the split never changes a bit. The hand-off
   (waking a worker and waiting for it) costs more than a ReLU over 65536 floats:
   the MLP 784-512-512-10 at batch 128 on 2 threads spent 0.33-0.42 ms per step in
   its ReLUs split, 0.18-0.22 ms unsplit (pdp_profile, Zen 4); from 262144 floats on,
   the split pays. (Measured before the pool's workers spun between jobs; with the
   spin, a threshold of 16384 gained 1-3% on that step, inside the host's noise, so
   the threshold stayed.) */
#ifndef PDP__ELEMWISE_PAR_MIN
#  define PDP__ELEMWISE_PAR_MIN PDP__TEST_KNOB(elemwise_par_min, 262144)
#endif

/* Sums over a batch's rows (a LayerNorm's dw and db, a Linear's db) by chunks of rows. Each
   chunk sums its rows in row order into its own share; then the shares are added in chunk
   order. The chunk count depends on the shape only, never on the thread count, so neither
   do the bits. One chunk (under PDP__ELEMWISE_PAR_MIN floats, which run on one thread
   anyway) sums straight into the result. Otherwise the most chunks, a power of two (so
   that 2 or 4 threads get equal work) up to PDP__SUM_CHUNKS, of at least
   PDP__SUM_CHUNK_FLOATS floats each, so that adding a share (its row's length) costs little
   beside its chunk's pass; the shares live in io->work. At bench/gpt's machine-sized model
   (2048 rows of 384 to 1536): 32 chunks of 64 rows, 16 a thread on 2.
   Splitting the threads by rows, not by columns (each thread its columns of every row), is
   also what lets 2 threads go twice as fast on a 2-core Sapphire Rapids (Intel Xeon, 2
   cores; 64-byte aligned buffers, 2048 rows, medians of 100 calls): by columns, LayerNorm's
   dw and db over 384 took 0.22 ms on one thread and 0.31-0.32 ms on two, a fused GELU's
   backward over 1536 columns (with db) 2.22-2.35 and 1.75-1.89 ms; by rows, that GELU
   backward 2.25-2.41 and 1.08-1.09 ms. */
#ifndef PDP__SUM_CHUNKS
#  define PDP__SUM_CHUNKS 64
#endif
#ifndef PDP__SUM_CHUNK_FLOATS
#  define PDP__SUM_CHUNK_FLOATS PDP__TEST_KNOB(sum_chunk_floats, 16384)
#endif

/* The chunks of rows x n floats. */
PDP__PRIVATE int64_t pdp__layers_chunks(int64_t rows, int64_t n)
{
    int64_t k = 1;
    if (rows * n < PDP__ELEMWISE_PAR_MIN) return 1;
    while (2 * k <= PDP__SUM_CHUNKS && 2 * k <= rows &&
           rows * n / (2 * k) >= PDP__SUM_CHUNK_FLOATS)
        k *= 2;
    return k;
}

/* io->work's floats per sample for the shares of `share` floats each, for samples of
   `positions` rows of n: with k > 1 chunks, k <= rows n / CF <= rows / q for q = floor(CF /
   n) (at least 1: then k <= rows), so the k shares are at most batch positions share / q
   floats. */
PDP__PRIVATE int64_t pdp__layers_shares_work(int64_t n, int64_t positions, int64_t share)
{
    int64_t q = PDP__MAX((int64_t)1, PDP__SUM_CHUNK_FLOATS / n);
    return (positions * share + q - 1) / q;
}

/* Intra-op parts for rows x n floats in `items` pieces: 1 below PDP__ELEMWISE_PAR_MIN. */
PDP__PRIVATE int pdp__layers_parts(int64_t rows, int64_t n, int64_t items)
{
    if (rows * n < PDP__ELEMWISE_PAR_MIN) return 1;
    return (int)PDP__MAX((int64_t)1, PDP__MIN((int64_t)pdp__threads_for_caller(), items));
}

/* ---- layers: Linear ---- */

/* Rows a per-position kind acts on in a batch: batch x T for [T, C] samples. */
PDP__PRIVATE int64_t pdp__layer_rows(const pdp__layer *l, int64_t batch)
{
    return batch * (l->positions > 0 ? l->positions : 1);
}

/* The features of one row: a 1-D sample's all, a [T, C] sample's C. */
PDP__PRIVATE int64_t pdp__layer_in_features(const pdp__layer *l)
{
    return l->in_count / (l->positions > 0 ? l->positions : 1);
}

/* A 1-D sample (F) is one row of F features; a [T, C] sample is T rows of C, each acted
   on alone, as PyTorch's Linear and LayerNorm(C) act on the last dimension. */
PDP__PRIVATE void pdp__layers_per_position(pdp__layer *l)
{
    l->positions = l->in_ndim == 2 ? l->in_shape[0] : 1;
}

PDP__PRIVATE pdp_status pdp__linear_setup(pdp__layer *l, pdp__param_shapes *ps, const char *in)
{
    int64_t weights, features;
    if (l->out_features < 1)
        return pdp__err(PDP_ERR_INVALID, "out_features %lld must be >= 1 (input %s)",
                        (long long)l->out_features, in);
    if (l->in_ndim != 1 && l->in_ndim != 2)
        return pdp__err(PDP_ERR_SHAPE, "needs samples of features (F) or positions of "
                        "features (T, C), got %s (add a Flatten first)", in);
    pdp__layers_per_position(l);
    features = l->in_count / l->positions;
    if (!pdp__mul_ok(l->out_features, features, &weights) ||
        !pdp__mul_ok(l->out_features, l->positions, &weights))
        return pdp__err(PDP_ERR_SHAPE, "out_features %lld x %lld inputs: more than %lld weights "
                        "(input %s)", (long long)l->out_features, (long long)features,
                        (long long)PDP__COUNT_MAX, in);
    l->out_shape[0] = l->in_ndim == 2 ? l->positions : l->out_features;
    l->out_shape[1] = l->in_ndim == 2 ? l->out_features : 1;
    ps->wshape[0] = l->out_features;
    ps->wshape[1] = features;
    ps->wndim = 2;
    ps->bshape[0] = l->out_features;
    ps->bndim = 1;
    l->work_per_sample = l->out_features * l->positions + /* a fused ReLU's or GELU's dy, */
                         pdp__layers_shares_work(l->out_features, l->positions,
                                                 l->out_features); /* then db's shares */
    return PDP_OK;
}

PDP__PRIVATE void pdp__linear_init(const pdp__layer *l, float *w, float *b, pdp_rng *r)
{
    int64_t in = pdp__layer_in_features(l);
    pdp__layers_init_kaiming(w, l->out_features * in, b, l->out_features, in, r);
}

/* The ReLU that a Linear applies when one follows it on the CPU (io->fused_relu;
   model.c then makes the ReLU a view, as after a Conv2d): forward, y = relu(y) in
   place once the GEMM has added x W^T to the bias (or in a bf16 product's epilogue:
   pdp__linear_forward); backward, dy masked by y > 0 into io->work (the ReLU's
   backward), db's column sums taken on the way, and the GEMMs read that. The ReLU's element code, and db's sums sample by sample as
   unfused: the bits of the two layers run apart (test_layers:
   layers_linear_relu_fused_matches_unfused).

   The GELU that a Linear applies when one follows it on the CPU (io->gelu_y; model.c then
   skips the GELU): forward, y = x W^T + b stays (the GELU's input, which its backward
   reads) and gelu_y = gelu(y), the GELU's output, is written beside it, in a bf16
   product's epilogue from the tile just written, else by a column pass after the GEMM;
   backward, dy (the GELU's output gradient) times gelu'(y) into io->work, db's column
   sums on the way, and the GEMMs read that. The GELU layer's kernel on its width
   (pdp__layers_gelu_simd_rows), each element alone, and db's sums sample by sample: the
   bits of the two layers run apart (test_layers: layers_linear_gelu_fused_matches_unfused).
   What it saves: the GELU's read of y in forward (12.6 MB a c_fc of bench/gpt's
   machine-sized model) and its hand-off to the threads, and in backward the Linear's read of
   the GELU's dx for db. The GELU's own arithmetic (an exp and a division an element) stays,
   and on bench/gpt's machine-sized model it is most of the GELU's time: its bf16 c_fc + GELU
   per step, the minimum of 15 steps in 6 alternated runs on a shared 2-core Sapphire
   Rapids, moved from 75-77 to 73-80 ms on 2 threads and from 132-138 to 132-136 ms on one
   (inside the runs' spread; an earlier, busier set gave 69-72 -> 64-68 ms on 2 threads).

   Row passes (pdp__linear_rows_run): the ReLU's and the GELU's, the bias copied into every
   row before the GEMM, db's sums without either. Large batches split the rows, in
   pdp__layers_chunks's chunks, over the intra-op threads; db is summed in each chunk's share
   of io->work (after the batch x out floats of the masked dy), the shares then added in
   chunk order, so the bits do not depend on the thread count. The bias and db passes write
   and read batch x out floats each (28 MB a block at bench/gpt's machine-sized model),
   which one thread alone would have to stream while the other waits. */
typedef struct pdp__linear_rows_job {
    const pdp__layer_io *io;
    int64_t out, chunks;
    float *shares; /* the chunks' db shares, out floats each; NULL: into io->db */
    void (*rows)(const pdp__layer_io *io, int64_t out, int64_t r0, int64_t r1, float *db);
} pdp__linear_rows_job;

PDP__PRIVATE void pdp__layers_relu_inplace(float *PDP__RESTRICT y, int64_t n)
{
    PDP__FOR_BLOCKED(i, n, y[i] = pdp__relu(y[i]););
}

/* dz = dy where y > 0 (pdp__relu_grad), db += dz. */
PDP__PRIVATE void pdp__layers_relu_grad_sum(const float *PDP__RESTRICT dy,
                                            const float *PDP__RESTRICT y, float *PDP__RESTRICT dz,
                                            float *PDP__RESTRICT db, int64_t n)
{
    PDP__FOR_BLOCKED(i, n, {
        float g = dy[i], v = y[i], d = pdp__relu_grad(g, v);
        dz[i] = d;
        db[i] += d;
    });
}

/* The same in bf16: dz rounded to bf16 (pdp__bf16_round_u32's bits) as it is stored, db
   summing the unrounded values (db is fp32: only the products' inputs are rounded); db
   NULL: no sums. The products read dz as their op(A), which is then bf16 by construction
   (pdp__linear_gemm_bf16). */
PDP__PRIVATE void pdp__layers_relu_grad16(const float *PDP__RESTRICT dy,
                                          const float *PDP__RESTRICT y, float *PDP__RESTRICT dz,
                                          float *PDP__RESTRICT db, int64_t n)
{
    int64_t i = 0;
#if !defined(PDP_NO_SIMD) && defined(__AVX512F__)
    const __m512 zero = _mm512_setzero_ps();
    for (; i + 16 <= n; i += 16) { /* pdp__relu_grad: 0 where y <= 0 (NaN y: dy) */
        __m512 d = _mm512_maskz_mov_ps(
            _mm512_cmp_ps_mask(_mm512_loadu_ps(y + i), zero, _CMP_NLE_UQ), _mm512_loadu_ps(dy + i));
        if (db) _mm512_storeu_ps(db + i, _mm512_add_ps(_mm512_loadu_ps(db + i), d));
        _mm512_storeu_si512((void *)(dz + i), pdp__gemm_round_zmm(_mm512_castps_si512(d)));
    }
#elif !defined(PDP_NO_SIMD) && defined(__AVX2__)
    const __m256 zero = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) { /* the same in ymm (scalar, this pass was 12% of the MLP's
                                    bf16 step on Zen 3, the fp32 one's 1%) */
        __m256 d = _mm256_and_ps(_mm256_cmp_ps(_mm256_loadu_ps(y + i), zero, _CMP_NLE_UQ),
                                 _mm256_loadu_ps(dy + i));
        if (db) _mm256_storeu_ps(db + i, _mm256_add_ps(_mm256_loadu_ps(db + i), d));
        _mm256_storeu_ps(dz + i, pdp__gemm_round_ymm(d));
    }
#endif
    for (; i < n; i++) {
        float d = pdp__relu_grad(dy[i], y[i]);
        if (db) db[i] += d;
        dz[i] = pdp__bf16_round(d);
    }
}

/* Rows [r0, r1) of each pass; db (a chunk's share or io->db) is NULL when io->db is. */
PDP__PRIVATE void pdp__linear_relu_forward_rows(const pdp__layer_io *io, int64_t out, int64_t r0,
                                                int64_t r1, float *db)
{
    (void)db;
    pdp__layers_relu_inplace(io->y + r0 * out, (r1 - r0) * out);
}

PDP__PRIVATE void pdp__linear_relu_backward_rows(const pdp__layer_io *io, int64_t out, int64_t r0,
                                                 int64_t r1, float *db)
{
    int64_t i, at;
    for (i = r0; i < r1; i++) {
        at = i * out;
        if (db)
            pdp__layers_relu_grad_sum(io->dy + at, io->y + at, io->work + at, db, out);
        else
            pdp__layers_relu_grad(io->dy + at, io->y + at, io->work + at, out);
    }
}

/* pdp__linear_relu_backward_rows in bf16: work rounded (pdp__layers_relu_grad16) */
PDP__PRIVATE void pdp__linear_relu_backward_rows16(const pdp__layer_io *io, int64_t out,
                                                   int64_t r0, int64_t r1, float *db)
{
    int64_t i, at;
    for (i = r0; i < r1; i++) {
        at = i * out;
        pdp__layers_relu_grad16(io->dy + at, io->y + at, io->work + at, db, out);
    }
}

/* gelu_y = gelu(y) (after a product that did not apply it) */
PDP__PRIVATE void pdp__linear_gelu_forward_rows(const pdp__layer_io *io, int64_t out, int64_t r0,
                                                int64_t r1, float *db)
{
    (void)db;
    pdp__layers_gelu_simd_rows(pdp__layers_simd(), io->y + r0 * out, NULL, io->gelu_y + r0 * out,
                               out, r1 - r0, out);
}

/* dz = dy gelu'(y) into work (the GELU's backward), db += dz, row by row */
PDP__PRIVATE void pdp__linear_gelu_backward_rows(const pdp__layer_io *io, int64_t out, int64_t r0,
                                                 int64_t r1, float *db)
{
    int simd = pdp__layers_simd();
    int64_t i, at;
    for (i = r0; i < r1; i++) {
        at = i * out;
        pdp__layers_gelu_simd_run(simd, io->y + at, io->dy + at, io->work + at, out);
        if (db) pdp__layers_add(db, io->work + at, out);
    }
}

/* y's rows = b (the GEMM adds x W^T next, beta 1) */
PDP__PRIVATE void pdp__linear_bias_rows(const pdp__layer_io *io, int64_t out, int64_t r0,
                                        int64_t r1, float *db)
{
    int64_t i;
    (void)db;
    for (i = r0; i < r1; i++) memcpy(io->y + i * out, io->b, (size_t)out * sizeof(float));
}

/* db += dY's rows, row by row */
PDP__PRIVATE void pdp__linear_db_rows(const pdp__layer_io *io, int64_t out, int64_t r0,
                                      int64_t r1, float *db)
{
    int64_t i;
    for (i = r0; i < r1; i++) pdp__layers_add(db, io->dy + i * out, out);
}

/* chunks [c0, c1) of the k: chunk c holds rows [batch c / k, batch (c + 1) / k) */
PDP__PRIVATE void pdp__linear_rows_part(void *arg, int i, int parts)
{
    const pdp__linear_rows_job *job = (const pdp__linear_rows_job *)arg;
    int64_t k = job->chunks, B = job->io->batch, c, c0 = k * i / parts, c1 = k * (i + 1) / parts;
    for (c = c0; c < c1; c++) {
        float *db = job->io->db;
        if (job->shares) {
            db = job->shares + job->out * c;
            memset(db, 0, (size_t)job->out * sizeof(float));
        }
        job->rows(job->io, job->out, B * c / k, B * (c + 1) / k, db);
    }
}

/* One pass over the rows; `sums`: the pass adds to db (then through the chunks' shares). */
PDP__PRIVATE void pdp__linear_rows_run(const pdp__layer *l, const pdp__layer_io *io,
                                       void (*rows)(const pdp__layer_io *, int64_t, int64_t,
                                                    int64_t, float *),
                                       bool sums)
{
    pdp__linear_rows_job job;
    int64_t c;
    job.io = io;
    job.out = l->out_features;
    job.rows = rows;
    job.chunks = pdp__layers_chunks(io->batch, job.out);
    job.shares = sums && io->db && job.chunks > 1 ? io->work + io->batch * job.out : NULL;
    pdp__parallel_for(pdp__layers_parts(io->batch, job.out, job.chunks), pdp__linear_rows_part,
                      &job);
    for (c = 0; job.shares && c < job.chunks; c++) /* the shares, in chunk order */
        pdp__layers_add(io->db, job.shares + job.out * c, job.out);
}

/* io for the GEMMs: a [T, C] sample's T rows as rows of the batch */
PDP__PRIVATE const pdp__layer_io *pdp__linear_rows_io(const pdp__layer *l, const pdp__layer_io *io,
                                                      pdp__layer_io *rows)
{
    if (l->positions <= 1) return io;
    *rows = *io;
    rows->batch = pdp__layer_rows(l, io->batch);
    return rows;
}

PDP__PRIVATE pdp_status pdp__linear_forward(const pdp__layer *l, const pdp__layer_io *io_in)
{
    pdp__layer_io rows;
    const pdp__layer_io *io = pdp__linear_rows_io(l, io_in, &rows);
    int64_t B = io->batch, in = pdp__layer_in_features(l);
    int64_t out = l->out_features;
    float beta = 0.0f;
    /* bf16 on a chain path: one pass over y, the bias and the ReLU or GELU added in the
       product's epilogue (pdp__gemm_bf16_bias: fl(acc + b), then the ReLU, or the GELU into
       gelu_y). Otherwise y = b, then the GEMM adds x W^T (beta 1: pdp_sgemm and
       sgemm-rounded add C to their first k block's partial sum), then the ReLU's or the
       GELU's pass. */
    if (io->bf16 && pdp__gemm_bf16_bias(PDP_BF16_PATH_AUTO, PDP_NO_TRANS, PDP_TRANS, B, out, in,
                                        io->x, in, io->w, in, io->b, io->fused_relu, io->gelu_y,
                                        io->y, out))
        return PDP_OK;
    if (io->b) {
        pdp__linear_rows_run(l, io, pdp__linear_bias_rows, false);
        beta = 1.0f;
    }
    (io->bf16 ? pdp_gemm_bf16 : pdp_sgemm)(PDP_NO_TRANS, PDP_TRANS, B, out, in, 1.0f, io->x, in,
                                            io->w, in, beta, io->y, out);
    if (io->fused_relu) pdp__linear_rows_run(l, io, pdp__linear_relu_forward_rows, false);
    if (io->gelu_y) pdp__linear_rows_run(l, io, pdp__linear_gelu_forward_rows, false);
    return PDP_OK;
}

/* pdp_gemm_bf16, told whether op(A) holds bf16 values already (a16: the ReLU's backward
   pass rounded dY): where the product runs sgemm-rounded, only op(B) is rounded as it is
   packed (pdp__sgemm_bf16_b; the bits of pdp_gemm_bf16, rounding being idempotent); the
   other paths round both, as always. */
PDP__PRIVATE void pdp__linear_gemm_bf16(bool a16, pdp_trans ta, pdp_trans tb, int64_t m,
                                        int64_t n, int64_t k, const float *a, int64_t lda,
                                        const float *b, int64_t ldb, float beta, float *c,
                                        int64_t ldc)
{
#if PDP__BF16_HAS_SGEMM
    if (a16 && pdp_bf16_path_for(ta, tb, m, n, k) == PDP_BF16_PATH_SGEMM) {
        pdp__sgemm_bf16_b(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc);
        return;
    }
#endif
    (void)a16;
    pdp_gemm_bf16(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc);
}

PDP__PRIVATE pdp_status pdp__linear_backward(const pdp__layer *l, const pdp__layer_io *io_in)
{
    pdp__layer_io rows;
    const pdp__layer_io *io = pdp__linear_rows_io(l, io_in, &rows);
    int64_t B = io->batch, in = pdp__layer_in_features(l);
    int64_t out = l->out_features;
    const float *dy = io->dy;
    /* bf16 with a ReLU: the masked dy rounded as it is stored, for both products */
    bool dy16 = io->bf16 && io->fused_relu && !io->gelu_y;
    if (io->fused_relu || io->gelu_y) { /* dy masked (times gelu') into work, db's sums */
        pdp__linear_rows_run(l, io, io->gelu_y ? pdp__linear_gelu_backward_rows
                                    : dy16     ? pdp__linear_relu_backward_rows16
                                               : pdp__linear_relu_backward_rows, true);
        dy = io->work;
    } else if (io->db) {
        pdp__linear_rows_run(l, io, pdp__linear_db_rows, true);
    }
    /* dW += dY^T X */
    if (io->bf16)
        pdp__linear_gemm_bf16(dy16, PDP_TRANS, PDP_NO_TRANS, out, in, B, dy, out, io->x, in, 1.0f,
                              io->dw, in);
    else
        pdp_sgemm(PDP_TRANS, PDP_NO_TRANS, out, in, B, 1.0f, dy, out, io->x, in, 1.0f, io->dw, in);
    if (io->dx && io->bf16) /* dX = dY W */
        pdp__linear_gemm_bf16(dy16, PDP_NO_TRANS, PDP_NO_TRANS, B, in, out, dy, out, io->w, in,
                              0.0f, io->dx, in);
    else if (io->dx)
        pdp_sgemm(PDP_NO_TRANS, PDP_NO_TRANS, B, in, out, 1.0f, dy, out, io->w, in, 0.0f, io->dx,
                  in);
    return PDP_OK;
}

#ifdef PDP_CUDA
PDP__PRIVATE pdp_status pdp__linear_cuda_forward(const pdp__layer *l, const pdp__layer_io *io)
{
    int64_t rows = pdp__layer_rows(l, io->batch);
    return pdp_cudak_linear_fwd(io->device.ordinal, io->x, io->w, io->b, io->y, rows,
                                l->in_count * io->batch / rows, l->out_features, io->bf16);
}

PDP__PRIVATE pdp_status pdp__linear_cuda_backward(const pdp__layer *l, const pdp__layer_io *io)
{
    int64_t rows = pdp__layer_rows(l, io->batch);
    return pdp_cudak_linear_bwd(io->device.ordinal, io->x, io->w, io->dy, io->dw, io->db, io->dx,
                                rows, l->in_count * io->batch / rows, l->out_features, io->bf16);
}
#endif

/* ---- layers: activations ---- */

typedef struct pdp__elem_job {
    const pdp__layer *l;
    const pdp__layer_io *io;
    int64_t n;
    void (*fn)(const pdp__layer *l, const pdp__layer_io *io, int64_t lo, int64_t hi);
} pdp__elem_job;

PDP__PRIVATE void pdp__elem_part(void *arg, int i, int parts)
{
    const pdp__elem_job *job = (const pdp__elem_job *)arg;
    int64_t blocks = (job->n + 15) / 16;
    int64_t lo = PDP__MIN(job->n, blocks * i / parts * 16);
    int64_t hi = PDP__MIN(job->n, blocks * (i + 1) / parts * 16);
    if (lo < hi) job->fn(job->l, job->io, lo, hi);
}

PDP__PRIVATE void pdp__elem_run(const pdp__layer *l, const pdp__layer_io *io,
                                void (*fn)(const pdp__layer *, const pdp__layer_io *, int64_t,
                                           int64_t))
{
    pdp__elem_job job;
    int parts = pdp__threads_for_caller();
    job.l = l;
    job.io = io;
    job.n = io->batch * l->in_count;
    job.fn = fn;
    if (job.n < PDP__ELEMWISE_PAR_MIN) parts = 1;
    pdp__parallel_for(parts, pdp__elem_part, &job);
}

/* ReLU, GELU, Tanh, Sigmoid, SiLU: elements [lo, hi) of forward (y from x) and of
   backward (dx from dy and y, or x for GELU and SiLU). */
PDP__PRIVATE void pdp__relu_forward_range(const pdp__layer *l, const pdp__layer_io *io, int64_t lo,
                                          int64_t hi)
{
    (void)l;
    pdp__layers_relu(io->x + lo, io->y + lo, hi - lo);
}

PDP__PRIVATE void pdp__relu_backward_range(const pdp__layer *l, const pdp__layer_io *io, int64_t lo,
                                           int64_t hi)
{
    (void)l;
    pdp__layers_relu_grad(io->dy + lo, io->y + lo, io->dx + lo, hi - lo);
}

PDP__PRIVATE void pdp__gelu_forward_range(const pdp__layer *l, const pdp__layer_io *io, int64_t lo,
                                          int64_t hi)
{
    (void)l;
    pdp__layers_gelu_simd_run(pdp__layers_simd(), io->x + lo, NULL, io->y + lo, hi - lo);
}

PDP__PRIVATE void pdp__gelu_backward_range(const pdp__layer *l, const pdp__layer_io *io, int64_t lo,
                                           int64_t hi)
{
    (void)l;
    pdp__layers_gelu_simd_run(pdp__layers_simd(), io->x + lo, io->dy + lo, io->dx + lo,
                              hi - lo);
}

PDP__PRIVATE void pdp__tanh_forward_range(const pdp__layer *l, const pdp__layer_io *io, int64_t lo,
                                          int64_t hi)
{
    int64_t n = hi - lo, i;
    const float *PDP__RESTRICT x = io->x + lo;
    float *PDP__RESTRICT y = io->y + lo;
    (void)l;
    for (i = 0; i < n; i++) y[i] = tanhf(x[i]);
}

PDP__PRIVATE void pdp__tanh_backward_range(const pdp__layer *l, const pdp__layer_io *io, int64_t lo,
                                           int64_t hi)
{
    (void)l;
    pdp__layers_tanh_grad(io->dy + lo, io->y + lo, io->dx + lo, hi - lo);
}

PDP__PRIVATE void pdp__sigmoid_forward_range(const pdp__layer *l, const pdp__layer_io *io,
                                             int64_t lo, int64_t hi)
{
    int64_t n = hi - lo, i;
    const float *PDP__RESTRICT x = io->x + lo;
    float *PDP__RESTRICT y = io->y + lo;
    (void)l;
    for (i = 0; i < n; i++) y[i] = pdp__sigmoid(x[i]);
}

PDP__PRIVATE void pdp__sigmoid_backward_range(const pdp__layer *l, const pdp__layer_io *io,
                                              int64_t lo, int64_t hi)
{
    (void)l;
    pdp__layers_sigmoid_grad(io->dy + lo, io->y + lo, io->dx + lo, hi - lo);
}

PDP__PRIVATE void pdp__silu_forward_range(const pdp__layer *l, const pdp__layer_io *io, int64_t lo,
                                          int64_t hi)
{
    int64_t n = hi - lo, i;
    const float *PDP__RESTRICT x = io->x + lo;
    float *PDP__RESTRICT y = io->y + lo;
    (void)l;
    for (i = 0; i < n; i++) y[i] = pdp__silu(x[i]);
}

PDP__PRIVATE void pdp__silu_backward_range(const pdp__layer *l, const pdp__layer_io *io, int64_t lo,
                                           int64_t hi)
{
    int64_t n = hi - lo, i;
    const float *PDP__RESTRICT x = io->x + lo, *PDP__RESTRICT dy = io->dy + lo;
    float *PDP__RESTRICT dx = io->dx + lo;
    (void)l;
    for (i = 0; i < n; i++) dx[i] = pdp__silu_grad(dy[i], x[i]);
}

PDP__PRIVATE void pdp__gelu_erf_forward_range(const pdp__layer *l, const pdp__layer_io *io,
                                              int64_t lo, int64_t hi)
{
    int64_t n = hi - lo, i;
    const float *PDP__RESTRICT x = io->x + lo;
    float *PDP__RESTRICT y = io->y + lo;
    (void)l;
    for (i = 0; i < n; i++) y[i] = pdp__gelu_erf(x[i]);
}

PDP__PRIVATE void pdp__gelu_erf_backward_range(const pdp__layer *l, const pdp__layer_io *io,
                                               int64_t lo, int64_t hi)
{
    int64_t n = hi - lo, i;
    const float *PDP__RESTRICT x = io->x + lo, *PDP__RESTRICT dy = io->dy + lo;
    float *PDP__RESTRICT dx = io->dx + lo;
    (void)l;
    for (i = 0; i < n; i++) dx[i] = pdp__gelu_erf_grad(dy[i], x[i]);
}

PDP__PRIVATE pdp_status pdp__relu_forward(const pdp__layer *l, const pdp__layer_io *io)
{
    pdp__elem_run(l, io, pdp__relu_forward_range);
    return PDP_OK;
}

PDP__PRIVATE pdp_status pdp__relu_backward(const pdp__layer *l, const pdp__layer_io *io)
{
    if (io->dx) pdp__elem_run(l, io, pdp__relu_backward_range);
    return PDP_OK;
}

PDP__PRIVATE pdp_status pdp__gelu_forward(const pdp__layer *l, const pdp__layer_io *io)
{
    pdp__elem_run(l, io, pdp__gelu_forward_range);
    return PDP_OK;
}

PDP__PRIVATE pdp_status pdp__gelu_backward(const pdp__layer *l, const pdp__layer_io *io)
{
    if (io->dx) pdp__elem_run(l, io, pdp__gelu_backward_range);
    return PDP_OK;
}

PDP__PRIVATE pdp_status pdp__tanh_forward(const pdp__layer *l, const pdp__layer_io *io)
{
    pdp__elem_run(l, io, pdp__tanh_forward_range);
    return PDP_OK;
}

PDP__PRIVATE pdp_status pdp__tanh_backward(const pdp__layer *l, const pdp__layer_io *io)
{
    if (io->dx) pdp__elem_run(l, io, pdp__tanh_backward_range);
    return PDP_OK;
}

PDP__PRIVATE pdp_status pdp__sigmoid_forward(const pdp__layer *l, const pdp__layer_io *io)
{
    pdp__elem_run(l, io, pdp__sigmoid_forward_range);
    return PDP_OK;
}

PDP__PRIVATE pdp_status pdp__sigmoid_backward(const pdp__layer *l, const pdp__layer_io *io)
{
    if (io->dx) pdp__elem_run(l, io, pdp__sigmoid_backward_range);
    return PDP_OK;
}

PDP__PRIVATE pdp_status pdp__silu_forward(const pdp__layer *l, const pdp__layer_io *io)
{
    pdp__elem_run(l, io, pdp__silu_forward_range);
    return PDP_OK;
}

PDP__PRIVATE pdp_status pdp__silu_backward(const pdp__layer *l, const pdp__layer_io *io)
{
    if (io->dx) pdp__elem_run(l, io, pdp__silu_backward_range);
    return PDP_OK;
}

PDP__PRIVATE pdp_status pdp__gelu_erf_forward(const pdp__layer *l, const pdp__layer_io *io)
{
    pdp__elem_run(l, io, pdp__gelu_erf_forward_range);
    return PDP_OK;
}

PDP__PRIVATE pdp_status pdp__gelu_erf_backward(const pdp__layer *l, const pdp__layer_io *io)
{
    if (io->dx) pdp__elem_run(l, io, pdp__gelu_erf_backward_range);
    return PDP_OK;
}

#ifdef PDP_CUDA
/* One kernel pair for the five, told which by pdp_cudak_act. */
PDP__PRIVATE pdp_status pdp__act_cuda_forward(const pdp__layer *l, const pdp__layer_io *io,
                                              pdp_cudak_act act)
{
    return pdp_cudak_act_fwd(io->device.ordinal, act, io->x, io->y, io->batch * l->in_count);
}

PDP__PRIVATE pdp_status pdp__act_cuda_backward(const pdp__layer *l, const pdp__layer_io *io,
                                               pdp_cudak_act act)
{
    if (!io->dx) return PDP_OK;
    return pdp_cudak_act_bwd(io->device.ordinal, act, io->x, io->y, io->dy, io->dx,
                             io->batch * l->in_count);
}

PDP__PRIVATE pdp_status pdp__relu_cuda_forward(const pdp__layer *l, const pdp__layer_io *io)
{
    return pdp__act_cuda_forward(l, io, PDP_CUDAK_RELU);
}

PDP__PRIVATE pdp_status pdp__relu_cuda_backward(const pdp__layer *l, const pdp__layer_io *io)
{
    return pdp__act_cuda_backward(l, io, PDP_CUDAK_RELU);
}

PDP__PRIVATE pdp_status pdp__gelu_cuda_forward(const pdp__layer *l, const pdp__layer_io *io)
{
    return pdp__act_cuda_forward(l, io, PDP_CUDAK_GELU);
}

PDP__PRIVATE pdp_status pdp__gelu_cuda_backward(const pdp__layer *l, const pdp__layer_io *io)
{
    return pdp__act_cuda_backward(l, io, PDP_CUDAK_GELU);
}

PDP__PRIVATE pdp_status pdp__tanh_cuda_forward(const pdp__layer *l, const pdp__layer_io *io)
{
    return pdp__act_cuda_forward(l, io, PDP_CUDAK_TANH);
}

PDP__PRIVATE pdp_status pdp__tanh_cuda_backward(const pdp__layer *l, const pdp__layer_io *io)
{
    return pdp__act_cuda_backward(l, io, PDP_CUDAK_TANH);
}

PDP__PRIVATE pdp_status pdp__sigmoid_cuda_forward(const pdp__layer *l, const pdp__layer_io *io)
{
    return pdp__act_cuda_forward(l, io, PDP_CUDAK_SIGMOID);
}

PDP__PRIVATE pdp_status pdp__sigmoid_cuda_backward(const pdp__layer *l, const pdp__layer_io *io)
{
    return pdp__act_cuda_backward(l, io, PDP_CUDAK_SIGMOID);
}

PDP__PRIVATE pdp_status pdp__silu_cuda_forward(const pdp__layer *l, const pdp__layer_io *io)
{
    return pdp__act_cuda_forward(l, io, PDP_CUDAK_SILU);
}

PDP__PRIVATE pdp_status pdp__silu_cuda_backward(const pdp__layer *l, const pdp__layer_io *io)
{
    return pdp__act_cuda_backward(l, io, PDP_CUDAK_SILU);
}

PDP__PRIVATE pdp_status pdp__gelu_erf_cuda_forward(const pdp__layer *l, const pdp__layer_io *io)
{
    return pdp__act_cuda_forward(l, io, PDP_CUDAK_GELU_ERF);
}

PDP__PRIVATE pdp_status pdp__gelu_erf_cuda_backward(const pdp__layer *l, const pdp__layer_io *io)
{
    return pdp__act_cuda_backward(l, io, PDP_CUDAK_GELU_ERF);
}
#endif

/* ---- layers: Dropout ---- */

PDP__PRIVATE pdp_status pdp__dropout_setup(pdp__layer *l, pdp__param_shapes *ps, const char *in)
{
    (void)ps;
    if (!(l->p >= 0.0f && l->p < 1.0f))
        return pdp__err(PDP_ERR_INVALID, "p %g is outside [0, 1) (input %s)", (double)l->p, in);
    l->saved_per_sample = l->in_count; /* the scaled mask */
    return PDP_OK;
}

PDP__PRIVATE pdp_status pdp__dropout_forward(const pdp__layer *l, const pdp__layer_io *io)
{
    int64_t B = io->batch, n = l->in_count, s;
    uint32_t thr;
    float scale;
    if (!io->training || l->p == 0.0f) {
        if (io->y != io->x) memcpy(io->y, io->x, (size_t)(B * n) * sizeof(float));
        return PDP_OK;
    }
    thr = pdp__dropout_threshold(l->p);
    scale = 1.0f / (1.0f - l->p);
    for (s = 0; s < B; s++) {
        uint64_t key = pdp__dropout_key(io->seed, l->mask_index, io->step, io->sample_base + s);
        const float *PDP__RESTRICT x = io->x + s * n;
        float *PDP__RESTRICT y = io->y + s * n, *PDP__RESTRICT mask = io->saved + s * n;
        PDP__FOR_BLOCKED(j, n, {
            mask[j] = pdp__dropout_bits(key, l->mask_first + j) >= thr ? scale : 0.0f;
            y[j] = x[j] * mask[j];
        });
    }
    return PDP_OK;
}

PDP__PRIVATE pdp_status pdp__dropout_backward(const pdp__layer *l, const pdp__layer_io *io)
{
    int64_t n = io->batch * l->in_count;
    if (!io->dx) return PDP_OK;
    if (!io->training || l->p == 0.0f) {
        memcpy(io->dx, io->dy, (size_t)n * sizeof(float));
        return PDP_OK;
    }
    pdp__layers_mul(io->dy, io->saved, io->dx, n);
    return PDP_OK;
}


#ifdef PDP_CUDA
PDP__PRIVATE pdp_status pdp__dropout_cuda_forward(const pdp__layer *l, const pdp__layer_io *io)
{
    int dev = io->device.ordinal;
    int64_t n = io->batch * l->in_count;
    if (io->training && l->p != 0.0f)
        return pdp_cudak_dropout_fwd(dev, io->x, io->y, io->saved, io->batch, l->in_count, l->p,
                                     io->seed, l->mask_index, io->step, io->sample_base,
                                     l->mask_first);
    if (io->y == io->x) return PDP_OK;
    return pdp_cudak_memcpy(dev, io->y, dev, io->x, (size_t)n * sizeof(float));
}

PDP__PRIVATE pdp_status pdp__dropout_cuda_backward(const pdp__layer *l, const pdp__layer_io *io)
{
    int dev = io->device.ordinal;
    int64_t n = io->batch * l->in_count;
    if (!io->dx) return PDP_OK;
    if (!io->training || l->p == 0.0f)
        return pdp_cudak_memcpy(dev, io->dx, dev, io->dy, (size_t)n * sizeof(float));
    return pdp_cudak_mul(dev, io->dy, io->saved, io->dx, n);
}
#endif

/* ---- layers: LayerNorm ---- */

/* A row's element passes, on restrict parameters so that gcc -O2 vectorises them (over
   restrict locals such as io->x + s * n it does not: see pdp__layers_add). Element by
   element, so the bits are the scalar loops'. y = (x - mean) rstd w + b: */
PDP__PRIVATE void pdp__layers_norm_row(const float *PDP__RESTRICT x, const float *PDP__RESTRICT w,
                                       const float *PDP__RESTRICT b, float mean, float rstd,
                                       float *PDP__RESTRICT y, int64_t n)
{
    PDP__FOR_BLOCKED(j, n, y[j] = (x[j] - mean) * rstd * w[j] + b[j];);
}

/* dw += dy xh, db += dy, xh = (x - mean) rstd */
PDP__PRIVATE void pdp__layers_norm_wgrad(const float *PDP__RESTRICT dy,
                                         const float *PDP__RESTRICT x, float mean, float rstd,
                                         float *PDP__RESTRICT dw, float *PDP__RESTRICT db,
                                         int64_t n)
{
    PDP__FOR_BLOCKED(j, n, {
        dw[j] += dy[j] * ((x[j] - mean) * rstd);
        db[j] += dy[j];
    });
}

/* dx = rstd (dy w - mg - xh mgx), and dw, db as pdp__layers_norm_wgrad, in one pass */
PDP__PRIVATE void pdp__layers_norm_dx_wgrad(const float *PDP__RESTRICT dy,
                                            const float *PDP__RESTRICT w,
                                            const float *PDP__RESTRICT x, float mean, float rstd,
                                            float mg, float mgx, float *PDP__RESTRICT dx,
                                            float *PDP__RESTRICT dw, float *PDP__RESTRICT db,
                                            int64_t n)
{
    PDP__FOR_BLOCKED(j, n, {
        float xh = (x[j] - mean) * rstd;
        dx[j] = rstd * (dy[j] * w[j] - mg - xh * mgx);
        dw[j] += dy[j] * xh;
        db[j] += dy[j];
    });
}

/* dw += share's first n floats, db += its next n */
PDP__PRIVATE void pdp__layers_norm_add_share(const float *PDP__RESTRICT share,
                                             float *PDP__RESTRICT dw, float *PDP__RESTRICT db,
                                             int64_t n)
{
    PDP__FOR_BLOCKED(j, n, {
        dw[j] += share[j];
        db[j] += share[n + j];
    });
}

/* io->work's floats per sample: backward's chunk shares (pdp__layers_chunks), 2 n each. */
PDP__PRIVATE int64_t pdp__layernorm_work(const pdp__layer *l)
{
    int64_t n = pdp__layer_in_features(l);
    return pdp__layers_shares_work(n, l->in_count / n, 2 * n);
}

PDP__PRIVATE pdp_status pdp__layernorm_setup(pdp__layer *l, pdp__param_shapes *ps, const char *in)
{
    if (!(l->eps > 0.0f) || isinf(l->eps))
        return pdp__err(PDP_ERR_INVALID, "eps %g must be finite and > 0 (input %s)",
                        (double)l->eps, in);
    pdp__layers_per_position(l);
    if (l->in_ndim == 2) { /* [T, C]: LayerNorm(C) over the last dimension, row by row */
        ps->wshape[0] = ps->bshape[0] = l->in_shape[1];
        ps->wndim = ps->bndim = 1;
    } else { /* (F) or (C, H, W): over all of a sample's features */
        memcpy(ps->wshape, l->in_shape, 3 * sizeof *ps->wshape);
        memcpy(ps->bshape, l->in_shape, 3 * sizeof *ps->bshape);
        ps->wndim = ps->bndim = l->in_ndim;
    }
    l->saved_per_sample = 2 * l->positions; /* mean, rstd per row */
    l->work_per_sample = pdp__layernorm_work(l); /* backward's shares */
    return PDP_OK;
}

/* weight 1, bias 0 (PyTorch's) */
PDP__PRIVATE void pdp__layernorm_init(const pdp__layer *l, float *w, float *b, pdp_rng *r)
{
    int64_t i;
    (void)r;
    for (i = 0; i < pdp__layer_in_features(l); i++) {
        w[i] = 1.0f;
        b[i] = 0.0f;
    }
}

/* Rows [lo, hi) of the forward: mean and variance in fixed-order sums (pdp__layers_sum),
   then the row. */
PDP__PRIVATE void pdp__layernorm_forward_rows(const pdp__layer *l, const pdp__layer_io *io,
                                              int64_t n, int64_t lo, int64_t hi)
{
    int64_t s;
    for (s = lo; s < hi; s++) {
        const float *x = io->x + s * n;
        float mean = (float)(pdp__layers_sum(x, n) / (double)n);
        double var = pdp__layers_sumsq_dev(x, mean, n) / (double)n;
        float rstd = (float)(1.0 / sqrt(var + (double)l->eps));
        pdp__layers_norm_row(x, io->w, io->b, mean, rstd, io->y + s * n, n);
        io->saved[2 * s] = mean;
        io->saved[2 * s + 1] = rstd;
    }
}

/* Rows [lo, hi), dw and db summed into dw, db (of n floats): with xh = (x - mean) rstd and
   g = dy w, dx = rstd (g - mean(g) - xh mean(g xh)), dw += dy xh, db += dy. */
PDP__PRIVATE void pdp__layernorm_backward_rows(const pdp__layer_io *io, int64_t n, int64_t lo,
                                               int64_t hi, float *dw, float *db)
{
    int64_t s;
    for (s = lo; s < hi; s++) {
        const float *x = io->x + s * n, *dy = io->dy + s * n;
        float mean = io->saved[2 * s], rstd = io->saved[2 * s + 1], mg, mgx;
        if (!io->dx) {
            pdp__layers_norm_wgrad(dy, x, mean, rstd, dw, db, n);
            continue;
        }
        mg = (float)(pdp__layers_dot(dy, io->w, n) / (double)n);
        mgx = (float)(pdp__layers_dot3(dy, io->w, x, mean, n) * (double)rstd / (double)n);
        pdp__layers_norm_dx_wgrad(dy, io->w, x, mean, rstd, mg, mgx, io->dx + s * n, dw, db, n);
    }
}

/* The intra-op threads split the forward by rows (each row whole) and the backward by
   chunks of rows (pdp__layers_chunks: dx on the way, dw and db into the chunk's share, in
   one pass over dy and x), so the bits do not depend on the thread count; small layers
   (under PDP__ELEMWISE_PAR_MIN floats) stay on the caller. */
typedef struct pdp__ln_job {
    const pdp__layer *l;
    const pdp__layer_io *io;
    int64_t rows, n, chunks;
} pdp__ln_job;

PDP__PRIVATE void pdp__layernorm_forward_part(void *arg, int i, int parts)
{
    const pdp__ln_job *j = (const pdp__ln_job *)arg;
    pdp__layernorm_forward_rows(j->l, j->io, j->n, j->rows * i / parts,
                                j->rows * (i + 1) / parts);
}

/* chunks [c0, c1) of the k: chunk c holds rows [rows c / k, rows (c + 1) / k), and its share
   is io->work's 2 n floats from 2 n c (dw's, then db's) */
PDP__PRIVATE void pdp__layernorm_backward_part(void *arg, int i, int parts)
{
    const pdp__ln_job *j = (const pdp__ln_job *)arg;
    int64_t k = j->chunks, c, c0 = k * i / parts, c1 = k * (i + 1) / parts;
    for (c = c0; c < c1; c++) {
        float *dw = j->io->dw, *db = j->io->db;
        if (k > 1) {
            dw = j->io->work + 2 * j->n * c;
            db = dw + j->n;
            memset(dw, 0, (size_t)(2 * j->n) * sizeof(float));
        }
        pdp__layernorm_backward_rows(j->io, j->n, j->rows * c / k, j->rows * (c + 1) / k, dw, db);
    }
}

PDP__PRIVATE pdp_status pdp__layernorm_forward(const pdp__layer *l, const pdp__layer_io *io)
{
    pdp__ln_job j;
    j.l = l;
    j.io = io;
    j.rows = pdp__layer_rows(l, io->batch);
    j.n = l->in_count * io->batch / j.rows;
    pdp__parallel_for(pdp__layers_parts(j.rows, j.n, j.rows), pdp__layernorm_forward_part,
                      &j);
    return PDP_OK;
}

PDP__PRIVATE pdp_status pdp__layernorm_backward(const pdp__layer *l, const pdp__layer_io *io)
{
    pdp__ln_job j;
    int64_t c;
    j.l = l;
    j.io = io;
    j.rows = pdp__layer_rows(l, io->batch);
    j.n = l->in_count * io->batch / j.rows;
    j.chunks = pdp__layers_chunks(j.rows, j.n);
    pdp__parallel_for(pdp__layers_parts(j.rows, j.n, j.chunks), pdp__layernorm_backward_part,
                      &j);
    for (c = 0; j.chunks > 1 && c < j.chunks; c++) /* the shares, in chunk order */
        pdp__layers_norm_add_share(io->work + 2 * j.n * c, io->dw, io->db, j.n);
    return PDP_OK;
}

#ifdef PDP_CUDA
PDP__PRIVATE pdp_status pdp__layernorm_cuda_forward(const pdp__layer *l, const pdp__layer_io *io)
{
    int64_t rows = pdp__layer_rows(l, io->batch);
    return pdp_cudak_layernorm_fwd(io->device.ordinal, io->x, io->w, io->b, io->y, io->saved,
                                   rows, l->in_count * io->batch / rows, l->eps);
}

PDP__PRIVATE pdp_status pdp__layernorm_cuda_backward(const pdp__layer *l, const pdp__layer_io *io)
{
    int64_t rows = pdp__layer_rows(l, io->batch);
    return pdp_cudak_layernorm_bwd(io->device.ordinal, io->x, io->w, io->dy, io->saved, io->dw,
                                   io->db, io->dx, rows, l->in_count * io->batch / rows);
}
#endif

/* ---- layers: Flatten ----
   A view (PDP__LAYER_VIEW): model.c never calls these; they copy, should anything
   else. */

PDP__PRIVATE pdp_status pdp__flatten_setup(pdp__layer *l, pdp__param_shapes *ps, const char *in)
{
    (void)ps, (void)in;
    l->out_ndim = 1;
    l->out_shape[0] = l->in_count;
    l->out_shape[1] = l->out_shape[2] = 1;
    return PDP_OK;
}

PDP__PRIVATE pdp_status pdp__flatten_forward(const pdp__layer *l, const pdp__layer_io *io)
{
    if (io->y != io->x) memcpy(io->y, io->x, (size_t)(io->batch * l->in_count) * sizeof(float));
    return PDP_OK;
}

PDP__PRIVATE pdp_status pdp__flatten_backward(const pdp__layer *l, const pdp__layer_io *io)
{
    if (io->dx && io->dx != io->dy)
        memcpy(io->dx, io->dy, (size_t)(io->batch * l->in_count) * sizeof(float));
    return PDP_OK;
}

#ifdef PDP_CUDA
PDP__PRIVATE pdp_status pdp__flatten_cuda_forward(const pdp__layer *l, const pdp__layer_io *io)
{
    int dev = io->device.ordinal;
    if (io->y == io->x) return PDP_OK;
    return pdp_cudak_memcpy(dev, io->y, dev, io->x,
                            (size_t)(io->batch * l->in_count) * sizeof(float));
}

PDP__PRIVATE pdp_status pdp__flatten_cuda_backward(const pdp__layer *l, const pdp__layer_io *io)
{
    int dev = io->device.ordinal;
    if (!io->dx || io->dx == io->dy) return PDP_OK;
    return pdp_cudak_memcpy(dev, io->dx, dev, io->dy,
                            (size_t)(io->batch * l->in_count) * sizeof(float));
}
#endif
