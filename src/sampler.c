/* sampler: pdp_permutation (data.h), the order behind every shuffle, and
   torch.utils.data.DistributedSampler (declared in ddp.h).

   The permutation of epoch e is pdp_permutation(seed, e) (0..n-1 with
   no_shuffle), padded by repeating from its start (or cut with drop_last) to a
   multiple of the world size N, and rank r takes every N-th entry from r.
   Invariants: every rank with the same seed and epoch computes the same
   permutation without communicating; indices[] holds num_samples entries and is
   rewritten only by set_epoch. */

#include "internal.h"

/* ---- sampler: the permutation (the batcher's shuffle too, data.c) ---- */

/* Uniform in [0, n), unbiased, for n up to 2^63. */
PDP__PRIVATE uint64_t pdp__rng_below64(pdp_rng *r, uint64_t n)
{
    uint64_t x, limit;
    if (n <= 0xffffffffu) return pdp_rng_below(r, (uint32_t)n);
    limit = UINT64_MAX - UINT64_MAX % n;
    do x = (uint64_t)pdp_rng_u32(r) << 32 | pdp_rng_u32(r); while (x >= limit);
    return x % n;
}

PDP_API void pdp_permutation(int64_t *out, int64_t n, uint64_t seed, uint64_t epoch)
{
    pdp_rng r;
    int64_t i;
    if (!out) return;
    for (i = 0; i < n; i++) out[i] = i;
    pdp_rng_seed(&r, seed, epoch);
    for (i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)pdp__rng_below64(&r, (uint64_t)i + 1), t = out[i];
        out[i] = out[j];
        out[j] = t;
    }
}

/* ---- sampler ---- */

struct pdp_dist_sampler {
    pdp_dist_sampler_desc desc;
    int64_t num_samples, total;
    int64_t *perm;      /* dataset_size */
    int64_t *indices;   /* num_samples: this rank's */
};

PDP_API pdp_status pdp_dist_sampler_create(pdp_dist_sampler **out,
                                           const pdp_dist_sampler_desc *desc)
{
    static const char *fn = "pdp_dist_sampler_create";
    pdp_dist_sampler *s;
    pdp_dist_sampler_desc dd;
    int64_t n;
    if (!out) return pdp__err(PDP_ERR_INVALID, "%s: out is NULL", fn);
    *out = NULL;
    if (!desc) return pdp__err(PDP_ERR_INVALID, "%s: desc is NULL (dataset_size is required)", fn);
    dd = *desc;
    dd.world_size = PDP__DEF(dd.world_size, 1);
    n = dd.dataset_size;
    if (n < 1) return pdp__err(PDP_ERR_INVALID, "%s: dataset_size %lld < 1", fn, (long long)n);
    if (dd.world_size < 1)
        return pdp__err(PDP_ERR_INVALID, "%s: world_size %d < 1", fn, dd.world_size);
    if (dd.rank < 0 || dd.rank >= dd.world_size)
        return pdp__err(PDP_ERR_INVALID, "%s: rank %d outside 0..%d", fn, dd.rank,
                        dd.world_size - 1);
    if (n > PDP__COUNT_MAX)
        return pdp__err(PDP_ERR_INVALID, "%s: dataset_size %lld exceeds %lld", fn, (long long)n,
                        (long long)PDP__COUNT_MAX);
    if (dd.drop_last && n < dd.world_size)
        return pdp__err(PDP_ERR_INVALID, "%s: drop_last with %lld samples for %d ranks leaves "
                        "none", fn, (long long)n, dd.world_size);
    s = (pdp_dist_sampler *)pdp__calloc(sizeof *s);
    if (!s) return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory", fn);
    s->desc = dd;
    s->num_samples = dd.drop_last ? n / dd.world_size : (n + dd.world_size - 1) / dd.world_size;
    s->total = s->num_samples * dd.world_size;
    s->perm = (int64_t *)pdp__alloc((size_t)n * sizeof *s->perm);
    s->indices = (int64_t *)pdp__alloc((size_t)s->num_samples * sizeof *s->indices);
    if (!s->perm || !s->indices) {
        pdp_dist_sampler_free(s);
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory for %lld indices", fn, (long long)n);
    }
    pdp_dist_sampler_set_epoch(s, 0);
    *out = s;
    return PDP_OK;
}

PDP_API void pdp_dist_sampler_free(pdp_dist_sampler *s)
{
    if (!s) return;
    pdp__dealloc(s->perm);
    pdp__dealloc(s->indices);
    pdp__dealloc(s);
}

PDP_API void pdp_dist_sampler_set_epoch(pdp_dist_sampler *s, uint64_t epoch)
{
    int64_t i, n;
    if (!s) return;
    n = s->desc.dataset_size;
    if (s->desc.no_shuffle)
        for (i = 0; i < n; i++) s->perm[i] = i;
    else
        pdp_permutation(s->perm, n, s->desc.seed, epoch);
    /* entry j of the padded (or cut) list is perm[j mod n]; rank r takes j = r + k N */
    for (i = 0; i < s->num_samples; i++)
        s->indices[i] = s->perm[(s->desc.rank + i * (int64_t)s->desc.world_size) % n];
}

PDP_API int64_t pdp_dist_sampler_num_samples(const pdp_dist_sampler *s)
{
    return s ? s->num_samples : 0;
}

PDP_API const int64_t *pdp_dist_sampler_indices(const pdp_dist_sampler *s, int64_t *count)
{
    if (count) *count = s ? s->num_samples : 0;
    return s ? s->indices : NULL;
}
