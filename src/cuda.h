/* cuda: CUDA devices, the NCCL communicator for thread ranks, and the plain C
   functions of pdp_cuda.cu.

   Build with -DPDP_CUDA and link pdp_cuda.o (nvcc), cuBLAS and NCCL; without
   PDP_CUDA every function below that takes a device fails with
   PDP_ERR_UNSUPPORTED naming the macro, and pdp_cuda_device_count reports 0.

   Execution model. Each device has one compute stream and one cuBLAS handle, created on
   first use and kept until pdp_cuda_release or the process's end: process-wide state,
   one of the exceptions to "no globals" that the manual lists (THREADS AND
   DETERMINISM), with the intra-op pool and the trace sink. Layer, loss and optimizer
   calls on a CUDA model enqueue kernels on that stream and return; anything that hands
   a value to the host (a download, a loss) waits for it. Give each model its own host
   thread; several threads may share a device (see below).

   Numerics. GEMMs run in full FP32 (TF32 off) so GPU results match the CPU to
   about 1e-5 relative; pdp_cuda_set_tf32(true) trades that for tensor-core
   speed. A model in bf16 (pdp_model_set_precision) runs its Linear and Conv2d
   products as cublasGemmEx on bf16 copies of both inputs (rounded as on the CPU)
   with fp32 output and CUBLAS_COMPUTE_32F: the CPU bf16 model's arithmetic except
   the order of the fp32 sums; parameters, gradients and optimizer stay fp32. The
   copies live in one workspace per device, grown on first use. Element math
   (activations, dropout masks, optimizer updates) is the same PDP__HOSTDEV code
   as the CPU's (math.h).

   Memory. Device buffers come from a caching allocator: freed blocks go back to
   a free list of their size class on their device and are reused, so after
   the first step nothing reaches cudaMalloc (pdp_cuda_memory_stats counts the
   calls). pdp_cuda_empty_cache returns the free blocks to the driver.

   DataParallel over GPUs (dp.c) runs one worker thread per replica; several
   workers may share a device (more workers than GPUs): their kernels then
   interleave on that device's stream, and the reductions that hand a value to
   the host (losses, the gradient norm) take turns on its scratch buffer. */

/* Number of CUDA devices visible to this process. No device (or no driver):
   *count = 0 and PDP_ERR_NO_DEVICE. */
PDP_API pdp_status pdp_cuda_device_count(int *count);
/* TF32 tensor-core GEMMs on (faster, ~1e-3 relative) or off (default: FP32,
   matches the CPU to ~1e-5). Process-wide; takes effect at the next GEMM. */
PDP_API pdp_status pdp_cuda_set_tf32(bool on);
/* Waits until every kernel and copy queued on the device's stream is done. */
PDP_API pdp_status pdp_cuda_synchronize(pdp_device d);

typedef struct pdp_cuda_memory_stats {
    int64_t device_mallocs;  /* cudaMalloc calls made by the caching allocator so far */
    size_t reserved_bytes;   /* held from the driver (in use + cached free blocks) */
    size_t in_use_bytes;     /* handed out and not yet freed */
} pdp_cuda_memory_stats;
PDP_API pdp_status pdp_cuda_memory_stats_get(pdp_device d, pdp_cuda_memory_stats *out);
/* Returns the device's cached free blocks to the driver (cudaFree). */
PDP_API pdp_status pdp_cuda_empty_cache(pdp_device d);
/* Gives device d back as pdp found it: its cached blocks, workspaces, cuBLAS handle and
   stream (a program done training that keeps running; a leak checker at exit). The next
   call on the device creates them again. Fails with PDP_ERR_STATE, releasing nothing,
   while pdp memory is in use there (a model, tensor, optimizer, executor or NCCL group
   lives on it), naming the bytes; a device pdp never used is a no-op. No other thread
   may use the device meanwhile. */
PDP_API pdp_status pdp_cuda_release(pdp_device d);

/* ---- cuda: NCCL thread ranks ----
   One process drives N GPUs with one thread per GPU: create the group once
   (one NCCL communicator per device of devices[0..ndev-1]), then rank r's thread calls
   pdp_comm_create_nccl(&c, g, r) and uses c like any communicator (DDP with
   thread ranks). The group outlives its communicators. Processes with one GPU
   each use pdp_comm_init_env with desc.backend = PDP_BACKEND_NCCL instead:
   rank 0 makes the NCCL unique id and hands it out through the TCP store
   (MASTER_ADDR; port PDP_STORE_PORT, else MASTER_PORT + 1 under torchrun,
   whose own store holds MASTER_PORT, else MASTER_PORT). Collectives run on a
   stream of their own after waiting on an event recorded on the compute
   stream, so they overlap whatever the compute stream does next; pdp_work_wait
   polls with the communicator's timeout and, on timeout or an NCCL error,
   aborts the NCCL communicator (ncclCommAbort) and fails instead of hanging.
   Thread ranks are initialised non-blocking (ncclCommInitRankConfig in one
   group), like process ranks, so every NCCL call obeys the timeout.
   pdp_comm_send/recv work over NCCL (ncclSend/ncclRecv, batched into one
   ncclGroupStart/End at the next wait, pdp_work_done, collective or split, so a
   ring where every rank sends first does not deadlock); NCCL has no tags, so a
   pair's messages match in issue order and a header makes the receiver check the
   tag and count (PDP_ERR_INVALID naming both). Messages share the collectives'
   stream, and a message's timeout aborts the communicator (comm_nccl.c has the
   details). pdp_comm_split is ncclCommSplit (NCCL 2.18 or later). */
typedef struct pdp_nccl_group pdp_nccl_group;
PDP_API pdp_status pdp_nccl_group_create(pdp_nccl_group **out, int ndev, const pdp_device *devices,
                                         const pdp_comm_desc *desc);
PDP_API void pdp_nccl_group_free(pdp_nccl_group *g);
PDP_API pdp_status pdp_comm_create_nccl(pdp_comm **out, pdp_nccl_group *g, int rank);

/* ---- cuda: the plain C functions of pdp_cuda.cu ----
   pdp.h's implementation (cuda_host.c) calls these; they never call back into
   it. dev is a CUDA ordinal; pointers are on that device unless named host_*;
   counts are elements. Each returns PDP_OK or PDP_ERR_CUDA / PDP_ERR_TIMEOUT /
   PDP_ERR_NO_DEVICE and leaves "cublasSgemm failed: CUBLAS_STATUS_... at
   pdp_cuda.cu:123" in pdp_cudak_error() (thread-local). Kernels are enqueued on
   the device's compute stream. Declared only for builds that link pdp_cuda.o. */
#if defined(PDP_CUDA) || defined(__CUDACC__)

typedef enum pdp_cudak_act {
    PDP_CUDAK_RELU = 0,
    PDP_CUDAK_GELU = 1,
    PDP_CUDAK_TANH = 2,
    PDP_CUDAK_SIGMOID = 3,
    PDP_CUDAK_SILU = 4,
    PDP_CUDAK_GELU_ERF = 5
} pdp_cudak_act;

typedef enum pdp_cudak_coll {
    PDP_CUDAK_ALLREDUCE = 0,
    PDP_CUDAK_BROADCAST = 1,
    PDP_CUDAK_REDUCE_SCATTER = 2,
    PDP_CUDAK_ALLGATHER = 3
} pdp_cudak_coll;

/* Conv2d / MaxPool2d geometry of one layer (square kernels). */
typedef struct pdp_cudak_conv {
    int64_t batch, C, H, W, O, k, stride, pad, Ho, Wo;
} pdp_cudak_conv;

const char *pdp_cudak_error(void);
pdp_status pdp_cudak_device_count(int *count);
void pdp_cudak_set_tf32(int on);
pdp_status pdp_cudak_synchronize(int dev);

/* memory */
pdp_status pdp_cudak_malloc(int dev, size_t bytes, void **out);
void pdp_cudak_free(int dev, void *p);
pdp_status pdp_cudak_memory_stats(int dev, int64_t *mallocs, size_t *reserved, size_t *in_use);
pdp_status pdp_cudak_empty_cache(int dev);
pdp_status pdp_cudak_release(int dev);
pdp_status pdp_cudak_memset0(int dev, void *p, size_t bytes);
pdp_status pdp_cudak_fill(int dev, float *p, int64_t count, float value);
/* dst_dev / src_dev: a CUDA ordinal, or -1 for host memory. Device-to-host and
   host-to-device copies return when the copy is done; peer copies too. */
pdp_status pdp_cudak_memcpy(int dst_dev, void *dst, int src_dev, const void *src, size_t bytes);
/* dst += src, both on dev. */
pdp_status pdp_cudak_add(int dev, float *dst, const float *src, int64_t count);

/* layers: forward writes y (and saved); backward writes dx (when not NULL) and
   accumulates dw, db (+=). bf16 != 0: the products' inputs in bf16 (pdp_gemm_bf16's
   rounding; cuBLAS GemmEx, fp32 output), the bias gradient from the fp32 dy. */
pdp_status pdp_cudak_linear_fwd(int dev, const float *x, const float *w, const float *b, float *y,
                                int64_t batch, int64_t in, int64_t out, int bf16);
pdp_status pdp_cudak_linear_bwd(int dev, const float *x, const float *w, const float *dy,
                                float *dw, float *db, float *dx, int64_t batch, int64_t in,
                                int64_t out, int bf16);
pdp_status pdp_cudak_act_fwd(int dev, pdp_cudak_act act, const float *x, float *y, int64_t count);
pdp_status pdp_cudak_act_bwd(int dev, pdp_cudak_act act, const float *x, const float *y,
                             const float *dy, float *dx, int64_t count);
/* Sample s's element j keyed (seed, layer, step, sample_base + s; first + j): first is
   the element of the whole sample that element 0 is (a slice of the sequence: tp_seq). */
pdp_status pdp_cudak_dropout_fwd(int dev, const float *x, float *y, float *mask, int64_t batch,
                                 int64_t n, float p, uint64_t seed, int layer, uint64_t step,
                                 int64_t sample_base, int64_t first);
/* dx = dy * mask */
pdp_status pdp_cudak_mul(int dev, const float *dy, const float *mask, float *dx, int64_t count);
pdp_status pdp_cudak_layernorm_fwd(int dev, const float *x, const float *w, const float *b,
                                   float *y, float *saved, int64_t batch, int64_t n, float eps);
pdp_status pdp_cudak_layernorm_bwd(int dev, const float *x, const float *w, const float *dy,
                                   const float *saved, float *dw, float *db, float *dx,
                                   int64_t batch, int64_t n);
/* work: (C k k + O) Ho Wo floats per sample */
pdp_status pdp_cudak_conv_fwd(int dev, const pdp_cudak_conv *g, const float *x, const float *w,
                              const float *b, float *y, float *work, int bf16);
pdp_status pdp_cudak_conv_bwd(int dev, const pdp_cudak_conv *g, const float *x, const float *w,
                              const float *dy, float *dw, float *db, float *dx, float *work,
                              int bf16);
pdp_status pdp_cudak_maxpool_fwd(int dev, const pdp_cudak_conv *g, const float *x, float *y,
                                 float *argmax);
pdp_status pdp_cudak_maxpool_bwd(int dev, const pdp_cudak_conv *g, const float *dy,
                                 const float *argmax, float *dx);

/* a GPT's layers (layers_gpt.c's formulas). Embedding: ids [B, T] int32 on dev; an id
   outside [0, V) is PDP_ERR_INVALID naming its position and value (the forward waits for
   the check); backward checks them again (the caller may have changed them since: the same
   error, before anything is added) and accumulates dwte and dwpe (+=) in the CPU's order per
   channel, no atomics; work: B T int32. */
pdp_status pdp_cudak_embed_fwd(int dev, const int32_t *ids, const float *wte, const float *wpe,
                               float *out, int64_t B, int64_t T, int64_t V, int64_t C);
pdp_status pdp_cudak_embed_bwd(int dev, const int32_t *ids, const float *dout, float *dwte,
                               float *dwpe, int32_t *work, int64_t B, int64_t T, int64_t V,
                               int64_t C);
/* Causal self-attention of qkv [B, T, 3C] into y [B, T, C], H heads, saving att [B, H, T, T]
   (P before dropout); p > 0: attention dropout keyed as the CPU's (seed, layer, step,
   sample_base + b; element ((head_base + h) T + t) T + s). Backward writes dqkv (=).
   work: B H T T floats. */
typedef struct pdp_cudak_attn {
    int64_t B, T, C, H;
    float p;             /* attention dropout; 0: none (evaluation, or p = 0) */
    uint64_t seed, step;
    int layer;           /* the layer index that keys the masks */
    int64_t sample_base; /* the global index of sequence 0 */
    int64_t head_base;   /* the global index of head 0 (0 but on a shard of the heads) */
} pdp_cudak_attn;
pdp_status pdp_cudak_attention_fwd(int dev, const pdp_cudak_attn *g, const float *qkv, float *y,
                                   float *att, float *work);
pdp_status pdp_cudak_attention_bwd(int dev, const pdp_cudak_attn *g, const float *qkv,
                                   const float *att, const float *dy, float *dqkv, float *work);
/* the residual's adds: out = a + b; d1 = src and, when d2 is not NULL, d2 = src */
pdp_status pdp_cudak_sum2(int dev, const float *a, const float *b, float *out, int64_t count);
pdp_status pdp_cudak_copy2(int dev, const float *src, float *d1, float *d2, int64_t count);

/* losses. host_labels: batch labels in host memory, already checked to lie in
   [0, classes) or be -1, an ignored row (loss 0, dlogits 0). host_loss: batch
   per-sample losses (double) for the host to sum in sample order. dlogits may be NULL. */
pdp_status pdp_cudak_cross_entropy(int dev, const float *logits, const int32_t *host_labels,
                                   int64_t batch, int64_t classes, float grad_scale,
                                   double *host_loss, float *dlogits);
/* *host_sum = sum of (pred - target)^2 in double; dpred (may be NULL) = scale (pred - target). */
pdp_status pdp_cudak_mse(int dev, const float *pred, const float *target, int64_t count,
                         float scale, double *host_sum, float *dpred);

/* gradient clipping: *host_sum = sum of x^2 in double (block partial sums in a
   fixed order: the same bits every run); x *= s in float */
pdp_status pdp_cudak_sumsq(int dev, const float *x, int64_t count, double *host_sum);
pdp_status pdp_cudak_scale(int dev, float *x, int64_t count, float s);

/* gradient compression (ddp.h's compress hooks), dtype 1 bf16, 2 fp16 (pdp_dtype):
   dst[i] = 16-bit(src[i] * scale), rounded to nearest even by math.h's
   pdp__bf16_bits / pdp__f16_bits (the CPU's bits); and dst[i] = widen(src[i]). */
pdp_status pdp_cudak_to16(int dev, void *dst, const float *src, int64_t count, float scale,
                          int dtype);
pdp_status pdp_cudak_from16(int dev, float *dst, const void *src, int64_t count, int dtype);

/* optimizers: elements [0, count) of the given pointers, the math.h updates */
pdp_status pdp_cudak_sgd(int dev, float *p, const float *g, float *buf, int64_t count, float lr,
                         float momentum, float one_minus_damp, float weight_decay, int nesterov,
                         int first);
pdp_status pdp_cudak_adam(int dev, float *p, const float *g, float *m, float *v, int64_t count,
                          float beta1, float one_minus_beta1, float beta2, float one_minus_beta2,
                          float step_size, float bc2_sqrt, float eps, float l2, float decay);

/* benchmarks: C [m, n] = A [m, k] B [k, n], row-major, on dev (cuBLAS) */
pdp_status pdp_cudak_gemm(int dev, const float *a, const float *b, float *c, int64_t m, int64_t n,
                          int64_t k);

/* NCCL. One handle per rank: the NCCL communicator, its device and its own
   stream, and a ring of completion events indexed by slot. */
typedef struct pdp_cudak_nccl pdp_cudak_nccl;
#define PDP_CUDAK_NCCL_ID_BYTES 128
#define PDP_CUDAK_NCCL_SLOTS 256
pdp_status pdp_cudak_nccl_unique_id(int dev, void *id);
pdp_status pdp_cudak_nccl_init_rank(pdp_cudak_nccl **out, int dev, int nranks, int rank,
                                    const void *id, double timeout_s);
pdp_status pdp_cudak_nccl_init_all(pdp_cudak_nccl **out, int ndev, const int *devs);
/* abort: ncclCommAbort instead of ncclCommDestroy (after a failure) */
void pdp_cudak_nccl_free(pdp_cudak_nccl *h, int abort);
/* Records an event on dev's compute stream, makes the NCCL stream wait on it,
   enqueues the collective and records completion into *slot's event. For
   BROADCAST op is the root; for the reductions 0 = sum, 1 = average. dtype is a
   pdp_dtype (0 F32: ncclFloat32, 1 BF16: ncclBfloat16, 2 F16: ncclFloat16; the
   16-bit types for ALLREDUCE and REDUCE_SCATTER only); count is elements. */
pdp_status pdp_cudak_nccl_launch(pdp_cudak_nccl *h, pdp_cudak_coll kind, const void *send,
                                 void *recv, int64_t count, int op, int dtype, int *slot);
/* 1 done, 0 pending, -1 failed */
int pdp_cudak_nccl_query(pdp_cudak_nccl *h, int slot);
/* Waits for slot with a deadline; then the compute stream waits on it too.
   On timeout or an NCCL error: ncclCommAbort, PDP_ERR_TIMEOUT / PDP_ERR_COMM. */
pdp_status pdp_cudak_nccl_wait(pdp_cudak_nccl *h, int slot, double timeout_s);
/* Host bytes from root to every rank (staged through the device). */
pdp_status pdp_cudak_nccl_broadcast_bytes(pdp_cudak_nccl *h, void *host, size_t bytes, int root,
                                          double timeout_s);
/* Point-to-point: n sends and receives enqueued in ONE ncclGroupStart/ncclGroupEnd
   (so a ring where every rank sends first cannot deadlock), after an event recorded
   on the compute stream; each op's completion is recorded into its own event slot,
   in order (ops[i].slot out). NCCL has no tags: each message is preceded, in the
   same group, by a 3-int64 header {magic, tag, count} from the sender into the
   receiver's header slot, which pdp_cudak_nccl_p2p_header reads back. ncclGroupEnd
   (where a first message between two ranks connects them) is bounded by timeout_s. */
typedef struct pdp_cudak_p2p {
    int is_send;   /* 1 ncclSend, 0 ncclRecv */
    int peer;
    int tag;
    int64_t count; /* floats; 0 sends the header only */
    float *buf;
    int slot;      /* out */
} pdp_cudak_p2p;
pdp_status pdp_cudak_nccl_p2p(pdp_cudak_nccl *h, pdp_cudak_p2p *ops, int n, double timeout_s);
/* The header a receive in slot got: *arrived 0 when none came (then tag and count
   are untouched); call after the slot completed or failed (a copy on the compute
   stream, which an aborted communicator does not block). */
pdp_status pdp_cudak_nccl_p2p_header(pdp_cudak_nccl *h, int slot, int *arrived, int64_t *tag,
                                     int64_t *count);
/* ncclCommSplit (NCCL >= 2.18): collective over h's ranks; colour < 0 joins nothing
   (*out = NULL). The new handle is on h's device with its own stream and events. */
pdp_status pdp_cudak_nccl_split(pdp_cudak_nccl *h, int colour, int key, pdp_cudak_nccl **out,
                                double timeout_s);

#endif /* PDP_CUDA || __CUDACC__ */
