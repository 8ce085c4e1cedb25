/* pp: the pipeline-parallel executor (the design is pp.h's opening comment).

   Invariants: the schedule is fixed at creation, a list of actions per stage in
   which, on each chunk, micro-batch j's forward comes before its backward, and the
   forwards and the backwards each in micro-batch order. A stage runs v chunks (v = 1
   but for the interleaved schedule), each a model of consecutive layers (a piece of
   the full model, piece q = c p + s) with buffers of its own; everything below is per
   chunk. A chunk keeps S = nslots activation sets (model slots), the most micro-batches
   it holds at once in the list (GPipe: S = m; 1F1B: S = min(p - s, m) = warm-up + 1;
   interleaved: counted), set j % S for micro-batch j: its micro-batches in flight are
   consecutive, so a forward F(j) finds set j % S free because F(j - S)'s backward came
   before it. Received inputs (pieces after 0) live in S + 1 buffers, j % (S + 1), so
   the receive for the next forward can be posted while the chunk still holds S
   micro-batches (their inputs are read again by their backwards); received output
   gradients in 2 buffers (j % 2) and the input gradients sent back in 2 (j % 2, the
   send of j - 2 waited before reuse).
   Activations are sent straight from the model's output of set j % S, whose send
   is waited before F(j + S) overwrites it. Tags: a message crosses the boundary b
   between pieces b and b + 1; 2 (j v + b / p) for micro-batch j's activations and
   one more for its gradients, modulo PDP_COMM_TAG_MAX + 1 (v = 1: 2 j and 2 j + 1).
   Two ranks exchange over the boundaries b = c p + s (forward from s), one per chunk,
   so the tag and the direction name the message (p = 2: rank 1 sends rank 0 both
   activations, over odd b, and gradients, over even b; the last bit tells them apart).
   After the first pass at the largest batch nothing is allocated.

   Messages go out in steps, Megatron-LM's p2p grouping: a step is one action, or in the
   interleaved schedule's steady state a forward and the backward after it (printed
   F2c0+B0c1). After a step the runner issues one batch (pdp_comm_sendrecv): the step's
   sends with the next step's receives (at most 2 and 2, so at most one receive per kind
   is outstanding). Before an action it waits for its receive and for the send that last
   used the buffer it will send from. On NCCL a batch is one group, so its sends and
   receives progress together; a rank's batches run one after another on its one stream.
   That is why on NCCL the steady state's two actions share one batch: with a batch an action
   (Megatron's 1F1B grouping), stage 0's B0c1 sends stage 1 a gradient that stage 1
   receives for B0c0, a receive queued behind stage 1's B1c1 send of a gradient to stage
   0, whose receive, for stage 0's B1c1, is queued behind the first (p = 2, v = 2, m = 4):
   a deadlock for every m >= 2p. With the pair, each send of a step goes out with the
   receives the peer's matching step posts; the pair is safe because the interleaved
   warm-up's 2 (p - s - 1) extra forwards put the backward's gradient, on the next stage,
   before that stage needs the pair's forward. Local and MPI start a message when posted
   and match by tag, so a batch adds no order there: the pair's forward sends at once (its
   activations a backward sooner: train_gpt_3d -dp 1 -tp 1 -pp 2 -micro 4 -schedule
   interleaved, stage 1's bubble, medians of 5 alternated runs: 0.460 with the send held,
   0.435 sent at once, 0.436 before the pairs). 1F1B and GPipe keep a batch an action
   (Megatron's 1F1B grouping): they complete with it, and it sends a forward's activations
   without waiting for the backward after it.
   NCCL matches a pair of ranks' messages by order, which is safe: for every pair the
   sender's list posts its messages in the order the receiver's list posts their receives
   (the k-th forward is the same micro-batch and chunk on every stage; the wrap from the
   last stage to the first maps chunk c to c + 1, which keeps the order). Local and MPI
   match by (peer, tag) and start each message when posted; their only question is whether
   the waits form a cycle, and they do not: every message an action waits for is produced
   by an action its peer runs no later in Megatron's order (the k-th forward of every stage
   is the same micro-batch and chunk; the extra warm-up forwards let the last stage's
   backwards start before stage s needs them, and (v - 1) p lets a micro-batch group cross
   all v chunks), and a send buffer is reused only S forwards (2 backwards) later, when its
   receiver has posted that receive. Both claims were checked by a replay of every rank's
   list under each backend's rules (tests/test_pp.c, pp_schedules_cannot_deadlock: p =
   2..8, v = 1..4, m = p..4p, all complete; with a batch an action the interleaved lists
   deadlock under NCCL's rules for m >= 2p), and the schedules run in the tests on thread
   ranks and on NCCL's emulation.

   Clipping (pdp_pp_clip_grad_norm) needs every stage's gradients: each stage's sum of
   squares, a double, is all-gathered bit for bit over the pipeline (two floats per
   stage; through a device buffer on NCCL) and summed in stage order on every stage, so
   all stages clip by the same coefficient. With desc.dp it runs after the dp average,
   when every pipeline holds the global batch's gradients. A failed pass's clean-up
   (pdp__pp_drain) keeps the thread's message: its waits fail only as consequences. */

#include "internal.h"

typedef struct pdp__pp_action {
    char kind; /* 'F' or 'B' */
    int mb;
    int chunk;
    bool pair; /* a forward whose step goes on with the next action, a backward (interleaved,
                  steady state): their messages go out together after both */
} pdp__pp_action;

/* One chunk of a stage: piece q = chunk p + stage of the full model. */
typedef struct pdp__pp_chunk {
    pdp_model *m;                 /* layers [first[q], first[q + 1]); with v > 1 its blocks
                                     are views into the stage model's (pdp__pp_join) */
    int q, nslots;
    int64_t off;                  /* its parameters' offset in the stage model */
    int64_t in_count, out_count;  /* per-sample floats at its input and output */
    int64_t act_bytes;            /* one micro-batch's activations (the last pass) */
    int param0;                   /* its first parameter's index in the stage model */
    bool view;                    /* its blocks are the stage model's (v > 1) */
    pdp_model *stage_m;           /* v > 1: the stage model whose grad hook its backward calls
                                     (pdp__pp_sync_chunks) */
    float **in_buf;               /* nslots + 1: received inputs (pieces after 0) */
    float *dy_buf[2];             /* received output gradients (pieces before the last) */
    float *dx_buf[2];             /* input gradients sent back (pieces after 0) */
    pdp_work **send_fwd;          /* per slot */
    pdp_work *send_bwd[2];
} pdp__pp_chunk;

struct pdp_pp {
    pdp_model *m;                 /* this stage (with v > 1: its chunks' joined) */
    pdp_comm *c, *dp;
    pdp_pp_desc desc;
    int stage, p, mb, v, pieces;  /* stage, stages, micro-batches, chunks, p v */
    int *first;                   /* pieces + 1: piece q's first layer, then nlayers */
    pdp__pp_chunk *ck;            /* v */
    pdp__pp_action *acts;
    int nacts;
    int64_t cap_rows;             /* rows the chunks' buffers hold */
    int64_t messages;             /* activations and gradients sent in this pass */
    pdp_work *rwork[2];           /* the next step's receives: its forward's, its backward's */
    pdp_p2p batch[4];             /* the current step's sends, then the next step's receives */
    int nbatch;
    pdp_work *dp_work;            /* DP x PP: the gradients' all-reduce */
    float norm_host[2 * PDP_PP_MAX_STAGES + 2]; /* pdp_pp_clip_grad_norm: this stage's sum
                                                    of squares (a double's 8 bytes), then
                                                    every stage's, gathered */
    float *norm_dev;              /* its copy on the model's device (NCCL reduces device
                                     memory only); NULL on the CPU */
    int tied_param;               /* a weight tied across stages (a GPT's wte: the embedding
                                     on stage 0, the head's copy on a later one): its index in
                                     this stage's model, or -1 */
    int tied_peer;                /* the stage holding the other copy */
    bool tied_copy;               /* this stage holds the copy (its last parameter) */
    float *tied_buf;              /* the peer's gradient of it, received each pass */
    int64_t positions;            /* labels a row on the last stage: T for [B, T, V] */
    pdp_model *layout;            /* the full model's layers and registry (no values): the
                                     staging of pdp_pp_checkpoint_save/load */
    int64_t counted;              /* labels of this pass that count (not -1) */
    int64_t *mb_rows, *mb_first;  /* per micro-batch of the current pass */
    int64_t mb_cap;
    int64_t sample_base;          /* DP x PP: this pipeline's first row in the global batch */
    uint64_t steps;
    double t_compute;             /* when the current action's compute began (after its waits) */
    pdp_pp_stats stats;
    int64_t dp_sent;              /* bytes its gradients' averages sent over dp, all steps (a
                                     caller's own collectives on dp are not counted) */
    bool one_stream;              /* NCCL: a rank's batches run in order on one stream */
    bool traced;
    int trace_pid, trace_tid;
};

/* ---- pp: stage boundaries ---- */

/* A contiguous split of n layers of cost[] into p non-empty stages minimising the
   largest stage's cost (ties: the later cut, so a ReLU stays with its Linear; pp.h's
   pdp_pp_balance states the rule for the whole split). The linear-partition dynamic
   programme: best(k, i) = min over j of max(best(k - 1, j), cost of layers [j, i)). */
PDP__PRIVATE pdp_status pdp__pp_balance(const double *cost, const bool *cut_ok, int n, int p,
                                        int *first)
{
    double *best = (double *)pdp__alloc((size_t)(p + 1) * (size_t)(n + 1) * sizeof *best);
    int *cut = (int *)pdp__alloc((size_t)(p + 1) * (size_t)(n + 1) * sizeof *cut);
    double *pre = (double *)pdp__alloc((size_t)(n + 1) * sizeof *pre);
    int k, i, j;
    if (!best || !cut || !pre) {
        pdp__dealloc(best);
        pdp__dealloc(cut);
        pdp__dealloc(pre);
        return PDP_ERR_OUT_OF_MEMORY;
    }
    pre[0] = 0.0;
    for (i = 0; i < n; i++) pre[i + 1] = pre[i] + cost[i];
#define PDP__BEST(k, i) best[(size_t)(k) * (size_t)(n + 1) + (size_t)(i)]
#define PDP__CUT(k, i) cut[(size_t)(k) * (size_t)(n + 1) + (size_t)(i)]
    /* a stage may start only where cut_ok says (not inside a residual region): the others
       are infinitely costly boundaries */
    for (i = 1; i <= n; i++) PDP__BEST(1, i) = pre[i], PDP__CUT(1, i) = 0;
    for (k = 2; k <= p; k++)
        for (i = k; i <= n; i++) { /* the first i layers in k stages; the last is [j, i) */
            PDP__BEST(k, i) = HUGE_VAL;
            PDP__CUT(k, i) = k - 1;
            for (j = k - 1; j < i; j++) {
                double v = PDP__MAX(PDP__BEST(k - 1, j), pre[i] - pre[j]);
                if (cut_ok && !cut_ok[j]) continue;
                if (v <= PDP__BEST(k, i)) PDP__BEST(k, i) = v, PDP__CUT(k, i) = j;
            }
        }
    if (PDP__BEST(p, n) == HUGE_VAL) {
        pdp__dealloc(best);
        pdp__dealloc(cut);
        pdp__dealloc(pre);
        return PDP_ERR_INVALID;
    }
    for (k = p, i = n; k >= 1; k--) {
        first[k - 1] = PDP__CUT(k, i);
        i = first[k - 1];
    }
#undef PDP__BEST
#undef PDP__CUT
    pdp__dealloc(best);
    pdp__dealloc(cut);
    pdp__dealloc(pre);
    return PDP_OK;
}

/* The pipeline's own loss, softmax cross-entropy on the last stage, counts as part of the
   last layer (pdp__pp_layer_costs, pdp__pp_time_layers): with a GPT's vocabulary it is a
   real share of the step. Its classes, and its rows a sample (T of [T, V]). */
PDP__PRIVATE int64_t pdp__pp_loss_rows(const pdp_model *full, int64_t *classes)
{
    const pdp__layer *l = &full->layers[full->nlayers - 1];
    *classes = l->out_shape[l->out_ndim - 1];
    return l->out_count / *classes;
}

/* Forward + backward seconds of each layer of full (a copy of it) on rows samples, the least
   of 5 timed passes after a warm-up (a pass another process interrupted counts only where
   it was the fastest); with loss, the cross-entropy's added to the last layer's. */
PDP__PRIVATE pdp_status pdp__pp_time_layers(const pdp_model *full, int64_t rows, bool loss,
                                            double *cost)
{
    pdp_model *t = NULL;
    pdp_tensor *x = NULL, *dy = NULL;
    const pdp_tensor *y;
    int64_t xs[4], ys[4], k, classes, per = pdp__pp_loss_rows(full, &classes);
    int32_t *labels = NULL;
    double *pass = NULL;
    int d, rep, nd, i;
    pdp_status st;
    if ((st = pdp__model_clone(full, full->device, false, &t)) != PDP_OK) return st;
    xs[0] = rows;
    for (d = 0; d < full->in_ndim; d++) xs[d + 1] = full->in_shape[d];
    ys[0] = rows;
    nd = pdp_model_output_shape(full, ys + 1);
    if ((st = pdp_tensor_create(&x, full->device, full->in_ndim + 1, xs)) != PDP_OK ||
        (st = pdp_tensor_create(&dy, full->device, nd + 1, ys)) != PDP_OK)
        goto out;
    {
        float *h = (float *)pdp__alloc((size_t)PDP__MAX(x->count, dy->count) * sizeof(float));
        if (!h) {
            st = pdp__err(PDP_ERR_OUT_OF_MEMORY, "no memory");
            goto out;
        }
        for (k = 0; k < PDP__MAX(x->count, dy->count); k++)
            h[k] = (float)((k * 2654435761u) % 1000u) / 1000.0f - 0.5f;
        if ((st = pdp_tensor_upload(dy, h)) == PDP_OK && full->in_dtype == PDP_DTYPE_I32) {
            int32_t *ids = (int32_t *)(void *)h; /* a GPT's token ids: [0, vocab) */
            for (k = 0; k < x->count; k++)
                ids[k] = (int32_t)((k * 2654435761u) % full->layers[0].vocab);
            x->dtype = PDP_DTYPE_I32;
        }
        if (st == PDP_OK) st = pdp_tensor_upload(x, h);
        pdp__dealloc(h);
        if (st != PDP_OK) goto out;
    }
    pass = (double *)pdp__alloc((size_t)full->nlayers * sizeof *pass);
    labels = (int32_t *)pdp__alloc((size_t)(rows * per) * sizeof *labels);
    if (!pass || !labels) {
        st = pdp__err(PDP_ERR_OUT_OF_MEMORY, "no memory");
        goto out;
    }
    for (k = 0; k < rows * per; k++) labels[k] = (int32_t)(k * 7 % classes);
    t->layer_s = pass;
    for (rep = 0; rep < 6; rep++) { /* the first is a warm-up */
        double sum, t0;
        memset(pass, 0, (size_t)full->nlayers * sizeof *pass);
        if ((st = pdp_model_forward(t, x, &y)) != PDP_OK) goto out;
        t0 = pdp__now(); /* the loss's gradient is the backward's dy */
        if (loss && (st = pdp__cross_entropy_rows_on(full->device, y->data, labels, rows * per,
                                                     classes, 1.0f / (float)(rows * per), &sum,
                                                     dy->data, "pdp_pp_create")) != PDP_OK)
            goto out;
        pass[full->nlayers - 1] += pdp__now() - t0;
        if ((st = pdp_model_backward(t, dy)) != PDP_OK) goto out;
        for (i = 0; rep > 0 && i < full->nlayers; i++)
            cost[i] = rep == 1 ? pass[i] : PDP__MIN(cost[i], pass[i]);
    }
out:
    pdp__dealloc(labels);
    pdp__dealloc(pass);
    t->layer_s = NULL;
    pdp_tensor_free(x);
    pdp_tensor_free(dy);
    pdp_model_free(t);
    return st;
}

/* ---- pp: schedules ---- */

/* The k-th forward (kind 'F') or backward of a stage in Megatron's order: micro-batches in
   groups of p, each group through chunk 0, 1, .., v - 1 (backwards through v - 1 first);
   with v = 1 it is micro-batch k. */
PDP__PRIVATE pdp__pp_action pdp__pp_kth(char kind, int k, int p, int v)
{
    pdp__pp_action a;
    int c = k % (p * v) / p;
    a.kind = kind;
    a.pair = false;
    a.mb = k / (p * v) * p + k % p;
    a.chunk = kind == 'F' ? c : v - 1 - c;
    return a;
}

/* Stage s's actions (2 m v of them) into acts: w warm-up forwards, then a forward and a
   backward alternately, then the remaining backwards (pp.h states each schedule's w).
   Interleaved: m a multiple of p (pdp__pp_desc_defaults checks). Returns the count. */
PDP__PRIVATE int pdp__pp_build(pdp_pp_schedule sched, int p, int v, int m, int s,
                               pdp__pp_action *acts)
{
    int total = m * v, n = 0, w, i;
    if (sched == PDP_PP_GPIPE) w = total;
    else if (sched == PDP_PP_1F1B) w = PDP__MIN(p - 1 - s, m);
    else w = PDP__MIN(2 * (p - s - 1) + (v - 1) * p, total);
    for (i = 0; i < w; i++) acts[n++] = pdp__pp_kth('F', i, p, v);
    for (i = 0; i + w < total; i++) {
        acts[n] = pdp__pp_kth('F', w + i, p, v);
        acts[n++].pair = sched == PDP_PP_INTERLEAVED_1F1B;
        acts[n++] = pdp__pp_kth('B', i, p, v);
    }
    for (i = total - w; i < total; i++) acts[n++] = pdp__pp_kth('B', i, p, v);
    return n;
}

/* This stage's list, and each chunk's slots: the most micro-batches it holds at once. */
PDP__PRIVATE void pdp__pp_plan(pdp_pp *pp)
{
    int k, c, held[PDP_PP_MAX_CHUNKS] = {0};
    pp->nacts = pdp__pp_build(pp->desc.schedule, pp->p, pp->v, pp->mb, pp->stage, pp->acts);
    for (c = 0; c < pp->v; c++) pp->ck[c].nslots = 0;
    for (k = 0; k < pp->nacts; k++) {
        pdp__pp_chunk *ck = &pp->ck[pp->acts[k].chunk];
        held[pp->acts[k].chunk] += pp->acts[k].kind == 'F' ? 1 : -1;
        ck->nslots = PDP__MAX(ck->nslots, held[pp->acts[k].chunk]);
    }
}

PDP_API const char *pdp_pp_schedule_str(const pdp_pp *pp, char *buf, size_t cap)
{
    size_t n = 0;
    int k;
    if (!buf || !cap) return buf;
    buf[0] = '\0';
    if (!pp) return buf;
    for (k = 0; k < pp->nacts && n + 1 < cap; k++) {
        const pdp__pp_action *a = &pp->acts[k];
        const char *sep = k == 0 ? "" : pp->acts[k - 1].pair ? "+" : " "; /* + joins a step */
        if (pp->desc.schedule == PDP_PP_INTERLEAVED_1F1B)
            n += (size_t)snprintf(buf + n, cap - n, "%s%c%dc%d", sep, a->kind, a->mb, a->chunk);
        else
            n += (size_t)snprintf(buf + n, cap - n, "%s%c%d", sep, a->kind, a->mb);
    }
    return buf;
}

/* ---- pp: construction ---- */

PDP__PRIVATE pdp_status pdp__pp_check_desc(const pdp_pp_desc *d, int nlayers, int p, const char *fn)
{
    int s, v = PDP__MAX(d->chunks, 1), n;
    if (d->schedule != PDP_PP_1F1B && d->schedule != PDP_PP_GPIPE &&
        d->schedule != PDP_PP_INTERLEAVED_1F1B)
        return pdp__err(PDP_ERR_INVALID, "%s: schedule %d (PDP_PP_1F1B, PDP_PP_GPIPE or "
                        "PDP_PP_INTERLEAVED_1F1B)", fn, (int)d->schedule);
    if (d->micro_batches < 0 || d->micro_batches > 65536)
        return pdp__err(PDP_ERR_INVALID, "%s: micro_batches %d outside 1..65536", fn,
                        d->micro_batches);
    if (d->chunks < 0 || d->chunks > PDP_PP_MAX_CHUNKS)
        return pdp__err(PDP_ERR_INVALID, "%s: chunks %d outside 1..%d", fn, d->chunks,
                        PDP_PP_MAX_CHUNKS);
    if (d->chunks > 1 && d->schedule != PDP_PP_INTERLEAVED_1F1B)
        return pdp__err(PDP_ERR_INVALID, "%s: chunks %d needs PDP_PP_INTERLEAVED_1F1B (GPipe "
                        "and 1F1B run one chunk a stage)", fn, d->chunks);
    if (d->schedule == PDP_PP_INTERLEAVED_1F1B) {
        v = PDP__DEF(d->chunks, 2);
        if (p < 2)
            return pdp__err(PDP_ERR_INVALID, "%s: PDP_PP_INTERLEAVED_1F1B on 1 stage (it needs "
                            "2 or more)", fn);
        if (d->micro_batches % p != 0)
            return pdp__err(PDP_ERR_INVALID, "%s: PDP_PP_INTERLEAVED_1F1B takes micro-batches in "
                            "groups of the stages: micro_batches %d is not a multiple of the %d "
                            "stages", fn, d->micro_batches, p);
    }
    if (d->balance != PDP_PP_BALANCE_PARAMS && d->balance != PDP_PP_BALANCE_TIME &&
        d->balance != PDP_PP_BALANCE_WORK)
        return pdp__err(PDP_ERR_INVALID, "%s: balance %d (PDP_PP_BALANCE_PARAMS, _TIME or _WORK)",
                        fn, (int)d->balance);
    if (d->balance_batch < 0)
        return pdp__err(PDP_ERR_INVALID, "%s: balance_batch %lld < 0", fn,
                        (long long)d->balance_batch);
    n = p * v; /* pieces */
    if (nlayers < n && v > 1)
        return pdp__err(PDP_ERR_INVALID, "%s: %d stages x %d chunks = %d pieces but the model "
                        "has %d layers", fn, p, v, n, nlayers);
    if (nlayers < n)
        return pdp__err(PDP_ERR_INVALID, "%s: %d stages but the model has %d layers", fn, p,
                        nlayers);
    if (d->first_layer) {
        if (d->first_layer[0] != 0)
            return pdp__err(PDP_ERR_INVALID, "%s: first_layer[0] is %d (must be 0)", fn,
                            d->first_layer[0]);
        for (s = 1; s < n; s++) /* each piece at least a layer */
            if (d->first_layer[s] <= d->first_layer[s - 1] || d->first_layer[s] > nlayers - n + s)
                return pdp__err(PDP_ERR_INVALID, "%s: first_layer[%d] is %d: it must be above "
                                "first_layer[%d] = %d and at most %d (%d layers, at least one "
                                "for each of the %d pieces from it)", fn, s, d->first_layer[s],
                                s - 1, d->first_layer[s - 1], nlayers - n + s, nlayers, n - s);
    }
    return PDP_OK;
}

/* The one place pdp_pp_desc's zeros become defaults (sokol's _def), after
   pdp__pp_check_desc; in may be NULL. first_layer stays as given (NULL: balanced);
   pdp_pp_get_desc puts the split in use there. */
PDP__PRIVATE pdp_status pdp__pp_desc_defaults(const pdp_pp_desc *in, pdp_pp_desc *out, int nlayers,
                                              int p, const char *fn)
{
    pdp_pp_desc d;
    pdp_status st;
    if (in) d = *in;
    else memset(&d, 0, sizeof d);
    if ((st = pdp__pp_check_desc(&d, nlayers, p, fn)) != PDP_OK) return st;
    d.micro_batches = PDP__DEF(d.micro_batches, p);
    d.balance_batch = PDP__DEF(d.balance_batch, 32);
    d.chunks = d.schedule == PDP_PP_INTERLEAVED_1F1B ? PDP__DEF(d.chunks, 2) : 1;
    *out = d;
    return PDP_OK;
}

/* Each layer's cost for balancing: parameters, or estimated FLOPs per sample
   (layers_table.c's estimate; layer 0 computes no input gradient; with loss, the
   cross-entropy's 6 a logit on the last layer: its max, exp and sum, the gradient's
   division and scale, a transcendental counted as one as there). */
PDP__PRIVATE void pdp__pp_layer_costs(const pdp_model *full, pdp_pp_balance how, bool loss,
                                      double *cost)
{
    int64_t classes, per = pdp__pp_loss_rows(full, &classes);
    int i, q;
    for (i = 0; i < full->nlayers; i++) {
        const pdp__layer *l = &full->layers[i];
        cost[i] = 0.0;
        if (how == PDP_PP_BALANCE_WORK) cost[i] = pdp__layer_flops(l, i > 0);
        else
            for (q = l->param_first; q < l->param_first + l->nparams; q++)
                cost[i] += (double)full->params[q].count;
    }
    if (how == PDP_PP_BALANCE_WORK && loss)
        cost[full->nlayers - 1] += 6.0 * (double)(per * classes);
}

/* cut_ok[i]: a stage may start at layer i (i in [0, n]): not inside a residual region,
   whose skip cannot cross stages. */
PDP__PRIVATE void pdp__pp_cut_points(const pdp_model *full, bool *cut_ok)
{
    int i;
    bool open = false;
    for (i = 0; i < full->nlayers; i++) {
        unsigned f = pdp__layer_kind_of(full->layers[i].kind)->flags;
        cut_ok[i] = !open;
        if (f & PDP__LAYER_SKIP) open = (f & PDP__LAYER_FORWARD_VIEW) != 0;
    }
    cut_ok[full->nlayers] = true;
}

/* The split into pieces: given, or balanced (by time: rank 0 measures). first[pieces] =
   nlayers. */
PDP__PRIVATE pdp_status pdp__pp_split(pdp_pp *pp, const pdp_model *full, const char *fn)
{
    int s, n = full->nlayers;
    double *cost;
    pdp_status st = PDP_OK;
    if (pp->v > 1) { /* every piece must start at a cut point: are there enough? */
        bool *cut_ok = (bool *)pdp__calloc(((size_t)n + 1) * sizeof *cut_ok);
        int cuts = 0;
        if (!cut_ok) return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory", fn);
        pdp__pp_cut_points(full, cut_ok);
        for (s = 0; s < n; s++) cuts += cut_ok[s];
        pdp__dealloc(cut_ok);
        if (cuts < pp->pieces)
            return pdp__err(PDP_ERR_INVALID, "%s: %d stages x %d chunks = %d pieces but the "
                            "model has %d cut points (layers a piece may start at, outside "
                            "residual regions)", fn, pp->p, pp->v, pp->pieces, cuts);
    }
    if (pp->desc.first_layer) {
        for (s = 0; s < pp->pieces; s++) pp->first[s] = pp->desc.first_layer[s];
    } else {
        cost = (double *)pdp__calloc((size_t)n * sizeof *cost);
        if (!cost) return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory", fn);
        if (pp->desc.balance == PDP_PP_BALANCE_TIME) {
            if (pp->stage == 0)
                st = pdp__pp_time_layers(full, PDP__DEF(pp->desc.balance_batch, 32),
                                         !pp->desc.loss, cost);
        } else {
            pdp__pp_layer_costs(full, pp->desc.balance, !pp->desc.loss, cost);
        }
        if (st == PDP_OK && (pp->stage == 0 || pp->desc.balance != PDP_PP_BALANCE_TIME)) {
            bool *cut_ok = (bool *)pdp__calloc(((size_t)n + 1) * sizeof *cut_ok);
            pdp_status b = cut_ok ? PDP_OK : PDP_ERR_OUT_OF_MEMORY;
            if (cut_ok) {
                pdp__pp_cut_points(full, cut_ok);
                b = pdp__pp_balance(cost, cut_ok, n, pp->pieces, pp->first);
            }
            if (b == PDP_ERR_INVALID) {
                int cuts = 0;
                for (s = 0; s < n; s++) cuts += cut_ok[s];
                st = pdp__err(PDP_ERR_INVALID, "%d stages do not fit between the model's residual "
                              "regions (a stage starts outside every region: %d places, so at "
                              "most %d stages)", pp->p, cuts, cuts);
            }
            else if (b != PDP_OK)
                st = pdp__err(PDP_ERR_OUT_OF_MEMORY, "no memory");
            pdp__dealloc(cut_ok);
        }
        pdp__dealloc(cost);
        if (st != PDP_OK)
            return pdp__err_wrap(st, "%s: rank %d: %s", fn, pp->stage,
                                 pp->desc.balance == PDP_PP_BALANCE_TIME
                                     ? "timing the layers and placing the stages"
                                     : "placing the stages");
    }
    pp->first[pp->pieces] = n;
    return PDP_OK;
}

/* Every rank checks its split, schedule and micro-batches against rank 0's (by
   time: takes rank 0's split). */
PDP__PRIVATE pdp_status pdp__pp_agree(pdp_pp *pp, const char *fn)
{
    static const char *what[3] = {"schedule", "micro_batches", "chunks"};
    int head[3], theirs[3], s, np = pp->pieces;
    int *split;
    pdp_status st;
    /* first the schedule, m and v, which fix the split's length */
    head[0] = (int)pp->desc.schedule, head[1] = pp->mb, head[2] = pp->v;
    memcpy(theirs, head, sizeof head);
    if ((st = pdp_comm_broadcast_bytes(pp->c, theirs, sizeof theirs, 0)) != PDP_OK)
        return pdp__err_wrap(st, "%s: rank %d: exchanging the schedule", fn, pp->stage);
    for (s = 0; s < 3; s++)
        if (head[s] != theirs[s])
            st = pdp__err(PDP_ERR_INVALID, "%s: rank %d: %s %d here but %d on rank 0", fn,
                          pp->stage, what[s], head[s], theirs[s]);
    /* every rank learns of a difference before the split's broadcast, whose length differs */
    if ((st = pdp__comm_agree(pp->c, st, fn)) != PDP_OK) return st;
    split = (int *)pdp__alloc((size_t)(np + 1) * sizeof *split);
    if (!split) return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: rank %d: no memory", fn, pp->stage);
    memcpy(split, pp->first, (size_t)(np + 1) * sizeof *split);
    if ((st = pdp_comm_broadcast_bytes(pp->c, split, (size_t)(np + 1) * sizeof *split, 0)) !=
        PDP_OK) {
        pdp__dealloc(split);
        return pdp__err_wrap(st, "%s: rank %d: exchanging the split", fn, pp->stage);
    }
    if (!pp->desc.first_layer && pp->desc.balance == PDP_PP_BALANCE_TIME)
        memcpy(pp->first, split, (size_t)(np + 1) * sizeof *split);
    for (s = 0; s <= np && st == PDP_OK; s++)
        if (pp->first[s] != split[s])
            st = pdp__err(PDP_ERR_INVALID, "%s: rank %d: %s %d starts at layer %d here but at "
                          "layer %d on rank 0 (the ranks' models or first_layer differ)", fn,
                          pp->stage, pp->v > 1 ? "piece" : "stage", s, pp->first[s], split[s]);
    pdp__dealloc(split);
    return st;
}

/* A split by time is stage 0's measurement of one pipeline; the other pipelines and the
   other TP ranks measured their own, and every copy of a stage must hold the same layers:
   all take TP rank 0's (after the pipelines agreed), then dp rank 0's, so every rank holds
   the split of pipeline 0's TP rank 0. */
PDP__PRIVATE pdp_status pdp__pp_agree_timed(pdp_pp *pp, const pdp_model *full, const char *fn)
{
    size_t bytes = (size_t)(pp->pieces + 1) * sizeof *pp->first;
    pdp_status st = PDP_OK;
    if (pp->desc.first_layer || pp->desc.balance != PDP_PP_BALANCE_TIME) return PDP_OK;
    if (full->tp.comm && full->tp.size > 1 &&
        (st = pdp_comm_broadcast_bytes(full->tp.comm, pp->first, bytes, 0)) != PDP_OK)
        return pdp__err_wrap(st, "%s: rank %d: the split over TP", fn, pp->stage);
    if (pp->dp && pp->dp->size > 1 &&
        (st = pdp_comm_broadcast_bytes(pp->dp, pp->first, bytes, 0)) != PDP_OK)
        return pdp__err_wrap(st, "%s: rank %d: the split over dp", fn, pp->stage);
    return PDP_OK;
}

/* Every rank keeps its stage of its own copy of the full model, so the copies must be one
   model: rank 0's parameter count and parameters' hash to every rank, each compares (ranks
   seeded apart would train a pipeline equal to no one device's model, silently; a TP
   model's pipeline ranks share a TP rank, so they hold the same slices). */
PDP__PRIVATE pdp_status pdp__pp_agree_model(pdp_pp *pp, const pdp_model *full, const char *fn)
{
    uint64_t mine[2], theirs[2];
    pdp_status st;
    mine[0] = (uint64_t)full->param_count;
    if ((st = pdp__model_param_hash(full, NULL, &mine[1])) != PDP_OK)
        st = pdp__err_wrap(st, "%s: rank %d", fn, pp->stage);
    if ((st = pdp__comm_agree(pp->c, st, fn)) != PDP_OK) return st;
    memcpy(theirs, mine, sizeof mine);
    if ((st = pdp_comm_broadcast_bytes(pp->c, theirs, sizeof theirs, 0)) != PDP_OK)
        return pdp__err_wrap(st, "%s: rank %d: exchanging the model's hash", fn, pp->stage);
    if (mine[0] != theirs[0] || mine[1] != theirs[1])
        st = pdp__err(PDP_ERR_INVALID, "%s: rank %d: the full model's parameters differ from "
                      "rank 0's (%s): every rank builds the same model (the same seed) and keeps "
                      "its stage of it", fn, pp->stage,
                      mine[0] != theirs[0] ? "their count" : "their values");
    return pdp__comm_agree(pp->c, st, fn);
}

PDP_API pdp_pp_desc pdp_pp_get_desc(const pdp_pp *pp)
{
    pdp_pp_desc d;
    if (!pp) {
        memset(&d, 0, sizeof d);
        return d;
    }
    d = pp->desc;
    d.first_layer = pp->first;
    return d;
}

/* The piece holding layer i. */
PDP__PRIVATE int pdp__pp_piece_of(const pdp_pp *pp, int i)
{
    int q = 0;
    while (pp->first[q + 1] <= i) q++;
    return q;
}

/* The weight tied across stages, if any: a TiedLinear on piece q_use whose parameter's
   layer is on piece q_own < q_use (pdp__model_stage gave q_use's chunk a copy, its last
   parameter). Two chunks of one stage cannot share one (PDP_ERR_UNSUPPORTED). */
PDP__PRIVATE pdp_status pdp__pp_find_tied(pdp_pp *pp, const pdp_model *full, const char *fn)
{
    int i, q_use, q_own, s_use, s_own;
    pp->tied_param = -1;
    for (i = 0; i < full->nlayers; i++) {
        const pdp__layer *l = &full->layers[i];
        int owner;
        if (!(pdp__layer_kind_of(l->kind)->flags & PDP__LAYER_TIED)) continue;
        owner = full->params[l->tied_param].layer;
        q_use = pdp__pp_piece_of(pp, i);
        q_own = pdp__pp_piece_of(pp, owner);
        if (q_use == q_own) continue;
        s_use = q_use % pp->p, s_own = q_own % pp->p;
        if (s_use == s_own)
            return pdp__err(PDP_ERR_UNSUPPORTED, "%s: rank %d: layers %d and %d share %s but "
                            "are on chunks %d and %d of stage %d (a tied weight's two copies "
                            "must be on two stages)", fn, pp->stage, owner, i,
                            full->params[l->tied_param].name, q_own / pp->p, q_use / pp->p,
                            s_own);
        if (pp->stage == s_own) {
            pp->tied_param = pp->ck[q_own / pp->p].param0 + l->tied_param -
                             full->layers[pp->first[q_own]].param_first;
            pp->tied_peer = s_use;
        } else if (pp->stage == s_use) { /* the copy: its chunk's last parameter */
            const pdp__pp_chunk *ck = &pp->ck[q_use / pp->p];
            pp->tied_param = ck->param0 + ck->m->nparams - 1;
            pp->tied_peer = s_own;
            pp->tied_copy = true;
        }
    }
    return PDP_OK;
}

/* With v > 1 chunks, the stage model: the chunks' layers and parameters one after the other
   in one model whose blocks hold every chunk's (the optimizer, clipping and checkpoints see
   one model, as with one chunk); each chunk's blocks become views into them. Its layers keep
   their indices into its own registry; they are not run (each chunk runs its own). With TP
   layers each chunk keeps its own TP state (its layers' and its width check's, pdp__model_
   stage), and the stage model holds the TP group too, for clipping: pdp__grad_sumsq_range
   counts its slices as on one chunk; pdp__pp_fold_tp_stats adds the chunks' counters to
   its own after each pass, for pdp_tp_get_stats. */
PDP__PRIVATE pdp_status pdp__pp_join(pdp_pp *pp)
{
    pdp_model *r;
    const pdp_model *c0 = pp->ck[0].m;
    int c, i, nl = 0, np = 0, l0 = 0;
    int64_t count = 0;
    pdp_status st;
    for (c = 0; c < pp->v; c++) {
        pp->ck[c].param0 = np;
        pp->ck[c].off = count;
        nl += pp->ck[c].m->nlayers, np += pp->ck[c].m->nparams;
        count += pp->ck[c].m->param_count;
    }
    r = (pdp_model *)pdp__calloc(sizeof *r);
    if (!r) return pdp__err(PDP_ERR_OUT_OF_MEMORY, "no memory for a stage");
    pp->m = r;
    r->device = c0->device;
    r->seed = c0->seed;
    r->init_rng = c0->init_rng;
    r->in_ndim = c0->in_ndim;
    memcpy(r->in_shape, c0->in_shape, sizeof r->in_shape);
    r->in_count = c0->in_count;
    r->in_dtype = c0->in_dtype;
    r->training = c0->training;
    r->precision = c0->precision;
    r->recompute = c0->recompute;
    r->open_residual = -1;
    r->nlayers = r->cap_layers = nl;
    r->nparams = r->cap_params = np;
    r->param_count = count;
    r->layers = (pdp__layer *)pdp__alloc((size_t)nl * sizeof *r->layers);
    r->params = (pdp__param_entry *)pdp__alloc((size_t)PDP__MAX(1, np) * sizeof *r->params);
    if (!r->layers || !r->params) return pdp__err(PDP_ERR_OUT_OF_MEMORY, "no memory for a stage");
    if (count && ((st = pdp__dev_alloc(r->device, (size_t)count * sizeof(float),
                                       (void **)&r->param_block)) != PDP_OK ||
                  (st = pdp__dev_alloc(r->device, (size_t)count * sizeof(float),
                                       (void **)&r->grad_block)) != PDP_OK ||
                  (st = pdp__dev_memset0(r->device, r->grad_block,
                                         (size_t)count * sizeof(float))) != PDP_OK))
        return st;
    if (c0->tp.comm) { /* PP x TP: the TP group, for clipping; no layer of its own runs */
        r->tp = c0->tp;
        r->tp.model = r;
        r->tp.nlayers = r->tp.checked = 0;
        r->tp.dscalar = NULL;
        memset(&r->tp.stats, 0, sizeof r->tp.stats);
        if (r->device.kind != PDP_DEVICE_CPU &&
            (st = pdp__dev_alloc(r->device, sizeof(float), (void **)&r->tp.dscalar)) != PDP_OK)
            return st;
    }
    for (c = 0; c < pp->v; c++) {
        pdp__pp_chunk *ck = &pp->ck[c];
        pdp_model *m = ck->m;
        for (i = 0; i < m->nlayers; i++) {
            pdp__layer *l = &r->layers[l0 + i];
            *l = m->layers[i];
            l->param_first += ck->param0;
            l->residual_from += l0;
            if (pdp__model_flag(m, i, PDP__LAYER_TIED)) l->tied_param += ck->param0;
        }
        for (i = 0; i < m->nparams; i++) {
            r->params[ck->param0 + i] = m->params[i];
            r->params[ck->param0 + i].offset += ck->off;
        }
        l0 += m->nlayers;
        if (!m->param_count) continue;
        if ((st = pdp__dev_copy(r->device, r->param_block + ck->off, m->device, m->param_block,
                                (size_t)m->param_count * sizeof(float))) != PDP_OK)
            return st;
        pdp__dev_free(m->device, m->param_block);
        pdp__dev_free(m->device, m->grad_block);
        m->param_block = r->param_block + ck->off;
        m->grad_block = r->grad_block + ck->off;
        ck->view = true;
    }
    return PDP_OK;
}

/* pdp_pp_create's first half on this rank alone: the model, the desc and the split
   into stages (by time: measured on rank 0). *out gets what was built, on failure too
   (pdp_pp_free takes it). */
PDP__PRIVATE pdp_status pdp__pp_prepare(pdp_pp **out, const pdp_model *full, pdp_comm *c,
                                        const pdp_pp_desc *desc, const char *fn)
{
    pdp_pp *pp;
    pdp_status st;
    if (!full) return pdp__err(PDP_ERR_INVALID, "%s: model is NULL", fn);
    if ((st = pdp__model_check_whole(full, fn)) != PDP_OK) return st;
    if (full->param_count && !full->param_block) /* the stages copy their parameters from it */
        return pdp__err(PDP_ERR_STATE, "%s: rank %d: the model's parameters are sharded by %s: "
                        "it has no parameter block to split (pdp_zero_gather_params(z, NULL) "
                        "puts the full values there)", fn, c->rank, pdp__model_wrapper(full));
    if (c->size > PDP_PP_MAX_STAGES)
        return pdp__err(PDP_ERR_INVALID, "%s: %d ranks (at most PDP_PP_MAX_STAGES = %d stages)",
                        fn, c->size, PDP_PP_MAX_STAGES);
    if (full->device.kind != c->device.kind || full->device.ordinal != c->device.ordinal)
        return pdp__err(PDP_ERR_DEVICE, "%s: model on device %d:%d, communicator '%s' on %d:%d",
                        fn, full->device.kind, full->device.ordinal, c->name, c->device.kind,
                        c->device.ordinal);
    if (!(*out = pp = (pdp_pp *)pdp__calloc(sizeof *pp)))
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: rank %d: no memory", fn, c->rank);
    pp->c = c;
    pp->stage = c->rank;
    pp->p = c->size;
    if ((st = pdp__pp_desc_defaults(desc, &pp->desc, full->nlayers, pp->p, fn)) != PDP_OK)
        return st;
    pp->dp = pp->desc.dp;
    pp->mb = pp->desc.micro_batches;
    pp->v = pp->desc.chunks;
    pp->pieces = pp->p * pp->v;
    pp->one_stream = c->backend == PDP_BACKEND_NCCL;
    pp->first = (int *)pdp__calloc((size_t)(pp->pieces + 1) * sizeof *pp->first);
    pp->ck = (pdp__pp_chunk *)pdp__calloc((size_t)pp->v * sizeof *pp->ck);
    if (!pp->first || !pp->ck)
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: rank %d: no memory", fn, pp->stage);
    return pdp__pp_split(pp, full, fn);
}

/* Collective over c: the first half on this rank, then every rank learns whether every
   rank's succeeded (one that failed alone would leave its peers waiting for it in the
   collectives that follow, until the timeout), then the checks of the split against rank
   0's; what follows them is agreed on once more at the end. */
PDP_API pdp_status pdp_pp_create(pdp_pp **out, const pdp_model *full, pdp_comm *c,
                                 const pdp_pp_desc *desc)
{
    static const char *fn = "pdp_pp_create";
    pdp_pp *pp = NULL;
    pdp_status st;
    int k;
    bool agreed = false;
    if (out) *out = NULL;
    if (!c) return pdp__err(PDP_ERR_INVALID, "%s: comm is NULL", fn);
    if (!out) st = pdp__err(PDP_ERR_INVALID, "%s: out is NULL", fn);
    else st = pdp__pp_prepare(&pp, full, c, desc, fn);
    if ((st = pdp__comm_agree(c, st, fn)) != PDP_OK || (st = pdp__pp_agree(pp, fn)) != PDP_OK ||
        (st = pdp__pp_agree_timed(pp, full, fn)) != PDP_OK ||
        (st = pdp__pp_agree_model(pp, full, fn)) != PDP_OK)
        goto fail;
    agreed = true; /* past the split's collectives: a failure from here on is agreed */
    pp->acts = (pdp__pp_action *)pdp__calloc((size_t)(2 * pp->mb * pp->v) * sizeof *pp->acts);
    if (!pp->acts) goto oom;
    pdp__pp_plan(pp);
    for (k = 0; k < pp->v; k++) {
        pdp__pp_chunk *ck = &pp->ck[k];
        ck->q = k * pp->p + pp->stage;
        if ((st = pdp__model_stage(full, pp->first[ck->q], pp->first[ck->q + 1], &ck->m)))
            goto wrap;
        pdp__model_set_slots(ck->m, ck->nslots);
        ck->in_count = ck->m->in_count;
        ck->out_count = ck->m->layers[ck->m->nlayers - 1].out_count;
        ck->in_buf = (float **)pdp__calloc((size_t)(ck->nslots + 1) * sizeof *ck->in_buf);
        ck->send_fwd = (pdp_work **)pdp__calloc((size_t)ck->nslots * sizeof *ck->send_fwd);
        if (!ck->in_buf || !ck->send_fwd) goto oom;
    }
    if (pp->v == 1) pp->m = pp->ck[0].m;
    else if ((st = pdp__pp_join(pp)) != PDP_OK) goto wrap;
    pp->m->wrapped = PDP__WRAP_PP; /* the stage is the pipeline's: its layout is fixed */
    {
        const pdp__layer *last = &full->layers[full->nlayers - 1];
        pp->positions = last->out_count / last->out_shape[last->out_ndim - 1];
    }
    if ((st = pdp__pp_find_tied(pp, full, fn)) != PDP_OK) goto fail;
    if ((st = pdp__model_layout(full, false, &pp->layout)) != PDP_OK) goto wrap;
    if (pp->tied_param >= 0 &&
        (st = pdp__dev_alloc(pp->m->device, (size_t)pp->m->params[pp->tied_param].count *
                                                sizeof(float), (void **)&pp->tied_buf)) != PDP_OK)
        goto wrap;
    if (pp->m->device.kind != PDP_DEVICE_CPU &&
        (st = pdp__dev_alloc(pp->m->device, sizeof pp->norm_host, (void **)&pp->norm_dev)))
        goto wrap;
    if (pp->dp) { /* DP x PP: every pipeline starts from dp rank 0's stage */
        if (pp->dp->device.kind != c->device.kind || pp->dp->device.ordinal != c->device.ordinal) {
            st = pdp__err(PDP_ERR_DEVICE, "%s: dp communicator '%s' on another device", fn,
                          pp->dp->name);
            goto fail;
        }
        if (pp->m->param_count && (st = pdp_comm_broadcast(pp->dp, pp->m->param_block,
                                                          pp->m->param_count, 0, NULL)))
            goto wrap;
    }
    pp->trace_pid = c->trace_pid; /* the world's rank (comm.c): TP ranks of a stage apart */
    if (pdp__trace_open(c->backend == PDP_BACKEND_LOCAL ? -1 : pp->trace_pid) == PDP_OK) {
        char name[48];
        pp->traced = true;
        snprintf(name, sizeof name, "pipeline stage %d", pp->stage);
        pp->trace_tid = pdp__trace_track(pp->trace_pid, name);
    }
    pp->stats.bubble_theory = (double)(pp->p - 1) / (double)(pp->v * pp->mb + pp->p - 1);
    pp->stats.bubble_megatron = (double)(pp->p - 1) / (double)(pp->v * pp->mb);
    if ((st = pdp__comm_agree(c, PDP_OK, fn)) != PDP_OK) {
        pdp_pp_free(pp);
        return st;
    }
    *out = pp;
    return PDP_OK;
oom:
    st = pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: rank %d: no memory", fn, pp->stage);
    goto fail;
wrap:
    st = pdp__err_wrap(st, "%s: rank %d", fn, pp->stage);
fail:
    if (agreed) st = pdp__comm_agree(c, st, fn);
    pdp_pp_free(pp);
    return st;
}

PDP__PRIVATE void pdp__pp_free_buffers(pdp_pp *pp)
{
    int i, k;
    for (k = 0; pp->ck && k < pp->v; k++) {
        pdp__pp_chunk *ck = &pp->ck[k];
        pdp_device d = ck->m ? ck->m->device : pdp_cpu();
        if (ck->in_buf)
            for (i = 0; i <= ck->nslots; i++) pdp__dev_free(d, ck->in_buf[i]), ck->in_buf[i] = NULL;
        for (i = 0; i < 2; i++) {
            pdp__dev_free(d, ck->dy_buf[i]);
            pdp__dev_free(d, ck->dx_buf[i]);
            ck->dy_buf[i] = ck->dx_buf[i] = NULL;
        }
    }
    pp->cap_rows = 0;
}

/* Waits every outstanding message and the dp average. Their errors are consequences of
   the pass's first error (or of one reported already), so the thread's message is kept:
   after a failed pass it is the one that names the call, the stage and the action. */
PDP__PRIVATE void pdp__pp_drain(pdp_pp *pp)
{
    pdp__err_kept kept; /* with its mark: pdp_launch reports the rank a peer's error names */
    int i, k;
    pdp__err_keep(&kept);
    for (i = 0; i < 2; i++) pdp_work_wait(pp->rwork[i]), pp->rwork[i] = NULL;
    pp->nbatch = 0; /* a failed step's sends, never issued */
    for (k = 0; pp->ck && k < pp->v; k++) {
        pdp__pp_chunk *ck = &pp->ck[k];
        if (ck->send_fwd)
            for (i = 0; i < ck->nslots; i++) pdp_work_wait(ck->send_fwd[i]), ck->send_fwd[i] = NULL;
        for (i = 0; i < 2; i++) pdp_work_wait(ck->send_bwd[i]), ck->send_bwd[i] = NULL;
    }
    if (pp->dp_work) pdp_work_wait(pp->dp_work);
    pp->dp_work = NULL;
    (void)pdp__err_restore(PDP_OK, &kept);
}

PDP_API void pdp_pp_free(pdp_pp *pp)
{
    int k;
    if (!pp) return;
    pdp__pp_drain(pp);
    pdp__pp_free_buffers(pp);
    if (pp->traced) pdp__trace_close();
    if (pp->m) pp->m->wrapped = PDP__WRAP_NONE;
    if (pp->norm_dev) pdp__dev_free(pp->m->device, pp->norm_dev);
    if (pp->tied_buf) pdp__dev_free(pp->m->device, pp->tied_buf);
    pdp_model_free(pp->layout);
    for (k = 0; pp->ck && k < pp->v; k++) {
        pdp__pp_chunk *ck = &pp->ck[k];
        if (ck->view) ck->m->param_block = ck->m->grad_block = NULL; /* pp->m's */
        if (ck->m != pp->m) pdp_model_free(ck->m);
        pdp__dealloc(ck->in_buf);
        pdp__dealloc(ck->send_fwd);
    }
    pdp_model_free(pp->m);
    pdp__dealloc(pp->ck);
    pdp__dealloc(pp->first);
    pdp__dealloc(pp->acts);
    pdp__dealloc(pp->mb_rows);
    pdp__dealloc(pp->mb_first);
    pdp__dealloc(pp);
}

/* Buffers for micro-batches of up to rows rows (grown, never shrunk). */
PDP__PRIVATE pdp_status pdp__pp_reserve(pdp_pp *pp, int64_t rows)
{
    pdp_status st;
    int i, k;
    if (rows <= pp->cap_rows) return PDP_OK;
    pdp__pp_free_buffers(pp);
    for (k = 0; k < pp->v; k++) {
        pdp__pp_chunk *ck = &pp->ck[k];
        pdp_device d = ck->m->device;
        size_t in_b = (size_t)(rows * ck->in_count) * sizeof(float);
        size_t out_b = (size_t)(rows * ck->out_count) * sizeof(float);
        if ((st = pdp_model_reserve(ck->m, rows)) != PDP_OK) return st;
        for (i = 0; ck->q > 0 && i <= ck->nslots; i++)
            if ((st = pdp__dev_alloc(d, in_b, (void **)&ck->in_buf[i])) != PDP_OK) return st;
        for (i = 0; i < 2; i++)
            if ((ck->q < pp->pieces - 1 &&
                 (st = pdp__dev_alloc(d, out_b, (void **)&ck->dy_buf[i])) != PDP_OK) ||
                (ck->q > 0 && (st = pdp__dev_alloc(d, in_b, (void **)&ck->dx_buf[i])) != PDP_OK))
                return st;
    }
    pp->cap_rows = rows;
    return PDP_OK;
}

/* ---- pp: one pass ---- */

/* The tag of micro-batch j's message across the boundary b between pieces b and b + 1
   (dir 0: its activations, 1: its gradients); the opening comment says why it is unique. */
PDP__PRIVATE int pdp__pp_tag(const pdp_pp *pp, int j, int b, int dir)
{
    return (int)((2 * ((int64_t)j * pp->v + b / pp->p) + dir) % (PDP_COMM_TAG_MAX + 1));
}

/* Adds action k's receive, if it has one, to the batch: its input from piece q - 1 (a
   forward after piece 0), or its output's gradient from piece q + 1 (a backward before the
   last piece); the handle goes to rwork[0] or rwork[1]. */
PDP__PRIVATE void pdp__pp_add_recv(pdp_pp *pp, int k)
{
    const pdp__pp_action *a = &pp->acts[k];
    const pdp__pp_chunk *ck = &pp->ck[a->chunk];
    pdp_p2p *o = &pp->batch[pp->nbatch];
    int64_t n = pp->mb_rows[a->mb];
    PDP_ASSERT(!pp->rwork[a->kind == 'B']); /* the last step's, waited by its action */
    if (a->kind == 'F' && ck->q > 0) { /* from the previous stage (the last) */
        o->buf = ck->in_buf[a->mb % (ck->nslots + 1)];
        o->count = n * ck->in_count;
        o->peer = (pp->stage + pp->p - 1) % pp->p;
        o->tag = pdp__pp_tag(pp, a->mb, ck->q - 1, 0);
        o->work = &pp->rwork[0];
    } else if (a->kind == 'B' && ck->q < pp->pieces - 1) { /* from the next (the first) */
        o->buf = ck->dy_buf[a->mb % 2];
        o->count = n * ck->out_count;
        o->peer = (pp->stage + 1) % pp->p;
        o->tag = pdp__pp_tag(pp, a->mb, ck->q, 1);
        o->work = &pp->rwork[1];
    } else {
        return;
    }
    o->send = false;
    pp->nbatch++;
}

/* Adds a send of the current step to the batch. */
PDP__PRIVATE void pdp__pp_add_send(pdp_pp *pp, const float *buf, int64_t count, int peer, int tag,
                                   pdp_work **w)
{
    pdp_p2p *o = &pp->batch[pp->nbatch++];
    o->send = true;
    o->buf = (float *)buf;
    o->count = count;
    o->peer = peer;
    o->tag = tag;
    o->work = w;
    pp->messages++;
}

/* After action k (k = -1: before the first): at a step's end, one batch of its sends and
   the next step's receives; within a step (a pair's forward) its send goes at once where
   messages start when posted and match by tag, on NCCL with the step's batch (the opening
   comment says why). */
PDP__PRIVATE pdp_status pdp__pp_issue(pdp_pp *pp, int k)
{
    int i, n, last;
    if (k >= 0 && pp->acts[k].pair && pp->one_stream) return PDP_OK;
    if (k >= 0 && pp->acts[k].pair) {
        last = k; /* no receive: the next action is this step's */
    } else {
        last = k + 1 < pp->nacts ? k + 1 + pp->acts[k + 1].pair : k; /* the next step's end */
        for (i = k + 1; i <= last; i++) pdp__pp_add_recv(pp, i);
    }
    n = pp->nbatch;
    pp->nbatch = 0;
    return pdp_comm_sendrecv(pp->c, pp->batch, n);
}

PDP__PRIVATE pdp_status pdp__pp_wait(pdp_work **w)
{
    pdp_work *x = *w;
    *w = NULL;
    return pdp_work_wait(x);
}

/* The input rows of micro-batch j on chunk ck. */
PDP__PRIVATE const float *pdp__pp_input(const pdp__pp_chunk *ck, const pdp_tensor *x,
                                        const int64_t *mb_first, int j)
{
    if (ck->q > 0) return ck->in_buf[j % (ck->nslots + 1)];
    return x->data + mb_first[j] * ck->in_count;
}

PDP__PRIVATE pdp_status pdp__pp_forward(pdp_pp *pp, const pdp_tensor *x, int k)
{
    pdp__pp_chunk *ck = &pp->ck[pp->acts[k].chunk];
    pdp_model *m = ck->m;
    int j = pp->acts[k].mb, slot = j % ck->nslots, d;
    int64_t n = pp->mb_rows[j], shape[4];
    const pdp_tensor *y;
    pdp_tensor in;
    pdp_status st;
    if ((st = pdp__pp_wait(&pp->rwork[0])) != PDP_OK) return st;
    if ((st = pdp__pp_wait(&ck->send_fwd[slot])) != PDP_OK) return st; /* F(j - S)'s send */
    shape[0] = n;
    for (d = 0; d < m->in_ndim; d++) shape[d + 1] = m->in_shape[d];
    pdp_tensor_wrap((float *)pdp__pp_input(ck, x, pp->mb_first, j), m->device, m->in_ndim + 1,
                    shape, &in);
    in.dtype = m->in_dtype; /* piece 0 of a GPT: token ids */
    pp->t_compute = pdp__now();
    pdp__model_use_slot(m, slot, NULL, 0, false);
    m->step = pp->steps; /* forward counts it up: the single-device run's step */
    m->sample_base = pp->sample_base + pp->mb_first[j];
    if ((st = pdp_model_forward(m, &in, &y)) != PDP_OK) return st;
    if (ck->q < pp->pieces - 1) /* to piece q + 1: the next stage (the first) */
        pdp__pp_add_send(pp, y->data, n * ck->out_count, (pp->stage + 1) % pp->p,
                         pdp__pp_tag(pp, j, ck->q, 0), &ck->send_fwd[slot]);
    return pdp__pp_issue(pp, k);
}

PDP__PRIVATE pdp_status pdp__pp_backward(pdp_pp *pp, const pdp_tensor *x, const int32_t *labels,
                                         int k, double *loss_sum)
{
    static const char *fn = "pdp_pp_forward_backward";
    pdp__pp_chunk *ck = &pp->ck[pp->acts[k].chunk];
    pdp_model *m = ck->m;
    int j = pp->acts[k].mb, slot = j % ck->nslots, last = ck->q == pp->pieces - 1;
    int64_t n = pp->mb_rows[j], total = pp->mb_first[pp->mb - 1] + pp->mb_rows[pp->mb - 1];
    const pdp_tensor *y = &m->out_view;
    pdp_tensor dy;
    pdp_status st;
    if ((st = pdp__pp_wait(&pp->rwork[1])) != PDP_OK) return st;
    if (ck->q > 0 && (st = pdp__pp_wait(&ck->send_bwd[j % 2])) != PDP_OK) return st;
    pp->t_compute = pdp__now();
    pdp__model_use_slot(m, slot, pdp__pp_input(ck, x, pp->mb_first, j), n, true);
    m->input_grad = ck->q > 0 ? ck->dx_buf[j % 2] : NULL;
    /* the keys of micro-batch j's forward, which a backward that draws its masks again (an
       attention's dropout) needs: later forwards have moved them */
    m->step = pp->steps + 1;
    m->sample_base = pp->sample_base + pp->mb_first[j];
    if (last) { /* the loss, its gradient scaled by 1/total into the model's grad_a */
        pdp_tensor_wrap(m->grad_a, m->device, y->ndim, y->shape, &dy);
        if (pp->desc.loss) {
            double share = 0.0;
            if ((st = pp->desc.loss(pp->desc.loss_user, y, pp->mb_first[j], total, &dy,
                                    &share)) != PDP_OK)
                return pdp__err_wrap(st, "%s: the loss function on micro-batch %d", fn, j);
            *loss_sum += share * (double)pp->counted; /* *loss: loss_sum / counted */
        } else {
            /* one label a row of the last dimension, -1 ignored, scaled by the pass's count */
            double sum = 0.0;
            const int32_t *lab = labels + pp->mb_first[j] * pp->positions;
            float scale = pp->counted > 0 ? 1.0f / (float)pp->counted : 0.0f;
            if (y->ndim != 2 && y->ndim != 3)
                return pdp__err(PDP_ERR_SHAPE, "%s: the last stage's output has %d dimensions; "
                                "cross-entropy needs [batch, classes] or [batch, T, vocab]", fn,
                                y->ndim);
            st = pdp__cross_entropy_rows_on(m->device, y->data, lab, n * pp->positions,
                                            y->shape[y->ndim - 1], scale, &sum, m->grad_a, fn);
            if (st != PDP_OK) return st;
            *loss_sum += sum;
        }
    } else {
        pdp_tensor_wrap(ck->dy_buf[j % 2], m->device, y->ndim, y->shape, &dy);
    }
    st = pdp_model_backward(m, &dy);
    m->input_grad = NULL;
    if (st != PDP_OK) return st;
    if (ck->q > 0) /* to piece q - 1: the previous stage (the last) */
        pdp__pp_add_send(pp, ck->dx_buf[j % 2], n * ck->in_count, (pp->stage + pp->p - 1) % pp->p,
                         pdp__pp_tag(pp, j, ck->q - 1, 1), &ck->send_bwd[j % 2]);
    return pdp__pp_issue(pp, k);
}

/* A weight tied across two stages (a GPT's wte: the embedding's on stage 0, chunk 0, the
   head's copy on the last, its last chunk): each stage sends its gradient of it to the
   other and adds the one it receives, a + b on one side and b + a on the other, the same
   bits, so the two copies get the same update and stay equal (Megatron's all-reduce over
   the embedding group). */
PDP__PRIVATE pdp_status pdp__pp_sum_tied(pdp_pp *pp)
{
    pdp_model *m = pp->m;
    const pdp__param_entry *e;
    pdp_work *sw = NULL, *rw = NULL;
    pdp_p2p ops[2];
    float *g;
    pdp_status st;
    int k;
    if (pp->tied_param < 0) return PDP_OK;
    e = &m->params[pp->tied_param];
    g = m->grad_block + e->offset;
    /* one batch: on NCCL both stages' sends would otherwise queue ahead of their receives */
    ops[0].send = false, ops[0].buf = pp->tied_buf, ops[0].work = &rw;
    ops[1].send = true, ops[1].buf = g, ops[1].work = &sw;
    for (k = 0; k < 2; k++) {
        ops[k].count = e->count;
        ops[k].peer = pp->tied_peer;
        ops[k].tag = pdp__pp_tag(pp, pp->mb, 0, 0);
    }
    if ((st = pdp_comm_sendrecv(pp->c, ops, 2)) != PDP_OK) {
        pdp_work_wait(rw);
        pdp_work_wait(sw);
        return st;
    }
    /* the receive first: a peer that never sends is named by its timeout, status and
       message as pdp_work_wait set them, which the send's wait (its work freed either way)
       must not overwrite */
    st = pdp__pp_wait(&rw);
    if (st != PDP_OK) {
        pdp__err_kept why;
        pdp__err_keep(&why);
        pdp_work_wait(sw);
        return pdp__err_restore(st, &why);
    }
    if ((st = pdp__pp_wait(&sw)) != PDP_OK) return st;
    return pdp__dev_add(m->device, g, pp->tied_buf, e->count);
}

/* With chunks on TP stages: each chunk's TP counters of the pass added to the stage model's
   (pdp_tp_get_stats(pdp_pp_model(pp)) reads them) and zeroed. */
PDP__PRIVATE void pdp__pp_fold_tp_stats(pdp_pp *pp)
{
    pdp_tp_stats *t = &pp->m->tp.stats;
    int c;
    if (pp->v == 1 || !pp->m->tp.comm) return;
    for (c = 0; c < pp->v; c++) {
        pdp_tp_stats *s = &pp->ck[c].m->tp.stats;
        t->forward_allreduces += s->forward_allreduces;
        t->backward_allreduces += s->backward_allreduces;
        t->forward_bytes += s->forward_bytes;
        t->backward_bytes += s->backward_bytes;
        t->bytes_sent += s->bytes_sent;
        t->allreduce_s += s->allreduce_s;
        t->allgathers += s->allgathers;
        t->reduce_scatters += s->reduce_scatters;
        t->allgather_bytes += s->allgather_bytes;
        t->reduce_scatter_bytes += s->reduce_scatter_bytes;
        t->grad_allreduces += s->grad_allreduces;
        t->grad_bytes += s->grad_bytes;
        memset(s, 0, sizeof *s);
    }
}

/* Micro-batch sizes of a batch of rows rows (the first rows % m one larger). */
PDP__PRIVATE pdp_status pdp__pp_cut(pdp_pp *pp, int64_t rows)
{
    int j;
    if (!pp->mb_rows) {
        pp->mb_rows = (int64_t *)pdp__alloc((size_t)pp->mb * sizeof *pp->mb_rows);
        pp->mb_first = (int64_t *)pdp__alloc((size_t)pp->mb * sizeof *pp->mb_first);
        if (!pp->mb_rows || !pp->mb_first) return PDP_ERR_OUT_OF_MEMORY;
    }
    for (j = 0; j < pp->mb; j++) {
        pp->mb_rows[j] = rows / pp->mb + (j < rows % pp->mb);
        pp->mb_first[j] = j ? pp->mb_first[j - 1] + pp->mb_rows[j - 1] : 0;
    }
    return PDP_OK;
}

/* With v > 1 the chunks' models run and the stage model (pdp_pp_model, the caller's handle)
   does not: its user grad hook runs through this, with the stage model and the parameter's
   index in it, as on one chunk. */
PDP__PRIVATE void pdp__pp_chunk_hook(void *user, pdp_model *m, int param_index)
{
    const pdp__pp_chunk *ck = (const pdp__pp_chunk *)user;
    pdp_model *s = ck->stage_m;
    (void)m;
    if (s && s->hook) s->hook(s->hook_user, s, ck->param0 + param_index);
}

/* What the caller set on the stage model (model.h: pdp_model_set_training, _set_precision,
   _set_grad_hook stay allowed on a wrapped model) reaches the chunks that run it. */
PDP__PRIVATE void pdp__pp_sync_chunks(pdp_pp *pp)
{
    int c;
    if (pp->v == 1) return; /* the stage model is chunk 0's */
    for (c = 0; c < pp->v; c++) {
        pdp__pp_chunk *ck = &pp->ck[c];
        ck->stage_m = pp->m;
        ck->m->training = pp->m->training;
        ck->m->precision = pp->m->precision;
        ck->m->hook = pp->m->hook ? pdp__pp_chunk_hook : NULL;
        ck->m->hook_user = pp->m->hook ? ck : NULL;
    }
}

PDP_API pdp_status pdp_pp_forward_backward(pdp_pp *pp, const pdp_tensor *x,
                                           const int32_t *labels, float *loss)
{
    static const char *fn = "pdp_pp_forward_backward";
    pdp_comm_stats c0, c1;
    double t0, t1, busy = 0.0, loss_sum = 0.0;
    int64_t rows, held_bytes = 0, peak_bytes = 0, per_mb = 0;
    int k, in_flight = 0, peak = 0, last;
    pdp_status st = PDP_OK;
    const pdp_model *tail;
    if (!pp || !x || !loss) return pdp__err(PDP_ERR_INVALID, "%s: NULL argument", fn);
    *loss = 0.0f;
    last = pp->stage == pp->p - 1;
    if (last && !labels && !pp->desc.loss)
        return pdp__err(PDP_ERR_INVALID, "%s: labels is NULL on the last stage", fn);
    if (pp->dp_work)
        return pdp__err(PDP_ERR_STATE, "%s: rank %d: the last pass's gradients are still being "
                        "averaged; call pdp_pp_step or pdp_pp_finish first", fn, pp->c->rank);
    rows = x->shape[0];
    if (rows < pp->mb)
        return pdp__err(PDP_ERR_SHAPE, "%s: batch of %lld rows for %d micro-batches", fn,
                        (long long)rows, pp->mb);
    if (pp->stage == 0) {
        if (!x->data) return pdp__err(PDP_ERR_INVALID, "%s: x has no data on stage 0", fn);
        if (x->count != rows * pp->ck[0].in_count)
            return pdp__err(PDP_ERR_SHAPE, "%s: x has %lld floats per row, stage 0 takes %lld",
                            fn, (long long)(x->count / rows), (long long)pp->ck[0].in_count);
    }
    if (pdp__pp_cut(pp, rows) != PDP_OK)
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory", fn);
    pdp__pp_sync_chunks(pp);
    pp->counted = rows * pp->positions;
    tail = pp->ck[pp->v - 1].m; /* on the last stage: the last piece */
    if (last && labels && !pp->desc.loss &&
        (st = pdp__cross_entropy_count(labels, rows * pp->positions,
                                       tail->layers[tail->nlayers - 1].out_shape[
                                           tail->layers[tail->nlayers - 1].out_ndim - 1],
                                       &pp->counted, fn)) != PDP_OK)
        return pdp__err_wrap(st, "%s: rank %d (stage %d)", fn, pp->c->rank, pp->stage);
    if ((st = pdp__pp_reserve(pp, pp->mb_rows[0])) != PDP_OK)
        return pdp__err_wrap(st, "%s: rank %d: buffers for %lld rows", fn, pp->c->rank,
                             (long long)pp->mb_rows[0]);
    pp->sample_base = pp->dp ? (int64_t)pp->dp->rank * rows : 0;
    for (k = 0; k < pp->v; k++) { /* one micro-batch's activations on each chunk */
        pdp__pp_chunk *ck = &pp->ck[k];
        pdp__model_plan pl = pdp__model_plan_of(ck->m, NULL);
        ck->act_bytes = (pl.act + pl.saved + (ck->q > 0 ? ck->in_count : 0)) * pp->mb_rows[0] *
                        (int64_t)sizeof(float);
        per_mb += ck->act_bytes;
    }
    pp->messages = 0;
    pp->nbatch = 0;
    pdp_comm_get_stats(pp->c, &c0);
    if ((st = pdp_comm_barrier(pp->c, NULL)) != PDP_OK)
        return pdp__err_wrap(st, "%s: rank %d: the starting barrier", fn, pp->c->rank);
    t0 = pdp__now();
    if ((st = pdp__pp_issue(pp, -1)) != PDP_OK) { /* the first step's receives */
        pdp__pp_drain(pp);
        return pdp__err_wrap(st, "%s: rank %d (stage %d): the first receives", fn, pp->c->rank,
                             pp->stage);
    }
    for (k = 0; k < pp->nacts; k++) {
        const pdp__pp_action *a = &pp->acts[k];
        double a1;
        char name[24];
        if (pp->desc.schedule == PDP_PP_INTERLEAVED_1F1B)
            snprintf(name, sizeof name, "%c%dc%d", a->kind, a->mb, a->chunk);
        else
            snprintf(name, sizeof name, "%c%d", a->kind, a->mb);
        pp->t_compute = pdp__now();
        if (a->kind == 'F') {
            st = pdp__pp_forward(pp, x, k);
            in_flight++;
            held_bytes += pp->ck[a->chunk].act_bytes;
            peak = PDP__MAX(peak, in_flight);
            peak_bytes = PDP__MAX(peak_bytes, held_bytes);
        } else {
            st = pdp__pp_backward(pp, x, labels, k, &loss_sum);
            in_flight--;
            held_bytes -= pp->ck[a->chunk].act_bytes;
        }
        a1 = pdp__now();
        if (st != PDP_OK) {
            st = pdp__err_wrap(st, "%s: rank %d (stage %d): %s", fn, pp->c->rank, pp->stage,
                               name);
            break;
        }
        /* compute only: the time spent waiting for this action's message is idle */
        busy += a1 - pp->t_compute;
        if (pp->trace_tid) {
            char args[80];
            snprintf(args, sizeof args, "\"micro_batch\":%d,\"chunk\":%d,\"rows\":%lld", a->mb,
                     a->chunk, (long long)pp->mb_rows[a->mb]);
            pdp__trace_complete(pp->trace_pid, pp->trace_tid, "compute", name, pp->t_compute, a1,
                                args);
        }
    }
    if (st != PDP_OK) {
        pdp__pp_drain(pp);
        return st;
    }
    for (k = 0; k < pp->v; k++) {
        pdp__pp_chunk *ck = &pp->ck[k];
        int i;
        pdp_status s2;
        for (i = 0; i < ck->nslots; i++)
            if ((s2 = pdp__pp_wait(&ck->send_fwd[i])) != PDP_OK && st == PDP_OK) st = s2;
        for (i = 0; i < 2; i++)
            if ((s2 = pdp__pp_wait(&ck->send_bwd[i])) != PDP_OK && st == PDP_OK) st = s2;
    }
    if (st != PDP_OK)
        return pdp__err_wrap(st, "%s: rank %d: a send of this pass", fn, pp->c->rank);
    if ((st = pdp_comm_barrier(pp->c, NULL)) != PDP_OK)
        return pdp__err_wrap(st, "%s: rank %d: the closing barrier", fn, pp->c->rank);
    t1 = pdp__now();
    pdp__pp_fold_tp_stats(pp);
    if ((st = pdp__pp_sum_tied(pp)) != PDP_OK)
        return pdp__err_wrap(st, "%s: rank %d (stage %d): the tied weight's gradients", fn,
                             pp->c->rank, pp->stage);
    if (pp->dp && pp->m->param_count) {
        pdp_comm_stats d0, d1;
        pdp_comm_get_stats(pp->dp, &d0);
        if ((st = pdp_comm_allreduce(pp->dp, pp->m->grad_block, pp->m->param_count,
                                     PDP_REDUCE_AVG, &pp->dp_work)) != PDP_OK)
            return pdp__err_wrap(st, "%s: rank %d: averaging the gradients over dp", fn,
                                 pp->c->rank);
        pdp_comm_get_stats(pp->dp, &d1);
        pp->dp_sent += d1.bytes_sent - d0.bytes_sent;
    }
    pdp_comm_get_stats(pp->c, &c1);
    /* the single-device run's step: its forward counts training passes only (model.c), and
       the next training pass's dropout keys are that count's */
    if (pp->m->training) pp->steps++;
    pp->stats.steps++;
    pp->stats.step_s = t1 - t0;
    pp->stats.compute_s = busy;
    pp->stats.bubble = t1 > t0 ? PDP__MAX(0.0, 1.0 - busy / (t1 - t0)) : 0.0;
    pp->stats.peak_in_flight = peak;
    pp->stats.activation_bytes = per_mb;
    pp->stats.peak_activation_bytes = peak_bytes;
    pp->stats.bytes_sent = c1.bytes_sent - c0.bytes_sent;
    pp->stats.messages = pp->messages;
    pp->stats.total_step_s += t1 - t0;
    pp->stats.total_compute_s += busy;
    if (last) *loss = pp->counted > 0 ? (float)(loss_sum / (double)pp->counted) : 0.0f;
    return PDP_OK;
}

PDP_API pdp_status pdp_pp_finish(pdp_pp *pp)
{
    pdp_status st;
    if (!pp) return pdp__err(PDP_ERR_INVALID, "pdp_pp_finish: pp is NULL");
    if (!pp->dp_work) return PDP_OK;
    if ((st = pdp__pp_wait(&pp->dp_work)) != PDP_OK)
        return pdp__err_wrap(st, "pdp_pp_finish: rank %d: averaging the gradients over dp",
                             pp->c->rank);
    return PDP_OK;
}

/* The gradients' global norm: each stage's sum of squares, a double, travels bit for bit
   (its 8 bytes as two floats of an all-gather, on the model's device for NCCL) and every
   stage adds the p sums in stage order, so all stages hold the same double and scale by
   the same coefficient (or all fail alike). */
PDP_API pdp_status pdp_pp_clip_grad_norm(pdp_pp *pp, float max_norm, float *total_norm)
{
    static const char *fn = "pdp_pp_clip_grad_norm";
    pdp_model *m;
    double mine = 0.0, sum = 0.0, part, norm;
    int64_t skip0, skip1;
    char who[96];
    float coef;
    size_t gathered;
    pdp_status st;
    int s;
    if (total_norm) *total_norm = 0.0f;
    if (!pp) return pdp__err(PDP_ERR_INVALID, "%s: pp is NULL", fn);
    snprintf(who, sizeof who, "%s: rank %d (stage %d)", fn, pp->c->rank, pp->stage);
    if ((st = pdp__check_max_norm(max_norm, who)) != PDP_OK) return st;
    m = pp->m;
    if ((st = pdp_pp_finish(pp)) != PDP_OK) return pdp__err_wrap(st, "%s", fn);
    /* a weight tied across stages counts once: on the stage that owns it (its copy is the
       other stage's parameter tied_param, the last of its chunk: the stage's last but with
       a tie into a middle chunk); PP x TP: the stage's TP slices on every TP rank and its
       replicated tensors once, summed over the TP group (as pdp_clip_grad_norm does) */
    skip0 = skip1 = m->param_count;
    if (pp->tied_copy) {
        skip0 = m->params[pp->tied_param].offset;
        skip1 = skip0 + m->params[pp->tied_param].count;
    }
    if ((st = pdp__grad_sumsq_range(m, m->grad_block, 0, skip0, &mine, fn)) != PDP_OK ||
        (st = pdp__grad_sumsq_range(m, m->grad_block + skip1, skip1, m->param_count, &mine,
                                    fn)) != PDP_OK ||
        (m->tp.comm && m->tp.size > 1 &&
         (st = pdp__grad_allreduce_sum(m->tp.comm, &m->tp.scalar, m->tp.dscalar, &mine)) !=
             PDP_OK))
        return pdp__err_wrap(st, "%s: rank %d (stage %d)", fn, pp->c->rank, pp->stage);
    memcpy(pp->norm_host, &mine, sizeof mine);
    gathered = (size_t)(2 * pp->p) * sizeof(float);
    if (pp->norm_dev) {
        float *recv = pp->norm_dev + 2;
        if ((st = pdp__dev_copy(m->device, pp->norm_dev, pdp_cpu(), pp->norm_host,
                                sizeof mine)) == PDP_OK &&
            (st = pdp_comm_allgather(pp->c, pp->norm_dev, recv, 2, NULL)) == PDP_OK)
            st = pdp__dev_copy(pdp_cpu(), pp->norm_host + 2, m->device, recv, gathered);
    } else {
        st = pdp_comm_allgather(pp->c, pp->norm_host, pp->norm_host + 2, 2, NULL);
    }
    if (st != PDP_OK)
        return pdp__err_wrap(st, "%s: rank %d (stage %d): gathering the stages' squared norms",
                             fn, pp->c->rank, pp->stage);
    for (s = 0; s < pp->p; s++) {
        memcpy(&part, pp->norm_host + 2 + 2 * s, sizeof part);
        sum += part;
    }
    norm = sqrt(sum);
    if (total_norm) *total_norm = (float)norm;
    if (!isfinite(norm))
        return pdp__err(PDP_ERR_NUMERIC, "%s: rank %d (stage %d): the gradient norm over the %d "
                        "stages is %g", fn, pp->c->rank, pp->stage, pp->p, norm);
    coef = pdp__clip_coef(max_norm, norm);
    if (coef >= 1.0f) return PDP_OK;
    if ((st = pdp__grad_scale(m, m->grad_block, m->param_count, coef, fn)) != PDP_OK)
        return pdp__err_wrap(st, "%s: rank %d (stage %d)", fn, pp->c->rank, pp->stage);
    return PDP_OK;
}

PDP_API pdp_status pdp_pp_step(pdp_pp *pp, pdp_optim *opt)
{
    pdp_status st;
    if (!pp || !opt) return pdp__err(PDP_ERR_INVALID, "pdp_pp_step: %s is NULL", pp ? "opt" : "pp");
    /* an optimizer of the full model (or of another stage) would train something else and
       leave this stage as it is */
    if (opt->model != pp->m || opt->shard)
        return pdp__err(PDP_ERR_INVALID, "pdp_pp_step: rank %d (stage %d): the optimizer was "
                        "not created on this stage's model; create it with pdp_optim_create("
                        "&opt, pdp_pp_model(pp), &desc)", pp->c->rank, pp->stage);
    if ((st = pdp_pp_finish(pp)) != PDP_OK) return pdp__err_wrap(st, "pdp_pp_step");
    if ((st = pdp_optim_step(opt)) != PDP_OK)
        return pdp__err_wrap(st, "pdp_pp_step: rank %d", pp->c->rank);
    pdp_model_zero_grad(pp->m);
    return PDP_OK;
}

/* ---- pp: checkpoints of the full model ----
   Piece q holds the full model's parameters [off(q), off(q + 1)) in the full block's order
   (a piece is a contiguous run of layers, so of registered parameters), then a tied weight's
   copy, which equals its owner's and is not written; a stage holds its chunks' runs one after
   the other (chunk c's at ck[c].off). Save: every stage sends each chunk's run (and each
   optimizer state's) to stage 0, which writes the full model's file through a staging model;
   load: every stage reads the file into its own staging model and keeps its runs (and the
   copy from its owner's tensor). */

/* The offset in the full block of piece q's first parameter (q = pieces: the count). */
PDP__PRIVATE int64_t pdp__pp_full_offset(const pdp_pp *pp, int q)
{
    const pdp_model *f = pp->layout;
    int i = q < pp->pieces ? f->layers[pp->first[q]].param_first : f->nparams;
    return i < f->nparams ? f->params[i].offset : f->param_count;
}

/* The checks of both calls: o this stage's full optimizer (or NULL). */
PDP__PRIVATE pdp_status pdp__pp_ckpt_args(const pdp_pp *pp, const pdp_optim *o, const char *path,
                                          const char *fn)
{
    if (!pp || !path) return pdp__err(PDP_ERR_INVALID, "%s: NULL argument", fn);
    if (o && (o->model != pp->m || !pdp__optim_is_full(o)))
        return pdp__err(PDP_ERR_INVALID, "%s: rank %d (stage %d): the optimizer is not this "
                        "stage's (pdp_optim_create(&opt, pdp_pp_model(pp), &desc))", fn,
                        pp->c->rank, pp->stage);
    if (pp->dp_work)
        return pdp__err(PDP_ERR_STATE, "%s: rank %d: call pdp_pp_step or pdp_pp_finish first", fn,
                        pp->c->rank);
    if (pp->m->tp.comm)
        return pdp__err(PDP_ERR_UNSUPPORTED, "%s: rank %d: the stages hold tensor-parallel "
                        "slices; checkpoints of PP x TP are not supported yet", fn, pp->c->rank);
    return PDP_OK;
}

/* The staging full model (and optimizer, with o) of a save or a load. */
PDP__PRIVATE pdp_status pdp__pp_staging(const pdp_pp *pp, const pdp_optim *o, pdp_model **full,
                                        pdp_optim **fo)
{
    pdp_status st;
    *fo = NULL;
    if ((st = pdp__model_layout(pp->layout, true, full)) != PDP_OK) return st;
    (*full)->step = pp->steps;
    if (o && (st = pdp_optim_create(fo, *full, &o->desc)) != PDP_OK) return st;
    if (o) (*fo)->steps = o->steps;
    return PDP_OK;
}

PDP_API pdp_status pdp_pp_checkpoint_save(pdp_pp *pp, const pdp_optim *o, const char *path)
{
    static const char *fn = "pdp_pp_checkpoint_save";
    pdp_model *full = NULL;
    pdp_optim *fo = NULL;
    pdp_status st, mine = PDP_OK;
    int k, s, q, nbuf;
    if ((st = pdp__pp_ckpt_args(pp, o, path, fn)) != PDP_OK) return st;
    nbuf = 1 + (o ? o->nstate : 0); /* the parameters, then each optimizer state */
    if (pp->stage == 0) mine = pdp__pp_staging(pp, o, &full, &fo);
    if ((st = pdp__comm_agree(pp->c, mine, fn)) != PDP_OK) goto out;
    for (k = 0; k < nbuf; k++) {
        const float *src = k == 0 ? pp->m->param_block : o->state[k - 1];
        pdp_work *w = NULL;
        int c;
        for (c = 0; pp->stage > 0 && c < pp->v; c++) { /* each chunk's run, tag k v + c */
            const pdp__pp_chunk *ck = &pp->ck[c];
            int64_t n = pdp__pp_full_offset(pp, ck->q + 1) - pdp__pp_full_offset(pp, ck->q);
            if ((st = pdp_comm_send(pp->c, src + ck->off, n, 0, k * pp->v + c, &w)) != PDP_OK ||
                (st = pdp__pp_wait(&w)) != PDP_OK)
                goto out;
        }
        if (pp->stage > 0) continue;
        for (q = 0; q < pp->pieces; q++) { /* stage 0 gathers every piece's run, in order */
            float *dst = (k == 0 ? full->param_block : fo->state[k - 1]);
            int64_t off = pdp__pp_full_offset(pp, q);
            int64_t n = pdp__pp_full_offset(pp, q + 1) - off;
            s = q % pp->p, c = q / pp->p;
            st = s == 0 ? pdp__dev_copy(pp->m->device, dst + off, pp->m->device,
                                        src + pp->ck[c].off, (size_t)n * sizeof(float))
                        : pdp_comm_recv(pp->c, dst + off, n, s, k * pp->v + c, &w);
            if (st == PDP_OK && s > 0) st = pdp__pp_wait(&w);
            if (st != PDP_OK) goto out;
        }
    }
    mine = pp->stage == 0 ? pdp_checkpoint_save(path, full, fo) : PDP_OK;
    st = pdp__comm_agree(pp->c, mine, fn);
out:
    pdp_optim_free(fo);
    pdp_model_free(full);
    if (st != PDP_OK && strncmp(pdp_last_error(), fn, strlen(fn)) != 0)
        return pdp__err_wrap(st, "%s: rank %d (stage %d): %s", fn, pp->c->rank, pp->stage, path);
    return st;
}

PDP_API pdp_status pdp_pp_checkpoint_load(pdp_pp *pp, pdp_optim *o, const char *path)
{
    static const char *fn = "pdp_pp_checkpoint_load";
    pdp_model *full = NULL;
    pdp_optim *fo = NULL;
    pdp_status st, mine;
    int64_t off, n;
    int k;
    if ((st = pdp__pp_ckpt_args(pp, o, path, fn)) != PDP_OK) return st;
    if ((mine = pdp__pp_staging(pp, o, &full, &fo)) == PDP_OK)
        mine = pdp_checkpoint_load(path, full, fo);
    /* every stage learns whether any failed before anything is changed */
    if ((st = pdp__comm_agree(pp->c, mine, fn)) != PDP_OK) goto out;
    for (k = 0; k < 1 + (o ? o->nstate : 0) && st == PDP_OK; k++) {
        float *dst = k == 0 ? pp->m->param_block : o->state[k - 1];
        const float *src = k == 0 ? full->param_block : fo->state[k - 1];
        int c;
        for (c = 0; c < pp->v && st == PDP_OK; c++) { /* each chunk's run */
            const pdp__pp_chunk *ck = &pp->ck[c];
            off = pdp__pp_full_offset(pp, ck->q);
            n = pdp__pp_full_offset(pp, ck->q + 1) - off;
            st = pdp__dev_copy(pp->m->device, dst + ck->off, pp->m->device, src + off,
                               (size_t)n * sizeof(float));
        }
        if (st == PDP_OK && pp->tied_copy) { /* the head's copy of a tied weight: its owner's */
            const pdp__param_entry *copy = &pp->m->params[pp->tied_param];
            pdp_param owner;
            if ((st = pdp_model_find_param(full, copy->name, &owner)) == PDP_OK)
                st = pdp__dev_copy(pp->m->device, dst + copy->offset, pp->m->device,
                                   src + owner.offset, (size_t)copy->count * sizeof(float));
        }
    }
    if (st == PDP_OK && o) {
        o->desc = fo->desc;
        o->steps = fo->steps;
    }
    if (st == PDP_OK) pp->steps = pp->m->step = full->step;
out:
    pdp_optim_free(fo);
    pdp_model_free(full);
    if (st != PDP_OK && strncmp(pdp_last_error(), fn, strlen(fn)) != 0)
        return pdp__err_wrap(st, "%s: rank %d (stage %d): %s", fn, pp->c->rank, pp->stage, path);
    return st;
}

/* ---- pp: queries ---- */

PDP_API pdp_model *pdp_pp_model(const pdp_pp *pp) { return pp ? pp->m : NULL; }
PDP_API int pdp_pp_stage(const pdp_pp *pp) { return pp ? pp->stage : 0; }
PDP_API int pdp_pp_num_stages(const pdp_pp *pp) { return pp ? pp->p : 0; }

PDP_API pdp_status pdp_pp_stage_layers(const pdp_pp *pp, int s, int *first, int *last)
{
    if (!pp || !first || !last)
        return pdp__err(PDP_ERR_INVALID, "pdp_pp_stage_layers: NULL argument");
    if (s < 0 || s >= pp->p)
        return pdp__err(PDP_ERR_INVALID, "pdp_pp_stage_layers: stage %d outside 0..%d", s,
                        pp->p - 1);
    if (pp->v > 1)
        return pdp__err(PDP_ERR_INVALID, "pdp_pp_stage_layers: stage %d holds %d chunks, not one "
                        "range of layers: ask pdp_pp_chunk_layers", s, pp->v);
    *first = pp->first[s];
    *last = pp->first[s + 1];
    return PDP_OK;
}

PDP_API pdp_status pdp_pp_chunk_layers(const pdp_pp *pp, int s, int c, int *first, int *last)
{
    if (!pp || !first || !last)
        return pdp__err(PDP_ERR_INVALID, "pdp_pp_chunk_layers: NULL argument");
    if (s < 0 || s >= pp->p || c < 0 || c >= pp->v)
        return pdp__err(PDP_ERR_INVALID, "pdp_pp_chunk_layers: stage %d, chunk %d outside 0..%d, "
                        "0..%d", s, c, pp->p - 1, pp->v - 1);
    *first = pp->first[c * pp->p + s];
    *last = pp->first[c * pp->p + s + 1];
    return PDP_OK;
}

PDP_API void pdp_pp_get_stats(const pdp_pp *pp, pdp_pp_stats *out)
{
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (!pp) return;
    *out = pp->stats;
    out->stage = pp->stage;
    out->stages = pp->p;
    out->micro_batches = pp->mb;
    out->chunks = pp->v;
    out->schedule = pp->desc.schedule;
}

PDP_API int pdp_pp_stats_format(const pdp_pp_stats *s, char *buf, size_t bytes)
{
    double bubble, act;
    int hold, v;
    if (!s) return 0;
    bubble = s->total_step_s > 0.0 ? 1.0 - s->total_compute_s / s->total_step_s : 0.0;
    act = (double)s->activation_bytes / 1e6;
    if (s->schedule == PDP_PP_INTERLEAVED_1F1B) {
        v = PDP__MAX(s->chunks, 1);
        return snprintf(buf, bytes, "stage %d: compute %.2f s  bubble %.2f (pdp's (p-1)/(v*m+p-1)"
                        " = %.2f, margin 0.10: %s; Megatron's (p-1)/(v*m) = %.2f)  peak "
                        "activations %d micro-batch chunk%s = %.2f MB  messages %lld a pass "
                        "(m(2v-[s=0]-[s=p-1]) = %d)\n", s->stage, s->total_compute_s, bubble,
                        s->bubble_theory, fabs(bubble - s->bubble_theory) <= 0.10 ? "met"
                                                                                  : "missed",
                        s->bubble_megatron, s->peak_in_flight, s->peak_in_flight == 1 ? "" : "s",
                        (double)s->peak_activation_bytes / 1e6, (long long)s->messages,
                        s->micro_batches * (2 * v - (s->stage == 0) - (s->stage == s->stages - 1)));
    }
    hold = PDP__MIN(s->stages - s->stage, s->micro_batches); /* 1F1B's min(p - s, m) */
    return snprintf(buf, bytes, "stage %d: compute %.2f s  bubble %.2f (formula (p-1)/(m+p-1) = "
                    "%.2f, margin 0.10: %s)  peak activations %d micro-batch%s = %.2f MB  (%s: "
                    "1F1B min(p-s, m) = %d = %.2f MB, GPipe m = %d = %.2f MB)\n", s->stage,
                    s->total_compute_s, bubble, s->bubble_theory,
                    fabs(bubble - s->bubble_theory) <= 0.10 ? "met" : "missed",
                    s->peak_in_flight, s->peak_in_flight == 1 ? "" : "es",
                    (double)s->peak_activation_bytes / 1e6,
                    s->schedule == PDP_PP_GPIPE ? "gpipe" : "1f1b", hold, hold * act,
                    s->micro_batches, s->micro_batches * act);
}

PDP_API pdp_status pdp_pp_report(const pdp_pp *pp, char *buf, size_t bytes)
{
    const char *fn = "pdp_pp_report";
    const pdp_pp_stats *s;
    const pdp__pp_chunk *ck;
    int64_t msgs, act, tied;
    int c, n;
    if (!pp || !buf) return pdp__err(PDP_ERR_INVALID, "%s: NULL argument", fn);
    if (!pp->stats.steps)
        return pdp__err(PDP_ERR_STATE, "%s: rank %d (stage %d): no pass yet", fn, pp->c->rank,
                        pp->stage);
    s = &pp->stats, ck = &pp->ck[0];
    msgs = (int64_t)pp->mb * (2 * pp->v - (pp->stage == 0) - (pp->stage == pp->p - 1));
    /* b T C 4: the first micro-batch's rows times the floats a sample sends across a
       boundary (chunk 0's output, or its input when it is the last piece) */
    act = pp->mb_rows[0] * (ck->q < pp->pieces - 1 ? ck->out_count : ck->in_count) * 4;
    tied = pp->tied_param >= 0 ? pp->m->params[pp->tied_param].count * 4 : 0;
    n = snprintf(buf, bytes, "PP stage %d of %d: layers", pp->stage, pp->p);
    for (c = 0; c < pp->v && n >= 0 && (size_t)n < bytes; c++)
        n += snprintf(buf + n, bytes - (size_t)n, " %d..%d", pp->first[c * pp->p + pp->stage],
                      pp->first[c * pp->p + pp->stage + 1] - 1);
    if (n >= 0 && (size_t)n < bytes)
        n += snprintf(buf + n, bytes - (size_t)n, ", activations %.2f MB (peak)\n  sent a step: "
                      "%lld bytes in %lld messages (m (2v - [s=0] - [s=p-1]) = %lld, x b T C 4 "
                      "+ V C 4 tied = %lld)\n  bubble %.3f measured over %lld steps; pdp's "
                      "(p-1)/(v m+p-1) = %.3f, Megatron's (p-1)/(v m) = %.3f\n",
                      (double)s->peak_activation_bytes / 1e6, (long long)s->bytes_sent,
                      (long long)s->messages, (long long)msgs, (long long)(msgs * act + tied),
                      1.0 - s->total_compute_s / s->total_step_s, (long long)s->steps,
                      s->bubble_theory, s->bubble_megatron);
    if (n < 0 || (size_t)n >= bytes)
        return pdp__err(PDP_ERR_INVALID, "%s: %zu bytes do not hold the report", fn, bytes);
    return PDP_OK;
}

PDP_API pdp_status pdp_pp_rank_report(const pdp_pp *pp, const pdp_optim *o, char *buf,
                                      size_t bytes)
{
    const char *fn = "pdp_pp_rank_report";
    const pdp_model *m;
    pdp_tp_stats ts;
    double P, t, d, tp_formula, tp_floats = 0; /* what f and g all-reduce, a sample */
    int64_t steps, dp_sent;
    int i, R = 0, g_runs, n;
    pdp_status st;
    if (!pp || !o || !buf)
        return pdp__err(PDP_ERR_INVALID, "%s: %s is NULL", fn, !pp ? "pp" : !o ? "o" : "buf");
    if (!(steps = pp->stats.steps))
        return pdp__err(PDP_ERR_STATE, "%s: rank %d (stage %d): no pass yet", fn, pp->c->rank,
                        pp->stage);
    if (o->model != pp->m)
        return pdp__err(PDP_ERR_INVALID, "%s: rank %d (stage %d): the optimizer is not of this "
                        "stage's model (pdp_pp_model)", fn, pp->c->rank, pp->stage);
    m = pp->m;
    g_runs = m->recompute == PDP_RECOMPUTE_FULL ? 2 : 1; /* FULL runs each region's g again */
    for (i = 0; i < m->nlayers; i++) {
        const pdp__layer *l = &m->layers[i];
        if (l->kind == PDP__SEQ_GATHER || l->kind == PDP__SEQ_REDUCE_SCATTER)
            return pdp__err(PDP_ERR_UNSUPPORTED, "%s: rank %d (stage %d): a sequence-parallel "
                            "stage (its TP bytes: pdp_gpt_tp_report's formula, whole model)", fn,
                            pp->c->rank, pp->stage);
        R += l->kind == PDP__TP_COPY; /* a region: f's backward all-reduces its input's */
        if (l->kind == PDP__TP_COPY) tp_floats += (double)l->in_count;
        if (l->kind == PDP__TP_REDUCE) tp_floats += g_runs * (double)l->out_count; /* g's */
    }
    pdp_tp_get_stats(m, &ts); /* every pass sends the same: the totals over the passes */
    dp_sent = pp->dp_sent / steps;
    P = (double)m->param_count;
    t = m->tp.comm ? m->tp.size : 1, d = pp->dp ? pp->dp->size : 1;
    tp_formula = 2.0 * (t - 1) / t * (double)pp->mb * (double)pp->mb_rows[0] * 4 * tp_floats;
    n = snprintf(buf, bytes, "  memory, MB: parameters %.2f  gradients %.2f  %s state %.2f\n  "
                 "sent a step, bytes: TP %lld (2(t-1)/t x %d m R b T C 4 = %.0f, R = %d TP "
                 "regions)\n    DP %lld (2(d-1)/d x 4 params = %.0f)\n  ", 4 * P / 1e6,
                 4 * P / 1e6, pdp_optim_kind_name(o->desc.kind),
                 4.0 * o->nstate * (double)(o->hi - o->lo) / 1e6, /* its state, allocated */
                 (long long)(ts.bytes_sent / steps), 1 + g_runs, tp_formula, R,
                 (long long)dp_sent, 2.0 * (d - 1) / d * 4 * P);
    if (n < 0 || (size_t)n >= bytes)
        return pdp__err(PDP_ERR_INVALID, "%s: %zu bytes do not hold the report", fn, bytes);
    st = pdp_pp_report(pp, buf + n, bytes - (size_t)n); /* its lines after ours */
    return st == PDP_OK ? st : pdp__err_wrap(st, "%s", fn);
}
