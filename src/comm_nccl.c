/* comm_nccl: the NCCL communicator backend, host side (-DPDP_CUDA; the NCCL calls
   themselves are in pdp_cuda.cu, behind cuda.h's pdp_cudak_nccl_* functions), and
   its entry in comm.c's dispatcher, pdp__comm_init_nccl_env.

   The NCCL communicator is a pdp__comm_ops backend like local and mpi: its
   handles come from a fixed pool (one per completion-event slot), so a step
   allocates nothing; a collective is launched on the NCCL stream after an
   event recorded on the compute stream, and pdp_work_wait polls it against the
   communicator's timeout (pdp_cuda.cu aborts the NCCL communicator on failure).
   Thread ranks come from one pdp_nccl_group (ncclCommInitAll); process ranks
   (pdp_comm_init_env) rendezvous through the TCP store (rendezvous.c, store.c):
   rank 0 makes the unique id and sets "pdp/nccl_id", the others get it. Without PDP_CUDA,
   every entry point fails with PDP_ERR_UNSUPPORTED naming the macro.

   Point-to-point (section below) and split follow comm.h, with what NCCL imposes:
   - NCCL has no tags. A pair's messages match in the order they were issued; each
     carries a header (tag, count) and the receiver's wait fails with PDP_ERR_INVALID
     naming both when the tags or counts differ;
   - sends and receives are enqueued in batches (one ncclGroupStart/End) when one of
     them is waited or queried with pdp_work_done, or before a collective or split on
     the communicator: call pdp_work_done on a handle to start a batch early (overlap),
     or post it with pdp_comm_sendrecv, which enqueues it at once (pdp__nccl_sendrecv);
   - messages and collectives share the NCCL stream: every rank must issue them in
     an order that cannot deadlock (a send before a collective on one rank needs its
     receive before that collective on the other), as with NCCL itself;
   - a message not matched within timeout_s fails with PDP_ERR_TIMEOUT naming the
     peer and the tag, but NCCL cannot withdraw it: the communicator is aborted and
     every later call on it fails (PDP_ERR_COMM), as after a collective's timeout.
     A count mismatch usually hangs NCCL: the receiver then fails with
     PDP_ERR_INVALID naming both counts (from the header), the sender times out;
   - pdp_comm_split is ncclCommSplit (NCCL 2.18 or later), for thread ranks and
     process ranks alike. */

#include "internal.h"

/* the same text as cuda_host.c's (an identical redefinition is valid C) */
#define PDP__NO_CUDA_MSG "built without PDP_CUDA (compile with -DPDP_CUDA and link pdp_cuda.o)"

#ifndef PDP_CUDA
PDP__PRIVATE pdp_status pdp__comm_init_nccl_env(pdp_comm **out, const pdp_comm_desc *desc)
{
    (void)desc;
    *out = NULL;
    return pdp__err(PDP_ERR_UNSUPPORTED, "pdp_comm_init_env: backend NCCL: built without PDP_CUDA "
                    "(compile with -DPDP_CUDA and link pdp_cuda.o)");
}
#endif

/* ---- comm_nccl: the communicator ---- */

struct pdp_nccl_group {
    int n;
    double timeout_s;
    char name[PDP__COMM_NAME_CAP];
    pdp_device *devices;
#ifdef PDP_CUDA
    pdp_cudak_nccl **handles; /* taken by pdp_comm_create_nccl (NULL once taken) */
#endif
};

#ifdef PDP_CUDA

typedef struct pdp__nccl_work {
    pdp_work head;
    int slot;
    bool busy;
    bool pending;           /* a message taken but not yet enqueued (see flush) */
    bool is_p2p, is_send;
    int peer, tag;
    int64_t count;
    float *buf;
    pdp_status err;         /* the flush that should have enqueued it failed: msg says why */
    char msg[256];
} pdp__nccl_work;

typedef struct pdp__nccl_comm {
    pdp_comm head;
    pdp_cudak_nccl *h;
    float *barrier_buf;     /* one float on the device */
    int next;               /* the pool entry of the next collective */
    int npending;           /* messages in pool[next - npending .. next - 1], not enqueued */
    int64_t seq;
    bool traced;
    bool traced_process;    /* a process rank: its trace file is per rank */
    int trace_tid;          /* 0: not traced */
    pdp__nccl_work pool[PDP_CUDAK_NCCL_SLOTS];
} pdp__nccl_comm;

/* ---- comm_nccl: point-to-point ----
   NCCL has no tags and matches a pair's messages in the order they were issued; a
   send waits (on the GPU) for its receive, so a ring where every rank sends first
   deadlocks unless each rank's send and receive are in one ncclGroupStart/End.
   So pdp_comm_send/recv only take a handle (pending); the pending messages are
   enqueued together, as one group, by the first of: a wait or done query on any of
   them, a collective or a split on this communicator. Each message carries a
   header (tag, count) that the receiver checks at its wait: a different tag or
   count is PDP_ERR_INVALID naming both (a count mismatch usually hangs NCCL
   first: then the receiver still names both counts once its wait times out). */

PDP__PRIVATE void pdp__nccl_describe(const pdp__nccl_work *wk, char *out, size_t cap)
{
    const pdp_comm *c = wk->head.comm;
    snprintf(out, cap, "%s #%lld (count %lld) %s rank %d with tag %d on comm '%s', rank %d of %d",
             wk->head.op_name, (long long)wk->head.seq, (long long)wk->count,
             wk->is_send ? "to" : "from", wk->peer, wk->tag, c->name, c->rank, c->size);
}

/* Enqueues the pending messages as one group. On failure each of them keeps the
   error for its wait, and the error is also returned (with its message). */
PDP__PRIVATE pdp_status pdp__nccl_flush(pdp_comm *c)
{
    pdp__nccl_comm *nc = (pdp__nccl_comm *)c->impl;
    pdp_cudak_p2p ops[PDP_CUDAK_NCCL_SLOTS];
    int n = nc->npending, first, i;
    pdp_status st;
    double t;
    if (n == 0) return PDP_OK;
    first = (nc->next - n + PDP_CUDAK_NCCL_SLOTS) % PDP_CUDAK_NCCL_SLOTS;
    for (i = 0; i < n; i++) {
        const pdp__nccl_work *wk = &nc->pool[(first + i) % PDP_CUDAK_NCCL_SLOTS];
        ops[i].is_send = wk->is_send;
        ops[i].peer = wk->peer;
        ops[i].tag = wk->tag;
        ops[i].count = wk->count;
        ops[i].buf = wk->buf;
        ops[i].slot = -1;
    }
    nc->npending = 0;
    st = pdp_cudak_nccl_p2p(nc->h, ops, n, c->timeout_s);
    t = pdp__now();
    for (i = 0; i < n; i++) {
        pdp__nccl_work *wk = &nc->pool[(first + i) % PDP_CUDAK_NCCL_SLOTS];
        wk->pending = false;
        wk->head.t_start = t;
        if (st != PDP_OK) {
            wk->err = st;
            snprintf(wk->msg, sizeof wk->msg, "pdp_cuda: %s", pdp_cudak_error());
            continue;
        }
        PDP_ASSERT(ops[i].slot == (first + i) % PDP_CUDAK_NCCL_SLOTS);
        wk->slot = ops[i].slot;
    }
    if (st != PDP_OK)
        return pdp__err(st, "%d message(s) from rank %d on comm '%s': pdp_cuda: %s", n, c->rank,
                        c->name, pdp_cudak_error());
    return PDP_OK;
}

PDP__PRIVATE pdp_status pdp__nccl_p2p(pdp_comm *c, bool is_send, float *buf, int64_t count,
                                      int peer, int tag, pdp_work **w)
{
    pdp__nccl_comm *nc = (pdp__nccl_comm *)c->impl;
    pdp__nccl_work *wk = &nc->pool[nc->next];
    if (wk->busy)
        return pdp__err(PDP_ERR_STATE, "%s to/from rank %d on comm '%s' (rank %d): %d "
                        "collectives and messages in flight: wait on some before issuing more",
                        is_send ? "send" : "recv", peer, c->name, c->rank, PDP_CUDAK_NCCL_SLOTS);
    nc->next = (nc->next + 1) % PDP_CUDAK_NCCL_SLOTS;
    nc->npending++;
    wk->busy = wk->pending = wk->is_p2p = true;
    wk->is_send = is_send;
    wk->peer = peer;
    wk->tag = tag;
    wk->count = count;
    wk->buf = buf;
    wk->err = PDP_OK;
    wk->msg[0] = '\0';
    wk->slot = -1;
    wk->head.comm = c;
    wk->head.op_name = pdp__op_names[is_send ? PDP__COLL_SEND : PDP__COLL_RECV];
    wk->head.seq = nc->seq++;
    wk->head.t_start = pdp__now();
    wk->head.t_done = 0.0;
    *w = &wk->head;
    return PDP_OK;
}

PDP__PRIVATE pdp_status pdp__nccl_send(pdp_comm *c, const float *buf, int64_t count, int peer,
                                       int tag, pdp_work **w)
{
    return pdp__nccl_p2p(c, true, (float *)buf, count, peer, tag, w);
}

PDP__PRIVATE pdp_status pdp__nccl_recv(pdp_comm *c, float *buf, int64_t count, int peer, int tag,
                                       pdp_work **w)
{
    return pdp__nccl_p2p(c, false, buf, count, peer, tag, w);
}

/* A batch: its messages pending with those posted before, then enqueued as one group. */
PDP__PRIVATE pdp_status pdp__nccl_sendrecv(pdp_comm *c, const pdp_p2p *ops, int n, pdp_work **w)
{
    pdp_status st = PDP_OK, f;
    int i;
    for (i = 0; i < n; i++) w[i] = NULL;
    for (i = 0; i < n && st == PDP_OK; i++)
        st = pdp__nccl_p2p(c, ops[i].send, ops[i].buf, ops[i].count, ops[i].peer, ops[i].tag,
                           &w[i]);
    /* the posted ones start even when one failed: their waits report a flush's failure */
    f = pdp__nccl_flush(c);
    return st != PDP_OK ? st : f;
}

/* A message's wait: its group's completion, then (a receive) the sender's header. */
PDP__PRIVATE pdp_status pdp__nccl_p2p_wait(pdp_comm *c, pdp__nccl_work *wk)
{
    pdp__nccl_comm *nc = (pdp__nccl_comm *)c->impl;
    char what[200];
    int arrived = 0;
    int64_t tag = 0, count = 0;
    pdp_status st;
    if (wk->pending) pdp__nccl_flush(c); /* a failure lands in wk->err */
    pdp__nccl_describe(wk, what, sizeof what);
    if (wk->err != PDP_OK) { /* never enqueued: ncclGroupEnd failed or timed out (connecting) */
        wk->head.t_done = pdp__now();
        wk->busy = false;
        if (wk->err == PDP_ERR_TIMEOUT)
            return pdp__err(wk->err, "%s: no matching %s from rank %d within %g s (peer %d, tag "
                            "%d); NCCL cannot withdraw a message: the communicator was aborted "
                            "(%s)", what, wk->is_send ? "recv" : "send", wk->peer, c->timeout_s,
                            wk->peer, wk->tag, wk->msg);
        return pdp__err(wk->err, "%s: %s", what, wk->msg);
    }
    st = pdp_cudak_nccl_wait(nc->h, wk->slot, c->timeout_s);
    wk->head.t_done = pdp__now();
    wk->busy = false;
    if (!wk->is_send && pdp_cudak_nccl_p2p_header(nc->h, wk->slot, &arrived, &tag, &count) !=
                            PDP_OK)
        arrived = 0;
    if (arrived && count != wk->count)
        return pdp__err(PDP_ERR_INVALID, "%s: count mismatch: rank %d sends %lld floats (tag "
                        "%lld), rank %d receives %lld%s", what, wk->peer, (long long)count,
                        (long long)tag, c->rank, (long long)wk->count,
                        st == PDP_OK ? "" : " (NCCL hung on it: the communicator was aborted)");
    if (st != PDP_OK) {
        if (st == PDP_ERR_TIMEOUT)
            return pdp__err(st, "%s: no matching %s from rank %d within %g s (peer %d, tag %d); "
                            "NCCL cannot withdraw a message: the communicator was aborted "
                            "(pdp_cuda: %s)", what, wk->is_send ? "recv" : "send", wk->peer,
                            c->timeout_s, wk->peer, wk->tag, pdp_cudak_error());
        return pdp__err(st, "%s: pdp_cuda: %s", what, pdp_cudak_error());
    }
    if (arrived && tag != wk->tag)
        return pdp__err(PDP_ERR_INVALID, "%s: tag mismatch: rank %d sent tag %lld; NCCL has no "
                        "tags: messages between two ranks match in issue order, and their tags "
                        "must agree", what, wk->peer, (long long)tag);
    return PDP_OK;
}

/* kind names the collective through internal.h's pdp__op_names, whose first four
   entries follow pdp_cudak_coll's order. */
PDP__PRIVATE pdp_status pdp__nccl_issue(pdp_comm *c, pdp_cudak_coll kind, const void *send,
                                        void *recv, int64_t count, int op, pdp_dtype dt,
                                        pdp_work **w)
{
    pdp__nccl_comm *nc = (pdp__nccl_comm *)c->impl;
    pdp__nccl_work *wk;
    int slot;
    pdp_status st;
    /* messages issued before it go on the stream first (one stream orders everything) */
    if ((st = pdp__nccl_flush(c)) != PDP_OK)
        return pdp__err_wrap(st, "%s #%lld (count %lld) on comm '%s', rank %d of %d: enqueuing "
                             "the messages issued before it", pdp__op_names[kind],
                             (long long)nc->seq, (long long)count, c->name, c->rank, c->size);
    /* the pool entry k shares event slot k: a handle is free again once waited */
    wk = &nc->pool[nc->next];
    if (wk->busy)
        return pdp__err(PDP_ERR_STATE, "%d collectives in flight on comm '%s' (rank %d): wait on "
                        "some before issuing more", PDP_CUDAK_NCCL_SLOTS, c->name, c->rank);
    if ((st = pdp_cudak_nccl_launch(nc->h, kind, send, recv, count, op, (int)dt, &slot)) != PDP_OK)
        return pdp__err(st, "%s #%lld (count %lld) on comm '%s', rank %d of %d: pdp_cuda: %s",
                        pdp__op_names[kind], (long long)nc->seq, (long long)count, c->name,
                        c->rank, c->size, pdp_cudak_error());
    PDP_ASSERT(slot == nc->next);
    nc->next = (nc->next + 1) % PDP_CUDAK_NCCL_SLOTS;
    wk->busy = true;
    wk->is_p2p = false;
    wk->slot = slot;
    wk->head.comm = c;
    wk->head.op_name = pdp__op_names[kind];
    wk->head.seq = nc->seq++;
    wk->head.t_start = pdp__now();
    wk->head.t_done = 0.0;
    *w = &wk->head;
    return PDP_OK;
}

PDP__PRIVATE pdp_status pdp__nccl_allreduce(pdp_comm *c, void *buf, int64_t count, pdp_dtype dt,
                                            pdp_reduce_op op, pdp_work **w)
{
    return pdp__nccl_issue(c, PDP_CUDAK_ALLREDUCE, buf, buf, count, op == PDP_REDUCE_AVG, dt, w);
}

PDP__PRIVATE pdp_status pdp__nccl_broadcast(pdp_comm *c, float *buf, int64_t count, int root,
                                            pdp_work **w)
{
    return pdp__nccl_issue(c, PDP_CUDAK_BROADCAST, buf, buf, count, root, PDP_DTYPE_F32, w);
}

PDP__PRIVATE pdp_status pdp__nccl_reduce_scatter(pdp_comm *c, const void *send, void *recv,
                                                 int64_t recv_count, pdp_dtype dt, pdp_reduce_op op,
                                                 pdp_work **w)
{
    return pdp__nccl_issue(c, PDP_CUDAK_REDUCE_SCATTER, send, recv, recv_count,
                           op == PDP_REDUCE_AVG, dt, w);
}

PDP__PRIVATE pdp_status pdp__nccl_allgather(pdp_comm *c, const float *send, float *recv,
                                            int64_t send_count, pdp_work **w)
{
    return pdp__nccl_issue(c, PDP_CUDAK_ALLGATHER, send, recv, send_count, 0, PDP_DTYPE_F32, w);
}

PDP__PRIVATE pdp_status pdp__nccl_barrier(pdp_comm *c, pdp_work **w)
{
    pdp__nccl_comm *nc = (pdp__nccl_comm *)c->impl;
    return pdp__nccl_issue(c, PDP_CUDAK_ALLREDUCE, nc->barrier_buf, nc->barrier_buf, 1, 0,
                           PDP_DTYPE_F32, w);
}

PDP__PRIVATE pdp_status pdp__nccl_broadcast_bytes(pdp_comm *c, void *buf, size_t bytes, int root)
{
    pdp__nccl_comm *nc = (pdp__nccl_comm *)c->impl;
    pdp_status st;
    if ((st = pdp__nccl_flush(c)) != PDP_OK)
        return pdp__err_wrap(st, "broadcast of %zu bytes from rank %d on comm '%s', rank %d of "
                             "%d: enqueuing the messages issued before it", bytes, root, c->name,
                             c->rank, c->size);
    st = pdp_cudak_nccl_broadcast_bytes(nc->h, buf, bytes, root, c->timeout_s);
    if (bytes) nc->next = (nc->next + 1) % PDP_CUDAK_NCCL_SLOTS; /* it used one event slot */
    if (st != PDP_OK)
        return pdp__err(st, "broadcast of %zu bytes from rank %d on comm '%s', rank %d of %d: "
                        "pdp_cuda: %s", bytes, root, c->name, c->rank, c->size, pdp_cudak_error());
    return PDP_OK;
}

PDP__PRIVATE pdp_status pdp__nccl_wait(pdp_work *w)
{
    pdp__nccl_work *wk = (pdp__nccl_work *)w;
    pdp_comm *c = w->comm;
    pdp__nccl_comm *nc = (pdp__nccl_comm *)c->impl;
    pdp_status st;
    if (wk->is_p2p) st = pdp__nccl_p2p_wait(c, wk);
    else {
        st = pdp_cudak_nccl_wait(nc->h, wk->slot, c->timeout_s);
        w->t_done = pdp__now();
        wk->busy = false;
    }
    if (st != PDP_OK && wk->is_p2p) return st;
    if (st != PDP_OK)
        return pdp__err(st, "%s #%lld on comm '%s', rank %d of %d: pdp_cuda: %s", w->op_name,
                        (long long)w->seq, c->name, c->rank, c->size, pdp_cudak_error());
    if (nc->trace_tid) {
        char args[64];
        snprintf(args, sizeof args, "\"seq\":%lld", (long long)w->seq);
        pdp__trace_async(c->trace_pid, nc->trace_tid, "comm", w->op_name, (uint64_t)w->seq,
                         w->t_start, w->t_done, args);
    }
    return PDP_OK;
}

PDP__PRIVATE bool pdp__nccl_done(pdp_work *w)
{
    pdp__nccl_work *wk = (pdp__nccl_work *)w;
    pdp__nccl_comm *nc = (pdp__nccl_comm *)w->comm->impl;
    if (wk->pending) pdp__nccl_flush(w->comm); /* starts the messages; errors wait for wait */
    if (wk->err != PDP_OK) return true;
    return pdp_cudak_nccl_query(nc->h, wk->slot) != 0;
}

PDP__PRIVATE void pdp__nccl_destroy(pdp_comm *c)
{
    pdp__nccl_comm *nc = (pdp__nccl_comm *)c->impl;
    pdp_cudak_free(c->device.ordinal, nc->barrier_buf);
    pdp_cudak_nccl_free(nc->h, 0);
    if (nc->traced) pdp__trace_close();
    pdp__dealloc(nc);
}

PDP__PRIVATE pdp_status pdp__nccl_wrap(pdp_comm **out, pdp_cudak_nccl *h, int dev, int rank,
                                       int size, int trace_pid, double timeout_s,
                                       const char *name, bool process_rank, const char *fn);

/* ---- comm_nccl: split ----
   ncclCommSplit over c (thread ranks and process ranks alike: it needs NCCL 2.18),
   after the messages pending on c are enqueued. comm.c has already exchanged the
   colours over c, so every rank is here; the key orders the new ranks as
   comm.c's new_rank does (ties by rank in c, as NCCL's). */
PDP__PRIVATE pdp_status pdp__nccl_split(pdp_comm *c, int colour, int key, int new_rank,
                                        int new_size, int leader, const char *name,
                                        pdp_comm **out)
{
    pdp__nccl_comm *nc = (pdp__nccl_comm *)c->impl;
    pdp_cudak_nccl *h = NULL;
    pdp_status st;
    (void)leader;
    if ((st = pdp__nccl_flush(c)) != PDP_OK)
        return pdp__err_wrap(st, "split of comm '%s' (rank %d): enqueuing the messages issued "
                             "before it", c->name, c->rank);
    if ((st = pdp_cudak_nccl_split(nc->h, colour, key, &h, c->timeout_s)) != PDP_OK)
        return pdp__err(st, "split of comm '%s' (rank %d of %d, colour %d): pdp_cuda: %s",
                        c->name, c->rank, c->size, colour, pdp_cudak_error());
    if (colour < 0) return PDP_OK;
    if ((st = pdp__nccl_wrap(out, h, c->device.ordinal, new_rank, new_size, c->trace_pid,
                             c->timeout_s, name, nc->traced_process, "split")) != PDP_OK)
        return st;
    return PDP_OK;
}

static const pdp__comm_ops pdp__nccl_ops = {
    pdp__nccl_allreduce, pdp__nccl_broadcast, pdp__nccl_reduce_scatter, pdp__nccl_allgather,
    pdp__nccl_barrier,   pdp__nccl_broadcast_bytes, pdp__nccl_send,     pdp__nccl_recv,
    pdp__nccl_sendrecv,  pdp__nccl_split,     pdp__nccl_wait,      pdp__nccl_done,
    pdp__nccl_destroy};

/* Wraps an initialised handle h (taken over, freed on failure) as rank of size; trace_pid:
   its lane in the trace (a split's parent's, else -1: rank). */
PDP__PRIVATE pdp_status pdp__nccl_wrap(pdp_comm **out, pdp_cudak_nccl *h, int dev, int rank,
                                       int size, int trace_pid, double timeout_s,
                                       const char *name, bool process_rank, const char *fn)
{
    pdp__nccl_comm *nc = (pdp__nccl_comm *)pdp__calloc(sizeof *nc);
    pdp_status st;
    if (!nc) {
        pdp_cudak_nccl_free(h, 0);
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory (rank %d)", fn, rank);
    }
    nc->h = h;
    nc->head.ops = &pdp__nccl_ops;
    nc->head.backend = PDP_BACKEND_NCCL;
    nc->head.rank = rank;
    nc->head.trace_pid = trace_pid >= 0 ? trace_pid : rank;
    nc->head.size = size;
    nc->head.timeout_s = timeout_s;
    nc->head.device = pdp_cuda(dev);
    snprintf(nc->head.name, sizeof nc->head.name, "%s", name ? name : "comm");
    nc->head.impl = nc;
    if ((st = pdp_cudak_malloc(dev, sizeof(float), (void **)&nc->barrier_buf)) != PDP_OK ||
        (st = pdp_cudak_memset0(dev, nc->barrier_buf, sizeof(float))) != PDP_OK) {
        st = pdp__err(st, "%s: rank %d: pdp_cuda: %s", fn, rank, pdp_cudak_error());
        pdp__nccl_destroy(&nc->head);
        return st;
    }
    nc->traced_process = process_rank;
    if (pdp__trace_open(process_rank && (size > 1 || trace_pid >= 0) ? nc->head.trace_pid : -1)
        == PDP_OK) {
        nc->traced = true;
        if (pdp__trace_enabled()) {
            char track[PDP__COMM_NAME_CAP + 16];
            snprintf(track, sizeof track, "comm %s (nccl)", nc->head.name);
            nc->trace_tid = pdp__trace_track(nc->head.trace_pid, track);
        }
    }
    *out = &nc->head;
    return PDP_OK;
}

/* pdp_comm_init_env for PDP_BACKEND_NCCL: one process per GPU. The unique id
   travels through rendezvous.c; the store stays open until ncclCommInitRank
   (collective) has returned on this rank. */
PDP__PRIVATE pdp_status pdp__comm_init_nccl_env(pdp_comm **out, const pdp_comm_desc *desc)
{
    static const char *fn = "pdp_comm_init_env";
    pdp_env_info env;
    pdp_store *store = NULL;
    pdp_cudak_nccl *h = NULL;
    unsigned char id[PDP_CUDAK_NCCL_ID_BYTES];
    double timeout;
    int dev;
    pdp_status st;
    *out = NULL;
    if ((st = pdp__comm_desc_timeout(desc, &timeout, fn)) != PDP_OK) return st;
    if ((st = pdp_env_read(&env)) != PDP_OK) return pdp__err_wrap(st, "%s", fn);
    /* the rank's GPU: desc->device when it names one, else LOCAL_RANK */
    dev = desc && desc->device.kind == PDP_DEVICE_CUDA ? desc->device.ordinal : env.local_rank;
    memset(id, 0, sizeof id);
    if ((st = pdp__rendezvous_store(&store, &env, timeout, "NCCL", fn)) != PDP_OK) return st;
    if (env.rank == 0 && (st = pdp_cudak_nccl_unique_id(dev, id)) != PDP_OK) {
        st = pdp__err(st, "%s: rank 0: pdp_cuda: %s", fn, pdp_cudak_error());
        goto done;
    }
    if ((st = pdp__rendezvous_share(store, &env, "pdp/nccl_id", id, sizeof id, timeout, "NCCL",
                                    fn)) != PDP_OK)
        goto done;
    if ((st = pdp_cudak_nccl_init_rank(&h, dev, env.world_size, env.rank, id, timeout)) != PDP_OK) {
        st = pdp__err(st, "%s: NCCL rank %d of %d on CUDA device %d: pdp_cuda: %s", fn, env.rank,
                      env.world_size, dev, pdp_cudak_error());
        goto done;
    }
    st = pdp__nccl_wrap(out, h, dev, env.rank, env.world_size, -1, timeout,
                        desc ? desc->name : NULL, true, fn);
done:
    pdp_store_free(store);
    return st;
}

#endif /* PDP_CUDA */

/* ---- comm_nccl: thread ranks (pdp_nccl_group) ---- */

PDP_API pdp_status pdp_nccl_group_create(pdp_nccl_group **out, int ndev, const pdp_device *devices,
                                         const pdp_comm_desc *desc)
{
    static const char *fn = "pdp_nccl_group_create";
    double timeout;
    pdp_status st0;
    int i;
    if (!out) return pdp__err(PDP_ERR_INVALID, "%s: out is NULL", fn);
    *out = NULL;
    if ((st0 = pdp__comm_desc_timeout(desc, &timeout, fn)) != PDP_OK) return st0;
    if (ndev < 1 || ndev > 64 || !devices)
        return pdp__err(PDP_ERR_INVALID, "%s: ndev %d outside 1..64 or devices NULL", fn, ndev);
    for (i = 0; i < ndev; i++)
        if (devices[i].kind != PDP_DEVICE_CUDA)
            return pdp__err(PDP_ERR_DEVICE, "%s: devices[%d] is not a CUDA device", fn, i);
#ifdef PDP_CUDA
    {
        int devs[64];
        pdp_status st;
        pdp_nccl_group *g = (pdp_nccl_group *)pdp__calloc(sizeof *g);
        if (!g) return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory", fn);
        g->n = ndev;
        g->timeout_s = timeout;
        snprintf(g->name, sizeof g->name, "%s", desc && desc->name ? desc->name : "comm");
        g->devices = (pdp_device *)pdp__calloc((size_t)ndev * sizeof *g->devices);
        g->handles = (pdp_cudak_nccl **)pdp__calloc((size_t)ndev * sizeof *g->handles);
        if (!g->devices || !g->handles) {
            pdp_nccl_group_free(g);
            return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory for %d ranks", fn, ndev);
        }
        for (i = 0; i < ndev; i++) {
            g->devices[i] = devices[i];
            devs[i] = devices[i].ordinal;
        }
        if ((st = pdp_cudak_nccl_init_all(g->handles, ndev, devs)) != PDP_OK) {
            st = pdp__err(st, "%s: %d GPUs: pdp_cuda: %s", fn, ndev, pdp_cudak_error());
            pdp_nccl_group_free(g);
            return st;
        }
        *out = g;
        return PDP_OK;
    }
#else
    (void)timeout;
    return pdp__err(PDP_ERR_UNSUPPORTED, "%s: the NCCL backend is " PDP__NO_CUDA_MSG, fn);
#endif
}

PDP_API void pdp_nccl_group_free(pdp_nccl_group *g)
{
    if (!g) return;
#ifdef PDP_CUDA
    if (g->handles) {
        int i;
        for (i = 0; i < g->n; i++) pdp_cudak_nccl_free(g->handles[i], 0);
    }
    pdp__dealloc(g->handles);
#endif
    pdp__dealloc(g->devices);
    pdp__dealloc(g);
}

PDP_API pdp_status pdp_comm_create_nccl(pdp_comm **out, pdp_nccl_group *g, int rank)
{
    static const char *fn = "pdp_comm_create_nccl";
    if (!out) return pdp__err(PDP_ERR_INVALID, "%s: out is NULL", fn);
    *out = NULL;
    if (!g) return pdp__err(PDP_ERR_INVALID, "%s: group is NULL", fn);
    if (rank < 0 || rank >= g->n)
        return pdp__err(PDP_ERR_INVALID, "%s: rank %d outside 0..%d", fn, rank, g->n - 1);
#ifdef PDP_CUDA
    {
        pdp_cudak_nccl *h = g->handles[rank];
        if (!h)
            return pdp__err(PDP_ERR_STATE, "%s: rank %d already has its communicator", fn, rank);
        g->handles[rank] = NULL;
        return pdp__nccl_wrap(out, h, g->devices[rank].ordinal, rank, g->n, -1, g->timeout_s,
                              g->name, false, fn);
    }
#else
    return pdp__err(PDP_ERR_UNSUPPORTED, "%s: " PDP__NO_CUDA_MSG, fn);
#endif
}
