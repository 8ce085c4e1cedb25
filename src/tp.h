/* tp: tensor parallelism, Megatron-LM's MLP block (Shoeybi et al., "Megatron-LM:
   Training Multi-Billion Parameter Language Models Using Model Parallelism", 2019,
   section 3): one layer's matrices split across the ranks of a TP communicator.

   The block is five layers of the usual model, each a named, visible step:

       f       CopyToModelParallelRegion      forward: identity (the input is replicated)
                                              backward: all-reduce (sum) of the input gradient
       A       ColumnParallelLinear(H)        weight split by output features: rank r holds
                                              rows [lo_r, lo_r + n_r) of W1 [H, in] and of b1;
                                              output sharded: [B, n_r]
       act     ReLU, GELU (either form),      element-wise (the table's PDP__LAYER_ELEMENTWISE
               Tanh, Sigmoid or SiLU          kinds), on the shard
       B       RowParallelLinear(d)           weight split by input features: rank r holds
                                              columns [lo_r, lo_r + n_r) of W2 [d, H]; output
                                              x_r W2_r^T, a partial sum; the bias (whole on
                                              every rank) is added on TP rank 0 only, so once
       g       ReduceFromModelParallelRegion  forward: all-reduce (sum) of the partial sums
                                              backward: identity

   A GPT's attention block (pdp_gpt_create with desc.tp, gpt.h) is the same five steps
   with the attention in the middle: f, c_attn column-parallel in three parts (q, k and v
   each split by heads, so a rank holds the q, k and v of its heads), the attention of
   those heads (CausalSelfAttention on the shard: heads / N of them; its dropout keyed by
   the global head), attn.c_proj row-parallel over the heads' outputs, g. Samples may be
   [T, C]: the split Linears act on every position, as Linear does.

   Sequence parallelism (Korthikanti et al., "Reducing Activation Recomputation in Large
   Transformer Models", 2022; pdp_gpt_create's desc.sequence_parallel): between the blocks
   each rank holds T / N positions of every [T, C] sample, so the residual stream, the
   LayerNorms and the Dropouts keep N times fewer activations. Three collective kinds
   (Megatron-LM's functions) mark the region's edges:

       ScatterToSequenceParallelRegion        forward: this rank's positions of a replicated
                                              input (after the embedding)
                                              backward: all-gather of the sequence
       GatherFromSequenceParallelRegion       forward: all-gather of the sequence
                                              backward: reduce-scatter (f, before a block's
                                              ColumnParallelLinear), or this rank's positions
                                              of a replicated gradient (before the head)
       ReduceScatterToSequenceParallelRegion  forward: reduce-scatter of the partial sums
                                              (g, after a RowParallelLinear)
                                              backward: all-gather

   An all-reduce is a reduce-scatter then an all-gather, so the blocks move the bytes TP's
   f and g move (each rank sends (N-1)/N of the full tensor a collective). The layers
   between them (internal.h's tp_seq) key their Dropout masks by the global position,
   and a LayerNorm's weight and bias gradients, summed over a rank's positions only, are
   all-reduced over TP in its backward (one all-reduce of 2C floats a LayerNorm; Megatron
   sums them once a step) before the executors hear of them, so every rank steps the same
   values and clipping counts them once. Samples are [B, T, C] (batch first), so a
   collective's blocks, [N, B, T / N, C], are permuted in the workspace when B > 1.

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
   gradient over the ranks holding the same slice. ZeRO (pdp_zero_create on dp, stages
   1-3, with or without sequence parallelism) works the same way: each DP group shards
   its TP rank's block (zero.c, "Tensor parallelism").

   Same model on every rank: the first forward (f's, the first TP layer of every block)
   runs one check over the TP group, as DDP checks its parameters: every TP layer's
   place, kind and full widths, each attention's heads, and a hash of the tensors every
   TP rank holds whole (embeddings, LayerNorms, row-parallel biases: a rank seeded apart
   would train other ones) against TP rank 0's. A difference (ranks that built 8 and 12
   features, 4 and 2 heads) fails on every rank with PDP_ERR_INVALID naming the layer and
   both; it runs again at the next forward (and after TP layers are added).

   Gradient clipping: pdp_clip_grad_norm on a TP model is collective over the TP group.
   The full model's squared norm is every rank's slices plus the replicated tensors (the
   row-parallel bias, LayerNorm, any layer outside the blocks) added by TP rank 0 only,
   summed by one all-reduce of one float, so every rank scales by the same coefficient
   and the replicated tensors stay the same bits. DP x TP: call it after
   pdp_ddp_finish. Under ZeRO, pdp_zero_clip_grad_norm sums its shards over the DP group
   and then the TP group, counting the same way.

   Checkpoints: pdp_tp_checkpoint_save gathers the full tensors (and the optimizer's
   state) and writes one ordinary checkpoint, the file pdp_checkpoint_save writes for
   the single-device model (loadable by pdp_checkpoint_load on one device and by
   PyTorch); pdp_tp_checkpoint_load reads such a file into any TP layout. Both are
   collective over the TP communicator. pdp_checkpoint_save/load refuse a model with TP
   layers (PDP_ERR_STATE naming pdp_tp_checkpoint_save/load): its parameters are slices.
   DataParallel's thread replicas refuse it too (PDP_ERR_UNSUPPORTED). ZeRO over a TP
   model trains and clips (pdp_zero_clip_grad_norm counts the slices over TP); its
   checkpoints, both ZeRO's and these, are not built yet and fail with PDP_ERR_UNSUPPORTED.

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

   Random masks: a Dropout or an attention's dropout is keyed by its layer's place in the
   model without f and g, so a TP model draws the single-device model's masks (dropout
   after g, and attention dropout by global head, train as one device does).

   Limits: sequence parallelism is built for pdp_gpt_create's GPT (which runs split by
   heads, with or without it, on the CPU and on CUDA over NCCL: tests/test_cuda.c); the TP
   kinds run on the CPU and on CUDA (f and g are the communicator's all-reduce on the
   device's buffers); no Dropout inside an MLP block (its masks are
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
    int64_t bytes_sent;           /* by this rank, the ring figures: 2(N-1)/N x an all-reduce's
                                     payload, (N-1)/N x an all-gather's or reduce-scatter's */
    double allreduce_s;           /* time in all of them (synchronous: compute waits) */
    /* sequence parallelism (pdp_gpt_desc.sequence_parallel); a payload is the full
       tensor, batch x T x width x 4 bytes, as an all-reduce's */
    int64_t allgathers;           /* f forward, g backward, the gather before the head
                                     (forward) and the scatter after the embedding (backward) */
    int64_t reduce_scatters;      /* g forward, f backward */
    int64_t allgather_bytes;      /* their payloads */
    int64_t reduce_scatter_bytes;
    int64_t grad_allreduces;      /* the sums of the sequence slices' gradients of the
                                     replicated parameters (each LayerNorm's, in backward) */
    int64_t grad_bytes;           /* their payload: the LayerNorms' weights and biases, x 4 */
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
