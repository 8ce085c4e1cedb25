/* test_ddp.c - DistributedDataParallel on the local backend, and the DistributedSampler.

   Equivalence: N rank threads, each with its own model (ranks > 0 start from a
   different seed, so rank 0's broadcast is tested too), each training on its
   slice of the same global batches, must end with the parameters of one model
   trained on the whole global batches (<= 1e-5 relative), and all ranks with
   the same bits. Swept over world sizes 1-4, bucket caps from one parameter per
   bucket to one bucket, and with no_sync gradient accumulation. Faults: a
   parameter mismatch fails on every rank naming the parameter; a rank that
   never arrives makes the others time out naming the bucket and the rank; a
   rank that dies mid-backward makes the others fail at once; a rank that fails
   alone creating DDP, ZeRO or a pipeline (a bad desc, no memory) makes the other
   fail at once, naming it. The hot loop
   allocates nothing (PDP_MALLOC counts). The reducer seam: a reducer with its
   own collective and after-step hook (as ZeRO will have) launches every bucket
   once per synchronised backward, in bucket order, and runs the hook once per
   step. Communication hooks: the bf16 and fp16 compression hooks give gradients
   within the rounding bound stated in ddp.h (derived at check_compress_hook) of
   fp32 DDP on 2 and 3 ranks, send exactly half the bytes (2 ranks), and train to
   the fp32 loss within 0.01 over 300 steps; a user hook (SUM, then / N in finish)
   gives the AVG bits; registration and hook failures name the bucket. Uneven
   shards (5, 3, 2 samples on 3 ranks): the default trains the mean of per-rank
   means, batch_mean PDP_BATCH_MEAN_GLOBAL the global batch's, each equal to its
   single-device reference with accumulation and an own loss, one float's
   all-reduce more per backward; misuse of it refused. A GPT's tied wte (the head uses
   it first in backward, the embedding last): its gradient reports once per backward,
   after the embedding's backward began, and its bucket launches once, then, with both
   contributions in it. Run under TSan by `make tsan`. */

#define _POSIX_C_SOURCE 200809L /* this file includes system headers before pdp.h */
#include <stdlib.h>
#include <stdatomic.h>
static atomic_long test_allocs;
static __thread int test_out_of_memory; /* this thread's allocations fail while it is set */
static void *test_malloc(size_t n)
{
    if (test_out_of_memory) return NULL;
    atomic_fetch_add(&test_allocs, 1);
    return malloc(n);
}
#define PDP_MALLOC(n) test_malloc(n)
#define PDP_FREE(p) free(p)
#define PDP_IMPLEMENTATION
#include "pdp.h"
#include "pdp_test.h"
#include <pthread.h>

#define MAXR 4
#undef IN /* <windows.h> defines it */
#define IN 20
#define CLASSES 3
#define B 12 /* global batch: divisible by 1, 2, 3 and 4 */
#define STEPS 3

/* ---- helpers ---- */

static pdp_status build_model(pdp_model **out, uint64_t seed, int variant)
{
    pdp_model_desc md;
    pdp_model *m = NULL;
    pdp_status st;
    memset(&md, 0, sizeof md);
    md.input_shape[0] = IN;
    md.seed = seed;
    *out = NULL;
    if ((st = pdp_model_create(&m, &md)) != PDP_OK) return st;
    if ((st = pdp_model_add_linear(m, 16)) || (st = pdp_model_add_relu(m)) ||
        (st = pdp_model_add_linear(m, variant == 1 ? 11 : 12)) || (st = pdp_model_add_tanh(m)) ||
        (st = pdp_model_add_linear(m, CLASSES))) {
        pdp_model_free(m);
        return st;
    }
    *out = m;
    return PDP_OK;
}

/* Global micro-batch `mb`: B samples, deterministic. */
static void make_batch(int mb, float *x, int32_t *y)
{
    int i, f;
    for (i = 0; i < B; i++) {
        for (f = 0; f < IN; f++) {
            uint32_t h = (uint32_t)((mb * 131 + i) * 2654435761u) ^ (uint32_t)(f * 40503u);
            h ^= h >> 15;
            h *= 0x2c1b3c6du;
            h ^= h >> 12;
            x[i * IN + f] = (float)(h & 0xffff) / 65536.0f * 2.0f - 1.0f;
        }
        y[i] = (int32_t)((i * 7 + mb) % CLASSES);
    }
}

static pdp_optim_desc sgd(void)
{
    pdp_optim_desc od;
    memset(&od, 0, sizeof od);
    od.kind = PDP_OPTIM_SGD;
    od.lr = 0.1f;
    od.momentum = 0.9f;
    return od;
}

/* A pass with an own loss (kind 1: pdp_loss_mse against one-hot targets, through
   pdp_model_forward and pdp_model_backward, the loop issue 13 tried; kind 2: a
   log-cosh loss written here, through pdp_ddp_forward and pdp_ddp_backward), the
   mean over the batch passed in. d NULL: single device on m. */
static pdp_status own_loss_pass(int kind, pdp_model *m, pdp_ddp *d, const pdp_tensor *x,
                                const int32_t *labels, float *loss)
{
    float target[B * CLASSES], grad[B * CLASSES];
    const pdp_tensor *y = NULL;
    pdp_tensor tt, dy;
    int64_t n, i, j;
    double sum = 0.0;
    pdp_status st;
    st = kind == 2 && d ? pdp_ddp_forward(d, x, &y) : pdp_model_forward(m, x, &y);
    if (st) return st;
    n = y->shape[0];
    for (i = 0; i < n; i++)
        for (j = 0; j < CLASSES; j++) target[i * CLASSES + j] = labels[i] == j ? 1.0f : 0.0f;
    pdp_tensor_wrap(target, pdp_cpu(), 2, y->shape, &tt);
    pdp_tensor_wrap(grad, pdp_cpu(), 2, y->shape, &dy);
    if (kind == 1) {
        if ((st = pdp_loss_mse(y, &tt, loss, &dy))) return st;
        return pdp_model_backward(m, &dy);
    }
    for (i = 0; i < n * CLASSES; i++) { /* log cosh(y - t), mean over samples */
        double e = (double)y->data[i] - target[i];
        sum += log(cosh(e));
        grad[i] = (float)(tanh(e) / (double)n);
    }
    *loss = (float)(sum / (double)n);
    return d ? pdp_ddp_backward(d, &dy) : pdp_model_backward(m, &dy);
}

/* One device on the whole global batches: the reference. accum micro-batches
   per step, gradients accumulated (as PyTorch's repeated backward). loss_kind 0:
   cross-entropy; 1, 2: own_loss_pass. */
static pdp_status train_single_loss(int accum, int loss_kind, float *params_out, int64_t *count)
{
    pdp_model *m = NULL;
    pdp_optim *o = NULL;
    pdp_optim_desc od = sgd();
    float x[B * IN], loss;
    int32_t y[B];
    int64_t shape[2] = {B, IN};
    pdp_tensor xt;
    pdp_status st;
    int s, a;
    if ((st = build_model(&m, 1, 0)) || (st = pdp_optim_create(&o, m, &od))) goto out;
    pdp_tensor_wrap(x, pdp_cpu(), 2, shape, &xt);
    for (s = 0; s < STEPS; s++) {
        for (a = 0; a < accum; a++) {
            make_batch(s * accum + a, x, y);
            if (loss_kind) st = own_loss_pass(loss_kind, m, NULL, &xt, y, &loss);
            else st = pdp_model_forward_backward(m, &xt, y, &loss);
            if (st) goto out;
        }
        if ((st = pdp_optim_step(o))) goto out;
        pdp_model_zero_grad(m);
    }
    memcpy(params_out, m->param_block, (size_t)m->param_count * sizeof(float));
    *count = m->param_count;
out:
    pdp_optim_free(o);
    pdp_model_free(m);
    return st;
}

static pdp_status train_single(int accum, float *params_out, int64_t *count)
{
    return train_single_loss(accum, 0, params_out, count);
}

/* ---- rank threads ---- */

typedef struct rank_ctx {
    pdp_local_group *g;
    int rank, size;
    double cap_mb;
    int accum;
    int scenario;            /* 0 train, 1 param mismatch on rank 1, 2 rank 2 absent, 3 rank 1
                                dies mid-backward, 4 state errors, 5 a second own-loss
                                backward before the step */
    int loss_kind;           /* 0 cross-entropy, 1 and 2 own losses (own_loss_pass) */
    pdp_status st;
    char msg[1024];
    float params[2048];
    int64_t count;
    double elapsed;
    long allocs_after_first;
    pdp_ddp_stats stats;
    int nbuckets;
} rank_ctx;

static pthread_mutex_t absent_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t absent_cv = PTHREAD_COND_INITIALIZER;
static int absent_done;

static void finished_one(void)
{
    pthread_mutex_lock(&absent_mu);
    absent_done++;
    pthread_cond_broadcast(&absent_cv);
    pthread_mutex_unlock(&absent_mu);
}

static pdp_status fail(rank_ctx *ctx, pdp_status st)
{
    if (st != PDP_OK && ctx->st == PDP_OK) {
        ctx->st = st;
        snprintf(ctx->msg, sizeof ctx->msg, "%s", pdp_last_error());
    }
    return st;
}

static void *rank_main(void *arg)
{
    rank_ctx *ctx = (rank_ctx *)arg;
    pdp_comm *c = NULL;
    pdp_model *m = NULL;
    pdp_optim *o = NULL;
    pdp_ddp *d = NULL;
    pdp_ddp_desc dd;
    pdp_optim_desc od = sgd();
    int n = ctx->size, r = ctx->rank, local = B / ctx->size, s, a;
    float x[B * IN], loss;
    int32_t y[B];
    int64_t shape[2];
    pdp_tensor xt;
    double t0 = pdp__now();
    memset(&dd, 0, sizeof dd);
    dd.bucket_cap_mb = ctx->cap_mb;
    dd.first_bucket_mb = ctx->cap_mb;
    shape[0] = local;
    shape[1] = IN;
    if (fail(ctx, pdp_comm_create_local(&c, ctx->g, r))) return NULL;
    if (fail(ctx, build_model(&m, r == 0 ? 1 : 50 + (uint64_t)r,
                              ctx->scenario == 1 && r == 1 ? 1 : 0)) ||
        fail(ctx, pdp_optim_create(&o, m, &od)))
        goto out;
    t0 = pdp__now();
    if (fail(ctx, pdp_ddp_create(&d, m, c, &dd))) goto out;
    ctx->nbuckets = pdp_ddp_num_buckets(d);
    if (ctx->scenario == 2 && r == n - 1) { /* never arrives at the first bucket */
        pthread_mutex_lock(&absent_mu);
        while (absent_done < n - 1) pthread_cond_wait(&absent_cv, &absent_mu);
        pthread_mutex_unlock(&absent_mu);
        goto out;
    }
    if (ctx->scenario == 3 && r == 1) { /* backward reaches the last layer only, then dies */
        const pdp_tensor *out;
        make_batch(0, x, y);
        pdp_tensor_wrap(x + r * local * IN, pdp_cpu(), 2, shape, &xt);
        pdp_model_forward(m, &xt, &out);
        pdp__reducer_arm(&d->r);
        pdp__reducer_hook(&d->r, m, m->nparams - 1);
        pdp__reducer_hook(&d->r, m, m->nparams - 2);
        d->r.state = PDP__RED_REDUCING; /* as pdp_ddp_forward_backward leaves a failed pass */
        d->r.failed = true;
        d->r.armed = false;
        fail(ctx, pdp_ddp_step(d, o)); /* waits for the two buckets, then refuses */
        goto out; /* frees the DDP and the communicator: the others fail at once */
    }
    pdp_tensor_wrap(x + r * local * IN, pdp_cpu(), 2, shape, &xt);
    for (s = 0; s < STEPS; s++) {
        if (s == 1) ctx->allocs_after_first = atomic_load(&test_allocs);
        for (a = 0; a < ctx->accum; a++) {
            make_batch(s * ctx->accum + a, x, y);
            pdp_ddp_set_no_sync(d, a < ctx->accum - 1);
            if (ctx->loss_kind) {
                if (fail(ctx, own_loss_pass(ctx->loss_kind, m, d, &xt, y + r * local, &loss)))
                    goto out;
            } else if (fail(ctx, pdp_ddp_forward_backward(d, &xt, y + r * local, &loss))) {
                goto out;
            }
            if (ctx->scenario == 5 && a == ctx->accum - 1) { /* no step in between: refused */
                pdp_status st2 = own_loss_pass(ctx->loss_kind, m, d, &xt, y + r * local, &loss);
                if (st2 != PDP_ERR_STATE || !strstr(pdp_last_error(), "still being reduced") ||
                    !strstr(pdp_last_error(), "call pdp_ddp_step or pdp_ddp_finish first"))
                    fail(ctx, PDP_ERR_INVALID);
            }
            if (ctx->scenario == 4 && a == ctx->accum - 1) {
                pdp_status st2 = pdp_ddp_forward_backward(d, &xt, y + r * local, &loss);
                if (st2 != PDP_ERR_STATE || !strstr(pdp_last_error(), "still being reduced"))
                    fail(ctx, PDP_ERR_INVALID);
            }
            if (ctx->scenario == 4 && a < ctx->accum - 1) {
                pdp_status st2 = pdp_ddp_finish(d);
                if (st2 != PDP_ERR_STATE || !strstr(pdp_last_error(), "no_sync"))
                    fail(ctx, PDP_ERR_INVALID);
            }
        }
        if (fail(ctx, pdp_ddp_step(d, o))) goto out;
    }
    ctx->allocs_after_first = atomic_load(&test_allocs) - ctx->allocs_after_first;
    memcpy(ctx->params, m->param_block, (size_t)m->param_count * sizeof(float));
    ctx->count = m->param_count;
    pdp_ddp_get_stats(d, &ctx->stats);
out:
    ctx->elapsed = pdp__now() - t0;
    if (ctx->scenario == 2 && !(r == n - 1)) finished_one();
    pdp_ddp_free(d);
    pdp_optim_free(o);
    pdp_model_free(m);
    pdp_comm_free(c);
    return NULL;
}

static void run_ranks(int n, double timeout_s, rank_ctx *ctx)
{
    pthread_t t[MAXR];
    pdp_local_group *g = NULL;
    pdp_comm_desc cd;
    int r;
    memset(&cd, 0, sizeof cd);
    cd.timeout_s = timeout_s;
    cd.name = "ddp";
    pdp_local_group_create(&g, n, &cd);
    for (r = 0; r < n; r++) {
        ctx[r].g = g;
        ctx[r].rank = r;
        ctx[r].size = n;
        pthread_create(&t[r], NULL, rank_main, &ctx[r]);
    }
    for (r = 0; r < n; r++) pthread_join(t[r], NULL);
    pdp_local_group_free(g);
}

/* ---- equivalence ---- */

static enum greatest_test_res check_equivalence_loss(int n, double cap_mb, int accum,
                                                     int loss_kind, int scenario)
{
    static rank_ctx ctx[MAXR];
    static float ref[2048];
    int64_t count = 0, i;
    int r;
    double worst = 0.0, scale = 0.0;
    ASSERT_ENUM_EQ(PDP_OK, train_single_loss(accum, loss_kind, ref, &count), pdp_status_name);
    memset(ctx, 0, sizeof ctx);
    for (r = 0; r < n; r++) {
        ctx[r].cap_mb = cap_mb;
        ctx[r].accum = accum;
        ctx[r].loss_kind = loss_kind;
        ctx[r].scenario = scenario;
    }
    run_ranks(n, 30.0, ctx);
    for (r = 0; r < n; r++) ASSERT_ENUM_EQm(ctx[r].msg, PDP_OK, ctx[r].st, pdp_status_name);
    ASSERT_EQ(count, ctx[0].count);
    for (i = 0; i < count; i++) {
        worst = fmax(worst, fabs((double)ctx[0].params[i] - ref[i]));
        scale = fmax(scale, fabs((double)ref[i]));
    }
    if (worst > 1e-5 * scale) {
        fprintf(stderr, "n %d cap %g accum %d loss %d: max |ddp - single| = %g, max |single| = "
                "%g\n", n, cap_mb, accum, loss_kind, worst, scale);
        FAILm("DDP parameters differ from single-device training on the global batch");
    }
    for (r = 1; r < n; r++)
        ASSERT_MEM_EQm("ranks differ", ctx[0].params, ctx[r].params, (size_t)count * sizeof(float));
    for (r = 0; r < n; r++) {
        ASSERT_EQ_FMT((long)0, ctx[r].allocs_after_first, "%ld");
        ASSERT_EQ(STEPS, (int)ctx[r].stats.steps);
        /* every bucket launched from the grad hook, while backward still ran: none waited
           for the end of backward (the overlap DDP is for) */
        ASSERT_EQ(ctx[r].nbuckets, (int)ctx[r].stats.launched_in_backward);
        if (n == 2) ASSERT_EQ(count * 4, ctx[r].stats.bytes_sent); /* 2(N-1)/N = 1 */
        if (n > 1) ASSERT(ctx[r].stats.bytes_sent > 0);
    }
    PASS();
}

static enum greatest_test_res check_equivalence(int n, double cap_mb, int accum)
{
    return check_equivalence_loss(n, cap_mb, accum, 0, 0);
}

TEST ddp_equals_single_device_on_the_global_batch(void)
{
    static const double caps[] = {1e-9, 0.0008, 1e6}; /* one param per bucket .. one bucket */
    int n, accum;
    size_t k;
    for (n = 1; n <= MAXR; n++)
        for (k = 0; k < sizeof caps / sizeof *caps; k++)
            for (accum = 1; accum <= 2; accum++) CHECK_CALL(check_equivalence(n, caps[k], accum));
    PASS();
}

/* Issue 13 item 1: a loop with an own loss (pdp_model_forward, pdp_loss_mse,
   pdp_model_backward, pdp_ddp_step) used to all-reduce nothing and let the ranks
   drift; every backward of a wrapped model now synchronises. */
TEST ddp_own_loss_equals_single_device(void)
{
    int n, kind, accum;
    for (kind = 1; kind <= 2; kind++)
        for (n = 2; n <= MAXR; n++)
            for (accum = 1; accum <= 2; accum++)
                CHECK_CALL(check_equivalence_loss(n, 0.0008, accum, kind, 0));
    PASS();
}

/* A second own-loss backward before the step: PDP_ERR_STATE naming what to call;
   training then goes on as if it had not been tried. */
TEST ddp_own_loss_second_backward_is_refused(void)
{
    CHECK_CALL(check_equivalence_loss(2, 0.0008, 1, 1, 5));
    CHECK_CALL(check_equivalence_loss(3, 0.0008, 2, 2, 5));
    PASS();
}

TEST ddp_world_size_one_is_plain_training_bit_for_bit(void)
{
    static rank_ctx ctx[1];
    static float ref[2048];
    int64_t count = 0;
    memset(ctx, 0, sizeof ctx);
    ctx[0].cap_mb = 25;
    ctx[0].accum = 1;
    ASSERT_ENUM_EQ(PDP_OK, train_single(1, ref, &count), pdp_status_name);
    run_ranks(1, 30.0, ctx);
    ASSERT_ENUM_EQm(ctx[0].msg, PDP_OK, ctx[0].st, pdp_status_name);
    ASSERT_MEM_EQ(ref, ctx[0].params, (size_t)count * sizeof(float));
    PASS();
}

/* ---- buckets ---- */

TEST ddp_buckets_follow_reverse_order_and_caps(void)
{
    static const double caps[] = {1e-9, 0.0008, 0.002, 25, 1e6};
    pdp_local_group *g = NULL;
    pdp_comm *c = NULL;
    pdp_model *m = NULL;
    pdp_ddp *d = NULL;
    pdp_ddp_desc dd;
    size_t k;
    ASSERT_ENUM_EQ(PDP_OK, pdp_local_group_create(&g, 1, NULL), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_comm_create_local(&c, g, 0), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, build_model(&m, 1, 0), pdp_status_name);
    for (k = 0; k < sizeof caps / sizeof *caps; k++) {
        /* independent plan: walk from the last parameter, close at >= cap */
        int want_first[8], want_last[8], nb = 0, p, last = m->nparams - 1, b;
        double bytes = 0, cap = caps[k] * 1048576.0;
        for (p = m->nparams - 1; p >= 0; p--) {
            pdp_param pr;
            pdp_model_param(m, p, &pr);
            bytes += (double)pr.value.count * 4;
            if (bytes >= cap || p == 0) {
                want_first[nb] = p;
                want_last[nb++] = last;
                last = p - 1;
                bytes = 0;
            }
        }
        memset(&dd, 0, sizeof dd);
        dd.bucket_cap_mb = caps[k];
        dd.first_bucket_mb = caps[k];
        ASSERT_ENUM_EQ(PDP_OK, pdp_ddp_create(&d, m, c, &dd), pdp_status_name);
        ASSERT_EQ(nb, pdp_ddp_num_buckets(d));
        for (b = 0; b < nb; b++) {
            pdp_ddp_bucket bi;
            pdp_param pf, pl;
            ASSERT_ENUM_EQ(PDP_OK, pdp_ddp_bucket_info(d, b, &bi), pdp_status_name);
            ASSERT_EQ(want_first[b], bi.first_param);
            ASSERT_EQ(want_last[b], bi.last_param);
            pdp_model_param(m, bi.first_param, &pf);
            pdp_model_param(m, bi.last_param, &pl);
            ASSERT_EQ(pf.offset, bi.offset); /* a view of the gradient block */
            ASSERT_EQ(pl.offset + pl.value.count - pf.offset, bi.count);
        }
        if (caps[k] < 1e-6) ASSERT_EQ(m->nparams, nb);
        if (caps[k] >= 25) ASSERT_EQ(1, nb);
        ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_ddp_bucket_info(d, nb, NULL), pdp_status_name);
        pdp_ddp_free(d);
        d = NULL;
    }
    /* defaults: 25 MiB, first bucket 1 MiB; a model of 1.5 MiB of weights in the last layer
       and 1 MiB before it has two buckets */
    pdp_model_free(m);
    {
        pdp_model_desc md;
        memset(&md, 0, sizeof md);
        md.input_shape[0] = 512;
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_create(&m, &md), pdp_status_name);
        pdp_model_add_linear(m, 512);
        pdp_model_add_linear(m, 768);
        ASSERT_ENUM_EQ(PDP_OK, pdp_ddp_create(&d, m, c, NULL), pdp_status_name);
        ASSERT_EQ(2, pdp_ddp_num_buckets(d));
        pdp_ddp_free(d);
    }
    pdp_model_free(m);
    pdp_comm_free(c);
    pdp_local_group_free(g);
    PASS();
}

TEST ddp_state_errors(void)
{
    static rank_ctx ctx[2];
    int r;
    memset(ctx, 0, sizeof ctx);
    for (r = 0; r < 2; r++) {
        ctx[r].cap_mb = 0.0008;
        ctx[r].accum = 2;
        ctx[r].scenario = 4;
    }
    run_ranks(2, 30.0, ctx);
    for (r = 0; r < 2; r++) ASSERT_ENUM_EQm(ctx[r].msg, PDP_OK, ctx[r].st, pdp_status_name);
    PASS();
}

TEST ddp_model_and_comm_are_what_it_wraps(void)
{
    pdp_local_group *g = NULL;
    pdp_comm *c = NULL;
    pdp_model *m = NULL;
    pdp_ddp *d = NULL;
    ASSERT_EQ(NULL, pdp_ddp_model(NULL));
    ASSERT_EQ(NULL, pdp_ddp_comm(NULL));
    ASSERT_ENUM_EQ(PDP_OK, pdp_local_group_create(&g, 1, NULL), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_comm_create_local(&c, g, 0), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, build_model(&m, 1, 0), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_ddp_create(&d, m, c, NULL), pdp_status_name);
    ASSERT_EQ(m, pdp_ddp_model(d));
    ASSERT_EQ(c, pdp_ddp_comm(d));
    ASSERT_EQ(0, pdp_comm_rank(pdp_ddp_comm(d)));
    ASSERT_EQ(m->nparams, pdp_model_num_params(pdp_ddp_model(d)));
    pdp_ddp_free(d);
    pdp_model_free(m);
    pdp_comm_free(c);
    pdp_local_group_free(g);
    PASS();
}

/* ---- unused parameters ----
   In this sequential model every backward reports every parameter, so a
   parameter without a gradient only arises through the executor seam (a model
   with frozen or skipped layers would produce it): here a synchronised backward
   reports the last layer only, after a no_sync pass accumulated rank-dependent
   gradients everywhere. The buckets of the unreported parameters must still be
   all-reduced, at the end of backward; otherwise they stay rank-local. */

typedef struct unused_ctx {
    pdp_local_group *g;
    int rank;
    pdp_status st;
    char msg[1024];
    float before[2048], after[2048];
    int64_t count;
    int nbuckets;
    pdp_ddp_stats stats;
} unused_ctx;

static void *unused_rank(void *arg)
{
    unused_ctx *u = (unused_ctx *)arg;
    pdp_comm *c = NULL;
    pdp_model *m = NULL;
    pdp_ddp *d = NULL;
    pdp_ddp_desc dd;
    float x[B * IN], loss;
    int32_t y[B];
    int64_t shape[2] = {B / 2, IN};
    const pdp_tensor *out;
    pdp_tensor xt;
    pdp_status st;
    memset(&dd, 0, sizeof dd);
    dd.bucket_cap_mb = 1e-9; /* one parameter per bucket */
    dd.first_bucket_mb = 1e-9;
    make_batch(0, x, y);
    pdp_tensor_wrap(x + u->rank * (B / 2) * IN, pdp_cpu(), 2, shape, &xt);
    if ((st = pdp_comm_create_local(&c, u->g, u->rank)) || (st = build_model(&m, 1, 0)) ||
        (st = pdp_ddp_create(&d, m, c, &dd)))
        goto out;
    u->nbuckets = pdp_ddp_num_buckets(d);
    pdp_ddp_set_no_sync(d, true);
    if ((st = pdp_ddp_forward_backward(d, &xt, y + u->rank * (B / 2), &loss))) goto out;
    memcpy(u->before, m->grad_block, (size_t)m->param_count * sizeof(float));
    u->count = m->param_count;
    pdp_ddp_set_no_sync(d, false);
    if ((st = pdp_model_forward(m, &xt, &out))) goto out;
    /* a synchronised backward that reaches the last layer only */
    if ((st = m->event(m->event_user, m, PDP__EV_BACKWARD_BEGIN, -1, PDP_OK))) goto out;
    m->exec_hook(m->exec_hook_user, m, m->nparams - 1);
    m->exec_hook(m->exec_hook_user, m, m->nparams - 2);
    m->event(m->event_user, m, PDP__EV_BACKWARD_END, -1, PDP_OK);
    if ((st = pdp_ddp_finish(d))) goto out;
    memcpy(u->after, m->grad_block, (size_t)m->param_count * sizeof(float));
    pdp_ddp_get_stats(d, &u->stats);
out:
    u->st = st;
    if (st) snprintf(u->msg, sizeof u->msg, "%s", pdp_last_error());
    pdp_ddp_free(d);
    pdp_model_free(m);
    pdp_comm_free(c);
    return NULL;
}

TEST ddp_buckets_of_unused_parameters_launch_at_the_end_of_backward(void)
{
    static unused_ctx u[2];
    pthread_t t[2];
    pdp_local_group *g = NULL;
    int64_t i, differ = 0;
    int r;
    memset(u, 0, sizeof u);
    ASSERT_ENUM_EQ(PDP_OK, pdp_local_group_create(&g, 2, NULL), pdp_status_name);
    for (r = 0; r < 2; r++) {
        u[r].g = g;
        u[r].rank = r;
        pthread_create(&t[r], NULL, unused_rank, &u[r]);
    }
    for (r = 0; r < 2; r++) pthread_join(t[r], NULL);
    pdp_local_group_free(g);
    for (r = 0; r < 2; r++) ASSERT_ENUM_EQm(u[r].msg, PDP_OK, u[r].st, pdp_status_name);
    for (i = 0; i < u[0].count; i++) differ += u[0].before[i] != u[1].before[i];
    ASSERT(differ > u[0].count / 2); /* the ranks' accumulated gradients differ */
    for (r = 0; r < 2; r++) {
        ASSERT_EQ(2, (int)u[r].stats.launched_in_backward); /* the last layer's two */
        ASSERT_EQ(u[r].nbuckets, (int)u[r].stats.buckets);
        ASSERT_EQ(u[0].count * 4, u[r].stats.bytes_sent); /* every bucket: 2(N-1)/N = 1 */
        for (i = 0; i < u[0].count; i++) {
            float want = (u[0].before[i] + u[1].before[i]) / 2.0f;
            ASSERT_IN_RANGE(want, u[r].after[i], 1e-6 * (fabs(want) + 1e-3));
        }
    }
    ASSERT_MEM_EQ(u[0].after, u[1].after, (size_t)u[0].count * sizeof(float));
    PASS();
}

/* ---- communication hooks ---- */

/* A user hook: an fp32 SUM all-reduce, divided by N in finish (the bits of AVG), counting
   its calls and checking the views it gets. */
typedef struct count_hook {
    atomic_int launches, finishes, bad_views;
    int fail_launch, fail_finish;
    int fail_rank1;    /* r + 1: only rank r's launch of bucket 0 fails */
} count_hook;

static pdp_status count_launch(void *state, pdp_comm *c, const pdp_comm_hook_bucket *b,
                               pdp_work **work)
{
    count_hook *h = (count_hook *)state;
    atomic_fetch_add(&h->launches, 1);
    if (b->reduce_scatter || b->recv || !b->scratch || b->world_size != pdp_comm_size(c) ||
        b->rank != pdp_comm_rank(c) || b->index < 0 || b->index >= b->nbuckets)
        atomic_fetch_add(&h->bad_views, 1);
    if (h->fail_launch || (h->fail_rank1 == b->rank + 1 && b->index == 0))
        return pdp__err(PDP_ERR_INVALID, "count_launch: refusing bucket %d", b->index);
    memset(b->scratch, 0xab, (size_t)b->count * 4); /* its own piece: writable, no overlap */
    return pdp_comm_allreduce(c, b->grad, b->count, PDP_REDUCE_SUM, work);
}

static pdp_status count_finish(void *state, const pdp_comm_hook_bucket *b)
{
    count_hook *h = (count_hook *)state;
    int64_t i;
    atomic_fetch_add(&h->finishes, 1);
    if (h->fail_finish) return pdp__err(PDP_ERR_INVALID, "count_finish: refusing");
    for (i = 0; i < b->count; i++) b->grad[i] /= (float)b->world_size;
    return PDP_OK;
}

typedef struct hook_ctx {
    pdp_local_group *g;
    int rank, size;
    int hook;          /* 0 none, 1 bf16, 2 fp16, 3 count_hook */
    int steps;         /* training steps after the gradient comparison (0: none) */
    count_hook *user;
    pdp_status st;
    char msg[1024];
    float local[2048], avg[2048]; /* this rank's own gradient, and DDP's average */
    int64_t count, bytes_sent;
    int nbuckets;
    float last_loss;   /* mean of the last 20 steps' global losses */
} hook_ctx;

static pdp_status hook_fail(hook_ctx *ctx, pdp_status st)
{
    if (st != PDP_OK && ctx->st == PDP_OK) {
        ctx->st = st;
        snprintf(ctx->msg, sizeof ctx->msg, "%s", pdp_last_error());
    }
    return st;
}

static void *hook_rank(void *arg)
{
    hook_ctx *ctx = (hook_ctx *)arg;
    pdp_comm *c = NULL;
    pdp_model *m = NULL;
    pdp_optim *o = NULL;
    pdp_ddp *d = NULL;
    pdp_ddp_desc dd;
    pdp_ddp_comm_hook h;
    pdp_ddp_stats ds;
    pdp_optim_desc od = sgd();
    int r = ctx->rank, n = ctx->size, local = 12 / n, s;
    float x[B * IN], loss, acc = 0.0f;
    int32_t y[B];
    int64_t shape[2];
    pdp_tensor xt;
    memset(&dd, 0, sizeof dd);
    dd.bucket_cap_mb = dd.first_bucket_mb = 0.0001; /* 104 bytes: 3 buckets */
    shape[0] = local;
    shape[1] = IN;
    od.momentum = 0.0f;
    od.lr = 0.05f;
    if (hook_fail(ctx, pdp_comm_create_local(&c, ctx->g, r)) ||
        hook_fail(ctx, build_model(&m, 1, 0)) || hook_fail(ctx, pdp_optim_create(&o, m, &od)))
        goto out;
    make_batch(0, x, y);
    pdp_tensor_wrap(x + r * local * IN, pdp_cpu(), 2, shape, &xt);
    /* this rank's own gradient, before DDP (same parameters on every rank: seed 1) */
    if (hook_fail(ctx, pdp_model_forward_backward(m, &xt, y + r * local, &loss))) goto out;
    memcpy(ctx->local, m->grad_block, (size_t)m->param_count * sizeof(float));
    ctx->count = m->param_count;
    if (hook_fail(ctx, pdp_ddp_create(&d, m, c, &dd))) goto out;
    ctx->nbuckets = pdp_ddp_num_buckets(d);
    memset(&h, 0, sizeof h);
    if (ctx->hook == 1) h = pdp_ddp_hook_bf16_compress();
    if (ctx->hook == 2) h = pdp_ddp_hook_fp16_compress();
    if (ctx->hook == 3) {
        h.launch = count_launch;
        h.finish = count_finish;
        h.state = ctx->user;
        h.scratch_bytes_per_float = 4;
    }
    if (ctx->hook && hook_fail(ctx, pdp_ddp_register_comm_hook(d, &h))) goto out;
    if (hook_fail(ctx, pdp_ddp_forward_backward(d, &xt, y + r * local, &loss)) ||
        hook_fail(ctx, pdp_ddp_finish(d)))
        goto out;
    memcpy(ctx->avg, m->grad_block, (size_t)m->param_count * sizeof(float));
    pdp_ddp_get_stats(d, &ds);
    ctx->bytes_sent = ds.bytes_sent;
    if (hook_fail(ctx, pdp_ddp_step(d, o))) goto out;
    for (s = 0; s < ctx->steps; s++) { /* four global batches, cycled */
        float global = 0.0f;
        make_batch(s % 4, x, y);
        if (hook_fail(ctx, pdp_ddp_forward_backward(d, &xt, y + r * local, &loss)) ||
            hook_fail(ctx, pdp_ddp_step(d, o)))
            goto out;
        global = loss / (float)n; /* each rank's mean: the global mean is their average */
        if (s >= ctx->steps - 20) acc += global;
    }
    ctx->last_loss = acc / 20.0f;
out:
    pdp_ddp_free(d);
    pdp_optim_free(o);
    pdp_model_free(m);
    pdp_comm_free(c);
    return NULL;
}

static void run_hook_ranks(int n, hook_ctx *ctx)
{
    pthread_t t[MAXR];
    pdp_local_group *g = NULL;
    pdp_comm_desc cd;
    int r;
    memset(&cd, 0, sizeof cd);
    cd.timeout_s = 30.0;
    cd.name = "hook";
    pdp_local_group_create(&g, n, &cd);
    for (r = 0; r < n; r++) {
        ctx[r].g = g;
        ctx[r].rank = r;
        ctx[r].size = n;
        pthread_create(&t[r], NULL, hook_rank, &ctx[r]);
    }
    for (r = 0; r < n; r++) pthread_join(t[r], NULL);
    pdp_local_group_free(g);
}

/* The bound of ddp.h: with u the unit roundoff (bf16 2^-8, fp16 2^-11), each input
   g_r / N rounds once (u |g_r| / N) and their sum once (u (1 + u) sum |g_r| / N), so
   |compressed - exact| <= u (2 + u) sum_r |g_r| / N, plus 2^-25 (N + 1) for fp16's
   subnormals; the fp32 reference is itself within 2^-24 N sum |g_r| / N of exact. */
static enum greatest_test_res check_compress_hook(int n, int hook)
{
    static hook_ctx ref[MAXR], hk[MAXR];
    double u = hook == 1 ? 0x1p-8 : 0x1p-11, worst = 0.0;
    int64_t i;
    int r, differ = 0;
    memset(ref, 0, sizeof ref);
    memset(hk, 0, sizeof hk);
    for (r = 0; r < n; r++) hk[r].hook = hook;
    run_hook_ranks(n, ref);
    run_hook_ranks(n, hk);
    for (r = 0; r < n; r++) {
        ASSERT_ENUM_EQm(ref[r].msg, PDP_OK, ref[r].st, pdp_status_name);
        ASSERT_ENUM_EQm(hk[r].msg, PDP_OK, hk[r].st, pdp_status_name);
    }
    ASSERT(ref[0].nbuckets >= 3);
    for (i = 0; i < ref[0].count; i++) {
        double sabs = 0.0, bound, err;
        for (r = 0; r < n; r++) sabs += fabs((double)ref[r].local[i]);
        sabs /= n;
        bound = u * (2.0 + u) * sabs + 0x1p-24 * n * sabs + (hook == 2 ? 0x1p-25 * (n + 1) : 0.0);
        err = fabs((double)hk[0].avg[i] - ref[0].avg[i]);
        worst = fmax(worst, sabs > 0.0 ? err / sabs : 0.0);
        if (err > bound) {
            fprintf(stderr, "n %d hook %d param %lld: compressed %.9g fp32 %.9g: error %.3g > "
                    "bound %.3g\n", n, hook, (long long)i, hk[0].avg[i], ref[0].avg[i], err, bound);
            FAILm("compressed gradients outside the rounding bound");
        }
        differ += hk[0].avg[i] != ref[0].avg[i];
        for (r = 1; r < n; r++)
            if (hk[r].avg[i] != hk[0].avg[i]) FAILm("ranks hold different compressed gradients");
    }
    ASSERTm("compression changed nothing (was the hook used?)", differ > 0);
    for (r = 0; r < n; r++) {
        /* exactly half for 2 ranks; at 3, each collective's 4/3 x bytes truncates on its own */
        if (n == 2) ASSERT_EQ(ref[r].bytes_sent, 2 * hk[r].bytes_sent);
        else ASSERT(llabs(ref[r].bytes_sent - 2 * hk[r].bytes_sent) <= 2 * ref[r].nbuckets);
        ASSERT(hk[r].bytes_sent > 0);
    }
    if (getenv("PDP_TEST_VERBOSE"))
        printf("n %d %s: max error / mean |g_r| = %.3g (u = %.3g)\n", n, hook == 1 ? "bf16" : "fp16",
               worst, u);
    PASS();
}

TEST ddp_compress_hooks_match_fp32_within_the_rounding_bound(void)
{
    int n;
    for (n = 2; n <= 3; n++) {
        CHECK_CALL(check_compress_hook(n, 1));
        CHECK_CALL(check_compress_hook(n, 2));
    }
    PASS();
}

TEST ddp_user_hook_replaces_the_allreduce(void)
{
    static hook_ctx ref[MAXR], hk[MAXR];
    static count_hook user;
    int r;
    memset(ref, 0, sizeof ref);
    memset(hk, 0, sizeof hk);
    memset(&user, 0, sizeof user);
    for (r = 0; r < 3; r++) {
        hk[r].hook = 3;
        hk[r].user = &user;
        hk[r].steps = 2;
    }
    run_hook_ranks(3, ref);
    run_hook_ranks(3, hk);
    for (r = 0; r < 3; r++) {
        ASSERT_ENUM_EQm(hk[r].msg, PDP_OK, hk[r].st, pdp_status_name);
        /* SUM then / N in finish: the bits of the built-in AVG all-reduce */
        ASSERT_MEM_EQ(ref[r].avg, hk[r].avg, (size_t)ref[r].count * sizeof(float));
    }
    /* 3 steps (1 + 2) x 3 ranks x every bucket, each launched and finished once */
    ASSERT_EQ(9 * hk[0].nbuckets, atomic_load(&user.launches));
    ASSERT_EQ(9 * hk[0].nbuckets, atomic_load(&user.finishes));
    ASSERT_EQ(0, atomic_load(&user.bad_views));
    PASS();
}

/* A hook whose launch fails on rank 1 alone, at its first bucket of several: rank 1 issues
   no later collective, so ranks 0 and 2 fail at that bucket (had it gone on, their bucket 0
   would have been summed with its bucket 1, of the same size here, and their error named a
   later bucket); rank 1's own message names the hook. */
TEST ddp_hook_failing_on_one_rank_fails_every_rank_at_that_bucket(void)
{
    static hook_ctx hk[MAXR];
    static count_hook user;
    int r;
    memset(hk, 0, sizeof hk);
    memset(&user, 0, sizeof user);
    user.fail_rank1 = 2;
    for (r = 0; r < 3; r++) hk[r].hook = 3, hk[r].user = &user;
    run_hook_ranks(3, hk);
    ASSERT(hk[0].nbuckets >= 3);
    ASSERT_ENUM_EQm(hk[1].msg, PDP_ERR_INVALID, hk[1].st, pdp_status_name);
    ASSERTm(hk[1].msg, strstr(hk[1].msg, "count_launch: refusing bucket 0") != NULL);
    for (r = 0; r < 3; r += 2) {
        char want[64];
        snprintf(want, sizeof want, "bucket 0 of %d", hk[0].nbuckets);
        ASSERTm(hk[r].msg, hk[r].st != PDP_OK);
        ASSERTm(hk[r].msg, strstr(hk[r].msg, want) != NULL);
    }
    PASS();
}

TEST ddp_compress_hook_training_reaches_the_fp32_loss(void)
{
    static hook_ctx ref[MAXR], hk[MAXR];
    int r, hook;
    for (hook = 1; hook <= 2; hook++) {
        memset(ref, 0, sizeof ref);
        memset(hk, 0, sizeof hk);
        for (r = 0; r < 2; r++) {
            ref[r].steps = hk[r].steps = 300;
            hk[r].hook = hook;
        }
        run_hook_ranks(2, ref);
        run_hook_ranks(2, hk);
        for (r = 0; r < 2; r++) {
            ASSERT_ENUM_EQm(ref[r].msg, PDP_OK, ref[r].st, pdp_status_name);
            ASSERT_ENUM_EQm(hk[r].msg, PDP_OK, hk[r].st, pdp_status_name);
        }
        if (getenv("PDP_TEST_VERBOSE"))
            printf("300 steps, 2 ranks: mean loss of the last 20: fp32 %.5f, %s %.5f\n",
                   ref[0].last_loss + ref[1].last_loss, hook == 1 ? "bf16" : "fp16",
                   hk[0].last_loss + hk[1].last_loss);
        /* it learned (the loss of 3 classes starts near ln 3 = 1.1) and, within 0.01, as
           far as fp32 */
        ASSERT(ref[0].last_loss + ref[1].last_loss < 0.8f);
        ASSERT_IN_RANGE(ref[0].last_loss + ref[1].last_loss, hk[0].last_loss + hk[1].last_loss,
                        0.01f);
    }
    PASS();
}

/* World size 1: a failing hook cannot strand a peer. */
static enum greatest_test_res hook_error_case(int which, pdp_status want, const char *want1,
                                              const char *want2)
{
    pdp_local_group *g = NULL;
    pdp_comm *c = NULL;
    pdp_model *m = NULL;
    pdp_ddp *d = NULL;
    pdp_ddp_comm_hook h = pdp_ddp_hook_bf16_compress();
    count_hook user;
    float x[B * IN], loss;
    int32_t y[B];
    int64_t shape[2] = {B, IN};
    pdp_tensor xt;
    pdp_status st = PDP_OK;
    memset(&user, 0, sizeof user);
    ASSERT_ENUM_EQ(PDP_OK, pdp_local_group_create(&g, 1, NULL), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_comm_create_local(&c, g, 0), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, build_model(&m, 1, 0), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_ddp_create(&d, m, c, NULL), pdp_status_name);
    make_batch(0, x, y);
    pdp_tensor_wrap(x, pdp_cpu(), 2, shape, &xt);
    switch (which) {
    case 0: st = pdp_ddp_register_comm_hook(d, NULL); break;
    case 1:
        h.launch = NULL;
        st = pdp_ddp_register_comm_hook(d, &h);
        break;
    case 2:
        if (pdp_ddp_register_comm_hook(d, &h) == PDP_OK) st = pdp_ddp_register_comm_hook(d, &h);
        break;
    case 3:
        if (pdp_ddp_forward_backward(d, &xt, y, &loss) == PDP_OK && pdp_ddp_finish(d) == PDP_OK)
            st = pdp_ddp_register_comm_hook(d, &h);
        break;
    case 4: case 5:
        h.launch = count_launch;
        h.finish = count_finish;
        h.state = &user;
        h.scratch_bytes_per_float = 4;
        user.fail_launch = which == 4;
        user.fail_finish = which == 5;
        if (pdp_ddp_register_comm_hook(d, &h) == PDP_OK &&
            pdp_ddp_forward_backward(d, &xt, y, &loss) == PDP_OK)
            st = pdp_ddp_finish(d);
        break;
    }
    ASSERT_ENUM_EQm(pdp_last_error(), want, st, pdp_status_name);
    ASSERTm(pdp_last_error(), strstr(pdp_last_error(), want1) != NULL);
    if (want2) ASSERTm(pdp_last_error(), strstr(pdp_last_error(), want2) != NULL);
    pdp_ddp_free(d);
    pdp_model_free(m);
    pdp_comm_free(c);
    pdp_local_group_free(g);
    PASS();
}

TEST ddp_comm_hook_errors(void)
{
    CHECK_CALL(hook_error_case(0, PDP_ERR_INVALID, "pdp_ddp_register_comm_hook: hook is NULL",
                               NULL));
    CHECK_CALL(hook_error_case(1, PDP_ERR_INVALID,
                               "pdp_ddp_register_comm_hook: hook->launch is NULL", NULL));
    CHECK_CALL(hook_error_case(2, PDP_ERR_STATE, "pdp_ddp_register_comm_hook: rank 0: a "
                               "communication hook is already registered", NULL));
    CHECK_CALL(hook_error_case(3, PDP_ERR_STATE, "a backward has already run; register the hook "
                               "before the first backward", NULL));
    CHECK_CALL(hook_error_case(4, PDP_ERR_INVALID, "pdp_ddp_finish: rank 0: bucket 0 of",
                               "comm hook launch: count_launch: refusing bucket 0"));
    CHECK_CALL(hook_error_case(5, PDP_ERR_INVALID, "pdp_ddp_finish: rank 0: bucket 0 of",
                               "comm hook finish: count_finish: refusing"));
    PASS();
}

/* ---- the reducer seam ---- */

/* A collective that records the order of launches and sums instead of
   averaging; an after-step hook that counts. */
typedef struct seam_log {
    int launched[64], nlaunched, after_steps;
} seam_log;

static pdp_status seam_reduce(pdp__reducer *r, int b, pdp_work **w)
{
    seam_log *log = (seam_log *)r->desc.user;
    const pdp_ddp_bucket *k = &r->buckets[b].info;
    if (log->nlaunched < 64) log->launched[log->nlaunched++] = b;
    return pdp_comm_allreduce(r->c, r->m->grad_block + k->offset, k->count, PDP_REDUCE_SUM, w);
}

static pdp_status seam_after_step(pdp__reducer *r, const char *fn)
{
    seam_log *log = (seam_log *)r->desc.user;
    (void)fn;
    log->after_steps++;
    return log->after_steps == 3 ? pdp__err(PDP_ERR_COMM, "seam_after_step: third") : PDP_OK;
}

TEST reducer_collective_and_after_step_are_parameters(void)
{
    static pdp__reducer r; /* zeroed */
    pdp_local_group *g = NULL;
    pdp_comm *c = NULL;
    pdp_model *m = NULL;
    pdp_optim *o = NULL;
    pdp_optim_desc od = sgd();
    pdp__reducer_desc rd;
    seam_log log;
    float x[B * IN], loss;
    int32_t y[B];
    int64_t shape[2] = {B, IN};
    pdp_tensor xt;
    int b, step;
    memset(&log, 0, sizeof log);
    memset(&rd, 0, sizeof rd);
    rd.cap_bytes = 1.0; /* one parameter per bucket */
    rd.first_bytes = 1.0;
    rd.reduce = seam_reduce;
    rd.after_step = seam_after_step;
    rd.op_name = "sum";
    rd.finish_names = "the seam test's finish";
    rd.user = &log;
    ASSERT_ENUM_EQ(PDP_OK, pdp_local_group_create(&g, 1, NULL), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_comm_create_local(&c, g, 0), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, build_model(&m, 1, 0), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&o, m, &od), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp__reducer_init(&r, m, c, &rd, "seam"), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp__reducer_join(&r, "seam"), pdp_status_name);
    ASSERT_EQ(m->nparams, r.nbuckets);
    ASSERT(m->exec_hook != NULL);
    pdp_tensor_wrap(x, pdp_cpu(), 2, shape, &xt);
    for (step = 0; step < 3; step++) {
        make_batch(step, x, y);
        r.no_sync = true; /* accumulates: nothing launched */
        ASSERT_ENUM_EQ(PDP_OK, pdp__reducer_backward(&r, &xt, y, &loss, "seam"), pdp_status_name);
        ASSERT_EQ(step * m->nparams, log.nlaunched);
        ASSERT_ENUM_EQ(PDP_ERR_STATE, pdp__reducer_finish(&r, "seam"), pdp_status_name);
        r.no_sync = false;
        ASSERT_ENUM_EQ(PDP_OK, pdp__reducer_backward(&r, &xt, y, &loss, "seam"), pdp_status_name);
        ASSERT_EQ((step + 1) * m->nparams, log.nlaunched);
        for (b = 0; b < m->nparams; b++) ASSERT_EQ(b, log.launched[step * m->nparams + b]);
        ASSERT_ENUM_EQ(PDP_ERR_STATE, pdp__reducer_backward(&r, &xt, y, &loss, "seam"),
                       pdp_status_name);
        ASSERT(strstr(pdp_last_error(), "call the seam test's finish first") != NULL);
        ASSERT_ENUM_EQ(PDP_OK, pdp__reducer_finish(&r, "seam"), pdp_status_name);
        ASSERT_EQ(step + 1, (int)r.stats.steps);
        if (step < 2) {
            ASSERT_ENUM_EQ(PDP_OK, pdp__reducer_step(&r, o, "seam"), pdp_status_name);
        } else { /* the hook's failure is the step's */
            ASSERT_ENUM_EQ(PDP_ERR_COMM, pdp__reducer_step(&r, o, "seam"), pdp_status_name);
            ASSERT(strstr(pdp_last_error(), "third") != NULL);
        }
        ASSERT_EQ(step + 1, log.after_steps);
        ASSERT_EQ(step + 1, (int)pdp_optim_steps(o));
    }
    pdp__reducer_release(&r);
    ASSERT(m->exec_hook == NULL);
    pdp_optim_free(o);
    pdp_model_free(m);
    pdp_comm_free(c);
    pdp_local_group_free(g);
    PASS();
}

/* ---- faults ---- */

TEST ddp_param_mismatch_fails_on_every_rank(void)
{
    static rank_ctx ctx[3];
    int r;
    memset(ctx, 0, sizeof ctx);
    for (r = 0; r < 3; r++) {
        ctx[r].cap_mb = 25;
        ctx[r].accum = 1;
        ctx[r].scenario = 1;
    }
    run_ranks(3, 30.0, ctx);
    for (r = 0; r < 3; r++) {
        ASSERT_ENUM_EQm(ctx[r].msg, PDP_ERR_INVALID, ctx[r].st, pdp_status_name);
        ASSERTm(ctx[r].msg, strstr(ctx[r].msg, "pdp_ddp_create") != NULL);
        ASSERTm(ctx[r].msg, strstr(ctx[r].msg, "'2.weight' [12, 16]") != NULL);
        ASSERT(ctx[r].elapsed < 5.0);
    }
    ASSERTm(ctx[1].msg, strstr(ctx[1].msg, "'2.weight' [11, 16] on rank 1") != NULL);
    ASSERTm(ctx[0].msg, strstr(ctx[0].msg, "rank 1's parameter 2") != NULL);
    PASS();
}

TEST ddp_absent_rank_times_out_naming_bucket_and_rank(void)
{
    static rank_ctx ctx[3];
    int r;
    memset(ctx, 0, sizeof ctx);
    absent_done = 0;
    for (r = 0; r < 3; r++) {
        ctx[r].cap_mb = 0.0008;
        ctx[r].accum = 1;
        ctx[r].scenario = 2;
    }
    run_ranks(3, PDP_TEST_TIMEOUT(0.3), ctx);
    for (r = 0; r < 2; r++) {
        ASSERT_ENUM_EQm(ctx[r].msg, PDP_ERR_TIMEOUT, ctx[r].st, pdp_status_name);
        ASSERTm(ctx[r].msg, strstr(ctx[r].msg, "pdp_ddp_step") != NULL);
        ASSERTm(ctx[r].msg, strstr(ctx[r].msg, "bucket 0 of 2") != NULL);
        ASSERTm(ctx[r].msg, strstr(ctx[r].msg, "allreduce #") != NULL);
        ASSERTm(ctx[r].msg, strstr(ctx[r].msg, "rank 2 (last seen") != NULL);
        ASSERT(ctx[r].elapsed < 4.0);
    }
    PASS();
}

TEST ddp_rank_dying_mid_backward_fails_the_others_at_once(void)
{
    static rank_ctx ctx[3];
    int r;
    memset(ctx, 0, sizeof ctx);
    for (r = 0; r < 3; r++) {
        ctx[r].cap_mb = 1e-9; /* one parameter per bucket: rank 1 launches two of six */
        ctx[r].accum = 1;
        ctx[r].scenario = 3;
    }
    run_ranks(3, 60.0, ctx);
    for (r = 0; r < 3; r += 2) {
        ASSERT_ENUM_EQm(ctx[r].msg, PDP_ERR_COMM, ctx[r].st, pdp_status_name);
        ASSERTm(ctx[r].msg, strstr(ctx[r].msg, "bucket 2 of 6") != NULL);
        ASSERTm(ctx[r].msg, strstr(ctx[r].msg, "rank 1 left the group") != NULL);
        ASSERT(ctx[r].elapsed < 10.0); /* far below the 60 s timeout */
    }
    ASSERT_ENUM_EQm(ctx[1].msg, PDP_ERR_STATE, ctx[1].st, pdp_status_name);
    ASSERTm(ctx[1].msg, strstr(ctx[1].msg, "failed after launching 2 of 6 buckets") != NULL);
    PASS();
}

/* ---- collective constructors: a rank that fails alone ----
   Rank 1 alone fails in the first, rank-local half of pdp_ddp_create, pdp_zero_create
   (stages 1 and 3) or pdp_pp_create: a desc field only it got wrong, or its first
   allocation. It then holds its communicator until rank 0 has returned, as a process under
   MPI or NCCL would (freeing a local communicator would fail the peer at once anyway).
   Rank 0 must fail with PDP_ERR_COMM naming rank 1, well before the 2 s timeout; rank 1 with
   its own error. Without the agreement before the first collective, rank 0 waited there for
   rank 1 and failed with PDP_ERR_TIMEOUT after 2 s (seen in all 8 cases). */

typedef struct lone_job {
    int creator; /* 0 DDP, 1 ZeRO-1, 2 ZeRO-3, 3 a pipeline */
    int fault;   /* 0 a bad desc field on rank 1, 1 no memory on rank 1 */
    pdp_status st[2];
    char msg[2][1024];
    double elapsed[2];
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int rank0_done;
} lone_job;

static pdp_status lone_rank(const pdp_launch_ctx *ctx, void *user)
{
    lone_job *j = (lone_job *)user;
    int r = ctx->rank, lone = r == 1;
    pdp_model *m = NULL;
    pdp_ddp *d = NULL;
    pdp_zero *z = NULL;
    pdp_pp *pp = NULL;
    pdp_ddp_desc dd;
    pdp_zero_desc zd;
    pdp_pp_desc pd;
    pdp_status st;
    double t0;
    if ((st = build_model(&m, 1, 0)) != PDP_OK) return st;
    memset(&dd, 0, sizeof dd);
    memset(&zd, 0, sizeof zd);
    memset(&pd, 0, sizeof pd);
    zd.stage = j->creator == 2 ? 3 : 1;
    if (lone && j->fault == 0) dd.bucket_cap_mb = zd.bucket_cap_mb = -1.0, pd.micro_batches = -1;
    t0 = pdp_seconds();
    test_out_of_memory = lone && j->fault == 1;
    if (j->creator == 0) st = pdp_ddp_create(&d, m, ctx->world, &dd);
    else if (j->creator <= 2) st = pdp_zero_create(&z, m, ctx->world, &zd);
    else st = pdp_pp_create(&pp, m, ctx->world, &pd);
    test_out_of_memory = 0;
    j->elapsed[r] = pdp_seconds() - t0;
    j->st[r] = st == PDP_OK && !d && !z && !pp ? PDP_ERR_STATE : st;
    snprintf(j->msg[r], sizeof j->msg[r], "%s", pdp_last_error());
    pthread_mutex_lock(&j->mu);
    if (r == 0) j->rank0_done = 1, pthread_cond_broadcast(&j->cv);
    while (!j->rank0_done) pthread_cond_wait(&j->cv, &j->mu);
    pthread_mutex_unlock(&j->mu);
    pdp_pp_free(pp);
    pdp_zero_free(z);
    pdp_ddp_free(d);
    pdp_model_free(m);
    return PDP_OK;
}

TEST collective_constructors_fail_on_every_rank_when_one_fails(void)
{
    static const char *const creators[4] = {"pdp_ddp_create", "pdp_zero_create",
                                            "pdp_zero_create", "pdp_pp_create"};
    pdp_launch_desc ld;
    memset(&ld, 0, sizeof ld);
    ld.timeout_s = PDP_TEST_TIMEOUT(2.0);
    for (int c = 0; c < 4; c++)
        for (int f = 0; f < 2; f++) {
            static lone_job j;
            char what[1200];
            memset(&j, 0, sizeof j);
            pthread_mutex_init(&j.mu, NULL);
            pthread_cond_init(&j.cv, NULL);
            j.creator = c;
            j.fault = f;
            ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_launch(2, &ld, lone_rank, &j),
                            pdp_status_name);
            pthread_mutex_destroy(&j.mu);
            pthread_cond_destroy(&j.cv);
            snprintf(what, sizeof what, "creator %d fault %d: %s", c, f, j.msg[0]);
            ASSERT_ENUM_EQm(what, PDP_ERR_COMM, j.st[0], pdp_status_name);
            ASSERTm(what, strncmp(j.msg[0], creators[c], strlen(creators[c])) == 0);
            ASSERTm(what, strstr(j.msg[0], "rank 1 of comm 'world' failed") != NULL);
            snprintf(what, sizeof what, "creator %d fault %d: %s", c, f, j.msg[1]);
            ASSERT_ENUM_EQm(what, f ? PDP_ERR_OUT_OF_MEMORY : PDP_ERR_INVALID, j.st[1],
                            pdp_status_name);
            ASSERTm(what, strncmp(j.msg[1], creators[c], strlen(creators[c])) == 0);
            ASSERTm(what, strstr(j.msg[1], f ? "rank 1: no memory" : c == 3 ? "micro_batches -1"
                                                                   : "bucket_cap_mb -1") != NULL);
            for (int r = 0; r < 2; r++) ASSERTm(what, j.elapsed[r] < ld.timeout_s / 4);
        }
    PASS();
}

/* ---- sampler ---- */

static enum greatest_test_res check_sampler(int64_t n, int world, bool drop_last)
{
    pdp_dist_sampler *s[MAXR];
    pdp_dist_sampler_desc sd;
    int64_t *perm = (int64_t *)malloc((size_t)n * sizeof *perm), per, total, i, cnt;
    int r;
    memset(&sd, 0, sizeof sd);
    sd.dataset_size = n;
    sd.world_size = world;
    sd.seed = 7;
    sd.drop_last = drop_last;
    for (r = 0; r < world; r++) {
        sd.rank = r;
        ASSERT_ENUM_EQ(PDP_OK, pdp_dist_sampler_create(&s[r], &sd), pdp_status_name);
        pdp_dist_sampler_set_epoch(s[r], 3);
    }
    per = drop_last ? n / world : (n + world - 1) / world;
    total = per * world;
    pdp_permutation(perm, n, 7, 3);
    /* entry j of the padded list is perm[j % n]; rank r holds entries r, r + world, ... */
    for (r = 0; r < world; r++) {
        const int64_t *idx = pdp_dist_sampler_indices(s[r], &cnt);
        ASSERT_EQ(per, cnt);
        ASSERT_EQ(per, pdp_dist_sampler_num_samples(s[r]));
        for (i = 0; i < per; i++) ASSERT_EQ(perm[(r + i * world) % n], idx[i]);
    }
    /* disjoint and covering: every index used once, padding repeats only the first ones */
    {
        int *seen = (int *)calloc((size_t)n, sizeof(int));
        for (r = 0; r < world; r++) {
            const int64_t *idx = pdp_dist_sampler_indices(s[r], NULL);
            for (i = 0; i < per; i++) seen[idx[i]]++;
        }
        for (i = 0; i < n; i++) {
            int want = 0;
            int64_t j;
            for (j = 0; j < total; j++) want += perm[j % n] == i;
            ASSERT_EQ(want, seen[i]);
            if (!drop_last) ASSERT(seen[i] >= 1);
        }
        free(seen);
    }
    for (r = 0; r < world; r++) pdp_dist_sampler_free(s[r]);
    free(perm);
    PASS();
}

TEST sampler_shards_are_disjoint_and_padded_like_pytorch(void)
{
    CHECK_CALL(check_sampler(12, 3, false));
    CHECK_CALL(check_sampler(10, 3, false)); /* 4 each, 2 repeated */
    CHECK_CALL(check_sampler(10, 3, true));  /* 3 each, 1 dropped */
    CHECK_CALL(check_sampler(2, 4, false));  /* padding longer than the dataset */
    CHECK_CALL(check_sampler(1000, 4, false));
    PASS();
}

TEST sampler_set_epoch_reshuffles(void)
{
    pdp_dist_sampler *a = NULL, *b = NULL;
    pdp_dist_sampler_desc sd;
    int64_t e0[50], i, same = 0;
    memset(&sd, 0, sizeof sd);
    sd.dataset_size = 100;
    sd.world_size = 2;
    sd.seed = 1;
    ASSERT_ENUM_EQ(PDP_OK, pdp_dist_sampler_create(&a, &sd), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_dist_sampler_create(&b, &sd), pdp_status_name);
    memcpy(e0, pdp_dist_sampler_indices(a, NULL), sizeof e0);
    pdp_dist_sampler_set_epoch(a, 1);
    for (i = 0; i < 50; i++) same += pdp_dist_sampler_indices(a, NULL)[i] == e0[i];
    ASSERT(same < 10);
    pdp_dist_sampler_set_epoch(a, 0); /* replayable */
    ASSERT_MEM_EQ(e0, pdp_dist_sampler_indices(a, NULL), sizeof e0);
    ASSERT_MEM_EQ(e0, pdp_dist_sampler_indices(b, NULL), sizeof e0);
    pdp_dist_sampler_free(a);
    pdp_dist_sampler_free(b);
    sd.no_shuffle = true;
    sd.rank = 1;
    ASSERT_ENUM_EQ(PDP_OK, pdp_dist_sampler_create(&a, &sd), pdp_status_name);
    for (i = 0; i < 50; i++) ASSERT_EQ(1 + 2 * i, pdp_dist_sampler_indices(a, NULL)[i]);
    pdp_dist_sampler_free(a);
    sd.rank = 2;
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_dist_sampler_create(&a, &sd), pdp_status_name);
    ASSERT(a == NULL);
    ASSERT(strstr(pdp_last_error(), "rank 2 outside 0..1") != NULL);
    PASS();
}

/* ---- uneven shards: batch_mean ----
   UN rank threads whose shards of each global micro-batch are uneven (5, 3, 2 samples,
   then 2, 4, 1, then 1, 1, 6). Default (PDP_BATCH_MEAN_RANKS): DDP equals one device
   stepping on (1/N) x the sum of the ranks' mean gradients, the mean of per-rank means
   (PyTorch DDP's); PDP_BATCH_MEAN_GLOBAL: one device on the concatenated micro-batches,
   the global batch's mean; 1-3 micro-steps (no_sync), cross-entropy and an own loss
   (log-cosh through pdp_ddp_forward/pdp_ddp_backward), <= 1e-5 relative; the two
   references differ by more than 1e-3. GLOBAL sends exactly one float's all-reduce
   (2 (N-1)/N x 4 bytes, rounded down) more per backward, counted in bytes_sent, and
   allocates nothing after the first step. Misuse: pdp_model_backward on the wrapped
   model under GLOBAL, ranks that disagree on batch_mean, an unknown value. */

#define UN 3
static const int uneven[3][UN] = {{5, 3, 2}, {2, 4, 1}, {1, 1, 6}};

static int uneven_first(int a, int r)
{
    int q, first = 0;
    for (q = 0; q < r; q++) first += uneven[a][q];
    return first;
}

/* One device: GLOBAL, each micro-batch whole; RANKS, each rank's rows on their own (mean
   gradients accumulated), the sum scaled by 1/UN before the step. loss_kind as
   own_loss_pass (0: cross-entropy). */
static pdp_status uneven_single(pdp_batch_mean mean, int accum, int loss_kind, float *params,
                                int64_t *count)
{
    pdp_model *m = NULL;
    pdp_optim *o = NULL;
    pdp_optim_desc od = sgd();
    float x[B * IN], loss;
    int32_t y[B];
    int64_t shape[2] = {0, IN}, i;
    pdp_tensor xt;
    pdp_status st;
    int s, a, r;
    if ((st = build_model(&m, 1, 0)) || (st = pdp_optim_create(&o, m, &od))) goto out;
    for (s = 0; s < STEPS; s++) {
        for (a = 0; a < accum; a++) {
            make_batch(s * accum + a, x, y);
            for (r = 0; r < (mean == PDP_BATCH_MEAN_GLOBAL ? 1 : UN); r++) {
                int first = mean == PDP_BATCH_MEAN_GLOBAL ? 0 : uneven_first(a, r);
                shape[0] = mean == PDP_BATCH_MEAN_GLOBAL ? uneven_first(a, UN) : uneven[a][r];
                pdp_tensor_wrap(x + first * IN, pdp_cpu(), 2, shape, &xt);
                st = loss_kind ? own_loss_pass(loss_kind, m, NULL, &xt, y + first, &loss)
                               : pdp_model_forward_backward(m, &xt, y + first, &loss);
                if (st) goto out;
            }
        }
        if (mean == PDP_BATCH_MEAN_RANKS)
            for (i = 0; i < m->param_count; i++) m->grad_block[i] *= 1.0f / (float)UN;
        if ((st = pdp_optim_step(o))) goto out;
        pdp_model_zero_grad(m);
    }
    memcpy(params, m->param_block, (size_t)m->param_count * sizeof(float));
    *count = m->param_count;
out:
    pdp_optim_free(o);
    pdp_model_free(m);
    return st;
}

typedef struct uneven_job {
    pdp_local_group *g;
    int rank, accum, loss_kind;
    int scenario; /* 0 train; 1 pdp_model_backward under GLOBAL; 2 rank 1 passes the other
                     batch_mean; 3 batch_mean 7 on every rank */
    pdp_batch_mean mean;
    pdp_status st;
    char msg[1024];
    float params[2048];
    int64_t count;
    long allocs_after_first;
    pdp_ddp_stats stats;
} uneven_job;

static void *uneven_rank(void *arg)
{
    uneven_job *j = (uneven_job *)arg;
    pdp_comm *c = NULL;
    pdp_model *m = NULL;
    pdp_optim *o = NULL;
    pdp_ddp *d = NULL;
    pdp_ddp_desc dd;
    pdp_optim_desc od = sgd();
    float x[B * IN], loss;
    int32_t y[B];
    int64_t shape[2] = {0, IN};
    pdp_tensor xt;
    pdp_status st;
    int s, a, r = j->rank;
    memset(&dd, 0, sizeof dd);
    dd.bucket_cap_mb = dd.first_bucket_mb = 1e-9; /* a bucket per parameter */
    dd.batch_mean = j->scenario == 3 ? (pdp_batch_mean)7
                    : j->scenario == 2 && r == 1 ? PDP_BATCH_MEAN_RANKS : j->mean;
    if ((st = pdp_comm_create_local(&c, j->g, r)) || (st = build_model(&m, 1 + 49 * r, 0)) ||
        (st = pdp_optim_create(&o, m, &od)) || (st = pdp_ddp_create(&d, m, c, &dd)))
        goto out;
    for (s = 0; s < STEPS && !st; s++) {
        if (s == 1) j->allocs_after_first = atomic_load(&test_allocs);
        for (a = 0; a < j->accum && !st; a++) {
            int first = uneven_first(a, r);
            make_batch(s * j->accum + a, x, y);
            shape[0] = uneven[a][r];
            pdp_tensor_wrap(x + first * IN, pdp_cpu(), 2, shape, &xt);
            pdp_ddp_set_no_sync(d, a < j->accum - 1);
            st = j->loss_kind ? own_loss_pass(j->loss_kind, m, d, &xt, y + first, &loss)
                              : pdp_ddp_forward_backward(d, &xt, y + first, &loss);
        }
        if (!st) st = pdp_ddp_step(d, o);
    }
    j->allocs_after_first = atomic_load(&test_allocs) - j->allocs_after_first;
    memcpy(j->params, m->param_block, (size_t)m->param_count * sizeof(float));
    j->count = m->param_count;
    pdp_ddp_get_stats(d, &j->stats);
out:
    j->st = st;
    if (st) snprintf(j->msg, sizeof j->msg, "%s", pdp_last_error());
    pdp_ddp_free(d);
    pdp_optim_free(o);
    pdp_model_free(m);
    pdp_comm_free(c);
    return NULL;
}

static void run_uneven(uneven_job *jobs, pdp_batch_mean mean, int accum, int loss_kind,
                       int scenario)
{
    pthread_t t[UN];
    pdp_local_group *g = NULL;
    pdp_comm_desc cd;
    int r;
    memset(&cd, 0, sizeof cd);
    cd.timeout_s = 30.0;
    pdp_local_group_create(&g, UN, &cd);
    for (r = 0; r < UN; r++) {
        memset(&jobs[r], 0, sizeof jobs[r]);
        jobs[r].g = g;
        jobs[r].rank = r;
        jobs[r].accum = accum;
        jobs[r].loss_kind = loss_kind;
        jobs[r].scenario = scenario;
        jobs[r].mean = mean;
        pthread_create(&t[r], NULL, uneven_rank, &jobs[r]);
    }
    for (r = 0; r < UN; r++) pthread_join(t[r], NULL);
    pdp_local_group_free(g);
}

static double max_rel(const float *a, const float *ref, int64_t count)
{
    double worst = 0.0, scale = 0.0;
    int64_t i;
    for (i = 0; i < count; i++) {
        worst = fmax(worst, fabs((double)a[i] - ref[i]));
        scale = fmax(scale, fabs((double)ref[i]));
    }
    return scale > 0.0 ? worst / scale : worst;
}

static enum greatest_test_res check_uneven(int accum, int loss_kind)
{
    static uneven_job ranks[UN], global[UN];
    static float ref_ranks[2048], ref_global[2048];
    static char msg[300];
    int64_t count = 0, count2 = 0, one = (int64_t)(2.0 * (UN - 1) / UN * 4.0);
    double e_ranks, e_global, apart;
    int r;
    ASSERT_ENUM_EQ(PDP_OK, uneven_single(PDP_BATCH_MEAN_RANKS, accum, loss_kind, ref_ranks,
                                         &count), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, uneven_single(PDP_BATCH_MEAN_GLOBAL, accum, loss_kind, ref_global,
                                         &count2), pdp_status_name);
    run_uneven(ranks, PDP_BATCH_MEAN_RANKS, accum, loss_kind, 0);
    run_uneven(global, PDP_BATCH_MEAN_GLOBAL, accum, loss_kind, 0);
    for (r = 0; r < UN; r++) {
        ASSERT_ENUM_EQm(ranks[r].msg, PDP_OK, ranks[r].st, pdp_status_name);
        ASSERT_ENUM_EQm(global[r].msg, PDP_OK, global[r].st, pdp_status_name);
    }
    e_ranks = max_rel(ranks[0].params, ref_ranks, count);
    e_global = max_rel(global[0].params, ref_global, count);
    apart = max_rel(ref_ranks, ref_global, count);
    snprintf(msg, sizeof msg, "accum %d loss %d: |RANKS - mean of rank means| %.3g, |GLOBAL - "
             "global batch| %.3g, references %.3g apart; bytes %lld and %lld", accum, loss_kind,
             e_ranks, e_global, apart, (long long)ranks[0].stats.bytes_sent,
             (long long)global[0].stats.bytes_sent);
    ASSERTm(msg, e_ranks <= 1e-5 && e_global <= 1e-5 && apart > 1e-3);
    for (r = 0; r < UN; r++) {
        ASSERT_MEM_EQm("ranks differ", global[0].params, global[r].params, (size_t)count * 4);
        ASSERT_EQm(msg, ranks[r].stats.bytes_sent + accum * one, global[r].stats.bytes_sent);
        ASSERT_EQ_FMT((long)0, global[r].allocs_after_first, "%ld");
    }
    PASS();
}

TEST ddp_uneven_shards_train_the_mean_batch_mean_says(void)
{
    int accum, kind;
    for (accum = 1; accum <= 3; accum++)
        for (kind = 0; kind <= 2; kind += 2) CHECK_CALL(check_uneven(accum, kind));
    PASS();
}

TEST ddp_batch_mean_misuse_is_refused(void)
{
    static uneven_job jobs[UN];
    int r;
    /* own loss through pdp_model_backward: no weight, refused before anything is reduced */
    run_uneven(jobs, PDP_BATCH_MEAN_GLOBAL, 1, 1, 1);
    for (r = 0; r < UN; r++) {
        ASSERT_ENUM_EQm(jobs[r].msg, PDP_ERR_STATE, jobs[r].st, pdp_status_name);
        ASSERTm(jobs[r].msg, strstr(jobs[r].msg, "batch_mean is PDP_BATCH_MEAN_GLOBAL") &&
                                 strstr(jobs[r].msg, "pdp_ddp_forward_backward or "
                                                     "pdp_ddp_backward"));
    }
    run_uneven(jobs, PDP_BATCH_MEAN_GLOBAL, 1, 0, 2); /* rank 1 passes RANKS */
    for (r = 0; r < UN; r++) {
        ASSERT_ENUM_EQm(jobs[r].msg, PDP_ERR_INVALID, jobs[r].st, pdp_status_name);
        ASSERTm(jobs[r].msg, strstr(jobs[r].msg, "pdp_ddp_create: batch_mean differs across "
                                                 "ranks: 0 on rank 1, 1 on rank 0") != NULL);
    }
    run_uneven(jobs, PDP_BATCH_MEAN_GLOBAL, 1, 0, 3);
    for (r = 0; r < UN; r++) {
        ASSERT_ENUM_EQm(jobs[r].msg, PDP_ERR_INVALID, jobs[r].st, pdp_status_name);
        ASSERTm(jobs[r].msg, strstr(jobs[r].msg, "pdp_ddp_create: batch_mean 7 is not") != NULL);
    }
    PASS();
}

/* ---- wrapped models (issue 21, item 10) ----
   A model held by DDP refuses every call that would change its layout (the buckets are
   planned on it), naming the call and the executor, and stays unchanged: a step after
   the refusals equals one device's bit for bit. A second executor on it (DDP, ZeRO,
   DataParallel) is refused naming both. pdp_ddp_free gives it back: a layer can be added
   and a new DDP wraps the grown model. Before: pdp_model_add_linear returned PDP_OK and
   moved the blocks under the buckets; a second executor was refused only by the grad-hook
   test, and DataParallel not at all. */

static bool has(const char *want)
{
    return strstr(pdp_last_error(), want) != NULL;
}

TEST ddp_wrapped_model_refuses_layout_changes(void)
{
    pdp_local_group *g = NULL, *gt = NULL;
    pdp_comm *c = NULL, *tp = NULL;
    pdp_model *m = NULL, *ref = NULL;
    pdp_optim *o = NULL, *oref = NULL;
    pdp_ddp *d = NULL, *d2 = NULL;
    pdp_zero *z = NULL;
    pdp_dp *dp = NULL;
    pdp_optim_desc od = sgd();
    float x[B * IN], loss, lref;
    int32_t y[B];
    int64_t shape[2] = {B, IN}, count;
    pdp_tensor xt, p, pr;
    int layers;
    ASSERT_ENUM_EQ(PDP_OK, pdp_local_group_create(&g, 1, NULL), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_comm_create_local(&c, g, 0), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_local_group_create(&gt, 1, NULL), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_comm_create_local(&tp, gt, 0), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, build_model(&m, 1, 0), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, build_model(&ref, 1, 0), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_ddp_create(&d, m, c, NULL), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&o, m, &od), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&oref, ref, &od), pdp_status_name);
    layers = pdp_model_num_layers(m);
    count = pdp_model_param_count(m);
    ASSERT_ENUM_EQ(PDP_ERR_STATE, pdp_model_add_linear(m, 7), pdp_status_name);
    ASSERT(has("pdp_model_add_linear: the model is wrapped by DDP (pdp_ddp_create); add layers "
               "before wrapping it"));
    ASSERT_ENUM_EQ(PDP_ERR_STATE, pdp_model_add_relu(m), pdp_status_name);
    ASSERT(has("pdp_model_add_relu: the model is wrapped by DDP"));
    ASSERT_ENUM_EQ(PDP_ERR_STATE, pdp_model_add_layernorm(m, 0.0f), pdp_status_name);
    ASSERT(has("pdp_model_add_layernorm: the model is wrapped by DDP"));
    ASSERT_ENUM_EQ(PDP_ERR_STATE, pdp_model_add_tp_copy(m), pdp_status_name);
    ASSERT(has("pdp_model_add_tp_copy: the model is wrapped by DDP"));
    ASSERT_ENUM_EQ(PDP_ERR_STATE, pdp_model_add_column_parallel_linear(m, 8), pdp_status_name);
    ASSERT(has("pdp_model_add_column_parallel_linear: the model is wrapped by DDP"));
    ASSERT_ENUM_EQ(PDP_ERR_STATE, pdp_model_add_row_parallel_linear(m, 8), pdp_status_name);
    ASSERT(has("pdp_model_add_row_parallel_linear: the model is wrapped by DDP"));
    ASSERT_ENUM_EQ(PDP_ERR_STATE, pdp_model_add_tp_reduce(m), pdp_status_name);
    ASSERT(has("pdp_model_add_tp_reduce: the model is wrapped by DDP"));
    ASSERT_ENUM_EQ(PDP_ERR_STATE, pdp_model_set_tp(m, tp), pdp_status_name);
    ASSERT(has("pdp_model_set_tp: the model is wrapped by DDP (pdp_ddp_create); set the TP "
               "communicator before wrapping it"));
    ASSERT_EQ(NULL, pdp_model_tp(m));
    /* one executor at a time, whichever comes second */
    ASSERT_ENUM_EQ(PDP_ERR_STATE, pdp_ddp_create(&d2, m, c, NULL), pdp_status_name);
    ASSERT(has("pdp_ddp_create: the model is already wrapped by DDP (pdp_ddp_create)"));
    ASSERT_ENUM_EQ(PDP_ERR_STATE, pdp_zero_create(&z, m, c, NULL), pdp_status_name);
    ASSERT(has("pdp_zero_create: the model is already wrapped by DDP (pdp_ddp_create); one "
               "executor holds a model at a time: pdp_ddp_free it before wrapping the model in "
               "ZeRO stage 1 (pdp_zero_create)"));
    ASSERT_ENUM_EQ(PDP_ERR_STATE, pdp_dp_create(&dp, m, NULL), pdp_status_name);
    ASSERT(has("pdp_dp_create: the model is already wrapped by DDP (pdp_ddp_create)"));
    ASSERT(has("DataParallel (pdp_dp_create)"));
    ASSERT(d2 == NULL && z == NULL && dp == NULL);
    ASSERT_EQ(layers, pdp_model_num_layers(m));
    ASSERT_EQ(count, pdp_model_param_count(m));
    /* unchanged: the step still equals one device's, bit for bit */
    make_batch(0, x, y);
    pdp_tensor_wrap(x, pdp_cpu(), 2, shape, &xt);
    ASSERT_ENUM_EQ(PDP_OK, pdp_ddp_forward_backward(d, &xt, y, &loss), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_ddp_step(d, o), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward_backward(ref, &xt, y, &lref), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_step(oref), pdp_status_name);
    pdp_model_flat(m, &p, NULL);
    pdp_model_flat(ref, &pr, NULL);
    ASSERT_MEM_EQ(pr.data, p.data, (size_t)count * sizeof(float));
    /* the caller's again */
    pdp_ddp_free(d);
    pdp_optim_free(o);
    o = NULL;
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_linear(m, 4), pdp_status_name);
    ASSERT_EQ(count + 4 * CLASSES + 4, pdp_model_param_count(m));
    ASSERT_ENUM_EQ(PDP_OK, pdp_ddp_create(&d, m, c, NULL), pdp_status_name);
    ASSERT_EQ(count + 4 * CLASSES + 4, pdp_model_param_count(pdp_ddp_model(d)));
    pdp_ddp_free(d);
    pdp_optim_free(oref);
    pdp_model_free(ref);
    pdp_model_free(m);
    pdp_comm_free(tp);
    pdp_comm_free(c);
    pdp_local_group_free(gt);
    pdp_local_group_free(g);
    PASS();
}

/* ---- the GPT's tied weight ----
   A GPT's head (TiedLinear, the last layer) computes with the Embedding's
   transformer.wte.weight, so backward meets the weight first at the head and last at
   the embedding (layer 0). A spy (per rank thread) on the model's grad hook, its events
   and DDP's collective shows, for GPT_STEPS steps on 2 and 3 ranks with one parameter a
   bucket and with one bucket for all: wte reports its gradient once per backward, after
   layer 0's backward began (never at the head's); the bucket holding it launches once per
   backward, then; and what it launches is this rank's whole local gradient of wte (the
   head's part and the embedding rows'), equal to a plain backward of the rank's shard on
   a copy of the model (<= 1e-6 relative). */
#define GPT_V 13
#define GPT_T 8
#define GPT_SEQ 12
#define GPT_STEPS 3

typedef struct tied_job {
    int n;
    double cap_mb;
    int reports[MAXR][GPT_STEPS];  /* wte's grad hook calls */
    int launches[MAXR][GPT_STEPS]; /* its bucket's collectives */
    int misplaced[MAXR];           /* a report or launch not after layer 0's backward began */
    double worst[MAXR];            /* launched gradient against the plain backward */
} tied_job;

static __thread pdp_grad_hook spy_hook_next;
static __thread void *spy_hook_user;
static __thread pdp__model_event_fn spy_event_next;
static __thread pdp__reduce_fn spy_reduce_next;
static __thread int spy_layer, spy_wte, spy_reports, spy_launches, spy_misplaced;
static __thread float *spy_copy; /* wte's gradient as its bucket launched */

static void spy_hook(void *user, pdp_model *m, int p)
{
    (void)user;
    if (p == spy_wte) {
        spy_reports++;
        spy_misplaced += spy_layer != 0;
    }
    spy_hook_next(spy_hook_user, m, p);
}

static pdp_status spy_event(void *user, pdp_model *m, pdp__model_event ev, int layer,
                            pdp_status st)
{
    if (ev == PDP__EV_BACKWARD_BEGIN) spy_layer = m->nlayers;
    if (ev == PDP__EV_BACKWARD_LAYER) spy_layer = layer;
    return spy_event_next(user, m, ev, layer, st);
}

static pdp_status spy_reduce(pdp__reducer *r, int b, pdp_work **w)
{
    const pdp__param_entry *e = &r->m->params[spy_wte];
    if (b == r->bucket_of[spy_wte]) {
        spy_launches++;
        spy_misplaced += spy_layer != 0;
        memcpy(spy_copy, r->m->grad_block + e->offset, (size_t)e->count * sizeof(float));
    }
    return spy_reduce_next(r, b, w);
}

static pdp_model *tied_gpt(uint64_t seed)
{
    pdp_gpt_desc d;
    pdp_model *m = NULL;
    memset(&d, 0, sizeof d);
    d.vocab = GPT_V, d.context = GPT_T, d.layers = 2, d.heads = 2, d.dim = 16, d.seed = seed;
    return pdp_gpt_create(&m, &d) == PDP_OK ? m : NULL;
}

static pdp_status tied_rank(const pdp_launch_ctx *ctx, void *user)
{
    tied_job *job = (tied_job *)user;
    int r = ctx->rank, local = GPT_SEQ / ctx->world_size, s, i;
    pdp_model *m = tied_gpt(r == 0 ? 11 : 40 + (uint64_t)r), *ref = tied_gpt(11);
    pdp_ddp *d = NULL;
    pdp_optim *o = NULL;
    pdp_optim_desc od;
    pdp_ddp_desc dd;
    int32_t ids[GPT_SEQ * GPT_T], tg[GPT_SEQ * GPT_T];
    int64_t shape[2] = {0, GPT_T};
    pdp_tensor x, pr, gr;
    float loss;
    pdp_status st = PDP_ERR_OUT_OF_MEMORY;
    memset(&od, 0, sizeof od);
    od.kind = PDP_OPTIM_ADAMW;
    od.lr = 0.01f;
    memset(&dd, 0, sizeof dd);
    dd.bucket_cap_mb = dd.first_bucket_mb = job->cap_mb;
    shape[0] = local;
    spy_copy = NULL;
    if (!m || !ref) goto out;
    spy_wte = 0; /* transformer.wte.weight: the Embedding's first parameter */
    if (strcmp(m->params[spy_wte].name, "transformer.wte.weight") != 0) goto out;
    if (!(spy_copy = (float *)malloc((size_t)m->params[spy_wte].count * sizeof(float)))) goto out;
    if ((st = pdp_ddp_create(&d, m, ctx->world, &dd)) != PDP_OK ||
        (st = pdp_optim_create(&o, m, &od)) != PDP_OK)
        goto out;
    spy_hook_next = m->exec_hook, spy_hook_user = m->exec_hook_user;
    m->exec_hook = spy_hook;
    spy_event_next = m->event;
    m->event = spy_event;
    spy_reduce_next = d->r.desc.reduce;
    d->r.desc.reduce = spy_reduce;
    spy_misplaced = 0;
    pdp_model_flat(ref, &pr, &gr);
    pdp_tensor_wrap_ids(ids + r * local * GPT_T, pdp_cpu(), 2, shape, &x);
    for (s = 0; s < GPT_STEPS; s++) {
        for (i = 0; i < GPT_SEQ * GPT_T; i++) { /* one -1 a sequence */
            uint32_t h = (uint32_t)((s * 97 + i) * 2654435761u);
            h ^= h >> 13;
            ids[i] = (int32_t)(h % GPT_V);
            tg[i] = i % GPT_T == (i / GPT_T + s) % GPT_T ? -1 : (int32_t)((h >> 8) % GPT_V);
        }
        memcpy(pr.data, m->param_block, (size_t)pr.count * sizeof(float));
        spy_reports = spy_launches = 0;
        if ((st = pdp_ddp_forward_backward(d, &x, tg + r * local * GPT_T, &loss)) != PDP_OK ||
            (st = pdp_ddp_step(d, o)) != PDP_OK)
            goto out;
        job->reports[r][s] = spy_reports;
        job->launches[r][s] = spy_launches;
        pdp_model_zero_grad(ref);
        if ((st = pdp_model_forward_backward(ref, &x, tg + r * local * GPT_T, &loss)) != PDP_OK)
            goto out;
        job->worst[r] = fmax(job->worst[r], max_rel(spy_copy, gr.data,
                                                    ref->params[spy_wte].count));
    }
    job->misplaced[r] = spy_misplaced;
out:
    free(spy_copy);
    pdp_ddp_free(d);
    pdp_optim_free(o);
    pdp_model_free(m);
    pdp_model_free(ref);
    return st;
}

TEST ddp_tied_weight_bucket_launches_once_after_the_embedding(void)
{
    static const double caps[] = {1e-9, 25.0}; /* a parameter a bucket; one bucket */
    static tied_job job;
    static char msg[200];
    int n, k, r, s;
    for (n = 2; n <= 3; n++)
        for (k = 0; k < 2; k++) {
            memset(&job, 0, sizeof job);
            job.n = n;
            job.cap_mb = caps[k];
            ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_launch(n, NULL, tied_rank, &job),
                            pdp_status_name);
            for (r = 0; r < n; r++) {
                snprintf(msg, sizeof msg, "N %d cap %g rank %d: misplaced %d, launched "
                         "gradient against the plain backward %.3g", n, caps[k], r,
                         job.misplaced[r], job.worst[r]);
                for (s = 0; s < GPT_STEPS; s++) {
                    ASSERT_EQm(msg, 1, job.reports[r][s]);
                    ASSERT_EQm(msg, 1, job.launches[r][s]);
                }
                ASSERT_EQm(msg, 0, job.misplaced[r]);
                ASSERTm(msg, job.worst[r] <= 1e-6);
            }
        }
    PASS();
}

TEST ddp_step_refuses_an_optimizer_of_another_model(void)
{
    /* pdp_ddp_step with an optimizer made on another model stepped that model and zeroed
       the wrapped one's gradients: PDP_OK and no training. Refused now, as pdp_dp_step does,
       before the buckets are waited (the gradients stay for a step with the right one). */
    pdp_local_group *g = NULL;
    pdp_comm *c = NULL;
    pdp_model *m = NULL, *other = NULL;
    pdp_ddp *d = NULL;
    pdp_optim *o_other = NULL, *o = NULL;
    pdp_param before, after;
    float x[4 * IN], loss, w0;
    int32_t y[4] = {0, 1, 2, 0};
    pdp_tensor xt;
    int i;
    for (i = 0; i < 4 * IN; i++) x[i] = (float)((i * 7) % 11) / 11.0f - 0.5f;
    ASSERT_ENUM_EQ(PDP_OK, pdp_local_group_create(&g, 1, NULL), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_comm_create_local(&c, g, 0), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, build_model(&m, 1, 0), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, build_model(&other, 2, 0), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_ddp_create(&d, m, c, NULL), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&o_other, other, NULL), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&o, m, NULL), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_wrap(x, pdp_cpu(), 2, (int64_t[]){4, IN}, &xt),
                   pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_ddp_forward_backward(d, &xt, y, &loss), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_param(m, 0, &before), pdp_status_name);
    w0 = before.value.data[0];
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_ddp_step(d, o_other), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "another model") != NULL);
    ASSERT_ENUM_EQ(PDP_OK, pdp_ddp_step(d, o), pdp_status_name); /* the gradients were kept */
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_param(m, 0, &after), pdp_status_name);
    ASSERT(after.value.data[0] != w0);
    pdp_optim_free(o);
    pdp_optim_free(o_other);
    pdp_ddp_free(d);
    pdp_model_free(other);
    pdp_model_free(m);
    pdp_comm_free(c);
    pdp_local_group_free(g);
    PASS();
}

/* pdp_clip_grad_norm (or pdp_optim_step) on the wrapped model right after the backward, as
   PyTorch's loop clips after loss.backward(): the buckets were still being all-reduced, so it
   read and scaled gradients the progress thread was writing, and pdp_ddp_step then stepped
   with PDP_OK on the local norm's coefficient (2 ranks: parameters off by 5x the reference's
   scale, every rank alike). Refused now until pdp_ddp_finish, as pdp_zero_clip_grad_norm is. */
TEST ddp_clip_and_step_refuse_gradients_still_being_reduced(void)
{
    pdp_local_group *g = NULL;
    pdp_comm *c = NULL;
    pdp_model *m = NULL;
    pdp_ddp *d = NULL;
    pdp_optim *o = NULL;
    float x[4 * IN], loss, norm;
    int32_t y[4] = {0, 1, 2, 0};
    pdp_tensor xt;
    int i;
    for (i = 0; i < 4 * IN; i++) x[i] = (float)((i * 7) % 11) / 11.0f - 0.5f;
    ASSERT_ENUM_EQ(PDP_OK, pdp_local_group_create(&g, 1, NULL), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_comm_create_local(&c, g, 0), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, build_model(&m, 1, 0), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_ddp_create(&d, m, c, NULL), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&o, m, NULL), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_wrap(x, pdp_cpu(), 2, (int64_t[]){4, IN}, &xt),
                   pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_ddp_forward_backward(d, &xt, y, &loss), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_ERR_STATE, pdp_clip_grad_norm(m, 0.01f, &norm), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "pdp_ddp_finish") != NULL);
    ASSERT_ENUM_EQ(PDP_ERR_STATE, pdp_optim_step(o), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "pdp_ddp_finish") != NULL);
    ASSERT_EQ(0, pdp_optim_steps(o));
    ASSERT_ENUM_EQ(PDP_OK, pdp_ddp_finish(d), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_clip_grad_norm(m, 0.01f, &norm), pdp_status_name);
    ASSERT(norm > 0.0f);
    ASSERT_ENUM_EQ(PDP_OK, pdp_ddp_step(d, o), pdp_status_name);
    ASSERT_EQ(1, pdp_optim_steps(o));
    /* under no_sync nothing is in flight: the local sums may be clipped and stepped */
    pdp_ddp_set_no_sync(d, true);
    ASSERT_ENUM_EQ(PDP_OK, pdp_ddp_forward_backward(d, &xt, y, &loss), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_clip_grad_norm(m, 0.01f, &norm), pdp_status_name);
    pdp_ddp_set_no_sync(d, false);
    /* a freed DDP leaves a plain model, even with a backward's buckets unfinished */
    ASSERT_ENUM_EQ(PDP_OK, pdp_ddp_forward_backward(d, &xt, y, &loss), pdp_status_name);
    pdp_ddp_free(d);
    d = NULL;
    ASSERT_ENUM_EQ(PDP_OK, pdp_clip_grad_norm(m, 0.01f, &norm), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_step(o), pdp_status_name);
    pdp_optim_free(o);
    pdp_model_free(m);
    pdp_comm_free(c);
    pdp_local_group_free(g);
    PASS();
}

/* A user's grad hook on a wrapped model (pdp_model_set_grad_hook after pdp_ddp_create): it
   replaced the reducer's, so no bucket launched and pdp_ddp_step stepped each rank's own
   gradient with PDP_OK (the ranks drifted apart), and pdp_ddp_free, seeing another hook, left
   the model's executor seam pointing at the freed reducer (the next backward read it: a use
   after free). Now both run. */
typedef struct user_hook_job {
    int calls[2];
    float params[2][1024];
    int64_t count[2];
    bool seam_left[2];
} user_hook_job;

static void user_hook_count(void *user, pdp_model *m, int p)
{
    (void)m;
    (void)p;
    (*(int *)user)++;
}

static pdp_status user_hook_rank(const pdp_launch_ctx *ctx, void *user)
{
    user_hook_job *j = (user_hook_job *)user;
    int r = ctx->rank, half = B / 2;
    float x[B * IN], loss;
    int32_t y[B];
    pdp_model *m = NULL;
    pdp_ddp *d = NULL;
    pdp_optim *o = NULL;
    pdp_optim_desc od = sgd();
    pdp_tensor xt, p;
    pdp_status st;
    make_batch(0, x, y);
    if ((st = build_model(&m, 1, 0)) != PDP_OK) return st;
    if ((st = pdp_ddp_create(&d, m, ctx->world, NULL)) != PDP_OK) goto out;
    pdp_model_set_grad_hook(m, user_hook_count, &j->calls[r]);
    if ((st = pdp_optim_create(&o, m, &od)) != PDP_OK) goto out;
    pdp_tensor_wrap(x + r * half * IN, pdp_cpu(), 2, (int64_t[]){half, IN}, &xt);
    if ((st = pdp_ddp_forward_backward(d, &xt, y + r * half, &loss)) != PDP_OK ||
        (st = pdp_ddp_step(d, o)) != PDP_OK)
        goto out;
    pdp_ddp_free(d);
    d = NULL;
    j->seam_left[r] = m->event != NULL || m->event_user != NULL;
    if ((st = pdp_model_flat(m, &p, NULL)) != PDP_OK) goto out;
    j->count[r] = p.count;
    if (p.count <= 1024) memcpy(j->params[r], p.data, (size_t)p.count * sizeof(float));
out:
    pdp_optim_free(o);
    pdp_ddp_free(d);
    pdp_model_free(m);
    return st;
}

TEST ddp_user_grad_hook_runs_beside_the_reducer(void)
{
    static user_hook_job j;
    pdp_model *m = NULL;
    int r;
    memset(&j, 0, sizeof j);
    ASSERT_ENUM_EQ(PDP_OK, build_model(&m, 1, 0), pdp_status_name);
    ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_launch(2, NULL, user_hook_rank, &j),
                    pdp_status_name);
    ASSERT(j.count[0] > 0 && j.count[0] <= 1024 && j.count[1] == j.count[0]);
    for (r = 0; r < 2; r++) {
        ASSERT_EQ(pdp_model_num_params(m), j.calls[r]); /* once per parameter */
        ASSERTm("pdp_ddp_free left the model's seam on the freed reducer", !j.seam_left[r]);
    }
    /* the gradients were averaged: both ranks took the same step */
    ASSERT_MEM_EQ(j.params[0], j.params[1], (size_t)j.count[0] * sizeof(float));
    pdp_model_free(m);
    PASS();
}

SUITE(ddp)
{
    RUN_TEST(ddp_equals_single_device_on_the_global_batch);
    RUN_TEST(ddp_own_loss_equals_single_device);
    RUN_TEST(ddp_own_loss_second_backward_is_refused);
    RUN_TEST(ddp_world_size_one_is_plain_training_bit_for_bit);
    RUN_TEST(ddp_buckets_follow_reverse_order_and_caps);
    RUN_TEST(ddp_state_errors);
    RUN_TEST(ddp_buckets_of_unused_parameters_launch_at_the_end_of_backward);
    RUN_TEST(ddp_model_and_comm_are_what_it_wraps);
    RUN_TEST(ddp_param_mismatch_fails_on_every_rank);
    RUN_TEST(ddp_absent_rank_times_out_naming_bucket_and_rank);
    RUN_TEST(ddp_rank_dying_mid_backward_fails_the_others_at_once);
    RUN_TEST(collective_constructors_fail_on_every_rank_when_one_fails);
    RUN_TEST(ddp_wrapped_model_refuses_layout_changes);
    RUN_TEST(ddp_tied_weight_bucket_launches_once_after_the_embedding);
    RUN_TEST(ddp_step_refuses_an_optimizer_of_another_model);
    RUN_TEST(ddp_clip_and_step_refuse_gradients_still_being_reduced);
    RUN_TEST(ddp_user_grad_hook_runs_beside_the_reducer);
}

SUITE(ddp_uneven)
{
    RUN_TEST(ddp_uneven_shards_train_the_mean_batch_mean_says);
    RUN_TEST(ddp_batch_mean_misuse_is_refused);
}

SUITE(comm_hooks)
{
    RUN_TEST(ddp_compress_hooks_match_fp32_within_the_rounding_bound);
    RUN_TEST(ddp_user_hook_replaces_the_allreduce);
    RUN_TEST(ddp_hook_failing_on_one_rank_fails_every_rank_at_that_bucket);
    RUN_TEST(ddp_compress_hook_training_reaches_the_fp32_loss);
    RUN_TEST(ddp_comm_hook_errors);
}

SUITE(reducer)
{
    RUN_TEST(reducer_collective_and_after_step_are_parameters);
}

SUITE(sampler)
{
    RUN_TEST(sampler_shards_are_disjoint_and_padded_like_pytorch);
    RUN_TEST(sampler_set_epoch_reshuffles);
}

GREATEST_MAIN_DEFS();

int main(int argc, char **argv)
{
    GREATEST_MAIN_BEGIN();
    RUN_SUITE(ddp);
    RUN_SUITE(ddp_uneven);
    RUN_SUITE(comm_hooks);
    RUN_SUITE(reducer);
    RUN_SUITE(sampler);
    GREATEST_MAIN_END();
}
