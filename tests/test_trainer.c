/* test_trainer.c - the strategy-agnostic front (src/trainer.c) on the local backend.

   Equivalence: a GPT (its head tied to the token embedding, dropout 0.1, a -1 target a
   sequence) trains 3 AdamW steps (nanoGPT's decay groups) with its gradients clipped to
   norm 0.5 through pdp_trainer under every strategy, single, DP at 1-3 workers, DDP and
   ZeRO 1-3 at 1-3 thread ranks (each rank its slice of the global batch), and each rank's
   parameters, and
   the norms before clipping, equal one device trained by the direct calls
   (pdp_model_forward_backward, pdp_clip_grad_norm, pdp_optim_step) within 1e-5; the first
   step's norm is above 0.5, so clipping scales. Memory: pdp_trainer_get_memory gives the
   bytes of the formulas, 4 Psi of parameters and 8 Psi of Adam's state on a whole replica
   (single, DP, DDP) and 4 x the shard at ZeRO where it shards them. Steps 2-3 allocate
   nothing (one rank). PDP_BATCH_MEAN_GLOBAL: DDP and ZeRO 1-3 on uneven shards that
   ignore different numbers of positions equal one device on the whole batch. Errors: an
   unknown strategy, DP or single with a communicator, DDP or ZeRO without one, a ZeRO
   stage other than the strategy's, an executor's or the optimizer's refusal, each
   PDP_ERR_INVALID with a message naming pdp_trainer_create and the field; the model is
   free again after a refused create; strategy names round-trip and an unknown one is
   refused; pdp_trainer_get_desc fills the defaults in.
   pdp_trainer_memory_report: DP's line from pdp_dp_get_stats, the others' from
   pdp_trainer_get_memory with Psi and the activations counted here; its refusals.
   desc.accum_steps: k micro-batches a step average to one device's whole batch under every
   strategy, one reduction a step; its refusals (a count wrong, ranks that differ).

   cc -std=c99 -O2 -Itests -I. tests/test_trainer.c -lm -lpthread (or make) */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#define PDP_IMPLEMENTATION
#include "counting_alloc.h" /* PDP_MALLOC calls: pdp_test_allocs() */
#include "pdp.h"
#include "pdp_test.h"
#include "fixture.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

enum { V = 13, T = 8, BATCH = 6, STEPS = 3, MAXR = 3 }; /* BATCH: divisible by 1, 2, 3 */
#define CLIP 0.5f

typedef struct tcase {
    pdp_strategy strategy;
    int n;                        /* DP's workers, or DDP's and ZeRO's ranks */
    int32_t ids[BATCH * T], tg[BATCH * T];
    float *params[MAXR];          /* each rank's parameters after STEPS steps */
    float norms[MAXR][STEPS];     /* each rank's norm before clipping, step by step */
    float losses[STEPS];          /* rank 0's */
    int64_t count;                /* parameters */
    pdp_zero_memory mm[MAXR];
    long step_allocs;             /* PDP_MALLOC calls in the steps after the first, all ranks */
} tcase;

static pdp_model *gpt_with_dropout(float dropout)
{
    pdp_gpt_desc d;
    pdp_model *m = NULL;
    memset(&d, 0, sizeof d);
    d.vocab = V, d.context = T, d.layers = 2, d.heads = 2, d.dim = 16, d.seed = 7;
    d.dropout = dropout;
    return pdp_gpt_create(&m, &d) == PDP_OK ? m : NULL;
}

/* each executor keys a sample's masks by its place in the global batch */
static pdp_model *small_gpt(void) { return gpt_with_dropout(0.1f); }

static pdp_optim_desc adamw(void)
{
    pdp_optim_desc od;
    memset(&od, 0, sizeof od);
    od.kind = PDP_OPTIM_ADAMW, od.lr = 1e-2, od.weight_decay = 0.1;
    /* nanoGPT's groups: the 1-D tensors undecayed, in runs that ZeRO's unit slices and DP's
       reduce chunks cut across */
    od.decay_params = PDP_DECAY_MATRICES;
    return od;
}

/* SGD: the gradients' weights show in the parameters (Adam's update of a gradient that is
   0 but for rounding, as the key bias's in attention, is rounding amplified to lr) */
static pdp_optim_desc sgd(void)
{
    pdp_optim_desc od;
    memset(&od, 0, sizeof od);
    od.kind = PDP_OPTIM_SGD, od.lr = 0.5, od.momentum = 0.9;
    return od;
}

/* The parameters after training, whole (ZeRO-3 gathers them), into a new array (NULL when
   out of memory; the caller compares it); *t freed, the model the caller's again. */
static pdp_status take_params(pdp_trainer **t, pdp_model *m, float **out, int64_t *count)
{
    pdp_tensor p;
    pdp_status st = pdp_trainer_gather_params(*t);
    pdp_trainer_free(*t);
    *t = NULL;
    if (st != PDP_OK || (st = pdp_model_flat(m, &p, NULL)) != PDP_OK) return st;
    *count = p.count;
    if ((*out = (float *)malloc((size_t)p.count * sizeof(float))) != NULL)
        memcpy(*out, p.data, (size_t)p.count * sizeof(float));
    return PDP_OK;
}

/* The allocations every rank made so far, less `since`, into *out on rank 0: read while every
   rank waits between two barriers (so that no rank is still in the previous step or already
   past the loop, freeing). */
static pdp_status counted(const pdp_launch_ctx *ctx, long *out, long since)
{
    pdp_status st = ctx->world_size > 1 ? pdp_comm_barrier(ctx->world, NULL) : PDP_OK;
    if (st == PDP_OK && ctx->rank == 0) *out = pdp_test_allocs() - since;
    return st == PDP_OK && ctx->world_size > 1 ? pdp_comm_barrier(ctx->world, NULL) : st;
}

/* One rank's run through the trainer: rank r trains on samples [r b, (r + 1) b). */
static pdp_status trainer_rank(const pdp_launch_ctx *ctx, void *user)
{
    tcase *c = (tcase *)user;
    int r = ctx->rank, n = ctx->world_size, step;
    int64_t b = BATCH / n, shape[2];
    pdp_model *m = small_gpt();
    pdp_trainer *t = NULL;
    pdp_trainer_desc td;
    pdp_tensor x;
    int64_t count = 0;
    long allocs = 0;
    pdp_status st = PDP_OK;
    if (!m) return PDP_ERR_OUT_OF_MEMORY;
    memset(&td, 0, sizeof td);
    td.strategy = c->strategy;
    td.comm = c->strategy >= PDP_STRATEGY_DDP ? ctx->world : NULL;
    td.optim = adamw();
    td.dp.num_workers = c->n;
    td.ddp.bucket_cap_mb = td.ddp.first_bucket_mb = 0.005; /* several buckets and units */
    td.zero.bucket_cap_mb = td.zero.first_bucket_mb = 0.005;
    shape[0] = b, shape[1] = T;
    pdp_tensor_wrap_ids(c->ids + r * b * T, pdp_cpu(), 2, shape, &x);
    if ((st = pdp_trainer_create(&t, m, &td)) != PDP_OK) goto done;
    for (step = 0; step < STEPS; step++) {
        float loss, *want = r == 0 ? &loss : NULL; /* the others need none (trainer.h) */
        if (step == 1 && (st = counted(ctx, &allocs, 0)) != PDP_OK) goto done;
        if ((st = pdp_trainer_forward_backward(t, &x, c->tg + r * b * T, want)) != PDP_OK ||
            (st = pdp_trainer_clip_grad_norm(t, CLIP, &c->norms[r][step])) != PDP_OK ||
            (st = pdp_trainer_step(t)) != PDP_OK)
            goto done;
        if (r == 0) c->losses[step] = loss;
    }
    if ((st = counted(ctx, &c->step_allocs, allocs)) != PDP_OK) goto done;
    if ((st = pdp_trainer_get_memory(t, &c->mm[r])) != PDP_OK) goto done;
    if ((st = take_params(&t, m, &c->params[r], &count)) != PDP_OK) goto done;
    if (r == 0) c->count = count; /* the same on every rank: one writer */
done:
    pdp_trainer_free(t);
    pdp_model_free(m);
    return st;
}

/* The reference: one device, the whole batch, the direct calls. */
static pdp_status one_device(tcase *c, float *params, float *norms, float *losses)
{
    pdp_model *m = small_gpt();
    pdp_optim *o = NULL;
    pdp_optim_desc od = adamw();
    pdp_tensor x, p;
    int64_t shape[2] = {BATCH, T};
    int step;
    pdp_status st;
    if (!m) return PDP_ERR_OUT_OF_MEMORY;
    pdp_tensor_wrap_ids(c->ids, pdp_cpu(), 2, shape, &x);
    st = pdp_optim_create(&o, m, &od);
    for (step = 0; st == PDP_OK && step < STEPS; step++) {
        if ((st = pdp_model_forward_backward(m, &x, c->tg, &losses[step])) == PDP_OK &&
            (st = pdp_clip_grad_norm(m, CLIP, &norms[step])) == PDP_OK)
            st = pdp_optim_step(o);
        pdp_optim_zero_grad(o);
    }
    if (st == PDP_OK && (st = pdp_model_flat(m, &p, NULL)) == PDP_OK)
        memcpy(params, p.data, (size_t)p.count * sizeof(float));
    pdp_optim_free(o);
    pdp_model_free(m);
    return st;
}

TEST trainer_every_strategy_equals_one_device(void)
{
    static tcase c;
    float ref[8192], ref_norms[STEPS], ref_losses[STEPS];
    int64_t umax[MAXR + 1] = {0}; /* U_max under DDP at n ranks */
    int s, n, r, k;
    memset(&c, 0, sizeof c);
    for (k = 0; k < BATCH * T; k++) {
        c.ids[k] = (int32_t)((k * 5 + 3) % V);
        c.tg[k] = k % T == 3 ? -1 : (int32_t)((k * 7 + 1) % V); /* one -1 a sequence */
    }
    ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, one_device(&c, ref, ref_norms, ref_losses),
                    pdp_status_name);
    ASSERT_GT(ref_norms[0], CLIP); /* clipping scales the first step */
    for (s = PDP_STRATEGY_SINGLE; s <= PDP_STRATEGY_ZERO3; s++)
        for (n = 1; n <= (s == PDP_STRATEGY_SINGLE ? 1 : MAXR); n++) {
            int ranks = s >= PDP_STRATEGY_DDP ? n : 1, sharded = s - PDP_STRATEGY_DDP;
            int64_t P4;
            char msg[1100]; /* the launch's message, cut at 1023 bytes, and the case */
            pdp_status st;
            c.strategy = (pdp_strategy)s;
            c.n = n;
            st = pdp_launch(ranks, NULL, trainer_rank, &c);
            snprintf(msg, sizeof msg, "%s, n = %d: %s", pdp_strategy_name(c.strategy), n,
                     st == PDP_OK ? "" : pdp_last_error());
            ASSERT_ENUM_EQm(msg, PDP_OK, st, pdp_status_name);
            ASSERTm(msg, c.count > 0 && c.count <= 8192);
            P4 = 4 * c.count;
            for (r = 0; r < ranks; r++) {
                const pdp_zero_memory *mm = &c.mm[r];
                ASSERTm(msg, c.params[r] != NULL);
                ASSERT_LTEm(msg, fixture_rel_err(c.params[r], ref, c.count), 1e-5);
                for (k = 0; k < STEPS; k++)
                    ASSERT_LTEm(msg, fabs(c.norms[r][k] - ref_norms[k]), 1e-5 * ref_norms[k]);
                /* the formulas' bytes: whole below the stage that shards them */
                ASSERT_EQm(msg, sharded > 0 ? sharded : 0, mm->stage);
                ASSERT_EQm(msg, s >= PDP_STRATEGY_DDP ? n : 1, mm->world_size);
                ASSERT_EQm(msg, sharded >= 3 ? 4 * mm->shard_count : P4, mm->param_bytes);
                ASSERT_EQm(msg, sharded >= 1 ? 8 * mm->shard_count : 2 * P4, mm->optim_bytes);
                /* DDP's plan of the stages uses desc.zero's units, as ZeRO at n does */
                if (sharded == 0) umax[n] = mm->unit_max;
                if (sharded >= 1) ASSERT_EQm(msg, umax[n], mm->unit_max);
                free(c.params[r]);
                c.params[r] = NULL;
            }
            if (s <= PDP_STRATEGY_DP) /* the global batch's loss */
                for (k = 0; k < STEPS; k++)
                    ASSERT_LTEm(msg, fabs(c.losses[k] - ref_losses[k]), 1e-5 * ref_losses[k]);
            ASSERT_EQm(msg, 0, c.step_allocs); /* every rank's steps after the first */
        }
    PASS();
}

/* The reference of the SGD tests below: one device, a dropout-free GPT, rows sequences of
   ids and targets, STEPS steps of the direct calls, clipped at clip (norms[step]: the norm
   before) unless clip is 0; the parameters into params (at most 8192), their count. */
static pdp_status sgd_one_device(int32_t *ids, const int32_t *tg, int64_t rows, float clip,
                                 float *params, float *norms, int64_t *count)
{
    pdp_model *m = gpt_with_dropout(0);
    pdp_optim *o = NULL;
    pdp_optim_desc od = sgd();
    pdp_tensor x, p;
    int64_t shape[2] = {rows, T};
    float loss;
    int step;
    pdp_status st;
    if (!m) return PDP_ERR_OUT_OF_MEMORY;
    pdp_tensor_wrap_ids(ids, pdp_cpu(), 2, shape, &x);
    st = pdp_optim_create(&o, m, &od);
    for (step = 0; st == PDP_OK && step < STEPS; step++) {
        if ((st = pdp_model_forward_backward(m, &x, tg, &loss)) == PDP_OK && clip > 0)
            st = pdp_clip_grad_norm(m, clip, &norms[step]);
        if (st == PDP_OK) st = pdp_optim_step(o);
        pdp_optim_zero_grad(o);
    }
    if (st == PDP_OK && (st = pdp_model_flat(m, &p, NULL)) == PDP_OK) {
        if (p.count > 8192) st = PDP_ERR_OUT_OF_MEMORY; /* more than params holds */
        else memcpy(params, p.data, (size_t)p.count * sizeof(float));
        *count = p.count;
    }
    pdp_optim_free(o);
    pdp_model_free(m);
    return st;
}

/* PDP_BATCH_MEAN_GLOBAL on a GPT: uneven shards (BATCH - 1 = 5 samples: 3 + 2, 2 + 2 + 1)
   whose ranks ignore different numbers of positions (-1), one all ignored on a rank at 3
   ranks: DDP and ZeRO 1-3 train the mean over the global batch's labels that count, one
   device's on the 5 samples, within 1e-6 (SGD; dropout 0: its masks are keyed by r x the
   shard). */
typedef struct gcase {
    pdp_strategy strategy;
    int32_t ids[BATCH * T], tg[BATCH * T];
    float *params[MAXR];
} gcase;

static pdp_status global_rank(const pdp_launch_ctx *ctx, void *user)
{
    gcase *c = (gcase *)user;
    int r = ctx->rank, n = ctx->world_size, step;
    int64_t G = BATCH - 1, first = r * G / n, b = (r + 1) * G / n - first, shape[2] = {b, T};
    pdp_model *m = gpt_with_dropout(0);
    pdp_trainer *t = NULL;
    pdp_trainer_desc td;
    pdp_tensor x;
    int64_t count = 0;
    float loss;
    pdp_status st = PDP_OK;
    if (!m) return PDP_ERR_OUT_OF_MEMORY;
    memset(&td, 0, sizeof td);
    td.strategy = c->strategy, td.comm = ctx->world, td.optim = sgd();
    td.ddp.batch_mean = td.zero.batch_mean = PDP_BATCH_MEAN_GLOBAL;
    td.zero.bucket_cap_mb = td.zero.first_bucket_mb = 0.005;
    pdp_tensor_wrap_ids(c->ids + first * T, pdp_cpu(), 2, shape, &x);
    if ((st = pdp_trainer_create(&t, m, &td)) != PDP_OK) goto done;
    for (step = 0; step < STEPS; step++)
        if ((st = pdp_trainer_forward_backward(t, &x, c->tg + first * T, &loss)) != PDP_OK ||
            (st = pdp_trainer_step(t)) != PDP_OK)
            goto done;
    st = take_params(&t, m, &c->params[r], &count);
done:
    pdp_trainer_free(t);
    pdp_model_free(m);
    return st;
}

TEST trainer_global_batch_mean_counts_a_gpt_s_labels(void)
{
    static gcase c;
    int64_t G = BATCH - 1, count = 0;
    float ref[8192];
    int s, n, r, k;
    memset(&c, 0, sizeof c);
    for (k = 0; k < G * T; k++) { /* sample 0: 6 of 8 ignored; sample 4 (3 ranks: rank 2's
                                      only sample): all of them */
        c.ids[k] = (int32_t)((k * 5 + 3) % V);
        c.tg[k] = (k < T && k % T < 6) || k >= 4 * T ? -1 : (int32_t)((k * 7 + 1) % V);
    }
    ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK,
                    sgd_one_device(c.ids, c.tg, G, 0.0f, ref, NULL, &count), pdp_status_name);
    for (s = PDP_STRATEGY_DDP; s <= PDP_STRATEGY_ZERO3; s++)
        for (n = 2; n <= MAXR; n++) {
            char msg[1100];
            pdp_status st;
            c.strategy = (pdp_strategy)s;
            st = pdp_launch(n, NULL, global_rank, &c);
            snprintf(msg, sizeof msg, "%s, %d ranks: %s", pdp_strategy_name(c.strategy), n,
                     st == PDP_OK ? "" : pdp_last_error());
            ASSERT_ENUM_EQm(msg, PDP_OK, st, pdp_status_name);
            for (r = 0; r < n; r++) {
                ASSERTm(msg, c.params[r] != NULL);
                ASSERT_LTEm(msg, fixture_rel_err(c.params[r], ref, count), 1e-6);
                free(c.params[r]);
                c.params[r] = NULL;
            }
        }
    PASS();
}

/* desc.accum_steps k: a step of k micro-batches, their gradients averaged. With every
   micro-batch's labels counting (no -1) and the shards equal, the mean of the k micro-batch
   means is the mean over the whole batch: one device's single backward on all BATCH samples
   is the reference (SGD with momentum, which shows the gradients' scale; clipped at CLIP),
   for single and DP at k = 2, 3, 6 and DDP and ZeRO 1-3 at (k, ranks) = (3, 2) and (2, 3),
   within 1e-5. DDP and ZeRO reduce once a step (their stats). */
typedef struct acase {
    pdp_strategy strategy;
    int k;
    int32_t ids[BATCH * T], tg[BATCH * T];
    float *params[MAXR], norms[MAXR][STEPS];
    int64_t reductions[MAXR]; /* DDP: synchronised backward passes; ZeRO: the last step's k */
} acase;

static pdp_status accum_rank(const pdp_launch_ctx *ctx, void *user)
{
    acase *c = (acase *)user;
    int r = ctx->rank, n = ctx->world_size, step, j;
    int64_t b = BATCH / (n * c->k), shape[2] = {b, T}, count = 0;
    pdp_model *m = gpt_with_dropout(0);
    pdp_trainer *t = NULL;
    pdp_trainer_desc td;
    pdp_tensor x;
    pdp_status st = PDP_OK;
    if (!m) return PDP_ERR_OUT_OF_MEMORY;
    memset(&td, 0, sizeof td);
    td.strategy = c->strategy, td.optim = sgd(), td.accum_steps = c->k, td.dp.num_workers = 2;
    td.comm = c->strategy >= PDP_STRATEGY_DDP ? ctx->world : NULL;
    td.zero.bucket_cap_mb = td.zero.first_bucket_mb = 0.005;
    if ((st = pdp_trainer_create(&t, m, &td)) != PDP_OK) goto done;
    for (step = 0; step < STEPS; step++) {
        for (j = 0; j < c->k; j++) { /* micro-batch j: rank r's b samples of it */
            int64_t first = (j * n + r) * b * T;
            pdp_tensor_wrap_ids(c->ids + first, pdp_cpu(), 2, shape, &x);
            if ((st = pdp_trainer_forward_backward(t, &x, c->tg + first, NULL)) != PDP_OK)
                goto done;
        }
        if ((st = pdp_trainer_clip_grad_norm(t, CLIP, &c->norms[r][step])) != PDP_OK ||
            (st = pdp_trainer_step(t)) != PDP_OK)
            goto done;
    }
    if (pdp_trainer_ddp(t)) {
        pdp_ddp_stats ds;
        pdp_ddp_get_stats(pdp_trainer_ddp(t), &ds);
        c->reductions[r] = ds.steps;
    } else if (pdp_trainer_zero(t)) {
        pdp_zero_stats zs;
        pdp_zero_get_stats(pdp_trainer_zero(t), &zs);
        c->reductions[r] = zs.micro_steps;
    }
    st = take_params(&t, m, &c->params[r], &count);
done:
    pdp_trainer_free(t);
    pdp_model_free(m);
    return st;
}

TEST trainer_accum_steps_average_the_micro_batches(void)
{
    static acase c;
    static const int cases[][3] = {{PDP_STRATEGY_SINGLE, 2, 1}, {PDP_STRATEGY_SINGLE, 3, 1},
                                   {PDP_STRATEGY_SINGLE, 6, 1}, {PDP_STRATEGY_DP, 3, 1},
                                   {PDP_STRATEGY_DDP, 3, 2},    {PDP_STRATEGY_DDP, 2, 3},
                                   {PDP_STRATEGY_ZERO1, 3, 2},  {PDP_STRATEGY_ZERO2, 2, 3},
                                   {PDP_STRATEGY_ZERO3, 3, 2},  {PDP_STRATEGY_ZERO3, 2, 3}};
    int64_t count = 0;
    float ref[8192], ref_norms[STEPS];
    int i, r, k, step;
    memset(&c, 0, sizeof c);
    for (k = 0; k < BATCH * T; k++) {
        c.ids[k] = (int32_t)((k * 5 + 3) % V);
        c.tg[k] = (int32_t)((k * 7 + 1) % V);
    }
    ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK,
                    sgd_one_device(c.ids, c.tg, BATCH, CLIP, ref, ref_norms, &count),
                    pdp_status_name);
    ASSERT_GT(ref_norms[0], CLIP);
    for (i = 0; i < (int)(sizeof cases / sizeof cases[0]); i++) {
        int n = cases[i][2];
        char msg[1100];
        pdp_status st;
        c.strategy = (pdp_strategy)cases[i][0], c.k = cases[i][1];
        st = pdp_launch(n, NULL, accum_rank, &c);
        snprintf(msg, sizeof msg, "%s, k = %d, %d rank(s): %s", pdp_strategy_name(c.strategy),
                 c.k, n, st == PDP_OK ? "" : pdp_last_error());
        ASSERT_ENUM_EQm(msg, PDP_OK, st, pdp_status_name);
        for (r = 0; r < n; r++) {
            ASSERTm(msg, c.params[r] != NULL);
            ASSERT_LTEm(msg, fixture_rel_err(c.params[r], ref, count), 1e-5);
            for (step = 0; step < STEPS; step++)
                ASSERT_LTEm(msg, fabs(c.norms[r][step] - ref_norms[step]),
                            1e-5 * ref_norms[step]);
            if (c.strategy == PDP_STRATEGY_DDP) ASSERT_EQm(msg, STEPS, c.reductions[r]);
            if (c.strategy >= PDP_STRATEGY_ZERO1) ASSERT_EQm(msg, c.k, c.reductions[r]);
            free(c.params[r]);
            c.params[r] = NULL;
        }
    }
    PASS();
}

/* Each refusal: PDP_ERR_INVALID, a message with the call and the words given. */
static int refused(pdp_model *m, const pdp_trainer_desc *d, const char *w1, const char *w2)
{
    pdp_trainer *t = NULL;
    pdp_status st = pdp_trainer_create(&t, m, d);
    const char *e = pdp_last_error();
    if (st == PDP_ERR_INVALID && !t && strstr(e, "pdp_trainer_create") && strstr(e, w1) &&
        (!w2 || strstr(e, w2)))
        return 1;
    fprintf(stderr, "    got %s: %s (wanted '%s', '%s')\n", pdp_status_name(st), e, w1,
            w2 ? w2 : "");
    pdp_trainer_free(t);
    return 0;
}

static pdp_status errors_rank(const pdp_launch_ctx *ctx, void *user)
{
    int *ok = (int *)user;
    pdp_model *m = small_gpt();
    pdp_trainer *t = NULL;
    pdp_trainer_desc d, got;
    if (!m) return PDP_ERR_OUT_OF_MEMORY;
    memset(&d, 0, sizeof d);
    d.strategy = (pdp_strategy)6;
    ok[0] = refused(m, &d, "strategy 6", "_ZERO3");
    d.strategy = (pdp_strategy)-1;
    ok[1] = refused(m, &d, "strategy -1", NULL);
    d.strategy = PDP_STRATEGY_DP, d.comm = ctx->world;
    ok[2] = refused(m, &d, "strategy dp", "desc.comm");
    d.strategy = PDP_STRATEGY_SINGLE;
    ok[3] = refused(m, &d, "strategy single", "desc.comm");
    d.strategy = PDP_STRATEGY_DDP, d.comm = NULL;
    ok[4] = refused(m, &d, "strategy ddp needs desc.comm", NULL);
    d.strategy = PDP_STRATEGY_ZERO3;
    ok[5] = refused(m, &d, "strategy zero3 needs desc.comm", NULL);
    d.strategy = PDP_STRATEGY_ZERO2, d.comm = ctx->world, d.zero.stage = 4;
    ok[6] = refused(m, &d, "desc.zero.stage 4", "give 2");
    d.zero.stage = 3;
    ok[7] = refused(m, &d, "desc.zero.stage 3", NULL);
    d.zero.stage = 0, d.strategy = PDP_STRATEGY_DP, d.comm = NULL, d.dp.num_workers = -1;
    ok[8] = refused(m, &d, "(strategy dp): pdp_dp_create: num_workers -1", NULL);
    d.dp.num_workers = 0, d.strategy = PDP_STRATEGY_ZERO1, d.comm = ctx->world;
    d.optim.lr = -0.1; /* the optimizer's refusal, after ZeRO wrapped the model */
    ok[9] = refused(m, &d, "(strategy zero1)", "lr");
    ok[10] = refused(NULL, &d, "model is NULL", NULL);
    d.optim.lr = 0; /* the model is free again: a create succeeds, defaults filled in */
    d.strategy = PDP_STRATEGY_DDP;
    ok[11] = pdp_trainer_create(&t, m, &d) == PDP_OK;
    got = pdp_trainer_get_desc(t);
    ok[12] = got.strategy == PDP_STRATEGY_DDP && got.comm == ctx->world &&
             got.ddp.bucket_cap_mb == 25.0 && got.ddp.first_bucket_mb == 1.0 &&
             got.optim.kind == PDP_OPTIM_SGD && got.optim.lr == 0.01 && got.zero.stage == 0 &&
             got.dp.num_workers == 0 && pdp_trainer_ddp(t) && !pdp_trainer_zero(t) &&
             !pdp_trainer_dp(t) && pdp_trainer_model(t) == m && pdp_trainer_optim(t);
    pdp_trainer_free(t);
    d.strategy = PDP_STRATEGY_ZERO2;
    ok[13] = pdp_trainer_create(&t, m, &d) == PDP_OK &&
             pdp_trainer_get_desc(t).zero.stage == 2 && pdp_trainer_zero(t);
    pdp_trainer_free(t);
    pdp_model_free(m);
    return PDP_OK;
}

TEST trainer_refuses_bad_descs_naming_the_field(void)
{
    int ok[14], i, s;
    pdp_strategy got;
    memset(ok, 0, sizeof ok);
    ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_launch(1, NULL, errors_rank, ok),
                    pdp_status_name);
    for (i = 0; i < 14; i++) {
        char msg[32];
        snprintf(msg, sizeof msg, "case %d", i);
        ASSERTm(msg, ok[i]);
    }
    for (s = PDP_STRATEGY_SINGLE; s <= PDP_STRATEGY_ZERO3; s++) {
        ASSERT_ENUM_EQ(PDP_OK, pdp_strategy_from_name(pdp_strategy_name((pdp_strategy)s), &got),
                       pdp_status_name);
        ASSERT_EQ(s, (int)got);
    }
    ASSERT_STR_EQ("unknown", pdp_strategy_name((pdp_strategy)6));
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_strategy_from_name("zero4", &got), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "pdp_strategy_from_name: 'zero4'"));
    ASSERT(strstr(pdp_last_error(), "zero3"));
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_trainer_step(NULL), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "pdp_trainer_step"));
    PASS();
}

/* accum_steps' refusals: negative; a call too many, a clip or step too early (PDP_ERR_STATE,
   the count named, and the step still possible once the count is right); ranks that differ
   (every rank fails). */
static pdp_status accum_errors_rank(const pdp_launch_ctx *ctx, void *user)
{
    int *ok = (int *)user;
    pdp_status st;
    pdp_model *m = gpt_with_dropout(0);
    pdp_trainer *t = NULL;
    pdp_trainer_desc d;
    if (!m) return PDP_ERR_OUT_OF_MEMORY;
    memset(&d, 0, sizeof d);
    d.strategy = PDP_STRATEGY_DDP, d.comm = ctx->world, d.accum_steps = 2 + ctx->rank;
    st = pdp_trainer_create(&t, m, &d);
    ok[ctx->rank] = st == PDP_ERR_INVALID && !t && strstr(pdp_last_error(), "accum_steps");
    pdp_trainer_free(t);
    pdp_model_free(m);
    return PDP_OK;
}

TEST trainer_accum_steps_refuses_a_wrong_count(void)
{
    int32_t ids[2 * T], tg[2 * T];
    int64_t shape[2] = {2, T};
    int ok[2] = {0, 0};
    pdp_model *m = gpt_with_dropout(0);
    pdp_trainer *t = NULL;
    pdp_trainer_desc d;
    pdp_tensor x;
    int k;
    for (k = 0; k < 2 * T; k++) ids[k] = k % V, tg[k] = (k * 3) % V;
    pdp_tensor_wrap_ids(ids, pdp_cpu(), 2, shape, &x);
    ASSERT(m != NULL);
    memset(&d, 0, sizeof d);
    d.accum_steps = -2;
    ASSERT(refused(m, &d, "desc.accum_steps -2", NULL));
    d.accum_steps = 0;
    ASSERT_ENUM_EQ(PDP_OK, pdp_trainer_create(&t, m, &d), pdp_status_name);
    ASSERT_EQ(1, pdp_trainer_get_desc(t).accum_steps); /* 0: the default, none */
    pdp_trainer_free(t);
    d.accum_steps = 3;
    ASSERT_ENUM_EQ(PDP_OK, pdp_trainer_create(&t, m, &d), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_ERR_STATE, pdp_trainer_step(t), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "pdp_trainer_step: 0 of desc.accum_steps 3"));
    ASSERT_ENUM_EQ(PDP_OK, pdp_trainer_forward_backward(t, &x, tg, NULL), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_ERR_STATE, pdp_trainer_clip_grad_norm(t, 1.0f, NULL), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "1 of desc.accum_steps 3 backward passes"));
    ASSERT(strstr(pdp_last_error(), "2 more time(s)"));
    for (k = 0; k < 2; k++)
        ASSERT_ENUM_EQ(PDP_OK, pdp_trainer_forward_backward(t, &x, tg, NULL), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_ERR_STATE, pdp_trainer_forward_backward(t, &x, tg, NULL),
                   pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "3 backward passes since the step"));
    ASSERT_ENUM_EQ(PDP_OK, pdp_trainer_step(t), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_trainer_forward_backward(t, &x, tg, NULL), pdp_status_name);
    pdp_trainer_free(t);
    pdp_model_free(m);
    ASSERT_ENUM_EQ(PDP_OK, pdp_launch(2, NULL, accum_errors_rank, ok), pdp_status_name);
    ASSERTm("rank 0 (accum_steps 2) refused", ok[0]);
    ASSERTm("rank 1 (accum_steps 3) refused", ok[1]);
    PASS();
}

/* An optimizer refused on rank 1 alone (its lr): rank 0's executor and optimizer are fine,
   but it must not return a trainer whose first step waits for a rank that has left. */
typedef struct lone_job {
    pdp_strategy strategy;
    bool differ;       /* rank 1's lr valid but not rank 0's */
    pdp_status st[2];
    char msg[2][1024]; /* pdp_last_error's size */
} lone_job;

static pdp_status lone_failure_rank(const pdp_launch_ctx *ctx, void *user)
{
    lone_job *j = (lone_job *)user;
    pdp_model *m = small_gpt();
    pdp_trainer *t = NULL;
    pdp_trainer_desc d;
    if (!m) return PDP_ERR_OUT_OF_MEMORY;
    memset(&d, 0, sizeof d);
    d.strategy = j->strategy;
    d.comm = ctx->world;
    d.optim.lr = ctx->rank == 1 ? (j->differ ? 0.2 : -0.1) : 0.0;
    j->st[ctx->rank] = pdp_trainer_create(&t, m, &d);
    snprintf(j->msg[ctx->rank], sizeof j->msg[0], "%s", pdp_last_error());
    if (j->st[ctx->rank] == PDP_OK && t == NULL) j->st[ctx->rank] = PDP_ERR_STATE;
    pdp_trainer_free(t); /* no collective: a wrongly built trainer cannot hang the test */
    pdp_model_free(m);
    return PDP_OK;
}

/* ZeRO's create refused on rank 1 alone (its bucket_cap_mb), rank 1 returning last:
   pdp_launch names rank 1's reason, not rank 0's "rank 1 failed" (whose mark of a peer's
   failure ZeRO's clean-up dropped when it kept the message). */
static pdp_status late_failure_rank(const pdp_launch_ctx *ctx, void *user)
{
    pdp_model *m = small_gpt();
    pdp_trainer *t = NULL;
    pdp_trainer_desc d;
    pdp_status st;
    (void)user;
    if (!m) return PDP_ERR_OUT_OF_MEMORY;
    memset(&d, 0, sizeof d);
    d.strategy = PDP_STRATEGY_ZERO3, d.comm = ctx->world;
    if (ctx->rank == 1) d.zero.bucket_cap_mb = -1.0;
    st = pdp_trainer_create(&t, m, &d);
    if (ctx->rank == 1) {
        struct timespec nap = {0, 200000000L}; /* 0.2 s: rank 0 returns first */
        nanosleep(&nap, NULL);
    }
    pdp_trainer_free(t);
    pdp_model_free(m);
    return st;
}

TEST trainer_create_fails_on_every_rank_when_one_fails(void)
{
    static const pdp_strategy strategies[] = {PDP_STRATEGY_DDP, PDP_STRATEGY_ZERO2};
    int s;
    for (s = 0; s < 2; s++) {
        lone_job j;
        memset(&j, 0, sizeof j);
        j.strategy = strategies[s];
        ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_launch(2, NULL, lone_failure_rank, &j),
                        pdp_status_name);
        ASSERT_ENUM_EQm(j.msg[1], PDP_ERR_INVALID, j.st[1], pdp_status_name);
        ASSERT(strstr(j.msg[1], "lr") != NULL);
        ASSERT_ENUM_EQm(j.msg[0], PDP_ERR_COMM, j.st[0], pdp_status_name);
        /* DDP: the trainer's agreement; ZeRO: its optimizer's own (collective) */
        ASSERTm(j.msg[0], strncmp(j.msg[0], "pdp_trainer_create", 18) == 0 &&
                              strstr(j.msg[0], "rank 0: rank 1 of comm 'world' failed (see its "
                                               "message)"));
        /* an lr that is valid on both but differs: every rank refuses it (DDP: the trainer
           compares; ZeRO: its shard optimizer) */
        memset(&j, 0, sizeof j);
        j.strategy = strategies[s], j.differ = true;
        ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_launch(2, NULL, lone_failure_rank, &j),
                        pdp_status_name);
        ASSERT_ENUM_EQm(j.msg[0], PDP_ERR_INVALID, j.st[0], pdp_status_name);
        ASSERT_ENUM_EQm(j.msg[1], PDP_ERR_INVALID, j.st[1], pdp_status_name);
        ASSERTm(j.msg[1], strstr(j.msg[1], "rank 1: SGD lr 0.2 here, but not on every rank"));
    }
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_launch(2, NULL, late_failure_rank, NULL),
                   pdp_status_name);
    ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "pdp_launch: rank 1 of 2: ") &&
                                  strstr(pdp_last_error(), "bucket_cap_mb"));
    PASS();
}

/* pdp_trainer_memory_report after a step, under single, DP (2 workers), DDP and ZeRO-3 (2
   ranks): DP's two lines are pdp_dp_get_stats' master and worker peaks (the master holding
   more), the others pdp_gpt_memory_report of pdp_trainer_get_memory's split, whose
   parameters read 4 Psi (4 Psi / N at ZeRO-3) with Psi counted here, and whose activations
   are the model's at this rank's batch. Refused: DP before its first step (PDP_ERR_STATE),
   batch 0, 16 bytes of buffer, a NULL trainer (PDP_ERR_INVALID naming the call). */
typedef struct mem_job {
    pdp_strategy strategy;
    int workers;
    int64_t count, act;                     /* rank 0's parameters and activations */
    pdp_status st[MAXR][4];                 /* before the step, batch 0, 16 bytes, the report */
    char text[MAXR][1024], want[MAXR][1024];
} mem_job;

static pdp_status memory_rank(const pdp_launch_ctx *ctx, void *user)
{
    mem_job *j = (mem_job *)user;
    int r = ctx->rank, i;
    int64_t b = BATCH / ctx->world_size, shape[2];
    int32_t ids[BATCH * T], tg[BATCH * T];
    pdp_model *m = small_gpt();
    pdp_trainer *t = NULL;
    pdp_trainer_desc td;
    pdp_zero_memory mm;
    pdp_dp_stats ds;
    pdp_tensor x;
    float loss;
    pdp_status st;
    if (!m) return PDP_ERR_OUT_OF_MEMORY;
    for (i = 0; i < BATCH * T; i++) ids[i] = (i * 5 + 1) % V, tg[i] = (i * 3 + 2) % V;
    shape[0] = b, shape[1] = T;
    pdp_tensor_wrap_ids(ids + r * b * T, pdp_cpu(), 2, shape, &x);
    memset(&td, 0, sizeof td);
    td.strategy = j->strategy, td.optim = adamw(), td.dp.num_workers = j->workers;
    td.comm = j->strategy >= PDP_STRATEGY_DDP ? ctx->world : NULL;
    if (r == 0) j->count = pdp_model_param_count(m);
    if (r == 0) j->act = pdp_model_activation_bytes(m, 0, pdp_model_num_layers(m), b);
    if ((st = pdp_trainer_create(&t, m, &td)) != PDP_OK) goto done;
    j->st[r][0] = pdp_trainer_memory_report(t, b, j->text[r], sizeof j->text[r]);
    if ((st = pdp_trainer_forward_backward(t, &x, tg + r * b * T, &loss)) != PDP_OK ||
        (st = pdp_trainer_step(t)) != PDP_OK)
        goto done;
    j->st[r][1] = pdp_trainer_memory_report(t, 0, j->text[r], sizeof j->text[r]);
    j->st[r][2] = pdp_trainer_memory_report(t, b, j->text[r], 16);
    j->st[r][3] = pdp_trainer_memory_report(t, b, j->text[r], sizeof j->text[r]);
    if (j->strategy == PDP_STRATEGY_DP) {
        if ((st = pdp_dp_get_stats(pdp_trainer_dp(t), &ds)) != PDP_OK) goto done;
        snprintf(j->want[r], sizeof j->want[r], "DP, %d workers: the master holds %.2f MB "
                 "(parameters, gradients, AdamW's state, its activations,\n  the gathered "
                 "outputs), each other worker %.2f MB: DP saves nothing and overloads worker 0\n",
                 j->workers, (double)ds.master_bytes / 1e6, (double)ds.replica_bytes / 1e6);
        /* the master holds a replica's share and, beyond it, the parameters the replicas
           read in place (4 Psi) and AdamW's m and v (8 Psi) */
        if (!ds.replica_bytes || ds.master_bytes < ds.replica_bytes + 12 * (size_t)j->count)
            st = PDP_ERR_STATE;
    } else if ((st = pdp_trainer_get_memory(t, &mm)) == PDP_OK)
        st = pdp_gpt_memory_report(m, &mm, b, j->want[r], sizeof j->want[r]);
done:
    pdp_trainer_free(t);
    pdp_model_free(m);
    return st;
}

TEST trainer_memory_report_names_each_strategy_s_memory(void)
{
    static mem_job j;
    static const struct { pdp_strategy s; int ranks, workers; } k[4] = {
        {PDP_STRATEGY_SINGLE, 1, 0}, {PDP_STRATEGY_DP, 1, 2}, {PDP_STRATEGY_DDP, 2, 0},
        {PDP_STRATEGY_ZERO3, 2, 0}};
    char want[128];
    int i, r;
    for (i = 0; i < 4; i++) {
        const char *msg = pdp_strategy_name(k[i].s);
        memset(&j, 0, sizeof j);
        j.strategy = k[i].s, j.workers = k[i].workers;
        ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_launch(k[i].ranks, NULL, memory_rank, &j),
                        pdp_status_name);
        for (r = 0; r < k[i].ranks; r++) {
            double n = k[i].s == PDP_STRATEGY_ZERO3 ? 2 : 1;
            ASSERT_ENUM_EQm(msg, k[i].s == PDP_STRATEGY_DP ? PDP_ERR_STATE : PDP_OK, j.st[r][0],
                            pdp_status_name);
            ASSERT_ENUM_EQm(msg, PDP_ERR_INVALID, j.st[r][1], pdp_status_name);
            ASSERT_ENUM_EQm(msg, PDP_ERR_INVALID, j.st[r][2], pdp_status_name);
            ASSERT_ENUM_EQm(msg, PDP_OK, j.st[r][3], pdp_status_name);
            ASSERT_STR_EQm(msg, j.want[r], j.text[r]);
            if (k[i].s == PDP_STRATEGY_DP) continue;
            snprintf(want, sizeof want, "(4Psi%s %.2f)", n > 1 ? "/N" : "",
                     4.0 * (double)j.count / n / 1e6);
            ASSERTm(msg, strstr(j.text[r], want) != NULL);
            snprintf(want, sizeof want, "activations kept %.2f (%d sequences)", j.act / 1e6,
                     BATCH / k[i].ranks);
            ASSERTm(msg, strstr(j.text[r], want) != NULL);
        }
    }
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_trainer_memory_report(NULL, 1, want, sizeof want),
                   pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "pdp_trainer_memory_report: trainer is NULL"));
    PASS();
}

/* ZeRO-3 freed without pdp_trainer_gather_params (2 ranks): the model's block holds this
   rank's slices and zeros elsewhere. Its forward, pdp_gpt_generate, pdp_gpt_evaluate,
   pdp_checkpoint_save and a new trainer are PDP_ERR_STATE naming the rank and
   pdp_trainer_gather_params, on every rank; pdp_checkpoint_load of a whole file makes it
   whole again (the forward then gives the file's model's logits). With the gather, the
   model is whole and every call works. Before: each returned PDP_OK on the half-zero model
   (generate wrote text from it, the save wrote its zeros). */
typedef struct sliced_job {
    bool gather;
    int ok[2];
    char msg[2][1024];
} sliced_job;

static pdp_status sliced_rank(const pdp_launch_ctx *ctx, void *user)
{
    sliced_job *j = (sliced_job *)user;
    char path[64];
    int32_t ids[2 * T], tg[2 * T], gen[5];
    int64_t shape[2] = {2, T};
    pdp_model *m = gpt_with_dropout(0), *ref = gpt_with_dropout(0);
    pdp_trainer *t = NULL, *t2 = NULL;
    pdp_trainer_desc d;
    const pdp_tensor *y;
    pdp_tensor x;
    pdp_rng r;
    float loss;
    int k, ok = 1;
    if (!m || !ref) return PDP_ERR_OUT_OF_MEMORY;
    for (k = 0; k < 2 * T; k++) ids[k] = k % V, tg[k] = (k * 3) % V;
    pdp_tensor_wrap_ids(ids, pdp_cpu(), 2, shape, &x);
    memset(&d, 0, sizeof d);
    d.strategy = PDP_STRATEGY_ZERO3, d.comm = ctx->world;
    PDP_TRY(pdp_trainer_create(&t, m, &d));
    if (j->gather) PDP_TRY(pdp_trainer_gather_params(t));
    pdp_trainer_free(t);
    snprintf(path, sizeof path, "sliced_%d_%d.safetensors", (int)j->gather, ctx->rank);
    pdp_rng_seed(&r, 1, 0);
#define SLICED(call) (j->gather ? (call) == PDP_OK                                          \
                      : (call) == PDP_ERR_STATE &&                                          \
                        strstr(pdp_last_error(), "pdp_trainer_gather_params") &&            \
                        strstr(pdp_last_error(), ctx->rank ? "rank 1 of 2" : "rank 0 of 2"))
    ok &= SLICED(pdp_model_forward(m, &x, &y));
    if (ok) ok &= SLICED(pdp_model_forward_backward(m, &x, tg, &loss));
    gen[0] = 1, gen[1] = 2;
    if (ok) ok &= SLICED(pdp_gpt_generate(m, gen, 2, 3, 0.0f, 0, &r));
    if (ok) ok &= SLICED(pdp_checkpoint_save(path, m, NULL));
    memset(&d, 0, sizeof d);
    d.strategy = PDP_STRATEGY_DP, d.dp.num_workers = 1; /* an executor: DP's master */
    if (ok) ok &= SLICED(pdp_trainer_create(&t2, m, &d));
#undef SLICED
    snprintf(j->msg[ctx->rank], sizeof j->msg[ctx->rank], "%s", pdp_last_error());
    pdp_trainer_free(t2);
    /* a whole file makes it whole again: the logits of the model in the file */
    if (ok && !j->gather) {
        float want[2 * T * V];
        pdp_model_zero_grad(ref);
        ok &= pdp_checkpoint_save(path, ref, NULL) == PDP_OK &&
              pdp_checkpoint_load(path, m, NULL) == PDP_OK &&
              pdp_model_forward(ref, &x, &y) == PDP_OK;
        if (ok) memcpy(want, y->data, sizeof want);
        ok &= ok && pdp_model_forward(m, &x, &y) == PDP_OK &&
              memcmp(want, y->data, sizeof want) == 0;
    }
    remove(path);
    j->ok[ctx->rank] = ok;
    pdp_model_free(m);
    pdp_model_free(ref);
    return PDP_OK;
}

TEST trainer_zero3_freed_without_gather_refuses_its_slices(void)
{
    int g;
    for (g = 0; g <= 1; g++) {
        sliced_job j;
        memset(&j, 0, sizeof j);
        j.gather = g;
        ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_launch(2, NULL, sliced_rank, &j),
                        pdp_status_name);
        ASSERTm(j.msg[0], j.ok[0]);
        ASSERTm(j.msg[1], j.ok[1]);
    }
    PASS();
}

SUITE(trainer)
{
    RUN_TEST(trainer_memory_report_names_each_strategy_s_memory);
    RUN_TEST(trainer_every_strategy_equals_one_device);
    RUN_TEST(trainer_global_batch_mean_counts_a_gpt_s_labels);
    RUN_TEST(trainer_accum_steps_average_the_micro_batches);
    RUN_TEST(trainer_refuses_bad_descs_naming_the_field);
    RUN_TEST(trainer_accum_steps_refuses_a_wrong_count);
    RUN_TEST(trainer_create_fails_on_every_rank_when_one_fails);
    RUN_TEST(trainer_zero3_freed_without_gather_refuses_its_slices);
}

GREATEST_MAIN_DEFS();

int main(int argc, char **argv)
{
    GREATEST_MAIN_BEGIN();
    RUN_SUITE(trainer);
    GREATEST_MAIN_END();
}
