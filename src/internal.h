/* internal: what the implementation modules share and the API does not show.

   The platform layer first (platform.h: the system headers, threads, clocks, files,
   sockets and the compiler's macros), then the C library's headers, the allocation and
   assert overrides, the error helper
   pdp__err() that formats the thread-local message and returns the status, the
   aligned allocator, timers and small utilities; then, in sections, the private
   structs and prototypes that cross modules: devices, the model and its layer
   kinds (with the executor seam), tensor parallelism's state, losses, CUDA
   dispatch, gradient norms, optimizer internals, checkpoint ranges, the
   communicator contract every backend fills, and the trace sink. Nothing here is
   public. */

#include "platform.h"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <float.h>
#include <errno.h>
#include <time.h>

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

/* Hot element loops. gcc -O2 (its "very cheap" vectoriser) skips a loop of unknown
   length, which would need an epilogue, and any loop whose pointers may alias; so
   hot loops take PDP__RESTRICT pointers and run in blocks of PDP__VEC floats with a
   constant trip count, then the rest one by one. PDP__FOR_BLOCKED(i, n, body)
   writes that shape: body sees int64_t i. */
#if defined(__cplusplus) && defined(_MSC_VER)
#  define PDP__RESTRICT __restrict
#elif defined(__cplusplus)
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

#define PDP__MIN(a, b) ((a) < (b) ? (a) : (b))
#define PDP__MAX(a, b) ((a) > (b) ? (a) : (b))
#define PDP__DEF(val, def) ((val) != 0 ? (val) : (def)) /* != 0: a double is no truth value */
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
PDP__PRIVATE PDP__UNUSED int pdp__mul_ok(int64_t a, int64_t b, int64_t *out)
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
PDP__PRIVATE PDP__UNUSED int pdp__add_ok(int64_t a, int64_t b, int64_t *out)
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
PDP__PRIVATE PDP__UNUSED int pdp__mul3_ok(int64_t a, int64_t b, int64_t c, int64_t *out)
{
    int64_t ab;
    return pdp__mul_ok(a, b, &ab) && pdp__mul_ok(ab, c, out);
}

/* Formats the thread-local message and returns status: a failing branch is one
   line, `return pdp__err(PDP_ERR_SHAPE, "pdp_x: layer %d ...", ...)`. */
PDP__PRIVATE pdp_status pdp__err(pdp_status status, const char *fmt, ...);
/* Prepends "context: " to the current message (for errors passed up a level). */
PDP__PRIVATE pdp_status pdp__err_wrap(pdp_status status, const char *fmt, ...);
/* The thread's error (its message and its mark of a peer's failure, pdp__err_peer) kept
   across clean-up whose own calls would replace it: pdp__err_keep, then the waits and frees,
   then return pdp__err_restore(status, &kept). */
typedef struct pdp__err_kept {
    char msg[1024]; /* the thread-local message's size */
    bool peer;
} pdp__err_kept;

/* PDP_MALLOC'd memory aligned to 64 bytes (the original pointer is stored just
   before the block). Returns NULL on failure; bytes == 0 gives a valid block. */
PDP__PRIVATE void *pdp__alloc(size_t bytes);
PDP__PRIVATE void *pdp__calloc(size_t bytes);
PDP__PRIVATE void pdp__dealloc(void *p);


/* Waking a sleeping thread costs tens of microseconds on a VM, more than a small
   GEMM's share, so a thread that hands work off (the intra-op pool, DataParallel's
   workers) spins a while before it sleeps on a condition, as OpenMP runtimes and
   OpenBLAS do (longer): pdp__spin_while pauses while still(ctx) holds, for at most
   PDP__SPIN_S seconds. still() may read only values written with PDP__STORE_REL, and
   through PDP__LOAD_ACQ (threads.c). */
PDP__PRIVATE void pdp__spin_while(bool (*still)(const void *ctx), const void *ctx);

/* A worker team (threads.c): the one hand-off behind the intra-op pool and
   DataParallel's workers. Members 1..nworkers are persistent threads (created by
   pdp__team_grow, joined by pdp__team_free); member 0 is whoever calls
   pdp__team_run, which publishes fn/arg/n as a new generation, runs index 0 itself,
   then every index no member exists for, and returns when members 1..n-1 are done.
   Member i runs index i; a member with i >= n sits the job out. Both sides spin
   (pdp__spin_while) before they sleep. generation, pending and stop are written
   only with PDP__STORE_REL under lock (the spinners read them outside it); every
   other field is read and written under lock, so what the caller wrote before
   pdp__team_run is visible to the members, and what a member wrote in its index is
   visible to the caller after it (TSan clean). One caller at a time per team: the
   pool serialises callers with its busy mutex, a pdp_dp has one owner. */
#define PDP__TEAM_MAX 256 /* members, the caller included */
typedef struct pdp__team pdp__team;
typedef struct pdp__team_member {
    pdp__team *team;
    int index;               /* the index this thread runs: 1..PDP__TEAM_MAX-1 */
    unsigned long start_gen; /* the generation when the thread was made */
} pdp__team_member;
struct pdp__team {
    pdp__mutex lock;
    pdp__cond wake, done; /* wake: a new generation (or stop); done: pending hit 0 */
    bool ok;                   /* lock, wake and done are initialised */
    int nworkers;              /* threads started: members 1..nworkers */
    unsigned long generation;  /* bumped once per job; atomic stores only */
    int pending;               /* members still running the job; atomic stores only */
    int stop;                  /* atomic stores only */
    void (*fn)(void *arg, int i, int n); /* the current job */
    void *arg;
    int n;
    pdp__thread tid[PDP__TEAM_MAX - 1];
    pdp__team_member member[PDP__TEAM_MAX - 1];
};
/* Initialises a zeroed team with no threads; 0, or an errno value. */
PDP__PRIVATE int pdp__team_init(pdp__team *t);
/* Starts threads until the team has `workers` (at most PDP__TEAM_MAX - 1); no job may
   be running. 0, or the first pdp__thread_create error (the threads made so far stay). */
PDP__PRIVATE int pdp__team_grow(pdp__team *t, int workers);
/* Runs fn(arg, i, n) for i in [0, n) as described above; n may exceed the members. */
PDP__PRIVATE void pdp__team_run(pdp__team *t, int n, void (*fn)(void *arg, int i, int n),
                                void *arg);
/* Stops and joins every thread and releases the team (a zeroed team is fine); the
   team may be initialised again. */
PDP__PRIVATE void pdp__team_free(pdp__team *t);

/* The intra-op setting of the calling thread (see pdp_set_num_threads). */
PDP__PRIVATE int pdp__threads_for_caller(void);
/* Runs fn(arg, i, n) for i in [0, n) on the intra-op pool plus the calling thread
   (n <= the caller's thread count); returns when all are done. */
PDP__PRIVATE void pdp__parallel_for(int n, void (*fn)(void *arg, int i, int n), void *arg);
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
PDP__PRIVATE void *pdp__thread_scratch(size_t bytes);

/* ---- devices (cuda_host.c) ----
   Memory on a device other than the CPU goes through these; without PDP_CUDA a
   CUDA device fails with PDP_ERR_UNSUPPORTED naming the macro. */
PDP__PRIVATE pdp_status pdp__dev_alloc(pdp_device d, size_t bytes, void **out);
PDP__PRIVATE void pdp__dev_free(pdp_device d, void *p);
PDP__PRIVATE pdp_status pdp__dev_memset0(pdp_device d, void *p, size_t bytes);
PDP__PRIVATE pdp_status pdp__dev_fill(pdp_device d, float *p, int64_t count, float value);
PDP__PRIVATE pdp_status pdp__dev_copy(pdp_device dst_dev, void *dst, pdp_device src_dev,
                                      const void *src, size_t bytes);

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
    PDP__SILU,
    PDP__EMBEDDING,              /* a GPT's kinds (layers_gpt.c) */
    PDP__CAUSAL_SELF_ATTENTION,
    PDP__RESIDUAL,
    PDP__RESIDUAL_ADD,
    PDP__TIED_LINEAR,
    PDP__SEQ_SCATTER,            /* sequence parallel (tp.c): the sequence split and gathered */
    PDP__SEQ_GATHER,
    PDP__SEQ_REDUCE_SCATTER,
    PDP__GELU_ERF,               /* a new kind goes here: earlier values stay as they were */
    PDP__LAYER_KIND_COUNT
} pdp__layer_kind;

/* A layer's definition: immutable once added, shared by replicas. */
typedef struct pdp__layer {
    pdp__layer_kind kind;
    int index;                           /* position in the model ("3" of "3.weight") */
    int mask_index;                      /* what keys its random masks (Dropout, attention
                                            dropout): its place among the layers that are not
                                            TP's f and g, so a TP model draws the single-device
                                            model's masks; index on a model without TP */
    int in_ndim, out_ndim;               /* per-sample shapes: (F) or (C, H, W) */
    int64_t in_shape[3], out_shape[3];
    int64_t in_count, out_count;         /* per-sample element counts */
    int param_first, nparams;            /* registry indices (weight, then bias) */
    int64_t out_features;                /* Linear; Conv2d out channels */
    int64_t kernel, stride, padding;     /* Conv2d, MaxPool2d */
    float p;                             /* Dropout; CausalSelfAttention's attention dropout */
    float eps;                           /* LayerNorm */
    int64_t positions;                   /* Linear, LayerNorm on a [T, C] sample: T rows, each
                                            acted on alone (PyTorch's per-position Linear,
                                            LayerNorm(C)); 1 (or 0) for a 1-D sample */
    int64_t vocab, context;              /* Embedding: token ids [0, vocab), positions table
                                            rows */
    int64_t heads;                       /* CausalSelfAttention */
    int recompute;                       /* the model's recomputation is selective (set at
                                            the add): a CausalSelfAttention keeps no att */
    int residual_from;                   /* ResidualAdd: the index of its region's Residual */
    int tied_param;                      /* TiedLinear: the registry index of its weight (a
                                            parameter another layer owns) */
    int64_t tied_in;                     /* TiedLinear: that weight is [out_features, tied_in] */
    int64_t saved_per_sample;            /* floats kept from forward for backward */
    int64_t work_per_sample;             /* floats of temporary workspace */
    struct pdp__tp_state *tp;            /* TP kinds: the model's TP state (tp.c); else NULL */
    int64_t tp_lo, tp_full;              /* TP Linears: this rank holds [tp_lo, tp_lo + local)
                                            of the split dimension, tp_full wide (of each
                                            part); a CausalSelfAttention on a TP shard: its
                                            first head and the full head count */
    int64_t tp_parts;                    /* ColumnParallelLinear: the output is tp_parts
                                            blocks split alike (3: a GPT's q | k | v, so a
                                            rank holds q, k and v of its heads); 0 or 1:
                                            one */
    bool tp_skip_dx;                     /* ColumnParallelLinear after an f that is layer 0: no
                                            input gradient is needed */
    bool tp_seq;                         /* sequence parallel (tp.h): the layer acts on this
                                            rank's T / N positions of each [T, C] sample, from
                                            position tp_seq_lo (a LayerNorm, Dropout or residual
                                            between TP blocks; tp is the model's TP state); its
                                            parameters are whole on every rank and the slices'
                                            gradients are summed over TP in backward
                                            (layers_tp.c) */
    int64_t tp_seq_lo;                   /* tp_seq and the sequence-parallel kinds: this rank's
                                            first position */
    bool tp_sum_dy;                      /* GatherFromSequenceParallelRegion: its output gradient
                                            is a partial sum (a TP block follows) and backward
                                            reduce-scatters it; else it is replicated and
                                            backward keeps this rank's slice */
    int64_t mask_first;                  /* Dropout on a slice of a sample (tp_seq): the full
                                            sample's index of the slice's first element, so the
                                            slice draws the full sample's masks; else 0 */
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
    bool fused_relu;     /* Conv2d, Linear on the CPU: a ReLU follows and is applied here (forward:
                            y = relu(.); backward: dy masked by y > 0); model.c aliases it */
    const float *skip;   /* Residual, ResidualAdd (PDP__LAYER_SKIP): forward, the residual
                            region's input [batch, in_count] */
    float *dskip;        /* backward: the gradient the region's end sends around the branch
                            (ResidualAdd writes it, Residual adds it) */
    float *gelu_y;       /* Linear on the CPU, non-NULL: a GELU follows and is applied here:
                            forward keeps y = x W^T + b (the GELU's input, which its
                            backward reads) and writes gelu_y = gelu(y), the GELU's output;
                            backward gets the GELU's dy and takes dy gelu'(y) as its own
                            (model.c skips the GELU) */
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
} pdp__layer_io;

/* Shapes of a layer's parameters, weight then bias; ndim 0: none. */
typedef struct pdp__param_shapes {
    int wndim, bndim;
    int64_t wshape[4], bshape[4];
    const char *wname, *bname; /* their names after "<number>."; NULL: "weight", "bias" */
} pdp__param_shapes;

/* Flags of a layer kind: every decision outside a kind's own code that depends on
   what a kind is (model.c's views and fusions, tp.c's TP block, state_dict numbering)
   reads these, never the kind's value. */
#define PDP__LAYER_VIEW 1u       /* output = input seen again (Flatten): model.c aliases it
                                    and never calls forward or backward */
#define PDP__LAYER_FUSES_RELU 2u /* on the CPU, applies a following ReLU itself when
                                    io->fused_relu (model.c then makes the ReLU a view) */
#define PDP__LAYER_COLLECTIVE 4u /* runs a collective (TP's f and g): its CPU entries run on
                                    every device (the communicator moves the device's
                                    buffers) */
#define PDP__LAYER_UNNUMBERED 8u /* not a module of the state_dict numbering (TP's f and g,
                                    functions in Megatron-LM): the layers after it are named
                                    as if it were absent ("0.weight", "2.weight", ...) */
#define PDP__LAYER_FUSES_POOL 16u /* with its fused ReLU, applies a following 2x2 stride-2
                                     max pool (PDP__LAYER_FUSABLE_POOL) itself (io->pool_y;
                                     model.c skips it) */
#define PDP__LAYER_ELEMENTWISE 32u /* each output element is a fixed function of its input
                                      element alone (no parameters, position or random
                                      draw): it may sit on a TP shard, between a
                                      ColumnParallelLinear and a RowParallelLinear (tp.c) */
#define PDP__LAYER_FUSABLE_RELU 64u /* the ReLU a PDP__LAYER_FUSES_RELU kind applies when it
                                       follows it (model.c: pdp__model_relu_fused) */
#define PDP__LAYER_TAKES_IDS 256u /* its input is int32 token ids (Embedding): only a model's
                                     first layer, on a model whose input_dtype is
                                     PDP_DTYPE_I32; it has no input gradient */
#define PDP__LAYER_FORWARD_VIEW 512u /* forward: output = input, aliased and never called (as
                                        PDP__LAYER_VIEW); backward runs (Residual: it adds
                                        the gradient sent around the branch) */
#define PDP__LAYER_SKIP 1024u /* model.c hands it its residual region's skip (io->skip,
                                 io->dskip): a Residual or its ResidualAdd */
#define PDP__LAYER_TIED 2048u /* its weight is another layer's parameter (l->tied_param: a
                                 GPT's head tied to the token embedding); it owns none */
#define PDP__LAYER_HEADWISE 4096u /* acts on each attention head's q, k, v alone: after a
                                     ColumnParallelLinear split by heads (tp_parts 3) it is
                                     the attention of this rank's heads (tp.c) */
#define PDP__LAYER_FUSABLE_POOL 128u /* a max pool (kernel, stride) that a
                                        PDP__LAYER_FUSES_POOL kind applies after its fused
                                        ReLU when it is 2x2 stride 2 over an even H and W */
#define PDP__LAYER_FUSES_GELU 8192u /* on the CPU, applies a following GELU
                                       (PDP__LAYER_FUSABLE_GELU) itself, writing the GELU's
                                       output too (io->gelu_y; model.c skips the GELU) */
#define PDP__LAYER_FUSABLE_GELU 16384u /* the GELU a PDP__LAYER_FUSES_GELU kind applies when
                                          it follows it (model.c: pdp__model_gelu_fused) */

/* One layer kind: an entry of layers_table.c's pdp__layer_kinds, indexed by kind.
   setup fills out_*, saved_per_sample, work_per_sample and *ps from the
   configuration and in_* (in: the input shape as text, for messages); init
   (NULL: no parameters) fills host memory w, b from r; forward and backward run on
   the CPU and return PDP_OK, or a status whose message (pdp__err) says what is wrong
   with the input without naming the layer (model.c prefixes "pdp_model_forward:
   layer 3 (Linear): "); they allocate nothing, so a check costs a compare; the CUDA
   entries (NULL: none) return pdp_cuda.cu's status; cuda_work (NULL: none) is the
   workspace floats per sample pdp_cuda.cu's kernels need; flops (NULL: none, a view or
   a collective) estimates the forward + backward FLOPs per sample from the shapes, the
   input gradient's share only when input_grad (layers_table.c, "work estimates"). */
typedef struct pdp__layer_kind_info {
    const char *name; /* PyTorch's class name, for messages and pdp_model_layer_name */
    pdp_status (*setup)(pdp__layer *l, pdp__param_shapes *ps, const char *in);
    void (*init)(const pdp__layer *l, float *w, float *b, pdp_rng *r);
    pdp_status (*forward)(const pdp__layer *l, const pdp__layer_io *io);
    pdp_status (*backward)(const pdp__layer *l, const pdp__layer_io *io);
    pdp_status (*cuda_forward)(const pdp__layer *l, const pdp__layer_io *io);
    pdp_status (*cuda_backward)(const pdp__layer *l, const pdp__layer_io *io);
    int64_t (*cuda_work)(const pdp__layer *l);
    unsigned flags; /* PDP__LAYER_* */
    double (*flops)(const pdp__layer *l, bool input_grad);
} pdp__layer_kind_info;

/* layers_table.c: dispatch through the table. pdp__layer_setup: shape inference and
   validation; pdp__layer_init_params: parameter initialisation; forward and
   backward on io->device (backward of a tp_seq layer with parameters: through
   pdp__tp_seq_backward, its gradients summed over TP); the workspace floats per sample
   on device d; the FLOPs estimate (0 for a kind without one). */
PDP__PRIVATE const pdp__layer_kind_info *pdp__layer_kind_of(pdp__layer_kind k);
PDP__PRIVATE pdp_status pdp__layer_setup(pdp__layer *l, pdp__param_shapes *ps);
PDP__PRIVATE void pdp__layer_init_params(const pdp__layer *l, float *w, float *b, pdp_rng *r);
PDP__PRIVATE pdp_status pdp__layer_forward(const pdp__layer *l, const pdp__layer_io *io);
PDP__PRIVATE pdp_status pdp__layer_backward(const pdp__layer *l, const pdp__layer_io *io);
PDP__PRIVATE const char *pdp__layer_kind_name(pdp__layer_kind k);
PDP__PRIVATE const char *pdp__layer_kinds_with(unsigned flag, char *buf, size_t cap);
PDP__PRIVATE int64_t pdp__layer_work_per_sample(const pdp__layer *l, pdp_device d);
PDP__PRIVATE double pdp__layer_flops(const pdp__layer *l, bool input_grad);

typedef struct pdp__param_entry {
    char name[64]; /* "3.weight", or a builder's ("transformer.h.0.attn.c_attn.weight") */
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
    int checked;          /* TP layers the last passing width check covered: f's forward
                             runs the check (collective) while it differs from nlayers */
    pdp_model *model;     /* the model holding this state (the check reads its layers) */
    /* tp.c's pdp__tp_check_widths, set by pdp_model_set_tp (f's forward, layers_tp.c,
       comes before tp.c in the amalgamation) */
    pdp_status (*check_widths)(struct pdp__tp_state *tp);
    float scalar;         /* clipping's all-reduced squared norm (pdp_clip_grad_norm) */
    float *dscalar;       /* a CUDA model's device copy of it (NCCL reduces device memory
                             only): allocated by pdp_model_set_tp, freed by pdp_model_free */
    pdp_tp_stats stats;
} pdp__tp_state;

/* Every TP rank's TP layers against TP rank 0's (kinds, places, full widths), collective
   over tp->comm: all ranks return PDP_ERR_INVALID naming the first difference, or PDP_OK
   and tp->checked = tp->nlayers. f's forward calls it (tp->check_widths) while checked
   != nlayers. */
PDP__PRIVATE pdp_status pdp__tp_check_widths(pdp__tp_state *tp);
/* The layer owning parameter p of m (a pipeline stage's too: layers_tp.c). */
PDP__PRIVATE const pdp__layer *pdp__tp_param_layer(const pdp_model *m, int p);
/* Whether parameter p of m is a TP slice (layers_tp.c; else whole on every TP rank). */
PDP__PRIVATE bool pdp__tp_is_split(const pdp_model *m, int p);

PDP__PRIVATE pdp_status pdp__tp_copy_setup(pdp__layer *l, pdp__param_shapes *ps, const char *in);
PDP__PRIVATE pdp_status pdp__tp_copy_forward(const pdp__layer *l, const pdp__layer_io *io);
PDP__PRIVATE pdp_status pdp__tp_copy_backward(const pdp__layer *l, const pdp__layer_io *io);
PDP__PRIVATE pdp_status pdp__tp_reduce_setup(pdp__layer *l, pdp__param_shapes *ps, const char *in);
PDP__PRIVATE pdp_status pdp__tp_reduce_forward(const pdp__layer *l, const pdp__layer_io *io);
PDP__PRIVATE pdp_status pdp__tp_reduce_backward(const pdp__layer *l, const pdp__layer_io *io);
PDP__PRIVATE pdp_status pdp__tp_column_setup(pdp__layer *l, pdp__param_shapes *ps, const char *in);
PDP__PRIVATE void pdp__tp_column_init(const pdp__layer *l, float *w, float *b, pdp_rng *r);
PDP__PRIVATE pdp_status pdp__tp_column_backward(const pdp__layer *l, const pdp__layer_io *io);
PDP__PRIVATE pdp_status pdp__tp_row_setup(pdp__layer *l, pdp__param_shapes *ps, const char *in);
PDP__PRIVATE void pdp__tp_row_init(const pdp__layer *l, float *w, float *b, pdp_rng *r);
PDP__PRIVATE pdp_status pdp__tp_row_forward(const pdp__layer *l, const pdp__layer_io *io);
PDP__PRIVATE pdp_status pdp__tp_seq_setup(pdp__layer *l, pdp__param_shapes *ps, const char *in);
PDP__PRIVATE pdp_status pdp__tp_seq_scatter_forward(const pdp__layer *l, const pdp__layer_io *io);
PDP__PRIVATE pdp_status pdp__tp_seq_scatter_backward(const pdp__layer *l, const pdp__layer_io *io);
PDP__PRIVATE pdp_status pdp__tp_seq_gather_forward(const pdp__layer *l, const pdp__layer_io *io);
PDP__PRIVATE pdp_status pdp__tp_seq_gather_backward(const pdp__layer *l, const pdp__layer_io *io);
PDP__PRIVATE pdp_status pdp__tp_seq_reduce_scatter_forward(const pdp__layer *l,
                                                           const pdp__layer_io *io);
/* Backward of a tp_seq layer with parameters (a LayerNorm under sequence parallelism):
   backward (the kind's entry on io's device) into the workspace, the slices' sum over TP,
   added to io->dw and io->db (layers_table.c's pdp__layer_backward calls it). */
PDP__PRIVATE pdp_status pdp__tp_seq_backward(const pdp__layer *l, const pdp__layer_io *io,
                                             pdp_status (*backward)(const pdp__layer *,
                                                                    const pdp__layer_io *));
#ifdef PDP_CUDA
PDP__PRIVATE pdp_status pdp__tp_column_cuda_backward(const pdp__layer *l, const pdp__layer_io *io);
PDP__PRIVATE pdp_status pdp__tp_row_cuda_forward(const pdp__layer *l, const pdp__layer_io *io);
#endif
/* The executor seam (DDP, ZeRO): events of a pass, and where a layer's parameters
   and gradients live. The event function (NULL: off) is called before the forward
   of each layer with parameters, its own or another layer's (PDP__LAYER_TIED)
   (FORWARD_LAYER), when pdp_model_backward starts (BACKWARD_BEGIN: a failure refuses
   the backward, its message stands), before the backward of each such layer
   (BACKWARD_LAYER), before the forward of each such layer of a region that FULL
   recomputation runs again inside backward (RECOMPUTE_LAYER: the region's, in forward
   order, before the BACKWARD_LAYER of its ResidualAdd and of its layers), and after the
   last layer or the failing one (BACKWARD_END, st = the pass's status, return ignored), and
   when pdp_model_zero_grad runs, before it zeroes the model's gradient block (ZERO_GRAD,
   layer -1, return ignored: the executor waits for collectives still writing gradients and
   zeroes those it holds itself, ZeRO's buffers and shard). */
typedef enum pdp__model_event {
    PDP__EV_FORWARD_LAYER,
    PDP__EV_BACKWARD_BEGIN,
    PDP__EV_BACKWARD_LAYER,
    PDP__EV_RECOMPUTE_LAYER,
    PDP__EV_BACKWARD_END,
    PDP__EV_ZERO_GRAD
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

/* A wrapped model's parameter views where its executor holds the blocks (ZeRO):
   adjusts out->value, out->grad and their ranges for parameter index (model.c has
   filled out with the views of the model's own blocks, or empty ones where a block is
   gone), or refuses, the message starting with fn. */
typedef pdp_status (*pdp__model_views_fn)(void *user, const pdp_model *m, int index,
                                          pdp_param *out, const char *fn);

struct pdp_model {
    pdp_device device;
    uint64_t seed;
    pdp_rng init_rng;
    int in_ndim;
    int64_t in_shape[3], in_count;
    pdp_dtype in_dtype;      /* float32, or int32 token ids for an Embedding first */
    pdp_recompute recompute; /* activation recomputation (pdp_model_desc.recompute) */
    int open_residual;       /* the Residual of a region not yet closed; -1: none */
    pdp__layer *layers;
    int nlayers, cap_layers;
    pdp__param_entry *params;
    int nparams, cap_params;
    int64_t param_count;
    float *param_block;      /* param_count floats in use (borrowed when params_shared) */
    float *grad_block;       /* param_count floats in use */
    /* The blocks pdp__model_add allocated hold param_cap floats (more than param_count
       while a builder's pdp__model_reserve_params room is filling) while they are
       cap_param_block and cap_grad_block (an executor or a pipeline may swap in blocks of
       its own, of param_count floats). */
    int64_t param_cap;
    float *cap_param_block, *cap_grad_block;
    bool params_shared;      /* a DP replica reading its master's parameters */
    /* activations: act[i] is the output of layer i, [max_batch, out_count] */
    int64_t max_batch, batch;
    float **act;
    float *act_block, *saved_block, *work_block, *grad_a, *grad_b;
    float *grad_skip;        /* residual regions: the gradient sent around the branch, [max_batch,
                                widest] (NULL when the model has none) */
    int64_t *saved_off;      /* per layer, floats per sample before it in saved_block */
    pdp_tensor out_view;
    bool training;
    pdp_precision precision; /* of Linear and Conv2d products (pdp_model_set_precision) */
    bool have_forward;       /* a forward ran since the last backward */
    bool in_backward;        /* pdp_model_backward is running (its grad hooks may call in):
                                a pass, a re-plan or a new layer is refused until it returns
                                (pdp__model_check_idle) */
    uint64_t step;           /* training forwards so far (keys dropout masks) */
    int64_t sample_base;     /* global index of this model's first sample (DP replicas) */
    pdp_grad_hook hook;        /* the user's (pdp_model_set_grad_hook) */
    void *hook_user;
    pdp_grad_hook exec_hook;   /* the executor's (DDP's and ZeRO's reducer), called after the
                                  user's: a user's hook never replaces it */
    void *exec_hook_user;
    int trace_pid, trace_tid;  /* trace forward/backward per layer on this track (tid 0: off);
                                  set by the DDP reducer when PDP_TRACE is on */
    pdp__tp_state tp;          /* tensor parallel: the TP communicator (pdp_model_set_tp) */
    pdp__wrap wrapped;         /* the executor holding the model (PDP__WRAP_NONE: none); set
                                  by its create, cleared by its free (pdp__model_wrap) */
    int wrap_stage;            /* ZeRO's stage while wrapped by ZeRO; else 0 */
    const char *grads_reducing; /* not NULL while DDP's or ZeRO's reducer has collectives in
                                  flight on the gradients (reducer.c, REDUCING): the calls that
                                  wait for them; pdp_clip_grad_norm and pdp_optim_step refuse
                                  the model until then (the progress thread writes them) */
    int sliced_rank, sliced_world; /* sliced_world > 1: ZeRO stage 3 was freed without
                                  gathering (pdp_zero_free), so the parameter block holds rank
                                  sliced_rank's slices and zeros elsewhere: a forward, a save
                                  and a new executor refuse it (pdp__model_check_whole) until a
                                  whole checkpoint loads (pdp_checkpoint_load,
                                  pdp_tp_checkpoint_load) */
    pdp__model_views_fn views; /* pdp_model_param's views (above); NULL: the blocks' */
    void *views_user;
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

/* Executors holding a model (model.c). pdp__model_wrap: marks m as held by kind (stage:
   ZeRO's, else 0), or refuses with PDP_ERR_STATE, the message starting with fn, a model
   another executor holds (one executor per model: two would both own its gradients),
   naming both. pdp__model_unwrap: held by none again (the executor's free).
   pdp__model_wrapper: "ZeRO stage 3 (pdp_zero_create)", the holder for messages.
   pdp__model_check_layout: PDP_ERR_STATE for a call fn that would change the layout or
   the parameter block of a wrapped model (or a DP replica), naming the executor; what:
   the advice ("add layers before wrapping it"). */
PDP__PRIVATE pdp_status pdp__model_wrap(pdp_model *m, pdp__wrap kind, int stage, const char *fn);
/* A builder that knows its model's size: room for count floats in both blocks before the
   layers come, so none of them copies the blocks; then, built, before anyone holds a view,
   the blocks cut to param_count floats (a no-op when they are). pdp_gpt_create's. */
PDP__PRIVATE pdp_status pdp__model_reserve_params(pdp_model *m, int64_t count);
PDP__PRIVATE pdp_status pdp__model_fit_params(pdp_model *m);
PDP__PRIVATE void pdp__model_unwrap(pdp_model *m);
/* PDP_OK, or PDP_ERR_STATE (the message starting with fn) for a model whose parameter block
   holds one rank's ZeRO-3 slices only (sliced_world above). */
PDP__PRIVATE pdp_status pdp__model_check_whole(const pdp_model *m, const char *fn);
PDP__PRIVATE const char *pdp__model_wrapper(const pdp_model *m);
PDP__PRIVATE pdp_status pdp__model_check_layout(const pdp_model *m, const char *what,
                                                const char *fn);
/* A parameter view for pdp_model_param (model.c): e's shape over data when full, else 1-d
   of count floats; data NULL: empty (count 0). */
PDP__PRIVATE void pdp__model_view(float *data, pdp_device d, const pdp__param_entry *e, bool full,
                                  int64_t count, pdp_tensor *out);

/* A model with the same layers and a fresh set of buffers. share_params: the
   clone reads src's parameter block (CPU DP replicas); otherwise it gets its own
   copy of the parameter values. */
PDP__PRIVATE pdp_status pdp__model_clone(const pdp_model *src, pdp_device device, bool share_params,
                                         pdp_model **out);
/* Pipeline stages (model.c, for pp.c). pdp__model_stage: a new model holding layers [lo, hi)
   of full, with their parameters copied (names, layer indices and dropout keys stay full's:
   "3.weight" stays "3.weight"), zeroed gradients, input shape (and dtype) that of layer lo.
   A TiedLinear whose weight an earlier stage owns gets a copy of it as the stage's last
   parameter (pp.c keeps the two equal); a cut inside a residual region is
   PDP_ERR_UNSUPPORTED naming the region.
   pdp__model_set_slots: keep nslots sets of activations and saved tensors (buffers are
   re-planned on the next reserve). pdp__model_use_slot: the next forward writes set slot;
   with forwarded, the next backward reads set slot, whose forward ran on input x of batch
   rows (x must be the input that forward was given, still alive). */
PDP__PRIVATE pdp_status pdp__model_stage(const pdp_model *full, int lo, int hi, pdp_model **out);
/* A model with full's layers and parameter registry, no gradients and no executor, and a
   zeroed parameter block when with_block (model.c; pp.c's staging for full checkpoints). */
PDP__PRIVATE pdp_status pdp__model_layout(const pdp_model *full, bool with_block, pdp_model **out);
/* Renames parameter p (model.c; a builder's names, pdp_gpt_create's). */
PDP__PRIVATE pdp_status pdp__model_rename_param(pdp_model *m, int p, const char *name);
PDP__PRIVATE pdp_status pdp__model_set_slots(pdp_model *m, int nslots);
PDP__PRIVATE void pdp__model_use_slot(pdp_model *m, int slot, const float *x, int64_t batch,
                                      bool forwarded);

/* ---- losses (loss.c) ----
   Softmax cross-entropy over integer labels: *loss_sum gets the sum over the
   batch of -log softmax(logits)[label] (double accumulation), and when dlogits
   is not NULL it gets (softmax - onehot) * grad_scale. The public loss uses
   grad_scale = 1/batch; DP replicas use 1/global_batch so that the reduced
   gradients equal those of the whole batch. fn names the public caller. */
PDP__PRIVATE pdp_status pdp__cross_entropy(const float *logits, const int32_t *labels,
                                           int64_t batch, int64_t classes, float grad_scale,
                                           double *loss_sum, float *dlogits, const char *fn);

/* ---- CUDA dispatch (cuda_host.c) ----
   loss.c and optim.c hand work on a CUDA device to these; without
   PDP_CUDA they fail with PDP_ERR_UNSUPPORTED naming the macro. Same contracts
   as the CPU functions they stand in for (pointers on device d or io->device;
   labels in host memory). pdp__dev_add: dst += src on d (DP's reduce). */
/* Per-step scalars of the element loop (optim.c's CPU loop, cuda_host.c's kernels),
   taken once per update by pdp__optim_scalars_of from the desc's doubles: 1 - beta,
   1 - dampening, step_size = lr / (1 - beta1^t), bc2_sqrt = sqrt(1 - beta2^t) and
   decay = 1 - lr weight_decay computed in double (as PyTorch does in Python), then each
   rounded to float, as PyTorch's fp32 kernels round a double scalar argument. */
typedef struct pdp__optim_scalars {
    pdp_optim_kind kind;
    float lr, momentum, one_minus_damp, weight_decay;
    int nesterov, first;
    float beta1, one_minus_beta1, beta2, one_minus_beta2, step_size, bc2_sqrt, eps, l2, decay;
} pdp__optim_scalars;

PDP__PRIVATE pdp_status pdp__cuda_cross_entropy(pdp_device d, const float *logits,
                                                const int32_t *labels, int64_t batch,
                                                int64_t classes, float grad_scale, double *loss_sum,
                                                float *dlogits, const char *fn) PDP__UNUSED;
PDP__PRIVATE pdp_status pdp__cuda_cross_entropy_rows(pdp_device d, const float *logits,
                                                     const int32_t *labels, int64_t rows,
                                                     int64_t classes, float grad_scale,
                                                     double *loss_sum, float *dlogits,
                                                     const char *fn) PDP__UNUSED;
PDP__PRIVATE pdp_status pdp__cuda_mse(pdp_device d, const float *pred, const float *target,
                                      int64_t count, float scale, double *sum, float *dpred,
                                      const char *fn) PDP__UNUSED;
PDP__PRIVATE pdp_status pdp__cuda_optim_update(pdp_device d, const struct pdp__optim_scalars *s,
                                               float *p, const float *g, float *s0, float *s1,
                                               int64_t n) PDP__UNUSED;
PDP__PRIVATE pdp_status pdp__dev_add(pdp_device d, float *dst, const float *src,
                                     int64_t count) PDP__UNUSED;
/* Gradient clipping on d: *sum = sum of x^2 (double, fixed order); x *= s. */
PDP__PRIVATE pdp_status pdp__cuda_sumsq(pdp_device d, const float *x, int64_t count, double *sum,
                                        const char *fn) PDP__UNUSED;
PDP__PRIVATE pdp_status pdp__cuda_scale(pdp_device d, float *x, int64_t count, float s,
                                        const char *fn) PDP__UNUSED;

/* ---- gradient norms (optim.c): the local pieces every clipping call is made of ----
   pdp__grad_sumsq: *sum += the sum of squares of g[0, n) (on m's device; double, fixed
   order). pdp__grad_scale: g[0, n) *= coef. fn names the public caller in errors. */
PDP__PRIVATE pdp_status pdp__grad_sumsq(const pdp_model *m, const float *g, int64_t n, double *sum,
                                        const char *fn);
PDP__PRIVATE pdp_status pdp__grad_scale(const pdp_model *m, float *g, int64_t n, float coef,
                                        const char *fn);
/* *sum += the squares of gradient elements [lo, hi) of m's flat block, held at g[0, hi -
   lo), as a TP group counts them: on a TP model a slice's elements on every TP rank and
   a replicated tensor's on TP rank 0 only, so that the sum over the TP group is the full
   model's; on any other model every element (pdp__grad_sumsq). */
PDP__PRIVATE pdp_status pdp__grad_sumsq_range(const pdp_model *m, const float *g, int64_t lo,
                                              int64_t hi, double *sum, const char *fn);
/* The one rule for max_norm of every clipping call (pdp_clip_grad_norm,
   pdp_zero_clip_grad_norm, pdp_pp_clip_grad_norm): finite and >= 0, else
   PDP_ERR_INVALID "fn: max_norm ...". */
PDP__PRIVATE pdp_status pdp__check_max_norm(float max_norm, const char *fn);
/* torch.nn.utils.clip_grad_norm_'s coefficient max_norm / (norm + 1e-6), in double,
   rounded to float; >= 1 means no clipping. */
PDP__PRIVATE float pdp__clip_coef(float max_norm, double norm);
/* *sum <- the sum over c's ranks of *sum (a float all-reduce: every rank gets the same
   bits). host: a float that outlives the call (the executor's); dev: its copy on c's
   device for a CUDA communicator (NCCL reduces device memory only), else NULL. The
   message names the failing collective; the caller prefixes its own. */
PDP__PRIVATE pdp_status pdp__grad_allreduce_sum(pdp_comm *c, float *host, float *dev, double *sum);

/* ---- optimizer internals (optim.c) ----
   Updates parameters [lo, hi) of the flat blocks (all of them for a normal
   step; one rank's shard under ZeRO). The step counter is advanced by the
   caller-visible pdp_optim_step only. */
PDP__PRIVATE pdp_status pdp__optim_step_range(pdp_optim *o, float *params, const float *grads,
                                              int64_t lo, int64_t hi);
/* pdp_optim_step's checks (model changed since create, ZeRO shard, sharded blocks),
   with its messages; changes nothing. */
PDP__PRIVATE pdp_status pdp__optim_check_step(const pdp_optim *o);
/* The scalars of o's next update (learning rate, Adam's bias corrections). */
PDP__PRIVATE void pdp__optim_scalars_of(const pdp_optim *o, pdp__optim_scalars *s);
/* Parameters [lo, hi) updated on the calling thread with scalars s from
   pdp__optim_scalars_of (a CPU optimizer; nothing is checked or counted). */
PDP__PRIVATE void pdp__optim_update_range(const pdp_optim *o, const pdp__optim_scalars *s,
                                          float *params, const float *grads, int64_t lo,
                                          int64_t hi);
/* Counts an update done range by range (pdp__optim_step_range,
   pdp__optim_update_range) as one step. */
PDP__PRIVATE void pdp__optim_finish_step(pdp_optim *o);
/* An optimizer holding state for [lo, hi) of the flat block only (ZeRO: one
   rank's range; pdp_optim_create is [0, param_count)). pdp_optim_step on it
   updates [lo, hi) only, with the bits a full optimizer gives that range.
   fn names the public caller. */
PDP__PRIVATE pdp_status pdp__optim_create_range(pdp_optim **out, pdp_model *m,
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
PDP__PRIVATE pdp_status pdp__checkpoint_save_range(const char *path, const pdp_model *m,
                                                   const float *params, const pdp_optim *o,
                                                   int64_t lo, int64_t hi, const char *fn);
PDP__PRIVATE pdp_status pdp__checkpoint_load_range(const char *path, pdp_model *m, float *params,
                                                   pdp_optim *o, int64_t lo, int64_t hi,
                                                   const char *fn);
/* The same for the shards of one ZeRO save: save writes run (16 lowercase hex
   digits, the save's id) as the shard file's "shard.run"; load accepts only a
   shard file of exactly [lo, hi) whose "shard.run" is run, and fails with
   PDP_ERR_FORMAT naming the file and both runs otherwise. */
PDP__PRIVATE pdp_status pdp__checkpoint_save_run(const char *path, const pdp_model *m,
                                                 const float *params, const pdp_optim *o,
                                                 int64_t lo, int64_t hi, const char *run,
                                                 const char *fn);
PDP__PRIVATE pdp_status pdp__checkpoint_load_run(const char *path, pdp_model *m, float *params,
                                                 pdp_optim *o, int64_t lo, int64_t hi,
                                                 const char *run, const char *fn);

/* ---- ZeRO internals (zero.c, for zero_ckpt.c) ----
   zero_ckpt.c comes after zero.c and reads struct pdp_zero and its units directly;
   these are the two functions of zero.c it calls. fn names the public caller. */
/* Stage 3: every gather slot free (FSDP's reshard), after the all-gathers in flight. */
PDP__PRIVATE pdp_status pdp__zero_release_params(pdp_zero *z);
/* Stages 1-2: every rank's slices of the full block into dst (the model's param_count
   floats, on its device), unit by unit; collective. */
PDP__PRIVATE pdp_status pdp__zero_gather_full(pdp_zero *z, float *dst, const char *fn);

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
    /* a batch that progresses together (comm.h's pdp_comm_sendrecv; comm.c validated it):
       w[i] gets message i's handle; on failure the ones posted before keep theirs, the rest
       are NULL */
    pdp_status (*sendrecv)(pdp_comm *c, const pdp_p2p *ops, int n, pdp_work **w);
    /* collective over c: comm.c has exchanged every rank's (colour, key) and computed this
       rank's place (new_rank of new_size; leader: the old rank of new rank 0) and the new
       communicator's name (cut to PDP__COMM_NAME_CAP); colour < 0 joins nothing (*out
       stays NULL) but takes part */
    pdp_status (*split)(pdp_comm *c, int colour, int key, int new_rank, int new_size, int leader,
                        const char *name, pdp_comm **out);
    pdp_status (*wait)(pdp_work *w);
    bool (*done)(pdp_work *w);
    void (*destroy)(pdp_comm *c);
} pdp__comm_ops;

/* A communicator's name with its NUL (desc.name, a split's "<parent>.<colour>", a mesh
   group's "<world>.TP(DP 1, PP 0)"): a longer one is cut. */
#define PDP__COMM_NAME_CAP 64

/* Common head of every communicator; a backend keeps its state behind impl. */
struct pdp_comm {
    const pdp__comm_ops *ops;
    pdp_backend backend;
    int rank, size;
    int trace_pid;          /* this rank's process lane in the trace: its rank in the world it
                               was split from (MPI: the world rank), so groups do not merge */
    double timeout_s;
    pdp_device device;
    char name[PDP__COMM_NAME_CAP];
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
PDP__PRIVATE pdp_status pdp__comm_init_mpi_env(pdp_comm **out, const pdp_comm_desc *desc);
PDP__PRIVATE pdp_status pdp__comm_init_nccl_env(pdp_comm **out, const pdp_comm_desc *desc);

/* ---- trace (trace.c) ----
   Chrome trace JSON (Perfetto, chrome://tracing) when PDP_TRACE=path is set.
   One process-wide, mutex-guarded sink (one of the exceptions to "no globals"
   that the manual lists, THREADS AND DETERMINISM), reference counted by open/close; PDP_TRACE is
   read by each open while no trace file is open. process_rank >= 0 (this process is one rank of
   several) writes path with ".rank<r>" inserted before the extension. Events take pdp__now()
   seconds; pid = rank, tid = a track from pdp__trace_track; cat is a string
   literal; args NULL or a JSON object body ("\"bytes\":64"). Recording copies
   a fixed-size record and never allocates. Everything is a no-op when off. */
PDP__PRIVATE pdp_status pdp__trace_open(int process_rank);
PDP__PRIVATE void pdp__trace_close(void);
PDP__PRIVATE bool pdp__trace_enabled(void);
PDP__PRIVATE int pdp__trace_track(int pid, const char *name);
PDP__PRIVATE void pdp__trace_complete(int pid, int tid, const char *cat, const char *name,
                                      double t0, double t1, const char *args);
PDP__PRIVATE void pdp__trace_async(int pid, int tid, const char *cat, const char *name, uint64_t id,
                                   double t0, double t1, const char *args);
