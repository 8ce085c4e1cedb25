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
   every entry point fails with PDP_ERR_UNSUPPORTED naming the macro. */

#include "internal.h"

/* the same text as cuda_host.c's (an identical redefinition is valid C) */
#define PDP__NO_CUDA_MSG "built without PDP_CUDA (compile with -DPDP_CUDA and link pdp_cuda.o)"

#ifndef PDP_CUDA
static pdp_status pdp__comm_init_nccl_env(pdp_comm **out, const pdp_comm_desc *desc)
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
    char name[32];
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
} pdp__nccl_work;

typedef struct pdp__nccl_comm {
    pdp_comm head;
    pdp_cudak_nccl *h;
    float *barrier_buf;     /* one float on the device */
    int next;               /* the pool entry of the next collective */
    int64_t seq;
    bool traced;
    int trace_tid;          /* 0: not traced */
    pdp__nccl_work pool[PDP_CUDAK_NCCL_SLOTS];
} pdp__nccl_comm;

/* kind names the collective through internal.h's pdp__op_names, whose first four
   entries follow pdp_cudak_coll's order. */
static pdp_status pdp__nccl_issue(pdp_comm *c, pdp_cudak_coll kind, const float *send,
                                  float *recv, int64_t count, int op, pdp_work **w)
{
    pdp__nccl_comm *nc = (pdp__nccl_comm *)c->impl;
    pdp__nccl_work *wk;
    int slot;
    pdp_status st;
    /* the pool entry k shares event slot k: a handle is free again once waited */
    wk = &nc->pool[nc->next];
    if (wk->busy)
        return pdp__err(PDP_ERR_STATE, "%d collectives in flight on comm '%s' (rank %d): wait on "
                        "some before issuing more", PDP_CUDAK_NCCL_SLOTS, c->name, c->rank);
    if ((st = pdp_cudak_nccl_launch(nc->h, kind, send, recv, count, op, &slot)) != PDP_OK)
        return pdp__err(st, "%s #%lld (count %lld) on comm '%s', rank %d of %d: pdp_cuda: %s",
                        pdp__op_names[kind], (long long)nc->seq, (long long)count, c->name,
                        c->rank, c->size, pdp_cudak_error());
    PDP_ASSERT(slot == nc->next);
    nc->next = (nc->next + 1) % PDP_CUDAK_NCCL_SLOTS;
    wk->busy = true;
    wk->slot = slot;
    wk->head.comm = c;
    wk->head.op_name = pdp__op_names[kind];
    wk->head.seq = nc->seq++;
    wk->head.t_start = pdp__now();
    wk->head.t_done = 0.0;
    *w = &wk->head;
    return PDP_OK;
}

static pdp_status pdp__nccl_allreduce(pdp_comm *c, float *buf, int64_t count, pdp_reduce_op op,
                                      pdp_work **w)
{
    return pdp__nccl_issue(c, PDP_CUDAK_ALLREDUCE, buf, buf, count, op == PDP_REDUCE_AVG, w);
}

static pdp_status pdp__nccl_broadcast(pdp_comm *c, float *buf, int64_t count, int root,
                                      pdp_work **w)
{
    return pdp__nccl_issue(c, PDP_CUDAK_BROADCAST, buf, buf, count, root, w);
}

static pdp_status pdp__nccl_reduce_scatter(pdp_comm *c, const float *send, float *recv,
                                           int64_t recv_count, pdp_reduce_op op, pdp_work **w)
{
    return pdp__nccl_issue(c, PDP_CUDAK_REDUCE_SCATTER, send, recv, recv_count,
                           op == PDP_REDUCE_AVG, w);
}

static pdp_status pdp__nccl_allgather(pdp_comm *c, const float *send, float *recv,
                                      int64_t send_count, pdp_work **w)
{
    return pdp__nccl_issue(c, PDP_CUDAK_ALLGATHER, send, recv, send_count, 0, w);
}

static pdp_status pdp__nccl_barrier(pdp_comm *c, pdp_work **w)
{
    pdp__nccl_comm *nc = (pdp__nccl_comm *)c->impl;
    return pdp__nccl_issue(c, PDP_CUDAK_ALLREDUCE, nc->barrier_buf, nc->barrier_buf, 1, 0, w);
}

static pdp_status pdp__nccl_broadcast_bytes(pdp_comm *c, void *buf, size_t bytes, int root)
{
    pdp__nccl_comm *nc = (pdp__nccl_comm *)c->impl;
    pdp_status st = pdp_cudak_nccl_broadcast_bytes(nc->h, buf, bytes, root, c->timeout_s);
    if (bytes) nc->next = (nc->next + 1) % PDP_CUDAK_NCCL_SLOTS; /* it used one event slot */
    if (st != PDP_OK)
        return pdp__err(st, "broadcast of %zu bytes from rank %d on comm '%s', rank %d of %d: "
                        "pdp_cuda: %s", bytes, root, c->name, c->rank, c->size, pdp_cudak_error());
    return PDP_OK;
}

static pdp_status pdp__nccl_wait(pdp_work *w)
{
    pdp__nccl_work *wk = (pdp__nccl_work *)w;
    pdp_comm *c = w->comm;
    pdp__nccl_comm *nc = (pdp__nccl_comm *)c->impl;
    pdp_status st = pdp_cudak_nccl_wait(nc->h, wk->slot, c->timeout_s);
    w->t_done = pdp__now();
    wk->busy = false;
    if (st != PDP_OK)
        return pdp__err(st, "%s #%lld on comm '%s', rank %d of %d: pdp_cuda: %s", w->op_name,
                        (long long)w->seq, c->name, c->rank, c->size, pdp_cudak_error());
    if (nc->trace_tid) {
        char args[64];
        snprintf(args, sizeof args, "\"seq\":%lld", (long long)w->seq);
        pdp__trace_async(c->rank, nc->trace_tid, "comm", w->op_name, (uint64_t)w->seq, w->t_start, w->t_done,
                         args);
    }
    return PDP_OK;
}

static bool pdp__nccl_done(pdp_work *w)
{
    pdp__nccl_work *wk = (pdp__nccl_work *)w;
    pdp__nccl_comm *nc = (pdp__nccl_comm *)w->comm->impl;
    return pdp_cudak_nccl_query(nc->h, wk->slot) != 0;
}

static void pdp__nccl_destroy(pdp_comm *c)
{
    pdp__nccl_comm *nc = (pdp__nccl_comm *)c->impl;
    pdp_cudak_free(c->device.ordinal, nc->barrier_buf);
    pdp_cudak_nccl_free(nc->h, 0);
    if (nc->traced) pdp__trace_close();
    pdp__dealloc(nc);
}

/* Point-to-point and split are not on the NCCL backend yet (ncclSend/ncclRecv in a
   group, ncclCommSplit): they fail with PDP_ERR_UNSUPPORTED naming the operation. */
static pdp_status pdp__nccl_send(pdp_comm *c, const float *buf, int64_t count, int peer, int tag,
                                 pdp_work **w)
{
    (void)buf, (void)count, (void)peer, (void)tag, (void)w;
    return pdp__err(PDP_ERR_UNSUPPORTED, "send on comm '%s' (rank %d): point-to-point is not "
                    "implemented on the NCCL backend yet (local and MPI have it)", c->name,
                    c->rank);
}

static pdp_status pdp__nccl_recv(pdp_comm *c, float *buf, int64_t count, int peer, int tag,
                                 pdp_work **w)
{
    (void)buf, (void)count, (void)peer, (void)tag, (void)w;
    return pdp__err(PDP_ERR_UNSUPPORTED, "recv on comm '%s' (rank %d): point-to-point is not "
                    "implemented on the NCCL backend yet (local and MPI have it)", c->name,
                    c->rank);
}

static pdp_status pdp__nccl_split(pdp_comm *c, int colour, int key, int new_rank, int new_size,
                                  int leader, pdp_comm **out)
{
    (void)colour, (void)key, (void)new_rank, (void)new_size, (void)leader, (void)out;
    return pdp__err(PDP_ERR_UNSUPPORTED, "split of comm '%s' (rank %d): not implemented on the "
                    "NCCL backend yet (local and MPI have it)", c->name, c->rank);
}

static const pdp__comm_ops pdp__nccl_ops = {
    pdp__nccl_allreduce, pdp__nccl_broadcast, pdp__nccl_reduce_scatter, pdp__nccl_allgather,
    pdp__nccl_barrier,   pdp__nccl_broadcast_bytes, pdp__nccl_send,     pdp__nccl_recv,
    pdp__nccl_split,     pdp__nccl_wait,      pdp__nccl_done,           pdp__nccl_destroy};

/* Wraps an initialised handle h (taken over, freed on failure) as rank of size. */
static pdp_status pdp__nccl_wrap(pdp_comm **out, pdp_cudak_nccl *h, int dev, int rank, int size,
                                 double timeout_s, const char *name, bool process_rank,
                                 const char *fn)
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
    if (pdp__trace_open(process_rank && size > 1 ? rank : -1) == PDP_OK) {
        nc->traced = true;
        if (pdp__trace_enabled()) {
            char track[48];
            snprintf(track, sizeof track, "comm %s (nccl)", nc->head.name);
            nc->trace_tid = pdp__trace_track(rank, track);
        }
    }
    *out = &nc->head;
    return PDP_OK;
}

/* pdp_comm_init_env for PDP_BACKEND_NCCL: one process per GPU. The unique id
   travels through rendezvous.c; the store stays open until ncclCommInitRank
   (collective) has returned on this rank. */
static pdp_status pdp__comm_init_nccl_env(pdp_comm **out, const pdp_comm_desc *desc)
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
    st = pdp__nccl_wrap(out, h, dev, env.rank, env.world_size, timeout,
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
        return pdp__nccl_wrap(out, h, g->devices[rank].ordinal, rank, g->n, g->timeout_s, g->name,
                              false, fn);
    }
#else
    return pdp__err(PDP_ERR_UNSUPPORTED, "%s: " PDP__NO_CUDA_MSG, fn);
#endif
}
