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
   accumulation, alpha, beta and C. A product of two bf16 values is exact in fp32 (unless
   it falls below 2^-126), so the paths differ only in the order and the underflow rules
   of the sum of the same exact products: two arithmetics, each deterministic (the bits
   depend on the path, the shape and the data, never on the thread count).

   The chain (emulated, avx512-bf16, amx-bf16): per element of C, k is cut into pairs
   (2p, 2p + 1) (an odd k gets a zero), and acc += a[2p+1] b[2p+1], then acc += a[2p]
   b[2p], pair after pair, starting from 0, with subnormal inputs and sums flushed to
   zero (the rules of AVX512-BF16's vdpbf16ps; AMX adds a pair's even product first);
   then C = alpha acc + beta C (beta C's product rounded before the sum; C not read when
   beta == 0).

   sgemm-rounded: pdp_sgemm's FMA chain over the same exact products (its k blocks of at
   most 512, subnormals kept: no flushing), alpha and beta as pdp_sgemm. Against the
   chain, with S = sum_p |a_p b_p| over the bf16 values, u = 2^-24 and gamma_k = k u /
   (1 - k u): |C_sgemm - C_chain| <= |alpha| (2 gamma_k S + 2 k 2^-126) + 2^-23 (|alpha| S
   + |beta C|). Each is the exact sum with at most k - 1 roundings (within gamma_k S of
   it, Higham's bound for any order); each flush of the chain, and each product below
   2^-126 (fused into the sum, or rounded first), moves a result by less than 2^-126;
   the last term covers alpha's and beta's roundings. A bf16 input below 2^-126 (a
   subnormal) is read as zero by the chain and not here: add its terms' |a_p b_p|.

   Paths (pdp_bf16_path_available says which this CPU and build have):

     PDP_BF16_PATH_EMULATED  the chain in software, the reference, on any CPU: on x86 with
                             AVX-512F or AVX2 and FMA, two FMAs per pair under MXCSR's DAZ and
                             FTZ (restored after), which gave vdpbf16ps's bits on every input
                             test_bf16 tries; else (or -DPDP_NO_SIMD) portable C, the same
                             bits except where a product falls below 2^-126 (the hardware and
                             the FMAs fuse it into the sum, C rounds it first)
     PDP_BF16_PATH_AVX512    vdpbf16ps (AVX512-BF16, e.g. Cooper Lake, Sapphire Rapids,
                             Zen 4); compiled with a target attribute, so any x86-64
                             build has it unless -DPDP_NO_SIMD
     PDP_BF16_PATH_AMX       AMX tiles (TDPBF16PS, e.g. Sapphire Rapids): x86-64 Linux, when
                             CPUID has AMX-BF16 and AMX-TILE, the OS enables the tile state
                             and grants the process its use (ARCH_REQ_XCOMP_PERM, asked
                             once); Intel's pseudo-code adds each pair's even product
                             first, and the hardware (measured on Sapphire Rapids) follows
                             neither order, so its bits may differ from the others' within
                             the fp32 summation bound (gemm_amx.c)
     PDP_BF16_PATH_SGEMM     "sgemm-rounded": pdp_sgemm rounding its operands to bf16 as it
                             packs them, on any CPU, near fp32's speed (measured a little
                             below it: CHANGELOG.md); every build but -DPDP_CBLAS
     PDP_BF16_PATH_AUTO      per product, the path gemm_bf16.c's table of CPU families
                             (CPUID's vendor, family, model; built by bench/bf16_paths) names
                             for the product's shape class (its layout; large, m or n < 32,
                             or k < 32); a CPU without a row: AMX, else AVX512-BF16 on AMD,
                             else sgemm-rounded. Never a timing: a CPU and a shape always
                             take the same path, so the same bits. */
typedef enum pdp_bf16_path {
    PDP_BF16_PATH_AUTO = 0, /* per product, the table's choice */
    PDP_BF16_PATH_EMULATED = 1,
    PDP_BF16_PATH_AVX512 = 2,
    PDP_BF16_PATH_AMX = 3,
    PDP_BF16_PATH_SGEMM = 4
} pdp_bf16_path;

/* The precision of a model's GEMMs and convolutions (pdp_model_desc.precision). */
typedef enum pdp_precision {
    PDP_PRECISION_FP32 = 0, /* default */
    PDP_PRECISION_BF16 = 1  /* inputs of Linear and Conv2d products in bf16, as torch.autocast */
} pdp_precision;

/* x rounded to the nearest bf16 (ties to even; NaN stays NaN), returned as a float. */
PDP_API float pdp_bf16_round(float x);
/* The path PDP_BF16_PATH_AUTO takes on this CPU (CPUID read once per process) for a
   large product: pdp_bf16_path_for(PDP_NO_TRANS, PDP_TRANS, 512, 512, 512), a Linear's
   forward x W^T. pdp_bf16_path_for: the path AUTO takes for that product (the model's
   Linear and Conv2d layers in bf16 take it too). */
PDP_API pdp_bf16_path pdp_bf16_best_path(void);
PDP_API pdp_bf16_path pdp_bf16_path_for(pdp_trans ta, pdp_trans tb, int64_t m, int64_t n,
                                        int64_t k);
PDP_API bool pdp_bf16_path_available(pdp_bf16_path path);
PDP_API const char *pdp_bf16_path_name(pdp_bf16_path path); /* "avx512-bf16", "sgemm-rounded" */
PDP_API void pdp_gemm_bf16(pdp_trans ta, pdp_trans tb, int64_t m, int64_t n, int64_t k,
                           float alpha, const float *a, int64_t lda, const float *b, int64_t ldb,
                           float beta, float *c, int64_t ldc);
/* The same on a given path; PDP_ERR_UNSUPPORTED (C untouched) when this CPU or build
   lacks it. */
PDP_API pdp_status pdp_gemm_bf16_on(pdp_bf16_path path, pdp_trans ta, pdp_trans tb, int64_t m,
                                    int64_t n, int64_t k, float alpha, const float *a,
                                    int64_t lda, const float *b, int64_t ldb, float beta,
                                    float *c, int64_t ldc);
