/* layers_tp: the layer kinds of tensor parallelism (tp.h has the design): f and g, the
   conjugate operators, the column- and row-parallel Linears, and sequence parallelism's
   three collectives and the backward of a LayerNorm on a rank's positions, as entries of
   layers_table.c. The API around them (the model's TP communicator, constructors,
   statistics, full-tensor checkpoints) is tp.c.

   The split Linears ARE Linear (layers.c's kernels, CPU and CUDA) on this rank's
   slice: a ColumnParallelLinear is a Linear of n_r outputs, a RowParallelLinear a
   Linear of n_r inputs whose bias only TP rank 0 adds. What is theirs is the slice:
   setup computes it (pdp_tp_split), init draws the full tensors from the model's
   generator in the plain Linear's order and keeps the slice. f and g are collective
   kinds (PDP__LAYER_COLLECTIVE): one host entry for every device that copies the
   activation and all-reduces it on the TP communicator, synchronously.

   Invariants: every rank of the TP communicator has the same layers in the same order,
   so f and g issue the same all-reduces in the same order; after g every rank holds
   the same bits. Nothing here allocates after the first forward, whose f runs the width
   check (tp.c: every TP rank built the same TP layers). */

#include "internal.h"

/* ---- tp: splits ---- */

PDP_API void pdp_tp_split(int64_t full, int rank, int size, int64_t *lo, int64_t *count)
{
    int64_t base, extra;
    if (size < 1) size = 1;
    base = full / size;
    extra = full % size;
    if (lo) *lo = rank * base + PDP__MIN((int64_t)rank, extra);
    if (count) *count = base + (rank < extra);
}

/* The layer that owns parameter p of m. A pipeline stage's parameters keep the full model's
   layer numbers and its layers are consecutive; an interleaved stage's (pp.c's joined
   chunks) are runs with gaps between them, found by a search. */
PDP__PRIVATE const pdp__layer *pdp__tp_param_layer(const pdp_model *m, int p)
{
    int want = m->params[p].layer, i = want - m->layers[0].index;
    if (i < 0 || i >= m->nlayers || m->layers[i].index != want)
        for (i = 0; i < m->nlayers - 1 && m->layers[i].index != want; i++) {}
    PDP_ASSERT(m->layers[i].index == want);
    return &m->layers[i];
}

/* Whether parameter p of m is split across the TP ranks: the column-parallel weight and
   bias, the row-parallel weight; every other parameter (the row-parallel bias, every
   non-TP layer's) is whole on every TP rank. */
PDP__PRIVATE bool pdp__tp_is_split(const pdp_model *m, int p)
{
    const pdp__layer *l = pdp__tp_param_layer(m, p);
    return l->kind == PDP__COLUMN_PARALLEL_LINEAR ||
           (l->kind == PDP__ROW_PARALLEL_LINEAR && p == l->param_first);
}

/* ---- tp: f and g, the conjugate operators ---- */

/* The TP all-reduce (sum, synchronous) of count floats at buf, counted in the stats;
   what: "g forward" or "f backward", for messages. */
PDP__PRIVATE pdp_status pdp__tp_allreduce(const pdp__layer *l, float *buf, int64_t batch,
                                          int64_t width, bool forward)
{
    pdp__tp_state *tp = l->tp;
    double t0 = pdp__now(), n = (double)tp->size;
    int64_t bytes = batch * width * (int64_t)sizeof(float);
    pdp_status st = pdp_comm_allreduce(tp->comm, buf, batch * width, PDP_REDUCE_SUM, NULL);
    if (st != PDP_OK)
        return pdp__err_wrap(st, "%s: all-reduce of %lld x %lld activations (TP rank %d of %d)",
                             forward ? "g forward" : "f backward", (long long)batch,
                             (long long)width, tp->rank, tp->size);
    if (forward) {
        tp->stats.forward_allreduces++;
        tp->stats.forward_bytes += bytes;
    } else {
        tp->stats.backward_allreduces++;
        tp->stats.backward_bytes += bytes;
    }
    tp->stats.bytes_sent += (int64_t)(2.0 * (n - 1.0) / n * (double)bytes);
    tp->stats.allreduce_s += pdp__now() - t0;
    return PDP_OK;
}

/* dst <- src, count floats on io's device. */
PDP__PRIVATE pdp_status pdp__tp_copy(const pdp__layer_io *io, float *dst, const float *src,
                                     int64_t count)
{
    return pdp__dev_copy(io->device, dst, io->device, src, (size_t)count * sizeof(float));
}

PDP__PRIVATE pdp_status pdp__tp_op_setup(pdp__layer *l, const char *in)
{
    if (!l->tp)
        return pdp__err(PDP_ERR_STATE, "no TP communicator (call pdp_model_set_tp first; input %s)",
                        in);
    return PDP_OK;
}

PDP__PRIVATE pdp_status pdp__tp_copy_setup(pdp__layer *l, pdp__param_shapes *ps, const char *in)
{
    (void)ps;
    return pdp__tp_op_setup(l, in);
}

PDP__PRIVATE pdp_status pdp__tp_reduce_setup(pdp__layer *l, pdp__param_shapes *ps, const char *in)
{
    (void)ps;
    return pdp__tp_op_setup(l, in);
}

/* f forward: identity. At the first forward (and after TP layers were added) the width
   check first: every TP rank built the same TP layers (f is the first TP layer of every
   block, so every rank reaches it before any other TP collective). */
PDP__PRIVATE pdp_status pdp__tp_copy_forward(const pdp__layer *l, const pdp__layer_io *io)
{
    pdp_status st;
    if (l->tp->checked != l->tp->nlayers && (st = l->tp->check_widths(l->tp)) != PDP_OK)
        return st;
    return pdp__tp_copy(io, io->y, io->x, io->batch * l->in_count);
}

/* f backward: the input gradient is the sum of every rank's partial gradient (each rank's
   ColumnParallelLinear saw only its output slice). Nothing when no input gradient is
   needed (f is the first layer): every rank skips it alike. */
PDP__PRIVATE pdp_status pdp__tp_copy_backward(const pdp__layer *l, const pdp__layer_io *io)
{
    pdp_status st;
    if (!io->dx) return PDP_OK;
    if ((st = pdp__tp_copy(io, io->dx, io->dy, io->batch * l->in_count)) != PDP_OK) return st;
    return pdp__tp_allreduce(l, io->dx, io->batch, l->in_count, false);
}

/* g forward: the sum of every rank's partial output (RowParallelLinear's x_r W_r^T). */
PDP__PRIVATE pdp_status pdp__tp_reduce_forward(const pdp__layer *l, const pdp__layer_io *io)
{
    pdp_status st;
    if ((st = pdp__tp_copy(io, io->y, io->x, io->batch * l->in_count)) != PDP_OK) return st;
    return pdp__tp_allreduce(l, io->y, io->batch, l->in_count, true);
}

/* g backward: identity (the output gradient is replicated). */
PDP__PRIVATE pdp_status pdp__tp_reduce_backward(const pdp__layer *l, const pdp__layer_io *io)
{
    return io->dx ? pdp__tp_copy(io, io->dx, io->dy, io->batch * l->in_count) : PDP_OK;
}

/* ---- tp: sequence parallelism's collectives ----
   Between the TP blocks each rank holds Tl = T / N positions of every [T, C] sample (from
   tp_seq_lo = rank x Tl): its batch is [B, Tl, C], the full one [B, T, C]. The
   communicator's all-gather and reduce-scatter concatenate the ranks' blocks, [N, B, Tl,
   C]; pdp__tp_seq_permute moves between that and [B, T, C] in the workspace (B = 1: the
   same layout, no copy). Megatron-LM keeps [T, B, C] so that it needs none. */

/* The floats of one sample's slice (Tl x C): the smaller side of the layer. */
PDP__PRIVATE int64_t pdp__tp_seq_slice(const pdp__layer *l)
{
    return PDP__MIN(l->in_count, l->out_count);
}

/* to_ranks: dst [N, B, slice] <- src [B, N, slice]; else the reverse. */
PDP__PRIVATE pdp_status pdp__tp_seq_permute(const pdp__layer *l, const pdp__layer_io *io,
                                            float *dst, const float *src, bool to_ranks)
{
    int64_t n = pdp__tp_seq_slice(l), B = io->batch, b, r;
    pdp_status st;
    for (b = 0; b < B; b++)
        for (r = 0; r < l->tp->size; r++) {
            int64_t ranks = (r * B + b) * n, samples = (b * l->tp->size + r) * n;
            if ((st = pdp__tp_copy(io, dst + (to_ranks ? ranks : samples),
                                   src + (to_ranks ? samples : ranks), n)) != PDP_OK)
                return st;
        }
    return PDP_OK;
}

/* Counts one sequence collective of the full tensor (batch x T x width floats) in the stats,
   t0 its start. */
PDP__PRIVATE void pdp__tp_seq_count(const pdp__layer *l, int64_t batch, bool gather, double t0)
{
    pdp__tp_state *tp = l->tp;
    double n = (double)tp->size;
    int64_t bytes = batch * pdp__tp_seq_slice(l) * tp->size * (int64_t)sizeof(float);
    if (gather) {
        tp->stats.allgathers++;
        tp->stats.allgather_bytes += bytes;
    } else {
        tp->stats.reduce_scatters++;
        tp->stats.reduce_scatter_bytes += bytes;
    }
    tp->stats.bytes_sent += (int64_t)((n - 1.0) / n * (double)bytes);
    tp->stats.allreduce_s += pdp__now() - t0;
}

/* full [B, T, C] <- every rank's slice [B, Tl, C]; what names the step for messages. */
PDP__PRIVATE pdp_status pdp__tp_seq_allgather(const pdp__layer *l, const pdp__layer_io *io,
                                              const float *slice, float *full, const char *what)
{
    double t0 = pdp__now();
    float *buf = io->batch == 1 ? full : io->work;
    pdp_status st = pdp_comm_allgather(l->tp->comm, slice, buf,
                                       io->batch * pdp__tp_seq_slice(l), NULL);
    if (st == PDP_OK && buf != full) st = pdp__tp_seq_permute(l, io, full, buf, false);
    if (st != PDP_OK)
        return pdp__err_wrap(st, "%s: all-gather of %lld x %lld activations (TP rank %d of %d)",
                             what, (long long)io->batch, (long long)pdp__tp_seq_slice(l),
                             l->tp->rank, l->tp->size);
    pdp__tp_seq_count(l, io->batch, true, t0);
    return PDP_OK;
}

/* slice [B, Tl, C] <- this rank's positions of the sum over the ranks of full [B, T, C]. */
PDP__PRIVATE pdp_status pdp__tp_seq_reduce_scatter(const pdp__layer *l, const pdp__layer_io *io,
                                                   const float *full, float *slice,
                                                   const char *what)
{
    double t0 = pdp__now();
    const float *buf = full;
    pdp_status st = PDP_OK;
    if (io->batch > 1) {
        st = pdp__tp_seq_permute(l, io, io->work, full, true);
        buf = io->work;
    }
    if (st == PDP_OK)
        st = pdp_comm_reduce_scatter(l->tp->comm, buf, slice, io->batch * pdp__tp_seq_slice(l),
                                     PDP_REDUCE_SUM, NULL);
    if (st != PDP_OK)
        return pdp__err_wrap(st, "%s: reduce-scatter of %lld x %lld activations (TP rank %d of "
                             "%d)", what, (long long)io->batch,
                             (long long)pdp__tp_seq_slice(l), l->tp->rank, l->tp->size);
    pdp__tp_seq_count(l, io->batch, false, t0);
    return PDP_OK;
}

/* dst [B, Tl, C] <- this rank's positions of src [B, T, C] (replicated). */
PDP__PRIVATE pdp_status pdp__tp_seq_split(const pdp__layer *l, const pdp__layer_io *io,
                                          const float *src, float *dst)
{
    int64_t n = pdp__tp_seq_slice(l), b;
    pdp_status st;
    for (b = 0; b < io->batch; b++)
        if ((st = pdp__tp_copy(io, dst + b * n, src + (b * l->tp->size + l->tp->rank) * n, n)) !=
            PDP_OK)
            return st;
    return PDP_OK;
}

/* The three kinds: a [T, C] sample in, [T / N, C] out (Scatter, ReduceScatter), or the
   reverse (Gather); T must divide by the TP size. The workspace holds the full tensor
   (the permutation). */
PDP__PRIVATE pdp_status pdp__tp_seq_setup(pdp__layer *l, pdp__param_shapes *ps, const char *in)
{
    bool gather = l->kind == PDP__SEQ_GATHER;
    int64_t T = l->in_shape[0], n;
    pdp_status st;
    (void)ps;
    if ((st = pdp__tp_op_setup(l, in)) != PDP_OK) return st;
    n = l->tp->size;
    if (l->in_ndim != 2)
        return pdp__err(PDP_ERR_SHAPE, "needs [T, C] samples (a sequence of positions), got %s",
                        in);
    if (!gather && T % n != 0)
        return pdp__err(PDP_ERR_INVALID, "sequence T %lld does not divide by the TP size %lld: "
                        "each rank holds T / N positions (input %s)", (long long)T, (long long)n,
                        in);
    l->out_shape[0] = gather ? T * n : T / n;
    l->tp_seq_lo = l->tp->rank * PDP__MIN(T, l->out_shape[0]);
    l->work_per_sample = PDP__MAX(T, l->out_shape[0]) * l->in_shape[1];
    return PDP_OK;
}

/* The width check (tp.c) before the first sequence collective of a forward, as f's. */
PDP__PRIVATE pdp_status pdp__tp_seq_check(const pdp__layer *l)
{
    return l->tp->checked != l->tp->nlayers ? l->tp->check_widths(l->tp) : PDP_OK;
}

/* ScatterToSequenceParallelRegion (after the embedding): forward keeps this rank's
   positions of the replicated input; backward all-gathers the slices' gradients. A
   ReduceScatterToSequenceParallelRegion (g) has the same backward. */
PDP__PRIVATE pdp_status pdp__tp_seq_scatter_forward(const pdp__layer *l, const pdp__layer_io *io)
{
    pdp_status st;
    if ((st = pdp__tp_seq_check(l)) != PDP_OK) return st;
    return pdp__tp_seq_split(l, io, io->x, io->y);
}

PDP__PRIVATE pdp_status pdp__tp_seq_scatter_backward(const pdp__layer *l, const pdp__layer_io *io)
{
    if (!io->dx) return PDP_OK;
    return pdp__tp_seq_allgather(l, io, io->dy, io->dx,
                                 l->kind == PDP__SEQ_SCATTER ? "scatter backward" : "g backward");
}

/* GatherFromSequenceParallelRegion: forward all-gathers the sequence. Backward, as f
   (tp_sum_dy: a ColumnParallelLinear follows, whose input gradient is this rank's partial
   sum), reduce-scatters; before replicated layers (the head) it keeps this rank's slice of
   the replicated gradient. */
PDP__PRIVATE pdp_status pdp__tp_seq_gather_forward(const pdp__layer *l, const pdp__layer_io *io)
{
    pdp_status st;
    if ((st = pdp__tp_seq_check(l)) != PDP_OK) return st;
    return pdp__tp_seq_allgather(l, io, io->x, io->y, l->tp_sum_dy ? "f forward" : "gather");
}

PDP__PRIVATE pdp_status pdp__tp_seq_gather_backward(const pdp__layer *l, const pdp__layer_io *io)
{
    if (!io->dx) return PDP_OK;
    if (!l->tp_sum_dy) return pdp__tp_seq_split(l, io, io->dy, io->dx);
    return pdp__tp_seq_reduce_scatter(l, io, io->dy, io->dx, "f backward");
}

/* ReduceScatterToSequenceParallelRegion (g): forward sums the RowParallelLinear's partial
   outputs and keeps this rank's positions. */
PDP__PRIVATE pdp_status pdp__tp_seq_reduce_scatter_forward(const pdp__layer *l,
                                                           const pdp__layer_io *io)
{
    return pdp__tp_seq_reduce_scatter(l, io, io->x, io->y, "g forward");
}

/* A LayerNorm (any tp_seq layer with parameters) on this rank's positions: its weight and
   bias gradients over them go to the workspace, one all-reduce over TP sums the ranks'
   (Megatron-LM sums the same gradients, once a step), and the sum is added to dw and db,
   so every rank accumulates the full sequence's gradient, the same bits, before any
   executor hears that the gradient is ready. The layer's own workspace (LayerNorm's chunk
   shares) follows them (pdp__tp_mark_sequence sizes the sum). */
PDP__PRIVATE pdp_status pdp__tp_seq_backward(const pdp__layer *l, const pdp__layer_io *io,
                                             pdp_status (*backward)(const pdp__layer *,
                                                                    const pdp__layer_io *))
{
    const pdp_model *m = l->tp->model;
    int64_t nw = m->params[l->param_first].count;
    int64_t nb = l->nparams > 1 ? m->params[l->param_first + 1].count : 0;
    pdp__layer_io run = *io;
    pdp_status st;
    double t0;
    run.dw = io->work;
    run.db = nb ? io->work + nw : NULL;
    run.work = io->work + nw + nb;
    if ((st = pdp__dev_memset0(io->device, io->work, (size_t)(nw + nb) * sizeof(float))) ||
        (st = backward(l, &run)) != PDP_OK)
        return st;
    t0 = pdp__now();
    if ((st = pdp_comm_allreduce(l->tp->comm, io->work, nw + nb, PDP_REDUCE_SUM, NULL)))
        return pdp__err_wrap(st, "the sequence slices' parameter gradients: all-reduce of %lld "
                             "floats (TP rank %d of %d)", (long long)(nw + nb), l->tp->rank,
                             l->tp->size);
    l->tp->stats.grad_allreduces++;
    l->tp->stats.grad_bytes += (nw + nb) * (int64_t)sizeof(float);
    l->tp->stats.bytes_sent += (int64_t)(2.0 * (double)(l->tp->size - 1) / (double)l->tp->size *
                                         (double)((nw + nb) * (int64_t)sizeof(float)));
    l->tp->stats.allreduce_s += pdp__now() - t0;
    if ((st = pdp__dev_add(io->device, io->dw, io->work, nw)) != PDP_OK) return st;
    return nb ? pdp__dev_add(io->device, io->db, io->work + nw, nb) : PDP_OK;
}

/* ---- tp: the column- and row-parallel Linears ---- */

/* parts (tp_parts) blocks of tp_full / parts outputs, each split alike: rank r holds
   [tp_lo, tp_lo + n) of every block, its out_features parts x n. */
PDP__PRIVATE pdp_status pdp__tp_column_setup(pdp__layer *l, pdp__param_shapes *ps, const char *in)
{
    int64_t parts = l->tp_parts > 1 ? l->tp_parts : 1, n;
    pdp_status st;
    if ((st = pdp__tp_op_setup(l, in)) != PDP_OK) return st;
    if (l->tp_full % parts != 0 || l->tp_full / parts < l->tp->size)
        return pdp__err(PDP_ERR_INVALID, "out_features %lld%s < TP size %d: a rank would hold "
                        "no output feature (input %s)", (long long)(l->tp_full / parts),
                        parts > 1 ? " a part" : "", l->tp->size, in);
    pdp_tp_split(l->tp_full / parts, l->tp->rank, l->tp->size, &l->tp_lo, &n);
    l->out_features = parts * n;
    return pdp__linear_setup(l, ps, in);
}

/* The input is the slice [tp_lo, tp_lo + in_count) of tp_full features (pdp_model_add_
   row_parallel_linear took both from the ColumnParallelLinear before it). */
PDP__PRIVATE pdp_status pdp__tp_row_setup(pdp__layer *l, pdp__param_shapes *ps, const char *in)
{
    pdp_status st;
    int64_t lo, n;
    if ((st = pdp__tp_op_setup(l, in)) != PDP_OK) return st;
    pdp_tp_split(l->tp_full, l->tp->rank, l->tp->size, &lo, &n);
    if (lo != l->tp_lo || n != l->in_shape[l->in_ndim - 1])
        return pdp__err(PDP_ERR_SHAPE, "input %s is not TP rank %d's slice of %lld features "
                        "(%lld at %lld)", in, l->tp->rank, (long long)l->tp_full, (long long)n,
                        (long long)lo);
    return pdp__linear_setup(l, ps, in);
}

/* `count` draws of pdp__layers_init_kaiming's generator for the tensor U(lo, hi) with the
   formula of pdp_tensor_uniform; element k is kept in dst[map(k)] when keep(k). The
   slice draws exactly what the full tensor would, in the same order. */
typedef struct pdp__tp_slice2d {
    int64_t cols;         /* the full tensor's row length */
    int64_t c0, c1;       /* kept columns [c0, c1) */
    int64_t r0, r1;       /* kept rows [r0, r1) of each of the parts blocks of rows */
    int64_t parts;        /* blocks of rows split alike (0 or 1: one) */
} pdp__tp_slice2d;

PDP__PRIVATE void pdp__tp_draw(float *dst, int64_t rows, pdp__tp_slice2d s, float lo, float hi,
                               pdp_rng *r)
{
    int64_t i, j, w = s.c1 - s.c0, block = rows / (s.parts > 1 ? s.parts : 1);
    for (i = 0; i < rows; i++)
        for (j = 0; j < s.cols; j++) {
            float v = pdp__draw_uniform(r, lo, hi); /* as pdp_tensor_uniform draws */
            int64_t p = i / block, k = i % block;
            if (k >= s.r0 && k < s.r1 && j >= s.c0 && j < s.c1)
                dst[(p * (s.r1 - s.r0) + k - s.r0) * w + (j - s.c0)] = v;
        }
}

/* The bounds pdp__layers_init_kaiming uses for fan_in (Kaiming uniform with a = sqrt(5),
   then the bias's 1/sqrt(fan_in)), computed as pdp_tensor_kaiming_uniform does. */
PDP__PRIVATE void pdp__tp_bounds(int64_t fan_in, float *wb, float *bb)
{
    float a = sqrtf(5.0f);
    double gain = sqrt(2.0 / (1.0 + (double)a * a));
    *wb = (float)(gain * sqrt(3.0 / (double)fan_in));
    *bb = (float)(1.0 / sqrt((double)fan_in));
}

/* W1 [tp_full, in]: rows [tp_lo, tp_lo + n) of each part and the same entries of b1. */
PDP__PRIVATE void pdp__tp_column_init(const pdp__layer *l, float *w, float *b, pdp_rng *r)
{
    pdp__tp_slice2d s;
    float wb, bb;
    int64_t in = pdp__layer_in_features(l), parts = l->tp_parts > 1 ? l->tp_parts : 1;
    pdp__tp_bounds(in, &wb, &bb);
    s.cols = in, s.c0 = 0, s.c1 = in, s.parts = parts;
    s.r0 = l->tp_lo, s.r1 = l->tp_lo + l->out_features / parts;
    pdp__tp_draw(w, l->tp_full, s, -wb, wb, r);
    s.cols = 1, s.c0 = 0, s.c1 = 1;
    pdp__tp_draw(b, l->tp_full, s, -bb, bb, r);
}

/* W2 [d, tp_full]: columns [tp_lo, tp_lo + n); b2 whole. fan_in is the full width. */
PDP__PRIVATE void pdp__tp_row_init(const pdp__layer *l, float *w, float *b, pdp_rng *r)
{
    pdp__tp_slice2d s;
    float wb, bb;
    pdp__tp_bounds(l->tp_full, &wb, &bb);
    s.cols = l->tp_full, s.c0 = l->tp_lo, s.c1 = l->tp_lo + pdp__layer_in_features(l);
    s.r0 = 0, s.r1 = l->out_features, s.parts = 1;
    pdp__tp_draw(w, l->out_features, s, -wb, wb, r);
    s.cols = 1, s.c0 = 0, s.c1 = 1;
    pdp__tp_draw(b, l->out_features, s, -bb, bb, r);
}

/* Backward of Linear, without the input gradient when f is the first layer. */
PDP__PRIVATE pdp_status pdp__tp_column_backward(const pdp__layer *l, const pdp__layer_io *io)
{
    pdp__layer_io run = *io;
    if (l->tp_skip_dx) run.dx = NULL;
    return pdp__linear_backward(l, &run);
}

/* x_r W_r^T, plus the bias on TP rank 0 only: g's sum then adds it once. */
PDP__PRIVATE pdp_status pdp__tp_row_forward(const pdp__layer *l, const pdp__layer_io *io)
{
    pdp__layer_io run = *io;
    if (l->tp->rank != 0) run.b = NULL;
    return pdp__linear_forward(l, &run);
}

#ifdef PDP_CUDA
PDP__PRIVATE pdp_status pdp__tp_column_cuda_backward(const pdp__layer *l, const pdp__layer_io *io)
{
    pdp__layer_io run = *io;
    if (l->tp_skip_dx) run.dx = NULL;
    return pdp__linear_cuda_backward(l, &run);
}

PDP__PRIVATE pdp_status pdp__tp_row_cuda_forward(const pdp__layer *l, const pdp__layer_io *io)
{
    pdp__layer_io run = *io;
    if (l->tp->rank != 0) run.b = NULL;
    return pdp__linear_cuda_forward(l, &run);
}
#endif
