/* ddp: DistributedDataParallel, the executor that runs reducer.c's bucket
   reducer with an all-reduce.

   Each bucket's collective is an all-reduce (average over ranks) in place on
   the bucket's range of the model's gradient block, so after pdp_ddp_finish
   every rank holds the averaged gradients of the whole block and steps a full
   optimizer on it; there is no after-step collective. Buckets are planned from
   bucket_cap_mb and first_bucket_mb (MiB, 2^20 bytes, as PyTorch's). The
   states, the ordering of launches and the failure reports are the reducer's
   (reducer.c). A registered comm hook (ddp.h) replaces the all-reduce; the
   built-in bf16/fp16 compression hooks live here and serve ZeRO too. */

#include "internal.h"

struct pdp_ddp {
    pdp__reducer r;       /* first: the grad hook's user pointer is &d->r */
    pdp_ddp_desc desc;
    pdp_model *held;      /* the model this executor wrapped (pdp__model_wrap) */
};

/* The DDP collective: bucket b's gradients, averaged in place (or the comm hook's). */
PDP__PRIVATE pdp_status pdp__ddp_allreduce(pdp__reducer *r, int b, pdp_work **w)
{
    const pdp_ddp_bucket *k = &r->buckets[b].info;
    if (r->hook.launch) {
        pdp_comm_hook_bucket v;
        memset(&v, 0, sizeof v);
        v.grad = r->m->grad_block + k->offset;
        v.count = k->count;
        return pdp__reducer_hook_launch(r, b, &v, w);
    }
    return pdp_comm_allreduce(r->c, r->m->grad_block + k->offset, k->count, PDP_REDUCE_AVG, w);
}

/* ---- ddp: the built-in compression hooks (ddp.h) ----
   launch: scratch <- 16-bit(grad / N), then a 16-bit SUM of the scratch (all-reduce in
   place, or reduce-scatter with this rank's slice in place); finish: the fp32 result
   widened back into grad (or recv). The hook's state points at its 16-bit type; the
   scratch is the bucket's own. */

static pdp_dtype pdp__hook_dtypes[2] = {PDP_DTYPE_BF16, PDP_DTYPE_F16};

PDP__PRIVATE pdp_status pdp__hook_compress_launch(void *state, pdp_comm *c,
                                                  const pdp_comm_hook_bucket *b, pdp_work **work)
{
    pdp_dtype dt = *(const pdp_dtype *)state;
    pdp_status st;
    if ((st = pdp__dev_to16(b->device, b->scratch, b->grad, b->count, 1.0f / (float)b->world_size,
                            (int)dt)) != PDP_OK)
        return st;
    if (!b->reduce_scatter) return pdp_comm_allreduce_ex(c, b->scratch, b->count, dt,
                                                         PDP_REDUCE_SUM, work);
    return pdp_comm_reduce_scatter_ex(c, b->scratch,
                                      (uint16_t *)b->scratch + (int64_t)b->rank * b->recv_count,
                                      b->recv_count, dt, PDP_REDUCE_SUM, work);
}

PDP__PRIVATE pdp_status pdp__hook_compress_finish(void *state, const pdp_comm_hook_bucket *b)
{
    pdp_dtype dt = *(const pdp_dtype *)state;
    if (!b->reduce_scatter)
        return pdp__dev_from16(b->device, b->grad, b->scratch, b->count, (int)dt);
    return pdp__dev_from16(b->device, b->recv,
                           (const uint16_t *)b->scratch + (int64_t)b->rank * b->recv_count,
                           b->recv_count, (int)dt);
}

PDP__PRIVATE pdp_ddp_comm_hook pdp__hook_compress(pdp_dtype *dt)
{
    pdp_ddp_comm_hook h;
    memset(&h, 0, sizeof h);
    h.launch = pdp__hook_compress_launch;
    h.finish = pdp__hook_compress_finish;
    h.state = dt;
    h.scratch_bytes_per_float = 2;
    return h;
}

PDP_API pdp_ddp_comm_hook pdp_ddp_hook_bf16_compress(void)
{
    return pdp__hook_compress(&pdp__hook_dtypes[0]);
}

PDP_API pdp_ddp_comm_hook pdp_ddp_hook_fp16_compress(void)
{
    return pdp__hook_compress(&pdp__hook_dtypes[1]);
}

/* ---- ddp: construction ---- */

/* The one place pdp_ddp_desc's zeros become defaults (sokol's _def; pdp_ddp_get_desc
   returns its result); in may be NULL. The bucket sizes are checked by the rule DDP
   and ZeRO share (pdp__bucket_opts_check, reducer.c), whose message starts with fn. */
PDP__PRIVATE pdp_status pdp__ddp_desc_defaults(const pdp_model *m, const pdp_ddp_desc *in,
                                               pdp_ddp_desc *out, const char *fn)
{
    pdp_ddp_desc d;
    pdp_status st;
    if (in) d = *in;
    else memset(&d, 0, sizeof d);
    if ((st = pdp__bucket_opts_check(m, d.bucket_cap_mb, d.first_bucket_mb, NULL, NULL, fn)) !=
        PDP_OK)
        return st;
    d.bucket_cap_mb = PDP__DEF(d.bucket_cap_mb, 25.0);
    d.first_bucket_mb = PDP__DEF(d.first_bucket_mb, PDP__MIN(1.0, d.bucket_cap_mb));
    *out = d;
    return PDP_OK;
}

/* pdp_ddp_create's half on this rank alone: the model, the desc, the wrap and the
   reducer's plan. *out gets what was built, on failure too (pdp_ddp_free takes it). */
PDP__PRIVATE pdp_status pdp__ddp_prepare(pdp_ddp **out, pdp_model *m, pdp_comm *c,
                                         const pdp_ddp_desc *desc, const char *fn)
{
    pdp__reducer_desc rd;
    pdp_ddp_desc dd;
    pdp_ddp *d;
    pdp_status st;
    if (!m) return pdp__err(PDP_ERR_INVALID, "%s: model is NULL", fn);
    if ((st = pdp__ddp_desc_defaults(m, desc, &dd, fn)) != PDP_OK) return st;
    if ((st = pdp__model_wrap(m, PDP__WRAP_DDP, 0, fn)) != PDP_OK) return st;
    if (!(*out = d = (pdp_ddp *)pdp__calloc(sizeof *d))) {
        pdp__model_unwrap(m);
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: rank %d: no memory", fn, c->rank);
    }
    d->held = m;
    d->desc = dd;
    memset(&rd, 0, sizeof rd);
    rd.cap_bytes = d->desc.bucket_cap_mb * 1048576.0;
    rd.first_bytes = d->desc.first_bucket_mb * 1048576.0;
    rd.reduce = pdp__ddp_allreduce;
    rd.op_name = "allreduce";
    rd.finish_names = "pdp_ddp_step or pdp_ddp_finish";
    rd.backward_names = "pdp_ddp_forward_backward or pdp_ddp_backward";
    rd.batch_mean = d->desc.batch_mean;
    rd.user = d;
    return pdp__reducer_init(&d->r, m, c, &rd, fn);
}

/* Collective over c: this rank's half, then every rank learns whether every rank's half
   succeeded (one that failed alone would leave its peers waiting for it in the collectives
   that follow, until the timeout), then the reducer's collectives. */
PDP_API pdp_status pdp_ddp_create(pdp_ddp **out, pdp_model *m, pdp_comm *c,
                                  const pdp_ddp_desc *desc)
{
    static const char *fn = "pdp_ddp_create";
    pdp_ddp *d = NULL;
    pdp_status st;
    if (out) *out = NULL;
    if (!c) return pdp__err(PDP_ERR_INVALID, "%s: comm is NULL", fn);
    if (!out) st = pdp__err(PDP_ERR_INVALID, "%s: out is NULL", fn);
    else st = pdp__ddp_prepare(&d, m, c, desc, fn);
    if ((st = pdp__comm_agree(c, st, fn)) == PDP_OK) st = pdp__reducer_join(&d->r, fn);
    if (st != PDP_OK) {
        pdp_ddp_free(d);
        return st;
    }
    d->r.stats.grad_bytes = m->param_count * (int64_t)sizeof(float);
    *out = d;
    return PDP_OK;
}

PDP_API pdp_ddp_desc pdp_ddp_get_desc(const pdp_ddp *d)
{
    pdp_ddp_desc z;
    if (d) return d->desc;
    memset(&z, 0, sizeof z);
    return z;
}

PDP_API void pdp_ddp_free(pdp_ddp *d)
{
    if (!d) return;
    pdp__reducer_release(&d->r);
    if (d->held) pdp__model_unwrap(d->held);
    pdp__dealloc(d);
}

/* ---- ddp: training ---- */

PDP_API pdp_status pdp_ddp_forward_backward(pdp_ddp *d, const pdp_tensor *x,
                                            const int32_t *labels, float *loss)
{
    static const char *fn = "pdp_ddp_forward_backward";
    if (!d) return pdp__err(PDP_ERR_INVALID, "%s: ddp is NULL", fn);
    return pdp__reducer_backward(&d->r, x, labels, loss, fn);
}

PDP_API pdp_status pdp_ddp_forward(pdp_ddp *d, const pdp_tensor *x, const pdp_tensor **y)
{
    static const char *fn = "pdp_ddp_forward";
    if (y) *y = NULL;
    if (!d) return pdp__err(PDP_ERR_INVALID, "%s: ddp is NULL", fn);
    return pdp__reducer_forward(&d->r, x, y, fn);
}

PDP_API pdp_status pdp_ddp_backward(pdp_ddp *d, const pdp_tensor *dy)
{
    static const char *fn = "pdp_ddp_backward";
    if (!d) return pdp__err(PDP_ERR_INVALID, "%s: ddp is NULL", fn);
    return pdp__reducer_backward_dy(&d->r, dy, fn);
}

PDP_API pdp_status pdp_ddp_finish(pdp_ddp *d)
{
    static const char *fn = "pdp_ddp_finish";
    if (!d) return pdp__err(PDP_ERR_INVALID, "%s: ddp is NULL", fn);
    return pdp__reducer_finish(&d->r, fn);
}

PDP_API pdp_status pdp_ddp_step(pdp_ddp *d, pdp_optim *opt)
{
    static const char *fn = "pdp_ddp_step";
    pdp_status st;
    if (!d || !opt) return pdp__err(PDP_ERR_INVALID, "%s: %s is NULL", fn, d ? "opt" : "ddp");
    /* another model's optimizer would step that model and leave this one's averaged
       gradients to be zeroed: a step that trains nothing, with PDP_OK (as pdp_dp_step) */
    if (opt->model != d->r.m)
        return pdp__err(PDP_ERR_INVALID, "%s: rank %d: the optimizer was created on another "
                        "model, not the one DDP wraps (pdp_ddp_model)", fn, d->r.c->rank);
    if ((st = pdp_ddp_finish(d)) != PDP_OK) return pdp__err_wrap(st, "%s", fn);
    return pdp__reducer_step(&d->r, opt, fn);
}

PDP_API pdp_status pdp_ddp_register_comm_hook(pdp_ddp *d, const pdp_ddp_comm_hook *hook)
{
    static const char *fn = "pdp_ddp_register_comm_hook";
    if (!d) return pdp__err(PDP_ERR_INVALID, "%s: ddp is NULL", fn);
    return pdp__reducer_set_hook(&d->r, hook, NULL, d->r.m->param_count, fn);
}

PDP_API void pdp_ddp_set_no_sync(pdp_ddp *d, bool no_sync)
{
    if (d) d->r.no_sync = no_sync;
}

PDP_API pdp_model *pdp_ddp_model(const pdp_ddp *d) { return d ? d->r.m : NULL; }
PDP_API pdp_comm *pdp_ddp_comm(const pdp_ddp *d) { return d ? d->r.c : NULL; }
PDP_API int pdp_ddp_num_buckets(const pdp_ddp *d) { return d ? d->r.nbuckets : 0; }

PDP_API pdp_status pdp_ddp_bucket_info(const pdp_ddp *d, int b, pdp_ddp_bucket *out)
{
    if (!d || !out) return pdp__err(PDP_ERR_INVALID, "pdp_ddp_bucket_info: NULL argument");
    if (b < 0 || b >= d->r.nbuckets)
        return pdp__err(PDP_ERR_INVALID, "pdp_ddp_bucket_info: bucket %d outside 0..%d", b,
                        d->r.nbuckets - 1);
    *out = d->r.buckets[b].info;
    return PDP_OK;
}

PDP_API void pdp_ddp_get_stats(const pdp_ddp *d, pdp_ddp_stats *out)
{
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (d) *out = d->r.stats;
}

PDP_API void pdp_ddp_reset_stats(pdp_ddp *d)
{
    if (d) pdp__reducer_reset_stats(&d->r);
}
