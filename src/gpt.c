/* gpt: pdp_gpt_create and pdp_gpt_generate (gpt.h). The builder only calls model.h's
   public constructors, then names and initialises what they made: a GPT is a model like
   any other, and every executor sees its layers one by one. */

#include "internal.h"

/* ---- gpt: the builder ---- */

/* Names parameter p (the next one the builder made), "transformer.h.3.attn.c_attn" +
   ".weight". */
PDP__PRIVATE pdp_status pdp__gpt_name(pdp_model *m, int p, const char *prefix, const char *what)
{
    char name[64];
    snprintf(name, sizeof name, "%s.%s", prefix, what);
    return pdp__model_rename_param(m, p, name);
}

/* A Linear named prefix (weight, then bias). With desc.tp: column-parallel in split parts
   (3: q | k | v) or, for split -1, row-parallel. */
PDP__PRIVATE pdp_status pdp__gpt_linear(pdp_model *m, const pdp_gpt_desc *d, int64_t out,
                                        int split, const char *prefix)
{
    pdp_status st;
    int p = m->nparams;
    if ((st = !d->tp       ? pdp_model_add_linear(m, out)
              : split < 0 ? pdp_model_add_row_parallel_linear(m, out)
                          : pdp__tp_add_column(m, out, split, "pdp_gpt_create")) != PDP_OK ||
        (st = pdp__gpt_name(m, p, prefix, "weight")) != PDP_OK ||
        (st = pdp__gpt_name(m, p + 1, prefix, "bias")) != PDP_OK)
        return st;
    return PDP_OK;
}

PDP__PRIVATE pdp_status pdp__gpt_layernorm(pdp_model *m, const char *prefix)
{
    pdp_status st;
    int p = m->nparams;
    if ((st = pdp_model_add_layernorm(m, 1e-5f)) != PDP_OK ||
        (st = pdp__gpt_name(m, p, prefix, "weight")) != PDP_OK ||
        (st = pdp__gpt_name(m, p + 1, prefix, "bias")) != PDP_OK)
        return st;
    return PDP_OK;
}

/* Tensor parallel: f before a block's first split Linear, g after its last; with sequence
   parallelism f all-gathers the sequence (backward: reduce-scatter) and g reduce-scatters
   it (backward: all-gather). */
PDP__PRIVATE pdp_status pdp__gpt_f(pdp_model *m, const pdp_gpt_desc *d)
{
    if (!d->tp) return PDP_OK;
    return d->sequence_parallel ? pdp__tp_add_sequence(m, PDP__SEQ_GATHER, true, "pdp_gpt_create")
                                : pdp_model_add_tp_copy(m);
}
PDP__PRIVATE pdp_status pdp__gpt_g(pdp_model *m, const pdp_gpt_desc *d)
{
    if (!d->tp) return PDP_OK;
    return d->sequence_parallel
               ? pdp__tp_add_sequence(m, PDP__SEQ_REDUCE_SCATTER, false, "pdp_gpt_create")
               : pdp_model_add_tp_reduce(m);
}

/* Sequence parallel: the embedding's output cut to this rank's positions (scatter), or the
   final LayerNorm's gathered for the replicated head (gather). */
PDP__PRIVATE pdp_status pdp__gpt_sequence(pdp_model *m, const pdp_gpt_desc *d,
                                          pdp__layer_kind kind)
{
    return d->sequence_parallel ? pdp__tp_add_sequence(m, kind, false, "pdp_gpt_create") : PDP_OK;
}

PDP__PRIVATE pdp_status pdp__gpt_dropout(pdp_model *m, float p)
{
    return p > 0.0f ? pdp_model_add_dropout(m, p) : PDP_OK;
}

/* Block i: x = x + attn(ln_1(x)); x = x + mlp(ln_2(x)). */
PDP__PRIVATE pdp_status pdp__gpt_block(pdp_model *m, const pdp_gpt_desc *d, int i)
{
    char h[48], name[64];
    pdp_status st;
    snprintf(h, sizeof h, "transformer.h.%d", i);
#define PDP__GPT_TRY(call) \
    if ((st = (call)) != PDP_OK) return st
#define PDP__GPT_NAME(part) (snprintf(name, sizeof name, "%s.%s", h, part), name)
    PDP__GPT_TRY(pdp_model_residual_begin(m)); /* the attention's residual region */
    PDP__GPT_TRY(pdp__gpt_layernorm(m, PDP__GPT_NAME("ln_1")));
    PDP__GPT_TRY(pdp__gpt_f(m, d));
    PDP__GPT_TRY(pdp__gpt_linear(m, d, 3 * d->dim, 3, PDP__GPT_NAME("attn.c_attn")));
    PDP__GPT_TRY(pdp_model_add_causal_self_attention(m, d->heads, d->dropout));
    PDP__GPT_TRY(pdp__gpt_linear(m, d, d->dim, -1, PDP__GPT_NAME("attn.c_proj")));
    PDP__GPT_TRY(pdp__gpt_g(m, d));
    PDP__GPT_TRY(pdp__gpt_dropout(m, d->dropout));
    PDP__GPT_TRY(pdp_model_residual_end(m));
    PDP__GPT_TRY(pdp_model_residual_begin(m)); /* the MLP's */
    PDP__GPT_TRY(pdp__gpt_layernorm(m, PDP__GPT_NAME("ln_2")));
    PDP__GPT_TRY(pdp__gpt_f(m, d));
    PDP__GPT_TRY(pdp__gpt_linear(m, d, 4 * d->dim, 1, PDP__GPT_NAME("mlp.c_fc")));
    PDP__GPT_TRY(pdp_model_add_gelu(m));
    PDP__GPT_TRY(pdp__gpt_linear(m, d, d->dim, -1, PDP__GPT_NAME("mlp.c_proj")));
    PDP__GPT_TRY(pdp__gpt_g(m, d));
    PDP__GPT_TRY(pdp__gpt_dropout(m, d->dropout));
    PDP__GPT_TRY(pdp_model_residual_end(m));
#undef PDP__GPT_NAME
#undef PDP__GPT_TRY
    return PDP_OK;
}

/* GPT-2's initialisation (nanoGPT's _init_weights): weights and embeddings N(0, 0.02),
   the c_proj weights N(0, 0.02 / sqrt(2 layers)) (the residual branches' last
   products), biases 0, LayerNorms as created (1 and 0). On a CUDA device each draw goes
   through a host copy (pdp_tensor_normal's staging), so the parameters are the CPU's. */
PDP__PRIVATE pdp_status pdp__gpt_init(pdp_model *m, const pdp_gpt_desc *d)
{
    pdp_rng r;
    int p;
    pdp_status st;
    float std_proj = (float)(0.02 / sqrt(2.0 * (double)d->layers));
    pdp_rng_seed(&r, d->seed, 1);
    for (p = 0; p < m->nparams; p++) {
        pdp_param v;
        const char *name = m->params[p].name;
        size_t n = strlen(name);
        if ((st = pdp_model_param(m, p, &v)) != PDP_OK) return st;
        if (strstr(name, "ln_")) continue;
        st = n > 5 && strcmp(name + n - 5, ".bias") == 0
                 ? pdp_tensor_zeros(&v.value)
                 : pdp_tensor_normal(&v.value, &r, 0.0f,
                                     strstr(name, "c_proj.weight") ? std_proj : 0.02f);
        if (st != PDP_OK) return st;
    }
    return PDP_OK;
}

/* A TP GPT starts as the single-device GPT of the same desc: that one is built, drawn as
   pdp__gpt_init draws, and cut into this rank's slices (tp.c's scatter). */
PDP__PRIVATE pdp_status pdp__gpt_init_tp(pdp_model *m, const pdp_gpt_desc *d)
{
    pdp_gpt_desc one = *d;
    pdp_model *full = NULL;
    pdp_status st;
    one.tp = NULL;
    one.sequence_parallel = false;
    if ((st = pdp_gpt_create(&full, &one)) != PDP_OK) return st;
    st = pdp__tp_scatter(m, full, full->param_block, m->param_block);
    pdp_model_free(full);
    return st;
}

PDP_API pdp_status pdp_gpt_create(pdp_model **out, const pdp_gpt_desc *desc)
{
    const char *fn = "pdp_gpt_create";
    pdp_gpt_desc d;
    pdp_model_desc md;
    pdp_model *m = NULL;
    pdp_status st;
    int i;
    if (!out || !desc) return pdp__err(PDP_ERR_INVALID, "%s: NULL argument", fn);
    *out = NULL;
    d = *desc;
    if (d.vocab == 0) d.vocab = 256;
    if (d.sequence == 0) d.sequence = d.context;
    if (d.vocab < 1 || d.vocab > INT32_MAX)
        return pdp__err(PDP_ERR_INVALID, "%s: vocab %lld is outside [1, 2^31)", fn,
                        (long long)d.vocab);
    if (d.context < 1 || d.layers < 1 || d.heads < 1 || d.dim < 1)
        return pdp__err(PDP_ERR_INVALID, "%s: context %lld, layers %d, heads %d and dim %lld "
                        "are required (each >= 1)", fn, (long long)d.context, d.layers, d.heads,
                        (long long)d.dim);
    if (d.sequence < 1 || d.sequence > d.context)
        return pdp__err(PDP_ERR_INVALID, "%s: sequence %lld is outside [1, context %lld]", fn,
                        (long long)d.sequence, (long long)d.context);
    if (d.dim % d.heads != 0)
        return pdp__err(PDP_ERR_INVALID, "%s: heads %d do not divide dim %lld", fn, d.heads,
                        (long long)d.dim);
    if (!(d.dropout >= 0.0f && d.dropout < 1.0f))
        return pdp__err(PDP_ERR_INVALID, "%s: dropout %g is outside [0, 1)", fn,
                        (double)d.dropout);
    if (d.sequence_parallel && !d.tp)
        return pdp__err(PDP_ERR_INVALID, "%s: sequence_parallel shards the sequence over the TP "
                        "ranks and needs desc.tp (NULL; sequence %lld)", fn,
                        (long long)d.sequence);
    memset(&md, 0, sizeof md);
    md.input_shape[0] = d.sequence;
    md.input_dtype = PDP_DTYPE_I32;
    md.seed = d.seed;
    md.device = d.device;
    md.precision = d.precision;
    md.recompute = d.recompute;
    if ((st = pdp_model_create(&m, &md)) != PDP_OK) return pdp__err_wrap(st, "%s", fn);
    if (d.tp && (st = pdp_model_set_tp(m, d.tp)) != PDP_OK) goto fail;
    if (d.tp && d.heads % pdp_comm_size(d.tp) != 0) {
        st = pdp__err(PDP_ERR_INVALID, "%d heads do not divide by the TP size %d: a rank holds "
                      "whole heads", d.heads, pdp_comm_size(d.tp));
        goto fail;
    }
    if (d.sequence_parallel && d.sequence % pdp_comm_size(d.tp) != 0) {
        st = pdp__err(PDP_ERR_INVALID, "sequence_parallel: sequence %lld does not divide by the "
                      "TP size %d: each rank holds T / N positions", (long long)d.sequence,
                      pdp_comm_size(d.tp));
        goto fail;
    }
    if ((st = pdp_model_add_embedding(m, d.vocab, d.dim, d.context)) != PDP_OK ||
        (st = pdp__model_rename_param(m, 0, "transformer.wte.weight")) != PDP_OK ||
        (st = pdp__model_rename_param(m, 1, "transformer.wpe.weight")) != PDP_OK ||
        (st = pdp__gpt_sequence(m, &d, PDP__SEQ_SCATTER)) != PDP_OK ||
        (st = pdp__gpt_dropout(m, d.dropout)) != PDP_OK)
        goto fail;
    for (i = 0; i < d.layers; i++)
        if ((st = pdp__gpt_block(m, &d, i)) != PDP_OK) goto fail;
    if ((st = pdp__gpt_layernorm(m, "transformer.ln_f")) != PDP_OK ||
        (st = pdp__gpt_sequence(m, &d, PDP__SEQ_GATHER)) != PDP_OK ||
        (st = pdp_model_add_tied_linear(m, "transformer.wte.weight")) != PDP_OK)
        goto fail;
    if (d.sequence_parallel) pdp__tp_mark_sequence(m);
    if ((st = d.tp ? pdp__gpt_init_tp(m, &d) : pdp__gpt_init(m, &d)) != PDP_OK) goto fail;
    *out = m;
    return PDP_OK;
fail:
    pdp_model_free(m);
    return pdp__err_wrap(st, "%s", fn);
}

/* ---- gpt: generation ---- */

/* The next token from logits z[0..V): greedy at temperature 0, else a draw from
   softmax(z / temperature) over the top_k largest (all when top_k is 0 or >= V). */
PDP__PRIVATE int32_t pdp__gpt_pick(const float *z, int64_t V, float temperature, int top_k,
                                   float *p, pdp_rng *r)
{
    int64_t i, best = 0;
    float cut = -HUGE_VALF, mx;
    double sum = 0.0, u;
    for (i = 1; i < V; i++)
        if (z[i] > z[best]) best = i;
    if (temperature <= 0.0f) return (int32_t)best;
    if (top_k > 0 && top_k < V) { /* cut = the top_k-th largest logit, found by top_k
                                     passes of a selection (V and top_k are small) */
        int64_t k, j;
        for (i = 0; i < V; i++) p[i] = z[i];
        for (k = 0; k < top_k; k++) {
            for (j = -1, i = 0; i < V; i++)
                if (p[i] != -HUGE_VALF && (j < 0 || p[i] > p[j])) j = i;
            if (j < 0) break;
            cut = p[j];
            p[j] = -HUGE_VALF;
        }
    }
    mx = z[best];
    for (i = 0; i < V; i++) {
        p[i] = z[i] >= cut ? expf((z[i] - mx) / temperature) : 0.0f;
        sum += (double)p[i];
    }
    u = (double)pdp_rng_uniform(r) * sum;
    for (i = 0; i < V; i++) {
        u -= (double)p[i];
        if (u < 0.0 && p[i] > 0.0f) return (int32_t)i;
    }
    return (int32_t)best;
}

PDP_API pdp_status pdp_gpt_generate(pdp_model *m, int32_t *ids, int64_t n, int64_t n_new,
                                    float temperature, int top_k, pdp_rng *r)
{
    const char *fn = "pdp_gpt_generate";
    int64_t T, V, k, i, at, shape[2];
    int32_t *window;
    float *p;
    bool training;
    pdp_tensor x;
    const pdp_tensor *y;
    pdp_status st = PDP_OK;
    if (!m || !ids || !r) return pdp__err(PDP_ERR_INVALID, "%s: NULL argument", fn);
    if (m->in_dtype != PDP_DTYPE_I32 || m->nlayers == 0)
        return pdp__err(PDP_ERR_INVALID, "%s: the model does not take token ids", fn);
    if (m->device.kind != PDP_DEVICE_CPU)
        return pdp__err(PDP_ERR_UNSUPPORTED, "%s: the model must be on the CPU", fn);
    if (n < 1 || n_new < 0 || !(temperature >= 0.0f) || top_k < 0)
        return pdp__err(PDP_ERR_INVALID, "%s: n %lld (>= 1), n_new %lld (>= 0), temperature %g "
                        "and top_k %d (>= 0)", fn, (long long)n, (long long)n_new,
                        (double)temperature, top_k);
    T = m->in_shape[0];
    V = m->layers[m->nlayers - 1].out_shape[1];
    window = (int32_t *)pdp__calloc((size_t)T * sizeof *window);
    p = (float *)pdp__alloc((size_t)V * sizeof *p);
    if (!window || !p) {
        pdp__dealloc(window);
        pdp__dealloc(p);
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory", fn);
    }
    training = m->training;
    m->training = false;
    shape[0] = 1;
    shape[1] = T;
    pdp_tensor_wrap_ids(window, pdp_cpu(), 2, shape, &x);
    for (k = 0; k < n_new && st == PDP_OK; k++) {
        int64_t len = n + k, first = len > T ? len - T : 0;
        for (i = 0; i < T; i++) window[i] = first + i < len ? ids[first + i] : 0; /* pad */
        if ((st = pdp_model_forward(m, &x, &y)) != PDP_OK) break;
        at = len - first - 1; /* the last real position */
        ids[len] = pdp__gpt_pick(y->data + at * V, V, temperature, top_k, p, r);
    }
    m->training = training;
    m->have_forward = false;
    pdp__dealloc(window);
    pdp__dealloc(p);
    return st == PDP_OK ? PDP_OK : pdp__err_wrap(st, "%s", fn);
}
