/* zero: the sharded executor, ZeRO stages 1-3 on reducer.c's bucket reducer
   with a reduce-scatter as its collective (the layout, the formulas and the
   reasons are in zero.h).

   Invariants: the units are the reducer's buckets (planned with whole_layers,
   so a layer's weight and bias share a unit and one pointer per layer places
   both); unit u's slice of rank r is elements [r s_u, r s_u + mine_u) of the
   unit (mine_u <= s_u real elements, the rest padding that stays zero in every
   buffer); shard offsets follow the flat block's order. The model's layers read
   their gradients (and at stage 3 their parameters) through m->layer_dw
   (m->layer_w), which this module sets: stage 1 once, stages 2-3 when a unit's
   backward starts (a gradient bucket buffer, taken round-robin: unit u uses
   buffer u mod grad_buffers, after the reduce-scatter of the unit that held it
   has completed and its slice was added to the shard), stage 3 also when its
   parameters are gathered (a gather slot, least recently used first, never the
   unit being computed). Nothing is allocated after construction: the buffers
   are fixed, the handles come from the backends' pools.

   Tied parameters (a GPT's head uses the Embedding's wte: model.c's PDP__LAYER_TIED).
   A tied layer computes with its owner's unit: unit_of_layer maps it there, and the
   model's events fire for it as for a layer of that unit, so stage 3 gathers the unit
   for it in forward and in backward (again, if the unit left its gather slot since),
   and stages 2-3 give the unit its gradient buffer at the tied layer's backward. A
   unit that a tied layer's backward reaches before its own layers' ("pinned": the
   head's contribution comes first, the embedding's last) keeps that buffer until the
   unit's reduce-scatter, which the reducer launches only once every parameter of the
   unit reported, after the owner's backward (model.c fires the grad hook for a
   parameter after its own layer only): the two contributions are summed in the
   buffer and reduced once. So a pinned unit owns a buffer of its own (the last ones)
   and the other units share the rest round-robin (gslot).

   FULL activation recomputation (model.h). Backward runs a residual region's forward
   again, from its kept input, just before the backward of its ResidualAdd, and model.c
   fires RECOMPUTE_LAYER before each of the region's layers with parameters. Stage 3
   gathers the layer's unit for it as for a forward, and its prefetch follows the
   backward pass's own order of needs, recompute included (next_bwd, next_rec: the layer
   before a region in backward prefetches the unit the recompute needs first). Of the
   parameters, what is resident during a recomputed block's backward is what stage 3
   ever holds: this rank's shard and the param_buffers gather slots (N s_max floats
   each), no more. The region's units stay in their slots from the recompute through the
   region's backward when param_buffers holds them all: then the backward's gathers are
   the recompute's, as many as without recomputation (and pdp__zero_formula holds). With
   fewer slots the recompute pushes the region's first units out and the backward
   gathers them again: more traffic, not in the formula, and the same memory. Stages 1-2
   hold every parameter and do nothing here. Tested equal to one device at stages 1-3
   with dropout, and the all-gathers counted (tests/test_gpt.c, tests/test_gpt_sp.c).

   Devices. Every buffer lives on the model's device and is moved with
   cuda_host.c's pdp__dev_* helpers (memcpy, memset and += on the CPU; copies and
   kernels on a CUDA device's compute stream), so one code path serves CPU models
   (local, MPI) and CUDA models (NCCL). The ordering between the compute stream
   and the NCCL stream is the backend's: a collective's launch waits for the work
   already queued on the compute stream (a slice copied into a gather slot, a
   layer still reading the slot being refilled), and its wait makes the compute
   stream wait for it (a buffer added to the shard, cleared or read by a layer).

   Tensor parallelism (DP x TP: pdp_zero_create on the DP group of a model built on a
   TP group, tp.h). Nothing here knows of TP: a TP rank's model is an ordinary model
   whose flat block holds its own slices (the column- and row-parallel weights, its
   heads' q, k and v) and the replicated tensors (LayerNorms, the row-parallel bias,
   the embeddings), and the ranks of one DP group hold the same slices. So each DP
   group shards its TP rank's block as any block: units of whole layers, and DP rank d
   owns slice d of every unit; the world's ranks (d, t) together hold each TP slice
   once per TP rank t and each replicated tensor once per TP rank (TP size copies, as
   Megatron's distributed optimizer). Under sequence parallelism a LayerNorm's weight
   and bias gradients are computed on a rank's positions only; layers_tp.c sums them
   over TP inside the LayerNorm's backward, into the buffer m->layer_dw points at (the
   unit's, or at stages 2-3 the bucket buffer it holds), before the grad hook fires,
   so the reduce-scatter over DP averages the full sequence's gradient, the same on
   every TP rank. Stage 3's all-gathers run over the DP group only, between the TP
   group's activation collectives, in the same order on every rank. Clipping counts the
   slices over TP (pdp_zero_clip_grad_norm). Tested equal to one device at stages 1-3,
   DP 2 x TP 2: the GPT with sequence parallelism under each recomputation mode
   (tests/test_gpt_sp.c) and Megatron's MLP blocks (tests/test_tp.c).

   The checkpoints of this executor are zero_ckpt.c's. */

#include "internal.h"

typedef struct pdp__zero_unit {
    int64_t off, count;  /* the unit's range of the flat block */
    int64_t s;           /* slice floats per rank, a multiple of 16 */
    int64_t shard_off;   /* this rank's slice in its shard (and optimizer state) */
    int64_t mine;        /* real elements of this rank's slice */
    int first_layer, last_layer;
    float *gbuf;         /* N s floats: stage 1 its own; stages 2-3 a held bucket buffer */
    int pslot;           /* stage 3: the gather slot holding its parameters, or -1 */
} pdp__zero_unit;

typedef struct pdp__zero_pslot {
    float *buf;          /* N s_max floats */
    int unit;            /* -1: free */
    pdp_work *work;      /* its all-gather, until waited */
    uint64_t used;       /* LRU stamp */
    double t_launch;
} pdp__zero_pslot;

struct pdp_zero {
    pdp__reducer r;      /* first: the reducer's user pointer is the executor */
    pdp_zero_desc desc;
    pdp_model *m;
    pdp_comm *c;
    int stage, rank, size, nunits;
    pdp__zero_unit *units;
    int *unit_of_layer;  /* the unit whose parameters layer l computes with (a tied layer:
                            its owner's); -1 for layers without parameters */
    int *next_fwd, *next_bwd, *next_rec; /* per layer: the next other unit forward
                                 (backward, FULL recomputation's forward inside backward)
                                 needs after it, -1 for none (stage 3's prefetch) */
    int *gslot;          /* stages 2-3: per unit, its gradient bucket buffer */
    int64_t pinned_s;    /* slice floats per rank of the pinned units (pdp__zero_pinned):
                            stage 3's byte formula */
    int64_t shard_count, padded_count, smax;
    float *grad_all;     /* stage 1: every unit's padded gradient buffer */
    float *grad_shard;   /* stages 2-3 */
    float *param_shard;  /* stage 3 */
    float *staging;      /* stages 1-2: the after-step all-gather */
    float **gbufs;       /* stages 2-3: grad_buffers bucket buffers */
    int *gbuf_unit;      /* the unit holding each, or -1 */
    pdp__zero_pslot *pslots;
    uint64_t clock;
    int trace_gather;    /* the all-gathers' trace lane ("allgather <comm name>"), 0: off */
    float **layer_w, **layer_dw;
    float scalar;        /* clipping's all-reduced squared norm */
    float *dscalar;      /* its copy on the model's device (the collective's buffer) */
    pdp_device dev;      /* the model's: every buffer below lives there */
    bool no_sync;
    bool sharded;        /* the model's blocks were handed over (free gives them back) */
    pdp_status deferred; /* a failure inside a no_sync backward (stages 2-3) */
    char deferred_msg[768];
    int64_t buffer_bytes, bytes_at_step, gathers, gathers_at_step;
    int64_t passes;      /* backward passes since the last step (k of the byte formula) */
    pdp_zero_stats stats;
    uint64_t saves;      /* checkpoint saves begun: one input of each save's run id */
};

PDP__PRIVATE int64_t pdp__zero_align(int64_t n) { return (n + 15) & ~(int64_t)15; }

/* "unit 1 of 3 (layers 2..4)" */
PDP__PRIVATE void pdp__zero_unit_name(const pdp_zero *z, int u, char *out, size_t cap)
{
    snprintf(out, cap, "unit %d of %d (layers %d..%d)", u, z->nunits, z->units[u].first_layer,
             z->units[u].last_layer);
}

/* Points unit u's layers' gradients (dw) or parameters (w) at buf, the unit's padded copy. */
PDP__PRIVATE void pdp__zero_point(pdp_zero *z, int u, float **ptrs, float *buf)
{
    const pdp__zero_unit *k = &z->units[u];
    int l;
    for (l = k->first_layer; l <= k->last_layer; l++) {
        const pdp__layer *ly = &z->m->layers[l];
        if (ly->nparams) ptrs[l] = buf + (z->m->params[ly->param_first].offset - k->off);
    }
}

/* ---- zero: gradient buffers (stages 2-3) ---- */

/* Keeps the first failure of a step's device work that no caller can return
   (a bucket's completion, a no_sync backward): the next finish reports it. */
PDP__PRIVATE void pdp__zero_defer(pdp_zero *z, pdp_status st, const char *what, int u)
{
    char name[96];
    if (z->deferred != PDP_OK) return;
    pdp__zero_unit_name(z, u, name, sizeof name);
    z->deferred = st;
    snprintf(z->deferred_msg, sizeof z->deferred_msg, "rank %d: %s %s: %.600s", z->rank, what,
             name, pdp_last_error());
}

/* Releases unit u's bucket buffer after its reduce-scatter: its slice into the shard. */
PDP__PRIVATE void pdp__zero_bucket_done(pdp__reducer *r, int b)
{
    pdp_zero *z = (pdp_zero *)r->desc.user;
    pdp__zero_unit *k = &z->units[b];
    pdp_status st;
    int i;
    if (z->stage == 1 || !k->gbuf) return;
    if ((st = pdp__dev_add(z->dev, z->grad_shard + k->shard_off,
                           k->gbuf + (int64_t)z->rank * k->s, k->mine)) != PDP_OK)
        pdp__zero_defer(z, st, "adding the slice of", b);
    for (i = 0; i < z->desc.grad_buffers; i++)
        if (z->gbuf_unit[i] == b) z->gbuf_unit[i] = -1;
    k->gbuf = NULL;
}

/* Gives unit u a zeroed bucket buffer (gslot[u]), waiting for the reduce-scatter of the
   unit that held it (bucket_done then frees it). */
PDP__PRIVATE pdp_status pdp__zero_take_gbuf(pdp_zero *z, int u)
{
    int slot = z->gslot[u], v = z->gbuf_unit[slot];
    pdp__zero_unit *k = &z->units[u];
    pdp_status st;
    char name[96];
    if (v >= 0) pdp__reducer_wait_bucket(&z->r, v);
    if ((v = z->gbuf_unit[slot]) >= 0) { /* its collective failed or never ran */
        z->units[v].gbuf = NULL;
        z->gbuf_unit[slot] = -1;
    }
    if ((st = pdp__dev_memset0(z->dev, z->gbufs[slot],
                               (size_t)(z->size * k->s) * sizeof(float))) != PDP_OK) {
        pdp__zero_unit_name(z, u, name, sizeof name);
        return pdp__err_wrap(st, "rank %d: clearing the gradient buffer of %s", z->rank, name);
    }
    z->gbuf_unit[slot] = u;
    k->gbuf = z->gbufs[slot];
    pdp__zero_point(z, u, z->layer_dw, k->gbuf);
    return PDP_OK;
}

/* The collective of bucket (unit) b: reduce-scatter (average) in place. */
PDP__PRIVATE pdp_status pdp__zero_reduce(pdp__reducer *r, int b, pdp_work **w)
{
    pdp_zero *z = (pdp_zero *)r->desc.user;
    pdp__zero_unit *k = &z->units[b];
    pdp_status st;
    /* no backward reached it: zeros */
    if (!k->gbuf && (st = pdp__zero_take_gbuf(z, b)) != PDP_OK) return st;
    if (r->hook.launch) {
        pdp_comm_hook_bucket v;
        memset(&v, 0, sizeof v);
        v.grad = k->gbuf;
        v.count = (int64_t)z->size * k->s;
        v.reduce_scatter = true;
        v.recv = k->gbuf + (int64_t)z->rank * k->s;
        v.recv_count = k->s;
        return pdp__reducer_hook_launch(r, b, &v, w);
    }
    return pdp_comm_reduce_scatter(z->c, k->gbuf, k->gbuf + (int64_t)z->rank * k->s, k->s,
                                   PDP_REDUCE_AVG, w);
}

/* A comm hook's scratch: stage 1 one piece per unit (every unit's buffer may be in
   flight at once), laid out as grad_all; stages 2-3 one piece per bucket buffer
   (unit u uses piece gslot[u], as its bucket buffer: the unit that held it was
   waited, and its hook finished, before u's backward began). */
PDP_API pdp_status pdp_zero_register_comm_hook(pdp_zero *z, const pdp_ddp_comm_hook *hook)
{
    static const char *fn = "pdp_zero_register_comm_hook";
    int64_t *off, base = 0, total;
    pdp_status st;
    int b;
    if (!z) return pdp__err(PDP_ERR_INVALID, "%s: zero is NULL", fn);
    off = (int64_t *)pdp__calloc((size_t)PDP__MAX(1, z->nunits) * sizeof *off);
    if (!off) return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory for %d units", fn, z->nunits);
    for (b = z->nunits - 1; b >= 0; b--) {
        off[b] = z->stage == 1 ? base : (int64_t)z->gslot[b] * z->size * z->smax;
        base += (int64_t)z->size * z->units[b].s;
    }
    total = z->stage == 1 ? z->padded_count : (int64_t)z->desc.grad_buffers * z->size * z->smax;
    st = pdp__reducer_set_hook(&z->r, hook, off, total, fn);
    pdp__dealloc(off);
    return st;
}

/* ---- zero: gathered parameters (stage 3) ---- */

/* Waits for slot i's all-gather; a failure names the unit. */
PDP__PRIVATE pdp_status pdp__zero_wait_slot(pdp_zero *z, int i)
{
    pdp__zero_pslot *p = &z->pslots[i];
    pdp_status st;
    char name[96];
    if (!p->work) return PDP_OK;
    st = pdp_work_wait(p->work);
    if (z->trace_gather && st == PDP_OK) {
        char ev[48], args[64];
        snprintf(ev, sizeof ev, "allgather unit %d", p->unit);
        snprintf(args, sizeof args, "\"bytes\":%lld", (long long)z->units[p->unit].s * 4 * z->size);
        pdp__trace_async(z->c->trace_pid, z->trace_gather, "comm", ev,
                         ((uint64_t)z->c->trace_pid << 40) | (uint64_t)p->work->seq, p->t_launch,
                         p->work->t_done, args);
    }
    p->work = NULL;
    if (st == PDP_OK) return PDP_OK;
    pdp__zero_unit_name(z, p->unit, name, sizeof name);
    z->units[p->unit].pslot = -1;
    p->unit = -1;
    return pdp__err_wrap(st, "rank %d: allgather of %s", z->rank, name);
}

/* Starts the all-gather of unit u's parameters into a slot: a free one, else the
   least recently used (whose gather has completed or is waited here) other than
   keep's. */
PDP__PRIVATE pdp_status pdp__zero_gather_launch(pdp_zero *z, int u, int keep)
{
    pdp__zero_unit *k = &z->units[u];
    pdp__zero_pslot *p;
    int i, best = -1;
    pdp_status st;
    char name[96];
    for (i = 0; i < z->desc.param_buffers; i++) {
        if (keep >= 0 && z->pslots[i].unit == keep) continue;
        if (z->pslots[i].unit < 0) {
            best = i;
            break;
        }
        if (best < 0 || z->pslots[i].used < z->pslots[best].used) best = i;
    }
    PDP_ASSERT(best >= 0);
    p = &z->pslots[best];
    if (p->unit >= 0) {
        if ((st = pdp__zero_wait_slot(z, best)) != PDP_OK) return st;
        if (p->unit >= 0) z->units[p->unit].pslot = -1;
    }
    p->unit = u;
    p->used = ++z->clock;
    k->pslot = best;
    p->t_launch = pdp__now();
    z->gathers++;
    st = pdp__dev_copy(z->dev, p->buf + (int64_t)z->rank * k->s, z->dev,
                       z->param_shard + k->shard_off, (size_t)k->s * sizeof(float));
    if (st == PDP_OK)
        st = pdp_comm_allgather(z->c, p->buf + (int64_t)z->rank * k->s, p->buf, k->s, &p->work);
    if (st == PDP_OK) return PDP_OK;
    k->pslot = -1;
    p->unit = -1;
    pdp__zero_unit_name(z, u, name, sizeof name);
    return pdp__err_wrap(st, "rank %d: allgather of %s", z->rank, name);
}

/* Unit u's parameters gathered and its layers pointed at them; then the next
   unit's gather (next >= 0) launched, so it runs while u computes. */
PDP__PRIVATE pdp_status pdp__zero_need(pdp_zero *z, int u, int next)
{
    pdp__zero_unit *k = &z->units[u];
    pdp_status st;
    if (k->pslot < 0 && (st = pdp__zero_gather_launch(z, u, -1)) != PDP_OK) return st;
    if ((st = pdp__zero_wait_slot(z, k->pslot)) != PDP_OK) return st;
    z->pslots[k->pslot].used = ++z->clock;
    pdp__zero_point(z, u, z->layer_w, z->pslots[k->pslot].buf);
    if (!z->desc.no_prefetch && next >= 0 && next < z->nunits && z->units[next].pslot < 0)
        return pdp__zero_gather_launch(z, next, u);
    return PDP_OK;
}

/* Every slot free (FSDP's reshard): waits for gathers in flight first. */
PDP__PRIVATE pdp_status pdp__zero_release_params(pdp_zero *z)
{
    pdp_status st, first = PDP_OK;
    int i;
    for (i = 0; z->pslots && i < z->desc.param_buffers; i++) {
        if ((st = pdp__zero_wait_slot(z, i)) != PDP_OK && first == PDP_OK) first = st;
        if (z->pslots[i].unit >= 0) z->units[z->pslots[i].unit].pslot = -1;
        z->pslots[i].unit = -1;
    }
    return first;
}

/* ---- zero: the model's events ---- */

/* Zeroes the gradients this rank holds: the full block at stage 1, the shard at 2-3. */
PDP__PRIVATE pdp_status pdp__zero_clear_grads(pdp_zero *z)
{
    return z->stage == 1
               ? pdp__dev_memset0(z->dev, z->grad_all, (size_t)z->padded_count * sizeof(float))
               : pdp__dev_memset0(z->dev, z->grad_shard, (size_t)z->shard_count * sizeof(float));
}

PDP__PRIVATE pdp_status pdp__zero_event(void *user, pdp_model *m, pdp__model_event ev, int layer,
                                        pdp_status st)
{
    pdp__reducer *r = (pdp__reducer *)user;
    pdp_zero *z = (pdp_zero *)r->desc.user;
    int u = layer >= 0 ? z->unit_of_layer[layer] : -1, i;
    (void)m;
    switch (ev) {
    case PDP__EV_FORWARD_LAYER: /* forward runs the units from the last index down */
        return z->stage == 3 ? pdp__zero_need(z, u, z->next_fwd[layer]) : PDP_OK;
    case PDP__EV_BACKWARD_BEGIN:
        z->passes++;
        if (z->stage >= 2)
            for (i = 0; i < z->desc.grad_buffers; i++)
                if (z->gbuf_unit[i] >= 0) {
                    z->units[z->gbuf_unit[i]].gbuf = NULL;
                    z->gbuf_unit[i] = -1;
                }
        return z->stage == 3 ? pdp__zero_release_params(z) : PDP_OK;
    case PDP__EV_RECOMPUTE_LAYER: /* a region's forward again: its units, before its backward */
        return z->stage == 3 ? pdp__zero_need(z, u, z->next_rec[layer]) : PDP_OK;
    case PDP__EV_BACKWARD_LAYER: /* backward runs them from 0 up (a tied head first) */
        if (z->stage >= 2 && !z->units[u].gbuf && (st = pdp__zero_take_gbuf(z, u)) != PDP_OK)
            return st;
        return z->stage == 3 ? pdp__zero_need(z, u, z->next_bwd[layer]) : PDP_OK;
    case PDP__EV_ZERO_GRAD: /* after the reducer's wait: the gradients this rank holds */
        (void)pdp__zero_clear_grads(z);
        return PDP_OK;
    case PDP__EV_BACKWARD_END:
        /* stages 2-3 under no_sync: reduce now, into the shard (no full gradient to
           accumulate in); a failure is reported by the next finish */
        if (z->stage >= 2 && z->no_sync && st == PDP_OK &&
            (st = pdp__reducer_finish(r, "pdp_zero_backward")) != PDP_OK &&
            z->deferred == PDP_OK) {
            z->deferred = st;
            snprintf(z->deferred_msg, sizeof z->deferred_msg, "%.760s", pdp_last_error());
        }
        return PDP_OK;
    }
    return PDP_OK;
}

/* ---- zero: construction ---- */

PDP_API void pdp_zero_free(pdp_zero *z)
{
    pdp_model *m;
    int i;
    if (!z) return;
    m = z->m;
    pdp__zero_release_params(z);
    pdp__reducer_release(&z->r); /* waits for the reduce-scatters */
    if (m && z->sharded) { /* best effort: a device failure leaves the block absent */
        size_t bytes = (size_t)m->param_count * sizeof(float);
        m->layer_w = m->layer_dw = NULL;
        if (!m->grad_block && m->param_count &&
            pdp__dev_alloc(m->device, bytes, (void **)&m->grad_block) == PDP_OK &&
            pdp__dev_memset0(m->device, m->grad_block, bytes) != PDP_OK) {
            pdp__dev_free(m->device, m->grad_block);
            m->grad_block = NULL;
        }
        m->sliced_world = m->sliced_rank = 0; /* a gathered block, or stages 1-2: whole */
        if (!m->param_block && m->param_count &&
            pdp__dev_alloc(m->device, bytes, (void **)&m->param_block) == PDP_OK) {
            pdp_status st = pdp__dev_memset0(m->device, m->param_block, bytes);
            for (i = 0; st == PDP_OK && z->param_shard && i < z->nunits; i++) {
                const pdp__zero_unit *k = &z->units[i];
                st = pdp__dev_copy(m->device, m->param_block + k->off + (int64_t)z->rank * k->s,
                                   m->device, z->param_shard + k->shard_off,
                                   (size_t)k->mine * sizeof(float));
            }
            if (st != PDP_OK) {
                pdp__dev_free(m->device, m->param_block);
                m->param_block = NULL;
            } else if (z->param_shard && z->size > 1) { /* this rank's slices, zeros around */
                m->sliced_world = z->size;
                m->sliced_rank = z->rank;
            }
        }
    }
    for (i = 0; z->gbufs && i < z->desc.grad_buffers; i++) pdp__dev_free(z->dev, z->gbufs[i]);
    for (i = 0; z->pslots && i < z->desc.param_buffers; i++)
        pdp__dev_free(z->dev, z->pslots[i].buf);
    pdp__dealloc(z->gbufs);
    pdp__dealloc(z->gbuf_unit);
    pdp__dealloc(z->pslots);
    pdp__dev_free(z->dev, z->grad_all);
    pdp__dev_free(z->dev, z->grad_shard);
    pdp__dev_free(z->dev, z->param_shard);
    pdp__dev_free(z->dev, z->staging);
    pdp__dev_free(z->dev, z->dscalar);
    pdp__dealloc(z->units);
    pdp__dealloc(z->unit_of_layer);
    pdp__dealloc(z->next_fwd);
    pdp__dealloc(z->next_bwd);
    pdp__dealloc(z->next_rec);
    pdp__dealloc(z->gslot);
    pdp__dealloc(z->layer_w);
    pdp__dealloc(z->layer_dw);
    if (m) pdp__model_unwrap(m); /* the caller's again (views off) */
    pdp__dealloc(z);
}

/* A zeroed buffer of count floats on the model's device, counted as a working
   buffer when work; NULL on failure (the message says why). */
PDP__PRIVATE float *pdp__zero_buf(pdp_zero *z, int64_t count, bool work)
{
    size_t bytes = (size_t)PDP__MAX(1, count) * sizeof(float);
    float *p = NULL;
    if (pdp__dev_alloc(z->dev, bytes, (void **)&p) != PDP_OK) return NULL;
    if (pdp__dev_memset0(z->dev, p, bytes) != PDP_OK) {
        pdp__dev_free(z->dev, p);
        return NULL;
    }
    if (work) z->buffer_bytes += count * (int64_t)sizeof(float);
    return p;
}

/* pdp_model_param's views of a wrapped model (the seam of internal.h): this rank's part
   of parameter index is its overlap [lo, hi) with the rank's slice of the parameter's
   unit, one contiguous range (a unit holds whole layers, so the parameter lies in one
   unit, and the slice is contiguous). The gradient's part lives in the slice (stage 1:
   the unit's padded buffer; stages 2-3: the shard), and so do the values at stage 3;
   at stages 1-2 the values stay the full view of the model's block. */
PDP__PRIVATE pdp_status pdp__zero_views(void *user, const pdp_model *m, int index, pdp_param *out,
                                        const char *fn)
{
    const pdp_zero *z = (const pdp_zero *)user;
    const pdp__param_entry *e = &m->params[index];
    const pdp__zero_unit *k;
    int64_t s0, lo, hi;
    float *g, *v;
    int u = z->unit_of_layer[e->layer];
    (void)fn;
    PDP_ASSERT(u >= 0);
    k = &z->units[u];
    s0 = k->off + (int64_t)z->rank * k->s; /* the slice: flat [s0, s0 + mine) */
    lo = PDP__MAX(e->offset, s0);
    hi = PDP__MIN(e->offset + e->count, s0 + k->mine);
    if (hi <= lo) lo = hi = 0;
    g = z->stage == 1 ? k->gbuf + (int64_t)z->rank * k->s : z->grad_shard + k->shard_off;
    v = z->param_shard ? z->param_shard + k->shard_off : NULL;
    out->grad_lo = hi > lo ? lo - e->offset : 0;
    out->grad_hi = hi > lo ? hi - e->offset : 0;
    pdp__model_view(hi > lo ? g + (lo - s0) : NULL, m->device, e, false, hi - lo, &out->grad);
    if (z->stage == 3) {
        out->value_lo = out->grad_lo;
        out->value_hi = out->grad_hi;
        pdp__model_view(hi > lo ? v + (lo - s0) : NULL, m->device, e, false, hi - lo,
                        &out->value);
    }
    return PDP_OK;
}

/* The one place pdp_zero_desc's zeros become defaults (sokol's _def; pdp_zero_get_desc
   returns its result, with grad_buffers cut to the units once they are known); in may
   be NULL. The bucket sizes and buffer counts are checked by the rule DDP and ZeRO
   share (pdp__bucket_opts_check, reducer.c). Buffer counts a stage does not use are 0. */
PDP__PRIVATE pdp_status pdp__zero_desc_defaults(const pdp_model *m, const pdp_zero_desc *in,
                                                pdp_zero_desc *out, const char *fn)
{
    pdp_zero_desc d;
    pdp_status st;
    if (in) d = *in;
    else memset(&d, 0, sizeof d);
    if (d.stage < 0 || d.stage > 3)
        return pdp__err(PDP_ERR_INVALID, "%s: stage %d is not 1, 2 or 3", fn, d.stage);
    if ((st = pdp__bucket_opts_check(m, d.bucket_cap_mb, d.first_bucket_mb, &d.grad_buffers,
                                     &d.param_buffers, fn)) != PDP_OK)
        return st;
    d.stage = PDP__DEF(d.stage, 1);
    d.bucket_cap_mb = PDP__DEF(d.bucket_cap_mb, 25.0);
    d.first_bucket_mb = PDP__DEF(d.first_bucket_mb, PDP__MIN(1.0, d.bucket_cap_mb));
    d.grad_buffers = d.stage >= 2 ? PDP__DEF(d.grad_buffers, 2) : 0;
    d.param_buffers = d.stage == 3 ? PDP__DEF(d.param_buffers, 2) : 0;
    *out = d;
    return PDP_OK;
}

PDP_API pdp_zero_desc pdp_zero_get_desc(const pdp_zero *z)
{
    pdp_zero_desc d;
    if (z) return z->desc;
    memset(&d, 0, sizeof d);
    return d;
}

/* The pinned units of the units the reducer's walk planned (the header's "Tied
   parameters"): the unit of a tied layer's parameter when the tied layer comes after
   all of the unit's own layers, so backward reaches the unit first at the tied layer;
   none with one unit (no other unit wants a buffer). Sets mark[u] (zeroed by the caller)
   to 1 for each and *tied_at to the last such tied layer; returns how many. The
   executor and pdp_zero_memory_plan count them alike. */
PDP__PRIVATE int pdp__zero_pinned(const pdp_model *m, const pdp__red_bucket *units, int nunits,
                                  int *mark, int *tied_at)
{
    int l, b, count = 0;
    if (nunits < 2) return 0;
    for (l = 0; l < m->nlayers; l++) {
        const pdp__layer *ly = &m->layers[l];
        if (!(pdp__layer_kind_of(ly->kind)->flags & PDP__LAYER_TIED)) continue;
        for (b = 0; ly->tied_param < units[b].info.first_param ||
                    ly->tied_param > units[b].info.last_param; b++) {}
        if (l > m->params[units[b].info.last_param].layer) {
            count += !mark[b];
            mark[b] = 1;
            *tied_at = l;
        }
    }
    return count;
}

/* The units' layers, once the units are planned: a tied layer computes with its owner's
   unit; each layer's next other unit in forward and backward order (stage 3 prefetches
   it); the pinned units and every unit's gradient buffer: the pinned ones the last
   buffers, one each, the others the rest round-robin. grad_buffers (asked: the desc's,
   0 for the default) must leave the others one: PDP_ERR_INVALID naming the tied layer
   otherwise; the default grows to what is needed. */
PDP__PRIVATE pdp_status pdp__zero_plan_layers(pdp_zero *z, int asked, const char *fn)
{
    const pdp_model *m = z->m;
    int l, u, a, b, g, need, rest, pinned, tied_at = -1;
    for (l = 0; l < m->nlayers; l++)
        if (pdp__layer_kind_of(m->layers[l].kind)->flags & PDP__LAYER_TIED)
            z->unit_of_layer[l] = z->unit_of_layer[m->params[m->layers[l].tied_param].layer];
    pinned = pdp__zero_pinned(m, z->r.buckets, z->nunits, z->gslot, &tied_at);
    for (u = 0; u < z->nunits; u++)
        if (z->gslot[u]) z->pinned_s += z->units[u].s;
    for (a = b = -1, l = m->nlayers - 1; l >= 0; l--) { /* a: the nearest later unit, b: */
        u = z->unit_of_layer[l];                          /* the nearest later one not a */
        z->next_fwd[l] = u < 0 ? -1 : a != u ? a : b;
        if (u >= 0 && u != a) b = a, a = u;
    }
    /* backward's needs read last first: layer l's backward, then (before it in the pass)
       FULL recomputation's forward of the region that ends at l, layers [from, l) */
    for (a = b = -1, l = 0; l < m->nlayers; l++) {
        int from = pdp__model_recompute_from(m, l), k;
        for (k = l; k >= (from >= 0 ? from : l); k--) {
            int *next = k == l ? z->next_bwd : z->next_rec;
            u = z->unit_of_layer[k];
            next[k] = u < 0 ? -1 : a != u ? a : b;
            if (u >= 0 && u != a) b = a, a = u;
        }
    }
    if (z->stage == 1) return PDP_OK;
    g = z->desc.grad_buffers;
    need = pinned + (pinned < z->nunits);
    if (g < need) {
        if (asked) {
            const pdp__param_entry *e = &m->params[m->layers[tied_at].tied_param];
            return pdp__err(PDP_ERR_INVALID, "%s: grad_buffers %d: layer %d (%s) adds to the "
                            "gradient of '%s' before layer %d (%s) does, so its unit keeps a "
                            "buffer through the backward and the other units need one more: "
                            "at least %d", fn, asked, tied_at,
                            pdp__layer_kind_name(m->layers[tied_at].kind), e->name, e->layer,
                            pdp__layer_kind_name(m->layers[e->layer].kind), need);
        }
        z->desc.grad_buffers = g = need;
    }
    for (rest = g - pinned, b = 0, u = 0; u < z->nunits; u++) /* gslot holds the marks */
        z->gslot[u] = z->gslot[u] ? rest + b++ : u % rest;
    return PDP_OK;
}

/* pdp_zero_create's first half on this rank alone: the model, the desc, the wrap and
   the reducer's plan. *out gets what was built, on failure too (pdp_zero_free takes it). */
PDP__PRIVATE pdp_status pdp__zero_prepare(pdp_zero **out, pdp_model *m, pdp_comm *c,
                                          const pdp_zero_desc *desc, const char *fn)
{
    pdp__reducer_desc rd;
    pdp_zero_desc zd;
    pdp_zero *z;
    pdp_status st;
    if (!m) return pdp__err(PDP_ERR_INVALID, "%s: model is NULL", fn);
    if ((st = pdp__zero_desc_defaults(m, desc, &zd, fn)) != PDP_OK) return st;
    /* the units, shards and (stage 3) the parameter block are this layout's */
    if ((st = pdp__model_wrap(m, PDP__WRAP_ZERO, zd.stage, fn)) != PDP_OK) return st;
    if (!(*out = z = (pdp_zero *)pdp__calloc(sizeof *z))) {
        pdp__model_unwrap(m);
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: rank %d: no memory", fn, c->rank);
    }
    z->m = m; /* pdp_zero_free unwraps it, on failure too */
    z->dev = m->device;
    z->desc = zd; /* grad_buffers is cut to the units below */
    z->stage = z->desc.stage;
    z->c = c;
    z->rank = c->rank;
    z->size = c->size;
    memset(&rd, 0, sizeof rd);
    rd.cap_bytes = z->desc.bucket_cap_mb * 1048576.0;
    rd.first_bytes = z->desc.first_bucket_mb * 1048576.0;
    rd.reduce = pdp__zero_reduce;
    rd.bucket_done = pdp__zero_bucket_done;
    rd.event = pdp__zero_event;
    rd.whole_layers = true;
    rd.op_name = "reduce_scatter";
    rd.finish_names = "pdp_zero_step or pdp_zero_finish";
    rd.backward_names = "pdp_zero_forward_backward or pdp_zero_backward";
    rd.batch_mean = z->desc.batch_mean;
    rd.stage = z->desc.stage;
    rd.user = z;
    return pdp__reducer_init(&z->r, m, c, &rd, fn);
}

/* Collective over c: the first half on this rank, then every rank learns whether every
   rank's succeeded (one that failed alone would leave its peers waiting for it in the
   reducer's collectives, until the timeout), then those collectives; what follows them
   (the shards and buffers) is agreed on once more at the end. */
PDP_API pdp_status pdp_zero_create(pdp_zero **out, pdp_model *m, pdp_comm *c,
                                   const pdp_zero_desc *desc)
{
    static const char *fn = "pdp_zero_create";
    pdp_comm_stats cs;
    pdp_zero *z = NULL;
    pdp_status st;
    int64_t acc, base;
    int b, l, n;
    pdp__err_kept why; /* the failure, kept across pdp_zero_free */
    if (out) *out = NULL;
    if (!c) return pdp__err(PDP_ERR_INVALID, "%s: comm is NULL", fn);
    if (!out) st = pdp__err(PDP_ERR_INVALID, "%s: out is NULL", fn);
    else st = pdp__zero_prepare(&z, m, c, desc, fn);
    if ((st = pdp__comm_agree(c, st, fn)) != PDP_OK ||
        (st = pdp__reducer_join(&z->r, fn)) != PDP_OK)
        goto release;
    n = z->size; /* past the collectives: a failure from here on is agreed (at fail) */
    if (z->r.trace_comm) { /* the reduce-scatters on the reducer's lane, the gathers on this */
        char lane[PDP__COMM_NAME_CAP + 16];
        snprintf(lane, sizeof lane, "allgather %s", c->name);
        z->trace_gather = pdp__trace_track(c->trace_pid, lane);
    }
    /* units: the buckets; shard offsets in flat-block order (the last bucket first) */
    z->nunits = z->r.nbuckets;
    if (z->desc.grad_buffers > z->nunits) /* the default 2 with one unit: one can be used */
        z->desc.grad_buffers = PDP__MAX(1, z->nunits);
    z->units = (pdp__zero_unit *)pdp__calloc((size_t)PDP__MAX(1, z->nunits) * sizeof *z->units);
    z->unit_of_layer = (int *)pdp__calloc((size_t)PDP__MAX(1, m->nlayers) * sizeof(int));
    z->layer_w = (float **)pdp__calloc((size_t)PDP__MAX(1, m->nlayers) * sizeof(float *));
    z->layer_dw = (float **)pdp__calloc((size_t)PDP__MAX(1, m->nlayers) * sizeof(float *));
    z->next_fwd = (int *)pdp__calloc((size_t)PDP__MAX(1, m->nlayers) * sizeof(int));
    z->next_bwd = (int *)pdp__calloc((size_t)PDP__MAX(1, m->nlayers) * sizeof(int));
    z->next_rec = (int *)pdp__calloc((size_t)PDP__MAX(1, m->nlayers) * sizeof(int));
    z->gslot = (int *)pdp__calloc((size_t)PDP__MAX(1, z->nunits) * sizeof(int));
    if (!z->units || !z->unit_of_layer || !z->layer_w || !z->layer_dw || !z->next_fwd ||
        !z->next_bwd || !z->next_rec || !z->gslot)
        goto oom;
    for (l = 0; l < m->nlayers; l++) z->unit_of_layer[l] = z->next_rec[l] = -1;
    acc = 0;
    for (b = z->nunits - 1; b >= 0; b--) {
        pdp__zero_unit *k = &z->units[b];
        const pdp_ddp_bucket *info = &z->r.buckets[b].info;
        k->off = info->offset;
        k->count = info->count;
        k->s = pdp__zero_align((k->count + n - 1) / n);
        k->shard_off = acc;
        k->mine = PDP__MAX(0, PDP__MIN(k->s, k->count - (int64_t)z->rank * k->s));
        k->first_layer = m->params[info->first_param].layer;
        k->last_layer = m->params[info->last_param].layer;
        k->pslot = -1;
        for (l = k->first_layer; l <= k->last_layer; l++) z->unit_of_layer[l] = b;
        acc += k->s;
        z->smax = PDP__MAX(z->smax, k->s);
    }
    z->shard_count = acc;
    z->padded_count = acc * n;
    if ((st = pdp__zero_plan_layers(z, desc ? desc->grad_buffers : 0, fn)) != PDP_OK) goto fail;
    /* the shards first, then the model's blocks go, then the working buffers */
    z->sharded = true;
    if (z->stage == 1) {
        if (!(z->grad_all = pdp__zero_buf(z, z->padded_count, false))) goto oom;
        for (base = 0, b = z->nunits - 1; b >= 0; b--) {
            z->units[b].gbuf = z->grad_all + base;
            pdp__zero_point(z, b, z->layer_dw, z->units[b].gbuf);
            base += n * z->units[b].s;
        }
    } else {
        if (!(z->grad_shard = pdp__zero_buf(z, z->shard_count, false))) goto oom;
    }
    if (z->stage == 3) {
        if (!(z->param_shard = pdp__zero_buf(z, z->shard_count, false))) goto oom;
        for (b = 0; b < z->nunits; b++) {
            const pdp__zero_unit *k = &z->units[b];
            if ((st = pdp__dev_copy(z->dev, z->param_shard + k->shard_off, z->dev,
                                    m->param_block + k->off + (int64_t)z->rank * k->s,
                                    (size_t)k->mine * sizeof(float))) != PDP_OK) {
                st = pdp__err_wrap(st, "%s: rank %d: copying the parameter shard", fn, c->rank);
                goto fail;
            }
        }
        pdp__dev_free(m->device, m->param_block);
        m->param_block = NULL;
        m->layer_w = z->layer_w;
    }
    pdp__dev_free(m->device, m->grad_block);
    m->grad_block = NULL;
    m->layer_dw = z->layer_dw;
    if (z->stage <= 2 && !(z->staging = pdp__zero_buf(z, n * z->smax, true))) goto oom;
    /* clipping's scalar: NCCL reduces device memory only (not a working buffer: 4 bytes) */
    if (z->dev.kind != PDP_DEVICE_CPU && !(z->dscalar = pdp__zero_buf(z, 1, false))) goto oom;
    if (z->stage >= 2) {
        z->gbufs = (float **)pdp__calloc((size_t)z->desc.grad_buffers * sizeof(float *));
        z->gbuf_unit = (int *)pdp__calloc((size_t)z->desc.grad_buffers * sizeof(int));
        if (!z->gbufs || !z->gbuf_unit) goto oom;
        for (b = 0; b < z->desc.grad_buffers; b++) {
            z->gbuf_unit[b] = -1;
            if (!(z->gbufs[b] = pdp__zero_buf(z, n * z->smax, true))) goto oom;
        }
    }
    if (z->stage == 3) {
        z->pslots = (pdp__zero_pslot *)pdp__calloc((size_t)z->desc.param_buffers *
                                                   sizeof *z->pslots);
        if (!z->pslots) goto oom;
        for (b = 0; b < z->desc.param_buffers; b++) {
            z->pslots[b].unit = -1;
            if (!(z->pslots[b].buf = pdp__zero_buf(z, n * z->smax, true))) goto oom;
        }
    }
    if ((st = pdp__comm_agree(c, PDP_OK, fn)) != PDP_OK) goto release;
    m->views = pdp__zero_views; /* pdp_model_param: what this rank holds */
    m->views_user = z;
    z->stats.units = z->nunits;
    pdp_comm_get_stats(c, &cs);
    z->bytes_at_step = cs.bytes_sent;
    *out = z;
    return PDP_OK;
oom:
    st = pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: rank %d: no memory for the stage %d shards and "
                  "buffers (%lld floats of parameters, %d units)", fn, c->rank, z->stage,
                  (long long)m->param_count, z->nunits);
fail:
    st = pdp__comm_agree(c, st, fn);
release: /* pdp_zero_free's best-effort allocations must not replace the message, nor its
            mark of a peer's failure (pdp_launch then reports that peer's message) */
    pdp__err_keep(&why);
    pdp_zero_free(z);
    return pdp__err_restore(st, &why);
}

PDP_API pdp_status pdp_zero_optim_create(pdp_optim **out, pdp_zero *z, const pdp_optim_desc *desc)
{
    static const char *fn = "pdp_zero_optim_create";
    pdp_status st;
    if (out) *out = NULL;
    if (!z) return pdp__err(PDP_ERR_INVALID, "%s: zero is NULL", fn);
    /* collective: every rank's optimizer made, then the same on every rank */
    st = pdp__optim_create_shard(out, z->m, desc, z->shard_count, fn);
    if ((st = pdp__comm_agree(z->c, st, fn)) == PDP_OK)
        st = pdp__comm_agree(z->c, pdp__optim_agree(z->c, &(*out)->desc, fn), fn);
    if (st != PDP_OK && out && *out) {
        pdp_optim_free(*out);
        *out = NULL;
    }
    return st;
}

/* ---- zero: training ---- */

PDP_API pdp_status pdp_zero_forward_backward(pdp_zero *z, const pdp_tensor *x,
                                             const int32_t *labels, float *loss)
{
    static const char *fn = "pdp_zero_forward_backward";
    if (!z) return pdp__err(PDP_ERR_INVALID, "%s: zero is NULL", fn);
    return pdp__reducer_backward(&z->r, x, labels, loss, fn);
}

PDP_API pdp_status pdp_zero_forward(pdp_zero *z, const pdp_tensor *x, const pdp_tensor **y)
{
    static const char *fn = "pdp_zero_forward";
    if (y) *y = NULL;
    if (!z) return pdp__err(PDP_ERR_INVALID, "%s: zero is NULL", fn);
    return pdp__reducer_forward(&z->r, x, y, fn);
}

PDP_API pdp_status pdp_zero_backward(pdp_zero *z, const pdp_tensor *dy)
{
    static const char *fn = "pdp_zero_backward";
    if (!z) return pdp__err(PDP_ERR_INVALID, "%s: zero is NULL", fn);
    return pdp__reducer_backward_dy(&z->r, dy, fn);
}

PDP_API pdp_status pdp_zero_finish(pdp_zero *z)
{
    static const char *fn = "pdp_zero_finish";
    pdp_status st;
    if (!z) return pdp__err(PDP_ERR_INVALID, "%s: zero is NULL", fn);
    if (z->deferred != PDP_OK) {
        st = z->deferred;
        z->deferred = PDP_OK;
        return pdp__err(st, "%s: %s", fn, z->deferred_msg);
    }
    if ((st = pdp__reducer_finish(&z->r, fn)) != PDP_OK) return st;
    if (z->deferred != PDP_OK) { /* a bucket's completion, while finish waited for it */
        st = z->deferred;
        z->deferred = PDP_OK;
        return pdp__err(st, "%s: %s", fn, z->deferred_msg);
    }
    return PDP_OK;
}

/* Stage 1: the rank's slice of unit u in its padded buffer; stages 2-3: in the shard. */
PDP__PRIVATE float *pdp__zero_grad_slice(pdp_zero *z, int u)
{
    const pdp__zero_unit *k = &z->units[u];
    return z->stage == 1 ? k->gbuf + (int64_t)z->rank * k->s : z->grad_shard + k->shard_off;
}

/* This rank's slices of the averaged gradients, the ones its step reads, times coef
   (clipping; the trainer's accum_steps). */
PDP__PRIVATE pdp_status pdp__zero_grad_scale(pdp_zero *z, float coef, const char *fn)
{
    pdp_status st;
    int u;
    for (u = 0; u < z->nunits; u++)
        if ((st = pdp__grad_scale(z->m, pdp__zero_grad_slice(z, u), z->units[u].mine, coef, fn)) !=
            PDP_OK)
            return st;
    return PDP_OK;
}

/* The squared norm of this rank's slices, all-reduced over the DP group (every element of
   the flat block once); on a TP model the elements count as pdp__grad_sumsq_range counts
   them (a slice on every TP rank, a replicated tensor on TP rank 0 only) and a second
   all-reduce over the TP group adds the TP ranks' parts: the full model's norm, the same
   bits on every rank of both groups. */
PDP_API pdp_status pdp_zero_clip_grad_norm(pdp_zero *z, float max_norm, float *total_norm)
{
    static const char *fn = "pdp_zero_clip_grad_norm";
    double sum = 0.0, norm;
    float coef;
    int u;
    pdp_status st;
    if (total_norm) *total_norm = 0.0f;
    if (!z) return pdp__err(PDP_ERR_INVALID, "%s: zero is NULL", fn);
    if ((st = pdp__check_max_norm(max_norm, fn)) != PDP_OK) return st;
    if (z->r.state != PDP__RED_IDLE)
        return pdp__err(PDP_ERR_STATE, "%s: rank %d: call pdp_zero_finish first", fn, z->rank);
    for (u = 0; u < z->nunits; u++) {
        int64_t lo = z->units[u].off + (int64_t)z->rank * z->units[u].s; /* in the flat block */
        if ((st = pdp__grad_sumsq_range(z->m, pdp__zero_grad_slice(z, u), lo,
                                        lo + z->units[u].mine, &sum, fn)) != PDP_OK)
            return st;
    }
    if ((st = pdp__grad_allreduce_sum(z->c, &z->scalar, z->dscalar, &sum)) != PDP_OK)
        return pdp__err_wrap(st, "%s: rank %d: all-reducing the squared norm", fn, z->rank);
    if (z->m->tp.comm && z->m->tp.size > 1 &&
        (st = pdp__grad_allreduce_sum(z->m->tp.comm, &z->scalar, z->dscalar, &sum)) != PDP_OK)
        return pdp__err_wrap(st, "%s: rank %d (TP rank %d of %d): all-reducing the squared norm "
                             "over the TP group", fn, z->rank, z->m->tp.rank, z->m->tp.size);
    norm = sqrt(sum);
    if (total_norm) *total_norm = (float)norm;
    if (!isfinite(norm)) return pdp__err(PDP_ERR_NUMERIC, "%s: the gradient norm is %g", fn, norm);
    coef = pdp__clip_coef(max_norm, norm);
    return coef >= 1.0f ? PDP_OK : pdp__zero_grad_scale(z, coef, fn);
}

/* Stages 1-2: every rank's updated slices into every rank's full parameters. */
PDP__PRIVATE pdp_status pdp__zero_gather_full(pdp_zero *z, float *dst, const char *fn)
{
    double t0;
    pdp_status st;
    int u;
    for (u = 0; u < z->nunits; u++) {
        const pdp__zero_unit *k = &z->units[u];
        float *mine = z->staging + (int64_t)z->rank * k->s;
        if ((st = pdp__dev_copy(z->dev, mine, z->dev,
                                z->m->param_block + k->off + (int64_t)z->rank * k->s,
                                (size_t)k->mine * sizeof(float))) != PDP_OK ||
            (st = pdp__dev_memset0(z->dev, mine + k->mine,
                                   (size_t)(k->s - k->mine) * sizeof(float))) != PDP_OK)
            return pdp__err_wrap(st, "%s: rank %d: staging unit %d", fn, z->rank, u);
        z->gathers++;
        t0 = pdp__now();
        st = pdp_comm_allgather(z->c, mine, z->staging, k->s, NULL);
        if (z->trace_gather && st == PDP_OK) {
            char ev[48];
            snprintf(ev, sizeof ev, "allgather unit %d", u);
            pdp__trace_complete(z->c->trace_pid, z->trace_gather, "comm", ev, t0, pdp__now(),
                                NULL);
        }
        if (st != PDP_OK) {
            char name[96];
            pdp__zero_unit_name(z, u, name, sizeof name);
            return pdp__err_wrap(st, "%s: rank %d: allgather of %s", fn, z->rank, name);
        }
        if ((st = pdp__dev_copy(z->dev, dst + k->off, z->dev, z->staging,
                                (size_t)k->count * sizeof(float))) != PDP_OK)
            return pdp__err_wrap(st, "%s: rank %d: unit %d", fn, z->rank, u);
    }
    return PDP_OK;
}

/* The bytes a step of k backward passes sends (zero.h: "Communication per rank
   per step"), into st->micro_steps, formula_bytes and formula. V = 4 (N-1) S is
   one reduce-scatter or all-gather of every unit (S = shard_count: the bytes the
   backends count for a collective of S floats per rank); stage 3's later
   forwards skip the units the backward before them left gathered, the last
   param_buffers units of backward (the highest indices), and with more units than
   param_buffers a pinned unit (a tied head's) has left its slot before its tied
   layer's forward and before its own layers' backward: two more gathers per pass. */
PDP__PRIVATE void pdp__zero_formula(const pdp_zero *z, int64_t k, pdp_zero_stats *st)
{
    int64_t v = 4 * (int64_t)(z->size - 1) * z->shard_count, kept = 0, scalar, tied = 0;
    int u, n = z->size;
    k = PDP__MAX(1, k);
    scalar = z->r.desc.batch_mean == PDP_BATCH_MEAN_GLOBAL /* one float, as comm.c counts it */
                 ? k * (int64_t)(2.0 * (n - 1) / n * 4.0) : 0;
    st->micro_steps = k;
    if (z->stage == 1) {
        st->formula_bytes = 2 * v + scalar;
        snprintf(st->formula, sizeof st->formula, "2 (N-1)/N x 4 Psi_pad, N = %d (k = %lld "
                 "backward passes: stage 1 accumulates without sending)", n, (long long)k);
    } else if (z->stage == 2) {
        st->formula_bytes = (k + 1) * v + scalar;
        snprintf(st->formula, sizeof st->formula, "(k + 1) (N-1)/N x 4 Psi_pad, k = %lld backward "
                 "passes, N = %d (a reduce-scatter per backward, one all-gather)", (long long)k, n);
    } else {
        for (u = PDP__MAX(0, z->nunits - z->desc.param_buffers); u < z->nunits; u++)
            kept += z->units[u].s; /* floats per rank of the units kept gathered */
        if (z->nunits > z->desc.param_buffers) tied = z->pinned_s;
        st->formula_bytes = 3 * k * v - (k - 1) * 4 * (int64_t)(n - 1) * kept +
                            2 * k * 4 * (int64_t)(n - 1) * tied + scalar;
        snprintf(st->formula, sizeof st->formula, "3k (N-1)/N x 4 Psi_pad - (k - 1) (N-1)/N "
                 "x 4 Psi_kept, k = %lld backward passes, N = %d, Psi_kept %lld of %lld (the "
                 "units a backward leaves gathered for the next forward)", (long long)k, n,
                 (long long)(kept * n), (long long)z->padded_count);
        if (tied) {
            size_t len = strlen(st->formula);
            snprintf(st->formula + len, sizeof st->formula - len, " + 2k (N-1)/N x 4 x %lld "
                     "(tied)", (long long)(tied * n));
        }
    }
    if (scalar) {
        size_t len = strlen(st->formula);
        snprintf(st->formula + len, sizeof st->formula - len, " + k x %lld (batch sizes)",
                 (long long)(scalar / k));
    }
}

PDP_API pdp_status pdp_zero_step(pdp_zero *z, pdp_optim *opt)
{
    static const char *fn = "pdp_zero_step";
    pdp_comm_stats cs;
    double t0;
    pdp_status st;
    int u;
    if (!z || !opt) return pdp__err(PDP_ERR_INVALID, "%s: %s is NULL", fn, z ? "opt" : "zero");
    if (!opt->shard || opt->model != z->m || opt->hi != z->shard_count)
        return pdp__err(PDP_ERR_INVALID, "%s: opt was not made by pdp_zero_optim_create for this "
                        "executor", fn);
    if ((st = pdp_zero_finish(z)) != PDP_OK) return pdp__err_wrap(st, "%s", fn);
    t0 = pdp__now();
    for (u = 0; u < z->nunits; u++) {
        const pdp__zero_unit *k = &z->units[u];
        float *p = z->stage == 3 ? z->param_shard + k->shard_off
                                 : z->m->param_block + k->off + (int64_t)z->rank * k->s;
        if ((st = pdp__optim_step_at(opt, p, pdp__zero_grad_slice(z, u), k->shard_off,
                                     k->mine, k->off + (int64_t)z->rank * k->s)) != PDP_OK)
            return pdp__err_wrap(st, "%s: rank %d", fn, z->rank);
    }
    pdp__optim_finish_step(opt);
    if ((st = pdp__zero_clear_grads(z)) != PDP_OK)
        return pdp__err_wrap(st, "%s: rank %d: zeroing the gradients", fn, z->rank);
    if (z->r.trace_compute)
        pdp__trace_complete(z->c->trace_pid, z->r.trace_compute, "compute", "optimizer step", t0,
                            pdp__now(), NULL);
    if (z->stage <= 2) {
        if ((st = pdp__zero_gather_full(z, z->m->param_block, fn)) != PDP_OK) return st;
    } else {
        if ((st = pdp__zero_release_params(z)) != PDP_OK) return pdp__err_wrap(st, "%s", fn);
        if (z->m->param_block) { /* a gathered copy (pdp_zero_gather_params): now stale */
            pdp__dev_free(z->m->device, z->m->param_block);
            z->m->param_block = NULL;
        }
    }
    pdp_comm_get_stats(z->c, &cs);
    z->stats.steps = z->r.stats.steps;
    z->stats.bytes_sent = cs.bytes_sent - z->bytes_at_step;
    z->stats.total_bytes_sent += z->stats.bytes_sent;
    z->stats.gathers = z->gathers - z->gathers_at_step;
    pdp__zero_formula(z, z->passes, &z->stats);
    z->passes = 0;
    z->stats.backward_s = z->r.stats.backward_s;
    z->stats.reduce_s = z->r.stats.allreduce_s;
    z->stats.wait_s = z->r.stats.wait_s;
    z->bytes_at_step = cs.bytes_sent;
    z->gathers_at_step = z->gathers;
    return PDP_OK;
}

PDP_API void pdp_zero_set_no_sync(pdp_zero *z, bool no_sync)
{
    if (!z) return;
    z->no_sync = no_sync;
    z->r.no_sync = no_sync && z->stage == 1; /* stages 2-3 reduce every backward */
}

PDP_API pdp_status pdp_zero_gather_params(pdp_zero *z, float *dst)
{
    static const char *fn = "pdp_zero_gather_params";
    pdp_device to = pdp_cpu(); /* dst is host memory */
    pdp_model *m;
    pdp_status st;
    int u;
    if (!z) return pdp__err(PDP_ERR_INVALID, "%s: zero is NULL", fn);
    m = z->m;
    if (z->stage <= 2) {
        if (dst && (st = pdp__dev_copy(pdp_cpu(), dst, m->device, m->param_block,
                                       (size_t)m->param_count * sizeof(float))) != PDP_OK)
            return pdp__err_wrap(st, "%s: rank %d", fn, z->rank);
        return PDP_OK;
    }
    if (!dst) {
        if (!m->param_block &&
            pdp__dev_alloc(m->device, (size_t)m->param_count * sizeof(float),
                           (void **)&m->param_block) != PDP_OK)
            return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory for %lld parameters", fn,
                            (long long)m->param_count);
        dst = m->param_block;
        to = m->device;
    }
    for (u = z->nunits - 1; u >= 0; u--) {
        const pdp__zero_unit *k = &z->units[u];
        if ((st = pdp__zero_need(z, u, u - 1)) != PDP_OK) return pdp__err_wrap(st, "%s", fn);
        if ((st = pdp__dev_copy(to, dst + k->off, m->device, z->pslots[k->pslot].buf,
                                (size_t)k->count * sizeof(float))) != PDP_OK)
            return pdp__err_wrap(st, "%s: rank %d", fn, z->rank);
    }
    return PDP_OK;
}

/* ---- zero: queries ---- */

PDP_API pdp_model *pdp_zero_model(const pdp_zero *z) { return z ? z->m : NULL; }
PDP_API int pdp_zero_stage(const pdp_zero *z) { return z ? z->stage : 0; }
PDP_API int pdp_zero_num_units(const pdp_zero *z) { return z ? z->nunits : 0; }

/* ---- zero: memory ---- */

/* The plan of every stage for m on n ranks (d resolved; nstate optimizer floats per
   parameter) into out's counts and stages[], and out->stage's formulas: the units as
   pdp_zero_create plans them (reducer.c's walk), each padded to N s_u. */
PDP__PRIVATE pdp_status pdp__zero_plan(const pdp_model *m, int n, const pdp_zero_desc *d,
                                       int nstate, pdp_zero_memory *out, const char *fn)
{
    pdp__red_bucket *units;
    int nunits, b, s, g, pb, pinned, tied_at;
    int *mark;
    int64_t smax = 0, shard = 0, psi = m->param_count;
    double k = 4.0 * nstate, kp = 4.0 + k, dpsi = (double)psi;
    units = (pdp__red_bucket *)pdp__calloc((size_t)PDP__MAX(1, m->nparams) * sizeof *units);
    mark = (int *)pdp__calloc((size_t)PDP__MAX(1, m->nparams) * sizeof *mark);
    if (!units || !mark) {
        pdp__dealloc(units);
        pdp__dealloc(mark);
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory", fn);
    }
    nunits = pdp__reducer_walk(m, d->bucket_cap_mb * 1048576.0, d->first_bucket_mb * 1048576.0,
                               true, units, NULL);
    for (b = 0; b < nunits; b++) {
        int64_t su = pdp__zero_align((units[b].info.count + n - 1) / n);
        shard += su;
        smax = PDP__MAX(smax, su);
    }
    g = PDP__MIN(d->grad_buffers ? d->grad_buffers : 2, PDP__MAX(1, nunits));
    pinned = pdp__zero_pinned(m, units, nunits, mark, &tied_at);
    g = PDP__MAX(g, pinned + (pinned < nunits)); /* as pdp__zero_plan_layers */
    pdp__dealloc(units);
    pdp__dealloc(mark);
    pb = d->param_buffers ? d->param_buffers : 2;
    out->world_size = n;
    out->param_count = psi;
    out->padded_count = shard * n;
    out->shard_count = shard;
    out->state_per_param = nstate;
    out->unit_max = smax * n;
    for (s = 0; s < 4; s++) {
        pdp_zero_memory_stage *r = &out->stages[s];
        r->param_bytes = 4 * (s == 3 ? shard : psi);
        r->grad_bytes = 4 * (s == 0 ? psi : s == 1 ? shard * n : shard);
        r->optim_bytes = 4 * nstate * (s == 0 ? psi : shard);
        r->buffers = s == 0 ? 0 : s == 1 ? 1 : s == 2 ? 1 + g : g + pb;
        r->buffer_bytes = (int64_t)r->buffers * 4 * out->unit_max;
        r->total_bytes = r->param_bytes + r->grad_bytes + r->optim_bytes + r->buffer_bytes;
        r->fp32_bytes = s == 0   ? (8.0 + k) * dpsi
                        : s == 1 ? 8.0 * dpsi + k * dpsi / n
                        : s == 2 ? 4.0 * dpsi + (4.0 + k) * dpsi / n
                                 : (8.0 + k) * dpsi / n;
        r->paper_bytes = s == 0   ? (4.0 + kp) * dpsi
                         : s == 1 ? 4.0 * dpsi + kp * dpsi / n
                         : s == 2 ? 2.0 * dpsi + (2.0 + kp) * dpsi / n
                                  : (4.0 + kp) * dpsi / n;
    }
    out->ddp_bytes = out->stages[0].fp32_bytes;
    out->formula_bytes = out->stages[out->stage].fp32_bytes;
    out->buffer_bound = out->stages[out->stage].buffer_bytes;
    return PDP_OK;
}

PDP_API pdp_status pdp_zero_get_memory(const pdp_zero *z, const pdp_optim *opt,
                                       pdp_zero_memory *out)
{
    static const char *fn = "pdp_zero_get_memory";
    pdp_status st;
    if (out) memset(out, 0, sizeof *out);
    if (!z || !out) return pdp__err(PDP_ERR_INVALID, "%s: %s is NULL", fn, z ? "out" : "z");
    if (opt && (!opt->shard || opt->model != z->m))
        return pdp__err(PDP_ERR_INVALID, "%s: opt is not this executor's shard optimizer "
                        "(pdp_zero_optim_create)", fn);
    out->stage = z->stage;
    if ((st = pdp__zero_plan(z->m, z->size, &z->desc, opt ? opt->nstate : 0, out, fn)) != PDP_OK)
        return st;
    out->measured = true; /* what this rank holds now */
    out->param_bytes = (z->stage == 3 ? z->shard_count : 0) * 4 +
                       (z->m->param_block ? z->m->param_count * 4 : 0);
    out->grad_bytes = (z->stage == 1 ? z->padded_count : z->shard_count) * 4 +
                      (z->m->grad_block ? z->m->param_count * 4 : 0);
    out->optim_bytes = opt ? opt->nstate * (opt->hi - opt->lo) * 4 : 0;
    out->buffer_bytes = z->buffer_bytes;
    out->total_bytes = out->param_bytes + out->grad_bytes + out->optim_bytes + out->buffer_bytes;
    return PDP_OK;
}

PDP_API pdp_status pdp_zero_memory_plan(const pdp_model *m, int world_size, int stage,
                                        const pdp_zero_desc *desc, const pdp_optim *opt,
                                        pdp_zero_memory *out)
{
    static const char *fn = "pdp_zero_memory_plan";
    pdp_zero_desc d;
    pdp_status st;
    const pdp_zero_memory_stage *r;
    if (out) memset(out, 0, sizeof *out);
    if (!m || !out) return pdp__err(PDP_ERR_INVALID, "%s: %s is NULL", fn, m ? "out" : "m");
    if (world_size < 1)
        return pdp__err(PDP_ERR_INVALID, "%s: world_size %d < 1", fn, world_size);
    if (stage < 0 || stage > 3)
        return pdp__err(PDP_ERR_INVALID, "%s: stage %d is not 0 (DDP), 1, 2 or 3", fn, stage);
    if (desc) d = *desc;
    else memset(&d, 0, sizeof d);
    d.stage = PDP__MAX(stage, 1); /* the desc's checks and defaults, as a create would */
    if ((st = pdp__zero_desc_defaults(m, &d, &d, fn)) != PDP_OK) return st;
    if (desc) d.grad_buffers = desc->grad_buffers, d.param_buffers = desc->param_buffers;
    out->stage = stage;
    if ((st = pdp__zero_plan(m, world_size, &d, opt ? opt->nstate : 0, out, fn)) != PDP_OK)
        return st;
    r = &out->stages[stage];
    out->param_bytes = r->param_bytes;
    out->grad_bytes = r->grad_bytes;
    out->optim_bytes = r->optim_bytes;
    out->buffer_bytes = r->buffer_bytes;
    out->total_bytes = r->total_bytes;
    return PDP_OK;
}

/* The smallest N >= 2 from which a stage that shards c x Psi bytes and adds b buffers of
   4 U_max saves memory over DDP, (1 - 1/N) c Psi > 4 b U_max (U_max taken as it is
   now); 0: never (a unit this large outweighs what the shards can save). */
PDP__PRIVATE int pdp__zero_saves_from(double psi, double umax, double c, double b)
{
    double need = 4.0 * b * umax / c; /* (1 - 1/N) Psi must exceed it */
    if (need >= psi) return 0;
    return PDP__MAX(2, (int)floor(psi / (psi - need)) + 1);
}

/* snprintf at buf + len (the length so far, as snprintf counts it): the new length */
PDP__PRIVATE int pdp__zero_put(char *buf, size_t bytes, int len, const char *fmt, ...)
{
    va_list ap;
    char none[1];
    bool room = buf && (size_t)len < bytes;
    int n;
    va_start(ap, fmt);
    n = vsnprintf(room ? buf + len : none, room ? bytes - (size_t)len : sizeof none, fmt, ap);
    va_end(ap);
    return n < 0 ? len : len + n;
}

PDP_API int pdp_zero_memory_format(const pdp_zero_memory *m, char *buf, size_t bytes)
{
    static const char *fp32[4] = {"%g Psi", "8 Psi + %g Psi/N", "4 Psi + %g Psi/N", "%g Psi/N"};
    static const char *paper[4] = {"%g Psi", "4 Psi + %g Psi/N", "2 Psi + %g Psi/N", "%g Psi/N"};
    static const char *lead[4] = {"", " stage 1 saves", ", stage 2", " and stage 3"};
    double mb = 1e6, psi, u, k, kp, cf[4], cp[4];
    int s, n, len = 0, from;
    char a[32], b[32];
    if (!m || m->world_size < 1) return 0;
    if (buf && bytes) buf[0] = '\0';
    n = m->world_size;
    psi = (double)m->param_count;
    u = (double)m->unit_max;
    k = 4.0 * m->state_per_param;
    kp = 4.0 + k;
    /* each stage's Psi coefficient in the two forms; stage s >= 1 saves cf[0] - its first
       term, (1 - 1/N) x 8, 12, 16 Psi with Adam (k = 8) */
    cf[0] = 8 + k, cf[1] = k, cf[2] = 4 + k, cf[3] = 8 + k;
    cp[0] = 4 + kp, cp[1] = kp, cp[2] = 2 + kp, cp[3] = 4 + kp;
    len = pdp__zero_put(buf, bytes, len, "memory per rank, N = %d, Psi = %.0f (pdp: fp32 params "
                        "+ grads + %d optimizer state floats each; paper: mixed precision, K = "
                        "%.0f):\n", n, psi, m->state_per_param, kp);
    for (s = 0; s < 4; s++) {
        const pdp_zero_memory_stage *r = &m->stages[s];
        snprintf(a, sizeof a, fp32[s], cf[s]);
        snprintf(b, sizeof b, paper[s], cp[s]);
        len = pdp__zero_put(buf, bytes, len, "  stage %d  pdp fp32 %-16s = %6.2f MB | paper "
                            "%-16s = %6.2f MB | + buffers %d x 4 U_max = %5.2f MB\n", s, a,
                            r->fp32_bytes / mb, b, r->paper_bytes / mb, r->buffers,
                            (double)r->buffer_bytes / mb);
    }
    len = pdp__zero_put(buf, bytes, len, "%s, stage %d: params %.2f + grads %.2f + optimizer "
                        "%.2f + buffers %.2f = %.2f MB against DDP's %.2f MB: stage %d %s here\n",
                        m->measured ? "measured" : "planned", m->stage,
                        (double)m->param_bytes / mb, (double)m->grad_bytes / mb,
                        (double)m->optim_bytes / mb, (double)m->buffer_bytes / mb,
                        (double)m->total_bytes / mb, m->ddp_bytes / mb, m->stage,
                        m->stage == 0 ? "is the baseline"
                        : (double)m->total_bytes < m->ddp_bytes ? "saves memory"
                                                                : "does not save");
    len = pdp__zero_put(buf, bytes, len, "why: sharding saves (1 - 1/N) x %.0f, %.0f, %.0f Psi "
                        "(stages 1, 2, 3) and the buffers cost %d, %d, %d x 4 U_max, U_max = the "
                        "largest unit (%.0f parameters with padding, %.0f%% of the model: units "
                        "hold whole layers, so it does not shrink with N); a stage saves when its "
                        "saving exceeds its buffers: here, N = %d,", k, 4 + k, 8 + k,
                        m->stages[1].buffers, m->stages[2].buffers, m->stages[3].buffers, u,
                        100.0 * u / psi, n);
    for (s = 1; s < 4; s++) /* each stage's own comparison, in bytes */
        len = pdp__zero_put(buf, bytes, len, "%s stage %d %.2f MB against %.2f MB%s", s > 1 ? ","
                            : "", s, (1.0 - 1.0 / n) * (cf[0] - (s == 1 ? 8 : s == 2 ? 4 : 0)) *
                            psi / mb, 4.0 * m->stages[s].buffers * u / mb, s == 3 ? ";" : "");
    len = pdp__zero_put(buf, bytes, len, " so with this model");
    for (s = 1; s < 4; s++) {
        from = pdp__zero_saves_from(psi, u, cf[0] - (s == 1 ? 8 : s == 2 ? 4 : 0),
                                    m->stages[s].buffers);
        if (from) len = pdp__zero_put(buf, bytes, len, "%s from N = %d", lead[s], from);
        else len = pdp__zero_put(buf, bytes, len, "%s never", lead[s]);
    }
    return pdp__zero_put(buf, bytes, len, ".\n");
}

PDP_API void pdp_zero_get_stats(const pdp_zero *z, pdp_zero_stats *out)
{
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (z) *out = z->stats;
}
