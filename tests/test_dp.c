/* test_dp: DataParallel (src/dp.c).

   The reference for every equivalence test is independent of dp.c: the same
   model trained on one device with pdp_model_forward_backward + pdp_optim_step
   on the same global batch. N = 1..4 workers, batch sizes not divisible by N,
   SGD with momentum and Adam, an MLP with dropout and a CNN. Then: gathered
   outputs and reduced gradients, idle workers, the stats' byte counts against
   their formulas, errors inside one worker (status and message naming it, no
   deadlock, a clean step afterwards), bad descs, no allocation after the first
   step (counting PDP_MALLOC), and no thread left behind after pdp_dp_free. */

#define _POSIX_C_SOURCE 200809L /* before the first system header (see pdp.h) */
#include <stdlib.h>
static long test_allocs; /* PDP_MALLOC calls, from any thread */
static void *test_malloc(size_t bytes)
{
    __atomic_add_fetch(&test_allocs, 1, __ATOMIC_RELAXED);
    return malloc(bytes);
}
#define PDP_MALLOC(bytes) test_malloc(bytes)
#define PDP_FREE(ptr) free(ptr)
#define PDP_IMPLEMENTATION
#include "pdp.h"
#include "pdp_test.h"
#include <unistd.h>

#define CHECK_OK(call)                                                                            \
    do {                                                                                          \
        pdp_status st_ = (call);                                                                  \
        ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, st_, pdp_status_name);                          \
    } while (0)

enum { NET_MLP, NET_MLP_DROPOUT, NET_CNN, NET_TANH };

/* The MLPs take 12 features; the CNN (with dropout on its feature maps) 2x6x6
   images. All give 5 classes. */
static pdp_status make_net(int net, uint64_t seed, pdp_model **out)
{
    pdp_model_desc d;
    pdp_model *m;
    pdp_status st;
    memset(&d, 0, sizeof d);
    d.seed = seed;
    if (net == NET_CNN) {
        d.input_shape[0] = 2;
        d.input_shape[1] = 6;
        d.input_shape[2] = 6;
    } else {
        d.input_shape[0] = 12;
    }
    if ((st = pdp_model_create(&m, &d)) != PDP_OK) return st;
    if (net == NET_CNN) {
        if ((st = pdp_model_add_conv2d(m, 4, 3, 1, 1)) || (st = pdp_model_add_relu(m)) ||
            (st = pdp_model_add_dropout(m, 0.2f)) || (st = pdp_model_add_maxpool2d(m, 2, 0)) ||
            (st = pdp_model_add_flatten(m)) ||
            (st = pdp_model_add_linear(m, 5)))
            goto fail;
    } else if (net == NET_TANH) { /* lets a NaN through to the loss */
        if ((st = pdp_model_add_linear(m, 16)) || (st = pdp_model_add_tanh(m)) ||
            (st = pdp_model_add_linear(m, 5)))
            goto fail;
    } else {
        if ((st = pdp_model_add_linear(m, 16)) || (st = pdp_model_add_relu(m)))
            goto fail;
        if (net == NET_MLP_DROPOUT && (st = pdp_model_add_dropout(m, 0.3f))) goto fail;
        if ((st = pdp_model_add_linear(m, 16)) || (st = pdp_model_add_tanh(m)) ||
            (st = pdp_model_add_linear(m, 5)))
            goto fail;
    }
    *out = m;
    return PDP_OK;
fail:
    pdp_model_free(m);
    return st;
}

/* A batch of `steps` x `batch` samples of a net's input, uniform in [-1, 1), and
   labels in [0, 5). */
typedef struct data {
    float *x;
    int32_t *y;
    int64_t per_sample;
} data;

static void data_make(data *dt, int net, int64_t samples, uint64_t seed)
{
    pdp_rng r;
    int64_t i;
    dt->per_sample = net == NET_CNN ? 2 * 6 * 6 : 12;
    dt->x = (float *)malloc((size_t)(samples * dt->per_sample) * sizeof(float));
    dt->y = (int32_t *)malloc((size_t)samples * sizeof(int32_t));
    pdp_rng_seed(&r, seed, 7);
    for (i = 0; i < samples * dt->per_sample; i++) dt->x[i] = 2.0f * pdp_rng_uniform(&r) - 1.0f;
    for (i = 0; i < samples; i++) dt->y[i] = (int32_t)pdp_rng_below(&r, 5);
}

static void data_free(data *dt)
{
    free(dt->x);
    free(dt->y);
}

/* x as a tensor view of samples [first, first + batch). */
static void data_batch(const data *dt, int net, int64_t first, int64_t batch, pdp_tensor *x)
{
    int64_t shape[4];
    shape[0] = batch;
    if (net == NET_CNN) {
        shape[1] = 2;
        shape[2] = 6;
        shape[3] = 6;
    } else {
        shape[1] = 12;
    }
    pdp_tensor_wrap(dt->x + first * dt->per_sample, pdp_cpu(), net == NET_CNN ? 4 : 2, shape, x);
}

/* max |a - b| / max |a| over the flat parameter blocks (normwise relative). */
static double rel_diff(const pdp_model *a, const pdp_model *b, bool grads)
{
    pdp_tensor pa, ga, pb, gb;
    const float *x, *y;
    double num = 0.0, den = 0.0;
    int64_t i;
    pdp_model_flat(a, &pa, &ga);
    pdp_model_flat(b, &pb, &gb);
    x = grads ? ga.data : pa.data;
    y = grads ? gb.data : pb.data;
    for (i = 0; i < pa.count; i++) {
        double d = fabs((double)x[i] - (double)y[i]);
        num = d > num ? d : num;
        den = fabs((double)x[i]) > den ? fabs((double)x[i]) : den;
    }
    return den > 0.0 ? num / den : num;
}

static bool same_bits(const pdp_model *a, const pdp_model *b)
{
    pdp_tensor pa, pb;
    pdp_model_flat(a, &pa, NULL);
    pdp_model_flat(b, &pb, NULL);
    return pa.count == pb.count && memcmp(pa.data, pb.data, (size_t)pa.count * sizeof(float)) == 0;
}

/* ---- equivalence: k steps of DP == k steps on one device ---- */

typedef struct equiv_case {
    int net;
    pdp_optim_kind opt;
} equiv_case;

static enum greatest_test_res run_equivalence(int net, pdp_optim_kind kind)
{
    static const int64_t batches[] = {7, 13, 10};
    const int steps = 3;
    int n, bi, s;
    pdp_optim_desc od;
    memset(&od, 0, sizeof od);
    od.kind = kind;
    if (kind == PDP_OPTIM_SGD) {
        od.lr = 0.1f;
        od.momentum = 0.9f;
    } else {
        od.lr = 0.01f;
    }
    if (kind == PDP_OPTIM_ADAMW) { /* nanoGPT's groups: the biases undecayed, in runs that
                                      the fused step's slices and chunks cut across */
        od.weight_decay = 0.1;
        od.decay_params = PDP_DECAY_MATRICES;
    }
    for (bi = 0; bi < 3; bi++) {
        int64_t batch = batches[bi];
        data dt;
        data_make(&dt, net, batch * steps, 100 + (uint64_t)bi);
        for (n = 1; n <= 4; n++) {
            pdp_model *ref = NULL, *master = NULL;
            pdp_optim *oref = NULL, *odp = NULL;
            pdp_dp *dp = NULL;
            pdp_dp_desc dd;
            float lref = 0.0f, ldp = 0.0f;
            double err;
            static char msg[160]; /* the harness prints it after we return */
            const pdp_tensor *y;
            pdp_tensor x0;
            memset(&dd, 0, sizeof dd);
            dd.num_workers = n;
            CHECK_OK(make_net(net, 42, &ref));
            CHECK_OK(make_net(net, 42, &master));
            CHECK_OK(pdp_optim_create(&oref, ref, &od));
            CHECK_OK(pdp_optim_create(&odp, master, &od));
            CHECK_OK(pdp_dp_create(&dp, master, &dd));
            /* a training forward outside DP moves the master's dropout step past the
               replicas' copies: replicate must bring them along */
            data_batch(&dt, net, 0, 1, &x0);
            CHECK_OK(pdp_model_forward(ref, &x0, &y));
            CHECK_OK(pdp_model_forward(master, &x0, &y));
            for (s = 0; s < steps; s++) {
                pdp_tensor x;
                data_batch(&dt, net, s * batch, batch, &x);
                pdp_optim_zero_grad(oref);
                CHECK_OK(pdp_model_forward_backward(ref, &x, dt.y + s * batch, &lref));
                CHECK_OK(pdp_optim_step(oref));
                CHECK_OK(pdp_dp_step(dp, odp, &x, dt.y + s * batch, &ldp));
                snprintf(msg, sizeof msg, "net %d, %s, N = %d, batch %lld, step %d: loss", net,
                         pdp_optim_kind_name(kind), n, (long long)batch, s);
                ASSERT_IN_RANGEm(msg, lref, ldp, 1e-5 * (1.0 + fabs(lref)));
            }
            err = rel_diff(ref, master, false);
            snprintf(msg, sizeof msg, "net %d, %s, N = %d, batch %lld: parameters differ by %.3g",
                     net, pdp_optim_kind_name(kind), n, (long long)batch, err);
            ASSERTm(msg, err <= 1e-5);
            if (n == 1) {
                snprintf(msg, sizeof msg, "net %d, %s, batch %lld: N = 1 is not bit-identical", net,
                         pdp_optim_kind_name(kind), (long long)batch);
                ASSERTm(msg, same_bits(ref, master));
                ASSERT_EQ(lref, ldp);
            }
            pdp_dp_free(dp);
            pdp_optim_free(oref);
            pdp_optim_free(odp);
            pdp_model_free(ref);
            pdp_model_free(master);
        }
        data_free(&dt);
    }
    PASS();
}

/* Issue 13 item 1, DP's side: DP computes the loss inside its workers, and its
   entries offer the built-in cross-entropy only. An own loss runs on the master
   as on any model (pdp_model_forward, the loss, pdp_model_backward,
   pdp_optim_step): one thread, no parallelism, nothing to synchronise (the
   replicas take the master's parameters at the next replicate). Pinned here:
   such steps equal single-device training bit for bit, and a pdp_dp_step after
   them (replicas sharing or copying the parameters) still equals one device. */
TEST dp_own_loss_trains_the_master_alone(void)
{
    int copy;
    for (copy = 0; copy <= 1; copy++) {
        pdp_model *ref = NULL, *master = NULL;
        pdp_optim *oref = NULL, *odp = NULL;
        pdp_dp *dp = NULL;
        pdp_dp_desc dd;
        pdp_optim_desc od;
        data dt;
        float lref = 0.0f, ldp = 0.0f, target[8 * 5], grad[8 * 5];
        int s, i;
        memset(&dd, 0, sizeof dd);
        dd.num_workers = 3;
        dd.copy_params = copy != 0;
        memset(&od, 0, sizeof od);
        od.kind = PDP_OPTIM_ADAM;
        od.lr = 0.01f;
        data_make(&dt, NET_MLP, 8 * 4, 9);
        CHECK_OK(make_net(NET_MLP, 42, &ref));
        CHECK_OK(make_net(NET_MLP, 42, &master));
        CHECK_OK(pdp_optim_create(&oref, ref, &od));
        CHECK_OK(pdp_optim_create(&odp, master, &od));
        CHECK_OK(pdp_dp_create(&dp, master, &dd));
        for (s = 0; s < 3; s++) {
            pdp_model *mm[2];
            pdp_optim *oo[2];
            int k;
            pdp_tensor x;
            mm[0] = ref;
            mm[1] = master;
            oo[0] = oref;
            oo[1] = odp;
            data_batch(&dt, NET_MLP, s * 8, 8, &x);
            for (i = 0; i < 8 * 5; i++) target[i] = dt.y[s * 8 + i / 5] == i % 5 ? 1.0f : 0.0f;
            for (k = 0; k < 2; k++) {
                const pdp_tensor *y;
                pdp_tensor tt, dy;
                pdp_optim_zero_grad(oo[k]);
                CHECK_OK(pdp_model_forward(mm[k], &x, &y));
                pdp_tensor_wrap(target, pdp_cpu(), 2, y->shape, &tt);
                pdp_tensor_wrap(grad, pdp_cpu(), 2, y->shape, &dy);
                CHECK_OK(pdp_loss_mse(y, &tt, k ? &ldp : &lref, &dy));
                CHECK_OK(pdp_model_backward(mm[k], &dy));
                CHECK_OK(pdp_optim_step(oo[k]));
            }
            ASSERT_EQ(lref, ldp);
            ASSERT(same_bits(ref, master));
        }
        {
            pdp_tensor x;
            data_batch(&dt, NET_MLP, 24, 8, &x);
            pdp_optim_zero_grad(oref);
            CHECK_OK(pdp_model_forward_backward(ref, &x, dt.y + 24, &lref));
            CHECK_OK(pdp_optim_step(oref));
            CHECK_OK(pdp_dp_step(dp, odp, &x, dt.y + 24, &ldp));
            ASSERT_IN_RANGE(lref, ldp, 1e-5 * (1.0 + fabs(lref)));
            ASSERT(rel_diff(ref, master, false) <= 1e-5);
        }
        pdp_dp_free(dp);
        pdp_optim_free(oref);
        pdp_optim_free(odp);
        pdp_model_free(ref);
        pdp_model_free(master);
        data_free(&dt);
    }
    PASS();
}

TEST dp_matches_single_device_mlp_sgd(void) { return run_equivalence(NET_MLP, PDP_OPTIM_SGD); }
TEST dp_matches_single_device_mlp_adam(void) { return run_equivalence(NET_MLP, PDP_OPTIM_ADAM); }
TEST dp_matches_single_device_mlp_dropout_sgd(void)
{
    return run_equivalence(NET_MLP_DROPOUT, PDP_OPTIM_SGD);
}
TEST dp_matches_single_device_mlp_dropout_adam(void)
{
    return run_equivalence(NET_MLP_DROPOUT, PDP_OPTIM_ADAM);
}
TEST dp_matches_single_device_cnn_sgd(void) { return run_equivalence(NET_CNN, PDP_OPTIM_SGD); }
TEST dp_matches_single_device_cnn_adam(void) { return run_equivalence(NET_CNN, PDP_OPTIM_ADAM); }
TEST dp_matches_single_device_mlp_adamw_decay_groups(void)
{
    return run_equivalence(NET_MLP, PDP_OPTIM_ADAMW);
}

/* Dropout really is on: a model whose replicas drew their own masks from one
   stream each (sample_base 0) would differ; check the test could fail by
   comparing against a reference with a different seed. */
TEST dp_dropout_reference_is_sensitive(void)
{
    pdp_model *a = NULL, *b = NULL;
    data dt;
    pdp_tensor x;
    float la, lb;
    CHECK_OK(make_net(NET_MLP_DROPOUT, 42, &a));
    CHECK_OK(make_net(NET_MLP_DROPOUT, 42, &b));
    data_make(&dt, NET_MLP_DROPOUT, 8, 3);
    data_batch(&dt, NET_MLP_DROPOUT, 0, 8, &x);
    b->step = 5; /* different masks, same parameters */
    CHECK_OK(pdp_model_forward_backward(a, &x, dt.y, &la));
    CHECK_OK(pdp_model_forward_backward(b, &x, dt.y, &lb));
    ASSERTm("dropout masks do not depend on the step: the dropout tests prove nothing",
            rel_diff(a, b, true) > 1e-3);
    data_free(&dt);
    pdp_model_free(a);
    pdp_model_free(b);
    PASS();
}

/* ---- gathered outputs and reduced gradients ---- */

TEST dp_forward_backward_gathers_outputs_and_sums_gradients(void)
{
    pdp_model *ref = NULL, *master = NULL;
    pdp_dp *dp = NULL;
    pdp_dp_desc dd;
    const pdp_tensor *y, *out;
    data dt;
    pdp_tensor x;
    float lref, ldp;
    int64_t i;
    memset(&dd, 0, sizeof dd);
    dd.num_workers = 3;
    data_make(&dt, NET_CNN, 11, 9);
    data_batch(&dt, NET_CNN, 0, 11, &x);
    CHECK_OK(make_net(NET_CNN, 5, &ref));
    CHECK_OK(make_net(NET_CNN, 5, &master));
    CHECK_OK(pdp_dp_create(&dp, master, &dd));
    ASSERT_EQ(NULL, pdp_dp_output(dp));
    CHECK_OK(pdp_model_forward_backward(ref, &x, dt.y, &lref));
    CHECK_OK(pdp_dp_forward_backward(dp, &x, dt.y, &ldp));
    ASSERT_IN_RANGE(lref, ldp, 1e-6);
    out = pdp_dp_output(dp);
    ASSERT(out != NULL);
    ASSERT_EQ(2, out->ndim);
    ASSERT_EQ(11, out->shape[0]);
    ASSERT_EQ(5, out->shape[1]);
    ref->step--; /* the same dropout masks as the pass above */
    CHECK_OK(pdp_model_forward(ref, &x, &y));
    for (i = 0; i < y->count; i++) ASSERT_IN_RANGE(y->data[i], out->data[i], 1e-6);
    ASSERT(rel_diff(ref, master, true) <= 1e-5);
    /* without a step the gradients accumulate, as in PyTorch: the master now holds
       the gradient of dropout step 1 and adds that of step 2 */
    pdp_model_zero_grad(ref);
    ref->step = 0;
    CHECK_OK(pdp_model_forward_backward(ref, &x, dt.y, &lref));
    CHECK_OK(pdp_model_forward_backward(ref, &x, dt.y, &lref));
    CHECK_OK(pdp_dp_forward_backward(dp, &x, dt.y, &ldp));
    ASSERT(rel_diff(ref, master, true) <= 1e-5);
    pdp_dp_free(dp);
    pdp_model_free(ref);
    pdp_model_free(master);
    data_free(&dt);
    PASS();
}

/* The reduce gives the same bits whether each worker sums a slice or the master
   sums everything, and whether replicas share or copy the parameters. */
/* Modes: 0 default (the step fused into the workers' reduce), 1 reduce_on_master,
   2 copy_params, 3 pdp_dp_forward_backward then the caller's pdp_optim_step on the
   master (no fusion): all the same bits, Adam's step count included. */
TEST dp_reduce_and_replicate_modes_are_bit_identical(void)
{
    pdp_model *m[4] = {NULL, NULL, NULL, NULL};
    pdp_optim *o[4] = {NULL, NULL, NULL, NULL};
    pdp_dp *dp[4] = {NULL, NULL, NULL, NULL};
    pdp_optim_desc od;
    data dt;
    int i, s;
    memset(&od, 0, sizeof od);
    od.kind = PDP_OPTIM_ADAM;
    data_make(&dt, NET_MLP_DROPOUT, 4 * 9, 11);
    for (i = 0; i < 4; i++) {
        pdp_dp_desc dd;
        memset(&dd, 0, sizeof dd);
        dd.num_workers = 3;
        dd.reduce_on_master = i == 1;
        dd.copy_params = i == 2;
        CHECK_OK(make_net(NET_MLP_DROPOUT, 77, &m[i]));
        CHECK_OK(pdp_optim_create(&o[i], m[i], &od));
        CHECK_OK(pdp_dp_create(&dp[i], m[i], &dd));
    }
    for (s = 0; s < 4; s++)
        for (i = 0; i < 4; i++) {
            pdp_tensor x;
            data_batch(&dt, NET_MLP_DROPOUT, s * 9, 9, &x);
            if (i < 3) {
                CHECK_OK(pdp_dp_step(dp[i], o[i], &x, dt.y + s * 9, NULL));
            } else {
                CHECK_OK(pdp_dp_forward_backward(dp[i], &x, dt.y + s * 9, NULL));
                CHECK_OK(pdp_optim_step(o[i]));
                pdp_optim_zero_grad(o[i]);
            }
        }
    ASSERTm("reduce_on_master changed the bits", same_bits(m[0], m[1]));
    ASSERTm("copy_params changed the bits", same_bits(m[0], m[2]));
    ASSERTm("the fused step changed the bits", same_bits(m[0], m[3]));
    for (i = 0; i < 4; i++) ASSERT_EQ(4, pdp_optim_steps(o[i]));
    for (i = 0; i < 4; i++) {
        pdp_dp_free(dp[i]);
        pdp_optim_free(o[i]);
        pdp_model_free(m[i]);
    }
    data_free(&dt);
    PASS();
}

/* ---- idle workers ---- */

TEST dp_more_workers_than_samples_idle_and_stay_correct(void)
{
    static const int cases[][2] = {{4, 3}, {5, 2}, {3, 1}, {8, 7}};
    int c, s;
    for (c = 0; c < 4; c++) {
        int n = cases[c][0], batch = cases[c][1];
        pdp_model *ref = NULL, *master = NULL;
        pdp_optim *oref = NULL, *odp = NULL;
        pdp_dp *dp = NULL;
        pdp_dp_desc dd;
        pdp_dp_stats st;
        data dt;
        memset(&dd, 0, sizeof dd);
        memset(&st, 0, sizeof st);
        dd.num_workers = n;
        data_make(&dt, NET_MLP_DROPOUT, 3 * batch, 21);
        CHECK_OK(make_net(NET_MLP_DROPOUT, 8, &ref));
        CHECK_OK(make_net(NET_MLP_DROPOUT, 8, &master));
        CHECK_OK(pdp_optim_create(&oref, ref, NULL));
        CHECK_OK(pdp_optim_create(&odp, master, NULL));
        CHECK_OK(pdp_dp_create(&dp, master, &dd));
        for (s = 0; s < 3; s++) {
            pdp_tensor x;
            float l;
            data_batch(&dt, NET_MLP_DROPOUT, s * batch, batch, &x);
            pdp_optim_zero_grad(oref);
            CHECK_OK(pdp_model_forward_backward(ref, &x, dt.y + s * batch, &l));
            CHECK_OK(pdp_optim_step(oref));
            CHECK_OK(pdp_dp_step(dp, odp, &x, dt.y + s * batch, &l));
        }
        CHECK_OK(pdp_dp_get_stats(dp, &st));
        ASSERT_EQ(n, st.num_workers);
        ASSERT_EQ(batch, st.active_workers);
        ASSERT(rel_diff(ref, master, false) <= 1e-5);
        pdp_dp_free(dp);
        pdp_optim_free(oref);
        pdp_optim_free(odp);
        pdp_model_free(ref);
        pdp_model_free(master);
        data_free(&dt);
    }
    PASS();
}

/* ---- stats ---- */

TEST dp_stats_count_bytes_and_master_memory(void)
{
    pdp_model *master = NULL;
    pdp_optim *o = NULL;
    pdp_dp *dp = NULL;
    pdp_dp_desc dd;
    pdp_dp_stats st = {0};
    pdp_optim_desc od;
    data dt;
    pdp_tensor x;
    char text[1024];
    size_t pbytes, row = 12 * 4 + 4;
    memset(&dd, 0, sizeof dd);
    memset(&od, 0, sizeof od);
    dd.num_workers = 3;
    dd.copy_params = true;
    od.kind = PDP_OPTIM_ADAM;
    data_make(&dt, NET_MLP, 10, 1);
    data_batch(&dt, NET_MLP, 0, 10, &x);
    CHECK_OK(make_net(NET_MLP, 1, &master));
    pbytes = (size_t)pdp_model_param_count(master) * 4;
    CHECK_OK(pdp_optim_create(&o, master, &od));
    CHECK_OK(pdp_dp_create(&dp, master, &dd));
    CHECK_OK(pdp_dp_step(dp, o, &x, dt.y, NULL));
    CHECK_OK(pdp_dp_get_stats(dp, &st));
    /* shards 4, 3, 3: replicas 1 and 2 get 6 samples and send back 6 x 5 logits */
    ASSERT_EQ(1, st.steps);
    ASSERT_EQ(10, st.batch);
    ASSERT_EQ(3, st.active_workers);
    ASSERT_FALSE(st.params_shared);
    ASSERT_EQ(2 * pbytes, st.replicate_bytes);
    ASSERT_EQ(6 * row, st.scatter_bytes);
    ASSERT_EQ(6 * 5 * 4 + 2 * sizeof(double), st.gather_bytes);
    ASSERT_EQ(2 * pbytes, st.reduce_bytes);
    ASSERT_EQ(st.replicate_bytes + st.scatter_bytes, st.bytes_from_master);
    ASSERT_EQ(st.gather_bytes + st.reduce_bytes, st.bytes_to_master);
    ASSERT(st.last.replicate >= 0.0 && st.last.scatter >= 0.0 && st.last.gather >= 0.0);
    /* CPU workers step the slices they reduce: the step's time is in reduce */
    ASSERT(st.last.apply > 0.0 && st.last.reduce > 0.0 && st.last.step == 0.0);
    ASSERT_EQ(1, pdp_optim_steps(o));
    ASSERT(st.last.total >= st.last.apply + st.last.reduce);
#ifdef _WIN32 /* GetThreadTimes counts scheduler ticks (10-16 ms): a short part may read 0 */
    ASSERT(st.last.apply_cpu >= 0.0 && st.last.reduce_cpu >= 0.0);
#else
    ASSERT(st.last.apply_cpu > 0.0 && st.last.reduce_cpu > 0.0);
#endif
    ASSERT(st.last.critical_cpu >= st.last.apply_cpu + st.last.reduce_cpu);
    ASSERT(st.apply_worker_max >= st.apply_worker_min && st.apply_worker_max <= st.last.apply);
    /* master: parameters, gradients, Adam's two moments, a 4-sample shard, the
       gathered outputs; a replica: parameters, gradients, a 3-sample shard */
    ASSERT(st.master_bytes >= 4 * pbytes + 10 * 5 * 4);
    ASSERT(st.replica_bytes >= 2 * pbytes);
    ASSERT(st.master_bytes > st.replica_bytes + 2 * pbytes);
    ASSERT(pdp_dp_stats_format(&st, text, sizeof text) > 0);
    ASSERT(strstr(text, "replicate") && strstr(text, "master"));
    ASSERT(strstr(text, "last batch 10,")); /* the shared parameters' traffic is labelled */
    ASSERT(!st.params_shared || strstr(text, "traffic (what DP across devices sends"));
    CHECK_OK(pdp_dp_step(dp, o, &x, dt.y, NULL));
    CHECK_OK(pdp_dp_get_stats(dp, &st));
    ASSERT_EQ(2, st.steps);
    ASSERT(st.sum.total >= st.last.total);
    pdp_dp_free(dp);
    pdp_optim_free(o);
    pdp_model_free(master);
    data_free(&dt);
    PASS();
}

/* ---- errors ---- */

TEST dp_error_in_one_worker_names_it_and_recovers(void)
{
    pdp_model *master = NULL;
    pdp_optim *o = NULL;
    pdp_dp *dp = NULL;
    pdp_dp_desc dd;
    data dt;
    pdp_tensor x;
    pdp_status st;
    float l;
    int64_t saved;
    memset(&dd, 0, sizeof dd);
    dd.num_workers = 4;
    data_make(&dt, NET_MLP, 10, 4);
    data_batch(&dt, NET_MLP, 0, 10, &x);
    CHECK_OK(make_net(NET_MLP, 3, &master));
    CHECK_OK(pdp_optim_create(&o, master, NULL));
    CHECK_OK(pdp_dp_create(&dp, master, &dd));
    CHECK_OK(pdp_dp_step(dp, o, &x, dt.y, &l));

    /* a shape error only worker 2 sees: its replica now expects 11 features */
    saved = dp->workers[2].replica->in_shape[0];
    dp->workers[2].replica->in_shape[0] = 11;
    st = pdp_dp_step(dp, o, &x, dt.y, &l);
    ASSERT_ENUM_EQ(PDP_ERR_SHAPE, st, pdp_status_name);
    ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "pdp_dp_step: worker 2") != NULL);
    ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "pdp_model_forward: layer 0 (Linear)"));
    ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "[2, 11]") != NULL);
    dp->workers[2].replica->in_shape[0] = saved;

    /* a bad label in worker 3's shard (samples 8..9) */
    dt.y[9] = 17;
    st = pdp_dp_step(dp, o, &x, dt.y, &l);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, st, pdp_status_name);
    ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "worker 3 (samples 8..9)") != NULL);
    ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "label 17") != NULL);
    dt.y[9] = 1;

    /* every worker is still there and nothing is stuck */
    CHECK_OK(pdp_dp_step(dp, o, &x, dt.y, &l));
    ASSERT(isfinite(l));
    pdp_dp_free(dp);
    pdp_optim_free(o);
    pdp_model_free(master);
    data_free(&dt);
    PASS();
}

TEST dp_nan_in_one_shard_names_its_worker(void)
{
    pdp_model *master = NULL;
    pdp_optim *o = NULL;
    pdp_dp *dp = NULL;
    pdp_dp_desc dd;
    data dt;
    pdp_tensor x;
    pdp_status st;
    float l;
    memset(&dd, 0, sizeof dd);
    dd.num_workers = 3;
    data_make(&dt, NET_TANH, 9, 4);
    data_batch(&dt, NET_TANH, 0, 9, &x);
    CHECK_OK(make_net(NET_TANH, 3, &master));
    CHECK_OK(pdp_optim_create(&o, master, NULL));
    CHECK_OK(pdp_dp_create(&dp, master, &dd));
    dt.x[4 * 12 + 3] = NAN; /* sample 4: worker 1 has samples 3..5 */
    st = pdp_dp_step(dp, o, &x, dt.y, &l);
    ASSERT_ENUM_EQ(PDP_ERR_NUMERIC, st, pdp_status_name);
    ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "pdp_dp_step: worker 1 (samples 3..5)"));
    ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "NaN") != NULL);
    dt.x[4 * 12 + 3] = 0.5f;
    CHECK_OK(pdp_dp_step(dp, o, &x, dt.y, &l));
    pdp_dp_free(dp);
    pdp_optim_free(o);
    pdp_model_free(master);
    data_free(&dt);
    PASS();
}

TEST dp_bad_arguments_are_reported(void)
{
    pdp_model *master = NULL, *other = NULL, *empty = NULL, *conv = NULL;
    pdp_optim *o = NULL;
    pdp_dp *dp = (pdp_dp *)&dp;
    pdp_dp_desc dd;
    pdp_model_desc md;
    pdp_device devs[2];
    data dt;
    pdp_tensor x, wrong;
    int64_t shape[2] = {4, 13};
    pdp_status st;
    CHECK_OK(make_net(NET_MLP, 1, &master));
    CHECK_OK(make_net(NET_MLP, 1, &other));
    memset(&dd, 0, sizeof dd);

    dd.num_workers = -1;
    st = pdp_dp_create(&dp, master, &dd);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, st, pdp_status_name);
    ASSERT_EQ(NULL, dp);
    ASSERT(strstr(pdp_last_error(), "pdp_dp_create: num_workers -1") != NULL);
    dd.num_workers = PDP_DP_MAX_WORKERS + 1;
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_dp_create(&dp, master, &dd), pdp_status_name);
    dd.num_workers = 2;
    dd.threads_per_worker = -3;
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_dp_create(&dp, master, &dd), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "threads_per_worker -3") != NULL);
    dd.threads_per_worker = 0;
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_dp_create(&dp, NULL, &dd), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_dp_create(NULL, master, &dd), pdp_status_name);

    devs[0] = pdp_cpu();
    devs[1] = pdp_cuda(1);
    dd.devices = devs;
    st = pdp_dp_create(&dp, master, &dd);
    ASSERT_ENUM_EQ(PDP_ERR_UNSUPPORTED, st, pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "devices[1]") != NULL);
    devs[0] = pdp_cuda(0);
    ASSERT_ENUM_EQ(PDP_ERR_DEVICE, pdp_dp_create(&dp, master, &dd), pdp_status_name);
    dd.num_workers = 0;
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_dp_create(&dp, master, &dd), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "devices") != NULL);
    dd.num_workers = 2;
    dd.devices = NULL;

    memset(&md, 0, sizeof md);
    md.input_shape[0] = 12;
    CHECK_OK(pdp_model_create(&empty, &md));
    ASSERT_ENUM_EQ(PDP_ERR_STATE, pdp_dp_create(&dp, empty, &dd), pdp_status_name);
    md.input_shape[0] = 2;
    md.input_shape[1] = 6;
    md.input_shape[2] = 6;
    CHECK_OK(pdp_model_create(&conv, &md));
    CHECK_OK(pdp_model_add_conv2d(conv, 3, 3, 1, 0));
    st = pdp_dp_create(&dp, conv, &dd);
    ASSERT_ENUM_EQ(PDP_ERR_SHAPE, st, pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "layer 0 (Conv2d)") != NULL);

    /* N = 0 means one worker per online core */
    dd.num_workers = 0;
    CHECK_OK(pdp_dp_create(&dp, master, &dd));
    ASSERT_EQ(pdp__cpu_count(), pdp_dp_num_workers(dp));
    data_make(&dt, NET_MLP, 4, 2);
    data_batch(&dt, NET_MLP, 0, 4, &x);
    CHECK_OK(pdp_optim_create(&o, other, NULL));
    st = pdp_dp_step(dp, o, &x, dt.y, NULL);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, st, pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "another model") != NULL);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_dp_step(dp, NULL, &x, dt.y, NULL), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_dp_forward_backward(dp, &x, NULL, NULL), pdp_status_name);
    /* a shape every worker rejects: the lowest worker is named */
    pdp_tensor_wrap(dt.x, pdp_cpu(), 2, shape, &wrong);
    st = pdp_dp_forward_backward(dp, &wrong, dt.y, NULL);
    ASSERT_ENUM_EQ(PDP_ERR_SHAPE, st, pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "pdp_dp_forward_backward: worker 0") != NULL);
    CHECK_OK(pdp_dp_forward_backward(dp, &x, dt.y, NULL));
    pdp_dp_free(dp);
    pdp_dp_free(NULL);
    pdp_optim_free(o);
    pdp_model_free(master);
    pdp_model_free(other);
    pdp_model_free(empty);
    pdp_model_free(conv);
    data_free(&dt);
    PASS();
}

/* ---- resources ---- */

TEST dp_allocates_nothing_after_the_first_step(void)
{
    pdp_model *master = NULL;
    pdp_optim *o = NULL;
    pdp_dp *dp = NULL;
    pdp_dp_desc dd;
    pdp_optim_desc od;
    data dt;
    long before = 0;
    int s;
    memset(&dd, 0, sizeof dd);
    memset(&od, 0, sizeof od);
    dd.num_workers = 3;
    od.kind = PDP_OPTIM_ADAM;
    data_make(&dt, NET_CNN, 6 * 11, 5);
    CHECK_OK(make_net(NET_CNN, 2, &master));
    CHECK_OK(pdp_optim_create(&o, master, &od));
    CHECK_OK(pdp_dp_create(&dp, master, &dd));
    for (s = 0; s < 6; s++) {
        pdp_tensor x;
        int64_t batch = s == 0 ? 11 : 11 - s; /* the first step is the largest */
        data_batch(&dt, NET_CNN, s * 11, batch, &x);
        if (s == 1) before = __atomic_load_n(&test_allocs, __ATOMIC_RELAXED);
        CHECK_OK(pdp_dp_step(dp, o, &x, dt.y + s * 11, NULL));
    }
    ASSERT_EQ(before, __atomic_load_n(&test_allocs, __ATOMIC_RELAXED));
    pdp_dp_free(dp);
    pdp_optim_free(o);
    pdp_model_free(master);
    data_free(&dt);
    PASS();
}

/* Threads of this process, from /proc (Linux); -1 elsewhere. */
static int thread_count(void)
{
#ifdef _WIN32 /* Wine's /proc/self/status counts Wine's own threads too */
    FILE *f = NULL;
#else
    FILE *f = fopen("/proc/self/status", "r");
#endif
    char line[256];
    int n = -1;
    if (!f) return -1;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "Threads:", 8) == 0) n = atoi(line + 8);
    fclose(f);
    return n;
}

/* thread_count() once it reads `want`, or after a second: a joined thread has
   finished, but the kernel drops it from /proc a moment after pthread_join returns. */
static int thread_count_settled(int want)
{
    int k, n = thread_count();
    for (k = 0; k < 1000 && n != want; k++) {
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
        n = thread_count();
    }
    return n;
}

/* thread_count() once two reads 20 ms apart agree (at most a second): threads an earlier
   test joined may still be leaving /proc (slowly under qemu-user). */
static int thread_count_steady(void)
{
    int k, n = thread_count(), was = -2;
    for (k = 0; k < 50 && n != was; k++) {
        struct timespec ms = {0, 20000000};
        nanosleep(&ms, NULL);
        was = n;
        n = thread_count();
    }
    return n;
}

TEST dp_free_joins_every_worker(void)
{
    pdp_model *master = NULL;
    pdp_dp *dp = NULL;
    pdp_dp_desc dd;
    data dt;
    pdp_tensor x;
    int before = thread_count_steady(), during, i;
    if (before < 0) SKIPm("no /proc/self/status");
    memset(&dd, 0, sizeof dd);
    dd.num_workers = 4;
    data_make(&dt, NET_MLP, 6, 5);
    data_batch(&dt, NET_MLP, 0, 6, &x);
    CHECK_OK(make_net(NET_MLP, 2, &master));
    for (i = 0; i < 5; i++) {
        CHECK_OK(pdp_dp_create(&dp, master, &dd));
        during = thread_count_settled(before + 3);
        ASSERT_EQ(before + 3, during); /* workers 1..3; worker 0 is this thread */
        CHECK_OK(pdp_dp_forward_backward(dp, &x, dt.y, NULL));
        ASSERT_EQ(before + 3, thread_count()); /* a step creates no thread */
        pdp_dp_free(dp);
        ASSERT_EQ(before, thread_count_settled(before));
    }
    pdp_model_free(master);
    data_free(&dt);
    PASS();
}

/* ---- wrapped models (issue 21, item 10) ----
   The master is held by DataParallel: its replicas are clones of its layout. Adding a
   layer is refused naming the call and the executor, and so is a second executor (DDP,
   ZeRO, another DP) on it; the model is unchanged, so the next step still equals one
   device; after pdp_dp_free it is the caller's again. Before: pdp_model_add_linear
   returned PDP_OK, the next step failed ("the master model changed"), and DDP or ZeRO
   wrapped the master under DP's feet. pdp_model_set_precision stays allowed and now
   reaches the replicas (before, they kept the precision of pdp_dp_create: worker 0 ran
   bf16 and the others fp32). */

static bool has(const char *want)
{
    return strstr(pdp_last_error(), want) != NULL;
}

TEST dp_wrapped_master_refuses_layout_changes(void)
{
    pdp_model *ref = NULL, *master = NULL;
    pdp_optim *oref = NULL, *odp = NULL;
    pdp_dp *dp = NULL, *dp2 = NULL;
    pdp_ddp *ddp = NULL;
    pdp_zero *z = NULL;
    pdp_local_group *g = NULL;
    pdp_comm *c = NULL;
    pdp_dp_desc dd;
    pdp_optim_desc od;
    data dt;
    float lref = 0.0f, ldp = 0.0f;
    int64_t count;
    int layers;
    pdp_tensor x;
    memset(&dd, 0, sizeof dd);
    dd.num_workers = 3;
    memset(&od, 0, sizeof od);
    od.kind = PDP_OPTIM_SGD;
    od.lr = 0.1f;
    data_make(&dt, NET_MLP, 10, 5);
    CHECK_OK(make_net(NET_MLP, 42, &ref));
    CHECK_OK(make_net(NET_MLP, 42, &master));
    CHECK_OK(pdp_optim_create(&oref, ref, &od));
    CHECK_OK(pdp_optim_create(&odp, master, &od));
    CHECK_OK(pdp_dp_create(&dp, master, &dd));
    layers = pdp_model_num_layers(master);
    count = pdp_model_param_count(master);
    ASSERT_ENUM_EQ(PDP_ERR_STATE, pdp_model_add_linear(master, 5), pdp_status_name);
    ASSERT(has("pdp_model_add_linear: the model is wrapped by DataParallel (pdp_dp_create); "
               "add layers before wrapping it"));
    ASSERT_ENUM_EQ(PDP_ERR_STATE, pdp_model_add_dropout(master, 0.1f), pdp_status_name);
    ASSERT(has("pdp_model_add_dropout: the model is wrapped by DataParallel"));
    ASSERT_ENUM_EQ(PDP_ERR_STATE, pdp_dp_create(&dp2, master, &dd), pdp_status_name);
    ASSERT(has("pdp_dp_create: the model is already wrapped by DataParallel (pdp_dp_create)"));
    CHECK_OK(pdp_local_group_create(&g, 1, NULL));
    CHECK_OK(pdp_comm_create_local(&c, g, 0));
    ASSERT_ENUM_EQ(PDP_ERR_STATE, pdp_ddp_create(&ddp, master, c, NULL), pdp_status_name);
    ASSERT(has("pdp_ddp_create: the model is already wrapped by DataParallel (pdp_dp_create); "
               "one executor holds a model at a time: pdp_dp_free it before wrapping the model "
               "in DDP (pdp_ddp_create)"));
    ASSERT_ENUM_EQ(PDP_ERR_STATE, pdp_zero_create(&z, master, c, NULL), pdp_status_name);
    ASSERT(has("ZeRO stage 1 (pdp_zero_create)"));
    ASSERT(dp2 == NULL && ddp == NULL && z == NULL);
    ASSERT_EQ(layers, pdp_model_num_layers(master));
    ASSERT_EQ(count, pdp_model_param_count(master));
    data_batch(&dt, NET_MLP, 0, 10, &x);
    pdp_optim_zero_grad(oref);
    CHECK_OK(pdp_model_forward_backward(ref, &x, dt.y, &lref));
    CHECK_OK(pdp_optim_step(oref));
    CHECK_OK(pdp_dp_step(dp, odp, &x, dt.y, &ldp));
    ASSERT(rel_diff(ref, master, false) <= 1e-5);
    pdp_dp_free(dp);
    CHECK_OK(pdp_model_add_linear(master, 5)); /* the caller's again */
    ASSERT_EQ(count + 5 * 5 + 5, pdp_model_param_count(master));
    pdp_comm_free(c);
    pdp_local_group_free(g);
    pdp_optim_free(oref);
    pdp_optim_free(odp);
    pdp_model_free(ref);
    pdp_model_free(master);
    data_free(&dt);
    PASS();
}

/* bf16 set on the master after pdp_dp_create: DP equals one bf16 device (<= 1e-5), which
   is 1e-4 or more away from fp32 training (so a replica left in fp32 shows). */
TEST dp_set_precision_after_create_reaches_the_replicas(void)
{
    int copy;
    for (copy = 0; copy <= 1; copy++) {
        pdp_model *ref = NULL, *f32 = NULL, *master = NULL;
        pdp_optim *oref = NULL, *of32 = NULL, *odp = NULL;
        pdp_dp *dp = NULL;
        pdp_dp_desc dd;
        pdp_optim_desc od;
        data dt;
        float loss;
        int s;
        static char msg[160];
        double err, sens;
        memset(&dd, 0, sizeof dd);
        dd.num_workers = 3;
        dd.copy_params = copy != 0;
        memset(&od, 0, sizeof od);
        od.kind = PDP_OPTIM_ADAM;
        od.lr = 0.01f;
        data_make(&dt, NET_MLP, 12 * 3, 11);
        CHECK_OK(make_net(NET_MLP, 42, &ref));
        CHECK_OK(make_net(NET_MLP, 42, &f32));
        CHECK_OK(make_net(NET_MLP, 42, &master));
        CHECK_OK(pdp_model_set_precision(ref, PDP_PRECISION_BF16));
        CHECK_OK(pdp_optim_create(&oref, ref, &od));
        CHECK_OK(pdp_optim_create(&of32, f32, &od));
        CHECK_OK(pdp_optim_create(&odp, master, &od));
        CHECK_OK(pdp_dp_create(&dp, master, &dd));
        CHECK_OK(pdp_model_set_precision(master, PDP_PRECISION_BF16));
        for (s = 0; s < 3; s++) {
            pdp_tensor x;
            data_batch(&dt, NET_MLP, s * 12, 12, &x);
            pdp_optim_zero_grad(oref);
            CHECK_OK(pdp_model_forward_backward(ref, &x, dt.y + s * 12, &loss));
            CHECK_OK(pdp_optim_step(oref));
            pdp_optim_zero_grad(of32);
            CHECK_OK(pdp_model_forward_backward(f32, &x, dt.y + s * 12, &loss));
            CHECK_OK(pdp_optim_step(of32));
            CHECK_OK(pdp_dp_step(dp, odp, &x, dt.y + s * 12, &loss));
        }
        err = rel_diff(ref, master, false);
        sens = rel_diff(ref, f32, false);
        snprintf(msg, sizeof msg, "copy_params %d: |dp - bf16 device| %.3g, |fp32 - bf16| %.3g",
                 copy, err, sens);
        ASSERTm(msg, err <= 1e-5 && sens >= 1e-4);
        pdp_dp_free(dp);
        pdp_optim_free(oref);
        pdp_optim_free(of32);
        pdp_optim_free(odp);
        pdp_model_free(ref);
        pdp_model_free(f32);
        pdp_model_free(master);
        data_free(&dt);
    }
    PASS();
}

SUITE(dp)
{
    RUN_TEST(dp_matches_single_device_mlp_sgd);
    RUN_TEST(dp_matches_single_device_mlp_adam);
    RUN_TEST(dp_matches_single_device_mlp_dropout_sgd);
    RUN_TEST(dp_matches_single_device_mlp_dropout_adam);
    RUN_TEST(dp_matches_single_device_cnn_sgd);
    RUN_TEST(dp_matches_single_device_cnn_adam);
    RUN_TEST(dp_matches_single_device_mlp_adamw_decay_groups);
    RUN_TEST(dp_dropout_reference_is_sensitive);
    RUN_TEST(dp_forward_backward_gathers_outputs_and_sums_gradients);
    RUN_TEST(dp_own_loss_trains_the_master_alone);
    RUN_TEST(dp_reduce_and_replicate_modes_are_bit_identical);
    RUN_TEST(dp_more_workers_than_samples_idle_and_stay_correct);
    RUN_TEST(dp_stats_count_bytes_and_master_memory);
    RUN_TEST(dp_error_in_one_worker_names_it_and_recovers);
    RUN_TEST(dp_nan_in_one_shard_names_its_worker);
    RUN_TEST(dp_bad_arguments_are_reported);
    RUN_TEST(dp_allocates_nothing_after_the_first_step);
    RUN_TEST(dp_free_joins_every_worker);
    RUN_TEST(dp_wrapped_master_refuses_layout_changes);
    RUN_TEST(dp_set_precision_after_create_reaches_the_replicas);
}

GREATEST_MAIN_DEFS();

int main(int argc, char **argv)
{
    GREATEST_MAIN_BEGIN();
    RUN_SUITE(dp);
    GREATEST_MAIN_END();
}
