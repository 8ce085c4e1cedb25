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
