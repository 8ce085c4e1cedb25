/* gemm: single-precision matrix product, C = alpha * op(A) * op(B) + beta * C.

   Row-major, op(X) = X or X^T, all four layouts. The structure is the one of
   Goto and van de Geijn, "Anatomy of high-performance matrix multiplication"
   (ACM TOMS 34(3), 2008) and of BLIS (Van Zee and van de Geijn, 2015):

     for each NC-wide block of columns       (jc)
       for each KC-deep block of k           (pc)   pack op(B) block, KC x NC  (L2/L3)
         for each MR-tall row panel          (ir)   pack op(A) panel, MR x KC  (L1)
           for each NR-wide column panel     (jr)   micro-kernel: MR x NR tile of C

   The A panel stays in L1 while the B block streams past it (128 bytes of B per
   16 FMAs on AVX-512, well within L2 or even L3 bandwidth), so the A panel is
   packed right before use and there is no MC level.
   The micro-kernel keeps an MR x NR tile of C in registers and adds one rank-1
   update per k: NR floats of packed B are loaded, MR floats of packed A are
   broadcast, MR * NR / VL fused multiply-adds. Kernels by instruction set:
   AVX-512F 8 x 32 (16 zmm accumulators), AVX2+FMA 6 x 16 (12 ymm), and portable
   C 4 x 16 (what -DPDP_NO_SIMD or a plain x86-64 target gets). Packing pads
   partial panels with zeros, so the kernel always runs full tiles and masks only
   its stores. Packing a source that is contiguous in k (A in NN and NT, B in NT
   and TT) is a transpose, done 8 x 8 in AVX registers when AVX is there. With
   -DPDP_CBLAS the whole call goes to cblas_sgemm instead.

   Invariants:
   - Determinism. Every element of C is computed by exactly one thread, as the
     same chain of FMAs over k (in KC blocks whose bounds depend only on k), and
     the tile grid is anchored at row 0 and column 0 whatever the split. So the
     bits do not depend on the thread count, and a caller that finds the pool
     busy (and runs everything itself) gets the same bits too.
   - beta == 0: C is written without being read (NaN in C does not leak); so is
     it when k == 0 or alpha == 0 (C = beta * C).
   - Memory: packed panels live in the calling thread's scratch buffer
     (pdp__thread_scratch), which grows on the first call of a given size and is
     reused afterwards; a training loop allocates nothing here after step one.
     If even that allocation fails, the same blocks are packed a panel at a time into a
     buffer on the stack (pdp__gemm_on_stack): slower, the same bits. */

#include "internal.h"

#if defined(__cplusplus)
#  define PDP__GEMM_RESTRICT PDP__RESTRICT
#else
#  define PDP__GEMM_RESTRICT restrict
#endif

/* C = beta C: a product with nothing to add (k == 0 or alpha == 0); with beta == 0, C
   is written without being read. pdp_gemm_bf16 shares it. */
PDP__PRIVATE void pdp__gemm_scale_c(int64_t m, int64_t n, float beta, float *c, int64_t ldc)
{
    int64_t i, j;
    for (i = 0; i < m; i++) {
        float *ci = c + i * ldc;
        for (j = 0; j < n; j++) ci[j] = beta != 0.0f ? beta * ci[j] : 0.0f;
    }
}

/* ---- gemm: bf16 rounding ----
   pdp__bf16_round_u32 on vectors: pdp__sgemm_bf16 rounds its operands with it as it packs
   them (section "packing"), and Conv2d rounds its padded image and dy with
   pdp__gemm_round16 (a pass, in every build: with PDP_CBLAS too). */

#if !defined(PDP_NO_SIMD) && (defined(__AVX__) || defined(__AVX512F__))
#  include <immintrin.h>
#endif

#if !defined(PDP_NO_SIMD) && defined(__AVX512F__)
/* pdp__bf16_round_u32 on 16 lanes, in 7 operations where its plain form takes 10: t = u +
   0x7fff, plus 1 where bit 16 (the kept half's last bit) is set; a NaN's t is u with the
   quiet bit; then the low half cleared. */
static inline PDP__ALWAYS_INLINE __m512i pdp__gemm_round_zmm(__m512i u)
{
    const __m512i abs = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
    const __m512i half = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1);
    const __m512i top = _mm512_set1_epi32((int)0xffff0000u), quiet = _mm512_set1_epi32(0x00400000);
    const __m512i bit16 = _mm512_set1_epi32(0x10000);
    __m512i t = _mm512_add_epi32(u, half);
    t = _mm512_mask_add_epi32(t, _mm512_test_epi32_mask(u, bit16), t, one);
    t = _mm512_mask_or_epi32(t, _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs), inf), u, quiet);
    return _mm512_and_si512(t, top);
}

/* lo in the low half, hi in the high half (the masked form, its mask full: the plain one's
   undefined source trips gcc's -Wmaybe-uninitialized, as gemm_bf16.c's PDP__BF16_HALF). */
static inline PDP__ALWAYS_INLINE __m512i pdp__gemm_join(__m256i lo, __m256i hi)
{
    __m512i w = _mm512_castsi256_si512(lo);
    return _mm512_mask_inserti64x4(w, (__mmask8)0xff, w, hi, 1);
}
#endif

#if !defined(PDP_NO_SIMD) && defined(__AVX2__)
/* pdp__bf16_round_u32 on 8 lanes. */
static inline PDP__ALWAYS_INLINE __m256 pdp__gemm_round_ymm(__m256 v)
{
    const __m256i half = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1);
    const __m256i top = _mm256_set1_epi32((int)0xffff0000u), quiet = _mm256_set1_epi32(0x00400000);
    __m256i u = _mm256_castps_si256(v);
#  if defined(__AVX512VL__) /* pdp__gemm_round_zmm's 7 operations */
    const __m256i abs = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
    const __m256i bit16 = _mm256_set1_epi32(0x10000);
    __m256i t = _mm256_add_epi32(u, half);
    t = _mm256_mask_add_epi32(t, _mm256_test_epi32_mask(u, bit16), t, one);
    t = _mm256_mask_or_epi32(t, _mm256_cmpgt_epi32_mask(_mm256_and_si256(u, abs), inf), u, quiet);
    return _mm256_castsi256_ps(_mm256_and_si256(t, top));
#  else
    /* 8 operations (the plain form's 10 in integers): the NaN test is the unordered
       compare, the low half cleared once, after the select */
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), one);
    __m256 r = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_add_epi32(u, half), lsb));
    __m256 q = _mm256_castsi256_ps(_mm256_or_si256(u, quiet));
    __m256 t = _mm256_blendv_ps(r, q, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    return _mm256_and_ps(t, _mm256_castsi256_ps(top));
#  endif
}
#endif

/* p[0, n) rounded to bf16 in place (pdp__bf16_round_u32 on the bits: one select, so the
   loop vectorises). */
PDP__PRIVATE void pdp__gemm_round16(float *p, int64_t n)
{
#if !defined(PDP_NO_SIMD) && defined(__AVX512F__)
    /* 16 at a time in zmm (gcc vectorises the loop below in ymm at -march=native: twice
       the instructions) */
    for (; n >= 16; n -= 16, p += 16)
        _mm512_storeu_si512((void *)p, pdp__gemm_round_zmm(_mm512_loadu_si512((const void *)p)));
#endif
    PDP__FOR_BLOCKED(i, n, {
        uint32_t u;
        memcpy(&u, p + i, sizeof u);
        u = pdp__bf16_round_u32(u);
        memcpy(p + i, &u, sizeof u);
    });
}

/* d[0, n) = s[0, n), rounded to bf16 when round16 (pdp__bf16_round_u32's bits). */
static inline PDP__ALWAYS_INLINE void pdp__gemm_copy(float *d, const float *s, int n, int round16)
{
    int i = 0;
    if (!round16) {
        memcpy(d, s, (size_t)n * sizeof(float));
        return;
    }
#if !defined(PDP_NO_SIMD) && defined(__AVX512F__)
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_si512((void *)(d + i),
                            pdp__gemm_round_zmm(_mm512_loadu_si512((const void *)(s + i))));
    if (i < n) { /* the last 1-15 (an A panel's MR = 8): masked, not one by one */
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_epi32((void *)(d + i), m,
                                 pdp__gemm_round_zmm(_mm512_maskz_loadu_epi32(m, s + i)));
        return;
    }
#elif !defined(PDP_NO_SIMD) && defined(__AVX2__)
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(d + i, pdp__gemm_round_ymm(_mm256_loadu_ps(s + i)));
#endif
    for (; i < n; i++) d[i] = pdp__bf16_round(s[i]);
}

#if defined(PDP_CBLAS)
#  include <cblas.h>

PDP_API void pdp_sgemm(pdp_trans ta, pdp_trans tb, int64_t m, int64_t n, int64_t k, float alpha,
                       const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                       float *c, int64_t ldc)
{
    if (m <= 0 || n <= 0) return;
    cblas_sgemm(CblasRowMajor, ta == PDP_TRANS ? CblasTrans : CblasNoTrans,
                tb == PDP_TRANS ? CblasTrans : CblasNoTrans, (int)m, (int)n, (int)k, alpha, a,
                (int)PDP__MAX(lda, 1), b, (int)PDP__MAX(ldb, 1), beta, c, (int)ldc);
}

/* Plain loops: with PDP_CBLAS, Conv2d takes its im2col path and never calls this. */
PDP__PRIVATE void pdp__sgemm_rows(pdp_trans ta, pdp_trans tb, int64_t m, int64_t n, int64_t k,
                                  float alpha, const float *a, int64_t lda, const float *b,
                                  const int64_t *brow, float beta, float *c, int64_t ldc)
{
    int64_t i, j, p;
    for (i = 0; i < m; i++)
        for (j = 0; j < n; j++) {
            float acc = 0.0f;
            for (p = 0; p < k; p++)
                acc += (ta == PDP_NO_TRANS ? a[i * lda + p] : a[p * lda + i]) *
                       (tb == PDP_NO_TRANS ? b[brow[p] + j] : b[brow[j] + p]);
            c[i * ldc + j] = alpha * acc + (beta != 0.0f ? beta * c[i * ldc + j] : 0.0f);
        }
}

/* The work an m x n product does per k: m n here (see the other definition). */
PDP__PRIVATE int64_t pdp__gemm_tiles(int64_t m, int64_t n) { return m * n; }

PDP__PRIVATE void pdp__sgemm_arows(pdp_trans tb, int64_t m, int64_t n, int64_t k, float alpha,
                                   const float *a, const int64_t *arow, const float *b, int64_t ldb,
                                   float beta, float *c, int64_t ldc)
{
    int64_t i, j, p;
    for (i = 0; i < m; i++)
        for (j = 0; j < n; j++) {
            float acc = 0.0f;
            for (p = 0; p < k; p++)
                acc += a[arow[i] + p] * (tb == PDP_NO_TRANS ? b[p * ldb + j] : b[j * ldb + p]);
            c[i * ldc + j] = alpha * acc + (beta != 0.0f ? beta * c[i * ldc + j] : 0.0f);
        }
}

#else /* our own */

/* ---- gemm: micro-kernels ---- */

/* Kernel contract: kc >= 1; ap holds kc groups of MR floats, bp kc groups of NR
   floats (both packed, 64-byte aligned). Writes the top-left mr x nr of the tile
   to c (row stride ldc) as alpha * acc + beta * c, not reading c when beta == 0. */

#if !defined(PDP_NO_SIMD) && defined(__AVX512F__)
#  include <immintrin.h>
#  define PDP__GEMM_KERNEL "avx512 8x32"
#  define PDP__GEMM_MR 8
#  define PDP__GEMM_NV 2
#  define PDP__GEMM_VL 16

/* Lane masks of a tile's nr valid columns, one per vector of a B row (nv of them). */
static inline PDP__ALWAYS_INLINE PDP__KERNEL_UNSANITIZED void pdp__gemm_col_masks(
    int nr, int nv, __mmask16 *mask)
{
    int v;
    _Pragma("GCC unroll 4") for (v = 0; v < nv; v++) {
        int left = nr - v * PDP__GEMM_VL;
        mask[v] = (__mmask16)(left >= PDP__GEMM_VL ? 0xffff : left <= 0 ? 0 : (1u << left) - 1);
    }
}

/* How every AVX-512 kernel ends: the top-left mr x nr of an MR x nv-vector tile of
   accumulators (acc[i nv + v], nv a constant after inlining) to c (row stride ldc)
   as alpha * acc + beta * c, reading c only when beta != 0; a full tile unmasked.
   Always inlined: a call would take acc's address and keep the accumulators in
   memory. */
static inline PDP__ALWAYS_INLINE PDP__KERNEL_UNSANITIZED void pdp__gemm_store_acc(
    const __m512 *acc, int nv, float *c, int64_t ldc, int mr, int nr, float alpha, float beta)
{
    __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
    __mmask16 mask[4]; /* nv <= 4 */
    int i, v, full = mr == PDP__GEMM_MR && nr == nv * PDP__GEMM_VL;
    pdp__gemm_col_masks(nr, nv, mask);
    _Pragma("GCC unroll 16") for (i = 0; i < PDP__GEMM_MR; i++) {
        float *ci = c + i * ldc;
        if (i >= mr) break;
        _Pragma("GCC unroll 4") for (v = 0; v < nv; v++) {
            __m512 r = _mm512_mul_ps(va, acc[i * nv + v]);
            if (full) {
                if (beta != 0.0f) r = _mm512_fmadd_ps(vb, _mm512_loadu_ps(ci + v * 16), r);
                _mm512_storeu_ps(ci + v * 16, r);
            } else {
                if (beta != 0.0f)
                    r = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(mask[v], ci + v * 16), r);
                _mm512_mask_storeu_ps(ci + v * 16, mask[v], r);
            }
        }
    }
}

/* The MR x NR tile of the packed kernels. */
static inline PDP__ALWAYS_INLINE PDP__KERNEL_UNSANITIZED void pdp__gemm_store_tile(
    __m512 acc[PDP__GEMM_MR][PDP__GEMM_NV], float *c, int64_t ldc, int mr, int nr, float alpha,
    float beta)
{
    pdp__gemm_store_acc(&acc[0][0], PDP__GEMM_NV, c, ldc, mr, nr, alpha, beta);
}

/* The packed kernel on the first nv of the panel's NV vectors and its first `rows` rows
   (constants after inlining; mr <= rows). */
static inline PDP__ALWAYS_INLINE PDP__KERNEL_UNSANITIZED void pdp__gemm_kernel_nv(
    int64_t kc, const float *PDP__GEMM_RESTRICT ap, const float *PDP__GEMM_RESTRICT bp, float *c,
    int64_t ldc, int mr, int nr, float alpha, float beta, const int nv, const int rows)
{
    __m512 acc[PDP__GEMM_MR * PDP__GEMM_NV];
    int i, v;
    int64_t p;
    _Pragma("GCC unroll 16") for (i = 0; i < PDP__GEMM_MR; i++) {
        _Pragma("GCC unroll 4") for (v = 0; v < nv; v++) acc[i * nv + v] = _mm512_setzero_ps();
    }
    for (p = 0; p < kc; p++) {
        __m512 bv[PDP__GEMM_NV];
        _Pragma("GCC unroll 4") for (v = 0; v < nv; v++) {
            bv[v] = _mm512_load_ps(bp + v * PDP__GEMM_VL);
        }
        _Pragma("GCC unroll 16") for (i = 0; i < rows; i++) {
            __m512 ai = _mm512_set1_ps(ap[i]);
            _Pragma("GCC unroll 4") for (v = 0; v < nv; v++) {
                acc[i * nv + v] = _mm512_fmadd_ps(ai, bv[v], acc[i * nv + v]);
            }
        }
        ap += PDP__GEMM_MR;
        bp += PDP__GEMM_NV * PDP__GEMM_VL;
    }
    pdp__gemm_store_acc(acc, nv, c, ldc, mr, nr, alpha, beta);
}

/* A tile of at most 16 columns (a classifier's 10: its forward, 512 x 10 over k 512) or 4
   rows (its dW's last panel, 10 = 8 + 2 rows) runs the loop of its vectors and rows alone:
   the full tile's spent half its FMAs or more on what is not stored. Each element's FMA
   chain is the full tile's (same bits). */
PDP__PRIVATE PDP__KERNEL_UNSANITIZED void pdp__gemm_kernel(
    int64_t kc, const float *PDP__GEMM_RESTRICT ap, const float *PDP__GEMM_RESTRICT bp, float *c,
    int64_t ldc, int mr, int nr, float alpha, float beta)
{
    enum { HALF = PDP__GEMM_MR / 2 };
    if (mr > HALF && nr > PDP__GEMM_VL)
        pdp__gemm_kernel_nv(kc, ap, bp, c, ldc, mr, nr, alpha, beta, PDP__GEMM_NV, PDP__GEMM_MR);
    else if (mr > HALF)
        pdp__gemm_kernel_nv(kc, ap, bp, c, ldc, mr, nr, alpha, beta, 1, PDP__GEMM_MR);
    else if (nr > PDP__GEMM_VL)
        pdp__gemm_kernel_nv(kc, ap, bp, c, ldc, mr, nr, alpha, beta, PDP__GEMM_NV, HALF);
    else
        pdp__gemm_kernel_nv(kc, ap, bp, c, ldc, mr, nr, alpha, beta, 1, HALF);
}

/* The same tile with B read in place instead of packed: row p of the tile's B is
   the nr floats at b + brow[p] (a gathered B, pdp__sgemm_rows without transpose,
   whose rows are runs of a small image that stays in cache). Packing such a B
   costs as much as a tenth of the product when m is small (Conv2d's O rows), and
   this skips it. Masked loads read no float past column nr; same FMA chain as the
   packed kernel, so the same bits. */
#  define PDP__GEMM_DIRECT_B 1
PDP__PRIVATE PDP__KERNEL_UNSANITIZED void pdp__gemm_kernel_rows(
    int64_t kc, const float *PDP__GEMM_RESTRICT ap, const float *b, const int64_t *brow, float *c,
    int64_t ldc, int mr, int nr, float alpha, float beta)
{
    __m512 acc[PDP__GEMM_MR][PDP__GEMM_NV];
    __mmask16 mask[PDP__GEMM_NV];
    int i, v;
    int64_t p;
    pdp__gemm_col_masks(nr, PDP__GEMM_NV, mask);
    _Pragma("GCC unroll 16") for (i = 0; i < PDP__GEMM_MR; i++) {
        _Pragma("GCC unroll 4") for (v = 0; v < PDP__GEMM_NV; v++) acc[i][v] = _mm512_setzero_ps();
    }
    for (p = 0; p < kc; p++) {
        const float *row = b + brow[p];
        __m512 bv[PDP__GEMM_NV];
        _Pragma("GCC unroll 4") for (v = 0; v < PDP__GEMM_NV; v++) {
            bv[v] = _mm512_maskz_loadu_ps(mask[v], row + v * PDP__GEMM_VL);
        }
        _Pragma("GCC unroll 16") for (i = 0; i < PDP__GEMM_MR; i++) {
            __m512 ai = _mm512_set1_ps(ap[i]);
            _Pragma("GCC unroll 4") for (v = 0; v < PDP__GEMM_NV; v++) {
                acc[i][v] = _mm512_fmadd_ps(ai, bv[v], acc[i][v]);
            }
        }
        ap += PDP__GEMM_MR;
    }
    pdp__gemm_store_tile(acc, c, ldc, mr, nr, alpha, beta);
}

/* The same tile with A read in place: row i of the tile's A is a8[i] (a gathered
   A, pdp__sgemm_arows; rows past mr repeat row 0 and are never stored), each
   element broadcast straight from its row, as the packed kernel broadcasts it
   from the panel. Same FMA chain, so the same bits. */
PDP__PRIVATE PDP__KERNEL_UNSANITIZED void pdp__gemm_kernel_arows(
    int64_t kc, const float *const *a8, const float *PDP__GEMM_RESTRICT bp, float *c, int64_t ldc,
    int mr, int nr, float alpha, float beta)
{
    __m512 acc[PDP__GEMM_MR][PDP__GEMM_NV];
    const float *r[PDP__GEMM_MR];
    int i, v;
    int64_t p;
    for (i = 0; i < PDP__GEMM_MR; i++) r[i] = a8[i];
    _Pragma("GCC unroll 16") for (i = 0; i < PDP__GEMM_MR; i++) {
        _Pragma("GCC unroll 4") for (v = 0; v < PDP__GEMM_NV; v++) acc[i][v] = _mm512_setzero_ps();
    }
    for (p = 0; p < kc; p++) {
        __m512 bv[PDP__GEMM_NV];
        _Pragma("GCC unroll 4") for (v = 0; v < PDP__GEMM_NV; v++) {
            bv[v] = _mm512_load_ps(bp + v * PDP__GEMM_VL);
        }
        _Pragma("GCC unroll 16") for (i = 0; i < PDP__GEMM_MR; i++) {
            __m512 ai = _mm512_set1_ps(r[i][p]);
            _Pragma("GCC unroll 4") for (v = 0; v < PDP__GEMM_NV; v++) {
                acc[i][v] = _mm512_fmadd_ps(ai, bv[v], acc[i][v]);
            }
        }
        bp += PDP__GEMM_NV * PDP__GEMM_VL;
    }
    pdp__gemm_store_tile(acc, c, ldc, mr, nr, alpha, beta);
}

#elif !defined(PDP_NO_SIMD) && defined(__AVX2__) && defined(__FMA__)
#  include <immintrin.h>
#  define PDP__GEMM_KERNEL "avx2 6x16"
#  define PDP__GEMM_MR 6
#  define PDP__GEMM_NV 2
#  define PDP__GEMM_VL 8

PDP__PRIVATE PDP__KERNEL_UNSANITIZED void pdp__gemm_kernel(
    int64_t kc, const float *PDP__GEMM_RESTRICT ap, const float *PDP__GEMM_RESTRICT bp, float *c,
    int64_t ldc, int mr, int nr, float alpha, float beta)
{
    __m256 acc[PDP__GEMM_MR][PDP__GEMM_NV];
    __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
    __m256i mask[PDP__GEMM_NV];
    int i, v, full = mr == PDP__GEMM_MR && nr == PDP__GEMM_NV * PDP__GEMM_VL;
    int64_t p;
    _Pragma("GCC unroll 16") for (i = 0; i < PDP__GEMM_MR; i++) {
        _Pragma("GCC unroll 4") for (v = 0; v < PDP__GEMM_NV; v++) acc[i][v] = _mm256_setzero_ps();
    }
    for (p = 0; p < kc; p++) {
        __m256 bv[PDP__GEMM_NV];
        _Pragma("GCC unroll 4") for (v = 0; v < PDP__GEMM_NV; v++) {
            bv[v] = _mm256_load_ps(bp + v * PDP__GEMM_VL);
        }
        _Pragma("GCC unroll 16") for (i = 0; i < PDP__GEMM_MR; i++) {
            __m256 ai = _mm256_broadcast_ss(ap + i);
            _Pragma("GCC unroll 4") for (v = 0; v < PDP__GEMM_NV; v++) {
                acc[i][v] = _mm256_fmadd_ps(ai, bv[v], acc[i][v]);
            }
        }
        ap += PDP__GEMM_MR;
        bp += PDP__GEMM_NV * PDP__GEMM_VL;
    }
    _Pragma("GCC unroll 4") for (v = 0; v < PDP__GEMM_NV; v++) {
        int left = nr - v * PDP__GEMM_VL;
        mask[v] =
            _mm256_cmpgt_epi32(_mm256_set1_epi32(left), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    }
    _Pragma("GCC unroll 16") for (i = 0; i < PDP__GEMM_MR; i++) {
        float *ci = c + i * ldc;
        if (i >= mr) break;
        _Pragma("GCC unroll 4") for (v = 0; v < PDP__GEMM_NV; v++) {
            __m256 r = _mm256_mul_ps(va, acc[i][v]);
            if (full) {
                if (beta != 0.0f) r = _mm256_fmadd_ps(vb, _mm256_loadu_ps(ci + v * 8), r);
                _mm256_storeu_ps(ci + v * 8, r);
            } else {
                if (beta != 0.0f)
                    r = _mm256_fmadd_ps(vb, _mm256_maskload_ps(ci + v * 8, mask[v]), r);
                _mm256_maskstore_ps(ci + v * 8, mask[v], r);
            }
        }
    }
}

#else
#  define PDP__GEMM_KERNEL "portable 4x16"
#  define PDP__GEMM_MR 4
#  define PDP__GEMM_NV 1
#  define PDP__GEMM_VL 16

PDP__PRIVATE PDP__KERNEL_UNSANITIZED void pdp__gemm_kernel(
    int64_t kc, const float *PDP__GEMM_RESTRICT ap, const float *PDP__GEMM_RESTRICT bp, float *c,
    int64_t ldc, int mr, int nr, float alpha, float beta)
{
    float acc[PDP__GEMM_MR][PDP__GEMM_VL];
    int i, j;
    int64_t p;
    memset(acc, 0, sizeof acc);
    for (p = 0; p < kc; p++) {
        for (i = 0; i < PDP__GEMM_MR; i++) {
            float ai = ap[i];
            for (j = 0; j < PDP__GEMM_VL; j++) acc[i][j] += ai * bp[j];
        }
        ap += PDP__GEMM_MR;
        bp += PDP__GEMM_VL;
    }
    for (i = 0; i < mr; i++) {
        float *ci = c + i * ldc;
        for (j = 0; j < nr; j++) {
            float r = alpha * acc[i][j];
            ci[j] = beta != 0.0f ? r + beta * ci[j] : r;
        }
    }
}
#endif

#define PDP__GEMM_NR (PDP__GEMM_NV * PDP__GEMM_VL)

/* Blocking. KC: depth of one packed block (k is cut into equal blocks of at most
   KC). NC: columns of packed B per block. Both fixed, so the summation order never
   depends on the thread count. 512 and 512 measured best on Zen 4 (384 and 256 are
   within noise; see bench/gemm.c). */
#ifndef PDP__GEMM_KC
#  define PDP__GEMM_KC 512
#endif
#ifndef PDP__GEMM_NC
#  define PDP__GEMM_NC 512
#endif
/* Products below this many flops stay on the calling thread. With the pool's spin a
   hand-off costs a few microseconds, less than half of a 1.3 MFLOP product (the MLP's
   10-class layer at batch 128, ~40 us on one core): at 1e6 rather than 4e6 the MLP
   784-512-512-10 step at batch 128 on 2 threads was faster in 11 of 14 alternating
   runs, either order first, by a median of 9% (Zen 4, a noisy host: -17% to +23%). */
#ifndef PDP__GEMM_PAR_FLOPS
#  define PDP__GEMM_PAR_FLOPS 1.0e6
#endif

/* ---- gemm: packing ---- */

/* Packing op(A) with A not transposed, and op(B) with B transposed, is a transpose
   (the source is contiguous in k, the panel wants k-major). With AVX it goes 8 x 8
   at a time through registers; the rest is plain loops.

   pdp__sgemm_bf16 (round16) rounds each value to bf16 as it is packed, with
   pdp__bf16_round_u32's bits (round to nearest even on the 16 bits dropped, a NaN made
   quiet, subnormals rounded like any value), in registers where AVX2 or AVX-512 is:
   the values pass through registers anyway, so the rounding costs a few integer
   operations per vector, where a pass over the packed panels after packing cost 2-22%
   of the MLP's products (one thread, Sapphire Rapids class; most where packing is a
   large share: 10 x 512 x 512, 512 x 10 x 512). */

/* x rounded to bf16 (as an fp32) when round16, else x. */
static inline float pdp__gemm_rounded(float x, int round16)
{
    return round16 ? pdp__bf16_round(x) : x;
}

#if !defined(PDP_NO_SIMD) && defined(__AVX__)
#  define PDP__GEMM_T8 1

/* dst[q * ldd + r] = s[r][p + q] for r, q in [0, 8), rounded to bf16 when round16: on
   AVX-512 two rows of the block at a time in zmm (11 operations per 16 values, where ymm
   takes 20), stored as one zmm into an A panel (ldd 8: the two rows are 16 adjacent
   floats) or as its two halves into a B panel (ldd 32: 13 operations; rounding a
   512 x 512 op(B) of NT as it packs went from 17-19 us over pdp_sgemm's packing to 7-8,
   one Sapphire Rapids class thread, best of 200). */
PDP__PRIVATE void pdp__gemm_transpose8(const float *const *s, int64_t p, float *dst, int64_t ldd,
                                       int round16)
{
    __m256 r0 = _mm256_loadu_ps(s[0] + p), r1 = _mm256_loadu_ps(s[1] + p);
    __m256 r2 = _mm256_loadu_ps(s[2] + p), r3 = _mm256_loadu_ps(s[3] + p);
    __m256 r4 = _mm256_loadu_ps(s[4] + p), r5 = _mm256_loadu_ps(s[5] + p);
    __m256 r6 = _mm256_loadu_ps(s[6] + p), r7 = _mm256_loadu_ps(s[7] + p);
    __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
    __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
    __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
    __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
    __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xee);
    __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xee);
    __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xee);
    __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xee);
    __m256 o[8];
    int q;
    o[0] = _mm256_permute2f128_ps(u0, u4, 0x20), o[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
    o[2] = _mm256_permute2f128_ps(u2, u6, 0x20), o[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
    o[4] = _mm256_permute2f128_ps(u0, u4, 0x31), o[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
    o[6] = _mm256_permute2f128_ps(u2, u6, 0x31), o[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
#  if defined(__AVX512F__)
    if (round16 && ldd == 8) {
        for (q = 0; q < 8; q += 2) {
            _mm512_storeu_si512((void *)(dst + 8 * q),
                                pdp__gemm_round_zmm(pdp__gemm_join(_mm256_castps_si256(o[q]),
                                                                   _mm256_castps_si256(o[q + 1]))));
        }
        return;
    }
    if (round16) { /* a B panel: two rows a zmm too, stored apart */
        for (q = 0; q < 8; q += 2) {
            __m512i r = pdp__gemm_round_zmm(
                pdp__gemm_join(_mm256_castps_si256(o[q]), _mm256_castps_si256(o[q + 1])));
            _mm256_storeu_si256((__m256i *)(void *)(dst + q * ldd),
                                _mm512_maskz_extracti64x4_epi64((__mmask8)0xff, r, 0));
            _mm256_storeu_si256((__m256i *)(void *)(dst + (q + 1) * ldd),
                                _mm512_maskz_extracti64x4_epi64((__mmask8)0xff, r, 1));
        }
        return;
    }
#  endif
#  if defined(__AVX2__)
    if (round16)
        for (q = 0; q < 8; q++) o[q] = pdp__gemm_round_ymm(o[q]);
#  endif
#  if PDP__GEMM_MR == 6
    if (ldd == 6) { /* an A panel of the AVX2 kernel, rows 6 and 7 the zeros row: each of the
                       first 7 stored 8 wide (its 2 lanes past the 6 are the next one's to
                       overwrite), the last as 4 + 2, so nothing lands past the block */
        for (q = 0; q < 7; q++) _mm256_storeu_ps(dst + q * 6, o[q]);
        _mm_storeu_ps(dst + 42, _mm256_castps256_ps128(o[7]));
        _mm_storel_epi64((__m128i *)(void *)(dst + 46),
                         _mm_castps_si128(_mm256_extractf128_ps(o[7], 1)));
        return;
    }
#  endif
    for (q = 0; q < 8; q++) _mm256_storeu_ps(dst + q * ldd, o[q]);
#  if !defined(__AVX2__) /* AVX without its integer half: the 8 x 8 block rounded in L1 */
    if (round16)
        for (q = 0; q < 8; q++) pdp__gemm_round16(dst + q * ldd, 8);
#  endif
}
#else
#  define PDP__GEMM_T8 0
#endif

/* Source row r of a packing routine: src + off[r] with a row-offset table (the
   gathered B of pdp__sgemm_rows), else src + r * lds. */
PDP__PRIVATE const float *pdp__gemm_row(const float *src, int64_t lds, const int64_t *off,
                                        int64_t r)
{
    return off ? src + off[r] : src + r * lds;
}

/* rows x kc of a source contiguous in k (row r at pdp__gemm_row) into
   dst[p * ldd + r], rounded to bf16 when round16; the part of [0, ldd) past `rows` is
   zeroed. With AVX, groups of 8 rows go through pdp__gemm_transpose8, and so does a
   last partial group when the panel has room for 8, its missing rows read from a row of
   zeros (a ragged edge, N = 25 say, would otherwise be packed and zeroed one strided
   float at a time). */
#if PDP__GEMM_T8
static const float pdp__gemm_zeros[PDP__GEMM_KC] = {0};
#endif

PDP__PRIVATE void pdp__gemm_pack_t(const float *src, int64_t lds, const int64_t *off, int rows,
                                   int64_t kc, float *dst, int64_t ldd, int round16)
{
    int r = 0;
    int64_t p;
#if PDP__GEMM_T8 && PDP__GEMM_MR == 6
    if (ldd == 6 && kc <= PDP__GEMM_KC) { /* an A panel of the AVX2 kernel: 8 x 8 blocks of
                                             its 6 rows and 2 of zeros (scalar, rounding
                                             included, it took 3-4 times as long) */
        const float *s[8];
        int i;
        for (i = 0; i < 8; i++)
            s[i] = i < rows ? pdp__gemm_row(src, lds, off, i) : pdp__gemm_zeros;
        for (p = 0; p + 8 <= kc; p += 8) pdp__gemm_transpose8(s, p, dst + p * 6, 6, round16);
        for (; p < kc; p++)
            for (i = 0; i < 6; i++) dst[p * 6 + i] = pdp__gemm_rounded(s[i][p], round16);
        return;
    }
#endif
#if PDP__GEMM_T8
    for (; r + 8 <= ldd && (r + 8 <= rows || (r < rows && kc <= PDP__GEMM_KC)); r += 8) {
        const float *s[8];
        int i;
        for (i = 0; i < 8; i++)
            s[i] = r + i < rows ? pdp__gemm_row(src, lds, off, r + i) : pdp__gemm_zeros;
        for (p = 0; p + 8 <= kc; p += 8)
            pdp__gemm_transpose8(s, p, dst + p * ldd + r, ldd, round16);
        for (; p < kc; p++) {
            for (i = 0; i < 8; i++) dst[p * ldd + r + i] = pdp__gemm_rounded(s[i][p], round16);
        }
    }
    if (r >= rows) { /* the rest of the panel: zero, 8 columns at a time */
        for (; r + 8 <= ldd; r += 8)
            for (p = 0; p < kc; p++) memset(dst + p * ldd + r, 0, 8 * sizeof(float));
    }
#endif
    for (; r < rows; r++) {
        const float *s = pdp__gemm_row(src, lds, off, r);
        for (p = 0; p < kc; p++) dst[p * ldd + r] = pdp__gemm_rounded(s[p], round16);
    }
    for (; r < ldd; r++) {
        for (p = 0; p < kc; p++) dst[p * ldd + r] = 0.0f;
    }
}

/* kc x cols of a source contiguous in the panel's fast index (row p at
   pdp__gemm_row) into dst[p * ldd + j], rounded to bf16 when round16; the part of
   [0, ldd) past `cols` is zeroed. Always inlined with a constant ldd (MR
   or NR), so that a full row is a fixed-size copy the compiler turns into vector
   moves: the plain loop of unknown length stays scalar at -O2 and cost a fifth of
   a 512^3 NN or TN product. */
static inline PDP__ALWAYS_INLINE void pdp__gemm_pack_n(const float *src, int64_t lds,
                                                      const int64_t *off, int cols, int64_t kc,
                                                      float *dst, const int ldd, int round16)
{
    int64_t p = 0;
    int j;
#if !defined(PDP_NO_SIMD) && defined(__AVX512F__)
    if (round16 && ldd == 8 && cols == 8) { /* an A panel: two rows of 8 a zmm */
        for (; p + 2 <= kc; p += 2) {
            __m256i lo = _mm256_loadu_si256((const __m256i *)pdp__gemm_row(src, lds, off, p));
            __m256i hi = _mm256_loadu_si256((const __m256i *)pdp__gemm_row(src, lds, off, p + 1));
            _mm512_storeu_si512((void *)(dst + p * 8), pdp__gemm_round_zmm(pdp__gemm_join(lo, hi)));
        }
    }
#endif
#if !defined(PDP_NO_SIMD) && defined(__AVX2__) && PDP__GEMM_MR == 6
    if (round16 && ldd == 6 && cols == 6) { /* an A panel of the AVX2 kernel: a row's 6 read
                                               masked, stored 8 wide but the last (the next
                                               row overwrites the 2 past) */
        const __m256i six = _mm256_setr_epi32(-1, -1, -1, -1, -1, -1, 0, 0);
        for (; p + 1 < kc; p++) {
            __m256 row = _mm256_maskload_ps(pdp__gemm_row(src, lds, off, p), six);
            _mm256_storeu_ps(dst + p * 6, pdp__gemm_round_ymm(row));
        }
    }
#endif
    if (cols == ldd) {
        for (; p < kc; p++)
            pdp__gemm_copy(dst + p * ldd, pdp__gemm_row(src, lds, off, p), ldd, round16);
        return;
    }
    for (p = 0; p < kc; p++) {
        const float *s = pdp__gemm_row(src, lds, off, p);
        float *d = dst + p * ldd;
        pdp__gemm_copy(d, s, cols, round16);
        for (j = cols; j < ldd; j++) d[j] = 0.0f;
    }
}

/* op(A) rows [0, mr) x columns [0, kc) (a points at op(A)(0, 0)) into ap[p * MR + i],
   rounded to bf16 when round16. */
PDP__PRIVATE void pdp__gemm_pack_a(pdp_trans ta, const float *a, int64_t lda, int mr, int64_t kc,
                                   float *PDP__GEMM_RESTRICT ap, int round16)
{
    if (ta == PDP_NO_TRANS) /* op(A)(i, p) = a[i * lda + p] */
        pdp__gemm_pack_t(a, lda, NULL, mr, kc, ap, PDP__GEMM_MR, round16);
    else if (round16) /* op(A)(i, p) = a[p * lda + i]; round16 a constant to the inlined copy */
        pdp__gemm_pack_n(a, lda, NULL, mr, kc, ap, PDP__GEMM_MR, 1);
    else
        pdp__gemm_pack_n(a, lda, NULL, mr, kc, ap, PDP__GEMM_MR, 0);
}

/* op(B) rows [pc, pc + kc) x columns [jc, jc + nc) into panels of NR columns:
   bp[(j / NR) * kc * NR + p * NR + j % NR], rounded to bf16 when round16. B's storage
   row r starts at b + r * ldb, or at b + brow[r] when the caller gave a row-offset
   table. */
PDP__PRIVATE void pdp__gemm_pack_b(pdp_trans tb, const float *b, int64_t ldb, const int64_t *brow,
                                   int64_t pc, int64_t jc, int64_t kc, int64_t nc,
                                   float *PDP__GEMM_RESTRICT bp, int round16)
{
    int64_t j0;
    for (j0 = 0; j0 < nc; j0 += PDP__GEMM_NR) {
        int nr = (int)PDP__MIN((int64_t)PDP__GEMM_NR, nc - j0);
        int64_t j = jc + j0;
        if (tb == PDP_NO_TRANS && round16) /* op(B)(p, j) = storage row p, element j */
            pdp__gemm_pack_n(b + pc * ldb + j, ldb, NULL, nr, kc, bp + j0 * kc, PDP__GEMM_NR, 1);
        else if (tb == PDP_NO_TRANS)
            pdp__gemm_pack_n(brow ? b + j : b + pc * ldb + j, ldb, brow ? brow + pc : NULL, nr,
                             kc, bp + j0 * kc, PDP__GEMM_NR, 0);
        else /* op(B)(p, j) = storage row j, element p */
            pdp__gemm_pack_t(brow ? b + pc : b + j * ldb + pc, ldb, brow ? brow + j : NULL, nr,
                             kc, bp + j0 * kc, PDP__GEMM_NR, round16);
    }
}

/* ---- gemm: the blocked product on one thread ---- */

enum { PDP__GEMM_ROUND_A = 1, PDP__GEMM_ROUND_B = 2 }; /* pdp__gemm_args.round16 */

typedef struct pdp__gemm_args {
    pdp_trans ta, tb;
    int64_t m, n, k;
    float alpha, beta;
    const float *a, *b;
    const int64_t *brow; /* B's row offsets (pdp__sgemm_rows), or NULL: row r at b + r ldb */
    const int64_t *arow; /* A's row offsets (pdp__sgemm_arows; A not transposed), or NULL */
    float *c;
    int64_t lda, ldb, ldc;
    int64_t kb;   /* depth of each k block (the last may be shorter) */
    int split_n;  /* 1: parts are column ranges; 0: row ranges */
    int round16;  /* pdp__sgemm_bf16: the operands rounded to bf16 as they are packed (never
                     gathered): PDP__GEMM_ROUND_A | PDP__GEMM_ROUND_B, or one of them */
} pdp__gemm_args;

PDP__PRIVATE int64_t pdp__gemm_round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

/* Floats of scratch one part of at most `cols` columns needs. */
PDP__PRIVATE size_t pdp__gemm_scratch_floats(const pdp__gemm_args *g, int64_t cols)
{
    int64_t nc = PDP__MIN((int64_t)PDP__GEMM_NC, pdp__gemm_round_up(cols, PDP__GEMM_NR));
    return (size_t)(g->kb * nc + g->kb * PDP__GEMM_MR);
}

/* Rows [m0, m1) x columns [n0, n1) of C; m0 is a multiple of MR, n0 of NR. */
PDP__PRIVATE void pdp__gemm_block(const pdp__gemm_args *g, int64_t m0, int64_t m1, int64_t n0,
                                  int64_t n1, float *scratch)
{
    int64_t jc, pc, ir, jr;
    int64_t ncmax = PDP__MIN((int64_t)PDP__GEMM_NC, pdp__gemm_round_up(n1 - n0, PDP__GEMM_NR));
    float *bp = scratch, *ap = scratch + g->kb * ncmax;
    for (jc = n0; jc < n1; jc += PDP__GEMM_NC) {
        int64_t nc = PDP__MIN((int64_t)PDP__GEMM_NC, n1 - jc);
        for (pc = 0; pc < g->k; pc += g->kb) {
            int64_t kc = PDP__MIN(g->kb, g->k - pc);
            float beta = pc == 0 ? g->beta : 1.0f;
#if defined(PDP__GEMM_DIRECT_B)
            if (g->brow && g->tb == PDP_NO_TRANS) { /* B read in place */
                for (ir = m0; ir < m1; ir += PDP__GEMM_MR) {
                    int mr = (int)PDP__MIN((int64_t)PDP__GEMM_MR, m1 - ir);
                    const float *asrc = g->ta == PDP_NO_TRANS ? g->a + ir * g->lda + pc
                                                              : g->a + pc * g->lda + ir;
                    pdp__gemm_pack_a(g->ta, asrc, g->lda, mr, kc, ap, 0);
                    for (jr = 0; jr < nc; jr += PDP__GEMM_NR) {
                        int nr = (int)PDP__MIN((int64_t)PDP__GEMM_NR, nc - jr);
                        pdp__gemm_kernel_rows(kc, ap, g->b + jc + jr, g->brow + pc,
                                              g->c + ir * g->ldc + jc + jr, g->ldc, mr, nr,
                                              g->alpha, beta);
                    }
                }
                continue;
            }
#endif
            pdp__gemm_pack_b(g->tb, g->b, g->ldb, g->brow, pc, jc, kc, nc, bp,
                             (g->round16 & PDP__GEMM_ROUND_B) != 0);
            for (ir = m0; ir < m1; ir += PDP__GEMM_MR) {
                int mr = (int)PDP__MIN((int64_t)PDP__GEMM_MR, m1 - ir);
                const float *asrc = g->ta == PDP_NO_TRANS ? g->a + ir * g->lda + pc
                                                          : g->a + pc * g->lda + ir;
                if (g->arow) {
#if defined(PDP__GEMM_DIRECT_B)
                    const float *a8[PDP__GEMM_MR];
                    int i;
                    for (i = 0; i < PDP__GEMM_MR; i++)
                        a8[i] = g->a + g->arow[ir + (i < mr ? i : 0)] + pc;
                    for (jr = 0; jr < nc; jr += PDP__GEMM_NR) {
                        int nr = (int)PDP__MIN((int64_t)PDP__GEMM_NR, nc - jr);
                        pdp__gemm_kernel_arows(kc, a8, bp + jr * kc,
                                               g->c + ir * g->ldc + jc + jr, g->ldc, mr, nr,
                                               g->alpha, beta);
                    }
                    continue;
#else
                    pdp__gemm_pack_t(g->a + pc, 0, g->arow + ir, mr, kc, ap, PDP__GEMM_MR, 0);
#endif
                } else {
                    pdp__gemm_pack_a(g->ta, asrc, g->lda, mr, kc, ap,
                                     (g->round16 & PDP__GEMM_ROUND_A) != 0);
                }
                for (jr = 0; jr < nc; jr += PDP__GEMM_NR) {
                    int nr = (int)PDP__MIN((int64_t)PDP__GEMM_NR, nc - jr);
                    pdp__gemm_kernel(kc, ap, bp + jr * kc, g->c + ir * g->ldc + jc + jr, g->ldc,
                                     mr, nr, g->alpha, beta);
                }
            }
        }
    }
}

/* When the thread's scratch cannot grow: the same blocked product, one NR-column panel at a
   time, packed into a buffer on this stack frame (KC x (NR + MR) floats: 80 KB for the
   AVX-512 kernel). Each element of C is the same chain as pdp__gemm_block's (the panel grid
   is anchored at column 0 either way, and the NC blocking only groups panels), so the bits
   are the ones a run with memory gets; only slower. Not inlined: the frame is this path's
   alone. */
PDP__PRIVATE PDP__NOINLINE void pdp__gemm_on_stack(const pdp__gemm_args *g, int64_t m0,
                                                   int64_t m1, int64_t n0, int64_t n1)
{
    float buf[PDP__GEMM_KC * (PDP__GEMM_NR + PDP__GEMM_MR) + 16];
    float *scratch = (float *)(((uintptr_t)buf + 63) & ~(uintptr_t)63); /* 64-byte aligned */
    int64_t jc;
    PDP_ASSERT(pdp__gemm_scratch_floats(g, PDP__GEMM_NR) <=
               (size_t)PDP__GEMM_KC * (PDP__GEMM_NR + PDP__GEMM_MR));
    for (jc = n0; jc < n1; jc += PDP__GEMM_NR)
        pdp__gemm_block(g, m0, m1, jc, PDP__MIN(n1, jc + PDP__GEMM_NR), scratch);
}

/* ---- gemm: threads ---- */

/* Part i of n: an equal share of the MR-row or NR-column panels. */
PDP__PRIVATE void pdp__gemm_part(void *arg, int i, int n)
{
    const pdp__gemm_args *g = (const pdp__gemm_args *)arg;
    int64_t step = g->split_n ? PDP__GEMM_NR : PDP__GEMM_MR;
    int64_t len = g->split_n ? g->n : g->m;
    int64_t panels = (len + step - 1) / step;
    int64_t lo = PDP__MIN(len, panels * i / n * step),
            hi = PDP__MIN(len, panels * (i + 1) / n * step);
    int64_t m0 = g->split_n ? 0 : lo, m1 = g->split_n ? g->m : hi;
    int64_t n0 = g->split_n ? lo : 0, n1 = g->split_n ? hi : g->n;
    float *scratch;
    if (lo >= hi) return;
    scratch = (float *)pdp__thread_scratch(sizeof(float) * pdp__gemm_scratch_floats(g, n1 - n0));
    if (scratch)
        pdp__gemm_block(g, m0, m1, n0, n1, scratch);
    else
        pdp__gemm_on_stack(g, m0, m1, n0, n1);
}

/* pdp_sgemm with B's storage rows at b + brow[r] (brow non-NULL) or b + r ldb; round16:
   the operands rounded to bf16 as they are packed (pdp__sgemm_bf16, _bf16_b). */
PDP__PRIVATE void pdp__gemm_run(pdp_trans ta, pdp_trans tb, int64_t m, int64_t n, int64_t k,
                                float alpha, const float *a, int64_t lda, const int64_t *arow,
                                const float *b, int64_t ldb, const int64_t *brow, float beta,
                                float *c, int64_t ldc, int round16)
{
    pdp__gemm_args g;
    int threads, parts;
    int64_t blocks;
    if (m <= 0 || n <= 0) return;
    PDP_ASSERT(ldc >= n);
    if (k <= 0 || alpha == 0.0f) {
        pdp__gemm_scale_c(m, n, beta, c, ldc);
        return;
    }
    PDP_ASSERT(arow || lda >= (ta == PDP_NO_TRANS ? k : m));
    PDP_ASSERT(brow || ldb >= (tb == PDP_NO_TRANS ? n : k));
    PDP_ASSERT(!round16 || (!arow && !brow)); /* the gathered kernels read in place */
    g.round16 = round16;
    g.ta = ta;
    g.tb = tb;
    g.m = m;
    g.n = n;
    g.k = k;
    g.alpha = alpha;
    g.beta = beta;
    g.a = a;
    g.b = b;
    g.brow = brow;
    g.arow = arow;
    g.c = c;
    g.lda = lda;
    g.ldb = ldb;
    g.ldc = ldc;
    blocks = (k + PDP__GEMM_KC - 1) / PDP__GEMM_KC;
    g.kb = (k + blocks - 1) / blocks; /* equal blocks, depends on k only */

    /* Threads: one part per thread, along C's longer side (rows or columns, counted in
       whole panels) unless it has fewer panels than threads and the other more. A
       column split has every thread pack all of op(A) (m x k) and its share of op(B), a
       row split the reverse: the longer side's split reads the larger operand once
       (the per-thread copy is of the smaller one). GPT's activations (m = 2048 tokens)
       against 384-wide weights, on 2 threads, went from 1.80-1.85x one thread's speed
       split by columns to 1.97-2.0x split by rows (Sapphire Rapids, 2 cores). */
    threads = pdp__threads_for_caller();
    if (2.0 * (double)m * (double)n * (double)k < PDP__GEMM_PAR_FLOPS) threads = 1;
    {
        int64_t npan = (n + PDP__GEMM_NR - 1) / PDP__GEMM_NR;
        int64_t mpan = (m + PDP__GEMM_MR - 1) / PDP__GEMM_MR;
        g.split_n = npan * PDP__GEMM_NR >= mpan * PDP__GEMM_MR
                        ? npan >= (int64_t)threads || npan >= mpan
                        : mpan < (int64_t)threads && npan > mpan;
        parts = (int)PDP__MIN((int64_t)threads, g.split_n ? npan : mpan);
    }
    pdp__parallel_for(parts, pdp__gemm_part, &g);
}

PDP_API void pdp_sgemm(pdp_trans ta, pdp_trans tb, int64_t m, int64_t n, int64_t k, float alpha,
                       const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                       float *c, int64_t ldc)
{
    pdp__gemm_run(ta, tb, m, n, k, alpha, a, lda, NULL, b, ldb, NULL, beta, c, ldc, 0);
}

/* pdp_sgemm on op(A) and op(B) rounded to bf16 (pdp__bf16_round_u32: subnormals rounded
   like any value, not flushed), the rounding done on the packed panels (the operands
   are not written): pdp_gemm_bf16's path PDP_BF16_PATH_SGEMM. Products of two bf16
   values are exact in fp32 (unless they underflow), so each element is pdp_sgemm's
   FMA chain over the exact products: the same blocking, threads and bits rules. */
PDP__PRIVATE void pdp__sgemm_bf16(pdp_trans ta, pdp_trans tb, int64_t m, int64_t n, int64_t k,
                                  float alpha, const float *a, int64_t lda, const float *b,
                                  int64_t ldb, float beta, float *c, int64_t ldc)
{
    pdp__gemm_run(ta, tb, m, n, k, alpha, a, lda, NULL, b, ldb, NULL, beta, c, ldc,
                  PDP__GEMM_ROUND_A | PDP__GEMM_ROUND_B);
}

/* pdp__sgemm_bf16 where op(A) holds bf16 values already (the caller rounded it, by
   construction: Linear's dY, rounded by its ReLU's backward pass): only op(B) is rounded
   as it is packed. Rounding is idempotent, so the bits are pdp__sgemm_bf16's; the
   packing of op(A) is pdp_sgemm's (a transpose in NN: rounding there cost 12-20 us per
   512 x 512 over fp32's packing, one Sapphire Rapids class thread). */
PDP__PRIVATE void pdp__sgemm_bf16_b(pdp_trans ta, pdp_trans tb, int64_t m, int64_t n, int64_t k,
                                    float alpha, const float *a, int64_t lda, const float *b,
                                    int64_t ldb, float beta, float *c, int64_t ldc)
{
    pdp__gemm_run(ta, tb, m, n, k, alpha, a, lda, NULL, b, ldb, NULL, beta, c, ldc,
                  PDP__GEMM_ROUND_B);
}

/* ---- gemm: gathered B ----
   pdp_sgemm whose B rows are anywhere: storage row r of B starts at b + brow[r], so
   op(B)(p, j) = b[brow[p] + j] (tb == PDP_NO_TRANS) or b[brow[j] + p] (PDP_TRANS).
   Conv2d's implicit im2col: row (c, ki, kj) of a sample's column matrix is one
   contiguous run of the zero-padded input, so the B packing reads the input itself
   and the column matrix is never written. Same blocking, threads and bits as
   pdp_sgemm on the materialised B. */

PDP__PRIVATE void pdp__sgemm_rows(pdp_trans ta, pdp_trans tb, int64_t m, int64_t n, int64_t k,
                                  float alpha, const float *a, int64_t lda, const float *b,
                                  const int64_t *brow, float beta, float *c, int64_t ldc)
{
    pdp__gemm_run(ta, tb, m, n, k, alpha, a, lda, NULL, b, 0, brow, beta, c, ldc, 0);
}

/* The work an m x n product does per k, padded to whole MR x NR tiles: what a
   caller that can compute C or C^T compares to pick the cheaper. */
PDP__PRIVATE int64_t pdp__gemm_tiles(int64_t m, int64_t n)
{
    return pdp__gemm_round_up(m, PDP__GEMM_MR) * pdp__gemm_round_up(n, PDP__GEMM_NR);
}

/* C = alpha A op(B) + beta C with A's storage rows anywhere: row i of A starts at
   a + arow[i] (A not transposed). Conv2d's dW as dW^T = col dy^T, whose A is the
   implicit column matrix: with AVX-512 the kernel broadcasts A straight from the
   padded image, no packing. */
PDP__PRIVATE void pdp__sgemm_arows(pdp_trans tb, int64_t m, int64_t n, int64_t k, float alpha,
                                   const float *a, const int64_t *arow, const float *b, int64_t ldb,
                                   float beta, float *c, int64_t ldc)
{
    pdp__gemm_run(PDP_NO_TRANS, tb, m, n, k, alpha, a, 0, arow, b, ldb, NULL, beta, c, ldc, 0);
}

#if defined(PDP__GEMM_DIRECT_B)
/* ---- gemm: gathered B, columns in runs ----
   C [m, n] = A [m, k] B (alpha 1, beta 0, on the calling thread) where B is gathered
   as in pdp__sgemm_rows and only some of its columns are wanted: logical column
   L = (r runs + u) run + t, for r < rows, u < runs, t < run, is B's column
   r rstride + u ustride + t, and C holds the logical columns only. Conv2d's
   implicit GEMM: samples side by side with bands of padding between them, whose
   columns nobody reads. Each 16-lane vector of a tile is loaded as a few masked
   loads, one per run it meets, so no lane computes a band. Each C element is the
   same FMA chain over k, in the same k blocks, as in pdp__sgemm_rows. */
#  define PDP__GEMM_RUNS 1

/* Its tiles are MR x 48, not MR x 32: each vector of B costs this kernel one to
   three masked, unaligned loads, and three vectors spread them over 24 FMAs a k
   step instead of 16 (24 accumulators, 3 B vectors and a broadcast: 28 of the 32
   zmm registers). Conv2d's 16 -> 32 and 32 -> 16, 5 x 5 on 14 x 14, 8 samples:
   about 98-104 -> 106-109 GFLOP/s on one Zen 4 core (peak 117), best of 7 each. */
#  ifndef PDP__GEMM_RUNS_NV
#    define PDP__GEMM_RUNS_NV 3
#  endif
#  define PDP__GEMM_RUNS_NR (PDP__GEMM_RUNS_NV * PDP__GEMM_VL)

/* segs: the masked loads per vector (a constant after inlining, the rest of the
   masks zero when a vector has fewer), or 0: each vector's own count, nseg[v]. */
static inline PDP__ALWAYS_INLINE PDP__KERNEL_UNSANITIZED void pdp__gemm_kernel_runs_n(
    int64_t kc, const float *PDP__GEMM_RESTRICT ap, const float *b, const int64_t *brow,
    const int64_t *soff, const __mmask16 *smask, const int *nseg, float *c, int64_t ldc, int mr,
    int nr, float beta, const int segs)
{
    __m512 acc[PDP__GEMM_MR][PDP__GEMM_RUNS_NV];
    __mmask16 sm[PDP__GEMM_RUNS_NV][3];
    int64_t so[PDP__GEMM_RUNS_NV][3];
    int i, v, s;
    int64_t p;
    for (v = 0; v < PDP__GEMM_RUNS_NV; v++)
        for (s = 0; s < 3; s++) {
            sm[v][s] = s < nseg[v] ? smask[v * PDP__GEMM_VL + s] : 0;
            so[v][s] = s < nseg[v] ? soff[v * PDP__GEMM_VL + s] : 0;
        }
    _Pragma("GCC unroll 16") for (i = 0; i < PDP__GEMM_MR; i++) {
        _Pragma("GCC unroll 4") for (v = 0; v < PDP__GEMM_RUNS_NV; v++) {
            acc[i][v] = _mm512_setzero_ps();
        }
    }
    for (p = 0; p < kc; p++) {
        const float *row = b + brow[p];
        __m512 bv[PDP__GEMM_RUNS_NV];
        _Pragma("GCC unroll 4") for (v = 0; v < PDP__GEMM_RUNS_NV; v++) {
            if (segs) {
                bv[v] = _mm512_maskz_loadu_ps(sm[v][0], row + so[v][0]);
                _Pragma("GCC unroll 4") for (s = 1; s < segs; s++)
                    bv[v] = _mm512_mask_loadu_ps(bv[v], sm[v][s], row + so[v][s]);
            } else {
                const int64_t *o = soff + v * PDP__GEMM_VL;
                const __mmask16 *mk = smask + v * PDP__GEMM_VL;
                bv[v] = _mm512_maskz_loadu_ps(mk[0], row + o[0]);
                for (s = 1; s < nseg[v]; s++)
                    bv[v] = _mm512_mask_loadu_ps(bv[v], mk[s], row + o[s]);
            }
        }
        _Pragma("GCC unroll 16") for (i = 0; i < PDP__GEMM_MR; i++) {
            __m512 ai = _mm512_set1_ps(ap[i]);
            _Pragma("GCC unroll 4") for (v = 0; v < PDP__GEMM_RUNS_NV; v++) {
                acc[i][v] = _mm512_fmadd_ps(ai, bv[v], acc[i][v]);
            }
        }
        ap += PDP__GEMM_MR;
    }
    /* beta 0 or 1: c = acc or c + acc */
    pdp__gemm_store_acc(&acc[0][0], PDP__GEMM_RUNS_NV, c, ldc, mr, nr, 1.0f, beta);
}

PDP__PRIVATE PDP__KERNEL_UNSANITIZED void pdp__gemm_kernel_runs(
    int64_t kc, const float *PDP__GEMM_RESTRICT ap, const float *b, const int64_t *brow,
    const int64_t *soff, const __mmask16 *smask, const int *nseg, float *c, int64_t ldc, int mr,
    int nr, float beta)
{
    int most = 0, v;
    for (v = 0; v < PDP__GEMM_RUNS_NV; v++) most = PDP__MAX(most, nseg[v]);
    if (most == 1)
        pdp__gemm_kernel_runs_n(kc, ap, b, brow, soff, smask, nseg, c, ldc, mr, nr, beta, 1);
    else if (most == 2)
        pdp__gemm_kernel_runs_n(kc, ap, b, brow, soff, smask, nseg, c, ldc, mr, nr, beta, 2);
    else if (most == 3)
        pdp__gemm_kernel_runs_n(kc, ap, b, brow, soff, smask, nseg, c, ldc, mr, nr, beta, 3);
    else
        pdp__gemm_kernel_runs_n(kc, ap, b, brow, soff, smask, nseg, c, ldc, mr, nr, beta, 0);
}

/* The masked loads of the tile of nr logical columns that starts at column (r, u, t),
   which it advances by nr: vector v's lanes as nseg[v] loads, load s of lane mask
   smask[v VL + s] at B column soff[v VL + s] (lane 0's column). A run is cut into
   vectors' pieces, so each piece is one load unless it continues the last (no
   band between two runs); a vector with no lane keeps one empty load. */
PDP__PRIVATE void pdp__gemm_runs_tile(int nr, int64_t run, int64_t runs, int64_t rstride,
                                      int64_t ustride, int64_t *t, int64_t *u, int64_t *r,
                                      int64_t *soff, __mmask16 *smask, int *nseg)
{
    int64_t end = -1; /* the B column after the last piece's */
    int l = 0, v;
    for (v = 0; v < PDP__GEMM_RUNS_NV; v++) {
        nseg[v] = 1;
        soff[v * PDP__GEMM_VL] = 0;
        smask[v * PDP__GEMM_VL] = 0;
    }
    while (l < nr) {
        int vl = l % PDP__GEMM_VL, vv = l / PDP__GEMM_VL, s = nseg[vv] - 1;
        int len = (int)PDP__MIN(run - *t, (int64_t)PDP__MIN(PDP__GEMM_VL - vl, nr - l));
        int64_t phys = *r * rstride + *u * ustride + *t;
        __mmask16 bits = (__mmask16)(((1u << len) - 1u) << vl);
        if (vl > 0 && phys == end) {
            smask[vv * PDP__GEMM_VL + s] |= bits;
        } else {
            s = vl > 0 ? s + 1 : 0;
            soff[vv * PDP__GEMM_VL + s] = phys - vl;
            smask[vv * PDP__GEMM_VL + s] = bits;
            nseg[vv] = s + 1;
        }
        end = phys + len;
        l += len;
        if ((*t += len) == run) {
            *t = 0;
            if (++*u == runs) {
                *u = 0;
                ++*r;
            }
        }
    }
}

PDP__PRIVATE void pdp__sgemm_runs(int64_t m, int64_t k, const float *a, int64_t lda, const float *b,
                                  const int64_t *brow, int64_t rows, int64_t runs, int64_t run,
                                  int64_t rstride, int64_t ustride, float *c, int64_t ldc)
{
    float ap[PDP__GEMM_KC * PDP__GEMM_MR];
    int64_t soff[PDP__GEMM_RUNS_NR];
    __mmask16 smask[PDP__GEMM_RUNS_NR];
    int nseg[PDP__GEMM_RUNS_NV];
    int64_t n = rows * runs * run, blocks = (k + PDP__GEMM_KC - 1) / PDP__GEMM_KC;
    int64_t kb = (k + blocks - 1) / blocks, pc, ir, L0;
    for (pc = 0; pc < k; pc += kb) {
        int64_t kc = PDP__MIN(kb, k - pc);
        for (ir = 0; ir < m; ir += PDP__GEMM_MR) {
            int mr = (int)PDP__MIN((int64_t)PDP__GEMM_MR, m - ir);
            int64_t t = 0, u = 0, r = 0; /* logical column L0 = (r runs + u) run + t */
            pdp__gemm_pack_a(PDP_NO_TRANS, a + ir * lda + pc, lda, mr, kc, ap, 0);
            for (L0 = 0; L0 < n; L0 += PDP__GEMM_RUNS_NR) {
                int nr = (int)PDP__MIN((int64_t)PDP__GEMM_RUNS_NR, n - L0);
                pdp__gemm_runs_tile(nr, run, runs, rstride, ustride, &t, &u, &r, soff, smask,
                                    nseg);
                pdp__gemm_kernel_runs(kc, ap, b, brow + pc, soff, smask, nseg,
                                      c + ir * ldc + L0, ldc, mr, nr, pc == 0 ? 0.0f : 1.0f);
            }
        }
    }
}
#endif

#endif /* PDP_CBLAS */

/* ---- gemm: small products as dot products ----
   C [m, n] = A B^T for an m x n too small to pay for packing and a long k (Conv2d's
   dW share of a layer with few weights: 16 x 25 over thousands of columns): row i of
   A at a + i lda, row j of B at b + brow[j]. Blocks of 4 x 5 dot products (20
   accumulators, 9 loads per 20 FMAs; 16 x 25 is 4 x 5 whole blocks, where 4 x 4
   blocks computed 28 columns for 25) run in 16-float lanes (AVX2: 4 x 3 blocks in 8)
   over k in slices of PDP__GEMM_DOTS_KC (A's and B's slices stay in L1), the lanes kept on
   the stack between slices, and are reduced at the end in a fixed order: the bits depend
   on m, n, k and the data only (not on the block shape). */
#if !defined(PDP_CBLAS) && !defined(PDP_NO_SIMD) && defined(__AVX512F__)
#  define PDP__GEMM_DOTS_VL 16
#  define PDP__GEMM_DOTS_MI 4 /* rows of A per block */
#  define PDP__GEMM_DOTS_NJ 5 /* rows of B per block */
#elif !defined(PDP_CBLAS) && !defined(PDP_NO_SIMD) && defined(__AVX2__) && defined(__FMA__)
/* AVX2 has 16 ymm registers: 4 x 3 blocks (12 accumulators and 4 rows of A; B from
   memory, as the FMA's operand). Scalar, these dots were half of bench.h's CNN step on a
   Zen 3 core. */
#  define PDP__GEMM_DOTS_VL 8
#  define PDP__GEMM_DOTS_MI 4
#  define PDP__GEMM_DOTS_NJ 3
#else
#  define PDP__GEMM_DOTS_VL 1
#  define PDP__GEMM_DOTS_MI 4
#  define PDP__GEMM_DOTS_NJ 5
#endif
#define PDP__GEMM_DOTS_MAX 512 /* lanes of the blocks, counted whole */
#define PDP__GEMM_DOTS_KC 512

PDP__PRIVATE int pdp__sgemm_dots_fits(int64_t m, int64_t n)
{
    return (m + PDP__GEMM_DOTS_MI - 1) / PDP__GEMM_DOTS_MI *
               ((n + PDP__GEMM_DOTS_NJ - 1) / PDP__GEMM_DOTS_NJ) * PDP__GEMM_DOTS_MI *
               PDP__GEMM_DOTS_NJ <=
           PDP__GEMM_DOTS_MAX;
}

#if PDP__GEMM_DOTS_VL == 16
/* The sum of v's 16 lanes as gcc's _mm512_reduce_add_ps adds them (halves, then quarters,
   then pairs), from the zero-masking extract: gcc's header builds the reduction on
   _mm512_extractf64x4_pd, whose _mm256_undefined_pd() merge source g++ reports as
   -Wmaybe-uninitialized (see gemm_bf16.c's PDP__BF16_HALF) */
static inline float pdp__gemm_dots_sum(__m512 v)
{
    __m512d d = _mm512_castps_pd(v);
    __m256 h = _mm256_add_ps(_mm256_castpd_ps(_mm512_maskz_extractf64x4_pd((__mmask8)0xf, d, 1)),
                             _mm256_castpd_ps(_mm512_maskz_extractf64x4_pd((__mmask8)0xf, d, 0)));
    __m128 q = _mm_add_ps(_mm256_extractf128_ps(h, 1), _mm256_extractf128_ps(h, 0));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    return _mm_cvtss_f32(_mm_add_ss(q, _mm_shuffle_ps(q, q, 1)));
}
#  define PDP__GEMM_DOTS_V __m512
#  define PDP__GEMM_DOTS_ZERO() _mm512_setzero_ps()
#  define PDP__GEMM_DOTS_LOAD(x) _mm512_loadu_ps(x)
#  define PDP__GEMM_DOTS_MASK(left) ((__mmask16)((1u << (left)) - 1))
#  define PDP__GEMM_DOTS_MASK_T __mmask16
#  define PDP__GEMM_DOTS_LOADM(x, mk) _mm512_maskz_loadu_ps(mk, x)
#  define PDP__GEMM_DOTS_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#elif PDP__GEMM_DOTS_VL == 8
/* The sum of v's 8 lanes: halves, then pairs, as pdp__gemm_dots_sum's last three steps */
static inline float pdp__gemm_dots_sum(__m256 v)
{
    __m128 q = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    return _mm_cvtss_f32(_mm_add_ss(q, _mm_shuffle_ps(q, q, 1)));
}
#  define PDP__GEMM_DOTS_V __m256
#  define PDP__GEMM_DOTS_ZERO() _mm256_setzero_ps()
#  define PDP__GEMM_DOTS_LOAD(x) _mm256_loadu_ps(x)
#  define PDP__GEMM_DOTS_MASK(left) \
      _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(left)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))
#  define PDP__GEMM_DOTS_MASK_T __m256i
#  define PDP__GEMM_DOTS_LOADM(x, mk) _mm256_maskload_ps(x, mk)
#  define PDP__GEMM_DOTS_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#endif

#if PDP__GEMM_DOTS_VL > 1
/* One block's MI x NJ accumulators over columns [p, p1), whole vectors (LOAD) or the
   last part of one (LOADM, the lanes past p1 zero in A and B: they add 0) */
#  define PDP__GEMM_DOTS_STEP(LOADA, LOADB)                                                    \
      do {                                                                                     \
          PDP__GEMM_DOTS_V va[MI];                                                             \
          _Pragma("GCC unroll 8") for (i = 0; i < MI; i++) va[i] = LOADA(ar[i] + p);           \
          _Pragma("GCC unroll 8") for (j = 0; j < NJ; j++) {                                   \
              PDP__GEMM_DOTS_V vb = LOADB(br[j] + p);                                          \
              _Pragma("GCC unroll 8") for (i = 0; i < MI; i++) {                               \
                  acc[i][j] = PDP__GEMM_DOTS_FMA(va[i], vb, acc[i][j]);                        \
              }                                                                                \
          }                                                                                    \
      } while (0)
#  define PDP__GEMM_DOTS_TAIL(x) PDP__GEMM_DOTS_LOADM(x, mk)

PDP__PRIVATE PDP__KERNEL_UNSANITIZED void pdp__sgemm_dots(int64_t m, int64_t n, int64_t k,
                                                          const float *a, int64_t lda,
                                                          const float *b, const int64_t *brow,
                                                          float *c, int64_t ldc)
{
    enum { MI = PDP__GEMM_DOTS_MI, NJ = PDP__GEMM_DOTS_NJ, VL = PDP__GEMM_DOTS_VL };
    PDP__GEMM_DOTS_V lanes[PDP__GEMM_DOTS_MAX];
    int64_t i0, j0, p0, p, nb = (n + NJ - 1) / NJ;
    PDP_ASSERT(pdp__sgemm_dots_fits(m, n));
    for (p = 0; p < (m + MI - 1) / MI * nb * MI * NJ; p++) lanes[p] = PDP__GEMM_DOTS_ZERO();
    for (p0 = 0; p0 < k; p0 += PDP__GEMM_DOTS_KC)
        for (i0 = 0; i0 < m; i0 += MI)
            for (j0 = 0; j0 < n; j0 += NJ) {
                const float *ar[MI], *br[NJ];
                PDP__GEMM_DOTS_V acc[MI][NJ], *save = lanes + (i0 / MI * nb + j0 / NJ) * MI * NJ;
                int64_t p1 = PDP__MIN(k, p0 + PDP__GEMM_DOTS_KC);
                int i, j;
                /* rows past the edge repeat the last one: computed, never stored */
                _Pragma("GCC unroll 8") for (i = 0; i < MI; i++) {
                    ar[i] = a + PDP__MIN(i0 + i, m - 1) * lda;
                    _Pragma("GCC unroll 8") for (j = 0; j < NJ; j++) {
                        acc[i][j] = save[i * NJ + j];
                    }
                }
                _Pragma("GCC unroll 8") for (j = 0; j < NJ; j++) {
                    br[j] = b + brow[PDP__MIN(j0 + j, n - 1)];
                }
                for (p = p0; p + VL <= p1; p += VL)
                    PDP__GEMM_DOTS_STEP(PDP__GEMM_DOTS_LOAD, PDP__GEMM_DOTS_LOAD);
                if (p < p1) {
                    const PDP__GEMM_DOTS_MASK_T mk = PDP__GEMM_DOTS_MASK(p1 - p);
                    PDP__GEMM_DOTS_STEP(PDP__GEMM_DOTS_TAIL, PDP__GEMM_DOTS_TAIL);
                }
                _Pragma("GCC unroll 8") for (i = 0; i < MI; i++) {
                    _Pragma("GCC unroll 8") for (j = 0; j < NJ; j++) {
                        save[i * NJ + j] = acc[i][j];
                    }
                }
            }
    for (i0 = 0; i0 < m; i0++)
        for (j0 = 0; j0 < n; j0++)
            c[i0 * ldc + j0] = pdp__gemm_dots_sum(
                lanes[(i0 / MI * nb + j0 / NJ) * MI * NJ + i0 % MI * NJ + j0 % NJ]);
}
#else
PDP__PRIVATE void pdp__sgemm_dots(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                                  const float *b, const int64_t *brow, float *c, int64_t ldc)
{
    int64_t i, j, p;
    for (i = 0; i < m; i++)
        for (j = 0; j < n; j++) {
            float acc = 0.0f;
            for (p = 0; p < k; p++) acc += a[i * lda + p] * b[brow[j] + p];
            c[i * ldc + j] = acc;
        }
}
#endif
