/* comm_local: the local backend: N ranks are threads of one process, buffers in shared
   memory, no dependency; the default, and what the tests use.

   N ranks are threads of one process; a pdp_local_group is their shared
   meeting point. Each rank's communicator owns a collective queue (comm_queue.c,
   shared with the MPI backend) whose persistent progress thread runs the
   rank's collectives in issue order, so an asynchronous
   collective progresses while the rank's own thread computes (DDP overlaps a
   bucket's all-reduce with the rest of backward this way). One collective is:

     arrive    the progress thread publishes its arguments in the group's slot
               for its rank and enters barrier A. The last rank to arrive checks
               that all ranks issued the same collective (kind, count, op, root);
     work      rank r's progress thread handles slice r of the data: for an
               all-reduce it sums slice r of every rank's buffer in rank order
               0, 1, ..., N-1 (fixed, so every rank gets bit-identical sums)
               and writes the result into every rank's buffer; broadcast,
               reduce-scatter and all-gather split the same way;
     leave     barrier B: no rank's buffer is touched after it, so the handle
               completes and the rank may reuse its buffers and its slot.

   The work of one collective is therefore spread over the ranks (each moves
   about 2(N-1)/N of the buffer for an all-reduce, the ring figure), and a
   rank's buffers are only written by progress threads between A and B.

   Faults never hang: every wait in a barrier is a pdp__cond_timedwait on
   the monotonic clock against the group's timeout_s. A rank that does not arrive
   makes the others fail with PDP_ERR_TIMEOUT naming the collective, its
   sequence number and the missing rank; a rank whose communicator is freed
   marks itself as gone, and a rank waiting for it fails at once with
   PDP_ERR_COMM. Either way the group becomes broken: every later collective on
   any rank fails fast with the first failure's message (as an aborted NCCL
   communicator does).

   Locks: group->mu guards the barrier state, the slots and the broken flag;
   the queue's mu guards its queue, its handle pool and the handles' done
   flags. The progress thread never holds both. Buffer contents pass between
   threads only across these mutexes, so the backend is TSan clean. Handles
   come from a fixed pool per communicator: nothing is allocated per
   collective. */

#include "internal.h"

/* ---- comm_local: the group ---- */

#define PDP__LOCAL_MAX_RANKS 256  /* ranks are threads: more would only oversubscribe */
#ifndef PDP_LOCAL_MAX_INFLIGHT
#  define PDP_LOCAL_MAX_INFLIGHT 256 /* handles per local communicator */
#endif

struct pdp_local_group {
    int size;
    double timeout_s;
    pdp_device device;
    char name[PDP__COMM_NAME_CAP];
    pdp__mutex mu;
    pdp__cond cv;        /* barrier progress, departures, breakage */
    int arrived;              /* ranks in the current barrier */
    uint64_t gen;             /* barriers completed */
    int64_t *phase;           /* per rank: barriers entered */
    pdp__coll_args *slot;     /* per rank: the collective it is executing */
    bool *joined;             /* per rank: a communicator was created */
    bool *gone;               /* per rank: its communicator was freed */
    bool broken;
    pdp_status broken_status;
    char broken_msg[PDP__MSG_CAP];
    pdp__workq_item *p2p_head, *p2p_tail; /* unmatched sends and receives, in launch order */
    void *split_out;          /* pdp_comm_split: the group this rank made as a leader */
    int refs;                 /* made by a split: communicators yet to be freed; else 0 */
};

PDP_API pdp_status pdp_local_group_create(pdp_local_group **out, int world_size,
                                          const pdp_comm_desc *desc)
{
    static const char *fn = "pdp_local_group_create";
    pdp_local_group *g;
    double timeout;
    pdp_status st;
    if (!out) return pdp__err(PDP_ERR_INVALID, "%s: out is NULL", fn);
    *out = NULL;
    if ((st = pdp__comm_desc_timeout(desc, &timeout, fn)) != PDP_OK) return st;
    if (world_size < 1 || world_size > PDP__LOCAL_MAX_RANKS)
        return pdp__err(PDP_ERR_INVALID, "%s: world_size %d outside 1..%d", fn, world_size,
                        PDP__LOCAL_MAX_RANKS);
    if (desc && desc->backend != PDP_BACKEND_DEFAULT && desc->backend != PDP_BACKEND_LOCAL)
        return pdp__err(PDP_ERR_INVALID, "%s: desc->backend is %d; a local group is backend local",
                        fn, (int)desc->backend);
    if (desc && desc->device.kind != PDP_DEVICE_CPU)
        return pdp__err(PDP_ERR_UNSUPPORTED, "%s: the local backend keeps buffers on the CPU "
                        "(desc->device is CUDA:%d; use the nccl backend)", fn,
                        desc->device.ordinal);
    g = (pdp_local_group *)pdp__calloc(sizeof *g);
    if (!g) return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory", fn);
    g->size = world_size;
    g->timeout_s = timeout;
    g->device = pdp_cpu();
    snprintf(g->name, sizeof g->name, "%s", desc && desc->name ? desc->name : "comm");
    g->phase = (int64_t *)pdp__calloc((size_t)world_size * sizeof *g->phase);
    g->slot = (pdp__coll_args *)pdp__calloc((size_t)world_size * sizeof *g->slot);
    g->joined = (bool *)pdp__calloc((size_t)world_size * sizeof *g->joined);
    g->gone = (bool *)pdp__calloc((size_t)world_size * sizeof *g->gone);
    if (!g->phase || !g->slot || !g->joined || !g->gone) {
        pdp__dealloc(g->phase);
        pdp__dealloc(g->slot);
        pdp__dealloc(g->joined);
        pdp__dealloc(g->gone);
        pdp__dealloc(g);
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory for %d ranks", fn, world_size);
    }
    pdp__mutex_init(&g->mu);
    pdp__cond_init(&g->cv);
    *out = g;
    return PDP_OK;
}

PDP_API void pdp_local_group_free(pdp_local_group *g)
{
    if (!g) return;
    pdp__mutex_destroy(&g->mu);
    pdp__cond_destroy(&g->cv);
    pdp__dealloc(g->phase);
    pdp__dealloc(g->slot);
    pdp__dealloc(g->joined);
    pdp__dealloc(g->gone);
    pdp__dealloc(g);
}

/* Marks the group broken with a message (first failure wins); g->mu held. */
PDP__PRIVATE void pdp__group_break(pdp_local_group *g, pdp_status st, const char *msg)
{
    if (g->broken) return;
    g->broken = true;
    g->broken_status = st;
    snprintf(g->broken_msg, sizeof g->broken_msg, "%s", msg);
    pdp__cond_broadcast(&g->cv);
}

/* "allreduce #7 (count 1024) on comm 'comm', rank 0 of 2" */
PDP__PRIVATE void pdp__coll_describe(const pdp_local_group *g, int rank, const pdp__coll_args *a,
                                     char *out, size_t cap)
{
    snprintf(out, cap, "%s #%lld (count %lld) on comm '%s', rank %d of %d",
             pdp__op_names[a->kind], (long long)a->seq, (long long)a->count, g->name, rank,
             g->size);
}

/* The last rank into barrier A checks that everyone issued the same collective;
   g->mu held. Returns false (and breaks the group) on a mismatch. */
PDP__PRIVATE bool pdp__group_validate(pdp_local_group *g)
{
    const pdp__coll_args *a = &g->slot[0];
    int r;
    for (r = 1; r < g->size; r++) {
        const pdp__coll_args *b = &g->slot[r];
        if (b->kind != a->kind || b->count != a->count || b->op != a->op ||
            b->dtype != a->dtype) {
            char msg[PDP__MSG_CAP];
            snprintf(msg, sizeof msg,
                     "collectives differ across ranks on comm '%s': rank 0 issued %s #%lld "
                     "(count %lld, op/root %d, dtype %d), rank %d issued %s #%lld (count %lld, "
                     "op/root %d, dtype %d); every rank must issue the same collectives in the "
                     "same order",
                     g->name, pdp__op_names[a->kind], (long long)a->seq, (long long)a->count,
                     a->op, a->dtype, r, pdp__op_names[b->kind], (long long)b->seq,
                     (long long)b->count, b->op, b->dtype);
            pdp__group_break(g, PDP_ERR_INVALID, msg);
            return false;
        }
    }
    return true;
}

/* Barrier A (publish = true: also publishes *args in this rank's slot) or B.
   On failure returns the status and leaves the message in msg. */
PDP__PRIVATE pdp_status pdp__group_barrier(pdp_local_group *g, int rank, const pdp__coll_args *args,
                                           bool publish, char *msg, size_t cap)
{
    double deadline;
    uint64_t gen;
    int64_t my_phase;
    char what[160];
    pdp_status st = PDP_OK;
    pdp__coll_describe(g, rank, args, what, sizeof what);
    deadline = pdp__now() + g->timeout_s;
    pdp__mutex_lock(&g->mu);
    if (g->broken) {
        snprintf(msg, cap, "%.150s: the group is broken: %.300s", what, g->broken_msg);
        st = g->broken_status;
        goto out;
    }
    if (publish) g->slot[rank] = *args;
    my_phase = ++g->phase[rank];
    gen = g->gen;
    if (++g->arrived == g->size) {
        g->arrived = 0;
        if (!publish || pdp__group_validate(g)) {
            g->gen++;
            pdp__cond_broadcast(&g->cv);
        }
    }
    while (g->gen == gen) {
        int r, rc;
        if (g->broken) {
            snprintf(msg, cap, "%.150s: %.300s", what, g->broken_msg);
            st = g->broken_status;
            goto out;
        }
        if (g->gone[rank]) {
            snprintf(msg, cap, "%s: rank %d freed its communicator while the collective was "
                     "in flight", what, rank);
            st = PDP_ERR_COMM;
            pdp__group_break(g, st, msg);
            goto out;
        }
        for (r = 0; r < g->size; r++)
            if (g->phase[r] < my_phase && g->gone[r]) {
                snprintf(msg, cap, "%s: rank %d left the group (freed its communicator) after "
                         "collective #%lld and will never arrive", what, r,
                         (long long)g->slot[r].seq);
                st = PDP_ERR_COMM;
                pdp__group_break(g, st, msg);
                goto out;
            }
        rc = pdp__cond_timedwait(&g->cv, &g->mu, deadline);
        if (rc == ETIMEDOUT && g->gen == gen && !g->broken) {
            size_t n;
            n = (size_t)snprintf(msg, cap, "%s: no arrival within %.3g s from rank", what,
                                 g->timeout_s);
            for (r = 0; r < g->size && n < cap; r++)
                if (g->phase[r] < my_phase)
                    n += (size_t)snprintf(msg + n, cap - n, " %d (last seen at %s #%lld)", r,
                                          pdp__op_names[g->slot[r].kind],
                                          (long long)g->slot[r].seq);
            st = PDP_ERR_TIMEOUT;
            pdp__group_break(g, st, msg);
            goto out;
        }
    }
out:
    pdp__mutex_unlock(&g->mu);
    return st;
}

/* ---- comm_local: the data movement ---- */

/* [lo, hi) of n items for part r of parts, with boundaries on 16 floats (one cache line)
   so that two ranks never write the same line. */
PDP__PRIVATE void pdp__slice(int64_t n, int r, int parts, int64_t *lo, int64_t *hi)
{
    /* n * r / parts without forming n * r, which could overflow for a huge n */
    int64_t q = n / parts, m = n % parts;
    int64_t a = q * r + m * r / parts, b = q * (r + 1) + m * (r + 1) / parts;
    *lo = r == 0 ? 0 : a & ~(int64_t)15;
    *hi = r == parts - 1 ? n : b & ~(int64_t)15;
    if (*hi < *lo) *hi = *lo;
}

#define PDP__CHUNK 2048

/* acc[0..n) <- op over ranks of src[i][off..off+n), in rank order: ((s0 + s1) + s2) + ...,
   then / nsrc for AVG. acc is the caller's chunk, never one of the sources, so every
   loop is a restrict-qualified blocked loop that gcc -O2 vectorises (one pass per
   source; the chunk stays in L1). */
PDP__PRIVATE void pdp__reduce_chunk(float *PDP__RESTRICT acc, const float *const *src, int nsrc,
                                    int64_t off, int64_t n, pdp_reduce_op op)
{
    const float *PDP__RESTRICT s0 = src[0] + off;
    int r;
    if (nsrc == 1) {
        memcpy(acc, s0, (size_t)n * sizeof *acc);
    } else {
        const float *PDP__RESTRICT s1 = src[1] + off;
        PDP__FOR_BLOCKED(j, n, acc[j] = s0[j] + s1[j];);
    }
    for (r = 2; r < nsrc; r++) {
        const float *PDP__RESTRICT s = src[r] + off;
        PDP__FOR_BLOCKED(j, n, acc[j] += s[j];);
    }
    if (op == PDP_REDUCE_AVG) {
        float div = (float)nsrc;
        PDP__FOR_BLOCKED(j, n, acc[j] /= div;);
    }
}

/* The same for 16-bit elements (dt BF16 or F16): each widened to fp32, reduced in fp32
   in rank order, AVG divided, then rounded ONCE into out (to nearest even). */
PDP__PRIVATE void pdp__reduce_chunk16(uint16_t *out, float *PDP__RESTRICT acc,
                                      const uint16_t *const *src, int nsrc, int64_t off, int64_t n,
                                      pdp_reduce_op op, int dt)
{
    int64_t j;
    int r;
    for (j = 0; j < n; j++) acc[j] = pdp__dt16_float(dt, src[0][off + j]);
    for (r = 1; r < nsrc; r++)
        for (j = 0; j < n; j++) acc[j] += pdp__dt16_float(dt, src[r][off + j]);
    if (op == PDP_REDUCE_AVG) {
        float div = (float)nsrc;
        for (j = 0; j < n; j++) acc[j] /= div;
    }
    for (j = 0; j < n; j++) out[j] = pdp__dt16_bits(dt, acc[j]);
}

/* Rank r's share of a 16-bit all-reduce or reduce-scatter (the float loops below). */
PDP__PRIVATE void pdp__local_execute16(pdp_local_group *g, int r)
{
    const pdp__coll_args *me = &g->slot[r];
    int n = g->size, i;
    float acc[PDP__CHUNK];
    uint16_t h[PDP__CHUNK];
    const uint16_t *src[PDP__LOCAL_MAX_RANKS];
    int64_t lo, hi, off, len;
    if (me->kind == PDP__COLL_ALLREDUCE) {
        pdp__slice(me->count, r, n, &lo, &hi);
        for (i = 0; i < n; i++) src[i] = (const uint16_t *)g->slot[i].buf;
        for (off = lo; off < hi; off += len) {
            len = PDP__MIN(hi - off, PDP__CHUNK);
            pdp__reduce_chunk16(h, acc, src, n, off, len, (pdp_reduce_op)me->op, me->dtype);
            for (i = 0; i < n; i++)
                memcpy((uint16_t *)g->slot[i].buf + off, h, (size_t)len * sizeof *h);
        }
    } else { /* reduce-scatter: rank r reduces slice r into its own recv */
        for (i = 0; i < n; i++) src[i] = (const uint16_t *)g->slot[i].send + (int64_t)r * me->count;
        for (off = 0; off < me->count; off += len) {
            len = PDP__MIN(me->count - off, PDP__CHUNK);
            pdp__reduce_chunk16((uint16_t *)me->recv + off, acc, src, n, off, len,
                                (pdp_reduce_op)me->op, me->dtype);
        }
    }
}

/* Rank r's share of the collective whose arguments every rank published. */
PDP__PRIVATE void pdp__local_execute(pdp_local_group *g, int r)
{
    const pdp__coll_args *me = &g->slot[r];
    int n = g->size, i;
    float acc[PDP__CHUNK];
    const float *src[PDP__LOCAL_MAX_RANKS];
    int64_t lo, hi, off, len;
    if (me->dtype != PDP_DTYPE_F32) {
        pdp__local_execute16(g, r);
        return;
    }
    switch (me->kind) {
    case PDP__COLL_ALLREDUCE:
        pdp__slice(me->count, r, n, &lo, &hi);
        for (i = 0; i < n; i++) src[i] = g->slot[i].buf;
        for (off = lo; off < hi; off += len) {
            len = PDP__MIN(hi - off, PDP__CHUNK);
            pdp__reduce_chunk(acc, src, n, off, len, (pdp_reduce_op)me->op);
            for (i = 0; i < n; i++) memcpy(g->slot[i].buf + off, acc, (size_t)len * sizeof *acc);
        }
        break;
    case PDP__COLL_BROADCAST:
        pdp__slice(me->count, r, n, &lo, &hi);
        for (i = 0; i < n; i++)
            if (i != me->op && hi > lo)
                memcpy(g->slot[i].buf + lo, g->slot[me->op].buf + lo,
                       pdp__comm_bytes(hi - lo, sizeof(float)));
        break;
    case PDP__COLL_BROADCAST_BYTES:
        pdp__slice(me->count, r, n, &lo, &hi);
        for (i = 0; i < n; i++)
            if (i != me->op && hi > lo)
                memcpy((char *)g->slot[i].bytes_buf + lo, (char *)g->slot[me->op].bytes_buf + lo,
                       (size_t)(hi - lo));
        break;
    case PDP__COLL_REDUCE_SCATTER: /* rank r reduces slice r into its own recv */
        for (i = 0; i < n; i++) src[i] = g->slot[i].send + (int64_t)r * me->count;
        for (off = 0; off < me->count; off += len) {
            len = PDP__MIN(me->count - off, PDP__CHUNK);
            pdp__reduce_chunk(acc, src, n, off, len, (pdp_reduce_op)me->op);
            memcpy(me->recv + off, acc, (size_t)len * sizeof *acc);
        }
        break;
    case PDP__COLL_ALLGATHER: /* rank r writes its block into every recv */
        for (i = 0; i < n; i++) {
            float *dst = g->slot[i].recv + (int64_t)r * me->count;
            if (dst != me->send && me->count > 0)
                memmove(dst, me->send, pdp__comm_bytes(me->count, sizeof *dst));
        }
        break;
    case PDP__COLL_BARRIER:
    case PDP__COLL_SEND: /* never queued */
    case PDP__COLL_RECV:
    case PDP__COLL_SPLIT:
        break;
    }
}

typedef struct pdp__local_comm {
    pdp_comm head;                 /* first member */
    pdp__workq q;                  /* head.impl points here */
    pdp_local_group *g;
    pdp__workq_item pool[PDP_LOCAL_MAX_INFLIGHT];
} pdp__local_comm;

/* ---- comm_local: point-to-point ----
   The group's mailbox is one list of unmatched messages in launch order. A new
   send looks for the first receive its peer posted from this rank with the same
   tag (a new receive, for the first such send); found, the thread that launched
   the second half copies the floats and completes both handles; otherwise the
   message joins the list. Everything happens under g->mu (then the owners'
   queue locks: g->mu before q->mu, never the reverse), so no progress thread
   is involved and a ring where every rank sends first cannot deadlock. */

PDP__PRIVATE int pdp__p2p_owner(const pdp__workq_item *w) { return w->head.comm->rank; }

/* Unlinks w from the mailbox; false when it is not there (matched or withdrawn). */
PDP__PRIVATE bool pdp__mailbox_remove(pdp_local_group *g, pdp__workq_item *w)
{
    pdp__workq_item **pp, *prev = NULL;
    for (pp = &g->p2p_head; *pp; prev = *pp, pp = &(*pp)->p2p_next)
        if (*pp == w) {
            *pp = w->p2p_next;
            if (g->p2p_tail == w) g->p2p_tail = prev;
            w->p2p_next = NULL;
            return true;
        }
    return false;
}

/* Completes a matched pair (g->mu held): copy, or a count mismatch on both sides. */
PDP__PRIVATE void pdp__p2p_match(pdp__workq_item *send, pdp__workq_item *recv)
{
    char msg[PDP__MSG_CAP], what[200];
    if (send->args.count == recv->args.count) {
        if (send->args.count > 0 && recv->args.recv != send->args.send)
            memmove(recv->args.recv, send->args.send,
                    pdp__comm_bytes(send->args.count, sizeof(float)));
        pdp__workq_finish((pdp__workq *)send->head.comm->impl, send, PDP_OK, "");
        pdp__workq_finish((pdp__workq *)recv->head.comm->impl, recv, PDP_OK, "");
        return;
    }
    pdp__p2p_describe(send, what, sizeof what);
    snprintf(msg, sizeof msg, "%s: count mismatch: rank %d sends %lld floats, rank %d receives "
             "%lld (recv #%lld)", what, pdp__p2p_owner(send), (long long)send->args.count,
             pdp__p2p_owner(recv), (long long)recv->args.count, (long long)recv->head.seq);
    pdp__workq_finish((pdp__workq *)send->head.comm->impl, send, PDP_ERR_INVALID, msg);
    pdp__p2p_describe(recv, what, sizeof what);
    snprintf(msg, sizeof msg, "%s: count mismatch: rank %d sends %lld floats (send #%lld), rank "
             "%d receives %lld", what, pdp__p2p_owner(send), (long long)send->args.count,
             (long long)send->head.seq, pdp__p2p_owner(recv), (long long)recv->args.count);
    pdp__workq_finish((pdp__workq *)recv->head.comm->impl, recv, PDP_ERR_INVALID, msg);
}

PDP__PRIVATE pdp_status pdp__local_p2p(pdp_comm *c, pdp__coll_kind kind, float *buf, int64_t count,
                                       int peer, int tag, pdp_work **out)
{
    pdp__local_comm *lc = (pdp__local_comm *)c;
    pdp_local_group *g = lc->g;
    pdp__workq *q = (pdp__workq *)c->impl;
    pdp__coll_args a;
    pdp__workq_item *w = NULL, *m;
    pdp_status st;
    memset(&a, 0, sizeof a);
    a.kind = kind;
    a.count = count;
    a.peer = peer;
    a.tag = tag;
    if (kind == PDP__COLL_SEND) a.send = buf;
    else a.recv = buf;
    if ((st = pdp__workq_take(c, &a, &w)) != PDP_OK) return st;
    pdp__mutex_lock(&g->mu);
    if (g->broken || g->gone[peer]) {
        char what[200];
        pdp__p2p_describe(w, what, sizeof what);
        st = g->broken ? g->broken_status : PDP_ERR_COMM;
        if (g->broken) pdp__err(st, "%.200s: the group is broken: %.250s", what, g->broken_msg);
        else pdp__err(st, "%s: rank %d left the group (freed its communicator)", what, peer);
        pdp__mutex_unlock(&g->mu);
        pdp__workq_untake(q, w);
        return st;
    }
    for (m = g->p2p_head; m; m = m->p2p_next)
        if (pdp__p2p_owner(m) == peer && m->args.peer == c->rank && m->args.tag == tag &&
            m->args.kind != kind)
            break;
    if (m) {
        pdp__mailbox_remove(g, m);
        if (kind == PDP__COLL_SEND) pdp__p2p_match(w, m);
        else pdp__p2p_match(m, w);
    } else {
        if (g->p2p_tail) g->p2p_tail->p2p_next = w;
        else g->p2p_head = w;
        g->p2p_tail = w;
    }
    pdp__mutex_unlock(&g->mu);
    *out = &w->head;
    return PDP_OK;
}

PDP__PRIVATE pdp_status pdp__local_send(pdp_comm *c, const float *buf, int64_t count, int peer,
                                        int tag, pdp_work **w)
{
    return pdp__local_p2p(c, PDP__COLL_SEND, (float *)buf, count, peer, tag, w);
}

PDP__PRIVATE pdp_status pdp__local_recv(pdp_comm *c, float *buf, int64_t count, int peer, int tag,
                                        pdp_work **w)
{
    return pdp__local_p2p(c, PDP__COLL_RECV, buf, count, peer, tag, w);
}

PDP__PRIVATE void pdp__local_p2p_expire(pdp__workq *q, pdp__workq_item *w)
{
    pdp_local_group *g = ((pdp__local_comm *)q->comm)->g;
    char msg[PDP__MSG_CAP];
    bool withdrawn;
    pdp__mutex_lock(&g->mu);
    withdrawn = pdp__mailbox_remove(g, w);
    pdp__mutex_unlock(&g->mu);
    if (!withdrawn) return; /* matched meanwhile: completed */
    pdp__workq_p2p_timeout_msg(w, msg, sizeof msg);
    pdp__workq_finish(q, w, PDP_ERR_TIMEOUT, msg);
}

/* Rank r's communicator is going (g->mu held): its unmatched messages are withdrawn, and
   those of other ranks that name it fail with PDP_ERR_COMM. */
PDP__PRIVATE void pdp__mailbox_depart(pdp_local_group *g, int r)
{
    pdp__workq_item *m = g->p2p_head, *next;
    for (; m; m = next) {
        char msg[PDP__MSG_CAP], what[200];
        next = m->p2p_next;
        if (pdp__p2p_owner(m) != r && m->args.peer != r) continue;
        pdp__mailbox_remove(g, m);
        pdp__p2p_describe(m, what, sizeof what);
        snprintf(msg, sizeof msg, "%s: rank %d left the group (freed its communicator) before "
                 "the message was matched", what, r);
        pdp__workq_finish((pdp__workq *)m->head.comm->impl, m, PDP_ERR_COMM, msg);
    }
}

/* ---- comm_local: communicators ---- */

/* The queue's exec: one collective for this rank, barrier A, its share of the
   work, barrier B. */
PDP__PRIVATE pdp_status pdp__local_exec(pdp__workq *q, pdp__workq_item *w, char *msg, size_t cap)
{
    pdp__local_comm *lc = (pdp__local_comm *)q->comm;
    pdp_local_group *g = lc->g;
    const pdp__coll_args *a = &w->args;
    int r = lc->head.rank;
    pdp_status st;
    if (g->size == 1) {
        if (a->kind == PDP__COLL_REDUCE_SCATTER || a->kind == PDP__COLL_ALLGATHER)
            if (a->recv != a->send && a->count > 0)
                memmove(a->recv, a->send, pdp__comm_bytes(a->count, pdp__dtype_size(a->dtype)));
        return PDP_OK;
    }
    if ((st = pdp__group_barrier(g, r, a, true, msg, cap)) != PDP_OK) return st;
    pdp__local_execute(g, r);
    return pdp__group_barrier(g, r, a, false, msg, cap);
}

PDP__PRIVATE void pdp__local_destroy(pdp_comm *c)
{
    pdp__local_comm *lc = (pdp__local_comm *)c;
    pdp_local_group *g = lc->g;
    /* gone first: a progress thread blocked in a barrier on our behalf, or a peer
       waiting for us, wakes up and fails instead of waiting out the timeout */
    bool last;
    pdp__mutex_lock(&g->mu);
    g->gone[c->rank] = true;
    pdp__mailbox_depart(g, c->rank);
    pdp__cond_broadcast(&g->cv);
    pdp__mutex_unlock(&g->mu);
    pdp__workq_shutdown(&lc->q);
    pdp__dealloc(lc);
    pdp__mutex_lock(&g->mu);
    last = g->refs > 0 && --g->refs == 0;
    pdp__mutex_unlock(&g->mu);
    if (last) pdp_local_group_free(g); /* a split's group goes with its last communicator */
}

/* ---- comm_local: split ----
   The member that becomes rank 0 of a colour creates its group (refs = its size: the
   group frees itself with the last of them) and every rank broadcasts the pointer of
   the group it made, or NULL, over c; each member then joins its leader's group. */
PDP__PRIVATE pdp_status pdp__local_split(pdp_comm *c, int colour, int key, int new_rank,
                                         int new_size, int leader, const char *name,
                                         pdp_comm **out)
{
    pdp_local_group *mine = NULL, *g = NULL;
    pdp_comm_desc d;
    int r;
    pdp_status st = PDP_OK;
    (void)key;
    if (colour >= 0 && new_rank == 0) {
        memset(&d, 0, sizeof d);
        d.timeout_s = c->timeout_s;
        d.name = name;
        /* on failure the leader still takes part below: its NULL tells the members (and
           pdp_comm_split's agreement keeps every rank in step) */
        if ((st = pdp_local_group_create(&mine, new_size, &d)) == PDP_OK) mine->refs = new_size;
    }
    for (r = 0; r < c->size; r++) {
        void *p = r == c->rank ? (void *)mine : NULL;
        pdp_status bst;
        if ((bst = c->ops->broadcast_bytes(c, &p, sizeof p, r)) != PDP_OK) return bst;
        if (r == leader) g = (pdp_local_group *)p;
    }
    if (colour < 0) return PDP_OK;
    if (!g)
        return c->rank == leader ? st : pdp__err(PDP_ERR_COMM, "rank %d (colour %d): the new "
                                                 "group's rank 0, rank %d, could not create it",
                                                 c->rank, colour, leader);
    if ((st = pdp_comm_create_local(out, g, new_rank)) != PDP_OK) {
        bool last;
        pdp__mutex_lock(&g->mu);
        g->gone[new_rank] = true;
        last = --g->refs == 0;
        pdp__cond_broadcast(&g->cv);
        pdp__mutex_unlock(&g->mu);
        if (last) pdp_local_group_free(g);
    }
    return st;
}

static const pdp__comm_ops pdp__local_ops = {
    pdp__workq_allreduce, pdp__workq_broadcast, pdp__workq_reduce_scatter,
    pdp__workq_allgather, pdp__workq_barrier,   pdp__workq_broadcast_bytes,
    pdp__local_send,      pdp__local_recv,      pdp__workq_sendrecv,  pdp__local_split,
    pdp__workq_wait,      pdp__workq_done,      pdp__local_destroy,
};

PDP_API pdp_status pdp_comm_create_local(pdp_comm **out, pdp_local_group *g, int rank)
{
    static const char *fn = "pdp_comm_create_local";
    pdp__local_comm *lc;
    pdp_status st;
    if (!out) return pdp__err(PDP_ERR_INVALID, "%s: out is NULL", fn);
    *out = NULL;
    if (!g) return pdp__err(PDP_ERR_INVALID, "%s: group is NULL", fn);
    if (rank < 0 || rank >= g->size)
        return pdp__err(PDP_ERR_INVALID, "%s: rank %d outside 0..%d", fn, rank, g->size - 1);
    lc = (pdp__local_comm *)pdp__calloc(sizeof *lc);
    if (!lc) return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory (rank %d)", fn, rank);
    pdp__mutex_lock(&g->mu);
    if (g->joined[rank]) {
        pdp__mutex_unlock(&g->mu);
        pdp__dealloc(lc);
        return pdp__err(PDP_ERR_INVALID, "%s: rank %d of group '%s' already has a communicator",
                        fn, rank, g->name);
    }
    g->joined[rank] = true;
    pdp__mutex_unlock(&g->mu);
    lc->head.ops = &pdp__local_ops;
    lc->head.backend = PDP_BACKEND_LOCAL;
    lc->head.rank = lc->head.trace_pid = rank; /* a split's: its parent's (comm.c) */
    lc->head.size = g->size;
    lc->head.timeout_s = g->timeout_s;
    lc->head.device = g->device;
    memcpy(lc->head.name, g->name, sizeof lc->head.name);
    lc->head.impl = &lc->q;
    lc->g = g;
    lc->q.comm = &lc->head;
    lc->q.exec = pdp__local_exec;
    lc->q.p2p_expire = pdp__local_p2p_expire;
    /* world size 1: every collective is local and immediate, no thread */
    if ((st = pdp__workq_init(&lc->q, lc->pool, PDP_LOCAL_MAX_INFLIGHT, "PDP_LOCAL_MAX_INFLIGHT",
                              g->size > 1, fn)) != PDP_OK) {
        pdp__mutex_lock(&g->mu);
        g->joined[rank] = false;
        pdp__mutex_unlock(&g->mu);
        pdp__dealloc(lc);
        return st;
    }
    *out = &lc->head;
    return PDP_OK;
}
