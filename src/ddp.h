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
   every rank holds bit-identical parameters. Dropout too: rank r's masks are keyed
   by its samples' places in the global batch (r x its batch on, the order a
   DistributedSampler gives), so they are one device's masks and no two ranks draw
   the same (ZeRO's forward does the same). A GPT's labels are one a position: its
   loss is then the mean over this rank's labels that count (-1 ignored), and the
   average of the ranks' means is the batch's when every rank holds as many.

   Uneven shards (batch_mean). Each rank's loss is the mean over its own n_r
   samples and the all-reduce averages over the N ranks, so by default
   (PDP_BATCH_MEAN_RANKS) the gradients are those of the mean of per-rank means,
   (1/N) sum_r (1/n_r) sum_{i in r} grad l_i. That is the mean over the global
   batch T = sum_r n_r only when every n_r is T/N (even shards); with shards of
   5, 3 and 2 samples a sample of the 2-sample rank weighs 2.5x one of the
   5-sample rank. PyTorch's DistributedDataParallel does exactly this (it
   averages gradients; DistributedSampler pads or drops to keep shards even).
   PDP_BATCH_MEAN_GLOBAL gives the mean over the global batch instead,
   (1/T) sum_i grad l_i, as one device trained on the concatenated shards: each
   backward all-reduces the ranks' batch sizes (one float: 2 (N-1)/N x 4 bytes,
   counted in bytes_sent) and weighs rank r's loss gradient by N n_r / T before
   backward, so the average over ranks is the global-batch mean (what torchtitan
   and Hugging Face's Trainer do by hand with an all-reduce of token counts). With
   the built-in cross-entropy n_r counts the labels that count, as its mean does
   (a GPT's positions whose label is not -1; all ignored: no gradient); an own
   loss's backward counts samples. Dropout's masks are keyed by r x n_r as above,
   one device's only when the shards are even. The
   trade-off: one more small collective per backward, whose latency
   pdp_ddp_forward_backward hides behind the forward and pdp_ddp_backward (own
   loss) waits for; in return no caller has to know the other ranks' batch
   sizes (the last, short batch of an epoch, filtered samples). Under it the
   backward must go through pdp_ddp_forward_backward or pdp_ddp_backward (a
   pdp_model_backward on the wrapped model fails with PDP_ERR_STATE saying so),
   *loss stays this rank's mean, and with accumulation each backward is weighted
   by its own global batch: k backward passes sum k global-batch means, as k
   backward passes on one device. Every rank must pass the same batch_mean
   (checked by pdp_ddp_create: PDP_ERR_INVALID naming both values). In bf16 precision
   the loss gradient is rounded to bf16 in backward after its rank's scaling and the
   average divides by N after: at N not a power of two the result is one device's
   within bf16's rounding, not fp32's (manual, PRECISION), as PyTorch's under autocast.

   Gradient accumulation (no_sync): while no_sync is on, backward only adds to
   the local gradients (under PDP_BATCH_MEAN_GLOBAL it still all-reduces the
   batch sizes); the next backward with no_sync off all-reduces the
   accumulated sums. As in PyTorch, k accumulated backward passes of mean losses
   give the sum of k mean gradients: the same as k backward passes on a single
   device. For the mean (PyTorch's (loss / k).backward(), nanoGPT's), pdp_trainer's
   desc.accum_steps = k, or your own loss's dy scaled by 1/k (pdp_ddp_forward, then
   pdp_ddp_backward). A learning rate / k is no substitute: Adam and AdamW hardly see the
   gradients' scale (eps aside), so it would step k times shorter and decay less, and a
   clip of the sum at max_norm is the mean's at max_norm / k.

   Faults never hang: a rank that stops issuing collectives makes the others
   fail with PDP_ERR_TIMEOUT within the communicator's timeout, naming the
   bucket, the collective and the missing rank; a rank that fails and frees its
   communicator makes the others fail at once.

   Any loss: every backward of the wrapped model synchronises, however its
   output gradient was computed. pdp_ddp_forward_backward is the built-in
   cross-entropy; for an own loss run pdp_ddp_forward (or pdp_model_forward),
   compute the loss and its gradient dy with respect to the output (the mean
   over this rank's samples, as the built-in losses do, so that the average
   over ranks is the mean of the ranks' means, or under PDP_BATCH_MEAN_GLOBAL
   the global batch's), then pdp_ddp_backward(ddp, dy) (or
   pdp_model_backward): the buckets are reduced the same way. A second backward
   before pdp_ddp_step/pdp_ddp_finish fails with PDP_ERR_STATE saying so.

   Typical step (each rank, on its own thread or process):
       pdp_ddp_forward_backward(ddp, x_shard, labels_shard, &loss);
       pdp_ddp_step(ddp, opt);          wait for the buckets, update, zero grads
   or, with an own loss:
       pdp_ddp_forward(ddp, x_shard, &y);  my_loss(y, target, &loss, &dy);
       pdp_ddp_backward(ddp, &dy);  pdp_ddp_step(ddp, opt); */

typedef struct pdp_ddp pdp_ddp;

/* Which mean of the loss a step's averaged gradients are (DDP and ZeRO; above). */
typedef enum pdp_batch_mean {
    PDP_BATCH_MEAN_RANKS = 0,  /* the mean over ranks of each rank's batch mean: PyTorch
                                  DDP's; the global-batch mean when the shards are even */
    PDP_BATCH_MEAN_GLOBAL = 1  /* the mean over the global batch, whatever the shards:
                                  one all-reduce of the batch sizes per backward */
} pdp_batch_mean;

/* Sizes: 0 (default) or finite MiB in (0, 1e12]; anything else fails with
   PDP_ERR_INVALID naming the field and the value (the rule pdp_zero_desc shares). */
typedef struct pdp_ddp_desc {
    double bucket_cap_mb;    /* bucket capacity in MiB (2^20 bytes); default 25 */
    double first_bucket_mb;  /* capacity of the first bucket in MiB (the last layers'
                                gradients, ready first); default min(1, bucket_cap_mb) */
    pdp_batch_mean batch_mean; /* default PDP_BATCH_MEAN_RANKS (PyTorch's); the same on
                                  every rank */
} pdp_ddp_desc;

/* Wraps m (which stays owned by the caller and must outlive ddp; adding layers to it
   fails until pdp_ddp_free, and so does a second executor on it: model.h, "Wrapped
   models") and c (the same). Collective: every rank of c must call it. A rank that
   fails before the collectives (a desc field out of range, no memory) makes every
   rank fail at once: the others with PDP_ERR_COMM naming it. Checks
   that every rank has the same parameter names and shapes (a mismatch fails on
   every rank with PDP_ERR_INVALID naming the first differing parameter), then
   copies rank 0's parameters to every rank, zeroes the gradients and installs
   the gradient hook on m. PDP_TRACE=out.json traces the ranks (see trace). */
PDP_API pdp_status pdp_ddp_create(pdp_ddp **out, pdp_model *m, pdp_comm *c,
                                  const pdp_ddp_desc *desc);
/* Waits for buckets still in flight, removes the hook. NULL is fine. */
PDP_API void pdp_ddp_free(pdp_ddp *ddp);
/* The desc in use, defaults filled in (sokol's query-defaults): bucket_cap_mb and
   first_bucket_mb in MiB. A zero desc for NULL. */
PDP_API pdp_ddp_desc pdp_ddp_get_desc(const pdp_ddp *ddp);

/* Forward, softmax cross-entropy (mean over this rank's batch: *loss) and backward on
   this rank's shard (under PDP_BATCH_MEAN_GLOBAL its gradient weighted by N n_r / T,
   the batch sizes all-reduced during the forward); buckets are all-reduced as their
   gradients become ready.
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
   backward ran under no_sync. OK and nothing to do when nothing is pending. Until it
   has run (or pdp_ddp_step) after a synchronised backward, pdp_clip_grad_norm and
   pdp_optim_step on the model fail with PDP_ERR_STATE naming it: the collectives are
   still writing the gradients (PyTorch's backward returns them reduced; here clip between
   pdp_ddp_finish and pdp_ddp_step). */
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

   Built-ins (after PyTorch's bf16_compress_hook and fp16_compress_hook):
   pdp_ddp_hook_bf16_compress() and pdp_ddp_hook_fp16_compress(). launch divides
   every gradient by N in fp32 and rounds the quotient to bf16 / fp16 (nearest
   even, once) in the bucket's scratch (a kernel on a CUDA model), then sums the
   16-bit values (pdp_comm_allreduce_ex / pdp_comm_reduce_scatter_ex, SUM: the
   division comes before the sum, as in PyTorch's hooks, so the sum stays in range;
   PyTorch 1.13's round to 16 bits first and divide in 16 bits, so about a third of
   the elements differ from pdp's in the last bit, within the bound below);
   finish widens the result into the fp32 gradients. bytes_sent is exactly half
   the fp32 figure. Error per gradient element, with u the unit roundoff (bf16
   2^-8, fp16 2^-11) and g_r rank r's gradient: |avg' - avg| <= u (2 + u)
   sum_r |g_r| / N on the local backend (one rounding per input, one for the
   sum), plus, for fp16, 2^-25 (N + 1) from subnormals; on MPI and NCCL the sum
   rounds N - 1 times (comm.h), so the factor 2 becomes N. fp16 overflows to Inf
   when the average over the ranks exceeds 65504 (a rank's own gradient up to
   65504 x N is held, where PyTorch's overflows above 65504; no loss scaling here):
   prefer bf16. */

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
                                  of it with a 16-bit compression hook), plus under
                                  PDP_BATCH_MEAN_GLOBAL the batch sizes' all-reduce of every
                                  backward since the last step, 2(N-1)/N x 4 each */
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
    bool drop_last;        /* default false: pad by repeating indices. With fewer samples
                              than ranks it would leave every rank none: refused
                              (PDP_ERR_INVALID), where torch's sampler gives each rank an
                              empty epoch */
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
