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
    int n = snprintf(name, sizeof name, "%s.%s", prefix, what);
    if (n < 0 || (size_t)n >= sizeof name) /* a layer count of 10^40 would not fit */
        return pdp__err(PDP_ERR_INVALID, "pdp_gpt_create: the name %s.%s is too long", prefix,
                        what);
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
    PDP__GPT_TRY(d->gelu_erf ? pdp_model_add_gelu_erf(m) : pdp_model_add_gelu(m));
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

/* A rank's parameters in a GPT under TP over n ranks (n = 1: the whole model's): the
   embeddings, the LayerNorms and the row-parallel Linears' biases whole on every rank, the
   rest cut n ways: V C + context C + 2 C + layers (6 C + (12 C^2 + 7 C) / n). 0 when a
   count overflows (pdp__mul_ok's bound) or a size is below 1. pdp_gpt_create reserves it;
   test_gpt holds it to the built count. */
PDP__PRIVATE int64_t pdp__gpt_rank_param_count(const pdp_gpt_desc *d, int n)
{
    int64_t V = d->vocab ? d->vocab : 256, C = d->dim, emb, pos, cc, block, sum;
    if (V < 1 || C < 1 || d->context < 1 || d->layers < 1 || n < 1) return 0;
    if (!pdp__mul_ok(V, C, &emb) || !pdp__mul_ok(d->context, C, &pos) ||
        !pdp__mul3_ok(12, C, C, &cc) || !pdp__add_ok(cc, 7 * C, &block) || /* C, 12 C^2 fit */
        !pdp__add_ok(6 * C, block / n, &block) || !pdp__mul_ok(d->layers, block, &block) ||
        !pdp__add_ok(emb, pos, &sum) || !pdp__add_ok(sum, 2 * C, &sum) ||
        !pdp__add_ok(sum, block, &sum))
        return 0;
    return sum;
}

/* *d = *desc with its defaults resolved (vocab 256, sequence = context), or PDP_ERR_INVALID
   prefixed fn for a field pdp_gpt_create refuses before it builds anything: what
   pdp_gpt_desc_format and pdp_gpt_create check alike. */
PDP__PRIVATE pdp_status pdp__gpt_check(const pdp_gpt_desc *desc, pdp_gpt_desc *d, const char *fn)
{
    *d = *desc;
    if (d->vocab == 0) d->vocab = 256;
    if (d->sequence == 0) d->sequence = d->context;
    if (d->vocab < 1 || d->vocab > INT32_MAX)
        return pdp__err(PDP_ERR_INVALID, "%s: vocab %lld is outside [1, 2^31)", fn,
                        (long long)d->vocab);
    if (d->context < 1 || d->layers < 1 || d->heads < 1 || d->dim < 1)
        return pdp__err(PDP_ERR_INVALID, "%s: context %lld, layers %d, heads %d and dim %lld "
                        "are required (each >= 1)", fn, (long long)d->context, d->layers,
                        d->heads, (long long)d->dim);
    if (d->sequence < 1 || d->sequence > d->context)
        return pdp__err(PDP_ERR_INVALID, "%s: sequence %lld is outside [1, context %lld]", fn,
                        (long long)d->sequence, (long long)d->context);
    if (d->dim % d->heads != 0)
        return pdp__err(PDP_ERR_INVALID, "%s: heads %d do not divide dim %lld", fn, d->heads,
                        (long long)d->dim);
    if (pdp__gpt_rank_param_count(d, 1) == 0)
        return pdp__err(PDP_ERR_INVALID, "%s: vocab %lld, context %lld, layers %d and dim %lld "
                        "make more than %lld parameters", fn, (long long)d->vocab,
                        (long long)d->context, d->layers, (long long)d->dim,
                        (long long)PDP__COUNT_MAX);
    if (!(d->dropout >= 0.0f && d->dropout < 1.0f))
        return pdp__err(PDP_ERR_INVALID, "%s: dropout %g is outside [0, 1)", fn,
                        (double)d->dropout);
    if ((unsigned)d->recompute > PDP_RECOMPUTE_FULL)
        return pdp__err(PDP_ERR_INVALID, "%s: recompute %d (must be NONE, SELECTIVE or FULL)", fn,
                        (int)d->recompute);
    if (d->precision != PDP_PRECISION_FP32 && d->precision != PDP_PRECISION_BF16)
        return pdp__err(PDP_ERR_INVALID, "%s: precision %d (must be FP32 or BF16)", fn,
                        (int)d->precision);
    if (d->sequence_parallel && !d->tp)
        return pdp__err(PDP_ERR_INVALID, "%s: sequence_parallel shards the sequence over the TP "
                        "ranks and needs desc.tp (NULL; sequence %lld)", fn,
                        (long long)d->sequence);
    if (d->tp && d->heads % pdp_comm_size(d->tp) != 0)
        return pdp__err(PDP_ERR_INVALID, "%s: %d heads do not divide by the TP size %d: a rank "
                        "holds whole heads", fn, d->heads, pdp_comm_size(d->tp));
    if (d->sequence_parallel && d->sequence % pdp_comm_size(d->tp) != 0)
        return pdp__err(PDP_ERR_INVALID, "%s: sequence_parallel: sequence %lld does not divide "
                        "by the TP size %d: each rank holds T / N positions", fn,
                        (long long)d->sequence, pdp_comm_size(d->tp));
    return PDP_OK;
}

PDP_API int64_t pdp_gpt_param_count(const pdp_gpt_desc *desc)
{
    return desc && desc->vocab >= 0 ? pdp__gpt_rank_param_count(desc, 1) : 0;
}

PDP_API pdp_status pdp_gpt_desc_format(const pdp_gpt_desc *desc, char *buf, size_t bytes)
{
    const char *fn = "pdp_gpt_desc_format";
    static const char *modes[3] = {"none", "selective", "full"};
    pdp_gpt_desc resolved, *d = &resolved;
    char vocab[32] = "", seq[32] = "", drop[32] = "", tp[32] = ""; /* what is not a default */
    bool cpu_bf16;
    int n;
    pdp_status st;
    if (!desc || !buf)
        return pdp__err(PDP_ERR_INVALID, "%s: %s is NULL", fn, desc ? "buf" : "desc");
    if ((st = pdp__gpt_check(desc, d, fn)) != PDP_OK) return st;
    if (d->vocab != 256) snprintf(vocab, sizeof vocab, ", vocab %lld", (long long)d->vocab);
    if (d->sequence != d->context)
        snprintf(seq, sizeof seq, ", sequence %lld", (long long)d->sequence);
    if (d->dropout > 0) snprintf(drop, sizeof drop, ", dropout %g", (double)d->dropout);
    if (d->tp)
        snprintf(tp, sizeof tp, ", TP %d%s", pdp_comm_size(d->tp),
                 d->sequence_parallel ? " + SP" : "");
    cpu_bf16 = d->precision == PDP_PRECISION_BF16 && d->device.kind == PDP_DEVICE_CPU;
    n = snprintf(buf, bytes, "GPT %d layers, %d heads, dim %lld, context %lld%s%s%s%s: %lld "
                 "parameters%s, %s%s%s, recompute %s", d->layers, d->heads, (long long)d->dim,
                 (long long)d->context, vocab, seq, drop, d->gelu_erf ? ", GELU erf" : "",
                 (long long)pdp_gpt_param_count(d), tp,
                 d->precision == PDP_PRECISION_BF16 ? "bf16" : "fp32", cpu_bf16 ? " " : "",
                 cpu_bf16 ? pdp_bf16_path_name(pdp_bf16_best_path()) : "", modes[d->recompute]);
    if (n < 0 || (size_t)n >= bytes)
        return pdp__err(PDP_ERR_INVALID, "%s: %zu bytes do not hold the line", fn, bytes);
    return PDP_OK;
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
    if ((st = pdp__gpt_check(desc, &d, fn)) != PDP_OK) return st;
    memset(&md, 0, sizeof md);
    md.input_shape[0] = d.sequence;
    md.input_dtype = PDP_DTYPE_I32;
    md.seed = d.seed;
    md.device = d.device;
    md.precision = d.precision;
    md.recompute = d.recompute;
    if ((st = pdp_model_create(&m, &md)) != PDP_OK) goto fail; /* m NULL */
    if (d.tp && (st = pdp_model_set_tp(m, d.tp)) != PDP_OK) goto fail;
    if ((st = pdp__model_reserve_params(m, pdp__gpt_rank_param_count(
             &d, d.tp ? pdp_comm_size(d.tp) : 1))) != PDP_OK) /* its layers fill it in place */
        goto fail;
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
    if ((st = pdp__model_fit_params(m)) != PDP_OK || /* built: no spare capacity */
        (st = d.tp ? pdp__gpt_init_tp(m, &d) : pdp__gpt_init(m, &d)) != PDP_OK)
        goto fail;
    /* collective over desc.tp: a rank that failed alone (its model on another device than
       the communicator, no memory) would leave its peers to wait in their first TP
       collective until the timeout; every rank learns of it here instead */
    if (d.tp && (st = pdp__comm_agree(d.tp, PDP_OK, fn)) != PDP_OK) {
        pdp_model_free(m);
        return st;
    }
    *out = m;
    return PDP_OK;
fail:
    pdp_model_free(m);
    st = pdp__err_wrap(st, "%s", fn);
    return d.tp ? pdp__comm_agree(d.tp, st, fn) : st;
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
    float *p, *z = NULL; /* z: off the CPU, the logits back on the host */
    bool training, cpu = m && m->device.kind == PDP_DEVICE_CPU;
    pdp_tensor x, *dx = NULL; /* off the CPU: the window as ids on the model's device */
    const pdp_tensor *y;
    pdp_status st = PDP_OK;
    if (!m || !ids || !r) return pdp__err(PDP_ERR_INVALID, "%s: NULL argument", fn);
    if (m->in_dtype != PDP_DTYPE_I32 || m->nlayers == 0)
        return pdp__err(PDP_ERR_INVALID, "%s: the model does not take token ids", fn);
    if (n < 1 || n_new < 0 || !(temperature >= 0.0f && temperature <= FLT_MAX) || top_k < 0)
        return pdp__err(PDP_ERR_INVALID, "%s: n %lld (>= 1), n_new %lld (>= 0), temperature %g "
                        "(finite, >= 0) and top_k %d (>= 0)", fn, (long long)n,
                        (long long)n_new, (double)temperature, top_k);
    T = m->in_shape[0];
    if (m->layers[m->nlayers - 1].out_ndim != 2 || m->layers[m->nlayers - 1].out_shape[0] != T)
        return pdp__err(PDP_ERR_INVALID, "%s: the model gives %d-D samples of %lld; generation "
                        "reads a row of logits per position, [T %lld, vocab]", fn,
                        m->layers[m->nlayers - 1].out_ndim,
                        (long long)m->layers[m->nlayers - 1].out_count, (long long)T);
    V = m->layers[m->nlayers - 1].out_shape[1];
    window = (int32_t *)pdp__calloc((size_t)T * sizeof *window);
    p = (float *)pdp__alloc((size_t)V * sizeof *p);
    if (!cpu) z = (float *)pdp__alloc((size_t)(T * V) * sizeof *z);
    if (!window || !p || (!cpu && !z)) /* its own message: the end adds fn */
        st = pdp__err(PDP_ERR_OUT_OF_MEMORY, "no memory for a window of %lld tokens and %lld "
                      "logits", (long long)T, (long long)V);
    shape[0] = 1;
    shape[1] = T;
    if (st == PDP_OK && !cpu) st = pdp_tensor_create_ids(&dx, m->device, 2, shape);
    training = m->training;
    m->training = false;
    if (st == PDP_OK) pdp_tensor_wrap_ids(window, pdp_cpu(), 2, shape, &x);
    for (k = 0; k < n_new && st == PDP_OK; k++) {
        int64_t len = n + k, first = len > T ? len - T : 0;
        for (i = 0; i < T; i++) window[i] = first + i < len ? ids[first + i] : 0; /* pad */
        if (dx && (st = pdp_tensor_upload(dx, window)) != PDP_OK) break;
        if ((st = pdp_model_forward(m, dx ? dx : &x, &y)) != PDP_OK) break;
        if (dx && (st = pdp_tensor_download(y, z)) != PDP_OK) break;
        at = len - first - 1; /* the last real position */
        ids[len] = pdp__gpt_pick((dx ? z : y->data) + at * V, V, temperature, top_k, p, r);
    }
    m->training = training;
    m->have_forward = false;
    pdp__dealloc(window);
    pdp__dealloc(p);
    pdp__dealloc(z);
    pdp_tensor_free(dx);
    return st == PDP_OK ? PDP_OK : pdp__err_wrap(st, "%s", fn);
}

PDP_API pdp_status pdp_gpt_generate_text(pdp_model *m, const char *prompt, int64_t n_new,
                                         float temperature, int top_k, pdp_rng *r, char *buf,
                                         size_t bytes)
{
    const char *fn = "pdp_gpt_generate_text";
    int64_t len, i;
    int32_t *ids;
    pdp_status st;
    if (!m || !prompt || !r || !buf) return pdp__err(PDP_ERR_INVALID, "%s: NULL argument", fn);
    len = (int64_t)strlen(prompt);
    if (m->nlayers < 1 || m->layers[m->nlayers - 1].out_ndim != 2 ||
        m->layers[m->nlayers - 1].out_shape[1] != 256)
        return pdp__err(PDP_ERR_INVALID, "%s: the model's vocabulary is not the 256 bytes", fn);
    if (len < 1 || n_new < 0 || bytes < 1 || (uint64_t)len > bytes - 1 ||
        (uint64_t)n_new > bytes - 1 - (size_t)len)
        return pdp__err(PDP_ERR_INVALID, "%s: prompt of %lld bytes (>= 1), n_new %lld (>= 0) and "
                        "%zu bytes of buf (the text needs %s%lld)", fn, (long long)len,
                        (long long)n_new, bytes, n_new < INT64_MAX - len ? "" : "more than ",
                        n_new < INT64_MAX - len ? (long long)(len + n_new + 1) : INT64_MAX);
    ids = (int32_t *)pdp__alloc((size_t)(len + n_new) * sizeof *ids);
    if (!ids) return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory", fn);
    for (i = 0; i < len; i++) ids[i] = (unsigned char)prompt[i];
    st = pdp_gpt_generate(m, ids, len, n_new, temperature, top_k, r);
    for (i = 0; i < len + n_new && st == PDP_OK; i++) /* a control byte as '?' */
        buf[i] = ids[i] == '\n' || ids[i] == '\t' || (ids[i] >= 32 && ids[i] != 127)
                 ? (char)(unsigned char)ids[i] : '?';
    buf[st == PDP_OK ? len + n_new : 0] = '\0';
    pdp__dealloc(ids);
    return st == PDP_OK ? PDP_OK : pdp__err_wrap(st, "%s", fn);
}

/* ---- gpt: evaluation ---- */

PDP_API pdp_status pdp_gpt_evaluate(pdp_model *m, const pdp_token_dataset *ds, pdp_split split,
                                    int64_t batch, int batches, uint64_t seed, float *loss)
{
    const char *fn = "pdp_gpt_evaluate";
    int64_t T, V, count, n_logits, shape[2], rows[2]; /* rows: the logits as [batch T, V] */
    int32_t *x = NULL, *y;
    float *host = NULL; /* off the CPU: the logits, back */
    pdp_tensor *dx = NULL;
    double sum = 0;
    bool training, cpu;
    pdp_status st = PDP_OK;
    pdp_rng r;
    int k;
    if (!m || !ds || !loss) return pdp__err(PDP_ERR_INVALID, "%s: NULL argument", fn);
    if (m->in_dtype != PDP_DTYPE_I32 || m->nlayers == 0 || m->in_shape[0] != ds->context)
        return pdp__err(PDP_ERR_INVALID, "%s: the model does not take windows of the dataset's "
                        "%lld tokens", fn, (long long)ds->context);
    if (batch < 1 || batches < 1)
        return pdp__err(PDP_ERR_INVALID, "%s: batch %lld and batches %d (>= 1)", fn,
                        (long long)batch, batches);
    T = ds->context, V = m->layers[m->nlayers - 1].out_shape[1];
    if (m->layers[m->nlayers - 1].out_ndim != 2 || m->layers[m->nlayers - 1].out_shape[0] != T)
        return pdp__err(PDP_ERR_INVALID, "%s: the model gives %d-D samples; the loss reads a "
                        "row of logits per position, [T %lld, vocab]", fn,
                        m->layers[m->nlayers - 1].out_ndim, (long long)T);
    if (!pdp__mul3_ok(2, batch, T, &count) || !pdp__mul3_ok(batch, T, V, &n_logits))
        return pdp__err(PDP_ERR_INVALID, "%s: batch %lld of %lld tokens, %lld logits each: the "
                        "count overflows", fn, (long long)batch, (long long)T, (long long)V);
    shape[0] = batch, shape[1] = T, count = batch * T, rows[0] = count, rows[1] = V;
    cpu = m->device.kind == PDP_DEVICE_CPU;
    x = (int32_t *)pdp__alloc((size_t)(2 * count) * sizeof *x);
    if (!cpu) host = (float *)pdp__alloc((size_t)n_logits * sizeof *host);
    if (!x || (!cpu && !host)) /* its own message: the end adds fn */
        st = pdp__err(PDP_ERR_OUT_OF_MEMORY, "no memory for %lld windows of %lld tokens",
                      (long long)batch, (long long)T);
    if (st == PDP_OK && !cpu) st = pdp_tensor_create_ids(&dx, m->device, 2, shape);
    y = x ? x + batch * T : NULL;
    training = m->training;
    pdp_model_set_training(m, false);
    pdp_rng_seed(&r, seed, 0);
    for (k = 0; k < batches && st == PDP_OK; k++) {
        pdp_tensor ids, back, logits2d;
        const pdp_tensor *logits;
        float l;
        if ((st = pdp_token_dataset_sample(ds, split, &r, batch, x, y)) != PDP_OK) break;
        pdp_tensor_wrap_ids(x, pdp_cpu(), 2, shape, &ids);
        if (dx && (st = pdp_tensor_upload(dx, x)) != PDP_OK) break; /* to the model's device */
        if ((st = pdp_model_forward(m, dx ? dx : &ids, &logits)) != PDP_OK) break; /* [b, T, V] */
        if (!cpu) {
            if ((st = pdp_tensor_download(logits, host)) != PDP_OK) break;
            pdp_tensor_wrap(host, pdp_cpu(), logits->ndim, logits->shape, &back);
            logits = &back;
        }
        pdp_tensor_reshape_view(logits, 2, rows, &logits2d);
        if ((st = pdp_loss_cross_entropy(&logits2d, y, &l, NULL)) != PDP_OK) break;
        sum += l;
    }
    pdp_model_set_training(m, training);
    pdp__dealloc(x);
    pdp__dealloc(host);
    pdp_tensor_free(dx);
    if (st != PDP_OK) return pdp__err_wrap(st, "%s", fn);
    *loss = (float)(sum / batches);
    return PDP_OK;
}

/* ---- gpt: the activation report ---- */

/* Megatron-LM's tensors of one transformer layer (Korthikanti et al. 2022, sec. 4): bytes
   per s b h at 16 bits (masks 1 byte; per a s s b for the attention scores'). TP splits the
   block's inside (split), sequence parallelism the rest too; selective recomputation drops
   the scores'; the masks and the dropped scores exist only with dropout (Megatron's count
   assumes it). */
static const struct pdp__gpt_meg {
    double bytes;
    bool split, scores, mask, dropped;
} pdp__gpt_meg[] = {
    {4, 0, 0, 0, 0},  /* LayerNorms' inputs */
    {4, 0, 0, 0, 0},  /* inputs of QKV and c_fc */
    {2, 0, 0, 1, 0},  /* 2 dropout masks */
    {6, 1, 0, 0, 0},  /* Q, K, V */
    {2, 1, 0, 0, 0},  /* c_proj's input */
    {16, 1, 0, 0, 0}, /* GELU's input and output */
    {2, 1, 1, 0, 0},  /* softmax output */
    {1, 1, 1, 1, 0},  /* its dropout mask */
    {2, 1, 1, 0, 1},  /* dropped scores */
};

PDP__PRIVATE void pdp__gpt_term(char *buf, size_t size, double c, const char *unit)
{
    size_t n = strlen(buf);
    if (c > 0) snprintf(buf + n, size - n, "%s%g%s", n ? " + " : "", c, unit);
}

/* Megatron's count of a layer in recomputation mode (0 none, 1 selective, 2 full: the
   layer's input, 2 in the paper's Table 2; under SP a rank holds its slice, 2/t), at 16 bits
   or (fp32) the same tensors at 4 bytes, masks 1 byte, masks and dropped scores only with
   dropout: its formula in bytes per sbh into f, its value at s, h, a, t as the result. */
PDP__PRIVATE double pdp__gpt_megatron(int mode, bool fp32, bool dropout, bool sp, double s,
                                      double h, double a, double t, char *f, size_t size)
{
    double rep = 0, split = 0, sc = 0;
    size_t i;
    for (i = 0; i < sizeof pdp__gpt_meg / sizeof pdp__gpt_meg[0] && mode < 2; i++) {
        const struct pdp__gpt_meg *e = &pdp__gpt_meg[i];
        if ((fp32 && (e->mask || e->dropped) && !dropout) || (mode == 1 && e->scores)) continue;
        *(e->scores ? &sc : e->split || sp ? &split : &rep) +=
            e->bytes * (fp32 && !e->mask ? 2 : 1); /* fp32: 4 bytes, masks 1 */
    }
    if (mode == 2) *(sp ? &split : &rep) = fp32 ? 4 : 2;
    if (t == 1) rep += split, split = 0;
    f[0] = '\0';
    pdp__gpt_term(f, size, rep, "");
    pdp__gpt_term(f, size, split, "/t");
    pdp__gpt_term(f, size, sc, t > 1 ? "as/(ht)" : "as/h");
    return rep + split / t + sc * a * s / (h * t);
}

PDP_API pdp_status pdp_gpt_activation_report(const pdp_model *m, const pdp_gpt_desc *desc,
                                             int64_t batch, char *buf, size_t bytes,
                                             int64_t *block_bytes)
{
    static const char *modes[3] = {"none", "selective", "full"};
    const char *fn = "pdp_gpt_activation_report";
    int tp = desc && desc->tp ? pdp_comm_size(desc->tp) : 1, lo = -1, hi = -1, adds = 0, i, col;
    bool sp, ok = true;
    double s, h, a, t = tp, sbh;
    size_t len = 0;
    int64_t kept;
    if (!m || !desc || !buf) /* what is wrong, and nothing else */
        return pdp__err(PDP_ERR_INVALID, "%s: %s is NULL", fn, !m ? "m" : !desc ? "desc" : "buf");
    if (batch < 1) return pdp__err(PDP_ERR_INVALID, "%s: batch %lld < 1", fn, (long long)batch);
    for (i = 0; i < m->nlayers && hi < 0; i++) { /* the first block */
        const char *name = pdp_model_layer_name(m, i);
        if (lo < 0 && !strcmp(name, "Residual")) lo = i;
        if (!strcmp(name, "ResidualAdd") && ++adds == 2) hi = i + 1;
    }
    if (lo < 0 || hi < 0) return pdp__err(PDP_ERR_INVALID, "%s: the model has no GPT block", fn);
    if (pdp__gpt_rank_param_count(desc, tp) != m->param_count || desc->recompute != m->recompute)
        return pdp__err(PDP_ERR_INVALID, "%s: desc does not describe the model: %lld parameters "
                        "a rank (TP %d) and recompute %d, the model %lld and %d", fn,
                        (long long)pdp__gpt_rank_param_count(desc, tp), tp, (int)desc->recompute,
                        (long long)m->param_count, (int)m->recompute);
    sp = desc->sequence_parallel && tp > 1;
    s = (double)m->in_shape[0], h = (double)desc->dim, a = desc->heads;
    sbh = s * (double)batch * h;
    kept = pdp_model_activation_bytes(m, lo, hi, batch);
    pdp__ckpt_put(buf, bytes, &len, &ok, "one block's activations (model layers %d-%d: those "
                  "that keep some below), s %g b %lld h "
                  "%g a %g, TP %d%s: bytes per sbh, MB\n  recompute  Megatron: 16-bit, 1-byte "
                  "masks      its tensors in fp32, p %s 0\n", lo, hi - 1, s, (long long)batch, h,
                  a, tp, sp ? " + SP" : "", desc->dropout > 0 ? ">" : "=");
    for (i = 0; i < 3; i++) {
        char f16[64], f32[64];
        double x16 = pdp__gpt_megatron(i, false, desc->dropout > 0, sp, s, h, a, t, f16, 64);
        double x32 = pdp__gpt_megatron(i, true, desc->dropout > 0, sp, s, h, a, t, f32, 64);
        pdp__ckpt_put(buf, bytes, &len, &ok, "  %-9s  %-20s %6.2f %6.2f   %-20s %6.2f %6.2f\n",
                      modes[i], f16, x16, x16 * sbh / 1e6, f32, x32, x32 * sbh / 1e6);
    }
    pdp__ckpt_put(buf, bytes, &len, &ok, "  pdp, recompute %s, the layer table:",
                  modes[desc->recompute]);
    for (col = 0, i = lo; i < hi; i++) { /* each layer that keeps something, in lines of ~80 */
        int64_t b = pdp_model_activation_bytes(m, i, i + 1, batch);
        size_t at = len;
        if (!b) continue;
        if (col > 80) col = 0;
        pdp__ckpt_put(buf, bytes, &len, &ok, "%s %s %.2f", col ? "" : "\n   ",
                      pdp_model_layer_name(m, i), (double)b / sbh);
        col += (int)(len - at);
    }
    pdp__ckpt_put(buf, bytes, &len, &ok, "\n    = %.2f, %.2f MB (pdp_model_activation_bytes)\n"
                  "  pdp keeps every layer's output in fp32, Megatron what backward reads at 16 "
                  "bits, so pdp also keeps\n  %s;\n  LayerNorm's mean and rstd (%s a block), "
                  "no mask for P (it is redrawn)%s; full keeps both regions' inputs: 8%s per "
                  "sbh\n", (double)kept / sbh, (double)kept / 1e6,
                  tp == 1 ? "c_proj's outputs (no backward reads them)"
                  : sp    ? "the row-parallel partial sums and g's slices (no backward reads "
                            "them), f's gathered sequence (Megatron: a slice)"
                          : "the row-parallel partial sums and g's sums (no backward reads "
                            "them), f's copies of LayerNorm's outputs", sp ? "16/(ht)" : "16/h",
                  desc->dropout > 0 ? ", Dropout's outputs in fp32 and its masks in 4 bytes"
                                    : "", sp ? "/t" : "");
    if (!ok) return pdp__err(PDP_ERR_INVALID, "%s: %zu bytes do not hold the report", fn, bytes);
    if (block_bytes) *block_bytes = kept;
    return PDP_OK;
}

PDP_API pdp_status pdp_gpt_tp_report(const pdp_gpt_desc *desc, int64_t batch,
                                     const pdp_tp_stats *s, char *buf, size_t bytes,
                                     double *formula_bytes)
{
    const char *fn = "pdp_gpt_tp_report";
    int64_t L, re, k;
    double t, sent, P; /* P in double: batch T dim 4 bytes may pass INT64_MAX */
    bool sp;
    int n;
    if (!desc || !desc->tp || !s || !buf)
        return pdp__err(PDP_ERR_INVALID, "%s: %s is NULL", fn,
                        !desc ? "desc" : !desc->tp ? "desc->tp" : !s ? "s" : "buf");
    if (batch < 1) return pdp__err(PDP_ERR_INVALID, "%s: batch %lld < 1", fn, (long long)batch);
    t = pdp_comm_size(desc->tp), sp = desc->sequence_parallel;
    L = desc->layers, re = desc->recompute == PDP_RECOMPUTE_FULL;
    P = (double)batch * (double)(desc->sequence ? desc->sequence : desc->context) *
        (double)desc->dim * 4.0;
    k = sp ? 8 * L + 2 + 4 * L * re : 4 * L + 2 * L * re; /* the collectives of P bytes */
    sent = (sp ? 1.0 : 2.0) * (t - 1) / t * ((double)k * P) +
           (sp ? 2.0 * (t - 1) / t * ((double)(2 * L + 1) * 8.0 * (double)desc->dim) : 0);
    n = snprintf(buf, bytes, "TP %g%s, one step: %lld %s of a %.3f MB tensor (%s; a rank sends "
                 "%s/t of each)%s, %.3f MB sent by this rank (formula %.3f)\n", t,
                 sp ? " + SP" : "",
                 (long long)(s->forward_allreduces + s->backward_allreduces + s->allgathers +
                             s->reduce_scatters),
                 sp ? "all-gathers and reduce-scatters" : "all-reduces", P / 1e6,
                 sp ? (re ? "12L + 2" : "8L + 2") : (re ? "6L" : "4L"), sp ? "(t-1)" : "2 (t-1)",
                 sp ? "\n  and the 2L + 1 LayerNorms' gradients all-reduced (each rank saw its "
                 "slice of the sequence)" : "", (double)s->bytes_sent / 1e6, sent / 1e6);
    if (n < 0 || (size_t)n >= bytes)
        return pdp__err(PDP_ERR_INVALID, "%s: %zu bytes do not hold the line", fn, bytes);
    if (formula_bytes) *formula_bytes = sent;
    return PDP_OK;
}

PDP_API pdp_status pdp_gpt_memory_report(const pdp_model *m, const struct pdp_zero_memory *mm,
                                         int64_t batch, char *buf, size_t bytes)
{
    const char *fn = "pdp_gpt_memory_report";
    static const char *state[3] = {"optimizer state", "momentum", "Adam's m, v"};
    int64_t act;
    double P4, n;
    int k, len;
    if (!m || !mm || !buf)
        return pdp__err(PDP_ERR_INVALID, "%s: %s is NULL", fn, !m ? "m" : !mm ? "mm" : "buf");
    if (batch < 1) return pdp__err(PDP_ERR_INVALID, "%s: batch %lld < 1", fn, (long long)batch);
    if (mm->world_size < 1 || mm->state_per_param < 0)
        return pdp__err(PDP_ERR_INVALID, "%s: a bad memory report (world_size %d < 1 or "
                        "state_per_param %d < 0)", fn, mm->world_size, mm->state_per_param);
    act = pdp_model_activation_bytes(m, 0, m->nlayers, batch);
    P4 = 4.0 * (double)mm->param_count, n = mm->world_size, k = mm->state_per_param;
    len = snprintf(buf, bytes, "parameters %.2f MB (4Psi%s %.2f), gradients %.2f (4Psi%s %.2f), "
                   "%s %.2f (%dPsi%s %.2f),\n  activations kept %.2f (%lld sequences), "
                   "buffers %.2f (at most %.2f): %.2f MB\n", (double)mm->param_bytes / 1e6,
                   mm->stage >= 3 ? "/N" : "", P4 / (mm->stage >= 3 ? n : 1) / 1e6,
                   (double)mm->grad_bytes / 1e6, mm->stage >= 2 ? "/N" : "",
                   P4 / (mm->stage >= 2 ? n : 1) / 1e6, state[k < 3 ? k : 0],
                   (double)mm->optim_bytes / 1e6, 4 * k, mm->stage >= 1 ? "/N" : "",
                   k * P4 / (mm->stage >= 1 ? n : 1) / 1e6, (double)act / 1e6, (long long)batch,
                   (double)mm->buffer_bytes / 1e6, (double)mm->buffer_bound / 1e6,
                   (double)(mm->total_bytes + act) / 1e6);
    if (len < 0 || (size_t)len >= bytes)
        return pdp__err(PDP_ERR_INVALID, "%s: %zu bytes do not hold the line", fn, bytes);
    return PDP_OK;
}
