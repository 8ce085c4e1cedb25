/* optim: optimizers with PyTorch's exact update rules (torch.optim.SGD, Adam,
   AdamW), gradient clipping by global norm, and a learning-rate schedule.

   An optimizer updates the model's flat parameter block from its flat gradient
   block; its state (momentum, first and second moments) is flat too, with the
   same offsets, so it can be sharded by ranges (ZeRO) and saved in one piece. */

typedef struct pdp_optim pdp_optim;

typedef enum pdp_optim_kind {
    PDP_OPTIM_SGD = 0,
    PDP_OPTIM_ADAM = 1,
    PDP_OPTIM_ADAMW = 2
} pdp_optim_kind;

typedef struct pdp_optim_desc {
    pdp_optim_kind kind;  /* default SGD */
    float lr;             /* default 0.01 for SGD, 0.001 for Adam and AdamW */
    float momentum;       /* SGD; default 0 */
    float dampening;      /* SGD; default 0 */
    bool nesterov;        /* SGD; needs momentum > 0 and dampening 0 */
    float weight_decay;   /* default 0 (AdamW: 0 also means 0; PyTorch's default is 0.01) */
    float beta1;          /* Adam/AdamW; default 0.9 */
    float beta2;          /* Adam/AdamW; default 0.999 */
    float eps;            /* Adam/AdamW; default 1e-8 */
} pdp_optim_desc;

PDP_API pdp_status pdp_optim_create(pdp_optim **out, pdp_model *m, const pdp_optim_desc *desc);
PDP_API void pdp_optim_free(pdp_optim *o);
/* One update of every parameter from its gradient. */
PDP_API pdp_status pdp_optim_step(pdp_optim *o);
PDP_API void pdp_optim_zero_grad(pdp_optim *o);
PDP_API void pdp_optim_set_lr(pdp_optim *o, float lr);
PDP_API float pdp_optim_lr(const pdp_optim *o);
PDP_API int64_t pdp_optim_steps(const pdp_optim *o); /* updates done so far */

/* Scales all gradients so their global L2 norm is at most max_norm (as
   torch.nn.utils.clip_grad_norm_); *total_norm gets the norm before clipping
   (may be NULL). A NaN or Inf norm fails with PDP_ERR_NUMERIC. */
PDP_API pdp_status pdp_clip_grad_norm(pdp_model *m, float max_norm, float *total_norm);

/* Linear warm-up from 0 to base_lr over warmup steps, then cosine decay to
   min_lr at total steps (held after). step counts from 0. */
PDP_API float pdp_lr_warmup_cosine(int64_t step, int64_t warmup, int64_t total, float base_lr,
                                   float min_lr);
