/* comm: the public communicator API (argument checks, statistics, dispatch to a
   backend's pdp__comm_ops table), the collective queue that the local and MPI
   backends share (handle pool, FIFO, progress thread), and the local backend.

   ---- the public layer ----
   Every pdp_comm_* collective validates its arguments here, stamps the handle's
   launch time, counts the collective and the bytes this rank moves in the
   bandwidth-optimal algorithm (ring all-reduce 2(N-1)/N x bytes, reduce-scatter
   and broadcast (N-1)/N x bytes, all-gather (N-1) x the sent bytes), then calls
   the backend. A call with work == NULL is made synchronous here, so backends
   always return a handle. pdp_work_wait adds the collective's execution time
   (t_done - t_start, queueing excluded) to the communicator's busy_s.

   ---- the local backend ----
   N ranks are threads of one process; a pdp_local_group is their shared
   meeting point. Each rank's communicator owns a collective queue (below,
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

   Faults never hang: every wait in a barrier is a pthread_cond_timedwait on
   CLOCK_MONOTONIC against the group's timeout_s. A rank that does not arrive
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

/* ---- comm: public layer ---- */

static const char *pdp__op_names[] = {"allreduce", "broadcast", "reduce_scatter", "allgather",
                                      "barrier", "broadcast_bytes"};

static pdp_status pdp__comm_check(const pdp_comm *c, const char *fn)
{
    if (!c) return pdp__err(PDP_ERR_INVALID, "%s: communicator is NULL", fn);
    return PDP_OK;
}

static pdp_status pdp__comm_check_count(const pdp_comm *c, const void *p, int64_t count,
                                        const char *what, const char *fn)
{
    if (count < 0)
        return pdp__err(PDP_ERR_INVALID, "%s: %s count %lld < 0 (comm '%s', rank %d of %d)", fn,
                        what, (long long)count, c->name, c->rank, c->size);
    if (count > 0 && !p)
        return pdp__err(PDP_ERR_INVALID, "%s: %s is NULL with count %lld (comm '%s', rank %d)",
                        fn, what, (long long)count, c->name, c->rank);
    return PDP_OK;
}

static pdp_status pdp__comm_check_op(const pdp_comm *c, pdp_reduce_op op, const char *fn)
{
    if (op != PDP_REDUCE_SUM && op != PDP_REDUCE_AVG)
        return pdp__err(PDP_ERR_INVALID, "%s: unknown reduce op %d (comm '%s', rank %d)", fn,
                        (int)op, c->name, c->rank);
    return PDP_OK;
}

static pdp_status pdp__comm_check_root(const pdp_comm *c, int root, const char *fn)
{
    if (root < 0 || root >= c->size)
        return pdp__err(PDP_ERR_INVALID, "%s: root %d outside 0..%d (comm '%s', rank %d)", fn,
                        root, c->size - 1, c->name, c->rank);
    return PDP_OK;
}

/* After the backend accepted a collective: stats, the launch stamp, and the
   synchronous form when the caller passed no handle pointer. */
static pdp_status pdp__comm_launched(pdp_comm *c, pdp_status st, pdp_work *w, double t_launch,
                                     double bytes, pdp_work **work, const char *fn)
{
    if (st != PDP_OK) return pdp__err_wrap(st, "%s", fn);
    w->t_launch = t_launch;
    c->stats.collectives++;
    c->stats.bytes_sent += (int64_t)bytes;
    if (work) {
        *work = w;
        return PDP_OK;
    }
    st = c->ops->wait(w);
    c->stats.busy_s += w->t_done > w->t_start ? w->t_done - w->t_start : 0.0;
    return st == PDP_OK ? st : pdp__err_wrap(st, "%s", fn);
}

PDP_API pdp_status pdp_comm_allreduce(pdp_comm *c, float *buf, int64_t count, pdp_reduce_op op,
                                      pdp_work **work)
{
    static const char *fn = "pdp_comm_allreduce";
    pdp_work *w = NULL;
    double t = pdp__now(), n;
    pdp_status st;
    if (work) *work = NULL;
    if ((st = pdp__comm_check(c, fn)) || (st = pdp__comm_check_count(c, buf, count, "buf", fn)) ||
        (st = pdp__comm_check_op(c, op, fn)))
        return st;
    n = (double)c->size;
    st = c->ops->allreduce(c, buf, count, op, &w);
    return pdp__comm_launched(c, st, w, t, 2.0 * (n - 1.0) / n * (double)count * 4.0, work, fn);
}

PDP_API pdp_status pdp_comm_broadcast(pdp_comm *c, float *buf, int64_t count, int root,
                                      pdp_work **work)
{
    static const char *fn = "pdp_comm_broadcast";
    pdp_work *w = NULL;
    double t = pdp__now(), n;
    pdp_status st;
    if (work) *work = NULL;
    if ((st = pdp__comm_check(c, fn)) || (st = pdp__comm_check_count(c, buf, count, "buf", fn)) ||
        (st = pdp__comm_check_root(c, root, fn)))
        return st;
    n = (double)c->size;
    st = c->ops->broadcast(c, buf, count, root, &w);
    return pdp__comm_launched(c, st, w, t, (n - 1.0) / n * (double)count * 4.0, work, fn);
}

PDP_API pdp_status pdp_comm_reduce_scatter(pdp_comm *c, const float *send, float *recv,
                                           int64_t recv_count, pdp_reduce_op op, pdp_work **work)
{
    static const char *fn = "pdp_comm_reduce_scatter";
    pdp_work *w = NULL;
    double t = pdp__now();
    pdp_status st;
    if (work) *work = NULL;
    if ((st = pdp__comm_check(c, fn)) ||
        (st = pdp__comm_check_count(c, send, recv_count, "send", fn)) ||
        (st = pdp__comm_check_count(c, recv, recv_count, "recv", fn)) ||
        (st = pdp__comm_check_op(c, op, fn)))
        return st;
    st = c->ops->reduce_scatter(c, send, recv, recv_count, op, &w);
    return pdp__comm_launched(c, st, w, t, (double)(c->size - 1) * (double)recv_count * 4.0, work,
                              fn);
}

PDP_API pdp_status pdp_comm_allgather(pdp_comm *c, const float *send, float *recv,
                                      int64_t send_count, pdp_work **work)
{
    static const char *fn = "pdp_comm_allgather";
    pdp_work *w = NULL;
    double t = pdp__now();
    pdp_status st;
    if (work) *work = NULL;
    if ((st = pdp__comm_check(c, fn)) ||
        (st = pdp__comm_check_count(c, send, send_count, "send", fn)) ||
        (st = pdp__comm_check_count(c, recv, send_count, "recv", fn)))
        return st;
    st = c->ops->allgather(c, send, recv, send_count, &w);
    return pdp__comm_launched(c, st, w, t, (double)(c->size - 1) * (double)send_count * 4.0, work,
                              fn);
}

PDP_API pdp_status pdp_comm_barrier(pdp_comm *c, pdp_work **work)
{
    static const char *fn = "pdp_comm_barrier";
    pdp_work *w = NULL;
    double t = pdp__now();
    pdp_status st;
    if (work) *work = NULL;
    if ((st = pdp__comm_check(c, fn))) return st;
    st = c->ops->barrier(c, &w);
    return pdp__comm_launched(c, st, w, t, 0.0, work, fn);
}

PDP_API pdp_status pdp_comm_broadcast_bytes(pdp_comm *c, void *buf, size_t bytes, int root)
{
    static const char *fn = "pdp_comm_broadcast_bytes";
    pdp_status st;
    if ((st = pdp__comm_check(c, fn)) || (st = pdp__comm_check_root(c, root, fn))) return st;
    if (bytes > 0 && !buf)
        return pdp__err(PDP_ERR_INVALID, "%s: buf is NULL with %zu bytes (comm '%s', rank %d)", fn,
                        bytes, c->name, c->rank);
    if ((st = c->ops->broadcast_bytes(c, buf, bytes, root)) != PDP_OK)
        return pdp__err_wrap(st, "%s", fn);
    c->stats.collectives++;
    c->stats.bytes_sent += (int64_t)((double)(c->size - 1) / c->size * (double)bytes);
    return PDP_OK;
}

PDP_API pdp_status pdp_work_wait(pdp_work *w)
{
    pdp_comm *c;
    pdp_status st;
    if (!w) return PDP_OK;
    c = w->comm;
    st = c->ops->wait(w); /* recycles w; its head fields stay readable (internal.h) */
    c->stats.busy_s += w->t_done > w->t_start ? w->t_done - w->t_start : 0.0;
    return st == PDP_OK ? st : pdp__err_wrap(st, "pdp_work_wait");
}

PDP_API pdp_status pdp_wait(pdp_work *work) { return pdp_work_wait(work); }

PDP_API bool pdp_work_done(pdp_work *w) { return !w || w->comm->ops->done(w); }

PDP_API void pdp_comm_free(pdp_comm *c)
{
    if (c) c->ops->destroy(c);
}

PDP_API int pdp_comm_rank(const pdp_comm *c) { return c ? c->rank : -1; }
PDP_API int pdp_comm_size(const pdp_comm *c) { return c ? c->size : 0; }
PDP_API pdp_backend pdp_comm_backend(const pdp_comm *c)
{
    return c ? c->backend : PDP_BACKEND_DEFAULT;
}
PDP_API double pdp_comm_timeout(const pdp_comm *c) { return c ? c->timeout_s : 0.0; }

PDP_API void pdp_comm_get_stats(const pdp_comm *c, pdp_comm_stats *out)
{
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (c) *out = c->stats;
}

/* pdp_comm_init_env (MPI, NCCL from the environment) lives in comm_mpi.c. */

/* ---- comm: the collective queue (local and MPI backends) ----

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

/* *ts = CLOCK_MONOTONIC now + seconds, for pthread_cond_timedwait on a condition
   variable created with a monotonic clock. */
static void pdp__deadline(struct timespec *ts, double seconds)
{
    double whole = floor(seconds);
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += (time_t)whole;
    ts->tv_nsec += (long)((seconds - whole) * 1e9);
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

#define PDP__MSG_CAP 512 /* bytes of a collective's failure message */

typedef enum pdp__coll_kind {
    PDP__COLL_ALLREDUCE,
    PDP__COLL_BROADCAST,
    PDP__COLL_REDUCE_SCATTER,
    PDP__COLL_ALLGATHER,
    PDP__COLL_BARRIER,
    PDP__COLL_BROADCAST_BYTES
} pdp__coll_kind;

/* One collective's arguments, as one rank issued it. */
typedef struct pdp__coll_args {
    pdp__coll_kind kind;
    int64_t seq;
    int64_t count;        /* floats (bytes for BROADCAST_BYTES) */
    int op;               /* pdp_reduce_op or root */
    float *buf;           /* allreduce, broadcast */
    const float *send;    /* reduce_scatter, allgather */
    float *recv;
    void *bytes_buf;      /* broadcast_bytes */
} pdp__coll_args;

typedef struct pdp__workq_item {
    pdp_work head;                 /* first member: a pdp_work * is a pdp__workq_item * */
    struct pdp__workq_item *next;  /* free list or queue */
    pdp__coll_args args;
    double t_queued;               /* launch, for the trace */
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
    bool sticky;
    int trace_tid;
    const char *limit_macro;       /* "PDP_LOCAL_MAX_INFLIGHT": how to raise capacity */
    int capacity;
    pthread_mutex_t mu;
    pthread_cond_t wake;           /* queue not empty, or stopping */
    pthread_cond_t done;           /* a handle completed */
    pthread_t thread;
    bool threaded;
    bool stopping;
    double stop_time;
    int waiters;                   /* threads blocked in pdp__workq_wait (their core is idle) */
    pdp__workq_item *free_list, *q_head, *q_tail;
    int64_t next_seq;
    bool broken;                   /* sticky: first failure wins; later collectives fail fast */
    pdp_status broken_status;
    char broken_msg[PDP__MSG_CAP];
};

static void pdp__workq_trace(const pdp__workq *q, const pdp__workq_item *w, double t_start,
                             double t_done, pdp_status st)
{
    char args[88];
    if (!q->trace_tid) return;
    snprintf(args, sizeof args, "\"seq\":%lld,\"count\":%lld,\"status\":%d",
             (long long)w->head.seq, (long long)w->args.count, (int)st);
    pdp__trace_complete(q->comm->rank, q->trace_tid, "comm", w->head.op_name, t_start, t_done,
                        args);
    pdp__trace_async(q->comm->rank, q->trace_tid, "comm", w->head.op_name,
                     ((uint64_t)(uintptr_t)q->comm << 20) ^ (uint64_t)w->head.seq, w->t_queued,
                     t_done, args);
}

/* Executes w and completes it; q->mu held on entry and on return. */
static void pdp__workq_run(pdp__workq *q, pdp__workq_item *w)
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
        pthread_mutex_unlock(&q->mu);
        msg[0] = '\0';
        st = q->exec(q, w, msg, sizeof msg);
        t_done = pdp__now();
        pdp__workq_trace(q, w, t_start, t_done, st);
        pthread_mutex_lock(&q->mu);
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
    pthread_cond_broadcast(&q->done);
}

static void *pdp__workq_progress(void *arg)
{
    pdp__workq *q = (pdp__workq *)arg;
    pthread_mutex_lock(&q->mu);
    for (;;) {
        pdp__workq_item *w;
        while (!q->q_head && !q->stopping)
            if (!q->idle || !q->idle(q)) pthread_cond_wait(&q->wake, &q->mu);
        if (!q->q_head) break; /* stopping with nothing queued */
        w = q->q_head;
        q->q_head = w->next;
        if (!q->q_head) q->q_tail = NULL;
        pdp__workq_run(q, w);
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

/* Threads pool[0, capacity) into the free list, creates the locks and, when
   threaded, starts the progress thread. On failure nothing is left to release;
   fn names the public caller. */
static pdp_status pdp__workq_init(pdp__workq *q, pdp__workq_item *pool, int capacity,
                                  const char *limit_macro, bool threaded, const char *fn)
{
    pthread_condattr_t ca;
    int i;
    q->capacity = capacity;
    q->limit_macro = limit_macro;
    for (i = capacity - 1; i >= 0; i--) {
        pool[i].next = q->free_list;
        q->free_list = &pool[i];
    }
    pthread_mutex_init(&q->mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* pdp__workq_nap's timed wait */
    pthread_cond_init(&q->wake, &ca);
    pthread_condattr_destroy(&ca);
    pthread_cond_init(&q->done, NULL);
    q->threaded = threaded;
    if (threaded && pthread_create(&q->thread, NULL, pdp__workq_progress, q) != 0) {
        pthread_mutex_destroy(&q->mu);
        pthread_cond_destroy(&q->wake);
        pthread_cond_destroy(&q->done);
        return pdp__err(PDP_ERR_WORKER, "%s: cannot start the progress thread of rank %d", fn,
                        q->comm->rank);
    }
    return PDP_OK;
}

/* True once pdp__workq_shutdown began (*since: when); for an exec that polls. */
static bool pdp__workq_stopping(pdp__workq *q, double *since)
{
    bool s;
    pthread_mutex_lock(&q->mu);
    s = q->stopping;
    *since = q->stop_time;
    pthread_mutex_unlock(&q->mu);
    return s;
}

/* For an exec that polls, between polls. With `eager` and a thread blocked in
   pdp__workq_wait (its core is idle), returns false at once: poll again. Otherwise
   sleeps up to `seconds` and returns true; a thread that begins to wait ends the
   sleep early (the check and the sleep are atomic under mu, so that wake-up is
   never lost). A rank that computes keeps its core; a rank that waits gets its
   collective's completion at once. */
static bool pdp__workq_nap(pdp__workq *q, double seconds, bool eager)
{
    struct timespec deadline;
    bool slept = false;
    pdp__deadline(&deadline, seconds);
    pthread_mutex_lock(&q->mu);
    if (!eager || !q->waiters) {
        pthread_cond_timedwait(&q->wake, &q->mu, &deadline);
        slept = true;
    }
    pthread_mutex_unlock(&q->mu);
    return slept;
}

/* Lets the progress thread run what is queued, joins it and destroys the locks. */
static void pdp__workq_shutdown(pdp__workq *q)
{
    if (q->threaded) {
        pthread_mutex_lock(&q->mu);
        q->stopping = true;
        q->stop_time = pdp__now();
        pthread_cond_signal(&q->wake);
        pthread_mutex_unlock(&q->mu);
        pthread_join(q->thread, NULL);
    }
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->wake);
    pthread_cond_destroy(&q->done);
}

/* Takes a handle, fills it and queues it (or runs it inline without a thread). */
static pdp_status pdp__workq_submit(pdp_comm *c, const pdp__coll_args *args, pdp_work **out)
{
    pdp__workq *q = (pdp__workq *)c->impl;
    pdp__workq_item *w;
    pthread_mutex_lock(&q->mu);
    if (q->broken) {
        pdp_status st = q->broken_status;
        pdp__err(st, "%s on comm '%s' (rank %d of %d): the communicator is broken: %s",
                 pdp__op_names[args->kind], c->name, c->rank, c->size, q->broken_msg);
        pthread_mutex_unlock(&q->mu);
        return st;
    }
    w = q->free_list;
    if (!w) {
        pthread_mutex_unlock(&q->mu);
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
    w->done = false;
    w->status = PDP_OK;
    w->msg[0] = '\0';
    if (q->threaded) {
        if (q->q_tail) q->q_tail->next = w;
        else q->q_head = w;
        q->q_tail = w;
        pthread_cond_signal(&q->wake);
    } else {
        pdp__workq_run(q, w);
    }
    pthread_mutex_unlock(&q->mu);
    *out = &w->head;
    return PDP_OK;
}

static pdp_status pdp__workq_wait(pdp_work *work)
{
    pdp__workq_item *w = (pdp__workq_item *)work;
    pdp__workq *q = (pdp__workq *)work->comm->impl;
    pdp_status st;
    pthread_mutex_lock(&q->mu);
    q->waiters++;
    pthread_cond_signal(&q->wake); /* ends a pdp__workq_nap: poll hard from now on */
    while (!w->done) pthread_cond_wait(&q->done, &q->mu); /* exec times out */
    q->waiters--;
    st = w->status;
    if (st != PDP_OK) pdp__err(st, "%s", w->msg);
    w->next = q->free_list; /* recycled; the head stays readable until the next launch */
    q->free_list = w;
    pthread_mutex_unlock(&q->mu);
    return st;
}

static bool pdp__workq_done(pdp_work *work)
{
    pdp__workq_item *w = (pdp__workq_item *)work;
    pdp__workq *q = (pdp__workq *)work->comm->impl;
    bool d;
    pthread_mutex_lock(&q->mu);
    d = w->done;
    pthread_mutex_unlock(&q->mu);
    return d;
}

/* The pdp__comm_ops entries of a queue backend: pack the arguments, submit. */

static pdp_status pdp__workq_coll(pdp_comm *c, pdp__coll_kind kind, int64_t count, int op,
                                  float *buf, const float *send, float *recv, pdp_work **w)
{
    pdp__coll_args a;
    memset(&a, 0, sizeof a);
    a.kind = kind;
    a.count = count;
    a.op = op;
    a.buf = buf;
    a.send = send;
    a.recv = recv;
    return pdp__workq_submit(c, &a, w);
}

static pdp_status pdp__workq_allreduce(pdp_comm *c, float *buf, int64_t count, pdp_reduce_op op,
                                       pdp_work **w)
{
    return pdp__workq_coll(c, PDP__COLL_ALLREDUCE, count, (int)op, buf, NULL, NULL, w);
}

static pdp_status pdp__workq_broadcast(pdp_comm *c, float *buf, int64_t count, int root,
                                       pdp_work **w)
{
    return pdp__workq_coll(c, PDP__COLL_BROADCAST, count, root, buf, NULL, NULL, w);
}

static pdp_status pdp__workq_reduce_scatter(pdp_comm *c, const float *send, float *recv,
                                            int64_t recv_count, pdp_reduce_op op, pdp_work **w)
{
    return pdp__workq_coll(c, PDP__COLL_REDUCE_SCATTER, recv_count, (int)op, NULL, send, recv, w);
}

static pdp_status pdp__workq_allgather(pdp_comm *c, const float *send, float *recv,
                                       int64_t send_count, pdp_work **w)
{
    return pdp__workq_coll(c, PDP__COLL_ALLGATHER, send_count, 0, NULL, send, recv, w);
}

static pdp_status pdp__workq_barrier(pdp_comm *c, pdp_work **w)
{
    return pdp__workq_coll(c, PDP__COLL_BARRIER, 0, 0, NULL, NULL, NULL, w);
}

/* Synchronous, but queued like the others so that it keeps its place in the order. */
static pdp_status pdp__workq_broadcast_bytes(pdp_comm *c, void *buf, size_t bytes, int root)
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

/* ---- comm: local backend, the group ---- */

#define PDP__LOCAL_MAX_RANKS 256  /* ranks are threads: more would only oversubscribe */
#ifndef PDP_LOCAL_MAX_INFLIGHT
#  define PDP_LOCAL_MAX_INFLIGHT 256 /* handles per local communicator */
#endif

struct pdp_local_group {
    int size;
    double timeout_s;
    pdp_device device;
    char name[32];
    pthread_mutex_t mu;
    pthread_cond_t cv;        /* barrier progress, departures, breakage */
    int arrived;              /* ranks in the current barrier */
    uint64_t gen;             /* barriers completed */
    int64_t *phase;           /* per rank: barriers entered */
    pdp__coll_args *slot;     /* per rank: the collective it is executing */
    bool *joined;             /* per rank: a communicator was created */
    bool *gone;               /* per rank: its communicator was freed */
    bool broken;
    pdp_status broken_status;
    char broken_msg[PDP__MSG_CAP];
};

PDP_API pdp_status pdp_local_group_create(pdp_local_group **out, int world_size,
                                          const pdp_comm_desc *desc)
{
    static const char *fn = "pdp_local_group_create";
    pdp_local_group *g;
    pthread_condattr_t ca;
    double timeout = desc && desc->timeout_s > 0 ? desc->timeout_s : 300.0;
    if (!out) return pdp__err(PDP_ERR_INVALID, "%s: out is NULL", fn);
    *out = NULL;
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
    pthread_mutex_init(&g->mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&g->cv, &ca);
    pthread_condattr_destroy(&ca);
    *out = g;
    return PDP_OK;
}

PDP_API void pdp_local_group_free(pdp_local_group *g)
{
    if (!g) return;
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    pdp__dealloc(g->phase);
    pdp__dealloc(g->slot);
    pdp__dealloc(g->joined);
    pdp__dealloc(g->gone);
    pdp__dealloc(g);
}

/* Marks the group broken with a message (first failure wins); g->mu held. */
static void pdp__group_break(pdp_local_group *g, pdp_status st, const char *msg)
{
    if (g->broken) return;
    g->broken = true;
    g->broken_status = st;
    snprintf(g->broken_msg, sizeof g->broken_msg, "%s", msg);
    pthread_cond_broadcast(&g->cv);
}

/* "allreduce #7 (count 1024) on comm 'comm', rank 0 of 2" */
static void pdp__coll_describe(const pdp_local_group *g, int rank, const pdp__coll_args *a,
                               char *out, size_t cap)
{
    snprintf(out, cap, "%s #%lld (count %lld) on comm '%s', rank %d of %d",
             pdp__op_names[a->kind], (long long)a->seq, (long long)a->count, g->name, rank,
             g->size);
}

/* The last rank into barrier A checks that everyone issued the same collective;
   g->mu held. Returns false (and breaks the group) on a mismatch. */
static bool pdp__group_validate(pdp_local_group *g)
{
    const pdp__coll_args *a = &g->slot[0];
    int r;
    for (r = 1; r < g->size; r++) {
        const pdp__coll_args *b = &g->slot[r];
        if (b->kind != a->kind || b->count != a->count || b->op != a->op) {
            char msg[PDP__MSG_CAP];
            snprintf(msg, sizeof msg,
                     "collectives differ across ranks on comm '%s': rank 0 issued %s #%lld "
                     "(count %lld, op/root %d), rank %d issued %s #%lld (count %lld, op/root %d); "
                     "every rank must issue the same collectives in the same order",
                     g->name, pdp__op_names[a->kind], (long long)a->seq, (long long)a->count,
                     a->op, r, pdp__op_names[b->kind], (long long)b->seq, (long long)b->count,
                     b->op);
            pdp__group_break(g, PDP_ERR_INVALID, msg);
            return false;
        }
    }
    return true;
}

/* Barrier A (publish = true: also publishes *args in this rank's slot) or B.
   On failure returns the status and leaves the message in msg. */
static pdp_status pdp__group_barrier(pdp_local_group *g, int rank, const pdp__coll_args *args,
                                     bool publish, char *msg, size_t cap)
{
    struct timespec deadline;
    uint64_t gen;
    int64_t my_phase;
    char what[160];
    pdp_status st = PDP_OK;
    pdp__coll_describe(g, rank, args, what, sizeof what);
    pdp__deadline(&deadline, g->timeout_s);
    pthread_mutex_lock(&g->mu);
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
            pthread_cond_broadcast(&g->cv);
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
        rc = pthread_cond_timedwait(&g->cv, &g->mu, &deadline);
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
    pthread_mutex_unlock(&g->mu);
    return st;
}

/* ---- comm: local backend, the data movement ---- */

/* [lo, hi) of n items for part r of parts, with boundaries on 16 floats (one cache line)
   so that two ranks never write the same line. */
static void pdp__slice(int64_t n, int r, int parts, int64_t *lo, int64_t *hi)
{
    int64_t a = n * r / parts, b = n * (r + 1) / parts;
    *lo = r == 0 ? 0 : a & ~(int64_t)15;
    *hi = r == parts - 1 ? n : b & ~(int64_t)15;
    if (*hi < *lo) *hi = *lo;
}

#define PDP__CHUNK 2048

/* acc[0..n) <- op over ranks of src[i][off..off+n), in rank order: ((s0 + s1) + s2) + ...,
   then / nsrc for AVG. acc is the caller's chunk, never one of the sources, so every
   loop is a restrict-qualified blocked loop that gcc -O2 vectorises (one pass per
   source; the chunk stays in L1). */
static void pdp__reduce_chunk(float *PDP__RESTRICT acc, const float *const *src, int nsrc,
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

/* Rank r's share of the collective whose arguments every rank published. */
static void pdp__local_execute(pdp_local_group *g, int r)
{
    const pdp__coll_args *me = &g->slot[r];
    int n = g->size, i;
    float acc[PDP__CHUNK];
    const float *src[PDP__LOCAL_MAX_RANKS];
    int64_t lo, hi, off, len;
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
                memcpy(g->slot[i].buf + lo, g->slot[me->op].buf + lo, (size_t)(hi - lo) * 4);
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
                memmove(dst, me->send, (size_t)me->count * sizeof *dst);
        }
        break;
    case PDP__COLL_BARRIER:
        break;
    }
}

/* ---- comm: local backend, communicators ---- */

typedef struct pdp__local_comm {
    pdp_comm head;                 /* first member */
    pdp__workq q;                  /* head.impl points here */
    pdp_local_group *g;
    pdp__workq_item pool[PDP_LOCAL_MAX_INFLIGHT];
} pdp__local_comm;

/* The queue's exec: one collective for this rank, barrier A, its share of the
   work, barrier B. */
static pdp_status pdp__local_exec(pdp__workq *q, pdp__workq_item *w, char *msg, size_t cap)
{
    pdp__local_comm *lc = (pdp__local_comm *)q->comm;
    pdp_local_group *g = lc->g;
    const pdp__coll_args *a = &w->args;
    int r = lc->head.rank;
    pdp_status st;
    if (g->size == 1) {
        if (a->kind == PDP__COLL_REDUCE_SCATTER || a->kind == PDP__COLL_ALLGATHER)
            if (a->recv != a->send && a->count > 0)
                memmove(a->recv, a->send, (size_t)a->count * sizeof *a->recv);
        return PDP_OK;
    }
    if ((st = pdp__group_barrier(g, r, a, true, msg, cap)) != PDP_OK) return st;
    pdp__local_execute(g, r);
    return pdp__group_barrier(g, r, a, false, msg, cap);
}

static void pdp__local_destroy(pdp_comm *c)
{
    pdp__local_comm *lc = (pdp__local_comm *)c;
    pdp_local_group *g = lc->g;
    /* gone first: a progress thread blocked in a barrier on our behalf, or a peer
       waiting for us, wakes up and fails instead of waiting out the timeout */
    pthread_mutex_lock(&g->mu);
    g->gone[c->rank] = true;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    pdp__workq_shutdown(&lc->q);
    pdp__dealloc(lc);
}

static const pdp__comm_ops pdp__local_ops = {
    pdp__workq_allreduce, pdp__workq_broadcast, pdp__workq_reduce_scatter,
    pdp__workq_allgather, pdp__workq_barrier,   pdp__workq_broadcast_bytes,
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
    pthread_mutex_lock(&g->mu);
    if (g->joined[rank]) {
        pthread_mutex_unlock(&g->mu);
        pdp__dealloc(lc);
        return pdp__err(PDP_ERR_INVALID, "%s: rank %d of group '%s' already has a communicator",
                        fn, rank, g->name);
    }
    g->joined[rank] = true;
    pthread_mutex_unlock(&g->mu);
    lc->head.ops = &pdp__local_ops;
    lc->head.backend = PDP_BACKEND_LOCAL;
    lc->head.rank = rank;
    lc->head.size = g->size;
    lc->head.timeout_s = g->timeout_s;
    lc->head.device = g->device;
    memcpy(lc->head.name, g->name, sizeof lc->head.name);
    lc->head.impl = &lc->q;
    lc->g = g;
    lc->q.comm = &lc->head;
    lc->q.exec = pdp__local_exec;
    /* world size 1: every collective is local and immediate, no thread */
    if ((st = pdp__workq_init(&lc->q, lc->pool, PDP_LOCAL_MAX_INFLIGHT, "PDP_LOCAL_MAX_INFLIGHT",
                              g->size > 1, fn)) != PDP_OK) {
        pthread_mutex_lock(&g->mu);
        g->joined[rank] = false;
        pthread_mutex_unlock(&g->mu);
        pdp__dealloc(lc);
        return st;
    }
    *out = &lc->head;
    return PDP_OK;
}
