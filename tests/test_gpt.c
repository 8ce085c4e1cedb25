/* Tests of the GPT as a model (pdp_gpt_create, gpt.h; the layer kinds of layers_gpt.c in
   model.c): against tools/gpt_reference.py's PyTorch GPT (tests/fixtures/gpt_*.bin: one
   forward and backward, a shorter sequence, 5 AdamW steps with clipping, autocast bf16),
   the causal mask through the whole model, gradients against finite differences, a
   residual region against its formula, generation, and every error a user can make.

   The fixture metric is tests/fixture.h's max |a - b| / max(max |b|, 1). The GPT is
   vocab 67, context 16, 2 layers, 4 heads, dim 48; ids and targets are stored as floats.

   cc -std=c99 -O2 -Itests -I. tests/test_gpt.c -lm -lpthread (or make) */
#define _POSIX_C_SOURCE 200809L
#define PDP_IMPLEMENTATION
#include "pdp.h"
#include "pdp_test.h"
#include "fixture.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

enum { V = 67, CTX = 16, L = 2, H = 4, C = 48, B = 3 };

/* the fixtures' GPT; sequence T (0: the context) */
static pdp_model *fixture_gpt_erf(int64_t T, pdp_precision precision, bool gelu_erf)
{
    pdp_gpt_desc d;
    pdp_model *m = NULL;
    memset(&d, 0, sizeof d);
    d.gelu_erf = gelu_erf;
    d.vocab = V;
    d.context = CTX;
    d.sequence = T;
    d.layers = L;
    d.heads = H;
    d.dim = C;
    d.precision = precision;
    return pdp_gpt_create(&m, &d) == PDP_OK ? m : NULL;
}

static pdp_model *fixture_gpt(int64_t T, pdp_precision precision)
{
    return fixture_gpt_erf(T, precision, false);
}

/* Every parameter of m from f's tensors named prefix + name; 0 when one is missing. */
static int load_params(pdp_model *m, const fixture *f, const char *prefix)
{
    int i;
    for (i = 0; i < pdp_model_num_params(m); i++) {
        pdp_param p;
        char name[96];
        const fixture_tensor *t;
        pdp_model_param(m, i, &p);
        snprintf(name, sizeof name, "%s%s", prefix, p.name);
        t = fixture_find(f, name);
        if (!t || t->count != p.count) return 0;
        memcpy(p.value.data, t->data, (size_t)t->count * sizeof(float));
    }
    return 1;
}

/* ids or targets stored as floats, as int32 */
static int load_ints(const fixture *f, const char *name, int32_t *out, int64_t n)
{
    const fixture_tensor *t = fixture_find(f, name);
    int64_t i;
    if (!t || t->count != n) return 0;
    for (i = 0; i < n; i++) out[i] = (int32_t)t->data[i];
    return 1;
}

/* The worst fixture error over every parameter's gradient against f's prefix + name. */
static double worst_grad(pdp_model *m, const fixture *f, const char *prefix, char *which)
{
    double worst = 0.0;
    int i;
    for (i = 0; i < pdp_model_num_params(m); i++) {
        pdp_param p;
        char name[96];
        const fixture_tensor *t;
        double e;
        pdp_model_param(m, i, &p);
        snprintf(name, sizeof name, "%s%s", prefix, p.name);
        t = fixture_find(f, name);
        e = t ? fixture_rel_err(p.grad.data, t->data, p.count) : 1e30;
        if (e > worst || e != e) {
            worst = e;
            snprintf(which, 96, "%s", p.name);
        }
    }
    return worst;
}

/* forward (logits checked against f's logits_name) then forward_backward; loss and
   gradients checked by the caller */
static enum greatest_test_res forward_case(pdp_model *m, const fixture *f, const char *pre,
                                           int64_t T, double tol, float *loss)
{
    int32_t ids[B * CTX], targets[B * CTX];
    int64_t shape[2];
    char name[64];
    pdp_tensor x;
    const pdp_tensor *y;
    const fixture_tensor *want;
    shape[0] = B;
    shape[1] = T;
    snprintf(name, sizeof name, "%sids", pre);
    ASSERT(load_ints(f, name, ids, B * T));
    snprintf(name, sizeof name, "%stargets", pre);
    ASSERT(load_ints(f, name, targets, B * T));
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_wrap_ids(ids, pdp_cpu(), 2, shape, &x), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward(m, &x, &y), pdp_status_name);
    ASSERT_EQ(3, y->ndim);
    ASSERT_EQ(V, y->shape[2]);
    snprintf(name, sizeof name, "%slogits", pre);
    want = fixture_find(f, name);
    ASSERT(want && want->count == y->count);
    ASSERT_LTE(fixture_rel_err(y->data, want->data, y->count), tol);
    pdp_model_zero_grad(m);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward_backward(m, &x, targets, loss), pdp_status_name);
    PASS();
}

TEST gpt_names_and_shapes_are_nanogpts(void)
{
    pdp_model *m = fixture_gpt(0, PDP_PRECISION_FP32);
    pdp_param p;
    ASSERT(m);
    ASSERT_EQ(28, pdp_model_num_params(m)); /* the head owns none: it is wte */
    ASSERT_EQ(60624, pdp_model_param_count(m));
    { /* counted from the sizes, before building: every shape, the default vocabulary */
        pdp_gpt_desc d;
        pdp_model *b = NULL;
        int k;
        memset(&d, 0, sizeof d);
        d.vocab = V, d.context = CTX, d.layers = L, d.heads = H, d.dim = C;
        ASSERT_EQ(60624, pdp_gpt_param_count(&d));
        for (k = 0; k < 3; k++) {
            d.vocab = k ? 5 + k : 0, d.context = 3 + k, d.layers = 1 + k, d.dim = 4 + 2 * k;
            d.heads = 2;
            ASSERT_ENUM_EQ(PDP_OK, pdp_gpt_create(&b, &d), pdp_status_name);
            ASSERT_EQ(pdp_model_param_count(b), pdp_gpt_param_count(&d));
            pdp_model_free(b);
        }
        d.layers = 0;
        ASSERT_EQ(0, pdp_gpt_param_count(&d));
        ASSERT_EQ(0, pdp_gpt_param_count(NULL));
    }
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_find_param(m, "transformer.h.1.attn.c_attn.weight", &p),
                   pdp_status_name);
    ASSERT_EQ(3 * C, p.shape[0]);
    ASSERT_EQ(C, p.shape[1]);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_find_param(m, "transformer.wpe.weight", &p),
                   pdp_status_name);
    ASSERT_EQ(CTX, p.shape[0]);
    ASSERT_STR_EQ("Embedding", pdp_model_layer_name(m, 0));
    ASSERT_STR_EQ("TiedLinear", pdp_model_layer_name(m, pdp_model_num_layers(m) - 1));
    pdp_model_free(m);
    PASS();
}

TEST gpt_matches_pytorch_logits_loss_and_every_gradient(void)
{
    fixture f;
    pdp_model *m = fixture_gpt(0, PDP_PRECISION_FP32), *m11 = fixture_gpt(11, PDP_PRECISION_FP32);
    char which[96] = "";
    float loss;
    double g;
    FIXTURE_LOAD_OR_SKIP(&f, "gpt_forward.bin");
    ASSERT(m && m11);
    ASSERT(load_params(m, &f, ""));
    CHECK_CALL(forward_case(m, &f, "", CTX, 1e-5, &loss));
    ASSERT_LTE(fabs(loss - fixture_find(&f, "loss")->data[0]), 1e-5);
    g = worst_grad(m, &f, "grad.", which);
    if (g > 1e-5) FAILm(which); /* the tied wte: embedding rows and head summed */
    /* a sequence shorter than the context: positions 0..10 of wpe */
    ASSERT(load_params(m11, &f, ""));
    CHECK_CALL(forward_case(m11, &f, "t11.", 11, 1e-5, &loss));
    ASSERT_LTE(fabs(loss - fixture_find(&f, "t11.loss")->data[0]), 1e-5);
    pdp_model_free(m);
    pdp_model_free(m11);
    fixture_free(&f);
    PASS();
}

/* desc.gelu_erf: the MLPs' GELU exact, as nanoGPT's nn.GELU(): tools/gpt_reference.py's
   gpt_gelu_erf.bin (its parameters, gpt_forward.bin's batch), logits, loss and every
   gradient within 1e-5; the tanh form's logits are off by more than that there. */
TEST gpt_gelu_erf_matches_nanogpts_exact_gelu(void)
{
    fixture f0, f;
    pdp_model *m = fixture_gpt_erf(0, PDP_PRECISION_FP32, true);
    pdp_model *tanh_m = fixture_gpt(0, PDP_PRECISION_FP32);
    int32_t ids[B * CTX], targets[B * CTX];
    int64_t shape[2] = {B, CTX};
    pdp_tensor x;
    const pdp_tensor *y;
    char which[96] = "";
    float loss;
    double g;
    FIXTURE_LOAD_OR_SKIP(&f0, "gpt_forward.bin");
    FIXTURE_LOAD_OR_SKIP(&f, "gpt_gelu_erf.bin");
    ASSERT(m && tanh_m && load_params(m, &f, "") && load_params(tanh_m, &f, ""));
    ASSERT(load_ints(&f0, "ids", ids, B * CTX) && load_ints(&f0, "targets", targets, B * CTX));
    pdp_tensor_wrap_ids(ids, pdp_cpu(), 2, shape, &x);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward(tanh_m, &x, &y), pdp_status_name);
    ASSERT(fixture_rel_err(y->data, fixture_find(&f, "logits")->data, y->count) > 1e-5);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward(m, &x, &y), pdp_status_name);
    ASSERT_LTE(fixture_rel_err(y->data, fixture_find(&f, "logits")->data, y->count), 1e-5);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward_backward(m, &x, targets, &loss), pdp_status_name);
    ASSERT_LTE(fabs(loss - fixture_find(&f, "loss")->data[0]), 1e-5);
    g = worst_grad(m, &f, "grad.", which);
    if (g > 1e-5) FAILm(which);
    pdp_model_free(m);
    pdp_model_free(tanh_m);
    fixture_free(&f0);
    fixture_free(&f);
    PASS();
}

/* Five AdamW steps with clip_grad_norm_(1.0) on gpt_forward.bin's initial parameters
   against the fixture `file`: torch.optim.AdamW(lr 1e-3, betas (0.9, 0.95), eps 1e-8) with
   weight_decay 0.1 on the tensors `decay` picks. Each step's loss and norm within 1e-5, the
   final parameters too. f0: gpt_forward.bin, f: the fixture, both freed here. */
static enum greatest_test_res adamw_steps_match(fixture *f0_, fixture *f_, const char *file,
                                                pdp_decay_params decay)
{
    fixture f0 = *f0_, f = *f_;
    pdp_model *m = fixture_gpt(0, PDP_PRECISION_FP32);
    pdp_optim *o = NULL;
    pdp_optim_desc od;
    char which[128] = "";
    int s, i;
    double worst = 0.0;
    ASSERT(m && load_params(m, &f0, ""));
    memset(&od, 0, sizeof od);
    od.kind = PDP_OPTIM_ADAMW;
    od.lr = 1e-3;
    od.beta1 = 0.9;
    od.beta2 = 0.95;
    od.eps = 1e-8;
    od.weight_decay = 0.1;
    od.decay_params = decay;
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&o, m, &od), pdp_status_name);
    for (s = 0; s < 5; s++) {
        int32_t ids[B * CTX], targets[B * CTX];
        int64_t shape[2] = {B, CTX};
        char name[32];
        pdp_tensor x;
        float loss, norm;
        snprintf(name, sizeof name, "step%d.ids", s);
        ASSERT(load_ints(&f, name, ids, B * CTX));
        snprintf(name, sizeof name, "step%d.targets", s);
        ASSERT(load_ints(&f, name, targets, B * CTX));
        pdp_tensor_wrap_ids(ids, pdp_cpu(), 2, shape, &x);
        pdp_optim_zero_grad(o);
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward_backward(m, &x, targets, &loss), pdp_status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp_clip_grad_norm(m, 1.0f, &norm), pdp_status_name);
        ASSERT_LTE(fabs(loss - fixture_find(&f, "losses")->data[s]) / 4.0, 1e-5);
        ASSERT_LTE(fabs(norm - fixture_find(&f, "norms")->data[s]) /
                       fixture_find(&f, "norms")->data[s], 1e-5);
        ASSERT_ENUM_EQ(PDP_OK, pdp_optim_step(o), pdp_status_name);
    }
    for (i = 0; i < pdp_model_num_params(m); i++) {
        pdp_param p;
        char name[96];
        double e;
        pdp_model_param(m, i, &p);
        snprintf(name, sizeof name, "final.%s", p.name);
        ASSERT(fixture_find(&f, name));
        e = fixture_rel_err(p.value.data, fixture_find(&f, name)->data, p.count);
        if (e > worst) snprintf(which, sizeof which, "%s: %s off by %.3g", file, name, e);
        if (e > worst) worst = e;
    }
    if (worst > 1e-5) FAILm(which);
    pdp_optim_free(o);
    pdp_model_free(m);
    fixture_free(&f0);
    fixture_free(&f);
    PASS();
}

/* every parameter decayed: torch.optim's one group */
TEST gpt_five_adamw_steps_with_clipping_match_pytorch(void)
{
    fixture f0, f;
    FIXTURE_LOAD_OR_SKIP(&f0, "gpt_forward.bin");
    FIXTURE_LOAD_OR_SKIP(&f, "gpt_adamw.bin");
    CHECK_CALL(adamw_steps_match(&f0, &f, "gpt_adamw.bin", PDP_DECAY_ALL));
    PASS();
}

/* nanoGPT's configure_optimizers: the 2-D tensors decayed, the biases and LayerNorms not
   (tools/gpt_reference.py's gpt_adamw_groups.bin) */
TEST gpt_adamw_nanogpt_decay_groups_match_pytorch(void)
{
    fixture f0, f;
    FIXTURE_LOAD_OR_SKIP(&f0, "gpt_forward.bin");
    FIXTURE_LOAD_OR_SKIP(&f, "gpt_adamw_groups.bin");
    CHECK_CALL(adamw_steps_match(&f0, &f, "gpt_adamw_groups.bin", PDP_DECAY_MATRICES));
    PASS();
}

/* pdp's bf16 path rounds the Linears' (and the head's) inputs to bf16, as autocast does,
   and keeps attention's two products in fp32 (autocast rounds them too): held to the
   order of autocast's own distance from fp32 (tools/gpt_reference.py: logits 2.75e-3,
   worst gradient 1.05e-3), with room for rounding at other points. */
#define GPT_BF16_LOGITS_BOUND 1e-2
#define GPT_BF16_GRAD_BOUND 1e-2
TEST gpt_bf16_matches_autocast_within_a_bound(void)
{
    fixture f0, f;
    pdp_model *m = fixture_gpt(0, PDP_PRECISION_BF16);
    char which[96] = "";
    float loss;
    double g;
    FIXTURE_LOAD_OR_SKIP(&f0, "gpt_forward.bin");
    FIXTURE_LOAD_OR_SKIP(&f, "gpt_bf16.bin");
    ASSERT(m && load_params(m, &f0, ""));
    CHECK_CALL(forward_case(m, &f, "", CTX, GPT_BF16_LOGITS_BOUND, &loss));
    ASSERT_LTE(fabs(loss - fixture_find(&f, "loss")->data[0]), 1e-2);
    g = worst_grad(m, &f, "grad.", which);
    if (g > GPT_BF16_GRAD_BOUND) FAILm(which);
    pdp_model_free(m);
    fixture_free(&f0);
    fixture_free(&f);
    PASS();
}

/* Changing token k changes no logit before position k, bit for bit, and some at k. */
TEST gpt_later_tokens_change_no_earlier_output(void)
{
    pdp_model *m = fixture_gpt(0, PDP_PRECISION_FP32);
    int32_t ids[CTX];
    float before[CTX * V];
    int64_t shape[2] = {1, CTX}, t, k = 9;
    pdp_tensor x;
    const pdp_tensor *y;
    int changed = 0;
    ASSERT(m);
    for (t = 0; t < CTX; t++) ids[t] = (int32_t)((t * 13 + 5) % V);
    pdp_tensor_wrap_ids(ids, pdp_cpu(), 2, shape, &x);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward(m, &x, &y), pdp_status_name);
    memcpy(before, y->data, sizeof before);
    ids[k] = (ids[k] + 1) % V;
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward(m, &x, &y), pdp_status_name);
    for (t = 0; t < k * V; t++) ASSERT_EQ(before[t], y->data[t]);
    for (t = k * V; t < (k + 1) * V; t++) changed |= before[t] != y->data[t];
    ASSERT(changed);
    pdp_model_free(m);
    PASS();
}

/* Every parameter tensor: 3 entries against central differences of the loss, on a small
   GPT away from its initialisation (N(0, 0.3) added) so LayerNorms and biases matter. */
TEST gpt_gradients_match_finite_differences(void)
{
    pdp_gpt_desc d;
    pdp_model *m = NULL;
    int32_t ids[2 * 5] = {1, 4, 2, 9, 0, 3, 3, 7, 8, 10}, tg[2 * 5] = {4, 2, 9, -1, 5, 3, 7, 8, 10, 1};
    int64_t shape[2] = {2, 5}, j;
    pdp_tensor x, grads;
    pdp_rng r;
    static float backward[4096];
    float loss, lp, lm;
    int i;
    memset(&d, 0, sizeof d);
    d.vocab = 11;
    d.context = 6;
    d.sequence = 5;
    d.layers = 2;
    d.heads = 2;
    d.dim = 8;
    d.seed = 3;
    ASSERT_ENUM_EQ(PDP_OK, pdp_gpt_create(&m, &d), pdp_status_name);
    pdp_rng_seed(&r, 9, 0);
    for (i = 0; i < pdp_model_num_params(m); i++) {
        pdp_param p;
        pdp_model_param(m, i, &p);
        for (j = 0; j < p.count; j++) p.value.data[j] += 0.3f * pdp_rng_normal(&r);
    }
    pdp_tensor_wrap_ids(ids, pdp_cpu(), 2, shape, &x);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward_backward(m, &x, tg, &loss), pdp_status_name);
    pdp_model_flat(m, NULL, &grads);
    ASSERT(grads.count <= (int64_t)(sizeof backward / sizeof backward[0]));
    memcpy(backward, grads.data, (size_t)grads.count * sizeof(float)); /* the passes below
                                                                         accumulate more */
    for (i = 0; i < pdp_model_num_params(m); i++) {
        pdp_param p;
        int k;
        pdp_model_param(m, i, &p);
        for (k = 0; k < 3; k++) {
            int64_t at = (int64_t)pdp_rng_below(&r, (uint32_t)p.count);
            float v = p.value.data[at], h = 1e-2f, g = backward[p.offset + at], fd;
            p.value.data[at] = v + h;
            ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward_backward(m, &x, tg, &lp), pdp_status_name);
            p.value.data[at] = v - h;
            ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward_backward(m, &x, tg, &lm), pdp_status_name);
            p.value.data[at] = v;
            fd = (float)(((double)lp - (double)lm) / (2.0 * (double)h));
            if (fabsf(fd - g) > 2e-3f + 3e-2f * fabsf(fd)) {
                char msg[160];
                snprintf(msg, sizeof msg, "%s[%lld]: backward %g, differences %g", p.name,
                         (long long)at, (double)g, (double)fd);
                FAILm(msg);
            }
        }
    }
    pdp_model_free(m);
    PASS();
}

/* A residual region around a Linear is x + (x W^T + b), and its input gradient dy + dy W. */
TEST gpt_residual_region_is_x_plus_its_branch(void)
{
    pdp_model_desc md;
    pdp_model *m = NULL;
    float xd[2 * 3] = {1, -2, 0.5f, 3, 0.25f, -1}, dyd[2 * 3] = {1, 2, 3, -1, 0.5f, 2};
    int64_t shape[2] = {2, 3}, b, i, j;
    pdp_tensor x, dy;
    const pdp_tensor *y;
    pdp_param w, bias;
    memset(&md, 0, sizeof md);
    md.input_shape[0] = 3;
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_create(&m, &md), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_residual_begin(m), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_linear(m, 3), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_residual_end(m), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_param(m, 0, &w), pdp_status_name);
    ASSERT_STR_EQ("0.weight", w.name); /* the Residual is not numbered */
    pdp_model_param(m, 1, &bias);
    pdp_tensor_wrap(xd, pdp_cpu(), 2, shape, &x);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward(m, &x, &y), pdp_status_name);
    for (b = 0; b < 2; b++)
        for (i = 0; i < 3; i++) {
            double want = xd[b * 3 + i] + bias.value.data[i];
            for (j = 0; j < 3; j++) want += (double)xd[b * 3 + j] * w.value.data[i * 3 + j];
            ASSERT_IN_RANGE(want, y->data[b * 3 + i], 1e-6);
        }
    pdp_tensor_wrap(dyd, pdp_cpu(), 2, shape, &dy);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_backward(m, &dy), pdp_status_name);
    for (i = 0; i < 3; i++) /* db = the sum of dy over the batch: the branch got all of dy */
        ASSERT_IN_RANGE(dyd[i] + dyd[3 + i], bias.grad.data[i], 1e-6);
    pdp_model_free(m);
    PASS();
}

TEST gpt_generate_greedy_top_k_and_seeds(void)
{
    pdp_model *m = fixture_gpt(0, PDP_PRECISION_FP32);
    int32_t a[24] = {3, 14, 15}, b[24] = {3, 14, 15}, c[24] = {3, 14, 15}, win[CTX] = {0};
    int64_t shape[2] = {1, CTX}, i, best = 0;
    pdp_tensor x;
    const pdp_tensor *y;
    pdp_rng r1, r2;
    ASSERT(m);
    /* greedy: the largest logit at the last real position of the padded window */
    pdp_rng_seed(&r1, 1, 0);
    ASSERT_ENUM_EQ(PDP_OK, pdp_gpt_generate(m, a, 3, 1, 0.0f, 0, &r1), pdp_status_name);
    win[0] = 3, win[1] = 14, win[2] = 15;
    pdp_tensor_wrap_ids(win, pdp_cpu(), 2, shape, &x);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward(m, &x, &y), pdp_status_name);
    for (i = 1; i < V; i++)
        if (y->data[2 * V + i] > y->data[2 * V + best]) best = i;
    ASSERT_EQ(best, a[3]);
    /* top_k 1 at any temperature is greedy; 21 tokens (past the context of 16) */
    pdp_rng_seed(&r1, 1, 0);
    ASSERT_ENUM_EQ(PDP_OK, pdp_gpt_generate(m, a, 3, 21, 0.0f, 0, &r1), pdp_status_name);
    pdp_rng_seed(&r2, 7, 0);
    ASSERT_ENUM_EQ(PDP_OK, pdp_gpt_generate(m, b, 3, 21, 0.8f, 1, &r2), pdp_status_name);
    for (i = 0; i < 24; i++) ASSERT_EQ(a[i], b[i]);
    /* sampling: the same seed gives the same text, ids inside the vocabulary */
    pdp_rng_seed(&r1, 5, 0);
    ASSERT_ENUM_EQ(PDP_OK, pdp_gpt_generate(m, b, 3, 21, 1.0f, 10, &r1), pdp_status_name);
    pdp_rng_seed(&r1, 5, 0);
    ASSERT_ENUM_EQ(PDP_OK, pdp_gpt_generate(m, c, 3, 21, 1.0f, 10, &r1), pdp_status_name);
    for (i = 0; i < 24; i++) {
        ASSERT_EQ(b[i], c[i]);
        ASSERT(b[i] >= 0 && b[i] < V);
    }
    ASSERT(pdp_model_is_training(m)); /* the mode is put back */
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_gpt_generate(m, a, 0, 1, 1.0f, 0, &r1), pdp_status_name);
    pdp_model_free(m);
    PASS();
}

/* The backward reads the forward's ids again (model.c keeps x's pointer): ids changed to
   one past the vocabulary after a good forward are refused, nothing scattered (without the
   check the row of id 50 is dwpe's first row here: a silent wrong gradient; further out, a
   write past the gradient block) */
TEST gpt_embedding_backward_refuses_ids_changed_after_the_forward(void)
{
    pdp_model *m = NULL;
    const pdp_tensor *y;
    pdp_tensor x, dy;
    pdp_param tok, pos;
    int32_t ids[2 * 4] = {1, 2, 3, 4, 5, 6, 7, 8};
    float g[2 * 4 * 5];
    int64_t shape[2] = {2, 4}, yshape[3] = {2, 4, 5}, i;
    for (i = 0; i < 40; i++) g[i] = 1.0f;
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_create(&m, &(pdp_model_desc){.input_shape = {4},
                                                                  .input_dtype = PDP_DTYPE_I32}),
                   pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_embedding(m, 50, 8, 4), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_linear(m, 5), pdp_status_name);
    pdp_tensor_wrap_ids(ids, pdp_cpu(), 2, shape, &x);
    pdp_tensor_wrap(g, pdp_cpu(), 3, yshape, &dy);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward(m, &x, &y), pdp_status_name);
    ids[4 + 2] = 50; /* sequence 1, position 2: one past the vocabulary */
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_model_backward(m, &dy), pdp_status_name);
    ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "layer 0 (Embedding)") != NULL);
    ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "token id 50 at position (1, 2) is "
                                     "outside [0, 50): the ids changed after the forward") != NULL);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_find_param(m, "0.token.weight", &tok), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_find_param(m, "0.position.weight", &pos), pdp_status_name);
    for (i = 0; i < tok.count; i++) ASSERT_EQ(0.0f, ((const float *)tok.grad.data)[i]);
    for (i = 0; i < pos.count; i++) ASSERT_EQ(0.0f, ((const float *)pos.grad.data)[i]);
    pdp_model_free(m);
    PASS();
}

TEST gpt_errors_name_layer_position_and_lengths(void)
{
    pdp_model *m = fixture_gpt(0, PDP_PRECISION_FP32), *p = NULL;
    pdp_model_desc md;
    pdp_gpt_desc d;
    int32_t ids[B * 20] = {0}, tg[B * CTX] = {0};
    float fx[B * CTX] = {0}, loss;
    int64_t shape[2] = {B, CTX}, longer[2] = {B, 20};
    pdp_tensor x;
    ASSERT(m);
    ids[CTX + 7] = V; /* sequence 1, position 7 */
    pdp_tensor_wrap_ids(ids, pdp_cpu(), 2, shape, &x);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_model_forward_backward(m, &x, tg, &loss),
                   pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "layer 0 (Embedding)"));
    ASSERT(strstr(pdp_last_error(), "token id 67 at position (1, 7) is outside [0, 67)"));
    { /* that forward wrote rows before it met the bad id: a backward after it, even with a
         good forward before it, has nothing whole to go back through */
        const pdp_tensor *y;
        int32_t good[B * CTX] = {0};
        pdp_tensor gx;
        pdp_tensor_wrap_ids(good, pdp_cpu(), 2, shape, &gx);
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward(m, &gx, &y), pdp_status_name);
        ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_model_forward(m, &x, &y), pdp_status_name);
        ASSERT_ENUM_EQ(PDP_ERR_STATE, pdp_model_backward(m, &m->out_view), pdp_status_name);
    }
    ids[CTX + 7] = 0;
    pdp_tensor_wrap_ids(ids, pdp_cpu(), 2, longer, &x);
    ASSERT_ENUM_EQ(PDP_ERR_SHAPE, pdp_model_forward_backward(m, &x, tg, &loss), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "a sequence of 20 tokens is longer than the context of 16"));
    pdp_tensor_wrap(fx, pdp_cpu(), 2, shape, &x);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_model_forward_backward(m, &x, tg, &loss),
                   pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "takes int32 inputs, got float32"));
    tg[5] = -2;
    pdp_tensor_wrap_ids(ids, pdp_cpu(), 2, shape, &x);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_model_forward_backward(m, &x, tg, &loss),
                   pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "label -2 at row 5"));
    /* the builder's fields */
    memset(&d, 0, sizeof d);
    d.context = 8, d.layers = 1, d.heads = 3, d.dim = 8;
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_gpt_create(&p, &d), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "heads 3 do not divide dim 8"));
    d.heads = 2, d.sequence = 9;
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_gpt_create(&p, &d), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "sequence 9 is outside [1, context 8]"));
    ASSERT(p == NULL);
    /* sizes whose parameter count overflows: refused alike by create and desc_format, and
       counted as 0 (they wrapped) */
    d.sequence = 0, d.dim = (int64_t)1 << 40;
    ASSERT_EQ(0, pdp_gpt_param_count(&d));
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_gpt_create(&p, &d), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "make more than"));
    {
        char line[256];
        ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_gpt_desc_format(&d, line, sizeof line),
                       pdp_status_name);
        d.dim = 8, d.context = (int64_t)1 << 62;
        ASSERT_EQ(0, pdp_gpt_param_count(&d));
        ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_gpt_desc_format(&d, line, sizeof line),
                       pdp_status_name);
        d.context = 8, d.vocab = INT64_MAX;
        ASSERT_EQ(0, pdp_gpt_param_count(&d));
        d.vocab = 0;
        ASSERT_EQ(8 * 256 + 8 * 8 + 12 * 64 + 13 * 8 + 2 * 8, pdp_gpt_param_count(&d));
    }
    { /* generation: a model whose output is not a row of logits a position; an infinite
         temperature; a text longer than any buffer */
        pdp_model *flat = NULL;
        int32_t gen[16] = {1, 2, 3};
        char text[64];
        pdp_rng r;
        pdp_rng_seed(&r, 1, 0);
        memset(&md, 0, sizeof md);
        md.input_shape[0] = 4, md.input_dtype = PDP_DTYPE_I32;
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_create(&flat, &md), pdp_status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_embedding(flat, 5, 4, 0), pdp_status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_flatten(flat), pdp_status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_linear(flat, 5), pdp_status_name);
        ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_gpt_generate(flat, gen, 3, 4, 1.0f, 0, &r),
                       pdp_status_name);
        ASSERT(strstr(pdp_last_error(), "[T 4, vocab]"));
        ASSERT_EQ(0, gen[3]); /* nothing drawn */
        pdp_model_free(flat);
        ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_gpt_generate(m, gen, 3, 4, INFINITY, 0, &r),
                       pdp_status_name);
        ASSERT(strstr(pdp_last_error(), "temperature inf (finite, >= 0)"));
        d.vocab = 256;
        ASSERT_ENUM_EQ(PDP_OK, pdp_gpt_create(&flat, &d), pdp_status_name);
        ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_gpt_generate_text(flat, "Hi", INT64_MAX, 0.8f, 5, &r,
                                                              text, sizeof text),
                       pdp_status_name);
        ASSERT(strstr(pdp_last_error(), "needs more than"));
        pdp_model_free(flat);
        d.vocab = 0;
    }
    /* residual regions: nesting, an unmatched end, a branch that changes the shape, a
       region left open; an Embedding not first or on a float model */
    memset(&md, 0, sizeof md);
    md.input_shape[0] = 4;
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_create(&p, &md), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_ERR_STATE, pdp_model_residual_end(p), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_model_add_embedding(p, 5, 4, 0), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "input_dtype = PDP_DTYPE_I32"));
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_residual_begin(p), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_ERR_STATE, pdp_model_residual_begin(p), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "regions do not nest"));
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_linear(p, 5), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_ERR_SHAPE, pdp_model_residual_end(p), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "takes [4] and its layers give [5]"));
    {
        float in[4] = {0};
        int64_t s1[2] = {1, 4};
        const pdp_tensor *y;
        pdp_tensor_wrap(in, pdp_cpu(), 2, s1, &x);
        ASSERT_ENUM_EQ(PDP_ERR_STATE, pdp_model_forward(p, &x, &y), pdp_status_name);
        ASSERT(strstr(pdp_last_error(), "opened at layer 0 is never closed"));
    }
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_model_add_tied_linear(p, "no.such"), pdp_status_name);
    pdp_model_free(p);
    pdp_model_free(m);
    PASS();
}

/* DDP over 2 thread ranks, each with half the batch (the same number of -1 targets each),
   gives the single-device gradients of the whole batch: the mean of the two halves'
   means. The tied wte's gradient (embedding rows and head) is reduced once, after
   layer 0's backward, where its hook fires. */
typedef struct ddp_case {
    int32_t ids[4 * 8], tg[4 * 8];
    float *grads[2];
    int64_t count;
} ddp_case;

static pdp_model *small_gpt(void)
{
    pdp_gpt_desc d;
    pdp_model *m = NULL;
    memset(&d, 0, sizeof d);
    d.vocab = 13, d.context = 8, d.layers = 2, d.heads = 2, d.dim = 16, d.seed = 11;
    d.dropout = 0.1f; /* rank r's masks are those of samples r x its batch on, as one device's */
    return pdp_gpt_create(&m, &d) == PDP_OK ? m : NULL;
}

static pdp_status ddp_rank(const pdp_launch_ctx *ctx, void *user)
{
    ddp_case *c = (ddp_case *)user;
    pdp_model *m = small_gpt();
    pdp_ddp *ddp = NULL;
    pdp_tensor x, g;
    int64_t shape[2] = {2, 8};
    float loss;
    pdp_status st;
    if (!m) return PDP_ERR_OUT_OF_MEMORY;
    pdp_tensor_wrap_ids(c->ids + ctx->rank * 16, pdp_cpu(), 2, shape, &x);
    if ((st = pdp_ddp_create(&ddp, m, ctx->world, NULL)) == PDP_OK &&
        (st = pdp_ddp_forward_backward(ddp, &x, c->tg + ctx->rank * 16, &loss)) == PDP_OK &&
        (st = pdp_ddp_finish(ddp)) == PDP_OK) {
        pdp_model_flat(m, NULL, &g);
        if (ctx->rank == 0) c->count = g.count;
        c->grads[ctx->rank] = (float *)malloc((size_t)g.count * sizeof(float));
        if (c->grads[ctx->rank])
            memcpy(c->grads[ctx->rank], g.data, (size_t)g.count * sizeof(float));
    }
    pdp_ddp_free(ddp);
    pdp_model_free(m);
    return st;
}

TEST gpt_under_ddp_equals_one_device(void)
{
    ddp_case c;
    pdp_model *m = small_gpt();
    pdp_tensor x, g;
    int64_t shape[2] = {4, 8}, i;
    float loss;
    int r;
    ASSERT(m);
    memset(&c, 0, sizeof c);
    for (i = 0; i < 32; i++) {
        c.ids[i] = (int32_t)((i * 5 + 3) % 13);
        c.tg[i] = (i % 8 == 3) ? -1 : (int32_t)((i * 7 + 1) % 13); /* one -1 per sequence */
    }
    ASSERT_ENUM_EQ(PDP_OK, pdp_launch(2, NULL, ddp_rank, &c), pdp_status_name);
    pdp_tensor_wrap_ids(c.ids, pdp_cpu(), 2, shape, &x);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward_backward(m, &x, c.tg, &loss), pdp_status_name);
    pdp_model_flat(m, NULL, &g);
    ASSERT(c.grads[0] && c.grads[1] && c.count == g.count);
    for (r = 0; r < 2; r++)
        ASSERT_LTE(fixture_rel_err(c.grads[r], g.data, g.count), 1e-6);
    free(c.grads[0]);
    free(c.grads[1]);
    pdp_model_free(m);
    PASS();
}

/* DataParallel with 1 to 4 workers equals one device: per-position labels split with
   their samples, the loss the mean over the labels that count in the whole batch (-1
   ignored), dropout drawn as one device draws it (each replica's sample_base). */
TEST gpt_under_dataparallel_equals_one_device(void)
{
    pdp_gpt_desc d;
    int32_t ids[5 * 8], tg[5 * 8];
    int64_t shape[2] = {5, 8}, i;
    int workers;
    memset(&d, 0, sizeof d);
    d.vocab = 13, d.context = 8, d.layers = 2, d.heads = 2, d.dim = 16, d.seed = 5;
    d.dropout = 0.1f;
    for (i = 0; i < 40; i++) {
        ids[i] = (int32_t)((i * 7 + 2) % 13);
        tg[i] = (i % 5 == 1) ? -1 : (int32_t)((i * 3 + 4) % 13);
    }
    for (workers = 1; workers <= 4; workers++) {
        pdp_model *one = NULL, *master = NULL;
        pdp_gpt_desc dm = d; /* the replicas recompute: 2 workers FULL, 3 SELECTIVE */
        dm.recompute = workers == 2 ? PDP_RECOMPUTE_FULL
                       : workers == 3 ? PDP_RECOMPUTE_SELECTIVE : PDP_RECOMPUTE_NONE;
        pdp_dp *dp = NULL;
        pdp_dp_desc dd;
        pdp_tensor x, g1, gm;
        float l1, lm;
        char msg[64];
        ASSERT_ENUM_EQ(PDP_OK, pdp_gpt_create(&one, &d), pdp_status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp_gpt_create(&master, &dm), pdp_status_name);
        memset(&dd, 0, sizeof dd);
        dd.num_workers = workers;
        ASSERT_ENUM_EQ(PDP_OK, pdp_dp_create(&dp, master, &dd), pdp_status_name);
        pdp_tensor_wrap_ids(ids, pdp_cpu(), 2, shape, &x);
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward_backward(one, &x, tg, &l1), pdp_status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp_dp_forward_backward(dp, &x, tg, &lm), pdp_status_name);
        pdp_model_flat(one, NULL, &g1);
        pdp_model_flat(master, NULL, &gm);
        snprintf(msg, sizeof msg, "%d workers, recompute %d", workers, (int)dm.recompute);
        ASSERTm(msg, fabs(l1 - lm) <= 1e-6 * fabs(l1));
        ASSERTm(msg, fixture_rel_err(gm.data, g1.data, g1.count) <= 1e-6);
        pdp_dp_free(dp);
        pdp_model_free(one);
        pdp_model_free(master);
    }
    PASS();
}

/* Tensor parallel (Megatron's blocks: q, k, v split by heads) on 1, 2 and 3 thread ranks
   (6 heads), with dropout 0.1 (attention masks keyed by the global head) and clipping:
   3 AdamW steps give the single-device losses and, gathered into one file
   (pdp_tp_checkpoint_save), its parameters; each block's step exchanges 4 all-reduces of
   B x T x C floats (g forward and f backward, attention and MLP). */
enum { TP_B = 2, TP_T = 8, TP_C = 24, TP_L = 2 };
typedef struct tp_case {
    int32_t ids[TP_B * TP_T], tg[TP_B * TP_T];
    float losses[3];
    int64_t bytes_one_step, allreduces_one_step;
    char path[128];
    pdp_recompute recompute; /* FULL: each region, its f and g included, runs again */
} tp_case;

static pdp_gpt_desc tp_desc(void)
{
    pdp_gpt_desc d;
    memset(&d, 0, sizeof d);
    d.vocab = 13, d.context = TP_T, d.layers = TP_L, d.heads = 6, d.dim = TP_C, d.seed = 21;
    d.dropout = getenv("NODROP") ? 0.0f : 0.1f;
    return d;
}

/* 3 steps of AdamW with clipping at 0.5 on m (a TP or a plain GPT) */
static pdp_status tp_train(pdp_model *m, tp_case *c, bool record)
{
    pdp_optim *o = NULL;
    pdp_optim_desc od;
    pdp_tensor x;
    int64_t shape[2] = {TP_B, TP_T};
    float loss, norm;
    int s;
    pdp_status st;
    memset(&od, 0, sizeof od);
    od.kind = PDP_OPTIM_ADAMW, od.lr = 1e-2, od.weight_decay = 0.1;
    if ((st = pdp_optim_create(&o, m, &od)) != PDP_OK) return st;
    pdp_tensor_wrap_ids(c->ids, pdp_cpu(), 2, shape, &x);
    for (s = 0; s < 3 && st == PDP_OK; s++) {
        pdp_tp_stats ts;
        if ((st = pdp_model_forward_backward(m, &x, c->tg, &loss)) != PDP_OK ||
            (st = pdp_clip_grad_norm(m, 0.5f, &norm)) != PDP_OK ||
            (st = pdp_optim_step(o)) != PDP_OK)
            break;
        pdp_optim_zero_grad(o);
        if (record) c->losses[s] = loss;
        pdp_tp_get_stats(m, &ts);
        if (s == 0 && record) {
            c->bytes_one_step = ts.forward_bytes + ts.backward_bytes;
            c->allreduces_one_step = ts.forward_allreduces + ts.backward_allreduces;
        }
    }
    pdp_optim_free(o);
    return st;
}

static pdp_status tp_rank(const pdp_launch_ctx *ctx, void *user)
{
    tp_case *c = (tp_case *)user;
    pdp_gpt_desc d = tp_desc();
    pdp_model *m = NULL;
    pdp_status st;
    d.tp = ctx->world;
    d.recompute = c->recompute;
    if ((st = pdp_gpt_create(&m, &d)) == PDP_OK && /* what pdp_gpt_create reserved */
        pdp_model_param_count(m) != pdp__gpt_rank_param_count(&d, ctx->world_size))
        st = pdp__err(PDP_ERR_STATE, "TP %d: %lld parameters on a rank, reserved %lld",
                      ctx->world_size, (long long)pdp_model_param_count(m),
                      (long long)pdp__gpt_rank_param_count(&d, ctx->world_size));
    if (st == PDP_OK && (st = tp_train(m, c, ctx->rank == 0)) == PDP_OK)
        st = pdp_tp_checkpoint_save(c->path, m, NULL);
    pdp_model_free(m);
    return st;
}

TEST gpt_tensor_parallel_by_heads_equals_one_device(void)
{
    tp_case c, one;
    pdp_gpt_desc d = tp_desc();
    pdp_model *ref = NULL, *back = NULL;
    pdp_tensor pr, pb;
    int64_t i;
    int np;
    memset(&c, 0, sizeof c);
    for (i = 0; i < TP_B * TP_T; i++) {
        c.ids[i] = (int32_t)((i * 5 + 1) % 13);
        c.tg[i] = i % 7 == 3 ? -1 : (int32_t)((i * 3 + 2) % 13);
    }
    snprintf(c.path, sizeof c.path, "build/test_gpt_tp.%ld.safetensors", (long)getpid());
    one = c;
    ASSERT_ENUM_EQ(PDP_OK, pdp_gpt_create(&ref, &d), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, tp_train(ref, &one, true), pdp_status_name);
    pdp_model_flat(ref, &pr, NULL);
    for (np = 1; np <= 3; np++) {
        char msg[64];
        snprintf(msg, sizeof msg, "TP %d", np);
        ASSERT_ENUM_EQ(PDP_OK, pdp_launch(np, NULL, tp_rank, &c), pdp_status_name);
        for (i = 0; i < 3; i++) ASSERTm(msg, fabs(c.losses[i] - one.losses[i]) <= 1e-5);
        ASSERT_ENUM_EQ(PDP_OK, pdp_gpt_create(&back, &d), pdp_status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp_checkpoint_load(c.path, back, NULL), pdp_status_name);
        pdp_model_flat(back, &pb, NULL);
        ASSERTm(msg, fixture_rel_err(pb.data, pr.data, pr.count) <= 1e-5);
        pdp_model_free(back);
        /* g forward and f backward, for the attention and the MLP of every block */
        ASSERT_EQ(4 * TP_L, c.allreduces_one_step);
        ASSERT_EQ((int64_t)4 * TP_L * TP_B * TP_T * TP_C * 4, c.bytes_one_step);
    }
    /* FULL recomputation on 2 TP ranks: the regions' g all-reduces run again in backward
       (6 a block and step, not 4), the results the same */
    c.recompute = PDP_RECOMPUTE_FULL;
    ASSERT_ENUM_EQ(PDP_OK, pdp_launch(2, NULL, tp_rank, &c), pdp_status_name);
    for (i = 0; i < 3; i++) ASSERTm("recompute", fabs(c.losses[i] - one.losses[i]) <= 1e-5);
    ASSERT_EQ(6 * TP_L, c.allreduces_one_step);
    ASSERT_ENUM_EQ(PDP_OK, pdp_gpt_create(&back, &d), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_checkpoint_load(c.path, back, NULL), pdp_status_name);
    pdp_model_flat(back, &pb, NULL);
    ASSERTm("recompute", fixture_rel_err(pb.data, pr.data, pr.count) <= 1e-5);
    pdp_model_free(back);
    remove(c.path);
    pdp_model_free(ref);
    PASS();
}

/* A pipeline of GPT blocks: 2, 3 and 4 stages, GPipe and 1F1B, 4 micro-batches, cut only
   between residual regions, the embedding on stage 0 and the head (with its copy of wte)
   on the last: 3 AdamW steps with the pipeline's clipping (wte counted once) equal one
   device: the losses, and every stage's parameters by name, the head's copy included. */
enum { PP_B = 4 };

/* One device: steps AdamW steps (lr 1e-3, weight decay 0.1, clipping at 0.5) of tp_desc()'s
   GPT on the batch ids, tg [PP_B, TP_T]; each step's loss into losses (may be NULL). */
static pdp_status gpt_single(const int32_t *ids, const int32_t *tg, int steps, float *losses,
                             pdp_model **out)
{
    pdp_gpt_desc d = tp_desc();
    pdp_optim *o = NULL;
    pdp_optim_desc od;
    pdp_tensor x;
    int64_t shape[2] = {PP_B, TP_T};
    float loss, norm;
    int s;
    pdp_status st;
    memset(&od, 0, sizeof od);
    od.kind = PDP_OPTIM_ADAMW, od.lr = 1e-3, od.weight_decay = 0.1;
    if ((st = pdp_gpt_create(out, &d)) != PDP_OK || (st = pdp_optim_create(&o, *out, &od)))
        return st;
    pdp_tensor_wrap_ids((int32_t *)ids, pdp_cpu(), 2, shape, &x);
    for (s = 0; s < steps && st == PDP_OK; s++) {
        if ((st = pdp_model_forward_backward(*out, &x, tg, &loss)) == PDP_OK &&
            (st = pdp_clip_grad_norm(*out, 0.5f, &norm)) == PDP_OK)
            st = pdp_optim_step(o);
        pdp_optim_zero_grad(o);
        if (losses) losses[s] = loss;
    }
    pdp_optim_free(o);
    return st;
}

typedef struct pp_case {
    int32_t ids[PP_B * TP_T], tg[PP_B * TP_T];
    pdp_pp_schedule schedule;
    float losses[3];
    const pdp_model *ref; /* the single-device model after the 3 steps */
    double worst[8];
    bool bad_cut;
    pdp_recompute recompute;
} pp_case;

static pdp_status pp_rank(const pdp_launch_ctx *ctx, void *user)
{
    pp_case *c = (pp_case *)user;
    pdp_gpt_desc d = tp_desc();
    pdp_model *full = NULL, *m;
    pdp_pp *pp = NULL;
    d.recompute = c->recompute;
    pdp_pp_desc pd;
    pdp_optim *o = NULL;
    pdp_optim_desc od;
    pdp_tensor x;
    int64_t shape[2] = {PP_B, TP_T};
    float loss, norm;
    int s;
    pdp_status st;
    memset(&pd, 0, sizeof pd);
    pd.schedule = c->schedule;
    pd.micro_batches = 4;
    if (c->bad_cut) {
        static const int first[2] = {0, 3};
        pd.first_layer = first;
    }
    memset(&od, 0, sizeof od);
    od.kind = PDP_OPTIM_ADAMW, od.lr = 1e-3, od.weight_decay = 0.1;
    if ((st = pdp_gpt_create(&full, &d)) != PDP_OK ||
        (st = pdp_pp_create(&pp, full, ctx->world, &pd)) != PDP_OK)
        goto out;
    m = pdp_pp_model(pp);
    if ((st = pdp_optim_create(&o, m, &od)) != PDP_OK) goto out;
    pdp_tensor_wrap_ids(c->ids, pdp_cpu(), 2, shape, &x);
    for (s = 0; s < 3; s++) {
        if ((st = pdp_pp_forward_backward(pp, &x, c->tg, &loss)) != PDP_OK ||
            (st = pdp_pp_clip_grad_norm(pp, 0.5f, &norm)) != PDP_OK ||
            (st = pdp_pp_step(pp, o)) != PDP_OK)
            goto out;
        if (ctx->rank == ctx->world_size - 1) c->losses[s] = loss;
    }
    st = fixture_worst_by_name(m, c->ref, &c->worst[ctx->rank]); /* each stage's, by name */
out:
    pdp_optim_free(o);
    pdp_pp_free(pp);
    pdp_model_free(full);
    return st;
}

TEST gpt_pipeline_of_blocks_equals_one_device(void)
{
    pp_case c;
    float one[3];
    pdp_model *ref = NULL;
    int64_t i;
    int np, sched, r;
    memset(&c, 0, sizeof c);
    for (i = 0; i < PP_B * TP_T; i++) {
        c.ids[i] = (int32_t)((i * 5 + 1) % 13);
        c.tg[i] = i % 7 == 3 ? -1 : (int32_t)((i * 3 + 2) % 13);
    }
    ASSERT_ENUM_EQ(PDP_OK, gpt_single(c.ids, c.tg, 3, one, &ref), pdp_status_name);
    c.ref = ref;
    c.bad_cut = true; /* stage 1 from layer 3, inside block 0's attention region */
    ASSERT_ENUM_EQ(PDP_ERR_UNSUPPORTED, pdp_launch(2, NULL, pp_rank, &c), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "cuts the residual region of layers 2..8: cut between regions"));
    c.bad_cut = false;
    for (sched = 0; sched < 2; sched++)
        for (np = 2; np <= 4; np++) {
            char msg[64];
            snprintf(msg, sizeof msg, "%s, %d stages", sched ? "GPipe" : "1F1B", np);
            c.schedule = sched ? PDP_PP_GPIPE : PDP_PP_1F1B;
            memset(c.worst, 0, sizeof c.worst);
            ASSERT_ENUM_EQ(PDP_OK, pdp_launch(np, NULL, pp_rank, &c), pdp_status_name);
            for (i = 0; i < 3; i++) ASSERTm(msg, fabs(c.losses[i] - one[i]) <= 1e-5);
            for (r = 0; r < np; r++) ASSERTm(msg, c.worst[r] <= 1e-5);
        }
    c.recompute = PDP_RECOMPUTE_FULL; /* the stages run their regions again in backward */
    c.schedule = PDP_PP_1F1B;
    ASSERT_ENUM_EQ(PDP_OK, pdp_launch(3, NULL, pp_rank, &c), pdp_status_name);
    for (i = 0; i < 3; i++) ASSERTm("recompute", fabs(c.losses[i] - one[i]) <= 1e-5);
    for (r = 0; r < 3; r++) ASSERTm("recompute", c.worst[r] <= 1e-5);
    pdp_model_free(ref);
    PASS();
}

/* Activation recomputation gives the same bits as none (the same operations in the same
   order; dropout masks are keyed, so drawn again alike) and keeps less: SELECTIVE drops
   each attention's B x H x T x T probabilities, FULL everything inside the residual
   regions; FULL also trains in a pipeline stage (equal to one device) and under every
   ZeRO stage (gpt_recomputation_under_ddp_and_zero_equals_one_device). */
TEST gpt_recomputation_is_exact_and_keeps_less(void)
{
    pdp_gpt_desc d = tp_desc();
    pdp_model *m[3] = {NULL, NULL, NULL};
    int32_t ids[TP_B * TP_T], tg[TP_B * TP_T];
    int64_t shape[2] = {TP_B, TP_T}, i, bytes[3];
    pdp_tensor x, g0, g;
    float loss[3];
    int k, step;
    for (i = 0; i < TP_B * TP_T; i++) {
        ids[i] = (int32_t)((i * 7 + 3) % 13);
        tg[i] = i % 5 == 2 ? -1 : (int32_t)((i * 11 + 1) % 13);
    }
    pdp_tensor_wrap_ids(ids, pdp_cpu(), 2, shape, &x);
    for (k = 0; k < 3; k++) {
        d.recompute = (pdp_recompute)k;
        ASSERT_ENUM_EQ(PDP_OK, pdp_gpt_create(&m[k], &d), pdp_status_name);
        for (step = 0; step < 2; step++) { /* a second step: the dropout keys move on */
            pdp_model_zero_grad(m[k]);
            ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward_backward(m[k], &x, tg, &loss[k]),
                           pdp_status_name);
        }
        bytes[k] = pdp_model_activation_bytes(m[k], 0, pdp_model_num_layers(m[k]), TP_B);
    }
    pdp_model_flat(m[0], NULL, &g0);
    for (k = 1; k < 3; k++) {
        ASSERT_EQ(loss[0], loss[k]);
        pdp_model_flat(m[k], NULL, &g);
        for (i = 0; i < g.count; i++) ASSERT_EQ(g0.data[i], g.data[i]);
    }
    /* selective: exactly the probabilities, 6 heads x T x T floats a sample and layer */
    ASSERT_EQ(bytes[0] - (int64_t)TP_L * TP_B * 6 * TP_T * TP_T * 4, bytes[1]);
    ASSERT(bytes[2] < bytes[1]);
    for (k = 0; k < 3; k++) pdp_model_free(m[k]);
    PASS();
}

/* Pipeline checkpoints: a 2-stage pipeline trains 2 steps and saves the full model's file;
   one device loads it and has the single-device run's parameters; a 3-stage pipeline loads
   it and resumes: after one more step it equals one device after 3 steps. */
typedef struct ppc_case {
    int32_t ids[PP_B * TP_T], tg[PP_B * TP_T];
    char path[128];
    int steps;  /* the steps this run trains */
    bool load;  /* load path first */
    const pdp_model *ref;
    double worst[8];
} ppc_case;

static pdp_status ppc_rank(const pdp_launch_ctx *ctx, void *user)
{
    ppc_case *c = (ppc_case *)user;
    pdp_gpt_desc d = tp_desc();
    pdp_model *full = NULL, *m;
    pdp_pp *pp = NULL;
    pdp_optim *o = NULL;
    pdp_optim_desc od;
    pdp_tensor x;
    int64_t shape[2] = {PP_B, TP_T};
    float loss, norm;
    int s;
    pdp_status st;
    memset(&od, 0, sizeof od);
    od.kind = PDP_OPTIM_ADAMW, od.lr = 1e-3, od.weight_decay = 0.1;
    if ((st = pdp_gpt_create(&full, &d)) != PDP_OK ||
        (st = pdp_pp_create(&pp, full, ctx->world, NULL)) != PDP_OK)
        goto out;
    m = pdp_pp_model(pp);
    if ((st = pdp_optim_create(&o, m, &od)) != PDP_OK) goto out;
    if (c->load && (st = pdp_pp_checkpoint_load(pp, o, c->path)) != PDP_OK) goto out;
    pdp_tensor_wrap_ids(c->ids, pdp_cpu(), 2, shape, &x);
    for (s = 0; s < c->steps; s++)
        if ((st = pdp_pp_forward_backward(pp, &x, c->tg, &loss)) != PDP_OK ||
            (st = pdp_pp_clip_grad_norm(pp, 0.5f, &norm)) != PDP_OK ||
            (st = pdp_pp_step(pp, o)) != PDP_OK)
            goto out;
    if (!c->load) {
        st = pdp_pp_checkpoint_save(pp, o, c->path);
        goto out;
    }
    st = fixture_worst_by_name(m, c->ref, &c->worst[ctx->rank]);
out:
    pdp_optim_free(o);
    pdp_pp_free(pp);
    pdp_model_free(full);
    return st;
}

TEST gpt_pipeline_checkpoint_resumes_at_another_stage_count(void)
{
    static ppc_case c;
    pdp_model *two = NULL, *three = NULL, *back = NULL;
    pdp_gpt_desc d = tp_desc();
    pdp_tensor pt, pb;
    int64_t i;
    int r;
    memset(&c, 0, sizeof c);
    for (i = 0; i < PP_B * TP_T; i++) {
        c.ids[i] = (int32_t)((i * 5 + 2) % 13);
        c.tg[i] = i % 7 == 4 ? -1 : (int32_t)((i * 3 + 1) % 13);
    }
    snprintf(c.path, sizeof c.path, "build/test_gpt_pp.%ld.safetensors", (long)getpid());
    ASSERT_ENUM_EQ(PDP_OK, gpt_single(c.ids, c.tg, 2, NULL, &two), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, gpt_single(c.ids, c.tg, 3, NULL, &three), pdp_status_name);
    c.steps = 2;
    ASSERT_ENUM_EQ(PDP_OK, pdp_launch(2, NULL, ppc_rank, &c), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_gpt_create(&back, &d), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_checkpoint_load(c.path, back, NULL), pdp_status_name);
    pdp_model_flat(two, &pt, NULL);
    pdp_model_flat(back, &pb, NULL);
    ASSERT(fixture_rel_err(pb.data, pt.data, pt.count) <= 1e-5);
    c.steps = 1, c.load = true, c.ref = three;
    ASSERT_ENUM_EQ(PDP_OK, pdp_launch(3, NULL, ppc_rank, &c), pdp_status_name);
    for (r = 0; r < 3; r++) ASSERT(c.worst[r] <= 1e-5);
    remove(c.path);
    pdp_model_free(two);
    pdp_model_free(three);
    pdp_model_free(back);
    PASS();
}

/* 3-D parallel: DP x TP x PP = 2 x 2 x 2 on 8 thread ranks (rank = 4 dp + 2 pp + tp: the
   TP pairs, then the pipelines, then the data-parallel copies), the GPT of the TP test
   (6 heads over 2 TP ranks, dropout 0.1), each pipeline on its half of the batch, clipping
   over all three dimensions: 3 AdamW steps equal one device. Every stage's tensors are
   checked against the single-device model's by name, a TP slice against its cut of the
   full tensor (tp.c's runs). */
typedef struct d3_case {
    int32_t ids[PP_B * TP_T], tg[PP_B * TP_T];
    float losses[2][3];
    const pdp_model *ref;
    double worst[8];
} d3_case;

static pdp_status d3_rank(const pdp_launch_ctx *ctx, void *user)
{
    d3_case *c = (d3_case *)user;
    int dp = ctx->rank / 4, stage = ctx->rank / 2 % 2, tpr = ctx->rank % 2, s;
    pdp_comm *tp = NULL, *pc = NULL, *dc = NULL;
    pdp_gpt_desc d = tp_desc();
    pdp_model *full = NULL, *m;
    pdp_pp *pp = NULL;
    pdp_pp_desc pd;
    pdp_optim *o = NULL;
    pdp_optim_desc od;
    pdp_tensor x;
    int64_t shape[2] = {PP_B / 2, TP_T};
    float loss, norm;
    pdp_status st;
    memset(&od, 0, sizeof od);
    od.kind = PDP_OPTIM_ADAMW, od.lr = 1e-3, od.weight_decay = 0.1;
    if ((st = pdp_comm_split(ctx->world, ctx->rank / 2, tpr, &tp)) != PDP_OK ||
        (st = pdp_comm_split(ctx->world, dp * 2 + tpr, stage, &pc)) != PDP_OK ||
        (st = pdp_comm_split(ctx->world, stage * 2 + tpr, dp, &dc)) != PDP_OK)
        goto out;
    d.tp = tp;
    memset(&pd, 0, sizeof pd);
    pd.micro_batches = 2;
    pd.dp = dc;
    if ((st = pdp_gpt_create(&full, &d)) != PDP_OK ||
        (st = pdp_pp_create(&pp, full, pc, &pd)) != PDP_OK)
        goto out;
    m = pdp_pp_model(pp);
    if ((st = pdp_optim_create(&o, m, &od)) != PDP_OK) goto out;
    pdp_tensor_wrap_ids(c->ids + dp * (PP_B / 2) * TP_T, pdp_cpu(), 2, shape, &x);
    for (s = 0; s < 3; s++) {
        if ((st = pdp_pp_forward_backward(pp, &x, c->tg + dp * (PP_B / 2) * TP_T, &loss)) !=
                PDP_OK ||
            (st = pdp_pp_clip_grad_norm(pp, 0.5f, &norm)) != PDP_OK ||
            (st = pdp_pp_step(pp, o)) != PDP_OK)
            goto out;
        if (stage == 1 && tpr == 0) c->losses[dp][s] = loss;
    }
    st = fixture_worst_by_name(m, c->ref, &c->worst[ctx->rank]);
out:
    pdp_optim_free(o);
    pdp_pp_free(pp);
    pdp_model_free(full);
    pdp_comm_free(dc);
    pdp_comm_free(pc);
    pdp_comm_free(tp);
    return st;
}

TEST gpt_3d_dp_tp_pp_equals_one_device(void)
{
    static d3_case c;
    pdp_model *ref = NULL;
    int64_t i;
    float one[3];
    int s, r;
    memset(&c, 0, sizeof c);
    for (i = 0; i < PP_B * TP_T; i++) {
        c.ids[i] = (int32_t)((i * 3 + 4) % 13);
        c.tg[i] = i % TP_T == 2 ? -1 : (int32_t)((i * 7 + 5) % 13); /* one -1 a sequence */
    }
    ASSERT_ENUM_EQ(PDP_OK, gpt_single(c.ids, c.tg, 3, one, &ref), pdp_status_name);
    c.ref = ref;
    ASSERT_ENUM_EQ(PDP_OK, pdp_launch(8, NULL, d3_rank, &c), pdp_status_name);
    for (s = 0; s < 3; s++) /* the mean of the two pipelines' means is the batch's */
        ASSERT_IN_RANGE(one[s], 0.5 * ((double)c.losses[0][s] + c.losses[1][s]), 1e-5);
    for (r = 0; r < 8; r++) ASSERT(c.worst[r] <= 1e-5);
    pdp_model_free(ref);
    PASS();
}

/* DP x TP = 2 x 2 on 4 thread ranks (TP pairs, DP across them): the TP GPT wrapped in DDP
   or in ZeRO stage 1 on the DP group, each copy on its half of the batch, 3 AdamW steps
   with clipping (over TP, after the DP average): equal to one device within 1e-5. ZeRO-1
   shards the optimizer state of this TP rank's slices over the DP group. */
typedef struct dptp_case {
    int32_t ids[PP_B * TP_T], tg[PP_B * TP_T];
    int zero;                /* 0: DDP, else the ZeRO stage */
    int tp;                  /* TP ranks a copy: 2 on 4 thread ranks, 1 on 2 */
    pdp_recompute recompute; /* of the copies (the reference recomputes nothing) */
    double unit_mb;          /* ZeRO's bucket_cap_mb (0: the default) */
    int param_buffers;       /* ZeRO-3's (0: the default, 2) */
    const pdp_model *ref;
    double worst[4];
    int64_t gathers;         /* ZeRO-3: rank 0's all-gathers of the last step */
} dptp_case;

static pdp_status dptp_rank(const pdp_launch_ctx *ctx, void *user)
{
    dptp_case *c = (dptp_case *)user;
    int dp = ctx->rank / c->tp, tpr = ctx->rank % c->tp, s;
    pdp_comm *tp = NULL, *dc = NULL;
    pdp_gpt_desc d = tp_desc();
    pdp_model *m = NULL;
    pdp_ddp *ddp = NULL;
    pdp_zero *z = NULL;
    pdp_zero_desc zd;
    pdp_optim *o = NULL;
    pdp_optim_desc od;
    pdp_tensor x;
    int64_t shape[2] = {PP_B / 2, TP_T};
    float loss, norm;
    pdp_status st;
    memset(&od, 0, sizeof od);
    od.kind = PDP_OPTIM_ADAMW, od.lr = 1e-3, od.weight_decay = 0.1;
    memset(&zd, 0, sizeof zd);
    zd.stage = c->zero;
    zd.bucket_cap_mb = c->unit_mb;
    zd.param_buffers = c->zero == 3 ? c->param_buffers : 0;
    d.recompute = c->recompute;
    if ((st = pdp_comm_split(ctx->world, dp, tpr, &tp)) != PDP_OK ||
        (st = pdp_comm_split(ctx->world, tpr, dp, &dc)) != PDP_OK)
        goto out;
    d.tp = tp;
    if ((st = pdp_gpt_create(&m, &d)) != PDP_OK) goto out;
    if ((st = c->zero ? pdp_zero_create(&z, m, dc, &zd) : pdp_ddp_create(&ddp, m, dc, NULL)) !=
            PDP_OK ||
        (st = c->zero ? pdp_zero_optim_create(&o, z, &od) : pdp_optim_create(&o, m, &od)) !=
            PDP_OK)
        goto out;
    pdp_tensor_wrap_ids(c->ids + dp * (PP_B / 2) * TP_T, pdp_cpu(), 2, shape, &x);
    for (s = 0; s < 3 && st == PDP_OK; s++) {
        const int32_t *tg = c->tg + dp * (PP_B / 2) * TP_T;
        if (c->zero) {
            if ((st = pdp_zero_forward_backward(z, &x, tg, &loss)) == PDP_OK &&
                (st = pdp_zero_finish(z)) == PDP_OK &&
                (st = pdp_zero_clip_grad_norm(z, 0.5f, &norm)) == PDP_OK)
                st = pdp_zero_step(z, o);
        } else {
            if ((st = pdp_ddp_forward_backward(ddp, &x, tg, &loss)) == PDP_OK &&
                (st = pdp_ddp_finish(ddp)) == PDP_OK &&
                (st = pdp_clip_grad_norm(m, 0.5f, &norm)) == PDP_OK &&
                (st = pdp_optim_step(o)) == PDP_OK)
                pdp_optim_zero_grad(o);
        }
    }
    if (st == PDP_OK && c->zero == 3) { /* the block, to compare */
        pdp_zero_stats zs;
        pdp_zero_get_stats(z, &zs);
        if (ctx->rank == 0) c->gathers = zs.gathers;
        st = pdp_zero_gather_params(z, NULL);
    }
    if (st == PDP_OK) st = fixture_worst_by_name(m, c->ref, &c->worst[ctx->rank]);
out:
    pdp_optim_free(o);
    pdp_ddp_free(ddp);
    pdp_zero_free(z);
    pdp_model_free(m);
    pdp_comm_free(dc);
    pdp_comm_free(tp);
    return st;
}

TEST gpt_dp_x_tp_under_ddp_and_zero1_equals_one_device(void)
{
    static dptp_case c;
    pdp_model *ref = NULL;
    int64_t i;
    int r;
    memset(&c, 0, sizeof c);
    for (i = 0; i < PP_B * TP_T; i++) {
        c.ids[i] = (int32_t)((i * 9 + 2) % 13);
        c.tg[i] = i % TP_T == 1 ? -1 : (int32_t)((i * 4 + 3) % 13);
    }
    ASSERT_ENUM_EQ(PDP_OK, gpt_single(c.ids, c.tg, 3, NULL, &ref), pdp_status_name);
    c.ref = ref;
    c.tp = 2;
    for (c.zero = 0; c.zero <= 1; c.zero++) {
        memset(c.worst, 0, sizeof c.worst);
        ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_launch(4, NULL, dptp_rank, &c),
                        pdp_status_name);
        for (r = 0; r < 4; r++) ASSERTm(c.zero ? "ZeRO-1" : "DDP", c.worst[r] <= 1e-5);
    }
    pdp_model_free(ref);
    PASS();
}

/* Recomputation under the data-parallel executors: DDP and ZeRO stages 1, 2 and 3 on 2
   thread ranks (the dptp runs with TP 1), each recomputing SELECTIVE or FULL, with dropout
   (a recomputed mask must be the one forward drew) and clipping, 3 AdamW steps: the
   parameters of one device that recomputes nothing, within 1e-5. Stage 3 runs with a unit
   per layer, so a FULL region (3 layers with parameters) spans 3 units, under 2 gather
   slots (the recompute pushes the region's first units out and backward gathers them
   again: more all-gathers than SELECTIVE's) and under 3 (the region stays gathered from
   its recompute through its backward: SELECTIVE's all-gathers, no more). (DataParallel:
   gpt_under_dataparallel_equals_one_device; TP and pipelines: their own tests.) */
TEST gpt_recomputation_under_ddp_and_zero_equals_one_device(void)
{
    static dptp_case c;
    static const char *name[] = {"DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3"};
    pdp_model *ref = NULL;
    char msg[96];
    int64_t i, gathers[2][2]; /* ZeRO-3's, [FULL][param_buffers 3] */
    int r, rc;
    memset(&c, 0, sizeof c);
    for (i = 0; i < PP_B * TP_T; i++) {
        c.ids[i] = (int32_t)((i * 5 + 4) % 13);
        c.tg[i] = i % TP_T == 6 ? -1 : (int32_t)((i * 7 + 2) % 13);
    }
    ASSERT_ENUM_EQ(PDP_OK, gpt_single(c.ids, c.tg, 3, NULL, &ref), pdp_status_name);
    c.ref = ref;
    c.tp = 1;
    for (rc = PDP_RECOMPUTE_SELECTIVE; rc <= PDP_RECOMPUTE_FULL; rc++) {
        c.recompute = (pdp_recompute)rc;
        for (c.zero = 0; c.zero <= 3; c.zero++)
            for (c.param_buffers = 2; c.param_buffers <= (c.zero == 3 ? 3 : 2);
                 c.param_buffers++) {
                c.unit_mb = c.zero == 3 ? 1e-9 : 0.0; /* a unit per layer */
                memset(c.worst, 0, sizeof c.worst);
                ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_launch(2, NULL, dptp_rank, &c),
                                pdp_status_name);
                snprintf(msg, sizeof msg, "%s, recompute %s, param_buffers %d", name[c.zero],
                         rc == PDP_RECOMPUTE_FULL ? "full" : "selective", c.param_buffers);
                for (r = 0; r < 2; r++) ASSERTm(msg, c.worst[r] <= 1e-5);
                if (c.zero == 3)
                    gathers[rc == PDP_RECOMPUTE_FULL][c.param_buffers - 2] = c.gathers;
            }
    }
    ASSERT(gathers[1][0] > gathers[0][0]);
    ASSERT_EQ(gathers[0][1], gathers[1][1]);
    pdp_model_free(ref);
    PASS();
}

/* ---- gpt: evaluation and the reports (pdp_gpt_evaluate, pdp_gpt_activation_report,
   pdp_gpt_tp_report) ---- */

/* The report on every rank of a TP group (or one device): its text, the block's bytes, and
   one step's TP traffic beside the formula. */
typedef struct report_case {
    pdp_gpt_desc d;
    int tp;
    char text[4096], tp_line[256];
    int64_t block, sent;
    double formula;
    pdp_status st;
} report_case;

static pdp_status report_rank(const pdp_launch_ctx *ctx, void *user)
{
    report_case *c = (report_case *)user;
    pdp_gpt_desc d = c->d;
    pdp_model *m = NULL;
    int32_t ids[TP_B * TP_T], tg[TP_B * TP_T];
    int64_t shape[2] = {TP_B, TP_T}, i;
    pdp_tensor x;
    pdp_tp_stats ts;
    float loss;
    pdp_status st;
    char text[4096];
    int64_t block;
    if (c->tp > 1) d.tp = ctx->world;
    for (i = 0; i < TP_B * TP_T; i++) ids[i] = (int32_t)((i * 5 + 1) % 13), tg[i] = ids[i];
    pdp_tensor_wrap_ids(ids, pdp_cpu(), 2, shape, &x);
    if ((st = pdp_gpt_create(&m, &d)) != PDP_OK) return st;
    st = pdp_gpt_activation_report(m, &d, TP_B, text, sizeof text, &block);
    if (st == PDP_OK && c->tp > 1) { /* one step's traffic */
        pdp_tp_reset_stats(m);
        st = pdp_model_forward_backward(m, &x, tg, &loss);
        pdp_tp_get_stats(m, &ts);
        if (st == PDP_OK && ctx->rank == 0)
            st = pdp_gpt_tp_report(&d, TP_B, &ts, c->tp_line, sizeof c->tp_line, &c->formula);
        if (ctx->rank == 0) c->sent = ts.bytes_sent;
    }
    if (ctx->rank == 0) memcpy(c->text, text, sizeof text), c->block = block;
    pdp_model_free(m);
    return st;
}

/* One block's activations against a count by hand, in floats per s b h (s T, b the batch,
   h dim, a heads, t the TP size): what TP splits, 12/t (c_attn 3, the attention's output 1,
   c_fc 4, GELU 4) and P's as/(ht) (not under SELECTIVE); 2 the row-parallel outputs, 2 f's
   outputs (TP); and what SP splits: 2 LayerNorms (1 + 2/h: the output, mean and rstd), 2
   g's outputs (TP), 2 Dropouts (output and mask, 2 each), 2 ResidualAdds. FULL keeps the
   adds only. Megatron's rows against the paper's Table 2 (16 bits, dropout on): 34 +
   5as/h, 34 and 2 on one device; 10 + 24/t + 5as/(ht), 10 + 24/t and 2 under TP; 34/t +
   5as/(ht), 34/t and 2/t under TP + SP; and with p = 0 in fp32 (no masks: 64 + 4as/h). */
TEST gpt_activation_report_matches_megatron_and_a_count_by_hand(void)
{
    static const char *table2[3][3] = {{"34 + 5as/h", "34", "2"},
                                       {"10 + 24/t + 5as/(ht)", "10 + 24/t", "2"},
                                       {"34/t + 5as/(ht)", "34/t", "2/t"}};
    static const double c16[3][3][2] = {{{34, 5}, {34, 0}, {2, 0}}, /* constant, as/h's */
                                        {{10 + 12, 5}, {10 + 12, 0}, {2, 0}},
                                        {{17, 5}, {17, 0}, {1, 0}}}; /* at t = 2 */
    int cfg, mode, drop, k;
    char msg[160], want[64];
    for (cfg = 0; cfg < 3; cfg++) /* one device, TP 2, TP 2 + SP */
        for (drop = 0; drop < 2; drop++)
            for (mode = 0; mode < 3; mode++) {
                static report_case c;
                double t = cfg ? 2 : 1, s = TP_T, h = TP_C, a = 6, b = TP_B, sbh = s * b * h;
                double shard, inner, outer, as, by_hand;
                memset(&c, 0, sizeof c);
                c.d = tp_desc();
                c.d.dropout = drop ? 0.1f : 0.0f;
                c.d.recompute = (pdp_recompute)mode;
                c.d.sequence_parallel = cfg == 2;
                c.tp = cfg ? 2 : 1;
                snprintf(msg, sizeof msg, "TP %d%s, dropout %d, recompute %d", c.tp,
                         cfg == 2 ? " + SP" : "", drop, mode);
                ASSERT_ENUM_EQm(msg, PDP_OK, pdp_launch(c.tp, NULL, report_rank, &c),
                                pdp_status_name);
                shard = cfg == 2 ? 1 / t : 1, as = a * s / (h * t);
                inner = 12 / t + 2 + 2 * (cfg > 0);
                outer = 2 * (1 + 2 / h) + 2 * (cfg > 0) + 4 * drop + 2;
                by_hand = 4 * (mode == 2 ? 2 * shard : inner + outer * shard + (mode ? 0 : as));
                ASSERTm(msg, fabs((double)c.block - by_hand * sbh) <= 1e-6 * by_hand * sbh);
                snprintf(want, sizeof want, "= %.2f, %.2f MB", (double)c.block / sbh,
                         (double)c.block / 1e6);
                ASSERTm(msg, strstr(c.text, want) != NULL);
                for (k = 0; k < 3 && drop; k++) { /* the paper's formulas and their values */
                    double v = c16[cfg][k][0] + c16[cfg][k][1] * as;
                    snprintf(want, sizeof want, "%-20s %6.2f", table2[cfg][k], v);
                    ASSERTm(msg, strstr(c.text, want) != NULL);
                }
                if (!drop && cfg == 0) {
                    snprintf(want, sizeof want, "%-20s %6.2f", "64 + 4as/h", 64 + 4 * as);
                    ASSERTm(msg, strstr(c.text, want) != NULL);
                }
            }
    {   /* too small a buffer fails by name */
        static report_case c;
        pdp_model *m = NULL;
        c.d = tp_desc();
        ASSERT_ENUM_EQ(PDP_OK, pdp_gpt_create(&m, &c.d), pdp_status_name);
        ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_gpt_activation_report(m, &c.d, TP_B, c.text, 100,
                                                                  NULL), pdp_status_name);
        ASSERT(strstr(pdp_last_error(), "pdp_gpt_activation_report"));
        /* a desc that is not the model's: its formulas would be another model's */
        c.d.layers++;
        ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_gpt_activation_report(m, &c.d, TP_B, c.text,
                                                                  sizeof c.text, NULL),
                       pdp_status_name);
        ASSERT(strstr(pdp_last_error(), "desc does not describe the model"));
        c.d.layers--;
        c.d.recompute = PDP_RECOMPUTE_FULL;
        ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_gpt_activation_report(m, &c.d, TP_B, c.text,
                                                                  sizeof c.text, NULL),
                       pdp_status_name);
        pdp_model_free(m);
    }
    PASS();
}

/* pdp_gpt_tp_report's formula is the traffic a TP rank measures in one forward and backward
   (TP 2, with and without SP, recompute none and full). */
TEST gpt_tp_report_formula_is_the_measured_traffic(void)
{
    int sp, mode;
    char msg[96];
    for (sp = 0; sp < 2; sp++)
        for (mode = 0; mode < 3; mode += 2) {
            static report_case c;
            memset(&c, 0, sizeof c);
            c.d = tp_desc();
            c.d.recompute = (pdp_recompute)mode;
            c.d.sequence_parallel = sp;
            c.tp = 2;
            snprintf(msg, sizeof msg, "TP 2%s, recompute %d", sp ? " + SP" : "", mode);
            ASSERT_ENUM_EQm(msg, PDP_OK, pdp_launch(2, NULL, report_rank, &c), pdp_status_name);
            ASSERTm(msg, c.sent > 0);
            ASSERT_EQm(msg, (double)c.sent, c.formula);
            ASSERTm(msg, strstr(c.tp_line, sp ? (mode ? "(12L + 2;" : "(8L + 2;")
                                              : (mode ? "(6L;" : "(4L;")) != NULL);
            ASSERTm(msg, !strstr(c.tp_line, "LayerNorms' gradients all-reduced") == !sp);
        }
    PASS();
}

/* The formula at a batch whose bytes, batch T dim 4, pass INT64_MAX: computed in double (an
   int64 product overflowed, UB, and printed a tensor of negative MB). No collective runs:
   rank 0 of a local group of 2 is enough for t = 2. */
TEST gpt_tp_report_formula_past_int64(void)
{
    pdp_local_group *g = NULL;
    pdp_comm *c = NULL;
    pdp_gpt_desc d;
    pdp_tp_stats s;
    char line[512];
    double formula = 0, p = 4.0 * 4398046511104.0 * 1024.0 * 768.0; /* batch 2^42 */
    memset(&d, 0, sizeof d);
    memset(&s, 0, sizeof s);
    ASSERT_ENUM_EQ(PDP_OK, pdp_local_group_create(&g, 2, NULL), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_comm_create_local(&c, g, 0), pdp_status_name);
    d.context = 1024, d.layers = 12, d.heads = 12, d.dim = 768, d.tp = c;
    ASSERT_ENUM_EQ(PDP_OK, pdp_gpt_tp_report(&d, (int64_t)1 << 42, &s, line, sizeof line,
                                             &formula), pdp_status_name);
    pdp_comm_free(c);
    pdp_local_group_free(g);
    ASSERT_IN_RANGE(48.0 * p, formula, 48.0 * p * 1e-12); /* 4L = 48 of 2 (t - 1) / t = 1 */
    ASSERT(strstr(line, "of a 13835058055282.164 MB tensor"));
    PASS();
}

/* The reports' argument errors say what is wrong and nothing else: a NULL buf at batch 2 was
   "NULL argument or batch 2 < 1", a comparison that is false. */
TEST gpt_reports_name_the_bad_argument(void)
{
    pdp_local_group *g = NULL;
    pdp_comm *c = NULL;
    pdp_model *m = NULL;
    pdp_gpt_desc d;
    pdp_tp_stats s;
    pdp_zero_memory mm;
    char buf[64];
    memset(&d, 0, sizeof d);
    memset(&s, 0, sizeof s);
    d.context = 8, d.layers = 1, d.heads = 2, d.dim = 8;
    ASSERT_ENUM_EQ(PDP_OK, pdp_gpt_create(&m, &d), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_zero_memory_plan(m, 1, 0, NULL, NULL, &mm), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_gpt_activation_report(m, &d, 2, NULL, 64, NULL),
                   pdp_status_name);
    ASSERT_STR_EQ("pdp_gpt_activation_report: buf is NULL", pdp_last_error());
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_gpt_activation_report(m, &d, 0, buf, 64, NULL),
                   pdp_status_name);
    ASSERT_STR_EQ("pdp_gpt_activation_report: batch 0 < 1", pdp_last_error());
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_gpt_memory_report(m, &mm, 2, NULL, 64), pdp_status_name);
    ASSERT_STR_EQ("pdp_gpt_memory_report: buf is NULL", pdp_last_error());
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_gpt_memory_report(NULL, &mm, 2, buf, 64),
                   pdp_status_name);
    ASSERT_STR_EQ("pdp_gpt_memory_report: m is NULL", pdp_last_error());
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_gpt_tp_report(&d, 2, &s, buf, 64, NULL), pdp_status_name);
    ASSERT_STR_EQ("pdp_gpt_tp_report: desc->tp is NULL", pdp_last_error());
    ASSERT_ENUM_EQ(PDP_OK, pdp_local_group_create(&g, 1, NULL), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_comm_create_local(&c, g, 0), pdp_status_name);
    d.tp = c;
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_gpt_tp_report(&d, -3, &s, buf, 64, NULL),
                   pdp_status_name);
    ASSERT_STR_EQ("pdp_gpt_tp_report: batch -3 < 1", pdp_last_error());
    pdp_comm_free(c);
    pdp_local_group_free(g);
    pdp_model_free(m);
    PASS();
}

/* pdp_gpt_evaluate: the mean loss over the windows a pdp_rng seeded (seed, 0) draws, in
   evaluation mode: a GPT with dropout 0.1 evaluates as the same GPT without dropout trains
   (its forward_backward's loss over the same windows), and stays in training mode. */
TEST gpt_evaluate_is_the_mean_loss_without_dropout(void)
{
    pdp_token_dataset *ds = NULL;
    pdp_token_dataset_desc td;
    pdp_gpt_desc d = tp_desc();
    pdp_model *drop = NULL, *plain = NULL;
    int32_t x[TP_B * TP_T], y[TP_B * TP_T];
    int64_t shape[2] = {TP_B, TP_T};
    double sum = 0;
    float loss, l;
    pdp_tensor ids;
    pdp_rng r;
    int k;
    memset(&td, 0, sizeof td);
    td.context = TP_T, td.max_tokens = 4096;
    ASSERT_ENUM_EQ(PDP_OK, pdp_token_dataset_synthetic(&ds, &td), pdp_status_name);
    d.vocab = 256, d.dropout = 0.1f;
    ASSERT_ENUM_EQ(PDP_OK, pdp_gpt_create(&drop, &d), pdp_status_name);
    d.dropout = 0;
    ASSERT_ENUM_EQ(PDP_OK, pdp_gpt_create(&plain, &d), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_gpt_evaluate(drop, ds, PDP_SPLIT_VAL, TP_B, 3, 7, &loss),
                   pdp_status_name);
    pdp_rng_seed(&r, 7, 0);
    pdp_tensor_wrap_ids(x, pdp_cpu(), 2, shape, &ids);
    for (k = 0; k < 3; k++) {
        ASSERT_ENUM_EQ(PDP_OK, pdp_token_dataset_sample(ds, PDP_SPLIT_VAL, &r, TP_B, x, y),
                       pdp_status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward_backward(plain, &ids, y, &l), pdp_status_name);
        sum += l;
    }
    ASSERT_IN_RANGE(sum / 3, loss, 1e-6 * sum);
    ASSERT_ENUM_EQ(PDP_OK, pdp_gpt_evaluate(drop, ds, PDP_SPLIT_VAL, TP_B, 3, 7, &l),
                   pdp_status_name);
    ASSERT_EQ(loss, l); /* the same windows again */
    ASSERT_ENUM_EQ(PDP_OK, pdp_gpt_evaluate(drop, ds, PDP_SPLIT_TRAIN, TP_B, 3, 7, &l),
                   pdp_status_name);
    ASSERT(l != loss); /* another split */
    pdp_model_forward_backward(drop, &ids, y, &l); /* training mode again: dropout on */
    pdp_model_forward_backward(plain, &ids, y, &loss);
    ASSERT(l != loss);
    pdp_token_dataset_free(ds);
    td.context = TP_T + 1; /* windows the model does not take: refused by name */
    ASSERT_ENUM_EQ(PDP_OK, pdp_token_dataset_synthetic(&ds, &td), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_gpt_evaluate(drop, ds, PDP_SPLIT_VAL, TP_B, 1, 7, &l),
                   pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "pdp_gpt_evaluate"));
    pdp_token_dataset_free(ds);
    pdp_model_free(drop);
    pdp_model_free(plain);
    PASS();
}

/* pdp_gpt_generate_text: the prompt's bytes and pdp_gpt_generate's draws from the same seed
   (the reference: the ids by pdp_gpt_generate itself), each byte as text by hand: newline
   and tab kept, other control bytes '?', every other byte (UTF-8 parts too) as it is; a
   buf one byte short, an empty prompt and another vocabulary refused by name. */
TEST gpt_generate_text_is_generate_as_printable_bytes(void)
{
    static const char prompt[] = "\001Q:\t\n\177";
    enum { P = sizeof prompt - 1, N = 40 };
    pdp_gpt_desc d = tp_desc();
    pdp_model *m = NULL, *small = NULL;
    int32_t ids[P + N];
    char text[P + N + 1], want[P + N + 1];
    int high = 0, i;
    pdp_rng r;
    d.vocab = 256, d.dropout = 0;
    ASSERT_ENUM_EQ(PDP_OK, pdp_gpt_create(&m, &d), pdp_status_name);
    pdp_rng_seed(&r, 3, 1);
    ASSERT_ENUM_EQ(PDP_OK, pdp_gpt_generate_text(m, prompt, N, 1.0f, 0, &r, text, sizeof text),
                   pdp_status_name);
    for (i = 0; i < P; i++) ids[i] = (unsigned char)prompt[i];
    pdp_rng_seed(&r, 3, 1);
    ASSERT_ENUM_EQ(PDP_OK, pdp_gpt_generate(m, ids, P, N, 1.0f, 0, &r), pdp_status_name);
    for (i = 0; i < P + N; i++) {
        int c = ids[i];
        want[i] = (char)(c == 10 || c == 9 || (c > 31 && c != 127) ? c : '?');
        high += c > 127;
    }
    want[P + N] = '\0';
    ASSERT_STR_EQ(want, text);
    ASSERT_EQ(0, memcmp(text, "?Q:\t\n?", P)); /* the prompt's control bytes */
    ASSERT(high > 0); /* an untrained GPT draws bytes above 127 too: kept as they are */
    ASSERT_EQ((size_t)(P + N), strlen(text));
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_gpt_generate_text(m, prompt, N, 1.0f, 0, &r, text,
                   P + N), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "pdp_gpt_generate_text"));
    ASSERT(strstr(pdp_last_error(), "needs 47"));
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_gpt_generate_text(m, "", N, 1.0f, 0, &r, text,
                   sizeof text), pdp_status_name);
    d.vocab = 255;
    ASSERT_ENUM_EQ(PDP_OK, pdp_gpt_create(&small, &d), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_gpt_generate_text(small, "a", 1, 1.0f, 0, &r, text,
                   sizeof text), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "256 bytes"));
    pdp_model_free(small);
    pdp_model_free(m);
    PASS();
}

/* pdp_gpt_memory_report: each stage's line against the one written here from a table of
   which stage shards what (the formula's divisor N or 1, and "/N" beside it), the
   parameter count of the model and its activations at the batch; too small a buf refused. */
TEST gpt_memory_report_is_each_stages_formula_beside_the_bytes(void)
{
    static const struct { int stage, params, grads, state; } shard[4] = {
        {0, 1, 1, 1}, {1, 1, 1, 2}, {2, 1, 2, 2}, {3, 2, 2, 2}, /* divisors at N = 2 */
    };
    pdp_gpt_desc d = tp_desc();
    pdp_model *m = NULL;
    pdp_optim *o = NULL;
    pdp_optim_desc od;
    pdp_zero_memory mm;
    char line[512], want[512];
    double P4;
    int64_t act;
    int k;
    memset(&od, 0, sizeof od);
    od.kind = PDP_OPTIM_ADAMW, od.lr = 1e-3;
    ASSERT_ENUM_EQ(PDP_OK, pdp_gpt_create(&m, &d), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&o, m, &od), pdp_status_name);
    P4 = 4.0 * (double)pdp_model_param_count(m);
    act = pdp_model_activation_bytes(m, 0, pdp_model_num_layers(m), 3);
    ASSERT(act > 0);
    for (k = 0; k < 4; k++) {
        ASSERT_ENUM_EQ(PDP_OK, pdp_zero_memory_plan(m, 2, shard[k].stage, NULL, o, &mm),
                       pdp_status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp_gpt_memory_report(m, &mm, 3, line, sizeof line),
                       pdp_status_name);
        snprintf(want, sizeof want, "parameters %.2f MB (4Psi%s %.2f), gradients %.2f (4Psi%s "
                 "%.2f), Adam's m, v %.2f (8Psi%s %.2f),\n  activations kept %.2f (3 sequences), "
                 "buffers %.2f (at most %.2f): %.2f MB\n", mm.param_bytes / 1e6,
                 shard[k].params > 1 ? "/N" : "", P4 / shard[k].params / 1e6,
                 mm.grad_bytes / 1e6, shard[k].grads > 1 ? "/N" : "", P4 / shard[k].grads / 1e6,
                 mm.optim_bytes / 1e6, shard[k].state > 1 ? "/N" : "",
                 2 * P4 / shard[k].state / 1e6, act / 1e6, mm.buffer_bytes / 1e6,
                 mm.buffer_bound / 1e6, (mm.param_bytes + mm.grad_bytes + mm.optim_bytes +
                 mm.buffer_bytes + act) / 1e6);
        ASSERT_STR_EQm(want, want, line);
    }
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_gpt_memory_report(m, &mm, 3, line, 100),
                   pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "pdp_gpt_memory_report"));
    pdp_optim_free(o); /* SGD with momentum: one state float a parameter, 4 Psi */
    od.kind = PDP_OPTIM_SGD, od.momentum = 0.9;
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&o, m, &od), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_zero_memory_plan(m, 2, 1, NULL, o, &mm), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_gpt_memory_report(m, &mm, 3, line, sizeof line),
                   pdp_status_name);
    snprintf(want, sizeof want, "momentum %.2f (4Psi/N %.2f)", mm.optim_bytes / 1e6,
             P4 / 2 / 1e6);
    ASSERTm(line, strstr(line, want) != NULL);
    pdp_optim_free(o);
    pdp_model_free(m);
    PASS();
}

/* pdp_gpt_desc_format: a plain desc's line against one written here with the parameters of
   the model pdp_gpt_create builds (pdp_model_param_count, not the formula), then a desc with
   every optional field (vocab, sequence, dropout, TP 2 + SP on 2 thread ranks, bf16 on the
   CPU with its path, selective recomputation): its count the whole model's, the plain
   model's; refused: NULL, layers 0, an unknown recompute or precision, a short buffer, and
   what pdp_gpt_create refuses (heads not dividing dim, sequence past context, dropout 1,
   sequence parallelism without TP). */
static pdp_status desc_format_rank(const pdp_launch_ctx *ctx, void *user)
{
    pdp_gpt_desc d = tp_desc();
    d.dropout = 0.1f, d.tp = ctx->world, d.sequence = TP_T / 2, d.sequence_parallel = true;
    d.precision = PDP_PRECISION_BF16, d.recompute = PDP_RECOMPUTE_SELECTIVE;
    return ctx->rank == 0 ? pdp_gpt_desc_format(&d, (char *)user, 512) : PDP_OK;
}

TEST gpt_desc_format_reads_the_desc(void)
{
    pdp_gpt_desc d = tp_desc();
    pdp_model *m = NULL;
    char got[512], want[512];
    int64_t count;
    d.dropout = 0.0f, d.vocab = 0; /* the defaults: left out of the line */
    ASSERT_ENUM_EQ(PDP_OK, pdp_gpt_create(&m, &d), pdp_status_name);
    count = pdp_model_param_count(m);
    pdp_model_free(m);
    snprintf(want, sizeof want, "GPT %d layers, 6 heads, dim %d, context %d: %lld parameters, "
             "fp32, recompute none", TP_L, TP_C, TP_T, (long long)count);
    ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_gpt_desc_format(&d, got, sizeof got),
                    pdp_status_name);
    ASSERT_STR_EQ(want, got);
    d = tp_desc(); /* vocab 13, dropout 0.1 */
    ASSERT_ENUM_EQ(PDP_OK, pdp_gpt_create(&m, &d), pdp_status_name);
    count = pdp_model_param_count(m);
    pdp_model_free(m);
    ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_launch(2, NULL, desc_format_rank, got),
                    pdp_status_name);
    snprintf(want, sizeof want, "GPT %d layers, 6 heads, dim %d, context %d, vocab 13, sequence "
             "%d, dropout 0.1: %lld parameters, TP 2 + SP, bf16 %s, recompute selective", TP_L,
             TP_C, TP_T, TP_T / 2, (long long)count, pdp_bf16_path_name(pdp_bf16_best_path()));
    ASSERT_STR_EQ(want, got);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_gpt_desc_format(&d, got, 20), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "pdp_gpt_desc_format: 20 bytes"));
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_gpt_desc_format(NULL, got, sizeof got), pdp_status_name);
    ASSERT_STR_EQ("pdp_gpt_desc_format: desc is NULL", pdp_last_error());
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_gpt_desc_format(&d, NULL, 8), pdp_status_name);
    ASSERT_STR_EQ("pdp_gpt_desc_format: buf is NULL", pdp_last_error());
    d.precision = (pdp_precision)2; /* printed as fp32 before it was refused */
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_gpt_desc_format(&d, got, sizeof got), pdp_status_name);
    ASSERT_STR_EQ("pdp_gpt_desc_format: precision 2 (must be FP32 or BF16)", pdp_last_error());
    d.precision = PDP_PRECISION_FP32, d.layers = 0;
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_gpt_desc_format(&d, got, sizeof got), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "pdp_gpt_desc_format: context") &&
           strstr(pdp_last_error(), "layers 0"));
    d.layers = 1, d.recompute = (pdp_recompute)3;
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_gpt_desc_format(&d, got, sizeof got), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "recompute 3"));
    /* whatever pdp_gpt_create refuses before it builds, the line refuses too, with
       pdp_gpt_create's reason (the line was printed for these before) */
    d.recompute = PDP_RECOMPUTE_NONE, d.heads = 5; /* does not divide dim */
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_gpt_desc_format(&d, got, sizeof got), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "pdp_gpt_desc_format: heads 5 do not divide dim"));
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_gpt_create(&m, &d), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "pdp_gpt_create: heads 5 do not divide dim"));
    d.heads = 6, d.sequence = d.context + 1;
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_gpt_desc_format(&d, got, sizeof got), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "is outside [1, context"));
    d.sequence = 0, d.dropout = 1.0f;
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_gpt_desc_format(&d, got, sizeof got), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "dropout 1 is outside [0, 1)"));
    d.dropout = 0.0f, d.sequence_parallel = true; /* without desc.tp */
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_gpt_desc_format(&d, got, sizeof got), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "needs desc.tp"));
    PASS();
}

SUITE(gpt)
{
    RUN_TEST(gpt_desc_format_reads_the_desc);
    RUN_TEST(gpt_recomputation_under_ddp_and_zero_equals_one_device);
    RUN_TEST(gpt_dp_x_tp_under_ddp_and_zero1_equals_one_device);
    RUN_TEST(gpt_3d_dp_tp_pp_equals_one_device);
    RUN_TEST(gpt_pipeline_checkpoint_resumes_at_another_stage_count);
    RUN_TEST(gpt_recomputation_is_exact_and_keeps_less);
    RUN_TEST(gpt_pipeline_of_blocks_equals_one_device);
    RUN_TEST(gpt_tensor_parallel_by_heads_equals_one_device);
    RUN_TEST(gpt_under_dataparallel_equals_one_device);
    RUN_TEST(gpt_under_ddp_equals_one_device);
    RUN_TEST(gpt_names_and_shapes_are_nanogpts);
    RUN_TEST(gpt_embedding_backward_refuses_ids_changed_after_the_forward);
    RUN_TEST(gpt_matches_pytorch_logits_loss_and_every_gradient);
    RUN_TEST(gpt_gelu_erf_matches_nanogpts_exact_gelu);
    RUN_TEST(gpt_five_adamw_steps_with_clipping_match_pytorch);
    RUN_TEST(gpt_adamw_nanogpt_decay_groups_match_pytorch);
    RUN_TEST(gpt_bf16_matches_autocast_within_a_bound);
    RUN_TEST(gpt_later_tokens_change_no_earlier_output);
    RUN_TEST(gpt_gradients_match_finite_differences);
    RUN_TEST(gpt_residual_region_is_x_plus_its_branch);
    RUN_TEST(gpt_generate_greedy_top_k_and_seeds);
    RUN_TEST(gpt_errors_name_layer_position_and_lengths);
    /* evaluation and the reports */
    RUN_TEST(gpt_activation_report_matches_megatron_and_a_count_by_hand);
    RUN_TEST(gpt_tp_report_formula_is_the_measured_traffic);
    RUN_TEST(gpt_tp_report_formula_past_int64);
    RUN_TEST(gpt_reports_name_the_bad_argument);
    RUN_TEST(gpt_evaluate_is_the_mean_loss_without_dropout);
    RUN_TEST(gpt_generate_text_is_generate_as_printable_bytes);
    RUN_TEST(gpt_memory_report_is_each_stages_formula_beside_the_bytes);
}

GREATEST_MAIN_DEFS();

int main(int argc, char **argv)
{
    GREATEST_MAIN_BEGIN();
    RUN_SUITE(gpt);
    GREATEST_MAIN_END();
}
