/* trainer: the strategy-agnostic front of the data-parallel executors (trainer.h). A trainer
   holds at most one executor, the one its strategy names (the others stay NULL), and the
   optimizer made for it; each call is a switch over the strategy into the executors' own
   calls, so a trainer step is bit for bit the direct calls' step (tests/test_trainer.c holds
   every strategy at 1-3 ranks to one device). What it adds is desc.accum_steps: a count of
   the backward passes, no_sync set for the executor, and the sum scaled by 1/k once it is
   reduced (pdp__trainer_ready). */

struct pdp_trainer {
    pdp_trainer_desc desc; /* as given, with zero.stage the strategy's */
    pdp_model *m;
    pdp_optim *opt;
    pdp_dp *dp;     /* the strategy's executor: one of these, or none (single) */
    pdp_ddp *ddp;
    pdp_zero *z;
    pdp_device gpus[PDP_DP_MAX_WORKERS]; /* DP on a CUDA model without dp.devices */
    int micro;   /* accum_steps: forward_backward calls since the last step */
    bool scaled; /* accum_steps: this step's gradients have been averaged */
};

static const char *const pdp__strategy_names[] = {"single", "dp", "ddp", "zero1", "zero2", "zero3"};

PDP_API const char *pdp_strategy_name(pdp_strategy s)
{
    return (int)s >= 0 && (int)s <= (int)PDP_STRATEGY_ZERO3 ? pdp__strategy_names[s] : "unknown";
}

PDP_API pdp_status pdp_strategy_from_name(const char *name, pdp_strategy *out)
{
    int i;
    if (!out) return pdp__err(PDP_ERR_INVALID, "pdp_strategy_from_name: out is NULL");
    for (i = 0; name && i <= (int)PDP_STRATEGY_ZERO3; i++)
        if (!strcmp(name, pdp__strategy_names[i])) {
            *out = (pdp_strategy)i;
            return PDP_OK;
        }
    return pdp__err(PDP_ERR_INVALID, "pdp_strategy_from_name: '%s' is not a strategy (single, "
                    "dp, ddp, zero1, zero2 or zero3)", name ? name : "(null)");
}

/* Every rank accumulates over the same number of backward passes: a rank reducing on another
   call than its peers would sum another step's gradients with theirs. */
PDP__PRIVATE pdp_status pdp__trainer_accum_agree(pdp_comm *c, int k, const char *fn)
{
    double mine = (double)k;
    float sum;
    int differs;
    pdp_status st = pdp__comm_same_values(c, &mine, &sum, 1, 1, &differs);
    if (st != PDP_OK)
        return pdp__err_wrap(st, "%s: rank %d: comparing the ranks' accum_steps", fn,
                             pdp_comm_rank(c));
    if (differs >= 0)
        return pdp__err(PDP_ERR_INVALID, "%s: rank %d: desc.accum_steps %d here, but not on "
                        "every rank (the sum over %d ranks is %g): the ranks reduce together",
                        fn, pdp_comm_rank(c), k, pdp_comm_size(c), (double)sum);
    return PDP_OK;
}

/* The desc's own fields checked, zero.stage set to the strategy's; in may be NULL. */
PDP__PRIVATE pdp_status pdp__trainer_desc_defaults(const pdp_trainer_desc *in,
                                                   pdp_trainer_desc *out, const char *fn)
{
    pdp_trainer_desc d;
    int stage;
    if (in) d = *in;
    else memset(&d, 0, sizeof d);
    if ((int)d.strategy < 0 || (int)d.strategy > (int)PDP_STRATEGY_ZERO3)
        return pdp__err(PDP_ERR_INVALID, "%s: strategy %d is none of PDP_STRATEGY_SINGLE, _DP, "
                        "_DDP, _ZERO1, _ZERO2, _ZERO3", fn, (int)d.strategy);
    if (d.strategy >= PDP_STRATEGY_DDP && !d.comm)
        return pdp__err(PDP_ERR_INVALID, "%s: strategy %s needs desc.comm, the data-parallel "
                        "communicator", fn, pdp_strategy_name(d.strategy));
    if (d.strategy < PDP_STRATEGY_DDP && d.comm)
        return pdp__err(PDP_ERR_INVALID, "%s: strategy %s runs in this process and takes no "
                        "communicator (desc.comm): ddp or zero1-3 train across ranks", fn,
                        pdp_strategy_name(d.strategy));
    stage = d.strategy >= PDP_STRATEGY_ZERO1 ? (int)d.strategy - (int)PDP_STRATEGY_DDP : 0;
    if (stage && d.zero.stage != 0 && d.zero.stage != stage)
        return pdp__err(PDP_ERR_INVALID, "%s: strategy %s with desc.zero.stage %d (leave it 0, "
                        "or give %d)", fn, pdp_strategy_name(d.strategy), d.zero.stage, stage);
    d.zero.stage = stage;
    if (d.accum_steps < 0)
        return pdp__err(PDP_ERR_INVALID, "%s: desc.accum_steps %d is negative (0 or 1: no "
                        "accumulation, k: k backward passes a step)", fn, d.accum_steps);
    if (d.accum_steps == 0) d.accum_steps = 1;
    *out = d;
    return PDP_OK;
}

PDP_API pdp_status pdp_trainer_create(pdp_trainer **out, pdp_model *m,
                                      const pdp_trainer_desc *desc)
{
    static const char *fn = "pdp_trainer_create";
    pdp_trainer_desc d;
    pdp_trainer *t;
    pdp_status st;
    if (!out) return pdp__err(PDP_ERR_INVALID, "%s: out is NULL", fn);
    *out = NULL;
    if (!m) return pdp__err(PDP_ERR_INVALID, "%s: model is NULL", fn);
    if ((st = pdp__trainer_desc_defaults(desc, &d, fn)) != PDP_OK) return st;
    if (!(t = (pdp_trainer *)pdp__calloc(sizeof *t)))
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory", fn);
    t->desc = d;
    t->m = m;
    if (d.strategy == PDP_STRATEGY_DP && !d.dp.devices && m->device.kind == PDP_DEVICE_CUDA &&
        d.dp.num_workers > 0 && d.dp.num_workers <= PDP_DP_MAX_WORKERS) {
        int i; /* a GPU a worker from the model's on (DataParallel's device_ids[0] holds it) */
        for (i = 0; i < d.dp.num_workers; i++) t->gpus[i] = pdp_cuda(m->device.ordinal + i);
        d.dp.devices = t->gpus;
    }
    switch (d.strategy) {
    case PDP_STRATEGY_SINGLE: st = PDP_OK; break;
    case PDP_STRATEGY_DP: st = pdp_dp_create(&t->dp, m, &d.dp); break;
    case PDP_STRATEGY_DDP: st = pdp_ddp_create(&t->ddp, m, d.comm, &d.ddp); break;
    default: st = pdp_zero_create(&t->z, m, d.comm, &d.zero); break;
    }
    if (st == PDP_OK)
        st = t->z ? pdp_zero_optim_create(&t->opt, t->z, &d.optim)
                  : pdp_optim_create(&t->opt, m, &d.optim);
    if (st != PDP_OK)
        st = pdp__err_wrap(st, "%s (strategy %s)", fn, pdp_strategy_name(d.strategy));
    if (st == PDP_OK && t->dp) pdp__dp_count_optim(t->dp, t->opt); /* the master's memory */
    /* DDP's replicas step by the same optimizer (ZeRO's shard optimizer checks its own) */
    if (t->ddp && (st = pdp__comm_agree(d.comm, st, fn)) == PDP_OK)
        st = pdp__optim_agree(d.comm, &t->opt->desc, fn);
    if (d.comm && st == PDP_OK) st = pdp__trainer_accum_agree(d.comm, d.accum_steps, fn);
    /* The optimizer (and the executor after its collectives) can fail on one rank alone, an
       allocation or a desc that differs: every rank learns it here instead of waiting in the
       first step's collective for a rank that has left. After a timeout it would wait as
       long. */
    if (d.comm && st != PDP_ERR_TIMEOUT) st = pdp__comm_agree(d.comm, st, fn);
    if (st != PDP_OK) {
        pdp_trainer_free(t);
        return st;
    }
    *out = t;
    return PDP_OK;
}

PDP_API void pdp_trainer_free(pdp_trainer *t)
{
    if (!t) return;
    pdp_optim_free(t->opt);
    pdp_zero_free(t->z);
    pdp_ddp_free(t->ddp);
    pdp_dp_free(t->dp);
    pdp__dealloc(t);
}

PDP_API pdp_trainer_desc pdp_trainer_get_desc(const pdp_trainer *t)
{
    pdp_trainer_desc d;
    memset(&d, 0, sizeof d);
    if (!t) return d;
    d.strategy = t->desc.strategy;
    d.comm = t->desc.comm;
    d.optim = pdp_optim_get_desc(t->opt);
    if (t->dp) d.dp = pdp_dp_get_desc(t->dp);
    d.accum_steps = t->desc.accum_steps;
    if (t->ddp) d.ddp = pdp_ddp_get_desc(t->ddp);
    if (t->z) d.zero = pdp_zero_get_desc(t->z);
    return d;
}

PDP_API pdp_status pdp_trainer_forward_backward(pdp_trainer *t, const pdp_tensor *x,
                                                const int32_t *labels, float *loss)
{
    static const char *fn = "pdp_trainer_forward_backward";
    int k;
    float unused;
    pdp_status st;
    if (!t) return pdp__err(PDP_ERR_INVALID, "%s: trainer is NULL", fn);
    if (!loss) loss = &unused; /* trainer.h: may be NULL (the executors want somewhere) */
    k = t->desc.accum_steps;
    if (k > 1 && t->micro == k)
        return pdp__err(PDP_ERR_STATE, "%s: %d backward passes since the step, desc.accum_steps "
                        "%d: call pdp_trainer_step", fn, t->micro, k);
    if (k > 1) { /* the k-th backward reduces; those before it add locally */
        if (t->ddp) pdp_ddp_set_no_sync(t->ddp, t->micro + 1 < k);
        if (t->z) pdp_zero_set_no_sync(t->z, t->micro + 1 < k);
    }
    if (t->dp) st = pdp_dp_forward_backward(t->dp, x, labels, loss); /* split over workers */
    else if (t->ddp) st = pdp_ddp_forward_backward(t->ddp, x, labels, loss);
    else if (t->z) st = pdp_zero_forward_backward(t->z, x, labels, loss);
    else st = pdp_model_forward_backward(t->m, x, labels, loss);
    if (st == PDP_OK) t->micro++;
    return st;
}

/* Before clipping and stepping: the reduction finished (DDP, ZeRO) and, under accum_steps k,
   the k backward passes' sum times 1/k (every gradient this rank steps: ZeRO's shard), once. */
PDP__PRIVATE pdp_status pdp__trainer_ready(pdp_trainer *t, const char *fn)
{
    int k = t->desc.accum_steps;
    float coef = 1.0f / (float)k;
    pdp_status st;
    if (k > 1 && t->micro != k)
        return pdp__err(PDP_ERR_STATE, "%s: %d of desc.accum_steps %d backward passes: call "
                        "pdp_trainer_forward_backward %d more time(s) first", fn, t->micro, k,
                        k - t->micro);
    if (t->z && (st = pdp_zero_finish(t->z)) != PDP_OK) return st;
    if (t->ddp && (st = pdp_ddp_finish(t->ddp)) != PDP_OK) return st; /* averaged */
    if (k == 1 || t->scaled) return PDP_OK;
    st = t->z ? pdp__zero_grad_scale(t->z, coef, fn)
              : pdp__grad_scale(t->m, t->m->grad_block, t->m->param_count, coef, fn);
    t->scaled = st == PDP_OK;
    return st;
}

PDP_API pdp_status pdp_trainer_clip_grad_norm(pdp_trainer *t, float max_norm, float *total_norm)
{
    static const char *fn = "pdp_trainer_clip_grad_norm";
    pdp_status st;
    if (total_norm) *total_norm = 0.0f;
    if (!t) return pdp__err(PDP_ERR_INVALID, "%s: trainer is NULL", fn);
    if ((st = pdp__trainer_ready(t, fn)) != PDP_OK) return st;
    /* ZeRO: the shards' norm, this rank's part of the averaged gradients */
    if (t->z) return pdp_zero_clip_grad_norm(t->z, max_norm, total_norm);
    return pdp_clip_grad_norm(t->m, max_norm, total_norm); /* DP: the master's, reduced */
}

PDP_API pdp_status pdp_trainer_step(pdp_trainer *t)
{
    static const char *fn = "pdp_trainer_step";
    pdp_status st;
    if (!t) return pdp__err(PDP_ERR_INVALID, "%s: trainer is NULL", fn);
    if ((st = pdp__trainer_ready(t, fn)) != PDP_OK) return st;
    if (t->z) st = pdp_zero_step(t->z, t->opt); /* step the shard, zero, gather */
    else if (t->ddp) st = pdp_ddp_step(t->ddp, t->opt); /* step, zero */
    else if ((st = pdp_optim_step(t->opt)) == PDP_OK) pdp_optim_zero_grad(t->opt);
    if (st == PDP_OK) t->micro = 0, t->scaled = false; /* a failed step keeps its gradients */
    return st;
}

PDP_API pdp_status pdp_trainer_get_memory(const pdp_trainer *t, pdp_zero_memory *out)
{
    if (!t || !out)
        return pdp__err(PDP_ERR_INVALID, "pdp_trainer_get_memory: %s is NULL",
                        t ? "out" : "trainer");
    if (t->z) return pdp_zero_get_memory(t->z, t->opt, out);
    /* a whole replica, and every stage planned with the units desc.zero would give */
    return pdp_zero_memory_plan(t->m, t->ddp ? pdp_comm_size(t->desc.comm) : 1, 0,
                                &t->desc.zero, t->opt, out);
}

PDP_API pdp_status pdp_trainer_memory_report(const pdp_trainer *t, int64_t batch, char *buf,
                                             size_t bytes)
{
    const char *fn = "pdp_trainer_memory_report";
    pdp_dp_stats s;
    pdp_zero_memory mm;
    int len;
    if (!t || !buf || batch < 1)
        return pdp__err(PDP_ERR_INVALID, "%s: %s", fn, !t ? "trainer is NULL" : !buf ?
                        "buf is NULL" : "batch < 1");
    if (!t->dp) { /* ZeRO's measured split, or a whole replica's planned (stage 0) */
        pdp_status st = pdp_trainer_get_memory(t, &mm);
        if (st == PDP_OK) st = pdp_gpt_memory_report(t->m, &mm, batch, buf, bytes);
        return st == PDP_OK ? st : pdp__err_wrap(st, "%s", fn); /* its own reason, named */
    }
    PDP_TRY(pdp_dp_get_stats(t->dp, &s));
    if (!s.steps) return pdp__err(PDP_ERR_STATE, "%s: DP's peaks are measured: no step yet", fn);
    len = snprintf(buf, bytes, "DP, %d workers: the master holds %.2f MB (parameters, gradients, "
                   "%s's state, its activations,\n  the gathered outputs), each other worker "
                   "%.2f MB: DP saves nothing and overloads worker 0\n", s.num_workers,
                   (double)s.master_bytes / 1e6, pdp_optim_kind_name(t->desc.optim.kind),
                   (double)s.replica_bytes / 1e6);
    if (len < 0 || (size_t)len >= bytes)
        return pdp__err(PDP_ERR_INVALID, "%s: %zu bytes do not hold the report", fn, bytes);
    return PDP_OK;
}

PDP_API pdp_status pdp_trainer_gather_params(pdp_trainer *t)
{
    if (!t) return pdp__err(PDP_ERR_INVALID, "pdp_trainer_gather_params: trainer is NULL");
    return t->z && pdp_zero_stage(t->z) == 3 ? pdp_zero_gather_params(t->z, NULL) : PDP_OK;
}

PDP_API pdp_model *pdp_trainer_model(const pdp_trainer *t) { return t ? t->m : NULL; }
PDP_API pdp_optim *pdp_trainer_optim(const pdp_trainer *t) { return t ? t->opt : NULL; }
PDP_API pdp_dp *pdp_trainer_dp(const pdp_trainer *t) { return t ? t->dp : NULL; }
PDP_API pdp_ddp *pdp_trainer_ddp(const pdp_trainer *t) { return t ? t->ddp : NULL; }
PDP_API pdp_zero *pdp_trainer_zero(const pdp_trainer *t) { return t ? t->z : NULL; }
