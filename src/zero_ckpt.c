/* zero_ckpt: ZeRO's checkpoints on zero.c's executor: the sharded set
   (pdp_zero_checkpoint_save, pdp_zero_checkpoint_load), the one full file
   (pdp_zero_checkpoint_consolidate) and its re-sharding load at any world size
   (pdp_zero_checkpoint_load_full). Every call is collective.

   Invariants.
   - One save, one run id: rank 0 draws 64 bits per save and sends them to every
     rank inside the save's first agreement; every shard file ("shard.run") and the
     marker carry them, and a load accepts only shards whose id is the marker's.
   - The marker is atomic and last: rank 0 removes the old marker before any shard
     is written, and writes the new one (a temporary, sync, rename, sync of the
     directory) only after every rank has agreed that its shard file is on disk, so
     a set with a marker is complete.
   - Agreement before anything is changed: a load reads and validates into staging
     buffers on every rank, then the ranks agree (pdp__zero_agree: one all-reduce of
     per-rank flags); only when every rank succeeded does any rank commit, so a
     failure anywhere leaves every rank's parameters, optimizer state, seed and step
     as they were. Every rank reaches every agreement, failed or not, so a local
     failure cannot hang the others; a rank that never arrives makes them fail with
     the communicator's status.

   The files: a shard is checkpoint.c's range file (pdp__checkpoint_save_run, flat
   "params" and "optim.<state>"); the marker "P.done" is text, version 2 (see
   pdp__zero_marker_text); the consolidated file is pdp_checkpoint_save's. The set,
   its layout and the run id are described in the first section below and in zero.h.

   The seam with zero.c: amalgamate.py places this module after it; it reads
   struct pdp_zero and its units (pdp__zero_unit) directly and calls
   pdp__zero_release_params and pdp__zero_gather_full (declared in internal.h) and
   the public pdp_zero_gather_params. Of checkpoints zero.c keeps only the counter
   z->saves, an input of each run id.

   References: llm.c's write_checkpoint (karpathy/llm.c, train_gpt2.cu: every rank
   writes its state file, a barrier, then rank 0 writes DONE_<step>); ZeRO's
   partitioned optimizer state (Rajbhandari et al., "ZeRO: Memory Optimizations
   Toward Training Trillion Parameter Models", SC 2020); DeepSpeed's zero_to_fp32.py,
   which consolidates offline what consolidate writes in the run; safetensors
   (https://github.com/huggingface/safetensors). */

#include "internal.h"

/* ---- zero_ckpt: the set, the run id, the agreements ----
   A set under prefix P: rank r's shard file "P.rank<r>.safetensors" and the
   marker "P.done". The shard file is checkpoint.c's shard file of the range
   [r S, (r + 1) S) of the padded shard-order block (every rank's shard in rank
   order, N S floats, S = shard_count): "params" holds the rank's parameter
   slices and "optim.<state>" its optimizer state, both in the shard's layout
   (padding zeros), so shard.lo / shard.hi / shard.count name the rank, the world
   size and the shard size, optim.steps the step, and shard.run the save. The
   marker, written by rank 0 only after every rank's file is on disk, holds the
   plan (world size, stage, step, parameter and shard counts, each unit's offset,
   count and slice) that the load holds the run and every file to, and the save's
   run id, which every shard of the set must carry: two saves at the same step
   and world size write the same plan, and only the id tells their files apart.

   The run id: 64 bits that rank 0 draws at each save (/dev/urandom when it can
   be read, mixed with the wall and monotonic clocks in ns, the pid, the
   executor's address and its count of saves, so two saves never share one even
   without /dev/urandom), sent to every rank inside the first agreement, and
   written as 16 hex digits into every shard's __metadata__ and the marker.

   An agreement that fails itself (a rank stalled, exited or was killed) returns
   the collective's status and message, which name the ranks that did not arrive
   (PDP_ERR_TIMEOUT; PDP_ERR_COMM for a local rank that freed its communicator),
   after the call, the rank and what it was agreeing on. */

/* Every rank's verdict: bad[r] is true when rank r failed. Collective (a sum of
   one-hot flags, on the model's device as the backend wants). With run, rank 0's
   *run reaches every rank (as four 16-bit pieces that only rank 0 adds to the
   sum: exact in floats). On failure, the collective's status and message. */
PDP__PRIVATE pdp_status pdp__zero_agree(pdp_zero *z, bool ok, bool *bad, uint64_t *run)
{
    float flags[64 + 4], *dev = NULL;
    int n = z->size, r, len = run ? n + 4 : n;
    pdp_status st;
    PDP_ASSERT(n <= 64);
    for (r = 0; r < len; r++) flags[r] = 0.0f;
    flags[z->rank] = ok ? 0.0f : 1.0f;
    for (r = 0; run && z->rank == 0 && r < 4; r++)
        flags[n + r] = (float)((*run >> (16 * r)) & 0xffff);
    if (z->m->device.kind == PDP_DEVICE_CPU) {
        st = pdp_comm_allreduce(z->c, flags, len, PDP_REDUCE_SUM, NULL);
    } else {
        if ((st = pdp__dev_alloc(z->m->device, sizeof flags, (void **)&dev)) != PDP_OK) return st;
        if ((st = pdp__dev_copy(z->m->device, dev, pdp_cpu(), flags, (size_t)len * 4)) == PDP_OK &&
            (st = pdp_comm_allreduce(z->c, dev, len, PDP_REDUCE_SUM, NULL)) == PDP_OK)
            st = pdp__dev_copy(pdp_cpu(), flags, z->m->device, dev, (size_t)len * 4);
        pdp__dev_free(z->m->device, dev);
    }
    for (r = 0; r < n; r++) bad[r] = flags[r] != 0.0f;
    if (st == PDP_OK && run)
        for (*run = 0, r = 0; r < 4; r++) *run |= (uint64_t)flags[n + r] << (16 * r);
    return st;
}

/* A new run id (see above); rank 0 draws it once per save. */
PDP__PRIVATE uint64_t pdp__zero_run_id(pdp_zero *z)
{
    uint64_t id = 0, h;
    FILE *f = fopen("/dev/urandom", "rb");
    if (f) {
        if (fread(&id, sizeof id, 1, f) != 1) id = 0;
        fclose(f);
    }
    h = pdp__mix64(id ^ UINT64_C(0x9e3779b97f4a7c15));
    h = pdp__mix64(h ^ pdp__wall_ns());
    h = pdp__mix64(h ^ (uint64_t)(pdp__now() * 1e9));
    h = pdp__mix64(h ^ (uint64_t)pdp__pid());
    h = pdp__mix64(h ^ (uint64_t)(uintptr_t)z);
    return pdp__mix64(h ^ ++z->saves);
}

PDP__PRIVATE void pdp__zero_shard_path(char *out, size_t cap, const char *prefix, int rank)
{
    snprintf(out, cap, "%s.rank%d.safetensors", prefix, rank);
}

/* Checks the call; a step boundary (no backward waiting for its step). */
PDP__PRIVATE pdp_status pdp__zero_ckpt_args(pdp_zero *z, const pdp_optim *opt, const char *path,
                                            const char *fn)
{
    if (!z || !opt || !path)
        return pdp__err(PDP_ERR_INVALID, "%s: %s is NULL", fn, !z ? "zero" : !opt ? "opt" : "path");
    if (!opt->shard || opt->model != z->m || opt->hi != z->shard_count)
        return pdp__err(PDP_ERR_INVALID, "%s: opt was not made by pdp_zero_optim_create for this "
                        "executor", fn);
    if (strlen(path) > 3900) return pdp__err(PDP_ERR_INVALID, "%s: the path is too long", fn);
    if (z->size > 64)
        return pdp__err(PDP_ERR_UNSUPPORTED, "%s: %d ranks (checkpoints: at most 64)", fn, z->size);
    /* a TP model's block holds this TP rank's slices: shard sets named by the DP rank alone
       would have the TP ranks of one DP rank write one file, and a full file needs the
       slices gathered over TP first (not built yet) */
    if (z->m->tp.nlayers)
        return pdp__err(PDP_ERR_UNSUPPORTED, "%s: the model has %d tensor-parallel layers: "
                        "checkpoints of ZeRO over tensor parallelism are not supported yet",
                        fn, z->m->tp.nlayers);
    if (z->r.state != PDP__RED_IDLE || z->deferred != PDP_OK)
        return pdp__err(PDP_ERR_STATE, "%s: rank %d: a backward waits for its step; checkpoint "
                        "after pdp_zero_step", fn, z->rank);
    return PDP_OK;
}

/* The views checkpoint.c's range functions see: a model whose flat block is the
   padded shard-order block, and opt covering rank r's range of it, its state
   (or the given buffers) at the range's start. */
PDP__PRIVATE void pdp__zero_ckpt_views(const pdp_zero *z, const pdp_optim *opt, float *const *state,
                                       pdp_model *mv, pdp_optim *ov)
{
    int k;
    *mv = *z->m;
    mv->param_count = (int64_t)z->size * z->shard_count;
    mv->nparams = 0; /* no named tensors: a full file in a shard's place fails, naming one */
    *ov = *opt;
    ov->model = mv;
    ov->count = mv->param_count;
    ov->lo = (int64_t)z->rank * z->shard_count;
    ov->hi = ov->lo + z->shard_count;
    for (k = 0; state && k < ov->nstate; k++) ov->state[k] = state[k];
}

/* The rank's parameter slices in shard layout into dst (shard_count floats, on the
   model's device), from the parameter shard (stage 3) or the full block. */
PDP__PRIVATE pdp_status pdp__zero_pack_params(pdp_zero *z, float *dst)
{
    pdp_device dev = z->m->device;
    pdp_status st;
    int u;
    if (z->stage == 3)
        return pdp__dev_copy(dev, dst, dev, z->param_shard, (size_t)z->shard_count * 4);
    if ((st = pdp__dev_memset0(dev, dst, (size_t)z->shard_count * 4)) != PDP_OK) return st;
    for (u = 0; u < z->nunits; u++) {
        const pdp__zero_unit *k = &z->units[u];
        if (k->mine &&
            (st = pdp__dev_copy(dev, dst + k->shard_off, dev,
                                z->m->param_block + k->off + (int64_t)z->rank * k->s,
                                (size_t)k->mine * 4)) != PDP_OK)
            return st;
    }
    return PDP_OK;
}

/* ---- zero_ckpt: save ---- */

/* A run id as the files hold it: 16 lowercase hex digits. */
PDP__PRIVATE void pdp__zero_run_text(uint64_t run, char out[17])
{
    snprintf(out, 17, "%016llx", (unsigned long long)run);
}

/* The marker's text for this executor at step steps of save run. */
PDP__PRIVATE void pdp__zero_marker_text(const pdp_zero *z, int64_t steps, const char *run,
                                        char *out, size_t cap)
{
    size_t n;
    int u;
    n = (size_t)snprintf(out, cap, "pdp-zero-checkpoint 2\nworld_size %d\nstage %d\nstep %lld\n"
                         "run %s\nparam_count %lld\nshard_count %lld\nunits %d\n", z->size,
                         z->stage, (long long)steps, run, (long long)z->m->param_count,
                         (long long)z->shard_count, z->nunits);
    for (u = 0; u < z->nunits && n < cap; u++)
        n += (size_t)snprintf(out + n, cap - n, "unit %d %lld %lld %lld\n", u,
                              (long long)z->units[u].off, (long long)z->units[u].count,
                              (long long)z->units[u].s);
}

/* Writes the marker atomically (temporary, sync, rename, sync of the directory), removing
   first the temporaries of writers killed mid-write as checkpoint.c's save does. */
PDP__PRIVATE pdp_status pdp__zero_write_marker(const char *path, const char *text, const char *fn)
{
    char tmp[4160];
    FILE *f;
    size_t len = strlen(text);
    int ok;
    pdp__ckpt_remove_stale(path);
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, pdp__pid());
    if (!(f = fopen(tmp, "wb")))
        return pdp__err(PDP_ERR_IO, "%s: %s: fopen failed: %s", fn, tmp, strerror(errno));
    ok = fwrite(text, 1, len, f) == len && pdp__file_sync(f) == 0;
    ok = (fclose(f) == 0) && ok;
    if (!ok || pdp__file_replace(tmp, path) != 0) {
        pdp_status st = pdp__err(PDP_ERR_IO, "%s: %s: writing the marker failed: %s", fn, path,
                                 strerror(errno));
        remove(tmp);
        return st;
    }
    /* the rename is durable only once its directory is: a crash must not lose the marker
       of a set whose shards are on disk */
    if (pdp__ckpt_sync_dir(path) != 0)
        return pdp__err(PDP_ERR_IO, "%s: %s: written, but syncing its directory failed: %s", fn,
                        path, strerror(errno));
    return PDP_OK;
}

PDP_API pdp_status pdp_zero_checkpoint_save(pdp_zero *z, const pdp_optim *opt, const char *prefix)
{
    static const char *fn = "pdp_zero_checkpoint_save";
    char path[4096], marker[4096], run[17], *text = NULL;
    float *packed = NULL;
    bool bad[64];
    uint64_t id = 0;
    pdp_model mv;
    pdp_optim ov;
    pdp_status st, ast;
    int r;
    size_t cap;
    if ((st = pdp__zero_ckpt_args(z, opt, prefix, fn)) != PDP_OK) return st;
    snprintf(marker, sizeof marker, "%s.done", prefix);
    pdp__zero_shard_path(path, sizeof path, prefix, z->rank);
    /* the old marker goes first: a set with a marker is always complete */
    st = PDP_OK;
    if (z->rank == 0) {
        id = pdp__zero_run_id(z);
        if (remove(marker) != 0 && errno != ENOENT)
            st = pdp__err(PDP_ERR_IO, "%s: %s: removing the old marker failed: %s", fn, marker,
                          strerror(errno));
    }
    if ((ast = pdp__zero_agree(z, st == PDP_OK, bad, &id)) != PDP_OK)
        return st != PDP_OK ? st : pdp__err_wrap(ast, "%s: rank %d: starting the set %s (no "
                                                 "marker written)", fn, z->rank, prefix);
    if (bad[0])
        return st != PDP_OK ? st : pdp__err(PDP_ERR_IO, "%s: rank 0 could not remove %s", fn,
                                            marker);
    pdp__zero_run_text(id, run);
    if ((st = pdp__dev_alloc(z->m->device, (size_t)PDP__MAX(1, z->shard_count) * 4,
                             (void **)&packed)) != PDP_OK)
        st = pdp__err_wrap(st, "%s: rank %d: packing the shard", fn, z->rank);
    else if ((st = pdp__zero_pack_params(z, packed)) == PDP_OK) {
        pdp__zero_ckpt_views(z, opt, NULL, &mv, &ov);
        st = pdp__checkpoint_save_run(path, &mv, packed, &ov, ov.lo, ov.hi, run, fn);
    }
    pdp__dev_free(z->m->device, packed);
    if ((ast = pdp__zero_agree(z, st == PDP_OK, bad, NULL)) != PDP_OK)
        return st != PDP_OK ? st : pdp__err_wrap(ast, "%s: rank %d: agreeing that every shard "
                                                 "of %s is written (no marker written)", fn,
                                                 z->rank, prefix);
    if (st != PDP_OK) return st;
    for (r = 0; r < z->size; r++)
        if (bad[r]) {
            pdp__zero_shard_path(path, sizeof path, prefix, r);
            return pdp__err(PDP_ERR_IO, "%s: rank %d could not write %s (no marker written)", fn,
                            r, path);
        }
    if (z->rank == 0) {
        cap = 256 + (size_t)z->nunits * 96;
        if (!(text = (char *)pdp__alloc(cap))) {
            st = pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: %s: no memory for the marker", fn, marker);
        } else {
            pdp__zero_marker_text(z, opt->steps, run, text, cap);
            st = pdp__zero_write_marker(marker, text, fn);
            pdp__dealloc(text);
        }
    }
    if ((ast = pdp__zero_agree(z, st == PDP_OK, bad, NULL)) != PDP_OK)
        return st != PDP_OK ? st : pdp__err_wrap(ast, "%s: rank %d: agreeing that the marker %s "
                                                 "is written", fn, z->rank, marker);
    if (bad[0])
        return st != PDP_OK ? st : pdp__err(PDP_ERR_IO, "%s: rank 0 could not write the marker "
                                            "%s", fn, marker);
    return PDP_OK;
}

/* ---- zero_ckpt: load (a shard set, or a full file at any world size) ---- */

/* Reads the marker and holds it to this run; *steps gets its step, run its
   run id (16 hex digits). */
PDP__PRIVATE pdp_status pdp__zero_read_marker(pdp_zero *z, const char *path, int64_t *steps,
                                              char run[17], const char *fn)
{
    char *want, *have;
    size_t cap = 256 + (size_t)z->nunits * 96, n;
    long long step = 0;
    int world = 0, version = 0, end = 0;
    FILE *f;
    pdp_status st = PDP_OK;
    if (!(f = fopen(path, "rb")))
        return pdp__err(PDP_ERR_IO, "%s: %s: %s (no marker: the set is incomplete or absent)", fn,
                        path, strerror(errno));
    want = (char *)pdp__alloc(cap);
    have = (char *)pdp__alloc(cap + 1);
    if (!want || !have) {
        fclose(f);
        pdp__dealloc(want);
        pdp__dealloc(have);
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: %s: no memory to read the marker", fn, path);
    }
    n = fread(have, 1, cap, f);
    have[n] = '\0';
    fclose(f);
    run[0] = '\0';
    if (sscanf(have, "pdp-zero-checkpoint %d", &version) == 1 && version != 2) {
        st = pdp__err(PDP_ERR_FORMAT, "%s: %s: a version %d ZeRO checkpoint marker; this pdp reads "
                      "version 2 (which names the save every shard belongs to)", fn, path,
                      version);
    } else if (sscanf(have, "pdp-zero-checkpoint 2\nworld_size %d\nstage %*d\nstep %lld\n"
                      "run %16[0-9a-f]%n", &world, &step, run, &end) != 3 ||
               strlen(run) != 16 || have[end] != '\n') {
        st = pdp__err(PDP_ERR_FORMAT, "%s: %s: not a ZeRO checkpoint marker (its first lines "
                      "are the version, world size, stage, step and run id)", fn, path);
    } else if (world != z->size) {
        st = pdp__err(PDP_ERR_SHAPE, "%s: %s: the set was written by %d ranks, this run has %d "
                      "(load a consolidated checkpoint with pdp_zero_checkpoint_load_full to "
                      "change the world size)", fn, path, world, z->size);
    } else {
        /* the same plan: everything after the stage and step lines */
        const char *a, *b;
        pdp__zero_marker_text(z, (int64_t)step, run, want, cap);
        a = strstr(want, "param_count");
        b = strstr(have, "param_count");
        if (!b || strcmp(a, b) != 0)
            st = pdp__err(PDP_ERR_SHAPE, "%s: %s: the set's units (parameter count, shard size, "
                          "unit plan) differ from this run's: another model or bucket size", fn,
                          path);
    }
    pdp__dealloc(want);
    pdp__dealloc(have);
    *steps = (int64_t)step;
    return st;
}

/* Commits a validated load: params (shard layout, on the device) into the shard
   or the full block (stages 1-2 then all-gather), state into opt. */
PDP__PRIVATE pdp_status pdp__zero_commit(pdp_zero *z, pdp_optim *opt, const pdp_optim *loaded,
                                         float *params, float *const *state, const char *fn)
{
    pdp_device dev = z->m->device;
    pdp_status st;
    int u, k;
    for (k = 0; k < opt->nstate; k++)
        if ((st = pdp__dev_copy(dev, opt->state[k], dev, state[k],
                                (size_t)z->shard_count * 4)) != PDP_OK)
            return pdp__err_wrap(st, "%s: rank %d: copying the optimizer state", fn, z->rank);
    opt->desc = loaded->desc;
    opt->steps = loaded->steps;
    if (z->stage == 3) {
        if ((st = pdp__zero_release_params(z)) != PDP_OK) return pdp__err_wrap(st, "%s", fn);
        if (z->m->param_block) { /* a gathered copy: stale now */
            pdp__dev_free(dev, z->m->param_block);
            z->m->param_block = NULL;
        }
        return pdp__dev_copy(dev, z->param_shard, dev, params, (size_t)z->shard_count * 4);
    }
    for (u = 0; u < z->nunits; u++) {
        const pdp__zero_unit *q = &z->units[u];
        if (q->mine &&
            (st = pdp__dev_copy(dev, z->m->param_block + q->off + (int64_t)z->rank * q->s, dev,
                                params + q->shard_off, (size_t)q->mine * 4)) != PDP_OK)
            return pdp__err_wrap(st, "%s: rank %d: copying the parameters", fn, z->rank);
    }
    return pdp__zero_gather_full(z, z->m->param_block, fn);
}

/* params and nstate state buffers of shard_count floats each, on the device. */
PDP__PRIVATE pdp_status pdp__zero_ckpt_staging(pdp_zero *z, const pdp_optim *opt, float **params,
                                               float **state, const char *fn)
{
    size_t bytes = (size_t)PDP__MAX(1, z->shard_count) * 4;
    pdp_status st;
    int k;
    if ((st = pdp__dev_alloc(z->m->device, bytes, (void **)params)) != PDP_OK ||
        (st = pdp__dev_memset0(z->m->device, *params, bytes)) != PDP_OK)
        return pdp__err_wrap(st, "%s: rank %d: no staging memory", fn, z->rank);
    for (k = 0; k < opt->nstate; k++)
        if ((st = pdp__dev_alloc(z->m->device, bytes, (void **)&state[k])) != PDP_OK ||
            (st = pdp__dev_memset0(z->m->device, state[k], bytes)) != PDP_OK)
            return pdp__err_wrap(st, "%s: rank %d: no staging memory", fn, z->rank);
    return PDP_OK;
}

PDP__PRIVATE void pdp__zero_ckpt_staging_free(pdp_zero *z, float *params, float **state)
{
    int k;
    pdp__dev_free(z->m->device, params);
    for (k = 0; k < 2; k++) pdp__dev_free(z->m->device, state[k]);
}

/* The agreement after a load's validation: every rank's verdict, then (all good)
   the commit. what(r) names rank r's file in the message of the ranks whose own
   file was fine. */
PDP__PRIVATE pdp_status pdp__zero_load_finish(pdp_zero *z, pdp_optim *opt, const pdp_optim *loaded,
                                              pdp_status st, float *params, float **state,
                                              const char *prefix, bool full, uint64_t seed,
                                              uint64_t mstep, const char *fn)
{
    char path[4096];
    bool bad[64];
    pdp_status ast;
    int r;
    if ((ast = pdp__zero_agree(z, st == PDP_OK, bad, NULL)) != PDP_OK && st == PDP_OK)
        st = pdp__err_wrap(ast, "%s: rank %d: agreeing that every rank read %s (nothing was "
                           "loaded)", fn, z->rank, prefix);
    for (r = 0; ast == PDP_OK && st == PDP_OK && r < z->size; r++)
        if (bad[r]) {
            if (full) snprintf(path, sizeof path, "%s", prefix);
            else pdp__zero_shard_path(path, sizeof path, prefix, r);
            st = pdp__err_peer(PDP_ERR_FORMAT, "%s: %s: rank %d could not load it (its error "
                               "says why); nothing was loaded", fn, path, r);
        }
    if (st == PDP_OK) st = pdp__zero_commit(z, opt, loaded, params, state, fn);
    else {
        z->m->seed = seed; /* a range load sets them: put back */
        z->m->step = mstep;
    }
    pdp__zero_ckpt_staging_free(z, params, state);
    return st;
}

PDP_API pdp_status pdp_zero_checkpoint_load(pdp_zero *z, pdp_optim *opt, const char *prefix)
{
    static const char *fn = "pdp_zero_checkpoint_load";
    char path[4096], marker[4096], run[17];
    float *params = NULL, *state[2] = {NULL, NULL};
    uint64_t seed, mstep;
    int64_t steps = 0;
    pdp_model mv;
    pdp_optim ov;
    pdp_status st;
    if ((st = pdp__zero_ckpt_args(z, opt, prefix, fn)) != PDP_OK) return st;
    seed = z->m->seed;
    mstep = z->m->step;
    snprintf(marker, sizeof marker, "%s.done", prefix);
    pdp__zero_shard_path(path, sizeof path, prefix, z->rank);
    pdp__zero_ckpt_views(z, opt, NULL, &mv, &ov);
    if ((st = pdp__zero_read_marker(z, marker, &steps, run, fn)) == PDP_OK &&
        (st = pdp__zero_ckpt_staging(z, opt, &params, state, fn)) == PDP_OK) {
        pdp__zero_ckpt_views(z, opt, state, &mv, &ov);
        st = pdp__checkpoint_load_run(path, &mv, params, &ov, ov.lo, ov.hi, run, fn);
        if (st == PDP_OK && ov.steps != steps)
            st = pdp__err(PDP_ERR_FORMAT, "%s: %s: holds step %lld, the set's marker %s says "
                          "%lld (a file of another save)", fn, path, (long long)ov.steps, marker,
                          (long long)steps);
    }
    z->m->seed = mv.seed;
    z->m->step = mv.step;
    return pdp__zero_load_finish(z, opt, &ov, st, params, state, prefix, false, seed, mstep, fn);
}

PDP_API pdp_status pdp_zero_checkpoint_load_full(pdp_zero *z, pdp_optim *opt, const char *path)
{
    static const char *fn = "pdp_zero_checkpoint_load_full";
    float *params = NULL, *state[2] = {NULL, NULL};
    uint64_t seed, mstep;
    pdp_optim ov;
    pdp_status st;
    int u, k;
    if ((st = pdp__zero_ckpt_args(z, opt, path, fn)) != PDP_OK) return st;
    seed = z->m->seed;
    mstep = z->m->step;
    ov = *opt;
    if ((st = pdp__zero_ckpt_staging(z, opt, &params, state, fn)) == PDP_OK) {
        /* unit by unit, the slice [off + r s, off + r s + mine) of the full file */
        for (u = 0; u < z->nunits && st == PDP_OK; u++) {
            const pdp__zero_unit *q = &z->units[u];
            int64_t lo = q->off + PDP__MIN((int64_t)z->rank * q->s, q->count);
            ov.lo = lo;
            ov.hi = lo + q->mine;
            ov.count = z->m->param_count;
            for (k = 0; k < ov.nstate; k++) ov.state[k] = state[k] + q->shard_off;
            st = pdp__checkpoint_load_range(path, z->m, params + q->shard_off, &ov, ov.lo, ov.hi,
                                            fn);
        }
    }
    return pdp__zero_load_finish(z, opt, &ov, st, params, state, path, true, seed, mstep, fn);
}

/* ---- zero_ckpt: consolidate (one full file) ---- */

PDP_API pdp_status pdp_zero_checkpoint_consolidate(pdp_zero *z, const pdp_optim *opt,
                                                   const char *path)
{
    static const char *fn = "pdp_zero_checkpoint_consolidate";
    pdp_device dev;
    pdp_optim *full = NULL;
    float *buf = NULL;
    bool gathered = false, bad[64];
    pdp_status st, cs, bst;
    int u, k;
    if ((st = pdp__zero_ckpt_args(z, opt, path, fn)) != PDP_OK) return st;
    dev = z->m->device;
    if (z->stage == 3 && !z->m->param_block) gathered = true;
    if ((st = pdp_zero_gather_params(z, NULL)) != PDP_OK) return pdp__err_wrap(st, "%s", fn);
    if (z->rank == 0 && (st = pdp__optim_create_range(&full, z->m, &opt->desc, 0,
                                                     z->m->param_count, fn)) == PDP_OK)
        full->desc = opt->desc; /* resolved: an lr of 0 (a schedule's end) stays 0 */
    if (st == PDP_OK &&
        (st = pdp__dev_alloc(dev, (size_t)(z->size * z->smax) * 4, (void **)&buf)) != PDP_OK)
        st = pdp__err_wrap(st, "%s: rank %d: no memory to gather the optimizer state", fn,
                           z->rank);
    /* every rank takes part in every gather: on a local failure it still sends zeros; a rank
       without its buffers cannot, so first the ranks agree that each has them */
    if ((bst = pdp__zero_agree(z, st == PDP_OK, bad, NULL)) != PDP_OK && st == PDP_OK)
        st = pdp__err_wrap(bst, "%s: rank %d: agreeing on the buffers", fn, z->rank);
    for (u = 0; u < z->size && bst == PDP_OK; u++)
        if (bad[u]) {
            bst = PDP_ERR_COMM; /* no gathers */
            if (st == PDP_OK)
                st = pdp__err(PDP_ERR_COMM, "%s: rank %d: rank %d has no memory to gather the "
                              "optimizer state", fn, z->rank, u);
        }
    for (k = 0; bst == PDP_OK && k < opt->nstate; k++)
        for (u = 0; u < z->nunits; u++) {
            const pdp__zero_unit *q = &z->units[u];
            if (pdp__dev_copy(dev, buf + (int64_t)z->rank * q->s, dev, opt->state[k] + q->shard_off,
                              (size_t)q->s * 4) != PDP_OK && st == PDP_OK)
                st = pdp__err(PDP_ERR_CUDA, "%s: rank %d: copying the state", fn, z->rank);
            cs = pdp_comm_allgather(z->c, buf + (int64_t)z->rank * q->s, buf, q->s, NULL);
            if (cs != PDP_OK) {
                pdp__dev_free(dev, buf);
                pdp_optim_free(full);
                return pdp__err_wrap(cs, "%s: rank %d: gathering the optimizer state", fn,
                                     z->rank);
            }
            if (full && st == PDP_OK)
                st = pdp__dev_copy(dev, full->state[k] + q->off, dev, buf, (size_t)q->count * 4);
        }
    pdp__dev_free(dev, buf);
    if (full && st == PDP_OK) {
        full->steps = opt->steps;
        if ((st = pdp_checkpoint_save(path, z->m, full)) != PDP_OK)
            st = pdp__err_wrap(st, "%s: rank 0", fn);
    }
    pdp_optim_free(full);
    if (gathered) { /* not the caller's copy: give the memory back */
        pdp__dev_free(dev, z->m->param_block);
        z->m->param_block = NULL;
    }
    if ((cs = pdp__zero_agree(z, st == PDP_OK, bad, NULL)) != PDP_OK && st == PDP_OK)
        return pdp__err_wrap(cs, "%s: rank %d: agreeing that rank 0 wrote %s", fn, z->rank,
                             path);
    if (st != PDP_OK) return st;
    if (bad[0])
        return pdp__err_peer(PDP_ERR_IO, "%s: %s: rank 0 could not write it (its error says why)",
                             fn, path);
    return PDP_OK;
}
