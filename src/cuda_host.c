/* cuda_host: the host side of CUDA devices. Routes device memory, the losses and
   the optimizer updates to the plain C functions of pdp_cuda.cu (declared in
   cuda.h) when built with PDP_CUDA; without it, every CUDA request fails with
   PDP_ERR_UNSUPPORTED naming the macro, and the CPU paths are untouched. Each
   layer's CUDA entry lives beside its CPU code (layers*.c), NCCL in comm_nccl.c.

   Errors: a pdp_cudak_* function that fails leaves "<call> failed: <name>
   (<text>) at pdp_cuda.cu:<line>" in its own thread-local buffer; this module
   copies it into pdp's message as "pdp_cuda: ..." and the public caller
   prefixes its name and the layer ("pdp_model_forward: layer 0 (Linear):
   pdp_cuda: cublasSgemm failed: CUBLAS_STATUS_... at pdp_cuda.cu:123"). */

#include "internal.h"

#define PDP__NO_CUDA_MSG "built without PDP_CUDA (compile with -DPDP_CUDA and link pdp_cuda.o)"

#ifdef PDP_CUDA
/* ---- cuda_host: errors ---- */

/* Turns a failed pdp_cudak_* status into pdp's message. */
PDP__PRIVATE pdp_status pdp__cuda_fail(pdp_status st)
{
    return pdp__err(st, "pdp_cuda: %s", pdp_cudak_error());
}

#define PDP__CUDA_TRY(call)                                                  \
    do {                                                                     \
        pdp_status pdp__cst = (call);                                        \
        if (pdp__cst != PDP_OK) return pdp__cuda_fail(pdp__cst);             \
    } while (0)

PDP__PRIVATE int pdp__cuda_ordinal(pdp_device d)
{
    return d.kind == PDP_DEVICE_CPU ? -1 : d.ordinal;
}
#endif

/* ---- cuda_host: memory ---- */

PDP__PRIVATE pdp_status pdp__dev_alloc(pdp_device d, size_t bytes, void **out)
{
    *out = NULL;
    if (d.kind == PDP_DEVICE_CPU) {
        *out = pdp__alloc(bytes);
        return *out ? PDP_OK : pdp__err(PDP_ERR_OUT_OF_MEMORY, "no memory for %zu bytes", bytes);
    }
#ifdef PDP_CUDA
    PDP__CUDA_TRY(pdp_cudak_malloc(d.ordinal, bytes ? bytes : 1, out));
    return PDP_OK;
#else
    return pdp__err(PDP_ERR_UNSUPPORTED, "CUDA device %d: " PDP__NO_CUDA_MSG, d.ordinal);
#endif
}

PDP__PRIVATE void pdp__dev_free(pdp_device d, void *p)
{
    if (d.kind == PDP_DEVICE_CPU) pdp__dealloc(p);
#ifdef PDP_CUDA
    else pdp_cudak_free(d.ordinal, p);
#endif
}

PDP__PRIVATE pdp_status pdp__dev_memset0(pdp_device d, void *p, size_t bytes)
{
    if (d.kind == PDP_DEVICE_CPU) {
        if (bytes) memset(p, 0, bytes); /* an empty block may be NULL */
        return PDP_OK;
    }
#ifdef PDP_CUDA
    PDP__CUDA_TRY(pdp_cudak_memset0(d.ordinal, p, bytes));
    return PDP_OK;
#else
    return pdp__err(PDP_ERR_UNSUPPORTED, "CUDA device %d: " PDP__NO_CUDA_MSG, d.ordinal);
#endif
}

PDP__PRIVATE pdp_status pdp__dev_fill(pdp_device d, float *p, int64_t count, float value)
{
    if (d.kind == PDP_DEVICE_CPU) {
        PDP__FOR_BLOCKED(i, count, p[i] = value;);
        return PDP_OK;
    }
#ifdef PDP_CUDA
    PDP__CUDA_TRY(pdp_cudak_fill(d.ordinal, p, count, value));
    return PDP_OK;
#else
    return pdp__err(PDP_ERR_UNSUPPORTED, "CUDA device %d: " PDP__NO_CUDA_MSG, d.ordinal);
#endif
}

PDP__PRIVATE pdp_status pdp__dev_copy(pdp_device dst_dev, void *dst, pdp_device src_dev,
                                      const void *src, size_t bytes)
{
    if (dst_dev.kind == PDP_DEVICE_CPU && src_dev.kind == PDP_DEVICE_CPU) {
        if (dst != src && bytes) memmove(dst, src, bytes); /* an empty block may be NULL */
        return PDP_OK;
    }
#ifdef PDP_CUDA
    PDP__CUDA_TRY(pdp_cudak_memcpy(pdp__cuda_ordinal(dst_dev), dst, pdp__cuda_ordinal(src_dev), src,
                                   bytes));
    return PDP_OK;
#else
    return pdp__err(PDP_ERR_UNSUPPORTED, "CUDA device %d: " PDP__NO_CUDA_MSG,
                    dst_dev.kind == PDP_DEVICE_CPU ? src_dev.ordinal : dst_dev.ordinal);
#endif
}

PDP__PRIVATE pdp_status pdp__dev_add(pdp_device d, float *PDP__RESTRICT dst,
                                     const float *PDP__RESTRICT src, int64_t count)
{
    if (d.kind == PDP_DEVICE_CPU) {
        PDP__FOR_BLOCKED(i, count, dst[i] += src[i];);
        return PDP_OK;
    }
#ifdef PDP_CUDA
    PDP__CUDA_TRY(pdp_cudak_add(d.ordinal, dst, src, count));
    return PDP_OK;
#else
    return pdp__err(PDP_ERR_UNSUPPORTED, "CUDA device %d: " PDP__NO_CUDA_MSG, d.ordinal);
#endif
}

/* ---- cuda_host: public device functions ---- */

PDP_API pdp_status pdp_cuda_device_count(int *count)
{
    if (!count) return pdp__err(PDP_ERR_INVALID, "pdp_cuda_device_count: count is NULL");
    *count = 0;
#ifdef PDP_CUDA
    {
        pdp_status st = pdp_cudak_device_count(count);
        if (st != PDP_OK)
            return pdp__err(st, "pdp_cuda_device_count: pdp_cuda: %s", pdp_cudak_error());
        return PDP_OK;
    }
#else
    return pdp__err(PDP_ERR_UNSUPPORTED, "pdp_cuda_device_count: " PDP__NO_CUDA_MSG);
#endif
}

PDP_API pdp_status pdp_cuda_set_tf32(bool on)
{
#ifdef PDP_CUDA
    pdp_cudak_set_tf32(on ? 1 : 0);
    return PDP_OK;
#else
    (void)on;
    return pdp__err(PDP_ERR_UNSUPPORTED, "pdp_cuda_set_tf32: " PDP__NO_CUDA_MSG);
#endif
}

/* The common check of the public functions that take a CUDA device. */
PDP__PRIVATE pdp_status pdp__cuda_check_device(pdp_device d, const char *fn)
{
    if (d.kind != PDP_DEVICE_CUDA)
        return pdp__err(PDP_ERR_DEVICE, "%s: device kind %d is not CUDA", fn, (int)d.kind);
#ifdef PDP_CUDA
    return PDP_OK;
#else
    return pdp__err(PDP_ERR_UNSUPPORTED, "%s: CUDA device %d: " PDP__NO_CUDA_MSG, fn, d.ordinal);
#endif
}

PDP_API pdp_status pdp_cuda_synchronize(pdp_device d)
{
    pdp_status st;
    if ((st = pdp__cuda_check_device(d, "pdp_cuda_synchronize")) != PDP_OK) return st;
#ifdef PDP_CUDA
    if ((st = pdp_cudak_synchronize(d.ordinal)) != PDP_OK)
        return pdp__err(st, "pdp_cuda_synchronize: pdp_cuda: %s", pdp_cudak_error());
#endif
    return PDP_OK;
}

PDP_API pdp_status pdp_cuda_memory_stats_get(pdp_device d, pdp_cuda_memory_stats *out)
{
    pdp_status st;
    if (!out) return pdp__err(PDP_ERR_INVALID, "pdp_cuda_memory_stats_get: out is NULL");
    memset(out, 0, sizeof *out);
    if ((st = pdp__cuda_check_device(d, "pdp_cuda_memory_stats_get")) != PDP_OK) return st;
#ifdef PDP_CUDA
    if ((st = pdp_cudak_memory_stats(d.ordinal, &out->device_mallocs, &out->reserved_bytes,
                                     &out->in_use_bytes)) != PDP_OK)
        return pdp__err(st, "pdp_cuda_memory_stats_get: pdp_cuda: %s", pdp_cudak_error());
#endif
    return PDP_OK;
}

PDP_API pdp_status pdp_cuda_empty_cache(pdp_device d)
{
    pdp_status st;
    if ((st = pdp__cuda_check_device(d, "pdp_cuda_empty_cache")) != PDP_OK) return st;
#ifdef PDP_CUDA
    if ((st = pdp_cudak_empty_cache(d.ordinal)) != PDP_OK)
        return pdp__err(st, "pdp_cuda_empty_cache: pdp_cuda: %s", pdp_cudak_error());
#endif
    return PDP_OK;
}

PDP_API pdp_status pdp_cuda_release(pdp_device d)
{
    pdp_status st;
    if ((st = pdp__cuda_check_device(d, "pdp_cuda_release")) != PDP_OK) return st;
#ifdef PDP_CUDA
    if ((st = pdp_cudak_release(d.ordinal)) != PDP_OK)
        return pdp__err(st, "pdp_cuda_release: pdp_cuda: %s", pdp_cudak_error());
#endif
    return PDP_OK;
}

/* ---- cuda_host: losses ----
   The same contract as loss.c's pdp__cross_entropy (and, ignore: its
   pdp__cross_entropy_rows, rows labelled -1 giving loss 0 and dlogits 0), logits and
   dlogits on device d: labels (host memory) are checked here in sample order, the
   device computes per-sample losses, and the host sums them in sample order. */

PDP__PRIVATE pdp_status pdp__cuda_cross_entropy_any(pdp_device d, const float *logits,
                                                    const int32_t *labels, int64_t batch,
                                                    int64_t classes, float grad_scale,
                                                    double *loss_sum, float *dlogits, bool ignore,
                                                    const char *fn)
{
#ifdef PDP_CUDA
    double *loss = (double *)pdp__thread_scratch((size_t)batch * sizeof(double)), total = 0.0;
    int64_t i;
    pdp_status st;
    *loss_sum = 0.0;
    if (!loss) return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory for %lld losses", fn,
                               (long long)batch);
    for (i = 0; i < batch; i++)
        if ((labels[i] < 0 || labels[i] >= classes) && !(ignore && labels[i] == -1))
            return pdp__err(PDP_ERR_INVALID, "%s: label %ld at sample %lld is outside [0, %lld)%s",
                            fn, (long)labels[i], (long long)i, (long long)classes,
                            ignore ? " and not the ignore index -1" : "");
    if ((st = pdp_cudak_cross_entropy(d.ordinal, logits, labels, batch, classes, grad_scale, loss,
                                      dlogits)) != PDP_OK)
        return pdp__err(st, "%s: pdp_cuda: %s", fn, pdp_cudak_error());
    for (i = 0; i < batch; i++) {
        if (loss[i] != loss[i] || loss[i] == HUGE_VAL || loss[i] == -HUGE_VAL) {
            *loss_sum = loss[i];
            return pdp__err(PDP_ERR_NUMERIC, "%s: loss is %s at sample %lld", fn,
                            loss[i] != loss[i] ? "NaN" : "Inf", (long long)i);
        }
        total += loss[i];
    }
    *loss_sum = total;
    return PDP_OK;
#else
    (void)logits, (void)labels, (void)batch, (void)classes, (void)grad_scale, (void)dlogits;
    (void)ignore;
    *loss_sum = 0.0;
    return pdp__err(PDP_ERR_UNSUPPORTED, "%s: CUDA device %d: " PDP__NO_CUDA_MSG, fn, d.ordinal);
#endif
}

PDP__PRIVATE pdp_status pdp__cuda_cross_entropy(pdp_device d, const float *logits,
                                                const int32_t *labels, int64_t batch,
                                                int64_t classes, float grad_scale, double *loss_sum,
                                                float *dlogits, const char *fn)
{
    return pdp__cuda_cross_entropy_any(d, logits, labels, batch, classes, grad_scale, loss_sum,
                                       dlogits, false, fn);
}

PDP__PRIVATE pdp_status pdp__cuda_cross_entropy_rows(pdp_device d, const float *logits,
                                                     const int32_t *labels, int64_t rows,
                                                     int64_t classes, float grad_scale,
                                                     double *loss_sum, float *dlogits,
                                                     const char *fn)
{
    return pdp__cuda_cross_entropy_any(d, logits, labels, rows, classes, grad_scale, loss_sum,
                                       dlogits, true, fn);
}

/* Sum of squared differences (double) and dpred = scale (pred - target), on d. */
PDP__PRIVATE pdp_status pdp__cuda_mse(pdp_device d, const float *pred, const float *target,
                                      int64_t count, float scale, double *sum, float *dpred,
                                      const char *fn)
{
#ifdef PDP_CUDA
    pdp_status st;
    if ((st = pdp_cudak_mse(d.ordinal, pred, target, count, scale, sum, dpred)) != PDP_OK)
        return pdp__err(st, "%s: pdp_cuda: %s", fn, pdp_cudak_error());
    return PDP_OK;
#else
    (void)pred, (void)target, (void)count, (void)scale, (void)dpred;
    *sum = 0.0;
    return pdp__err(PDP_ERR_UNSUPPORTED, "%s: CUDA device %d: " PDP__NO_CUDA_MSG, fn, d.ordinal);
#endif
}

/* ---- cuda_host: gradient clipping (optim.c's pdp_clip_grad_norm) ---- */

PDP__PRIVATE pdp_status pdp__cuda_sumsq(pdp_device d, const float *x, int64_t count, double *sum,
                                        const char *fn)
{
#ifdef PDP_CUDA
    pdp_status st;
    if ((st = pdp_cudak_sumsq(d.ordinal, x, count, sum)) != PDP_OK)
        return pdp__err(st, "%s: pdp_cuda: %s", fn, pdp_cudak_error());
    return PDP_OK;
#else
    (void)x, (void)count;
    *sum = 0.0;
    return pdp__err(PDP_ERR_UNSUPPORTED, "%s: CUDA device %d: " PDP__NO_CUDA_MSG, fn, d.ordinal);
#endif
}

PDP__PRIVATE pdp_status pdp__cuda_scale(pdp_device d, float *x, int64_t count, float s,
                                        const char *fn)
{
#ifdef PDP_CUDA
    pdp_status st;
    if ((st = pdp_cudak_scale(d.ordinal, x, count, s)) != PDP_OK)
        return pdp__err(st, "%s: pdp_cuda: %s", fn, pdp_cudak_error());
    return PDP_OK;
#else
    (void)x, (void)count, (void)s;
    return pdp__err(PDP_ERR_UNSUPPORTED, "%s: CUDA device %d: " PDP__NO_CUDA_MSG, fn, d.ordinal);
#endif
}

/* Gradient compression on d (dt BF16 or F16): dst[i] = 16-bit(src[i] * scale), rounded
   to nearest even, and its inverse, dst[i] = widen(src[i]); CPU loops or pdp_cuda.cu's
   kernels (the same math.h conversions, so the same bits). */
PDP__PRIVATE pdp_status pdp__dev_to16(pdp_device d, void *dst, const float *src, int64_t count,
                                      float scale, int dt)
{
    if (d.kind == PDP_DEVICE_CPU) {
        uint16_t *h = (uint16_t *)dst;
        int64_t i;
        if (dt == PDP_DTYPE_BF16)
            for (i = 0; i < count; i++) h[i] = pdp__bf16_bits(src[i] * scale);
        else
            for (i = 0; i < count; i++) h[i] = pdp__f16_bits(src[i] * scale);
        return PDP_OK;
    }
#ifdef PDP_CUDA
    PDP__CUDA_TRY(pdp_cudak_to16(d.ordinal, dst, src, count, scale, dt));
    return PDP_OK;
#else
    (void)dst, (void)src, (void)count, (void)scale, (void)dt;
    return pdp__err(PDP_ERR_UNSUPPORTED, "CUDA device %d: " PDP__NO_CUDA_MSG, d.ordinal);
#endif
}

PDP__PRIVATE pdp_status pdp__dev_from16(pdp_device d, float *dst, const void *src, int64_t count,
                                        int dt)
{
    if (d.kind == PDP_DEVICE_CPU) {
        const uint16_t *h = (const uint16_t *)src;
        int64_t i;
        if (dt == PDP_DTYPE_BF16)
            for (i = 0; i < count; i++) dst[i] = pdp__bf16_float(h[i]);
        else
            for (i = 0; i < count; i++) dst[i] = pdp__f16_float(h[i]);
        return PDP_OK;
    }
#ifdef PDP_CUDA
    PDP__CUDA_TRY(pdp_cudak_from16(d.ordinal, dst, src, count, dt));
    return PDP_OK;
#else
    (void)dst, (void)src, (void)count, (void)dt;
    return pdp__err(PDP_ERR_UNSUPPORTED, "CUDA device %d: " PDP__NO_CUDA_MSG, d.ordinal);
#endif
}

/* ---- cuda_host: optimizer updates (optim.c's scalars, math.h's formulas) ---- */

PDP__PRIVATE pdp_status pdp__cuda_optim_update(pdp_device d, const struct pdp__optim_scalars *s,
                                               float *p, const float *g, float *s0, float *s1,
                                               int64_t n)
{
#ifdef PDP_CUDA
    if (s->kind == PDP_OPTIM_SGD)
        PDP__CUDA_TRY(pdp_cudak_sgd(d.ordinal, p, g, s0, n, s->lr, s->momentum, s->one_minus_damp,
                                    s->weight_decay, s->nesterov, s->first));
    else
        PDP__CUDA_TRY(pdp_cudak_adam(d.ordinal, p, g, s0, s1, n, s->beta1, s->one_minus_beta1,
                                     s->beta2, s->one_minus_beta2, s->step_size, s->bc2_sqrt,
                                     s->eps, s->l2, s->decay));
    return PDP_OK;
#else
    (void)s, (void)p, (void)g, (void)s0, (void)s1, (void)n;
    return pdp__err(PDP_ERR_UNSUPPORTED, "CUDA device %d: " PDP__NO_CUDA_MSG, d.ordinal);
#endif
}
