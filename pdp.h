/* pdp.h - v0.1.0 - embeddable C training library - MIT (see end of file)
   GENERATED from src/ by amalgamate.py: edit src/, then run `python3 amalgamate.py`.

   QUICK START
   ===========
   Drop pdp.h into your project. In exactly one .c file:

       #define PDP_IMPLEMENTATION
       #include "pdp.h"

       #define CHECK(call) do { if ((call) != PDP_OK) { puts(pdp_last_error()); return 1; } } while (0)

       pdp_dataset *data;  pdp_batcher *batches;  pdp_model *m;  pdp_optim *opt;
       pdp_tensor x;  const int32_t *y;  int64_t n;  float loss;
       CHECK(pdp_dataset_load_fashion_mnist(&data, true, &(pdp_dataset_desc){.flat = true}));
       CHECK(pdp_batcher_create(&batches, data, &(pdp_batcher_desc){.batch_size = 64, .shuffle = true}));
       CHECK(pdp_model_create(&m, &(pdp_model_desc){.input_shape = {784}, .seed = 1}));
       CHECK(pdp_model_add_linear(m, 256));  CHECK(pdp_model_add_relu(m));
       CHECK(pdp_model_add_linear(m, 10));
       CHECK(pdp_optim_create(&opt, m, &(pdp_optim_desc){.kind = PDP_OPTIM_ADAM, .lr = 1e-3f}));
       while (pdp_batcher_next(batches, &x, &y, &n)) {
           CHECK(pdp_model_forward_backward(m, &x, y, &loss));
           CHECK(pdp_optim_step(opt));  pdp_optim_zero_grad(opt);
       }
       pdp_optim_free(opt);  pdp_model_free(m);  pdp_batcher_free(batches);  pdp_dataset_free(data);
       pdp_shutdown_threads();   // optional: joins the GEMM thread pool

   Link with -lm -lpthread. C++ and .cu files have no compound literals: declare the
   desc zeroed (pdp_model_desc md = {};), set its fields, pass &md.

   Every function that can fail returns a pdp_status; on failure pdp_last_error()
   says what and where ("pdp_model_forward: layer 0 (Linear) expects [64, 784],
   got [64, 785]"). README.md has this as a whole program (tested by make test);
   examples/train_mnist.c adds evaluation and a learning-rate schedule.

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
   that batch, training steps allocate nothing. On the CPU a Conv2d applies a
   ReLU that follows it, and a 2x2 stride-2 MaxPool2d after that ReLU (over an
   even height and width), itself: the ReLU then has no buffer of its own, and
   with the pool the convolution's full-size output is never stored (same bits as
   the separate layers).

   ERRORS
   ======
   pdp_status: PDP_OK = 0, negative codes by area (-1.. general, -100 shapes and
   numerics, -200 files, -300 CUDA, -400 communicators); pdp_status_name() gives
   the name. The message is thread-local. The library never exits and never prints
   unless given a log callback.

   PRECISION
   =========
   Parameters, gradients and optimizer state are fp32. pdp_model_desc.precision =
   PDP_PRECISION_BF16 (or pdp_model_set_precision) is mixed precision as PyTorch's
   autocast: the inputs of Linear's and Conv2d's GEMMs (forward and both backward
   products) are rounded to bf16, products accumulate in fp32, everything else stays
   fp32. pdp_gemm_bf16 picks its path by CPUID at run time: AMX tiles where the CPU
   has AMX-BF16 and Linux grants the tile state (asked once; refused: the next path),
   AVX512-BF16 (vdpbf16ps), and an emulation with the AVX512 path's arithmetic and
   bits everywhere else (pdp_bf16_path_name says which). AMX sums each pair in the
   other order, so its bits may differ within a stated bound; it was checked once on
   a scalar tile emulator outside the tests, never on an AMX CPU. Conv2d's implicit
   GEMMs (stride 1, padding below the kernel size) run on the same kernels through
   row-offset tables, the padded image converted to bf16 once per chunk; on the
   emulated path, and for the dW of a convolution with few weights (1 -> 16 channels
   at k 5), the fp32 kernels multiply bf16-rounded inputs. On CUDA the same switch
   runs Linear and Conv2d as cublasGemmEx with bf16 inputs and fp32 accumulation
   (checked on the CUDA emulator, not yet on a GPU). Speed (bench/train, one
   AVX512-BF16 core of an AMD EPYC, one run): the MLP 784-512-512-10 step at batch 512
   trains 43k samples/s in bf16 against 26k in fp32, 1.25x PyTorch's autocast (1.7x at
   batch 128); the CNN of train_cnn at batch 128, 6.5k in bf16 against 5.1k in fp32,
   1.5x autocast. Tested: 5 epochs of the Fashion-MNIST MLP reach 88.86% in bf16
   against 88.76% in fp32 (train_mnist -bf16, seed 1); one autocast MLP step against a
   PyTorch fixture (tests/test_bf16.c).

   THREADS AND DETERMINISM
   =======================
   pdp_set_num_threads(n) sets the intra-op threads of the calling thread (large
   GEMMs split over a process-wide pool of persistent workers; each output element
   is computed by one thread, so the bits do not depend on n). A worker spins for up
   to 100 microseconds after a job before it sleeps, so a hand-off that comes within
   that time (the next GEMM of a training step) needs no wake-up. Random numbers come
   from explicit PCG32 states; a seed gives the same bits everywhere. Dropout masks
   are a function of (seed, layer, step, global sample index), so DP and DDP draw
   exactly the masks a single device would. Reductions run in a fixed order.
   pdp_profile_start/read/stop (base.h) split the calling thread's time into layers
   with weights, other layers, loss, optimizer and the rest, and count the intra-op
   workers' idle thread-seconds: bench/train prints it per configuration.

   DEVICES AND CUDA
   ================
   A tensor and a model live on a pdp_device (pdp_cpu(), pdp_cuda(i)). With
   PDP_CUDA, pdp_cuda.cu provides GPU memory, kernels, cuBLAS GEMMs and NCCL;
   without it a CUDA device fails with PDP_ERR_UNSUPPORTED naming the macro.

   CHECKPOINTS
   ===========
   pdp_checkpoint_save/load write and read safetensors files named like a PyTorch
   state_dict ("0.weight"), with the optimizer's state as "optim.*" tensors: PyTorch
   and Python's safetensors read them. __metadata__ holds a CRC-32C of every tensor
   ("crc32c.<name>") and of the header ("crc32c.header"); a load verifies them and
   fails with PDP_ERR_FORMAT naming the tensor or the header, leaving the model and
   optimizer untouched. Files without checksums (other tools) load unverified. A
   save writes <path>.tmp.<pid>, fsyncs and renames, so a crash loses nothing, and
   removes temporaries left by writers that were killed. Every load error starts
   with "pdp_checkpoint_load: <path>: ".

   DISTRIBUTED
   ===========
   DataParallel, one process (dp.h): pdp_dp_create(&dp, master, &desc) starts one
   persistent worker thread per device after the first (the calling thread drives
   replica 0, the master, itself); pdp_dp_step(dp, opt, x, y, &loss) runs the
   stages replicate, scatter, parallel apply, gather, reduce (to the master, in a
   fixed order) and the master's optimizer step; on the CPU with 2+ workers each
   worker steps the slice of the master's parameters it has just reduced (same bits,
   no core idle while one steps; the stats then show the step's time in reduce).
   pdp_dp_get_stats shows the bytes through the master and the time per stage. N
   workers reproduce one device on the same global batch; one worker, bit for bit.

   DistributedDataParallel (ddp.h): every rank holds a full model and a pdp_comm.
   pdp_ddp_create checks that all ranks have the same parameters and broadcasts
   rank 0's; buckets (25 MiB, the first 1 MiB) are ranges of the gradient block, so
   there is no copy; each bucket's all-reduce starts as soon as backward produced
   its last gradient. pdp_ddp_forward_backward, then pdp_ddp_step (wait, average,
   step). Every backward of a wrapped model synchronises, whatever the loss: for
   your own loss call pdp_ddp_forward, compute the loss and its gradient, then
   pdp_ddp_backward(ddp, dy) (or pdp_model_forward/backward on the model); a second
   backward before the step fails with PDP_ERR_STATE saying what to call.
   pdp_ddp_set_no_sync accumulates locally. pdp_dist_sampler gives each
   rank a disjoint shard of a seeded permutation (pad or drop_last).
   Communication hooks (PyTorch's register_comm_hook): pdp_ddp_register_comm_hook
   (or pdp_zero_register_comm_hook) before the first backward puts a user's launch
   (and optional finish) in place of each bucket's collective; the built-ins
   pdp_ddp_hook_bf16_compress and pdp_ddp_hook_fp16_compress scale by 1/N, round
   the bucket to 16 bits in a buffer allocated at registration, reduce in 16 bits
   (pdp_comm_allreduce_ex / pdp_comm_reduce_scatter_ex with PDP_DTYPE_BF16 or
   PDP_DTYPE_F16: fp32 sums rounded once on local, at each combination on MPI,
   NCCL's native types) and widen back: half the bytes, within the bound ddp.h
   states. fp16 has no loss scaling: prefer bf16. train_ddp -compress bf16.

   ZeRO (zero.h), stages 1, 2, 3: DDP's step shape (pdp_zero_create with
   .stage, pdp_zero_forward_backward, pdp_zero_step with an optimizer from
   pdp_zero_optim_create) while each rank holds 1/N of the optimizer state (1),
   and of the gradients (2), and of the parameters (3). Each unit (a bucket of
   whole layers) is padded to N equal slices and rank r owns slice r: one
   reduce-scatter per unit during backward, the rank steps its slices, and an
   all-gather restores the parameters (stage 3 gathers each unit before its
   forward and backward, the next unit's gather in flight). pdp_zero_memory
   reports the bytes held beside the ZeRO paper's formulas (Adam: DDP 16 Psi,
   stage 1 8 Psi + 8 Psi/N, stage 2 4 Psi + 12 Psi/N, stage 3 16 Psi/N, plus the
   stated buffers); bytes sent per step are DDP's (stages 1-2) or 1.5x (3).
   Tested equal to DDP and one device on local and MPI ranks (CPU models) and
   over NCCL (CUDA models, on the emulator in CI).
   Checkpoints: pdp_zero_checkpoint_save(z, opt, prefix) (collective) writes
   prefix.rank<r>.safetensors per rank atomically, then rank 0 the marker
   prefix.done once every rank has succeeded (llm.c's scheme); pdp_zero_checkpoint_load
   resumes bit-exact at the same world size, all or nothing, naming the bad file.
   pdp_zero_checkpoint_consolidate writes the one file pdp_checkpoint_save writes
   for one device (PyTorch reads it); pdp_zero_checkpoint_load_full loads such a
   file into a ZeRO run at any world size and stage.

   Tensor parallel (tp.h), Megatron-LM's MLP block: build the same model on every
   rank of a TP communicator, pdp_model_set_tp(m, tp), then pdp_model_add_tp_copy
   (f: identity forward, all-reduce backward), pdp_model_add_column_parallel_linear
   (rank r holds its slice of the output features), an element-wise activation,
   pdp_model_add_row_parallel_linear (the matching input slice; TP rank 0 adds the
   bias), pdp_model_add_tp_reduce (g: all-reduce forward, identity backward). Widths
   the TP size does not divide split as pdp_tp_split says. Each rank draws the full
   weights from the seed and keeps its slice, so TP trains as one device does
   (tested at 1e-5 on 1-4 ranks); f and g are not numbered in state_dict names.
   pdp_tp_get_stats counts the all-reduced bytes (per block and step, B x d in g's
   forward and B x in in f's backward; none when f is the first layer). pdp_tp_checkpoint_save/load (collective) read and write the full tensors,
   the file one device would write. 2-D: split a world into TP groups and DP groups
   with pdp_comm_split and wrap the TP model in pdp_ddp_create on the DP group.

   Pipeline parallel (pp.h): every rank builds the same full model and calls
   pdp_pp_create(&pp, full, comm, &desc); rank r keeps stage r's layers
   (pdp_pp_model), with the full model's values and names. Boundaries are given
   (desc.first_layer) or balanced by parameter count (default) or measured time.
   pdp_pp_forward_backward cuts the batch into desc.micro_batches (m); activations
   go forward and gradients back over send/recv; schedules PDP_PP_1F1B (default:
   at most p - s micro-batches held on stage s) or PDP_PP_GPIPE (all m held). The
   loss (cross-entropy, or desc.loss) is on the last stage; gradients are scaled
   so that a step equals one device on the whole batch (tested at 1e-5, p = 1..4,
   thread ranks and MPI). pdp_pp_get_stats gives each stage's bubble beside
   (p-1)/(m+p-1) and its peak activation memory; PDP_TRACE draws one lane per
   stage with F<i>/B<i> events. DP x PP: desc.dp, a communicator from
   pdp_comm_split, averages each stage's gradients once per step.

   Communicators (comm.h): all-reduce, broadcast, reduce-scatter, all-gather,
   barrier, point-to-point send/recv (matched by peer and tag), each asynchronous
   (pdp_wait), and pdp_comm_split (colour, key; as MPI_Comm_split) for process
   groups such as 2 data-parallel x 2 model-parallel. Backends, one file each:
   local (ranks are threads: pdp_local_group_create + pdp_comm_create_local; no
   dependency), mpi (PDP_MPI, pdp_comm_init_env under mpirun), nccl (PDP_CUDA;
   process per GPU through pdp_comm_init_env, thread per GPU through
   pdp_nccl_group_create; point-to-point batched into NCCL groups, split through
   ncclCommSplit, NCCL 2.18+; comm.h lists where NCCL's messages differ). A rank
   that does not arrive within timeout_s (default 300) makes the others fail with PDP_ERR_TIMEOUT naming the collective (or the peer and tag)
   and the rank: nothing hangs. MPI start-up: with PDP_STORE_PORT (or MASTER_PORT)
   set, every rank checks in at rank 0's store before MPI_Init_thread, so a rank
   that never starts is named within timeout_s; MPI_Init_thread itself cannot be
   bounded (a watchdog reports through desc.log). A killed rank takes mpirun's
   whole job down unless it runs with --enable-recovery; then the survivors get
   PDP_ERR_TIMEOUT. comm.h says exactly what is bounded.

   Rendezvous as torchrun (rendezvous.h): RANK, WORLD_SIZE, LOCAL_RANK,
   MASTER_ADDR, MASTER_PORT, or OMPI_COMM_WORLD_* under mpirun (pdp_env_read). A
   TCP key-value store served by rank 0 (store.h, pdp_store_*; host "0.0.0.0"
   listens on every interface) hands out the NCCL unique id.

   Tracing: PDP_TRACE=out.json writes a Chrome trace (Perfetto, chrome://tracing):
   per rank, forward and backward per layer, each bucket's all-reduce from launch
   to completion, the final wait, the optimizer step. A process that is one rank
   of several writes out.rank<r>.json. pdp_trace_flush() writes it out early.

   OPTION VALUES
   =============
   In every desc, zero means the default. A value outside a field's documented
   range (negative where it must be positive, NaN, infinite) fails with
   PDP_ERR_INVALID naming the function and the field; it is never clamped or
   silently replaced.

   NON-GOALS
   =========
   No autograd graph (models are sequential); float32 only; no Windows threads
   yet.

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

/* Profile: where the calling thread's time goes (bench/train prints it per step).
   pdp_profile_start zeroes the calling thread's counters and turns them on;
   pdp_profile_read fills *out with what they counted since the start and leaves them on;
   pdp_profile_stop turns them off and reads them (a later read gives the same). The calling thread's pdp calls count, as
   wall time on that thread (intra-op workers' share included): the layers' forward and
   backward, by kind of layer, the built-in losses and the optimizer. While on, a counted
   call reads the clock twice; while off it costs one test of a thread-local flag. */
typedef struct pdp_profile {
    double wall_s;       /* since pdp_profile_start */
    double gemm_layers_s;  /* layers with weights (Linear, Conv2d, the TP linears), forward
                              and backward: their GEMMs, with bias, im2col and bf16 packing */
    double other_layers_s; /* the other layers: element-wise (ReLU, ...), pooling, views */
    double loss_s;       /* built-in losses (cross-entropy, MSE), with their gradient */
    double optim_s;      /* optimizer steps and zero_grad */
    double other_s;      /* wall_s minus the above: the caller's own code, data, waits */
    int threads;         /* the intra-op setting at the start (pdp_get_num_threads) */
    double idle_s;       /* thread-seconds the (threads - 1) intra-op workers sat idle:
                            (threads - 1) x wall_s minus their busy time, plus the time
                            the calling thread waited for them at the end of a parallel
                            part; 0 with one thread */
} pdp_profile;
PDP_API void pdp_profile_start(void);
PDP_API void pdp_profile_read(pdp_profile *out);
PDP_API void pdp_profile_stop(pdp_profile *out); /* out may be NULL */

/* Tracing: with PDP_TRACE=path in the environment, DDP and the communicators
   record a Chrome trace (open it in ui.perfetto.dev or chrome://tracing); a
   process that is one rank of several writes path.rank<r>.<ext>. The file is
   written when the last traced object is freed and whenever the in-memory
   buffer fills; this writes it now (a valid JSON file afterwards). PDP_OK when
   tracing is off. */
PDP_API pdp_status pdp_trace_flush(void);
/* ---- end src/base.h ---- */

/* ---- begin src/tensor.h ---- */
/* tensor: float32 tensors of 1 to 4 dimensions, contiguous, on a device; and the
   seeded random number generator used for initialisation and dropout.

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

/* ---- begin src/gemm.h ---- */
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
                             once); the same chain by Intel's pseudo-code except that each
                             pair's even product comes first, so its bits may differ from
                             the others' within the fp32 summation bound (gemm_bf16.c) */
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
/* ---- end src/gemm.h ---- */

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
    pdp_precision precision; /* PDP_PRECISION_BF16: Linear and Conv2d products take bf16
                                inputs (pdp_gemm_bf16; on CUDA cuBLAS GemmEx), as
                                torch.autocast; parameters, gradients, activations and
                                the rest stay fp32. Default fp32 */
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
/* Switches the precision of the next forward and backward passes (training and
   evaluation); as pdp_model_desc.precision. */
PDP_API pdp_status pdp_model_set_precision(pdp_model *m, pdp_precision precision);
PDP_API pdp_precision pdp_model_precision(const pdp_model *m);

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

/* ---- losses ----
   As torch.nn.functional with reduction='mean'. Tensors are on the CPU. */

/* Softmax cross-entropy of logits [batch, classes] against integer labels in
   [0, classes): *loss = mean over the batch of -log softmax(logits)[label].
   dlogits (same shape, may be NULL) gets (softmax - onehot) / batch. A label out
   of range fails with PDP_ERR_INVALID, a NaN or Inf loss with PDP_ERR_NUMERIC,
   each naming the sample. */
PDP_API pdp_status pdp_loss_cross_entropy(const pdp_tensor *logits, const int32_t *labels,
                                          float *loss, pdp_tensor *dlogits);
/* Mean squared error over all elements: *loss = mean((pred - target)^2); dpred
   (same shape, may be NULL) gets 2 (pred - target) / count. */
PDP_API pdp_status pdp_loss_mse(const pdp_tensor *pred, const pdp_tensor *target, float *loss,
                                pdp_tensor *dpred);
/* *correct = the number of samples whose argmax of logits [batch, classes] (the
   first maximum) equals the label. */
PDP_API pdp_status pdp_count_correct(const pdp_tensor *logits, const int32_t *labels,
                                     int64_t *correct);
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
/* lr: finite and >= 0, else PDP_ERR_INVALID and the optimizer keeps its lr. */
PDP_API pdp_status pdp_optim_set_lr(pdp_optim *o, float lr);
PDP_API float pdp_optim_lr(const pdp_optim *o);
PDP_API int64_t pdp_optim_steps(const pdp_optim *o); /* updates done so far */
/* The desc in use, defaults filled in (sokol's query-defaults). */
PDP_API pdp_optim_desc pdp_optim_get_desc(const pdp_optim *o);
PDP_API const char *pdp_optim_kind_name(pdp_optim_kind kind); /* "SGD", "Adam", "AdamW" */

/* Scales all gradients so their global L2 norm is at most max_norm (as
   torch.nn.utils.clip_grad_norm_); *total_norm gets the norm before clipping
   (may be NULL). A NaN or Inf norm fails with PDP_ERR_NUMERIC; max_norm must be finite
   and >= 0 (else PDP_ERR_INVALID). */
PDP_API pdp_status pdp_clip_grad_norm(pdp_model *m, float max_norm, float *total_norm);

/* Linear warm-up, then cosine decay (llm.c's schedule). step counts from 0:
   step < warmup: base_lr * (step + 1) / warmup (the first step is not spent at
   lr 0); warmup <= step < total: min_lr + (base_lr - min_lr) * (1 + cos(pi *
   (step - warmup) / (total - warmup))) / 2; step >= total: min_lr. It cannot return a
   status: for a negative step, warmup or total, or a base_lr or min_lr that is negative,
   NaN or infinite, it returns NaN (which pdp_optim_set_lr then rejects). */
PDP_API float pdp_lr_warmup_cosine(int64_t step, int64_t warmup, int64_t total, float base_lr,
                                   float min_lr);
/* ---- end src/optim.h ---- */

/* ---- begin src/data.h ---- */
/* data: datasets in memory, the IDX file format (MNIST, Fashion-MNIST), a seeded
   synthetic classification task, and a shuffling batch iterator.

   A dataset holds every sample as float32 in one block, [count, features], and
   one int32 label per sample. Reading .gz files needs no library: pdp carries
   its own gzip (RFC 1952) and DEFLATE (RFC 1951) decoder. The batcher copies the
   samples of each batch into a buffer it owns, so the training loop allocates
   nothing; its order in epoch e depends on (seed, e) only, like PyTorch's
   DistributedSampler after set_epoch(e). A distributed run gives each rank its
   own index list (pdp_batcher_desc.indices). */

/* Fashion-MNIST's training-set pixel statistics (of p / 255), for
   pdp_dataset_desc.mean and .std. */
#define PDP_FASHION_MNIST_MEAN 0.2860f
#define PDP_FASHION_MNIST_STD 0.3530f

typedef struct pdp_dataset {
    int64_t count;      /* samples */
    int ndim;           /* dimensions of one sample: 3 (channels, height, width) or 1 (flat) */
    int64_t shape[3];   /* one sample's shape; unused entries are 1 */
    int64_t features;   /* floats per sample: the product of shape (784 for 28x28) */
    int classes;        /* largest label + 1 */
    float *images;      /* [count, features], 64-byte aligned; read-only for the user */
    int32_t *labels;    /* [count] */
} pdp_dataset;

typedef struct pdp_dataset_desc {
    bool flat;           /* samples of shape (features) instead of (1, height, width);
                            default false */
    float mean, std;     /* std > 0: a pixel p becomes (p / 255 - mean) / std; default
                            std 0: p / 255, in [0, 1] */
    int64_t max_samples; /* keep only the first max_samples (0 = all); synthetic: how
                            many to make (0 = 60000 train, 10000 test) */
    uint64_t seed;       /* synthetic only: the class prototypes and the noise; default 0 */
} pdp_dataset_desc;

/* Reads an IDX image file (magic 0x00000803: unsigned bytes, [count, rows, cols])
   and its IDX label file (magic 0x00000801, [count]); either may be gzipped
   (recognised by content, not by name). A bad magic, a truncated file, a failed
   CRC, counts that disagree between the two files or dimensions that overflow
   fail with PDP_ERR_FORMAT naming the file; a missing file with PDP_ERR_IO. */
PDP_API pdp_status pdp_dataset_load_idx(pdp_dataset **out, const char *images_path,
                                        const char *labels_path, const pdp_dataset_desc *desc);
/* Fashion-MNIST (60000 training or 10000 test samples) from the directory named
   by $PDP_DATA if set, else /usr/share/datasets/fashion-mnist: the files
   train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte and
   t10k-labels-idx1-ubyte, each plain or with .gz. When they are missing it fails
   with PDP_ERR_IO, naming the paths it tried and how to get the files. */
PDP_API pdp_status pdp_dataset_load_fashion_mnist(pdp_dataset **out, bool train,
                                                  const pdp_dataset_desc *desc);
/* A learnable stand-in with Fashion-MNIST's shapes (28x28, 10 classes) and no
   files: each class is a pattern of Gaussian blobs drawn from desc->seed (three
   shared by all classes, two of its own); a sample is its class pattern, shifted
   by up to two pixels, scaled, with Gaussian noise (std 0.3), clipped to [0, 1].
   Train and test share the patterns and differ in the noise. An MLP reaches
   about 95% on it, not 100%. */
PDP_API pdp_status pdp_dataset_synthetic(pdp_dataset **out, bool train,
                                         const pdp_dataset_desc *desc);
PDP_API void pdp_dataset_free(pdp_dataset *ds); /* NULL is fine */

/* Copies samples indices[0..n) to x_out ([n, features] floats) and their labels to
   labels_out (either may be NULL). An index outside [0, count) fails with
   PDP_ERR_INVALID naming it, before anything is written. */
PDP_API pdp_status pdp_dataset_gather(const pdp_dataset *ds, const int64_t *indices, int64_t n,
                                      float *x_out, int32_t *labels_out);
/* Fills *x (caller-owned struct, no allocation) with samples [first, first + n)
   as a tensor [n, sample shape...] that views the dataset's memory. */
PDP_API pdp_status pdp_dataset_view(const pdp_dataset *ds, int64_t first, int64_t n,
                                    pdp_tensor *x);

/* Fills out[0..n) with a random permutation of 0..n-1 that depends only on
   (seed, epoch): Fisher-Yates driven by pdp_rng seeded with (seed, stream epoch). */
PDP_API void pdp_permutation(int64_t *out, int64_t n, uint64_t seed, uint64_t epoch);

/* ---- batches ---- */

typedef struct pdp_batcher pdp_batcher;

typedef struct pdp_batcher_desc {
    int64_t batch_size;     /* samples per batch; default 64 */
    bool shuffle;           /* default false: in index order, as PyTorch's DataLoader */
    bool drop_last;         /* default false: the last batch of an epoch may be smaller */
    uint64_t seed;          /* with shuffle: epoch e's order is pdp_permutation(seed, e) of
                               the index list */
    const int64_t *indices; /* iterate over these samples (copied at create; they may repeat,
                               as a padded DistributedSampler's do); NULL = all, in order */
    int64_t num_indices;    /* length of indices */
} pdp_batcher_desc;

/* A batcher over ds (which must outlive it), positioned at the start of epoch 0. */
PDP_API pdp_status pdp_batcher_create(pdp_batcher **out, const pdp_dataset *ds,
                                      const pdp_batcher_desc *desc);
PDP_API void pdp_batcher_free(pdp_batcher *b); /* NULL is fine */
/* The next batch of this epoch: *x becomes a view [n, sample shape...] of the
   batcher's buffer and *labels points at its n labels, both valid until the next
   call. Returns false, with *n = 0, when the epoch is over; call
   pdp_batcher_reset to start the next one. Allocates nothing. */
PDP_API bool pdp_batcher_next(pdp_batcher *b, pdp_tensor *x, const int32_t **labels, int64_t *n);
/* Starts epoch `epoch` from its first batch (its order is recomputed from the
   seed and the epoch number alone, so any epoch can be replayed). */
PDP_API void pdp_batcher_reset(pdp_batcher *b, uint64_t epoch);
/* Batches per epoch (counting a smaller last batch unless drop_last). */
PDP_API int64_t pdp_batcher_num_batches(const pdp_batcher *b);
/* This epoch's order: *count dataset indices (may be NULL). */
PDP_API const int64_t *pdp_batcher_order(const pdp_batcher *b, int64_t *count);
/* ---- end src/data.h ---- */

/* ---- begin src/checkpoint.h ---- */
/* checkpoint: save and load a model (and optionally its optimizer) as a
   safetensors file (https://github.com/huggingface/safetensors), readable by
   `safetensors.torch.load_file` and loadable into the matching PyTorch module
   with `module.load_state_dict(...)` directly.

   Layout of a file written by pdp_checkpoint_save:
     tensors, all F32, little-endian, in this order in the data section:
       "<param>"                        every model parameter, state_dict names
                                        ("0.weight", "0.bias", "3.weight", ...)
       "optim.<param>.momentum_buffer"  SGD with momentum > 0
       "optim.<param>.exp_avg"          Adam, AdamW (then, after all exp_avg,
       "optim.<param>.exp_avg_sq"       every exp_avg_sq)
     __metadata__ (strings): "format": "pdp", "pdp_version", "model.seed" and
       "model.step" (the dropout stream: restored by load when present), and with an
       optimizer "optim.kind" ("SGD", "Adam", "AdamW"), "optim.steps",
       "optim.lr", "optim.momentum", "optim.dampening", "optim.nesterov"
       ("true"/"false"), "optim.weight_decay", "optim.beta1", "optim.beta2",
       "optim.eps" (floats printed with 9 significant digits: exact round trip),
       and checksums: "crc32c.<tensor>" for every tensor (CRC-32C of its data
       bytes as stored) and "crc32c.header" (of the header's content: the
       metadata but itself, the tensors' names, dtypes and shapes; exactly as
       defined in checkpoint.c), each 8 lowercase hex digits.
   The header is padded with spaces so the data starts 8-byte aligned.
   In PyTorch: sd = safetensors.torch.load_file(path); model.load_state_dict(
   {k: v for k, v in sd.items() if not k.startswith("optim.")}) (or pass the
   whole dict when the file was saved without an optimizer). */

/* Writes path atomically: the bytes go to "<path>.tmp.<pid>", which is
   flushed, fsync'd and renamed over path, then the directory is fsync'd. A
   failure or a crash at any point leaves any previous file at path intact (and
   on failure the temporary is removed). Temporaries "<path>.tmp.<pid>" that a
   killed writer left behind are removed first, when no process has that pid
   (another live writer's are kept). o may be NULL (parameters only).
   Errors: PDP_ERR_IO naming the file and the failed call. */
PDP_API pdp_status pdp_checkpoint_save(const char *path, const pdp_model *m, const pdp_optim *o);

/* Reads a checkpoint into m (and o, when not NULL). Every parameter of m must be
   present as F32 with m's shape; with o, its state tensors must be present and
   the file's "optim.kind" must be o's kind; o's step count and hyper-parameters
   (lr, momentum, ...) are then restored from the file, as PyTorch's
   optimizer.load_state_dict does. Tensors named "optim.*" are ignored when o is
   NULL; any other tensor m does not have is an error (PyTorch's strict=True).
   The whole file is validated into a staging buffer before anything is copied:
   on failure m and o are untouched (one exception: a model on a GPU whose
   host-to-device copy itself fails, PDP_ERR_CUDA, a device fault, may be left
   partly loaded; the message says so). A file with checksums (pdp's) is
   verified: the header, and every tensor load reads, whole; a file without
   them (another tool's, or an older pdp's) loads unverified. Errors, each
   message starting with "pdp_checkpoint_load: <path>: " and naming the tensor
   or the header: PDP_ERR_IO (cannot open or read), PDP_ERR_FORMAT (not
   safetensors, truncated, corrupt header, a checksum mismatch, overlapping or
   uncovered data, wrong dtype, optimizer kind or hyper-parameters),
   PDP_ERR_SHAPE (a missing, extra or differently shaped tensor). The header is
   limited to 100 MB (10^8 bytes). */
PDP_API pdp_status pdp_checkpoint_load(const char *path, pdp_model *m, pdp_optim *o);
/* ---- end src/checkpoint.h ---- */

/* ---- begin src/store.h ---- */
/* store: a small TCP key-value store (rendezvous.h says who the ranks are and
   where rank 0 serves it).

   The store is PyTorch's TCPStore in miniature: rank 0 serves it from a thread
   inside its own process, every rank (rank 0 too, through loopback) is a client.
   Ranks exchange small blobs through it before a collective library exists (the
   NCCL unique id) and synchronise with counters and barriers. Every blocking call
   ends by its timeout with PDP_ERR_TIMEOUT naming the key; nothing hangs. */

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
    const char *host; /* client: server to reach; server: address to bind, "0.0.0.0" for
                         every interface (needed across machines); "127.0.0.1" */
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

/* ---- begin src/rendezvous.h ---- */
/* rendezvous: who this process is, the way torchrun and mpirun say it.

   pdp_env_read() tells a process who it is: RANK, WORLD_SIZE, LOCAL_RANK,
   LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT as torchrun exports them, or
   OpenMPI's OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE} under mpirun.
   MASTER_ADDR and MASTER_PORT say where rank 0 serves the TCP store (store.h)
   through which a backend hands out its unique id (pdp_comm_init_env). */

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
/* ---- end src/rendezvous.h ---- */

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
   with PDP_ERR_TIMEOUT naming the collective and the missing rank.
   One module per backend in src/ (comm_local.c, comm_mpi.c, comm_nccl.c) fills
   one table of functions; comm.c holds this API and the dispatcher. A new
   backend is one new file plus one line in the dispatcher (and its value in
   pdp_backend). */

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

/* Element types of the reducing collectives' _ex forms. The float API is F32.
   16-bit elements halve the bytes on the wire (bytes_sent counts 2 per element);
   the buffers then hold uint16_t bit patterns (pdp.h's bf16: round to nearest even,
   as PyTorch's torch.bfloat16; fp16: IEEE binary16). */
typedef enum pdp_dtype {
    PDP_DTYPE_F32 = 0,
    PDP_DTYPE_BF16 = 1,
    PDP_DTYPE_F16 = 2
} pdp_dtype;

typedef struct pdp_comm_desc {
    pdp_backend backend;  /* default local */
    double timeout_s;     /* a collective waits this long for a missing rank; default 300.
                             As every numeric desc field: 0 means the default; a negative,
                             NaN or infinite value (or above 1e9) is PDP_ERR_INVALID naming
                             the function and the field */
    pdp_device device;    /* where buffers live; default CPU (NCCL: the rank's GPU) */
    const char *name;     /* for messages and the trace; default "comm" */
    pdp_log_fn log;       /* optional: the MPI start-up watchdog reports through it; NULL */
    void *log_user;       /* passed to log */
} pdp_comm_desc;

/* ---- local backend: ranks are threads ----
   Create one group for world_size ranks (1..256), then each rank's thread calls
   pdp_comm_create_local with its rank (once per rank) and issues its
   collectives on it. Each communicator runs a progress thread (none at world
   size 1, where every collective completes at once), so an asynchronous
   collective progresses while its rank computes; rank r's progress thread
   reduces slice r of every rank's buffer, in rank order, so all ranks get the
   same bits. Freeing a communicator tells the group that rank has left: a peer
   waiting for it fails at once with PDP_ERR_COMM instead of timing out. After
   a timeout or a departure the group is broken and every later collective on
   it fails at once with the first failure's message. The group outlives its
   communicators; free it after the last pdp_comm_free. */
PDP_API pdp_status pdp_local_group_create(pdp_local_group **out, int world_size,
                                          const pdp_comm_desc *desc);
PDP_API void pdp_local_group_free(pdp_local_group *g);
PDP_API pdp_status pdp_comm_create_local(pdp_comm **out, pdp_local_group *g, int rank);

/* ---- from the environment (torchrun or mpirun) ----
   MPI: the rank and size come from MPI itself; NCCL: RANK, WORLD_SIZE,
   LOCAL_RANK, MASTER_ADDR, MASTER_PORT (or OMPI_COMM_WORLD_*), the unique id
   through the TCP store on rank 0. Local is not available here (it needs a
   group). A backend that was not compiled in fails with PDP_ERR_UNSUPPORTED
   naming the macro.

   MPI start-up, what is and is not bounded by timeout_s (when pdp initialises
   MPI, i.e. the program did not call MPI_Init_thread itself):
   - bounded, naming the missing rank: with a store port in the environment
     (PDP_STORE_PORT, or MASTER_PORT; MASTER_ADDR says where rank 0 is) and the
     ranks named by the launcher (mpirun's OMPI_COMM_WORLD_*, or RANK and
     WORLD_SIZE), every rank checks in at a TCP store served by rank 0 BEFORE
     MPI_Init_thread. A rank that has not checked in within timeout_s makes the
     others fail with PDP_ERR_TIMEOUT, "missing rank 2: it did not call
     pdp_comm_init_env within 5 s", and MPI_Init_thread is never called (e.g.
     `PDP_STORE_PORT=29511 mpirun -np 4 ./train`);
   - reported, not bounded: MPI_Init_thread itself has no timeout and cannot be
     interrupted. If it has not returned timeout_s after it was called (a rank
     never started and there was no start-up check, or a rank died after its
     check), desc.log gets one PDP_LOG_ERROR message from a watchdog thread
     naming this rank; the call still blocks until MPI returns or the launcher
     ends the job (OpenMPI's mpirun does when a rank exits or dies). Without
     desc.log nothing is printed;
   - bounded: duplicating MPI_COMM_WORLD (MPI_Comm_idup, polled against
     timeout_s; PDP_ERR_TIMEOUT "did not call pdp_comm_init_env") and every
     collective, point-to-point and split afterwards.
   A rank killed later (SIGKILL, OOM): by default OpenMPI's mpirun then kills
   every rank at once, so the others get no pdp error at all. Run with
   `mpirun --enable-recovery` to keep the survivors alive: their pending
   collective then fails with PDP_ERR_TIMEOUT at timeout_s (measured: 2 ranks,
   timeout 2 s, the survivor's all-reduce failed after 2.0 s) and they can
   save a checkpoint and exit. */
PDP_API pdp_status pdp_comm_init_env(pdp_comm **out, const pdp_comm_desc *desc);

PDP_API void pdp_comm_free(pdp_comm *c);
PDP_API int pdp_comm_rank(const pdp_comm *c);
PDP_API int pdp_comm_size(const pdp_comm *c);
PDP_API pdp_backend pdp_comm_backend(const pdp_comm *c);
PDP_API double pdp_comm_timeout(const pdp_comm *c); /* seconds */

/* In place: buf <- op over ranks of buf. */
PDP_API pdp_status pdp_comm_allreduce(pdp_comm *c, float *buf, int64_t count, pdp_reduce_op op,
                                      pdp_work **work);
/* The reducing collectives on any pdp_dtype: buf (reduce_scatter: send and recv)
   holds count elements of that type (F32: floats, as the calls above, which are
   the F32 case). The 16-bit semantics differ by backend, and each is exact for
   its stated rounding:
     local  every element is widened to fp32, reduced in fp32 in rank order
            (((x0 + x1) + x2) + ...; AVG then divides by N) and rounded ONCE to
            the 16-bit type, to nearest even: the same bits on every rank;
     mpi    a user-defined MPI_Op over MPI_UINT16_T (created once per
            communicator, commutative): each combination of two partial values
            widens both, adds in fp32 and rounds to nearest even, so N ranks
            round N - 1 times in an order MPI chooses (2 ranks: once, the local
            backend's bits); AVG then divides the rounded sum in fp32 and rounds
            again (exact for powers of two);
     nccl   ncclBfloat16 / ncclFloat16 with ncclSum / ncclAvg: NCCL's own
            reduction order and rounding of partial sums (also N - 1 roundings
            on a ring).
   Gradient compression divides by N BEFORE compressing and sums (ddp.h's
   compress hooks), so the 16-bit sums stay in range. */
PDP_API pdp_status pdp_comm_allreduce_ex(pdp_comm *c, void *buf, int64_t count, pdp_dtype dtype,
                                         pdp_reduce_op op, pdp_work **work);
PDP_API pdp_status pdp_comm_reduce_scatter_ex(pdp_comm *c, const void *send, void *recv,
                                              int64_t recv_count, pdp_dtype dtype,
                                              pdp_reduce_op op, pdp_work **work);
/* Bytes of one element of dtype (4 or 2; 0 for an unknown value). */
PDP_API size_t pdp_dtype_size(pdp_dtype dtype);
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

/* ---- point-to-point ----
   send: count floats of buf to rank peer; recv: count floats from rank peer into buf.
   Asynchronous with a handle, as the collectives (work == NULL: synchronous). A send
   and a receive match when they name each other's rank and the same tag (0..
   PDP_COMM_TAG_MAX); messages between two ranks with one tag are received in the
   order they were sent; a rank may send to itself (local, MPI). Send and recv
   buffers must stay untouched until the handle is waited. The counts must be
   equal: a mismatch fails with PDP_ERR_INVALID naming both counts (on the
   receiver; on the local backend on both sides). A message not matched within
   timeout_s of its launch fails its wait with PDP_ERR_TIMEOUT naming the peer
   and the tag (the communicator stays usable: the unmatched message is
   withdrawn; an MPI send already under way may be cancelled). A peer whose local
   communicator is freed fails the pending messages naming it with PDP_ERR_COMM.
   Point-to-point is ordered with nothing else: collectives and messages may be
   interleaved freely (as in MPI). Handles come from the same fixed pool as the
   collectives' (nothing is allocated per message). Stats: bytes_sent counts the
   bytes sent, p2p the messages.
   NCCL (ncclSend/ncclRecv; no tags in NCCL, so each message carries a small header
   with its tag and count, checked by the receiver): posted messages go out together
   in one ncclGroupStart/End at the first wait or pdp_work_done on one of them, or
   before the next collective or split on that communicator (call pdp_work_done
   right after posting to start them early). Unlike local and MPI: messages and
   collectives share one stream, so ranks must issue them in an order that cannot
   deadlock; a self-send needs its receive posted in the same batch; a timed-out
   message aborts the communicator (NCCL cannot withdraw it), as a timed-out
   collective does. */
#define PDP_COMM_TAG_MAX 32767 /* MPI guarantees tags up to 32767 */
PDP_API pdp_status pdp_comm_send(pdp_comm *c, const float *buf, int64_t count, int peer, int tag,
                                 pdp_work **work);
PDP_API pdp_status pdp_comm_recv(pdp_comm *c, float *buf, int64_t count, int peer, int tag,
                                 pdp_work **work);

/* ---- process groups ----
   Splits c by colour and key, as MPI_Comm_split: collective over c (every rank
   calls it, in the same order as its collectives; bounded by timeout_s); the
   ranks with the same colour (>= 0) form one new communicator in *out, ranked
   by (key, rank in c). colour PDP_COMM_SPLIT_NONE (-1) takes part but joins
   nothing (*out = NULL, PDP_OK). The new communicator has the backend, device
   and timeout of c, the name "<name of c>.<colour>", its own rank numbering,
   progress thread, handle pool and stats, and is independent of c: free each
   with pdp_comm_free, in any order (a local group made by a split is freed with
   its last communicator; pdp_local_group_free stays for groups the program made).
   A rank that cannot make its new communicator (no memory) makes every rank fail:
   the others with PDP_ERR_COMM naming it, *out NULL everywhere.
   E.g. 4 ranks as 2 data-parallel x 2 model-parallel groups:
     pdp_comm_split(world, rank / 2, rank, &mp);   ranks {0,1} and {2,3}
     pdp_comm_split(world, rank % 2, rank, &dp);   ranks {0,2} and {1,3} */
#define PDP_COMM_SPLIT_NONE (-1)
PDP_API pdp_status pdp_comm_split(pdp_comm *c, int colour, int key, pdp_comm **out);

/* Completes a collective and recycles its handle (NULL is fine). The error of
   a failed collective is returned here, with its message. */
PDP_API pdp_status pdp_work_wait(pdp_work *work);
/* The same as pdp_work_wait (the short name used in the docs). */
PDP_API pdp_status pdp_wait(pdp_work *work);
/* true once the collective has completed (the handle stays valid until waited). */
PDP_API bool pdp_work_done(pdp_work *work);

/* Per-communicator counters, for learners and benchmarks. */
typedef struct pdp_comm_stats {
    int64_t collectives;   /* issued */
    int64_t bytes_sent;    /* by this rank in the bandwidth-optimal algorithm (the bytes
                              of the elements: 4 per float, 2 per BF16/F16): all-reduce
                              2(N-1)/N x bytes (the ring figure), broadcast and
                              reduce-scatter (N-1)/N x bytes, all-gather (N-1) x sent */
    double busy_s;         /* summed execution time of the waited collectives, from the
                              moment the backend starts one to its completion (queueing
                              behind earlier collectives excluded); a message's from its
                              launch to its completion */
    int64_t p2p;           /* point-to-point messages issued (sends and receives); their
                              bytes_sent is count x 4 per send */
} pdp_comm_stats;
PDP_API void pdp_comm_get_stats(const pdp_comm *c, pdp_comm_stats *out);
/* ---- end src/comm.h ---- */

/* ---- begin src/dp.h ---- */
/* dp: DataParallel, torch.nn.DataParallel in one process: one host thread per
   device, parameter-server style.

   Every step runs six stages on the master (the model you wrap, device 0):
     replicate      master parameters -> each replica
     scatter        the batch split along dimension 0 -> one shard per replica
     parallel apply forward, loss and backward on every replica at once
     gather         outputs and loss sums -> the master
     reduce         replica gradients summed into the master's, fixed order
     step           the optimizer updates the master's parameters (with 2+ workers
                    on the CPU, each worker updates the slice it has just reduced:
                    the same bits, no core waits; the step's time is then in reduce)
   All the traffic goes through the master, which also holds the optimizer state
   and the gathered outputs: the "DP overloads device 0" effect that the
   literature contrasts with DDP's all-reduce, measured by pdp_dp_get_stats.

   Replica 0 is the master itself; replicas 1..N-1 are clones. On the CPU they
   read the master's parameter memory (replicate copies nothing, but stays a
   stage you can time) unless copy_params asks for real copies. On GPUs
   (PDP_CUDA) each replica owns its parameters on its device and every stage
   moves real bytes: peer copies from and to device 0, one host thread per
   replica (the calling thread drives replica 0); several replicas may share a
   GPU. Shards are balanced: sizes differ by at most one and replica i gets the
   samples before replica i + 1's; with more workers than samples the extra
   workers sit idle for that step. Results
   equal one device on the same global batch to float rounding (bit for bit
   with one worker). */

typedef struct pdp_dp pdp_dp;

#define PDP_DP_MAX_WORKERS 256

typedef struct pdp_dp_desc {
    int num_workers;          /* replicas, one thread each (replica 0's is the calling
                                 thread); 0 = one per online core;
                                 negative or > PDP_DP_MAX_WORKERS is an error */
    const pdp_device *devices;/* num_workers devices (num_workers must then be > 0),
                                 devices[0] = the master's; NULL = all CPU. All CPU or all
                                 CUDA (a device may repeat); CUDA needs PDP_CUDA, else
                                 PDP_ERR_UNSUPPORTED */
    int threads_per_worker;   /* intra-op threads of each worker; default 1 (the intra-op
                                 pool is one per process: workers that ask for more at the
                                 same moment take turns, results unchanged) */
    bool copy_params;         /* CPU: give each replica its own parameter copy, refreshed by
                                 replicate every step (what GPUs always do); default false:
                                 replicas read the master's memory */
    bool reduce_on_master;    /* run the whole reduce on the master's thread, as
                                 torch.nn.DataParallel does on device 0; default false:
                                 each worker sums one slice (same result, bit for bit) */
} pdp_dp_desc;

/* Wraps master (which stays owned by the caller and must outlive dp) and starts
   workers 1..N-1. Layers must not be added to master afterwards. A pdp_dp is used
   by one calling thread at a time; between steps the caller may use the master
   as any model (evaluate it, save it). */
PDP_API pdp_status pdp_dp_create(pdp_dp **out, pdp_model *master, const pdp_dp_desc *desc);
/* Stops and joins the workers, frees the replicas (never the master). NULL is fine. */
PDP_API void pdp_dp_free(pdp_dp *dp);
PDP_API int pdp_dp_num_workers(const pdp_dp *dp);

/* One training step for classification on the global batch x [B, ...] with B
   labels in host memory (x on the master's device, or on the host for a GPU
   master): zero the master's gradients, replicate, scatter, parallel apply
   (softmax cross-entropy, mean over the global batch), gather, reduce, then
   pdp_optim_step(opt) on the master (opt must have been created on the master).
   *loss (may be NULL) gets the global mean loss. The gradients stay readable
   until the next step. An error inside a worker comes back naming it:
   "pdp_dp_step: worker 2: pdp_model_forward: layer 0 (Linear) expects ...". */
PDP_API pdp_status pdp_dp_step(pdp_dp *dp, pdp_optim *opt, const pdp_tensor *x,
                               const int32_t *labels, float *loss);
/* The same without zeroing and without the optimizer step: the master's
   gradients accumulate (+=) the global-batch gradient, as a PyTorch backward
   through DataParallel does. */
PDP_API pdp_status pdp_dp_forward_backward(pdp_dp *dp, const pdp_tensor *x, const int32_t *labels,
                                           float *loss);
/* An own loss (MSE, a hand-written one): DP runs the loss inside its workers and
   offers softmax cross-entropy only. pdp_model_forward, the loss and
   pdp_model_backward on the master work as on any model, on the calling thread
   alone: correct gradients and steps (pdp_optim_step), no parallelism, nothing
   to synchronise, since the replicas take the master's parameters at the next
   replicate. For a data-parallel own loss use DDP (pdp_ddp_backward). */
/* The gathered outputs [B, classes] of the last step (on the master), or NULL. */
PDP_API const pdp_tensor *pdp_dp_output(const pdp_dp *dp);

/* Seconds per stage, wall clock as seen by the caller (apply and reduce include
   waking the workers). */
typedef struct pdp_dp_times {
    double replicate, scatter, apply, gather, reduce, step;
    double total;       /* the whole call, stages plus bookkeeping */
    double apply_cpu;   /* CPU seconds of the busiest worker in apply and in reduce */
    double reduce_cpu;
    double critical_cpu; /* the step's critical path in CPU seconds, what it would take if
                            every worker had a core to itself: the calling thread's CPU
                            time outside apply and reduce (the other stages, bookkeeping)
                            plus apply_cpu and reduce_cpu */
} pdp_dp_times;

/* What a learner reads after a step. Bytes are device-to-device traffic as the
   algorithm moves it (master to itself does not count); with CPU replicas that
   share the master's parameters the replicate bytes are read in place, not
   copied (params_shared says so). */
typedef struct pdp_dp_stats {
    int num_workers;
    int active_workers;       /* last step: workers with at least one sample */
    int64_t steps;            /* pdp_dp_step and pdp_dp_forward_backward calls that succeeded */
    int64_t batch;            /* last global batch */
    bool params_shared;
    size_t replicate_bytes;   /* last step: parameters, master -> replicas */
    size_t scatter_bytes;     /* last step: inputs and labels, master -> replicas */
    size_t gather_bytes;      /* last step: outputs and loss sums, replicas -> master */
    size_t reduce_bytes;      /* last step: gradients, replicas -> master */
    size_t bytes_from_master; /* replicate + scatter */
    size_t bytes_to_master;   /* gather + reduce */
    pdp_dp_times last;        /* last step */
    pdp_dp_times sum;         /* all steps so far; divide by steps for a mean */
    double apply_worker_min;  /* last step: fastest and slowest worker's own apply time */
    double apply_worker_max;
    size_t master_bytes;      /* peak memory on the master's device: its parameters,
                                 gradients, activations, loss gradient, the gathered
                                 outputs and the optimizer state */
    size_t replica_bytes;     /* peak memory on the largest other replica's device */
} pdp_dp_stats;

PDP_API pdp_status pdp_dp_get_stats(const pdp_dp *dp, pdp_dp_stats *out);
/* A few human-readable lines (stage times in ms, bytes, memory) into buf;
   returns the length snprintf would have written. */
PDP_API int pdp_dp_stats_format(const pdp_dp_stats *s, char *buf, size_t bytes);
/* ---- end src/dp.h ---- */

/* ---- begin src/ddp.h ---- */
/* ddp: DistributedDataParallel, torch.nn.parallel.DistributedDataParallel in C,
   and the DistributedSampler that feeds it.

   Every rank holds a full replica of the model and runs forward and backward
   on its own shard of the global batch; there is no master. At construction
   the ranks check that they have the same parameter names and shapes and take
   rank 0's parameter values. During backward the gradients are all-reduced in
   buckets while backward is still running:

     - a bucket is a contiguous range of the model's flat gradient block (the
       gradients ARE the bucket memory: no copy in, no copy out);
     - buckets fill in reverse registration order (the order backward produces
       gradients), each closed once it holds at least bucket_cap_mb (the first
       one: first_bucket_mb), as PyTorch's Reducer does;
     - when backward reports a bucket's last gradient, that bucket's all-reduce
       (average over ranks) starts at once on the communicator, and backward
       goes on with the layers before it;
     - pdp_ddp_finish (called by pdp_ddp_step) waits for every bucket; the time
       it waits is the communication backward could not hide.

   With N ranks each computing the mean loss of B/N samples, the averaged
   gradients are those of the mean loss over the global batch B: DDP training
   equals single-device training on the global batch, to float rounding, and
   every rank holds bit-identical parameters.

   Gradient accumulation (no_sync): while no_sync is on, backward only adds to
   the local gradients; the next backward with no_sync off all-reduces the
   accumulated sums. As in PyTorch, k accumulated backward passes of mean losses
   give the sum of k mean gradients: the same as k backward passes on a single
   device (divide the learning rate by k, or scale the loss, for the mean).

   Faults never hang: a rank that stops issuing collectives makes the others
   fail with PDP_ERR_TIMEOUT within the communicator's timeout, naming the
   bucket, the collective and the missing rank; a rank that fails and frees its
   communicator makes the others fail at once.

   Any loss: every backward of the wrapped model synchronises, however its
   output gradient was computed. pdp_ddp_forward_backward is the built-in
   cross-entropy; for an own loss run pdp_ddp_forward (or pdp_model_forward),
   compute the loss and its gradient dy with respect to the output (the mean
   over this rank's samples, as the built-in losses do, so that the average
   over ranks is the global batch's), then pdp_ddp_backward(ddp, dy) (or
   pdp_model_backward): the buckets are reduced the same way. A second backward
   before pdp_ddp_step/pdp_ddp_finish fails with PDP_ERR_STATE saying so.

   Typical step (each rank, on its own thread or process):
       pdp_ddp_forward_backward(ddp, x_shard, labels_shard, &loss);
       pdp_ddp_step(ddp, opt);          wait for the buckets, update, zero grads
   or, with an own loss:
       pdp_ddp_forward(ddp, x_shard, &y);  my_loss(y, target, &loss, &dy);
       pdp_ddp_backward(ddp, &dy);  pdp_ddp_step(ddp, opt); */

typedef struct pdp_ddp pdp_ddp;

typedef struct pdp_ddp_desc {
    double bucket_cap_mb;    /* bucket capacity in MiB (2^20 bytes); default 25 */
    double first_bucket_mb;  /* capacity of the first bucket in MiB (the last layers'
                                gradients, ready first); default min(1, bucket_cap_mb) */
} pdp_ddp_desc;

/* Wraps m (which stays owned by the caller, must outlive ddp and gets no new
   layers) and c (the same). Collective: every rank of c must call it. Checks
   that every rank has the same parameter names and shapes (a mismatch fails on
   every rank with PDP_ERR_INVALID naming the first differing parameter), then
   copies rank 0's parameters to every rank, zeroes the gradients and installs
   the gradient hook on m. PDP_TRACE=out.json traces the ranks (see trace). */
PDP_API pdp_status pdp_ddp_create(pdp_ddp **out, pdp_model *m, pdp_comm *c,
                                  const pdp_ddp_desc *desc);
/* Waits for buckets still in flight, removes the hook. NULL is fine. */
PDP_API void pdp_ddp_free(pdp_ddp *ddp);

/* Forward, softmax cross-entropy (mean over this rank's batch) and backward on
   this rank's shard; buckets are all-reduced as their gradients become ready.
   Gradients accumulate (+=). A synchronised backward must be finished
   (pdp_ddp_step or pdp_ddp_finish) before the next one. */
PDP_API pdp_status pdp_ddp_forward_backward(pdp_ddp *ddp, const pdp_tensor *x,
                                            const int32_t *labels, float *loss);
/* An own loss: forward on this rank's shard; *y is the model's output tensor
   (valid until the next forward). Then compute dy = dloss/dy (same shape, on the
   model's device) and call pdp_ddp_backward. */
PDP_API pdp_status pdp_ddp_forward(pdp_ddp *ddp, const pdp_tensor *x, const pdp_tensor **y);
/* Backward from dy; buckets are all-reduced as their gradients become ready,
   exactly as in pdp_ddp_forward_backward (pdp_model_backward on the wrapped
   model does the same; this entry adds the timing to the stats). */
PDP_API pdp_status pdp_ddp_backward(pdp_ddp *ddp, const pdp_tensor *dy);
/* Waits for every bucket of the last synchronised backward: the model's
   gradients are then the average over ranks. PDP_ERR_STATE when the last
   backward ran under no_sync. OK and nothing to do when nothing is pending. */
PDP_API pdp_status pdp_ddp_finish(pdp_ddp *ddp);
/* pdp_ddp_finish, then pdp_optim_step(opt), then zeroes the gradients. */
PDP_API pdp_status pdp_ddp_step(pdp_ddp *ddp, pdp_optim *opt);
/* true: later backward passes only accumulate locally (PyTorch's no_sync()). */
PDP_API void pdp_ddp_set_no_sync(pdp_ddp *ddp, bool no_sync);

PDP_API pdp_model *pdp_ddp_model(const pdp_ddp *ddp);
PDP_API pdp_comm *pdp_ddp_comm(const pdp_ddp *ddp);

/* ---- buckets ---- */

typedef struct pdp_ddp_bucket {
    int first_param, last_param;  /* registry indices: the bucket holds first..last */
    int64_t offset;               /* floats into the flat gradient block */
    int64_t count;                /* floats */
} pdp_ddp_bucket;

PDP_API int pdp_ddp_num_buckets(const pdp_ddp *ddp);
/* Bucket b (0 = the first to be reduced: the last parameters). */
PDP_API pdp_status pdp_ddp_bucket_info(const pdp_ddp *ddp, int b, pdp_ddp_bucket *out);

/* ---- communication hooks ----
   PyTorch's register_comm_hook in C: a hook replaces the collective of every
   bucket. Once per bucket per synchronised backward, on the thread running
   backward, as soon as the bucket is ready, the reducer calls
       launch(state, c, b, &work)
   which must start a collective (on c, or on a communicator of its own with the
   same ranks) that leaves the AVERAGE over ranks of the bucket's gradients where
   the built-in collective would: DDP all-reduces b->grad (b->count floats) in
   place; ZeRO (pdp_zero_register_comm_hook, zero.h) reduce-scatters b->grad
   (world_size x recv_count floats, its padded unit) so that this rank's slice
   lands in b->recv. launch may transform the bucket first (compress it into
   b->scratch, scale it) and returns the collective's handle in *work (NULL when
   it completed the work itself); every rank must issue the same collectives in
   the same order, as always. After the handle has been waited (pdp_ddp_finish /
   pdp_zero_finish, or ZeRO reusing a bucket buffer), the reducer calls
       finish(state, b)
   (optional) to turn the result into the gradients (decompress b->scratch into
   b->grad, or b->recv). b is the same view for both calls and stays valid until
   finish returns. A launch or finish that fails (returns a status other than
   PDP_OK; its message is whatever pdp_last_error() holds then, e.g. that of the
   pdp call that failed inside it) makes pdp_ddp_finish fail with that status,
   naming the bucket ("bucket 1 of 3 (...): comm hook launch: ..."); the
   other ranks then fail at that bucket's collective (timeout, or at once when the
   failing rank frees its communicator), as with any rank that skips one.
   Gradients are fp32 before launch and after finish; what travels is the hook's.

   scratch_bytes_per_float: device memory the hook needs per gradient float of a
   bucket (2 for 16-bit compression). The reducer allocates it ONCE, at
   registration (DDP: parameter count x that many bytes; ZeRO stage 1 the padded
   count, stages 2-3 grad_buffers x the largest padded unit), and gives every
   bucket its own piece (b->scratch), which no other bucket in flight shares.
   Register before the first backward (PDP_ERR_STATE after it, and for a second
   hook); a NULL hook or launch is PDP_ERR_INVALID. The hook cannot be removed.

   Built-ins (PyTorch's bf16_compress_hook and fp16_compress_hook):
   pdp_ddp_hook_bf16_compress() and pdp_ddp_hook_fp16_compress(). launch divides
   every gradient by N and rounds it to bf16 / fp16 (nearest even) in the
   bucket's scratch (a kernel on a CUDA model), then sums the 16-bit values
   (pdp_comm_allreduce_ex / pdp_comm_reduce_scatter_ex, SUM: the division comes
   first, as PyTorch's hooks divide before the sum, so the sum stays in range);
   finish widens the result into the fp32 gradients. bytes_sent is exactly half
   the fp32 figure. Error per gradient element, with u the unit roundoff (bf16
   2^-8, fp16 2^-11) and g_r rank r's gradient: |avg' - avg| <= u (2 + u)
   sum_r |g_r| / N on the local backend (one rounding per input, one for the
   sum), plus, for fp16, 2^-25 (N + 1) from subnormals; on MPI and NCCL the sum
   rounds N - 1 times (comm.h), so the factor 2 becomes N. fp16 overflows to Inf
   above 65504 x N per gradient (no loss scaling here): prefer bf16. */

typedef struct pdp_comm_hook_bucket {
    int index, nbuckets;     /* this bucket (ZeRO: unit), 0 = the first reduced */
    float *grad;             /* what the collective reduces, on `device`: DDP the bucket's
                                range of the gradient block, ZeRO the unit's padded buffer */
    int64_t count;           /* floats at grad */
    int64_t offset;          /* the bucket's first float in the model's flat block */
    pdp_device device;
    int rank, world_size;
    bool reduce_scatter;     /* false: all-reduce grad in place (DDP); true: reduce-scatter
                                grad, this rank's averaged slice into recv (ZeRO) */
    float *recv;             /* reduce_scatter: recv_count floats (grad + rank x recv_count);
                                NULL for an all-reduce */
    int64_t recv_count;
    void *scratch;           /* scratch_bytes_per_float x count bytes on device, this
                                bucket's own; NULL when the hook asked for none */
} pdp_comm_hook_bucket;

typedef struct pdp_ddp_comm_hook {
    pdp_status (*launch)(void *state, pdp_comm *c, const pdp_comm_hook_bucket *b,
                         pdp_work **work);                        /* required */
    pdp_status (*finish)(void *state, const pdp_comm_hook_bucket *b); /* NULL: nothing */
    void *state;                     /* passed to both; owned by the caller */
    int scratch_bytes_per_float;     /* 0..64; default 0 (no scratch) */
} pdp_ddp_comm_hook;

/* Not collective, but every rank must register the same hook (the same
   collectives). The struct is copied. */
PDP_API pdp_status pdp_ddp_register_comm_hook(pdp_ddp *ddp, const pdp_ddp_comm_hook *hook);
PDP_API pdp_ddp_comm_hook pdp_ddp_hook_bf16_compress(void);
PDP_API pdp_ddp_comm_hook pdp_ddp_hook_fp16_compress(void);

/* ---- statistics ---- */

typedef struct pdp_ddp_stats {
    int64_t steps;             /* synchronised backward passes finished */
    int64_t buckets;           /* buckets per synchronised backward */
    int64_t grad_bytes;        /* bytes of gradients all-reduced per step */
    /* the last finished step */
    int64_t bytes_sent;        /* by this rank (the ring figure: 2(N-1)/N x grad_bytes; half
                                  of it with a 16-bit compression hook) */
    double backward_s;         /* forward + loss + backward, launches included */
    double allreduce_s;        /* execution time of this step's bucket all-reduces, from the
                                  moment the backend starts each (waiting for slower ranks
                                  included) to its completion; queueing excluded */
    double wait_s;             /* time pdp_ddp_finish waited: communication left exposed */
    double hidden_share;       /* 1 - wait_s / allreduce_s, in [0, 1] (1 with nothing to do) */
    int64_t launched_in_backward; /* buckets launched while backward still ran (the others
                                     launch at its end: those of unused parameters) */
    /* sums over all finished steps */
    int64_t total_bytes_sent;
    double total_backward_s, total_allreduce_s, total_wait_s;
} pdp_ddp_stats;

PDP_API void pdp_ddp_get_stats(const pdp_ddp *ddp, pdp_ddp_stats *out);
PDP_API void pdp_ddp_reset_stats(pdp_ddp *ddp);

/* ---- DistributedSampler ----
   Each rank's share of an epoch, as torch.utils.data.DistributedSampler: the
   epoch's order is pdp_permutation(seed, epoch) (or 0..n-1 without shuffle);
   when n is not a multiple of the world size it is padded by repeating its
   first indices (default) or cut to a multiple (drop_last); rank r takes the
   entries r, r + N, r + 2N, ... The shards of one epoch are disjoint (up to the
   padding) and cover the dataset; every rank with the same seed and epoch
   computes the same permutation, so no communication is needed. */

typedef struct pdp_dist_sampler pdp_dist_sampler;

typedef struct pdp_dist_sampler_desc {
    int64_t dataset_size;  /* samples; required, >= 1 */
    int world_size;        /* ranks; default 1 */
    int rank;              /* this rank, 0..world_size-1; default 0 */
    uint64_t seed;         /* the same on every rank; default 0 */
    bool no_shuffle;       /* default false: shuffled (PyTorch's shuffle=True) */
    bool drop_last;        /* default false: pad by repeating indices */
} pdp_dist_sampler_desc;

PDP_API pdp_status pdp_dist_sampler_create(pdp_dist_sampler **out,
                                           const pdp_dist_sampler_desc *desc);
PDP_API void pdp_dist_sampler_free(pdp_dist_sampler *s);
/* Reshuffles: the indices become epoch `epoch`'s (as set_epoch in PyTorch). */
PDP_API void pdp_dist_sampler_set_epoch(pdp_dist_sampler *s, uint64_t epoch);
/* This rank's samples per epoch: ceil(n / N), or floor(n / N) with drop_last. */
PDP_API int64_t pdp_dist_sampler_num_samples(const pdp_dist_sampler *s);
/* This rank's dataset indices for the current epoch (*count may be NULL), valid
   until the next set_epoch or free; feed them to pdp_batcher_desc.indices. */
PDP_API const int64_t *pdp_dist_sampler_indices(const pdp_dist_sampler *s, int64_t *count);
/* ---- end src/ddp.h ---- */

/* ---- begin src/tp.h ---- */
/* tp: tensor parallelism, Megatron-LM's MLP block (Shoeybi et al., "Megatron-LM:
   Training Multi-Billion Parameter Language Models Using Model Parallelism", 2019,
   section 3): one layer's matrices split across the ranks of a TP communicator.

   The block is five layers of the usual model, each a named, visible step:

       f       CopyToModelParallelRegion      forward: identity (the input is replicated)
                                              backward: all-reduce (sum) of the input gradient
       A       ColumnParallelLinear(H)        weight split by output features: rank r holds
                                              rows [lo_r, lo_r + n_r) of W1 [H, in] and of b1;
                                              output sharded: [B, n_r]
       act     ReLU, GELU, Tanh or Sigmoid    element-wise, on the shard
       B       RowParallelLinear(d)           weight split by input features: rank r holds
                                              columns [lo_r, lo_r + n_r) of W2 [d, H]; output
                                              x_r W2_r^T, a partial sum; the bias (whole on
                                              every rank) is added on TP rank 0 only, so once
       g       ReduceFromModelParallelRegion  forward: all-reduce (sum) of the partial sums
                                              backward: identity

   f and g are conjugate: each is the other's transpose. After g every rank holds the
   same output bits (the communicator reduces in a fixed order), so the layers after the
   block, the loss and the output gradient are replicated, and so is b2's gradient. Per
   block and step the ranks exchange one all-reduce of B x d floats forward (g) and one of
   B x in floats backward (f; none when f is the model's first layer, whose input needs
   no gradient): with the ring algorithm each rank sends 2(N-1)/N of those bytes.

   Splits: n_r = H / N, plus one for the first H % N ranks (pdp_tp_split), so widths
   that do not divide work. Initialisation: each rank draws the whole weight from the
   model's seed, as a plain Linear(H) and Linear(d) would, and keeps its slice, so a TP
   model starts with exactly the single-device model's values; with the same batches
   it trains to the same parameters up to float rounding (the partial sums are added in
   another order). State_dict names: f and g are functions in Megatron-LM, not modules,
   so they are not numbered: f, Linear, ReLU, Linear, g is named as nn.Sequential(
   Linear, ReLU, Linear), "0.weight", "0.bias", "2.weight", "2.bias", on every rank
   (each holding its slice under the full tensor's name).

   Use: every rank of the TP communicator builds the same model, calling
   pdp_model_set_tp before its first TP layer. The usual optimizer, DDP and the loss work
   unchanged: a TP model is a model whose parameters are this rank's slices. 2-D
   parallel: split a world of D x T ranks into TP groups (pdp_comm_split(world, rank / T,
   rank, &tp)) and DP groups (pdp_comm_split(world, rank % T, rank, &dp)), build the TP
   model on tp and wrap it in pdp_ddp_create(..., dp, ...): DDP averages each slice's
   gradient over the ranks holding the same slice.

   Checkpoints: pdp_tp_checkpoint_save gathers the full tensors (and the optimizer's
   state) and writes one ordinary checkpoint, the file pdp_checkpoint_save writes for
   the single-device model (loadable by pdp_checkpoint_load on one device and by
   PyTorch); pdp_tp_checkpoint_load reads such a file into any TP layout. Both are
   collective over the TP communicator. pdp_checkpoint_save/load refuse a model with TP
   layers (PDP_ERR_STATE naming pdp_tp_checkpoint_save/load): its parameters are slices.
   DataParallel's thread replicas refuse it too (PDP_ERR_UNSUPPORTED).

   Backends: local (thread ranks), MPI (processes) and NCCL (a GPU per rank: thread
   ranks from pdp_nccl_group_create, or processes from pdp_comm_init_env), with the
   same results: TP over 2-4 GPUs equals the single-device model, CPU or GPU (tested
   on the CUDA emulation, tests/test_cuda.c). What NCCL changes: f and g are
   all-reduces on the communicator's own stream, launched after the compute stream's
   work and waited by the host before the next layer, so nothing overlaps them and
   pdp_tp_stats.allreduce_s includes the GPU finishing the layers before g (and
   waiting for the slowest rank); a rank that never arrives times out
   (PDP_ERR_TIMEOUT) and leaves the NCCL communicator aborted, every later call on it
   failing, where local and MPI stay usable. In 2-D, the TP and DP communicators are
   separate NCCL communicators (pdp_comm_split), each with its stream: every rank must
   issue their collectives in the same order, as the same model on every rank does.
   The full-tensor checkpoints gather and scatter on the GPU (the staging model lives
   on the model's device).

   Limits: the TP kinds run on the CPU and on CUDA (f and g are the communicator's
   all-reduce on the device's buffers); no Dropout inside the block (its masks are
   keyed by the element's index in the slice); a DP replica (dp.c) of a TP model is not
   supported. */

/* Megatron's split: rank r of size holds [*lo, *lo + *count) of full features; the first
   full % size ranks hold one more. */
PDP_API void pdp_tp_split(int64_t full, int rank, int size, int64_t *lo, int64_t *count);

/* Attaches the TP communicator (owned by the caller, outliving m) to m; before the first
   TP layer (afterwards: PDP_ERR_STATE). Its device must be the model's. */
PDP_API pdp_status pdp_model_set_tp(pdp_model *m, pdp_comm *tp);
PDP_API pdp_comm *pdp_model_tp(const pdp_model *m); /* NULL when none */

/* The block's layers, appended as the other pdp_model_add_* (errors name the function and
   the layer). Each needs the TP communicator. column_parallel_linear must follow f;
   row_parallel_linear must follow a column_parallel_linear with only element-wise
   activations between (its input is that layer's slice); tp_reduce must follow a
   row_parallel_linear. out_features are the full (unsplit) widths. */
PDP_API pdp_status pdp_model_add_tp_copy(pdp_model *m);   /* f */
PDP_API pdp_status pdp_model_add_column_parallel_linear(pdp_model *m, int64_t out_features);
PDP_API pdp_status pdp_model_add_row_parallel_linear(pdp_model *m, int64_t out_features);
PDP_API pdp_status pdp_model_add_tp_reduce(pdp_model *m); /* g */

/* What the TP layers exchanged since the model's creation or the last reset. */
typedef struct pdp_tp_stats {
    int64_t forward_allreduces;   /* g's */
    int64_t backward_allreduces;  /* f's */
    int64_t forward_bytes;        /* payload of g's all-reduces: batch x width x 4 each */
    int64_t backward_bytes;       /* payload of f's */
    int64_t bytes_sent;           /* by this rank, the ring figure 2(N-1)/N x payload */
    double allreduce_s;           /* time in them (synchronous: compute waits for them) */
} pdp_tp_stats;
PDP_API void pdp_tp_get_stats(const pdp_model *m, pdp_tp_stats *out);
PDP_API void pdp_tp_reset_stats(pdp_model *m);

/* Collective over m's TP communicator (every rank calls it). Save: the full tensors
   (and, with o, the optimizer's full state) gathered, then written by TP rank 0 to path
   as pdp_checkpoint_save writes the single-device model; every rank returns rank 0's
   status. Load: every rank reads path (a checkpoint of the single-device model, as
   pdp_checkpoint_load reads it, into a staging copy of the full model) and keeps its
   slices; when any rank fails, all fail and nothing is changed. o: an optimizer of m
   (pdp_optim_create), or NULL. Errors as pdp_checkpoint_save/load's, and
   PDP_ERR_STATE for a model without a TP communicator. */
PDP_API pdp_status pdp_tp_checkpoint_save(const char *path, const pdp_model *m,
                                          const pdp_optim *o);
PDP_API pdp_status pdp_tp_checkpoint_load(const char *path, pdp_model *m, pdp_optim *o);
/* ---- end src/tp.h ---- */

/* ---- begin src/zero.h ---- */
/* zero: sharded data parallelism, ZeRO stages 1, 2 and 3 (DeepSpeed's ZeRO,
   PyTorch's ZeroRedundancyOptimizer and FSDP FULL_SHARD), with DDP's step shape.

   Each rank trains on its shard of the global batch, as in DDP, but holds only a
   1/N part of what DDP replicates:
     stage 1 (P_os)         optimizer state (Adam's m and v, SGD's momentum);
     stage 2 (P_os+g)       and the reduced gradients;
     stage 3 (P_os+g+p)     and the parameters.
   After k steps the parameters are those of DDP and of one device on the
   global batch (to float rounding), at DDP's communication volume (stages 1-2:
   a reduce-scatter plus an all-gather is one all-reduce) or 1.5x it (stage 3).

   Sharding per unit. A unit is a bucket of whole layers, planned as DDP plans
   its buckets (reverse layer order, closed at bucket_cap_mb; the first at
   first_bucket_mb), the same units for every stage. Unit u of count_u floats is
   padded to N * s_u, s_u = ceil(count_u / N) rounded up to 16 floats, and rank r
   owns slice r, elements [r s_u, (r + 1) s_u) of the unit; the rank's shard is
   the concatenation of its slices in flat-block order. Why per unit and not one
   global contiguous range per rank: a reduce-scatter needs each rank's slice to
   be an equal, contiguous piece of its send buffer, so one global partition
   cannot give one reduce-scatter per bucket while buckets overlap backward;
   per unit it does, with exact balance (the shards differ by nothing: padding is
   zeros), and with one unit it is exactly llm.c's ZeRO-1 partition of the flat
   block. PyTorch's ZeroRedundancyOptimizer instead hands whole parameters to
   ranks greedily (largest first, to the least loaded rank): no padding, but the
   balance is only as good as the parameter sizes allow, and it reduces with a
   full all-reduce (no gradient sharding). The padding costs at most 16 N floats
   per unit and is counted in every figure (pdp_zero_memory: padded_count).

   Where things live (fp32, Psi = parameters, Psi_pad = sum of N s_u):
     stage 1: parameters in the model's block (4 Psi); gradients in per-unit
              padded buffers (4 Psi_pad), which backward writes through the
              model's executor seam; each unit's buffer is reduce-scattered in
              place (average) as soon as backward has produced it, and rank r
              steps its slices; the model's own gradient block is freed;
     stage 2: the same, but backward writes into a bounded set of bucket
              buffers (grad_buffers of them, each N s_max floats), reused
              round-robin once their reduce-scatter has completed and its slice
              has been added to the rank's gradient shard (4 Psi_pad / N);
     stage 3: as stage 2, and the parameters are the rank's parameter shard
              (4 Psi_pad / N); the model's parameter block is freed. Before a
              unit's forward and again before its backward its parameters are
              all-gathered into one of param_buffers reusable buffers (N s_max
              floats each, the cap on live gathered bytes) while the next unit's
              gather is already in flight (prefetch); a buffer is released when
              a later unit needs it (all at the start of backward and after a
              step: FSDP's reshard after forward).
   Optimizer state: a shard optimizer (pdp_zero_optim_create), nstate x 4 Psi_pad
   / N bytes, stepped per unit slice in place (no master copy). Stages 1 and 2
   then all-gather the updated slices into every rank's full parameters (through
   a staging buffer of N s_max floats, since the model's block is unpadded).
   Memory per rank with Adam (K = 8 state bytes per parameter), as the ZeRO paper
   counts it, plus the working buffers this implementation states:
     DDP 16 Psi; stage 1: 8 Psi + 8 Psi/N; stage 2: 4 Psi + 12 Psi/N;
     stage 3: 16 Psi/N; buffers: stage 1 one staging buffer, stage 2 staging +
     grad_buffers, stage 3 grad_buffers + param_buffers, each 4 N s_max bytes.
   pdp_zero_memory reports the measured figures beside those formulas (with
   Psi_pad where padding applies).

   Communication per rank per step (bytes counted by the communicator): stages 1
   and 2: one reduce-scatter and one all-gather of every unit, 2 (N-1)/N Psi_pad
   x 4 = DDP's all-reduce volume; stage 3: two all-gathers (forward and backward)
   and one reduce-scatter, 3 (N-1)/N Psi_pad x 4.

   Gradient accumulation: under no_sync stage 1 accumulates in its full gradient
   buffers without communicating (as DDP); stages 2 and 3 hold no full gradient,
   so every backward reduce-scatters and adds its slice to the shard (DeepSpeed's
   behaviour): the same sums, k times the gradient traffic.

   Every backward of the wrapped model synchronises, whatever the loss
   (pdp_zero_forward_backward, or pdp_zero_forward + own loss +
   pdp_zero_backward, or pdp_model_forward/pdp_model_backward on the model).
   While wrapped, read gradients with pdp_zero_grad_norm/clip only (the model's
   gradient block is gone) and, at stage 3, parameters with
   pdp_zero_gather_params. Faults never hang: a missing rank makes the
   reduce-scatter (named with its unit) or the all-gather fail with
   PDP_ERR_TIMEOUT naming the rank, within the communicator's timeout.

   Devices: a CPU model over the local or MPI backend, or a CUDA model over NCCL
   (one GPU per rank: thread ranks of pdp_nccl_group_create, or processes). Every
   shard and buffer then lives on the rank's GPU, the figures above are the same,
   and so are the checkpoints (staged through host memory as pdp_checkpoint_save
   stages a CUDA model's).

   Typical step (each rank):
       pdp_zero_forward_backward(z, x_shard, labels_shard, &loss);
       pdp_zero_step(z, opt);    wait for the reduce-scatters, step the shard, gather */

typedef struct pdp_zero pdp_zero;

typedef struct pdp_zero_desc {
    int stage;               /* 1, 2 or 3; default 1 */
    double bucket_cap_mb;    /* unit size in MiB; default 25 */
    double first_bucket_mb;  /* the first unit (the last layers); default min(1, cap) */
    int grad_buffers;        /* stages 2-3: gradient bucket buffers; default 2 */
    int param_buffers;       /* stage 3: gathered parameter buffers, >= 2; default 2 */
    bool no_prefetch;        /* stage 3: gather each unit only when it is needed (for
                                measuring what prefetch gains); default false */
} pdp_zero_desc;

/* Wraps m and c as pdp_ddp_create does (collective; same checks; rank 0's
   parameters everywhere), then shards: frees the model's gradient block (and at
   stage 3 its parameter block) and points its layers at ZeRO's buffers. A rank that
   cannot allocate its shards and buffers makes every rank fail: the others with
   PDP_ERR_COMM naming it. A failed create leaves each model whole (with rank 0's
   parameters once their broadcast has run), except at stage 3 when the failure came after
   the shards (the buffers): each model then holds its slices only, as after pdp_zero_free
   (the block is freed before the buffers are allocated, which keeps the peak of creation
   under DDP's). */
PDP_API pdp_status pdp_zero_create(pdp_zero **out, pdp_model *m, pdp_comm *c,
                                   const pdp_zero_desc *desc);
/* Waits for collectives in flight and gives the model back its gradient block
   (zeroed) and, at stage 3, a parameter block holding this rank's slices only
   (call pdp_zero_gather_params(z, NULL) first for the full values). Not
   collective. NULL is fine. */
PDP_API void pdp_zero_free(pdp_zero *z);
/* An optimizer whose state covers this rank's shard only; pdp_zero_step steps it
   (pdp_optim_step refuses it). Free it with pdp_optim_free. */
PDP_API pdp_status pdp_zero_optim_create(pdp_optim **out, pdp_zero *z,
                                         const pdp_optim_desc *desc);

PDP_API pdp_status pdp_zero_forward_backward(pdp_zero *z, const pdp_tensor *x,
                                             const int32_t *labels, float *loss);
PDP_API pdp_status pdp_zero_forward(pdp_zero *z, const pdp_tensor *x, const pdp_tensor **y);
PDP_API pdp_status pdp_zero_backward(pdp_zero *z, const pdp_tensor *dy);
/* Waits for every reduce-scatter of the last backward: the shard then holds the
   averaged gradients. PDP_ERR_STATE when stage 1's last backward ran under no_sync. */
PDP_API pdp_status pdp_zero_finish(pdp_zero *z);
/* Gradient clipping from shards (after finish, before step): the squared norm
   of the shard, all-reduced (sum); every rank scales its shard by the same
   coefficient (torch.nn.utils.clip_grad_norm_'s). Collective. */
PDP_API pdp_status pdp_zero_clip_grad_norm(pdp_zero *z, float max_norm, float *total_norm);
/* pdp_zero_finish, then the shard's update with opt (from pdp_zero_optim_create),
   zeroed gradients, and (stages 1-2) the all-gather of the updated parameters. */
PDP_API pdp_status pdp_zero_step(pdp_zero *z, pdp_optim *opt);
PDP_API void pdp_zero_set_no_sync(pdp_zero *z, bool no_sync);
/* A communication hook (ddp.h: pdp_ddp_comm_hook, e.g. pdp_ddp_hook_bf16_compress())
   in place of every unit's reduce-scatter (every stage: a reduce-scatter of the
   unit's padded buffer, b->reduce_scatter true). Before the first backward, as
   pdp_ddp_register_comm_hook. Its scratch adds scratch_bytes_per_float x
   Psi_pad bytes at stage 1 and x grad_buffers N s_max at stages 2-3 (not counted
   in pdp_zero_memory). bytes_sent counts the hook's traffic: with a 16-bit hook
   the reduce-scatters halve, the all-gathers stay fp32. */
PDP_API pdp_status pdp_zero_register_comm_hook(pdp_zero *z, const pdp_ddp_comm_hook *hook);
/* The full parameters (param_count floats, flat-block order) into dst (host
   memory, for a CUDA model too), or into the model's parameter block when dst is
   NULL (on its device; stage 3: allocated if absent, valid until the next step).
   Collective at stage 3. */
PDP_API pdp_status pdp_zero_gather_params(pdp_zero *z, float *dst);

PDP_API pdp_model *pdp_zero_model(const pdp_zero *z);
PDP_API int pdp_zero_stage(const pdp_zero *z);
PDP_API int pdp_zero_num_units(const pdp_zero *z);

/* Checkpoints (at a step boundary, after pdp_zero_step; all collective). A set
   under prefix P is one shard file per rank, "P.rank<r>.safetensors" (the
   rank's parameter slices and optimizer state in its shard layout: checkpoint.c's
   shard file of the range [r S, (r + 1) S) of the N S floats of all shards in
   rank order, S = shard_count, so its metadata names the rank, the world size
   and the step), and the marker "P.done", which rank 0 writes only after every
   rank's file is on disk (removing the old marker first: a set with a marker is
   complete, as in llm.c). The marker holds the world size, stage, step and unit
   plan. Load validates the marker against this run (world size, parameter
   count, units) and every rank's file (range, step, tensors, checksums) into
   staging buffers; only when every rank succeeded is anything copied, so a bad
   set fails on every rank with a message naming the marker or the bad file, the
   parameters and optimizer untouched. Resume at the same world size is
   bit-exact; the stage may differ (the layout is the same). Every save
   overwrites the set of its prefix (put the step in the prefix to keep several). */
PDP_API pdp_status pdp_zero_checkpoint_save(pdp_zero *z, const pdp_optim *opt, const char *prefix);
PDP_API pdp_status pdp_zero_checkpoint_load(pdp_zero *z, pdp_optim *opt, const char *prefix);
/* One full checkpoint (pdp_checkpoint_save's file: state_dict names, PyTorch
   reads it) of the parameters and the optimizer state, written by rank 0 after
   all-gathering them (rank 0 holds a full optimizer state while it writes). */
PDP_API pdp_status pdp_zero_checkpoint_consolidate(pdp_zero *z, const pdp_optim *opt,
                                                   const char *path);
/* Loads a full checkpoint (pdp_checkpoint_save's or consolidate's, any world
   size) into this run: each rank reads its slices (re-sharding), validated on
   every rank before anything is copied, as above. */
PDP_API pdp_status pdp_zero_checkpoint_load_full(pdp_zero *z, pdp_optim *opt, const char *path);

typedef struct pdp_zero_memory {
    int64_t param_count;     /* Psi */
    int64_t padded_count;    /* Psi_pad = sum over units of N s_u */
    int64_t shard_count;     /* Psi_pad / N: this rank's slices */
    int state_per_param;     /* optimizer state floats per parameter (Adam 2, momentum 1) */
    /* measured: bytes this rank holds */
    int64_t param_bytes, grad_bytes, optim_bytes;
    int64_t buffer_bytes;    /* working buffers (staging, bucket and gather buffers) */
    int64_t total_bytes;
    /* the ZeRO paper's formula for this stage with Psi (DDP's beside it), and the
       stated bound on buffer_bytes */
    double formula_bytes, ddp_bytes;
    int64_t buffer_bound;
} pdp_zero_memory;

/* opt may be NULL (no optimizer state counted). */
PDP_API void pdp_zero_get_memory(const pdp_zero *z, const pdp_optim *opt, pdp_zero_memory *out);

typedef struct pdp_zero_stats {
    int64_t steps;             /* synchronised backward passes finished */
    int64_t units;
    int64_t bytes_sent;        /* the last step, by this rank: backward + step */
    int64_t formula_bytes;     /* 2 (N-1)/N Psi_pad 4 (stages 1-2), 3 (N-1)/N Psi_pad 4 (3) */
    int64_t gathers;           /* all-gathers of the last step */
    double backward_s, reduce_s, wait_s;
    int64_t total_bytes_sent;
} pdp_zero_stats;

PDP_API void pdp_zero_get_stats(const pdp_zero *z, pdp_zero_stats *out);
/* ---- end src/zero.h ---- */

/* ---- begin src/pp.h ---- */
/* pp: pipeline parallelism. A sequential model split into p stages of consecutive
   layers, one stage per rank of a communicator; each global batch is cut into m
   micro-batches that flow through the stages: activations are sent forward to the
   next stage and their gradients back to the previous one with pdp_comm_send /
   pdp_comm_recv.

   Design:
     - every rank builds the same full model (same layers, same seed) and passes it
       to pdp_pp_create, which keeps only its stage's layers in a model of its own
       (pdp_pp_model) with the full model's parameter values and names ("4.weight"
       stays "4.weight"), so a pipeline starts equal to the single-device model and
       a stage's parameters are found in it by name. The full model stays the
       caller's and is not used again (free it);
     - stage boundaries are given (first_layer[s]) or balanced: by parameter count
       (default) or by time measured on rank 0 (forward + backward per layer), as a
       contiguous split minimising the largest stage; every rank checks that it got
       the same split as rank 0;
     - a schedule is an explicit list of actions (F j: forward of micro-batch j,
       B j: its backward) per stage, printed by pdp_pp_schedule_str:
         GPipe  all forwards, then all backwards: F0 F1 .. F(m-1) B0 .. B(m-1);
         1F1B   (PipeDream-Flush) w = min(p - 1 - s, m) warm-up forwards on stage s,
                then one forward and one backward alternately, then the remaining
                backwards: stage s never holds more than min(p - s, m) micro-batches;
     - a stage keeps one set of activations per micro-batch it may hold at once
       (GPipe m, 1F1B min(p - s, m)): the model's activation slots. Sends are
       asynchronous (a stage computes while they are in flight); the receive for the
       next action is posted before the current action computes;
     - the loss is computed on the last stage: softmax cross-entropy against labels,
       or the caller's loss function. Micro-batch j of n_j samples out of B has its
       loss gradient scaled by 1/B (not 1/n_j), so the gradients accumulated over
       the micro-batches are those of the mean loss over the whole batch: a
       pipeline step equals single-device training on the whole batch (to float
       rounding: only the order of the weight-gradient sums differs). Dropout keys
       (step, global sample index) are those of the single-device run;
     - 2-D parallel (DP x PP): with desc.dp, a communicator joining the ranks that
       hold the same stage in different pipelines (pdp_comm_split), each pipeline
       trains on its own share of the global batch and pdp_pp_finish averages the
       stage's gradients over dp (one all-reduce, launched when the pipeline is
       flushed), as DDP does; parameters are taken from dp rank 0 at creation.

   Measured per step (pdp_pp_get_stats): the stage's compute time and its bubble,
   1 - compute / step time (the step starts and ends with a barrier over the
   pipeline, so every stage is timed over the same span), beside the theory
   (p - 1) / (m + p - 1) for equal stages; the most micro-batches whose activations
   the stage held at once and their bytes. PDP_TRACE=out.json draws the schedule:
   one lane per stage ("pipeline stage s"), one event per action ("F3", "B3").

   Backends: local (thread ranks), MPI (processes) and NCCL (a GPU per stage: thread
   ranks from pdp_nccl_group_create, or processes), with the same arithmetic: GPipe
   and 1F1B over 2-4 GPUs equal the single-device model (tested on the CUDA
   emulation, tests/test_cuda.c). What NCCL changes:
     - x is device memory of stage 0's GPU (labels stay on the host); activations and
       gradients travel GPU to GPU;
     - NCCL has no tags and enqueues posted messages only at a wait or pdp_work_done
       (comm.h): the pipeline starts each message as soon as it is posted, an action's
       send together with the receive it posted for the next action; a receive is never
       enqueued ahead of the current action's send, which on NCCL's one stream per
       communicator would wait behind it (the CUDA emulation, stricter than a GPU since
       it enqueues a group only once the stream's earlier work is done, runs GPipe and
       1F1B on 2-4 stages); the tags are still checked, from a header;
     - a peer that never sends fails the wait with PDP_ERR_TIMEOUT naming the peer and
       the tag, but NCCL cannot withdraw a message: the communicator is aborted and every
       later call on it fails (local and MPI stay usable);
     - the timings are host times: kernels run asynchronously, so part of an action's
       GPU work can be counted as the next action's wait, and compute_s and bubble are
       approximations on GPUs (peak_in_flight and the bytes are exact);
     - DP x PP: dp is its own NCCL communicator (pdp_comm_split) with its own stream.

   Typical step (each rank):
       pdp_pp_forward_backward(pp, x, labels, &loss);   the whole batch; loss on the last stage
       pdp_pp_step(pp, opt);                            opt made on pdp_pp_model(pp)
   Reference: Huang et al., "GPipe" (2019); Narayanan et al., "Efficient Large-Scale
   Language Model Training on GPU Clusters Using Megatron-LM" (2021), section 2.2. */

typedef struct pdp_pp pdp_pp;

typedef enum pdp_pp_schedule {
    PDP_PP_1F1B = 0, /* default */
    PDP_PP_GPIPE = 1
} pdp_pp_schedule;

typedef enum pdp_pp_balance {
    PDP_PP_BALANCE_PARAMS = 0, /* default: parameter counts */
    PDP_PP_BALANCE_TIME = 1    /* forward + backward time per layer, measured on rank 0 */
} pdp_pp_balance;

/* The caller's loss, on the last stage, once per micro-batch: y is the output of the
   micro-batch's rows [first, first + y->shape[0]) of the step's batch of total rows;
   write into dy (y's shape, on y's device) the gradient of the STEP's loss with
   respect to y, and into *loss this micro-batch's share of the step's loss (the
   step's loss is the sum of the shares). E.g. a mean over the whole batch: the
   micro-batch's mean times y->shape[0] / total, and its gradient times the same. */
typedef pdp_status (*pdp_pp_loss_fn)(void *user, const pdp_tensor *y, int64_t first,
                                     int64_t total, pdp_tensor *dy, double *loss);

#define PDP_PP_MAX_STAGES 64

typedef struct pdp_pp_desc {
    pdp_pp_schedule schedule;  /* default 1F1B */
    int micro_batches;         /* m; default the number of stages */
    const int *first_layer;    /* NULL: balanced; else one entry per stage, the stage's
                                  first layer: 0 = first_layer[0] < first_layer[1] < ...
                                  < number of layers */
    pdp_pp_balance balance;    /* without first_layer; default parameter counts */
    int64_t balance_batch;     /* BALANCE_TIME: samples per timed pass; default 32 */
    pdp_pp_loss_fn loss;       /* NULL: softmax cross-entropy against the labels */
    void *loss_user;           /* passed to loss */
    pdp_comm *dp;              /* NULL; else DP x PP: gradients averaged over dp each step */
} pdp_pp_desc;

/* Collective over c (every rank calls it; rank r is stage r) and, with desc.dp, over
   dp. full: the same model on every rank; it is read, not kept. A model with fewer
   layers than stages, or boundaries that differ from rank 0's, fail with
   PDP_ERR_INVALID. A rank that cannot allocate its stage makes every rank fail: the
   others with PDP_ERR_COMM naming it. PDP_TRACE=out.json traces the schedule. */
PDP_API pdp_status pdp_pp_create(pdp_pp **out, const pdp_model *full, pdp_comm *c,
                                 const pdp_pp_desc *desc);
PDP_API void pdp_pp_free(pdp_pp *pp); /* NULL is fine */

/* One pipeline pass over a batch of B >= m rows cut into m micro-batches (the first
   B % m one row larger): forward, loss and backward, the gradients accumulated (+=)
   into the stage's model. x is read on the first stage only, on its device (the others read
   x->shape[0]: x->data may be NULL there), labels on the last only (with desc.loss,
   labels may be NULL). *loss: the step's mean loss on the last stage, 0 elsewhere.
   With desc.dp the gradients' all-reduce is launched at the end; pdp_pp_finish waits. */
PDP_API pdp_status pdp_pp_forward_backward(pdp_pp *pp, const pdp_tensor *x,
                                           const int32_t *labels, float *loss);
/* With desc.dp: waits for the gradients' average over dp. Otherwise nothing to do. */
PDP_API pdp_status pdp_pp_finish(pdp_pp *pp);
/* pdp_pp_finish, pdp_optim_step(opt) (opt made on pdp_pp_model), zeroed gradients. */
PDP_API pdp_status pdp_pp_step(pdp_pp *pp, pdp_optim *opt);

PDP_API pdp_model *pdp_pp_model(const pdp_pp *pp); /* this rank's stage */
PDP_API int pdp_pp_stage(const pdp_pp *pp);
PDP_API int pdp_pp_num_stages(const pdp_pp *pp);
/* Stage s holds layers [*first, *last) of the full model. */
PDP_API pdp_status pdp_pp_stage_layers(const pdp_pp *pp, int s, int *first, int *last);
/* This stage's actions as text, "F0 F1 B0 F2 B1 B2" (truncated to cap). */
PDP_API const char *pdp_pp_schedule_str(const pdp_pp *pp, char *buf, size_t cap);

typedef struct pdp_pp_stats {
    int64_t steps;                  /* pipeline passes finished */
    /* the last pass, this stage */
    double step_s;                  /* from the starting barrier to the closing one */
    double compute_s;               /* forward, loss and backward of every micro-batch */
    double bubble;                  /* 1 - compute_s / step_s: the stage's idle share */
    double bubble_theory;           /* (p - 1) / (m + p - 1) */
    int peak_in_flight;             /* most micro-batches whose activations were held */
    int64_t activation_bytes;       /* one micro-batch's (largest): outputs, saved tensors
                                       and, after stage 0, the received input */
    int64_t peak_activation_bytes;  /* peak_in_flight x activation_bytes */
    int64_t bytes_sent;             /* activations forward and gradients back */
    /* sums over all passes */
    double total_step_s, total_compute_s;
} pdp_pp_stats;

PDP_API void pdp_pp_get_stats(const pdp_pp *pp, pdp_pp_stats *out);
/* ---- end src/pp.h ---- */

/* ---- begin src/cuda.h ---- */
/* cuda: CUDA devices, the NCCL communicator for thread ranks, and the plain C
   functions of pdp_cuda.cu.

   Build with -DPDP_CUDA and link pdp_cuda.o (nvcc), cuBLAS and NCCL; without
   PDP_CUDA every function below that takes a device fails with
   PDP_ERR_UNSUPPORTED naming the macro, and pdp_cuda_device_count reports 0.

   Execution model. Each device has one compute stream and one cuBLAS handle,
   created on first use and kept for the life of the process (like the intra-op
   pool, the documented exception to "no globals"). Layer, loss and optimizer
   calls on a CUDA model enqueue kernels on that stream and return; anything
   that hands a value to the host (a download, a loss) waits for it. Give each
   model its own host thread; several threads may share a device (see below).

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
    PDP_CUDAK_SIGMOID = 3
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
pdp_status pdp_cudak_dropout_fwd(int dev, const float *x, float *y, float *mask, int64_t batch,
                                 int64_t n, float p, uint64_t seed, int layer, uint64_t step,
                                 int64_t sample_base);
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

/* losses. host_labels: batch labels in host memory, already checked to lie in
   [0, classes). host_loss: batch per-sample losses (double) for the host to sum
   in sample order. dlogits may be NULL. */
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

/* NaN propagates (torch.relu(nan) is nan): the test is x <= 0, false for NaN. */
static inline PDP__HOSTDEV float pdp__relu(float x) { return x <= 0.0f ? 0.0f : x; }
/* From the output, as PyTorch's threshold_backward(dy, y, 0): 0 where y <= 0, dy
   elsewhere, so dy passes where x > 0 and where x is NaN (y is NaN there too). */
static inline PDP__HOSTDEV float pdp__relu_grad(float dy, float y) { return y <= 0.0f ? 0.0f : dy; }

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
static inline PDP__HOSTDEV float pdp__sigmoid_grad(float dy, float y)
{
    return dy * y * (1.0f - y);
}

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
    uint64_t k = pdp__mix64(seed + UINT64_C(0x9e3779b97f4a7c15) * (uint64_t)(layer + 1));
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
   Adam:  g += l2 p (Adam's weight decay; 0 for AdamW);  m = beta1 m + (1 - beta1) g;
          v = beta2 v + (1 - beta2) g g;  p = p decay (AdamW's 1 - lr wd; 1 for
          Adam) - step_size m / (sqrt(v) / bc2_sqrt + eps),
          step_size = lr / (1 - beta1^t), bc2_sqrt = sqrt(1 - beta2^t).
   Adam is split in two halves around the square root so that a CPU loop can
   take sqrt of a whole block at once (sqrtf itself blocks auto-vectorisation
   while errno is on); pdp__adam_update is the two halves for one element. */

/* x != 0 for the finite hyper-parameters (validated by optim.c), written without == on
   floats so that the block stays quiet under a user's -Wfloat-equal. */
static inline PDP__HOSTDEV int pdp__nonzero(float x) { return x < 0.0f || x > 0.0f; }

/* SGD without momentum. */
static inline PDP__HOSTDEV float pdp__sgd_update(float p, float g, float lr, float weight_decay)
{
    float d = pdp__nonzero(weight_decay) ? g + weight_decay * p : g;
    return p - lr * d;
}

/* SGD with momentum > 0; *buf is the element's momentum buffer.
   one_minus_damp = 1 - dampening; first: the buffer becomes d (PyTorch's clone
   on the first step). */
static inline PDP__HOSTDEV float pdp__sgd_momentum_update(float p, float g, float *buf, float lr,
                                                          float momentum, float one_minus_damp,
                                                          float weight_decay, int nesterov,
                                                          int first)
{
    float d = pdp__nonzero(weight_decay) ? g + weight_decay * p : g;
    float old = *buf;
    float b = first ? d : momentum * old + one_minus_damp * d;
    *buf = b;
    d = nesterov ? d + momentum * b : b;
    return p - lr * d;
}

/* Adam/AdamW, first half: the moments *m and *v of one element. */
static inline PDP__HOSTDEV void pdp__adam_moments(float p, float g, float *m, float *v, float beta1,
                                                  float one_minus_beta1, float beta2,
                                                  float one_minus_beta2, float l2)
{
    if (pdp__nonzero(l2)) g = g + l2 * p;
    *m = beta1 * *m + one_minus_beta1 * g;
    *v = beta2 * *v + one_minus_beta2 * g * g;
}

/* Adam/AdamW, second half: the new parameter from m and sqrt(v). */
static inline PDP__HOSTDEV float pdp__adam_apply(float p, float m, float sqrt_v, float step_size,
                                                 float bc2_sqrt, float eps, float decay)
{
    return p * decay - step_size * m / (sqrt_v / bc2_sqrt + eps);
}

/* Adam/AdamW, one element: both halves. */
static inline PDP__HOSTDEV float pdp__adam_update(float p, float g, float *m, float *v, float beta1,
                                                  float one_minus_beta1, float beta2,
                                                  float one_minus_beta2, float step_size,
                                                  float bc2_sqrt, float eps, float l2, float decay)
{
    pdp__adam_moments(p, g, m, v, beta1, one_minus_beta1, beta2, one_minus_beta2, l2);
    return pdp__adam_apply(p, *m, sqrtf(*v), step_size, bc2_sqrt, eps, decay);
}

/* ---- math: bf16 ----
   bfloat16 is the top half of an IEEE fp32 (1 sign, 8 exponent, 7 mantissa bits).
   pdp__bf16_bits rounds an fp32 to it as PyTorch's c10::BFloat16 and the hardware's
   vcvtneps2bf16 do: round to nearest, ties to even, on the 16 bits dropped; a NaN
   stays a NaN (quiet bit set, sign kept) instead of rounding into an Inf. Overflow
   rounds to Inf; subnormals round like any other value. pdp__bf16_float widens
   (exact), so pdp__bf16_round(x) is x as a bf16 seen as an fp32. Products of two
   bf16 values are exact in fp32 (8 x 8 significant bits) unless they underflow. */
/* The rounding on the fp32 bits u: the bf16's bits in the top half, zeros below. One
   select, no branch, so that loops over it vectorise (layers_conv.c's pdp__conv_bf16). */
static inline PDP__HOSTDEV uint32_t pdp__bf16_round_u32(uint32_t u)
{
    return (u & 0x7fffffffu) > 0x7f800000u ? (u | 0x00400000u) & 0xffff0000u /* NaN: quiet */
                                           : (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
}
static inline PDP__HOSTDEV uint16_t pdp__bf16_bits(float x)
{
    union { float f; uint32_t u; } v;
    v.f = x;
    return (uint16_t)(pdp__bf16_round_u32(v.u) >> 16);
}
static inline PDP__HOSTDEV float pdp__bf16_float(uint16_t h)
{
    union { float f; uint32_t u; } v;
    v.u = (uint32_t)h << 16;
    return v.f;
}
static inline PDP__HOSTDEV float pdp__bf16_round(float x) { return pdp__bf16_float(pdp__bf16_bits(x)); }

/* ---- math: fp16 ----
   IEEE binary16 (1 sign, 5 exponent, 10 mantissa bits; largest finite 65504,
   subnormals down to 2^-24). pdp__f16_bits rounds an fp32 to it as the hardware's
   vcvtps2ph and CUDA's __float2half_rn do: round to nearest, ties to even, with
   gradual underflow (subnormal halves) and overflow to Inf from 65520 up; a NaN
   stays a NaN (quiet bit set, sign kept). pdp__f16_float widens (exact). */
static inline PDP__HOSTDEV uint16_t pdp__f16_bits(float x)
{
    union { float f; uint32_t u; } v;
    uint32_t sign, a, m, r, rem, half;
    int shift;
    v.f = x;
    sign = (v.u >> 16) & 0x8000u;
    a = v.u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520: Inf */
    if (a >= 0x38800000u) {                                   /* >= 2^-14: a normal half */
        a -= 0x38000000u;                                     /* exponent bias 127 -> 15 */
        return (uint16_t)(sign | ((a + 0xfffu + ((a >> 13) & 1u)) >> 13));
    }
    if (a <= 0x33000000u) return (uint16_t)sign; /* <= 2^-25: zero (2^-25 ties to even) */
    m = (a & 0x7fffffu) | 0x800000u;              /* value m 2^(e - 150); a unit is 2^-24 */
    shift = 126 - (int)(a >> 23);                 /* 14..23 */
    r = m >> shift;
    rem = m & ((1u << shift) - 1u);
    half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) r++;
    return (uint16_t)(sign | r);
}
static inline PDP__HOSTDEV float pdp__f16_float(uint16_t h)
{
    union { float f; uint32_t u; } v;
    uint32_t sign = ((uint32_t)h & 0x8000u) << 16, e = ((uint32_t)h >> 10) & 0x1fu,
             m = (uint32_t)h & 0x3ffu;
    if (e == 0x1fu) {
        v.u = sign | 0x7f800000u | (m << 13);
    } else if (e == 0) { /* zero or subnormal: m 2^-24, exact in fp32 */
        v.f = (float)m * 5.9604644775390625e-8f;
        v.u |= sign;
    } else {
        v.u = sign | ((e + 112u) << 23) | (m << 13);
    }
    return v.f;
}
static inline PDP__HOSTDEV float pdp__f16_round(float x) { return pdp__f16_float(pdp__f16_bits(x)); }
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

/* Hot element loops. gcc -O2 (its "very cheap" vectoriser) skips a loop of unknown
   length, which would need an epilogue, and any loop whose pointers may alias; so
   hot loops take PDP__RESTRICT pointers and run in blocks of PDP__VEC floats with a
   constant trip count, then the rest one by one. PDP__FOR_BLOCKED(i, n, body)
   writes that shape: body sees int64_t i. */
#if defined(__cplusplus)
#  define PDP__RESTRICT __restrict__
#else
#  define PDP__RESTRICT restrict
#endif
#define PDP__VEC 16
#define PDP__FOR_BLOCKED(i, n, ...)                                                            \
    do {                                                                                       \
        int64_t pdp__b_ = 0, pdp__n_ = (n);                                                    \
        int pdp__k_;                                                                           \
        for (; pdp__b_ + PDP__VEC <= pdp__n_; pdp__b_ += PDP__VEC)                             \
            for (pdp__k_ = 0; pdp__k_ < PDP__VEC; pdp__k_++) {                                 \
                int64_t i = pdp__b_ + pdp__k_;                                                 \
                __VA_ARGS__                                                                    \
            }                                                                                  \
        for (; pdp__b_ < pdp__n_; pdp__b_++) {                                                 \
            int64_t i = pdp__b_;                                                               \
            __VA_ARGS__                                                                        \
        }                                                                                      \
    } while (0)

/* GCC/Clang atomics: valid C99 and C++, so a flag read outside a lock needs no
   <stdatomic.h> (the trace's enabled flag, the pool's generation while a worker spins). */
#define PDP__LOAD_ACQ(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define PDP__STORE_REL(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)

#define PDP__MIN(a, b) ((a) < (b) ? (a) : (b))
#define PDP__MAX(a, b) ((a) > (b) ? (a) : (b))
#define PDP__DEF(val, def) ((val) ? (val) : (def))
#define PDP__ALIGN 64

/* ---- checked size arithmetic ----
   Every element count, byte count or offset computed from user input (shapes, batch sizes,
   feature counts, padding, first + n) goes through these. Each writes *out and returns 1 when
   a and b are >= 0 and the result is at most PDP__COUNT_MAX; else it returns 0 and leaves *out
   alone, and the caller fails with a message naming its function. PDP__COUNT_MAX is the most
   elements any buffer may have: at 8 bytes each (float, double, int64_t) its byte count still
   fits in int64_t and size_t, so a count that passed may be multiplied by an element size. */
#define PDP__COUNT_MAX                                                                         \
    ((int64_t)(((uint64_t)INT64_MAX < (uint64_t)SIZE_MAX ? (uint64_t)INT64_MAX                 \
                                                         : (uint64_t)SIZE_MAX) / 8u))
#if defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 5)
#  define PDP__HAVE_OVERFLOW_BUILTINS 1
#endif
static PDP__UNUSED int pdp__mul_ok(int64_t a, int64_t b, int64_t *out)
{
    int64_t r;
    if (a < 0 || b < 0) return 0;
#ifdef PDP__HAVE_OVERFLOW_BUILTINS
    if (__builtin_mul_overflow(a, b, &r)) return 0;
#else
    if (a != 0 && b > INT64_MAX / a) return 0;
    r = a * b;
#endif
    if (r > PDP__COUNT_MAX) return 0;
    *out = r;
    return 1;
}
static PDP__UNUSED int pdp__add_ok(int64_t a, int64_t b, int64_t *out)
{
    int64_t r;
    if (a < 0 || b < 0) return 0;
#ifdef PDP__HAVE_OVERFLOW_BUILTINS
    if (__builtin_add_overflow(a, b, &r)) return 0;
#else
    if (b > INT64_MAX - a) return 0;
    r = a + b;
#endif
    if (r > PDP__COUNT_MAX) return 0;
    *out = r;
    return 1;
}
/* a * b * c, checked as above (a convolution's C * k * k, a batch's n * h * w). */
static PDP__UNUSED int pdp__mul3_ok(int64_t a, int64_t b, int64_t c, int64_t *out)
{
    int64_t ab;
    return pdp__mul_ok(a, b, &ab) && pdp__mul_ok(ab, c, out);
}

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

/* Waking a sleeping thread costs tens of microseconds on a VM, more than a small
   GEMM's share, so a thread that hands work off (the intra-op pool, DataParallel's
   workers) spins a while before it sleeps on a condition, as OpenMP runtimes and
   OpenBLAS do (longer): pdp__spin_while pauses while still(ctx) holds, for at most
   PDP__SPIN_S seconds. still() may read only values written with PDP__STORE_REL, and
   through PDP__LOAD_ACQ (threads.c). */
static void pdp__spin_while(bool (*still)(const void *ctx), const void *ctx);

/* The intra-op setting of the calling thread (see pdp_set_num_threads). */
static int pdp__threads_for_caller(void);
/* Runs fn(arg, i, n) for i in [0, n) on the intra-op pool plus the calling thread
   (n <= the caller's thread count); returns when all are done. */
static void pdp__parallel_for(int n, void (*fn)(void *arg, int i, int n), void *arg);
/* The calling thread's profile counters (pdp_profile_start; src/threads.c). A counted
   call does `double t0 = pdp__prof.on ? pdp__now() : 0;` and, at its end,
   `if (pdp__prof.on) pdp__prof.<counter> += pdp__now() - t0;`. */
typedef struct pdp__profile_state {
    bool on;
    int threads;
    double t_start, t_stop;
    double gemm_layers_s, other_layers_s, loss_s, optim_s;
    double join_wait_s;   /* the caller waiting for its workers at a part's end */
    double worker_busy_s; /* the workers' seconds inside this caller's parts */
} pdp__profile_state;
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
    PDP__FLATTEN,
    PDP__TP_COPY,                /* tensor parallel (tp.c): f, g and the split Linears */
    PDP__COLUMN_PARALLEL_LINEAR,
    PDP__ROW_PARALLEL_LINEAR,
    PDP__TP_REDUCE,
    PDP__LAYER_KIND_COUNT
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
    struct pdp__tp_state *tp;            /* TP kinds: the model's TP state (tp.c); else NULL */
    int64_t tp_lo, tp_full;              /* TP Linears: this rank holds [tp_lo, tp_lo + local)
                                            of the split dimension, tp_full wide */
    bool tp_skip_dx;                     /* ColumnParallelLinear after an f that is layer 0: no
                                            input gradient is needed */
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
    pdp_device device;   /* where every pointer above lives */
    bool training;
    bool bf16;           /* the model's precision is PDP_PRECISION_BF16: GEMM inputs in bf16 */
    bool fused_relu;     /* Conv2d on the CPU: a ReLU follows and is applied here (forward:
                            y = relu(.); backward: dy masked by y > 0); model.c aliases it */
    float *pool_y;       /* Conv2d on the CPU, non-NULL: that ReLU is followed by a 2x2
                            stride-2 MaxPool2d over an even H and W, also applied here:
                            forward writes the pool's output and winners (its y and saved,
                            pool_y and pool_arg) and no y of its own (y is NULL); backward
                            gets the pool's dy, and dy at each winner, masked by the pooled
                            value > 0, is the convolution's (model.c skips the MaxPool2d) */
    int32_t *pool_arg;
    uint64_t seed;       /* dropout: mask = f(seed, layer, step, sample_base + i, j) */
    uint64_t step;
    int64_t sample_base;
    pdp_status *status;  /* PDP__LAYER_COLLECTIVE kinds: where their failure goes (the table's
                            dispatch points it at its own variable) */
} pdp__layer_io;

/* Shapes of a layer's parameters, weight then bias; ndim 0: none. */
typedef struct pdp__param_shapes {
    int wndim, bndim;
    int64_t wshape[4], bshape[4];
} pdp__param_shapes;

/* Flags of a layer kind (model.c plans with them). */
#define PDP__LAYER_VIEW 1u       /* output = input seen again (Flatten): model.c aliases it
                                    and never calls forward or backward */
#define PDP__LAYER_FUSES_RELU 2u /* on the CPU, applies a following ReLU itself when
                                    io->fused_relu (model.c then makes the ReLU a view) */
#define PDP__LAYER_COLLECTIVE 4u /* runs a collective (TP's f and g): its CPU entries run on
                                    every device (the communicator moves the device's
                                    buffers) and report a failure through io->status */
#define PDP__LAYER_UNNUMBERED 8u /* not a module of the state_dict numbering (TP's f and g,
                                    functions in Megatron-LM): the layers after it are named
                                    as if it were absent ("0.weight", "2.weight", ...) */
#define PDP__LAYER_FUSES_POOL 16u /* with its fused ReLU, applies a following 2x2 stride-2
                                     MaxPool2d itself (io->pool_y; model.c skips it) */

/* One layer kind: an entry of layers_table.c's pdp__layer_kinds, indexed by kind.
   setup fills out_*, saved_per_sample, work_per_sample and *ps from the
   configuration and in_* (in: the input shape as text, for messages); init
   (NULL: no parameters) fills host memory w, b from r; forward and backward run on
   the CPU; the CUDA entries (NULL: none) return pdp_cuda.cu's status; cuda_work
   (NULL: none) is the workspace floats per sample pdp_cuda.cu's kernels need. */
typedef struct pdp__layer_kind_info {
    const char *name; /* PyTorch's class name, for messages and pdp_model_layer_name */
    pdp_status (*setup)(pdp__layer *l, pdp__param_shapes *ps, const char *in);
    void (*init)(const pdp__layer *l, float *w, float *b, pdp_rng *r);
    void (*forward)(const pdp__layer *l, const pdp__layer_io *io);
    void (*backward)(const pdp__layer *l, const pdp__layer_io *io);
    pdp_status (*cuda_forward)(const pdp__layer *l, const pdp__layer_io *io);
    pdp_status (*cuda_backward)(const pdp__layer *l, const pdp__layer_io *io);
    int64_t (*cuda_work)(const pdp__layer *l);
    unsigned flags; /* PDP__LAYER_* */
} pdp__layer_kind_info;

/* layers_table.c: dispatch through the table. pdp__layer_setup: shape inference and
   validation; pdp__layer_init_params: parameter initialisation; forward and
   backward on io->device; the workspace floats per sample on device d. */
static const pdp__layer_kind_info *pdp__layer_kind_of(pdp__layer_kind k);
static pdp_status pdp__layer_setup(pdp__layer *l, pdp__param_shapes *ps);
static void pdp__layer_init_params(const pdp__layer *l, float *w, float *b, pdp_rng *r);
static pdp_status pdp__layer_forward(const pdp__layer *l, const pdp__layer_io *io);
static pdp_status pdp__layer_backward(const pdp__layer *l, const pdp__layer_io *io);
static const char *pdp__layer_kind_name(pdp__layer_kind k);
static int64_t pdp__layer_work_per_sample(const pdp__layer *l, pdp_device d);

typedef struct pdp__param_entry {
    char name[32];
    int layer;
    int ndim;
    int64_t shape[4];
    int64_t offset, count;
} pdp__param_entry;

/* ---- tensor parallel (tp.c) ----
   A model's TP state: the communicator its TP layers all-reduce on (NULL: none), this
   rank's place in it, and the counters. Embedded in the model, pointed at by its TP
   layers (and by a replica's, which share it). The TP kinds' table entries follow. */
typedef struct pdp__tp_state {
    pdp_comm *comm;
    int rank, size;
    int nlayers;          /* TP layers added */
    pdp_tp_stats stats;
} pdp__tp_state;

static pdp_status pdp__tp_copy_setup(pdp__layer *l, pdp__param_shapes *ps, const char *in);
static void pdp__tp_copy_forward(const pdp__layer *l, const pdp__layer_io *io);
static void pdp__tp_copy_backward(const pdp__layer *l, const pdp__layer_io *io);
static pdp_status pdp__tp_reduce_setup(pdp__layer *l, pdp__param_shapes *ps, const char *in);
static void pdp__tp_reduce_forward(const pdp__layer *l, const pdp__layer_io *io);
static void pdp__tp_reduce_backward(const pdp__layer *l, const pdp__layer_io *io);
static pdp_status pdp__tp_column_setup(pdp__layer *l, pdp__param_shapes *ps, const char *in);
static void pdp__tp_column_init(const pdp__layer *l, float *w, float *b, pdp_rng *r);
static void pdp__tp_column_backward(const pdp__layer *l, const pdp__layer_io *io);
static pdp_status pdp__tp_row_setup(pdp__layer *l, pdp__param_shapes *ps, const char *in);
static void pdp__tp_row_init(const pdp__layer *l, float *w, float *b, pdp_rng *r);
static void pdp__tp_row_forward(const pdp__layer *l, const pdp__layer_io *io);
#ifdef PDP_CUDA
static pdp_status pdp__tp_column_cuda_backward(const pdp__layer *l, const pdp__layer_io *io);
static pdp_status pdp__tp_row_cuda_forward(const pdp__layer *l, const pdp__layer_io *io);
#endif
/* The executor seam (DDP, ZeRO): events of a pass, and where a layer's parameters
   and gradients live. The event function (NULL: off) is called before the forward
   of each layer with parameters (FORWARD_LAYER), when pdp_model_backward starts
   (BACKWARD_BEGIN: a failure refuses the backward, its message stands), before the
   backward of each layer with parameters (BACKWARD_LAYER), and after the last layer
   or the failing one (BACKWARD_END, st = the pass's status, return ignored). */
typedef enum pdp__model_event {
    PDP__EV_FORWARD_LAYER,
    PDP__EV_BACKWARD_BEGIN,
    PDP__EV_BACKWARD_LAYER,
    PDP__EV_BACKWARD_END
} pdp__model_event;
typedef pdp_status (*pdp__model_event_fn)(void *user, pdp_model *m, pdp__model_event ev,
                                          int layer, pdp_status st);

/* Who holds a model ("wrapped" in the docs): a DP master, a DDP or ZeRO executor, or a
   pipeline (its stage model). A wrapped model refuses what would change its layout, and
   calls whose answer the executor changes name the executor's call instead. */
typedef enum pdp__wrap {
    PDP__WRAP_NONE = 0,
    PDP__WRAP_DP,
    PDP__WRAP_DDP,
    PDP__WRAP_ZERO,
    PDP__WRAP_PP
} pdp__wrap;

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
    pdp_precision precision; /* of Linear and Conv2d products (pdp_model_set_precision) */
    bool have_forward;       /* a forward ran since the last backward */
    uint64_t step;           /* training forwards so far (keys dropout masks) */
    int64_t sample_base;     /* global index of this model's first sample (DP replicas) */
    pdp_grad_hook hook;
    void *hook_user;
    int trace_pid, trace_tid;  /* trace forward/backward per layer on this track (tid 0: off);
                                  set by the DDP reducer when PDP_TRACE is on */
    pdp__tp_state tp;          /* tensor parallel: the TP communicator (pdp_model_set_tp) */
    pdp__wrap wrapped;         /* the executor holding the model (PDP__WRAP_NONE: none); set
                                  by its create, cleared by its free (pdp__model_wrap) */
    pdp__model_event_fn event; /* the executor seam (above); NULL: off */
    void *event_user;
    float **layer_w, **layer_dw; /* per layer (NULL array or entry: the blocks at the
                                    weight's offset): where the executor put the layer's
                                    weight (its bias follows it) and their gradients */
    /* pipeline stages (pp.c; defaults 0/NULL leave a model as it was) */
    int nslots, slot;        /* activation sets kept (0 = 1) and the one forward/backward use */
    int64_t act_stride, saved_stride; /* floats from one set of act_block/saved_block to the next */
    float *input_grad;       /* not NULL: backward writes d(loss)/d(input) here [batch, in] */
    double *layer_s;         /* not NULL: forward and backward add each layer's seconds */
};

/* A model with the same layers and a fresh set of buffers. share_params: the
   clone reads src's parameter block (CPU DP replicas); otherwise it gets its own
   copy of the parameter values. */
static pdp_status pdp__model_clone(const pdp_model *src, pdp_device device, bool share_params,
                                   pdp_model **out);
/* Pipeline stages (model.c, for pp.c). pdp__model_stage: a new model holding layers [lo, hi)
   of full, with their parameters copied (names, layer indices and dropout keys stay full's:
   "3.weight" stays "3.weight"), zeroed gradients, input shape that of layer lo.
   pdp__model_set_slots: keep nslots sets of activations and saved tensors (buffers are
   re-planned on the next reserve). pdp__model_use_slot: the next forward writes set slot;
   with forwarded, the next backward reads set slot, whose forward ran on input x of batch
   rows (x must be the input that forward was given, still alive). */
static pdp_status pdp__model_stage(const pdp_model *full, int lo, int hi, pdp_model **out);
static pdp_status pdp__model_set_slots(pdp_model *m, int nslots);
static void pdp__model_use_slot(pdp_model *m, int slot, const float *x, int64_t batch,
                                bool forwarded);

/* ---- losses (loss.c) ----
   Softmax cross-entropy over integer labels: *loss_sum gets the sum over the
   batch of -log softmax(logits)[label] (double accumulation), and when dlogits
   is not NULL it gets (softmax - onehot) * grad_scale. The public loss uses
   grad_scale = 1/batch; DP replicas use 1/global_batch so that the reduced
   gradients equal those of the whole batch. fn names the public caller. */
static pdp_status pdp__cross_entropy(const float *logits, const int32_t *labels, int64_t batch,
                                     int64_t classes, float grad_scale, double *loss_sum,
                                     float *dlogits, const char *fn);

/* ---- CUDA dispatch (cuda_host.c) ----
   loss.c and optim.c hand work on a CUDA device to these; without
   PDP_CUDA they fail with PDP_ERR_UNSUPPORTED naming the macro. Same contracts
   as the CPU functions they stand in for (pointers on device d or io->device;
   labels in host memory). pdp__dev_add: dst += src on d (DP's reduce). */
/* Per-step scalars, computed once in double (as PyTorch does in Python) and
   rounded to float for the element loop (optim.c's CPU loop, cuda_host.c's kernels). */
typedef struct pdp__optim_scalars {
    pdp_optim_kind kind;
    float lr, momentum, one_minus_damp, weight_decay;
    int nesterov, first;
    float beta1, one_minus_beta1, beta2, one_minus_beta2, step_size, bc2_sqrt, eps, l2, decay;
} pdp__optim_scalars;

static pdp_status pdp__cuda_cross_entropy(pdp_device d, const float *logits, const int32_t *labels,
                                          int64_t batch, int64_t classes, float grad_scale,
                                          double *loss_sum, float *dlogits,
                                          const char *fn) PDP__UNUSED;
static pdp_status pdp__cuda_mse(pdp_device d, const float *pred, const float *target,
                                int64_t count, float scale, double *sum, float *dpred,
                                const char *fn) PDP__UNUSED;
static pdp_status pdp__cuda_optim_update(pdp_device d, const struct pdp__optim_scalars *s,
                                         float *p, const float *g, float *s0, float *s1,
                                         int64_t n) PDP__UNUSED;
static pdp_status pdp__dev_add(pdp_device d, float *dst, const float *src,
                               int64_t count) PDP__UNUSED;
/* Gradient clipping on d: *sum = sum of x^2 (double, fixed order); x *= s. */
static pdp_status pdp__cuda_sumsq(pdp_device d, const float *x, int64_t count, double *sum,
                                  const char *fn) PDP__UNUSED;
static pdp_status pdp__cuda_scale(pdp_device d, float *x, int64_t count, float s,
                                  const char *fn) PDP__UNUSED;

/* ---- gradient norms (optim.c): the local pieces every clipping call is made of ----
   pdp__grad_sumsq: *sum += the sum of squares of g[0, n) (on m's device; double, fixed
   order). pdp__grad_scale: g[0, n) *= coef. fn names the public caller in errors. */
static pdp_status pdp__grad_sumsq(const pdp_model *m, const float *g, int64_t n, double *sum,
                                  const char *fn);
static pdp_status pdp__grad_scale(const pdp_model *m, float *g, int64_t n, float coef,
                                  const char *fn);

/* ---- optimizer internals (optim.c) ----
   Updates parameters [lo, hi) of the flat blocks (all of them for a normal
   step; one rank's shard under ZeRO). The step counter is advanced by the
   caller-visible pdp_optim_step only. */
static pdp_status pdp__optim_step_range(pdp_optim *o, float *params, const float *grads,
                                        int64_t lo, int64_t hi);
/* pdp_optim_step's checks (model changed since create, ZeRO shard, sharded blocks),
   with its messages; changes nothing. */
static pdp_status pdp__optim_check_step(const pdp_optim *o);
/* The scalars of o's next update (learning rate, Adam's bias corrections). */
static void pdp__optim_scalars_of(const pdp_optim *o, pdp__optim_scalars *s);
/* Parameters [lo, hi) updated on the calling thread with scalars s from
   pdp__optim_scalars_of (a CPU optimizer; nothing is checked or counted). */
static void pdp__optim_update_range(const pdp_optim *o, const pdp__optim_scalars *s,
                                    float *params, const float *grads, int64_t lo, int64_t hi);
/* Counts an update done range by range (pdp__optim_step_range,
   pdp__optim_update_range) as one step. */
static void pdp__optim_finish_step(pdp_optim *o);
/* An optimizer holding state for [lo, hi) of the flat block only (ZeRO: one
   rank's range; pdp_optim_create is [0, param_count)). pdp_optim_step on it
   updates [lo, hi) only, with the bits a full optimizer gives that range.
   fn names the public caller. */
static pdp_status pdp__optim_create_range(pdp_optim **out, pdp_model *m,
                                          const pdp_optim_desc *desc, int64_t lo, int64_t hi,
                                          const char *fn);

/* ---- checkpoint ranges (checkpoint.c) ----
   One rank's part of a checkpoint under ZeRO: the parameters and/or optimizer
   state of [lo, hi) of the flat block. params: hi - lo floats on m's device
   holding elements [lo, hi) (m->param_block + lo when the rank keeps the whole
   block), or NULL for none; o: an optimizer whose range contains [lo, hi), or
   NULL for none. Save writes a shard file (flat tensors, see checkpoint.c);
   load reads a shard file of exactly [lo, hi) or the slice [lo, hi) of a full
   checkpoint, validating everything before it copies. fn names the public
   caller in messages. */
static pdp_status pdp__checkpoint_save_range(const char *path, const pdp_model *m,
                                             const float *params, const pdp_optim *o,
                                             int64_t lo, int64_t hi, const char *fn);
static pdp_status pdp__checkpoint_load_range(const char *path, pdp_model *m, float *params,
                                             pdp_optim *o, int64_t lo, int64_t hi,
                                             const char *fn);

/* ---- communicator internals (comm.c and its backends: comm_local.c, comm_mpi.c,
   comm_nccl.c; comm_queue.c) ----
   Each backend fills one table; the public pdp_comm_* functions (comm.c) validate
   their arguments, then call it. A backend keeps a fixed handle pool so that a
   training step allocates nothing: the local and MPI backends share comm_queue.c's
   collective queue (pdp__workq: pool, FIFO, progress thread, wait/done);
   NCCL's stream orders its collectives, with a pool of event slots. */
typedef struct pdp__comm_ops {
    /* the reductions take any pdp_dtype (comm.c validated it; count is elements) */
    pdp_status (*allreduce)(pdp_comm *c, void *buf, int64_t count, pdp_dtype dt, pdp_reduce_op op,
                            pdp_work **w);
    pdp_status (*broadcast)(pdp_comm *c, float *buf, int64_t count, int root, pdp_work **w);
    pdp_status (*reduce_scatter)(pdp_comm *c, const void *send, void *recv, int64_t recv_count,
                                 pdp_dtype dt, pdp_reduce_op op, pdp_work **w);
    pdp_status (*allgather)(pdp_comm *c, const float *send, float *recv, int64_t send_count,
                            pdp_work **w);
    pdp_status (*barrier)(pdp_comm *c, pdp_work **w);
    pdp_status (*broadcast_bytes)(pdp_comm *c, void *buf, size_t bytes, int root);
    /* point-to-point (comm.c validated peer, tag and count) */
    pdp_status (*send)(pdp_comm *c, const float *buf, int64_t count, int peer, int tag,
                       pdp_work **w);
    pdp_status (*recv)(pdp_comm *c, float *buf, int64_t count, int peer, int tag, pdp_work **w);
    /* collective over c: comm.c has exchanged every rank's (colour, key) and computed this
       rank's place (new_rank of new_size; leader: the old rank of new rank 0); colour < 0
       joins nothing (*out stays NULL) but takes part */
    pdp_status (*split)(pdp_comm *c, int colour, int key, int new_rank, int new_size, int leader,
                        pdp_comm **out);
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

/* Common head of every handle; a backend's handle struct begins with it.
   Contract between comm.c's public layer and a backend:
   - a collective op always gets a non-NULL w (comm.c makes work == NULL calls
     synchronous) and fills comm, op_name and seq; comm.c sets t_launch;
   - before the handle reports done, the backend sets t_start (execution began,
     after any queueing) and t_done (completed, or failed);
   - ops->wait completes the collective, leaves a failure's message WITHOUT a
     function-name prefix (the public caller adds it) and returns the handle to
     the backend's pool; the head fields stay readable until the next collective
     is issued on that communicator (comm.c reads t_start/t_done after wait). */
struct pdp_work {
    pdp_comm *comm;
    const char *op_name;  /* "allreduce", for messages and the trace */
    int64_t seq;          /* collective number on this communicator */
    double t_launch;      /* pdp__now() at launch */
    double t_start;       /* pdp__now() when the backend began executing it */
    double t_done;        /* pdp__now() at completion */
};

/* The collectives and their names (messages, the trace); pdp_cudak_coll (cuda.h)
   follows the first four. */
typedef enum pdp__coll_kind {
    PDP__COLL_ALLREDUCE,
    PDP__COLL_BROADCAST,
    PDP__COLL_REDUCE_SCATTER,
    PDP__COLL_ALLGATHER,
    PDP__COLL_BARRIER,
    PDP__COLL_BROADCAST_BYTES,
    PDP__COLL_SEND,            /* point-to-point: not collectives, but the same handles */
    PDP__COLL_RECV,
    PDP__COLL_SPLIT
} pdp__coll_kind;

/* A 16-bit element of the reducing collectives (dt: PDP_DTYPE_BF16 or PDP_DTYPE_F16) as
   an fp32, and an fp32 rounded to it (to nearest even): math.h's conversions. */
static inline size_t pdp__dtype_size(int dt) { return dt == PDP_DTYPE_F32 ? 4 : 2; }
static inline float pdp__dt16_float(int dt, uint16_t h)
{
    return dt == PDP_DTYPE_BF16 ? pdp__bf16_float(h) : pdp__f16_float(h);
}
static inline uint16_t pdp__dt16_bits(int dt, float x)
{
    return dt == PDP_DTYPE_BF16 ? pdp__bf16_bits(x) : pdp__f16_bits(x);
}

static const char *pdp__op_names[] = {"allreduce", "broadcast", "reduce_scatter", "allgather",
                                      "barrier", "broadcast_bytes", "send", "recv", "split"};

/* A backend's entry in comm.c's dispatcher (pdp_comm_init_env), defined by its
   module, which comes before comm.c: under its macro it creates the communicator
   from the environment; without it, it fails with PDP_ERR_UNSUPPORTED naming the
   macro. Errors start with "pdp_comm_init_env". */
static pdp_status pdp__comm_init_mpi_env(pdp_comm **out, const pdp_comm_desc *desc);
static pdp_status pdp__comm_init_nccl_env(pdp_comm **out, const pdp_comm_desc *desc);

/* ---- trace (trace.c) ----
   Chrome trace JSON (Perfetto, chrome://tracing) when PDP_TRACE=path is set.
   One process-wide, mutex-guarded sink (the documented exception to "no
   globals"), reference counted by open/close; PDP_TRACE is read by each open
   while no trace file is open. process_rank >= 0 (this process is one rank of several) writes
   path with ".rank<r>" inserted before the extension. Events take pdp__now()
   seconds; pid = rank, tid = a track from pdp__trace_track; cat is a string
   literal; args NULL or a JSON object body ("\"bytes\":64"). Recording copies
   a fixed-size record and never allocates. Everything is a no-op when off. */
static pdp_status pdp__trace_open(int process_rank);
static void pdp__trace_close(void);
static bool pdp__trace_enabled(void);
static int pdp__trace_track(int pid, const char *name);
static void pdp__trace_complete(int pid, int tid, const char *cat, const char *name, double t0,
                                double t1, const char *args);
static void pdp__trace_async(int pid, int tid, const char *cat, const char *name, uint64_t id,
                             double t0, double t1, const char *args);
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
   index w + 1, the caller runs index 0 itself, then waits until the pending count
   reaches zero. Waking a sleeping thread costs tens of microseconds (more than a
   small GEMM's share on a VM), and a training step hands off work every few
   microseconds to milliseconds, so both sides spin a little before they sleep: a
   worker that finished a job watches the generation for PDP__SPIN_S before it
   sleeps on pool.wake, and the caller watches pending for as long before it sleeps
   on pool.done (OpenMP runtimes and OpenBLAS spin the same way, longer). The two
   values watched outside the lock, generation and pending (and stop), are only
   ever written with atomic stores, under the lock; everything else is read under
   it, so the pool is TSan clean. A caller that loses the trylock (another thread is
   using the pool, e.g. two DP workers in GEMM at once, or a nested call from inside
   a job) runs every index itself, in order. Which thread runs an index never
   changes what the index computes, so results do not depend on who won.

   Profile: while the caller's counters are on (pdp_profile_start), the job carries a
   pointer to them; each worker adds the seconds it spent in its index under the lock
   it takes anyway to report, and the caller adds the time it waited for them.

   Scratch: pdp__thread_scratch() gives each thread one growing 64-byte aligned
   buffer (GEMM packs its panels there), kept in a pthread key whose destructor
   frees it when the thread exits; pdp_shutdown_threads frees the caller's. */

/* #include "internal.h" (already above) */
#include <unistd.h>

#define PDP__MAX_THREADS 256
#ifndef PDP__SPIN_S
#  define PDP__SPIN_S 100e-6
#endif

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

/* ---- threads: the profile counters (pdp_profile_*) ---- */

static PDP__THREAD_LOCAL pdp__profile_state pdp__prof;

PDP_API void pdp_profile_start(void)
{
    memset(&pdp__prof, 0, sizeof pdp__prof);
    pdp__prof.threads = pdp_get_num_threads();
    pdp__prof.t_start = pdp__now();
    pdp__prof.on = true;
}

PDP_API void pdp_profile_read(pdp_profile *out)
{
    const pdp__profile_state *s = &pdp__prof;
    double counted;
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (s->t_start == 0.0) return; /* never started */
    out->wall_s = (s->on ? pdp__now() : s->t_stop) - s->t_start;
    out->gemm_layers_s = s->gemm_layers_s;
    out->other_layers_s = s->other_layers_s;
    out->loss_s = s->loss_s;
    out->optim_s = s->optim_s;
    counted = s->gemm_layers_s + s->other_layers_s + s->loss_s + s->optim_s;
    out->other_s = PDP__MAX(0.0, out->wall_s - counted);
    out->threads = s->threads;
    out->idle_s = s->threads > 1 ? PDP__MAX(0.0, (double)(s->threads - 1) * out->wall_s -
                                                     s->worker_busy_s + s->join_wait_s)
                                 : 0.0;
}

PDP_API void pdp_profile_stop(pdp_profile *out)
{
    if (pdp__prof.on) pdp__prof.t_stop = pdp__now();
    pdp__prof.on = false;
    pdp_profile_read(out);
}

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

static void pdp__spin_while(bool (*still)(const void *ctx), const void *ctx)
{
    double t0 = pdp__now();
    int i;
    while (still(ctx) && pdp__now() - t0 <= PDP__SPIN_S)
        for (i = 0; i < 16; i++) {
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#endif
        }
}

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
    int stop;                 /* atomic stores only (read while spinning) */
    unsigned long generation; /* bumped once per job; atomic stores only */
    void (*fn)(void *arg, int i, int n);
    void *arg;
    int n;       /* indices of the current job; worker w runs index w + 1 */
    int pending; /* workers that have not finished the current job; atomic stores only */
    pdp__profile_state *prof; /* the caller's counters while they are on, else NULL */
} pdp__pool;

static pdp__pool pdp__the_pool; /* zero: no workers yet */

/* pdp__spin_while's conditions: a worker waits for a new generation (or stop), the
   caller for its workers. */
static bool pdp__pool_no_new_job(const void *seen)
{
    return PDP__LOAD_ACQ(&pdp__the_pool.generation) == *(const unsigned long *)seen &&
           !PDP__LOAD_ACQ(&pdp__the_pool.stop);
}

static bool pdp__pool_jobs_pending(const void *unused)
{
    (void)unused;
    return PDP__LOAD_ACQ(&pdp__the_pool.pending) > 0;
}

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
        pdp__profile_state *prof;
        double t0 = 0.0;
        int n;
        if (pool->generation == seen && !pool->stop) { /* spin a while, then sleep */
            pthread_mutex_unlock(&pdp__pool_lock);
            pdp__spin_while(pdp__pool_no_new_job, &seen);
            pthread_mutex_lock(&pdp__pool_lock);
        }
        while (pool->generation == seen && !pool->stop) pthread_cond_wait(&pdp__pool_wake, &pdp__pool_lock);
        if (pool->stop) break;
        seen = pool->generation;
        fn = pool->fn;
        arg = pool->arg;
        n = pool->n;
        prof = pool->prof;
        if (w + 1 >= n) continue; /* not part of this job */
        pthread_mutex_unlock(&pdp__pool_lock);
        if (prof) t0 = pdp__now();
        fn(arg, w + 1, n);
        pthread_mutex_lock(&pdp__pool_lock);
        if (prof) prof->worker_busy_s += pdp__now() - t0;
        PDP__STORE_REL(&pool->pending, pool->pending - 1);
        if (pool->pending == 0) pthread_cond_signal(&pdp__pool_done);
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
    double t0;
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
    PDP__STORE_REL(&pool->pending, helpers);
    pool->prof = pdp__prof.on ? &pdp__prof : NULL;
    PDP__STORE_REL(&pool->generation, pool->generation + 1);
    pthread_cond_broadcast(&pdp__pool_wake);
    pthread_mutex_unlock(&pdp__pool_lock);

    fn(arg, 0, n);
    for (i = helpers + 1; i < n; i++) fn(arg, i, n); /* only if workers could not be made */

    t0 = pdp__prof.on ? pdp__now() : 0.0;
    pdp__spin_while(pdp__pool_jobs_pending, NULL); /* a while, then sleep */
    pthread_mutex_lock(&pdp__pool_lock);
    while (pool->pending > 0) pthread_cond_wait(&pdp__pool_done, &pdp__pool_lock);
    pool->prof = NULL;
    pthread_mutex_unlock(&pdp__pool_lock);
    pthread_mutex_unlock(&pdp__pool_busy);
    if (pdp__prof.on) pdp__prof.join_wait_s += pdp__now() - t0;
}

PDP_API void pdp_shutdown_threads(void)
{
    pdp__pool *pool = &pdp__the_pool;
    int w, nworkers;
    pthread_mutex_lock(&pdp__pool_busy); /* waits for a job in flight to finish */
    pthread_mutex_lock(&pdp__pool_lock);
    PDP__STORE_REL(&pool->stop, 1);
    nworkers = pool->nworkers;
    pthread_cond_broadcast(&pdp__pool_wake);
    pthread_mutex_unlock(&pdp__pool_lock);
    for (w = 0; w < nworkers; w++) pthread_join(pool->tid[w], NULL);
    pthread_mutex_lock(&pdp__pool_lock);
    PDP__STORE_REL(&pool->stop, 0);
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

/* ---- begin src/trace.c ---- */
/* trace: a Chrome trace of what each rank did and when, for Perfetto
   (ui.perfetto.dev) and chrome://tracing.

   Set PDP_TRACE=path and every object that traces (the DDP reducer, the MPI
   communicator, ...) records events into one process-wide sink; the file is
   the JSON Object Format of the Trace Event Format:
       {"traceEvents":[ {...}, {...} ],"displayTimeUnit":"ms"}
   with complete events ("ph":"X", ts and dur in microseconds), nestable async
   begin/end pairs for collectives ("ph":"b"/"e", one id per collective) and
   metadata that names processes and threads ("ph":"M", process_name,
   thread_name, *_sort_index). "pid" is the rank, "tid" a track: one compute
   track per rank and one per communicator, handed out by pdp__trace_track.

   Why one process-wide sink, not an object: tracing is a process-level
   debugging switch (an environment variable, like NCCL_DEBUG), and thread-ranks
   of one process must share one file with pid = rank. The sink is the one
   documented exception to "no hidden globals": a mutex-guarded struct that
   exists only between the first pdp__trace_open and the last pdp__trace_close
   (reference counted); PDP_TRACE is read by every open while tracing is off
   (the first open that finds it set starts the file; objects opened before
   stay silent), and the file is completed when the last reference closes, or
   brought up to date by pdp_trace_flush() before that. With PDP_STATIC
   and two copies of pdp in one program there are two sinks: give them
   different PDP_TRACE values or trace only one.

   Files: a process that is one rank of several (MPI, torchrun) passes its
   rank to pdp__trace_open and writes path with ".rank<r>" inserted before the
   extension (trace.json -> trace.rank1.json); otherwise path as given.
   Timestamps are CLOCK_MONOTONIC microseconds, shared by every process of a
   machine, so the per-rank files of one machine line up: merge them with
       python3 -c 'import json,sys; print(json.dumps({"traceEvents": sum(
           (json.load(open(f))["traceEvents"] for f in sys.argv[1:]), [])}))' \
           trace.rank*.json > trace.json

   Invariants: events are fixed-size records in a buffer of
   PDP_TRACE_BUFFER_EVENTS allocated at the first open; recording copies one
   record under the mutex and never allocates. A full buffer is written out
   (the recording thread pays for that write, ~1 ms per 10^4 events) and
   reused. After every write the file ends with the closing "]}" (the next
   write seeks back over it), so the file is valid JSON after each flush and
   after close, and pdp_trace_flush() makes it current at any time. Names are
   copied (truncated to 47 bytes) and escaped when written; args are a JSON
   object body built by pdp code ("\"bytes\":4096,\"seq\":3"), copied as is.
   Reference: "Trace Event Format", Google, docs.google.com/document/d/
   1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU. */

/* #include "internal.h" (already above) */

#ifndef PDP_TRACE_BUFFER_EVENTS
#  define PDP_TRACE_BUFFER_EVENTS 16384 /* records kept in memory between writes (160 B each) */
#endif
#define PDP__TRACE_MAX_PIDS 4096        /* ranks whose process gets a name */

/* ---- trace: records ---- */

typedef struct pdp__trace_ev {
    double ts, dur;   /* microseconds */
    uint64_t id;      /* async pair id */
    int pid, tid;
    char ph;          /* 'X' complete, 'A' async pair (written as "b" and "e"), 'M' metadata */
    const char *cat;  /* a string literal */
    char name[48];
    char args[88];    /* JSON object body, without braces; "" for none */
} pdp__trace_ev;

typedef struct pdp__trace_sink {
    int refs;                 /* open minus close calls */
    int enabled;              /* read with PDP__LOAD_ACQ on the hot path */
    FILE *f;
    char path[1024];
    long data_end;            /* file offset where the closing trailer starts */
    int64_t written;          /* events written so far (for the separator) */
    pdp__trace_ev *ev;
    int n, cap;
    int next_tid;
    pdp_status io_status;     /* first write error, reported by pdp_trace_flush */
    unsigned char named_pid[PDP__TRACE_MAX_PIDS / 8];
} pdp__trace_sink;

static pthread_mutex_t pdp__trace_mu = PTHREAD_MUTEX_INITIALIZER;
static pdp__trace_sink pdp__trace_g; /* the documented exception, see above */

static const char pdp__trace_trailer[] = "\n],\"displayTimeUnit\":\"ms\"}\n";

/* ---- trace: writing ---- */

static void pdp__trace_put_escaped(FILE *f, const char *s)
{
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
}

static void pdp__trace_put_one(FILE *f, const pdp__trace_ev *e, char ph, double ts, bool dur)
{
    fprintf(f, "{\"ph\":\"%c\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f", ph, e->pid, e->tid, ts);
    if (dur) fprintf(f, ",\"dur\":%.3f", e->dur);
    if (e->ph == 'A') fprintf(f, ",\"id\":\"0x%llx\"", (unsigned long long)e->id);
    if (e->cat) fprintf(f, ",\"cat\":\"%s\"", e->cat);
    fputs(",\"name\":\"", f);
    pdp__trace_put_escaped(f, e->name);
    fprintf(f, "\",\"args\":{%s}}", e->args);
}

/* Appends the buffered records after the last one written, then the trailer.
   Called with the mutex held. */
static void pdp__trace_write_locked(pdp__trace_sink *s)
{
    int i;
    if (!s->f) return;
    if (fseek(s->f, s->data_end, SEEK_SET) != 0) s->io_status = PDP_ERR_IO;
    for (i = 0; i < s->n; i++) {
        const pdp__trace_ev *e = &s->ev[i];
        fputs(s->written++ ? ",\n" : "\n", s->f);
        if (e->ph == 'A') { /* a begin and an end with the same id */
            pdp__trace_put_one(s->f, e, 'b', e->ts, false);
            fputs(",\n", s->f);
            pdp__trace_put_one(s->f, e, 'e', e->ts + e->dur, false);
        } else {
            pdp__trace_put_one(s->f, e, e->ph, e->ts, e->ph == 'X');
        }
    }
    s->n = 0;
    s->data_end = ftell(s->f);
    fputs(pdp__trace_trailer, s->f);
    if (fflush(s->f) != 0 || ferror(s->f) || s->data_end < 0) s->io_status = PDP_ERR_IO;
}

/* The next free record (writing the buffer out when it is full). Mutex held. */
static pdp__trace_ev *pdp__trace_slot_locked(pdp__trace_sink *s)
{
    pdp__trace_ev *e;
    if (s->n == s->cap) pdp__trace_write_locked(s);
    e = &s->ev[s->n++];
    memset(e, 0, sizeof *e);
    return e;
}

static void pdp__trace_copy(char *dst, size_t cap, const char *src)
{
    size_t n = src ? strlen(src) : 0;
    if (n >= cap) n = cap - 1;
    if (n) memcpy(dst, src, n);
    dst[n] = '\0';
}

/* args = "\"name\":\"<escaped s>\"" for metadata records. */
static void pdp__trace_name_arg(char *dst, size_t cap, const char *s)
{
    size_t o = 0;
    o += (size_t)snprintf(dst, cap, "\"name\":\"");
    for (; *s && o + 8 < cap; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') { dst[o++] = '\\'; dst[o++] = (char)c; }
        else if (c >= 0x20) dst[o++] = (char)c;
    }
    dst[o++] = '"';
    dst[o] = '\0';
}

static void pdp__trace_meta_locked(pdp__trace_sink *s, int pid, int tid, const char *what,
                                   const char *name, int sort_index)
{
    pdp__trace_ev *e = pdp__trace_slot_locked(s);
    char sort_what[32];
    e->ph = 'M';
    e->pid = pid;
    e->tid = tid;
    snprintf(e->name, sizeof e->name, "%.12s_name", what);
    pdp__trace_name_arg(e->args, sizeof e->args, name);
    e = pdp__trace_slot_locked(s);
    e->ph = 'M';
    e->pid = pid;
    e->tid = tid;
    snprintf(sort_what, sizeof sort_what, "%.12s_sort_index", what);
    pdp__trace_copy(e->name, sizeof e->name, sort_what);
    snprintf(e->args, sizeof e->args, "\"sort_index\":%d", sort_index);
}

/* ---- trace: the private API ---- */

/* Opens (process_rank >= 0: this process is that rank of several) or joins
   the sink. Reads PDP_TRACE while no file is open; unset or empty means
   tracing stays off and every call below is a no-op. Each successful call
   must be matched by one pdp__trace_close. */
static pdp_status pdp__trace_open(int process_rank)
{
    pdp__trace_sink *s = &pdp__trace_g;
    const char *env;
    pdp_status st = PDP_OK;
    pthread_mutex_lock(&pdp__trace_mu);
    s->refs++;
    if (s->f) goto out; /* already tracing: join */
    env = getenv("PDP_TRACE");
    if (!env || !*env) goto out;
    {
        const char *slash = strrchr(env, '/'), *dot = strrchr(env, '.');
        int len;
        if (!dot || (slash && dot < slash)) dot = env + strlen(env); /* no extension */
        if (process_rank >= 0)
            len = snprintf(s->path, sizeof s->path, "%.*s.rank%d%s", (int)(dot - env), env,
                           process_rank, dot);
        else
            len = snprintf(s->path, sizeof s->path, "%s", env);
        if (len < 0 || (size_t)len >= sizeof s->path) {
            st = pdp__err(PDP_ERR_INVALID, "PDP_TRACE: path longer than %zu bytes",
                          sizeof s->path - 1);
            goto fail;
        }
    }
    s->ev = (pdp__trace_ev *)pdp__alloc(sizeof(pdp__trace_ev) * PDP_TRACE_BUFFER_EVENTS);
    if (!s->ev) {
        st = pdp__err(PDP_ERR_OUT_OF_MEMORY, "PDP_TRACE: no memory for %d trace events",
                      PDP_TRACE_BUFFER_EVENTS);
        goto fail;
    }
    s->f = fopen(s->path, "w+b");
    if (!s->f) {
        st = pdp__err(PDP_ERR_IO, "PDP_TRACE: cannot open '%s' for writing: %s", s->path,
                      strerror(errno));
        goto fail;
    }
    fputs("{\"traceEvents\":[", s->f);
    s->data_end = ftell(s->f);
    s->cap = PDP_TRACE_BUFFER_EVENTS;
    s->n = 0;
    s->written = 0;
    s->next_tid = 1;
    s->io_status = PDP_OK;
    memset(s->named_pid, 0, sizeof s->named_pid);
    pdp__trace_write_locked(s); /* a valid, empty trace from the start */
    PDP__STORE_REL(&s->enabled, 1);
    goto out;
fail:
    pdp__dealloc(s->ev);
    s->ev = NULL;
    s->refs--;
out:
    pthread_mutex_unlock(&pdp__trace_mu);
    return st;
}

/* The last close writes everything, closes the file and frees the buffer. */
static void pdp__trace_close(void)
{
    pdp__trace_sink *s = &pdp__trace_g;
    pthread_mutex_lock(&pdp__trace_mu);
    if (s->refs > 0 && --s->refs == 0 && s->f) {
        PDP__STORE_REL(&s->enabled, 0);
        pdp__trace_write_locked(s);
        fclose(s->f);
        s->f = NULL;
        pdp__dealloc(s->ev);
        s->ev = NULL;
        s->cap = s->n = 0;
    }
    pthread_mutex_unlock(&pdp__trace_mu);
}

/* Cheap enough for every event site: one atomic load. */
static bool pdp__trace_enabled(void) { return PDP__LOAD_ACQ(&pdp__trace_g.enabled) != 0; }

/* A new track (tid) on process pid (a rank) named name ("compute", "comm world");
   the first track of a pid also names the process "rank <pid>". 0 when off. */
static int pdp__trace_track(int pid, const char *name)
{
    pdp__trace_sink *s = &pdp__trace_g;
    int tid = 0;
    if (!pdp__trace_enabled()) return 0;
    pthread_mutex_lock(&pdp__trace_mu);
    if (s->f) {
        tid = s->next_tid++;
        if (pid >= 0 && pid < PDP__TRACE_MAX_PIDS && !(s->named_pid[pid / 8] & (1u << (pid % 8)))) {
            char pname[32];
            s->named_pid[pid / 8] |= (unsigned char)(1u << (pid % 8));
            snprintf(pname, sizeof pname, "rank %d", pid);
            pdp__trace_meta_locked(s, pid, 0, "process", pname, pid);
        }
        pdp__trace_meta_locked(s, pid, tid, "thread", name, tid);
    }
    pthread_mutex_unlock(&pdp__trace_mu);
    return tid;
}

static void pdp__trace_record(char ph, int pid, int tid, const char *cat, const char *name,
                              uint64_t id, double t0, double t1, const char *args)
{
    pdp__trace_sink *s = &pdp__trace_g;
    pdp__trace_ev *e;
    if (!pdp__trace_enabled()) return;
    pthread_mutex_lock(&pdp__trace_mu);
    if (s->f) {
        e = pdp__trace_slot_locked(s);
        e->ph = ph;
        e->pid = pid;
        e->tid = tid;
        e->cat = cat;
        e->id = id;
        e->ts = t0 * 1e6;
        e->dur = (t1 > t0 ? t1 - t0 : 0.0) * 1e6;
        pdp__trace_copy(e->name, sizeof e->name, name);
        pdp__trace_copy(e->args, sizeof e->args, args);
    }
    pthread_mutex_unlock(&pdp__trace_mu);
}

/* A complete event: name ran on track tid of rank pid from t0 to t1 (pdp__now()
   seconds). cat: a string literal ("compute", "comm"); args: NULL or a JSON
   object body. */
static void pdp__trace_complete(int pid, int tid, const char *cat, const char *name, double t0,
                                double t1, const char *args)
{
    pdp__trace_record('X', pid, tid, cat, name, 0, t0, t1, args);
}

/* An async begin/end pair (a collective from launch to completion, which may
   overlap the compute track); id distinguishes concurrent pairs of one name. */
static void pdp__trace_async(int pid, int tid, const char *cat, const char *name, uint64_t id,
                             double t0, double t1, const char *args)
{
    pdp__trace_record('A', pid, tid, cat, name, id, t0, t1, args);
}

/* ---- trace: public ---- */

PDP_API pdp_status pdp_trace_flush(void)
{
    pdp__trace_sink *s = &pdp__trace_g;
    pdp_status st = PDP_OK;
    pthread_mutex_lock(&pdp__trace_mu);
    if (s->f) {
        pdp__trace_write_locked(s);
        if (s->io_status != PDP_OK)
            st = pdp__err(s->io_status, "pdp_trace_flush: writing '%s' failed", s->path);
    }
    pthread_mutex_unlock(&pdp__trace_mu);
    return st;
}
/* ---- end src/trace.c ---- */

/* ---- begin src/store.c ---- */
/* store: a TCP key-value store, PyTorch's TCPStore in miniature (rendezvous.c reads
   who the ranks are and hands a unique id out through it).

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
   _GNU_SOURCE (as seen when <string.h> was first included) and XSI otherwise. */
static const char *pdp__store_errstr(int e, char *buf, size_t cap)
{
#if defined(__GLIBC__) && defined(__USE_GNU) /* what <features.h> saw, not what is defined now */
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
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                pdp__store_sleep(0.01); /* EMFILE and the like: retry soon, without spinning */
            return;
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

/* Sends out[0..bytes) or, with out NULL, receives into in[0..bytes), all of it by
   deadline: 0, or -1 with why filled. */
static int pdp__store_io(int fd, const unsigned char *out, unsigned char *in, size_t bytes,
                         double deadline, char *why, size_t cap)
{
    size_t done = 0;
    while (done < bytes) {
        ssize_t r = out ? send(fd, out + done, bytes - done, MSG_NOSIGNAL)
                        : recv(fd, in + done, bytes - done, 0);
        if (r > 0) {
            done += (size_t)r;
        } else if (r == 0) {
            snprintf(why, cap, "the server closed the connection");
            return -1;
        } else if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
            int ready = pdp__store_poll1(fd, out ? POLLOUT : POLLIN, deadline);
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

static int pdp__store_send_all(int fd, const void *buf, size_t bytes, double deadline, char *why,
                               size_t cap)
{
    return pdp__store_io(fd, (const unsigned char *)buf, NULL, bytes, deadline, why, cap);
}

static int pdp__store_recv_all(int fd, void *buf, size_t bytes, double deadline, char *why,
                               size_t cap)
{
    return pdp__store_io(fd, NULL, (unsigned char *)buf, bytes, deadline, why, cap);
}

/* Reads bytes from the connection into buf[0..cap) and throws away the rest. */
static int pdp__store_recv_into(int fd, void *buf, size_t cap, size_t bytes, double deadline,
                                char *why, size_t why_cap)
{
    unsigned char sink[4096];
    size_t keep = PDP__MIN(cap, bytes);
    if (keep && pdp__store_recv_all(fd, buf, keep, deadline, why, why_cap) != 0) return -1;
    for (bytes -= keep; bytes > 0; bytes -= PDP__MIN(bytes, sizeof sink))
        if (pdp__store_recv_all(fd, sink, PDP__MIN(bytes, sizeof sink), deadline, why,
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
    if (pdp__store_send_all(s->fd, head, PDP__STORE_HDR + key_bytes, deadline, why,
                            sizeof why) != 0 ||
        (value_bytes &&
         pdp__store_send_all(s->fd, value, value_bytes, deadline, why, sizeof why) != 0) ||
        pdp__store_recv_all(s->fd, head, PDP__STORE_HDR, deadline, why, sizeof why) != 0)
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
    if (d.port < 0 || d.port > 65535)
        return pdp__err(PDP_ERR_INVALID, "pdp_store_create: port %d is outside 0..65535", d.port);
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
                        "PDP_STORE_MAX_VALUE (%lu)", key, bytes,
                        (unsigned long)PDP_STORE_MAX_VALUE);
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

/* ---- begin src/cuda_host.c ---- */
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

/* #include "internal.h" (already above) */

#define PDP__NO_CUDA_MSG "built without PDP_CUDA (compile with -DPDP_CUDA and link pdp_cuda.o)"

#ifdef PDP_CUDA
/* ---- cuda_host: errors ---- */

/* Turns a failed pdp_cudak_* status into pdp's message. */
static pdp_status pdp__cuda_fail(pdp_status st)
{
    return pdp__err(st, "pdp_cuda: %s", pdp_cudak_error());
}

#define PDP__CUDA_TRY(call)                                                  \
    do {                                                                     \
        pdp_status pdp__cst = (call);                                        \
        if (pdp__cst != PDP_OK) return pdp__cuda_fail(pdp__cst);             \
    } while (0)

static int pdp__cuda_ordinal(pdp_device d) { return d.kind == PDP_DEVICE_CPU ? -1 : d.ordinal; }
#endif

/* ---- cuda_host: memory ---- */

static pdp_status pdp__dev_alloc(pdp_device d, size_t bytes, void **out)
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

static void pdp__dev_free(pdp_device d, void *p)
{
    if (d.kind == PDP_DEVICE_CPU) pdp__dealloc(p);
#ifdef PDP_CUDA
    else pdp_cudak_free(d.ordinal, p);
#endif
}

static pdp_status pdp__dev_memset0(pdp_device d, void *p, size_t bytes)
{
    if (d.kind == PDP_DEVICE_CPU) {
        memset(p, 0, bytes);
        return PDP_OK;
    }
#ifdef PDP_CUDA
    PDP__CUDA_TRY(pdp_cudak_memset0(d.ordinal, p, bytes));
    return PDP_OK;
#else
    return pdp__err(PDP_ERR_UNSUPPORTED, "CUDA device %d: " PDP__NO_CUDA_MSG, d.ordinal);
#endif
}

static pdp_status pdp__dev_fill(pdp_device d, float *p, int64_t count, float value)
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

static pdp_status pdp__dev_copy(pdp_device dst_dev, void *dst, pdp_device src_dev, const void *src,
                                size_t bytes)
{
    if (dst_dev.kind == PDP_DEVICE_CPU && src_dev.kind == PDP_DEVICE_CPU) {
        if (dst != src) memmove(dst, src, bytes);
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

static pdp_status pdp__dev_add(pdp_device d, float *PDP__RESTRICT dst,
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
static pdp_status pdp__cuda_check_device(pdp_device d, const char *fn)
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

/* ---- cuda_host: losses ----
   The same contract as loss.c's pdp__cross_entropy, logits and dlogits on
   device d: labels (host memory) are checked here in sample order, the device
   computes per-sample losses, and the host sums them in sample order. */

static pdp_status pdp__cuda_cross_entropy(pdp_device d, const float *logits, const int32_t *labels,
                                          int64_t batch, int64_t classes, float grad_scale,
                                          double *loss_sum, float *dlogits, const char *fn)
{
#ifdef PDP_CUDA
    double *loss = (double *)pdp__thread_scratch((size_t)batch * sizeof(double)), total = 0.0;
    int64_t i;
    pdp_status st;
    *loss_sum = 0.0;
    if (!loss) return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory for %lld losses", fn,
                               (long long)batch);
    for (i = 0; i < batch; i++)
        if (labels[i] < 0 || labels[i] >= classes)
            return pdp__err(PDP_ERR_INVALID, "%s: label %ld at sample %lld is outside [0, %lld)",
                            fn, (long)labels[i], (long long)i, (long long)classes);
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
    *loss_sum = 0.0;
    return pdp__err(PDP_ERR_UNSUPPORTED, "%s: CUDA device %d: " PDP__NO_CUDA_MSG, fn, d.ordinal);
#endif
}

/* Sum of squared differences (double) and dpred = scale (pred - target), on d. */
static pdp_status pdp__cuda_mse(pdp_device d, const float *pred, const float *target,
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

static pdp_status pdp__cuda_sumsq(pdp_device d, const float *x, int64_t count, double *sum,
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

static pdp_status pdp__cuda_scale(pdp_device d, float *x, int64_t count, float s, const char *fn)
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
static pdp_status pdp__dev_to16(pdp_device d, void *dst, const float *src, int64_t count,
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

static pdp_status pdp__dev_from16(pdp_device d, float *dst, const void *src, int64_t count,
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

static pdp_status pdp__cuda_optim_update(pdp_device d, const struct pdp__optim_scalars *s,
                                         float *p, const float *g, float *s0, float *s1, int64_t n)
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
/* ---- end src/cuda_host.c ---- */

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
        if (!pdp__mul_ok(n, shape[i], &n))
            return pdp__err(PDP_ERR_SHAPE, "%s: element count overflows at dimension %d (more "
                            "than %lld elements)", fn, i, (long long)PDP__COUNT_MAX);
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
    int64_t count = 0; /* set by pdp__check_shape; 0 keeps -Wmaybe-uninitialized quiet */
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
    int64_t count = 0; /* set by pdp__check_shape; 0 keeps -Wmaybe-uninitialized quiet */
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
    int64_t count = 0; /* set by pdp__check_shape; 0 keeps -Wmaybe-uninitialized quiet */
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
       for each KC-deep block of k           (pc)   pack op(B) block, KC x NC  (L2/L3)
         for each MR-tall row panel          (ir)   pack op(A) panel, MR x KC  (L1)
           for each NR-wide column panel     (jr)   micro-kernel: MR x NR tile of C

   The A panel stays in L1 while the B block streams past it (128 bytes of B per
   16 FMAs on AVX-512, well within L2 or even L3 bandwidth), so the A panel is
   packed right before use and there is no MC level.
   The micro-kernel keeps an MR x NR tile of C in registers and adds one rank-1
   update per k: NR floats of packed B are loaded, MR floats of packed A are
   broadcast, MR * NR / VL fused multiply-adds. Kernels by instruction set:
   AVX-512F 8 x 32 (16 zmm accumulators), AVX2+FMA 6 x 16 (12 ymm), and portable
   C 4 x 16 (what -DPDP_NO_SIMD or a plain x86-64 target gets). Packing pads
   partial panels with zeros, so the kernel always runs full tiles and masks only
   its stores. Packing a source that is contiguous in k (A in NN and NT, B in NT
   and TT) is a transpose, done 8 x 8 in AVX registers when AVX is there. With
   -DPDP_CBLAS the whole call goes to cblas_sgemm instead.

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

/* C = beta C: a product with nothing to add (k == 0 or alpha == 0); with beta == 0, C
   is written without being read. pdp_gemm_bf16 shares it. */
static void pdp__gemm_scale_c(int64_t m, int64_t n, float beta, float *c, int64_t ldc)
{
    int64_t i, j;
    for (i = 0; i < m; i++) {
        float *ci = c + i * ldc;
        for (j = 0; j < n; j++) ci[j] = beta != 0.0f ? beta * ci[j] : 0.0f;
    }
}

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

/* Plain loops: with PDP_CBLAS, Conv2d takes its im2col path and never calls this. */
static void pdp__sgemm_rows(pdp_trans ta, pdp_trans tb, int64_t m, int64_t n, int64_t k,
                            float alpha, const float *a, int64_t lda, const float *b,
                            const int64_t *brow, float beta, float *c, int64_t ldc)
{
    int64_t i, j, p;
    for (i = 0; i < m; i++)
        for (j = 0; j < n; j++) {
            float acc = 0.0f;
            for (p = 0; p < k; p++)
                acc += (ta == PDP_NO_TRANS ? a[i * lda + p] : a[p * lda + i]) *
                       (tb == PDP_NO_TRANS ? b[brow[p] + j] : b[brow[j] + p]);
            c[i * ldc + j] = alpha * acc + (beta != 0.0f ? beta * c[i * ldc + j] : 0.0f);
        }
}

/* The work an m x n product does per k: m n here (see the other definition). */
static int64_t pdp__gemm_tiles(int64_t m, int64_t n) { return m * n; }

static void pdp__sgemm_arows(pdp_trans tb, int64_t m, int64_t n, int64_t k, float alpha,
                             const float *a, const int64_t *arow, const float *b, int64_t ldb,
                             float beta, float *c, int64_t ldc)
{
    int64_t i, j, p;
    for (i = 0; i < m; i++)
        for (j = 0; j < n; j++) {
            float acc = 0.0f;
            for (p = 0; p < k; p++)
                acc += a[arow[i] + p] * (tb == PDP_NO_TRANS ? b[p * ldb + j] : b[j * ldb + p]);
            c[i * ldc + j] = alpha * acc + (beta != 0.0f ? beta * c[i * ldc + j] : 0.0f);
        }
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

/* Lane masks of a tile's nr valid columns, one per vector of a B row (nv of them). */
static inline __attribute__((always_inline)) void pdp__gemm_col_masks(int nr, int nv,
                                                                      __mmask16 *mask)
{
    int v;
    _Pragma("GCC unroll 4") for (v = 0; v < nv; v++) {
        int left = nr - v * PDP__GEMM_VL;
        mask[v] = (__mmask16)(left >= PDP__GEMM_VL ? 0xffff : left <= 0 ? 0 : (1u << left) - 1);
    }
}

/* How every AVX-512 kernel ends: the top-left mr x nr of an MR x nv-vector tile of
   accumulators (acc[i nv + v], nv a constant after inlining) to c (row stride ldc)
   as alpha * acc + beta * c, reading c only when beta != 0; a full tile unmasked.
   Always inlined: a call would take acc's address and keep the accumulators in
   memory. */
static inline __attribute__((always_inline)) void pdp__gemm_store_acc(
    const __m512 *acc, int nv, float *c, int64_t ldc, int mr, int nr, float alpha, float beta)
{
    __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
    __mmask16 mask[4]; /* nv <= 4 */
    int i, v, full = mr == PDP__GEMM_MR && nr == nv * PDP__GEMM_VL;
    pdp__gemm_col_masks(nr, nv, mask);
    _Pragma("GCC unroll 16") for (i = 0; i < PDP__GEMM_MR; i++) {
        float *ci = c + i * ldc;
        if (i >= mr) break;
        _Pragma("GCC unroll 4") for (v = 0; v < nv; v++) {
            __m512 r = _mm512_mul_ps(va, acc[i * nv + v]);
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

/* The MR x NR tile of the packed kernels. */
static inline __attribute__((always_inline)) void pdp__gemm_store_tile(
    __m512 acc[PDP__GEMM_MR][PDP__GEMM_NV], float *c, int64_t ldc, int mr, int nr, float alpha,
    float beta)
{
    pdp__gemm_store_acc(&acc[0][0], PDP__GEMM_NV, c, ldc, mr, nr, alpha, beta);
}

static void pdp__gemm_kernel(int64_t kc, const float *PDP__GEMM_RESTRICT ap,
                             const float *PDP__GEMM_RESTRICT bp, float *c, int64_t ldc, int mr,
                             int nr, float alpha, float beta)
{
    __m512 acc[PDP__GEMM_MR][PDP__GEMM_NV];
    int i, v;
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
    pdp__gemm_store_tile(acc, c, ldc, mr, nr, alpha, beta);
}

/* The same tile with B read in place instead of packed: row p of the tile's B is
   the nr floats at b + brow[p] (a gathered B, pdp__sgemm_rows without transpose,
   whose rows are runs of a small image that stays in cache). Packing such a B
   costs as much as a tenth of the product when m is small (Conv2d's O rows), and
   this skips it. Masked loads read no float past column nr; same FMA chain as the
   packed kernel, so the same bits. */
#  define PDP__GEMM_DIRECT_B 1
static void pdp__gemm_kernel_rows(int64_t kc, const float *PDP__GEMM_RESTRICT ap,
                                  const float *b, const int64_t *brow, float *c, int64_t ldc,
                                  int mr, int nr, float alpha, float beta)
{
    __m512 acc[PDP__GEMM_MR][PDP__GEMM_NV];
    __mmask16 mask[PDP__GEMM_NV];
    int i, v;
    int64_t p;
    pdp__gemm_col_masks(nr, PDP__GEMM_NV, mask);
    _Pragma("GCC unroll 16") for (i = 0; i < PDP__GEMM_MR; i++) {
        _Pragma("GCC unroll 4") for (v = 0; v < PDP__GEMM_NV; v++) acc[i][v] = _mm512_setzero_ps();
    }
    for (p = 0; p < kc; p++) {
        const float *row = b + brow[p];
        __m512 bv[PDP__GEMM_NV];
        _Pragma("GCC unroll 4") for (v = 0; v < PDP__GEMM_NV; v++) {
            bv[v] = _mm512_maskz_loadu_ps(mask[v], row + v * PDP__GEMM_VL);
        }
        _Pragma("GCC unroll 16") for (i = 0; i < PDP__GEMM_MR; i++) {
            __m512 ai = _mm512_set1_ps(ap[i]);
            _Pragma("GCC unroll 4") for (v = 0; v < PDP__GEMM_NV; v++) {
                acc[i][v] = _mm512_fmadd_ps(ai, bv[v], acc[i][v]);
            }
        }
        ap += PDP__GEMM_MR;
    }
    pdp__gemm_store_tile(acc, c, ldc, mr, nr, alpha, beta);
}

/* The same tile with A read in place: row i of the tile's A is a8[i] (a gathered
   A, pdp__sgemm_arows; rows past mr repeat row 0 and are never stored), each
   element broadcast straight from its row, as the packed kernel broadcasts it
   from the panel. Same FMA chain, so the same bits. */
static void pdp__gemm_kernel_arows(int64_t kc, const float *const *a8,
                                   const float *PDP__GEMM_RESTRICT bp, float *c, int64_t ldc,
                                   int mr, int nr, float alpha, float beta)
{
    __m512 acc[PDP__GEMM_MR][PDP__GEMM_NV];
    const float *r[PDP__GEMM_MR];
    int i, v;
    int64_t p;
    for (i = 0; i < PDP__GEMM_MR; i++) r[i] = a8[i];
    _Pragma("GCC unroll 16") for (i = 0; i < PDP__GEMM_MR; i++) {
        _Pragma("GCC unroll 4") for (v = 0; v < PDP__GEMM_NV; v++) acc[i][v] = _mm512_setzero_ps();
    }
    for (p = 0; p < kc; p++) {
        __m512 bv[PDP__GEMM_NV];
        _Pragma("GCC unroll 4") for (v = 0; v < PDP__GEMM_NV; v++) {
            bv[v] = _mm512_load_ps(bp + v * PDP__GEMM_VL);
        }
        _Pragma("GCC unroll 16") for (i = 0; i < PDP__GEMM_MR; i++) {
            __m512 ai = _mm512_set1_ps(r[i][p]);
            _Pragma("GCC unroll 4") for (v = 0; v < PDP__GEMM_NV; v++) {
                acc[i][v] = _mm512_fmadd_ps(ai, bv[v], acc[i][v]);
            }
        }
        bp += PDP__GEMM_NV * PDP__GEMM_VL;
    }
    pdp__gemm_store_tile(acc, c, ldc, mr, nr, alpha, beta);
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
   KC). NC: columns of packed B per block. Both fixed, so the summation order never
   depends on the thread count. 512 and 512 measured best on Zen 4 (384 and 256 are
   within noise; see bench/gemm.c). */
#ifndef PDP__GEMM_KC
#  define PDP__GEMM_KC 512
#endif
#ifndef PDP__GEMM_NC
#  define PDP__GEMM_NC 512
#endif
/* Products below this many flops stay on the calling thread. With the pool's spin a
   hand-off costs a few microseconds, less than half of a 1.3 MFLOP product (the MLP's
   10-class layer at batch 128, ~40 us on one core): at 1e6 rather than 4e6 the MLP
   784-512-512-10 step at batch 128 on 2 threads was faster in 11 of 14 alternating
   runs, either order first, by a median of 9% (Zen 4, a noisy host: -17% to +23%). */
#ifndef PDP__GEMM_PAR_FLOPS
#  define PDP__GEMM_PAR_FLOPS 1.0e6
#endif

/* ---- gemm: packing ---- */

/* Packing op(A) with A not transposed, and op(B) with B transposed, is a transpose
   (the source is contiguous in k, the panel wants k-major). With AVX it goes 8 x 8
   at a time through registers; the rest is plain loops. */
#if !defined(PDP_NO_SIMD) && defined(__AVX__)
#  include <immintrin.h>
#  define PDP__GEMM_T8 1

/* dst[q * ldd + r] = s[r][p + q] for r, q in [0, 8). */
static void pdp__gemm_transpose8(const float *const *s, int64_t p, float *dst, int64_t ldd)
{
    __m256 r0 = _mm256_loadu_ps(s[0] + p), r1 = _mm256_loadu_ps(s[1] + p);
    __m256 r2 = _mm256_loadu_ps(s[2] + p), r3 = _mm256_loadu_ps(s[3] + p);
    __m256 r4 = _mm256_loadu_ps(s[4] + p), r5 = _mm256_loadu_ps(s[5] + p);
    __m256 r6 = _mm256_loadu_ps(s[6] + p), r7 = _mm256_loadu_ps(s[7] + p);
    __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
    __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
    __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
    __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
    __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xee);
    __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xee);
    __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xee);
    __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xee);
    _mm256_storeu_ps(dst, _mm256_permute2f128_ps(u0, u4, 0x20));
    _mm256_storeu_ps(dst + ldd, _mm256_permute2f128_ps(u1, u5, 0x20));
    _mm256_storeu_ps(dst + 2 * ldd, _mm256_permute2f128_ps(u2, u6, 0x20));
    _mm256_storeu_ps(dst + 3 * ldd, _mm256_permute2f128_ps(u3, u7, 0x20));
    _mm256_storeu_ps(dst + 4 * ldd, _mm256_permute2f128_ps(u0, u4, 0x31));
    _mm256_storeu_ps(dst + 5 * ldd, _mm256_permute2f128_ps(u1, u5, 0x31));
    _mm256_storeu_ps(dst + 6 * ldd, _mm256_permute2f128_ps(u2, u6, 0x31));
    _mm256_storeu_ps(dst + 7 * ldd, _mm256_permute2f128_ps(u3, u7, 0x31));
}
#else
#  define PDP__GEMM_T8 0
#endif

/* Source row r of a packing routine: src + off[r] with a row-offset table (the
   gathered B of pdp__sgemm_rows), else src + r * lds. */
static const float *pdp__gemm_row(const float *src, int64_t lds, const int64_t *off, int64_t r)
{
    return off ? src + off[r] : src + r * lds;
}

/* rows x kc of a source contiguous in k (row r at pdp__gemm_row) into
   dst[p * ldd + r]; the part of [0, ldd) past `rows` is zeroed. With AVX, groups of
   8 rows go through pdp__gemm_transpose8, and so does a last partial group when the
   panel has room for 8, its missing rows read from a row of zeros (a ragged edge,
   N = 25 say, would otherwise be packed and zeroed one strided float at a time). */
#if PDP__GEMM_T8
static const float pdp__gemm_zeros[PDP__GEMM_KC] = {0};
#endif

static void pdp__gemm_pack_t(const float *src, int64_t lds, const int64_t *off, int rows,
                             int64_t kc, float *dst, int64_t ldd)
{
    int r = 0;
    int64_t p;
#if PDP__GEMM_T8
    for (; r + 8 <= ldd && (r + 8 <= rows || (r < rows && kc <= PDP__GEMM_KC)); r += 8) {
        const float *s[8];
        int i;
        for (i = 0; i < 8; i++)
            s[i] = r + i < rows ? pdp__gemm_row(src, lds, off, r + i) : pdp__gemm_zeros;
        for (p = 0; p + 8 <= kc; p += 8) pdp__gemm_transpose8(s, p, dst + p * ldd + r, ldd);
        for (; p < kc; p++) {
            for (i = 0; i < 8; i++) dst[p * ldd + r + i] = s[i][p];
        }
    }
    if (r >= rows) { /* the rest of the panel: zero, 8 columns at a time */
        for (; r + 8 <= ldd; r += 8)
            for (p = 0; p < kc; p++) memset(dst + p * ldd + r, 0, 8 * sizeof(float));
    }
#endif
    for (; r < rows; r++) {
        const float *s = pdp__gemm_row(src, lds, off, r);
        for (p = 0; p < kc; p++) dst[p * ldd + r] = s[p];
    }
    for (; r < ldd; r++) {
        for (p = 0; p < kc; p++) dst[p * ldd + r] = 0.0f;
    }
}

/* kc x cols of a source contiguous in the panel's fast index (row p at
   pdp__gemm_row) into dst[p * ldd + j]; the part of [0, ldd) past `cols` is
   zeroed. Always inlined with a constant ldd (MR
   or NR), so that a full row is a fixed-size copy the compiler turns into vector
   moves: the plain loop of unknown length stays scalar at -O2 and cost a fifth of
   a 512^3 NN or TN product. */
static inline void pdp__gemm_pack_n(const float *src, int64_t lds, const int64_t *off, int cols,
                                    int64_t kc, float *dst, const int ldd)
{
    int64_t p;
    int j;
    if (cols == ldd) {
        for (p = 0; p < kc; p++)
            memcpy(dst + p * ldd, pdp__gemm_row(src, lds, off, p), (size_t)ldd * sizeof(float));
        return;
    }
    for (p = 0; p < kc; p++) {
        const float *s = pdp__gemm_row(src, lds, off, p);
        float *d = dst + p * ldd;
        for (j = 0; j < cols; j++) d[j] = s[j];
        for (; j < ldd; j++) d[j] = 0.0f;
    }
}

/* op(A) rows [0, mr) x columns [0, kc) (a points at op(A)(0, 0)) into ap[p * MR + i]. */
static void pdp__gemm_pack_a(pdp_trans ta, const float *a, int64_t lda, int mr, int64_t kc,
                             float *PDP__GEMM_RESTRICT ap)
{
    if (ta == PDP_NO_TRANS) /* op(A)(i, p) = a[i * lda + p] */
        pdp__gemm_pack_t(a, lda, NULL, mr, kc, ap, PDP__GEMM_MR);
    else /* op(A)(i, p) = a[p * lda + i] */
        pdp__gemm_pack_n(a, lda, NULL, mr, kc, ap, PDP__GEMM_MR);
}

/* op(B) rows [pc, pc + kc) x columns [jc, jc + nc) into panels of NR columns:
   bp[(j / NR) * kc * NR + p * NR + j % NR]. B's storage row r starts at
   b + r * ldb, or at b + brow[r] when the caller gave a row-offset table. */
static void pdp__gemm_pack_b(pdp_trans tb, const float *b, int64_t ldb, const int64_t *brow,
                             int64_t pc, int64_t jc, int64_t kc, int64_t nc,
                             float *PDP__GEMM_RESTRICT bp)
{
    int64_t j0;
    for (j0 = 0; j0 < nc; j0 += PDP__GEMM_NR) {
        int nr = (int)PDP__MIN((int64_t)PDP__GEMM_NR, nc - j0);
        int64_t j = jc + j0;
        if (tb == PDP_NO_TRANS) /* op(B)(p, j) = storage row p, element j */
            pdp__gemm_pack_n(brow ? b + j : b + pc * ldb + j, ldb, brow ? brow + pc : NULL, nr,
                             kc, bp + j0 * kc, PDP__GEMM_NR);
        else /* op(B)(p, j) = storage row j, element p */
            pdp__gemm_pack_t(brow ? b + pc : b + j * ldb + pc, ldb, brow ? brow + j : NULL, nr,
                             kc, bp + j0 * kc, PDP__GEMM_NR);
    }
}

/* ---- gemm: the blocked product on one thread ---- */

typedef struct pdp__gemm_args {
    pdp_trans ta, tb;
    int64_t m, n, k;
    float alpha, beta;
    const float *a, *b;
    const int64_t *brow; /* B's row offsets (pdp__sgemm_rows), or NULL: row r at b + r ldb */
    const int64_t *arow; /* A's row offsets (pdp__sgemm_arows; A not transposed), or NULL */
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
#if defined(PDP__GEMM_DIRECT_B)
            if (g->brow && g->tb == PDP_NO_TRANS) { /* B read in place */
                for (ir = m0; ir < m1; ir += PDP__GEMM_MR) {
                    int mr = (int)PDP__MIN((int64_t)PDP__GEMM_MR, m1 - ir);
                    const float *asrc = g->ta == PDP_NO_TRANS ? g->a + ir * g->lda + pc
                                                              : g->a + pc * g->lda + ir;
                    pdp__gemm_pack_a(g->ta, asrc, g->lda, mr, kc, ap);
                    for (jr = 0; jr < nc; jr += PDP__GEMM_NR) {
                        int nr = (int)PDP__MIN((int64_t)PDP__GEMM_NR, nc - jr);
                        pdp__gemm_kernel_rows(kc, ap, g->b + jc + jr, g->brow + pc,
                                              g->c + ir * g->ldc + jc + jr, g->ldc, mr, nr,
                                              g->alpha, beta);
                    }
                }
                continue;
            }
#endif
            pdp__gemm_pack_b(g->tb, g->b, g->ldb, g->brow, pc, jc, kc, nc, bp);
            for (ir = m0; ir < m1; ir += PDP__GEMM_MR) {
                int mr = (int)PDP__MIN((int64_t)PDP__GEMM_MR, m1 - ir);
                const float *asrc = g->ta == PDP_NO_TRANS ? g->a + ir * g->lda + pc
                                                          : g->a + pc * g->lda + ir;
                if (g->arow) {
#if defined(PDP__GEMM_DIRECT_B)
                    const float *a8[PDP__GEMM_MR];
                    int i;
                    for (i = 0; i < PDP__GEMM_MR; i++)
                        a8[i] = g->a + g->arow[ir + (i < mr ? i : 0)] + pc;
                    for (jr = 0; jr < nc; jr += PDP__GEMM_NR) {
                        int nr = (int)PDP__MIN((int64_t)PDP__GEMM_NR, nc - jr);
                        pdp__gemm_kernel_arows(kc, a8, bp + jr * kc,
                                               g->c + ir * g->ldc + jc + jr, g->ldc, mr, nr,
                                               g->alpha, beta);
                    }
                    continue;
#else
                    pdp__gemm_pack_t(g->a + pc, 0, g->arow + ir, mr, kc, ap, PDP__GEMM_MR);
#endif
                } else {
                    pdp__gemm_pack_a(g->ta, asrc, g->lda, mr, kc, ap);
                }
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
                float x = g->ta == PDP_NO_TRANS ? pdp__gemm_row(g->a, g->lda, g->arow, i)[p]
                                                : g->a[p * g->lda + i];
                float y = g->tb == PDP_NO_TRANS ? pdp__gemm_row(g->b, g->ldb, g->brow, p)[j]
                                                : pdp__gemm_row(g->b, g->ldb, g->brow, j)[p];
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

/* pdp_sgemm with B's storage rows at b + brow[r] (brow non-NULL) or b + r ldb. */
static void pdp__gemm_run(pdp_trans ta, pdp_trans tb, int64_t m, int64_t n, int64_t k,
                          float alpha, const float *a, int64_t lda, const int64_t *arow,
                          const float *b, int64_t ldb, const int64_t *brow, float beta, float *c,
                          int64_t ldc)
{
    pdp__gemm_args g;
    int threads, parts;
    int64_t blocks;
    if (m <= 0 || n <= 0) return;
    PDP_ASSERT(ldc >= n);
    if (k <= 0 || alpha == 0.0f) {
        pdp__gemm_scale_c(m, n, beta, c, ldc);
        return;
    }
    PDP_ASSERT(arow || lda >= (ta == PDP_NO_TRANS ? k : m));
    PDP_ASSERT(brow || ldb >= (tb == PDP_NO_TRANS ? n : k));
    g.ta = ta;
    g.tb = tb;
    g.m = m;
    g.n = n;
    g.k = k;
    g.alpha = alpha;
    g.beta = beta;
    g.a = a;
    g.b = b;
    g.brow = brow;
    g.arow = arow;
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

PDP_API void pdp_sgemm(pdp_trans ta, pdp_trans tb, int64_t m, int64_t n, int64_t k, float alpha,
                       const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                       float *c, int64_t ldc)
{
    pdp__gemm_run(ta, tb, m, n, k, alpha, a, lda, NULL, b, ldb, NULL, beta, c, ldc);
}

/* ---- gemm: gathered B ----
   pdp_sgemm whose B rows are anywhere: storage row r of B starts at b + brow[r], so
   op(B)(p, j) = b[brow[p] + j] (tb == PDP_NO_TRANS) or b[brow[j] + p] (PDP_TRANS).
   Conv2d's implicit im2col: row (c, ki, kj) of a sample's column matrix is one
   contiguous run of the zero-padded input, so the B packing reads the input itself
   and the column matrix is never written. Same blocking, threads and bits as
   pdp_sgemm on the materialised B. */

static void pdp__sgemm_rows(pdp_trans ta, pdp_trans tb, int64_t m, int64_t n, int64_t k,
                            float alpha, const float *a, int64_t lda, const float *b,
                            const int64_t *brow, float beta, float *c, int64_t ldc)
{
    pdp__gemm_run(ta, tb, m, n, k, alpha, a, lda, NULL, b, 0, brow, beta, c, ldc);
}

/* The work an m x n product does per k, padded to whole MR x NR tiles: what a
   caller that can compute C or C^T compares to pick the cheaper. */
static int64_t pdp__gemm_tiles(int64_t m, int64_t n)
{
    return pdp__gemm_round_up(m, PDP__GEMM_MR) * pdp__gemm_round_up(n, PDP__GEMM_NR);
}

/* C = alpha A op(B) + beta C with A's storage rows anywhere: row i of A starts at
   a + arow[i] (A not transposed). Conv2d's dW as dW^T = col dy^T, whose A is the
   implicit column matrix: with AVX-512 the kernel broadcasts A straight from the
   padded image, no packing. */
static void pdp__sgemm_arows(pdp_trans tb, int64_t m, int64_t n, int64_t k, float alpha,
                             const float *a, const int64_t *arow, const float *b, int64_t ldb,
                             float beta, float *c, int64_t ldc)
{
    pdp__gemm_run(PDP_NO_TRANS, tb, m, n, k, alpha, a, 0, arow, b, ldb, NULL, beta, c, ldc);
}

#if defined(PDP__GEMM_DIRECT_B)
/* ---- gemm: gathered B, columns in runs ----
   C [m, n] = A [m, k] B (alpha 1, beta 0, on the calling thread) where B is gathered
   as in pdp__sgemm_rows and only some of its columns are wanted: logical column
   L = (r runs + u) run + t, for r < rows, u < runs, t < run, is B's column
   r rstride + u ustride + t, and C holds the logical columns only. Conv2d's
   implicit GEMM: samples side by side with bands of padding between them, whose
   columns nobody reads. Each 16-lane vector of a tile is loaded as a few masked
   loads, one per run it meets, so no lane computes a band. Each C element is the
   same FMA chain over k, in the same k blocks, as in pdp__sgemm_rows. */
#  define PDP__GEMM_RUNS 1

/* Its tiles are MR x 48, not MR x 32: each vector of B costs this kernel one to
   three masked, unaligned loads, and three vectors spread them over 24 FMAs a k
   step instead of 16 (24 accumulators, 3 B vectors and a broadcast: 28 of the 32
   zmm registers). Conv2d's 16 -> 32 and 32 -> 16, 5 x 5 on 14 x 14, 8 samples:
   about 98-104 -> 106-109 GFLOP/s on one Zen 4 core (peak 117), best of 7 each. */
#  ifndef PDP__GEMM_RUNS_NV
#    define PDP__GEMM_RUNS_NV 3
#  endif
#  define PDP__GEMM_RUNS_NR (PDP__GEMM_RUNS_NV * PDP__GEMM_VL)

/* segs: the masked loads per vector (a constant after inlining, the rest of the
   masks zero when a vector has fewer), or 0: each vector's own count, nseg[v]. */
static inline __attribute__((always_inline)) void pdp__gemm_kernel_runs_n(
    int64_t kc, const float *PDP__GEMM_RESTRICT ap, const float *b, const int64_t *brow,
    const int64_t *soff, const __mmask16 *smask, const int *nseg, float *c, int64_t ldc, int mr,
    int nr, float beta, const int segs)
{
    __m512 acc[PDP__GEMM_MR][PDP__GEMM_RUNS_NV];
    __mmask16 sm[PDP__GEMM_RUNS_NV][3];
    int64_t so[PDP__GEMM_RUNS_NV][3];
    int i, v, s;
    int64_t p;
    for (v = 0; v < PDP__GEMM_RUNS_NV; v++)
        for (s = 0; s < 3; s++) {
            sm[v][s] = s < nseg[v] ? smask[v * PDP__GEMM_VL + s] : 0;
            so[v][s] = s < nseg[v] ? soff[v * PDP__GEMM_VL + s] : 0;
        }
    _Pragma("GCC unroll 16") for (i = 0; i < PDP__GEMM_MR; i++) {
        _Pragma("GCC unroll 4") for (v = 0; v < PDP__GEMM_RUNS_NV; v++) {
            acc[i][v] = _mm512_setzero_ps();
        }
    }
    for (p = 0; p < kc; p++) {
        const float *row = b + brow[p];
        __m512 bv[PDP__GEMM_RUNS_NV];
        _Pragma("GCC unroll 4") for (v = 0; v < PDP__GEMM_RUNS_NV; v++) {
            if (segs) {
                bv[v] = _mm512_maskz_loadu_ps(sm[v][0], row + so[v][0]);
                _Pragma("GCC unroll 4") for (s = 1; s < segs; s++)
                    bv[v] = _mm512_mask_loadu_ps(bv[v], sm[v][s], row + so[v][s]);
            } else {
                const int64_t *o = soff + v * PDP__GEMM_VL;
                const __mmask16 *mk = smask + v * PDP__GEMM_VL;
                bv[v] = _mm512_maskz_loadu_ps(mk[0], row + o[0]);
                for (s = 1; s < nseg[v]; s++)
                    bv[v] = _mm512_mask_loadu_ps(bv[v], mk[s], row + o[s]);
            }
        }
        _Pragma("GCC unroll 16") for (i = 0; i < PDP__GEMM_MR; i++) {
            __m512 ai = _mm512_set1_ps(ap[i]);
            _Pragma("GCC unroll 4") for (v = 0; v < PDP__GEMM_RUNS_NV; v++) {
                acc[i][v] = _mm512_fmadd_ps(ai, bv[v], acc[i][v]);
            }
        }
        ap += PDP__GEMM_MR;
    }
    /* beta 0 or 1: c = acc or c + acc */
    pdp__gemm_store_acc(&acc[0][0], PDP__GEMM_RUNS_NV, c, ldc, mr, nr, 1.0f, beta);
}

static void pdp__gemm_kernel_runs(int64_t kc, const float *PDP__GEMM_RESTRICT ap,
                                  const float *b, const int64_t *brow, const int64_t *soff,
                                  const __mmask16 *smask, const int *nseg, float *c, int64_t ldc,
                                  int mr, int nr, float beta)
{
    int most = 0, v;
    for (v = 0; v < PDP__GEMM_RUNS_NV; v++) most = PDP__MAX(most, nseg[v]);
    if (most == 1)
        pdp__gemm_kernel_runs_n(kc, ap, b, brow, soff, smask, nseg, c, ldc, mr, nr, beta, 1);
    else if (most == 2)
        pdp__gemm_kernel_runs_n(kc, ap, b, brow, soff, smask, nseg, c, ldc, mr, nr, beta, 2);
    else if (most == 3)
        pdp__gemm_kernel_runs_n(kc, ap, b, brow, soff, smask, nseg, c, ldc, mr, nr, beta, 3);
    else
        pdp__gemm_kernel_runs_n(kc, ap, b, brow, soff, smask, nseg, c, ldc, mr, nr, beta, 0);
}

/* The masked loads of the tile of nr logical columns that starts at column (r, u, t),
   which it advances by nr: vector v's lanes as nseg[v] loads, load s of lane mask
   smask[v VL + s] at B column soff[v VL + s] (lane 0's column). A run is cut into
   vectors' pieces, so each piece is one load unless it continues the last (no
   band between two runs); a vector with no lane keeps one empty load. */
static void pdp__gemm_runs_tile(int nr, int64_t run, int64_t runs, int64_t rstride,
                                int64_t ustride, int64_t *t, int64_t *u, int64_t *r,
                                int64_t *soff, __mmask16 *smask, int *nseg)
{
    int64_t end = -1; /* the B column after the last piece's */
    int l = 0, v;
    for (v = 0; v < PDP__GEMM_RUNS_NV; v++) {
        nseg[v] = 1;
        soff[v * PDP__GEMM_VL] = 0;
        smask[v * PDP__GEMM_VL] = 0;
    }
    while (l < nr) {
        int vl = l % PDP__GEMM_VL, vv = l / PDP__GEMM_VL, s = nseg[vv] - 1;
        int len = (int)PDP__MIN(run - *t, (int64_t)PDP__MIN(PDP__GEMM_VL - vl, nr - l));
        int64_t phys = *r * rstride + *u * ustride + *t;
        __mmask16 bits = (__mmask16)(((1u << len) - 1u) << vl);
        if (vl > 0 && phys == end) {
            smask[vv * PDP__GEMM_VL + s] |= bits;
        } else {
            s = vl > 0 ? s + 1 : 0;
            soff[vv * PDP__GEMM_VL + s] = phys - vl;
            smask[vv * PDP__GEMM_VL + s] = bits;
            nseg[vv] = s + 1;
        }
        end = phys + len;
        l += len;
        if ((*t += len) == run) {
            *t = 0;
            if (++*u == runs) {
                *u = 0;
                ++*r;
            }
        }
    }
}

static void pdp__sgemm_runs(int64_t m, int64_t k, const float *a, int64_t lda, const float *b,
                            const int64_t *brow, int64_t rows, int64_t runs, int64_t run,
                            int64_t rstride, int64_t ustride, float *c, int64_t ldc)
{
    float ap[PDP__GEMM_KC * PDP__GEMM_MR];
    int64_t soff[PDP__GEMM_RUNS_NR];
    __mmask16 smask[PDP__GEMM_RUNS_NR];
    int nseg[PDP__GEMM_RUNS_NV];
    int64_t n = rows * runs * run, blocks = (k + PDP__GEMM_KC - 1) / PDP__GEMM_KC;
    int64_t kb = (k + blocks - 1) / blocks, pc, ir, L0;
    for (pc = 0; pc < k; pc += kb) {
        int64_t kc = PDP__MIN(kb, k - pc);
        for (ir = 0; ir < m; ir += PDP__GEMM_MR) {
            int mr = (int)PDP__MIN((int64_t)PDP__GEMM_MR, m - ir);
            int64_t t = 0, u = 0, r = 0; /* logical column L0 = (r runs + u) run + t */
            pdp__gemm_pack_a(PDP_NO_TRANS, a + ir * lda + pc, lda, mr, kc, ap);
            for (L0 = 0; L0 < n; L0 += PDP__GEMM_RUNS_NR) {
                int nr = (int)PDP__MIN((int64_t)PDP__GEMM_RUNS_NR, n - L0);
                pdp__gemm_runs_tile(nr, run, runs, rstride, ustride, &t, &u, &r, soff, smask,
                                    nseg);
                pdp__gemm_kernel_runs(kc, ap, b, brow + pc, soff, smask, nseg,
                                      c + ir * ldc + L0, ldc, mr, nr, pc == 0 ? 0.0f : 1.0f);
            }
        }
    }
}
#endif

#endif /* PDP_CBLAS */

/* ---- gemm: small products as dot products ----
   C [m, n] = A B^T for an m x n too small to pay for packing and a long k (Conv2d's
   dW share of a layer with few weights: 16 x 25 over thousands of columns): row i of
   A at a + i lda, row j of B at b + brow[j]. Blocks of 4 x 5 dot products (20
   accumulators, 9 loads per 20 FMAs; 16 x 25 is 4 x 5 whole blocks, where 4 x 4
   blocks computed 28 columns for 25) run in 16-float lanes over k in slices of
   PDP__GEMM_DOTS_KC (A's and B's slices stay in L1), the lanes kept on the stack
   between slices, and are reduced at the end in a fixed order: the bits depend on
   m, n, k and the data only (not on the block shape). */
#define PDP__GEMM_DOTS_MI 4    /* rows of A per block */
#define PDP__GEMM_DOTS_NJ 5    /* rows of B per block */
#define PDP__GEMM_DOTS_MAX 512 /* lanes of the blocks, counted whole */
#define PDP__GEMM_DOTS_KC 512

static int pdp__sgemm_dots_fits(int64_t m, int64_t n)
{
    return (m + PDP__GEMM_DOTS_MI - 1) / PDP__GEMM_DOTS_MI *
               ((n + PDP__GEMM_DOTS_NJ - 1) / PDP__GEMM_DOTS_NJ) * PDP__GEMM_DOTS_MI *
               PDP__GEMM_DOTS_NJ <=
           PDP__GEMM_DOTS_MAX;
}

#if !defined(PDP_CBLAS) && !defined(PDP_NO_SIMD) && defined(__AVX512F__)
static void pdp__sgemm_dots(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                            const float *b, const int64_t *brow, float *c, int64_t ldc)
{
    enum { MI = PDP__GEMM_DOTS_MI, NJ = PDP__GEMM_DOTS_NJ };
    __m512 lanes[PDP__GEMM_DOTS_MAX];
    int64_t i0, j0, p0, p, nb = (n + NJ - 1) / NJ;
    PDP_ASSERT(pdp__sgemm_dots_fits(m, n));
    for (p = 0; p < (m + MI - 1) / MI * nb * MI * NJ; p++) lanes[p] = _mm512_setzero_ps();
    for (p0 = 0; p0 < k; p0 += PDP__GEMM_DOTS_KC)
        for (i0 = 0; i0 < m; i0 += MI)
            for (j0 = 0; j0 < n; j0 += NJ) {
                const float *ar[MI], *br[NJ];
                __m512 acc[MI][NJ], *save = lanes + (i0 / MI * nb + j0 / NJ) * MI * NJ;
                int64_t p1 = PDP__MIN(k, p0 + PDP__GEMM_DOTS_KC);
                int i, j;
                /* rows past the edge repeat the last one: computed, never stored */
                _Pragma("GCC unroll 8") for (i = 0; i < MI; i++) {
                    ar[i] = a + PDP__MIN(i0 + i, m - 1) * lda;
                    _Pragma("GCC unroll 8") for (j = 0; j < NJ; j++) {
                        acc[i][j] = save[i * NJ + j];
                    }
                }
                _Pragma("GCC unroll 8") for (j = 0; j < NJ; j++) {
                    br[j] = b + brow[PDP__MIN(j0 + j, n - 1)];
                }
                for (p = p0; p < p1; p += 16) {
                    __mmask16 mk = (__mmask16)(p + 16 <= p1 ? 0xffff : (1u << (p1 - p)) - 1);
                    __m512 va[MI], vb[NJ];
                    _Pragma("GCC unroll 8") for (i = 0; i < MI; i++) {
                        va[i] = _mm512_maskz_loadu_ps(mk, ar[i] + p);
                    }
                    _Pragma("GCC unroll 8") for (j = 0; j < NJ; j++) {
                        vb[j] = _mm512_maskz_loadu_ps(mk, br[j] + p);
                    }
                    _Pragma("GCC unroll 8") for (i = 0; i < MI; i++) {
                        _Pragma("GCC unroll 8") for (j = 0; j < NJ; j++) {
                            acc[i][j] = _mm512_fmadd_ps(va[i], vb[j], acc[i][j]);
                        }
                    }
                }
                _Pragma("GCC unroll 8") for (i = 0; i < MI; i++) {
                    _Pragma("GCC unroll 8") for (j = 0; j < NJ; j++) {
                        save[i * NJ + j] = acc[i][j];
                    }
                }
            }
    for (i0 = 0; i0 < m; i0++)
        for (j0 = 0; j0 < n; j0++)
            c[i0 * ldc + j0] = _mm512_reduce_add_ps(
                lanes[(i0 / MI * nb + j0 / NJ) * MI * NJ + i0 % MI * NJ + j0 % NJ]);
}
#else
static void pdp__sgemm_dots(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                            const float *b, const int64_t *brow, float *c, int64_t ldc)
{
    int64_t i, j, p;
    for (i = 0; i < m; i++)
        for (j = 0; j < n; j++) {
            float acc = 0.0f;
            for (p = 0; p < k; p++) acc += a[i * lda + p] * b[brow[j] + p];
            c[i * ldc + j] = acc;
        }
}
#endif
/* ---- end src/gemm.c ---- */

/* ---- begin src/gemm_bf16.c ---- */
/* gemm_bf16: the bf16 mixed-precision matrix product behind pdp_gemm_bf16 (gemm.h),
   C = alpha * op(A) * op(B) + beta * C with op(A), op(B) rounded to bf16 and fp32
   everywhere else, as torch.autocast("cpu", dtype=torch.bfloat16) runs a Linear.

   Packing rounds both operands to bf16 (pdp__bf16_bits, src/math.h) and lays k out in
   pairs, the operand format of AVX512-BF16's vdpbf16ps: one 32-bit word holds
   (x[2p] low, x[2p+1] high); an odd k gets a zero pair half. A is packed in MR-row
   panels ([pair][row]), B in NR-column panels ([pair][column]). A part of the product
   packs an MC-row block of A at a time; in the first block it packs each NR-column
   panel of B as it reaches it, and the later blocks reuse those panels; the
   micro-kernel runs over the block's MR-row panels and keeps an MR x NR tile of C in
   registers over the whole k (k is not blocked: at the MLP's k <= 1024 a B panel,
   pairs x NR words, stays in L2). The avx512 and AMX paths pack with vcvtne2ps2bf16
   (16 values per instruction; rows along k transposed in registers, rows across k
   interleaved with vpermw), the emulation with pdp__bf16_bits; the words are the same
   but where a subnormal input becomes a zero or a subnormal bf16, read as zero by every
   kernel (the corner where they differ otherwise is handled: pdp__bf16_cvt2).

   Gathered operands (Conv2d's implicit GEMM, section "gathered operands"): one operand
   given as bf16 words (pdp__gemm_bf16_convert, which writes the words the path's
   packing would make, in place if asked) whose storage rows may sit anywhere, row s
   at h + off[s] (an offset table, as gemm.c's pdp__sgemm_rows): the packing reads
   them through the table and converts nothing; the panels, and so the bits, are those
   of the materialised operand.

   Invariants:
   - One arithmetic on every path (gemm.h states it): per element of C one chain of
     fp32 sums over the pairs, in order, from 0, flushing subnormals (DAZ/FTZ, as
     vdpbf16ps). The tile grid, the pairs and the chain depend on nothing but k, so
     the bits do not depend on the thread count or on how the parts are cut; the
     emulated path gives the AVX512 path's bits except for products below 2^-126.
   - Paths are chosen by CPUID (checked once, pthread_once) and the OS's XCR0: the
     AVX512 kernel needs AVX512F, AVX512BW (the packing's vpermw), AVX512DQ (its
     vfpclassps), AVX512-BF16 and the zmm state enabled; the AMX
     kernel AMX-TILE, AMX-BF16, the tile state in XCR0 (bits 17, 18) and Linux's
     permission to use it (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), asked
     once; refused: AVX512 or the emulation). Both are compiled under target
     attributes, so a plain x86-64 build has them; -DPDP_NO_SIMD or a non-x86 target
     leaves only the emulation (and AMX needs x86-64 Linux).
   - AMX's arithmetic (Intel SDM, TDPBF16PS): the same DAZ/FTZ chain of fp32 sums over
     the pairs in order, but its pseudo-code adds a pair's even product first (the
     AVX512 path and the emulation add the odd one first), and the SDM does not
     promise the hardware's internal order; so the AMX path is held to the bound
     (both are fp32 sums of the same exact products), not to the emulation's bits.
     It is still deterministic: its chain, too, depends on nothing but k.
   - Memory: packed panels live in the part's thread scratch (pdp__thread_scratch),
     reused from call to call; if it cannot grow, the emulated arithmetic runs
     unpacked, element by element, with the same bits as the emulated path. */

/* #include "internal.h" (already above) */

#define PDP__BF16_MR 8  /* rows of a C tile */
#define PDP__BF16_NR 32 /* columns of a C tile: two zmm of fp32 */
#define PDP__BF16_MC 256 /* rows of A packed at once */
/* Smaller products stay on the calling thread: as pdp_sgemm's PDP__GEMM_PAR_FLOPS (at
   1e6 rather than 2e6 the bf16 MLP step at batch 128 on 2 threads was faster in 5 of 6
   alternating runs, median +12%). */
#ifndef PDP__BF16_PAR_FLOPS
#  define PDP__BF16_PAR_FLOPS 1.0e6
#endif

#if !defined(PDP_NO_SIMD) && (defined(__x86_64__) || defined(__i386__)) && \
    (defined(__GNUC__) || defined(__clang__))
#  define PDP__BF16_X86 1
#  include <cpuid.h>
#  include <immintrin.h>
#else
#  define PDP__BF16_X86 0
#endif
/* AMX: x86-64 Linux (the permission is an arch_prctl) and a compiler with the AMX
   intrinsics (gcc 11, clang 12) */
#if PDP__BF16_X86 && defined(__x86_64__) && defined(__linux__) && \
    (__GNUC__ >= 11 || (defined(__clang__) && __clang_major__ >= 12))
#  define PDP__BF16_AMX 1
#else
#  define PDP__BF16_AMX 0
#endif

/* ---- gemm_bf16: rounding and the element chain ---- */

PDP_API float pdp_bf16_round(float x) { return pdp__bf16_round(x); }

/* A bf16 as an fp32, subnormals as zero of the same sign (DAZ). */
static inline float pdp__bf16_daz(uint16_t h)
{
    return (h & 0x7f80u) ? pdp__bf16_float(h) : pdp__bf16_float((uint16_t)(h & 0x8000u));
}

/* acc + p with a subnormal result flushed to zero of its sign (FTZ). */
static inline float pdp__bf16_ftz_add(float acc, float p)
{
    float r = acc + p;
    return (r < 1.17549435e-38f && r > -1.17549435e-38f) ? r * 0.0f : r;
}

/* alpha acc + beta c, as every path writes it (beta c rounded, then the sum). */
static inline float pdp__bf16_out(float acc, float alpha, float beta, const float *c)
{
    float r = alpha * acc;
    if (beta != 0.0f) {
        float bc = beta * *c;
        r = bc + r;
    }
    return r;
}

/* ---- gemm_bf16: CPU features ---- */

static pthread_once_t pdp__bf16_once = PTHREAD_ONCE_INIT;
static int pdp__bf16_has_avx512; /* written once under pdp__bf16_once */
static int pdp__bf16_has_amx;    /* written once under pdp__bf16_once */

#if PDP__BF16_AMX
/* Linux's arch_prctl(ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18): lets this
   process use the AMX tile data (Linux 5.16 and later; before, or refused: an error).
   The raw syscall (158 on x86-64): syscall(2) is not declared under strict C99's
   _POSIX_C_SOURCE. 0 on success, else -errno. */
static long pdp__bf16_amx_permit(void)
{
    long ret;
    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "0"(158L), "D"(0x1023L), "S"(18L)
                     : "rcx", "r11", "memory");
    return ret;
}
#endif

static void pdp__bf16_detect(void)
{
#if PDP__BF16_X86
    unsigned a, b, c, d, xcr0_lo = 0, xcr0_hi = 0;
    unsigned b7 = 0, c7 = 0, d7 = 0, a71 = 0;
    (void)xcr0_hi;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return; /* OSXSAVE */
    __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
    if (__get_cpuid_count(7, 0, &a, &b7, &c7, &d7) && a >= 1)
        __get_cpuid_count(7, 1, &a71, &b, &c, &d);
    /* XCR0: SSE, AVX, opmask, ZMM_Hi256, Hi16_ZMM enabled by the OS */
    pdp__bf16_has_avx512 = (xcr0_lo & 0xe6u) == 0xe6u && (b7 & (1u << 16)) &&
                           (b7 & (1u << 17)) && (b7 & (1u << 30)) &&
                           (a71 & (1u << 5)); /* AVX512F, AVX512DQ, AVX512BW, AVX512-BF16 */
#  if PDP__BF16_AMX
    /* CPUID.7.0 EDX: AMX-BF16 (bit 22), AMX-TILE (24); XCR0: XTILECFG (17), XTILEDATA
       (18); then the kernel's permission, asked once for the process */
    pdp__bf16_has_amx = (d7 & (1u << 22)) && (d7 & (1u << 24)) &&
                        (xcr0_lo & 0x60000u) == 0x60000u && pdp__bf16_amx_permit() == 0;
#  endif
#endif
}

PDP_API bool pdp_bf16_path_available(pdp_bf16_path path)
{
    pthread_once(&pdp__bf16_once, pdp__bf16_detect);
    switch (path) {
    case PDP_BF16_PATH_AUTO:
    case PDP_BF16_PATH_EMULATED: return true;
    case PDP_BF16_PATH_AVX512: return pdp__bf16_has_avx512 != 0;
    case PDP_BF16_PATH_AMX: return pdp__bf16_has_amx != 0;
    }
    return false;
}

PDP_API pdp_bf16_path pdp_bf16_best_path(void)
{
    if (pdp_bf16_path_available(PDP_BF16_PATH_AMX)) return PDP_BF16_PATH_AMX;
    return pdp_bf16_path_available(PDP_BF16_PATH_AVX512) ? PDP_BF16_PATH_AVX512
                                                         : PDP_BF16_PATH_EMULATED;
}

PDP_API const char *pdp_bf16_path_name(pdp_bf16_path path)
{
    switch (path) {
    case PDP_BF16_PATH_AUTO: return "auto";
    case PDP_BF16_PATH_EMULATED: return "emulated";
    case PDP_BF16_PATH_AVX512: return "avx512-bf16";
    case PDP_BF16_PATH_AMX: return "amx-bf16";
    }
    return "unknown";
}

/* ---- gemm_bf16: packing ---- */

/* op(X)(r, p) of an operand stored row-major with stride ld. */
static inline float pdp__bf16_at(const float *x, int64_t ld, pdp_trans t, int64_t r, int64_t p)
{
    return t == PDP_NO_TRANS ? x[r * ld + p] : x[p * ld + r];
}

/* Rows [r0, r0 + rows) of op(X) (rows x k) into pair words, `width` words per pair
   (width >= rows; the rest zero): dst[p * width + i] = (x(r0+i, 2p), x(r0+i, 2p+1)). */
static void pdp__bf16_pack_panel(const float *x, int64_t ld, pdp_trans t, int64_t r0, int rows,
                                 int64_t k, int width, uint32_t *dst)
{
    int64_t p, pairs = (k + 1) / 2;
    int i;
    for (p = 0; p < pairs; p++) {
        uint32_t *d = dst + p * width;
        for (i = 0; i < rows; i++) {
            uint32_t lo = pdp__bf16_bits(pdp__bf16_at(x, ld, t, r0 + i, 2 * p));
            uint32_t hi = 2 * p + 1 < k ? pdp__bf16_bits(pdp__bf16_at(x, ld, t, r0 + i, 2 * p + 1))
                                        : 0u;
            d[i] = lo | hi << 16;
        }
        for (; i < width; i++) d[i] = 0u;
    }
}

/* Rows [r0, r0 + rows) of op(X) as ceil(rows / width) panels of `width` rows, panel j
   at dst + j * pairs * width (the last one zero-padded). */
static void pdp__bf16_pack(const float *x, int64_t ld, pdp_trans t, int64_t r0, int rows,
                           int64_t k, int width, uint32_t *dst)
{
    int64_t pairs = (k + 1) / 2;
    int j;
    for (j = 0; j < rows; j += width)
        pdp__bf16_pack_panel(x, ld, t, r0 + j, PDP__MIN(width, rows - j), k, width,
                             dst + j / width * pairs * width);
}

/* op(X)(r, p) of an operand already in bf16 words, storage row s at h + off[s]. */
static inline uint32_t pdp__bf16_hat(const uint16_t *h, const int64_t *off, pdp_trans t,
                                     int64_t r, int64_t p)
{
    return t == PDP_NO_TRANS ? h[off[r] + p] : h[off[p] + r];
}

/* pdp__bf16_pack for an operand already in bf16 words (pdp__gemm_bf16_convert's), its
   storage rows through off: the same panels, nothing to round. */
static void pdp__bf16_pack_h(const uint16_t *h, const int64_t *off, pdp_trans t, int64_t r0,
                             int rows, int64_t k, int width, uint32_t *dst)
{
    int64_t p, pairs = (k + 1) / 2;
    int i, j;
    for (j = 0; j < rows; j += width) {
        int n = PDP__MIN(width, rows - j);
        for (p = 0; p < pairs; p++) {
            uint32_t *d = dst + j / width * pairs * width + p * width;
            for (i = 0; i < n; i++)
                d[i] = pdp__bf16_hat(h, off, t, r0 + j + i, 2 * p) |
                       (2 * p + 1 < k ? pdp__bf16_hat(h, off, t, r0 + j + i, 2 * p + 1) << 16
                                      : 0u);
            for (; i < width; i++) d[i] = 0u;
        }
    }
}

/* x[0, n) as bf16 words (pdp__bf16_bits) into h. h may be x's own memory (h == (uint16_t
   *)x): word i is written after float i is read, at byte 2i, where float i / 2 was. */
static void pdp__bf16_convert_emul(const float *x, uint16_t *h, int64_t n)
{
    int64_t i;
    for (i = 0; i < n; i++) {
        float f;
        uint16_t w;
        memcpy(&f, (const char *)x + 4 * i, sizeof f); /* bytes: h may alias x */
        w = pdp__bf16_bits(f);
        memcpy((char *)h + 2 * i, &w, sizeof w);
    }
}

#if PDP__BF16_X86
#  define PDP__BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512dq,avx512bf16")))

/* pdp__bf16_cvt2 where some lane is subnormal. */
PDP__BF16_TARGET static __m512i pdp__bf16_cvt2_subnormal(__m512 lo, __m512 hi)
{
    const __m512i absm = _mm512_set1_epi32(0x7fffffff), least = _mm512_set1_epi32(0x00800000);
    const __m512i base = _mm512_set1_epi32(0x007f8000), span = _mm512_set1_epi32(0x8000);
    __m512i l = _mm512_castps_si512(lo), h = _mm512_castps_si512(hi);
    __m512i la = _mm512_and_si512(l, absm), ha = _mm512_and_si512(h, absm);
    __mmask16 lk = _mm512_cmplt_epu32_mask(_mm512_sub_epi32(la, base), span);
    __mmask16 hk = _mm512_cmplt_epu32_mask(_mm512_sub_epi32(ha, base), span);
    l = _mm512_mask_or_epi32(l, lk, _mm512_xor_si512(l, la), least);
    h = _mm512_mask_or_epi32(h, hk, _mm512_xor_si512(h, ha), least);
    return (__m512i)_mm512_cvtne2ps_pbh(_mm512_castsi512_ps(h), _mm512_castsi512_ps(l));
}

/* x rounded to bf16 by vcvtne2ps2bf16 (round to nearest even, a NaN quieted with its
   sign and top payload, as pdp__bf16_bits), 16 lanes at a time: lo's in words 0-15, hi's
   in 16-31. The instruction flushes subnormal inputs to zero of their sign (Intel SDM),
   where pdp__bf16_bits rounds them; the kernels read a subnormal bf16 as that zero
   (DAZ), so the two differ only where a subnormal fp32 rounds up to the least normal
   bf16 (|x| in [0x007f8000, 0x00800000) as bits): those lanes are set to that value
   (sign | 0x00800000) first, in a branch taken only when some lane is subnormal
   (vfpclassps, AVX512DQ). */
PDP__BF16_TARGET static inline __m512i pdp__bf16_cvt2(__m512 lo, __m512 hi)
{
    if (_kortestz_mask16_u8(_mm512_fpclass_ps_mask(lo, 0x20), /* denormals */
                            _mm512_fpclass_ps_mask(hi, 0x20)))
        return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
    return pdp__bf16_cvt2_subnormal(lo, hi);
}

/* 16 rows from `at` (mask m: those below rows) of x(., 2p) and x(., 2p + 1) for every
   pair p, as pair words to d + p width (wide: width >= 16; else width 8, rows 8-15 to
   d + panel + p width when two: both halves are in the padded rows); inlined with wide
   and two constant, so that the loop has no branch but the subnormal one. */
PDP__BF16_TARGET static inline __attribute__((always_inline)) void pdp__bf16_pack_rows16(
    const float *x, int64_t ld, int64_t at, __mmask16 m, int64_t k, int width, int64_t panel,
    const int wide, const int two, uint32_t *d)
{
    const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9,
                                         24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1,
                                         16, 0);
    int64_t p, pairs = (k + 1) / 2;
    for (p = 0; p < pairs; p++, d += width) {
        __m512 vlo = _mm512_maskz_loadu_ps(m, x + 2 * p * ld + at);
        __m512 vhi = 2 * p + 1 < k ? _mm512_maskz_loadu_ps(m, x + (2 * p + 1) * ld + at)
                                   : _mm512_setzero_ps();
        __m512i w = _mm512_permutexvar_epi16(idx, pdp__bf16_cvt2(vlo, vhi));
        if (wide) {
            _mm512_storeu_si512((void *)d, w);
        } else { /* width 8: rows i .. i + 7 and i + 8 .. i + 15 in two panels */
            _mm256_storeu_si256((__m256i *)d, _mm512_castsi512_si256(w));
            if (two) _mm256_storeu_si256((__m256i *)(d + panel), _mm512_extracti64x4_epi64(w, 1));
        }
    }
}

/* pdp__bf16_pack for an operand whose rows are contiguous (t == PDP_TRANS: x(r, p) =
   x[p * ld + r]): per pair, 16 rows of x(., 2p) and x(., 2p + 1) converted together and
   interleaved (word i = lo_i | hi_i << 16) by one vpermw, then stored to one panel
   (width a multiple of 16) or two (width 8). */
PDP__BF16_TARGET static void pdp__bf16_pack_rows(const float *x, int64_t ld, int64_t r0,
                                                 int rows, int64_t k, int width, uint32_t *dst)
{
    int64_t panel = (k + 1) / 2 * width;
    int i, padded = (rows + width - 1) / width * width;
    for (i = 0; i < padded; i += 16) { /* 16 rows at a time, all pairs: no division inside */
        int left = rows - i, two = i + 8 < padded;
        __mmask16 m = (__mmask16)(left >= 16 ? 0xffff : left <= 0 ? 0 : (1u << left) - 1);
        int64_t at = r0 + (left > 0 ? i : 0);
        uint32_t *d = dst + i / width * panel + i % width;
        if (width >= 16)
            pdp__bf16_pack_rows16(x, ld, at, m, k, width, panel, 1, 0, d);
        else if (two)
            pdp__bf16_pack_rows16(x, ld, at, m, k, width, panel, 0, 1, d);
        else
            pdp__bf16_pack_rows16(x, ld, at, m, k, width, panel, 0, 0, d);
    }
}

/* row i of the block: its 32 values from pair p0 as 16 pair words (zero past rows):
   converted, or from bf16 words (hrow) as they are */
#  define PDP__BF16_ROWW(i)                                                                   \
    (i0 + (i) >= rows ? _mm512_setzero_si512()                                                 \
     : hrow[0]        ? _mm512_maskz_loadu_epi16(mh, hrow[i] + 2 * p0)                          \
                      : pdp__bf16_cvt2(_mm512_maskz_loadu_ps(mlo, row[i] + 2 * p0),            \
                                       _mm512_maskz_loadu_ps(mhi, row[i] + 2 * p0 + 16)))
/* lane L of lo (rows 0-3) and hi (rows 4-7): pair 4L + q, stored if below np */
#  define PDP__BF16_PUT4(q, L, lo, hi)                                                        \
    do {                                                                                       \
        if (4 * (L) + (q) < np) {                                                              \
            uint32_t *dq = d + (4 * (L) + (q)) * (int64_t)width;                               \
            _mm_storeu_si128((__m128i *)dq, _mm512_extracti32x4_epi32(lo, L));                 \
            _mm_storeu_si128((__m128i *)(dq + 4), _mm512_extracti32x4_epi32(hi, L));           \
        }                                                                                      \
    } while (0)
#  define PDP__BF16_PUT(q, lo, hi)                                                            \
    do {                                                                                       \
        __m512i ulo = (lo), uhi = (hi);                                                        \
        PDP__BF16_PUT4(q, 0, ulo, uhi);                                                        \
        PDP__BF16_PUT4(q, 1, ulo, uhi);                                                        \
        PDP__BF16_PUT4(q, 2, ulo, uhi);                                                        \
        PDP__BF16_PUT4(q, 3, ulo, uhi);                                                        \
    } while (0)

/* pairs P, P + 1 (P = 4 L + q, q even) of the block from the q-th and (q + 1)-th
   quarters lo_q, hi_q (rows 0-3, 4-7; 128-bit lane L: pair 4 L + q) as one zmm of two
   8-word pair rows: [lo_q[L], hi_q[L], lo_q1[L], hi_q1[L]]; v, w: lo_q, lo_q1 and hi_q,
   hi_q1 with lanes L, L' interleaved */
#  define PDP__BF16_FULL2(q, lo0, hi0, lo1, hi1)                                              \
    do {                                                                                       \
        __m512i v = _mm512_permutex2var_epi64(lo0, i01, lo1);                                  \
        __m512i w = _mm512_permutex2var_epi64(hi0, i01, hi1);                                  \
        _mm512_storeu_si512((void *)(d + (q) * 8), _mm512_permutex2var_epi64(v, i01, w));      \
        _mm512_storeu_si512((void *)(d + (q + 4) * 8), _mm512_permutex2var_epi64(v, i23, w));  \
        v = _mm512_permutex2var_epi64(lo0, i23, lo1);                                          \
        w = _mm512_permutex2var_epi64(hi0, i23, hi1);                                          \
        _mm512_storeu_si512((void *)(d + (q + 8) * 8), _mm512_permutex2var_epi64(v, i01, w));  \
        _mm512_storeu_si512((void *)(d + (q + 12) * 8), _mm512_permutex2var_epi64(v, i23, w)); \
    } while (0)

/* pdp__bf16_pack for an operand whose rows run along k (t == PDP_NO_TRANS): blocks of 8
   rows x 16 pairs converted row by row (or, from bf16 words h, loaded: a pair is two
   adjacent words) and transposed in registers. A block of 16 whole pairs in a panel of
   width 8 is stored as 8 zmm of two pair rows each; the others lane by lane. Inlined
   with x or h NULL: x's rows at x + r ld, h's at h + off[r]. */
PDP__BF16_TARGET static inline __attribute__((always_inline)) void pdp__bf16_pack_k_core(
    const float *x, const uint16_t *h, int64_t ld, const int64_t *off, int64_t r0, int rows,
    int64_t k, int width, uint32_t *dst)
{
    /* qword indices of vpermt2q: 128-bit lanes 0, 1 (i01) or 2, 3 (i23) of the first
       source interleaved with the same lanes of the second */
    const __m512i i01 = _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0);
    const __m512i i23 = _mm512_set_epi64(15, 14, 7, 6, 13, 12, 5, 4);
    int64_t p0, pairs = (k + 1) / 2;
    int i0, i;
    for (i0 = 0; i0 < width; i0 += 8) {
        const float *row[8];     /* the block's rows (past rows: unread) */
        const uint16_t *hrow[8]; /* or its rows of bf16 words (hrow[0] NULL: none) */
        for (i = 0; i < 8; i++) {
            int in = i0 + i < rows;
            row[i] = x && in ? x + (r0 + i0 + i) * ld : x;
            hrow[i] = h ? h + (in ? off[r0 + i0 + i] : off[r0]) : NULL;
        }
        for (p0 = 0; p0 < pairs; p0 += 16) {
            int64_t vals = k - 2 * p0;
            int np = (int)PDP__MIN((int64_t)16, pairs - p0);
            __mmask16 mlo = (__mmask16)(vals >= 16 ? 0xffff : (1u << vals) - 1);
            __mmask16 mhi =
                (__mmask16)(vals >= 32 ? 0xffff : vals <= 16 ? 0 : (1u << (vals - 16)) - 1);
            __mmask32 mh = (__mmask32)(vals >= 32 ? 0xffffffffu : (1u << vals) - 1);
            __m512i w0, w1, w2, w3, w4, w5, w6, w7, t0, t1, t2, t3, t4, t5, t6, t7;
            __m512i l0, l1, l2, l3, h0, h1, h2, h3;
            uint32_t *d = dst + p0 * width + i0;
            w0 = PDP__BF16_ROWW(0), w1 = PDP__BF16_ROWW(1), w2 = PDP__BF16_ROWW(2);
            w3 = PDP__BF16_ROWW(3), w4 = PDP__BF16_ROWW(4), w5 = PDP__BF16_ROWW(5);
            w6 = PDP__BF16_ROWW(6), w7 = PDP__BF16_ROWW(7);
            t0 = _mm512_unpacklo_epi32(w0, w1), t1 = _mm512_unpackhi_epi32(w0, w1);
            t2 = _mm512_unpacklo_epi32(w2, w3), t3 = _mm512_unpackhi_epi32(w2, w3);
            t4 = _mm512_unpacklo_epi32(w4, w5), t5 = _mm512_unpackhi_epi32(w4, w5);
            t6 = _mm512_unpacklo_epi32(w6, w7), t7 = _mm512_unpackhi_epi32(w6, w7);
            l0 = _mm512_unpacklo_epi64(t0, t2), h0 = _mm512_unpacklo_epi64(t4, t6);
            l1 = _mm512_unpackhi_epi64(t0, t2), h1 = _mm512_unpackhi_epi64(t4, t6);
            l2 = _mm512_unpacklo_epi64(t1, t3), h2 = _mm512_unpacklo_epi64(t5, t7);
            l3 = _mm512_unpackhi_epi64(t1, t3), h3 = _mm512_unpackhi_epi64(t5, t7);
            if (width == 8 && np == 16) {
                PDP__BF16_FULL2(0, l0, h0, l1, h1);
                PDP__BF16_FULL2(2, l2, h2, l3, h3);
                continue;
            }
            PDP__BF16_PUT(0, l0, h0);
            PDP__BF16_PUT(1, l1, h1);
            PDP__BF16_PUT(2, l2, h2);
            PDP__BF16_PUT(3, l3, h3);
        }
    }
}
#  undef PDP__BF16_FULL2

PDP__BF16_TARGET static void pdp__bf16_pack_k_panel(const float *x, int64_t ld, int64_t r0,
                                                    int rows, int64_t k, int width,
                                                    uint32_t *dst)
{
    pdp__bf16_pack_k_core(x, NULL, ld, NULL, r0, rows, k, width, dst);
}

PDP__BF16_TARGET static void pdp__bf16_pack_k_panel_h(const uint16_t *h, const int64_t *off,
                                                      int64_t r0, int rows, int64_t k, int width,
                                                      uint32_t *dst)
{
    pdp__bf16_pack_k_core(NULL, h, 0, off, r0, rows, k, width, dst);
}
#  undef PDP__BF16_ROWW
#  undef PDP__BF16_PUT
#  undef PDP__BF16_PUT4

/* pdp__bf16_pack with AVX512-BF16's conversion: the same words, but for subnormal
   values (zero of their sign here, rounded there), which every kernel reads as zero. */
PDP__BF16_TARGET static void pdp__bf16_pack_avx512(const float *x, int64_t ld, pdp_trans t,
                                                   int64_t r0, int rows, int64_t k, int width,
                                                   uint32_t *dst)
{
    int64_t pairs = (k + 1) / 2;
    int j;
    if (t == PDP_TRANS) {
        pdp__bf16_pack_rows(x, ld, r0, rows, k, width, dst);
        return;
    }
    for (j = 0; j < rows; j += width)
        pdp__bf16_pack_k_panel(x, ld, r0 + j, PDP__MIN(width, rows - j), k, width,
                               dst + j / width * pairs * width);
}

/* pdp__bf16_pack_h of t == PDP_TRANS into one NR-column panel (cols <= NR = 32 rows of
   op(X) from c0), 32 columns of a pair at a time: two loads of 32 words, interleaved by
   two vpermt2w. */
PDP__BF16_TARGET static void pdp__bf16_pack_h_cols(const uint16_t *h, const int64_t *off,
                                                   int64_t c0, int cols, int64_t k,
                                                   uint32_t *dst)
{
    /* word i of the first (second) half: lo[i] | hi[i] << 16 (lo[16 + i] | hi[16 + i] << 16) */
    const __m512i i0 = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9,
                                        40, 8, 39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1,
                                        32, 0);
    const __m512i i1 = _mm512_set_epi16(63, 31, 62, 30, 61, 29, 60, 28, 59, 27, 58, 26, 57, 25,
                                        56, 24, 55, 23, 54, 22, 53, 21, 52, 20, 51, 19, 50, 18,
                                        49, 17, 48, 16);
    __mmask32 m = (__mmask32)(cols >= 32 ? 0xffffffffu : (1u << cols) - 1);
    int64_t p, pairs = (k + 1) / 2;
    for (p = 0; p < pairs; p++) {
        uint32_t *d = dst + p * PDP__BF16_NR;
        __m512i lo = _mm512_maskz_loadu_epi16(m, h + off[2 * p] + c0);
        __m512i hi = 2 * p + 1 < k ? _mm512_maskz_loadu_epi16(m, h + off[2 * p + 1] + c0)
                                   : _mm512_setzero_si512();
        _mm512_storeu_si512((void *)d, _mm512_permutex2var_epi16(lo, i0, hi));
        _mm512_storeu_si512((void *)(d + 16), _mm512_permutex2var_epi16(lo, i1, hi));
    }
}

/* pdp__bf16_pack_h with AVX512: the same words. */
PDP__BF16_TARGET static void pdp__bf16_pack_h_avx512(const uint16_t *h, const int64_t *off,
                                                     pdp_trans t, int64_t r0, int rows,
                                                     int64_t k, int width, uint32_t *dst)
{
    int64_t pairs = (k + 1) / 2;
    int j;
    if (t == PDP_TRANS && width == PDP__BF16_NR) {
        for (j = 0; j < rows; j += width)
            pdp__bf16_pack_h_cols(h, off, r0 + j, PDP__MIN(width, rows - j), k,
                                  dst + j / width * pairs * width);
        return;
    }
    if (t == PDP_TRANS) {
        pdp__bf16_pack_h(h, off, t, r0, rows, k, width, dst);
        return;
    }
    for (j = 0; j < rows; j += width)
        pdp__bf16_pack_k_panel_h(h, off, r0 + j, PDP__MIN(width, rows - j), k, width,
                                 dst + j / width * pairs * width);
}

/* pdp__bf16_convert_emul by vcvtne2ps2bf16 (pdp__bf16_cvt2: the words the avx512 packing
   makes), 32 floats at a time; the same in-place rule (a block's 32 words go to bytes
   its own floats or earlier ones held, after they are read). */
PDP__BF16_TARGET static void pdp__bf16_convert_avx512(const float *x, uint16_t *h, int64_t n)
{
    int64_t i;
    for (i = 0; i < n; i += 32) {
        int64_t left = n - i;
        __mmask16 mlo = (__mmask16)(left >= 16 ? 0xffff : (1u << left) - 1);
        __mmask16 mhi = (__mmask16)(left >= 32 ? 0xffff : left <= 16 ? 0 : (1u << (left - 16)) - 1);
        __mmask32 m = (__mmask32)(left >= 32 ? 0xffffffffu : (1u << left) - 1);
        __m512i w = pdp__bf16_cvt2(_mm512_maskz_loadu_ps(mlo, x + i),
                                   _mm512_maskz_loadu_ps(mhi, x + i + 16));
        _mm512_mask_storeu_epi16(h + i, m, w);
    }
}
#endif

/* ---- gemm_bf16: micro-kernels ----
   Contract: pairs >= 1; ap holds pairs groups of MR words, bp pairs groups of NR
   words; writes the top-left mr x nr of the tile to c (row stride ldc). */

static void pdp__bf16_kernel_emul(int64_t pairs, const uint32_t *ap, const uint32_t *bp,
                                  float *c, int64_t ldc, int mr, int nr, float alpha, float beta)
{
    float acc[PDP__BF16_MR][PDP__BF16_NR];
    int64_t p;
    int i, j;
    for (i = 0; i < PDP__BF16_MR; i++)
        for (j = 0; j < PDP__BF16_NR; j++) acc[i][j] = 0.0f;
    for (p = 0; p < pairs; p++) {
        const uint32_t *a = ap + p * PDP__BF16_MR, *b = bp + p * PDP__BF16_NR;
        for (i = 0; i < mr; i++) {
            float a0 = pdp__bf16_daz((uint16_t)a[i]), a1 = pdp__bf16_daz((uint16_t)(a[i] >> 16));
            for (j = 0; j < nr; j++) {
                float b0 = pdp__bf16_daz((uint16_t)b[j]), b1 = pdp__bf16_daz((uint16_t)(b[j] >> 16));
                float s = pdp__bf16_ftz_add(acc[i][j], a1 * b1);
                acc[i][j] = pdp__bf16_ftz_add(s, a0 * b0);
            }
        }
    }
    for (i = 0; i < mr; i++)
        for (j = 0; j < nr; j++) c[i * ldc + j] = pdp__bf16_out(acc[i][j], alpha, beta, c + i * ldc + j);
}

#if PDP__BF16_X86
/* One row of the tile: acc_i0, acc_i1 += a[i] (broadcast) . b0, b1 (one vdpbf16ps per
   16 columns). The 16 accumulators are named so that they stay in registers. */
#  define PDP__BF16_ROW(i)                                                                    \
    do {                                                                                       \
        __m512bh ai = (__m512bh)_mm512_set1_epi32((int)a[i]);                                 \
        c##i##0 = _mm512_dpbf16_ps(c##i##0, ai, b0);                                          \
        c##i##1 = _mm512_dpbf16_ps(c##i##1, ai, b1);                                          \
    } while (0)

/* the kernel below names MR = 8 rows of accumulators */
typedef char pdp__bf16_avx512_shape_ok[PDP__BF16_MR == 8 && PDP__BF16_NR == 32 ? 1 : -1];

PDP__BF16_TARGET static void pdp__bf16_kernel_avx512(int64_t pairs, const uint32_t *ap,
                                                     const uint32_t *bp, float *c, int64_t ldc,
                                                     int mr, int nr, float alpha, float beta)
{
    __m512 acc[PDP__BF16_MR][2];
    __m512 c00 = _mm512_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
    __m512 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00, c60 = c00;
    __m512 c61 = c00, c70 = c00, c71 = c00;
    __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
    __mmask16 mask[2];
    int64_t p;
    int i, v;
    for (p = 0; p < pairs; p++) {
        const uint32_t *a = ap + p * PDP__BF16_MR;
        __m512bh b0 = (__m512bh)_mm512_loadu_si512((const void *)(bp + p * PDP__BF16_NR));
        __m512bh b1 = (__m512bh)_mm512_loadu_si512((const void *)(bp + p * PDP__BF16_NR + 16));
        PDP__BF16_ROW(0);
        PDP__BF16_ROW(1);
        PDP__BF16_ROW(2);
        PDP__BF16_ROW(3);
        PDP__BF16_ROW(4);
        PDP__BF16_ROW(5);
        PDP__BF16_ROW(6);
        PDP__BF16_ROW(7);
    }
    acc[0][0] = c00, acc[0][1] = c01, acc[1][0] = c10, acc[1][1] = c11;
    acc[2][0] = c20, acc[2][1] = c21, acc[3][0] = c30, acc[3][1] = c31;
    acc[4][0] = c40, acc[4][1] = c41, acc[5][0] = c50, acc[5][1] = c51;
    acc[6][0] = c60, acc[6][1] = c61, acc[7][0] = c70, acc[7][1] = c71;
    for (v = 0; v < 2; v++) {
        int left = nr - 16 * v;
        mask[v] = (__mmask16)(left >= 16 ? 0xffff : left <= 0 ? 0 : (1u << left) - 1);
    }
    for (i = 0; i < mr; i++)
        for (v = 0; v < 2; v++) {
            float *ci = c + i * ldc + 16 * v;
            __m512 r = _mm512_mul_ps(va, acc[i][v]);
            if (!mask[v]) continue;
            if (beta != 0.0f)
                r = _mm512_add_ps(_mm512_mul_ps(vb, _mm512_maskz_loadu_ps(mask[v], ci)), r);
            _mm512_mask_storeu_ps(ci, mask[v], r);
        }
}
#  undef PDP__BF16_ROW
#endif

#if PDP__BF16_AMX
/* AMX (palette 1): the MR x NR = 8 x 32 tile of C is two 8-row x 16-column fp32
   accumulator tiles (tmm0: columns 0-15, tmm1: 16-31), zeroed, then fed 16 pairs (32
   values of k) at a time: tmm2 holds A's 8 rows x 16 pair words ([row][pair]: the
   packed panel's [pair][row] words transposed into a), tmm3 and tmm4 B's 16 pair rows
   x 16 columns each, loaded straight from the packed panel, whose [pair][column] words
   are AMX's pair ("VNNI") layout, at a row stride of NR words. tmm0 += tmm2 tmm3 and
   tmm1 += tmm2 tmm4 (TDPBF16PS: dst.row[m].fp32[n] += a.row[m].bf16[2p] b.row[p].bf16[2n]
   + a.row[m].bf16[2p+1] b.row[p].bf16[2n+1] over the pairs p). A last step with fewer
   than 16 pairs gets zero pairs in a and in a zero-padded copy of B's rows (zero
   products: the sums do not change). Rows past mr are the packing's zero rows. The
   tiles are stored to acc and written to C as the other kernels do; the tile state is
   configured per call and released before returning. */
#  define PDP__BF16_AMX_TARGET __attribute__((target("amx-tile,amx-bf16")))
#  define PDP__BF16_KP 16 /* pairs per step: 64 bytes, one tile row of A */

/* the kernel's tiles fit: 8 rows of C and A (<= 16), B tiles 16 columns wide */
typedef char pdp__bf16_amx_shape_ok[PDP__BF16_MR <= 16 && PDP__BF16_NR == 32 ? 1 : -1];

typedef struct pdp__bf16_tilecfg { /* LDTILECFG's 64-byte operand */
    uint8_t palette;               /* 1 */
    uint8_t start_row;             /* 0 */
    uint8_t reserved[14];          /* zero */
    uint16_t colsb[16];            /* bytes per row of tile i (unused tiles 0) */
    uint8_t rows[16];              /* rows of tile i */
} pdp__bf16_tilecfg;

PDP__BF16_AMX_TARGET static void pdp__bf16_kernel_amx(int64_t pairs, const uint32_t *ap,
                                                      const uint32_t *bp, float *c, int64_t ldc,
                                                      int mr, int nr, float alpha, float beta)
{
    pdp__bf16_tilecfg cfg;
    uint32_t a[PDP__BF16_MR][PDP__BF16_KP];      /* tmm2: A's rows, pairs p0 .. p0 + 15 */
    uint32_t btail[PDP__BF16_KP][PDP__BF16_NR];  /* B's last rows, zero-padded to 16 */
    float acc[PDP__BF16_MR][PDP__BF16_NR];       /* tmm0 | tmm1 */
    int64_t p0;
    int i, j, p;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    cfg.rows[0] = cfg.rows[1] = PDP__BF16_MR; /* C: 8 rows x 16 fp32 */
    cfg.colsb[0] = cfg.colsb[1] = 16 * 4;
    cfg.rows[2] = PDP__BF16_MR; /* A: 8 rows x 16 pairs */
    cfg.colsb[2] = PDP__BF16_KP * 4;
    cfg.rows[3] = cfg.rows[4] = PDP__BF16_KP; /* B: 16 pairs x 16 columns */
    cfg.colsb[3] = cfg.colsb[4] = 16 * 4;
    _tile_loadconfig(&cfg);
    _tile_zero(0);
    _tile_zero(1);
    for (p0 = 0; p0 < pairs; p0 += PDP__BF16_KP) {
        int kp = (int)PDP__MIN((int64_t)PDP__BF16_KP, pairs - p0);
        const uint32_t *b = bp + p0 * PDP__BF16_NR;
        for (i = 0; i < PDP__BF16_MR; i++)
            for (p = 0; p < PDP__BF16_KP; p++)
                a[i][p] = p < kp ? ap[(p0 + p) * PDP__BF16_MR + i] : 0u;
        if (kp < PDP__BF16_KP) {
            memcpy(btail, b, (size_t)kp * sizeof btail[0]);
            memset(btail[kp], 0, (size_t)(PDP__BF16_KP - kp) * sizeof btail[0]);
            b = &btail[0][0];
        }
        _tile_loadd(2, a, PDP__BF16_KP * 4);
        _tile_loadd(3, b, PDP__BF16_NR * 4);
        _tile_loadd(4, b + 16, PDP__BF16_NR * 4);
        _tile_dpbf16ps(0, 2, 3);
        _tile_dpbf16ps(1, 2, 4);
    }
    _tile_stored(0, &acc[0][0], PDP__BF16_NR * 4);
    _tile_stored(1, &acc[0][16], PDP__BF16_NR * 4);
    _tile_release();
    for (i = 0; i < mr; i++)
        for (j = 0; j < nr; j++)
            c[i * ldc + j] = pdp__bf16_out(acc[i][j], alpha, beta, c + i * ldc + j);
}
#endif

typedef void (*pdp__bf16_kernel_fn)(int64_t pairs, const uint32_t *ap, const uint32_t *bp,
                                    float *c, int64_t ldc, int mr, int nr, float alpha,
                                    float beta);

typedef void (*pdp__bf16_pack_fn)(const float *x, int64_t ld, pdp_trans t, int64_t r0, int rows,
                                  int64_t k, int width, uint32_t *dst);

typedef void (*pdp__bf16_pack_h_fn)(const uint16_t *h, const int64_t *off, pdp_trans t,
                                    int64_t r0, int rows, int64_t k, int width, uint32_t *dst);

/* ---- gemm_bf16: driver ---- */

typedef struct pdp__bf16_args {
    pdp_trans ta, tb;
    int64_t m, n, k;
    float alpha, beta;
    const float *a, *b;
    int64_t lda, ldb, ldc;
    const uint16_t *ah, *bh;    /* not NULL: A (B) in bf16 words instead of a (b) */
    const int64_t *arow, *brow; /* storage row r at ah + arow[r] (bh + brow[r]) */
    float *c;
    pdp__bf16_kernel_fn kernel;
    pdp__bf16_pack_fn pack;
    pdp__bf16_pack_h_fn pack_h;
    int split_n; /* parts split the NR-column panels (else the MR-row panels) */
} pdp__bf16_args;

/* op(A)(i, p) and op(B)(p, j) as bf16 words. */
static uint16_t pdp__bf16_aword(const pdp__bf16_args *g, int64_t i, int64_t p)
{
    if (g->ah) return (uint16_t)pdp__bf16_hat(g->ah, g->arow, g->ta, i, p);
    return pdp__bf16_bits(pdp__bf16_at(g->a, g->lda, g->ta, i, p));
}
static uint16_t pdp__bf16_bword(const pdp__bf16_args *g, int64_t p, int64_t j)
{
    pdp_trans tbt = g->tb == PDP_NO_TRANS ? PDP_TRANS : PDP_NO_TRANS;
    if (g->bh) return (uint16_t)pdp__bf16_hat(g->bh, g->brow, tbt, j, p);
    return pdp__bf16_bits(pdp__bf16_at(g->b, g->ldb, tbt, j, p));
}

/* Element (i, j) of C by the emulated chain, unpacked (the fallback without scratch). */
static void pdp__bf16_element(const pdp__bf16_args *g, int64_t i, int64_t j)
{
    float acc = 0.0f;
    int64_t p;
    for (p = 0; p < g->k; p += 2) {
        float a0 = pdp__bf16_daz(pdp__bf16_aword(g, i, p));
        float b0 = pdp__bf16_daz(pdp__bf16_bword(g, p, j));
        if (p + 1 < g->k) {
            float a1 = pdp__bf16_daz(pdp__bf16_aword(g, i, p + 1));
            float b1 = pdp__bf16_daz(pdp__bf16_bword(g, p + 1, j));
            acc = pdp__bf16_ftz_add(acc, a1 * b1);
        } else {
            acc = pdp__bf16_ftz_add(acc, 0.0f);
        }
        acc = pdp__bf16_ftz_add(acc, a0 * b0);
    }
    g->c[i * g->ldc + j] = pdp__bf16_out(acc, g->alpha, g->beta, g->c + i * g->ldc + j);
}

/* C[m0, m1) x [n0, n1) (m0, n0 on the tile grid). B's panels for [n0, n1) are packed
   once, in the first MC block, and reused by the others. */
static void pdp__bf16_block(const pdp__bf16_args *g, int64_t m0, int64_t m1, int64_t n0,
                            int64_t n1)
{
    int64_t pairs = (g->k + 1) / 2, mc, ir, jr, i, j;
    /* op(B) as a row-major n x k matrix for packing: op(B)^T(j, p) = op(B)(p, j) */
    pdp_trans tbt = g->tb == PDP_NO_TRANS ? PDP_TRANS : PDP_NO_TRANS;
    int64_t mrows = PDP__MIN(PDP__BF16_MC, m1 - m0);
    int64_t arows = (mrows + PDP__BF16_MR - 1) / PDP__BF16_MR * PDP__BF16_MR;
    int64_t bcols = (n1 - n0 + PDP__BF16_NR - 1) / PDP__BF16_NR * PDP__BF16_NR;
    size_t words = (size_t)pairs * (size_t)(arows + bcols);
    uint32_t *ap = (uint32_t *)pdp__thread_scratch(words * sizeof(uint32_t)), *bp;
    if (!ap) {
        for (i = m0; i < m1; i++)
            for (j = n0; j < n1; j++) pdp__bf16_element(g, i, j);
        return;
    }
    bp = ap + (size_t)pairs * (size_t)arows;
    for (mc = m0; mc < m1; mc += PDP__BF16_MC) {
        int64_t mend = PDP__MIN(m1, mc + PDP__BF16_MC);
        if (g->ah)
            g->pack_h(g->ah, g->arow, g->ta, mc, (int)(mend - mc), g->k, PDP__BF16_MR, ap);
        else
            g->pack(g->a, g->lda, g->ta, mc, (int)(mend - mc), g->k, PDP__BF16_MR, ap);
        for (jr = n0; jr < n1; jr += PDP__BF16_NR) {
            int nr = (int)PDP__MIN(PDP__BF16_NR, n1 - jr);
            uint32_t *bj = bp + (jr - n0) * pairs;
            if (mc == m0 && g->bh)
                g->pack_h(g->bh, g->brow, tbt, jr, nr, g->k, PDP__BF16_NR, bj);
            else if (mc == m0)
                g->pack(g->b, g->ldb, tbt, jr, nr, g->k, PDP__BF16_NR, bj);
            for (ir = mc; ir < mend; ir += PDP__BF16_MR)
                g->kernel(pairs, ap + (ir - mc) * pairs, bj, g->c + ir * g->ldc + jr, g->ldc,
                          (int)PDP__MIN(PDP__BF16_MR, mend - ir), nr, g->alpha, g->beta);
        }
    }
}

/* Part i of n: an equal share of the column or row panels. */
static void pdp__bf16_part(void *arg, int i, int n)
{
    const pdp__bf16_args *g = (const pdp__bf16_args *)arg;
    int64_t step = g->split_n ? PDP__BF16_NR : PDP__BF16_MR;
    int64_t len = g->split_n ? g->n : g->m;
    int64_t panels = (len + step - 1) / step;
    int64_t lo = PDP__MIN(len, panels * i / n * step);
    int64_t hi = PDP__MIN(len, panels * (i + 1) / n * step);
    if (lo >= hi) return;
    if (g->split_n)
        pdp__bf16_block(g, 0, g->m, lo, hi);
    else
        pdp__bf16_block(g, lo, hi, 0, g->n);
}

/* pdp_gemm_bf16_on on an available path (not AUTO); A (B) as bf16 words at ah (bh)
   when given, storage row r at ah + arow[r] (bh + brow[r]), else as floats at a (b). */
static void pdp__bf16_run(pdp_bf16_path path, pdp_trans ta, pdp_trans tb, int64_t m, int64_t n,
                          int64_t k, float alpha, const float *a, const uint16_t *ah, int64_t lda,
                          const int64_t *arow, const float *b, const uint16_t *bh, int64_t ldb,
                          const int64_t *brow, float beta, float *c, int64_t ldc)
{
    pdp__bf16_args g;
    int threads, parts;
    int64_t npan, mpan;
    (void)path; /* PDP_NO_SIMD: one path */
    if (m <= 0 || n <= 0) return;
    PDP_ASSERT(ldc >= n);
    if (k <= 0 || alpha == 0.0f) {
        pdp__gemm_scale_c(m, n, beta, c, ldc);
        return;
    }
    PDP_ASSERT(arow || lda >= (ta == PDP_NO_TRANS ? k : m));
    PDP_ASSERT(brow || ldb >= (tb == PDP_NO_TRANS ? n : k));
    PDP_ASSERT(!ah == !arow && !bh == !brow);
    g.ta = ta;
    g.tb = tb;
    g.m = m;
    g.n = n;
    g.k = k;
    g.alpha = alpha;
    g.beta = beta;
    g.a = a;
    g.b = b;
    g.lda = lda;
    g.ldb = ldb;
    g.arow = arow;
    g.brow = brow;
    g.ah = ah;
    g.bh = bh;
    g.c = c;
    g.ldc = ldc;
    g.kernel = pdp__bf16_kernel_emul;
    g.pack = pdp__bf16_pack;
    g.pack_h = pdp__bf16_pack_h;
#if PDP__BF16_X86
    if (path == PDP_BF16_PATH_AVX512) g.kernel = pdp__bf16_kernel_avx512;
    /* the emulation keeps the portable packing; AMX implies AVX512-BF16 on every CPU
       that has it, but is not assumed to */
    if (path != PDP_BF16_PATH_EMULATED && pdp__bf16_has_avx512) {
        g.pack = pdp__bf16_pack_avx512;
        g.pack_h = pdp__bf16_pack_h_avx512;
    }
#endif
#if PDP__BF16_AMX
    if (path == PDP_BF16_PATH_AMX) g.kernel = pdp__bf16_kernel_amx;
#endif
    threads = pdp__threads_for_caller();
    if (2.0 * (double)m * (double)n * (double)k < PDP__BF16_PAR_FLOPS) threads = 1;
    npan = (n + PDP__BF16_NR - 1) / PDP__BF16_NR;
    mpan = (m + PDP__BF16_MR - 1) / PDP__BF16_MR;
    g.split_n = npan >= 2 * (int64_t)threads || npan * PDP__BF16_NR >= mpan * PDP__BF16_MR;
    parts = (int)PDP__MIN((int64_t)threads, g.split_n ? npan : mpan);
    pdp__parallel_for(parts, pdp__bf16_part, &g);
}

PDP_API pdp_status pdp_gemm_bf16_on(pdp_bf16_path path, pdp_trans ta, pdp_trans tb, int64_t m,
                                    int64_t n, int64_t k, float alpha, const float *a,
                                    int64_t lda, const float *b, int64_t ldb, float beta,
                                    float *c, int64_t ldc)
{
    if (path == PDP_BF16_PATH_AUTO) path = pdp_bf16_best_path();
    if (!pdp_bf16_path_available(path))
        return pdp__err(PDP_ERR_UNSUPPORTED, "pdp_gemm_bf16_on: path %s is not available on "
                        "this CPU or build", pdp_bf16_path_name(path));
    pdp__bf16_run(path, ta, tb, m, n, k, alpha, a, NULL, lda, NULL, b, NULL, ldb, NULL, beta, c,
                  ldc);
    return PDP_OK;
}

PDP_API void pdp_gemm_bf16(pdp_trans ta, pdp_trans tb, int64_t m, int64_t n, int64_t k,
                           float alpha, const float *a, int64_t lda, const float *b, int64_t ldb,
                           float beta, float *c, int64_t ldc)
{
    (void)pdp_gemm_bf16_on(PDP_BF16_PATH_AUTO, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c,
                           ldc);
}

/* path with AUTO resolved to the best; one the CPU lacks is the caller's bug. */
static pdp_bf16_path pdp__bf16_resolve(pdp_bf16_path path)
{
    if (path == PDP_BF16_PATH_AUTO) path = pdp_bf16_best_path();
    PDP_ASSERT(pdp_bf16_path_available(path));
    return path;
}

/* ---- gemm_bf16: gathered operands ----
   gemm.c's pdp__sgemm_rows and pdp__sgemm_arows in bf16, on `path` (AUTO: the best;
   one the CPU lacks: the caller's bug, asserted), with the gathered operand already in
   bf16 words as pdp__gemm_bf16_convert on the same path wrote them (Conv2d converts its
   padded image once, where packing floats would convert each value k k times): the
   packing reads the storage rows through the offset table and converts nothing, a pair
   is two loads and two vpermt2w per 32 columns, or two adjacent words. Same tiles,
   chains and bits as pdp_gemm_bf16_on on the materialised floats, on the same path.
   rows_h:  B's storage row r at bh + brow[r]: op(B)(p, j) = bh[brow[p] + j] (tb ==
            PDP_NO_TRANS) or bh[brow[j] + p] (PDP_TRANS).
   arows_h: A not transposed, row i at ah + arow[i]: A(i, p) = ah[arow[i] + p]. */
static void pdp__gemm_bf16_rows_h(pdp_bf16_path path, pdp_trans ta, pdp_trans tb, int64_t m,
                                  int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                                  const uint16_t *bh, const int64_t *brow, float beta, float *c,
                                  int64_t ldc)
{
    pdp__bf16_run(pdp__bf16_resolve(path), ta, tb, m, n, k, alpha, a, NULL, lda, NULL, NULL, bh,
                  0, brow, beta, c, ldc);
}

static void pdp__gemm_bf16_arows_h(pdp_bf16_path path, pdp_trans tb, int64_t m, int64_t n,
                                   int64_t k, float alpha, const uint16_t *ah,
                                   const int64_t *arow, const float *b, int64_t ldb, float beta,
                                   float *c, int64_t ldc)
{
    pdp__bf16_run(pdp__bf16_resolve(path), PDP_NO_TRANS, tb, m, n, k, alpha, NULL, ah, 0, arow,
                  b, NULL, ldb, NULL, beta, c, ldc);
}

/* x[0, n) as the bf16 words `path`'s packing makes (AUTO: the best path's) into h,
   which may be x's own memory (h == (uint16_t *)x, converted in place to its first half). */
static void pdp__gemm_bf16_convert(pdp_bf16_path path, const float *x, uint16_t *h, int64_t n)
{
    if (path == PDP_BF16_PATH_AUTO) path = pdp_bf16_best_path();
#if PDP__BF16_X86
    if (path != PDP_BF16_PATH_EMULATED && pdp_bf16_path_available(PDP_BF16_PATH_AVX512)) {
        pdp__bf16_convert_avx512(x, h, n);
        return;
    }
#endif
    pdp__bf16_convert_emul(x, h, n);
}
/* ---- end src/gemm_bf16.c ---- */

/* ---- begin src/rendezvous.c ---- */
/* rendezvous: who the ranks are and how they meet, the way torchrun does it.

   pdp_env_read reads the launcher's variables (torchrun's RANK, WORLD_SIZE,
   LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, else OpenMPI's
   OMPI_COMM_WORLD_*); every value is checked, and a bad one is PDP_ERR_INVALID
   naming the variable. It never talks to anyone.

   A backend whose library needs one blob made on rank 0 before it can start
   (NCCL's unique id) meets the other ranks through the TCP store (store.c):
     pdp__rendezvous_store   every rank opens the store at MASTER_ADDR: rank 0
                             serves it. The port is MASTER_PORT, or MASTER_PORT + 1
                             under torchrun (TORCHELASTIC_RUN_ID is set: torchrun's
                             own store holds MASTER_PORT), or PDP_STORE_PORT when
                             set. A world of one opens nothing (store NULL).
     pdp__rendezvous_share   rank 0 sets the blob at key, the others get it, and
                             all meet at the barrier "<key>_read", so every rank
                             holds the blob before rank 0's store may go away.
   The caller keeps the store open until its library's own, collective,
   initialisation has returned, then frees it: rank 0's server then outlives
   every rank's barrier reply. Every wait ends by the timeout (PDP_ERR_TIMEOUT
   naming the key); messages name the public caller, the library and the rank. */

/* #include "internal.h" (already above) */
#include <limits.h>

/* ---- rendezvous: the environment ---- */

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

/* ---- rendezvous: a blob from rank 0, through the TCP store ---- */

/* Opens env's store (*out NULL for a world of one); what names the library
   ("NCCL") and fn the public caller in messages. */
static pdp_status pdp__rendezvous_store(pdp_store **out, const pdp_env_info *env,
                                        double timeout_s, const char *what, const char *fn)
{
    pdp_store_desc sd;
    const char *port_env;
    pdp_status st;
    *out = NULL;
    memset(&sd, 0, sizeof sd);
    sd.host = env->master_addr;
    sd.port = env->master_port;
    /* torchrun's own store holds MASTER_PORT; ours takes the next port */
    if (getenv("TORCHELASTIC_RUN_ID")) sd.port = env->master_port + 1;
    if ((port_env = getenv("PDP_STORE_PORT")) && *port_env) sd.port = atoi(port_env);
    sd.is_server = env->rank == 0;
    sd.world_size = env->world_size;
    sd.timeout_s = timeout_s;
    if (env->world_size > 1) {
        if ((st = pdp_store_create(out, &sd)) != PDP_OK)
            return pdp__err_wrap(st, "%s: %s rank %d of %d: the TCP store", fn, what, env->rank,
                                 env->world_size);
    }
    return PDP_OK;
}

/* Rank 0's blob[0..bytes) (made before the call) reaches every rank's blob through
   store (NULL: a world of one, nothing to do); then every rank meets at
   "<key>_read". */
static pdp_status pdp__rendezvous_share(pdp_store *store, const pdp_env_info *env,
                                        const char *key, void *blob, size_t bytes,
                                        double timeout_s, const char *what, const char *fn)
{
    char read_key[PDP_STORE_MAX_KEY + 1];
    pdp_status st;
    if (!store) return PDP_OK;
    if (env->rank == 0) {
        if ((st = pdp_store_set(store, key, blob, bytes)) != PDP_OK)
            return pdp__err_wrap(st, "%s: rank 0 publishing the %s id", fn, what);
    } else if ((st = pdp_store_get(store, key, blob, bytes, NULL)) != PDP_OK) {
        return pdp__err_wrap(st, "%s: rank %d of %d waiting for the %s id from rank 0", fn,
                             env->rank, env->world_size, what);
    }
    /* everyone holds the id before rank 0's store may go away */
    snprintf(read_key, sizeof read_key, "%s_read", key);
    if ((st = pdp_store_barrier(store, read_key, env->world_size, timeout_s)) != PDP_OK)
        return pdp__err_wrap(st, "%s: rank %d of %d", fn, env->rank, env->world_size);
    return PDP_OK;
}
/* ---- end src/rendezvous.c ---- */

/* ---- begin src/comm_queue.c ---- */
/* comm_queue: the collective queue that the local and MPI backends share (handle
   pool, FIFO, progress thread, wait/done); comm_local.c and comm_mpi.c supply only how
   one collective executes.

   What the local and MPI backends share: a fixed pool of handles, a FIFO of
   launched collectives and one progress thread per communicator that runs
   them in issue order through the backend's exec callback; the backend keeps
   only how one collective executes. A launch takes a handle from the free
   list (nothing is allocated per collective; an empty list fails with
   PDP_ERR_STATE naming the backend's PDP_*_MAX_INFLIGHT), queues it and
   returns. The progress thread stamps t_start when it dequeues a handle and
   t_done when exec returns. Wait blocks until done (exec enforces timeouts),
   leaves a failure's message as the thread's error and returns the handle to
   the free list; its head stays readable until the next launch (internal.h).
   Without a progress thread (threaded = false: a local group of one) a launch
   executes inline.

   Set by the backend before pdp__workq_init (the queue is zeroed memory):
     comm, exec  the communicator served and "run one collective";
     sticky      the first failure breaks the queue: queued and later
                 collectives fail at once with its status and message (MPI;
                 the local backend keeps that state in its group instead);
     idle        optional; called by the progress thread, mu held, when nothing
                 is queued: false sleeps until woken, true calls it again (MPI
                 keeps a timed-out request moving this way);
     trace_tid   a trace track (0: off): each collective is a complete event
                 (execution) and an async event (launch to done).
   An exec that polls (MPI) naps between polls with pdp__workq_nap, which a
   thread that begins to wait ends at once: a rank that computes keeps its core,
   a rank that waits is served at once.
   Locks: mu guards the queue, the free list, the handles' done/status/msg, the
   waiter count and the broken state; exec runs without it, and buffers pass to
   the progress thread and back across it. */

/* #include "internal.h" (already above) */

/* *ts = CLOCK_MONOTONIC now + seconds, for pthread_cond_timedwait on a condition
   variable created with a monotonic clock. */
static void pdp__deadline(struct timespec *ts, double seconds)
{
    double whole = floor(seconds);
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += (time_t)whole;
    ts->tv_nsec += (long)((seconds - whole) * 1e9);
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

#define PDP__MSG_CAP 512 /* bytes of a collective's failure message */

#define PDP__COMM_TIMEOUT_DEFAULT 300.0 /* seconds, when a desc's timeout_s is 0 */
#define PDP__COMM_TIMEOUT_MAX 1e9       /* seconds: beyond it a deadline overflows time_t math */

/* The one rule for a communicator desc's numeric fields (timeout_s is the only one):
   zero means the default; a negative, NaN or infinite value (or one above
   PDP__COMM_TIMEOUT_MAX) fails with PDP_ERR_INVALID naming the function and the
   field. Every communicator constructor calls it first (desc may be NULL). */
static pdp_status pdp__comm_desc_timeout(const pdp_comm_desc *desc, double *out, const char *fn)
{
    double t = desc ? desc->timeout_s : 0.0;
    *out = PDP__COMM_TIMEOUT_DEFAULT;
    if (!(t >= 0.0 && t <= PDP__COMM_TIMEOUT_MAX))
        return pdp__err(PDP_ERR_INVALID, "%s: desc->timeout_s = %g: it must be a finite number "
                        "of seconds, 0 (the default, %g s) up to %g", fn, t,
                        PDP__COMM_TIMEOUT_DEFAULT, PDP__COMM_TIMEOUT_MAX);
    if (t > 0.0) *out = t;
    return PDP_OK;
}

/* One collective's arguments, as one rank issued it. */
typedef struct pdp__coll_args {
    pdp__coll_kind kind;
    int64_t seq;
    int64_t count;        /* floats (bytes for BROADCAST_BYTES) */
    int op;               /* pdp_reduce_op or root */
    int dtype;            /* pdp_dtype of the reductions (F32 for the rest) */
    float *buf;           /* allreduce, broadcast (a 16-bit all-reduce: uint16_t elements) */
    const float *send;    /* reduce_scatter, allgather (the same) */
    float *recv;
    void *bytes_buf;      /* broadcast_bytes */
    int peer, tag;        /* send, recv */
    void *out;            /* split: where the backend leaves its result */
} pdp__coll_args;

typedef struct pdp__workq_item {
    pdp_work head;                 /* first member: a pdp_work * is a pdp__workq_item * */
    struct pdp__workq_item *next;  /* free list or queue */
    pdp__coll_args args;
    double t_queued;               /* launch, for the trace */
    bool p2p;                      /* a send or recv: never queued (see below) */
    struct pdp__workq_item *p2p_next; /* the backend's list of unmatched messages */
    bool done;
    pdp_status status;
    char msg[PDP__MSG_CAP];
} pdp__workq_item;

typedef struct pdp__workq pdp__workq;

/* Runs w to completion (progress thread, q->mu not held). On failure returns
   the status with the message, without a function-name prefix, in msg. */
typedef pdp_status (*pdp__workq_exec_fn)(pdp__workq *q, pdp__workq_item *w, char *msg, size_t cap);

struct pdp__workq {
    pdp_comm *comm;                /* its communicator: comm->impl points here */
    pdp__workq_exec_fn exec;
    bool (*idle)(pdp__workq *q);
    /* point-to-point (both set by a backend with send/recv): poll advances every
       pending message of the communicator (optional, q->mu not held); expire is
       called by a waiter past the deadline: it withdraws w if still unmatched and
       completes it with PDP_ERR_TIMEOUT (q->mu not held) */
    void (*p2p_poll)(pdp__workq *q);
    void (*p2p_expire)(pdp__workq *q, pdp__workq_item *w);
    bool sticky;
    int trace_tid;
    int trace_pid;                 /* the trace's process lane (MPI: the world rank) */
    const char *limit_macro;       /* "PDP_LOCAL_MAX_INFLIGHT": how to raise capacity */
    int capacity;
    pthread_mutex_t mu;
    pthread_cond_t wake;           /* queue not empty, or stopping */
    pthread_cond_t done;           /* a handle completed */
    pthread_t thread;
    bool threaded;
    bool stopping;
    double stop_time;
    int waiters;                   /* threads blocked in pdp__workq_wait (their core is idle) */
    int p2p_live;                  /* messages taken and not yet finished */
    pdp__workq_item *free_list, *q_head, *q_tail;
    int64_t next_seq;
    bool broken;                   /* sticky: first failure wins; later collectives fail fast */
    pdp_status broken_status;
    char broken_msg[PDP__MSG_CAP];
};

static void pdp__workq_trace(const pdp__workq *q, const pdp__workq_item *w, double t_start,
                             double t_done, pdp_status st)
{
    char args[88];
    if (!q->trace_tid) return;
    snprintf(args, sizeof args, "\"seq\":%lld,\"count\":%lld,\"status\":%d",
             (long long)w->head.seq, (long long)w->args.count, (int)st);
    pdp__trace_complete(q->trace_pid, q->trace_tid, "comm", w->head.op_name, t_start, t_done,
                        args);
    pdp__trace_async(q->trace_pid, q->trace_tid, "comm", w->head.op_name,
                     ((uint64_t)(uintptr_t)q->comm << 20) ^ (uint64_t)w->head.seq, w->t_queued,
                     t_done, args);
}

/* Executes w and completes it; q->mu held on entry and on return. */
static void pdp__workq_run(pdp__workq *q, pdp__workq_item *w)
{
    double t_start = w->head.t_start = pdp__now(), t_done;
    pdp_status st;
    char msg[PDP__MSG_CAP];
    if (q->broken) {
        w->head.t_done = t_start;
        w->status = q->broken_status;
        snprintf(w->msg, sizeof w->msg, "%s #%lld not run: %.300s", w->head.op_name,
                 (long long)w->head.seq, q->broken_msg);
    } else {
        pthread_mutex_unlock(&q->mu);
        msg[0] = '\0';
        st = q->exec(q, w, msg, sizeof msg);
        t_done = pdp__now();
        pdp__workq_trace(q, w, t_start, t_done, st);
        pthread_mutex_lock(&q->mu);
        if (st != PDP_OK && q->sticky && !q->broken) {
            q->broken = true;
            q->broken_status = st;
            snprintf(q->broken_msg, sizeof q->broken_msg, "%s", msg);
        }
        w->head.t_done = t_done;
        w->status = st;
        if (st != PDP_OK) snprintf(w->msg, sizeof w->msg, "%s", msg);
    }
    w->done = true;
    pthread_cond_broadcast(&q->done);
}

static void *pdp__workq_progress(void *arg)
{
    pdp__workq *q = (pdp__workq *)arg;
    pthread_mutex_lock(&q->mu);
    for (;;) {
        pdp__workq_item *w;
        while (!q->q_head && !q->stopping)
            if (!q->idle || !q->idle(q)) pthread_cond_wait(&q->wake, &q->mu);
        if (!q->q_head) break; /* stopping with nothing queued */
        w = q->q_head;
        q->q_head = w->next;
        if (!q->q_head) q->q_tail = NULL;
        pdp__workq_run(q, w);
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

/* Threads pool[0, capacity) into the free list, creates the locks and, when
   threaded, starts the progress thread. On failure nothing is left to release;
   fn names the public caller. */
static pdp_status pdp__workq_init(pdp__workq *q, pdp__workq_item *pool, int capacity,
                                  const char *limit_macro, bool threaded, const char *fn)
{
    pthread_condattr_t ca;
    int i;
    q->capacity = capacity;
    q->limit_macro = limit_macro;
    for (i = capacity - 1; i >= 0; i--) {
        pool[i].next = q->free_list;
        q->free_list = &pool[i];
    }
    pthread_mutex_init(&q->mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* pdp__workq_nap's timed wait */
    pthread_cond_init(&q->wake, &ca);
    pthread_cond_init(&q->done, &ca); /* a message's wait times out */
    pthread_condattr_destroy(&ca);
    q->threaded = threaded;
    if (threaded && pthread_create(&q->thread, NULL, pdp__workq_progress, q) != 0) {
        pthread_mutex_destroy(&q->mu);
        pthread_cond_destroy(&q->wake);
        pthread_cond_destroy(&q->done);
        return pdp__err(PDP_ERR_WORKER, "%s: cannot start the progress thread of rank %d", fn,
                        q->comm->rank);
    }
    return PDP_OK;
}

/* True once pdp__workq_shutdown began (*since: when); for an exec that polls. */
static bool pdp__workq_stopping(pdp__workq *q, double *since)
{
    bool s;
    pthread_mutex_lock(&q->mu);
    s = q->stopping;
    *since = q->stop_time;
    pthread_mutex_unlock(&q->mu);
    return s;
}

/* For an exec that polls, between polls. With `eager` and a thread blocked in
   pdp__workq_wait (its core is idle), returns false at once: poll again. Otherwise
   sleeps up to `seconds` and returns true; a thread that begins to wait ends the
   sleep early (the check and the sleep are atomic under mu, so that wake-up is
   never lost). A rank that computes keeps its core; a rank that waits gets its
   collective's completion at once. */
static bool pdp__workq_nap(pdp__workq *q, double seconds, bool eager)
{
    struct timespec deadline;
    bool slept = false;
    pdp__deadline(&deadline, seconds);
    pthread_mutex_lock(&q->mu);
    if (!eager || !q->waiters) {
        pthread_cond_timedwait(&q->wake, &q->mu, &deadline);
        slept = true;
    }
    pthread_mutex_unlock(&q->mu);
    return slept;
}

/* Lets the progress thread run what is queued, joins it and destroys the locks. */
static void pdp__workq_shutdown(pdp__workq *q)
{
    if (q->threaded) {
        pthread_mutex_lock(&q->mu);
        q->stopping = true;
        q->stop_time = pdp__now();
        pthread_cond_signal(&q->wake);
        pthread_mutex_unlock(&q->mu);
        pthread_join(q->thread, NULL);
    }
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->wake);
    pthread_cond_destroy(&q->done);
}

/* Takes a handle, fills it and queues it (or runs it inline without a thread). */
static pdp_status pdp__workq_submit(pdp_comm *c, const pdp__coll_args *args, pdp_work **out)
{
    pdp__workq *q = (pdp__workq *)c->impl;
    pdp__workq_item *w;
    pthread_mutex_lock(&q->mu);
    if (q->broken) {
        pdp_status st = q->broken_status;
        pdp__err(st, "%s on comm '%s' (rank %d of %d): the communicator is broken: %s",
                 pdp__op_names[args->kind], c->name, c->rank, c->size, q->broken_msg);
        pthread_mutex_unlock(&q->mu);
        return st;
    }
    w = q->free_list;
    if (!w) {
        pthread_mutex_unlock(&q->mu);
        return pdp__err(PDP_ERR_STATE, "%d collectives in flight on comm '%s' (rank %d): wait for "
                        "some (%s)", q->capacity, c->name, c->rank, q->limit_macro);
    }
    q->free_list = w->next;
    w->next = NULL;
    w->args = *args;
    w->args.seq = q->next_seq++;
    w->head.comm = c;
    w->head.op_name = pdp__op_names[args->kind];
    w->head.seq = w->args.seq;
    w->head.t_start = w->head.t_done = 0.0;
    w->t_queued = pdp__now();
    w->p2p = false;
    w->done = false;
    w->status = PDP_OK;
    w->msg[0] = '\0';
    if (q->threaded) {
        if (q->q_tail) q->q_tail->next = w;
        else q->q_head = w;
        q->q_tail = w;
        pthread_cond_signal(&q->wake);
    } else {
        pdp__workq_run(q, w);
    }
    pthread_mutex_unlock(&q->mu);
    *out = &w->head;
    return PDP_OK;
}

/* ---- comm_queue: point-to-point ----
   A send or receive is not queued behind the collectives (it would deadlock a
   ring, where every rank sends before it receives): the backend matches it
   itself (the local group's mailbox, MPI's own matching), taking its handle from
   the same pool with pdp__workq_take and completing it with pdp__workq_finish.
   Its wait is timed: timeout_s after the launch, p2p_expire withdraws an
   unmatched message and completes it with PDP_ERR_TIMEOUT. */

/* A handle for a message, t_start = launch; PDP_ERR_STATE when the pool is empty,
   the broken status when the queue is broken. */
static pdp_status pdp__workq_take(pdp_comm *c, const pdp__coll_args *args, pdp__workq_item **out)
{
    pdp__workq *q = (pdp__workq *)c->impl;
    pdp__workq_item *w;
    pthread_mutex_lock(&q->mu);
    if (q->broken) {
        pdp_status st = q->broken_status;
        pdp__err(st, "%s on comm '%s' (rank %d of %d): the communicator is broken: %s",
                 pdp__op_names[args->kind], c->name, c->rank, c->size, q->broken_msg);
        pthread_mutex_unlock(&q->mu);
        return st;
    }
    if (!(w = q->free_list)) {
        pthread_mutex_unlock(&q->mu);
        return pdp__err(PDP_ERR_STATE, "%d collectives and messages in flight on comm '%s' "
                        "(rank %d): wait for some (%s)", q->capacity, c->name, c->rank,
                        q->limit_macro);
    }
    q->free_list = w->next;
    w->next = w->p2p_next = NULL;
    w->args = *args;
    w->args.seq = q->next_seq++;
    w->head.comm = c;
    w->head.op_name = pdp__op_names[args->kind];
    w->head.seq = w->args.seq;
    w->head.t_start = w->t_queued = pdp__now();
    w->head.t_done = 0.0;
    w->p2p = true;
    q->p2p_live++;
    w->done = false;
    w->status = PDP_OK;
    w->msg[0] = '\0';
    pthread_mutex_unlock(&q->mu);
    *out = w;
    return PDP_OK;
}

/* Returns a handle that was never handed out (its launch failed). */
static void pdp__workq_untake(pdp__workq *q, pdp__workq_item *w)
{
    pthread_mutex_lock(&q->mu);
    q->p2p_live--;
    w->next = q->free_list;
    q->free_list = w;
    pthread_mutex_unlock(&q->mu);
}

/* Completes a message's handle (q->mu not held); msg without a function-name prefix. */
static void pdp__workq_finish(pdp__workq *q, pdp__workq_item *w, pdp_status st, const char *msg)
{
    double t = pdp__now();
    pdp__workq_trace(q, w, w->head.t_start, t, st);
    pthread_mutex_lock(&q->mu);
    w->head.t_done = t;
    w->status = st;
    if (st != PDP_OK) snprintf(w->msg, sizeof w->msg, "%s", msg);
    w->done = true;
    q->p2p_live--;
    pthread_cond_broadcast(&q->done);
    pthread_mutex_unlock(&q->mu);
}

/* "recv #4 (count 7) from rank 1 with tag 5 on comm 'comm', rank 0 of 2" */
static void pdp__p2p_describe(const pdp__workq_item *w, char *out, size_t cap)
{
    const pdp_comm *c = w->head.comm;
    snprintf(out, cap, "%s #%lld (count %lld) %s rank %d with tag %d on comm '%s', rank %d of %d",
             w->head.op_name, (long long)w->head.seq, (long long)w->args.count,
             w->args.kind == PDP__COLL_SEND ? "to" : "from", w->args.peer, w->args.tag, c->name,
             c->rank, c->size);
}

static void pdp__workq_p2p_timeout_msg(const pdp__workq_item *w, char *msg, size_t cap)
{
    char what[200];
    pdp__p2p_describe(w, what, sizeof what);
    snprintf(msg, cap, "%s: no matching %s from rank %d within %g s (peer %d, tag %d)", what,
             w->args.kind == PDP__COLL_SEND ? "recv" : "send", w->args.peer,
             w->head.comm->timeout_s, w->args.peer, w->args.tag);
}

/* Waits for a message (q->mu held on entry and return): polls, times out. */
static void pdp__workq_p2p_block(pdp__workq *q, pdp__workq_item *w)
{
    double deadline = w->head.t_start + w->head.comm->timeout_s;
    while (!w->done) {
        struct timespec ts;
        double now = pdp__now(), nap;
        if (q->p2p_poll) {
            pthread_mutex_unlock(&q->mu);
            q->p2p_poll(q);
            pthread_mutex_lock(&q->mu);
            if (w->done) break;
        }
        if (now > deadline) {
            pthread_mutex_unlock(&q->mu);
            q->p2p_expire(q, w);
            pthread_mutex_lock(&q->mu);
            continue;
        }
        nap = deadline - now + 1e-4;
        if (q->p2p_poll && nap > 100e-6) nap = 100e-6;
        pdp__deadline(&ts, nap);
        pthread_cond_timedwait(&q->done, &q->mu, &ts);
    }
}

static pdp_status pdp__workq_wait(pdp_work *work)
{
    pdp__workq_item *w = (pdp__workq_item *)work;
    pdp__workq *q = (pdp__workq *)work->comm->impl;
    pdp_status st;
    pthread_mutex_lock(&q->mu);
    q->waiters++;
    pthread_cond_signal(&q->wake); /* ends a pdp__workq_nap: poll hard from now on */
    if (w->p2p) pdp__workq_p2p_block(q, w);
    while (!w->done) pthread_cond_wait(&q->done, &q->mu); /* exec times out */
    q->waiters--;
    st = w->status;
    if (st != PDP_OK) pdp__err(st, "%s", w->msg);
    w->next = q->free_list; /* recycled; the head stays readable until the next launch */
    q->free_list = w;
    pthread_mutex_unlock(&q->mu);
    return st;
}

static bool pdp__workq_done(pdp_work *work)
{
    pdp__workq_item *w = (pdp__workq_item *)work;
    pdp__workq *q = (pdp__workq *)work->comm->impl;
    bool d;
    if (w->p2p && q->p2p_poll) q->p2p_poll(q);
    pthread_mutex_lock(&q->mu);
    d = w->done;
    pthread_mutex_unlock(&q->mu);
    return d;
}

/* The pdp__comm_ops entries of a queue backend: pack the arguments, submit. */

static pdp_status pdp__workq_coll(pdp_comm *c, pdp__coll_kind kind, int64_t count, int op,
                                  pdp_dtype dt, float *buf, const float *send, float *recv,
                                  pdp_work **w)
{
    pdp__coll_args a;
    memset(&a, 0, sizeof a);
    a.kind = kind;
    a.count = count;
    a.op = op;
    a.dtype = (int)dt;
    a.buf = buf;
    a.send = send;
    a.recv = recv;
    return pdp__workq_submit(c, &a, w);
}

static pdp_status pdp__workq_allreduce(pdp_comm *c, void *buf, int64_t count, pdp_dtype dt,
                                       pdp_reduce_op op, pdp_work **w)
{
    return pdp__workq_coll(c, PDP__COLL_ALLREDUCE, count, (int)op, dt, (float *)buf, NULL, NULL,
                           w);
}

static pdp_status pdp__workq_broadcast(pdp_comm *c, float *buf, int64_t count, int root,
                                       pdp_work **w)
{
    return pdp__workq_coll(c, PDP__COLL_BROADCAST, count, root, PDP_DTYPE_F32, buf, NULL, NULL,
                           w);
}

static pdp_status pdp__workq_reduce_scatter(pdp_comm *c, const void *send, void *recv,
                                            int64_t recv_count, pdp_dtype dt, pdp_reduce_op op,
                                            pdp_work **w)
{
    return pdp__workq_coll(c, PDP__COLL_REDUCE_SCATTER, recv_count, (int)op, dt, NULL,
                           (const float *)send, (float *)recv, w);
}

static pdp_status pdp__workq_allgather(pdp_comm *c, const float *send, float *recv,
                                       int64_t send_count, pdp_work **w)
{
    return pdp__workq_coll(c, PDP__COLL_ALLGATHER, send_count, 0, PDP_DTYPE_F32, NULL, send, recv,
                           w);
}

static pdp_status pdp__workq_barrier(pdp_comm *c, pdp_work **w)
{
    return pdp__workq_coll(c, PDP__COLL_BARRIER, 0, 0, PDP_DTYPE_F32, NULL, NULL, NULL, w);
}

/* Synchronous, but queued like the others so that it keeps its place in the order. */
static pdp_status pdp__workq_broadcast_bytes(pdp_comm *c, void *buf, size_t bytes, int root)
{
    pdp__coll_args a;
    pdp_work *w = NULL;
    pdp_status st;
    memset(&a, 0, sizeof a);
    a.kind = PDP__COLL_BROADCAST_BYTES;
    a.count = (int64_t)bytes;
    a.op = root;
    a.bytes_buf = buf;
    if ((st = pdp__workq_submit(c, &a, &w)) != PDP_OK) return st;
    return pdp__workq_wait(w);
}
/* ---- end src/comm_queue.c ---- */

/* ---- begin src/comm_local.c ---- */
/* comm_local: the local backend: N ranks are threads of one process, buffers in shared
   memory, no dependency; the default, and what the tests use.

   N ranks are threads of one process; a pdp_local_group is their shared
   meeting point. Each rank's communicator owns a collective queue (comm_queue.c,
   shared with the MPI backend) whose persistent progress thread runs the
   rank's collectives in issue order, so an asynchronous
   collective progresses while the rank's own thread computes (DDP overlaps a
   bucket's all-reduce with the rest of backward this way). One collective is:

     arrive    the progress thread publishes its arguments in the group's slot
               for its rank and enters barrier A. The last rank to arrive checks
               that all ranks issued the same collective (kind, count, op, root);
     work      rank r's progress thread handles slice r of the data: for an
               all-reduce it sums slice r of every rank's buffer in rank order
               0, 1, ..., N-1 (fixed, so every rank gets bit-identical sums)
               and writes the result into every rank's buffer; broadcast,
               reduce-scatter and all-gather split the same way;
     leave     barrier B: no rank's buffer is touched after it, so the handle
               completes and the rank may reuse its buffers and its slot.

   The work of one collective is therefore spread over the ranks (each moves
   about 2(N-1)/N of the buffer for an all-reduce, the ring figure), and a
   rank's buffers are only written by progress threads between A and B.

   Faults never hang: every wait in a barrier is a pthread_cond_timedwait on
   CLOCK_MONOTONIC against the group's timeout_s. A rank that does not arrive
   makes the others fail with PDP_ERR_TIMEOUT naming the collective, its
   sequence number and the missing rank; a rank whose communicator is freed
   marks itself as gone, and a rank waiting for it fails at once with
   PDP_ERR_COMM. Either way the group becomes broken: every later collective on
   any rank fails fast with the first failure's message (as an aborted NCCL
   communicator does).

   Locks: group->mu guards the barrier state, the slots and the broken flag;
   the queue's mu guards its queue, its handle pool and the handles' done
   flags. The progress thread never holds both. Buffer contents pass between
   threads only across these mutexes, so the backend is TSan clean. Handles
   come from a fixed pool per communicator: nothing is allocated per
   collective. */

/* #include "internal.h" (already above) */

/* ---- comm_local: the group ---- */

#define PDP__LOCAL_MAX_RANKS 256  /* ranks are threads: more would only oversubscribe */
#ifndef PDP_LOCAL_MAX_INFLIGHT
#  define PDP_LOCAL_MAX_INFLIGHT 256 /* handles per local communicator */
#endif

struct pdp_local_group {
    int size;
    double timeout_s;
    pdp_device device;
    char name[32];
    pthread_mutex_t mu;
    pthread_cond_t cv;        /* barrier progress, departures, breakage */
    int arrived;              /* ranks in the current barrier */
    uint64_t gen;             /* barriers completed */
    int64_t *phase;           /* per rank: barriers entered */
    pdp__coll_args *slot;     /* per rank: the collective it is executing */
    bool *joined;             /* per rank: a communicator was created */
    bool *gone;               /* per rank: its communicator was freed */
    bool broken;
    pdp_status broken_status;
    char broken_msg[PDP__MSG_CAP];
    pdp__workq_item *p2p_head, *p2p_tail; /* unmatched sends and receives, in launch order */
    void *split_out;          /* pdp_comm_split: the group this rank made as a leader */
    int refs;                 /* made by a split: communicators yet to be freed; else 0 */
};

PDP_API pdp_status pdp_local_group_create(pdp_local_group **out, int world_size,
                                          const pdp_comm_desc *desc)
{
    static const char *fn = "pdp_local_group_create";
    pdp_local_group *g;
    pthread_condattr_t ca;
    double timeout;
    pdp_status st;
    if (!out) return pdp__err(PDP_ERR_INVALID, "%s: out is NULL", fn);
    *out = NULL;
    if ((st = pdp__comm_desc_timeout(desc, &timeout, fn)) != PDP_OK) return st;
    if (world_size < 1 || world_size > PDP__LOCAL_MAX_RANKS)
        return pdp__err(PDP_ERR_INVALID, "%s: world_size %d outside 1..%d", fn, world_size,
                        PDP__LOCAL_MAX_RANKS);
    if (desc && desc->backend != PDP_BACKEND_DEFAULT && desc->backend != PDP_BACKEND_LOCAL)
        return pdp__err(PDP_ERR_INVALID, "%s: desc->backend is %d; a local group is backend local",
                        fn, (int)desc->backend);
    if (desc && desc->device.kind != PDP_DEVICE_CPU)
        return pdp__err(PDP_ERR_UNSUPPORTED, "%s: the local backend keeps buffers on the CPU "
                        "(desc->device is CUDA:%d; use the nccl backend)", fn,
                        desc->device.ordinal);
    g = (pdp_local_group *)pdp__calloc(sizeof *g);
    if (!g) return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory", fn);
    g->size = world_size;
    g->timeout_s = timeout;
    g->device = pdp_cpu();
    snprintf(g->name, sizeof g->name, "%s", desc && desc->name ? desc->name : "comm");
    g->phase = (int64_t *)pdp__calloc((size_t)world_size * sizeof *g->phase);
    g->slot = (pdp__coll_args *)pdp__calloc((size_t)world_size * sizeof *g->slot);
    g->joined = (bool *)pdp__calloc((size_t)world_size * sizeof *g->joined);
    g->gone = (bool *)pdp__calloc((size_t)world_size * sizeof *g->gone);
    if (!g->phase || !g->slot || !g->joined || !g->gone) {
        pdp__dealloc(g->phase);
        pdp__dealloc(g->slot);
        pdp__dealloc(g->joined);
        pdp__dealloc(g->gone);
        pdp__dealloc(g);
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory for %d ranks", fn, world_size);
    }
    pthread_mutex_init(&g->mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&g->cv, &ca);
    pthread_condattr_destroy(&ca);
    *out = g;
    return PDP_OK;
}

PDP_API void pdp_local_group_free(pdp_local_group *g)
{
    if (!g) return;
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    pdp__dealloc(g->phase);
    pdp__dealloc(g->slot);
    pdp__dealloc(g->joined);
    pdp__dealloc(g->gone);
    pdp__dealloc(g);
}

/* Marks the group broken with a message (first failure wins); g->mu held. */
static void pdp__group_break(pdp_local_group *g, pdp_status st, const char *msg)
{
    if (g->broken) return;
    g->broken = true;
    g->broken_status = st;
    snprintf(g->broken_msg, sizeof g->broken_msg, "%s", msg);
    pthread_cond_broadcast(&g->cv);
}

/* "allreduce #7 (count 1024) on comm 'comm', rank 0 of 2" */
static void pdp__coll_describe(const pdp_local_group *g, int rank, const pdp__coll_args *a,
                               char *out, size_t cap)
{
    snprintf(out, cap, "%s #%lld (count %lld) on comm '%s', rank %d of %d",
             pdp__op_names[a->kind], (long long)a->seq, (long long)a->count, g->name, rank,
             g->size);
}

/* The last rank into barrier A checks that everyone issued the same collective;
   g->mu held. Returns false (and breaks the group) on a mismatch. */
static bool pdp__group_validate(pdp_local_group *g)
{
    const pdp__coll_args *a = &g->slot[0];
    int r;
    for (r = 1; r < g->size; r++) {
        const pdp__coll_args *b = &g->slot[r];
        if (b->kind != a->kind || b->count != a->count || b->op != a->op ||
            b->dtype != a->dtype) {
            char msg[PDP__MSG_CAP];
            snprintf(msg, sizeof msg,
                     "collectives differ across ranks on comm '%s': rank 0 issued %s #%lld "
                     "(count %lld, op/root %d, dtype %d), rank %d issued %s #%lld (count %lld, "
                     "op/root %d, dtype %d); every rank must issue the same collectives in the "
                     "same order",
                     g->name, pdp__op_names[a->kind], (long long)a->seq, (long long)a->count,
                     a->op, a->dtype, r, pdp__op_names[b->kind], (long long)b->seq,
                     (long long)b->count, b->op, b->dtype);
            pdp__group_break(g, PDP_ERR_INVALID, msg);
            return false;
        }
    }
    return true;
}

/* Barrier A (publish = true: also publishes *args in this rank's slot) or B.
   On failure returns the status and leaves the message in msg. */
static pdp_status pdp__group_barrier(pdp_local_group *g, int rank, const pdp__coll_args *args,
                                     bool publish, char *msg, size_t cap)
{
    struct timespec deadline;
    uint64_t gen;
    int64_t my_phase;
    char what[160];
    pdp_status st = PDP_OK;
    pdp__coll_describe(g, rank, args, what, sizeof what);
    pdp__deadline(&deadline, g->timeout_s);
    pthread_mutex_lock(&g->mu);
    if (g->broken) {
        snprintf(msg, cap, "%.150s: the group is broken: %.300s", what, g->broken_msg);
        st = g->broken_status;
        goto out;
    }
    if (publish) g->slot[rank] = *args;
    my_phase = ++g->phase[rank];
    gen = g->gen;
    if (++g->arrived == g->size) {
        g->arrived = 0;
        if (!publish || pdp__group_validate(g)) {
            g->gen++;
            pthread_cond_broadcast(&g->cv);
        }
    }
    while (g->gen == gen) {
        int r, rc;
        if (g->broken) {
            snprintf(msg, cap, "%.150s: %.300s", what, g->broken_msg);
            st = g->broken_status;
            goto out;
        }
        if (g->gone[rank]) {
            snprintf(msg, cap, "%s: rank %d freed its communicator while the collective was "
                     "in flight", what, rank);
            st = PDP_ERR_COMM;
            pdp__group_break(g, st, msg);
            goto out;
        }
        for (r = 0; r < g->size; r++)
            if (g->phase[r] < my_phase && g->gone[r]) {
                snprintf(msg, cap, "%s: rank %d left the group (freed its communicator) after "
                         "collective #%lld and will never arrive", what, r,
                         (long long)g->slot[r].seq);
                st = PDP_ERR_COMM;
                pdp__group_break(g, st, msg);
                goto out;
            }
        rc = pthread_cond_timedwait(&g->cv, &g->mu, &deadline);
        if (rc == ETIMEDOUT && g->gen == gen && !g->broken) {
            size_t n;
            n = (size_t)snprintf(msg, cap, "%s: no arrival within %.3g s from rank", what,
                                 g->timeout_s);
            for (r = 0; r < g->size && n < cap; r++)
                if (g->phase[r] < my_phase)
                    n += (size_t)snprintf(msg + n, cap - n, " %d (last seen at %s #%lld)", r,
                                          pdp__op_names[g->slot[r].kind],
                                          (long long)g->slot[r].seq);
            st = PDP_ERR_TIMEOUT;
            pdp__group_break(g, st, msg);
            goto out;
        }
    }
out:
    pthread_mutex_unlock(&g->mu);
    return st;
}

/* ---- comm_local: the data movement ---- */

/* [lo, hi) of n items for part r of parts, with boundaries on 16 floats (one cache line)
   so that two ranks never write the same line. */
static void pdp__slice(int64_t n, int r, int parts, int64_t *lo, int64_t *hi)
{
    int64_t a = n * r / parts, b = n * (r + 1) / parts;
    *lo = r == 0 ? 0 : a & ~(int64_t)15;
    *hi = r == parts - 1 ? n : b & ~(int64_t)15;
    if (*hi < *lo) *hi = *lo;
}

#define PDP__CHUNK 2048

/* acc[0..n) <- op over ranks of src[i][off..off+n), in rank order: ((s0 + s1) + s2) + ...,
   then / nsrc for AVG. acc is the caller's chunk, never one of the sources, so every
   loop is a restrict-qualified blocked loop that gcc -O2 vectorises (one pass per
   source; the chunk stays in L1). */
static void pdp__reduce_chunk(float *PDP__RESTRICT acc, const float *const *src, int nsrc,
                              int64_t off, int64_t n, pdp_reduce_op op)
{
    const float *PDP__RESTRICT s0 = src[0] + off;
    int r;
    if (nsrc == 1) {
        memcpy(acc, s0, (size_t)n * sizeof *acc);
    } else {
        const float *PDP__RESTRICT s1 = src[1] + off;
        PDP__FOR_BLOCKED(j, n, acc[j] = s0[j] + s1[j];);
    }
    for (r = 2; r < nsrc; r++) {
        const float *PDP__RESTRICT s = src[r] + off;
        PDP__FOR_BLOCKED(j, n, acc[j] += s[j];);
    }
    if (op == PDP_REDUCE_AVG) {
        float div = (float)nsrc;
        PDP__FOR_BLOCKED(j, n, acc[j] /= div;);
    }
}

/* The same for 16-bit elements (dt BF16 or F16): each widened to fp32, reduced in fp32
   in rank order, AVG divided, then rounded ONCE into out (to nearest even). */
static void pdp__reduce_chunk16(uint16_t *out, float *PDP__RESTRICT acc,
                                const uint16_t *const *src, int nsrc, int64_t off, int64_t n,
                                pdp_reduce_op op, int dt)
{
    int64_t j;
    int r;
    for (j = 0; j < n; j++) acc[j] = pdp__dt16_float(dt, src[0][off + j]);
    for (r = 1; r < nsrc; r++)
        for (j = 0; j < n; j++) acc[j] += pdp__dt16_float(dt, src[r][off + j]);
    if (op == PDP_REDUCE_AVG) {
        float div = (float)nsrc;
        for (j = 0; j < n; j++) acc[j] /= div;
    }
    for (j = 0; j < n; j++) out[j] = pdp__dt16_bits(dt, acc[j]);
}

/* Rank r's share of a 16-bit all-reduce or reduce-scatter (the float loops below). */
static void pdp__local_execute16(pdp_local_group *g, int r)
{
    const pdp__coll_args *me = &g->slot[r];
    int n = g->size, i;
    float acc[PDP__CHUNK];
    uint16_t h[PDP__CHUNK];
    const uint16_t *src[PDP__LOCAL_MAX_RANKS];
    int64_t lo, hi, off, len;
    if (me->kind == PDP__COLL_ALLREDUCE) {
        pdp__slice(me->count, r, n, &lo, &hi);
        for (i = 0; i < n; i++) src[i] = (const uint16_t *)g->slot[i].buf;
        for (off = lo; off < hi; off += len) {
            len = PDP__MIN(hi - off, PDP__CHUNK);
            pdp__reduce_chunk16(h, acc, src, n, off, len, (pdp_reduce_op)me->op, me->dtype);
            for (i = 0; i < n; i++)
                memcpy((uint16_t *)g->slot[i].buf + off, h, (size_t)len * sizeof *h);
        }
    } else { /* reduce-scatter: rank r reduces slice r into its own recv */
        for (i = 0; i < n; i++) src[i] = (const uint16_t *)g->slot[i].send + (int64_t)r * me->count;
        for (off = 0; off < me->count; off += len) {
            len = PDP__MIN(me->count - off, PDP__CHUNK);
            pdp__reduce_chunk16((uint16_t *)me->recv + off, acc, src, n, off, len,
                                (pdp_reduce_op)me->op, me->dtype);
        }
    }
}

/* Rank r's share of the collective whose arguments every rank published. */
static void pdp__local_execute(pdp_local_group *g, int r)
{
    const pdp__coll_args *me = &g->slot[r];
    int n = g->size, i;
    float acc[PDP__CHUNK];
    const float *src[PDP__LOCAL_MAX_RANKS];
    int64_t lo, hi, off, len;
    if (me->dtype != PDP_DTYPE_F32) {
        pdp__local_execute16(g, r);
        return;
    }
    switch (me->kind) {
    case PDP__COLL_ALLREDUCE:
        pdp__slice(me->count, r, n, &lo, &hi);
        for (i = 0; i < n; i++) src[i] = g->slot[i].buf;
        for (off = lo; off < hi; off += len) {
            len = PDP__MIN(hi - off, PDP__CHUNK);
            pdp__reduce_chunk(acc, src, n, off, len, (pdp_reduce_op)me->op);
            for (i = 0; i < n; i++) memcpy(g->slot[i].buf + off, acc, (size_t)len * sizeof *acc);
        }
        break;
    case PDP__COLL_BROADCAST:
        pdp__slice(me->count, r, n, &lo, &hi);
        for (i = 0; i < n; i++)
            if (i != me->op && hi > lo)
                memcpy(g->slot[i].buf + lo, g->slot[me->op].buf + lo, (size_t)(hi - lo) * 4);
        break;
    case PDP__COLL_BROADCAST_BYTES:
        pdp__slice(me->count, r, n, &lo, &hi);
        for (i = 0; i < n; i++)
            if (i != me->op && hi > lo)
                memcpy((char *)g->slot[i].bytes_buf + lo, (char *)g->slot[me->op].bytes_buf + lo,
                       (size_t)(hi - lo));
        break;
    case PDP__COLL_REDUCE_SCATTER: /* rank r reduces slice r into its own recv */
        for (i = 0; i < n; i++) src[i] = g->slot[i].send + (int64_t)r * me->count;
        for (off = 0; off < me->count; off += len) {
            len = PDP__MIN(me->count - off, PDP__CHUNK);
            pdp__reduce_chunk(acc, src, n, off, len, (pdp_reduce_op)me->op);
            memcpy(me->recv + off, acc, (size_t)len * sizeof *acc);
        }
        break;
    case PDP__COLL_ALLGATHER: /* rank r writes its block into every recv */
        for (i = 0; i < n; i++) {
            float *dst = g->slot[i].recv + (int64_t)r * me->count;
            if (dst != me->send && me->count > 0)
                memmove(dst, me->send, (size_t)me->count * sizeof *dst);
        }
        break;
    case PDP__COLL_BARRIER:
    case PDP__COLL_SEND: /* never queued */
    case PDP__COLL_RECV:
    case PDP__COLL_SPLIT:
        break;
    }
}

typedef struct pdp__local_comm {
    pdp_comm head;                 /* first member */
    pdp__workq q;                  /* head.impl points here */
    pdp_local_group *g;
    pdp__workq_item pool[PDP_LOCAL_MAX_INFLIGHT];
} pdp__local_comm;

/* ---- comm_local: point-to-point ----
   The group's mailbox is one list of unmatched messages in launch order. A new
   send looks for the first receive its peer posted from this rank with the same
   tag (a new receive, for the first such send); found, the thread that launched
   the second half copies the floats and completes both handles; otherwise the
   message joins the list. Everything happens under g->mu (then the owners'
   queue locks: g->mu before q->mu, never the reverse), so no progress thread
   is involved and a ring where every rank sends first cannot deadlock. */

static int pdp__p2p_owner(const pdp__workq_item *w) { return w->head.comm->rank; }

/* Unlinks w from the mailbox; false when it is not there (matched or withdrawn). */
static bool pdp__mailbox_remove(pdp_local_group *g, pdp__workq_item *w)
{
    pdp__workq_item **pp, *prev = NULL;
    for (pp = &g->p2p_head; *pp; prev = *pp, pp = &(*pp)->p2p_next)
        if (*pp == w) {
            *pp = w->p2p_next;
            if (g->p2p_tail == w) g->p2p_tail = prev;
            w->p2p_next = NULL;
            return true;
        }
    return false;
}

/* Completes a matched pair (g->mu held): copy, or a count mismatch on both sides. */
static void pdp__p2p_match(pdp__workq_item *send, pdp__workq_item *recv)
{
    char msg[PDP__MSG_CAP], what[200];
    if (send->args.count == recv->args.count) {
        if (send->args.count > 0 && recv->args.recv != send->args.send)
            memmove(recv->args.recv, send->args.send, (size_t)send->args.count * sizeof(float));
        pdp__workq_finish((pdp__workq *)send->head.comm->impl, send, PDP_OK, "");
        pdp__workq_finish((pdp__workq *)recv->head.comm->impl, recv, PDP_OK, "");
        return;
    }
    pdp__p2p_describe(send, what, sizeof what);
    snprintf(msg, sizeof msg, "%s: count mismatch: rank %d sends %lld floats, rank %d receives "
             "%lld (recv #%lld)", what, pdp__p2p_owner(send), (long long)send->args.count,
             pdp__p2p_owner(recv), (long long)recv->args.count, (long long)recv->head.seq);
    pdp__workq_finish((pdp__workq *)send->head.comm->impl, send, PDP_ERR_INVALID, msg);
    pdp__p2p_describe(recv, what, sizeof what);
    snprintf(msg, sizeof msg, "%s: count mismatch: rank %d sends %lld floats (send #%lld), rank "
             "%d receives %lld", what, pdp__p2p_owner(send), (long long)send->args.count,
             (long long)send->head.seq, pdp__p2p_owner(recv), (long long)recv->args.count);
    pdp__workq_finish((pdp__workq *)recv->head.comm->impl, recv, PDP_ERR_INVALID, msg);
}

static pdp_status pdp__local_p2p(pdp_comm *c, pdp__coll_kind kind, float *buf, int64_t count,
                                 int peer, int tag, pdp_work **out)
{
    pdp__local_comm *lc = (pdp__local_comm *)c;
    pdp_local_group *g = lc->g;
    pdp__workq *q = (pdp__workq *)c->impl;
    pdp__coll_args a;
    pdp__workq_item *w = NULL, *m;
    pdp_status st;
    memset(&a, 0, sizeof a);
    a.kind = kind;
    a.count = count;
    a.peer = peer;
    a.tag = tag;
    if (kind == PDP__COLL_SEND) a.send = buf;
    else a.recv = buf;
    if ((st = pdp__workq_take(c, &a, &w)) != PDP_OK) return st;
    pthread_mutex_lock(&g->mu);
    if (g->broken || g->gone[peer]) {
        char what[200];
        pdp__p2p_describe(w, what, sizeof what);
        st = g->broken ? g->broken_status : PDP_ERR_COMM;
        if (g->broken) pdp__err(st, "%.200s: the group is broken: %.250s", what, g->broken_msg);
        else pdp__err(st, "%s: rank %d left the group (freed its communicator)", what, peer);
        pthread_mutex_unlock(&g->mu);
        pdp__workq_untake(q, w);
        return st;
    }
    for (m = g->p2p_head; m; m = m->p2p_next)
        if (pdp__p2p_owner(m) == peer && m->args.peer == c->rank && m->args.tag == tag &&
            m->args.kind != kind)
            break;
    if (m) {
        pdp__mailbox_remove(g, m);
        if (kind == PDP__COLL_SEND) pdp__p2p_match(w, m);
        else pdp__p2p_match(m, w);
    } else {
        if (g->p2p_tail) g->p2p_tail->p2p_next = w;
        else g->p2p_head = w;
        g->p2p_tail = w;
    }
    pthread_mutex_unlock(&g->mu);
    *out = &w->head;
    return PDP_OK;
}

static pdp_status pdp__local_send(pdp_comm *c, const float *buf, int64_t count, int peer, int tag,
                                  pdp_work **w)
{
    return pdp__local_p2p(c, PDP__COLL_SEND, (float *)buf, count, peer, tag, w);
}

static pdp_status pdp__local_recv(pdp_comm *c, float *buf, int64_t count, int peer, int tag,
                                  pdp_work **w)
{
    return pdp__local_p2p(c, PDP__COLL_RECV, buf, count, peer, tag, w);
}

static void pdp__local_p2p_expire(pdp__workq *q, pdp__workq_item *w)
{
    pdp_local_group *g = ((pdp__local_comm *)q->comm)->g;
    char msg[PDP__MSG_CAP];
    bool withdrawn;
    pthread_mutex_lock(&g->mu);
    withdrawn = pdp__mailbox_remove(g, w);
    pthread_mutex_unlock(&g->mu);
    if (!withdrawn) return; /* matched meanwhile: completed */
    pdp__workq_p2p_timeout_msg(w, msg, sizeof msg);
    pdp__workq_finish(q, w, PDP_ERR_TIMEOUT, msg);
}

/* Rank r's communicator is going (g->mu held): its unmatched messages are withdrawn, and
   those of other ranks that name it fail with PDP_ERR_COMM. */
static void pdp__mailbox_depart(pdp_local_group *g, int r)
{
    pdp__workq_item *m = g->p2p_head, *next;
    for (; m; m = next) {
        char msg[PDP__MSG_CAP], what[200];
        next = m->p2p_next;
        if (pdp__p2p_owner(m) != r && m->args.peer != r) continue;
        pdp__mailbox_remove(g, m);
        pdp__p2p_describe(m, what, sizeof what);
        snprintf(msg, sizeof msg, "%s: rank %d left the group (freed its communicator) before "
                 "the message was matched", what, r);
        pdp__workq_finish((pdp__workq *)m->head.comm->impl, m, PDP_ERR_COMM, msg);
    }
}

/* ---- comm_local: communicators ---- */

/* The queue's exec: one collective for this rank, barrier A, its share of the
   work, barrier B. */
static pdp_status pdp__local_exec(pdp__workq *q, pdp__workq_item *w, char *msg, size_t cap)
{
    pdp__local_comm *lc = (pdp__local_comm *)q->comm;
    pdp_local_group *g = lc->g;
    const pdp__coll_args *a = &w->args;
    int r = lc->head.rank;
    pdp_status st;
    if (g->size == 1) {
        if (a->kind == PDP__COLL_REDUCE_SCATTER || a->kind == PDP__COLL_ALLGATHER)
            if (a->recv != a->send && a->count > 0)
                memmove(a->recv, a->send, (size_t)a->count * pdp__dtype_size(a->dtype));
        return PDP_OK;
    }
    if ((st = pdp__group_barrier(g, r, a, true, msg, cap)) != PDP_OK) return st;
    pdp__local_execute(g, r);
    return pdp__group_barrier(g, r, a, false, msg, cap);
}

static void pdp__local_destroy(pdp_comm *c)
{
    pdp__local_comm *lc = (pdp__local_comm *)c;
    pdp_local_group *g = lc->g;
    /* gone first: a progress thread blocked in a barrier on our behalf, or a peer
       waiting for us, wakes up and fails instead of waiting out the timeout */
    bool last;
    pthread_mutex_lock(&g->mu);
    g->gone[c->rank] = true;
    pdp__mailbox_depart(g, c->rank);
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    pdp__workq_shutdown(&lc->q);
    pdp__dealloc(lc);
    pthread_mutex_lock(&g->mu);
    last = g->refs > 0 && --g->refs == 0;
    pthread_mutex_unlock(&g->mu);
    if (last) pdp_local_group_free(g); /* a split's group goes with its last communicator */
}

/* ---- comm_local: split ----
   The member that becomes rank 0 of a colour creates its group (refs = its size: the
   group frees itself with the last of them) and every rank broadcasts the pointer of
   the group it made, or NULL, over c; each member then joins its leader's group. */
static pdp_status pdp__local_split(pdp_comm *c, int colour, int key, int new_rank, int new_size,
                                   int leader, pdp_comm **out)
{
    pdp__local_comm *lc = (pdp__local_comm *)c;
    pdp_local_group *mine = NULL, *g = NULL;
    pdp_comm_desc d;
    char name[48];
    int r;
    pdp_status st = PDP_OK;
    (void)key;
    if (colour >= 0 && new_rank == 0) {
        memset(&d, 0, sizeof d);
        d.timeout_s = c->timeout_s;
        snprintf(name, sizeof name, "%.20s.%d", c->name, colour);
        d.name = name;
        /* on failure the leader still takes part below: its NULL tells the members (and
           pdp_comm_split's agreement keeps every rank in step) */
        if ((st = pdp_local_group_create(&mine, new_size, &d)) == PDP_OK) mine->refs = new_size;
    }
    for (r = 0; r < c->size; r++) {
        void *p = r == c->rank ? (void *)mine : NULL;
        pdp_status bst;
        if ((bst = c->ops->broadcast_bytes(c, &p, sizeof p, r)) != PDP_OK) return bst;
        if (r == leader) g = (pdp_local_group *)p;
    }
    (void)lc;
    if (colour < 0) return PDP_OK;
    if (!g)
        return c->rank == leader ? st : pdp__err(PDP_ERR_COMM, "rank %d (colour %d): the new "
                                                 "group's rank 0, rank %d, could not create it",
                                                 c->rank, colour, leader);
    if ((st = pdp_comm_create_local(out, g, new_rank)) != PDP_OK) {
        bool last;
        pthread_mutex_lock(&g->mu);
        g->gone[new_rank] = true;
        last = --g->refs == 0;
        pthread_cond_broadcast(&g->cv);
        pthread_mutex_unlock(&g->mu);
        if (last) pdp_local_group_free(g);
    }
    return st;
}

static const pdp__comm_ops pdp__local_ops = {
    pdp__workq_allreduce, pdp__workq_broadcast, pdp__workq_reduce_scatter,
    pdp__workq_allgather, pdp__workq_barrier,   pdp__workq_broadcast_bytes,
    pdp__local_send,      pdp__local_recv,      pdp__local_split,
    pdp__workq_wait,      pdp__workq_done,      pdp__local_destroy,
};

PDP_API pdp_status pdp_comm_create_local(pdp_comm **out, pdp_local_group *g, int rank)
{
    static const char *fn = "pdp_comm_create_local";
    pdp__local_comm *lc;
    pdp_status st;
    if (!out) return pdp__err(PDP_ERR_INVALID, "%s: out is NULL", fn);
    *out = NULL;
    if (!g) return pdp__err(PDP_ERR_INVALID, "%s: group is NULL", fn);
    if (rank < 0 || rank >= g->size)
        return pdp__err(PDP_ERR_INVALID, "%s: rank %d outside 0..%d", fn, rank, g->size - 1);
    lc = (pdp__local_comm *)pdp__calloc(sizeof *lc);
    if (!lc) return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory (rank %d)", fn, rank);
    pthread_mutex_lock(&g->mu);
    if (g->joined[rank]) {
        pthread_mutex_unlock(&g->mu);
        pdp__dealloc(lc);
        return pdp__err(PDP_ERR_INVALID, "%s: rank %d of group '%s' already has a communicator",
                        fn, rank, g->name);
    }
    g->joined[rank] = true;
    pthread_mutex_unlock(&g->mu);
    lc->head.ops = &pdp__local_ops;
    lc->head.backend = PDP_BACKEND_LOCAL;
    lc->head.rank = rank;
    lc->head.size = g->size;
    lc->head.timeout_s = g->timeout_s;
    lc->head.device = g->device;
    memcpy(lc->head.name, g->name, sizeof lc->head.name);
    lc->head.impl = &lc->q;
    lc->g = g;
    lc->q.comm = &lc->head;
    lc->q.exec = pdp__local_exec;
    lc->q.p2p_expire = pdp__local_p2p_expire;
    /* world size 1: every collective is local and immediate, no thread */
    if ((st = pdp__workq_init(&lc->q, lc->pool, PDP_LOCAL_MAX_INFLIGHT, "PDP_LOCAL_MAX_INFLIGHT",
                              g->size > 1, fn)) != PDP_OK) {
        pthread_mutex_lock(&g->mu);
        g->joined[rank] = false;
        pthread_mutex_unlock(&g->mu);
        pdp__dealloc(lc);
        return st;
    }
    *out = &lc->head;
    return PDP_OK;
}
/* ---- end src/comm_local.c ---- */

/* ---- begin src/comm_mpi.c ---- */
/* comm_mpi: the MPI communicator backend (-DPDP_MPI), and its entry in comm.c's
   dispatcher, pdp__comm_init_mpi_env: pdp_comm_init_env with PDP_BACKEND_MPI
   creates the communicator below; without PDP_MPI it fails with
   PDP_ERR_UNSUPPORTED naming the macro.

   ---- the MPI backend ----
   Rank and size come from MPI_COMM_WORLD, which every process duplicates once
   (collective: every rank calls pdp_comm_init_env, in the same order as its
   other collectives on MPI_COMM_WORLD), so pdp's traffic never matches the
   application's own messages. The duplication is MPI_Comm_idup, polled
   against timeout_s: a rank that never creates its communicator makes the
   others fail with PDP_ERR_TIMEOUT instead of hanging; the orphaned request
   is kept, and completed (or given up) before MPI_Finalize. The duplicate
   reports errors (MPI_ERRORS_RETURN) instead of aborting the job: library
   code never calls MPI_Abort, and an MPI error becomes PDP_ERR_COMM with
   MPI's error string.

   One progress thread per communicator runs the collectives in issue order,
   as PyTorch's ProcessGroupMPI does (comm_queue.c's collective queue, shared with
   the local backend; this file supplies its exec, idle and destroy): a launch
   only queues a handle from a fixed pool (PDP_MPI_MAX_INFLIGHT, nothing is
   allocated per collective) and returns, so the calling rank keeps computing
   backward while the all-reduce runs. The thread posts the non-blocking call (MPI_Iallreduce, MPI_Ibcast,
   MPI_Ireduce_scatter_block, MPI_Iallgather, MPI_Ibarrier) and drives it with
   MPI_Test: spinning for a few hundred polls (small collectives finish there),
   then, while the rank's own thread is blocked in pdp_wait and its core is
   idle, yielding between polls for up to 2 ms; otherwise (the rank computes,
   or a peer is late) sleeping 200 us between polls (500 us once a collective has
   waited 20 ms), so that backward keeps its core and the poll latency hides
   under it. AVG is SUM followed by a division by the size on every element, as
   the local backend does. 16-bit elements (pdp_comm_allreduce_ex and
   reduce_scatter_ex with BF16 or F16) travel as MPI_UINT16_T and are summed by
   one of two user-defined MPI_Ops created with the communicator (comm.h states
   their rounding). MPI counts are int: an all-reduce or broadcast is
   split into calls of PDP_MPI_CHUNK elements; reduce-scatter and all-gather take
   at most INT_MAX elements per rank.
   In-place forms: all-gather with send == recv + rank * count, and
   reduce-scatter with recv == send + rank * count (NCCL's convention).

   Timeouts: MPI cannot time out, so the progress thread is the watchdog. A
   collective that has not completed timeout_s after the thread posted it fails
   with PDP_ERR_TIMEOUT naming the collective, its sequence number and the
   communicator (MPI cannot say which rank is missing). The communicator is
   then broken (the queue is sticky): queued and later collectives fail at
   once with the same status and message, as an aborted NCCL communicator
   does. The timed-out request
   cannot be cancelled (MPI forbids cancelling collectives); the thread keeps
   testing it, so a late rank still completes it and the communicator can be
   freed cleanly. pdp_comm_free gives an in-flight request one more second,
   then abandons it: the duplicate communicator and the request are leaked,
   and pdp will not call MPI_Finalize, because that may hang on them.

   MPI initialisation: if MPI is not initialised, the first pdp_comm_init_env
   calls MPI_Init_thread(MPI_THREAD_MULTIPLE), and pdp_comm_free of the last
   MPI communicator calls MPI_Finalize (MPI cannot be initialised twice, so a
   program that creates MPI communicators one after another, or uses MPI
   itself, calls MPI_Init_thread first and MPI_Finalize last; pdp then never
   finalises). MPI_THREAD_MULTIPLE is required: the progress thread calls MPI
   while the application's threads may. That ownership record (a count of
   live communicators and whether pdp initialised MPI) is process-wide,
   behind a mutex, because MPI's own initialisation is.

   Locks: the queue's mu guards the queue, the pool, the handles' done/status,
   the broken state and the orphan; the progress thread never holds it inside
   an MPI call.
   Buffers pass to the progress thread and back across that mutex (TSan finds
   nothing in this file; OpenMPI's own internals draw reports of their own).
   Reference: MPI 3.1, chapter 5.12 (non-blocking collectives). */

/* #include "internal.h" (already above) */

#ifdef PDP_MPI
#include <mpi.h>
#include <sched.h>

#ifndef PDP_MPI_MAX_INFLIGHT
#  define PDP_MPI_MAX_INFLIGHT 256 /* handles per MPI communicator */
#endif
#ifndef PDP_MPI_CHUNK
#  define PDP_MPI_CHUNK (1 << 30)  /* elements per MPI call of an all-reduce or broadcast */
#endif
#define PDP__MPI_FREE_GRACE_S 1.0  /* pdp_comm_free waits this long for an in-flight request */

/* ---- comm_mpi: process-wide MPI ownership ---- */

static pthread_mutex_t pdp__mpi_mu = PTHREAD_MUTEX_INITIALIZER;
static int pdp__mpi_live;          /* MPI communicators alive */
static bool pdp__mpi_we_init;      /* pdp called MPI_Init_thread, so it finalises */
static bool pdp__mpi_unclean;      /* a request was abandoned: never call MPI_Finalize */
static bool pdp__mpi_init_orphan;  /* a timed-out MPI_Comm_idup, completed before finalising */
static MPI_Request pdp__mpi_init_req;
static MPI_Comm pdp__mpi_init_comm;

/* ---- comm_mpi: state ---- */

/* A message in flight: its MPI request (and, for a receive, whether MPI has matched it). */
typedef struct pdp__mpi_p2p {
    bool active;        /* launched, not completed */
    bool posted;        /* a send: always; a receive: matched by MPI_Improbe, MPI_Imrecv posted */
    MPI_Request req;
} pdp__mpi_p2p;

typedef struct pdp__mpi_comm {
    pdp_comm head;               /* first member */
    pdp__workq q;                /* head.impl points here; sticky, with an idle poll */
    MPI_Comm mcomm;              /* our duplicate of MPI_COMM_WORLD */
    MPI_Op op16[2];              /* the 16-bit sums (BF16, F16) over MPI_UINT16_T; MPI_OP_NULL
                                    until created */
    bool orphan;                 /* a timed-out request is still pending (q.mu) */
    MPI_Request orphan_req;
    bool traced;                 /* pdp__trace_open succeeded: close at free */
    pthread_mutex_t p2p_mu;      /* guards p2p[] and every MPI call on its requests */
    int p2p_active;              /* messages in flight */
    pdp__workq_item pool[PDP_MPI_MAX_INFLIGHT];
    pdp__mpi_p2p p2p[PDP_MPI_MAX_INFLIGHT]; /* by pool index */
} pdp__mpi_comm;

/* ---- comm_mpi: executing a collective (the queue's exec and idle) ---- */

static void pdp__mpi_errstr(int rc, char *out, size_t cap)
{
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, s, &len) != MPI_SUCCESS) len = 0;
    s[len < MPI_MAX_ERROR_STRING ? len : MPI_MAX_ERROR_STRING - 1] = '\0';
    snprintf(out, cap, "%s (MPI error %d)", len ? s : "unknown", rc);
}

/* ---- comm_mpi: point-to-point ----
   MPI_Isend at launch; a receive is matched with MPI_Improbe first, so that a
   count mismatch names both counts (the message is then consumed with a
   zero-count MPI_Mrecv), then MPI_Imrecv. Every pending message of the
   communicator is advanced by whoever polls: a thread in pdp_work_wait or
   pdp_work_done on a message, and the progress thread while it drives a
   collective or idles, so a ring where every rank sends first completes even
   under MPI's rendezvous protocol. A message not complete timeout_s after its
   launch fails with PDP_ERR_TIMEOUT naming peer and tag: an unmatched receive
   is simply withdrawn; a send or a matched receive is cancelled (MPI_Cancel),
   and if MPI does not confirm within a second its request is abandoned (pdp
   then never calls MPI_Finalize, as for a timed-out collective). */

static void pdp__mpi_p2p_fail(pdp__mpi_comm *mc, pdp__workq_item *w, pdp_status st,
                              const char *msg)
{
    mc->p2p[w - mc->pool].active = false;
    mc->p2p_active--;
    pdp__workq_finish(&mc->q, w, st, msg);
}

/* Advances one message (p2p_mu held). */
static void pdp__mpi_p2p_step(pdp__mpi_comm *mc, pdp__workq_item *w)
{
    pdp__mpi_p2p *p = &mc->p2p[w - mc->pool];
    const pdp__coll_args *a = &w->args;
    char msg[PDP__MSG_CAP], what[200], e[256];
    int flag = 0, rc, n = 0;
    MPI_Status status;
    if (!p->posted) { /* an unmatched receive */
        MPI_Message m;
        rc = MPI_Improbe(a->peer, a->tag, mc->mcomm, &flag, &m, &status);
        if (rc == MPI_SUCCESS && !flag) return;
        if (rc == MPI_SUCCESS) rc = MPI_Get_count(&status, MPI_FLOAT, &n);
        if (rc == MPI_SUCCESS && (int64_t)n != a->count) {
            MPI_Mrecv(NULL, 0, MPI_FLOAT, &m, MPI_STATUS_IGNORE); /* consume: MPI_ERR_TRUNCATE */
            pdp__p2p_describe(w, what, sizeof what);
            snprintf(msg, sizeof msg, "%s: count mismatch: rank %d sends %d floats, rank %d "
                     "receives %lld", what, a->peer, n, mc->head.rank, (long long)a->count);
            pdp__mpi_p2p_fail(mc, w, PDP_ERR_INVALID, msg);
            return;
        }
        if (rc == MPI_SUCCESS) rc = MPI_Imrecv(a->recv, (int)a->count, MPI_FLOAT, &m, &p->req);
        if (rc != MPI_SUCCESS) goto mpi_error;
        p->posted = true;
    }
    rc = MPI_Test(&p->req, &flag, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) goto mpi_error;
    if (!flag) return;
    p->active = false;
    mc->p2p_active--;
    pdp__workq_finish(&mc->q, w, PDP_OK, "");
    return;
mpi_error:
    pdp__mpi_errstr(rc, e, sizeof e);
    pdp__p2p_describe(w, what, sizeof what);
    snprintf(msg, sizeof msg, "%s: %s", what, e);
    pdp__mpi_p2p_fail(mc, w, PDP_ERR_COMM, msg);
}

static void pdp__mpi_p2p_poll(pdp__workq *q)
{
    pdp__mpi_comm *mc = (pdp__mpi_comm *)q->comm;
    int i;
    pthread_mutex_lock(&mc->p2p_mu);
    for (i = 0; i < PDP_MPI_MAX_INFLIGHT && mc->p2p_active; i++)
        if (mc->p2p[i].active) pdp__mpi_p2p_step(mc, &mc->pool[i]);
    pthread_mutex_unlock(&mc->p2p_mu);
}

static void pdp__mpi_p2p_expire(pdp__workq *q, pdp__workq_item *w)
{
    pdp__mpi_comm *mc = (pdp__mpi_comm *)q->comm;
    pdp__mpi_p2p *p = &mc->p2p[w - mc->pool];
    char msg[PDP__MSG_CAP];
    pthread_mutex_lock(&mc->p2p_mu);
    if (p->active) {
        if (p->posted) { /* cancel; MPI completes a cancelled request */
            double give_up = pdp__now() + PDP__MPI_FREE_GRACE_S;
            int flag = 0;
            MPI_Cancel(&p->req);
            while (!flag && pdp__now() < give_up)
                if (MPI_Test(&p->req, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) break;
            if (!flag) {
                MPI_Request_free(&p->req);
                pthread_mutex_lock(&pdp__mpi_mu);
                pdp__mpi_unclean = true;
                pthread_mutex_unlock(&pdp__mpi_mu);
            }
        }
        pdp__workq_p2p_timeout_msg(w, msg, sizeof msg);
        pdp__mpi_p2p_fail(mc, w, PDP_ERR_TIMEOUT, msg);
    }
    pthread_mutex_unlock(&mc->p2p_mu);
}

static pdp_status pdp__mpi_p2p_launch(pdp_comm *c, pdp__coll_kind kind, float *buf,
                                      int64_t count, int peer, int tag, pdp_work **out)
{
    pdp__mpi_comm *mc = (pdp__mpi_comm *)c;
    pdp__coll_args a;
    pdp__workq_item *w = NULL;
    pdp__mpi_p2p *p;
    pdp_status st;
    int rc = MPI_SUCCESS;
    if (count > INT32_MAX)
        return pdp__err(PDP_ERR_UNSUPPORTED, "%s of %lld elements on comm '%s' (rank %d): the MPI "
                        "backend takes at most %d (MPI counts are int)", pdp__op_names[kind],
                        (long long)count, c->name, c->rank, (int)INT32_MAX);
    memset(&a, 0, sizeof a);
    a.kind = kind;
    a.count = count;
    a.peer = peer;
    a.tag = tag;
    if (kind == PDP__COLL_SEND) a.send = buf;
    else a.recv = buf;
    if ((st = pdp__workq_take(c, &a, &w)) != PDP_OK) return st;
    p = &mc->p2p[w - mc->pool];
    pthread_mutex_lock(&mc->p2p_mu);
    p->posted = kind == PDP__COLL_SEND;
    if (kind == PDP__COLL_SEND)
        rc = MPI_Isend(buf, (int)count, MPI_FLOAT, peer, tag, mc->mcomm, &p->req);
    if (rc == MPI_SUCCESS) {
        p->active = true;
        mc->p2p_active++;
        pdp__mpi_p2p_step(mc, w); /* a receive whose message is already here matches now */
    }
    pthread_mutex_unlock(&mc->p2p_mu);
    if (rc != MPI_SUCCESS) {
        char e[256];
        pdp__mpi_errstr(rc, e, sizeof e);
        pdp__workq_untake(&mc->q, w);
        return pdp__err(PDP_ERR_COMM, "send to rank %d with tag %d on comm '%s' (rank %d): "
                        "MPI_Isend failed: %s", peer, tag, c->name, c->rank, e);
    }
    *out = &w->head;
    return PDP_OK;
}

static pdp_status pdp__mpi_send(pdp_comm *c, const float *buf, int64_t count, int peer, int tag,
                                pdp_work **w)
{
    return pdp__mpi_p2p_launch(c, PDP__COLL_SEND, (float *)buf, count, peer, tag, w);
}

static pdp_status pdp__mpi_recv(pdp_comm *c, float *buf, int64_t count, int peer, int tag,
                                pdp_work **w)
{
    return pdp__mpi_p2p_launch(c, PDP__COLL_RECV, buf, count, peer, tag, w);
}

/* Drives *req to completion: PDP_OK; PDP_ERR_TIMEOUT after deadline, or
   PDP_ERR_COMM when the communicator is being freed, with *req left pending
   (the caller records it as the orphan). */
static pdp_status pdp__mpi_drive(pdp__mpi_comm *mc, const pdp__workq_item *w, MPI_Request *req,
                                 double deadline, char *msg, size_t cap)
{
    pdp_comm *c = &mc->head;
    double t0 = pdp__now(), now, since;
    long polls = 0;
    for (;;) {
        int flag = 0, rc = MPI_Test(req, &flag, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) {
            char e[256];
            pdp__mpi_errstr(rc, e, sizeof e);
            snprintf(msg, cap, "%s #%lld on comm '%s' (rank %d of %d): MPI_Test failed: %s",
                     w->head.op_name, (long long)w->head.seq, c->name, c->rank, c->size, e);
            return PDP_ERR_COMM;
        }
        if (flag) return PDP_OK;
        now = pdp__now();
        if (now > deadline) {
            snprintf(msg, cap, "%s #%lld (%lld elements) on comm '%s' did not complete within "
                     "%g s on rank %d of %d: at least one rank did not arrive (it skipped the "
                     "collective, issued another one, hangs or died; MPI cannot say which); "
                     "the communicator is broken", w->head.op_name, (long long)w->head.seq,
                     (long long)w->args.count, c->name, c->timeout_s, c->rank, c->size);
            return PDP_ERR_TIMEOUT;
        }
        if ((++polls & 63) == 0 && pdp__workq_stopping(&mc->q, &since) &&
            now > since + PDP__MPI_FREE_GRACE_S) {
            snprintf(msg, cap, "%s #%lld on comm '%s' (rank %d): abandoned in flight when the "
                     "communicator was freed", w->head.op_name, (long long)w->head.seq, c->name,
                     c->rank);
            return PDP_ERR_COMM;
        }
        if ((polls & 63) == 0) pdp__mpi_p2p_poll(&mc->q);
        if (polls < 256) continue; /* spin: small collectives finish here */
        /* then yield while the rank waits (for 2 ms: its core is ours); otherwise nap
           200 us (500 us once a peer has kept us 20 ms), since a yielding poller would
           take a share of a core from backward or from whatever keeps the peer busy */
        if (!pdp__workq_nap(&mc->q, now - t0 < 20e-3 ? 200e-6 : 500e-6, now - t0 < 2e-3))
            sched_yield();
    }
}

/* Posts one MPI call; PDP_ERR_COMM with MPI's message when it fails. */
static pdp_status pdp__mpi_posted(pdp__mpi_comm *mc, const pdp__workq_item *w, int rc, const char *call,
                                  char *msg, size_t cap)
{
    char e[256];
    if (rc == MPI_SUCCESS) return PDP_OK;
    pdp__mpi_errstr(rc, e, sizeof e);
    snprintf(msg, cap, "%s #%lld on comm '%s' (rank %d of %d): %s failed: %s", w->head.op_name,
             (long long)w->head.seq, mc->head.name, mc->head.rank, mc->head.size, call, e);
    return PDP_ERR_COMM;
}

static void pdp__mpi_divide(void *buf, int64_t n, int size, int dt)
{
    float div = (float)size;
    if (dt == PDP_DTYPE_F32) {
        float *PDP__RESTRICT p = (float *)buf;
        PDP__FOR_BLOCKED(i, n, p[i] /= div;);
    } else {
        uint16_t *h = (uint16_t *)buf;
        int64_t i;
        for (i = 0; i < n; i++) h[i] = pdp__dt16_bits(dt, pdp__dt16_float(dt, h[i]) / div);
    }
}

/* The 16-bit sums, MPI user functions over MPI_UINT16_T: both values widened, added in
   fp32 and rounded once to nearest even (commutative, so MPI may combine in any order). */
static void pdp__mpi_sum16(const uint16_t *in, uint16_t *inout, int len, int dt)
{
    int i;
    for (i = 0; i < len; i++)
        inout[i] = pdp__dt16_bits(dt, pdp__dt16_float(dt, in[i]) + pdp__dt16_float(dt, inout[i]));
}
static void pdp__mpi_sum_bf16(void *in, void *inout, int *len, MPI_Datatype *type)
{
    (void)type;
    pdp__mpi_sum16((const uint16_t *)in, (uint16_t *)inout, *len, PDP_DTYPE_BF16);
}
static void pdp__mpi_sum_f16(void *in, void *inout, int *len, MPI_Datatype *type)
{
    (void)type;
    pdp__mpi_sum16((const uint16_t *)in, (uint16_t *)inout, *len, PDP_DTYPE_F16);
}

/* Runs one collective to completion on the progress thread. */
static pdp_status pdp__mpi_run(pdp__mpi_comm *mc, const pdp__workq_item *w, MPI_Request *req,
                               char *msg, size_t cap)
{
    const pdp__coll_args *a = &w->args;
    MPI_Comm mcomm = mc->mcomm;
    double deadline = w->head.t_start + mc->head.timeout_s;
    int size = mc->head.size, rank = mc->head.rank, n;
    int64_t off, len;
    size_t es = pdp__dtype_size(a->dtype);
    MPI_Datatype type = a->dtype == PDP_DTYPE_F32 ? MPI_FLOAT : MPI_UINT16_T;
    MPI_Op sum = a->dtype == PDP_DTYPE_F32 ? MPI_SUM : mc->op16[a->dtype == PDP_DTYPE_F16];
    pdp_status st;
    *req = MPI_REQUEST_NULL;
    switch (a->kind) {
    case PDP__COLL_ALLREDUCE:
    case PDP__COLL_BROADCAST:
    case PDP__COLL_BROADCAST_BYTES:
        for (off = 0; off < a->count; off += len) {
            len = PDP__MIN(a->count - off, (int64_t)PDP_MPI_CHUNK);
            n = (int)len;
            if (a->kind == PDP__COLL_ALLREDUCE)
                st = pdp__mpi_posted(mc, w, MPI_Iallreduce(MPI_IN_PLACE, (char *)a->buf + off * es,
                                     n, type, sum, mcomm, req), "MPI_Iallreduce", msg, cap);
            else if (a->kind == PDP__COLL_BROADCAST)
                st = pdp__mpi_posted(mc, w, MPI_Ibcast(a->buf + off, n, MPI_FLOAT, a->op, mcomm,
                                     req), "MPI_Ibcast", msg, cap);
            else
                st = pdp__mpi_posted(mc, w, MPI_Ibcast((char *)a->bytes_buf + off, n, MPI_BYTE,
                                     a->op, mcomm, req), "MPI_Ibcast", msg, cap);
            if (st == PDP_OK) st = pdp__mpi_drive(mc, w, req, deadline, msg, cap);
            if (st != PDP_OK) return st;
        }
        if (a->kind == PDP__COLL_ALLREDUCE && a->op == PDP_REDUCE_AVG)
            pdp__mpi_divide(a->buf, a->count, size, a->dtype);
        return PDP_OK;
    case PDP__COLL_REDUCE_SCATTER: {
        void *mine = (char *)a->send + (int64_t)rank * a->count * (int64_t)es; /* in-place slot */
        bool in_place = (void *)a->recv == mine;
        n = (int)a->count;
        if (size == 1) {
            if (a->recv != a->send && n > 0) memmove(a->recv, a->send, (size_t)n * es);
        } else {
            /* in place, MPI leaves the result at the start of the buffer */
            st = pdp__mpi_posted(mc, w, MPI_Ireduce_scatter_block(
                                     in_place ? MPI_IN_PLACE : (void *)a->send,
                                     in_place ? (void *)a->send : (void *)a->recv, n, type,
                                     sum, mcomm, req),
                                 "MPI_Ireduce_scatter_block", msg, cap);
            if (st == PDP_OK) st = pdp__mpi_drive(mc, w, req, deadline, msg, cap);
            if (st != PDP_OK) return st;
            if (in_place && rank > 0) memmove(a->recv, a->send, (size_t)n * es);
        }
        if (a->op == PDP_REDUCE_AVG) pdp__mpi_divide(a->recv, a->count, size, a->dtype);
        return PDP_OK;
    }
    case PDP__COLL_ALLGATHER: {
        bool in_place = a->send == a->recv + (int64_t)rank * a->count;
        n = (int)a->count;
        st = pdp__mpi_posted(mc, w, MPI_Iallgather(in_place ? MPI_IN_PLACE : (void *)a->send,
                             n, MPI_FLOAT, a->recv, n, MPI_FLOAT, mcomm, req),
                             "MPI_Iallgather", msg, cap);
        if (st == PDP_OK) st = pdp__mpi_drive(mc, w, req, deadline, msg, cap);
        return st;
    }
    case PDP__COLL_BARRIER:
        st = pdp__mpi_posted(mc, w, MPI_Ibarrier(mcomm, req), "MPI_Ibarrier", msg, cap);
        if (st == PDP_OK) st = pdp__mpi_drive(mc, w, req, deadline, msg, cap);
        return st;
    case PDP__COLL_SPLIT: /* blocking, but every rank is known to have arrived (comm.c) */
        return pdp__mpi_posted(mc, w, MPI_Comm_split(mcomm, a->op < 0 ? MPI_UNDEFINED : a->op,
                               (int)a->count, (MPI_Comm *)a->out), "MPI_Comm_split", msg, cap);
    case PDP__COLL_SEND: /* never queued */
    case PDP__COLL_RECV:
        break;
    }
    snprintf(msg, cap, "comm_mpi: unknown collective kind %d", (int)a->kind);
    return PDP_ERR_STATE;
}

/* The queue's exec; a request posted but never completed becomes the orphan. */
static pdp_status pdp__mpi_exec(pdp__workq *q, pdp__workq_item *w, char *msg, size_t cap)
{
    pdp__mpi_comm *mc = (pdp__mpi_comm *)q->comm;
    MPI_Request req;
    pdp_status st = pdp__mpi_run(mc, w, &req, msg, cap);
    if (st != PDP_OK && req != MPI_REQUEST_NULL) {
        pthread_mutex_lock(&q->mu);
        mc->orphan = true;
        mc->orphan_req = req;
        pthread_mutex_unlock(&q->mu);
    }
    return st;
}

/* Sleeps 1 ms, then tests the orphan once: true when it completed. */
static bool pdp__mpi_orphan_test(MPI_Request *req)
{
    int flag = 0;
    struct timespec ts = {0, 1000000}; /* 1 ms */
    nanosleep(&ts, NULL);
    if (MPI_Test(req, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) flag = 0;
    return flag != 0;
}

/* The queue's idle hook (q->mu held): keep a timed-out request moving, so
   that a late rank completes it and the communicator can be freed cleanly. */
static bool pdp__mpi_idle(pdp__workq *q)
{
    pdp__mpi_comm *mc = (pdp__mpi_comm *)q->comm;
    bool done;
    if (q->p2p_live) { /* keep messages moving while the rank computes */
        struct timespec ts = {0, 200000}; /* 200 us */
        pthread_mutex_unlock(&q->mu);
        pdp__mpi_p2p_poll(q);
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&q->mu);
        return true;
    }
    if (!mc->orphan) return false;
    pthread_mutex_unlock(&q->mu);
    done = pdp__mpi_orphan_test(&mc->orphan_req);
    pthread_mutex_lock(&q->mu);
    if (done) mc->orphan = false;
    return true;
}

/* ---- comm_mpi: the ops table ---- */

static pdp_status pdp__mpi_int_count(const pdp_comm *c, int64_t count, const char *what)
{
    if (count <= INT32_MAX) return PDP_OK;
    return pdp__err(PDP_ERR_UNSUPPORTED, "%s of %lld elements per rank on comm '%s' (rank %d): the "
                    "MPI backend takes at most %d (MPI counts are int)", what, (long long)count,
                    c->name, c->rank, (int)INT32_MAX);
}

static pdp_status pdp__mpi_reduce_scatter(pdp_comm *c, const void *send, void *recv,
                                          int64_t recv_count, pdp_dtype dt, pdp_reduce_op op,
                                          pdp_work **w)
{
    pdp_status st;
    if ((st = pdp__mpi_int_count(c, recv_count, "reduce_scatter")) != PDP_OK) return st;
    return pdp__workq_reduce_scatter(c, send, recv, recv_count, dt, op, w);
}

static pdp_status pdp__mpi_allgather(pdp_comm *c, const float *send, float *recv,
                                     int64_t send_count, pdp_work **w)
{
    pdp_status st;
    if ((st = pdp__mpi_int_count(c, send_count, "allgather")) != PDP_OK) return st;
    return pdp__workq_allgather(c, send, recv, send_count, w);
}

/* Tests *req until it completes (true) or deadline passes (false). */
static bool pdp__mpi_poll_until(MPI_Request *req, double deadline)
{
    for (;;) {
        int flag = 0;
        struct timespec ts = {0, 100000}; /* 100 us: creation and shutdown only */
        if (MPI_Test(req, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) return false;
        if (flag) return true;
        if (pdp__now() > deadline) return false;
        nanosleep(&ts, NULL);
    }
}

/* Drops one reference to MPI; the last one finalises it if pdp initialised it
   (after completing a timed-out duplication, if its late rank came after all). */
static void pdp__mpi_release(void)
{
    pthread_mutex_lock(&pdp__mpi_mu);
    if (--pdp__mpi_live == 0 && pdp__mpi_init_orphan) {
        if (pdp__mpi_poll_until(&pdp__mpi_init_req, pdp__now() + PDP__MPI_FREE_GRACE_S)) {
            MPI_Comm_free(&pdp__mpi_init_comm);
            pdp__mpi_init_orphan = false;
        } else {
            pdp__mpi_unclean = true;
        }
    }
    if (pdp__mpi_live == 0 && pdp__mpi_we_init && !pdp__mpi_unclean) {
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (!finalized) MPI_Finalize();
        pdp__mpi_we_init = false;
    }
    pthread_mutex_unlock(&pdp__mpi_mu);
}

static void pdp__mpi_destroy(pdp_comm *c)
{
    pdp__mpi_comm *mc = (pdp__mpi_comm *)c;
    int i;
    pdp__workq_shutdown(&mc->q);
    /* messages never waited: an unmatched receive is dropped, the rest cancelled */
    pthread_mutex_lock(&mc->p2p_mu);
    for (i = 0; i < PDP_MPI_MAX_INFLIGHT; i++)
        if (mc->p2p[i].active && mc->p2p[i].posted) {
            int flag = 0;
            MPI_Test(&mc->p2p[i].req, &flag, MPI_STATUS_IGNORE);
            if (!flag) {
                MPI_Cancel(&mc->p2p[i].req);
                if (!pdp__mpi_poll_until(&mc->p2p[i].req, pdp__now() + PDP__MPI_FREE_GRACE_S))
                    mc->orphan = true; /* leave mcomm alone and never finalise */
            }
        }
    pthread_mutex_unlock(&mc->p2p_mu);
    pthread_mutex_destroy(&mc->p2p_mu);
    /* give a timed-out request a last chance to complete */
    while (mc->orphan && pdp__now() < mc->q.stop_time + PDP__MPI_FREE_GRACE_S)
        if (pdp__mpi_orphan_test(&mc->orphan_req)) mc->orphan = false;
    if (mc->orphan) { /* a request that never completed still references mcomm: leave both */
        pthread_mutex_lock(&pdp__mpi_mu);
        pdp__mpi_unclean = true;
        pthread_mutex_unlock(&pdp__mpi_mu);
    } else {
        MPI_Comm_free(&mc->mcomm);
    }
    for (i = 0; i < 2; i++)
        if (mc->op16[i] != MPI_OP_NULL) MPI_Op_free(&mc->op16[i]);
    if (mc->traced) pdp__trace_close();
    pdp__dealloc(mc);
    pdp__mpi_release();
}

static pdp_status pdp__mpi_split(pdp_comm *c, int colour, int key, int new_rank, int new_size,
                                 int leader, pdp_comm **out);

static const pdp__comm_ops pdp__mpi_ops = {
    pdp__workq_allreduce, pdp__workq_broadcast, pdp__mpi_reduce_scatter,
    pdp__mpi_allgather,   pdp__workq_barrier,   pdp__workq_broadcast_bytes,
    pdp__mpi_send,        pdp__mpi_recv,        pdp__mpi_split,
    pdp__workq_wait,      pdp__workq_done,      pdp__mpi_destroy,
};

/* ---- comm_mpi: bounded start-up ----
   MPI_Init_thread cannot be interrupted and has no timeout: a rank that never
   starts leaves the others inside it until the launcher gives up. pdp bounds
   what it can around it (comm.h states the contract):
     the start-up check  with a store port in the environment (PDP_STORE_PORT or
                         MASTER_PORT) and the ranks named by the launcher
                         (OMPI_COMM_WORLD_* or RANK/WORLD_SIZE), every rank checks
                         in at the TCP store (rendezvous.c; rank 0 serves it) BEFORE
                         calling MPI_Init_thread, and waits up to timeout_s for all
                         the others: a missing rank makes the others fail with
                         PDP_ERR_TIMEOUT naming it, and MPI_Init_thread is never
                         called, so nothing hangs. The store stays open until
                         MPI_Init_thread returned (rank 0 serves the latecomers);
     the watchdog        a thread started before MPI_Init_thread: when it has not
                         returned timeout_s later, the watchdog calls desc->log
                         (PDP_LOG_ERROR, from the watchdog thread) once, naming this
                         rank, what it waits for and, when the start-up check passed,
                         that every rank had checked in. It never exits or aborts:
                         the rank stays in MPI_Init_thread until MPI returns or the
                         launcher ends the job. */

typedef struct pdp__mpi_watch {
    pthread_mutex_t mu;
    pthread_cond_t cv;      /* CLOCK_MONOTONIC */
    bool done;              /* MPI_Init_thread returned */
    double timeout_s;
    pdp_log_fn log;
    void *log_user;
    char msg[512];
} pdp__mpi_watch;

static void *pdp__mpi_watchdog(void *arg)
{
    pdp__mpi_watch *w = (pdp__mpi_watch *)arg;
    struct timespec deadline;
    bool fired = false;
    pdp__deadline(&deadline, w->timeout_s);
    pthread_mutex_lock(&w->mu);
    while (!w->done && !fired)
        fired = pthread_cond_timedwait(&w->cv, &w->mu, &deadline) == ETIMEDOUT && !w->done;
    pthread_mutex_unlock(&w->mu);
    if (fired && w->log) w->log(PDP_LOG_ERROR, w->msg, w->log_user);
    return NULL;
}

/* The start-up check (above); *store is left open for the caller to free after
   MPI_Init_thread, NULL when no check ran. *checked: every rank checked in. */
static pdp_status pdp__mpi_start_check(pdp_store **store, const pdp_env_info *env,
                                       double timeout_s, bool *checked, const char *fn)
{
    double deadline = pdp__now() + timeout_s;
    char key[64], missing[200];
    const char *k = key;
    size_t len = 0;
    int r, nmissing = 0;
    pdp_status st;
    *store = NULL;
    *checked = false;
    if (!env->from_env || env->world_size < 2) return PDP_OK;
    if (!getenv("PDP_STORE_PORT") && !getenv("MASTER_PORT")) return PDP_OK;
    if ((st = pdp__rendezvous_store(store, env, timeout_s, "MPI start-up check", fn)) != PDP_OK) {
        if (st == PDP_ERR_TIMEOUT && env->rank != 0)
            return pdp__err(st, "%s: MPI start-up check: rank %d of %d: missing rank 0: it did not "
                            "start within %g s (its TCP store at %s never answered); "
                            "MPI_Init_thread was not called", fn, env->rank, env->world_size,
                            timeout_s, env->master_addr);
        return st;
    }
    snprintf(key, sizeof key, "pdp/mpi_start/%d", env->rank);
    if ((st = pdp_store_set(*store, key, "", 0)) != PDP_OK) goto fail;
    missing[0] = '\0';
    for (r = 0; r < env->world_size; r++) {
        double left = deadline - pdp__now();
        snprintf(key, sizeof key, "pdp/mpi_start/%d", r);
        st = pdp_store_wait(*store, &k, 1, left > 1e-3 ? left : 1e-3);
        if (st == PDP_ERR_TIMEOUT) {
            if (len < sizeof missing - 16)
                len += (size_t)snprintf(missing + len, sizeof missing - len, " %d", r);
            nmissing++;
        } else if (st != PDP_OK) {
            goto fail;
        }
    }
    if (env->rank != 0) { /* rank 0 keeps serving until every present rank has its answer */
        snprintf(key, sizeof key, "pdp/mpi_start_seen/%d", env->rank);
        if (nmissing && (st = pdp_store_set(*store, key, "", 0)) != PDP_OK) goto fail;
    } else if (nmissing) {
        double grace = pdp__now() + (timeout_s < 1.0 ? timeout_s : 1.0);
        for (r = 1; r < env->world_size; r++) {
            double left = grace - pdp__now();
            snprintf(key, sizeof key, "pdp/mpi_start/%d", r);
            if (pdp_store_wait(*store, &k, 1, 1e-3) != PDP_OK) continue; /* a missing rank */
            snprintf(key, sizeof key, "pdp/mpi_start_seen/%d", r);
            (void)pdp_store_wait(*store, &k, 1, left > 1e-3 ? left : 1e-3);
        }
    }
    if (nmissing) {
        pdp_store_free(*store);
        *store = NULL;
        return pdp__err(PDP_ERR_TIMEOUT, "%s: MPI start-up check: rank %d of %d: missing rank%s"
                        "%s: %s not call pdp_comm_init_env within %g s (checked at the TCP "
                        "store before MPI_Init_thread, which was therefore not called)", fn,
                        env->rank, env->world_size, nmissing > 1 ? "s" : "", missing,
                        nmissing > 1 ? "they did" : "it did", timeout_s);
    }
    *checked = true;
    return PDP_OK;
fail:
    pdp_store_free(*store);
    *store = NULL;
    return pdp__err_wrap(st, "%s: MPI start-up check: rank %d of %d", fn, env->rank,
                         env->world_size);
}

/* MPI_Init_thread after the start-up check, under the watchdog; mpi_mu held. */
static int pdp__mpi_init_bounded(const pdp_comm_desc *desc, double timeout_s, int *provided,
                                 pdp_status *st, const char *fn)
{
    pdp__mpi_watch w;
    pthread_condattr_t ca;
    pthread_t tid;
    pdp_env_info env;
    pdp_store *store = NULL;
    bool checked = false, watching;
    int rc;
    if (pdp_env_read(&env) != PDP_OK) { /* the launcher's variables are not ours to judge */
        memset(&env, 0, sizeof env);
        env.rank = -1;
    }
    if ((*st = pdp__mpi_start_check(&store, &env, timeout_s, &checked, fn)) != PDP_OK)
        return MPI_ERR_OTHER;
    memset(&w, 0, sizeof w);
    w.timeout_s = timeout_s;
    w.log = desc ? desc->log : NULL;
    w.log_user = desc ? desc->log_user : NULL;
    snprintf(w.msg, sizeof w.msg, "%s: rank %d of %d: MPI_Init_thread has not returned after %g s "
             "(timeout_s): %s; pdp cannot interrupt MPI_Init_thread, so this rank waits until "
             "MPI returns or the launcher ends the job", fn, env.rank, env.world_size, timeout_s,
             checked ? "every rank checked in at the start-up check, so a rank died or hangs "
                       "inside MPI's start-up (MPI cannot say which)"
                     : "a rank did not start or is stuck before pdp_comm_init_env (MPI cannot "
                       "say which; set PDP_STORE_PORT for a start-up check that names it)");
    pthread_mutex_init(&w.mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&w.cv, &ca);
    pthread_condattr_destroy(&ca);
    watching = w.log && pthread_create(&tid, NULL, pdp__mpi_watchdog, &w) == 0;
    rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, provided);
    if (watching) {
        pthread_mutex_lock(&w.mu);
        w.done = true;
        pthread_cond_signal(&w.cv);
        pthread_mutex_unlock(&w.mu);
        pthread_join(tid, NULL);
    }
    pthread_mutex_destroy(&w.mu);
    pthread_cond_destroy(&w.cv);
    pdp_store_free(store); /* every rank is past MPI's start-up: nobody needs it now */
    return rc;
}

/* ---- comm_mpi: creation ---- */

/* Initialises MPI when nobody has (bounded as above) and takes one reference to it. */
static pdp_status pdp__mpi_acquire(const pdp_comm_desc *desc, double timeout_s, const char *fn)
{
    int inited = 0, finalized = 0, provided = 0, rc;
    pdp_status st = PDP_OK;
    pthread_mutex_lock(&pdp__mpi_mu);
    MPI_Finalized(&finalized);
    if (finalized) {
        st = pdp__err(PDP_ERR_STATE, "%s: MPI is already finalized and cannot start again (pdp "
                      "finalises MPI with the last communicator when it initialised MPI itself; "
                      "to create MPI communicators one after another call MPI_Init_thread "
                      "before the first and MPI_Finalize after the last)", fn);
        goto out;
    }
    MPI_Initialized(&inited);
    if (!inited) {
        rc = pdp__mpi_init_bounded(desc, timeout_s, &provided, &st, fn);
        if (st != PDP_OK) goto out;
        if (rc != MPI_SUCCESS) {
            char e[256];
            pdp__mpi_errstr(rc, e, sizeof e);
            st = pdp__err(PDP_ERR_COMM, "%s: MPI_Init_thread failed: %s", fn, e);
            goto out;
        }
        pdp__mpi_we_init = true;
    } else {
        MPI_Query_thread(&provided);
    }
    if (provided < MPI_THREAD_MULTIPLE) {
        st = pdp__err(PDP_ERR_UNSUPPORTED, "%s: MPI provides thread level %d, but the progress "
                      "thread of the MPI backend needs MPI_THREAD_MULTIPLE (%d): initialise MPI "
                      "with MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...) and use an MPI built "
                      "with thread support", fn, provided, MPI_THREAD_MULTIPLE);
        if (pdp__mpi_we_init && pdp__mpi_live == 0) {
            MPI_Finalize();
            pdp__mpi_we_init = false;
        }
        goto out;
    }
    pdp__mpi_live++;
out:
    pthread_mutex_unlock(&pdp__mpi_mu);
    return st;
}

static pdp_status pdp__mpi_wrap(pdp_comm **out, MPI_Comm mcomm, const char *name,
                                double timeout_s, const char *fn);

static pdp_status pdp__mpi_create(pdp_comm **out, const pdp_comm_desc *desc, const char *fn)
{
    MPI_Comm mcomm = MPI_COMM_NULL;
    MPI_Request req = MPI_REQUEST_NULL;
    int rank = 0, size = 1, rc;
    double timeout_s;
    pdp_status st;
    if ((st = pdp__comm_desc_timeout(desc, &timeout_s, fn)) != PDP_OK) return st;
    if (desc && desc->device.kind != PDP_DEVICE_CPU)
        return pdp__err(PDP_ERR_UNSUPPORTED, "%s: the MPI backend moves CPU buffers; device "
                        "CUDA %d needs PDP_BACKEND_NCCL", fn, desc->device.ordinal);
    if ((st = pdp__mpi_acquire(desc, timeout_s, fn)) != PDP_OK) return st;
    pthread_mutex_lock(&pdp__mpi_mu);
    if (pdp__mpi_init_orphan && pdp__mpi_poll_until(&pdp__mpi_init_req, 0.0)) {
        MPI_Comm_free(&pdp__mpi_init_comm); /* an earlier timed-out duplication completed */
        pdp__mpi_init_orphan = false;
    }
    pthread_mutex_unlock(&pdp__mpi_mu);
    rc = MPI_Comm_idup(MPI_COMM_WORLD, &mcomm, &req);
    if (rc == MPI_SUCCESS && !pdp__mpi_poll_until(&req, pdp__now() + timeout_s)) {
        int world_rank = -1;
        MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
        pthread_mutex_lock(&pdp__mpi_mu);
        if (pdp__mpi_init_orphan) {
            pdp__mpi_unclean = true; /* a second orphan: no slot to keep it */
        } else {
            pdp__mpi_init_orphan = true;
            pdp__mpi_init_req = req;
            pdp__mpi_init_comm = mcomm;
        }
        pthread_mutex_unlock(&pdp__mpi_mu);
        pdp__mpi_release();
        return pdp__err(PDP_ERR_TIMEOUT, "%s: rank %d: duplicating MPI_COMM_WORLD did not "
                        "complete within %g s: at least one rank did not call "
                        "pdp_comm_init_env (or called it in another order)", fn, world_rank,
                        timeout_s);
    }
    if (rc == MPI_SUCCESS) rc = MPI_Comm_set_errhandler(mcomm, MPI_ERRORS_RETURN);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(mcomm, &rank);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_size(mcomm, &size);
    if (rc != MPI_SUCCESS) {
        char e[256];
        pdp__mpi_errstr(rc, e, sizeof e);
        if (mcomm != MPI_COMM_NULL) MPI_Comm_free(&mcomm);
        pdp__mpi_release();
        return pdp__err(PDP_ERR_COMM, "%s: duplicating MPI_COMM_WORLD failed: %s", fn, e);
    }
    return pdp__mpi_wrap(out, mcomm, desc && desc->name ? desc->name : "comm", timeout_s, fn);
}

/* Wraps mcomm (errors returned, one reference to MPI taken by the caller; both given
   up on failure) as a communicator with its own queue, progress thread and p2p state. */
static pdp_status pdp__mpi_wrap(pdp_comm **out, MPI_Comm mcomm, const char *name,
                                double timeout_s, const char *fn)
{
    pdp__mpi_comm *mc;
    int rank = 0, size = 1, world_rank = 0, world_size = 1;
    pdp_status st;
    MPI_Comm_rank(mcomm, &rank);
    MPI_Comm_size(mcomm, &size);
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank); /* the trace is per process */
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    mc = (pdp__mpi_comm *)pdp__calloc(sizeof *mc);
    if (!mc) {
        MPI_Comm_free(&mcomm);
        pdp__mpi_release();
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory for the MPI communicator (rank %d)",
                        fn, rank);
    }
    pthread_mutex_init(&mc->p2p_mu, NULL);
    mc->head.ops = &pdp__mpi_ops;
    mc->head.backend = PDP_BACKEND_MPI;
    mc->head.rank = rank;
    mc->head.size = size;
    mc->head.timeout_s = timeout_s;
    mc->head.device = pdp_cpu();
    snprintf(mc->head.name, sizeof mc->head.name, "%s", name);
    mc->head.impl = &mc->q;
    mc->mcomm = mcomm;
    mc->op16[0] = mc->op16[1] = MPI_OP_NULL;
    if (MPI_Op_create(pdp__mpi_sum_bf16, 1, &mc->op16[0]) != MPI_SUCCESS ||
        MPI_Op_create(pdp__mpi_sum_f16, 1, &mc->op16[1]) != MPI_SUCCESS) {
        st = pdp__err(PDP_ERR_COMM, "%s: MPI_Op_create failed for the 16-bit sums (rank %d)", fn,
                      rank);
        goto fail;
    }
    mc->q.comm = &mc->head;
    mc->q.exec = pdp__mpi_exec;
    mc->q.idle = pdp__mpi_idle;
    mc->q.p2p_poll = pdp__mpi_p2p_poll;
    mc->q.p2p_expire = pdp__mpi_p2p_expire;
    mc->q.sticky = true;
    if ((st = pdp__trace_open(world_size > 1 ? world_rank : -1)) != PDP_OK) {
        st = pdp__err_wrap(st, "%s (rank %d)", fn, rank);
        goto fail;
    }
    mc->traced = true;
    if (pdp__trace_enabled()) {
        char track[48];
        snprintf(track, sizeof track, "comm %s (mpi)", mc->head.name);
        mc->q.trace_pid = world_rank;
        mc->q.trace_tid = pdp__trace_track(world_rank, track);
    }
    if ((st = pdp__workq_init(&mc->q, mc->pool, PDP_MPI_MAX_INFLIGHT, "PDP_MPI_MAX_INFLIGHT", true,
                              fn)) != PDP_OK)
        goto fail;
    *out = &mc->head;
    return PDP_OK;
fail:
    if (mc->op16[0] != MPI_OP_NULL) MPI_Op_free(&mc->op16[0]);
    if (mc->op16[1] != MPI_OP_NULL) MPI_Op_free(&mc->op16[1]);
    if (mc->traced) pdp__trace_close();
    pthread_mutex_destroy(&mc->p2p_mu);
    pdp__dealloc(mc);
    MPI_Comm_free(&mcomm);
    pdp__mpi_release();
    return st;
}

/* pdp_comm_split: MPI_Comm_split runs on the progress thread, in order with the
   collectives (MPI forbids two threads in collectives on one communicator); comm.c's
   colour exchange has already proved every rank arrived, so it does not block long. */
static pdp_status pdp__mpi_split(pdp_comm *c, int colour, int key, int new_rank, int new_size,
                                 int leader, pdp_comm **out)
{
    MPI_Comm nc = MPI_COMM_NULL;
    pdp__coll_args a;
    pdp_work *w = NULL;
    char name[48];
    pdp_status st;
    (void)new_rank;
    (void)new_size;
    (void)leader;
    memset(&a, 0, sizeof a);
    a.kind = PDP__COLL_SPLIT;
    a.op = colour;
    a.count = key;
    a.out = &nc;
    pthread_mutex_lock(&pdp__mpi_mu);
    pdp__mpi_live++; /* the new communicator's reference, taken before anything can finalise */
    pthread_mutex_unlock(&pdp__mpi_mu);
    if ((st = pdp__workq_submit(c, &a, &w)) == PDP_OK) st = pdp__workq_wait(w);
    if (st != PDP_OK || colour < 0 || nc == MPI_COMM_NULL) {
        if (nc != MPI_COMM_NULL) MPI_Comm_free(&nc);
        pdp__mpi_release();
        return st;
    }
    MPI_Comm_set_errhandler(nc, MPI_ERRORS_RETURN);
    snprintf(name, sizeof name, "%.20s.%d", c->name, colour);
    return pdp__mpi_wrap(out, nc, name, c->timeout_s, "pdp_comm_split");
}
#endif /* PDP_MPI */

/* ---- comm_mpi: pdp_comm_init_env ---- */

static pdp_status pdp__comm_init_mpi_env(pdp_comm **out, const pdp_comm_desc *desc)
{
    static const char *fn = "pdp_comm_init_env";
#ifdef PDP_MPI
    return pdp__mpi_create(out, desc, fn);
#else
    (void)desc;
    *out = NULL;
    return pdp__err(PDP_ERR_UNSUPPORTED, "%s: backend MPI: built without PDP_MPI (compile "
                    "with -DPDP_MPI using mpicc, and run under mpirun)", fn);
#endif
}
/* ---- end src/comm_mpi.c ---- */

/* ---- begin src/comm_nccl.c ---- */
/* comm_nccl: the NCCL communicator backend, host side (-DPDP_CUDA; the NCCL calls
   themselves are in pdp_cuda.cu, behind cuda.h's pdp_cudak_nccl_* functions), and
   its entry in comm.c's dispatcher, pdp__comm_init_nccl_env.

   The NCCL communicator is a pdp__comm_ops backend like local and mpi: its
   handles come from a fixed pool (one per completion-event slot), so a step
   allocates nothing; a collective is launched on the NCCL stream after an
   event recorded on the compute stream, and pdp_work_wait polls it against the
   communicator's timeout (pdp_cuda.cu aborts the NCCL communicator on failure).
   Thread ranks come from one pdp_nccl_group (ncclCommInitAll); process ranks
   (pdp_comm_init_env) rendezvous through the TCP store (rendezvous.c, store.c):
   rank 0 makes the unique id and sets "pdp/nccl_id", the others get it. Without PDP_CUDA,
   every entry point fails with PDP_ERR_UNSUPPORTED naming the macro.

   Point-to-point (section below) and split follow comm.h, with what NCCL imposes:
   - NCCL has no tags. A pair's messages match in the order they were issued; each
     carries a header (tag, count) and the receiver's wait fails with PDP_ERR_INVALID
     naming both when the tags or counts differ;
   - sends and receives are enqueued in batches (one ncclGroupStart/End) when one of
     them is waited or queried with pdp_work_done, or before a collective or split on
     the communicator: call pdp_work_done on a handle to start a batch early (overlap);
   - messages and collectives share the NCCL stream: every rank must issue them in
     an order that cannot deadlock (a send before a collective on one rank needs its
     receive before that collective on the other), as with NCCL itself;
   - a message not matched within timeout_s fails with PDP_ERR_TIMEOUT naming the
     peer and the tag, but NCCL cannot withdraw it: the communicator is aborted and
     every later call on it fails (PDP_ERR_COMM), as after a collective's timeout.
     A count mismatch usually hangs NCCL: the receiver then fails with
     PDP_ERR_INVALID naming both counts (from the header), the sender times out;
   - pdp_comm_split is ncclCommSplit (NCCL 2.18 or later), for thread ranks and
     process ranks alike. */

/* #include "internal.h" (already above) */

/* the same text as cuda_host.c's (an identical redefinition is valid C) */
#define PDP__NO_CUDA_MSG "built without PDP_CUDA (compile with -DPDP_CUDA and link pdp_cuda.o)"

#ifndef PDP_CUDA
static pdp_status pdp__comm_init_nccl_env(pdp_comm **out, const pdp_comm_desc *desc)
{
    (void)desc;
    *out = NULL;
    return pdp__err(PDP_ERR_UNSUPPORTED, "pdp_comm_init_env: backend NCCL: built without PDP_CUDA "
                    "(compile with -DPDP_CUDA and link pdp_cuda.o)");
}
#endif

/* ---- comm_nccl: the communicator ---- */

struct pdp_nccl_group {
    int n;
    double timeout_s;
    char name[32];
    pdp_device *devices;
#ifdef PDP_CUDA
    pdp_cudak_nccl **handles; /* taken by pdp_comm_create_nccl (NULL once taken) */
#endif
};

#ifdef PDP_CUDA

typedef struct pdp__nccl_work {
    pdp_work head;
    int slot;
    bool busy;
    bool pending;           /* a message taken but not yet enqueued (see flush) */
    bool is_p2p, is_send;
    int peer, tag;
    int64_t count;
    float *buf;
    pdp_status err;         /* the flush that should have enqueued it failed: msg says why */
    char msg[256];
} pdp__nccl_work;

typedef struct pdp__nccl_comm {
    pdp_comm head;
    pdp_cudak_nccl *h;
    float *barrier_buf;     /* one float on the device */
    int next;               /* the pool entry of the next collective */
    int npending;           /* messages in pool[next - npending .. next - 1], not enqueued */
    int64_t seq;
    bool traced;
    bool traced_process;    /* a process rank: its trace file is per rank */
    int trace_tid;          /* 0: not traced */
    pdp__nccl_work pool[PDP_CUDAK_NCCL_SLOTS];
} pdp__nccl_comm;

/* ---- comm_nccl: point-to-point ----
   NCCL has no tags and matches a pair's messages in the order they were issued; a
   send waits (on the GPU) for its receive, so a ring where every rank sends first
   deadlocks unless each rank's send and receive are in one ncclGroupStart/End.
   So pdp_comm_send/recv only take a handle (pending); the pending messages are
   enqueued together, as one group, by the first of: a wait or done query on any of
   them, a collective or a split on this communicator. Each message carries a
   header (tag, count) that the receiver checks at its wait: a different tag or
   count is PDP_ERR_INVALID naming both (a count mismatch usually hangs NCCL
   first: then the receiver still names both counts once its wait times out). */

static void pdp__nccl_describe(const pdp__nccl_work *wk, char *out, size_t cap)
{
    const pdp_comm *c = wk->head.comm;
    snprintf(out, cap, "%s #%lld (count %lld) %s rank %d with tag %d on comm '%s', rank %d of %d",
             wk->head.op_name, (long long)wk->head.seq, (long long)wk->count,
             wk->is_send ? "to" : "from", wk->peer, wk->tag, c->name, c->rank, c->size);
}

/* Enqueues the pending messages as one group. On failure each of them keeps the
   error for its wait, and the error is also returned (with its message). */
static pdp_status pdp__nccl_flush(pdp_comm *c)
{
    pdp__nccl_comm *nc = (pdp__nccl_comm *)c->impl;
    pdp_cudak_p2p ops[PDP_CUDAK_NCCL_SLOTS];
    int n = nc->npending, first, i;
    pdp_status st;
    double t;
    if (n == 0) return PDP_OK;
    first = (nc->next - n + PDP_CUDAK_NCCL_SLOTS) % PDP_CUDAK_NCCL_SLOTS;
    for (i = 0; i < n; i++) {
        const pdp__nccl_work *wk = &nc->pool[(first + i) % PDP_CUDAK_NCCL_SLOTS];
        ops[i].is_send = wk->is_send;
        ops[i].peer = wk->peer;
        ops[i].tag = wk->tag;
        ops[i].count = wk->count;
        ops[i].buf = wk->buf;
        ops[i].slot = -1;
    }
    nc->npending = 0;
    st = pdp_cudak_nccl_p2p(nc->h, ops, n, c->timeout_s);
    t = pdp__now();
    for (i = 0; i < n; i++) {
        pdp__nccl_work *wk = &nc->pool[(first + i) % PDP_CUDAK_NCCL_SLOTS];
        wk->pending = false;
        wk->head.t_start = t;
        if (st != PDP_OK) {
            wk->err = st;
            snprintf(wk->msg, sizeof wk->msg, "pdp_cuda: %s", pdp_cudak_error());
            continue;
        }
        PDP_ASSERT(ops[i].slot == (first + i) % PDP_CUDAK_NCCL_SLOTS);
        wk->slot = ops[i].slot;
    }
    if (st != PDP_OK)
        return pdp__err(st, "%d message(s) from rank %d on comm '%s': pdp_cuda: %s", n, c->rank,
                        c->name, pdp_cudak_error());
    return PDP_OK;
}

static pdp_status pdp__nccl_p2p(pdp_comm *c, bool is_send, float *buf, int64_t count, int peer,
                                int tag, pdp_work **w)
{
    pdp__nccl_comm *nc = (pdp__nccl_comm *)c->impl;
    pdp__nccl_work *wk = &nc->pool[nc->next];
    if (wk->busy)
        return pdp__err(PDP_ERR_STATE, "%s to/from rank %d on comm '%s' (rank %d): %d "
                        "collectives and messages in flight: wait on some before issuing more",
                        is_send ? "send" : "recv", peer, c->name, c->rank, PDP_CUDAK_NCCL_SLOTS);
    nc->next = (nc->next + 1) % PDP_CUDAK_NCCL_SLOTS;
    nc->npending++;
    wk->busy = wk->pending = wk->is_p2p = true;
    wk->is_send = is_send;
    wk->peer = peer;
    wk->tag = tag;
    wk->count = count;
    wk->buf = buf;
    wk->err = PDP_OK;
    wk->msg[0] = '\0';
    wk->slot = -1;
    wk->head.comm = c;
    wk->head.op_name = pdp__op_names[is_send ? PDP__COLL_SEND : PDP__COLL_RECV];
    wk->head.seq = nc->seq++;
    wk->head.t_start = pdp__now();
    wk->head.t_done = 0.0;
    *w = &wk->head;
    return PDP_OK;
}

static pdp_status pdp__nccl_send(pdp_comm *c, const float *buf, int64_t count, int peer, int tag,
                                 pdp_work **w)
{
    return pdp__nccl_p2p(c, true, (float *)buf, count, peer, tag, w);
}

static pdp_status pdp__nccl_recv(pdp_comm *c, float *buf, int64_t count, int peer, int tag,
                                 pdp_work **w)
{
    return pdp__nccl_p2p(c, false, buf, count, peer, tag, w);
}

/* A message's wait: its group's completion, then (a receive) the sender's header. */
static pdp_status pdp__nccl_p2p_wait(pdp_comm *c, pdp__nccl_work *wk)
{
    pdp__nccl_comm *nc = (pdp__nccl_comm *)c->impl;
    char what[200];
    int arrived = 0;
    int64_t tag = 0, count = 0;
    pdp_status st;
    if (wk->pending) pdp__nccl_flush(c); /* a failure lands in wk->err */
    pdp__nccl_describe(wk, what, sizeof what);
    if (wk->err != PDP_OK) { /* never enqueued: ncclGroupEnd failed or timed out (connecting) */
        wk->head.t_done = pdp__now();
        wk->busy = false;
        if (wk->err == PDP_ERR_TIMEOUT)
            return pdp__err(wk->err, "%s: no matching %s from rank %d within %g s (peer %d, tag "
                            "%d); NCCL cannot withdraw a message: the communicator was aborted "
                            "(%s)", what, wk->is_send ? "recv" : "send", wk->peer, c->timeout_s,
                            wk->peer, wk->tag, wk->msg);
        return pdp__err(wk->err, "%s: %s", what, wk->msg);
    }
    st = pdp_cudak_nccl_wait(nc->h, wk->slot, c->timeout_s);
    wk->head.t_done = pdp__now();
    wk->busy = false;
    if (!wk->is_send && pdp_cudak_nccl_p2p_header(nc->h, wk->slot, &arrived, &tag, &count) !=
                            PDP_OK)
        arrived = 0;
    if (arrived && count != wk->count)
        return pdp__err(PDP_ERR_INVALID, "%s: count mismatch: rank %d sends %lld floats (tag "
                        "%lld), rank %d receives %lld%s", what, wk->peer, (long long)count,
                        (long long)tag, c->rank, (long long)wk->count,
                        st == PDP_OK ? "" : " (NCCL hung on it: the communicator was aborted)");
    if (st != PDP_OK) {
        if (st == PDP_ERR_TIMEOUT)
            return pdp__err(st, "%s: no matching %s from rank %d within %g s (peer %d, tag %d); "
                            "NCCL cannot withdraw a message: the communicator was aborted "
                            "(pdp_cuda: %s)", what, wk->is_send ? "recv" : "send", wk->peer,
                            c->timeout_s, wk->peer, wk->tag, pdp_cudak_error());
        return pdp__err(st, "%s: pdp_cuda: %s", what, pdp_cudak_error());
    }
    if (arrived && tag != wk->tag)
        return pdp__err(PDP_ERR_INVALID, "%s: tag mismatch: rank %d sent tag %lld; NCCL has no "
                        "tags: messages between two ranks match in issue order, and their tags "
                        "must agree", what, wk->peer, (long long)tag);
    return PDP_OK;
}

/* kind names the collective through internal.h's pdp__op_names, whose first four
   entries follow pdp_cudak_coll's order. */
static pdp_status pdp__nccl_issue(pdp_comm *c, pdp_cudak_coll kind, const void *send,
                                  void *recv, int64_t count, int op, pdp_dtype dt, pdp_work **w)
{
    pdp__nccl_comm *nc = (pdp__nccl_comm *)c->impl;
    pdp__nccl_work *wk;
    int slot;
    pdp_status st;
    /* messages issued before it go on the stream first (one stream orders everything) */
    if ((st = pdp__nccl_flush(c)) != PDP_OK)
        return pdp__err_wrap(st, "%s #%lld (count %lld) on comm '%s', rank %d of %d: enqueuing "
                             "the messages issued before it", pdp__op_names[kind],
                             (long long)nc->seq, (long long)count, c->name, c->rank, c->size);
    /* the pool entry k shares event slot k: a handle is free again once waited */
    wk = &nc->pool[nc->next];
    if (wk->busy)
        return pdp__err(PDP_ERR_STATE, "%d collectives in flight on comm '%s' (rank %d): wait on "
                        "some before issuing more", PDP_CUDAK_NCCL_SLOTS, c->name, c->rank);
    if ((st = pdp_cudak_nccl_launch(nc->h, kind, send, recv, count, op, (int)dt, &slot)) != PDP_OK)
        return pdp__err(st, "%s #%lld (count %lld) on comm '%s', rank %d of %d: pdp_cuda: %s",
                        pdp__op_names[kind], (long long)nc->seq, (long long)count, c->name,
                        c->rank, c->size, pdp_cudak_error());
    PDP_ASSERT(slot == nc->next);
    nc->next = (nc->next + 1) % PDP_CUDAK_NCCL_SLOTS;
    wk->busy = true;
    wk->is_p2p = false;
    wk->slot = slot;
    wk->head.comm = c;
    wk->head.op_name = pdp__op_names[kind];
    wk->head.seq = nc->seq++;
    wk->head.t_start = pdp__now();
    wk->head.t_done = 0.0;
    *w = &wk->head;
    return PDP_OK;
}

static pdp_status pdp__nccl_allreduce(pdp_comm *c, void *buf, int64_t count, pdp_dtype dt,
                                      pdp_reduce_op op, pdp_work **w)
{
    return pdp__nccl_issue(c, PDP_CUDAK_ALLREDUCE, buf, buf, count, op == PDP_REDUCE_AVG, dt, w);
}

static pdp_status pdp__nccl_broadcast(pdp_comm *c, float *buf, int64_t count, int root,
                                      pdp_work **w)
{
    return pdp__nccl_issue(c, PDP_CUDAK_BROADCAST, buf, buf, count, root, PDP_DTYPE_F32, w);
}

static pdp_status pdp__nccl_reduce_scatter(pdp_comm *c, const void *send, void *recv,
                                           int64_t recv_count, pdp_dtype dt, pdp_reduce_op op,
                                           pdp_work **w)
{
    return pdp__nccl_issue(c, PDP_CUDAK_REDUCE_SCATTER, send, recv, recv_count,
                           op == PDP_REDUCE_AVG, dt, w);
}

static pdp_status pdp__nccl_allgather(pdp_comm *c, const float *send, float *recv,
                                      int64_t send_count, pdp_work **w)
{
    return pdp__nccl_issue(c, PDP_CUDAK_ALLGATHER, send, recv, send_count, 0, PDP_DTYPE_F32, w);
}

static pdp_status pdp__nccl_barrier(pdp_comm *c, pdp_work **w)
{
    pdp__nccl_comm *nc = (pdp__nccl_comm *)c->impl;
    return pdp__nccl_issue(c, PDP_CUDAK_ALLREDUCE, nc->barrier_buf, nc->barrier_buf, 1, 0,
                           PDP_DTYPE_F32, w);
}

static pdp_status pdp__nccl_broadcast_bytes(pdp_comm *c, void *buf, size_t bytes, int root)
{
    pdp__nccl_comm *nc = (pdp__nccl_comm *)c->impl;
    pdp_status st;
    if ((st = pdp__nccl_flush(c)) != PDP_OK)
        return pdp__err_wrap(st, "broadcast of %zu bytes from rank %d on comm '%s', rank %d of "
                             "%d: enqueuing the messages issued before it", bytes, root, c->name,
                             c->rank, c->size);
    st = pdp_cudak_nccl_broadcast_bytes(nc->h, buf, bytes, root, c->timeout_s);
    if (bytes) nc->next = (nc->next + 1) % PDP_CUDAK_NCCL_SLOTS; /* it used one event slot */
    if (st != PDP_OK)
        return pdp__err(st, "broadcast of %zu bytes from rank %d on comm '%s', rank %d of %d: "
                        "pdp_cuda: %s", bytes, root, c->name, c->rank, c->size, pdp_cudak_error());
    return PDP_OK;
}

static pdp_status pdp__nccl_wait(pdp_work *w)
{
    pdp__nccl_work *wk = (pdp__nccl_work *)w;
    pdp_comm *c = w->comm;
    pdp__nccl_comm *nc = (pdp__nccl_comm *)c->impl;
    pdp_status st;
    if (wk->is_p2p) st = pdp__nccl_p2p_wait(c, wk);
    else {
        st = pdp_cudak_nccl_wait(nc->h, wk->slot, c->timeout_s);
        w->t_done = pdp__now();
        wk->busy = false;
    }
    if (st != PDP_OK && wk->is_p2p) return st;
    if (st != PDP_OK)
        return pdp__err(st, "%s #%lld on comm '%s', rank %d of %d: pdp_cuda: %s", w->op_name,
                        (long long)w->seq, c->name, c->rank, c->size, pdp_cudak_error());
    if (nc->trace_tid) {
        char args[64];
        snprintf(args, sizeof args, "\"seq\":%lld", (long long)w->seq);
        pdp__trace_async(c->rank, nc->trace_tid, "comm", w->op_name, (uint64_t)w->seq, w->t_start, w->t_done,
                         args);
    }
    return PDP_OK;
}

static bool pdp__nccl_done(pdp_work *w)
{
    pdp__nccl_work *wk = (pdp__nccl_work *)w;
    pdp__nccl_comm *nc = (pdp__nccl_comm *)w->comm->impl;
    if (wk->pending) pdp__nccl_flush(w->comm); /* starts the messages; errors wait for wait */
    if (wk->err != PDP_OK) return true;
    return pdp_cudak_nccl_query(nc->h, wk->slot) != 0;
}

static void pdp__nccl_destroy(pdp_comm *c)
{
    pdp__nccl_comm *nc = (pdp__nccl_comm *)c->impl;
    pdp_cudak_free(c->device.ordinal, nc->barrier_buf);
    pdp_cudak_nccl_free(nc->h, 0);
    if (nc->traced) pdp__trace_close();
    pdp__dealloc(nc);
}

static pdp_status pdp__nccl_wrap(pdp_comm **out, pdp_cudak_nccl *h, int dev, int rank, int size,
                                 double timeout_s, const char *name, bool process_rank,
                                 const char *fn);

/* ---- comm_nccl: split ----
   ncclCommSplit over c (thread ranks and process ranks alike: it needs NCCL 2.18),
   after the messages pending on c are enqueued. comm.c has already exchanged the
   colours over c, so every rank is here; the key orders the new ranks as
   comm.c's new_rank does (ties by rank in c, as NCCL's). */
static pdp_status pdp__nccl_split(pdp_comm *c, int colour, int key, int new_rank, int new_size,
                                  int leader, pdp_comm **out)
{
    pdp__nccl_comm *nc = (pdp__nccl_comm *)c->impl;
    pdp_cudak_nccl *h = NULL;
    char name[48];
    pdp_status st;
    (void)leader;
    if ((st = pdp__nccl_flush(c)) != PDP_OK)
        return pdp__err_wrap(st, "split of comm '%s' (rank %d): enqueuing the messages issued "
                             "before it", c->name, c->rank);
    if ((st = pdp_cudak_nccl_split(nc->h, colour, key, &h, c->timeout_s)) != PDP_OK)
        return pdp__err(st, "split of comm '%s' (rank %d of %d, colour %d): pdp_cuda: %s",
                        c->name, c->rank, c->size, colour, pdp_cudak_error());
    if (colour < 0) return PDP_OK;
    snprintf(name, sizeof name, "%.20s.%d", c->name, colour);
    if ((st = pdp__nccl_wrap(out, h, c->device.ordinal, new_rank, new_size, c->timeout_s, name,
                             nc->traced_process, "split")) != PDP_OK)
        return st;
    return PDP_OK;
}

static const pdp__comm_ops pdp__nccl_ops = {
    pdp__nccl_allreduce, pdp__nccl_broadcast, pdp__nccl_reduce_scatter, pdp__nccl_allgather,
    pdp__nccl_barrier,   pdp__nccl_broadcast_bytes, pdp__nccl_send,     pdp__nccl_recv,
    pdp__nccl_split,     pdp__nccl_wait,      pdp__nccl_done,           pdp__nccl_destroy};

/* Wraps an initialised handle h (taken over, freed on failure) as rank of size. */
static pdp_status pdp__nccl_wrap(pdp_comm **out, pdp_cudak_nccl *h, int dev, int rank, int size,
                                 double timeout_s, const char *name, bool process_rank,
                                 const char *fn)
{
    pdp__nccl_comm *nc = (pdp__nccl_comm *)pdp__calloc(sizeof *nc);
    pdp_status st;
    if (!nc) {
        pdp_cudak_nccl_free(h, 0);
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory (rank %d)", fn, rank);
    }
    nc->h = h;
    nc->head.ops = &pdp__nccl_ops;
    nc->head.backend = PDP_BACKEND_NCCL;
    nc->head.rank = rank;
    nc->head.size = size;
    nc->head.timeout_s = timeout_s;
    nc->head.device = pdp_cuda(dev);
    snprintf(nc->head.name, sizeof nc->head.name, "%s", name ? name : "comm");
    nc->head.impl = nc;
    if ((st = pdp_cudak_malloc(dev, sizeof(float), (void **)&nc->barrier_buf)) != PDP_OK ||
        (st = pdp_cudak_memset0(dev, nc->barrier_buf, sizeof(float))) != PDP_OK) {
        st = pdp__err(st, "%s: rank %d: pdp_cuda: %s", fn, rank, pdp_cudak_error());
        pdp__nccl_destroy(&nc->head);
        return st;
    }
    nc->traced_process = process_rank;
    if (pdp__trace_open(process_rank && size > 1 ? rank : -1) == PDP_OK) {
        nc->traced = true;
        if (pdp__trace_enabled()) {
            char track[48];
            snprintf(track, sizeof track, "comm %s (nccl)", nc->head.name);
            nc->trace_tid = pdp__trace_track(rank, track);
        }
    }
    *out = &nc->head;
    return PDP_OK;
}

/* pdp_comm_init_env for PDP_BACKEND_NCCL: one process per GPU. The unique id
   travels through rendezvous.c; the store stays open until ncclCommInitRank
   (collective) has returned on this rank. */
static pdp_status pdp__comm_init_nccl_env(pdp_comm **out, const pdp_comm_desc *desc)
{
    static const char *fn = "pdp_comm_init_env";
    pdp_env_info env;
    pdp_store *store = NULL;
    pdp_cudak_nccl *h = NULL;
    unsigned char id[PDP_CUDAK_NCCL_ID_BYTES];
    double timeout;
    int dev;
    pdp_status st;
    *out = NULL;
    if ((st = pdp__comm_desc_timeout(desc, &timeout, fn)) != PDP_OK) return st;
    if ((st = pdp_env_read(&env)) != PDP_OK) return pdp__err_wrap(st, "%s", fn);
    /* the rank's GPU: desc->device when it names one, else LOCAL_RANK */
    dev = desc && desc->device.kind == PDP_DEVICE_CUDA ? desc->device.ordinal : env.local_rank;
    memset(id, 0, sizeof id);
    if ((st = pdp__rendezvous_store(&store, &env, timeout, "NCCL", fn)) != PDP_OK) return st;
    if (env.rank == 0 && (st = pdp_cudak_nccl_unique_id(dev, id)) != PDP_OK) {
        st = pdp__err(st, "%s: rank 0: pdp_cuda: %s", fn, pdp_cudak_error());
        goto done;
    }
    if ((st = pdp__rendezvous_share(store, &env, "pdp/nccl_id", id, sizeof id, timeout, "NCCL",
                                    fn)) != PDP_OK)
        goto done;
    if ((st = pdp_cudak_nccl_init_rank(&h, dev, env.world_size, env.rank, id, timeout)) != PDP_OK) {
        st = pdp__err(st, "%s: NCCL rank %d of %d on CUDA device %d: pdp_cuda: %s", fn, env.rank,
                      env.world_size, dev, pdp_cudak_error());
        goto done;
    }
    st = pdp__nccl_wrap(out, h, dev, env.rank, env.world_size, timeout,
                        desc ? desc->name : NULL, true, fn);
done:
    pdp_store_free(store);
    return st;
}

#endif /* PDP_CUDA */

/* ---- comm_nccl: thread ranks (pdp_nccl_group) ---- */

PDP_API pdp_status pdp_nccl_group_create(pdp_nccl_group **out, int ndev, const pdp_device *devices,
                                         const pdp_comm_desc *desc)
{
    static const char *fn = "pdp_nccl_group_create";
    double timeout;
    pdp_status st0;
    int i;
    if (!out) return pdp__err(PDP_ERR_INVALID, "%s: out is NULL", fn);
    *out = NULL;
    if ((st0 = pdp__comm_desc_timeout(desc, &timeout, fn)) != PDP_OK) return st0;
    if (ndev < 1 || ndev > 64 || !devices)
        return pdp__err(PDP_ERR_INVALID, "%s: ndev %d outside 1..64 or devices NULL", fn, ndev);
    for (i = 0; i < ndev; i++)
        if (devices[i].kind != PDP_DEVICE_CUDA)
            return pdp__err(PDP_ERR_DEVICE, "%s: devices[%d] is not a CUDA device", fn, i);
#ifdef PDP_CUDA
    {
        int devs[64];
        pdp_status st;
        pdp_nccl_group *g = (pdp_nccl_group *)pdp__calloc(sizeof *g);
        if (!g) return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory", fn);
        g->n = ndev;
        g->timeout_s = timeout;
        snprintf(g->name, sizeof g->name, "%s", desc && desc->name ? desc->name : "comm");
        g->devices = (pdp_device *)pdp__calloc((size_t)ndev * sizeof *g->devices);
        g->handles = (pdp_cudak_nccl **)pdp__calloc((size_t)ndev * sizeof *g->handles);
        if (!g->devices || !g->handles) {
            pdp_nccl_group_free(g);
            return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory for %d ranks", fn, ndev);
        }
        for (i = 0; i < ndev; i++) {
            g->devices[i] = devices[i];
            devs[i] = devices[i].ordinal;
        }
        if ((st = pdp_cudak_nccl_init_all(g->handles, ndev, devs)) != PDP_OK) {
            st = pdp__err(st, "%s: %d GPUs: pdp_cuda: %s", fn, ndev, pdp_cudak_error());
            pdp_nccl_group_free(g);
            return st;
        }
        *out = g;
        return PDP_OK;
    }
#else
    (void)timeout;
    return pdp__err(PDP_ERR_UNSUPPORTED, "%s: the NCCL backend is " PDP__NO_CUDA_MSG, fn);
#endif
}

PDP_API void pdp_nccl_group_free(pdp_nccl_group *g)
{
    if (!g) return;
#ifdef PDP_CUDA
    if (g->handles) {
        int i;
        for (i = 0; i < g->n; i++) pdp_cudak_nccl_free(g->handles[i], 0);
    }
    pdp__dealloc(g->handles);
#endif
    pdp__dealloc(g->devices);
    pdp__dealloc(g);
}

PDP_API pdp_status pdp_comm_create_nccl(pdp_comm **out, pdp_nccl_group *g, int rank)
{
    static const char *fn = "pdp_comm_create_nccl";
    if (!out) return pdp__err(PDP_ERR_INVALID, "%s: out is NULL", fn);
    *out = NULL;
    if (!g) return pdp__err(PDP_ERR_INVALID, "%s: group is NULL", fn);
    if (rank < 0 || rank >= g->n)
        return pdp__err(PDP_ERR_INVALID, "%s: rank %d outside 0..%d", fn, rank, g->n - 1);
#ifdef PDP_CUDA
    {
        pdp_cudak_nccl *h = g->handles[rank];
        if (!h)
            return pdp__err(PDP_ERR_STATE, "%s: rank %d already has its communicator", fn, rank);
        g->handles[rank] = NULL;
        return pdp__nccl_wrap(out, h, g->devices[rank].ordinal, rank, g->n, g->timeout_s, g->name,
                              false, fn);
    }
#else
    return pdp__err(PDP_ERR_UNSUPPORTED, "%s: " PDP__NO_CUDA_MSG, fn);
#endif
}
/* ---- end src/comm_nccl.c ---- */

/* ---- begin src/comm.c ---- */
/* comm: the public communicator API and the backend dispatcher. Each backend is
   one module that fills a pdp__comm_ops table (internal.h):
     comm_local.c   ranks are threads of one process (the default);
     comm_mpi.c     ranks are MPI processes (-DPDP_MPI);
     comm_nccl.c    ranks are GPUs, the host side of pdp_cuda.cu's NCCL (-DPDP_CUDA);
   the local and MPI backends share comm_queue.c's collective queue, and every
   backend shares internal.h's communicator contract (pdp_comm, pdp_work, the
   collective kinds and their names). This module comes after the backends in
   pdp.h, so nothing here is called before it is defined.

   ---- the public layer ----
   Every pdp_comm_* collective validates its arguments here, stamps the handle's
   launch time, counts the collective and the bytes this rank moves in the
   bandwidth-optimal algorithm (ring all-reduce 2(N-1)/N x bytes, reduce-scatter
   and broadcast (N-1)/N x bytes, all-gather (N-1) x the sent bytes), then calls
   the backend. A call with work == NULL is made synchronous here, so backends
   always return a handle. pdp_work_wait adds the collective's execution time
   (t_done - t_start, queueing excluded) to the communicator's busy_s.

   ---- the dispatcher ----
   pdp_comm_init_env creates the communicator of a process launched by mpirun
   or torchrun: one line per backend calls its pdp__comm_init_<backend>_env,
   which every backend module defines, as a stub that fails with
   PDP_ERR_UNSUPPORTED naming the macro when the backend was not compiled in.
   DEFAULT and LOCAL fail with PDP_ERR_INVALID: thread-ranks have no
   environment to read; they need pdp_local_group_create. A new backend is one
   new module (its ops table, its creation, its pdp__comm_init_<backend>_env),
   one pdp_backend value and one line in the switch below. */

/* #include "internal.h" (already above) */

/* ---- comm: public layer ---- */

static pdp_status pdp__comm_check(const pdp_comm *c, const char *fn)
{
    if (!c) return pdp__err(PDP_ERR_INVALID, "%s: communicator is NULL", fn);
    return PDP_OK;
}

static pdp_status pdp__comm_check_count(const pdp_comm *c, const void *p, int64_t count,
                                        const char *what, const char *fn)
{
    if (count < 0)
        return pdp__err(PDP_ERR_INVALID, "%s: %s count %lld < 0 (comm '%s', rank %d of %d)", fn,
                        what, (long long)count, c->name, c->rank, c->size);
    if (count > 0 && !p)
        return pdp__err(PDP_ERR_INVALID, "%s: %s is NULL with count %lld (comm '%s', rank %d)",
                        fn, what, (long long)count, c->name, c->rank);
    return PDP_OK;
}

static pdp_status pdp__comm_check_op(const pdp_comm *c, pdp_reduce_op op, const char *fn)
{
    if (op != PDP_REDUCE_SUM && op != PDP_REDUCE_AVG)
        return pdp__err(PDP_ERR_INVALID, "%s: unknown reduce op %d (comm '%s', rank %d)", fn,
                        (int)op, c->name, c->rank);
    return PDP_OK;
}

static pdp_status pdp__comm_check_root(const pdp_comm *c, int root, const char *fn)
{
    if (root < 0 || root >= c->size)
        return pdp__err(PDP_ERR_INVALID, "%s: root %d outside 0..%d (comm '%s', rank %d)", fn,
                        root, c->size - 1, c->name, c->rank);
    return PDP_OK;
}

/* After the backend accepted a collective: stats, the launch stamp, and the
   synchronous form when the caller passed no handle pointer. */
static pdp_status pdp__comm_launched(pdp_comm *c, pdp_status st, pdp_work *w, double t_launch,
                                     double bytes, pdp_work **work, const char *fn)
{
    if (st != PDP_OK) return pdp__err_wrap(st, "%s", fn);
    w->t_launch = t_launch;
    if (strcmp(fn, "pdp_comm_send") == 0 || strcmp(fn, "pdp_comm_recv") == 0) c->stats.p2p++;
    else c->stats.collectives++;
    c->stats.bytes_sent += (int64_t)bytes;
    if (work) {
        *work = w;
        return PDP_OK;
    }
    st = c->ops->wait(w);
    c->stats.busy_s += w->t_done > w->t_start ? w->t_done - w->t_start : 0.0;
    return st == PDP_OK ? st : pdp__err_wrap(st, "%s", fn);
}

static pdp_status pdp__comm_check_dtype(const pdp_comm *c, pdp_dtype dt, const char *fn)
{
    if (dt != PDP_DTYPE_F32 && dt != PDP_DTYPE_BF16 && dt != PDP_DTYPE_F16)
        return pdp__err(PDP_ERR_INVALID, "%s: unknown dtype %d (comm '%s', rank %d): "
                        "PDP_DTYPE_F32, PDP_DTYPE_BF16 or PDP_DTYPE_F16", fn, (int)dt, c->name,
                        c->rank);
    return PDP_OK;
}

PDP_API size_t pdp_dtype_size(pdp_dtype dt)
{
    return dt == PDP_DTYPE_F32 ? 4 : dt == PDP_DTYPE_BF16 || dt == PDP_DTYPE_F16 ? 2 : 0;
}

/* The all-reduce of every dtype; fn names the public entry. */
static pdp_status pdp__comm_allreduce(pdp_comm *c, void *buf, int64_t count, pdp_dtype dt,
                                      pdp_reduce_op op, pdp_work **work, const char *fn)
{
    pdp_work *w = NULL;
    double t = pdp__now(), n;
    pdp_status st;
    if (work) *work = NULL;
    if ((st = pdp__comm_check(c, fn)) || (st = pdp__comm_check_count(c, buf, count, "buf", fn)) ||
        (st = pdp__comm_check_op(c, op, fn)) || (st = pdp__comm_check_dtype(c, dt, fn)))
        return st;
    n = (double)c->size;
    st = c->ops->allreduce(c, buf, count, dt, op, &w);
    return pdp__comm_launched(c, st, w, t,
                              2.0 * (n - 1.0) / n * (double)count * (double)pdp_dtype_size(dt),
                              work, fn);
}

PDP_API pdp_status pdp_comm_allreduce(pdp_comm *c, float *buf, int64_t count, pdp_reduce_op op,
                                      pdp_work **work)
{
    return pdp__comm_allreduce(c, buf, count, PDP_DTYPE_F32, op, work, "pdp_comm_allreduce");
}

PDP_API pdp_status pdp_comm_allreduce_ex(pdp_comm *c, void *buf, int64_t count, pdp_dtype dtype,
                                         pdp_reduce_op op, pdp_work **work)
{
    return pdp__comm_allreduce(c, buf, count, dtype, op, work, "pdp_comm_allreduce_ex");
}

PDP_API pdp_status pdp_comm_broadcast(pdp_comm *c, float *buf, int64_t count, int root,
                                      pdp_work **work)
{
    static const char *fn = "pdp_comm_broadcast";
    pdp_work *w = NULL;
    double t = pdp__now(), n;
    pdp_status st;
    if (work) *work = NULL;
    if ((st = pdp__comm_check(c, fn)) || (st = pdp__comm_check_count(c, buf, count, "buf", fn)) ||
        (st = pdp__comm_check_root(c, root, fn)))
        return st;
    n = (double)c->size;
    st = c->ops->broadcast(c, buf, count, root, &w);
    return pdp__comm_launched(c, st, w, t, (n - 1.0) / n * (double)count * 4.0, work, fn);
}

static pdp_status pdp__comm_reduce_scatter(pdp_comm *c, const void *send, void *recv,
                                           int64_t recv_count, pdp_dtype dt, pdp_reduce_op op,
                                           pdp_work **work, const char *fn)
{
    pdp_work *w = NULL;
    double t = pdp__now();
    pdp_status st;
    if (work) *work = NULL;
    if ((st = pdp__comm_check(c, fn)) ||
        (st = pdp__comm_check_count(c, send, recv_count, "send", fn)) ||
        (st = pdp__comm_check_count(c, recv, recv_count, "recv", fn)) ||
        (st = pdp__comm_check_op(c, op, fn)) || (st = pdp__comm_check_dtype(c, dt, fn)))
        return st;
    st = c->ops->reduce_scatter(c, send, recv, recv_count, dt, op, &w);
    return pdp__comm_launched(c, st, w, t,
                              (double)(c->size - 1) * (double)recv_count *
                                  (double)pdp_dtype_size(dt),
                              work, fn);
}

PDP_API pdp_status pdp_comm_reduce_scatter(pdp_comm *c, const float *send, float *recv,
                                           int64_t recv_count, pdp_reduce_op op, pdp_work **work)
{
    return pdp__comm_reduce_scatter(c, send, recv, recv_count, PDP_DTYPE_F32, op, work,
                                    "pdp_comm_reduce_scatter");
}

PDP_API pdp_status pdp_comm_reduce_scatter_ex(pdp_comm *c, const void *send, void *recv,
                                              int64_t recv_count, pdp_dtype dtype,
                                              pdp_reduce_op op, pdp_work **work)
{
    return pdp__comm_reduce_scatter(c, send, recv, recv_count, dtype, op, work,
                                    "pdp_comm_reduce_scatter_ex");
}

PDP_API pdp_status pdp_comm_allgather(pdp_comm *c, const float *send, float *recv,
                                      int64_t send_count, pdp_work **work)
{
    static const char *fn = "pdp_comm_allgather";
    pdp_work *w = NULL;
    double t = pdp__now();
    pdp_status st;
    if (work) *work = NULL;
    if ((st = pdp__comm_check(c, fn)) ||
        (st = pdp__comm_check_count(c, send, send_count, "send", fn)) ||
        (st = pdp__comm_check_count(c, recv, send_count, "recv", fn)))
        return st;
    st = c->ops->allgather(c, send, recv, send_count, &w);
    return pdp__comm_launched(c, st, w, t, (double)(c->size - 1) * (double)send_count * 4.0, work,
                              fn);
}

PDP_API pdp_status pdp_comm_barrier(pdp_comm *c, pdp_work **work)
{
    static const char *fn = "pdp_comm_barrier";
    pdp_work *w = NULL;
    double t = pdp__now();
    pdp_status st;
    if (work) *work = NULL;
    if ((st = pdp__comm_check(c, fn))) return st;
    st = c->ops->barrier(c, &w);
    return pdp__comm_launched(c, st, w, t, 0.0, work, fn);
}

/* ---- comm: point-to-point ---- */

static pdp_status pdp__comm_check_p2p(const pdp_comm *c, int peer, int tag, const char *fn)
{
    if (peer < 0 || peer >= c->size)
        return pdp__err(PDP_ERR_INVALID, "%s: peer %d outside 0..%d (comm '%s', rank %d)", fn,
                        peer, c->size - 1, c->name, c->rank);
    if (tag < 0 || tag > PDP_COMM_TAG_MAX)
        return pdp__err(PDP_ERR_INVALID, "%s: tag %d outside 0..%d (comm '%s', rank %d)", fn, tag,
                        PDP_COMM_TAG_MAX, c->name, c->rank);
    return PDP_OK;
}

PDP_API pdp_status pdp_comm_send(pdp_comm *c, const float *buf, int64_t count, int peer, int tag,
                                 pdp_work **work)
{
    static const char *fn = "pdp_comm_send";
    pdp_work *w = NULL;
    double t = pdp__now();
    pdp_status st;
    if (work) *work = NULL;
    if ((st = pdp__comm_check(c, fn)) || (st = pdp__comm_check_count(c, buf, count, "buf", fn)) ||
        (st = pdp__comm_check_p2p(c, peer, tag, fn)))
        return st;
    st = c->ops->send(c, buf, count, peer, tag, &w);
    return pdp__comm_launched(c, st, w, t, (double)count * 4.0, work, fn);
}

PDP_API pdp_status pdp_comm_recv(pdp_comm *c, float *buf, int64_t count, int peer, int tag,
                                 pdp_work **work)
{
    static const char *fn = "pdp_comm_recv";
    pdp_work *w = NULL;
    double t = pdp__now();
    pdp_status st;
    if (work) *work = NULL;
    if ((st = pdp__comm_check(c, fn)) || (st = pdp__comm_check_count(c, buf, count, "buf", fn)) ||
        (st = pdp__comm_check_p2p(c, peer, tag, fn)))
        return st;
    st = c->ops->recv(c, buf, count, peer, tag, &w);
    return pdp__comm_launched(c, st, w, t, 0.0, work, fn);
}

/* ---- comm: agreement at the end of a collective constructor ----
   pdp_comm_split, pdp_zero_create and pdp_pp_create allocate after their last collective: a
   rank whose allocation fails there would leave the others an object whose peer does not
   exist, and they would learn of it only at its first collective. So each rank passes its
   status st through one all-reduce (a count of failed ranks and the sum of their numbers):
   a failed rank gets its own status and message back; a rank that succeeded fails with
   PDP_ERR_COMM naming the failed rank when there is one. */
static pdp_status pdp__comm_agree(pdp_comm *c, pdp_status st, const char *fn)
{
    char why[1024]; /* the thread-local message's size */
    float v[2], *dev = NULL;
    pdp_status ast;
    if (st != PDP_OK) snprintf(why, sizeof why, "%s", pdp_last_error());
    v[0] = st != PDP_OK ? 1.0f : 0.0f;
    v[1] = st != PDP_OK ? (float)c->rank : 0.0f;
    if (c->device.kind == PDP_DEVICE_CPU) {
        ast = pdp_comm_allreduce(c, v, 2, PDP_REDUCE_SUM, NULL);
    } else if ((ast = pdp__dev_alloc(c->device, sizeof v, (void **)&dev)) == PDP_OK) {
        if ((ast = pdp__dev_copy(c->device, dev, pdp_cpu(), v, sizeof v)) == PDP_OK &&
            (ast = pdp_comm_allreduce(c, dev, 2, PDP_REDUCE_SUM, NULL)) == PDP_OK)
            ast = pdp__dev_copy(pdp_cpu(), v, c->device, dev, sizeof v);
        pdp__dev_free(c->device, dev);
    }
    if (st != PDP_OK) return pdp__err(st, "%s", why);
    if (ast != PDP_OK)
        return pdp__err_wrap(ast, "%s: rank %d: agreeing that every rank succeeded", fn, c->rank);
    if (v[0] >= 2.0f)
        return pdp__err(PDP_ERR_COMM, "%s: rank %d: %d ranks of comm '%s' failed (see their "
                        "messages)", fn, c->rank, (int)v[0], c->name);
    if (v[0] >= 1.0f)
        return pdp__err(PDP_ERR_COMM, "%s: rank %d: rank %d of comm '%s' failed (see its "
                        "message)", fn, c->rank, (int)v[1], c->name);
    return PDP_OK;
}

/* ---- comm: process groups ---- */

#define PDP__SPLIT_MAX_RANKS 4096 /* the (colour, key) table lives on the stack */

PDP_API pdp_status pdp_comm_split(pdp_comm *c, int colour, int key, pdp_comm **out)
{
    static const char *fn = "pdp_comm_split";
    int table[2 * PDP__SPLIT_MAX_RANKS], r, new_rank = 0, new_size = 0, leader = -1;
    pdp_status st;
    if (out) *out = NULL;
    if ((st = pdp__comm_check(c, fn))) return st;
    if (!out) return pdp__err(PDP_ERR_INVALID, "%s: out is NULL (comm '%s')", fn, c->name);
    if (colour < PDP_COMM_SPLIT_NONE)
        return pdp__err(PDP_ERR_INVALID, "%s: colour %d (comm '%s', rank %d): a colour is >= 0, "
                        "or PDP_COMM_SPLIT_NONE (-1) to join no group", fn, colour, c->name,
                        c->rank);
    if (c->size > PDP__SPLIT_MAX_RANKS)
        return pdp__err(PDP_ERR_UNSUPPORTED, "%s: comm '%s' has %d ranks; splits take at most %d",
                        fn, c->name, c->size, PDP__SPLIT_MAX_RANKS);
    /* every rank's (colour, key), through the communicator itself (bounded by its timeout) */
    for (r = 0; r < c->size; r++) {
        table[2 * r] = colour;
        table[2 * r + 1] = key;
        if ((st = pdp_comm_broadcast_bytes(c, &table[2 * r], 2 * sizeof(int), r)) != PDP_OK)
            return pdp__err_wrap(st, "%s: exchanging colours", fn);
    }
    /* place in the new group: order by (key, old rank) among the same colour */
    for (r = 0; r < c->size; r++) {
        int k = table[2 * r + 1];
        if (table[2 * r] != colour) continue;
        if (k < key || (k == key && r < c->rank)) new_rank++;
        new_size++;
    }
    for (r = 0; r < c->size && colour >= 0; r++) { /* the member that becomes rank 0 */
        int k = table[2 * r + 1], lk;
        if (table[2 * r] != colour) continue;
        lk = leader < 0 ? 0 : table[2 * leader + 1];
        if (leader < 0 || k < lk) leader = r;
    }
    if ((st = c->ops->split(c, colour, key, new_rank, new_size, leader, out)) != PDP_OK)
        st = pdp__err_wrap(st, "%s", fn);
    if (st == PDP_ERR_TIMEOUT) return st; /* c timed out: an agreement would wait as long */
    if ((st = pdp__comm_agree(c, st, fn)) != PDP_OK && *out) { /* a member is missing */
        pdp_comm_free(*out);
        *out = NULL;
    }
    return st;
}

PDP_API pdp_status pdp_comm_broadcast_bytes(pdp_comm *c, void *buf, size_t bytes, int root)
{
    static const char *fn = "pdp_comm_broadcast_bytes";
    pdp_status st;
    if ((st = pdp__comm_check(c, fn)) || (st = pdp__comm_check_root(c, root, fn))) return st;
    if (bytes > 0 && !buf)
        return pdp__err(PDP_ERR_INVALID, "%s: buf is NULL with %zu bytes (comm '%s', rank %d)", fn,
                        bytes, c->name, c->rank);
    if ((st = c->ops->broadcast_bytes(c, buf, bytes, root)) != PDP_OK)
        return pdp__err_wrap(st, "%s", fn);
    c->stats.collectives++;
    c->stats.bytes_sent += (int64_t)((double)(c->size - 1) / c->size * (double)bytes);
    return PDP_OK;
}

PDP_API pdp_status pdp_work_wait(pdp_work *w)
{
    pdp_comm *c;
    pdp_status st;
    if (!w) return PDP_OK;
    c = w->comm;
    st = c->ops->wait(w); /* recycles w; its head fields stay readable (internal.h) */
    c->stats.busy_s += w->t_done > w->t_start ? w->t_done - w->t_start : 0.0;
    return st == PDP_OK ? st : pdp__err_wrap(st, "pdp_work_wait");
}

PDP_API pdp_status pdp_wait(pdp_work *work) { return pdp_work_wait(work); }

PDP_API bool pdp_work_done(pdp_work *w) { return !w || w->comm->ops->done(w); }

PDP_API void pdp_comm_free(pdp_comm *c)
{
    if (c) c->ops->destroy(c);
}

PDP_API int pdp_comm_rank(const pdp_comm *c) { return c ? c->rank : -1; }
PDP_API int pdp_comm_size(const pdp_comm *c) { return c ? c->size : 0; }
PDP_API pdp_backend pdp_comm_backend(const pdp_comm *c)
{
    return c ? c->backend : PDP_BACKEND_DEFAULT;
}
PDP_API double pdp_comm_timeout(const pdp_comm *c) { return c ? c->timeout_s : 0.0; }

PDP_API void pdp_comm_get_stats(const pdp_comm *c, pdp_comm_stats *out)
{
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (c) *out = c->stats;
}

/* ---- comm: pdp_comm_init_env, the dispatcher ---- */

PDP_API pdp_status pdp_comm_init_env(pdp_comm **out, const pdp_comm_desc *desc)
{
    static const char *fn = "pdp_comm_init_env";
    pdp_backend b = desc ? desc->backend : PDP_BACKEND_DEFAULT;
    double timeout;
    pdp_status st;
    if (!out) return pdp__err(PDP_ERR_INVALID, "%s: out is NULL", fn);
    *out = NULL;
    /* the desc rule first, so that every build checks it, whatever the backend */
    if ((st = pdp__comm_desc_timeout(desc, &timeout, fn)) != PDP_OK) return st;
    switch (b) {
    case PDP_BACKEND_MPI: return pdp__comm_init_mpi_env(out, desc);
    case PDP_BACKEND_NCCL: return pdp__comm_init_nccl_env(out, desc);
    case PDP_BACKEND_DEFAULT:
    case PDP_BACKEND_LOCAL:
        return pdp__err(PDP_ERR_INVALID, "%s: backend %s: the local backend's ranks are threads "
                        "of one process and have no environment to read; create them with "
                        "pdp_local_group_create and pdp_comm_create_local (or set desc.backend "
                        "to PDP_BACKEND_MPI or PDP_BACKEND_NCCL)", fn,
                        b == PDP_BACKEND_LOCAL ? "LOCAL" : "DEFAULT (local)");
    }
    return pdp__err(PDP_ERR_INVALID, "%s: unknown backend %d", fn, (int)b);
}
/* ---- end src/comm.c ---- */

/* ---- begin src/layers.c ---- */
/* layers: every layer kind's code, kind by kind: setup (shape inference and
   validation), parameter initialisation, forward and backward on the CPU, and the
   CUDA entries that hand a CUDA device's work to pdp_cuda.cu. layers_table.c lists
   them in one table of kinds; model.c drives them in order.

   Conventions (PyTorch's, so that state_dicts and results carry over):
   - Linear: y = x W^T + b, W [out, in], on 1-D samples.
   - Conv2d and MaxPool2d: in layers_conv.c.
   - LayerNorm: over all features of a sample, biased variance, y = (x - mean) *
     rstd * w + b with w, b of the sample's shape; mean and rstd are saved.
   - GELU is the tanh form; the element formulas live in math.h (shared with CUDA).
   - Dropout: the mask is a pure function of (seed, layer, step, global sample
     index, element) (math.h), so a batch split across DP replicas, each with its
     sample_base, draws exactly the masks one device draws. Training: keep with
     probability 1 - p and scale by 1 / (1 - p); the scaled mask is saved for
     backward. Evaluation: identity.
   - Flatten is a view: model.c aliases its output to its input and never calls
     forward or backward for it (they copy, should anything else). So is a ReLU
     right after a Conv2d on the CPU (layers_conv.c).

   Invariants: forward and backward allocate nothing (temporaries live in io->work,
   sized by work_per_sample); backward accumulates into dw and db (+=) and writes
   dx (=), and skips dx when it is NULL (the first layer). Every reduction runs
   in a fixed order that does not depend on the thread count, so results are
   bit-reproducible. A setup starts from the output shape = the input shape and no
   saved floats, workspace or parameters (layers_table.c's pdp__layer_setup), and
   its messages name what is wrong and the input shape `in`; pdp__model_add adds
   the function and the layer. A CUDA entry returns pdp_cuda.cu's status as it is
   (layers_table.c turns a failure into "pdp_cuda: <its message>"). */

/* #include "internal.h" (already above) */

/* ---- layers: small helpers ---- */

/* "(1, 28, 28)" or "(784)": a sample's shape, for messages. */
static const char *pdp__layers_dims_str(int ndim, const int64_t *shape, char *buf, size_t bytes)
{
    if (ndim == 3)
        snprintf(buf, bytes, "(%lld, %lld, %lld)", (long long)shape[0], (long long)shape[1],
                 (long long)shape[2]);
    else
        snprintf(buf, bytes, "(%lld)", (long long)shape[0]);
    return buf;
}

/* Sum of n floats: 16 float lanes (which the compiler vectorises), combined in
   double. Fixed order, so the same bits on every run. */
static double pdp__layers_sum(const float *PDP__RESTRICT x, int64_t n)
{
    float lane[16] = {0};
    double s = 0.0;
    int64_t i = 0;
    int k;
    for (; i + 16 <= n; i += 16)
        for (k = 0; k < 16; k++) lane[k] += x[i + k];
    for (; i < n; i++) s += x[i];
    for (k = 0; k < 16; k++) s += lane[k];
    return s;
}

/* Sum of (x[i] - c)^2, same scheme. */
static double pdp__layers_sumsq_dev(const float *PDP__RESTRICT x, float c, int64_t n)
{
    float lane[16] = {0};
    double s = 0.0;
    int64_t i = 0;
    int k;
    for (; i + 16 <= n; i += 16)
        for (k = 0; k < 16; k++) {
            float d = x[i + k] - c;
            lane[k] += d * d;
        }
    for (; i < n; i++) s += (double)(x[i] - c) * (double)(x[i] - c);
    for (k = 0; k < 16; k++) s += lane[k];
    return s;
}

/* Sum of a[i] * b[i], same scheme. */
static double pdp__layers_dot(const float *PDP__RESTRICT a, const float *PDP__RESTRICT b, int64_t n)
{
    float lane[16] = {0};
    double s = 0.0;
    int64_t i = 0;
    int k;
    for (; i + 16 <= n; i += 16)
        for (k = 0; k < 16; k++) lane[k] += a[i + k] * b[i + k];
    for (; i < n; i++) s += (double)a[i] * b[i];
    for (k = 0; k < 16; k++) s += lane[k];
    return s;
}

/* Sum of a[i] * b[i] * (c[i] - m), same scheme. */
static double pdp__layers_dot3(const float *PDP__RESTRICT a, const float *PDP__RESTRICT b,
                               const float *PDP__RESTRICT c, float m, int64_t n)
{
    float lane[16] = {0};
    double s = 0.0;
    int64_t i = 0;
    int k;
    for (; i + 16 <= n; i += 16)
        for (k = 0; k < 16; k++) lane[k] += a[i + k] * b[i + k] * (c[i + k] - m);
    for (; i < n; i++) s += (double)a[i] * b[i] * (c[i] - m);
    for (k = 0; k < 16; k++) s += lane[k];
    return s;
}

/* Parts for a job split by sample: the caller's intra-op threads, at most one
   per sample. */
static int pdp__layers_batch_parts(int64_t batch)
{
    return (int)PDP__MIN((int64_t)pdp__threads_for_caller(), batch);
}

/* Parameters: the product of a shape. */
static int64_t pdp__layers_count(int ndim, const int64_t *shape)
{
    int64_t n = 1;
    int i;
    for (i = 0; i < ndim; i++) n *= shape[i];
    return n;
}

/* PyTorch's reset_parameters for Linear and Conv2d: weight Kaiming uniform with
   a = sqrt(5) (bound 1/sqrt(fan_in)), then bias U(-1/sqrt(fan_in), 1/sqrt(fan_in)),
   in that order from r. w and b are host memory. */
static void pdp__layers_init_kaiming(float *w, int64_t nw, float *b, int64_t nb, int64_t fan_in,
                                     pdp_rng *r)
{
    pdp_tensor t;
    float bound;
    pdp_tensor_wrap(w, pdp_cpu(), 1, &nw, &t);
    pdp_tensor_kaiming_uniform(&t, r, fan_in, sqrtf(5.0f));
    bound = (float)(1.0 / sqrt((double)fan_in));
    pdp_tensor_wrap(b, pdp_cpu(), 1, &nb, &t);
    pdp_tensor_uniform(&t, r, -bound, bound);
}

/* Setup of a layer whose output has its input's shape and that keeps nothing
   (the activations): nothing to check. */
static pdp_status pdp__layers_setup_same(pdp__layer *l, pdp__param_shapes *ps, const char *in)
{
    (void)l, (void)ps, (void)in;
    return PDP_OK;
}

/* ---- layers: Linear ---- */

static pdp_status pdp__linear_setup(pdp__layer *l, pdp__param_shapes *ps, const char *in)
{
    int64_t weights;
    if (l->out_features < 1)
        return pdp__err(PDP_ERR_INVALID, "out_features %lld must be >= 1 (input %s)",
                        (long long)l->out_features, in);
    if (l->in_ndim != 1)
        return pdp__err(PDP_ERR_SHAPE, "needs 1-D samples, got %s (add a Flatten first)", in);
    if (!pdp__mul_ok(l->out_features, l->in_count, &weights))
        return pdp__err(PDP_ERR_SHAPE, "out_features %lld x %lld inputs: more than %lld weights "
                        "(input %s)", (long long)l->out_features, (long long)l->in_count,
                        (long long)PDP__COUNT_MAX, in);
    l->out_shape[0] = l->out_features;
    ps->wshape[0] = l->out_features;
    ps->wshape[1] = l->in_count;
    ps->wndim = 2;
    ps->bshape[0] = l->out_features;
    ps->bndim = 1;
    return PDP_OK;
}

static void pdp__linear_init(const pdp__layer *l, float *w, float *b, pdp_rng *r)
{
    pdp__layers_init_kaiming(w, l->out_features * l->in_count, b, l->out_features, l->in_count, r);
}

static void pdp__linear_forward(const pdp__layer *l, const pdp__layer_io *io)
{
    int64_t B = io->batch, in = l->in_count, out = l->out_features, i;
    float beta = 0.0f;
    if (io->b) { /* y = b, then the GEMM adds x W^T (beta 1): no second pass for the bias */
        for (i = 0; i < B; i++) memcpy(io->y + i * out, io->b, (size_t)out * sizeof(float));
        beta = 1.0f;
    }
    (io->bf16 ? pdp_gemm_bf16 : pdp_sgemm)(PDP_NO_TRANS, PDP_TRANS, B, out, in, 1.0f, io->x, in,
                                            io->w, in, beta, io->y, out);
}

static void pdp__linear_backward(const pdp__layer *l, const pdp__layer_io *io)
{
    int64_t B = io->batch, in = l->in_count, out = l->out_features, i;
    /* dW += dY^T X */
    (io->bf16 ? pdp_gemm_bf16 : pdp_sgemm)(PDP_TRANS, PDP_NO_TRANS, out, in, B, 1.0f, io->dy, out,
                                            io->x, in, 1.0f, io->dw, in);
    if (io->db) { /* db += column sums of dY, sample by sample */
        float *PDP__RESTRICT db = io->db;
        for (i = 0; i < B; i++) {
            const float *PDP__RESTRICT g = io->dy + i * out;
            PDP__FOR_BLOCKED(j, out, db[j] += g[j];);
        }
    }
    if (io->dx) /* dX = dY W */
        (io->bf16 ? pdp_gemm_bf16 : pdp_sgemm)(PDP_NO_TRANS, PDP_NO_TRANS, B, in, out, 1.0f, io->dy,
                                                out, io->w, in, 0.0f, io->dx, in);
}

#ifdef PDP_CUDA
static pdp_status pdp__linear_cuda_forward(const pdp__layer *l, const pdp__layer_io *io)
{
    return pdp_cudak_linear_fwd(io->device.ordinal, io->x, io->w, io->b, io->y, io->batch,
                                l->in_count, l->out_features, io->bf16);
}

static pdp_status pdp__linear_cuda_backward(const pdp__layer *l, const pdp__layer_io *io)
{
    return pdp_cudak_linear_bwd(io->device.ordinal, io->x, io->w, io->dy, io->dw, io->db, io->dx,
                                io->batch, l->in_count, l->out_features, io->bf16);
}
#endif

/* ---- layers: activations ---- */

/* Element-wise layers split [0, batch * in_count) into equal ranges (multiples of
   16) over the intra-op threads when there is enough work to pay for the hand-off;
   every element is computed alone, so the split never changes a bit. The hand-off
   (waking a worker and waiting for it) costs more than a ReLU over 65536 floats:
   the MLP 784-512-512-10 at batch 128 on 2 threads spent 0.33-0.42 ms per step in
   its ReLUs split, 0.18-0.22 ms unsplit (pdp_profile, Zen 4); from 262144 floats on,
   the split pays. (Measured before the pool's workers spun between jobs; with the
   spin, a threshold of 16384 gained 1-3% on that step, inside the host's noise, so
   the threshold stayed.) */
#ifndef PDP__ELEMWISE_PAR_MIN
#  define PDP__ELEMWISE_PAR_MIN 262144
#endif

typedef struct pdp__elem_job {
    const pdp__layer *l;
    const pdp__layer_io *io;
    int64_t n;
    void (*fn)(const pdp__layer *l, const pdp__layer_io *io, int64_t lo, int64_t hi);
} pdp__elem_job;

static void pdp__elem_part(void *arg, int i, int parts)
{
    const pdp__elem_job *job = (const pdp__elem_job *)arg;
    int64_t blocks = (job->n + 15) / 16;
    int64_t lo = PDP__MIN(job->n, blocks * i / parts * 16);
    int64_t hi = PDP__MIN(job->n, blocks * (i + 1) / parts * 16);
    if (lo < hi) job->fn(job->l, job->io, lo, hi);
}

static void pdp__elem_run(const pdp__layer *l, const pdp__layer_io *io,
                          void (*fn)(const pdp__layer *, const pdp__layer_io *, int64_t, int64_t))
{
    pdp__elem_job job;
    int parts = pdp__threads_for_caller();
    job.l = l;
    job.io = io;
    job.n = io->batch * l->in_count;
    job.fn = fn;
    if (job.n < PDP__ELEMWISE_PAR_MIN) parts = 1;
    pdp__parallel_for(parts, pdp__elem_part, &job);
}

/* ReLU, GELU, Tanh, Sigmoid: elements [lo, hi) of forward (y from x) and of
   backward (dx from dy and y, or x for GELU). */
static void pdp__relu_forward_range(const pdp__layer *l, const pdp__layer_io *io, int64_t lo,
                                    int64_t hi)
{
    int64_t n = hi - lo;
    const float *PDP__RESTRICT x = io->x + lo;
    float *PDP__RESTRICT y = io->y + lo;
    (void)l;
    PDP__FOR_BLOCKED(i, n, y[i] = pdp__relu(x[i]););
}

static void pdp__relu_backward_range(const pdp__layer *l, const pdp__layer_io *io, int64_t lo,
                                     int64_t hi)
{
    int64_t n = hi - lo;
    const float *PDP__RESTRICT y = io->y + lo, *PDP__RESTRICT dy = io->dy + lo;
    float *PDP__RESTRICT dx = io->dx + lo;
    (void)l;
    PDP__FOR_BLOCKED(i, n, dx[i] = pdp__relu_grad(dy[i], y[i]););
}

static void pdp__gelu_forward_range(const pdp__layer *l, const pdp__layer_io *io, int64_t lo,
                                    int64_t hi)
{
    int64_t n = hi - lo, i;
    const float *PDP__RESTRICT x = io->x + lo;
    float *PDP__RESTRICT y = io->y + lo;
    (void)l;
    for (i = 0; i < n; i++) y[i] = pdp__gelu(x[i]);
}

static void pdp__gelu_backward_range(const pdp__layer *l, const pdp__layer_io *io, int64_t lo,
                                     int64_t hi)
{
    int64_t n = hi - lo, i;
    const float *PDP__RESTRICT x = io->x + lo, *PDP__RESTRICT dy = io->dy + lo;
    float *PDP__RESTRICT dx = io->dx + lo;
    (void)l;
    for (i = 0; i < n; i++) dx[i] = pdp__gelu_grad(dy[i], x[i]);
}

static void pdp__tanh_forward_range(const pdp__layer *l, const pdp__layer_io *io, int64_t lo,
                                    int64_t hi)
{
    int64_t n = hi - lo, i;
    const float *PDP__RESTRICT x = io->x + lo;
    float *PDP__RESTRICT y = io->y + lo;
    (void)l;
    for (i = 0; i < n; i++) y[i] = tanhf(x[i]);
}

static void pdp__tanh_backward_range(const pdp__layer *l, const pdp__layer_io *io, int64_t lo,
                                     int64_t hi)
{
    int64_t n = hi - lo;
    const float *PDP__RESTRICT y = io->y + lo, *PDP__RESTRICT dy = io->dy + lo;
    float *PDP__RESTRICT dx = io->dx + lo;
    (void)l;
    PDP__FOR_BLOCKED(i, n, dx[i] = pdp__tanh_grad(dy[i], y[i]););
}

static void pdp__sigmoid_forward_range(const pdp__layer *l, const pdp__layer_io *io, int64_t lo,
                                       int64_t hi)
{
    int64_t n = hi - lo, i;
    const float *PDP__RESTRICT x = io->x + lo;
    float *PDP__RESTRICT y = io->y + lo;
    (void)l;
    for (i = 0; i < n; i++) y[i] = pdp__sigmoid(x[i]);
}

static void pdp__sigmoid_backward_range(const pdp__layer *l, const pdp__layer_io *io, int64_t lo,
                                        int64_t hi)
{
    int64_t n = hi - lo;
    const float *PDP__RESTRICT y = io->y + lo, *PDP__RESTRICT dy = io->dy + lo;
    float *PDP__RESTRICT dx = io->dx + lo;
    (void)l;
    PDP__FOR_BLOCKED(i, n, dx[i] = pdp__sigmoid_grad(dy[i], y[i]););
}

static void pdp__relu_forward(const pdp__layer *l, const pdp__layer_io *io)
{
    pdp__elem_run(l, io, pdp__relu_forward_range);
}

static void pdp__relu_backward(const pdp__layer *l, const pdp__layer_io *io)
{
    if (io->dx) pdp__elem_run(l, io, pdp__relu_backward_range);
}

static void pdp__gelu_forward(const pdp__layer *l, const pdp__layer_io *io)
{
    pdp__elem_run(l, io, pdp__gelu_forward_range);
}

static void pdp__gelu_backward(const pdp__layer *l, const pdp__layer_io *io)
{
    if (io->dx) pdp__elem_run(l, io, pdp__gelu_backward_range);
}

static void pdp__tanh_forward(const pdp__layer *l, const pdp__layer_io *io)
{
    pdp__elem_run(l, io, pdp__tanh_forward_range);
}

static void pdp__tanh_backward(const pdp__layer *l, const pdp__layer_io *io)
{
    if (io->dx) pdp__elem_run(l, io, pdp__tanh_backward_range);
}

static void pdp__sigmoid_forward(const pdp__layer *l, const pdp__layer_io *io)
{
    pdp__elem_run(l, io, pdp__sigmoid_forward_range);
}

static void pdp__sigmoid_backward(const pdp__layer *l, const pdp__layer_io *io)
{
    if (io->dx) pdp__elem_run(l, io, pdp__sigmoid_backward_range);
}

#ifdef PDP_CUDA
/* One kernel pair for the four, told which by pdp_cudak_act. */
static pdp_status pdp__act_cuda_forward(const pdp__layer *l, const pdp__layer_io *io,
                                        pdp_cudak_act act)
{
    return pdp_cudak_act_fwd(io->device.ordinal, act, io->x, io->y, io->batch * l->in_count);
}

static pdp_status pdp__act_cuda_backward(const pdp__layer *l, const pdp__layer_io *io,
                                         pdp_cudak_act act)
{
    if (!io->dx) return PDP_OK;
    return pdp_cudak_act_bwd(io->device.ordinal, act, io->x, io->y, io->dy, io->dx,
                             io->batch * l->in_count);
}

static pdp_status pdp__relu_cuda_forward(const pdp__layer *l, const pdp__layer_io *io)
{
    return pdp__act_cuda_forward(l, io, PDP_CUDAK_RELU);
}

static pdp_status pdp__relu_cuda_backward(const pdp__layer *l, const pdp__layer_io *io)
{
    return pdp__act_cuda_backward(l, io, PDP_CUDAK_RELU);
}

static pdp_status pdp__gelu_cuda_forward(const pdp__layer *l, const pdp__layer_io *io)
{
    return pdp__act_cuda_forward(l, io, PDP_CUDAK_GELU);
}

static pdp_status pdp__gelu_cuda_backward(const pdp__layer *l, const pdp__layer_io *io)
{
    return pdp__act_cuda_backward(l, io, PDP_CUDAK_GELU);
}

static pdp_status pdp__tanh_cuda_forward(const pdp__layer *l, const pdp__layer_io *io)
{
    return pdp__act_cuda_forward(l, io, PDP_CUDAK_TANH);
}

static pdp_status pdp__tanh_cuda_backward(const pdp__layer *l, const pdp__layer_io *io)
{
    return pdp__act_cuda_backward(l, io, PDP_CUDAK_TANH);
}

static pdp_status pdp__sigmoid_cuda_forward(const pdp__layer *l, const pdp__layer_io *io)
{
    return pdp__act_cuda_forward(l, io, PDP_CUDAK_SIGMOID);
}

static pdp_status pdp__sigmoid_cuda_backward(const pdp__layer *l, const pdp__layer_io *io)
{
    return pdp__act_cuda_backward(l, io, PDP_CUDAK_SIGMOID);
}
#endif

/* ---- layers: Dropout ---- */

static pdp_status pdp__dropout_setup(pdp__layer *l, pdp__param_shapes *ps, const char *in)
{
    (void)ps;
    if (!(l->p >= 0.0f && l->p < 1.0f))
        return pdp__err(PDP_ERR_INVALID, "p %g is outside [0, 1) (input %s)", (double)l->p, in);
    l->saved_per_sample = l->in_count; /* the scaled mask */
    return PDP_OK;
}

static void pdp__dropout_forward(const pdp__layer *l, const pdp__layer_io *io)
{
    int64_t B = io->batch, n = l->in_count, s;
    uint32_t thr;
    float scale;
    if (!io->training || l->p == 0.0f) {
        if (io->y != io->x) memcpy(io->y, io->x, (size_t)(B * n) * sizeof(float));
        return;
    }
    thr = pdp__dropout_threshold(l->p);
    scale = 1.0f / (1.0f - l->p);
    for (s = 0; s < B; s++) {
        uint64_t key = pdp__dropout_key(io->seed, l->index, io->step, io->sample_base + s);
        const float *PDP__RESTRICT x = io->x + s * n;
        float *PDP__RESTRICT y = io->y + s * n, *PDP__RESTRICT mask = io->saved + s * n;
        PDP__FOR_BLOCKED(j, n, {
            mask[j] = pdp__dropout_bits(key, j) >= thr ? scale : 0.0f;
            y[j] = x[j] * mask[j];
        });
    }
}

static void pdp__dropout_backward(const pdp__layer *l, const pdp__layer_io *io)
{
    int64_t n = io->batch * l->in_count;
    const float *PDP__RESTRICT dy = io->dy, *PDP__RESTRICT mask = io->saved;
    float *PDP__RESTRICT dx = io->dx;
    if (!dx) return;
    if (!io->training || l->p == 0.0f) {
        memcpy(dx, dy, (size_t)n * sizeof(float));
        return;
    }
    PDP__FOR_BLOCKED(i, n, dx[i] = dy[i] * mask[i];);
}


#ifdef PDP_CUDA
static pdp_status pdp__dropout_cuda_forward(const pdp__layer *l, const pdp__layer_io *io)
{
    int dev = io->device.ordinal;
    int64_t n = io->batch * l->in_count;
    if (io->training && l->p != 0.0f)
        return pdp_cudak_dropout_fwd(dev, io->x, io->y, io->saved, io->batch, l->in_count, l->p,
                                     io->seed, l->index, io->step, io->sample_base);
    if (io->y == io->x) return PDP_OK;
    return pdp_cudak_memcpy(dev, io->y, dev, io->x, (size_t)n * sizeof(float));
}

static pdp_status pdp__dropout_cuda_backward(const pdp__layer *l, const pdp__layer_io *io)
{
    int dev = io->device.ordinal;
    int64_t n = io->batch * l->in_count;
    if (!io->dx) return PDP_OK;
    if (!io->training || l->p == 0.0f)
        return pdp_cudak_memcpy(dev, io->dx, dev, io->dy, (size_t)n * sizeof(float));
    return pdp_cudak_mul(dev, io->dy, io->saved, io->dx, n);
}
#endif

/* ---- layers: LayerNorm ---- */

static pdp_status pdp__layernorm_setup(pdp__layer *l, pdp__param_shapes *ps, const char *in)
{
    if (!(l->eps > 0.0f) || isinf(l->eps))
        return pdp__err(PDP_ERR_INVALID, "eps %g must be finite and > 0 (input %s)",
                        (double)l->eps, in);
    memcpy(ps->wshape, l->in_shape, 3 * sizeof *ps->wshape);
    memcpy(ps->bshape, l->in_shape, 3 * sizeof *ps->bshape);
    ps->wndim = ps->bndim = l->in_ndim;
    l->saved_per_sample = 2; /* mean, rstd */
    return PDP_OK;
}

/* weight 1, bias 0 (PyTorch's) */
static void pdp__layernorm_init(const pdp__layer *l, float *w, float *b, pdp_rng *r)
{
    int64_t i;
    (void)r;
    for (i = 0; i < l->in_count; i++) {
        w[i] = 1.0f;
        b[i] = 0.0f;
    }
}

static void pdp__layernorm_forward(const pdp__layer *l, const pdp__layer_io *io)
{
    int64_t B = io->batch, n = l->in_count, s;
    const float *PDP__RESTRICT w = io->w, *PDP__RESTRICT b = io->b;
    for (s = 0; s < B; s++) {
        const float *PDP__RESTRICT x = io->x + s * n;
        float *PDP__RESTRICT y = io->y + s * n;
        float mean = (float)(pdp__layers_sum(x, n) / (double)n);
        double var = pdp__layers_sumsq_dev(x, mean, n) / (double)n;
        float rstd = (float)(1.0 / sqrt(var + (double)l->eps));
        PDP__FOR_BLOCKED(j, n, y[j] = (x[j] - mean) * rstd * w[j] + b[j];);
        io->saved[2 * s] = mean;
        io->saved[2 * s + 1] = rstd;
    }
}

/* With xh = (x - mean) rstd and g = dy w:
   dx = rstd (g - mean(g) - xh mean(g xh)), dw += dy xh, db += dy.
   Two passes over each sample, nothing stored. */
static void pdp__layernorm_backward(const pdp__layer *l, const pdp__layer_io *io)
{
    int64_t B = io->batch, n = l->in_count, s;
    const float *PDP__RESTRICT w = io->w;
    float *PDP__RESTRICT dw = io->dw, *PDP__RESTRICT db = io->db;
    for (s = 0; s < B; s++) {
        const float *PDP__RESTRICT x = io->x + s * n, *PDP__RESTRICT dy = io->dy + s * n;
        float mean = io->saved[2 * s], rstd = io->saved[2 * s + 1], mg, mgx;
        PDP__FOR_BLOCKED(j, n, {
            dw[j] += dy[j] * ((x[j] - mean) * rstd);
            db[j] += dy[j];
        });
        if (!io->dx) continue;
        mg = (float)(pdp__layers_dot(dy, w, n) / (double)n);
        mgx = (float)(pdp__layers_dot3(dy, w, x, mean, n) * (double)rstd / (double)n);
        {
            float *PDP__RESTRICT dx = io->dx + s * n;
            PDP__FOR_BLOCKED(j, n, {
                dx[j] = rstd * (dy[j] * w[j] - mg - (x[j] - mean) * rstd * mgx);
            });
        }
    }
}

#ifdef PDP_CUDA
static pdp_status pdp__layernorm_cuda_forward(const pdp__layer *l, const pdp__layer_io *io)
{
    return pdp_cudak_layernorm_fwd(io->device.ordinal, io->x, io->w, io->b, io->y, io->saved,
                                   io->batch, l->in_count, l->eps);
}

static pdp_status pdp__layernorm_cuda_backward(const pdp__layer *l, const pdp__layer_io *io)
{
    return pdp_cudak_layernorm_bwd(io->device.ordinal, io->x, io->w, io->dy, io->saved, io->dw,
                                   io->db, io->dx, io->batch, l->in_count);
}
#endif

/* ---- layers: Flatten ----
   A view (PDP__LAYER_VIEW): model.c never calls these; they copy, should anything
   else. */

static pdp_status pdp__flatten_setup(pdp__layer *l, pdp__param_shapes *ps, const char *in)
{
    (void)ps, (void)in;
    l->out_ndim = 1;
    l->out_shape[0] = l->in_count;
    l->out_shape[1] = l->out_shape[2] = 1;
    return PDP_OK;
}

static void pdp__flatten_forward(const pdp__layer *l, const pdp__layer_io *io)
{
    if (io->y != io->x) memcpy(io->y, io->x, (size_t)(io->batch * l->in_count) * sizeof(float));
}

static void pdp__flatten_backward(const pdp__layer *l, const pdp__layer_io *io)
{
    if (io->dx && io->dx != io->dy)
        memcpy(io->dx, io->dy, (size_t)(io->batch * l->in_count) * sizeof(float));
}

#ifdef PDP_CUDA
static pdp_status pdp__flatten_cuda_forward(const pdp__layer *l, const pdp__layer_io *io)
{
    int dev = io->device.ordinal;
    if (io->y == io->x) return PDP_OK;
    return pdp_cudak_memcpy(dev, io->y, dev, io->x,
                            (size_t)(io->batch * l->in_count) * sizeof(float));
}

static pdp_status pdp__flatten_cuda_backward(const pdp__layer *l, const pdp__layer_io *io)
{
    int dev = io->device.ordinal;
    if (!io->dx || io->dx == io->dy) return PDP_OK;
    return pdp_cudak_memcpy(dev, io->dx, dev, io->dy,
                            (size_t)(io->batch * l->in_count) * sizeof(float));
}
#endif
/* ---- end src/layers.c ---- */

/* ---- begin src/layers_conv.c ---- */
/* layers_conv: the image layers, Conv2d and MaxPool2d, kind by kind as in
   layers.c (setup, init, CPU forward and backward, CUDA entries), listed in
   layers_table.c. Uses layers.c's helpers (sums, batch parts, Kaiming init).

   Conventions (PyTorch's):
   - Conv2d: samples (C, H, W), W [O, C, k, k], b [O], square kernel, zero
     padding, output (O, Ho, Wo) with Ho = (H + 2 pad - k) / stride + 1. Computed
     by im2col + GEMM (Chellapilla et al., "High performance convolutional neural
     networks for document processing", 2006) on cache-sized chunks of samples:
     forward y = W col, backward dW = dy col^T and dcol = W^T dy, then col2im
     (details in "layers: Conv2d").
   - MaxPool2d: square window, no padding, floor output size; the first maximum
     in row-major window order wins ties, NaN wins over numbers (as PyTorch's CPU
     kernel). The winning index is saved as an int32 in the saved floats' memory.
   - A ReLU right after a Conv2d on the CPU is a view (PDP__LAYER_FUSES_RELU): the
     Conv2d applies it (io->fused_relu: forward stores relu(y), backward masks dy
     by y > 0 as it gathers dy), which saves two passes over the largest
     activations and gives the same bits. When a 2x2 stride-2 MaxPool2d follows
     that ReLU (even H and W), the Conv2d applies it too (io->pool_y): forward
     pools two rows of products at a time, each value through the bias and the
     ReLU, into the pool's output and winners (pdp__conv_pool_2x2); backward
     gathers the pool's dy, masked by the pooled value > 0, at each window's
     winner and zeros elsewhere (pdp__conv_unpool_2x2). The full-size output is
     never written, nor read back by the pool, nor its gradient written and read
     (model.c skips the MaxPool2d; same bits).

   Invariants: layers.c's (nothing allocated; dw, db accumulated; dx written, or
   skipped when NULL; fixed reduction order whatever the thread count). */

/* #include "internal.h" (already above) */

/* ---- layers: pooling rows (MaxPool2d, and Conv2d's fused pool) ----
   One output row at a time: y and the winner's index (an int32 in the saved
   floats' memory, an offset into the sample's channel plane) start at the
   window's first element and are updated element by element in PyTorch's order
   (ki, then kj): an element replaces the current one when it is greater or NaN,
   so ties keep the first maximum and a NaN wins. The loops run in blocks of 16,
   8 and 4 columns, the remainder as the last 4 columns once more (an update is
   idempotent): constant trip counts, which gcc -O2 vectorises (its cheap cost
   model skips loops that would need a scalar epilogue) into selects instead of
   the branches a scalar loop gets, which mispredict on the half zeros a ReLU
   leaves. (The conditions are spelled out in each select on purpose: gcc 12
   vectorises that form, not an int flag computed once; 10x here.) */
#define PDP__POOL_BLOCKS(...)                                                                  \
    do {                                                                                       \
        for (; ow + 16 <= n; ow += 16)                                                         \
            for (j = 0; j < 16; j++) __VA_ARGS__                                               \
        for (; ow + 8 <= n; ow += 8)                                                           \
            for (j = 0; j < 8; j++) __VA_ARGS__                                                \
        for (; ow + 4 <= n; ow += 4)                                                           \
            for (j = 0; j < 4; j++) __VA_ARGS__                                                \
        if (ow < n && n >= 4) /* the last 4 again: both bodies are idempotent */              \
            for (ow = n - 4, j = 0; j < 4; j++) __VA_ARGS__                                    \
        else                                                                                   \
            for (; ow < n; ow++)                                                               \
                for (j = 0; j < 1; j++) __VA_ARGS__                                            \
    } while (0)

/* Window element (ki, kj) against the running maximum of n outputs. */
static void pdp__maxpool_update(const float *PDP__RESTRICT src, int32_t st, int64_t n,
                                float *PDP__RESTRICT y, int32_t *PDP__RESTRICT arg, int32_t at)
{
    int64_t ow = 0;
    int j;
    PDP__POOL_BLOCKS({
        int32_t o = (int32_t)ow + j;
        float v = src[o * st], m = y[o];
        y[o] = (v > m || v != v) ? v : m;
        arg[o] = (v > m || v != v) ? at + o * st : arg[o];
    });
}

/* The common 2 x 2 window with stride 2: the two elements of each input row,
   then the two rows. Same result as the element-by-element order: the second
   row's winner replaces the first's only when greater or NaN. The window of
   output o is (a, b) over (c, d); at is row 0's offset, w the row stride. */
#define PDP__POOL_2X2_WINDOW(a, b, c, d)                                                       \
    do {                                                                                       \
        float m0 = (b > a || b != b) ? b : a, m1 = (d > c || d != d) ? d : c;                  \
        int32_t i0 = (b > a || b != b) ? at + 2 * o + 1 : at + 2 * o;                          \
        int32_t i1 = (d > c || d != d) ? at + w + 2 * o + 1 : at + w + 2 * o;                  \
        int t = (m1 > m0 || m1 != m1);                                                         \
        y[o] = t ? m1 : m0;                                                                    \
        arg[o] = t ? i1 : i0;                                                                  \
    } while (0)

static void pdp__maxpool_2x2(const float *PDP__RESTRICT r0, const float *PDP__RESTRICT r1,
                             int64_t n, float *PDP__RESTRICT y, int32_t *PDP__RESTRICT arg,
                             int32_t at, int32_t w)
{
    int64_t ow = 0;
    int j;
    PDP__POOL_BLOCKS({
        int32_t o = (int32_t)ow + j;
        float a = r0[2 * o], b = r0[2 * o + 1], c = r1[2 * o], d = r1[2 * o + 1];
        PDP__POOL_2X2_WINDOW(a, b, c, d);
    });
}

/* Conv2d's fused pool: the windows of two rows of products, each value through the
   bias and the ReLU first; the bits of pdp__maxpool_2x2 on the stored rows. */
static void pdp__conv_pool_2x2(const float *PDP__RESTRICT r0, const float *PDP__RESTRICT r1,
                               float bo, int64_t n, float *PDP__RESTRICT y,
                               int32_t *PDP__RESTRICT arg, int32_t at, int32_t w)
{
    int64_t ow = 0;
    int j;
    PDP__POOL_BLOCKS({
        int32_t o = (int32_t)ow + j;
        float a = pdp__relu(r0[2 * o] + bo), b = pdp__relu(r0[2 * o + 1] + bo);
        float c = pdp__relu(r1[2 * o] + bo), d = pdp__relu(r1[2 * o + 1] + bo);
        PDP__POOL_2X2_WINDOW(a, b, c, d);
    });
}

/* The common 2 x 2 window with stride 2 tiling the plane exactly: each window's
   four dx written at once, the output's gradient g at its winner and zeros elsewhere
   (no memset, no scatter; in PDP__POOL_BLOCKS, whose selects gcc vectorises); with
   keep false, zeros only. */
#define PDP__UNPOOL_2X2_WINDOW(g, keep)                                                        \
    do {                                                                                       \
        int32_t a = (keep) ? arg[o] - at - 2 * o : -1;                                         \
        d0[2 * o] = a == 0 ? g : 0.0f;                                                         \
        d0[2 * o + 1] = a == 1 ? g : 0.0f;                                                     \
        d1[2 * o] = a == w ? g : 0.0f;                                                         \
        d1[2 * o + 1] = a == w + 1 ? g : 0.0f;                                                 \
    } while (0)

static void pdp__maxpool_2x2_backward(const float *PDP__RESTRICT dy,
                                      const int32_t *PDP__RESTRICT arg, int64_t n, int32_t at,
                                      int32_t w, float *PDP__RESTRICT d0, float *PDP__RESTRICT d1)
{
    int64_t ow = 0;
    int j;
    PDP__POOL_BLOCKS({
        int32_t o = (int32_t)ow + j;
        float g = dy[o];
        PDP__UNPOOL_2X2_WINDOW(g, 1);
    });
}

/* Conv2d's fused pool, backward: the pool's dy through the ReLU's backward (the
   ReLU's output at the winner is the pooled value yp), then to the winner. */
static void pdp__conv_unpool_2x2(const float *PDP__RESTRICT dy, const float *PDP__RESTRICT yp,
                                 const int32_t *PDP__RESTRICT arg, int64_t n, int32_t at,
                                 int32_t w, float *PDP__RESTRICT d0, float *PDP__RESTRICT d1)
{
    int64_t ow = 0;
    int j;
    PDP__POOL_BLOCKS({
        int32_t o = (int32_t)ow + j;
        float g = dy[o], yj = yp[o];
        PDP__UNPOOL_2X2_WINDOW(g, !(yj <= 0.0f)); /* pdp__relu_grad's test, as a select
                                                      gcc -O2 vectorises */
    });
}

/* ---- layers: Conv2d ----
   Two paths, both cutting the batch into chunks of `per_chunk` samples, a number
   that depends on the layer's geometry only (so do the results). The intra-op
   threads take whole chunks, each thread reusing one scratch region; each chunk
   leaves its shares of dW and db apart, and backward adds them up in chunk order
   after all chunks are done.

   Implicit GEMM (stride 1, padding <= k - 1; the common case). The n samples of a
   chunk are laid side by side in one zero-padded image, rows of
   Wt = n (W + pad) + pad floats (sample j's columns start at pad + j (W + pad): one
   band of `pad` zeros between neighbours is enough for both of them). Output columns
   are counted on that wide grid, Ho x Wt, so that row (c, ki, kj) of the chunk's
   column matrix is ONE contiguous run of the padded image (Ho Wt floats from
   (c, ki, kj)), and the GEMM packs those runs straight from the image through a
   row-offset table (pdp__sgemm_rows): the column matrix is never written. Per chunk:
     forward   grid [O, Ho Wt] = W [O, C k k] col;  y = each sample's Wo columns + b
     dW share  = dy_grid [O, Ho Wt] col^T           (dy_grid zero in the other columns)
     dx        = the forward convolution of dy, zero-padded by q = k - 1 - pad (laid
                 out the same way, bands of q), with the flipped, transposed weights
                 W'[c, (o, qi, qj)] = W[o, c, k-1-qi, k-1-qj] (Dumoulin and Visin, "A
                 guide to convolution arithmetic for deep learning", 2016, section 4):
                 no col2im.
   For a "same" convolution (q == pad) the padded dy's interior is dy on the grid,
   so the dW share reads it in place. When it makes fewer padded GEMM tiles (O small
   next to C k k), the share is computed transposed, share^T = col dy^T, with the
   column matrix as a gathered A (pdp__sgemm_arows) and summed back transposed. With
   few weights (conv 1 -> 16, k 5: 400) it is O C k k dot products over the grid
   (pdp__sgemm_dots): nothing packed, where packing cost more than the products.
   The grid's columns over the bands compute values nobody reads: pad / (W + pad) more
   GEMM work (12% for a 5x5 "same" convolution on 14x14) for no copies at all.

   im2col (any other stride or padding, and PDP_CBLAS builds): the column matrix
   [C k k, n] of a chunk is materialised with exact Wo columns (Chellapilla et al.,
   "High performance convolutional neural networks for document processing",
   2006): forward y = W col; backward dW = dy col^T and dcol = W^T dy, then col2im.
   Chunks of about PDP__CONV_CHUNK_FLOATS column floats keep a chunk in L2.

   bf16 (io->bf16, pdp_model_desc.precision): the products' inputs are rounded to bf16
   and summed in fp32. im2col: its GEMMs are pdp_gemm_bf16. Implicit, on AVX512-BF16 or
   AMX (PDP__CONV_BF16_PATH: pdp_bf16_best_path(); job->packed16): forward, dx and the
   dW share are pdp__gemm_bf16_rows_h / _arows_h (gemm_bf16.c) through the offset
   tables (band columns included: no _runs variant), on the padded image and padded dy
   first converted to bf16 words in place (pdp__gemm_bf16_convert: each value once,
   not once per kernel tap; the padded dy after the dW share, which reads it as floats
   in a "same" convolution); the packing rounds dy for the dW share and W, W'; only the dW
   dot products (dw_dots, conv 1 -> 16) stay fp32 kernels, on the padded image and the
   grid's dy rounded in place (db summed from dy before). On the emulated path the fp32
   kernels multiply bf16-rounded inputs exactly and sum in fp32 (pdp_gemm_bf16's
   emulation, in the fp32 kernels' order): the padded image, the padded dy and the
   grid's dy are rounded in place after they are loaded, W' when it is built, and W for
   forward into the workspace's fixed region (free in forward). Either way the bits
   depend on the geometry and the path, not on the thread count. */

#ifndef PDP__CONV_CHUNK_FLOATS
#  define PDP__CONV_CHUNK_FLOATS 65536
#endif
/* Samples per chunk on the implicit path: wide GEMMs and few dW shares, and still
   8 chunks for each of two threads at batch 128. */
#ifndef PDP__CONV_IMPLICIT_CHUNK
#  define PDP__CONV_IMPLICIT_CHUNK 8
#endif

/* Implicit path in bf16: the pdp_bf16_path of the products (test_bf16 defines it to run
   the emulated path on a CPU with a faster one). */
#ifndef PDP__CONV_BF16_PATH
#  define PDP__CONV_BF16_PATH() pdp_bf16_best_path()
#endif

/* Implicit path: products of at least this depth (C k k forward, O k k for dx)
   skip the band columns (pdp__sgemm_runs); shallower ones (conv 1 -> 16, k 5: 25)
   cost less computing the bands than setting up the runs' masked loads. */
#ifndef PDP__CONV_RUNS_MIN_K
#  define PDP__CONV_RUNS_MIN_K 128
#endif

typedef struct pdp__conv_geom {
    int64_t C, H, W, O, k, stride, pad, Ho, Wo;
    int64_t ckk;            /* rows of the column matrix */
    int implicit;           /* the implicit-GEMM path */
    int64_t Hp, q, Hq;      /* implicit: padded heights of x (by pad) and of dy (by q) */
    int64_t cols;           /* im2col: output columns per sample, Ho Wo */
    int64_t fixed;          /* workspace floats before the shares: W' (implicit) */
    int64_t share;          /* floats of one chunk's dW and db shares */
    int64_t per_chunk;      /* samples per chunk */
    int dw_t;               /* implicit: the dW share is computed and kept transposed,
                               [C k k, O] (fewer padded GEMM tiles, A read in place) */
    int dw_dots;            /* implicit: few weights (conv 1 -> 16, k 5), the dW share as
                               O C k k dot products (pdp__sgemm_dots, nothing packed) */
} pdp__conv_geom;

/* Workspace regions start on 64-byte boundaries (the offset tables are int64). */
static int64_t pdp__conv_round16(int64_t floats) { return (floats + 15) / 16 * 16; }

static pdp__conv_geom pdp__conv_geom_of(const pdp__layer *l)
{
    pdp__conv_geom g;
    g.C = l->in_shape[0];
    g.H = l->in_shape[1];
    g.W = l->in_shape[2];
    g.O = l->out_features;
    g.k = l->kernel;
    g.stride = l->stride;
    g.pad = l->padding;
    g.Ho = l->out_shape[1];
    g.Wo = l->out_shape[2];
    g.ckk = g.C * g.k * g.k;
#if defined(PDP_CBLAS)
    g.implicit = 0;
#else
    g.implicit = g.stride == 1 && g.pad <= g.k - 1;
#endif
    g.Hp = g.H + 2 * g.pad;
    g.q = g.k - 1 - g.pad;
    g.Hq = g.Ho + 2 * g.q;
    g.cols = g.Ho * g.Wo;
    g.share = pdp__conv_round16(g.O * g.ckk + g.O);
    g.dw_dots = g.implicit && pdp__sgemm_dots_fits(g.O, g.ckk);
    g.dw_t = g.implicit && !g.dw_dots && pdp__gemm_tiles(g.ckk, g.O) < pdp__gemm_tiles(g.O, g.ckk);
    if (g.implicit) {
        g.fixed = pdp__conv_round16(g.C * g.O * g.k * g.k);
        g.per_chunk = PDP__CONV_IMPLICIT_CHUNK;
    } else {
        g.fixed = 0;
        g.per_chunk = PDP__MAX(1, PDP__CONV_CHUNK_FLOATS / (g.ckk * g.cols));
    }
    return g;
}

/* Implicit path, a chunk of n samples: row widths of the padded image and padded dy. */
static int64_t pdp__conv_wt(const pdp__conv_geom *g, int64_t n) { return n * (g->W + g->pad) + g->pad; }
static int64_t pdp__conv_wqt(const pdp__conv_geom *g, int64_t n) { return n * (g->Wo + g->q) + g->q; }

/* Floats of one part's scratch for chunks of at most n samples. Implicit: the two
   offset tables (int64), the padded image and padded dy (the last run of each starts
   at (C - 1, k - 1, k - 1) and ends k - 1 floats past it: + k), and the grid that
   holds the output, dy, then dx. im2col: the column matrix and O rows as long. */
static int64_t pdp__conv_scratch(const pdp__conv_geom *g, int64_t n)
{
    int64_t okk = g->O * g->k * g->k;
    if (!g->implicit) return pdp__conv_round16(n * (g->ckk + g->O) * g->cols);
    return pdp__conv_round16(
        2 * (g->ckk + okk) + g->C * g->Hp * pdp__conv_wt(g, n) + g->k +
        g->O * g->Hq * pdp__conv_wqt(g, n) + g->k +
        PDP__MAX(g->O * g->Ho * pdp__conv_wt(g, n), g->C * g->H * pdp__conv_wqt(g, n)));
}

/* Per sample: W' (once is enough; simpler per sample), one share, and twice a
   one-sample scratch. Enough: chunks <= batch, and scratch(n) <= n scratch(1) (each
   term is affine with a non-negative constant, and the rounding keeps it), so the parts' scratch for chunks of
   cap samples is at most chunks cap scratch(1) <= (batch + cap - 1) scratch(1). */
static int64_t pdp__conv_work_per_sample(const pdp__layer *l)
{
    pdp__conv_geom g = pdp__conv_geom_of(l);
    return g.fixed + g.share + 2 * pdp__conv_scratch(&g, 1);
}


/* Output columns [*lo, *hi) whose input column ow * stride - pad + kj is inside
   [0, W). */
static void pdp__conv_valid(int64_t W, int64_t Wo, int64_t stride, int64_t pad, int64_t kj,
                            int64_t *lo, int64_t *hi)
{
    int64_t off = pad - kj; /* iw = ow * stride - off */
    *lo = off > 0 ? (off + stride - 1) / stride : 0;
    *hi = (W - 1 + off) >= 0 ? (W - 1 + off) / stride + 1 : 0;
    if (*hi > Wo) *hi = Wo;
    if (*lo > *hi) *lo = *hi;
}

/* One sample's columns into col (row stride ld): row (c, ki, kj), column
   oh * Wo + ow holds x[c, oh s - pad + ki, ow s - pad + kj], zero outside the
   input. */
static void pdp__im2col(const pdp__conv_geom *g, const float *PDP__RESTRICT x,
                        float *PDP__RESTRICT col, int64_t ld)
{
    int64_t c, ki, kj, oh, ow, ih;
    for (c = 0; c < g->C; c++)
        for (ki = 0; ki < g->k; ki++)
            for (kj = 0; kj < g->k; kj++) {
                float *dst = col + ((c * g->k + ki) * g->k + kj) * ld;
                int64_t lo, hi;
                pdp__conv_valid(g->W, g->Wo, g->stride, g->pad, kj, &lo, &hi);
                for (oh = 0; oh < g->Ho; oh++, dst += g->Wo) {
                    int64_t row;
                    ih = oh * g->stride - g->pad + ki;
                    if (ih < 0 || ih >= g->H) {
                        memset(dst, 0, (size_t)g->Wo * sizeof(float));
                        continue;
                    }
                    row = (c * g->H + ih) * g->W + kj - g->pad; /* + ow * stride: in range */
                    for (ow = 0; ow < lo; ow++) dst[ow] = 0.0f;
                    for (ow = lo; ow < hi; ow++) dst[ow] = x[row + ow * g->stride];
                    for (ow = hi; ow < g->Wo; ow++) dst[ow] = 0.0f;
                }
            }
}

/* dx of one sample = the sum of its columns' entries over the positions they were
   copied from, in row order (a fixed summation order). */
static void pdp__col2im(const pdp__conv_geom *g, const float *PDP__RESTRICT col, int64_t ld,
                        float *PDP__RESTRICT dx)
{
    int64_t c, ki, kj, oh, ow, ih;
    memset(dx, 0, (size_t)(g->C * g->H * g->W) * sizeof(float));
    for (c = 0; c < g->C; c++)
        for (ki = 0; ki < g->k; ki++)
            for (kj = 0; kj < g->k; kj++) {
                const float *src = col + ((c * g->k + ki) * g->k + kj) * ld;
                int64_t lo, hi;
                pdp__conv_valid(g->W, g->Wo, g->stride, g->pad, kj, &lo, &hi);
                for (oh = 0; oh < g->Ho; oh++, src += g->Wo) {
                    int64_t row;
                    ih = oh * g->stride - g->pad + ki;
                    if (ih < 0 || ih >= g->H) continue;
                    row = (c * g->H + ih) * g->W + kj - g->pad;
                    for (ow = lo; ow < hi; ow++) dx[row + ow * g->stride] += src[ow];
                }
            }
}

/* planes x rows x n floats from src (plane stride sp, row stride sr) into dst
   (plane stride dp, row stride dr). */
static void pdp__conv_copy2d(const float *src, int64_t sp, int64_t sr, float *dst, int64_t dp,
                             int64_t dr, int64_t planes, int64_t rows, int64_t n)
{
    int64_t p, r;
    for (p = 0; p < planes; p++)
        for (r = 0; r < rows; r++)
            memcpy(dst + p * dp + r * dr, src + p * sp + r * sr, (size_t)n * sizeof(float));
}

/* `body` for j in [0, n) of a short row (an image row: 28, 14 or 7 floats) in
   blocks of 16, 8 and 4, the remainder as the last 4 once more: constant trip
   counts, which gcc -O2 vectorises where PDP__FOR_BLOCKED's scalar tail would
   carry most of such a row. The body must be idempotent (write what it reads
   elsewhere). */
#define PDP__CONV_ROW(j, n, ...)                                                               \
    do {                                                                                       \
        int64_t pdp__o_ = 0, pdp__n_ = (n);                                                    \
        int pdp__k_;                                                                           \
        for (; pdp__o_ + 16 <= pdp__n_; pdp__o_ += 16)                                         \
            for (pdp__k_ = 0; pdp__k_ < 16; pdp__k_++) {                                       \
                int64_t j = pdp__o_ + pdp__k_;                                                 \
                __VA_ARGS__                                                                    \
            }                                                                                  \
        for (; pdp__o_ + 8 <= pdp__n_; pdp__o_ += 8)                                           \
            for (pdp__k_ = 0; pdp__k_ < 8; pdp__k_++) {                                        \
                int64_t j = pdp__o_ + pdp__k_;                                                 \
                __VA_ARGS__                                                                    \
            }                                                                                  \
        for (; pdp__o_ + 4 <= pdp__n_; pdp__o_ += 4)                                           \
            for (pdp__k_ = 0; pdp__k_ < 4; pdp__k_++) {                                        \
                int64_t j = pdp__o_ + pdp__k_;                                                 \
                __VA_ARGS__                                                                    \
            }                                                                                  \
        if (pdp__o_ < pdp__n_ && pdp__n_ >= 4)                                                 \
            pdp__o_ = pdp__n_ - 4;                                                             \
        if (pdp__o_ < pdp__n_ && pdp__n_ >= 4)                                                 \
            for (pdp__k_ = 0; pdp__k_ < 4; pdp__k_++) {                                        \
                int64_t j = pdp__o_ + pdp__k_;                                                 \
                __VA_ARGS__                                                                    \
            }                                                                                  \
        else                                                                                   \
            for (; pdp__o_ < pdp__n_; pdp__o_++) {                                             \
                int64_t j = pdp__o_;                                                           \
                __VA_ARGS__                                                                    \
            }                                                                                  \
    } while (0)

/* d = dy masked by y > 0 (the fused ReLU's backward), one row. */
static void pdp__conv_relu_grad_row(const float *PDP__RESTRICT g, const float *PDP__RESTRICT y,
                                    float *PDP__RESTRICT d, int64_t n)
{
    PDP__CONV_ROW(j, n, {
        float gj = g[j], yj = y[j]; /* both loaded first: gcc -O2 then vectorises */
        d[j] = pdp__relu_grad(gj, yj);
    });
}

/* One sample's dy, [O, Ho, Wo], into dst (plane stride dp, row stride dr); with a
   fused ReLU, masked by the layer's output y (same layout as dy): the ReLU's
   backward, done on the way. With a fused pool, dy is the pool's [O, Ho/2, Wo/2],
   masked by the pooled y > 0 and written at each window's winner, zeros elsewhere:
   the pool's backward and the ReLU's (pdp__conv_unpool_2x2). */
static void pdp__conv_copy_dy(const pdp__layer_io *io, int64_t s, const pdp__layer *l,
                              float *dst, int64_t dp, int64_t dr)
{
    int64_t O = l->out_shape[0], Ho = l->out_shape[1], Wo = l->out_shape[2], p, r;
    if (io->pool_y) {
        int64_t Hp = Ho / 2, Wp = Wo / 2;
        for (p = 0; p < O; p++)
            for (r = 0; r < Hp; r++) {
                int64_t at = ((s * O + p) * Hp + r) * Wp;
                float *d0 = dst + p * dp + 2 * r * dr;
                pdp__conv_unpool_2x2(io->dy + at, io->pool_y + at, io->pool_arg + at, Wp,
                                     (int32_t)(2 * r * Wo), (int32_t)Wo, d0, d0 + dr);
            }
        return;
    }
    if (!io->fused_relu) {
        pdp__conv_copy2d(io->dy + s * l->out_count, Ho * Wo, Wo, dst, dp, dr, O, Ho, Wo);
        return;
    }
    for (p = 0; p < O; p++)
        for (r = 0; r < Ho; r++) {
            const float *PDP__RESTRICT g = io->dy + s * l->out_count + (p * Ho + r) * Wo;
            const float *PDP__RESTRICT y = io->y + s * l->out_count + (p * Ho + r) * Wo;
            float *PDP__RESTRICT d = dst + p * dp + r * dr;
            pdp__conv_relu_grad_row(g, y, d, Wo);
        }
}

/* Row n of y = src + bias, through the fused ReLU when there is one. */
static void pdp__conv_store_row(const float *PDP__RESTRICT src, float bo, bool relu,
                                float *PDP__RESTRICT dst, int64_t n)
{
    if (relu)
        PDP__CONV_ROW(j, n, dst[j] = pdp__relu(src[j] + bo););
    else
        PDP__CONV_ROW(j, n, dst[j] = src[j] + bo;);
}

/* Channel plane o of sample s of y from the products (row oh at src + oh ldr) plus
   the bias, through the fused ReLU; with a fused pool, two rows at a time straight
   into the pool's output and winners (pdp__conv_pool_2x2). */
static void pdp__conv_store_plane(const pdp__layer_io *io, const pdp__layer *l, int64_t s,
                                  int64_t o, const float *src, int64_t ldr)
{
    int64_t O = l->out_shape[0], Ho = l->out_shape[1], Wo = l->out_shape[2], oh;
    float bo = io->b ? io->b[o] : 0.0f;
    if (!io->pool_y) {
        for (oh = 0; oh < Ho; oh++)
            pdp__conv_store_row(src + oh * ldr, bo, io->fused_relu,
                                io->y + ((s * O + o) * Ho + oh) * Wo, Wo);
        return;
    }
    for (oh = 0; oh < Ho; oh += 2) { /* Ho and Wo are even */
        int64_t at = ((s * O + o) * (Ho / 2) + oh / 2) * (Wo / 2);
        pdp__conv_pool_2x2(src + oh * ldr, src + (oh + 1) * ldr, bo, Wo / 2, io->pool_y + at,
                           io->pool_arg + at, (int32_t)(oh * Wo), (int32_t)Wo);
    }
}

typedef struct pdp__conv_job {
    const pdp__layer *l;
    const pdp__layer_io *io;
    pdp__conv_geom g;
    int64_t chunks;
    int64_t scratch;  /* floats of each part's scratch: pdp__conv_scratch(chunk size) */
    int parts;
    const float *wt;  /* implicit backward: W' [C, O k k] */
    const float *w;   /* implicit forward: W as the products see it (io->w, or in bf16 on
                         the emulated path its rounding in the fixed region) */
    pdp_bf16_path path16; /* bf16: PDP__CONV_BF16_PATH() */
    int packed16;     /* implicit bf16 on AVX512-BF16 or AMX: the products are
                         pdp__gemm_bf16_rows_h / _arows_h on the image and dy converted */
} pdp__conv_job;

/* bf16: p[0, n) rounded in place (pdp__bf16_round_u32 on the bits, in
   PDP__FOR_BLOCKED's blocks that gcc -O2 vectorises). */
static void pdp__conv_bf16(float *p, int64_t n)
{
    PDP__FOR_BLOCKED(i, n, {
        uint32_t u;
        memcpy(&u, p + i, sizeof u);
        u = pdp__bf16_round_u32(u);
        memcpy(p + i, &u, sizeof u);
    });
}

/* Chunk c: its samples [s0, s1), where its dW and db shares go ([O, C k k] then
   [O]), and the scratch of the part that runs it. Workspace: the fixed part, the
   chunks' shares, then one scratch region per part, reused by all of the part's
   chunks so that it stays in cache. Implicit: the padded input, the padded dy and
   the grid; im2col: the column matrix [C k k, n] and O rows of n columns. */
typedef struct pdp__conv_chunk {
    int64_t s0, s1, n;   /* n: im2col columns (samples x Ho Wo) */
    float *share;
    int64_t wt, wqt;     /* implicit: row widths of the padded image and padded dy */
    int64_t *offx, *offdy;
    float *xp, *dyp, *grid;
    float *col, *out;    /* im2col */
} pdp__conv_chunk;

static pdp__conv_chunk pdp__conv_chunk_of(const pdp__conv_job *job, int64_t c, int part)
{
    const pdp__conv_geom *g = &job->g;
    float *base = job->io->work + g->fixed + job->chunks * g->share + part * job->scratch;
    int64_t cap = PDP__MIN(g->per_chunk, job->io->batch), okk = g->O * g->k * g->k;
    pdp__conv_chunk k;
    k.s0 = c * g->per_chunk;
    k.s1 = PDP__MIN(job->io->batch, k.s0 + g->per_chunk);
    k.n = (k.s1 - k.s0) * g->cols;
    k.share = job->io->work + g->fixed + c * g->share;
    k.wt = pdp__conv_wt(g, k.s1 - k.s0);
    k.wqt = pdp__conv_wqt(g, k.s1 - k.s0);
    k.offx = (int64_t *)(void *)base;
    k.offdy = k.offx + g->ckk;
    k.xp = base + 2 * (g->ckk + okk);
    k.dyp = k.xp + g->C * g->Hp * pdp__conv_wt(g, cap) + g->k;
    k.grid = k.dyp + g->O * g->Hq * pdp__conv_wqt(g, cap) + g->k;
    k.col = base;
    k.out = base + g->ckk * k.n;
    return k;
}

/* ---- layers: Conv2d, implicit GEMM ---- */

/* W' for backward, run by the caller before the parts start. */
static void pdp__conv_implicit_setup(pdp__conv_job *job)
{
    const pdp__conv_geom *g = &job->g;
    float *wt = job->io->work;
    int64_t c, o, ki, kj, okk = g->O * g->k * g->k, k1 = g->k - 1;
    for (c = 0; c < g->C; c++)
        for (o = 0; o < g->O; o++)
            for (ki = 0; ki < g->k; ki++)
                for (kj = 0; kj < g->k; kj++)
                    wt[c * okk + (o * g->k + ki) * g->k + kj] =
                        job->io->w[((o * g->C + c) * g->k + k1 - ki) * g->k + k1 - kj];
    if (job->io->bf16 && !job->packed16) pdp__conv_bf16(wt, g->C * okk);
    job->wt = wt;
}

/* The chunk's samples into its zeroed padded image (and their dy into the padded
   dy when dy is not NULL), and the offset tables of both. In bf16 the image is
   rounded for the fp32 kernels: every product on the emulated path, the dW dot
   products (dw_dots) in backward on the packed path. */
static void pdp__conv_implicit_load(const pdp__conv_job *job, const pdp__conv_chunk *k,
                                    const float *dy, bool backward)
{
    const pdp__conv_geom *g = &job->g;
    int64_t c, o, ki, kj, s, ns = k->s1 - k->s0;
    memset(k->xp, 0, (size_t)(g->C * g->Hp * k->wt + g->k) * sizeof(float));
    for (s = 0; s < ns; s++)
        pdp__conv_copy2d(job->io->x + (k->s0 + s) * job->l->in_count, g->H * g->W, g->W,
                         k->xp + g->pad * k->wt + g->pad + s * (g->W + g->pad), g->Hp * k->wt,
                         k->wt, g->C, g->H, g->W);
    if (job->io->bf16 && (!job->packed16 || (backward && g->dw_dots)))
        pdp__conv_bf16(k->xp, g->C * g->Hp * k->wt + g->k);
    for (c = 0; c < g->C; c++)
        for (ki = 0; ki < g->k; ki++)
            for (kj = 0; kj < g->k; kj++)
                k->offx[(c * g->k + ki) * g->k + kj] = (c * g->Hp + ki) * k->wt + kj;
    if (!dy) return;
    memset(k->dyp, 0, (size_t)(g->O * g->Hq * k->wqt + g->k) * sizeof(float));
    for (s = 0; s < ns; s++)
        pdp__conv_copy_dy(job->io, k->s0 + s, job->l,
                          k->dyp + g->q * k->wqt + g->q + s * (g->Wo + g->q), g->Hq * k->wqt,
                          k->wqt);
    for (o = 0; o < g->O; o++)
        for (ki = 0; ki < g->k; ki++)
            for (kj = 0; kj < g->k; kj++)
                k->offdy[(o * g->k + ki) * g->k + kj] = (o * g->Hq + ki) * k->wqt + kj;
}

static void pdp__conv_implicit_forward_part(void *arg, int i, int parts)
{
    const pdp__conv_job *job = (const pdp__conv_job *)arg;
    const pdp__conv_geom *g = &job->g;
    const pdp__layer_io *io = job->io;
    int64_t c, c0 = job->chunks * i / parts, c1 = job->chunks * (i + 1) / parts, s, o;
    for (c = c0; c < c1; c++) {
        pdp__conv_chunk k = pdp__conv_chunk_of(job, c, i);
        int64_t cols = g->Ho * k.wt;
        int64_t ldo = cols, ldr = k.wt, lds = g->W + g->pad;
        pdp__conv_implicit_load(job, &k, NULL, false);
        if (job->packed16) { /* the image in bf16 words, in place; the bands computed too */
            uint16_t *xh = (uint16_t *)(void *)k.xp;
            pdp__gemm_bf16_convert(job->path16, k.xp, xh, g->C * g->Hp * k.wt + g->k);
            pdp__gemm_bf16_rows_h(job->path16, PDP_NO_TRANS, PDP_NO_TRANS, g->O, cols, g->ckk,
                                  1.0f, job->w, g->ckk, xh, k.offx, 0.0f, k.grid, cols);
        } else
#if defined(PDP__GEMM_RUNS)
        if (g->ckk >= PDP__CONV_RUNS_MIN_K) {
            /* only the samples' columns, not the bands: grid [O, Ho, ns, Wo] */
            int64_t ns = k.s1 - k.s0;
            ldo = g->Ho * ns * g->Wo;
            ldr = ns * g->Wo;
            lds = g->Wo;
            pdp__sgemm_runs(g->O, g->ckk, job->w, g->ckk, k.xp, k.offx, g->Ho, ns, g->Wo, k.wt,
                            g->W + g->pad, k.grid, ldo);
        } else
#endif
        pdp__sgemm_rows(PDP_NO_TRANS, PDP_NO_TRANS, g->O, cols, g->ckk, 1.0f, job->w, g->ckk, k.xp,
                        k.offx, 0.0f, k.grid, cols);
        for (s = k.s0; s < k.s1; s++)
            for (o = 0; o < g->O; o++)
                pdp__conv_store_plane(io, job->l, s, o, k.grid + o * ldo + (s - k.s0) * lds, ldr);
    }
}

static void pdp__conv_implicit_backward_part(void *arg, int i, int parts)
{
    const pdp__conv_job *job = (const pdp__conv_job *)arg;
    const pdp__conv_geom *g = &job->g;
    const pdp__layer_io *io = job->io;
    int64_t c, c0 = job->chunks * i / parts, c1 = job->chunks * (i + 1) / parts, s, o;
    int64_t okk = g->O * g->k * g->k;
    for (c = c0; c < c1; c++) {
        pdp__conv_chunk k = pdp__conv_chunk_of(job, c, i);
        int64_t cols = g->Ho * k.wt, ldg = cols;
        float *grid = k.grid;
        pdp__conv_implicit_load(job, &k, io->dx ? io->dy : NULL, true);
        if (io->dx && g->q == g->pad) {
            /* a "same" convolution: the padded dy has the grid's row width (wqt ==
               wt) and zeros in its bands, so its interior IS dy on the grid */
            grid = k.dyp + g->q * k.wqt + g->q;
            ldg = g->Hq * k.wqt;
        } else { /* dy on the output grid, zero in the columns nobody reads */
            memset(k.grid, 0, (size_t)(g->O * cols) * sizeof(float));
            for (s = k.s0; s < k.s1; s++)
                pdp__conv_copy_dy(io, s, job->l, k.grid + (s - k.s0) * (g->W + g->pad), cols,
                                  k.wt);
        }
        for (o = 0; o < g->O; o++)
            k.share[g->O * g->ckk + o] = (float)pdp__layers_sum(grid + o * ldg, cols);
        if (io->bf16 && !job->packed16) { /* dy rounded after db took it, for the products */
            if (io->dx) pdp__conv_bf16(k.dyp, g->O * g->Hq * k.wqt + g->k);
            if (grid == k.grid) pdp__conv_bf16(k.grid, g->O * cols);
        } else if (io->bf16 && g->dw_dots) { /* packed path: the dots' dy only */
            for (o = 0; o < g->O; o++) pdp__conv_bf16(grid + o * ldg, cols);
        }
        if (g->dw_dots)
            pdp__sgemm_dots(g->O, g->ckk, cols, grid, ldg, k.xp, k.offx, k.share, g->ckk);
        else if (job->packed16) { /* the image in bf16, in place: the column matrix's pairs
                                     are adjacent words */
            uint16_t *xh = (uint16_t *)(void *)k.xp;
            pdp__gemm_bf16_convert(job->path16, k.xp, xh, g->C * g->Hp * k.wt + g->k);
            if (g->dw_t)
                pdp__gemm_bf16_arows_h(job->path16, PDP_TRANS, g->ckk, g->O, cols, 1.0f, xh,
                                       k.offx, grid, ldg, 0.0f, k.share, g->O);
            else
                pdp__gemm_bf16_rows_h(job->path16, PDP_NO_TRANS, PDP_TRANS, g->O, g->ckk, cols,
                                      1.0f, grid, ldg, xh, k.offx, 0.0f, k.share, g->ckk);
        } else if (g->dw_t) /* share^T [C k k, O] = col dy^T: same products, same order */
            pdp__sgemm_arows(PDP_TRANS, g->ckk, g->O, cols, 1.0f, k.xp, k.offx, grid, ldg, 0.0f,
                             k.share, g->O);
        else
            pdp__sgemm_rows(PDP_NO_TRANS, PDP_TRANS, g->O, g->ckk, cols, 1.0f, grid, ldg, k.xp,
                            k.offx, 0.0f, k.share, g->ckk);
        if (!io->dx) continue;
#if defined(PDP__GEMM_RUNS)
        if (okk >= PDP__CONV_RUNS_MIN_K && !job->packed16) {
            /* only the samples' columns, not the bands: grid [C, H, ns, W] */
            int64_t ns = k.s1 - k.s0;
            pdp__sgemm_runs(g->C, okk, job->wt, okk, k.dyp, k.offdy, g->H, ns, g->W, k.wqt,
                            g->Wo + g->q, k.grid, g->H * ns * g->W);
            for (s = k.s0; s < k.s1; s++)
                pdp__conv_copy2d(k.grid + (s - k.s0) * g->W, g->H * ns * g->W, ns * g->W,
                                 io->dx + s * job->l->in_count, g->H * g->W, g->W, g->C, g->H,
                                 g->W);
            continue;
        }
#endif
        if (job->packed16) { /* the padded dy in bf16, in place (the dW share is done) */
            uint16_t *dyh = (uint16_t *)(void *)k.dyp;
            pdp__gemm_bf16_convert(job->path16, k.dyp, dyh, g->O * g->Hq * k.wqt + g->k);
            pdp__gemm_bf16_rows_h(job->path16, PDP_NO_TRANS, PDP_NO_TRANS, g->C, g->H * k.wqt,
                                  okk, 1.0f, job->wt, okk, dyh, k.offdy, 0.0f, k.grid,
                                  g->H * k.wqt);
        } else
            pdp__sgemm_rows(PDP_NO_TRANS, PDP_NO_TRANS, g->C, g->H * k.wqt, okk, 1.0f, job->wt,
                            okk, k.dyp, k.offdy, 0.0f, k.grid, g->H * k.wqt);
        for (s = k.s0; s < k.s1; s++)
            pdp__conv_copy2d(k.grid + (s - k.s0) * (g->Wo + g->q), g->H * k.wqt, k.wqt,
                             io->dx + s * job->l->in_count, g->H * g->W, g->W, g->C, g->H, g->W);
    }
}

/* ---- layers: Conv2d, im2col ---- */

/* Forward of the chunks of part i: im2col; out [O, n] = W col; y = out + b. */
static void pdp__conv_forward_part(void *arg, int i, int parts)
{
    const pdp__conv_job *job = (const pdp__conv_job *)arg;
    const pdp__conv_geom *g = &job->g;
    const pdp__layer_io *io = job->io;
    int64_t c, c0 = job->chunks * i / parts, c1 = job->chunks * (i + 1) / parts, s, o;
    for (c = c0; c < c1; c++) {
        pdp__conv_chunk k = pdp__conv_chunk_of(job, c, i);
        for (s = k.s0; s < k.s1; s++)
            pdp__im2col(g, io->x + s * job->l->in_count, k.col + (s - k.s0) * g->cols, k.n);
        (io->bf16 ? pdp_gemm_bf16 : pdp_sgemm)(PDP_NO_TRANS, PDP_NO_TRANS, g->O, k.n, g->ckk, 1.0f,
                                                io->w, g->ckk, k.col, k.n, 0.0f, k.out, k.n);
        for (s = k.s0; s < k.s1; s++)
            for (o = 0; o < g->O; o++)
                pdp__conv_store_plane(io, job->l, s, o, k.out + o * k.n + (s - k.s0) * g->cols,
                                      g->Wo);
    }
}

/* Backward of the chunks of part i: im2col again; dy gathered into out [O, n]; the
   chunk's dW share dy col^T and db share; then dcol = W^T out over col, and col2im
   into dx. */
static void pdp__conv_backward_part(void *arg, int i, int parts)
{
    const pdp__conv_job *job = (const pdp__conv_job *)arg;
    const pdp__conv_geom *g = &job->g;
    const pdp__layer_io *io = job->io;
    int64_t c, c0 = job->chunks * i / parts, c1 = job->chunks * (i + 1) / parts, s, o;
    for (c = c0; c < c1; c++) {
        pdp__conv_chunk k = pdp__conv_chunk_of(job, c, i);
        for (s = k.s0; s < k.s1; s++) {
            pdp__im2col(g, io->x + s * job->l->in_count, k.col + (s - k.s0) * g->cols, k.n);
            pdp__conv_copy_dy(io, s, job->l, k.out + (s - k.s0) * g->cols, k.n, g->Wo);
        }
        (io->bf16 ? pdp_gemm_bf16 : pdp_sgemm)(PDP_NO_TRANS, PDP_TRANS, g->O, g->ckk, k.n, 1.0f,
                                                k.out, k.n, k.col, k.n, 0.0f, k.share, g->ckk);
        for (o = 0; o < g->O; o++)
            k.share[g->O * g->ckk + o] = (float)pdp__layers_sum(k.out + o * k.n, k.n);
        if (!io->dx) continue;
        (io->bf16 ? pdp_gemm_bf16 : pdp_sgemm)(PDP_TRANS, PDP_NO_TRANS, g->ckk, k.n, g->O, 1.0f,
                                                io->w, g->ckk, k.out, k.n, 0.0f, k.col, k.n);
        for (s = k.s0; s < k.s1; s++)
            pdp__col2im(g, k.col + (s - k.s0) * g->cols, k.n, io->dx + s * job->l->in_count);
    }
}

/* ---- layers: Conv2d, driver ---- */

/* Parts: the caller's threads, at most one per chunk (scratch regions are sized
   for as many parts as samples). A single part runs on the caller without taking
   the pool, so its GEMMs can still use the threads. */
static void pdp__conv_job_init(pdp__conv_job *job, const pdp__layer *l, const pdp__layer_io *io,
                               bool backward)
{
    job->l = l;
    job->io = io;
    job->g = pdp__conv_geom_of(l);
    job->chunks = (io->batch + job->g.per_chunk - 1) / job->g.per_chunk;
    job->scratch = pdp__conv_scratch(&job->g, PDP__MIN(job->g.per_chunk, io->batch));
    job->parts = (int)PDP__MIN((int64_t)pdp__threads_for_caller(), job->chunks);
    job->wt = NULL;
    job->w = io->w;
    job->path16 = io->bf16 ? PDP__CONV_BF16_PATH() : PDP_BF16_PATH_EMULATED;
    job->packed16 = job->g.implicit && io->bf16 && job->path16 != PDP_BF16_PATH_EMULATED;
    if (job->g.implicit && backward && io->dx) pdp__conv_implicit_setup(job);
    if (job->g.implicit && !backward && io->bf16 && !job->packed16) { /* W' in backward */
        memcpy(io->work, io->w, (size_t)(job->g.O * job->g.ckk) * sizeof(float));
        pdp__conv_bf16(io->work, job->g.O * job->g.ckk);
        job->w = io->work;
    }
}

static void pdp__conv_forward(const pdp__layer *l, const pdp__layer_io *io)
{
    pdp__conv_job job;
    pdp__conv_job_init(&job, l, io, false);
    pdp__parallel_for(job.parts, job.g.implicit ? pdp__conv_implicit_forward_part
                                                : pdp__conv_forward_part, &job);
}

static void pdp__conv_backward(const pdp__layer *l, const pdp__layer_io *io)
{
    pdp__conv_job job;
    const pdp__conv_geom *g = &job.g;
    int64_t c, o;
    pdp__conv_job_init(&job, l, io, true);
    pdp__parallel_for(job.parts, g->implicit ? pdp__conv_implicit_backward_part
                                             : pdp__conv_backward_part, &job);
    for (c = 0; c < job.chunks; c++) { /* the chunks' shares, in chunk order */
        const float *PDP__RESTRICT share = io->work + g->fixed + c * g->share;
        float *PDP__RESTRICT dw = io->dw;
        if (g->dw_t) {
            int64_t r;
            for (o = 0; o < g->O; o++)
                for (r = 0; r < g->ckk; r++) dw[o * g->ckk + r] += share[r * g->O + o];
        } else {
            PDP__FOR_BLOCKED(j, g->O * g->ckk, dw[j] += share[j];);
        }
        if (io->db)
            for (o = 0; o < g->O; o++) io->db[o] += share[g->O * g->ckk + o];
    }
}

/* ---- layers: Conv2d, setup and CUDA ---- */

static pdp_status pdp__conv_setup(pdp__layer *l, pdp__param_shapes *ps, const char *in)
{
    int64_t k = l->kernel, s = l->stride, pad = l->padding, O = l->out_features;
    int64_t C = l->in_shape[0], H = l->in_shape[1], W = l->in_shape[2];
    int64_t pad2 = 0, Hp = 0, Wp = 0, Ho, Wo, out = 0, ckk = 0, weights = 0;
    double work;
    if (O < 1 || k < 1 || s < 1 || pad < 0)
        return pdp__err(PDP_ERR_INVALID,
                        "out_channels %lld, kernel %lld, stride %lld, padding %lld: need "
                        "out_channels, kernel, stride >= 1 and padding >= 0 (input %s)",
                        (long long)O, (long long)k, (long long)s, (long long)pad, in);
    if (l->in_ndim != 3)
        return pdp__err(PDP_ERR_SHAPE, "needs (C, H, W) samples, got %s", in);
    if (!pdp__mul_ok(2, pad, &pad2) || !pdp__add_ok(H, pad2, &Hp) || !pdp__add_ok(W, pad2, &Wp))
        return pdp__err(PDP_ERR_SHAPE, "padding %lld: the padded input has more than %lld rows "
                        "(input %s)", (long long)pad, (long long)PDP__COUNT_MAX, in);
    if (k > Hp || k > Wp)
        return pdp__err(PDP_ERR_SHAPE,
                        "kernel %lld is larger than the padded input %lldx%lld (input %s, "
                        "padding %lld)",
                        (long long)k, (long long)Hp, (long long)Wp, in, (long long)pad);
    Ho = (Hp - k) / s + 1;
    Wo = (Wp - k) / s + 1;
    /* the output, the weights, and an upper bound of every workspace term below
       (pdp__conv_work_per_sample, pdp__conv_cuda_work: each a sum of products of C k k, O,
       Hp + 2k, Wp + 2k and the weight count) must fit, so none of them can overflow */
    if (!pdp__mul3_ok(O, Ho, Wo, &out) || !pdp__mul3_ok(C, k, k, &ckk) ||
        !pdp__mul_ok(O, ckk, &weights))
        return pdp__err(PDP_ERR_SHAPE, "out_channels %lld, kernel %lld, padding %lld: output "
                        "(%lld, %lld, %lld) or weights (%lld, %lld, %lld, %lld) exceed %lld elements "
                        "(input %s)", (long long)O, (long long)k, (long long)pad, (long long)O,
                        (long long)Ho, (long long)Wo, (long long)O, (long long)C, (long long)k,
                        (long long)k, (long long)PDP__COUNT_MAX, in);
    work = 16.0 * ((double)(ckk + O) * (double)(Hp + 2 * k) * (double)(Wp + 2 * k) +
                   (double)weights + (double)O + (double)k + 64.0);
    if (work > (double)PDP__COUNT_MAX)
        return pdp__err(PDP_ERR_SHAPE, "out_channels %lld, kernel %lld, padding %lld: the "
                        "workspace exceeds %lld floats per sample (input %s)", (long long)O,
                        (long long)k, (long long)pad, (long long)PDP__COUNT_MAX, in);
    l->out_shape[0] = l->out_features;
    l->out_shape[1] = Ho;
    l->out_shape[2] = Wo;
    ps->wshape[0] = l->out_features;
    ps->wshape[1] = C;
    ps->wshape[2] = k;
    ps->wshape[3] = k;
    ps->wndim = 4;
    ps->bshape[0] = l->out_features;
    ps->bndim = 1;
    l->work_per_sample = pdp__conv_work_per_sample(l);
    return PDP_OK;
}

static void pdp__conv_init(const pdp__layer *l, float *w, float *b, pdp_rng *r)
{
    int64_t fan_in = l->in_shape[0] * l->kernel * l->kernel;
    pdp__layers_init_kaiming(w, l->out_features * fan_in, b, l->out_features, fan_in, r);
}

/* Workspace floats per sample of pdp_cuda.cu's conv kernels: they unfold the whole
   sample and keep the output beside it, (C k k + O) Ho Wo (cuda.h). */
static int64_t pdp__conv_cuda_work(const pdp__layer *l)
{
    return (l->in_shape[0] * l->kernel * l->kernel + l->out_features) * l->out_shape[1] *
           l->out_shape[2];
}

#ifdef PDP_CUDA
/* The geometry pdp_cuda.cu's Conv2d and MaxPool2d kernels take. */
static pdp_cudak_conv pdp__conv_cuda_geom(const pdp__layer *l, int64_t batch, int64_t O,
                                          int64_t pad)
{
    pdp_cudak_conv g;
    g.batch = batch;
    g.C = l->in_shape[0];
    g.H = l->in_shape[1];
    g.W = l->in_shape[2];
    g.O = O;
    g.k = l->kernel;
    g.stride = l->stride;
    g.pad = pad;
    g.Ho = l->out_shape[1];
    g.Wo = l->out_shape[2];
    return g;
}

static pdp_status pdp__conv_cuda_forward(const pdp__layer *l, const pdp__layer_io *io)
{
    pdp_cudak_conv g = pdp__conv_cuda_geom(l, io->batch, l->out_features, l->padding);
    return pdp_cudak_conv_fwd(io->device.ordinal, &g, io->x, io->w, io->b, io->y, io->work,
                              io->bf16);
}

static pdp_status pdp__conv_cuda_backward(const pdp__layer *l, const pdp__layer_io *io)
{
    pdp_cudak_conv g = pdp__conv_cuda_geom(l, io->batch, l->out_features, l->padding);
    return pdp_cudak_conv_bwd(io->device.ordinal, &g, io->x, io->w, io->dy, io->dw, io->db,
                              io->dx, io->work, io->bf16);
}
#endif

/* ---- layers: MaxPool2d ---- */

typedef struct pdp__pool_job {
    const pdp__layer *l;
    const pdp__layer_io *io;
} pdp__pool_job;

/* The channel planes of part i: first element of each window, then the rest. */
static void pdp__maxpool_forward_part(void *argp, int i, int parts)
{
    const pdp__pool_job *job = (const pdp__pool_job *)argp;
    const pdp__layer *l = job->l;
    const pdp__layer_io *io = job->io;
    int64_t H = l->in_shape[1], W = l->in_shape[2], Ho = l->out_shape[1], Wo = l->out_shape[2];
    int64_t k = l->kernel, st = l->stride, planes = io->batch * l->in_shape[0];
    int64_t plane, oh, ow, ki, kj;
    for (plane = planes * i / parts; plane < planes * (i + 1) / parts; plane++) {
        const float *x = io->x + plane * H * W;
        for (oh = 0; oh < Ho; oh++) {
            float *y = io->y + (plane * Ho + oh) * Wo;
            int32_t *arg = (int32_t *)(void *)(io->saved + (plane * Ho + oh) * Wo);
            int64_t row = oh * st * W;
            if (k == 2 && st == 2) {
                pdp__maxpool_2x2(x + row, x + row + W, Wo, y, arg, (int32_t)row, (int32_t)W);
                continue;
            }
            for (ow = 0; ow < Wo; ow++) {
                y[ow] = x[row + ow * st];
                arg[ow] = (int32_t)(row + ow * st);
            }
            for (ki = 0; ki < k; ki++)
                for (kj = ki ? 0 : 1; kj < k; kj++)
                    pdp__maxpool_update(x + row + ki * W + kj, (int32_t)st, Wo, y, arg,
                                        (int32_t)(row + ki * W + kj));
        }
    }
}

/* Split by channel plane over the intra-op threads. */
static void pdp__maxpool_forward(const pdp__layer *l, const pdp__layer_io *io)
{
    pdp__pool_job job;
    job.l = l;
    job.io = io;
    pdp__parallel_for(pdp__layers_batch_parts(io->batch), pdp__maxpool_forward_part, &job);
}

/* The channel planes of part i: zero, then scatter each output's gradient to its
   winner (planes are independent, so any split gives the same bits). */
static void pdp__maxpool_backward_part(void *argp, int i, int parts)
{
    const pdp__pool_job *job = (const pdp__pool_job *)argp;
    const pdp__layer *l = job->l;
    const pdp__layer_io *io = job->io;
    int64_t plane = l->in_shape[1] * l->in_shape[2], per = l->out_shape[1] * l->out_shape[2];
    int64_t planes = io->batch * l->in_shape[0], p0 = planes * i / parts;
    int64_t p1 = planes * (i + 1) / parts, p, j;
    int64_t W = l->in_shape[2], Ho = l->out_shape[1], Wo = l->out_shape[2];
    if (l->kernel == 2 && l->stride == 2 && l->in_shape[1] == 2 * Ho && W == 2 * Wo) {
        for (p = p0; p < p1; p++)
            for (j = 0; j < Ho; j++)
                pdp__maxpool_2x2_backward(
                    io->dy + p * per + j * Wo,
                    (const int32_t *)(const void *)(io->saved + p * per + j * Wo), Wo,
                    (int32_t)(2 * j * W), (int32_t)W, io->dx + p * plane + 2 * j * W,
                    io->dx + p * plane + (2 * j + 1) * W);
        return;
    }
    memset(io->dx + p0 * plane, 0, (size_t)((p1 - p0) * plane) * sizeof(float));
    for (p = p0; p < p1; p++) {
        float *dx = io->dx + p * plane;
        const float *dy = io->dy + p * per;
        const int32_t *arg = (const int32_t *)(const void *)(io->saved + p * per);
        for (j = 0; j < per; j++) dx[arg[j]] += dy[j];
    }
}

static void pdp__maxpool_backward(const pdp__layer *l, const pdp__layer_io *io)
{
    pdp__pool_job job;
    if (!io->dx) return;
    job.l = l;
    job.io = io;
    pdp__parallel_for(pdp__layers_batch_parts(io->batch), pdp__maxpool_backward_part, &job);
}

static pdp_status pdp__maxpool_setup(pdp__layer *l, pdp__param_shapes *ps, const char *in)
{
    int64_t k = l->kernel, s = l->stride, C = l->in_shape[0], H = l->in_shape[1];
    int64_t W = l->in_shape[2];
    (void)ps;
    if (k < 1 || s < 1)
        return pdp__err(PDP_ERR_INVALID, "kernel %lld, stride %lld must be >= 1 (input %s)",
                        (long long)k, (long long)s, in);
    if (l->in_ndim != 3)
        return pdp__err(PDP_ERR_SHAPE, "needs (C, H, W) samples, got %s", in);
    if (k > H || k > W)
        return pdp__err(PDP_ERR_SHAPE,
                        "kernel %lld is larger than the input %lldx%lld (input %s)",
                        (long long)k, (long long)H, (long long)W, in);
    l->out_shape[1] = (H - k) / s + 1;
    l->out_shape[2] = (W - k) / s + 1;
    l->saved_per_sample = C * l->out_shape[1] * l->out_shape[2]; /* argmax per output */
    return PDP_OK;
}

#ifdef PDP_CUDA
static pdp_status pdp__maxpool_cuda_forward(const pdp__layer *l, const pdp__layer_io *io)
{
    pdp_cudak_conv g = pdp__conv_cuda_geom(l, io->batch, l->in_shape[0], 0);
    return pdp_cudak_maxpool_fwd(io->device.ordinal, &g, io->x, io->y, io->saved);
}

static pdp_status pdp__maxpool_cuda_backward(const pdp__layer *l, const pdp__layer_io *io)
{
    pdp_cudak_conv g = pdp__conv_cuda_geom(l, io->batch, l->in_shape[0], 0);
    if (!io->dx) return PDP_OK;
    return pdp_cudak_maxpool_bwd(io->device.ordinal, &g, io->dy, io->saved, io->dx);
}
#endif
/* ---- end src/layers_conv.c ---- */

/* ---- begin src/layers_tp.c ---- */
/* layers_tp: the four layer kinds of tensor parallelism (tp.h has the design): f and g,
   the conjugate operators, and the column- and row-parallel Linears, as entries of
   layers_table.c. The API around them (the model's TP communicator, constructors,
   statistics, full-tensor checkpoints) is tp.c.

   The split Linears ARE Linear (layers.c's kernels, CPU and CUDA) on this rank's
   slice: a ColumnParallelLinear is a Linear of n_r outputs, a RowParallelLinear a
   Linear of n_r inputs whose bias only TP rank 0 adds. What is theirs is the slice:
   setup computes it (pdp_tp_split), init draws the full tensors from the model's
   generator in the plain Linear's order and keeps the slice. f and g are collective
   kinds (PDP__LAYER_COLLECTIVE): one host entry for every device that copies the
   activation and all-reduces it on the TP communicator, synchronously.

   Invariants: every rank of the TP communicator has the same layers in the same order,
   so f and g issue the same all-reduces in the same order; after g every rank holds
   the same bits. Nothing here allocates. */

/* #include "internal.h" (already above) */

/* ---- tp: splits ---- */

PDP_API void pdp_tp_split(int64_t full, int rank, int size, int64_t *lo, int64_t *count)
{
    int64_t base, extra;
    if (size < 1) size = 1;
    base = full / size;
    extra = full % size;
    if (lo) *lo = rank * base + PDP__MIN((int64_t)rank, extra);
    if (count) *count = base + (rank < extra);
}

/* ---- tp: f and g, the conjugate operators ---- */

/* The TP all-reduce (sum, synchronous) of count floats at buf, counted in the stats;
   what: "g forward" or "f backward", for messages. */
static pdp_status pdp__tp_allreduce(const pdp__layer *l, float *buf, int64_t batch,
                                    int64_t width, bool forward)
{
    pdp__tp_state *tp = l->tp;
    double t0 = pdp__now(), n = (double)tp->size;
    int64_t bytes = batch * width * (int64_t)sizeof(float);
    pdp_status st = pdp_comm_allreduce(tp->comm, buf, batch * width, PDP_REDUCE_SUM, NULL);
    if (st != PDP_OK)
        return pdp__err_wrap(st, "%s: all-reduce of %lld x %lld activations (TP rank %d of %d)",
                             forward ? "g forward" : "f backward", (long long)batch,
                             (long long)width, tp->rank, tp->size);
    if (forward) {
        tp->stats.forward_allreduces++;
        tp->stats.forward_bytes += bytes;
    } else {
        tp->stats.backward_allreduces++;
        tp->stats.backward_bytes += bytes;
    }
    tp->stats.bytes_sent += (int64_t)(2.0 * (n - 1.0) / n * (double)bytes);
    tp->stats.allreduce_s += pdp__now() - t0;
    return PDP_OK;
}

/* dst <- src, count floats on io's device; a failure goes to *io->status. */
static bool pdp__tp_copy(const pdp__layer_io *io, float *dst, const float *src, int64_t count)
{
    pdp_status st = pdp__dev_copy(io->device, dst, io->device, src, (size_t)count * sizeof(float));
    if (st != PDP_OK) *io->status = st;
    return st == PDP_OK;
}

static pdp_status pdp__tp_op_setup(pdp__layer *l, const char *in)
{
    if (!l->tp)
        return pdp__err(PDP_ERR_STATE, "no TP communicator (call pdp_model_set_tp first; input %s)",
                        in);
    return PDP_OK;
}

static pdp_status pdp__tp_copy_setup(pdp__layer *l, pdp__param_shapes *ps, const char *in)
{
    (void)ps;
    return pdp__tp_op_setup(l, in);
}

static pdp_status pdp__tp_reduce_setup(pdp__layer *l, pdp__param_shapes *ps, const char *in)
{
    (void)ps;
    return pdp__tp_op_setup(l, in);
}

/* f forward: identity. */
static void pdp__tp_copy_forward(const pdp__layer *l, const pdp__layer_io *io)
{
    pdp__tp_copy(io, io->y, io->x, io->batch * l->in_count);
}

/* f backward: the input gradient is the sum of every rank's partial gradient (each rank's
   ColumnParallelLinear saw only its output slice). Nothing when no input gradient is
   needed (f is the first layer): every rank skips it alike. */
static void pdp__tp_copy_backward(const pdp__layer *l, const pdp__layer_io *io)
{
    pdp_status st;
    if (!io->dx || !pdp__tp_copy(io, io->dx, io->dy, io->batch * l->in_count)) return;
    if ((st = pdp__tp_allreduce(l, io->dx, io->batch, l->in_count, false)) != PDP_OK)
        *io->status = st;
}

/* g forward: the sum of every rank's partial output (RowParallelLinear's x_r W_r^T). */
static void pdp__tp_reduce_forward(const pdp__layer *l, const pdp__layer_io *io)
{
    pdp_status st;
    if (!pdp__tp_copy(io, io->y, io->x, io->batch * l->in_count)) return;
    if ((st = pdp__tp_allreduce(l, io->y, io->batch, l->in_count, true)) != PDP_OK)
        *io->status = st;
}

/* g backward: identity (the output gradient is replicated). */
static void pdp__tp_reduce_backward(const pdp__layer *l, const pdp__layer_io *io)
{
    if (io->dx) pdp__tp_copy(io, io->dx, io->dy, io->batch * l->in_count);
}

/* ---- tp: the column- and row-parallel Linears ---- */

static pdp_status pdp__tp_column_setup(pdp__layer *l, pdp__param_shapes *ps, const char *in)
{
    pdp_status st;
    if ((st = pdp__tp_op_setup(l, in)) != PDP_OK) return st;
    if (l->tp_full < l->tp->size)
        return pdp__err(PDP_ERR_INVALID, "out_features %lld < TP size %d: a rank would hold no "
                        "output feature (input %s)", (long long)l->tp_full, l->tp->size, in);
    pdp_tp_split(l->tp_full, l->tp->rank, l->tp->size, &l->tp_lo, &l->out_features);
    return pdp__linear_setup(l, ps, in);
}

/* The input is the slice [tp_lo, tp_lo + in_count) of tp_full features (pdp_model_add_
   row_parallel_linear took both from the ColumnParallelLinear before it). */
static pdp_status pdp__tp_row_setup(pdp__layer *l, pdp__param_shapes *ps, const char *in)
{
    pdp_status st;
    int64_t lo, n;
    if ((st = pdp__tp_op_setup(l, in)) != PDP_OK) return st;
    pdp_tp_split(l->tp_full, l->tp->rank, l->tp->size, &lo, &n);
    if (lo != l->tp_lo || n != l->in_count)
        return pdp__err(PDP_ERR_SHAPE, "input %s is not TP rank %d's slice of %lld features "
                        "(%lld at %lld)", in, l->tp->rank, (long long)l->tp_full, (long long)n,
                        (long long)lo);
    return pdp__linear_setup(l, ps, in);
}

/* `count` draws of pdp__layers_init_kaiming's generator for the tensor U(lo, hi) with the
   formula of pdp_tensor_uniform; element k is kept in dst[map(k)] when keep(k). The
   slice draws exactly what the full tensor would, in the same order. */
typedef struct pdp__tp_slice2d {
    int64_t cols;         /* the full tensor's row length */
    int64_t c0, c1;       /* kept columns [c0, c1) */
    int64_t r0, r1;       /* kept rows [r0, r1) */
} pdp__tp_slice2d;

static void pdp__tp_draw(float *dst, int64_t rows, pdp__tp_slice2d s, float lo, float hi,
                         pdp_rng *r)
{
    int64_t i, j, w = s.c1 - s.c0;
    for (i = 0; i < rows; i++)
        for (j = 0; j < s.cols; j++) {
            float v = lo + (hi - lo) * pdp_rng_uniform(r);
            if (i >= s.r0 && i < s.r1 && j >= s.c0 && j < s.c1)
                dst[(i - s.r0) * w + (j - s.c0)] = v;
        }
}

/* The bounds pdp__layers_init_kaiming uses for fan_in (Kaiming uniform with a = sqrt(5),
   then the bias's 1/sqrt(fan_in)), computed as pdp_tensor_kaiming_uniform does. */
static void pdp__tp_bounds(int64_t fan_in, float *wb, float *bb)
{
    float a = sqrtf(5.0f);
    double gain = sqrt(2.0 / (1.0 + (double)a * a));
    *wb = (float)(gain * sqrt(3.0 / (double)fan_in));
    *bb = (float)(1.0 / sqrt((double)fan_in));
}

/* W1 [tp_full, in]: rows [tp_lo, tp_lo + n) and the same entries of b1. */
static void pdp__tp_column_init(const pdp__layer *l, float *w, float *b, pdp_rng *r)
{
    pdp__tp_slice2d s;
    float wb, bb;
    pdp__tp_bounds(l->in_count, &wb, &bb);
    s.cols = l->in_count, s.c0 = 0, s.c1 = l->in_count;
    s.r0 = l->tp_lo, s.r1 = l->tp_lo + l->out_features;
    pdp__tp_draw(w, l->tp_full, s, -wb, wb, r);
    s.cols = 1, s.c0 = 0, s.c1 = 1;
    pdp__tp_draw(b, l->tp_full, s, -bb, bb, r);
}

/* W2 [d, tp_full]: columns [tp_lo, tp_lo + n); b2 whole. fan_in is the full width. */
static void pdp__tp_row_init(const pdp__layer *l, float *w, float *b, pdp_rng *r)
{
    pdp__tp_slice2d s;
    float wb, bb;
    pdp__tp_bounds(l->tp_full, &wb, &bb);
    s.cols = l->tp_full, s.c0 = l->tp_lo, s.c1 = l->tp_lo + l->in_count;
    s.r0 = 0, s.r1 = l->out_features;
    pdp__tp_draw(w, l->out_features, s, -wb, wb, r);
    s.cols = 1, s.c0 = 0, s.c1 = 1;
    pdp__tp_draw(b, l->out_features, s, -bb, bb, r);
}

/* Backward of Linear, without the input gradient when f is the first layer. */
static void pdp__tp_column_backward(const pdp__layer *l, const pdp__layer_io *io)
{
    pdp__layer_io run = *io;
    if (l->tp_skip_dx) run.dx = NULL;
    pdp__linear_backward(l, &run);
}

/* x_r W_r^T, plus the bias on TP rank 0 only: g's sum then adds it once. */
static void pdp__tp_row_forward(const pdp__layer *l, const pdp__layer_io *io)
{
    pdp__layer_io run = *io;
    if (l->tp->rank != 0) run.b = NULL;
    pdp__linear_forward(l, &run);
}

#ifdef PDP_CUDA
static pdp_status pdp__tp_column_cuda_backward(const pdp__layer *l, const pdp__layer_io *io)
{
    pdp__layer_io run = *io;
    if (l->tp_skip_dx) run.dx = NULL;
    return pdp__linear_cuda_backward(l, &run);
}

static pdp_status pdp__tp_row_cuda_forward(const pdp__layer *l, const pdp__layer_io *io)
{
    pdp__layer_io run = *io;
    if (l->tp->rank != 0) run.b = NULL;
    return pdp__linear_cuda_forward(l, &run);
}
#endif
/* ---- end src/layers_tp.c ---- */

/* ---- begin src/layers_table.c ---- */
/* layers_table: the table of layer kinds and the dispatch through it. One entry per
   kind (KANN's op table, kad_op_list, is the model): its name, setup (shape
   inference and validation, parameter shapes, saved and workspace floats),
   parameter initialisation, CPU forward and backward, CUDA forward and backward
   (pdp_cuda.cu's kernels), extra workspace on CUDA, and flags that model.c plans
   with (a view; fuses a following ReLU). Nothing else in pdp switches over kinds:
   model.c, dp.c and the executors go through pdp__layer_setup, pdp__layer_forward
   and the other functions below, once per layer call (never per element).

   Adding a layer kind takes:
   1. its code in layers.c (or a file of its own, listed in amalgamate.py before
      this one, as layers_conv.c): setup, forward and backward, init when it has
      parameters, and its CUDA entries under #ifdef PDP_CUDA (see layers.c's
      conventions);
   2. its value in pdp__layer_kind (internal.h) and its entry below;
   3. its public constructor pdp_model_add_<kind> (model.h, model.c);
   4. for CUDA: its kernels and their plain C functions in pdp_cuda.cu, declared in
      cuda.h, and the same functions in tests/fake_cuda/fake_cuda.c, where each is a
      few lines that rebuild the layer and run pdp's CPU entry through fake__layer.
   A kind without CUDA entries (NULL) works on the CPU; on a CUDA device its calls
   fail with PDP_ERR_UNSUPPORTED naming the layer.

   Invariants: every kind has an entry (tests/test_layers.c checks the name, setup,
   forward and backward of each); a setup starts from output = input shape and
   nothing saved, workspace 0, no parameters. */

/* #include "internal.h" (already above) */

#ifdef PDP_CUDA
#  define PDP__CUDA_ENTRY(fn) fn
#else
#  define PDP__CUDA_ENTRY(fn) NULL
#endif

/* ---- layers_table: the table ---- */

/* name, setup, init, forward, backward, cuda_forward, cuda_backward, cuda_work, flags */
static const pdp__layer_kind_info pdp__layer_kinds[PDP__LAYER_KIND_COUNT] = {
    [PDP__LINEAR] = {"Linear", pdp__linear_setup, pdp__linear_init, pdp__linear_forward,
                     pdp__linear_backward, PDP__CUDA_ENTRY(pdp__linear_cuda_forward),
                     PDP__CUDA_ENTRY(pdp__linear_cuda_backward), NULL, 0},
    [PDP__RELU] = {"ReLU", pdp__layers_setup_same, NULL, pdp__relu_forward, pdp__relu_backward,
                   PDP__CUDA_ENTRY(pdp__relu_cuda_forward),
                   PDP__CUDA_ENTRY(pdp__relu_cuda_backward), NULL, 0},
    [PDP__GELU] = {"GELU", pdp__layers_setup_same, NULL, pdp__gelu_forward, pdp__gelu_backward,
                   PDP__CUDA_ENTRY(pdp__gelu_cuda_forward),
                   PDP__CUDA_ENTRY(pdp__gelu_cuda_backward), NULL, 0},
    [PDP__TANH] = {"Tanh", pdp__layers_setup_same, NULL, pdp__tanh_forward, pdp__tanh_backward,
                   PDP__CUDA_ENTRY(pdp__tanh_cuda_forward),
                   PDP__CUDA_ENTRY(pdp__tanh_cuda_backward), NULL, 0},
    [PDP__SIGMOID] = {"Sigmoid", pdp__layers_setup_same, NULL, pdp__sigmoid_forward,
                      pdp__sigmoid_backward, PDP__CUDA_ENTRY(pdp__sigmoid_cuda_forward),
                      PDP__CUDA_ENTRY(pdp__sigmoid_cuda_backward), NULL, 0},
    [PDP__DROPOUT] = {"Dropout", pdp__dropout_setup, NULL, pdp__dropout_forward,
                      pdp__dropout_backward, PDP__CUDA_ENTRY(pdp__dropout_cuda_forward),
                      PDP__CUDA_ENTRY(pdp__dropout_cuda_backward), NULL, 0},
    [PDP__LAYERNORM] = {"LayerNorm", pdp__layernorm_setup, pdp__layernorm_init,
                        pdp__layernorm_forward, pdp__layernorm_backward,
                        PDP__CUDA_ENTRY(pdp__layernorm_cuda_forward),
                        PDP__CUDA_ENTRY(pdp__layernorm_cuda_backward), NULL, 0},
    [PDP__CONV2D] = {"Conv2d", pdp__conv_setup, pdp__conv_init, pdp__conv_forward,
                     pdp__conv_backward, PDP__CUDA_ENTRY(pdp__conv_cuda_forward),
                     PDP__CUDA_ENTRY(pdp__conv_cuda_backward), pdp__conv_cuda_work,
                     PDP__LAYER_FUSES_RELU | PDP__LAYER_FUSES_POOL},
    [PDP__MAXPOOL2D] = {"MaxPool2d", pdp__maxpool_setup, NULL, pdp__maxpool_forward,
                        pdp__maxpool_backward, PDP__CUDA_ENTRY(pdp__maxpool_cuda_forward),
                        PDP__CUDA_ENTRY(pdp__maxpool_cuda_backward), NULL, 0},
    [PDP__FLATTEN] = {"Flatten", pdp__flatten_setup, NULL, pdp__flatten_forward,
                      pdp__flatten_backward, PDP__CUDA_ENTRY(pdp__flatten_cuda_forward),
                      PDP__CUDA_ENTRY(pdp__flatten_cuda_backward), NULL, PDP__LAYER_VIEW},
    /* tensor parallel (tp.c): f and g run their collective on every device; the split
       Linears are Linear's kernels on this rank's slice */
    [PDP__TP_COPY] = {"CopyToModelParallelRegion", pdp__tp_copy_setup, NULL,
                      pdp__tp_copy_forward, pdp__tp_copy_backward, NULL, NULL, NULL,
                      PDP__LAYER_COLLECTIVE | PDP__LAYER_UNNUMBERED},
    [PDP__COLUMN_PARALLEL_LINEAR] = {"ColumnParallelLinear", pdp__tp_column_setup,
                                     pdp__tp_column_init, pdp__linear_forward,
                                     pdp__tp_column_backward,
                                     PDP__CUDA_ENTRY(pdp__linear_cuda_forward),
                                     PDP__CUDA_ENTRY(pdp__tp_column_cuda_backward), NULL, 0},
    [PDP__ROW_PARALLEL_LINEAR] = {"RowParallelLinear", pdp__tp_row_setup, pdp__tp_row_init,
                                  pdp__tp_row_forward, pdp__linear_backward,
                                  PDP__CUDA_ENTRY(pdp__tp_row_cuda_forward),
                                  PDP__CUDA_ENTRY(pdp__linear_cuda_backward), NULL, 0},
    [PDP__TP_REDUCE] = {"ReduceFromModelParallelRegion", pdp__tp_reduce_setup, NULL,
                        pdp__tp_reduce_forward, pdp__tp_reduce_backward, NULL, NULL, NULL,
                        PDP__LAYER_COLLECTIVE | PDP__LAYER_UNNUMBERED},
};

/* The entry of kind k; NULL for a value outside the table. */
static const pdp__layer_kind_info *pdp__layer_kind_of(pdp__layer_kind k)
{
    return (unsigned)k < PDP__LAYER_KIND_COUNT ? &pdp__layer_kinds[k] : NULL;
}

static const char *pdp__layer_kind_name(pdp__layer_kind k)
{
    const pdp__layer_kind_info *info = pdp__layer_kind_of(k);
    return info && info->name ? info->name : "?";
}

/* ---- layers_table: setup and initialisation ---- */

static pdp_status pdp__layer_setup(pdp__layer *l, pdp__param_shapes *ps)
{
    const pdp__layer_kind_info *info = pdp__layer_kind_of(l->kind);
    char in[64];
    pdp_status st;
    memset(ps, 0, sizeof *ps);
    if (!info || !info->setup)
        return pdp__err(PDP_ERR_INVALID, "unknown layer kind %d", (int)l->kind);
    pdp__layers_dims_str(l->in_ndim, l->in_shape, in, sizeof in);
    l->out_ndim = l->in_ndim;
    memcpy(l->out_shape, l->in_shape, sizeof l->out_shape);
    l->saved_per_sample = 0;
    l->work_per_sample = 0;
    if ((st = info->setup(l, ps, in)) != PDP_OK) return st;
    if (l->out_ndim == 1) l->out_shape[1] = l->out_shape[2] = 1;
    l->out_count = l->out_shape[0] * l->out_shape[1] * l->out_shape[2];
    return PDP_OK;
}

static void pdp__layer_init_params(const pdp__layer *l, float *w, float *b, pdp_rng *r)
{
    const pdp__layer_kind_info *info = pdp__layer_kind_of(l->kind);
    if (info && info->init) info->init(l, w, b, r);
}

/* Workspace floats per sample a layer needs on device d: the CPU's algorithm sizes
   its own (setup); on CUDA the larger of that and the kind's CUDA kernels' need. */
static int64_t pdp__layer_work_per_sample(const pdp__layer *l, pdp_device d)
{
    const pdp__layer_kind_info *info = pdp__layer_kind_of(l->kind);
    if (d.kind == PDP_DEVICE_CUDA && info && info->cuda_work)
        return PDP__MAX(l->work_per_sample, info->cuda_work(l));
    return l->work_per_sample;
}

/* ---- layers_table: forward and backward ---- */

/* A CUDA entry's call: pdp_cuda.cu's message on failure; without the entry (or
   without PDP_CUDA), PDP_ERR_UNSUPPORTED. */
static pdp_status pdp__layer_cuda(const pdp__layer *l, const pdp__layer_io *io,
                                  pdp_status (*fn)(const pdp__layer *, const pdp__layer_io *))
{
#ifdef PDP_CUDA
    pdp_status st;
    if (!fn)
        return pdp__err(PDP_ERR_UNSUPPORTED, "%s has no CUDA kernel (CUDA device %d)",
                        pdp__layer_kind_name(l->kind), io->device.ordinal);
    if ((st = fn(l, io)) != PDP_OK) return pdp__err(st, "pdp_cuda: %s", pdp_cudak_error());
    return PDP_OK;
#else
    (void)l, (void)fn;
    return pdp__err(PDP_ERR_UNSUPPORTED, "CUDA device %d: built without PDP_CUDA (compile with "
                    "-DPDP_CUDA and link pdp_cuda.o)", io->device.ordinal);
#endif
}

/* A PDP__LAYER_COLLECTIVE kind's call, on any device: its failure comes back through
   io->status, pointed at a variable of this call. */
static pdp_status pdp__layer_collective(const pdp__layer *l, const pdp__layer_io *io,
                                        void (*fn)(const pdp__layer *, const pdp__layer_io *))
{
    pdp_status st = PDP_OK;
    pdp__layer_io run = *io;
    run.status = &st;
    fn(l, &run);
    return st;
}

/* CUDA memory goes to the kind's CUDA entry (pdp_cuda.cu's kernels); the rest is
   CPU memory. A collective kind's host entry runs on every device. */
static pdp_status pdp__layer_forward(const pdp__layer *l, const pdp__layer_io *io)
{
    const pdp__layer_kind_info *info = pdp__layer_kind_of(l->kind);
    if (!info) return pdp__err(PDP_ERR_INVALID, "unknown layer kind %d", (int)l->kind);
    if (info->flags & PDP__LAYER_COLLECTIVE) return pdp__layer_collective(l, io, info->forward);
    if (io->device.kind == PDP_DEVICE_CUDA) return pdp__layer_cuda(l, io, info->cuda_forward);
    info->forward(l, io);
    return PDP_OK;
}

static pdp_status pdp__layer_backward(const pdp__layer *l, const pdp__layer_io *io)
{
    const pdp__layer_kind_info *info = pdp__layer_kind_of(l->kind);
    if (!info) return pdp__err(PDP_ERR_INVALID, "unknown layer kind %d", (int)l->kind);
    if (info->flags & PDP__LAYER_COLLECTIVE) return pdp__layer_collective(l, io, info->backward);
    if (io->device.kind == PDP_DEVICE_CUDA) return pdp__layer_cuda(l, io, info->cuda_backward);
    info->backward(l, io);
    return PDP_OK;
}
/* ---- end src/layers_table.c ---- */

/* ---- begin src/model.c ---- */
/* model: the sequential container. Owns the layer list, the parameter registry
   and the flat parameter and gradient blocks, sizes the activation buffers, and
   drives forward and backward over the layers through the table of kinds
   (layers_table.c).

   Invariants: params[i].offset is the sum of the counts before it (registration
   order, no gaps), so the gradient of parameters j..k is one contiguous range;
   act[i] holds layer i's output from the last forward (Flatten aliases its
   input instead of copying, and so does a ReLU after a Conv2d on the CPU, which the
   Conv2d applies itself; when a 2x2 stride-2 MaxPool2d follows that ReLU, the Conv2d
   applies it too, writes the pool's act, and its own act is NULL); backward needs
   the forward's input to stay alive, as in PyTorch's autograd. After
   pdp_model_reserve (or the first step at the largest batch), forward and backward
   allocate nothing.

   The executor seam (internal.h): an executor may listen to the pass's events
   (m->event: before each layer with parameters, forward and backward, and at
   the start and end of every backward: DDP and ZeRO synchronise any backward
   this way) and point a layer's weight/bias and their gradients at buffers of
   its own (m->layer_w, m->layer_dw: ZeRO's per-unit buffers). Both are off
   (NULL) by default: one pointer test per layer. */

/* #include "internal.h" (already above) */

/* ---- model: lifecycle ---- */

PDP_API pdp_status pdp_model_create(pdp_model **out, const pdp_model_desc *desc)
{
    pdp_model *m;
    int64_t count;
    int i, ndim = 0;
    pdp_status st;
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
    if (!pdp__mul3_ok(ndim > 0 ? desc->input_shape[0] : 1, ndim > 1 ? desc->input_shape[1] : 1,
                      ndim > 2 ? desc->input_shape[2] : 1, &count))
        return pdp__err(PDP_ERR_SHAPE, "pdp_model_create: input_shape has more than %lld elements",
                        (long long)PDP__COUNT_MAX);
    m = (pdp_model *)pdp__calloc(sizeof *m);
    if (!m) return pdp__err(PDP_ERR_OUT_OF_MEMORY, "pdp_model_create: no memory");
    m->device = desc->device;
    m->seed = desc->seed;
    pdp_rng_seed(&m->init_rng, desc->seed, 0);
    if ((st = pdp_model_set_precision(m, desc->precision)) != PDP_OK) {
        pdp__dealloc(m);
        return pdp__err_wrap(st, "pdp_model_create");
    }
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

/* The state_dict number of the next layer: layers so far, less the unnumbered ones
   (PDP__LAYER_UNNUMBERED: TP's f and g). */
static int pdp__model_next_number(const pdp_model *m)
{
    int i, n = 0;
    for (i = 0; i < m->nlayers; i++)
        n += !(pdp__layer_kind_of(m->layers[i].kind)->flags & PDP__LAYER_UNNUMBERED);
    return n;
}

static pdp_status pdp__model_register(pdp_model *m, int layer, const char *what, int ndim,
                                      const int64_t *shape)
{
    pdp__param_entry *e;
    int64_t count = 1, total;
    int i;
    for (i = 0; i < ndim; i++)
        if (!pdp__mul_ok(count, shape[i], &count))
            return pdp__err(PDP_ERR_SHAPE, "%s has more than %lld elements", what,
                            (long long)PDP__COUNT_MAX);
    if (!pdp__add_ok(m->param_count, count, &total))
        return pdp__err(PDP_ERR_SHAPE, "the model would have more than %lld parameters with "
                        "%lld more", (long long)PDP__COUNT_MAX, (long long)count);
    if (pdp__grow((void **)&m->params, m->nparams, &m->cap_params, sizeof *m->params) != PDP_OK)
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "no memory");
    e = &m->params[m->nparams++];
    memset(e, 0, sizeof *e);
    snprintf(e->name, sizeof e->name, "%d.%s", pdp__model_next_number(m), what);
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
    pdp__param_shapes ps;
    int64_t old_count;
    int old_nparams;
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
    if ((st = pdp__layer_setup(&l, &ps)) != PDP_OK)
        return pdp__err_wrap(st, "%s: layer %d (%s)", fn, l.index, pdp__layer_kind_name(l.kind));
    l.out_count = l.out_shape[0] * l.out_shape[1] * l.out_shape[2]; /* the setup checked it */

    if (pdp__grow((void **)&m->layers, m->nlayers, &m->cap_layers, sizeof *m->layers) != PDP_OK)
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory", fn);
    old_count = m->param_count;
    old_nparams = m->nparams;
    l.param_first = m->nparams;
    l.nparams = (ps.wndim > 0) + (ps.bndim > 0);
    if ((ps.wndim && (st = pdp__model_register(m, l.index, "weight", ps.wndim, ps.wshape))) ||
        (ps.bndim && (st = pdp__model_register(m, l.index, "bias", ps.bndim, ps.bshape))))
        goto fail;
    if (m->param_count != old_count) {
        bytes = (size_t)m->param_count * sizeof(float);
        host = (float *)pdp__alloc(bytes);
        if (!host) goto oom;
        if (old_count && (st = pdp__dev_copy(pdp_cpu(), host, m->device, m->param_block,
                                             (size_t)old_count * sizeof(float))) != PDP_OK)
            goto fail;
        pdp__layer_init_params(&l, ps.wndim ? host + m->params[l.param_first].offset : NULL,
                               ps.bndim ? host + m->params[m->nparams - 1].offset : NULL,
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
    l.eps = eps == 0.0f ? 1e-5f : eps; /* 0: the default; the setup rejects < 0, NaN, inf */
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

/* Layer i is a ReLU that the layer before it (a Conv2d: PDP__LAYER_FUSES_RELU)
   applies in its own forward and backward (CPU only; never the last layer, whose
   output the caller reads): the ReLU is then a view, as Flatten, and is skipped.
   Same bits as running it. */
static bool pdp__model_relu_fused(const pdp_model *m, int i)
{
    return m->device.kind == PDP_DEVICE_CPU && i > 0 && i < m->nlayers - 1 &&
           m->layers[i].kind == PDP__RELU &&
           (pdp__layer_kind_of(m->layers[i - 1].kind)->flags & PDP__LAYER_FUSES_RELU);
}

/* Layer i is a 2x2 stride-2 MaxPool2d over an even H and W after a fused ReLU,
   which the Conv2d before that (PDP__LAYER_FUSES_POOL) applies too: the Conv2d
   writes this layer's output and saved winners, and takes its output's gradient;
   this layer is skipped, and the Conv2d's own output never exists. Same bits. */
static bool pdp__model_pool_fused(const pdp_model *m, int i)
{
    const pdp__layer *l = &m->layers[i];
    return i > 1 && l->kind == PDP__MAXPOOL2D && l->kernel == 2 && l->stride == 2 &&
           l->in_shape[1] % 2 == 0 && l->in_shape[2] % 2 == 0 &&
           pdp__model_relu_fused(m, i - 1) &&
           (pdp__layer_kind_of(m->layers[i - 2].kind)->flags & PDP__LAYER_FUSES_POOL);
}

/* Layer i is the Conv2d that applies the pool two layers on (pdp__model_pool_fused). */
static bool pdp__model_pools(const pdp_model *m, int i)
{
    return i + 2 < m->nlayers && pdp__model_pool_fused(m, i + 2);
}

/* Layer i's output is its input seen again (PDP__LAYER_VIEW: Flatten; a fused ReLU):
   no buffer, no call. */
static bool pdp__model_is_view(const pdp_model *m, int i)
{
    return (pdp__layer_kind_of(m->layers[i].kind)->flags & PDP__LAYER_VIEW) ||
           pdp__model_relu_fused(m, i);
}

/* Layer i's output needs a buffer: not a view, and not a Conv2d whose pool is fused. */
static bool pdp__model_has_output(const pdp_model *m, int i)
{
    return !pdp__model_is_view(m, i) && !pdp__model_pools(m, i);
}

/* Per-sample floats of the activation buffers (one plan for pdp_model_reserve and for
   DP's memory accounting): outputs of the layers that are not views, what forward
   keeps for backward, the largest workspace, and the widest activation (the two
   gradient ping-pong buffers). saved_off, when not NULL, gets each layer's offset. */
typedef struct pdp__model_plan {
    int64_t act, saved, work, widest;
} pdp__model_plan;

/* *acc += v, or INT64_MAX (which stays) past PDP__COUNT_MAX: reserve then fails. */
static void pdp__model_plan_add(int64_t *acc, int64_t v)
{
    if (!pdp__add_ok(*acc, v, acc)) *acc = INT64_MAX;
}

static pdp__model_plan pdp__model_plan_of(const pdp_model *m, int64_t *saved_off)
{
    pdp__model_plan p;
    int i;
    p.act = p.saved = p.work = 0;
    p.widest = m->in_count;
    for (i = 0; i < m->nlayers; i++) {
        const pdp__layer *l = &m->layers[i];
        if (pdp__model_has_output(m, i)) pdp__model_plan_add(&p.act, l->out_count);
        if (saved_off) saved_off[i] = p.saved;
        pdp__model_plan_add(&p.saved, l->saved_per_sample);
        p.work = PDP__MAX(p.work, pdp__layer_work_per_sample(l, m->device));
        p.widest = PDP__MAX(p.widest, l->out_count);
    }
    return p;
}


/* Points the outputs of the layers that are not views at activation set m->slot. */
static void pdp__model_bind_acts(pdp_model *m)
{
    int64_t act = 0;
    int i;
    for (i = 0; i < m->nlayers; i++) {
        if (!pdp__model_has_output(m, i)) {
            if (!pdp__model_is_view(m, i)) m->act[i] = NULL; /* a Conv2d whose pool is fused */
            continue;
        }
        m->act[i] = m->act_block + m->slot * m->act_stride + m->max_batch * act;
        act += m->layers[i].out_count;
    }
}

PDP_API pdp_status pdp_model_reserve(pdp_model *m, int64_t max_batch)
{
    int64_t b = max_batch, k, n[4], sum;
    pdp__model_plan p;
    pdp_status st;
    if (!m) return pdp__err(PDP_ERR_INVALID, "pdp_model_reserve: model is NULL");
    if (max_batch < 1)
        return pdp__err(PDP_ERR_SHAPE, "pdp_model_reserve: batch %lld < 1", (long long)max_batch);
    if (max_batch <= m->max_batch) return PDP_OK;
    pdp__model_free_buffers(m);
    m->act = (float **)pdp__calloc((size_t)(m->nlayers + 1) * sizeof *m->act);
    m->saved_off = (int64_t *)pdp__calloc((size_t)(m->nlayers + 1) * sizeof *m->saved_off);
    if (!m->act || !m->saved_off) goto oom;
    p = pdp__model_plan_of(m, m->saved_off);
    k = m->nslots > 1 ? m->nslots : 1; /* activation sets (pipeline stages keep several) */
    /* the floats of each buffer, and of all five (pdp__dp_model_bytes adds them up) */
    if (!pdp__mul3_ok(k, b, p.act, &n[0]) || !pdp__add_ok(n[0], 1, &n[0]) ||
        !pdp__mul3_ok(k, b, p.saved, &n[1]) || !pdp__add_ok(n[1], 1, &n[1]) ||
        !pdp__mul_ok(b, p.work, &n[2]) || !pdp__add_ok(n[2], 1, &n[2]) ||
        !pdp__mul_ok(b, p.widest, &n[3]) || !pdp__add_ok(n[0], n[1], &sum) ||
        !pdp__add_ok(sum, n[2], &sum) || !pdp__add_ok(sum, n[3], &sum) ||
        !pdp__add_ok(sum, n[3], &sum)) {
        pdp__model_free_buffers(m);
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "pdp_model_reserve: batch %lld needs more than "
                        "%lld floats of activations", (long long)b, (long long)PDP__COUNT_MAX);
    }
    if ((st = pdp__dev_alloc(m->device, (size_t)n[0] * 4, (void **)&m->act_block)) ||
        (st = pdp__dev_alloc(m->device, (size_t)n[1] * 4, (void **)&m->saved_block)) ||
        (st = pdp__dev_alloc(m->device, (size_t)n[2] * 4, (void **)&m->work_block)) ||
        (st = pdp__dev_alloc(m->device, (size_t)n[3] * 4, (void **)&m->grad_a)) ||
        (st = pdp__dev_alloc(m->device, (size_t)n[3] * 4, (void **)&m->grad_b))) {
        pdp__model_free_buffers(m);
        return pdp__err_wrap(st, "pdp_model_reserve: batch %lld", (long long)b);
    }
    m->max_batch = b;
    m->act_stride = b * p.act;
    m->saved_stride = b * p.saved;
    if (m->slot >= k) m->slot = 0;
    pdp__model_bind_acts(m);
    return PDP_OK;
oom:
    pdp__model_free_buffers(m);
    return pdp__err(PDP_ERR_OUT_OF_MEMORY, "pdp_model_reserve: no memory for batch %lld",
                    (long long)b);
}

/* ---- model: forward and backward ---- */

/* What layer i's forward keeps for its backward, in the current activation set. */
static float *pdp__model_saved(const pdp_model *m, int i)
{
    return m->saved_block + m->slot * m->saved_stride + m->max_batch * m->saved_off[i];
}

/* Fills the per-call part of io for layer i. */
static void pdp__model_io(const pdp_model *m, int i, pdp__layer_io *io)
{
    const pdp__layer *l = &m->layers[i];
    memset(io, 0, sizeof *io);
    io->batch = m->batch;
    io->saved = pdp__model_saved(m, i);
    io->work = m->work_block;
    io->device = m->device;
    io->training = m->training;
    io->bf16 = m->precision == PDP_PRECISION_BF16;
    io->seed = m->seed;
    io->step = m->step;
    io->sample_base = m->sample_base;
    io->fused_relu = i + 1 < m->nlayers && pdp__model_relu_fused(m, i + 1);
    if (pdp__model_pools(m, i)) {
        io->pool_y = m->act[i + 2];
        io->pool_arg = (int32_t *)(void *)pdp__model_saved(m, i + 2);
    }
    if (l->nparams > 0) {
        const pdp__param_entry *w = &m->params[l->param_first];
        io->w = m->layer_w && m->layer_w[i] ? m->layer_w[i] : m->param_block + w->offset;
        io->dw = m->layer_dw && m->layer_dw[i] ? m->layer_dw[i] : m->grad_block + w->offset;
        if (l->nparams > 1) {
            io->b = io->w + w->count;
            io->db = io->dw + w->count;
        }
    }
}

/* A trace event "forward 3 Linear" on the model's track (DDP sets it), t0 to now. */
static void pdp__model_trace(const pdp_model *m, const char *what, int i, double t0)
{
    char name[48];
    snprintf(name, sizeof name, "%s %d %s", what, i, pdp__layer_kind_name(m->layers[i].kind));
    pdp__trace_complete(m->trace_pid, m->trace_tid, "compute", name, t0, pdp__now(), NULL);
}

/* The profile's split (pdp_profile): a layer with weights counts as GEMM work. */
static void pdp__model_profile(const pdp__layer *l, double t0)
{
    double dt = pdp__now() - t0;
    if (l->nparams > 0) pdp__prof.gemm_layers_s += dt;
    else pdp__prof.other_layers_s += dt;
}

PDP_API pdp_status pdp_model_forward(pdp_model *m, const pdp_tensor *x, const pdp_tensor **y)
{
    double t0;
    int64_t batch, shape[4], n;
    const float *in;
    int i, d;
    pdp_status st;
    if (!m || !x || !y) return pdp__err(PDP_ERR_INVALID, "pdp_model_forward: NULL argument");
    *y = NULL;
    if (m->nlayers == 0) return pdp__err(PDP_ERR_STATE, "pdp_model_forward: the model has no layers");
    batch = x->shape[0];
    if (x->ndim != m->in_ndim + 1 || !pdp__mul_ok(batch, m->in_count, &n) || x->count != n)
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
        if (pdp__model_is_view(m, i)) { /* y is x */
            m->act[i] = (float *)in;
            continue;
        }
        if (pdp__model_pool_fused(m, i)) { /* the Conv2d wrote y */
            in = m->act[i];
            continue;
        }
        if (m->event && l->nparams &&
            (st = m->event(m->event_user, m, PDP__EV_FORWARD_LAYER, i, PDP_OK)) != PDP_OK)
            return pdp__err_wrap(st, "pdp_model_forward: layer %d (%s)", i,
                                 pdp__layer_kind_name(l->kind));
        pdp__model_io(m, i, &io);
        io.x = in;
        io.y = m->act[i];
        t0 = m->trace_tid || m->layer_s || pdp__prof.on ? pdp__now() : 0.0;
        if ((st = pdp__layer_forward(l, &io)) != PDP_OK)
            return pdp__err_wrap(st, "pdp_model_forward: layer %d (%s)", i,
                                 pdp__layer_kind_name(l->kind));
        if (m->trace_tid) pdp__model_trace(m, "forward", i, t0);
        if (m->layer_s) m->layer_s[i] += pdp__now() - t0;
        if (pdp__prof.on) pdp__model_profile(l, t0);
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
    double t0;
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
    if (m->event && (st = m->event(m->event_user, m, PDP__EV_BACKWARD_BEGIN, -1, PDP_OK)))
        return pdp__err_wrap(st, "pdp_model_backward");
    m->have_forward = false;
    g = dy->data;
    st = PDP_OK;
    for (i = m->nlayers - 1; i >= 0; i--) {
        const pdp__layer *l = &m->layers[i];
        pdp__layer_io io;
        if (m->event && l->nparams &&
            (st = m->event(m->event_user, m, PDP__EV_BACKWARD_LAYER, i, PDP_OK)) != PDP_OK) {
            st = pdp__err_wrap(st, "pdp_model_backward: layer %d (%s)", i,
                               pdp__layer_kind_name(l->kind));
            break;
        }
        if (!pdp__model_is_view(m, i) && !pdp__model_pool_fused(m, i)) {
            pdp__model_io(m, i, &io);
            io.x = i ? m->act[i - 1] : m->act[m->nlayers];
            io.y = m->act[i];
            io.dy = g;
            io.dx = i ? (g == m->grad_a ? m->grad_b : m->grad_a) : m->input_grad;
            t0 = m->trace_tid || m->layer_s || pdp__prof.on ? pdp__now() : 0.0;
            if ((st = pdp__layer_backward(l, &io)) != PDP_OK) {
                st = pdp__err_wrap(st, "pdp_model_backward: layer %d (%s)", i,
                                   pdp__layer_kind_name(l->kind));
                break;
            }
            if (m->trace_tid) pdp__model_trace(m, "backward", i, t0);
            if (m->layer_s) m->layer_s[i] += pdp__now() - t0;
            if (pdp__prof.on) pdp__model_profile(l, t0);
            if (io.dx) g = io.dx;
        }
        if (m->hook)
            for (p = l->param_first + l->nparams - 1; p >= l->param_first; p--)
                m->hook(m->hook_user, m, p);
    }
    /* a pipeline stage whose first layers are views: its input gradient is dy seen again */
    if (st == PDP_OK && m->input_grad && g != m->input_grad)
        st = pdp__dev_copy(m->device, m->input_grad, m->device, g,
                           (size_t)(m->batch * m->in_count) * sizeof(float));
    if (m->event) m->event(m->event_user, m, PDP__EV_BACKWARD_END, -1, st);
    return st;
}

PDP_API void pdp_model_zero_grad(pdp_model *m)
{
    if (m && m->param_count && m->grad_block) /* NULL: ZeRO holds the gradients */
        pdp__dev_memset0(m->device, m->grad_block, (size_t)m->param_count * sizeof(float));
}

PDP_API void pdp_model_set_training(pdp_model *m, bool training)
{
    if (m) m->training = training;
}

PDP_API bool pdp_model_is_training(const pdp_model *m) { return m && m->training; }

PDP_API pdp_status pdp_model_set_precision(pdp_model *m, pdp_precision precision)
{
    if (!m) return pdp__err(PDP_ERR_INVALID, "pdp_model_set_precision: model is NULL");
    if (precision != PDP_PRECISION_FP32 && precision != PDP_PRECISION_BF16)
        return pdp__err(PDP_ERR_INVALID, "pdp_model_set_precision: unknown precision %d",
                        (int)precision);
    m->precision = precision;
    return PDP_OK;
}

PDP_API pdp_precision pdp_model_precision(const pdp_model *m)
{
    return m ? m->precision : PDP_PRECISION_FP32;
}

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
    m->event = NULL;
    m->event_user = NULL;
    m->layer_w = m->layer_dw = NULL;
    m->trace_tid = 0;
    m->have_forward = false;
    m->nslots = m->slot = 0;
    m->input_grad = NULL;
    m->layer_s = NULL;
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

/* ---- model: pipeline stages ---- */

static pdp_status pdp__model_stage(const pdp_model *full, int lo, int hi, pdp_model **out)
{
    pdp_model *m;
    int p0, p1, i;
    int64_t off0;
    size_t bytes;
    pdp_status st;
    *out = NULL;
    PDP_ASSERT(0 <= lo && lo < hi && hi <= full->nlayers);
    p0 = full->layers[lo].param_first;
    p1 = hi < full->nlayers ? full->layers[hi].param_first : full->nparams;
    off0 = p0 < full->nparams ? full->params[p0].offset : full->param_count;
    m = (pdp_model *)pdp__calloc(sizeof *m);
    if (!m) return pdp__err(PDP_ERR_OUT_OF_MEMORY, "no memory for a stage");
    m->device = full->device;
    m->seed = full->seed;
    m->init_rng = full->init_rng;
    m->in_ndim = full->layers[lo].in_ndim;
    memcpy(m->in_shape, full->layers[lo].in_shape, sizeof m->in_shape);
    m->in_count = full->layers[lo].in_count;
    m->training = full->training;
    m->precision = full->precision;
    m->nlayers = m->cap_layers = hi - lo;
    m->nparams = m->cap_params = p1 - p0;
    m->layers = (pdp__layer *)pdp__alloc((size_t)m->nlayers * sizeof *m->layers);
    m->params = (pdp__param_entry *)pdp__alloc((size_t)PDP__MAX(1, m->nparams) * sizeof *m->params);
    if (!m->layers || !m->params) {
        pdp_model_free(m);
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "no memory for a stage");
    }
    memcpy(m->layers, full->layers + lo, (size_t)m->nlayers * sizeof *m->layers);
    for (i = 0; i < m->nlayers; i++) m->layers[i].param_first -= p0;
    for (i = 0; i < m->nparams; i++) {
        m->params[i] = full->params[p0 + i];
        m->params[i].offset -= off0;
        m->param_count += m->params[i].count;
    }
    bytes = (size_t)m->param_count * sizeof(float);
    if (bytes && ((st = pdp__dev_alloc(m->device, bytes, (void **)&m->param_block)) != PDP_OK ||
                  (st = pdp__dev_copy(m->device, m->param_block, full->device,
                                      full->param_block + off0, bytes)) != PDP_OK ||
                  (st = pdp__dev_alloc(m->device, bytes, (void **)&m->grad_block)) != PDP_OK ||
                  (st = pdp__dev_memset0(m->device, m->grad_block, bytes)) != PDP_OK)) {
        pdp_model_free(m);
        return st;
    }
    *out = m;
    return PDP_OK;
}

static pdp_status pdp__model_set_slots(pdp_model *m, int nslots)
{
    pdp__model_free_buffers(m);
    m->nslots = nslots;
    m->slot = 0;
    return PDP_OK;
}

static void pdp__model_use_slot(pdp_model *m, int slot, const float *x, int64_t batch,
                                bool forwarded)
{
    int64_t shape[4];
    int i, d;
    PDP_ASSERT(slot >= 0 && slot < PDP__MAX(1, m->nslots) && m->act);
    m->slot = slot;
    pdp__model_bind_acts(m);
    if (!forwarded) return;
    for (i = 0; i < m->nlayers; i++) /* views see their input again, as forward left them */
        if (pdp__model_is_view(m, i)) m->act[i] = i ? m->act[i - 1] : (float *)x;
    m->act[m->nlayers] = (float *)x;
    m->batch = batch;
    shape[0] = batch;
    for (d = 0; d < m->layers[m->nlayers - 1].out_ndim; d++)
        shape[d + 1] = m->layers[m->nlayers - 1].out_shape[d];
    pdp_tensor_wrap(m->act[m->nlayers - 1], m->device, d + 1, shape, &m->out_view);
    m->have_forward = true;
}
/* ---- end src/model.c ---- */

/* ---- begin src/loss.c ---- */
/* loss: softmax cross-entropy over integer labels and mean squared error, as
   torch.nn.functional.cross_entropy and mse_loss with reduction='mean'; the
   one-call training pass pdp_model_forward_backward; and accuracy counting.

   Cross-entropy per sample is logsumexp(z) - z[label], computed stably as
   m + log(sum exp(z - m)) with m = max(z) and the sum in double; the batch sum
   is accumulated in double in sample order. Its gradient is
   (softmax(z) - onehot(label)) * grad_scale. A label outside [0, classes) is
   PDP_ERR_INVALID and a non-finite loss PDP_ERR_NUMERIC, both naming the sample,
   so a diverging run stops where it diverged instead of training on NaN. On a
   CUDA device the same formulas run in pdp_cuda.cu (cuda_host.c dispatches);
   the per-sample losses come back and are summed here in sample order. */

/* #include "internal.h" (already above) */

/* ---- loss: cross-entropy ---- */

static pdp_status pdp__cross_entropy(const float *logits, const int32_t *labels, int64_t batch,
                                     int64_t classes, float grad_scale, double *loss_sum,
                                     float *dlogits, const char *fn)
{
    double total = 0.0;
    int64_t i, j;
    for (i = 0; i < batch; i++) {
        const float *z = logits + i * classes;
        int32_t label = labels[i];
        float mx = z[0];
        double sum = 0.0, loss;
        if (label < 0 || label >= classes)
            return pdp__err(PDP_ERR_INVALID, "%s: label %ld at sample %lld is outside [0, %lld)",
                            fn, (long)label, (long long)i, (long long)classes);
        for (j = 1; j < classes; j++) mx = z[j] > mx ? z[j] : mx;
        for (j = 0; j < classes; j++) sum += exp((double)z[j] - (double)mx);
        loss = (double)mx + log(sum) - (double)z[label];
        if (loss != loss || loss == HUGE_VAL || loss == -HUGE_VAL) {
            *loss_sum = loss;
            return pdp__err(PDP_ERR_NUMERIC, "%s: loss is %s at sample %lld", fn,
                            loss != loss ? "NaN" : "Inf", (long long)i);
        }
        total += loss;
        if (dlogits) {
            float *d = dlogits + i * classes;
            double inv = 1.0 / sum;
            for (j = 0; j < classes; j++)
                d[j] = (float)(exp((double)z[j] - (double)mx) * inv) * grad_scale;
            d[label] -= grad_scale;
        }
    }
    *loss_sum = total;
    return PDP_OK;
}

/* pdp__cross_entropy with logits and dlogits on device d (CUDA: cuda_host.c). */
static pdp_status pdp__cross_entropy_on(pdp_device d, const float *logits, const int32_t *labels,
                                        int64_t batch, int64_t classes, float grad_scale,
                                        double *loss_sum, float *dlogits, const char *fn)
{
    double t0 = pdp__prof.on ? pdp__now() : 0.0;
    pdp_status st =
        d.kind == PDP_DEVICE_CUDA
            ? pdp__cuda_cross_entropy(d, logits, labels, batch, classes, grad_scale, loss_sum,
                                      dlogits, fn)
            : pdp__cross_entropy(logits, labels, batch, classes, grad_scale, loss_sum, dlogits,
                                 fn);
    if (pdp__prof.on) pdp__prof.loss_s += pdp__now() - t0;
    return st;
}

static bool pdp__loss_same_device(const pdp_tensor *a, const pdp_tensor *b)
{
    return a->device.kind == b->device.kind && a->device.ordinal == b->device.ordinal;
}

/* Shared argument checks of the public losses: a 2-D tensor [batch, classes]. */
static pdp_status pdp__loss_check_logits(const pdp_tensor *t, const char *what, const char *fn)
{
    char buf[96];
    if (t->ndim != 2)
        return pdp__err(PDP_ERR_SHAPE, "%s: %s must be [batch, classes], got %s", fn, what,
                        pdp__shape_str(t, buf, sizeof buf));
    return PDP_OK;
}

/* Shape equality for messages "dlogits is [3, 4], logits is [3, 5]". */
static bool pdp__loss_same_shape(const pdp_tensor *a, const pdp_tensor *b)
{
    int i;
    if (a->ndim != b->ndim) return false;
    for (i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return false;
    return true;
}

PDP_API pdp_status pdp_loss_cross_entropy(const pdp_tensor *logits, const int32_t *labels,
                                          float *loss, pdp_tensor *dlogits)
{
    const char *fn = "pdp_loss_cross_entropy";
    char a[96], b[96];
    double sum = 0.0;
    pdp_status st;
    if (!logits || !labels || !loss) return pdp__err(PDP_ERR_INVALID, "%s: NULL argument", fn);
    if ((st = pdp__loss_check_logits(logits, "logits", fn)) != PDP_OK) return st;
    if (dlogits) {
        if ((st = pdp__loss_check_logits(dlogits, "dlogits", fn)) != PDP_OK) return st;
        if (!pdp__loss_same_device(logits, dlogits))
            return pdp__err(PDP_ERR_DEVICE, "%s: dlogits on device %d:%d, logits on %d:%d", fn,
                            dlogits->device.kind, dlogits->device.ordinal, logits->device.kind,
                            logits->device.ordinal);
        if (!pdp__loss_same_shape(logits, dlogits))
            return pdp__err(PDP_ERR_SHAPE, "%s: dlogits is %s, logits is %s", fn,
                            pdp__shape_str(dlogits, a, sizeof a),
                            pdp__shape_str(logits, b, sizeof b));
    }
    st = pdp__cross_entropy_on(logits->device, logits->data, labels, logits->shape[0],
                               logits->shape[1], 1.0f / (float)logits->shape[0], &sum,
                               dlogits ? dlogits->data : NULL, fn);
    *loss = (float)(sum / (double)logits->shape[0]);
    return st;
}

/* ---- loss: mean squared error ---- */

PDP_API pdp_status pdp_loss_mse(const pdp_tensor *pred, const pdp_tensor *target, float *loss,
                                pdp_tensor *dpred)
{
    const char *fn = "pdp_loss_mse";
    char a[96], b[96];
    double sum = 0.0, t0;
    float scale;
    int64_t i, n;
    if (!pred || !target || !loss) return pdp__err(PDP_ERR_INVALID, "%s: NULL argument", fn);
    if (!pdp__loss_same_device(pred, target) || (dpred && !pdp__loss_same_device(pred, dpred)))
        return pdp__err(PDP_ERR_DEVICE, "%s: pred, target and dpred must be on one device", fn);
    if (!pdp__loss_same_shape(pred, target))
        return pdp__err(PDP_ERR_SHAPE, "%s: pred is %s, target is %s", fn,
                        pdp__shape_str(pred, a, sizeof a), pdp__shape_str(target, b, sizeof b));
    if (dpred && !pdp__loss_same_shape(pred, dpred))
        return pdp__err(PDP_ERR_SHAPE, "%s: dpred is %s, pred is %s", fn,
                        pdp__shape_str(dpred, a, sizeof a), pdp__shape_str(pred, b, sizeof b));
    n = pred->count;
    scale = 2.0f / (float)n;
    t0 = pdp__prof.on ? pdp__now() : 0.0;
    if (pred->device.kind == PDP_DEVICE_CUDA) {
        pdp_status st = pdp__cuda_mse(pred->device, pred->data, target->data, n, scale, &sum,
                                      dpred ? dpred->data : NULL, fn);
        if (st != PDP_OK) return st;
    }
    for (i = 0; i < n && pred->device.kind == PDP_DEVICE_CPU; i++) {
        float d = pred->data[i] - target->data[i];
        sum += (double)d * (double)d;
        if (dpred) dpred->data[i] = scale * d;
    }
    if (pdp__prof.on) pdp__prof.loss_s += pdp__now() - t0;
    *loss = (float)(sum / (double)n);
    if (*loss != *loss || *loss == HUGE_VALF)
        return pdp__err(PDP_ERR_NUMERIC, "%s: loss is %s over %lld elements", fn,
                        *loss != *loss ? "NaN" : "Inf", (long long)n);
    return PDP_OK;
}

/* ---- loss: training pass and accuracy ---- */

PDP_API pdp_status pdp_model_forward_backward(pdp_model *m, const pdp_tensor *x,
                                              const int32_t *labels, float *loss)
{
    const char *fn = "pdp_model_forward_backward";
    const pdp_tensor *y;
    pdp_tensor dy;
    double sum = 0.0;
    pdp_status st;
    if (!m || !x || !labels || !loss) return pdp__err(PDP_ERR_INVALID, "%s: NULL argument", fn);
    if ((st = pdp_model_forward(m, x, &y)) != PDP_OK) return pdp__err_wrap(st, "%s", fn);
    if (y->ndim != 2) {
        char buf[96];
        m->have_forward = false;
        return pdp__err(PDP_ERR_SHAPE, "%s: the model's output is %s; cross-entropy needs "
                        "[batch, classes] (add a Flatten and a Linear)", fn,
                        pdp__shape_str(y, buf, sizeof buf));
    }
    /* The loss gradient goes to the model's own grad_a, which backward accepts as
       dy (it ping-pongs between grad_a and grad_b): nothing is allocated. */
    st = pdp__cross_entropy_on(m->device, y->data, labels, y->shape[0], y->shape[1],
                               1.0f / (float)y->shape[0], &sum, m->grad_a, fn);
    *loss = (float)(sum / (double)y->shape[0]);
    if (st != PDP_OK) {
        m->have_forward = false;
        return st;
    }
    pdp_tensor_wrap(m->grad_a, m->device, 2, y->shape, &dy);
    if ((st = pdp_model_backward(m, &dy)) != PDP_OK) return pdp__err_wrap(st, "%s", fn);
    return PDP_OK;
}

PDP_API pdp_status pdp_count_correct(const pdp_tensor *logits, const int32_t *labels,
                                     int64_t *correct)
{
    const char *fn = "pdp_count_correct";
    int64_t i, j, classes, hits = 0;
    const float *data;
    pdp_status st;
    if (!logits || !labels || !correct) return pdp__err(PDP_ERR_INVALID, "%s: NULL argument", fn);
    *correct = 0;
    if ((st = pdp__loss_check_logits(logits, "logits", fn)) != PDP_OK) return st;
    classes = logits->shape[1];
    data = logits->data;
    if (logits->device.kind != PDP_DEVICE_CPU) { /* a host copy in this thread's scratch */
        float *host = (float *)pdp__thread_scratch((size_t)logits->count * sizeof(float));
        if (!host) return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory for a host copy", fn);
        if ((st = pdp_tensor_download(logits, host)) != PDP_OK) return pdp__err_wrap(st, "%s", fn);
        data = host;
    }
    for (i = 0; i < logits->shape[0]; i++) {
        const float *z = data + i * classes;
        int64_t best = 0;
        for (j = 1; j < classes; j++)
            if (z[j] > z[best]) best = j; /* the first maximum, as torch.argmax */
        hits += best == labels[i];
    }
    *correct = hits;
    return PDP_OK;
}
/* ---- end src/loss.c ---- */

/* ---- begin src/optim.c ---- */
/* optim: torch.optim.SGD, Adam and AdamW on the flat parameter block, gradient
   clipping by global norm (torch.nn.utils.clip_grad_norm_), and llm.c's
   warm-up + cosine learning-rate schedule.

   Invariants: the optimizer belongs to one model and to that model's parameter
   count at creation; it holds state for one range [lo, hi) of the flat block
   (all of it, [0, count), for pdp_optim_create), flat with the parameter
   block's offsets (state[k][i - lo] belongs to parameter element i), on the
   model's device:
     SGD, momentum > 0:  state[0] = momentum_buffer
     Adam, AdamW:        state[0] = exp_avg, state[1] = exp_avg_sq
   pdp_optim_create allocates it (zeroed), so a step allocates nothing. steps
   counts completed updates; the update in flight uses t = steps + 1 (Adam's bias
   corrections) and "first" = (steps == 0) (SGD's momentum buffer is the first
   d_p, as PyTorch's clone). The element formulas are the PDP__HOSTDEV helpers of
   math.h, shared with the CUDA kernels.

   ZeRO: pdp__optim_create_range allocates state for one rank's range only, and
   pdp_optim_step on such an optimizer updates that range only (checkpoint.c
   saves and loads it with pdp__checkpoint_save_range/load_range). The element
   code is the same, so a range optimizer stepping its range gives the bits of
   a full optimizer on that range. pdp__optim_step_range updates any sub-range
   of the held range; whoever calls it directly advances steps with
   pdp__optim_finish_step once every range of the step is done.

   References: torch/optim/sgd.py, adam.py, adamw.py (PyTorch 1.13 single-tensor
   path); Kingma and Ba, "Adam", ICLR 2015; Loshchilov and Hutter, "Decoupled
   Weight Decay Regularization", ICLR 2019. */

/* #include "internal.h" (already above) */

#if !defined(PDP_NO_SIMD) && (defined(__AVX__) || defined(__SSE2__))
#  include <immintrin.h>
#endif

struct pdp_optim {
    pdp_model *model;
    pdp_optim_desc desc;   /* defaults filled in, validated */
    int64_t count;         /* the model's param_count at creation */
    int64_t lo, hi;        /* the range of the flat block the state covers */
    int64_t steps;         /* completed updates */
    int nstate;            /* state buffers in use: 0, 1 or 2 */
    float *state[2];       /* hi - lo floats each, on the model's device */
    bool shard;            /* ZeRO's layout (pdp__optim_create_shard): hi floats of state
                              addressed by the executor's offsets, not the flat block's;
                              only pdp__optim_step_at steps it */
};

/* ---- optim: desc ---- */

PDP_API const char *pdp_optim_kind_name(pdp_optim_kind kind)
{
    switch (kind) {
    case PDP_OPTIM_SGD: return "SGD";
    case PDP_OPTIM_ADAM: return "Adam";
    case PDP_OPTIM_ADAMW: return "AdamW";
    }
    return "unknown";
}

/* Fills zeros with defaults and validates; fn names the public caller. NaNs fail
   every range check because each is written as !(x in range). */
static pdp_status pdp__optim_desc_resolve(const pdp_optim_desc *in, pdp_optim_desc *out,
                                          const char *fn)
{
    pdp_optim_desc d;
    bool adam;
    if (in) d = *in;
    else memset(&d, 0, sizeof d);
    if (d.kind != PDP_OPTIM_SGD && d.kind != PDP_OPTIM_ADAM && d.kind != PDP_OPTIM_ADAMW)
        return pdp__err(PDP_ERR_INVALID, "%s: kind %d is not SGD (0), Adam (1) or AdamW (2)", fn,
                        (int)d.kind);
    adam = d.kind != PDP_OPTIM_SGD;
    d.lr = PDP__DEF(d.lr, adam ? 1e-3f : 1e-2f);
    d.beta1 = PDP__DEF(d.beta1, 0.9f);
    d.beta2 = PDP__DEF(d.beta2, 0.999f);
    d.eps = PDP__DEF(d.eps, 1e-8f);
    if (!(d.lr >= 0.0f && d.lr <= FLT_MAX))
        return pdp__err(PDP_ERR_INVALID, "%s: lr %g must be finite and >= 0", fn, (double)d.lr);
    if (!(d.weight_decay >= 0.0f && d.weight_decay <= FLT_MAX))
        return pdp__err(PDP_ERR_INVALID, "%s: weight_decay %g must be finite and >= 0", fn,
                        (double)d.weight_decay);
    if (!adam) {
        if (!(d.momentum >= 0.0f && d.momentum <= FLT_MAX))
            return pdp__err(PDP_ERR_INVALID, "%s: momentum %g must be finite and >= 0", fn,
                            (double)d.momentum);
        if (!(d.dampening >= 0.0f && d.dampening <= 1.0f))
            return pdp__err(PDP_ERR_INVALID, "%s: dampening %g must be in [0, 1]", fn,
                            (double)d.dampening);
        if (d.nesterov && (d.momentum <= 0.0f || d.dampening != 0.0f))
            return pdp__err(PDP_ERR_INVALID,
                            "%s: nesterov needs momentum > 0 and dampening 0 (momentum %g, "
                            "dampening %g)", fn, (double)d.momentum, (double)d.dampening);
    } else {
        if (!(d.beta1 >= 0.0f && d.beta1 < 1.0f))
            return pdp__err(PDP_ERR_INVALID, "%s: beta1 %g must be in [0, 1)", fn, (double)d.beta1);
        if (!(d.beta2 >= 0.0f && d.beta2 < 1.0f))
            return pdp__err(PDP_ERR_INVALID, "%s: beta2 %g must be in [0, 1)", fn, (double)d.beta2);
        if (!(d.eps >= 0.0f && d.eps <= FLT_MAX))
            return pdp__err(PDP_ERR_INVALID, "%s: eps %g must be finite and >= 0", fn,
                            (double)d.eps);
    }
    *out = d;
    return PDP_OK;
}

/* How many state buffers the resolved desc d needs. */
static int pdp__optim_nstate(const pdp_optim_desc *d)
{
    if (d->kind == PDP_OPTIM_SGD) return d->momentum != 0.0f ? 1 : 0;
    return 2;
}

/* The state_dict key of state buffer k ("momentum_buffer", "exp_avg", "exp_avg_sq"). */
static const char *pdp__optim_state_name(const pdp_optim *o, int k)
{
    if (o->desc.kind == PDP_OPTIM_SGD) return "momentum_buffer";
    return k == 0 ? "exp_avg" : "exp_avg_sq";
}

/* ---- optim: lifecycle ---- */

static pdp_status pdp__optim_create_range(pdp_optim **out, pdp_model *m,
                                          const pdp_optim_desc *desc, int64_t lo, int64_t hi,
                                          const char *fn)
{
    pdp_optim *o;
    pdp_optim_desc d;
    size_t bytes;
    int k;
    pdp_status st;
    if (!out) return pdp__err(PDP_ERR_INVALID, "%s: out is NULL", fn);
    *out = NULL;
    if (!m) return pdp__err(PDP_ERR_INVALID, "%s: model is NULL", fn);
    if (!(0 <= lo && lo <= hi && hi <= m->param_count))
        return pdp__err(PDP_ERR_INVALID, "%s: range [%lld, %lld) is not inside the model's %lld "
                        "parameters", fn, (long long)lo, (long long)hi,
                        (long long)m->param_count);
    if ((st = pdp__optim_desc_resolve(desc, &d, fn)) != PDP_OK) return st;
    o = (pdp_optim *)pdp__calloc(sizeof *o);
    if (!o) return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory", fn);
    o->model = m;
    o->desc = d;
    o->count = m->param_count;
    o->lo = lo;
    o->hi = hi;
    o->nstate = pdp__optim_nstate(&d);
    bytes = (size_t)(hi - lo) * sizeof(float);
    for (k = 0; k < o->nstate; k++) {
        if ((st = pdp__dev_alloc(m->device, bytes, (void **)&o->state[k])) != PDP_OK ||
            (st = pdp__dev_memset0(m->device, o->state[k], bytes)) != PDP_OK) {
            pdp_optim_free(o);
            return pdp__err_wrap(st, "%s: %s state for %lld parameters", fn,
                                 pdp_optim_kind_name(d.kind), (long long)(hi - lo));
        }
    }
    *out = o;
    return PDP_OK;
}

/* ZeRO: state for count floats in the executor's shard layout (zero.c), stepped
   by pdp__optim_step_at only; pdp_optim_step and the full checkpoints refuse it. */
static pdp_status pdp__optim_create_shard(pdp_optim **out, pdp_model *m,
                                          const pdp_optim_desc *desc, int64_t count,
                                          const char *fn)
{
    pdp_status st = pdp__optim_create_range(out, m, desc, 0, 0, fn);
    size_t bytes = (size_t)count * sizeof(float);
    pdp_optim *o = *out;
    int k;
    if (st != PDP_OK) return st;
    o->shard = true;
    o->hi = count;
    for (k = 0; k < o->nstate; k++) {
        pdp__dev_free(m->device, o->state[k]);
        o->state[k] = NULL;
        if ((st = pdp__dev_alloc(m->device, bytes, (void **)&o->state[k])) != PDP_OK ||
            (st = pdp__dev_memset0(m->device, o->state[k], bytes)) != PDP_OK) {
            pdp_optim_free(o);
            *out = NULL;
            return pdp__err_wrap(st, "%s: %s state for a shard of %lld floats", fn,
                                 pdp_optim_kind_name(o->desc.kind), (long long)count);
        }
    }
    return PDP_OK;
}

PDP_API pdp_status pdp_optim_create(pdp_optim **out, pdp_model *m, const pdp_optim_desc *desc)
{
    return pdp__optim_create_range(out, m, desc, 0, m ? m->param_count : 0, "pdp_optim_create");
}

/* Whether o holds state for the whole block (the public functions' optimizer). */
static bool pdp__optim_is_full(const pdp_optim *o)
{
    return o->lo == 0 && o->hi == o->count && !o->shard;
}

PDP_API void pdp_optim_free(pdp_optim *o)
{
    int k;
    if (!o) return;
    for (k = 0; k < 2; k++) pdp__dev_free(o->model->device, o->state[k]);
    pdp__dealloc(o);
}

PDP_API void pdp_optim_zero_grad(pdp_optim *o)
{
    double t0 = pdp__prof.on ? pdp__now() : 0.0;
    if (o) pdp_model_zero_grad(o->model);
    if (pdp__prof.on) pdp__prof.optim_s += pdp__now() - t0;
}

PDP_API pdp_status pdp_optim_set_lr(pdp_optim *o, float lr)
{
    if (!o) return pdp__err(PDP_ERR_INVALID, "pdp_optim_set_lr: optimizer is NULL");
    if (!(lr >= 0.0f && lr <= FLT_MAX))
        return pdp__err(PDP_ERR_INVALID, "pdp_optim_set_lr: lr %g must be finite and >= 0 (the "
                        "optimizer keeps lr %g)", (double)lr, (double)o->desc.lr);
    o->desc.lr = lr;
    return PDP_OK;
}

PDP_API float pdp_optim_lr(const pdp_optim *o) { return o ? o->desc.lr : 0.0f; }
PDP_API int64_t pdp_optim_steps(const pdp_optim *o) { return o ? o->steps : 0; }

PDP_API pdp_optim_desc pdp_optim_get_desc(const pdp_optim *o)
{
    pdp_optim_desc d;
    if (o) return o->desc;
    memset(&d, 0, sizeof d);
    return d;
}

/* ---- optim: the update ---- */

static void pdp__optim_scalars_of(const pdp_optim *o, pdp__optim_scalars *s)
{
    const pdp_optim_desc *d = &o->desc;
    double t = (double)(o->steps + 1);
    memset(s, 0, sizeof *s);
    s->kind = d->kind;
    s->lr = d->lr;
    if (d->kind == PDP_OPTIM_SGD) {
        s->momentum = d->momentum;
        s->one_minus_damp = (float)(1.0 - (double)d->dampening);
        s->weight_decay = d->weight_decay;
        s->nesterov = d->nesterov;
        s->first = o->steps == 0;
        return;
    }
    s->beta1 = d->beta1;
    s->beta2 = d->beta2;
    s->one_minus_beta1 = (float)(1.0 - (double)d->beta1);
    s->one_minus_beta2 = (float)(1.0 - (double)d->beta2);
    s->step_size = (float)((double)d->lr / (1.0 - pow((double)d->beta1, t)));
    s->bc2_sqrt = (float)sqrt(1.0 - pow((double)d->beta2, t));
    s->eps = d->eps;
    s->l2 = d->kind == PDP_OPTIM_ADAM ? d->weight_decay : 0.0f;
    s->decay = d->kind == PDP_OPTIM_ADAMW ? (float)(1.0 - (double)d->lr * d->weight_decay) : 1.0f;
}

/* The CPU loops: the math.h helpers per element, in blocks of 16 with a
   fixed-count inner loop (which GCC's -O2 cost model vectorises; a loop of
   unknown count it leaves scalar), then a scalar tail. Adam takes the square
   roots of a block between its two halves with SIMD sqrt where available
   (IEEE sqrt is correctly rounded: the same bits as sqrtf). */
#define PDP__OPTIM_BLOCK 16

static void pdp__sqrt_block(float *out, const float *in)
{
#if !defined(PDP_NO_SIMD) && defined(__AVX512F__)
    _mm512_storeu_ps(out, _mm512_sqrt_ps(_mm512_loadu_ps(in)));
#elif !defined(PDP_NO_SIMD) && defined(__AVX__)
    _mm256_storeu_ps(out, _mm256_sqrt_ps(_mm256_loadu_ps(in)));
    _mm256_storeu_ps(out + 8, _mm256_sqrt_ps(_mm256_loadu_ps(in + 8)));
#elif !defined(PDP_NO_SIMD) && defined(__SSE2__)
    int j;
    for (j = 0; j < PDP__OPTIM_BLOCK; j += 4) _mm_storeu_ps(out + j, _mm_sqrt_ps(_mm_loadu_ps(in + j)));
#else
    int j;
    for (j = 0; j < PDP__OPTIM_BLOCK; j++) out[j] = sqrtf(in[j]);
#endif
}

static void pdp__sgd_loop(float *PDP__RESTRICT p, const float *PDP__RESTRICT g,
                          float *PDP__RESTRICT buf, int64_t n, const pdp__optim_scalars *s)
{
    const float lr = s->lr, mom = s->momentum, omd = s->one_minus_damp, wd = s->weight_decay;
    const int nesterov = s->nesterov, first = s->first;
    int64_t i = 0;
    int j;
    if (mom == 0.0f) {
        for (; i + PDP__OPTIM_BLOCK <= n; i += PDP__OPTIM_BLOCK)
            for (j = 0; j < PDP__OPTIM_BLOCK; j++)
                p[i + j] = pdp__sgd_update(p[i + j], g[i + j], lr, wd);
        for (; i < n; i++) p[i] = pdp__sgd_update(p[i], g[i], lr, wd);
        return;
    }
    for (; i + PDP__OPTIM_BLOCK <= n; i += PDP__OPTIM_BLOCK)
        for (j = 0; j < PDP__OPTIM_BLOCK; j++)
            p[i + j] = pdp__sgd_momentum_update(p[i + j], g[i + j], &buf[i + j], lr, mom, omd, wd,
                                                nesterov, first);
    for (; i < n; i++)
        p[i] = pdp__sgd_momentum_update(p[i], g[i], &buf[i], lr, mom, omd, wd, nesterov, first);
}

static void pdp__adam_loop(float *PDP__RESTRICT p, const float *PDP__RESTRICT g,
                           float *PDP__RESTRICT m, float *PDP__RESTRICT v, int64_t n,
                           const pdp__optim_scalars *s)
{
    const float b1 = s->beta1, omb1 = s->one_minus_beta1, b2 = s->beta2, omb2 = s->one_minus_beta2;
    const float step_size = s->step_size, bc2_sqrt = s->bc2_sqrt, eps = s->eps, l2 = s->l2;
    const float decay = s->decay;
    float sq[PDP__OPTIM_BLOCK];
    int64_t i = 0;
    int j;
    for (; i + PDP__OPTIM_BLOCK <= n; i += PDP__OPTIM_BLOCK) {
        for (j = 0; j < PDP__OPTIM_BLOCK; j++)
            pdp__adam_moments(p[i + j], g[i + j], &m[i + j], &v[i + j], b1, omb1, b2, omb2, l2);
        pdp__sqrt_block(sq, v + i);
        for (j = 0; j < PDP__OPTIM_BLOCK; j++)
            p[i + j] = pdp__adam_apply(p[i + j], m[i + j], sq[j], step_size, bc2_sqrt, eps, decay);
    }
    for (; i < n; i++)
        p[i] = pdp__adam_update(p[i], g[i], &m[i], &v[i], b1, omb1, b2, omb2, step_size, bc2_sqrt,
                                eps, l2, decay);
}

typedef struct pdp__optim_job {
    const pdp__optim_scalars *s;
    float *params;
    const float *grads;
    float *state[2];     /* state[k][i - state_lo] belongs to element i */
    int64_t state_lo;
    int64_t lo, hi;
} pdp__optim_job;

/* Elements [lo, hi) of the job, part i of n (ranges aligned to 16 floats). */
static void pdp__optim_part(void *arg, int part, int nparts)
{
    const pdp__optim_job *j = (const pdp__optim_job *)arg;
    int64_t len = j->hi - j->lo;
    int64_t per = ((len + nparts - 1) / nparts + 15) & ~(int64_t)15;
    int64_t a = j->lo + per * part, b = PDP__MIN(j->hi, a + per), sa = a - j->state_lo;
    if (a >= b) return;
    if (j->s->kind == PDP_OPTIM_SGD)
        pdp__sgd_loop(j->params + a, j->grads + a, j->state[0] ? j->state[0] + sa : NULL, b - a,
                      j->s);
    else
        pdp__adam_loop(j->params + a, j->grads + a, j->state[0] + sa, j->state[1] + sa, b - a,
                       j->s);
}

/* Below this many elements per thread, one thread is faster than waking more. */
#define PDP__OPTIM_MIN_PER_THREAD 32768

/* The job of n elements, params[i] from grads[i] with state element state_off + i of
   o's buffers, by the update scalars s. */
static void pdp__optim_job_of(const pdp_optim *o, const pdp__optim_scalars *s, float *params,
                              const float *grads, int64_t state_off, int64_t n,
                              pdp__optim_job *job)
{
    job->s = s;
    job->params = params;
    job->grads = grads;
    job->state[0] = o->state[0] ? o->state[0] + state_off : NULL;
    job->state[1] = o->state[1] ? o->state[1] + state_off : NULL;
    job->state_lo = 0;
    job->lo = 0;
    job->hi = n;
}

/* The state-offset step: n elements, params[i] from grads[i] with state element
   state_off + i of o's buffers (ZeRO: a unit's slice, the parameters in the
   model's block or the shard, the gradients in the executor's buffer). Does not
   advance steps (pdp__optim_finish_step). */
static pdp_status pdp__optim_step_at(pdp_optim *o, float *params, const float *grads,
                                     int64_t state_off, int64_t n)
{
    pdp__optim_scalars s;
    pdp__optim_job job;
    int threads;
    PDP_ASSERT(o && state_off >= 0 && n >= 0 && state_off + n <= o->hi - o->lo);
    if (n == 0) return PDP_OK;
    pdp__optim_scalars_of(o, &s);
    if (o->model->device.kind != PDP_DEVICE_CPU) /* one fused kernel (cuda_host.c) */
        return pdp__cuda_optim_update(o->model->device, &s, params, grads,
                                      o->state[0] ? o->state[0] + state_off : NULL,
                                      o->state[1] ? o->state[1] + state_off : NULL, n);
    pdp__optim_job_of(o, &s, params, grads, state_off, n, &job);
    threads = pdp__threads_for_caller();
    threads = (int)PDP__MAX(1, PDP__MIN((int64_t)threads, n / PDP__OPTIM_MIN_PER_THREAD));
    pdp__parallel_for(threads, pdp__optim_part, &job);
    return PDP_OK;
}

/* Elements [lo, hi) of the flat blocks on the calling thread, with the scalars of
   the update in flight (pdp__optim_scalars_of, taken once per update): a CPU
   optimizer stepped in many small ranges (DataParallel's fused step) without
   recomputing them per range or taking the pool. */
static void pdp__optim_update_range(const pdp_optim *o, const pdp__optim_scalars *s,
                                    float *params, const float *grads, int64_t lo, int64_t hi)
{
    pdp__optim_job job;
    PDP_ASSERT(o && o->model->device.kind == PDP_DEVICE_CPU && o->lo <= lo && lo <= hi &&
               hi <= o->hi);
    pdp__optim_job_of(o, s, params + lo, grads + lo, lo - o->lo, hi - lo, &job);
    pdp__optim_part(&job, 0, 1);
}

/* params and grads are full-size blocks: element i of each is parameter
   element i; [lo, hi) lies inside the range o holds state for. */
static pdp_status pdp__optim_step_range(pdp_optim *o, float *params, const float *grads,
                                        int64_t lo, int64_t hi)
{
    PDP_ASSERT(o && o->lo <= lo && lo <= hi && hi <= o->hi);
    return pdp__optim_step_at(o, params + lo, grads + lo, lo - o->lo, hi - lo);
}

/* Marks the update in flight as done (after every range of it). */
static void pdp__optim_finish_step(pdp_optim *o) { o->steps++; }

/* What pdp_optim_step checks before it changes anything (its messages). */
static pdp_status pdp__optim_check_step(const pdp_optim *o)
{
    const pdp_model *m;
    if (!o) return pdp__err(PDP_ERR_INVALID, "pdp_optim_step: optimizer is NULL");
    m = o->model;
    if (m->param_count != o->count)
        return pdp__err(PDP_ERR_STATE,
                        "pdp_optim_step: the model has %lld parameters, %lld when the optimizer "
                        "was created (layers added after pdp_optim_create)",
                        (long long)m->param_count, (long long)o->count);
    if (o->shard)
        return pdp__err(PDP_ERR_STATE, "pdp_optim_step: the optimizer holds a ZeRO shard "
                        "(pdp_zero_optim_create): step it with pdp_zero_step");
    if (m->param_count > 0 && (!m->param_block || !m->grad_block))
        return pdp__err(PDP_ERR_STATE, "pdp_optim_step: the model's %s sharded by ZeRO: step "
                        "with pdp_zero_step", m->grad_block ? "parameters are" : "gradients are");
    return PDP_OK;
}

PDP_API pdp_status pdp_optim_step(pdp_optim *o)
{
    pdp_model *m;
    pdp_status st;
    double t0;
    if ((st = pdp__optim_check_step(o)) != PDP_OK) return st;
    m = o->model;
    t0 = pdp__prof.on ? pdp__now() : 0.0;
    st = pdp__optim_step_range(o, m->param_block, m->grad_block, o->lo, o->hi);
    if (pdp__prof.on) pdp__prof.optim_s += pdp__now() - t0;
    if (st != PDP_OK) return pdp__err_wrap(st, "pdp_optim_step");
    pdp__optim_finish_step(o);
    return PDP_OK;
}

/* ---- optim: gradient clipping ---- */

static pdp_status pdp__grad_sumsq(const pdp_model *m, const float *g, int64_t n, double *sum,
                                  const char *fn)
{
    double s = 0.0;
    int64_t i;
    if (n <= 0) return PDP_OK;
    if (m->device.kind != PDP_DEVICE_CPU) {
        /* pdp_cuda.cu: block partial sums in double, added by the host in block order */
        pdp_status st = pdp__cuda_sumsq(m->device, g, n, &s, fn);
        if (st != PDP_OK) return st;
    } else {
        for (i = 0; i < n; i++) s += (double)g[i] * (double)g[i];
    }
    *sum += s;
    return PDP_OK;
}

static pdp_status pdp__grad_scale(const pdp_model *m, float *g, int64_t n, float coef,
                                  const char *fn)
{
    int64_t i;
    if (n <= 0) return PDP_OK;
    if (m->device.kind != PDP_DEVICE_CPU) return pdp__cuda_scale(m->device, g, n, coef, fn);
    for (i = 0; i < n; i++) g[i] *= coef;
    return PDP_OK;
}

PDP_API pdp_status pdp_clip_grad_norm(pdp_model *m, float max_norm, float *total_norm)
{
    double sum = 0.0, norm;
    float coef;
    const float *g;
    int64_t n;
    pdp_status st;
    if (total_norm) *total_norm = 0.0f;
    if (!m) return pdp__err(PDP_ERR_INVALID, "pdp_clip_grad_norm: model is NULL");
    if (!(max_norm >= 0.0f && max_norm <= FLT_MAX))
        return pdp__err(PDP_ERR_INVALID, "pdp_clip_grad_norm: max_norm %g must be finite and >= 0",
                        (double)max_norm);
    g = m->grad_block;
    n = m->param_count;
    if (!g && n)
        return pdp__err(PDP_ERR_STATE, "pdp_clip_grad_norm: the model's gradients are sharded "
                        "by ZeRO: use pdp_zero_clip_grad_norm");
    if ((st = pdp__grad_sumsq(m, g, n, &sum, "pdp_clip_grad_norm")) != PDP_OK) return st;
    norm = sqrt(sum);
    if (total_norm) *total_norm = (float)norm;
    if (!isfinite(norm))
        return pdp__err(PDP_ERR_NUMERIC, "pdp_clip_grad_norm: the gradient norm is %g", norm);
    /* torch.nn.utils.clip_grad_norm_: clip_coef = max_norm / (norm + 1e-6), clamped to 1 */
    coef = (float)((double)max_norm / (norm + 1e-6));
    if (coef >= 1.0f) return PDP_OK;
    return pdp__grad_scale(m, m->grad_block, n, coef, "pdp_clip_grad_norm");
}

/* ---- optim: learning-rate schedule ---- */

PDP_API float pdp_lr_warmup_cosine(int64_t step, int64_t warmup, int64_t total, float base_lr,
                                   float min_lr)
{
    const double pi = 3.14159265358979323846;
    double progress;
    /* no status to return: an input outside the documented ranges gives NaN (optim.h) */
    if (step < 0 || warmup < 0 || total < 0 || !(base_lr >= 0.0f && base_lr <= FLT_MAX) ||
        !(min_lr >= 0.0f && min_lr <= FLT_MAX))
        return NAN;
    if (step < warmup) return (float)((double)base_lr * (double)(step + 1) / (double)warmup);
    if (step >= total) return min_lr;
    progress = (double)(step - warmup) / (double)(total - warmup);
    return (float)((double)min_lr +
                   0.5 * ((double)base_lr - (double)min_lr) * (1.0 + cos(pi * progress)));
}
/* ---- end src/optim.c ---- */

/* ---- begin src/inflate.c ---- */
/* inflate: the gzip (RFC 1952) and DEFLATE (RFC 1951) decoder behind the data loaders.

   The inflater decodes a whole DEFLATE stream (RFC 1951: stored, fixed-Huffman
   and dynamic-Huffman blocks) from memory into one growing output buffer, so a
   back-reference is checked against everything written so far instead of a
   32 KiB window. Huffman codes decode through a 2^PDP__FAST_BITS-entry table for
   short codes and the canonical count/symbol walk (as in zlib's puff.c) for the
   rest. Bits come LSB-first from a 64-bit buffer that is topped up before each
   symbol; past the end of the input it is filled with zeros, and consuming any
   of those zeros is reported as a truncated stream. Every length, distance and
   code set is checked before use: hostile input yields PDP_ERR_FORMAT, never an
   out-of-bounds access, and the output is capped at PDP_MAX_FILE_BYTES. The
   gzip wrapper (RFC 1952) parses FEXTRA, FNAME, FCOMMENT and FHCRC, verifies
   CRC-32 and ISIZE per member, and accepts concatenated members as gzip does.
   Entry points: pdp__is_gzip (the magic) and pdp__gunzip (every member, into
   one pdp__alloc'd buffer); messages name the caller's public function and path. */

/* #include "internal.h" (already above) */

/* Largest file (after decompression) the loaders accept. */
#ifndef PDP_MAX_FILE_BYTES
#  define PDP_MAX_FILE_BYTES ((size_t)0xffffffffu)
#endif

#define PDP__FAST_BITS 10

/* ---- crc32 ---- */

/* CRC-32 of ISO 3309 / ITU-T V.42 (reflected polynomial 0xEDB88320), as gzip
   stores it. The table is built by the caller, once per decode. */
static void pdp__crc32_table(uint32_t table[256])
{
    uint32_t i, c;
    int k;
    for (i = 0; i < 256; i++) {
        c = i;
        for (k = 0; k < 8; k++) c = (c & 1) ? 0xedb88320u ^ (c >> 1) : c >> 1;
        table[i] = c;
    }
}

static uint32_t pdp__crc32(const uint32_t table[256], uint32_t crc, const uint8_t *p, size_t n)
{
    size_t i;
    crc = ~crc;
    for (i = 0; i < n; i++) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
    return ~crc;
}

/* ---- inflate: state and bit input ---- */

typedef struct pdp__huff {
    uint16_t fast[1 << PDP__FAST_BITS]; /* symbol | length << 9 for codes of at most
                                           PDP__FAST_BITS bits, by bit-reversed code; 0 = none */
    uint16_t count[16];                 /* number of codes of each length */
    uint16_t symbol[288];               /* symbols in canonical code order */
} pdp__huff;

typedef struct pdp__inflate {
    const uint8_t *in;
    size_t in_len;
    size_t pos;      /* next input byte to load; bytes past in_len are loaded as zeros */
    uint64_t bits;   /* unconsumed bits, next bit in bit 0 */
    int nbits;
    uint8_t *out;    /* pdp__alloc'd, out_cap bytes, out_len used */
    size_t out_len, out_cap;
    pdp__huff lencode, distcode;
    const char *fn, *path; /* for messages */
} pdp__inflate;

static pdp_status pdp__inf_corrupt(const pdp__inflate *s, const char *what)
{
    return pdp__err(PDP_ERR_FORMAT, "%s: %s: corrupt gzip data (%s at byte %zu)", s->fn, s->path,
                    what, s->pos - (size_t)(s->nbits / 8));
}

/* Tops the bit buffer up to at least 57 bits; fails once the stream has consumed
   any of the zero bytes that stand in for input past the end. */
static pdp_status pdp__inf_refill(pdp__inflate *s)
{
    while (s->nbits <= 56) {
        uint64_t byte = s->pos < s->in_len ? s->in[s->pos] : 0;
        s->pos++;
        s->bits |= byte << s->nbits;
        s->nbits += 8;
    }
    if (s->pos > s->in_len && (s->pos - s->in_len) * 8 > (size_t)s->nbits)
        return pdp__err(PDP_ERR_FORMAT, "%s: %s: truncated gzip data (the DEFLATE stream ends "
                        "early)", s->fn, s->path);
    return PDP_OK;
}

/* n <= 32 bits, LSB first; the caller has refilled enough. */
static uint32_t pdp__inf_bits(pdp__inflate *s, int n)
{
    uint32_t v = (uint32_t)(s->bits & ((1ull << n) - 1));
    s->bits >>= n;
    s->nbits -= n;
    return v;
}

/* Makes room for `more` output bytes, doubling the buffer. */
static pdp_status pdp__inf_room(pdp__inflate *s, size_t more)
{
    size_t need, cap;
    uint8_t *bigger;
    if (s->out_cap - s->out_len >= more) return PDP_OK;
    need = s->out_len + more;
    if (need > PDP_MAX_FILE_BYTES || need < s->out_len)
        return pdp__err(PDP_ERR_FORMAT, "%s: %s: decompresses to more than %zu bytes", s->fn,
                        s->path, (size_t)PDP_MAX_FILE_BYTES);
    cap = s->out_cap > PDP_MAX_FILE_BYTES / 2 ? PDP_MAX_FILE_BYTES : PDP__MAX(s->out_cap * 2, 4096);
    if (cap < need) cap = need;
    if (!(bigger = (uint8_t *)pdp__alloc(cap)))
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: %s: no memory for %zu decompressed bytes",
                        s->fn, s->path, cap);
    if (s->out_len) memcpy(bigger, s->out, s->out_len);
    pdp__dealloc(s->out);
    s->out = bigger;
    s->out_cap = cap;
    return PDP_OK;
}

/* ---- inflate: Huffman codes ---- */

/* Builds the code for lens[0..n). Returns 0 for a complete code, 1 for an
   incomplete one that is allowed (no code at all, or one code of length 1, as
   zlib allows), -1 for an over-subscribed or otherwise incomplete set. */
static int pdp__huff_build(pdp__huff *h, const uint8_t *lens, int n)
{
    uint16_t offs[16], next[16];
    int len, sym, left = 1, codes = 0;
    uint32_t code = 0;
    memset(h->count, 0, sizeof h->count);
    memset(h->fast, 0, sizeof h->fast);
    for (sym = 0; sym < n; sym++) h->count[lens[sym]]++;
    h->count[0] = 0;
    for (len = 1; len <= 15; len++) {
        left = (left << 1) - h->count[len];
        codes += h->count[len];
        if (left < 0) return -1;
    }
    offs[1] = 0;
    for (len = 1; len < 15; len++) offs[len + 1] = (uint16_t)(offs[len] + h->count[len]);
    for (sym = 0; sym < n; sym++)
        if (lens[sym]) h->symbol[offs[lens[sym]]++] = (uint16_t)sym;
    /* canonical codes (RFC 1951 3.2.2), bit-reversed into the fast table */
    for (len = 1; len <= 15; len++) {
        code = (code + h->count[len - 1]) << 1;
        next[len] = (uint16_t)code;
    }
    for (sym = 0; sym < n; sym++) {
        uint32_t c, rev = 0;
        int i;
        len = lens[sym];
        if (!len) continue;
        c = next[len]++;
        if (len > PDP__FAST_BITS) continue;
        for (i = 0; i < len; i++) rev |= ((c >> i) & 1u) << (len - 1 - i);
        for (; rev < (1u << PDP__FAST_BITS); rev += 1u << len)
            h->fast[rev] = (uint16_t)(sym | len << 9);
    }
    if (left == 0) return 0;
    return (codes == 0 || (codes == 1 && h->count[1] == 1)) ? 1 : -1;
}

/* The next symbol, or -1 for a bit pattern that is no code. Needs 15 bits. */
static int pdp__huff_decode(pdp__inflate *s, const pdp__huff *h)
{
    uint32_t e = h->fast[s->bits & ((1u << PDP__FAST_BITS) - 1)];
    int len, code = 0, first = 0, index = 0;
    if (e) {
        pdp__inf_bits(s, (int)(e >> 9));
        return (int)(e & 511);
    }
    for (len = 1; len <= 15; len++) { /* canonical walk, one bit at a time */
        int count = h->count[len];
        code |= (int)((s->bits >> (len - 1)) & 1);
        if (code - first < count) {
            pdp__inf_bits(s, len);
            return h->symbol[index + code - first];
        }
        index += count;
        first = (first + count) << 1;
        code <<= 1;
    }
    return -1;
}

/* ---- inflate: blocks ---- */

static const uint16_t pdp__len_base[29] = {3,  4,  5,  6,  7,  8,  9,  10, 11,  13,
                                           15, 17, 19, 23, 27, 31, 35, 43, 51,  59,
                                           67, 83, 99, 115, 131, 163, 195, 227, 258};
static const uint8_t pdp__len_extra[29] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2,
                                           2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0};
static const uint16_t pdp__dist_base[30] = {1,    2,    3,    4,    5,    7,     9,     13,
                                            17,   25,   33,   49,   65,   97,    129,   193,
                                            257,  385,  513,  769,  1025, 1537,  2049,  3073,
                                            4097, 6145, 8193, 12289, 16385, 24577};
static const uint8_t pdp__dist_extra[30] = {0, 0, 0, 0, 1, 1, 2, 2,  3,  3,  4,  4,  5,  5,  6,
                                            6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13};

static pdp_status pdp__inf_stored(pdp__inflate *s)
{
    size_t p, len;
    pdp_status st;
    pdp__inf_bits(s, s->nbits & 7); /* to a byte boundary */
    p = s->pos - (size_t)(s->nbits / 8);
    s->bits = 0;
    s->nbits = 0;
    if (p > s->in_len || s->in_len - p < 4) {
        s->pos = PDP__MIN(p, s->in_len);
        return pdp__err(PDP_ERR_FORMAT, "%s: %s: truncated gzip data (stored block header)",
                        s->fn, s->path);
    }
    len = (size_t)s->in[p] | (size_t)s->in[p + 1] << 8;
    if ((len ^ 0xffffu) != ((size_t)s->in[p + 2] | (size_t)s->in[p + 3] << 8)) {
        s->pos = p;
        return pdp__inf_corrupt(s, "stored block length and its complement disagree");
    }
    p += 4;
    s->pos = p;
    if (s->in_len - p < len)
        return pdp__err(PDP_ERR_FORMAT, "%s: %s: truncated gzip data (stored block of %zu bytes)",
                        s->fn, s->path, len);
    if ((st = pdp__inf_room(s, len)) != PDP_OK) return st;
    memcpy(s->out + s->out_len, s->in + p, len);
    s->out_len += len;
    s->pos = p + len;
    return PDP_OK;
}

/* Literals and matches until end-of-block, with the codes in s->lencode/distcode. */
static pdp_status pdp__inf_codes(pdp__inflate *s)
{
    pdp_status st;
    for (;;) {
        int sym;
        size_t len, dist;
        if ((st = pdp__inf_refill(s)) != PDP_OK) return st;
        sym = pdp__huff_decode(s, &s->lencode);
        if (sym < 256) {
            if (sym < 0) return pdp__inf_corrupt(s, "invalid literal/length code");
            if (s->out_len == s->out_cap && (st = pdp__inf_room(s, 1)) != PDP_OK) return st;
            s->out[s->out_len++] = (uint8_t)sym;
            continue;
        }
        if (sym == 256) return PDP_OK;
        sym -= 257;
        if (sym >= 29) return pdp__inf_corrupt(s, "invalid length symbol");
        len = pdp__len_base[sym] + pdp__inf_bits(s, pdp__len_extra[sym]);
        sym = pdp__huff_decode(s, &s->distcode);
        if (sym < 0 || sym >= 30) return pdp__inf_corrupt(s, "invalid distance code");
        dist = pdp__dist_base[sym] + pdp__inf_bits(s, pdp__dist_extra[sym]);
        if (dist > s->out_len) return pdp__inf_corrupt(s, "distance too far back");
        if ((st = pdp__inf_room(s, len)) != PDP_OK) return st;
        {
            uint8_t *d = s->out + s->out_len;
            const uint8_t *from = d - dist;
            size_t i;
            if (dist >= len) memcpy(d, from, len);
            else for (i = 0; i < len; i++) d[i] = from[i]; /* overlapping: repeats */
            s->out_len += len;
        }
    }
}

static pdp_status pdp__inf_fixed(pdp__inflate *s)
{
    uint8_t lens[288];
    int i;
    for (i = 0; i < 144; i++) lens[i] = 8;
    for (; i < 256; i++) lens[i] = 9;
    for (; i < 280; i++) lens[i] = 7;
    for (; i < 288; i++) lens[i] = 8;
    pdp__huff_build(&s->lencode, lens, 288);
    for (i = 0; i < 30; i++) lens[i] = 5;
    pdp__huff_build(&s->distcode, lens, 30);
    return pdp__inf_codes(s);
}

static pdp_status pdp__inf_dynamic(pdp__inflate *s)
{
    static const uint8_t order[19] = {16, 17, 18, 0, 8, 7, 9, 6, 10, 5,
                                      11, 4, 12, 3, 13, 2, 14, 1, 15};
    uint8_t lens[286 + 30];
    int nlen, ndist, ncode, i, n;
    pdp_status st;
    if ((st = pdp__inf_refill(s)) != PDP_OK) return st;
    nlen = (int)pdp__inf_bits(s, 5) + 257;
    ndist = (int)pdp__inf_bits(s, 5) + 1;
    ncode = (int)pdp__inf_bits(s, 4) + 4;
    if (nlen > 286 || ndist > 30) return pdp__inf_corrupt(s, "too many length or distance codes");
    memset(lens, 0, sizeof lens);
    for (i = 0; i < ncode; i++) {
        if ((st = pdp__inf_refill(s)) != PDP_OK) return st;
        lens[order[i]] = (uint8_t)pdp__inf_bits(s, 3);
    }
    if (pdp__huff_build(&s->lencode, lens, 19) != 0)
        return pdp__inf_corrupt(s, "incomplete code-length code");
    for (i = 0; i < nlen + ndist;) {
        int sym, rep;
        uint8_t val = 0;
        if ((st = pdp__inf_refill(s)) != PDP_OK) return st;
        sym = pdp__huff_decode(s, &s->lencode);
        if (sym < 0) return pdp__inf_corrupt(s, "invalid code-length code");
        if (sym < 16) {
            lens[i++] = (uint8_t)sym;
            continue;
        }
        if (sym == 16) {
            if (i == 0) return pdp__inf_corrupt(s, "length repeat with no previous length");
            val = lens[i - 1];
            rep = 3 + (int)pdp__inf_bits(s, 2);
        } else if (sym == 17) {
            rep = 3 + (int)pdp__inf_bits(s, 3);
        } else {
            rep = 11 + (int)pdp__inf_bits(s, 7);
        }
        if (i + rep > nlen + ndist) return pdp__inf_corrupt(s, "code lengths overrun");
        for (n = 0; n < rep; n++) lens[i++] = val;
    }
    if (lens[256] == 0) return pdp__inf_corrupt(s, "no end-of-block code");
    if (pdp__huff_build(&s->lencode, lens, nlen) < 0)
        return pdp__inf_corrupt(s, "bad literal/length code lengths");
    if (pdp__huff_build(&s->distcode, lens + nlen, ndist) < 0)
        return pdp__inf_corrupt(s, "bad distance code lengths");
    return pdp__inf_codes(s);
}

/* One DEFLATE stream starting at byte s->pos; leaves s->pos on the byte after it. */
static pdp_status pdp__inflate_stream(pdp__inflate *s)
{
    int final, type;
    size_t p;
    pdp_status st;
    s->bits = 0;
    s->nbits = 0;
    do {
        if ((st = pdp__inf_refill(s)) != PDP_OK) return st;
        final = (int)pdp__inf_bits(s, 1);
        type = (int)pdp__inf_bits(s, 2);
        if (type == 0) st = pdp__inf_stored(s);
        else if (type == 1) st = pdp__inf_fixed(s);
        else if (type == 2) st = pdp__inf_dynamic(s);
        else return pdp__inf_corrupt(s, "reserved block type 3");
        if (st != PDP_OK) return st;
    } while (!final);
    pdp__inf_bits(s, s->nbits & 7);
    p = s->pos - (size_t)(s->nbits / 8); /* hand unread whole bytes back */
    if (p > s->in_len)
        return pdp__err(PDP_ERR_FORMAT, "%s: %s: truncated gzip data", s->fn, s->path);
    s->pos = p;
    s->bits = 0;
    s->nbits = 0;
    return PDP_OK;
}

/* ---- gzip ---- */

static uint32_t pdp__le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static bool pdp__is_gzip(const uint8_t *p, size_t n) { return n >= 2 && p[0] == 0x1f && p[1] == 0x8b; }

/* Decodes every gzip member of in[0..n) into *out (pdp__alloc'd, *out_len bytes). */
static pdp_status pdp__gunzip(const uint8_t *in, size_t n, uint8_t **out, size_t *out_len,
                              const char *fn, const char *path)
{
    pdp__inflate *s;
    uint32_t crc_table[256];
    size_t p = 0, hint;
    int member = 0;
    pdp_status st = PDP_OK;
    *out = NULL;
    *out_len = 0;
    if (!(s = (pdp__inflate *)pdp__calloc(sizeof *s)))
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: %s: no memory", fn, path);
    s->in = in;
    s->in_len = n;
    s->fn = fn;
    s->path = path;
    pdp__crc32_table(crc_table);
    /* the last member's ISIZE is the whole size for a one-member file: a good first guess */
    hint = n >= 4 ? pdp__le32(in + n - 4) : 0;
    if (hint > n * 1032 + 1024) hint = n * 4;
    if ((st = pdp__inf_room(s, PDP__MAX(hint, 1))) != PDP_OK) goto done; /* out never NULL */
    while (p < n) {
        size_t start = p, first = s->out_len;
        uint8_t flg;
        if (n - p < 18 || !pdp__is_gzip(in + p, n - p)) {
            st = pdp__err(PDP_ERR_FORMAT, "%s: %s: %s at byte %zu", fn, path,
                          member ? "trailing bytes after the gzip data" : "not a gzip file", p);
            goto done;
        }
        if (in[p + 2] != 8 || (in[p + 3] & 0xe0)) {
            st = pdp__err(PDP_ERR_FORMAT, "%s: %s: unsupported gzip method %d or flags 0x%02x",
                          fn, path, in[p + 2], in[p + 3]);
            goto done;
        }
        flg = in[p + 3];
        p += 10;
        if (flg & 4) { /* FEXTRA */
            size_t xlen = n - p >= 2 ? (size_t)in[p] | (size_t)in[p + 1] << 8 : n;
            if (n - p < 2 || n - p - 2 < xlen) goto truncated;
            p += 2 + xlen;
        }
        if (flg & 8) { /* FNAME */
            const uint8_t *z = (const uint8_t *)memchr(in + p, 0, n - p);
            if (!z) goto truncated;
            p = (size_t)(z - in) + 1;
        }
        if (flg & 16) { /* FCOMMENT */
            const uint8_t *z = (const uint8_t *)memchr(in + p, 0, n - p);
            if (!z) goto truncated;
            p = (size_t)(z - in) + 1;
        }
        if (flg & 2) { /* FHCRC: the low 16 bits of the header's CRC-32 */
            if (n - p < 2) goto truncated;
            if ((pdp__crc32(crc_table, 0, in + start, p - start) & 0xffffu) !=
                ((uint32_t)in[p] | (uint32_t)in[p + 1] << 8)) {
                st = pdp__err(PDP_ERR_FORMAT, "%s: %s: gzip header CRC mismatch", fn, path);
                goto done;
            }
            p += 2;
        }
        s->pos = p;
        if ((st = pdp__inflate_stream(s)) != PDP_OK) goto done;
        p = s->pos;
        if (n - p < 8) goto truncated;
        if (pdp__crc32(crc_table, 0, s->out + first, s->out_len - first) != pdp__le32(in + p)) {
            st = pdp__err(PDP_ERR_FORMAT, "%s: %s: gzip CRC-32 mismatch (member %d): the data is "
                          "corrupt", fn, path, member);
            goto done;
        }
        if ((uint32_t)(s->out_len - first) != pdp__le32(in + p + 4)) {
            st = pdp__err(PDP_ERR_FORMAT, "%s: %s: gzip length mismatch (member %d: %zu bytes, "
                          "ISIZE says %u)", fn, path, member, s->out_len - first,
                          (unsigned)pdp__le32(in + p + 4));
            goto done;
        }
        p += 8;
        member++;
    }
    *out = s->out;
    *out_len = s->out_len;
    s->out = NULL;
    goto done;
truncated:
    st = pdp__err(PDP_ERR_FORMAT, "%s: %s: truncated gzip file (%zu bytes)", fn, path, n);
done:
    pdp__dealloc(s->out);
    pdp__dealloc(s);
    return st;
}
/* ---- end src/inflate.c ---- */

/* ---- begin src/data.c ---- */
/* data: the IDX reader, the synthetic task, the batcher. Files that start with the
   gzip magic are decoded by src/inflate.c (pdp__gunzip).

   IDX (LeCun et al., "The MNIST database"): a big-endian magic 0x0000TTDD (type
   TT = 0x08 unsigned byte, DD dimensions), DD big-endian 32-bit sizes, then the
   bytes. A dataset keeps pixels as floats, [count, features]. */

/* #include "internal.h" (already above) */

/* ---- files ---- */

/* Reads a whole file, gunzipping it when it starts with the gzip magic. */
static pdp_status pdp__read_file(const char *path, uint8_t **data, size_t *bytes, const char *fn)
{
    FILE *f;
    long size;
    uint8_t *raw;
    size_t got;
    pdp_status st;
    *data = NULL;
    *bytes = 0;
    if (!(f = fopen(path, "rb")))
        return pdp__err(PDP_ERR_IO, "%s: cannot open %s: %s", fn, path, strerror(errno));
    if (fseek(f, 0, SEEK_END) != 0 || (size = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return pdp__err(PDP_ERR_IO, "%s: cannot size %s: %s", fn, path, strerror(errno));
    }
    if ((unsigned long)size > PDP_MAX_FILE_BYTES) {
        fclose(f);
        return pdp__err(PDP_ERR_FORMAT, "%s: %s: %ld bytes is larger than PDP_MAX_FILE_BYTES", fn,
                        path, size);
    }
    if (!(raw = (uint8_t *)pdp__alloc((size_t)size))) {
        fclose(f);
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory to read %s (%ld bytes)", fn, path,
                        size);
    }
    got = fread(raw, 1, (size_t)size, f);
    fclose(f);
    if (got != (size_t)size) {
        pdp__dealloc(raw);
        return pdp__err(PDP_ERR_IO, "%s: short read from %s (%zu of %ld bytes)", fn, path, got,
                        size);
    }
    if (!pdp__is_gzip(raw, got)) {
        *data = raw;
        *bytes = got;
        return PDP_OK;
    }
    st = pdp__gunzip(raw, got, data, bytes, fn, path);
    pdp__dealloc(raw);
    return st;
}

/* ---- idx ---- */

static uint32_t pdp__be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

/* Checks an IDX header of unsigned bytes with ndim dimensions against the file
   size; fills dims and the payload pointer. */
static pdp_status pdp__idx_parse(const uint8_t *d, size_t n, int ndim, uint64_t dims[3],
                                 const uint8_t **payload, const char *fn, const char *path)
{
    uint32_t magic, want = 0x800u | (uint32_t)ndim;
    uint64_t need = 1;
    size_t head = 4 + 4 * (size_t)ndim;
    int i;
    if (n < 4)
        return pdp__err(PDP_ERR_FORMAT, "%s: %s: truncated IDX header (%zu bytes)", fn, path, n);
    magic = pdp__be32(d);
    if (magic != want)
        return pdp__err(PDP_ERR_FORMAT, "%s: %s: bad magic 0x%08x (expected 0x%08x, an IDX %s file)",
                        fn, path, (unsigned)magic, (unsigned)want, ndim == 3 ? "image" : "label");
    if (n < head)
        return pdp__err(PDP_ERR_FORMAT, "%s: %s: truncated IDX header (%zu bytes)", fn, path, n);
    for (i = 0; i < ndim; i++) {
        dims[i] = pdp__be32(d + 4 + 4 * i);
        if (i > 0 && dims[i] == 0)
            return pdp__err(PDP_ERR_FORMAT, "%s: %s: dimension %d is 0", fn, path, i);
        if (dims[i] && need > UINT64_MAX / dims[i])
            return pdp__err(PDP_ERR_FORMAT, "%s: %s: dimensions overflow", fn, path);
        need *= dims[i];
    }
    if (need != n - head) {
        if (ndim == 3)
            return pdp__err(PDP_ERR_FORMAT, "%s: %s: %s: %llu x %llu x %llu needs %llu bytes of data, "
                            "the file has %zu", fn, path, need > n - head ? "truncated" : "size mismatch",
                            (unsigned long long)dims[0], (unsigned long long)dims[1],
                            (unsigned long long)dims[2], (unsigned long long)need, n - head);
        return pdp__err(PDP_ERR_FORMAT, "%s: %s: %s: %llu labels, the file has %zu bytes of them",
                        fn, path, need > n - head ? "truncated" : "size mismatch",
                        (unsigned long long)dims[0], n - head);
    }
    *payload = d + head;
    return PDP_OK;
}

/* An empty dataset of count samples with the given per-sample shape. */
static pdp_status pdp__dataset_new(pdp_dataset **out, int64_t count, int64_t h, int64_t w,
                                   const pdp_dataset_desc *desc, const char *fn)
{
    pdp_dataset *ds;
    bool flat = desc && desc->flat;
    int64_t floats;
    *out = NULL;
    if (!pdp__mul3_ok(count, h, w, &floats) || !pdp__add_ok(floats, 1, &floats))
        return pdp__err(PDP_ERR_INVALID, "%s: %lld samples of %lldx%lld exceed %lld floats", fn,
                        (long long)count, (long long)h, (long long)w, (long long)PDP__COUNT_MAX);
    ds = (pdp_dataset *)pdp__calloc(sizeof *ds);
    if (!ds) return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory", fn);
    ds->count = count;
    ds->features = h * w;
    ds->ndim = flat ? 1 : 3;
    ds->shape[0] = flat ? h * w : 1;
    ds->shape[1] = flat ? 1 : h;
    ds->shape[2] = flat ? 1 : w;
    ds->images = (float *)pdp__alloc((size_t)floats * sizeof(float));
    ds->labels = (int32_t *)pdp__alloc((size_t)(count + 1) * sizeof(int32_t));
    if (!ds->images || !ds->labels) {
        pdp_dataset_free(ds);
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory for %lld samples of %lld floats",
                        fn, (long long)count, (long long)(h * w));
    }
    *out = ds;
    return PDP_OK;
}

static pdp_status pdp__check_desc(const pdp_dataset_desc *desc, const char *fn)
{
    if (!desc) return PDP_OK;
    if (desc->max_samples < 0)
        return pdp__err(PDP_ERR_INVALID, "%s: desc.max_samples is %lld (must be >= 0)", fn,
                        (long long)desc->max_samples);
    if (!(desc->std >= 0.0f) || !isfinite(desc->mean) || !isfinite(desc->std))
        return pdp__err(PDP_ERR_INVALID, "%s: desc.mean %g, desc.std %g (std must be >= 0)", fn,
                        (double)desc->mean, (double)desc->std);
    return PDP_OK;
}

static pdp_status pdp__load_idx(pdp_dataset **out, const char *images_path,
                                const char *labels_path, const pdp_dataset_desc *desc,
                                const char *fn)
{
    uint8_t *img = NULL, *lab = NULL;
    size_t img_bytes, lab_bytes;
    const uint8_t *px, *lb;
    uint64_t idims[3], ldims[3];
    int64_t count, features, i;
    float lut[256];
    int maxlab = -1;
    pdp_dataset *ds = NULL;
    pdp_status st;
    if ((st = pdp__read_file(images_path, &img, &img_bytes, fn)) != PDP_OK) goto done;
    if ((st = pdp__idx_parse(img, img_bytes, 3, idims, &px, fn, images_path)) != PDP_OK) goto done;
    if ((st = pdp__read_file(labels_path, &lab, &lab_bytes, fn)) != PDP_OK) goto done;
    if ((st = pdp__idx_parse(lab, lab_bytes, 1, ldims, &lb, fn, labels_path)) != PDP_OK) goto done;
    if (idims[0] != ldims[0]) {
        st = pdp__err(PDP_ERR_FORMAT, "%s: %s has %llu images but %s has %llu labels", fn,
                      images_path, (unsigned long long)idims[0], labels_path,
                      (unsigned long long)ldims[0]);
        goto done;
    }
    count = (int64_t)idims[0];
    if (desc && desc->max_samples && desc->max_samples < count) count = desc->max_samples;
    features = (int64_t)(idims[1] * idims[2]);
    if ((st = pdp__dataset_new(&ds, count, (int64_t)idims[1], (int64_t)idims[2], desc, fn)))
        goto done;
    for (i = 0; i < 256; i++) { /* one table: the same float for the same byte, always */
        float v = (float)i / 255.0f;
        lut[i] = desc && desc->std > 0 ? (v - desc->mean) / desc->std : v;
    }
    for (i = 0; i < count * features; i++) ds->images[i] = lut[px[i]];
    for (i = 0; i < count; i++) {
        ds->labels[i] = lb[i];
        if (lb[i] > maxlab) maxlab = lb[i];
    }
    ds->classes = maxlab + 1;
done:
    pdp__dealloc(img);
    pdp__dealloc(lab);
    *out = ds;
    return st;
}

PDP_API pdp_status pdp_dataset_load_idx(pdp_dataset **out, const char *images_path,
                                        const char *labels_path, const pdp_dataset_desc *desc)
{
    static const char fn[] = "pdp_dataset_load_idx";
    pdp_status st;
    if (!out) return pdp__err(PDP_ERR_INVALID, "%s: out is NULL", fn);
    *out = NULL;
    if (!images_path || !labels_path) return pdp__err(PDP_ERR_INVALID, "%s: NULL path", fn);
    if ((st = pdp__check_desc(desc, fn)) != PDP_OK) return st;
    return pdp__load_idx(out, images_path, labels_path, desc, fn);
}

/* ---- fashion-mnist ---- */

/* Looks for dir/name, then dir/name.gz; appends each path tried to `tried`. */
static bool pdp__find_file(const char *dir, const char *name, char *path, size_t cap,
                           char *tried, size_t tried_cap)
{
    static const char *const ext[2] = {"", ".gz"};
    int i;
    for (i = 0; i < 2; i++) {
        FILE *f;
        size_t used = strlen(tried);
        snprintf(path, cap, "%s/%s%s", dir, name, ext[i]);
        snprintf(tried + used, tried_cap - used, "%s%s", used ? ", " : "", path);
        if ((f = fopen(path, "rb")) != NULL) {
            fclose(f);
            return true;
        }
    }
    return false;
}

PDP_API pdp_status pdp_dataset_load_fashion_mnist(pdp_dataset **out, bool train,
                                                  const pdp_dataset_desc *desc)
{
    static const char fn[] = "pdp_dataset_load_fashion_mnist";
    const char *dir = getenv("PDP_DATA"), *split = train ? "train" : "t10k";
    char name[64], images[1024], labels[1024], tried[2600] = "";
    bool found;
    pdp_status st;
    if (!out) return pdp__err(PDP_ERR_INVALID, "%s: out is NULL", fn);
    *out = NULL;
    if ((st = pdp__check_desc(desc, fn)) != PDP_OK) return st;
    if (!dir || !*dir) dir = "/usr/share/datasets/fashion-mnist";
    snprintf(name, sizeof name, "%s-images-idx3-ubyte", split);
    found = pdp__find_file(dir, name, images, sizeof images, tried, sizeof tried);
    snprintf(name, sizeof name, "%s-labels-idx1-ubyte", split);
    found = pdp__find_file(dir, name, labels, sizeof labels, tried, sizeof tried) && found;
    if (!found)
        return pdp__err(PDP_ERR_IO, "%s: Fashion-MNIST not found (tried %s); apt-get install "
                        "dataset-fashion-mnist or set PDP_DATA to the directory that holds the "
                        "files", fn, tried);
    return pdp__load_idx(out, images, labels, desc, fn);
}

/* ---- synthetic ---- */

PDP_API pdp_status pdp_dataset_synthetic(pdp_dataset **out, bool train,
                                         const pdp_dataset_desc *desc)
{
    enum { CLASSES = 10, SIDE = 28, BLOBS = 3 };
    static const char fn[] = "pdp_dataset_synthetic";
    float *proto;
    pdp_dataset *ds;
    pdp_rng r;
    int64_t count, i;
    uint64_t seed = desc ? desc->seed : 0;
    int c, b, x, y;
    pdp_status st;
    if (!out) return pdp__err(PDP_ERR_INVALID, "%s: out is NULL", fn);
    *out = NULL;
    if ((st = pdp__check_desc(desc, fn)) != PDP_OK) return st;
    count = desc && desc->max_samples ? desc->max_samples : (train ? 60000 : 10000);
    if (!(proto = (float *)pdp__calloc(CLASSES * SIDE * SIDE * sizeof(float))))
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory", fn);
    if ((st = pdp__dataset_new(&ds, count, SIDE, SIDE, desc, fn)) != PDP_OK) {
        pdp__dealloc(proto);
        return st;
    }
    /* class prototypes, from (seed, stream 0): three blobs shared by every class plus two
       fainter ones of the class's own, so that classes overlap and the noise confuses them */
    pdp_rng_seed(&r, seed, 0);
    for (b = 0; b < CLASSES * 2 + BLOBS; b++) {
        float cx = 6 + 16 * pdp_rng_uniform(&r), cy = 6 + 16 * pdp_rng_uniform(&r);
        float sx = 1.5f + 3 * pdp_rng_uniform(&r), sy = 1.5f + 3 * pdp_rng_uniform(&r);
        float amp = b < CLASSES * 2 ? 0.25f + 0.25f * pdp_rng_uniform(&r) : 0.6f;
        for (c = 0; c < CLASSES; c++) {
            float *p = proto + c * SIDE * SIDE;
            if (b < CLASSES * 2 && b / 2 != c) continue; /* blob b belongs to class b / 2 */
            for (y = 0; y < SIDE; y++)
                for (x = 0; x < SIDE; x++) {
                    float dx = ((float)x - cx) / sx, dy = ((float)y - cy) / sy;
                    p[y * SIDE + x] += amp * expf(-0.5f * (dx * dx + dy * dy));
                }
        }
    }
    /* samples: shifted, scaled, noisy prototypes, from (seed, stream 1 or 2) */
    pdp_rng_seed(&r, seed, train ? 1 : 2);
    for (i = 0; i < count; i++) {
        float *img = ds->images + i * SIDE * SIDE;
        int label = (int)pdp_rng_below(&r, CLASSES);
        int sx = (int)pdp_rng_below(&r, 5) - 2, sy = (int)pdp_rng_below(&r, 5) - 2;
        float scale = 0.6f + 0.4f * pdp_rng_uniform(&r);
        const float *p = proto + label * SIDE * SIDE;
        ds->labels[i] = label;
        for (y = 0; y < SIDE; y++)
            for (x = 0; x < SIDE; x++) {
                int px = x - sx, py = y - sy;
                float v = (px >= 0 && px < SIDE && py >= 0 && py < SIDE) ? p[py * SIDE + px] : 0;
                v = scale * v + 0.3f * pdp_rng_normal(&r);
                v = v < 0 ? 0 : v > 1 ? 1 : v;
                if (desc && desc->std > 0) v = (v - desc->mean) / desc->std;
                img[y * SIDE + x] = v;
            }
    }
    ds->classes = CLASSES;
    pdp__dealloc(proto);
    *out = ds;
    return PDP_OK;
}

PDP_API void pdp_dataset_free(pdp_dataset *ds)
{
    if (!ds) return;
    pdp__dealloc(ds->images);
    pdp__dealloc(ds->labels);
    pdp__dealloc(ds);
}

/* ---- gather, view, permutation ---- */

PDP_API pdp_status pdp_dataset_gather(const pdp_dataset *ds, const int64_t *indices, int64_t n,
                                      float *x_out, int32_t *labels_out)
{
    int64_t i;
    if (!ds || (n > 0 && !indices) || n < 0)
        return pdp__err(PDP_ERR_INVALID, "pdp_dataset_gather: NULL dataset or indices, or n < 0");
    for (i = 0; i < n; i++)
        if (indices[i] < 0 || indices[i] >= ds->count)
            return pdp__err(PDP_ERR_INVALID, "pdp_dataset_gather: indices[%lld] = %lld is outside "
                            "[0, %lld)", (long long)i, (long long)indices[i], (long long)ds->count);
    for (i = 0; i < n; i++) {
        if (x_out)
            memcpy(x_out + i * ds->features, ds->images + indices[i] * ds->features,
                   (size_t)ds->features * sizeof(float));
        if (labels_out) labels_out[i] = ds->labels[indices[i]];
    }
    return PDP_OK;
}

/* Wraps data as [n, the dataset's sample shape...]. */
static pdp_status pdp__dataset_wrap(const pdp_dataset *ds, float *data, int64_t n, pdp_tensor *x)
{
    int64_t shape[4];
    shape[0] = n;
    memcpy(shape + 1, ds->shape, 3 * sizeof *shape);
    return pdp_tensor_wrap(data, pdp_cpu(), ds->ndim + 1, shape, x);
}

PDP_API pdp_status pdp_dataset_view(const pdp_dataset *ds, int64_t first, int64_t n,
                                    pdp_tensor *x)
{
    int64_t end = 0;
    if (!ds || !x) return pdp__err(PDP_ERR_INVALID, "pdp_dataset_view: NULL argument");
    if (first < 0 || n < 1 || !pdp__add_ok(first, n, &end))
        return pdp__err(PDP_ERR_INVALID, "pdp_dataset_view: %lld samples from sample %lld outside "
                        "[0, %lld)", (long long)n, (long long)first, (long long)ds->count);
    if (end > ds->count)
        return pdp__err(PDP_ERR_INVALID, "pdp_dataset_view: samples [%lld, %lld) outside [0, %lld)",
                        (long long)first, (long long)end, (long long)ds->count);
    return pdp__dataset_wrap(ds, ds->images + first * ds->features, n, x);
}

/* Uniform in [0, n), unbiased, for n up to 2^63. */
static uint64_t pdp__rng_below64(pdp_rng *r, uint64_t n)
{
    uint64_t x, limit;
    if (n <= 0xffffffffu) return pdp_rng_below(r, (uint32_t)n);
    limit = UINT64_MAX - UINT64_MAX % n;
    do x = (uint64_t)pdp_rng_u32(r) << 32 | pdp_rng_u32(r); while (x >= limit);
    return x % n;
}

PDP_API void pdp_permutation(int64_t *out, int64_t n, uint64_t seed, uint64_t epoch)
{
    pdp_rng r;
    int64_t i;
    if (!out) return;
    for (i = 0; i < n; i++) out[i] = i;
    pdp_rng_seed(&r, seed, epoch);
    for (i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)pdp__rng_below64(&r, (uint64_t)i + 1), t = out[i];
        out[i] = out[j];
        out[j] = t;
    }
}

/* ---- batcher ---- */

struct pdp_batcher {
    const pdp_dataset *ds;
    pdp_batcher_desc desc; /* defaults filled; desc.indices points at base */
    int64_t *base;         /* the index list: the caller's copy, or 0..count-1 */
    int64_t *order;        /* this epoch's order of base */
    int64_t len;           /* entries in base and order */
    int64_t next;          /* position in order of the next batch */
    uint64_t epoch;
    float *x;              /* [batch_size, features] */
    int32_t *labels;       /* [batch_size] */
};

PDP_API pdp_status pdp_batcher_create(pdp_batcher **out, const pdp_dataset *ds,
                                      const pdp_batcher_desc *desc)
{
    static const char fn[] = "pdp_batcher_create";
    pdp_batcher_desc d;
    pdp_batcher *b;
    int64_t i;
    if (!out) return pdp__err(PDP_ERR_INVALID, "%s: out is NULL", fn);
    *out = NULL;
    if (!ds) return pdp__err(PDP_ERR_INVALID, "%s: dataset is NULL", fn);
    if (desc) d = *desc;
    else memset(&d, 0, sizeof d);
    d.batch_size = PDP__DEF(d.batch_size, 64);
    if (d.batch_size < 1 || d.batch_size > ((int64_t)1 << 40) / PDP__MAX(ds->features, 1))
        return pdp__err(PDP_ERR_INVALID, "%s: desc.batch_size is %lld", fn, (long long)d.batch_size);
    if (d.num_indices < 0 || (d.num_indices > 0 && !d.indices))
        return pdp__err(PDP_ERR_INVALID, "%s: desc.num_indices is %lld with indices %s", fn,
                        (long long)d.num_indices, d.indices ? "set" : "NULL");
    for (i = 0; d.indices && i < d.num_indices; i++)
        if (d.indices[i] < 0 || d.indices[i] >= ds->count)
            return pdp__err(PDP_ERR_INVALID, "%s: desc.indices[%lld] = %lld is outside [0, %lld)",
                            fn, (long long)i, (long long)d.indices[i], (long long)ds->count);
    if (!(b = (pdp_batcher *)pdp__calloc(sizeof *b)))
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory", fn);
    b->ds = ds;
    b->len = d.indices ? d.num_indices : ds->count;
    b->base = (int64_t *)pdp__alloc((size_t)(b->len + 1) * sizeof(int64_t));
    b->order = (int64_t *)pdp__alloc((size_t)(b->len + 1) * sizeof(int64_t));
    b->x = (float *)pdp__alloc((size_t)(d.batch_size * ds->features) * sizeof(float));
    b->labels = (int32_t *)pdp__alloc((size_t)d.batch_size * sizeof(int32_t));
    if (!b->base || !b->order || !b->x || !b->labels) { /* the message reads b: free after */
        pdp_status st = pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory for %lld indices and a "
                                 "batch of %lld", fn, (long long)b->len, (long long)d.batch_size);
        pdp_batcher_free(b);
        return st;
    }
    for (i = 0; i < b->len; i++) b->base[i] = d.indices ? d.indices[i] : i;
    d.indices = b->base;
    d.num_indices = b->len;
    b->desc = d;
    pdp_batcher_reset(b, 0);
    *out = b;
    return PDP_OK;
}

PDP_API void pdp_batcher_free(pdp_batcher *b)
{
    if (!b) return;
    pdp__dealloc(b->base);
    pdp__dealloc(b->order);
    pdp__dealloc(b->x);
    pdp__dealloc(b->labels);
    pdp__dealloc(b);
}

PDP_API void pdp_batcher_reset(pdp_batcher *b, uint64_t epoch)
{
    int64_t i;
    if (!b) return;
    b->epoch = epoch;
    b->next = 0;
    if (!b->desc.shuffle) {
        memcpy(b->order, b->base, (size_t)b->len * sizeof(int64_t));
        return;
    }
    pdp_permutation(b->order, b->len, b->desc.seed, epoch); /* positions, then indices */
    for (i = 0; i < b->len; i++) b->order[i] = b->base[b->order[i]];
}

PDP_API bool pdp_batcher_next(pdp_batcher *b, pdp_tensor *x, const int32_t **labels, int64_t *n)
{
    int64_t k, i;
    if (n) *n = 0;
    if (!b || !x) {
        pdp__err(PDP_ERR_INVALID, "pdp_batcher_next: NULL batcher or tensor");
        return false;
    }
    k = PDP__MIN(b->desc.batch_size, b->len - b->next);
    if (k <= 0 || (b->desc.drop_last && k < b->desc.batch_size)) return false;
    for (i = 0; i < k; i++) { /* indices were checked at create */
        int64_t s = b->order[b->next + i];
        memcpy(b->x + i * b->ds->features, b->ds->images + s * b->ds->features,
               (size_t)b->ds->features * sizeof(float));
        b->labels[i] = b->ds->labels[s];
    }
    b->next += k;
    pdp__dataset_wrap(b->ds, b->x, k, x);
    if (labels) *labels = b->labels;
    if (n) *n = k;
    return true;
}

PDP_API int64_t pdp_batcher_num_batches(const pdp_batcher *b)
{
    if (!b) return 0;
    return b->desc.drop_last ? b->len / b->desc.batch_size
                             : (b->len + b->desc.batch_size - 1) / b->desc.batch_size;
}

PDP_API const int64_t *pdp_batcher_order(const pdp_batcher *b, int64_t *count)
{
    if (count) *count = b ? b->len : 0;
    return b ? b->order : NULL;
}
/* ---- end src/data.c ---- */

/* ---- begin src/sampler.c ---- */
/* sampler: torch.utils.data.DistributedSampler (declared in ddp.h).

   The permutation of epoch e is pdp_permutation(seed, e) (0..n-1 with
   no_shuffle), padded by repeating from its start (or cut with drop_last) to a
   multiple of the world size N, and rank r takes every N-th entry from r.
   Invariants: every rank with the same seed and epoch computes the same
   permutation without communicating; indices[] holds num_samples entries and is
   rewritten only by set_epoch. */

/* #include "internal.h" (already above) */

/* ---- sampler ---- */

struct pdp_dist_sampler {
    pdp_dist_sampler_desc desc;
    int64_t num_samples, total;
    int64_t *perm;      /* dataset_size */
    int64_t *indices;   /* num_samples: this rank's */
};

PDP_API pdp_status pdp_dist_sampler_create(pdp_dist_sampler **out,
                                           const pdp_dist_sampler_desc *desc)
{
    static const char *fn = "pdp_dist_sampler_create";
    pdp_dist_sampler *s;
    pdp_dist_sampler_desc dd;
    int64_t n;
    if (!out) return pdp__err(PDP_ERR_INVALID, "%s: out is NULL", fn);
    *out = NULL;
    if (!desc) return pdp__err(PDP_ERR_INVALID, "%s: desc is NULL (dataset_size is required)", fn);
    dd = *desc;
    dd.world_size = PDP__DEF(dd.world_size, 1);
    n = dd.dataset_size;
    if (n < 1) return pdp__err(PDP_ERR_INVALID, "%s: dataset_size %lld < 1", fn, (long long)n);
    if (dd.world_size < 1)
        return pdp__err(PDP_ERR_INVALID, "%s: world_size %d < 1", fn, dd.world_size);
    if (dd.rank < 0 || dd.rank >= dd.world_size)
        return pdp__err(PDP_ERR_INVALID, "%s: rank %d outside 0..%d", fn, dd.rank,
                        dd.world_size - 1);
    if (n > PDP__COUNT_MAX)
        return pdp__err(PDP_ERR_INVALID, "%s: dataset_size %lld exceeds %lld", fn, (long long)n,
                        (long long)PDP__COUNT_MAX);
    if (dd.drop_last && n < dd.world_size)
        return pdp__err(PDP_ERR_INVALID, "%s: drop_last with %lld samples for %d ranks leaves "
                        "none", fn, (long long)n, dd.world_size);
    s = (pdp_dist_sampler *)pdp__calloc(sizeof *s);
    if (!s) return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory", fn);
    s->desc = dd;
    s->num_samples = dd.drop_last ? n / dd.world_size : (n + dd.world_size - 1) / dd.world_size;
    s->total = s->num_samples * dd.world_size;
    s->perm = (int64_t *)pdp__alloc((size_t)n * sizeof *s->perm);
    s->indices = (int64_t *)pdp__alloc((size_t)s->num_samples * sizeof *s->indices);
    if (!s->perm || !s->indices) {
        pdp_dist_sampler_free(s);
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory for %lld indices", fn, (long long)n);
    }
    pdp_dist_sampler_set_epoch(s, 0);
    *out = s;
    return PDP_OK;
}

PDP_API void pdp_dist_sampler_free(pdp_dist_sampler *s)
{
    if (!s) return;
    pdp__dealloc(s->perm);
    pdp__dealloc(s->indices);
    pdp__dealloc(s);
}

PDP_API void pdp_dist_sampler_set_epoch(pdp_dist_sampler *s, uint64_t epoch)
{
    int64_t i, n;
    if (!s) return;
    n = s->desc.dataset_size;
    if (s->desc.no_shuffle)
        for (i = 0; i < n; i++) s->perm[i] = i;
    else
        pdp_permutation(s->perm, n, s->desc.seed, epoch);
    /* entry j of the padded (or cut) list is perm[j mod n]; rank r takes j = r + k N */
    for (i = 0; i < s->num_samples; i++)
        s->indices[i] = s->perm[(s->desc.rank + i * (int64_t)s->desc.world_size) % n];
}

PDP_API int64_t pdp_dist_sampler_num_samples(const pdp_dist_sampler *s)
{
    return s ? s->num_samples : 0;
}

PDP_API const int64_t *pdp_dist_sampler_indices(const pdp_dist_sampler *s, int64_t *count)
{
    if (count) *count = s ? s->num_samples : 0;
    return s ? s->indices : NULL;
}
/* ---- end src/sampler.c ---- */

/* ---- begin src/json.c ---- */
/* json: the reader of a safetensors header, a small strict JSON parser.

   Format (https://github.com/huggingface/safetensors, "Format"): the header is
   one JSON object: tensor name -> {"dtype": "F32", "shape": [..],
   "data_offsets": [begin, end]} with offsets relative to the data start, plus
   an optional "__metadata__" object of string -> string. Names are unique; the
   tensors' byte ranges must tile the data section exactly (no gap, no
   overlap); trailing spaces pad the header.

   Invariants: the parser accepts only what the format needs (objects, strings,
   non-negative integers, arrays of them), holds no recursion, and bounds every
   count by the header length; decoded strings live in one arena no longer than
   the header. Messages start with the caller's public function (fn) and name
   the file and the header byte. Used by checkpoint.c. */

/* #include "internal.h" (already above) */

#define PDP__CKPT_MAX_DIMS 16

/* ---- json: header parser ---- */

typedef struct pdp__st_entry {
    const char *name;           /* decoded, NUL-terminated, in the parser's arena */
    const char *dtype;
    int ndim;
    int64_t shape[PDP__CKPT_MAX_DIMS];
    uint64_t begin, end;        /* data_offsets */
    uint32_t crc;               /* its checksum, when has_crc (set by checkpoint.c) */
    bool has_crc;
} pdp__st_entry;

typedef struct pdp__st_parser {
    const char *s;              /* the header */
    size_t n, pos;
    char *arena;                /* decoded strings; never longer than their source */
    size_t arena_used;
    pdp__st_entry *entries;
    int nentries, cap_entries;
    const char **meta;          /* key, value, key, value, ... */
    int nmeta, cap_meta;
    const char *file;           /* for messages */
    const char *fn;             /* the public caller, for messages */
} pdp__st_parser;

static pdp_status pdp__st_fail(const pdp__st_parser *p, const char *what)
{
    return pdp__err(PDP_ERR_FORMAT, "%s: %s: header byte %zu: %s", p->fn, p->file, p->pos, what);
}

static void pdp__st_ws(pdp__st_parser *p)
{
    while (p->pos < p->n && (p->s[p->pos] == ' ' || p->s[p->pos] == '\t' ||
                             p->s[p->pos] == '\n' || p->s[p->pos] == '\r'))
        p->pos++;
}

/* Skips whitespace, then consumes c or fails. */
static bool pdp__st_expect(pdp__st_parser *p, char c)
{
    pdp__st_ws(p);
    if (p->pos < p->n && p->s[p->pos] == c) {
        p->pos++;
        return true;
    }
    return false;
}

static int pdp__st_hex(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* A JSON string, decoded into the arena as UTF-8 (\uXXXX escapes, surrogate
   pairs included). */
static pdp_status pdp__st_string(pdp__st_parser *p, const char **out)
{
    char *o = p->arena + p->arena_used;
    size_t len = 0;
    if (!pdp__st_expect(p, '"')) return pdp__st_fail(p, "expected a string");
    for (;;) {
        unsigned char c;
        if (p->pos >= p->n) return pdp__st_fail(p, "unterminated string");
        c = (unsigned char)p->s[p->pos++];
        if (c == '"') break;
        if (c < 0x20) return pdp__st_fail(p, "control character in a string");
        if (c != '\\') {
            o[len++] = (char)c;
            continue;
        }
        if (p->pos >= p->n) return pdp__st_fail(p, "unterminated escape");
        c = (unsigned char)p->s[p->pos++];
        switch (c) {
        case '"': case '\\': case '/': o[len++] = (char)c; break;
        case 'b': o[len++] = '\b'; break;
        case 'f': o[len++] = '\f'; break;
        case 'n': o[len++] = '\n'; break;
        case 'r': o[len++] = '\r'; break;
        case 't': o[len++] = '\t'; break;
        case 'u': {
            uint32_t cp = 0;
            int i, h, pair;
            for (pair = 0; pair < 2; pair++) {
                uint32_t u = 0;
                if (p->n - p->pos < 4) return pdp__st_fail(p, "short \\u escape");
                for (i = 0; i < 4; i++) {
                    if ((h = pdp__st_hex(p->s[p->pos++])) < 0)
                        return pdp__st_fail(p, "bad \\u escape");
                    u = u * 16 + (uint32_t)h;
                }
                if (pair == 0) {
                    cp = u;
                    if (u >= 0xdc00 && u <= 0xdfff) return pdp__st_fail(p, "lone low surrogate");
                    if (u < 0xd800 || u > 0xdbff) break;
                    if (p->n - p->pos < 2 || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u')
                        return pdp__st_fail(p, "lone high surrogate");
                    p->pos += 2;
                } else {
                    if (u < 0xdc00 || u > 0xdfff) return pdp__st_fail(p, "bad surrogate pair");
                    cp = 0x10000 + ((cp - 0xd800) << 10) + (u - 0xdc00);
                }
            }
            if (cp == 0) return pdp__st_fail(p, "NUL in a string");
            /* at most 4 output bytes for at least 6 (12 for a pair) input bytes */
            if (cp < 0x80) {
                o[len++] = (char)cp;
            } else if (cp < 0x800) {
                o[len++] = (char)(0xc0 | (cp >> 6));
                o[len++] = (char)(0x80 | (cp & 0x3f));
            } else if (cp < 0x10000) {
                o[len++] = (char)(0xe0 | (cp >> 12));
                o[len++] = (char)(0x80 | ((cp >> 6) & 0x3f));
                o[len++] = (char)(0x80 | (cp & 0x3f));
            } else {
                o[len++] = (char)(0xf0 | (cp >> 18));
                o[len++] = (char)(0x80 | ((cp >> 12) & 0x3f));
                o[len++] = (char)(0x80 | ((cp >> 6) & 0x3f));
                o[len++] = (char)(0x80 | (cp & 0x3f));
            }
            break;
        }
        default: return pdp__st_fail(p, "unknown escape");
        }
    }
    o[len] = '\0';
    p->arena_used += len + 1;
    *out = o;
    return PDP_OK;
}

/* A non-negative integer without sign, fraction, exponent or leading zeros. */
static pdp_status pdp__st_uint(pdp__st_parser *p, uint64_t *out)
{
    uint64_t v = 0;
    size_t start;
    pdp__st_ws(p);
    start = p->pos;
    while (p->pos < p->n && p->s[p->pos] >= '0' && p->s[p->pos] <= '9') {
        unsigned d = (unsigned)(p->s[p->pos] - '0');
        if (v > (UINT64_MAX - d) / 10) return pdp__st_fail(p, "integer overflows 64 bits");
        v = v * 10 + d;
        p->pos++;
    }
    if (p->pos == start) return pdp__st_fail(p, "expected a non-negative integer");
    if (p->s[start] == '0' && p->pos - start > 1) return pdp__st_fail(p, "leading zero");
    if (p->pos < p->n && (p->s[p->pos] == '.' || p->s[p->pos] == 'e' || p->s[p->pos] == 'E'))
        return pdp__st_fail(p, "expected an integer");
    *out = v;
    return PDP_OK;
}

/* [u, u, ...] with at most max elements. */
static pdp_status pdp__st_uint_array(pdp__st_parser *p, uint64_t *out, int max, int *count)
{
    pdp_status st;
    *count = 0;
    if (!pdp__st_expect(p, '[')) return pdp__st_fail(p, "expected '['");
    if (pdp__st_expect(p, ']')) return PDP_OK;
    for (;;) {
        if (*count == max) return pdp__st_fail(p, "array too long");
        if ((st = pdp__st_uint(p, &out[(*count)++])) != PDP_OK) return st;
        if (pdp__st_expect(p, ']')) return PDP_OK;
        if (!pdp__st_expect(p, ',')) return pdp__st_fail(p, "expected ',' or ']'");
    }
}

/* {"dtype": s, "shape": [..], "data_offsets": [b, e]}, each key exactly once. */
static pdp_status pdp__st_tensor(pdp__st_parser *p, pdp__st_entry *e)
{
    bool have_dtype = false, have_shape = false, have_offsets = false;
    uint64_t v[PDP__CKPT_MAX_DIMS];
    const char *key;
    int i, n;
    pdp_status st;
    if (!pdp__st_expect(p, '{')) return pdp__st_fail(p, "expected '{' (tensor info)");
    if (pdp__st_expect(p, '}')) return pdp__st_fail(p, "empty tensor info");
    for (;;) {
        if ((st = pdp__st_string(p, &key)) != PDP_OK) return st;
        if (!pdp__st_expect(p, ':')) return pdp__st_fail(p, "expected ':'");
        if (strcmp(key, "dtype") == 0 && !have_dtype) {
            if ((st = pdp__st_string(p, &e->dtype)) != PDP_OK) return st;
            have_dtype = true;
        } else if (strcmp(key, "shape") == 0 && !have_shape) {
            if ((st = pdp__st_uint_array(p, v, PDP__CKPT_MAX_DIMS, &n)) != PDP_OK) return st;
            for (i = 0; i < n; i++) {
                if (v[i] > (uint64_t)INT64_MAX) return pdp__st_fail(p, "dimension too large");
                e->shape[i] = (int64_t)v[i];
            }
            e->ndim = n;
            have_shape = true;
        } else if (strcmp(key, "data_offsets") == 0 && !have_offsets) {
            if ((st = pdp__st_uint_array(p, v, 2, &n)) != PDP_OK) return st;
            if (n != 2) return pdp__st_fail(p, "data_offsets needs 2 integers");
            e->begin = v[0];
            e->end = v[1];
            have_offsets = true;
        } else {
            return pdp__st_fail(p, "unknown or repeated key in tensor info");
        }
        if (pdp__st_expect(p, '}')) break;
        if (!pdp__st_expect(p, ',')) return pdp__st_fail(p, "expected ',' or '}'");
    }
    if (!have_dtype || !have_shape || !have_offsets)
        return pdp__st_fail(p, "tensor info needs dtype, shape and data_offsets");
    return PDP_OK;
}

/* {"key": "value", ...} */
static pdp_status pdp__st_metadata(pdp__st_parser *p)
{
    pdp_status st;
    if (p->meta) return pdp__st_fail(p, "__metadata__ twice");
    p->cap_meta = (int)(p->n / 6 + 1) * 2; /* "k":"v", takes at least 6 bytes */
    p->meta = (const char **)pdp__alloc((size_t)p->cap_meta * sizeof *p->meta);
    if (!p->meta) return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory", p->fn);
    if (!pdp__st_expect(p, '{')) return pdp__st_fail(p, "expected '{' (__metadata__)");
    if (pdp__st_expect(p, '}')) return PDP_OK;
    for (;;) {
        PDP_ASSERT(p->nmeta + 2 <= p->cap_meta);
        if ((st = pdp__st_string(p, &p->meta[p->nmeta])) != PDP_OK) return st;
        if (!pdp__st_expect(p, ':')) return pdp__st_fail(p, "expected ':'");
        if ((st = pdp__st_string(p, &p->meta[p->nmeta + 1])) != PDP_OK) return st;
        p->nmeta += 2;
        if (pdp__st_expect(p, '}')) return PDP_OK;
        if (!pdp__st_expect(p, ',')) return pdp__st_fail(p, "expected ',' or '}'");
    }
}

/* The whole header. Allocations (arena, entries, metadata) are freed by
   pdp__st_parser_free, also after a failure. */
static pdp_status pdp__st_parse(pdp__st_parser *p)
{
    const char *key;
    pdp_status st;
    p->arena = (char *)pdp__alloc(p->n + 1);
    /* the shortest entry, "":{"dtype":"","shape":[],"data_offsets":[0,0]}, has 45 bytes */
    p->cap_entries = (int)(p->n / 45 + 1);
    p->entries = (pdp__st_entry *)pdp__calloc((size_t)p->cap_entries * sizeof *p->entries);
    if (!p->arena || !p->entries)
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: %s: no memory for a %zu-byte header", p->fn,
                        p->file, p->n);
    if (!pdp__st_expect(p, '{')) return pdp__st_fail(p, "expected '{' (not a safetensors file?)");
    if (!pdp__st_expect(p, '}')) {
        for (;;) {
            if ((st = pdp__st_string(p, &key)) != PDP_OK) return st;
            if (!pdp__st_expect(p, ':')) return pdp__st_fail(p, "expected ':'");
            if (strcmp(key, "__metadata__") == 0) {
                if ((st = pdp__st_metadata(p)) != PDP_OK) return st;
            } else {
                pdp__st_entry *e;
                if (p->nentries == p->cap_entries) return pdp__st_fail(p, "too many tensors");
                e = &p->entries[p->nentries++];
                e->name = key;
                if ((st = pdp__st_tensor(p, e)) != PDP_OK) return st;
            }
            if (pdp__st_expect(p, '}')) break;
            if (!pdp__st_expect(p, ',')) return pdp__st_fail(p, "expected ',' or '}'");
        }
    }
    pdp__st_ws(p);
    if (p->pos != p->n) return pdp__st_fail(p, "bytes after the header object");
    return PDP_OK;
}

static void pdp__st_parser_free(pdp__st_parser *p)
{
    pdp__dealloc(p->arena);
    pdp__dealloc(p->entries);
    pdp__dealloc((void *)p->meta);
}

static const char *pdp__st_meta(const pdp__st_parser *p, const char *key)
{
    int i;
    for (i = 0; i < p->nmeta; i += 2)
        if (strcmp(p->meta[i], key) == 0) return p->meta[i + 1];
    return NULL;
}

/* Bytes per element of a safetensors dtype; 0 when unknown. */
static int pdp__st_dtype_bytes(const char *d)
{
    static const char *const names[] = {"F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8",
                                        "U64", "U32", "U16", "U8", "BOOL", "F8_E4M3", "F8_E5M2"};
    static const int bytes[] = {8, 4, 2, 2, 8, 4, 2, 1, 8, 4, 2, 1, 1, 1, 1};
    size_t i;
    for (i = 0; i < sizeof bytes / sizeof bytes[0]; i++)
        if (strcmp(d, names[i]) == 0) return bytes[i];
    return 0;
}

static int pdp__st_by_begin(const void *a, const void *b)
{
    const pdp__st_entry *x = *(const pdp__st_entry *const *)a;
    const pdp__st_entry *y = *(const pdp__st_entry *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

static int pdp__st_by_name(const void *a, const void *b)
{
    const pdp__st_entry *x = *(const pdp__st_entry *const *)a;
    const pdp__st_entry *y = *(const pdp__st_entry *const *)b;
    return strcmp(x->name, y->name);
}

/* Per-entry checks (known dtype, byte count = elements * size, inside the data),
   unique names, and exact tiling of the data section. sorted gets the entries
   by name. */
static pdp_status pdp__st_validate(const pdp__st_parser *p, uint64_t data_bytes,
                                   pdp__st_entry **sorted)
{
    const char *fn = p->fn;
    uint64_t at = 0;
    int i, d;
    for (i = 0; i < p->nentries; i++) {
        const pdp__st_entry *e = &p->entries[i];
        uint64_t bytes = (uint64_t)pdp__st_dtype_bytes(e->dtype);
        if (!bytes)
            return pdp__err(PDP_ERR_FORMAT, "%s: %s: tensor \"%s\": unknown dtype \"%s\"", fn,
                            p->file, e->name, e->dtype);
        for (d = 0; d < e->ndim; d++) {
            if (e->shape[d] && bytes > UINT64_MAX / (uint64_t)e->shape[d])
                return pdp__err(PDP_ERR_FORMAT, "%s: %s: tensor \"%s\": shape overflows", fn,
                                p->file, e->name);
            bytes *= (uint64_t)e->shape[d];
        }
        if (e->end < e->begin || e->end > data_bytes)
            return pdp__err(PDP_ERR_FORMAT,
                            "%s: %s: tensor \"%s\": data_offsets [%llu, %llu] outside the %llu "
                            "data bytes (truncated file?)", fn, p->file, e->name,
                            (unsigned long long)e->begin, (unsigned long long)e->end,
                            (unsigned long long)data_bytes);
        if (e->end - e->begin != bytes)
            return pdp__err(PDP_ERR_FORMAT,
                            "%s: %s: tensor \"%s\": data_offsets hold %llu bytes, its dtype and "
                            "shape need %llu", fn, p->file, e->name,
                            (unsigned long long)(e->end - e->begin), (unsigned long long)bytes);
        sorted[i] = &p->entries[i];
    }
    qsort(sorted, (size_t)p->nentries, sizeof *sorted, pdp__st_by_begin);
    for (i = 0; i < p->nentries; i++) {
        if (sorted[i]->begin != at)
            return pdp__err(PDP_ERR_FORMAT, "%s: %s: tensor \"%s\" starts at data byte %llu, "
                            "expected %llu (overlap or gap)", fn, p->file, sorted[i]->name,
                            (unsigned long long)sorted[i]->begin, (unsigned long long)at);
        at = sorted[i]->end;
    }
    if (at != data_bytes)
        return pdp__err(PDP_ERR_FORMAT, "%s: %s: tensors cover %llu of the %llu data bytes", fn,
                        p->file, (unsigned long long)at, (unsigned long long)data_bytes);
    qsort(sorted, (size_t)p->nentries, sizeof *sorted, pdp__st_by_name);
    for (i = 1; i < p->nentries; i++)
        if (strcmp(sorted[i - 1]->name, sorted[i]->name) == 0)
            return pdp__err(PDP_ERR_FORMAT, "%s: %s: tensor \"%s\" appears twice", fn, p->file,
                            sorted[i]->name);
    return PDP_OK;
}

static const pdp__st_entry *pdp__st_find(pdp__st_entry *const *sorted, int n, const char *name)
{
    int lo = 0, hi = n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2, c = strcmp(sorted[mid]->name, name);
        if (c == 0) return sorted[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    return NULL;
}
/* ---- end src/json.c ---- */

/* ---- begin src/checkpoint.c ---- */
/* checkpoint: safetensors files for a model's parameters and its optimizer
   state; the header is read by json.c's strict parser.

   Format (https://github.com/huggingface/safetensors, "Format"): 8 bytes
   little-endian u64 N, then N bytes of JSON, then the data (json.c checks the
   JSON and the tiling of the data section).

   Invariants. Save never exposes a half-written file: it writes
   "<path>.tmp.<pid>", fflush + fsync, rename over path, fsync the directory;
   first it removes the temporaries of path whose pid is no live process (a
   writer killed mid-save), never a live writer's.
   Load never half-applies a file: it reads the header (at most
   PDP__CKPT_MAX_HEADER bytes, and no more than the file holds), parses and
   validates every entry, reads every expected tensor into one staging buffer,
   and only then copies into the model and the optimizer.

   Checksums (safetensors has none): __metadata__ "crc32c.<tensor>" is the
   CRC-32C of the tensor's data bytes as stored, "crc32c.header" that of the
   header's parsed content (pdp__ckpt_header_crc says exactly what), so a file
   Python rewrote with our metadata still verifies. Save writes the header with
   placeholder digits, streams the data computing each tensor's CRC, then
   rewrites the sealed header in place (same length: 8 digits each). Load
   verifies a file that has any "crc32c.*" key completely (all keys present,
   the header, every tensor it reads, whole) and loads one without any
   unverified: other tools write no checksums.

   Ranges (ZeRO): pdp__checkpoint_save_range writes one rank's range [lo, hi)
   of the flat block as a shard file: flat F32 tensors "params" and
   "optim.<state>" ([hi - lo] each, either may be left out), __metadata__
   "format": "pdp-shard", "shard.lo", "shard.hi", "shard.count" (the model's
   parameter count) and the same model and optimizer keys as a full file.
   pdp__checkpoint_load_range reads a shard file of exactly that range, or the
   slice [lo, hi) of a full checkpoint (every tensor still checked; the ones
   the slice touches are read whole to verify their checksums). The public
   load refuses a shard file; the public save and load refuse a range
   optimizer. */

/* #include "internal.h" (already above) */
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#ifndef PDP__CKPT_MAX_HEADER
#  define PDP__CKPT_MAX_HEADER ((uint64_t)100 * 1000 * 1000) /* bytes */
#endif

static bool pdp__little_endian(void)
{
    const uint32_t one = 1;
    unsigned char b;
    memcpy(&b, &one, 1);
    return b == 1;
}

static void pdp__bswap32(void *data, int64_t count)
{
    unsigned char *p = (unsigned char *)data, t;
    int64_t i;
    for (i = 0; i < count; i++, p += 4) {
        t = p[0]; p[0] = p[3]; p[3] = t;
        t = p[1]; p[1] = p[2]; p[2] = t;
    }
}

/* ---- checkpoint: checksums ---- */

/* CRC-32C (Castagnoli: polynomial 0x1EDC6F41, reflected 0x82F63B78, initial
   value and final xor 0xffffffff; "123456789" gives e3069283), computed by
   slicing by 8: eight 256-entry tables, built once per save or load. */
typedef struct pdp__crc32c {
    uint32_t t[8][256];
} pdp__crc32c;

static void pdp__crc32c_init(pdp__crc32c *c)
{
    uint32_t i, v;
    int j, k;
    for (i = 0; i < 256; i++) {
        v = i;
        for (j = 0; j < 8; j++) v = (v >> 1) ^ (0x82F63B78u & (0u - (v & 1u)));
        c->t[0][i] = v;
    }
    for (k = 1; k < 8; k++)
        for (i = 0; i < 256; i++)
            c->t[k][i] = (c->t[k - 1][i] >> 8) ^ c->t[0][c->t[k - 1][i] & 0xff];
}

/* crc continued over bytes (start with 0). */
static uint32_t pdp__crc32c_update(const pdp__crc32c *c, uint32_t crc, const void *data,
                                   size_t bytes)
{
    const unsigned char *p = (const unsigned char *)data;
    crc = ~crc;
    for (; bytes >= 8; p += 8, bytes -= 8) {
        uint32_t a = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                            (uint32_t)p[3] << 24);
        uint32_t b = (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 |
                     (uint32_t)p[7] << 24;
        crc = c->t[7][a & 0xff] ^ c->t[6][(a >> 8) & 0xff] ^ c->t[5][(a >> 16) & 0xff] ^
              c->t[4][a >> 24] ^ c->t[3][b & 0xff] ^ c->t[2][(b >> 8) & 0xff] ^
              c->t[1][(b >> 16) & 0xff] ^ c->t[0][b >> 24];
    }
    for (; bytes; p++, bytes--) crc = (crc >> 8) ^ c->t[0][(crc ^ *p) & 0xff];
    return ~crc;
}

/* The 8 lowercase hex digits of v (no NUL). */
static void pdp__ckpt_hex8(char *dst, uint32_t v)
{
    static const char digits[] = "0123456789abcdef";
    int i;
    for (i = 0; i < 8; i++) dst[i] = digits[(v >> (28 - 4 * i)) & 15];
}

/* Exactly 8 lowercase hex digits: a flipped case is corruption, not the same value. */
static bool pdp__ckpt_unhex8(const char *s, uint32_t *out)
{
    uint32_t v = 0;
    int i;
    for (i = 0; i < 8; i++) {
        char c = s[i];
        if (c >= '0' && c <= '9') v = v << 4 | (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f') v = v << 4 | (uint32_t)(c - 'a' + 10);
        else return false;
    }
    if (s[8] != '\0') return false;
    *out = v;
    return true;
}

static int pdp__ckpt_by_meta_key(const void *a, const void *b)
{
    const char *const *x = *(const char *const *const *)a;
    const char *const *y = *(const char *const *const *)b;
    int c = strcmp(x[0], y[0]);
    return c ? c : strcmp(x[1], y[1]);
}

/* The header checksum ("crc32c.header"): CRC-32C of the parsed header, not of
   its bytes, so that a tool that rewrites the file with the same metadata
   (its own key order, spacing, escapes and data order) keeps it valid:
     for every __metadata__ entry but "crc32c.header", in strcmp order of the
       keys: key NUL value NUL;
     then for every tensor, in strcmp order of the names: name NUL dtype NUL,
       each dimension in decimal followed by ',', NUL.
   Strings as decoded (escapes resolved). data_offsets are left out: the tiling
   check pins them, and a tensor read from elsewhere fails its own checksum.
   sorted: the tensors by name (pdp__st_validate). A key twice is an error. */
static pdp_status pdp__ckpt_header_crc(const pdp__st_parser *p, pdp__st_entry *const *sorted,
                                       const pdp__crc32c *c, uint32_t *out)
{
    const char ***keys;
    char num[24];
    uint32_t crc = 0;
    int i, d, n = 0;
    keys = (const char ***)pdp__alloc((size_t)PDP__MAX(1, p->nmeta / 2) * sizeof *keys);
    if (!keys) return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: %s: no memory", p->fn, p->file);
    for (i = 0; i < p->nmeta; i += 2)
        if (strcmp(p->meta[i], "crc32c.header") != 0) keys[n++] = &p->meta[i];
    qsort((void *)keys, (size_t)n, sizeof *keys, pdp__ckpt_by_meta_key);
    for (i = 0; i < n; i++) {
        if (i && strcmp(keys[i - 1][0], keys[i][0]) == 0) {
            pdp_status st = pdp__err(PDP_ERR_FORMAT, "%s: %s: __metadata__ key \"%s\" appears "
                                     "twice", p->fn, p->file, keys[i][0]);
            pdp__dealloc((void *)keys);
            return st;
        }
        crc = pdp__crc32c_update(c, crc, keys[i][0], strlen(keys[i][0]) + 1);
        crc = pdp__crc32c_update(c, crc, keys[i][1], strlen(keys[i][1]) + 1);
    }
    pdp__dealloc((void *)keys);
    for (i = 0; i < p->nentries; i++) {
        const pdp__st_entry *e = sorted[i];
        crc = pdp__crc32c_update(c, crc, e->name, strlen(e->name) + 1);
        crc = pdp__crc32c_update(c, crc, e->dtype, strlen(e->dtype) + 1);
        for (d = 0; d < e->ndim; d++) {
            snprintf(num, sizeof num, "%lld,", (long long)e->shape[d]);
            crc = pdp__crc32c_update(c, crc, num, strlen(num));
        }
        crc = pdp__crc32c_update(c, crc, "", 1);
    }
    *out = crc;
    return PDP_OK;
}

/* ---- checkpoint: save ---- */

/* Appends printf output to a bounded buffer; *ok turns false on overflow. */
static void pdp__ckpt_put(char *buf, size_t cap, size_t *len, bool *ok, const char *fmt, ...)
{
    va_list ap;
    int n;
    if (!*ok) return;
    va_start(ap, fmt);
    n = vsnprintf(buf + *len, cap - *len, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= cap - *len) *ok = false;
    else *len += (size_t)n;
}

/* One tensor of a file, in data order. shard: "params" (when with_params),
   then "optim.<state>", each the flat range [lo, hi); otherwise every
   parameter by its state_dict name, then per state "optim.<param>.<state>". */
typedef struct pdp__ckpt_tensor {
    char name[96];
    int state;                          /* -1: parameters; else o's state index */
    int64_t offset, count;              /* elements [offset, offset + count) of the block */
    const pdp__param_entry *param;      /* its parameter; NULL in a shard file */
} pdp__ckpt_tensor;

static int pdp__ckpt_ntensors(const pdp_model *m, const pdp_optim *o, bool with_params,
                              bool shard)
{
    int ns = o ? o->nstate : 0;
    return shard ? (with_params ? 1 : 0) + ns : m->nparams * (1 + ns);
}

static void pdp__ckpt_tensor_at(const pdp_model *m, const pdp_optim *o, bool with_params,
                                int64_t lo, int64_t hi, bool shard, int t, pdp__ckpt_tensor *r)
{
    if (shard) {
        r->state = with_params ? t - 1 : t;
        r->offset = lo;
        r->count = hi - lo;
        r->param = NULL;
        if (r->state < 0) snprintf(r->name, sizeof r->name, "params");
        else snprintf(r->name, sizeof r->name, "optim.%s", pdp__optim_state_name(o, r->state));
        return;
    }
    r->state = t / m->nparams - 1;
    r->param = &m->params[t % m->nparams];
    r->offset = r->param->offset;
    r->count = r->param->count;
    if (r->state < 0) snprintf(r->name, sizeof r->name, "%s", r->param->name);
    else snprintf(r->name, sizeof r->name, "optim.%s.%s", r->param->name,
                  pdp__optim_state_name(o, r->state));
}

/* The header JSON, padded with spaces to a multiple of 8 bytes, its checksums
   "00000000" placeholders: crc_at[0] gets the offset of the header checksum's
   digits, crc_at[1 + t] those of tensor t's. Parameter names are
   "<layer>.<weight|bias>": nothing in them needs escaping. */
static pdp_status pdp__ckpt_header(const pdp_model *m, const pdp_optim *o, bool with_params,
                                   int64_t lo, int64_t hi, bool shard, char **out, size_t *len,
                                   size_t *crc_at)
{
    int nt = pdp__ckpt_ntensors(m, o, with_params, shard), t, d;
    size_t cap = 2048 + (size_t)nt * 384, n = 0;
    char *h = (char *)pdp__alloc(cap);
    pdp__ckpt_tensor r;
    bool ok = true;
    uint64_t at = 0;
    if (!h) return pdp__err(PDP_ERR_OUT_OF_MEMORY, "no memory for the header");
    pdp__ckpt_put(h, cap, &n, &ok,
                  "{\"__metadata__\":{\"format\":\"%s\",\"pdp_version\":\"%s\","
                  "\"model.seed\":\"%llu\",\"model.step\":\"%llu\"",
                  shard ? "pdp-shard" : "pdp", PDP_VERSION_STRING, (unsigned long long)m->seed,
                  (unsigned long long)m->step);
    if (shard)
        pdp__ckpt_put(h, cap, &n, &ok, ",\"shard.lo\":\"%lld\",\"shard.hi\":\"%lld\","
                      "\"shard.count\":\"%lld\"", (long long)lo, (long long)hi,
                      (long long)m->param_count);
    if (o) {
        const pdp_optim_desc *dd = &o->desc;
        pdp__ckpt_put(h, cap, &n, &ok,
                      ",\"optim.kind\":\"%s\",\"optim.steps\":\"%lld\",\"optim.lr\":\"%.9g\","
                      "\"optim.momentum\":\"%.9g\",\"optim.dampening\":\"%.9g\","
                      "\"optim.nesterov\":\"%s\",\"optim.weight_decay\":\"%.9g\","
                      "\"optim.beta1\":\"%.9g\",\"optim.beta2\":\"%.9g\",\"optim.eps\":\"%.9g\"",
                      pdp_optim_kind_name(dd->kind), (long long)o->steps, (double)dd->lr,
                      (double)dd->momentum, (double)dd->dampening, dd->nesterov ? "true" : "false",
                      (double)dd->weight_decay, (double)dd->beta1, (double)dd->beta2,
                      (double)dd->eps);
    }
    for (t = -1; t < nt; t++) {
        if (t < 0) {
            pdp__ckpt_put(h, cap, &n, &ok, ",\"crc32c.header\":\"");
        } else {
            pdp__ckpt_tensor_at(m, o, with_params, lo, hi, shard, t, &r);
            pdp__ckpt_put(h, cap, &n, &ok, ",\"crc32c.%s\":\"", r.name);
        }
        crc_at[1 + t] = n;
        pdp__ckpt_put(h, cap, &n, &ok, "00000000\"");
    }
    pdp__ckpt_put(h, cap, &n, &ok, "}");
    for (t = 0; t < nt; t++) {
        pdp__ckpt_tensor_at(m, o, with_params, lo, hi, shard, t, &r);
        pdp__ckpt_put(h, cap, &n, &ok, ",\"%s\":{\"dtype\":\"F32\",\"shape\":[", r.name);
        if (r.param)
            for (d = 0; d < r.param->ndim; d++)
                pdp__ckpt_put(h, cap, &n, &ok, "%s%lld", d ? "," : "",
                              (long long)r.param->shape[d]);
        else
            pdp__ckpt_put(h, cap, &n, &ok, "%lld", (long long)r.count);
        pdp__ckpt_put(h, cap, &n, &ok, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)at,
                      (unsigned long long)(at + (uint64_t)r.count * 4));
        at += (uint64_t)r.count * 4;
    }
    pdp__ckpt_put(h, cap, &n, &ok, "}");
    while (ok && n % 8) pdp__ckpt_put(h, cap, &n, &ok, " ");
    if (!ok) {
        pdp__dealloc(h);
        return pdp__err(PDP_ERR_INVALID, "header longer than %zu bytes", cap);
    }
    *out = h;
    *len = n;
    return PDP_OK;
}

/* Fills in the header's checksums: tensor t's from crcs[t], then the header's
   own, computed from the header as pdp__ckpt_header_crc reads it back. */
static pdp_status pdp__ckpt_header_seal(char *h, size_t len, const size_t *crc_at,
                                        const uint32_t *crcs, int nt, uint64_t data_bytes,
                                        const pdp__crc32c *c, const char *fn, const char *path)
{
    pdp__st_parser p;
    pdp__st_entry **sorted = NULL;
    uint32_t hcrc = 0;
    pdp_status st;
    int t;
    for (t = 0; t < nt; t++) pdp__ckpt_hex8(h + crc_at[1 + t], crcs[t]);
    memset(&p, 0, sizeof p);
    p.s = h;
    p.n = len;
    p.file = path;
    p.fn = fn;
    if ((st = pdp__st_parse(&p)) == PDP_OK) {
        sorted = (pdp__st_entry **)pdp__alloc((size_t)PDP__MAX(1, p.nentries) * sizeof *sorted);
        if (!sorted) st = pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: %s: no memory", fn, path);
    }
    if (st == PDP_OK) st = pdp__st_validate(&p, data_bytes, sorted);
    if (st == PDP_OK) st = pdp__ckpt_header_crc(&p, sorted, c, &hcrc);
    if (st == PDP_OK) pdp__ckpt_hex8(h + crc_at[0], hcrc);
    pdp__dealloc(sorted);
    pdp__st_parser_free(&p);
    return st;
}

/* Writes count floats from dev memory, staging through host (when the data is
   not on the CPU or the host is big-endian); *crc gets the bytes' CRC-32C. */
static bool pdp__ckpt_write_floats(FILE *f, pdp_device dev, const float *data, int64_t count,
                                   float *host, const pdp__crc32c *c, uint32_t *crc)
{
    *crc = 0;
    if (!count) return true;
    if (dev.kind == PDP_DEVICE_CPU && !host) {
        *crc = pdp__crc32c_update(c, 0, data, (size_t)count * 4);
        return fwrite(data, 4, (size_t)count, f) == (size_t)count;
    }
    if (pdp__dev_copy(pdp_cpu(), host, dev, data, (size_t)count * 4) != PDP_OK) return false;
    if (!pdp__little_endian()) pdp__bswap32(host, count);
    *crc = pdp__crc32c_update(c, 0, host, (size_t)count * 4);
    return fwrite(host, 4, (size_t)count, f) == (size_t)count;
}

/* The directory part of path ("." for none); false when it does not fit. */
static bool pdp__ckpt_dirname(const char *path, char *dir, size_t cap)
{
    const char *slash = strrchr(path, '/');
    size_t n;
    if (!slash) {
        strcpy(dir, ".");
    } else {
        n = (size_t)(slash - path);
        if (n == 0) n = 1; /* "/file" */
        if (n >= cap) return false;
        memcpy(dir, path, n);
        dir[n] = '\0';
    }
    return true;
}

/* fsyncs the directory holding path, so the rename itself is durable. */
static int pdp__ckpt_sync_dir(const char *path)
{
    char dir[4096];
    int fd, rc;
    if (!pdp__ckpt_dirname(path, dir, sizeof dir)) return 0;
    fd = open(dir, O_RDONLY);
    if (fd < 0) return -1;
    rc = fsync(fd);
    if (rc != 0 && (errno == EINVAL || errno == EROFS)) rc = 0; /* not supported there */
    close(fd);
    return rc;
}

/* Removes the temporaries "<path>.tmp.<pid>" that writers of path killed
   mid-save left behind: only those whose pid names no live process
   (kill(pid, 0) fails with ESRCH), never another live writer's, nor ours.
   Best effort: what cannot be listed or removed stays. (A pid is a local
   name: on a filesystem shared between machines, writers of one path on two
   machines are not told apart; ranks write their own paths.) */
static void pdp__ckpt_remove_stale(const char *path)
{
    char dir[4096];
    const char *base = strrchr(path, '/'), *s;
    struct dirent *e;
    size_t blen;
    DIR *d;
    base = base ? base + 1 : path;
    blen = strlen(base);
    if (!blen || !pdp__ckpt_dirname(path, dir, sizeof dir) || !(d = opendir(dir))) return;
    while ((e = readdir(d)) != NULL) {
        long pid = 0;
        if (strncmp(e->d_name, base, blen) != 0 || strncmp(e->d_name + blen, ".tmp.", 5) != 0)
            continue;
        for (s = e->d_name + blen + 5; *s >= '0' && *s <= '9' && pid <= INT_MAX / 10; s++)
            pid = pid * 10 + (*s - '0');
        if (*s || s == e->d_name + blen + 5 || pid <= 0 || pid > INT_MAX ||
            (pid_t)pid == getpid())
            continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue; /* alive (or EPERM: alive) */
        unlinkat(dirfd(d), e->d_name, 0);
    }
    closedir(d);
}

/* Writes the parameters [lo, hi) (params holds them; skipped unless
   with_params) and o's state for [lo, hi) (o may be NULL) as a full
   checkpoint (shard false: lo = 0, hi = param_count) or a shard file: the
   header with placeholder checksums, the data (each tensor's CRC-32C taken
   from the bytes written), then the sealed header over the first. */
static pdp_status pdp__ckpt_save(const char *path, const pdp_model *m, const float *params,
                                 bool with_params, const pdp_optim *o, int64_t lo, int64_t hi,
                                 bool shard, const char *fn)
{
    int nt = pdp__ckpt_ntensors(m, o, with_params, shard);
    bool staged = m->device.kind != PDP_DEVICE_CPU || !pdp__little_endian();
    char *header = NULL, *tmp = NULL;
    unsigned char len8[8];
    size_t hlen = 0, tmp_bytes, *crc_at = NULL;
    uint32_t *crcs = NULL;
    uint64_t data_bytes = 0;
    pdp__crc32c *crc = NULL;
    pdp__ckpt_tensor r;
    float *host = NULL;
    FILE *f = NULL;
    const char *failed = NULL;
    int k, t, err = 0;
    pdp_status st;
    crc_at = (size_t *)pdp__alloc((size_t)(nt + 1) * sizeof *crc_at);
    crcs = (uint32_t *)pdp__alloc((size_t)PDP__MAX(1, nt) * sizeof *crcs);
    crc = (pdp__crc32c *)pdp__alloc(sizeof *crc);
    tmp_bytes = strlen(path) + 32;
    tmp = (char *)pdp__alloc(tmp_bytes);
    if (staged) host = (float *)pdp__alloc((size_t)PDP__MAX(1, hi - lo) * 4);
    if (!crc_at || !crcs || !crc || !tmp || (staged && !host)) {
        st = pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: %s: no memory", fn, path);
        goto done;
    }
    if ((st = pdp__ckpt_header(m, o, with_params, lo, hi, shard, &header, &hlen, crc_at)) !=
        PDP_OK) {
        st = pdp__err_wrap(st, "%s: %s", fn, path);
        goto done;
    }
    pdp__crc32c_init(crc);
    pdp__ckpt_remove_stale(path);
    snprintf(tmp, tmp_bytes, "%s.tmp.%ld", path, (long)getpid());
    for (k = 0; k < 8; k++) len8[k] = (unsigned char)((uint64_t)hlen >> (8 * k));

    if (!(f = fopen(tmp, "wb"))) {
        failed = "fopen";
        goto io_error;
    }
    if (fwrite(len8, 1, 8, f) != 8 || fwrite(header, 1, hlen, f) != hlen) {
        failed = "write";
        goto io_error;
    }
    for (t = 0; t < nt; t++) {
        const float *src;
        pdp__ckpt_tensor_at(m, o, with_params, lo, hi, shard, t, &r);
        src = r.state < 0 ? params + (r.offset - lo) : o->state[r.state] + (r.offset - o->lo);
        if (!pdp__ckpt_write_floats(f, m->device, src, r.count, host, crc, &crcs[t])) {
            failed = "write";
            goto io_error;
        }
        data_bytes += (uint64_t)r.count * 4;
    }
    if ((st = pdp__ckpt_header_seal(header, hlen, crc_at, crcs, nt, data_bytes, crc, fn,
                                    path)) != PDP_OK) {
        fclose(f);
        remove(tmp);
        goto done;
    }
    if (fseek(f, 8, SEEK_SET) != 0 || fwrite(header, 1, hlen, f) != hlen) {
        failed = "write";
        goto io_error;
    }
    if (fflush(f) != 0) {
        failed = "fflush";
        goto io_error;
    }
    if (fsync(fileno(f)) != 0) {
        failed = "fsync";
        goto io_error;
    }
    k = fclose(f);
    f = NULL;
    if (k != 0) {
        failed = "fclose";
        goto io_error;
    }
    if (rename(tmp, path) != 0) {
        failed = "rename";
        goto io_error;
    }
    st = PDP_OK;
    if (pdp__ckpt_sync_dir(path) != 0)
        st = pdp__err(PDP_ERR_IO, "%s: %s: written, but fsync of its directory failed: %s", fn,
                      path, strerror(errno));
    goto done;
io_error:
    err = errno;
    if (f) fclose(f);
    remove(tmp);
    st = pdp__err(PDP_ERR_IO, "%s: %s: %s of %s failed: %s (the previous file, if any, is "
                  "unchanged)", fn, path, failed, tmp, err ? strerror(err) : "short write");
done:
    pdp__dealloc(header);
    pdp__dealloc(host);
    pdp__dealloc(tmp);
    pdp__dealloc(crc_at);
    pdp__dealloc(crcs);
    pdp__dealloc(crc);
    return st;
}

/* The whole-model calls' arguments: a plain model (not TP slices) and an optimizer
   holding the state of every parameter. fn ends in _save or _load, which names the
   TP function to call instead. */
static pdp_status pdp__ckpt_whole_args(const char *path, const pdp_model *m, const pdp_optim *o,
                                       const char *fn)
{
    if (!path || !m) return pdp__err(PDP_ERR_INVALID, "%s: NULL argument", fn);
    if (m->tp.nlayers)
        return pdp__err(PDP_ERR_STATE, "%s: %s: the model has %d tensor-parallel layers, so its "
                        "parameters are this rank's slices; use pdp_tp_checkpoint_%s "
                        "(collective) for the full tensors", fn, path, m->tp.nlayers,
                        strstr(fn, "_save") ? "save" : "load");
    if (o && o->count != m->param_count)
        return pdp__err(PDP_ERR_SHAPE, "%s: %s: the optimizer holds state for %lld parameters, "
                        "the model has %lld", fn, path, (long long)o->count,
                        (long long)m->param_count);
    if (o && !pdp__optim_is_full(o))
        return pdp__err(PDP_ERR_STATE, "%s: %s: the optimizer holds state for [%lld, %lld) of "
                        "the %lld parameters only (a ZeRO shard)", fn, path, (long long)o->lo,
                        (long long)o->hi, (long long)o->count);
    return PDP_OK;
}

PDP_API pdp_status pdp_checkpoint_save(const char *path, const pdp_model *m, const pdp_optim *o)
{
    const char *fn = "pdp_checkpoint_save";
    pdp_status st;
    if ((st = pdp__ckpt_whole_args(path, m, o, fn)) != PDP_OK) return st;
    return pdp__ckpt_save(path, m, m->param_block, true, o, 0, m->param_count, false, fn);
}

/* Checks a range call's arguments: [lo, hi) inside the model, o's range
   containing it, something to save or load. */
static pdp_status pdp__ckpt_range_args(const char *path, const pdp_model *m, const float *params,
                                       const pdp_optim *o, int64_t lo, int64_t hi, const char *fn)
{
    if (!path || !m) return pdp__err(PDP_ERR_INVALID, "%s: NULL argument", fn);
    if (!params && !o)
        return pdp__err(PDP_ERR_INVALID, "%s: %s: neither parameters nor an optimizer", fn, path);
    if (!(0 <= lo && lo <= hi && hi <= m->param_count))
        return pdp__err(PDP_ERR_INVALID, "%s: %s: range [%lld, %lld) is not inside the model's "
                        "%lld parameters", fn, path, (long long)lo, (long long)hi,
                        (long long)m->param_count);
    if (o && (o->count != m->param_count || lo < o->lo || hi > o->hi))
        return pdp__err(PDP_ERR_SHAPE, "%s: %s: the optimizer holds state for [%lld, %lld) of "
                        "%lld parameters, not for [%lld, %lld) of %lld", fn, path,
                        (long long)o->lo, (long long)o->hi, (long long)o->count, (long long)lo,
                        (long long)hi, (long long)m->param_count);
    return PDP_OK;
}

static pdp_status pdp__checkpoint_save_range(const char *path, const pdp_model *m,
                                             const float *params, const pdp_optim *o,
                                             int64_t lo, int64_t hi, const char *fn)
{
    pdp_status st = pdp__ckpt_range_args(path, m, params, o, lo, hi, fn);
    if (st != PDP_OK) return st;
    return pdp__ckpt_save(path, m, params, params != NULL, o, lo, hi, true, fn);
}

/* ---- checkpoint: load ---- */

/* A float from a metadata string ("%.9g" on save); false when absent or bad. */
static bool pdp__ckpt_meta_float(const pdp__st_parser *p, const char *key, float *out)
{
    const char *s = pdp__st_meta(p, key);
    char *end;
    double v;
    if (!s || !*s) return false;
    v = strtod(s, &end);
    if (*end || !isfinite(v) || fabs(v) > FLT_MAX) return false;
    *out = (float)v;
    return true;
}

/* The optimizer part of the metadata: o's kind, steps and hyper-parameters. */
static pdp_status pdp__ckpt_read_optim(const pdp__st_parser *p, const pdp_optim *o,
                                       pdp_optim_desc *desc, int64_t *steps)
{
    const char *fn = p->fn, *kind = pdp__st_meta(p, "optim.kind");
    const char *s = pdp__st_meta(p, "optim.steps"), *nest = pdp__st_meta(p, "optim.nesterov");
    static const char *const keys[] = {"optim.lr", "optim.momentum", "optim.dampening",
                                       "optim.weight_decay", "optim.beta1", "optim.beta2",
                                       "optim.eps"};
    float *fields[7];
    pdp_optim_desc d, resolved;
    char *end, where[512];
    long long n;
    int i;
    if (!kind)
        return pdp__err(PDP_ERR_FORMAT, "%s: %s: no optimizer state in the file (no \"optim.kind\" "
                        "in __metadata__)", fn, p->file);
    if (strcmp(kind, pdp_optim_kind_name(o->desc.kind)) != 0)
        return pdp__err(PDP_ERR_FORMAT, "%s: %s: the file holds %s state, the optimizer is %s", fn,
                        p->file, kind, pdp_optim_kind_name(o->desc.kind));
    d = o->desc;
    fields[0] = &d.lr; fields[1] = &d.momentum; fields[2] = &d.dampening;
    fields[3] = &d.weight_decay; fields[4] = &d.beta1; fields[5] = &d.beta2; fields[6] = &d.eps;
    for (i = 0; i < 7; i++)
        if (!pdp__ckpt_meta_float(p, keys[i], fields[i]))
            return pdp__err(PDP_ERR_FORMAT, "%s: %s: __metadata__ \"%s\" is missing or not a "
                            "finite number", fn, p->file, keys[i]);
    if (!nest || (strcmp(nest, "true") != 0 && strcmp(nest, "false") != 0))
        return pdp__err(PDP_ERR_FORMAT, "%s: %s: __metadata__ \"optim.nesterov\" must be \"true\" "
                        "or \"false\"", fn, p->file);
    d.nesterov = strcmp(nest, "true") == 0;
    errno = 0;
    n = s ? strtoll(s, &end, 10) : -1;
    if (!s || !*s || *end || errno || n < 0)
        return pdp__err(PDP_ERR_FORMAT, "%s: %s: __metadata__ \"optim.steps\" is missing or not a "
                        "count", fn, p->file);
    /* resolve's message then starts with where, and so with fn */
    snprintf(where, sizeof where, "%s: %s: __metadata__", fn, p->file);
    if (pdp__optim_desc_resolve(&d, &resolved, where) != PDP_OK) return PDP_ERR_FORMAT;
    if (pdp__optim_nstate(&resolved) != o->nstate)
        return pdp__err(PDP_ERR_FORMAT, "%s: %s: the file's %s (momentum %g) keeps %d state "
                        "tensors per parameter, the optimizer %d", fn, p->file, kind,
                        (double)d.momentum, pdp__optim_nstate(&resolved), o->nstate);
    resolved.lr = d.lr; /* 0 is a valid learning rate (e.g. the end of a schedule) */
    *desc = resolved;
    *steps = (int64_t)n;
    return PDP_OK;
}

/* An optional unsigned metadata count ("model.seed", "model.step"): *present
   tells whether the key exists; false when it exists but is not a count. */
static bool pdp__ckpt_meta_u64(const pdp__st_parser *p, const char *key, uint64_t *out,
                               bool *present)
{
    const char *s = pdp__st_meta(p, key);
    char *end;
    unsigned long long v;
    *present = s != NULL;
    if (!s) return true;
    if (*s < '0' || *s > '9') return false;
    errno = 0;
    v = strtoull(s, &end, 10);
    if (*end || errno) return false;
    *out = (uint64_t)v;
    return true;
}

/* Whether a tensor name of the file is one load expects (or may ignore). */
static bool pdp__ckpt_expected(const pdp_model *m, const pdp_optim *o, const char *name)
{
    int i, k;
    size_t len;
    if (strncmp(name, "optim.", 6) == 0) {
        if (!o) return true; /* ignored */
        name += 6;
        for (i = 0; i < m->nparams; i++) {
            len = strlen(m->params[i].name);
            if (strncmp(name, m->params[i].name, len) != 0 || name[len] != '.') continue;
            for (k = 0; k < o->nstate; k++)
                if (strcmp(name + len + 1, pdp__optim_state_name(o, k)) == 0) return true;
        }
        return false;
    }
    for (i = 0; i < m->nparams; i++)
        if (strcmp(name, m->params[i].name) == 0) return true;
    return false;
}

static void pdp__shape_text(char *buf, size_t cap, int ndim, const int64_t *shape)
{
    size_t n = 0;
    int d;
    n += (size_t)snprintf(buf, cap, "[");
    for (d = 0; d < ndim && n < cap; d++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

/* The checksums of a file being loaded: the tables and a chunk for reading a
   tensor of which only a slice is loaded (it is verified whole). */
#define PDP__CKPT_CHUNK 65536 /* bytes */
typedef struct pdp__ckpt_sums {
    pdp__crc32c crc;
    unsigned char chunk[PDP__CKPT_CHUNK];
} pdp__ckpt_sums;

/* A file with checksums (any __metadata__ key "crc32c.*": written by pdp)
   must have them all: "crc32c.header", matching the header, and one
   "crc32c.<name>" for every tensor, none for anything else; each value 8
   lowercase hex digits. Sets the entries' crc; *has tells whether the file has
   checksums (a file of another tool has none and is loaded unverified). */
static pdp_status pdp__ckpt_check_sums(pdp__st_parser *p, pdp__st_entry *const *sorted,
                                       const pdp__crc32c *c, bool *has)
{
    const char *fn = p->fn, *hs = pdp__st_meta(p, "crc32c.header");
    uint32_t want, got;
    pdp__st_entry *e;
    pdp_status st;
    int i;
    *has = false;
    for (i = 0; i < p->nmeta && !*has; i += 2) *has = strncmp(p->meta[i], "crc32c.", 7) == 0;
    if (!*has) return PDP_OK;
    if (!hs)
        return pdp__err(PDP_ERR_FORMAT, "%s: %s: the header is corrupt: __metadata__ has tensor "
                        "checksums but no \"crc32c.header\"", fn, p->file);
    if (!pdp__ckpt_unhex8(hs, &want))
        return pdp__err(PDP_ERR_FORMAT, "%s: %s: the header is corrupt: __metadata__ "
                        "\"crc32c.header\" is \"%s\", not 8 lowercase hex digits", fn, p->file,
                        hs);
    if ((st = pdp__ckpt_header_crc(p, sorted, c, &got)) != PDP_OK) return st;
    if (got != want)
        return pdp__err(PDP_ERR_FORMAT, "%s: %s: the header is corrupt: its checksum is %08lx, "
                        "__metadata__ \"crc32c.header\" says %08lx", fn, p->file,
                        (unsigned long)got, (unsigned long)want);
    for (i = 0; i < p->nmeta; i += 2) {
        const char *key = p->meta[i];
        if (strncmp(key, "crc32c.", 7) != 0 || strcmp(key, "crc32c.header") == 0) continue;
        if (!(e = (pdp__st_entry *)pdp__st_find(sorted, p->nentries, key + 7)))
            return pdp__err(PDP_ERR_FORMAT, "%s: %s: __metadata__ \"%s\" is the checksum of a "
                            "tensor the file does not have", fn, p->file, key);
        if (e->has_crc || !pdp__ckpt_unhex8(p->meta[i + 1], &e->crc))
            return pdp__err(PDP_ERR_FORMAT, "%s: %s: tensor \"%s\": __metadata__ \"%s\" is "
                            "repeated or not 8 lowercase hex digits", fn, p->file, e->name, key);
        e->has_crc = true;
    }
    for (i = 0; i < p->nentries; i++)
        if (!p->entries[i].has_crc)
            return pdp__err(PDP_ERR_FORMAT, "%s: %s: tensor \"%s\" has no checksum (no "
                            "\"crc32c.%s\" in __metadata__)", fn, p->file, p->entries[i].name,
                            p->entries[i].name);
    return PDP_OK;
}

/* Reads elements [first, first + count) of tensor e of the file f (data at
   data_start) into dst. With sums, the whole tensor is read and checked
   against its checksum (through sums->chunk when only a slice is wanted). */
static pdp_status pdp__ckpt_read_tensor(FILE *f, const char *fn, const char *file,
                                        uint64_t data_start, const pdp__st_entry *e,
                                        int64_t first, float *dst, int64_t count,
                                        pdp__ckpt_sums *sums)
{
    uint64_t bytes = e->end - e->begin, want_lo = (uint64_t)first * 4;
    uint64_t want_hi = want_lo + (uint64_t)count * 4, at = data_start + e->begin, done, n, a, b;
    uint32_t crc = 0;
    bool whole = !sums || (want_lo == 0 && want_hi == bytes);
    if (whole) at += want_lo;
    if (at > (uint64_t)LONG_MAX || fseek(f, (long)at, SEEK_SET) != 0) goto read_error;
    if (whole) {
        if (fread(dst, 4, (size_t)count, f) != (size_t)count) goto read_error;
        if (sums) crc = pdp__crc32c_update(&sums->crc, 0, dst, (size_t)count * 4);
    } else {
        for (done = 0; done < bytes; done += n) {
            n = PDP__MIN(bytes - done, (uint64_t)PDP__CKPT_CHUNK);
            if (fread(sums->chunk, 1, (size_t)n, f) != (size_t)n) goto read_error;
            crc = pdp__crc32c_update(&sums->crc, crc, sums->chunk, (size_t)n);
            a = PDP__MAX(done, want_lo);
            b = PDP__MIN(done + n, want_hi);
            if (a < b)
                memcpy((unsigned char *)dst + (a - want_lo), sums->chunk + (a - done), b - a);
        }
    }
    if (sums && crc != e->crc)
        return pdp__err(PDP_ERR_FORMAT, "%s: %s: tensor \"%s\" is corrupt: its data's checksum "
                        "is %08lx, __metadata__ \"crc32c.%s\" says %08lx", fn, file, e->name,
                        (unsigned long)crc, e->name, (unsigned long)e->crc);
    if (!pdp__little_endian()) pdp__bswap32(dst, count);
    return PDP_OK;
read_error:
    return pdp__err(PDP_ERR_IO, "%s: %s: tensor \"%s\": read failed (%s)", fn, file, e->name,
                    ferror(f) ? strerror(errno) : "file shorter than its header");
}

/* Whether a tensor name of a shard file is one load expects (or may ignore). */
static bool pdp__ckpt_shard_expected(const pdp_optim *o, const char *name)
{
    int k;
    if (strcmp(name, "params") == 0) return true; /* ignored when not loading parameters */
    if (strncmp(name, "optim.", 6) != 0) return false;
    if (!o) return true; /* ignored */
    for (k = 0; k < o->nstate; k++)
        if (strcmp(name + 6, pdp__optim_state_name(o, k)) == 0) return true;
    return false;
}

/* Loads the parameters [lo, hi) into params (when with_params) and o's state
   for [lo, hi) (o may be NULL) from a full checkpoint (its slice) or, when
   allow_shard, from a shard file of exactly [lo, hi). */
static pdp_status pdp__ckpt_load(const char *path, pdp_model *m, float *params, bool with_params,
                                 pdp_optim *o, int64_t lo, int64_t hi, bool allow_shard,
                                 const char *fn)
{
    pdp__st_parser p;
    pdp__st_entry **sorted = NULL;
    pdp__ckpt_sums *sums = NULL, *check = NULL;
    unsigned char len8[8];
    uint64_t hlen = 0, file_bytes, data_start;
    float *staging = NULL;
    char *header = NULL, name[96], a[128], b[128];
    pdp_optim_desc desc;
    int64_t steps = 0, count;
    uint64_t seed = 0, mstep = 0;
    bool have_seed = false, have_step = false, has_sums = false;
    struct stat sb;
    const char *format;
    bool shard;
    FILE *f;
    int i, k, nstate;
    pdp_status st = PDP_OK;

    memset(&p, 0, sizeof p);
    memset(&desc, 0, sizeof desc);
    count = hi - lo;
    nstate = o ? o->nstate : 0;
    if (!(f = fopen(path, "rb")))
        return pdp__err(PDP_ERR_IO, "%s: %s: %s", fn, path, strerror(errno));
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        fclose(f);
        return pdp__err(PDP_ERR_IO, "%s: %s: not a regular file", fn, path);
    }
    file_bytes = (uint64_t)sb.st_size;
    if (file_bytes < 8 || fread(len8, 1, 8, f) != 8) {
        st = pdp__err(PDP_ERR_FORMAT, "%s: %s: %llu bytes, shorter than the 8-byte header length",
                      fn, path, (unsigned long long)file_bytes);
        goto done;
    }
    for (k = 7; k >= 0; k--) hlen = (hlen << 8) | len8[k];
    if (hlen < 2 || hlen > PDP__CKPT_MAX_HEADER || hlen > file_bytes - 8) {
        st = pdp__err(PDP_ERR_FORMAT, "%s: %s: header length %llu is impossible (file %llu bytes, "
                      "limit %llu): not a safetensors file, or truncated", fn, path,
                      (unsigned long long)hlen, (unsigned long long)file_bytes,
                      (unsigned long long)PDP__CKPT_MAX_HEADER);
        goto done;
    }
    data_start = 8 + hlen;
    header = (char *)pdp__alloc((size_t)hlen);
    if (!header) {
        st = pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: %s: no memory for the header", fn, path);
        goto done;
    }
    if (fread(header, 1, (size_t)hlen, f) != (size_t)hlen) {
        st = pdp__err(PDP_ERR_IO, "%s: %s: reading the header failed", fn, path);
        goto done;
    }
    p.s = header;
    p.n = (size_t)hlen;
    p.file = path;
    p.fn = fn;
    if ((st = pdp__st_parse(&p)) != PDP_OK) goto done;
    sorted = (pdp__st_entry **)pdp__alloc((size_t)PDP__MAX(1, p.nentries) * sizeof *sorted);
    if (!sorted) {
        st = pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: %s: no memory", fn, path);
        goto done;
    }
    if ((st = pdp__st_validate(&p, file_bytes - data_start, sorted)) != PDP_OK) goto done;
    if (!(sums = (pdp__ckpt_sums *)pdp__alloc(sizeof *sums))) {
        st = pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: %s: no memory", fn, path);
        goto done;
    }
    pdp__crc32c_init(&sums->crc);
    if ((st = pdp__ckpt_check_sums(&p, sorted, &sums->crc, &has_sums)) != PDP_OK) goto done;
    check = has_sums ? sums : NULL;
    if (o && (st = pdp__ckpt_read_optim(&p, o, &desc, &steps)) != PDP_OK) goto done;
    if (!pdp__ckpt_meta_u64(&p, "model.seed", &seed, &have_seed) ||
        !pdp__ckpt_meta_u64(&p, "model.step", &mstep, &have_step)) {
        st = pdp__err(PDP_ERR_FORMAT, "%s: %s: __metadata__ \"model.seed\" or \"model.step\" is "
                      "not a count", fn, path);
        goto done;
    }
    format = pdp__st_meta(&p, "format");
    shard = format && strcmp(format, "pdp-shard") == 0;
    if (shard && !allow_shard) {
        st = pdp__err(PDP_ERR_FORMAT, "%s: %s: a shard file (one rank's range of a ZeRO run), "
                      "not a checkpoint of the whole model", fn, path);
        goto done;
    }
    if (shard) {
        uint64_t slo = 0, shi = 0, scount = 0;
        bool have[3];
        if (!pdp__ckpt_meta_u64(&p, "shard.lo", &slo, &have[0]) ||
            !pdp__ckpt_meta_u64(&p, "shard.hi", &shi, &have[1]) ||
            !pdp__ckpt_meta_u64(&p, "shard.count", &scount, &have[2]) || !have[0] || !have[1] ||
            !have[2]) {
            st = pdp__err(PDP_ERR_FORMAT, "%s: %s: __metadata__ \"shard.lo\", \"shard.hi\" or "
                          "\"shard.count\" is missing or not a count", fn, path);
            goto done;
        }
        if (slo != (uint64_t)lo || shi != (uint64_t)hi || scount != (uint64_t)m->param_count) {
            st = pdp__err(PDP_ERR_SHAPE, "%s: %s: the file holds [%llu, %llu) of %llu parameters, "
                          "this rank loads [%lld, %lld) of %lld", fn, path,
                          (unsigned long long)slo, (unsigned long long)shi,
                          (unsigned long long)scount, (long long)lo, (long long)hi,
                          (long long)m->param_count);
            goto done;
        }
    }

    /* every expected tensor: present, F32, same shape */
    staging = (float *)pdp__alloc((size_t)PDP__MAX(1, count * (1 + nstate)) * sizeof(float));
    if (!staging) {
        st = pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: %s: no memory to stage %lld floats", fn, path,
                      (long long)(count * (1 + nstate)));
        goto done;
    }
    for (k = with_params ? -1 : 0; shard && k < nstate; k++) {
        const pdp__st_entry *e;
        if (k < 0) snprintf(name, sizeof name, "params");
        else snprintf(name, sizeof name, "optim.%s", pdp__optim_state_name(o, k));
        if (!(e = pdp__st_find(sorted, p.nentries, name))) {
            st = pdp__err(PDP_ERR_SHAPE, "%s: %s: tensor \"%s\" is missing", fn, path, name);
            goto done;
        }
        if (strcmp(e->dtype, "F32") != 0 || e->ndim != 1 || e->shape[0] != count) {
            pdp__shape_text(a, sizeof a, e->ndim, e->shape);
            st = pdp__err(PDP_ERR_SHAPE, "%s: %s: tensor \"%s\" is %s %s, expected F32 [%lld]", fn,
                          path, name, e->dtype, a, (long long)count);
            goto done;
        }
        if ((st = pdp__ckpt_read_tensor(f, fn, path, data_start, e, 0, staging + (k + 1) * count,
                                        count, check)) != PDP_OK)
            goto done;
    }
    for (k = with_params ? -1 : 0; !shard && k < nstate; k++) {
        for (i = 0; i < m->nparams; i++) {
            const pdp__param_entry *pe = &m->params[i];
            const pdp__st_entry *e;
            int64_t from = PDP__MAX(lo, pe->offset), to = PDP__MIN(hi, pe->offset + pe->count);
            bool same = true;
            int d;
            if (k < 0) snprintf(name, sizeof name, "%s", pe->name);
            else snprintf(name, sizeof name, "optim.%s.%s", pe->name, pdp__optim_state_name(o, k));
            if (!(e = pdp__st_find(sorted, p.nentries, name))) {
                st = pdp__err(PDP_ERR_SHAPE, "%s: %s: tensor \"%s\" is missing", fn, path, name);
                goto done;
            }
            if (strcmp(e->dtype, "F32") != 0) {
                st = pdp__err(PDP_ERR_FORMAT, "%s: %s: tensor \"%s\" is %s, expected F32", fn,
                              path, name, e->dtype);
                goto done;
            }
            same = e->ndim == pe->ndim;
            for (d = 0; same && d < pe->ndim; d++) same = e->shape[d] == pe->shape[d];
            if (!same) {
                pdp__shape_text(a, sizeof a, e->ndim, e->shape);
                pdp__shape_text(b, sizeof b, pe->ndim, pe->shape);
                st = pdp__err(PDP_ERR_SHAPE, "%s: %s: tensor \"%s\" has shape %s in the file, "
                              "the model's is %s", fn, path, name, a, b);
                goto done;
            }
            if (from < to &&
                (st = pdp__ckpt_read_tensor(f, fn, path, data_start, e, from - pe->offset,
                                            staging + (k + 1) * count + (from - lo), to - from,
                                            check)) != PDP_OK)
                goto done;
        }
    }
    for (i = 0; i < p.nentries; i++)
        if (shard ? !pdp__ckpt_shard_expected(o, p.entries[i].name)
                  : !pdp__ckpt_expected(m, o, p.entries[i].name)) {
            st = pdp__err(PDP_ERR_SHAPE, "%s: %s: tensor \"%s\" is not in the %s", fn, path,
                          p.entries[i].name,
                          strncmp(p.entries[i].name, "optim.", 6) == 0 ? "optimizer's state"
                                                                       : "model");
            goto done;
        }

    /* all checks passed: apply */
    if (with_params && count &&
        (st = pdp__dev_copy(m->device, params, pdp_cpu(), staging, (size_t)count * 4)) != PDP_OK) {
        st = pdp__err_wrap(st, "%s: %s: copying the parameters to the device failed; they "
                           "may be partly loaded", fn, path);
        goto done;
    }
    if (with_params && have_seed) m->seed = seed; /* the dropout stream, for an exact resume */
    if (with_params && have_step) m->step = mstep;
    if (o) {
        for (k = 0; k < nstate; k++)
            if (count && (st = pdp__dev_copy(m->device, o->state[k] + (lo - o->lo), pdp_cpu(),
                                             staging + (k + 1) * count, (size_t)count * 4)) !=
                             PDP_OK) {
                st = pdp__err_wrap(st, "%s: %s: copying the optimizer state to the device "
                                   "failed; the parameters are loaded, the state may be partly "
                                   "loaded", fn, path);
                goto done;
            }
        o->desc = desc;
        o->steps = steps;
    }
done:
    fclose(f);
    pdp__st_parser_free(&p);
    pdp__dealloc(header);
    pdp__dealloc(sorted);
    pdp__dealloc(staging);
    pdp__dealloc(sums);
    return st;
}

PDP_API pdp_status pdp_checkpoint_load(const char *path, pdp_model *m, pdp_optim *o)
{
    const char *fn = "pdp_checkpoint_load";
    pdp_status st;
    if ((st = pdp__ckpt_whole_args(path, m, o, fn)) != PDP_OK) return st;
    return pdp__ckpt_load(path, m, m->param_block, true, o, 0, m->param_count, false, fn);
}

static pdp_status pdp__checkpoint_load_range(const char *path, pdp_model *m, float *params,
                                             pdp_optim *o, int64_t lo, int64_t hi,
                                             const char *fn)
{
    pdp_status st = pdp__ckpt_range_args(path, m, params, o, lo, hi, fn);
    if (st != PDP_OK) return st;
    return pdp__ckpt_load(path, m, params, params != NULL, o, lo, hi, true, fn);
}
/* ---- end src/checkpoint.c ---- */

/* ---- begin src/dp.c ---- */
/* dp: DataParallel over persistent worker threads, parameter-server style.

   This is torch.nn.DataParallel (Li et al., "PyTorch Distributed", VLDB 2020,
   section 2; torch/nn/parallel/data_parallel.py) written so that each stage is
   one function: pdp__dp_replicate, pdp__dp_scatter, pdp__dp_parallel_apply,
   pdp__dp_gather, pdp__dp_reduce, pdp__dp_master_step. The master (device 0)
   sends parameters and shards, receives outputs and gradients, holds the
   optimizer state and runs the update: every byte passes through it, which is
   why the literature calls DP a parameter-server design that overloads device
   0, and why DDP (ddp.c) replaces the gather-reduce-step-replicate round trip
   with an all-reduce among equals.

   Threads. One worker per replica ("one host thread per device"): workers
   1..N-1 are persistent threads created by pdp_dp_create and reused by every
   step; worker 0, which runs the master's replica and the first slice of the
   reduce, is the calling thread itself. A job is handed off under one mutex: the
   caller writes the job, bumps `generation` and broadcasts `wake`, runs worker
   0's part, then waits for `pending` to reach zero; each worker runs its part
   and decrements `pending`, the last one signals `done`. Both sides spin a
   while before they sleep (pdp__spin_while, as the intra-op pool does):
   generation, pending and stop are only written with atomic stores under the
   lock and read outside it only while spinning; shards and results are written
   before the handoff under the lock, so every other read is ordered by the mutex
   (TSan clean). Each worker sets its own intra-op thread count
   (threads_per_worker, default 1), since that setting is per thread; the caller
   switches to it for its part and back.

   Invariants. (1) Shards are balanced and contiguous: replica i gets
   B/N + (i < B%N) samples starting after replica i-1's, so idle replicas
   (B < N) are always the last ones. (2) Replica i's loss gradient is scaled by
   1/B (the global batch), so the SUM of the replicas' gradients is the
   gradient of the global mean loss. (3) The reduce adds, for every element,
   g0 + g1 + g2 + ... in replica order whatever thread runs the slice, so the
   result does not depend on the slicing or on timing. (4) Dropout masks are
   keyed by (seed, layer, step, global sample index): before each forward a
   replica gets the master's step and sample_base = its first global sample,
   which positions it in the one counter-based random stream exactly where a
   single device would be - one seeded stream per replica, whose union is the
   single-device stream. Hence N workers reproduce one device on the same
   global batch to float rounding, and one worker reproduces it bit for bit.
   (5) After the first step at the largest batch nothing is allocated and no
   thread is created.

   Choices, and where they differ from PyTorch. torch's parallel_apply starts a
   thread per replica and the caller waits; here the master's shard runs on the
   calling thread itself: a caller that only dispatches and waits is one more
   thread to wake twice a step, competing with the workers for the cores (with 2
   workers on 2 cores, the MLP at batch 128 lost 0.3-0.5 ms of a 3.5 ms step to
   those hand-offs; bench/dp measures the step against its bound).
   torch.chunk gives every replica ceil(B/N) samples and the last one the rest;
   balanced shards keep the slowest replica, which sets the step time, at most
   one sample above the others. torch reduces on device 0 (reduce_add); on a
   CPU that would leave N-1 cores idle, so by default each worker sums one slice
   of the flat gradient (reduce_on_master restores torch's placement, with the
   same bits). On CPU replicas the master's step is fused into that reduce: each
   worker updates the parameters of the slice it has just summed, chunk by chunk
   while the chunk is in cache, instead of one thread stepping everything while
   the others wait (pdp__dp_fused_step).

   GPUs. With CUDA devices the stages are torch's own: replicate copies the
   master's parameters (device 0) into each replica's own parameter block on its
   device (a peer copy; a device-local copy for a replica on device 0); scatter
   copies each shard's rows to its replica's device (host -> device i or device
   0 -> device i) unless they already live there; each worker thread drives its
   GPU (pdp_cuda.cu makes the thread's device current on every call), so the
   apply of N GPUs runs at once; gather peer-copies the outputs to device 0; and
   reduce, on the calling thread, peer-copies replica r's gradients into one
   staging block on device 0 (allocated at create) and adds them into the
   master's, r = 1, 2, ... in order - torch's reduce_add. A replica on device 0
   is added straight from its own block. Several workers may share a GPU (more
   workers than devices): each has its own replica and buffers, their kernels
   interleave on that device's stream. All devices are CUDA or none is; without
   PDP_CUDA, CUDA devices fail with PDP_ERR_UNSUPPORTED naming the macro. */

/* #include "internal.h" (already above) */
#include <unistd.h>

/* ---- dp: the object ---- */

typedef enum pdp__dp_job {
    PDP__DP_JOB_NONE = 0,
    PDP__DP_JOB_APPLY,   /* forward, loss, backward on this worker's shard */
    PDP__DP_JOB_REDUCE   /* sum one slice of the replicas' gradients into the master (and
                            step it, when step_opt is set) */
} pdp__dp_job;

typedef struct pdp__dp_worker {
    pdp_dp *dp;
    int index;
    pthread_t tid;
    bool started;
    unsigned long seen;  /* the last generation this worker ran (0 before the first job) */
    pdp_device device;
    pdp_model *replica;  /* index 0: the master itself */
    /* written by scatter (caller), read by the worker */
    int64_t first, rows; /* global samples [first, first + rows) */
    pdp_tensor x;        /* those rows of the batch (a view, or xbuf on another device) */
    float *xbuf;         /* [cap_xbuf] the rows when the batch lives on another device */
    int64_t cap_xbuf;    /* floats */
    const int32_t *labels;
    float *dlogits;      /* [cap_rows, classes] loss gradient, on the replica's device */
    int64_t cap_rows;
    /* written by the worker, read by the caller after the handoff */
    double loss_sum;
    double apply_s;      /* wall seconds of this worker's apply */
    double cpu_s;        /* CPU seconds of this worker's last job */
    pdp_status status;
    char msg[512];
} pdp__dp_worker;

struct pdp_dp {
    pdp_model *master;
    int n;
    int threads_per_worker;
    bool copy_params;
    bool reduce_on_master;
    bool cuda;           /* the replicas are on CUDA devices */
    float *stage;        /* [param_count] on the master's device: one replica's gradients
                            in flight to the reduce (CUDA, replicas on other devices) */
    int64_t classes;
    pdp__dp_worker *workers;
    /* the handoff; the fields below up to `stop` are guarded by lock */
    pthread_mutex_t lock;
    pthread_cond_t wake, done;
    bool sync_ok;
    unsigned long generation; /* generation, pending and stop: atomic stores only */
    pdp__dp_job job;
    int pending;
    int stop;
    /* this step, set by the caller before the handoff */
    int64_t batch;
    int active;          /* replicas with at least one sample */
    float grad_scale;    /* 1 / batch */
    bool zero_master;    /* replica 0 zeroes the master's gradients first */
    pdp_optim *step_opt; /* non-NULL: the reduce also steps each slice it sums */
    pdp__optim_scalars step_s; /* step_opt's update scalars, taken once per step */
    double jobs_cpu;     /* CPU seconds the caller spent in jobs this step: as worker 0,
                            and spinning for the others (their CPU time counts instead) */
    /* gathered outputs on the master's device */
    float *out_block;
    int64_t out_cap;     /* floats */
    pdp_tensor output;
    bool have_output;
    size_t optim_bytes;  /* the master's optimizer state, seen at the last step */
    pdp_dp_stats stats;
};

/* ---- dp: memory accounting ---- */

/* Bytes a model holds on its device, from the plan pdp_model_reserve allocates by. */
static size_t pdp__dp_model_bytes(const pdp_model *m)
{
    size_t bytes = (size_t)m->param_count * sizeof(float); /* gradients */
    pdp__model_plan p;
    if (!m->params_shared) bytes += (size_t)m->param_count * sizeof(float);
    if (m->max_batch == 0) return bytes;
    p = pdp__model_plan_of(m, NULL);
    return bytes + (size_t)(m->max_batch * (p.act + p.saved + p.work + 2 * p.widest) + 3) *
                       sizeof(float);
}

static void pdp__dp_memory(pdp_dp *dp)
{
    size_t replica = 0;
    int i;
    dp->stats.master_bytes = pdp__dp_model_bytes(dp->master) + dp->optim_bytes +
                             (size_t)(dp->out_cap + dp->workers[0].cap_rows * dp->classes +
                                      dp->workers[0].cap_xbuf) * sizeof(float);
    if (dp->stage) dp->stats.master_bytes += (size_t)dp->master->param_count * sizeof(float);
    for (i = 1; i < dp->n; i++) {
        const pdp__dp_worker *w = &dp->workers[i];
        replica = PDP__MAX(replica, pdp__dp_model_bytes(w->replica) +
                                        (size_t)(w->cap_rows * dp->classes + w->cap_xbuf) *
                                            sizeof(float));
    }
    dp->stats.replica_bytes = replica;
}

/* ---- dp: workers ---- */

/* CPU seconds used by the calling thread: unlike wall time, it does not count
   the time a busy machine keeps the thread waiting for a core. */
static double pdp__dp_thread_cpu(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return 0.0;
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Parallel apply, one replica: forward, loss against its labels, backward. */
static void pdp__dp_apply_one(pdp__dp_worker *w)
{
    pdp_dp *dp = w->dp;
    pdp_model *m = w->replica;
    const pdp_tensor *y;
    pdp_tensor dy;
    int64_t shape[2];
    double t0 = pdp__now(), c0 = pdp__dp_thread_cpu();
    pdp_status st;
    w->status = PDP_OK;
    w->loss_sum = 0.0;
    w->apply_s = 0.0;
    w->cpu_s = 0.0;
    if (w->rows == 0) return; /* idle this step */
    if (w->index > 0 || dp->zero_master) pdp_model_zero_grad(m);
    if ((st = pdp_model_forward(m, &w->x, &y)) != PDP_OK) goto fail;
    if ((st = pdp__cross_entropy_on(m->device, y->data, w->labels, w->rows, dp->classes,
                                    dp->grad_scale, &w->loss_sum, w->dlogits,
                                    "cross_entropy")) != PDP_OK)
        goto fail;
    if (!isfinite(w->loss_sum)) {
        st = pdp__err(PDP_ERR_NUMERIC, "the loss of samples [%lld, %lld) is %g",
                      (long long)w->first, (long long)(w->first + w->rows), w->loss_sum);
        goto fail;
    }
    shape[0] = w->rows;
    shape[1] = dp->classes;
    pdp_tensor_wrap(w->dlogits, m->device, 2, shape, &dy);
    if ((st = pdp_model_backward(m, &dy)) != PDP_OK) goto fail;
    w->apply_s = pdp__now() - t0;
    w->cpu_s = pdp__dp_thread_cpu() - c0;
    return;
fail:
    /* the message is thread-local: keep a copy for the caller */
    w->status = st;
    {
        const char *e = pdp_last_error();
        size_t len = PDP__MIN(strlen(e), sizeof w->msg - 1);
        memcpy(w->msg, e, len);
        w->msg[len] = '\0';
    }
    w->apply_s = pdp__now() - t0;
}

/* Reduce, one slice: master.grad[lo, hi) += replica[1..active-1].grad[lo, hi), in
   replica order. Slices are multiples of 16 floats (one cache line) so no two
   threads write the same line; chunks of 4096 floats keep the master's part in L1
   while each replica is added, and, when the step is fused (step_opt), while the
   optimizer updates the chunk's parameters from it: the update is element-wise, so
   stepping slice by slice gives the bits of one pdp_optim_step after the reduce. */
static void pdp__dp_reduce_slice(pdp_dp *dp, int slice, int nslices)
{
    int64_t count = dp->master->param_count;
    int64_t per = ((count + nslices - 1) / nslices + 15) / 16 * 16;
    int64_t lo = PDP__MIN(count, (int64_t)slice * per), hi = PDP__MIN(count, lo + per), c;
    float *dst = dp->master->grad_block;
    int r;
    for (c = lo; c < hi; c += 4096) {
        int64_t len = PDP__MIN(hi, c + 4096) - c;
        for (r = 1; r < dp->active; r++) {
            float *PDP__RESTRICT d = dst + c;
            const float *PDP__RESTRICT s = dp->workers[r].replica->grad_block + c;
            PDP__FOR_BLOCKED(j, len, d[j] += s[j];);
        }
        if (dp->step_opt)
            pdp__optim_update_range(dp->step_opt, &dp->step_s, dp->master->param_block, dst, c,
                                    c + len);
    }
}

/* One worker's part of a job: its replica's apply, or its slice of the reduce. */
static void pdp__dp_do_job(pdp__dp_worker *w, pdp__dp_job job)
{
    pdp_dp *dp = w->dp;
    if (job == PDP__DP_JOB_APPLY) {
        pdp__dp_apply_one(w);
    } else if (job == PDP__DP_JOB_REDUCE) {
        int nslices = dp->reduce_on_master ? 1 : dp->n;
        double c0 = pdp__dp_thread_cpu();
        if (w->index < nslices) pdp__dp_reduce_slice(dp, w->index, nslices);
        w->cpu_s = pdp__dp_thread_cpu() - c0;
    }
}

/* pdp__spin_while's conditions: a worker waits for a new generation (or stop), the
   caller for its workers. */
static bool pdp__dp_no_new_job(const void *worker)
{
    const pdp__dp_worker *w = (const pdp__dp_worker *)worker;
    return PDP__LOAD_ACQ(&w->dp->generation) == w->seen && !PDP__LOAD_ACQ(&w->dp->stop);
}

static bool pdp__dp_jobs_pending(const void *dp)
{
    return PDP__LOAD_ACQ(&((const pdp_dp *)dp)->pending) > 0;
}

/* Workers 1..n-1: wait for a generation, run their part, report; between jobs they
   spin a while (pdp__spin_while) before they sleep on wake. */
static void *pdp__dp_worker_main(void *arg)
{
    pdp__dp_worker *w = (pdp__dp_worker *)arg;
    pdp_dp *dp = w->dp;
    pdp_set_num_threads(dp->threads_per_worker);
    pthread_mutex_lock(&dp->lock);
    for (;;) {
        pdp__dp_job job;
        if (dp->generation == w->seen && !dp->stop) { /* spin a while, then sleep */
            pthread_mutex_unlock(&dp->lock);
            pdp__spin_while(pdp__dp_no_new_job, w);
            pthread_mutex_lock(&dp->lock);
        }
        while (dp->generation == w->seen && !dp->stop) pthread_cond_wait(&dp->wake, &dp->lock);
        if (dp->stop) break;
        w->seen = dp->generation;
        job = dp->job;
        pthread_mutex_unlock(&dp->lock);
        pdp__dp_do_job(w, job);
        pthread_mutex_lock(&dp->lock);
        PDP__STORE_REL(&dp->pending, dp->pending - 1);
        if (dp->pending == 0) pthread_cond_signal(&dp->done);
    }
    pthread_mutex_unlock(&dp->lock);
    return NULL;
}

/* Runs one job: hands it to workers 1..n-1, runs worker 0's part on the calling
   thread (with the workers' intra-op thread count), and waits until all are done. */
static void pdp__dp_run_job(pdp_dp *dp, pdp__dp_job job)
{
    int caller_threads = pdp_get_num_threads();
    double c0 = pdp__dp_thread_cpu();
    pthread_mutex_lock(&dp->lock);
    dp->job = job;
    PDP__STORE_REL(&dp->pending, dp->n - 1);
    PDP__STORE_REL(&dp->generation, dp->generation + 1);
    pthread_cond_broadcast(&dp->wake);
    pthread_mutex_unlock(&dp->lock);

    pdp_set_num_threads(dp->threads_per_worker);
    pdp__dp_do_job(&dp->workers[0], job);
    pdp_set_num_threads(caller_threads);

    pdp__spin_while(pdp__dp_jobs_pending, dp);
    pthread_mutex_lock(&dp->lock);
    while (dp->pending > 0) pthread_cond_wait(&dp->done, &dp->lock);
    pthread_mutex_unlock(&dp->lock);
    dp->jobs_cpu += pdp__dp_thread_cpu() - c0;
}

/* ---- dp: lifecycle ---- */

static void pdp__dp_destroy(pdp_dp *dp)
{
    int i;
    if (dp->sync_ok) {
        pthread_mutex_lock(&dp->lock);
        PDP__STORE_REL(&dp->stop, 1);
        pthread_cond_broadcast(&dp->wake);
        pthread_mutex_unlock(&dp->lock);
    }
    for (i = 0; i < dp->n; i++)
        if (dp->workers && dp->workers[i].started) pthread_join(dp->workers[i].tid, NULL);
    for (i = 0; dp->workers && i < dp->n; i++) {
        pdp__dp_worker *w = &dp->workers[i];
        if (i > 0) pdp_model_free(w->replica);
        pdp__dev_free(w->device, w->dlogits);
        pdp__dev_free(w->device, w->xbuf);
    }
    if (dp->master) {
        pdp__dev_free(dp->master->device, dp->out_block);
        pdp__dev_free(dp->master->device, dp->stage);
    }
    if (dp->sync_ok) {
        pthread_cond_destroy(&dp->done);
        pthread_cond_destroy(&dp->wake);
        pthread_mutex_destroy(&dp->lock);
    }
    pdp__dealloc(dp->workers);
    pdp__dealloc(dp);
}

static bool pdp__same_device(pdp_device a, pdp_device b)
{
    return a.kind == b.kind && a.ordinal == b.ordinal;
}

PDP_API pdp_status pdp_dp_create(pdp_dp **out, pdp_model *master, const pdp_dp_desc *desc)
{
    pdp_dp_desc d;
    pdp_dp *dp;
    int n, i;
    pdp_status st;
    if (!out) return pdp__err(PDP_ERR_INVALID, "pdp_dp_create: out is NULL");
    *out = NULL;
    if (!master) return pdp__err(PDP_ERR_INVALID, "pdp_dp_create: master model is NULL");
    memset(&d, 0, sizeof d);
    if (desc) d = *desc;
    if (master->nlayers == 0)
        return pdp__err(PDP_ERR_STATE, "pdp_dp_create: the model has no layers");
    if (master->tp.nlayers)
        return pdp__err(PDP_ERR_UNSUPPORTED, "pdp_dp_create: the model has %d tensor-parallel "
                        "layers, whose collectives thread replicas cannot share; use DDP across "
                        "TP groups (tp.h)", master->tp.nlayers);
    if (master->layers[master->nlayers - 1].out_ndim != 1)
        return pdp__err(PDP_ERR_SHAPE,
                        "pdp_dp_create: the last layer %d (%s) gives %d-d samples; the "
                        "classification loss needs 1-d logits (add a Flatten and a Linear)",
                        master->nlayers - 1,
                        pdp__layer_kind_name(master->layers[master->nlayers - 1].kind),
                        master->layers[master->nlayers - 1].out_ndim);
    n = d.num_workers;
    if (n < 0 || n > PDP_DP_MAX_WORKERS)
        return pdp__err(PDP_ERR_INVALID,
                        "pdp_dp_create: num_workers %d (use 0 for one per core, or 1..%d)", n,
                        PDP_DP_MAX_WORKERS);
    if (n == 0 && d.devices)
        return pdp__err(PDP_ERR_INVALID,
                        "pdp_dp_create: num_workers 0 with a devices list (give its length)");
    if (n == 0) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        n = cores > 0 ? (int)PDP__MIN(cores, (long)PDP_DP_MAX_WORKERS) : 1;
    }
    if (d.threads_per_worker < 0)
        return pdp__err(PDP_ERR_INVALID, "pdp_dp_create: threads_per_worker %d is negative",
                        d.threads_per_worker);
    for (i = 0; i < n; i++) {
        pdp_device dev = d.devices ? d.devices[i] : pdp_cpu();
        if (i == 0 && !pdp__same_device(dev, master->device))
            return pdp__err(PDP_ERR_DEVICE,
                            "pdp_dp_create: devices[0] (%d:%d) must be the master's device (%d:%d)",
                            dev.kind, dev.ordinal, master->device.kind, master->device.ordinal);
#ifndef PDP_CUDA
        if (dev.kind != PDP_DEVICE_CPU)
            return pdp__err(PDP_ERR_UNSUPPORTED,
                            "pdp_dp_create: devices[%d] is CUDA %d: built without PDP_CUDA "
                            "(compile with -DPDP_CUDA and link pdp_cuda.o)",
                            i, dev.ordinal);
#endif
        if (dev.kind != master->device.kind)
            return pdp__err(PDP_ERR_DEVICE,
                            "pdp_dp_create: devices[%d] (%d:%d) and the master (%d:%d) differ in "
                            "kind: the workers must be all CPU or all CUDA",
                            i, dev.kind, dev.ordinal, master->device.kind,
                            master->device.ordinal);
    }

    dp = (pdp_dp *)pdp__calloc(sizeof *dp);
    if (!dp) return pdp__err(PDP_ERR_OUT_OF_MEMORY, "pdp_dp_create: no memory");
    dp->master = master;
    dp->n = n;
    dp->threads_per_worker = PDP__DEF(d.threads_per_worker, 1);
    dp->cuda = master->device.kind == PDP_DEVICE_CUDA;
    dp->copy_params = d.copy_params || dp->cuda; /* a GPU reads only its own memory */
    dp->reduce_on_master = d.reduce_on_master;
    dp->classes = master->layers[master->nlayers - 1].out_count;
    dp->workers = (pdp__dp_worker *)pdp__calloc((size_t)n * sizeof *dp->workers);
    if (!dp->workers) {
        pdp__dp_destroy(dp);
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "pdp_dp_create: no memory for %d workers", n);
    }
    if (pthread_mutex_init(&dp->lock, NULL) != 0) goto sync_fail;
    if (pthread_cond_init(&dp->wake, NULL) != 0) {
        pthread_mutex_destroy(&dp->lock);
        goto sync_fail;
    }
    if (pthread_cond_init(&dp->done, NULL) != 0) {
        pthread_cond_destroy(&dp->wake);
        pthread_mutex_destroy(&dp->lock);
        goto sync_fail;
    }
    dp->sync_ok = true;

    /* replicas: 0 is the master; the others are clones on their devices */
    for (i = 0; i < n; i++) {
        pdp__dp_worker *w = &dp->workers[i];
        w->dp = dp;
        w->index = i;
        w->device = d.devices ? d.devices[i] : pdp_cpu();
        if (i == 0) {
            w->replica = master;
        } else if ((st = pdp__model_clone(master, w->device, !dp->copy_params, &w->replica)) !=
                   PDP_OK) { /* the message reads w: destroy after */
            st = pdp__err_wrap(st, "pdp_dp_create: replica %d on device %d:%d", i,
                               w->device.kind, w->device.ordinal);
            pdp__dp_destroy(dp);
            return st;
        }
        /* the reduce's staging block, once, if any replica's gradients live elsewhere */
        if (i > 0 && dp->cuda && !dp->stage && !pdp__same_device(w->device, master->device) &&
            master->param_count > 0 &&
            (st = pdp__dev_alloc(master->device, (size_t)master->param_count * sizeof(float),
                                 (void **)&dp->stage)) != PDP_OK) {
            pdp__dp_destroy(dp);
            return pdp__err_wrap(st, "pdp_dp_create: the reduce's staging block");
        }
    }
    for (i = 1; i < n; i++) { /* worker 0 is the calling thread */
        pdp__dp_worker *w = &dp->workers[i];
        int rc = pthread_create(&w->tid, NULL, pdp__dp_worker_main, w);
        if (rc != 0) {
            pdp__dp_destroy(dp);
            return pdp__err(PDP_ERR_OUT_OF_MEMORY, "pdp_dp_create: worker %d: pthread_create: %s",
                            i, strerror(rc));
        }
        w->started = true;
    }
    dp->stats.num_workers = n;
    dp->stats.params_shared = !dp->copy_params;
    pdp__dp_memory(dp);
    *out = dp;
    return PDP_OK;
sync_fail:
    pdp__dp_destroy(dp);
    return pdp__err(PDP_ERR_OUT_OF_MEMORY, "pdp_dp_create: cannot create a mutex or condition");
}

PDP_API void pdp_dp_free(pdp_dp *dp)
{
    if (dp) pdp__dp_destroy(dp);
}

PDP_API int pdp_dp_num_workers(const pdp_dp *dp) { return dp ? dp->n : 0; }

PDP_API const pdp_tensor *pdp_dp_output(const pdp_dp *dp)
{
    return dp && dp->have_output ? &dp->output : NULL;
}

/* ---- dp: the stages ---- */

/* Replicate: master parameters -> replicas 1..active-1, and the state that keys
   dropout (training flag, step). A CPU replica that shares the master's memory
   only re-points at it; a copying replica (copy_params, or another device) gets
   a fresh copy, as torch's replicate() broadcasts the parameters every step. */
static pdp_status pdp__dp_replicate(pdp_dp *dp, const char *fn)
{
    pdp_model *m = dp->master;
    size_t bytes = (size_t)m->param_count * sizeof(float);
    pdp_status st;
    int i;
    dp->stats.replicate_bytes = 0;
    for (i = 1; i < dp->active; i++) {
        pdp_model *r = dp->workers[i].replica;
        if (r->nlayers != m->nlayers || r->param_count != m->param_count)
            return pdp__err(PDP_ERR_STATE,
                            "%s: the master model changed after pdp_dp_create (%d layers, %lld "
                            "parameters; replica %d has %d, %lld)",
                            fn, m->nlayers, (long long)m->param_count, i, r->nlayers,
                            (long long)r->param_count);
        r->training = m->training;
        r->step = m->step;
        r->seed = m->seed;
        if (r->params_shared) {
            r->param_block = m->param_block;
        } else if ((st = pdp__dev_copy(r->device, r->param_block, m->device, m->param_block,
                                       bytes)) != PDP_OK) {
            return pdp__err_wrap(st, "%s: replicate to replica %d", fn, i);
        }
        dp->stats.replicate_bytes += bytes;
    }
    return PDP_OK;
}

/* Scatter: split x and labels along dimension 0 into balanced contiguous shards.
   On the CPU a shard is a view of the caller's batch (no copy); the bytes count
   what a multi-device DP sends. Grows the loss-gradient buffers (first step). */
static pdp_status pdp__dp_scatter(pdp_dp *dp, const pdp_tensor *x, const int32_t *labels,
                                  const char *fn)
{
    int64_t b = x->shape[0], base = b / dp->n, extra = b % dp->n, first = 0;
    size_t row_bytes = (size_t)(x->count / b) * sizeof(float) + sizeof(int32_t);
    pdp_status st;
    int i;
    dp->grad_scale = 1.0f / (float)b;
    dp->stats.scatter_bytes = 0;
    for (i = 0; i < dp->n; i++) {
        pdp__dp_worker *w = &dp->workers[i];
        w->first = first;
        w->rows = base + (i < extra ? 1 : 0);
        w->replica->sample_base = first;
        first += w->rows;
        if (w->rows == 0) continue;
        pdp_tensor_rows_view(x, w->first, w->rows, &w->x);
        w->labels = labels + w->first;
        if (!pdp__same_device(x->device, w->device)) {
            /* a GPU replica whose rows live on the host or another GPU: copy them over */
            size_t bytes = (size_t)w->x.count * sizeof(float);
            if (w->x.count > w->cap_xbuf) {
                pdp__dev_free(w->device, w->xbuf);
                w->xbuf = NULL;
                w->cap_xbuf = 0;
                if ((st = pdp__dev_alloc(w->device, bytes, (void **)&w->xbuf)) != PDP_OK)
                    return pdp__err_wrap(st, "%s: worker %d: input rows", fn, i);
                w->cap_xbuf = w->x.count;
            }
            if ((st = pdp__dev_copy(w->device, w->xbuf, x->device, w->x.data, bytes)) != PDP_OK)
                return pdp__err_wrap(st, "%s: scatter to worker %d", fn, i);
            w->x.data = w->xbuf;
            w->x.device = w->device;
        }
        if (i > 0) dp->stats.scatter_bytes += (size_t)w->rows * row_bytes;
        if (w->rows > w->cap_rows) {
            pdp__dev_free(w->device, w->dlogits);
            w->dlogits = NULL;
            w->cap_rows = 0;
            if ((st = pdp__dev_alloc(w->device, (size_t)(w->rows * dp->classes) * sizeof(float),
                                     (void **)&w->dlogits)) != PDP_OK)
                return pdp__err_wrap(st, "%s: worker %d: loss gradient", fn, i);
            w->cap_rows = w->rows;
        }
    }
    return PDP_OK;
}

/* Parallel apply: every worker runs its replica at once; the first failure (lowest
   worker index, so the report does not depend on timing) comes back naming it. */
static pdp_status pdp__dp_parallel_apply(pdp_dp *dp, bool zero_master, double *cpu,
                                         const char *fn)
{
    int i;
    dp->zero_master = zero_master;
    pdp__dp_run_job(dp, PDP__DP_JOB_APPLY);
    dp->stats.apply_worker_min = 0.0;
    dp->stats.apply_worker_max = 0.0;
    *cpu = 0.0;
    for (i = 0; i < dp->active; i++) {
        const pdp__dp_worker *w = &dp->workers[i];
        if (w->status != PDP_OK)
            return pdp__err(w->status, "%s: worker %d (samples %lld..%lld): %s", fn, i,
                            (long long)w->first, (long long)(w->first + w->rows - 1), w->msg);
        if (i == 0 || w->apply_s < dp->stats.apply_worker_min)
            dp->stats.apply_worker_min = w->apply_s;
        dp->stats.apply_worker_max = PDP__MAX(dp->stats.apply_worker_max, w->apply_s);
        *cpu = PDP__MAX(*cpu, w->cpu_s);
    }
    return PDP_OK;
}

/* Gather: outputs of every replica into one [batch, classes] tensor on the master,
   and the loss sums, added in replica order in double. */
static pdp_status pdp__dp_gather(pdp_dp *dp, double *loss_sum, const char *fn)
{
    pdp_model *m = dp->master;
    int64_t need = dp->batch * dp->classes, shape[2];
    pdp_status st;
    int i;
    if (need > dp->out_cap) {
        pdp__dev_free(m->device, dp->out_block);
        dp->out_block = NULL;
        dp->out_cap = 0;
        dp->have_output = false;
        st = pdp__dev_alloc(m->device, (size_t)need * sizeof(float), (void **)&dp->out_block);
        if (st != PDP_OK)
            return pdp__err_wrap(st, "%s: gathered outputs", fn);
        dp->out_cap = need;
    }
    *loss_sum = 0.0;
    dp->stats.gather_bytes = 0;
    for (i = 0; i < dp->active; i++) {
        const pdp__dp_worker *w = &dp->workers[i];
        size_t bytes = (size_t)(w->rows * dp->classes) * sizeof(float);
        if ((st = pdp__dev_copy(m->device, dp->out_block + w->first * dp->classes, w->device,
                                w->replica->out_view.data, bytes)) != PDP_OK)
            return pdp__err_wrap(st, "%s: gather from replica %d", fn, i);
        *loss_sum += w->loss_sum;
        if (i > 0) dp->stats.gather_bytes += bytes + sizeof(double);
    }
    shape[0] = dp->batch;
    shape[1] = dp->classes;
    pdp_tensor_wrap(dp->out_block, m->device, 2, shape, &dp->output);
    dp->have_output = true;
    return PDP_OK;
}

/* Reduce: the replicas' gradients summed into the master's (which already holds
   replica 0's). Each worker sums one slice, or the master's worker sums it all
   (reduce_on_master, torch's reduce_add on device 0); same bits either way. With
   step_opt the workers also step the slices they sum (pdp__dp_fused_step). */
static void pdp__dp_reduce(pdp_dp *dp, pdp_optim *step_opt, double *cpu)
{
    int i;
    dp->step_opt = step_opt;
    if (step_opt) pdp__optim_scalars_of(step_opt, &dp->step_s);
    dp->stats.reduce_bytes =
        (size_t)(dp->active - 1) * (size_t)dp->master->param_count * sizeof(float);
    *cpu = 0.0;
    if (dp->active < 2) return;
    pdp__dp_run_job(dp, PDP__DP_JOB_REDUCE);
    dp->step_opt = NULL;
    for (i = 0; i < dp->n; i++) *cpu = PDP__MAX(*cpu, dp->workers[i].cpu_s);
}

/* Reduce on GPUs, on the calling thread (device 0): replica r's gradients are
   peer-copied into the staging block and added into the master's, r = 1, 2, ...
   in order, so every element is g0 + g1 + g2 + ... as on the CPU. The copy waits
   for replica r's backward; the adds queue on device 0's stream in order. */
static pdp_status pdp__dp_reduce_device(pdp_dp *dp, const char *fn)
{
    pdp_model *m = dp->master;
    size_t bytes = (size_t)m->param_count * sizeof(float);
    pdp_status st;
    int r;
    dp->stats.reduce_bytes = 0;
    for (r = 1; r < dp->active; r++) {
        const pdp__dp_worker *w = &dp->workers[r];
        const float *src = w->replica->grad_block;
        if (!pdp__same_device(w->device, m->device)) {
            if ((st = pdp__dev_copy(m->device, dp->stage, w->device, src, bytes)) != PDP_OK)
                return pdp__err_wrap(st, "%s: reduce from replica %d", fn, r);
            src = dp->stage;
        }
        if ((st = pdp__dev_add(m->device, m->grad_block, src, m->param_count)) != PDP_OK)
            return pdp__err_wrap(st, "%s: reduce from replica %d", fn, r);
        dp->stats.reduce_bytes += bytes;
    }
    return PDP_OK;
}

/* The optimizer the CPU reduce may run inside its slices, or NULL: on CPU replicas
   the master's step costs one core a pass over every parameter while the others
   wait; fused, each worker updates the slice it has just summed, still in cache.
   Only for a whole-model optimizer that pdp_optim_step would accept (its checks run
   first, so an error is reported before anything changes), and with 2+ workers
   active (one worker runs no reduce). */
static pdp_status pdp__dp_fused_step(pdp_dp *dp, pdp_optim *opt, pdp_optim **out, const char *fn)
{
    pdp_status st;
    *out = NULL;
    if (dp->cuda || dp->active < 2) return PDP_OK;
    if ((st = pdp__optim_check_step(opt)) != PDP_OK) return pdp__err_wrap(st, "%s: master step", fn);
    if (opt->lo != 0 || opt->hi != dp->master->param_count) return PDP_OK;
    *out = opt;
    return PDP_OK;
}

/* Step: the optimizer updates the master's parameters; replicas see them at the
   next replicate. */
static pdp_status pdp__dp_master_step(pdp_optim *opt, const char *fn)
{
    pdp_status st = pdp_optim_step(opt);
    return st == PDP_OK ? PDP_OK : pdp__err_wrap(st, "%s: master step", fn);
}

/* ---- dp: one step ---- */

static pdp_status pdp__dp_run(pdp_dp *dp, pdp_optim *opt, const pdp_tensor *x,
                              const int32_t *labels, float *loss, bool zero_and_step,
                              const char *fn)
{
    pdp_dp_times t;
    pdp_optim *fused = NULL;
    double t0 = pdp__now(), c0 = pdp__dp_thread_cpu(), ts, loss_sum = 0.0;
    pdp_status st;
    memset(&t, 0, sizeof t);
    if (!dp || !x || !labels) return pdp__err(PDP_ERR_INVALID, "%s: NULL argument", fn);
    if (zero_and_step && !opt) return pdp__err(PDP_ERR_INVALID, "%s: optimizer is NULL", fn);
    if (opt && opt->model != dp->master)
        return pdp__err(PDP_ERR_INVALID, "%s: the optimizer was created on another model, not the "
                        "master", fn);
    if (x->ndim < 2 || x->shape[0] < 1 || !x->data) {
        char a[96];
        return pdp__err(PDP_ERR_SHAPE, "%s: x is %s; expected [batch, sample...] with batch >= 1",
                        fn, pdp__shape_str(x, a, sizeof a));
    }
    /* a GPU master also takes a host batch: scatter uploads each shard */
    if (!pdp__same_device(x->device, dp->master->device) &&
        !(dp->cuda && x->device.kind == PDP_DEVICE_CPU))
        return pdp__err(PDP_ERR_DEVICE, "%s: x on device %d:%d, master on %d:%d", fn,
                        x->device.kind, x->device.ordinal, dp->master->device.kind,
                        dp->master->device.ordinal);

    dp->jobs_cpu = 0.0;
    dp->batch = x->shape[0];
    dp->active = (int)PDP__MIN((int64_t)dp->n, dp->batch); /* the others idle this step */

    ts = pdp__now();
    if ((st = pdp__dp_replicate(dp, fn)) != PDP_OK) return st;
    t.replicate = pdp__now() - ts;
    ts = pdp__now();
    if ((st = pdp__dp_scatter(dp, x, labels, fn)) != PDP_OK) return st;
    t.scatter = pdp__now() - ts;
    ts = pdp__now();
    if ((st = pdp__dp_parallel_apply(dp, zero_and_step, &t.apply_cpu, fn)) != PDP_OK) return st;
    t.apply = pdp__now() - ts;
    ts = pdp__now();
    if ((st = pdp__dp_gather(dp, &loss_sum, fn)) != PDP_OK) return st;
    t.gather = pdp__now() - ts;
    ts = pdp__now();
    if (zero_and_step && (st = pdp__dp_fused_step(dp, opt, &fused, fn)) != PDP_OK) return st;
    if (dp->cuda) {
        if ((st = pdp__dp_reduce_device(dp, fn)) != PDP_OK) return st;
    } else {
        pdp__dp_reduce(dp, fused, &t.reduce_cpu);
    }
    t.reduce = pdp__now() - ts;
    if (fused) {
        pdp__optim_finish_step(fused);
    } else if (zero_and_step) {
        ts = pdp__now();
        if ((st = pdp__dp_master_step(opt, fn)) != PDP_OK) return st;
        t.step = pdp__now() - ts;
    }
    if (loss) *loss = (float)(loss_sum / (double)dp->batch);

    /* ---- dp: stats ---- */
    t.total = pdp__now() - t0;
    t.critical_cpu = pdp__dp_thread_cpu() - c0 - dp->jobs_cpu + t.apply_cpu + t.reduce_cpu;
    dp->stats.steps++;
    dp->stats.batch = dp->batch;
    dp->stats.active_workers = dp->active;
    dp->stats.bytes_from_master = dp->stats.replicate_bytes + dp->stats.scatter_bytes;
    dp->stats.bytes_to_master = dp->stats.gather_bytes + dp->stats.reduce_bytes;
    dp->stats.last = t;
    dp->stats.sum.replicate += t.replicate;
    dp->stats.sum.scatter += t.scatter;
    dp->stats.sum.apply += t.apply;
    dp->stats.sum.gather += t.gather;
    dp->stats.sum.reduce += t.reduce;
    dp->stats.sum.step += t.step;
    dp->stats.sum.total += t.total;
    dp->stats.sum.apply_cpu += t.apply_cpu;
    dp->stats.sum.reduce_cpu += t.reduce_cpu;
    dp->stats.sum.critical_cpu += t.critical_cpu;
    if (opt) dp->optim_bytes = (size_t)opt->nstate * (size_t)opt->count * sizeof(float);
    pdp__dp_memory(dp);
    return PDP_OK;
}

PDP_API pdp_status pdp_dp_step(pdp_dp *dp, pdp_optim *opt, const pdp_tensor *x,
                               const int32_t *labels, float *loss)
{
    return pdp__dp_run(dp, opt, x, labels, loss, true, "pdp_dp_step");
}

PDP_API pdp_status pdp_dp_forward_backward(pdp_dp *dp, const pdp_tensor *x, const int32_t *labels,
                                           float *loss)
{
    return pdp__dp_run(dp, NULL, x, labels, loss, false, "pdp_dp_forward_backward");
}

/* ---- dp: stats ---- */

PDP_API pdp_status pdp_dp_get_stats(const pdp_dp *dp, pdp_dp_stats *out)
{
    if (!dp || !out) return pdp__err(PDP_ERR_INVALID, "pdp_dp_get_stats: NULL argument");
    *out = dp->stats;
    return PDP_OK;
}

PDP_API int pdp_dp_stats_format(const pdp_dp_stats *s, char *buf, size_t bytes)
{
    const pdp_dp_times *t, *u;
    double ms = 1e3, mean = 1e3 / (double)PDP__MAX(s ? s->steps : 1, 1);
    if (!s) return 0;
    t = &s->last;
    u = &s->sum;
    return snprintf(
        buf, bytes,
        "dp: %d workers (%d active), batch %lld, step %lld, params %s\n"
        "  last step ms: replicate %.3f  scatter %.3f  apply %.3f (workers %.3f..%.3f)"
        "  gather %.3f  reduce %.3f  step %.3f  total %.3f\n"
        "  mean ms:      replicate %.3f  scatter %.3f  apply %.3f  gather %.3f  reduce %.3f"
        "  step %.3f  total %.3f\n"
        "  traffic: master -> replicas %.2f MB (params %.2f, inputs %.2f), "
        "replicas -> master %.2f MB (grads %.2f, outputs %.3f)\n"
        "  memory: master %.2f MB, largest other replica %.2f MB (master / replica %.2fx)\n",
        s->num_workers, s->active_workers, (long long)s->batch, (long long)s->steps,
        s->params_shared ? "shared (read in place)" : "copied", t->replicate * ms,
        t->scatter * ms, t->apply * ms, s->apply_worker_min * ms, s->apply_worker_max * ms,
        t->gather * ms, t->reduce * ms, t->step * ms, t->total * ms, u->replicate * mean,
        u->scatter * mean, u->apply * mean, u->gather * mean, u->reduce * mean, u->step * mean,
        u->total * mean,
        (double)s->bytes_from_master / 1e6, (double)s->replicate_bytes / 1e6,
        (double)s->scatter_bytes / 1e6, (double)s->bytes_to_master / 1e6,
        (double)s->reduce_bytes / 1e6, (double)s->gather_bytes / 1e6,
        (double)s->master_bytes / 1e6, (double)s->replica_bytes / 1e6,
        s->replica_bytes ? (double)s->master_bytes / (double)s->replica_bytes : 0.0);
}
/* ---- end src/dp.c ---- */

/* ---- begin src/reducer.c ---- */
/* reducer: the bucket reducer that DDP and ZeRO share, PyTorch's Reducer
   (torch/csrc/distributed/c10d/reducer.cpp) in miniature, with the collective
   of a bucket as a parameter.

   Buckets are planned once, at construction, walking the parameters in reverse
   registration order and closing a bucket as soon as it holds cap bytes or more
   (the first: first bytes), PyTorch's compute_bucket_assignment_by_size.
   Because the model keeps its gradients in one block in registration order, a
   bucket of consecutive parameters in reverse order is one contiguous range
   [offset, offset + count) of that block: the collective runs on the gradients
   themselves, with no flattening copy (PyTorch's gradient_as_bucket_view=True,
   here by construction).

   The executor hands in its collective, one function pointer called once per
   bucket per synchronised backward (the only indirection on the hot path):
   DDP all-reduces (average) the bucket in place; ZeRO reduce-scatters it into
   the part of the flat block its rank owns. An optional after_step hook runs
   after the optimizer step (ZeRO: all-gather the updated parameters); op_name
   names the collective in the trace ("allreduce bucket 3"). With whole_layers
   a bucket never splits a layer's weight from its bias (ZeRO's units, whose
   layers it points at per-unit buffers). bucket_done (optional) runs after a
   bucket's collective has completed successfully, whoever waited for it
   (pdp__reducer_wait_bucket: finish, or the executor reusing a buffer).

   A communication hook (ddp.h's pdp_ddp_comm_hook, PyTorch's register_comm_hook)
   replaces the collective: the executor's reduce builds the bucket's view (what
   its collective would reduce, and where the result goes) and hands it to
   pdp__reducer_hook_launch, which calls the hook's launch with the bucket's piece
   of the scratch memory allocated once at registration; pdp__reducer_wait_bucket
   calls the hook's finish after the wait, before bucket_done, and a failing
   finish is reported like a failed collective, naming the bucket. Registration
   is refused once a backward has run (the buckets' collectives must be the same
   on every rank from the first step on).

   Every backward of the wrapped model synchronises, whatever computed its
   output gradient (the built-in cross-entropy, pdp_loss_mse, a user's own
   loss): the reducer listens to the model's BACKWARD_BEGIN and BACKWARD_END
   events (the executor seam of internal.h), arms itself at the start of every
   pdp_model_backward unless no_sync is on, and launches the leftover buckets
   at its end. A backward while the last one's buckets are still being reduced
   is refused by BACKWARD_BEGIN with a message naming the executor's finish.
   The executor may listen to the events too (desc.event: ZeRO points the
   layers at its buffers there).

   Per synchronised backward: pending[b] starts at the number of parameters in
   bucket b; the model's grad hook, fired once per parameter right after its
   layer's backward, decrements it; at zero the bucket is ready. Ready buckets
   launch strictly in bucket order (a later bucket that is ready first waits for
   the earlier ones), so every rank issues the same collectives in the same
   order whatever order its hooks fire in. A bucket whose parameters never get
   a gradient (unused in this forward) launches at the end of backward, so no
   rank waits on it. pdp__reducer_finish waits for the buckets in order and
   reports the first failure naming the bucket and its parameters.

   States: IDLE (nothing pending), LOCAL (gradients accumulated under no_sync,
   not reduced), REDUCING (a synchronised backward launched its buckets and
   finish has not run). The progress of a bucket's collective writes the
   gradient memory, so nothing else may touch the gradients while REDUCING: a
   second backward is refused and pdp__reducer_release waits first. Nothing on
   the per-step path allocates: buckets, handles (the backends' pools) and
   messages are fixed-size. Every function takes fn, the public function on
   whose behalf it runs, to start its messages. */

/* #include "internal.h" (already above) */

/* ---- reducer: state ---- */

typedef enum pdp__red_state {
    PDP__RED_IDLE,
    PDP__RED_LOCAL,
    PDP__RED_REDUCING
} pdp__red_state;

typedef struct pdp__reducer pdp__reducer;

/* Launches bucket b's collective (asynchronously, handle in *w) on r->c; the
   bucket is r->buckets[b].info, the gradients r->m->grad_block. */
typedef pdp_status (*pdp__reduce_fn)(pdp__reducer *r, int b, pdp_work **w);
/* Runs after the optimizer step of pdp__reducer_step (ZeRO: all-gather). */
typedef pdp_status (*pdp__after_step_fn)(pdp__reducer *r, const char *fn);
/* Runs once bucket b's collective has completed successfully. */
typedef void (*pdp__bucket_done_fn)(pdp__reducer *r, int b);

typedef struct pdp__reducer_desc {
    double cap_bytes;              /* close a bucket at >= this many bytes */
    double first_bytes;            /* the same for bucket 0 */
    pdp__reduce_fn reduce;         /* required */
    pdp__after_step_fn after_step; /* NULL: nothing */
    const char *op_name;           /* the collective's name in the trace ("allreduce") */
    const char *finish_names;      /* for messages: "pdp_ddp_step or pdp_ddp_finish" */
    void *user;                    /* the executor, for reduce and after_step */
    bool whole_layers;             /* never split a layer between buckets */
    pdp__bucket_done_fn bucket_done;  /* NULL: nothing */
    pdp__model_event_fn event;        /* the model's events (BACKWARD_BEGIN/END after the
                                         reducer's own handling), user = the reducer */
} pdp__reducer_desc;

typedef struct pdp__red_bucket {
    pdp_ddp_bucket info;
    int nparams;
    int pending;          /* parameters still to report in this backward */
    bool ready, launched;
    bool hook_pending;    /* the comm hook launched it: its finish is still to run */
    pdp_work *work;
    double t_launch;
    pdp_comm_hook_bucket view; /* what the comm hook was given (finish gets the same) */
} pdp__red_bucket;

struct pdp__reducer {
    pdp_model *m;
    pdp_comm *c;
    pdp__reducer_desc desc;
    pdp__red_bucket *buckets;
    int nbuckets;
    int *bucket_of;       /* per parameter */
    int next_launch;      /* the first bucket not launched yet */
    pdp__red_state state;
    bool no_sync;
    bool armed;           /* the hook reduces (a synchronised backward is running) */
    bool failed;          /* the last synchronised backward failed: gradients incomplete */
    pdp_status launch_status;
    char launch_msg[512];
    int twice_param;      /* a parameter reported twice in one backward, or -1 */
    int launched_in_backward; /* buckets launched by the grad hook (before backward ended) */
    pdp_status wait_status;   /* the first failed bucket wait of this backward */
    char wait_msg[768];
    double busy;              /* execution seconds of this backward's waited buckets */
    int64_t bytes_at_arm;
    double backward_acc;  /* forward + backward seconds since the last finish */
    pdp_ddp_stats stats;  /* grad_bytes is the executor's to set */
    bool traced;
    int trace_compute, trace_comm;
    bool backward_seen;   /* a backward has run: too late to register a comm hook */
    pdp_ddp_comm_hook hook; /* hook.launch NULL: none; the executor's own collective */
    void *scratch;        /* the hook's scratch memory on the model's device, or NULL */
    int64_t *scratch_off; /* per bucket: its piece of scratch, in floats of the gradient */
};

/* ---- reducer: buckets ---- */

static pdp_status pdp__reducer_plan(pdp__reducer *r)
{
    const pdp_model *m = r->m;
    double cap = r->desc.cap_bytes, first = r->desc.first_bytes;
    double bytes = 0.0;
    int p, b = 0, last = m->nparams - 1;
    r->buckets = (pdp__red_bucket *)pdp__calloc((size_t)PDP__MAX(1, m->nparams) *
                                                sizeof *r->buckets);
    r->bucket_of = (int *)pdp__calloc((size_t)PDP__MAX(1, m->nparams) * sizeof *r->bucket_of);
    if (!r->buckets || !r->bucket_of) return PDP_ERR_OUT_OF_MEMORY;
    for (p = m->nparams - 1; p >= 0; p--) {
        bytes += (double)m->params[p].count * sizeof(float);
        r->bucket_of[p] = b;
        if (r->desc.whole_layers && p > 0 && m->params[p - 1].layer == m->params[p].layer)
            continue; /* the layer's weight joins its bias */
        if (bytes >= (b == 0 ? first : cap) || p == 0) { /* close bucket b: params p..last */
            pdp__red_bucket *k = &r->buckets[b];
            k->info.first_param = p;
            k->info.last_param = last;
            k->info.offset = m->params[p].offset;
            k->info.count = m->params[last].offset + m->params[last].count - k->info.offset;
            k->nparams = last - p + 1;
            b++;
            last = p - 1;
            bytes = 0.0;
        }
    }
    r->nbuckets = b;
    return PDP_OK;
}

/* "bucket 1 of 3 (0.weight..0.bias, 1.57 MiB)" */
static void pdp__red_bucket_name(const pdp__reducer *r, int b, char *out, size_t cap)
{
    const pdp__red_bucket *k = &r->buckets[b];
    snprintf(out, cap, "bucket %d of %d (%s..%s, %.3g MiB)", b, r->nbuckets,
             r->m->params[k->info.first_param].name, r->m->params[k->info.last_param].name,
             (double)k->info.count * 4.0 / 1048576.0);
}

static void pdp__reducer_launch(pdp__reducer *r, int b)
{
    pdp__red_bucket *k = &r->buckets[b];
    pdp_status st;
    k->launched = true;
    k->t_launch = pdp__now();
    st = r->desc.reduce(r, b, &k->work);
    if (st != PDP_OK && r->launch_status == PDP_OK) {
        char name[160];
        pdp__red_bucket_name(r, b, name, sizeof name);
        r->launch_status = st;
        snprintf(r->launch_msg, sizeof r->launch_msg, "%s: %.300s", name, pdp_last_error());
    }
}

/* Launches every ready bucket that has no unlaunched bucket before it. */
static void pdp__reducer_launch_ready(pdp__reducer *r)
{
    while (r->next_launch < r->nbuckets && r->buckets[r->next_launch].ready)
        pdp__reducer_launch(r, r->next_launch++);
}

/* The model's grad hook: parameter p's gradient is final for this backward. */
static void pdp__reducer_hook(void *user, pdp_model *m, int p)
{
    pdp__reducer *r = (pdp__reducer *)user;
    pdp__red_bucket *k;
    (void)m;
    if (!r->armed) return; /* no_sync: accumulate locally */
    k = &r->buckets[r->bucket_of[p]];
    if (k->ready) {
        if (r->twice_param < 0) r->twice_param = p;
        return;
    }
    if (--k->pending == 0) {
        int before = r->next_launch;
        k->ready = true;
        pdp__reducer_launch_ready(r);
        r->launched_in_backward += r->next_launch - before;
    }
}

static void pdp__reducer_arm(pdp__reducer *r)
{
    pdp_comm_stats cs;
    int b;
    for (b = 0; b < r->nbuckets; b++) {
        pdp__red_bucket *k = &r->buckets[b];
        k->pending = k->nparams;
        k->ready = k->launched = k->hook_pending = false;
        k->work = NULL;
    }
    r->next_launch = 0;
    r->launch_status = PDP_OK;
    r->launch_msg[0] = '\0';
    r->twice_param = -1;
    r->launched_in_backward = 0;
    r->wait_status = PDP_OK;
    r->wait_msg[0] = '\0';
    r->busy = 0.0;
    pdp_comm_get_stats(r->c, &cs);
    r->bytes_at_arm = cs.bytes_sent;
    r->armed = true;
}

/* The model's events. BACKWARD_BEGIN refuses a backward while the last one is
   being reduced and arms the reducer (unless no_sync); BACKWARD_END launches the
   buckets whose parameters got no gradient and records the state. */
static pdp_status pdp__reducer_event(void *user, pdp_model *m, pdp__model_event ev, int layer,
                                     pdp_status st)
{
    pdp__reducer *r = (pdp__reducer *)user;
    switch (ev) {
    case PDP__EV_BACKWARD_BEGIN:
        if (r->state == PDP__RED_REDUCING)
            return pdp__err(PDP_ERR_STATE, "rank %d: the last backward's buckets are still being "
                            "reduced; call %s first", r->c->rank, r->desc.finish_names);
        r->backward_seen = true;
        if (!r->no_sync) pdp__reducer_arm(r);
        break;
    case PDP__EV_BACKWARD_END:
        if (r->armed) {
            r->state = PDP__RED_REDUCING;
            r->failed = st != PDP_OK;
            if (st == PDP_OK) { /* buckets of parameters that got no gradient */
                int b;
                for (b = 0; b < r->nbuckets; b++) r->buckets[b].ready = true;
                pdp__reducer_launch_ready(r);
            }
            r->armed = false;
        } else if (st == PDP_OK) {
            r->state = PDP__RED_LOCAL;
        }
        break;
    default:
        break;
    }
    return r->desc.event ? r->desc.event(user, m, ev, layer, st) : PDP_OK;
}

/* ---- reducer: construction ---- */

/* One parameter as the construction check compares it. */
typedef struct pdp__red_sig {
    char name[32];
    int64_t ndim;
    int64_t shape[4];
} pdp__red_sig;

static void pdp__red_sig_of(const pdp_model *m, int p, pdp__red_sig *s)
{
    const pdp__param_entry *e = &m->params[p];
    memset(s, 0, sizeof *s);
    memcpy(s->name, e->name, sizeof s->name);
    s->ndim = e->ndim;
    memcpy(s->shape, e->shape, sizeof s->shape);
}

static void pdp__red_sig_str(const pdp__red_sig *s, char *out, size_t cap)
{
    int i;
    size_t n = (size_t)snprintf(out, cap, "'%.32s' [", s->name);
    for (i = 0; i < s->ndim && i < 4 && n < cap; i++)
        n += (size_t)snprintf(out + n, cap - n, i ? ", %lld" : "%lld", (long long)s->shape[i]);
    if (n < cap) snprintf(out + n, cap - n, "]");
}

/* All-gather of count host floats per rank. Collective buffers live on the
   communicator's device (NCCL reads GPU memory only), so a GPU communicator
   stages them through a small device buffer; used once, at construction. */
static pdp_status pdp__reducer_allgather_host(pdp_comm *c, const float *send, float *recv,
                                              int64_t count)
{
    float *dev = NULL;
    size_t send_bytes = (size_t)count * sizeof(float);
    pdp_status st;
    if (c->device.kind == PDP_DEVICE_CPU) return pdp_comm_allgather(c, send, recv, count, NULL);
    if ((st = pdp__dev_alloc(c->device, send_bytes * (size_t)(c->size + 1), (void **)&dev)) ==
            PDP_OK &&
        (st = pdp__dev_copy(c->device, dev, pdp_cpu(), send, send_bytes)) == PDP_OK &&
        (st = pdp_comm_allgather(c, dev, dev + count, count, NULL)) == PDP_OK)
        st = pdp__dev_copy(pdp_cpu(), recv, c->device, dev + count, send_bytes * (size_t)c->size);
    pdp__dev_free(c->device, dev);
    return st;
}

/* Every rank compares its registry with rank 0's; all learn the first
   difference of every rank through an all-gather, so all fail together. */
static pdp_status pdp__reducer_check_params(const pdp_model *m, pdp_comm *c, const char *fn)
{
    int64_t n0 = m->nparams;
    pdp__red_sig *table = NULL, mine;
    float diff, *all = NULL;
    int p, q, mine_at = -1, worst_rank = -1, worst_at = -1, size = c->size;
    pdp_status st;
    if ((st = pdp_comm_broadcast_bytes(c, &n0, sizeof n0, 0)) != PDP_OK)
        return pdp__err_wrap(st, "%s: rank %d: exchanging parameter counts", fn, c->rank);
    if (n0 < 0 || n0 > (1 << 24))
        return pdp__err(PDP_ERR_INVALID, "%s: rank 0 reports %lld parameters", fn, (long long)n0);
    table = (pdp__red_sig *)pdp__calloc((size_t)PDP__MAX(1, n0) * sizeof *table);
    all = (float *)pdp__calloc((size_t)size * sizeof *all);
    if (!table || !all) {
        st = pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory for %lld parameter signatures", fn,
                      (long long)n0);
        goto out; /* the others then time out on the next collective: memory is gone anyway */
    }
    if (c->rank == 0)
        for (p = 0; p < n0; p++) pdp__red_sig_of(m, p, &table[p]);
    if ((st = pdp_comm_broadcast_bytes(c, table, (size_t)n0 * sizeof *table, 0)) != PDP_OK) {
        st = pdp__err_wrap(st, "%s: rank %d: exchanging parameter signatures", fn, c->rank);
        goto out;
    }
    for (p = 0; p < PDP__MAX(n0, (int64_t)m->nparams); p++) {
        if (p >= n0 || p >= m->nparams) {
            mine_at = p;
            break;
        }
        pdp__red_sig_of(m, p, &mine);
        if (memcmp(&mine, &table[p], sizeof mine) != 0) {
            mine_at = p;
            break;
        }
    }
    diff = (float)mine_at;
    if ((st = pdp__reducer_allgather_host(c, &diff, all, 1)) != PDP_OK) {
        st = pdp__err_wrap(st, "%s: rank %d: exchanging the check's verdicts", fn, c->rank);
        goto out;
    }
    for (q = 0; q < size; q++)
        if (all[q] >= 0.0f && (worst_at < 0 || (int)all[q] < worst_at)) {
            worst_at = (int)all[q];
            worst_rank = q;
        }
    if (worst_at >= 0) {
        char a[160], b[160];
        if (mine_at >= 0) {
            if (mine_at < m->nparams) pdp__red_sig_of(m, mine_at, &mine);
            if (mine_at < m->nparams) pdp__red_sig_str(&mine, a, sizeof a);
            else snprintf(a, sizeof a, "missing (it has %d parameters)", m->nparams);
            if (mine_at < n0) pdp__red_sig_str(&table[mine_at], b, sizeof b);
            else snprintf(b, sizeof b, "missing (it has %lld parameters)", (long long)n0);
            st = pdp__err(PDP_ERR_INVALID, "%s: parameters differ across ranks: parameter %d is "
                          "%s on rank %d but %s on rank 0", fn, mine_at, a, c->rank, b);
        } else {
            if (worst_at < n0) pdp__red_sig_str(&table[worst_at], b, sizeof b);
            else snprintf(b, sizeof b, "missing on rank 0 (%lld parameters)", (long long)n0);
            st = pdp__err(PDP_ERR_INVALID, "%s: parameters differ across ranks: rank %d's "
                          "parameter %d differs from rank 0's %s (rank %d's error names both)",
                          fn, worst_rank, worst_at, b, worst_rank);
        }
    }
out:
    pdp__dealloc(table);
    pdp__dealloc(all);
    return st;
}


/* Sets up r (zeroed memory, owned by the executor) on m and c: checks that the
   model can take a reducer, plans the buckets, and then, collectively (every
   rank of c runs the same calls), checks that every rank has the same
   parameters, copies rank 0's parameters to every rank, zeroes the gradients,
   opens the trace and installs the grad hook. On failure the executor calls
   pdp__reducer_release(r). */
static pdp_status pdp__reducer_init(pdp__reducer *r, pdp_model *m, pdp_comm *c,
                                    const pdp__reducer_desc *desc, const char *fn)
{
    pdp_status st;
    PDP_ASSERT(desc && desc->reduce && desc->op_name && desc->finish_names);
    if (m->params_shared)
        return pdp__err(PDP_ERR_STATE, "%s: the model is a DataParallel replica", fn);
    if (m->hook || m->event)
        return pdp__err(PDP_ERR_STATE, "%s: the model already has a grad hook (another DDP?)", fn);
    if (m->device.kind != c->device.kind || m->device.ordinal != c->device.ordinal)
        return pdp__err(PDP_ERR_DEVICE, "%s: model on device %d:%d, communicator '%s' on %d:%d",
                        fn, m->device.kind, m->device.ordinal, c->name, c->device.kind,
                        c->device.ordinal);
    r->m = m;
    r->c = c;
    r->desc = *desc;
    if (pdp__reducer_plan(r) != PDP_OK)
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory for %d buckets", fn, m->nparams);
    /* collective from here on: every rank runs the same calls */
    if ((st = pdp__reducer_check_params(m, c, fn)) != PDP_OK) return st;
    if (m->param_count &&
        (st = pdp_comm_broadcast(c, m->param_block, m->param_count, 0, NULL)) != PDP_OK)
        return pdp__err_wrap(st, "%s: rank %d: broadcasting rank 0's parameters", fn, c->rank);
    pdp_model_zero_grad(m);
    if (pdp__trace_open(c->backend == PDP_BACKEND_LOCAL ? -1 : c->rank) == PDP_OK) {
        r->traced = true;
        if (pdp__trace_enabled()) {
            char name[64];
            r->trace_compute = pdp__trace_track(c->rank, "compute");
            snprintf(name, sizeof name, "comm %s", c->name);
            r->trace_comm = pdp__trace_track(c->rank, name);
            m->trace_pid = c->rank;
            m->trace_tid = r->trace_compute;
        }
    }
    pdp_model_set_grad_hook(m, pdp__reducer_hook, r);
    m->event = pdp__reducer_event;
    m->event_user = r;
    r->stats.buckets = r->nbuckets;
    return PDP_OK;
}

/* Waits for buckets still in flight, removes the hook, frees the buckets. */
static void pdp__reducer_release(pdp__reducer *r)
{
    int b;
    if (r->buckets)
        for (b = 0; b < r->nbuckets; b++) /* the progress thread may still write gradients */
            if (r->buckets[b].launched && r->buckets[b].work) pdp_work_wait(r->buckets[b].work);
    if (r->m && r->m->hook == pdp__reducer_hook && r->m->hook_user == r) {
        pdp_model_set_grad_hook(r->m, NULL, NULL);
        r->m->event = NULL;
        r->m->event_user = NULL;
        r->m->trace_tid = 0;
    }
    if (r->traced) pdp__trace_close();
    if (r->scratch) pdp__dev_free(r->m->device, r->scratch);
    pdp__dealloc(r->scratch_off);
    pdp__dealloc(r->buckets);
    pdp__dealloc(r->bucket_of);
    r->buckets = NULL;
    r->bucket_of = NULL;
    r->scratch = NULL;
    r->scratch_off = NULL;
    r->traced = false;
}

/* ---- reducer: communication hooks ---- */

/* Registers hook (fn names the public entry: pdp_ddp_register_comm_hook or
   pdp_zero_register_comm_hook). The scratch is total floats' worth of
   hook->scratch_bytes_per_float bytes on the model's device, allocated here once;
   bucket b's piece starts off[b] floats in (off NULL: at the bucket's offset in the
   flat block, total = the parameter count). */
static pdp_status pdp__reducer_set_hook(pdp__reducer *r, const pdp_ddp_comm_hook *hook,
                                        const int64_t *off, int64_t total, const char *fn)
{
    size_t bytes;
    int b;
    if (!hook) return pdp__err(PDP_ERR_INVALID, "%s: hook is NULL", fn);
    if (!hook->launch)
        return pdp__err(PDP_ERR_INVALID, "%s: hook->launch is NULL (a hook must start the "
                        "bucket's collective)", fn);
    if (hook->scratch_bytes_per_float < 0 || hook->scratch_bytes_per_float > 64)
        return pdp__err(PDP_ERR_INVALID, "%s: hook->scratch_bytes_per_float %d outside 0..64", fn,
                        hook->scratch_bytes_per_float);
    if (r->hook.launch)
        return pdp__err(PDP_ERR_STATE, "%s: rank %d: a communication hook is already registered "
                        "(one per executor, as PyTorch's register_comm_hook)", fn, r->c->rank);
    if (r->backward_seen)
        return pdp__err(PDP_ERR_STATE, "%s: rank %d: a backward has already run; register the "
                        "hook before the first backward", fn, r->c->rank);
    if (hook->scratch_bytes_per_float > 0) {
        bytes = (size_t)total * (size_t)hook->scratch_bytes_per_float;
        r->scratch_off = (int64_t *)pdp__calloc((size_t)PDP__MAX(1, r->nbuckets) * sizeof(int64_t));
        if (!r->scratch_off)
            return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory for %d buckets", fn,
                            r->nbuckets);
        for (b = 0; b < r->nbuckets; b++)
            r->scratch_off[b] = off ? off[b] : r->buckets[b].info.offset;
        if (pdp__dev_alloc(r->m->device, bytes, &r->scratch) != PDP_OK) {
            pdp__dealloc(r->scratch_off);
            r->scratch_off = NULL;
            return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: rank %d: no memory for the hook's %zu "
                            "bytes of scratch", fn, r->c->rank, bytes);
        }
    }
    r->hook = *hook;
    return PDP_OK;
}

/* The executor's reduce with a hook registered: v holds the collective's part of the
   view (grad, count, reduce_scatter, recv, recv_count); the rest is filled here. */
static pdp_status pdp__reducer_hook_launch(pdp__reducer *r, int b, const pdp_comm_hook_bucket *v,
                                           pdp_work **w)
{
    pdp__red_bucket *k = &r->buckets[b];
    pdp_status st;
    k->view = *v;
    k->view.index = b;
    k->view.nbuckets = r->nbuckets;
    k->view.offset = k->info.offset;
    k->view.device = r->m->device;
    k->view.rank = r->c->rank;
    k->view.world_size = r->c->size;
    k->view.scratch = r->scratch ? (char *)r->scratch + r->scratch_off[b] *
                                                           (int64_t)r->hook.scratch_bytes_per_float
                                 : NULL;
    *w = NULL;
    st = r->hook.launch(r->hook.state, r->c, &k->view, w);
    if (st != PDP_OK) {
        char msg[400];
        snprintf(msg, sizeof msg, "%.399s", pdp_last_error());
        *w = NULL;
        return pdp__err(st, "comm hook launch: %s", msg);
    }
    k->hook_pending = true;
    return PDP_OK;
}

/* ---- reducer: training ---- */

/* Forward, loss and backward on this rank's shard; the buckets launch as their
   gradients become ready (unless no_sync): the model's events do it. */
static pdp_status pdp__reducer_backward(pdp__reducer *r, const pdp_tensor *x,
                                        const int32_t *labels, float *loss, const char *fn)
{
    double t0 = pdp__now();
    pdp_status st;
    if (r->state == PDP__RED_REDUCING) /* before the forward, which would be wasted */
        return pdp__err(PDP_ERR_STATE, "%s: rank %d: the last backward's buckets are still being "
                        "reduced; call %s first", fn, r->c->rank, r->desc.finish_names);
    st = pdp_model_forward_backward(r->m, x, labels, loss);
    r->backward_acc += pdp__now() - t0;
    return st == PDP_OK ? st : pdp__err_wrap(st, "%s: rank %d", fn, r->c->rank);
}

/* A user's own loss: forward on this rank's shard (*y: the model's output). */
static pdp_status pdp__reducer_forward(pdp__reducer *r, const pdp_tensor *x, const pdp_tensor **y,
                                       const char *fn)
{
    double t0 = pdp__now();
    pdp_status st;
    if (y) *y = NULL;
    if (r->state == PDP__RED_REDUCING)
        return pdp__err(PDP_ERR_STATE, "%s: rank %d: the last backward's buckets are still being "
                        "reduced; call %s first", fn, r->c->rank, r->desc.finish_names);
    st = pdp_model_forward(r->m, x, y);
    r->backward_acc += pdp__now() - t0;
    return st == PDP_OK ? st : pdp__err_wrap(st, "%s: rank %d", fn, r->c->rank);
}

/* ... and backward from dy, the gradient of the user's loss with respect to y. */
static pdp_status pdp__reducer_backward_dy(pdp__reducer *r, const pdp_tensor *dy, const char *fn)
{
    double t0 = pdp__now();
    pdp_status st = pdp_model_backward(r->m, dy);
    r->backward_acc += pdp__now() - t0;
    return st == PDP_OK ? st : pdp__err_wrap(st, "%s: rank %d", fn, r->c->rank);
}

/* The wait of bucket b's handle: records its time, its trace event and the first
   failure (named after the bucket). */
static pdp_status pdp__reducer_wait_work(pdp__reducer *r, int b)
{
    pdp__red_bucket *k = &r->buckets[b];
    pdp_status st;
    st = pdp_work_wait(k->work);
    if (st != PDP_OK && r->wait_status == PDP_OK) {
        char name[160];
        r->wait_status = st;
        pdp__red_bucket_name(r, b, name, sizeof name);
        snprintf(r->wait_msg, sizeof r->wait_msg, "%s: %.600s", name, pdp_last_error());
    }
    r->busy += k->work->t_done > k->work->t_start ? k->work->t_done - k->work->t_start : 0.0;
    if (r->trace_comm) {
        char name[48], args[88];
        snprintf(name, sizeof name, "%.24s bucket %d", r->desc.op_name, b);
        snprintf(args, sizeof args, "\"grad_bytes\":%lld,\"seq\":%lld,\"queued_us\":%.1f",
                 (long long)k->info.count * 4, (long long)k->work->seq,
                 (k->work->t_start - k->t_launch) * 1e6);
        pdp__trace_async(r->c->rank, r->trace_comm, "comm", name,
                         ((uint64_t)r->c->rank << 40) | (uint64_t)k->work->seq, k->t_launch,
                         k->work->t_done, args);
    }
    k->work = NULL;
    return st;
}

/* Waits for bucket b if it was launched and not waited yet, runs the comm hook's
   finish (a failure is recorded as the wait's, named after the bucket), then
   bucket_done on success. */
static void pdp__reducer_wait_bucket(pdp__reducer *r, int b)
{
    pdp__red_bucket *k = &r->buckets[b];
    pdp_status st = PDP_OK;
    if (!k->launched || (!k->work && !k->hook_pending)) return;
    if (k->work) st = pdp__reducer_wait_work(r, b);
    if (k->hook_pending) { /* the hook's finish: after the wait (decompress) */
        k->hook_pending = false;
        if (st == PDP_OK && r->hook.finish &&
            (st = r->hook.finish(r->hook.state, &k->view)) != PDP_OK && r->wait_status == PDP_OK) {
            char name[160];
            r->wait_status = st;
            pdp__red_bucket_name(r, b, name, sizeof name);
            snprintf(r->wait_msg, sizeof r->wait_msg, "%s: comm hook finish: %.580s", name,
                     pdp_last_error());
        }
    }
    if (st == PDP_OK && r->desc.bucket_done) r->desc.bucket_done(r, b);
}

/* Waits for every bucket of the last synchronised backward, in bucket order;
   the first failure names its bucket and parameters. */
static pdp_status pdp__reducer_finish(pdp__reducer *r, const char *fn)
{
    pdp_status first;
    pdp_comm_stats cs;
    double t0, t1, busy;
    char msg[768];
    int b;
    if (r->state == PDP__RED_IDLE) return PDP_OK;
    if (r->state == PDP__RED_LOCAL)
        return pdp__err(PDP_ERR_STATE, "%s: rank %d: the last backward ran under no_sync; run one "
                        "backward with no_sync off to reduce the accumulated gradients", fn,
                        r->c->rank);
    t0 = pdp__now();
    for (b = 0; b < r->nbuckets; b++) pdp__reducer_wait_bucket(r, b);
    t1 = pdp__now();
    first = r->wait_status;
    busy = r->busy;
    snprintf(msg, sizeof msg, "%s", r->wait_msg);
    r->state = PDP__RED_IDLE;
    if (r->trace_compute) pdp__trace_complete(r->c->rank, r->trace_compute, "compute",
                                              "wait for buckets", t0, t1, NULL);
    if (first == PDP_OK && r->launch_status != PDP_OK) {
        first = r->launch_status;
        snprintf(msg, sizeof msg, "%.700s", r->launch_msg);
    }
    if (first == PDP_OK && r->failed) {
        r->failed = false;
        return pdp__err(PDP_ERR_STATE, "%s: rank %d: the last backward failed after launching %d "
                        "of %d buckets: the gradients are incomplete (this rank must leave the "
                        "group: free its communicator so that the others fail at once)", fn,
                        r->c->rank, r->next_launch, r->nbuckets);
    }
    if (first == PDP_OK && r->twice_param >= 0) {
        return pdp__err(PDP_ERR_STATE, "%s: rank %d: parameter '%s' reported its gradient twice "
                        "in one backward", fn, r->c->rank, r->m->params[r->twice_param].name);
    }
    if (first != PDP_OK)
        return pdp__err(first, "%s: rank %d: %s", fn, r->c->rank, msg);
    pdp_comm_get_stats(r->c, &cs);
    r->stats.steps++;
    r->stats.bytes_sent = cs.bytes_sent - r->bytes_at_arm;
    r->stats.backward_s = r->backward_acc;
    r->stats.allreduce_s = busy;
    r->stats.wait_s = t1 - t0;
    r->stats.hidden_share = busy > 0.0 ? PDP__MAX(0.0, PDP__MIN(1.0, 1.0 - (t1 - t0) / busy)) : 1.0;
    r->stats.launched_in_backward = r->launched_in_backward;
    r->stats.total_bytes_sent += r->stats.bytes_sent;
    r->stats.total_backward_s += r->backward_acc;
    r->stats.total_allreduce_s += busy;
    r->stats.total_wait_s += t1 - t0;
    r->backward_acc = 0.0;
    return PDP_OK;
}

/* After a successful finish: opt's step (a range optimizer steps its range
   only), zeroed gradients, then the executor's after_step. */
static pdp_status pdp__reducer_step(pdp__reducer *r, pdp_optim *opt, const char *fn)
{
    pdp_status st;
    double t0 = pdp__now();
    if ((st = pdp_optim_step(opt)) != PDP_OK)
        return pdp__err_wrap(st, "%s: rank %d", fn, r->c->rank);
    pdp_model_zero_grad(r->m);
    if (r->trace_compute)
        pdp__trace_complete(r->c->rank, r->trace_compute, "compute", "optimizer step", t0,
                            pdp__now(), NULL);
    if (r->desc.after_step && (st = r->desc.after_step(r, fn)) != PDP_OK) return st;
    return PDP_OK;
}

static void pdp__reducer_reset_stats(pdp__reducer *r)
{
    int64_t grad_bytes = r->stats.grad_bytes;
    memset(&r->stats, 0, sizeof r->stats);
    r->stats.buckets = r->nbuckets;
    r->stats.grad_bytes = grad_bytes;
}
/* ---- end src/reducer.c ---- */

/* ---- begin src/ddp.c ---- */
/* ddp: DistributedDataParallel, the executor that runs reducer.c's bucket
   reducer with an all-reduce.

   Each bucket's collective is an all-reduce (average over ranks) in place on
   the bucket's range of the model's gradient block, so after pdp_ddp_finish
   every rank holds the averaged gradients of the whole block and steps a full
   optimizer on it; there is no after-step collective. Buckets are planned from
   bucket_cap_mb and first_bucket_mb (MiB, 2^20 bytes, as PyTorch's). The
   states, the ordering of launches and the failure reports are the reducer's
   (reducer.c). A registered comm hook (ddp.h) replaces the all-reduce; the
   built-in bf16/fp16 compression hooks live here and serve ZeRO too. */

/* #include "internal.h" (already above) */

struct pdp_ddp {
    pdp__reducer r;       /* first: the grad hook's user pointer is &d->r */
    pdp_ddp_desc desc;
};

/* The DDP collective: bucket b's gradients, averaged in place (or the comm hook's). */
static pdp_status pdp__ddp_allreduce(pdp__reducer *r, int b, pdp_work **w)
{
    const pdp_ddp_bucket *k = &r->buckets[b].info;
    if (r->hook.launch) {
        pdp_comm_hook_bucket v;
        memset(&v, 0, sizeof v);
        v.grad = r->m->grad_block + k->offset;
        v.count = k->count;
        return pdp__reducer_hook_launch(r, b, &v, w);
    }
    return pdp_comm_allreduce(r->c, r->m->grad_block + k->offset, k->count, PDP_REDUCE_AVG, w);
}

/* ---- ddp: the built-in compression hooks (ddp.h) ----
   launch: scratch <- 16-bit(grad / N), then a 16-bit SUM of the scratch (all-reduce in
   place, or reduce-scatter with this rank's slice in place); finish: the fp32 result
   widened back into grad (or recv). The hook's state points at its 16-bit type; the
   scratch is the bucket's own. */

static pdp_dtype pdp__hook_dtypes[2] = {PDP_DTYPE_BF16, PDP_DTYPE_F16};

static pdp_status pdp__hook_compress_launch(void *state, pdp_comm *c,
                                            const pdp_comm_hook_bucket *b, pdp_work **work)
{
    pdp_dtype dt = *(const pdp_dtype *)state;
    pdp_status st;
    if ((st = pdp__dev_to16(b->device, b->scratch, b->grad, b->count, 1.0f / (float)b->world_size,
                            (int)dt)) != PDP_OK)
        return st;
    if (!b->reduce_scatter) return pdp_comm_allreduce_ex(c, b->scratch, b->count, dt,
                                                         PDP_REDUCE_SUM, work);
    return pdp_comm_reduce_scatter_ex(c, b->scratch,
                                      (uint16_t *)b->scratch + (int64_t)b->rank * b->recv_count,
                                      b->recv_count, dt, PDP_REDUCE_SUM, work);
}

static pdp_status pdp__hook_compress_finish(void *state, const pdp_comm_hook_bucket *b)
{
    pdp_dtype dt = *(const pdp_dtype *)state;
    if (!b->reduce_scatter) return pdp__dev_from16(b->device, b->grad, b->scratch, b->count, dt);
    return pdp__dev_from16(b->device, b->recv,
                           (const uint16_t *)b->scratch + (int64_t)b->rank * b->recv_count,
                           b->recv_count, dt);
}

static pdp_ddp_comm_hook pdp__hook_compress(pdp_dtype *dt)
{
    pdp_ddp_comm_hook h;
    memset(&h, 0, sizeof h);
    h.launch = pdp__hook_compress_launch;
    h.finish = pdp__hook_compress_finish;
    h.state = dt;
    h.scratch_bytes_per_float = 2;
    return h;
}

PDP_API pdp_ddp_comm_hook pdp_ddp_hook_bf16_compress(void)
{
    return pdp__hook_compress(&pdp__hook_dtypes[0]);
}

PDP_API pdp_ddp_comm_hook pdp_ddp_hook_fp16_compress(void)
{
    return pdp__hook_compress(&pdp__hook_dtypes[1]);
}

/* ---- ddp: construction ---- */

PDP_API pdp_status pdp_ddp_create(pdp_ddp **out, pdp_model *m, pdp_comm *c,
                                  const pdp_ddp_desc *desc)
{
    static const char *fn = "pdp_ddp_create";
    pdp__reducer_desc rd;
    pdp_ddp *d;
    pdp_status st;
    if (!out) return pdp__err(PDP_ERR_INVALID, "%s: out is NULL", fn);
    *out = NULL;
    if (!m || !c) return pdp__err(PDP_ERR_INVALID, "%s: %s is NULL", fn, m ? "comm" : "model");
    if (desc && !(desc->bucket_cap_mb >= 0.0 && desc->bucket_cap_mb <= 1e12 &&
                  desc->first_bucket_mb >= 0.0 && desc->first_bucket_mb <= 1e12))
        return pdp__err(PDP_ERR_INVALID, "%s: bucket_cap_mb %g and first_bucket_mb %g must be "
                        ">= 0 and finite (at most 1e12)", fn, desc->bucket_cap_mb,
                        desc->first_bucket_mb);
    d = (pdp_ddp *)pdp__calloc(sizeof *d);
    if (!d) return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory", fn);
    if (desc) d->desc = *desc;
    d->desc.bucket_cap_mb = PDP__DEF(d->desc.bucket_cap_mb, 25.0);
    d->desc.first_bucket_mb = PDP__DEF(d->desc.first_bucket_mb,
                                       PDP__MIN(1.0, d->desc.bucket_cap_mb));
    memset(&rd, 0, sizeof rd);
    rd.cap_bytes = d->desc.bucket_cap_mb * 1048576.0;
    rd.first_bytes = d->desc.first_bucket_mb * 1048576.0;
    rd.reduce = pdp__ddp_allreduce;
    rd.op_name = "allreduce";
    rd.finish_names = "pdp_ddp_step or pdp_ddp_finish";
    rd.user = d;
    if ((st = pdp__reducer_init(&d->r, m, c, &rd, fn)) != PDP_OK) {
        pdp_ddp_free(d);
        return st;
    }
    d->r.stats.grad_bytes = m->param_count * (int64_t)sizeof(float);
    *out = d;
    return PDP_OK;
}

PDP_API void pdp_ddp_free(pdp_ddp *d)
{
    if (!d) return;
    pdp__reducer_release(&d->r);
    pdp__dealloc(d);
}

/* ---- ddp: training ---- */

PDP_API pdp_status pdp_ddp_forward_backward(pdp_ddp *d, const pdp_tensor *x,
                                            const int32_t *labels, float *loss)
{
    static const char *fn = "pdp_ddp_forward_backward";
    if (!d) return pdp__err(PDP_ERR_INVALID, "%s: ddp is NULL", fn);
    return pdp__reducer_backward(&d->r, x, labels, loss, fn);
}

PDP_API pdp_status pdp_ddp_forward(pdp_ddp *d, const pdp_tensor *x, const pdp_tensor **y)
{
    static const char *fn = "pdp_ddp_forward";
    if (y) *y = NULL;
    if (!d) return pdp__err(PDP_ERR_INVALID, "%s: ddp is NULL", fn);
    return pdp__reducer_forward(&d->r, x, y, fn);
}

PDP_API pdp_status pdp_ddp_backward(pdp_ddp *d, const pdp_tensor *dy)
{
    static const char *fn = "pdp_ddp_backward";
    if (!d) return pdp__err(PDP_ERR_INVALID, "%s: ddp is NULL", fn);
    return pdp__reducer_backward_dy(&d->r, dy, fn);
}

PDP_API pdp_status pdp_ddp_finish(pdp_ddp *d)
{
    static const char *fn = "pdp_ddp_finish";
    if (!d) return pdp__err(PDP_ERR_INVALID, "%s: ddp is NULL", fn);
    return pdp__reducer_finish(&d->r, fn);
}

PDP_API pdp_status pdp_ddp_step(pdp_ddp *d, pdp_optim *opt)
{
    static const char *fn = "pdp_ddp_step";
    pdp_status st;
    if (!d || !opt) return pdp__err(PDP_ERR_INVALID, "%s: %s is NULL", fn, d ? "opt" : "ddp");
    if ((st = pdp_ddp_finish(d)) != PDP_OK) return pdp__err_wrap(st, "%s", fn);
    return pdp__reducer_step(&d->r, opt, fn);
}

PDP_API pdp_status pdp_ddp_register_comm_hook(pdp_ddp *d, const pdp_ddp_comm_hook *hook)
{
    static const char *fn = "pdp_ddp_register_comm_hook";
    if (!d) return pdp__err(PDP_ERR_INVALID, "%s: ddp is NULL", fn);
    return pdp__reducer_set_hook(&d->r, hook, NULL, d->r.m->param_count, fn);
}

PDP_API void pdp_ddp_set_no_sync(pdp_ddp *d, bool no_sync)
{
    if (d) d->r.no_sync = no_sync;
}

PDP_API pdp_model *pdp_ddp_model(const pdp_ddp *d) { return d ? d->r.m : NULL; }
PDP_API pdp_comm *pdp_ddp_comm(const pdp_ddp *d) { return d ? d->r.c : NULL; }
PDP_API int pdp_ddp_num_buckets(const pdp_ddp *d) { return d ? d->r.nbuckets : 0; }

PDP_API pdp_status pdp_ddp_bucket_info(const pdp_ddp *d, int b, pdp_ddp_bucket *out)
{
    if (!d || !out) return pdp__err(PDP_ERR_INVALID, "pdp_ddp_bucket_info: NULL argument");
    if (b < 0 || b >= d->r.nbuckets)
        return pdp__err(PDP_ERR_INVALID, "pdp_ddp_bucket_info: bucket %d outside 0..%d", b,
                        d->r.nbuckets - 1);
    *out = d->r.buckets[b].info;
    return PDP_OK;
}

PDP_API void pdp_ddp_get_stats(const pdp_ddp *d, pdp_ddp_stats *out)
{
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (d) *out = d->r.stats;
}

PDP_API void pdp_ddp_reset_stats(pdp_ddp *d)
{
    if (d) pdp__reducer_reset_stats(&d->r);
}
/* ---- end src/ddp.c ---- */

/* ---- begin src/tp.c ---- */
/* tp: tensor parallelism (see tp.h for the design): the model's TP communicator, the
   constructors of the four TP layer kinds (their kernels are layers_tp.c), statistics,
   and full-tensor checkpoints, which map each rank's slice into the full tensor
   (pdp__tp_runs) through a staging copy of the full (single-device) model.

   Invariants: the model's TP state (comm, rank, size) is fixed once a TP layer exists.
   Nothing here runs during training. */

/* #include "internal.h" (already above) */

/* ---- tp: the model's communicator and the constructors ---- */

PDP_API pdp_status pdp_model_set_tp(pdp_model *m, pdp_comm *tp)
{
    if (!m || !tp) return pdp__err(PDP_ERR_INVALID, "pdp_model_set_tp: NULL argument");
    if (m->tp.nlayers)
        return pdp__err(PDP_ERR_STATE, "pdp_model_set_tp: the model already has %d TP layers "
                        "(set the communicator before the first)", m->tp.nlayers);
    if (tp->device.kind != m->device.kind || tp->device.ordinal != m->device.ordinal)
        return pdp__err(PDP_ERR_DEVICE, "pdp_model_set_tp: communicator '%s' on device %d:%d, "
                        "model on %d:%d", tp->name, tp->device.kind, tp->device.ordinal,
                        m->device.kind, m->device.ordinal);
    m->tp.comm = tp;
    m->tp.rank = pdp_comm_rank(tp);
    m->tp.size = pdp_comm_size(tp);
    return PDP_OK;
}

PDP_API pdp_comm *pdp_model_tp(const pdp_model *m) { return m ? m->tp.comm : NULL; }

/* Appends TP layer l (kind and configuration set) to m. */
static pdp_status pdp__tp_add(pdp_model *m, pdp__layer l, const char *fn)
{
    pdp_status st;
    l.tp = m->tp.comm ? &m->tp : NULL;
    if ((st = pdp__model_add(m, l, fn)) == PDP_OK) m->tp.nlayers++;
    return st;
}

/* The kind of m's last layer (-1: none). */
static int pdp__tp_last_kind(const pdp_model *m)
{
    return m->nlayers ? (int)m->layers[m->nlayers - 1].kind : -1;
}

PDP_API pdp_status pdp_model_add_tp_copy(pdp_model *m)
{
    if (!m) return pdp__err(PDP_ERR_INVALID, "pdp_model_add_tp_copy: model is NULL");
    return pdp__tp_add(m, pdp__layer_of(PDP__TP_COPY), "pdp_model_add_tp_copy");
}

PDP_API pdp_status pdp_model_add_column_parallel_linear(pdp_model *m, int64_t out_features)
{
    static const char *fn = "pdp_model_add_column_parallel_linear";
    pdp__layer l = pdp__layer_of(PDP__COLUMN_PARALLEL_LINEAR);
    if (!m) return pdp__err(PDP_ERR_INVALID, "%s: model is NULL", fn);
    if (pdp__tp_last_kind(m) != PDP__TP_COPY)
        return pdp__err(PDP_ERR_STATE, "%s: layer %d must follow f (pdp_model_add_tp_copy), "
                        "not %s", fn, m->nlayers,
                        m->nlayers ? pdp_model_layer_name(m, m->nlayers - 1) : "the input");
    l.tp_full = out_features;
    l.tp_skip_dx = m->nlayers == 1;
    return pdp__tp_add(m, l, fn);
}

PDP_API pdp_status pdp_model_add_row_parallel_linear(pdp_model *m, int64_t out_features)
{
    static const char *fn = "pdp_model_add_row_parallel_linear";
    pdp__layer l = pdp__layer_of(PDP__ROW_PARALLEL_LINEAR);
    int i;
    if (!m) return pdp__err(PDP_ERR_INVALID, "%s: model is NULL", fn);
    for (i = m->nlayers - 1; i >= 0; i--) {
        pdp__layer_kind k = m->layers[i].kind;
        if (k == PDP__COLUMN_PARALLEL_LINEAR) break;
        if (k != PDP__RELU && k != PDP__GELU && k != PDP__TANH && k != PDP__SIGMOID) i = 0;
    }
    if (i < 0 || m->layers[i].kind != PDP__COLUMN_PARALLEL_LINEAR)
        return pdp__err(PDP_ERR_STATE, "%s: layer %d must follow a ColumnParallelLinear with only "
                        "element-wise activations (ReLU, GELU, Tanh, Sigmoid) between", fn,
                        m->nlayers);
    l.out_features = out_features;
    l.tp_full = m->layers[i].tp_full;
    l.tp_lo = m->layers[i].tp_lo;
    return pdp__tp_add(m, l, fn);
}

PDP_API pdp_status pdp_model_add_tp_reduce(pdp_model *m)
{
    static const char *fn = "pdp_model_add_tp_reduce";
    if (!m) return pdp__err(PDP_ERR_INVALID, "%s: model is NULL", fn);
    if (pdp__tp_last_kind(m) != PDP__ROW_PARALLEL_LINEAR)
        return pdp__err(PDP_ERR_STATE, "%s: layer %d must follow a RowParallelLinear, not %s",
                        fn, m->nlayers,
                        m->nlayers ? pdp_model_layer_name(m, m->nlayers - 1) : "the input");
    return pdp__tp_add(m, pdp__layer_of(PDP__TP_REDUCE), fn);
}

PDP_API void pdp_tp_get_stats(const pdp_model *m, pdp_tp_stats *out)
{
    if (!out) return;
    if (m) *out = m->tp.stats;
    else memset(out, 0, sizeof *out);
}

PDP_API void pdp_tp_reset_stats(pdp_model *m)
{
    if (m) memset(&m->tp.stats, 0, sizeof m->tp.stats);
}

/* ---- tp: full-tensor checkpoints ---- */

/* The single-device model of m: the same layers with f and g left out and the split
   Linears whole, on m's device (its parameters are overwritten by the caller). */
static pdp_status pdp__tp_full_model(const pdp_model *m, pdp_model **out, const char *fn)
{
    pdp_model_desc md;
    pdp_model *full = NULL;
    pdp_status st;
    int i;
    memset(&md, 0, sizeof md);
    md.input_ndim = m->in_ndim;
    memcpy(md.input_shape, m->in_shape, sizeof md.input_shape);
    md.seed = m->seed;
    md.device = m->device;
    if ((st = pdp_model_create(&full, &md)) != PDP_OK) return pdp__err_wrap(st, "%s", fn);
    for (i = 0; i < m->nlayers; i++) {
        pdp__layer l = m->layers[i];
        if (pdp__layer_kind_of(l.kind)->flags & PDP__LAYER_UNNUMBERED) continue;
        if (l.kind == PDP__COLUMN_PARALLEL_LINEAR) l.out_features = l.tp_full;
        if (l.kind == PDP__COLUMN_PARALLEL_LINEAR || l.kind == PDP__ROW_PARALLEL_LINEAR)
            l.kind = PDP__LINEAR;
        l.tp = NULL;
        if ((st = pdp__model_add(full, l, fn)) != PDP_OK) {
            pdp_model_free(full);
            return st;
        }
    }
    full->step = m->step;
    *out = full;
    return PDP_OK;
}

/* Copies between parameter p's slice (local, in m's block layout) and its full tensor
   (full), to_full or back, on device d: the contiguous runs of the slice. Replicated
   parameters are one run of the whole tensor. */
static pdp_status pdp__tp_runs(const pdp_model *m, int p, pdp_device d, float *full,
                               float *local, bool to_full)
{
    const pdp__param_entry *e = &m->params[p];
    const pdp__layer *l = &m->layers[e->layer];
    bool weight = p == l->param_first;
    int64_t rows = 1, len = e->count, fstride = 0, foff = 0, i;
    pdp_status st;
    if (l->kind == PDP__COLUMN_PARALLEL_LINEAR) {     /* rows [lo, lo + n) of [H, in], b[lo..] */
        foff = l->tp_lo * (weight ? l->in_count : 1);
    } else if (l->kind == PDP__ROW_PARALLEL_LINEAR && weight) { /* columns of [d, H] */
        rows = l->out_features;
        len = l->in_count;
        fstride = l->tp_full;
        foff = l->tp_lo;
    }
    for (i = 0; i < rows; i++) {
        float *f = full + foff + i * fstride, *s = local + i * len;
        size_t bytes = (size_t)len * sizeof(float);
        st = to_full ? pdp__dev_copy(d, f, d, s, bytes) : pdp__dev_copy(d, s, d, f, bytes);
        if (st != PDP_OK) return st;
    }
    return PDP_OK;
}

/* Whether parameter p is split across the TP ranks (else every rank holds all of it). */
static bool pdp__tp_is_split(const pdp_model *m, int p)
{
    const pdp__layer *l = &m->layers[m->params[p].layer];
    return l->kind == PDP__COLUMN_PARALLEL_LINEAR ||
           (l->kind == PDP__ROW_PARALLEL_LINEAR && p == l->param_first);
}

/* dst (full's layout) <- the full tensors from every rank's slices of src (m's layout):
   each rank writes its slices (rank 0 also the replicated tensors) into zeros, and one
   all-reduce sums them. */
static pdp_status pdp__tp_gather(const pdp_model *m, const pdp_model *full, const float *src,
                                 float *dst)
{
    int p;
    pdp_status st;
    if ((st = pdp__dev_memset0(m->device, dst, (size_t)full->param_count * sizeof(float))))
        return st;
    for (p = 0; p < m->nparams; p++)
        if ((m->tp.rank == 0 || pdp__tp_is_split(m, p)) &&
            (st = pdp__tp_runs(m, p, m->device, dst + full->params[p].offset,
                               (float *)src + m->params[p].offset, true)) != PDP_OK)
            return st;
    return pdp_comm_allreduce(m->tp.comm, dst, full->param_count, PDP_REDUCE_SUM, NULL);
}

/* dst (m's layout) <- this rank's slices of src (full's layout). */
static pdp_status pdp__tp_scatter(const pdp_model *m, const pdp_model *full, const float *src,
                                  float *dst)
{
    int p;
    pdp_status st;
    for (p = 0; p < m->nparams; p++)
        if ((st = pdp__tp_runs(m, p, m->device, (float *)src + full->params[p].offset,
                               dst + m->params[p].offset, false)) != PDP_OK)
            return st;
    return PDP_OK;
}

static pdp_status pdp__tp_ckpt_args(const pdp_model *m, const pdp_optim *o, const char *fn)
{
    if (!m) return pdp__err(PDP_ERR_INVALID, "%s: model is NULL", fn);
    if (!m->tp.comm)
        return pdp__err(PDP_ERR_STATE, "%s: the model has no TP communicator (pdp_model_set_tp; "
                        "pdp_checkpoint_save/load serve a plain model)", fn);
    if (o && (o->model != m || o->lo != 0 || o->hi != m->param_count))
        return pdp__err(PDP_ERR_INVALID, "%s: the optimizer is not a full optimizer of this "
                        "model", fn);
    return PDP_OK;
}

PDP_API pdp_status pdp_tp_checkpoint_save(const char *path, const pdp_model *m,
                                          const pdp_optim *o)
{
    static const char *fn = "pdp_tp_checkpoint_save";
    pdp_model *full = NULL;
    pdp_optim *fo = NULL;
    pdp_status st;
    int32_t root_st;
    int k;
    if ((st = pdp__tp_ckpt_args(m, o, fn)) != PDP_OK) return st;
    if ((st = pdp__tp_full_model(m, &full, fn)) != PDP_OK) return st;
    if ((st = pdp__tp_gather(m, full, m->param_block, full->param_block)) != PDP_OK) goto out;
    if (o) {
        if ((st = pdp_optim_create(&fo, full, &o->desc)) != PDP_OK) goto out;
        fo->steps = o->steps;
        for (k = 0; k < o->nstate; k++)
            if ((st = pdp__tp_gather(m, full, o->state[k], fo->state[k])) != PDP_OK) goto out;
    }
    st = m->tp.rank == 0 ? pdp_checkpoint_save(path, full, fo) : PDP_OK;
    root_st = (int32_t)st;
    if ((st = pdp_comm_broadcast_bytes(m->tp.comm, &root_st, sizeof root_st, 0)) != PDP_OK)
        goto out;
    if (m->tp.rank != 0 && root_st != PDP_OK)
        st = pdp__err((pdp_status)root_st, "%s: TP rank 0 could not write %s", fn, path);
    else
        st = (pdp_status)root_st;
out:
    pdp_optim_free(fo);
    pdp_model_free(full);
    if (st != PDP_OK && strncmp(pdp_last_error(), fn, strlen(fn)) != 0)
        return pdp__err_wrap(st, "%s", fn);
    return st;
}

/* *failed <- the number of TP ranks passing failed = true (an all-reduce of one float on
   the communicator's device). On failure the message is set. */
static pdp_status pdp__tp_count_failed(const pdp_model *m, bool failed, float *count)
{
    float *buf = NULL, one = failed ? 1.0f : 0.0f;
    pdp_status st;
    if ((st = pdp__dev_alloc(m->device, sizeof(float), (void **)&buf)) != PDP_OK) return st;
    if ((st = pdp__dev_copy(m->device, buf, pdp_cpu(), &one, sizeof one)) == PDP_OK &&
        (st = pdp_comm_allreduce(m->tp.comm, buf, 1, PDP_REDUCE_SUM, NULL)) == PDP_OK)
        st = pdp__dev_copy(pdp_cpu(), count, m->device, buf, sizeof *count);
    pdp__dev_free(m->device, buf);
    return st;
}

PDP_API pdp_status pdp_tp_checkpoint_load(const char *path, pdp_model *m, pdp_optim *o)
{
    static const char *fn = "pdp_tp_checkpoint_load";
    pdp_model *full = NULL;
    pdp_optim *fo = NULL;
    pdp_status st, mine;
    float failed;
    int k;
    if ((st = pdp__tp_ckpt_args(m, o, fn)) != PDP_OK) return st;
    if ((mine = pdp__tp_full_model(m, &full, fn)) == PDP_OK && o)
        mine = pdp_optim_create(&fo, full, &o->desc);
    if (mine == PDP_OK) mine = pdp_checkpoint_load(path, full, fo);
    /* every rank learns whether any failed before anything is changed */
    if ((st = pdp__tp_count_failed(m, mine != PDP_OK, &failed)) != PDP_OK) {
        st = pdp__err_wrap(st, "%s", fn);
        goto out;
    }
    if (mine != PDP_OK) {
        st = mine;
        goto out;
    }
    if (failed > 0.0f) {
        st = pdp__err(PDP_ERR_IO, "%s: %s: %g other TP ranks could not load it (nothing changed)",
                      fn, path, (double)failed);
        goto out;
    }
    if ((st = pdp__tp_scatter(m, full, full->param_block, m->param_block)) != PDP_OK) goto out;
    if (o) {
        for (k = 0; k < o->nstate; k++)
            if ((st = pdp__tp_scatter(m, full, fo->state[k], o->state[k])) != PDP_OK) goto out;
        o->desc = fo->desc;
        o->steps = fo->steps;
    }
    m->step = full->step;
out:
    pdp_optim_free(fo);
    pdp_model_free(full);
    if (st != PDP_OK && strncmp(pdp_last_error(), fn, strlen(fn)) != 0)
        return pdp__err_wrap(st, "%s", fn);
    return st;
}
/* ---- end src/tp.c ---- */

/* ---- begin src/zero.c ---- */
/* zero: the sharded executor, ZeRO stages 1-3 on reducer.c's bucket reducer
   with a reduce-scatter as its collective (the layout, the formulas and the
   reasons are in zero.h).

   Invariants: the units are the reducer's buckets (planned with whole_layers,
   so a layer's weight and bias share a unit and one pointer per layer places
   both); unit u's slice of rank r is elements [r s_u, r s_u + mine_u) of the
   unit (mine_u <= s_u real elements, the rest padding that stays zero in every
   buffer); shard offsets follow the flat block's order. The model's layers read
   their gradients (and at stage 3 their parameters) through m->layer_dw
   (m->layer_w), which this module sets: stage 1 once, stages 2-3 when a unit's
   backward starts (a gradient bucket buffer, taken round-robin: unit u uses
   buffer u mod grad_buffers, after the reduce-scatter of the unit that held it
   has completed and its slice was added to the shard), stage 3 also when its
   parameters are gathered (a gather slot, least recently used first, never the
   unit being computed). Nothing is allocated after construction: the buffers
   are fixed, the handles come from the backends' pools.

   Devices. Every buffer lives on the model's device and is moved with
   cuda_host.c's pdp__dev_* helpers (memcpy, memset and += on the CPU; copies and
   kernels on a CUDA device's compute stream), so one code path serves CPU models
   (local, MPI) and CUDA models (NCCL). The ordering between the compute stream
   and the NCCL stream is the backend's: a collective's launch waits for the work
   already queued on the compute stream (a slice copied into a gather slot, a
   layer still reading the slot being refilled), and its wait makes the compute
   stream wait for it (a buffer added to the shard, cleared or read by a layer). */

/* #include "internal.h" (already above) */
#include <errno.h>
#include <unistd.h>

typedef struct pdp__zero_unit {
    int64_t off, count;  /* the unit's range of the flat block */
    int64_t s;           /* slice floats per rank, a multiple of 16 */
    int64_t shard_off;   /* this rank's slice in its shard (and optimizer state) */
    int64_t mine;        /* real elements of this rank's slice */
    int first_layer, last_layer;
    float *gbuf;         /* N s floats: stage 1 its own; stages 2-3 a held bucket buffer */
    int pslot;           /* stage 3: the gather slot holding its parameters, or -1 */
} pdp__zero_unit;

typedef struct pdp__zero_pslot {
    float *buf;          /* N s_max floats */
    int unit;            /* -1: free */
    pdp_work *work;      /* its all-gather, until waited */
    uint64_t used;       /* LRU stamp */
    double t_launch;
} pdp__zero_pslot;

struct pdp_zero {
    pdp__reducer r;      /* first: the reducer's user pointer is the executor */
    pdp_zero_desc desc;
    pdp_model *m;
    pdp_comm *c;
    int stage, rank, size, nunits;
    pdp__zero_unit *units;
    int *unit_of_layer;  /* -1 for layers without parameters */
    int64_t shard_count, padded_count, smax;
    float *grad_all;     /* stage 1: every unit's padded gradient buffer */
    float *grad_shard;   /* stages 2-3 */
    float *param_shard;  /* stage 3 */
    float *staging;      /* stages 1-2: the after-step all-gather */
    float **gbufs;       /* stages 2-3: grad_buffers bucket buffers */
    int *gbuf_unit;      /* the unit holding each, or -1 */
    pdp__zero_pslot *pslots;
    uint64_t clock;
    int trace_gather;    /* the all-gathers' trace lane ("allgather <comm name>"), 0: off */
    float **layer_w, **layer_dw;
    float scalar;        /* clipping's all-reduced squared norm */
    float *dscalar;      /* its copy on the model's device (the collective's buffer) */
    pdp_device dev;      /* the model's: every buffer below lives there */
    bool no_sync;
    bool sharded;        /* the model's blocks were handed over (free gives them back) */
    pdp_status deferred; /* a failure inside a no_sync backward (stages 2-3) */
    char deferred_msg[768];
    int64_t buffer_bytes, bytes_at_step, gathers, gathers_at_step;
    pdp_zero_stats stats;
};

static int64_t pdp__zero_align(int64_t n) { return (n + 15) & ~(int64_t)15; }

/* "unit 1 of 3 (layers 2..4)" */
static void pdp__zero_unit_name(const pdp_zero *z, int u, char *out, size_t cap)
{
    snprintf(out, cap, "unit %d of %d (layers %d..%d)", u, z->nunits, z->units[u].first_layer,
             z->units[u].last_layer);
}

/* Points unit u's layers' gradients (dw) or parameters (w) at buf, the unit's padded copy. */
static void pdp__zero_point(pdp_zero *z, int u, float **ptrs, float *buf)
{
    const pdp__zero_unit *k = &z->units[u];
    int l;
    for (l = k->first_layer; l <= k->last_layer; l++) {
        const pdp__layer *ly = &z->m->layers[l];
        if (ly->nparams) ptrs[l] = buf + (z->m->params[ly->param_first].offset - k->off);
    }
}

/* ---- zero: gradient buffers (stages 2-3) ---- */

/* Keeps the first failure of a step's device work that no caller can return
   (a bucket's completion, a no_sync backward): the next finish reports it. */
static void pdp__zero_defer(pdp_zero *z, pdp_status st, const char *what, int u)
{
    char name[96];
    if (z->deferred != PDP_OK) return;
    pdp__zero_unit_name(z, u, name, sizeof name);
    z->deferred = st;
    snprintf(z->deferred_msg, sizeof z->deferred_msg, "rank %d: %s %s: %.600s", z->rank, what,
             name, pdp_last_error());
}

/* Releases unit u's bucket buffer after its reduce-scatter: its slice into the shard. */
static void pdp__zero_bucket_done(pdp__reducer *r, int b)
{
    pdp_zero *z = (pdp_zero *)r->desc.user;
    pdp__zero_unit *k = &z->units[b];
    pdp_status st;
    int i;
    if (z->stage == 1 || !k->gbuf) return;
    if ((st = pdp__dev_add(z->dev, z->grad_shard + k->shard_off,
                           k->gbuf + (int64_t)z->rank * k->s, k->mine)) != PDP_OK)
        pdp__zero_defer(z, st, "adding the slice of", b);
    for (i = 0; i < z->desc.grad_buffers; i++)
        if (z->gbuf_unit[i] == b) z->gbuf_unit[i] = -1;
    k->gbuf = NULL;
}

/* Gives unit u a zeroed bucket buffer, waiting for the reduce-scatter of the unit
   that held it (bucket_done then frees it). */
static pdp_status pdp__zero_take_gbuf(pdp_zero *z, int u)
{
    int slot = u % z->desc.grad_buffers, v = z->gbuf_unit[slot];
    pdp__zero_unit *k = &z->units[u];
    pdp_status st;
    char name[96];
    if (v >= 0) pdp__reducer_wait_bucket(&z->r, v);
    if ((v = z->gbuf_unit[slot]) >= 0) { /* its collective failed or never ran */
        z->units[v].gbuf = NULL;
        z->gbuf_unit[slot] = -1;
    }
    if ((st = pdp__dev_memset0(z->dev, z->gbufs[slot],
                               (size_t)(z->size * k->s) * sizeof(float))) != PDP_OK) {
        pdp__zero_unit_name(z, u, name, sizeof name);
        return pdp__err_wrap(st, "rank %d: clearing the gradient buffer of %s", z->rank, name);
    }
    z->gbuf_unit[slot] = u;
    k->gbuf = z->gbufs[slot];
    pdp__zero_point(z, u, z->layer_dw, k->gbuf);
    return PDP_OK;
}

/* The collective of bucket (unit) b: reduce-scatter (average) in place. */
static pdp_status pdp__zero_reduce(pdp__reducer *r, int b, pdp_work **w)
{
    pdp_zero *z = (pdp_zero *)r->desc.user;
    pdp__zero_unit *k = &z->units[b];
    pdp_status st;
    /* no backward reached it: zeros */
    if (!k->gbuf && (st = pdp__zero_take_gbuf(z, b)) != PDP_OK) return st;
    if (r->hook.launch) {
        pdp_comm_hook_bucket v;
        memset(&v, 0, sizeof v);
        v.grad = k->gbuf;
        v.count = (int64_t)z->size * k->s;
        v.reduce_scatter = true;
        v.recv = k->gbuf + (int64_t)z->rank * k->s;
        v.recv_count = k->s;
        return pdp__reducer_hook_launch(r, b, &v, w);
    }
    return pdp_comm_reduce_scatter(z->c, k->gbuf, k->gbuf + (int64_t)z->rank * k->s, k->s,
                                   PDP_REDUCE_AVG, w);
}

/* A comm hook's scratch: stage 1 one piece per unit (every unit's buffer may be in
   flight at once), laid out as grad_all; stages 2-3 one piece per bucket buffer
   (unit u uses piece u mod grad_buffers, as its bucket buffer: the unit that held it
   was waited, and its hook finished, before u's backward began). */
PDP_API pdp_status pdp_zero_register_comm_hook(pdp_zero *z, const pdp_ddp_comm_hook *hook)
{
    static const char *fn = "pdp_zero_register_comm_hook";
    int64_t *off, base = 0, total;
    pdp_status st;
    int b;
    if (!z) return pdp__err(PDP_ERR_INVALID, "%s: zero is NULL", fn);
    off = (int64_t *)pdp__calloc((size_t)PDP__MAX(1, z->nunits) * sizeof *off);
    if (!off) return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory for %d units", fn, z->nunits);
    for (b = z->nunits - 1; b >= 0; b--) {
        off[b] = z->stage == 1 ? base : (int64_t)(b % z->desc.grad_buffers) * z->size * z->smax;
        base += (int64_t)z->size * z->units[b].s;
    }
    total = z->stage == 1 ? z->padded_count : (int64_t)z->desc.grad_buffers * z->size * z->smax;
    st = pdp__reducer_set_hook(&z->r, hook, off, total, fn);
    pdp__dealloc(off);
    return st;
}

/* ---- zero: gathered parameters (stage 3) ---- */

/* Waits for slot i's all-gather; a failure names the unit. */
static pdp_status pdp__zero_wait_slot(pdp_zero *z, int i)
{
    pdp__zero_pslot *p = &z->pslots[i];
    pdp_status st;
    char name[96];
    if (!p->work) return PDP_OK;
    st = pdp_work_wait(p->work);
    if (z->trace_gather && st == PDP_OK) {
        char ev[48], args[64];
        snprintf(ev, sizeof ev, "allgather unit %d", p->unit);
        snprintf(args, sizeof args, "\"bytes\":%lld", (long long)z->units[p->unit].s * 4 * z->size);
        pdp__trace_async(z->rank, z->trace_gather, "comm", ev,
                         ((uint64_t)z->rank << 40) | (uint64_t)p->work->seq, p->t_launch,
                         p->work->t_done, args);
    }
    p->work = NULL;
    if (st == PDP_OK) return PDP_OK;
    pdp__zero_unit_name(z, p->unit, name, sizeof name);
    z->units[p->unit].pslot = -1;
    p->unit = -1;
    return pdp__err_wrap(st, "rank %d: allgather of %s", z->rank, name);
}

/* Starts the all-gather of unit u's parameters into a slot: a free one, else the
   least recently used (whose gather has completed or is waited here) other than
   keep's. */
static pdp_status pdp__zero_gather_launch(pdp_zero *z, int u, int keep)
{
    pdp__zero_unit *k = &z->units[u];
    pdp__zero_pslot *p;
    int i, best = -1;
    pdp_status st;
    char name[96];
    for (i = 0; i < z->desc.param_buffers; i++) {
        if (keep >= 0 && z->pslots[i].unit == keep) continue;
        if (z->pslots[i].unit < 0) {
            best = i;
            break;
        }
        if (best < 0 || z->pslots[i].used < z->pslots[best].used) best = i;
    }
    PDP_ASSERT(best >= 0);
    p = &z->pslots[best];
    if (p->unit >= 0) {
        if ((st = pdp__zero_wait_slot(z, best)) != PDP_OK) return st;
        if (p->unit >= 0) z->units[p->unit].pslot = -1;
    }
    p->unit = u;
    p->used = ++z->clock;
    k->pslot = best;
    p->t_launch = pdp__now();
    z->gathers++;
    st = pdp__dev_copy(z->dev, p->buf + (int64_t)z->rank * k->s, z->dev,
                       z->param_shard + k->shard_off, (size_t)k->s * sizeof(float));
    if (st == PDP_OK)
        st = pdp_comm_allgather(z->c, p->buf + (int64_t)z->rank * k->s, p->buf, k->s, &p->work);
    if (st == PDP_OK) return PDP_OK;
    k->pslot = -1;
    p->unit = -1;
    pdp__zero_unit_name(z, u, name, sizeof name);
    return pdp__err_wrap(st, "rank %d: allgather of %s", z->rank, name);
}

/* Unit u's parameters gathered and its layers pointed at them; then the next
   unit's gather (next >= 0) launched, so it runs while u computes. */
static pdp_status pdp__zero_need(pdp_zero *z, int u, int next)
{
    pdp__zero_unit *k = &z->units[u];
    pdp_status st;
    if (k->pslot < 0 && (st = pdp__zero_gather_launch(z, u, -1)) != PDP_OK) return st;
    if ((st = pdp__zero_wait_slot(z, k->pslot)) != PDP_OK) return st;
    z->pslots[k->pslot].used = ++z->clock;
    pdp__zero_point(z, u, z->layer_w, z->pslots[k->pslot].buf);
    if (!z->desc.no_prefetch && next >= 0 && next < z->nunits && z->units[next].pslot < 0)
        return pdp__zero_gather_launch(z, next, u);
    return PDP_OK;
}

/* Every slot free (FSDP's reshard): waits for gathers in flight first. */
static pdp_status pdp__zero_release_params(pdp_zero *z)
{
    pdp_status st, first = PDP_OK;
    int i;
    for (i = 0; z->pslots && i < z->desc.param_buffers; i++) {
        if ((st = pdp__zero_wait_slot(z, i)) != PDP_OK && first == PDP_OK) first = st;
        if (z->pslots[i].unit >= 0) z->units[z->pslots[i].unit].pslot = -1;
        z->pslots[i].unit = -1;
    }
    return first;
}

/* ---- zero: the model's events ---- */

static pdp_status pdp__zero_event(void *user, pdp_model *m, pdp__model_event ev, int layer,
                                  pdp_status st)
{
    pdp__reducer *r = (pdp__reducer *)user;
    pdp_zero *z = (pdp_zero *)r->desc.user;
    int u = layer >= 0 ? z->unit_of_layer[layer] : -1, i;
    (void)m;
    switch (ev) {
    case PDP__EV_FORWARD_LAYER: /* forward runs the units from the last index down */
        return z->stage == 3 ? pdp__zero_need(z, u, u - 1) : PDP_OK;
    case PDP__EV_BACKWARD_BEGIN:
        if (z->stage >= 2)
            for (i = 0; i < z->desc.grad_buffers; i++)
                if (z->gbuf_unit[i] >= 0) {
                    z->units[z->gbuf_unit[i]].gbuf = NULL;
                    z->gbuf_unit[i] = -1;
                }
        return z->stage == 3 ? pdp__zero_release_params(z) : PDP_OK;
    case PDP__EV_BACKWARD_LAYER: /* backward runs them from 0 up */
        if (z->stage >= 2 && !z->units[u].gbuf && (st = pdp__zero_take_gbuf(z, u)) != PDP_OK)
            return st;
        return z->stage == 3 ? pdp__zero_need(z, u, u + 1) : PDP_OK;
    case PDP__EV_BACKWARD_END:
        /* stages 2-3 under no_sync: reduce now, into the shard (no full gradient to
           accumulate in); a failure is reported by the next finish */
        if (z->stage >= 2 && z->no_sync && st == PDP_OK &&
            (st = pdp__reducer_finish(r, "pdp_zero_backward")) != PDP_OK &&
            z->deferred == PDP_OK) {
            z->deferred = st;
            snprintf(z->deferred_msg, sizeof z->deferred_msg, "%.760s", pdp_last_error());
        }
        return PDP_OK;
    }
    return PDP_OK;
}

/* ---- zero: construction ---- */

PDP_API void pdp_zero_free(pdp_zero *z)
{
    pdp_model *m;
    int i;
    if (!z) return;
    m = z->m;
    pdp__zero_release_params(z);
    pdp__reducer_release(&z->r); /* waits for the reduce-scatters */
    if (m && z->sharded) { /* best effort: a device failure leaves the block absent */
        size_t bytes = (size_t)m->param_count * sizeof(float);
        m->layer_w = m->layer_dw = NULL;
        if (!m->grad_block && m->param_count &&
            pdp__dev_alloc(m->device, bytes, (void **)&m->grad_block) == PDP_OK &&
            pdp__dev_memset0(m->device, m->grad_block, bytes) != PDP_OK) {
            pdp__dev_free(m->device, m->grad_block);
            m->grad_block = NULL;
        }
        if (!m->param_block && m->param_count &&
            pdp__dev_alloc(m->device, bytes, (void **)&m->param_block) == PDP_OK) {
            pdp_status st = pdp__dev_memset0(m->device, m->param_block, bytes);
            for (i = 0; st == PDP_OK && z->param_shard && i < z->nunits; i++) {
                const pdp__zero_unit *k = &z->units[i];
                st = pdp__dev_copy(m->device, m->param_block + k->off + (int64_t)z->rank * k->s,
                                   m->device, z->param_shard + k->shard_off,
                                   (size_t)k->mine * sizeof(float));
            }
            if (st != PDP_OK) {
                pdp__dev_free(m->device, m->param_block);
                m->param_block = NULL;
            }
        }
    }
    for (i = 0; z->gbufs && i < z->desc.grad_buffers; i++) pdp__dev_free(z->dev, z->gbufs[i]);
    for (i = 0; z->pslots && i < z->desc.param_buffers; i++)
        pdp__dev_free(z->dev, z->pslots[i].buf);
    pdp__dealloc(z->gbufs);
    pdp__dealloc(z->gbuf_unit);
    pdp__dealloc(z->pslots);
    pdp__dev_free(z->dev, z->grad_all);
    pdp__dev_free(z->dev, z->grad_shard);
    pdp__dev_free(z->dev, z->param_shard);
    pdp__dev_free(z->dev, z->staging);
    pdp__dev_free(z->dev, z->dscalar);
    pdp__dealloc(z->units);
    pdp__dealloc(z->unit_of_layer);
    pdp__dealloc(z->layer_w);
    pdp__dealloc(z->layer_dw);
    pdp__dealloc(z);
}

/* A zeroed buffer of count floats on the model's device, counted as a working
   buffer when work; NULL on failure (the message says why). */
static float *pdp__zero_buf(pdp_zero *z, int64_t count, bool work)
{
    size_t bytes = (size_t)PDP__MAX(1, count) * sizeof(float);
    float *p = NULL;
    if (pdp__dev_alloc(z->dev, bytes, (void **)&p) != PDP_OK) return NULL;
    if (pdp__dev_memset0(z->dev, p, bytes) != PDP_OK) {
        pdp__dev_free(z->dev, p);
        return NULL;
    }
    if (work) z->buffer_bytes += count * (int64_t)sizeof(float);
    return p;
}

PDP_API pdp_status pdp_zero_create(pdp_zero **out, pdp_model *m, pdp_comm *c,
                                   const pdp_zero_desc *desc)
{
    static const char *fn = "pdp_zero_create";
    pdp__reducer_desc rd;
    pdp_comm_stats cs;
    pdp_zero *z;
    pdp_status st;
    int64_t acc, base;
    int b, l, n;
    bool joined = false;
    char why[1024]; /* the thread-local message's size */
    if (!out) return pdp__err(PDP_ERR_INVALID, "%s: out is NULL", fn);
    *out = NULL;
    if (!m || !c) return pdp__err(PDP_ERR_INVALID, "%s: %s is NULL", fn, m ? "comm" : "model");
    if (desc && (desc->stage < 0 || desc->stage > 3))
        return pdp__err(PDP_ERR_INVALID, "%s: stage %d is not 1, 2 or 3", fn, desc->stage);
    if (desc && (desc->bucket_cap_mb < 0.0 || desc->first_bucket_mb < 0.0 ||
                 desc->grad_buffers < 0 || desc->param_buffers < 0 || desc->param_buffers == 1))
        return pdp__err(PDP_ERR_INVALID, "%s: bucket_cap_mb %g and first_bucket_mb %g must be "
                        ">= 0, grad_buffers %d >= 0, param_buffers %d 0 or >= 2", fn,
                        desc->bucket_cap_mb, desc->first_bucket_mb, desc->grad_buffers,
                        desc->param_buffers);
    z = (pdp_zero *)pdp__calloc(sizeof *z);
    if (!z) return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory", fn);
    z->dev = m->device;
    if (desc) z->desc = *desc;
    z->desc.stage = PDP__DEF(z->desc.stage, 1);
    z->desc.bucket_cap_mb = PDP__DEF(z->desc.bucket_cap_mb, 25.0);
    z->desc.first_bucket_mb = PDP__DEF(z->desc.first_bucket_mb,
                                       PDP__MIN(1.0, z->desc.bucket_cap_mb));
    z->desc.grad_buffers = z->desc.stage >= 2 ? PDP__DEF(z->desc.grad_buffers, 2) : 0;
    z->desc.param_buffers = z->desc.stage == 3 ? PDP__DEF(z->desc.param_buffers, 2) : 0;
    z->stage = z->desc.stage;
    z->m = m;
    z->c = c;
    z->rank = c->rank;
    z->size = n = c->size;
    memset(&rd, 0, sizeof rd);
    rd.cap_bytes = z->desc.bucket_cap_mb * 1048576.0;
    rd.first_bytes = z->desc.first_bucket_mb * 1048576.0;
    rd.reduce = pdp__zero_reduce;
    rd.bucket_done = pdp__zero_bucket_done;
    rd.event = pdp__zero_event;
    rd.whole_layers = true;
    rd.op_name = "reduce_scatter";
    rd.finish_names = "pdp_zero_step or pdp_zero_finish";
    rd.user = z;
    if ((st = pdp__reducer_init(&z->r, m, c, &rd, fn)) != PDP_OK) goto fail;
    joined = true; /* past the collectives: a failure from here on is agreed (pdp__comm_agree) */
    if (z->r.trace_comm) { /* the reduce-scatters on the reducer's lane, the gathers on this */
        char lane[64];
        snprintf(lane, sizeof lane, "allgather %s", c->name);
        z->trace_gather = pdp__trace_track(z->rank, lane);
    }
    /* units: the buckets; shard offsets in flat-block order (the last bucket first) */
    z->nunits = z->r.nbuckets;
    z->units = (pdp__zero_unit *)pdp__calloc((size_t)PDP__MAX(1, z->nunits) * sizeof *z->units);
    z->unit_of_layer = (int *)pdp__calloc((size_t)PDP__MAX(1, m->nlayers) * sizeof(int));
    z->layer_w = (float **)pdp__calloc((size_t)PDP__MAX(1, m->nlayers) * sizeof(float *));
    z->layer_dw = (float **)pdp__calloc((size_t)PDP__MAX(1, m->nlayers) * sizeof(float *));
    if (!z->units || !z->unit_of_layer || !z->layer_w || !z->layer_dw) goto oom;
    for (l = 0; l < m->nlayers; l++) z->unit_of_layer[l] = -1;
    acc = 0;
    for (b = z->nunits - 1; b >= 0; b--) {
        pdp__zero_unit *k = &z->units[b];
        const pdp_ddp_bucket *info = &z->r.buckets[b].info;
        k->off = info->offset;
        k->count = info->count;
        k->s = pdp__zero_align((k->count + n - 1) / n);
        k->shard_off = acc;
        k->mine = PDP__MAX(0, PDP__MIN(k->s, k->count - (int64_t)z->rank * k->s));
        k->first_layer = m->params[info->first_param].layer;
        k->last_layer = m->params[info->last_param].layer;
        k->pslot = -1;
        for (l = k->first_layer; l <= k->last_layer; l++) z->unit_of_layer[l] = b;
        acc += k->s;
        z->smax = PDP__MAX(z->smax, k->s);
    }
    z->shard_count = acc;
    z->padded_count = acc * n;
    /* the shards first, then the model's blocks go, then the working buffers */
    z->sharded = true;
    if (z->stage == 1) {
        if (!(z->grad_all = pdp__zero_buf(z, z->padded_count, false))) goto oom;
        for (base = 0, b = z->nunits - 1; b >= 0; b--) {
            z->units[b].gbuf = z->grad_all + base;
            pdp__zero_point(z, b, z->layer_dw, z->units[b].gbuf);
            base += n * z->units[b].s;
        }
    } else {
        if (!(z->grad_shard = pdp__zero_buf(z, z->shard_count, false))) goto oom;
    }
    if (z->stage == 3) {
        if (!(z->param_shard = pdp__zero_buf(z, z->shard_count, false))) goto oom;
        for (b = 0; b < z->nunits; b++) {
            const pdp__zero_unit *k = &z->units[b];
            if ((st = pdp__dev_copy(z->dev, z->param_shard + k->shard_off, z->dev,
                                    m->param_block + k->off + (int64_t)z->rank * k->s,
                                    (size_t)k->mine * sizeof(float))) != PDP_OK) {
                st = pdp__err_wrap(st, "%s: rank %d: copying the parameter shard", fn, c->rank);
                goto fail;
            }
        }
        pdp__dev_free(m->device, m->param_block);
        m->param_block = NULL;
        m->layer_w = z->layer_w;
    }
    pdp__dev_free(m->device, m->grad_block);
    m->grad_block = NULL;
    m->layer_dw = z->layer_dw;
    if (z->stage <= 2 && !(z->staging = pdp__zero_buf(z, n * z->smax, true))) goto oom;
    /* clipping's scalar: NCCL reduces device memory only (not a working buffer: 4 bytes) */
    if (z->dev.kind != PDP_DEVICE_CPU && !(z->dscalar = pdp__zero_buf(z, 1, false))) goto oom;
    if (z->stage >= 2) {
        z->gbufs = (float **)pdp__calloc((size_t)z->desc.grad_buffers * sizeof(float *));
        z->gbuf_unit = (int *)pdp__calloc((size_t)z->desc.grad_buffers * sizeof(int));
        if (!z->gbufs || !z->gbuf_unit) goto oom;
        for (b = 0; b < z->desc.grad_buffers; b++) {
            z->gbuf_unit[b] = -1;
            if (!(z->gbufs[b] = pdp__zero_buf(z, n * z->smax, true))) goto oom;
        }
    }
    if (z->stage == 3) {
        z->pslots = (pdp__zero_pslot *)pdp__calloc((size_t)z->desc.param_buffers *
                                                   sizeof *z->pslots);
        if (!z->pslots) goto oom;
        for (b = 0; b < z->desc.param_buffers; b++) {
            z->pslots[b].unit = -1;
            if (!(z->pslots[b].buf = pdp__zero_buf(z, n * z->smax, true))) goto oom;
        }
    }
    if ((st = pdp__comm_agree(c, PDP_OK, fn)) != PDP_OK) goto release;
    z->stats.units = z->nunits;
    pdp_comm_get_stats(c, &cs);
    z->bytes_at_step = cs.bytes_sent;
    *out = z;
    return PDP_OK;
oom:
    st = pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: rank %d: no memory for the stage %d shards and "
                  "buffers (%lld floats of parameters, %d units)", fn, c->rank, z->stage,
                  (long long)m->param_count, z->nunits);
fail:
    if (joined) st = pdp__comm_agree(c, st, fn);
release: /* pdp_zero_free's best-effort allocations must not replace the message */
    snprintf(why, sizeof why, "%s", pdp_last_error());
    pdp_zero_free(z);
    return pdp__err(st, "%s", why);
}

PDP_API pdp_status pdp_zero_optim_create(pdp_optim **out, pdp_zero *z, const pdp_optim_desc *desc)
{
    static const char *fn = "pdp_zero_optim_create";
    if (out) *out = NULL;
    if (!z) return pdp__err(PDP_ERR_INVALID, "%s: zero is NULL", fn);
    return pdp__optim_create_shard(out, z->m, desc, z->shard_count, fn);
}

/* ---- zero: training ---- */

PDP_API pdp_status pdp_zero_forward_backward(pdp_zero *z, const pdp_tensor *x,
                                             const int32_t *labels, float *loss)
{
    static const char *fn = "pdp_zero_forward_backward";
    if (!z) return pdp__err(PDP_ERR_INVALID, "%s: zero is NULL", fn);
    return pdp__reducer_backward(&z->r, x, labels, loss, fn);
}

PDP_API pdp_status pdp_zero_forward(pdp_zero *z, const pdp_tensor *x, const pdp_tensor **y)
{
    static const char *fn = "pdp_zero_forward";
    if (y) *y = NULL;
    if (!z) return pdp__err(PDP_ERR_INVALID, "%s: zero is NULL", fn);
    return pdp__reducer_forward(&z->r, x, y, fn);
}

PDP_API pdp_status pdp_zero_backward(pdp_zero *z, const pdp_tensor *dy)
{
    static const char *fn = "pdp_zero_backward";
    if (!z) return pdp__err(PDP_ERR_INVALID, "%s: zero is NULL", fn);
    return pdp__reducer_backward_dy(&z->r, dy, fn);
}

PDP_API pdp_status pdp_zero_finish(pdp_zero *z)
{
    static const char *fn = "pdp_zero_finish";
    pdp_status st;
    if (!z) return pdp__err(PDP_ERR_INVALID, "%s: zero is NULL", fn);
    if (z->deferred != PDP_OK) {
        st = z->deferred;
        z->deferred = PDP_OK;
        return pdp__err(st, "%s: %s", fn, z->deferred_msg);
    }
    if ((st = pdp__reducer_finish(&z->r, fn)) != PDP_OK) return st;
    if (z->deferred != PDP_OK) { /* a bucket's completion, while finish waited for it */
        st = z->deferred;
        z->deferred = PDP_OK;
        return pdp__err(st, "%s: %s", fn, z->deferred_msg);
    }
    return PDP_OK;
}

/* Stage 1: the rank's slice of unit u in its padded buffer; stages 2-3: in the shard. */
static float *pdp__zero_grad_slice(pdp_zero *z, int u)
{
    const pdp__zero_unit *k = &z->units[u];
    return z->stage == 1 ? k->gbuf + (int64_t)z->rank * k->s : z->grad_shard + k->shard_off;
}

PDP_API pdp_status pdp_zero_clip_grad_norm(pdp_zero *z, float max_norm, float *total_norm)
{
    static const char *fn = "pdp_zero_clip_grad_norm";
    double sum = 0.0, norm;
    float coef;
    int u;
    int64_t i;
    pdp_status st;
    if (total_norm) *total_norm = 0.0f;
    if (!z) return pdp__err(PDP_ERR_INVALID, "%s: zero is NULL", fn);
    if (!(max_norm >= 0.0f))
        return pdp__err(PDP_ERR_INVALID, "%s: max_norm %g must be >= 0", fn, (double)max_norm);
    if (z->r.state != PDP__RED_IDLE)
        return pdp__err(PDP_ERR_STATE, "%s: rank %d: call pdp_zero_finish first", fn, z->rank);
    for (u = 0; u < z->nunits; u++) {
        const float *g = pdp__zero_grad_slice(z, u);
        if (z->dev.kind == PDP_DEVICE_CPU) {
            for (i = 0; i < z->units[u].mine; i++) sum += (double)g[i] * (double)g[i];
        } else if (z->units[u].mine) { /* a fixed-order device sum per slice */
            double part = 0.0;
            if ((st = pdp__cuda_sumsq(z->dev, g, z->units[u].mine, &part, fn)) != PDP_OK)
                return st;
            sum += part;
        }
    }
    z->scalar = (float)sum;
    if (z->dscalar) { /* the collective runs on the device's copy */
        if ((st = pdp__dev_copy(z->dev, z->dscalar, pdp_cpu(), &z->scalar, 4)) == PDP_OK &&
            (st = pdp_comm_allreduce(z->c, z->dscalar, 1, PDP_REDUCE_SUM, NULL)) == PDP_OK)
            st = pdp__dev_copy(pdp_cpu(), &z->scalar, z->dev, z->dscalar, 4);
    } else {
        st = pdp_comm_allreduce(z->c, &z->scalar, 1, PDP_REDUCE_SUM, NULL);
    }
    if (st != PDP_OK)
        return pdp__err_wrap(st, "%s: rank %d: all-reducing the squared norm", fn, z->rank);
    norm = sqrt((double)z->scalar);
    if (total_norm) *total_norm = (float)norm;
    if (!isfinite(norm)) return pdp__err(PDP_ERR_NUMERIC, "%s: the gradient norm is %g", fn, norm);
    coef = (float)((double)max_norm / (norm + 1e-6));
    if (coef >= 1.0f) return PDP_OK;
    for (u = 0; u < z->nunits; u++) {
        float *g = pdp__zero_grad_slice(z, u);
        if (z->dev.kind == PDP_DEVICE_CPU) {
            for (i = 0; i < z->units[u].mine; i++) g[i] *= coef;
        } else if (z->units[u].mine &&
                   (st = pdp__cuda_scale(z->dev, g, z->units[u].mine, coef, fn)) != PDP_OK) {
            return st;
        }
    }
    return PDP_OK;
}

/* Stages 1-2: every rank's updated slices into every rank's full parameters. */
static pdp_status pdp__zero_gather_full(pdp_zero *z, float *dst, const char *fn)
{
    double t0;
    pdp_status st;
    int u;
    for (u = 0; u < z->nunits; u++) {
        const pdp__zero_unit *k = &z->units[u];
        float *mine = z->staging + (int64_t)z->rank * k->s;
        if ((st = pdp__dev_copy(z->dev, mine, z->dev,
                                z->m->param_block + k->off + (int64_t)z->rank * k->s,
                                (size_t)k->mine * sizeof(float))) != PDP_OK ||
            (st = pdp__dev_memset0(z->dev, mine + k->mine,
                                   (size_t)(k->s - k->mine) * sizeof(float))) != PDP_OK)
            return pdp__err_wrap(st, "%s: rank %d: staging unit %d", fn, z->rank, u);
        z->gathers++;
        t0 = pdp__now();
        st = pdp_comm_allgather(z->c, mine, z->staging, k->s, NULL);
        if (z->trace_gather && st == PDP_OK) {
            char ev[48];
            snprintf(ev, sizeof ev, "allgather unit %d", u);
            pdp__trace_complete(z->rank, z->trace_gather, "comm", ev, t0, pdp__now(), NULL);
        }
        if (st != PDP_OK) {
            char name[96];
            pdp__zero_unit_name(z, u, name, sizeof name);
            return pdp__err_wrap(st, "%s: rank %d: allgather of %s", fn, z->rank, name);
        }
        if ((st = pdp__dev_copy(z->dev, dst + k->off, z->dev, z->staging,
                                (size_t)k->count * sizeof(float))) != PDP_OK)
            return pdp__err_wrap(st, "%s: rank %d: unit %d", fn, z->rank, u);
    }
    return PDP_OK;
}

PDP_API pdp_status pdp_zero_step(pdp_zero *z, pdp_optim *opt)
{
    static const char *fn = "pdp_zero_step";
    pdp_comm_stats cs;
    double t0;
    pdp_status st;
    int u;
    if (!z || !opt) return pdp__err(PDP_ERR_INVALID, "%s: %s is NULL", fn, z ? "opt" : "zero");
    if (!opt->shard || opt->model != z->m || opt->hi != z->shard_count)
        return pdp__err(PDP_ERR_INVALID, "%s: opt was not made by pdp_zero_optim_create for this "
                        "executor", fn);
    if ((st = pdp_zero_finish(z)) != PDP_OK) return pdp__err_wrap(st, "%s", fn);
    t0 = pdp__now();
    for (u = 0; u < z->nunits; u++) {
        const pdp__zero_unit *k = &z->units[u];
        float *p = z->stage == 3 ? z->param_shard + k->shard_off
                                 : z->m->param_block + k->off + (int64_t)z->rank * k->s;
        if ((st = pdp__optim_step_at(opt, p, pdp__zero_grad_slice(z, u), k->shard_off,
                                     k->mine)) != PDP_OK)
            return pdp__err_wrap(st, "%s: rank %d", fn, z->rank);
    }
    pdp__optim_finish_step(opt);
    st = z->stage == 1
             ? pdp__dev_memset0(z->dev, z->grad_all, (size_t)z->padded_count * sizeof(float))
             : pdp__dev_memset0(z->dev, z->grad_shard, (size_t)z->shard_count * sizeof(float));
    if (st != PDP_OK) return pdp__err_wrap(st, "%s: rank %d: zeroing the gradients", fn, z->rank);
    if (z->r.trace_compute)
        pdp__trace_complete(z->rank, z->r.trace_compute, "compute", "optimizer step", t0,
                            pdp__now(), NULL);
    if (z->stage <= 2) {
        if ((st = pdp__zero_gather_full(z, z->m->param_block, fn)) != PDP_OK) return st;
    } else {
        if ((st = pdp__zero_release_params(z)) != PDP_OK) return pdp__err_wrap(st, "%s", fn);
        if (z->m->param_block) { /* a gathered copy (pdp_zero_gather_params): now stale */
            pdp__dev_free(z->m->device, z->m->param_block);
            z->m->param_block = NULL;
        }
    }
    pdp_comm_get_stats(z->c, &cs);
    z->stats.steps = z->r.stats.steps;
    z->stats.bytes_sent = cs.bytes_sent - z->bytes_at_step;
    z->stats.total_bytes_sent += z->stats.bytes_sent;
    z->stats.gathers = z->gathers - z->gathers_at_step;
    z->stats.formula_bytes = (z->stage == 3 ? 3 : 2) * (int64_t)(z->size - 1) * z->shard_count * 4;
    z->stats.backward_s = z->r.stats.backward_s;
    z->stats.reduce_s = z->r.stats.allreduce_s;
    z->stats.wait_s = z->r.stats.wait_s;
    z->bytes_at_step = cs.bytes_sent;
    z->gathers_at_step = z->gathers;
    return PDP_OK;
}

PDP_API void pdp_zero_set_no_sync(pdp_zero *z, bool no_sync)
{
    if (!z) return;
    z->no_sync = no_sync;
    z->r.no_sync = no_sync && z->stage == 1; /* stages 2-3 reduce every backward */
}

PDP_API pdp_status pdp_zero_gather_params(pdp_zero *z, float *dst)
{
    static const char *fn = "pdp_zero_gather_params";
    pdp_device to = pdp_cpu(); /* dst is host memory */
    pdp_model *m;
    pdp_status st;
    int u;
    if (!z) return pdp__err(PDP_ERR_INVALID, "%s: zero is NULL", fn);
    m = z->m;
    if (z->stage <= 2) {
        if (dst && (st = pdp__dev_copy(pdp_cpu(), dst, m->device, m->param_block,
                                       (size_t)m->param_count * sizeof(float))) != PDP_OK)
            return pdp__err_wrap(st, "%s: rank %d", fn, z->rank);
        return PDP_OK;
    }
    if (!dst) {
        if (!m->param_block &&
            pdp__dev_alloc(m->device, (size_t)m->param_count * sizeof(float),
                           (void **)&m->param_block) != PDP_OK)
            return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory for %lld parameters", fn,
                            (long long)m->param_count);
        dst = m->param_block;
        to = m->device;
    }
    for (u = z->nunits - 1; u >= 0; u--) {
        const pdp__zero_unit *k = &z->units[u];
        if ((st = pdp__zero_need(z, u, u - 1)) != PDP_OK) return pdp__err_wrap(st, "%s", fn);
        if ((st = pdp__dev_copy(to, dst + k->off, m->device, z->pslots[k->pslot].buf,
                                (size_t)k->count * sizeof(float))) != PDP_OK)
            return pdp__err_wrap(st, "%s: rank %d", fn, z->rank);
    }
    return PDP_OK;
}

/* ---- zero: queries ---- */

PDP_API pdp_model *pdp_zero_model(const pdp_zero *z) { return z ? z->m : NULL; }
PDP_API int pdp_zero_stage(const pdp_zero *z) { return z ? z->stage : 0; }
PDP_API int pdp_zero_num_units(const pdp_zero *z) { return z ? z->nunits : 0; }

PDP_API void pdp_zero_get_memory(const pdp_zero *z, const pdp_optim *opt, pdp_zero_memory *out)
{
    double psi, n, k;
    int64_t per;
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (!z) return;
    out->param_count = z->m->param_count;
    out->padded_count = z->padded_count;
    out->shard_count = z->shard_count;
    out->state_per_param = opt ? opt->nstate : 0;
    out->param_bytes = (z->stage == 3 ? z->shard_count : 0) * 4 +
                       (z->m->param_block ? z->m->param_count * 4 : 0);
    out->grad_bytes = (z->stage == 1 ? z->padded_count : z->shard_count) * 4 +
                      (z->m->grad_block ? z->m->param_count * 4 : 0);
    out->optim_bytes = opt ? opt->nstate * (opt->hi - opt->lo) * 4 : 0;
    out->buffer_bytes = z->buffer_bytes;
    out->total_bytes = out->param_bytes + out->grad_bytes + out->optim_bytes + out->buffer_bytes;
    psi = (double)z->m->param_count;
    n = (double)z->size;
    k = 4.0 * out->state_per_param;
    out->ddp_bytes = (8.0 + k) * psi;
    out->formula_bytes = z->stage == 1   ? 8.0 * psi + k * psi / n
                         : z->stage == 2 ? 4.0 * psi + (4.0 + k) * psi / n
                                         : (8.0 + k) * psi / n;
    per = 4 * (int64_t)z->size * z->smax;
    out->buffer_bound = per * (z->stage == 1   ? 1
                               : z->stage == 2 ? 1 + z->desc.grad_buffers
                                               : z->desc.grad_buffers + z->desc.param_buffers);
}

PDP_API void pdp_zero_get_stats(const pdp_zero *z, pdp_zero_stats *out)
{
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (z) *out = z->stats;
}

/* ---- zero: checkpoints ----
   A set under prefix P: rank r's shard file "P.rank<r>.safetensors" and the
   marker "P.done". The shard file is checkpoint.c's shard file of the range
   [r S, (r + 1) S) of the padded shard-order block (every rank's shard in rank
   order, N S floats, S = shard_count): "params" holds the rank's parameter
   slices and "optim.<state>" its optimizer state, both in the shard's layout
   (padding zeros), so shard.lo / shard.hi / shard.count name the rank, the world
   size and the shard size, and optim.steps the step. The marker, written by
   rank 0 only after every rank's file is on disk, holds the plan (world size,
   stage, step, parameter and shard counts, each unit's offset, count and slice)
   that the load holds the run and every file to. */

/* Every rank's verdict: bad[r] is true when rank r failed. Collective (a sum of
   one-hot flags, on the model's device as the backend wants). */
static pdp_status pdp__zero_agree(pdp_zero *z, bool ok, bool *bad)
{
    float flags[64], *dev = NULL;
    int n = z->size, r;
    pdp_status st;
    PDP_ASSERT(n <= 64);
    for (r = 0; r < n; r++) flags[r] = 0.0f;
    flags[z->rank] = ok ? 0.0f : 1.0f;
    if (z->m->device.kind == PDP_DEVICE_CPU) {
        st = pdp_comm_allreduce(z->c, flags, n, PDP_REDUCE_SUM, NULL);
    } else {
        if ((st = pdp__dev_alloc(z->m->device, sizeof flags, (void **)&dev)) != PDP_OK) return st;
        if ((st = pdp__dev_copy(z->m->device, dev, pdp_cpu(), flags, (size_t)n * 4)) == PDP_OK &&
            (st = pdp_comm_allreduce(z->c, dev, n, PDP_REDUCE_SUM, NULL)) == PDP_OK)
            st = pdp__dev_copy(pdp_cpu(), flags, z->m->device, dev, (size_t)n * 4);
        pdp__dev_free(z->m->device, dev);
    }
    for (r = 0; r < n; r++) bad[r] = flags[r] != 0.0f;
    return st;
}

static void pdp__zero_shard_path(char *out, size_t cap, const char *prefix, int rank)
{
    snprintf(out, cap, "%s.rank%d.safetensors", prefix, rank);
}

/* Checks the call; a step boundary (no backward waiting for its step). */
static pdp_status pdp__zero_ckpt_args(pdp_zero *z, const pdp_optim *opt, const char *path,
                                      const char *fn)
{
    if (!z || !opt || !path)
        return pdp__err(PDP_ERR_INVALID, "%s: %s is NULL", fn, !z ? "zero" : !opt ? "opt" : "path");
    if (!opt->shard || opt->model != z->m || opt->hi != z->shard_count)
        return pdp__err(PDP_ERR_INVALID, "%s: opt was not made by pdp_zero_optim_create for this "
                        "executor", fn);
    if (strlen(path) > 3900) return pdp__err(PDP_ERR_INVALID, "%s: the path is too long", fn);
    if (z->size > 64)
        return pdp__err(PDP_ERR_UNSUPPORTED, "%s: %d ranks (checkpoints: at most 64)", fn, z->size);
    if (z->r.state != PDP__RED_IDLE || z->deferred != PDP_OK)
        return pdp__err(PDP_ERR_STATE, "%s: rank %d: a backward waits for its step; checkpoint "
                        "after pdp_zero_step", fn, z->rank);
    return PDP_OK;
}

/* The views checkpoint.c's range functions see: a model whose flat block is the
   padded shard-order block, and opt covering rank r's range of it, its state
   (or the given buffers) at the range's start. */
static void pdp__zero_ckpt_views(const pdp_zero *z, const pdp_optim *opt, float *const *state,
                                 pdp_model *mv, pdp_optim *ov)
{
    int k;
    *mv = *z->m;
    mv->param_count = (int64_t)z->size * z->shard_count;
    mv->nparams = 0; /* no named tensors: a full file in a shard's place fails, naming one */
    *ov = *opt;
    ov->model = mv;
    ov->count = mv->param_count;
    ov->lo = (int64_t)z->rank * z->shard_count;
    ov->hi = ov->lo + z->shard_count;
    for (k = 0; state && k < ov->nstate; k++) ov->state[k] = state[k];
}

/* The rank's parameter slices in shard layout into dst (shard_count floats, on the
   model's device), from the parameter shard (stage 3) or the full block. */
static pdp_status pdp__zero_pack_params(pdp_zero *z, float *dst)
{
    pdp_device dev = z->m->device;
    pdp_status st;
    int u;
    if (z->stage == 3)
        return pdp__dev_copy(dev, dst, dev, z->param_shard, (size_t)z->shard_count * 4);
    if ((st = pdp__dev_memset0(dev, dst, (size_t)z->shard_count * 4)) != PDP_OK) return st;
    for (u = 0; u < z->nunits; u++) {
        const pdp__zero_unit *k = &z->units[u];
        if (k->mine &&
            (st = pdp__dev_copy(dev, dst + k->shard_off, dev,
                                z->m->param_block + k->off + (int64_t)z->rank * k->s,
                                (size_t)k->mine * 4)) != PDP_OK)
            return st;
    }
    return PDP_OK;
}

/* The marker's text for this run at step steps. */
static void pdp__zero_marker_text(const pdp_zero *z, int64_t steps, char *out, size_t cap)
{
    size_t n;
    int u;
    n = (size_t)snprintf(out, cap, "pdp-zero-checkpoint 1\nworld_size %d\nstage %d\nstep %lld\n"
                         "param_count %lld\nshard_count %lld\nunits %d\n", z->size, z->stage,
                         (long long)steps, (long long)z->m->param_count,
                         (long long)z->shard_count, z->nunits);
    for (u = 0; u < z->nunits && n < cap; u++)
        n += (size_t)snprintf(out + n, cap - n, "unit %d %lld %lld %lld\n", u,
                              (long long)z->units[u].off, (long long)z->units[u].count,
                              (long long)z->units[u].s);
}

/* Writes the marker atomically (temporary, fsync, rename). */
static pdp_status pdp__zero_write_marker(const char *path, const char *text, const char *fn)
{
    char tmp[4160];
    FILE *f;
    size_t len = strlen(text);
    int ok;
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    if (!(f = fopen(tmp, "wb")))
        return pdp__err(PDP_ERR_IO, "%s: %s: fopen failed: %s", fn, tmp, strerror(errno));
    ok = fwrite(text, 1, len, f) == len && fflush(f) == 0 && fsync(fileno(f)) == 0;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        pdp_status st = pdp__err(PDP_ERR_IO, "%s: %s: writing the marker failed: %s", fn, path,
                                 strerror(errno));
        remove(tmp);
        return st;
    }
    return PDP_OK;
}

PDP_API pdp_status pdp_zero_checkpoint_save(pdp_zero *z, const pdp_optim *opt, const char *prefix)
{
    static const char *fn = "pdp_zero_checkpoint_save";
    char path[4096], marker[4096], *text = NULL;
    float *packed = NULL;
    bool bad[64];
    pdp_model mv;
    pdp_optim ov;
    pdp_status st;
    int r;
    size_t cap;
    if ((st = pdp__zero_ckpt_args(z, opt, prefix, fn)) != PDP_OK) return st;
    snprintf(marker, sizeof marker, "%s.done", prefix);
    pdp__zero_shard_path(path, sizeof path, prefix, z->rank);
    /* the old marker goes first: a set with a marker is always complete */
    st = PDP_OK;
    if (z->rank == 0 && remove(marker) != 0 && errno != ENOENT)
        st = pdp__err(PDP_ERR_IO, "%s: %s: removing the old marker failed: %s", fn, marker,
                      strerror(errno));
    if (pdp__zero_agree(z, st == PDP_OK, bad) != PDP_OK || bad[0])
        return st != PDP_OK ? st : pdp__err(PDP_ERR_IO, "%s: rank 0 could not remove %s", fn,
                                            marker);
    if ((st = pdp__dev_alloc(z->m->device, (size_t)PDP__MAX(1, z->shard_count) * 4,
                             (void **)&packed)) != PDP_OK)
        st = pdp__err_wrap(st, "%s: rank %d: packing the shard", fn, z->rank);
    else if ((st = pdp__zero_pack_params(z, packed)) == PDP_OK) {
        pdp__zero_ckpt_views(z, opt, NULL, &mv, &ov);
        st = pdp__checkpoint_save_range(path, &mv, packed, &ov, ov.lo, ov.hi, fn);
    }
    pdp__dev_free(z->m->device, packed);
    if (pdp__zero_agree(z, st == PDP_OK, bad) != PDP_OK)
        return pdp__err(PDP_ERR_IO, "%s: rank %d: the ranks could not agree that the set %s is "
                        "written (no marker)", fn, z->rank, prefix);
    if (st != PDP_OK) return st;
    for (r = 0; r < z->size; r++)
        if (bad[r]) {
            pdp__zero_shard_path(path, sizeof path, prefix, r);
            return pdp__err(PDP_ERR_IO, "%s: rank %d could not write %s (no marker written)", fn,
                            r, path);
        }
    if (z->rank == 0) {
        cap = 256 + (size_t)z->nunits * 96;
        if (!(text = (char *)pdp__alloc(cap))) {
            st = pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory", fn);
        } else {
            pdp__zero_marker_text(z, opt->steps, text, cap);
            st = pdp__zero_write_marker(marker, text, fn);
            pdp__dealloc(text);
        }
    }
    if (pdp__zero_agree(z, st == PDP_OK, bad) != PDP_OK || bad[0])
        return st != PDP_OK ? st : pdp__err(PDP_ERR_IO, "%s: rank 0 could not write the marker "
                                            "%s", fn, marker);
    return PDP_OK;
}

/* Reads the marker and holds it to this run; *steps gets its step. */
static pdp_status pdp__zero_read_marker(pdp_zero *z, const char *path, int64_t *steps,
                                        const char *fn)
{
    char *want, *have;
    size_t cap = 256 + (size_t)z->nunits * 96, n;
    long long step = 0;
    int world = 0;
    FILE *f;
    pdp_status st = PDP_OK;
    if (!(f = fopen(path, "rb")))
        return pdp__err(PDP_ERR_IO, "%s: %s: %s (no marker: the set is incomplete or absent)", fn,
                        path, strerror(errno));
    want = (char *)pdp__alloc(cap);
    have = (char *)pdp__alloc(cap + 1);
    if (!want || !have) {
        fclose(f);
        pdp__dealloc(want);
        pdp__dealloc(have);
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory", fn);
    }
    n = fread(have, 1, cap, f);
    have[n] = '\0';
    fclose(f);
    if (sscanf(have, "pdp-zero-checkpoint 1\nworld_size %d\nstage %*d\nstep %lld", &world,
               &step) != 2) {
        st = pdp__err(PDP_ERR_FORMAT, "%s: %s: not a ZeRO checkpoint marker", fn, path);
    } else if (world != z->size) {
        st = pdp__err(PDP_ERR_SHAPE, "%s: %s: the set was written by %d ranks, this run has %d "
                      "(load a consolidated checkpoint with pdp_zero_checkpoint_load_full to "
                      "change the world size)", fn, path, world, z->size);
    } else {
        /* the same plan: everything after the stage and step lines */
        const char *a, *b;
        pdp__zero_marker_text(z, (int64_t)step, want, cap);
        a = strstr(want, "param_count");
        b = strstr(have, "param_count");
        if (!b || strcmp(a, b) != 0)
            st = pdp__err(PDP_ERR_SHAPE, "%s: %s: the set's units (parameter count, shard size, "
                          "unit plan) differ from this run's: another model or bucket size", fn,
                          path);
    }
    pdp__dealloc(want);
    pdp__dealloc(have);
    *steps = (int64_t)step;
    return st;
}

/* Commits a validated load: params (shard layout, on the device) into the shard
   or the full block (stages 1-2 then all-gather), state into opt. */
static pdp_status pdp__zero_commit(pdp_zero *z, pdp_optim *opt, const pdp_optim *loaded,
                                   float *params, float *const *state, const char *fn)
{
    pdp_device dev = z->m->device;
    pdp_status st;
    int u, k;
    for (k = 0; k < opt->nstate; k++)
        if ((st = pdp__dev_copy(dev, opt->state[k], dev, state[k],
                                (size_t)z->shard_count * 4)) != PDP_OK)
            return pdp__err_wrap(st, "%s: rank %d: copying the optimizer state", fn, z->rank);
    opt->desc = loaded->desc;
    opt->steps = loaded->steps;
    if (z->stage == 3) {
        if ((st = pdp__zero_release_params(z)) != PDP_OK) return pdp__err_wrap(st, "%s", fn);
        if (z->m->param_block) { /* a gathered copy: stale now */
            pdp__dev_free(dev, z->m->param_block);
            z->m->param_block = NULL;
        }
        return pdp__dev_copy(dev, z->param_shard, dev, params, (size_t)z->shard_count * 4);
    }
    for (u = 0; u < z->nunits; u++) {
        const pdp__zero_unit *q = &z->units[u];
        if (q->mine &&
            (st = pdp__dev_copy(dev, z->m->param_block + q->off + (int64_t)z->rank * q->s, dev,
                                params + q->shard_off, (size_t)q->mine * 4)) != PDP_OK)
            return pdp__err_wrap(st, "%s: rank %d: copying the parameters", fn, z->rank);
    }
    return pdp__zero_gather_full(z, z->m->param_block, fn);
}

/* params and nstate state buffers of shard_count floats each, on the device. */
static pdp_status pdp__zero_ckpt_staging(pdp_zero *z, const pdp_optim *opt, float **params,
                                         float **state, const char *fn)
{
    size_t bytes = (size_t)PDP__MAX(1, z->shard_count) * 4;
    pdp_status st;
    int k;
    if ((st = pdp__dev_alloc(z->m->device, bytes, (void **)params)) != PDP_OK ||
        (st = pdp__dev_memset0(z->m->device, *params, bytes)) != PDP_OK)
        return pdp__err_wrap(st, "%s: rank %d: no staging memory", fn, z->rank);
    for (k = 0; k < opt->nstate; k++)
        if ((st = pdp__dev_alloc(z->m->device, bytes, (void **)&state[k])) != PDP_OK ||
            (st = pdp__dev_memset0(z->m->device, state[k], bytes)) != PDP_OK)
            return pdp__err_wrap(st, "%s: rank %d: no staging memory", fn, z->rank);
    return PDP_OK;
}

static void pdp__zero_ckpt_staging_free(pdp_zero *z, float *params, float **state)
{
    int k;
    pdp__dev_free(z->m->device, params);
    for (k = 0; k < 2; k++) pdp__dev_free(z->m->device, state[k]);
}

/* The agreement after a load's validation: every rank's verdict, then (all good)
   the commit. what(r) names rank r's file in the message of the ranks whose own
   file was fine. */
static pdp_status pdp__zero_load_finish(pdp_zero *z, pdp_optim *opt, const pdp_optim *loaded,
                                        pdp_status st, float *params, float **state,
                                        const char *prefix, bool full, uint64_t seed,
                                        uint64_t mstep, const char *fn)
{
    char path[4096];
    bool bad[64];
    int r;
    if (pdp__zero_agree(z, st == PDP_OK, bad) != PDP_OK && st == PDP_OK)
        st = pdp__err(PDP_ERR_IO, "%s: rank %d: the ranks could not agree on the load; nothing "
                      "was loaded", fn, z->rank);
    for (r = 0; st == PDP_OK && r < z->size; r++)
        if (bad[r]) {
            if (full) snprintf(path, sizeof path, "%s", prefix);
            else pdp__zero_shard_path(path, sizeof path, prefix, r);
            st = pdp__err(PDP_ERR_FORMAT, "%s: %s: rank %d could not load it (its error says "
                          "why); nothing was loaded", fn, path, r);
        }
    if (st == PDP_OK) st = pdp__zero_commit(z, opt, loaded, params, state, fn);
    else {
        z->m->seed = seed; /* a range load sets them: put back */
        z->m->step = mstep;
    }
    pdp__zero_ckpt_staging_free(z, params, state);
    return st;
}

PDP_API pdp_status pdp_zero_checkpoint_load(pdp_zero *z, pdp_optim *opt, const char *prefix)
{
    static const char *fn = "pdp_zero_checkpoint_load";
    char path[4096], marker[4096];
    float *params = NULL, *state[2] = {NULL, NULL};
    uint64_t seed, mstep;
    int64_t steps = 0;
    pdp_model mv;
    pdp_optim ov;
    pdp_status st;
    if ((st = pdp__zero_ckpt_args(z, opt, prefix, fn)) != PDP_OK) return st;
    seed = z->m->seed;
    mstep = z->m->step;
    snprintf(marker, sizeof marker, "%s.done", prefix);
    pdp__zero_shard_path(path, sizeof path, prefix, z->rank);
    pdp__zero_ckpt_views(z, opt, NULL, &mv, &ov);
    if ((st = pdp__zero_read_marker(z, marker, &steps, fn)) == PDP_OK &&
        (st = pdp__zero_ckpt_staging(z, opt, &params, state, fn)) == PDP_OK) {
        pdp__zero_ckpt_views(z, opt, state, &mv, &ov);
        st = pdp__checkpoint_load_range(path, &mv, params, &ov, ov.lo, ov.hi, fn);
        if (st == PDP_OK && ov.steps != steps)
            st = pdp__err(PDP_ERR_FORMAT, "%s: %s: holds step %lld, the set's marker %s says "
                          "%lld (a file of another save)", fn, path, (long long)ov.steps, marker,
                          (long long)steps);
    }
    z->m->seed = mv.seed;
    z->m->step = mv.step;
    return pdp__zero_load_finish(z, opt, &ov, st, params, state, prefix, false, seed, mstep, fn);
}

PDP_API pdp_status pdp_zero_checkpoint_load_full(pdp_zero *z, pdp_optim *opt, const char *path)
{
    static const char *fn = "pdp_zero_checkpoint_load_full";
    float *params = NULL, *state[2] = {NULL, NULL};
    uint64_t seed, mstep;
    pdp_optim ov;
    pdp_status st;
    int u, k;
    if ((st = pdp__zero_ckpt_args(z, opt, path, fn)) != PDP_OK) return st;
    seed = z->m->seed;
    mstep = z->m->step;
    ov = *opt;
    if ((st = pdp__zero_ckpt_staging(z, opt, &params, state, fn)) == PDP_OK) {
        /* unit by unit, the slice [off + r s, off + r s + mine) of the full file */
        for (u = 0; u < z->nunits && st == PDP_OK; u++) {
            const pdp__zero_unit *q = &z->units[u];
            int64_t lo = q->off + PDP__MIN((int64_t)z->rank * q->s, q->count);
            ov.lo = lo;
            ov.hi = lo + q->mine;
            ov.count = z->m->param_count;
            for (k = 0; k < ov.nstate; k++) ov.state[k] = state[k] + q->shard_off;
            st = pdp__checkpoint_load_range(path, z->m, params + q->shard_off, &ov, ov.lo, ov.hi,
                                            fn);
        }
    }
    return pdp__zero_load_finish(z, opt, &ov, st, params, state, path, true, seed, mstep, fn);
}

PDP_API pdp_status pdp_zero_checkpoint_consolidate(pdp_zero *z, const pdp_optim *opt,
                                                   const char *path)
{
    static const char *fn = "pdp_zero_checkpoint_consolidate";
    pdp_device dev;
    pdp_optim *full = NULL;
    float *buf = NULL;
    bool gathered = false, bad[64];
    pdp_status st, bst;
    int u, k;
    if ((st = pdp__zero_ckpt_args(z, opt, path, fn)) != PDP_OK) return st;
    dev = z->m->device;
    if (z->stage == 3 && !z->m->param_block) gathered = true;
    if ((st = pdp_zero_gather_params(z, NULL)) != PDP_OK) return pdp__err_wrap(st, "%s", fn);
    if (z->rank == 0) st = pdp__optim_create_range(&full, z->m, &opt->desc, 0,
                                                  z->m->param_count, fn);
    if (st == PDP_OK &&
        (st = pdp__dev_alloc(dev, (size_t)(z->size * z->smax) * 4, (void **)&buf)) != PDP_OK)
        st = pdp__err_wrap(st, "%s: rank %d: no memory to gather the optimizer state", fn,
                           z->rank);
    /* every rank takes part in every gather: on a local failure it still sends zeros; a rank
       without its buffers cannot, so first the ranks agree that each has them */
    if ((bst = pdp__zero_agree(z, st == PDP_OK, bad)) != PDP_OK && st == PDP_OK)
        st = pdp__err_wrap(bst, "%s: rank %d: agreeing on the buffers", fn, z->rank);
    for (u = 0; u < z->size && bst == PDP_OK; u++)
        if (bad[u]) {
            bst = PDP_ERR_COMM; /* no gathers */
            if (st == PDP_OK)
                st = pdp__err(PDP_ERR_COMM, "%s: rank %d: rank %d has no memory to gather the "
                              "optimizer state", fn, z->rank, u);
        }
    for (k = 0; bst == PDP_OK && k < opt->nstate; k++)
        for (u = 0; u < z->nunits; u++) {
            const pdp__zero_unit *q = &z->units[u];
            pdp_status cs;
            if (pdp__dev_copy(dev, buf + (int64_t)z->rank * q->s, dev, opt->state[k] + q->shard_off,
                              (size_t)q->s * 4) != PDP_OK && st == PDP_OK)
                st = pdp__err(PDP_ERR_CUDA, "%s: rank %d: copying the state", fn, z->rank);
            cs = pdp_comm_allgather(z->c, buf + (int64_t)z->rank * q->s, buf, q->s, NULL);
            if (cs != PDP_OK) {
                pdp__dev_free(dev, buf);
                pdp_optim_free(full);
                return pdp__err_wrap(cs, "%s: rank %d: gathering the optimizer state", fn,
                                     z->rank);
            }
            if (full && st == PDP_OK)
                st = pdp__dev_copy(dev, full->state[k] + q->off, dev, buf, (size_t)q->count * 4);
        }
    pdp__dev_free(dev, buf);
    if (full && st == PDP_OK) {
        full->steps = opt->steps;
        if ((st = pdp_checkpoint_save(path, z->m, full)) != PDP_OK)
            st = pdp__err_wrap(st, "%s: rank 0", fn);
    }
    pdp_optim_free(full);
    if (gathered) { /* not the caller's copy: give the memory back */
        pdp__dev_free(dev, z->m->param_block);
        z->m->param_block = NULL;
    }
    if (pdp__zero_agree(z, st == PDP_OK, bad) != PDP_OK && st == PDP_OK)
        return pdp__err(PDP_ERR_IO, "%s: rank %d: the ranks could not agree on %s", fn, z->rank,
                        path);
    if (st != PDP_OK) return st;
    if (bad[0]) return pdp__err(PDP_ERR_IO, "%s: %s: rank 0 could not write it", fn, path);
    return PDP_OK;
}
/* ---- end src/zero.c ---- */

/* ---- begin src/pp.c ---- */
/* pp: the pipeline-parallel executor (the design is pp.h's opening comment).

   Invariants: the schedule is fixed at creation, a list of actions per stage in
   which micro-batch j's forward comes before its backward, and the backwards in
   micro-batch order. Stage s keeps S = nslots activation sets (model slots), set
   j % S for micro-batch j: a forward F(j) finds set j % S free because F(j - S)'s
   backward came before it (GPipe: S = m; 1F1B: S = min(p - s, m) = warm-up + 1).
   Received inputs (stages after 0) live in S + 1 buffers, j % (S + 1), so the
   receive for the next action can be posted while the current one computes
   (after a backward B(i), the next forward F(i + S) needs a buffer while i's is
   still being read); received output gradients in 2 buffers (j % 2) and the input
   gradients sent back in 2 (j % 2, the send of j - 2 waited before reuse).
   Activations are sent straight from the model's output of set j % S, whose send
   is waited before F(j + S) overwrites it. Tags: 2 j (activations) and 2 j + 1
   (gradients), modulo PDP_COMM_TAG_MAX + 1. At most one receive is outstanding.
   After the first pass at the largest batch nothing is allocated.

   Messages are started as soon as they are posted (pdp__pp_start): NCCL enqueues
   posted messages only at a wait or pdp_work_done (comm.h), so without it stage 0's
   GPipe forwards would all go out at its first backward, and the next stage would
   idle until then. An action's send starts together with the receive posted for the
   next action (one NCCL group); a receive posted by an action that sends nothing
   starts alone, right away. A receive is never started ahead of the current
   action's send: on NCCL's one stream that send would queue behind it, and the
   receive's message may depend on it. On local and MPI starting is a no-op query. */

/* #include "internal.h" (already above) */

typedef struct pdp__pp_action {
    char kind; /* 'F' or 'B' */
    int mb;
} pdp__pp_action;

struct pdp_pp {
    pdp_model *m;                 /* this stage */
    pdp_comm *c, *dp;
    pdp_pp_desc desc;
    int stage, p, mb;             /* stage, stages, micro-batches */
    int first[PDP_PP_MAX_STAGES + 1];
    pdp__pp_action *acts;
    int nacts, nslots;
    int64_t in_count, out_count;  /* per-sample floats at the stage's input and output */
    int64_t cap_rows;             /* rows the buffers below hold */
    float **in_buf;               /* nslots + 1: received inputs (stages after 0) */
    float *dy_buf[2];             /* received output gradients (stages before the last) */
    float *dx_buf[2];             /* input gradients sent back (stages after 0) */
    pdp_work **send_fwd;          /* per slot */
    pdp_work *send_bwd[2];
    pdp_work *rwork;              /* the outstanding receive, for action rwork_act */
    int rwork_act;
    pdp_work *dp_work;            /* DP x PP: the gradients' all-reduce */
    int64_t *mb_rows, *mb_first;  /* per micro-batch of the current pass */
    int64_t mb_cap;
    int64_t sample_base;          /* DP x PP: this pipeline's first row in the global batch */
    uint64_t steps;
    double t_compute;             /* when the current action's compute began (after its waits) */
    pdp_pp_stats stats;
    bool traced;
    int trace_pid, trace_tid;
};

/* ---- pp: stage boundaries ---- */

/* A contiguous split of n layers of cost[] into p non-empty stages minimising the
   largest stage's cost (ties: the later cut, so a ReLU stays with its Linear). */
static pdp_status pdp__pp_balance(const double *cost, int n, int p, int *first)
{
    double *best = (double *)pdp__alloc((size_t)(p + 1) * (size_t)(n + 1) * sizeof *best);
    int *cut = (int *)pdp__alloc((size_t)(p + 1) * (size_t)(n + 1) * sizeof *cut);
    double *pre = (double *)pdp__alloc((size_t)(n + 1) * sizeof *pre);
    int k, i, j;
    if (!best || !cut || !pre) {
        pdp__dealloc(best);
        pdp__dealloc(cut);
        pdp__dealloc(pre);
        return PDP_ERR_OUT_OF_MEMORY;
    }
    pre[0] = 0.0;
    for (i = 0; i < n; i++) pre[i + 1] = pre[i] + cost[i];
#define PDP__BEST(k, i) best[(size_t)(k) * (size_t)(n + 1) + (size_t)(i)]
#define PDP__CUT(k, i) cut[(size_t)(k) * (size_t)(n + 1) + (size_t)(i)]
    for (i = 1; i <= n; i++) PDP__BEST(1, i) = pre[i], PDP__CUT(1, i) = 0;
    for (k = 2; k <= p; k++)
        for (i = k; i <= n; i++) { /* the first i layers in k stages; the last is [j, i) */
            PDP__BEST(k, i) = HUGE_VAL;
            for (j = k - 1; j < i; j++) {
                double v = PDP__MAX(PDP__BEST(k - 1, j), pre[i] - pre[j]);
                if (v <= PDP__BEST(k, i)) PDP__BEST(k, i) = v, PDP__CUT(k, i) = j;
            }
        }
    for (k = p, i = n; k >= 1; k--) {
        first[k - 1] = PDP__CUT(k, i);
        i = first[k - 1];
    }
#undef PDP__BEST
#undef PDP__CUT
    pdp__dealloc(best);
    pdp__dealloc(cut);
    pdp__dealloc(pre);
    return PDP_OK;
}

/* Forward + backward seconds of each layer of full (a copy of it) on rows samples. */
static pdp_status pdp__pp_time_layers(const pdp_model *full, int64_t rows, double *cost)
{
    pdp_model *t = NULL;
    pdp_tensor *x = NULL, *dy = NULL;
    const pdp_tensor *y;
    int64_t xs[4], ys[4], k;
    int d, rep, nd;
    pdp_status st;
    if ((st = pdp__model_clone(full, full->device, false, &t)) != PDP_OK) return st;
    t->layer_s = cost;
    xs[0] = rows;
    for (d = 0; d < full->in_ndim; d++) xs[d + 1] = full->in_shape[d];
    ys[0] = rows;
    nd = pdp_model_output_shape(full, ys + 1);
    if ((st = pdp_tensor_create(&x, full->device, full->in_ndim + 1, xs)) != PDP_OK ||
        (st = pdp_tensor_create(&dy, full->device, nd + 1, ys)) != PDP_OK)
        goto out;
    {
        float *h = (float *)pdp__alloc((size_t)PDP__MAX(x->count, dy->count) * sizeof(float));
        if (!h) {
            st = pdp__err(PDP_ERR_OUT_OF_MEMORY, "no memory");
            goto out;
        }
        for (k = 0; k < PDP__MAX(x->count, dy->count); k++)
            h[k] = (float)((k * 2654435761u) % 1000u) / 1000.0f - 0.5f;
        if ((st = pdp_tensor_upload(x, h)) == PDP_OK) st = pdp_tensor_upload(dy, h);
        pdp__dealloc(h);
        if (st != PDP_OK) goto out;
    }
    for (rep = 0; rep < 4; rep++) { /* the first is a warm-up */
        if (rep == 1) memset(cost, 0, (size_t)full->nlayers * sizeof *cost);
        if ((st = pdp_model_forward(t, x, &y)) != PDP_OK ||
            (st = pdp_model_backward(t, dy)) != PDP_OK)
            goto out;
    }
out:
    t->layer_s = NULL;
    pdp_tensor_free(x);
    pdp_tensor_free(dy);
    pdp_model_free(t);
    return st;
}

/* ---- pp: schedules ---- */

static void pdp__pp_plan(pdp_pp *pp)
{
    int s = pp->stage, m = pp->mb, w, i, n = 0;
    if (pp->desc.schedule == PDP_PP_GPIPE) {
        for (i = 0; i < m; i++) pp->acts[n].kind = 'F', pp->acts[n++].mb = i;
        for (i = 0; i < m; i++) pp->acts[n].kind = 'B', pp->acts[n++].mb = i;
        pp->nslots = m;
    } else {
        w = PDP__MIN(pp->p - 1 - s, m);
        for (i = 0; i < w; i++) pp->acts[n].kind = 'F', pp->acts[n++].mb = i;
        for (i = 0; i + w < m; i++) {
            pp->acts[n].kind = 'F', pp->acts[n++].mb = w + i;
            pp->acts[n].kind = 'B', pp->acts[n++].mb = i;
        }
        for (i = m - w; i < m; i++) pp->acts[n].kind = 'B', pp->acts[n++].mb = i;
        pp->nslots = PDP__MIN(pp->p - s, m);
    }
    pp->nacts = n;
}

PDP_API const char *pdp_pp_schedule_str(const pdp_pp *pp, char *buf, size_t cap)
{
    size_t n = 0;
    int k;
    if (!buf || !cap) return buf;
    buf[0] = '\0';
    if (!pp) return buf;
    for (k = 0; k < pp->nacts && n + 1 < cap; k++)
        n += (size_t)snprintf(buf + n, cap - n, k ? " %c%d" : "%c%d", pp->acts[k].kind,
                              pp->acts[k].mb);
    return buf;
}

/* ---- pp: construction ---- */

static pdp_status pdp__pp_check_desc(const pdp_pp_desc *d, int nlayers, int p, const char *fn)
{
    int s;
    if (d->schedule != PDP_PP_1F1B && d->schedule != PDP_PP_GPIPE)
        return pdp__err(PDP_ERR_INVALID, "%s: schedule %d (PDP_PP_1F1B or PDP_PP_GPIPE)", fn,
                        (int)d->schedule);
    if (d->micro_batches < 0 || d->micro_batches > 65536)
        return pdp__err(PDP_ERR_INVALID, "%s: micro_batches %d outside 1..65536", fn,
                        d->micro_batches);
    if (d->balance != PDP_PP_BALANCE_PARAMS && d->balance != PDP_PP_BALANCE_TIME)
        return pdp__err(PDP_ERR_INVALID, "%s: balance %d", fn, (int)d->balance);
    if (d->balance_batch < 0)
        return pdp__err(PDP_ERR_INVALID, "%s: balance_batch %lld < 0", fn,
                        (long long)d->balance_batch);
    if (nlayers < p)
        return pdp__err(PDP_ERR_INVALID, "%s: %d stages but the model has %d layers", fn, p,
                        nlayers);
    if (d->first_layer) {
        if (d->first_layer[0] != 0)
            return pdp__err(PDP_ERR_INVALID, "%s: first_layer[0] is %d (must be 0)", fn,
                            d->first_layer[0]);
        for (s = 1; s < p; s++)
            if (d->first_layer[s] <= d->first_layer[s - 1] || d->first_layer[s] >= nlayers)
                return pdp__err(PDP_ERR_INVALID, "%s: first_layer[%d] is %d (must be in %d..%d)",
                                fn, s, d->first_layer[s], d->first_layer[s - 1] + 1,
                                nlayers - 1);
    }
    return PDP_OK;
}

/* The split: given, or balanced (by time: rank 0 measures). first[p] = nlayers. */
static pdp_status pdp__pp_split(pdp_pp *pp, const pdp_model *full, const char *fn)
{
    int s, i, n = full->nlayers;
    double *cost;
    pdp_status st = PDP_OK;
    if (pp->desc.first_layer) {
        for (s = 0; s < pp->p; s++) pp->first[s] = pp->desc.first_layer[s];
    } else {
        cost = (double *)pdp__calloc((size_t)n * sizeof *cost);
        if (!cost) return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory", fn);
        if (pp->desc.balance == PDP_PP_BALANCE_TIME) {
            if (pp->stage == 0)
                st = pdp__pp_time_layers(full, PDP__DEF(pp->desc.balance_batch, 32), cost);
        } else {
            for (i = 0; i < n; i++) {
                const pdp__layer *l = &full->layers[i];
                int q;
                for (q = l->param_first; q < l->param_first + l->nparams; q++)
                    cost[i] += (double)full->params[q].count;
            }
        }
        if (st == PDP_OK && (pp->stage == 0 || pp->desc.balance != PDP_PP_BALANCE_TIME) &&
            pdp__pp_balance(cost, n, pp->p, pp->first) != PDP_OK)
            st = pdp__err(PDP_ERR_OUT_OF_MEMORY, "no memory");
        pdp__dealloc(cost);
        if (st != PDP_OK) return pdp__err_wrap(st, "%s: rank %d: timing the layers", fn,
                                               pp->stage);
    }
    pp->first[pp->p] = n;
    return PDP_OK;
}

/* Every rank checks its split, schedule and micro-batches against rank 0's (by
   time: takes rank 0's split). */
static pdp_status pdp__pp_agree(pdp_pp *pp, const char *fn)
{
    int mine[PDP_PP_MAX_STAGES + 3], theirs[PDP_PP_MAX_STAGES + 3], s, n = pp->p + 3;
    pdp_status st;
    for (s = 0; s <= pp->p; s++) mine[s] = pp->first[s];
    mine[pp->p + 1] = (int)pp->desc.schedule;
    mine[pp->p + 2] = pp->mb;
    memcpy(theirs, mine, (size_t)n * sizeof *mine);
    if ((st = pdp_comm_broadcast_bytes(pp->c, theirs, (size_t)n * sizeof *theirs, 0)) != PDP_OK)
        return pdp__err_wrap(st, "%s: rank %d: exchanging the split", fn, pp->stage);
    if (!pp->desc.first_layer && pp->desc.balance == PDP_PP_BALANCE_TIME)
        for (s = 0; s <= pp->p; s++) mine[s] = pp->first[s] = theirs[s];
    for (s = 0; s < n; s++)
        if (mine[s] != theirs[s]) {
            if (s <= pp->p)
                return pdp__err(PDP_ERR_INVALID, "%s: rank %d: stage %d starts at layer %d here "
                                "but at layer %d on rank 0 (the ranks' models or first_layer "
                                "differ)", fn, pp->stage, s, mine[s], theirs[s]);
            return pdp__err(PDP_ERR_INVALID, "%s: rank %d: %s %d here but %d on rank 0", fn,
                            pp->stage, s == pp->p + 1 ? "schedule" : "micro_batches", mine[s],
                            theirs[s]);
        }
    return PDP_OK;
}

PDP_API pdp_status pdp_pp_create(pdp_pp **out, const pdp_model *full, pdp_comm *c,
                                 const pdp_pp_desc *desc)
{
    static const char *fn = "pdp_pp_create";
    pdp_pp *pp;
    pdp_status st;
    int i;
    bool agreed = false;
    if (!out) return pdp__err(PDP_ERR_INVALID, "%s: out is NULL", fn);
    *out = NULL;
    if (!full || !c) return pdp__err(PDP_ERR_INVALID, "%s: %s is NULL", fn, full ? "comm" : "model");
    if (c->size > PDP_PP_MAX_STAGES)
        return pdp__err(PDP_ERR_INVALID, "%s: %d ranks (at most PDP_PP_MAX_STAGES = %d stages)",
                        fn, c->size, PDP_PP_MAX_STAGES);
    if (full->device.kind != c->device.kind || full->device.ordinal != c->device.ordinal)
        return pdp__err(PDP_ERR_DEVICE, "%s: model on device %d:%d, communicator '%s' on %d:%d",
                        fn, full->device.kind, full->device.ordinal, c->name, c->device.kind,
                        c->device.ordinal);
    pp = (pdp_pp *)pdp__calloc(sizeof *pp);
    if (!pp) return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory", fn);
    if (desc) pp->desc = *desc;
    pp->c = c;
    pp->dp = pp->desc.dp;
    pp->stage = c->rank;
    pp->p = c->size;
    pp->mb = PDP__DEF(pp->desc.micro_batches, pp->p);
    pp->rwork_act = -1;
    if ((st = pdp__pp_check_desc(&pp->desc, full->nlayers, pp->p, fn)) != PDP_OK ||
        (st = pdp__pp_split(pp, full, fn)) != PDP_OK || (st = pdp__pp_agree(pp, fn)) != PDP_OK)
        goto fail;
    agreed = true; /* past the split's collectives: a failure from here on is agreed */
    pp->acts = (pdp__pp_action *)pdp__calloc((size_t)(2 * pp->mb) * sizeof *pp->acts);
    if (!pp->acts) goto oom;
    pdp__pp_plan(pp);
    if ((st = pdp__model_stage(full, pp->first[pp->stage], pp->first[pp->stage + 1], &pp->m)))
        goto wrap;
    pdp__model_set_slots(pp->m, pp->nslots);
    pp->in_count = pp->m->in_count;
    pp->out_count = pp->m->layers[pp->m->nlayers - 1].out_count;
    pp->in_buf = (float **)pdp__calloc((size_t)(pp->nslots + 1) * sizeof *pp->in_buf);
    pp->send_fwd = (pdp_work **)pdp__calloc((size_t)pp->nslots * sizeof *pp->send_fwd);
    if (!pp->in_buf || !pp->send_fwd) goto oom;
    if (pp->dp) { /* DP x PP: every pipeline starts from dp rank 0's stage */
        if (pp->dp->device.kind != c->device.kind || pp->dp->device.ordinal != c->device.ordinal) {
            st = pdp__err(PDP_ERR_DEVICE, "%s: dp communicator '%s' on another device", fn,
                          pp->dp->name);
            goto fail;
        }
        if (pp->m->param_count && (st = pdp_comm_broadcast(pp->dp, pp->m->param_block,
                                                          pp->m->param_count, 0, NULL)))
            goto wrap;
    }
    pp->trace_pid = pp->dp ? pp->dp->rank * pp->p + pp->stage : c->rank;
    if (pdp__trace_open(c->backend == PDP_BACKEND_LOCAL ? -1 : pp->trace_pid) == PDP_OK) {
        char name[48];
        pp->traced = true;
        snprintf(name, sizeof name, "pipeline stage %d", pp->stage);
        pp->trace_tid = pdp__trace_track(pp->trace_pid, name);
    }
    pp->stats.bubble_theory = (double)(pp->p - 1) / (double)(pp->mb + pp->p - 1);
    for (i = 0; i < 2; i++) pp->send_bwd[i] = NULL;
    if ((st = pdp__comm_agree(c, PDP_OK, fn)) != PDP_OK) {
        pdp_pp_free(pp);
        return st;
    }
    *out = pp;
    return PDP_OK;
oom:
    st = pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: rank %d: no memory", fn, pp->stage);
    goto fail;
wrap:
    st = pdp__err_wrap(st, "%s: rank %d", fn, pp->stage);
fail:
    if (agreed) st = pdp__comm_agree(c, st, fn);
    pdp_pp_free(pp);
    return st;
}

static void pdp__pp_free_buffers(pdp_pp *pp)
{
    int i;
    pdp_device d = pp->m ? pp->m->device : pdp_cpu();
    if (pp->in_buf)
        for (i = 0; i <= pp->nslots; i++) pdp__dev_free(d, pp->in_buf[i]), pp->in_buf[i] = NULL;
    for (i = 0; i < 2; i++) {
        pdp__dev_free(d, pp->dy_buf[i]);
        pdp__dev_free(d, pp->dx_buf[i]);
        pp->dy_buf[i] = pp->dx_buf[i] = NULL;
    }
    pp->cap_rows = 0;
}

/* Waits every outstanding message (their errors are the pass's first error's
   consequences, or already reported). */
static void pdp__pp_drain(pdp_pp *pp)
{
    int i;
    if (pp->rwork) pdp_work_wait(pp->rwork);
    pp->rwork = NULL;
    pp->rwork_act = -1;
    if (pp->send_fwd)
        for (i = 0; i < pp->nslots; i++) pdp_work_wait(pp->send_fwd[i]), pp->send_fwd[i] = NULL;
    for (i = 0; i < 2; i++) pdp_work_wait(pp->send_bwd[i]), pp->send_bwd[i] = NULL;
}

PDP_API void pdp_pp_free(pdp_pp *pp)
{
    if (!pp) return;
    pdp__pp_drain(pp);
    if (pp->dp_work) pdp_work_wait(pp->dp_work);
    pdp__pp_free_buffers(pp);
    if (pp->traced) pdp__trace_close();
    pdp_model_free(pp->m);
    pdp__dealloc(pp->in_buf);
    pdp__dealloc(pp->send_fwd);
    pdp__dealloc(pp->acts);
    pdp__dealloc(pp->mb_rows);
    pdp__dealloc(pp->mb_first);
    pdp__dealloc(pp);
}

/* Buffers for micro-batches of up to rows rows (grown, never shrunk). */
static pdp_status pdp__pp_reserve(pdp_pp *pp, int64_t rows)
{
    pdp_device d = pp->m->device;
    size_t in_b = (size_t)(rows * pp->in_count) * sizeof(float);
    size_t out_b = (size_t)(rows * pp->out_count) * sizeof(float);
    pdp_status st;
    int i;
    if (rows <= pp->cap_rows) return PDP_OK;
    pdp__pp_free_buffers(pp);
    if ((st = pdp_model_reserve(pp->m, rows)) != PDP_OK) return st;
    for (i = 0; pp->stage > 0 && i <= pp->nslots; i++)
        if ((st = pdp__dev_alloc(d, in_b, (void **)&pp->in_buf[i])) != PDP_OK) return st;
    for (i = 0; i < 2; i++)
        if ((pp->stage < pp->p - 1 &&
             (st = pdp__dev_alloc(d, out_b, (void **)&pp->dy_buf[i])) != PDP_OK) ||
            (pp->stage > 0 && (st = pdp__dev_alloc(d, in_b, (void **)&pp->dx_buf[i])) != PDP_OK))
            return st;
    pp->cap_rows = rows;
    return PDP_OK;
}

/* ---- pp: one pass ---- */

static int pdp__pp_tag(int mb, int dir) { return (2 * mb + dir) % (PDP_COMM_TAG_MAX + 1); }

/* Posts the receive action k needs, if any (at most one outstanding). */
static pdp_status pdp__pp_post_recv(pdp_pp *pp, int k)
{
    const pdp__pp_action *a;
    int64_t n;
    pdp_status st = PDP_OK;
    if (k >= pp->nacts || pp->rwork_act == k) return PDP_OK;
    a = &pp->acts[k];
    n = pp->mb_rows[a->mb];
    PDP_ASSERT(!pp->rwork);
    if (a->kind == 'F' && pp->stage > 0)
        st = pdp_comm_recv(pp->c, pp->in_buf[a->mb % (pp->nslots + 1)], n * pp->in_count,
                           pp->stage - 1, pdp__pp_tag(a->mb, 0), &pp->rwork);
    else if (a->kind == 'B' && pp->stage < pp->p - 1)
        st = pdp_comm_recv(pp->c, pp->dy_buf[a->mb % 2], n * pp->out_count, pp->stage + 1,
                           pdp__pp_tag(a->mb, 1), &pp->rwork);
    else
        return PDP_OK;
    if (st == PDP_OK) pp->rwork_act = k;
    return st;
}

/* Waits for action k's receive (posting it first if it was not). */
static pdp_status pdp__pp_wait_recv(pdp_pp *pp, int k)
{
    pdp_status st;
    pdp_work *w;
    if (pp->rwork_act != k && (st = pdp__pp_post_recv(pp, k)) != PDP_OK) return st;
    if (pp->rwork_act != k) return PDP_OK; /* nothing to receive */
    w = pp->rwork;
    pp->rwork = NULL;
    pp->rwork_act = -1;
    return pdp_work_wait(w);
}

/* Starts a posted message (NCCL's batching: see the opening comment); w may be NULL. */
static void pdp__pp_start(pdp_work *w)
{
    if (w) (void)pdp_work_done(w);
}

static pdp_status pdp__pp_wait(pdp_work **w)
{
    pdp_work *x = *w;
    *w = NULL;
    return pdp_work_wait(x);
}

/* The input rows of micro-batch j on this stage. */
static const float *pdp__pp_input(const pdp_pp *pp, const pdp_tensor *x, int j)
{
    if (pp->stage > 0) return pp->in_buf[j % (pp->nslots + 1)];
    return x->data + pp->mb_first[j] * pp->in_count;
}

static pdp_status pdp__pp_forward(pdp_pp *pp, const pdp_tensor *x, int k)
{
    pdp_model *m = pp->m;
    int j = pp->acts[k].mb, slot = j % pp->nslots, d;
    int64_t n = pp->mb_rows[j], shape[4];
    const pdp_tensor *y;
    pdp_tensor in;
    pdp_status st;
    if ((st = pdp__pp_wait_recv(pp, k)) != PDP_OK) return st;
    if ((st = pdp__pp_wait(&pp->send_fwd[slot])) != PDP_OK) return st; /* F(j - S)'s send */
    if ((st = pdp__pp_post_recv(pp, k + 1)) != PDP_OK) return st;
    if (pp->stage == pp->p - 1) pdp__pp_start(pp->rwork); /* this forward sends nothing */
    shape[0] = n;
    for (d = 0; d < m->in_ndim; d++) shape[d + 1] = m->in_shape[d];
    pdp_tensor_wrap((float *)pdp__pp_input(pp, x, j), m->device, m->in_ndim + 1, shape, &in);
    pp->t_compute = pdp__now();
    pdp__model_use_slot(m, slot, NULL, 0, false);
    m->step = pp->steps; /* forward counts it up: the single-device run's step */
    m->sample_base = pp->sample_base + pp->mb_first[j];
    if ((st = pdp_model_forward(m, &in, &y)) != PDP_OK) return st;
    if (pp->stage < pp->p - 1) {
        if ((st = pdp_comm_send(pp->c, y->data, n * pp->out_count, pp->stage + 1,
                                pdp__pp_tag(j, 0), &pp->send_fwd[slot])) != PDP_OK)
            return st;
        pdp__pp_start(pp->send_fwd[slot]); /* with the next action's receive, if posted */
    }
    return PDP_OK;
}

static pdp_status pdp__pp_backward(pdp_pp *pp, const pdp_tensor *x, const int32_t *labels,
                                   int k, double *loss_sum)
{
    static const char *fn = "pdp_pp_forward_backward";
    pdp_model *m = pp->m;
    int j = pp->acts[k].mb, slot = j % pp->nslots, last = pp->stage == pp->p - 1;
    int64_t n = pp->mb_rows[j], total = pp->mb_first[pp->mb - 1] + pp->mb_rows[pp->mb - 1];
    const pdp_tensor *y = &m->out_view;
    pdp_tensor dy;
    pdp_status st;
    if ((st = pdp__pp_wait_recv(pp, k)) != PDP_OK) return st;
    if (pp->stage > 0 && (st = pdp__pp_wait(&pp->send_bwd[j % 2])) != PDP_OK) return st;
    if ((st = pdp__pp_post_recv(pp, k + 1)) != PDP_OK) return st;
    if (pp->stage == 0) pdp__pp_start(pp->rwork); /* this backward sends nothing */
    pp->t_compute = pdp__now();
    pdp__model_use_slot(m, slot, pdp__pp_input(pp, x, j), n, true);
    m->input_grad = pp->stage > 0 ? pp->dx_buf[j % 2] : NULL;
    if (last) { /* the loss, its gradient scaled by 1/total into the model's grad_a */
        pdp_tensor_wrap(m->grad_a, m->device, y->ndim, y->shape, &dy);
        if (pp->desc.loss) {
            double share = 0.0;
            if ((st = pp->desc.loss(pp->desc.loss_user, y, pp->mb_first[j], total, &dy,
                                    &share)) != PDP_OK)
                return pdp__err_wrap(st, "%s: the loss function on micro-batch %d", fn, j);
            *loss_sum += share * (double)total;
        } else {
            double sum = 0.0;
            if (y->ndim != 2)
                return pdp__err(PDP_ERR_SHAPE, "%s: the last stage's output has %d dimensions; "
                                "cross-entropy needs [batch, classes]", fn, y->ndim);
            if ((st = pdp__cross_entropy_on(m->device, y->data, labels + pp->mb_first[j], n,
                                            y->shape[1], 1.0f / (float)total, &sum, m->grad_a,
                                            fn)) != PDP_OK)
                return st;
            *loss_sum += sum;
        }
    } else {
        pdp_tensor_wrap(pp->dy_buf[j % 2], m->device, y->ndim, y->shape, &dy);
    }
    st = pdp_model_backward(m, &dy);
    m->input_grad = NULL;
    if (st != PDP_OK) return st;
    if (pp->stage > 0) {
        if ((st = pdp_comm_send(pp->c, pp->dx_buf[j % 2], n * pp->in_count, pp->stage - 1,
                                pdp__pp_tag(j, 1), &pp->send_bwd[j % 2])) != PDP_OK)
            return st;
        pdp__pp_start(pp->send_bwd[j % 2]);
    }
    return PDP_OK;
}

/* Micro-batch sizes of a batch of rows rows (the first rows % m one larger). */
static pdp_status pdp__pp_cut(pdp_pp *pp, int64_t rows)
{
    int j;
    if (!pp->mb_rows) {
        pp->mb_rows = (int64_t *)pdp__alloc((size_t)pp->mb * sizeof *pp->mb_rows);
        pp->mb_first = (int64_t *)pdp__alloc((size_t)pp->mb * sizeof *pp->mb_first);
        if (!pp->mb_rows || !pp->mb_first) return PDP_ERR_OUT_OF_MEMORY;
    }
    for (j = 0; j < pp->mb; j++) {
        pp->mb_rows[j] = rows / pp->mb + (j < rows % pp->mb);
        pp->mb_first[j] = j ? pp->mb_first[j - 1] + pp->mb_rows[j - 1] : 0;
    }
    return PDP_OK;
}

PDP_API pdp_status pdp_pp_forward_backward(pdp_pp *pp, const pdp_tensor *x,
                                           const int32_t *labels, float *loss)
{
    static const char *fn = "pdp_pp_forward_backward";
    pdp_comm_stats c0, c1;
    double t0, t1, busy = 0.0, loss_sum = 0.0;
    int64_t rows, per_mb;
    int k, in_flight = 0, peak = 0, last;
    pdp_status st = PDP_OK;
    if (!pp || !x || !loss) return pdp__err(PDP_ERR_INVALID, "%s: NULL argument", fn);
    *loss = 0.0f;
    last = pp->stage == pp->p - 1;
    if (last && !labels && !pp->desc.loss)
        return pdp__err(PDP_ERR_INVALID, "%s: labels is NULL on the last stage", fn);
    if (pp->dp_work)
        return pdp__err(PDP_ERR_STATE, "%s: rank %d: the last pass's gradients are still being "
                        "averaged; call pdp_pp_step or pdp_pp_finish first", fn, pp->c->rank);
    rows = x->shape[0];
    if (rows < pp->mb)
        return pdp__err(PDP_ERR_SHAPE, "%s: batch of %lld rows for %d micro-batches", fn,
                        (long long)rows, pp->mb);
    if (pp->stage == 0) {
        if (!x->data) return pdp__err(PDP_ERR_INVALID, "%s: x has no data on stage 0", fn);
        if (x->count != rows * pp->in_count)
            return pdp__err(PDP_ERR_SHAPE, "%s: x has %lld floats per row, stage 0 takes %lld",
                            fn, (long long)(x->count / rows), (long long)pp->in_count);
    }
    if (pdp__pp_cut(pp, rows) != PDP_OK)
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory", fn);
    if ((st = pdp__pp_reserve(pp, pp->mb_rows[0])) != PDP_OK)
        return pdp__err_wrap(st, "%s: rank %d: buffers for %lld rows", fn, pp->c->rank,
                             (long long)pp->mb_rows[0]);
    pp->sample_base = pp->dp ? (int64_t)pp->dp->rank * rows : 0;
    pdp_comm_get_stats(pp->c, &c0);
    if ((st = pdp_comm_barrier(pp->c, NULL)) != PDP_OK)
        return pdp__err_wrap(st, "%s: rank %d: the starting barrier", fn, pp->c->rank);
    t0 = pdp__now();
    for (k = 0; k < pp->nacts; k++) {
        const pdp__pp_action *a = &pp->acts[k];
        double a1;
        char name[16];
        pp->t_compute = pdp__now();
        if (a->kind == 'F') {
            st = pdp__pp_forward(pp, x, k);
            in_flight++;
            peak = PDP__MAX(peak, in_flight);
        } else {
            st = pdp__pp_backward(pp, x, labels, k, &loss_sum);
            in_flight--;
        }
        a1 = pdp__now();
        if (st != PDP_OK) {
            st = pdp__err_wrap(st, "%s: rank %d (stage %d): %c%d", fn, pp->c->rank, pp->stage,
                               a->kind, a->mb);
            break;
        }
        /* compute only: the time spent waiting for this action's message is idle */
        busy += a1 - pp->t_compute;
        if (pp->trace_tid) {
            char args[64];
            snprintf(name, sizeof name, "%c%d", a->kind, a->mb);
            snprintf(args, sizeof args, "\"micro_batch\":%d,\"rows\":%lld", a->mb,
                     (long long)pp->mb_rows[a->mb]);
            pdp__trace_complete(pp->trace_pid, pp->trace_tid, "compute", name, pp->t_compute, a1,
                                args);
        }
    }
    if (st != PDP_OK) {
        pdp__pp_drain(pp);
        return st;
    }
    {
        int i;
        pdp_status s2;
        for (i = 0; i < pp->nslots; i++)
            if ((s2 = pdp__pp_wait(&pp->send_fwd[i])) != PDP_OK && st == PDP_OK) st = s2;
        for (i = 0; i < 2; i++)
            if ((s2 = pdp__pp_wait(&pp->send_bwd[i])) != PDP_OK && st == PDP_OK) st = s2;
        if (st != PDP_OK)
            return pdp__err_wrap(st, "%s: rank %d: a send of this pass", fn, pp->c->rank);
    }
    if ((st = pdp_comm_barrier(pp->c, NULL)) != PDP_OK)
        return pdp__err_wrap(st, "%s: rank %d: the closing barrier", fn, pp->c->rank);
    t1 = pdp__now();
    if (pp->dp && pp->m->param_count &&
        (st = pdp_comm_allreduce(pp->dp, pp->m->grad_block, pp->m->param_count, PDP_REDUCE_AVG,
                                 &pp->dp_work)) != PDP_OK)
        return pdp__err_wrap(st, "%s: rank %d: averaging the gradients over dp", fn,
                             pp->c->rank);
    pdp_comm_get_stats(pp->c, &c1);
    {
        pdp__model_plan pl = pdp__model_plan_of(pp->m, NULL);
        per_mb = (pl.act + pl.saved + (pp->stage > 0 ? pp->in_count : 0)) * pp->mb_rows[0];
    }
    pp->steps++;
    pp->stats.steps++;
    pp->stats.step_s = t1 - t0;
    pp->stats.compute_s = busy;
    pp->stats.bubble = t1 > t0 ? PDP__MAX(0.0, 1.0 - busy / (t1 - t0)) : 0.0;
    pp->stats.peak_in_flight = peak;
    pp->stats.activation_bytes = per_mb * (int64_t)sizeof(float);
    pp->stats.peak_activation_bytes = peak * pp->stats.activation_bytes;
    pp->stats.bytes_sent = c1.bytes_sent - c0.bytes_sent;
    pp->stats.total_step_s += t1 - t0;
    pp->stats.total_compute_s += busy;
    if (last) *loss = (float)(loss_sum / (double)rows);
    return PDP_OK;
}

PDP_API pdp_status pdp_pp_finish(pdp_pp *pp)
{
    pdp_status st;
    if (!pp) return pdp__err(PDP_ERR_INVALID, "pdp_pp_finish: pp is NULL");
    if (!pp->dp_work) return PDP_OK;
    if ((st = pdp__pp_wait(&pp->dp_work)) != PDP_OK)
        return pdp__err_wrap(st, "pdp_pp_finish: rank %d: averaging the gradients over dp",
                             pp->c->rank);
    return PDP_OK;
}

PDP_API pdp_status pdp_pp_step(pdp_pp *pp, pdp_optim *opt)
{
    pdp_status st;
    if (!pp || !opt) return pdp__err(PDP_ERR_INVALID, "pdp_pp_step: %s is NULL", pp ? "opt" : "pp");
    if ((st = pdp_pp_finish(pp)) != PDP_OK) return pdp__err_wrap(st, "pdp_pp_step");
    if ((st = pdp_optim_step(opt)) != PDP_OK)
        return pdp__err_wrap(st, "pdp_pp_step: rank %d", pp->c->rank);
    pdp_model_zero_grad(pp->m);
    return PDP_OK;
}

/* ---- pp: queries ---- */

PDP_API pdp_model *pdp_pp_model(const pdp_pp *pp) { return pp ? pp->m : NULL; }
PDP_API int pdp_pp_stage(const pdp_pp *pp) { return pp ? pp->stage : 0; }
PDP_API int pdp_pp_num_stages(const pdp_pp *pp) { return pp ? pp->p : 0; }

PDP_API pdp_status pdp_pp_stage_layers(const pdp_pp *pp, int s, int *first, int *last)
{
    if (!pp || !first || !last) return pdp__err(PDP_ERR_INVALID, "pdp_pp_stage_layers: NULL argument");
    if (s < 0 || s >= pp->p)
        return pdp__err(PDP_ERR_INVALID, "pdp_pp_stage_layers: stage %d outside 0..%d", s,
                        pp->p - 1);
    *first = pp->first[s];
    *last = pp->first[s + 1];
    return PDP_OK;
}

PDP_API void pdp_pp_get_stats(const pdp_pp *pp, pdp_pp_stats *out)
{
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (pp) *out = pp->stats;
}
/* ---- end src/pp.c ---- */

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
