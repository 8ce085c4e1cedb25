/* layers_tp: the four layer kinds of tensor parallelism (tp.h has the design): f and g,
   the conjugate operators, and the column- and row-parallel Linears, as entries of
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

/* Whether parameter p of m is split across the TP ranks: the column-parallel weight and
   bias, the row-parallel weight; every other parameter (the row-parallel bias, every
   non-TP layer's) is whole on every TP rank. */
PDP__PRIVATE bool pdp__tp_is_split(const pdp_model *m, int p)
{
    /* a pipeline stage's parameters keep the full model's layer numbers */
    const pdp__layer *l = &m->layers[m->params[p].layer - m->layers[0].index];
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
            float v = lo + (hi - lo) * pdp_rng_uniform(r);
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
