/* gemm: the public single-precision matrix product (src/gemm.c) in all four layouts.
   pdp has no public element or row operations: the layers' own loops are private.

   C[M,N] = alpha * op(A) * op(B) + beta * C, row-major, op(X) = X or X^T.
   Linear forward is A*B^T (x * W^T), backward dW = dY^T * X (A^T*B) and
   dX = dY * W (A*B). With -DPDP_CBLAS the call goes to the CBLAS linked in. */

typedef enum pdp_trans {
    PDP_NO_TRANS = 0,
    PDP_TRANS = 1
} pdp_trans;

/* lda, ldb, ldc are row strides in elements (of A, B, C as stored). Large
   products run on the calling thread's intra-op threads (pdp_set_num_threads).
   beta == 0 means C is written without being read (NaNs in C do not leak). */
PDP_API void pdp_sgemm(pdp_trans ta, pdp_trans tb, int64_t m, int64_t n, int64_t k, float alpha,
                       const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                       float *c, int64_t ldc);

/* ---- bf16 mixed precision (src/gemm_bf16.c) ----
   pdp_gemm_bf16 is pdp_sgemm with op(A) and op(B) rounded to bfloat16 (round to
   nearest even, as torch.autocast's casts) and everything else in fp32: products,
   accumulation, alpha, beta and C. The arithmetic, one chain per element of C
   whatever the thread count (and the path, but for AMX's order within a pair): k is
   cut into pairs (2p, 2p + 1) (an odd k gets a zero), and acc += a[2p+1] b[2p+1],
   then acc += a[2p] b[2p], pair after pair, starting from 0, with subnormal inputs
   and sums flushed to zero (the rules of AVX512-BF16's vdpbf16ps); then C = alpha acc + beta C (beta C's product rounded
   before the sum; C not read when beta == 0). Paths, chosen at run time by CPUID:

     PDP_BF16_PATH_EMULATED  portable C on any CPU; the same bits as AVX512 except
                             where a product of two bf16 values falls below 2^-126
                             (the hardware fuses it into the sum, C rounds it first)
     PDP_BF16_PATH_AVX512    vdpbf16ps (AVX512-BF16, e.g. Cooper Lake, Sapphire Rapids,
                             Zen 4); compiled with a target attribute, so any x86-64
                             build has it unless -DPDP_NO_SIMD
     PDP_BF16_PATH_AMX       AMX tiles (TDPBF16PS, e.g. Sapphire Rapids): x86-64 Linux, when
                             CPUID has AMX-BF16 and AMX-TILE, the OS enables the tile state
                             and grants the process its use (ARCH_REQ_XCOMP_PERM, asked
                             once); Intel's pseudo-code adds each pair's even product
                             first, and the hardware (measured on Sapphire Rapids) follows
                             neither order, so its bits may differ from the others' within
                             the fp32 summation bound (gemm_amx.c) */
typedef enum pdp_bf16_path {
    PDP_BF16_PATH_AUTO = 0, /* the fastest available */
    PDP_BF16_PATH_EMULATED = 1,
    PDP_BF16_PATH_AVX512 = 2,
    PDP_BF16_PATH_AMX = 3
} pdp_bf16_path;

/* The precision of a model's GEMMs and convolutions (pdp_model_desc.precision). */
typedef enum pdp_precision {
    PDP_PRECISION_FP32 = 0, /* default */
    PDP_PRECISION_BF16 = 1  /* inputs of Linear and Conv2d products in bf16, as torch.autocast */
} pdp_precision;

/* x rounded to the nearest bf16 (ties to even; NaN stays NaN), returned as a float. */
PDP_API float pdp_bf16_round(float x);
/* The path PDP_BF16_PATH_AUTO takes on this CPU (checked once per process): AMX, else
   AVX512, else the emulation. */
PDP_API pdp_bf16_path pdp_bf16_best_path(void);
PDP_API bool pdp_bf16_path_available(pdp_bf16_path path);
PDP_API const char *pdp_bf16_path_name(pdp_bf16_path path); /* "avx512-bf16" */
PDP_API void pdp_gemm_bf16(pdp_trans ta, pdp_trans tb, int64_t m, int64_t n, int64_t k,
                           float alpha, const float *a, int64_t lda, const float *b, int64_t ldb,
                           float beta, float *c, int64_t ldc);
/* The same on a given path; PDP_ERR_UNSUPPORTED (C untouched) when this CPU or build
   lacks it. */
PDP_API pdp_status pdp_gemm_bf16_on(pdp_bf16_path path, pdp_trans ta, pdp_trans tb, int64_t m,
                                    int64_t n, int64_t k, float alpha, const float *a,
                                    int64_t lda, const float *b, int64_t ldb, float beta,
                                    float *c, int64_t ldc);
