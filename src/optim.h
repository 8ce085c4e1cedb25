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

/* The hyper-parameters are doubles, as PyTorch's (Python floats): 1 - beta, the bias
   corrections, the step size and AdamW's decay factor are computed from them in double,
   and each scalar is rounded to float only where it meets the float tensors, where
   PyTorch's fp32 kernels round it (math.h: the element formulas). With float fields,
   beta2 0.999 was 0.99900001 and 1 - beta2 1.3e-5 off PyTorch's. Each must be at most
   FLT_MAX. */
/* Which parameters weight_decay applies to (torch.optim's parameter groups, in the two
   forms training scripts use). */
typedef enum pdp_decay_params {
    PDP_DECAY_ALL = 0,     /* every parameter: torch.optim's one group (the default) */
    PDP_DECAY_MATRICES = 1 /* tensors of 2 or more dimensions (Linear and Conv2d weights,
                              embeddings; a LayerNorm over [C, H, W] samples too), not those
                              of 1 (biases, a LayerNorm over features): nanoGPT's
                              configure_optimizers (p.dim() >= 2), llm.c's two groups */
} pdp_decay_params;

typedef struct pdp_optim_desc {
    pdp_optim_kind kind;  /* default SGD */
    double lr;            /* >= 0; default 0.01 for SGD, 0.001 for Adam and AdamW */
    double momentum;      /* SGD, >= 0; default 0 (no momentum buffer) */
    double dampening;     /* SGD, in [0, 1]; default 0 */
    bool nesterov;        /* SGD; needs momentum > 0 and dampening 0 */
    double weight_decay;  /* >= 0; default 0 (AdamW: 0 also means 0; PyTorch's default
                             is 0.01). SGD and Adam: L2 added to the gradient;
                             AdamW: decoupled, p *= 1 - lr * weight_decay */
    pdp_decay_params decay_params; /* which tensors weight_decay acts on; default ALL */
    double beta1;         /* Adam/AdamW, in [0, 1); default 0.9 (0 cannot be asked for:
                             it means the default; use 1e-30 for "no first moment") */
    double beta2;         /* Adam/AdamW, in [0, 1); default 0.999 */
    double eps;           /* Adam/AdamW, >= 0; default 1e-8 */
} pdp_optim_desc;

/* desc may be NULL (SGD, lr 0.01). Invalid fields fail with PDP_ERR_INVALID
   naming the field and its value ("lr -0.1 < 0"). The optimizer steps m's parameters in
   place: m must outlive its use (pdp_optim_free reads no model: either may be freed
   first). Fields of the other kind (SGD's
   momentum for Adam, Adam's betas for SGD) are not read. */
PDP_API pdp_status pdp_optim_create(pdp_optim **out, pdp_model *m, const pdp_optim_desc *desc);
PDP_API void pdp_optim_free(pdp_optim *o); /* NULL is fine */
/* One update of every parameter from its gradient; then steps += 1. Large
   blocks are split over the calling thread's intra-op threads (element-wise,
   so the bits do not depend on the thread count). */
PDP_API pdp_status pdp_optim_step(pdp_optim *o);
/* Zeros the gradient block of the model the optimizer was created on. */
PDP_API void pdp_optim_zero_grad(pdp_optim *o);
/* lr: in [0, FLT_MAX] (NaN is not), else PDP_ERR_INVALID and the optimizer keeps its lr.
   A double, as torch's param_group["lr"]: a schedule's value is kept to the bit. */
PDP_API pdp_status pdp_optim_set_lr(pdp_optim *o, double lr);
PDP_API double pdp_optim_lr(const pdp_optim *o); /* 0 for NULL */
PDP_API int64_t pdp_optim_steps(const pdp_optim *o); /* updates done so far */
/* The desc in use, defaults filled in (sokol's query-defaults). */
PDP_API pdp_optim_desc pdp_optim_get_desc(const pdp_optim *o);
PDP_API const char *pdp_optim_kind_name(pdp_optim_kind kind); /* "SGD", "Adam", "AdamW" */

/* Scales all gradients so their global L2 norm is at most max_norm (as
   torch.nn.utils.clip_grad_norm_); *total_norm gets the norm before clipping
   (may be NULL). A NaN or Inf norm fails with PDP_ERR_NUMERIC; max_norm must be finite
   and >= 0 (else PDP_ERR_INVALID; the rule of every clipping call, ZeRO's and the
   pipeline's too).
   Tensor parallel (a model with a TP communicator, tp.h): collective over the TP
   group, every TP rank calls it. The norm is the full model's: each rank's slices,
   summed over the group, plus the replicated tensors (LayerNorm, the row-parallel
   bias, every non-TP layer) counted once; every rank gets the same norm and scales by
   the same coefficient, so the replicated tensors stay the same bits. Under DDP
   (DP x TP) call it after pdp_ddp_finish (each slice then averaged over its DP group).
   Refused (PDP_ERR_STATE): a model whose gradients ZeRO holds (pdp_zero_clip_grad_norm)
   and a pipeline stage (pdp_pp_clip_grad_norm). */
PDP_API pdp_status pdp_clip_grad_norm(pdp_model *m, float max_norm, float *total_norm);

/* Linear warm-up, then cosine decay (llm.c's schedule). step counts from 0:
   step < warmup: base_lr * (step + 1) / warmup (the first step is not spent at
   lr 0); warmup <= step < total: min_lr + (base_lr - min_lr) * (1 + cos(pi *
   (step - warmup) / (total - warmup))) / 2; step >= total: min_lr. In double, as
   PyTorch's schedulers compute in Python. It cannot return a status: for a negative
   step, warmup or total, or a base_lr or min_lr that is negative, NaN or infinite, it
   returns NaN (which pdp_optim_set_lr then rejects). */
PDP_API double pdp_lr_warmup_cosine(int64_t step, int64_t warmup, int64_t total, double base_lr,
                                    double min_lr);
