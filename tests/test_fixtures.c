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
   dy. A missing fixture skips its test with the command that writes it. */
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
    static const char *files[5] = {"relu.bin", "gelu.bin", "tanh.bin", "sigmoid.bin",
                                   "silu.bin"};
    pdp_status (*add[5])(pdp_model *) = {pdp_model_add_relu, pdp_model_add_gelu,
                                         pdp_model_add_tanh, pdp_model_add_sigmoid,
                                         pdp_model_add_silu};
    int k;
    for (k = 0; k < 5; k++) {
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
}

GREATEST_MAIN_DEFS();

int main(int argc, char **argv)
{
    GREATEST_MAIN_BEGIN();
    RUN_SUITE(fixtures);
    GREATEST_MAIN_END();
}
