/* comm: the public communicator API and the backend dispatcher. Each backend is
   one module that fills a pdp__comm_ops table (internal.h):
     comm_local.c   ranks are threads of one process (the default);
     comm_mpi.c     ranks are MPI processes (-DPDP_MPI);
     comm_nccl.c    ranks are GPUs, the host side of pdp_cuda.cu's NCCL (-DPDP_CUDA);
   the local and MPI backends share comm_queue.c's collective queue, and every
   backend shares internal.h's communicator contract (pdp_comm, pdp_work, the
   collective kinds and their names). This module comes after the backends in
   pdp.h, so nothing here is called before it is defined.

   ---- the public layer ----
   Every pdp_comm_* collective validates its arguments here (its count against one
   upper bound, below), stamps the handle's launch time, counts the collective and the
   bytes this rank moves in the bandwidth-optimal algorithm (ring all-reduce 2(N-1)/N x
   bytes, reduce-scatter and broadcast (N-1)/N x bytes, all-gather (N-1) x the sent
   bytes), then calls the backend. A call with work == NULL is made synchronous here, so backends
   always return a handle. pdp_work_wait adds the collective's execution time
   (t_done - t_start, queueing excluded) to the communicator's busy_s.

   ---- the dispatcher ----
   pdp_comm_init_env creates the communicator of a process launched by mpirun
   or torchrun: one line per backend calls its pdp__comm_init_<backend>_env,
   which every backend module defines, as a stub that fails with
   PDP_ERR_UNSUPPORTED naming the macro when the backend was not compiled in.
   DEFAULT and LOCAL fail with PDP_ERR_INVALID: thread-ranks have no
   environment to read; they need pdp_local_group_create. A new backend takes:
     - one new module: its pdp__comm_ops table (internal.h states the contract),
       its creation, and its pdp__comm_init_<backend>_env, a stub that fails with
       PDP_ERR_UNSUPPORTED naming the macro when the backend is not compiled in;
     - that module in amalgamate.py's IMPL list, before comm.c (after
       comm_queue.c if it uses the queue), and its build macro in the manual's
       BUILD and OPTIONS;
     - the prototype of its pdp__comm_init_<backend>_env in internal.h, beside
       the others;
     - its pdp_backend value in comm.h (and there, what it bounds and where its
       messages differ);
     - its line in the switch below, and in pdp__comm_count_max when it takes
       narrower counts than int64_t;
     - the collective and point-to-point tests run on it (tests/test_comm.c and
       tests/test_mpi.c drive the local and MPI backends). */

#include "internal.h"

/* ---- comm: public layer ---- */

PDP__PRIVATE pdp_status pdp__comm_check(const pdp_comm *c, const char *fn)
{
    if (!c) return pdp__err(PDP_ERR_INVALID, "%s: communicator is NULL", fn);
    return PDP_OK;
}

PDP__PRIVATE pdp_status pdp__comm_check_count(const pdp_comm *c, const void *p, int64_t count,
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

/* ---- comm: the upper bound of a count ----
   One rule for every call, here and nowhere else: the largest buffer the call touches,
   parts x count elements of es bytes (parts = the world size for reduce-scatter's send and
   all-gather's recv buffers, else 1), must be addressable, at most PTRDIFF_MAX bytes (so
   count x es fits in size_t and every byte offset in ptrdiff_t: pdp__comm_bytes cannot
   wrap in a backend), and count must fit what the backend takes in one call
   (pdp__comm_count_max). Beyond either, the call fails with PDP_ERR_INVALID naming the call,
   the count and the limit, before the backend sees it. */

/* Elements per rank that one call of c's backend takes: MPI counts are int, so the MPI
   backend's reduce-scatter, all-gather, send and recv take at most INT32_MAX (its
   all-reduce and broadcasts are split into calls of PDP_MPI_CHUNK elements); local and
   NCCL (size_t counts) are bounded by the address space alone. */
PDP__PRIVATE int64_t pdp__comm_count_max(const pdp_comm *c, pdp__coll_kind kind)
{
    if (c->backend == PDP_BACKEND_MPI &&
        (kind == PDP__COLL_REDUCE_SCATTER || kind == PDP__COLL_ALLGATHER ||
         kind == PDP__COLL_SEND || kind == PDP__COLL_RECV))
        return INT32_MAX;
    return INT64_MAX;
}

PDP__PRIVATE pdp_status pdp__comm_check_bound(const pdp_comm *c, int64_t count, size_t es,
                                              int parts, pdp__coll_kind kind, const char *fn)
{
    int64_t most = (int64_t)((size_t)PTRDIFF_MAX / (es * (size_t)parts));
    int64_t max = pdp__comm_count_max(c, kind);
    char ranks[24] = "";
    if (parts > 1) snprintf(ranks, sizeof ranks, "%d ranks x ", parts);
    if (count > most)
        return pdp__err(PDP_ERR_INVALID, "%s: count %lld is too large: %s%lld elements of %zu "
                        "bytes exceed the address space (PTRDIFF_MAX bytes); at most %lld "
                        "(comm '%s', rank %d of %d)", fn, (long long)count, ranks,
                        (long long)count, es, (long long)most, c->name, c->rank, c->size);
    if (count > max)
        return pdp__err(PDP_ERR_INVALID, "%s: count %lld is more than the %s backend takes in one "
                        "%s: at most %lld elements per rank (MPI counts are int) (comm '%s', "
                        "rank %d of %d)", fn, (long long)count,
                        c->backend == PDP_BACKEND_MPI ? "MPI" : "this", pdp__op_names[kind],
                        (long long)max, c->name, c->rank, c->size);
    return PDP_OK;
}

PDP__PRIVATE pdp_status pdp__comm_check_op(const pdp_comm *c, pdp_reduce_op op, const char *fn)
{
    if (op != PDP_REDUCE_SUM && op != PDP_REDUCE_AVG)
        return pdp__err(PDP_ERR_INVALID, "%s: unknown reduce op %d (comm '%s', rank %d)", fn,
                        (int)op, c->name, c->rank);
    return PDP_OK;
}

PDP__PRIVATE pdp_status pdp__comm_check_root(const pdp_comm *c, int root, const char *fn)
{
    if (root < 0 || root >= c->size)
        return pdp__err(PDP_ERR_INVALID, "%s: root %d outside 0..%d (comm '%s', rank %d)", fn,
                        root, c->size - 1, c->name, c->rank);
    return PDP_OK;
}

/* After the backend accepted a collective: stats, the launch stamp, and the
   synchronous form when the caller passed no handle pointer. */
PDP__PRIVATE pdp_status pdp__comm_launched(pdp_comm *c, pdp_status st, pdp_work *w, double t_launch,
                                           double bytes, pdp_work **work, const char *fn)
{
    if (st != PDP_OK) return pdp__err_wrap(st, "%s", fn);
    w->t_launch = t_launch;
    if (strcmp(fn, "pdp_comm_send") == 0 || strcmp(fn, "pdp_comm_recv") == 0) c->stats.p2p++;
    else c->stats.collectives++;
    c->stats.bytes_sent += (int64_t)bytes;
    if (work) {
        *work = w;
        return PDP_OK;
    }
    st = c->ops->wait(w);
    c->stats.busy_s += w->t_done > w->t_start ? w->t_done - w->t_start : 0.0;
    return st == PDP_OK ? st : pdp__err_wrap(st, "%s", fn);
}

PDP__PRIVATE pdp_status pdp__comm_check_dtype(const pdp_comm *c, pdp_dtype dt, const char *fn)
{
    if (dt != PDP_DTYPE_F32 && dt != PDP_DTYPE_BF16 && dt != PDP_DTYPE_F16)
        return pdp__err(PDP_ERR_INVALID, "%s: unknown dtype %d (comm '%s', rank %d): "
                        "PDP_DTYPE_F32, PDP_DTYPE_BF16 or PDP_DTYPE_F16", fn, (int)dt, c->name,
                        c->rank);
    return PDP_OK;
}

/* The all-reduce of every dtype; fn names the public entry. */
PDP__PRIVATE pdp_status pdp__comm_allreduce(pdp_comm *c, void *buf, int64_t count, pdp_dtype dt,
                                            pdp_reduce_op op, pdp_work **work, const char *fn)
{
    pdp_work *w = NULL;
    double t = pdp__now(), n;
    pdp_status st;
    if (work) *work = NULL;
    if ((st = pdp__comm_check(c, fn)) || (st = pdp__comm_check_count(c, buf, count, "buf", fn)) ||
        (st = pdp__comm_check_op(c, op, fn)) || (st = pdp__comm_check_dtype(c, dt, fn)) ||
        (st = pdp__comm_check_bound(c, count, pdp_dtype_size(dt), 1, PDP__COLL_ALLREDUCE, fn)))
        return st;
    n = (double)c->size;
    st = c->ops->allreduce(c, buf, count, dt, op, &w);
    return pdp__comm_launched(c, st, w, t,
                              2.0 * (n - 1.0) / n * (double)count * (double)pdp_dtype_size(dt),
                              work, fn);
}

PDP_API pdp_status pdp_comm_allreduce(pdp_comm *c, float *buf, int64_t count, pdp_reduce_op op,
                                      pdp_work **work)
{
    return pdp__comm_allreduce(c, buf, count, PDP_DTYPE_F32, op, work, "pdp_comm_allreduce");
}

PDP_API pdp_status pdp_comm_allreduce_ex(pdp_comm *c, void *buf, int64_t count, pdp_dtype dtype,
                                         pdp_reduce_op op, pdp_work **work)
{
    return pdp__comm_allreduce(c, buf, count, dtype, op, work, "pdp_comm_allreduce_ex");
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
        (st = pdp__comm_check_root(c, root, fn)) ||
        (st = pdp__comm_check_bound(c, count, 4, 1, PDP__COLL_BROADCAST, fn)))
        return st;
    n = (double)c->size;
    st = c->ops->broadcast(c, buf, count, root, &w);
    return pdp__comm_launched(c, st, w, t, (n - 1.0) / n * (double)count * 4.0, work, fn);
}

PDP__PRIVATE pdp_status pdp__comm_reduce_scatter(pdp_comm *c, const void *send, void *recv,
                                                 int64_t recv_count, pdp_dtype dt, pdp_reduce_op op,
                                                 pdp_work **work, const char *fn)
{
    pdp_work *w = NULL;
    double t = pdp__now();
    pdp_status st;
    if (work) *work = NULL;
    if ((st = pdp__comm_check(c, fn)) ||
        (st = pdp__comm_check_count(c, send, recv_count, "send", fn)) ||
        (st = pdp__comm_check_count(c, recv, recv_count, "recv", fn)) ||
        (st = pdp__comm_check_op(c, op, fn)) || (st = pdp__comm_check_dtype(c, dt, fn)) ||
        (st = pdp__comm_check_bound(c, recv_count, pdp_dtype_size(dt), c->size,
                                    PDP__COLL_REDUCE_SCATTER, fn)))
        return st;
    st = c->ops->reduce_scatter(c, send, recv, recv_count, dt, op, &w);
    return pdp__comm_launched(c, st, w, t,
                              (double)(c->size - 1) * (double)recv_count *
                                  (double)pdp_dtype_size(dt),
                              work, fn);
}

PDP_API pdp_status pdp_comm_reduce_scatter(pdp_comm *c, const float *send, float *recv,
                                           int64_t recv_count, pdp_reduce_op op, pdp_work **work)
{
    return pdp__comm_reduce_scatter(c, send, recv, recv_count, PDP_DTYPE_F32, op, work,
                                    "pdp_comm_reduce_scatter");
}

PDP_API pdp_status pdp_comm_reduce_scatter_ex(pdp_comm *c, const void *send, void *recv,
                                              int64_t recv_count, pdp_dtype dtype,
                                              pdp_reduce_op op, pdp_work **work)
{
    return pdp__comm_reduce_scatter(c, send, recv, recv_count, dtype, op, work,
                                    "pdp_comm_reduce_scatter_ex");
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
        (st = pdp__comm_check_count(c, recv, send_count, "recv", fn)) ||
        (st = pdp__comm_check_bound(c, send_count, 4, c->size, PDP__COLL_ALLGATHER, fn)))
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

/* ---- comm: point-to-point ---- */

PDP__PRIVATE pdp_status pdp__comm_check_p2p(const pdp_comm *c, int peer, int tag, const char *fn)
{
    if (peer < 0 || peer >= c->size)
        return pdp__err(PDP_ERR_INVALID, "%s: peer %d outside 0..%d (comm '%s', rank %d)", fn,
                        peer, c->size - 1, c->name, c->rank);
    if (tag < 0 || tag > PDP_COMM_TAG_MAX)
        return pdp__err(PDP_ERR_INVALID, "%s: tag %d outside 0..%d (comm '%s', rank %d)", fn, tag,
                        PDP_COMM_TAG_MAX, c->name, c->rank);
    return PDP_OK;
}

PDP_API pdp_status pdp_comm_send(pdp_comm *c, const float *buf, int64_t count, int peer, int tag,
                                 pdp_work **work)
{
    static const char *fn = "pdp_comm_send";
    pdp_work *w = NULL;
    double t = pdp__now();
    pdp_status st;
    if (work) *work = NULL;
    if ((st = pdp__comm_check(c, fn)) || (st = pdp__comm_check_count(c, buf, count, "buf", fn)) ||
        (st = pdp__comm_check_p2p(c, peer, tag, fn)) ||
        (st = pdp__comm_check_bound(c, count, 4, 1, PDP__COLL_SEND, fn)))
        return st;
    st = c->ops->send(c, buf, count, peer, tag, &w);
    return pdp__comm_launched(c, st, w, t, (double)count * 4.0, work, fn);
}

PDP_API pdp_status pdp_comm_recv(pdp_comm *c, float *buf, int64_t count, int peer, int tag,
                                 pdp_work **work)
{
    static const char *fn = "pdp_comm_recv";
    pdp_work *w = NULL;
    double t = pdp__now();
    pdp_status st;
    if (work) *work = NULL;
    if ((st = pdp__comm_check(c, fn)) || (st = pdp__comm_check_count(c, buf, count, "buf", fn)) ||
        (st = pdp__comm_check_p2p(c, peer, tag, fn)) ||
        (st = pdp__comm_check_bound(c, count, 4, 1, PDP__COLL_RECV, fn)))
        return st;
    st = c->ops->recv(c, buf, count, peer, tag, &w);
    return pdp__comm_launched(c, st, w, t, 0.0, work, fn);
}

PDP_API pdp_status pdp_comm_sendrecv(pdp_comm *c, const pdp_p2p *ops, int n)
{
    static const char *fn = "pdp_comm_sendrecv";
    pdp_work *w[PDP_COMM_BATCH_MAX];
    double t = pdp__now();
    pdp_status st, first;
    int i;
    if ((st = pdp__comm_check(c, fn)) != PDP_OK) return st;
    if (n < 0 || n > PDP_COMM_BATCH_MAX || (n > 0 && !ops))
        return pdp__err(PDP_ERR_INVALID, "%s: %d messages%s (0..PDP_COMM_BATCH_MAX = %d) "
                        "(comm '%s', rank %d)", fn, n, ops ? "" : " at NULL",
                        PDP_COMM_BATCH_MAX, c->name, c->rank);
    for (i = 0; i < n; i++) {
        const pdp_p2p *o = &ops[i];
        if (o->work) *o->work = NULL;
        if ((st = pdp__comm_check_count(c, o->buf, o->count, "buf", fn)) ||
            (st = pdp__comm_check_p2p(c, o->peer, o->tag, fn)) ||
            (st = pdp__comm_check_bound(c, o->count, 4, 1,
                                        o->send ? PDP__COLL_SEND : PDP__COLL_RECV, fn)))
            return st;
    }
    if (n == 0) return PDP_OK;
    first = c->ops->sendrecv(c, ops, n, w);
    if (first != PDP_OK) first = pdp__err_wrap(first, "%s: a batch of %d messages", fn, n);
    for (i = 0; i < n && w[i]; i++) { /* the posted ones: counted, handed out or waited */
        w[i]->t_launch = t;
        c->stats.p2p++;
        if (ops[i].send) c->stats.bytes_sent += ops[i].count * 4;
        if (ops[i].work) {
            *ops[i].work = w[i];
            continue;
        }
        st = c->ops->wait(w[i]);
        c->stats.busy_s += w[i]->t_done > w[i]->t_start ? w[i]->t_done - w[i]->t_start : 0.0;
        if (st != PDP_OK && first == PDP_OK) first = pdp__err_wrap(st, "%s", fn);
    }
    return first;
}

/* ---- comm: agreement in a collective constructor ----
   A constructor that is collective over c (a split, a mesh, DDP, ZeRO, a pipeline, a
   trainer) can fail on one rank alone: a desc that rank got wrong, an allocation. Where
   that rank returns and the others go on into a collective, they wait there for it until
   the timeout; where it happens after the last collective, they return an object whose peer
   does not exist and learn of it at its first collective. So every such constructor passes
   each rank's status st through this one all-reduce (a count of failed ranks and the sum of
   their numbers) at each point where a rank-local stretch ends: before its first collective
   (pdp_ddp_create, pdp_zero_create, pdp_pp_create: their arguments, desc and plan) and after
   its last (what they allocate after it; pdp_comm_split and pdp_mesh_create too, whose
   checks before their first collective are of arguments every rank passes alike), a failed
   rank going straight there. A failed rank gets its own status and message back; a rank that
   succeeded fails with PDP_ERR_COMM naming the failed rank when there is one. */
/* The sum over c's ranks of n host floats v, in place (through device memory on a
   communicator of GPUs). */
PDP__PRIVATE pdp_status pdp__comm_sum_host(pdp_comm *c, float *v, int n)
{
    float *dev = NULL;
    pdp_status st;
    if (c->device.kind == PDP_DEVICE_CPU) return pdp_comm_allreduce(c, v, n, PDP_REDUCE_SUM, NULL);
    if ((st = pdp__dev_alloc(c->device, (size_t)n * sizeof *v, (void **)&dev)) != PDP_OK) return st;
    if ((st = pdp__dev_copy(c->device, dev, pdp_cpu(), v, (size_t)n * sizeof *v)) == PDP_OK &&
        (st = pdp_comm_allreduce(c, dev, n, PDP_REDUCE_SUM, NULL)) == PDP_OK)
        st = pdp__dev_copy(pdp_cpu(), v, c->device, dev, (size_t)n * sizeof *v);
    pdp__dev_free(c->device, dev);
    return st;
}

/* Do all c's ranks hold this rank's n values (n <= 16)? Each value's sum over the ranks
   (rounded to float; sum[k] gets it) against size x this rank's: the first `exact` values
   are integers and compare within 0.5, the others within 1e-4 relative (float sums in any
   order). *differs: the first value that does not agree, or -1. Collective over c. */
PDP__PRIVATE pdp_status pdp__comm_same_values(pdp_comm *c, const double *mine, float *sum, int n,
                                              int exact, int *differs)
{
    double size = (double)c->size, tol = PDP__MAX(1e-4, size * 1.2e-7);
    pdp_status st;
    int k;
    PDP_ASSERT(n <= 16);
    *differs = -1;
    for (k = 0; k < n; k++) sum[k] = (float)mine[k];
    if ((st = pdp__comm_sum_host(c, sum, n)) != PDP_OK) return st;
    for (k = 0; k < n && *differs < 0; k++)
        if (fabs((double)sum[k] - size * (double)(float)mine[k]) >
            (k < exact ? 0.5 : tol * size * fabs((double)(float)mine[k])))
            *differs = k;
    return PDP_OK;
}

PDP__PRIVATE pdp_status pdp__comm_agree(pdp_comm *c, pdp_status st, const char *fn)
{
    pdp__err_kept why; /* this rank's failure, and whether it was another rank's */
    float v[2];
    pdp_status ast;
    if (st != PDP_OK) pdp__err_keep(&why);
    v[0] = st != PDP_OK ? 1.0f : 0.0f;
    v[1] = st != PDP_OK ? (float)c->rank : 0.0f;
    ast = pdp__comm_sum_host(c, v, 2);
    if (st != PDP_OK) return pdp__err_restore(st, &why);
    if (ast != PDP_OK)
        return pdp__err_wrap(ast, "%s: rank %d: agreeing that every rank succeeded", fn, c->rank);
    if (v[0] >= 2.0f)
        return pdp__err_peer(PDP_ERR_COMM, "%s: rank %d: %d ranks of comm '%s' failed (see "
                             "their messages)", fn, c->rank, (int)v[0], c->name);
    if (v[0] >= 1.0f)
        return pdp__err_peer(PDP_ERR_COMM, "%s: rank %d: rank %d of comm '%s' failed (see its "
                             "message)", fn, c->rank, (int)v[1], c->name);
    return PDP_OK;
}

/* ---- comm: process groups ---- */

#define PDP__SPLIT_MAX_RANKS 4096 /* the (colour, key) table lives on the stack */

/* pdp_comm_split, with the new communicator's name (NULL: "<name of c>.<colour>"). */
PDP__PRIVATE pdp_status pdp__comm_split(pdp_comm *c, int colour, int key, const char *name,
                                        pdp_comm **out)
{
    static const char *fn = "pdp_comm_split";
    int table[2 * PDP__SPLIT_MAX_RANKS], r, new_rank = 0, new_size = 0, leader = -1;
    char dflt[PDP__COMM_NAME_CAP];
    pdp_status st;
    if (out) *out = NULL;
    if ((st = pdp__comm_check(c, fn))) return st;
    if (!out) return pdp__err(PDP_ERR_INVALID, "%s: out is NULL (comm '%s')", fn, c->name);
    if (colour < PDP_COMM_SPLIT_NONE)
        return pdp__err(PDP_ERR_INVALID, "%s: colour %d (comm '%s', rank %d): a colour is >= 0, "
                        "or PDP_COMM_SPLIT_NONE (-1) to join no group", fn, colour, c->name,
                        c->rank);
    if (c->size > PDP__SPLIT_MAX_RANKS)
        return pdp__err(PDP_ERR_UNSUPPORTED, "%s: comm '%s' has %d ranks; splits take at most %d",
                        fn, c->name, c->size, PDP__SPLIT_MAX_RANKS);
    /* every rank's (colour, key), through the communicator itself (bounded by its timeout) */
    for (r = 0; r < c->size; r++) {
        table[2 * r] = colour;
        table[2 * r + 1] = key;
        if ((st = pdp_comm_broadcast_bytes(c, &table[2 * r], 2 * sizeof(int), r)) != PDP_OK)
            return pdp__err_wrap(st, "%s: exchanging colours", fn);
    }
    /* place in the new group: order by (key, old rank) among the same colour */
    for (r = 0; r < c->size; r++) {
        int k = table[2 * r + 1];
        if (table[2 * r] != colour) continue;
        if (k < key || (k == key && r < c->rank)) new_rank++;
        new_size++;
    }
    for (r = 0; r < c->size && colour >= 0; r++) { /* the member that becomes rank 0 */
        int k = table[2 * r + 1], lk;
        if (table[2 * r] != colour) continue;
        lk = leader < 0 ? 0 : table[2 * leader + 1];
        if (leader < 0 || k < lk) leader = r;
    }
    if (!name) {
        snprintf(dflt, sizeof dflt, "%.40s.%d", c->name, colour);
        name = dflt;
    }
    if ((st = c->ops->split(c, colour, key, new_rank, new_size, leader, name, out)) != PDP_OK)
        st = pdp__err_wrap(st, "%s", fn);
    else if (*out)
        (*out)->trace_pid = c->trace_pid; /* the world's rank: one trace lane per rank */
    if (st == PDP_ERR_TIMEOUT) return st; /* c timed out: an agreement would wait as long */
    if ((st = pdp__comm_agree(c, st, fn)) != PDP_OK && *out) { /* a member is missing */
        pdp_comm_free(*out);
        *out = NULL;
    }
    return st;
}

PDP_API pdp_status pdp_comm_split(pdp_comm *c, int colour, int key, pdp_comm **out)
{
    return pdp__comm_split(c, colour, key, NULL, out);
}

/* ---- comm: process meshes ----
   Dimension k's group is one split of world: its colour is the group's first rank (this
   rank with c_k = 0), the same for the ranks that differ in c_k alone and different for
   every other group; its key is c_k, so the group ranks its members by c_k. Its name says
   the dimension and the coordinates its members share: "<world>.TP(DP 1, PP 0)". */

struct pdp_mesh {
    int ndim, rank;                          /* rank: in world */
    int size[PDP_MESH_MAX_DIMS], coord[PDP_MESH_MAX_DIMS], stride[PDP_MESH_MAX_DIMS];
    char name[PDP_MESH_MAX_DIMS][16];
    pdp_comm *group[PDP_MESH_MAX_DIMS];
};

/* snprintf at buf + *n, where *n counts what the line needs so far, fitting or not */
PDP__PRIVATE void pdp__mesh_put(char *buf, size_t bytes, size_t *n, const char *fmt, ...)
{
    va_list ap;
    int w;
    va_start(ap, fmt);
    w = vsnprintf(buf + (*n < bytes ? *n : bytes), *n < bytes ? bytes - *n : 0, fmt, ap);
    va_end(ap);
    *n += w > 0 ? (size_t)w : 0;
}

/* Dimension k's name: names[k], or "dim<k>" (written into own) for an unnamed one, in its
   groups' names and pdp_mesh_format's line alike. */
PDP__PRIVATE const char *pdp__mesh_dim_name(const char *const *names, int k, char own[16])
{
    if (names && names[k]) return names[k];
    snprintf(own, 16, "dim%d", k);
    return own;
}

/* Dimension k's group name into buf: world's name (its first 24 characters), the
   dimension's name, then the other dimensions' names and this rank's coordinates along
   them, "world.TP(DP 1, PP 0)"; an unnamed dimension j is "dim<j>" here. A name that bytes
   cannot hold would lose coordinates at its end, and two groups their difference: it is
   then "world.TP(first rank 4)", the group's first world rank (its split's colour). */
PDP__PRIVATE void pdp__mesh_group_name(char *buf, size_t bytes, const pdp_comm *world, int ndim,
                                       const char *const *names, const int *coord, int k,
                                       int first_rank)
{
    size_t n = 0, head;
    int j, first = 1;
    char own[16];
    pdp__mesh_put(buf, bytes, &n, "%.24s.%s", world->name, pdp__mesh_dim_name(names, k, own));
    head = n; /* "world.TP" */
    for (j = 0; j < ndim; j++) {
        if (j == k) continue;
        pdp__mesh_put(buf, bytes, &n, "%s%s %d", first ? "(" : ", ",
                      pdp__mesh_dim_name(names, j, own), coord[j]);
        first = 0;
    }
    if (!first) pdp__mesh_put(buf, bytes, &n, ")");
    if (n < bytes) return;
    n = head; /* 24 + 1 + 15 + 12 + 10 + 1 = 63 characters at most: it fits */
    pdp__mesh_put(buf, bytes, &n, "(first rank %d)", first_rank);
}

PDP_API pdp_status pdp_mesh_create(pdp_mesh **out, pdp_comm *world, int ndim, const int *sizes,
                                   const char *const *names)
{
    static const char *fn = "pdp_mesh_create";
    pdp_comm *group[PDP_MESH_MAX_DIMS] = {NULL};
    pdp_mesh *m = NULL;
    char dims[160] = ""; /* "DP 2 x PP 2 x TP 2", for the messages (cut if longer) */
    char gname[PDP__COMM_NAME_CAP];
    int coord[PDP_MESH_MAX_DIMS], stride[PDP_MESH_MAX_DIMS];
    double ranks = 1;
    pdp_status st = PDP_OK;
    size_t n = 0;
    int k, j;
    if (out) *out = NULL;
    if ((st = pdp__comm_check(world, fn))) return st;
    if (!out || !sizes)
        return pdp__err(PDP_ERR_INVALID, "%s: %s is NULL (comm '%s')", fn, out ? "sizes" : "out",
                        world->name);
    if (ndim < 1 || ndim > PDP_MESH_MAX_DIMS)
        return pdp__err(PDP_ERR_INVALID, "%s: %d dimensions; a mesh has 1..%d (comm '%s')", fn,
                        ndim, PDP_MESH_MAX_DIMS, world->name);
    for (k = 0; k < ndim; k++) {
        const char *name = names ? names[k] : NULL;
        if (name && (!*name || strlen(name) > 15))
            return pdp__err(PDP_ERR_INVALID, "%s: dimension %d's name '%.40s' has %zu characters; "
                            "a name has 1..15", fn, k, name, strlen(name));
        pdp__mesh_put(dims, sizeof dims, &n, "%s%s%s%d", k ? " x " : "", name ? name : "",
                      name ? " " : "", sizes[k]);
        ranks *= sizes[k];
    }
    for (k = 0; k < ndim; k++)
        if (sizes[k] < 1)
            return pdp__err(PDP_ERR_INVALID, "%s: %s: dimension %d has size %d; a size is >= 1", fn,
                            dims, k, sizes[k]);
    for (k = 1; names && k < ndim; k++) /* the groups' names and the line tell them apart */
        for (j = 0; j < k; j++) {
            char a[16], b[16];
            const char *nk = pdp__mesh_dim_name(names, k, a);
            if (!strcmp(nk, pdp__mesh_dim_name(names, j, b)))
                return pdp__err(PDP_ERR_INVALID, "%s: %s: dimensions %d and %d are both named "
                                "'%s'", fn, dims, j, k, nk);
        }
    if (ranks != (double)world->size)
        return pdp__err(PDP_ERR_INVALID, "%s: %s makes %.0f ranks, but comm '%s' has %d", fn,
                        dims, ranks, world->name, world->size);
    { /* every rank's sizes the same: their sums over the ranks are world->size times each
         rank's (exact in float: each sum is at most size^2 <= 2^24) */
        float sum[PDP_MESH_MAX_DIMS + 1];
        sum[0] = (float)ndim;
        for (k = 0; k < PDP_MESH_MAX_DIMS; k++) sum[k + 1] = k < ndim ? (float)sizes[k] : 0.0f;
        if ((st = pdp__comm_sum_host(world, sum, PDP_MESH_MAX_DIMS + 1)) != PDP_OK)
            return pdp__err_wrap(st, "%s: rank %d: comparing the ranks' sizes", fn, world->rank);
        for (k = 0; k <= ndim && st == PDP_OK; k++)
            if (sum[k] != (float)world->size * (k ? (float)sizes[k - 1] : (float)ndim))
                st = pdp__err(PDP_ERR_INVALID, "%s: rank %d: %s here, but not on every rank of "
                              "comm '%s' (every rank passes the same sizes)", fn, world->rank,
                              dims, world->name);
        if ((st = pdp__comm_agree(world, st, fn)) != PDP_OK) return st;
    }
    for (k = ndim - 1; k >= 0; k--) { /* row-major: the last dimension varies fastest */
        stride[k] = k == ndim - 1 ? 1 : stride[k + 1] * sizes[k + 1];
        coord[k] = world->rank / stride[k] % sizes[k];
    }
    for (k = ndim - 1; k >= 0 && st == PDP_OK; k--) { /* collective over world */
        int colour = world->rank - coord[k] * stride[k];
        pdp__mesh_group_name(gname, sizeof gname, world, ndim, names, coord, k, colour);
        if ((st = pdp__comm_split(world, colour, coord[k], gname, &group[k])))
            st = pdp__err_wrap(st, "%s: dimension %d's groups", fn, k);
    }
    if (st == PDP_OK && !(m = (pdp_mesh *)pdp__calloc(sizeof *m)))
        st = pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: rank %d: the mesh (comm '%s')", fn, world->rank,
                      world->name);
    if (st != PDP_ERR_TIMEOUT) /* after a timeout an agreement would wait as long */
        st = pdp__comm_agree(world, st, fn);
    if (st != PDP_OK) {
        for (k = 0; k < ndim; k++) pdp_comm_free(group[k]);
        pdp__dealloc(m);
        return st;
    }
    m->ndim = ndim;
    m->rank = world->rank;
    for (k = 0; k < ndim; k++) {
        char own[16];
        m->size[k] = sizes[k];
        m->stride[k] = stride[k];
        m->coord[k] = coord[k];
        m->group[k] = group[k];
        snprintf(m->name[k], sizeof m->name[k], "%s", pdp__mesh_dim_name(names, k, own));
    }
    *out = m;
    return PDP_OK;
}

PDP_API void pdp_mesh_free(pdp_mesh *m)
{
    if (!m) return;
    for (int k = 0; k < m->ndim; k++) pdp_comm_free(m->group[k]);
    pdp__dealloc(m);
}

PDP_API pdp_comm *pdp_mesh_group(const pdp_mesh *m, int dim)
{
    return m && dim >= 0 && dim < m->ndim ? m->group[dim] : NULL;
}

PDP_API int pdp_mesh_coord(const pdp_mesh *m, int dim)
{
    return m && dim >= 0 && dim < m->ndim ? m->coord[dim] : -1;
}

/* The world rank of member i of dimension k's group: this rank with c_k = i */
PDP__PRIVATE int pdp__mesh_member(const pdp_mesh *m, int k, int i)
{
    return m->rank + (i - m->coord[k]) * m->stride[k];
}

PDP_API int pdp_mesh_members(const pdp_mesh *m, int dim, int *ranks)
{
    if (!m || dim < 0 || dim >= m->ndim) return 0;
    for (int i = 0; ranks && i < m->size[dim]; i++) ranks[i] = pdp__mesh_member(m, dim, i);
    return m->size[dim];
}

PDP_API pdp_status pdp_mesh_format(const pdp_mesh *m, char *buf, size_t bytes)
{
    size_t n = 0;
    int k, i;
    if (!m || !buf)
        return pdp__err(PDP_ERR_INVALID, "pdp_mesh_format: %s is NULL", m ? "buf" : "m");
    pdp__mesh_put(buf, bytes, &n, "rank %d (", m->rank);
    for (k = 0; k < m->ndim; k++)
        pdp__mesh_put(buf, bytes, &n, "%s%s %d", k ? ", " : "", m->name[k], m->coord[k]);
    pdp__mesh_put(buf, bytes, &n, "):");
    for (k = 0; k < m->ndim; k++) { /* "  TP {4 5}" */
        pdp__mesh_put(buf, bytes, &n, "%s%s {", k ? "  " : " ", m->name[k]);
        for (i = 0; i < m->size[k]; i++)
            pdp__mesh_put(buf, bytes, &n, i ? " %d" : "%d", pdp__mesh_member(m, k, i));
        pdp__mesh_put(buf, bytes, &n, "}");
    }
    if (n >= bytes)
        return pdp__err(PDP_ERR_INVALID, "pdp_mesh_format: rank %d's line needs %zu bytes, buf "
                        "has %zu", m->rank, n + 1, bytes);
    return PDP_OK;
}

PDP_API pdp_status pdp_comm_broadcast_bytes(pdp_comm *c, void *buf, size_t bytes, int root)
{
    static const char *fn = "pdp_comm_broadcast_bytes";
    pdp_status st;
    if ((st = pdp__comm_check(c, fn)) || (st = pdp__comm_check_root(c, root, fn))) return st;
    if (bytes > 0 && !buf)
        return pdp__err(PDP_ERR_INVALID, "%s: buf is NULL with %zu bytes (comm '%s', rank %d)", fn,
                        bytes, c->name, c->rank);
    if (bytes > (size_t)PTRDIFF_MAX)
        return pdp__err(PDP_ERR_INVALID, "%s: %zu bytes exceed the address space (at most "
                        "PTRDIFF_MAX = %lld) (comm '%s', rank %d of %d)", fn, bytes,
                        (long long)PTRDIFF_MAX, c->name, c->rank, c->size);
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

/* Built from the head every backend fills (its defaults: pdp__comm_desc_timeout and
   each backend's create); log is not kept by a communicator. */
PDP_API pdp_comm_desc pdp_comm_get_desc(const pdp_comm *c)
{
    pdp_comm_desc d;
    memset(&d, 0, sizeof d);
    if (!c) return d;
    d.backend = c->backend;
    d.timeout_s = c->timeout_s;
    d.device = c->device;
    d.name = c->name;
    return d;
}

PDP_API void pdp_comm_get_stats(const pdp_comm *c, pdp_comm_stats *out)
{
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (c) *out = c->stats;
}

/* ---- comm: pdp_comm_init_env, the dispatcher ---- */

PDP_API pdp_status pdp_comm_init_env(pdp_comm **out, const pdp_comm_desc *desc)
{
    static const char *fn = "pdp_comm_init_env";
    pdp_backend b = desc ? desc->backend : PDP_BACKEND_DEFAULT;
    double timeout;
    pdp_status st;
    if (!out) return pdp__err(PDP_ERR_INVALID, "%s: out is NULL", fn);
    *out = NULL;
    /* the desc rule first, so that every build checks it, whatever the backend */
    if ((st = pdp__comm_desc_timeout(desc, &timeout, fn)) != PDP_OK) return st;
    switch (b) {
    case PDP_BACKEND_MPI: return pdp__comm_init_mpi_env(out, desc);
    case PDP_BACKEND_NCCL: return pdp__comm_init_nccl_env(out, desc);
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
