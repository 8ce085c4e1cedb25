/* ddp: the DistributedDataParallel reducer.

   The reducer follows PyTorch's (torch/csrc/distributed/c10d/reducer.cpp) in
   miniature. Buckets are planned once, at construction, walking the parameters
   in reverse registration order and closing a bucket as soon as it holds
   bucket_cap bytes or more (the first: first_bucket bytes), PyTorch's
   compute_bucket_assignment_by_size. Because the model keeps its gradients in
   one block in registration order, a bucket of consecutive parameters in
   reverse order is one contiguous range of that block: the all-reduce runs in
   place on the gradients, with no flattening copy (PyTorch's
   gradient_as_bucket_view=True, here by construction).

   Per synchronised backward: pending[b] starts at the number of parameters in
   bucket b; the model's grad hook, fired once per parameter right after its
   layer's backward, decrements it; at zero the bucket is ready. Ready buckets
   launch strictly in bucket order (a later bucket that is ready first waits for
   the earlier ones), so every rank issues the same all-reduces in the same
   order whatever order its hooks fire in. A bucket whose parameters never get
   a gradient (unused in this forward) launches at the end of backward, so no
   rank waits on it. pdp_ddp_finish waits for the buckets in order and reports
   the first failure naming the bucket and its parameters.

   States: IDLE (nothing pending), LOCAL (gradients accumulated under no_sync,
   not reduced), REDUCING (a synchronised backward launched its buckets and
   pdp_ddp_finish has not run). The progress of a bucket's all-reduce writes the
   gradient memory, so nothing else may touch the gradients while REDUCING: a
   second backward is refused and pdp_ddp_free waits first. */

#include "internal.h"

/* ---- ddp: state ---- */

typedef enum pdp__ddp_state {
    PDP__DDP_IDLE,
    PDP__DDP_LOCAL,
    PDP__DDP_REDUCING
} pdp__ddp_state;

typedef struct pdp__ddp_bucket {
    pdp_ddp_bucket info;
    int nparams;
    int pending;          /* parameters still to report in this backward */
    bool ready, launched;
    pdp_work *work;
    double t_launch;
} pdp__ddp_bucket;

struct pdp_ddp {
    pdp_model *m;
    pdp_comm *c;
    pdp_ddp_desc desc;
    pdp__ddp_bucket *buckets;
    int nbuckets;
    int *bucket_of;       /* per parameter */
    int next_launch;      /* the first bucket not launched yet */
    pdp__ddp_state state;
    bool no_sync;
    bool armed;           /* the hook reduces (a synchronised backward is running) */
    bool failed;          /* the last synchronised backward failed: gradients incomplete */
    pdp_status launch_status;
    char launch_msg[512];
    int twice_param;      /* a parameter reported twice in one backward, or -1 */
    int64_t bytes_at_arm;
    double backward_acc;  /* forward + backward seconds since the last finish */
    pdp_ddp_stats stats;
    bool traced;
    int trace_compute, trace_comm;
};

/* ---- ddp: buckets ---- */

static pdp_status pdp__ddp_plan(pdp_ddp *d)
{
    const pdp_model *m = d->m;
    double cap = d->desc.bucket_cap_mb * 1048576.0, first = d->desc.first_bucket_mb * 1048576.0;
    double bytes = 0.0;
    int p, b = 0, last = m->nparams - 1;
    d->buckets = (pdp__ddp_bucket *)pdp__calloc((size_t)PDP__MAX(1, m->nparams) *
                                                 sizeof *d->buckets);
    d->bucket_of = (int *)pdp__calloc((size_t)PDP__MAX(1, m->nparams) * sizeof *d->bucket_of);
    if (!d->buckets || !d->bucket_of) return PDP_ERR_OUT_OF_MEMORY;
    for (p = m->nparams - 1; p >= 0; p--) {
        bytes += (double)m->params[p].count * sizeof(float);
        d->bucket_of[p] = b;
        if (bytes >= (b == 0 ? first : cap) || p == 0) { /* close bucket b: params p..last */
            pdp__ddp_bucket *k = &d->buckets[b];
            k->info.first_param = p;
            k->info.last_param = last;
            k->info.offset = m->params[p].offset;
            k->info.count = m->params[last].offset + m->params[last].count - k->info.offset;
            k->nparams = last - p + 1;
            b++;
            last = p - 1;
            bytes = 0.0;
        }
    }
    d->nbuckets = b;
    return PDP_OK;
}

/* "bucket 1 of 3 (0.weight..0.bias, 1.57 MB)" */
static void pdp__ddp_bucket_name(const pdp_ddp *d, int b, char *out, size_t cap)
{
    const pdp__ddp_bucket *k = &d->buckets[b];
    snprintf(out, cap, "bucket %d of %d (%s..%s, %.3g MB)", b, d->nbuckets,
             d->m->params[k->info.first_param].name, d->m->params[k->info.last_param].name,
             (double)k->info.count * 4.0 / 1048576.0);
}

static void pdp__ddp_launch(pdp_ddp *d, int b)
{
    pdp__ddp_bucket *k = &d->buckets[b];
    pdp_status st;
    k->launched = true;
    k->t_launch = pdp__now();
    st = pdp_comm_allreduce(d->c, d->m->grad_block + k->info.offset, k->info.count,
                            PDP_REDUCE_AVG, &k->work);
    if (st != PDP_OK && d->launch_status == PDP_OK) {
        char name[160];
        pdp__ddp_bucket_name(d, b, name, sizeof name);
        d->launch_status = st;
        snprintf(d->launch_msg, sizeof d->launch_msg, "%s: %.300s", name, pdp_last_error());
    }
}

/* Launches every ready bucket that has no unlaunched bucket before it. */
static void pdp__ddp_launch_ready(pdp_ddp *d)
{
    while (d->next_launch < d->nbuckets && d->buckets[d->next_launch].ready)
        pdp__ddp_launch(d, d->next_launch++);
}

/* The model's grad hook: parameter p's gradient is final for this backward. */
static void pdp__ddp_hook(void *user, pdp_model *m, int p)
{
    pdp_ddp *d = (pdp_ddp *)user;
    pdp__ddp_bucket *k;
    (void)m;
    if (!d->armed) return; /* no_sync: accumulate locally */
    k = &d->buckets[d->bucket_of[p]];
    if (k->ready) {
        if (d->twice_param < 0) d->twice_param = p;
        return;
    }
    if (--k->pending == 0) {
        k->ready = true;
        pdp__ddp_launch_ready(d);
    }
}

static void pdp__ddp_arm(pdp_ddp *d)
{
    pdp_comm_stats cs;
    int b;
    for (b = 0; b < d->nbuckets; b++) {
        pdp__ddp_bucket *k = &d->buckets[b];
        k->pending = k->nparams;
        k->ready = k->launched = false;
        k->work = NULL;
    }
    d->next_launch = 0;
    d->launch_status = PDP_OK;
    d->launch_msg[0] = '\0';
    d->twice_param = -1;
    pdp_comm_get_stats(d->c, &cs);
    d->bytes_at_arm = cs.bytes_sent;
    d->armed = true;
}

/* ---- ddp: construction ---- */

/* One parameter as the construction check compares it. */
typedef struct pdp__ddp_sig {
    char name[32];
    int64_t ndim;
    int64_t shape[4];
} pdp__ddp_sig;

static void pdp__ddp_sig_of(const pdp_model *m, int p, pdp__ddp_sig *s)
{
    const pdp__param_entry *e = &m->params[p];
    memset(s, 0, sizeof *s);
    memcpy(s->name, e->name, sizeof s->name);
    s->ndim = e->ndim;
    memcpy(s->shape, e->shape, sizeof s->shape);
}

static void pdp__ddp_sig_str(const pdp__ddp_sig *s, char *out, size_t cap)
{
    int i;
    size_t n = (size_t)snprintf(out, cap, "'%.32s' [", s->name);
    for (i = 0; i < s->ndim && i < 4 && n < cap; i++)
        n += (size_t)snprintf(out + n, cap - n, i ? ", %lld" : "%lld", (long long)s->shape[i]);
    if (n < cap) snprintf(out + n, cap - n, "]");
}

/* All-gather of count host floats per rank. Collective buffers live on the
   communicator's device (NCCL reads GPU memory only), so a GPU communicator
   stages them through a small device buffer; used once, at construction. */
static pdp_status pdp__ddp_allgather_host(pdp_comm *c, const float *send, float *recv,
                                          int64_t count)
{
    float *dev = NULL;
    size_t send_bytes = (size_t)count * sizeof(float);
    pdp_status st;
    if (c->device.kind == PDP_DEVICE_CPU) return pdp_comm_allgather(c, send, recv, count, NULL);
    if ((st = pdp__dev_alloc(c->device, send_bytes * (size_t)(c->size + 1), (void **)&dev)) ==
            PDP_OK &&
        (st = pdp__dev_copy(c->device, dev, pdp_cpu(), send, send_bytes)) == PDP_OK &&
        (st = pdp_comm_allgather(c, dev, dev + count, count, NULL)) == PDP_OK)
        st = pdp__dev_copy(pdp_cpu(), recv, c->device, dev + count, send_bytes * (size_t)c->size);
    pdp__dev_free(c->device, dev);
    return st;
}

/* Every rank compares its registry with rank 0's; all learn the first
   difference of every rank through an all-gather, so all fail together. */
static pdp_status pdp__ddp_check_params(pdp_ddp *d)
{
    static const char *fn = "pdp_ddp_create";
    const pdp_model *m = d->m;
    pdp_comm *c = d->c;
    int64_t n0 = m->nparams;
    pdp__ddp_sig *table = NULL, mine;
    float diff, *all = NULL;
    int p, r, mine_at = -1, worst_rank = -1, worst_at = -1, size = c->size;
    pdp_status st;
    if ((st = pdp_comm_broadcast_bytes(c, &n0, sizeof n0, 0)) != PDP_OK)
        return pdp__err_wrap(st, "%s: rank %d: exchanging parameter counts", fn, c->rank);
    if (n0 < 0 || n0 > (1 << 24))
        return pdp__err(PDP_ERR_INVALID, "%s: rank 0 reports %lld parameters", fn, (long long)n0);
    table = (pdp__ddp_sig *)pdp__calloc((size_t)PDP__MAX(1, n0) * sizeof *table);
    all = (float *)pdp__calloc((size_t)size * sizeof *all);
    if (!table || !all) {
        st = pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory for %lld parameter signatures", fn,
                      (long long)n0);
        goto out; /* the others then time out on the next collective: memory is gone anyway */
    }
    if (c->rank == 0)
        for (p = 0; p < n0; p++) pdp__ddp_sig_of(m, p, &table[p]);
    if ((st = pdp_comm_broadcast_bytes(c, table, (size_t)n0 * sizeof *table, 0)) != PDP_OK) {
        st = pdp__err_wrap(st, "%s: rank %d: exchanging parameter signatures", fn, c->rank);
        goto out;
    }
    for (p = 0; p < PDP__MAX(n0, (int64_t)m->nparams); p++) {
        if (p >= n0 || p >= m->nparams) {
            mine_at = p;
            break;
        }
        pdp__ddp_sig_of(m, p, &mine);
        if (memcmp(&mine, &table[p], sizeof mine) != 0) {
            mine_at = p;
            break;
        }
    }
    diff = (float)mine_at;
    if ((st = pdp__ddp_allgather_host(c, &diff, all, 1)) != PDP_OK) {
        st = pdp__err_wrap(st, "%s: rank %d: exchanging the check's verdicts", fn, c->rank);
        goto out;
    }
    for (r = 0; r < size; r++)
        if (all[r] >= 0.0f && (worst_at < 0 || (int)all[r] < worst_at)) {
            worst_at = (int)all[r];
            worst_rank = r;
        }
    if (worst_at >= 0) {
        char a[160], b[160];
        if (mine_at >= 0) {
            if (mine_at < m->nparams) pdp__ddp_sig_of(m, mine_at, &mine);
            if (mine_at < m->nparams) pdp__ddp_sig_str(&mine, a, sizeof a);
            else snprintf(a, sizeof a, "missing (it has %d parameters)", m->nparams);
            if (mine_at < n0) pdp__ddp_sig_str(&table[mine_at], b, sizeof b);
            else snprintf(b, sizeof b, "missing (it has %lld parameters)", (long long)n0);
            st = pdp__err(PDP_ERR_INVALID, "%s: parameters differ across ranks: parameter %d is "
                          "%s on rank %d but %s on rank 0", fn, mine_at, a, c->rank, b);
        } else {
            if (worst_at < n0) pdp__ddp_sig_str(&table[worst_at], b, sizeof b);
            else snprintf(b, sizeof b, "missing on rank 0 (%lld parameters)", (long long)n0);
            st = pdp__err(PDP_ERR_INVALID, "%s: parameters differ across ranks: rank %d's "
                          "parameter %d differs from rank 0's %s (rank %d's error names both)",
                          fn, worst_rank, worst_at, b, worst_rank);
        }
    }
out:
    pdp__dealloc(table);
    pdp__dealloc(all);
    return st;
}

PDP_API pdp_status pdp_ddp_create(pdp_ddp **out, pdp_model *m, pdp_comm *c,
                                  const pdp_ddp_desc *desc)
{
    static const char *fn = "pdp_ddp_create";
    pdp_ddp *d;
    pdp_status st;
    if (!out) return pdp__err(PDP_ERR_INVALID, "%s: out is NULL", fn);
    *out = NULL;
    if (!m || !c) return pdp__err(PDP_ERR_INVALID, "%s: %s is NULL", fn, m ? "comm" : "model");
    if (m->params_shared)
        return pdp__err(PDP_ERR_STATE, "%s: the model is a DataParallel replica", fn);
    if (m->hook)
        return pdp__err(PDP_ERR_STATE, "%s: the model already has a grad hook (another DDP?)", fn);
    if (m->device.kind != c->device.kind || m->device.ordinal != c->device.ordinal)
        return pdp__err(PDP_ERR_DEVICE, "%s: model on device %d:%d, communicator '%s' on %d:%d",
                        fn, m->device.kind, m->device.ordinal, c->name, c->device.kind,
                        c->device.ordinal);
    if (desc && (desc->bucket_cap_mb < 0.0 || desc->first_bucket_mb < 0.0))
        return pdp__err(PDP_ERR_INVALID, "%s: bucket_cap_mb %g and first_bucket_mb %g must be "
                        ">= 0", fn, desc->bucket_cap_mb, desc->first_bucket_mb);
    d = (pdp_ddp *)pdp__calloc(sizeof *d);
    if (!d) return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory", fn);
    d->m = m;
    d->c = c;
    if (desc) d->desc = *desc;
    d->desc.bucket_cap_mb = PDP__DEF(d->desc.bucket_cap_mb, 25.0);
    d->desc.first_bucket_mb = PDP__DEF(d->desc.first_bucket_mb,
                                       PDP__MIN(1.0, d->desc.bucket_cap_mb));
    if (pdp__ddp_plan(d) != PDP_OK) {
        pdp_ddp_free(d);
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory for %d buckets", fn, m->nparams);
    }
    /* collective from here on: every rank runs the same calls */
    if ((st = pdp__ddp_check_params(d)) != PDP_OK) {
        pdp_ddp_free(d);
        return st;
    }
    if (m->param_count &&
        (st = pdp_comm_broadcast(c, m->param_block, m->param_count, 0, NULL)) != PDP_OK) {
        pdp_ddp_free(d);
        return pdp__err_wrap(st, "%s: rank %d: broadcasting rank 0's parameters", fn, c->rank);
    }
    pdp_model_zero_grad(m);
    if (pdp__trace_open(c->backend == PDP_BACKEND_LOCAL ? -1 : c->rank) == PDP_OK) {
        d->traced = true;
        if (pdp__trace_enabled()) {
            char name[64];
            d->trace_compute = pdp__trace_track(c->rank, "compute");
            snprintf(name, sizeof name, "comm %s", c->name);
            d->trace_comm = pdp__trace_track(c->rank, name);
            m->trace_pid = c->rank;
            m->trace_tid = d->trace_compute;
        }
    }
    pdp_model_set_grad_hook(m, pdp__ddp_hook, d);
    d->stats.buckets = d->nbuckets;
    d->stats.grad_bytes = m->param_count * (int64_t)sizeof(float);
    *out = d;
    return PDP_OK;
}

PDP_API void pdp_ddp_free(pdp_ddp *d)
{
    int b;
    if (!d) return;
    if (d->buckets)
        for (b = 0; b < d->nbuckets; b++) /* the progress thread may still write gradients */
            if (d->buckets[b].launched && d->buckets[b].work) pdp_work_wait(d->buckets[b].work);
    if (d->m && d->m->hook == pdp__ddp_hook && d->m->hook_user == d) {
        pdp_model_set_grad_hook(d->m, NULL, NULL);
        d->m->trace_tid = 0;
    }
    if (d->traced) pdp__trace_close();
    pdp__dealloc(d->buckets);
    pdp__dealloc(d->bucket_of);
    pdp__dealloc(d);
}

/* ---- ddp: training ---- */

PDP_API pdp_status pdp_ddp_forward_backward(pdp_ddp *d, const pdp_tensor *x,
                                            const int32_t *labels, float *loss)
{
    static const char *fn = "pdp_ddp_forward_backward";
    double t0 = pdp__now();
    pdp_status st;
    if (!d) return pdp__err(PDP_ERR_INVALID, "%s: ddp is NULL", fn);
    if (d->state == PDP__DDP_REDUCING)
        return pdp__err(PDP_ERR_STATE, "%s: rank %d: the last backward's buckets are still being "
                        "reduced; call pdp_ddp_step or pdp_ddp_finish first", fn, d->c->rank);
    if (!d->no_sync) pdp__ddp_arm(d);
    st = pdp_model_forward_backward(d->m, x, labels, loss);
    if (d->no_sync) {
        if (st == PDP_OK) d->state = PDP__DDP_LOCAL;
    } else {
        d->state = PDP__DDP_REDUCING;
        d->failed = st != PDP_OK;
        if (st == PDP_OK) { /* buckets of parameters that got no gradient */
            int b;
            for (b = 0; b < d->nbuckets; b++) d->buckets[b].ready = true;
            pdp__ddp_launch_ready(d);
        }
        d->armed = false;
    }
    d->backward_acc += pdp__now() - t0;
    return st == PDP_OK ? st : pdp__err_wrap(st, "%s: rank %d", fn, d->c->rank);
}

PDP_API pdp_status pdp_ddp_finish(pdp_ddp *d)
{
    static const char *fn = "pdp_ddp_finish";
    pdp_status st = PDP_OK, first = PDP_OK;
    pdp_comm_stats cs;
    double t0, t1, busy = 0.0;
    char msg[768];
    int b;
    if (!d) return pdp__err(PDP_ERR_INVALID, "%s: ddp is NULL", fn);
    if (d->state == PDP__DDP_IDLE) return PDP_OK;
    if (d->state == PDP__DDP_LOCAL)
        return pdp__err(PDP_ERR_STATE, "%s: rank %d: the last backward ran under no_sync; run one "
                        "backward with no_sync off to reduce the accumulated gradients", fn,
                        d->c->rank);
    msg[0] = '\0';
    t0 = pdp__now();
    for (b = 0; b < d->nbuckets; b++) {
        pdp__ddp_bucket *k = &d->buckets[b];
        if (!k->launched || !k->work) continue;
        st = pdp_work_wait(k->work);
        if (st != PDP_OK && first == PDP_OK) {
            char name[160];
            first = st;
            pdp__ddp_bucket_name(d, b, name, sizeof name);
            snprintf(msg, sizeof msg, "%s: %.600s", name, pdp_last_error());
        }
        busy += k->work->t_done > k->work->t_start ? k->work->t_done - k->work->t_start : 0.0;
        if (d->trace_comm) {
            char name[48], args[88];
            snprintf(name, sizeof name, "allreduce bucket %d", b);
            snprintf(args, sizeof args, "\"bytes\":%lld,\"seq\":%lld,\"queued_us\":%.1f",
                     (long long)k->info.count * 4, (long long)k->work->seq,
                     (k->work->t_start - k->t_launch) * 1e6);
            pdp__trace_async(d->c->rank, d->trace_comm, "comm", name,
                             ((uint64_t)d->c->rank << 40) | (uint64_t)k->work->seq, k->t_launch,
                             k->work->t_done, args);
        }
        k->work = NULL;
    }
    t1 = pdp__now();
    d->state = PDP__DDP_IDLE;
    if (d->trace_compute) pdp__trace_complete(d->c->rank, d->trace_compute, "compute",
                                              "wait for buckets", t0, t1, NULL);
    if (first == PDP_OK && d->launch_status != PDP_OK) {
        first = d->launch_status;
        snprintf(msg, sizeof msg, "%.700s", d->launch_msg);
    }
    if (first == PDP_OK && d->failed) {
        d->failed = false;
        return pdp__err(PDP_ERR_STATE, "%s: rank %d: the last backward failed after launching %d "
                        "of %d buckets: the gradients are incomplete (this rank must leave the "
                        "group: free its communicator so that the others fail at once)", fn,
                        d->c->rank, d->next_launch, d->nbuckets);
    }
    if (first == PDP_OK && d->twice_param >= 0) {
        return pdp__err(PDP_ERR_STATE, "%s: rank %d: parameter '%s' reported its gradient twice "
                        "in one backward", fn, d->c->rank, d->m->params[d->twice_param].name);
    }
    if (first != PDP_OK)
        return pdp__err(first, "%s: rank %d: %s", fn, d->c->rank, msg);
    pdp_comm_get_stats(d->c, &cs);
    d->stats.steps++;
    d->stats.bytes_sent = cs.bytes_sent - d->bytes_at_arm;
    d->stats.backward_s = d->backward_acc;
    d->stats.allreduce_s = busy;
    d->stats.wait_s = t1 - t0;
    d->stats.hidden_share = busy > 0.0 ? PDP__MAX(0.0, PDP__MIN(1.0, 1.0 - (t1 - t0) / busy)) : 1.0;
    d->stats.total_bytes_sent += d->stats.bytes_sent;
    d->stats.total_backward_s += d->backward_acc;
    d->stats.total_allreduce_s += busy;
    d->stats.total_wait_s += t1 - t0;
    d->backward_acc = 0.0;
    return PDP_OK;
}

PDP_API pdp_status pdp_ddp_step(pdp_ddp *d, pdp_optim *opt)
{
    static const char *fn = "pdp_ddp_step";
    pdp_status st;
    double t0;
    if (!d || !opt) return pdp__err(PDP_ERR_INVALID, "%s: %s is NULL", fn, d ? "opt" : "ddp");
    if ((st = pdp_ddp_finish(d)) != PDP_OK) return pdp__err_wrap(st, "%s", fn);
    t0 = pdp__now();
    if ((st = pdp_optim_step(opt)) != PDP_OK)
        return pdp__err_wrap(st, "%s: rank %d", fn, d->c->rank);
    pdp_model_zero_grad(d->m);
    if (d->trace_compute)
        pdp__trace_complete(d->c->rank, d->trace_compute, "compute", "optimizer step", t0,
                            pdp__now(), NULL);
    return PDP_OK;
}

PDP_API void pdp_ddp_set_no_sync(pdp_ddp *d, bool no_sync)
{
    if (d) d->no_sync = no_sync;
}

PDP_API pdp_model *pdp_ddp_model(const pdp_ddp *d) { return d ? d->m : NULL; }
PDP_API pdp_comm *pdp_ddp_comm(const pdp_ddp *d) { return d ? d->c : NULL; }
PDP_API int pdp_ddp_num_buckets(const pdp_ddp *d) { return d ? d->nbuckets : 0; }

PDP_API pdp_status pdp_ddp_bucket_info(const pdp_ddp *d, int b, pdp_ddp_bucket *out)
{
    if (!d || !out) return pdp__err(PDP_ERR_INVALID, "pdp_ddp_bucket_info: NULL argument");
    if (b < 0 || b >= d->nbuckets)
        return pdp__err(PDP_ERR_INVALID, "pdp_ddp_bucket_info: bucket %d outside 0..%d", b,
                        d->nbuckets - 1);
    *out = d->buckets[b].info;
    return PDP_OK;
}

PDP_API void pdp_ddp_get_stats(const pdp_ddp *d, pdp_ddp_stats *out)
{
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (d) *out = d->stats;
}

PDP_API void pdp_ddp_reset_stats(pdp_ddp *d)
{
    if (!d) return;
    memset(&d->stats, 0, sizeof d->stats);
    d->stats.buckets = d->nbuckets;
    d->stats.grad_bytes = d->m->param_count * (int64_t)sizeof(float);
}
