/* cuda_host: the host side of devices. Routes device memory and (later) layer
   math to the plain C functions of pdp_cuda.cu when built with PDP_CUDA; without
   it, every CUDA request fails with PDP_ERR_UNSUPPORTED naming the macro. */

#include "internal.h"

#define PDP__NO_CUDA_MSG "built without PDP_CUDA (compile with -DPDP_CUDA and link pdp_cuda.o)"

static pdp_status pdp__dev_alloc(pdp_device d, size_t bytes, void **out)
{
    *out = NULL;
    if (d.kind == PDP_DEVICE_CPU) {
        *out = pdp__alloc(bytes);
        return *out ? PDP_OK : pdp__err(PDP_ERR_OUT_OF_MEMORY, "no memory for %zu bytes", bytes);
    }
    return pdp__err(PDP_ERR_UNSUPPORTED, "CUDA device %d: " PDP__NO_CUDA_MSG, d.ordinal);
}

static void pdp__dev_free(pdp_device d, void *p)
{
    if (d.kind == PDP_DEVICE_CPU) pdp__dealloc(p);
}

static pdp_status pdp__dev_memset0(pdp_device d, void *p, size_t bytes)
{
    if (d.kind == PDP_DEVICE_CPU) {
        memset(p, 0, bytes);
        return PDP_OK;
    }
    return pdp__err(PDP_ERR_UNSUPPORTED, "CUDA device %d: " PDP__NO_CUDA_MSG, d.ordinal);
}

static pdp_status pdp__dev_fill(pdp_device d, float *p, int64_t count, float value)
{
    int64_t i;
    if (d.kind == PDP_DEVICE_CPU) {
        for (i = 0; i < count; i++) p[i] = value;
        return PDP_OK;
    }
    return pdp__err(PDP_ERR_UNSUPPORTED, "CUDA device %d: " PDP__NO_CUDA_MSG, d.ordinal);
}

static pdp_status pdp__dev_copy(pdp_device dst_dev, void *dst, pdp_device src_dev, const void *src,
                                size_t bytes)
{
    if (dst_dev.kind == PDP_DEVICE_CPU && src_dev.kind == PDP_DEVICE_CPU) {
        if (dst != src) memmove(dst, src, bytes);
        return PDP_OK;
    }
    return pdp__err(PDP_ERR_UNSUPPORTED, "CUDA device %d: " PDP__NO_CUDA_MSG,
                    dst_dev.kind == PDP_DEVICE_CPU ? src_dev.ordinal : dst_dev.ordinal);
}
