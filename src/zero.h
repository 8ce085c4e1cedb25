/* zero: sharded data parallelism, ZeRO stages 1, 2 and 3 (DeepSpeed's ZeRO,
   PyTorch's ZeroRedundancyOptimizer and FSDP FULL_SHARD), with DDP's step shape.

   Each rank trains on its shard of the global batch, as in DDP, but holds only a
   1/N part of what DDP replicates:
     stage 1 (P_os)         optimizer state (Adam's m and v, SGD's momentum);
     stage 2 (P_os+g)       and the reduced gradients;
     stage 3 (P_os+g+p)     and the parameters.
   After k steps the parameters are those of DDP and of one device on the
   global batch (to float rounding; on uneven shards see "Uneven shards"
   below), at DDP's communication volume (stages 1-2:
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
   Memory per rank, pdp's fp32 forms: the ZeRO paper's breakdown with 4-byte
   parameters and gradients and K bytes of optimizer state per parameter (4 x
   state floats: Adam K = 8, SGD with momentum 4, plain SGD 0): DDP (8 + K) Psi;
   stage 1 8 Psi + K Psi/N; stage 2 4 Psi + (4 + K) Psi/N; stage 3 (8 + K) Psi/N.
   With Adam: DDP 16 Psi; stage 1 8 Psi + 8 Psi/N; stage 2 4 Psi + 12 Psi/N;
   stage 3 16 Psi/N. Plus the working buffers this implementation states: stage 1
   one staging buffer, stage 2 staging + grad_buffers, stage 3 grad_buffers +
   param_buffers, each 4 N s_max bytes; with few parameters they can outweigh
   what the shards save, so a small model may hold more at stages 2-3 than at
   stage 1 or under DDP.
   The paper's own forms (Rajbhandari et al., "ZeRO: Memory Optimizations Toward
   Training Trillion Parameter Models", SC 2020) are for mixed-precision Adam:
   2-byte parameters and gradients and K = 12 (fp32 master weights, m and v):
   DDP 16 Psi; stage 1 4 Psi + 12 Psi/N; stage 2 2 Psi + 14 Psi/N; stage 3
   16 Psi/N. pdp has no master copy (its parameters are fp32), so only DDP's and
   stage 3's totals coincide. pdp_zero_memory reports the measured figures beside
   pdp's forms (with Psi_pad where padding applies) and every stage's plan and both
   forms; pdp_zero_memory_format prints it (examples/train_zero.c).

   Communication per rank per step (bytes counted by the communicator), with
   V = (N-1)/N x 4 Psi_pad (one reduce-scatter or one all-gather of every unit)
   and k backward passes per step (k - 1 micro-steps under no_sync, then one
   synchronised; k = 1 without accumulation):
     stage 1: 2 V, whatever k: the micro-steps accumulate in the full gradient
              buffers without communicating (as DDP), the last backward
              reduce-scatters, the step all-gathers = DDP's all-reduce volume;
     stage 2: (k + 1) V: stages 2 and 3 hold no full gradient, so every backward
              reduce-scatters and adds its slice to the shard (DeepSpeed's
              behaviour: the same sums, k times the gradient traffic), and the
              step all-gathers once;
     stage 3: 3k V - (k - 1) V_kept: every backward gathers every unit and
              reduce-scatters it (2k V), the first forward after a step gathers
              every unit (V), and each later forward gathers all but the units
              the backward before it left gathered ((k - 1) (V - V_kept)): the
              last param_buffers units of backward (the first of forward),
              V_kept = (N-1)/N x 4 x their padded floats (all of Psi_pad when
              there are no more units than param_buffers: then (2k + 1) V).
              k = 1: 3 V, 1.5x DDP. A tied head (below) with more units than
              param_buffers adds 2k (N-1)/N x 4 Psi_T (its unit gathered again
              for the head in forward and in backward).
   With batch_mean PDP_BATCH_MEAN_GLOBAL each backward adds its one-float
   all-reduce of the batch sizes (2 (N-1)/N x 4 bytes, rounded down, per pass).
   pdp_zero_get_stats gives k, the bytes sent and this formula (its value and its
   words) for the last step. Not in the formula: clipping's scalar all-reduce, an
   evaluation forward between steps (stage 3 gathers) and pdp_zero_gather_params.

   Uneven shards: as DDP (ddp.h, "Uneven shards"), each rank's loss is the mean
   over its own batch and the reduce-scatter averages over ranks, so a step
   trains the mean of per-rank means, which is the global batch's mean only
   when the shards are even (PyTorch DDP and ZeroRedundancyOptimizer do the
   same). desc.batch_mean = PDP_BATCH_MEAN_GLOBAL trains the mean over the
   global batch: every backward all-reduces the batch sizes (one float, in
   bytes_sent and in the formula) and weighs this rank's loss gradient by
   N n_r / T (n_r: the labels that count, as in ddp.h), so every stage equals one
   device on the concatenated shards, accumulation included (each backward
   weighted by its own global batch); with dropout, when the shards are even.

   Tied parameters (a GPT's head, pdp_model_add_tied_linear, uses the Embedding's
   transformer.wte.weight): the parameter lies in its owner's unit, T, and the head
   computes with that unit. Stage 3 gathers T for the head's forward and its backward
   as for a layer of T (when more units than param_buffers have pushed T out of its
   slot since its own layers ran, that is a gather more each: Psi_T above). Backward
   meets the head first and the embedding last: at every stage the head's gradient
   and the embedding rows' are summed in T's one gradient buffer, and T's one
   reduce-scatter starts only after the embedding's backward (the parameter reports
   its gradient after its own layer only), as DDP's bucket of it starts once, then.
   At stages 2-3 T keeps its buffer through the backward, so T has one of its own
   (the last) and the other units share the rest: grad_buffers must be 2 or more when
   there are 2 units or more (the default is).

   Every backward of the wrapped model synchronises, whatever the loss
   (pdp_zero_forward_backward, or pdp_zero_forward + own loss +
   pdp_zero_backward, or pdp_model_forward/pdp_model_backward on the model;
   under PDP_BATCH_MEAN_GLOBAL only the first two, which apply the weight).

   The wrapped model (model.h, "Wrapped models"): layers cannot be added (the units
   are planned on its layout) and no other executor can take it, until pdp_zero_free.
   Its views show what this rank holds, each with its range (pdp_param's value_lo..hi,
   grad_lo..hi: a parameter lies in one unit, so this rank's part of it is one
   contiguous range of its row-major elements, possibly empty):
     pdp_model_param  grad: this rank's part of the reduced gradient at every stage
                      (the average over ranks after pdp_zero_finish; at stage 1 the
                      local sums before it); value: the whole parameter at stages 1-2
                      (every rank's full copy, all-gathered after each step), this
                      rank's part at stage 3 (the shard the optimizer updates);
     pdp_model_flat   the full parameter block at stages 1-2; the gradients (every
                      stage) and the parameters at stage 3 are not one block on this
                      rank: PDP_ERR_STATE naming pdp_model_param and
                      pdp_zero_gather_params (the full values, collective);
     pdp_checkpoint_load  PDP_ERR_STATE at every stage (the shards train): use
                      pdp_zero_checkpoint_load_full or pdp_zero_checkpoint_load;
     pdp_checkpoint_save  the full parameters at stages 1-2 (without the optimizer:
                      a shard optimizer is refused); PDP_ERR_STATE at stage 3 unless
                      pdp_zero_gather_params(z, NULL) put them in the model's block
                      (until the next step): use pdp_zero_checkpoint_consolidate or
                      pdp_zero_checkpoint_save.
   The whole gradient norm: pdp_zero_clip_grad_norm. Faults never hang: a missing
   rank makes the reduce-scatter (named with its unit) or the all-gather fail with
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

/* The bucket options follow one rule with pdp_ddp_desc's (checked before anything is
   allocated or sent; a bad value fails with PDP_ERR_INVALID naming the field and the
   value): the sizes are 0 (default) or finite MiB in (0, 1e12]; the buffer counts are 0
   (default) or at most U, the number of units the sizes give this model
   (pdp_zero_num_units): unit u takes gradient buffer u mod grad_buffers, so more could
   never be used (param_buffers may be 2 with one unit). */
typedef struct pdp_zero_desc {
    int stage;               /* 1, 2 or 3; default 1 */
    double bucket_cap_mb;    /* unit size in MiB; default 25 */
    double first_bucket_mb;  /* the first unit (the last layers); default min(1, cap) */
    int grad_buffers;        /* stages 2-3: gradient bucket buffers, 1..U; default
                                min(2, U); a tied head's unit holds one through the
                                backward, so then 2..U (PDP_ERR_INVALID naming the
                                layer otherwise) */
    int param_buffers;       /* stage 3: gathered parameter buffers, 2..max(2, U);
                                default 2 */
    bool no_prefetch;        /* stage 3: gather each unit only when it is needed (for
                                measuring what prefetch gains); default false */
    pdp_batch_mean batch_mean; /* uneven shards (ddp.h): default PDP_BATCH_MEAN_RANKS, the
                                  mean of per-rank means (PyTorch's); PDP_BATCH_MEAN_GLOBAL
                                  the global batch's. The same on every rank */
} pdp_zero_desc;

/* Wraps m and c as pdp_ddp_create does (collective; same checks; rank 0's
   parameters everywhere), then shards: frees the model's gradient block (and at
   stage 3 its parameter block) and points its layers at ZeRO's buffers. A rank that
   fails alone (a desc field out of range, no memory for its shards and buffers or
   before) makes every rank fail: the others with PDP_ERR_COMM naming it. A failed
   create leaves each model whole (with rank 0's parameters once their broadcast has
   run), except at stage 3 when the failure came after the shards (the buffers): each
   model then holds its slices only, as after pdp_zero_free (the block is freed before
   the buffers are allocated, which keeps the peak of creation under DDP's). */
PDP_API pdp_status pdp_zero_create(pdp_zero **out, pdp_model *m, pdp_comm *c,
                                   const pdp_zero_desc *desc);
/* Waits for collectives in flight and gives the model back its gradient block
   (zeroed) and, at stage 3, a parameter block holding this rank's slices only
   (call pdp_zero_gather_params(z, NULL) first for the full values); the model is the
   caller's again (layers may be added; pdp_model_param views taken while wrapped are
   stale). Not collective. NULL is fine. A stage-3 model of 2 or more ranks freed without
   that gather is marked as holding slices: its forward (so pdp_gpt_generate and
   pdp_gpt_evaluate), pdp_checkpoint_save, pdp_tp_checkpoint_save and a new executor fail
   with PDP_ERR_STATE naming the rank and the calls to make, until pdp_checkpoint_load (or
   pdp_tp_checkpoint_load) fills every parameter. */
PDP_API void pdp_zero_free(pdp_zero *z);
/* The desc in use, defaults filled in (sokol's query-defaults): grad_buffers cut to the
   units there are (0 at stage 1), param_buffers 0 below stage 3. A zero desc for NULL. */
PDP_API pdp_zero_desc pdp_zero_get_desc(const pdp_zero *z);
/* An optimizer whose state covers this rank's shard only; pdp_zero_step steps it
   (pdp_optim_step refuses it). Free it with pdp_optim_free. Collective: every rank calls
   it, with the same desc (kind, decay_params and hyper-parameters compared; a rank whose
   desc differs fails with PDP_ERR_INVALID naming the field, its peers with PDP_ERR_COMM). */
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
   coefficient (torch.nn.utils.clip_grad_norm_'s). Collective. max_norm as
   pdp_clip_grad_norm's (finite and >= 0, else PDP_ERR_INVALID). On a TP model (ZeRO
   over the DP group of a DP x TP world) it is collective over the TP group as well:
   slices count on every TP rank and replicated tensors once, so the norm is the full
   model's (tp.h). */
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
   complete, as in llm.c). The marker holds the world size, stage, step, unit
   plan and the save's run id: 64 bits rank 0 draws at each save and sends to
   every rank, written into every shard file too ("shard.run"), so the files of
   two saves at the same step and world size are told apart. Load validates the
   marker against this run (world size, parameter count, units) and every rank's
   file (range, run id, step, tensors, checksums) into staging buffers; only when
   every rank succeeded is anything copied, so a bad set (a file of another save
   among them: PDP_ERR_FORMAT naming the file and both run ids) fails on every
   rank with a message naming the marker or the bad file, the parameters and
   optimizer untouched. A rank that stalls, exits or is killed during save, load
   or consolidate makes the others fail with the communicator's status
   (PDP_ERR_TIMEOUT naming the ranks that did not arrive; PDP_ERR_COMM for a
   local rank that freed its communicator) after the call's name and what it was
   agreeing on; such a save leaves no marker unless every shard file was written
   (then its marker marks a complete set). Save removes the temporaries that
   writers killed mid-save left ("<file>.tmp.<pid>" of the shard files and the
   marker, whose pid is no live process). Resume at the same world size is
   bit-exact; the stage may differ (the layout is the same). Every save overwrites
   the set of its prefix (put the step in the prefix to keep several). */
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

/* One stage's bytes per rank for a model, N and optimizer: what pdp_zero_create would
   allocate (stage 0: DDP's replica, parameters, gradients and optimizer state; its
   buckets are not counted), and both formulas for the same Psi and N. */
typedef struct pdp_zero_memory_stage {
    int64_t param_bytes, grad_bytes, optim_bytes, buffer_bytes, total_bytes;
    int buffers;             /* working buffers, each 4 unit_max bytes: 0, 1, 1 + grad_buffers,
                                grad_buffers + param_buffers */
    double fp32_bytes;       /* pdp's fp32 form, K = 4 x state_per_param: DDP (8 + K) Psi;
                                8 Psi + K Psi/N; 4 Psi + (4 + K) Psi/N; (8 + K) Psi/N */
    double paper_bytes;      /* the paper's mixed precision, K = 4 + 4 x state_per_param
                                (fp32 master weights; Adam 12): (4 + K) Psi; 4 Psi + K Psi/N;
                                2 Psi + (2 + K) Psi/N; (4 + K) Psi/N */
} pdp_zero_memory_stage;

typedef struct pdp_zero_memory {
    int stage;               /* the stage the bytes below are for; 0: DDP (planned only) */
    int world_size;          /* N */
    bool measured;           /* the bytes below are what this rank holds (pdp_zero_get_memory);
                                false: planned (pdp_zero_memory_plan) */
    int64_t param_count;     /* Psi */
    int64_t padded_count;    /* Psi_pad = sum over units of N s_u */
    int64_t shard_count;     /* Psi_pad / N: this rank's slices */
    int state_per_param;     /* optimizer state floats per parameter (Adam 2, momentum 1) */
    /* this stage's bytes on this rank: measured or planned (above) */
    int64_t param_bytes, grad_bytes, optim_bytes;
    int64_t buffer_bytes;    /* working buffers (staging, bucket and gather buffers) */
    int64_t total_bytes;
    /* pdp's fp32 form of the ZeRO paper's formula for this stage with Psi (DDP's
       beside it; the paper's mixed-precision forms differ, see above), and the
       stated bound on buffer_bytes */
    double formula_bytes, ddp_bytes;
    int64_t buffer_bound;
    int64_t unit_max;        /* U_max: the largest unit's padded floats, N s_max */
    pdp_zero_memory_stage stages[4]; /* every stage, 0 (DDP) to 3, planned */
} pdp_zero_memory;

/* What this rank holds (measured: the buffers' sizes as allocated) beside the plan of every
   stage. opt may be NULL (no optimizer state counted). PDP_ERR_INVALID naming the call for
   a NULL z or out, or an opt that is not z's shard optimizer. */
PDP_API pdp_status pdp_zero_get_memory(const pdp_zero *z, const pdp_optim *opt,
                                       pdp_zero_memory *out);
/* The same report before (or without) sharding: what stage (0: DDP, 1-3) would hold on each
   of world_size ranks for m with desc's units and buffers (NULL: the defaults) and opt's
   state (NULL: none; an optimizer of m, or a shard optimizer of a model with m's layout).
   Not collective; m is read only. PDP_ERR_INVALID naming the call and the argument for a
   NULL m or out, world_size < 1, a stage outside 0..3 or a bad desc. */
PDP_API pdp_status pdp_zero_memory_plan(const pdp_model *m, int world_size, int stage,
                                        const pdp_zero_desc *desc, const pdp_optim *opt,
                                        pdp_zero_memory *out);
/* The report as a table a person reads: per stage, pdp's fp32 formula, the paper's and the
   buffers; this rank's bytes against DDP's, and why ZeRO saves memory or does not at this
   size (sharding a float of every parameter saves (1 - 1/N) x 4 Psi bytes, each buffer
   costs 4 U_max) with the N from which each stage saves this model's memory. Returns the length
   snprintf would have written. */
PDP_API int pdp_zero_memory_format(const pdp_zero_memory *m, char *buf, size_t bytes);

typedef struct pdp_zero_stats {
    int64_t steps;             /* synchronised backward passes finished */
    int64_t units;
    int64_t bytes_sent;        /* the last step, by this rank: every collective since the step
                                  before (its k micro-steps' backward passes, this step) */
    int64_t micro_steps;       /* k: backward passes in the last step (k - 1 under no_sync) */
    int64_t formula_bytes;     /* what the last step should send, from k (the formula above);
                                  equal to bytes_sent unless clipping (its all-reduced scalar),
                                  an evaluation forward or pdp_zero_gather_params ran between
                                  steps */
    char formula[256];         /* that formula in words, with k and N substituted */
    int64_t gathers;           /* all-gathers of the last step */
    double backward_s, reduce_s, wait_s;
    int64_t total_bytes_sent;
} pdp_zero_stats;

PDP_API void pdp_zero_get_stats(const pdp_zero *z, pdp_zero_stats *out);
