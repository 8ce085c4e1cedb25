/* test_gemm_nosimd.c - test_gemm.c again, built with -DPDP_NO_SIMD: the portable C
   micro-kernel and packing loops, which a target without AVX gets. */
#define PDP_NO_SIMD
#include "test_gemm.c"
