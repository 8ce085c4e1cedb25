/* pdp.h - v0.1.0 - embeddable C training library - MIT (see end of file)
   GENERATED from src/ by amalgamate.py: edit src/, then run `python3 amalgamate.py`.

   QUICK START
   ===========
   Drop pdp.h into your project. In exactly one .c file:

       #define PDP_IMPLEMENTATION
       #include "pdp.h"

       pdp_model *m;  pdp_optim *opt;  float loss;
       pdp_model_desc md = { .input_shape = {784} , .seed = 1 };
       pdp_model_create(&m, &md);
       pdp_model_add_linear(m, 256); pdp_model_add_relu(m); pdp_model_add_linear(m, 10);
       pdp_optim_create(&opt, m, &(pdp_optim_desc){ .kind = PDP_OPTIM_ADAM });
       for (...) {                       /* x: pdp_tensor [batch, 784], y: int32 labels */
           pdp_model_forward_backward(m, x, y, &loss);
           pdp_optim_step(opt); pdp_optim_zero_grad(opt);
       }

   Every function that can fail returns a pdp_status; on failure pdp_last_error()
   says what and where ("pdp_model_forward: layer 0 (Linear) expects [64, 784],
   got [64, 785]"). examples/train_mnist.c is the whole program.

   BUILD
   =====
       cc -O2 -march=native app.c -lm -lpthread
       cc ... -DPDP_CBLAS app.c -lopenblas          GEMM through any CBLAS
       mpicc ... -DPDP_MPI app.c                    the MPI communicator
       nvcc -O2 -arch=sm_90 -DPDP_CUDA app.c pdp_cuda.cu -lcublas -lnccl
   Strict C99 on glibc needs _POSIX_C_SOURCE before the first system header; pdp.h
   defines it when it comes first, and stops with a hint when it cannot.

   OPTIONS (define before including)
   =================================
       PDP_IMPLEMENTATION   in one file: compile the implementation
       PDP_STATIC           every public symbol static (embed pdp twice)
       PDP_API              linkage of public symbols (default extern)
       PDP_MALLOC, PDP_FREE allocation (both or neither; default malloc/free)
       PDP_ASSERT           internal invariants (default assert)
       PDP_CBLAS            GEMM through cblas_sgemm (link a CBLAS)
       PDP_MPI              the MPI communicator backend (build with mpicc)
       PDP_CUDA             CUDA devices and NCCL (link pdp_cuda.o, cuBLAS, NCCL)

   MEMORY
   ======
   Every allocation goes through PDP_MALLOC/PDP_FREE. Parameters and gradients
   each live in one contiguous block with a view per named tensor. Activations are
   sized for the largest batch seen (pdp_model_reserve): after the first step at
   that batch, training steps allocate nothing.

   ERRORS
   ======
   pdp_status: PDP_OK = 0, negative codes by area (-1.. general, -100 shapes and
   numerics, -200 files, -300 CUDA, -400 communicators); pdp_status_name() gives
   the name. The message is thread-local. The library never exits and never prints
   unless given a log callback.

   THREADS AND DETERMINISM
   =======================
   pdp_set_num_threads(n) sets the intra-op threads of the calling thread (large
   GEMMs split over a process-wide pool of persistent workers; each output element
   is computed by one thread, so the bits do not depend on n). Random numbers come
   from explicit PCG32 states; a seed gives the same bits everywhere. Dropout masks
   are a function of (seed, layer, step, global sample index), so DP and DDP draw
   exactly the masks a single device would. Reductions run in a fixed order.

   DEVICES AND CUDA
   ================
   A tensor and a model live on a pdp_device (pdp_cpu(), pdp_cuda(i)). With
   PDP_CUDA, pdp_cuda.cu provides GPU memory, kernels, cuBLAS GEMMs and NCCL;
   without it a CUDA device fails with PDP_ERR_UNSUPPORTED naming the macro.

   DISTRIBUTED
   ===========
   DataParallel (pdp_dp): one process, one worker thread per device; replicate,
   scatter, parallel forward/backward, gather, reduce to the master, master step.
   DistributedDataParallel (pdp_ddp): one full replica per rank over a pdp_comm;
   gradients are all-reduced in buckets while backward still runs. Communicators:
   local (thread ranks, no dependency), mpi (PDP_MPI), nccl (PDP_CUDA).
   Rendezvous as torchrun: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT
   (or OMPI_COMM_WORLD_* under mpirun); a TCP store on rank 0. PDP_TRACE=out.json
   writes a Chrome trace of the steps and the collectives.

   NON-GOALS
   =========
   No autograd graph (models are sequential), no dtypes other than float32, no
   Windows threads yet, no ZeRO yet.

   VERSION HISTORY
   ===============
   0.1.0  first release: tensors, GEMM, layers, optimizers, checkpoints, DP, DDP.
          Full history in CHANGELOG.md.
*/
/* Strict C99 on glibc hides POSIX (threads, clocks, sockets) unless _POSIX_C_SOURCE
   is defined before the first system header. Define it here when we still can. */
#if defined(PDP_IMPLEMENTATION) && !defined(_WIN32) && defined(__STRICT_ANSI__) && \
    !defined(_POSIX_C_SOURCE) && !defined(_GNU_SOURCE) && !defined(_DEFAULT_SOURCE)
#  if defined(__GLIBC__)
#    error "pdp.h: define _POSIX_C_SOURCE 200809L before your first #include (or pass -D_POSIX_C_SOURCE=200809L) in the file that defines PDP_IMPLEMENTATION"
#  else
#    define _POSIX_C_SOURCE 200809L
#  endif
#endif

#ifndef PDP_H_INCLUDED
#define PDP_H_INCLUDED

#ifdef __cplusplus
extern "C" {
#endif

/* ---- begin src/base.h ---- */
/* base: version, linkage, status codes, errors, allocation overrides.

   Every public symbol is declared with PDP_API. Functions that can fail return a
   pdp_status (PDP_OK = 0, errors negative, in ranges by area) and leave a message
   in a thread-local buffer, read with pdp_last_error(). Option structs are plain
   structs whose zero value means "default". */

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#define PDP_VERSION_MAJOR 0
#define PDP_VERSION_MINOR 1
#define PDP_VERSION_PATCH 0
#define PDP__STR2(x) #x
#define PDP__STR(x) PDP__STR2(x)
#define PDP_VERSION_STRING                                                            \
    PDP__STR(PDP_VERSION_MAJOR) "." PDP__STR(PDP_VERSION_MINOR) "." PDP__STR(PDP_VERSION_PATCH)

#ifndef PDP_API
#  if defined(PDP_STATIC) && (defined(__GNUC__) || defined(__clang__))
#    define PDP_API static __attribute__((unused))
#  elif defined(PDP_STATIC)
#    define PDP_API static
#  else
#    define PDP_API extern
#  endif
#endif

/* Status codes: one X-macro list gives the enum and pdp_status_name().
   Ranges: -1..-99 general, -100s shape and numerics, -200s files, -300s CUDA,
   -400s communicators. */
#define PDP_STATUS_LIST(X)                                                            \
    X(PDP_OK, 0, "ok")                                                                \
    X(PDP_ERR_INVALID, -1, "invalid argument")                                        \
    X(PDP_ERR_OUT_OF_MEMORY, -2, "out of memory")                                     \
    X(PDP_ERR_UNSUPPORTED, -3, "not compiled in or not supported")                    \
    X(PDP_ERR_STATE, -4, "call out of order")                                         \
    X(PDP_ERR_WORKER, -5, "a worker thread failed")                                   \
    X(PDP_ERR_SHAPE, -100, "shape mismatch")                                          \
    X(PDP_ERR_DEVICE, -101, "device mismatch")                                        \
    X(PDP_ERR_NUMERIC, -102, "NaN or Inf")                                            \
    X(PDP_ERR_IO, -200, "file I/O failed")                                            \
    X(PDP_ERR_FORMAT, -201, "corrupt or foreign file")                                \
    X(PDP_ERR_CUDA, -300, "CUDA, cuBLAS or NCCL call failed")                         \
    X(PDP_ERR_NO_DEVICE, -301, "no CUDA device")                                      \
    X(PDP_ERR_COMM, -400, "communicator failed")                                      \
    X(PDP_ERR_TIMEOUT, -401, "timed out")

typedef enum pdp_status {
#define PDP__STATUS_ENUM(name, value, text) name = value,
    PDP_STATUS_LIST(PDP__STATUS_ENUM)
#undef PDP__STATUS_ENUM
    PDP__STATUS_FORCE_INT = -0x7fffffff
} pdp_status;

/* "PDP_ERR_SHAPE" for PDP_ERR_SHAPE; "PDP_UNKNOWN_STATUS" for anything else. */
PDP_API const char *pdp_status_name(pdp_status s);
/* The message of the last failure on this thread ("" if none). It starts with the
   public function's name and names the layer, shape, file or rank involved. */
PDP_API const char *pdp_last_error(void);
PDP_API void pdp_clear_error(void);
PDP_API const char *pdp_version_string(void);

/* Log levels for the optional log callbacks in descs; the library prints only
   through them. */
typedef enum pdp_log_level {
    PDP_LOG_ERROR = 0,
    PDP_LOG_WARN = 1,
    PDP_LOG_INFO = 2
} pdp_log_level;
typedef void (*pdp_log_fn)(pdp_log_level level, const char *message, void *user);

/* Intra-op threads: large GEMMs on the calling thread are split over a pool of
   persistent workers. n <= 0 means one per online core. The setting is per
   calling thread (a DP worker or a thread-rank sets its own; default 1); the
   workers are shared by the process, created on first use and reused. */
PDP_API pdp_status pdp_set_num_threads(int n);
PDP_API int pdp_get_num_threads(void);
/* Joins the pool's workers and frees the caller's scratch (for leak checkers and
   before unloading). The pool is the one piece of process-wide state; the next
   call that needs it starts it again. Call it when no other thread is in pdp. */
PDP_API void pdp_shutdown_threads(void);
/* ---- end src/base.h ---- */

/* ---- begin src/tensor.h ---- */
/* tensor: float32 tensors of 1 to 4 dimensions, contiguous, on a device; and the
   seeded random number generator used for initialisation and dropout.

   A tensor either owns its data (pdp_tensor_create) or is a view of another's
   (pdp_tensor_view, pdp_tensor_reshape_view) that lives as long as the owner.
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

typedef struct pdp_tensor {
    float *data;                  /* count floats, 64-byte aligned when owned */
    int64_t shape[PDP_MAX_DIMS];  /* shape[0..ndim-1]; the rest are 1 */
    int ndim;                     /* 1..4 */
    int64_t count;                /* product of the shape */
    pdp_device device;
    bool owns_data;               /* false for views */
} pdp_tensor;

/* A new zero-filled tensor of shape[0..ndim-1]. Fails with PDP_ERR_SHAPE on
   ndim outside 1..4 or a dimension < 1, naming the dimension. */
PDP_API pdp_status pdp_tensor_create(pdp_tensor **out, pdp_device device, int ndim,
                                     const int64_t *shape);
PDP_API void pdp_tensor_free(pdp_tensor *t); /* NULL is fine; frees owned data */
PDP_API pdp_status pdp_tensor_zeros(pdp_tensor *t);
PDP_API pdp_status pdp_tensor_fill(pdp_tensor *t, float value);
/* dst <- src; same count required (shapes may differ); any device pair. */
PDP_API pdp_status pdp_tensor_copy(pdp_tensor *dst, const pdp_tensor *src);
/* Copies between a tensor and host memory of t->count floats. */
PDP_API pdp_status pdp_tensor_upload(pdp_tensor *t, const float *host);
PDP_API pdp_status pdp_tensor_download(const pdp_tensor *t, float *host);
/* Fills *view (caller-owned struct, no allocation) with the same data seen
   through a new shape of the same count. */
PDP_API pdp_status pdp_tensor_reshape_view(const pdp_tensor *t, int ndim, const int64_t *shape,
                                           pdp_tensor *view);
/* Fills *view with rows [first, first + rows) of t along dimension 0. */
PDP_API pdp_status pdp_tensor_rows_view(const pdp_tensor *t, int64_t first, int64_t rows,
                                        pdp_tensor *view);
/* Wraps caller memory (not freed by pdp) as a tensor view. */
PDP_API pdp_status pdp_tensor_wrap(float *data, pdp_device device, int ndim, const int64_t *shape,
                                   pdp_tensor *view);
static inline pdp_device pdp_cpu(void) { pdp_device d = {PDP_DEVICE_CPU, 0}; return d; }
static inline pdp_device pdp_cuda(int ordinal) { pdp_device d = {PDP_DEVICE_CUDA, ordinal}; return d; }

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
/* Initialisers on CPU tensors (or any device through a host staging copy). */
PDP_API pdp_status pdp_tensor_uniform(pdp_tensor *t, pdp_rng *r, float lo, float hi);
PDP_API pdp_status pdp_tensor_normal(pdp_tensor *t, pdp_rng *r, float mean, float std);
/* Kaiming (He) uniform for ReLU nets: U(-b, b), b = gain * sqrt(3 / fan_in), with
   gain = sqrt(2 / (1 + a^2)); a = sqrt(5) gives PyTorch's Linear/Conv default. */
PDP_API pdp_status pdp_tensor_kaiming_uniform(pdp_tensor *t, pdp_rng *r, int64_t fan_in, float a);
/* Xavier (Glorot) uniform: U(-b, b), b = sqrt(6 / (fan_in + fan_out)). */
PDP_API pdp_status pdp_tensor_xavier_uniform(pdp_tensor *t, pdp_rng *r, int64_t fan_in,
                                             int64_t fan_out);
/* ---- end src/tensor.h ---- */

/* ---- begin src/ops.h ---- */
/* ops: CPU math kernels. SGEMM in the three layouts training needs, and the
   element and row operations the layers are built from.

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
/* ---- end src/ops.h ---- */

/* ---- begin src/model.h ---- */
/* model: a sequential model, its layers, and its one parameter registry.

   Parameters live in one contiguous block and gradients in another, in
   registration order, with one view per named tensor ("0.weight", "0.bias",
   "3.weight", ... as a PyTorch nn.Sequential's state_dict), so a checkpoint maps
   one to one onto the matching PyTorch module and a DDP bucket is a plain range
   of the gradient block. Backward accumulates into the gradients (zero them
   with pdp_model_zero_grad) and, right after each layer, calls the grad hook
   once for each parameter of that layer: the hook DDP's reducer listens to. */

typedef struct pdp_model pdp_model;

typedef struct pdp_model_desc {
    int input_ndim;          /* 1 (features) or 3 (channels, height, width); 0 = count of
                                nonzero input_shape entries */
    int64_t input_shape[3];  /* one sample, without the batch dimension; required */
    uint64_t seed;           /* parameter initialisation and dropout masks; default 0 */
    pdp_device device;       /* default CPU */
} pdp_model_desc;

PDP_API pdp_status pdp_model_create(pdp_model **out, const pdp_model_desc *desc);
PDP_API void pdp_model_free(pdp_model *m);

/* Layers, appended in order. Each validates against the current output shape and
   initialises its parameters as PyTorch does (Kaiming uniform with a = sqrt(5)
   for weights, U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for biases; LayerNorm weight
   1, bias 0) from the model's seed. Adding a layer moves the parameter block:
   views from pdp_model_param taken before are stale. */
PDP_API pdp_status pdp_model_add_linear(pdp_model *m, int64_t out_features);
PDP_API pdp_status pdp_model_add_relu(pdp_model *m);
PDP_API pdp_status pdp_model_add_gelu(pdp_model *m);    /* tanh form (approximate='tanh') */
PDP_API pdp_status pdp_model_add_tanh(pdp_model *m);
PDP_API pdp_status pdp_model_add_sigmoid(pdp_model *m);
PDP_API pdp_status pdp_model_add_dropout(pdp_model *m, float p); /* 0 <= p < 1 */
/* Normalises over all features of a sample; eps 0 means 1e-5. */
PDP_API pdp_status pdp_model_add_layernorm(pdp_model *m, float eps);
/* Square kernel; stride 0 means 1. Input must be (C, H, W). */
PDP_API pdp_status pdp_model_add_conv2d(pdp_model *m, int64_t out_channels, int64_t kernel,
                                        int64_t stride, int64_t padding);
/* Square window; stride 0 means kernel. */
PDP_API pdp_status pdp_model_add_maxpool2d(pdp_model *m, int64_t kernel, int64_t stride);
PDP_API pdp_status pdp_model_add_flatten(pdp_model *m);

/* x is [batch, input_shape...]; *y points at the model's own output tensor
   [batch, output features...], valid until the next forward. Activations are
   sized for the largest batch seen so far (pdp_model_reserve avoids growth in
   the training loop). */
PDP_API pdp_status pdp_model_forward(pdp_model *m, const pdp_tensor *x, const pdp_tensor **y);
/* dy is the gradient of the loss with respect to the last output, same shape.
   Accumulates parameter gradients; fires the grad hook after each layer. */
PDP_API pdp_status pdp_model_backward(pdp_model *m, const pdp_tensor *dy);
PDP_API pdp_status pdp_model_reserve(pdp_model *m, int64_t max_batch);
PDP_API void pdp_model_zero_grad(pdp_model *m);
PDP_API void pdp_model_set_training(pdp_model *m, bool training); /* default true */
PDP_API bool pdp_model_is_training(const pdp_model *m);

PDP_API int pdp_model_num_layers(const pdp_model *m);
PDP_API const char *pdp_model_layer_name(const pdp_model *m, int layer); /* "Linear" */
/* The shape of one output sample (without the batch dimension). */
PDP_API int pdp_model_output_shape(const pdp_model *m, int64_t shape[3]);
PDP_API int64_t pdp_model_param_count(const pdp_model *m); /* floats in all parameters */
PDP_API int pdp_model_num_params(const pdp_model *m);      /* named parameter tensors */
PDP_API pdp_device pdp_model_device(const pdp_model *m);

typedef struct pdp_param {
    const char *name;  /* "0.weight" */
    int layer;         /* index of the layer that owns it */
    int64_t offset;    /* in floats, into the flat parameter and gradient blocks */
    pdp_tensor value;  /* a view into the parameter block */
    pdp_tensor grad;   /* a view into the gradient block */
} pdp_param;

PDP_API pdp_status pdp_model_param(const pdp_model *m, int index, pdp_param *out);
PDP_API pdp_status pdp_model_find_param(const pdp_model *m, const char *name, pdp_param *out);
/* Views of the whole flat blocks (param_count floats each). */
PDP_API pdp_status pdp_model_flat(const pdp_model *m, pdp_tensor *params, pdp_tensor *grads);

/* Called during backward right after a parameter's gradient is final for this
   backward pass: once per parameter, in reverse layer order. */
typedef void (*pdp_grad_hook)(void *user, pdp_model *m, int param_index);
PDP_API void pdp_model_set_grad_hook(pdp_model *m, pdp_grad_hook fn, void *user);

/* One training pass for classification: forward, softmax cross-entropy against
   labels (mean over the batch), backward (gradients accumulate). *loss gets the
   mean loss; NaN or Inf fails with PDP_ERR_NUMERIC. Uses the model's own
   buffer for the loss gradient: nothing is allocated after the first call. */
PDP_API pdp_status pdp_model_forward_backward(pdp_model *m, const pdp_tensor *x,
                                              const int32_t *labels, float *loss);
/* ---- end src/model.h ---- */

/* ---- begin src/optim.h ---- */
/* optim: optimizers with PyTorch's exact update rules (torch.optim.SGD, Adam,
   AdamW), gradient clipping by global norm, and a learning-rate schedule.

   An optimizer updates the model's flat parameter block from its flat gradient
   block; its state (momentum, first and second moments) is flat too, with the
   same offsets, so it can be sharded by ranges (ZeRO) and saved in one piece.
   The state is allocated by pdp_optim_create (on the model's device, zeroed),
   so a step never allocates. The optimizer is bound to the model's parameter
   count at creation: adding layers afterwards makes pdp_optim_step fail with
   PDP_ERR_STATE. */

typedef struct pdp_optim pdp_optim;

typedef enum pdp_optim_kind {
    PDP_OPTIM_SGD = 0,
    PDP_OPTIM_ADAM = 1,
    PDP_OPTIM_ADAMW = 2
} pdp_optim_kind;

typedef struct pdp_optim_desc {
    pdp_optim_kind kind;  /* default SGD */
    float lr;             /* >= 0; default 0.01 for SGD, 0.001 for Adam and AdamW */
    float momentum;       /* SGD, >= 0; default 0 (no momentum buffer) */
    float dampening;      /* SGD, in [0, 1]; default 0 */
    bool nesterov;        /* SGD; needs momentum > 0 and dampening 0 */
    float weight_decay;   /* >= 0; default 0 (AdamW: 0 also means 0; PyTorch's default
                             is 0.01). SGD and Adam: L2 added to the gradient;
                             AdamW: decoupled, p *= 1 - lr * weight_decay */
    float beta1;          /* Adam/AdamW, in [0, 1); default 0.9 (0 cannot be asked for:
                             it means the default; use 1e-30 for "no first moment") */
    float beta2;          /* Adam/AdamW, in [0, 1); default 0.999 */
    float eps;            /* Adam/AdamW, >= 0; default 1e-8 */
} pdp_optim_desc;

/* desc may be NULL (SGD, lr 0.01). Invalid fields fail with PDP_ERR_INVALID
   naming the field and its value ("lr -0.1 < 0"). */
PDP_API pdp_status pdp_optim_create(pdp_optim **out, pdp_model *m, const pdp_optim_desc *desc);
PDP_API void pdp_optim_free(pdp_optim *o); /* NULL is fine */
/* One update of every parameter from its gradient; then steps += 1. Large
   blocks are split over the calling thread's intra-op threads (element-wise,
   so the bits do not depend on the thread count). */
PDP_API pdp_status pdp_optim_step(pdp_optim *o);
/* Zeros the gradient block of the model the optimizer was created on. */
PDP_API void pdp_optim_zero_grad(pdp_optim *o);
PDP_API void pdp_optim_set_lr(pdp_optim *o, float lr);
PDP_API float pdp_optim_lr(const pdp_optim *o);
PDP_API int64_t pdp_optim_steps(const pdp_optim *o); /* updates done so far */
/* The desc in use, defaults filled in (sokol's query-defaults). */
PDP_API pdp_optim_desc pdp_optim_get_desc(const pdp_optim *o);
PDP_API const char *pdp_optim_kind_name(pdp_optim_kind kind); /* "SGD", "Adam", "AdamW" */

/* Scales all gradients so their global L2 norm is at most max_norm (as
   torch.nn.utils.clip_grad_norm_); *total_norm gets the norm before clipping
   (may be NULL). A NaN or Inf norm fails with PDP_ERR_NUMERIC. */
PDP_API pdp_status pdp_clip_grad_norm(pdp_model *m, float max_norm, float *total_norm);

/* Linear warm-up, then cosine decay (llm.c's schedule). step counts from 0:
   step < warmup: base_lr * (step + 1) / warmup (the first step is not spent at
   lr 0); warmup <= step < total: min_lr + (base_lr - min_lr) * (1 + cos(pi *
   (step - warmup) / (total - warmup))) / 2; step >= total: min_lr. */
PDP_API float pdp_lr_warmup_cosine(int64_t step, int64_t warmup, int64_t total, float base_lr,
                                   float min_lr);
/* ---- end src/optim.h ---- */

/* ---- begin src/data.h ---- */
/* data: (to be written) */
/* ---- end src/data.h ---- */

/* ---- begin src/checkpoint.h ---- */
/* checkpoint: (to be written) */
/* ---- end src/checkpoint.h ---- */

/* ---- begin src/store.h ---- */
/* store: rendezvous the way torchrun does it, and a small TCP key-value store.

   pdp_env_read() tells a process who it is: RANK, WORLD_SIZE, LOCAL_RANK,
   LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT as torchrun exports them, or
   OpenMPI's OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE} under mpirun.

   The store is PyTorch's TCPStore in miniature: rank 0 serves it from a thread
   inside its own process, every rank (rank 0 too, through loopback) is a client.
   Ranks exchange small blobs through it before a collective library exists (the
   NCCL unique id) and synchronise with counters and barriers. Every blocking call
   ends by its timeout with PDP_ERR_TIMEOUT naming the key; nothing hangs. */

/* Who this process is. Defaults when nothing is set: rank 0 of 1, local rank 0
   of 1, 127.0.0.1:29500, from_env false. */
typedef struct pdp_env_info {
    int rank;              /* RANK, else OMPI_COMM_WORLD_RANK; 0 */
    int world_size;        /* WORLD_SIZE, else OMPI_COMM_WORLD_SIZE; 1 */
    int local_rank;        /* LOCAL_RANK, else OMPI_COMM_WORLD_LOCAL_RANK; else rank */
    int local_world_size;  /* LOCAL_WORLD_SIZE, else OMPI_COMM_WORLD_LOCAL_SIZE; else world */
    char master_addr[256]; /* MASTER_ADDR; "127.0.0.1" */
    int master_port;       /* MASTER_PORT; 29500 */
    bool from_env;         /* true when RANK/WORLD_SIZE or OMPI_COMM_WORLD_* were set */
} pdp_env_info;

/* Fills *out from the environment (torchrun's variables win over OpenMPI's; an
   empty variable counts as unset). PDP_ERR_INVALID, naming the variable and its
   value, for a non-integer, rank >= world size, a port outside 1..65535, or only
   one of RANK and WORLD_SIZE set. *out holds the defaults on failure. */
PDP_API pdp_status pdp_env_read(pdp_env_info *out);

/* Limits a server enforces on every request (a foreign peer gets an error reply
   and is disconnected); a client checks them before sending. */
#ifndef PDP_STORE_MAX_KEY
#  define PDP_STORE_MAX_KEY 1024                 /* bytes, without the NUL */
#endif
#ifndef PDP_STORE_MAX_VALUE
#  define PDP_STORE_MAX_VALUE (1024 * 1024)      /* bytes */
#endif

typedef struct pdp_store pdp_store;

typedef struct pdp_store_desc {
    const char *host; /* server: address to bind; client: address to reach; "127.0.0.1" */
    int port;         /* 29500; 0 on the server = a free ephemeral port (pdp_store_port) */
    bool is_server;   /* true on exactly one rank (rank 0): serve, then connect as a client */
    int world_size;   /* ranks taking part; default for pdp_store_barrier; 0 = unknown */
    double timeout_s; /* connect and default wait timeout, seconds; 300 */
} pdp_store_desc;

/* Creates a store handle. A server binds host:port, listens and starts its thread,
   then connects to itself like any client (to 127.0.0.1 when host is a wildcard
   such as "0.0.0.0"). A client retries the connection until timeout_s passes
   (the server may start later): PDP_ERR_TIMEOUT naming host:port. Calls on one
   handle are serialised; a thread that blocks in get/wait blocks the others on
   the same handle, so give each thread that waits its own handle. */
PDP_API pdp_status pdp_store_create(pdp_store **out, const pdp_store_desc *desc);
/* Closes the connection; on the server, also stops the thread and drops every
   client still connected. NULL is fine. */
PDP_API void pdp_store_free(pdp_store *s);
/* The server's port (the one bound when desc.port was 0). */
PDP_API int pdp_store_port(const pdp_store *s);

/* key: a NUL-terminated string of 1..PDP_STORE_MAX_KEY bytes. value: up to
   PDP_STORE_MAX_VALUE bytes (0 is fine); replaces any previous value and wakes
   every rank waiting for the key. */
PDP_API pdp_status pdp_store_set(pdp_store *s, const char *key, const void *value, size_t bytes);
/* Waits until key exists (the store's timeout_s), then copies its value into
   buf[0..cap) and its length into *bytes (may be NULL). A value longer than cap
   is PDP_ERR_INVALID with *bytes set to its length. */
PDP_API pdp_status pdp_store_get(pdp_store *s, const char *key, void *buf, size_t cap,
                                 size_t *bytes);
/* Waits until all n keys exist; timeout_s covers the whole call (0 = the store's). */
PDP_API pdp_status pdp_store_wait(pdp_store *s, const char **keys, int n, double timeout_s);
/* Atomically adds delta to the counter at key (a missing key counts as 0) and
   returns the new value in *result (may be NULL). Counters are stored as decimal
   text, so pdp_store_get on one reads e.g. "3". */
PDP_API pdp_status pdp_store_add(pdp_store *s, const char *key, int64_t delta, int64_t *result);
/* Returns once world_size ranks (0 = desc.world_size) have called it with this
   name; reusable: the k-th call on every rank meets the k-th call on the others. */
PDP_API pdp_status pdp_store_barrier(pdp_store *s, const char *name, int world_size,
                                     double timeout_s);
/* ---- end src/store.h ---- */

/* ---- begin src/comm.h ---- */
/* comm: communicators. One table of collectives (all-reduce, broadcast,
   reduce-scatter, all-gather, barrier) behind every backend:
     local  N ranks as threads of one process, buffers in shared memory; each
            rank reduces one slice. No dependency; the default.
     mpi    CPU ranks in separate processes or machines (-DPDP_MPI), with a
            progress thread so collectives overlap compute.
     nccl   GPU ranks (-DPDP_CUDA, pdp_cuda.cu).
   Every collective is asynchronous: it returns at once with a handle that
   pdp_work_wait completes (passing work = NULL makes the call synchronous).
   Buffers are floats on the communicator's device; counts are elements.
   Collectives on one communicator complete in the order they were issued, and
   every rank must issue the same collectives in the same order (as in MPI and
   NCCL). A rank that does not arrive within timeout_s makes the others fail
   with PDP_ERR_TIMEOUT naming the collective and the missing rank. */

typedef struct pdp_comm pdp_comm;
typedef struct pdp_work pdp_work;
typedef struct pdp_local_group pdp_local_group;

typedef enum pdp_backend {
    PDP_BACKEND_DEFAULT = 0, /* local */
    PDP_BACKEND_LOCAL = 1,
    PDP_BACKEND_MPI = 2,
    PDP_BACKEND_NCCL = 3
} pdp_backend;

typedef enum pdp_reduce_op {
    PDP_REDUCE_SUM = 0,
    PDP_REDUCE_AVG = 1
} pdp_reduce_op;

typedef struct pdp_comm_desc {
    pdp_backend backend;  /* default local */
    double timeout_s;     /* a collective waits this long for a missing rank; default 300 */
    pdp_device device;    /* where buffers live; default CPU (NCCL: the rank's GPU) */
    const char *name;     /* for messages and the trace; default "comm" */
} pdp_comm_desc;

/* ---- local backend: ranks are threads ----
   Create one group for world_size ranks, then each rank's thread calls
   pdp_comm_create_local with its rank. The group outlives its communicators. */
PDP_API pdp_status pdp_local_group_create(pdp_local_group **out, int world_size,
                                          const pdp_comm_desc *desc);
PDP_API void pdp_local_group_free(pdp_local_group *g);
PDP_API pdp_status pdp_comm_create_local(pdp_comm **out, pdp_local_group *g, int rank);

/* ---- from the environment (torchrun or mpirun) ----
   MPI: the rank and size come from MPI itself; NCCL: RANK, WORLD_SIZE,
   LOCAL_RANK, MASTER_ADDR, MASTER_PORT (or OMPI_COMM_WORLD_*), the unique id
   through the TCP store on rank 0. Local is not available here (it needs a
   group). A backend that was not compiled in fails with PDP_ERR_UNSUPPORTED
   naming the macro. */
PDP_API pdp_status pdp_comm_init_env(pdp_comm **out, const pdp_comm_desc *desc);

PDP_API void pdp_comm_free(pdp_comm *c);
PDP_API int pdp_comm_rank(const pdp_comm *c);
PDP_API int pdp_comm_size(const pdp_comm *c);
PDP_API pdp_backend pdp_comm_backend(const pdp_comm *c);

/* In place: buf <- op over ranks of buf. */
PDP_API pdp_status pdp_comm_allreduce(pdp_comm *c, float *buf, int64_t count, pdp_reduce_op op,
                                      pdp_work **work);
/* buf on every rank <- buf on root. */
PDP_API pdp_status pdp_comm_broadcast(pdp_comm *c, float *buf, int64_t count, int root,
                                      pdp_work **work);
/* send holds size * recv_count floats; rank r gets slice r of op over ranks. */
PDP_API pdp_status pdp_comm_reduce_scatter(pdp_comm *c, const float *send, float *recv,
                                           int64_t recv_count, pdp_reduce_op op, pdp_work **work);
/* recv (size * send_count floats) <- every rank's send, in rank order. */
PDP_API pdp_status pdp_comm_allgather(pdp_comm *c, const float *send, float *recv,
                                      int64_t send_count, pdp_work **work);
PDP_API pdp_status pdp_comm_barrier(pdp_comm *c, pdp_work **work);
/* Host bytes from root to every rank, synchronous (descriptions, signatures). */
PDP_API pdp_status pdp_comm_broadcast_bytes(pdp_comm *c, void *buf, size_t bytes, int root);

/* Completes a collective and recycles its handle (NULL is fine). The error of
   a failed collective is returned here, with its message. */
PDP_API pdp_status pdp_work_wait(pdp_work *work);
/* true once the collective has completed (the handle stays valid until waited). */
PDP_API bool pdp_work_done(pdp_work *work);

/* Per-communicator counters, for learners and benchmarks. */
typedef struct pdp_comm_stats {
    int64_t collectives;   /* issued */
    int64_t bytes_sent;    /* by this rank, as the algorithm moves them */
    double busy_s;         /* summed launch-to-completion time of the collectives */
} pdp_comm_stats;
PDP_API void pdp_comm_get_stats(const pdp_comm *c, pdp_comm_stats *out);
/* ---- end src/comm.h ---- */

/* ---- begin src/dp.h ---- */
/* dp: (to be written) */
/* ---- end src/dp.h ---- */

/* ---- begin src/ddp.h ---- */
/* ddp: (to be written) */
/* ---- end src/ddp.h ---- */

/* ---- begin src/cuda.h ---- */
/* cuda: (to be written) */
/* ---- end src/cuda.h ---- */

#ifdef __cplusplus
}
#endif

#endif /* PDP_H_INCLUDED */

#ifndef PDP__MATH_INCLUDED
#define PDP__MATH_INCLUDED

/* ---- begin src/math.h ---- */
/* math: element math written once for the CPU (layers.c, optim.c) and for the
   CUDA kernels of pdp_cuda.cu.

   pdp.h emits this block after the public API and outside the implementation
   guard, so pdp_cuda.cu includes it without the CPU implementation, and the CPU
   tests cover the very formulas the kernels run. Every helper is `static inline
   PDP__HOSTDEV`: __host__ __device__ under nvcc, nothing otherwise. Only <math.h>
   float functions and integer arithmetic are used, so the dropout hash gives the
   same bits on both sides. */

#include <math.h>
#include <stdint.h>

#if defined(__CUDACC__)
#  define PDP__HOSTDEV __host__ __device__
#else
#  define PDP__HOSTDEV
#endif

/* ---- math: activations ----
   Each forward helper has a backward partner that returns dL/dx from the
   upstream gradient and whatever forward value is cheapest to reuse (x for GELU,
   y for the others). */

static inline PDP__HOSTDEV float pdp__relu(float x) { return x > 0.0f ? x : 0.0f; }
/* From the output: y > 0 exactly where x > 0 (PyTorch's threshold_backward). */
static inline PDP__HOSTDEV float pdp__relu_grad(float dy, float y) { return y > 0.0f ? dy : 0.0f; }

/* GELU, tanh approximation (PyTorch's approximate='tanh', Hendrycks and Gimpel
   2016): 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3). */
#define PDP__GELU_C 0.7978845608028654f /* sqrt(2 / pi) */
#define PDP__GELU_A 0.044715f
static inline PDP__HOSTDEV float pdp__gelu(float x)
{
    float u = PDP__GELU_C * (x + PDP__GELU_A * x * x * x);
    return 0.5f * x * (1.0f + tanhf(u));
}
/* d/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) du/dx, t = tanh(u), du/dx = c (1 + 3 a x^2). */
static inline PDP__HOSTDEV float pdp__gelu_grad(float dy, float x)
{
    float x2 = x * x;
    float t = tanhf(PDP__GELU_C * (x + PDP__GELU_A * x2 * x));
    float du = PDP__GELU_C * (1.0f + 3.0f * PDP__GELU_A * x2);
    return dy * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du);
}

static inline PDP__HOSTDEV float pdp__tanh_grad(float dy, float y) { return dy * (1.0f - y * y); }

/* 1 / (1 + e^-x), written so that neither branch overflows. */
static inline PDP__HOSTDEV float pdp__sigmoid(float x)
{
    if (x >= 0.0f) return 1.0f / (1.0f + expf(-x));
    {
        float e = expf(x);
        return e / (1.0f + e);
    }
}
static inline PDP__HOSTDEV float pdp__sigmoid_grad(float dy, float y) { return dy * y * (1.0f - y); }

/* ---- math: dropout masks ----
   The mask bit of element j of sample s is a pure function of
   (seed, layer, step, s, j): a counter-based generator in the style of
   Salmon et al., "Parallel random numbers: as easy as 1, 2, 3" (SC 2011), built
   from SplitMix64's finaliser (Steele, Lea and Flood, OOPSLA 2014). Nothing is
   carried from one element to the next, so any split of a batch (DP replicas
   with their sample_base, CUDA threads) draws exactly the masks that one device
   draws for the whole batch. An element is kept when the top 24 bits of its hash
   are >= the threshold floor(p * 2^24): probability 1 - p up to 2^-24. */

static inline PDP__HOSTDEV uint64_t pdp__mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The key of one sample; element j's draw is pdp__dropout_bits(key, j). */
static inline PDP__HOSTDEV uint64_t pdp__dropout_key(uint64_t seed, int layer, uint64_t step,
                                                     int64_t sample)
{
    uint64_t k = pdp__mix64(seed + 0x9e3779b97f4a7c15ull * (uint64_t)(layer + 1));
    k = pdp__mix64(k ^ (step * 0xd1b54a32d192ed03ull));
    return pdp__mix64(k ^ ((uint64_t)sample * 0x8cb92ba72f3d8dd7ull));
}

/* 24 uniform bits for element j of the sample with this key. */
static inline PDP__HOSTDEV uint32_t pdp__dropout_bits(uint64_t key, int64_t j)
{
    return (uint32_t)(pdp__mix64(key + 0x9e3779b97f4a7c15ull * (uint64_t)(j + 1)) >> 40);
}

/* floor(p * 2^24), computed in float exactly as on the device. */
static inline PDP__HOSTDEV uint32_t pdp__dropout_threshold(float p)
{
    return (uint32_t)(p * 16777216.0f);
}

/* ---- math: optimizer element updates ----
   One parameter element of torch.optim.SGD, Adam and AdamW (PyTorch 1.13+,
   single-tensor path, maximize=False), in PyTorch's operation order so the
   bits follow it. The caller turns the hyper-parameters into per-step float
   scalars once (in double on the host, as PyTorch does in Python), and both
   the CPU loop of optim.c and a CUDA kernel call these per element.

   SGD:   d = g + wd p;  b = first ? d : momentum b + (1 - dampening) d;
          d = nesterov ? d + momentum b : b (momentum > 0 only);  p -= lr d.
   Adam:  g += l2 p (Adam's weight decay; 0 for AdamW);  p *= decay
          (AdamW's 1 - lr wd; 1 for Adam);  m = beta1 m + (1 - beta1) g;
          v = beta2 v + (1 - beta2) g g;  p -= step_size m / (sqrt(v) / bc2_sqrt + eps),
          step_size = lr / (1 - beta1^t), bc2_sqrt = sqrt(1 - beta2^t). */

/* one_minus_damp = 1 - dampening. first: the momentum buffer is initialised
   to d (PyTorch's clone on the first step). buf is unused when momentum == 0. */
static inline PDP__HOSTDEV float pdp__sgd_update(float p, float g, float *buf, float lr,
                                                 float momentum, float one_minus_damp,
                                                 float weight_decay, int nesterov, int first)
{
    float d = weight_decay != 0.0f ? g + weight_decay * p : g;
    if (momentum != 0.0f) {
        float b = first ? d : momentum * *buf + one_minus_damp * d;
        *buf = b;
        d = nesterov ? d + momentum * b : b;
    }
    return p - lr * d;
}

/* Adam and AdamW (see above); *m and *v are the element's moments. */
static inline PDP__HOSTDEV float pdp__adam_update(float p, float g, float *m, float *v, float beta1,
                                                  float one_minus_beta1, float beta2,
                                                  float one_minus_beta2, float step_size,
                                                  float bc2_sqrt, float eps, float l2, float decay)
{
    float mm, vv;
    if (l2 != 0.0f) g = g + l2 * p;
    p = p * decay;
    mm = beta1 * *m + one_minus_beta1 * g;
    vv = beta2 * *v + one_minus_beta2 * g * g;
    *m = mm;
    *v = vv;
    return p - step_size * mm / (sqrtf(vv) / bc2_sqrt + eps);
}
/* ---- end src/math.h ---- */

#endif /* PDP__MATH_INCLUDED */

#if defined(PDP_IMPLEMENTATION) && !defined(PDP__IMPLEMENTATION_INCLUDED)
#define PDP__IMPLEMENTATION_INCLUDED

/* Private helpers are static; a program that uses part of the library leaves
   some of them unused, which is not worth a warning. */
#if defined(__GNUC__) || defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#endif

/* ---- begin src/internal.h ---- */
/* internal: private helpers shared by every implementation module.

   System includes, the allocation and assert overrides, the error helper
   pdp__err() that formats the thread-local message and returns the status, the
   aligned allocator, timers and small utilities. Nothing here is public. */

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <float.h>
#include <errno.h>
#include <time.h>
#include <pthread.h>

#if defined(PDP_MALLOC) != defined(PDP_FREE)
#  error "pdp.h: define both PDP_MALLOC and PDP_FREE, or neither"
#endif
#ifndef PDP_MALLOC
#  define PDP_MALLOC(bytes) malloc(bytes)
#  define PDP_FREE(ptr) free(ptr)
#endif
#ifndef PDP_ASSERT
#  include <assert.h>
#  define PDP_ASSERT(c) assert(c)
#endif

#if defined(__GNUC__) || defined(__clang__)
#  define PDP__THREAD_LOCAL __thread
#  define PDP__UNUSED __attribute__((unused))
#elif defined(_MSC_VER)
#  define PDP__THREAD_LOCAL __declspec(thread)
#  define PDP__UNUSED
#else
#  error "pdp.h: needs a thread-local storage keyword (__thread or __declspec(thread))"
#endif

#define PDP__MIN(a, b) ((a) < (b) ? (a) : (b))
#define PDP__MAX(a, b) ((a) > (b) ? (a) : (b))
#define PDP__DEF(val, def) ((val) ? (val) : (def))
#define PDP__ALIGN 64

/* Formats the thread-local message and returns status: a failing branch is one
   line, `return pdp__err(PDP_ERR_SHAPE, "pdp_x: layer %d ...", ...)`. */
static pdp_status pdp__err(pdp_status status, const char *fmt, ...);
/* Prepends "context: " to the current message (for errors passed up a level). */
static pdp_status pdp__err_wrap(pdp_status status, const char *fmt, ...);

/* PDP_MALLOC'd memory aligned to 64 bytes (the original pointer is stored just
   before the block). Returns NULL on failure; bytes == 0 gives a valid block. */
static void *pdp__alloc(size_t bytes);
static void *pdp__calloc(size_t bytes);
static void pdp__dealloc(void *p);

/* Monotonic seconds. */
static double pdp__now(void);

/* The intra-op setting of the calling thread (see pdp_set_num_threads). */
static int pdp__threads_for_caller(void);
/* Runs fn(arg, i, n) for i in [0, n) on the intra-op pool plus the calling thread
   (n <= the caller's thread count); returns when all are done. */
static void pdp__parallel_for(int n, void (*fn)(void *arg, int i, int n), void *arg);
/* This thread's growing scratch buffer (64-byte aligned, freed at thread exit), or
   NULL when out of memory; valid until the next call on this thread. Leaf use only. */
static void *pdp__thread_scratch(size_t bytes);

/* ---- devices (cuda_host.c) ----
   Memory on a device other than the CPU goes through these; without PDP_CUDA a
   CUDA device fails with PDP_ERR_UNSUPPORTED naming the macro. */
static pdp_status pdp__dev_alloc(pdp_device d, size_t bytes, void **out);
static void pdp__dev_free(pdp_device d, void *p);
static pdp_status pdp__dev_memset0(pdp_device d, void *p, size_t bytes);
static pdp_status pdp__dev_fill(pdp_device d, float *p, int64_t count, float value);
static pdp_status pdp__dev_copy(pdp_device dst_dev, void *dst, pdp_device src_dev, const void *src,
                                size_t bytes);

/* ---- model internals (model.c, layers.c, loss.c and the executors) ---- */

typedef enum pdp__layer_kind {
    PDP__LINEAR,
    PDP__RELU,
    PDP__GELU,
    PDP__TANH,
    PDP__SIGMOID,
    PDP__DROPOUT,
    PDP__LAYERNORM,
    PDP__CONV2D,
    PDP__MAXPOOL2D,
    PDP__FLATTEN
} pdp__layer_kind;

/* A layer's definition: immutable once added, shared by replicas. */
typedef struct pdp__layer {
    pdp__layer_kind kind;
    int index;                           /* position in the model ("3" of "3.weight") */
    int in_ndim, out_ndim;               /* per-sample shapes: (F) or (C, H, W) */
    int64_t in_shape[3], out_shape[3];
    int64_t in_count, out_count;         /* per-sample element counts */
    int param_first, nparams;            /* registry indices (weight, then bias) */
    int64_t out_features;                /* Linear; Conv2d out channels */
    int64_t kernel, stride, padding;     /* Conv2d, MaxPool2d */
    float p;                             /* Dropout */
    float eps;                           /* LayerNorm */
    int64_t saved_per_sample;            /* floats kept from forward for backward */
    int64_t work_per_sample;             /* floats of temporary workspace */
} pdp__layer;

/* What one layer call sees. Pointers are on the model's device. */
typedef struct pdp__layer_io {
    int64_t batch;
    const float *x;      /* [batch, in_count] */
    float *y;            /* [batch, out_count] */
    const float *dy;     /* backward: [batch, out_count] */
    float *dx;           /* backward: [batch, in_count], NULL when not needed (first layer) */
    float *w, *b;        /* parameters (NULL when absent) */
    float *dw, *db;      /* their gradients, accumulated into (+=) */
    float *saved;        /* [batch, saved_per_sample] written by forward, read by backward */
    float *work;         /* [batch, work_per_sample] scratch, shared by all layers */
    bool training;
    uint64_t seed;       /* dropout: mask = f(seed, layer, step, sample_base + i, j) */
    uint64_t step;
    int64_t sample_base;
} pdp__layer_io;

/* layers.c: shape inference and validation (fills out_*, saved/work sizes and the
   parameter shapes), parameter initialisation, forward, backward. */
static pdp_status pdp__layer_setup(pdp__layer *l, int64_t wshape[4], int *wndim, int64_t bshape[4],
                                   int *bndim);
static void pdp__layer_init_params(const pdp__layer *l, float *w, float *b, pdp_rng *r);
static pdp_status pdp__layer_forward(const pdp__layer *l, const pdp__layer_io *io);
static pdp_status pdp__layer_backward(const pdp__layer *l, const pdp__layer_io *io);
static const char *pdp__layer_kind_name(pdp__layer_kind k);

typedef struct pdp__param_entry {
    char name[32];
    int layer;
    int ndim;
    int64_t shape[4];
    int64_t offset, count;
} pdp__param_entry;

struct pdp_model {
    pdp_device device;
    uint64_t seed;
    pdp_rng init_rng;
    int in_ndim;
    int64_t in_shape[3], in_count;
    pdp__layer *layers;
    int nlayers, cap_layers;
    pdp__param_entry *params;
    int nparams, cap_params;
    int64_t param_count;
    float *param_block;      /* param_count floats (borrowed when params_shared) */
    float *grad_block;       /* param_count floats */
    bool params_shared;      /* a DP replica reading its master's parameters */
    /* activations: act[i] is the output of layer i, [max_batch, out_count] */
    int64_t max_batch, batch;
    float **act;
    float *act_block, *saved_block, *work_block, *grad_a, *grad_b;
    int64_t *saved_off;      /* per layer, floats per sample before it in saved_block */
    pdp_tensor out_view;
    bool training;
    bool have_forward;       /* a forward ran since the last backward */
    uint64_t step;           /* training forwards so far (keys dropout masks) */
    int64_t sample_base;     /* global index of this model's first sample (DP replicas) */
    pdp_grad_hook hook;
    void *hook_user;
};

/* A model with the same layers and a fresh set of buffers. share_params: the
   clone reads src's parameter block (CPU DP replicas); otherwise it gets its own
   copy of the parameter values. */
static pdp_status pdp__model_clone(const pdp_model *src, pdp_device device, bool share_params,
                                   pdp_model **out);

/* ---- losses (loss.c) ----
   Softmax cross-entropy over integer labels: *loss_sum gets the sum over the
   batch of -log softmax(logits)[label] (double accumulation), and when dlogits
   is not NULL it gets (softmax - onehot) * grad_scale. The public loss uses
   grad_scale = 1/batch; DP replicas use 1/global_batch so that the reduced
   gradients equal those of the whole batch. fn names the public caller. */
static pdp_status pdp__cross_entropy(const float *logits, const int32_t *labels, int64_t batch,
                                     int64_t classes, float grad_scale, double *loss_sum,
                                     float *dlogits, const char *fn);

/* ---- optimizer internals (optim.c) ----
   Updates parameters [lo, hi) of the flat blocks (all of them for a normal
   step; one rank's shard under ZeRO). The step counter is advanced by the
   caller-visible pdp_optim_step only. */
static pdp_status pdp__optim_step_range(pdp_optim *o, float *params, const float *grads,
                                        int64_t lo, int64_t hi);

/* ---- communicator internals (comm.c, comm_mpi.c, pdp_cuda.cu's NCCL) ----
   Each backend fills one table; the public pdp_comm_* functions validate their
   arguments, then call it. A backend keeps its own handle pool so that a
   training step allocates nothing. */
typedef struct pdp__comm_ops {
    pdp_status (*allreduce)(pdp_comm *c, float *buf, int64_t count, pdp_reduce_op op, pdp_work **w);
    pdp_status (*broadcast)(pdp_comm *c, float *buf, int64_t count, int root, pdp_work **w);
    pdp_status (*reduce_scatter)(pdp_comm *c, const float *send, float *recv, int64_t recv_count,
                                 pdp_reduce_op op, pdp_work **w);
    pdp_status (*allgather)(pdp_comm *c, const float *send, float *recv, int64_t send_count,
                            pdp_work **w);
    pdp_status (*barrier)(pdp_comm *c, pdp_work **w);
    pdp_status (*broadcast_bytes)(pdp_comm *c, void *buf, size_t bytes, int root);
    pdp_status (*wait)(pdp_work *w);
    bool (*done)(pdp_work *w);
    void (*destroy)(pdp_comm *c);
} pdp__comm_ops;

/* Common head of every communicator; a backend keeps its state behind impl. */
struct pdp_comm {
    const pdp__comm_ops *ops;
    pdp_backend backend;
    int rank, size;
    double timeout_s;
    pdp_device device;
    char name[32];
    pdp_comm_stats stats;
    void *impl;
};

/* Common head of every handle; a backend's handle struct begins with it. */
struct pdp_work {
    pdp_comm *comm;
    const char *op_name;  /* "allreduce", for messages and the trace */
    int64_t seq;          /* collective number on this communicator */
    double t_launch;      /* pdp__now() at launch */
};
/* ---- end src/internal.h ---- */

/* ---- begin src/base.c ---- */
/* base: status names, the thread-local error message, aligned allocation. */

/* #include "internal.h" (already above) */

static PDP__THREAD_LOCAL char pdp__errbuf[1024];

PDP_API const char *pdp_status_name(pdp_status s)
{
    switch (s) {
#define PDP__STATUS_CASE(name, value, text) case name: return #name;
        PDP_STATUS_LIST(PDP__STATUS_CASE)
#undef PDP__STATUS_CASE
    default: return "PDP_UNKNOWN_STATUS";
    }
}

PDP_API const char *pdp_last_error(void) { return pdp__errbuf; }
PDP_API void pdp_clear_error(void) { pdp__errbuf[0] = '\0'; }
PDP_API const char *pdp_version_string(void) { return PDP_VERSION_STRING; }

static pdp_status pdp__err(pdp_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pdp__errbuf, sizeof pdp__errbuf, fmt, ap);
    va_end(ap);
    return status;
}

static pdp_status pdp__err_wrap(pdp_status status, const char *fmt, ...)
{
    char prefix[256];
    size_t n, old = strlen(pdp__errbuf), cap = sizeof pdp__errbuf;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    n = strlen(prefix);
    if (n + 2 >= cap) n = cap - 3;
    if (old > cap - 1 - n - 2) old = cap - 1 - n - 2;
    memmove(pdp__errbuf + n + 2, pdp__errbuf, old); /* "prefix: " + old message */
    memcpy(pdp__errbuf, prefix, n);
    pdp__errbuf[n] = ':';
    pdp__errbuf[n + 1] = ' ';
    pdp__errbuf[n + 2 + old] = '\0';
    return status;
}

static void *pdp__alloc(size_t bytes)
{
    unsigned char *raw = (unsigned char *)PDP_MALLOC(bytes + PDP__ALIGN + sizeof(void *));
    uintptr_t p;
    if (!raw) return NULL;
    p = ((uintptr_t)(raw + sizeof(void *)) + PDP__ALIGN - 1) & ~(uintptr_t)(PDP__ALIGN - 1);
    ((void **)p)[-1] = raw;
    return (void *)p;
}

static void *pdp__calloc(size_t bytes)
{
    void *p = pdp__alloc(bytes);
    if (p) memset(p, 0, bytes);
    return p;
}

static void pdp__dealloc(void *p)
{
    if (p) PDP_FREE(((void **)p)[-1]);
}

static double pdp__now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
/* ---- end src/base.c ---- */

/* ---- begin src/threads.c ---- */
/* threads: the intra-op thread pool behind pdp_set_num_threads, and per-thread scratch.

   The thread count is a per-thread setting (a thread-local int, default 1): each
   DP worker or thread-rank chooses its own, and nothing a thread sets is seen by
   another. The workers themselves are shared: one process-wide pool of persistent
   POSIX threads, the single piece of process-wide state in pdp (OpenBLAS and every
   OpenMP runtime keep the same kind of pool). It is created lazily by the first
   pdp__parallel_for that needs it, grows when a caller asks for more threads than
   it has, is reused by every later call, and is joined by pdp_shutdown_threads
   (after which the next call starts it again).

   Handing off work: a caller that wins pool.busy (pthread_mutex_trylock) writes the
   job under pool.lock, bumps the generation and broadcasts pool.wake; worker w runs
   index w + 1, the caller runs index 0 itself, then sleeps on pool.done until the
   pending count reaches zero. Nobody spins and nothing is read outside the lock,
   so the pool is TSan clean. A caller that loses the trylock (another thread is
   using the pool, e.g. two DP workers in GEMM at once, or a nested call from inside
   a job) runs every index itself, in order. Which thread runs an index never
   changes what the index computes, so results do not depend on who won.

   Scratch: pdp__thread_scratch() gives each thread one growing 64-byte aligned
   buffer (GEMM packs its panels there), kept in a pthread key whose destructor
   frees it when the thread exits; pdp_shutdown_threads frees the caller's. */

/* #include "internal.h" (already above) */
#include <unistd.h>

#define PDP__MAX_THREADS 256

/* ---- threads: the per-thread setting ---- */

static PDP__THREAD_LOCAL int pdp__num_threads; /* 0: never set, which means 1 */

PDP_API pdp_status pdp_set_num_threads(int n)
{
    if (n <= 0) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        n = cores > 0 ? (int)PDP__MIN(cores, (long)PDP__MAX_THREADS) : 1;
    }
    if (n > PDP__MAX_THREADS)
        return pdp__err(PDP_ERR_INVALID, "pdp_set_num_threads: n = %d exceeds the maximum of %d",
                        n, PDP__MAX_THREADS);
    pdp__num_threads = n;
    return PDP_OK;
}

PDP_API int pdp_get_num_threads(void) { return pdp__num_threads > 0 ? pdp__num_threads : 1; }

static int pdp__threads_for_caller(void) { return pdp_get_num_threads(); }

/* ---- threads: per-thread scratch ---- */

typedef struct pdp__scratch_hdr {
    size_t bytes; /* usable bytes after the header */
} pdp__scratch_hdr;

static pthread_once_t pdp__scratch_once = PTHREAD_ONCE_INIT;
static pthread_key_t pdp__scratch_key;
static int pdp__scratch_key_ok;

static void pdp__scratch_free(void *p) { pdp__dealloc(p); }

static void pdp__scratch_init(void)
{
    pdp__scratch_key_ok = pthread_key_create(&pdp__scratch_key, pdp__scratch_free) == 0;
}

/* This thread's scratch buffer of at least `bytes` bytes (64-byte aligned), or NULL
   when out of memory. Valid until the next call on the same thread; its contents
   are not kept when it grows. Only leaf routines (GEMM) use it, never nested. */
static void *pdp__thread_scratch(size_t bytes)
{
    pdp__scratch_hdr *h;
    pthread_once(&pdp__scratch_once, pdp__scratch_init);
    if (!pdp__scratch_key_ok) return NULL;
    h = (pdp__scratch_hdr *)pthread_getspecific(pdp__scratch_key);
    if (!h || h->bytes < bytes) {
        size_t grown = bytes + bytes / 4 + 4096;
        pdp__dealloc(h);
        pthread_setspecific(pdp__scratch_key, NULL);
        h = (pdp__scratch_hdr *)pdp__alloc(PDP__ALIGN + grown);
        if (!h) return NULL;
        h->bytes = grown;
        pthread_setspecific(pdp__scratch_key, h);
    }
    return (unsigned char *)h + PDP__ALIGN;
}

/* ---- threads: the pool ---- */

/* The pool. busy is held by the one caller that owns the pool for a job; lock
   guards every field of pdp__the_pool; wake tells workers about a new generation
   (or stop); done tells the caller that pending reached 0. */
static pthread_mutex_t pdp__pool_busy = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t pdp__pool_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pdp__pool_wake = PTHREAD_COND_INITIALIZER;
static pthread_cond_t pdp__pool_done = PTHREAD_COND_INITIALIZER;

typedef struct pdp__pool {
    pthread_t tid[PDP__MAX_THREADS - 1];
    unsigned long start_gen[PDP__MAX_THREADS - 1]; /* generation when worker w was made */
    int nworkers;
    int stop;
    unsigned long generation; /* bumped once per job */
    void (*fn)(void *arg, int i, int n);
    void *arg;
    int n;       /* indices of the current job; worker w runs index w + 1 */
    int pending; /* workers that have not finished the current job */
} pdp__pool;

static pdp__pool pdp__the_pool; /* zero: no workers yet */

static void *pdp__worker_main(void *p)
{
    pdp__pool *pool = &pdp__the_pool;
    int w = (int)(intptr_t)p;
    unsigned long seen;
    pthread_mutex_lock(&pdp__pool_lock);
    seen = pool->start_gen[w];
    for (;;) {
        void (*fn)(void *, int, int);
        void *arg;
        int n;
        while (pool->generation == seen && !pool->stop) pthread_cond_wait(&pdp__pool_wake, &pdp__pool_lock);
        if (pool->stop) break;
        seen = pool->generation;
        fn = pool->fn;
        arg = pool->arg;
        n = pool->n;
        if (w + 1 >= n) continue; /* not part of this job */
        pthread_mutex_unlock(&pdp__pool_lock);
        fn(arg, w + 1, n);
        pthread_mutex_lock(&pdp__pool_lock);
        if (--pool->pending == 0) pthread_cond_signal(&pdp__pool_done);
    }
    pthread_mutex_unlock(&pdp__pool_lock);
    return NULL;
}

/* Makes sure the pool has `want` workers (called with busy held, no job running).
   Stops at the first pthread_create failure: the caller then runs the missing
   indices itself. */
static void pdp__pool_grow(pdp__pool *pool, int want)
{
    want = PDP__MIN(want, PDP__MAX_THREADS - 1);
    while (pool->nworkers < want) {
        int w = pool->nworkers;
        pthread_mutex_lock(&pdp__pool_lock);
        pool->start_gen[w] = pool->generation;
        pthread_mutex_unlock(&pdp__pool_lock);
        if (pthread_create(&pool->tid[w], NULL, pdp__worker_main, (void *)(intptr_t)w) != 0) break;
        pthread_mutex_lock(&pdp__pool_lock);
        pool->nworkers++;
        pthread_mutex_unlock(&pdp__pool_lock);
    }
}

static void pdp__parallel_for(int n, void (*fn)(void *arg, int i, int n), void *arg)
{
    pdp__pool *pool = &pdp__the_pool;
    int i, helpers;
    if (n <= 1) {
        if (n == 1) fn(arg, 0, 1);
        return;
    }
    if (pthread_mutex_trylock(&pdp__pool_busy) != 0) { /* in use: run it all here */
        for (i = 0; i < n; i++) fn(arg, i, n);
        return;
    }
    pdp__pool_grow(pool, n - 1);
    pthread_mutex_lock(&pdp__pool_lock);
    helpers = PDP__MIN(n - 1, pool->nworkers);
    pool->fn = fn;
    pool->arg = arg;
    pool->n = n;
    pool->pending = helpers;
    pool->generation++;
    pthread_cond_broadcast(&pdp__pool_wake);
    pthread_mutex_unlock(&pdp__pool_lock);

    fn(arg, 0, n);
    for (i = helpers + 1; i < n; i++) fn(arg, i, n); /* only if workers could not be made */

    pthread_mutex_lock(&pdp__pool_lock);
    while (pool->pending > 0) pthread_cond_wait(&pdp__pool_done, &pdp__pool_lock);
    pthread_mutex_unlock(&pdp__pool_lock);
    pthread_mutex_unlock(&pdp__pool_busy);
}

PDP_API void pdp_shutdown_threads(void)
{
    pdp__pool *pool = &pdp__the_pool;
    int w, nworkers;
    pthread_mutex_lock(&pdp__pool_busy); /* waits for a job in flight to finish */
    pthread_mutex_lock(&pdp__pool_lock);
    pool->stop = 1;
    nworkers = pool->nworkers;
    pthread_cond_broadcast(&pdp__pool_wake);
    pthread_mutex_unlock(&pdp__pool_lock);
    for (w = 0; w < nworkers; w++) pthread_join(pool->tid[w], NULL);
    pthread_mutex_lock(&pdp__pool_lock);
    pool->stop = 0;
    pool->nworkers = 0;
    pthread_mutex_unlock(&pdp__pool_lock);
    pthread_mutex_unlock(&pdp__pool_busy);

    pthread_once(&pdp__scratch_once, pdp__scratch_init);
    if (pdp__scratch_key_ok) {
        pdp__dealloc(pthread_getspecific(pdp__scratch_key));
        pthread_setspecific(pdp__scratch_key, NULL);
    }
}
/* ---- end src/threads.c ---- */

/* ---- begin src/tensor.c ---- */
/* tensor: creation, views, copies and initialisers; the PCG32 generator.

   Invariants: shape[i] >= 1 for i < ndim and 1 beyond; count is their product;
   owned data is 64-byte aligned and zero-filled at creation. CUDA tensors are
   allocated and copied by pdp_cuda.cu through the pdp__dev_* functions of the
   cuda_host module; without PDP_CUDA they fail with PDP_ERR_UNSUPPORTED. */

/* #include "internal.h" (already above) */

/* ---- tensor: shapes ---- */

static pdp_status pdp__check_shape(const char *fn, int ndim, const int64_t *shape, int64_t *count)
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
        if (n > INT64_MAX / shape[i])
            return pdp__err(PDP_ERR_SHAPE, "%s: element count overflows at dimension %d", fn, i);
        n *= shape[i];
    }
    *count = n;
    return PDP_OK;
}

static void pdp__set_shape(pdp_tensor *t, int ndim, const int64_t *shape, int64_t count)
{
    int i;
    t->ndim = ndim;
    t->count = count;
    for (i = 0; i < PDP_MAX_DIMS; i++) t->shape[i] = i < ndim ? shape[i] : 1;
}

/* "[128, 784]" into buf, for messages. */
static const char *pdp__shape_str(const pdp_tensor *t, char *buf, size_t bytes)
{
    size_t used = 0;
    int i;
    used += (size_t)snprintf(buf, bytes, "[");
    for (i = 0; i < t->ndim && used < bytes; i++)
        used += (size_t)snprintf(buf + used, bytes - used, i ? ", %lld" : "%lld",
                                 (long long)t->shape[i]);
    if (used < bytes) snprintf(buf + used, bytes - used, "]");
    return buf;
}

/* ---- tensor: lifecycle ---- */

PDP_API pdp_status pdp_tensor_create(pdp_tensor **out, pdp_device device, int ndim,
                                     const int64_t *shape)
{
    pdp_tensor *t;
    int64_t count;
    pdp_status st;
    if (!out) return pdp__err(PDP_ERR_INVALID, "pdp_tensor_create: out is NULL");
    *out = NULL;
    if ((st = pdp__check_shape("pdp_tensor_create", ndim, shape, &count)) != PDP_OK) return st;
    if ((uint64_t)count > SIZE_MAX / sizeof(float))
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "pdp_tensor_create: %lld floats do not fit in memory",
                        (long long)count);
    t = (pdp_tensor *)pdp__calloc(sizeof *t);
    if (!t) return pdp__err(PDP_ERR_OUT_OF_MEMORY, "pdp_tensor_create: no memory for the header");
    pdp__set_shape(t, ndim, shape, count);
    t->device = device;
    t->owns_data = true;
    if (device.kind == PDP_DEVICE_CPU) {
        t->data = (float *)pdp__calloc((size_t)count * sizeof(float));
        if (!t->data) {
            pdp__dealloc(t);
            return pdp__err(PDP_ERR_OUT_OF_MEMORY, "pdp_tensor_create: no memory for %lld floats",
                            (long long)count);
        }
    } else if ((st = pdp__dev_alloc(device, (size_t)count * sizeof(float), (void **)&t->data)) !=
                   PDP_OK ||
               (st = pdp__dev_memset0(device, t->data, (size_t)count * sizeof(float))) != PDP_OK) {
        if (t->data) pdp__dev_free(device, t->data);
        pdp__dealloc(t);
        return pdp__err_wrap(st, "pdp_tensor_create");
    }
    *out = t;
    return PDP_OK;
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
    int64_t count;
    pdp_status st;
    if (!view) return pdp__err(PDP_ERR_INVALID, "pdp_tensor_wrap: view is NULL");
    if (!data) return pdp__err(PDP_ERR_INVALID, "pdp_tensor_wrap: data is NULL");
    if ((st = pdp__check_shape("pdp_tensor_wrap", ndim, shape, &count)) != PDP_OK) return st;
    pdp__set_shape(view, ndim, shape, count);
    view->data = data;
    view->device = device;
    view->owns_data = false;
    return PDP_OK;
}

PDP_API pdp_status pdp_tensor_reshape_view(const pdp_tensor *t, int ndim, const int64_t *shape,
                                           pdp_tensor *view)
{
    int64_t count;
    pdp_status st;
    char a[96];
    if (!t || !view) return pdp__err(PDP_ERR_INVALID, "pdp_tensor_reshape_view: NULL tensor");
    if ((st = pdp__check_shape("pdp_tensor_reshape_view", ndim, shape, &count)) != PDP_OK) return st;
    if (count != t->count)
        return pdp__err(PDP_ERR_SHAPE, "pdp_tensor_reshape_view: %s has %lld elements, new shape has %lld",
                        pdp__shape_str(t, a, sizeof a), (long long)t->count, (long long)count);
    return pdp_tensor_wrap(t->data, t->device, ndim, shape, view);
}

PDP_API pdp_status pdp_tensor_rows_view(const pdp_tensor *t, int64_t first, int64_t rows,
                                        pdp_tensor *view)
{
    int64_t shape[PDP_MAX_DIMS], row;
    char a[96];
    if (!t || !view) return pdp__err(PDP_ERR_INVALID, "pdp_tensor_rows_view: NULL tensor");
    if (first < 0 || rows < 1 || first + rows > t->shape[0])
        return pdp__err(PDP_ERR_SHAPE, "pdp_tensor_rows_view: rows [%lld, %lld) outside %s",
                        (long long)first, (long long)(first + rows), pdp__shape_str(t, a, sizeof a));
    memcpy(shape, t->shape, sizeof shape);
    row = t->count / t->shape[0];
    shape[0] = rows;
    return pdp_tensor_wrap(t->data + first * row, t->device, t->ndim, shape, view);
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
    if (t->device.kind != PDP_DEVICE_CPU) return pdp__dev_fill(t->device, t->data, t->count, value);
    for (i = 0; i < t->count; i++) t->data[i] = value;
    return PDP_OK;
}

PDP_API pdp_status pdp_tensor_copy(pdp_tensor *dst, const pdp_tensor *src)
{
    char a[96], b[96];
    if (!dst || !src) return pdp__err(PDP_ERR_INVALID, "pdp_tensor_copy: NULL tensor");
    if (dst->count != src->count)
        return pdp__err(PDP_ERR_SHAPE, "pdp_tensor_copy: destination %s and source %s differ in count",
                        pdp__shape_str(dst, a, sizeof a), pdp__shape_str(src, b, sizeof b));
    if (dst->device.kind == PDP_DEVICE_CPU && src->device.kind == PDP_DEVICE_CPU) {
        if (dst->data != src->data) memmove(dst->data, src->data, (size_t)src->count * sizeof(float));
        return PDP_OK;
    }
    return pdp__dev_copy(dst->device, dst->data, src->device, src->data,
                         (size_t)src->count * sizeof(float));
}

PDP_API pdp_status pdp_tensor_upload(pdp_tensor *t, const float *host)
{
    if (!t || !host) return pdp__err(PDP_ERR_INVALID, "pdp_tensor_upload: NULL argument");
    return pdp__dev_copy(t->device, t->data, pdp_cpu(), host, (size_t)t->count * sizeof(float));
}

PDP_API pdp_status pdp_tensor_download(const pdp_tensor *t, float *host)
{
    if (!t || !host) return pdp__err(PDP_ERR_INVALID, "pdp_tensor_download: NULL argument");
    return pdp__dev_copy(pdp_cpu(), host, t->device, t->data, (size_t)t->count * sizeof(float));
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

/* Fills a CPU tensor directly, any other device through a host staging copy. */
static pdp_status pdp__tensor_init(pdp_tensor *t, pdp_rng *r, int normal, float a, float b,
                                   const char *fn)
{
    float *host;
    int64_t i;
    pdp_status st = PDP_OK;
    if (!t || !r) return pdp__err(PDP_ERR_INVALID, "%s: NULL argument", fn);
    host = t->device.kind == PDP_DEVICE_CPU ? t->data
                                            : (float *)pdp__alloc((size_t)t->count * sizeof(float));
    if (!host) return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory for a staging copy", fn);
    for (i = 0; i < t->count; i++)
        host[i] = normal ? a + b * pdp_rng_normal(r) : a + (b - a) * pdp_rng_uniform(r);
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
    bound = sqrt(6.0 / (double)(fan_in + fan_out));
    return pdp__tensor_init(t, r, 0, (float)-bound, (float)bound, "pdp_tensor_xavier_uniform");
}
/* ---- end src/tensor.c ---- */

/* ---- begin src/gemm.c ---- */
/* gemm: single-precision matrix product, C = alpha * op(A) * op(B) + beta * C.

   Row-major, op(X) = X or X^T, all four layouts. The structure is the one of
   Goto and van de Geijn, "Anatomy of high-performance matrix multiplication"
   (ACM TOMS 34(3), 2008) and of BLIS (Van Zee and van de Geijn, 2015):

     for each NC-wide block of columns       (jc)
       for each KC-deep block of k           (pc)   pack op(B) block, KC x NC  -> L2
         for each MR-tall row panel          (ir)   pack op(A) panel, MR x KC  -> L1
           for each NR-wide column panel     (jr)   micro-kernel: MR x NR tile of C

   The micro-kernel keeps an MR x NR tile of C in registers and adds one rank-1
   update per k: NR floats of packed B are loaded, MR floats of packed A are
   broadcast, MR * NR / VL fused multiply-adds. Kernels by instruction set:
   AVX-512F 8 x 32 (16 zmm accumulators), AVX2+FMA 6 x 16 (12 ymm), and portable
   C 4 x 16 (what -DPDP_NO_SIMD or a plain x86-64 target gets). Packing pads
   partial panels with zeros, so the kernel always runs full tiles and masks only
   its stores. With -DPDP_CBLAS the whole call goes to cblas_sgemm instead.

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
     If even that allocation fails, a slow unpacked loop computes the product. */

/* #include "internal.h" (already above) */

#if defined(__cplusplus)
#  define PDP__GEMM_RESTRICT __restrict__
#else
#  define PDP__GEMM_RESTRICT restrict
#endif

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

static void pdp__gemm_kernel(int64_t kc, const float *PDP__GEMM_RESTRICT ap,
                             const float *PDP__GEMM_RESTRICT bp, float *c, int64_t ldc, int mr,
                             int nr, float alpha, float beta)
{
    __m512 acc[PDP__GEMM_MR][PDP__GEMM_NV];
    __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
    __mmask16 mask[PDP__GEMM_NV];
    int i, v, full = mr == PDP__GEMM_MR && nr == PDP__GEMM_NV * PDP__GEMM_VL;
    int64_t p;
    _Pragma("GCC unroll 16") for (i = 0; i < PDP__GEMM_MR; i++) {
        _Pragma("GCC unroll 4") for (v = 0; v < PDP__GEMM_NV; v++) acc[i][v] = _mm512_setzero_ps();
    }
    for (p = 0; p < kc; p++) {
        __m512 bv[PDP__GEMM_NV];
        _Pragma("GCC unroll 4") for (v = 0; v < PDP__GEMM_NV; v++) {
            bv[v] = _mm512_load_ps(bp + v * PDP__GEMM_VL);
        }
        _Pragma("GCC unroll 16") for (i = 0; i < PDP__GEMM_MR; i++) {
            __m512 ai = _mm512_set1_ps(ap[i]);
            _Pragma("GCC unroll 4") for (v = 0; v < PDP__GEMM_NV; v++) {
                acc[i][v] = _mm512_fmadd_ps(ai, bv[v], acc[i][v]);
            }
        }
        ap += PDP__GEMM_MR;
        bp += PDP__GEMM_NV * PDP__GEMM_VL;
    }
    _Pragma("GCC unroll 4") for (v = 0; v < PDP__GEMM_NV; v++) {
        int left = nr - v * PDP__GEMM_VL;
        mask[v] = (__mmask16)(left >= PDP__GEMM_VL ? 0xffff : left <= 0 ? 0 : (1u << left) - 1);
    }
    _Pragma("GCC unroll 16") for (i = 0; i < PDP__GEMM_MR; i++) {
        float *ci = c + i * ldc;
        if (i >= mr) break;
        _Pragma("GCC unroll 4") for (v = 0; v < PDP__GEMM_NV; v++) {
            __m512 r = _mm512_mul_ps(va, acc[i][v]);
            if (full) {
                if (beta != 0.0f) r = _mm512_fmadd_ps(vb, _mm512_loadu_ps(ci + v * 16), r);
                _mm512_storeu_ps(ci + v * 16, r);
            } else {
                if (beta != 0.0f) r = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(mask[v], ci + v * 16), r);
                _mm512_mask_storeu_ps(ci + v * 16, mask[v], r);
            }
        }
    }
}

#elif !defined(PDP_NO_SIMD) && defined(__AVX2__) && defined(__FMA__)
#  include <immintrin.h>
#  define PDP__GEMM_KERNEL "avx2 6x16"
#  define PDP__GEMM_MR 6
#  define PDP__GEMM_NV 2
#  define PDP__GEMM_VL 8

static void pdp__gemm_kernel(int64_t kc, const float *PDP__GEMM_RESTRICT ap,
                             const float *PDP__GEMM_RESTRICT bp, float *c, int64_t ldc, int mr,
                             int nr, float alpha, float beta)
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
        mask[v] = _mm256_cmpgt_epi32(_mm256_set1_epi32(left), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
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
                if (beta != 0.0f) r = _mm256_fmadd_ps(vb, _mm256_maskload_ps(ci + v * 8, mask[v]), r);
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

static void pdp__gemm_kernel(int64_t kc, const float *PDP__GEMM_RESTRICT ap,
                             const float *PDP__GEMM_RESTRICT bp, float *c, int64_t ldc, int mr,
                             int nr, float alpha, float beta)
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
   KC). NC: columns of packed B per block (KC x NC floats stay in L2). Both fixed,
   so the summation order never depends on the thread count. */
#ifndef PDP__GEMM_KC
#  define PDP__GEMM_KC 256
#endif
#ifndef PDP__GEMM_NC
#  define PDP__GEMM_NC 512
#endif
/* Products below this many flops stay on the calling thread. */
#ifndef PDP__GEMM_PAR_FLOPS
#  define PDP__GEMM_PAR_FLOPS 4.0e6
#endif

/* ---- gemm: packing ---- */

/* op(A) rows [0, mr) x columns [0, kc) (a points at op(A)(0, 0)) into ap[p * MR + i],
   rows mr..MR-1 zero. */
static void pdp__gemm_pack_a(pdp_trans ta, const float *a, int64_t lda, int mr, int64_t kc,
                             float *PDP__GEMM_RESTRICT ap)
{
    int i;
    int64_t p;
    if (ta == PDP_NO_TRANS) { /* op(A)(i, p) = a[i * lda + p]: rows contiguous in k */
        for (i = 0; i < mr; i++) {
            const float *row = a + i * lda;
            for (p = 0; p < kc; p++) ap[p * PDP__GEMM_MR + i] = row[p];
        }
        for (; i < PDP__GEMM_MR; i++) {
            for (p = 0; p < kc; p++) ap[p * PDP__GEMM_MR + i] = 0.0f;
        }
    } else { /* op(A)(i, p) = a[p * lda + i]: k-major already */
        for (p = 0; p < kc; p++) {
            const float *src = a + p * lda;
            float *dst = ap + p * PDP__GEMM_MR;
            for (i = 0; i < mr; i++) dst[i] = src[i];
            for (; i < PDP__GEMM_MR; i++) dst[i] = 0.0f;
        }
    }
}

/* op(B) rows [0, kc) x columns [0, nc) into panels of NR columns:
   bp[(j / NR) * kc * NR + p * NR + j % NR], columns past nc zero. */
static void pdp__gemm_pack_b(pdp_trans tb, const float *b, int64_t ldb, int64_t kc, int64_t nc,
                             float *PDP__GEMM_RESTRICT bp)
{
    int64_t j0, p;
    int j;
    for (j0 = 0; j0 < nc; j0 += PDP__GEMM_NR) {
        int nr = (int)PDP__MIN((int64_t)PDP__GEMM_NR, nc - j0);
        float *panel = bp + j0 * kc;
        if (tb == PDP_NO_TRANS) { /* op(B)(p, j) = b[p * ldb + j]: rows contiguous in n */
            for (p = 0; p < kc; p++) {
                const float *src = b + p * ldb + j0;
                float *dst = panel + p * PDP__GEMM_NR;
                for (j = 0; j < nr; j++) dst[j] = src[j];
                for (; j < PDP__GEMM_NR; j++) dst[j] = 0.0f;
            }
        } else { /* op(B)(p, j) = b[j * ldb + p]: columns contiguous in k */
            for (j = 0; j < nr; j++) {
                const float *src = b + (j0 + j) * ldb;
                for (p = 0; p < kc; p++) panel[p * PDP__GEMM_NR + j] = src[p];
            }
            for (; j < PDP__GEMM_NR; j++) {
                for (p = 0; p < kc; p++) panel[p * PDP__GEMM_NR + j] = 0.0f;
            }
        }
    }
}

/* ---- gemm: the blocked product on one thread ---- */

typedef struct pdp__gemm_args {
    pdp_trans ta, tb;
    int64_t m, n, k;
    float alpha, beta;
    const float *a, *b;
    float *c;
    int64_t lda, ldb, ldc;
    int64_t kb;   /* depth of each k block (the last may be shorter) */
    int split_n;  /* 1: parts are column ranges; 0: row ranges */
} pdp__gemm_args;

static int64_t pdp__gemm_round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

/* Floats of scratch one part of at most `cols` columns needs. */
static size_t pdp__gemm_scratch_floats(const pdp__gemm_args *g, int64_t cols)
{
    int64_t nc = PDP__MIN((int64_t)PDP__GEMM_NC, pdp__gemm_round_up(cols, PDP__GEMM_NR));
    return (size_t)(g->kb * nc + g->kb * PDP__GEMM_MR);
}

/* Rows [m0, m1) x columns [n0, n1) of C; m0 is a multiple of MR, n0 of NR. */
static void pdp__gemm_block(const pdp__gemm_args *g, int64_t m0, int64_t m1, int64_t n0,
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
            const float *bsrc = g->tb == PDP_NO_TRANS ? g->b + pc * g->ldb + jc
                                                      : g->b + jc * g->ldb + pc;
            pdp__gemm_pack_b(g->tb, bsrc, g->ldb, kc, nc, bp);
            for (ir = m0; ir < m1; ir += PDP__GEMM_MR) {
                int mr = (int)PDP__MIN((int64_t)PDP__GEMM_MR, m1 - ir);
                const float *asrc = g->ta == PDP_NO_TRANS ? g->a + ir * g->lda + pc
                                                          : g->a + pc * g->lda + ir;
                pdp__gemm_pack_a(g->ta, asrc, g->lda, mr, kc, ap);
                for (jr = 0; jr < nc; jr += PDP__GEMM_NR) {
                    int nr = (int)PDP__MIN((int64_t)PDP__GEMM_NR, nc - jr);
                    pdp__gemm_kernel(kc, ap, bp + jr * kc, g->c + ir * g->ldc + jc + jr, g->ldc,
                                     mr, nr, g->alpha, beta);
                }
            }
        }
    }
}

/* Unpacked fallback for when scratch cannot be allocated (same contract, slow). */
static void pdp__gemm_unpacked(const pdp__gemm_args *g, int64_t m0, int64_t m1, int64_t n0,
                               int64_t n1)
{
    int64_t i, j, p;
    for (i = m0; i < m1; i++) {
        for (j = n0; j < n1; j++) {
            float acc = 0.0f, *cij = g->c + i * g->ldc + j;
            for (p = 0; p < g->k; p++) {
                float x = g->ta == PDP_NO_TRANS ? g->a[i * g->lda + p] : g->a[p * g->lda + i];
                float y = g->tb == PDP_NO_TRANS ? g->b[p * g->ldb + j] : g->b[j * g->ldb + p];
                acc += x * y;
            }
            *cij = g->beta != 0.0f ? g->alpha * acc + g->beta * *cij : g->alpha * acc;
        }
    }
}

/* ---- gemm: threads ---- */

/* Part i of n: an equal share of the MR-row or NR-column panels. */
static void pdp__gemm_part(void *arg, int i, int n)
{
    const pdp__gemm_args *g = (const pdp__gemm_args *)arg;
    int64_t step = g->split_n ? PDP__GEMM_NR : PDP__GEMM_MR;
    int64_t len = g->split_n ? g->n : g->m;
    int64_t panels = (len + step - 1) / step;
    int64_t lo = PDP__MIN(len, panels * i / n * step), hi = PDP__MIN(len, panels * (i + 1) / n * step);
    int64_t m0 = g->split_n ? 0 : lo, m1 = g->split_n ? g->m : hi;
    int64_t n0 = g->split_n ? lo : 0, n1 = g->split_n ? hi : g->n;
    float *scratch;
    if (lo >= hi) return;
    scratch = (float *)pdp__thread_scratch(sizeof(float) * pdp__gemm_scratch_floats(g, n1 - n0));
    if (scratch)
        pdp__gemm_block(g, m0, m1, n0, n1, scratch);
    else
        pdp__gemm_unpacked(g, m0, m1, n0, n1);
}

PDP_API void pdp_sgemm(pdp_trans ta, pdp_trans tb, int64_t m, int64_t n, int64_t k, float alpha,
                       const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                       float *c, int64_t ldc)
{
    pdp__gemm_args g;
    int threads, parts;
    int64_t blocks, i, j;
    if (m <= 0 || n <= 0) return;
    PDP_ASSERT(ldc >= n);
    if (k <= 0 || alpha == 0.0f) { /* C = beta * C */
        for (i = 0; i < m; i++) {
            float *ci = c + i * ldc;
            for (j = 0; j < n; j++) ci[j] = beta != 0.0f ? beta * ci[j] : 0.0f;
        }
        return;
    }
    PDP_ASSERT(lda >= (ta == PDP_NO_TRANS ? k : m) && ldb >= (tb == PDP_NO_TRANS ? n : k));
    g.ta = ta;
    g.tb = tb;
    g.m = m;
    g.n = n;
    g.k = k;
    g.alpha = alpha;
    g.beta = beta;
    g.a = a;
    g.b = b;
    g.c = c;
    g.lda = lda;
    g.ldb = ldb;
    g.ldc = ldc;
    blocks = (k + PDP__GEMM_KC - 1) / PDP__GEMM_KC;
    g.kb = (k + blocks - 1) / blocks; /* equal blocks, depends on k only */

    /* Threads: one part per thread, along the dimension with more panels. */
    threads = pdp__threads_for_caller();
    if (2.0 * (double)m * (double)n * (double)k < PDP__GEMM_PAR_FLOPS) threads = 1;
    {
        int64_t npan = (n + PDP__GEMM_NR - 1) / PDP__GEMM_NR;
        int64_t mpan = (m + PDP__GEMM_MR - 1) / PDP__GEMM_MR;
        g.split_n = npan >= 2 * (int64_t)threads || npan * PDP__GEMM_NR >= mpan * PDP__GEMM_MR;
        parts = (int)PDP__MIN((int64_t)threads, g.split_n ? npan : mpan);
    }
    pdp__parallel_for(parts, pdp__gemm_part, &g);
}

#endif /* PDP_CBLAS */
/* ---- end src/gemm.c ---- */

/* ---- begin src/ops.c ---- */
/* ops: (to be written) */

/* #include "internal.h" (already above) */
/* ---- end src/ops.c ---- */

/* ---- begin src/layers.c ---- */
/* layers: (to be written) */

/* #include "internal.h" (already above) */
/* ---- end src/layers.c ---- */

/* ---- begin src/model.c ---- */
/* model: the sequential container. Owns the layer list, the parameter registry
   and the flat parameter and gradient blocks, sizes the activation buffers, and
   drives forward and backward over the layers of layers.c.

   Invariants: params[i].offset is the sum of the counts before it (registration
   order, no gaps), so the gradient of parameters j..k is one contiguous range;
   act[i] holds layer i's output from the last forward (Flatten aliases its
   input instead of copying); backward needs the forward's input to stay alive,
   as in PyTorch's autograd. After pdp_model_reserve (or the first step at the
   largest batch), forward and backward allocate nothing. */

/* #include "internal.h" (already above) */

/* ---- model: lifecycle ---- */

PDP_API pdp_status pdp_model_create(pdp_model **out, const pdp_model_desc *desc)
{
    pdp_model *m;
    int i, ndim = 0;
    if (!out) return pdp__err(PDP_ERR_INVALID, "pdp_model_create: out is NULL");
    *out = NULL;
    if (!desc) return pdp__err(PDP_ERR_INVALID, "pdp_model_create: desc is NULL (input_shape is required)");
    for (i = 0; i < 3 && desc->input_shape[i] > 0; i++) ndim++;
    if (desc->input_ndim) ndim = desc->input_ndim;
    if (ndim != 1 && ndim != 3)
        return pdp__err(PDP_ERR_SHAPE, "pdp_model_create: input_ndim %d (must be 1 or 3)", ndim);
    for (i = 0; i < ndim; i++)
        if (desc->input_shape[i] < 1)
            return pdp__err(PDP_ERR_SHAPE, "pdp_model_create: input_shape[%d] is %lld", i,
                            (long long)desc->input_shape[i]);
    m = (pdp_model *)pdp__calloc(sizeof *m);
    if (!m) return pdp__err(PDP_ERR_OUT_OF_MEMORY, "pdp_model_create: no memory");
    m->device = desc->device;
    m->seed = desc->seed;
    pdp_rng_seed(&m->init_rng, desc->seed, 0);
    m->in_ndim = ndim;
    m->in_count = 1;
    for (i = 0; i < 3; i++) {
        m->in_shape[i] = i < ndim ? desc->input_shape[i] : 1;
        m->in_count *= m->in_shape[i];
    }
    m->training = true;
    *out = m;
    return PDP_OK;
}

static void pdp__model_free_buffers(pdp_model *m)
{
    pdp__dev_free(m->device, m->act_block);
    pdp__dev_free(m->device, m->saved_block);
    pdp__dev_free(m->device, m->work_block);
    pdp__dev_free(m->device, m->grad_a);
    pdp__dev_free(m->device, m->grad_b);
    pdp__dealloc(m->act);
    pdp__dealloc(m->saved_off);
    m->act_block = m->saved_block = m->work_block = m->grad_a = m->grad_b = NULL;
    m->act = NULL;
    m->saved_off = NULL;
    m->max_batch = 0;
}

PDP_API void pdp_model_free(pdp_model *m)
{
    if (!m) return;
    pdp__model_free_buffers(m);
    if (!m->params_shared) pdp__dev_free(m->device, m->param_block);
    pdp__dev_free(m->device, m->grad_block);
    pdp__dealloc(m->layers);
    pdp__dealloc(m->params);
    pdp__dealloc(m);
}

/* ---- model: adding layers ---- */

/* Grows an array of n used elements to hold one more; *cap doubles. */
static pdp_status pdp__grow(void **arr, int n, int *cap, size_t elem)
{
    void *bigger;
    int newcap;
    if (n < *cap) return PDP_OK;
    newcap = *cap ? *cap * 2 : 8;
    bigger = pdp__alloc((size_t)newcap * elem);
    if (!bigger) return PDP_ERR_OUT_OF_MEMORY;
    if (*arr) memcpy(bigger, *arr, (size_t)n * elem);
    pdp__dealloc(*arr);
    *arr = bigger;
    *cap = newcap;
    return PDP_OK;
}

static pdp_status pdp__model_register(pdp_model *m, int layer, const char *what, int ndim,
                                      const int64_t *shape)
{
    pdp__param_entry *e;
    int i;
    if (pdp__grow((void **)&m->params, m->nparams, &m->cap_params, sizeof *m->params) != PDP_OK)
        return PDP_ERR_OUT_OF_MEMORY;
    e = &m->params[m->nparams++];
    memset(e, 0, sizeof *e);
    snprintf(e->name, sizeof e->name, "%d.%s", layer, what);
    e->layer = layer;
    e->ndim = ndim;
    e->count = 1;
    for (i = 0; i < 4; i++) {
        e->shape[i] = i < ndim ? shape[i] : 1;
        e->count *= e->shape[i];
    }
    e->offset = m->param_count;
    m->param_count += e->count;
    return PDP_OK;
}

/* Appends layer l (kind and configuration filled in by the caller): infers its
   shapes, registers and initialises its parameters, and moves the parameter and
   gradient blocks to their new size. On failure the model is unchanged. */
static pdp_status pdp__model_add(pdp_model *m, pdp__layer l, const char *fn)
{
    int64_t wshape[4], bshape[4], old_count;
    int wndim = 0, bndim = 0, old_nparams;
    float *params = NULL, *grads = NULL, *host = NULL;
    size_t bytes;
    pdp_status st;
    if (!m) return pdp__err(PDP_ERR_INVALID, "%s: model is NULL", fn);
    if (m->params_shared) return pdp__err(PDP_ERR_STATE, "%s: model is a replica", fn);
    l.index = m->nlayers;
    if (m->nlayers) {
        const pdp__layer *prev = &m->layers[m->nlayers - 1];
        l.in_ndim = prev->out_ndim;
        memcpy(l.in_shape, prev->out_shape, sizeof l.in_shape);
    } else {
        l.in_ndim = m->in_ndim;
        memcpy(l.in_shape, m->in_shape, sizeof l.in_shape);
    }
    l.in_count = l.in_shape[0] * l.in_shape[1] * l.in_shape[2];
    if ((st = pdp__layer_setup(&l, wshape, &wndim, bshape, &bndim)) != PDP_OK)
        return pdp__err_wrap(st, "%s: layer %d (%s)", fn, l.index, pdp__layer_kind_name(l.kind));
    l.out_count = l.out_shape[0] * l.out_shape[1] * l.out_shape[2];

    if (pdp__grow((void **)&m->layers, m->nlayers, &m->cap_layers, sizeof *m->layers) != PDP_OK)
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory", fn);
    old_count = m->param_count;
    old_nparams = m->nparams;
    l.param_first = m->nparams;
    l.nparams = (wndim > 0) + (bndim > 0);
    if ((wndim && pdp__model_register(m, l.index, "weight", wndim, wshape) != PDP_OK) ||
        (bndim && pdp__model_register(m, l.index, "bias", bndim, bshape) != PDP_OK))
        goto oom;
    if (m->param_count != old_count) {
        bytes = (size_t)m->param_count * sizeof(float);
        host = (float *)pdp__alloc(bytes);
        if (!host) goto oom;
        if (old_count && (st = pdp__dev_copy(pdp_cpu(), host, m->device, m->param_block,
                                             (size_t)old_count * sizeof(float))) != PDP_OK)
            goto fail;
        pdp__layer_init_params(&l, wndim ? host + m->params[l.param_first].offset : NULL,
                               bndim ? host + m->params[m->nparams - 1].offset : NULL,
                               &m->init_rng);
        if ((st = pdp__dev_alloc(m->device, bytes, (void **)&params)) != PDP_OK ||
            (st = pdp__dev_alloc(m->device, bytes, (void **)&grads)) != PDP_OK ||
            (st = pdp__dev_copy(m->device, params, pdp_cpu(), host, bytes)) != PDP_OK ||
            (st = pdp__dev_memset0(m->device, grads, bytes)) != PDP_OK)
            goto fail;
        pdp__dealloc(host);
        pdp__dev_free(m->device, m->param_block);
        pdp__dev_free(m->device, m->grad_block);
        m->param_block = params;
        m->grad_block = grads;
    }
    m->layers[m->nlayers++] = l;
    pdp__model_free_buffers(m); /* activations are re-planned on the next forward */
    return PDP_OK;
oom:
    st = pdp__err(PDP_ERR_OUT_OF_MEMORY, "no memory");
fail:
    pdp__dealloc(host);
    pdp__dev_free(m->device, params);
    pdp__dev_free(m->device, grads);
    m->param_count = old_count;
    m->nparams = old_nparams;
    return pdp__err_wrap(st, "%s: layer %d", fn, l.index);
}

static pdp__layer pdp__layer_of(pdp__layer_kind kind)
{
    pdp__layer l;
    memset(&l, 0, sizeof l);
    l.kind = kind;
    return l;
}

PDP_API pdp_status pdp_model_add_linear(pdp_model *m, int64_t out_features)
{
    pdp__layer l = pdp__layer_of(PDP__LINEAR);
    l.out_features = out_features;
    return pdp__model_add(m, l, "pdp_model_add_linear");
}

PDP_API pdp_status pdp_model_add_relu(pdp_model *m)
{
    return pdp__model_add(m, pdp__layer_of(PDP__RELU), "pdp_model_add_relu");
}

PDP_API pdp_status pdp_model_add_gelu(pdp_model *m)
{
    return pdp__model_add(m, pdp__layer_of(PDP__GELU), "pdp_model_add_gelu");
}

PDP_API pdp_status pdp_model_add_tanh(pdp_model *m)
{
    return pdp__model_add(m, pdp__layer_of(PDP__TANH), "pdp_model_add_tanh");
}

PDP_API pdp_status pdp_model_add_sigmoid(pdp_model *m)
{
    return pdp__model_add(m, pdp__layer_of(PDP__SIGMOID), "pdp_model_add_sigmoid");
}

PDP_API pdp_status pdp_model_add_dropout(pdp_model *m, float p)
{
    pdp__layer l = pdp__layer_of(PDP__DROPOUT);
    l.p = p;
    return pdp__model_add(m, l, "pdp_model_add_dropout");
}

PDP_API pdp_status pdp_model_add_layernorm(pdp_model *m, float eps)
{
    pdp__layer l = pdp__layer_of(PDP__LAYERNORM);
    l.eps = eps > 0.0f ? eps : 1e-5f;
    return pdp__model_add(m, l, "pdp_model_add_layernorm");
}

PDP_API pdp_status pdp_model_add_conv2d(pdp_model *m, int64_t out_channels, int64_t kernel,
                                        int64_t stride, int64_t padding)
{
    pdp__layer l = pdp__layer_of(PDP__CONV2D);
    l.out_features = out_channels;
    l.kernel = kernel;
    l.stride = stride ? stride : 1;
    l.padding = padding;
    return pdp__model_add(m, l, "pdp_model_add_conv2d");
}

PDP_API pdp_status pdp_model_add_maxpool2d(pdp_model *m, int64_t kernel, int64_t stride)
{
    pdp__layer l = pdp__layer_of(PDP__MAXPOOL2D);
    l.kernel = kernel;
    l.stride = stride ? stride : kernel;
    return pdp__model_add(m, l, "pdp_model_add_maxpool2d");
}

PDP_API pdp_status pdp_model_add_flatten(pdp_model *m)
{
    return pdp__model_add(m, pdp__layer_of(PDP__FLATTEN), "pdp_model_add_flatten");
}

/* ---- model: buffers ---- */

PDP_API pdp_status pdp_model_reserve(pdp_model *m, int64_t max_batch)
{
    int64_t act = 0, saved = 0, work = 0, widest = m ? m->in_count : 0, b = max_batch;
    int i;
    pdp_status st;
    if (!m) return pdp__err(PDP_ERR_INVALID, "pdp_model_reserve: model is NULL");
    if (max_batch < 1)
        return pdp__err(PDP_ERR_SHAPE, "pdp_model_reserve: batch %lld < 1", (long long)max_batch);
    if (max_batch <= m->max_batch) return PDP_OK;
    pdp__model_free_buffers(m);
    m->act = (float **)pdp__calloc((size_t)(m->nlayers + 1) * sizeof *m->act);
    m->saved_off = (int64_t *)pdp__calloc((size_t)(m->nlayers + 1) * sizeof *m->saved_off);
    if (!m->act || !m->saved_off) goto oom;
    for (i = 0; i < m->nlayers; i++) {
        const pdp__layer *l = &m->layers[i];
        if (l->kind != PDP__FLATTEN) act += l->out_count;
        m->saved_off[i] = saved;
        saved += l->saved_per_sample;
        work = PDP__MAX(work, l->work_per_sample);
        widest = PDP__MAX(widest, l->out_count);
    }
    if ((st = pdp__dev_alloc(m->device, (size_t)(b * act + 1) * 4, (void **)&m->act_block)) ||
        (st = pdp__dev_alloc(m->device, (size_t)(b * saved + 1) * 4, (void **)&m->saved_block)) ||
        (st = pdp__dev_alloc(m->device, (size_t)(b * work + 1) * 4, (void **)&m->work_block)) ||
        (st = pdp__dev_alloc(m->device, (size_t)(b * widest) * 4, (void **)&m->grad_a)) ||
        (st = pdp__dev_alloc(m->device, (size_t)(b * widest) * 4, (void **)&m->grad_b))) {
        pdp__model_free_buffers(m);
        return pdp__err_wrap(st, "pdp_model_reserve: batch %lld", (long long)b);
    }
    act = 0;
    for (i = 0; i < m->nlayers; i++) {
        if (m->layers[i].kind == PDP__FLATTEN) continue;
        m->act[i] = m->act_block + b * act;
        act += m->layers[i].out_count;
    }
    m->max_batch = b;
    return PDP_OK;
oom:
    pdp__model_free_buffers(m);
    return pdp__err(PDP_ERR_OUT_OF_MEMORY, "pdp_model_reserve: no memory for batch %lld",
                    (long long)b);
}

/* ---- model: forward and backward ---- */

/* Fills the per-call part of io for layer i. */
static void pdp__model_io(const pdp_model *m, int i, pdp__layer_io *io)
{
    const pdp__layer *l = &m->layers[i];
    memset(io, 0, sizeof *io);
    io->batch = m->batch;
    io->saved = m->saved_block + m->max_batch * m->saved_off[i];
    io->work = m->work_block;
    io->training = m->training;
    io->seed = m->seed;
    io->step = m->step;
    io->sample_base = m->sample_base;
    if (l->nparams > 0) {
        const pdp__param_entry *w = &m->params[l->param_first];
        io->w = m->param_block + w->offset;
        io->dw = m->grad_block + w->offset;
        if (l->nparams > 1) {
            io->b = io->w + w->count;
            io->db = io->dw + w->count;
        }
    }
}

PDP_API pdp_status pdp_model_forward(pdp_model *m, const pdp_tensor *x, const pdp_tensor **y)
{
    int64_t batch, shape[4];
    const float *in;
    int i, d;
    pdp_status st;
    if (!m || !x || !y) return pdp__err(PDP_ERR_INVALID, "pdp_model_forward: NULL argument");
    *y = NULL;
    if (m->nlayers == 0) return pdp__err(PDP_ERR_STATE, "pdp_model_forward: the model has no layers");
    batch = x->shape[0];
    if (x->ndim != m->in_ndim + 1 || x->count != batch * m->in_count)
        goto bad_shape;
    for (d = 0; d < m->in_ndim; d++)
        if (x->shape[d + 1] != m->in_shape[d]) goto bad_shape;
    if (x->device.kind != m->device.kind || x->device.ordinal != m->device.ordinal)
        return pdp__err(PDP_ERR_DEVICE, "pdp_model_forward: input on device %d:%d, model on %d:%d",
                        x->device.kind, x->device.ordinal, m->device.kind, m->device.ordinal);
    if ((st = pdp_model_reserve(m, batch)) != PDP_OK) return pdp__err_wrap(st, "pdp_model_forward");
    m->batch = batch;
    if (m->training) m->step++;
    in = x->data;
    for (i = 0; i < m->nlayers; i++) {
        const pdp__layer *l = &m->layers[i];
        pdp__layer_io io;
        if (l->kind == PDP__FLATTEN) { /* a view: the output is the input */
            m->act[i] = (float *)in;
            continue;
        }
        pdp__model_io(m, i, &io);
        io.x = in;
        io.y = m->act[i];
        if ((st = pdp__layer_forward(l, &io)) != PDP_OK)
            return pdp__err_wrap(st, "pdp_model_forward: layer %d (%s)", i,
                                 pdp__layer_kind_name(l->kind));
        in = io.y;
    }
    m->act[m->nlayers] = (float *)x->data; /* remembered for backward */
    shape[0] = batch;
    for (d = 0; d < m->layers[m->nlayers - 1].out_ndim; d++)
        shape[d + 1] = m->layers[m->nlayers - 1].out_shape[d];
    pdp_tensor_wrap(m->act[m->nlayers - 1], m->device, d + 1, shape, &m->out_view);
    m->have_forward = true;
    *y = &m->out_view;
    return PDP_OK;
bad_shape:
    {
        char got[96], want[96];
        pdp_tensor expect;
        shape[0] = x->shape[0];
        memcpy(shape + 1, m->in_shape, 3 * sizeof *shape);
        pdp__set_shape(&expect, m->in_ndim + 1, shape, 0);
        return pdp__err(PDP_ERR_SHAPE, "pdp_model_forward: layer 0 (%s) expects %s, got %s",
                        pdp__layer_kind_name(m->layers[0].kind),
                        pdp__shape_str(&expect, want, sizeof want),
                        pdp__shape_str(x, got, sizeof got));
    }
}

PDP_API pdp_status pdp_model_backward(pdp_model *m, const pdp_tensor *dy)
{
    const float *g;
    int i, p;
    pdp_status st;
    if (!m || !dy) return pdp__err(PDP_ERR_INVALID, "pdp_model_backward: NULL argument");
    if (!m->have_forward)
        return pdp__err(PDP_ERR_STATE, "pdp_model_backward: no forward since the last backward");
    if (dy->count != m->out_view.count) {
        char a[96], b[96];
        return pdp__err(PDP_ERR_SHAPE, "pdp_model_backward: dy is %s, the output was %s",
                        pdp__shape_str(dy, a, sizeof a), pdp__shape_str(&m->out_view, b, sizeof b));
    }
    m->have_forward = false;
    g = dy->data;
    for (i = m->nlayers - 1; i >= 0; i--) {
        const pdp__layer *l = &m->layers[i];
        pdp__layer_io io;
        if (l->kind != PDP__FLATTEN) {
            pdp__model_io(m, i, &io);
            io.x = i ? m->act[i - 1] : m->act[m->nlayers];
            io.y = m->act[i];
            io.dy = g;
            io.dx = i ? (g == m->grad_a ? m->grad_b : m->grad_a) : NULL;
            if ((st = pdp__layer_backward(l, &io)) != PDP_OK)
                return pdp__err_wrap(st, "pdp_model_backward: layer %d (%s)", i,
                                     pdp__layer_kind_name(l->kind));
            if (io.dx) g = io.dx;
        }
        if (m->hook)
            for (p = l->param_first + l->nparams - 1; p >= l->param_first; p--)
                m->hook(m->hook_user, m, p);
    }
    return PDP_OK;
}

PDP_API void pdp_model_zero_grad(pdp_model *m)
{
    if (m && m->param_count)
        pdp__dev_memset0(m->device, m->grad_block, (size_t)m->param_count * sizeof(float));
}

PDP_API void pdp_model_set_training(pdp_model *m, bool training)
{
    if (m) m->training = training;
}

PDP_API bool pdp_model_is_training(const pdp_model *m) { return m && m->training; }

PDP_API void pdp_model_set_grad_hook(pdp_model *m, pdp_grad_hook fn, void *user)
{
    if (!m) return;
    m->hook = fn;
    m->hook_user = user;
}

/* ---- model: queries ---- */

PDP_API int pdp_model_num_layers(const pdp_model *m) { return m ? m->nlayers : 0; }

PDP_API const char *pdp_model_layer_name(const pdp_model *m, int layer)
{
    if (!m || layer < 0 || layer >= m->nlayers) return NULL;
    return pdp__layer_kind_name(m->layers[layer].kind);
}

PDP_API int pdp_model_output_shape(const pdp_model *m, int64_t shape[3])
{
    const pdp__layer *l;
    if (!m) return 0;
    if (!m->nlayers) {
        memcpy(shape, m->in_shape, 3 * sizeof *shape);
        return m->in_ndim;
    }
    l = &m->layers[m->nlayers - 1];
    memcpy(shape, l->out_shape, 3 * sizeof *shape);
    return l->out_ndim;
}

PDP_API int64_t pdp_model_param_count(const pdp_model *m) { return m ? m->param_count : 0; }
PDP_API int pdp_model_num_params(const pdp_model *m) { return m ? m->nparams : 0; }
PDP_API pdp_device pdp_model_device(const pdp_model *m) { return m ? m->device : pdp_cpu(); }

PDP_API pdp_status pdp_model_param(const pdp_model *m, int index, pdp_param *out)
{
    const pdp__param_entry *e;
    if (!m || !out) return pdp__err(PDP_ERR_INVALID, "pdp_model_param: NULL argument");
    if (index < 0 || index >= m->nparams)
        return pdp__err(PDP_ERR_INVALID, "pdp_model_param: index %d outside 0..%d", index,
                        m->nparams - 1);
    e = &m->params[index];
    out->name = e->name;
    out->layer = e->layer;
    out->offset = e->offset;
    pdp_tensor_wrap(m->param_block + e->offset, m->device, e->ndim, e->shape, &out->value);
    pdp_tensor_wrap(m->grad_block + e->offset, m->device, e->ndim, e->shape, &out->grad);
    return PDP_OK;
}

PDP_API pdp_status pdp_model_find_param(const pdp_model *m, const char *name, pdp_param *out)
{
    int i;
    if (!m || !name || !out) return pdp__err(PDP_ERR_INVALID, "pdp_model_find_param: NULL argument");
    for (i = 0; i < m->nparams; i++)
        if (strcmp(m->params[i].name, name) == 0) return pdp_model_param(m, i, out);
    return pdp__err(PDP_ERR_INVALID, "pdp_model_find_param: no parameter named \"%s\"", name);
}

PDP_API pdp_status pdp_model_flat(const pdp_model *m, pdp_tensor *params, pdp_tensor *grads)
{
    int64_t n;
    if (!m) return pdp__err(PDP_ERR_INVALID, "pdp_model_flat: model is NULL");
    if (!m->param_count) return pdp__err(PDP_ERR_STATE, "pdp_model_flat: the model has no parameters");
    n = m->param_count;
    if (params) pdp_tensor_wrap(m->param_block, m->device, 1, &n, params);
    if (grads) pdp_tensor_wrap(m->grad_block, m->device, 1, &n, grads);
    return PDP_OK;
}

/* ---- model: replicas ---- */

static pdp_status pdp__model_clone(const pdp_model *src, pdp_device device, bool share_params,
                                   pdp_model **out)
{
    pdp_model *m;
    size_t bytes = (size_t)src->param_count * sizeof(float);
    pdp_status st;
    *out = NULL;
    if (share_params && device.kind != src->device.kind)
        return pdp__err(PDP_ERR_DEVICE, "a replica can share parameters only on the same device");
    m = (pdp_model *)pdp__calloc(sizeof *m);
    if (!m) return pdp__err(PDP_ERR_OUT_OF_MEMORY, "no memory for a replica");
    *m = *src;
    m->device = device;
    m->layers = NULL;
    m->params = NULL;
    m->param_block = m->grad_block = NULL;
    m->act = NULL;
    m->saved_off = NULL;
    m->act_block = m->saved_block = m->work_block = m->grad_a = m->grad_b = NULL;
    m->max_batch = 0;
    m->hook = NULL;
    m->hook_user = NULL;
    m->have_forward = false;
    m->params_shared = share_params;
    m->cap_layers = src->nlayers;
    m->cap_params = src->nparams;
    m->layers = (pdp__layer *)pdp__alloc((size_t)PDP__MAX(1, src->nlayers) * sizeof *m->layers);
    m->params = (pdp__param_entry *)pdp__alloc((size_t)PDP__MAX(1, src->nparams) * sizeof *m->params);
    if (!m->layers || !m->params) {
        pdp_model_free(m);
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "no memory for a replica");
    }
    memcpy(m->layers, src->layers, (size_t)src->nlayers * sizeof *m->layers);
    memcpy(m->params, src->params, (size_t)src->nparams * sizeof *m->params);
    if (bytes) {
        if (share_params) {
            m->param_block = src->param_block;
        } else if ((st = pdp__dev_alloc(device, bytes, (void **)&m->param_block)) != PDP_OK ||
                   (st = pdp__dev_copy(device, m->param_block, src->device, src->param_block,
                                       bytes)) != PDP_OK) {
            pdp_model_free(m);
            return st;
        }
        if ((st = pdp__dev_alloc(device, bytes, (void **)&m->grad_block)) != PDP_OK ||
            (st = pdp__dev_memset0(device, m->grad_block, bytes)) != PDP_OK) {
            pdp_model_free(m);
            return st;
        }
    }
    *out = m;
    return PDP_OK;
}
/* ---- end src/model.c ---- */

/* ---- begin src/loss.c ---- */
/* loss: (to be written) */

/* #include "internal.h" (already above) */
/* ---- end src/loss.c ---- */

/* ---- begin src/optim.c ---- */
/* optim: (to be written) */

/* #include "internal.h" (already above) */
/* ---- end src/optim.c ---- */

/* ---- begin src/data.c ---- */
/* data: (to be written) */

/* #include "internal.h" (already above) */
/* ---- end src/data.c ---- */

/* ---- begin src/checkpoint.c ---- */
/* checkpoint: (to be written) */

/* #include "internal.h" (already above) */
/* ---- end src/checkpoint.c ---- */

/* ---- begin src/trace.c ---- */
/* trace: (to be written) */

/* #include "internal.h" (already above) */
/* ---- end src/trace.c ---- */

/* ---- begin src/store.c ---- */
/* store: torchrun-style rendezvous from the environment, and a TCP key-value store.

   Server. One thread in the rank-0 process runs a poll() loop over a wake pipe,
   the listening socket and every client connection; all sockets are non-blocking
   and only that thread touches the table of keys, so the server needs no lock and
   a slow, stuck or hostile peer cannot stall the others. Each connection carries
   one request at a time. A GET or WAIT for a missing key is parked on its
   connection with a deadline: the SET or ADD that creates the key answers it,
   otherwise the loop answers TIMEOUT when the deadline passes (poll sleeps until
   the nearest one). Timeouts are therefore decided by the server and the stream
   never falls out of step; a client only adds a grace period so that a server
   that vanished silently cannot hang it. pdp_store_free writes one byte into the
   wake pipe, joins the thread and closes what is left: clients still connected
   see EOF.

   Client. A blocking request/response on a non-blocking socket, every wait
   bounded by poll() against a deadline. Connecting retries (10 ms doubling to
   250 ms) until the timeout, so ranks may start before rank 0. Any I/O failure
   closes the connection and later calls fail with PDP_ERR_COMM; the store does
   not reconnect, since a request in flight could have been applied or not.

   Wire format (both ways, big-endian): a 24-byte header
       u32 magic 'PDPS' | u8 op or status | u8 version (1) | u16 0 |
       u32 key bytes | u32 value bytes | u64 arg
   then the key, then the value. arg is the timeout in ms for GET and WAIT, the
   delta (two's complement) for ADD, and ADD's new value in its reply. Replies
   carry no key; an ERROR reply carries a message as its value. The server checks
   every header before it allocates: a wrong magic is dropped at once, a bad
   version, op, key length (1..PDP_STORE_MAX_KEY) or value length (at most
   PDP_STORE_MAX_VALUE) gets an ERROR reply and then the connection is closed.

   Counters (ADD) are decimal text, as in PyTorch's TCPStore. Barriers are an ADD
   on "pdp/barrier/<name>" plus a WAIT on "pdp/barrier/<name>/<generation>", which
   the last rank of each generation sets, so one name can be reused. Keys live in
   a flat array searched linearly: a rendezvous store holds tens of keys, and
   every barrier generation adds one.

   SIGPIPE: every send uses MSG_NOSIGNAL (SO_NOSIGPIPE where that is missing), so
   process-wide signal handling is never touched. */

/* #include "internal.h" (already above) */
#include <limits.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <unistd.h>
#include <sys/types.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>

#ifndef MSG_NOSIGNAL
#  define MSG_NOSIGNAL 0 /* BSD and macOS: SO_NOSIGPIPE is set on every socket instead */
#endif

#define PDP__STORE_DEFAULT_HOST "127.0.0.1"
#define PDP__STORE_DEFAULT_PORT 29500
#define PDP__STORE_DEFAULT_TIMEOUT 300.0
#define PDP__STORE_GRACE_S 5.0          /* client waits this much past a server-side timeout */
#define PDP__STORE_MAX_CONNS 4096       /* further connections are accepted and closed */
#define PDP__STORE_MAX_TIMEOUT_MS 1000000000000ull

/* ---- environment ---- */

/* getenv, with an empty value counting as unset (`RANK= ./train`). */
static const char *pdp__env_get(const char *name)
{
    const char *v = getenv(name);
    return (v && v[0]) ? v : NULL;
}

/* Parses the whole of value as a decimal integer in [lo, hi]; why says what the
   range means in the message. */
static pdp_status pdp__env_int(const char *name, const char *value, long lo, long hi,
                               const char *why, int *out)
{
    char *end;
    long x;
    errno = 0;
    x = strtol(value, &end, 10);
    if (end == value || *end != '\0' || errno == ERANGE)
        return pdp__err(PDP_ERR_INVALID, "pdp_env_read: %s='%.64s' is not an integer", name, value);
    if (x < lo || x > hi)
        return pdp__err(PDP_ERR_INVALID, "pdp_env_read: %s=%ld is outside %ld..%ld%s", name, x, lo,
                        hi, why);
    *out = (int)x;
    return PDP_OK;
}

PDP_API pdp_status pdp_env_read(pdp_env_info *out)
{
    static const char *const torchrun[4] = {"RANK", "WORLD_SIZE", "LOCAL_RANK",
                                            "LOCAL_WORLD_SIZE"};
    static const char *const ompi[4] = {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                                        "OMPI_COMM_WORLD_LOCAL_RANK",
                                        "OMPI_COMM_WORLD_LOCAL_SIZE"};
    const char *const *names = NULL;
    const char *v;
    char why[96];
    pdp_env_info e;
    pdp_status st;

    if (!out) return pdp__err(PDP_ERR_INVALID, "pdp_env_read: out is NULL");
    memset(&e, 0, sizeof e);
    e.world_size = 1;
    e.local_world_size = 1;
    strcpy(e.master_addr, PDP__STORE_DEFAULT_HOST);
    e.master_port = PDP__STORE_DEFAULT_PORT;
    *out = e;

    if (pdp__env_get(torchrun[0]) || pdp__env_get(torchrun[1])) names = torchrun;
    else if (pdp__env_get(ompi[0]) || pdp__env_get(ompi[1])) names = ompi;
    if (names) {
        if (!pdp__env_get(names[0]) || !pdp__env_get(names[1]))
            return pdp__err(PDP_ERR_INVALID, "pdp_env_read: %s is set but %s is not",
                            pdp__env_get(names[0]) ? names[0] : names[1],
                            pdp__env_get(names[0]) ? names[1] : names[0]);
        st = pdp__env_int(names[1], pdp__env_get(names[1]), 1, INT_MAX, "", &e.world_size);
        if (st != PDP_OK) return st;
        snprintf(why, sizeof why, " (it must be below %s=%d)", names[1], e.world_size);
        st = pdp__env_int(names[0], pdp__env_get(names[0]), 0, e.world_size - 1, why, &e.rank);
        if (st != PDP_OK) return st;
        e.local_world_size = e.world_size;
        if ((v = pdp__env_get(names[3])) != NULL) {
            snprintf(why, sizeof why, " (it cannot exceed %s=%d)", names[1], e.world_size);
            st = pdp__env_int(names[3], v, 1, e.world_size, why, &e.local_world_size);
            if (st != PDP_OK) return st;
        }
        e.local_rank = e.rank % e.local_world_size; /* ranks laid out node by node */
        if ((v = pdp__env_get(names[2])) != NULL) {
            snprintf(why, sizeof why, " (it must be below %s=%d)", names[3], e.local_world_size);
            st = pdp__env_int(names[2], v, 0, e.local_world_size - 1, why, &e.local_rank);
            if (st != PDP_OK) return st;
        }
        e.from_env = true;
    }
    if ((v = pdp__env_get("MASTER_ADDR")) != NULL) {
        if (strlen(v) >= sizeof e.master_addr)
            return pdp__err(PDP_ERR_INVALID, "pdp_env_read: MASTER_ADDR='%.64s...' is %zu bytes "
                            "long (at most %zu)", v, strlen(v), sizeof e.master_addr - 1);
        strcpy(e.master_addr, v);
    }
    if ((v = pdp__env_get("MASTER_PORT")) != NULL) {
        st = pdp__env_int("MASTER_PORT", v, 1, 65535, "", &e.master_port);
        if (st != PDP_OK) return st;
    }
    *out = e;
    return PDP_OK;
}

/* ---- wire protocol ---- */

#define PDP__STORE_MAGIC 0x50445053u /* "PDPS" */
#define PDP__STORE_VERSION 1
#define PDP__STORE_HDR 24

enum { PDP__STORE_SET = 1, PDP__STORE_GET = 2, PDP__STORE_WAIT = 3, PDP__STORE_ADD = 4 };
enum { PDP__STORE_OK = 0, PDP__STORE_TIMEOUT = 1, PDP__STORE_ERROR = 2 };

typedef struct pdp__store_hdr {
    uint32_t magic;
    int code; /* op in a request, status in a reply */
    int version;
    uint32_t key_bytes, value_bytes;
    uint64_t arg;
} pdp__store_hdr;

static void pdp__store_put(unsigned char *p, uint64_t x, int bytes)
{
    int i;
    for (i = bytes - 1; i >= 0; i--, x >>= 8) p[i] = (unsigned char)(x & 0xff);
}

static uint64_t pdp__store_take(const unsigned char *p, int bytes)
{
    uint64_t x = 0;
    int i;
    for (i = 0; i < bytes; i++) x = (x << 8) | p[i];
    return x;
}

static void pdp__store_pack(unsigned char *p, int code, uint32_t key_bytes, uint32_t value_bytes,
                            uint64_t arg)
{
    pdp__store_put(p, PDP__STORE_MAGIC, 4);
    p[4] = (unsigned char)code;
    p[5] = PDP__STORE_VERSION;
    p[6] = p[7] = 0;
    pdp__store_put(p + 8, key_bytes, 4);
    pdp__store_put(p + 12, value_bytes, 4);
    pdp__store_put(p + 16, arg, 8);
}

static pdp__store_hdr pdp__store_unpack(const unsigned char *p)
{
    pdp__store_hdr h;
    h.magic = (uint32_t)pdp__store_take(p, 4);
    h.code = p[4];
    h.version = p[5];
    h.key_bytes = (uint32_t)pdp__store_take(p + 8, 4);
    h.value_bytes = (uint32_t)pdp__store_take(p + 12, 4);
    h.arg = pdp__store_take(p + 16, 8);
    return h;
}

static uint64_t pdp__store_ms(double seconds)
{
    double ms = ceil(seconds * 1000.0);
    if (!(ms > 0.0)) return 0;
    return ms >= (double)PDP__STORE_MAX_TIMEOUT_MS ? PDP__STORE_MAX_TIMEOUT_MS : (uint64_t)ms;
}

/* ---- sockets ---- */

/* strerror without its shared buffer: glibc's strerror_r is the GNU variant under
   _GNU_SOURCE and the XSI one otherwise. */
static const char *pdp__store_errstr(int e, char *buf, size_t cap)
{
#if defined(__GLIBC__) && defined(_GNU_SOURCE)
    return strerror_r(e, buf, cap);
#else
    if (strerror_r(e, buf, cap) != 0) snprintf(buf, cap, "errno %d", e);
    return buf;
#endif
}

/* Non-blocking, close-on-exec, no SIGPIPE, no Nagle (requests are small and
   latency-bound). */
static void pdp__store_tune(int fd, bool tcp)
{
    int one = 1;
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    fcntl(fd, F_SETFD, fcntl(fd, F_GETFD) | FD_CLOEXEC);
#ifdef SO_NOSIGPIPE
    setsockopt(fd, SOL_SOCKET, SO_NOSIGPIPE, &one, sizeof one);
#endif
    if (tcp) setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static void pdp__store_sleep(double seconds)
{
    struct timespec ts;
    if (seconds <= 0) return;
    ts.tv_sec = (time_t)seconds;
    ts.tv_nsec = (long)((seconds - (double)ts.tv_sec) * 1e9);
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* poll() one fd for events until deadline (pdp__now() seconds): 1 ready, 0 timed
   out, -1 error (errno). */
static int pdp__store_poll1(int fd, short events, double deadline)
{
    for (;;) {
        struct pollfd p;
        double left = deadline - pdp__now();
        int r;
        if (left <= 0) return 0;
        p.fd = fd;
        p.events = events;
        p.revents = 0;
        r = poll(&p, 1, left > 1e6 ? 1000000000 : (int)ceil(left * 1000.0));
        if (r > 0) return 1;
        if (r < 0 && errno != EINTR) return -1;
    }
}

static int pdp__store_port_of(int fd)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &len) != 0) return -1;
    if (ss.ss_family == AF_INET) return ntohs(((struct sockaddr_in *)&ss)->sin_port);
    if (ss.ss_family == AF_INET6) return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    return -1;
}

/* ---- server: key table ---- */

typedef struct pdp__store_entry {
    unsigned char *data; /* key bytes then value bytes, one allocation */
    uint32_t key_bytes, value_bytes;
} pdp__store_entry;

typedef struct pdp__store_conn {
    int fd;
    unsigned char hdr[PDP__STORE_HDR];
    size_t hdr_got;
    pdp__store_hdr req;       /* valid once hdr_got == PDP__STORE_HDR */
    unsigned char *body;      /* the request's key then value */
    size_t body_cap, body_got;
    unsigned char *out;       /* the reply being sent */
    size_t out_cap, out_len, out_sent;
    bool waiting;             /* a GET/WAIT parked until its key appears or deadline */
    double deadline;
    bool close_after_reply;   /* protocol error: hang up once the ERROR reply is out */
    bool dead;
} pdp__store_conn;

typedef struct pdp__store_server {
    int listen_fd;
    int wake[2];              /* pipe: pdp_store_free writes, the loop reads and stops */
    pthread_t thread;
    pdp__store_conn **conns;
    int n_conns, cap_conns;
    struct pollfd *pfds;      /* wake, listen, then one per connection */
    int cap_pfds;
    pdp__store_entry *entries;
    int n_entries, cap_entries;
} pdp__store_server;

/* Returns an array of at least need elements of elem bytes holding p's *cap old
   ones: p itself when it is big enough, else a new block (p freed, *cap updated);
   NULL when out of memory, with p untouched. */
static void *pdp__store_grow(void *p, int *cap, int need, size_t elem)
{
    int n = *cap ? *cap : 8;
    void *q;
    if (need <= *cap) return p;
    while (n < need) n *= 2;
    q = pdp__calloc((size_t)n * elem);
    if (!q) return NULL;
    if (p) memcpy(q, p, (size_t)*cap * elem);
    pdp__dealloc(p);
    *cap = n;
    return q;
}

static bool pdp__store_reserve(unsigned char **buf, size_t *cap, size_t need)
{
    unsigned char *q;
    if (need <= *cap) return true;
    q = (unsigned char *)pdp__alloc(need);
    if (!q) return false;
    pdp__dealloc(*buf);
    *buf = q;
    *cap = need;
    return true;
}

static pdp__store_entry *pdp__store_find(pdp__store_server *srv, const unsigned char *key,
                                         uint32_t key_bytes)
{
    int i;
    for (i = 0; i < srv->n_entries; i++) {
        pdp__store_entry *e = &srv->entries[i];
        if (e->key_bytes == key_bytes && memcmp(e->data, key, key_bytes) == 0) return e;
    }
    return NULL;
}

/* Sets key to value (replacing), or returns false when out of memory. */
static bool pdp__store_put_entry(pdp__store_server *srv, const unsigned char *key,
                                 uint32_t key_bytes, const void *value, uint32_t value_bytes)
{
    pdp__store_entry *e = pdp__store_find(srv, key, key_bytes);
    unsigned char *data = (unsigned char *)pdp__alloc((size_t)key_bytes + value_bytes);
    if (!data) return false;
    if (!e) {
        pdp__store_entry *grown = (pdp__store_entry *)pdp__store_grow(
            srv->entries, &srv->cap_entries, srv->n_entries + 1, sizeof *srv->entries);
        if (!grown) {
            pdp__dealloc(data);
            return false;
        }
        srv->entries = grown;
        e = &srv->entries[srv->n_entries++];
        e->data = NULL;
    }
    memcpy(data, key, key_bytes);
    if (value_bytes) memcpy(data + key_bytes, value, value_bytes);
    pdp__dealloc(e->data);
    e->data = data;
    e->key_bytes = key_bytes;
    e->value_bytes = value_bytes;
    return true;
}

/* ---- server: connections ---- */

/* Sends what it can of c's reply; the rest goes when poll reports POLLOUT. */
static void pdp__store_flush(pdp__store_conn *c)
{
    while (c->out_sent < c->out_len) {
        ssize_t r = send(c->fd, c->out + c->out_sent, c->out_len - c->out_sent, MSG_NOSIGNAL);
        if (r > 0) {
            c->out_sent += (size_t)r;
        } else if (r < 0 && errno == EINTR) {
            continue;
        } else {
            if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
            c->dead = true;
            return;
        }
    }
    c->out_len = c->out_sent = 0;
    if (c->close_after_reply) c->dead = true;
}

/* Queues a reply, ends the current request and starts sending. */
static void pdp__store_reply(pdp__store_conn *c, int status, const void *value, uint32_t bytes,
                             uint64_t arg)
{
    if (!pdp__store_reserve(&c->out, &c->out_cap, PDP__STORE_HDR + (size_t)bytes)) {
        c->dead = true; /* the client sees EOF: PDP_ERR_COMM on its side */
        return;
    }
    pdp__store_pack(c->out, status, 0, bytes, arg);
    if (bytes) memcpy(c->out + PDP__STORE_HDR, value, bytes);
    c->out_len = PDP__STORE_HDR + (size_t)bytes;
    c->out_sent = 0;
    c->waiting = false;
    c->hdr_got = c->body_got = 0;
    pdp__store_flush(c);
}

static void pdp__store_reply_error(pdp__store_conn *c, bool hang_up, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    c->close_after_reply = hang_up;
    pdp__store_reply(c, PDP__STORE_ERROR, msg, (uint32_t)strlen(msg), 0);
}

/* Answers a parked GET/WAIT from entry e. */
static void pdp__store_answer(pdp__store_conn *c, const pdp__store_entry *e)
{
    if (c->req.code == PDP__STORE_GET)
        pdp__store_reply(c, PDP__STORE_OK, e->data + e->key_bytes, e->value_bytes, 0);
    else
        pdp__store_reply(c, PDP__STORE_OK, NULL, 0, 0);
}

/* A key was created or changed: answer everyone waiting for it. */
static void pdp__store_wake_waiters(pdp__store_server *srv, const pdp__store_entry *e)
{
    int i;
    for (i = 0; i < srv->n_conns; i++) {
        pdp__store_conn *c = srv->conns[i];
        if (c->waiting && !c->dead && c->req.key_bytes == e->key_bytes &&
            memcmp(c->body, e->data, e->key_bytes) == 0)
            pdp__store_answer(c, e);
    }
}

/* Applies ADD: counters are decimal text; a value that is not one is an error. */
static void pdp__store_add_op(pdp__store_server *srv, pdp__store_conn *c)
{
    const unsigned char *key = c->body;
    uint32_t kb = c->req.key_bytes;
    int64_t delta = (int64_t)c->req.arg, cur = 0, next;
    pdp__store_entry *e = pdp__store_find(srv, key, kb);
    char text[32];
    if (e) {
        char *end;
        if (e->value_bytes == 0 || e->value_bytes >= sizeof text) {
            pdp__store_reply_error(c, false, "value of '%.*s' is not a counter", (int)kb,
                                   (const char *)key);
            return;
        }
        memcpy(text, e->data + kb, e->value_bytes);
        text[e->value_bytes] = '\0';
        errno = 0;
        cur = (int64_t)strtoll(text, &end, 10);
        if (*end != '\0' || errno == ERANGE) {
            pdp__store_reply_error(c, false, "value of '%.*s' is not a counter", (int)kb,
                                   (const char *)key);
            return;
        }
    }
    if ((delta > 0 && cur > INT64_MAX - delta) || (delta < 0 && cur < INT64_MIN - delta)) {
        pdp__store_reply_error(c, false, "counter '%.*s' would overflow", (int)kb,
                               (const char *)key);
        return;
    }
    next = cur + delta;
    snprintf(text, sizeof text, "%lld", (long long)next);
    if (!pdp__store_put_entry(srv, key, kb, text, (uint32_t)strlen(text))) {
        pdp__store_reply_error(c, false, "server out of memory");
        return;
    }
    pdp__store_reply(c, PDP__STORE_OK, NULL, 0, (uint64_t)next);
    pdp__store_wake_waiters(srv, pdp__store_find(srv, key, kb));
}

/* The request in c (header and body) is complete: carry it out. */
static void pdp__store_execute(pdp__store_server *srv, pdp__store_conn *c)
{
    const unsigned char *key = c->body;
    uint32_t kb = c->req.key_bytes;
    pdp__store_entry *e;
    switch (c->req.code) {
    case PDP__STORE_SET:
        if (!pdp__store_put_entry(srv, key, kb, c->body + kb, c->req.value_bytes)) {
            pdp__store_reply_error(c, false, "server out of memory");
            return;
        }
        pdp__store_reply(c, PDP__STORE_OK, NULL, 0, 0);
        pdp__store_wake_waiters(srv, pdp__store_find(srv, key, kb));
        return;
    case PDP__STORE_GET:
    case PDP__STORE_WAIT:
        if ((e = pdp__store_find(srv, key, kb)) != NULL) {
            pdp__store_answer(c, e);
        } else {
            c->waiting = true;
            c->deadline = pdp__now() + (double)c->req.arg / 1000.0;
        }
        return;
    case PDP__STORE_ADD:
        pdp__store_add_op(srv, c);
        return;
    default:
        PDP_ASSERT(!"op validated with the header");
    }
}

/* A complete header arrived: validate it before anything is allocated. */
static void pdp__store_check_header(pdp__store_conn *c)
{
    pdp__store_hdr h = pdp__store_unpack(c->hdr);
    size_t need;
    c->req = h;
    if (h.magic != PDP__STORE_MAGIC) {
        c->dead = true; /* not our protocol: no reply at all */
        return;
    }
    if (h.version != PDP__STORE_VERSION) {
        pdp__store_reply_error(c, true, "protocol version %d, server speaks %d", h.version,
                               PDP__STORE_VERSION);
        return;
    }
    if (h.code < PDP__STORE_SET || h.code > PDP__STORE_ADD) {
        pdp__store_reply_error(c, true, "unknown request %d", h.code);
        return;
    }
    if (h.key_bytes == 0 || h.key_bytes > PDP_STORE_MAX_KEY) {
        pdp__store_reply_error(c, true, "key of %lu bytes (1..%d allowed)",
                               (unsigned long)h.key_bytes, PDP_STORE_MAX_KEY);
        return;
    }
    if (h.value_bytes > (h.code == PDP__STORE_SET ? (uint32_t)PDP_STORE_MAX_VALUE : 0u)) {
        pdp__store_reply_error(c, true, "value of %lu bytes (at most %lu allowed for request %d)",
                               (unsigned long)h.value_bytes,
                               h.code == PDP__STORE_SET ? (unsigned long)PDP_STORE_MAX_VALUE : 0ul,
                               h.code);
        return;
    }
    need = (size_t)h.key_bytes + h.value_bytes;
    if (!pdp__store_reserve(&c->body, &c->body_cap, need)) {
        pdp__store_reply_error(c, true, "server out of memory");
        return;
    }
    c->body_got = 0;
}

/* Reads what is there for c's current request; executes it once complete. */
static void pdp__store_read(pdp__store_server *srv, pdp__store_conn *c)
{
    unsigned char *dst;
    size_t want;
    ssize_t r;
    if (c->hdr_got < PDP__STORE_HDR) {
        dst = c->hdr + c->hdr_got;
        want = PDP__STORE_HDR - c->hdr_got;
    } else {
        dst = c->body + c->body_got;
        want = (size_t)c->req.key_bytes + c->req.value_bytes - c->body_got;
    }
    r = recv(c->fd, dst, want, 0);
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        c->dead = true; /* EOF or reset: the client left */
        return;
    }
    if (r < 0) return;
    if (c->hdr_got < PDP__STORE_HDR) {
        c->hdr_got += (size_t)r;
        if (c->hdr_got < PDP__STORE_HDR) return;
        pdp__store_check_header(c);
        if (c->dead || c->out_len) return; /* rejected */
    } else {
        c->body_got += (size_t)r;
    }
    if (c->body_got == (size_t)c->req.key_bytes + c->req.value_bytes) pdp__store_execute(srv, c);
}

static void pdp__store_conn_free(pdp__store_conn *c)
{
    if (!c) return;
    if (c->fd >= 0) close(c->fd);
    pdp__dealloc(c->body);
    pdp__dealloc(c->out);
    pdp__dealloc(c);
}

static void pdp__store_accept(pdp__store_server *srv)
{
    for (;;) {
        pdp__store_conn **conns, *c = NULL;
        struct pollfd *pfds;
        int fd = accept(srv->listen_fd, NULL, NULL);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            return; /* EAGAIN: none left; EMFILE and the like: retried on the next poll */
        }
        pdp__store_tune(fd, true);
        if (srv->n_conns < PDP__STORE_MAX_CONNS) {
            conns = (pdp__store_conn **)pdp__store_grow(srv->conns, &srv->cap_conns,
                                                        srv->n_conns + 1, sizeof *conns);
            if (conns) srv->conns = conns;
            pfds = (struct pollfd *)pdp__store_grow(srv->pfds, &srv->cap_pfds, srv->n_conns + 3,
                                                    sizeof *pfds);
            if (pfds) srv->pfds = pfds;
            if (conns && pfds) c = (pdp__store_conn *)pdp__calloc(sizeof *c);
        }
        if (!c) {
            close(fd); /* too many connections, or out of memory */
            continue;
        }
        c->fd = fd;
        srv->conns[srv->n_conns++] = c;
    }
}

/* ---- server: the loop ---- */

static void *pdp__store_serve(void *arg)
{
    pdp__store_server *srv = (pdp__store_server *)arg;
    for (;;) {
        int i, n, r, timeout_ms = -1, polled;
        double now = pdp__now();
        polled = srv->n_conns;
        srv->pfds[0].fd = srv->wake[0];
        srv->pfds[0].events = POLLIN;
        srv->pfds[1].fd = srv->listen_fd;
        srv->pfds[1].events = POLLIN;
        for (i = 0; i < polled; i++) {
            pdp__store_conn *c = srv->conns[i];
            srv->pfds[i + 2].fd = c->fd;
            srv->pfds[i + 2].events = c->out_len ? POLLOUT : POLLIN;
            if (c->waiting) {
                double left = c->deadline - now;
                int ms = left <= 0 ? 0 : left > 1e6 ? 1000000000 : (int)ceil(left * 1000.0);
                if (timeout_ms < 0 || ms < timeout_ms) timeout_ms = ms;
            }
        }
        for (i = 0; i < polled + 2; i++) srv->pfds[i].revents = 0;
        r = poll(srv->pfds, (nfds_t)(polled + 2), timeout_ms);
        if (r < 0 && errno != EINTR) pdp__store_sleep(0.001); /* ENOMEM: try again */
        if (srv->pfds[0].revents) break;
        for (i = 0; i < polled; i++) {
            pdp__store_conn *c = srv->conns[i];
            short ev = srv->pfds[i + 2].revents;
            if (!ev || c->dead) continue;
            if (c->out_len) {
                pdp__store_flush(c);
            } else if (c->waiting) {
                /* A parked client sends nothing: readable means it left (EOF) or
                   broke the protocol; either way the connection goes. */
                c->dead = true;
            } else {
                pdp__store_read(srv, c);
            }
        }
        if (srv->pfds[1].revents) pdp__store_accept(srv);
        now = pdp__now();
        for (i = 0; i < srv->n_conns; i++) {
            pdp__store_conn *c = srv->conns[i];
            if (c->waiting && !c->dead && now >= c->deadline)
                pdp__store_reply(c, PDP__STORE_TIMEOUT, NULL, 0, 0);
        }
        for (i = n = 0; i < srv->n_conns; i++) {
            if (srv->conns[i]->dead) pdp__store_conn_free(srv->conns[i]);
            else srv->conns[n++] = srv->conns[i];
        }
        srv->n_conns = n;
    }
    return NULL;
}

static void pdp__store_server_free(pdp__store_server *srv)
{
    int i;
    if (!srv) return;
    for (i = 0; i < srv->n_conns; i++) pdp__store_conn_free(srv->conns[i]);
    for (i = 0; i < srv->n_entries; i++) pdp__dealloc(srv->entries[i].data);
    if (srv->listen_fd >= 0) close(srv->listen_fd);
    if (srv->wake[0] >= 0) close(srv->wake[0]);
    if (srv->wake[1] >= 0) close(srv->wake[1]);
    pdp__dealloc(srv->conns);
    pdp__dealloc(srv->pfds);
    pdp__dealloc(srv->entries);
    pdp__dealloc(srv);
}

/* Binds host:port, listens and starts the loop; *port gets the port bound. */
static pdp_status pdp__store_server_start(pdp__store_server **out, const char *host, int *port)
{
    struct addrinfo hints, *res = NULL, *ai;
    pdp__store_server *srv;
    char service[16], why[128] = "no usable address";
    int rc, one = 1;

    *out = NULL;
    srv = (pdp__store_server *)pdp__calloc(sizeof *srv);
    if (!srv) return pdp__err(PDP_ERR_OUT_OF_MEMORY, "pdp_store_create: out of memory");
    srv->listen_fd = srv->wake[0] = srv->wake[1] = -1;
    srv->pfds = (struct pollfd *)pdp__store_grow(NULL, &srv->cap_pfds, 2, sizeof *srv->pfds);
    if (!srv->pfds) {
        pdp__store_server_free(srv);
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "pdp_store_create: out of memory");
    }

    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    snprintf(service, sizeof service, "%d", *port);
    rc = getaddrinfo(host, service, &hints, &res);
    if (rc != 0) {
        pdp__store_server_free(srv);
        return pdp__err(PDP_ERR_COMM, "pdp_store_create: cannot resolve server address '%s': %s",
                        host, gai_strerror(rc));
    }
    for (ai = res; ai; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
        if (fd < 0) {
            pdp__store_errstr(errno, why, sizeof why);
            continue;
        }
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 128) == 0) {
            srv->listen_fd = fd;
            break;
        }
        pdp__store_errstr(errno, why, sizeof why);
        close(fd);
    }
    freeaddrinfo(res);
    if (srv->listen_fd < 0) {
        pdp__store_server_free(srv);
        return pdp__err(PDP_ERR_COMM, "pdp_store_create: cannot listen on %s:%d: %s", host, *port,
                        why);
    }
    pdp__store_tune(srv->listen_fd, false);
    *port = pdp__store_port_of(srv->listen_fd);
    if (pipe(srv->wake) != 0) {
        srv->wake[0] = srv->wake[1] = -1;
        pdp__store_server_free(srv);
        return pdp__err(PDP_ERR_COMM, "pdp_store_create: pipe failed: %s",
                        pdp__store_errstr(errno, why, sizeof why));
    }
    pdp__store_tune(srv->wake[0], false);
    pdp__store_tune(srv->wake[1], false);
    if ((rc = pthread_create(&srv->thread, NULL, pdp__store_serve, srv)) != 0) {
        pdp__store_server_free(srv);
        return pdp__err(PDP_ERR_COMM, "pdp_store_create: cannot start the server thread: %s",
                        pdp__store_errstr(rc, why, sizeof why));
    }
    *out = srv;
    return PDP_OK;
}

static void pdp__store_server_stop(pdp__store_server *srv)
{
    char byte = 1;
    if (!srv) return;
    while (write(srv->wake[1], &byte, 1) < 0 && errno == EINTR) {
    }
    pthread_join(srv->thread, NULL);
    pdp__store_server_free(srv);
}

/* ---- client ---- */

struct pdp_store {
    int fd;                     /* connection to the server; -1 once it broke */
    pthread_mutex_t lock;       /* one request at a time on this handle */
    char host[256];             /* as given (the server's own client may use loopback) */
    int port;
    int world_size;
    double timeout_s;
    pdp__store_server *server;  /* on the serving rank only */
};

/* One non-blocking connect to ai, bounded by deadline; the fd, or -1 with why. */
static int pdp__store_try_connect(const struct addrinfo *ai, double deadline, char *why,
                                  size_t cap)
{
    int fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol), err = 0, r;
    socklen_t len = sizeof err;
    if (fd < 0) {
        pdp__store_errstr(errno, why, cap);
        return -1;
    }
    pdp__store_tune(fd, true);
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) return fd;
    if (errno != EINPROGRESS && errno != EINTR) {
        pdp__store_errstr(errno, why, cap);
        close(fd);
        return -1;
    }
    r = pdp__store_poll1(fd, POLLOUT, deadline);
    if (r == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0) return fd;
    pdp__store_errstr(r == 0 ? ETIMEDOUT : r < 0 ? errno : err, why, cap);
    close(fd);
    return -1;
}

/* Connects s->fd to host:s->port, retrying until timeout_s has passed. */
static pdp_status pdp__store_connect(pdp_store *s, const char *host)
{
    double deadline = pdp__now() + s->timeout_s, backoff = 0.01;
    char service[16], why[128] = "no attempt";
    snprintf(service, sizeof service, "%d", s->port);
    for (;;) {
        struct addrinfo hints, *res = NULL, *ai;
        double left;
        int rc;
        memset(&hints, 0, sizeof hints);
        hints.ai_family = AF_UNSPEC;
        hints.ai_socktype = SOCK_STREAM;
        hints.ai_flags = AI_NUMERICSERV;
        rc = getaddrinfo(host, service, &hints, &res);
        if (rc == 0) {
            for (ai = res; ai && s->fd < 0; ai = ai->ai_next)
                s->fd = pdp__store_try_connect(ai, deadline, why, sizeof why);
            freeaddrinfo(res);
            if (s->fd >= 0) return PDP_OK;
        } else if (rc == EAI_AGAIN) {
            snprintf(why, sizeof why, "%s", gai_strerror(rc)); /* DNS not ready yet */
        } else {
            return pdp__err(PDP_ERR_COMM, "pdp_store_create: cannot resolve store address '%s': %s",
                            host, gai_strerror(rc));
        }
        left = deadline - pdp__now();
        if (left <= 0)
            return pdp__err(PDP_ERR_TIMEOUT, "pdp_store_create: no store server at %s:%d within "
                            "%g s (last error: %s)", host, s->port, s->timeout_s, why);
        pdp__store_sleep(PDP__MIN(backoff, left));
        backoff = PDP__MIN(backoff * 2, 0.25);
    }
}

/* Sends or receives exactly bytes by deadline: 0, or -1 with why filled. */
static int pdp__store_io(int fd, bool sending, void *buf, size_t bytes, double deadline,
                         char *why, size_t cap)
{
    unsigned char *p = (unsigned char *)buf;
    while (bytes > 0) {
        ssize_t r = sending ? send(fd, p, bytes, MSG_NOSIGNAL) : recv(fd, p, bytes, 0);
        if (r > 0) {
            p += r;
            bytes -= (size_t)r;
        } else if (r == 0) {
            snprintf(why, cap, "the server closed the connection");
            return -1;
        } else if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
            int ready = pdp__store_poll1(fd, sending ? POLLOUT : POLLIN, deadline);
            if (ready == 0) {
                snprintf(why, cap, "no answer from the server in time");
                return -1;
            }
            if (ready < 0) {
                pdp__store_errstr(errno, why, cap);
                return -1;
            }
        } else {
            pdp__store_errstr(errno, why, cap);
            return -1;
        }
    }
    return 0;
}

/* Reads bytes from the connection into buf[0..cap) and throws away the rest. */
static int pdp__store_recv_into(int fd, void *buf, size_t cap, size_t bytes, double deadline,
                                char *why, size_t why_cap)
{
    unsigned char sink[4096];
    size_t keep = PDP__MIN(cap, bytes);
    if (keep && pdp__store_io(fd, false, buf, keep, deadline, why, why_cap) != 0) return -1;
    for (bytes -= keep; bytes > 0; bytes -= PDP__MIN(bytes, sizeof sink))
        if (pdp__store_io(fd, false, sink, PDP__MIN(bytes, sizeof sink), deadline, why,
                          why_cap) != 0)
            return -1;
    return 0;
}

/* One request and its reply (caller holds s->lock). wait_s is the server-side
   wait of GET/WAIT; the client itself gives up PDP__STORE_GRACE_S later. The
   reply's value goes to buf[0..cap) (its full length in *bytes), its arg to
   *arg. PDP_ERR_TIMEOUT without a message when the server reports a timeout (the
   caller words it); PDP_ERR_COMM with one when the connection or the server fails. */
static pdp_status pdp__store_call(pdp_store *s, const char *fn, int op, const char *key,
                                  const void *value, size_t value_bytes, uint64_t arg,
                                  double wait_s, void *buf, size_t cap, size_t *bytes,
                                  uint64_t *reply_arg)
{
    unsigned char head[PDP__STORE_HDR + PDP_STORE_MAX_KEY];
    size_t key_bytes = strlen(key);
    double deadline = pdp__now() + wait_s + PDP__STORE_GRACE_S;
    char why[160];
    pdp__store_hdr h;

    if (s->fd < 0)
        return pdp__err(PDP_ERR_COMM, "%s: the connection to the store at %s:%d was lost "
                        "by an earlier call", fn, s->host, s->port);
    pdp__store_pack(head, op, (uint32_t)key_bytes, (uint32_t)value_bytes, arg);
    memcpy(head + PDP__STORE_HDR, key, key_bytes);
    if (pdp__store_io(s->fd, true, head, PDP__STORE_HDR + key_bytes, deadline, why,
                      sizeof why) != 0 ||
        (value_bytes && pdp__store_io(s->fd, true, (void *)(uintptr_t)value, value_bytes,
                                      deadline, why, sizeof why) != 0) ||
        pdp__store_io(s->fd, false, head, PDP__STORE_HDR, deadline, why, sizeof why) != 0)
        goto broken;
    h = pdp__store_unpack(head);
    if (h.magic != PDP__STORE_MAGIC || h.version != PDP__STORE_VERSION ||
        h.value_bytes > PDP_STORE_MAX_VALUE) {
        snprintf(why, sizeof why, "malformed reply (not a pdp store?)");
        goto broken;
    }
    if (h.code == PDP__STORE_ERROR) {
        char msg[257];
        if (pdp__store_recv_into(s->fd, msg, sizeof msg - 1, h.value_bytes, deadline, why,
                                 sizeof why) != 0)
            goto broken;
        msg[PDP__MIN(h.value_bytes, sizeof msg - 1)] = '\0';
        return pdp__err(PDP_ERR_COMM, "%s: the store at %s:%d refused key '%s': %s", fn,
                        s->host, s->port, key, msg);
    }
    if (pdp__store_recv_into(s->fd, buf, cap, h.value_bytes, deadline, why, sizeof why) != 0)
        goto broken;
    if (bytes) *bytes = h.value_bytes;
    if (reply_arg) *reply_arg = h.arg;
    return h.code == PDP__STORE_TIMEOUT ? PDP_ERR_TIMEOUT : PDP_OK;
broken:
    close(s->fd);
    s->fd = -1;
    return pdp__err(PDP_ERR_COMM, "%s: key '%s': connection to the store at %s:%d failed: %s",
                    fn, key, s->host, s->port, why);
}

static pdp_status pdp__store_check(const pdp_store *s, const char *fn, const char *key)
{
    size_t n;
    if (!s) return pdp__err(PDP_ERR_INVALID, "%s: store is NULL", fn);
    if (!key) return pdp__err(PDP_ERR_INVALID, "%s: key is NULL", fn);
    n = strlen(key);
    if (n == 0 || n > PDP_STORE_MAX_KEY)
        return pdp__err(PDP_ERR_INVALID, "%s: key '%.64s' is %zu bytes long (1..%d allowed)", fn,
                        key, n, PDP_STORE_MAX_KEY);
    return PDP_OK;
}

/* ---- public API ---- */

PDP_API pdp_status pdp_store_create(pdp_store **out, const pdp_store_desc *desc)
{
    pdp_store_desc d;
    pdp_store *s;
    const char *self;
    pdp_status st;

    if (!out) return pdp__err(PDP_ERR_INVALID, "pdp_store_create: out is NULL");
    *out = NULL;
    memset(&d, 0, sizeof d);
    if (desc) d = *desc;
    d.host = (d.host && d.host[0]) ? d.host : PDP__STORE_DEFAULT_HOST;
    d.timeout_s = PDP__DEF(d.timeout_s, PDP__STORE_DEFAULT_TIMEOUT);
    if (!d.is_server) d.port = PDP__DEF(d.port, PDP__STORE_DEFAULT_PORT);
    if (strlen(d.host) >= sizeof s->host)
        return pdp__err(PDP_ERR_INVALID, "pdp_store_create: host '%.64s...' is longer than %zu "
                        "bytes", d.host, sizeof s->host - 1);
    if (d.port < 0 || d.port > 65535 || (d.port == 0 && !d.is_server))
        return pdp__err(PDP_ERR_INVALID, "pdp_store_create: port %d is outside %d..65535",
                        d.port, d.is_server ? 0 : 1);
    if (!(d.timeout_s > 0))
        return pdp__err(PDP_ERR_INVALID, "pdp_store_create: timeout_s = %g must be positive",
                        d.timeout_s);
    if (d.world_size < 0)
        return pdp__err(PDP_ERR_INVALID, "pdp_store_create: world_size = %d is negative",
                        d.world_size);

    s = (pdp_store *)pdp__calloc(sizeof *s);
    if (!s) return pdp__err(PDP_ERR_OUT_OF_MEMORY, "pdp_store_create: out of memory");
    s->fd = -1;
    strcpy(s->host, d.host);
    s->port = d.port;
    s->world_size = d.world_size;
    s->timeout_s = d.timeout_s;
    if (pthread_mutex_init(&s->lock, NULL) != 0) {
        pdp__dealloc(s);
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "pdp_store_create: pthread_mutex_init failed");
    }
    self = d.host;
    if (d.is_server) {
        st = pdp__store_server_start(&s->server, d.host, &s->port);
        if (st != PDP_OK) {
            pdp_store_free(s);
            return st;
        }
        /* The serving rank is a client too; a wildcard address is reached via loopback. */
        if (strcmp(self, "0.0.0.0") == 0) self = "127.0.0.1";
        else if (strcmp(self, "::") == 0) self = "::1";
    }
    st = pdp__store_connect(s, self);
    if (st != PDP_OK) {
        pdp_store_free(s);
        return st;
    }
    *out = s;
    return PDP_OK;
}

PDP_API void pdp_store_free(pdp_store *s)
{
    if (!s) return;
    if (s->fd >= 0) close(s->fd);
    pdp__store_server_stop(s->server);
    pthread_mutex_destroy(&s->lock);
    pdp__dealloc(s);
}

PDP_API int pdp_store_port(const pdp_store *s) { return s ? s->port : -1; }

PDP_API pdp_status pdp_store_set(pdp_store *s, const char *key, const void *value, size_t bytes)
{
    pdp_status st = pdp__store_check(s, "pdp_store_set", key);
    if (st != PDP_OK) return st;
    if (bytes > PDP_STORE_MAX_VALUE)
        return pdp__err(PDP_ERR_INVALID, "pdp_store_set: key '%s': value of %zu bytes exceeds "
                        "PDP_STORE_MAX_VALUE (%lu)", key, bytes, (unsigned long)PDP_STORE_MAX_VALUE);
    if (bytes && !value)
        return pdp__err(PDP_ERR_INVALID, "pdp_store_set: key '%s': value is NULL", key);
    pthread_mutex_lock(&s->lock);
    st = pdp__store_call(s, "pdp_store_set", PDP__STORE_SET, key, value, bytes, 0, s->timeout_s,
                         NULL, 0, NULL, NULL);
    pthread_mutex_unlock(&s->lock);
    return st;
}

PDP_API pdp_status pdp_store_get(pdp_store *s, const char *key, void *buf, size_t cap,
                                 size_t *bytes)
{
    size_t got = 0;
    pdp_status st = pdp__store_check(s, "pdp_store_get", key);
    if (st != PDP_OK) return st;
    if (cap && !buf) return pdp__err(PDP_ERR_INVALID, "pdp_store_get: key '%s': buf is NULL", key);
    pthread_mutex_lock(&s->lock);
    st = pdp__store_call(s, "pdp_store_get", PDP__STORE_GET, key, NULL, 0,
                         pdp__store_ms(s->timeout_s), s->timeout_s, buf, cap, &got, NULL);
    pthread_mutex_unlock(&s->lock);
    if (bytes) *bytes = got;
    if (st == PDP_ERR_TIMEOUT)
        return pdp__err(st, "pdp_store_get: key '%s' was not set within %g s (store %s:%d)", key,
                        s->timeout_s, s->host, s->port);
    if (st == PDP_OK && got > cap)
        return pdp__err(PDP_ERR_INVALID, "pdp_store_get: key '%s' holds %zu bytes, the buffer "
                        "only %zu", key, got, cap);
    return st;
}

PDP_API pdp_status pdp_store_wait(pdp_store *s, const char **keys, int n, double timeout_s)
{
    double t, deadline;
    pdp_status st = PDP_OK;
    int i;
    if (!s) return pdp__err(PDP_ERR_INVALID, "pdp_store_wait: store is NULL");
    if (n < 0 || (n > 0 && !keys))
        return pdp__err(PDP_ERR_INVALID, "pdp_store_wait: %d keys at %p", n, (const void *)keys);
    if (timeout_s < 0)
        return pdp__err(PDP_ERR_INVALID, "pdp_store_wait: timeout_s = %g is negative", timeout_s);
    for (i = 0; i < n; i++)
        if ((st = pdp__store_check(s, "pdp_store_wait", keys[i])) != PDP_OK) return st;
    t = PDP__DEF(timeout_s, s->timeout_s);
    deadline = pdp__now() + t;
    pthread_mutex_lock(&s->lock);
    for (i = 0; i < n && st == PDP_OK; i++) {
        double left = PDP__MAX(deadline - pdp__now(), 0.0);
        st = pdp__store_call(s, "pdp_store_wait", PDP__STORE_WAIT, keys[i], NULL, 0,
                             pdp__store_ms(left), left, NULL, 0, NULL, NULL);
    }
    pthread_mutex_unlock(&s->lock);
    if (st == PDP_ERR_TIMEOUT)
        return pdp__err(st, "pdp_store_wait: key '%s' (%d of %d) was not set within %g s "
                        "(store %s:%d)", keys[i - 1], i, n, t, s->host, s->port);
    return st;
}

PDP_API pdp_status pdp_store_add(pdp_store *s, const char *key, int64_t delta, int64_t *result)
{
    uint64_t r = 0;
    pdp_status st = pdp__store_check(s, "pdp_store_add", key);
    if (st != PDP_OK) return st;
    pthread_mutex_lock(&s->lock);
    st = pdp__store_call(s, "pdp_store_add", PDP__STORE_ADD, key, NULL, 0, (uint64_t)delta,
                         s->timeout_s, NULL, 0, NULL, &r);
    pthread_mutex_unlock(&s->lock);
    if (st == PDP_OK && result) *result = (int64_t)r;
    return st;
}

PDP_API pdp_status pdp_store_barrier(pdp_store *s, const char *name, int world_size,
                                     double timeout_s)
{
    char counter[PDP_STORE_MAX_KEY + 1], done[PDP_STORE_MAX_KEY + 1];
    const char *keys[1];
    int64_t arrived = 0, gen, now_in = 0;
    int world;
    pdp_status st;

    if (!s) return pdp__err(PDP_ERR_INVALID, "pdp_store_barrier: store is NULL");
    if (!name) return pdp__err(PDP_ERR_INVALID, "pdp_store_barrier: name is NULL");
    world = world_size > 0 ? world_size : s->world_size;
    if (world <= 0)
        return pdp__err(PDP_ERR_INVALID, "pdp_store_barrier: '%s': world_size = %d and the store "
                        "was created without one", name, world_size);
    if (strlen(name) + 40 > PDP_STORE_MAX_KEY)
        return pdp__err(PDP_ERR_INVALID, "pdp_store_barrier: name '%.64s...' is too long", name);
    timeout_s = PDP__DEF(timeout_s, s->timeout_s);
    snprintf(counter, sizeof counter, "pdp/barrier/%s", name);
    if ((st = pdp_store_add(s, counter, 1, &arrived)) != PDP_OK)
        return pdp__err_wrap(st, "pdp_store_barrier: '%s'", name);
    gen = (arrived - 1) / world;
    snprintf(done, sizeof done, "pdp/barrier/%s/%lld", name, (long long)gen);
    if (arrived % world == 0 && (st = pdp_store_set(s, done, "", 0)) != PDP_OK)
        return pdp__err_wrap(st, "pdp_store_barrier: '%s'", name);
    keys[0] = done;
    st = pdp_store_wait(s, keys, 1, timeout_s);
    if (st == PDP_ERR_TIMEOUT) {
        pdp_store_add(s, counter, 0, &now_in); /* best effort, for the message */
        return pdp__err(st, "pdp_store_barrier: '%s' (round %lld): %lld of %d ranks arrived "
                        "within %g s (store %s:%d)", name, (long long)gen,
                        (long long)(now_in - gen * world), world, timeout_s, s->host, s->port);
    }
    if (st != PDP_OK) return pdp__err_wrap(st, "pdp_store_barrier: '%s'", name);
    return PDP_OK;
}
/* ---- end src/store.c ---- */

/* ---- begin src/comm.c ---- */
/* comm: (to be written) */

/* #include "internal.h" (already above) */
/* ---- end src/comm.c ---- */

/* ---- begin src/comm_mpi.c ---- */
/* comm_mpi: (to be written) */

/* #include "internal.h" (already above) */
/* ---- end src/comm_mpi.c ---- */

/* ---- begin src/dp.c ---- */
/* dp: (to be written) */

/* #include "internal.h" (already above) */
/* ---- end src/dp.c ---- */

/* ---- begin src/ddp.c ---- */
/* ddp: (to be written) */

/* #include "internal.h" (already above) */
/* ---- end src/ddp.c ---- */

/* ---- begin src/cuda_host.c ---- */
/* cuda_host: the host side of devices. Routes device memory and (later) layer
   math to the plain C functions of pdp_cuda.cu when built with PDP_CUDA; without
   it, every CUDA request fails with PDP_ERR_UNSUPPORTED naming the macro. */

/* #include "internal.h" (already above) */

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
/* ---- end src/cuda_host.c ---- */

#if defined(__GNUC__) || defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif /* PDP_IMPLEMENTATION */

/*
MIT License

Copyright (c) 2026 the pdp authors

Permission is hereby granted, free of charge, to any person obtaining a copy
of this software and associated documentation files (the "Software"), to deal
in the Software without restriction, including without limitation the rights
to use, copy, modify, merge, publish, distribute, sublicense, and/or sell
copies of the Software, and to permit persons to whom the Software is
furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all
copies or substantial portions of the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE
SOFTWARE.
*/
