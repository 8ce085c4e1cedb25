/* Tests of the losses (src/loss.c): cross-entropy and MSE against double-precision
   references and central finite differences, numerical stability, error paths
   (labels out of range, NaN, shapes), accuracy counting, and
   pdp_model_forward_backward against the separate calls (same bits, no allocation
   after the first call). */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#define PDP_IMPLEMENTATION
#include "counting_alloc.h" /* PDP_MALLOC calls: pdp_test_allocs() */
#include "pdp.h"
#include "pdp_test.h"

static const int64_t shape_4x5[2] = {4, 5};

/* -log softmax(z)[label], in double. */
static double ce_ref(const float *z, int64_t classes, int label)
{
    double mx = z[0], s = 0.0;
    int64_t j;
    for (j = 1; j < classes; j++) mx = z[j] > mx ? z[j] : mx;
    for (j = 0; j < classes; j++) s += exp((double)z[j] - mx);
    return mx + log(s) - z[label];
}

TEST loss_cross_entropy_matches_reference_and_finite_differences(void)
{
    float z[20], dz[20];
    int32_t labels[4] = {3, 0, 4, 1};
    pdp_tensor t, dt;
    pdp_rng r;
    float loss;
    double want = 0.0;
    int64_t i;
    pdp_rng_seed(&r, 1, 0);
    for (i = 0; i < 20; i++) z[i] = 4.0f * pdp_rng_normal(&r);
    pdp_tensor_wrap(z, pdp_cpu(), 2, shape_4x5, &t);
    pdp_tensor_wrap(dz, pdp_cpu(), 2, shape_4x5, &dt);
    ASSERT_ENUM_EQ(PDP_OK, pdp_loss_cross_entropy(&t, labels, &loss, &dt), pdp_status_name);
    for (i = 0; i < 4; i++) want += ce_ref(z + i * 5, 5, labels[i]);
    ASSERT_IN_RANGE(want / 4, loss, 1e-6 * (1 + want / 4));
    for (i = 0; i < 20; i++) { /* d(mean loss)/dz by central differences in double */
        float keep = z[i];
        double lp = 0, lm = 0, fd, h = 1e-3;
        int64_t s;
        z[i] = keep + (float)h;
        for (s = 0; s < 4; s++) lp += ce_ref(z + s * 5, 5, labels[s]);
        z[i] = keep - (float)h;
        for (s = 0; s < 4; s++) lm += ce_ref(z + s * 5, 5, labels[s]);
        z[i] = keep;
        fd = (lp - lm) / 4 / ((double)(float)(keep + (float)h) - (double)(float)(keep - (float)h));
        ASSERT_IN_RANGE(fd, dz[i], 1e-4);
    }
    /* the gradient of every sample sums to zero (softmax minus a one-hot) */
    for (i = 0; i < 4; i++) {
        double s = 0;
        int64_t j;
        for (j = 0; j < 5; j++) s += dz[i * 5 + j];
        ASSERT_IN_RANGE(0.0, s, 1e-7);
    }
    /* dlogits may be NULL */
    ASSERT_ENUM_EQ(PDP_OK, pdp_loss_cross_entropy(&t, labels, &loss, NULL), pdp_status_name);
    ASSERT_IN_RANGE(want / 4, loss, 1e-6 * (1 + want / 4));
    PASS();
}

TEST loss_cross_entropy_is_stable_for_large_logits(void)
{
    float z[10] = {1000, -1000, 999, 0, 50, -3e4f, 3e4f, 3e4f, 0, 1};
    int32_t labels[2] = {2, 1};
    int64_t shape[2] = {2, 5};
    float dz[10], loss;
    pdp_tensor t, dt;
    pdp_tensor_wrap(z, pdp_cpu(), 2, shape, &t);
    pdp_tensor_wrap(dz, pdp_cpu(), 2, shape, &dt);
    ASSERT_ENUM_EQ(PDP_OK, pdp_loss_cross_entropy(&t, labels, &loss, &dt), pdp_status_name);
    /* losses 1 + log(1 + e^-1 + ...) and log 2 (a tie of the two largest) */
    ASSERT_IN_RANGE((ce_ref(z, 5, 2) + ce_ref(z + 5, 5, 1)) / 2, loss, 1e-6);
    ASSERT_IN_RANGE((1.0 + log(1 + exp(-1.0)) + log(2.0)) / 2, loss, 1e-5);
    ASSERT_IN_RANGE(-0.25, dz[6], 1e-7);
    ASSERT_IN_RANGE(0.25, dz[7], 1e-7);
    ASSERT_EQ(0.0f, dz[5]);
    PASS();
}

TEST loss_cross_entropy_errors_name_sample_label_and_shape(void)
{
    float z[20] = {0}, dz[24];
    int32_t labels[4] = {0, 1, 5, 2}, ok[4] = {0, 1, 2, 3};
    int64_t bad_shape[2] = {4, 6}, flat = 20;
    pdp_tensor t, dt, t1;
    float loss;
    pdp_tensor_wrap(z, pdp_cpu(), 2, shape_4x5, &t);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_loss_cross_entropy(&t, labels, &loss, NULL),
                   pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "pdp_loss_cross_entropy: label 5 at sample 2"));
    ASSERT(strstr(pdp_last_error(), "[0, 5)"));
    labels[2] = -1;
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_loss_cross_entropy(&t, labels, &loss, NULL),
                   pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "label -1 at sample 2"));
    z[7] = NAN;
    ASSERT_ENUM_EQ(PDP_ERR_NUMERIC, pdp_loss_cross_entropy(&t, ok, &loss, NULL), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "pdp_loss_cross_entropy: loss is NaN at sample 1"));
    z[7] = INFINITY;
    ASSERT_ENUM_EQ(PDP_ERR_NUMERIC, pdp_loss_cross_entropy(&t, ok, &loss, NULL), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "at sample 1"));
    z[7] = 0;
    pdp_tensor_wrap(dz, pdp_cpu(), 2, bad_shape, &dt);
    ASSERT_ENUM_EQ(PDP_ERR_SHAPE, pdp_loss_cross_entropy(&t, ok, &loss, &dt), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "dlogits is [4, 6], logits is [4, 5]"));
    pdp_tensor_wrap(z, pdp_cpu(), 1, &flat, &t1);
    ASSERT_ENUM_EQ(PDP_ERR_SHAPE, pdp_loss_cross_entropy(&t1, ok, &loss, NULL), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "[batch, classes], got [20]"));
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_loss_cross_entropy(&t, NULL, &loss, NULL),
                   pdp_status_name);
    { /* int32 tensors (ids, labels) hold no logits, gradients or values: their bits would be
         read or written as floats */
        int32_t iz[20] = {0};
        int64_t correct = -1;
        pdp_tensor it;
        pdp_tensor_wrap_ids(iz, pdp_cpu(), 2, shape_4x5, &it);
        ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_loss_cross_entropy(&it, ok, &loss, NULL),
                       pdp_status_name);
        ASSERT(strstr(pdp_last_error(), "pdp_loss_cross_entropy: logits holds int32"));
        ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_loss_cross_entropy(&t, ok, &loss, &it),
                       pdp_status_name);
        ASSERT(strstr(pdp_last_error(), "dlogits holds int32"));
        ASSERT_EQ(0, iz[0]); /* nothing written */
        ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_count_correct(&it, ok, &correct), pdp_status_name);
        ASSERT(strstr(pdp_last_error(), "pdp_count_correct: logits holds int32"));
        ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_loss_mse(&it, &t, &loss, NULL), pdp_status_name);
        ASSERT(strstr(pdp_last_error(), "pdp_loss_mse: pred holds int32"));
        ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_loss_mse(&t, &it, &loss, NULL), pdp_status_name);
        ASSERT(strstr(pdp_last_error(), "target holds int32"));
        ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_loss_mse(&t, &t, &loss, &it), pdp_status_name);
        ASSERT(strstr(pdp_last_error(), "dpred holds int32"));
    }
    PASS();
}

TEST loss_mse_matches_reference_and_finite_differences(void)
{
    float p[15], q[15], dp[15], loss;
    int64_t shape[3] = {3, 5, 1}, other[2] = {3, 5}, i;
    pdp_tensor tp, tq, td, bad;
    pdp_rng r;
    double want = 0;
    pdp_rng_seed(&r, 2, 0);
    for (i = 0; i < 15; i++) {
        p[i] = pdp_rng_normal(&r);
        q[i] = pdp_rng_normal(&r);
        want += ((double)p[i] - q[i]) * ((double)p[i] - q[i]);
    }
    want /= 15;
    pdp_tensor_wrap(p, pdp_cpu(), 3, shape, &tp);
    pdp_tensor_wrap(q, pdp_cpu(), 3, shape, &tq);
    pdp_tensor_wrap(dp, pdp_cpu(), 3, shape, &td);
    ASSERT_ENUM_EQ(PDP_OK, pdp_loss_mse(&tp, &tq, &loss, &td), pdp_status_name);
    ASSERT_IN_RANGE(want, loss, 1e-6);
    for (i = 0; i < 15; i++) {
        double h = 1e-2, fd; /* quadratic: the central difference is exact up to rounding */
        double dplus = (double)p[i] + h - q[i], dminus = (double)p[i] - h - q[i];
        fd = (dplus * dplus - dminus * dminus) / 15 / (2 * h);
        ASSERT_IN_RANGE(fd, dp[i], 1e-6);
    }
    ASSERT_ENUM_EQ(PDP_OK, pdp_loss_mse(&tp, &tq, &loss, NULL), pdp_status_name);
    pdp_tensor_wrap(q, pdp_cpu(), 2, other, &bad);
    ASSERT_ENUM_EQ(PDP_ERR_SHAPE, pdp_loss_mse(&tp, &bad, &loss, NULL), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "pdp_loss_mse: pred is [3, 5, 1], target is [3, 5]"));
    ASSERT_ENUM_EQ(PDP_ERR_SHAPE, pdp_loss_mse(&tp, &tq, &loss, &bad), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "dpred is [3, 5]"));
    p[4] = NAN;
    ASSERT_ENUM_EQ(PDP_ERR_NUMERIC, pdp_loss_mse(&tp, &tq, &loss, NULL), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "pdp_loss_mse: loss is NaN"));
    PASS();
}

TEST loss_count_correct_uses_the_first_maximum(void)
{
    /* argmax: 1 (a tie of 1 and 2), 0, 0 (a tie), 2 */
    float z[12] = {0, 2, 2, 5, 1, 0, -1, -1, -3, 1, 2, 3};
    int32_t labels[4] = {1, 0, 1, 1};
    int64_t shape[2] = {4, 3}, correct = -1;
    pdp_tensor t;
    pdp_tensor_wrap(z, pdp_cpu(), 2, shape, &t);
    ASSERT_ENUM_EQ(PDP_OK, pdp_count_correct(&t, labels, &correct), pdp_status_name);
    ASSERT_EQ(2, correct);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_count_correct(&t, NULL, &correct), pdp_status_name);
    PASS();
}

/* ---- pdp_model_forward_backward ---- */

static pdp_model *mlp(uint64_t seed)
{
    pdp_model_desc d;
    pdp_model *m = NULL;
    memset(&d, 0, sizeof d);
    d.input_shape[0] = 12;
    d.seed = seed;
    if (pdp_model_create(&m, &d) || pdp_model_add_linear(m, 16) || pdp_model_add_relu(m) ||
        pdp_model_add_linear(m, 7)) {
        pdp_model_free(m);
        return NULL;
    }
    return m;
}

TEST loss_forward_backward_equals_the_separate_calls(void)
{
    enum { B = 9 };
    pdp_model *a = mlp(3), *b = mlp(3);
    float xd[B * 12], dy[B * 7], loss_a, loss_b;
    int32_t labels[B];
    int64_t shape[2] = {B, 12}, i;
    pdp_tensor x, dyt, ga, gb;
    const pdp_tensor *y;
    long before;
    pdp_rng r;
    ASSERT(a && b);
    pdp_rng_seed(&r, 3, 0);
    for (i = 0; i < B * 12; i++) xd[i] = pdp_rng_normal(&r);
    for (i = 0; i < B; i++) labels[i] = (int32_t)pdp_rng_below(&r, 7);
    pdp_tensor_wrap(xd, pdp_cpu(), 2, shape, &x);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward_backward(a, &x, labels, &loss_a), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward(b, &x, &y), pdp_status_name);
    pdp_tensor_wrap(dy, pdp_cpu(), 2, y->shape, &dyt);
    ASSERT_ENUM_EQ(PDP_OK, pdp_loss_cross_entropy(y, labels, &loss_b, &dyt), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_backward(b, &dyt), pdp_status_name);
    ASSERT_EQ(loss_b, loss_a);
    ASSERT(loss_a > 0.5f && loss_a < 5.0f);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_flat(a, NULL, &ga), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_flat(b, NULL, &gb), pdp_status_name);
    ASSERT_MEM_EQ(gb.data, ga.data, (size_t)ga.count * sizeof(float));
    /* gradients accumulate; later calls allocate nothing */
    before = pdp_test_allocs();
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward_backward(a, &x, labels, &loss_a), pdp_status_name);
    ASSERT_EQ(before, pdp_test_allocs());
    for (i = 0; i < ga.count; i++) ASSERT_IN_RANGE(2.0 * gb.data[i], ga.data[i], 1e-6);
    pdp_model_free(a);
    pdp_model_free(b);
    PASS();
}

TEST loss_forward_backward_reports_bad_labels_and_shapes(void)
{
    pdp_model *m = mlp(4);
    float xd[2 * 12] = {0}, dy[2 * 7] = {0}, loss;
    int32_t labels[2] = {1, 7};
    int64_t shape[2] = {2, 12}, wide[2] = {2, 13};
    pdp_tensor x, dyt;
    ASSERT(m);
    pdp_tensor_wrap(xd, pdp_cpu(), 2, shape, &x);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_model_forward_backward(m, &x, labels, &loss),
                   pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "pdp_model_forward_backward: label 7 at row 1"));
    ASSERT(strstr(pdp_last_error(), "[0, 7)"));
    /* the failed pass left no forward behind to run backward on */
    pdp_tensor_wrap(dy, pdp_cpu(), 2, shape, &dyt);
    dyt.shape[1] = 7;
    dyt.count = 14;
    ASSERT_ENUM_EQ(PDP_ERR_STATE, pdp_model_backward(m, &dyt), pdp_status_name);
    pdp_tensor_wrap(xd, pdp_cpu(), 2, wide, &x);
    ASSERT_ENUM_EQ(PDP_ERR_SHAPE, pdp_model_forward_backward(m, &x, labels, &loss),
                   pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "pdp_model_forward_backward"));
    ASSERT(strstr(pdp_last_error(), "[2, 13]"));
    pdp_model_free(m);
    PASS();
}

/* A label of -1 takes its row out: the pass over [a, ignored] equals the pass over a
   alone (loss and every gradient), and a batch of only -1 gives 0 and no gradient. */
TEST loss_forward_backward_ignores_minus_one(void)
{
    pdp_model *a = mlp(5), *b = mlp(5);
    float xd[2 * 12], loss_a, loss_b;
    int32_t two[2] = {3, -1}, none[2] = {-1, -1};
    int64_t s2[2] = {2, 12}, s1[2] = {1, 12}, i;
    pdp_tensor x2, x1, ga, gb;
    ASSERT(a && b);
    for (i = 0; i < 24; i++) xd[i] = (float)((i * 37) % 11) / 5.0f - 1.0f;
    pdp_tensor_wrap(xd, pdp_cpu(), 2, s2, &x2);
    pdp_tensor_wrap(xd, pdp_cpu(), 2, s1, &x1);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward_backward(a, &x2, two, &loss_a), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward_backward(b, &x1, two, &loss_b), pdp_status_name);
    ASSERT_EQ(loss_b, loss_a);
    pdp_model_flat(a, NULL, &ga);
    pdp_model_flat(b, NULL, &gb);
    for (i = 0; i < ga.count; i++) ASSERT_EQ(gb.data[i], ga.data[i]);
    pdp_model_zero_grad(a);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward_backward(a, &x2, none, &loss_a), pdp_status_name);
    ASSERT_EQ(0.0f, loss_a);
    for (i = 0; i < ga.count; i++) ASSERT_EQ(0.0f, ga.data[i]);
    pdp_model_free(a);
    pdp_model_free(b);
    PASS();
}

/* The target's dtype picks the loss: int32 labels give pdp_model_forward_backward's pass,
   float32 values pdp_loss_mse's (forward, the loss, backward done by hand here). */
TEST loss_forward_backward_target_picks_the_loss_by_dtype(void)
{
    enum { B = 3 };
    pdp_model *a = mlp(7), *b = mlp(7);
    float xd[B * 12], want[B * 7], dyd[B * 7], loss_a, loss_b;
    int32_t labels[B] = {0, 6, 2};
    int64_t sx[2] = {B, 12}, sy[2] = {B, 7}, sl[1] = {B}, bad[2] = {B, 6}, i;
    pdp_tensor x, t, dy, ga, gb;
    const pdp_tensor *y;
    ASSERT(a && b);
    for (i = 0; i < B * 12; i++) xd[i] = (float)((i * 29) % 13) / 6.0f - 1.0f;
    for (i = 0; i < B * 7; i++) want[i] = (float)((i * 17) % 5) / 4.0f;
    pdp_tensor_wrap(xd, pdp_cpu(), 2, sx, &x);
    pdp_model_flat(a, NULL, &ga);
    pdp_model_flat(b, NULL, &gb);
    /* int32: the labels' pass */
    pdp_tensor_wrap_ids(labels, pdp_cpu(), 1, sl, &t);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward_backward_target(a, &x, &t, &loss_a), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward_backward(b, &x, labels, &loss_b), pdp_status_name);
    ASSERT_EQ(loss_b, loss_a);
    for (i = 0; i < ga.count; i++) ASSERT_EQ(gb.data[i], ga.data[i]);
    /* float32: mean squared error */
    pdp_model_zero_grad(a);
    pdp_model_zero_grad(b);
    pdp_tensor_wrap(want, pdp_cpu(), 2, sy, &t);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward_backward_target(a, &x, &t, &loss_a), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward(b, &x, &y), pdp_status_name);
    pdp_tensor_wrap(dyd, pdp_cpu(), 2, sy, &dy);
    ASSERT_ENUM_EQ(PDP_OK, pdp_loss_mse(y, &t, &loss_b, &dy), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_backward(b, &dy), pdp_status_name);
    ASSERT_EQ(loss_b, loss_a);
    for (i = 0; i < ga.count; i++) ASSERT_EQ(gb.data[i], ga.data[i]);
    /* a target that does not fit the output, named */
    pdp_tensor_wrap(want, pdp_cpu(), 2, bad, &t);
    ASSERT_ENUM_EQ(PDP_ERR_SHAPE, pdp_model_forward_backward_target(a, &x, &t, &loss_a),
                   pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "target is [3, 6], the output is [3, 7]"));
    pdp_model_free(a);
    pdp_model_free(b);
    PASS();
}

/* A regression an embedder brings as arrays, trained through the batcher's target tensors
   and pdp_model_forward_backward_target (MSE): a Linear learns y = 2 x0 - x1 + 0.5. */
TEST loss_regression_from_arrays_trains_through_the_target_tensor(void)
{
    enum { N = 64 };
    float x[N * 2], y[N];
    pdp_dataset_arrays a;
    pdp_dataset *ds = NULL;
    pdp_batcher *b = NULL;
    pdp_batcher_desc bd;
    pdp_model_desc md;
    pdp_model *m = NULL;
    pdp_optim *o = NULL;
    pdp_optim_desc od;
    pdp_tensor xt, t;
    pdp_param w, bias;
    int64_t n, i;
    float loss = 1.0f;
    int epoch;
    for (i = 0; i < N; i++) {
        x[2 * i] = (float)((i * 7) % 17) / 8.0f - 1.0f;
        x[2 * i + 1] = (float)((i * 5) % 13) / 6.0f - 1.0f;
        y[i] = 2.0f * x[2 * i] - x[2 * i + 1] + 0.5f;
    }
    memset(&a, 0, sizeof a);
    a.x = x, a.count = N, a.shape[0] = 2, a.targets = y;
    ASSERT_ENUM_EQ(PDP_OK, pdp_dataset_from_arrays(&ds, &a), pdp_status_name);
    memset(&bd, 0, sizeof bd);
    bd.batch_size = 16, bd.shuffle = true, bd.seed = 1;
    ASSERT_ENUM_EQ(PDP_OK, pdp_batcher_create(&b, ds, &bd), pdp_status_name);
    memset(&md, 0, sizeof md);
    md.input_shape[0] = 2;
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_create(&m, &md), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_linear(m, 1), pdp_status_name);
    memset(&od, 0, sizeof od);
    od.lr = 0.1;
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&o, m, &od), pdp_status_name);
    for (epoch = 0; epoch < 60; epoch++) {
        pdp_batcher_reset(b, (uint64_t)epoch);
        while (pdp_batcher_next_target(b, &xt, &t, &n)) {
            ASSERT_EQ(PDP_DTYPE_F32, t.dtype);
            ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward_backward_target(m, &xt, &t, &loss),
                           pdp_status_name);
            ASSERT_ENUM_EQ(PDP_OK, pdp_optim_step(o), pdp_status_name);
            pdp_optim_zero_grad(o);
        }
    }
    pdp_model_param(m, 0, &w);
    pdp_model_param(m, 1, &bias);
    ASSERT_IN_RANGE(2.0, w.value.data[0], 1e-3);
    ASSERT_IN_RANGE(-1.0, w.value.data[1], 1e-3);
    ASSERT_IN_RANGE(0.5, bias.value.data[0], 1e-3);
    ASSERT_LTE(loss, 1e-6);
    pdp_optim_free(o);
    pdp_model_free(m);
    pdp_batcher_free(b);
    pdp_dataset_free(ds);
    PASS();
}

SUITE(loss)
{
    RUN_TEST(loss_regression_from_arrays_trains_through_the_target_tensor);
    RUN_TEST(loss_forward_backward_ignores_minus_one);
    RUN_TEST(loss_forward_backward_target_picks_the_loss_by_dtype);
    RUN_TEST(loss_cross_entropy_matches_reference_and_finite_differences);
    RUN_TEST(loss_cross_entropy_is_stable_for_large_logits);
    RUN_TEST(loss_cross_entropy_errors_name_sample_label_and_shape);
    RUN_TEST(loss_mse_matches_reference_and_finite_differences);
    RUN_TEST(loss_count_correct_uses_the_first_maximum);
    RUN_TEST(loss_forward_backward_equals_the_separate_calls);
    RUN_TEST(loss_forward_backward_reports_bad_labels_and_shapes);
}

GREATEST_MAIN_DEFS();

int main(int argc, char **argv)
{
    GREATEST_MAIN_BEGIN();
    RUN_SUITE(loss);
    GREATEST_MAIN_END();
}
