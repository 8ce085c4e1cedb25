/* comm_mpi: the MPI communicator backend (-DPDP_MPI), and its entry in comm.c's
   dispatcher, pdp__comm_init_mpi_env: pdp_comm_init_env with PDP_BACKEND_MPI
   creates the communicator below; without PDP_MPI it fails with
   PDP_ERR_UNSUPPORTED naming the macro.

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
   as PyTorch's ProcessGroupMPI does (comm_queue.c's collective queue, shared with
   the local backend; this file supplies its exec, idle and destroy): a launch
   only queues a handle from a fixed pool (PDP_MPI_MAX_INFLIGHT, nothing is
   allocated per collective) and returns, so the calling rank keeps computing
   backward while the all-reduce runs. The thread posts the non-blocking call (MPI_Iallreduce,
   MPI_Ibcast, MPI_Ireduce_scatter_block, MPI_Iallgather, MPI_Ibarrier) and drives it with MPI_Test:
   spinning for a few hundred polls (small collectives finish there), then, while the rank's own
   thread is blocked in pdp_wait and its core is idle, yielding between polls for up to 2 ms;
   otherwise (the rank computes, or a peer is late) sleeping 200 us between polls (500 us once a
   collective has waited 20 ms), so that backward keeps its core and the poll latency hides under
   it. AVG is SUM followed by a division by the size on every element, as the local backend does.
   16-bit elements (pdp_comm_allreduce_ex and reduce_scatter_ex with BF16 or F16) travel as
   MPI_UINT16_T and are summed by one of two user-defined MPI_Ops created with the communicator
   (comm.h states their rounding). MPI counts are int: an all-reduce or broadcast is split into
   calls of PDP_MPI_CHUNK elements; reduce-scatter, all-gather and the messages take at most INT_MAX
   elements per rank (comm.c refuses more, naming the call and the count). In-place forms:
   all-gather with send == recv + rank * count, and reduce-scatter with recv == send + rank * count
   (NCCL's convention).

   Timeouts: MPI cannot time out, so the progress thread is the watchdog. A
   collective that has not completed timeout_s after the thread posted it fails
   with PDP_ERR_TIMEOUT naming the collective, its sequence number and the
   communicator (MPI cannot say which rank is missing). The communicator is
   then broken (the queue is sticky): queued and later collectives fail at
   once with the same status and message, as an aborted NCCL communicator
   does. The timed-out request
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

   Locks: the queue's mu guards the queue, the pool, the handles' done/status,
   the broken state and the orphan; the progress thread never holds it inside
   an MPI call.
   Buffers pass to the progress thread and back across that mutex (TSan finds
   nothing in this file; OpenMPI's own internals draw reports of their own).
   Reference: MPI 3.1, chapter 5.12 (non-blocking collectives). */

#include "internal.h"

#ifdef PDP_MPI
#include <mpi.h>

#ifndef PDP_MPI_MAX_INFLIGHT
#  define PDP_MPI_MAX_INFLIGHT 256 /* handles per MPI communicator */
#endif
#ifndef PDP_MPI_CHUNK
#  define PDP_MPI_CHUNK (1 << 30)  /* elements per MPI call of an all-reduce or broadcast */
#endif
#define PDP__MPI_FREE_GRACE_S 1.0  /* pdp_comm_free waits this long for an in-flight request */

/* ---- comm_mpi: process-wide MPI ownership ---- */

static pdp__mutex pdp__mpi_mu = PDP__MUTEX_INIT;
static int pdp__mpi_live;          /* MPI communicators alive */
static bool pdp__mpi_we_init;      /* pdp called MPI_Init_thread, so it finalises */
static bool pdp__mpi_unclean;      /* a request was abandoned: never call MPI_Finalize */
static bool pdp__mpi_init_orphan;  /* a timed-out MPI_Comm_idup, completed before finalising */
static MPI_Request pdp__mpi_init_req;
static MPI_Comm pdp__mpi_init_comm;

/* ---- comm_mpi: state ---- */

/* A message in flight: its MPI request (and, for a receive, whether MPI has matched it). */
typedef struct pdp__mpi_p2p {
    bool active;        /* launched, not completed */
    bool posted;        /* a send: always; a receive: matched by MPI_Improbe, MPI_Imrecv posted */
    double cancel_by;   /* 0; once cancelled, when the cancel grace ends */
    MPI_Request req;
} pdp__mpi_p2p;

typedef struct pdp__mpi_comm {
    pdp_comm head;               /* first member */
    pdp__workq q;                /* head.impl points here; sticky, with an idle poll */
    MPI_Comm mcomm;              /* our duplicate of MPI_COMM_WORLD */
    MPI_Op op16[2];              /* the 16-bit sums (BF16, F16) over MPI_UINT16_T; MPI_OP_NULL
                                    until created */
    bool orphan;                 /* a timed-out request is still pending (q.mu) */
    MPI_Request orphan_req;
    bool traced;                 /* pdp__trace_open succeeded: close at free */
    pdp__mutex p2p_mu;      /* guards p2p[] and every MPI call on its requests */
    int p2p_active;              /* messages in flight */
    int n_abandoned;             /* timed-out requests MPI did not cancel (p2p_mu) */
    MPI_Request abandoned[PDP_MPI_MAX_INFLIGHT];
    pdp__workq_item pool[PDP_MPI_MAX_INFLIGHT];
    pdp__mpi_p2p p2p[PDP_MPI_MAX_INFLIGHT]; /* by pool index */
} pdp__mpi_comm;

/* ---- comm_mpi: executing a collective (the queue's exec and idle) ---- */

PDP__PRIVATE void pdp__mpi_errstr(int rc, char *out, size_t cap)
{
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, s, &len) != MPI_SUCCESS) len = 0;
    s[len < MPI_MAX_ERROR_STRING ? len : MPI_MAX_ERROR_STRING - 1] = '\0';
    snprintf(out, cap, "%s (MPI error %d)", len ? s : "unknown", rc);
}

/* ---- comm_mpi: point-to-point ----
   A send is MPI_Issend, a synchronous send: it completes only once the receiver has
   matched it, so a send nobody receives (or received with another tag) fails with
   PDP_ERR_TIMEOUT, as on the local and NCCL backends (MPI_Isend would complete at once
   for a message under MPI's eager limit, the receiver never known; the handshake costs
   nothing measurable: on 2 ranks sharing 2 AMD EPYC (Zen 4) cores, OpenMPI 4.1.4, a pdp
   round trip of 1, 1024 or 65536 floats took 181, 176 and 217 us with it, 282, 182 and
   221 us with MPI_Isend, medians of 3 alternating runs, the polls' naps dominating). A receive is
   matched with MPI_Improbe first, so that a count mismatch names both counts (the
   message is then consumed with a zero-count MPI_Mrecv), then MPI_Imrecv. Every
   pending message of the communicator is advanced by whoever polls: a thread in
   pdp_work_wait or pdp_work_done on a message, and the progress thread while it
   drives a collective or idles, so a ring where every rank sends first completes.
   A message not complete timeout_s after its launch fails with PDP_ERR_TIMEOUT naming
   peer and tag: an unmatched receive is simply withdrawn; a send or a matched receive
   is cancelled (MPI_Cancel) at the first poll past its deadline and completes at a
   later poll, when MPI confirms the cancel, or when the cancel grace
   (PDP__MPI_FREE_GRACE_S) has passed: then it is abandoned. No one holds p2p_mu
   through a grace, so the graces of messages that expire together overlap (a pipeline
   whose peer died gets every error at about timeout_s + the grace, not one grace after
   another). OpenMPI never cancels a send: its timed-out sends are always abandoned. An
   abandoned request is kept (abandoned[]) and tested at each poll and at
   pdp_comm_free: if the peer receives it later it completes, and the communicator is
   freed cleanly; if it is still pending at the free, pdp never calls MPI_Finalize, as
   for a timed-out collective. */

PDP__PRIVATE void pdp__mpi_p2p_fail(pdp__mpi_comm *mc, pdp__workq_item *w, pdp_status st,
                                    const char *msg)
{
    mc->p2p[w - mc->pool].active = false;
    mc->p2p_active--;
    pdp__workq_finish(&mc->q, w, st, msg);
}

/* Keeps a request MPI would not cancel, to test later (p2p_mu held). */
PDP__PRIVATE void pdp__mpi_abandon(pdp__mpi_comm *mc, MPI_Request *req)
{
    if (mc->n_abandoned < PDP_MPI_MAX_INFLIGHT) {
        mc->abandoned[mc->n_abandoned++] = *req;
        return;
    }
    MPI_Request_free(req); /* no room: MPI may still need it, so never finalise */
    pdp__mutex_lock(&pdp__mpi_mu);
    pdp__mpi_unclean = true;
    pdp__mutex_unlock(&pdp__mpi_mu);
}

/* Advances one message at time now (p2p_mu held): matches, completes, or expires it. */
PDP__PRIVATE void pdp__mpi_p2p_step(pdp__mpi_comm *mc, pdp__workq_item *w, double now)
{
    pdp__mpi_p2p *p = &mc->p2p[w - mc->pool];
    const pdp__coll_args *a = &w->args;
    char msg[PDP__MSG_CAP], what[200], e[256];
    bool late = now > w->head.t_start + mc->head.timeout_s;
    int flag = 0, rc, n = 0, cancelled = 0;
    MPI_Status status;
    if (!p->posted) { /* an unmatched receive */
        MPI_Message m;
        rc = MPI_Improbe(a->peer, a->tag, mc->mcomm, &flag, &m, &status);
        if (rc == MPI_SUCCESS && !flag) {
            if (!late) return;
            pdp__workq_p2p_timeout_msg(w, msg, sizeof msg); /* withdrawn: nothing posted */
            pdp__mpi_p2p_fail(mc, w, PDP_ERR_TIMEOUT, msg);
            return;
        }
        if (rc == MPI_SUCCESS) rc = MPI_Get_count(&status, MPI_FLOAT, &n);
        if (rc == MPI_SUCCESS && (int64_t)n != a->count) {
            MPI_Mrecv(NULL, 0, MPI_FLOAT, &m, MPI_STATUS_IGNORE); /* consume: MPI_ERR_TRUNCATE */
            pdp__p2p_describe(w, what, sizeof what);
            snprintf(msg, sizeof msg, "%s: count mismatch: rank %d sends %d floats, rank %d "
                     "receives %lld", what, a->peer, n, mc->head.rank, (long long)a->count);
            pdp__mpi_p2p_fail(mc, w, PDP_ERR_INVALID, msg);
            return;
        }
        if (rc == MPI_SUCCESS) rc = MPI_Imrecv(a->recv, (int)a->count, MPI_FLOAT, &m, &p->req);
        if (rc != MPI_SUCCESS) goto mpi_error;
        p->posted = true;
    }
    if (late && p->cancel_by == 0.0) { /* start the grace; MPI completes a cancelled request */
        MPI_Cancel(&p->req);
        p->cancel_by = now + PDP__MPI_FREE_GRACE_S;
    }
    rc = MPI_Test(&p->req, &flag, &status);
    if (rc != MPI_SUCCESS) goto mpi_error;
    if (!flag && (p->cancel_by == 0.0 || now < p->cancel_by)) return;
    if (flag && p->cancel_by != 0.0) MPI_Test_cancelled(&status, &cancelled);
    if (!flag || cancelled) {
        size_t len;
        pdp__workq_p2p_timeout_msg(w, msg, sizeof msg);
        if (!flag) { /* MPI did not confirm the cancel within the grace */
            pdp__mpi_abandon(mc, &p->req);
            len = strlen(msg);
            if (a->kind == PDP__COLL_SEND)
                snprintf(msg + len, sizeof msg - len, "; MPI could not cancel the send within "
                         "%g s: abandoned, rank %d may still receive it", PDP__MPI_FREE_GRACE_S,
                         a->peer);
            else
                snprintf(msg + len, sizeof msg - len, "; MPI could not cancel the matched "
                         "receive within %g s: abandoned, MPI may still write its buffer",
                         PDP__MPI_FREE_GRACE_S);
        }
        pdp__mpi_p2p_fail(mc, w, PDP_ERR_TIMEOUT, msg);
        return;
    }
    p->active = false; /* complete (also when it matched during the grace: it was delivered) */
    mc->p2p_active--;
    pdp__workq_finish(&mc->q, w, PDP_OK, "");
    return;
mpi_error:
    pdp__mpi_errstr(rc, e, sizeof e);
    pdp__p2p_describe(w, what, sizeof what);
    snprintf(msg, sizeof msg, "%s: %s", what, e);
    pdp__mpi_p2p_fail(mc, w, PDP_ERR_COMM, msg);
}

/* The queue's p2p_poll: every pending message, and the abandoned requests. */
PDP__PRIVATE void pdp__mpi_p2p_poll(pdp__workq *q)
{
    pdp__mpi_comm *mc = (pdp__mpi_comm *)q->comm;
    double now = pdp__now();
    int i;
    pdp__mutex_lock(&mc->p2p_mu);
    for (i = 0; i < PDP_MPI_MAX_INFLIGHT && mc->p2p_active; i++)
        if (mc->p2p[i].active) pdp__mpi_p2p_step(mc, &mc->pool[i], now);
    for (i = mc->n_abandoned - 1; i >= 0; i--) {
        int flag = 0;
        if (MPI_Test(&mc->abandoned[i], &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && flag)
            mc->abandoned[i] = mc->abandoned[--mc->n_abandoned];
    }
    pdp__mutex_unlock(&mc->p2p_mu);
}

/* The queue's p2p_expire: a poll past w's deadline cancels it (and every other overdue
   message); w completes at this or a later poll, within the cancel grace. */
PDP__PRIVATE void pdp__mpi_p2p_expire(pdp__workq *q, pdp__workq_item *w)
{
    (void)w;
    pdp__mpi_p2p_poll(q);
}

PDP__PRIVATE pdp_status pdp__mpi_p2p_launch(pdp_comm *c, pdp__coll_kind kind, float *buf,
                                            int64_t count, int peer, int tag, pdp_work **out)
{
    pdp__mpi_comm *mc = (pdp__mpi_comm *)c;
    pdp__coll_args a;
    pdp__workq_item *w = NULL;
    pdp__mpi_p2p *p;
    pdp_status st;
    int rc = MPI_SUCCESS;
    PDP_ASSERT(count <= INT32_MAX); /* comm.c's bound (pdp__comm_count_max) */
    memset(&a, 0, sizeof a);
    a.kind = kind;
    a.count = count;
    a.peer = peer;
    a.tag = tag;
    if (kind == PDP__COLL_SEND) a.send = buf;
    else a.recv = buf;
    if ((st = pdp__workq_take(c, &a, &w)) != PDP_OK) return st;
    p = &mc->p2p[w - mc->pool];
    pdp__mutex_lock(&mc->p2p_mu);
    p->posted = kind == PDP__COLL_SEND;
    p->cancel_by = 0.0;
    if (kind == PDP__COLL_SEND) /* synchronous: complete once received (see above) */
        rc = MPI_Issend(buf, (int)count, MPI_FLOAT, peer, tag, mc->mcomm, &p->req);
    if (rc == MPI_SUCCESS) {
        p->active = true;
        mc->p2p_active++;
        pdp__mpi_p2p_step(mc, w, w->head.t_start); /* a receive whose message is here matches */
    }
    pdp__mutex_unlock(&mc->p2p_mu);
    if (rc != MPI_SUCCESS) {
        char e[256];
        pdp__mpi_errstr(rc, e, sizeof e);
        pdp__workq_untake(&mc->q, w);
        return pdp__err(PDP_ERR_COMM, "send to rank %d with tag %d on comm '%s' (rank %d): "
                        "MPI_Issend failed: %s", peer, tag, c->name, c->rank, e);
    }
    *out = &w->head;
    return PDP_OK;
}

PDP__PRIVATE pdp_status pdp__mpi_send(pdp_comm *c, const float *buf, int64_t count, int peer,
                                      int tag, pdp_work **w)
{
    return pdp__mpi_p2p_launch(c, PDP__COLL_SEND, (float *)buf, count, peer, tag, w);
}

PDP__PRIVATE pdp_status pdp__mpi_recv(pdp_comm *c, float *buf, int64_t count, int peer, int tag,
                                      pdp_work **w)
{
    return pdp__mpi_p2p_launch(c, PDP__COLL_RECV, buf, count, peer, tag, w);
}

/* Drives *req to completion: PDP_OK; PDP_ERR_TIMEOUT after deadline, or
   PDP_ERR_COMM when the communicator is being freed, with *req left pending
   (the caller records it as the orphan). */
PDP__PRIVATE pdp_status pdp__mpi_drive(pdp__mpi_comm *mc, const pdp__workq_item *w,
                                       MPI_Request *req, double deadline, char *msg, size_t cap)
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
                     (long long)w->args.count, c->name, c->timeout_s, c->rank, c->size);
            return PDP_ERR_TIMEOUT;
        }
        if ((++polls & 63) == 0 && pdp__workq_stopping(&mc->q, &since) &&
            now > since + PDP__MPI_FREE_GRACE_S) {
            snprintf(msg, cap, "%s #%lld on comm '%s' (rank %d): abandoned in flight when the "
                     "communicator was freed", w->head.op_name, (long long)w->head.seq, c->name,
                     c->rank);
            return PDP_ERR_COMM;
        }
        if ((polls & 63) == 0) pdp__mpi_p2p_poll(&mc->q);
        if (polls < 256) continue; /* spin: small collectives finish here */
        /* then yield while the rank waits (for 2 ms: its core is ours); otherwise nap
           200 us (500 us once a peer has kept us 20 ms), since a yielding poller would
           take a share of a core from backward or from whatever keeps the peer busy */
        if (!pdp__workq_nap(&mc->q, now - t0 < 20e-3 ? 200e-6 : 500e-6, now - t0 < 2e-3))
            pdp__yield();
    }
}

/* Posts one MPI call; PDP_ERR_COMM with MPI's message when it fails. */
PDP__PRIVATE pdp_status pdp__mpi_posted(pdp__mpi_comm *mc, const pdp__workq_item *w, int rc,
                                        const char *call, char *msg, size_t cap)
{
    char e[256];
    if (rc == MPI_SUCCESS) return PDP_OK;
    pdp__mpi_errstr(rc, e, sizeof e);
    snprintf(msg, cap, "%s #%lld on comm '%s' (rank %d of %d): %s failed: %s", w->head.op_name,
             (long long)w->head.seq, mc->head.name, mc->head.rank, mc->head.size, call, e);
    return PDP_ERR_COMM;
}

PDP__PRIVATE void pdp__mpi_divide(void *buf, int64_t n, int size, int dt)
{
    float div = (float)size;
    if (dt == PDP_DTYPE_F32) {
        float *PDP__RESTRICT p = (float *)buf;
        PDP__FOR_BLOCKED(i, n, p[i] /= div;);
    } else {
        uint16_t *h = (uint16_t *)buf;
        int64_t i;
        for (i = 0; i < n; i++) h[i] = pdp__dt16_bits(dt, pdp__dt16_float(dt, h[i]) / div);
    }
}

/* The 16-bit sums, MPI user functions over MPI_UINT16_T: both values widened, added in
   fp32 and rounded once to nearest even (commutative, so MPI may combine in any order). */
PDP__PRIVATE void pdp__mpi_sum16(const uint16_t *in, uint16_t *inout, int len, int dt)
{
    int i;
    for (i = 0; i < len; i++)
        inout[i] = pdp__dt16_bits(dt, pdp__dt16_float(dt, in[i]) + pdp__dt16_float(dt, inout[i]));
}
PDP__PRIVATE void pdp__mpi_sum_bf16(void *in, void *inout, int *len, MPI_Datatype *type)
{
    (void)type;
    pdp__mpi_sum16((const uint16_t *)in, (uint16_t *)inout, *len, PDP_DTYPE_BF16);
}
PDP__PRIVATE void pdp__mpi_sum_f16(void *in, void *inout, int *len, MPI_Datatype *type)
{
    (void)type;
    pdp__mpi_sum16((const uint16_t *)in, (uint16_t *)inout, *len, PDP_DTYPE_F16);
}

/* Runs one collective to completion on the progress thread. */
PDP__PRIVATE pdp_status pdp__mpi_run(pdp__mpi_comm *mc, const pdp__workq_item *w, MPI_Request *req,
                                     char *msg, size_t cap)
{
    const pdp__coll_args *a = &w->args;
    MPI_Comm mcomm = mc->mcomm;
    double deadline = w->head.t_start + mc->head.timeout_s;
    int size = mc->head.size, rank = mc->head.rank, n;
    int64_t off, len;
    size_t es = pdp__dtype_size(a->dtype);
    MPI_Datatype type = a->dtype == PDP_DTYPE_F32 ? MPI_FLOAT : MPI_UINT16_T;
    MPI_Op sum = a->dtype == PDP_DTYPE_F32 ? MPI_SUM : mc->op16[a->dtype == PDP_DTYPE_F16];
    pdp_status st;
    *req = MPI_REQUEST_NULL;
    switch (a->kind) {
    case PDP__COLL_ALLREDUCE:
    case PDP__COLL_BROADCAST:
    case PDP__COLL_BROADCAST_BYTES:
        for (off = 0; off < a->count; off += len) {
            len = PDP__MIN(a->count - off, (int64_t)PDP_MPI_CHUNK);
            n = (int)len;
            if (a->kind == PDP__COLL_ALLREDUCE)
                st = pdp__mpi_posted(mc, w, MPI_Iallreduce(MPI_IN_PLACE, (char *)a->buf + off * es,
                                     n, type, sum, mcomm, req), "MPI_Iallreduce", msg, cap);
            else if (a->kind == PDP__COLL_BROADCAST)
                st = pdp__mpi_posted(mc, w, MPI_Ibcast(a->buf + off, n, MPI_FLOAT, a->op, mcomm,
                                     req), "MPI_Ibcast", msg, cap);
            else
                st = pdp__mpi_posted(mc, w, MPI_Ibcast((char *)a->bytes_buf + off, n, MPI_BYTE,
                                     a->op, mcomm, req), "MPI_Ibcast", msg, cap);
            if (st == PDP_OK) st = pdp__mpi_drive(mc, w, req, deadline, msg, cap);
            if (st != PDP_OK) return st;
        }
        if (a->kind == PDP__COLL_ALLREDUCE && a->op == PDP_REDUCE_AVG)
            pdp__mpi_divide(a->buf, a->count, size, a->dtype);
        return PDP_OK;
    case PDP__COLL_REDUCE_SCATTER: {
        void *mine = (char *)a->send + (int64_t)rank * a->count * (int64_t)es; /* in-place slot */
        bool in_place = (void *)a->recv == mine;
        PDP_ASSERT(a->count <= INT32_MAX); /* comm.c's bound (pdp__comm_count_max) */
        n = (int)a->count;
        if (size == 1) {
            if (a->recv != a->send && n > 0) memmove(a->recv, a->send, (size_t)n * es);
        } else {
            /* in place, MPI leaves the result at the start of the buffer */
            st = pdp__mpi_posted(mc, w, MPI_Ireduce_scatter_block(
                                     in_place ? MPI_IN_PLACE : (void *)a->send,
                                     in_place ? (void *)a->send : (void *)a->recv, n, type,
                                     sum, mcomm, req),
                                 "MPI_Ireduce_scatter_block", msg, cap);
            if (st == PDP_OK) st = pdp__mpi_drive(mc, w, req, deadline, msg, cap);
            if (st != PDP_OK) return st;
            if (in_place && rank > 0) memmove(a->recv, a->send, (size_t)n * es);
        }
        if (a->op == PDP_REDUCE_AVG) pdp__mpi_divide(a->recv, a->count, size, a->dtype);
        return PDP_OK;
    }
    case PDP__COLL_ALLGATHER: {
        bool in_place = a->send == a->recv + (int64_t)rank * a->count;
        PDP_ASSERT(a->count <= INT32_MAX);
        n = (int)a->count;
        st = pdp__mpi_posted(mc, w, MPI_Iallgather(in_place ? MPI_IN_PLACE : (void *)a->send,
                             n, MPI_FLOAT, a->recv, n, MPI_FLOAT, mcomm, req),
                             "MPI_Iallgather", msg, cap);
        if (st == PDP_OK) st = pdp__mpi_drive(mc, w, req, deadline, msg, cap);
        return st;
    }
    case PDP__COLL_BARRIER:
        st = pdp__mpi_posted(mc, w, MPI_Ibarrier(mcomm, req), "MPI_Ibarrier", msg, cap);
        if (st == PDP_OK) st = pdp__mpi_drive(mc, w, req, deadline, msg, cap);
        return st;
    case PDP__COLL_SPLIT: /* blocking, but every rank is known to have arrived (comm.c) */
        return pdp__mpi_posted(mc, w, MPI_Comm_split(mcomm, a->op < 0 ? MPI_UNDEFINED : a->op,
                               (int)a->count, (MPI_Comm *)a->out), "MPI_Comm_split", msg, cap);
    case PDP__COLL_SEND: /* never queued */
    case PDP__COLL_RECV:
        break;
    }
    snprintf(msg, cap, "comm_mpi: unknown collective kind %d", (int)a->kind);
    return PDP_ERR_STATE;
}

/* The queue's exec; a request posted but never completed becomes the orphan. */
PDP__PRIVATE pdp_status pdp__mpi_exec(pdp__workq *q, pdp__workq_item *w, char *msg, size_t cap)
{
    pdp__mpi_comm *mc = (pdp__mpi_comm *)q->comm;
    MPI_Request req;
    pdp_status st = pdp__mpi_run(mc, w, &req, msg, cap);
    if (st != PDP_OK && req != MPI_REQUEST_NULL) {
        pdp__mutex_lock(&q->mu);
        mc->orphan = true;
        mc->orphan_req = req;
        pdp__mutex_unlock(&q->mu);
    }
    return st;
}

/* Sleeps 1 ms, then tests the orphan once: true when it completed. */
PDP__PRIVATE bool pdp__mpi_orphan_test(MPI_Request *req)
{
    int flag = 0;
    pdp__sleep_s(1e-3);
    if (MPI_Test(req, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) flag = 0;
    return flag != 0;
}

/* The queue's idle hook (q->mu held): keep a timed-out request moving, so
   that a late rank completes it and the communicator can be freed cleanly. */
PDP__PRIVATE bool pdp__mpi_idle(pdp__workq *q)
{
    pdp__mpi_comm *mc = (pdp__mpi_comm *)q->comm;
    bool done;
    if (q->p2p_live) { /* keep messages moving while the rank computes */
        pdp__mutex_unlock(&q->mu);
        pdp__mpi_p2p_poll(q);
        pdp__sleep_s(200e-6);
        pdp__mutex_lock(&q->mu);
        return true;
    }
    if (!mc->orphan) return false;
    pdp__mutex_unlock(&q->mu);
    done = pdp__mpi_orphan_test(&mc->orphan_req);
    pdp__mutex_lock(&q->mu);
    if (done) mc->orphan = false;
    return true;
}

/* ---- comm_mpi: the ops table ---- */

/* Tests *req until it completes (true) or deadline passes (false). */
PDP__PRIVATE bool pdp__mpi_poll_until(MPI_Request *req, double deadline)
{
    for (;;) {
        int flag = 0;
        if (MPI_Test(req, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) return false;
        if (flag) return true;
        if (pdp__now() > deadline) return false;
        pdp__sleep_s(100e-6); /* creation and shutdown only */
    }
}

/* Drops one reference to MPI; the last one finalises it if pdp initialised it
   (after completing a timed-out duplication, if its late rank came after all). */
PDP__PRIVATE void pdp__mpi_release(void)
{
    pdp__mutex_lock(&pdp__mpi_mu);
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
    pdp__mutex_unlock(&pdp__mpi_mu);
}

PDP__PRIVATE void pdp__mpi_destroy(pdp_comm *c)
{
    pdp__mpi_comm *mc = (pdp__mpi_comm *)c;
    bool stuck = false;
    double give_up;
    int i;
    pdp__workq_shutdown(&mc->q);
    /* messages never waited: an unmatched receive is dropped, the rest cancelled, all at
       once, then given one shared grace with the abandoned requests */
    pdp__mutex_lock(&mc->p2p_mu);
    for (i = 0; i < PDP_MPI_MAX_INFLIGHT; i++)
        if (mc->p2p[i].active && mc->p2p[i].posted) {
            int flag = 0;
            MPI_Test(&mc->p2p[i].req, &flag, MPI_STATUS_IGNORE);
            if (flag) mc->p2p[i].active = false;
            else if (mc->p2p[i].cancel_by == 0.0) MPI_Cancel(&mc->p2p[i].req);
        }
    give_up = pdp__now() + PDP__MPI_FREE_GRACE_S;
    for (i = 0; i < PDP_MPI_MAX_INFLIGHT; i++)
        if (mc->p2p[i].active && mc->p2p[i].posted &&
            !pdp__mpi_poll_until(&mc->p2p[i].req, give_up))
            stuck = true; /* leave mcomm alone and never finalise */
    for (i = 0; i < mc->n_abandoned; i++)
        if (!pdp__mpi_poll_until(&mc->abandoned[i], give_up)) stuck = true;
    pdp__mutex_unlock(&mc->p2p_mu);
    pdp__mutex_destroy(&mc->p2p_mu);
    /* give a timed-out request a last chance to complete */
    while (mc->orphan && pdp__now() < mc->q.stop_time + PDP__MPI_FREE_GRACE_S)
        if (pdp__mpi_orphan_test(&mc->orphan_req)) mc->orphan = false;
    if (mc->orphan || stuck) { /* a request that never completed still references mcomm */
        pdp__mutex_lock(&pdp__mpi_mu);
        pdp__mpi_unclean = true;
        pdp__mutex_unlock(&pdp__mpi_mu);
    } else {
        MPI_Comm_free(&mc->mcomm);
    }
    for (i = 0; i < 2; i++)
        if (mc->op16[i] != MPI_OP_NULL) MPI_Op_free(&mc->op16[i]);
    if (mc->traced) pdp__trace_close();
    pdp__dealloc(mc);
    pdp__mpi_release();
}

PDP__PRIVATE pdp_status pdp__mpi_split(pdp_comm *c, int colour, int key, int new_rank, int new_size,
                                       int leader, const char *name, pdp_comm **out);

static const pdp__comm_ops pdp__mpi_ops = {
    pdp__workq_allreduce, pdp__workq_broadcast, pdp__workq_reduce_scatter,
    pdp__workq_allgather, pdp__workq_barrier,   pdp__workq_broadcast_bytes,
    pdp__mpi_send,        pdp__mpi_recv,        pdp__workq_sendrecv,  pdp__mpi_split,
    pdp__workq_wait,      pdp__workq_done,      pdp__mpi_destroy,
};

/* ---- comm_mpi: bounded start-up ----
   MPI_Init_thread cannot be interrupted and has no timeout: a rank that never
   starts leaves the others inside it until the launcher gives up. pdp bounds
   what it can around it (comm.h states the contract):
     the start-up check  with a store port in the environment (PDP_STORE_PORT or
                         MASTER_PORT) and the ranks named by the launcher
                         (OMPI_COMM_WORLD_* or RANK/WORLD_SIZE), every rank checks
                         in at the TCP store (rendezvous.c; rank 0 serves it) BEFORE
                         calling MPI_Init_thread, and waits up to timeout_s for all
                         the others: a missing rank makes the others fail with
                         PDP_ERR_TIMEOUT naming it, and MPI_Init_thread is never
                         called, so nothing hangs. The store stays open until
                         MPI_Init_thread returned (rank 0 serves the latecomers);
     the watchdog        a thread started before MPI_Init_thread: when it has not
                         returned timeout_s later, the watchdog calls desc->log
                         (PDP_LOG_ERROR, from the watchdog thread) once, naming this
                         rank, what it waits for and, when the start-up check passed,
                         that every rank had checked in. It never exits or aborts:
                         the rank stays in MPI_Init_thread until MPI returns or the
                         launcher ends the job. */

typedef struct pdp__mpi_watch {
    pdp__mutex mu;
    pdp__cond cv;
    bool done;              /* MPI_Init_thread returned */
    double timeout_s;
    pdp_log_fn log;
    void *log_user;
    char msg[512];
} pdp__mpi_watch;

PDP__PRIVATE void *pdp__mpi_watchdog(void *arg)
{
    pdp__mpi_watch *w = (pdp__mpi_watch *)arg;
    double deadline = pdp__now() + w->timeout_s;
    bool fired = false;
    pdp__mutex_lock(&w->mu);
    while (!w->done && !fired)
        fired = pdp__cond_timedwait(&w->cv, &w->mu, deadline) == ETIMEDOUT && !w->done;
    pdp__mutex_unlock(&w->mu);
    if (fired && w->log) w->log(PDP_LOG_ERROR, w->msg, w->log_user);
    return NULL;
}

/* The start-up check (above); *store is left open for the caller to free after
   MPI_Init_thread, NULL when no check ran. *checked: every rank checked in. */
PDP__PRIVATE pdp_status pdp__mpi_start_check(pdp_store **store, const pdp_env_info *env,
                                             double timeout_s, bool *checked, const char *fn)
{
    double deadline = pdp__now() + timeout_s;
    char key[64], missing[200];
    const char *k = key;
    size_t len = 0;
    int r, nmissing = 0;
    pdp_status st;
    *store = NULL;
    *checked = false;
    if (!env->from_env || env->world_size < 2) return PDP_OK;
    if (!getenv("PDP_STORE_PORT") && !getenv("MASTER_PORT")) return PDP_OK;
    if ((st = pdp__rendezvous_store(store, env, timeout_s, "MPI start-up check", fn)) != PDP_OK) {
        if (st == PDP_ERR_TIMEOUT && env->rank != 0)
            return pdp__err(st, "%s: MPI start-up check: rank %d of %d: missing rank 0: it did not "
                            "start within %g s (its TCP store at %s never answered); "
                            "MPI_Init_thread was not called", fn, env->rank, env->world_size,
                            timeout_s, env->master_addr);
        return st;
    }
    snprintf(key, sizeof key, "pdp/mpi_start/%d", env->rank);
    if ((st = pdp_store_set(*store, key, "", 0)) != PDP_OK) goto fail;
    missing[0] = '\0';
    for (r = 0; r < env->world_size; r++) {
        double left = deadline - pdp__now();
        snprintf(key, sizeof key, "pdp/mpi_start/%d", r);
        st = pdp_store_wait(*store, &k, 1, left > 1e-3 ? left : 1e-3);
        if (st == PDP_ERR_TIMEOUT) {
            if (len < sizeof missing - 16)
                len += (size_t)snprintf(missing + len, sizeof missing - len, " %d", r);
            nmissing++;
        } else if (st != PDP_OK) {
            goto fail;
        }
    }
    if (env->rank != 0) { /* rank 0 keeps serving until every present rank has its answer */
        snprintf(key, sizeof key, "pdp/mpi_start_seen/%d", env->rank);
        if (nmissing && (st = pdp_store_set(*store, key, "", 0)) != PDP_OK) goto fail;
    } else if (nmissing) {
        double grace = pdp__now() + (timeout_s < 1.0 ? timeout_s : 1.0);
        for (r = 1; r < env->world_size; r++) {
            double left = grace - pdp__now();
            snprintf(key, sizeof key, "pdp/mpi_start/%d", r);
            if (pdp_store_wait(*store, &k, 1, 1e-3) != PDP_OK) continue; /* a missing rank */
            snprintf(key, sizeof key, "pdp/mpi_start_seen/%d", r);
            (void)pdp_store_wait(*store, &k, 1, left > 1e-3 ? left : 1e-3);
        }
    }
    if (nmissing) {
        pdp_store_free(*store);
        *store = NULL;
        return pdp__err(PDP_ERR_TIMEOUT, "%s: MPI start-up check: rank %d of %d: missing rank%s"
                        "%s: %s not call pdp_comm_init_env within %g s (checked at the TCP "
                        "store before MPI_Init_thread, which was therefore not called)", fn,
                        env->rank, env->world_size, nmissing > 1 ? "s" : "", missing,
                        nmissing > 1 ? "they did" : "it did", timeout_s);
    }
    *checked = true;
    return PDP_OK;
fail:
    pdp_store_free(*store);
    *store = NULL;
    return pdp__err_wrap(st, "%s: MPI start-up check: rank %d of %d", fn, env->rank,
                         env->world_size);
}

/* MPI_Init_thread after the start-up check, under the watchdog; mpi_mu held. */
PDP__PRIVATE int pdp__mpi_init_bounded(const pdp_comm_desc *desc, double timeout_s, int *provided,
                                       pdp_status *st, const char *fn)
{
    pdp__mpi_watch w;
    pdp__thread tid;
    pdp_env_info env;
    pdp_store *store = NULL;
    bool checked = false, watching;
    int rc;
    if (pdp_env_read(&env) != PDP_OK) { /* the launcher's variables are not ours to judge */
        memset(&env, 0, sizeof env);
        env.rank = -1;
    }
    if ((*st = pdp__mpi_start_check(&store, &env, timeout_s, &checked, fn)) != PDP_OK)
        return MPI_ERR_OTHER;
    memset(&w, 0, sizeof w);
    w.timeout_s = timeout_s;
    w.log = desc ? desc->log : NULL;
    w.log_user = desc ? desc->log_user : NULL;
    snprintf(w.msg, sizeof w.msg, "%s: rank %d of %d: MPI_Init_thread has not returned after %g s "
             "(timeout_s): %s; pdp cannot interrupt MPI_Init_thread, so this rank waits until "
             "MPI returns or the launcher ends the job", fn, env.rank, env.world_size, timeout_s,
             checked ? "every rank checked in at the start-up check, so a rank died or hangs "
                       "inside MPI's start-up (MPI cannot say which)"
                     : "a rank did not start or is stuck before pdp_comm_init_env (MPI cannot "
                       "say which; set PDP_STORE_PORT for a start-up check that names it)");
    pdp__mutex_init(&w.mu);
    pdp__cond_init(&w.cv);
    watching = w.log && pdp__thread_create(&tid, pdp__mpi_watchdog, &w) == 0;
    rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, provided);
    if (watching) {
        pdp__mutex_lock(&w.mu);
        w.done = true;
        pdp__cond_signal(&w.cv);
        pdp__mutex_unlock(&w.mu);
        pdp__thread_join(&tid);
    }
    pdp__mutex_destroy(&w.mu);
    pdp__cond_destroy(&w.cv);
    pdp_store_free(store); /* every rank is past MPI's start-up: nobody needs it now */
    return rc;
}

/* ---- comm_mpi: creation ---- */

/* Initialises MPI when nobody has (bounded as above) and takes one reference to it. */
PDP__PRIVATE pdp_status pdp__mpi_acquire(const pdp_comm_desc *desc, double timeout_s,
                                         const char *fn)
{
    int inited = 0, finalized = 0, provided = 0, rc;
    pdp_status st = PDP_OK;
    pdp__mutex_lock(&pdp__mpi_mu);
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
        rc = pdp__mpi_init_bounded(desc, timeout_s, &provided, &st, fn);
        if (st != PDP_OK) goto out;
        if (rc != MPI_SUCCESS) {
            char e[256];
            pdp__mpi_errstr(rc, e, sizeof e);
            st = pdp__err(PDP_ERR_COMM, "%s: MPI_Init_thread failed: %s", fn, e);
            goto out;
        }
        pdp__mpi_we_init = true;
        /* OpenMPI reports an error of a non-blocking collective's request (MPI_Test) on
           MPI_COMM_WORLD's handler, not on our duplicate's: pdp owns MPI here, so make that
           handler return too (else MPI_ERRORS_ARE_FATAL aborts the whole job) */
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
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
    pdp__mutex_unlock(&pdp__mpi_mu);
    return st;
}

PDP__PRIVATE pdp_status pdp__mpi_wrap(pdp_comm **out, MPI_Comm mcomm, const char *name,
                                      double timeout_s, const char *fn);

PDP__PRIVATE pdp_status pdp__mpi_create(pdp_comm **out, const pdp_comm_desc *desc, const char *fn)
{
    MPI_Comm mcomm = MPI_COMM_NULL;
    MPI_Request req = MPI_REQUEST_NULL;
    int rank = 0, size = 1, rc;
    double timeout_s;
    pdp_status st;
    if ((st = pdp__comm_desc_timeout(desc, &timeout_s, fn)) != PDP_OK) return st;
    if (desc && desc->device.kind != PDP_DEVICE_CPU)
        return pdp__err(PDP_ERR_UNSUPPORTED, "%s: the MPI backend moves CPU buffers; device "
                        "CUDA %d needs PDP_BACKEND_NCCL", fn, desc->device.ordinal);
    if ((st = pdp__mpi_acquire(desc, timeout_s, fn)) != PDP_OK) return st;
    pdp__mutex_lock(&pdp__mpi_mu);
    if (pdp__mpi_init_orphan && pdp__mpi_poll_until(&pdp__mpi_init_req, 0.0)) {
        MPI_Comm_free(&pdp__mpi_init_comm); /* an earlier timed-out duplication completed */
        pdp__mpi_init_orphan = false;
    }
    pdp__mutex_unlock(&pdp__mpi_mu);
    rc = MPI_Comm_idup(MPI_COMM_WORLD, &mcomm, &req);
    if (rc == MPI_SUCCESS && !pdp__mpi_poll_until(&req, pdp__now() + timeout_s)) {
        int world_rank = -1;
        MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
        pdp__mutex_lock(&pdp__mpi_mu);
        if (pdp__mpi_init_orphan) {
            pdp__mpi_unclean = true; /* a second orphan: no slot to keep it */
        } else {
            pdp__mpi_init_orphan = true;
            pdp__mpi_init_req = req;
            pdp__mpi_init_comm = mcomm;
        }
        pdp__mutex_unlock(&pdp__mpi_mu);
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
    {   /* the launcher's variables must describe this MPI world (a torchrun-style start of
           separate processes without mpirun gives each its own MPI world of one) */
        pdp_env_info env;
        if (pdp_env_read(&env) == PDP_OK && env.from_env &&
            (env.rank != rank || env.world_size != size)) {
            MPI_Comm_free(&mcomm);
            pdp__mpi_release();
            return pdp__err(PDP_ERR_INVALID, "%s: the environment makes this process rank %d of %d "
                            "(%s), but MPI_COMM_WORLD makes it rank %d of %d: the MPI backend's "
                            "ranks must be started by mpirun (or mpiexec), not as separate "
                            "processes", fn, env.rank, env.world_size,
                            getenv("RANK") && *getenv("RANK") ? "RANK/WORLD_SIZE"
                                                              : "OMPI_COMM_WORLD_*",
                            rank, size);
        }
    }
    return pdp__mpi_wrap(out, mcomm, desc && desc->name ? desc->name : "comm", timeout_s, fn);
}

/* Wraps mcomm (errors returned, one reference to MPI taken by the caller; both given
   up on failure) as a communicator with its own queue, progress thread and p2p state. */
PDP__PRIVATE pdp_status pdp__mpi_wrap(pdp_comm **out, MPI_Comm mcomm, const char *name,
                                      double timeout_s, const char *fn)
{
    pdp__mpi_comm *mc;
    int rank = 0, size = 1, world_rank = 0, world_size = 1;
    pdp_status st;
    MPI_Comm_rank(mcomm, &rank);
    MPI_Comm_size(mcomm, &size);
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank); /* the trace is per process */
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    mc = (pdp__mpi_comm *)pdp__calloc(sizeof *mc);
    if (!mc) {
        MPI_Comm_free(&mcomm);
        pdp__mpi_release();
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory for the MPI communicator (rank %d)",
                        fn, rank);
    }
    pdp__mutex_init(&mc->p2p_mu);
    mc->head.ops = &pdp__mpi_ops;
    mc->head.backend = PDP_BACKEND_MPI;
    mc->head.rank = rank;
    mc->head.trace_pid = world_rank;
    mc->head.size = size;
    mc->head.timeout_s = timeout_s;
    mc->head.device = pdp_cpu();
    snprintf(mc->head.name, sizeof mc->head.name, "%s", name);
    mc->head.impl = &mc->q;
    mc->mcomm = mcomm;
    mc->op16[0] = mc->op16[1] = MPI_OP_NULL;
    if (MPI_Op_create(pdp__mpi_sum_bf16, 1, &mc->op16[0]) != MPI_SUCCESS ||
        MPI_Op_create(pdp__mpi_sum_f16, 1, &mc->op16[1]) != MPI_SUCCESS) {
        st = pdp__err(PDP_ERR_COMM, "%s: MPI_Op_create failed for the 16-bit sums (rank %d)", fn,
                      rank);
        goto fail;
    }
    mc->q.comm = &mc->head;
    mc->q.exec = pdp__mpi_exec;
    mc->q.idle = pdp__mpi_idle;
    mc->q.p2p_poll = pdp__mpi_p2p_poll;
    mc->q.p2p_expire = pdp__mpi_p2p_expire;
    mc->q.sticky = true;
    if ((st = pdp__trace_open(world_size > 1 ? world_rank : -1)) != PDP_OK) {
        st = pdp__err_wrap(st, "%s (rank %d)", fn, rank);
        goto fail;
    }
    mc->traced = true;
    if (pdp__trace_enabled()) {
        char track[PDP__COMM_NAME_CAP + 16];
        snprintf(track, sizeof track, "comm %s (mpi)", mc->head.name);
        mc->q.trace_pid = world_rank;
        mc->q.trace_tid = pdp__trace_track(world_rank, track);
    }
    if ((st = pdp__workq_init(&mc->q, mc->pool, PDP_MPI_MAX_INFLIGHT, "PDP_MPI_MAX_INFLIGHT", true,
                              fn)) != PDP_OK)
        goto fail;
    *out = &mc->head;
    return PDP_OK;
fail:
    if (mc->op16[0] != MPI_OP_NULL) MPI_Op_free(&mc->op16[0]);
    if (mc->op16[1] != MPI_OP_NULL) MPI_Op_free(&mc->op16[1]);
    if (mc->traced) pdp__trace_close();
    pdp__mutex_destroy(&mc->p2p_mu);
    pdp__dealloc(mc);
    MPI_Comm_free(&mcomm);
    pdp__mpi_release();
    return st;
}

/* pdp_comm_split: MPI_Comm_split runs on the progress thread, in order with the
   collectives (MPI forbids two threads in collectives on one communicator); comm.c's
   colour exchange has already proved every rank arrived, so it does not block long. */
PDP__PRIVATE pdp_status pdp__mpi_split(pdp_comm *c, int colour, int key, int new_rank, int new_size,
                                       int leader, const char *name, pdp_comm **out)
{
    MPI_Comm nc = MPI_COMM_NULL;
    pdp__coll_args a;
    pdp_work *w = NULL;
    pdp_status st;
    (void)new_rank;
    (void)new_size;
    (void)leader;
    memset(&a, 0, sizeof a);
    a.kind = PDP__COLL_SPLIT;
    a.op = colour;
    a.count = key;
    a.out = &nc;
    pdp__mutex_lock(&pdp__mpi_mu);
    pdp__mpi_live++; /* the new communicator's reference, taken before anything can finalise */
    pdp__mutex_unlock(&pdp__mpi_mu);
    if ((st = pdp__workq_submit(c, &a, &w)) == PDP_OK) st = pdp__workq_wait(w);
    if (st != PDP_OK || colour < 0 || nc == MPI_COMM_NULL) {
        if (nc != MPI_COMM_NULL) MPI_Comm_free(&nc);
        pdp__mpi_release();
        return st;
    }
    MPI_Comm_set_errhandler(nc, MPI_ERRORS_RETURN);
    return pdp__mpi_wrap(out, nc, name, c->timeout_s, "pdp_comm_split");
}
#endif /* PDP_MPI */

/* ---- comm_mpi: pdp_comm_init_env ---- */

PDP__PRIVATE pdp_status pdp__comm_init_mpi_env(pdp_comm **out, const pdp_comm_desc *desc)
{
    static const char *fn = "pdp_comm_init_env";
#ifdef PDP_MPI
    return pdp__mpi_create(out, desc, fn);
#else
    (void)desc;
    *out = NULL;
    return pdp__err(PDP_ERR_UNSUPPORTED, "%s: backend MPI: built without PDP_MPI (compile "
                    "with -DPDP_MPI using mpicc, and run under mpirun)", fn);
#endif
}
