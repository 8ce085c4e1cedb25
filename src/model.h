/* model: a sequential model, its layers, and its one parameter registry.

   Parameters live in one contiguous block and gradients in another, in
   registration order, with one view per named tensor ("0.weight", "0.bias",
   "3.weight", ... as a PyTorch nn.Sequential's state_dict), so a checkpoint maps
   one to one onto the matching PyTorch module and a DDP bucket is a plain range
   of the gradient block. Backward accumulates into the gradients (zero them
   with pdp_model_zero_grad) and, right after each layer, calls the grad hooks
   once for each parameter of that layer: the user's (pdp_model_set_grad_hook), then the
   one DDP's and ZeRO's bucket reducer (reducer.c) listens to.

   Wrapped models. While an executor holds a model (pdp_dp_create's master,
   pdp_ddp_create, pdp_zero_create, a pipeline's stage), every call that would change
   its layout or its parameter block (pdp_model_add_*, the TP layers of tp.h,
   pdp_model_set_tp) fails with PDP_ERR_STATE naming the call and the executor, and the
   model is unchanged: the executor planned its buckets, shards or replicas on that
   layout. Free the executor first. A model is held by one executor at a time: a second
   create fails the same way, naming both (a TP model under DDP or ZeRO is one executor:
   TP is a property of the model). pdp_model_set_precision and pdp_model_set_training
   stay allowed (DP hands both to its replicas every step). Under ZeRO the views of
   pdp_model_param and pdp_model_flat show what this rank holds (below, and zero.h). */

typedef struct pdp_model pdp_model;

/* Activation recomputation (Korthikanti et al., "Reducing Activation Recomputation in
   Large Transformer Models", 2022): memory for compute, the same results up to float
   rounding (the same dropout masks: they are keyed, not drawn from a stream).
   SELECTIVE: a CausalSelfAttention keeps no attention probabilities (heads x T x T a
   sample); backward draws them again from its input. FULL: the layers inside each
   residual region keep nothing; the region runs forward again from its input (kept)
   before its backward, in one scratch set of buffers the size of the largest region. */
typedef enum pdp_recompute {
    PDP_RECOMPUTE_NONE = 0,      /* default: keep every activation */
    PDP_RECOMPUTE_SELECTIVE = 1,
    PDP_RECOMPUTE_FULL = 2
} pdp_recompute;

typedef struct pdp_model_desc {
    int input_ndim;          /* 1 (features), 2 (positions, features: Linear, LayerNorm and
                                the element-wise layers act per position) or 3 (channels,
                                height, width); 0 = the count of leading nonzero
                                input_shape entries (a size other than 1 after a 0 is
                                then refused); given, the entries past it are unused */
    int64_t input_shape[3];  /* one sample, without the batch dimension; required */
    uint64_t seed;           /* parameter initialisation and dropout masks; default 0 */
    pdp_device device;       /* default CPU */
    pdp_precision precision; /* PDP_PRECISION_BF16: Linear and Conv2d products take bf16
                                inputs (pdp_gemm_bf16; on CUDA cuBLAS GemmEx), as
                                torch.autocast; parameters, gradients, activations and
                                the rest stay fp32. Default fp32 */
    pdp_dtype input_dtype;   /* PDP_DTYPE_I32: samples are T token ids (input_shape {T}),
                                taken by an Embedding first; default float32 */
    pdp_recompute recompute; /* activation recomputation; default none */
} pdp_model_desc;

PDP_API pdp_status pdp_model_create(pdp_model **out, const pdp_model_desc *desc);
PDP_API void pdp_model_free(pdp_model *m);
/* The desc in use (sokol's query-defaults): input_ndim resolved, input_shape's unused
   entries 0, precision the current one. A zero desc for NULL. */
PDP_API pdp_model_desc pdp_model_get_desc(const pdp_model *m);

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
PDP_API pdp_status pdp_model_add_silu(pdp_model *m);   /* x sigmoid(x), as torch.nn.SiLU */
/* GELU's exact form, x Phi(x) with erf: torch.nn.GELU() (approximate='none'), nanoGPT's */
PDP_API pdp_status pdp_model_add_gelu_erf(pdp_model *m);
PDP_API pdp_status pdp_model_add_dropout(pdp_model *m, float p); /* 0 <= p < 1 */
/* Normalises over all features of a sample, or over the last dimension of a [T, C] sample
   (each position alone, as torch.nn.LayerNorm(C)); eps 0 means 1e-5. */
PDP_API pdp_status pdp_model_add_layernorm(pdp_model *m, float eps);
/* Square kernel; stride 0 means 1. Input must be (C, H, W). */
PDP_API pdp_status pdp_model_add_conv2d(pdp_model *m, int64_t out_channels, int64_t kernel,
                                        int64_t stride, int64_t padding);
/* Square window; stride 0 means kernel. */
PDP_API pdp_status pdp_model_add_maxpool2d(pdp_model *m, int64_t kernel, int64_t stride);
PDP_API pdp_status pdp_model_add_flatten(pdp_model *m);

/* ---- a GPT's layers ----
   Samples of positions: after an Embedding a sample is [T, C], T positions of C
   features. Linear (y = x W^T + b on every position: W is [out, C]), LayerNorm (over C),
   GELU, Dropout and the other element-wise kinds act on every position as PyTorch's do on
   [B, T, C]; 1-D samples are unchanged. pdp_gpt_create (gpt.h) builds a whole GPT.

   Embedding (torch.nn.Embedding for tokens plus a learned one for positions, as GPT-2's
   wte and wpe): the model's input is int32 ids (desc.input_dtype = PDP_DTYPE_I32,
   input_shape {T}); out[t] = token.weight[id[t]] + position.weight[t], parameters
   "<n>.token.weight" [vocab, dim] and "<n>.position.weight" [context, dim] (context 0:
   T), each N(0, 1) as torch.nn.Embedding. Only a model's first layer. An id outside
   [0, vocab) fails the forward with PDP_ERR_INVALID naming the layer, the position (b, t)
   and the id; a sequence longer than the context PDP_ERR_SHAPE naming both lengths. */
PDP_API pdp_status pdp_model_add_embedding(pdp_model *m, int64_t vocab, int64_t dim,
                                           int64_t context);
/* Causal multi-head self-attention on [T, 3C] (a Linear(C, 3C)'s output: q, k, v side by
   side, nanoGPT's c_attn) -> [T, C]: per head softmax(q k^T / sqrt(C / heads)) with
   position t seeing 0..t only, attention dropout p in training, heads concatenated
   (nanoGPT's CausalSelfAttention without its two Linears). heads must divide C. Keeps
   heads x T x T probabilities a sample for backward. */
PDP_API pdp_status pdp_model_add_causal_self_attention(pdp_model *m, int64_t heads,
                                                       float dropout);
/* A residual region: the layers added between begin and end are a branch f, and the
   region computes x + f(x) (the sum's gradient flows into both). Begin adds a Residual
   layer, end a ResidualAdd; neither is numbered in the state_dict (functions in PyTorch's
   forward, not modules). Regions follow one another and do not nest; end fails with
   PDP_ERR_SHAPE when f changes the shape, and a forward with a region open fails. */
PDP_API pdp_status pdp_model_residual_begin(pdp_model *m);
PDP_API pdp_status pdp_model_residual_end(pdp_model *m);
/* A Linear without bias whose weight is the model's parameter named param ([out, in]),
   shared, not copied: GPT-2's head tied to the token embedding (y = x wte^T). Both
   layers' gradients sum into the one parameter, as autograd's for a tied Parameter. */
PDP_API pdp_status pdp_model_add_tied_linear(pdp_model *m, const char *param);

/* x is [batch, input_shape...]; *y points at the model's own output tensor
   [batch, output features...], valid until the next forward. The model keeps x's pointer,
   not a copy: the backward reads x again (the first layer's weight gradient, an
   Embedding's rows), so leave its memory as it was until then (an Embedding's backward
   refuses ids that are now outside [0, vocab), PDP_ERR_INVALID). Activations are
   sized for the largest batch seen so far (pdp_model_reserve avoids growth in
   the training loop). */
PDP_API pdp_status pdp_model_forward(pdp_model *m, const pdp_tensor *x, const pdp_tensor **y);
/* dy is the gradient of the loss with respect to the last output, same shape.
   Accumulates parameter gradients; fires the grad hook after each layer. */
PDP_API pdp_status pdp_model_backward(pdp_model *m, const pdp_tensor *dy);
/* pdp_model_backward that also writes the gradient of the loss with respect to the
   forward's input into dx (PyTorch's x.grad after backward; saliency, a model chained by
   hand): float32, the input's element count, on the model's device; overwritten, not
   accumulated. A model whose input is int32 token ids has none: PDP_ERR_INVALID. */
PDP_API pdp_status pdp_model_backward_dx(pdp_model *m, const pdp_tensor *dy, pdp_tensor *dx);
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
/* Bytes of activations that layers [lo, hi) keep from forward for backward at batch
   samples, as pdp_model_reserve plans them: their outputs (a view has none) and what each
   saves (a Dropout's mask, an attention's probabilities, a LayerNorm's mean and rstd).
   Under FULL recomputation the layers inside a residual region keep nothing (counted 0);
   the scratch they run in, the largest region's outputs and saved buffers, lives only
   during that region's forward and backward and is not in this count. */
PDP_API int64_t pdp_model_activation_bytes(const pdp_model *m, int lo, int hi, int64_t batch);
PDP_API int pdp_model_num_params(const pdp_model *m);      /* named parameter tensors */
PDP_API pdp_device pdp_model_device(const pdp_model *m);

typedef struct pdp_param {
    const char *name;  /* "0.weight" */
    int layer;         /* index of the layer that owns it */
    int64_t offset;    /* in floats, into the flat parameter and gradient blocks */
    int ndim;          /* the parameter's shape (shape[ndim..3] are 1) and floats */
    int64_t shape[PDP_MAX_DIMS], count;
    pdp_tensor value;  /* a view of its values (into the parameter block) */
    pdp_tensor grad;   /* a view of its gradient (into the gradient block) */
    /* What the views hold: elements [value_lo, value_hi) and [grad_lo, grad_hi) of the
       parameter flattened in row-major order. 0 and count, with the views in the
       parameter's shape, unless an executor keeps only part of it on this rank (ZeRO,
       zero.h): that view is then 1-d, hi - lo floats; hi == lo: none here (data NULL). */
    int64_t value_lo, value_hi, grad_lo, grad_hi;
} pdp_param;

/* Views valid until the next layer is added (or, under ZeRO, until pdp_zero_free).
   Under ZeRO (every stage, zero.h): grad is this rank's part of the reduced gradient
   (after pdp_zero_finish: the average over ranks; stage 1 before it: the local sums of
   that part); value is the whole parameter at stages 1-2 and this rank's part at stage
   3 (the shard the optimizer updates, whatever pdp_zero_gather_params(z, NULL) did). */
PDP_API pdp_status pdp_model_param(const pdp_model *m, int index, pdp_param *out);
PDP_API pdp_status pdp_model_find_param(const pdp_model *m, const char *name, pdp_param *out);
/* Views of the whole flat blocks (param_count floats each); either may be NULL. Under
   ZeRO the gradients (every stage) and the parameters (stage 3) are not one block on
   this rank: asking for them fails with PDP_ERR_STATE naming pdp_model_param and
   pdp_zero_gather_params; the parameters at stages 1-2 are the full block. A model with no
   parameters (activations only) has no block: PDP_ERR_STATE. */
PDP_API pdp_status pdp_model_flat(const pdp_model *m, pdp_tensor *params, pdp_tensor *grads);

/* Called during backward right after a parameter's gradient is final for this
   backward pass: once per parameter, in reverse layer order, on the thread running
   backward. One user hook a model (a later call replaces it; fn NULL removes it). It is
   the caller's own: an executor's (DDP, ZeRO) is kept apart, so a hook set before or
   while one wraps the model runs beside it (first, with this rank's local gradient,
   before the bucket holding it is reduced) and neither replaces nor removes it. Under DP
   (dp.h) it runs in the master's backward only, on the master's share of the batch, before
   the workers' gradients are added in; a pipeline's stage model (pp.h) calls it with the
   stage's parameter indices. The hook
   may train or query other models; on its own model a forward, pdp_model_reserve or a new
   layer fails with PDP_ERR_STATE (that backward still reads what they replace), and it must
   not free it. */
typedef void (*pdp_grad_hook)(void *user, pdp_model *m, int param_index);
PDP_API void pdp_model_set_grad_hook(pdp_model *m, pdp_grad_hook fn, void *user);

/* One training pass for classification: forward, softmax cross-entropy against
   labels, backward (gradients accumulate). One label a row of the output's last
   dimension: an output [batch, classes] takes batch labels, a language model's [batch, T,
   vocab] takes batch x T (one a position, row-major: nanoGPT's targets). A label of -1 is
   ignored (nanoGPT's ignore_index): *loss is the mean over the other rows, and a batch
   with every label -1 gives 0 and no gradient. Any other label outside [0, classes) fails
   with PDP_ERR_INVALID naming the row; NaN or Inf with PDP_ERR_NUMERIC. Uses the model's
   own buffer for the loss gradient: nothing is allocated after the first call. The same
   on CUDA (the labels are read on the host). */
PDP_API pdp_status pdp_model_forward_backward(pdp_model *m, const pdp_tensor *x,
                                              const int32_t *labels, float *loss);
/* The same pass with the target a tensor whose dtype picks the loss (what a batcher's
   pdp_batcher_next_target hands out): int32 labels, one a row as above (its shape [batch]
   or [batch, T]; on the host) -> cross-entropy; float32 values of the output's count and
   batch -> mean squared error over every element (pdp_loss_mse: regression). */
PDP_API pdp_status pdp_model_forward_backward_target(pdp_model *m, const pdp_tensor *x,
                                                     const pdp_tensor *target, float *loss);

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
