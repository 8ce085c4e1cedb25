/* trainer: one training loop for every data-parallel strategy. The strategy is a value
   (single, DP, DDP, ZeRO 1-3): pdp_trainer_create builds its executor and the optimizer
   that goes with it, and the step is the same three calls whichever it is, as in PyTorch,
   where wrapping the model changes what backward and the optimizer do but not the loop:

       pdp_trainer_forward_backward(t, &x, y, &loss);  loss.backward()
       pdp_trainer_clip_grad_norm(t, 1.0f, NULL);      clip_grad_norm_(model.parameters(), 1)
       pdp_trainer_step(t);                            opt.step(); opt.zero_grad()

   It is the one place that knows how the executors compose, each call dispatching as

       strategy  create             forward_backward  clip                     step
       single    pdp_optim_create   pdp_model_...     pdp_clip_grad_norm       pdp_optim_step +
       dp        pdp_dp_create      pdp_dp_...        pdp_clip_grad_norm       pdp_optim_zero_grad
       ddp       pdp_ddp_create     pdp_ddp_...       pdp_ddp_finish +         pdp_ddp_step
                                                      pdp_clip_grad_norm
       zero1-3   pdp_zero_create +  pdp_zero_...      pdp_zero_finish +        pdp_zero_step
                 _zero_optim_create                   pdp_zero_clip_grad_norm

   and adds nothing to them but gradient accumulation's average (desc.accum_steps): the same
   bits as the direct calls, no allocation in a step, every failure the executor's status and
   message. (DP steps on the master's thread:
   pdp_dp_step's step by the workers, each on the slice it reduced, leaves no place for
   clipping between; the bits are the same.) x is what the executor takes: the
   global batch under single and DP (DP splits it over its workers), this rank's slice of
   it under DDP and ZeRO (every rank calls every function with its slice: they are
   collective over desc.comm). A model split by tensor parallelism (its own communicator,
   tp.h) trains under single, DDP and ZeRO (DP refuses it); clipping is then collective
   over its TP group too. Executors and strategies are explained in dp.h, ddp.h, zero.h;
   examples/train_gpt.c picks one with -strategy. */

typedef enum pdp_strategy {
    PDP_STRATEGY_SINGLE = 0, /* the model alone, on its device */
    PDP_STRATEGY_DP = 1,     /* DataParallel (dp.h): worker threads of this process */
    PDP_STRATEGY_DDP = 2,    /* DistributedDataParallel (ddp.h) over desc.comm */
    PDP_STRATEGY_ZERO1 = 3,  /* ZeRO (zero.h) over desc.comm: the optimizer state sharded, */
    PDP_STRATEGY_ZERO2 = 4,  /* and the gradients, */
    PDP_STRATEGY_ZERO3 = 5   /* and the parameters */
} pdp_strategy;

/* "single", "dp", "ddp", "zero1", "zero2", "zero3" (a program's -strategy values), or
   "unknown". */
PDP_API const char *pdp_strategy_name(pdp_strategy s);
/* The strategy named as pdp_strategy_name names it, into *out; any other name (or NULL)
   fails with PDP_ERR_INVALID naming it and the six. */
PDP_API pdp_status pdp_strategy_from_name(const char *name, pdp_strategy *out);

typedef struct pdp_trainer pdp_trainer;

/* Zero means default, field by field; each executor's desc is read under its strategy only
   and checked by its create (the messages name that call). */
typedef struct pdp_trainer_desc {
    pdp_strategy strategy;  /* default single; another value is PDP_ERR_INVALID */
    pdp_comm *comm;         /* DDP and ZeRO: the data-parallel communicator, required (under
                               DP x TP: the DP group); single and DP: NULL (DP's workers are
                               threads of this process: PDP_ERR_INVALID otherwise) */
    pdp_optim_desc optim;   /* the optimizer (optim.h; all zero: SGD, lr 0.01) */
    pdp_dp_desc dp;         /* DP: workers (0: one per core) and devices (NULL: the CPU; for
                               a model on GPU g, GPUs g, g + 1, ..., one a worker, when
                               num_workers is given: 0 there is pdp_dp_create's error) */
    pdp_ddp_desc ddp;       /* DDP: bucket sizes */
    pdp_zero_desc zero;     /* ZeRO: units and buffers; stage 0 (the strategy's) or the
                               strategy's own, any other PDP_ERR_INVALID */
    int accum_steps;        /* gradient accumulation: k pdp_trainer_forward_backward calls a
                               step, their gradients averaged (below); 0 or 1: none; the
                               same on every rank; negative: PDP_ERR_INVALID */
} pdp_trainer_desc;

/* Wraps m (which stays the caller's and must outlive t) in desc's executor and creates the
   optimizer (pdp_optim_create on m, pdp_zero_optim_create under ZeRO). Collective over
   desc.comm under DDP and ZeRO (rank 0's parameters everywhere). A field out of range fails
   with PDP_ERR_INVALID naming it; an executor's failure keeps its status, its message after
   "pdp_trainer_create (strategy S): ". Under DDP and ZeRO the ranks then agree: when the
   optimizer or the executor failed on some ranks only, the others fail too, with
   PDP_ERR_COMM naming a rank that failed; an optimizer desc that differs across the ranks
   (kind, lr, betas, ...: each replica or shard would step by another rule) is
   PDP_ERR_INVALID on every rank. desc may be NULL (single, SGD). */
PDP_API pdp_status pdp_trainer_create(pdp_trainer **out, pdp_model *m,
                                      const pdp_trainer_desc *desc);
/* Frees the optimizer and the executor: the model is the caller's again (layers may be
   added), whole but at ZeRO-3, where it keeps this rank's slices unless
   pdp_trainer_gather_params ran (zero.h: pdp_zero_free; such a model's forward, generation
   and saves then fail with PDP_ERR_STATE saying so). Not collective. NULL is fine. */
PDP_API void pdp_trainer_free(pdp_trainer *t);
/* The desc in use, defaults filled in (sokol's query-defaults): the optimizer's and the
   strategy's executor's resolved descs (pdp_optim_get_desc, pdp_dp_get_desc, ...), the other
   executors' zeroed; zero.stage the strategy's. A zero desc for NULL. */
PDP_API pdp_trainer_desc pdp_trainer_get_desc(const pdp_trainer *t);

/* Forward, the cross-entropy against labels (as pdp_model_forward_backward's: a label a
   sample, or a position of a GPT's), backward. Single and DP: the gradients accumulate (+=)
   over calls until pdp_trainer_step. DDP and ZeRO: the reduction over the ranks starts during
   backward, one call a step (to accumulate, pdp_ddp_set_no_sync(pdp_trainer_ddp(t), true) or
   pdp_zero_set_no_sync for the calls before the last). *loss (may be NULL): the mean over
   x's labels, which under DDP and ZeRO is this rank's slice's. Another loss (a target
   tensor, a loss of your own): under DDP and ZeRO the executor's forward and backward on
   pdp_trainer_ddp(t) or pdp_trainer_zero(t) (pdp_ddp_forward, then pdp_ddp_backward with
   your dy), under single pdp_model_forward and pdp_model_backward, then
   pdp_trainer_clip_grad_norm and pdp_trainer_step as here (DP takes labels only).
   With desc.accum_steps k > 1 a step is k calls, each on a micro-batch: the gradients are
   the mean of the k backward passes (their sum times 1/k, applied once the reduction is
   done), which is PyTorch's (loss / k).backward() and nanoGPT's gradient_accumulation_steps
   up to rounding, clipping included; DDP and ZeRO reduce once, during the k-th backward
   (the trainer sets no_sync: leave it alone). A k + 1-th call before the step, and a clip
   or step after fewer than k calls, are PDP_ERR_STATE naming the count. It counts these
   calls only: with a loss of your own (above), leave it 0 and scale your dy by 1/k. Without it, the
   calls of a step (single and DP; DDP and ZeRO under no_sync) add their gradients: the sum,
   as plain backward passes in PyTorch (Adam's step hardly sees the scale, clipping does). */
PDP_API pdp_status pdp_trainer_forward_backward(pdp_trainer *t, const pdp_tensor *x,
                                                const int32_t *labels, float *loss);
/* Waits for the gradients' reduction (DDP, ZeRO), then scales them so that the whole
   model's L2 norm is at most max_norm (torch.nn.utils.clip_grad_norm_; under ZeRO from the
   shards); *total_norm (may be NULL) gets the norm before clipping, the same on every rank.
   Between pdp_trainer_forward_backward and pdp_trainer_step, or not at all. */
PDP_API pdp_status pdp_trainer_clip_grad_norm(pdp_trainer *t, float max_norm, float *total_norm);
/* Waits for the gradients' reduction (if clipping has not), updates the parameters (under
   ZeRO this rank's shard, then at stages 1-2 the all-gather of the updated parameters) and
   zeroes the gradients. */
PDP_API pdp_status pdp_trainer_step(pdp_trainer *t);

/* This rank's memory as zero.h's report (pdp_zero_memory: measured, or planned, beside the
   formulas; opt's state counted): ZeRO's measured (pdp_zero_get_memory); single's and DDP's
   planned as stage 0, a whole replica (pdp_zero_memory_plan at N = 1, or desc.comm's size,
   the other stages with desc.zero's units); DP's the master's as stage 0 at N = 1
   (pdp_dp_get_stats(pdp_trainer_dp(t)) has the master's and the replicas' peaks, activations
   and gathered outputs included). PDP_ERR_INVALID for a NULL t or out. */
PDP_API pdp_status pdp_trainer_get_memory(const pdp_trainer *t, pdp_zero_memory *out);
/* This rank's memory in a step, as a person reads it, into buf (NUL ended): under single,
   DDP and ZeRO pdp_trainer_get_memory's parameters, gradients and optimizer state beside
   ZeRO's formulas, then the model's activations at batch sequences (this rank's: its slice
   of the global batch), the buffers and the sum, as pdp_gpt_memory_report writes them (any
   model, a GPT's or not); under DP, whose workers are threads of this rank, the master's
   peak and the largest other worker's (pdp_dp_stats, measured: after a step; batch is
   then unused), two lines:
       DP, 2 workers: the master holds 18.23 MB (parameters, gradients, AdamW's state, its
       activations,\n  the gathered outputs), each other worker 11.97 MB: DP saves nothing
       and overloads worker 0
   PDP_ERR_INVALID for a NULL argument, batch < 1 or when buf's bytes do not hold it;
   PDP_ERR_STATE under DP before the first step. examples/train_gpt.c prints it for every
   rank. */
PDP_API pdp_status pdp_trainer_memory_report(const pdp_trainer *t, int64_t batch, char *buf,
                                             size_t bytes);
/* ZeRO-3: all-gathers the full parameters into the model's block (pdp_zero_gather_params(z,
   NULL): collective; valid until the next step), so that after pdp_trainer_free the model is
   whole; an evaluation forward needs none of this (ZeRO-3's forward gathers). Every other
   strategy: nothing to do. */
PDP_API pdp_status pdp_trainer_gather_params(pdp_trainer *t);

PDP_API pdp_model *pdp_trainer_model(const pdp_trainer *t);
PDP_API pdp_optim *pdp_trainer_optim(const pdp_trainer *t); /* pdp_optim_set_lr on it */
/* The executor, for its own calls (stats, hooks, checkpoints, no_sync), or NULL under
   another strategy. */
PDP_API pdp_dp *pdp_trainer_dp(const pdp_trainer *t);
PDP_API pdp_ddp *pdp_trainer_ddp(const pdp_trainer *t);
PDP_API pdp_zero *pdp_trainer_zero(const pdp_trainer *t);
