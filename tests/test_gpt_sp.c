/* test_gpt_sp.c - sequence parallelism (Korthikanti et al. 2022, Megatron-LM) on the
   tensor-parallel GPT (pdp_gpt_desc.sequence_parallel), on the local backend.

   Equivalence: TP 2 and 3 with SP (6 heads, T = 12: both divide), dropout 0 and 0.1,
   recomputation NONE, SELECTIVE and FULL: 4 AdamW steps with clipping at 0.5 give the
   single-device GPT's losses and clipping norms (<= 1e-5) and, rank by rank, its
   parameters (each TP slice against its cut of the full tensor, <= 1e-5 relative), and
   the replicated LayerNorms are the same bits on every rank (their gradients, computed on
   each rank's positions, are summed over TP). With dropout, the masks of the layers on a
   rank's positions must be the single device's (keyed by the global position), or the
   losses differ.

   Traffic (pdp_tp_stats, one step): no all-reduce of activations; 4L + 2 all-gathers and
   4L reduce-scatters of B x T x C floats (f and g of every block forward and backward,
   the gather before the head, the scatter after the embedding), 2L more of each under
   FULL recomputation (the regions' f and g again); 2L + 1 all-reduces of the LayerNorms'
   2C gradients; bytes sent the ring figures, (N-1)/N a gather or scatter, 2(N-1)/N an
   all-reduce: TP's 4L all-reduces of the same tensors send what the 8L gathers and
   scatters of the blocks send.

   Memory (pdp_model_activation_bytes, the model's own count): every layer on a rank's
   positions (residuals, LayerNorms, Dropouts) holds 1/N of the same layer of the TP model
   without SP, and the whole model's activations are the TP model's less the formula
   (per sequence, in floats) (1 - 1/N)(R + 2 L T C) + T C / N... written out below.

   Under DP x TP = 2 x 2 + SP: DDP and ZeRO stages 1-3 on the DP group, each recomputation
   mode (but FULL under stage 3, refused), equal to one device.

   Errors: T that the TP size does not divide, and sequence_parallel without desc.tp.

   cc -std=c99 -O2 -Itests -I. tests/test_gpt_sp.c -lm -lpthread (or make) */
#define _POSIX_C_SOURCE 200809L /* this file includes system headers before pdp.h */
#include <stdlib.h>
#include <stdatomic.h>
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
#include "fixture.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

enum { SB = 2, ST = 12, SC = 24, SL = 2, SH = 6, SV = 13, STEPS = 4, MAXN = 3 };

static pdp_gpt_desc sp_desc(float dropout)
{
    pdp_gpt_desc d;
    memset(&d, 0, sizeof d);
    d.vocab = SV, d.context = ST, d.layers = SL, d.heads = SH, d.dim = SC, d.seed = 7;
    d.dropout = dropout;
    return d;
}

typedef struct sp_case {
    int32_t ids[SB * ST], tg[SB * ST];
    float dropout;
    pdp_recompute recompute;
    const pdp_model *ref;            /* the single-device model after the steps */
    float losses[STEPS], norms[STEPS];
    double worst[MAXN];              /* each rank's largest parameter error against ref */
    float lnf[MAXN][SC];             /* each rank's transformer.ln_f.weight after the steps */
    pdp_tp_stats stats;              /* rank 0's, one step */
    long allocs_hot;                 /* the library's allocations during step 1 (every rank) */
    char path[128];                  /* not empty: the TP checkpoint's file */
    int64_t act_sp, act_tp;          /* rank 0's activation bytes, the whole models */
    int64_t seq_layers, seq_bad;     /* layers on a rank's positions; those not 1/N of TP's */
} sp_case;

/* STEPS steps of AdamW (lr 1e-3, weight decay 0.1) with clipping at 0.5 on m; the losses
   and norms into c when record, the first step's TP stats too. */
static pdp_status sp_train(pdp_model *m, sp_case *c, bool record)
{
    pdp_optim *o = NULL;
    pdp_optim_desc od;
    pdp_tensor x;
    int64_t shape[2] = {SB, ST};
    float loss, norm;
    int s;
    pdp_status st;
    memset(&od, 0, sizeof od);
    od.kind = PDP_OPTIM_ADAMW, od.lr = 1e-3, od.weight_decay = 0.1;
    if ((st = pdp_optim_create(&o, m, &od)) != PDP_OK) return st;
    pdp_tensor_wrap_ids(c->ids, pdp_cpu(), 2, shape, &x);
    for (s = 0; s < STEPS && st == PDP_OK; s++) {
        long before = atomic_load(&test_allocs);
        if ((st = pdp_model_forward_backward(m, &x, c->tg, &loss)) != PDP_OK ||
            (st = pdp_clip_grad_norm(m, 0.5f, &norm)) != PDP_OK ||
            (st = pdp_optim_step(o)) != PDP_OK)
            break;
        pdp_optim_zero_grad(o);
        if (record && s == 1) c->allocs_hot = atomic_load(&test_allocs) - before;
        if (record) {
            c->losses[s] = loss;
            c->norms[s] = norm;
            if (s == 0) pdp_tp_get_stats(m, &c->stats);
        }
    }
    pdp_optim_free(o);
    return st;
}

/* Activation bytes of m and tp (the same GPT, TP without SP) at batch SB, and each layer of
   m on a rank's positions against tp's layer of the same mask index (the same layer of the
   single-device model): it must hold 1/N of it. */
static void sp_memory(const pdp_model *m, const pdp_model *tp, int n, sp_case *c)
{
    int i, j;
    c->act_sp = pdp_model_activation_bytes(m, 0, pdp_model_num_layers(m), SB);
    c->act_tp = pdp_model_activation_bytes(tp, 0, pdp_model_num_layers(tp), SB);
    c->seq_layers = c->seq_bad = 0;
    for (i = 0; i < m->nlayers; i++) {
        const pdp__layer *l = &m->layers[i];
        if (!l->tp_seq) continue;
        c->seq_layers++;
        for (j = 0; j < tp->nlayers; j++)
            if (tp->layers[j].mask_index == l->mask_index && tp->layers[j].kind == l->kind) break;
        if (j == tp->nlayers || n * pdp_model_activation_bytes(m, i, i + 1, SB) !=
                                    pdp_model_activation_bytes(tp, j, j + 1, SB))
            c->seq_bad++;
    }
}

static pdp_status sp_rank(const pdp_launch_ctx *ctx, void *user)
{
    sp_case *c = (sp_case *)user;
    pdp_gpt_desc d = sp_desc(c->dropout);
    pdp_model *m = NULL, *tp = NULL;
    pdp_param lnf;
    pdp_status st;
    d.tp = ctx->world;
    d.sequence_parallel = true;
    d.recompute = c->recompute;
    if ((st = pdp_gpt_create(&m, &d)) != PDP_OK) return st;
    d.sequence_parallel = false;
    if ((st = pdp_gpt_create(&tp, &d)) != PDP_OK) goto out;
    if (ctx->rank == 0) sp_memory(m, tp, ctx->world_size, c);
    if ((st = sp_train(m, c, ctx->rank == 0)) != PDP_OK ||
        (st = fixture_worst_by_name(m, c->ref, &c->worst[ctx->rank])) != PDP_OK ||
        (st = pdp_model_find_param(m, "transformer.ln_f.weight", &lnf)) != PDP_OK)
        goto out;
    memcpy(c->lnf[ctx->rank], lnf.value.data, sizeof c->lnf[0]);
    if (c->path[0]) st = pdp_tp_checkpoint_save(c->path, m, NULL);
out:
    pdp_model_free(tp);
    pdp_model_free(m);
    return st;
}

static void sp_data(sp_case *c)
{
    int64_t i;
    memset(c, 0, sizeof *c);
    for (i = 0; i < SB * ST; i++) {
        c->ids[i] = (int32_t)((i * 5 + 1) % SV);
        c->tg[i] = i % 7 == 3 ? -1 : (int32_t)((i * 3 + 2) % SV);
    }
}

/* (N-1)/N of a payload of bytes, as the stats count one collective (truncated) */
static int64_t ring(int n, int64_t bytes, double times)
{
    return (int64_t)(times * (double)(n - 1) / (double)n * (double)bytes);
}

TEST gpt_sp_equals_one_device(void)
{
    static const pdp_recompute modes[3] = {PDP_RECOMPUTE_NONE, PDP_RECOMPUTE_SELECTIVE,
                                           PDP_RECOMPUTE_FULL};
    static const float drops[2] = {0.0f, 0.1f};
    int di, mi, n, r, s;
    for (di = 0; di < 2; di++) {
        sp_case c, one;
        pdp_gpt_desc d = sp_desc(drops[di]);
        pdp_model *ref = NULL;
        sp_data(&one);
        ASSERT_ENUM_EQ(PDP_OK, pdp_gpt_create(&ref, &d), pdp_status_name);
        ASSERT_ENUM_EQ(PDP_OK, sp_train(ref, &one, true), pdp_status_name);
        for (mi = 0; mi < 3; mi++)
            for (n = 2; n <= MAXN; n++) {
                const pdp_tp_stats *t = &c.stats;
                int64_t P = (int64_t)SB * ST * SC * 4, G = 2 * SC * 4, extra;
                char msg[96];
                snprintf(msg, sizeof msg, "TP %d + SP, dropout %g, recompute %d", n,
                         (double)drops[di], (int)modes[mi]);
                sp_data(&c);
                c.dropout = drops[di];
                c.recompute = modes[mi];
                c.ref = ref;
                if (n == MAXN && di == 1 && mi == 0) /* the full tensors in one file */
                    snprintf(c.path, sizeof c.path, "build/test_gpt_sp.%ld.safetensors",
                             (long)getpid());
                ASSERT_ENUM_EQm(msg, PDP_OK, pdp_launch(n, NULL, sp_rank, &c), pdp_status_name);
                ASSERT_EQm(msg, 0, c.allocs_hot); /* the hot loop allocates nothing */
                if (c.path[0]) { /* the single-device GPT reads it: ref's values */
                    pdp_model *back = NULL;
                    pdp_tensor pb, pr;
                    ASSERT_ENUM_EQ(PDP_OK, pdp_gpt_create(&back, &d), pdp_status_name);
                    ASSERT_ENUM_EQ(PDP_OK, pdp_checkpoint_load(c.path, back, NULL),
                                   pdp_status_name);
                    pdp_model_flat(back, &pb, NULL);
                    pdp_model_flat(ref, &pr, NULL);
                    ASSERTm(msg, fixture_rel_err(pb.data, pr.data, pr.count) <= 1e-5);
                    pdp_model_free(back);
                    remove(c.path);
                }
                for (s = 0; s < STEPS; s++) {
                    ASSERTm(msg, fabs(c.losses[s] - one.losses[s]) <= 1e-5);
                    ASSERTm(msg, fabs(c.norms[s] - one.norms[s]) <= 1e-5);
                }
                for (r = 0; r < n; r++) {
                    ASSERTm(msg, c.worst[r] <= 1e-5);
                    ASSERT_MEM_EQm(msg, c.lnf[0], c.lnf[r], sizeof c.lnf[0]);
                }
                /* the step's collectives against the formula */
                extra = modes[mi] == PDP_RECOMPUTE_FULL ? 2 * SL : 0;
                ASSERT_EQm(msg, 0, t->forward_allreduces + t->backward_allreduces);
                ASSERT_EQm(msg, 4 * SL + 2 + extra, t->allgathers);
                ASSERT_EQm(msg, 4 * SL + extra, t->reduce_scatters);
                ASSERT_EQm(msg, (4 * SL + 2 + extra) * P, t->allgather_bytes);
                ASSERT_EQm(msg, (4 * SL + extra) * P, t->reduce_scatter_bytes);
                ASSERT_EQm(msg, 2 * SL + 1, t->grad_allreduces);
                ASSERT_EQm(msg, (2 * SL + 1) * G, t->grad_bytes);
                ASSERT_EQm(msg, (8 * SL + 2 + 2 * extra) * ring(n, P, 1.0) +
                                    (2 * SL + 1) * ring(n, G, 2.0), t->bytes_sent);
                /* the blocks' gathers and scatters send what TP's 4L all-reduces would */
                ASSERT_EQm(msg, 4 * SL * ring(n, P, 2.0), 8 * SL * ring(n, P, 1.0));
                /* memory: every layer on a rank's positions holds 1/N of TP's */
                ASSERT_EQm(msg, 0, c.seq_bad);
                /* per region a Residual, a LayerNorm, a ResidualAdd (and a Dropout); ln_f
                   (and the embedding's Dropout) */
                ASSERT_EQm(msg, 6 * SL + 1 + (drops[di] > 0 ? 2 * SL + 1 : 0), c.seq_layers);
                if (modes[mi] == PDP_RECOMPUTE_NONE) {
                    /* per sequence, in floats, the TP model's layers between the blocks:
                       per region a LayerNorm (T C, mean and rstd 2 T), a ResidualAdd (T C),
                       a Dropout (T C and its mask T C); the embedding's Dropout, ln_f.
                       SP keeps 1/N of them, and 1/N of g's outputs (T C each, 2L); it adds
                       the scatter's T C / N and the head's gather, T C. */
                    int64_t drop = drops[di] > 0 ? 2 * SC : 0;
                    int64_t R = ST * (2 * SL * ((SC + 2) + SC + drop) + drop + (SC + 2));
                    int64_t shrink = (R + 2 * SL * ST * SC) * (n - 1) / n - ST * SC / n - ST * SC;
                    ASSERT_EQm(msg, c.act_tp - shrink * 4 * SB, c.act_sp);
                    if (n == 2 && di == 1)
                        printf("    activations, B %d T %d C %d L %d, dropout 0.1: TP 2 %lld "
                               "bytes, TP 2 + SP %lld (formula %lld); the layers between the "
                               "blocks %lld -> %lld\n", SB, ST, SC, SL, (long long)c.act_tp,
                               (long long)c.act_sp, (long long)(c.act_tp - shrink * 4 * SB),
                               (long long)(R * 4 * SB), (long long)(R * 4 * SB / n));
                }
            }
        pdp_model_free(ref);
    }
    PASS();
}

/* DP x TP = 2 x 2 on 4 thread ranks (TP pairs, DP across them), sequence parallel,
   dropout 0.1, each recomputation mode: the GPT wrapped in DDP or ZeRO stage 1, 2 or 3 on
   the DP group (zero.c, "Tensor parallelism": each DP group shards its TP rank's block;
   the LayerNorms' gradients reach ZeRO's buffers already summed over TP; stage 3 runs
   with a unit per layer and 2 gather slots, so FULL recomputation gathers a region's
   units again inside backward, and its parameters are gathered into the block to be
   compared), each copy on one of the 2 sequences (a batch of 1: the
   collectives need no permutation), clipping after the DP average: equal to one device in
   every case. The ignored targets are alike in both sequences, so the mean of the copies'
   losses is the batch's. */
typedef struct sp_dptp_case {
    sp_case data;
    int zero; /* 0: DDP, 1-3: ZeRO stage 1-3 */
    pdp_recompute recompute;
    double worst[4];
} sp_dptp_case;

static pdp_status sp_dptp_rank(const pdp_launch_ctx *ctx, void *user)
{
    sp_dptp_case *c = (sp_dptp_case *)user;
    int dp = ctx->rank / 2, tpr = ctx->rank % 2, s;
    pdp_comm *tp = NULL, *dc = NULL;
    pdp_gpt_desc d = sp_desc(0.1f);
    pdp_model *m = NULL;
    pdp_ddp *ddp = NULL;
    pdp_zero *z = NULL;
    pdp_zero_desc zd;
    pdp_optim *o = NULL;
    pdp_optim_desc od;
    pdp_tensor x;
    int64_t shape[2] = {1, ST};
    const int32_t *tg = c->data.tg + dp * ST;
    float loss, norm;
    pdp_status st;
    memset(&od, 0, sizeof od);
    od.kind = PDP_OPTIM_ADAMW, od.lr = 1e-3, od.weight_decay = 0.1;
    memset(&zd, 0, sizeof zd);
    zd.stage = c->zero;
    zd.bucket_cap_mb = c->zero == 3 ? 1e-9 : 0.0; /* stage 3: a unit per layer */
    if ((st = pdp_comm_split(ctx->world, dp, tpr, &tp)) != PDP_OK ||
        (st = pdp_comm_split(ctx->world, tpr, dp, &dc)) != PDP_OK)
        goto out;
    d.tp = tp;
    d.sequence_parallel = true;
    d.recompute = c->recompute;
    if ((st = pdp_gpt_create(&m, &d)) != PDP_OK) goto out;
    if ((st = c->zero ? pdp_zero_create(&z, m, dc, &zd) : pdp_ddp_create(&ddp, m, dc, NULL)) !=
            PDP_OK ||
        (st = c->zero ? pdp_zero_optim_create(&o, z, &od) : pdp_optim_create(&o, m, &od)) !=
            PDP_OK)
        goto out;
    pdp_tensor_wrap_ids(c->data.ids + dp * ST, pdp_cpu(), 2, shape, &x);
    for (s = 0; s < STEPS && st == PDP_OK; s++) {
        if (c->zero) {
            if ((st = pdp_zero_forward_backward(z, &x, tg, &loss)) == PDP_OK &&
                (st = pdp_zero_finish(z)) == PDP_OK &&
                (st = pdp_zero_clip_grad_norm(z, 0.5f, &norm)) == PDP_OK)
                st = pdp_zero_step(z, o);
        } else {
            if ((st = pdp_ddp_forward_backward(ddp, &x, tg, &loss)) == PDP_OK &&
                (st = pdp_ddp_finish(ddp)) == PDP_OK &&
                (st = pdp_clip_grad_norm(m, 0.5f, &norm)) == PDP_OK &&
                (st = pdp_optim_step(o)) == PDP_OK)
                pdp_optim_zero_grad(o);
        }
        if (st == PDP_OK && ctx->rank == 0) c->data.norms[s] = norm;
    }
    if (st == PDP_OK && c->zero == 3) st = pdp_zero_gather_params(z, NULL); /* the block */
    if (st == PDP_OK) st = fixture_worst_by_name(m, c->data.ref, &c->worst[ctx->rank]);
out:
    pdp_optim_free(o);
    pdp_ddp_free(ddp);
    pdp_zero_free(z);
    pdp_model_free(m);
    pdp_comm_free(dc);
    pdp_comm_free(tp);
    return st;
}

TEST gpt_sp_under_ddp_and_zero_equals_one_device(void)
{
    static sp_dptp_case c;
    sp_case one;
    pdp_gpt_desc d = sp_desc(0.1f);
    pdp_model *ref = NULL;
    int64_t i;
    int r, s;
    sp_data(&one);
    for (i = 0; i < SB * ST; i++) one.tg[i] = i % ST == 5 ? -1 : one.tg[i] < 0 ? 0 : one.tg[i];
    ASSERT_ENUM_EQ(PDP_OK, pdp_gpt_create(&ref, &d), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, sp_train(ref, &one, true), pdp_status_name);
    for (c.zero = 0; c.zero <= 3; c.zero++)
        for (c.recompute = PDP_RECOMPUTE_NONE; c.recompute <= PDP_RECOMPUTE_FULL;
             c.recompute = (pdp_recompute)(c.recompute + 1)) {
            char what[64];
            pdp_status st;
            snprintf(what, sizeof what, "%s%d x TP 2 + SP, recompute %d",
                     c.zero ? "ZeRO-" : "DDP ", c.zero ? c.zero : 2, (int)c.recompute);
            c.data = one;
            c.data.ref = ref;
            memset(c.worst, 0, sizeof c.worst);
            st = pdp_launch(4, NULL, sp_dptp_rank, &c);
            ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, st, pdp_status_name);
            for (r = 0; r < 4; r++) ASSERTm(what, c.worst[r] <= 1e-5);
            for (s = 0; s < STEPS; s++)
                ASSERTm(what, fabs(c.data.norms[s] - one.norms[s]) <= 1e-5);
        }
    pdp_model_free(ref);
    PASS();
}

static pdp_status sp_bad_T(const pdp_launch_ctx *ctx, void *user)
{
    pdp_gpt_desc d = sp_desc(0.0f);
    pdp_model *m = NULL;
    pdp_status st;
    char *msg = (char *)user;
    d.sequence = 8; /* 3 does not divide it */
    d.tp = ctx->world;
    d.sequence_parallel = true;
    st = pdp_gpt_create(&m, &d);
    if (ctx->rank == 0) snprintf(msg, 1024, "%s", pdp_last_error());
    pdp_model_free(m);
    return st == PDP_ERR_INVALID && !m ? PDP_OK : PDP_ERR_STATE;
}

/* Builds the GPT d describes and runs one forward of a sequence of zeros, which must fail
   with PDP_ERR_INVALID (the TP ranks' models differ); rank `reporter` keeps the message. */
static pdp_status first_forward_refused(const pdp_launch_ctx *ctx, const pdp_gpt_desc *d,
                                        int reporter, char *msg)
{
    pdp_model *m = NULL;
    pdp_tensor x;
    const pdp_tensor *y;
    int32_t ids[ST] = {0};
    int64_t shape[2] = {1, ST};
    pdp_status st;
    if ((st = pdp_gpt_create(&m, d)) != PDP_OK) return st;
    pdp_tensor_wrap_ids(ids, pdp_cpu(), 2, shape, &x);
    st = pdp_model_forward(m, &x, &y);
    if (ctx->rank == reporter) snprintf(msg, 1024, "%s", pdp_last_error());
    pdp_model_free(m);
    return st == PDP_ERR_INVALID ? PDP_OK : PDP_ERR_STATE;
}

/* Rank 1 builds the GPT without sequence parallelism: the first forward fails on both
   ranks (tp.c's width check), naming the layers that differ. */
static pdp_status sp_mixed(const pdp_launch_ctx *ctx, void *user)
{
    pdp_gpt_desc d = sp_desc(0.0f);
    d.tp = ctx->world;
    d.sequence_parallel = ctx->rank == 0;
    return first_forward_refused(ctx, &d, 1, (char *)user);
}

/* Rank 1 builds the GPT with half the heads (and no sequence parallelism on either): the
   widths are the same (2 heads of 4 or 1 of 8 a rank), the models not: the first forward
   fails on both ranks naming the attention's heads. With seed_per_rank, each rank seeds its
   own (a habit from data parallelism): the tensors both hold whole differ, named so. */
typedef struct differ_job {
    bool seed_per_rank;
    char msg[1024];
} differ_job;

static pdp_status tp_heads_differ(const pdp_launch_ctx *ctx, void *user)
{
    pdp_gpt_desc d = sp_desc(0.0f);
    differ_job *j = (differ_job *)user;
    d.tp = ctx->world;
    if (j->seed_per_rank) d.seed = 7 + (uint64_t)ctx->rank;
    else d.heads = ctx->rank == 1 ? 2 : 4;
    return first_forward_refused(ctx, &d, 0, j->msg);
}

#ifndef PDP_CUDA
/* Rank 1 cannot build its model (a CUDA device in a build without PDP_CUDA): rank 0's
   pdp_gpt_create fails too, at once, naming rank 1 (it returned a model, and its first
   forward waited in a TP collective for the timeout). */
static pdp_status tp_one_fails(const pdp_launch_ctx *ctx, void *user)
{
    pdp_gpt_desc d = sp_desc(0.0f);
    pdp_model *m = NULL;
    pdp_status st;
    char *msg = (char *)user;
    d.tp = ctx->world;
    if (ctx->rank == 1) d.device = pdp_cuda(0);
    st = pdp_gpt_create(&m, &d);
    if (ctx->rank == 0) snprintf(msg, 1024, "%s %s", pdp_status_name(st), pdp_last_error());
    pdp_model_free(m);
    return st != PDP_OK && !m ? PDP_OK : PDP_ERR_STATE;
}
#endif

TEST gpt_sp_errors(void)
{
    differ_job j;
    char msg[1024] = "";
    pdp_gpt_desc d = sp_desc(0.0f);
    pdp_model *m = NULL;
    ASSERT_ENUM_EQ(PDP_OK, pdp_launch(3, NULL, sp_bad_T, msg), pdp_status_name);
    ASSERTm(msg, strstr(msg, "pdp_gpt_create") && strstr(msg, "sequence 8") &&
                     strstr(msg, "TP size 3"));
    ASSERT_ENUM_EQ(PDP_OK, pdp_launch(2, NULL, sp_mixed, msg), pdp_status_name);
    ASSERTm(msg, strstr(msg, "TP ranks built different models") &&
                     strstr(msg, "ScatterToSequenceParallelRegion"));
    memset(&j, 0, sizeof j);
    ASSERT_ENUM_EQ(PDP_OK, pdp_launch(2, NULL, tp_heads_differ, &j), pdp_status_name);
    ASSERTm(j.msg, strstr(j.msg, "TP ranks built different models") &&
                       strstr(j.msg, "(CausalSelfAttention)") &&
                       strstr(j.msg, "1 heads on TP rank 1"));
    j.seed_per_rank = true;
    ASSERT_ENUM_EQ(PDP_OK, pdp_launch(2, NULL, tp_heads_differ, &j), pdp_status_name);
    ASSERTm(j.msg, strstr(j.msg, "differ between TP rank 1 and TP rank 0"));
#ifndef PDP_CUDA
    ASSERT_ENUM_EQm(msg, PDP_OK, pdp_launch(2, NULL, tp_one_fails, msg), pdp_status_name);
    ASSERTm(msg, strstr(msg, "PDP_ERR_COMM pdp_gpt_create: rank 0: rank 1 of comm"));
#endif
    d.sequence_parallel = true; /* and no desc.tp */
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_gpt_create(&m, &d), pdp_status_name);
    ASSERT(m == NULL);
    ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "sequence_parallel") &&
                                  strstr(pdp_last_error(), "desc.tp") &&
                                  strstr(pdp_last_error(), "sequence 12"));
    PASS();
}

SUITE(gpt_sp)
{
    RUN_TEST(gpt_sp_equals_one_device);
    RUN_TEST(gpt_sp_under_ddp_and_zero_equals_one_device);
    RUN_TEST(gpt_sp_errors);
}

GREATEST_MAIN_DEFS();

int main(int argc, char **argv)
{
    GREATEST_MAIN_BEGIN();
    RUN_SUITE(gpt_sp);
    GREATEST_MAIN_END();
}
