/* test_tp.c - tensor parallelism (Megatron's MLP block) on the local backend.

   Equivalence: N thread ranks (1-4) of one TP communicator train a model of two TP
   blocks (f, ColumnParallelLinear, act, RowParallelLinear, g; the first at layer 0, the
   second mid-model so f's backward all-reduce runs, a replicated LayerNorm between
   them) with widths 10 and 7, which 3 and 4 do not divide; every rank's slices must
   equal the slices of one model trained on the same batches (<= 1e-5 relative; exact at
   step 0: initialisation takes the slice of the full draw), replicated tensors (the
   row-parallel biases, the LayerNorm) must be the same bits on every rank, and the
   losses must match. 2-D: 4 ranks as 2 DDP groups x 2 TP groups (and 2 x 3 on 6 ranks)
   equal the same single-device run. Clipping: pdp_clip_grad_norm on TP (2 and 3 ranks)
   and DP x TP (2 x 2, 2 x 3, after pdp_ddp_finish), and pdp_zero_clip_grad_norm under
   ZeRO stages 1-3 over the DP groups, at max_norms that clip no step, some steps and
   every step (set from the single-device norms): the same training as one device
   clipping with pdp_clip_grad_norm, the returned norm the single device's (2e-6
   relative) and the same bits on every rank. Ranks that built different TP widths (8
   and 12 hidden features, 3 and 5 outputs, a block more) fail at the first forward
   and again at the next, every rank with PDP_ERR_INVALID naming the layer and both
   widths. Traffic: the stats count one forward all-reduce of B x d per block and one
   backward of B x in (none for the block at layer 0), and the ring figure. Checkpoints: a TP save on 3 ranks writes the bytes pdp_checkpoint_save writes
   for the single-device model holding the same values; it loads on one device and into
   2 TP ranks, which then train on as the single device does. Errors: block order,
   missing communicator, a width below the TP size, a late pdp_model_set_tp, a TP
   checkpoint of a plain model, a rank that stops after the first step (timeout naming
   g), a bad max_norm and a pipeline stage refused by pdp_clip_grad_norm, and the hot
   loop allocates nothing. */

#define _POSIX_C_SOURCE 200809L /* this file includes system headers before pdp.h */
#include <stdlib.h>
#include <stdatomic.h>
#include <pthread.h>
static atomic_long test_allocs;
static void *test_malloc(size_t n)
{
    atomic_fetch_add(&test_allocs, 1);
    return malloc(n);
}
#define PDP_MALLOC(n) test_malloc(n)
#define PDP_FREE(p) free(p)
#define PDP_IMPLEMENTATION
#include "pdp.h"
#include "pdp_test.h"
#include "test_platform.h"

#define MAXR 6
#define IN 6
#define H1 10 /* first block's hidden width: 3 and 4 do not divide it */
#define D1 9  /* its output */
#define H2 7  /* second block's hidden width */
#define CLASSES 3
#define B 12 /* global batch */
#define STEPS 4

/* ---- models and data ---- */

/* The single-device model: Linear(10) ReLU Linear(9) LayerNorm Tanh Linear(7) GELU
   Linear(3). */
static pdp_status build_plain(pdp_model **out)
{
    pdp_model_desc md;
    pdp_model *m = NULL;
    pdp_status st;
    memset(&md, 0, sizeof md);
    md.input_shape[0] = IN;
    md.seed = 7;
    if ((st = pdp_model_create(&m, &md))) return st;
    if ((st = pdp_model_add_linear(m, H1)) || (st = pdp_model_add_relu(m)) ||
        (st = pdp_model_add_linear(m, D1)) || (st = pdp_model_add_layernorm(m, 0.0f)) ||
        (st = pdp_model_add_tanh(m)) ||
        (st = pdp_model_add_linear(m, H2)) || (st = pdp_model_add_gelu(m)) ||
        (st = pdp_model_add_linear(m, CLASSES))) {
        pdp_model_free(m);
        return st;
    }
    *out = m;
    return PDP_OK;
}

/* The same model with both Linear pairs as TP blocks on tp (the LayerNorm between them,
   like the row-parallel biases, replicated on every TP rank). */
static pdp_status build_tp(pdp_model **out, pdp_comm *tp)
{
    pdp_model_desc md;
    pdp_model *m = NULL;
    pdp_status st;
    memset(&md, 0, sizeof md);
    md.input_shape[0] = IN;
    md.seed = 7;
    *out = NULL;
    if ((st = pdp_model_create(&m, &md))) return st;
    if ((st = pdp_model_set_tp(m, tp)) || (st = pdp_model_add_tp_copy(m)) ||
        (st = pdp_model_add_column_parallel_linear(m, H1)) || (st = pdp_model_add_relu(m)) ||
        (st = pdp_model_add_row_parallel_linear(m, D1)) || (st = pdp_model_add_tp_reduce(m)) ||
        (st = pdp_model_add_layernorm(m, 0.0f)) || (st = pdp_model_add_tanh(m)) ||
        (st = pdp_model_add_tp_copy(m)) ||
        (st = pdp_model_add_column_parallel_linear(m, H2)) || (st = pdp_model_add_gelu(m)) ||
        (st = pdp_model_add_row_parallel_linear(m, CLASSES)) ||
        (st = pdp_model_add_tp_reduce(m))) {
        pdp_model_free(m);
        return st;
    }
    *out = m;
    return PDP_OK;
}

static void make_batch(int step, float *x, int32_t *y)
{
    int i, f;
    for (i = 0; i < B; i++) {
        for (f = 0; f < IN; f++) {
            uint32_t h = (uint32_t)((step * 131 + i) * 2654435761u) ^ (uint32_t)(f * 40503u);
            h ^= h >> 15;
            h *= 0x2c1b3c6du;
            h ^= h >> 12;
            x[i * IN + f] = (float)(h & 0xffff) / 65536.0f * 2.0f - 1.0f;
        }
        y[i] = (int32_t)((i * 5 + step) % CLASSES);
    }
}

static pdp_optim_desc adam(void)
{
    pdp_optim_desc od;
    memset(&od, 0, sizeof od);
    od.kind = PDP_OPTIM_ADAM;
    od.lr = 0.01f;
    return od;
}

/* The reference: the plain model after `steps` Adam steps on the global batches
   from `first`; its parameters (ref_params, filled by reference()), losses and, when
   it clips (max_norm clip >= 0; < 0: no clipping), the norms pdp_clip_grad_norm
   returned. */
static float ref_params[4096], ref_losses[2 * STEPS], ref_init[4096], ref_norms[STEPS];
static int64_t ref_count;

static pdp_status train_steps_clip(pdp_model *m, pdp_optim *o, int first, int steps,
                                   float *losses, float clip, float *norms)
{
    float x[B * IN], loss;
    int32_t y[B];
    int64_t shape[2] = {B, IN};
    pdp_tensor xt;
    pdp_status st;
    int s;
    pdp_tensor_wrap(x, pdp_cpu(), 2, shape, &xt);
    for (s = 0; s < steps; s++) {
        make_batch(first + s, x, y);
        if ((st = pdp_model_forward_backward(m, &xt, y, &loss))) return st;
        if (clip >= 0.0f && (st = pdp_clip_grad_norm(m, clip, &norms[s]))) return st;
        if ((st = pdp_optim_step(o))) return st;
        pdp_model_zero_grad(m);
        if (losses) losses[s] = loss;
    }
    return PDP_OK;
}

static pdp_status train_steps(pdp_model *m, pdp_optim *o, int first, int steps, float *losses)
{
    return train_steps_clip(m, o, first, steps, losses, -1.0f, NULL);
}

static pdp_status reference_clip(float clip)
{
    pdp_model *m = NULL;
    pdp_optim *o = NULL;
    pdp_optim_desc od = adam();
    pdp_status st;
    if ((st = build_plain(&m)) || (st = pdp_optim_create(&o, m, &od))) goto out;
    memcpy(ref_init, m->param_block, (size_t)m->param_count * sizeof(float));
    if ((st = train_steps_clip(m, o, 0, STEPS, ref_losses, clip, ref_norms))) goto out;
    memcpy(ref_params, m->param_block, (size_t)m->param_count * sizeof(float));
    ref_count = m->param_count;
out:
    pdp_optim_free(o);
    pdp_model_free(m);
    return st;
}

static pdp_status reference(void) { return reference_clip(-1.0f); }

/* Whether TP parameter p is a slice (tp.h: the column-parallel weight and bias, the
   row-parallel weight); every other parameter is replicated on every TP rank. */
static bool is_slice(const pdp_model *m, int p)
{
    const pdp__layer *l = &m->layers[m->params[p].layer];
    return l->kind == PDP__COLUMN_PARALLEL_LINEAR ||
           (l->kind == PDP__ROW_PARALLEL_LINEAR && p == l->param_first);
}

/* Element i of TP parameter p's slice: its index in the full tensor (written from the
   layout tp.h states, apart from tp.c's own mapping). */
static int64_t full_index(const pdp_model *m, int p, int64_t i)
{
    const pdp__param_entry *e = &m->params[p];
    const pdp__layer *l = &m->layers[e->layer];
    int64_t lo, n;
    if (l->kind != PDP__COLUMN_PARALLEL_LINEAR && l->kind != PDP__ROW_PARALLEL_LINEAR) return i;
    pdp_tp_split(l->tp_full, m->tp.rank, m->tp.size, &lo, &n);
    if (l->kind == PDP__COLUMN_PARALLEL_LINEAR)
        return (p == l->param_first ? lo * l->in_count : lo) + i;
    if (p != l->param_first) return i; /* the row-parallel bias is whole */
    return (i / n) * l->tp_full + lo + i % n;
}

/* Worst |tp - full| over m's slices (vals, in m's layout: m->param_block unless ZeRO
   holds it) against full values in the plain model's layout (same registry order), and
   the largest |full|. */
static void compare_vals(const pdp_model *m, const float *vals, const pdp_model *plain_layout,
                         const float *full, double *worst, double *scale)
{
    int p;
    int64_t i;
    *worst = 0.0;
    *scale = 0.0;
    for (p = 0; p < m->nparams; p++) {
        const pdp__param_entry *e = &m->params[p];
        const float *f = full + plain_layout->params[p].offset;
        for (i = 0; i < e->count; i++) {
            double want = f[full_index(m, p, i)];
            *worst = fmax(*worst, fabs((double)vals[e->offset + i] - want));
            *scale = fmax(*scale, fabs(want));
        }
    }
}

static void compare(const pdp_model *m, const pdp_model *plain_layout, const float *full,
                    double *worst, double *scale)
{
    compare_vals(m, m->param_block, plain_layout, full, worst, scale);
}

/* ---- rank threads ---- */

typedef struct rank_ctx {
    pdp_local_group *g;
    int rank, size;   /* in the world */
    int dp;           /* DDP groups (1: TP only); TP size = size / dp */
    int zero;         /* > 0: ZeRO of that stage over the DP groups in place of DDP */
    float clip;       /* >= 0: pdp_clip_grad_norm (pdp_zero_clip_grad_norm) at that max_norm
                         every step, after the DP reduction; < 0: no clipping */
    float norms[STEPS];     /* the total norms the clipping call returned */
    int scenario;     /* 0 train, 1 rank size-1 stops after step 0, 2 checkpoint save,
                         3 checkpoint load then train */
    const char *path;
    pdp_status st;
    char msg[1024];
    double worst, scale, init_worst;
    float losses[STEPS];
    float replicated[64]; /* every replicated parameter (row-parallel biases, LayerNorm) */
    int64_t nreplicated;
    long allocs_hot;
    int ckpt_refused; /* ZeRO: checkpoint calls refused as unsupported (of 4) */
    pdp_tp_stats stats;
    int nlayers;
    char names[8][64];
} rank_ctx;

static pdp_model *plain_layout; /* the reference model's registry, for compare() */

static pdp_status fail(rank_ctx *ctx, pdp_status st)
{
    if (st != PDP_OK && ctx->st == PDP_OK) {
        ctx->st = st;
        snprintf(ctx->msg, sizeof ctx->msg, "%s", pdp_last_error());
    }
    return st;
}

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

static void *rank_main(void *arg)
{
    rank_ctx *ctx = (rank_ctx *)arg;
    pdp_comm *world = NULL, *tp = NULL, *dp = NULL;
    pdp_model *m = NULL;
    pdp_optim *o = NULL;
    pdp_ddp *d = NULL;
    pdp_zero *z = NULL;
    pdp_optim_desc od = adam();
    int T = ctx->size / ctx->dp, r = ctx->rank, dpr = r / T, local = B / ctx->dp, s, p;
    static float gathered[MAXR][4096]; /* ZeRO: each rank's gathered parameters */
    float x[B * IN], loss;
    int32_t y[B];
    int64_t shape[2] = {local, IN};
    pdp_tensor xt;
    long before = 0;
    double scale;
    if (fail(ctx, pdp_comm_create_local(&world, ctx->g, r))) return NULL;
    /* TP groups of consecutive ranks; DP groups of the ranks with the same TP rank */
    if (fail(ctx, pdp_comm_split(world, r / T, r, &tp)) ||
        fail(ctx, pdp_comm_split(world, r % T, r, &dp)) || fail(ctx, build_tp(&m, tp)))
        goto out;
    compare(m, plain_layout, ref_init, &ctx->init_worst, &scale);
    ctx->nlayers = m->nlayers;
    for (p = 0; p < m->nparams && p < 8; p++) snprintf(ctx->names[p], sizeof ctx->names[p], "%s", m->params[p].name);
    if (ctx->zero) {
        pdp_zero_desc zd;
        memset(&zd, 0, sizeof zd);
        zd.stage = ctx->zero;
        if (fail(ctx, pdp_zero_create(&z, m, dp, &zd)) ||
            fail(ctx, pdp_zero_optim_create(&o, z, &od)))
            goto out;
    } else if (fail(ctx, pdp_optim_create(&o, m, &od)) ||
               (ctx->dp > 1 && fail(ctx, pdp_ddp_create(&d, m, dp, NULL)))) {
        goto out;
    }
    if (ctx->scenario == 3) {
        if (fail(ctx, pdp_tp_checkpoint_load(ctx->path, m, o))) goto out;
        compare(m, plain_layout, ref_init, &ctx->init_worst, &scale); /* the loaded values */
    }
    pdp_tensor_wrap(x + dpr * local * IN, pdp_cpu(), 2, shape, &xt);
    for (s = 0; s < STEPS; s++) {
        if (ctx->scenario == 1 && r == ctx->size - 1 && s == 1) {
            /* ran the first step (and its width check), never the second; leaves last */
            pthread_mutex_lock(&absent_mu);
            while (absent_done < ctx->size - 1) pthread_cond_wait(&absent_cv, &absent_mu);
            pthread_mutex_unlock(&absent_mu);
            goto out;
        }
        make_batch(ctx->scenario == 3 ? STEPS + s : s, x, y);
        if (s == 1) before = atomic_load(&test_allocs);
        if (z) { /* the shards hold the DP-averaged gradients after finish */
            if (fail(ctx, pdp_zero_forward_backward(z, &xt, y + dpr * local, &loss)) ||
                fail(ctx, pdp_zero_finish(z)) ||
                (ctx->clip >= 0.0f &&
                 fail(ctx, pdp_zero_clip_grad_norm(z, ctx->clip, &ctx->norms[s]))) ||
                fail(ctx, pdp_zero_step(z, o)))
                goto out;
        } else if (d) { /* each slice averaged over its DP group after finish */
            if (fail(ctx, pdp_ddp_forward_backward(d, &xt, y + dpr * local, &loss)) ||
                fail(ctx, pdp_ddp_finish(d)) ||
                (ctx->clip >= 0.0f && fail(ctx, pdp_clip_grad_norm(m, ctx->clip, &ctx->norms[s]))) ||
                fail(ctx, pdp_ddp_step(d, o)))
                goto out;
        } else if (fail(ctx, pdp_model_forward_backward(m, &xt, y, &loss)) ||
                   (ctx->clip >= 0.0f &&
                    fail(ctx, pdp_clip_grad_norm(m, ctx->clip, &ctx->norms[s]))) ||
                   fail(ctx, pdp_optim_step(o))) {
            goto out;
        } else {
            pdp_model_zero_grad(m);
        }
        if (s == 1) ctx->allocs_hot = atomic_load(&test_allocs) - before;
        ctx->losses[s] = loss;
        if (s == 0) pdp_tp_get_stats(m, &ctx->stats);
        if (ctx->scenario == 2 && s == STEPS / 2 - 1) break;
    }
    if (ctx->scenario == 2 && fail(ctx, pdp_tp_checkpoint_save(ctx->path, m, o))) goto out;
    if (ctx->scenario == 1) goto out;
    if (z) { /* ZeRO over TP: no checkpoint call may write slices under full names (the
                directory does not exist: a call that went ahead fails with PDP_ERR_IO) */
        static const char *nowhere = "/nonexistent-pdp-dir/tp-zero";
        ctx->ckpt_refused = (pdp_zero_checkpoint_save(z, o, nowhere) == PDP_ERR_UNSUPPORTED) +
                            (pdp_zero_checkpoint_consolidate(z, o, nowhere) ==
                             PDP_ERR_UNSUPPORTED) +
                            (pdp_tp_checkpoint_save(nowhere, m, NULL) == PDP_ERR_UNSUPPORTED) +
                            (pdp_tp_checkpoint_load(nowhere, m, NULL) == PDP_ERR_UNSUPPORTED);
    }
    if (z && fail(ctx, pdp_zero_gather_params(z, gathered[r]))) goto out;
    compare_vals(m, z ? gathered[r] : m->param_block, plain_layout, ref_params, &ctx->worst,
                 &ctx->scale);
    for (p = 0; p < m->nparams; p++) {
        const pdp__param_entry *e = &m->params[p];
        if (is_slice(m, p)) continue;
        memcpy(ctx->replicated + ctx->nreplicated, (z ? gathered[r] : m->param_block) + e->offset,
               (size_t)e->count * sizeof(float));
        ctx->nreplicated += e->count;
    }
out:
    if (ctx->scenario == 1 && r != ctx->size - 1) finished_one();
    pdp_ddp_free(d);
    pdp_optim_free(o);
    pdp_zero_free(z);
    pdp_model_free(m);
    pdp_comm_free(dp);
    pdp_comm_free(tp);
    pdp_comm_free(world);
    return NULL;
}

/* n thread ranks in dp DP groups of n / dp TP ranks, clipping at clip (< 0: not),
   under ZeRO stage zero over the DP groups (0: DDP when dp > 1). */
static void run_ranks_cfg(rank_ctx *ctx, int n, int dp, int scenario, const char *path,
                          double timeout_s, float clip, int zero)
{
    pthread_t th[MAXR];
    pdp_comm_desc cd;
    pdp_local_group *g = NULL;
    int r;
    memset(&cd, 0, sizeof cd);
    cd.timeout_s = timeout_s;
    memset(ctx, 0, sizeof *ctx * (size_t)n);
    if (pdp_local_group_create(&g, n, &cd) != PDP_OK) return;
    for (r = 0; r < n; r++) {
        ctx[r].g = g;
        ctx[r].rank = r;
        ctx[r].size = n;
        ctx[r].dp = dp;
        ctx[r].zero = zero;
        ctx[r].clip = clip;
        ctx[r].scenario = scenario;
        ctx[r].path = path;
        pthread_create(&th[r], NULL, rank_main, &ctx[r]);
    }
    for (r = 0; r < n; r++) pthread_join(th[r], NULL);
    pdp_local_group_free(g);
}

static void run_ranks(rank_ctx *ctx, int n, int dp, int scenario, const char *path,
                      double timeout_s)
{
    run_ranks_cfg(ctx, n, dp, scenario, path, timeout_s, -1.0f, 0);
}

/* Every rank: no error, init exact, parameters and losses as the single device's,
   replicated parameters the same bits as rank 0's. */
static enum greatest_test_res check_equivalence(rank_ctx *ctx, int n, int steps)
{
    int r, s;
    for (r = 0; r < n; r++) {
        if (ctx[r].st != PDP_OK) FAILm(ctx[r].msg);
        ASSERT_EQ(0.0, ctx[r].init_worst);
        if (ctx[r].worst > 1e-5 * ctx[r].scale) {
            fprintf(stderr, "rank %d of %d: worst %g, scale %g\n", r, n, ctx[r].worst,
                    ctx[r].scale);
            FAIL();
        }
        for (s = 0; s < steps; s++)
            ASSERT_IN_RANGE(ref_losses[s], ctx[r].losses[s], 1e-5f * (1.0f + ref_losses[s]));
        ASSERT_EQ(ctx[0].nreplicated, ctx[r].nreplicated);
        ASSERT(ctx[r].nreplicated > 0);
        ASSERT_MEM_EQ(ctx[0].replicated, ctx[r].replicated,
                      (size_t)ctx[r].nreplicated * sizeof(float));
    }
    PASS();
}

/* ---- tests ---- */

TEST tp_split_covers_the_width_unevenly(void)
{
    int64_t lo, n, next = 0;
    int r;
    for (r = 0; r < 4; r++) {
        pdp_tp_split(10, r, 4, &lo, &n);
        ASSERT_EQ(next, lo);
        ASSERT_EQ(r < 2 ? 3 : 2, n);
        next = lo + n;
    }
    ASSERT_EQ(10, next);
    pdp_tp_split(7, 2, 3, &lo, &n);
    ASSERT_EQ(5, lo);
    ASSERT_EQ(2, n);
    PASS();
}

TEST tp_equals_single_device_on_1_to_4_ranks(void)
{
    rank_ctx ctx[MAXR];
    int n;
    for (n = 1; n <= 4; n++) {
        enum greatest_test_res res;
        run_ranks(ctx, n, 1, 0, NULL, 0);
        res = check_equivalence(ctx, n, STEPS);
        if (res != GREATEST_TEST_RES_PASS) {
            fprintf(stderr, "TP over %d ranks\n", n);
            return res;
        }
    }
    PASS();
}

TEST tp_names_are_the_single_device_state_dict_names(void)
{
    rank_ctx ctx[MAXR];
    int p;
    run_ranks(ctx, 2, 1, 0, NULL, 0);
    if (ctx[0].st != PDP_OK) FAILm(ctx[0].msg);
    ASSERT_EQ(12, ctx[0].nlayers);
    for (p = 0; p < 8; p++) ASSERT_STR_EQ(plain_layout->params[p].name, ctx[0].names[p]);
    ASSERT_STR_EQ("2.weight", ctx[1].names[2]);
    PASS();
}

TEST tp_counts_one_allreduce_per_block_each_way(void)
{
    rank_ctx ctx[MAXR];
    int n = 3;
    int64_t fwd = (int64_t)B * (D1 + CLASSES) * 4, bwd = (int64_t)B * D1 * 4;
    run_ranks(ctx, n, 1, 0, NULL, 0);
    if (ctx[0].st != PDP_OK) FAILm(ctx[0].msg);
    ASSERT_EQ(2, ctx[1].stats.forward_allreduces);  /* g of each block */
    ASSERT_EQ(1, ctx[1].stats.backward_allreduces); /* f of the second only: the first is
                                                       layer 0 and needs no input gradient */
    ASSERT_EQ(fwd, ctx[1].stats.forward_bytes);
    ASSERT_EQ(bwd, ctx[1].stats.backward_bytes);
    ASSERT_EQ((int64_t)(2.0 * (n - 1) / n * (double)(fwd + bwd)), ctx[1].stats.bytes_sent);
    PASS();
}

TEST tp_hot_loop_allocates_nothing(void)
{
    rank_ctx ctx[MAXR];
    run_ranks(ctx, 2, 1, 0, NULL, 0);
    if (ctx[0].st != PDP_OK) FAILm(ctx[0].msg);
    ASSERT_EQ(0, ctx[0].allocs_hot);
    run_ranks_cfg(ctx, 2, 1, 0, NULL, 0, 1e-3f, 0); /* clipping every step: collective */
    if (ctx[0].st != PDP_OK) FAILm(ctx[0].msg);
    ASSERT_EQ(0, ctx[0].allocs_hot);
    PASS();
}

TEST tp_2d_ddp_across_groups_equals_single_device(void)
{
    rank_ctx ctx[MAXR];
    enum greatest_test_res res;
    run_ranks(ctx, 4, 2, 0, NULL, 0); /* 2 DP x 2 TP */
    if ((res = check_equivalence(ctx, 4, 0)) != GREATEST_TEST_RES_PASS) return res;
    run_ranks(ctx, 6, 2, 0, NULL, 0); /* 2 DP x 3 TP: uneven slices */
    if ((res = check_equivalence(ctx, 6, 0)) != GREATEST_TEST_RES_PASS) return res;
    PASS();
}

/* Every rank's clipping returned the single-device norm, the same bits on every rank. */
static enum greatest_test_res check_norms(rank_ctx *ctx, int n)
{
    int r, s;
    for (r = 0; r < n; r++) {
        for (s = 0; s < STEPS; s++)
            ASSERT_IN_RANGE(ref_norms[s], ctx[r].norms[s], 2e-6 * ref_norms[s]);
        ASSERT_MEM_EQ(ctx[0].norms, ctx[r].norms, sizeof ctx[r].norms);
    }
    PASS();
}

/* The single-device norms without clipping: the max_norms below are set from them so
   that one never clips, one clips some steps and one clips every step. */
static void clip_levels(float levels[3])
{
    float lo = FLT_MAX, hi = 0.0f;
    int s;
    reference_clip(FLT_MAX);
    for (s = 0; s < STEPS; s++) {
        lo = fminf(lo, ref_norms[s]);
        hi = fmaxf(hi, ref_norms[s]);
    }
    levels[0] = 2.0f * hi; /* inactive: the returned norm must still be the global one */
    levels[1] = 0.9f * lo; /* just below: the ranks' own norms were below it */
    levels[2] = 0.3f * lo; /* active: every rank must scale by the same coefficient */
}

/* The reference clipped at `clip` as claimed by clip_levels: level 0 never, 2 always. */
static enum greatest_test_res check_reference_clips(float clip, int level)
{
    int s, clipped = 0;
    ASSERT_EQ(PDP_OK, reference_clip(clip));
    for (s = 0; s < STEPS; s++) clipped += ref_norms[s] > clip;
    if (level == 0) ASSERT_EQ(0, clipped);
    if (level == 2) ASSERT_EQ(STEPS, clipped);
    if (level == 1) ASSERT(clipped > 0);
    PASS();
}

TEST tp_clip_grad_norm_is_the_global_norm_on_tp_and_dp_x_tp(void)
{
    static const int shapes[][2] = {{2, 1}, {3, 1}, {4, 2}, {6, 2}}; /* ranks, DP groups */
    rank_ctx ctx[MAXR];
    float levels[3];
    int k, i;
    enum greatest_test_res res;
    clip_levels(levels);
    for (k = 0; k < 3; k++) {
        if ((res = check_reference_clips(levels[k], k)) != GREATEST_TEST_RES_PASS) return res;
        for (i = 0; i < 4; i++) {
            int n = shapes[i][0], dp = shapes[i][1];
            run_ranks_cfg(ctx, n, dp, 0, NULL, 0, levels[k], 0);
            if ((res = check_equivalence(ctx, n, dp == 1 ? STEPS : 0)) != GREATEST_TEST_RES_PASS ||
                (res = check_norms(ctx, n)) != GREATEST_TEST_RES_PASS) {
                fprintf(stderr, "%d ranks (%d DP x %d TP), max_norm %g\n", n, dp, n / dp,
                        (double)levels[k]);
                return res;
            }
        }
    }
    ASSERT_EQ(PDP_OK, reference()); /* restore ref_init and ref_params for other tests */
    PASS();
}

TEST tp_zero_clip_grad_norm_counts_slices_and_replicas_once(void)
{
    static const int shapes[][2] = {{4, 2}, {6, 2}}; /* 2 DP x 2 TP, 2 DP x 3 TP */
    rank_ctx ctx[MAXR];
    float levels[3];
    int k, i, stage, r;
    enum greatest_test_res res;
    clip_levels(levels);
    for (k = 0; k < 3; k++) {
        if ((res = check_reference_clips(levels[k], k)) != GREATEST_TEST_RES_PASS) return res;
        for (stage = 1; stage <= 3; stage++)
            for (i = 0; i < 2; i++) {
                int n = shapes[i][0], dp = shapes[i][1];
                run_ranks_cfg(ctx, n, dp, 0, NULL, 0, levels[k], stage);
                for (r = 0; r < n; r++) ASSERT_EQ(4, ctx[r].ckpt_refused);
                if ((res = check_equivalence(ctx, n, 0)) != GREATEST_TEST_RES_PASS ||
                    (res = check_norms(ctx, n)) != GREATEST_TEST_RES_PASS) {
                    fprintf(stderr, "ZeRO stage %d, %d ranks (%d DP x %d TP), max_norm %g\n",
                            stage, n, dp, n / dp, (double)levels[k]);
                    return res;
                }
            }
    }
    ASSERT_EQ(PDP_OK, reference());
    PASS();
}

TEST tp_clip_grad_norm_refuses_bad_max_norm_and_a_pipeline_stage(void)
{
    static const float bad[] = {NAN, INFINITY, -1.0f};
    pdp_model *m = NULL;
    float norm = 1.0f;
    int i;
    ASSERT_EQ(PDP_OK, build_plain(&m));
    for (i = 0; i < 3; i++) {
        ASSERT_EQ(PDP_ERR_INVALID, pdp_clip_grad_norm(m, bad[i], &norm));
        ASSERT(strstr(pdp_last_error(), "pdp_clip_grad_norm: max_norm") == pdp_last_error());
        ASSERT_EQ(0.0f, norm);
    }
    /* a pipeline stage holds one stage's gradients: its clipping is pdp_pp_clip_grad_norm's */
    m->wrapped = PDP__WRAP_PP;
    ASSERT_EQ(PDP_ERR_STATE, pdp_clip_grad_norm(m, 1.0f, &norm));
    ASSERT(strstr(pdp_last_error(), "pdp_clip_grad_norm: ") == pdp_last_error());
    ASSERT(strstr(pdp_last_error(), "pdp_pp_clip_grad_norm") != NULL);
    m->wrapped = PDP__WRAP_NONE;
    ASSERT_EQ(PDP_OK, pdp_clip_grad_norm(m, 1.0f, &norm));
    pdp_model_free(m);
    PASS();
}

/* ---- ranks that built different TP widths ---- */

typedef struct width_ctx {
    pdp_local_group *g;
    int rank;
    int64_t hidden, out; /* the ColumnParallelLinear's and RowParallelLinear's widths */
    bool extra_block;    /* a second block after the first */
    pdp_status st[2];    /* the first and the second forward-backward */
    char msg[2][1024];
} width_ctx;

static void *width_main(void *arg)
{
    width_ctx *ctx = (width_ctx *)arg;
    pdp_model_desc md;
    pdp_model *m = NULL;
    pdp_comm *c = NULL;
    float x[B * IN], loss;
    int32_t y[B];
    int64_t shape[2] = {B, IN};
    pdp_tensor xt;
    pdp_status st;
    int k;
    memset(&md, 0, sizeof md);
    md.input_shape[0] = IN;
    md.seed = 7;
    ctx->st[0] = ctx->st[1] = PDP_ERR_STATE;
    if ((st = pdp_comm_create_local(&c, ctx->g, ctx->rank)) || (st = pdp_model_create(&m, &md)) ||
        (st = pdp_model_set_tp(m, c)) || (st = pdp_model_add_tp_copy(m)) ||
        (st = pdp_model_add_column_parallel_linear(m, ctx->hidden)) ||
        (st = pdp_model_add_relu(m)) || (st = pdp_model_add_row_parallel_linear(m, ctx->out)) ||
        (st = pdp_model_add_tp_reduce(m)) ||
        (ctx->extra_block &&
         ((st = pdp_model_add_tp_copy(m)) || (st = pdp_model_add_column_parallel_linear(m, 4)) ||
          (st = pdp_model_add_relu(m)) || (st = pdp_model_add_row_parallel_linear(m, ctx->out)) ||
          (st = pdp_model_add_tp_reduce(m))))) {
        snprintf(ctx->msg[0], sizeof ctx->msg[0], "build: %.900s", pdp_last_error());
        goto out;
    }
    make_batch(0, x, y);
    for (k = 0; k < B; k++) y[k] %= 3; /* fewer outputs than CLASSES in some cases */
    pdp_tensor_wrap(x, pdp_cpu(), 2, shape, &xt);
    for (k = 0; k < 2; k++) { /* the check runs again: every rank fails again, none hangs */
        ctx->st[k] = pdp_model_forward_backward(m, &xt, y, &loss);
        snprintf(ctx->msg[k], sizeof ctx->msg[k], "%s", pdp_last_error());
    }
out:
    pdp_model_free(m);
    pdp_comm_free(c);
    return NULL;
}

/* Runs n ranks; rank r builds hidden[r], out[r], extra block when r == extra_rank. */
static void run_widths(width_ctx *ctx, int n, const int64_t *hidden, const int64_t *out,
                       int extra_rank)
{
    pthread_t th[MAXR];
    pdp_comm_desc cd;
    pdp_local_group *g = NULL;
    int r;
    memset(&cd, 0, sizeof cd);
    cd.timeout_s = 5.0; /* a hang would end here, as a failure */
    memset(ctx, 0, sizeof *ctx * (size_t)n);
    if (pdp_local_group_create(&g, n, &cd) != PDP_OK) return;
    for (r = 0; r < n; r++) {
        ctx[r].g = g;
        ctx[r].rank = r;
        ctx[r].hidden = hidden[r];
        ctx[r].out = out[r];
        ctx[r].extra_block = r == extra_rank;
        pthread_create(&th[r], NULL, width_main, &ctx[r]);
    }
    for (r = 0; r < n; r++) pthread_join(th[r], NULL);
    pdp_local_group_free(g);
}

TEST tp_ranks_that_built_different_widths_fail_at_the_first_forward(void)
{
    static const int64_t same[3] = {12, 12, 12}, h812[3] = {8, 12, 8}, o3[3] = {3, 3, 3},
                         o35[3] = {3, 3, 5};
    width_ctx ctx[3];
    int r, k;
    /* the hidden width: 8 on TP ranks 0 and 2, 12 on TP rank 1 */
    run_widths(ctx, 3, h812, o3, -1);
    for (r = 0; r < 3; r++)
        for (k = 0; k < 2; k++) {
            ASSERT_ENUM_EQm(ctx[r].msg[k], PDP_ERR_INVALID, ctx[r].st[k], pdp_status_name);
            ASSERT(strstr(ctx[r].msg[k], "pdp_model_forward") == ctx[r].msg[k]);
            ASSERT(strstr(ctx[r].msg[k], "layer 1 (ColumnParallelLinear)") != NULL);
            ASSERT(strstr(ctx[r].msg[k], "12 on TP rank 1") != NULL);
            ASSERT(strstr(ctx[r].msg[k], "8 on TP rank 0") != NULL);
        }
    /* the RowParallelLinear's output: 5 on TP rank 2 */
    run_widths(ctx, 3, same, o35, -1);
    for (r = 0; r < 3; r++) {
        ASSERT_ENUM_EQm(ctx[r].msg[0], PDP_ERR_INVALID, ctx[r].st[0], pdp_status_name);
        ASSERT(strstr(ctx[r].msg[0], "layer 3 (RowParallelLinear)") != NULL);
        ASSERT(strstr(ctx[r].msg[0], "5 on TP rank 2") != NULL);
        ASSERT(strstr(ctx[r].msg[0], "3 on TP rank 0") != NULL);
    }
    /* a second block on TP rank 1 only */
    run_widths(ctx, 2, same, o3, 1);
    for (r = 0; r < 2; r++) {
        ASSERT_ENUM_EQm(ctx[r].msg[0], PDP_ERR_INVALID, ctx[r].st[0], pdp_status_name);
        ASSERT(strstr(ctx[r].msg[0], "8 TP layers on TP rank 1 but 4 on TP rank 0") != NULL);
        ASSERT(strstr(ctx[r].msg[0], "layer 5 (CopyToModelParallelRegion)") != NULL);
    }
    /* the same widths train */
    run_widths(ctx, 3, same, o3, -1);
    for (r = 0; r < 3; r++)
        for (k = 0; k < 2; k++) ASSERT_ENUM_EQm(ctx[r].msg[k], PDP_OK, ctx[r].st[k], pdp_status_name);
    PASS();
}

/* The bytes of a file (malloc'd; *len). */
static unsigned char *slurp(const char *path, long *len)
{
    FILE *f = fopen(path, "rb");
    unsigned char *buf;
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *len = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = (unsigned char *)malloc((size_t)*len + 1);
    if (buf && fread(buf, 1, (size_t)*len, f) != (size_t)*len) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    return buf;
}

TEST tp_checkpoint_is_the_single_device_file_and_loads_anywhere(void)
{
    rank_ctx ctx[MAXR];
    char dir[256], path[300], plain_path[300];
    pdp_model *m = NULL;
    pdp_optim *o = NULL;
    pdp_optim_desc od = adam();
    unsigned char *a, *b;
    long la = 0, lb = 0;
    int r;
    ASSERT_EQ(0, test_temp_dir(dir, sizeof dir, "pdp_test_tp"));
    snprintf(path, sizeof path, "%s/tp.safetensors", dir);
    snprintf(plain_path, sizeof plain_path, "%s/plain.safetensors", dir);
    /* 3 TP ranks train STEPS/2 steps and save */
    run_ranks(ctx, 3, 1, 2, path, 0);
    for (r = 0; r < 3; r++)
        if (ctx[r].st != PDP_OK) FAILm(ctx[r].msg);
    /* the single device loads it, re-saves the same bytes, and trains on */
    ASSERT_EQ(PDP_OK, build_plain(&m));
    ASSERT_EQ(PDP_OK, pdp_optim_create(&o, m, &od));
    ASSERT_EQ_FMT(PDP_OK, pdp_checkpoint_load(path, m, o), "%d");
    ASSERT_EQ(STEPS / 2, pdp_optim_steps(o));
    memcpy(ref_init, m->param_block, sizeof(float) * (size_t)m->param_count); /* as loaded */
    ASSERT_EQ(PDP_OK, pdp_checkpoint_save(plain_path, m, o));
    a = slurp(path, &la);
    b = slurp(plain_path, &lb);
    ASSERT(a && b);
    ASSERT_EQ(la, lb);
    ASSERT(memcmp(a, b, (size_t)la) == 0);
    free(a);
    free(b);
    /* 2 TP ranks load it and train STEPS more steps beside the single device */
    ASSERT_EQ(PDP_OK, train_steps(m, o, STEPS, STEPS, ref_losses + STEPS));
    memcpy(ref_params, m->param_block, sizeof(float) * (size_t)m->param_count);
    pdp_optim_free(o);
    pdp_model_free(m);
    run_ranks(ctx, 2, 1, 3, path, 0);
    for (r = 0; r < 2; r++) {
        int s;
        if (ctx[r].st != PDP_OK) FAILm(ctx[r].msg);
        ASSERT_EQ(0.0, ctx[r].init_worst); /* loaded: the file's slices, exactly */
        if (ctx[r].worst > 1e-5 * ctx[r].scale) {
            fprintf(stderr, "rank %d: worst %g, scale %g\n", r, ctx[r].worst, ctx[r].scale);
            FAIL();
        }
        for (s = 0; s < STEPS; s++)
            ASSERT_IN_RANGE(ref_losses[STEPS + s], ctx[r].losses[s],
                            1e-5f * (1.0f + ref_losses[STEPS + s]));
    }
    remove(path);
    remove(plain_path);
    (void)test_remove_tree(dir);
    ASSERT_EQ(PDP_OK, reference()); /* restore ref_init and ref_params for other tests */
    PASS();
}

TEST tp_block_order_and_state_errors(void)
{
    pdp_model_desc md;
    pdp_model *m = NULL;
    pdp_local_group *g = NULL;
    pdp_comm *c = NULL;
    memset(&md, 0, sizeof md);
    md.input_shape[0] = IN;
    ASSERT_EQ(PDP_OK, pdp_model_create(&m, &md));
    ASSERT_EQ(PDP_ERR_STATE, pdp_model_add_tp_copy(m));
    ASSERT(strstr(pdp_last_error(), "pdp_model_add_tp_copy") == pdp_last_error());
    ASSERT(strstr(pdp_last_error(), "pdp_model_set_tp") != NULL);
    ASSERT_EQ(PDP_ERR_STATE, pdp_tp_checkpoint_save("/tmp/x", m, NULL));
    ASSERT(strstr(pdp_last_error(), "pdp_tp_checkpoint_save: the model has no TP") != NULL);
    ASSERT_EQ(PDP_OK, pdp_local_group_create(&g, 1, NULL));
    ASSERT_EQ(PDP_OK, pdp_comm_create_local(&c, g, 0));
    ASSERT_EQ(PDP_OK, pdp_model_set_tp(m, c));
    ASSERT(pdp_model_tp(m) == c);
    ASSERT_EQ(PDP_ERR_STATE, pdp_model_add_column_parallel_linear(m, 4));
    ASSERT(strstr(pdp_last_error(), "must follow f") != NULL);
    ASSERT_EQ(PDP_ERR_STATE, pdp_model_add_row_parallel_linear(m, 4));
    ASSERT(strstr(pdp_last_error(), "ColumnParallelLinear") != NULL);
    ASSERT_EQ(PDP_OK, pdp_model_add_tp_copy(m));
    ASSERT_EQ(PDP_ERR_STATE, pdp_model_add_tp_reduce(m));
    ASSERT(strstr(pdp_last_error(), "must follow a RowParallelLinear") != NULL);
    ASSERT_EQ(PDP_OK, pdp_model_add_column_parallel_linear(m, 4));
    ASSERT_EQ(PDP_OK, pdp_model_add_layernorm(m, 0));
    ASSERT_EQ(PDP_ERR_STATE, pdp_model_add_row_parallel_linear(m, 4)); /* not element-wise */
    ASSERT_EQ(PDP_ERR_STATE, pdp_model_set_tp(m, c));
    ASSERT(strstr(pdp_last_error(), "already has 2 TP layers") != NULL);
    ASSERT_STR_EQ("CopyToModelParallelRegion", pdp_model_layer_name(m, 0));
    ASSERT_STR_EQ("ColumnParallelLinear", pdp_model_layer_name(m, 1));
    /* the plain checkpoint functions and DP's replicas refuse a model of slices */
    ASSERT_EQ(PDP_ERR_STATE, pdp_checkpoint_save("/tmp/pdp_test_tp_refused", m, NULL));
    ASSERT(strstr(pdp_last_error(), "pdp_checkpoint_save: ") == pdp_last_error());
    ASSERT(strstr(pdp_last_error(), "use pdp_tp_checkpoint_save") != NULL);
    ASSERT_EQ(PDP_ERR_STATE, pdp_checkpoint_load("/tmp/pdp_test_tp_refused", m, NULL));
    ASSERT(strstr(pdp_last_error(), "use pdp_tp_checkpoint_load") != NULL);
    {
        pdp_dp *dp = NULL;
        ASSERT_EQ(PDP_ERR_UNSUPPORTED, pdp_dp_create(&dp, m, NULL));
        ASSERT(strstr(pdp_last_error(), "tensor-parallel") != NULL);
        ASSERT(dp == NULL);
    }
    pdp_model_free(m);
    pdp_comm_free(c);
    pdp_local_group_free(g);
    PASS();
}

typedef struct narrow_ctx {
    pdp_local_group *g;
    int rank;
    pdp_status st;
    char msg[1024];
} narrow_ctx;

/* A width below the TP size leaves a rank without features. */
static void *narrow_main(void *arg)
{
    narrow_ctx *ctx = (narrow_ctx *)arg;
    pdp_model_desc md;
    pdp_model *m = NULL;
    pdp_comm *c = NULL;
    memset(&md, 0, sizeof md);
    md.input_shape[0] = IN;
    if ((ctx->st = pdp_comm_create_local(&c, ctx->g, ctx->rank)) == PDP_OK &&
        (ctx->st = pdp_model_create(&m, &md)) == PDP_OK &&
        (ctx->st = pdp_model_set_tp(m, c)) == PDP_OK &&
        (ctx->st = pdp_model_add_tp_copy(m)) == PDP_OK)
        ctx->st = pdp_model_add_column_parallel_linear(m, 2);
    snprintf(ctx->msg, sizeof ctx->msg, "%s", pdp_last_error());
    pdp_model_free(m);
    pdp_comm_free(c);
    return NULL;
}

TEST tp_width_below_the_tp_size_fails(void)
{
    narrow_ctx ctx[3];
    pthread_t th[3];
    pdp_local_group *g = NULL;
    int r;
    ASSERT_EQ(PDP_OK, pdp_local_group_create(&g, 3, NULL));
    for (r = 0; r < 3; r++) {
        ctx[r].g = g;
        ctx[r].rank = r;
        pthread_create(&th[r], NULL, narrow_main, &ctx[r]);
    }
    for (r = 0; r < 3; r++) pthread_join(th[r], NULL);
    pdp_local_group_free(g);
    for (r = 0; r < 3; r++) {
        ASSERT_EQ(PDP_ERR_INVALID, ctx[r].st);
        ASSERT(strstr(ctx[r].msg, "pdp_model_add_column_parallel_linear: layer 1 "
                                  "(ColumnParallelLinear)") == ctx[r].msg);
        ASSERT(strstr(ctx[r].msg, "out_features 2 < TP size 3") != NULL);
    }
    PASS();
}

TEST tp_absent_rank_times_out_in_g(void)
{
    rank_ctx ctx[MAXR];
    int r;
    run_ranks(ctx, 3, 1, 1, NULL, PDP_TEST_TIMEOUT(0.25));
    for (r = 0; r < 2; r++) {
        ASSERT_EQ_FMT(PDP_ERR_TIMEOUT, ctx[r].st, "%d");
        ASSERT(strstr(ctx[r].msg, "pdp_model_forward") != NULL);
        ASSERT(strstr(ctx[r].msg, "ReduceFromModelParallelRegion") != NULL);
        ASSERT(strstr(ctx[r].msg, "g forward") != NULL);
    }
    PASS();
}

SUITE(tp)
{
    RUN_TEST(tp_split_covers_the_width_unevenly);
    RUN_TEST(tp_equals_single_device_on_1_to_4_ranks);
    RUN_TEST(tp_names_are_the_single_device_state_dict_names);
    RUN_TEST(tp_counts_one_allreduce_per_block_each_way);
    RUN_TEST(tp_hot_loop_allocates_nothing);
    RUN_TEST(tp_2d_ddp_across_groups_equals_single_device);
    RUN_TEST(tp_checkpoint_is_the_single_device_file_and_loads_anywhere);
    RUN_TEST(tp_block_order_and_state_errors);
    RUN_TEST(tp_width_below_the_tp_size_fails);
    RUN_TEST(tp_absent_rank_times_out_in_g);
    RUN_TEST(tp_clip_grad_norm_is_the_global_norm_on_tp_and_dp_x_tp);
    RUN_TEST(tp_zero_clip_grad_norm_counts_slices_and_replicas_once);
    RUN_TEST(tp_clip_grad_norm_refuses_bad_max_norm_and_a_pipeline_stage);
    RUN_TEST(tp_ranks_that_built_different_widths_fail_at_the_first_forward);
}

GREATEST_MAIN_DEFS();

int main(int argc, char **argv)
{
    GREATEST_MAIN_BEGIN();
    if (reference() != PDP_OK || build_plain(&plain_layout) != PDP_OK) {
        fprintf(stderr, "test_tp: the reference run failed: %s\n", pdp_last_error());
        return 1;
    }
    RUN_SUITE(tp);
    pdp_model_free(plain_layout);
    GREATEST_MAIN_END();
}
