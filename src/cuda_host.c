/* cuda_host: the host side of CUDA devices. Routes device memory, the losses, the
   optimizer updates and the NCCL
   communicator to the plain C functions of pdp_cuda.cu (declared in cuda.h)
   when built with PDP_CUDA; without it, every CUDA request fails with
   PDP_ERR_UNSUPPORTED naming the macro, and the CPU paths are untouched.

   Errors: a pdp_cudak_* function that fails leaves "<call> failed: <name>
   (<text>) at pdp_cuda.cu:<line>" in its own thread-local buffer; this module
   copies it into pdp's message as "pdp_cuda: ..." and the public caller
   prefixes its name and the layer ("pdp_model_forward: layer 0 (Linear):
   pdp_cuda: cublasSgemm failed: CUBLAS_STATUS_... at pdp_cuda.cu:123").

   The NCCL communicator is a pdp__comm_ops backend like local and mpi: its
   handles come from a fixed pool (one per completion-event slot), so a step
   allocates nothing; a collective is launched on the NCCL stream after an
   event recorded on the compute stream, and pdp_work_wait polls it against the
   communicator's timeout (pdp_cuda.cu aborts the NCCL communicator on failure).
   Process ranks rendezvous through the TCP store (store.c): rank 0 makes the
   unique id and sets "pdp/nccl_id", the others get it. */

#include "internal.h"

#define PDP__NO_CUDA_MSG "built without PDP_CUDA (compile with -DPDP_CUDA and link pdp_cuda.o)"

#ifdef PDP_CUDA
/* ---- cuda_host: errors ---- */

/* Turns a failed pdp_cudak_* status into pdp's message. */
static pdp_status pdp__cuda_fail(pdp_status st)
{
    return pdp__err(st, "pdp_cuda: %s", pdp_cudak_error());
}

#define PDP__CUDA_TRY(call)                                                  \
    do {                                                                     \
        pdp_status pdp__cst = (call);                                        \
        if (pdp__cst != PDP_OK) return pdp__cuda_fail(pdp__cst);             \
    } while (0)

static int pdp__cuda_ordinal(pdp_device d) { return d.kind == PDP_DEVICE_CPU ? -1 : d.ordinal; }
#endif

/* ---- cuda_host: memory ---- */

static pdp_status pdp__dev_alloc(pdp_device d, size_t bytes, void **out)
{
    *out = NULL;
    if (d.kind == PDP_DEVICE_CPU) {
        *out = pdp__alloc(bytes);
        return *out ? PDP_OK : pdp__err(PDP_ERR_OUT_OF_MEMORY, "no memory for %zu bytes", bytes);
    }
#ifdef PDP_CUDA
    PDP__CUDA_TRY(pdp_cudak_malloc(d.ordinal, bytes ? bytes : 1, out));
    return PDP_OK;
#else
    return pdp__err(PDP_ERR_UNSUPPORTED, "CUDA device %d: " PDP__NO_CUDA_MSG, d.ordinal);
#endif
}

static void pdp__dev_free(pdp_device d, void *p)
{
    if (d.kind == PDP_DEVICE_CPU) pdp__dealloc(p);
#ifdef PDP_CUDA
    else pdp_cudak_free(d.ordinal, p);
#endif
}

static pdp_status pdp__dev_memset0(pdp_device d, void *p, size_t bytes)
{
    if (d.kind == PDP_DEVICE_CPU) {
        memset(p, 0, bytes);
        return PDP_OK;
    }
#ifdef PDP_CUDA
    PDP__CUDA_TRY(pdp_cudak_memset0(d.ordinal, p, bytes));
    return PDP_OK;
#else
    return pdp__err(PDP_ERR_UNSUPPORTED, "CUDA device %d: " PDP__NO_CUDA_MSG, d.ordinal);
#endif
}

static pdp_status pdp__dev_fill(pdp_device d, float *p, int64_t count, float value)
{
    if (d.kind == PDP_DEVICE_CPU) {
        PDP__FOR_BLOCKED(i, count, p[i] = value;);
        return PDP_OK;
    }
#ifdef PDP_CUDA
    PDP__CUDA_TRY(pdp_cudak_fill(d.ordinal, p, count, value));
    return PDP_OK;
#else
    return pdp__err(PDP_ERR_UNSUPPORTED, "CUDA device %d: " PDP__NO_CUDA_MSG, d.ordinal);
#endif
}

static pdp_status pdp__dev_copy(pdp_device dst_dev, void *dst, pdp_device src_dev, const void *src,
                                size_t bytes)
{
    if (dst_dev.kind == PDP_DEVICE_CPU && src_dev.kind == PDP_DEVICE_CPU) {
        if (dst != src) memmove(dst, src, bytes);
        return PDP_OK;
    }
#ifdef PDP_CUDA
    PDP__CUDA_TRY(pdp_cudak_memcpy(pdp__cuda_ordinal(dst_dev), dst, pdp__cuda_ordinal(src_dev), src,
                                   bytes));
    return PDP_OK;
#else
    return pdp__err(PDP_ERR_UNSUPPORTED, "CUDA device %d: " PDP__NO_CUDA_MSG,
                    dst_dev.kind == PDP_DEVICE_CPU ? src_dev.ordinal : dst_dev.ordinal);
#endif
}

static pdp_status pdp__dev_add(pdp_device d, float *PDP__RESTRICT dst,
                               const float *PDP__RESTRICT src, int64_t count)
{
    if (d.kind == PDP_DEVICE_CPU) {
        PDP__FOR_BLOCKED(i, count, dst[i] += src[i];);
        return PDP_OK;
    }
#ifdef PDP_CUDA
    PDP__CUDA_TRY(pdp_cudak_add(d.ordinal, dst, src, count));
    return PDP_OK;
#else
    return pdp__err(PDP_ERR_UNSUPPORTED, "CUDA device %d: " PDP__NO_CUDA_MSG, d.ordinal);
#endif
}

/* ---- cuda_host: public device functions ---- */

PDP_API pdp_status pdp_cuda_device_count(int *count)
{
    if (!count) return pdp__err(PDP_ERR_INVALID, "pdp_cuda_device_count: count is NULL");
    *count = 0;
#ifdef PDP_CUDA
    {
        pdp_status st = pdp_cudak_device_count(count);
        if (st != PDP_OK)
            return pdp__err(st, "pdp_cuda_device_count: pdp_cuda: %s", pdp_cudak_error());
        return PDP_OK;
    }
#else
    return pdp__err(PDP_ERR_UNSUPPORTED, "pdp_cuda_device_count: " PDP__NO_CUDA_MSG);
#endif
}

PDP_API pdp_status pdp_cuda_set_tf32(bool on)
{
#ifdef PDP_CUDA
    pdp_cudak_set_tf32(on ? 1 : 0);
    return PDP_OK;
#else
    (void)on;
    return pdp__err(PDP_ERR_UNSUPPORTED, "pdp_cuda_set_tf32: " PDP__NO_CUDA_MSG);
#endif
}

/* The common check of the public functions that take a CUDA device. */
static pdp_status pdp__cuda_check_device(pdp_device d, const char *fn)
{
    if (d.kind != PDP_DEVICE_CUDA)
        return pdp__err(PDP_ERR_DEVICE, "%s: device kind %d is not CUDA", fn, (int)d.kind);
#ifdef PDP_CUDA
    return PDP_OK;
#else
    return pdp__err(PDP_ERR_UNSUPPORTED, "%s: CUDA device %d: " PDP__NO_CUDA_MSG, fn, d.ordinal);
#endif
}

PDP_API pdp_status pdp_cuda_synchronize(pdp_device d)
{
    pdp_status st;
    if ((st = pdp__cuda_check_device(d, "pdp_cuda_synchronize")) != PDP_OK) return st;
#ifdef PDP_CUDA
    if ((st = pdp_cudak_synchronize(d.ordinal)) != PDP_OK)
        return pdp__err(st, "pdp_cuda_synchronize: pdp_cuda: %s", pdp_cudak_error());
#endif
    return PDP_OK;
}

PDP_API pdp_status pdp_cuda_memory_stats_get(pdp_device d, pdp_cuda_memory_stats *out)
{
    pdp_status st;
    if (!out) return pdp__err(PDP_ERR_INVALID, "pdp_cuda_memory_stats_get: out is NULL");
    memset(out, 0, sizeof *out);
    if ((st = pdp__cuda_check_device(d, "pdp_cuda_memory_stats_get")) != PDP_OK) return st;
#ifdef PDP_CUDA
    if ((st = pdp_cudak_memory_stats(d.ordinal, &out->device_mallocs, &out->reserved_bytes,
                                     &out->in_use_bytes)) != PDP_OK)
        return pdp__err(st, "pdp_cuda_memory_stats_get: pdp_cuda: %s", pdp_cudak_error());
#endif
    return PDP_OK;
}

PDP_API pdp_status pdp_cuda_empty_cache(pdp_device d)
{
    pdp_status st;
    if ((st = pdp__cuda_check_device(d, "pdp_cuda_empty_cache")) != PDP_OK) return st;
#ifdef PDP_CUDA
    if ((st = pdp_cudak_empty_cache(d.ordinal)) != PDP_OK)
        return pdp__err(st, "pdp_cuda_empty_cache: pdp_cuda: %s", pdp_cudak_error());
#endif
    return PDP_OK;
}

/* ---- cuda_host: losses ----
   The same contract as loss.c's pdp__cross_entropy, logits and dlogits on
   device d: labels (host memory) are checked here in sample order, the device
   computes per-sample losses, and the host sums them in sample order. */

static pdp_status pdp__cuda_cross_entropy(pdp_device d, const float *logits, const int32_t *labels,
                                          int64_t batch, int64_t classes, float grad_scale,
                                          double *loss_sum, float *dlogits, const char *fn)
{
#ifdef PDP_CUDA
    double *loss = (double *)pdp__thread_scratch((size_t)batch * sizeof(double)), total = 0.0;
    int64_t i;
    pdp_status st;
    *loss_sum = 0.0;
    if (!loss) return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory for %lld losses", fn,
                               (long long)batch);
    for (i = 0; i < batch; i++)
        if (labels[i] < 0 || labels[i] >= classes)
            return pdp__err(PDP_ERR_INVALID, "%s: label %ld at sample %lld is outside [0, %lld)",
                            fn, (long)labels[i], (long long)i, (long long)classes);
    if ((st = pdp_cudak_cross_entropy(d.ordinal, logits, labels, batch, classes, grad_scale, loss,
                                      dlogits)) != PDP_OK)
        return pdp__err(st, "%s: pdp_cuda: %s", fn, pdp_cudak_error());
    for (i = 0; i < batch; i++) {
        if (loss[i] != loss[i] || loss[i] == HUGE_VAL || loss[i] == -HUGE_VAL) {
            *loss_sum = loss[i];
            return pdp__err(PDP_ERR_NUMERIC, "%s: loss is %s at sample %lld", fn,
                            loss[i] != loss[i] ? "NaN" : "Inf", (long long)i);
        }
        total += loss[i];
    }
    *loss_sum = total;
    return PDP_OK;
#else
    (void)logits, (void)labels, (void)batch, (void)classes, (void)grad_scale, (void)dlogits;
    *loss_sum = 0.0;
    return pdp__err(PDP_ERR_UNSUPPORTED, "%s: CUDA device %d: " PDP__NO_CUDA_MSG, fn, d.ordinal);
#endif
}

/* Sum of squared differences (double) and dpred = scale (pred - target), on d. */
static pdp_status pdp__cuda_mse(pdp_device d, const float *pred, const float *target,
                                int64_t count, float scale, double *sum, float *dpred,
                                const char *fn)
{
#ifdef PDP_CUDA
    pdp_status st;
    if ((st = pdp_cudak_mse(d.ordinal, pred, target, count, scale, sum, dpred)) != PDP_OK)
        return pdp__err(st, "%s: pdp_cuda: %s", fn, pdp_cudak_error());
    return PDP_OK;
#else
    (void)pred, (void)target, (void)count, (void)scale, (void)dpred;
    *sum = 0.0;
    return pdp__err(PDP_ERR_UNSUPPORTED, "%s: CUDA device %d: " PDP__NO_CUDA_MSG, fn, d.ordinal);
#endif
}

/* ---- cuda_host: gradient clipping (optim.c's pdp_clip_grad_norm) ---- */

static pdp_status pdp__cuda_sumsq(pdp_device d, const float *x, int64_t count, double *sum,
                                  const char *fn)
{
#ifdef PDP_CUDA
    pdp_status st;
    if ((st = pdp_cudak_sumsq(d.ordinal, x, count, sum)) != PDP_OK)
        return pdp__err(st, "%s: pdp_cuda: %s", fn, pdp_cudak_error());
    return PDP_OK;
#else
    (void)x, (void)count;
    *sum = 0.0;
    return pdp__err(PDP_ERR_UNSUPPORTED, "%s: CUDA device %d: " PDP__NO_CUDA_MSG, fn, d.ordinal);
#endif
}

static pdp_status pdp__cuda_scale(pdp_device d, float *x, int64_t count, float s, const char *fn)
{
#ifdef PDP_CUDA
    pdp_status st;
    if ((st = pdp_cudak_scale(d.ordinal, x, count, s)) != PDP_OK)
        return pdp__err(st, "%s: pdp_cuda: %s", fn, pdp_cudak_error());
    return PDP_OK;
#else
    (void)x, (void)count, (void)s;
    return pdp__err(PDP_ERR_UNSUPPORTED, "%s: CUDA device %d: " PDP__NO_CUDA_MSG, fn, d.ordinal);
#endif
}

/* ---- cuda_host: optimizer updates (optim.c's scalars, math.h's formulas) ---- */

static pdp_status pdp__cuda_optim_update(pdp_device d, const struct pdp__optim_scalars *s,
                                         float *p, const float *g, float *s0, float *s1, int64_t n)
{
#ifdef PDP_CUDA
    if (s->kind == PDP_OPTIM_SGD)
        PDP__CUDA_TRY(pdp_cudak_sgd(d.ordinal, p, g, s0, n, s->lr, s->momentum, s->one_minus_damp,
                                    s->weight_decay, s->nesterov, s->first));
    else
        PDP__CUDA_TRY(pdp_cudak_adam(d.ordinal, p, g, s0, s1, n, s->beta1, s->one_minus_beta1,
                                     s->beta2, s->one_minus_beta2, s->step_size, s->bc2_sqrt,
                                     s->eps, s->l2, s->decay));
    return PDP_OK;
#else
    (void)s, (void)p, (void)g, (void)s0, (void)s1, (void)n;
    return pdp__err(PDP_ERR_UNSUPPORTED, "CUDA device %d: " PDP__NO_CUDA_MSG, d.ordinal);
#endif
}

/* ---- cuda_host: the NCCL communicator ---- */

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

/* kind names the collective through comm.c's pdp__op_names, whose first four
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

static const pdp__comm_ops pdp__nccl_ops = {
    pdp__nccl_allreduce, pdp__nccl_broadcast, pdp__nccl_reduce_scatter, pdp__nccl_allgather,
    pdp__nccl_barrier,   pdp__nccl_broadcast_bytes, pdp__nccl_wait,     pdp__nccl_done,
    pdp__nccl_destroy};

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

/* pdp_comm_init_env for PDP_BACKEND_NCCL: one process per GPU. */
static pdp_status pdp__comm_init_nccl_env(pdp_comm **out, const pdp_comm_desc *desc)
{
    static const char *fn = "pdp_comm_init_env";
    pdp_env_info env;
    pdp_store_desc sd;
    pdp_store *store = NULL;
    pdp_cudak_nccl *h = NULL;
    unsigned char id[PDP_CUDAK_NCCL_ID_BYTES];
    double timeout = desc && desc->timeout_s > 0 ? desc->timeout_s : 300.0;
    const char *port_env;
    int dev;
    pdp_status st;
    *out = NULL;
    if ((st = pdp_env_read(&env)) != PDP_OK) return pdp__err_wrap(st, "%s", fn);
    /* the rank's GPU: desc->device when it names one, else LOCAL_RANK */
    dev = desc && desc->device.kind == PDP_DEVICE_CUDA ? desc->device.ordinal : env.local_rank;
    memset(&sd, 0, sizeof sd);
    sd.host = env.master_addr;
    sd.port = env.master_port;
    /* torchrun's own store holds MASTER_PORT; ours takes the next port */
    if (getenv("TORCHELASTIC_RUN_ID")) sd.port = env.master_port + 1;
    if ((port_env = getenv("PDP_STORE_PORT")) && *port_env) sd.port = atoi(port_env);
    sd.is_server = env.rank == 0;
    sd.world_size = env.world_size;
    sd.timeout_s = timeout;
    memset(id, 0, sizeof id);
    if (env.world_size > 1) {
        if ((st = pdp_store_create(&store, &sd)) != PDP_OK)
            return pdp__err_wrap(st, "%s: NCCL rank %d of %d: the TCP store", fn, env.rank,
                                 env.world_size);
    }
    if (env.rank == 0) {
        if ((st = pdp_cudak_nccl_unique_id(dev, id)) != PDP_OK) {
            st = pdp__err(st, "%s: rank 0: pdp_cuda: %s", fn, pdp_cudak_error());
            goto done;
        }
        if (store && (st = pdp_store_set(store, "pdp/nccl_id", id, sizeof id)) != PDP_OK) {
            st = pdp__err_wrap(st, "%s: rank 0 publishing the NCCL id", fn);
            goto done;
        }
    } else if ((st = pdp_store_get(store, "pdp/nccl_id", id, sizeof id, NULL)) != PDP_OK) {
        st = pdp__err_wrap(st, "%s: rank %d of %d waiting for the NCCL id from rank 0", fn,
                           env.rank, env.world_size);
        goto done;
    }
    /* everyone holds the id before rank 0's store may go away */
    if (store && (st = pdp_store_barrier(store, "pdp/nccl_id_read", env.world_size, timeout)) !=
                     PDP_OK) {
        st = pdp__err_wrap(st, "%s: rank %d of %d", fn, env.rank, env.world_size);
        goto done;
    }
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

PDP_API pdp_status pdp_nccl_group_create(pdp_nccl_group **out, int ndev, const pdp_device *devices,
                                         const pdp_comm_desc *desc)
{
    static const char *fn = "pdp_nccl_group_create";
    int i;
    if (!out) return pdp__err(PDP_ERR_INVALID, "%s: out is NULL", fn);
    *out = NULL;
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
        g->timeout_s = desc && desc->timeout_s > 0 ? desc->timeout_s : 300.0;
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
    (void)desc;
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
