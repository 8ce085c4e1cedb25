/* tensor: creation, views, copies and initialisers; the PCG32 generator.

   Invariants: shape[i] >= 1 for i < ndim and 1 beyond; count is their product;
   owned data is 64-byte aligned and zero-filled at creation. CUDA tensors are
   allocated and copied by pdp_cuda.cu through the pdp__dev_* functions of the
   cuda_host module; without PDP_CUDA they fail with PDP_ERR_UNSUPPORTED. */

#include "internal.h"

/* ---- tensor: shapes ---- */

PDP__PRIVATE pdp_status pdp__check_shape(const char *fn, int ndim, const int64_t *shape,
                                         int64_t *count)
{
    int64_t n = 1;
    int i;
    if (ndim < 1 || ndim > PDP_MAX_DIMS)
        return pdp__err(PDP_ERR_SHAPE, "%s: ndim %d is outside 1..%d", fn, ndim, PDP_MAX_DIMS);
    if (!shape) return pdp__err(PDP_ERR_INVALID, "%s: shape is NULL", fn);
    for (i = 0; i < ndim; i++) {
        if (shape[i] < 1)
            return pdp__err(PDP_ERR_SHAPE, "%s: dimension %d is %lld (must be >= 1)", fn, i,
                            (long long)shape[i]);
        if (!pdp__mul_ok(n, shape[i], &n))
            return pdp__err(PDP_ERR_SHAPE, "%s: element count overflows at dimension %d (more "
                            "than %lld elements)", fn, i, (long long)PDP__COUNT_MAX);
    }
    *count = n;
    return PDP_OK;
}

PDP__PRIVATE void pdp__set_shape(pdp_tensor *t, int ndim, const int64_t *shape, int64_t count)
{
    int i;
    t->ndim = ndim;
    t->count = count;
    for (i = 0; i < PDP_MAX_DIMS; i++) t->shape[i] = i < ndim ? shape[i] : 1;
}

/* "[128, 784]" into buf, for messages. */
PDP__PRIVATE const char *pdp__shape_str(const pdp_tensor *t, char *buf, size_t bytes)
{
    size_t used = 0;
    int i;
    used += (size_t)snprintf(buf, bytes, "[");
    for (i = 0; i < t->ndim && i < PDP_MAX_DIMS && used < bytes; i++) /* a bad ndim, too */
        used += (size_t)snprintf(buf + used, bytes - used, i ? ", %lld" : "%lld",
                                 (long long)t->shape[i]);
    if (used < bytes) snprintf(buf + used, bytes - used, "]");
    return buf;
}

/* Is a the device b is? (kind and ordinal) */
PDP__PRIVATE bool pdp__same_device(pdp_device a, pdp_device b)
{
    return a.kind == b.kind && a.ordinal == b.ordinal;
}

/* Do a and b have one shape? (ndim and every dimension; dtype and device are not compared) */
PDP__PRIVATE bool pdp__same_shape(const pdp_tensor *a, const pdp_tensor *b)
{
    int i;
    if (a->ndim != b->ndim) return false;
    for (i = 0; i < a->ndim && i < PDP_MAX_DIMS; i++)
        if (a->shape[i] != b->shape[i]) return false;
    return true;
}

/* A device pdp knows: the CPU (ordinal 0) or a CUDA device (ordinal >= 0, in a build with
   PDP_CUDA: PDP_ERR_UNSUPPORTED naming the macro otherwise; whether it exists is the CUDA
   calls' to say). */
PDP__PRIVATE pdp_status pdp__check_device(pdp_device d, const char *fn)
{
#ifndef PDP_CUDA
    if (d.kind == PDP_DEVICE_CUDA && d.ordinal >= 0)
        return pdp__err(PDP_ERR_UNSUPPORTED, "%s: device cuda:%d: built without PDP_CUDA "
                        "(compile with -DPDP_CUDA and link pdp_cuda.o)", fn, d.ordinal);
#endif
    if ((d.kind == PDP_DEVICE_CPU && d.ordinal == 0) ||
        (d.kind == PDP_DEVICE_CUDA && d.ordinal >= 0))
        return PDP_OK;
    return pdp__err(PDP_ERR_DEVICE, "%s: device {kind %d, ordinal %d} is neither the CPU "
                    "(pdp_cpu(): kind %d, ordinal 0) nor a CUDA device (pdp_cuda(i): kind %d, "
                    "i >= 0)", fn, (int)d.kind, d.ordinal, (int)PDP_DEVICE_CPU,
                    (int)PDP_DEVICE_CUDA);
}

/* ---- tensor: lifecycle ---- */

/* pdp_tensor_create and pdp_tensor_create_ids: fn names the caller in messages; both element
   types take 4 bytes */
PDP__PRIVATE pdp_status pdp__tensor_create(const char *fn, pdp_tensor **out, pdp_device device,
                                           int ndim, const int64_t *shape, pdp_dtype dtype)
{
    pdp_tensor *t;
    int64_t count = 0; /* set by pdp__check_shape; 0 keeps -Wmaybe-uninitialized quiet */
    pdp_status st;
    if (!out) return pdp__err(PDP_ERR_INVALID, "%s: out is NULL", fn);
    *out = NULL;
    if ((st = pdp__check_shape(fn, ndim, shape, &count)) != PDP_OK ||
        (st = pdp__check_device(device, fn)) != PDP_OK)
        return st;
    if ((uint64_t)count > SIZE_MAX / sizeof(float))
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: %lld elements do not fit in memory", fn,
                        (long long)count);
    t = (pdp_tensor *)pdp__calloc(sizeof *t);
    if (!t) return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory for the header", fn);
    pdp__set_shape(t, ndim, shape, count);
    t->device = device;
    t->owns_data = true;
    t->dtype = dtype;
    if (device.kind == PDP_DEVICE_CPU) {
        t->data = (float *)pdp__calloc((size_t)count * sizeof(float));
        if (!t->data) {
            pdp__dealloc(t);
            return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory for %lld %s elements", fn,
                            (long long)count, pdp_dtype_name(dtype));
        }
    } else if ((st = pdp__dev_alloc(device, (size_t)count * sizeof(float), (void **)&t->data)) !=
                   PDP_OK ||
               (st = pdp__dev_memset0(device, t->data, (size_t)count * sizeof(float))) != PDP_OK) {
        if (t->data) pdp__dev_free(device, t->data);
        pdp__dealloc(t);
        return pdp__err_wrap(st, "%s", fn);
    }
    *out = t;
    return PDP_OK;
}

PDP_API pdp_status pdp_tensor_create(pdp_tensor **out, pdp_device device, int ndim,
                                     const int64_t *shape)
{
    return pdp__tensor_create("pdp_tensor_create", out, device, ndim, shape, PDP_DTYPE_F32);
}

PDP_API pdp_status pdp_tensor_create_ids(pdp_tensor **out, pdp_device device, int ndim,
                                         const int64_t *shape)
{
    return pdp__tensor_create("pdp_tensor_create_ids", out, device, ndim, shape, PDP_DTYPE_I32);
}

PDP_API void pdp_tensor_free(pdp_tensor *t)
{
    if (!t) return;
    if (t->owns_data) {
        if (t->device.kind == PDP_DEVICE_CPU) pdp__dealloc(t->data);
        else pdp__dev_free(t->device, t->data);
    }
    pdp__dealloc(t);
}

/* ---- tensor: views ---- */

PDP_API pdp_status pdp_tensor_wrap(float *data, pdp_device device, int ndim, const int64_t *shape,
                                   pdp_tensor *view)
{
    int64_t count = 0; /* set by pdp__check_shape; 0 keeps -Wmaybe-uninitialized quiet */
    pdp_status st;
    if (!view) return pdp__err(PDP_ERR_INVALID, "pdp_tensor_wrap: view is NULL");
    if (!data) return pdp__err(PDP_ERR_INVALID, "pdp_tensor_wrap: data is NULL");
    if ((st = pdp__check_shape("pdp_tensor_wrap", ndim, shape, &count)) != PDP_OK) return st;
    pdp__set_shape(view, ndim, shape, count);
    view->data = data;
    view->device = device;
    view->owns_data = false;
    view->dtype = PDP_DTYPE_F32;
    return PDP_OK;
}

PDP_API pdp_status pdp_tensor_wrap_ids(int32_t *data, pdp_device device, int ndim,
                                       const int64_t *shape, pdp_tensor *view)
{
    pdp_status st = pdp_tensor_wrap((float *)(void *)data, device, ndim, shape, view);
    if (st == PDP_OK) view->dtype = PDP_DTYPE_I32;
    return st;
}

PDP_API pdp_status pdp_tensor_reshape_view(const pdp_tensor *t, int ndim, const int64_t *shape,
                                           pdp_tensor *view)
{
    int64_t count = 0; /* set by pdp__check_shape; 0 keeps -Wmaybe-uninitialized quiet */
    pdp_status st;
    char a[96];
    if (!t || !view) return pdp__err(PDP_ERR_INVALID, "pdp_tensor_reshape_view: NULL tensor");
    if ((st = pdp__check_shape("pdp_tensor_reshape_view", ndim, shape, &count)) != PDP_OK)
        return st;
    if (count != t->count)
        return pdp__err(PDP_ERR_SHAPE,
                        "pdp_tensor_reshape_view: %s has %lld elements, new shape has %lld",
                        pdp__shape_str(t, a, sizeof a), (long long)t->count, (long long)count);
    if ((st = pdp_tensor_wrap(t->data, t->device, ndim, shape, view)) == PDP_OK)
        view->dtype = t->dtype;
    return st;
}

PDP_API pdp_status pdp_tensor_rows_view(const pdp_tensor *t, int64_t first, int64_t rows,
                                        pdp_tensor *view)
{
    int64_t shape[PDP_MAX_DIMS], row, end = 0;
    char a[96];
    if (!t || !view) return pdp__err(PDP_ERR_INVALID, "pdp_tensor_rows_view: NULL tensor");
    if (first < 0 || rows < 1 || !pdp__add_ok(first, rows, &end))
        return pdp__err(PDP_ERR_SHAPE, "pdp_tensor_rows_view: %lld rows from row %lld outside %s",
                        (long long)rows, (long long)first, pdp__shape_str(t, a, sizeof a));
    if (end > t->shape[0])
        return pdp__err(PDP_ERR_SHAPE, "pdp_tensor_rows_view: rows [%lld, %lld) outside %s",
                        (long long)first, (long long)end, pdp__shape_str(t, a, sizeof a));
    memcpy(shape, t->shape, sizeof shape);
    row = t->count / t->shape[0];
    shape[0] = rows;
    if (pdp_tensor_wrap(t->data + first * row, t->device, t->ndim, shape, view) != PDP_OK)
        return pdp__err(PDP_ERR_INVALID, "pdp_tensor_rows_view: %s has no data",
                        pdp__shape_str(t, a, sizeof a));
    view->dtype = t->dtype;
    return PDP_OK;
}

/* ---- tensor: contents ---- */

PDP_API pdp_status pdp_tensor_zeros(pdp_tensor *t)
{
    if (!t) return pdp__err(PDP_ERR_INVALID, "pdp_tensor_zeros: tensor is NULL");
    if (t->device.kind != PDP_DEVICE_CPU)
        return pdp__dev_memset0(t->device, t->data, (size_t)t->count * sizeof(float));
    memset(t->data, 0, (size_t)t->count * sizeof(float));
    return PDP_OK;
}

PDP_API pdp_status pdp_tensor_fill(pdp_tensor *t, float value)
{
    int64_t i;
    if (!t) return pdp__err(PDP_ERR_INVALID, "pdp_tensor_fill: tensor is NULL");
    if (t->dtype != PDP_DTYPE_F32)
        return pdp__err(PDP_ERR_INVALID, "pdp_tensor_fill: the tensor holds %s, not floats",
                        pdp_dtype_name(t->dtype));
    if (t->device.kind != PDP_DEVICE_CPU) return pdp__dev_fill(t->device, t->data, t->count, value);
    for (i = 0; i < t->count; i++) t->data[i] = value;
    return PDP_OK;
}

PDP_API size_t pdp_dtype_size(pdp_dtype dt)
{
    return dt == PDP_DTYPE_F32 || dt == PDP_DTYPE_I32 ? 4
           : dt == PDP_DTYPE_BF16 || dt == PDP_DTYPE_F16 ? 2 : 0;
}

PDP_API pdp_status pdp_tensor_copy(pdp_tensor *dst, const pdp_tensor *src)
{
    char a[96], b[96];
    size_t bytes;
    if (!dst || !src) return pdp__err(PDP_ERR_INVALID, "pdp_tensor_copy: NULL tensor");
    if (dst->count != src->count)
        return pdp__err(PDP_ERR_SHAPE,
                        "pdp_tensor_copy: destination %s and source %s differ in count",
                        pdp__shape_str(dst, a, sizeof a), pdp__shape_str(src, b, sizeof b));
    if (pdp_dtype_size(dst->dtype) != pdp_dtype_size(src->dtype))
        return pdp__err(PDP_ERR_INVALID,
                        "pdp_tensor_copy: destination %s %s and source %s %s: elements of "
                        "%d and %d bytes", pdp_dtype_name(dst->dtype),
                        pdp__shape_str(dst, a, sizeof a), pdp_dtype_name(src->dtype),
                        pdp__shape_str(src, b, sizeof b), (int)pdp_dtype_size(dst->dtype),
                        (int)pdp_dtype_size(src->dtype));
    bytes = (size_t)src->count * pdp_dtype_size(src->dtype);
    dst->dtype = src->dtype;
    if (dst->device.kind == PDP_DEVICE_CPU && src->device.kind == PDP_DEVICE_CPU) {
        if (dst->data != src->data) memmove(dst->data, src->data, bytes);
        return PDP_OK;
    }
    return pdp__dev_copy(dst->device, dst->data, src->device, src->data, bytes);
}

PDP_API pdp_status pdp_tensor_upload(pdp_tensor *t, const void *host)
{
    if (!t || !host) return pdp__err(PDP_ERR_INVALID, "pdp_tensor_upload: NULL argument");
    return pdp__dev_copy(t->device, t->data, pdp_cpu(), host,
                         (size_t)t->count * pdp_dtype_size(t->dtype));
}

PDP_API pdp_status pdp_tensor_download(const pdp_tensor *t, void *host)
{
    if (!t || !host) return pdp__err(PDP_ERR_INVALID, "pdp_tensor_download: NULL argument");
    return pdp__dev_copy(pdp_cpu(), host, t->device, t->data,
                         (size_t)t->count * pdp_dtype_size(t->dtype));
}

/* ---- rng: PCG32 ---- */

PDP_API void pdp_rng_seed(pdp_rng *r, uint64_t seed, uint64_t stream)
{
    r->state = 0;
    r->inc = (stream << 1u) | 1u;
    (void)pdp_rng_u32(r);
    r->state += seed;
    (void)pdp_rng_u32(r);
}

PDP_API uint32_t pdp_rng_u32(pdp_rng *r)
{
    uint64_t old = r->state;
    uint32_t xorshifted, rot;
    r->state = old * 6364136223846793005ULL + r->inc;
    xorshifted = (uint32_t)(((old >> 18u) ^ old) >> 27u);
    rot = (uint32_t)(old >> 59u);
    return (xorshifted >> rot) | (xorshifted << ((32u - rot) & 31u));
}

PDP_API float pdp_rng_uniform(pdp_rng *r)
{
    return (float)(pdp_rng_u32(r) >> 8) * (1.0f / 16777216.0f);
}

PDP_API uint32_t pdp_rng_below(pdp_rng *r, uint32_t n)
{
    uint32_t threshold, x;
    if (n == 0) return 0;
    threshold = (uint32_t)(-n) % n; /* reject the low values that make x % n biased */
    do x = pdp_rng_u32(r); while (x < threshold);
    return x % n;
}

PDP_API float pdp_rng_normal(pdp_rng *r)
{
    /* Box-Muller on (0, 1] x [0, 1), one draw per call (no cached second value,
       so the stream position is a simple function of the calls made). */
    double u1 = ((double)(pdp_rng_u32(r) >> 8) + 1.0) / 16777216.0;
    double u2 = (double)(pdp_rng_u32(r) >> 8) / 16777216.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* One draw in [lo, hi). In double, where the product of two floats is exact: a build that
   fuses the multiply and the add (gcc's GNU modes) rounds as one that does not, so a seed's
   initial parameters are the same bits in every build (pdp_tensor_normal likewise). */
PDP__PRIVATE float pdp__draw_uniform(pdp_rng *r, float lo, float hi)
{
    return (float)((double)lo + (double)(hi - lo) * (double)pdp_rng_uniform(r));
}

/* Fills a CPU tensor directly, any other device through a host staging copy. */
PDP__PRIVATE pdp_status pdp__tensor_init(pdp_tensor *t, pdp_rng *r, int normal, float a, float b,
                                         const char *fn)
{
    float *host;
    int64_t i;
    pdp_status st = PDP_OK;
    if (!t || !r) return pdp__err(PDP_ERR_INVALID, "%s: NULL argument", fn);
    if (t->dtype != PDP_DTYPE_F32)
        return pdp__err(PDP_ERR_INVALID, "%s: the tensor holds %s, not floats", fn,
                        pdp_dtype_name(t->dtype));
    /* torch refuses them too; a range wider than FLT_MAX too (uniform_: to - from <= max):
       hi - lo would be Inf, and every draw Inf or NaN */
    if (!isfinite(a) || !isfinite(b) || (normal ? b < 0.0f : a > b || !isfinite(b - a)))
        return pdp__err(PDP_ERR_INVALID, normal ? "%s: mean %g, std %g (finite, std >= 0)"
                        : "%s: [%g, %g) (finite, lo <= hi) of width at most FLT_MAX", fn,
                        (double)a, (double)b);
    host = t->device.kind == PDP_DEVICE_CPU ? t->data
                                            : (float *)pdp__alloc((size_t)t->count * sizeof(float));
    if (!host) return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory for a staging copy", fn);
    for (i = 0; i < t->count; i++)
        host[i] = normal ? (float)((double)a + (double)b * (double)pdp_rng_normal(r))
                         : pdp__draw_uniform(r, a, b);
    if (host != t->data) {
        st = pdp_tensor_upload(t, host);
        pdp__dealloc(host);
    }
    return st;
}

PDP_API pdp_status pdp_tensor_uniform(pdp_tensor *t, pdp_rng *r, float lo, float hi)
{
    return pdp__tensor_init(t, r, 0, lo, hi, "pdp_tensor_uniform");
}

PDP_API pdp_status pdp_tensor_normal(pdp_tensor *t, pdp_rng *r, float mean, float std)
{
    return pdp__tensor_init(t, r, 1, mean, std, "pdp_tensor_normal");
}

PDP_API pdp_status pdp_tensor_kaiming_uniform(pdp_tensor *t, pdp_rng *r, int64_t fan_in, float a)
{
    double gain, bound;
    if (fan_in < 1)
        return pdp__err(PDP_ERR_INVALID, "pdp_tensor_kaiming_uniform: fan_in %lld < 1",
                        (long long)fan_in);
    gain = sqrt(2.0 / (1.0 + (double)a * a));
    bound = gain * sqrt(3.0 / (double)fan_in);
    return pdp__tensor_init(t, r, 0, (float)-bound, (float)bound, "pdp_tensor_kaiming_uniform");
}

PDP_API pdp_status pdp_tensor_xavier_uniform(pdp_tensor *t, pdp_rng *r, int64_t fan_in,
                                             int64_t fan_out)
{
    double bound;
    if (fan_in < 1 || fan_out < 1)
        return pdp__err(PDP_ERR_INVALID, "pdp_tensor_xavier_uniform: fan_in %lld, fan_out %lld",
                        (long long)fan_in, (long long)fan_out);
    bound = sqrt(6.0 / ((double)fan_in + (double)fan_out)); /* the sum may pass INT64_MAX */
    return pdp__tensor_init(t, r, 0, (float)-bound, (float)bound, "pdp_tensor_xavier_uniform");
}
