/* comm_queue: the collective queue that the local and MPI backends share (handle
   pool, FIFO, progress thread, wait/done); comm_local.c and comm_mpi.c supply only how
   one collective executes.

   What the local and MPI backends share: a fixed pool of handles, a FIFO of
   launched collectives and one progress thread per communicator that runs
   them in issue order through the backend's exec callback; the backend keeps
   only how one collective executes. A launch takes a handle from the free
   list (nothing is allocated per collective; an empty list fails with
   PDP_ERR_STATE naming the backend's PDP_*_MAX_INFLIGHT), queues it and
   returns. The progress thread stamps t_start when it dequeues a handle and
   t_done when exec returns. Wait blocks until done (exec enforces timeouts),
   leaves a failure's message as the thread's error and returns the handle to
   the free list; its head stays readable until the next launch (internal.h).
   Without a progress thread (threaded = false: a local group of one) a launch
   executes inline.

   Set by the backend before pdp__workq_init (the queue is zeroed memory):
     comm, exec  the communicator served and "run one collective";
     sticky      the first failure breaks the queue: queued and later
                 collectives fail at once with its status and message (MPI;
                 the local backend keeps that state in its group instead);
     idle        optional; called by the progress thread, mu held, when nothing
                 is queued: false sleeps until woken, true calls it again (MPI
                 keeps a timed-out request moving this way);
     trace_tid   a trace track (0: off): each collective is a complete event
                 (execution) and an async event (launch to done).
   An exec that polls (MPI) naps between polls with pdp__workq_nap, which a
   thread that begins to wait ends at once: a rank that computes keeps its core,
   a rank that waits is served at once.
   Locks: mu guards the queue, the free list, the handles' done/status/msg, the
   waiter count and the broken state; exec runs without it, and buffers pass to
   the progress thread and back across it. */

#include "internal.h"

#define PDP__MSG_CAP 512 /* bytes of a collective's failure message */

#define PDP__COMM_TIMEOUT_DEFAULT 300.0 /* seconds, when a desc's timeout_s is 0 */
#define PDP__COMM_TIMEOUT_MAX 1e9       /* seconds: beyond it a deadline overflows time_t math */

/* The one rule for a communicator desc's numeric fields (timeout_s is the only one):
   zero means the default; a negative, NaN or infinite value (or one above
   PDP__COMM_TIMEOUT_MAX) fails with PDP_ERR_INVALID naming the function and the
   field. Every communicator constructor calls it first (desc may be NULL). */
PDP__PRIVATE pdp_status pdp__comm_desc_timeout(const pdp_comm_desc *desc, double *out,
                                               const char *fn)
{
    double t = desc ? desc->timeout_s : 0.0;
    *out = PDP__COMM_TIMEOUT_DEFAULT;
    if (!(t >= 0.0 && t <= PDP__COMM_TIMEOUT_MAX))
        return pdp__err(PDP_ERR_INVALID, "%s: desc->timeout_s = %g: it must be a finite number "
                        "of seconds, 0 (the default, %g s) up to %g", fn, t,
                        PDP__COMM_TIMEOUT_DEFAULT, PDP__COMM_TIMEOUT_MAX);
    if (t > 0.0) *out = t;
    return PDP_OK;
}

/* Bytes of count elements of es bytes. comm.c's bound (pdp__comm_check_bound: at most
   PTRDIFF_MAX bytes per buffer) keeps the product from wrapping in every backend. */
PDP__PRIVATE size_t pdp__comm_bytes(int64_t count, size_t es)
{
    PDP_ASSERT(count >= 0 && (uint64_t)count <= (uint64_t)PTRDIFF_MAX / es);
    return (size_t)count * es;
}

/* One collective's arguments, as one rank issued it. */
typedef struct pdp__coll_args {
    pdp__coll_kind kind;
    int64_t seq;
    int64_t count;        /* floats (bytes for BROADCAST_BYTES) */
    int op;               /* pdp_reduce_op or root */
    int dtype;            /* pdp_dtype of the reductions (F32 for the rest) */
    float *buf;           /* allreduce, broadcast (a 16-bit all-reduce: uint16_t elements) */
    const float *send;    /* reduce_scatter, allgather (the same) */
    float *recv;
    void *bytes_buf;      /* broadcast_bytes */
    int peer, tag;        /* send, recv */
    void *out;            /* split: where the backend leaves its result */
} pdp__coll_args;

typedef struct pdp__workq_item {
    pdp_work head;                 /* first member: a pdp_work * is a pdp__workq_item * */
    struct pdp__workq_item *next;  /* free list or queue */
    pdp__coll_args args;
    double t_queued;               /* launch, for the trace */
    bool p2p;                      /* a send or recv: never queued (see below) */
    struct pdp__workq_item *p2p_next; /* the backend's list of unmatched messages */
    bool done;
    pdp_status status;
    char msg[PDP__MSG_CAP];
} pdp__workq_item;

typedef struct pdp__workq pdp__workq;

/* Runs w to completion (progress thread, q->mu not held). On failure returns
   the status with the message, without a function-name prefix, in msg. */
typedef pdp_status (*pdp__workq_exec_fn)(pdp__workq *q, pdp__workq_item *w, char *msg, size_t cap);

struct pdp__workq {
    pdp_comm *comm;                /* its communicator: comm->impl points here */
    pdp__workq_exec_fn exec;
    bool (*idle)(pdp__workq *q);
    /* point-to-point (both set by a backend with send/recv): poll advances every
       pending message of the communicator (optional, q->mu not held); expire is
       called by a waiter past the deadline: it withdraws w if still unmatched and
       completes it with PDP_ERR_TIMEOUT, or starts to (MPI: a cancel, confirmed within
       a grace; the waiter calls it again every 100 us until w is done) (q->mu not held) */
    void (*p2p_poll)(pdp__workq *q);
    void (*p2p_expire)(pdp__workq *q, pdp__workq_item *w);
    bool sticky;
    int trace_tid;
    int trace_pid;                 /* the trace's process lane (MPI: the world rank) */
    const char *limit_macro;       /* "PDP_LOCAL_MAX_INFLIGHT": how to raise capacity */
    int capacity;
    pdp__mutex mu;
    pdp__cond wake;           /* queue not empty, or stopping */
    pdp__cond done;           /* a handle completed */
    pdp__thread thread;
    bool threaded;
    bool stopping;
    double stop_time;
    int waiters;                   /* threads blocked in pdp__workq_wait (their core is idle) */
    int p2p_live;                  /* messages taken and not yet finished */
    pdp__workq_item *free_list, *q_head, *q_tail;
    int64_t next_seq;
    bool broken;                   /* sticky: first failure wins; later collectives fail fast */
    pdp_status broken_status;
    char broken_msg[PDP__MSG_CAP];
};

PDP__PRIVATE void pdp__workq_trace(const pdp__workq *q, const pdp__workq_item *w, double t_start,
                                   double t_done, pdp_status st)
{
    char args[88];
    if (!q->trace_tid) return;
    snprintf(args, sizeof args, "\"seq\":%lld,\"count\":%lld,\"status\":%d",
             (long long)w->head.seq, (long long)w->args.count, (int)st);
    pdp__trace_complete(q->trace_pid, q->trace_tid, "comm", w->head.op_name, t_start, t_done,
                        args);
    pdp__trace_async(q->trace_pid, q->trace_tid, "comm", w->head.op_name,
                     ((uint64_t)(uintptr_t)q->comm << 20) ^ (uint64_t)w->head.seq, w->t_queued,
                     t_done, args);
}

/* Executes w and completes it; q->mu held on entry and on return. */
PDP__PRIVATE void pdp__workq_run(pdp__workq *q, pdp__workq_item *w)
{
    double t_start = w->head.t_start = pdp__now(), t_done;
    pdp_status st;
    char msg[PDP__MSG_CAP];
    if (q->broken) {
        w->head.t_done = t_start;
        w->status = q->broken_status;
        snprintf(w->msg, sizeof w->msg, "%s #%lld not run: %.300s", w->head.op_name,
                 (long long)w->head.seq, q->broken_msg);
    } else {
        pdp__mutex_unlock(&q->mu);
        msg[0] = '\0';
        st = q->exec(q, w, msg, sizeof msg);
        t_done = pdp__now();
        pdp__workq_trace(q, w, t_start, t_done, st);
        pdp__mutex_lock(&q->mu);
        if (st != PDP_OK && q->sticky && !q->broken) {
            q->broken = true;
            q->broken_status = st;
            snprintf(q->broken_msg, sizeof q->broken_msg, "%s", msg);
        }
        w->head.t_done = t_done;
        w->status = st;
        if (st != PDP_OK) snprintf(w->msg, sizeof w->msg, "%s", msg);
    }
    w->done = true;
    pdp__cond_broadcast(&q->done);
}

PDP__PRIVATE void *pdp__workq_progress(void *arg)
{
    pdp__workq *q = (pdp__workq *)arg;
    pdp__mutex_lock(&q->mu);
    for (;;) {
        pdp__workq_item *w;
        while (!q->q_head && !q->stopping)
            if (!q->idle || !q->idle(q)) pdp__cond_wait(&q->wake, &q->mu);
        if (!q->q_head) break; /* stopping with nothing queued */
        w = q->q_head;
        q->q_head = w->next;
        if (!q->q_head) q->q_tail = NULL;
        pdp__workq_run(q, w);
    }
    pdp__mutex_unlock(&q->mu);
    return NULL;
}

/* Threads pool[0, capacity) into the free list, creates the locks and, when
   threaded, starts the progress thread. On failure nothing is left to release;
   fn names the public caller. */
PDP__PRIVATE pdp_status pdp__workq_init(pdp__workq *q, pdp__workq_item *pool, int capacity,
                                        const char *limit_macro, bool threaded, const char *fn)
{
    int i;
    q->capacity = capacity;
    q->limit_macro = limit_macro;
    for (i = capacity - 1; i >= 0; i--) {
        pool[i].next = q->free_list;
        q->free_list = &pool[i];
    }
    pdp__mutex_init(&q->mu);
    pdp__cond_init(&q->wake); /* pdp__workq_nap's timed wait */
    pdp__cond_init(&q->done); /* a message's wait times out */
    q->threaded = threaded;
    if (threaded && pdp__thread_create(&q->thread, pdp__workq_progress, q) != 0) {
        pdp__mutex_destroy(&q->mu);
        pdp__cond_destroy(&q->wake);
        pdp__cond_destroy(&q->done);
        return pdp__err(PDP_ERR_WORKER, "%s: cannot start the progress thread of rank %d", fn,
                        q->comm->rank);
    }
    return PDP_OK;
}

/* True once pdp__workq_shutdown began (*since: when); for an exec that polls. */
PDP__PRIVATE bool pdp__workq_stopping(pdp__workq *q, double *since)
{
    bool s;
    pdp__mutex_lock(&q->mu);
    s = q->stopping;
    *since = q->stop_time;
    pdp__mutex_unlock(&q->mu);
    return s;
}

/* For an exec that polls, between polls. With `eager` and a thread blocked in
   pdp__workq_wait (its core is idle), returns false at once: poll again. Otherwise
   sleeps up to `seconds` and returns true; a thread that begins to wait ends the
   sleep early (the check and the sleep are atomic under mu, so that wake-up is
   never lost). A rank that computes keeps its core; a rank that waits gets its
   collective's completion at once. */
PDP__PRIVATE bool pdp__workq_nap(pdp__workq *q, double seconds, bool eager)
{
    double deadline = pdp__now() + seconds;
    bool slept = false;
    pdp__mutex_lock(&q->mu);
    if (!eager || !q->waiters) {
        pdp__cond_timedwait(&q->wake, &q->mu, deadline);
        slept = true;
    }
    pdp__mutex_unlock(&q->mu);
    return slept;
}

/* Lets the progress thread run what is queued, joins it and destroys the locks. */
PDP__PRIVATE void pdp__workq_shutdown(pdp__workq *q)
{
    if (q->threaded) {
        pdp__mutex_lock(&q->mu);
        q->stopping = true;
        q->stop_time = pdp__now();
        pdp__cond_signal(&q->wake);
        pdp__mutex_unlock(&q->mu);
        pdp__thread_join(&q->thread);
    }
    pdp__mutex_destroy(&q->mu);
    pdp__cond_destroy(&q->wake);
    pdp__cond_destroy(&q->done);
}

/* Takes a handle, fills it and queues it (or runs it inline without a thread). */
PDP__PRIVATE pdp_status pdp__workq_submit(pdp_comm *c, const pdp__coll_args *args, pdp_work **out)
{
    pdp__workq *q = (pdp__workq *)c->impl;
    pdp__workq_item *w;
    pdp__mutex_lock(&q->mu);
    if (q->broken) {
        pdp_status st = q->broken_status;
        pdp__err(st, "%s on comm '%s' (rank %d of %d): the communicator is broken: %s",
                 pdp__op_names[args->kind], c->name, c->rank, c->size, q->broken_msg);
        pdp__mutex_unlock(&q->mu);
        return st;
    }
    w = q->free_list;
    if (!w) {
        pdp__mutex_unlock(&q->mu);
        return pdp__err(PDP_ERR_STATE, "%d collectives in flight on comm '%s' (rank %d): wait for "
                        "some (%s)", q->capacity, c->name, c->rank, q->limit_macro);
    }
    q->free_list = w->next;
    w->next = NULL;
    w->args = *args;
    w->args.seq = q->next_seq++;
    w->head.comm = c;
    w->head.op_name = pdp__op_names[args->kind];
    w->head.seq = w->args.seq;
    w->head.t_start = w->head.t_done = 0.0;
    w->t_queued = pdp__now();
    w->p2p = false;
    w->done = false;
    w->status = PDP_OK;
    w->msg[0] = '\0';
    if (q->threaded) {
        if (q->q_tail) q->q_tail->next = w;
        else q->q_head = w;
        q->q_tail = w;
        pdp__cond_signal(&q->wake);
    } else {
        pdp__workq_run(q, w);
    }
    pdp__mutex_unlock(&q->mu);
    *out = &w->head;
    return PDP_OK;
}

/* ---- comm_queue: point-to-point ----
   A send or receive is not queued behind the collectives (it would deadlock a
   ring, where every rank sends before it receives): the backend matches it
   itself (the local group's mailbox, MPI's own matching), taking its handle from
   the same pool with pdp__workq_take and completing it with pdp__workq_finish.
   Its wait is timed: timeout_s after the launch, p2p_expire withdraws an
   unmatched message and completes it with PDP_ERR_TIMEOUT. */

/* A handle for a message, t_start = launch; PDP_ERR_STATE when the pool is empty,
   the broken status when the queue is broken. */
PDP__PRIVATE pdp_status pdp__workq_take(pdp_comm *c, const pdp__coll_args *args,
                                        pdp__workq_item **out)
{
    pdp__workq *q = (pdp__workq *)c->impl;
    pdp__workq_item *w;
    pdp__mutex_lock(&q->mu);
    if (q->broken) {
        pdp_status st = q->broken_status;
        pdp__err(st, "%s on comm '%s' (rank %d of %d): the communicator is broken: %s",
                 pdp__op_names[args->kind], c->name, c->rank, c->size, q->broken_msg);
        pdp__mutex_unlock(&q->mu);
        return st;
    }
    if (!(w = q->free_list)) {
        pdp__mutex_unlock(&q->mu);
        return pdp__err(PDP_ERR_STATE, "%d collectives and messages in flight on comm '%s' "
                        "(rank %d): wait for some (%s)", q->capacity, c->name, c->rank,
                        q->limit_macro);
    }
    q->free_list = w->next;
    w->next = w->p2p_next = NULL;
    w->args = *args;
    w->args.seq = q->next_seq++;
    w->head.comm = c;
    w->head.op_name = pdp__op_names[args->kind];
    w->head.seq = w->args.seq;
    w->head.t_start = w->t_queued = pdp__now();
    w->head.t_done = 0.0;
    w->p2p = true;
    q->p2p_live++;
    w->done = false;
    w->status = PDP_OK;
    w->msg[0] = '\0';
    pdp__mutex_unlock(&q->mu);
    *out = w;
    return PDP_OK;
}

/* Returns a handle that was never handed out (its launch failed). */
PDP__PRIVATE void pdp__workq_untake(pdp__workq *q, pdp__workq_item *w)
{
    pdp__mutex_lock(&q->mu);
    q->p2p_live--;
    w->next = q->free_list;
    q->free_list = w;
    pdp__mutex_unlock(&q->mu);
}

/* Completes a message's handle (q->mu not held); msg without a function-name prefix. */
PDP__PRIVATE void pdp__workq_finish(pdp__workq *q, pdp__workq_item *w, pdp_status st,
                                    const char *msg)
{
    double t = pdp__now();
    pdp__workq_trace(q, w, w->head.t_start, t, st);
    pdp__mutex_lock(&q->mu);
    w->head.t_done = t;
    w->status = st;
    if (st != PDP_OK) snprintf(w->msg, sizeof w->msg, "%s", msg);
    w->done = true;
    q->p2p_live--;
    pdp__cond_broadcast(&q->done);
    pdp__mutex_unlock(&q->mu);
}

/* "recv #4 (count 7) from rank 1 with tag 5 on comm 'comm', rank 0 of 2" */
PDP__PRIVATE void pdp__p2p_describe(const pdp__workq_item *w, char *out, size_t cap)
{
    const pdp_comm *c = w->head.comm;
    snprintf(out, cap, "%s #%lld (count %lld) %s rank %d with tag %d on comm '%s', rank %d of %d",
             w->head.op_name, (long long)w->head.seq, (long long)w->args.count,
             w->args.kind == PDP__COLL_SEND ? "to" : "from", w->args.peer, w->args.tag, c->name,
             c->rank, c->size);
}

PDP__PRIVATE void pdp__workq_p2p_timeout_msg(const pdp__workq_item *w, char *msg, size_t cap)
{
    char what[200];
    pdp__p2p_describe(w, what, sizeof what);
    snprintf(msg, cap, "%s: no matching %s from rank %d within %g s (peer %d, tag %d)", what,
             w->args.kind == PDP__COLL_SEND ? "recv" : "send", w->args.peer,
             w->head.comm->timeout_s, w->args.peer, w->args.tag);
}

/* Waits for a message (q->mu held on entry and return): polls, times out. */
PDP__PRIVATE void pdp__workq_p2p_block(pdp__workq *q, pdp__workq_item *w)
{
    double deadline = w->head.t_start + w->head.comm->timeout_s;
    while (!w->done) {
        double now = pdp__now(), nap;
        if (q->p2p_poll) {
            pdp__mutex_unlock(&q->mu);
            q->p2p_poll(q);
            pdp__mutex_lock(&q->mu);
            if (w->done) break;
        }
        if (now > deadline) {
            pdp__mutex_unlock(&q->mu);
            q->p2p_expire(q, w);
            pdp__mutex_lock(&q->mu);
            if (w->done) break;
        }
        nap = now > deadline ? 100e-6 : deadline - now + 1e-4; /* past it: a withdrawal's grace */
        if (q->p2p_poll && nap > 100e-6) nap = 100e-6;
        pdp__cond_timedwait(&q->done, &q->mu, pdp__now() + nap);
    }
}

PDP__PRIVATE pdp_status pdp__workq_wait(pdp_work *work)
{
    pdp__workq_item *w = (pdp__workq_item *)work;
    pdp__workq *q = (pdp__workq *)work->comm->impl;
    pdp_status st;
    pdp__mutex_lock(&q->mu);
    q->waiters++;
    pdp__cond_signal(&q->wake); /* ends a pdp__workq_nap: poll hard from now on */
    if (w->p2p) pdp__workq_p2p_block(q, w);
    while (!w->done) pdp__cond_wait(&q->done, &q->mu); /* exec times out */
    q->waiters--;
    st = w->status;
    if (st != PDP_OK) pdp__err(st, "%s", w->msg);
    w->next = q->free_list; /* recycled; the head stays readable until the next launch */
    q->free_list = w;
    pdp__mutex_unlock(&q->mu);
    return st;
}

PDP__PRIVATE bool pdp__workq_done(pdp_work *work)
{
    pdp__workq_item *w = (pdp__workq_item *)work;
    pdp__workq *q = (pdp__workq *)work->comm->impl;
    bool d;
    if (w->p2p && q->p2p_poll) q->p2p_poll(q);
    pdp__mutex_lock(&q->mu);
    d = w->done;
    pdp__mutex_unlock(&q->mu);
    return d;
}

/* The pdp__comm_ops entries of a queue backend: pack the arguments, submit. */

PDP__PRIVATE pdp_status pdp__workq_coll(pdp_comm *c, pdp__coll_kind kind, int64_t count, int op,
                                        pdp_dtype dt, float *buf, const float *send, float *recv,
                                        pdp_work **w)
{
    pdp__coll_args a;
    memset(&a, 0, sizeof a);
    a.kind = kind;
    a.count = count;
    a.op = op;
    a.dtype = (int)dt;
    a.buf = buf;
    a.send = send;
    a.recv = recv;
    return pdp__workq_submit(c, &a, w);
}

PDP__PRIVATE pdp_status pdp__workq_allreduce(pdp_comm *c, void *buf, int64_t count, pdp_dtype dt,
                                             pdp_reduce_op op, pdp_work **w)
{
    return pdp__workq_coll(c, PDP__COLL_ALLREDUCE, count, (int)op, dt, (float *)buf, NULL, NULL,
                           w);
}

PDP__PRIVATE pdp_status pdp__workq_broadcast(pdp_comm *c, float *buf, int64_t count, int root,
                                             pdp_work **w)
{
    return pdp__workq_coll(c, PDP__COLL_BROADCAST, count, root, PDP_DTYPE_F32, buf, NULL, NULL,
                           w);
}

PDP__PRIVATE pdp_status pdp__workq_reduce_scatter(pdp_comm *c, const void *send, void *recv,
                                                  int64_t recv_count, pdp_dtype dt,
                                                  pdp_reduce_op op, pdp_work **w)
{
    return pdp__workq_coll(c, PDP__COLL_REDUCE_SCATTER, recv_count, (int)op, dt, NULL,
                           (const float *)send, (float *)recv, w);
}

PDP__PRIVATE pdp_status pdp__workq_allgather(pdp_comm *c, const float *send, float *recv,
                                             int64_t send_count, pdp_work **w)
{
    return pdp__workq_coll(c, PDP__COLL_ALLGATHER, send_count, 0, PDP_DTYPE_F32, NULL, send, recv,
                           w);
}

PDP__PRIVATE pdp_status pdp__workq_barrier(pdp_comm *c, pdp_work **w)
{
    return pdp__workq_coll(c, PDP__COLL_BARRIER, 0, 0, PDP_DTYPE_F32, NULL, NULL, NULL, w);
}

/* Synchronous, but queued like the others so that it keeps its place in the order. */
PDP__PRIVATE pdp_status pdp__workq_broadcast_bytes(pdp_comm *c, void *buf, size_t bytes, int root)
{
    pdp__coll_args a;
    pdp_work *w = NULL;
    pdp_status st;
    memset(&a, 0, sizeof a);
    a.kind = PDP__COLL_BROADCAST_BYTES;
    a.count = (int64_t)bytes;
    a.op = root;
    a.bytes_buf = buf;
    if ((st = pdp__workq_submit(c, &a, &w)) != PDP_OK) return st;
    return pdp__workq_wait(w);
}

/* A batch (pdp_comm_sendrecv) on a queue backend: local and MPI messages start when posted
   and match by tag, so each is posted as pdp_comm_send/recv posts it; nothing to group. */
PDP__PRIVATE pdp_status pdp__workq_sendrecv(pdp_comm *c, const pdp_p2p *ops, int n, pdp_work **w)
{
    pdp_status st;
    int i;
    for (i = 0; i < n; i++) w[i] = NULL;
    for (i = 0; i < n; i++) {
        st = ops[i].send ? c->ops->send(c, ops[i].buf, ops[i].count, ops[i].peer, ops[i].tag, &w[i])
                         : c->ops->recv(c, ops[i].buf, ops[i].count, ops[i].peer, ops[i].tag,
                                        &w[i]);
        if (st != PDP_OK) return st;
    }
    return PDP_OK;
}
