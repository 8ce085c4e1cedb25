/* Tests of the layers (src/layers.c) through small models built with the public API:
   gradients against central finite differences for every layer kind on odd shapes,
   forward against naive loops, PyTorch's initialisation, dropout masks (eval
   identity, determinism, the same mask when a batch is split with sample_base), the
   grad hook order, error messages, no allocation after the first step, the
   table of kinds (an entry per kind; pdp_model_layer_name, pdp_model_device), and a
   LayerNorm on a slice of the sequence (TP + SP) summing by chunks as one device does.

   Finite differences: f(x) = sum(y * r) for a fixed random r, summed in double;
   df/dv ~ (f(v + eps) - f(v - eps)) / (2 eps) with eps = 1e-3, compared with the
   analytic gradient within 3e-3 + 3e-3 |g|. Outputs a perturbation does not touch
   round identically in both evaluations, so the float noise stays near 1e-4. */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
/* The test knobs (base.c's PDP__TEST_KNOB; main sets them) exist under the tests'
   linkage: compiled alone, this test asks for it too. */
#ifndef PDP__TEST_LINKAGE
#  define PDP__TEST_LINKAGE
#endif
#define PDP_IMPLEMENTATION
#define PDP_MALLOC(bytes) test_malloc(bytes)
#define PDP_FREE(ptr) test_free(ptr)
static long test_allocs; /* allocations through PDP_MALLOC, counted with atomics */
static size_t test_alloc_bytes; /* and their bytes */
static void *test_malloc(size_t bytes)
{
    __atomic_fetch_add(&test_allocs, 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&test_alloc_bytes, bytes, __ATOMIC_RELAXED);
    return malloc(bytes);
}
static void test_free(void *p) { free(p); }
#include "pdp.h"
#include "pdp_test.h"
#include "fixture.h"
#include "test_platform.h"

#define FD_EPS 1e-3
#define FD_ABS 3e-3
#define FD_REL 3e-3

/* ---- helpers ---- */

static pdp_model *new_model(int ndim, int64_t a, int64_t b, int64_t c, uint64_t seed)
{
    pdp_model_desc d;
    pdp_model *m = NULL;
    memset(&d, 0, sizeof d);
    d.input_ndim = ndim;
    d.input_shape[0] = a;
    d.input_shape[1] = b;
    d.input_shape[2] = c;
    d.seed = seed;
    if (pdp_model_create(&m, &d) != PDP_OK) return NULL;
    return m;
}

static int64_t out_count(const pdp_model *m)
{
    int64_t s[3];
    int nd = pdp_model_output_shape(m, s), i;
    int64_t n = 1;
    for (i = 0; i < nd; i++) n *= s[i];
    return n;
}

/* x [batch, input...] as a tensor over caller memory. */
static void wrap_input(const pdp_model *m, float *data, int64_t batch, pdp_tensor *t)
{
    int64_t shape[4];
    shape[0] = batch;
    memcpy(shape + 1, m->in_shape, 3 * sizeof *shape);
    pdp_tensor_wrap(data, pdp_cpu(), m->in_ndim + 1, shape, t);
}

static void fill_uniform(float *x, int64_t n, pdp_rng *r, float lo, float hi)
{
    int64_t i;
    for (i = 0; i < n; i++) x[i] = lo + (hi - lo) * pdp_rng_uniform(r);
}

/* Fixed dropout masks across repeated forwards: every forward sees step 42. */
static void pin_step(pdp_model *m) { m->step = 41; }

/* f = sum(model(x) * r) in double. */
static double objective(pdp_model *m, const pdp_tensor *x, const float *r)
{
    const pdp_tensor *y;
    double f = 0.0;
    int64_t i;
    pin_step(m);
    if (pdp_model_forward(m, x, &y) != PDP_OK) return NAN;
    for (i = 0; i < y->count; i++) f += (double)y->data[i] * r[i];
    return f;
}

/* Central difference of f with respect to v[i], step eps. */
static double fd_at(pdp_model *m, const pdp_tensor *x, const float *r, float *v, int64_t i,
                    double eps)
{
    float keep = v[i], up = (float)(keep + eps), down = (float)(keep - eps);
    double fp, fm;
    v[i] = up;
    fp = objective(m, x, r);
    v[i] = down;
    fm = objective(m, x, r);
    v[i] = keep;
    return (fp - fm) / ((double)up - (double)down);
}

/* Compares analytic and central-difference derivatives of f with respect to the
   n values at v; returns how many differ, printing the first few. A mismatch is
   checked again with eps / 4 before it counts: a ReLU or max-pool kink within eps
   of the point spoils one difference, rarely both. */
static int fd_compare(pdp_model *m, const pdp_tensor *x, const float *r, float *v,
                      const float *grad, int64_t n, const char *what)
{
    int64_t i;
    int bad = 0;
    for (i = 0; i < n; i++) {
        double tol = FD_ABS + FD_REL * fabs(grad[i]), fd = fd_at(m, x, r, v, i, FD_EPS);
        if (fabs(fd - grad[i]) <= tol) continue;
        fd = fd_at(m, x, r, v, i, FD_EPS / 4);
        if (fabs(fd - grad[i]) <= tol) continue;
        if (bad < 5)
            fprintf(stderr, "  %s[%lld]: analytic %.6g, finite difference %.6g\n", what,
                    (long long)i, (double)grad[i], fd);
        bad++;
    }
    return bad;
}

/* Every parameter and every input element of m, at a random x (|x| >= away, for
   layers with a kink at 0) and a random upstream gradient. Parameters are moved by
   U(-0.2, 0.2) first, so that LayerNorm's 1 and 0 become generic values. */
static enum greatest_test_res check_grads(pdp_model *m, int64_t batch, float away, uint64_t seed)
{
    pdp_rng r;
    pdp_tensor x, flat, grads;
    const pdp_tensor *y;
    int64_t nin = batch * m->in_count, nout, i;
    float *xd, *rd, *dx, *gcopy;
    int bad = 0, p;
    ASSERT(m != NULL);
    pdp_rng_seed(&r, seed, 7);
    nout = batch * out_count(m);
    xd = (float *)malloc((size_t)nin * sizeof *xd);
    dx = (float *)malloc((size_t)nin * sizeof *dx);
    rd = (float *)malloc((size_t)nout * sizeof *rd);
    ASSERT(xd && dx && rd);
    for (i = 0; i < nin; i++) {
        float v = (1.0f - away) * (2.0f * pdp_rng_uniform(&r) - 1.0f);
        xd[i] = v + (v < 0 ? -away : away);
    }
    fill_uniform(rd, nout, &r, -1.0f, 1.0f);
    wrap_input(m, xd, batch, &x);
    if (pdp_model_param_count(m) > 0) {
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_flat(m, &flat, &grads), pdp_status_name);
        for (i = 0; i < flat.count; i++) flat.data[i] += 0.4f * pdp_rng_uniform(&r) - 0.2f;
    }

    /* Analytic parameter gradients through the public backward. */
    pdp_model_zero_grad(m);
    pin_step(m);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward(m, &x, &y), pdp_status_name);
    ASSERT_EQ(nout, y->count);
    {
        pdp_tensor dy;
        pdp_tensor_wrap(rd, pdp_cpu(), y->ndim, y->shape, &dy);
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_backward(m, &dy), pdp_status_name);
    }
    gcopy = NULL;
    if (pdp_model_param_count(m) > 0) {
        gcopy = (float *)malloc((size_t)grads.count * sizeof *gcopy);
        ASSERT(gcopy);
        memcpy(gcopy, grads.data, (size_t)grads.count * sizeof *gcopy);
    }
    /* Analytic input gradient. */
    pin_step(m);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward(m, &x, &y), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, fixture_backward_with_dx(m, rd, dx), pdp_status_name);

    bad += fd_compare(m, &x, rd, xd, dx, nin, "dx");
    for (p = 0; p < pdp_model_num_params(m); p++) {
        pdp_param prm;
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_param(m, p, &prm), pdp_status_name);
        bad += fd_compare(m, &x, rd, prm.value.data, gcopy + prm.offset, prm.value.count,
                          prm.name);
    }
    free(xd);
    free(dx);
    free(rd);
    free(gcopy);
    ASSERT_EQm("analytic and finite-difference gradients differ", 0, bad);
    PASS();
}

/* ---- gradients against finite differences ---- */

/* pdp_gpt_create knows its model's size: it allocates the parameter and gradient blocks
   once, where adding the layers one by one copies the blocks so far at each (GPT-2 124M: a
   minute). The layers' parameters lie where they would have (the registry's offsets). */
TEST layers_gpt_create_allocates_the_blocks_once(void)
{
    pdp_model *m = NULL;
    pdp_gpt_desc g = {.context = 32, .layers = 8, .heads = 4, .dim = 128};
    pdp_param p;
    size_t before = test_alloc_bytes, bytes;
    int64_t n;
    ASSERT_ENUM_EQ(PDP_OK, pdp_gpt_create(&m, &g), pdp_status_name);
    bytes = test_alloc_bytes - before;
    n = pdp_model_param_count(m);
    ASSERT_EQ(pdp_gpt_param_count(&g), n);
    ASSERT_GT(2 * (size_t)n * sizeof(float) + (1 << 20), bytes);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_find_param(m, "transformer.ln_f.bias", &p),
                   pdp_status_name); /* the last parameter: the block's last floats */
    ASSERT(p.value.data + p.value.count == m->param_block + n);
    ASSERT(p.grad.data + p.grad.count == m->grad_block + n);
    pdp_model_free(m);
    PASS();
}

TEST layers_linear_grads_match_finite_differences(void)
{
    pdp_model *m = new_model(1, 7, 0, 0, 1);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_linear(m, 5), pdp_status_name);
    CHECK_CALL(check_grads(m, 3, 0.0f, 1));
    pdp_model_free(m);
    PASS();
}

TEST layers_activation_grads_match_finite_differences(void)
{
    pdp_status (*add[6])(pdp_model *) = {pdp_model_add_relu,    pdp_model_add_gelu,
                                         pdp_model_add_tanh,    pdp_model_add_sigmoid,
                                         pdp_model_add_silu,    pdp_model_add_gelu_erf};
    int k;
    for (k = 0; k < 6; k++) {
        pdp_model *m = new_model(1, 7, 0, 0, 2);
        ASSERT_ENUM_EQ(PDP_OK, add[k](m), pdp_status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_linear(m, 4), pdp_status_name);
        CHECK_CALL(check_grads(m, 3, 0.05f, 10 + (uint64_t)k));
        pdp_model_free(m);
    }
    PASS();
}

TEST layers_dropout_train_grads_match_finite_differences(void)
{
    pdp_model *m = new_model(1, 9, 0, 0, 3);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_linear(m, 8), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_dropout(m, 0.4f), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_linear(m, 3), pdp_status_name);
    CHECK_CALL(check_grads(m, 3, 0.0f, 3));
    pdp_model_free(m);
    PASS();
}

TEST layers_layernorm_grads_match_finite_differences(void)
{
    pdp_model *m = new_model(1, 7, 0, 0, 4);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_layernorm(m, 0.0f), pdp_status_name);
    CHECK_CALL(check_grads(m, 3, 0.0f, 4));
    pdp_model_free(m);
    m = new_model(3, 2, 3, 3, 5); /* per-sample (2, 3, 3): weight and bias of that shape */
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_layernorm(m, 1e-3f), pdp_status_name);
    CHECK_CALL(check_grads(m, 3, 0.0f, 5));
    pdp_model_free(m);
    PASS();
}

/* Stride-1 convolutions (the implicit-GEMM path, samples side by side) against
   naive loops on 5 samples (chunks of 3 and 2), 1 and 2 threads. */
TEST layers_conv2d_stride1_matches_naive(void)
{
    /* the last is deep enough (C k k >= PDP__CONV_RUNS_MIN_K) for the band-skipping GEMM */
    static const int64_t cfg[5][6] = {/* C, H, W, O, k, pad */
                                      {2, 7, 6, 3, 5, 2}, {3, 5, 5, 4, 3, 0},
                                      {1, 6, 4, 2, 2, 1}, {2, 4, 5, 3, 3, 2},
                                      {6, 7, 6, 3, 5, 2}};
    float xd[5 * 6 * 7 * 6];
    int t, threads;
    for (t = 0; t < 5; t++)
        for (threads = 1; threads <= 2; threads++) {
            int64_t C = cfg[t][0], H = cfg[t][1], W = cfg[t][2], O = cfg[t][3], K = cfg[t][4];
            int64_t P = cfg[t][5], Ho = H + 2 * P - K + 1, Wo = W + 2 * P - K + 1, B = 5;
            int64_t s, o, c, oh, ow, ki, kj;
            pdp_model *m = new_model(3, C, H, W, 40 + (uint64_t)t);
            pdp_param w, b;
            pdp_tensor x;
            const pdp_tensor *y;
            pdp_rng r;
            ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_conv2d(m, O, K, 1, P), pdp_status_name);
            ASSERT_ENUM_EQ(PDP_OK, pdp_model_find_param(m, "0.weight", &w), pdp_status_name);
            ASSERT_ENUM_EQ(PDP_OK, pdp_model_find_param(m, "0.bias", &b), pdp_status_name);
            pdp_rng_seed(&r, 40 + (uint64_t)t, 0);
            fill_uniform(xd, B * C * H * W, &r, -1.0f, 1.0f);
            wrap_input(m, xd, B, &x);
            pdp_set_num_threads(threads);
            ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward(m, &x, &y), pdp_status_name);
            pdp_set_num_threads(1);
            ASSERT_EQ(B * O * Ho * Wo, y->count);
            for (s = 0; s < B; s++)
                for (o = 0; o < O; o++)
                    for (oh = 0; oh < Ho; oh++)
                        for (ow = 0; ow < Wo; ow++) {
                            double z = b.value.data[o];
                            for (c = 0; c < C; c++)
                                for (ki = 0; ki < K; ki++)
                                    for (kj = 0; kj < K; kj++) {
                                        int64_t ih = oh - P + ki, iw = ow - P + kj;
                                        if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                                        z += (double)xd[((s * C + c) * H + ih) * W + iw] *
                                             w.value.data[((o * C + c) * K + ki) * K + kj];
                                    }
                            ASSERT_IN_RANGE(z, y->data[((s * O + o) * Ho + oh) * Wo + ow], 1e-5);
                        }
            pdp_model_free(m);
        }
    PASS();
}

TEST layers_conv2d_grads_match_finite_differences(void)
{
    pdp_model *m = new_model(3, 2, 5, 5, 6);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_conv2d(m, 3, 3, 2, 1), pdp_status_name);
    CHECK_CALL(check_grads(m, 3, 0.0f, 6));
    pdp_model_free(m);
    m = new_model(3, 3, 4, 7, 7); /* stride 1, no padding, rectangular */
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_conv2d(m, 2, 2, 1, 0), pdp_status_name);
    CHECK_CALL(check_grads(m, 2, 0.0f, 7));
    pdp_model_free(m);
    m = new_model(3, 3, 4, 5, 13); /* 1 x 1: the wide grid has no extra columns */
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_conv2d(m, 2, 1, 1, 0), pdp_status_name);
    CHECK_CALL(check_grads(m, 3, 0.0f, 13));
    pdp_model_free(m);
    m = new_model(3, 2, 5, 6, 9); /* stride 1, "same" padding, 5 samples: 2 chunks */
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_conv2d(m, 3, 3, 1, 1), pdp_status_name);
    CHECK_CALL(check_grads(m, 5, 0.0f, 9));
    pdp_model_free(m);
    m = new_model(3, 2, 4, 5, 10); /* stride 1, padding k - 1 (dx needs no extra padding) */
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_conv2d(m, 2, 3, 1, 2), pdp_status_name);
    CHECK_CALL(check_grads(m, 4, 0.0f, 10));
    pdp_model_free(m);
    m = new_model(3, 1, 4, 4, 11); /* stride 1, padding > k - 1: the im2col path */
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_conv2d(m, 2, 2, 1, 2), pdp_status_name);
    CHECK_CALL(check_grads(m, 2, 0.0f, 11));
    pdp_model_free(m);
    m = new_model(3, 1, 6, 5, 8); /* padding larger than half the kernel, stride 3 */
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_conv2d(m, 2, 3, 3, 2), pdp_status_name);
    CHECK_CALL(check_grads(m, 2, 0.0f, 8));
    pdp_model_free(m);
    PASS();
}

TEST layers_maxpool2d_grads_match_finite_differences(void)
{
    /* Distinct, well-spaced inputs would be ideal; random ones with eps 1e-3 rarely
       come within 2 eps of each other, and the seeds below do not. */
    pdp_model *m = new_model(3, 2, 5, 5, 9); /* floor: 5 -> 2 */
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_maxpool2d(m, 2, 0), pdp_status_name);
    CHECK_CALL(check_grads(m, 3, 0.0f, 9));
    pdp_model_free(m);
    m = new_model(3, 3, 7, 6, 10); /* overlapping windows: gradients add up */
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_maxpool2d(m, 3, 2), pdp_status_name);
    CHECK_CALL(check_grads(m, 2, 0.0f, 10));
    pdp_model_free(m);
    PASS();
}

TEST layers_mlp_grads_match_finite_differences(void)
{
    pdp_model *m = new_model(1, 11, 0, 0, 11);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_linear(m, 9), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_gelu(m), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_layernorm(m, 0.0f), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_linear(m, 6), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_tanh(m), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_linear(m, 4), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_sigmoid(m), pdp_status_name);
    CHECK_CALL(check_grads(m, 3, 0.0f, 11));
    pdp_model_free(m);
    PASS();
}

TEST layers_cnn_grads_match_finite_differences(void)
{
    pdp_model *m = new_model(3, 2, 7, 7, 12);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_conv2d(m, 3, 3, 1, 1), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_relu(m), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_maxpool2d(m, 2, 2), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_flatten(m), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_linear(m, 5), pdp_status_name);
    CHECK_CALL(check_grads(m, 3, 0.0f, 12));
    pdp_model_free(m);
    PASS();
}

/* ---- forward against naive loops ---- */

TEST layers_linear_and_activations_match_naive(void)
{
    pdp_model *m;
    pdp_param w, b;
    pdp_tensor x;
    const pdp_tensor *y;
    pdp_rng r;
    float xd[5 * 13];
    int64_t i, j, k, B = 5;
    int kind;
    pdp_status (*add[6])(pdp_model *) = {pdp_model_add_relu,    pdp_model_add_gelu,
                                         pdp_model_add_tanh,    pdp_model_add_sigmoid,
                                         pdp_model_add_silu,    pdp_model_add_gelu_erf};
    pdp_rng_seed(&r, 13, 0);
    fill_uniform(xd, B * 13, &r, -3.0f, 3.0f);
    for (kind = 0; kind < 6; kind++) {
        m = new_model(1, 13, 0, 0, 13);
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_linear(m, 6), pdp_status_name);
        ASSERT_ENUM_EQ(PDP_OK, add[kind](m), pdp_status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_find_param(m, "0.weight", &w), pdp_status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_find_param(m, "0.bias", &b), pdp_status_name);
        wrap_input(m, xd, B, &x);
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward(m, &x, &y), pdp_status_name);
        for (i = 0; i < B; i++)
            for (j = 0; j < 6; j++) {
                double z = b.value.data[j], want;
                for (k = 0; k < 13; k++) z += (double)xd[i * 13 + k] * w.value.data[j * 13 + k];
                switch (kind) {
                case 0: want = z > 0 ? z : 0; break;
                case 1:
                    want = 0.5 * z * (1 + tanh(sqrt(2 / 3.14159265358979323846) *
                                               (z + 0.044715 * z * z * z)));
                    break;
                case 2: want = tanh(z); break;
                case 3: want = 1 / (1 + exp(-z)); break;
                case 4: want = z / (1 + exp(-z)); break;
                default: want = 0.5 * z * (1 + erf(z / sqrt(2.0))); break;
                }
                ASSERT_IN_RANGE(want, y->data[i * 6 + j], 1e-5 * (1 + fabs(want)));
            }
        pdp_model_free(m);
    }
    PASS();
}

TEST layers_conv2d_and_maxpool_match_naive(void)
{
    /* (3, 6, 7) -> Conv2d(4, k3, s2, p1) -> (4, 3, 4) -> MaxPool2d(2, 1) -> (4, 2, 3) */
    int64_t C = 3, H = 6, W = 7, O = 4, K = 3, S = 2, P = 1, Ho = 3, Wo = 4, B = 2;
    pdp_model *m = new_model(3, C, H, W, 14);
    pdp_param w, b;
    pdp_tensor x;
    const pdp_tensor *y;
    pdp_rng r;
    float xd[2 * 3 * 6 * 7], conv[2 * 4 * 3 * 4];
    int64_t s, o, c, oh, ow, ki, kj, shape[3];
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_conv2d(m, O, K, S, P), pdp_status_name);
    ASSERT_EQ(3, pdp_model_output_shape(m, shape));
    ASSERT_EQ(Ho, shape[1]);
    ASSERT_EQ(Wo, shape[2]);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_find_param(m, "0.weight", &w), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_find_param(m, "0.bias", &b), pdp_status_name);
    ASSERT_EQ(4, w.value.ndim);
    ASSERT_EQ(O, w.value.shape[0]);
    ASSERT_EQ(C, w.value.shape[1]);
    ASSERT_EQ(K, w.value.shape[3]);
    pdp_rng_seed(&r, 14, 0);
    fill_uniform(xd, B * C * H * W, &r, -1.0f, 1.0f);
    wrap_input(m, xd, B, &x);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward(m, &x, &y), pdp_status_name);
    for (s = 0; s < B; s++)
        for (o = 0; o < O; o++)
            for (oh = 0; oh < Ho; oh++)
                for (ow = 0; ow < Wo; ow++) {
                    double z = b.value.data[o];
                    for (c = 0; c < C; c++)
                        for (ki = 0; ki < K; ki++)
                            for (kj = 0; kj < K; kj++) {
                                int64_t ih = oh * S - P + ki, iw = ow * S - P + kj;
                                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                                z += (double)xd[((s * C + c) * H + ih) * W + iw] *
                                     w.value.data[((o * C + c) * K + ki) * K + kj];
                            }
                    conv[((s * O + o) * Ho + oh) * Wo + ow] = (float)z;
                    ASSERT_IN_RANGE(z, y->data[((s * O + o) * Ho + oh) * Wo + ow], 1e-5);
                }
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_maxpool2d(m, 2, 1), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward(m, &x, &y), pdp_status_name);
    ASSERT_EQ(B * O * 2 * 3, y->count);
    for (s = 0; s < B * O; s++)
        for (oh = 0; oh < 2; oh++)
            for (ow = 0; ow < 3; ow++) {
                float best = -INFINITY;
                for (ki = 0; ki < 2; ki++)
                    for (kj = 0; kj < 2; kj++) {
                        float v = conv[(s * Ho + oh + ki) * Wo + ow + kj];
                        best = v > best ? v : best;
                    }
                ASSERT_IN_RANGE(best, y->data[(s * 2 + oh) * 3 + ow], 1e-5);
            }
    pdp_model_free(m);
    PASS();
}

/* Conv2d -> ReLU -> MaxPool2d(2) on the CPU: the Conv2d applies the pool too
   (model.c's pdp__model_pool_fused) and never writes its own output. Against the
   same layers with a Dropout(0) (an exact copy) between the ReLU and the pool,
   which stops the fusion: output, input gradient and parameter gradients bit for
   bit, on each Conv2d path (implicit "same" with the band-skipping GEMM, implicit
   with another padding, im2col with stride 2, the dot-product dW of a single input
   channel), in fp32 and bf16, 1
   and 2 threads, with inputs mostly negative so that ReLU zeros tie in the windows,
   and a NaN. A second conv after the pool takes the pool's input gradient. */
TEST layers_conv_relu_pool_fused_matches_unfused(void)
{
    static const int64_t cfg[4][6] = {/* C, H, W, O, k, stride, (pad = k / 2 or 0) */
                                      {6, 12, 10, 8, 5, 1}, {2, 10, 12, 4, 3, 1},
                                      {2, 12, 12, 4, 3, 2}, {1, 16, 12, 16, 5, 1}};
    static float xd[7 * 6 * 16 * 12], dx[2][7 * 6 * 16 * 12], dyd[7 * 10];
    int t, threads, prec;
    for (t = 0; t < 4; t++)
        for (prec = 0; prec < 2; prec++)
            for (threads = 1; threads <= 2; threads++) {
                int64_t C = cfg[t][0], H = cfg[t][1], W = cfg[t][2], B = 7, n = B * C * H * W, i;
                int64_t pad = t == 1 ? 0 : cfg[t][4] / 2;
                pdp_model *m[2];
                const pdp_tensor *y[2];
                pdp_tensor x, g[2];
                pdp_rng r;
                int k;
                pdp_rng_seed(&r, 90 + (uint64_t)t, 0);
                fill_uniform(xd, n, &r, -1.5f, 0.5f);
                xd[n / 3] = NAN;
                for (i = 0; i < B * 10; i++) dyd[i] = (float)(i % 7) - 3.0f;
                for (k = 0; k < 2; k++) {
                    m[k] = new_model(3, C, H, W, 90);
                    ASSERT(m[k] != NULL);
                    if (prec) pdp_model_set_precision(m[k], PDP_PRECISION_BF16);
                    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_conv2d(m[k], cfg[t][3], cfg[t][4],
                                                                cfg[t][5], pad), pdp_status_name);
                    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_relu(m[k]), pdp_status_name);
                    if (k == 1) ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_dropout(m[k], 0.0f), pdp_status_name);
                    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_maxpool2d(m[k], 2, 0), pdp_status_name);
                    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_conv2d(m[k], 3, 3, 1, 1), pdp_status_name);
                    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_flatten(m[k]), pdp_status_name);
                    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_linear(m[k], 10), pdp_status_name);
                    ASSERT(pdp__model_pool_fused(m[k], 2) == (k == 0));
                    pdp_model_flat(m[0], &g[0], NULL);
                    pdp_model_flat(m[k], &g[k], NULL);
                    ASSERT_EQ(g[0].count, g[k].count);
                    memcpy(g[k].data, g[0].data, (size_t)g[0].count * sizeof(float));
                    wrap_input(m[k], xd, B, &x);
                    pdp_set_num_threads(threads);
                    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward(m[k], &x, &y[k]), pdp_status_name);
                    ASSERT_ENUM_EQ(PDP_OK, fixture_backward_with_dx(m[k], dyd, dx[k]),
                                   pdp_status_name);
                    pdp_set_num_threads(1);
                }
                ASSERT(m[0]->act[0] == NULL); /* the fused Conv2d's output never exists */
                ASSERT(m[0]->act_stride < m[1]->act_stride);
                ASSERT_EQ(y[1]->count, y[0]->count);
                ASSERT_MEM_EQ(y[1]->data, y[0]->data, (size_t)y[0]->count * sizeof(float));
                ASSERT_MEM_EQ(dx[1], dx[0], (size_t)n * sizeof(float));
                pdp_model_flat(m[0], NULL, &g[0]);
                pdp_model_flat(m[1], NULL, &g[1]);
                ASSERT_MEM_EQ(g[1].data, g[0].data, (size_t)g[0].count * sizeof(float));
                pdp_model_free(m[0]);
                pdp_model_free(m[1]);
            }
    PASS();
}

/* A Linear followed by an activation (ReLU or GELU) on the CPU, which the Linear applies
   itself (model.c: pdp__model_relu_fused, pdp__model_gelu_fused), against the same layers
   with a Dropout(0) (an exact copy) between each Linear and its activation, which stops
   the fusion: output, input gradient and parameter gradients bit for bit, after two
   forward-backward passes (the gradients accumulate), in fp32 and bf16, 1 and 2 threads,
   once with a NaN input. The model is Linear widths[0..2] from 37 inputs, the first
   `acts` Linears each followed by the activation; inputs uniform in [lo, hi). */
static enum greatest_test_res fused_matches_apart(bool gelu, int64_t B, const int64_t *widths,
                                                  int acts, float lo, float hi, uint64_t seed)
{
    enum { IN = 37, OUT = 10, BMAX = 130 };
    static float xd[BMAX * IN], dx[2][BMAX * IN], dyd[BMAX * OUT];
    int t, threads, prec, j;
    ASSERT(B <= BMAX && widths[2] == OUT);
    for (t = 0; t < 2; t++)
        for (prec = 0; prec < 2; prec++)
            for (threads = 1; threads <= 2; threads++) {
                int64_t n = B * IN, i;
                pdp_model *m[2];
                const pdp_tensor *y[2];
                pdp_tensor x, g[2];
                pdp_rng r;
                int k, pass;
                pdp_rng_seed(&r, seed + (uint64_t)t, 0);
                fill_uniform(xd, n, &r, lo, hi);
                if (t == 1) xd[n / 3] = NAN;
                for (i = 0; i < B * OUT; i++) dyd[i] = (float)(i % 7) - 3.0f;
                for (k = 0; k < 2; k++) {
                    m[k] = new_model(1, IN, 1, 1, seed);
                    ASSERT(m[k] != NULL);
                    if (prec) pdp_model_set_precision(m[k], PDP_PRECISION_BF16);
                    for (j = 0; j < 3; j++) {
                        ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_linear(m[k], widths[j]),
                                       pdp_status_name);
                        if (j >= acts) continue;
                        if (k == 1)
                            ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_dropout(m[k], 0.0f),
                                           pdp_status_name);
                        ASSERT_ENUM_EQ(PDP_OK, gelu ? pdp_model_add_gelu(m[k])
                                                    : pdp_model_add_relu(m[k]),
                                       pdp_status_name);
                    }
                    for (j = 0; j < acts; j++)
                        ASSERT((gelu ? pdp__model_gelu_fused(m[k], 2 * j + 1)
                                     : pdp__model_relu_fused(m[k], 2 * j + 1)) == (k == 0));
                    pdp_model_flat(m[0], &g[0], NULL);
                    pdp_model_flat(m[k], &g[k], NULL);
                    ASSERT_EQ(g[0].count, g[k].count);
                    memcpy(g[k].data, g[0].data, (size_t)g[0].count * sizeof(float));
                    wrap_input(m[k], xd, B, &x);
                    pdp_set_num_threads(threads);
                    for (pass = 0; pass < 2; pass++) {
                        ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward(m[k], &x, &y[k]), pdp_status_name);
                        ASSERT_ENUM_EQ(PDP_OK, fixture_backward_with_dx(m[k], dyd, dx[k]),
                                       pdp_status_name);
                    }
                    pdp_set_num_threads(1);
                }
                if (!gelu) ASSERT(m[0]->act_stride < m[1]->act_stride); /* no ReLU outputs */
                ASSERT_EQ(y[1]->count, y[0]->count);
                ASSERT_MEM_EQ(y[1]->data, y[0]->data, (size_t)y[0]->count * sizeof(float));
                ASSERT_MEM_EQ(dx[1], dx[0], (size_t)n * sizeof(float));
                pdp_model_flat(m[0], NULL, &g[0]);
                pdp_model_flat(m[1], NULL, &g[1]);
                ASSERT_MEM_EQ(g[1].data, g[0].data, (size_t)g[0].count * sizeof(float));
                pdp_model_free(m[0]);
                pdp_model_free(m[1]);
            }
    PASS();
}

/* Linear -> ReLU: forward in place after the GEMM; backward masks dy into its workspace
   and sums db on the way; the ReLU is a view. Odd widths (37 -> 45 -> 130 -> 10: not
   multiples of 16), inputs mostly negative (many ReLU zeros). */
TEST layers_linear_relu_fused_matches_unfused(void)
{
    static const int64_t widths[3] = {45, 130, 10};
    CHECK_CALL(fused_matches_apart(false, 7, widths, 2, -1.5f, 0.5f, 120));
    PASS();
}

/* Linear -> GELU: forward writes both outputs (the GELU's input stays, its backward reads
   it; bf16: the GELU in the product's epilogue), backward takes the GELU's dy and leaves
   the GELU out. 130 rows and a 2100-wide layer (the products and the row passes split
   over 2 threads, db through chunks' shares), the last layer a fused GELU. */
TEST layers_linear_gelu_fused_matches_unfused(void)
{
    static const int64_t widths[3] = {45, 2100, 10};
    CHECK_CALL(fused_matches_apart(true, 130, widths, 3, -3.0f, 2.0f, 140));
    PASS();
}

TEST layers_maxpool_ties_go_to_the_first_maximum(void)
{
    pdp_model *m = new_model(3, 1, 2, 4, 15);
    float xd[8] = {1, 5, 5, 2, 5, 0, 2, 2}, dy[2] = {1.0f, 10.0f}, dx[8];
    const float want[8] = {0, 1, 10, 0, 0, 0, 0, 0};
    pdp_tensor x;
    const pdp_tensor *y;
    int i;
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_maxpool2d(m, 2, 0), pdp_status_name);
    wrap_input(m, xd, 1, &x);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward(m, &x, &y), pdp_status_name);
    ASSERT_EQ(5.0f, y->data[0]);
    ASSERT_EQ(5.0f, y->data[1]);
    ASSERT_ENUM_EQ(PDP_OK, fixture_backward_with_dx(m, dy, dx), pdp_status_name);
    for (i = 0; i < 8; i++) ASSERT_EQ(want[i], dx[i]);
    pdp_model_free(m);
    PASS();
}

TEST layers_maxpool_nan_wins_as_in_pytorch(void)
{
    /* PyTorch's scan: an element replaces the maximum when greater or NaN, so the
       last NaN of a window wins. 2x2 windows (its own code path) and 2x2 stride 1
       (the general one). */
    float xd[8] = {1, NAN, 3, 4, 7, 2, NAN, NAN}, dy[3] = {1.0f, 10.0f, 100.0f}, dx[8];
    const float want2[8] = {0, 1, 0, 0, 0, 0, 0, 10}, want1[8] = {0, 1, 0, 0, 0, 0, 10, 100};
    pdp_model *m = new_model(3, 1, 2, 4, 26), *g = new_model(3, 1, 2, 4, 26);
    pdp_tensor x;
    const pdp_tensor *y;
    int i;
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_maxpool2d(m, 2, 2), pdp_status_name);
    wrap_input(m, xd, 1, &x);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward(m, &x, &y), pdp_status_name);
    ASSERT(y->data[0] != y->data[0] && y->data[1] != y->data[1]);
    ASSERT_ENUM_EQ(PDP_OK, fixture_backward_with_dx(m, dy, dx), pdp_status_name);
    for (i = 0; i < 8; i++) ASSERT_EQ(want2[i], dx[i]);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_maxpool2d(g, 2, 1), pdp_status_name); /* 1 x 3 */
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward(g, &x, &y), pdp_status_name);
    ASSERT_EQ(3, y->count);
    ASSERT(y->data[0] != y->data[0] && y->data[1] != y->data[1] && y->data[2] != y->data[2]);
    ASSERT_ENUM_EQ(PDP_OK, fixture_backward_with_dx(g, dy, dx), pdp_status_name);
    /* windows {1, NaN; 7, 2} -> 1, {NaN, 3; 2, NaN} -> 6, {3, 4; NaN, NaN} -> 7 (as torch) */
    for (i = 0; i < 8; i++) ASSERT_EQ(want1[i], dx[i]);
    pdp_model_free(m);
    pdp_model_free(g);
    PASS();
}

/* A NaN or an infinity of x in a Conv2d's weight gradient (stride 1: the implicit path) only
   where PyTorch's sum has it: in the taps that read that pixel at a real output position. x
   is 2 samples of (1, 4, 5), k 3, padding 1, the bad value at column 0 of sample 1 (and, the
   second time, at column 4 of sample 0): tap kj = 2 (kj = 0) never reads that column, so its
   three weights stay finite, the sum over the finite terms, as in torch; the other taps are
   not finite. The grid's band columns between the samples, where dy is 0, read that pixel:
   0 x NaN there made those taps NaN. */
TEST layers_conv2d_nonfinite_x_stays_in_its_taps(void)
{
    static const float bad[2] = {NAN, INFINITY};
    int v, side;
    for (v = 0; v < 2; v++)
        for (side = 0; side < 2; side++) {
            pdp_model *m = new_model(3, 1, 4, 5, 41);
            float xd[40], dy[40], dx[40];
            /* the bad pixel (row 2), and the kj of the taps that stay finite */
            int64_t at = side ? 2 * 5 + 4 : 20 + 2 * 5, clean = side ? 0 : 2;
            pdp_tensor x;
            const pdp_tensor *y;
            pdp_param w;
            int i, ki, kj, oh, ow;
            ASSERT(m != NULL);
            ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_conv2d(m, 1, 3, 1, 1), pdp_status_name);
            for (i = 0; i < 40; i++) {
                xd[i] = (float)((i * 7) % 11) / 4.0f - 1.0f;
                dy[i] = (float)((i * 5) % 9) / 3.0f - 1.0f;
            }
            xd[at] = bad[v];
            wrap_input(m, xd, 2, &x);
            ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward(m, &x, &y), pdp_status_name);
            pdp_model_zero_grad(m);
            ASSERT_ENUM_EQ(PDP_OK, fixture_backward_with_dx(m, dy, dx), pdp_status_name);
            ASSERT_ENUM_EQ(PDP_OK, pdp_model_find_param(m, "0.weight", &w), pdp_status_name);
            for (ki = 0; ki < 3; ki++)
                for (kj = 0; kj < 3; kj++) {
                    float g = w.grad.data[ki * 3 + kj];
                    double want = 0.0;
                    int s;
                    if (kj != clean) {
                        ASSERT(!isfinite(g)); /* as torch: the taps that read the pixel */
                        continue;
                    }
                    for (s = 0; s < 2; s++)
                        for (oh = 0; oh < 4; oh++)
                            for (ow = 0; ow < 5; ow++) {
                                int ih = oh - 1 + ki, iw = ow - 1 + kj;
                                if (ih < 0 || ih >= 4 || iw < 0 || iw >= 5) continue;
                                want += (double)dy[s * 20 + oh * 5 + ow] *
                                        xd[s * 20 + ih * 5 + iw];
                            }
                    ASSERT(isfinite(g));
                    ASSERT_IN_RANGE(want, g, 1e-5 * (1.0 + fabs(want)));
                }
            { /* the same without dx (a first layer's backward): the same bits */
                float before[9];
                pdp_tensor dyt;
                memcpy(before, w.grad.data, sizeof before);
                ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward(m, &x, &y), pdp_status_name);
                pdp_tensor_wrap(dy, pdp_cpu(), 4, y->shape, &dyt);
                pdp_model_zero_grad(m);
                ASSERT_ENUM_EQ(PDP_OK, pdp_model_backward(m, &dyt), pdp_status_name);
                ASSERT_MEM_EQ(before, w.grad.data, sizeof before);
            }
            pdp_model_free(m);
        }
    PASS();
}

TEST layers_relu_nan_as_in_pytorch(void)
{
    /* torch.relu([nan, -1, 2, 0, -0., -inf, inf]) = [nan, 0, 2, 0, 0, 0, inf]; backward
       (threshold_backward on the output) passes dy where the output is not <= 0: at
       2, inf and at the NaN. 20 elements so the blocked loop runs once, then the rest. */
    float xd[20], dy[20], dx[20];
    const float in[7] = {NAN, -1.0f, 2.0f, 0.0f, -0.0f, -INFINITY, INFINITY};
    pdp_model *m = new_model(1, 20, 0, 0, 3);
    pdp_tensor x;
    const pdp_tensor *y;
    int i;
    for (i = 0; i < 20; i++) {
        xd[i] = in[i % 7];
        dy[i] = (float)(i + 1);
    }
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_relu(m), pdp_status_name);
    wrap_input(m, xd, 1, &x);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward(m, &x, &y), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, fixture_backward_with_dx(m, dy, dx), pdp_status_name);
    for (i = 0; i < 20; i++) {
        float v = xd[i];
        if (v != v) {
            ASSERTm("relu(nan) is nan", y->data[i] != y->data[i]);
            ASSERT_EQ(dy[i], dx[i]);
        } else if (v > 0.0f) {
            ASSERT_EQ(v, y->data[i]);
            ASSERT_EQ(dy[i], dx[i]);
        } else {
            ASSERT_EQ(0.0f, y->data[i]);
            ASSERT_EQ(0.0f, dx[i]);
        }
    }
    pdp_model_free(m);
    PASS();
}

/* ---- initialisation ---- */

TEST layers_init_follows_pytorch_and_the_seed(void)
{
    pdp_model *m = new_model(3, 2, 5, 5, 77), *m2 = new_model(3, 2, 5, 5, 77);
    pdp_param w, b;
    pdp_rng r;
    pdp_tensor ref;
    float expect[4 * 18 + 4];
    int64_t n, i;
    float bound = (float)(1.0 / sqrt(18.0)); /* PyTorch: 1 / math.sqrt(fan_in), a double */
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_conv2d(m, 4, 3, 1, 1), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_flatten(m), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_layernorm(m, 0.0f), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_conv2d(m2, 4, 3, 1, 1), pdp_status_name);
    /* weight then bias, from the model's generator seeded with (seed, 0) */
    pdp_rng_seed(&r, 77, 0);
    n = 4 * 18;
    pdp_tensor_wrap(expect, pdp_cpu(), 1, &n, &ref);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_kaiming_uniform(&ref, &r, 18, sqrtf(5.0f)), pdp_status_name);
    n = 4;
    pdp_tensor_wrap(expect + 72, pdp_cpu(), 1, &n, &ref);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_uniform(&ref, &r, -bound, bound), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_find_param(m, "0.weight", &w), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_find_param(m, "0.bias", &b), pdp_status_name);
    ASSERT_MEM_EQ(expect, w.value.data, 72 * sizeof(float));
    ASSERT_MEM_EQ(expect + 72, b.value.data, 4 * sizeof(float));
    for (i = 0; i < 72; i++) ASSERT(fabsf(w.value.data[i]) <= bound);
    /* the same seed gives the same bits, whatever is added later */
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_find_param(m2, "0.weight", &b), pdp_status_name);
    ASSERT_MEM_EQ(w.value.data, b.value.data, 72 * sizeof(float));
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_find_param(m, "2.weight", &w), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_find_param(m, "2.bias", &b), pdp_status_name);
    ASSERT_EQ(1, w.value.ndim);
    ASSERT_EQ(4 * 25, w.value.count);
    for (i = 0; i < w.value.count; i++) {
        ASSERT_EQ(1.0f, w.value.data[i]);
        ASSERT_EQ(0.0f, b.value.data[i]);
    }
    pdp_model_free(m);
    pdp_model_free(m2);
    PASS();
}

/* ---- dropout ---- */

TEST layers_dropout_eval_is_identity(void)
{
    pdp_model *m = new_model(1, 31, 0, 0, 16);
    float xd[4 * 31], dx[4 * 31];
    pdp_tensor x;
    const pdp_tensor *y;
    pdp_rng r;
    pdp_rng_seed(&r, 16, 0);
    fill_uniform(xd, 4 * 31, &r, -1.0f, 1.0f);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_dropout(m, 0.5f), pdp_status_name);
    pdp_model_set_training(m, false);
    ASSERT(!pdp_model_is_training(m));
    wrap_input(m, xd, 4, &x);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward(m, &x, &y), pdp_status_name);
    ASSERT_MEM_EQ(xd, y->data, sizeof xd);
    ASSERT_ENUM_EQ(PDP_OK, fixture_backward_with_dx(m, xd, dx), pdp_status_name);
    ASSERT_MEM_EQ(xd, dx, sizeof xd);
    pdp_model_free(m);
    PASS();
}

TEST layers_dropout_masks_are_deterministic_and_split_invariant(void)
{
    enum { B = 6, F = 1000 };
    static float xd[B * F], whole[B * F], half[B * F], other[B * F];
    pdp_model *m = new_model(1, F, 0, 0, 17);
    pdp_tensor x, part;
    const pdp_tensor *y;
    int64_t i, kept = 0;
    const float p = 0.3f, scale = 1.0f / (1.0f - 0.3f);
    for (i = 0; i < B * F; i++) xd[i] = 1.0f + (float)(i % 7);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_dropout(m, p), pdp_status_name);
    wrap_input(m, xd, B, &x);
    pin_step(m);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward(m, &x, &y), pdp_status_name);
    memcpy(whole, y->data, sizeof whole);
    for (i = 0; i < B * F; i++) {
        ASSERT(whole[i] == 0.0f || whole[i] == xd[i] * scale);
        kept += whole[i] != 0.0f;
    }
    /* keep probability 1 - p: 4200 of 6000 expected, sd 35 */
    ASSERT_IN_RANGE(0.7 * B * F, (double)kept, 200.0);
    /* the same step gives the same mask */
    pin_step(m);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward(m, &x, &y), pdp_status_name);
    ASSERT_MEM_EQ(whole, y->data, sizeof whole);
    /* the batch split in two, as two DP replicas would see it */
    pin_step(m);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_rows_view(&x, 0, 2, &part), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward(m, &part, &y), pdp_status_name);
    memcpy(half, y->data, 2 * F * sizeof(float));
    m->sample_base = 2;
    pin_step(m);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_rows_view(&x, 2, B - 2, &part), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward(m, &part, &y), pdp_status_name);
    memcpy(half + 2 * F, y->data, (B - 2) * F * sizeof(float));
    ASSERT_MEM_EQ(whole, half, sizeof whole);
    /* the next step draws another mask; so does another seed */
    m->sample_base = 0;
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward(m, &x, &y), pdp_status_name);
    memcpy(other, y->data, sizeof other);
    ASSERT(memcmp(whole, other, sizeof whole) != 0);
    pdp_model_free(m);
    m = new_model(1, F, 0, 0, 18);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_dropout(m, p), pdp_status_name);
    pin_step(m);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward(m, &x, &y), pdp_status_name);
    ASSERT(memcmp(whole, y->data, sizeof whole) != 0);
    pdp_model_free(m);
    PASS();
}

/* ---- the grad hook ---- */

typedef struct hook_log {
    int n, order[16];
    float *snap[16]; /* each parameter's gradient at the moment of its hook */
} hook_log;

static void record_hook(void *user, pdp_model *m, int param_index)
{
    hook_log *log = (hook_log *)user;
    pdp_param p;
    if (log->n >= 16 || pdp_model_param(m, param_index, &p) != PDP_OK) return;
    log->order[log->n] = param_index;
    log->snap[log->n] = (float *)malloc((size_t)p.grad.count * sizeof(float));
    if (log->snap[log->n]) memcpy(log->snap[log->n], p.grad.data, (size_t)p.grad.count * 4);
    log->n++;
}

TEST layers_grad_hook_fires_once_per_param_in_reverse_order(void)
{
    pdp_model *m = new_model(3, 1, 6, 6, 19);
    hook_log log;
    pdp_tensor x, dy;
    const pdp_tensor *y;
    float xd[2 * 36], dyd[2 * 4];
    int i, j, nparams;
    memset(&log, 0, sizeof log);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_conv2d(m, 2, 3, 1, 1), pdp_status_name);     /* 0, 1 */
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_maxpool2d(m, 2, 0), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_flatten(m), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_layernorm(m, 0.0f), pdp_status_name);         /* 2, 3 */
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_relu(m), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_linear(m, 4), pdp_status_name);                /* 4, 5 */
    nparams = pdp_model_num_params(m);
    ASSERT_EQ(6, nparams);
    for (i = 0; i < 2 * 36; i++) xd[i] = (float)((i * 37) % 11) - 5.0f;
    for (i = 0; i < 8; i++) dyd[i] = (float)(i % 3) - 1.0f;
    wrap_input(m, xd, 2, &x);
    pdp_model_set_grad_hook(m, record_hook, &log);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward(m, &x, &y), pdp_status_name);
    pdp_tensor_wrap(dyd, pdp_cpu(), 2, y->shape, &dy);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_backward(m, &dy), pdp_status_name);
    ASSERT_EQ(nparams, log.n);
    for (i = 0; i < nparams; i++) {
        pdp_param p;
        ASSERT_EQ(nparams - 1 - i, log.order[i]);
        ASSERT(log.snap[i] != NULL);
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_param(m, log.order[i], &p), pdp_status_name);
        /* final when reported: later layers do not touch it again */
        ASSERT_MEM_EQ(p.grad.data, log.snap[i], (size_t)p.grad.count * sizeof(float));
        for (j = 0; j < p.grad.count && p.grad.data[j] == 0.0f; j++) {}
        ASSERTm("a gradient is all zero", j < p.grad.count);
        free(log.snap[i]);
    }
    pdp_model_free(m);
    PASS();
}

/* A grad hook that calls back into its own model. A forward there overwrote the activations
   and the input the running backward still read (the earlier layers' gradients came from the
   hook's batch, with PDP_OK; a larger batch freed them: a use after free), and a new layer
   moved the layers under it (a crash). Each now fails with PDP_ERR_STATE naming the call,
   and the backward's gradients are those of a backward without the hook. Another model
   trains from the hook as usual. */
typedef struct reenter_log {
    pdp_model *other;
    float *other_x;
    pdp_status forward, reserve, add, other_st;
    char msg[3][1024];
} reenter_log;

static void reenter_hook(void *user, pdp_model *m, int param_index)
{
    static float hx[2 * 8];
    reenter_log *log = (reenter_log *)user;
    pdp_tensor x;
    const pdp_tensor *y;
    int i;
    if (param_index != pdp_model_num_params(m) - 1) return; /* the first hook: layers left */
    for (i = 0; i < 2 * 8; i++) hx[i] = (float)(i % 5) - 2.0f; /* another batch than backward's */
    wrap_input(m, hx, 2, &x);
    log->forward = pdp_model_forward(m, &x, &y);
    snprintf(log->msg[0], sizeof log->msg[0], "%s", pdp_last_error());
    if (log->forward == PDP_OK) return; /* unguarded, the two below would crash backward */
    log->reserve = pdp_model_reserve(m, 64);
    snprintf(log->msg[1], sizeof log->msg[1], "%s", pdp_last_error());
    log->add = pdp_model_add_linear(m, 3);
    snprintf(log->msg[2], sizeof log->msg[2], "%s", pdp_last_error());
    wrap_input(log->other, log->other_x, 2, &x);
    log->other_st = pdp_model_forward(log->other, &x, &y);
}

TEST layers_grad_hook_cannot_run_its_own_model(void)
{
    pdp_model *m[2], *other = new_model(1, 8, 0, 0, 5);
    pdp_tensor x, dy;
    const pdp_tensor *y;
    pdp_tensor grads[2];
    float xd[2 * 8], dyd[2 * 4];
    static reenter_log log;
    int k, i;
    for (i = 0; i < 2 * 8; i++) xd[i] = (float)((i * 7) % 9) / 9.0f - 0.5f;
    for (i = 0; i < 2 * 4; i++) dyd[i] = (float)(i % 3) - 1.0f;
    ASSERT(other != NULL);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_linear(other, 4), pdp_status_name);
    memset(&log, 0, sizeof log);
    log.other = other;
    log.other_x = xd;
    log.other_st = PDP_ERR_STATE;
    for (k = 0; k < 2; k++) { /* k 0: the reference, without the hook */
        m[k] = new_model(1, 8, 0, 0, 21);
        ASSERT(m[k] != NULL);
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_linear(m[k], 6), pdp_status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_relu(m[k]), pdp_status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_linear(m[k], 4), pdp_status_name);
        if (k == 1) pdp_model_set_grad_hook(m[k], reenter_hook, &log);
        wrap_input(m[k], xd, 2, &x);
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward(m[k], &x, &y), pdp_status_name);
        pdp_tensor_wrap(dyd, pdp_cpu(), 2, y->shape, &dy);
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_backward(m[k], &dy), pdp_status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_flat(m[k], NULL, &grads[k]), pdp_status_name);
    }
    ASSERT_ENUM_EQm(log.msg[0], PDP_ERR_STATE, log.forward, pdp_status_name);
    ASSERTm(log.msg[0], strstr(log.msg[0], "pdp_model_forward: called during the model's "
                                           "backward (from its grad hook)") != NULL);
    ASSERT_ENUM_EQm(log.msg[1], PDP_ERR_STATE, log.reserve, pdp_status_name);
    ASSERTm(log.msg[1], strstr(log.msg[1], "pdp_model_reserve: called during") != NULL);
    ASSERT_ENUM_EQm(log.msg[2], PDP_ERR_STATE, log.add, pdp_status_name);
    ASSERTm(log.msg[2], strstr(log.msg[2], "pdp_model_add_linear: called during") != NULL);
    ASSERT_ENUM_EQ(PDP_OK, log.other_st, pdp_status_name); /* another model: as usual */
    ASSERT_EQ(3, pdp_model_num_layers(m[1]));
    ASSERT_EQ(grads[0].count, grads[1].count);
    ASSERT_MEM_EQ(grads[0].data, grads[1].data, (size_t)grads[0].count * sizeof(float));
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_reserve(m[1], 64), pdp_status_name); /* after: fine */
    for (k = 0; k < 2; k++) pdp_model_free(m[k]);
    pdp_model_free(other);
    PASS();
}

/* ---- errors ---- */

TEST layers_bad_configs_fail_with_messages(void)
{
    pdp_model *m = new_model(3, 2, 5, 5, 20), *v = new_model(1, 784, 0, 0, 20);
    ASSERT_ENUM_EQ(PDP_ERR_SHAPE, pdp_model_add_conv2d(m, 4, 9, 1, 1), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "pdp_model_add_conv2d: layer 0 (Conv2d)"));
    ASSERT(strstr(pdp_last_error(), "kernel 9"));
    ASSERT(strstr(pdp_last_error(), "(2, 5, 5)"));
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_model_add_conv2d(m, 0, 3, 1, 1), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "out_channels 0"));
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_model_add_conv2d(m, 4, 3, -1, 1), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "stride -1"));
    ASSERT_ENUM_EQ(PDP_ERR_SHAPE, pdp_model_add_linear(m, 3), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "layer 0 (Linear)"));
    ASSERT(strstr(pdp_last_error(), "Flatten"));
    ASSERT_ENUM_EQ(PDP_ERR_SHAPE, pdp_model_add_maxpool2d(m, 6, 0), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "layer 0 (MaxPool2d)"));
    ASSERT(strstr(pdp_last_error(), "kernel 6"));
    ASSERT_EQ(0, pdp_model_num_layers(m)); /* failures leave the model unchanged */
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_conv2d(m, 4, 3, 1, 1), pdp_status_name);

    ASSERT_ENUM_EQ(PDP_ERR_SHAPE, pdp_model_add_conv2d(v, 4, 3, 1, 1), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "layer 0 (Conv2d)"));
    ASSERT(strstr(pdp_last_error(), "(784)"));
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_model_add_linear(v, 0), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "pdp_model_add_linear: layer 0 (Linear): out_features 0"));
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_model_add_dropout(v, 1.0f), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "layer 0 (Dropout): p 1 is outside [0, 1)"));
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_model_add_dropout(v, -0.5f), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "p -0.5"));
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_model_add_dropout(v, NAN), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_linear(v, 10), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_model_add_linear(v, -3), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "layer 1 (Linear)"));
    ASSERT(strstr(pdp_last_error(), "(10)"));
    pdp_model_free(m);
    pdp_model_free(v);
    PASS();
}

/* Issue 13, item 2: sizes computed from user input that used to wrap around. Each failed
   with a wrapped size before (PDP_OK, or a buffer too small for the next forward). */
TEST layers_sizes_that_overflow_fail(void)
{
    pdp_model *m = new_model(1, 8, 0, 0, 1), *big;
    pdp_model_desc d;
    const pdp_tensor *y;
    pdp_tensor x;
    float xd[16] = {0};
    ASSERT(m != NULL);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_linear(m, 3), pdp_status_name);
    /* reserve: batch 2^62 x 3 activations wrapped, and the next forward on a batch of 2
       wrote past the (small) activation buffer */
    ASSERT_ENUM_EQ(PDP_ERR_OUT_OF_MEMORY, pdp_model_reserve(m, (int64_t)1 << 62), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "pdp_model_reserve: batch 4611686018427387904 needs more"));
    ASSERT_ENUM_EQ(PDP_ERR_OUT_OF_MEMORY, pdp_model_reserve(m, INT64_MAX), pdp_status_name);
    wrap_input(m, xd, 2, &x);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward(m, &x, &y), pdp_status_name);
    ASSERT_EQ(2, m->max_batch);
    pdp_model_free(m);

    /* an input of 2^62 features: its count is over the limit at create */
    memset(&d, 0, sizeof d);
    d.input_shape[0] = (int64_t)1 << 62;
    big = (pdp_model *)&d;
    ASSERT_ENUM_EQ(PDP_ERR_SHAPE, pdp_model_create(&big, &d), pdp_status_name);
    ASSERT(big == NULL);
    ASSERT(strstr(pdp_last_error(), "pdp_model_create: input_shape has more than"));
    d.input_ndim = 3;
    d.input_shape[0] = d.input_shape[1] = d.input_shape[2] = (int64_t)1 << 22;
    ASSERT_ENUM_EQ(PDP_ERR_SHAPE, pdp_model_create(&big, &d), pdp_status_name);

    /* Linear: 2^40 inputs x 2^24 outputs = 2^64 weights wrapped to 0, and add_linear
       returned PDP_OK with the bias as its only parameters */
    ASSERT((m = new_model(1, (int64_t)1 << 40, 0, 0, 1)) != NULL);
    ASSERT_ENUM_EQ(PDP_ERR_SHAPE, pdp_model_add_linear(m, (int64_t)1 << 24), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "pdp_model_add_linear: layer 0 (Linear): out_features "
                                    "16777216 x 1099511627776 inputs: more than"));
    ASSERT_ENUM_EQ(PDP_ERR_SHAPE, pdp_model_add_linear(m, INT64_MAX), pdp_status_name);
    ASSERT_EQ(0, pdp_model_num_layers(m));
    ASSERT_EQ(0, m->param_count);
    pdp_model_free(m);

    /* Conv2d: padding 2^40 gave a (2, 2^41, 2^41) output; padding 2^62 overflows H + 2 pad */
    ASSERT((m = new_model(3, 1, 4, 4, 1)) != NULL);
    ASSERT_ENUM_EQ(PDP_ERR_SHAPE, pdp_model_add_conv2d(m, 2, 3, 1, (int64_t)1 << 40),
                   pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "pdp_model_add_conv2d: layer 0 (Conv2d): out_channels 2, "
                                    "kernel 3, padding 1099511627776: output"));
    ASSERT_ENUM_EQ(PDP_ERR_SHAPE, pdp_model_add_conv2d(m, 2, 3, 1, (int64_t)1 << 62),
                   pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "padding 4611686018427387904: the padded input"));
    ASSERT_ENUM_EQ(PDP_ERR_SHAPE, pdp_model_add_conv2d(m, (int64_t)1 << 50, 3, 1, 1),
                   pdp_status_name);
    ASSERT_ENUM_EQ(PDP_ERR_SHAPE, pdp_model_add_conv2d(m, 1, (int64_t)1 << 31, 1, (int64_t)1 << 31),
                   pdp_status_name);
    ASSERT_ENUM_EQ(PDP_ERR_SHAPE, pdp_model_add_conv2d(m, 1 << 24, 1, 1, 1 << 16), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "workspace exceeds"));
    ASSERT_EQ(0, pdp_model_num_layers(m));
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_conv2d(m, 2, 3, 1, 1), pdp_status_name);
    pdp_model_free(m);
    PASS();
}

/* Issue 13, item 5: a negative or NaN eps was replaced by the default; now zero is the
   default and a value outside (0, inf) fails naming the layer and the value. */
TEST layers_option_values_outside_their_range_fail(void)
{
    pdp_model *m = new_model(1, 6, 0, 0, 1);
    ASSERT(m != NULL);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_model_add_layernorm(m, -1e-5f), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "pdp_model_add_layernorm: layer 0 (LayerNorm): eps -1e-05"));
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_model_add_layernorm(m, NAN), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "eps nan"));
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_model_add_layernorm(m, INFINITY), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "eps inf"));
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_model_add_layernorm(m, -INFINITY), pdp_status_name);
    ASSERT_EQ(0, pdp_model_num_layers(m));
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_layernorm(m, 0.0f), pdp_status_name);
    ASSERT_EQ(1e-5f, m->layers[0].eps); /* zero: the default */
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_layernorm(m, 1e-3f), pdp_status_name);
    ASSERT_EQ(1e-3f, m->layers[1].eps);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_model_add_dropout(m, INFINITY), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_model_add_dropout(m, NAN), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "pdp_model_add_dropout: layer 2 (Dropout): p nan"));
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_model_add_maxpool2d(m, -2, 0), pdp_status_name);
    pdp_model_free(m);
    PASS();
}

TEST layers_wrong_input_width_names_layer_and_shapes(void)
{
    pdp_model *m = new_model(1, 7, 0, 0, 21);
    float xd[3 * 8] = {0};
    int64_t shape[2] = {3, 8};
    pdp_tensor x;
    const pdp_tensor *y = NULL;
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_linear(m, 5), pdp_status_name);
    pdp_tensor_wrap(xd, pdp_cpu(), 2, shape, &x);
    ASSERT_ENUM_EQ(PDP_ERR_SHAPE, pdp_model_forward(m, &x, &y), pdp_status_name);
    ASSERT(y == NULL);
    ASSERT(strstr(pdp_last_error(), "layer 0 (Linear)"));
    ASSERT(strstr(pdp_last_error(), "[3, 7]"));
    ASSERT(strstr(pdp_last_error(), "[3, 8]"));
    pdp_model_free(m);
    PASS();
}

TEST layers_backward_without_forward_fails(void)
{
    pdp_model *m = new_model(1, 7, 0, 0, 22);
    float xd[2 * 7] = {0}, dyd[2 * 5] = {0};
    int64_t shape[2] = {2, 5};
    pdp_tensor x, dy;
    const pdp_tensor *y;
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_linear(m, 5), pdp_status_name);
    pdp_tensor_wrap(dyd, pdp_cpu(), 2, shape, &dy);
    ASSERT_ENUM_EQ(PDP_ERR_STATE, pdp_model_backward(m, &dy), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "pdp_model_backward: no forward"));
    wrap_input(m, xd, 2, &x);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward(m, &x, &y), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_backward(m, &dy), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_ERR_STATE, pdp_model_backward(m, &dy), pdp_status_name); /* twice */
    pdp_model_free(m);
    PASS();
}

/* dy takes the output's shape, not only its count: a transposed [5, 2] or flat [10] dy of
   a [2, 5] output was read as [2, 5] rows (a wrong gradient, PDP_OK); each is refused,
   naming both shapes, and the forward stays for a backward with the right dy. */
TEST layers_backward_refuses_a_dy_of_another_shape(void)
{
    pdp_model *m = new_model(1, 7, 0, 0, 23);
    float xd[2 * 7] = {0}, dyd[2 * 5] = {0}, dxd[2 * 7];
    int64_t good[2] = {2, 5}, transposed[2] = {5, 2}, flat[1] = {10};
    pdp_tensor x, dy, dx;
    const pdp_tensor *y;
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_linear(m, 5), pdp_status_name);
    wrap_input(m, xd, 2, &x);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward(m, &x, &y), pdp_status_name);
    pdp_tensor_wrap(dyd, pdp_cpu(), 2, transposed, &dy);
    ASSERT_ENUM_EQ(PDP_ERR_SHAPE, pdp_model_backward(m, &dy), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "[5, 2]") && strstr(pdp_last_error(), "[2, 5]"));
    pdp_tensor_wrap(dyd, pdp_cpu(), 1, flat, &dy);
    ASSERT_ENUM_EQ(PDP_ERR_SHAPE, pdp_model_backward(m, &dy), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "[10]") && strstr(pdp_last_error(), "[2, 5]"));
    pdp_tensor_wrap(dxd, pdp_cpu(), 2, (int64_t[]){2, 7}, &dx);
    ASSERT_ENUM_EQ(PDP_ERR_SHAPE, pdp_model_backward_dx(m, &dy, &dx), pdp_status_name);
    pdp_tensor_wrap(dyd, pdp_cpu(), 2, good, &dy);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_backward(m, &dy), pdp_status_name);
    /* one sample given without its batch dimension: said so (it read as a batch of 7) */
    pdp_tensor_wrap(xd, pdp_cpu(), 1, (int64_t[]){7}, &x);
    ASSERT_ENUM_EQ(PDP_ERR_SHAPE, pdp_model_forward(m, &x, &y), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "got [7] (one sample without the batch dimension: give it "
                                    "as [1, ...])"));
    pdp_tensor_wrap(xd, pdp_cpu(), 2, (int64_t[]){1, 6}, &x); /* a wrong width: no such hint */
    ASSERT_ENUM_EQ(PDP_ERR_SHAPE, pdp_model_forward(m, &x, &y), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "got [1, 6]") && !strstr(pdp_last_error(), "batch dim"));
    pdp_model_free(m);
    PASS();
}

/* What a backward reads must be this forward's: a forward that failed (a later one than the
   good forward; an Embedding's bad id fails it), a layer added since
   (its buffers were re-planned: the backward read freed memory) and a reserve that
   re-planned the memory each leave PDP_ERR_STATE; dy must hold floats. */
TEST layers_backward_needs_this_forward_whole(void)
{
    pdp_model *m = new_model(1, 7, 0, 0, 22);
    float xd[2 * 7] = {0}, dyd[2 * 5] = {0};
    int32_t ids[2 * 5] = {0};
    int64_t shape[2] = {2, 5}, wrong[2] = {2, 6};
    pdp_tensor x, bad, dy, dyi;
    const pdp_tensor *y;
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_linear(m, 5), pdp_status_name);
    pdp_tensor_wrap(dyd, pdp_cpu(), 2, shape, &dy);
    wrap_input(m, xd, 2, &x);
    /* a failed forward after a good one */
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward(m, &x, &y), pdp_status_name);
    pdp_tensor_wrap(xd, pdp_cpu(), 2, wrong, &bad);
    ASSERT_ENUM_EQ(PDP_ERR_SHAPE, pdp_model_forward(m, &bad, &y), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_ERR_STATE, pdp_model_backward(m, &dy), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "or it failed"));
    /* a layer added since the forward */
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward(m, &x, &y), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_relu(m), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_ERR_STATE, pdp_model_backward(m, &dy), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "layers were added"));
    /* the memory re-planned for a larger batch since the forward */
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward(m, &x, &y), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_reserve(m, 64), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_ERR_STATE, pdp_model_backward(m, &dy), pdp_status_name);
    /* a reserve that fits changes nothing */
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward(m, &x, &y), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_reserve(m, 2), pdp_status_name);
    /* int32 dy: its bits are not gradients */
    pdp_tensor_wrap_ids(ids, pdp_cpu(), 2, shape, &dyi);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_model_backward(m, &dyi), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "dy holds int32"));
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_backward(m, &dy), pdp_status_name); /* still there */
    pdp_model_free(m);
    PASS();
}

/* pdp_model_backward_dx: d(loss)/d(input) against central differences of
   loss = sum(w * y) (w fixed, so dy = w), on models that start with a Linear, a LayerNorm,
   a residual region (its input gradient is the branch's plus the skip's), an element-wise
   layer and a Conv2d; a ReLU first against its rule (dy where x > 0); and the refusals. */
static pdp_status dx_model(int which, pdp_model **out)
{
    pdp_model *m = which == 4 ? new_model(3, 2, 5, 4, 31) : new_model(1, 6, 0, 0, 31);
    pdp_status st = PDP_OK;
    if (!m) return PDP_ERR_OUT_OF_MEMORY;
    if (which == 0)
        st = pdp_model_add_linear(m, 5) || pdp_model_add_gelu(m) || pdp_model_add_linear(m, 3)
                 ? PDP_ERR_INVALID : PDP_OK;
    else if (which == 1)
        st = pdp_model_add_layernorm(m, 0) || pdp_model_add_linear(m, 4) ? PDP_ERR_INVALID
                                                                         : PDP_OK;
    else if (which == 2)
        st = pdp_model_residual_begin(m) || pdp_model_add_linear(m, 6) ||
                     pdp_model_add_tanh(m) || pdp_model_residual_end(m) ||
                     pdp_model_add_linear(m, 3)
                 ? PDP_ERR_INVALID : PDP_OK;
    else if (which == 3)
        st = pdp_model_add_tanh(m) || pdp_model_add_linear(m, 4) ? PDP_ERR_INVALID : PDP_OK;
    else
        st = pdp_model_add_conv2d(m, 3, 3, 1, 1) || pdp_model_add_flatten(m) ||
                     pdp_model_add_linear(m, 4)
                 ? PDP_ERR_INVALID : PDP_OK;
    if (st) pdp_model_free(m);
    else *out = m;
    return st;
}

static double dx_loss(pdp_model *m, float *x, int64_t batch, const float *w)
{
    pdp_tensor xt;
    const pdp_tensor *y;
    double l = 0;
    int64_t i;
    wrap_input(m, x, batch, &xt);
    if (pdp_model_forward(m, &xt, &y) != PDP_OK) return NAN;
    for (i = 0; i < y->count; i++) l += (double)w[i] * y->data[i];
    return l;
}

TEST layers_backward_dx_is_the_input_gradient(void)
{
    enum { BATCH = 2, MAXN = 40 * BATCH };
    int which;
    pdp_rng r;
    pdp_rng_seed(&r, 5, 0);
    for (which = 0; which < 5; which++) {
        pdp_model *m = NULL;
        float x[MAXN], w[MAXN], dx[MAXN];
        int64_t n, i, shape[2];
        pdp_tensor xt, dyt, dxt;
        const pdp_tensor *y;
        char msg[128];
        ASSERT_ENUM_EQ(PDP_OK, dx_model(which, &m), pdp_status_name);
        n = BATCH * m->in_count;
        fill_uniform(x, n, &r, -1.0f, 1.0f);
        fill_uniform(w, BATCH * out_count(m), &r, -1.0f, 1.0f);
        pdp_model_set_training(m, false);
        wrap_input(m, x, BATCH, &xt);
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward(m, &xt, &y), pdp_status_name);
        pdp_tensor_wrap(w, pdp_cpu(), y->ndim, y->shape, &dyt);
        shape[0] = BATCH, shape[1] = m->in_count;
        for (i = 0; i < n; i++) dx[i] = 99.0f; /* overwritten, not added to */
        pdp_tensor_wrap(dx, pdp_cpu(), 2, shape, &dxt);
        ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_model_backward_dx(m, &dyt, &dxt),
                        pdp_status_name);
        for (i = 0; i < n; i++) {
            float keep = x[i];
            double up, down, fd;
            x[i] = keep + 1e-2f;
            up = dx_loss(m, x, BATCH, w);
            x[i] = keep - 1e-2f;
            down = dx_loss(m, x, BATCH, w);
            x[i] = keep;
            fd = (up - down) / (2e-2);
            snprintf(msg, sizeof msg, "model %d, input %lld: dx %g, differences %g", which,
                     (long long)i, (double)dx[i], fd);
            ASSERTm(msg, fabs(fd - dx[i]) <= 1e-2 * (1.0 + fabs(fd)));
        }
        pdp_model_free(m);
    }
    { /* ReLU first: dx = dy where x > 0, else 0; then the refusals */
        pdp_model *m = new_model(1, 4, 0, 0, 3), *ids = NULL;
        pdp_model_desc md;
        float x[8] = {1, -1, 2, -2, 0.5f, -0.5f, 3, -3}, dy[8] = {1, 2, 3, 4, 5, 6, 7, 8};
        float dx[8];
        int32_t tok[8] = {0};
        int64_t shape[2] = {2, 4}, three[2] = {2, 3};
        pdp_tensor xt, dyt, dxt, bad;
        const pdp_tensor *y;
        int i;
        ASSERT(m != NULL);
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_relu(m), pdp_status_name);
        pdp_tensor_wrap(x, pdp_cpu(), 2, shape, &xt);
        pdp_tensor_wrap(dy, pdp_cpu(), 2, shape, &dyt);
        pdp_tensor_wrap(dx, pdp_cpu(), 2, shape, &dxt);
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward(m, &xt, &y), pdp_status_name);
        pdp_tensor_wrap(dx, pdp_cpu(), 2, three, &bad);
        ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_model_backward_dx(m, &dyt, &bad), pdp_status_name);
        ASSERT(strstr(pdp_last_error(), "the input was 8 float32 elements"));
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_backward_dx(m, &dyt, &dxt), pdp_status_name);
        for (i = 0; i < 8; i++) ASSERT_EQ(x[i] > 0 ? dy[i] : 0.0f, dx[i]);
        ASSERT_ENUM_EQ(PDP_ERR_STATE, pdp_model_backward_dx(m, &dyt, &dxt), pdp_status_name);
        pdp_model_free(m);
        memset(&md, 0, sizeof md);
        md.input_shape[0] = 4, md.input_dtype = PDP_DTYPE_I32;
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_create(&ids, &md), pdp_status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_embedding(ids, 5, 4, 0), pdp_status_name);
        pdp_tensor_wrap_ids(tok, pdp_cpu(), 2, shape, &xt);
        ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_model_backward_dx(ids, &dyt, &dxt), pdp_status_name);
        ASSERT(strstr(pdp_last_error(), "token ids"));
        pdp_model_free(ids);
    }
    PASS();
}

/* ---- allocation discipline and determinism ---- */

static pdp_model *small_cnn(uint64_t seed)
{
    pdp_model *m = new_model(3, 2, 12, 12, seed);
    if (!m || pdp_model_add_conv2d(m, 8, 3, 1, 1) || pdp_model_add_relu(m) ||
        pdp_model_add_maxpool2d(m, 2, 0) || pdp_model_add_conv2d(m, 8, 3, 1, 1) ||
        pdp_model_add_gelu(m) || pdp_model_add_flatten(m) || pdp_model_add_layernorm(m, 0.0f) ||
        pdp_model_add_dropout(m, 0.25f) || pdp_model_add_linear(m, 10)) {
        pdp_model_free(m);
        return NULL;
    }
    return m;
}

/* One step of CNN training on batch B with the given intra-op threads; grads out. */
static pdp_status cnn_step(pdp_model *m, const float *xd, int64_t B, float *grads_out)
{
    static float dyd[16 * 10];
    pdp_tensor x, dy, g;
    const pdp_tensor *y;
    pdp_status st;
    int64_t i;
    for (i = 0; i < B * 10; i++) dyd[i] = (float)(i % 5) - 2.0f;
    wrap_input(m, (float *)xd, B, &x);
    pdp_model_zero_grad(m);
    if ((st = pdp_model_forward(m, &x, &y)) != PDP_OK) return st;
    pdp_tensor_wrap(dyd, pdp_cpu(), 2, y->shape, &dy);
    if ((st = pdp_model_backward(m, &dy)) != PDP_OK) return st;
    if (grads_out) {
        pdp_model_flat(m, NULL, &g);
        memcpy(grads_out, g.data, (size_t)g.count * sizeof(float));
    }
    return PDP_OK;
}

TEST layers_training_step_allocates_nothing_after_the_first(void)
{
    static float xd[16 * 2 * 12 * 12];
    pdp_model *m = small_cnn(23);
    pdp_rng r;
    long before;
    int k;
    ASSERT(m != NULL);
    pdp_rng_seed(&r, 23, 0);
    fill_uniform(xd, 16 * 288, &r, -1.0f, 1.0f);
    pdp_set_num_threads(2);
    ASSERT_ENUM_EQ(PDP_OK, cnn_step(m, xd, 16, NULL), pdp_status_name);
    before = __atomic_load_n(&test_allocs, __ATOMIC_RELAXED);
    for (k = 0; k < 3; k++) ASSERT_ENUM_EQ(PDP_OK, cnn_step(m, xd, 16, NULL), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, cnn_step(m, xd, 9, NULL), pdp_status_name); /* a smaller batch */
    ASSERT_EQ(before, __atomic_load_n(&test_allocs, __ATOMIC_RELAXED));
    pdp_set_num_threads(1);
    pdp_model_free(m);
    PASS();
}

TEST layers_gradients_accumulate_across_backwards(void)
{
    static float xd[4 * 2 * 12 * 12];
    pdp_model *m = small_cnn(25);
    pdp_tensor x, dy, g;
    const pdp_tensor *y;
    float dyd[4 * 10], *once;
    pdp_rng r;
    int64_t i;
    int k;
    ASSERT(m != NULL);
    pdp_rng_seed(&r, 25, 0);
    fill_uniform(xd, 4 * 288, &r, -1.0f, 1.0f);
    fill_uniform(dyd, 40, &r, -1.0f, 1.0f);
    wrap_input(m, xd, 4, &x);
    pdp_model_flat(m, NULL, &g);
    once = (float *)malloc((size_t)g.count * sizeof *once);
    ASSERT(once != NULL);
    for (k = 0; k < 2; k++) { /* no zero_grad in between: conv, LayerNorm, Linear add up */
        pin_step(m);
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward(m, &x, &y), pdp_status_name);
        pdp_tensor_wrap(dyd, pdp_cpu(), 2, y->shape, &dy);
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_backward(m, &dy), pdp_status_name);
        if (k == 0) memcpy(once, g.data, (size_t)g.count * sizeof *once);
    }
    for (i = 0; i < g.count; i++)
        ASSERT_IN_RANGE(2.0 * once[i], g.data[i], 1e-6 * (1 + fabs(once[i])));
    free(once);
    pdp_model_free(m);
    PASS();
}

TEST layers_results_do_not_depend_on_the_thread_count(void)
{
    static float xd[16 * 2 * 12 * 12];
    pdp_model *a = small_cnn(24), *b = small_cnn(24);
    float *ga, *gb;
    pdp_rng r;
    ASSERT(a && b);
    ga = (float *)malloc((size_t)pdp_model_param_count(a) * sizeof(float));
    gb = (float *)malloc((size_t)pdp_model_param_count(a) * sizeof(float));
    ASSERT(ga && gb);
    pdp_rng_seed(&r, 24, 0);
    fill_uniform(xd, 16 * 288, &r, -1.0f, 1.0f);
    pdp_set_num_threads(1);
    ASSERT_ENUM_EQ(PDP_OK, cnn_step(a, xd, 16, ga), pdp_status_name);
    pdp_set_num_threads(2);
    ASSERT_ENUM_EQ(PDP_OK, cnn_step(b, xd, 16, gb), pdp_status_name);
    pdp_set_num_threads(1);
    ASSERT_MEM_EQ(ga, gb, (size_t)pdp_model_param_count(a) * sizeof(float));
    free(ga);
    free(gb);
    pdp_model_free(a);
    pdp_model_free(b);
    PASS();
}

/* The Linear's bias (copied into each row before the GEMM) and db (column sums of dy)
   are row passes split over the intra-op threads once batch x out reaches
   PDP__ELEMWISE_PAR_MIN: here 650 x 419 (not a multiple of 16) with 37 inputs, which
   layers.c's pdp__layers_chunks cuts into its most chunks, 64, of 10 or 11 rows. 1, 2 and 3
   threads give the same bits for y, dx and the gradients; db equals a plain loop that adds
   each chunk's rows in order into a share from 0, then the shares in chunk order (the
   same float sums, so bit for bit), and the double-precision sum; y a double-precision
   x W^T + b. */
TEST layers_linear_bias_and_db_split_over_threads(void)
{
    enum { B = 650, IN = 37, OUT = 419 };
    float *xd = (float *)malloc(B * IN * sizeof(float)), *dyd = (float *)malloc(B * OUT * sizeof(float));
    float *y[3], *dx[3], *g[3], *dbn = (float *)calloc(OUT, sizeof(float));
    pdp_model *m[3];
    pdp_param w, bias;
    pdp_tensor x, gr;
    const pdp_tensor *yt;
    pdp_rng r;
    int64_t i, j, p, n = 0;
    int k;
    ASSERT(xd && dyd && dbn);
    pdp_rng_seed(&r, 31, 0);
    fill_uniform(xd, B * IN, &r, -1.0f, 1.0f);
    fill_uniform(dyd, B * OUT, &r, -1.0f, 1.0f);
    for (k = 0; k < 3; k++) {
        m[k] = new_model(1, IN, 0, 0, 31);
        ASSERT(m[k] != NULL);
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_linear(m[k], OUT), pdp_status_name);
        n = pdp_model_param_count(m[k]);
        y[k] = (float *)malloc(B * OUT * sizeof(float));
        dx[k] = (float *)malloc(B * IN * sizeof(float));
        g[k] = (float *)malloc((size_t)n * sizeof(float));
        ASSERT(y[k] && dx[k] && g[k]);
        wrap_input(m[k], xd, B, &x);
        pdp_set_num_threads(k + 1);
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward(m[k], &x, &yt), pdp_status_name);
        memcpy(y[k], yt->data, B * OUT * sizeof(float));
        ASSERT_ENUM_EQ(PDP_OK, fixture_backward_with_dx(m[k], dyd, dx[k]), pdp_status_name);
        pdp_set_num_threads(1);
        pdp_model_flat(m[k], NULL, &gr);
        memcpy(g[k], gr.data, (size_t)n * sizeof(float));
    }
    for (k = 1; k < 3; k++) {
        ASSERT_MEM_EQ(y[0], y[k], B * OUT * sizeof(float));
        ASSERT_MEM_EQ(dx[0], dx[k], B * IN * sizeof(float));
        ASSERT_MEM_EQ(g[0], g[k], (size_t)n * sizeof(float));
    }
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_find_param(m[1], "0.weight", &w), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_find_param(m[1], "0.bias", &bias), pdp_status_name);
    ASSERT_EQ(64, pdp__layers_chunks(B, OUT));
    for (k = 0; k < 64; k++) { /* chunk k: rows [B k / 64, B (k + 1) / 64) */
        float share[OUT] = {0};
        for (i = B * k / 64; i < B * (k + 1) / 64; i++)
            for (j = 0; j < OUT; j++) share[j] += dyd[i * OUT + j];
        for (j = 0; j < OUT; j++) dbn[j] += share[j];
    }
    ASSERT_MEM_EQ(dbn, bias.grad.data, OUT * sizeof(float));
    for (j = 0; j < OUT; j++) {
        double sum = 0.0;
        for (i = 0; i < B; i++) sum += dyd[i * OUT + j];
        ASSERT_IN_RANGE(sum, bias.grad.data[j], 1e-5 * (1.0 + fabs(sum)));
    }
    for (i = 0; i < B; i++)
        for (j = 0; j < OUT; j++) {
            double z = bias.value.data[j];
            for (p = 0; p < IN; p++) z += (double)xd[i * IN + p] * w.value.data[j * IN + p];
            ASSERT_IN_RANGE(z, y[1][i * OUT + j], 1e-5 * (1.0 + fabs(z)));
        }
    for (k = 0; k < 3; k++) {
        free(y[k]);
        free(dx[k]);
        free(g[k]);
        pdp_model_free(m[k]);
    }
    free(xd);
    free(dyd);
    free(dbn);
    PASS();
}

/* A LayerNorm on a slice of the sequence (TP + SP, pdp_gpt_desc.sequence_parallel) sums its
   weight and bias gradients over the slice's rows in the workspace, where layers_tp.c's
   pdp__tp_seq_backward keeps them until the all-reduce over TP; its chunk shares must come
   after them, or the first share overwrites them (the bug fixed by "SP: a LayerNorm on a slice of
   the sequence gets its own workspace after its gradients'"). At this file's thresholds a
   slice of B T / 2 = 16 rows of C = 16 (256 floats) runs as 4 chunks, asserted below; at the
   default ones (test_gpt_sp) it would be 1. TP 2 + SP on 2 thread ranks, 2 SGD steps: each
   rank's losses, replicated LayerNorm gradients (each step) and parameters (after the steps)
   equal the single-device GPT's within 1e-5. */
enum { SPB = 2, SPT = 16, SPC = 16, SPV = 11, SP_STEPS = 2 };

typedef struct sp_chunk_case {
    int32_t ids[SPB * SPT], tg[SPB * SPT];
    const pdp_model *ref;             /* the single-device GPT after the steps */
    const float *ref_grads[SP_STEPS]; /* its flat gradient at each step */
    float losses[2][SP_STEPS];        /* each rank's */
    int64_t chunks[2];                /* each rank's fewest chunks of a sliced LayerNorm */
    int sliced[2];                    /* each rank's LayerNorms on a slice */
    double grad_err[2], param_err[2]; /* each rank's largest relative errors against ref */
} sp_chunk_case;

static pdp_gpt_desc sp_chunk_desc(void)
{
    pdp_gpt_desc d;
    memset(&d, 0, sizeof d);
    d.vocab = SPV, d.context = SPT, d.layers = 1, d.heads = 2, d.dim = SPC, d.seed = 5;
    return d;
}

/* SP_STEPS steps of SGD on m; each step's loss into losses, and grad(m, step, user) between
   backward and the update. */
static pdp_status sp_chunk_train(pdp_model *m, const sp_chunk_case *c, float *losses,
                                 void (*grad)(const pdp_model *, int, void *), void *user)
{
    pdp_optim *o = NULL;
    pdp_optim_desc od;
    pdp_tensor x;
    int64_t shape[2] = {SPB, SPT};
    int s;
    pdp_status st;
    memset(&od, 0, sizeof od);
    od.kind = PDP_OPTIM_SGD, od.lr = 0.5;
    if ((st = pdp_optim_create(&o, m, &od)) != PDP_OK) return st;
    pdp_tensor_wrap_ids((int32_t *)c->ids, pdp_cpu(), 2, shape, &x);
    for (s = 0; s < SP_STEPS && st == PDP_OK; s++) {
        if ((st = pdp_model_forward_backward(m, &x, c->tg, &losses[s])) != PDP_OK) break;
        grad(m, s, user);
        if ((st = pdp_optim_step(o)) == PDP_OK) pdp_optim_zero_grad(o);
    }
    pdp_optim_free(o);
    return st;
}

static void sp_chunk_keep_grads(const pdp_model *m, int step, void *user)
{
    pdp_tensor g;
    pdp_model_flat(m, NULL, &g);
    memcpy(((float **)user)[step], g.data, (size_t)g.count * sizeof(float));
}

typedef struct sp_chunk_rank {
    sp_chunk_case *c;
    int rank;
} sp_chunk_rank;

/* the largest error of the rank's sliced LayerNorms' gradients against ref's at step */
static void sp_chunk_check_grads(const pdp_model *m, int step, void *user)
{
    const sp_chunk_rank *r = (const sp_chunk_rank *)user;
    int i;
    for (i = 0; i < pdp_model_num_params(m); i++) {
        pdp_param mine, full;
        double e;
        pdp_model_param(m, i, &mine);
        if (!m->layers[mine.layer].tp_seq) continue;
        if (pdp_model_find_param(r->c->ref, mine.name, &full) != PDP_OK || full.count != mine.count)
            e = INFINITY;
        else
            e = fixture_rel_err(mine.grad.data, r->c->ref_grads[step] + full.offset, mine.count);
        if (!(e <= r->c->grad_err[r->rank])) r->c->grad_err[r->rank] = e;
    }
}

static pdp_status sp_chunk_run(const pdp_launch_ctx *ctx, void *user)
{
    sp_chunk_case *c = (sp_chunk_case *)user;
    sp_chunk_rank me;
    pdp_gpt_desc d = sp_chunk_desc();
    pdp_model *m = NULL;
    int i;
    pdp_status st;
    me.c = c, me.rank = ctx->rank;
    d.tp = ctx->world;
    d.sequence_parallel = true;
    if ((st = pdp_gpt_create(&m, &d)) != PDP_OK) return st;
    c->chunks[ctx->rank] = INT64_MAX;
    for (i = 0; i < m->nlayers; i++) {
        const pdp__layer *l = &m->layers[i];
        if (!l->tp_seq || l->kind != PDP__LAYERNORM) continue;
        c->sliced[ctx->rank]++;
        c->chunks[ctx->rank] = PDP__MIN(c->chunks[ctx->rank],
                                        pdp__layers_chunks(pdp__layer_rows(l, SPB),
                                                           pdp__layer_in_features(l)));
    }
    if ((st = sp_chunk_train(m, c, c->losses[ctx->rank], sp_chunk_check_grads, &me)) == PDP_OK)
        st = fixture_worst_by_name(m, c->ref, &c->param_err[ctx->rank]);
    pdp_model_free(m);
    return st;
}

TEST layers_sequence_parallel_layernorm_shares_keep_its_gradients(void)
{
    sp_chunk_case c;
    pdp_gpt_desc d = sp_chunk_desc();
    pdp_model *ref = NULL;
    float *grads[SP_STEPS], losses[SP_STEPS];
    int64_t i;
    int r, s;
    memset(&c, 0, sizeof c);
    for (i = 0; i < SPB * SPT; i++) {
        c.ids[i] = (int32_t)((i * 7 + 3) % SPV);
        c.tg[i] = (int32_t)((i * 5 + 1) % SPV);
    }
    ASSERT_ENUM_EQ(PDP_OK, pdp_gpt_create(&ref, &d), pdp_status_name);
    for (s = 0; s < SP_STEPS; s++) {
        grads[s] = (float *)malloc((size_t)pdp_model_param_count(ref) * sizeof(float));
        ASSERT(grads[s] != NULL);
        c.ref_grads[s] = grads[s];
    }
    ASSERT_ENUM_EQ(PDP_OK, sp_chunk_train(ref, &c, losses, sp_chunk_keep_grads, grads),
                   pdp_status_name);
    c.ref = ref;
    ASSERT_ENUM_EQ(PDP_OK, pdp_launch(2, NULL, sp_chunk_run, &c), pdp_status_name);
    for (r = 0; r < 2; r++) {
        ASSERT_EQ(3, c.sliced[r]); /* ln_1, ln_2, ln_f */
        ASSERT_EQ(4, c.chunks[r]);
        ASSERTm("LayerNorm gradients", c.grad_err[r] <= 1e-5);
        ASSERTm("parameters", c.param_err[r] <= 1e-5);
        for (s = 0; s < SP_STEPS; s++) ASSERT_IN_RANGE(losses[s], c.losses[r][s], 1e-5);
    }
    for (s = 0; s < SP_STEPS; s++) free(grads[s]);
    pdp_model_free(ref);
    PASS();
}

/* ---- the table of kinds, names and devices ---- */

/* The table's PDP__LAYER_ELEMENTWISE is what tp.c accepts between a ColumnParallelLinear
   and a RowParallelLinear, and it is true: every flagged kind, run on a permutation of
   its input (and output gradient), gives the same permutation of its output and input
   gradient, bit for bit; inside a one-rank TP block it gives the plain model's output.
   A kind without the flag (LayerNorm) is refused with the flagged kinds' names. */
static pdp_status forward_backward_one(pdp__layer_kind k, const float *x, const float *dy,
                                       float *y, float *dx)
{
    pdp_model *m = new_model(1, 7, 0, 0, 24);
    pdp_tensor xt;
    const pdp_tensor *yt;
    pdp_status st = m ? pdp__model_add(m, pdp__layer_of(k), "test") : PDP_ERR_OUT_OF_MEMORY;
    if (st == PDP_OK) {
        wrap_input(m, (float *)x, 3, &xt);
        if ((st = pdp_model_forward(m, &xt, &yt)) == PDP_OK) {
            memcpy(y, yt->data, 21 * sizeof *y);
            st = fixture_backward_with_dx(m, dy, dx);
        }
    }
    pdp_model_free(m);
    return st;
}

static pdp_status tp_block(pdp_model *m, pdp_comm *c, pdp__layer_kind k)
{
    pdp_status st;
    if ((st = pdp_model_set_tp(m, c)) || (st = pdp_model_add_tp_copy(m)) ||
        (st = pdp_model_add_column_parallel_linear(m, 5)) ||
        (st = k == PDP__LAYERNORM ? pdp_model_add_layernorm(m, 0.0f)
                                  : pdp__model_add(m, pdp__layer_of(k), "test")) ||
        (st = pdp_model_add_row_parallel_linear(m, 3)))
        return st;
    return pdp_model_add_tp_reduce(m);
}

TEST layers_elementwise_kinds_are_elementwise_and_fit_a_tp_block(void)
{
    pdp_local_group *g = NULL;
    pdp_comm *c = NULL;
    float x[21], xr[21], dy[21], dyr[21], y[21], yr[21], dx[21], dxr[21];
    char names[160];
    pdp_rng r;
    int k, i, flagged = 0;
    pdp_rng_seed(&r, 25, 0);
    fill_uniform(x, 21, &r, -3.0f, 3.0f);
    fill_uniform(dy, 21, &r, -1.0f, 1.0f);
    for (i = 0; i < 21; i++) xr[i] = x[20 - i], dyr[i] = dy[20 - i];
    ASSERT_ENUM_EQ(PDP_OK, pdp_local_group_create(&g, 1, NULL), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_comm_create_local(&c, g, 0), pdp_status_name);
    pdp__layer_kinds_with(PDP__LAYER_ELEMENTWISE, names, sizeof names);
    for (k = 0; k < PDP__LAYER_KIND_COUNT; k++) {
        const char *name = pdp__layer_kinds[k].name;
        pdp_model *tp = new_model(1, 6, 0, 0, 26), *plain = new_model(1, 6, 0, 0, 26);
        pdp_tensor xt;
        const pdp_tensor *yt, *yp;
        if (!(pdp__layer_kinds[k].flags & PDP__LAYER_ELEMENTWISE)) {
            pdp_model_free(tp);
            pdp_model_free(plain);
            continue;
        }
        flagged++;
        ASSERTm(name, strstr(names, name) != NULL);
        ASSERT_ENUM_EQm(name, PDP_OK, forward_backward_one((pdp__layer_kind)k, x, dy, y, dx),
                        pdp_status_name);
        ASSERT_ENUM_EQm(name, PDP_OK, forward_backward_one((pdp__layer_kind)k, xr, dyr, yr, dxr),
                        pdp_status_name);
        for (i = 0; i < 21; i++) {
            ASSERTm(name, memcmp(&yr[i], &y[20 - i], sizeof *y) == 0);
            ASSERTm(name, memcmp(&dxr[i], &dx[20 - i], sizeof *dx) == 0);
        }
        ASSERT_ENUM_EQm(name, PDP_OK, tp_block(tp, c, (pdp__layer_kind)k), pdp_status_name);
        ASSERT_ENUM_EQm(name, PDP_OK, pdp_model_add_linear(plain, 5), pdp_status_name);
        ASSERT_ENUM_EQm(name, PDP_OK, pdp__model_add(plain, pdp__layer_of((pdp__layer_kind)k),
                                                     "test"), pdp_status_name);
        ASSERT_ENUM_EQm(name, PDP_OK, pdp_model_add_linear(plain, 3), pdp_status_name);
        wrap_input(tp, x, 3, &xt);
        ASSERT_ENUM_EQm(name, PDP_OK, pdp_model_forward(tp, &xt, &yt), pdp_status_name);
        ASSERT_ENUM_EQm(name, PDP_OK, pdp_model_forward(plain, &xt, &yp), pdp_status_name);
        ASSERT_EQm(name, 9, yt->count);
        ASSERTm(name, memcmp(yt->data, yp->data, 9 * sizeof *yt->data) == 0);
        pdp_model_free(tp);
        pdp_model_free(plain);
    }
    ASSERT(flagged >= 6); /* ReLU, GELU, Tanh, Sigmoid, SiLU, GELUErf at least */
    {
        pdp_model *m = new_model(1, 6, 0, 0, 27);
        ASSERT_ENUM_EQ(PDP_ERR_STATE, tp_block(m, c, PDP__LAYERNORM), pdp_status_name);
        ASSERT(strstr(pdp_last_error(), "pdp_model_add_row_parallel_linear: layer 3 must follow "
                                        "a ColumnParallelLinear") == pdp_last_error());
        ASSERT(strstr(pdp_last_error(), names) != NULL);
        pdp_model_free(m);
    }
    pdp_comm_free(c);
    pdp_local_group_free(g);
    PASS();
}

/* A layer's CPU entries return a status (the type below does not compile where they
   return void), and a failure reaches pdp_model_forward's caller with the layer named.
   The kind that fails on the CPU today is TP's f (its width check, here replaced by
   one that refuses); the GPT's token embedding will reject ids out of range the same
   way. */
static pdp_status refuse_widths(pdp__tp_state *tp)
{
    (void)tp;
    return pdp__err(PDP_ERR_SHAPE, "refused by the test");
}

TEST layers_a_layer_status_reaches_the_caller_naming_the_layer(void)
{
    pdp_local_group *g = NULL;
    pdp_comm *c = NULL;
    pdp_model *m = new_model(1, 6, 0, 0, 23);
    float xd[2 * 6] = {0}, dyd[2 * 3] = {0};
    pdp_tensor x, dy;
    const pdp_tensor *y;
    int k;
    for (k = 0; k < PDP__LAYER_KIND_COUNT; k++) {
        pdp_status (*forward)(const pdp__layer *, const pdp__layer_io *) =
            pdp__layer_kinds[k].forward;
        pdp_status (*backward)(const pdp__layer *, const pdp__layer_io *) =
            pdp__layer_kinds[k].backward;
        ASSERT(forward != NULL && backward != NULL);
    }
    ASSERT_ENUM_EQ(PDP_OK, pdp_local_group_create(&g, 1, NULL), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_comm_create_local(&c, g, 0), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_set_tp(m, c), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_tp_copy(m), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_column_parallel_linear(m, 4), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_relu(m), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_row_parallel_linear(m, 3), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_tp_reduce(m), pdp_status_name);
    wrap_input(m, xd, 2, &x);
    m->tp.check_widths = refuse_widths;
    m->tp.checked = 0;
    ASSERT_ENUM_EQ(PDP_ERR_SHAPE, pdp_model_forward(m, &x, &y), pdp_status_name);
    ASSERT_STR_EQ("pdp_model_forward: layer 0 (CopyToModelParallelRegion): refused by the test",
                  pdp_last_error());
    m->tp.check_widths = pdp__tp_check_widths; /* the real check passes: one rank */
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward(m, &x, &y), pdp_status_name);
    pdp_tensor_wrap(dyd, pdp_cpu(), y->ndim, y->shape, &dy);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_backward(m, &dy), pdp_status_name);
    pdp_model_free(m);
    pdp_comm_free(c);
    pdp_local_group_free(g);
    PASS();
}

TEST layers_table_has_an_entry_for_every_kind(void)
{
    int k, j;
    for (k = 0; k < PDP__LAYER_KIND_COUNT; k++) {
        const pdp__layer_kind_info *info = pdp__layer_kind_of((pdp__layer_kind)k);
        ASSERT(info != NULL);
        ASSERT(info->name != NULL);
        ASSERT(info->setup != NULL);
        ASSERT(info->forward != NULL);
        ASSERT(info->backward != NULL);
#ifndef PDP_CUDA
        ASSERT(info->cuda_forward == NULL && info->cuda_backward == NULL);
#endif
        for (j = 0; j < k; j++) ASSERT(strcmp(info->name, pdp__layer_kinds[j].name) != 0);
    }
    ASSERT(pdp__layer_kind_of(PDP__LAYER_KIND_COUNT) == NULL);
    ASSERT_STR_EQ("?", pdp__layer_kind_name(PDP__LAYER_KIND_COUNT));
    PASS();
}

TEST layers_model_layer_name_names_every_layer(void)
{
    static const char *const want[] = {"Conv2d", "ReLU",    "MaxPool2d", "Flatten",
                                       "Linear", "GELU",    "Tanh",      "Sigmoid",
                                       "SiLU",   "Dropout", "LayerNorm", "GELUErf"};
    pdp_model *m = new_model(3, 2, 6, 6, 21);
    int i;
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_conv2d(m, 3, 3, 1, 1), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_relu(m), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_maxpool2d(m, 2, 2), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_flatten(m), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_linear(m, 8), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_gelu(m), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_tanh(m), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_sigmoid(m), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_silu(m), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_dropout(m, 0.25f), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_layernorm(m, 0.0f), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_gelu_erf(m), pdp_status_name);
    ASSERT_EQ(12, pdp_model_num_layers(m));
    for (i = 0; i < 12; i++) ASSERT_STR_EQ(want[i], pdp_model_layer_name(m, i));
    ASSERT(pdp_model_layer_name(m, -1) == NULL);
    ASSERT(pdp_model_layer_name(m, 12) == NULL);
    ASSERT(pdp_model_layer_name(NULL, 0) == NULL);
    pdp_model_free(m);
    PASS();
}

TEST layers_model_device_is_the_desc_device(void)
{
    pdp_model_desc d;
    pdp_model *m = new_model(1, 5, 0, 0, 22), *g = NULL;
    pdp_device dev = pdp_model_device(m);
    ASSERT_EQ(PDP_DEVICE_CPU, dev.kind);
    dev = pdp_model_device(NULL); /* no model: the CPU */
    ASSERT_EQ(PDP_DEVICE_CPU, dev.kind);
    memset(&d, 0, sizeof d);
    d.input_shape[0] = 5;
    d.device = pdp_cuda(1);
#ifdef PDP_CUDA /* creating allocates nothing, so this works without a GPU */
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_create(&g, &d), pdp_status_name);
    dev = pdp_model_device(g);
    ASSERT_EQ(PDP_DEVICE_CUDA, dev.kind);
    ASSERT_EQ(1, dev.ordinal);
    pdp_model_free(g);
#else /* refused at once, as a tensor is, not at the first layer's parameters */
    ASSERT_ENUM_EQ(PDP_ERR_UNSUPPORTED, pdp_model_create(&g, &d), pdp_status_name);
    ASSERT(g == NULL && strstr(pdp_last_error(), "cuda:1: built without PDP_CUDA"));
#endif
    pdp_model_free(m);
    PASS();
}

/* A float model whose samples are (T, C): Linear, GELU and LayerNorm act per position, so
   its loss, parameters and gradients are, bit for bit, those of the same model on the
   B T rows as samples of C; input_shape with a size past its dimensions, or none, is
   refused naming it. */
TEST layers_positions_input_equals_rows(void)
{
    static const int64_t shape3[3] = {2, 4, 3}, rows[2] = {8, 3}, t3[3] = {2, 4, 2};
    static const int64_t trows[2] = {8, 2};
    pdp_model_desc d;
    pdp_model *m[2] = {NULL, NULL};
    pdp_tensor x, t, p[2], g[2];
    float xs[24], ts[16], loss[2];
    int i, k;
    for (i = 0; i < 24; i++) xs[i] = (float)((i * 7) % 11) / 11.0f - 0.4f;
    for (i = 0; i < 16; i++) ts[i] = (float)((i * 5) % 7) / 7.0f;
    for (k = 0; k < 2; k++) {
        memset(&d, 0, sizeof d);
        d.input_shape[0] = k ? 3 : 4, d.input_shape[1] = k ? 0 : 3, d.seed = 3;
        ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_model_create(&m[k], &d), pdp_status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_linear(m[k], 5), pdp_status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_gelu(m[k]), pdp_status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_layernorm(m[k], 1e-5f), pdp_status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_linear(m[k], 2), pdp_status_name);
        pdp_tensor_wrap(xs, pdp_cpu(), k ? 2 : 3, k ? rows : shape3, &x);
        pdp_tensor_wrap(ts, pdp_cpu(), k ? 2 : 3, k ? trows : t3, &t);
        ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK,
                        pdp_model_forward_backward_target(m[k], &x, &t, &loss[k]),
                        pdp_status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_flat(m[k], &p[k], &g[k]), pdp_status_name);
    }
    ASSERT_EQ(2, pdp_model_get_desc(m[0]).input_ndim);
    ASSERT_EQ(loss[1], loss[0]);
    ASSERT_EQ(p[1].count, p[0].count);
    ASSERT_MEM_EQ(p[1].data, p[0].data, (size_t)p[0].count * sizeof(float));
    ASSERT_MEM_EQ(g[1].data, g[0].data, (size_t)g[0].count * sizeof(float));
    for (k = 0; k < 2; k++) pdp_model_free(m[k]);
    memset(&d, 0, sizeof d);
    d.input_shape[0] = 4, d.input_shape[2] = 3; /* {4, 0, 3}: the 3 would be dropped */
    ASSERT_ENUM_EQ(PDP_ERR_SHAPE, pdp_model_create(&m[0], &d), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "{4, 0, 3} has a size past its 1 dimension"));
    d.input_shape[0] = -4, d.input_shape[2] = 0;
    ASSERT_ENUM_EQ(PDP_ERR_SHAPE, pdp_model_create(&m[0], &d), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "input_shape {-4, 0, 0}"));
    PASS();
}

#ifndef PDP_CUDA
/* A layer call on CUDA memory goes to the kind's CUDA entry; without PDP_CUDA it
   fails naming the macro (the table's entries are NULL). */
TEST layers_cuda_call_without_pdp_cuda_names_the_macro(void)
{
    pdp__layer l;
    pdp__layer_io io;
    memset(&l, 0, sizeof l);
    memset(&io, 0, sizeof io);
    l.kind = PDP__RELU;
    io.device = pdp_cuda(0);
    ASSERT_ENUM_EQ(PDP_ERR_UNSUPPORTED, pdp__layer_forward(&l, &io), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "PDP_CUDA"));
    ASSERT_ENUM_EQ(PDP_ERR_UNSUPPORTED, pdp__layer_backward(&l, &io), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "CUDA device 0"));
    PASS();
}
#endif

SUITE(layers)
{
    RUN_TEST(layers_gpt_create_allocates_the_blocks_once);
    RUN_TEST(layers_linear_grads_match_finite_differences);
    RUN_TEST(layers_activation_grads_match_finite_differences);
    RUN_TEST(layers_dropout_train_grads_match_finite_differences);
    RUN_TEST(layers_layernorm_grads_match_finite_differences);
    RUN_TEST(layers_conv2d_grads_match_finite_differences);
    RUN_TEST(layers_maxpool2d_grads_match_finite_differences);
    RUN_TEST(layers_mlp_grads_match_finite_differences);
    RUN_TEST(layers_cnn_grads_match_finite_differences);
    RUN_TEST(layers_linear_and_activations_match_naive);
    RUN_TEST(layers_conv2d_and_maxpool_match_naive);
    RUN_TEST(layers_conv2d_stride1_matches_naive);
    RUN_TEST(layers_conv_relu_pool_fused_matches_unfused);
    RUN_TEST(layers_linear_relu_fused_matches_unfused);
    RUN_TEST(layers_linear_gelu_fused_matches_unfused);
    RUN_TEST(layers_maxpool_ties_go_to_the_first_maximum);
    RUN_TEST(layers_maxpool_nan_wins_as_in_pytorch);
    RUN_TEST(layers_conv2d_nonfinite_x_stays_in_its_taps);
    RUN_TEST(layers_relu_nan_as_in_pytorch);
    RUN_TEST(layers_init_follows_pytorch_and_the_seed);
    RUN_TEST(layers_dropout_eval_is_identity);
    RUN_TEST(layers_dropout_masks_are_deterministic_and_split_invariant);
    RUN_TEST(layers_grad_hook_fires_once_per_param_in_reverse_order);
    RUN_TEST(layers_grad_hook_cannot_run_its_own_model);
    RUN_TEST(layers_bad_configs_fail_with_messages);
    RUN_TEST(layers_wrong_input_width_names_layer_and_shapes);
    RUN_TEST(layers_sizes_that_overflow_fail);
    RUN_TEST(layers_option_values_outside_their_range_fail);
    RUN_TEST(layers_backward_without_forward_fails);
    RUN_TEST(layers_backward_refuses_a_dy_of_another_shape);
    RUN_TEST(layers_backward_needs_this_forward_whole);
    RUN_TEST(layers_backward_dx_is_the_input_gradient);
    RUN_TEST(layers_training_step_allocates_nothing_after_the_first);
    RUN_TEST(layers_gradients_accumulate_across_backwards);
    RUN_TEST(layers_results_do_not_depend_on_the_thread_count);
    RUN_TEST(layers_linear_bias_and_db_split_over_threads);
    RUN_TEST(layers_sequence_parallel_layernorm_shares_keep_its_gradients);
    RUN_TEST(layers_table_has_an_entry_for_every_kind);
    RUN_TEST(layers_elementwise_kinds_are_elementwise_and_fit_a_tp_block);
    RUN_TEST(layers_a_layer_status_reaches_the_caller_naming_the_layer);
    RUN_TEST(layers_model_layer_name_names_every_layer);
    RUN_TEST(layers_model_device_is_the_desc_device);
    RUN_TEST(layers_positions_input_equals_rows);
#ifndef PDP_CUDA
    RUN_TEST(layers_cuda_call_without_pdp_cuda_names_the_macro);
#endif
}

GREATEST_MAIN_DEFS();

int main(int argc, char **argv)
{
    /* Conv2d chunks of ~512 floats instead of 64K: these small shapes then run as several
       chunks (of 1, 2 or 3 samples, the last one partial), split over threads. Stride-1
       Conv2d (the implicit-GEMM path) in chunks of 3 samples instead of 8: a batch of 5 is a
       full chunk and a partial one. Element-wise layers split over the threads from 256
       floats instead of 262144: the thread-count test runs its ReLUs split. Sums over rows
       (LayerNorm's dw and db, a Linear's db) in chunks from 64 floats instead of 16384: the
       small shapes here sum through several chunks' shares (a tiny GPT's sequence-parallel
       LayerNorms too). */
    pdp__test_knobs.conv_chunk_floats = 512;
    pdp__test_knobs.conv_implicit_chunk = 3;
    pdp__test_knobs.elemwise_par_min = 256;
    pdp__test_knobs.sum_chunk_floats = 64;
    GREATEST_MAIN_BEGIN();
    RUN_SUITE(layers);
    GREATEST_MAIN_END();
}
