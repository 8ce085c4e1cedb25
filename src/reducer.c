/* reducer: the bucket reducer that DDP and ZeRO share, PyTorch's Reducer
   (torch/csrc/distributed/c10d/reducer.cpp) in miniature, with the collective
   of a bucket as a parameter.

   Buckets are planned once, at construction, walking the parameters in reverse
   registration order and closing a bucket as soon as it holds cap bytes or more
   (the first: first bytes), PyTorch's compute_bucket_assignment_by_size.
   Because the model keeps its gradients in one block in registration order, a
   bucket of consecutive parameters in reverse order is one contiguous range
   [offset, offset + count) of that block: the collective runs on the gradients
   themselves, with no flattening copy (PyTorch's gradient_as_bucket_view=True,
   here by construction).

   The executor hands in its collective, one function pointer called once per
   bucket per synchronised backward (the only indirection on the hot path):
   DDP all-reduces (average) the bucket in place; ZeRO reduce-scatters it into
   the part of the flat block its rank owns. An optional after_step hook runs
   after the optimizer step (ZeRO: all-gather the updated parameters); op_name
   names the collective in the trace ("allreduce bucket 3"). With whole_layers
   a bucket never splits a layer's weight from its bias (ZeRO's units, whose
   layers it points at per-unit buffers). bucket_done (optional) runs after a
   bucket's collective has completed successfully, whoever waited for it
   (pdp__reducer_wait_bucket: finish, or the executor reusing a buffer).

   A communication hook (ddp.h's pdp_ddp_comm_hook, PyTorch's register_comm_hook)
   replaces the collective: the executor's reduce builds the bucket's view (what
   its collective would reduce, and where the result goes) and hands it to
   pdp__reducer_hook_launch, which calls the hook's launch with the bucket's piece
   of the scratch memory allocated once at registration; pdp__reducer_wait_bucket
   calls the hook's finish after the wait, before bucket_done, and a failing
   finish is reported like a failed collective, naming the bucket. Registration
   is refused once a backward has run (the buckets' collectives must be the same
   on every rank from the first step on).

   Every backward of the wrapped model synchronises, whatever computed its
   output gradient (the built-in cross-entropy, pdp_loss_mse, a user's own
   loss): the reducer listens to the model's BACKWARD_BEGIN and BACKWARD_END
   events (the executor seam of internal.h), arms itself at the start of every
   pdp_model_backward unless no_sync is on, and launches the leftover buckets
   at its end. A backward while the last one's buckets are still being reduced
   is refused by BACKWARD_BEGIN with a message naming the executor's finish.
   The executor may listen to the events too (desc.event: ZeRO points the
   layers at its buffers there).

   Per synchronised backward: pending[b] starts at the number of parameters in
   bucket b; the model's grad hook, fired once per parameter right after its
   layer's backward, decrements it; at zero the bucket is ready. Ready buckets
   launch strictly in bucket order (a later bucket that is ready first waits for
   the earlier ones), so every rank issues the same collectives in the same
   order whatever order its hooks fire in. A bucket whose parameters never get
   a gradient (unused in this forward) launches at the end of backward, so no
   rank waits on it. pdp__reducer_finish waits for the buckets in order and
   reports the first failure naming the bucket and its parameters.

   Uneven shards: with batch_mean PDP_BATCH_MEAN_GLOBAL (ddp.h) the reducer's own
   backward entries weight each backward by this rank's share of the global batch
   (one all-reduce of the batch sizes, then the loss gradient scaled before
   backward: "the global-batch mean" below); a backward that bypasses them
   (pdp_model_backward on the model) is refused at BACKWARD_BEGIN.

   States: IDLE (nothing pending), LOCAL (gradients accumulated under no_sync,
   not reduced), REDUCING (a synchronised backward launched its buckets and
   finish has not run). The progress of a bucket's collective writes the
   gradient memory, so nothing else may touch the gradients while REDUCING: a
   second backward is refused and pdp__reducer_release waits first. Nothing on
   the per-step path allocates: buckets, handles (the backends' pools) and
   messages are fixed-size. Every function takes fn, the public function on
   whose behalf it runs, to start its messages. */

#include "internal.h"

/* ---- reducer: state ---- */

typedef enum pdp__red_state {
    PDP__RED_IDLE,
    PDP__RED_LOCAL,
    PDP__RED_REDUCING
} pdp__red_state;

typedef struct pdp__reducer pdp__reducer;

/* Launches bucket b's collective (asynchronously, handle in *w) on r->c; the
   bucket is r->buckets[b].info, the gradients r->m->grad_block. */
typedef pdp_status (*pdp__reduce_fn)(pdp__reducer *r, int b, pdp_work **w);
/* Runs after the optimizer step of pdp__reducer_step (ZeRO: all-gather). */
typedef pdp_status (*pdp__after_step_fn)(pdp__reducer *r, const char *fn);
/* Runs once bucket b's collective has completed successfully. */
typedef void (*pdp__bucket_done_fn)(pdp__reducer *r, int b);

typedef struct pdp__reducer_desc {
    double cap_bytes;              /* close a bucket at >= this many bytes */
    double first_bytes;            /* the same for bucket 0 */
    pdp__reduce_fn reduce;         /* required */
    pdp__after_step_fn after_step; /* NULL: nothing */
    const char *op_name;           /* the collective's name in the trace ("allreduce") */
    const char *finish_names;      /* for messages: "pdp_ddp_step or pdp_ddp_finish" */
    void *user;                    /* the executor, for reduce and after_step */
    bool whole_layers;             /* never split a layer between buckets */
    pdp__bucket_done_fn bucket_done;  /* NULL: nothing */
    pdp__model_event_fn event;        /* the model's events (BACKWARD_BEGIN/END after the
                                         reducer's own handling), user = the reducer */
    pdp_batch_mean batch_mean;        /* ddp.h; GLOBAL: each backward's weight (below) */
    int stage;                        /* ZeRO's stage, 0 under DDP: checked equal on every
                                         rank, as batch_mean and the caps are */
    const char *backward_names;       /* for messages: "pdp_ddp_forward_backward or
                                         pdp_ddp_backward" */
} pdp__reducer_desc;

typedef struct pdp__red_bucket {
    pdp_ddp_bucket info;
    int nparams;
    int pending;          /* parameters still to report in this backward */
    bool ready, launched;
    bool hook_pending;    /* the comm hook launched it: its finish is still to run */
    pdp_work *work;
    double t_launch;
    pdp_comm_hook_bucket view; /* what the comm hook was given (finish gets the same) */
} pdp__red_bucket;

struct pdp__reducer {
    pdp_model *m;
    pdp_comm *c;
    pdp__reducer_desc desc;
    pdp__red_bucket *buckets;
    int nbuckets;
    int *bucket_of;       /* per parameter */
    int next_launch;      /* the first bucket not launched yet */
    pdp__red_state state;
    bool no_sync;
    bool armed;           /* the hook reduces (a synchronised backward is running) */
    bool failed;          /* the last synchronised backward failed: gradients incomplete */
    pdp_status launch_status;
    char launch_msg[512];
    int twice_param;      /* a parameter reported twice in one backward, or -1 */
    int launched_in_backward; /* buckets launched by the grad hook (before backward ended) */
    pdp_status wait_status;   /* the first failed bucket wait of this backward */
    char wait_msg[832];
    double busy;              /* execution seconds of this backward's waited buckets */
    int64_t bytes_at_arm;
    double backward_acc;  /* forward + backward seconds since the last finish */
    pdp_ddp_stats stats;  /* grad_bytes is the executor's to set */
    bool traced;
    int trace_compute, trace_comm;
    bool backward_seen;   /* a backward has run: too late to register a comm hook */
    pdp_ddp_comm_hook hook; /* hook.launch NULL: none; the executor's own collective */
    void *scratch;        /* the hook's scratch memory on the model's device, or NULL */
    int64_t *scratch_off; /* per bucket: its piece of scratch, in floats of the gradient */
    /* batch_mean GLOBAL: the all-reduced batch size of the backward being prepared */
    float count;          /* this rank's batch size, then (after the wait) the global batch */
    float *dcount;        /* its copy on the communicator's device (NULL on the CPU) */
    pdp_work *count_work; /* the all-reduce in flight, or NULL */
    int64_t count_bytes;  /* bytes of those all-reduces since the last finish (stats) */
    bool weighted;        /* the backward running now had its weight applied */
};

/* ---- reducer: buckets ---- */

/* The plan (the header's rule): walks m's parameters in reverse, closing a bucket at
   >= cap bytes (the first at first; whole_layers: never between a layer's weight and
   bias). Fills buckets and bucket_of when not NULL; returns the number of buckets. */
PDP__PRIVATE int pdp__reducer_walk(const pdp_model *m, double cap, double first, bool whole_layers,
                                   pdp__red_bucket *buckets, int *bucket_of)
{
    double bytes = 0.0;
    int p, b = 0, last = m->nparams - 1;
    for (p = m->nparams - 1; p >= 0; p--) {
        bytes += (double)m->params[p].count * sizeof(float);
        if (bucket_of) bucket_of[p] = b;
        if (whole_layers && p > 0 && m->params[p - 1].layer == m->params[p].layer)
            continue; /* the layer's weight joins its bias */
        if (bytes >= (b == 0 ? first : cap) || p == 0) { /* close bucket b: params p..last */
            if (buckets) {
                pdp__red_bucket *k = &buckets[b];
                k->info.first_param = p;
                k->info.last_param = last;
                k->info.offset = m->params[p].offset;
                k->info.count = m->params[last].offset + m->params[last].count - k->info.offset;
                k->nparams = last - p + 1;
            }
            b++;
            last = p - 1;
            bytes = 0.0;
        }
    }
    return b;
}

PDP__PRIVATE pdp_status pdp__reducer_plan(pdp__reducer *r)
{
    const pdp_model *m = r->m;
    r->buckets = (pdp__red_bucket *)pdp__calloc((size_t)PDP__MAX(1, m->nparams) *
                                                sizeof *r->buckets);
    r->bucket_of = (int *)pdp__calloc((size_t)PDP__MAX(1, m->nparams) * sizeof *r->bucket_of);
    if (!r->buckets || !r->bucket_of) return PDP_ERR_OUT_OF_MEMORY;
    r->nbuckets = pdp__reducer_walk(m, r->desc.cap_bytes, r->desc.first_bytes,
                                    r->desc.whole_layers, r->buckets, r->bucket_of);
    return PDP_OK;
}

/* ---- reducer: the bucket options of DDP's and ZeRO's descs ----
   One rule for both creates, checked before anything is allocated or communicated.
   bucket_cap_mb and first_bucket_mb (MiB): 0 (the default: 25, and min(1, cap)) or
   finite in (0, 1e12] (1e12 MiB, 2^60 bytes, is beyond any model and keeps every byte
   figure an exact int64). ZeRO's buffer counts (NULL: not an option of the caller):
   grad_buffers 0 (default 2) or 1..U and param_buffers 0 (default 2) or 2..max(2, U),
   U the number of units these bucket sizes give m: unit u takes gradient buffer
   u mod grad_buffers, so buffers beyond U would never be used, and two gather slots
   (the unit computing and the next one's prefetch) are the least stage 3 needs. Every
   failure names the field and its value. */
PDP__PRIVATE pdp_status pdp__bucket_opts_check(const pdp_model *m, double cap_mb, double first_mb,
                                               const int *gbufs, const int *pbufs, const char *fn)
{
    const char *name[2] = {"bucket_cap_mb", "first_bucket_mb"};
    int grad_buffers = gbufs ? *gbufs : 0, param_buffers = pbufs ? *pbufs : 0;
    double v[2];
    int i, units;
    v[0] = cap_mb;
    v[1] = first_mb;
    for (i = 0; i < 2; i++)
        if (!(v[i] >= 0.0 && v[i] <= 1e12))
            return pdp__err(PDP_ERR_INVALID, "%s: %s %g: must be 0 (the default) or a finite "
                            "size in MiB, > 0 and at most 1e12", fn, name[i], v[i]);
    if (grad_buffers < 0)
        return pdp__err(PDP_ERR_INVALID, "%s: grad_buffers %d is negative", fn, grad_buffers);
    if (param_buffers < 0)
        return pdp__err(PDP_ERR_INVALID, "%s: param_buffers %d is negative", fn, param_buffers);
    if (param_buffers == 1)
        return pdp__err(PDP_ERR_INVALID, "%s: param_buffers 1: stage 3 needs 2 or more (the "
                        "unit computing and the next one's prefetch; 0 for the default 2)", fn);
    if (grad_buffers == 0 && param_buffers == 0) return PDP_OK;
    cap_mb = PDP__DEF(cap_mb, 25.0);
    first_mb = PDP__DEF(first_mb, PDP__MIN(1.0, cap_mb));
    units = pdp__reducer_walk(m, cap_mb * 1048576.0, first_mb * 1048576.0, true, NULL, NULL);
    if (grad_buffers > PDP__MAX(1, units))
        return pdp__err(PDP_ERR_INVALID, "%s: grad_buffers %d: more than the %d units of "
                        "bucket_cap_mb %g (unit u takes buffer u mod grad_buffers; at most %d "
                        "can be used)", fn, grad_buffers, units, cap_mb, PDP__MAX(1, units));
    if (param_buffers > PDP__MAX(2, units))
        return pdp__err(PDP_ERR_INVALID, "%s: param_buffers %d: more than the %d units of "
                        "bucket_cap_mb %g (at most %d gather slots can be used)", fn,
                        param_buffers, units, cap_mb, PDP__MAX(2, units));
    return PDP_OK;
}

/* "bucket 1 of 3 (0.weight..0.bias, 1.57 MiB)" */
PDP__PRIVATE void pdp__red_bucket_name(const pdp__reducer *r, int b, char *out, size_t cap)
{
    const pdp__red_bucket *k = &r->buckets[b];
    snprintf(out, cap, "bucket %d of %d (%s..%s, %.3g MiB)", b, r->nbuckets,
             r->m->params[k->info.first_param].name, r->m->params[k->info.last_param].name,
             (double)k->info.count * 4.0 / 1048576.0);
}

PDP__PRIVATE void pdp__reducer_launch(pdp__reducer *r, int b)
{
    pdp__red_bucket *k = &r->buckets[b];
    pdp_status st;
    k->launched = true;
    k->t_launch = pdp__now();
    if (r->launch_status != PDP_OK) { /* an earlier bucket's launch failed: issue no later
        collective, so the peers fail at that bucket's (they would otherwise pair this rank's
        bucket b with their bucket b - 1 whenever the counts agree) */
        k->work = NULL;
        return;
    }
    st = r->desc.reduce(r, b, &k->work);
    if (st != PDP_OK && r->launch_status == PDP_OK) {
        char name[192];
        pdp__red_bucket_name(r, b, name, sizeof name);
        r->launch_status = st;
        snprintf(r->launch_msg, sizeof r->launch_msg, "%s: %.300s", name, pdp_last_error());
    }
}

/* Launches every ready bucket that has no unlaunched bucket before it. */
PDP__PRIVATE void pdp__reducer_launch_ready(pdp__reducer *r)
{
    while (r->next_launch < r->nbuckets && r->buckets[r->next_launch].ready)
        pdp__reducer_launch(r, r->next_launch++);
}

/* The model's grad hook: parameter p's gradient is final for this backward. */
PDP__PRIVATE void pdp__reducer_hook(void *user, pdp_model *m, int p)
{
    pdp__reducer *r = (pdp__reducer *)user;
    pdp__red_bucket *k;
    (void)m;
    if (!r->armed) return; /* no_sync: accumulate locally */
    k = &r->buckets[r->bucket_of[p]];
    if (k->ready) {
        if (r->twice_param < 0) r->twice_param = p;
        return;
    }
    if (--k->pending == 0) {
        int before = r->next_launch;
        k->ready = true;
        pdp__reducer_launch_ready(r);
        r->launched_in_backward += r->next_launch - before;
    }
}

PDP__PRIVATE void pdp__reducer_arm(pdp__reducer *r)
{
    pdp_comm_stats cs;
    int b;
    for (b = 0; b < r->nbuckets; b++) {
        pdp__red_bucket *k = &r->buckets[b];
        k->pending = k->nparams;
        k->ready = k->launched = k->hook_pending = false;
        k->work = NULL;
    }
    r->next_launch = 0;
    r->launch_status = PDP_OK;
    r->launch_msg[0] = '\0';
    r->twice_param = -1;
    r->launched_in_backward = 0;
    r->wait_status = PDP_OK;
    r->wait_msg[0] = '\0';
    r->busy = 0.0;
    pdp_comm_get_stats(r->c, &cs);
    r->bytes_at_arm = cs.bytes_sent;
    r->armed = true;
}

PDP__PRIVATE pdp_status pdp__reducer_finish(pdp__reducer *r, const char *fn); /* below */

/* The model's events. BACKWARD_BEGIN refuses a backward while the last one is
   being reduced and arms the reducer (unless no_sync); BACKWARD_END launches the
   buckets whose parameters got no gradient and records the state; ZERO_GRAD waits for the
   buckets in flight and forgets what no_sync accumulated. */
PDP__PRIVATE pdp_status pdp__reducer_event(void *user, pdp_model *m, pdp__model_event ev, int layer,
                                           pdp_status st)
{
    pdp__reducer *r = (pdp__reducer *)user;
    switch (ev) {
    case PDP__EV_BACKWARD_BEGIN:
        if (r->state == PDP__RED_REDUCING)
            return pdp__err(PDP_ERR_STATE, "rank %d: the last backward's buckets are still being "
                            "reduced; call %s first", r->c->rank, r->desc.finish_names);
        if (r->desc.batch_mean == PDP_BATCH_MEAN_GLOBAL && !r->weighted)
            return pdp__err(PDP_ERR_STATE, "rank %d: batch_mean is PDP_BATCH_MEAN_GLOBAL: run the "
                            "backward through %s, which weight this rank's gradient by its share "
                            "of the global batch", r->c->rank, r->desc.backward_names);
        r->backward_seen = true;
        if (!r->no_sync) pdp__reducer_arm(r);
        break;
    case PDP__EV_ZERO_GRAD:
        /* the gradients are being discarded: wait for the collectives still writing them (a
           failure shows again at the group's next collective) */
        if (r->state == PDP__RED_REDUCING) (void)pdp__reducer_finish(r, "pdp_model_zero_grad");
        if (r->state == PDP__RED_LOCAL) r->state = PDP__RED_IDLE; /* nothing left to reduce */
        break;
    case PDP__EV_BACKWARD_END:
        if (r->armed) {
            r->state = PDP__RED_REDUCING;
            m->grads_reducing = r->desc.finish_names;
            r->failed = st != PDP_OK;
            if (st == PDP_OK) { /* buckets of parameters that got no gradient */
                int b;
                for (b = 0; b < r->nbuckets; b++) r->buckets[b].ready = true;
                pdp__reducer_launch_ready(r);
            }
            r->armed = false;
        } else if (st == PDP_OK) {
            r->state = PDP__RED_LOCAL;
        }
        break;
    default:
        break;
    }
    return r->desc.event ? r->desc.event(user, m, ev, layer, st) : PDP_OK;
}

/* ---- reducer: construction ---- */

/* One parameter as the construction check compares it. */
typedef struct pdp__red_sig {
    char name[64];
    int64_t ndim;
    int64_t shape[4];
} pdp__red_sig;

PDP__PRIVATE void pdp__red_sig_of(const pdp_model *m, int p, pdp__red_sig *s)
{
    const pdp__param_entry *e = &m->params[p];
    memset(s, 0, sizeof *s);
    memcpy(s->name, e->name, sizeof s->name);
    s->ndim = e->ndim;
    memcpy(s->shape, e->shape, sizeof s->shape);
}

PDP__PRIVATE void pdp__red_sig_str(const pdp__red_sig *s, char *out, size_t cap)
{
    int i;
    size_t n = (size_t)snprintf(out, cap, "'%.63s' [", s->name);
    for (i = 0; i < s->ndim && i < 4 && n < cap; i++)
        n += (size_t)snprintf(out + n, cap - n, i ? ", %lld" : "%lld", (long long)s->shape[i]);
    if (n < cap) snprintf(out + n, cap - n, "]");
}

/* All-gather of count host floats per rank. Collective buffers live on the
   communicator's device (NCCL reads GPU memory only), so a GPU communicator
   stages them through a small device buffer; used once, at construction. */
PDP__PRIVATE pdp_status pdp__reducer_allgather_host(pdp_comm *c, const float *send, float *recv,
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
PDP__PRIVATE pdp_status pdp__reducer_check_params(const pdp_model *m, pdp_comm *c,
                                                  const pdp__reducer_desc *d, const char *fn)
{
    /* the desc's fields that must agree: GLOBAL adds a collective per backward, another
       stage or cap cuts other buckets (collectives of other sizes, or a hang) */
    static const char *const field[] = {"batch_mean", "stage", "bucket_cap_mb",
                                        "first_bucket_mb"};
    enum { NF = 1 + 4 };
    int64_t n0 = m->nparams;
    pdp__red_sig *table = NULL, mine;
    float diff[NF], *all = NULL;
    int p, q, mine_at = -1, worst_rank = -1, worst_at = -1, size = c->size;
    pdp_status st;
    if ((st = pdp_comm_broadcast_bytes(c, &n0, sizeof n0, 0)) != PDP_OK)
        return pdp__err_wrap(st, "%s: rank %d: exchanging parameter counts", fn, c->rank);
    if (n0 < 0 || n0 > (1 << 24))
        return pdp__err(PDP_ERR_INVALID, "%s: rank 0 reports %lld parameters", fn, (long long)n0);
    table = (pdp__red_sig *)pdp__calloc((size_t)PDP__MAX(1, n0) * sizeof *table);
    all = (float *)pdp__calloc((size_t)size * NF * sizeof *all);
    if (!table || !all) {
        st = pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory for %lld parameter signatures", fn,
                      (long long)n0);
        goto out; /* the others then time out on the next collective: memory is gone anyway */
    }
    if (c->rank == 0)
        for (p = 0; p < n0; p++) pdp__red_sig_of(m, p, &table[p]);
    if ((st = pdp_comm_broadcast_bytes(c, table, (size_t)n0 * sizeof *table, 0)) != PDP_OK) {
        st = pdp__err_wrap(st, "%s: rank %d: exchanging parameter signatures", fn, c->rank);
        goto out;
    }
    for (p = 0; p < PDP__MAX(n0, (int64_t)m->nparams); p++) {
        if (p >= n0 || p >= m->nparams) {
            mine_at = p;
            break;
        }
        pdp__red_sig_of(m, p, &mine);
        if (memcmp(&mine, &table[p], sizeof mine) != 0) {
            mine_at = p;
            break;
        }
    }
    diff[0] = (float)mine_at;
    diff[1] = (float)d->batch_mean, diff[2] = (float)d->stage;
    diff[3] = (float)(d->cap_bytes / (1024.0 * 1024.0));
    diff[4] = (float)(d->first_bytes / (1024.0 * 1024.0));
    if ((st = pdp__reducer_allgather_host(c, diff, all, NF)) != PDP_OK) {
        st = pdp__err_wrap(st, "%s: rank %d: exchanging the check's verdicts", fn, c->rank);
        goto out;
    }
    for (q = 0; q < size; q++)
        if (all[NF * q] >= 0.0f && (worst_at < 0 || (int)all[NF * q] < worst_at)) {
            worst_at = (int)all[NF * q];
            worst_rank = q;
        }
    for (q = 1; q < size && worst_at < 0; q++)
        for (p = 1; p < NF; p++)
            if (all[NF * q + p] != all[p]) {
                st = pdp__err(PDP_ERR_INVALID, "%s: %s differs across ranks: %g on rank %d, %g "
                              "on rank 0 (every rank must pass the same)", fn, field[p - 1],
                              (double)all[NF * q + p], q, (double)all[p]);
                goto out;
            }
    if (worst_at >= 0) {
        char a[160], b[160];
        if (mine_at >= 0) {
            if (mine_at < m->nparams) pdp__red_sig_of(m, mine_at, &mine);
            if (mine_at < m->nparams) pdp__red_sig_str(&mine, a, sizeof a);
            else snprintf(a, sizeof a, "missing (it has %d parameters)", m->nparams);
            if (mine_at < n0) pdp__red_sig_str(&table[mine_at], b, sizeof b);
            else snprintf(b, sizeof b, "missing (it has %lld parameters)", (long long)n0);
            st = pdp__err(PDP_ERR_INVALID, "%s: parameters differ across ranks: parameter %d is "
                          "%s on rank %d but %s on rank 0", fn, mine_at, a, c->rank, b);
        } else {
            if (worst_at < n0) pdp__red_sig_str(&table[worst_at], b, sizeof b);
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


/* Sets up r (zeroed memory, owned by the executor) on m and c, on this rank alone: checks
   that the model can take a reducer and plans the buckets. Then pdp__reducer_join. On
   failure of either the executor calls pdp__reducer_release(r). */
PDP__PRIVATE pdp_status pdp__reducer_init(pdp__reducer *r, pdp_model *m, pdp_comm *c,
                                          const pdp__reducer_desc *desc, const char *fn)
{
    PDP_ASSERT(desc && desc->reduce && desc->op_name && desc->finish_names);
    if (m->params_shared)
        return pdp__err(PDP_ERR_STATE, "%s: the model is a DataParallel replica", fn);
    if (m->exec_hook || m->event)
        return pdp__err(PDP_ERR_STATE, "%s: the model already has an executor's grad hook "
                        "(another DDP?)", fn);
    if (m->device.kind != c->device.kind || m->device.ordinal != c->device.ordinal)
        return pdp__err(PDP_ERR_DEVICE, "%s: model on device %d:%d, communicator '%s' on %d:%d",
                        fn, m->device.kind, m->device.ordinal, c->name, c->device.kind,
                        c->device.ordinal);
    if (desc->batch_mean != PDP_BATCH_MEAN_RANKS && desc->batch_mean != PDP_BATCH_MEAN_GLOBAL)
        return pdp__err(PDP_ERR_INVALID, "%s: batch_mean %d is not PDP_BATCH_MEAN_RANKS (0) or "
                        "PDP_BATCH_MEAN_GLOBAL (1)", fn, (int)desc->batch_mean);
    r->m = m;
    r->c = c;
    r->desc = *desc;
    if (!r->desc.backward_names) r->desc.backward_names = "the executor's backward";
    if (pdp__reducer_plan(r) != PDP_OK)
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory for %d buckets", fn, m->nparams);
    if (desc->batch_mean == PDP_BATCH_MEAN_GLOBAL && c->device.kind != PDP_DEVICE_CPU &&
        pdp__dev_alloc(c->device, sizeof(float), (void **)&r->dcount) != PDP_OK)
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: rank %d: no device memory for the batch "
                        "size's all-reduce", fn, c->rank);
    return PDP_OK;
}

/* The collective half of the set-up, after pdp__reducer_init succeeded on every rank (the
   executor agrees on it first, pdp__comm_agree): checks that every rank has the same
   parameters, copies rank 0's parameters to every rank, zeroes the gradients, opens the
   trace and installs the grad hook. A failure here is every rank's (the check's verdicts
   are all-gathered; a failed broadcast fails everywhere or times out). */
PDP__PRIVATE pdp_status pdp__reducer_join(pdp__reducer *r, const char *fn)
{
    pdp_model *m = r->m;
    pdp_comm *c = r->c;
    pdp_status st;
    if ((st = pdp__reducer_check_params(m, c, &r->desc, fn)) != PDP_OK) return st;
    if (m->param_count &&
        (st = pdp_comm_broadcast(c, m->param_block, m->param_count, 0, NULL)) != PDP_OK)
        return pdp__err_wrap(st, "%s: rank %d: broadcasting rank 0's parameters", fn, c->rank);
    pdp_model_zero_grad(m);
    if (pdp__trace_open(c->backend == PDP_BACKEND_LOCAL ? -1 : c->trace_pid) == PDP_OK) {
        r->traced = true;
        if (pdp__trace_enabled()) {
            char name[PDP__COMM_NAME_CAP + 8];
            r->trace_compute = pdp__trace_track(c->trace_pid, "compute");
            snprintf(name, sizeof name, "comm %s", c->name);
            r->trace_comm = pdp__trace_track(c->trace_pid, name);
            m->trace_pid = c->trace_pid;
            m->trace_tid = r->trace_compute;
        }
    }
    m->exec_hook = pdp__reducer_hook; /* beside the user's (pdp_model_set_grad_hook) */
    m->exec_hook_user = r;
    m->event = pdp__reducer_event;
    m->event_user = r;
    r->stats.buckets = r->nbuckets;
    return PDP_OK;
}

/* Waits for buckets still in flight, removes the hook, frees the buckets. */
PDP__PRIVATE void pdp__reducer_release(pdp__reducer *r)
{
    int b;
    if (r->buckets)
        for (b = 0; b < r->nbuckets; b++) /* the progress thread may still write gradients */
            if (r->buckets[b].launched && r->buckets[b].work) pdp_work_wait(r->buckets[b].work);
    if (r->count_work) pdp_work_wait(r->count_work);
    r->count_work = NULL;
    if (r->dcount) pdp__dev_free(r->c->device, r->dcount);
    r->dcount = NULL;
    if (r->m && r->m->exec_hook == pdp__reducer_hook && r->m->exec_hook_user == r) {
        r->m->exec_hook = NULL;
        r->m->exec_hook_user = NULL;
        r->m->event = NULL;
        r->m->event_user = NULL;
        r->m->trace_tid = 0;
        r->m->grads_reducing = NULL;
    }
    if (r->traced) pdp__trace_close();
    if (r->scratch) pdp__dev_free(r->m->device, r->scratch);
    pdp__dealloc(r->scratch_off);
    pdp__dealloc(r->buckets);
    pdp__dealloc(r->bucket_of);
    r->buckets = NULL;
    r->bucket_of = NULL;
    r->scratch = NULL;
    r->scratch_off = NULL;
    r->traced = false;
}

/* ---- reducer: communication hooks ---- */

/* Registers hook (fn names the public entry: pdp_ddp_register_comm_hook or
   pdp_zero_register_comm_hook). The scratch is total floats' worth of
   hook->scratch_bytes_per_float bytes on the model's device, allocated here once;
   bucket b's piece starts off[b] floats in (off NULL: at the bucket's offset in the
   flat block, total = the parameter count). */
PDP__PRIVATE pdp_status pdp__reducer_set_hook(pdp__reducer *r, const pdp_ddp_comm_hook *hook,
                                              const int64_t *off, int64_t total, const char *fn)
{
    size_t bytes;
    int b;
    if (!hook) return pdp__err(PDP_ERR_INVALID, "%s: hook is NULL", fn);
    if (!hook->launch)
        return pdp__err(PDP_ERR_INVALID, "%s: hook->launch is NULL (a hook must start the "
                        "bucket's collective)", fn);
    if (hook->scratch_bytes_per_float < 0 || hook->scratch_bytes_per_float > 64)
        return pdp__err(PDP_ERR_INVALID, "%s: hook->scratch_bytes_per_float %d outside 0..64", fn,
                        hook->scratch_bytes_per_float);
    if (r->hook.launch)
        return pdp__err(PDP_ERR_STATE, "%s: rank %d: a communication hook is already registered "
                        "(one per executor, as PyTorch's register_comm_hook)", fn, r->c->rank);
    if (r->backward_seen)
        return pdp__err(PDP_ERR_STATE, "%s: rank %d: a backward has already run; register the "
                        "hook before the first backward", fn, r->c->rank);
    if (hook->scratch_bytes_per_float > 0) {
        bytes = (size_t)total * (size_t)hook->scratch_bytes_per_float;
        r->scratch_off = (int64_t *)pdp__calloc((size_t)PDP__MAX(1, r->nbuckets) * sizeof(int64_t));
        if (!r->scratch_off)
            return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory for %d buckets", fn,
                            r->nbuckets);
        for (b = 0; b < r->nbuckets; b++)
            r->scratch_off[b] = off ? off[b] : r->buckets[b].info.offset;
        if (pdp__dev_alloc(r->m->device, bytes, &r->scratch) != PDP_OK) {
            pdp__dealloc(r->scratch_off);
            r->scratch_off = NULL;
            return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: rank %d: no memory for the hook's %zu "
                            "bytes of scratch", fn, r->c->rank, bytes);
        }
    }
    r->hook = *hook;
    return PDP_OK;
}

/* The executor's reduce with a hook registered: v holds the collective's part of the
   view (grad, count, reduce_scatter, recv, recv_count); the rest is filled here. */
PDP__PRIVATE pdp_status pdp__reducer_hook_launch(pdp__reducer *r, int b,
                                                 const pdp_comm_hook_bucket *v, pdp_work **w)
{
    pdp__red_bucket *k = &r->buckets[b];
    pdp_status st;
    k->view = *v;
    k->view.index = b;
    k->view.nbuckets = r->nbuckets;
    k->view.offset = k->info.offset;
    k->view.device = r->m->device;
    k->view.rank = r->c->rank;
    k->view.world_size = r->c->size;
    k->view.scratch = r->scratch ? (char *)r->scratch + r->scratch_off[b] *
                                                           (int64_t)r->hook.scratch_bytes_per_float
                                 : NULL;
    *w = NULL;
    st = r->hook.launch(r->hook.state, r->c, &k->view, w);
    if (st != PDP_OK) {
        char msg[400];
        snprintf(msg, sizeof msg, "%.399s", pdp_last_error());
        if (!msg[0]) /* the hook set no message of pdp's: say at least what it returned */
            snprintf(msg, sizeof msg, "returned %s without an error message", pdp_status_name(st));
        *w = NULL;
        return pdp__err(st, "comm hook launch: %s", msg);
    }
    k->hook_pending = true;
    return PDP_OK;
}

/* ---- reducer: the global-batch mean ----
   batch_mean PDP_BATCH_MEAN_GLOBAL (ddp.h): rank r's batch of n_r samples weighs
   w_r = N n_r / T in the average over ranks, T = sum of n_r (one all-reduce of
   one float per backward, exact up to 2^24 samples), so the averaged gradient is
   sum_r n_r g_r / T, that of the mean loss over the concatenated global batch.
   The weight multiplies the loss gradient dy before backward (backward is linear
   in dy): the built-in cross-entropy takes N / T as its grad_scale instead of
   1 / n_r, an own loss's dy is copied into the model's grad_a scaled by w_r. So
   each backward is weighted by its own global batch, and k accumulated backward
   passes sum k global-batch means, as k backward passes on one device. */

/* Starts the all-reduce (sum) of this rank's batch size n; its bytes go to the
   executor's stats. */
PDP__PRIVATE pdp_status pdp__reducer_count_launch(pdp__reducer *r, int64_t n, const char *fn)
{
    pdp_comm_stats a, b;
    pdp_status st;
    pdp_comm_get_stats(r->c, &a);
    r->count = (float)n;
    if (!r->dcount) {
        st = pdp_comm_allreduce(r->c, &r->count, 1, PDP_REDUCE_SUM, &r->count_work);
    } else if ((st = pdp__dev_copy(r->c->device, r->dcount, pdp_cpu(), &r->count,
                                   sizeof(float))) == PDP_OK) {
        st = pdp_comm_allreduce(r->c, r->dcount, 1, PDP_REDUCE_SUM, &r->count_work);
    }
    pdp_comm_get_stats(r->c, &b);
    r->count_bytes += b.bytes_sent - a.bytes_sent;
    if (st == PDP_OK) return PDP_OK;
    r->count_work = NULL;
    return pdp__err_wrap(st, "%s: rank %d: all-reducing the batch sizes", fn, r->c->rank);
}

/* Waits for it: *weight = N n / T for this rank's n, *scale = N / T (both 0 when T is 0:
   every label of the global batch ignored, a batch that teaches nothing). */
PDP__PRIVATE pdp_status pdp__reducer_count_wait(pdp__reducer *r, int64_t n, float *weight,
                                                float *scale, const char *fn)
{
    pdp_status st = pdp_work_wait(r->count_work);
    double total;
    r->count_work = NULL;
    if (st == PDP_OK && r->dcount)
        st = pdp__dev_copy(pdp_cpu(), &r->count, r->c->device, r->dcount, sizeof(float));
    if (st != PDP_OK)
        return pdp__err_wrap(st, "%s: rank %d: all-reducing the batch sizes", fn, r->c->rank);
    total = (double)r->count;
    if (!(total >= (double)n))
        return pdp__err(PDP_ERR_INVALID, "%s: rank %d: the global batch is %g samples, this "
                        "rank's %lld", fn, r->c->rank, total, (long long)n);
    *scale = total > 0.0 ? (float)((double)r->c->size / total) : 0.0f;
    *weight = total > 0.0 ? (float)((double)r->c->size * (double)n / total) : 0.0f;
    return PDP_OK;
}

/* The labels the built-in cross-entropy counts for x: its rows (a sample's one, a GPT's
   one a position: the last layer's per-sample rows) whose label is not -1. */
PDP__PRIVATE int64_t pdp__reducer_label_count(const pdp_model *m, const pdp_tensor *x,
                                              const int32_t *labels)
{
    const pdp__layer *last = m->nlayers > 0 ? &m->layers[m->nlayers - 1] : NULL;
    int64_t rows = x->shape[0], i, n = 0;
    if (last && last->out_ndim > 0 && last->out_shape[last->out_ndim - 1] > 0)
        rows *= last->out_count / last->out_shape[last->out_ndim - 1];
    for (i = 0; i < rows; i++) n += labels[i] != -1;
    return n;
}

/* The built-in cross-entropy pass weighted by the global batch (loss.c's
   pdp_model_forward_backward with grad_scale N / T, T the labels that count on all
   ranks): the counts' all-reduce runs during the forward. *loss is this rank's mean. */
PDP__PRIVATE pdp_status pdp__reducer_forward_backward_global(pdp__reducer *r, const pdp_tensor *x,
                                                             const int32_t *labels, float *loss,
                                                             const char *fn)
{
    pdp_model *m = r->m;
    const pdp_tensor *y = NULL;
    pdp_tensor dy;
    double sum = 0.0;
    float weight = 1.0f, scale = 0.0f; /* set by pdp__reducer_count_wait when it succeeds */
    int64_t n;
    pdp_status st, wst;
    if (!x || !labels || !loss) return pdp__err(PDP_ERR_INVALID, "%s: NULL argument", fn);
    n = pdp__reducer_label_count(m, x, labels);
    if ((st = pdp__reducer_count_launch(r, n, fn)) != PDP_OK) return st;
    st = pdp_model_forward(m, x, &y);
    wst = pdp__reducer_count_wait(r, n, &weight, &scale, fn);
    if (st != PDP_OK) return pdp__err_wrap(st, "%s: rank %d", fn, r->c->rank);
    if (wst != PDP_OK) {
        m->have_forward = false;
        return wst;
    }
    if ((st = pdp__model_check_logits(m, y, fn)) != PDP_OK) return st;
    st = pdp__cross_entropy_rows_on(m->device, y->data, labels, y->count / y->shape[y->ndim - 1],
                                    y->shape[y->ndim - 1], scale, &sum, m->grad_a, fn);
    *loss = n > 0 ? (float)(sum / (double)n) : 0.0f;
    if (st != PDP_OK) {
        m->have_forward = false;
        return st;
    }
    pdp_tensor_wrap(m->grad_a, m->device, y->ndim, y->shape, &dy);
    r->weighted = true;
    st = pdp_model_backward(m, &dy);
    r->weighted = false;
    return st == PDP_OK ? st : pdp__err_wrap(st, "%s: rank %d", fn, r->c->rank);
}

/* An own loss's backward weighted by the global batch: dy x N n / T into the
   model's grad_a (which backward accepts as dy), then backward from it. */
PDP__PRIVATE pdp_status pdp__reducer_backward_global(pdp__reducer *r, const pdp_tensor *dy,
                                                     const char *fn)
{
    pdp_model *m = r->m;
    pdp_tensor scaled;
    float weight = 1.0f, scale = 0.0f;
    pdp_status st;
    if (!dy) return pdp__err(PDP_ERR_INVALID, "%s: dy is NULL", fn);
    if (!m->have_forward)
        return pdp__err(PDP_ERR_STATE, "%s: rank %d: no forward since the last backward", fn,
                        r->c->rank);
    if (!pdp__same_shape(dy, &m->out_view)) {
        char a[96], b[96];
        return pdp__err(PDP_ERR_SHAPE, "%s: rank %d: dy is %s, the output was %s", fn, r->c->rank,
                        pdp__shape_str(dy, a, sizeof a), pdp__shape_str(&m->out_view, b, sizeof b));
    }
    if ((st = pdp__reducer_count_launch(r, m->batch, fn)) != PDP_OK ||
        (st = pdp__reducer_count_wait(r, m->batch, &weight, &scale, fn)) != PDP_OK)
        return st;
    if (dy->data != m->grad_a &&
        (st = pdp__dev_copy(m->device, m->grad_a, dy->device, dy->data,
                            (size_t)dy->count * sizeof(float))) != PDP_OK)
        return pdp__err_wrap(st, "%s: rank %d: weighting dy", fn, r->c->rank);
    if ((st = pdp__grad_scale(m, m->grad_a, dy->count, weight, fn)) != PDP_OK) return st;
    pdp_tensor_wrap(m->grad_a, m->device, m->out_view.ndim, m->out_view.shape, &scaled);
    r->weighted = true;
    st = pdp_model_backward(m, &scaled);
    r->weighted = false;
    return st == PDP_OK ? st : pdp__err_wrap(st, "%s: rank %d", fn, r->c->rank);
}

/* ---- reducer: training ---- */

/* The global index of this rank's first sample, for the keys of its dropout masks: rank x
   its batch, as when every rank holds an equal shard of the global batch in rank order (a
   DistributedSampler's); the masks are then the single-device run's on the whole batch, and
   two ranks never draw the same masks for their i-th samples. */
PDP__PRIVATE void pdp__reducer_sample_base(pdp__reducer *r, const pdp_tensor *x)
{
    r->m->sample_base = (int64_t)r->c->rank * x->shape[0];
}

/* Forward, loss and backward on this rank's shard; the buckets launch as their
   gradients become ready (unless no_sync): the model's events do it. */
PDP__PRIVATE pdp_status pdp__reducer_backward(pdp__reducer *r, const pdp_tensor *x,
                                              const int32_t *labels, float *loss, const char *fn)
{
    double t0 = pdp__now();
    pdp_status st;
    if (r->state == PDP__RED_REDUCING) /* before the forward, which would be wasted */
        return pdp__err(PDP_ERR_STATE, "%s: rank %d: the last backward's buckets are still being "
                        "reduced; call %s first", fn, r->c->rank, r->desc.finish_names);
    if (x) pdp__reducer_sample_base(r, x);
    if (r->desc.batch_mean == PDP_BATCH_MEAN_GLOBAL) {
        st = pdp__reducer_forward_backward_global(r, x, labels, loss, fn);
        r->backward_acc += pdp__now() - t0;
        return st;
    }
    st = pdp_model_forward_backward(r->m, x, labels, loss);
    r->backward_acc += pdp__now() - t0;
    return st == PDP_OK ? st : pdp__err_wrap(st, "%s: rank %d", fn, r->c->rank);
}

/* A user's own loss: forward on this rank's shard (*y: the model's output). */
PDP__PRIVATE pdp_status pdp__reducer_forward(pdp__reducer *r, const pdp_tensor *x,
                                             const pdp_tensor **y, const char *fn)
{
    double t0 = pdp__now();
    pdp_status st;
    if (y) *y = NULL;
    if (r->state == PDP__RED_REDUCING)
        return pdp__err(PDP_ERR_STATE, "%s: rank %d: the last backward's buckets are still being "
                        "reduced; call %s first", fn, r->c->rank, r->desc.finish_names);
    if (x) pdp__reducer_sample_base(r, x);
    st = pdp_model_forward(r->m, x, y);
    r->backward_acc += pdp__now() - t0;
    return st == PDP_OK ? st : pdp__err_wrap(st, "%s: rank %d", fn, r->c->rank);
}

/* ... and backward from dy, the gradient of the user's loss with respect to y. */
PDP__PRIVATE pdp_status pdp__reducer_backward_dy(pdp__reducer *r, const pdp_tensor *dy,
                                                 const char *fn)
{
    double t0 = pdp__now();
    pdp_status st;
    if (r->desc.batch_mean == PDP_BATCH_MEAN_GLOBAL) {
        if (r->state == PDP__RED_REDUCING) /* before the batch sizes' collective */
            return pdp__err(PDP_ERR_STATE, "%s: rank %d: the last backward's buckets are still "
                            "being reduced; call %s first", fn, r->c->rank, r->desc.finish_names);
        st = pdp__reducer_backward_global(r, dy, fn);
        r->backward_acc += pdp__now() - t0;
        return st;
    }
    st = pdp_model_backward(r->m, dy);
    r->backward_acc += pdp__now() - t0;
    return st == PDP_OK ? st : pdp__err_wrap(st, "%s: rank %d", fn, r->c->rank);
}

/* The wait of bucket b's handle: records its time, its trace event and the first
   failure (named after the bucket). */
PDP__PRIVATE pdp_status pdp__reducer_wait_work(pdp__reducer *r, int b)
{
    pdp__red_bucket *k = &r->buckets[b];
    pdp_status st;
    st = pdp_work_wait(k->work);
    if (st != PDP_OK && r->wait_status == PDP_OK) {
        char name[192];
        r->wait_status = st;
        pdp__red_bucket_name(r, b, name, sizeof name);
        snprintf(r->wait_msg, sizeof r->wait_msg, "%s: %.600s", name, pdp_last_error());
    }
    r->busy += k->work->t_done > k->work->t_start ? k->work->t_done - k->work->t_start : 0.0;
    if (r->trace_comm) {
        char name[48], args[88];
        snprintf(name, sizeof name, "%.24s bucket %d", r->desc.op_name, b);
        snprintf(args, sizeof args, "\"grad_bytes\":%lld,\"seq\":%lld,\"queued_us\":%.1f",
                 (long long)k->info.count * 4, (long long)k->work->seq,
                 (k->work->t_start - k->t_launch) * 1e6);
        pdp__trace_async(r->c->trace_pid, r->trace_comm, "comm", name,
                         ((uint64_t)r->c->trace_pid << 40) | (uint64_t)k->work->seq, k->t_launch,
                         k->work->t_done, args);
    }
    k->work = NULL;
    return st;
}

/* Waits for bucket b if it was launched and not waited yet, runs the comm hook's
   finish (a failure is recorded as the wait's, named after the bucket), then
   bucket_done on success. */
PDP__PRIVATE void pdp__reducer_wait_bucket(pdp__reducer *r, int b)
{
    pdp__red_bucket *k = &r->buckets[b];
    pdp_status st = PDP_OK;
    if (!k->launched || (!k->work && !k->hook_pending)) return;
    if (k->work) st = pdp__reducer_wait_work(r, b);
    if (k->hook_pending) { /* the hook's finish: after the wait (decompress) */
        k->hook_pending = false;
        if (st == PDP_OK && r->hook.finish &&
            (st = r->hook.finish(r->hook.state, &k->view)) != PDP_OK && r->wait_status == PDP_OK) {
            char name[192];
            r->wait_status = st;
            pdp__red_bucket_name(r, b, name, sizeof name);
            snprintf(r->wait_msg, sizeof r->wait_msg, "%s: comm hook finish: %.580s", name,
                     pdp_last_error());
        }
    }
    if (st == PDP_OK && r->desc.bucket_done) r->desc.bucket_done(r, b);
}

/* Waits for every bucket of the last synchronised backward, in bucket order;
   the first failure names its bucket and parameters. */
PDP__PRIVATE pdp_status pdp__reducer_finish(pdp__reducer *r, const char *fn)
{
    pdp_status first;
    pdp_comm_stats cs;
    double t0, t1, busy;
    char msg[832];
    int b;
    if (r->state == PDP__RED_IDLE) return PDP_OK;
    if (r->state == PDP__RED_LOCAL)
        return pdp__err(PDP_ERR_STATE, "%s: rank %d: the last backward ran under no_sync; run one "
                        "backward with no_sync off to reduce the accumulated gradients", fn,
                        r->c->rank);
    t0 = pdp__now();
    for (b = 0; b < r->nbuckets; b++) pdp__reducer_wait_bucket(r, b);
    t1 = pdp__now();
    first = r->wait_status;
    busy = r->busy;
    snprintf(msg, sizeof msg, "%s", r->wait_msg);
    r->state = PDP__RED_IDLE;
    r->m->grads_reducing = NULL;
    if (r->trace_compute) pdp__trace_complete(r->c->trace_pid, r->trace_compute, "compute",
                                              "wait for buckets", t0, t1, NULL);
    if (first == PDP_OK && r->launch_status != PDP_OK) {
        first = r->launch_status;
        snprintf(msg, sizeof msg, "%.700s", r->launch_msg);
    }
    if (first == PDP_OK && r->failed) {
        r->failed = false;
        return pdp__err(PDP_ERR_STATE, "%s: rank %d: the last backward failed after launching %d "
                        "of %d buckets: the gradients are incomplete (this rank must leave the "
                        "group: free its communicator so that the others fail at once)", fn,
                        r->c->rank, r->next_launch, r->nbuckets);
    }
    if (first == PDP_OK && r->twice_param >= 0) {
        return pdp__err(PDP_ERR_STATE, "%s: rank %d: parameter '%s' reported its gradient twice "
                        "in one backward", fn, r->c->rank, r->m->params[r->twice_param].name);
    }
    if (first != PDP_OK)
        return pdp__err(first, "%s: rank %d: %s", fn, r->c->rank, msg);
    pdp_comm_get_stats(r->c, &cs);
    r->stats.steps++;
    r->stats.bytes_sent = cs.bytes_sent - r->bytes_at_arm + r->count_bytes;
    r->count_bytes = 0;
    r->stats.backward_s = r->backward_acc;
    r->stats.allreduce_s = busy;
    r->stats.wait_s = t1 - t0;
    r->stats.hidden_share = busy > 0.0 ? PDP__MAX(0.0, PDP__MIN(1.0, 1.0 - (t1 - t0) / busy)) : 1.0;
    r->stats.launched_in_backward = r->launched_in_backward;
    r->stats.total_bytes_sent += r->stats.bytes_sent;
    r->stats.total_backward_s += r->backward_acc;
    r->stats.total_allreduce_s += busy;
    r->stats.total_wait_s += t1 - t0;
    r->backward_acc = 0.0;
    return PDP_OK;
}

/* After a successful finish: opt's step (a range optimizer steps its range
   only), zeroed gradients, then the executor's after_step. */
PDP__PRIVATE pdp_status pdp__reducer_step(pdp__reducer *r, pdp_optim *opt, const char *fn)
{
    pdp_status st;
    double t0 = pdp__now();
    if ((st = pdp_optim_step(opt)) != PDP_OK)
        return pdp__err_wrap(st, "%s: rank %d", fn, r->c->rank);
    pdp_model_zero_grad(r->m);
    if (r->trace_compute)
        pdp__trace_complete(r->c->trace_pid, r->trace_compute, "compute", "optimizer step", t0,
                            pdp__now(), NULL);
    if (r->desc.after_step && (st = r->desc.after_step(r, fn)) != PDP_OK) return st;
    return PDP_OK;
}

PDP__PRIVATE void pdp__reducer_reset_stats(pdp__reducer *r)
{
    int64_t grad_bytes = r->stats.grad_bytes;
    memset(&r->stats, 0, sizeof r->stats);
    r->stats.buckets = r->nbuckets;
    r->stats.grad_bytes = grad_bytes;
}
