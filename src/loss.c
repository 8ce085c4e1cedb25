/* loss: softmax cross-entropy over integer labels and mean squared error, as
   torch.nn.functional.cross_entropy and mse_loss with reduction='mean'; the
   one-call training pass pdp_model_forward_backward; and accuracy counting.

   Cross-entropy per sample is logsumexp(z) - z[label], computed stably as
   m + log(sum exp(z - m)) with m = max(z) and the sum in double; the batch sum
   is accumulated in double in sample order. Its gradient is
   (softmax(z) - onehot(label)) * grad_scale. A label outside [0, classes) is
   PDP_ERR_INVALID and a non-finite loss PDP_ERR_NUMERIC, both naming the sample,
   so a diverging run stops where it diverged instead of training on NaN. On a
   CUDA device the same formulas run in pdp_cuda.cu (cuda_host.c dispatches);
   the per-sample losses come back and are summed here in sample order.

   Threads: the rows split over the intra-op threads (contiguous ranges), each row's
   loss kept in the caller's scratch (pdp__thread_scratch, grown once) and summed
   afterwards in row order; each part keeps its row's exp(z - m) there too, so that
   exp runs once per logit, not twice. Every row is computed alone and the sum's order
   is fixed, so the bits do not depend on the thread count, and they are those of the
   one-row-at-a-time loop (a double's exp is the same whether kept or recomputed).
   GPT-2's 256 rows of 50257 logits: 101 ms on one thread before, 61 ms on one thread
   and 31 ms on two after (Sapphire Rapids, 2 cores). */

#include "internal.h"

/* Logits below which the cross-entropy stays on one thread: each costs an exp (double),
   several times an element pass's work per float, so a sixteenth of layers.c's
   PDP__ELEMWISE_PAR_MIN. */
#ifndef PDP__CE_PAR_MIN
#  define PDP__CE_PAR_MIN 16384
#endif

/* ---- loss: cross-entropy ---- */

/* One row: returns logsumexp(z) - z[label] and, dlogits not NULL, writes d = (softmax(z) -
   onehot(label)) * grad_scale. e: room for V doubles (exp(z - m), computed once), or NULL
   (computed twice: the same values). */
PDP__PRIVATE double pdp__cross_entropy_row(const float *z, int32_t label, int64_t V,
                                           float grad_scale, float *d, double *e)
{
    float mx = z[0];
    double sum = 0.0, inv;
    int64_t j;
    for (j = 1; j < V; j++) mx = z[j] > mx ? z[j] : mx;
    if (e)
        for (j = 0; j < V; j++) sum += e[j] = exp((double)z[j] - (double)mx);
    else
        for (j = 0; j < V; j++) sum += exp((double)z[j] - (double)mx);
    if (d) {
        inv = 1.0 / sum;
        if (e)
            for (j = 0; j < V; j++) d[j] = (float)(e[j] * inv) * grad_scale;
        else
            for (j = 0; j < V; j++) d[j] = (float)(exp((double)z[j] - (double)mx) * inv) * grad_scale;
        d[label] -= grad_scale;
    }
    return (double)mx + log(sum) - (double)z[label];
}

typedef struct pdp__ce_job {
    const float *logits;
    const int32_t *labels;
    int64_t rows, V;
    float grad_scale;
    float *dlogits;  /* or NULL */
    double *loss;    /* [rows]: each row's loss (0 for an ignored row) */
    double *e;       /* [parts, V]: each part's exp(z - m), or NULL */
} pdp__ce_job;

/* Part i of n: rows [rows i / n, rows (i + 1) / n). Label -1: an ignored row (loss 0,
   dlogits 0; the caller checked every other label). */
PDP__PRIVATE void pdp__ce_part(void *arg, int i, int n)
{
    const pdp__ce_job *j = (const pdp__ce_job *)arg;
    int64_t r, lo = j->rows * i / n, hi = j->rows * (i + 1) / n, V = j->V;
    for (r = lo; r < hi; r++) {
        float *d = j->dlogits ? j->dlogits + r * V : NULL;
        if (j->labels[r] == -1) {
            j->loss[r] = 0.0;
            if (d) memset(d, 0, (size_t)V * sizeof(float));
            continue;
        }
        j->loss[r] = pdp__cross_entropy_row(j->logits + r * V, j->labels[r], V, j->grad_scale, d,
                                            j->e ? j->e + (int64_t)i * V : NULL);
    }
}

/* Rows [0, rows) (labels checked by the caller, -1 ignored) over the intra-op threads;
   *loss_sum the sum of the rows' losses in row order. A non-finite loss: *bad its row,
   *loss_sum that loss, and PDP_ERR_NUMERIC (the caller names it); else *bad = -1. Out
   of memory for the losses: one row at a time, as before there were threads. */
PDP__PRIVATE pdp_status pdp__cross_entropy_run(const float *logits, const int32_t *labels,
                                               int64_t rows, int64_t V, float grad_scale,
                                               double *loss_sum, float *dlogits, int64_t *bad)
{
    pdp__ce_job j;
    int parts = (int)PDP__MIN((int64_t)pdp__threads_for_caller(), rows);
    double total = 0.0, one;
    int64_t r;
    *bad = -1;
    if (rows * V < PDP__CE_PAR_MIN) parts = 1;
    if (parts < 1) parts = 1;
    j.logits = logits;
    j.labels = labels;
    j.rows = rows;
    j.V = V;
    j.grad_scale = grad_scale;
    j.dlogits = dlogits;
    j.loss = (double *)pdp__thread_scratch(((size_t)rows + (size_t)parts * (size_t)V) *
                                           sizeof(double));
    j.e = j.loss ? j.loss + rows : NULL;
    if (j.loss) pdp__parallel_for(parts, pdp__ce_part, &j);
    for (r = 0; r < rows; r++) {
        if (labels[r] == -1) continue;
        if (j.loss) {
            one = j.loss[r];
        } else {
            one = pdp__cross_entropy_row(logits + r * V, labels[r], V, grad_scale,
                                         dlogits ? dlogits + r * V : NULL, NULL);
        }
        if (one != one || one == HUGE_VAL || one == -HUGE_VAL) {
            *bad = r;
            *loss_sum = one;
            return PDP_ERR_NUMERIC;
        }
        total += one;
    }
    if (!j.loss && dlogits) /* the ignored rows' zeros */
        for (r = 0; r < rows; r++)
            if (labels[r] == -1) memset(dlogits + r * V, 0, (size_t)V * sizeof(float));
    *loss_sum = total;
    return PDP_OK;
}

PDP__PRIVATE pdp_status pdp__cross_entropy(const float *logits, const int32_t *labels,
                                           int64_t batch, int64_t classes, float grad_scale,
                                           double *loss_sum, float *dlogits, const char *fn)
{
    int64_t i, first = batch, bad;
    double sum = 0.0;
    /* the first label outside [0, classes); the rows before it are computed, and a
       non-finite loss among them is the error, as a loop that stops at the first
       failing sample reports */
    for (i = 0; i < batch && first == batch; i++)
        if (labels[i] < 0 || labels[i] >= classes) first = i;
    if (pdp__cross_entropy_run(logits, labels, first, classes, grad_scale, &sum, dlogits, &bad) !=
        PDP_OK) {
        *loss_sum = sum;
        return pdp__err(PDP_ERR_NUMERIC, "%s: loss is %s at sample %lld", fn,
                        sum != sum ? "NaN" : "Inf", (long long)bad);
    }
    if (first < batch)
        return pdp__err(PDP_ERR_INVALID, "%s: label %ld at sample %lld is outside [0, %lld)",
                        fn, (long)labels[first], (long long)first, (long long)classes);
    *loss_sum = sum;
    return PDP_OK;
}

/* pdp__cross_entropy with logits and dlogits on device d (CUDA: cuda_host.c). */
PDP__PRIVATE pdp_status pdp__cross_entropy_on(pdp_device d, const float *logits,
                                              const int32_t *labels, int64_t batch, int64_t classes,
                                              float grad_scale, double *loss_sum, float *dlogits,
                                              const char *fn)
{
    double t0 = pdp__prof.on ? pdp__now() : 0.0;
    pdp_status st =
        d.kind == PDP_DEVICE_CUDA
            ? pdp__cuda_cross_entropy(d, logits, labels, batch, classes, grad_scale, loss_sum,
                                      dlogits, fn)
            : pdp__cross_entropy(logits, labels, batch, classes, grad_scale, loss_sum, dlogits,
                                 fn);
    if (pdp__prof.on) pdp__prof.loss_s += pdp__now() - t0;
    return st;
}

/* ---- loss: cross-entropy with ignored rows ----
   loss = mean over the rows whose label is not -1 of logsumexp(z) - z[label] (PyTorch's
   cross_entropy(ignore_index=-1, reduction='mean')); dlogits = (softmax(z) -
   onehot(label)) / count on those rows, 0 on ignored ones. Every row ignored: PyTorch
   returns NaN (0 / 0); here the loss is 0 and dlogits 0, a batch that teaches nothing,
   and *count says so. A label outside [0, V) other than -1 is PDP_ERR_INVALID naming
   fn, the row and the label, checked before anything is written. */

/* The rows whose label is not -1, checking the others are in [0, V): *count. */
PDP__PRIVATE pdp_status pdp__cross_entropy_count(const int32_t *labels, int64_t N, int64_t V,
                                                 int64_t *count, const char *fn)
{
    int64_t i, n = 0;
    for (i = 0; i < N; i++) {
        if (labels[i] == -1) continue;
        if (labels[i] < 0 || labels[i] >= V)
            return pdp__err(PDP_ERR_INVALID, "%s: label %ld at row %lld is outside [0, %lld) "
                            "and not the ignore index -1", fn, (long)labels[i], (long long)i,
                            (long long)V);
        n++;
    }
    *count = n;
    return PDP_OK;
}

/* The sum over rows not ignored of the row losses (into *loss_sum, in double, in row
   order), dlogits = (softmax - onehot) x grad_scale on them and 0 on ignored rows: the
   part of a batch's loss that one replica or rank holds (grad_scale = 1 / the whole
   batch's count). Labels checked first (pdp__cross_entropy_count). */
PDP__PRIVATE pdp_status pdp__cross_entropy_rows(const float *logits, const int32_t *labels,
                                                int64_t N, int64_t V, float grad_scale,
                                                double *loss_sum, float *dlogits, const char *fn)
{
    int64_t n = 0, bad;
    double total = 0.0;
    pdp_status st;
    *loss_sum = 0.0;
    if ((st = pdp__cross_entropy_count(labels, N, V, &n, fn)) != PDP_OK) return st;
    /* loss.c's row: m + log(sum exp(z - m)) - z[label], in double */
    if (pdp__cross_entropy_run(logits, labels, N, V, grad_scale, &total, dlogits, &bad) != PDP_OK)
        return pdp__err(PDP_ERR_NUMERIC, "%s: loss is %s at row %lld", fn,
                        total != total ? "NaN" : "Inf", (long long)bad);
    *loss_sum = total;
    return PDP_OK;
}

/* pdp__cross_entropy_rows with logits and dlogits on device d (CUDA: cuda_host.c's). */
PDP__PRIVATE pdp_status pdp__cross_entropy_rows_on(pdp_device d, const float *logits,
                                                   const int32_t *labels, int64_t N, int64_t V,
                                                   float grad_scale, double *loss_sum,
                                                   float *dlogits, const char *fn)
{
    double t0 = pdp__prof.on ? pdp__now() : 0.0;
    pdp_status st =
        d.kind == PDP_DEVICE_CUDA
            ? pdp__cuda_cross_entropy_rows(d, logits, labels, N, V, grad_scale, loss_sum, dlogits,
                                           fn)
            : pdp__cross_entropy_rows(logits, labels, N, V, grad_scale, loss_sum, dlogits, fn);
    if (pdp__prof.on) pdp__prof.loss_s += pdp__now() - t0;
    return st;
}

PDP__PRIVATE pdp_status pdp__cross_entropy_ignore(const float *logits, const int32_t *labels,
                                                  int64_t N, int64_t V, float *loss,
                                                  int64_t *count, float *dlogits, const char *fn)
{
    int64_t n = 0;
    double total;
    pdp_status st;
    *loss = 0.0f;
    if ((st = pdp__cross_entropy_count(labels, N, V, &n, fn)) != PDP_OK) return st;
    if (count) *count = n;
    st = pdp__cross_entropy_rows(logits, labels, N, V, n > 0 ? 1.0f / (float)n : 0.0f, &total,
                                 dlogits, fn);
    if (st == PDP_OK && n > 0) *loss = (float)(total / (double)n);
    return st;
}

PDP__PRIVATE bool pdp__loss_same_device(const pdp_tensor *a, const pdp_tensor *b)
{
    return a->device.kind == b->device.kind && a->device.ordinal == b->device.ordinal;
}

/* A tensor the losses read or write as floats (an int32 tensor's bits are not). */
PDP__PRIVATE pdp_status pdp__loss_check_floats(const pdp_tensor *t, const char *what,
                                               const char *fn)
{
    if (t->dtype == PDP_DTYPE_F32) return PDP_OK;
    return pdp__err(PDP_ERR_INVALID, "%s: %s holds %s, not float32", fn, what,
                    pdp_dtype_name(t->dtype));
}

/* Shared argument checks of the public losses: a 2-D float tensor [batch, classes]. */
PDP__PRIVATE pdp_status pdp__loss_check_logits(const pdp_tensor *t, const char *what,
                                               const char *fn)
{
    char buf[96];
    pdp_status st;
    if ((st = pdp__loss_check_floats(t, what, fn)) != PDP_OK) return st;
    if (t->ndim != 2)
        return pdp__err(PDP_ERR_SHAPE, "%s: %s must be [batch, classes], got %s", fn, what,
                        pdp__shape_str(t, buf, sizeof buf));
    return PDP_OK;
}

/* Shape equality for messages "dlogits is [3, 4], logits is [3, 5]". */
PDP__PRIVATE bool pdp__loss_same_shape(const pdp_tensor *a, const pdp_tensor *b)
{
    int i;
    if (a->ndim != b->ndim) return false;
    for (i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return false;
    return true;
}

PDP_API pdp_status pdp_loss_cross_entropy(const pdp_tensor *logits, const int32_t *labels,
                                          float *loss, pdp_tensor *dlogits)
{
    const char *fn = "pdp_loss_cross_entropy";
    char a[96], b[96];
    double sum = 0.0;
    pdp_status st;
    if (!logits || !labels || !loss) return pdp__err(PDP_ERR_INVALID, "%s: NULL argument", fn);
    if ((st = pdp__loss_check_logits(logits, "logits", fn)) != PDP_OK) return st;
    if (dlogits) {
        if ((st = pdp__loss_check_logits(dlogits, "dlogits", fn)) != PDP_OK) return st;
        if (!pdp__loss_same_device(logits, dlogits))
            return pdp__err(PDP_ERR_DEVICE, "%s: dlogits on device %d:%d, logits on %d:%d", fn,
                            dlogits->device.kind, dlogits->device.ordinal, logits->device.kind,
                            logits->device.ordinal);
        if (!pdp__loss_same_shape(logits, dlogits))
            return pdp__err(PDP_ERR_SHAPE, "%s: dlogits is %s, logits is %s", fn,
                            pdp__shape_str(dlogits, a, sizeof a),
                            pdp__shape_str(logits, b, sizeof b));
    }
    st = pdp__cross_entropy_on(logits->device, logits->data, labels, logits->shape[0],
                               logits->shape[1], 1.0f / (float)logits->shape[0], &sum,
                               dlogits ? dlogits->data : NULL, fn);
    *loss = (float)(sum / (double)logits->shape[0]);
    return st;
}

/* ---- loss: mean squared error ---- */

PDP_API pdp_status pdp_loss_mse(const pdp_tensor *pred, const pdp_tensor *target, float *loss,
                                pdp_tensor *dpred)
{
    const char *fn = "pdp_loss_mse";
    char a[96], b[96];
    double sum = 0.0, t0;
    float scale;
    int64_t i, n;
    if (!pred || !target || !loss) return pdp__err(PDP_ERR_INVALID, "%s: NULL argument", fn);
    {
        pdp_status st;
        if ((st = pdp__loss_check_floats(pred, "pred", fn)) != PDP_OK ||
            (st = pdp__loss_check_floats(target, "target", fn)) != PDP_OK ||
            (dpred && (st = pdp__loss_check_floats(dpred, "dpred", fn)) != PDP_OK))
            return st;
    }
    if (!pdp__loss_same_device(pred, target) || (dpred && !pdp__loss_same_device(pred, dpred)))
        return pdp__err(PDP_ERR_DEVICE, "%s: pred, target and dpred must be on one device", fn);
    if (!pdp__loss_same_shape(pred, target))
        return pdp__err(PDP_ERR_SHAPE, "%s: pred is %s, target is %s", fn,
                        pdp__shape_str(pred, a, sizeof a), pdp__shape_str(target, b, sizeof b));
    if (dpred && !pdp__loss_same_shape(pred, dpred))
        return pdp__err(PDP_ERR_SHAPE, "%s: dpred is %s, pred is %s", fn,
                        pdp__shape_str(dpred, a, sizeof a), pdp__shape_str(pred, b, sizeof b));
    n = pred->count;
    scale = 2.0f / (float)n;
    t0 = pdp__prof.on ? pdp__now() : 0.0;
    if (pred->device.kind == PDP_DEVICE_CUDA) {
        pdp_status st = pdp__cuda_mse(pred->device, pred->data, target->data, n, scale, &sum,
                                      dpred ? dpred->data : NULL, fn);
        if (st != PDP_OK) return st;
    }
    for (i = 0; i < n && pred->device.kind == PDP_DEVICE_CPU; i++) {
        float d = pred->data[i] - target->data[i];
        sum += (double)d * (double)d;
        if (dpred) dpred->data[i] = scale * d;
    }
    if (pdp__prof.on) pdp__prof.loss_s += pdp__now() - t0;
    *loss = (float)(sum / (double)n);
    if (*loss != *loss || *loss == HUGE_VALF)
        return pdp__err(PDP_ERR_NUMERIC, "%s: loss is %s over %lld elements", fn,
                        *loss != *loss ? "NaN" : "Inf", (long long)n);
    return PDP_OK;
}

/* ---- loss: training pass and accuracy ---- */

/* Cross-entropy of the model's output y against labels, one a row of y's last dimension
   ([B, K]: one a sample; [B, T, V]: one a position), -1 ignored; dy into the model's own
   grad_a, which backward accepts as dy (it ping-pongs between grad_a and grad_b):
   nothing is allocated. */
PDP__PRIVATE pdp_status pdp__model_cross_entropy(pdp_model *m, const pdp_tensor *y,
                                                 const int32_t *labels, float *loss,
                                                 const char *fn)
{
    int64_t V = y->shape[y->ndim - 1], rows = y->count / V, n = 0;
    double sum = 0.0, t0 = pdp__prof.on ? pdp__now() : 0.0;
    pdp_status st;
    if (m->device.kind == PDP_DEVICE_CPU) {
        st = pdp__cross_entropy_ignore(y->data, labels, rows, V, loss, NULL, m->grad_a, fn);
    } else { /* CUDA: the same rows (pdp__cuda_cross_entropy_rows), the mean over n here */
        *loss = 0.0f;
        if ((st = pdp__cross_entropy_count(labels, rows, V, &n, fn)) != PDP_OK) return st;
        st = pdp__cuda_cross_entropy_rows(m->device, y->data, labels, rows, V,
                                          n > 0 ? 1.0f / (float)n : 0.0f, &sum, m->grad_a, fn);
        if (st == PDP_OK && n > 0) *loss = (float)(sum / (double)n);
    }
    if (pdp__prof.on) pdp__prof.loss_s += pdp__now() - t0;
    return st;
}

/* The output a loss can read: [batch, classes] or [batch, T, vocab]. */
PDP__PRIVATE pdp_status pdp__model_check_logits(pdp_model *m, const pdp_tensor *y, const char *fn)
{
    char buf[96];
    if (y->ndim == 2 || y->ndim == 3) return PDP_OK;
    m->have_forward = false;
    return pdp__err(PDP_ERR_SHAPE, "%s: the model's output is %s; cross-entropy needs "
                    "[batch, classes] or [batch, T, vocab] (add a Flatten and a Linear)", fn,
                    pdp__shape_str(y, buf, sizeof buf));
}

PDP_API pdp_status pdp_model_forward_backward(pdp_model *m, const pdp_tensor *x,
                                              const int32_t *labels, float *loss)
{
    const char *fn = "pdp_model_forward_backward";
    const pdp_tensor *y;
    pdp_tensor dy;
    pdp_status st;
    if (!m || !x || !labels || !loss)
        return pdp__err(PDP_ERR_INVALID, "%s: %s is NULL", fn,
                        !m ? "the model" : !x ? "x" : !labels ? "labels" : "loss");
    if ((st = pdp_model_forward(m, x, &y)) != PDP_OK) return pdp__err_wrap(st, "%s", fn);
    if ((st = pdp__model_check_logits(m, y, fn)) != PDP_OK) return st;
    if ((st = pdp__model_cross_entropy(m, y, labels, loss, fn)) != PDP_OK) {
        m->have_forward = false;
        return st;
    }
    pdp_tensor_wrap(m->grad_a, m->device, y->ndim, y->shape, &dy);
    if ((st = pdp_model_backward(m, &dy)) != PDP_OK) return pdp__err_wrap(st, "%s", fn);
    return PDP_OK;
}

PDP_API pdp_status pdp_model_forward_backward_target(pdp_model *m, const pdp_tensor *x,
                                                     const pdp_tensor *target, float *loss)
{
    const char *fn = "pdp_model_forward_backward_target";
    const pdp_tensor *y;
    pdp_tensor dy, t;
    char a[96], b[96];
    pdp_status st;
    if (!m || !x || !target || !loss) return pdp__err(PDP_ERR_INVALID, "%s: NULL argument", fn);
    if (target->dtype != PDP_DTYPE_I32 && target->dtype != PDP_DTYPE_F32)
        return pdp__err(PDP_ERR_INVALID, "%s: target holds %s: int32 labels (cross-entropy) or "
                        "float32 values (mean squared error)", fn, pdp_dtype_name(target->dtype));
    if ((st = pdp_model_forward(m, x, &y)) != PDP_OK) return pdp__err_wrap(st, "%s", fn);
    if (target->dtype == PDP_DTYPE_I32) {
        int64_t rows;
        if ((st = pdp__model_check_logits(m, y, fn)) != PDP_OK) return st;
        rows = y->count / y->shape[y->ndim - 1];
        if (target->count != rows || target->shape[0] != y->shape[0]) {
            m->have_forward = false;
            return pdp__err(PDP_ERR_SHAPE, "%s: target is %s int32 labels, the output %s needs "
                            "one a row: %lld", fn, pdp__shape_str(target, a, sizeof a),
                            pdp__shape_str(y, b, sizeof b), (long long)rows);
        }
        if (target->device.kind != PDP_DEVICE_CPU) {
            m->have_forward = false;
            return pdp__err(PDP_ERR_DEVICE, "%s: labels are read on the host; target is on "
                            "device %d:%d", fn, target->device.kind, target->device.ordinal);
        }
        if ((st = pdp__model_cross_entropy(m, y, pdp_tensor_ids(target), loss, fn)) != PDP_OK) {
            m->have_forward = false;
            return st;
        }
    } else {
        if (target->count != y->count || target->shape[0] != y->shape[0]) {
            m->have_forward = false;
            return pdp__err(PDP_ERR_SHAPE, "%s: target is %s, the output is %s", fn,
                            pdp__shape_str(target, a, sizeof a), pdp__shape_str(y, b, sizeof b));
        }
        pdp_tensor_wrap(target->data, target->device, y->ndim, y->shape, &t);
        pdp_tensor_wrap(m->grad_a, m->device, y->ndim, y->shape, &dy);
        if ((st = pdp_loss_mse(y, &t, loss, &dy)) != PDP_OK) {
            m->have_forward = false;
            return pdp__err_wrap(st, "%s", fn);
        }
    }
    pdp_tensor_wrap(m->grad_a, m->device, y->ndim, y->shape, &dy);
    if ((st = pdp_model_backward(m, &dy)) != PDP_OK) return pdp__err_wrap(st, "%s", fn);
    return PDP_OK;
}

PDP_API pdp_status pdp_count_correct(const pdp_tensor *logits, const int32_t *labels,
                                     int64_t *correct)
{
    const char *fn = "pdp_count_correct";
    int64_t i, j, classes, hits = 0;
    const float *data;
    pdp_status st;
    if (!logits || !labels || !correct) return pdp__err(PDP_ERR_INVALID, "%s: NULL argument", fn);
    *correct = 0;
    if ((st = pdp__loss_check_logits(logits, "logits", fn)) != PDP_OK) return st;
    classes = logits->shape[1];
    data = logits->data;
    if (logits->device.kind != PDP_DEVICE_CPU) { /* a host copy in this thread's scratch */
        float *host = (float *)pdp__thread_scratch((size_t)logits->count * sizeof(float));
        if (!host) return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory for a host copy", fn);
        if ((st = pdp_tensor_download(logits, host)) != PDP_OK) return pdp__err_wrap(st, "%s", fn);
        data = host;
    }
    for (i = 0; i < logits->shape[0]; i++) {
        const float *z = data + i * classes;
        int64_t best = 0;
        for (j = 1; j < classes; j++)
            if (z[j] > z[best]) best = j; /* the first maximum, as torch.argmax */
        hits += best == labels[i];
    }
    *correct = hits;
    return PDP_OK;
}
