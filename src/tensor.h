/* tensor: tensors of 1 to 4 dimensions, contiguous, on a device; and the seeded random
   number generator used for initialisation and dropout.

   A tensor holds float32 values (PDP_DTYPE_F32, the default: activations, parameters,
   regression targets) or int32 values (PDP_DTYPE_I32: token ids, class labels). Both
   are 4 bytes an element, so copies, row views and device transfers move either the
   same way; data is declared float * and an int32 tensor's elements are read through
   pdp_tensor_ids. A model whose first layer is an Embedding takes an int32 input
   (pdp_model_desc.input_dtype).

   A tensor either owns its data (pdp_tensor_create) or is a view: a caller-owned
   struct filled by pdp_tensor_reshape_view or pdp_tensor_rows_view (valid as long as
   the tensor it views) or by pdp_tensor_wrap (over caller memory).
   Sizes are int64_t element counts; byte counts are size_t and called bytes. */

#define PDP_MAX_DIMS 4

typedef enum pdp_device_kind {
    PDP_DEVICE_CPU = 0,
    PDP_DEVICE_CUDA = 1 /* needs PDP_CUDA and pdp_cuda.cu */
} pdp_device_kind;

typedef struct pdp_device {
    pdp_device_kind kind; /* default CPU */
    int ordinal;          /* CUDA device number; 0 for the CPU */
} pdp_device;

/* Element types: a tensor's (F32 or I32) and the reducing collectives' (F32, BF16, F16;
   comm.h). */
typedef enum pdp_dtype {
    PDP_DTYPE_F32 = 0,  /* float32; the default */
    PDP_DTYPE_BF16 = 1, /* bfloat16 bit patterns (uint16_t): collectives only */
    PDP_DTYPE_F16 = 2,  /* IEEE binary16 bit patterns (uint16_t): collectives only */
    PDP_DTYPE_I32 = 3   /* int32: token ids, class labels */
} pdp_dtype;

typedef struct pdp_tensor {
    float *data;                  /* count elements, 64-byte aligned when owned; an int32
                                     tensor's are read through pdp_tensor_ids */
    int64_t shape[PDP_MAX_DIMS];  /* shape[0..ndim-1]; the rest are 1 */
    int ndim;                     /* 1..4 */
    int64_t count;                /* product of the shape */
    pdp_device device;
    bool owns_data;               /* false for views */
    pdp_dtype dtype;              /* what the elements are; 0 = float32 */
} pdp_tensor;

/* An int32 tensor's elements (NULL for a float32 tensor). */
static inline int32_t *pdp_tensor_ids(const pdp_tensor *t)
{
    return t && t->dtype == PDP_DTYPE_I32 ? (int32_t *)(void *)t->data : NULL;
}
static inline const char *pdp_dtype_name(pdp_dtype d)
{
    return d == PDP_DTYPE_F32 ? "float32" : d == PDP_DTYPE_I32 ? "int32" : d == PDP_DTYPE_BF16
           ? "bfloat16" : d == PDP_DTYPE_F16 ? "float16" : "unknown dtype";
}

/* Bytes of one element of dtype: 4 (float32, int32) or 2 (bfloat16, float16); 0 for an
   unknown value. (The collectives, comm.h, take float32, bfloat16 and float16.) */
PDP_API size_t pdp_dtype_size(pdp_dtype dtype);

/* A new zero-filled tensor of shape[0..ndim-1]. Fails with PDP_ERR_SHAPE on
   ndim outside 1..4 or a dimension < 1, naming the dimension. */
PDP_API pdp_status pdp_tensor_create(pdp_tensor **out, pdp_device device, int ndim,
                                     const int64_t *shape);
/* The same for int32 elements (token ids, labels), zero-filled, on any device: a model's
   input on the GPU it runs on, filled by pdp_tensor_upload from int32_t host memory. */
PDP_API pdp_status pdp_tensor_create_ids(pdp_tensor **out, pdp_device device, int ndim,
                                         const int64_t *shape);
PDP_API void pdp_tensor_free(pdp_tensor *t); /* NULL is fine; frees owned data */
PDP_API pdp_status pdp_tensor_zeros(pdp_tensor *t);
PDP_API pdp_status pdp_tensor_fill(pdp_tensor *t, float value);
/* dst <- src, any device pair: the same count (shapes may differ) and elements of the same
   size; dst takes src's dtype (int32 ids copied into a float32 tensor's memory make it an
   int32 tensor). Elements of another size fail with PDP_ERR_INVALID naming both dtypes. */
PDP_API pdp_status pdp_tensor_copy(pdp_tensor *dst, const pdp_tensor *src);
/* Copies between a tensor and host memory of t->count elements of t's dtype (floats, or
   int32 ids for a tensor made by pdp_tensor_wrap_ids). */
PDP_API pdp_status pdp_tensor_upload(pdp_tensor *t, const void *host);
PDP_API pdp_status pdp_tensor_download(const pdp_tensor *t, void *host);
/* Fills *view (caller-owned struct, no allocation) with the same data seen
   through a new shape of the same count (and the same dtype, as rows_view). */
PDP_API pdp_status pdp_tensor_reshape_view(const pdp_tensor *t, int ndim, const int64_t *shape,
                                           pdp_tensor *view);
/* Fills *view with rows [first, first + rows) of t along dimension 0. */
PDP_API pdp_status pdp_tensor_rows_view(const pdp_tensor *t, int64_t first, int64_t rows,
                                        pdp_tensor *view);
/* Wraps caller memory (not freed by pdp) as a tensor view: float32, or int32 ids and
   labels (pdp_tensor_wrap_ids). */
PDP_API pdp_status pdp_tensor_wrap(float *data, pdp_device device, int ndim, const int64_t *shape,
                                   pdp_tensor *view);
PDP_API pdp_status pdp_tensor_wrap_ids(int32_t *data, pdp_device device, int ndim,
                                       const int64_t *shape, pdp_tensor *view);
static inline pdp_device pdp_cpu(void) { pdp_device d = {PDP_DEVICE_CPU, 0}; return d; }
static inline pdp_device pdp_cuda(int ordinal)
{
    pdp_device d = {PDP_DEVICE_CUDA, ordinal};
    return d;
}

/* ---- rng ----
   PCG32 (O'Neill, "PCG: A Family of Simple Fast Space-Efficient Statistically
   Good Algorithms", 2014): 64-bit state, 32-bit output, selectable stream. Only
   integer arithmetic decides the bits, so a seed gives the same numbers on every
   platform and compiler. Floats: uniform = top 24 bits * 2^-24; normal =
   Box-Muller in double precision, rounded to float. */
typedef struct pdp_rng {
    uint64_t state;
    uint64_t inc;
} pdp_rng;

PDP_API void pdp_rng_seed(pdp_rng *r, uint64_t seed, uint64_t stream);
PDP_API uint32_t pdp_rng_u32(pdp_rng *r);
PDP_API float pdp_rng_uniform(pdp_rng *r);          /* [0, 1) */
PDP_API float pdp_rng_normal(pdp_rng *r);           /* mean 0, std 1 */
PDP_API uint32_t pdp_rng_below(pdp_rng *r, uint32_t n); /* [0, n), unbiased */
/* Initialisers on CPU tensors (or any device through a host staging copy). lo and hi finite,
   lo <= hi and hi - lo <= FLT_MAX (torch's uniform_ rule), mean and std finite, std >= 0:
   else PDP_ERR_INVALID naming them. */
PDP_API pdp_status pdp_tensor_uniform(pdp_tensor *t, pdp_rng *r, float lo, float hi);
PDP_API pdp_status pdp_tensor_normal(pdp_tensor *t, pdp_rng *r, float mean, float std);
/* Kaiming (He) uniform for ReLU nets: U(-b, b), b = gain * sqrt(3 / fan_in), with
   gain = sqrt(2 / (1 + a^2)); a = sqrt(5) gives PyTorch's Linear/Conv default. */
PDP_API pdp_status pdp_tensor_kaiming_uniform(pdp_tensor *t, pdp_rng *r, int64_t fan_in, float a);
/* Xavier (Glorot) uniform: U(-b, b), b = sqrt(6 / (fan_in + fan_out)). */
PDP_API pdp_status pdp_tensor_xavier_uniform(pdp_tensor *t, pdp_rng *r, int64_t fan_in,
                                             int64_t fan_out);
