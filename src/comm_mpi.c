/* comm_mpi: pdp_comm_init_env, and the MPI communicator backend (-DPDP_MPI).

   ---- pdp_comm_init_env ----
   Creates the communicator of a process launched by mpirun or torchrun:
     PDP_BACKEND_MPI    the MPI backend below; without PDP_MPI it fails with
                        PDP_ERR_UNSUPPORTED naming the macro.
     PDP_BACKEND_NCCL   pdp__comm_init_nccl_env, defined by cuda_host.c under
                        PDP_CUDA; without PDP_CUDA the stub here fails with
                        PDP_ERR_UNSUPPORTED naming the macro.
     DEFAULT / LOCAL    PDP_ERR_INVALID: thread-ranks have no environment to
                        read; they need pdp_local_group_create.

   ---- the MPI backend ----
   Rank and size come from MPI_COMM_WORLD, which every process duplicates once
   (collective: every rank calls pdp_comm_init_env, in the same order as its
   other collectives on MPI_COMM_WORLD), so pdp's traffic never matches the
   application's own messages. The duplication is MPI_Comm_idup, polled
   against timeout_s: a rank that never creates its communicator makes the
   others fail with PDP_ERR_TIMEOUT instead of hanging; the orphaned request
   is kept, and completed (or given up) before MPI_Finalize. The duplicate
   reports errors (MPI_ERRORS_RETURN) instead of aborting the job: library
   code never calls MPI_Abort, and an MPI error becomes PDP_ERR_COMM with
   MPI's error string.

   One progress thread per communicator runs the collectives in issue order,
   as PyTorch's ProcessGroupMPI does: a launch only queues a handle from a
   fixed pool (PDP_MPI_MAX_INFLIGHT, nothing is allocated per collective) and
   returns, so the calling rank keeps computing backward while the all-reduce
   runs. The thread posts the non-blocking call (MPI_Iallreduce, MPI_Ibcast,
   MPI_Ireduce_scatter_block, MPI_Iallgather, MPI_Ibarrier) and drives it with
   MPI_Test: spinning first, then yielding, then sleeping 50 us, so an idle
   rank leaves the core to compute. AVG is SUM followed by a division by the
   size on every element, as the local backend does. MPI counts are int: an
   all-reduce or broadcast is split into calls of PDP_MPI_CHUNK elements;
   reduce-scatter and all-gather take at most INT_MAX elements per rank.
   In-place forms: all-gather with send == recv + rank * count, and
   reduce-scatter with recv == send + rank * count (NCCL's convention).

   Timeouts: MPI cannot time out, so the progress thread is the watchdog. A
   collective that has not completed timeout_s after the thread posted it fails
   with PDP_ERR_TIMEOUT naming the collective, its sequence number and the
   communicator (MPI cannot say which rank is missing). The communicator is
   then broken: queued and later collectives fail at once with the same status
   and message, as an aborted NCCL communicator does. The timed-out request
   cannot be cancelled (MPI forbids cancelling collectives); the thread keeps
   testing it, so a late rank still completes it and the communicator can be
   freed cleanly. pdp_comm_free gives an in-flight request one more second,
   then abandons it: the duplicate communicator and the request are leaked,
   and pdp will not call MPI_Finalize, because that may hang on them.

   MPI initialisation: if MPI is not initialised, the first pdp_comm_init_env
   calls MPI_Init_thread(MPI_THREAD_MULTIPLE), and pdp_comm_free of the last
   MPI communicator calls MPI_Finalize (MPI cannot be initialised twice, so a
   program that creates MPI communicators one after another, or uses MPI
   itself, calls MPI_Init_thread first and MPI_Finalize last; pdp then never
   finalises). MPI_THREAD_MULTIPLE is required: the progress thread calls MPI
   while the application's threads may. That ownership record (a count of
   live communicators and whether pdp initialised MPI) is process-wide,
   behind a mutex, because MPI's own initialisation is.

   Locks: mc->mu guards the queue, the pool, the handles' done/status and the
   broken state; the progress thread never holds it inside an MPI call.
   Buffers pass to the progress thread and back across that mutex (TSan finds
   nothing in this file; OpenMPI's own internals draw reports of their own).
   Reference: MPI 3.1, chapter 5.12 (non-blocking collectives). */

#include "internal.h"

/* ---- comm_mpi: NCCL stub ---- */

#ifndef PDP_CUDA
static pdp_status pdp__comm_init_nccl_env(pdp_comm **out, const pdp_comm_desc *desc)
{
    (void)desc;
    *out = NULL;
    return pdp__err(PDP_ERR_UNSUPPORTED, "pdp_comm_init_env: backend NCCL: built without PDP_CUDA "
                    "(compile with -DPDP_CUDA and link pdp_cuda.o)");
}
#endif

#ifdef PDP_MPI
#include <mpi.h>
#include <sched.h>

#ifndef PDP_MPI_MAX_INFLIGHT
#  define PDP_MPI_MAX_INFLIGHT 256 /* handles per MPI communicator */
#endif
#ifndef PDP_MPI_CHUNK
#  define PDP_MPI_CHUNK (1 << 30)  /* elements per MPI call of an all-reduce or broadcast */
#endif
#define PDP__MPI_FREE_GRACE_S 1.0  /* pdp_comm_free waits this long for an in-flight request */

/* ---- comm_mpi: process-wide MPI ownership ---- */

static pthread_mutex_t pdp__mpi_mu = PTHREAD_MUTEX_INITIALIZER;
static int pdp__mpi_live;          /* MPI communicators alive */
static bool pdp__mpi_we_init;      /* pdp called MPI_Init_thread, so it finalises */
static bool pdp__mpi_unclean;      /* a request was abandoned: never call MPI_Finalize */
static bool pdp__mpi_init_orphan;  /* a timed-out MPI_Comm_idup, completed before finalising */
static MPI_Request pdp__mpi_init_req;
static MPI_Comm pdp__mpi_init_comm;

/* ---- comm_mpi: state ---- */

typedef enum pdp__mpi_kind {
    PDP__MPI_ALLREDUCE,
    PDP__MPI_BROADCAST,
    PDP__MPI_REDUCE_SCATTER,
    PDP__MPI_ALLGATHER,
    PDP__MPI_BARRIER,
    PDP__MPI_BROADCAST_BYTES
} pdp__mpi_kind;

static const char *const pdp__mpi_kind_names[] = {"allreduce", "broadcast", "reduce_scatter",
                                                  "allgather", "barrier",   "broadcast_bytes"};

typedef struct pdp__mpi_work {
    pdp_work head;               /* first member */
    struct pdp__mpi_work *next;  /* free list or queue */
    pdp__mpi_kind kind;
    pdp_reduce_op op;
    int root;
    float *buf;                  /* all-reduce, broadcast */
    const float *send;           /* reduce-scatter, all-gather */
    float *recv;
    void *bytes_buf;             /* broadcast_bytes */
    int64_t count;               /* elements (bytes for broadcast_bytes) */
    double t_queued;             /* for the trace (head.t_launch is the caller's) */
    bool done;
    pdp_status status;
    char msg[400];
} pdp__mpi_work;

typedef struct pdp__mpi_comm {
    pdp_comm head;               /* first member */
    MPI_Comm mcomm;              /* our duplicate of MPI_COMM_WORLD */
    pthread_mutex_t mu;
    pthread_cond_t wake;         /* queue not empty, or stopping */
    pthread_cond_t done;         /* a handle completed */
    pthread_t thread;
    bool stopping;
    double stop_time;
    pdp__mpi_work *free_list, *q_head, *q_tail;
    int64_t next_seq;
    bool broken;                 /* first failure wins; later collectives fail fast */
    pdp_status broken_status;
    char broken_msg[400];
    bool orphan;                 /* a timed-out request is still pending */
    MPI_Request orphan_req;
    int trace_tid;               /* 0 when tracing is off */
    bool traced;                 /* pdp__trace_open succeeded: close at free */
    pdp__mpi_work pool[PDP_MPI_MAX_INFLIGHT];
} pdp__mpi_comm;

/* ---- comm_mpi: progress thread ---- */

static void pdp__mpi_errstr(int rc, char *out, size_t cap)
{
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, s, &len) != MPI_SUCCESS) len = 0;
    s[len < MPI_MAX_ERROR_STRING ? len : MPI_MAX_ERROR_STRING - 1] = '\0';
    snprintf(out, cap, "%s (MPI error %d)", len ? s : "unknown", rc);
}

static bool pdp__mpi_stopping(pdp__mpi_comm *mc, double *since)
{
    bool s;
    pthread_mutex_lock(&mc->mu);
    s = mc->stopping;
    *since = mc->stop_time;
    pthread_mutex_unlock(&mc->mu);
    return s;
}

/* Drives *req to completion: PDP_OK; PDP_ERR_TIMEOUT after deadline, or
   PDP_ERR_COMM when the communicator is being freed, with *req left pending
   (the caller records it as the orphan). */
static pdp_status pdp__mpi_drive(pdp__mpi_comm *mc, pdp__mpi_work *w, MPI_Request *req,
                                 double deadline, char *msg, size_t cap)
{
    pdp_comm *c = &mc->head;
    double t0 = pdp__now(), now, since;
    long polls = 0;
    for (;;) {
        int flag = 0, rc = MPI_Test(req, &flag, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) {
            char e[256];
            pdp__mpi_errstr(rc, e, sizeof e);
            snprintf(msg, cap, "%s #%lld on comm '%s' (rank %d of %d): MPI_Test failed: %s",
                     w->head.op_name, (long long)w->head.seq, c->name, c->rank, c->size, e);
            return PDP_ERR_COMM;
        }
        if (flag) return PDP_OK;
        now = pdp__now();
        if (now > deadline) {
            snprintf(msg, cap, "%s #%lld (%lld elements) on comm '%s' did not complete within "
                     "%g s on rank %d of %d: at least one rank did not arrive (it skipped the "
                     "collective, issued another one, hangs or died; MPI cannot say which); "
                     "the communicator is broken", w->head.op_name, (long long)w->head.seq,
                     (long long)w->count, c->name, c->timeout_s, c->rank, c->size);
            return PDP_ERR_TIMEOUT;
        }
        if ((++polls & 63) == 0 && pdp__mpi_stopping(mc, &since) &&
            now > since + PDP__MPI_FREE_GRACE_S) {
            snprintf(msg, cap, "%s #%lld on comm '%s' (rank %d): abandoned in flight when the "
                     "communicator was freed", w->head.op_name, (long long)w->head.seq, c->name,
                     c->rank);
            return PDP_ERR_COMM;
        }
        if (polls < 256) continue;                 /* spin: small collectives finish here */
        if (now - t0 < 1e-3) {
            sched_yield();
        } else {
            struct timespec ts = {0, 50000};        /* 50 us */
            nanosleep(&ts, NULL);
        }
    }
}

/* Posts one MPI call; PDP_ERR_COMM with MPI's message when it fails. */
static pdp_status pdp__mpi_posted(pdp__mpi_comm *mc, pdp__mpi_work *w, int rc, const char *call,
                                  char *msg, size_t cap)
{
    char e[256];
    if (rc == MPI_SUCCESS) return PDP_OK;
    pdp__mpi_errstr(rc, e, sizeof e);
    snprintf(msg, cap, "%s #%lld on comm '%s' (rank %d of %d): %s failed: %s", w->head.op_name,
             (long long)w->head.seq, mc->head.name, mc->head.rank, mc->head.size, call, e);
    return PDP_ERR_COMM;
}

static void pdp__mpi_divide(float *p, int64_t n, int size)
{
    float div = (float)size;
    int64_t i;
    for (i = 0; i < n; i++) p[i] /= div;
}

/* Runs one collective to completion on the progress thread. */
static pdp_status pdp__mpi_run(pdp__mpi_comm *mc, pdp__mpi_work *w, MPI_Request *req, char *msg,
                               size_t cap)
{
    MPI_Comm mcomm = mc->mcomm;
    double deadline = w->head.t_start + mc->head.timeout_s;
    int size = mc->head.size, rank = mc->head.rank, n;
    int64_t off, len;
    pdp_status st;
    *req = MPI_REQUEST_NULL;
    switch (w->kind) {
    case PDP__MPI_ALLREDUCE:
    case PDP__MPI_BROADCAST:
    case PDP__MPI_BROADCAST_BYTES:
        for (off = 0; off < w->count; off += len) {
            len = PDP__MIN(w->count - off, (int64_t)PDP_MPI_CHUNK);
            n = (int)len;
            if (w->kind == PDP__MPI_ALLREDUCE)
                st = pdp__mpi_posted(mc, w, MPI_Iallreduce(MPI_IN_PLACE, w->buf + off, n,
                                     MPI_FLOAT, MPI_SUM, mcomm, req), "MPI_Iallreduce", msg, cap);
            else if (w->kind == PDP__MPI_BROADCAST)
                st = pdp__mpi_posted(mc, w, MPI_Ibcast(w->buf + off, n, MPI_FLOAT, w->root, mcomm,
                                     req), "MPI_Ibcast", msg, cap);
            else
                st = pdp__mpi_posted(mc, w, MPI_Ibcast((char *)w->bytes_buf + off, n, MPI_BYTE,
                                     w->root, mcomm, req), "MPI_Ibcast", msg, cap);
            if (st == PDP_OK) st = pdp__mpi_drive(mc, w, req, deadline, msg, cap);
            if (st != PDP_OK) return st;
        }
        if (w->kind == PDP__MPI_ALLREDUCE && w->op == PDP_REDUCE_AVG)
            pdp__mpi_divide(w->buf, w->count, size);
        return PDP_OK;
    case PDP__MPI_REDUCE_SCATTER: {
        float *mine = (float *)w->send + (int64_t)rank * w->count; /* in-place slot */
        bool in_place = w->recv == mine;
        n = (int)w->count;
        if (size == 1) {
            if (w->recv != w->send && n > 0) memmove(w->recv, w->send, (size_t)n * sizeof(float));
        } else {
            /* in place, MPI leaves the result at the start of the buffer */
            st = pdp__mpi_posted(mc, w, MPI_Ireduce_scatter_block(
                                     in_place ? MPI_IN_PLACE : (void *)w->send,
                                     in_place ? (void *)w->send : (void *)w->recv, n, MPI_FLOAT,
                                     MPI_SUM, mcomm, req),
                                 "MPI_Ireduce_scatter_block", msg, cap);
            if (st == PDP_OK) st = pdp__mpi_drive(mc, w, req, deadline, msg, cap);
            if (st != PDP_OK) return st;
            if (in_place && rank > 0) memmove(w->recv, w->send, (size_t)n * sizeof(float));
        }
        if (w->op == PDP_REDUCE_AVG) pdp__mpi_divide(w->recv, w->count, size);
        return PDP_OK;
    }
    case PDP__MPI_ALLGATHER: {
        bool in_place = w->send == w->recv + (int64_t)rank * w->count;
        n = (int)w->count;
        st = pdp__mpi_posted(mc, w, MPI_Iallgather(in_place ? MPI_IN_PLACE : (void *)w->send,
                             n, MPI_FLOAT, w->recv, n, MPI_FLOAT, mcomm, req),
                             "MPI_Iallgather", msg, cap);
        if (st == PDP_OK) st = pdp__mpi_drive(mc, w, req, deadline, msg, cap);
        return st;
    }
    case PDP__MPI_BARRIER:
        st = pdp__mpi_posted(mc, w, MPI_Ibarrier(mcomm, req), "MPI_Ibarrier", msg, cap);
        if (st == PDP_OK) st = pdp__mpi_drive(mc, w, req, deadline, msg, cap);
        return st;
    }
    snprintf(msg, cap, "comm_mpi: unknown collective kind %d", (int)w->kind);
    return PDP_ERR_STATE;
}

static void pdp__mpi_trace(pdp__mpi_comm *mc, const pdp__mpi_work *w, double t_start,
                           double t_done, pdp_status st)
{
    char args[88];
    if (!mc->trace_tid) return;
    snprintf(args, sizeof args, "\"seq\":%lld,\"count\":%lld,\"status\":%d",
             (long long)w->head.seq, (long long)w->count, (int)st);
    pdp__trace_complete(mc->head.rank, mc->trace_tid, "comm", w->head.op_name, t_start, t_done,
                        args);
    pdp__trace_async(mc->head.rank, mc->trace_tid, "comm", w->head.op_name,
                     ((uint64_t)(uintptr_t)mc << 20) ^ (uint64_t)w->head.seq, w->t_queued, t_done,
                     args);
}

static void *pdp__mpi_progress(void *arg)
{
    pdp__mpi_comm *mc = (pdp__mpi_comm *)arg;
    pthread_mutex_lock(&mc->mu);
    for (;;) {
        pdp__mpi_work *w;
        MPI_Request req;
        pdp_status st;
        double t_start, t_done;
        char msg[400];
        while (!mc->q_head && !mc->stopping) {
            if (mc->orphan) { /* keep a timed-out request moving: a late rank completes it */
                int flag = 0;
                struct timespec ts = {0, 1000000}; /* 1 ms */
                pthread_mutex_unlock(&mc->mu);
                nanosleep(&ts, NULL);
                if (MPI_Test(&mc->orphan_req, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) flag = 0;
                pthread_mutex_lock(&mc->mu);
                if (flag) mc->orphan = false;
            } else {
                pthread_cond_wait(&mc->wake, &mc->mu);
            }
        }
        if (!mc->q_head) break; /* stopping with nothing queued */
        w = mc->q_head;
        mc->q_head = w->next;
        if (!mc->q_head) mc->q_tail = NULL;
        t_start = w->head.t_start = pdp__now();
        if (mc->broken) {
            w->head.t_done = t_start;
            w->status = mc->broken_status;
            snprintf(w->msg, sizeof w->msg, "%s #%lld not run: %.300s", w->head.op_name,
                     (long long)w->head.seq, mc->broken_msg);
            w->done = true;
            pthread_cond_broadcast(&mc->done);
            continue;
        }
        pthread_mutex_unlock(&mc->mu);

        msg[0] = '\0';
        st = pdp__mpi_run(mc, w, &req, msg, sizeof msg);
        t_done = pdp__now();
        pdp__mpi_trace(mc, w, t_start, t_done, st);

        pthread_mutex_lock(&mc->mu);
        if (st != PDP_OK && req != MPI_REQUEST_NULL) { /* posted, never completed */
            mc->orphan = true;
            mc->orphan_req = req;
        }
        if (st != PDP_OK && !mc->broken) {
            mc->broken = true;
            mc->broken_status = st;
            snprintf(mc->broken_msg, sizeof mc->broken_msg, "%s", msg);
        }
        w->head.t_done = t_done;
        w->status = st;
        if (st != PDP_OK) snprintf(w->msg, sizeof w->msg, "%s", msg);
        w->done = true;
        pthread_cond_broadcast(&mc->done);
    }
    /* freeing: give a timed-out request a last chance to complete */
    while (mc->orphan && pdp__now() < mc->stop_time + PDP__MPI_FREE_GRACE_S) {
        int flag = 0;
        struct timespec ts = {0, 1000000};
        pthread_mutex_unlock(&mc->mu);
        nanosleep(&ts, NULL);
        if (MPI_Test(&mc->orphan_req, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) flag = 0;
        pthread_mutex_lock(&mc->mu);
        if (flag) mc->orphan = false;
    }
    pthread_mutex_unlock(&mc->mu);
    return NULL;
}

/* ---- comm_mpi: the ops table ---- */

static pdp_status pdp__mpi_submit(pdp_comm *c, pdp__mpi_work *args, pdp_work **out)
{
    pdp__mpi_comm *mc = (pdp__mpi_comm *)c;
    pdp__mpi_work *w;
    pthread_mutex_lock(&mc->mu);
    if (mc->broken) {
        pdp_status st = mc->broken_status;
        pdp__err(st, "%s on comm '%s' (rank %d of %d): the communicator is broken: %s",
                 pdp__mpi_kind_names[args->kind], c->name, c->rank, c->size, mc->broken_msg);
        pthread_mutex_unlock(&mc->mu);
        return st;
    }
    w = mc->free_list;
    if (!w) {
        pthread_mutex_unlock(&mc->mu);
        return pdp__err(PDP_ERR_STATE, "%d collectives in flight on comm '%s' (rank %d): wait for "
                        "some (PDP_MPI_MAX_INFLIGHT)", PDP_MPI_MAX_INFLIGHT, c->name, c->rank);
    }
    mc->free_list = w->next;
    w->next = NULL;
    w->kind = args->kind;
    w->op = args->op;
    w->root = args->root;
    w->buf = args->buf;
    w->send = args->send;
    w->recv = args->recv;
    w->bytes_buf = args->bytes_buf;
    w->count = args->count;
    w->head.comm = c;
    w->head.op_name = pdp__mpi_kind_names[args->kind];
    w->head.seq = mc->next_seq++;
    w->head.t_start = w->head.t_done = 0.0;
    w->t_queued = pdp__now();
    w->done = false;
    w->status = PDP_OK;
    w->msg[0] = '\0';
    if (mc->q_tail) mc->q_tail->next = w;
    else mc->q_head = w;
    mc->q_tail = w;
    pthread_cond_signal(&mc->wake);
    pthread_mutex_unlock(&mc->mu);
    *out = &w->head;
    return PDP_OK;
}

static pdp_status pdp__mpi_int_count(const pdp_comm *c, int64_t count, const char *what)
{
    if (count <= INT32_MAX) return PDP_OK;
    return pdp__err(PDP_ERR_UNSUPPORTED, "%s of %lld elements per rank on comm '%s' (rank %d): the "
                    "MPI backend takes at most %d (MPI counts are int)", what, (long long)count,
                    c->name, c->rank, (int)INT32_MAX);
}

static pdp_status pdp__mpi_allreduce(pdp_comm *c, float *buf, int64_t count, pdp_reduce_op op,
                                     pdp_work **w)
{
    pdp__mpi_work a;
    memset(&a, 0, sizeof a);
    a.kind = PDP__MPI_ALLREDUCE;
    a.count = count;
    a.op = op;
    a.buf = buf;
    return pdp__mpi_submit(c, &a, w);
}

static pdp_status pdp__mpi_broadcast(pdp_comm *c, float *buf, int64_t count, int root, pdp_work **w)
{
    pdp__mpi_work a;
    memset(&a, 0, sizeof a);
    a.kind = PDP__MPI_BROADCAST;
    a.count = count;
    a.root = root;
    a.buf = buf;
    return pdp__mpi_submit(c, &a, w);
}

static pdp_status pdp__mpi_reduce_scatter(pdp_comm *c, const float *send, float *recv,
                                          int64_t recv_count, pdp_reduce_op op, pdp_work **w)
{
    pdp__mpi_work a;
    pdp_status st;
    if ((st = pdp__mpi_int_count(c, recv_count, "reduce_scatter")) != PDP_OK) return st;
    memset(&a, 0, sizeof a);
    a.kind = PDP__MPI_REDUCE_SCATTER;
    a.count = recv_count;
    a.op = op;
    a.send = send;
    a.recv = recv;
    return pdp__mpi_submit(c, &a, w);
}

static pdp_status pdp__mpi_allgather(pdp_comm *c, const float *send, float *recv,
                                     int64_t send_count, pdp_work **w)
{
    pdp__mpi_work a;
    pdp_status st;
    if ((st = pdp__mpi_int_count(c, send_count, "allgather")) != PDP_OK) return st;
    memset(&a, 0, sizeof a);
    a.kind = PDP__MPI_ALLGATHER;
    a.count = send_count;
    a.send = send;
    a.recv = recv;
    return pdp__mpi_submit(c, &a, w);
}

static pdp_status pdp__mpi_barrier(pdp_comm *c, pdp_work **w)
{
    pdp__mpi_work a;
    memset(&a, 0, sizeof a);
    a.kind = PDP__MPI_BARRIER;
    return pdp__mpi_submit(c, &a, w);
}

static pdp_status pdp__mpi_wait(pdp_work *work)
{
    pdp__mpi_work *w = (pdp__mpi_work *)work;
    pdp__mpi_comm *mc = (pdp__mpi_comm *)work->comm;
    pdp_status st;
    pthread_mutex_lock(&mc->mu);
    while (!w->done) pthread_cond_wait(&mc->done, &mc->mu); /* the progress thread times out */
    st = w->status;
    if (st != PDP_OK) pdp__err(st, "%s", w->msg);
    w->next = mc->free_list; /* recycled; the head stays readable until the next launch */
    mc->free_list = w;
    pthread_mutex_unlock(&mc->mu);
    return st;
}

static bool pdp__mpi_done(pdp_work *work)
{
    pdp__mpi_work *w = (pdp__mpi_work *)work;
    pdp__mpi_comm *mc = (pdp__mpi_comm *)work->comm;
    bool d;
    pthread_mutex_lock(&mc->mu);
    d = w->done;
    pthread_mutex_unlock(&mc->mu);
    return d;
}

/* Synchronous, queued like the others so it keeps its place in the order. */
static pdp_status pdp__mpi_broadcast_bytes(pdp_comm *c, void *buf, size_t bytes, int root)
{
    pdp__mpi_work a;
    pdp_work *w = NULL;
    pdp_status st;
    memset(&a, 0, sizeof a);
    a.kind = PDP__MPI_BROADCAST_BYTES;
    a.count = (int64_t)bytes;
    a.root = root;
    a.bytes_buf = buf;
    if ((st = pdp__mpi_submit(c, &a, &w)) != PDP_OK) return st;
    return pdp__mpi_wait(w);
}

/* Tests *req until it completes (true) or deadline passes (false). */
static bool pdp__mpi_poll_until(MPI_Request *req, double deadline)
{
    for (;;) {
        int flag = 0;
        struct timespec ts = {0, 100000}; /* 100 us: creation and shutdown only */
        if (MPI_Test(req, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) return false;
        if (flag) return true;
        if (pdp__now() > deadline) return false;
        nanosleep(&ts, NULL);
    }
}

/* Drops one reference to MPI; the last one finalises it if pdp initialised it
   (after completing a timed-out duplication, if its late rank came after all). */
static void pdp__mpi_release(void)
{
    pthread_mutex_lock(&pdp__mpi_mu);
    if (--pdp__mpi_live == 0 && pdp__mpi_init_orphan) {
        if (pdp__mpi_poll_until(&pdp__mpi_init_req, pdp__now() + PDP__MPI_FREE_GRACE_S)) {
            MPI_Comm_free(&pdp__mpi_init_comm);
            pdp__mpi_init_orphan = false;
        } else {
            pdp__mpi_unclean = true;
        }
    }
    if (pdp__mpi_live == 0 && pdp__mpi_we_init && !pdp__mpi_unclean) {
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (!finalized) MPI_Finalize();
        pdp__mpi_we_init = false;
    }
    pthread_mutex_unlock(&pdp__mpi_mu);
}

static void pdp__mpi_destroy(pdp_comm *c)
{
    pdp__mpi_comm *mc = (pdp__mpi_comm *)c;
    bool leaked;
    pthread_mutex_lock(&mc->mu);
    mc->stopping = true;
    mc->stop_time = pdp__now();
    pthread_cond_signal(&mc->wake);
    pthread_mutex_unlock(&mc->mu);
    pthread_join(mc->thread, NULL);
    leaked = mc->orphan;
    if (leaked) { /* a request that never completed still references mcomm: leave both */
        pthread_mutex_lock(&pdp__mpi_mu);
        pdp__mpi_unclean = true;
        pthread_mutex_unlock(&pdp__mpi_mu);
    } else {
        MPI_Comm_free(&mc->mcomm);
    }
    if (mc->traced) pdp__trace_close();
    pthread_mutex_destroy(&mc->mu);
    pthread_cond_destroy(&mc->wake);
    pthread_cond_destroy(&mc->done);
    pdp__dealloc(mc);
    pdp__mpi_release();
}

static const pdp__comm_ops pdp__mpi_ops = {
    pdp__mpi_allreduce, pdp__mpi_broadcast, pdp__mpi_reduce_scatter,
    pdp__mpi_allgather, pdp__mpi_barrier,   pdp__mpi_broadcast_bytes,
    pdp__mpi_wait,      pdp__mpi_done,      pdp__mpi_destroy,
};

/* ---- comm_mpi: creation ---- */

/* Initialises MPI when nobody has and takes one reference to it. */
static pdp_status pdp__mpi_acquire(const char *fn)
{
    int inited = 0, finalized = 0, provided = 0, rc;
    pdp_status st = PDP_OK;
    pthread_mutex_lock(&pdp__mpi_mu);
    MPI_Finalized(&finalized);
    if (finalized) {
        st = pdp__err(PDP_ERR_STATE, "%s: MPI is already finalized and cannot start again (pdp "
                      "finalises MPI with the last communicator when it initialised MPI itself; "
                      "to create MPI communicators one after another call MPI_Init_thread "
                      "before the first and MPI_Finalize after the last)", fn);
        goto out;
    }
    MPI_Initialized(&inited);
    if (!inited) {
        rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
        if (rc != MPI_SUCCESS) {
            char e[256];
            pdp__mpi_errstr(rc, e, sizeof e);
            st = pdp__err(PDP_ERR_COMM, "%s: MPI_Init_thread failed: %s", fn, e);
            goto out;
        }
        pdp__mpi_we_init = true;
    } else {
        MPI_Query_thread(&provided);
    }
    if (provided < MPI_THREAD_MULTIPLE) {
        st = pdp__err(PDP_ERR_UNSUPPORTED, "%s: MPI provides thread level %d, but the progress "
                      "thread of the MPI backend needs MPI_THREAD_MULTIPLE (%d): initialise MPI "
                      "with MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...) and use an MPI built "
                      "with thread support", fn, provided, MPI_THREAD_MULTIPLE);
        if (pdp__mpi_we_init && pdp__mpi_live == 0) {
            MPI_Finalize();
            pdp__mpi_we_init = false;
        }
        goto out;
    }
    pdp__mpi_live++;
out:
    pthread_mutex_unlock(&pdp__mpi_mu);
    return st;
}

static pdp_status pdp__mpi_create(pdp_comm **out, const pdp_comm_desc *desc, const char *fn)
{
    pdp__mpi_comm *mc;
    MPI_Comm mcomm = MPI_COMM_NULL;
    MPI_Request req = MPI_REQUEST_NULL;
    int rank = 0, size = 1, rc, i;
    double timeout_s = desc && desc->timeout_s > 0 ? desc->timeout_s : 300.0;
    pdp_status st;
    if (desc && desc->device.kind != PDP_DEVICE_CPU)
        return pdp__err(PDP_ERR_UNSUPPORTED, "%s: the MPI backend moves CPU buffers; device "
                        "CUDA %d needs PDP_BACKEND_NCCL", fn, desc->device.ordinal);
    if (desc && desc->timeout_s < 0)
        return pdp__err(PDP_ERR_INVALID, "%s: timeout_s %g < 0", fn, desc->timeout_s);
    if ((st = pdp__mpi_acquire(fn)) != PDP_OK) return st;
    pthread_mutex_lock(&pdp__mpi_mu);
    if (pdp__mpi_init_orphan && pdp__mpi_poll_until(&pdp__mpi_init_req, 0.0)) {
        MPI_Comm_free(&pdp__mpi_init_comm); /* an earlier timed-out duplication completed */
        pdp__mpi_init_orphan = false;
    }
    pthread_mutex_unlock(&pdp__mpi_mu);
    rc = MPI_Comm_idup(MPI_COMM_WORLD, &mcomm, &req);
    if (rc == MPI_SUCCESS && !pdp__mpi_poll_until(&req, pdp__now() + timeout_s)) {
        int world_rank = -1;
        MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
        pthread_mutex_lock(&pdp__mpi_mu);
        if (pdp__mpi_init_orphan) {
            pdp__mpi_unclean = true; /* a second orphan: no slot to keep it */
        } else {
            pdp__mpi_init_orphan = true;
            pdp__mpi_init_req = req;
            pdp__mpi_init_comm = mcomm;
        }
        pthread_mutex_unlock(&pdp__mpi_mu);
        pdp__mpi_release();
        return pdp__err(PDP_ERR_TIMEOUT, "%s: rank %d: duplicating MPI_COMM_WORLD did not "
                        "complete within %g s: at least one rank did not call "
                        "pdp_comm_init_env (or called it in another order)", fn, world_rank,
                        timeout_s);
    }
    if (rc == MPI_SUCCESS) rc = MPI_Comm_set_errhandler(mcomm, MPI_ERRORS_RETURN);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(mcomm, &rank);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_size(mcomm, &size);
    if (rc != MPI_SUCCESS) {
        char e[256];
        pdp__mpi_errstr(rc, e, sizeof e);
        if (mcomm != MPI_COMM_NULL) MPI_Comm_free(&mcomm);
        pdp__mpi_release();
        return pdp__err(PDP_ERR_COMM, "%s: duplicating MPI_COMM_WORLD failed: %s", fn, e);
    }
    mc = (pdp__mpi_comm *)pdp__calloc(sizeof *mc);
    if (!mc) {
        MPI_Comm_free(&mcomm);
        pdp__mpi_release();
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory for the MPI communicator (rank %d)",
                        fn, rank);
    }
    mc->head.ops = &pdp__mpi_ops;
    mc->head.backend = PDP_BACKEND_MPI;
    mc->head.rank = rank;
    mc->head.size = size;
    mc->head.timeout_s = timeout_s;
    mc->head.device = pdp_cpu();
    snprintf(mc->head.name, sizeof mc->head.name, "%s", desc && desc->name ? desc->name : "comm");
    mc->head.impl = mc;
    mc->mcomm = mcomm;
    for (i = PDP_MPI_MAX_INFLIGHT - 1; i >= 0; i--) {
        mc->pool[i].next = mc->free_list;
        mc->free_list = &mc->pool[i];
    }
    if ((st = pdp__trace_open(size > 1 ? rank : -1)) != PDP_OK) {
        st = pdp__err_wrap(st, "%s (rank %d)", fn, rank);
        goto fail;
    }
    mc->traced = true;
    if (pdp__trace_enabled()) {
        char track[48];
        snprintf(track, sizeof track, "comm %s (mpi)", mc->head.name);
        mc->trace_tid = pdp__trace_track(rank, track);
    }
    pthread_mutex_init(&mc->mu, NULL);
    pthread_cond_init(&mc->wake, NULL);
    pthread_cond_init(&mc->done, NULL);
    if (pthread_create(&mc->thread, NULL, pdp__mpi_progress, mc) != 0) {
        pthread_mutex_destroy(&mc->mu);
        pthread_cond_destroy(&mc->wake);
        pthread_cond_destroy(&mc->done);
        st = pdp__err(PDP_ERR_WORKER, "%s: cannot start the progress thread of rank %d", fn, rank);
        goto fail;
    }
    *out = &mc->head;
    return PDP_OK;
fail:
    if (mc->traced) pdp__trace_close();
    pdp__dealloc(mc);
    MPI_Comm_free(&mcomm);
    pdp__mpi_release();
    return st;
}
#endif /* PDP_MPI */

/* ---- comm_mpi: pdp_comm_init_env ---- */

PDP_API pdp_status pdp_comm_init_env(pdp_comm **out, const pdp_comm_desc *desc)
{
    static const char *fn = "pdp_comm_init_env";
    pdp_backend b = desc ? desc->backend : PDP_BACKEND_DEFAULT;
    if (!out) return pdp__err(PDP_ERR_INVALID, "%s: out is NULL", fn);
    *out = NULL;
    switch (b) {
    case PDP_BACKEND_MPI:
#ifdef PDP_MPI
        return pdp__mpi_create(out, desc, fn);
#else
        return pdp__err(PDP_ERR_UNSUPPORTED, "%s: backend MPI: built without PDP_MPI (compile "
                        "with -DPDP_MPI using mpicc, and run under mpirun)", fn);
#endif
    case PDP_BACKEND_NCCL:
        return pdp__comm_init_nccl_env(out, desc);
    case PDP_BACKEND_DEFAULT:
    case PDP_BACKEND_LOCAL:
        return pdp__err(PDP_ERR_INVALID, "%s: backend %s: the local backend's ranks are threads "
                        "of one process and have no environment to read; create them with "
                        "pdp_local_group_create and pdp_comm_create_local (or set desc.backend "
                        "to PDP_BACKEND_MPI or PDP_BACKEND_NCCL)", fn,
                        b == PDP_BACKEND_LOCAL ? "LOCAL" : "DEFAULT (local)");
    }
    return pdp__err(PDP_ERR_INVALID, "%s: unknown backend %d", fn, (int)b);
}
