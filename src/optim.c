/* optim: torch.optim.SGD, Adam and AdamW on the flat parameter block, gradient
   clipping by global norm (torch.nn.utils.clip_grad_norm_), and llm.c's
   warm-up + cosine learning-rate schedule.

   Invariants: the optimizer belongs to one model and to that model's parameter
   count at creation; it holds state for one range [lo, hi) of the flat block
   (all of it, [0, count), for pdp_optim_create), flat with the parameter
   block's offsets (state[k][i - lo] belongs to parameter element i), on the
   model's device:
     SGD, momentum > 0:  state[0] = momentum_buffer
     Adam, AdamW:        state[0] = exp_avg, state[1] = exp_avg_sq
   pdp_optim_create allocates it (zeroed), so a step allocates nothing. steps
   counts completed updates; the update in flight uses t = steps + 1 (Adam's bias
   corrections) and "first" = (steps == 0) (SGD's momentum buffer is the first
   d_p, as PyTorch's clone). The element formulas are the PDP__HOSTDEV helpers of
   math.h, shared with the CUDA kernels.

   ZeRO: pdp__optim_create_range allocates state for one rank's range only, and
   pdp_optim_step on such an optimizer updates that range only (checkpoint.c
   saves and loads it with pdp__checkpoint_save_range/load_range). The element
   code is the same, so a range optimizer stepping its range gives the bits of
   a full optimizer on that range. pdp__optim_step_range updates any sub-range
   of the held range; whoever calls it directly advances steps with
   pdp__optim_finish_step once every range of the step is done.

   References: torch/optim/sgd.py, adam.py, adamw.py (PyTorch 1.13 single-tensor
   path); Kingma and Ba, "Adam", ICLR 2015; Loshchilov and Hutter, "Decoupled
   Weight Decay Regularization", ICLR 2019. */

#include "internal.h"

#if !defined(PDP_NO_SIMD) && (defined(__AVX__) || defined(__SSE2__))
#  include <immintrin.h>
#endif

/* Below this many elements per thread (a step's or zero_grad's), one thread is faster
   than waking more. */
#define PDP__OPTIM_MIN_PER_THREAD 32768

struct pdp_optim {
    pdp_model *model;
    pdp_device device;     /* the model's at creation: pdp_optim_free needs no model */
    pdp_optim_desc desc;   /* defaults filled in, validated */
    int64_t count;         /* the model's param_count at creation */
    int64_t lo, hi;        /* the range of the flat block the state covers */
    int64_t steps;         /* completed updates */
    int nstate;            /* state buffers in use: 0, 1 or 2 */
    float *state[2];       /* hi - lo floats each, on the model's device */
    bool shard;            /* ZeRO's layout (pdp__optim_create_shard): hi floats of state
                              addressed by the executor's offsets, not the flat block's;
                              only pdp__optim_step_at steps it */
};

/* ---- optim: desc ---- */

PDP_API const char *pdp_optim_kind_name(pdp_optim_kind kind)
{
    switch (kind) {
    case PDP_OPTIM_SGD: return "SGD";
    case PDP_OPTIM_ADAM: return "Adam";
    case PDP_OPTIM_ADAMW: return "AdamW";
    }
    return "unknown";
}

/* x in [0, FLT_MAX]: finite, not negative, and a float once rounded where it meets a
   float tensor. Written as !(x in range) by its callers, so NaN fails. */
PDP__PRIVATE bool pdp__optim_nonneg(double x) { return x >= 0.0 && x <= (double)FLT_MAX; }

/* Fills zeros with defaults and validates; fn names the public caller. NaNs fail
   every range check because each is written as !(x in range). The defaults are
   PyTorch's, as doubles (0.999, not 0.999f). */
PDP__PRIVATE pdp_status pdp__optim_desc_resolve(const pdp_optim_desc *in, pdp_optim_desc *out,
                                                const char *fn)
{
    pdp_optim_desc d;
    bool adam;
    if (in) d = *in;
    else memset(&d, 0, sizeof d);
    if (d.kind != PDP_OPTIM_SGD && d.kind != PDP_OPTIM_ADAM && d.kind != PDP_OPTIM_ADAMW)
        return pdp__err(PDP_ERR_INVALID, "%s: kind %d is not SGD (0), Adam (1) or AdamW (2)", fn,
                        (int)d.kind);
    adam = d.kind != PDP_OPTIM_SGD;
    d.lr = PDP__DEF(d.lr, adam ? 1e-3 : 1e-2);
    d.beta1 = PDP__DEF(d.beta1, 0.9);
    d.beta2 = PDP__DEF(d.beta2, 0.999);
    d.eps = PDP__DEF(d.eps, 1e-8);
    if (!pdp__optim_nonneg(d.lr))
        return pdp__err(PDP_ERR_INVALID, "%s: lr %g must be finite, >= 0 and <= FLT_MAX", fn,
                        d.lr);
    if (!pdp__optim_nonneg(d.weight_decay))
        return pdp__err(PDP_ERR_INVALID, "%s: weight_decay %g must be finite, >= 0 and <= "
                        "FLT_MAX", fn, d.weight_decay);
    if (d.decay_params != PDP_DECAY_ALL && d.decay_params != PDP_DECAY_MATRICES)
        return pdp__err(PDP_ERR_INVALID, "%s: decay_params %d is not PDP_DECAY_ALL (0) or "
                        "PDP_DECAY_MATRICES (1)", fn, (int)d.decay_params);
    if (!adam) {
        if (!pdp__optim_nonneg(d.momentum))
            return pdp__err(PDP_ERR_INVALID, "%s: momentum %g must be finite, >= 0 and <= "
                            "FLT_MAX", fn, d.momentum);
        if (!(d.dampening >= 0.0 && d.dampening <= 1.0))
            return pdp__err(PDP_ERR_INVALID, "%s: dampening %g must be in [0, 1]", fn,
                            d.dampening);
        if (d.nesterov && (d.momentum <= 0.0 || d.dampening != 0.0))
            return pdp__err(PDP_ERR_INVALID,
                            "%s: nesterov needs momentum > 0 and dampening 0 (momentum %g, "
                            "dampening %g)", fn, d.momentum, d.dampening);
    } else {
        if (!(d.beta1 >= 0.0 && d.beta1 < 1.0))
            return pdp__err(PDP_ERR_INVALID, "%s: beta1 %g must be in [0, 1)", fn, d.beta1);
        if (!(d.beta2 >= 0.0 && d.beta2 < 1.0))
            return pdp__err(PDP_ERR_INVALID, "%s: beta2 %g must be in [0, 1)", fn, d.beta2);
        if (!pdp__optim_nonneg(d.eps))
            return pdp__err(PDP_ERR_INVALID, "%s: eps %g must be finite, >= 0 and <= FLT_MAX",
                            fn, d.eps);
    }
    *out = d;
    return PDP_OK;
}

/* How many state buffers the resolved desc d needs. */
PDP__PRIVATE int pdp__optim_nstate(const pdp_optim_desc *d)
{
    if (d->kind == PDP_OPTIM_SGD) return d->momentum != 0.0 ? 1 : 0;
    return 2;
}

/* The state_dict key of state buffer k ("momentum_buffer", "exp_avg", "exp_avg_sq"). */
PDP__PRIVATE const char *pdp__optim_state_name(const pdp_optim *o, int k)
{
    if (o->desc.kind == PDP_OPTIM_SGD) return "momentum_buffer";
    return k == 0 ? "exp_avg" : "exp_avg_sq";
}

/* ---- optim: lifecycle ---- */

/* The optimizer of m for desc, holding hi - lo floats of zeroed state per buffer (the
   range [lo, hi) of the flat block; a shard: hi floats in the executor's layout). out,
   m and the range are checked by the callers. On failure *out stays NULL and
   everything allocated is freed; the message is composed before the free. */
PDP__PRIVATE pdp_status pdp__optim_alloc(pdp_optim **out, pdp_model *m, const pdp_optim_desc *desc,
                                         int64_t lo, int64_t hi, bool shard, const char *fn)
{
    pdp_optim *o;
    pdp_optim_desc d;
    size_t bytes = (size_t)(hi - lo) * sizeof(float);
    int k;
    pdp_status st;
    if ((st = pdp__optim_desc_resolve(desc, &d, fn)) != PDP_OK) return st;
    o = (pdp_optim *)pdp__calloc(sizeof *o);
    if (!o) return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory", fn);
    o->model = m;
    o->device = m->device;
    o->desc = d;
    o->count = m->param_count;
    o->lo = lo;
    o->hi = hi;
    o->shard = shard;
    o->nstate = pdp__optim_nstate(&d);
    for (k = 0; k < o->nstate; k++) {
        if ((st = pdp__dev_alloc(m->device, bytes, (void **)&o->state[k])) != PDP_OK ||
            (st = pdp__dev_memset0(m->device, o->state[k], bytes)) != PDP_OK) {
            st = pdp__err_wrap(st, "%s: %s state for %s%lld floats", fn,
                               pdp_optim_kind_name(d.kind), shard ? "a shard of " : "",
                               (long long)(hi - lo));
            pdp_optim_free(o);
            return st;
        }
    }
    *out = o;
    return PDP_OK;
}

PDP__PRIVATE pdp_status pdp__optim_create_range(pdp_optim **out, pdp_model *m,
                                                const pdp_optim_desc *desc, int64_t lo, int64_t hi,
                                                const char *fn)
{
    if (!out) return pdp__err(PDP_ERR_INVALID, "%s: out is NULL", fn);
    *out = NULL;
    if (!m) return pdp__err(PDP_ERR_INVALID, "%s: model is NULL", fn);
    if (!(0 <= lo && lo <= hi && hi <= m->param_count))
        return pdp__err(PDP_ERR_INVALID, "%s: range [%lld, %lld) is not inside the model's %lld "
                        "parameters", fn, (long long)lo, (long long)hi,
                        (long long)m->param_count);
    return pdp__optim_alloc(out, m, desc, lo, hi, false, fn);
}

/* ZeRO: state for count floats in the executor's shard layout (zero.c), stepped
   by pdp__optim_step_at only; pdp_optim_step and the full checkpoints refuse it. */
PDP__PRIVATE pdp_status pdp__optim_create_shard(pdp_optim **out, pdp_model *m,
                                                const pdp_optim_desc *desc, int64_t count,
                                                const char *fn)
{
    if (!out) return pdp__err(PDP_ERR_INVALID, "%s: out is NULL", fn);
    *out = NULL;
    if (!m) return pdp__err(PDP_ERR_INVALID, "%s: model is NULL", fn);
    if (count < 0) return pdp__err(PDP_ERR_INVALID, "%s: shard of %lld floats", fn,
                                   (long long)count);
    return pdp__optim_alloc(out, m, desc, 0, count, true, fn);
}

/* Does every rank step by the same rule (ZeRO's shards, DDP's replicas)? The resolved desc's
   fields, compared over c's ranks (pdp__comm_same_values: the integers exactly, the doubles
   within 1e-4 relative): an optimizer that differs on one rank (Adam here, SGD there; another
   lr) would update its parameters by another rule, silently. Collective over c. */
PDP__PRIVATE pdp_status pdp__optim_agree(pdp_comm *c, const pdp_optim_desc *d, const char *fn)
{
    static const char *const names[] = {"kind", "decay_params", "nesterov", "lr", "momentum",
                                        "dampening", "weight_decay", "beta1", "beta2", "eps"};
    double mine[10];
    float sum[10];
    pdp_status st;
    int k, rank = pdp_comm_rank(c);
    mine[0] = d->kind, mine[1] = d->decay_params, mine[2] = d->nesterov, mine[3] = d->lr;
    mine[4] = d->momentum, mine[5] = d->dampening, mine[6] = d->weight_decay;
    mine[7] = d->beta1, mine[8] = d->beta2, mine[9] = d->eps;
    if ((st = pdp__comm_same_values(c, mine, sum, 10, 3, &k)) != PDP_OK)
        return pdp__err_wrap(st, "%s: rank %d: comparing the ranks' optimizers", fn, rank);
    if (k >= 0)
        return pdp__err(PDP_ERR_INVALID, "%s: rank %d: %s %s %g here, but not on every rank "
                        "(the sum over %d ranks is %g): every rank steps by the same "
                        "optimizer", fn, rank, pdp_optim_kind_name(d->kind), names[k],
                        mine[k], pdp_comm_size(c), (double)sum[k]);
    return PDP_OK;
}

PDP_API pdp_status pdp_optim_create(pdp_optim **out, pdp_model *m, const pdp_optim_desc *desc)
{
    return pdp__optim_create_range(out, m, desc, 0, m ? m->param_count : 0, "pdp_optim_create");
}

/* Whether o holds state for the whole block (the public functions' optimizer). */
PDP__PRIVATE bool pdp__optim_is_full(const pdp_optim *o)
{
    return o->lo == 0 && o->hi == o->count && !o->shard;
}

PDP_API void pdp_optim_free(pdp_optim *o)
{
    int k;
    if (!o) return;
    for (k = 0; k < 2; k++) pdp__dev_free(o->device, o->state[k]); /* the model may be gone */
    pdp__dealloc(o);
}

/* pdp_optim_zero_grad on the CPU: the gradient block's memset split over the intra-op
   threads (ranges of 16 floats) once each thread has PDP__OPTIM_MIN_PER_THREAD floats;
   a serial memset of GPT-2 124M's 497 MB was a pass the second thread did not share. */
typedef struct pdp__zero_job {
    float *g;
    int64_t n;
} pdp__zero_job;

PDP__PRIVATE void pdp__optim_zero_part(void *arg, int part, int nparts)
{
    const pdp__zero_job *j = (const pdp__zero_job *)arg;
    int64_t blocks = (j->n + 15) / 16;
    int64_t lo = PDP__MIN(j->n, blocks * part / nparts * 16);
    int64_t hi = PDP__MIN(j->n, blocks * (part + 1) / nparts * 16);
    if (lo < hi) memset(j->g + lo, 0, (size_t)(hi - lo) * sizeof(float));
}

PDP_API void pdp_optim_zero_grad(pdp_optim *o)
{
    double t0 = pdp__prof.on ? pdp__now() : 0.0;
    pdp_model *m = o ? o->model : NULL;
    /* an executor's model (m->event: DDP, ZeRO) through pdp_model_zero_grad, which tells it */
    if (m && !m->event && m->device.kind == PDP_DEVICE_CPU && m->param_count && m->grad_block) {
        pdp__zero_job j;
        int threads = pdp__threads_for_caller();
        j.g = m->grad_block;
        j.n = m->param_count;
        threads = (int)PDP__MAX(1, PDP__MIN((int64_t)threads, j.n / PDP__OPTIM_MIN_PER_THREAD));
        pdp__parallel_for(threads, pdp__optim_zero_part, &j);
    } else if (m) {
        pdp_model_zero_grad(m);
    }
    if (pdp__prof.on) pdp__prof.optim_s += pdp__now() - t0;
}

PDP_API pdp_status pdp_optim_set_lr(pdp_optim *o, double lr)
{
    if (!o) return pdp__err(PDP_ERR_INVALID, "pdp_optim_set_lr: optimizer is NULL");
    if (!pdp__optim_nonneg(lr))
        return pdp__err(PDP_ERR_INVALID, "pdp_optim_set_lr: lr %g must be finite, >= 0 and <= "
                        "FLT_MAX (the optimizer keeps lr %g)", lr, o->desc.lr);
    o->desc.lr = lr;
    return PDP_OK;
}

PDP_API double pdp_optim_lr(const pdp_optim *o) { return o ? o->desc.lr : 0.0; }
PDP_API int64_t pdp_optim_steps(const pdp_optim *o) { return o ? o->steps : 0; }

PDP_API pdp_optim_desc pdp_optim_get_desc(const pdp_optim *o)
{
    pdp_optim_desc d;
    if (o) return o->desc;
    memset(&d, 0, sizeof d);
    return d;
}

/* ---- optim: the update ---- */

/* What torch/optim/sgd.py, adam.py and adamw.py (_single_tensor_*) do with their
   Python-float (double) hyper-parameters: 1 - dampening, 1 - beta, the bias corrections
   (beta ** step, step a float), step_size = lr / bias_correction1, sqrt(bias_correction2)
   and AdamW's 1 - lr * weight_decay are computed in double; each result, and each
   hyper-parameter used as it is, is rounded to float once, where it meets a float tensor
   as a scalar argument (alpha=, value=, mul_(x), add_(eps), / x: ATen's CPU and CUDA
   kernels take a float tensor's scalars as float). */
PDP__PRIVATE void pdp__optim_scalars_of(const pdp_optim *o, pdp__optim_scalars *s)
{
    const pdp_optim_desc *d = &o->desc;
    double t = (double)(o->steps + 1);
    memset(s, 0, sizeof *s);
    s->kind = d->kind;
    s->lr = (float)d->lr;
    if (d->kind == PDP_OPTIM_SGD) {
        s->momentum = (float)d->momentum;
        s->one_minus_damp = (float)(1.0 - d->dampening);
        s->weight_decay = (float)d->weight_decay;
        s->nesterov = d->nesterov;
        s->first = o->steps == 0;
        return;
    }
    s->beta1 = (float)d->beta1;
    s->beta2 = (float)d->beta2;
    s->one_minus_beta1 = (float)(1.0 - d->beta1);
    s->one_minus_beta2 = (float)(1.0 - d->beta2);
    s->step_size = (float)(d->lr / (1.0 - pow(d->beta1, t)));
    s->bc2_sqrt = (float)sqrt(1.0 - pow(d->beta2, t));
    s->eps = (float)d->eps;
    s->l2 = d->kind == PDP_OPTIM_ADAM ? (float)d->weight_decay : 0.0f;
    s->decay = d->kind == PDP_OPTIM_ADAMW ? (float)(1.0 - d->lr * d->weight_decay) : 1.0f;
}

/* The CPU loops: the math.h helpers per element, in blocks of 16 with a
   fixed-count inner loop (which GCC's -O2 cost model vectorises; a loop of
   unknown count it leaves scalar), then a scalar tail. Adam takes the square
   roots of a block between its two halves with SIMD sqrt where available
   (IEEE sqrt is correctly rounded: the same bits as sqrtf). */
#define PDP__OPTIM_BLOCK 16

PDP__PRIVATE void pdp__sqrt_block(float *out, const float *in)
{
#if !defined(PDP_NO_SIMD) && defined(__AVX512F__)
    /* the zero-masking form: gcc's _mm512_sqrt_ps merges into _mm512_undefined_ps(), which
       g++ reports as -Wmaybe-uninitialized; the instruction is the same (vsqrtps) */
    _mm512_storeu_ps(out, _mm512_maskz_sqrt_ps((__mmask16)0xffff, _mm512_loadu_ps(in)));
#elif !defined(PDP_NO_SIMD) && defined(__AVX__)
    _mm256_storeu_ps(out, _mm256_sqrt_ps(_mm256_loadu_ps(in)));
    _mm256_storeu_ps(out + 8, _mm256_sqrt_ps(_mm256_loadu_ps(in + 8)));
#elif !defined(PDP_NO_SIMD) && defined(__SSE2__)
    int j;
    for (j = 0; j < PDP__OPTIM_BLOCK; j += 4)
        _mm_storeu_ps(out + j, _mm_sqrt_ps(_mm_loadu_ps(in + j)));
#else
    int j;
    for (j = 0; j < PDP__OPTIM_BLOCK; j++) out[j] = sqrtf(in[j]);
#endif
}

PDP__PRIVATE void pdp__sgd_loop(float *PDP__RESTRICT p, const float *PDP__RESTRICT g,
                                float *PDP__RESTRICT buf, int64_t n, const pdp__optim_scalars *s)
{
    const float lr = s->lr, mom = s->momentum, omd = s->one_minus_damp, wd = s->weight_decay;
    const int nesterov = s->nesterov, first = s->first;
    int64_t i = 0;
    int j;
    if (mom == 0.0f) {
        for (; i + PDP__OPTIM_BLOCK <= n; i += PDP__OPTIM_BLOCK)
            for (j = 0; j < PDP__OPTIM_BLOCK; j++)
                p[i + j] = pdp__sgd_update(p[i + j], g[i + j], lr, wd);
        for (; i < n; i++) p[i] = pdp__sgd_update(p[i], g[i], lr, wd);
        return;
    }
    for (; i + PDP__OPTIM_BLOCK <= n; i += PDP__OPTIM_BLOCK)
        for (j = 0; j < PDP__OPTIM_BLOCK; j++)
            p[i + j] = pdp__sgd_momentum_update(p[i + j], g[i + j], &buf[i + j], lr, mom, omd, wd,
                                                nesterov, first);
    for (; i < n; i++)
        p[i] = pdp__sgd_momentum_update(p[i], g[i], &buf[i], lr, mom, omd, wd, nesterov, first);
}

PDP__PRIVATE void pdp__adam_loop(float *PDP__RESTRICT p, const float *PDP__RESTRICT g,
                                 float *PDP__RESTRICT m, float *PDP__RESTRICT v, int64_t n,
                                 const pdp__optim_scalars *s)
{
    const float b1 = s->beta1, omb1 = s->one_minus_beta1, b2 = s->beta2, omb2 = s->one_minus_beta2;
    const float step_size = s->step_size, bc2_sqrt = s->bc2_sqrt, eps = s->eps, l2 = s->l2;
    const float decay = s->decay;
    float sq[PDP__OPTIM_BLOCK];
    int64_t i = 0;
    int j;
    for (; i + PDP__OPTIM_BLOCK <= n; i += PDP__OPTIM_BLOCK) {
        for (j = 0; j < PDP__OPTIM_BLOCK; j++)
            pdp__adam_moments(p[i + j], g[i + j], &m[i + j], &v[i + j], b1, omb1, b2, omb2, l2);
        pdp__sqrt_block(sq, v + i);
        for (j = 0; j < PDP__OPTIM_BLOCK; j++)
            p[i + j] = pdp__adam_apply(p[i + j], m[i + j], sq[j], step_size, bc2_sqrt, eps, decay);
    }
    for (; i < n; i++)
        p[i] = pdp__adam_update(p[i], g[i], &m[i], &v[i], b1, omb1, b2, omb2, step_size, bc2_sqrt,
                                eps, l2, decay);
}

typedef struct pdp__optim_job {
    const pdp__optim_scalars *s;
    float *params;
    const float *grads;
    float *state[2];     /* state[k][i - state_lo] belongs to element i */
    int64_t state_lo;
    int64_t lo, hi;
} pdp__optim_job;

/* Elements [lo, hi) of the job, part i of n (ranges aligned to 16 floats). */
PDP__PRIVATE void pdp__optim_part(void *arg, int part, int nparts)
{
    const pdp__optim_job *j = (const pdp__optim_job *)arg;
    int64_t len = j->hi - j->lo;
    int64_t per = ((len + nparts - 1) / nparts + 15) & ~(int64_t)15;
    int64_t a = j->lo + per * part, b = PDP__MIN(j->hi, a + per), sa = a - j->state_lo;
    if (a >= b) return;
    if (j->s->kind == PDP_OPTIM_SGD)
        pdp__sgd_loop(j->params + a, j->grads + a, j->state[0] ? j->state[0] + sa : NULL, b - a,
                      j->s);
    else
        pdp__adam_loop(j->params + a, j->grads + a, j->state[0] + sa, j->state[1] + sa, b - a,
                       j->s);
}

/* The job of n elements, params[i] from grads[i] with state element state_off + i of
   o's buffers, by the update scalars s. */
PDP__PRIVATE void pdp__optim_job_of(const pdp_optim *o, const pdp__optim_scalars *s, float *params,
                                    const float *grads, int64_t state_off, int64_t n,
                                    pdp__optim_job *job)
{
    job->s = s;
    job->params = params;
    job->grads = grads;
    job->state[0] = o->state[0] ? o->state[0] + state_off : NULL;
    job->state[1] = o->state[1] ? o->state[1] + state_off : NULL;
    job->state_lo = 0;
    job->lo = 0;
    job->hi = n;
}

/* ---- optim: which tensors decay ----
   PDP_DECAY_MATRICES leaves the 1-D tensors (biases, LayerNorm) undecayed: the update
   runs over the flat block in runs of tensors under one rule, the undecayed ones with the
   scalars of weight_decay 0 (torch.optim's second group: the same element code, and so the
   same bits as a separate optimizer with weight_decay 0 on them). */

/* Does o decay some tensors and not others? */
PDP__PRIVATE bool pdp__optim_split_decay(const pdp_optim *o)
{
    return o->desc.decay_params == PDP_DECAY_MATRICES && o->desc.weight_decay > 0.0;
}

/* The scalars of s with the weight decay taken out (SGD's and Adam's L2, AdamW's factor). */
PDP__PRIVATE void pdp__optim_scalars_no_decay(const pdp__optim_scalars *s,
                                              pdp__optim_scalars *out)
{
    *out = *s;
    out->weight_decay = 0.0f;
    out->l2 = 0.0f;
    out->decay = 1.0f;
}

/* From flat element at (< end) of m's block: the end of the run of elements whose tensors
   share one rule, and the rule (*decay: the tensor has 2 or more dimensions). Elements
   past the last tensor (ZeRO's padding) take the last tensor's rule. */
PDP__PRIVATE int64_t pdp__optim_decay_run(const pdp_model *m, int64_t at, int64_t end,
                                          bool *decay)
{
    int lo = 0, hi = m->nparams - 1, p;
    while (lo < hi) { /* the last tensor that starts at or before at */
        int mid = (lo + hi + 1) / 2;
        if (m->params[mid].offset <= at) lo = mid;
        else hi = mid - 1;
    }
    *decay = m->nparams == 0 || m->params[lo].ndim >= 2;
    for (p = lo + 1; p < m->nparams && m->params[p].offset < end; p++)
        if ((m->params[p].ndim >= 2) != *decay) return m->params[p].offset;
    return end;
}

/* n elements under the scalars s, on o's device (CPU: the caller's intra-op threads). */
PDP__PRIVATE pdp_status pdp__optim_run(const pdp_optim *o, const pdp__optim_scalars *s,
                                       float *params, const float *grads, int64_t state_off,
                                       int64_t n)
{
    pdp__optim_job job;
    int threads;
    if (o->model->device.kind != PDP_DEVICE_CPU) /* one fused kernel (cuda_host.c) */
        return pdp__cuda_optim_update(o->model->device, s, params, grads,
                                      o->state[0] ? o->state[0] + state_off : NULL,
                                      o->state[1] ? o->state[1] + state_off : NULL, n);
    pdp__optim_job_of(o, s, params, grads, state_off, n, &job);
    threads = pdp__threads_for_caller();
    threads = (int)PDP__MAX(1, PDP__MIN((int64_t)threads, n / PDP__OPTIM_MIN_PER_THREAD));
    pdp__parallel_for(threads, pdp__optim_part, &job);
    return PDP_OK;
}

/* The state-offset step: n elements, params[i] from grads[i] with state element
   state_off + i of o's buffers, element i being flat element flat_off + i of the model's
   block (ZeRO: a unit's slice, the parameters in the model's block or the shard, the
   gradients in the executor's buffer). Does not advance steps (pdp__optim_finish_step). */
PDP__PRIVATE pdp_status pdp__optim_step_at(pdp_optim *o, float *params, const float *grads,
                                           int64_t state_off, int64_t n, int64_t flat_off)
{
    pdp__optim_scalars s, s0;
    int64_t i, end;
    bool decay;
    pdp_status st;
    PDP_ASSERT(o && state_off >= 0 && n >= 0 && state_off + n <= o->hi - o->lo);
    if (n == 0) return PDP_OK;
    pdp__optim_scalars_of(o, &s);
    if (!pdp__optim_split_decay(o)) return pdp__optim_run(o, &s, params, grads, state_off, n);
    pdp__optim_scalars_no_decay(&s, &s0);
    for (i = 0; i < n; i = end) {
        end = pdp__optim_decay_run(o->model, flat_off + i, flat_off + n, &decay) - flat_off;
        if ((st = pdp__optim_run(o, decay ? &s : &s0, params + i, grads + i, state_off + i,
                                 end - i)) != PDP_OK)
            return st;
    }
    return PDP_OK;
}

/* Elements [lo, hi) of the flat blocks on the calling thread, with the scalars of
   the update in flight (pdp__optim_scalars_of, taken once per update): a CPU
   optimizer stepped in many small ranges (DataParallel's fused step) without
   recomputing them per range or taking the pool. */
PDP__PRIVATE void pdp__optim_update_range(const pdp_optim *o, const pdp__optim_scalars *s,
                                          float *params, const float *grads, int64_t lo, int64_t hi)
{
    pdp__optim_scalars s0;
    pdp__optim_job job;
    int64_t end;
    bool decay = true;
    PDP_ASSERT(o && o->model->device.kind == PDP_DEVICE_CPU && o->lo <= lo && lo <= hi &&
               hi <= o->hi);
    if (pdp__optim_split_decay(o)) pdp__optim_scalars_no_decay(s, &s0);
    for (; lo < hi; lo = end) {
        end = pdp__optim_split_decay(o) ? pdp__optim_decay_run(o->model, lo, hi, &decay) : hi;
        pdp__optim_job_of(o, decay ? s : &s0, params + lo, grads + lo, lo - o->lo, end - lo,
                          &job);
        pdp__optim_part(&job, 0, 1);
    }
}

/* params and grads are full-size blocks: element i of each is parameter
   element i; [lo, hi) lies inside the range o holds state for. */
PDP__PRIVATE pdp_status pdp__optim_step_range(pdp_optim *o, float *params, const float *grads,
                                              int64_t lo, int64_t hi)
{
    PDP_ASSERT(o && o->lo <= lo && lo <= hi && hi <= o->hi);
    return pdp__optim_step_at(o, params + lo, grads + lo, lo - o->lo, hi - lo, lo);
}

/* Marks the update in flight as done (after every range of it). */
PDP__PRIVATE void pdp__optim_finish_step(pdp_optim *o) { o->steps++; }

/* What pdp_optim_step checks before it changes anything (its messages). */
PDP__PRIVATE pdp_status pdp__optim_check_step(const pdp_optim *o)
{
    const pdp_model *m;
    if (!o) return pdp__err(PDP_ERR_INVALID, "pdp_optim_step: optimizer is NULL");
    m = o->model;
    if (m->param_count != o->count)
        return pdp__err(PDP_ERR_STATE,
                        "pdp_optim_step: the model has %lld parameters, %lld when the optimizer "
                        "was created (layers added after pdp_optim_create)",
                        (long long)m->param_count, (long long)o->count);
    if (o->shard)
        return pdp__err(PDP_ERR_STATE, "pdp_optim_step: the optimizer holds a ZeRO shard "
                        "(pdp_zero_optim_create): step it with pdp_zero_step");
    if (m->param_count > 0 && (!m->param_block || !m->grad_block))
        return pdp__err(PDP_ERR_STATE, "pdp_optim_step: the model's %s sharded by ZeRO: step "
                        "with pdp_zero_step", m->grad_block ? "parameters are" : "gradients are");
    if (m->grads_reducing)
        return pdp__err(PDP_ERR_STATE, "pdp_optim_step: the last backward's gradients are still "
                        "being reduced over the ranks: call %s first", m->grads_reducing);
    return PDP_OK;
}

PDP_API pdp_status pdp_optim_step(pdp_optim *o)
{
    pdp_model *m;
    pdp_status st;
    double t0;
    if ((st = pdp__optim_check_step(o)) != PDP_OK) return st;
    m = o->model;
    t0 = pdp__prof.on ? pdp__now() : 0.0;
    st = pdp__optim_step_range(o, m->param_block, m->grad_block, o->lo, o->hi);
    if (pdp__prof.on) pdp__prof.optim_s += pdp__now() - t0;
    if (st != PDP_OK) return pdp__err_wrap(st, "pdp_optim_step");
    pdp__optim_finish_step(o);
    return PDP_OK;
}

/* ---- optim: gradient clipping ---- */

PDP__PRIVATE pdp_status pdp__grad_sumsq(const pdp_model *m, const float *g, int64_t n, double *sum,
                                        const char *fn)
{
    double s = 0.0;
    int64_t i;
    if (n <= 0) return PDP_OK;
    if (m->device.kind != PDP_DEVICE_CPU) {
        /* pdp_cuda.cu: block partial sums in double, added by the host in block order */
        pdp_status st = pdp__cuda_sumsq(m->device, g, n, &s, fn);
        if (st != PDP_OK) return st;
    } else {
        for (i = 0; i < n; i++) s += (double)g[i] * (double)g[i];
    }
    *sum += s;
    return PDP_OK;
}

PDP__PRIVATE pdp_status pdp__grad_scale(const pdp_model *m, float *g, int64_t n, float coef,
                                        const char *fn)
{
    int64_t i;
    if (n <= 0) return PDP_OK;
    if (m->device.kind != PDP_DEVICE_CPU) return pdp__cuda_scale(m->device, g, n, coef, fn);
    for (i = 0; i < n; i++) g[i] *= coef;
    return PDP_OK;
}

PDP__PRIVATE pdp_status pdp__grad_sumsq_range(const pdp_model *m, const float *g, int64_t lo,
                                              int64_t hi, double *sum, const char *fn)
{
    int p;
    pdp_status st;
    if (!m->tp.comm) return pdp__grad_sumsq(m, g, hi - lo, sum, fn);
    for (p = 0; p < m->nparams; p++) { /* each tensor's part of [lo, hi) */
        const pdp__param_entry *e = &m->params[p];
        int64_t a = PDP__MAX(lo, e->offset), b = PDP__MIN(hi, e->offset + e->count);
        if (a >= b || (m->tp.rank != 0 && !pdp__tp_is_split(m, p))) continue;
        if ((st = pdp__grad_sumsq(m, g + (a - lo), b - a, sum, fn)) != PDP_OK) return st;
    }
    return PDP_OK;
}

PDP__PRIVATE pdp_status pdp__check_max_norm(float max_norm, const char *fn)
{
    /* NaN would scale by NaN, +Inf clip nothing while looking like a setting */
    if (!(max_norm >= 0.0f && max_norm <= FLT_MAX))
        return pdp__err(PDP_ERR_INVALID, "%s: max_norm %g must be finite and >= 0", fn,
                        (double)max_norm);
    return PDP_OK;
}

PDP__PRIVATE float pdp__clip_coef(float max_norm, double norm)
{
    /* torch.nn.utils.clip_grad_norm_: clip_coef = max_norm / (norm + 1e-6), clamped to 1 */
    return (float)((double)max_norm / (norm + 1e-6));
}

PDP__PRIVATE pdp_status pdp__grad_allreduce_sum(pdp_comm *c, float *host, float *dev, double *sum)
{
    pdp_status st;
    *host = (float)*sum;
    if (dev) {
        if ((st = pdp__dev_copy(c->device, dev, pdp_cpu(), host, sizeof *host)) != PDP_OK ||
            (st = pdp_comm_allreduce(c, dev, 1, PDP_REDUCE_SUM, NULL)) != PDP_OK ||
            (st = pdp__dev_copy(pdp_cpu(), host, c->device, dev, sizeof *host)) != PDP_OK)
            return st;
    } else if ((st = pdp_comm_allreduce(c, host, 1, PDP_REDUCE_SUM, NULL)) != PDP_OK) {
        return st;
    }
    *sum = (double)*host;
    return PDP_OK;
}

/* On a TP model (a TP communicator attached) a collective over the TP group: every rank
   adds its slices and TP rank 0 the replicated tensors (pdp__grad_sumsq_range), one
   all-reduce gives every rank the full model's norm, so every rank scales by the same
   coefficient and the replicated tensors stay the same bits. */
PDP_API pdp_status pdp_clip_grad_norm(pdp_model *m, float max_norm, float *total_norm)
{
    static const char *fn = "pdp_clip_grad_norm";
    double sum = 0.0, norm;
    float coef;
    pdp_status st;
    if (total_norm) *total_norm = 0.0f;
    if (!m) return pdp__err(PDP_ERR_INVALID, "%s: model is NULL", fn);
    if ((st = pdp__check_max_norm(max_norm, fn)) != PDP_OK) return st;
    if (m->wrapped == PDP__WRAP_PP)
        return pdp__err(PDP_ERR_STATE, "%s: the model is a pipeline stage holding one stage's "
                        "gradients: use pdp_pp_clip_grad_norm (collective over the pipeline)", fn);
    if (m->wrapped == PDP__WRAP_ZERO || (!m->grad_block && m->param_count))
        return pdp__err(PDP_ERR_STATE, "%s: the model's gradients are sharded by ZeRO: use "
                        "pdp_zero_clip_grad_norm", fn);
    if (m->grads_reducing)
        return pdp__err(PDP_ERR_STATE, "%s: the last backward's gradients are still being "
                        "reduced over the ranks: call %s first", fn, m->grads_reducing);
    if ((st = pdp__grad_sumsq_range(m, m->grad_block, 0, m->param_count, &sum, fn)) != PDP_OK)
        return st;
    if (m->tp.comm && m->tp.size > 1 &&
        (st = pdp__grad_allreduce_sum(m->tp.comm, &m->tp.scalar, m->tp.dscalar, &sum)) != PDP_OK)
        return pdp__err_wrap(st, "%s: TP rank %d of %d: all-reducing the squared norm", fn,
                             m->tp.rank, m->tp.size);
    norm = sqrt(sum);
    if (total_norm) *total_norm = (float)norm;
    if (!isfinite(norm)) return pdp__err(PDP_ERR_NUMERIC, "%s: the gradient norm is %g", fn, norm);
    coef = pdp__clip_coef(max_norm, norm);
    if (coef >= 1.0f) return PDP_OK;
    return pdp__grad_scale(m, m->grad_block, m->param_count, coef, fn);
}

/* ---- optim: learning-rate schedule ---- */

PDP_API double pdp_lr_warmup_cosine(int64_t step, int64_t warmup, int64_t total, double base_lr,
                                    double min_lr)
{
    const double pi = 3.14159265358979323846;
    double progress;
    /* no status to return: an input outside the documented ranges gives NaN (optim.h) */
    if (step < 0 || warmup < 0 || total < 0 || !(base_lr >= 0.0 && base_lr <= DBL_MAX) ||
        !(min_lr >= 0.0 && min_lr <= DBL_MAX))
        return NAN;
    if (step < warmup) return base_lr * (double)(step + 1) / (double)warmup;
    if (step >= total) return min_lr;
    progress = (double)(step - warmup) / (double)(total - warmup);
    return min_lr + 0.5 * (base_lr - min_lr) * (1.0 + cos(pi * progress));
}
