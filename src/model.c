/* model: the sequential container. Owns the layer list, the parameter registry
   and the flat parameter and gradient blocks, sizes the activation buffers, and
   drives forward and backward over the layers through the table of kinds
   (layers_table.c).

   Invariants: params[i].offset is the sum of the counts before it (registration
   order, no gaps), so the gradient of parameters j..k is one contiguous range;
   act[i] holds layer i's output from the last forward (Flatten aliases its
   input instead of copying, and so does a ReLU after a Conv2d on the CPU, which the
   Conv2d applies itself; when a 2x2 stride-2 MaxPool2d follows that ReLU, the Conv2d
   applies it too, writes the pool's act, and its own act is NULL; a GELU after a Linear
   on the CPU is applied by the Linear, which writes both acts); backward needs
   the forward's input to stay alive, as in PyTorch's autograd. A residual region
   (pdp_model_residual_begin/end) is the one place the sequence is not a chain: its
   ResidualAdd reads the output of its Residual (a forward view, so act[] of the region's
   input), and in backward sends its dy around the branch in grad_skip, which the
   Residual adds back; regions do not nest, so one skip buffer serves them all. A
   TiedLinear's weight is another layer's parameter (pdp__model_io). After
   pdp_model_reserve (or the first step at the largest batch), forward and backward
   allocate nothing.

   The executor seam (internal.h): an executor may listen to the pass's events
   (m->event: before each layer that computes with parameters, its own or a tied one,
   forward, backward and in a region FULL recomputation runs again inside backward, and
   at the start and end of every backward: DDP and ZeRO synchronise any backward this
   way, ZeRO-3 gathers each layer's parameters) and point a layer's weight/bias and
   their gradients at buffers of its own (m->layer_w, m->layer_dw: ZeRO's per-unit
   buffers). Both are off (NULL) by default: one pointer test per layer. */

#include "internal.h"

/* ---- model: lifecycle ---- */

PDP_API pdp_status pdp_model_create(pdp_model **out, const pdp_model_desc *desc)
{
    pdp_model *m;
    int64_t count;
    int i, ndim = 0;
    pdp_status st;
    if (!out) return pdp__err(PDP_ERR_INVALID, "pdp_model_create: out is NULL");
    *out = NULL;
    if (!desc)
        return pdp__err(PDP_ERR_INVALID,
                        "pdp_model_create: desc is NULL (input_shape is required)");
    for (i = 0; i < 3 && desc->input_shape[i] > 0; i++) ndim++;
    if (desc->input_ndim) ndim = desc->input_ndim;
    if (ndim < 1 || ndim > 3)
        return pdp__err(PDP_ERR_SHAPE, "pdp_model_create: input_shape {%lld, %lld, %lld} "
                        "(input_ndim %d): one sample's shape, 1 to 3 positive sizes: (F), "
                        "(T, C) or (C, H, W)", (long long)desc->input_shape[0],
                        (long long)desc->input_shape[1], (long long)desc->input_shape[2], ndim);
    for (i = ndim; i < 3 && !desc->input_ndim; i++) /* a size after a 0: dropped, silently */
        if (desc->input_shape[i] != 0 && desc->input_shape[i] != 1)
            return pdp__err(PDP_ERR_SHAPE, "pdp_model_create: input_shape {%lld, %lld, %lld} has "
                            "a size past its %d dimension%s (input_shape[%d] = %lld)",
                            (long long)desc->input_shape[0], (long long)desc->input_shape[1],
                            (long long)desc->input_shape[2], ndim, ndim == 1 ? "" : "s", i,
                            (long long)desc->input_shape[i]);
    if (desc->input_dtype != PDP_DTYPE_F32 && desc->input_dtype != PDP_DTYPE_I32)
        return pdp__err(PDP_ERR_INVALID, "pdp_model_create: input_dtype %d (must be "
                        "PDP_DTYPE_F32 or PDP_DTYPE_I32)", (int)desc->input_dtype);
    if ((unsigned)desc->recompute > PDP_RECOMPUTE_FULL)
        return pdp__err(PDP_ERR_INVALID, "pdp_model_create: recompute %d (must be NONE, "
                        "SELECTIVE or FULL)", (int)desc->recompute);
    /* a CUDA device without PDP_CUDA: here, not at the first layer's parameters */
    if ((st = pdp__check_device(desc->device, "pdp_model_create")) != PDP_OK) return st;
    if (desc->input_dtype == PDP_DTYPE_I32 && ndim != 1)
        return pdp__err(PDP_ERR_SHAPE, "pdp_model_create: int32 inputs are token ids, one "
                        "sequence [T] a sample; input_ndim is %d", ndim);
    for (i = 0; i < ndim; i++)
        if (desc->input_shape[i] < 1)
            return pdp__err(PDP_ERR_SHAPE, "pdp_model_create: input_shape[%d] is %lld", i,
                            (long long)desc->input_shape[i]);
    if (!pdp__mul3_ok(ndim > 0 ? desc->input_shape[0] : 1, ndim > 1 ? desc->input_shape[1] : 1,
                      ndim > 2 ? desc->input_shape[2] : 1, &count))
        return pdp__err(PDP_ERR_SHAPE, "pdp_model_create: input_shape has more than %lld elements",
                        (long long)PDP__COUNT_MAX);
    m = (pdp_model *)pdp__calloc(sizeof *m);
    if (!m) return pdp__err(PDP_ERR_OUT_OF_MEMORY, "pdp_model_create: no memory");
    m->device = desc->device;
    m->seed = desc->seed;
    pdp_rng_seed(&m->init_rng, desc->seed, 0);
    if ((st = pdp_model_set_precision(m, desc->precision)) != PDP_OK) {
        pdp__dealloc(m);
        return pdp__err_wrap(st, "pdp_model_create");
    }
    m->in_ndim = ndim;
    m->in_dtype = desc->input_dtype;
    m->recompute = desc->recompute;
    m->open_residual = -1;
    m->in_count = 1;
    for (i = 0; i < 3; i++) {
        m->in_shape[i] = i < ndim ? desc->input_shape[i] : 1;
        m->in_count *= m->in_shape[i];
    }
    m->training = true;
    *out = m;
    return PDP_OK;
}

/* The desc the model was made by, as in use: input_ndim and input_shape resolved,
   precision the current one (pdp_model_set_precision may change it). */
PDP_API pdp_model_desc pdp_model_get_desc(const pdp_model *m)
{
    pdp_model_desc d;
    int i;
    memset(&d, 0, sizeof d);
    if (!m) return d;
    d.input_ndim = m->in_ndim;
    for (i = 0; i < m->in_ndim; i++) d.input_shape[i] = m->in_shape[i];
    d.seed = m->seed;
    d.device = m->device;
    d.precision = m->precision;
    d.input_dtype = m->in_dtype;
    d.recompute = m->recompute;
    return d;
}

PDP__PRIVATE void pdp__model_free_buffers(pdp_model *m)
{
    pdp__dev_free(m->device, m->act_block);
    pdp__dev_free(m->device, m->saved_block);
    pdp__dev_free(m->device, m->work_block);
    pdp__dev_free(m->device, m->grad_a);
    pdp__dev_free(m->device, m->grad_b);
    pdp__dev_free(m->device, m->grad_skip);
    pdp__dealloc(m->act);
    pdp__dealloc(m->saved_off);
    m->act_block = m->saved_block = m->work_block = m->grad_a = m->grad_b = NULL;
    m->grad_skip = NULL;
    m->act = NULL;
    m->saved_off = NULL;
    m->max_batch = 0;
    m->have_forward = false; /* what a backward would read is gone */
}

PDP_API void pdp_model_free(pdp_model *m)
{
    if (!m) return;
    pdp__model_free_buffers(m);
    if (!m->params_shared) pdp__dev_free(m->device, m->param_block);
    pdp__dev_free(m->device, m->grad_block);
    pdp__dev_free(m->device, m->tp.dscalar); /* tp.c: a CUDA TP model's clipping scalar */
    pdp__dealloc(m->layers);
    pdp__dealloc(m->params);
    pdp__dealloc(m);
}

/* ---- model: the executor holding it ---- */

/* "ZeRO stage 3 (pdp_zero_create)": an executor, for messages. */
PDP__PRIVATE const char *pdp__wrap_name(pdp__wrap kind, int stage)
{
    static const char *zero[4] = {"ZeRO (pdp_zero_create)", "ZeRO stage 1 (pdp_zero_create)",
                                  "ZeRO stage 2 (pdp_zero_create)",
                                  "ZeRO stage 3 (pdp_zero_create)"};
    switch (kind) {
    case PDP__WRAP_DP: return "DataParallel (pdp_dp_create)";
    case PDP__WRAP_DDP: return "DDP (pdp_ddp_create)";
    case PDP__WRAP_ZERO: return zero[stage >= 1 && stage <= 3 ? stage : 0];
    case PDP__WRAP_PP: return "a pipeline (pdp_pp_create)";
    case PDP__WRAP_NONE: break;
    }
    return "no executor";
}

PDP__PRIVATE const char *pdp__model_wrapper(const pdp_model *m)
{
    return pdp__wrap_name(m->wrapped, m->wrap_stage);
}

PDP__PRIVATE pdp_status pdp__model_wrap(pdp_model *m, pdp__wrap kind, int stage, const char *fn)
{
    static const char *frees[5] = {"", "pdp_dp_free", "pdp_ddp_free", "pdp_zero_free",
                                   "pdp_pp_free"};
    PDP_ASSERT(kind > PDP__WRAP_NONE && kind <= PDP__WRAP_PP);
    if (pdp__model_check_whole(m, fn) != PDP_OK) return PDP_ERR_STATE;
    if (m->wrapped != PDP__WRAP_NONE)
        return pdp__err(PDP_ERR_STATE, "%s: the model is already wrapped by %s; one executor "
                        "holds a model at a time: %s it before wrapping the model in %s", fn,
                        pdp__model_wrapper(m), frees[m->wrapped], pdp__wrap_name(kind, stage));
    m->wrapped = kind;
    m->wrap_stage = stage;
    return PDP_OK;
}

PDP__PRIVATE pdp_status pdp__model_check_whole(const pdp_model *m, const char *fn)
{
    if (m->sliced_world < 2) return PDP_OK;
    return pdp__err(PDP_ERR_STATE, "%s: the model holds only rank %d of %d's slices of its "
                    "parameters (zeros elsewhere): ZeRO stage 3 was freed without gathering "
                    "them; call pdp_trainer_gather_params (or pdp_zero_gather_params(z, NULL)) "
                    "before pdp_trainer_free (pdp_zero_free), or load a whole checkpoint "
                    "(pdp_checkpoint_load)", fn, m->sliced_rank, m->sliced_world);
}

/* PDP_ERR_STATE while the model's backward runs: a grad hook (model.h) that calls fn on the
   model it was called for would overwrite (a forward: the activations and the input backward
   still reads) or free (a larger batch's re-plan, a new layer) what that backward goes on to
   read. */
PDP__PRIVATE pdp_status pdp__model_check_idle(const pdp_model *m, const char *fn)
{
    if (!m->in_backward) return PDP_OK;
    return pdp__err(PDP_ERR_STATE, "%s: called during the model's backward (from its grad hook), "
                    "which still reads the activations a forward, a re-plan or a new layer "
                    "replaces: call it after pdp_model_backward returns", fn);
}

PDP__PRIVATE void pdp__model_unwrap(pdp_model *m)
{
    m->wrapped = PDP__WRAP_NONE;
    m->wrap_stage = 0;
    m->views = NULL;
    m->views_user = NULL;
}

PDP__PRIVATE pdp_status pdp__model_check_layout(const pdp_model *m, const char *what,
                                                const char *fn)
{
    pdp_status st;
    if ((st = pdp__model_check_idle(m, fn)) != PDP_OK) return st;
    if (m->wrapped != PDP__WRAP_NONE)
        return pdp__err(PDP_ERR_STATE, "%s: the model is wrapped by %s; %s", fn,
                        pdp__model_wrapper(m), what);
    if (m->params_shared)
        return pdp__err(PDP_ERR_STATE, "%s: the model is a DataParallel replica", fn);
    return PDP_OK;
}

/* ---- model: adding layers ---- */

/* Grows an array of n used elements to hold one more; *cap doubles. */
PDP__PRIVATE pdp_status pdp__grow(void **arr, int n, int *cap, size_t elem)
{
    void *bigger;
    int newcap;
    if (n < *cap) return PDP_OK;
    newcap = *cap ? *cap * 2 : 8;
    bigger = pdp__alloc((size_t)newcap * elem);
    if (!bigger) return PDP_ERR_OUT_OF_MEMORY;
    if (*arr) memcpy(bigger, *arr, (size_t)n * elem);
    pdp__dealloc(*arr);
    *arr = bigger;
    *cap = newcap;
    return PDP_OK;
}

/* The state_dict number of the next layer: layers so far, less the unnumbered ones
   (PDP__LAYER_UNNUMBERED: TP's f and g). */
PDP__PRIVATE int pdp__model_next_number(const pdp_model *m)
{
    int i, n = 0;
    for (i = 0; i < m->nlayers; i++)
        n += !(pdp__layer_kind_of(m->layers[i].kind)->flags & PDP__LAYER_UNNUMBERED);
    return n;
}

PDP__PRIVATE pdp_status pdp__model_register(pdp_model *m, int layer, const char *what, int ndim,
                                            const int64_t *shape)
{
    pdp__param_entry *e;
    int64_t count = 1, total;
    int i;
    for (i = 0; i < ndim; i++)
        if (!pdp__mul_ok(count, shape[i], &count))
            return pdp__err(PDP_ERR_SHAPE, "%s has more than %lld elements", what,
                            (long long)PDP__COUNT_MAX);
    if (!pdp__add_ok(m->param_count, count, &total))
        return pdp__err(PDP_ERR_SHAPE, "the model would have more than %lld parameters with "
                        "%lld more", (long long)PDP__COUNT_MAX, (long long)count);
    if (pdp__grow((void **)&m->params, m->nparams, &m->cap_params, sizeof *m->params) != PDP_OK)
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "no memory");
    e = &m->params[m->nparams++];
    memset(e, 0, sizeof *e);
    snprintf(e->name, sizeof e->name, "%d.%s", pdp__model_next_number(m), what);
    e->layer = layer;
    e->ndim = ndim;
    e->count = 1;
    for (i = 0; i < 4; i++) {
        e->shape[i] = i < ndim ? shape[i] : 1;
        e->count *= e->shape[i];
    }
    e->offset = m->param_count;
    m->param_count += e->count;
    return PDP_OK;
}

/* Token ids enter a model once, at its first layer: a kind that takes ids
   (PDP__LAYER_TAKES_IDS: Embedding) only as layer 0 of a model whose input is int32, and a
   model whose input is int32 only with such a kind first. */
PDP__PRIVATE pdp_status pdp__model_check_ids(const pdp_model *m, const pdp__layer *l)
{
    bool takes = (pdp__layer_kind_of(l->kind)->flags & PDP__LAYER_TAKES_IDS) != 0;
    if (takes && l->index > 0)
        return pdp__err(PDP_ERR_INVALID, "token ids enter only at a model's first layer (this "
                        "is layer %d)", l->index);
    if (takes && m->in_dtype != PDP_DTYPE_I32)
        return pdp__err(PDP_ERR_INVALID, "takes int32 token ids; create the model with "
                        "input_dtype = PDP_DTYPE_I32");
    if (!takes && l->index == 0 && m->in_dtype == PDP_DTYPE_I32)
        return pdp__err(PDP_ERR_INVALID, "the model's input is int32 token ids: its first "
                        "layer must take them (pdp_model_add_embedding)");
    return PDP_OK;
}

/* The floats the parameter and gradient blocks hold (internal.h: param_cap). */
PDP__PRIVATE int64_t pdp__model_param_cap(const pdp_model *m)
{
    bool ours = m->param_block && m->param_block == m->cap_param_block &&
                m->grad_block == m->cap_grad_block;
    return ours ? m->param_cap : m->param_count;
}

/* A block's first bytes: src's, or zeros where src is absent (an executor's free that
   could not restore it). */
PDP__PRIVATE pdp_status pdp__model_keep(pdp_device d, float *dst, const float *src, size_t bytes)
{
    if (!bytes) return PDP_OK;
    return src ? pdp__dev_copy(d, dst, d, src, bytes) : pdp__dev_memset0(d, dst, bytes);
}

/* Both blocks reallocated to cap floats, their first keep floats kept. */
PDP__PRIVATE pdp_status pdp__model_resize_params(pdp_model *m, int64_t keep, int64_t cap)
{
    size_t kept = (size_t)keep * sizeof(float), bytes = (size_t)cap * sizeof(float);
    float *params = NULL, *grads = NULL;
    pdp_status st;
    if ((st = pdp__dev_alloc(m->device, bytes, (void **)&params)) != PDP_OK ||
        (st = pdp__dev_alloc(m->device, bytes, (void **)&grads)) != PDP_OK ||
        (st = pdp__model_keep(m->device, params, m->param_block, kept)) != PDP_OK ||
        (st = pdp__model_keep(m->device, grads, m->grad_block, kept)) != PDP_OK) {
        pdp__dev_free(m->device, params);
        pdp__dev_free(m->device, grads);
        return st;
    }
    pdp__dev_free(m->device, m->param_block);
    pdp__dev_free(m->device, m->grad_block);
    m->param_block = m->cap_param_block = params;
    m->grad_block = m->cap_grad_block = grads;
    m->param_cap = cap;
    return PDP_OK;
}

PDP__PRIVATE pdp_status pdp__model_reserve_params(pdp_model *m, int64_t count)
{
    if (count <= pdp__model_param_cap(m)) return PDP_OK;
    return pdp__model_resize_params(m, m->param_count, count);
}

PDP__PRIVATE pdp_status pdp__model_fit_params(pdp_model *m)
{
    if (pdp__model_param_cap(m) == m->param_count) return PDP_OK;
    return pdp__model_resize_params(m, m->param_count, m->param_count);
}

/* The new layer's parameters, [first, param_count) of the block, drawn by its init (on
   the host, then copied, for a device's block) and their gradients zeroed. */
PDP__PRIVATE pdp_status pdp__model_init_new(pdp_model *m, const pdp__layer *l,
                                            const pdp__param_shapes *ps, int64_t first)
{
    int64_t n = m->param_count - first;
    bool cpu = m->device.kind == PDP_DEVICE_CPU;
    float *host = cpu ? m->param_block + first : (float *)pdp__alloc((size_t)n * sizeof(float));
    pdp_status st = PDP_OK;
    if (!host) return pdp__err(PDP_ERR_OUT_OF_MEMORY, "no memory");
    pdp__layer_init_params(l, ps->wndim ? host + m->params[l->param_first].offset - first : NULL,
                           ps->bndim ? host + m->params[m->nparams - 1].offset - first : NULL,
                           &m->init_rng);
    if (!cpu) {
        st = pdp__dev_copy(m->device, m->param_block + first, pdp_cpu(), host,
                           (size_t)n * sizeof(float));
        pdp__dealloc(host);
    }
    if (st == PDP_OK)
        st = pdp__dev_memset0(m->device, m->grad_block + first, (size_t)n * sizeof(float));
    return st;
}

/* Appends layer l (kind and configuration filled in by the caller): infers its
   shapes, registers and initialises its parameters, and moves the parameter and
   gradient blocks to their new size. On failure the model is unchanged. */
PDP__PRIVATE pdp_status pdp__model_add(pdp_model *m, pdp__layer l, const char *fn)
{
    pdp__param_shapes ps;
    int64_t old_count, cap;
    int old_nparams;
    pdp_status st;
    int i;
    if (!m) return pdp__err(PDP_ERR_INVALID, "%s: model is NULL", fn);
    /* the executor planned its buckets, shards and replicas on this layout */
    if ((st = pdp__model_check_layout(m, "add layers before wrapping it", fn)) != PDP_OK)
        return st;
    l.index = m->nlayers;
    l.recompute = m->recompute == PDP_RECOMPUTE_SELECTIVE;
    l.mask_index = 0; /* the layers before it but TP's f and g (collective kinds) */
    for (i = 0; i < m->nlayers; i++)
        l.mask_index += !(pdp__layer_kind_of(m->layers[i].kind)->flags & PDP__LAYER_COLLECTIVE);
    if (m->nlayers) {
        const pdp__layer *prev = &m->layers[m->nlayers - 1];
        l.in_ndim = prev->out_ndim;
        memcpy(l.in_shape, prev->out_shape, sizeof l.in_shape);
    } else {
        l.in_ndim = m->in_ndim;
        memcpy(l.in_shape, m->in_shape, sizeof l.in_shape);
    }
    l.in_count = l.in_shape[0] * l.in_shape[1] * l.in_shape[2];
    if ((st = pdp__model_check_ids(m, &l)) != PDP_OK ||
        (st = pdp__layer_setup(&l, &ps)) != PDP_OK)
        return pdp__err_wrap(st, "%s: layer %d (%s)", fn, l.index, pdp__layer_kind_name(l.kind));
    l.out_count = l.out_shape[0] * l.out_shape[1] * l.out_shape[2]; /* the setup checked it */

    if (pdp__grow((void **)&m->layers, m->nlayers, &m->cap_layers, sizeof *m->layers) != PDP_OK)
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory", fn);
    old_count = m->param_count;
    old_nparams = m->nparams;
    cap = pdp__model_param_cap(m);
    l.param_first = m->nparams;
    l.nparams = (ps.wndim > 0) + (ps.bndim > 0);
    if ((ps.wndim && (st = pdp__model_register(m, l.index, ps.wname ? ps.wname : "weight",
                                               ps.wndim, ps.wshape))) ||
        (ps.bndim && (st = pdp__model_register(m, l.index, ps.bname ? ps.bname : "bias",
                                               ps.bndim, ps.bshape))))
        goto fail;
    /* Exactly the new size: a model holds what it uses (a PDP_MALLOC budget, a GPU's memory
       see no spare room). Each layer then copies the blocks so far, which a builder that
       knows the size avoids with pdp__model_reserve_params (pdp_gpt_create at GPT-2 124M's
       size: 72 s without, on an EPYC Zen 4, most of it page faults). */
    if (m->param_count > cap && (st = pdp__model_resize_params(m, old_count, m->param_count)))
        goto fail;
    if (m->param_count != old_count && (st = pdp__model_init_new(m, &l, &ps, old_count)))
        goto fail;
    m->layers[m->nlayers++] = l;
    pdp__model_free_buffers(m); /* activations are re-planned on the next forward */
    return PDP_OK;
fail:
    m->param_count = old_count;
    m->nparams = old_nparams;
    return pdp__err_wrap(st, "%s: layer %d", fn, l.index);
}

PDP__PRIVATE pdp__layer pdp__layer_of(pdp__layer_kind kind)
{
    pdp__layer l;
    memset(&l, 0, sizeof l);
    l.kind = kind;
    return l;
}

PDP_API pdp_status pdp_model_add_linear(pdp_model *m, int64_t out_features)
{
    pdp__layer l = pdp__layer_of(PDP__LINEAR);
    l.out_features = out_features;
    return pdp__model_add(m, l, "pdp_model_add_linear");
}

PDP_API pdp_status pdp_model_add_relu(pdp_model *m)
{
    return pdp__model_add(m, pdp__layer_of(PDP__RELU), "pdp_model_add_relu");
}

PDP_API pdp_status pdp_model_add_gelu(pdp_model *m)
{
    return pdp__model_add(m, pdp__layer_of(PDP__GELU), "pdp_model_add_gelu");
}

PDP_API pdp_status pdp_model_add_tanh(pdp_model *m)
{
    return pdp__model_add(m, pdp__layer_of(PDP__TANH), "pdp_model_add_tanh");
}

PDP_API pdp_status pdp_model_add_sigmoid(pdp_model *m)
{
    return pdp__model_add(m, pdp__layer_of(PDP__SIGMOID), "pdp_model_add_sigmoid");
}

PDP_API pdp_status pdp_model_add_silu(pdp_model *m)
{
    return pdp__model_add(m, pdp__layer_of(PDP__SILU), "pdp_model_add_silu");
}

PDP_API pdp_status pdp_model_add_gelu_erf(pdp_model *m)
{
    return pdp__model_add(m, pdp__layer_of(PDP__GELU_ERF), "pdp_model_add_gelu_erf");
}

PDP_API pdp_status pdp_model_add_dropout(pdp_model *m, float p)
{
    pdp__layer l = pdp__layer_of(PDP__DROPOUT);
    l.p = p;
    return pdp__model_add(m, l, "pdp_model_add_dropout");
}

PDP_API pdp_status pdp_model_add_layernorm(pdp_model *m, float eps)
{
    pdp__layer l = pdp__layer_of(PDP__LAYERNORM);
    l.eps = eps == 0.0f ? 1e-5f : eps; /* 0: the default; the setup rejects < 0, NaN, inf */
    return pdp__model_add(m, l, "pdp_model_add_layernorm");
}

PDP_API pdp_status pdp_model_add_conv2d(pdp_model *m, int64_t out_channels, int64_t kernel,
                                        int64_t stride, int64_t padding)
{
    pdp__layer l = pdp__layer_of(PDP__CONV2D);
    l.out_features = out_channels;
    l.kernel = kernel;
    l.stride = stride ? stride : 1;
    l.padding = padding;
    return pdp__model_add(m, l, "pdp_model_add_conv2d");
}

PDP_API pdp_status pdp_model_add_maxpool2d(pdp_model *m, int64_t kernel, int64_t stride)
{
    pdp__layer l = pdp__layer_of(PDP__MAXPOOL2D);
    l.kernel = kernel;
    l.stride = stride ? stride : kernel;
    return pdp__model_add(m, l, "pdp_model_add_maxpool2d");
}

/* ---- model: a GPT's layers ---- */

PDP_API pdp_status pdp_model_add_embedding(pdp_model *m, int64_t vocab, int64_t dim,
                                           int64_t context)
{
    pdp__layer l = pdp__layer_of(PDP__EMBEDDING);
    l.vocab = vocab;
    l.out_features = dim;
    l.context = context ? context : m ? m->in_shape[0] : 0; /* 0: the model's T */
    return pdp__model_add(m, l, "pdp_model_add_embedding");
}

/* tp.c: an attention after a ColumnParallelLinear split by heads becomes the attention of
   this rank's heads (l->heads local, l->tp_lo its first global head, l->tp_full every
   head); else l is left as it is. */
PDP__PRIVATE pdp_status pdp__tp_headwise(const pdp_model *m, pdp__layer *l, const char *fn);

PDP_API pdp_status pdp_model_add_causal_self_attention(pdp_model *m, int64_t heads, float dropout)
{
    const char *fn = "pdp_model_add_causal_self_attention";
    pdp__layer l = pdp__layer_of(PDP__CAUSAL_SELF_ATTENTION);
    pdp_status st;
    l.heads = heads;
    l.p = dropout;
    if (m && (st = pdp__tp_headwise(m, &l, fn)) != PDP_OK) return st; /* on a TP shard */
    return pdp__model_add(m, l, fn);
}

/* A residual region: a Residual layer opens it (its forward is its input seen again), a
   ResidualAdd closes it (y = x + the Residual's input). Backward, the ResidualAdd sends its
   dy around the branch in grad_skip and the Residual adds it to the branch's gradient. */
PDP_API pdp_status pdp_model_residual_begin(pdp_model *m)
{
    const char *fn = "pdp_model_residual_begin";
    pdp__layer l = pdp__layer_of(PDP__RESIDUAL);
    pdp_status st;
    if (m && m->open_residual >= 0)
        return pdp__err(PDP_ERR_STATE, "%s: the residual region opened at layer %d is still "
                        "open (regions do not nest; close it with pdp_model_residual_end)", fn,
                        m->open_residual);
    if (m) l.residual_from = m->nlayers; /* itself: the region starts here */
    if ((st = pdp__model_add(m, l, fn)) != PDP_OK) return st;
    m->open_residual = m->nlayers - 1;
    return PDP_OK;
}

PDP_API pdp_status pdp_model_residual_end(pdp_model *m)
{
    const char *fn = "pdp_model_residual_end";
    pdp__layer l = pdp__layer_of(PDP__RESIDUAL_ADD);
    const pdp__layer *from, *last;
    pdp_status st;
    if (!m) return pdp__err(PDP_ERR_INVALID, "%s: model is NULL", fn);
    if (m->open_residual < 0)
        return pdp__err(PDP_ERR_STATE, "%s: no residual region is open (pdp_model_residual_begin "
                        "opens one)", fn);
    from = &m->layers[m->open_residual];
    last = &m->layers[m->nlayers - 1];
    if (last->out_ndim != from->in_ndim ||
        memcmp(last->out_shape, from->in_shape, sizeof last->out_shape) != 0) {
        char a[96], b[96];
        pdp_tensor ta, tb;
        pdp__set_shape(&ta, from->in_ndim, from->in_shape, 0);
        pdp__set_shape(&tb, last->out_ndim, last->out_shape, 0);
        return pdp__err(PDP_ERR_SHAPE, "%s: the region opened at layer %d takes %s and its "
                        "layers give %s; a residual adds the two", fn, m->open_residual,
                        pdp__shape_str(&ta, a, sizeof a), pdp__shape_str(&tb, b, sizeof b));
    }
    l.residual_from = m->open_residual;
    if ((st = pdp__model_add(m, l, fn)) != PDP_OK) return st;
    m->open_residual = -1;
    return PDP_OK;
}

PDP_API pdp_status pdp_model_add_tied_linear(pdp_model *m, const char *param)
{
    const char *fn = "pdp_model_add_tied_linear";
    pdp__layer l = pdp__layer_of(PDP__TIED_LINEAR);
    int i;
    if (!m || !param) return pdp__err(PDP_ERR_INVALID, "%s: NULL argument", fn);
    for (i = 0; i < m->nparams && strcmp(m->params[i].name, param) != 0; i++) {}
    if (i == m->nparams)
        return pdp__err(PDP_ERR_INVALID, "%s: the model has no parameter \"%s\"", fn, param);
    if (m->params[i].ndim != 2)
        return pdp__err(PDP_ERR_SHAPE, "%s: \"%s\" is %d-D; a Linear's weight is [out, in]",
                        fn, param, m->params[i].ndim);
    l.tied_param = i;
    l.out_features = m->params[i].shape[0];
    l.tied_in = m->params[i].shape[1];
    return pdp__model_add(m, l, fn);
}

PDP_API pdp_status pdp_model_add_flatten(pdp_model *m)
{
    return pdp__model_add(m, pdp__layer_of(PDP__FLATTEN), "pdp_model_add_flatten");
}

/* ---- model: buffers ---- */

/* Whether layer i's kind has flag (PDP__LAYER_*). */
PDP__PRIVATE bool pdp__model_flag(const pdp_model *m, int i, unsigned flag)
{
    return (pdp__layer_kind_of(m->layers[i].kind)->flags & flag) != 0;
}

/* Layer i is a ReLU (PDP__LAYER_FUSABLE_RELU) that the layer before it (a Conv2d or a
   Linear: PDP__LAYER_FUSES_RELU) applies in its own forward and backward (CPU only; never the
   last layer, whose output the caller reads): the ReLU is then a view, as Flatten, and
   is skipped. Same bits as running it. */
PDP__PRIVATE bool pdp__model_relu_fused(const pdp_model *m, int i)
{
    return m->device.kind == PDP_DEVICE_CPU && i > 0 && i < m->nlayers - 1 &&
           pdp__model_flag(m, i, PDP__LAYER_FUSABLE_RELU) &&
           pdp__model_flag(m, i - 1, PDP__LAYER_FUSES_RELU);
}

/* Layer i is a 2x2 stride-2 max pool (PDP__LAYER_FUSABLE_POOL: MaxPool2d) over an even
   H and W after a fused ReLU, which the Conv2d before that (PDP__LAYER_FUSES_POOL)
   applies too: the Conv2d writes this layer's output and saved winners, and takes its
   output's gradient; this layer is skipped, and the Conv2d's own output never exists.
   Same bits. */
PDP__PRIVATE bool pdp__model_pool_fused(const pdp_model *m, int i)
{
    const pdp__layer *l = &m->layers[i];
    return i > 1 && pdp__model_flag(m, i, PDP__LAYER_FUSABLE_POOL) && l->kernel == 2 &&
           l->stride == 2 && l->in_shape[1] % 2 == 0 && l->in_shape[2] % 2 == 0 &&
           pdp__model_relu_fused(m, i - 1) && pdp__model_flag(m, i - 2, PDP__LAYER_FUSES_POOL);
}

/* Layer i is a GELU (PDP__LAYER_FUSABLE_GELU) that the layer before it (a Linear:
   PDP__LAYER_FUSES_GELU) applies in its own forward and backward (CPU only): the Linear
   writes this layer's output beside its own (the GELU's input, which the GELU's backward
   reads) and takes this layer's output gradient; this layer is skipped. Same bits. */
PDP__PRIVATE bool pdp__model_gelu_fused(const pdp_model *m, int i)
{
    return m->device.kind == PDP_DEVICE_CPU && i > 0 &&
           pdp__model_flag(m, i, PDP__LAYER_FUSABLE_GELU) &&
           pdp__model_flag(m, i - 1, PDP__LAYER_FUSES_GELU);
}

/* Layer i is applied by a layer before it, which writes its output (a fused pool or
   GELU): skipped in forward and backward. */
PDP__PRIVATE bool pdp__model_applied_before(const pdp_model *m, int i)
{
    return pdp__model_pool_fused(m, i) || pdp__model_gelu_fused(m, i);
}

/* Layer i is the Conv2d that applies the pool two layers on (pdp__model_pool_fused). */
PDP__PRIVATE bool pdp__model_pools(const pdp_model *m, int i)
{
    return i + 2 < m->nlayers && pdp__model_pool_fused(m, i + 2);
}

/* Layer i's output is its input seen again (PDP__LAYER_VIEW: Flatten; a fused ReLU):
   no buffer, no call. */
PDP__PRIVATE bool pdp__model_is_view(const pdp_model *m, int i)
{
    return pdp__model_flag(m, i, PDP__LAYER_VIEW | PDP__LAYER_FORWARD_VIEW) ||
           pdp__model_relu_fused(m, i);
}

/* Layer i runs in backward: not a view, or a view whose backward has work
   (PDP__LAYER_FORWARD_VIEW: a Residual), and not a pool a Conv2d applied or a GELU a
   Linear applied. */
PDP__PRIVATE bool pdp__model_runs_backward(const pdp_model *m, int i)
{
    return (!pdp__model_is_view(m, i) || pdp__model_flag(m, i, PDP__LAYER_FORWARD_VIEW)) &&
           !pdp__model_applied_before(m, i);
}

/* The model has a residual region (a kind that needs grad_skip). */
PDP__PRIVATE bool pdp__model_has_skip(const pdp_model *m)
{
    int i;
    for (i = 0; i < m->nlayers; i++)
        if (pdp__model_flag(m, i, PDP__LAYER_SKIP)) return true;
    return false;
}

/* Layer i's output needs a buffer: not a view, and not a Conv2d whose pool is fused. */
PDP__PRIVATE bool pdp__model_has_output(const pdp_model *m, int i)
{
    return !pdp__model_is_view(m, i) && !pdp__model_pools(m, i);
}

/* Per-sample floats of the activation buffers (one plan for pdp_model_reserve and for
   DP's memory accounting): outputs of the layers that are not views, what forward
   keeps for backward, the largest workspace, and the widest activation (the two
   gradient ping-pong buffers). saved_off, when not NULL, gets each layer's offset. */
typedef struct pdp__model_plan {
    int64_t act, saved, work, widest;
    int64_t kept_act, kept_saved; /* of act and saved, what outlives a forward; the rest is
                                     the scratch of recomputed regions (FULL) */
} pdp__model_plan;

/* *acc += v, or INT64_MAX (which stays) past PDP__COUNT_MAX: reserve then fails. */
PDP__PRIVATE void pdp__model_plan_add(int64_t *acc, int64_t v)
{
    if (!pdp__add_ok(*acc, v, acc)) *acc = INT64_MAX;
}

/* Layer i is inside a residual region that FULL recomputation runs again in backward:
   after its Residual, before its ResidualAdd. */
PDP__PRIVATE bool pdp__model_recomputed(const pdp_model *m, int i)
{
    int k;
    if (m->recompute != PDP_RECOMPUTE_FULL || pdp__model_flag(m, i, PDP__LAYER_SKIP)) return false;
    for (k = i - 1; k >= 0; k--) /* the nearest region mark before it: a Residual opens */
        if (pdp__model_flag(m, k, PDP__LAYER_SKIP))
            return pdp__model_flag(m, k, PDP__LAYER_FORWARD_VIEW);
    return false;
}

/* FULL: the first layer of the region whose forward backward runs again before layer i's
   backward (i its ResidualAdd; the region is layers [that, i)), or -1. */
PDP__PRIVATE int pdp__model_recompute_from(const pdp_model *m, int i)
{
    if (i == 0 || !pdp__model_recomputed(m, i - 1) || pdp__model_recomputed(m, i)) return -1;
    return m->layers[i].residual_from + 1;
}

PDP__PRIVATE pdp__model_plan pdp__model_plan_of(const pdp_model *m, int64_t *saved_off)
{
    pdp__model_plan p;
    int64_t ract = 0, rsaved = 0, scratch_act = 0, scratch_saved = 0;
    int i;
    p.act = p.saved = p.work = 0;
    p.widest = m->in_count;
    for (i = 0; i < m->nlayers; i++) {
        const pdp__layer *l = &m->layers[i];
        if (pdp__model_recomputed(m, i)) { /* in the region scratch, from its start */
            if (pdp__model_has_output(m, i)) pdp__model_plan_add(&ract, l->out_count);
            if (saved_off) saved_off[i] = rsaved; /* the kept part is added below */
            pdp__model_plan_add(&rsaved, l->saved_per_sample);
            scratch_act = PDP__MAX(scratch_act, ract);
            scratch_saved = PDP__MAX(scratch_saved, rsaved);
        } else {
            ract = rsaved = 0;
            if (pdp__model_has_output(m, i)) pdp__model_plan_add(&p.act, l->out_count);
            if (saved_off) saved_off[i] = -1 - p.saved; /* marked: kept */
            pdp__model_plan_add(&p.saved, l->saved_per_sample);
        }
        p.work = PDP__MAX(p.work, pdp__layer_work_per_sample(l, m->device));
        p.widest = PDP__MAX(p.widest, l->out_count);
    }
    p.kept_act = p.act;
    p.kept_saved = p.saved;
    for (i = 0; saved_off && i < m->nlayers; i++) /* kept first, then the region scratch */
        saved_off[i] = saved_off[i] < 0 ? -1 - saved_off[i] : p.kept_saved + saved_off[i];
    pdp__model_plan_add(&p.act, scratch_act);
    pdp__model_plan_add(&p.saved, scratch_saved);
    return p;
}


/* Points the outputs of the layers that are not views at activation set m->slot. */
PDP__PRIVATE void pdp__model_bind_acts(pdp_model *m)
{
    int64_t act = 0, ract = 0, kept = pdp__model_plan_of(m, NULL).kept_act;
    int i;
    for (i = 0; i < m->nlayers; i++) {
        bool inner = pdp__model_recomputed(m, i);
        if (!inner) ract = 0; /* each recomputed region starts the scratch again */
        if (!pdp__model_has_output(m, i)) {
            if (!pdp__model_is_view(m, i)) m->act[i] = NULL; /* a Conv2d whose pool is fused */
            continue;
        }
        m->act[i] = m->act_block + m->slot * m->act_stride + m->max_batch * (inner ? kept + ract
                                                                                  : act);
        if (inner) ract += m->layers[i].out_count;
        else act += m->layers[i].out_count;
    }
}

PDP_API pdp_status pdp_model_reserve(pdp_model *m, int64_t max_batch)
{
    int64_t b = max_batch, k, n[4], sum;
    pdp__model_plan p;
    pdp_status st;
    if (!m) return pdp__err(PDP_ERR_INVALID, "pdp_model_reserve: model is NULL");
    if (max_batch < 1)
        return pdp__err(PDP_ERR_SHAPE, "pdp_model_reserve: batch %lld < 1", (long long)max_batch);
    if (max_batch <= m->max_batch) return PDP_OK;
    if ((st = pdp__model_check_idle(m, "pdp_model_reserve")) != PDP_OK) return st;
    pdp__model_free_buffers(m);
    m->act = (float **)pdp__calloc((size_t)(m->nlayers + 1) * sizeof *m->act);
    m->saved_off = (int64_t *)pdp__calloc((size_t)(m->nlayers + 1) * sizeof *m->saved_off);
    if (!m->act || !m->saved_off) goto oom;
    p = pdp__model_plan_of(m, m->saved_off);
    k = m->nslots > 1 ? m->nslots : 1; /* activation sets (pipeline stages keep several) */
    /* the floats of each buffer, and of all five (pdp__dp_model_bytes adds them up) */
    if (!pdp__mul3_ok(k, b, p.act, &n[0]) || !pdp__add_ok(n[0], 1, &n[0]) ||
        !pdp__mul3_ok(k, b, p.saved, &n[1]) || !pdp__add_ok(n[1], 1, &n[1]) ||
        !pdp__mul_ok(b, p.work, &n[2]) || !pdp__add_ok(n[2], 1, &n[2]) ||
        !pdp__mul_ok(b, p.widest, &n[3]) || !pdp__add_ok(n[0], n[1], &sum) ||
        !pdp__add_ok(sum, n[2], &sum) || !pdp__add_ok(sum, n[3], &sum) ||
        !pdp__add_ok(sum, n[3], &sum)) {
        pdp__model_free_buffers(m);
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "pdp_model_reserve: batch %lld needs more than "
                        "%lld floats of activations", (long long)b, (long long)PDP__COUNT_MAX);
    }
    if ((st = pdp__dev_alloc(m->device, (size_t)n[0] * 4, (void **)&m->act_block)) ||
        (st = pdp__dev_alloc(m->device, (size_t)n[1] * 4, (void **)&m->saved_block)) ||
        (st = pdp__dev_alloc(m->device, (size_t)n[2] * 4, (void **)&m->work_block)) ||
        (st = pdp__dev_alloc(m->device, (size_t)n[3] * 4, (void **)&m->grad_a)) ||
        (st = pdp__dev_alloc(m->device, (size_t)n[3] * 4, (void **)&m->grad_b)) ||
        (pdp__model_has_skip(m) &&
         (st = pdp__dev_alloc(m->device, (size_t)n[3] * 4, (void **)&m->grad_skip)))) {
        pdp__model_free_buffers(m);
        return pdp__err_wrap(st, "pdp_model_reserve: batch %lld", (long long)b);
    }
    m->max_batch = b;
    m->act_stride = b * p.act;
    m->saved_stride = b * p.saved;
    if (m->slot >= k) m->slot = 0;
    pdp__model_bind_acts(m);
    return PDP_OK;
oom:
    pdp__model_free_buffers(m);
    return pdp__err(PDP_ERR_OUT_OF_MEMORY, "pdp_model_reserve: no memory for batch %lld",
                    (long long)b);
}

/* ---- model: forward and backward ---- */

/* What layer i's forward keeps for its backward, in the current activation set. */
PDP__PRIVATE float *pdp__model_saved(const pdp_model *m, int i)
{
    return m->saved_block + m->slot * m->saved_stride + m->max_batch * m->saved_off[i];
}

/* Fills the per-call part of io for layer i. */
PDP__PRIVATE void pdp__model_io(const pdp_model *m, int i, pdp__layer_io *io)
{
    const pdp__layer *l = &m->layers[i];
    memset(io, 0, sizeof *io);
    io->batch = m->batch;
    io->saved = pdp__model_saved(m, i);
    io->work = m->work_block;
    io->device = m->device;
    io->training = m->training;
    io->bf16 = m->precision == PDP_PRECISION_BF16;
    io->seed = m->seed;
    io->step = m->step;
    io->sample_base = m->sample_base;
    io->fused_relu = i + 1 < m->nlayers && pdp__model_relu_fused(m, i + 1);
    if (i + 1 < m->nlayers && pdp__model_gelu_fused(m, i + 1)) io->gelu_y = m->act[i + 1];
    if (pdp__model_pools(m, i)) {
        io->pool_y = m->act[i + 2];
        io->pool_arg = (int32_t *)(void *)pdp__model_saved(m, i + 2);
    }
    if (pdp__model_flag(m, i, PDP__LAYER_SKIP)) { /* a Residual reads dskip only */
        if (!pdp__model_flag(m, i, PDP__LAYER_FORWARD_VIEW))
            io->skip = m->act[m->layers[i].residual_from]; /* the Residual's output: the
                                                               region's input seen again */
        io->dskip = m->grad_skip;
    }
    if (pdp__model_flag(m, i, PDP__LAYER_TIED)) { /* another layer's parameter */
        const pdp__param_entry *w = &m->params[l->tied_param];
        int owner = w->layer - m->layers[0].index; /* a pipeline stage's layers keep full's */
        io->w = m->layer_w && m->layer_w[owner] ? m->layer_w[owner] : m->param_block + w->offset;
        io->dw = m->layer_dw && m->layer_dw[owner] ? m->layer_dw[owner]
                                                   : m->grad_block + w->offset;
    } else if (l->nparams > 0) {
        const pdp__param_entry *w = &m->params[l->param_first];
        io->w = m->layer_w && m->layer_w[i] ? m->layer_w[i] : m->param_block + w->offset;
        io->dw = m->layer_dw && m->layer_dw[i] ? m->layer_dw[i] : m->grad_block + w->offset;
        if (l->nparams > 1) {
            io->b = io->w + w->count;
            io->db = io->dw + w->count;
        }
    }
}

/* Layer i computes with parameters: its own, or another layer's (PDP__LAYER_TIED). The
   executor seam's per-layer events fire for these layers. */
PDP__PRIVATE bool pdp__model_uses_params(const pdp_model *m, int i)
{
    return m->layers[i].nparams > 0 || pdp__model_flag(m, i, PDP__LAYER_TIED);
}

/* A trace event "forward 3 Linear" on the model's track (DDP sets it), t0 to now. */
PDP__PRIVATE void pdp__model_trace(const pdp_model *m, const char *what, int i, double t0)
{
    char name[48];
    snprintf(name, sizeof name, "%s %d %s", what, i, pdp__layer_kind_name(m->layers[i].kind));
    pdp__trace_complete(m->trace_pid, m->trace_tid, "compute", name, t0, pdp__now(), NULL);
}

/* The profile's split (pdp_profile): a layer with weights counts as GEMM work. */
PDP__PRIVATE void pdp__model_profile(const pdp__layer *l, double t0)
{
    double dt = pdp__now() - t0;
    if (l->nparams > 0) pdp__prof.gemm_layers_s += dt;
    else pdp__prof.other_layers_s += dt;
}

/* Forward through layers [lo, hi) from in (layer lo's input), firing ev before each layer
   with parameters: FORWARD_LAYER in a forward, RECOMPUTE_LAYER when FULL recomputation runs
   a region again inside backward. */
PDP__PRIVATE pdp_status pdp__model_forward_layers(pdp_model *m, int lo, int hi, const float *in,
                                                  pdp__model_event ev)
{
    double t0;
    int i;
    pdp_status st;
    for (i = lo; i < hi; i++) {
        const pdp__layer *l = &m->layers[i];
        pdp__layer_io io;
        if (pdp__model_is_view(m, i)) { /* y is x */
            m->act[i] = (float *)in;
            continue;
        }
        if (pdp__model_applied_before(m, i)) { /* the Conv2d or Linear wrote y */
            in = m->act[i];
            continue;
        }
        if (m->event && pdp__model_uses_params(m, i) &&
            (st = m->event(m->event_user, m, ev, i, PDP_OK)) != PDP_OK)
            return pdp__err_wrap(st, "pdp_model_forward: layer %d (%s)", i,
                                 pdp__layer_kind_name(l->kind));
        pdp__model_io(m, i, &io);
        io.x = in;
        io.y = m->act[i];
        t0 = m->trace_tid || m->layer_s || pdp__prof.on ? pdp__now() : 0.0;
        if ((st = pdp__layer_forward(l, &io)) != PDP_OK)
            return pdp__err_wrap(st, "pdp_model_forward: layer %d (%s)", i,
                                 pdp__layer_kind_name(l->kind));
        if (m->trace_tid)
            pdp__model_trace(m, ev == PDP__EV_FORWARD_LAYER ? "forward" : "recompute", i, t0);
        if (m->layer_s) m->layer_s[i] += pdp__now() - t0;
        if (pdp__prof.on) pdp__model_profile(l, t0);
        in = io.y;
    }
    return PDP_OK;
}

PDP_API pdp_status pdp_model_forward(pdp_model *m, const pdp_tensor *x, const pdp_tensor **y)
{
    int64_t batch, shape[4], n;
    int d;
    pdp_status st;
    if (!m || !x || !y) return pdp__err(PDP_ERR_INVALID, "pdp_model_forward: NULL argument");
    *y = NULL;
    if ((st = pdp__model_check_idle(m, "pdp_model_forward")) != PDP_OK) return st;
    m->have_forward = false; /* until this forward is whole: a failed one leaves no backward */
    if (m->nlayers == 0)
        return pdp__err(PDP_ERR_STATE, "pdp_model_forward: the model has no layers");
    if ((st = pdp__model_check_whole(m, "pdp_model_forward")) != PDP_OK) return st;
    if (m->open_residual >= 0)
        return pdp__err(PDP_ERR_STATE, "pdp_model_forward: the residual region opened at layer "
                        "%d is never closed (pdp_model_residual_end)", m->open_residual);
    if (x->dtype != m->in_dtype)
        return pdp__err(PDP_ERR_INVALID, "pdp_model_forward: layer 0 (%s) takes %s inputs, got "
                        "%s", pdp__layer_kind_name(m->layers[0].kind),
                        pdp_dtype_name(m->in_dtype), pdp_dtype_name(x->dtype));
    batch = x->shape[0];
    if (m->in_dtype == PDP_DTYPE_I32 && x->ndim == 2 && x->shape[1] > m->layers[0].context)
        return pdp__err(PDP_ERR_SHAPE, "pdp_model_forward: layer 0 (%s): a sequence of %lld "
                        "tokens is longer than the context of %lld",
                        pdp__layer_kind_name(m->layers[0].kind), (long long)x->shape[1],
                        (long long)m->layers[0].context);
    if (x->ndim != m->in_ndim + 1 || !pdp__mul_ok(batch, m->in_count, &n) || x->count != n)
        goto bad_shape;
    for (d = 0; d < m->in_ndim; d++)
        if (x->shape[d + 1] != m->in_shape[d]) goto bad_shape;
    if (x->device.kind != m->device.kind || x->device.ordinal != m->device.ordinal)
        return pdp__err(PDP_ERR_DEVICE, "pdp_model_forward: input on device %d:%d, model on %d:%d",
                        x->device.kind, x->device.ordinal, m->device.kind, m->device.ordinal);
    if ((st = pdp_model_reserve(m, batch)) != PDP_OK) return pdp__err_wrap(st, "pdp_model_forward");
    m->batch = batch;
    if (m->training) m->step++;
    if ((st = pdp__model_forward_layers(m, 0, m->nlayers, x->data, PDP__EV_FORWARD_LAYER)) !=
        PDP_OK)
        return st;
    m->act[m->nlayers] = (float *)x->data; /* remembered for backward */
    shape[0] = batch;
    for (d = 0; d < m->layers[m->nlayers - 1].out_ndim; d++)
        shape[d + 1] = m->layers[m->nlayers - 1].out_shape[d];
    pdp_tensor_wrap(m->act[m->nlayers - 1], m->device, d + 1, shape, &m->out_view);
    m->have_forward = true;
    *y = &m->out_view;
    return PDP_OK;
bad_shape:
    {
        char got[96], want[96];
        pdp_tensor expect;
        bool one = x->ndim == m->in_ndim; /* a sample without its batch dimension? */
        for (d = 0; one && d < m->in_ndim; d++) one = x->shape[d] == m->in_shape[d];
        shape[0] = x->shape[0];
        memcpy(shape + 1, m->in_shape, 3 * sizeof *shape);
        pdp__set_shape(&expect, m->in_ndim + 1, shape, 0);
        return pdp__err(PDP_ERR_SHAPE, "pdp_model_forward: layer 0 (%s) expects %s, got %s%s",
                        pdp__layer_kind_name(m->layers[0].kind),
                        pdp__shape_str(&expect, want, sizeof want),
                        pdp__shape_str(x, got, sizeof got), one ? " (one sample without the "
                        "batch dimension: give it as [1, ...])" : "");
    }
}

PDP_API pdp_status pdp_model_backward(pdp_model *m, const pdp_tensor *dy)
{
    double t0;
    const float *g;
    int i, p;
    pdp_status st;
    if (!m || !dy) return pdp__err(PDP_ERR_INVALID, "pdp_model_backward: NULL argument");
    if (!m->have_forward)
        return pdp__err(PDP_ERR_STATE, "pdp_model_backward: no forward to go back through (none "
                        "since the last backward, or it failed, or layers were added or "
                        "pdp_model_reserve re-planned the memory since)");
    if (dy->dtype != PDP_DTYPE_F32)
        return pdp__err(PDP_ERR_INVALID, "pdp_model_backward: dy holds %s, not float32",
                        pdp_dtype_name(dy->dtype));
    if (!pdp__same_device(dy->device, m->device))
        return pdp__err(PDP_ERR_DEVICE, "pdp_model_backward: dy on device %d:%d, model on %d:%d",
                        dy->device.kind, dy->device.ordinal, m->device.kind, m->device.ordinal);
    /* the shape, not only the count: a transposed [C, B] or flattened [B C] dy of the right
       count would be read as [B, C] rows, a wrong gradient with PDP_OK */
    if (!pdp__same_shape(dy, &m->out_view)) {
        char a[96], b[96];
        return pdp__err(PDP_ERR_SHAPE, "pdp_model_backward: dy is %s, the output was %s (dy "
                        "takes the output's shape)", pdp__shape_str(dy, a, sizeof a),
                        pdp__shape_str(&m->out_view, b, sizeof b));
    }
    if (m->event && (st = m->event(m->event_user, m, PDP__EV_BACKWARD_BEGIN, -1, PDP_OK)))
        return pdp__err_wrap(st, "pdp_model_backward");
    m->have_forward = false;
    m->in_backward = true; /* until it returns: the grad hooks may call in (check_idle) */
    g = dy->data;
    st = PDP_OK;
    for (i = m->nlayers - 1; i >= 0; i--) {
        const pdp__layer *l = &m->layers[i];
        pdp__layer_io io;
        int from = pdp__model_recompute_from(m, i);
        if (from >= 0 && (st = pdp__model_forward_layers(m, from, i, m->act[from - 1],
                                                         PDP__EV_RECOMPUTE_LAYER)) != PDP_OK) {
            /* FULL: the region's forward again, from its kept input, before layer i's event
               (an executor's event readies what layer i's backward reads) */
            st = pdp__err_wrap(st, "pdp_model_backward: recomputing layers %d..%d", from, i - 1);
            break;
        }
        if (m->event && pdp__model_uses_params(m, i) &&
            (st = m->event(m->event_user, m, PDP__EV_BACKWARD_LAYER, i, PDP_OK)) != PDP_OK) {
            st = pdp__err_wrap(st, "pdp_model_backward: layer %d (%s)", i,
                               pdp__layer_kind_name(l->kind));
            break;
        }
        if (pdp__model_runs_backward(m, i)) {
            pdp__model_io(m, i, &io);
            io.x = i ? m->act[i - 1] : m->act[m->nlayers];
            io.y = m->act[i];
            io.dy = g;
            io.dx = i ? (g == m->grad_a ? m->grad_b : m->grad_a) : m->input_grad;
            if (pdp__model_flag(m, i, PDP__LAYER_TAKES_IDS)) io.dx = NULL; /* ids: none */
            /* a ResidualAdd's input gradient is dy itself: it only sends dy around the
               branch (dskip), and g, left as it is, goes on into the branch: no copy */
            if (pdp__model_flag(m, i, PDP__LAYER_SKIP) &&
                !pdp__model_flag(m, i, PDP__LAYER_FORWARD_VIEW))
                io.dx = NULL;
            t0 = m->trace_tid || m->layer_s || pdp__prof.on ? pdp__now() : 0.0;
            if ((st = pdp__layer_backward(l, &io)) != PDP_OK) {
                st = pdp__err_wrap(st, "pdp_model_backward: layer %d (%s)", i,
                                   pdp__layer_kind_name(l->kind));
                break;
            }
            if (m->trace_tid) pdp__model_trace(m, "backward", i, t0);
            if (m->layer_s) m->layer_s[i] += pdp__now() - t0;
            if (pdp__prof.on) pdp__model_profile(l, t0);
            if (io.dx) g = io.dx;
        }
        if (m->hook || m->exec_hook)
            for (p = l->param_first + l->nparams - 1; p >= l->param_first; p--) {
                if (m->hook) m->hook(m->hook_user, m, p);
                if (m->exec_hook) m->exec_hook(m->exec_hook_user, m, p);
            }
    }
    /* a pipeline stage whose first layers are views: its input gradient is dy seen again */
    if (st == PDP_OK && m->input_grad && g != m->input_grad)
        st = pdp__dev_copy(m->device, m->input_grad, m->device, g,
                           (size_t)(m->batch * m->in_count) * sizeof(float));
    if (m->event) m->event(m->event_user, m, PDP__EV_BACKWARD_END, -1, st);
    m->in_backward = false;
    return st;
}

PDP_API pdp_status pdp_model_backward_dx(pdp_model *m, const pdp_tensor *dy, pdp_tensor *dx)
{
    const char *fn = "pdp_model_backward_dx";
    char a[96];
    pdp_status st;
    if (!m || !dy || !dx) return pdp__err(PDP_ERR_INVALID, "%s: NULL argument", fn);
    if (m->in_dtype != PDP_DTYPE_F32)
        return pdp__err(PDP_ERR_INVALID, "%s: the model's input is %s token ids: they have no "
                        "gradient", fn, pdp_dtype_name(m->in_dtype));
    if (m->input_grad)
        return pdp__err(PDP_ERR_STATE, "%s: an executor (a pipeline stage) owns this model's "
                        "input gradient", fn);
    if (!m->have_forward)
        return pdp_model_backward(m, dy); /* its message */
    if (dx->dtype != PDP_DTYPE_F32 || !pdp__same_device(dx->device, m->device) ||
        dx->count != m->batch * m->in_count)
        return pdp__err(PDP_ERR_INVALID, "%s: dx is %s %s on device %d:%d; the input was "
                        "%lld float32 elements ([%lld, %lld]) on %d:%d", fn,
                        pdp_dtype_name(dx->dtype), pdp__shape_str(dx, a, sizeof a),
                        dx->device.kind, dx->device.ordinal,
                        (long long)(m->batch * m->in_count), (long long)m->batch,
                        (long long)m->in_count, m->device.kind, m->device.ordinal);
    m->input_grad = dx->data; /* layer 0's backward writes it (model.c's backward) */
    st = pdp_model_backward(m, dy);
    m->input_grad = NULL;
    return st == PDP_OK ? PDP_OK : pdp__err_wrap(st, "%s", fn);
}

/* A hash (FNV-1a over 32-bit words) of m's parameters but those skip(m, p) names (NULL:
   none), for ranks that must hold the same bits (a TP group's replicated tensors, every
   rank's copy of a pipeline's model); 0 when the parameters are not here (ZeRO-3 holds
   them as shards). A GPU model's tensors are copied to the host one at a time. */
PDP__PRIVATE pdp_status pdp__model_param_hash(const pdp_model *m,
                                              bool (*skip)(const pdp_model *, int),
                                              uint64_t *out)
{
    uint64_t h = 0xcbf29ce484222325u;
    float *host = NULL;
    int64_t i, most = 0;
    pdp_status st = PDP_OK;
    int p;
    *out = 0;
    if (!m->param_block) return PDP_OK;
    for (p = 0; p < m->nparams; p++)
        if (!skip || !skip(m, p)) most = PDP__MAX(most, m->params[p].count);
    if (m->device.kind != PDP_DEVICE_CPU &&
        !(host = (float *)pdp__alloc((size_t)PDP__MAX(1, most) * sizeof *host)))
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "comparing the ranks' parameters: no memory for "
                        "%lld floats", (long long)most);
    for (p = 0; p < m->nparams && st == PDP_OK; p++) {
        const pdp__param_entry *e = &m->params[p];
        const float *v = m->param_block + e->offset;
        if (skip && skip(m, p)) continue;
        if (host && (st = pdp__dev_copy(pdp_cpu(), host, m->device, v,
                                        (size_t)e->count * sizeof *host)) != PDP_OK)
            break;
        if (host) v = host;
        for (i = 0; i < e->count; i++) {
            uint32_t u;
            memcpy(&u, &v[i], sizeof u);
            h = (h ^ u) * 0x100000001b3u;
        }
    }
    pdp__dealloc(host);
    *out = h | 1u;
    return st;
}

PDP_API void pdp_model_zero_grad(pdp_model *m)
{
    if (!m) return;
    /* DDP and ZeRO: their collectives waited for, and ZeRO's own gradients zeroed */
    if (m->event) (void)m->event(m->event_user, m, PDP__EV_ZERO_GRAD, -1, PDP_OK);
    if (m->param_count && m->grad_block) /* NULL: ZeRO holds the gradients */
        pdp__dev_memset0(m->device, m->grad_block, (size_t)m->param_count * sizeof(float));
}

PDP_API void pdp_model_set_training(pdp_model *m, bool training)
{
    if (m) m->training = training;
}

PDP_API bool pdp_model_is_training(const pdp_model *m) { return m && m->training; }

PDP_API pdp_status pdp_model_set_precision(pdp_model *m, pdp_precision precision)
{
    if (!m) return pdp__err(PDP_ERR_INVALID, "pdp_model_set_precision: model is NULL");
    if (precision != PDP_PRECISION_FP32 && precision != PDP_PRECISION_BF16)
        return pdp__err(PDP_ERR_INVALID, "pdp_model_set_precision: unknown precision %d",
                        (int)precision);
    m->precision = precision;
    return PDP_OK;
}

PDP_API pdp_precision pdp_model_precision(const pdp_model *m)
{
    return m ? m->precision : PDP_PRECISION_FP32;
}

PDP_API void pdp_model_set_grad_hook(pdp_model *m, pdp_grad_hook fn, void *user)
{
    if (!m) return;
    m->hook = fn;
    m->hook_user = user;
}

/* ---- model: queries ---- */

PDP_API int pdp_model_num_layers(const pdp_model *m) { return m ? m->nlayers : 0; }

PDP_API const char *pdp_model_layer_name(const pdp_model *m, int layer)
{
    if (!m || layer < 0 || layer >= m->nlayers) return NULL;
    return pdp__layer_kind_name(m->layers[layer].kind);
}

PDP_API int pdp_model_output_shape(const pdp_model *m, int64_t shape[3])
{
    const pdp__layer *l;
    if (!m) return 0;
    if (!m->nlayers) {
        memcpy(shape, m->in_shape, 3 * sizeof *shape);
        return m->in_ndim;
    }
    l = &m->layers[m->nlayers - 1];
    memcpy(shape, l->out_shape, 3 * sizeof *shape);
    return l->out_ndim;
}

PDP_API int64_t pdp_model_param_count(const pdp_model *m) { return m ? m->param_count : 0; }
PDP_API int pdp_model_num_params(const pdp_model *m) { return m ? m->nparams : 0; }
PDP_API pdp_device pdp_model_device(const pdp_model *m) { return m ? m->device : pdp_cpu(); }

/* A view of count floats at data (1-d; the parameter's shape when full), or an empty
   one (data NULL, count 0) where data is NULL: a block the executor took away. */
PDP__PRIVATE void pdp__model_view(float *data, pdp_device d, const pdp__param_entry *e, bool full,
                                  int64_t count, pdp_tensor *out)
{
    memset(out, 0, sizeof *out);
    out->device = d;
    out->ndim = 1;
    out->shape[1] = out->shape[2] = out->shape[3] = 1;
    if (!data) return;
    if (full) {
        pdp_tensor_wrap(data, d, e->ndim, e->shape, out);
        return;
    }
    out->data = data;
    out->shape[0] = out->count = count;
}

PDP_API pdp_status pdp_model_param(const pdp_model *m, int index, pdp_param *out)
{
    const pdp__param_entry *e;
    if (!m || !out) return pdp__err(PDP_ERR_INVALID, "pdp_model_param: NULL argument");
    if (index < 0 || index >= m->nparams)
        return pdp__err(PDP_ERR_INVALID, "pdp_model_param: index %d outside 0..%d", index,
                        m->nparams - 1);
    e = &m->params[index];
    memset(out, 0, sizeof *out);
    out->name = e->name;
    out->layer = e->layer;
    out->offset = e->offset;
    out->ndim = e->ndim;
    memcpy(out->shape, e->shape, sizeof out->shape);
    out->count = e->count;
    pdp__model_view(m->param_block ? m->param_block + e->offset : NULL, m->device, e, true,
                    e->count, &out->value);
    pdp__model_view(m->grad_block ? m->grad_block + e->offset : NULL, m->device, e, true,
                    e->count, &out->grad);
    out->value_hi = m->param_block ? e->count : 0;
    out->grad_hi = m->grad_block ? e->count : 0;
    return m->views ? m->views(m->views_user, m, index, out, "pdp_model_param") : PDP_OK;
}

PDP_API pdp_status pdp_model_find_param(const pdp_model *m, const char *name, pdp_param *out)
{
    int i;
    if (!m || !name || !out)
        return pdp__err(PDP_ERR_INVALID, "pdp_model_find_param: NULL argument");
    for (i = 0; i < m->nparams; i++)
        if (strcmp(m->params[i].name, name) == 0) return pdp_model_param(m, i, out);
    return pdp__err(PDP_ERR_INVALID, "pdp_model_find_param: no parameter named \"%s\"", name);
}

PDP_API pdp_status pdp_model_flat(const pdp_model *m, pdp_tensor *params, pdp_tensor *grads)
{
    static const char *fn = "pdp_model_flat";
    int64_t n;
    if (!m) return pdp__err(PDP_ERR_INVALID, "%s: model is NULL", fn);
    if (!m->param_count) return pdp__err(PDP_ERR_STATE, "%s: the model has no parameters", fn);
    /* ZeRO: the flat blocks a view would show are not what the rank holds */
    if (params && (!m->param_block || (m->wrapped == PDP__WRAP_ZERO && m->wrap_stage == 3)))
        return pdp__err(PDP_ERR_STATE, "%s: the model is wrapped by %s, which keeps only this "
                        "rank's slices of the parameters (the gathered copy of "
                        "pdp_zero_gather_params is gone at the next step): gather them into "
                        "memory of yours with pdp_zero_gather_params(z, dst); pdp_model_param "
                        "views this rank's part of each (or pass params NULL)", fn,
                        pdp__model_wrapper(m));
    if (grads && !m->grad_block)
        return pdp__err(PDP_ERR_STATE, "%s: the model is wrapped by %s, which keeps the reduced "
                        "gradients only in this rank's slices: pdp_model_param views this "
                        "rank's part of each parameter's gradient, pdp_zero_clip_grad_norm "
                        "clips them (or pass grads NULL)", fn, pdp__model_wrapper(m));
    n = m->param_count;
    if (params) pdp_tensor_wrap(m->param_block, m->device, 1, &n, params);
    if (grads) pdp_tensor_wrap(m->grad_block, m->device, 1, &n, grads);
    return PDP_OK;
}

/* ---- model: memory ---- */

PDP_API int64_t pdp_model_activation_bytes(const pdp_model *m, int lo, int hi, int64_t batch)
{
    int64_t floats = 0;
    int i;
    if (!m || batch < 1) return 0;
    lo = PDP__MAX(lo, 0);
    hi = PDP__MIN(hi, m->nlayers);
    for (i = lo; i < hi; i++) {
        if (pdp__model_recomputed(m, i)) continue; /* FULL: in the region scratch, not kept */
        if (pdp__model_has_output(m, i)) pdp__model_plan_add(&floats, m->layers[i].out_count);
        pdp__model_plan_add(&floats, m->layers[i].saved_per_sample);
    }
    return floats > INT64_MAX / 4 / batch ? INT64_MAX : floats * 4 * batch;
}

/* Renames parameter p (a builder's names: pdp_gpt_create's nanoGPT ones). A name that is
   empty, too long or already another parameter's is PDP_ERR_INVALID. */
PDP__PRIVATE pdp_status pdp__model_rename_param(pdp_model *m, int p, const char *name)
{
    int i;
    if (!name[0] || strlen(name) >= sizeof m->params[p].name)
        return pdp__err(PDP_ERR_INVALID, "parameter name \"%s\" is empty or longer than %d "
                        "characters", name, (int)sizeof m->params[p].name - 1);
    for (i = 0; i < m->nparams; i++)
        if (i != p && strcmp(m->params[i].name, name) == 0)
            return pdp__err(PDP_ERR_INVALID, "parameter name \"%s\" is taken (parameter %d)",
                            name, i);
    snprintf(m->params[p].name, sizeof m->params[p].name, "%s", name);
    return PDP_OK;
}

/* ---- model: replicas ---- */

PDP__PRIVATE pdp_status pdp__model_clone(const pdp_model *src, pdp_device device, bool share_params,
                                         pdp_model **out)
{
    pdp_model *m;
    size_t bytes = (size_t)src->param_count * sizeof(float);
    pdp_status st;
    *out = NULL;
    if (share_params && device.kind != src->device.kind)
        return pdp__err(PDP_ERR_DEVICE, "a replica can share parameters only on the same device");
    m = (pdp_model *)pdp__calloc(sizeof *m);
    if (!m) return pdp__err(PDP_ERR_OUT_OF_MEMORY, "no memory for a replica");
    *m = *src;
    m->device = device;
    m->layers = NULL;
    m->params = NULL;
    m->param_block = m->grad_block = NULL;
    m->cap_param_block = m->cap_grad_block = NULL; /* its blocks hold param_count */
    m->param_cap = 0;
    m->act = NULL;
    m->saved_off = NULL;
    m->act_block = m->saved_block = m->work_block = m->grad_a = m->grad_b = NULL;
    m->grad_skip = NULL;
    m->max_batch = 0;
    m->hook = NULL;
    m->hook_user = NULL;
    m->exec_hook = NULL;
    m->exec_hook_user = NULL;
    m->event = NULL;
    m->event_user = NULL;
    m->layer_w = m->layer_dw = NULL;
    m->trace_tid = 0;
    m->have_forward = false;
    m->nslots = m->slot = 0;
    m->input_grad = NULL;
    m->layer_s = NULL;
    m->wrapped = PDP__WRAP_NONE; /* the executor holds src; a replica is its own */
    m->wrap_stage = 0;
    m->views = NULL;
    m->views_user = NULL;
    m->params_shared = share_params;
    m->cap_layers = src->nlayers;
    m->cap_params = src->nparams;
    m->layers = (pdp__layer *)pdp__alloc((size_t)PDP__MAX(1, src->nlayers) * sizeof *m->layers);
    m->params =
        (pdp__param_entry *)pdp__alloc((size_t)PDP__MAX(1, src->nparams) * sizeof *m->params);
    if (!m->layers || !m->params) {
        pdp_model_free(m);
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "no memory for a replica");
    }
    memcpy(m->layers, src->layers, (size_t)src->nlayers * sizeof *m->layers);
    memcpy(m->params, src->params, (size_t)src->nparams * sizeof *m->params);
    if (bytes) {
        if (share_params) {
            m->param_block = src->param_block;
        } else if ((st = pdp__dev_alloc(device, bytes, (void **)&m->param_block)) != PDP_OK ||
                   (st = pdp__dev_copy(device, m->param_block, src->device, src->param_block,
                                       bytes)) != PDP_OK) {
            pdp_model_free(m);
            return st;
        }
        if ((st = pdp__dev_alloc(device, bytes, (void **)&m->grad_block)) != PDP_OK ||
            (st = pdp__dev_memset0(device, m->grad_block, bytes)) != PDP_OK) {
            pdp_model_free(m);
            return st;
        }
    }
    *out = m;
    return PDP_OK;
}

/* A model with full's layers and parameter registry and a zeroed parameter block, no
   gradients, no executor: the staging copy pp.c saves and loads the full model's
   checkpoint through (with_block false: the layout alone, which a pipeline keeps). */
PDP__PRIVATE pdp_status pdp__model_layout(const pdp_model *full, bool with_block, pdp_model **out)
{
    pdp_model *m;
    pdp_status st;
    *out = NULL;
    m = (pdp_model *)pdp__calloc(sizeof *m);
    if (!m) return pdp__err(PDP_ERR_OUT_OF_MEMORY, "no memory for a model's layout");
    m->device = full->device;
    m->seed = full->seed;
    m->init_rng = full->init_rng;
    m->in_ndim = full->in_ndim;
    memcpy(m->in_shape, full->in_shape, sizeof m->in_shape);
    m->in_count = full->in_count;
    m->in_dtype = full->in_dtype;
    m->recompute = full->recompute;
    m->open_residual = -1;
    m->training = full->training;
    m->precision = full->precision;
    m->step = full->step;
    m->nlayers = m->cap_layers = full->nlayers;
    m->nparams = m->cap_params = full->nparams;
    m->param_count = full->param_count;
    m->layers = (pdp__layer *)pdp__alloc((size_t)PDP__MAX(1, full->nlayers) * sizeof *m->layers);
    m->params =
        (pdp__param_entry *)pdp__alloc((size_t)PDP__MAX(1, full->nparams) * sizeof *m->params);
    if (!m->layers || !m->params) {
        pdp_model_free(m);
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "no memory for a model's layout");
    }
    memcpy(m->layers, full->layers, (size_t)full->nlayers * sizeof *m->layers);
    memcpy(m->params, full->params, (size_t)full->nparams * sizeof *m->params);
    if (with_block && m->param_count &&
        ((st = pdp__dev_alloc(m->device, (size_t)m->param_count * sizeof(float),
                              (void **)&m->param_block)) != PDP_OK ||
         (st = pdp__dev_memset0(m->device, m->param_block,
                                (size_t)m->param_count * sizeof(float))) != PDP_OK)) {
        pdp_model_free(m);
        return st;
    }
    *out = m;
    return PDP_OK;
}

/* ---- model: pipeline stages ---- */

PDP__PRIVATE pdp_status pdp__model_stage(const pdp_model *full, int lo, int hi, pdp_model **out)
{
    pdp_model *m;
    int p0, p1, i, tied = -1;
    int64_t off0;
    size_t bytes;
    pdp_status st;
    *out = NULL;
    PDP_ASSERT(0 <= lo && lo < hi && hi <= full->nlayers);
    for (i = lo; i < hi; i++) { /* what a stage cannot cut through */
        const pdp__layer *l = &full->layers[i];
        const unsigned f = pdp__layer_kind_of(l->kind)->flags;
        if ((f & PDP__LAYER_SKIP) && (f & PDP__LAYER_FORWARD_VIEW) == 0 && l->residual_from < lo)
            return pdp__err(PDP_ERR_UNSUPPORTED, "a stage starting at layer %d cuts the residual "
                            "region of layers %d..%d: cut between regions", lo, l->residual_from,
                            i);
        if ((f & PDP__LAYER_SKIP) && (f & PDP__LAYER_FORWARD_VIEW) && i + 1 < full->nlayers) {
            int end = i + 1;
            while (end < full->nlayers && full->layers[end].residual_from != i) end++;
            if (end >= hi && end < full->nlayers)
                return pdp__err(PDP_ERR_UNSUPPORTED, "a stage ending before layer %d cuts the "
                                "residual region of layers %d..%d: cut between regions", hi, i,
                                end);
        }
        if ((f & PDP__LAYER_TIED) && full->params[l->tied_param].layer < lo) {
            if (tied >= 0)
                return pdp__err(PDP_ERR_UNSUPPORTED, "layers of a stage tie two parameters of "
                                "earlier stages (%s and %s); a stage keeps one copy",
                                full->params[tied].name, full->params[l->tied_param].name);
            tied = l->tied_param;
        }
    }
    p0 = full->layers[lo].param_first;
    p1 = hi < full->nlayers ? full->layers[hi].param_first : full->nparams;
    off0 = p0 < full->nparams ? full->params[p0].offset : full->param_count;
    m = (pdp_model *)pdp__calloc(sizeof *m);
    if (!m) return pdp__err(PDP_ERR_OUT_OF_MEMORY, "no memory for a stage");
    m->device = full->device;
    m->seed = full->seed;
    m->init_rng = full->init_rng;
    m->in_ndim = full->layers[lo].in_ndim;
    memcpy(m->in_shape, full->layers[lo].in_shape, sizeof m->in_shape);
    m->in_count = full->layers[lo].in_count;
    m->training = full->training;
    m->precision = full->precision;
    m->nlayers = m->cap_layers = hi - lo;
    /* a tied weight of an earlier stage: a copy of it, this stage's last parameter (Megatron's
       word embeddings on the last stage; pp.c sums the two copies' gradients every step) */
    m->nparams = m->cap_params = p1 - p0 + (tied >= 0);
    m->layers = (pdp__layer *)pdp__alloc((size_t)m->nlayers * sizeof *m->layers);
    m->params = (pdp__param_entry *)pdp__alloc((size_t)PDP__MAX(1, m->nparams) * sizeof *m->params);
    if (!m->layers || !m->params) {
        pdp_model_free(m);
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "no memory for a stage");
    }
    memcpy(m->layers, full->layers + lo, (size_t)m->nlayers * sizeof *m->layers);
    for (i = 0; i < m->nlayers; i++) {
        m->layers[i].param_first -= p0;
        m->layers[i].residual_from -= lo;
        m->layers[i].tied_param = m->layers[i].tied_param == tied && tied >= 0
                                      ? m->nparams - 1 /* the copy */
                                      : m->layers[i].tied_param - p0;
    }
    m->in_dtype = lo == 0 ? full->in_dtype : PDP_DTYPE_F32;
    m->recompute = full->recompute;
    m->open_residual = -1;
    if (full->tp.comm) { /* PP x TP: the stage's TP layers on a TP state of its own */
        m->tp = full->tp;
        m->tp.model = m;
        m->tp.nlayers = m->tp.checked = 0;
        m->tp.dscalar = NULL;
        memset(&m->tp.stats, 0, sizeof m->tp.stats);
        for (i = 0; i < m->nlayers; i++)
            if (m->layers[i].tp) {
                m->layers[i].tp = &m->tp;
                m->tp.nlayers += !pdp__model_flag(m, i, PDP__LAYER_HEADWISE);
            }
        if (m->device.kind != PDP_DEVICE_CPU &&
            (st = pdp__dev_alloc(m->device, sizeof(float), (void **)&m->tp.dscalar)) != PDP_OK) {
            pdp_model_free(m);
            return st;
        }
    }
    for (i = 0; i < p1 - p0; i++) {
        m->params[i] = full->params[p0 + i];
        m->params[i].offset -= off0;
        m->param_count += m->params[i].count;
    }
    if (tied >= 0) {
        pdp__param_entry *e = &m->params[m->nparams - 1];
        *e = full->params[tied];
        e->offset = m->param_count;
        for (i = 0; i < m->nlayers; i++) /* the TiedLinear that uses it owns the copy (full's
                                            layer index, as every stage parameter's) */
            if (pdp__model_flag(m, i, PDP__LAYER_TIED) && m->layers[i].tied_param == m->nparams - 1)
                e->layer = lo + i;
        m->param_count += e->count;
    }
    bytes = (size_t)m->param_count * sizeof(float);
    if (bytes && ((st = pdp__dev_alloc(m->device, bytes, (void **)&m->param_block)) != PDP_OK ||
                  (st = pdp__dev_copy(m->device, m->param_block, full->device,
                                      full->param_block + off0,
                                      bytes - (tied >= 0 ? (size_t)full->params[tied].count *
                                                              sizeof(float)
                                                         : 0))) != PDP_OK ||
                  (tied >= 0 &&
                   (st = pdp__dev_copy(m->device, m->param_block + m->params[m->nparams - 1].offset,
                                       full->device, full->param_block + full->params[tied].offset,
                                       (size_t)full->params[tied].count * sizeof(float))) !=
                       PDP_OK) ||
                  (st = pdp__dev_alloc(m->device, bytes, (void **)&m->grad_block)) != PDP_OK ||
                  (st = pdp__dev_memset0(m->device, m->grad_block, bytes)) != PDP_OK)) {
        pdp_model_free(m);
        return st;
    }
    *out = m;
    return PDP_OK;
}

PDP__PRIVATE pdp_status pdp__model_set_slots(pdp_model *m, int nslots)
{
    pdp__model_free_buffers(m);
    m->nslots = nslots;
    m->slot = 0;
    return PDP_OK;
}

PDP__PRIVATE void pdp__model_use_slot(pdp_model *m, int slot, const float *x, int64_t batch,
                                      bool forwarded)
{
    int64_t shape[4];
    int i, d;
    PDP_ASSERT(slot >= 0 && slot < PDP__MAX(1, m->nslots) && m->act);
    m->slot = slot;
    pdp__model_bind_acts(m);
    if (!forwarded) return;
    for (i = 0; i < m->nlayers; i++) /* views see their input again, as forward left them */
        if (pdp__model_is_view(m, i)) m->act[i] = i ? m->act[i - 1] : (float *)x;
    m->act[m->nlayers] = (float *)x;
    m->batch = batch;
    shape[0] = batch;
    for (d = 0; d < m->layers[m->nlayers - 1].out_ndim; d++)
        shape[d + 1] = m->layers[m->nlayers - 1].out_shape[d];
    pdp_tensor_wrap(m->act[m->nlayers - 1], m->device, d + 1, shape, &m->out_view);
    m->have_forward = true;
}
