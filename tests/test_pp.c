/* test_pp.c - pipeline parallelism (src/pp.c) on the local backend (thread ranks).

   Equivalence: p stage threads, each holding its stage of the same full model, train
   STEPS steps on the same global batches cut into m micro-batches; every stage's
   parameters must equal, by name, those of one model trained on the whole batches
   (<= 1e-5 relative to the largest parameter). Swept over p = 1..4, m = 1..5 (uneven
   micro-batches included), both schedules, an MLP with Dropout and LayerNorm (the
   dropout keys must follow the single-device run), a CNN cut after a Conv2d (its ReLU
   then starts the next stage) and before a Flatten (a view as a stage's first
   layer), the caller's loss (MSE), and DP x PP: 4 ranks as 2 pipelines of 2 stages
   through pdp_comm_split. pdp_pp_clip_grad_norm against pdp_clip_grad_norm on one
   device (parameters and the norm of every step, clipping active and inactive, 2-4
   stages and DP x PP; a NaN on one stage fails every stage). Also: the schedules'
   action lists, peak activation memory (GPipe holds m micro-batches, 1F1B
   min(p - s, m)), the bytes sent, the bubble figures, balancing, the Chrome trace (one
   lane per stage, F/B events), the hot loop allocating nothing after the first step,
   a caller's loss on a GPT (the reported loss is the sum of its shares),
   and the error paths (among them ranks whose full models differ, an
   optimizer of the full model, a TP model, and a pass that fails on one stage: every
   stage's message names the call, its stage and the action).
   The interleaved schedule (pp_interleaved_*): equal to one device (loss and parameters)
   on a 12-layer MLP with dropout and on a GPT with dropout, p = 2, 3, v = 2, 3, m = p, 2p,
   with clipping and DP x PP; its action lists against lists written out from Megatron's
   rule, with their peak activation bytes; a replay of the runner's waits and batches under
   local/MPI's and NCCL's rules, every schedule over p = 2..8, v = 1..4, m = p..4p
   (deadlock-free; without Megatron's pairs the interleaved lists are not on NCCL, and the
   rule without its 2 (p - s - 1) is not anywhere);
   checkpoints resumed at another stage count; its errors and its stats line. The reports:
   pdp_pp_report's figures and pdp_pp_rank_report's bytes over TP and DP (DP x TP x PP)
   against the test's own counters and the formulas computed here. */

#define _POSIX_C_SOURCE 200809L /* this file includes system headers before pdp.h */
#include "counting_alloc.h"
#define PDP_IMPLEMENTATION
#include "pdp.h"
#include "pdp_test.h"
#include "fixture.h"
#include "test_platform.h"
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAXR 4
#define B 12 /* global batch */
#define STEPS 3
#define MAXF 72 /* floats per input row (the CNN's 2 x 6 x 6) */
#define CLASSES 3

enum { MLP, CNN, REG, DEEP }; /* REG: a regression MLP trained with MSE through desc.loss;
                                DEEP: a 12-layer MLP with two Dropouts (9 pieces and more) */

typedef struct cfg {
    int kind;
    int p, dp;                 /* stages; pipelines (2: DP x PP on p * 2 ranks) */
    int m;
    pdp_pp_schedule schedule;
    int chunks;                /* desc.chunks (interleaved) */
    const int *first;          /* boundaries, or NULL (balanced) */
    pdp_pp_balance balance;
    bool trace;
    bool fail_loss;            /* the last stage's loss fails on micro-batch fail_mb */
    int fail_mb;
    bool fail_late;            /* the failing loss first outlasts the others' timeout */
    bool clip;                 /* pdp_pp_clip_grad_norm(max_norm) before every step */
    float max_norm;
    int poison;                /* 1 + the stage whose first gradient is made NaN before the
                                  first clip (0: none) */
} cfg;

/* ---- models and data ---- */

static int64_t in_features(int kind) { return kind == CNN ? 72 : 20; }

static pdp_status build_model(pdp_model **out, int kind)
{
    pdp_model_desc md;
    pdp_model *m = NULL;
    pdp_status st;
    memset(&md, 0, sizeof md);
    md.seed = 7;
    if (kind == CNN) {
        md.input_shape[0] = 2;
        md.input_shape[1] = 6;
        md.input_shape[2] = 6;
    } else {
        md.input_shape[0] = 20;
    }
    *out = NULL;
    if ((st = pdp_model_create(&m, &md)) != PDP_OK) return st;
    if (kind == MLP)
        st = pdp_model_add_linear(m, 16) || pdp_model_add_relu(m) ||
             pdp_model_add_dropout(m, 0.25f) || pdp_model_add_linear(m, 12) ||
             pdp_model_add_layernorm(m, 0.0f) || pdp_model_add_tanh(m) ||
             pdp_model_add_linear(m, CLASSES) ? PDP_ERR_INVALID : PDP_OK;
    else if (kind == DEEP)
        st = pdp_model_add_linear(m, 16) || pdp_model_add_relu(m) ||
             pdp_model_add_dropout(m, 0.25f) || pdp_model_add_linear(m, 16) ||
             pdp_model_add_layernorm(m, 0.0f) || pdp_model_add_tanh(m) ||
             pdp_model_add_linear(m, 12) || pdp_model_add_gelu(m) ||
             pdp_model_add_dropout(m, 0.1f) || pdp_model_add_linear(m, 12) ||
             pdp_model_add_sigmoid(m) || pdp_model_add_linear(m, CLASSES) ? PDP_ERR_INVALID
                                                                            : PDP_OK;
    else if (kind == CNN) /* 0 Conv2d, 1 ReLU, 2 MaxPool2d, 3 Flatten, 4 Linear */
        st = pdp_model_add_conv2d(m, 4, 3, 1, 1) || pdp_model_add_relu(m) ||
             pdp_model_add_maxpool2d(m, 2, 0) || pdp_model_add_flatten(m) ||
             pdp_model_add_linear(m, CLASSES) ? PDP_ERR_INVALID : PDP_OK;
    else
        st = pdp_model_add_linear(m, 8) || pdp_model_add_gelu(m) || pdp_model_add_linear(m, 8) ||
             pdp_model_add_sigmoid(m) || pdp_model_add_linear(m, 4) ? PDP_ERR_INVALID : PDP_OK;
    if (st != PDP_OK) {
        pdp_model_free(m);
        return st;
    }
    *out = m;
    return PDP_OK;
}

/* Global batch `step`: B rows of f features, labels and regression targets. */
static void make_batch(int step, int64_t f, float *x, int32_t *y, float *target)
{
    int i, j;
    for (i = 0; i < B; i++) {
        for (j = 0; j < f; j++) {
            uint32_t h = (uint32_t)((step * 131 + i) * 2654435761u) ^ (uint32_t)(j * 40503u);
            h ^= h >> 15;
            h *= 0x2c1b3c6du;
            h ^= h >> 12;
            x[i * f + j] = (float)(h & 0xffff) / 65536.0f * 2.0f - 1.0f;
        }
        y[i] = (int32_t)((i * 7 + step) % CLASSES);
        for (j = 0; j < 4; j++) target[i * 4 + j] = (float)((i + j + step) % 5) * 0.25f - 0.5f;
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

static float single_losses[STEPS]; /* train_single_clip's loss of every step */

/* The reference: one model trained on the whole batches, clipped with
   pdp_clip_grad_norm(max_norm) before every step when clip (norms[s]: step s's norm). */
static pdp_status train_single_clip(int kind, bool clip, float max_norm, float *norms,
                                    pdp_model **out)
{
    pdp_model *m = NULL;
    pdp_optim *o = NULL;
    pdp_optim_desc od = sgd();
    float x[B * MAXF], target[B * 4], loss;
    int32_t y[B];
    int64_t f = in_features(kind), shape[4] = {B, 0, 0, 0};
    pdp_tensor xt;
    pdp_status st;
    int s;
    if ((st = build_model(&m, kind)) || (st = pdp_optim_create(&o, m, &od))) goto out;
    if (kind == CNN) shape[1] = 2, shape[2] = 6, shape[3] = 6;
    else shape[1] = f;
    pdp_tensor_wrap(x, pdp_cpu(), kind == CNN ? 4 : 2, shape, &xt);
    for (s = 0; s < STEPS; s++) {
        make_batch(s, f, x, y, target);
        if (kind == REG) {
            const pdp_tensor *yp;
            pdp_tensor t, dy;
            float dbuf[B * 4];
            int64_t ts[2] = {B, 4};
            pdp_tensor_wrap(target, pdp_cpu(), 2, ts, &t);
            pdp_tensor_wrap(dbuf, pdp_cpu(), 2, ts, &dy);
            if ((st = pdp_model_forward(m, &xt, &yp)) || (st = pdp_loss_mse(yp, &t, &loss, &dy)) ||
                (st = pdp_model_backward(m, &dy)))
                goto out;
        } else if ((st = pdp_model_forward_backward(m, &xt, y, &loss))) {
            goto out;
        }
        single_losses[s] = loss;
        if (clip && (st = pdp_clip_grad_norm(m, max_norm, &norms[s]))) goto out;
        if ((st = pdp_optim_step(o))) goto out;
        pdp_model_zero_grad(m);
    }
out:
    pdp_optim_free(o);
    if (st != PDP_OK) pdp_model_free(m), m = NULL;
    *out = m;
    return st;
}

/* ---- rank threads ---- */

typedef struct rank_ctx {
    const cfg *cfg;
    pdp_local_group *g;
    const pdp_model *ref;      /* NULL: no comparison */
    int rank;
    pdp_status st;
    char msg[1024];
    double worst, scale;       /* max |pp - single| and max |single| over this stage */
    int first, last;           /* the stage's layers (interleaved: chunk 0's) */
    int cfirst[4], clast[4];   /* interleaved: each chunk's layers */
    int64_t nparams_seen;
    pdp_pp_stats stats;
    char schedule[256];
    long allocs_after_first;
    float last_loss;
    float losses[STEPS];       /* the last stage's loss of every step */
    float norms[STEPS];        /* pdp_pp_clip_grad_norm's total_norm per step */
    bool grads_kept;           /* poison: the gradients after the failed clip are those before */
    const float *target;       /* REG: this step's targets, [B, 4] */
    int64_t row0;              /* REG: this pipeline's first row */
} rank_ctx;

static pdp_status fail(rank_ctx *ctx, pdp_status st)
{
    if (st != PDP_OK && ctx->st == PDP_OK) {
        ctx->st = st;
        snprintf(ctx->msg, sizeof ctx->msg, "%s", pdp_last_error());
    }
    return st;
}

/* desc.loss for REG: mean squared error over the whole batch, this micro-batch's share. */
static pdp_status mse_share(void *user, const pdp_tensor *y, int64_t first, int64_t total,
                            pdp_tensor *dy, double *loss)
{
    const rank_ctx *ctx = (const rank_ctx *)user;
    int64_t n = y->shape[0], shape[2] = {n, 4}, i;
    float l, share = (float)n / (float)total;
    pdp_tensor t;
    pdp_status st;
    pdp_tensor_wrap((float *)ctx->target + (ctx->row0 + first) * 4, pdp_cpu(), 2, shape, &t);
    if ((st = pdp_loss_mse(y, &t, &l, dy)) != PDP_OK) return st;
    for (i = 0; i < dy->count; i++) dy->data[i] *= share;
    *loss = (double)l * share;
    return PDP_OK;
}

/* desc.loss that fails on micro-batch ctx->cfg->fail_mb and is mse_share elsewhere. */
static pdp_status failing_loss(void *user, const pdp_tensor *y, int64_t first, int64_t total,
                               pdp_tensor *dy, double *loss)
{
    const rank_ctx *ctx = (const rank_ctx *)user;
    int64_t per = total / ctx->cfg->m; /* B divisible by m in the tests that fail */
    if (first == ctx->cfg->fail_mb * per) {
        struct timespec nap = {1, 500000000L}; /* 1.5 s: the others time out meanwhile */
        if (ctx->cfg->fail_late) nanosleep(&nap, NULL);
        return PDP_ERR_NUMERIC;
    }
    return mse_share(user, y, first, total, dy, loss);
}

static void *rank_main(void *arg)
{
    rank_ctx *ctx = (rank_ctx *)arg;
    const cfg *k = ctx->cfg;
    pdp_comm *world = NULL, *pc = NULL, *dc = NULL;
    pdp_model *full = NULL, *m;
    pdp_pp *pp = NULL;
    pdp_optim *o = NULL;
    pdp_optim_desc od = sgd();
    pdp_pp_desc pd;
    float x[B * MAXF], target[B * 4], loss;
    int32_t y[B];
    int64_t f = in_features(k->kind), rows = B / k->dp, row0, shape[4];
    pdp_tensor xt;
    int s, i;
    if (fail(ctx, pdp_comm_create_local(&world, ctx->g, ctx->rank))) return NULL;
    if (k->dp > 1) { /* rank = pipeline * p + stage */
        if (fail(ctx, pdp_comm_split(world, ctx->rank / k->p, ctx->rank, &pc)) ||
            fail(ctx, pdp_comm_split(world, ctx->rank % k->p, ctx->rank, &dc)))
            goto out;
    }
    row0 = k->dp > 1 ? (ctx->rank / k->p) * rows : 0;
    ctx->row0 = row0;
    ctx->target = target;
    memset(&pd, 0, sizeof pd);
    pd.schedule = k->schedule;
    pd.micro_batches = k->m;
    pd.chunks = k->chunks;
    pd.first_layer = k->first;
    pd.balance = k->balance;
    pd.balance_batch = 8;
    pd.dp = dc;
    if (k->kind == REG) pd.loss = k->fail_loss ? failing_loss : mse_share, pd.loss_user = ctx;
    if (fail(ctx, build_model(&full, k->kind)) ||
        fail(ctx, pdp_pp_create(&pp, full, pc ? pc : world, &pd)))
        goto out;
    pdp_model_free(full);
    full = NULL;
    m = pdp_pp_model(pp);
    if (fail(ctx, pdp_optim_create(&o, m, &od)) ||
        fail(ctx, k->chunks > 1 ? pdp_pp_chunk_layers(pp, pdp_pp_stage(pp), 0, &ctx->first,
                                                      &ctx->last)
                                : pdp_pp_stage_layers(pp, pdp_pp_stage(pp), &ctx->first,
                                                      &ctx->last)))
        goto out;
    for (i = 0; i < k->chunks && i < 4; i++)
        if (fail(ctx, pdp_pp_chunk_layers(pp, pdp_pp_stage(pp), i, &ctx->cfirst[i],
                                          &ctx->clast[i])))
            goto out;
    pdp_pp_schedule_str(pp, ctx->schedule, sizeof ctx->schedule);
    shape[0] = rows;
    if (k->kind == CNN) shape[1] = 2, shape[2] = 6, shape[3] = 6;
    else shape[1] = f;
    for (s = 0; s < STEPS; s++) {
        if (s == 1) {
            if (fail(ctx, pdp_comm_barrier(world, NULL))) goto out;
            ctx->allocs_after_first = pdp_test_allocs();
        }
        make_batch(s, f, x, y, target);
        pdp_tensor_wrap(x + row0 * f, pdp_cpu(), k->kind == CNN ? 4 : 2, shape, &xt);
        if (fail(ctx, pdp_pp_forward_backward(pp, &xt, y + row0, &loss))) goto out;
        if (k->poison) { /* one stage's gradient NaN: every stage's clip fails, none scales */
            pdp_tensor g;
            float before[64];
            int64_t n;
            pdp_model_flat(m, NULL, &g);
            n = g.count < 64 ? g.count : 64;
            if (pdp_pp_stage(pp) == k->poison - 1) g.data[0] = NAN;
            memcpy(before, g.data, (size_t)n * sizeof *before);
            fail(ctx, pdp_pp_clip_grad_norm(pp, k->max_norm, &ctx->norms[0]));
            ctx->grads_kept = memcmp(before, g.data, (size_t)n * sizeof *before) == 0;
            goto out;
        }
        if ((k->clip && fail(ctx, pdp_pp_clip_grad_norm(pp, k->max_norm, &ctx->norms[s]))) ||
            fail(ctx, pdp_pp_step(pp, o)))
            goto out;
        ctx->last_loss = ctx->losses[s] = loss;
    }
    if (fail(ctx, pdp_comm_barrier(world, NULL))) goto out;
    ctx->allocs_after_first = pdp_test_allocs() - ctx->allocs_after_first;
    pdp_pp_get_stats(pp, &ctx->stats);
    if (ctx->ref) { /* every parameter of this stage against the reference, by name */
        for (i = 0; i < pdp_model_num_params(m); i++) {
            pdp_param a, r;
            int64_t e;
            if (fail(ctx, pdp_model_param(m, i, &a)) ||
                fail(ctx, pdp_model_find_param(ctx->ref, a.name, &r)))
                goto out;
            if (a.value.count != r.value.count) {
                fail(ctx, PDP_ERR_SHAPE);
                goto out;
            }
            for (e = 0; e < a.value.count; e++)
                ctx->worst = fmax(ctx->worst, fabs((double)a.value.data[e] - r.value.data[e]));
            ctx->nparams_seen++;
        }
    }
out:
    pdp_optim_free(o);
    pdp_pp_free(pp);
    pdp_model_free(full);
    pdp_comm_free(dc);
    pdp_comm_free(pc);
    pdp_comm_free(world);
    return NULL;
}

static rank_ctx ctxs[MAXR];

static void run_ranks(const cfg *k, const pdp_model *ref, double timeout_s)
{
    pthread_t t[MAXR];
    pdp_local_group *g = NULL;
    pdp_comm_desc cd;
    int r, n = k->p * k->dp;
    memset(&cd, 0, sizeof cd);
    cd.timeout_s = timeout_s;
    cd.name = "pp";
    memset(ctxs, 0, sizeof ctxs);
    pdp_local_group_create(&g, n, &cd);
    for (r = 0; r < n; r++) {
        ctxs[r].cfg = k;
        ctxs[r].g = g;
        ctxs[r].ref = ref;
        ctxs[r].rank = r;
        pthread_create(&t[r], NULL, rank_main, &ctxs[r]);
    }
    for (r = 0; r < n; r++) pthread_join(t[r], NULL);
    pdp_local_group_free(g);
}

static double max_abs_param(const pdp_model *m)
{
    pdp_tensor p;
    double s = 0.0;
    int64_t i;
    pdp_model_flat(m, &p, NULL);
    for (i = 0; i < p.count; i++) s = fmax(s, fabs((double)p.data[i]));
    return s;
}

/* Trains cfg k and compares every stage with the single-device reference (and, with
   k->clip, every rank's reported norms with the reference's). */
static enum greatest_test_res check_equivalence(const cfg *k)
{
    pdp_model *ref = NULL;
    int r, n = k->p * k->dp, covered = 0, s;
    double scale;
    float ref_norms[STEPS];
    ASSERT_ENUM_EQ(PDP_OK, train_single_clip(k->kind, k->clip, k->max_norm, ref_norms, &ref),
                   pdp_status_name);
    scale = max_abs_param(ref);
    run_ranks(k, ref, 30.0);
    for (r = 0; r < n; r++) {
        if (ctxs[r].st != PDP_OK)
            fprintf(stderr, "kind %d p %d dp %d m %d %s: rank %d: %s\n", k->kind, k->p, k->dp,
                    k->m, k->schedule == PDP_PP_GPIPE ? "gpipe" : "1f1b", r, ctxs[r].msg);
        ASSERT_ENUM_EQm(ctxs[r].msg, PDP_OK, ctxs[r].st, pdp_status_name);
        if (ctxs[r].worst > 1e-5 * scale) {
            fprintf(stderr, "kind %d p %d dp %d m %d %s: stage of rank %d (layers %d..%d): max "
                    "|pp - single| %g, max |single| %g\n", k->kind, k->p, k->dp, k->m,
                    k->schedule == PDP_PP_GPIPE ? "gpipe" : "1f1b", r, ctxs[r].first,
                    ctxs[r].last - 1, ctxs[r].worst, scale);
            pdp_model_free(ref);
            FAILm("a stage's parameters differ from single-device training on the whole batch");
        }
        ASSERT_EQ_FMT((long)0, ctxs[r].allocs_after_first, "%ld");
        for (s = 0; k->clip && s < STEPS; s++) {
            /* every stage of every pipeline holds the same norm, the single-device one */
            if (fabs((double)ctxs[r].norms[s] - ref_norms[s]) > 1e-6 * ref_norms[s])
                fprintf(stderr, "kind %d p %d dp %d m %d %s max_norm %g: rank %d step %d: norm "
                        "%.9g, single device %.9g\n", k->kind, k->p, k->dp, k->m,
                        k->schedule == PDP_PP_GPIPE ? "gpipe" : "1f1b", (double)k->max_norm, r,
                        s, (double)ctxs[r].norms[s], (double)ref_norms[s]);
            ASSERT(fabs((double)ctxs[r].norms[s] - ref_norms[s]) <= 1e-6 * ref_norms[s]);
            ASSERT_EQ(ctxs[0].norms[s], ctxs[r].norms[s]);
        }
        ASSERT_EQ(STEPS, (int)ctxs[r].stats.steps);
        if (r < k->p) covered += (int)ctxs[r].nparams_seen;
    }
    ASSERT_EQ(pdp_model_num_params(ref), covered); /* the stages hold every parameter once */
    pdp_model_free(ref);
    PASS();
}

/* ---- equivalence ---- */

TEST pp_gpipe_and_1f1b_equal_single_device_on_the_whole_batch(void)
{
    cfg k;
    int p, m, sch;
    memset(&k, 0, sizeof k);
    k.kind = MLP;
    k.dp = 1;
    for (sch = 0; sch < 2; sch++)
        for (p = 1; p <= MAXR; p++)
            for (m = 1; m <= 5; m++) {
                k.p = p;
                k.m = m;
                k.schedule = sch ? PDP_PP_GPIPE : PDP_PP_1F1B;
                CHECK_CALL(check_equivalence(&k));
            }
    PASS();
}

TEST pp_cnn_cut_after_conv_and_before_flatten(void)
{
    static const int cuts[][3] = {{0, 1, 0}, {0, 3, 0}, {0, 1, 3}, {0, 2, 4}};
    static const int np[] = {2, 2, 3, 3};
    cfg k;
    size_t c;
    int sch;
    memset(&k, 0, sizeof k);
    k.kind = CNN;
    k.dp = 1;
    k.m = 3;
    for (c = 0; c < sizeof np / sizeof *np; c++)
        for (sch = 0; sch < 2; sch++) {
            k.p = np[c];
            k.first = cuts[c];
            k.schedule = sch ? PDP_PP_GPIPE : PDP_PP_1F1B;
            CHECK_CALL(check_equivalence(&k));
        }
    PASS();
}

TEST pp_callers_loss_mse(void)
{
    cfg k;
    int p;
    memset(&k, 0, sizeof k);
    k.kind = REG;
    k.dp = 1;
    k.m = 4;
    for (p = 2; p <= 3; p++) {
        k.p = p;
        CHECK_CALL(check_equivalence(&k));
    }
    PASS();
}

TEST pp_2d_dp_x_pp_equals_single_device(void)
{
    cfg k;
    int sch;
    memset(&k, 0, sizeof k);
    k.kind = MLP;
    k.p = 2;
    k.dp = 2;
    k.m = 3;
    for (sch = 0; sch < 2; sch++) {
        k.schedule = sch ? PDP_PP_GPIPE : PDP_PP_1F1B;
        CHECK_CALL(check_equivalence(&k));
    }
    PASS();
}

/* ---- gradient clipping across the stages ---- */

/* pdp_pp_clip_grad_norm before every step equals pdp_clip_grad_norm on one device: the
   parameters after STEPS steps and the norm reported at every step, on every stage,
   with clipping active at every step (max_norm below every norm) and inactive (above
   every norm), GPipe and 1F1B on 2-4 stages, uneven micro-batches, and DP x PP. */
TEST pp_clip_grad_norm_equals_single_device_clipping(void)
{
    pdp_model *ref = NULL;
    float norms[STEPS], lo, hi;
    cfg k;
    int p, sch, act, s, mi;
    static const int ms[] = {3, 4};
    ASSERT_ENUM_EQ(PDP_OK, train_single_clip(MLP, true, FLT_MAX, norms, &ref), pdp_status_name);
    pdp_model_free(ref);
    lo = hi = norms[0];
    for (s = 1; s < STEPS; s++) lo = fminf(lo, norms[s]), hi = fmaxf(hi, norms[s]);
    memset(&k, 0, sizeof k);
    k.kind = MLP;
    k.clip = true;
    for (act = 0; act < 2; act++) {
        k.max_norm = act ? 0.3f * lo : 2.0f * hi;
        /* the reference clips at every step, or never */
        ASSERT_ENUM_EQ(PDP_OK, train_single_clip(MLP, true, k.max_norm, norms, &ref),
                       pdp_status_name);
        pdp_model_free(ref);
        for (s = 0; s < STEPS; s++) ASSERT(act ? norms[s] > k.max_norm : norms[s] < k.max_norm);
        for (sch = 0; sch < 2; sch++) {
            k.schedule = sch ? PDP_PP_GPIPE : PDP_PP_1F1B;
            k.dp = 1;
            for (p = 2; p <= MAXR; p++)
                for (mi = 0; mi < 2; mi++) {
                    k.p = p;
                    k.m = ms[mi];
                    CHECK_CALL(check_equivalence(&k));
                }
            k.p = 2; /* DP x PP: 2 pipelines of 2 stages */
            k.dp = 2;
            k.m = 3;
            CHECK_CALL(check_equivalence(&k));
        }
    }
    PASS();
}

/* A NaN gradient on one stage: every stage's pdp_pp_clip_grad_norm fails with
   PDP_ERR_NUMERIC (the same norm everywhere, so no stage steps while another stops) and
   no stage scales its gradients. */
TEST pp_clip_grad_norm_nan_fails_on_every_stage(void)
{
    cfg k;
    int r, poison;
    memset(&k, 0, sizeof k);
    k.kind = MLP;
    k.dp = 1;
    k.p = 3;
    k.m = 3;
    k.max_norm = 1e-3f; /* would scale every stage if the norm were finite */
    for (poison = 1; poison <= 3; poison += 2) {
        k.poison = poison;
        run_ranks(&k, NULL, 10.0);
        for (r = 0; r < k.p; r++) {
            ASSERT_ENUM_EQm(ctxs[r].msg, PDP_ERR_NUMERIC, ctxs[r].st, pdp_status_name);
            ASSERT(strstr(ctxs[r].msg, "pdp_pp_clip_grad_norm") == ctxs[r].msg);
            ASSERT(strstr(ctxs[r].msg, "the gradient norm over the 3 stages is") != NULL);
            ASSERT(isnan(ctxs[r].norms[0]));
            ASSERT(ctxs[r].grads_kept);
        }
    }
    PASS();
}

/* ---- schedules, memory, bytes, bubble ---- */

TEST pp_schedules_memory_and_bytes(void)
{
    static const int ms[] = {1, 2, 4, 8};
    static const int64_t out_of[] = {16, 16, 16, 12, 12, 12, 3}; /* per layer of the MLP */
    static const int64_t in_of[] = {20, 16, 16, 16, 12, 12, 12};
    cfg k;
    size_t i;
    int sch, s, p = 4;
    memset(&k, 0, sizeof k);
    k.kind = MLP;
    k.dp = 1;
    k.p = p;
    for (sch = 0; sch < 2; sch++)
        for (i = 0; i < sizeof ms / sizeof *ms; i++) {
            k.m = ms[i];
            k.schedule = sch ? PDP_PP_GPIPE : PDP_PP_1F1B;
            run_ranks(&k, NULL, 30.0);
            for (s = 0; s < p; s++) {
                const pdp_pp_stats *st = &ctxs[s].stats;
                int want = sch ? k.m : (p - s < k.m ? p - s : k.m);
                int64_t bytes = 4 * B * ((s < p - 1 ? out_of[ctxs[s].last - 1] : 0) +
                                         (s > 0 ? in_of[ctxs[s].first] : 0));
                ASSERT_ENUM_EQm(ctxs[s].msg, PDP_OK, ctxs[s].st, pdp_status_name);
                /* GPipe holds all m micro-batches, 1F1B at most p - s (<= p) */
                if (want != st->peak_in_flight)
                    fprintf(stderr, "sch %d m %d stage %d: %s\n", sch, k.m, s, ctxs[s].schedule);
                ASSERT_EQ_FMT(want, st->peak_in_flight, "%d");
                ASSERT(st->activation_bytes > 0);
                ASSERT_EQ(st->peak_activation_bytes, st->peak_in_flight * st->activation_bytes);
                ASSERT_EQ_FMT((long long)bytes, (long long)st->bytes_sent, "%lld");
                ASSERT(st->bubble >= 0.0 && st->bubble <= 1.0);
                ASSERT(fabs(st->bubble_theory - 3.0 / (k.m + 3.0)) < 1e-12);
                ASSERT(st->compute_s > 0.0 && st->compute_s <= st->step_s);
                ASSERT(st->total_step_s >= st->step_s);
            }
        }
    PASS();
}

TEST pp_schedule_lists(void)
{
    cfg k;
    memset(&k, 0, sizeof k);
    k.kind = MLP;
    k.dp = 1;
    k.p = 2;
    k.m = 4;
    k.schedule = PDP_PP_1F1B;
    run_ranks(&k, NULL, 30.0);
    ASSERT_STR_EQ("F0 F1 B0 F2 B1 F3 B2 B3", ctxs[0].schedule);
    ASSERT_STR_EQ("F0 B0 F1 B1 F2 B2 F3 B3", ctxs[1].schedule);
    k.schedule = PDP_PP_GPIPE;
    run_ranks(&k, NULL, 30.0);
    ASSERT_STR_EQ("F0 F1 F2 F3 B0 B1 B2 B3", ctxs[0].schedule);
    ASSERT_STR_EQ("F0 F1 F2 F3 B0 B1 B2 B3", ctxs[1].schedule);
    PASS();
}

/* ---- balancing ---- */

TEST pp_balance_by_parameters_and_by_time(void)
{
    cfg k;
    int s, p;
    memset(&k, 0, sizeof k);
    k.kind = MLP;
    k.dp = 1;
    k.m = 2;
    /* parameters per layer 336, 0, 0, 204, 24, 0, 39: two stages cut before layer 3 (the
       later of the equal cuts, so ReLU and Dropout stay with their Linear) */
    k.p = 2;
    CHECK_CALL(check_equivalence(&k));
    ASSERT_EQ(0, ctxs[0].first);
    ASSERT_EQ(3, ctxs[0].last);
    ASSERT_EQ(3, ctxs[1].first);
    ASSERT_EQ(7, ctxs[1].last);
    /* by measured time: any contiguous split, the same on every rank, still exact */
    k.balance = PDP_PP_BALANCE_TIME;
    for (p = 2; p <= 4; p++) {
        k.p = p;
        CHECK_CALL(check_equivalence(&k));
        ASSERT_EQ(0, ctxs[0].first);
        for (s = 1; s < p; s++) {
            ASSERT_EQ(ctxs[s - 1].last, ctxs[s].first);
            ASSERT(ctxs[s].first < ctxs[s].last);
        }
        ASSERT_EQ(7, ctxs[p - 1].last);
    }
    PASS();
}

/* The split pp.h's rule picks, by brute force: every split of layers [0, n) into p
   stages is enumerated (cuts[0..p-1), increasing); the optimum is the least largest
   stage; of the optimal splits, the one whose last stage starts latest, the layers
   before it split by the same rule into p - 1 stages. */
static double largest_stage(const double *cost, int n, int p, const int *cuts)
{
    double worst = 0.0, sum;
    int s, i;
    for (s = 0; s < p; s++) {
        int lo = s ? cuts[s - 1] : 0, hi = s + 1 < p ? cuts[s] : n;
        for (sum = 0.0, i = lo; i < hi; i++) sum += cost[i];
        worst = sum > worst ? sum : worst;
    }
    return worst;
}

/* the least largest stage of [0, n) in p stages, and the latest start of the last stage
   among the splits reaching it (every (p-1)-subset of 1..n-1, in increasing order) */
static double brute_optimum(const double *cost, int n, int p, int *last_start)
{
    int cuts[8], s;
    double best = HUGE_VAL, v;
    *last_start = 0;
    if (p == 1) return largest_stage(cost, n, 1, NULL); /* one stage reads no cut */
    for (s = 0; s < p - 1; s++) cuts[s] = s + 1;
    for (;;) {
        v = largest_stage(cost, n, p, cuts);
        if (v < best || (v == best && cuts[p - 2] > *last_start))
            best = v, *last_start = cuts[p - 2];
        for (s = p - 2; s >= 0 && cuts[s] == n - (p - 1 - s); s--) {}
        if (s < 0) break;
        for (cuts[s]++, s++; s < p - 1; s++) cuts[s] = cuts[s - 1] + 1;
    }
    return best;
}

static void brute_split(const double *cost, int n, int p, int *first)
{
    int k, start;
    first[0] = 0;
    for (k = p; k > 1; k--) { /* the last stage's start, then the layers before it */
        brute_optimum(cost, n, k, &start);
        first[k - 1] = start;
        n = start;
    }
}

/* The work estimate of one layer of the test models, from its shapes by hand: a GEMM
   2 k n a row (forward, weight gradient, input gradient but at layer 0), the bias 2 n;
   element-wise kinds their operations per element (forward, gradients), as pp.h says */
static double work_of(const pdp_model *m, int i)
{
    const char *kind = pdp_model_layer_name(m, i);
    double nin = (double)m->layers[i].in_count, nout = (double)m->layers[i].out_count;
    if (!strcmp(kind, "Linear")) return (i ? 6.0 : 4.0) * nin * nout + 2.0 * nout;
    if (!strcmp(kind, "Conv2d")) /* the test CNN's 3x3 kernels over 2 channels */
        return (i ? 6.0 : 4.0) * nout * 2 * 9 + 2.0 * nout;
    if (!strcmp(kind, "MaxPool2d")) return nout * (4.0 + (i ? 1 : 0)); /* 2x2 */
    if (!strcmp(kind, "ReLU")) return nin * (i ? 2.0 : 1.0);
    if (!strcmp(kind, "Dropout")) return nin * (i ? 3.0 : 2.0);
    if (!strcmp(kind, "LayerNorm")) return nin * (i ? 19.0 : 11.0);
    if (!strcmp(kind, "Tanh")) return nin * (i ? 4.0 : 1.0);
    if (!strcmp(kind, "GELU")) return nin * (i ? 28.0 : 9.0);
    if (!strcmp(kind, "Sigmoid")) return nin * (i ? 7.0 : 4.0);
    return 0.0; /* Flatten: a view */
}

TEST pp_balance_matches_brute_force(void)
{
    double cost[9];
    int n, p, trial, i, got[8], want[8];
    uint64_t r = 12345;
    for (trial = 0; trial < 300; trial++)
        for (n = 1; n <= 9; n++)
            for (p = 1; p <= n && p <= 5; p++) {
                /* small integers: many ties; sometimes zeros (views) */
                for (i = 0; i < n; i++) {
                    r = r * 6364136223846793005ull + 1442695040888963407ull;
                    cost[i] = (double)((r >> 33) % (trial % 3 == 0 ? 3u : 50u));
                }
                ASSERT_ENUM_EQ(PDP_OK, pdp__pp_balance(cost, NULL, n, p, got), pdp_status_name);
                brute_split(cost, n, p, want);
                for (i = 0; i < p; i++)
                    if (got[i] != want[i]) {
                        fprintf(stderr, "n %d p %d: stage %d starts at %d, brute force %d\n",
                                n, p, i, got[i], want[i]);
                        FAILm("the balanced split is not pp.h's rule's");
                    }
            }
    PASS();
}

TEST pp_balance_by_work(void)
{
    cfg k;
    pdp_model *m;
    double cost[16], lib[16];
    int kind, p, s, i, want[8];
    /* through pdp_pp_create: the stages of each test model match the brute-force split of
       the hand-computed work, and train as one device does */
    for (kind = MLP; kind <= REG; kind++)
        for (p = 2; p <= 4; p++) {
            ASSERT_ENUM_EQ(PDP_OK, build_model(&m, kind), pdp_status_name);
            for (i = 0; i < pdp_model_num_layers(m); i++) cost[i] = work_of(m, i);
            if (kind != REG) /* the pipeline's cross-entropy: 6 a logit, on the last layer */
                cost[i - 1] += 6.0 * (double)m->layers[i - 1].out_count;
            brute_split(cost, pdp_model_num_layers(m), p, want);
            pdp_model_free(m);
            memset(&k, 0, sizeof k);
            k.kind = kind, k.dp = 1, k.m = 2, k.p = p, k.balance = PDP_PP_BALANCE_WORK;
            CHECK_CALL(check_equivalence(&k));
            for (s = 0; s < p; s++) {
                ASSERT_EQ_FMT(want[s], ctxs[s].first, "%d");
                ASSERT_EQ(s, ctxs[s].stats.stage); /* pdp_pp_get_stats says where it is */
                ASSERT_EQ(p, ctxs[s].stats.stages);
                ASSERT_EQ(2, ctxs[s].stats.micro_batches);
            }
        }
    /* examples/train_pp.c's MLP 784-512x2-10 on 2 stages and 784-512x4-10 on 3: the splits
       its own work balance printed before (stage 0: layers 0..0 | 0..1 2..4 5..8) */
    for (p = 2; p <= 3; p++) {
        pdp_model_desc md;
        int first[4];
        memset(&md, 0, sizeof md);
        md.input_shape[0] = 784;
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_create(&m, &md), pdp_status_name);
        for (i = 0; i < (p == 2 ? 2 : 4); i++) {
            ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_linear(m, 512), pdp_status_name);
            ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_relu(m), pdp_status_name);
        }
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_linear(m, 10), pdp_status_name);
        for (i = 0; i < pdp_model_num_layers(m); i++) cost[i] = work_of(m, i);
        cost[i - 1] += 6.0 * 10; /* the cross-entropy's 6 a logit */
        pdp__pp_layer_costs(m, PDP_PP_BALANCE_WORK, true, lib); /* the library's own costs */
        for (i = 0; i < pdp_model_num_layers(m); i++) ASSERT_EQ(cost[i], lib[i]);
        ASSERT_ENUM_EQ(PDP_OK, pdp__pp_balance(cost, NULL, pdp_model_num_layers(m), p, first),
                       pdp_status_name);
        ASSERT_EQ(0, first[0]);
        ASSERT_EQ(p == 2 ? 1 : 2, first[1]);
        if (p == 3) ASSERT_EQ(5, first[2]);
        pdp_model_free(m);
    }
    PASS();
}

TEST pp_stats_format_reads_the_figures(void)
{
    pdp_pp_stats st;
    char line[512];
    memset(&st, 0, sizeof st);
    /* stage 1 of 4, m = 8: bubble 1 - 1.5 / 2 = 0.25 against 3 / 11 = 0.27 (met); one
       micro-batch's activations 1 MB, 3 held (1F1B: min(4 - 1, 8) = 3), GPipe 8 */
    st.stage = 1, st.stages = 4, st.micro_batches = 8, st.schedule = PDP_PP_1F1B;
    st.total_step_s = 2.0, st.total_compute_s = 1.5, st.bubble_theory = 3.0 / 11.0;
    st.peak_in_flight = 3, st.activation_bytes = 1000000, st.peak_activation_bytes = 3000000;
    ASSERT_EQ(pdp_pp_stats_format(&st, NULL, 0), pdp_pp_stats_format(&st, line, sizeof line));
    ASSERT_STR_EQ("stage 1: compute 1.50 s  bubble 0.25 (formula (p-1)/(m+p-1) = 0.27, margin "
                  "0.10: met)  peak activations 3 micro-batches = 3.00 MB  (1f1b: 1F1B min(p-s, "
                  "m) = 3 = 3.00 MB, GPipe m = 8 = 8.00 MB)\n", line);
    st.total_compute_s = 1.0; /* bubble 0.50: missed */
    pdp_pp_stats_format(&st, line, sizeof line);
    ASSERT(strstr(line, "bubble 0.50 (formula (p-1)/(m+p-1) = 0.27, margin 0.10: missed)"));
    ASSERT_EQ(0, pdp_pp_stats_format(NULL, line, sizeof line));
    PASS();
}

/* ---- trace ---- */

static int count_of(const char *hay, const char *needle)
{
    int n = 0;
    for (; (hay = strstr(hay, needle)) != NULL; hay++) n++;
    return n;
}

TEST pp_trace_draws_one_lane_per_stage(void)
{
    char path[256], *text;
    FILE *f;
    long len;
    cfg k;
    memset(&k, 0, sizeof k);
    k.kind = MLP;
    k.dp = 1;
    k.p = 2;
    k.m = 4;
    snprintf(path, sizeof path, "/tmp/pdp_test_pp_%ld.json", (long)getpid());
    setenv("PDP_TRACE", path, 1);
    run_ranks(&k, NULL, 30.0);
    unsetenv("PDP_TRACE");
    ASSERT_ENUM_EQm(ctxs[0].msg, PDP_OK, ctxs[0].st, pdp_status_name);
    ASSERT_ENUM_EQm(ctxs[1].msg, PDP_OK, ctxs[1].st, pdp_status_name);
    f = fopen(path, "rb");
    ASSERT(f != NULL);
    fseek(f, 0, SEEK_END);
    len = ftell(f);
    fseek(f, 0, SEEK_SET);
    text = (char *)calloc((size_t)len + 1, 1);
    ASSERT(text && fread(text, 1, (size_t)len, f) == (size_t)len);
    fclose(f);
    remove(path);
    ASSERT(strstr(text, "\"pipeline stage 0\"") != NULL);
    ASSERT(strstr(text, "\"pipeline stage 1\"") != NULL);
    /* every action of every step on both stages: STEPS x m forwards and backwards each */
    ASSERT_EQ(2 * STEPS * 4, count_of(text, "\"name\":\"F"));
    ASSERT_EQ(2 * STEPS * 4, count_of(text, "\"name\":\"B"));
    ASSERT(strstr(text, "\"name\":\"F3\"") != NULL && strstr(text, "\"name\":\"B3\"") != NULL);
    free(text);
    PASS();
}

/* ---- errors ---- */

typedef struct err_ctx {
    pdp_local_group *g;
    int rank, layers;
    uint64_t seed;             /* the full model's */
    pdp_pp_desc desc;
    pdp_status st;
    char msg[1024];
} err_ctx;

static void *err_main(void *arg)
{
    err_ctx *e = (err_ctx *)arg;
    pdp_comm *c = NULL;
    pdp_model *full = NULL;
    pdp_model_desc md;
    pdp_pp *pp = NULL;
    int i;
    memset(&md, 0, sizeof md);
    md.input_shape[0] = 4;
    md.seed = e->seed;
    pdp_comm_create_local(&c, e->g, e->rank);
    pdp_model_create(&full, &md);
    for (i = 0; i < e->layers; i++) pdp_model_add_linear(full, 4);
    e->st = pdp_pp_create(&pp, full, c, &e->desc);
    snprintf(e->msg, sizeof e->msg, "%s", pdp_last_error());
    pdp_pp_free(pp);
    pdp_model_free(full);
    pdp_comm_free(c);
    return NULL;
}

static void run_err(int n, err_ctx *e)
{
    pthread_t t[MAXR];
    pdp_local_group *g = NULL;
    pdp_comm_desc cd;
    int r;
    memset(&cd, 0, sizeof cd);
    cd.timeout_s = 10.0;
    pdp_local_group_create(&g, n, &cd);
    for (r = 0; r < n; r++) {
        e[r].g = g;
        e[r].rank = r;
        pthread_create(&t[r], NULL, err_main, &e[r]);
    }
    for (r = 0; r < n; r++) pthread_join(t[r], NULL);
    pdp_local_group_free(g);
}

/* pdp_pp_create refused on rank 1 alone (its micro_batches), rank 1 returning last:
   pdp_launch names rank 1's reason, not rank 0's "rank 1 failed" (whose mark of a peer's
   failure the pipeline's clean-up dropped when it kept the message). */
static pdp_status pp_late_failure(const pdp_launch_ctx *ctx, void *user)
{
    pdp_model *full = NULL;
    pdp_pp *pp = NULL;
    pdp_pp_desc pd;
    pdp_status st;
    (void)user;
    if ((st = build_model(&full, MLP)) != PDP_OK) return st;
    memset(&pd, 0, sizeof pd);
    if (ctx->rank == 1) pd.micro_batches = -1;
    st = pdp_pp_create(&pp, full, ctx->world, &pd);
    if (ctx->rank == 1) {
        struct timespec nap = {0, 200000000L}; /* 0.2 s: rank 0 returns first */
        nanosleep(&nap, NULL);
    }
    pdp_pp_free(pp);
    pdp_model_free(full);
    return st;
}

TEST pp_errors(void)
{
    static const int cut1[] = {0, 1}, cut2[] = {0, 2}, bad[] = {0, 0}, late[] = {0, 3};
    err_ctx e[2];
    pdp_local_group *g = NULL;
    pdp_comm *c = NULL;
    pdp_model *full = NULL;
    pdp_pp *pp = NULL;
    pdp_pp_desc pd;
    pdp_tensor xt;
    float x[B * 20], target[B * 4], loss;
    int32_t y[B];
    int64_t shape[2] = {3, 20};
    /* fewer layers than stages */
    memset(e, 0, sizeof e);
    e[0].layers = e[1].layers = 1;
    run_err(2, e);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, e[0].st, pdp_status_name);
    ASSERT(strstr(e[0].msg, "pdp_pp_create: 2 stages but the model has 1 layers") != NULL);
    /* boundaries out of order */
    memset(e, 0, sizeof e);
    e[0].layers = e[1].layers = 3;
    e[0].desc.first_layer = e[1].desc.first_layer = bad;
    run_err(2, e);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, e[1].st, pdp_status_name);
    ASSERT(strstr(e[1].msg, "first_layer[1] is 0: it must be above first_layer[0] = 0") != NULL);
    /* a boundary that leaves the last piece no layer */
    memset(e, 0, sizeof e);
    e[0].layers = e[1].layers = 3;
    e[0].desc.first_layer = e[1].desc.first_layer = late;
    run_err(2, e);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, e[1].st, pdp_status_name);
    ASSERT(strstr(e[1].msg, "first_layer[1] is 3: it must be above first_layer[0] = 0 and at "
                  "most 2 (3 layers, at least one for each of the 1 pieces from it)") != NULL);
    /* boundaries that differ across ranks: both fail, naming the stage */
    memset(e, 0, sizeof e);
    e[0].layers = e[1].layers = 3;
    e[0].desc.first_layer = cut1;
    e[1].desc.first_layer = cut2;
    run_err(2, e);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, e[1].st, pdp_status_name);
    ASSERT(strstr(e[1].msg, "stage 1 starts at layer 2 here but at layer 1 on rank 0") != NULL);
    /* a rank whose full model was drawn from another seed: every rank refuses it */
    memset(e, 0, sizeof e);
    e[0].layers = e[1].layers = 3;
    e[1].seed = 2;
    run_err(2, e);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, e[1].st, pdp_status_name);
    ASSERT(strstr(e[1].msg, "rank 1: the full model's parameters differ from rank 0's (their "
                  "values)") != NULL);
    ASSERT(e[0].st != PDP_OK);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_launch(2, NULL, pp_late_failure, NULL), pdp_status_name);
    ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "pdp_launch: rank 1 of 2: ") &&
                                  strstr(pdp_last_error(), "micro_batches"));
    /* a batch smaller than m; no labels on the last stage */
    ASSERT_ENUM_EQ(PDP_OK, pdp_local_group_create(&g, 1, NULL), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_comm_create_local(&c, g, 0), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, build_model(&full, MLP), pdp_status_name);
    memset(&pd, 0, sizeof pd);
    pd.micro_batches = 4;
    ASSERT_ENUM_EQ(PDP_OK, pdp_pp_create(&pp, full, c, &pd), pdp_status_name);
    make_batch(0, 20, x, y, target); /* the first 3 rows */
    pdp_tensor_wrap(x, pdp_cpu(), 2, shape, &xt);
    ASSERT_ENUM_EQ(PDP_ERR_SHAPE, pdp_pp_forward_backward(pp, &xt, y, &loss), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "batch of 3 rows for 4 micro-batches") != NULL);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_pp_forward_backward(pp, &xt, NULL, &loss),
                   pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "labels is NULL on the last stage") != NULL);
    /* an optimizer of the full model, not the stage's: refused, neither model changed */
    {
        pdp_optim *of = NULL, *os = NULL;
        pdp_optim_desc od = sgd();
        pdp_tensor pf, ps, gs;
        int64_t i;
        int64_t sh[2] = {B, 20};
        pdp_tensor_wrap(x, pdp_cpu(), 2, sh, &xt);
        make_batch(0, 20, x, y, target);
        ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&of, full, &od), pdp_status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp_pp_forward_backward(pp, &xt, y, &loss), pdp_status_name);
        pdp_model_flat(full, &pf, NULL);
        pdp_model_flat(pdp_pp_model(pp), &ps, &gs);
        ASSERT_EQ(pf.count, ps.count);
        ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_pp_step(pp, of), pdp_status_name);
        ASSERT(strstr(pdp_last_error(), "pdp_pp_step: rank 0 (stage 0): the optimizer was not "
                      "created on this stage's model") != NULL);
        ASSERT(strstr(pdp_last_error(), "pdp_pp_model(pp)") != NULL);
        for (i = 0; i < pf.count; i++) ASSERT_EQ(pf.data[i], ps.data[i]); /* neither stepped */
        ASSERT(gs.data[0] != 0.0f || gs.data[1] != 0.0f); /* gradients kept for the retry */
        ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&os, pdp_pp_model(pp), &od), pdp_status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp_pp_step(pp, os), pdp_status_name);
        ASSERT(pf.data[0] != ps.data[0] || pf.data[1] != ps.data[1]); /* the stage trained */
        pdp_optim_free(os);
        pdp_optim_free(of);
    }
    /* pdp_pp_clip_grad_norm: max_norm as pdp_clip_grad_norm checks it, and a NULL pp */
    {
        static const float bad_norms[] = {-1.0f, NAN, INFINITY};
        float nrm = 1.0f;
        size_t i;
        for (i = 0; i < sizeof bad_norms / sizeof *bad_norms; i++) {
            ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_pp_clip_grad_norm(pp, bad_norms[i], &nrm),
                           pdp_status_name);
            ASSERT(strstr(pdp_last_error(), "pdp_pp_clip_grad_norm: rank 0 (stage 0): max_norm ")
                   == pdp_last_error());
            ASSERT(strstr(pdp_last_error(), "must be finite and >= 0") != NULL);
            ASSERT_EQ(0.0f, nrm);
        }
        ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_pp_clip_grad_norm(NULL, 1.0f, NULL), pdp_status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp_pp_clip_grad_norm(pp, 0.0f, NULL), pdp_status_name);
    }
    pdp_pp_free(pp);
    pdp_model_free(full);
    pp = NULL;
    full = NULL;
    pdp_pp_free(pp);
    pdp_model_free(full);
    pdp_comm_free(c);
    pdp_local_group_free(g);
    PASS();
}

/* A pass that fails on one stage (the last stage's loss, on micro-batch 0 or m - 1): every
   rank fails, and its message names the call, its stage and the action that failed, not
   a message left by the clean-up that waits out the pass's other messages. */
TEST pp_failed_pass_names_call_stage_and_action_on_every_rank(void)
{
    cfg k;
    int p, sch, f, r;
    memset(&k, 0, sizeof k);
    k.kind = REG;
    k.dp = 1;
    k.m = 4;
    k.fail_loss = true;
    for (p = 2; p <= 3; p++)
        for (sch = 0; sch < 2; sch++)
            for (f = 0; f < 2; f++) {
                k.p = p;
                k.schedule = sch ? PDP_PP_GPIPE : PDP_PP_1F1B;
                k.fail_mb = f ? k.m - 1 : 0;
                run_ranks(&k, NULL, 2.0);
                for (r = 0; r < p; r++) {
                    char want[96];
                    const char *msg = ctxs[r].msg;
                    size_t n = (size_t)snprintf(want, sizeof want,
                                                "pdp_pp_forward_backward: rank %d (stage %d): ",
                                                r, r);
                    if (strncmp(msg, want, n) != 0 || (msg[n] != 'F' && msg[n] != 'B') ||
                        msg[n + 1] < '0' || msg[n + 1] > '9')
                        fprintf(stderr, "p %d %s fail_mb %d rank %d: \"%s\"\n", p,
                                sch ? "gpipe" : "1f1b", k.fail_mb, r, msg);
                    ASSERT(ctxs[r].st != PDP_OK);
                    ASSERT_EQ_FMT(0, strncmp(msg, want, n), "%d");
                    ASSERT(msg[n] == 'F' || msg[n] == 'B');
                    ASSERT(msg[n + 1] >= '0' && msg[n + 1] <= '9');
                }
                ASSERT_ENUM_EQ(PDP_ERR_NUMERIC, ctxs[p - 1].st, pdp_status_name);
                ASSERT(strstr(ctxs[p - 1].msg, "the loss function on micro-batch") != NULL);
            }
    /* the failing stage outlasts the timeout: the stage before it fails by PDP_ERR_TIMEOUT,
       not by its leaving, and the clean-up's waits time out too */
    k.p = 3;
    k.schedule = PDP_PP_1F1B;
    k.fail_mb = 0;
    k.fail_late = true;
    run_ranks(&k, NULL, 0.5);
    for (r = 0; r < k.p; r++) {
        char want[96];
        size_t n = (size_t)snprintf(want, sizeof want,
                                    "pdp_pp_forward_backward: rank %d (stage %d): B0: ", r, r);
        if (strncmp(ctxs[r].msg, want, n) != 0)
            fprintf(stderr, "late failure: rank %d: \"%s\"\n", r, ctxs[r].msg);
        ASSERT_EQ_FMT(0, strncmp(ctxs[r].msg, want, n), "%d");
        /* stage p - 2 waits for the sleeping stage; before it, a stage may see the one
           after it time out first and leave */
        if (r == k.p - 2)
            ASSERT_ENUM_EQm(ctxs[r].msg, PDP_ERR_TIMEOUT, ctxs[r].st, pdp_status_name);
        if (r < k.p - 2) ASSERT(ctxs[r].st == PDP_ERR_TIMEOUT || ctxs[r].st == PDP_ERR_COMM);
    }
    PASS();
}

/* ---- the interleaved schedule (Megatron-LM's virtual pipeline stages) ---- */

/* DEEP's per-sample floats out of and into each layer */
static const int64_t deep_out[] = {16, 16, 16, 16, 16, 16, 12, 12, 12, 12, 12, 3};
static const int64_t deep_in[] = {20, 16, 16, 16, 16, 16, 16, 12, 12, 12, 12, 12};

/* p = 2, 3 thread stages, v = 2, 3 chunks, m = p, 2p, on DEEP (two Dropouts: the keys must
   follow the single-device run): every stage's parameters equal one device's on the whole
   batches (check_equivalence), and so does the loss of every step. Also per stage: the
   messages (m (2 v - [s = 0] - [s = p - 1])), the bytes sent (each chunk's activations
   forward and gradients back, from the model's shapes), both bubble formulas. Then with
   pdp_pp_clip_grad_norm, and DP x PP. */
TEST pp_interleaved_equals_single_device(void)
{
    cfg k;
    int p, v, mm, s, c;
    memset(&k, 0, sizeof k);
    k.kind = DEEP;
    k.dp = 1;
    k.schedule = PDP_PP_INTERLEAVED_1F1B;
    for (p = 2; p <= 3; p++)
        for (v = 2; v <= 3; v++)
            for (mm = 1; mm <= 2; mm++) {
                char msg[64];
                snprintf(msg, sizeof msg, "p %d v %d m %d", p, v, mm * p);
                k.p = p, k.chunks = v, k.m = mm * p;
                CHECK_CALL(check_equivalence(&k));
                for (s = 0; s < STEPS; s++)
                    if (fabs(ctxs[p - 1].losses[s] - single_losses[s]) > 1e-5)
                        FAILm(msg);
                for (s = 0; s < p; s++) {
                    const pdp_pp_stats *st = &ctxs[s].stats;
                    int64_t bytes = 0;
                    for (c = 0; c < v; c++) { /* piece c p + s: activations unless the last
                                                 piece, gradients unless the first */
                        int q = c * p + s, lo = ctxs[s].cfirst[c], hi = ctxs[s].clast[c];
                        bytes += 4 * B * ((q < p * v - 1 ? deep_out[hi - 1] : 0) +
                                          (q > 0 ? deep_in[lo] : 0));
                    }
                    ASSERT_EQm(msg, (int64_t)k.m * (2 * v - (s == 0) - (s == p - 1)),
                               st->messages);
                    ASSERT_EQm(msg, v, st->chunks);
                    ASSERTm(msg, fabs(st->bubble_theory - (p - 1.0) / (v * k.m + p - 1.0)) <
                                     1e-12);
                    ASSERTm(msg, fabs(st->bubble_megatron - (p - 1.0) / (v * k.m)) < 1e-12);
                    ASSERTm(msg, st->bubble >= 0.0 && st->bubble <= 1.0);
                    ASSERT_EQm(msg, bytes, st->bytes_sent);
                }
            }
    /* with clipping (every stage's norm the single-device one), and DP x PP: 2 pipelines of
       2 stages x 2 chunks, each on half the batch */
    k.p = 3, k.chunks = 2, k.m = 3, k.clip = true, k.max_norm = 0.05f;
    CHECK_CALL(check_equivalence(&k));
    ASSERT(ctxs[0].norms[0] > k.max_norm); /* clipping was active */
    k.p = 2, k.dp = 2, k.m = 2, k.clip = false;
    CHECK_CALL(check_equivalence(&k));
    PASS();
}

/* The action lists of p = 2, v = 2, m = 4 and p = 3, v = 2, m = 3, written out from the rule:
   forward k is micro-batch (k / (p v)) p + k % p on chunk (k % (p v)) / p, backward k the same
   micro-batch on chunk v - 1 - that; stage s runs w = min(2 (p - s - 1) + (v - 1) p, m v)
   forwards, then forward w + i and backward i alternately (each pair one step of messages,
   printed joined by a +), then the remaining backwards. p = 2: w = 4 on stage 0, 2 on
   stage 1; p = 3: w = min(7, 6) = 6, min(5, 6) = 5, 3. The peak of micro-batch chunks held
   follows from the list (stage 0 of p = 2: 4 + 1), and so do the peak bytes
   (replay_peak_bytes). */
/* The most activation bytes stage s holds at once, replaying its list (ctxs[s].schedule)
   with each chunk's bytes a micro-batch of rows rows: its layers' outputs and saved tensors
   (pdp_model_activation_bytes of the full model) and, after piece 0, its received input. */
static int64_t replay_peak_bytes(int s, int p, int v, int64_t rows)
{
    pdp_model *full = NULL;
    int64_t per[4], held = 0, peak = 0;
    const char *t = ctxs[s].schedule;
    char kind;
    int j, c, n;
    if (build_model(&full, DEEP) != PDP_OK) return -1;
    for (c = 0; c < v; c++)
        per[c] = pdp_model_activation_bytes(full, ctxs[s].cfirst[c], ctxs[s].clast[c], rows) +
                 (c * p + s > 0 ? 4 * rows * deep_in[ctxs[s].cfirst[c]] : 0);
    while (sscanf(t, "%*[ +]%c%dc%d%n", &kind, &j, &c, &n) == 3 ||
           sscanf(t, "%c%dc%d%n", &kind, &j, &c, &n) == 3) {
        held += kind == 'F' ? per[c] : -per[c];
        if (held > peak) peak = held;
        t += n;
    }
    pdp_model_free(full);
    return peak;
}

TEST pp_interleaved_schedule_lists(void)
{
    cfg k;
    memset(&k, 0, sizeof k);
    k.kind = DEEP;
    k.dp = 1;
    k.p = 2, k.chunks = 2, k.m = 4;
    k.schedule = PDP_PP_INTERLEAVED_1F1B;
    run_ranks(&k, NULL, 30.0);
    ASSERT_ENUM_EQm(ctxs[0].msg, PDP_OK, ctxs[0].st, pdp_status_name);
    ASSERT_STR_EQ("F0c0 F1c0 F0c1 F1c1 F2c0+B0c1 F3c0+B1c1 F2c1+B0c0 F3c1+B1c0 B2c1 B3c1 B2c0 "
                  "B3c0", ctxs[0].schedule);
    ASSERT_STR_EQ("F0c0 F1c0 F0c1+B0c1 F1c1+B1c1 F2c0+B0c0 F3c0+B1c0 F2c1+B2c1 F3c1+B3c1 B2c0 "
                  "B3c0", ctxs[1].schedule);
    ASSERT_EQ(5, ctxs[0].stats.peak_in_flight);
    ASSERT_EQ(3, ctxs[1].stats.peak_in_flight);
    ASSERT_EQ(replay_peak_bytes(0, 2, 2, B / 4), ctxs[0].stats.peak_activation_bytes);
    ASSERT_EQ(replay_peak_bytes(1, 2, 2, B / 4), ctxs[1].stats.peak_activation_bytes);
    k.p = 3, k.chunks = 2, k.m = 3;
    run_ranks(&k, NULL, 30.0);
    ASSERT_ENUM_EQm(ctxs[0].msg, PDP_OK, ctxs[0].st, pdp_status_name);
    ASSERT_STR_EQ("F0c0 F1c0 F2c0 F0c1 F1c1 F2c1 B0c1 B1c1 B2c1 B0c0 B1c0 B2c0", ctxs[0].schedule);
    ASSERT_STR_EQ("F0c0 F1c0 F2c0 F0c1 F1c1 F2c1+B0c1 B1c1 B2c1 B0c0 B1c0 B2c0", ctxs[1].schedule);
    ASSERT_STR_EQ("F0c0 F1c0 F2c0 F0c1+B0c1 F1c1+B1c1 F2c1+B2c1 B0c0 B1c0 B2c0", ctxs[2].schedule);
    ASSERT_EQ(6, ctxs[0].stats.peak_in_flight);
    ASSERT_EQ(4, ctxs[2].stats.peak_in_flight);
    ASSERT_EQ(replay_peak_bytes(0, 3, 2, B / 3), ctxs[0].stats.peak_activation_bytes);
    ASSERT_EQ(replay_peak_bytes(2, 3, 2, B / 3), ctxs[2].stats.peak_activation_bytes);
    PASS();
}

/* ---- the runner replayed under each backend's rules ----
   Every stage's list (pdp__pp_build; a forward marked pair and the backward after it are one
   step) replayed at once, as the runner runs it: it issues the first step's receives; before
   action k it waits for k's receive and for the send that last used the buffer k sends from
   (its chunk's slot j % S after a forward, j % 2 after a backward); after each step it issues
   one batch, the step's sends with the next step's receives (on local and MPI a pair's
   forward sends at once). A message is (direction, micro-batch, boundary).
   Local and MPI (comm.h): messages match by peer and tag and start when posted; one
   completes once its send and its receive are both posted.
   NCCL: no tags, so a pair's messages match in the order the sender posted them and the
   receiver posted its receives (checked first: for every pair of ranks the k-th message the
   sender's list sends the other must be the k-th the receiver's list receives from it, else
   *in_order is false), and one stream per rank: a batch is a group that runs once the rank's
   earlier groups are done, and a message completes once the groups holding its send and its
   receive are both running. True when every stage finishes its list and every group
   completes. The variants: the lists as built; without their pairs (a batch an action, the
   runner before Megatron's grouping); the interleaved rule without its 2 (p - s - 1) extra
   warm-up forwards. */
enum { SIM_P = 8, SIM_V = 4, SIM_M = 32, SIM_N = 2 * SIM_M * SIM_V };
enum { SIM_MSGS = 2 * SIM_M * SIM_P * SIM_V };
typedef enum { SIM_AS_BUILT, SIM_NO_PAIRS, SIM_NO_EXTRA } sim_lists;

static struct {
    pdp__pp_action acts[SIM_P][SIM_N];
    int n[SIM_P], p, v, P;
    int grp[SIM_P][SIM_N + 1][4], gn[SIM_P][SIM_N + 1], ng[SIM_P], head[SIM_P];
    int pend[SIM_P][2], npend[SIM_P]; /* the current step's sends, not yet issued */
    char sact[SIM_MSGS], ract[SIM_MSGS], done[SIM_MSGS];
    bool nccl;
} sim;

/* The message action a of stage s sends (send) or receives; -1: none. */
static int sim_msg(const pdp__pp_action *a, int s, bool send)
{
    int q = a->chunk * sim.p + s, j = a->mb;
    if (a->kind == 'F' && (send ? q < sim.P - 1 : q > 0))
        return (0 * SIM_M + j) * (SIM_P * SIM_V) + (send ? q : q - 1);
    if (a->kind == 'B' && (send ? q > 0 : q < sim.P - 1))
        return (1 * SIM_M + j) * (SIM_P * SIM_V) + (send ? q - 1 : q);
    return -1;
}

/* One side of a message starts (posted on local and MPI; its group running on NCCL). */
static void sim_start(int op)
{
    int id = op >> 1;
    if (op & 1) sim.sact[id] = 1;
    else sim.ract[id] = 1;
    if (sim.sact[id] && sim.ract[id]) sim.done[id] = 1;
}

/* The batch after stage s's action k (k = -1: before the first): a pair's forward's send
   alone (local and MPI), or the step's sends with the next step's receives. */
static void sim_issue(int s, int k)
{
    int g = sim.ng[s], i, r, last;
    const pdp__pp_action *a = sim.acts[s];
    sim.gn[s][g] = 0;
    for (i = 0; i < sim.npend[s]; i++) sim.grp[s][g][sim.gn[s][g]++] = 2 * sim.pend[s][i] + 1;
    sim.npend[s] = 0;
    last = k >= 0 && a[k].pair ? k : k + 1 < sim.n[s] ? k + 1 + a[k + 1].pair : k;
    for (i = k + 1; i <= last; i++)
        if ((r = sim_msg(&a[i], s, false)) >= 0) sim.grp[s][g][sim.gn[s][g]++] = 2 * r;
    if (!sim.gn[s][g]) return;
    sim.ng[s]++;
    for (i = 0; !sim.nccl && i < sim.gn[s][g]; i++) sim_start(sim.grp[s][g][i]);
}

static bool sim_run(pdp_pp_schedule sched, int p, int v, int m, sim_lists lists, bool nccl,
                    bool *in_order)
{
    static int last_f[SIM_P][SIM_V][SIM_M], last_b[SIM_P][SIM_V][2];
    static int sidx[SIM_MSGS], ridx[SIM_MSGS];
    int pc[SIM_P], slots[SIM_P][SIM_V], held[SIM_V], sent_to[SIM_P][SIM_P], got[SIM_P][SIM_P];
    int s, k, c, i;
    bool moved = true;
    memset(&sim, 0, sizeof sim);
    memset(sent_to, 0, sizeof sent_to), memset(got, 0, sizeof got);
    sim.p = p, sim.v = v, sim.P = p * v, sim.nccl = nccl;
    for (s = 0; s < p; s++) {
        pdp__pp_action *acts = sim.acts[s];
        int n = sim.n[s] = pdp__pp_build(sched, p, v, m, s, acts);
        if (lists == SIM_NO_EXTRA) { /* the rule without its 2 (p - s - 1), steps as built */
            int w = PDP__MIN((v - 1) * p, m * v), t = 0;
            for (i = 0; i < w; i++) acts[t++] = pdp__pp_kth('F', i, p, v);
            for (i = 0; i + w < m * v; i++) {
                acts[t] = pdp__pp_kth('F', w + i, p, v);
                acts[t++].pair = true;
                acts[t++] = pdp__pp_kth('B', i, p, v);
            }
            for (i = m * v - w; i < m * v; i++) acts[t++] = pdp__pp_kth('B', i, p, v);
        }
        for (k = 0; lists == SIM_NO_PAIRS && k < n; k++) acts[k].pair = false;
        memset(held, 0, sizeof held);
        memset(slots[s], 0, sizeof slots[s]);
        for (k = 0; k < n; k++) {
            const pdp__pp_action *a = &acts[k];
            int snd = sim_msg(a, s, true), rcv = sim_msg(a, s, false);
            int up = (s + 1) % p, down = (s + p - 1) % p;
            c = a->chunk;
            held[c] += a->kind == 'F' ? 1 : -1;
            slots[s][c] = PDP__MAX(slots[s][c], held[c]);
            if (snd >= 0) sidx[snd] = sent_to[s][a->kind == 'F' ? up : down]++;
            if (rcv >= 0) ridx[rcv] = got[s][a->kind == 'F' ? down : up]++;
        }
        pc[s] = 0;
        memset(last_f[s], -1, sizeof last_f[s]);
        memset(last_b[s], -1, sizeof last_b[s]);
    }
    *in_order = true;
    for (s = 0; s < p; s++)
        for (k = 0; k < sim.n[s]; k++) {
            int snd = sim_msg(&sim.acts[s][k], s, true);
            if (snd >= 0 && sidx[snd] != ridx[snd]) *in_order = false;
        }
    for (s = 0; s < p; s++) sim_issue(s, -1);
    while (moved) {
        moved = false;
        for (s = 0; nccl && s < p; s++) { /* the streams: the running groups */
            bool all = sim.head[s] < sim.ng[s];
            const int *g = sim.grp[s][sim.head[s]];
            for (i = 0; all && i < sim.gn[s][sim.head[s]]; i++) sim_start(g[i]);
            for (i = 0; all && i < sim.gn[s][sim.head[s]]; i++)
                all = sim.done[sim.grp[s][sim.head[s]][i] >> 1];
            if (all) sim.head[s]++, moved = true;
        }
        for (s = 0; s < p; s++) /* the runner */
            while (pc[s] < sim.n[s]) {
                const pdp__pp_action *a = &sim.acts[s][pc[s]];
                int rcv = sim_msg(a, s, false), snd = sim_msg(a, s, true), *w;
                w = a->kind == 'F' ? &last_f[s][a->chunk][a->mb % slots[s][a->chunk]]
                                   : &last_b[s][a->chunk][a->mb % 2];
                if ((rcv >= 0 && !sim.done[rcv]) || (*w >= 0 && !sim.done[*w])) break;
                if (snd >= 0) *w = snd, sim.pend[s][sim.npend[s]++] = snd;
                if (!a->pair || !nccl) sim_issue(s, pc[s]);
                pc[s]++, moved = true;
            }
    }
    for (s = 0; s < p; s++)
        if (pc[s] < sim.n[s] || sim.head[s] < (nccl ? sim.ng[s] : 0)) return false;
    return true;
}

/* Every schedule as built completes under both rules, p = 2..8, v = 1..4, m = p..4p, and
   NCCL's in-order matching pairs the messages tags would. It can fail: without their pairs
   (a batch an action) the interleaved lists deadlock under NCCL's rules for every m >= 2p
   (m = p completes), as the runner did before it batched Megatron's way (pp.c's opening
   comment walks through p = 2, v = 2, m = 4); and without the 2 (p - s - 1) extra warm-up
   forwards the interleaved lists deadlock even on local and MPI. */
TEST pp_schedules_cannot_deadlock(void)
{
    int p, v, mm, m, nccl, stuck_extra = 0;
    bool in_order;
    for (p = 2; p <= SIM_P; p++)
        for (mm = 1; mm <= 4; mm++)
            for (m = mm * p, nccl = 0; nccl <= 1; nccl++) {
                ASSERT(sim_run(PDP_PP_1F1B, p, 1, m, SIM_AS_BUILT, nccl, &in_order) && in_order);
                ASSERT(sim_run(PDP_PP_GPIPE, p, 1, m, SIM_AS_BUILT, nccl, &in_order) && in_order);
                for (v = 1; v <= SIM_V; v++) {
                    if (!sim_run(PDP_PP_INTERLEAVED_1F1B, p, v, m, SIM_AS_BUILT, nccl,
                                 &in_order) || !in_order) {
                        fprintf(stderr, "interleaved p %d v %d m %d under %s's rules: a stage "
                                "waits forever\n", p, v, m, nccl ? "NCCL" : "local/MPI");
                        FAIL();
                    }
                    stuck_extra += !nccl && !sim_run(PDP_PP_INTERLEAVED_1F1B, p, v, m,
                                                     SIM_NO_EXTRA, false, &in_order);
                    if (v > 1)
                        ASSERT_EQ(!nccl || mm == 1, sim_run(PDP_PP_INTERLEAVED_1F1B, p, v, m,
                                                            SIM_NO_PAIRS, nccl, &in_order));
                }
            }
    ASSERT(stuck_extra > 0);
    PASS();
}

/* The lists' own bubble, free of the machine: every stage runs its list with each piece's
   forward taking 1 / v and its backward 2 / v (equal pieces; messages free, but a step's
   forward's activations leave after its backward, as the runner sends them on NCCL; local
   and MPI send them at once), an action
   starting once the stage is free and its input is there (the previous piece's forward of
   the micro-batch; for a backward the next piece's backward, or on the last piece its own
   forward). The step lasts T, each stage computes m (1 + 2), so the bubble is 1 - 3 m / T
   (the same on every stage, as the runner's barriers make it). Returns -1 when stuck. */
static double replay_bubble(pdp_pp_schedule sched, int p, int v, int m)
{
    static pdp__pp_action acts[SIM_P][SIM_N];
    static double fin[2][SIM_M][SIM_P * SIM_V];
    double t[SIM_P], T = 0.0;
    int n[SIM_P], pc[SIM_P], held[SIM_P], s, j, q, P = p * v;
    bool moved = true;
    for (j = 0; j < m; j++)
        for (q = 0; q < P; q++) fin[0][j][q] = fin[1][j][q] = -1.0;
    for (s = 0; s < p; s++) {
        n[s] = pdp__pp_build(sched, p, v, m, s, acts[s]), pc[s] = 0, t[s] = 0;
        held[s] = -1;
    }
    while (moved) {
        moved = false;
        for (s = 0; s < p; s++)
            while (pc[s] < n[s]) {
                const pdp__pp_action *a = &acts[s][pc[s]];
                int f = a->kind == 'F';
                double ready;
                j = a->mb, q = a->chunk * p + s;
                ready = f ? (q > 0 ? fin[0][j][q - 1] : 0.0)
                          : (q < P - 1 ? fin[1][j][q + 1] : fin[0][j][q]);
                if (ready < 0.0) break;
                t[s] = PDP__MAX(t[s], ready) + (f ? 1.0 : 2.0) / v;
                if (a->pair && q < P - 1) held[s] = j * P + q; /* sent after the backward */
                else fin[!f][j][q] = t[s];
                if (!a->pair && held[s] >= 0)
                    fin[0][held[s] / P][held[s] % P] = t[s], held[s] = -1;
                pc[s]++, moved = true;
            }
    }
    for (s = 0; s < p; s++) {
        if (pc[s] < n[s]) return -1.0;
        T = PDP__MAX(T, t[s]);
    }
    return 1.0 - 3.0 * m / T;
}

/* Replayed with equal pieces, the lists meet pdp's formula exactly: (p - 1) / (v m + p - 1)
   for the interleaved schedule (below Megatron's (p - 1) / (v m), which divides by the
   ideal time instead of the step's), (p - 1) / (m + p - 1) for 1F1B and GPipe; p = 2..8,
   v = 1..4, m = p..4p. So what the stats measure beyond it is the machine's: unequal pieces,
   messages, other load. With free messages the dependencies set T, so the replay does not
   see the warm-up's size (as long as the lists finish: pp_interleaved_schedules_cannot_
   deadlock's business); it sees the order: micro-batch after micro-batch through the chunks
   gives 0.37 at p = 2, v = 2, m = 2 where the formula says 0.20. */
TEST pp_interleaved_lists_meet_the_bubble_formula(void)
{
    int p, v, mm, m;
    for (p = 2; p <= SIM_P; p++)
        for (mm = 1; mm <= 4; mm++) {
            m = mm * p;
            for (v = 1; v <= SIM_V; v++) {
                double b = replay_bubble(PDP_PP_INTERLEAVED_1F1B, p, v, m);
                if (fabs(b - (p - 1.0) / (v * m + p - 1.0)) > 1e-9) {
                    fprintf(stderr, "interleaved p %d v %d m %d: bubble %.6f, formula %.6f\n", p,
                            v, m, b, (p - 1.0) / (v * m + p - 1.0));
                    FAIL();
                }
                ASSERT(b < (p - 1.0) / (v * m));
            }
            ASSERT(fabs(replay_bubble(PDP_PP_1F1B, p, 1, m) - (p - 1.0) / (m + p - 1.0)) < 1e-9);
            ASSERT(fabs(replay_bubble(PDP_PP_GPIPE, p, 1, m) - (p - 1.0) / (m + p - 1.0)) < 1e-9);
        }
    PASS();
}

/* ---- the interleaved schedule on the GPT ---- */

enum { GB = 6, GT = 4 }; /* the GPT's batch and sequence */

static pdp_gpt_desc gpt_desc(int layers)
{
    pdp_gpt_desc d;
    memset(&d, 0, sizeof d);
    d.vocab = 13, d.context = GT, d.layers = layers, d.heads = 2, d.dim = 8, d.seed = 5;
    d.dropout = 0.1f;
    return d;
}

static pdp_optim_desc adamw(void)
{
    pdp_optim_desc od;
    memset(&od, 0, sizeof od);
    od.kind = PDP_OPTIM_ADAMW, od.lr = 1e-2f, od.weight_decay = 0.1f;
    return od;
}

#define GMAXR 8 /* DP x TP x PP = 2 x 2 x 2 */

typedef struct gpt_case {
    int32_t ids[GB * GT], tg[GB * GT];
    int layers, chunks, m, steps;
    int tp, dp;                /* 0 or 1: none; else TP ranks a stage, pipelines (pd.dp) */
    bool sp;                   /* sequence parallel stages (with tp) */
    bool no_clip;              /* no clipping (else pdp_pp_clip_grad_norm at 0.5 every step) */
    bool own_loss;             /* desc.loss = square_share (the last stage sums its shares) */
    double shares, worst_share; /* this step's shares; max |loss - shares| / shares */
    pdp_pp_schedule schedule;
    pdp_pp_balance balance;
    int first[GMAXR][2 * GMAXR]; /* each rank's split in use (pdp_pp_get_desc), then the
                                    number of layers */
    const char *load, *save;   /* checkpoints: load before training, save after */
    const pdp_model *ref;      /* NULL: no comparison */
    float losses[2][STEPS];    /* each pipeline's mean loss, from its last stage */
    float norms[STEPS];        /* the norm before clipping (rank 0's) */
    double worst[GMAXR];       /* max |pp - ref| over each rank's tensors, by name (a TP
                                  slice against its cut of the full tensor) */
    pdp_pp_stats stats[GMAXR];
    pdp_tp_stats tps[GMAXR];   /* each rank's TP traffic over the run (pdp_pp_model's) */
    char report[GMAXR][512];   /* each rank's pdp_pp_report after the run */
    pdp_status early[GMAXR], short_buf[GMAXR]; /* pdp_pp_report before the first pass, and
                                                  after the run into 64 bytes */
    pdp_recompute recompute;   /* the GPT's (pdp_gpt_desc.recompute) */
    bool rank_reports;         /* pdp_pp_rank_report's checks (below), each rank's: */
    char rank_report[GMAXR][1024];
    pdp_status rank_st[GMAXR][4]; /* before the first pass, another model's optimizer, 64
                                     bytes, then the report after the run */
    int64_t params[GMAXR];     /* the stage's parameters (pdp_model_param_count) */
    int regions[GMAXR];        /* its ColumnParallelLinear layers: a TP region each */
    int64_t dp_sent[GMAXR];    /* the bytes its DP group sent from after pdp_pp_create */
} gpt_case;

/* steps AdamW steps of the GPT with clipping at 0.5 (unless no_clip) on one device (the
   reference); its losses in losses[0] */
static pdp_status gpt_one(gpt_case *c, int steps, pdp_model **out)
{
    pdp_gpt_desc d = gpt_desc(c->layers);
    pdp_optim *o = NULL;
    pdp_optim_desc od = adamw();
    pdp_tensor x;
    int64_t shape[2] = {GB, GT};
    float loss;
    int s;
    pdp_status st;
    if ((st = pdp_gpt_create(out, &d)) != PDP_OK || (st = pdp_optim_create(&o, *out, &od)))
        return st;
    pdp_tensor_wrap_ids(c->ids, pdp_cpu(), 2, shape, &x);
    for (s = 0; s < steps && st == PDP_OK; s++) {
        if ((st = pdp_model_forward_backward(*out, &x, c->tg, &loss)) == PDP_OK &&
            (c->no_clip || (st = pdp_clip_grad_norm(*out, 0.5f, &c->norms[s])) == PDP_OK))
            st = pdp_optim_step(o);
        pdp_optim_zero_grad(o);
        c->losses[0][s] = loss;
    }
    pdp_optim_free(o);
    return st;
}

/* Rank (d p + s) tp + t: TP rank t of stage s of pipeline d (train_gpt_3d's layout); pipeline
   d trains on rows [d GB / dp, (d + 1) GB / dp). */
/* desc.loss for a GPT: the mean of y^2 over the batch's elements, this micro-batch's share
   (summed into the case's shares: the step's loss, pp.h says). */
static pdp_status square_share(void *user, const pdp_tensor *y, int64_t first, int64_t total,
                               pdp_tensor *dy, double *loss)
{
    gpt_case *c = (gpt_case *)user;
    double k = 1.0 / ((double)total * (double)(y->count / y->shape[0])), sum = 0.0;
    int64_t i;
    (void)first;
    for (i = 0; i < y->count; i++) {
        sum += (double)y->data[i] * y->data[i];
        dy->data[i] = (float)(2.0 * k) * y->data[i];
    }
    *loss = sum * k;
    c->shares += *loss;
    return PDP_OK;
}

static pdp_status gpt_rank(const pdp_launch_ctx *ctx, void *user)
{
    gpt_case *c = (gpt_case *)user;
    int tp = PDP__MAX(c->tp, 1), dp = PDP__MAX(c->dp, 1), p = ctx->world_size / (tp * dp);
    int t = ctx->rank % tp, st_ = ctx->rank / tp % p, dd = ctx->rank / (tp * p);
    pdp_gpt_desc d = gpt_desc(c->layers);
    pdp_comm *tc = NULL, *pc = ctx->world, *dc = NULL;
    pdp_model *full = NULL, *m;
    pdp_pp *pp = NULL;
    pdp_pp_desc pd;
    pdp_optim *o = NULL;
    pdp_optim_desc od = adamw();
    pdp_optim *other = NULL;
    pdp_tensor x;
    pdp_comm_stats dp0, dp1;
    int64_t rows = GB / dp, shape[2] = {GB / dp, GT};
    float loss, norm = 0.0f;
    int s, i;
    pdp_status st = PDP_OK;
    if (tp > 1 || dp > 1) {
        pc = NULL;
        if ((st = pdp_comm_split(ctx->world, dd * p + st_, t, &tc)) != PDP_OK ||
            (st = pdp_comm_split(ctx->world, dd * tp + t, st_, &pc)) != PDP_OK ||
            (st = pdp_comm_split(ctx->world, st_ * tp + t, dd, &dc)) != PDP_OK)
            goto out;
    }
    memset(&pd, 0, sizeof pd);
    pd.schedule = c->schedule;
    pd.chunks = c->chunks;
    pd.micro_batches = c->m;
    pd.dp = dp > 1 ? dc : NULL;
    pd.balance = c->balance;
    if (c->own_loss) pd.loss = square_share, pd.loss_user = c;
    d.tp = tp > 1 ? tc : NULL;
    d.sequence_parallel = c->sp;
    d.recompute = c->recompute;
    if ((st = pdp_gpt_create(&full, &d)) != PDP_OK ||
        (st = pdp_pp_create(&pp, full, pc, &pd)) != PDP_OK)
        goto out;
    m = pdp_pp_model(pp);
    if ((st = pdp_optim_create(&o, m, &od)) != PDP_OK) goto out;
    if (c->load && (st = pdp_pp_checkpoint_load(pp, o, c->load)) != PDP_OK) goto out;
    pdp_tensor_wrap_ids(c->ids + dd * rows * GT, pdp_cpu(), 2, shape, &x);
    c->early[ctx->rank] = pdp_pp_report(pp, c->report[ctx->rank], sizeof c->report[0]);
    if (c->rank_reports) {
        char *buf = c->rank_report[ctx->rank];
        if (dc) pdp_comm_get_stats(dc, &dp0); /* after pdp_pp_create's broadcasts */
        c->rank_st[ctx->rank][0] = pdp_pp_rank_report(pp, o, buf, sizeof c->rank_report[0]);
        if ((st = pdp_optim_create(&other, full, &od)) != PDP_OK) goto out;
    }
    for (s = 0; s < c->steps; s++) {
        if (c->own_loss && st_ == p - 1) c->shares = 0.0; /* one last stage: no TP, no DP */
        if ((st = pdp_pp_forward_backward(pp, &x, c->tg + dd * rows * GT, &loss)) != PDP_OK ||
            (!c->no_clip && (st = pdp_pp_clip_grad_norm(pp, 0.5f, &norm)) != PDP_OK) ||
            (st = pdp_pp_step(pp, o)) != PDP_OK)
            goto out;
        if (st_ == p - 1 && t == 0) c->losses[dd][s] = loss;
        if (c->own_loss && st_ == p - 1)
            c->worst_share = PDP__MAX(c->worst_share, fabs(loss - c->shares) / c->shares);
        if (ctx->rank == 0) c->norms[s] = norm;
    }
    pdp_pp_get_stats(pp, &c->stats[ctx->rank]);
    pdp_tp_get_stats(m, &c->tps[ctx->rank]);
    c->short_buf[ctx->rank] = pdp_pp_report(pp, c->report[ctx->rank], 64);
    if ((st = pdp_pp_report(pp, c->report[ctx->rank], sizeof c->report[0])) != PDP_OK) goto out;
    if (c->rank_reports) {
        char *buf = c->rank_report[ctx->rank];
        c->params[ctx->rank] = pdp_model_param_count(m);
        for (i = c->regions[ctx->rank] = 0; i < pdp_model_num_layers(m); i++)
            c->regions[ctx->rank] += !strcmp(pdp_model_layer_name(m, i), "ColumnParallelLinear");
        if (dc) {
            static float mine[GMAXR][1024]; /* a caller's own collective on dp after the run:
                                               not the pipeline's bytes (the report counted it) */
            pdp_comm_get_stats(dc, &dp1);
            c->dp_sent[ctx->rank] = dp1.bytes_sent - dp0.bytes_sent;
            if ((st = pdp_comm_allreduce(dc, mine[ctx->rank], 1024, PDP_REDUCE_SUM, NULL)) !=
                PDP_OK)
                goto out;
        }
        c->rank_st[ctx->rank][1] = pdp_pp_rank_report(pp, other, buf, sizeof c->rank_report[0]);
        c->rank_st[ctx->rank][2] = pdp_pp_rank_report(pp, o, buf, 64);
        c->rank_st[ctx->rank][3] = pdp_pp_rank_report(pp, o, buf, sizeof c->rank_report[0]);
    }
    memcpy(c->first[ctx->rank], pdp_pp_get_desc(pp).first_layer,
           (size_t)(p * PDP__MAX(c->chunks, 1) + 1) * sizeof **c->first);
    if (c->save && (st = pdp_pp_checkpoint_save(pp, o, c->save)) != PDP_OK) goto out;
    c->worst[ctx->rank] = 0.0;
    if (c->ref) st = fixture_worst_by_name(m, c->ref, &c->worst[ctx->rank]); /* the head's
                                                                               copy of wte too */
out:
    pdp_optim_free(other);
    pdp_optim_free(o);
    pdp_pp_free(pp);
    pdp_model_free(full);
    if (pc != ctx->world) pdp_comm_free(pc);
    pdp_comm_free(tc);
    pdp_comm_free(dc);
    return st;
}

/* The step losses of the pipelines (each its own labels' mean) as one batch's mean. */
static float gpt_batch_loss(const gpt_case *c, int s)
{
    int dp = PDP__MAX(c->dp, 1), d, i;
    double sum = 0.0, n = 0.0;
    for (d = 0; d < dp; d++) {
        int count = 0;
        for (i = d * GB / dp * GT; i < (d + 1) * GB / dp * GT; i++) count += c->tg[i] >= 0;
        sum += (double)c->losses[d][s] * count;
        n += count;
    }
    return (float)(sum / n);
}

static void gpt_data(gpt_case *c)
{
    int i;
    memset(c, 0, sizeof *c);
    for (i = 0; i < GB * GT; i++) {
        c->ids[i] = (int32_t)((i * 5 + 1) % 13);
        c->tg[i] = i % 7 == 3 ? -1 : (int32_t)((i * 3 + 2) % 13);
    }
}

/* A GPT of 4 blocks (dropout 0.1 after the embedding, on the attention probabilities and in
   the branches) cut into p v pieces between residual regions, wte on chunk 0 of stage 0 and
   its copy on the last chunk of stage p - 1: p = 2, 3, v = 2, 3, m = p, 2p (6 rows: uneven
   micro-batches at m = 4), 3 AdamW steps with the pipeline's clipping equal one device: the
   loss of every step and every stage's tensors by name (the copy included). */
TEST pp_interleaved_gpt_equals_single_device(void)
{
    static gpt_case c, one;
    pdp_model *ref = NULL;
    int p, v, mm, s;
    gpt_data(&c);
    c.layers = 4, c.steps = STEPS;
    one = c;
    ASSERT_ENUM_EQ(PDP_OK, gpt_one(&one, STEPS, &ref), pdp_status_name);
    c.ref = ref;
    c.schedule = PDP_PP_INTERLEAVED_1F1B;
    for (p = 2; p <= 3; p++)
        for (v = 2; v <= 3; v++)
            for (mm = 1; mm <= 2; mm++) {
                char msg[64];
                snprintf(msg, sizeof msg, "GPT p %d v %d m %d", p, v, mm * p);
                c.chunks = v, c.m = mm * p;
                ASSERT_ENUM_EQm(msg, PDP_OK, pdp_launch(p, NULL, gpt_rank, &c), pdp_status_name);
                for (s = 0; s < STEPS; s++)
                    ASSERTm(msg, fabs(c.losses[0][s] - one.losses[0][s]) <= 1e-5);
                for (s = 0; s < p; s++) ASSERTm(msg, c.worst[s] <= 1e-5);
            }
    pdp_model_free(ref);
    PASS();
}

/* A caller's loss (desc.loss) on a GPT, whose output has T rows a sample: the loss a pass
   reports is the sum of the micro-batches' shares (pp.h), at p = 2 and 3 under each schedule,
   m = 2p. */
TEST pp_gpt_own_loss_reports_the_sum_of_the_shares(void)
{
    static gpt_case c;
    int p, k;
    static const pdp_pp_schedule sch[3] = {PDP_PP_GPIPE, PDP_PP_1F1B, PDP_PP_INTERLEAVED_1F1B};
    for (p = 2; p <= 3; p++)
        for (k = 0; k < 3; k++) {
            char msg[64];
            gpt_data(&c);
            c.layers = 4, c.steps = 2, c.m = 2 * p, c.own_loss = true, c.schedule = sch[k];
            snprintf(msg, sizeof msg, "p %d schedule %d", p, (int)sch[k]);
            ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_launch(p, NULL, gpt_rank, &c),
                            pdp_status_name);
            ASSERTm(msg, c.worst_share <= 1e-6);
        }
    PASS();
}

/* The interleaved schedule on tensor-parallel stages: the GPT of 4 blocks (2 heads, one a
   TP rank; dropout 0.1) on 2 stages x 2 chunks, each stage 2 TP ranks (4 thread ranks),
   m = 2 and 4, 3 AdamW steps with and without the pipeline's clipping at 0.5 (which counts
   the TP slices on both TP ranks and the replicated tensors once); then DP x TP x PP =
   2 x 2 x 2 on 8 thread ranks, each pipeline on half the batch. Equal to one device within
   1e-5: the loss of every step, the norm before clipping, every rank's tensors by name (a
   slice against its cut of the full tensor). The halves count as many labels: DP averages
   the pipelines' means, as DDP does. */
static enum greatest_test_res check_gpt_3d(gpt_case *c, const gpt_case *one, int ranks,
                                           const char *msg)
{
    int s, r;
    ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_launch(ranks, NULL, gpt_rank, c),
                    pdp_status_name);
    for (s = 0; s < STEPS; s++) {
        ASSERT_IN_RANGEm(msg, one->losses[0][s], gpt_batch_loss(c, s), 1e-5);
        if (!c->no_clip) ASSERT_IN_RANGEm(msg, one->norms[s], c->norms[s], 1e-5 * one->norms[s]);
    }
    for (r = 0; r < ranks; r++) {
        ASSERTm(msg, c->worst[r] <= 1e-5);
        ASSERT_EQm(msg, PDP__MAX(c->chunks, 1), c->stats[r].chunks);
    }
    PASS();
}

/* Traced, TP 2 x PP 2 on 4 thread ranks (the GPT of pp_interleaved_*): each rank draws its
   "pipeline stage" lane under its own process, its world rank (the pipeline's position
   gave a stage's two TP ranks one lane). */
TEST pp_trace_lanes_are_the_world_ranks(void)
{
    static gpt_case c;
    char path[256], cmd[1400];
    if (!pdp_test_python("json")) SKIPm(pdp_test_python_missing("json"));
    gpt_data(&c);
    c.layers = 4, c.steps = 1, c.tp = 2, c.m = 2;
    snprintf(path, sizeof path, "/tmp/pdp_test_pp_lanes_%ld.json", (long)getpid());
    remove(path);
    setenv("PDP_TRACE", path, 1);
    ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_launch(4, NULL, gpt_rank, &c), pdp_status_name);
    unsetenv("PDP_TRACE");
    snprintf(cmd, sizeof cmd,
             "\"%s\" -c 'import json,sys\n"
             "ev=json.load(open(sys.argv[1]))[\"traceEvents\"]\n"
             "p=sorted(set(e[\"pid\"] for e in ev if e[\"ph\"]==\"M\" and "
             "e[\"name\"]==\"thread_name\" and e[\"args\"][\"name\"].startswith(\"pipeline\")))\n"
             "assert p==[0,1,2,3], p\n' '%s'", pdp_test_python("json"), path);
    ASSERT_EQm("pipeline lanes are not one per world rank (python says which)", 0, system(cmd));
    remove(path);
    PASS();
}

TEST pp_interleaved_tp_gpt_equals_single_device(void)
{
    static gpt_case c, one[2];
    pdp_model *ref[2] = {NULL, NULL};
    char msg[96];
    int clip, mm, i;
    gpt_data(&c);
    for (i = 0; i < GB * GT; i++) /* as many labels count in each half (DP averages means) */
        c.tg[i] = i % 6 == 3 ? -1 : c.tg[i] < 0 ? 7 : c.tg[i];
    c.layers = 4, c.steps = STEPS;
    c.schedule = PDP_PP_INTERLEAVED_1F1B, c.chunks = 2, c.tp = 2;
    for (clip = 0; clip <= 1; clip++) {
        one[clip] = c;
        one[clip].no_clip = !clip;
        ASSERT_ENUM_EQ(PDP_OK, gpt_one(&one[clip], STEPS, &ref[clip]), pdp_status_name);
        ASSERTm("clipping is active", !clip || one[clip].norms[0] > 0.5f);
    }
    for (clip = 0; clip <= 1; clip++)
        for (mm = 2; mm <= 4; mm += 2) {
            snprintf(msg, sizeof msg, "TP 2 x PP 2, v 2, m %d, %s", mm, clip ? "clipped"
                                                                            : "no clipping");
            c.m = mm, c.no_clip = !clip, c.ref = ref[clip];
            CHECK_CALL(check_gpt_3d(&c, &one[clip], 4, msg));
        }
    c.dp = 2, c.m = 2, c.no_clip = false, c.ref = ref[1];
    CHECK_CALL(check_gpt_3d(&c, &one[1], 8, "DP 2 x TP 2 x PP 2, v 2, m 2, clipped"));
    pdp_model_free(ref[0]);
    pdp_model_free(ref[1]);
    PASS();
}

/* Sequence parallel stages (pdp_gpt_desc.sequence_parallel with TP 2): the blocks between
   the embedding's scatter and the final LayerNorm's gather hold a rank's T / 2 positions,
   and so does every activation a stage sends (and its gradient). TP 2 x PP 2, 1F1B and
   interleaved (v 2), m 2 and 4, 3 AdamW steps clipped at 0.5: equal to one device within
   1e-5 (losses, norms, tensors by name), and each stage sends, besides the tied weight's
   gradient (V C floats, the first and last stage), half the bytes of the same pipeline
   without SP in as many messages. The TP traffic an interleaved stage reports
   (pdp_tp_get_stats on pdp_pp_model: its chunks' summed) adds up over the stages to
   1F1B's. */
static void tp_totals(const gpt_case *c, int ranks, int64_t *out)
{
    int r;
    memset(out, 0, 4 * sizeof *out);
    for (r = 0; r < ranks; r++) {
        out[0] += c->tps[r].allgathers, out[1] += c->tps[r].reduce_scatters;
        out[2] += c->tps[r].grad_allreduces, out[3] += c->tps[r].bytes_sent;
    }
}

TEST pp_sequence_parallel_gpt_equals_single_device(void)
{
    static gpt_case c, one, plain;
    pdp_model *ref = NULL;
    char msg[96];
    int v, mm, r;
    int64_t tot[2][2][4]; /* [m / 2 - 1][v - 1]: tp_totals */
    int64_t tied = 13 * 8 * (int64_t)sizeof(float); /* gpt_desc's V C */
    gpt_data(&c);
    c.layers = 4, c.steps = STEPS, c.tp = 2;
    one = c;
    ASSERT_ENUM_EQ(PDP_OK, gpt_one(&one, STEPS, &ref), pdp_status_name);
    c.ref = ref;
    for (v = 1; v <= 2; v++)
        for (mm = 2; mm <= 4; mm += 2) {
            snprintf(msg, sizeof msg, "SP, TP 2 x PP 2, %s, m %d", v > 1 ? "interleaved v 2"
                                                                         : "1F1B", mm);
            c.schedule = v > 1 ? PDP_PP_INTERLEAVED_1F1B : PDP_PP_1F1B;
            c.chunks = v > 1 ? v : 0, c.m = mm;
            plain = c; /* the same pipeline without SP */
            c.sp = true;
            CHECK_CALL(check_gpt_3d(&c, &one, 4, msg));
            CHECK_CALL(check_gpt_3d(&plain, &one, 4, msg));
            for (r = 0; r < 4; r++) {
                ASSERT_EQm(msg, plain.stats[r].messages, c.stats[r].messages);
                ASSERT_EQm(msg, (plain.stats[r].bytes_sent - tied) / 2,
                           c.stats[r].bytes_sent - tied);
            }
            tp_totals(&c, 4, tot[mm / 2 - 1][v - 1]);
            ASSERTm(msg, tot[mm / 2 - 1][v - 1][0] > 0 && tot[mm / 2 - 1][v - 1][2] > 0);
            c.sp = false;
        }
    for (mm = 0; mm < 2; mm++)
        for (r = 0; r < 4; r++)
            ASSERT_EQm("interleaved's TP traffic", tot[mm][0][r], tot[mm][1][r]);
    pdp_model_free(ref);
    PASS();
}

/* A GPT's stages balanced by measured time (stage 0 times each layer forward and backward
   on token ids, and the cross-entropy with the last) and by estimated work: each split
   trains as one device does (2 stages, 1F1B, m 2 and interleaved v 2, m 2), and each
   starts a stage between residual regions. */
TEST pp_gpt_balanced_by_time_and_work(void)
{
    static gpt_case c, one;
    pdp_model *ref = NULL;
    char msg[96];
    int b, v, s, i;
    gpt_data(&c);
    c.layers = 4, c.steps = STEPS, c.m = 2;
    one = c;
    ASSERT_ENUM_EQ(PDP_OK, gpt_one(&one, STEPS, &ref), pdp_status_name);
    c.ref = ref;
    for (b = 0; b < 2; b++)
        for (v = 1; v <= 2; v++) {
            snprintf(msg, sizeof msg, "GPT by %s, %s", b ? "work" : "time",
                     v > 1 ? "interleaved v 2" : "1F1B");
            c.balance = b ? PDP_PP_BALANCE_WORK : PDP_PP_BALANCE_TIME;
            c.schedule = v > 1 ? PDP_PP_INTERLEAVED_1F1B : PDP_PP_1F1B;
            c.chunks = v > 1 ? v : 0;
            CHECK_CALL(check_gpt_3d(&c, &one, 2, msg));
            for (s = 1; s < 2 * v; s++) { /* outside every residual region */
                int open = 0;
                for (i = 0; i < c.first[0][s]; i++)
                    open += !strcmp(pdp_model_layer_name(ref, i), "Residual") -
                            !strcmp(pdp_model_layer_name(ref, i), "ResidualAdd");
                ASSERT_EQm(msg, 0, open);
            }
        }
    /* DP x TP x PP = 2 x 2 x 2 by time: four stage 0s measure, and every rank must take one
       split (a TP pair or two pipelines holding different layers would not train at all) */
    c.balance = PDP_PP_BALANCE_TIME, c.tp = 2, c.dp = 2;
    for (i = 0; i < GB * GT; i++) /* as many labels count in each half (DP averages means) */
        c.tg[i] = i % 6 == 3 ? -1 : c.tg[i] < 0 ? 7 : c.tg[i];
    one = c;
    pdp_model_free(ref);
    ASSERT_ENUM_EQ(PDP_OK, gpt_one(&one, STEPS, &ref), pdp_status_name);
    c.ref = ref;
    CHECK_CALL(check_gpt_3d(&c, &one, 8, "2 x 2 x 2 by time, interleaved v 2"));
    for (i = 1; i < 8; i++)
        for (s = 0; s < 4; s++) ASSERT_EQm("one split on every rank", c.first[0][s], c.first[i][s]);
    pdp_model_free(ref);
    PASS();
}

/* Checkpoints across an interleaved pipeline: 2 stages x 2 chunks train 2 steps and save the
   full model's file; one device loads it and holds the single-device run's parameters; 3
   stages x 2 chunks load it and resume, and 3 stages of 1F1B too: after one more step each
   equals one device after 3 steps. */
TEST pp_interleaved_checkpoint_resumes_at_another_stage_count(void)
{
    static gpt_case c;
    pdp_model *two = NULL, *three = NULL, *back = NULL;
    pdp_gpt_desc d = gpt_desc(4);
    pdp_tensor pt, pb;
    char path[128];
    int s;
    gpt_data(&c);
    c.layers = 4;
    snprintf(path, sizeof path, "build/test_pp_vpp.%ld.safetensors", (long)getpid());
    ASSERT_ENUM_EQ(PDP_OK, gpt_one(&c, 2, &two), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, gpt_one(&c, 3, &three), pdp_status_name);
    c.schedule = PDP_PP_INTERLEAVED_1F1B, c.chunks = 2, c.m = 2, c.steps = 2, c.save = path;
    ASSERT_ENUM_EQ(PDP_OK, pdp_launch(2, NULL, gpt_rank, &c), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_gpt_create(&back, &d), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_checkpoint_load(path, back, NULL), pdp_status_name);
    pdp_model_flat(two, &pt, NULL);
    pdp_model_flat(back, &pb, NULL);
    ASSERT(fixture_rel_err(pb.data, pt.data, pt.count) <= 1e-5);
    c.save = NULL, c.load = path, c.steps = 1, c.ref = three, c.m = 3;
    ASSERT_ENUM_EQ(PDP_OK, pdp_launch(3, NULL, gpt_rank, &c), pdp_status_name);
    for (s = 0; s < 3; s++) ASSERTm("3 x 2 interleaved", c.worst[s] <= 1e-5);
    c.schedule = PDP_PP_1F1B, c.chunks = 0;
    ASSERT_ENUM_EQ(PDP_OK, pdp_launch(3, NULL, gpt_rank, &c), pdp_status_name);
    for (s = 0; s < 3; s++) ASSERTm("3 1F1B", c.worst[s] <= 1e-5);
    remove(path);
    pdp_model_free(two);
    pdp_model_free(three);
    pdp_model_free(back);
    PASS();
}

/* Under the interleaved schedule the chunks' models run and the stage model (pdp_pp_model,
   the caller's only handle once the full model is freed) does not: pdp_model_set_training,
   pdp_model_set_precision and pdp_model_set_grad_hook on it were silently ignored (dropout
   and fp32 products went on, parameters off by up to 5x those of one device trained the same
   way; the hook never ran). Now each pass hands them to the chunks; the hook sees the stage
   model and its own parameter indices, once per parameter and micro-batch, as under 1F1B.
   Modes 2-3 (any schedule): a pass in evaluation mode advanced the pipeline's dropout step,
   which one device's evaluation forward does not, so every later training pass drew other
   masks than the single-device run (parameters off by 7x); it counts training passes now. */
typedef struct stage_settings_job {
    bool eval, bf16;
    int eval_first;             /* the first steps in evaluation mode, then training */
    pdp_pp_schedule schedule;
    const pdp_model *ref;       /* one device trained the same way */
    double worst[2];            /* each stage's largest difference from it, by name */
    int nparams[2], hook_calls[2], bad_hook[2];
} stage_settings_job;

static void stage_hook(void *user, pdp_model *m, int p)
{
    int *calls = (int *)user; /* [0] calls, [1] calls with an index that is not m's */
    pdp_param prm;
    if (pdp_model_param(m, p, &prm) != PDP_OK || !prm.grad.data) calls[1]++;
    calls[0]++;
}

static pdp_status stage_settings_rank(const pdp_launch_ctx *ctx, void *user)
{
    stage_settings_job *j = (stage_settings_job *)user;
    int r = ctx->rank, s, i, calls[2] = {0, 0};
    pdp_model *full = NULL, *sm;
    pdp_pp *pp = NULL;
    pdp_optim *o = NULL;
    pdp_optim_desc od = sgd();
    pdp_pp_desc pd;
    float x[B * MAXF], target[B * 4], loss;
    int32_t y[B];
    pdp_tensor xt;
    pdp_status st;
    memset(&pd, 0, sizeof pd);
    pd.schedule = j->schedule, pd.micro_batches = 2;
    if (j->schedule == PDP_PP_INTERLEAVED_1F1B) pd.chunks = 2;
    if ((st = build_model(&full, MLP)) != PDP_OK) return st;
    st = pdp_pp_create(&pp, full, ctx->world, &pd);
    pdp_model_free(full);
    if (st != PDP_OK) return st;
    sm = pdp_pp_model(pp);
    if ((st = pdp_optim_create(&o, sm, &od)) != PDP_OK) goto out;
    pdp_model_set_training(sm, !j->eval);
    if (j->bf16 && (st = pdp_model_set_precision(sm, PDP_PRECISION_BF16)) != PDP_OK) goto out;
    pdp_model_set_grad_hook(sm, stage_hook, calls);
    for (s = 0; s < STEPS; s++) {
        make_batch(s, 20, x, y, target);
        pdp_tensor_wrap(x, pdp_cpu(), 2, (int64_t[]){B, 20}, &xt);
        if (j->eval_first) pdp_model_set_training(sm, s >= j->eval_first);
        if ((st = pdp_pp_forward_backward(pp, &xt, y, &loss)) != PDP_OK ||
            (st = pdp_pp_step(pp, o)) != PDP_OK)
            goto out;
    }
    j->nparams[r] = pdp_model_num_params(sm);
    for (i = 0; i < j->nparams[r]; i++) {
        pdp_param p, q;
        int64_t e;
        if ((st = pdp_model_param(sm, i, &p)) != PDP_OK ||
            (st = pdp_model_find_param(j->ref, p.name, &q)) != PDP_OK)
            goto out;
        for (e = 0; e < p.count && e < q.count; e++) {
            double d = fabs((double)p.value.data[e] - q.value.data[e]);
            if (d > j->worst[r] || d != d) j->worst[r] = d;
        }
    }
    j->hook_calls[r] = calls[0];
    j->bad_hook[r] = calls[1];
out:
    pdp_optim_free(o);
    pdp_pp_free(pp);
    return st;
}

TEST pp_interleaved_stage_model_settings_reach_the_chunks(void)
{
    static stage_settings_job j;
    int mode, r;
    for (mode = 0; mode < 4; mode++) {
        pdp_model *ref = NULL;
        pdp_optim *o = NULL;
        pdp_optim_desc od = sgd();
        float x[B * MAXF], target[B * 4], loss;
        int32_t y[B];
        pdp_tensor xt;
        int s;
        memset(&j, 0, sizeof j);
        j.eval = mode == 0, j.bf16 = mode == 1;
        /* modes 2-3: a first step in evaluation mode, which the single-device run does not
           count in its dropout keys' step (model.c): neither may the pipeline */
        j.eval_first = mode >= 2;
        j.schedule = mode == 2 ? PDP_PP_1F1B : PDP_PP_INTERLEAVED_1F1B;
        ASSERT_ENUM_EQ(PDP_OK, build_model(&ref, MLP), pdp_status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&o, ref, &od), pdp_status_name);
        pdp_model_set_training(ref, !j.eval);
        if (j.bf16)
            ASSERT_ENUM_EQ(PDP_OK, pdp_model_set_precision(ref, PDP_PRECISION_BF16),
                           pdp_status_name);
        for (s = 0; s < STEPS; s++) {
            make_batch(s, 20, x, y, target);
            pdp_tensor_wrap(x, pdp_cpu(), 2, (int64_t[]){B, 20}, &xt);
            if (j.eval_first) pdp_model_set_training(ref, s >= j.eval_first);
            ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward_backward(ref, &xt, y, &loss),
                           pdp_status_name);
            ASSERT_ENUM_EQ(PDP_OK, pdp_optim_step(o), pdp_status_name);
            pdp_model_zero_grad(ref);
        }
        j.ref = ref;
        ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_launch(2, NULL, stage_settings_rank, &j),
                        pdp_status_name);
        ASSERT_EQ(pdp_model_num_params(ref), j.nparams[0] + j.nparams[1]);
        for (r = 0; r < 2; r++)
            ASSERTm(j.eval ? "evaluation mode did not reach the chunks (dropout ran)"
                    : j.bf16 ? "bf16 did not reach the chunks"
                             : "a pass in evaluation mode moved the dropout keys' step",
                    j.worst[r] <= 1e-5);
        /* once per parameter and micro-batch (2) a step, on the stage that holds it */
        for (r = 0; r < 2; r++) {
            ASSERT_EQ(j.nparams[r] * 2 * STEPS, j.hook_calls[r]);
            ASSERT_EQ(0, j.bad_hook[r]);
        }
        pdp_optim_free(o);
        pdp_model_free(ref);
    }
    PASS();
}

/* A model that ZeRO stage 3 wraps holds no parameter block (each rank keeps its slices):
   pdp_pp_create, which copies each stage's parameters from the full model, read through the
   NULL block and crashed (SEGV in pdp__model_stage). Now it fails with PDP_ERR_STATE on every
   rank naming the gather that fills the block, and after that gather it builds the pipeline. */
typedef struct pp_zero3_job {
    pdp_status before[2], after[2];
    bool named[2];
} pp_zero3_job;

static pdp_status pp_zero3_rank(const pdp_launch_ctx *ctx, void *user)
{
    pp_zero3_job *j = (pp_zero3_job *)user;
    int r = ctx->rank;
    pdp_model *m = NULL;
    pdp_zero *z = NULL;
    pdp_pp *pp = NULL;
    pdp_zero_desc zd;
    pdp_status st;
    memset(&zd, 0, sizeof zd);
    zd.stage = 3;
    if ((st = build_model(&m, MLP)) != PDP_OK) return st;
    if ((st = pdp_zero_create(&z, m, ctx->world, &zd)) != PDP_OK) goto out;
    j->before[r] = pdp_pp_create(&pp, m, ctx->world, NULL);
    j->named[r] = strstr(pdp_last_error(), "pdp_zero_gather_params") != NULL;
    pdp_pp_free(pp);
    pp = NULL;
    if ((st = pdp_zero_gather_params(z, NULL)) != PDP_OK) goto out;
    j->after[r] = pdp_pp_create(&pp, m, ctx->world, NULL);
out:
    pdp_pp_free(pp);
    pdp_zero_free(z);
    pdp_model_free(m);
    return st;
}

TEST pp_create_refuses_a_zero3_model_without_its_parameter_block(void)
{
    static pp_zero3_job j;
    int r;
    memset(&j, 0, sizeof j);
    ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_launch(2, NULL, pp_zero3_rank, &j),
                    pdp_status_name);
    for (r = 0; r < 2; r++) {
        ASSERT_ENUM_EQ(PDP_ERR_STATE, j.before[r], pdp_status_name);
        ASSERT(j.named[r]);
        ASSERT_ENUM_EQ(PDP_OK, j.after[r], pdp_status_name);
    }
    PASS();
}

/* A stage with no parameters (first_layer cutting an activation and a Dropout out on their
   own): pdp_pp_checkpoint_save and _load copied its empty run to or from its NULL
   parameter block, memmove(NULL, src, 0): undefined behaviour that make sanitize
   (-fno-sanitize-recover=undefined) stops on. Save and load, then train on. */
static pdp_status pp_empty_stage_rank(const pdp_launch_ctx *ctx, void *user)
{
    static const int first[3] = {0, 1, 3}; /* stage 1: ReLU, Dropout */
    const char *path = (const char *)user;
    pdp_model *full = NULL;
    pdp_pp *pp = NULL;
    pdp_optim *o = NULL;
    pdp_optim_desc od = sgd();
    pdp_pp_desc pd;
    float x[B * MAXF], target[B * 4], loss;
    int32_t y[B];
    pdp_tensor xt;
    pdp_status st;
    memset(&pd, 0, sizeof pd);
    pd.first_layer = first;
    if ((st = build_model(&full, MLP)) != PDP_OK) return st;
    st = pdp_pp_create(&pp, full, ctx->world, &pd);
    pdp_model_free(full);
    if (st != PDP_OK) return st;
    make_batch(0, 20, x, y, target);
    pdp_tensor_wrap(x, pdp_cpu(), 2, (int64_t[]){B, 20}, &xt);
    if ((st = pdp_optim_create(&o, pdp_pp_model(pp), &od)) != PDP_OK ||
        (st = pdp_pp_forward_backward(pp, &xt, y, &loss)) != PDP_OK ||
        (st = pdp_pp_step(pp, o)) != PDP_OK ||
        (st = pdp_pp_checkpoint_save(pp, o, path)) != PDP_OK ||
        (st = pdp_pp_checkpoint_load(pp, o, path)) != PDP_OK ||
        (st = pdp_pp_forward_backward(pp, &xt, y, &loss)) != PDP_OK)
        goto out;
    st = pdp_pp_step(pp, o);
out:
    pdp_optim_free(o);
    pdp_pp_free(pp);
    return st;
}

TEST pp_checkpoint_of_a_stage_without_parameters(void)
{
    char path[128];
    snprintf(path, sizeof path, "build/test_pp_empty.%ld.safetensors", (long)getpid());
    ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_launch(3, NULL, pp_empty_stage_rank, path),
                    pdp_status_name);
    remove(path);
    PASS();
}

/* A GPT of one block (no dropout) over 6 stages: a stage starts outside every residual
   region, and that GPT has 5 such places: refused on every rank, saying how many stages
   fit. */
static pdp_status gpt_too_many_stages(const pdp_launch_ctx *ctx, void *user)
{
    pdp_gpt_desc d = gpt_desc(1);
    pdp_model *m = NULL;
    pdp_pp *pp = NULL;
    pdp_status st;
    d.dropout = 0; /* a Dropout is one more place a stage may start */
    if ((st = pdp_gpt_create(&m, &d)) != PDP_OK) return st;
    st = pdp_pp_create(&pp, m, ctx->world, NULL);
    if (ctx->rank == 0) snprintf((char *)user, 1024, "%s", pdp_last_error());
    pdp_pp_free(pp);
    pdp_model_free(m);
    return st != PDP_OK && !pp ? PDP_OK : PDP_ERR_STATE;
}

TEST pp_gpt_stages_that_do_not_fit_say_how_many_do(void)
{
    char msg[1024] = "";
    ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_launch(6, NULL, gpt_too_many_stages, msg),
                    pdp_status_name);
    ASSERTm(msg, strstr(msg, "6 stages do not fit") && strstr(msg, "so at most") &&
                     strstr(msg, "placing the stages") && !strstr(msg, "timing"));
    PASS();
}

/* The interleaved schedule's refusals, each naming what is wrong. */
typedef struct ierr_case {
    pdp_pp_desc desc;
    int layers;                /* > 0: a GPT of that many blocks; 0: DEEP */
    pdp_status st[MAXR];
    char msg[MAXR][512];
} ierr_case;

static pdp_status ierr_rank(const pdp_launch_ctx *ctx, void *user)
{
    ierr_case *e = (ierr_case *)user;
    pdp_gpt_desc d = gpt_desc(e->layers);
    pdp_model *full = NULL;
    pdp_pp *pp = NULL;
    pdp_status st = e->layers ? pdp_gpt_create(&full, &d) : build_model(&full, DEEP);
    if (st == PDP_OK) st = pdp_pp_create(&pp, full, ctx->world, &e->desc);
    if (st == PDP_OK) { /* one range a stage no more */
        int f, l;
        st = pdp_pp_stage_layers(pp, ctx->rank, &f, &l);
    }
    e->st[ctx->rank] = st;
    snprintf(e->msg[ctx->rank], sizeof e->msg[ctx->rank], "%s", pdp_last_error());
    pdp_pp_free(pp);
    pdp_model_free(full);
    return st;
}

TEST pp_interleaved_errors(void)
{
    static ierr_case e;
    /* m not a multiple of p: both named */
    memset(&e, 0, sizeof e);
    e.desc.schedule = PDP_PP_INTERLEAVED_1F1B, e.desc.micro_batches = 3;
    pdp_launch(2, NULL, ierr_rank, &e);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, e.st[0], pdp_status_name);
    ASSERT(strstr(e.msg[0], "pdp_pp_create: PDP_PP_INTERLEAVED_1F1B takes micro-batches in "
                            "groups of the stages: micro_batches 3 is not a multiple of the 2 "
                            "stages"));
    /* more pieces than the GPT has cut points (1 block: its embedding, the embedding's
       dropout, the two residual regions, ln_f and the head: 6) */
    memset(&e, 0, sizeof e);
    e.layers = 1;
    e.desc.schedule = PDP_PP_INTERLEAVED_1F1B, e.desc.chunks = 4;
    pdp_launch(2, NULL, ierr_rank, &e);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, e.st[1], pdp_status_name);
    ASSERT(strstr(e.msg[1], "2 stages x 4 chunks = 8 pieces but the model has 6 cut points"));
    /* chunks without the interleaved schedule; the interleaved schedule on one stage */
    memset(&e, 0, sizeof e);
    e.desc.chunks = 2;
    pdp_launch(2, NULL, ierr_rank, &e);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, e.st[0], pdp_status_name);
    ASSERT(strstr(e.msg[0], "chunks 2 needs PDP_PP_INTERLEAVED_1F1B"));
    memset(&e, 0, sizeof e);
    e.desc.schedule = PDP_PP_INTERLEAVED_1F1B;
    pdp_launch(1, NULL, ierr_rank, &e);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, e.st[0], pdp_status_name);
    ASSERT(strstr(e.msg[0], "PDP_PP_INTERLEAVED_1F1B on 1 stage"));
    /* a stage of 2 chunks has no single range of layers */
    memset(&e, 0, sizeof e);
    e.desc.schedule = PDP_PP_INTERLEAVED_1F1B;
    pdp_launch(2, NULL, ierr_rank, &e);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, e.st[1], pdp_status_name);
    ASSERT(strstr(e.msg[1], "stage 1 holds 2 chunks, not one range of layers: ask "
                            "pdp_pp_chunk_layers"));
    PASS();
}

/* pdp_pp_report against each rank's report written here from its stats, its split and the
   formula by hand: m (2 v - [s = 0] - [s = p - 1]) messages of b T C 4 bytes (b = rows / m;
   T / 2 positions under SP with TP 2) and the tied wte's gradient, V C 4 bytes, on the
   first and last stages; the formula's bytes and messages are also the measured ones (every
   micro-batch of b rows). 1F1B on 3 stages (m 3: a middle stage without the tied term);
   interleaved v 2 on TP 2 + SP x PP 2 (m 2); DP 2 x TP 2 x PP 2, 1F1B (m 3). Before the
   first pass PDP_ERR_STATE, into 64 bytes PDP_ERR_INVALID; NULL PDP_ERR_INVALID naming it. */
TEST pp_report_is_the_stats_beside_the_formulas(void)
{
    static gpt_case c;
    static const struct { int p, v, m, tp, dp; } k[3] = {
        {3, 1, 3, 1, 1}, {2, 2, 2, 2, 1}, {2, 1, 3, 2, 2}};
    pdp_gpt_desc gd = gpt_desc(4);
    char want[512], msg[64];
    int i, r, j, n;
    for (i = 0; i < 3; i++) {
        int p = k[i].p, v = k[i].v, ranks = p * k[i].tp * k[i].dp;
        gpt_data(&c);
        c.layers = 4, c.steps = STEPS, c.m = k[i].m, c.tp = k[i].tp, c.dp = k[i].dp;
        c.chunks = v > 1 ? v : 0, c.sp = v > 1;
        c.schedule = v > 1 ? PDP_PP_INTERLEAVED_1F1B : PDP_PP_1F1B;
        snprintf(msg, sizeof msg, "p %d v %d m %d TP %d DP %d", p, v, c.m, c.tp, c.dp);
        ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_launch(ranks, NULL, gpt_rank, &c),
                        pdp_status_name);
        for (r = 0; r < ranks; r++) {
            const pdp_pp_stats *st = &c.stats[r];
            int s = r / c.tp % p;
            int64_t msgs = (int64_t)c.m * (2 * v - (s == 0) - (s == p - 1));
            int64_t act = GB / k[i].dp / c.m * (GT / (c.sp ? c.tp : 1)) * gd.dim * 4;
            int64_t tied = s == 0 || s == p - 1 ? gd.vocab * gd.dim * 4 : 0;
            ASSERT_ENUM_EQm(msg, PDP_ERR_STATE, c.early[r], pdp_status_name);
            ASSERT_ENUM_EQm(msg, PDP_ERR_INVALID, c.short_buf[r], pdp_status_name);
            ASSERT_EQm(msg, msgs, st->messages);
            ASSERT_EQm(msg, msgs * act + tied, st->bytes_sent);
            n = snprintf(want, sizeof want, "PP stage %d of %d: layers", s, p);
            for (j = 0; j < v; j++) /* piece j p + s: first[j p + s] .. the next piece's - 1 */
                n += snprintf(want + n, sizeof want - n, " %d..%d", c.first[r][j * p + s],
                              c.first[r][j * p + s + 1] - 1);
            snprintf(want + n, sizeof want - n, ", activations %.2f MB (peak)\n  sent a step: "
                     "%lld bytes in %lld messages (m (2v - [s=0] - [s=p-1]) = %lld, x b T C 4 + "
                     "V C 4 tied = %lld)\n  bubble %.3f measured over %d steps; pdp's "
                     "(p-1)/(v m+p-1) = %.3f, Megatron's (p-1)/(v m) = %.3f\n",
                     (double)st->peak_activation_bytes / 1e6, (long long)st->bytes_sent,
                     (long long)st->messages, (long long)msgs, (long long)(msgs * act + tied),
                     1.0 - st->total_compute_s / st->total_step_s, STEPS,
                     (p - 1.0) / (v * c.m + p - 1.0), (p - 1.0) / (v * c.m));
            ASSERT_STR_EQm(msg, want, c.report[r]);
        }
    }
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_pp_report(NULL, want, sizeof want), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "pdp_pp_report"));
    PASS();
}

/* pdp_pp_rank_report: a rank's memory and the bytes it sent a step over TP and DP, measured
   by the test itself (pdp_tp_get_stats of the stage model over the run, and the DP group's
   counters from after pdp_pp_create to after the run, over the steps), beside the formulas
   computed here from the GPT's sizes: TP 2 (t - 1) / t x 2 m R b T C 4 with R the stage's
   ColumnParallelLinear layers and b the rows of a micro-batch (equal micro-batches), DP
   2 (d - 1) / d x 4 P; the measured bytes equal the formulas; then pdp_pp_report's lines,
   indented. On DP 2 x TP 2 x PP 2 (train_gpt_3d's mesh), TP 2 x PP 2 interleaved (v 2: the
   chunks' TP counters summed), DP 2 x PP 2 (no TP: 0 bytes, R = 0) and TP 2 x PP 2 with FULL
   recomputation (each g again: 3 m R); a collective the test runs on the DP group after the
   run is not counted. Refused: before the
   first pass (PDP_ERR_STATE), the optimizer of another model and a short buffer
   (PDP_ERR_INVALID), a sequence-parallel stage (PDP_ERR_UNSUPPORTED), NULL. */
TEST pp_rank_report_is_the_counters_beside_the_formulas(void)
{
    static gpt_case c;
    static const struct { int p, v, m, tp, dp; bool sp, full; } k[5] = {
        {2, 1, 3, 2, 2, false, false}, {2, 2, 2, 2, 1, false, false},
        {2, 1, 3, 1, 2, false, false}, {2, 1, 2, 2, 1, false, true}, {2, 1, 2, 2, 1, true, false}};
    pdp_gpt_desc gd = gpt_desc(4);
    char want[1024], msg[64];
    int i, r;
    for (i = 0; i < 5; i++) {
        int ranks = k[i].p * k[i].tp * k[i].dp, regions = k[i].full ? 3 : 2;
        gpt_data(&c);
        c.layers = 4, c.steps = STEPS, c.m = k[i].m, c.tp = k[i].tp, c.dp = k[i].dp;
        c.chunks = k[i].v > 1 ? k[i].v : 0, c.sp = k[i].sp, c.rank_reports = true;
        c.recompute = k[i].full ? PDP_RECOMPUTE_FULL : PDP_RECOMPUTE_NONE;
        c.schedule = k[i].v > 1 ? PDP_PP_INTERLEAVED_1F1B : PDP_PP_1F1B;
        snprintf(msg, sizeof msg, "p %d v %d m %d TP %d DP %d%s%s", k[i].p, k[i].v, c.m, c.tp,
                 c.dp, c.sp ? " SP" : "", k[i].full ? " FULL" : "");
        ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_launch(ranks, NULL, gpt_rank, &c),
                        pdp_status_name);
        for (r = 0; r < ranks; r++) {
            double P = (double)c.params[r], t = c.tp, d = c.dp;
            int64_t b = GB / c.dp / c.m, tp_sent = c.tps[r].bytes_sent / STEPS;
            double tp_formula = 2.0 * (t - 1) / t * regions * c.m * c.regions[r] * b * GT *
                                gd.dim * 4; /* FULL recomputation runs each g again */
            ASSERT_ENUM_EQm(msg, PDP_ERR_STATE, c.rank_st[r][0], pdp_status_name);
            ASSERT_ENUM_EQm(msg, PDP_ERR_INVALID, c.rank_st[r][1], pdp_status_name);
            if (c.sp) {
                ASSERT_ENUM_EQm(msg, PDP_ERR_UNSUPPORTED, c.rank_st[r][3], pdp_status_name);
                continue;
            }
            ASSERT_ENUM_EQm(msg, PDP_ERR_INVALID, c.rank_st[r][2], pdp_status_name);
            ASSERT_ENUM_EQm(msg, PDP_OK, c.rank_st[r][3], pdp_status_name);
            ASSERTm(msg, c.tp == 1 || c.regions[r] > 0);
            ASSERT_IN_RANGEm(msg, tp_formula, (double)tp_sent, 0.5); /* measured = formula */
            ASSERT_IN_RANGEm(msg, 2.0 * (d - 1) / d * 4 * P, (double)(c.dp_sent[r] / STEPS), 0.5);
            snprintf(want, sizeof want, "  memory, MB: parameters %.2f  gradients %.2f  AdamW "
                     "state %.2f\n  sent a step, bytes: TP %lld (2(t-1)/t x %d m R b T C 4 = %.0f, "
                     "R = %d TP regions)\n    DP %lld (2(d-1)/d x 4 params = %.0f)\n  %s",
                     4 * P / 1e6, 4 * P / 1e6, 8 * P / 1e6, (long long)tp_sent, regions, tp_formula,
                     c.regions[r], (long long)(c.dp_sent[r] / STEPS), 2.0 * (d - 1) / d * 4 * P,
                     c.report[r]);
            ASSERT_STR_EQm(msg, want, c.rank_report[r]);
        }
    }
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_pp_rank_report(NULL, NULL, want, sizeof want),
                   pdp_status_name);
    ASSERT_STR_EQ("pdp_pp_rank_report: pp is NULL", pdp_last_error());
    PASS();
}

TEST pp_interleaved_stats_format(void)
{
    pdp_pp_stats st;
    char line[512];
    memset(&st, 0, sizeof st);
    /* stage 0 of 2, v = 2, m = 4: bubble 1 - 1.5 / 2 = 0.25 against pdp's 1 / 9 = 0.11 (met)
       and Megatron's 1 / 8; 5 micro-batch chunks held; 4 (2 v - 1) = 12 messages */
    st.stage = 0, st.stages = 2, st.micro_batches = 4, st.chunks = 2;
    st.schedule = PDP_PP_INTERLEAVED_1F1B;
    st.total_step_s = 2.0, st.total_compute_s = 1.5;
    st.bubble_theory = 1.0 / 9.0, st.bubble_megatron = 1.0 / 8.0;
    st.peak_in_flight = 5, st.peak_activation_bytes = 2500000, st.messages = 12;
    ASSERT_EQ(pdp_pp_stats_format(&st, NULL, 0), pdp_pp_stats_format(&st, line, sizeof line));
    ASSERT_STR_EQ("stage 0: compute 1.50 s  bubble 0.25 (pdp's (p-1)/(v*m+p-1) = 0.11, margin "
                  "0.10: missed; Megatron's (p-1)/(v*m) = 0.12)  peak activations 5 micro-batch "
                  "chunks = 2.50 MB  messages 12 a pass (m(2v-[s=0]-[s=p-1]) = 12)\n", line);
    PASS();
}

SUITE(pp)
{
    RUN_TEST(pp_gpipe_and_1f1b_equal_single_device_on_the_whole_batch);
    RUN_TEST(pp_cnn_cut_after_conv_and_before_flatten);
    RUN_TEST(pp_callers_loss_mse);
    RUN_TEST(pp_2d_dp_x_pp_equals_single_device);
    RUN_TEST(pp_clip_grad_norm_equals_single_device_clipping);
    RUN_TEST(pp_clip_grad_norm_nan_fails_on_every_stage);
    RUN_TEST(pp_schedules_memory_and_bytes);
    RUN_TEST(pp_schedule_lists);
    RUN_TEST(pp_balance_by_parameters_and_by_time);
    RUN_TEST(pp_balance_matches_brute_force);
    RUN_TEST(pp_balance_by_work);
    RUN_TEST(pp_stats_format_reads_the_figures);
    RUN_TEST(pp_trace_draws_one_lane_per_stage);
    RUN_TEST(pp_errors);
    RUN_TEST(pp_failed_pass_names_call_stage_and_action_on_every_rank);
    RUN_TEST(pp_interleaved_equals_single_device);
    RUN_TEST(pp_interleaved_schedule_lists);
    RUN_TEST(pp_schedules_cannot_deadlock);
    RUN_TEST(pp_interleaved_lists_meet_the_bubble_formula);
    RUN_TEST(pp_interleaved_gpt_equals_single_device);
    RUN_TEST(pp_trace_lanes_are_the_world_ranks);
    RUN_TEST(pp_gpt_own_loss_reports_the_sum_of_the_shares);
    RUN_TEST(pp_interleaved_tp_gpt_equals_single_device);
    RUN_TEST(pp_sequence_parallel_gpt_equals_single_device);
    RUN_TEST(pp_gpt_balanced_by_time_and_work);
    RUN_TEST(pp_interleaved_checkpoint_resumes_at_another_stage_count);
    RUN_TEST(pp_interleaved_stage_model_settings_reach_the_chunks);
    RUN_TEST(pp_create_refuses_a_zero3_model_without_its_parameter_block);
    RUN_TEST(pp_checkpoint_of_a_stage_without_parameters);
    RUN_TEST(pp_interleaved_errors);
    RUN_TEST(pp_gpt_stages_that_do_not_fit_say_how_many_do);
    RUN_TEST(pp_interleaved_stats_format);
    RUN_TEST(pp_report_is_the_stats_beside_the_formulas);
    RUN_TEST(pp_rank_report_is_the_counters_beside_the_formulas);
}

GREATEST_MAIN_DEFS();

int main(int argc, char **argv)
{
    GREATEST_MAIN_BEGIN();
    RUN_SUITE(pp);
    GREATEST_MAIN_END();
}
