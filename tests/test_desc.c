/* test_desc: every desc's defaults, queried through its get_desc (sokol's _def pattern).

   For each public desc with an object to ask (model, optim, batcher, comm, dp, ddp,
   zero, pp): a zero desc's get_desc returns the defaults its header documents, and a
   field given non-zero comes back as given. The expected numbers are the header
   comments' own, copied into the constants below (DOC_*); a change of a default must
   change the header, this list and the code together. */

#define _POSIX_C_SOURCE 200809L /* before the first system header (see pdp.h) */
#define PDP_IMPLEMENTATION
#include "pdp.h"
#include "pdp_test.h"
#include "test_platform.h"

/* The defaults as the headers in src/ write them, in the comment on each field. */
#define DOC_OPTIM_LR_SGD 0.01        /* optim.h: lr, SGD */
#define DOC_OPTIM_LR_ADAM 0.001      /* optim.h: lr, Adam and AdamW */
#define DOC_OPTIM_BETA1 0.9
#define DOC_OPTIM_BETA2 0.999
#define DOC_OPTIM_EPS 1e-8
#define DOC_OPTIM_DECAY_PARAMS PDP_DECAY_ALL
#define DOC_BATCHER_BATCH_SIZE 64    /* data.h */
#define DOC_COMM_TIMEOUT_S 300.0     /* comm.h */
#define DOC_COMM_NAME "comm"
#define DOC_DP_THREADS_PER_WORKER 1  /* dp.h; num_workers: one per online core */
#define DOC_BUCKET_CAP_MB 25.0       /* ddp.h and zero.h */
#define DOC_FIRST_BUCKET_MB(cap) ((cap) < 1.0 ? (cap) : 1.0) /* min(1, bucket_cap_mb) */
#define DOC_ZERO_STAGE 1             /* zero.h */
#define DOC_ZERO_GRAD_BUFFERS(units) ((units) < 2 ? (units) : 2) /* min(2, U) */
#define DOC_ZERO_PARAM_BUFFERS 2
#define DOC_PP_BALANCE_BATCH 32      /* pp.h; micro_batches: the number of stages */

#define CHECK_OK(call)                                                                            \
    do {                                                                                          \
        pdp_status st_ = (call);                                                                  \
        if (st_ != PDP_OK) FAILm(pdp_last_error());                                               \
    } while (0)

/* A small MLP on 12 features: Linear 300, ReLU, Linear 300, ReLU, Linear 10 (every
   Linear above 1 KiB of parameters, so a 1 KiB bucket cap gives one unit per Linear). */
static pdp_status make_mlp(pdp_model **out)
{
    pdp_model_desc md;
    pdp_status st;
    memset(&md, 0, sizeof md);
    md.input_shape[0] = 12;
    if ((st = pdp_model_create(out, &md)) != PDP_OK) return st;
    if ((st = pdp_model_add_linear(*out, 300)) != PDP_OK ||
        (st = pdp_model_add_relu(*out)) != PDP_OK ||
        (st = pdp_model_add_linear(*out, 300)) != PDP_OK ||
        (st = pdp_model_add_relu(*out)) != PDP_OK ||
        (st = pdp_model_add_linear(*out, 10)) != PDP_OK) {
        pdp_model_free(*out);
        *out = NULL;
    }
    return st;
}

/* A one-rank communicator (and its group) for the executors. */
static pdp_status make_comm(const pdp_comm_desc *cd, pdp_local_group **g, pdp_comm **c)
{
    pdp_status st = pdp_local_group_create(g, 1, cd);
    if (st != PDP_OK) return st;
    if ((st = pdp_comm_create_local(c, *g, 0)) != PDP_OK) pdp_local_group_free(*g);
    return st;
}

TEST desc_model_defaults_and_kept(void)
{
    pdp_model_desc md, got;
    pdp_model *m = NULL;
    memset(&md, 0, sizeof md);
    md.input_shape[0] = 1;
    md.input_shape[1] = 5;
    md.input_shape[2] = 6;
    CHECK_OK(pdp_model_create(&m, &md));
    got = pdp_model_get_desc(m);
    ASSERT_EQ(3, got.input_ndim); /* 0: the count of nonzero input_shape entries */
    ASSERT_EQ(5, got.input_shape[1]);
    ASSERT_EQ(6, got.input_shape[2]);
    ASSERT_EQ(0, got.seed);
    ASSERT_EQ(PDP_DEVICE_CPU, got.device.kind);
    ASSERT_EQ(PDP_PRECISION_FP32, got.precision);
    pdp_model_free(m);
    md.input_ndim = 1;
    md.input_shape[0] = 7;
    md.seed = 42;
    md.precision = PDP_PRECISION_BF16;
    CHECK_OK(pdp_model_create(&m, &md));
    got = pdp_model_get_desc(m);
    ASSERT_EQ(1, got.input_ndim);
    ASSERT_EQ(7, got.input_shape[0]);
    ASSERT_EQ(0, got.input_shape[1]); /* unused entries read 0 */
    ASSERT_EQ(42, got.seed);
    ASSERT_EQ(PDP_PRECISION_BF16, got.precision);
    pdp_model_free(m);
    got = pdp_model_get_desc(NULL);
    ASSERT_EQ(0, got.input_ndim);
    PASS();
}

TEST desc_optim_defaults_and_kept(void)
{
    pdp_model *m = NULL;
    pdp_optim *o = NULL;
    pdp_optim_desc od, got;
    CHECK_OK(make_mlp(&m));
    memset(&od, 0, sizeof od);
    CHECK_OK(pdp_optim_create(&o, m, &od));
    got = pdp_optim_get_desc(o);
    ASSERT_EQ(PDP_OPTIM_SGD, got.kind);
    ASSERT_EQ(DOC_OPTIM_LR_SGD, got.lr);
    ASSERT_EQ(0.0, got.momentum);
    ASSERT_EQ(0.0, got.weight_decay);
    ASSERT_EQ(DOC_OPTIM_DECAY_PARAMS, got.decay_params);
    pdp_optim_free(o);
    od.kind = PDP_OPTIM_ADAM;
    CHECK_OK(pdp_optim_create(&o, m, &od));
    got = pdp_optim_get_desc(o);
    ASSERT_EQ(DOC_OPTIM_LR_ADAM, got.lr);
    ASSERT_EQ(DOC_OPTIM_BETA1, got.beta1);
    ASSERT_EQ(DOC_OPTIM_BETA2, got.beta2);
    ASSERT_EQ(DOC_OPTIM_EPS, got.eps);
    pdp_optim_free(o);
    od.lr = 0.25;
    od.beta2 = 0.5;
    od.decay_params = PDP_DECAY_MATRICES;
    CHECK_OK(pdp_optim_create(&o, m, &od));
    got = pdp_optim_get_desc(o);
    ASSERT_EQ(0.25, got.lr);
    ASSERT_EQ(0.5, got.beta2);
    ASSERT_EQ(PDP_DECAY_MATRICES, got.decay_params);
    ASSERT_EQ(DOC_OPTIM_BETA1, got.beta1);
    pdp_optim_free(o);
    pdp_model_free(m);
    PASS();
}

TEST desc_batcher_defaults_and_kept(void)
{
    pdp_dataset *ds = NULL;
    pdp_dataset_desc dd;
    pdp_batcher *b = NULL;
    pdp_batcher_desc bd, got;
    int64_t pick[3] = {4, 1, 4}, i;
    memset(&dd, 0, sizeof dd);
    dd.max_samples = 100;
    CHECK_OK(pdp_dataset_synthetic(&ds, true, &dd));
    CHECK_OK(pdp_batcher_create(&b, ds, NULL));
    got = pdp_batcher_get_desc(b);
    ASSERT_EQ(DOC_BATCHER_BATCH_SIZE, got.batch_size);
    ASSERT(!got.shuffle && !got.drop_last);
    ASSERT_EQ(ds->count, got.num_indices); /* NULL indices: all, in order */
    for (i = 0; i < got.num_indices; i++) ASSERT_EQ(i, got.indices[i]);
    pdp_batcher_free(b);
    memset(&bd, 0, sizeof bd);
    bd.batch_size = 10;
    bd.shuffle = true;
    bd.seed = 9;
    bd.indices = pick;
    bd.num_indices = 3;
    CHECK_OK(pdp_batcher_create(&b, ds, &bd));
    pick[0] = 0; /* the batcher keeps its own copy */
    got = pdp_batcher_get_desc(b);
    ASSERT_EQ(10, got.batch_size);
    ASSERT(got.shuffle);
    ASSERT_EQ(9, got.seed);
    ASSERT_EQ(3, got.num_indices);
    ASSERT_EQ(4, got.indices[0]);
    ASSERT_EQ(4, got.indices[2]);
    pdp_batcher_free(b);
    pdp_dataset_free(ds);
    PASS();
}

TEST desc_comm_defaults_and_kept(void)
{
    pdp_local_group *g = NULL;
    pdp_comm *c = NULL;
    pdp_comm_desc cd, got;
    CHECK_OK(make_comm(NULL, &g, &c));
    got = pdp_comm_get_desc(c);
    ASSERT_EQ(PDP_BACKEND_LOCAL, got.backend); /* the default backend, named */
    ASSERT_EQ(DOC_COMM_TIMEOUT_S, got.timeout_s);
    ASSERT_EQ(PDP_DEVICE_CPU, got.device.kind);
    ASSERT_STR_EQ(DOC_COMM_NAME, got.name);
    pdp_comm_free(c);
    pdp_local_group_free(g);
    memset(&cd, 0, sizeof cd);
    cd.timeout_s = 12.5;
    cd.name = "grid";
    CHECK_OK(make_comm(&cd, &g, &c));
    got = pdp_comm_get_desc(c);
    ASSERT_EQ(12.5, got.timeout_s);
    ASSERT_STR_EQ("grid", got.name);
    pdp_comm_free(c);
    pdp_local_group_free(g);
    PASS();
}

TEST desc_dp_defaults_and_kept(void)
{
    pdp_model *m = NULL;
    pdp_dp *dp = NULL;
    pdp_dp_desc dd, got;
    pdp_device devs[2];
    long cores = test_cpu_count();
    CHECK_OK(make_mlp(&m));
    CHECK_OK(pdp_dp_create(&dp, m, NULL));
    got = pdp_dp_get_desc(dp);
    ASSERT_EQ(cores > 0 ? (int)(cores < PDP_DP_MAX_WORKERS ? cores : PDP_DP_MAX_WORKERS) : 1,
              got.num_workers); /* 0: one per online core */
    ASSERT_EQ(DOC_DP_THREADS_PER_WORKER, got.threads_per_worker);
    ASSERT(got.devices == NULL && !got.copy_params && !got.reduce_on_master);
    pdp_dp_free(dp);
    memset(&dd, 0, sizeof dd);
    devs[0] = pdp_cpu();
    devs[1] = pdp_cpu();
    dd.num_workers = 2;
    dd.devices = devs;
    dd.threads_per_worker = 3;
    dd.reduce_on_master = true;
    CHECK_OK(pdp_dp_create(&dp, m, &dd));
    got = pdp_dp_get_desc(dp);
    ASSERT_EQ(2, got.num_workers);
    ASSERT_EQ(3, got.threads_per_worker);
    ASSERT(got.reduce_on_master);
    ASSERT(got.devices != NULL && got.devices != devs); /* dp's own copy */
    ASSERT_EQ(PDP_DEVICE_CPU, got.devices[1].kind);
    pdp_dp_free(dp);
    pdp_model_free(m);
    PASS();
}

TEST desc_ddp_defaults_and_kept(void)
{
    pdp_model *m = NULL;
    pdp_local_group *g = NULL;
    pdp_comm *c = NULL;
    pdp_ddp *d = NULL;
    pdp_ddp_desc dd, got;
    CHECK_OK(make_mlp(&m));
    CHECK_OK(make_comm(NULL, &g, &c));
    memset(&dd, 0, sizeof dd);
    CHECK_OK(pdp_ddp_create(&d, m, c, &dd));
    got = pdp_ddp_get_desc(d);
    ASSERT_EQ(DOC_BUCKET_CAP_MB, got.bucket_cap_mb);
    ASSERT_EQ(DOC_FIRST_BUCKET_MB(DOC_BUCKET_CAP_MB), got.first_bucket_mb);
    ASSERT_EQ(PDP_BATCH_MEAN_RANKS, got.batch_mean);
    pdp_ddp_free(d);
    dd.bucket_cap_mb = 0.5; /* first_bucket_mb follows it: min(1, 0.5) */
    dd.batch_mean = PDP_BATCH_MEAN_GLOBAL;
    CHECK_OK(pdp_ddp_create(&d, m, c, &dd));
    got = pdp_ddp_get_desc(d);
    ASSERT_EQ(0.5, got.bucket_cap_mb);
    ASSERT_EQ(DOC_FIRST_BUCKET_MB(0.5), got.first_bucket_mb);
    ASSERT_EQ(PDP_BATCH_MEAN_GLOBAL, got.batch_mean);
    pdp_ddp_free(d);
    dd.bucket_cap_mb = -1.0; /* the shared bucket rule still runs */
    ASSERT_EQ(PDP_ERR_INVALID, pdp_ddp_create(&d, m, c, &dd));
    ASSERT(strstr(pdp_last_error(), "pdp_ddp_create: bucket_cap_mb -1") != NULL);
    pdp_comm_free(c);
    pdp_local_group_free(g);
    pdp_model_free(m);
    PASS();
}

TEST desc_zero_defaults_and_kept(void)
{
    pdp_model *m = NULL;
    pdp_local_group *g = NULL;
    pdp_comm *c = NULL;
    pdp_zero *z = NULL;
    pdp_zero_desc zd, got;
    const double kib = 1.0 / 1024.0; /* MiB: one unit per Linear of make_mlp */
    CHECK_OK(make_mlp(&m));
    CHECK_OK(make_comm(NULL, &g, &c));
    CHECK_OK(pdp_zero_create(&z, m, c, NULL));
    got = pdp_zero_get_desc(z);
    ASSERT_EQ(DOC_ZERO_STAGE, got.stage);
    ASSERT_EQ(DOC_BUCKET_CAP_MB, got.bucket_cap_mb);
    ASSERT_EQ(DOC_FIRST_BUCKET_MB(DOC_BUCKET_CAP_MB), got.first_bucket_mb);
    ASSERT_EQ(0, got.grad_buffers); /* stage 1 has none */
    ASSERT_EQ(0, got.param_buffers);
    ASSERT(!got.no_prefetch);
    ASSERT_EQ(PDP_BATCH_MEAN_RANKS, got.batch_mean);
    pdp_zero_free(z);
    memset(&zd, 0, sizeof zd);
    zd.stage = 2; /* the whole model is one unit (under 1 MiB): min(2, 1) buffers */
    CHECK_OK(pdp_zero_create(&z, m, c, &zd));
    got = pdp_zero_get_desc(z);
    ASSERT_EQ(DOC_ZERO_GRAD_BUFFERS(1), got.grad_buffers);
    pdp_zero_free(z);
    zd.stage = 3; /* three units: min(2, 3) gradient buffers, 2 parameter buffers */
    zd.bucket_cap_mb = kib;
    zd.first_bucket_mb = kib;
    CHECK_OK(pdp_zero_create(&z, m, c, &zd));
    got = pdp_zero_get_desc(z);
    ASSERT_EQ(3, got.stage);
    ASSERT_EQ(kib, got.bucket_cap_mb);
    ASSERT_EQ(DOC_ZERO_GRAD_BUFFERS(3), got.grad_buffers);
    ASSERT_EQ(DOC_ZERO_PARAM_BUFFERS, got.param_buffers);
    pdp_zero_free(z);
    zd.param_buffers = 3;
    zd.no_prefetch = true;
    CHECK_OK(pdp_zero_create(&z, m, c, &zd));
    got = pdp_zero_get_desc(z);
    ASSERT_EQ(3, got.param_buffers);
    ASSERT(got.no_prefetch);
    pdp_zero_free(z);
    pdp_comm_free(c);
    pdp_local_group_free(g);
    pdp_model_free(m);
    PASS();
}

TEST desc_pp_defaults_and_kept(void)
{
    pdp_model *m = NULL;
    pdp_local_group *g = NULL;
    pdp_comm *c = NULL;
    pdp_pp *pp = NULL;
    pdp_pp_desc pd, got;
    CHECK_OK(make_mlp(&m));
    CHECK_OK(make_comm(NULL, &g, &c));
    CHECK_OK(pdp_pp_create(&pp, m, c, NULL));
    got = pdp_pp_get_desc(pp);
    ASSERT_EQ(PDP_PP_1F1B, got.schedule);
    ASSERT_EQ(1, got.micro_batches); /* the number of stages */
    ASSERT_EQ(PDP_PP_BALANCE_PARAMS, got.balance);
    ASSERT_EQ(DOC_PP_BALANCE_BATCH, got.balance_batch);
    ASSERT(got.first_layer != NULL);
    ASSERT_EQ(0, got.first_layer[0]);
    ASSERT_EQ(5, got.first_layer[1]); /* stages + 1 entries, the last the layer count */
    ASSERT(got.loss == NULL && got.dp == NULL);
    pdp_pp_free(pp);
    memset(&pd, 0, sizeof pd);
    pd.schedule = PDP_PP_GPIPE;
    pd.micro_batches = 4;
    pd.balance_batch = 8;
    CHECK_OK(pdp_pp_create(&pp, m, c, &pd));
    got = pdp_pp_get_desc(pp);
    ASSERT_EQ(PDP_PP_GPIPE, got.schedule);
    ASSERT_EQ(4, got.micro_batches);
    ASSERT_EQ(8, got.balance_batch);
    pdp_pp_free(pp);
    pdp_comm_free(c);
    pdp_local_group_free(g);
    pdp_model_free(m);
    PASS();
}

TEST desc_get_desc_of_null_is_zero(void)
{
    pdp_ddp_desc d = pdp_ddp_get_desc(NULL);
    pdp_zero_desc z = pdp_zero_get_desc(NULL);
    pdp_dp_desc p = pdp_dp_get_desc(NULL);
    pdp_pp_desc q = pdp_pp_get_desc(NULL);
    pdp_comm_desc c = pdp_comm_get_desc(NULL);
    pdp_batcher_desc b = pdp_batcher_get_desc(NULL);
    ASSERT(d.bucket_cap_mb == 0.0 && z.stage == 0 && p.num_workers == 0 &&
           q.micro_batches == 0 && c.name == NULL && b.batch_size == 0);
    PASS();
}

SUITE(desc)
{
    RUN_TEST(desc_model_defaults_and_kept);
    RUN_TEST(desc_optim_defaults_and_kept);
    RUN_TEST(desc_batcher_defaults_and_kept);
    RUN_TEST(desc_comm_defaults_and_kept);
    RUN_TEST(desc_dp_defaults_and_kept);
    RUN_TEST(desc_ddp_defaults_and_kept);
    RUN_TEST(desc_zero_defaults_and_kept);
    RUN_TEST(desc_pp_defaults_and_kept);
    RUN_TEST(desc_get_desc_of_null_is_zero);
}

GREATEST_MAIN_DEFS();

int main(int argc, char **argv)
{
    GREATEST_MAIN_BEGIN();
    RUN_SUITE(desc);
    pdp_shutdown_threads();
    GREATEST_MAIN_END();
}
