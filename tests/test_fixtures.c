/* Layers, losses and two small models against PyTorch (tests/fixtures/NAME.bin, written
   by tools/gen_fixtures.py with torch 1.13, float32, CPU).

   Each layer file holds a module's input x, an upstream gradient dy, the output y,
   the input gradient dx = d(sum(y * dy))/dx, the parameters under their state_dict
   names and their gradients ("grad.0.weight"). We load PyTorch's parameters into
   our model (pdp_model_find_param + memcpy), run forward and backward, and compare
   every tensor with the metric of fixture.h:

       max |ours - torch| / max(max |torch|, 1)  <=  1e-5

   i.e. the error relative to the reference's scale (absolute below 1). The model
   files (an MLP with GELU and LayerNorm, a CNN with conv, ReLU, max-pool, flatten
   and linear) go through pdp_model_forward_backward with cross-entropy instead of
   dy. A missing fixture skips its test with the command that writes it.

   The gpt_*.bin files (tools/gpt_reference.py: a nanoGPT-layout GPT, vocab 67, context
   16, 2 layers, 4 heads, dim 48) wait for pdp's GPT; until then their tests check the
   files' contents and recompute the forward stage by stage from what pdp has. */
#define PDP_IMPLEMENTATION
#include "pdp.h"
#include "pdp_test.h"
#include "fixture.h"

#define FIX_TOL 1e-5

/* ---- helpers ---- */

static pdp_model *model_for(const fixture_tensor *x, uint64_t seed)
{
    pdp_model_desc d;
    pdp_model *m = NULL;
    int i;
    memset(&d, 0, sizeof d);
    d.input_ndim = x->ndim - 1;
    for (i = 1; i < x->ndim && i < 4; i++) d.input_shape[i - 1] = x->shape[i];
    d.seed = seed;
    return pdp_model_create(&m, &d) == PDP_OK ? m : NULL;
}

/* A fixture tensor as a pdp_tensor view. */
static void as_tensor(const fixture_tensor *t, pdp_tensor *out)
{
    pdp_tensor_wrap(t->data, pdp_cpu(), t->ndim, t->shape, out);
}

/* The comparison of one tensor, by name: same count, error within FIX_TOL. */
static enum greatest_test_res expect_close(const fixture *f, const char *name, const float *ours,
                                           int64_t count)
{
    const fixture_tensor *ref = fixture_find(f, name);
    double err;
    char msg[768];
    snprintf(msg, sizeof msg, "%s: no tensor \"%s\"", f->path, name);
    ASSERTm(msg, ref != NULL);
    snprintf(msg, sizeof msg, "%s: \"%s\" has %lld elements, ours %lld", f->path, name,
             (long long)ref->count, (long long)count);
    ASSERTm(msg, ref->count == count);
    err = fixture_rel_err(ours, ref->data, count);
    snprintf(msg, sizeof msg, "%s: \"%s\" differs from PyTorch by %.3g (tolerance %g)", f->path,
             name, err, FIX_TOL);
    ASSERTm(msg, err <= FIX_TOL);
    PASS();
}

/* Copies PyTorch's parameters into the model, each by its state_dict name. */
static enum greatest_test_res load_params(pdp_model *m, const fixture *f)
{
    int p;
    char msg[768];
    for (p = 0; p < pdp_model_num_params(m); p++) {
        pdp_param prm;
        const fixture_tensor *t;
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_param(m, p, &prm), pdp_status_name);
        t = fixture_find(f, prm.name);
        snprintf(msg, sizeof msg, "%s: parameter \"%s\" missing or of another size", f->path,
                 prm.name);
        ASSERTm(msg, t != NULL && t->count == prm.value.count);
        memcpy(prm.value.data, t->data, (size_t)t->count * sizeof(float));
    }
    PASS();
}

static enum greatest_test_res expect_param_grads(pdp_model *m, const fixture *f)
{
    int p;
    for (p = 0; p < pdp_model_num_params(m); p++) {
        pdp_param prm;
        char name[64];
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_param(m, p, &prm), pdp_status_name);
        snprintf(name, sizeof name, "grad.%s", prm.name);
        CHECK_CALL(expect_close(f, name, prm.grad.data, prm.grad.count));
    }
    PASS();
}

/* Forward x, backward dy (with the input gradient), against y, dx and the
   parameter gradients. The model's layers are already added. */
static enum greatest_test_res check_module(pdp_model *m, const fixture *f)
{
    const fixture_tensor *x = fixture_find(f, "x"), *dy = fixture_find(f, "dy");
    const pdp_tensor *y;
    pdp_tensor xt;
    float *dx;
    ASSERT(m != NULL && x != NULL && dy != NULL);
    CHECK_CALL(load_params(m, f));
    as_tensor(x, &xt);
    pdp_model_zero_grad(m);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward(m, &xt, &y), pdp_status_name);
    CHECK_CALL(expect_close(f, "y", y->data, y->count));
    ASSERT_EQ(dy->count, y->count);
    dx = (float *)malloc((size_t)x->count * sizeof *dx);
    ASSERT(dx != NULL);
    ASSERT_ENUM_EQ(PDP_OK, fixture_backward_with_dx(m, dy->data, dx), pdp_status_name);
    CHECK_CALL(expect_close(f, "dx", dx, x->count));
    free(dx);
    CHECK_CALL(expect_param_grads(m, f));
    PASS();
}

/* pdp_model_forward_backward against the loss, the logits, all parameter
   gradients; then the input gradient from PyTorch's dlogits. */
static enum greatest_test_res check_classifier(pdp_model *m, const fixture *f)
{
    const fixture_tensor *x = fixture_find(f, "x"), *lab = fixture_find(f, "labels");
    const fixture_tensor *dy = fixture_find(f, "dy");
    const pdp_tensor *y;
    pdp_tensor xt;
    int32_t labels[64];
    float loss, *dx;
    int64_t i;
    ASSERT(m != NULL && x != NULL && lab != NULL && dy != NULL && lab->count <= 64);
    for (i = 0; i < lab->count; i++) labels[i] = (int32_t)lab->data[i];
    CHECK_CALL(load_params(m, f));
    as_tensor(x, &xt);
    pdp_model_zero_grad(m);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward_backward(m, &xt, labels, &loss), pdp_status_name);
    CHECK_CALL(expect_close(f, "loss", &loss, 1));
    CHECK_CALL(expect_close(f, "y", m->out_view.data, m->out_view.count));
    CHECK_CALL(expect_param_grads(m, f));
    dx = (float *)malloc((size_t)x->count * sizeof *dx);
    ASSERT(dx != NULL);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward(m, &xt, &y), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, fixture_backward_with_dx(m, dy->data, dx), pdp_status_name);
    CHECK_CALL(expect_close(f, "dx", dx, x->count));
    free(dx);
    PASS();
}

/* ---- layers ---- */

TEST fixtures_linear(void)
{
    fixture f;
    pdp_model *m;
    FIXTURE_LOAD_OR_SKIP(&f, "linear.bin");
    m = model_for(fixture_find(&f, "x"), 1);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_linear(m, 5), pdp_status_name);
    CHECK_CALL(check_module(m, &f));
    pdp_model_free(m);
    fixture_free(&f);
    PASS();
}

TEST fixtures_activations(void)
{
    static const char *files[6] = {"relu.bin", "gelu.bin", "tanh.bin", "sigmoid.bin",
                                   "silu.bin", "gelu_erf.bin"};
    pdp_status (*add[6])(pdp_model *) = {pdp_model_add_relu,    pdp_model_add_gelu,
                                         pdp_model_add_tanh,    pdp_model_add_sigmoid,
                                         pdp_model_add_silu,    pdp_model_add_gelu_erf};
    int k;
    for (k = 0; k < 6; k++) {
        fixture f;
        pdp_model *m;
        int rc = fixture_load(&f, files[k]);
        if (rc == FIXTURE_MISSING)
            SKIPm("fixture missing (run /usr/bin/python3 tools/gen_fixtures.py)");
        ASSERT_EQm(files[k], FIXTURE_OK, rc);
        m = model_for(fixture_find(&f, "x"), 2);
        ASSERT_ENUM_EQ(PDP_OK, add[k](m), pdp_status_name);
        CHECK_CALL(check_module(m, &f));
        pdp_model_free(m);
        fixture_free(&f);
    }
    PASS();
}

TEST fixtures_layernorm(void)
{
    fixture f;
    pdp_model *m;
    FIXTURE_LOAD_OR_SKIP(&f, "layernorm.bin");
    m = model_for(fixture_find(&f, "x"), 3);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_layernorm(m, 1e-5f), pdp_status_name);
    CHECK_CALL(check_module(m, &f));
    pdp_model_free(m);
    fixture_free(&f);
    PASS();
}

TEST fixtures_conv2d(void)
{
    fixture f;
    pdp_model *m;
    FIXTURE_LOAD_OR_SKIP(&f, "conv2d.bin"); /* Conv2d(2, 4, 3, stride=2, padding=1) */
    m = model_for(fixture_find(&f, "x"), 4);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_conv2d(m, 4, 3, 2, 1), pdp_status_name);
    CHECK_CALL(check_module(m, &f));
    pdp_model_free(m);
    fixture_free(&f);
    FIXTURE_LOAD_OR_SKIP(&f, "conv2d_s1.bin"); /* Conv2d(3, 2, 2), input 4x6 */
    m = model_for(fixture_find(&f, "x"), 5);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_conv2d(m, 2, 2, 1, 0), pdp_status_name);
    CHECK_CALL(check_module(m, &f));
    pdp_model_free(m);
    fixture_free(&f);
    PASS();
}

TEST fixtures_maxpool2d(void)
{
    fixture f;
    pdp_model *m;
    FIXTURE_LOAD_OR_SKIP(&f, "maxpool2d.bin"); /* MaxPool2d(2) on 5x5: floor to 2x2 */
    m = model_for(fixture_find(&f, "x"), 6);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_maxpool2d(m, 2, 0), pdp_status_name);
    CHECK_CALL(check_module(m, &f));
    pdp_model_free(m);
    fixture_free(&f);
    FIXTURE_LOAD_OR_SKIP(&f, "maxpool2d_k3s2.bin"); /* overlapping windows, 7x6 */
    m = model_for(fixture_find(&f, "x"), 7);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_maxpool2d(m, 3, 2), pdp_status_name);
    CHECK_CALL(check_module(m, &f));
    pdp_model_free(m);
    fixture_free(&f);
    PASS();
}

/* ---- losses ---- */

TEST fixtures_cross_entropy(void)
{
    fixture f;
    const fixture_tensor *z, *lab;
    pdp_tensor zt, dt;
    int32_t labels[16];
    float loss, dz[64];
    int64_t i;
    FIXTURE_LOAD_OR_SKIP(&f, "cross_entropy.bin");
    z = fixture_find(&f, "logits");
    lab = fixture_find(&f, "labels");
    ASSERT(z && lab && lab->count <= 16 && z->count <= 64);
    for (i = 0; i < lab->count; i++) labels[i] = (int32_t)lab->data[i];
    as_tensor(z, &zt);
    pdp_tensor_wrap(dz, pdp_cpu(), 2, z->shape, &dt);
    ASSERT_ENUM_EQ(PDP_OK, pdp_loss_cross_entropy(&zt, labels, &loss, &dt), pdp_status_name);
    CHECK_CALL(expect_close(&f, "loss", &loss, 1));
    CHECK_CALL(expect_close(&f, "dlogits", dz, z->count));
    fixture_free(&f);
    PASS();
}

TEST fixtures_mse(void)
{
    fixture f;
    const fixture_tensor *p, *q;
    pdp_tensor pt, qt, dt;
    float loss, dp[64];
    FIXTURE_LOAD_OR_SKIP(&f, "mse.bin");
    p = fixture_find(&f, "pred");
    q = fixture_find(&f, "target");
    ASSERT(p && q && p->count <= 64);
    as_tensor(p, &pt);
    as_tensor(q, &qt);
    pdp_tensor_wrap(dp, pdp_cpu(), p->ndim, p->shape, &dt);
    ASSERT_ENUM_EQ(PDP_OK, pdp_loss_mse(&pt, &qt, &loss, &dt), pdp_status_name);
    CHECK_CALL(expect_close(&f, "loss", &loss, 1));
    CHECK_CALL(expect_close(&f, "dpred", dp, p->count));
    fixture_free(&f);
    PASS();
}

/* ---- models ---- */

TEST fixtures_mlp(void)
{
    fixture f;
    pdp_model *m;
    FIXTURE_LOAD_OR_SKIP(&f, "mlp.bin"); /* 20-16-GELU-LayerNorm-10 */
    m = model_for(fixture_find(&f, "x"), 8);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_linear(m, 16), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_gelu(m), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_layernorm(m, 1e-5f), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_linear(m, 10), pdp_status_name);
    CHECK_CALL(check_classifier(m, &f));
    pdp_model_free(m);
    fixture_free(&f);
    PASS();
}

TEST fixtures_cnn(void)
{
    fixture f;
    pdp_model *m;
    FIXTURE_LOAD_OR_SKIP(&f, "cnn.bin"); /* (1, 6, 6): conv 4x3 p1, ReLU, pool 2, flatten, 36-5 */
    m = model_for(fixture_find(&f, "x"), 9);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_conv2d(m, 4, 3, 1, 1), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_relu(m), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_maxpool2d(m, 2, 0), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_flatten(m), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_linear(m, 5), pdp_status_name);
    CHECK_CALL(check_classifier(m, &f));
    pdp_model_free(m);
    fixture_free(&f);
    PASS();
}

/* ---- the reference GPT (tools/gpt_reference.py) ----
   pdp has no GPT yet: these tests pin the fixtures' contents and conventions for the
   one that comes. fixtures_gpt_contents checks every tensor's name and shape (and
   that no other is there), the ids and targets, that clipping was active in every
   AdamW step and that the autocast logits are bf16 values. fixtures_gpt_by_pieces
   recomputes gpt_forward.bin stage by stage from the fixture's own input to each
   stage, with what pdp has: LayerNorm, Linear and GELU models whose samples are the
   B*T positions, the tied head through pdp_sgemm, and naive loops for the embedding
   sum, causal attention (q | k | v columns, head h = columns h*D..h*D+D-1, scale
   1/sqrt(D)) and the cross entropy with ignore index -1. */

enum { GPT_V = 67, GPT_CTX = 16, GPT_L = 2, GPT_H = 4, GPT_C = 48, GPT_B = 3, GPT_T = 16 };

typedef struct gpt_expect {
    char name[64];
    int ndim;
    int64_t shape[4];
} gpt_expect;

static void gpt_expect_add(gpt_expect *e, int *n, const char *prefix, const char *name, int ndim,
                           int64_t d0, int64_t d1, int64_t d2, int64_t d3)
{
    gpt_expect *x = &e[(*n)++];
    snprintf(x->name, sizeof x->name, "%s%s", prefix, name);
    x->ndim = ndim;
    x->shape[0] = d0;
    x->shape[1] = d1;
    x->shape[2] = d2;
    x->shape[3] = d3;
}

/* The 28 parameter tensors under their nanoGPT names (the tied head once, as wte). */
static void gpt_expect_params(gpt_expect *e, int *n, const char *prefix)
{
    static const struct {
        const char *name;
        int ndim;
        int64_t d0, d1;
    } block[] = {{"ln_1.weight", 1, GPT_C, 0},
                 {"ln_1.bias", 1, GPT_C, 0},
                 {"attn.c_attn.weight", 2, 3 * GPT_C, GPT_C},
                 {"attn.c_attn.bias", 1, 3 * GPT_C, 0},
                 {"attn.c_proj.weight", 2, GPT_C, GPT_C},
                 {"attn.c_proj.bias", 1, GPT_C, 0},
                 {"ln_2.weight", 1, GPT_C, 0},
                 {"ln_2.bias", 1, GPT_C, 0},
                 {"mlp.c_fc.weight", 2, 4 * GPT_C, GPT_C},
                 {"mlp.c_fc.bias", 1, 4 * GPT_C, 0},
                 {"mlp.c_proj.weight", 2, GPT_C, 4 * GPT_C},
                 {"mlp.c_proj.bias", 1, GPT_C, 0}};
    char name[64];
    int i, j;
    gpt_expect_add(e, n, prefix, "transformer.wte.weight", 2, GPT_V, GPT_C, 0, 0);
    gpt_expect_add(e, n, prefix, "transformer.wpe.weight", 2, GPT_CTX, GPT_C, 0, 0);
    for (i = 0; i < GPT_L; i++)
        for (j = 0; j < (int)(sizeof block / sizeof block[0]); j++) {
            snprintf(name, sizeof name, "transformer.h.%d.%s", i, block[j].name);
            gpt_expect_add(e, n, prefix, name, block[j].ndim, block[j].d0, block[j].d1, 0, 0);
        }
    gpt_expect_add(e, n, prefix, "transformer.ln_f.weight", 1, GPT_C, 0, 0, 0);
    gpt_expect_add(e, n, prefix, "transformer.ln_f.bias", 1, GPT_C, 0, 0, 0);
}

/* Every expected tensor present with its shape, and nothing else in the file. */
static enum greatest_test_res gpt_expect_exactly(const fixture *f, const gpt_expect *e, int n)
{
    char msg[768];
    int i, d;
    for (i = 0; i < n; i++) {
        const fixture_tensor *t = fixture_find(f, e[i].name);
        snprintf(msg, sizeof msg, "%s: no tensor \"%s\"", f->path, e[i].name);
        ASSERTm(msg, t != NULL);
        snprintf(msg, sizeof msg, "%s: \"%s\" has %d dimensions, expected %d", f->path, e[i].name,
                 t->ndim, e[i].ndim);
        ASSERTm(msg, t->ndim == e[i].ndim);
        for (d = 0; d < t->ndim; d++) {
            snprintf(msg, sizeof msg, "%s: \"%s\" dimension %d is %lld, expected %lld", f->path,
                     e[i].name, d, (long long)t->shape[d], (long long)e[i].shape[d]);
            ASSERTm(msg, t->shape[d] == e[i].shape[d]);
        }
    }
    snprintf(msg, sizeof msg, "%s: %d tensors, expected %d", f->path, f->count, n);
    ASSERTm(msg, f->count == n);
    PASS();
}

/* Ids in [0, V); targets in [0, V) or -1, with at least one -1. */
static enum greatest_test_res gpt_expect_tokens(const fixture *f, const char *ids,
                                                const char *targets)
{
    const fixture_tensor *x = fixture_find(f, ids), *y = fixture_find(f, targets);
    int64_t i, ignored = 0;
    ASSERT(x != NULL && y != NULL && x->count == y->count);
    for (i = 0; i < x->count; i++) {
        ASSERT(x->data[i] == (float)(int)x->data[i] && x->data[i] >= 0 && x->data[i] < GPT_V);
        ASSERT(y->data[i] == (float)(int)y->data[i] && y->data[i] >= -1 && y->data[i] < GPT_V);
        ignored += y->data[i] == -1;
    }
    ASSERT(ignored > 0);
    PASS();
}

TEST fixtures_gpt_contents(void)
{
    static const char *acts[] = {"ln_1", "qkv", "att", "attn_y", "x_attn", "ln_2", "x_out"};
    gpt_expect e[96];
    fixture f;
    const fixture_tensor *t;
    char name[64];
    int n = 0, i, k;
    int64_t j;

    FIXTURE_LOAD_OR_SKIP(&f, "gpt_forward.bin");
    gpt_expect_add(e, &n, "", "ids", 2, GPT_B, GPT_T, 0, 0);
    gpt_expect_add(e, &n, "", "targets", 2, GPT_B, GPT_T, 0, 0);
    gpt_expect_params(e, &n, "");
    gpt_expect_add(e, &n, "", "act.x0", 3, GPT_B, GPT_T, GPT_C, 0);
    for (i = 0; i < GPT_L; i++)
        for (k = 0; k < (int)(sizeof acts / sizeof acts[0]); k++) {
            int64_t c = k == 1 ? 3 * GPT_C : GPT_C;
            snprintf(name, sizeof name, "act.h.%d.%s", i, acts[k]);
            if (k == 2)
                gpt_expect_add(e, &n, "", name, 4, GPT_B, GPT_H, GPT_T, GPT_T);
            else
                gpt_expect_add(e, &n, "", name, 3, GPT_B, GPT_T, c, 0);
        }
    gpt_expect_add(e, &n, "", "act.ln_f", 3, GPT_B, GPT_T, GPT_C, 0);
    gpt_expect_add(e, &n, "", "logits", 3, GPT_B, GPT_T, GPT_V, 0);
    gpt_expect_add(e, &n, "", "loss", 1, 1, 0, 0, 0);
    gpt_expect_params(e, &n, "grad.");
    gpt_expect_add(e, &n, "", "t11.ids", 2, GPT_B, 11, 0, 0);
    gpt_expect_add(e, &n, "", "t11.targets", 2, GPT_B, 11, 0, 0);
    gpt_expect_add(e, &n, "", "t11.logits", 3, GPT_B, 11, GPT_V, 0);
    gpt_expect_add(e, &n, "", "t11.loss", 1, 1, 0, 0, 0);
    CHECK_CALL(gpt_expect_exactly(&f, e, n));
    CHECK_CALL(gpt_expect_tokens(&f, "ids", "targets"));
    CHECK_CALL(gpt_expect_tokens(&f, "t11.ids", "t11.targets"));
    fixture_free(&f);

    FIXTURE_LOAD_OR_SKIP(&f, "gpt_adamw.bin");
    n = 0;
    for (i = 0; i < 5; i++) {
        char ids[32], targets[32];
        snprintf(ids, sizeof ids, "step%d.ids", i);
        snprintf(targets, sizeof targets, "step%d.targets", i);
        gpt_expect_add(e, &n, "", ids, 2, GPT_B, GPT_T, 0, 0);
        gpt_expect_add(e, &n, "", targets, 2, GPT_B, GPT_T, 0, 0);
    }
    gpt_expect_add(e, &n, "", "losses", 1, 5, 0, 0, 0);
    gpt_expect_add(e, &n, "", "norms", 1, 5, 0, 0, 0);
    gpt_expect_params(e, &n, "final.");
    gpt_expect_add(e, &n, "", "final.logits", 3, GPT_B, GPT_T, GPT_V, 0);
    gpt_expect_add(e, &n, "", "final.loss", 1, 1, 0, 0, 0);
    CHECK_CALL(gpt_expect_exactly(&f, e, n));
    for (i = 0; i < 5; i++) {
        char ids[32], targets[32];
        snprintf(ids, sizeof ids, "step%d.ids", i);
        snprintf(targets, sizeof targets, "step%d.targets", i);
        CHECK_CALL(gpt_expect_tokens(&f, ids, targets));
    }
    t = fixture_find(&f, "norms"); /* above 1 in every step: clip_grad_norm_(1.0) acted */
    for (j = 0; j < t->count; j++)
        ASSERTm("gpt_adamw.bin: a step's norm is not above 1", t->data[j] > 1.0f);
    fixture_free(&f);

    FIXTURE_LOAD_OR_SKIP(&f, "gpt_bf16.bin");
    n = 0;
    gpt_expect_add(e, &n, "", "ids", 2, GPT_B, GPT_T, 0, 0);
    gpt_expect_add(e, &n, "", "targets", 2, GPT_B, GPT_T, 0, 0);
    gpt_expect_add(e, &n, "", "logits", 3, GPT_B, GPT_T, GPT_V, 0);
    gpt_expect_add(e, &n, "", "loss", 1, 1, 0, 0, 0);
    gpt_expect_params(e, &n, "grad.");
    CHECK_CALL(gpt_expect_exactly(&f, e, n));
    t = fixture_find(&f, "logits"); /* bf16 values: the low 16 bits of each float are 0 */
    for (j = 0; j < t->count; j++) {
        uint32_t bits;
        memcpy(&bits, &t->data[j], 4);
        ASSERTm("gpt_bf16.bin: a logit is not a bf16 value", (bits & 0xffffu) == 0);
    }
    fixture_free(&f);
    PASS();
}

/* A stage that acts on every position: the rows of x [rows, in] through a pdp model
   of `kinds` ('L' Linear, 'G' GELU, 'N' LayerNorm) whose parameters are the fixture's
   under `names` (weight, bias per Linear or LayerNorm, in order), into y [rows, out]. */
static enum greatest_test_res gpt_rows(const fixture *f, const char *kinds, const int64_t *outs,
                                       const char *const *names, const float *x, int64_t rows,
                                       int64_t in, float *y)
{
    pdp_model_desc d;
    pdp_model *m = NULL;
    const pdp_tensor *out;
    pdp_tensor xt;
    int64_t shape[2];
    char msg[768];
    int i, p;
    ASSERTm("gpt_rows: the stage's input is missing from the fixture", x != NULL);
    memset(&d, 0, sizeof d);
    d.input_ndim = 1;
    d.input_shape[0] = in;
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_create(&m, &d), pdp_status_name);
    for (i = 0; kinds[i]; i++) {
        pdp_status st = kinds[i] == 'L'   ? pdp_model_add_linear(m, outs[i])
                        : kinds[i] == 'G' ? pdp_model_add_gelu(m)
                                          : pdp_model_add_layernorm(m, 1e-5f);
        ASSERT_ENUM_EQ(PDP_OK, st, pdp_status_name);
    }
    for (p = 0; p < pdp_model_num_params(m); p++) {
        pdp_param prm;
        const fixture_tensor *t = fixture_find(f, names[p]);
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_param(m, p, &prm), pdp_status_name);
        snprintf(msg, sizeof msg, "%s: \"%s\" missing, or not pdp's %s (%lld floats)", f->path,
                 names[p], prm.name, (long long)prm.count);
        ASSERTm(msg, t != NULL && t->count == prm.count &&
                         strcmp(strchr(prm.name, '.'), strrchr(names[p], '.')) == 0);
        memcpy(prm.value.data, t->data, (size_t)t->count * sizeof(float));
    }
    shape[0] = rows;
    shape[1] = in;
    pdp_tensor_wrap((float *)x, pdp_cpu(), 2, shape, &xt);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward(m, &xt, &out), pdp_status_name);
    memcpy(y, out->data, (size_t)out->count * sizeof(float));
    pdp_model_free(m);
    PASS();
}

static const float *gpt_data(const fixture *f, const char *fmt, int layer)
{
    char name[64];
    const fixture_tensor *t;
    snprintf(name, sizeof name, fmt, layer);
    t = fixture_find(f, name);
    return t ? t->data : NULL;
}

/* Causal multi-head attention from qkv [B, T, 3C], in double: the probabilities
   [B, H, T, T] (0 above the diagonal) and y [B, T, C], heads concatenated. */
static void gpt_attention(const float *qkv, int64_t batch, int64_t seq, float *att, float *y)
{
    const int64_t dh = GPT_C / GPT_H;
    int64_t b, h, t, s, i;
    for (b = 0; b < batch; b++)
        for (h = 0; h < GPT_H; h++)
            for (t = 0; t < seq; t++) {
                const float *q = qkv + (b * seq + t) * 3 * GPT_C + h * dh;
                double score[GPT_CTX], top = -1e300, sum = 0.0;
                float *p = att + ((b * GPT_H + h) * seq + t) * seq;
                for (s = 0; s <= t; s++) {
                    const float *k = qkv + (b * seq + s) * 3 * GPT_C + GPT_C + h * dh;
                    double dot = 0.0;
                    for (i = 0; i < dh; i++)
                        dot += (double)q[i] * k[i];
                    score[s] = dot / sqrt((double)dh);
                    if (score[s] > top) top = score[s];
                }
                for (s = 0; s <= t; s++)
                    sum += score[s] = exp(score[s] - top);
                for (s = 0; s < seq; s++)
                    p[s] = s <= t ? (float)(score[s] / sum) : 0.0f;
                for (i = 0; i < dh; i++) {
                    double acc = 0.0;
                    for (s = 0; s <= t; s++)
                        acc += score[s] / sum *
                               qkv[(b * seq + s) * 3 * GPT_C + 2 * GPT_C + h * dh + i];
                    y[(b * seq + t) * GPT_C + h * dh + i] = (float)acc;
                }
            }
}

/* Mean cross entropy of logits [n, V] over the targets that are not -1, in double. */
static float gpt_cross_entropy(const float *logits, const float *targets, int64_t n)
{
    double total = 0.0;
    int64_t i, j, counted = 0;
    for (i = 0; i < n; i++) {
        const float *z = logits + i * GPT_V;
        double top = z[0], sum = 0.0;
        if (targets[i] == -1) continue;
        for (j = 1; j < GPT_V; j++)
            if (z[j] > top) top = z[j];
        for (j = 0; j < GPT_V; j++)
            sum += exp(z[j] - top);
        total += top + log(sum) - z[(int)targets[i]];
        counted++;
    }
    return (float)(total / (double)counted);
}

TEST fixtures_gpt_by_pieces(void)
{
    enum { N = GPT_B * GPT_T };
    static float x0[N * GPT_C], u[N * 4 * GPT_C], att[GPT_B * GPT_H * GPT_T * GPT_T];
    fixture f;
    const float *ids, *wte, *wpe, *x, *t11;
    float loss;
    int64_t r, c, i;
    int l;

    FIXTURE_LOAD_OR_SKIP(&f, "gpt_forward.bin");
    ids = gpt_data(&f, "ids", 0);
    wte = gpt_data(&f, "transformer.wte.weight", 0);
    wpe = gpt_data(&f, "transformer.wpe.weight", 0);
    ASSERT(ids && wte && wpe);
    for (r = 0; r < N; r++) /* x0 = wte[id] + wpe[t], t = r mod T */
        for (c = 0; c < GPT_C; c++)
            x0[r * GPT_C + c] = wte[(int64_t)ids[r] * GPT_C + c] + wpe[(r % GPT_T) * GPT_C + c];
    CHECK_CALL(expect_close(&f, "act.x0", x0, N * GPT_C));

    for (l = 0; l < GPT_L; l++) {
        /* Each stage from the fixture's own input, so that a failure names its stage. */
        char n[8][64];
        const char *names[8];
        int64_t outs[3] = {0, 0, 0}; /* out_features of each 'L' */
        char act[64];
        const float *xin =
            l == 0 ? gpt_data(&f, "act.x0", 0) : gpt_data(&f, "act.h.%d.x_out", l - 1);
        const float *x_attn = gpt_data(&f, "act.h.%d.x_attn", l);
        ASSERT(xin && x_attn);
        for (i = 0; i < 8; i++)
            names[i] = n[i];

        snprintf(n[0], 64, "transformer.h.%d.ln_1.weight", l);
        snprintf(n[1], 64, "transformer.h.%d.ln_1.bias", l);
        CHECK_CALL(gpt_rows(&f, "N", outs, names, xin, N, GPT_C, u));
        snprintf(act, sizeof act, "act.h.%d.ln_1", l);
        CHECK_CALL(expect_close(&f, act, u, N * GPT_C));

        snprintf(n[0], 64, "transformer.h.%d.attn.c_attn.weight", l);
        snprintf(n[1], 64, "transformer.h.%d.attn.c_attn.bias", l);
        outs[0] = 3 * GPT_C;
        CHECK_CALL(gpt_rows(&f, "L", outs, names, gpt_data(&f, "act.h.%d.ln_1", l), N, GPT_C, u));
        snprintf(act, sizeof act, "act.h.%d.qkv", l);
        CHECK_CALL(expect_close(&f, act, u, N * 3 * GPT_C));

        ASSERT(gpt_data(&f, "act.h.%d.qkv", l) != NULL);
        gpt_attention(gpt_data(&f, "act.h.%d.qkv", l), GPT_B, GPT_T, att, u);
        snprintf(act, sizeof act, "act.h.%d.att", l);
        CHECK_CALL(expect_close(&f, act, att, GPT_B * GPT_H * GPT_T * GPT_T));
        snprintf(act, sizeof act, "act.h.%d.attn_y", l);
        CHECK_CALL(expect_close(&f, act, u, N * GPT_C));

        snprintf(n[0], 64, "transformer.h.%d.attn.c_proj.weight", l);
        snprintf(n[1], 64, "transformer.h.%d.attn.c_proj.bias", l);
        outs[0] = GPT_C;
        CHECK_CALL(gpt_rows(&f, "L", outs, names, gpt_data(&f, "act.h.%d.attn_y", l), N, GPT_C, u));
        for (i = 0; i < N * GPT_C; i++)
            u[i] += xin[i]; /* the residual add */
        snprintf(act, sizeof act, "act.h.%d.x_attn", l);
        CHECK_CALL(expect_close(&f, act, u, N * GPT_C));

        snprintf(n[0], 64, "transformer.h.%d.ln_2.weight", l);
        snprintf(n[1], 64, "transformer.h.%d.ln_2.bias", l);
        CHECK_CALL(gpt_rows(&f, "N", outs, names, x_attn, N, GPT_C, u));
        snprintf(act, sizeof act, "act.h.%d.ln_2", l);
        CHECK_CALL(expect_close(&f, act, u, N * GPT_C));

        snprintf(n[0], 64, "transformer.h.%d.mlp.c_fc.weight", l);
        snprintf(n[1], 64, "transformer.h.%d.mlp.c_fc.bias", l);
        snprintf(n[2], 64, "transformer.h.%d.mlp.c_proj.weight", l);
        snprintf(n[3], 64, "transformer.h.%d.mlp.c_proj.bias", l);
        outs[0] = 4 * GPT_C;
        outs[1] = 0;
        outs[2] = GPT_C;
        CHECK_CALL(gpt_rows(&f, "LGL", outs, names, gpt_data(&f, "act.h.%d.ln_2", l), N, GPT_C, u));
        for (i = 0; i < N * GPT_C; i++)
            u[i] += x_attn[i]; /* the residual add */
        snprintf(act, sizeof act, "act.h.%d.x_out", l);
        CHECK_CALL(expect_close(&f, act, u, N * GPT_C));
    }

    {
        const char *names[2] = {"transformer.ln_f.weight", "transformer.ln_f.bias"};
        int64_t outs[1] = {0};
        x = gpt_data(&f, "act.h.%d.x_out", GPT_L - 1);
        ASSERT(x != NULL);
        CHECK_CALL(gpt_rows(&f, "N", outs, names, x, N, GPT_C, u));
        CHECK_CALL(expect_close(&f, "act.ln_f", u, N * GPT_C));
    }
    /* The tied head: logits = ln_f(x) wte^T, wte [V, C] read as Linear's [out, in]. */
    pdp_sgemm(PDP_NO_TRANS, PDP_TRANS, N, GPT_V, GPT_C, 1.0f, gpt_data(&f, "act.ln_f", 0), GPT_C,
              wte, GPT_C, 0.0f, u, GPT_V);
    CHECK_CALL(expect_close(&f, "logits", u, N * GPT_V));
    ASSERT(gpt_data(&f, "targets", 0) && gpt_data(&f, "t11.targets", 0));
    loss = gpt_cross_entropy(u, gpt_data(&f, "targets", 0), N);
    CHECK_CALL(expect_close(&f, "loss", &loss, 1));
    t11 = gpt_data(&f, "t11.logits", 0);
    ASSERT(t11 != NULL);
    loss = gpt_cross_entropy(t11, gpt_data(&f, "t11.targets", 0), GPT_B * 11);
    CHECK_CALL(expect_close(&f, "t11.loss", &loss, 1));
    fixture_free(&f);
    PASS();
}

SUITE(fixtures)
{
    RUN_TEST(fixtures_linear);
    RUN_TEST(fixtures_activations);
    RUN_TEST(fixtures_layernorm);
    RUN_TEST(fixtures_conv2d);
    RUN_TEST(fixtures_maxpool2d);
    RUN_TEST(fixtures_cross_entropy);
    RUN_TEST(fixtures_mse);
    RUN_TEST(fixtures_mlp);
    RUN_TEST(fixtures_cnn);
    RUN_TEST(fixtures_gpt_contents);
    RUN_TEST(fixtures_gpt_by_pieces);
}

GREATEST_MAIN_DEFS();

int main(int argc, char **argv)
{
    GREATEST_MAIN_BEGIN();
    RUN_SUITE(fixtures);
    GREATEST_MAIN_END();
}
