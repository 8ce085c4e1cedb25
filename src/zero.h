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
