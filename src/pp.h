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
       caller's and is not used again (free it). The stage model is the pipeline's
       until pdp_pp_free: its layout is fixed, its optimizer is made on it
       (pdp_pp_step refuses any other), and its gradients are clipped with
       pdp_pp_clip_grad_norm, which sees every stage (pdp_clip_grad_norm on one stage
       would see that stage only). A model with tensor-parallel layers (built on a TP
       group, tp.h) gives stages whose TP layers all-reduce on that group: PP x TP, and
       with desc.dp DP x TP x PP; its clipping counts each stage's slices on every TP
       rank and its replicated tensors once (every schedule: with chunks, each chunk of a
       stage is a TP-split piece, and pdp_tp_get_stats on the stage model sums its chunks'
       traffic). Sequence-parallel TP stages (pdp_gpt_desc.sequence_parallel) send what
       their blocks hold, a TP rank's T / t positions, to the same TP rank of the next
       stage: 1/t of the activation's bytes, no gather at the boundary;
     - stage boundaries are given (first_layer[s]) or balanced: by parameter count
       (default), by estimated work (each layer's forward + backward FLOPs per sample
       from its shapes, the same on every machine and run) or by time measured on rank
       0 (forward + backward per layer, which varies from run to run), as a contiguous
       split minimising the largest stage; every rank checks that it got the same
       split as rank 0. Parameter counts can leave a stage nearly idle (the first
       Linear of the MLP 784-512-512-10 holds 60% of its parameters but 50% of its
       estimated work), and its bubble then exceeds the formula below: balance by work;
     - a GPT (gpt.h) is cut between blocks' residual regions only (a stage never starts
       inside a region: the skip stays on one stage; a first_layer that cuts one fails
       naming it): the embedding on stage 0, the final LayerNorm, head and loss on the
       last, labels one a position (-1 ignored, the loss the mean over the batch's
       labels that count). The head's weight is the embedding's (tied): the last stage
       holds a copy of it, and after each pass the two stages exchange their gradients
       of it and add (Megatron's embedding group), so both copies take the same step;
       pdp_pp_clip_grad_norm counts it once. An attention's dropout, drawn again in
       backward, uses its micro-batch's keys;
     - a schedule is an explicit list of actions (F j: forward of micro-batch j,
       B j: its backward; F j c, printed "F3c1", on chunk c) per stage, printed by
       pdp_pp_schedule_str. Each is one rule: w warm-up forwards, then one forward and
       one backward alternately, then the remaining backwards:
         GPipe  w = m: F0 F1 .. F(m-1) B0 .. B(m-1);
         1F1B   (PipeDream-Flush) w = min(p - 1 - s, m) on stage s: stage s never
                holds more than min(p - s, m) micro-batches;
         interleaved 1F1B (Megatron-LM's virtual pipeline stages) the model cut into
                p v pieces, stage s holding v chunks: pieces s, s + p, s + 2p, ..;
                micro-batches go in groups of p, each group through chunk 0, then
                chunk 1, .. (backwards from chunk v - 1 down); Megatron's warm-up
                w = min(2 (p - s - 1) + (v - 1) p, m v) of the stage's m v forwards
                (megatron/core/pipeline_parallel/schedules.py, groups of p: its default
                microbatch_group_size_per_vp_stage).
                m must be a multiple of p. Activations also go from the last stage
                back to the first (chunk c to chunk c + 1) and gradients from the
                first to the last: 2 m (p v - 1) messages a pass instead of
                2 m (p - 1), for a bubble of (p - 1) / (v m + p - 1) instead of
                (p - 1) / (m + p - 1) (v times smaller in Megatron's terms, its section
                2.2.2), and more activations held on the early stages (stage 0: up to
                2 (p - 1) + (v - 1) p + 1 micro-batch chunks, each about 1 / v of a
                stage's);
     - a stage keeps one set of activations per micro-batch it may hold at once
       (GPipe m, 1F1B min(p - s, m); each chunk as many as its list holds at once):
       the model's activation slots;
     - messages go in steps (Megatron-LM's p2p grouping): a step is one action, or in
       the interleaved schedule's steady state a forward and the backward after it
       (printed joined: "F2c0+B0c1"); after each step one batch (pdp_comm_sendrecv)
       carries the step's sends and the next step's receives (on local and MPI, where
       messages start when posted, a step's forward sends at once). Sends are
       asynchronous (a stage computes while they are in flight);
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
   (p - 1) / (v m + p - 1) for equal pieces (v = 1 but for the interleaved schedule),
   with Megatron's figure (p - 1) / (v m), the bubble's time over the ideal step
   rather than over the whole step, beside it; the most micro-batches whose
   activations the stage held at once and their bytes; the messages it sent.
   PDP_TRACE=out.json draws the schedule: one lane per stage ("pipeline stage s"), one
   event per action ("F3", "B3").

   Backends: local (thread ranks), MPI (processes) and NCCL (a GPU per stage: thread
   ranks from pdp_nccl_group_create, or processes), with the same arithmetic: GPipe and
   1F1B over 2-4 GPUs and interleaved 1F1B over 2 equal the single-device model (tested
   on the CUDA emulation, tests/test_cuda.c). What NCCL changes:
     - x is device memory of stage 0's GPU (labels stay on the host); activations and
       gradients travel GPU to GPU;
     - NCCL has no tags and runs a rank's messages on one stream: a step's batch is one
       NCCL group, started at once, whose sends and receives progress together, and the
       batches run one after another. The interleaved steady state's pair is what makes
       that safe: with a batch an action, two stages can each queue a send ahead of the
       receive the other's send waits for (m >= 2p; pp.c's opening comment walks through
       it, and a replay of every schedule under NCCL's rules checks p = 2..8, v = 1..4,
       m = p..4p); the CUDA emulation, stricter than a GPU since it enqueues a group only
       once the stream's earlier work is done, runs them; the tags are still checked,
       from a header;
     - a peer that never sends fails the wait with PDP_ERR_TIMEOUT naming the peer and
       the tag, but NCCL cannot withdraw a message: the communicator is aborted and every
       later call on it fails (local and MPI stay usable);
     - the timings are host times: kernels run asynchronously, so part of an action's
       GPU work can be counted as the next action's wait, and compute_s and bubble are
       approximations on GPUs (peak_in_flight and the bytes are exact);
     - DP x PP: dp is its own NCCL communicator (pdp_comm_split) with its own stream.

   Typical step (each rank):
       pdp_pp_forward_backward(pp, x, labels, &loss);   the whole batch; loss on the last stage
       pdp_pp_clip_grad_norm(pp, 1.0f, &norm);          optional; collective over the stages
       pdp_pp_step(pp, opt);                            opt made on pdp_pp_model(pp)
   Reference: Huang et al., "GPipe" (2019); Narayanan et al., "Efficient Large-Scale
   Language Model Training on GPU Clusters Using Megatron-LM" (2021), section 2.2. */

typedef struct pdp_pp pdp_pp;

typedef enum pdp_pp_schedule {
    PDP_PP_1F1B = 0, /* default */
    PDP_PP_GPIPE = 1,
    PDP_PP_INTERLEAVED_1F1B = 2 /* desc.chunks per stage */
} pdp_pp_schedule;

/* How a split is balanced without first_layer: the contiguous split of the layers into
   p stages that minimises the largest stage's sum of a per-layer cost; of equal splits
   the one whose last stage starts latest, the stages before it split by the same rule
   (so an activation stays with the Linear before it). */
typedef enum pdp_pp_balance {
    PDP_PP_BALANCE_PARAMS = 0, /* default: parameter counts */
    PDP_PP_BALANCE_TIME = 1,   /* forward + backward time per layer (and the pipeline's
                                  cross-entropy with the last), measured by stage 0; with TP
                                  or desc.dp, pipeline 0's TP rank 0's split on every rank */
    PDP_PP_BALANCE_WORK = 2    /* forward + backward FLOPs per sample, estimated from each
                                  layer's shapes (a GEMM counts 2 k n a row; the first layer
                                  computes no input gradient): deterministic */
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
#define PDP_PP_MAX_CHUNKS 64 /* chunks per stage of the interleaved schedule */

typedef struct pdp_pp_desc {
    pdp_pp_schedule schedule;  /* default 1F1B */
    int micro_batches;         /* m; default the number of stages */
    int chunks;                /* v: model chunks per stage, PDP_PP_INTERLEAVED_1F1B only;
                                  default 2 there (1 for the others, which take no other);
                                  p v pieces must fit the model's cut points (its layers
                                  outside residual regions) */
    const int *first_layer;    /* NULL: balanced; else one entry per piece (per stage but
                                  for the interleaved schedule: p v, piece q on stage
                                  q % p), its first layer: 0 = first_layer[0] <
                                  first_layer[1] < ... < number of layers */
    pdp_pp_balance balance;    /* without first_layer; default parameter counts */
    int64_t balance_batch;     /* BALANCE_TIME: samples per timed pass; default 32 */
    pdp_pp_loss_fn loss;       /* NULL: softmax cross-entropy against the labels */
    void *loss_user;           /* passed to loss */
    pdp_comm *dp;              /* NULL; else DP x PP: gradients averaged over dp each step */
} pdp_pp_desc;

/* Collective over c (every rank calls it; rank r is stage r) and, with desc.dp, over
   dp. full: the same model on every rank (its parameters are compared with rank 0's by a
   hash); it is read, not kept. A model with fewer layers than stages (pieces), an
   interleaved m that is not a multiple of p, boundaries or parameters that differ from
   rank 0's, fail with PDP_ERR_INVALID. A rank
   that fails alone (a desc field out of range, no memory for its stage) makes every rank
   fail: the others with PDP_ERR_COMM naming it. PDP_TRACE=out.json traces the schedule. */
PDP_API pdp_status pdp_pp_create(pdp_pp **out, const pdp_model *full, pdp_comm *c,
                                 const pdp_pp_desc *desc);
PDP_API void pdp_pp_free(pdp_pp *pp); /* NULL is fine */
/* The desc in use, defaults filled in (sokol's query-defaults): micro_batches and
   balance_batch and chunks resolved; first_layer points at the split in use (pp's own
   array of pieces + 1 entries, the last the number of layers), valid until pdp_pp_free. A zero
   desc for NULL. */
PDP_API pdp_pp_desc pdp_pp_get_desc(const pdp_pp *pp);

/* One pipeline pass over a batch of B >= m rows cut into m micro-batches (the first
   B % m one row larger): forward, loss and backward, the gradients accumulated (+=)
   into the stage's model. x is read on the first stage only, on its device (the others read
   x->shape[0]: x->data may be NULL there), labels on the last only (with desc.loss,
   labels may be NULL). *loss: the step's mean loss on the last stage, 0 elsewhere.
   With desc.dp the gradients' all-reduce is launched at the end; pdp_pp_finish waits.
   When one stage fails (its loss function, a shape, a peer that does not answer within
   the communicator's timeout), every stage fails, each message naming the call, the
   rank, its stage and the action (F<j> or B<j>, F<j>c<c> interleaved) that failed there. */
PDP_API pdp_status pdp_pp_forward_backward(pdp_pp *pp, const pdp_tensor *x,
                                           const int32_t *labels, float *loss);
/* With desc.dp: waits for the gradients' average over dp. Otherwise nothing to do. */
PDP_API pdp_status pdp_pp_finish(pdp_pp *pp);
/* torch.nn.utils.clip_grad_norm_(full.parameters(), max_norm) of the whole model:
   collective over the pipeline's communicator (every stage calls it), between
   pdp_pp_forward_backward and pdp_pp_step. It calls pdp_pp_finish first, so with
   desc.dp the gradients are already averaged over dp (those of the global batch, the
   same on every pipeline): the norm is the square root of the sum over the stages of
   each stage's sum of squares (doubles, added in stage order: the same on every stage
   and every pipeline). Every stage scales its gradients by max_norm / (norm + 1e-6)
   when that is below 1. *total_norm (may be NULL): the norm before clipping, on every
   stage. max_norm must be finite and >= 0 (else PDP_ERR_INVALID); a NaN or Inf norm
   fails with PDP_ERR_NUMERIC on every stage, nothing scaled. */
PDP_API pdp_status pdp_pp_clip_grad_norm(pdp_pp *pp, float max_norm, float *total_norm);
/* pdp_pp_finish, pdp_optim_step(opt), zeroed gradients. opt must have been made on
   pdp_pp_model(pp) (else PDP_ERR_INVALID, nothing changed). */
PDP_API pdp_status pdp_pp_step(pdp_pp *pp, pdp_optim *opt);

/* Checkpoints of the full model (collective over the pipeline; every stage calls them).
   Save: stage 0 gathers every stage's parameters (and, with o, the optimizer's state) and
   writes the file pdp_checkpoint_save writes for the single-device model: its names, one
   file, loadable by pdp_checkpoint_load on one device, by a pipeline of any stage count and
   by PyTorch (a tied weight once, under its owner's name). Load: every stage reads such a
   file and keeps its own tensors (and a tied weight's copy from its owner's); the step
   count and the optimizer's hyper-parameters come back as pdp_checkpoint_load restores
   them. Either fails on every stage, nothing changed on a load, when any stage fails, the
   message naming the call, the rank and the path. o: this stage's optimizer (made on
   pdp_pp_model(pp)) or NULL. Not with a dp communicator's average in flight (call
   pdp_pp_step or pdp_pp_finish first). */
PDP_API pdp_status pdp_pp_checkpoint_save(pdp_pp *pp, const pdp_optim *o, const char *path);
PDP_API pdp_status pdp_pp_checkpoint_load(pdp_pp *pp, pdp_optim *o, const char *path);

/* This rank's stage; with chunks, their layers and parameters one after the other (chunk 0
   first) in one model: the optimizer's, clipping's and the checkpoints' (run it only through
   the pipeline: its layers are not consecutive). */
PDP_API pdp_model *pdp_pp_model(const pdp_pp *pp);
PDP_API int pdp_pp_stage(const pdp_pp *pp);
PDP_API int pdp_pp_num_stages(const pdp_pp *pp);
/* Stage s holds layers [*first, *last) of the full model. With chunks (v > 1) it holds v
   ranges: PDP_ERR_INVALID naming pdp_pp_chunk_layers. */
PDP_API pdp_status pdp_pp_stage_layers(const pdp_pp *pp, int s, int *first, int *last);
/* Chunk c of stage s (piece c p + s) holds layers [*first, *last). */
PDP_API pdp_status pdp_pp_chunk_layers(const pdp_pp *pp, int s, int c, int *first, int *last);
/* This stage's actions as text, "F0 F1 B0 F2 B1 B2", interleaved "F0c0 F1c0 F0c1 ..
   F2c0+B0c1 .." (a + joins the two actions of one step of messages; truncated to cap). */
PDP_API const char *pdp_pp_schedule_str(const pdp_pp *pp, char *buf, size_t cap);

typedef struct pdp_pp_stats {
    int stage, stages;              /* s and p */
    int micro_batches;              /* m */
    int chunks;                     /* v */
    pdp_pp_schedule schedule;
    int64_t steps;                  /* pipeline passes finished */
    /* the last pass, this stage */
    double step_s;                  /* from the starting barrier to the closing one */
    double compute_s;               /* forward, loss and backward of every micro-batch */
    double bubble;                  /* 1 - compute_s / step_s: the stage's idle share */
    double bubble_theory;           /* pdp's: (p - 1) / (v m + p - 1), idle over step time */
    double bubble_megatron;         /* Megatron's: (p - 1) / (v m), idle over ideal time */
    int peak_in_flight;             /* most micro-batches whose activations were held (with
                                       chunks: micro-batch chunks, summed over the chunks) */
    int64_t activation_bytes;       /* one micro-batch's (largest) through the stage's chunks:
                                       outputs, saved tensors and, after piece 0, the
                                       received input */
    int64_t peak_activation_bytes;  /* the most bytes of those held at once (v = 1:
                                       peak_in_flight x activation_bytes) */
    int64_t bytes_sent;             /* activations forward and gradients back */
    int64_t messages;               /* activations and gradients sent: m (2 v - [s = 0] -
                                       [s = p - 1]) a pass */
    /* sums over all passes */
    double total_step_s, total_compute_s;
} pdp_pp_stats;

PDP_API void pdp_pp_get_stats(const pdp_pp *pp, pdp_pp_stats *out);
/* One line a person reads (pdp_dp_stats_format's style): the stage's compute seconds and
   bubble over all passes beside the formula, "met" when within 0.10 of it, and its peak
   activation memory beside what each schedule holds (1F1B min(p - s, m) micro-batches,
   GPipe m); the interleaved schedule's line has the bubble beside both formulas, labelled,
   its peak activation memory and its messages beside m (2 v - [s = 0] - [s = p - 1]).
   Returns the length snprintf would have written. */
PDP_API int pdp_pp_stats_format(const pdp_pp_stats *s, char *buf, size_t bytes);
/* This stage's share of a step beside the formulas, three lines into buf (PDP_ERR_INVALID
   for a NULL argument or when they do not fit; PDP_ERR_STATE before the first pass): the
   layers it holds (one range a chunk) and its peak activation memory; the bytes and
   messages it sent in the last pass beside m (2 v - [s = 0] - [s = p - 1]) messages of
   b T C 4 bytes (what one micro-batch of b rows sends across a boundary: the rows times the
   per-sample floats there, T C for a GPT, T C / t under sequence parallelism) plus, on the
   two stages that hold a tied weight, its gradient (V C 4 for a GPT's wte); its bubble
   over all passes beside pdp's (p - 1) / (v m + p - 1) and Megatron's (p - 1) / (v m):
       PP stage 0 of 2: layers 0..40, activations 1.41 MB (peak)
         sent a step: 131072 bytes in 4 messages (m (2v - [s=0] - [s=p-1]) = 4, x b T C 4
         + V C 4 tied = 131072)\n  bubble 0.057 measured over 3 steps; pdp's ...
   The formula assumes micro-batches of equal rows and boundaries of equal per-sample floats
   (a GPT's); b is the first micro-batch's rows. examples/train_gpt_3d.c prints it for every
   rank beside its TP and DP traffic. */
PDP_API pdp_status pdp_pp_report(const pdp_pp *pp, char *buf, size_t bytes);
/* This rank's share of a DP x TP x PP step (a stage of a TP model, desc.dp for the copies)
   beside the formulas, into buf (NUL ended): its memory (the stage's parameters and
   gradients, 4 bytes a parameter, and o's state); the bytes it sent a step over each
   dimension, measured (averaged over the passes: every pass sends the same) beside the
   formulas, TP 2 (t - 1) / t x 2 m R b T C 4 (a ring all-reduce forward, g, and one
   backward, f, of each of the stage's R TP regions, a micro-batch's b T C floats each; FULL
   recomputation runs each g again: 3 m R), DP 2 (d - 1) / d x 4 bytes a parameter (the
   gradients' average: only the pipeline's own all-reduces are counted, not
   pdp_pp_create's broadcasts nor a caller's collectives on desc.dp); then pdp_pp_report's
   three lines, indented:
         memory, MB: parameters 0.31  gradients 0.31  AdamW state 0.62
         sent a step, bytes: TP 655360 (2(t-1)/t x 2 m R b T C 4 = 655360, R = 5 TP regions)
           DP 309120 (2(d-1)/d x 4 params = 309120)
         PP stage 0 of 2: layers 0..40, ...
   t is the TP group's size (1 without one), d desc.dp's (1 without), b the first
   micro-batch's rows, T C the floats f and g exchange a sample. o: the optimizer of
   pdp_pp_model(pp). PDP_ERR_INVALID for a NULL argument, another model's optimizer or when
   the lines do not fit; PDP_ERR_STATE before the first pass; PDP_ERR_UNSUPPORTED on a
   sequence-parallel stage (its collectives are pdp_gpt_tp_report's, for the whole model).
   Not collective. examples/train_gpt_3d.c prints it for every rank under its groups. */
PDP_API pdp_status pdp_pp_rank_report(const pdp_pp *pp, const pdp_optim *o, char *buf,
                                      size_t bytes);
