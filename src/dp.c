/* dp: DataParallel over persistent worker threads, parameter-server style.

   This is torch.nn.DataParallel (Li et al., "PyTorch Distributed", VLDB 2020,
   section 2; torch/nn/parallel/data_parallel.py) written so that each stage is
   one function: pdp__dp_replicate, pdp__dp_scatter, pdp__dp_parallel_apply,
   pdp__dp_gather, pdp__dp_reduce, pdp__dp_master_step. The master (device 0)
   sends parameters and shards, receives outputs and gradients, holds the
   optimizer state and runs the update: every byte passes through it, which is
   why the literature calls DP a parameter-server design that overloads device
   0, and why DDP (ddp.c) replaces the gather-reduce-step-replicate round trip
   with an all-reduce among equals.

   Threads. One worker per replica ("one host thread per device"): workers
   1..N-1 are persistent threads created by pdp_dp_create and reused by every
   step; worker 0, which runs the master's replica and the first slice of the
   reduce, is the calling thread itself. The workers are a pdp__team (threads.c),
   the hand-off the intra-op pool uses too: pdp__dp_run_job publishes the job as
   a new generation, runs worker 0's part, and returns when every worker has run
   its part; both sides spin a while before they sleep. Shards are written
   before the hand-off and results read after it, so the team's mutex orders
   every read (TSan clean). Each worker sets its own intra-op thread count
   (threads_per_worker, default 1), since that setting is per thread; the caller
   switches to it for its part and back.

   Invariants. (1) Shards are balanced and contiguous: replica i gets
   B/N + (i < B%N) samples starting after replica i-1's, so idle replicas
   (B < N) are always the last ones. (2) Replica i's loss gradient is scaled by
   1/B (the global batch), so the SUM of the replicas' gradients is the
   gradient of the global mean loss. (3) The reduce adds, for every element,
   g0 + g1 + g2 + ... in replica order whatever thread runs the slice, so the
   result does not depend on the slicing or on timing. (4) Dropout masks are
   keyed by (seed, layer, step, global sample index): before each forward a
   replica gets the master's step and sample_base = its first global sample,
   which positions it in the one counter-based random stream exactly where a
   single device would be - one seeded stream per replica, whose union is the
   single-device stream. Hence N workers reproduce one device on the same
   global batch to float rounding, and one worker reproduces it bit for bit.
   (5) After the first step at the largest batch nothing is allocated and no
   thread is created.

   Choices, and where they differ from PyTorch. torch's parallel_apply starts a
   thread per replica and the caller waits; here the master's shard runs on the
   calling thread itself: a caller that only dispatches and waits is one more
   thread to wake twice a step, competing with the workers for the cores (with 2
   workers on 2 cores, the MLP at batch 128 lost 0.3-0.5 ms of a 3.5 ms step to
   those hand-offs; bench/dp measures the step against its bound).
   torch.chunk gives every replica ceil(B/N) samples and the last one the rest;
   balanced shards keep the slowest replica, which sets the step time, at most
   one sample above the others. torch reduces on device 0 (reduce_add); on a
   CPU that would leave N-1 cores idle, so by default each worker sums one slice
   of the flat gradient (reduce_on_master restores torch's placement, with the
   same bits). On CPU replicas the master's step is fused into that reduce: each
   worker updates the parameters of the slice it has just summed, chunk by chunk
   while the chunk is in cache, instead of one thread stepping everything while
   the others wait (pdp__dp_fused_step).

   GPUs. With CUDA devices the stages are torch's own: replicate copies the
   master's parameters (device 0) into each replica's own parameter block on its
   device (a peer copy; a device-local copy for a replica on device 0); scatter
   copies each shard's rows to its replica's device (host -> device i or device
   0 -> device i) unless they already live there; each worker thread drives its
   GPU (pdp_cuda.cu makes the thread's device current on every call), so the
   apply of N GPUs runs at once; gather peer-copies the outputs to device 0; and
   reduce, on the calling thread, peer-copies replica r's gradients into one
   staging block on device 0 (allocated at create) and adds them into the
   master's, r = 1, 2, ... in order - torch's reduce_add. A replica on device 0
   is added straight from its own block. Several workers may share a GPU (more
   workers than devices): each has its own replica and buffers, their kernels
   interleave on that device's stream. All devices are CUDA or none is; without
   PDP_CUDA, CUDA devices fail with PDP_ERR_UNSUPPORTED naming the macro. */

#include "internal.h"

/* ---- dp: the object ---- */

typedef enum pdp__dp_job {
    PDP__DP_JOB_NONE = 0,
    PDP__DP_JOB_APPLY,   /* forward, loss, backward on this worker's shard */
    PDP__DP_JOB_REDUCE   /* sum one slice of the replicas' gradients into the master (and
                            step it, when step_opt is set) */
} pdp__dp_job;

typedef struct pdp__dp_worker {
    pdp_dp *dp;
    int index;
    pdp_device device;
    pdp_model *replica;  /* index 0: the master itself */
    /* written by scatter (caller), read by the worker */
    int64_t first, rows; /* global samples [first, first + rows) */
    pdp_tensor x;        /* those rows of the batch (a view, or xbuf on another device) */
    float *xbuf;         /* [cap_xbuf] the rows when the batch lives on another device */
    int64_t cap_xbuf;    /* floats */
    const int32_t *labels;
    float *dlogits;      /* [cap_rows, classes] loss gradient, on the replica's device */
    int64_t cap_rows;
    /* written by the worker, read by the caller after the handoff */
    double loss_sum;
    double apply_s;      /* wall seconds of this worker's apply */
    double cpu_s;        /* CPU seconds of this worker's last job */
    pdp_status status;
    char msg[512];
} pdp__dp_worker;

struct pdp_dp {
    pdp_model *master;
    pdp_dp_desc desc;    /* defaults filled (pdp__dp_desc_defaults); devices: a copy */
    pdp_device *devices; /* [n] the desc's devices, NULL when it gave none */
    int n;
    int threads_per_worker;
    bool copy_params;
    bool reduce_on_master;
    bool cuda;           /* the replicas are on CUDA devices */
    float *stage;        /* [param_count] on the master's device: one replica's gradients
                            in flight to the reduce (CUDA, replicas on other devices) */
    int64_t classes;     /* the output's last dimension: classes, or a GPT's vocabulary */
    int64_t positions;   /* label rows a sample: 1 ([B, classes]), T ([B, T, vocab]) */
    int64_t per_sample;  /* output floats a sample: positions x classes */
    int out_ndim;        /* a sample's output: 1 or 2 dimensions */
    int64_t out_shape[2];
    int64_t counted;     /* labels of this step's batch that count (not -1) */
    pdp__dp_worker *workers;
    pdp__team team;      /* members 1..n-1 are workers 1..n-1 (threads.c) */
    pdp__dp_job job;     /* the job pdp__dp_run_job hands to the team */
    /* this step, set by the caller before the handoff */
    int64_t batch;
    int active;          /* replicas with at least one sample */
    float grad_scale;    /* 1 / batch */
    bool zero_master;    /* replica 0 zeroes the master's gradients first */
    pdp_optim *step_opt; /* non-NULL: the reduce also steps each slice it sums */
    pdp__optim_scalars step_s; /* step_opt's update scalars, taken once per step */
    double jobs_cpu;     /* CPU seconds the caller spent in jobs this step: as worker 0,
                            and spinning for the others (their CPU time counts instead) */
    /* gathered outputs on the master's device */
    float *out_block;
    int64_t out_cap;     /* floats */
    pdp_tensor output;
    bool have_output;
    size_t optim_bytes;  /* the master's optimizer state, seen at the last step */
    pdp_dp_stats stats;
};

/* ---- dp: memory accounting ---- */

/* Bytes a model holds on its device, from the plan pdp_model_reserve allocates by. */
PDP__PRIVATE size_t pdp__dp_model_bytes(const pdp_model *m)
{
    size_t bytes = (size_t)m->param_count * sizeof(float); /* gradients */
    pdp__model_plan p;
    if (!m->params_shared) bytes += (size_t)m->param_count * sizeof(float);
    if (m->max_batch == 0) return bytes;
    p = pdp__model_plan_of(m, NULL);
    return bytes + (size_t)(m->max_batch * (p.act + p.saved + p.work + 2 * p.widest) + 3) *
                       sizeof(float);
}

PDP__PRIVATE void pdp__dp_memory(pdp_dp *dp)
{
    size_t replica = 0;
    int i;
    dp->stats.master_bytes = pdp__dp_model_bytes(dp->master) + dp->optim_bytes +
                             (size_t)(dp->out_cap + dp->workers[0].cap_rows * dp->per_sample +
                                      dp->workers[0].cap_xbuf) * sizeof(float);
    if (dp->stage) dp->stats.master_bytes += (size_t)dp->master->param_count * sizeof(float);
    for (i = 1; i < dp->n; i++) {
        const pdp__dp_worker *w = &dp->workers[i];
        replica = PDP__MAX(replica, pdp__dp_model_bytes(w->replica) +
                                        (size_t)(w->cap_rows * dp->per_sample + w->cap_xbuf) *
                                            sizeof(float));
    }
    dp->stats.replica_bytes = replica;
}

/* ---- dp: workers ---- */

/* CPU seconds used by the calling thread: unlike wall time, it does not count
   the time a busy machine keeps the thread waiting for a core. */
PDP__PRIVATE double pdp__dp_thread_cpu(void) { return pdp__thread_cpu_s(); }

/* Parallel apply, one replica: forward, loss against its labels, backward. */
PDP__PRIVATE void pdp__dp_apply_one(pdp__dp_worker *w)
{
    pdp_dp *dp = w->dp;
    pdp_model *m = w->replica;
    const pdp_tensor *y;
    pdp_tensor dy;
    int64_t shape[3];
    double t0 = pdp__now(), c0 = pdp__dp_thread_cpu();
    pdp_status st;
    w->status = PDP_OK;
    w->loss_sum = 0.0;
    w->apply_s = 0.0;
    w->cpu_s = 0.0;
    if (w->rows == 0) return; /* idle this step */
    if (w->index > 0 || dp->zero_master) pdp_model_zero_grad(m);
    if ((st = pdp_model_forward(m, &w->x, &y)) != PDP_OK) goto fail;
    /* one label a row of the last dimension, -1 ignored; scaled by the whole batch's count */
    if ((st = pdp__cross_entropy_rows_on(m->device, y->data, w->labels, w->rows * dp->positions,
                                         dp->classes, dp->grad_scale, &w->loss_sum, w->dlogits,
                                         "cross_entropy")) != PDP_OK)
        goto fail;
    if (!isfinite(w->loss_sum)) {
        st = pdp__err(PDP_ERR_NUMERIC, "the loss of samples [%lld, %lld) is %g",
                      (long long)w->first, (long long)(w->first + w->rows), w->loss_sum);
        goto fail;
    }
    shape[0] = w->rows;
    shape[1] = dp->out_shape[0];
    shape[2] = dp->out_shape[1];
    pdp_tensor_wrap(w->dlogits, m->device, dp->out_ndim + 1, shape, &dy);
    if ((st = pdp_model_backward(m, &dy)) != PDP_OK) goto fail;
    w->apply_s = pdp__now() - t0;
    w->cpu_s = pdp__dp_thread_cpu() - c0;
    return;
fail:
    /* the message is thread-local: keep a copy for the caller */
    w->status = st;
    {
        const char *e = pdp_last_error();
        size_t len = PDP__MIN(strlen(e), sizeof w->msg - 1);
        memcpy(w->msg, e, len);
        w->msg[len] = '\0';
    }
    w->apply_s = pdp__now() - t0;
}

/* Reduce, one slice: master.grad[lo, hi) += replica[1..active-1].grad[lo, hi), in
   replica order. Slices are multiples of 16 floats (one cache line) so no two
   threads write the same line; chunks of 4096 floats keep the master's part in L1
   while each replica is added, and, when the step is fused (step_opt), while the
   optimizer updates the chunk's parameters from it: the update is element-wise, so
   stepping slice by slice gives the bits of one pdp_optim_step after the reduce. */
PDP__PRIVATE void pdp__dp_reduce_slice(pdp_dp *dp, int slice, int nslices)
{
    int64_t count = dp->master->param_count;
    int64_t per = ((count + nslices - 1) / nslices + 15) / 16 * 16;
    int64_t lo = PDP__MIN(count, (int64_t)slice * per), hi = PDP__MIN(count, lo + per), c;
    float *dst = dp->master->grad_block;
    int r;
    for (c = lo; c < hi; c += 4096) {
        int64_t len = PDP__MIN(hi, c + 4096) - c;
        for (r = 1; r < dp->active; r++) {
            float *PDP__RESTRICT d = dst + c;
            const float *PDP__RESTRICT s = dp->workers[r].replica->grad_block + c;
            PDP__FOR_BLOCKED(j, len, d[j] += s[j];);
        }
        if (dp->step_opt)
            pdp__optim_update_range(dp->step_opt, &dp->step_s, dp->master->param_block, dst, c,
                                    c + len);
    }
}

/* One worker's part of a job: its replica's apply, or its slice of the reduce. */
PDP__PRIVATE void pdp__dp_do_job(pdp__dp_worker *w, pdp__dp_job job)
{
    pdp_dp *dp = w->dp;
    if (job == PDP__DP_JOB_APPLY) {
        pdp__dp_apply_one(w);
    } else if (job == PDP__DP_JOB_REDUCE) {
        int nslices = dp->reduce_on_master ? 1 : dp->n;
        double c0 = pdp__dp_thread_cpu();
        if (w->index < nslices) pdp__dp_reduce_slice(dp, w->index, nslices);
        w->cpu_s = pdp__dp_thread_cpu() - c0;
    }
}

/* The team's job: worker i's part, with the workers' intra-op thread count (the
   caller switches to it for its part and back; a worker thread keeps it). */
PDP__PRIVATE void pdp__dp_team_job(void *arg, int i, int n)
{
    pdp_dp *dp = (pdp_dp *)arg;
    int threads = pdp_get_num_threads();
    (void)n;
    pdp_set_num_threads(dp->threads_per_worker);
    pdp__dp_do_job(&dp->workers[i], dp->job);
    if (i == 0) pdp_set_num_threads(threads);
}

/* Runs one job: hands it to workers 1..n-1 (the team), runs worker 0's part on the
   calling thread, and waits until all are done. */
PDP__PRIVATE void pdp__dp_run_job(pdp_dp *dp, pdp__dp_job job)
{
    double c0 = pdp__dp_thread_cpu();
    dp->job = job;
    pdp__team_run(&dp->team, dp->n, pdp__dp_team_job, dp);
    dp->jobs_cpu += pdp__dp_thread_cpu() - c0;
}

/* ---- dp: lifecycle ---- */

PDP__PRIVATE void pdp__dp_destroy(pdp_dp *dp)
{
    int i;
    pdp__team_free(&dp->team); /* stops and joins every worker thread */
    for (i = 0; dp->workers && i < dp->n; i++) {
        pdp__dp_worker *w = &dp->workers[i];
        if (i > 0) pdp_model_free(w->replica);
        pdp__dev_free(w->device, w->dlogits);
        pdp__dev_free(w->device, w->xbuf);
    }
    if (dp->master) {
        pdp__dev_free(dp->master->device, dp->out_block);
        pdp__dev_free(dp->master->device, dp->stage);
        pdp__model_unwrap(dp->master); /* the caller's again: layers may be added */
    }
    pdp__dealloc(dp->workers);
    pdp__dealloc(dp->devices);
    pdp__dealloc(dp);
}

/* The one place pdp_dp_desc's zeros become defaults (sokol's _def; pdp_dp_get_desc
   returns its result) and its numbers are checked; in may be NULL. The devices are
   checked against the master by pdp_dp_create. */
PDP__PRIVATE pdp_status pdp__dp_desc_defaults(const pdp_dp_desc *in, pdp_dp_desc *out)
{
    pdp_dp_desc d;
    if (in) d = *in;
    else memset(&d, 0, sizeof d);
    if (d.num_workers < 0 || d.num_workers > PDP_DP_MAX_WORKERS)
        return pdp__err(PDP_ERR_INVALID,
                        "pdp_dp_create: num_workers %d (use 0 for one per core, or 1..%d)",
                        d.num_workers, PDP_DP_MAX_WORKERS);
    if (d.num_workers == 0 && d.devices)
        return pdp__err(PDP_ERR_INVALID,
                        "pdp_dp_create: num_workers 0 with a devices list (give its length)");
    if (d.num_workers == 0) d.num_workers = PDP__MIN(pdp__cpu_count(), PDP_DP_MAX_WORKERS);
    if (d.threads_per_worker < 0)
        return pdp__err(PDP_ERR_INVALID, "pdp_dp_create: threads_per_worker %d is negative",
                        d.threads_per_worker);
    d.threads_per_worker = PDP__DEF(d.threads_per_worker, 1);
    *out = d;
    return PDP_OK;
}

PDP_API pdp_status pdp_dp_create(pdp_dp **out, pdp_model *master, const pdp_dp_desc *desc)
{
    pdp_dp_desc d;
    pdp_dp *dp;
    int n, i;
    pdp_status st;
    if (!out) return pdp__err(PDP_ERR_INVALID, "pdp_dp_create: out is NULL");
    *out = NULL;
    if (!master) return pdp__err(PDP_ERR_INVALID, "pdp_dp_create: master model is NULL");
    if (master->nlayers == 0)
        return pdp__err(PDP_ERR_STATE, "pdp_dp_create: the model has no layers");
    if (master->tp.nlayers)
        return pdp__err(PDP_ERR_UNSUPPORTED, "pdp_dp_create: the model has %d tensor-parallel "
                        "layers, whose collectives thread replicas cannot share; use DDP across "
                        "TP groups (tp.h)", master->tp.nlayers);
    if (master->layers[master->nlayers - 1].out_ndim > 2)
        return pdp__err(PDP_ERR_SHAPE,
                        "pdp_dp_create: the last layer %d (%s) gives %d-d samples; the "
                        "classification loss needs logits (classes) or (T, vocab) a sample "
                        "(add a Flatten and a Linear)",
                        master->nlayers - 1,
                        pdp__layer_kind_name(master->layers[master->nlayers - 1].kind),
                        master->layers[master->nlayers - 1].out_ndim);
    if ((st = pdp__dp_desc_defaults(desc, &d)) != PDP_OK) return st;
    n = d.num_workers;
    for (i = 0; i < n; i++) {
        pdp_device dev = d.devices ? d.devices[i] : pdp_cpu();
        if (i == 0 && !pdp__same_device(dev, master->device))
            return pdp__err(PDP_ERR_DEVICE,
                            "pdp_dp_create: devices[0] (%d:%d) must be the master's device (%d:%d)",
                            dev.kind, dev.ordinal, master->device.kind, master->device.ordinal);
#ifndef PDP_CUDA
        if (dev.kind != PDP_DEVICE_CPU)
            return pdp__err(PDP_ERR_UNSUPPORTED,
                            "pdp_dp_create: devices[%d] is CUDA %d: built without PDP_CUDA "
                            "(compile with -DPDP_CUDA and link pdp_cuda.o)",
                            i, dev.ordinal);
#endif
        if (dev.kind != master->device.kind)
            return pdp__err(PDP_ERR_DEVICE,
                            "pdp_dp_create: devices[%d] (%d:%d) and the master (%d:%d) differ in "
                            "kind: the workers must be all CPU or all CUDA",
                            i, dev.kind, dev.ordinal, master->device.kind,
                            master->device.ordinal);
    }

    /* the replicas are clones of this layout: it must not change while they live */
    if ((st = pdp__model_wrap(master, PDP__WRAP_DP, 0, "pdp_dp_create")) != PDP_OK) return st;
    dp = (pdp_dp *)pdp__calloc(sizeof *dp);
    if (!dp) {
        pdp__model_unwrap(master);
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "pdp_dp_create: no memory");
    }
    dp->master = master;
    dp->n = n;
    dp->threads_per_worker = d.threads_per_worker;
    dp->cuda = master->device.kind == PDP_DEVICE_CUDA;
    dp->copy_params = d.copy_params || dp->cuda; /* a GPU reads only its own memory */
    dp->reduce_on_master = d.reduce_on_master;
    {
        const pdp__layer *last = &master->layers[master->nlayers - 1];
        dp->out_ndim = last->out_ndim;
        dp->out_shape[0] = last->out_shape[0];
        dp->out_shape[1] = last->out_shape[1];
        dp->classes = last->out_shape[last->out_ndim - 1];
        dp->per_sample = last->out_count;
        dp->positions = dp->per_sample / dp->classes;
    }
    dp->workers = (pdp__dp_worker *)pdp__calloc((size_t)n * sizeof *dp->workers);
    if (d.devices) { /* kept for pdp_dp_get_desc: the caller's array may not outlive dp */
        dp->devices = (pdp_device *)pdp__alloc((size_t)n * sizeof *dp->devices);
        if (dp->devices) memcpy(dp->devices, d.devices, (size_t)n * sizeof *dp->devices);
    }
    dp->desc = d;
    dp->desc.devices = dp->devices;
    if (!dp->workers || (d.devices && !dp->devices)) {
        pdp__dp_destroy(dp);
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "pdp_dp_create: no memory for %d workers", n);
    }
    if (pdp__team_init(&dp->team) != 0) {
        pdp__dp_destroy(dp);
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "pdp_dp_create: cannot create a mutex or condition");
    }

    /* replicas: 0 is the master; the others are clones on their devices */
    for (i = 0; i < n; i++) {
        pdp__dp_worker *w = &dp->workers[i];
        w->dp = dp;
        w->index = i;
        w->device = d.devices ? d.devices[i] : pdp_cpu();
        if (i == 0) {
            w->replica = master;
        } else if ((st = pdp__model_clone(master, w->device, !dp->copy_params, &w->replica)) !=
                   PDP_OK) { /* the message reads w: destroy after */
            st = pdp__err_wrap(st, "pdp_dp_create: replica %d on device %d:%d", i,
                               w->device.kind, w->device.ordinal);
            pdp__dp_destroy(dp);
            return st;
        }
        /* the reduce's staging block, once, if any replica's gradients live elsewhere */
        if (i > 0 && dp->cuda && !dp->stage && !pdp__same_device(w->device, master->device) &&
            master->param_count > 0 &&
            (st = pdp__dev_alloc(master->device, (size_t)master->param_count * sizeof(float),
                                 (void **)&dp->stage)) != PDP_OK) {
            pdp__dp_destroy(dp);
            return pdp__err_wrap(st, "pdp_dp_create: the reduce's staging block");
        }
    }
    { /* worker 0 is the calling thread */
        int rc = pdp__team_grow(&dp->team, n - 1);
        if (rc != 0) {
            int made = dp->team.nworkers + 1;
            pdp__dp_destroy(dp);
            return pdp__err(PDP_ERR_OUT_OF_MEMORY, "pdp_dp_create: worker %d: cannot start its thread: %s",
                            made, strerror(rc));
        }
    }
    dp->stats.num_workers = n;
    dp->stats.params_shared = !dp->copy_params;
    pdp__dp_memory(dp);
    *out = dp;
    return PDP_OK;
}

PDP_API void pdp_dp_free(pdp_dp *dp)
{
    if (dp) pdp__dp_destroy(dp);
}

PDP_API int pdp_dp_num_workers(const pdp_dp *dp) { return dp ? dp->n : 0; }

PDP_API pdp_dp_desc pdp_dp_get_desc(const pdp_dp *dp)
{
    pdp_dp_desc d;
    if (dp) return dp->desc;
    memset(&d, 0, sizeof d);
    return d;
}

PDP_API const pdp_tensor *pdp_dp_output(const pdp_dp *dp)
{
    return dp && dp->have_output ? &dp->output : NULL;
}

/* ---- dp: the stages ---- */

/* Replicate: master parameters -> replicas 1..active-1, and the state that keys
   dropout (training flag, step). A CPU replica that shares the master's memory
   only re-points at it; a copying replica (copy_params, or another device) gets
   a fresh copy, as torch's replicate() broadcasts the parameters every step. */
PDP__PRIVATE pdp_status pdp__dp_replicate(pdp_dp *dp, const char *fn)
{
    pdp_model *m = dp->master;
    size_t bytes = (size_t)m->param_count * sizeof(float);
    pdp_status st;
    int i;
    dp->stats.replicate_bytes = 0;
    for (i = 1; i < dp->active; i++) {
        pdp_model *r = dp->workers[i].replica;
        if (r->nlayers != m->nlayers || r->param_count != m->param_count)
            return pdp__err(PDP_ERR_STATE,
                            "%s: the master model changed after pdp_dp_create (%d layers, %lld "
                            "parameters; replica %d has %d, %lld)",
                            fn, m->nlayers, (long long)m->param_count, i, r->nlayers,
                            (long long)r->param_count);
        r->training = m->training;
        r->precision = m->precision; /* pdp_model_set_precision on the master, any time */
        r->step = m->step;
        r->seed = m->seed;
        if (r->params_shared) {
            r->param_block = m->param_block;
        } else if ((st = pdp__dev_copy(r->device, r->param_block, m->device, m->param_block,
                                       bytes)) != PDP_OK) {
            return pdp__err_wrap(st, "%s: replicate to replica %d", fn, i);
        }
        dp->stats.replicate_bytes += bytes;
    }
    return PDP_OK;
}

/* Scatter: split x and labels along dimension 0 into balanced contiguous shards.
   On the CPU a shard is a view of the caller's batch (no copy); the bytes count
   what a multi-device DP sends. Grows the loss-gradient buffers (first step). */
PDP__PRIVATE pdp_status pdp__dp_scatter(pdp_dp *dp, const pdp_tensor *x, const int32_t *labels,
                                        const char *fn)
{
    int64_t b = x->shape[0], base = b / dp->n, extra = b % dp->n, first = 0, rows = 0;
    size_t row_bytes = (size_t)(x->count / b + dp->positions) * sizeof(float);
    pdp_status st;
    int i;
    dp->counted = 0;
    dp->stats.scatter_bytes = 0;
    for (i = 0; i < dp->n; i++) {
        pdp__dp_worker *w = &dp->workers[i];
        w->first = first;
        w->rows = base + (i < extra ? 1 : 0);
        w->replica->sample_base = first;
        first += w->rows;
        if (w->rows == 0) continue;
        pdp_tensor_rows_view(x, w->first, w->rows, &w->x);
        w->labels = labels + w->first * dp->positions;
        /* the loss is the mean over the labels that count (not -1) of the whole batch */
        if ((st = pdp__cross_entropy_count(w->labels, w->rows * dp->positions, dp->classes,
                                           &rows, "cross_entropy")) != PDP_OK)
            return pdp__err_wrap(st, "%s: worker %d (samples %lld..%lld)", fn, i,
                                 (long long)w->first, (long long)(w->first + w->rows - 1));
        dp->counted += rows;
        if (!pdp__same_device(x->device, w->device)) {
            /* a GPU replica whose rows live on the host or another GPU: copy them over */
            size_t bytes = (size_t)w->x.count * sizeof(float);
            if (w->x.count > w->cap_xbuf) {
                pdp__dev_free(w->device, w->xbuf);
                w->xbuf = NULL;
                w->cap_xbuf = 0;
                if ((st = pdp__dev_alloc(w->device, bytes, (void **)&w->xbuf)) != PDP_OK)
                    return pdp__err_wrap(st, "%s: worker %d: input rows", fn, i);
                w->cap_xbuf = w->x.count;
            }
            if ((st = pdp__dev_copy(w->device, w->xbuf, x->device, w->x.data, bytes)) != PDP_OK)
                return pdp__err_wrap(st, "%s: scatter to worker %d", fn, i);
            w->x.data = w->xbuf;
            w->x.device = w->device;
        }
        if (i > 0) dp->stats.scatter_bytes += (size_t)w->rows * row_bytes;
        if (w->rows > w->cap_rows) {
            pdp__dev_free(w->device, w->dlogits);
            w->dlogits = NULL;
            w->cap_rows = 0;
            if ((st = pdp__dev_alloc(w->device, (size_t)(w->rows * dp->per_sample) * sizeof(float),
                                     (void **)&w->dlogits)) != PDP_OK)
                return pdp__err_wrap(st, "%s: worker %d: loss gradient", fn, i);
            w->cap_rows = w->rows;
        }
    }
    dp->grad_scale = dp->counted > 0 ? 1.0f / (float)dp->counted : 0.0f;
    return PDP_OK;
}

/* Parallel apply: every worker runs its replica at once; the first failure (lowest
   worker index, so the report does not depend on timing) comes back naming it. */
PDP__PRIVATE pdp_status pdp__dp_parallel_apply(pdp_dp *dp, bool zero_master, double *cpu,
                                               const char *fn)
{
    int i;
    dp->zero_master = zero_master;
    pdp__dp_run_job(dp, PDP__DP_JOB_APPLY);
    dp->stats.apply_worker_min = 0.0;
    dp->stats.apply_worker_max = 0.0;
    *cpu = 0.0;
    for (i = 0; i < dp->active; i++) {
        const pdp__dp_worker *w = &dp->workers[i];
        if (w->status != PDP_OK)
            return pdp__err(w->status, "%s: worker %d (samples %lld..%lld): %s", fn, i,
                            (long long)w->first, (long long)(w->first + w->rows - 1), w->msg);
        if (i == 0 || w->apply_s < dp->stats.apply_worker_min)
            dp->stats.apply_worker_min = w->apply_s;
        dp->stats.apply_worker_max = PDP__MAX(dp->stats.apply_worker_max, w->apply_s);
        *cpu = PDP__MAX(*cpu, w->cpu_s);
    }
    return PDP_OK;
}

/* Gather: outputs of every replica into one [batch, classes] tensor on the master,
   and the loss sums, added in replica order in double. */
PDP__PRIVATE pdp_status pdp__dp_gather(pdp_dp *dp, double *loss_sum, const char *fn)
{
    pdp_model *m = dp->master;
    int64_t need = dp->batch * dp->per_sample, shape[3];
    pdp_status st;
    int i;
    if (need > dp->out_cap) {
        pdp__dev_free(m->device, dp->out_block);
        dp->out_block = NULL;
        dp->out_cap = 0;
        dp->have_output = false;
        st = pdp__dev_alloc(m->device, (size_t)need * sizeof(float), (void **)&dp->out_block);
        if (st != PDP_OK)
            return pdp__err_wrap(st, "%s: gathered outputs", fn);
        dp->out_cap = need;
    }
    *loss_sum = 0.0;
    dp->stats.gather_bytes = 0;
    for (i = 0; i < dp->active; i++) {
        const pdp__dp_worker *w = &dp->workers[i];
        size_t bytes = (size_t)(w->rows * dp->per_sample) * sizeof(float);
        if ((st = pdp__dev_copy(m->device, dp->out_block + w->first * dp->per_sample, w->device,
                                w->replica->out_view.data, bytes)) != PDP_OK)
            return pdp__err_wrap(st, "%s: gather from replica %d", fn, i);
        *loss_sum += w->loss_sum;
        if (i > 0) dp->stats.gather_bytes += bytes + sizeof(double);
    }
    shape[0] = dp->batch;
    shape[1] = dp->out_shape[0];
    shape[2] = dp->out_shape[1];
    pdp_tensor_wrap(dp->out_block, m->device, dp->out_ndim + 1, shape, &dp->output);
    dp->have_output = true;
    return PDP_OK;
}

/* Reduce: the replicas' gradients summed into the master's (which already holds
   replica 0's). Each worker sums one slice, or the master's worker sums it all
   (reduce_on_master, torch's reduce_add on device 0); same bits either way. With
   step_opt the workers also step the slices they sum (pdp__dp_fused_step). */
PDP__PRIVATE void pdp__dp_reduce(pdp_dp *dp, pdp_optim *step_opt, double *cpu)
{
    int i;
    dp->step_opt = step_opt;
    if (step_opt) pdp__optim_scalars_of(step_opt, &dp->step_s);
    dp->stats.reduce_bytes =
        (size_t)(dp->active - 1) * (size_t)dp->master->param_count * sizeof(float);
    *cpu = 0.0;
    if (dp->active < 2) return;
    pdp__dp_run_job(dp, PDP__DP_JOB_REDUCE);
    dp->step_opt = NULL;
    for (i = 0; i < dp->n; i++) *cpu = PDP__MAX(*cpu, dp->workers[i].cpu_s);
}

/* Reduce on GPUs, on the calling thread (device 0): replica r's gradients are
   peer-copied into the staging block and added into the master's, r = 1, 2, ...
   in order, so every element is g0 + g1 + g2 + ... as on the CPU. The copy waits
   for replica r's backward; the adds queue on device 0's stream in order. */
PDP__PRIVATE pdp_status pdp__dp_reduce_device(pdp_dp *dp, const char *fn)
{
    pdp_model *m = dp->master;
    size_t bytes = (size_t)m->param_count * sizeof(float);
    pdp_status st;
    int r;
    dp->stats.reduce_bytes = 0;
    for (r = 1; r < dp->active; r++) {
        const pdp__dp_worker *w = &dp->workers[r];
        const float *src = w->replica->grad_block;
        if (!pdp__same_device(w->device, m->device)) {
            if ((st = pdp__dev_copy(m->device, dp->stage, w->device, src, bytes)) != PDP_OK)
                return pdp__err_wrap(st, "%s: reduce from replica %d", fn, r);
            src = dp->stage;
        }
        if ((st = pdp__dev_add(m->device, m->grad_block, src, m->param_count)) != PDP_OK)
            return pdp__err_wrap(st, "%s: reduce from replica %d", fn, r);
        dp->stats.reduce_bytes += bytes;
    }
    return PDP_OK;
}

/* The optimizer the CPU reduce may run inside its slices, or NULL: on CPU replicas
   the master's step costs one core a pass over every parameter while the others
   wait; fused, each worker updates the slice it has just summed, still in cache.
   Only for a whole-model optimizer that pdp_optim_step would accept (its checks run
   first, so an error is reported before anything changes), and with 2+ workers
   active (one worker runs no reduce). */
PDP__PRIVATE pdp_status pdp__dp_fused_step(pdp_dp *dp, pdp_optim *opt, pdp_optim **out,
                                           const char *fn)
{
    pdp_status st;
    *out = NULL;
    if (dp->cuda || dp->active < 2) return PDP_OK;
    if ((st = pdp__optim_check_step(opt)) != PDP_OK)
        return pdp__err_wrap(st, "%s: master step", fn);
    if (opt->lo != 0 || opt->hi != dp->master->param_count) return PDP_OK;
    *out = opt;
    return PDP_OK;
}

/* Step: the optimizer updates the master's parameters; replicas see them at the
   next replicate. */
PDP__PRIVATE pdp_status pdp__dp_master_step(pdp_optim *opt, const char *fn)
{
    pdp_status st = pdp_optim_step(opt);
    return st == PDP_OK ? PDP_OK : pdp__err_wrap(st, "%s: master step", fn);
}

/* ---- dp: one step ---- */

PDP__PRIVATE pdp_status pdp__dp_run(pdp_dp *dp, pdp_optim *opt, const pdp_tensor *x,
                                    const int32_t *labels, float *loss, bool zero_and_step,
                                    const char *fn)
{
    pdp_dp_times t;
    pdp_optim *fused = NULL;
    double t0 = pdp__now(), c0 = pdp__dp_thread_cpu(), ts, loss_sum = 0.0;
    pdp_status st;
    memset(&t, 0, sizeof t);
    if (!dp || !x || !labels) return pdp__err(PDP_ERR_INVALID, "%s: NULL argument", fn);
    if (zero_and_step && !opt) return pdp__err(PDP_ERR_INVALID, "%s: optimizer is NULL", fn);
    if (opt && opt->model != dp->master)
        return pdp__err(PDP_ERR_INVALID, "%s: the optimizer was created on another model, not the "
                        "master", fn);
    if (x->ndim < 2 || x->shape[0] < 1 || !x->data) {
        char a[96];
        return pdp__err(PDP_ERR_SHAPE, "%s: x is %s; expected [batch, sample...] with batch >= 1",
                        fn, pdp__shape_str(x, a, sizeof a));
    }
    /* a GPU master also takes a host batch: scatter uploads each shard */
    if (!pdp__same_device(x->device, dp->master->device) &&
        !(dp->cuda && x->device.kind == PDP_DEVICE_CPU))
        return pdp__err(PDP_ERR_DEVICE, "%s: x on device %d:%d, master on %d:%d", fn,
                        x->device.kind, x->device.ordinal, dp->master->device.kind,
                        dp->master->device.ordinal);

    dp->jobs_cpu = 0.0;
    dp->batch = x->shape[0];
    dp->active = (int)PDP__MIN((int64_t)dp->n, dp->batch); /* the others idle this step */

    ts = pdp__now();
    if ((st = pdp__dp_replicate(dp, fn)) != PDP_OK) return st;
    t.replicate = pdp__now() - ts;
    ts = pdp__now();
    if ((st = pdp__dp_scatter(dp, x, labels, fn)) != PDP_OK) return st;
    t.scatter = pdp__now() - ts;
    ts = pdp__now();
    if ((st = pdp__dp_parallel_apply(dp, zero_and_step, &t.apply_cpu, fn)) != PDP_OK) return st;
    t.apply = pdp__now() - ts;
    ts = pdp__now();
    if ((st = pdp__dp_gather(dp, &loss_sum, fn)) != PDP_OK) return st;
    t.gather = pdp__now() - ts;
    ts = pdp__now();
    if (zero_and_step && (st = pdp__dp_fused_step(dp, opt, &fused, fn)) != PDP_OK) return st;
    if (dp->cuda) {
        if ((st = pdp__dp_reduce_device(dp, fn)) != PDP_OK) return st;
    } else {
        pdp__dp_reduce(dp, fused, &t.reduce_cpu);
    }
    t.reduce = pdp__now() - ts;
    if (fused) {
        pdp__optim_finish_step(fused);
    } else if (zero_and_step) {
        ts = pdp__now();
        if ((st = pdp__dp_master_step(opt, fn)) != PDP_OK) return st;
        t.step = pdp__now() - ts;
    }
    if (loss) *loss = dp->counted > 0 ? (float)(loss_sum / (double)dp->counted) : 0.0f;

    /* ---- dp: stats ---- */
    t.total = pdp__now() - t0;
    t.critical_cpu = pdp__dp_thread_cpu() - c0 - dp->jobs_cpu + t.apply_cpu + t.reduce_cpu;
    dp->stats.steps++;
    dp->stats.batch = dp->batch;
    dp->stats.active_workers = dp->active;
    dp->stats.bytes_from_master = dp->stats.replicate_bytes + dp->stats.scatter_bytes;
    dp->stats.bytes_to_master = dp->stats.gather_bytes + dp->stats.reduce_bytes;
    dp->stats.last = t;
    dp->stats.sum.replicate += t.replicate;
    dp->stats.sum.scatter += t.scatter;
    dp->stats.sum.apply += t.apply;
    dp->stats.sum.gather += t.gather;
    dp->stats.sum.reduce += t.reduce;
    dp->stats.sum.step += t.step;
    dp->stats.sum.total += t.total;
    dp->stats.sum.apply_cpu += t.apply_cpu;
    dp->stats.sum.reduce_cpu += t.reduce_cpu;
    dp->stats.sum.critical_cpu += t.critical_cpu;
    if (opt) dp->optim_bytes = (size_t)opt->nstate * (size_t)opt->count * sizeof(float);
    pdp__dp_memory(dp);
    return PDP_OK;
}

/* The master's optimizer, for its memory figure, when steps go through the optimizer and
   not pdp_dp_step (pdp_trainer's DP: pdp_dp_forward_backward, then pdp_optim_step). */
PDP__PRIVATE void pdp__dp_count_optim(pdp_dp *dp, const pdp_optim *opt)
{
    dp->optim_bytes = opt ? (size_t)opt->nstate * (size_t)opt->count * sizeof(float) : 0;
    if (dp->stats.steps) pdp__dp_memory(dp);
}

PDP_API pdp_status pdp_dp_step(pdp_dp *dp, pdp_optim *opt, const pdp_tensor *x,
                               const int32_t *labels, float *loss)
{
    return pdp__dp_run(dp, opt, x, labels, loss, true, "pdp_dp_step");
}

PDP_API pdp_status pdp_dp_forward_backward(pdp_dp *dp, const pdp_tensor *x, const int32_t *labels,
                                           float *loss)
{
    return pdp__dp_run(dp, NULL, x, labels, loss, false, "pdp_dp_forward_backward");
}

/* ---- dp: stats ---- */

PDP_API pdp_status pdp_dp_get_stats(const pdp_dp *dp, pdp_dp_stats *out)
{
    if (!dp || !out) return pdp__err(PDP_ERR_INVALID, "pdp_dp_get_stats: NULL argument");
    *out = dp->stats;
    return PDP_OK;
}

PDP_API int pdp_dp_stats_format(const pdp_dp_stats *s, char *buf, size_t bytes)
{
    const pdp_dp_times *t, *u;
    double ms = 1e3, mean = 1e3 / (double)PDP__MAX(s ? s->steps : 1, 1);
    char step[32];
    if (!s) return 0;
    t = &s->last;
    u = &s->sum;
    /* on CPU replicas the master's step runs inside the reduce (pdp__dp_fused_step) */
    if (s->params_shared && t->step == 0.0) snprintf(step, sizeof step, "(in reduce)");
    else snprintf(step, sizeof step, "%.3f", t->step * ms);
    return snprintf(
        buf, bytes,
        "dp: %d workers (%d active), last batch %lld, step %lld, params %s\n"
        "  last step ms: replicate %.3f  scatter %.3f  apply %.3f (workers %.3f..%.3f)"
        "  gather %.3f  reduce %.3f  step %s  total %.3f\n"
        "  mean ms:      replicate %.3f  scatter %.3f  apply %.3f  gather %.3f  reduce %.3f"
        "  step %.3f  total %.3f\n"
        "  traffic%s: master -> replicas %.2f MB (params %.2f, inputs %.2f), "
        "replicas -> master %.2f MB (grads %.2f, outputs %.3f)\n"
        "  memory: master %.2f MB, largest other replica %.2f MB (master / replica %.2fx)\n",
        s->num_workers, s->active_workers, (long long)s->batch, (long long)s->steps,
        s->params_shared ? "shared (read in place)" : "copied", t->replicate * ms,
        t->scatter * ms, t->apply * ms, s->apply_worker_min * ms, s->apply_worker_max * ms,
        t->gather * ms, t->reduce * ms, step, t->total * ms, u->replicate * mean,
        u->scatter * mean, u->apply * mean, u->gather * mean, u->reduce * mean, u->step * mean,
        u->total * mean, s->params_shared ? " (what DP across devices sends; here shared)" : "",
        (double)s->bytes_from_master / 1e6, (double)s->replicate_bytes / 1e6,
        (double)s->scatter_bytes / 1e6, (double)s->bytes_to_master / 1e6,
        (double)s->reduce_bytes / 1e6, (double)s->gather_bytes / 1e6,
        (double)s->master_bytes / 1e6, (double)s->replica_bytes / 1e6,
        s->replica_bytes ? (double)s->master_bytes / (double)s->replica_bytes : 0.0);
}
