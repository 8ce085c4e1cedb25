/* tp: tensor parallelism (see tp.h for the design): the model's TP communicator, the
   constructors of the four TP layer kinds and of sequence parallelism's three (their
   kernels are layers_tp.c) with the marking of the layers between them, statistics, the
   check that every TP rank built the same TP layers (run by f's forward, or the first
   sequence collective's, at the first forward, through the TP state's pointer:
   layers_tp.c comes first), and
   full-tensor checkpoints, which map each rank's slice into the full tensor
   (pdp__tp_runs) through a staging copy of the full (single-device) model.

   Invariants: the model's TP state (comm, rank, size) is fixed once a TP layer exists.
   During training only the width check runs here, at the first forward. */

#include "internal.h"

/* ---- tp: the model's communicator and the constructors ---- */

PDP_API pdp_status pdp_model_set_tp(pdp_model *m, pdp_comm *tp)
{
    pdp_status st;
    if (!m || !tp) return pdp__err(PDP_ERR_INVALID, "pdp_model_set_tp: NULL argument");
    if ((st = pdp__model_check_layout(m, "set the TP communicator before wrapping it",
                                      "pdp_model_set_tp")) != PDP_OK)
        return st;
    if (m->tp.nlayers)
        return pdp__err(PDP_ERR_STATE, "pdp_model_set_tp: the model already has %d TP layers "
                        "(set the communicator before the first)", m->tp.nlayers);
    if (tp->device.kind != m->device.kind || tp->device.ordinal != m->device.ordinal)
        return pdp__err(PDP_ERR_DEVICE, "pdp_model_set_tp: communicator '%s' on device %d:%d, "
                        "model on %d:%d", tp->name, tp->device.kind, tp->device.ordinal,
                        m->device.kind, m->device.ordinal);
    /* clipping's scalar on a CUDA model: NCCL all-reduces device memory only */
    if (m->device.kind != PDP_DEVICE_CPU && !m->tp.dscalar &&
        pdp__dev_alloc(m->device, sizeof(float), (void **)&m->tp.dscalar) != PDP_OK)
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "pdp_model_set_tp: no device memory for the "
                        "clipping scalar (device %d)", m->device.ordinal);
    m->tp.comm = tp;
    m->tp.rank = pdp_comm_rank(tp);
    m->tp.size = pdp_comm_size(tp);
    m->tp.model = m;
    m->tp.checked = 0;
    m->tp.check_widths = pdp__tp_check_widths;
    return PDP_OK;
}

PDP_API pdp_comm *pdp_model_tp(const pdp_model *m) { return m ? m->tp.comm : NULL; }

/* Appends TP layer l (kind and configuration set) to m. */
PDP__PRIVATE pdp_status pdp__tp_add(pdp_model *m, pdp__layer l, const char *fn)
{
    pdp_status st;
    l.tp = m->tp.comm ? &m->tp : NULL;
    if ((st = pdp__model_add(m, l, fn)) == PDP_OK) m->tp.nlayers++;
    return st;
}

/* The kind of m's last layer (-1: none). */
PDP__PRIVATE int pdp__tp_last_kind(const pdp_model *m)
{
    return m->nlayers ? (int)m->layers[m->nlayers - 1].kind : -1;
}

PDP_API pdp_status pdp_model_add_tp_copy(pdp_model *m)
{
    if (!m) return pdp__err(PDP_ERR_INVALID, "pdp_model_add_tp_copy: model is NULL");
    return pdp__tp_add(m, pdp__layer_of(PDP__TP_COPY), "pdp_model_add_tp_copy");
}

/* A ColumnParallelLinear whose output is parts blocks split alike (3: q | k | v, each
   split by heads: pdp_gpt_create's c_attn). */
PDP__PRIVATE pdp_status pdp__tp_add_column(pdp_model *m, int64_t out_features, int parts,
                                           const char *fn)
{
    pdp__layer l = pdp__layer_of(PDP__COLUMN_PARALLEL_LINEAR);
    pdp_status st;
    if (!m) return pdp__err(PDP_ERR_INVALID, "%s: model is NULL", fn);
    if ((st = pdp__model_check_layout(m, "add layers before wrapping it", fn)) != PDP_OK)
        return st; /* before the order checks: a wrapped model takes no layer at all */
    if (pdp__tp_last_kind(m) != PDP__TP_COPY &&
        !(pdp__tp_last_kind(m) == PDP__SEQ_GATHER && m->layers[m->nlayers - 1].tp_sum_dy))
        return pdp__err(PDP_ERR_STATE, "%s: layer %d must follow f (pdp_model_add_tp_copy), "
                        "not %s", fn, m->nlayers,
                        m->nlayers ? pdp_model_layer_name(m, m->nlayers - 1) : "the input");
    l.tp_full = out_features;
    l.tp_parts = parts;
    l.tp_skip_dx = m->nlayers == 1;
    return pdp__tp_add(m, l, fn);
}

PDP_API pdp_status pdp_model_add_column_parallel_linear(pdp_model *m, int64_t out_features)
{
    return pdp__tp_add_column(m, out_features, 1, "pdp_model_add_column_parallel_linear");
}

/* A CausalSelfAttention after a ColumnParallelLinear split by heads (q | k | v in three
   parts): the attention of this rank's heads, heads / TP size of them from head
   rank x heads / size (its dropout masks keyed by the global head, as on one device).
   heads must divide by the TP size. */
PDP__PRIVATE pdp_status pdp__tp_headwise(const pdp_model *m, pdp__layer *l, const char *fn)
{
    const pdp__layer *prev = m->nlayers ? &m->layers[m->nlayers - 1] : NULL;
    if (!prev || prev->tp_parts != 3 || !m->tp.comm) return PDP_OK; /* not on a TP shard */
    if (l->heads % m->tp.size != 0)
        return pdp__err(PDP_ERR_INVALID, "%s: %lld heads do not divide by the TP size %d: a rank "
                        "holds whole heads", fn, (long long)l->heads, m->tp.size);
    l->tp_full = l->heads;
    l->heads /= m->tp.size;
    l->tp_lo = (int64_t)m->tp.rank * l->heads;
    l->tp = (pdp__tp_state *)&m->tp;
    return PDP_OK;
}

PDP_API pdp_status pdp_model_add_row_parallel_linear(pdp_model *m, int64_t out_features)
{
    static const char *fn = "pdp_model_add_row_parallel_linear";
    pdp__layer l = pdp__layer_of(PDP__ROW_PARALLEL_LINEAR);
    pdp_status st;
    char names[160];
    int i;
    if (!m) return pdp__err(PDP_ERR_INVALID, "%s: model is NULL", fn);
    if ((st = pdp__model_check_layout(m, "add layers before wrapping it", fn)) != PDP_OK)
        return st; /* before the order checks: a wrapped model takes no layer at all */
    for (i = m->nlayers - 1; i >= 0; i--) { /* back over the element-wise kinds (the table's),
                                               or an attention of this rank's heads */
        const pdp__layer *k = &m->layers[i];
        if (k->kind == PDP__COLUMN_PARALLEL_LINEAR) break;
        if (!(pdp__layer_kind_of(k->kind)->flags & PDP__LAYER_ELEMENTWISE) &&
            !((pdp__layer_kind_of(k->kind)->flags & PDP__LAYER_HEADWISE) && k->tp))
            i = 0;
    }
    if (i < 0 || m->layers[i].kind != PDP__COLUMN_PARALLEL_LINEAR)
        return pdp__err(PDP_ERR_STATE, "%s: layer %d must follow a ColumnParallelLinear with only "
                        "element-wise activations (%s) between, or an attention split by heads",
                        fn, m->nlayers,
                        pdp__layer_kinds_with(PDP__LAYER_ELEMENTWISE, names, sizeof names));
    l.out_features = out_features;
    if (m->layers[i].tp_parts == 3) { /* the heads' outputs, q | k | v gone: C wide */
        l.tp_full = m->layers[i].tp_full / 3;
        l.tp_lo = m->layers[i].tp_lo;
    } else {
        l.tp_full = m->layers[i].tp_full;
        l.tp_lo = m->layers[i].tp_lo;
    }
    return pdp__tp_add(m, l, fn);
}

PDP_API pdp_status pdp_model_add_tp_reduce(pdp_model *m)
{
    static const char *fn = "pdp_model_add_tp_reduce";
    pdp_status st;
    if (!m) return pdp__err(PDP_ERR_INVALID, "%s: model is NULL", fn);
    if ((st = pdp__model_check_layout(m, "add layers before wrapping it", fn)) != PDP_OK)
        return st; /* before the order checks: a wrapped model takes no layer at all */
    if (pdp__tp_last_kind(m) != PDP__ROW_PARALLEL_LINEAR)
        return pdp__err(PDP_ERR_STATE, "%s: layer %d must follow a RowParallelLinear, not %s",
                        fn, m->nlayers,
                        m->nlayers ? pdp_model_layer_name(m, m->nlayers - 1) : "the input");
    return pdp__tp_add(m, pdp__layer_of(PDP__TP_REDUCE), fn);
}

/* Sequence parallelism's collectives (pdp_gpt_create's): kind PDP__SEQ_SCATTER (after
   the embedding), PDP__SEQ_GATHER (f before a block's ColumnParallelLinear: sum_dy; or
   before the replicated head) or PDP__SEQ_REDUCE_SCATTER (g, after a RowParallelLinear). */
PDP__PRIVATE pdp_status pdp__tp_add_sequence(pdp_model *m, pdp__layer_kind kind, bool sum_dy,
                                             const char *fn)
{
    pdp__layer l = pdp__layer_of(kind);
    if (kind == PDP__SEQ_REDUCE_SCATTER && pdp__tp_last_kind(m) != PDP__ROW_PARALLEL_LINEAR)
        return pdp__err(PDP_ERR_STATE, "%s: layer %d (ReduceScatterToSequenceParallelRegion) "
                        "must follow a RowParallelLinear, not %s", fn, m->nlayers,
                        m->nlayers ? pdp_model_layer_name(m, m->nlayers - 1) : "the input");
    l.tp_sum_dy = sum_dy;
    return pdp__tp_add(m, l, fn);
}

/* Marks the layers between a scatter (ScatterTo- or ReduceScatterToSequenceParallelRegion)
   and the next GatherFromSequenceParallelRegion as acting on this rank's positions
   (tp_seq, internal.h): their Dropout masks keyed from the slice's first element, their
   parameters' gradients summed over TP in backward, in the workspace ahead of what the
   layer itself uses there. Called by the builder once its last layer is added. */
PDP__PRIVATE void pdp__tp_mark_sequence(pdp_model *m)
{
    const pdp__layer *open = NULL;
    int i, p;
    for (i = 0; i < m->nlayers; i++) {
        pdp__layer *l = &m->layers[i];
        int64_t floats = 0;
        if (l->kind == PDP__SEQ_SCATTER || l->kind == PDP__SEQ_REDUCE_SCATTER) open = l;
        if (l->kind == PDP__SEQ_GATHER) open = NULL;
        if (!open || (pdp__layer_kind_of(l->kind)->flags & PDP__LAYER_COLLECTIVE)) continue;
        l->tp = &m->tp;
        l->tp_seq = true;
        l->tp_seq_lo = open->tp_seq_lo;
        l->mask_first = l->tp_seq_lo * l->in_shape[1];
        for (p = l->param_first; p < l->param_first + l->nparams; p++)
            floats += m->params[p].count;
        l->work_per_sample += floats; /* its parameters' gradients, then its own (layers_tp.c) */
    }
}

PDP_API void pdp_tp_get_stats(const pdp_model *m, pdp_tp_stats *out)
{
    if (!out) return;
    if (m) *out = m->tp.stats;
    else memset(out, 0, sizeof *out);
}

PDP_API void pdp_tp_reset_stats(pdp_model *m)
{
    if (m) memset(&m->tp.stats, 0, sizeof m->tp.stats);
}

/* ---- tp: full-tensor checkpoints ---- */

/* The single-device model of m: the same layers with f and g left out and the split
   Linears whole, on m's device (its parameters are overwritten by the caller). */
PDP__PRIVATE pdp_status pdp__tp_full_model(const pdp_model *m, pdp_model **out, const char *fn)
{
    pdp_model_desc md;
    pdp_model *full = NULL;
    pdp_status st;
    int i;
    int *at = NULL; /* layer i of m is layer at[i] of full */
    memset(&md, 0, sizeof md);
    md.input_ndim = m->in_ndim;
    memcpy(md.input_shape, m->in_shape, sizeof md.input_shape);
    md.seed = m->seed;
    md.device = m->device;
    md.input_dtype = m->in_dtype;
    if ((st = pdp_model_create(&full, &md)) != PDP_OK) return pdp__err_wrap(st, "%s", fn);
    if (!(at = (int *)pdp__calloc((size_t)PDP__MAX(1, m->nlayers) * sizeof *at))) {
        pdp_model_free(full);
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory", fn);
    }
    for (i = 0; i < m->nlayers; i++) {
        pdp__layer l = m->layers[i];
        at[i] = full->nlayers;
        if (pdp__layer_kind_of(l.kind)->flags & PDP__LAYER_COLLECTIVE)
            continue; /* f and g */
        if (l.kind == PDP__COLUMN_PARALLEL_LINEAR) l.out_features = l.tp_full;
        if (l.kind == PDP__COLUMN_PARALLEL_LINEAR || l.kind == PDP__ROW_PARALLEL_LINEAR)
            l.kind = PDP__LINEAR;
        if ((pdp__layer_kind_of(l.kind)->flags & PDP__LAYER_HEADWISE) && l.tp)
            l.heads = l.tp_full; /* every head */
        l.tp_seq = false; /* the whole sequence */
        l.tp_seq_lo = l.mask_first = 0;
        if (pdp__layer_kind_of(l.kind)->flags & PDP__LAYER_SKIP)
            l.residual_from = at[l.residual_from];
        l.tp = NULL;
        l.tp_parts = 0;
        if ((st = pdp__model_add(full, l, fn)) != PDP_OK) {
            pdp__dealloc(at);
            pdp_model_free(full);
            return st;
        }
    }
    pdp__dealloc(at);
    for (i = 0; i < m->nparams; i++) /* a builder's names (pdp_gpt_create's) */
        snprintf(full->params[i].name, sizeof full->params[i].name, "%s", m->params[i].name);
    full->step = m->step;
    *out = full;
    return PDP_OK;
}

/* Copies between parameter p's slice (local, in m's block layout) and its full tensor
   (full), to_full or back, on device d: the contiguous runs of the slice. Replicated
   parameters are one run of the whole tensor. */
PDP__PRIVATE pdp_status pdp__tp_runs(const pdp_model *m, int p, pdp_device d, float *full,
                                     float *local, bool to_full)
{
    const pdp__param_entry *e = &m->params[p];
    const pdp__layer *l = pdp__tp_param_layer(m, p); /* a stage's: full's numbers */
    bool weight = p == l->param_first;
    int64_t rows = 1, len = e->count, fstride = 0, lstride = 0, foff = 0, i;
    int64_t in = l->in_shape[l->in_ndim - 1]; /* a position's features */
    pdp_status st;
    if (l->kind == PDP__COLUMN_PARALLEL_LINEAR) { /* rows [lo, lo + n) of each part of [H, in],
                                                     b[lo..] of each part */
        int64_t parts = l->tp_parts > 1 ? l->tp_parts : 1, row = weight ? in : 1;
        rows = parts;
        len = e->count / parts;
        fstride = l->tp_full / parts * row;
        lstride = len;
        foff = l->tp_lo * row;
    } else if (l->kind == PDP__ROW_PARALLEL_LINEAR && weight) { /* columns of [d, H] */
        rows = l->out_features;
        len = in;
        fstride = l->tp_full;
        lstride = len;
        foff = l->tp_lo;
    }
    for (i = 0; i < rows; i++) {
        float *f = full + foff + i * fstride, *s = local + i * lstride;
        size_t bytes = (size_t)len * sizeof(float);
        st = to_full ? pdp__dev_copy(d, f, d, s, bytes) : pdp__dev_copy(d, s, d, f, bytes);
        if (st != PDP_OK) return st;
    }
    return PDP_OK;
}

/* ---- tp: the width check ---- */

/* A TP layer as the check compares it: its place, its kind and its full (unsplit)
   input and output features. */
typedef struct pdp__tp_sig {
    int64_t layer, kind, in, out;
    int64_t heads; /* a layer split by heads (attention): its heads on this rank; else 0 */
} pdp__tp_sig;

/* What a rank found: its TP layer count and, at the first TP layer that differs from TP
   rank 0's (at; -1: none), its own (zeros when it has none there). */
typedef struct pdp__tp_verdict {
    int64_t at, count;
    pdp__tp_sig sig;
    uint64_t replicated; /* pdp__tp_replicated_hash */
} pdp__tp_verdict;

PDP__PRIVATE bool pdp__tp_kind(pdp__layer_kind k)
{
    return k == PDP__TP_COPY || k == PDP__TP_REDUCE || k == PDP__COLUMN_PARALLEL_LINEAR ||
           k == PDP__ROW_PARALLEL_LINEAR || k == PDP__SEQ_SCATTER || k == PDP__SEQ_GATHER ||
           k == PDP__SEQ_REDUCE_SCATTER;
}

/* The layers the width check compares: the TP kinds above and the layers split by heads
   (attention: the same widths hold 2 heads of 4 or 1 of 8, another model). */
PDP__PRIVATE bool pdp__tp_checked(const pdp__layer *l)
{
    return pdp__tp_kind(l->kind) || l->heads > 0;
}

/* m's checked layers (a pipeline stage's tp.nlayers counts others too). */
PDP__PRIVATE int64_t pdp__tp_count(const pdp_model *m)
{
    int64_t n = 0;
    int i;
    for (i = 0; i < m->nlayers; i++) n += pdp__tp_checked(&m->layers[i]);
    return n;
}

/* The signature of m's k-th TP layer; false when it has fewer. */
PDP__PRIVATE bool pdp__tp_sig_at(const pdp_model *m, int64_t k, pdp__tp_sig *s)
{
    int i;
    memset(s, 0, sizeof *s);
    for (i = 0; i < m->nlayers; i++) {
        const pdp__layer *l = &m->layers[i];
        if (!pdp__tp_checked(l) || k-- > 0) continue;
        s->layer = i;
        s->kind = (int64_t)l->kind;
        s->heads = l->heads;
        s->in = l->kind == PDP__ROW_PARALLEL_LINEAR ? l->tp_full : l->in_shape[l->in_ndim - 1];
        s->out = l->kind == PDP__COLUMN_PARALLEL_LINEAR ? l->tp_full
                 : l->kind == PDP__ROW_PARALLEL_LINEAR  ? l->out_features
                                                        : l->out_count;
        return true;
    }
    return false;
}

/* "layer 1 (ColumnParallelLinear) 6 -> 12" */
PDP__PRIVATE void pdp__tp_sig_str(const pdp__tp_sig *s, char *out, size_t cap)
{
    int n = snprintf(out, cap, "layer %lld (%s) %lld -> %lld", (long long)s->layer,
                     pdp__layer_kind_name((pdp__layer_kind)s->kind), (long long)s->in,
                     (long long)s->out);
    if (s->heads > 0 && n > 0 && (size_t)n < cap)
        snprintf(out + n, cap - (size_t)n, ", %lld heads", (long long)s->heads);
}

/* A hash of the tensors every TP rank holds whole (embeddings, LayerNorms, the
   row-parallel Linears' biases), which must be the same bits on every TP rank: a rank built
   from another seed would train other weights there, silently. */
PDP__PRIVATE pdp_status pdp__tp_replicated_hash(const pdp_model *m, uint64_t *out)
{
    return pdp__model_param_hash(m, pdp__tp_is_split, out);
}

/* As the DDP reducer checks its parameters (reducer.c): TP rank 0's count and table go
   to every rank, each rank compares, and every rank's verdict goes to every rank (one
   small broadcast from each), so all fail together with the same message. */
PDP__PRIVATE pdp_status pdp__tp_check_widths(pdp__tp_state *tp)
{
    const pdp_model *m = tp->model;
    int64_t n0 = pdp__tp_count(m), mine_n = n0, k;
    pdp__tp_sig *table = NULL, mine;
    pdp__tp_verdict *all = NULL, *bad = NULL;
    pdp_status st;
    int r, bad_rank = -1;
    char a[128], b[128];
    if ((st = pdp_comm_broadcast_bytes(tp->comm, &n0, sizeof n0, 0)) != PDP_OK)
        return pdp__err_wrap(st, "TP width check (TP rank %d of %d)", tp->rank, tp->size);
    if (n0 < 0 || n0 > (1 << 24))
        return pdp__err(PDP_ERR_INVALID, "TP width check: TP rank 0 reports %lld TP layers",
                        (long long)n0);
    table = (pdp__tp_sig *)pdp__calloc((size_t)PDP__MAX(1, n0) * sizeof *table);
    all = (pdp__tp_verdict *)pdp__calloc((size_t)tp->size * sizeof *all);
    if (!table || !all) {
        st = pdp__err(PDP_ERR_OUT_OF_MEMORY, "TP width check: no memory for %lld signatures",
                      (long long)n0);
        goto out; /* the others time out in the next broadcast */
    }
    if (tp->rank == 0)
        for (k = 0; k < n0; k++) pdp__tp_sig_at(m, k, &table[k]);
    if ((st = pdp_comm_broadcast_bytes(tp->comm, table, (size_t)n0 * sizeof *table, 0)) != PDP_OK)
        goto comm_failed;
    all[tp->rank].at = -1;
    all[tp->rank].count = mine_n;
    if ((st = pdp__tp_replicated_hash(m, &all[tp->rank].replicated)) != PDP_OK)
        goto out; /* the others time out in the next broadcast */
    for (k = 0; k <= PDP__MAX(n0, mine_n); k++) {
        bool have = pdp__tp_sig_at(m, k, &mine);
        if (k < n0 && have && memcmp(&mine, &table[k], sizeof mine) == 0) continue;
        if (k < n0 || have) {
            all[tp->rank].at = k;
            all[tp->rank].sig = mine;
        }
        break;
    }
    for (r = 0; r < tp->size; r++)
        if ((st = pdp_comm_broadcast_bytes(tp->comm, &all[r], sizeof all[r], r)) != PDP_OK)
            goto comm_failed;
    for (r = 0; r < tp->size && !bad; r++)
        if (all[r].at >= 0) bad = &all[bad_rank = r];
    if (!bad) {
        for (r = 1; r < tp->size && st == PDP_OK; r++)
            if (all[r].replicated && all[0].replicated && all[r].replicated != all[0].replicated)
                st = pdp__err(PDP_ERR_INVALID, "TP ranks built different models: the tensors "
                              "every TP rank holds whole (embeddings, LayerNorms, row-parallel "
                              "biases) differ between TP rank %d and TP rank 0 (build each from "
                              "the same seed: a TP GPT is drawn whole, then split)", r);
        if (st == PDP_OK) tp->checked = tp->nlayers;
        goto out;
    }
    if (bad->at < bad->count && bad->at < n0) {
        pdp__tp_sig_str(&bad->sig, a, sizeof a);
        pdp__tp_sig_str(&table[bad->at], b, sizeof b);
        st = pdp__err(PDP_ERR_INVALID, "TP ranks built different models: %s on TP rank %d but "
                      "%s on TP rank 0 (full features, in -> out)", a, bad_rank, b);
    } else { /* the same layers as far as the shorter goes */
        bool extra_mine = bad->at < bad->count;
        pdp__tp_sig_str(extra_mine ? &bad->sig : &table[bad->at], a, sizeof a);
        st = pdp__err(PDP_ERR_INVALID, "TP ranks built different models: %lld TP layers on TP "
                      "rank %d but %lld on TP rank 0 (the first extra: %s on TP rank %d)",
                      (long long)bad->count, bad_rank, (long long)n0, a,
                      extra_mine ? bad_rank : 0);
    }
    goto out;
comm_failed:
    st = pdp__err_wrap(st, "TP width check (TP rank %d of %d)", tp->rank, tp->size);
out:
    pdp__dealloc(table);
    pdp__dealloc(all);
    return st;
}

/* dst (full's layout) <- the full tensors from every rank's slices of src (m's layout):
   each rank writes its slices (rank 0 also the replicated tensors) into zeros, and one
   all-reduce sums them. */
PDP__PRIVATE pdp_status pdp__tp_gather(const pdp_model *m, const pdp_model *full, const float *src,
                                       float *dst)
{
    int p;
    pdp_status st;
    if ((st = pdp__dev_memset0(m->device, dst, (size_t)full->param_count * sizeof(float))))
        return st;
    for (p = 0; p < m->nparams; p++)
        if ((m->tp.rank == 0 || pdp__tp_is_split(m, p)) &&
            (st = pdp__tp_runs(m, p, m->device, dst + full->params[p].offset,
                               (float *)src + m->params[p].offset, true)) != PDP_OK)
            return st;
    return pdp_comm_allreduce(m->tp.comm, dst, full->param_count, PDP_REDUCE_SUM, NULL);
}

/* dst (m's layout) <- this rank's slices of src (full's layout). */
PDP__PRIVATE pdp_status pdp__tp_scatter(const pdp_model *m, const pdp_model *full, const float *src,
                                        float *dst)
{
    int p;
    pdp_status st;
    for (p = 0; p < m->nparams; p++)
        if ((st = pdp__tp_runs(m, p, m->device, (float *)src + full->params[p].offset,
                               dst + m->params[p].offset, false)) != PDP_OK)
            return st;
    return PDP_OK;
}

PDP__PRIVATE pdp_status pdp__tp_ckpt_args(const pdp_model *m, const pdp_optim *o, const char *fn)
{
    if (!m) return pdp__err(PDP_ERR_INVALID, "%s: model is NULL", fn);
    if (!m->tp.comm)
        return pdp__err(PDP_ERR_STATE, "%s: the model has no TP communicator (pdp_model_set_tp; "
                        "pdp_checkpoint_save/load serve a plain model)", fn);
    if (m->wrapped == PDP__WRAP_ZERO)
        return pdp__err(PDP_ERR_UNSUPPORTED, "%s: the model is wrapped by %s, which shards its "
                        "parameters and optimizer state: checkpoints of ZeRO over tensor "
                        "parallelism are not supported yet", fn, pdp__model_wrapper(m));
    if (o && (o->model != m || o->lo != 0 || o->hi != m->param_count))
        return pdp__err(PDP_ERR_INVALID, "%s: the optimizer is not a full optimizer of this "
                        "model", fn);
    return PDP_OK;
}

PDP_API pdp_status pdp_tp_checkpoint_save(const char *path, const pdp_model *m,
                                          const pdp_optim *o)
{
    static const char *fn = "pdp_tp_checkpoint_save";
    pdp_model *full = NULL;
    pdp_optim *fo = NULL;
    pdp_status st;
    int32_t root_st;
    int k;
    if ((st = pdp__tp_ckpt_args(m, o, fn)) != PDP_OK) return st;
    if ((st = pdp__model_check_whole(m, fn)) != PDP_OK) return st;
    if ((st = pdp__tp_full_model(m, &full, fn)) != PDP_OK) return st;
    if ((st = pdp__tp_gather(m, full, m->param_block, full->param_block)) != PDP_OK) goto out;
    if (o) {
        if ((st = pdp_optim_create(&fo, full, &o->desc)) != PDP_OK) goto out;
        fo->steps = o->steps;
        for (k = 0; k < o->nstate; k++)
            if ((st = pdp__tp_gather(m, full, o->state[k], fo->state[k])) != PDP_OK) goto out;
    }
    st = m->tp.rank == 0 ? pdp_checkpoint_save(path, full, fo) : PDP_OK;
    root_st = (int32_t)st;
    if ((st = pdp_comm_broadcast_bytes(m->tp.comm, &root_st, sizeof root_st, 0)) != PDP_OK)
        goto out;
    if (m->tp.rank != 0 && root_st != PDP_OK)
        st = pdp__err((pdp_status)root_st, "%s: TP rank 0 could not write %s", fn, path);
    else
        st = (pdp_status)root_st;
out:
    pdp_optim_free(fo);
    pdp_model_free(full);
    if (st != PDP_OK && strncmp(pdp_last_error(), fn, strlen(fn)) != 0)
        return pdp__err_wrap(st, "%s", fn);
    return st;
}

/* *failed <- the number of TP ranks passing failed = true (an all-reduce of one float on
   the communicator's device). On failure the message is set. */
PDP__PRIVATE pdp_status pdp__tp_count_failed(const pdp_model *m, bool failed, float *count)
{
    float *buf = NULL, one = failed ? 1.0f : 0.0f;
    pdp_status st;
    if ((st = pdp__dev_alloc(m->device, sizeof(float), (void **)&buf)) != PDP_OK) return st;
    if ((st = pdp__dev_copy(m->device, buf, pdp_cpu(), &one, sizeof one)) == PDP_OK &&
        (st = pdp_comm_allreduce(m->tp.comm, buf, 1, PDP_REDUCE_SUM, NULL)) == PDP_OK)
        st = pdp__dev_copy(pdp_cpu(), count, m->device, buf, sizeof *count);
    pdp__dev_free(m->device, buf);
    return st;
}

PDP_API pdp_status pdp_tp_checkpoint_load(const char *path, pdp_model *m, pdp_optim *o)
{
    static const char *fn = "pdp_tp_checkpoint_load";
    pdp_model *full = NULL;
    pdp_optim *fo = NULL;
    pdp_status st, mine;
    float failed;
    int k;
    if ((st = pdp__tp_ckpt_args(m, o, fn)) != PDP_OK) return st;
    if ((mine = pdp__tp_full_model(m, &full, fn)) == PDP_OK && o)
        mine = pdp_optim_create(&fo, full, &o->desc);
    if (mine == PDP_OK) mine = pdp_checkpoint_load(path, full, fo);
    /* every rank learns whether any failed before anything is changed */
    if ((st = pdp__tp_count_failed(m, mine != PDP_OK, &failed)) != PDP_OK) {
        st = pdp__err_wrap(st, "%s", fn);
        goto out;
    }
    if (mine != PDP_OK) {
        st = mine;
        goto out;
    }
    if (failed > 0.0f) {
        st = pdp__err_peer(PDP_ERR_IO, "%s: %s: %g other TP ranks could not load it (nothing "
                           "changed)", fn, path, (double)failed);
        goto out;
    }
    if ((st = pdp__tp_scatter(m, full, full->param_block, m->param_block)) != PDP_OK) goto out;
    if (o) {
        for (k = 0; k < o->nstate; k++)
            if ((st = pdp__tp_scatter(m, full, fo->state[k], o->state[k])) != PDP_OK) goto out;
        o->desc = fo->desc;
        o->steps = fo->steps;
    }
    m->step = full->step;
    m->sliced_world = m->sliced_rank = 0; /* every slice written: whole again */
out:
    pdp_optim_free(fo);
    pdp_model_free(full);
    if (st != PDP_OK && strncmp(pdp_last_error(), fn, strlen(fn)) != 0)
        return pdp__err_wrap(st, "%s", fn);
    return st;
}
