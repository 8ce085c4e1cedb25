/* data: the IDX reader, the synthetic task (and Fashion-MNIST's fallback to it), datasets
   from a user's arrays (class labels or float targets, checked and copied), the batcher
   (over an index list or a DistributedSampler's epochs; its targets a tensor of the
   dataset's kind), token data (a text file or
   a directory read into one byte stream, a generated text, batches of windows), the
   accuracy of a model over a batcher. Files that start with the gzip magic are decoded by
   src/inflate.c (pdp__gunzip).

   IDX (LeCun et al., "The MNIST database"): a big-endian magic 0x0000TTDD (type
   TT = 0x08 unsigned byte, DD dimensions), DD big-endian 32-bit sizes, then the
   bytes. A dataset keeps pixels as floats, [count, features]. */

#include "internal.h"

/* ---- files ---- */

/* Reads a whole file, gunzipping it when it starts with the gzip magic: all of it, or with
   enough (may be NULL) the prefix that rule asks for (pdp__gunzip). */
PDP__PRIVATE pdp_status pdp__read_file(const char *path, uint8_t **data, size_t *bytes,
                                       pdp__gunzip_enough enough, const void *enough_ctx,
                                       const char *fn)
{
    FILE *f;
    long size;
    uint8_t *raw;
    size_t got;
    pdp_status st;
    *data = NULL;
    *bytes = 0;
    if (pdp__path_kind(path, true) == PDP__PATH_DIR) /* fopen opens a directory on POSIX */
        return pdp__err(PDP_ERR_IO, "%s: %s is a directory, not a file", fn, path);
    if (!(f = fopen(path, "rb")))
        return pdp__err(PDP_ERR_IO, "%s: cannot open %s: %s", fn, path, strerror(errno));
    if (fseek(f, 0, SEEK_END) != 0 || (size = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return pdp__err(PDP_ERR_IO, "%s: cannot size %s: %s", fn, path, strerror(errno));
    }
    if ((uint64_t)size > PDP_MAX_FILE_BYTES) {
        fclose(f);
        return pdp__err(PDP_ERR_FORMAT, "%s: %s: %ld bytes is larger than PDP_MAX_FILE_BYTES", fn,
                        path, size);
    }
    if (!(raw = (uint8_t *)pdp__alloc((size_t)size))) {
        fclose(f);
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory to read %s (%ld bytes)", fn, path,
                        size);
    }
    got = fread(raw, 1, (size_t)size, f);
    fclose(f);
    if (got != (size_t)size) {
        pdp__dealloc(raw);
        return pdp__err(PDP_ERR_IO, "%s: short read from %s (%zu of %ld bytes)", fn, path, got,
                        size);
    }
    if (!pdp__is_gzip(raw, got)) {
        *data = raw;
        *bytes = got;
        return PDP_OK;
    }
    st = pdp__gunzip(raw, got, data, bytes, enough, enough_ctx, fn, path);
    pdp__dealloc(raw);
    return st;
}

/* ---- idx ---- */

PDP__PRIVATE uint32_t pdp__be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

/* Checks an IDX header of unsigned bytes with ndim dimensions against the data's size;
   fills dims and the payload pointer. With keep (> 0), the data need hold only the first
   keep items (a file read up to them: pdp__idx_enough), and no more than the header says. */
PDP__PRIVATE pdp_status pdp__idx_parse(const uint8_t *d, size_t n, int ndim, int64_t keep,
                                       uint64_t dims[3], const uint8_t **payload, const char *fn,
                                       const char *path)
{
    uint32_t magic, want = 0x800u | (uint32_t)ndim;
    uint64_t need = 1, per = 1;
    size_t head = 4 + 4 * (size_t)ndim;
    int i;
    if (n < 4)
        return pdp__err(PDP_ERR_FORMAT, "%s: %s: truncated IDX header (%zu bytes)", fn, path, n);
    magic = pdp__be32(d);
    if (magic != want)
        return pdp__err(PDP_ERR_FORMAT,
                        "%s: %s: bad magic 0x%08x (expected 0x%08x, an IDX %s file)", fn, path,
                        (unsigned)magic, (unsigned)want, ndim == 3 ? "image" : "label");
    if (n < head)
        return pdp__err(PDP_ERR_FORMAT, "%s: %s: truncated IDX header (%zu bytes)", fn, path, n);
    for (i = 0; i < ndim; i++) {
        dims[i] = pdp__be32(d + 4 + 4 * i);
        if (i > 0 && dims[i] == 0)
            return pdp__err(PDP_ERR_FORMAT, "%s: %s: dimension %d is 0", fn, path, i);
        if (dims[i] && need > UINT64_MAX / dims[i])
            return pdp__err(PDP_ERR_FORMAT, "%s: %s: dimensions overflow", fn, path);
        need *= dims[i];
        if (i > 0) per *= dims[i];
    }
    if (keep > 0 && (uint64_t)keep < dims[0] && n - head >= (uint64_t)keep * per &&
        n - head <= need) {
        *payload = d + head; /* the items kept are there; the rest was not read */
        return PDP_OK;
    }
    if (need != n - head) {
        if (ndim == 3)
            return pdp__err(PDP_ERR_FORMAT,
                            "%s: %s: %s: %llu x %llu x %llu needs %llu bytes of data, "
                            "the file has %zu",
                            fn, path, need > n - head ? "truncated" : "size mismatch",
                            (unsigned long long)dims[0], (unsigned long long)dims[1],
                            (unsigned long long)dims[2], (unsigned long long)need, n - head);
        return pdp__err(PDP_ERR_FORMAT, "%s: %s: %s: %llu labels, the file has %zu bytes of them",
                        fn, path, need > n - head ? "truncated" : "size mismatch",
                        (unsigned long long)dims[0], n - head);
    }
    *payload = d + head;
    return PDP_OK;
}

/* What pdp__idx_enough reads to the end of: an IDX file of ndim dimensions, of which the
   first keep items are used. */
typedef struct pdp__idx_prefix {
    int ndim;
    int64_t keep;
} pdp__idx_prefix;

/* pdp__gunzip's rule for an IDX file read for its first keep items: the header, then the
   header and those items' bytes. A file of no more than keep items is read to its end (and
   its CRC-32 checked), and so is one whose header it cannot size: pdp__idx_parse says what
   is wrong. */
PDP__PRIVATE size_t pdp__idx_enough(const uint8_t *out, size_t len, const void *ctx)
{
    const pdp__idx_prefix *q = (const pdp__idx_prefix *)ctx;
    size_t head = 4 + 4 * (size_t)q->ndim;
    uint64_t need;
    int i;
    if (len < head) return head;
    need = pdp__be32(out + 4);
    if (need <= (uint64_t)q->keep) return SIZE_MAX; /* all of it: the whole file */
    need = (uint64_t)q->keep;
    for (i = 1; i < q->ndim; i++) {
        uint64_t dim = pdp__be32(out + 4 + 4 * i);
        if (dim && need > UINT64_MAX / dim) return SIZE_MAX;
        need *= dim;
    }
    return need > SIZE_MAX - head ? SIZE_MAX : head + (size_t)need;
}

/* An empty dataset of count samples with the given per-sample shape. */
PDP__PRIVATE pdp_status pdp__dataset_new(pdp_dataset **out, int64_t count, int64_t h, int64_t w,
                                         const pdp_dataset_desc *desc, const char *fn)
{
    pdp_dataset *ds;
    bool flat = desc && desc->flat;
    int64_t floats;
    *out = NULL;
    if (!pdp__mul3_ok(count, h, w, &floats) || !pdp__add_ok(floats, 1, &floats))
        return pdp__err(PDP_ERR_INVALID, "%s: %lld samples of %lldx%lld exceed %lld floats", fn,
                        (long long)count, (long long)h, (long long)w, (long long)PDP__COUNT_MAX);
    ds = (pdp_dataset *)pdp__calloc(sizeof *ds);
    if (!ds) return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory", fn);
    ds->count = count;
    ds->features = h * w;
    ds->ndim = flat ? 1 : 3;
    ds->shape[0] = flat ? h * w : 1;
    ds->shape[1] = flat ? 1 : h;
    ds->shape[2] = flat ? 1 : w;
    ds->images = (float *)pdp__alloc((size_t)floats * sizeof(float));
    ds->labels = (int32_t *)pdp__alloc((size_t)(count + 1) * sizeof(int32_t));
    if (!ds->images || !ds->labels) {
        pdp_dataset_free(ds);
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory for %lld samples of %lld floats",
                        fn, (long long)count, (long long)(h * w));
    }
    *out = ds;
    return PDP_OK;
}

PDP__PRIVATE pdp_status pdp__check_desc(const pdp_dataset_desc *desc, const char *fn)
{
    if (!desc) return PDP_OK;
    if (desc->max_samples < 0)
        return pdp__err(PDP_ERR_INVALID, "%s: desc.max_samples is %lld (must be >= 0)", fn,
                        (long long)desc->max_samples);
    if (!(desc->std >= 0.0f) || !isfinite(desc->mean) || !isfinite(desc->std))
        return pdp__err(PDP_ERR_INVALID, "%s: desc.mean %g, desc.std %g (std must be >= 0)", fn,
                        (double)desc->mean, (double)desc->std);
    if (desc->std == 0.0f && desc->mean != 0.0f) /* else the mean would be dropped, silently */
        return pdp__err(PDP_ERR_INVALID, "%s: desc.mean %g without desc.std: normalising needs "
                        "both (std 0: the pixels stay p / 255)", fn, (double)desc->mean);
    return PDP_OK;
}

PDP__PRIVATE pdp_status pdp__load_idx(pdp_dataset **out, const char *images_path,
                                      const char *labels_path, const pdp_dataset_desc *desc,
                                      const char *fn)
{
    uint8_t *img = NULL, *lab = NULL;
    size_t img_bytes, lab_bytes;
    /* set by pdp__idx_parse when it succeeds; initialised because gcc -O3 cannot see that
       the goto skips their use otherwise (-Wmaybe-uninitialized) */
    const uint8_t *px = NULL, *lb = NULL;
    uint64_t idims[3] = {0}, ldims[3] = {0};
    int64_t count, features, i;
    float lut[256];
    int maxlab = -1;
    /* max_samples: a gzipped file is decoded only up to the samples kept */
    int64_t keep = desc ? desc->max_samples : 0;
    pdp__idx_prefix img_prefix = {3, keep}, lab_prefix = {1, keep};
    pdp_dataset *ds = NULL;
    pdp_status st;
    if ((st = pdp__read_file(images_path, &img, &img_bytes, keep ? pdp__idx_enough : NULL,
                             &img_prefix, fn)) != PDP_OK ||
        (st = pdp__idx_parse(img, img_bytes, 3, keep, idims, &px, fn, images_path)) != PDP_OK ||
        (st = pdp__read_file(labels_path, &lab, &lab_bytes, keep ? pdp__idx_enough : NULL,
                             &lab_prefix, fn)) != PDP_OK ||
        (st = pdp__idx_parse(lab, lab_bytes, 1, keep, ldims, &lb, fn, labels_path)) != PDP_OK)
        goto done;
    if (idims[0] != ldims[0]) {
        st = pdp__err(PDP_ERR_FORMAT, "%s: %s has %llu images but %s has %llu labels", fn,
                      images_path, (unsigned long long)idims[0], labels_path,
                      (unsigned long long)ldims[0]);
        goto done;
    }
    if (idims[0] == 0) { /* pdp_dataset_from_arrays and the sampler refuse count 0 too */
        st = pdp__err(PDP_ERR_FORMAT, "%s: %s holds 0 images (and %s 0 labels)", fn, images_path,
                      labels_path);
        goto done;
    }
    count = (int64_t)idims[0];
    if (keep && keep < count) count = keep;
    features = (int64_t)(idims[1] * idims[2]);
    if ((st = pdp__dataset_new(&ds, count, (int64_t)idims[1], (int64_t)idims[2], desc, fn)))
        goto done;
    for (i = 0; i < 256; i++) { /* one table: the same float for the same byte, always */
        float v = (float)i / 255.0f;
        lut[i] = desc && desc->std > 0 ? (v - desc->mean) / desc->std : v;
    }
    for (i = 0; i < count * features; i++) ds->images[i] = lut[px[i]];
    for (i = 0; i < count; i++) {
        ds->labels[i] = lb[i];
        if (lb[i] > maxlab) maxlab = lb[i];
    }
    ds->classes = maxlab + 1;
done:
    pdp__dealloc(img);
    pdp__dealloc(lab);
    *out = ds;
    return st;
}

PDP_API pdp_status pdp_dataset_load_idx(pdp_dataset **out, const char *images_path,
                                        const char *labels_path, const pdp_dataset_desc *desc)
{
    static const char fn[] = "pdp_dataset_load_idx";
    pdp_status st;
    if (!out) return pdp__err(PDP_ERR_INVALID, "%s: out is NULL", fn);
    *out = NULL;
    if (!images_path || !labels_path) return pdp__err(PDP_ERR_INVALID, "%s: NULL path", fn);
    if ((st = pdp__check_desc(desc, fn)) != PDP_OK) return st;
    if ((st = pdp__load_idx(out, images_path, labels_path, desc, fn)) == PDP_OK)
        snprintf((*out)->source, sizeof (*out)->source, "%s", images_path);
    return st;
}

/* ---- fashion-mnist ---- */

/* Looks for dir/name, then dir/name.gz; appends each path tried to `tried`. */
PDP__PRIVATE bool pdp__find_file(const char *dir, const char *name, char *path, size_t cap,
                                 char *tried, size_t tried_cap)
{
    static const char *const ext[2] = {"", ".gz"};
    int i;
    for (i = 0; i < 2; i++) {
        FILE *f;
        size_t used = strlen(tried);
        snprintf(path, cap, "%s/%s%s", dir, name, ext[i]);
        snprintf(tried + used, tried_cap - used, "%s%s", used ? ", " : "", path);
        if (pdp__path_kind(path, true) != PDP__PATH_DIR && (f = fopen(path, "rb")) != NULL) {
            fclose(f);
            return true;
        }
    }
    return false;
}

PDP_API pdp_status pdp_dataset_load_fashion_mnist(pdp_dataset **out, bool train,
                                                  const pdp_dataset_desc *desc)
{
    static const char fn[] = "pdp_dataset_load_fashion_mnist";
    const char *dir = getenv("PDP_DATA"), *split = train ? "train" : "t10k";
    char name[64], images[1024], labels[1024], tried[2600] = "";
    bool found;
    pdp_status st;
    if (!out) return pdp__err(PDP_ERR_INVALID, "%s: out is NULL", fn);
    *out = NULL;
    if ((st = pdp__check_desc(desc, fn)) != PDP_OK) return st;
    if (!dir || !*dir) dir = "/usr/share/datasets/fashion-mnist";
    if (desc && desc->synthetic_fallback) { /* all four files, so train and test agree */
        const char *other = train ? "t10k" : "train";
        snprintf(name, sizeof name, "%s-images-idx3-ubyte", other);
        found = pdp__find_file(dir, name, images, sizeof images, tried, sizeof tried);
        snprintf(name, sizeof name, "%s-labels-idx1-ubyte", other);
        found = pdp__find_file(dir, name, labels, sizeof labels, tried, sizeof tried) && found;
    } else {
        found = true;
    }
    snprintf(name, sizeof name, "%s-images-idx3-ubyte", split);
    found = pdp__find_file(dir, name, images, sizeof images, tried, sizeof tried) && found;
    snprintf(name, sizeof name, "%s-labels-idx1-ubyte", split);
    found = pdp__find_file(dir, name, labels, sizeof labels, tried, sizeof tried) && found;
    if (!found && desc && desc->synthetic_fallback) {
        if ((st = pdp_dataset_synthetic(out, train, desc)) != PDP_OK)
            return pdp__err_wrap(st, "%s", fn);
        snprintf((*out)->source, sizeof (*out)->source, "synthetic (no Fashion-MNIST in %s: "
                 "set PDP_DATA to its directory or apt-get install dataset-fashion-mnist)", dir);
        return PDP_OK;
    }
    if (!found)
        return pdp__err(PDP_ERR_IO, "%s: Fashion-MNIST not found (tried %s); apt-get install "
                        "dataset-fashion-mnist or set PDP_DATA to the directory that holds the "
                        "files", fn, tried);
    if ((st = pdp__load_idx(out, images, labels, desc, fn)) == PDP_OK)
        snprintf((*out)->source, sizeof (*out)->source, "Fashion-MNIST");
    return st;
}

/* ---- synthetic ---- */

PDP_API pdp_status pdp_dataset_synthetic(pdp_dataset **out, bool train,
                                         const pdp_dataset_desc *desc)
{
    enum { CLASSES = 10, SIDE = 28, BLOBS = 3 };
    static const char fn[] = "pdp_dataset_synthetic";
    float *proto;
    pdp_dataset *ds;
    pdp_rng r;
    int64_t count, i;
    uint64_t seed = desc ? desc->seed : 0;
    int c, b, x, y;
    pdp_status st;
    if (!out) return pdp__err(PDP_ERR_INVALID, "%s: out is NULL", fn);
    *out = NULL;
    if ((st = pdp__check_desc(desc, fn)) != PDP_OK) return st;
    count = desc && desc->max_samples ? desc->max_samples : (train ? 60000 : 10000);
    if (!(proto = (float *)pdp__calloc(CLASSES * SIDE * SIDE * sizeof(float))))
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory", fn);
    if ((st = pdp__dataset_new(&ds, count, SIDE, SIDE, desc, fn)) != PDP_OK) {
        pdp__dealloc(proto);
        return st;
    }
    /* class prototypes, from (seed, stream 0): three blobs shared by every class plus two
       fainter ones of the class's own, so that classes overlap and the noise confuses them */
    pdp_rng_seed(&r, seed, 0);
    for (b = 0; b < CLASSES * 2 + BLOBS; b++) {
        float cx = 6 + 16 * pdp_rng_uniform(&r), cy = 6 + 16 * pdp_rng_uniform(&r);
        float sx = 1.5f + 3 * pdp_rng_uniform(&r), sy = 1.5f + 3 * pdp_rng_uniform(&r);
        float amp = b < CLASSES * 2 ? 0.25f + 0.25f * pdp_rng_uniform(&r) : 0.6f;
        for (c = 0; c < CLASSES; c++) {
            float *p = proto + c * SIDE * SIDE;
            if (b < CLASSES * 2 && b / 2 != c) continue; /* blob b belongs to class b / 2 */
            for (y = 0; y < SIDE; y++)
                for (x = 0; x < SIDE; x++) {
                    float dx = ((float)x - cx) / sx, dy = ((float)y - cy) / sy;
                    p[y * SIDE + x] += amp * expf(-0.5f * (dx * dx + dy * dy));
                }
        }
    }
    /* samples: shifted, scaled, noisy prototypes, from (seed, stream 1 or 2) */
    pdp_rng_seed(&r, seed, train ? 1 : 2);
    for (i = 0; i < count; i++) {
        float *img = ds->images + i * SIDE * SIDE;
        int label = (int)pdp_rng_below(&r, CLASSES);
        int sx = (int)pdp_rng_below(&r, 5) - 2, sy = (int)pdp_rng_below(&r, 5) - 2;
        float scale = 0.6f + 0.4f * pdp_rng_uniform(&r);
        const float *p = proto + label * SIDE * SIDE;
        ds->labels[i] = label;
        for (y = 0; y < SIDE; y++)
            for (x = 0; x < SIDE; x++) {
                int px = x - sx, py = y - sy;
                float v = (px >= 0 && px < SIDE && py >= 0 && py < SIDE) ? p[py * SIDE + px] : 0;
                v = scale * v + 0.3f * pdp_rng_normal(&r);
                v = v < 0 ? 0 : v > 1 ? 1 : v;
                if (desc && desc->std > 0) v = (v - desc->mean) / desc->std;
                img[y * SIDE + x] = v;
            }
    }
    ds->classes = CLASSES;
    snprintf(ds->source, sizeof ds->source, "synthetic");
    pdp__dealloc(proto);
    *out = ds;
    return PDP_OK;
}

/* ---- a user's arrays ---- */

/* One sample's dimensions and features from a->ndim and a->shape, or PDP_ERR_SHAPE naming
   the field. */
PDP__PRIVATE pdp_status pdp__arrays_shape(const pdp_dataset_arrays *a, int *ndim,
                                          int64_t *features, const char *fn)
{
    int nd = a->ndim, i;
    int64_t f = 1;
    if (nd < 0 || nd > 3)
        return pdp__err(PDP_ERR_SHAPE, "%s: arrays.ndim is %d (a sample has 1 to 3 dimensions; "
                        "0 counts them in arrays.shape)", fn, nd);
    while (a->ndim == 0 && nd < 3 && a->shape[nd] != 0) nd++;
    if (nd == 0)
        return pdp__err(PDP_ERR_SHAPE, "%s: arrays.shape is empty (one sample's shape: "
                        "{features}, {T, C} or {channels, height, width})", fn);
    for (i = 0; i < 3; i++) {
        int64_t e = a->shape[i];
        if (i < nd && e < 1)
            return pdp__err(PDP_ERR_SHAPE, "%s: arrays.shape[%d] is %lld (must be >= 1)", fn, i,
                            (long long)e);
        if (i >= nd && e != 0 && e != 1)
            return pdp__err(PDP_ERR_SHAPE, "%s: arrays.shape[%d] is %lld, past the sample's %d "
                            "dimension%s (arrays.ndim %d)", fn, i, (long long)e, nd,
                            nd == 1 ? "" : "s", a->ndim);
        if (i < nd && !pdp__mul_ok(f, e, &f))
            return pdp__err(PDP_ERR_SHAPE, "%s: arrays.shape's %d dimensions overflow", fn, nd);
    }
    *ndim = nd;
    *features = f;
    return PDP_OK;
}

/* PDP_OK when v[0..n) are finite, else PDP_ERR_INVALID naming the element, its sample and
   its feature (v holds rows of `row` values). */
PDP__PRIVATE pdp_status pdp__arrays_finite(const float *v, int64_t n, int64_t row,
                                           const char *field, const char *fn)
{
    int64_t i;
    for (i = 0; i < n; i++)
        if (!isfinite(v[i]))
            return pdp__err(PDP_ERR_INVALID, "%s: arrays.%s[%lld] (sample %lld, feature %lld) is "
                            "%s", fn, field, (long long)i, (long long)(i / row),
                            (long long)(i % row), v[i] != v[i] ? "NaN" : "infinite");
    return PDP_OK;
}

PDP_API pdp_status pdp_dataset_from_arrays(pdp_dataset **out, const pdp_dataset_arrays *a)
{
    static const char fn[] = "pdp_dataset_from_arrays";
    pdp_dataset *ds;
    /* features and ndim: set by pdp__arrays_shape when it succeeds; initialised because g++
       -O2 cannot see that (-Wmaybe-uninitialized) */
    int64_t features = 1, tf, floats, tfloats = 0, i;
    int ndim = 1, classes;
    pdp_status st;
    if (!out) return pdp__err(PDP_ERR_INVALID, "%s: out is NULL", fn);
    *out = NULL;
    if (!a) return pdp__err(PDP_ERR_INVALID, "%s: arrays is NULL", fn);
    if (!a->x) return pdp__err(PDP_ERR_INVALID, "%s: arrays.x is NULL", fn);
    if (a->count < 1)
        return pdp__err(PDP_ERR_INVALID, "%s: arrays.count is %lld (must be >= 1)", fn,
                        (long long)a->count);
    if ((st = pdp__arrays_shape(a, &ndim, &features, fn)) != PDP_OK) return st;
    if (a->labels && a->targets)
        return pdp__err(PDP_ERR_INVALID, "%s: arrays.labels and arrays.targets are both set "
                        "(one: class labels or float targets)", fn);
    if (!a->labels && !a->targets)
        return pdp__err(PDP_ERR_INVALID, "%s: neither arrays.labels nor arrays.targets is set "
                        "(class labels, or float targets for a regression)", fn);
    if (a->labels && a->target_features)
        return pdp__err(PDP_ERR_INVALID, "%s: arrays.target_features is %lld with labels (it "
                        "sizes arrays.targets)", fn, (long long)a->target_features);
    if (a->targets && a->classes)
        return pdp__err(PDP_ERR_INVALID, "%s: arrays.classes is %d with targets (a regression "
                        "set has no classes)", fn, a->classes);
    if (a->classes < 0)
        return pdp__err(PDP_ERR_INVALID, "%s: arrays.classes is %d (must be >= 0; 0: the largest "
                        "label + 1)", fn, a->classes);
    if (a->target_features < 0)
        return pdp__err(PDP_ERR_SHAPE, "%s: arrays.target_features is %lld (must be >= 0; 0: "
                        "1)", fn, (long long)a->target_features);
    tf = a->targets ? PDP__DEF(a->target_features, 1) : 0;
    if (!pdp__mul_ok(a->count, features, &floats) || !pdp__mul_ok(a->count, tf, &tfloats))
        return pdp__err(PDP_ERR_INVALID, "%s: arrays.count %lld x %lld features (or x %lld "
                        "target_features) exceed %lld floats", fn, (long long)a->count,
                        (long long)features, (long long)tf, (long long)PDP__COUNT_MAX);
    /* every value checked before anything is allocated */
    if ((st = pdp__arrays_finite(a->x, floats, features, "x", fn)) != PDP_OK) return st;
    if (a->targets &&
        (st = pdp__arrays_finite(a->targets, tfloats, tf, "targets", fn)) != PDP_OK)
        return st;
    classes = a->classes;
    for (i = 0; a->labels && i < a->count; i++) {
        int32_t y = a->labels[i];
        if (y < 0)
            return pdp__err(PDP_ERR_INVALID, "%s: arrays.labels[%lld] is %d (a class label is "
                            ">= 0)", fn, (long long)i, (int)y);
        if (a->classes && y >= a->classes)
            return pdp__err(PDP_ERR_INVALID, "%s: arrays.labels[%lld] is %d, not below "
                            "arrays.classes = %d", fn, (long long)i, (int)y, a->classes);
        if (!a->classes && y == INT32_MAX)
            return pdp__err(PDP_ERR_INVALID, "%s: arrays.labels[%lld] is %d: the classes (the "
                            "largest label + 1) would not fit in an int32", fn, (long long)i,
                            (int)y);
        if (!a->classes && y + 1 > classes) classes = (int)y + 1;
    }
    if (!(ds = (pdp_dataset *)pdp__calloc(sizeof *ds)))
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory", fn);
    ds->images = (float *)pdp__alloc((size_t)floats * sizeof(float));
    if (a->labels) ds->labels = (int32_t *)pdp__alloc((size_t)a->count * sizeof(int32_t));
    if (a->targets) ds->targets = (float *)pdp__alloc((size_t)tfloats * sizeof(float));
    if (!ds->images || (a->labels && !ds->labels) || (a->targets && !ds->targets)) {
        pdp_dataset_free(ds);
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory for %lld samples of %lld floats",
                        fn, (long long)a->count, (long long)(features + tf));
    }
    memcpy(ds->images, a->x, (size_t)floats * sizeof(float));
    if (a->labels) memcpy(ds->labels, a->labels, (size_t)a->count * sizeof(int32_t));
    if (a->targets) memcpy(ds->targets, a->targets, (size_t)tfloats * sizeof(float));
    ds->count = a->count;
    ds->ndim = ndim;
    for (i = 0; i < 3; i++) ds->shape[i] = i < ndim ? a->shape[i] : 1;
    ds->features = features;
    ds->classes = classes;
    ds->target_features = tf;
    snprintf(ds->source, sizeof ds->source, "%s", a->name ? a->name : "arrays");
    *out = ds;
    return PDP_OK;
}

PDP_API void pdp_dataset_free(pdp_dataset *ds)
{
    if (!ds) return;
    pdp__dealloc(ds->images);
    pdp__dealloc(ds->labels);
    pdp__dealloc(ds->targets);
    pdp__dealloc(ds);
}

/* ---- gather, view, permutation ---- */

/* Both gathers: samples to x_out, labels to labels_out, float targets to targets_out (each
   may be NULL; the caller checked that the dataset has what it asks for). */
PDP__PRIVATE pdp_status pdp__gather(const pdp_dataset *ds, const int64_t *indices, int64_t n,
                                    float *x_out, int32_t *labels_out, float *targets_out,
                                    const char *fn)
{
    int64_t i, tf = ds->target_features;
    if ((n > 0 && !indices) || n < 0)
        return pdp__err(PDP_ERR_INVALID, "%s: NULL indices, or n < 0", fn);
    for (i = 0; i < n; i++)
        if (indices[i] < 0 || indices[i] >= ds->count)
            return pdp__err(PDP_ERR_INVALID, "%s: indices[%lld] = %lld is outside [0, %lld)", fn,
                            (long long)i, (long long)indices[i], (long long)ds->count);
    for (i = 0; i < n; i++) {
        if (x_out)
            memcpy(x_out + i * ds->features, ds->images + indices[i] * ds->features,
                   (size_t)ds->features * sizeof(float));
        if (labels_out) labels_out[i] = ds->labels[indices[i]];
        if (targets_out)
            memcpy(targets_out + i * tf, ds->targets + indices[i] * tf, (size_t)tf * sizeof(float));
    }
    return PDP_OK;
}

PDP_API pdp_status pdp_dataset_gather(const pdp_dataset *ds, const int64_t *indices, int64_t n,
                                      float *x_out, int32_t *labels_out)
{
    static const char fn[] = "pdp_dataset_gather";
    if (!ds) return pdp__err(PDP_ERR_INVALID, "%s: dataset is NULL", fn);
    if (labels_out && !ds->labels)
        return pdp__err(PDP_ERR_INVALID, "%s: %s is a regression set, with float targets and no "
                        "labels: gather them with pdp_dataset_gather_targets", fn, ds->source);
    return pdp__gather(ds, indices, n, x_out, labels_out, NULL, fn);
}

PDP_API pdp_status pdp_dataset_gather_targets(const pdp_dataset *ds, const int64_t *indices,
                                              int64_t n, float *x_out, float *targets_out)
{
    static const char fn[] = "pdp_dataset_gather_targets";
    if (!ds) return pdp__err(PDP_ERR_INVALID, "%s: dataset is NULL", fn);
    if (targets_out && !ds->targets)
        return pdp__err(PDP_ERR_INVALID, "%s: %s is a classification set, with labels and no "
                        "float targets: gather them with pdp_dataset_gather", fn, ds->source);
    return pdp__gather(ds, indices, n, x_out, NULL, targets_out, fn);
}

/* Wraps data as [n, the dataset's sample shape...]. */
PDP__PRIVATE pdp_status pdp__dataset_wrap(const pdp_dataset *ds, float *data, int64_t n,
                                          pdp_tensor *x)
{
    int64_t shape[4];
    shape[0] = n;
    memcpy(shape + 1, ds->shape, 3 * sizeof *shape);
    return pdp_tensor_wrap(data, pdp_cpu(), ds->ndim + 1, shape, x);
}

PDP_API pdp_status pdp_dataset_view(const pdp_dataset *ds, int64_t first, int64_t n,
                                    pdp_tensor *x)
{
    int64_t end = 0;
    if (!ds || !x) return pdp__err(PDP_ERR_INVALID, "pdp_dataset_view: NULL argument");
    if (first < 0 || n < 1 || !pdp__add_ok(first, n, &end))
        return pdp__err(PDP_ERR_INVALID, "pdp_dataset_view: %lld samples from sample %lld outside "
                        "[0, %lld)", (long long)n, (long long)first, (long long)ds->count);
    if (end > ds->count)
        return pdp__err(PDP_ERR_INVALID, "pdp_dataset_view: samples [%lld, %lld) outside [0, %lld)",
                        (long long)first, (long long)end, (long long)ds->count);
    return pdp__dataset_wrap(ds, ds->images + first * ds->features, n, x);
}

/* ---- batcher ---- */

struct pdp_batcher {
    const pdp_dataset *ds;
    pdp_batcher_desc desc; /* defaults filled; desc.indices points at base */
    int64_t *base;         /* the index list: the caller's copy, or 0..count-1 */
    int64_t *order;        /* this epoch's order of base */
    int64_t len;           /* entries in base and order */
    int64_t next;          /* position in order of the next batch */
    uint64_t epoch;
    float *x;              /* [batch_size, features] */
    int32_t *labels;       /* [batch_size]; NULL for a regression set */
    float *targets;        /* [batch_size, target_features]; NULL for a classification set */
    pdp_tensor *xdev;      /* [batch_size, sample shape] on desc.device; NULL on the CPU */
    pdp_tensor *tdev;      /* [batch_size, target_features] on desc.device for a regression
                              set; else NULL */
    pdp_status st;         /* the last pdp_batcher_next's failure, else PDP_OK */
};

PDP_API pdp_status pdp_batcher_create(pdp_batcher **out, const pdp_dataset *ds,
                                      const pdp_batcher_desc *desc)
{
    static const char fn[] = "pdp_batcher_create";
    pdp_batcher_desc d;
    pdp_batcher *b;
    int64_t i;
    if (!out) return pdp__err(PDP_ERR_INVALID, "%s: out is NULL", fn);
    *out = NULL;
    if (!ds) return pdp__err(PDP_ERR_INVALID, "%s: dataset is NULL", fn);
    if (desc) d = *desc;
    else memset(&d, 0, sizeof d);
    d.batch_size = PDP__DEF(d.batch_size, 64);
    if (d.batch_size < 1 || d.batch_size > ((int64_t)1 << 40) / PDP__MAX(ds->features, 1) ||
        d.batch_size > ((int64_t)1 << 40) / PDP__MAX(ds->target_features, 1))
        return pdp__err(PDP_ERR_INVALID, "%s: desc.batch_size is %lld", fn,
                        (long long)d.batch_size);
    if (d.num_indices < 0 || (d.num_indices > 0 && !d.indices) || (d.indices && !d.num_indices))
        return pdp__err(PDP_ERR_INVALID, "%s: desc.num_indices is %lld with indices %s%s", fn,
                        (long long)d.num_indices, d.indices ? "set" : "NULL",
                        d.indices ? " (an epoch of no batch)" : "");
    if (d.indices && d.sampler)
        return pdp__err(PDP_ERR_INVALID, "%s: desc.indices and desc.sampler are both set", fn);
    if (d.sampler) { /* epoch 0's list, as pdp_batcher_reset(b, 0) below takes it */
        pdp_dist_sampler_set_epoch(d.sampler, 0);
        d.indices = pdp_dist_sampler_indices(d.sampler, &d.num_indices);
    }
    for (i = 0; d.indices && i < d.num_indices; i++)
        if (d.indices[i] < 0 || d.indices[i] >= ds->count)
            return pdp__err(PDP_ERR_INVALID, "%s: desc.%s[%lld] = %lld is outside [0, %lld)", fn,
                            d.sampler ? "sampler's indices" : "indices", (long long)i,
                            (long long)d.indices[i], (long long)ds->count);
    if (d.drop_last && d.batch_size > (d.indices ? d.num_indices : ds->count))
        return pdp__err(PDP_ERR_INVALID, "%s: desc.batch_size %lld with drop_last over %lld "
                        "samples%s: an epoch of no batch", fn, (long long)d.batch_size,
                        (long long)(d.indices ? d.num_indices : ds->count),
                        d.sampler ? " (the sampler's shard)" : "");
    if (!(b = (pdp_batcher *)pdp__calloc(sizeof *b)))
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory", fn);
    b->ds = ds;
    b->len = d.indices ? d.num_indices : ds->count;
    b->base = (int64_t *)pdp__alloc((size_t)(b->len + 1) * sizeof(int64_t));
    b->order = (int64_t *)pdp__alloc((size_t)(b->len + 1) * sizeof(int64_t));
    b->x = (float *)pdp__alloc((size_t)(d.batch_size * ds->features) * sizeof(float));
    if (ds->labels) b->labels = (int32_t *)pdp__alloc((size_t)d.batch_size * sizeof(int32_t));
    if (ds->targets)
        b->targets = (float *)pdp__alloc((size_t)(d.batch_size * ds->target_features) *
                                         sizeof(float));
    if (!b->base || !b->order || !b->x || (ds->labels && !b->labels) ||
        (ds->targets && !b->targets)) { /* the message reads b: free after */
        pdp_status st = pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory for %lld indices and a "
                                 "batch of %lld", fn, (long long)b->len, (long long)d.batch_size);
        pdp_batcher_free(b);
        return st;
    }
    if (d.device.kind != PDP_DEVICE_CPU) {
        int64_t shape[4];
        pdp_status st;
        shape[0] = d.batch_size;
        memcpy(shape + 1, ds->shape, 3 * sizeof *shape);
        if ((st = pdp_tensor_create(&b->xdev, d.device, ds->ndim + 1, shape)) != PDP_OK) {
            st = pdp__err_wrap(st, "%s: the batch buffer on desc.device", fn);
            pdp_batcher_free(b);
            return st;
        }
        shape[1] = ds->target_features;
        if (ds->targets &&
            (st = pdp_tensor_create(&b->tdev, d.device, 2, shape)) != PDP_OK) {
            st = pdp__err_wrap(st, "%s: the target buffer on desc.device", fn);
            pdp_batcher_free(b);
            return st;
        }
    }
    for (i = 0; i < b->len; i++) b->base[i] = d.indices ? d.indices[i] : i;
    d.indices = b->base;
    d.num_indices = b->len;
    b->desc = d;
    pdp_batcher_reset(b, 0);
    *out = b;
    return PDP_OK;
}

PDP_API pdp_batcher_desc pdp_batcher_get_desc(const pdp_batcher *b)
{
    pdp_batcher_desc d;
    if (b) return b->desc;
    memset(&d, 0, sizeof d);
    return d;
}

PDP_API void pdp_batcher_free(pdp_batcher *b)
{
    if (!b) return;
    pdp__dealloc(b->base);
    pdp__dealloc(b->order);
    pdp__dealloc(b->x);
    pdp__dealloc(b->labels);
    pdp__dealloc(b->targets);
    pdp_tensor_free(b->xdev);
    pdp_tensor_free(b->tdev);
    pdp__dealloc(b);
}

PDP_API void pdp_batcher_reset(pdp_batcher *b, uint64_t epoch)
{
    int64_t i, n;
    if (!b) return;
    b->epoch = epoch;
    b->next = 0;
    b->st = PDP_OK;
    if (b->desc.sampler) { /* the sampler's list for this epoch (its length never changes) */
        const int64_t *idx;
        pdp_dist_sampler_set_epoch(b->desc.sampler, epoch);
        idx = pdp_dist_sampler_indices(b->desc.sampler, &n);
        for (i = 0; i < b->len && i < n; i++) {
            if (idx[i] < 0 || idx[i] >= b->ds->count) {
                b->st = pdp__err(PDP_ERR_INVALID, "pdp_batcher_reset: the sampler's index %lld "
                                 "of epoch %llu is outside the dataset's [0, %lld)",
                                 (long long)idx[i], (unsigned long long)epoch,
                                 (long long)b->ds->count);
                b->next = b->len; /* the epoch is over before it starts */
                return;
            }
            b->base[i] = idx[i];
        }
    }
    if (!b->desc.shuffle) {
        memcpy(b->order, b->base, (size_t)b->len * sizeof(int64_t));
        return;
    }
    pdp_permutation(b->order, b->len, b->desc.seed, epoch); /* positions, then indices */
    for (i = 0; i < b->len; i++) b->order[i] = b->base[b->order[i]];
}

/* *t, a view of the first k rows of a host buffer, becomes the same rows of dev, copied
   there. */
PDP__PRIVATE pdp_status pdp__batch_to_device(pdp_tensor *dev, int64_t k, pdp_tensor *t)
{
    pdp_tensor host = *t;
    pdp_status st = pdp_tensor_rows_view(dev, 0, k, t);
    return st == PDP_OK ? pdp_tensor_copy(t, &host) : st;
}

/* The next batch of the epoch, copied into the batcher's buffers: *x its samples and, when
   target is not NULL, *target its labels or float targets, on desc.device where they go
   there. Returns the batch's size; 0 at the epoch's end, or on a failed device copy
   (b->st says why). */
PDP__PRIVATE int64_t pdp__batcher_take(pdp_batcher *b, pdp_tensor *x, pdp_tensor *target,
                                       const char *fn)
{
    const pdp_dataset *ds = b->ds;
    int64_t k, i, f = ds->features, tf = ds->target_features, shape[2];
    k = PDP__MIN(b->desc.batch_size, b->len - b->next);
    if (k <= 0 || (b->desc.drop_last && k < b->desc.batch_size)) return 0;
    for (i = 0; i < k; i++) { /* indices were checked at create */
        int64_t s = b->order[b->next + i];
        memcpy(b->x + i * f, ds->images + s * f, (size_t)f * sizeof(float));
        if (b->labels) b->labels[i] = ds->labels[s];
        if (b->targets && target)
            memcpy(b->targets + i * tf, ds->targets + s * tf, (size_t)tf * sizeof(float));
    }
    b->next += k;
    pdp__dataset_wrap(ds, b->x, k, x);
    if (target) {
        shape[0] = k;
        shape[1] = tf;
        if (b->labels) pdp_tensor_wrap_ids(b->labels, pdp_cpu(), 1, shape, target);
        else pdp_tensor_wrap(b->targets, pdp_cpu(), 2, shape, target);
    }
    if (b->xdev) { /* x and float targets to the device buffers; int32 labels stay here */
        pdp_status st = pdp__batch_to_device(b->xdev, k, x);
        if (st == PDP_OK && target && b->tdev) st = pdp__batch_to_device(b->tdev, k, target);
        if (st != PDP_OK) {
            b->st = pdp__err_wrap(st, "%s: copying a batch of %lld to the device", fn,
                                  (long long)k);
            return 0;
        }
    }
    return k;
}

PDP_API bool pdp_batcher_next(pdp_batcher *b, pdp_tensor *x, const int32_t **labels, int64_t *n)
{
    static const char fn[] = "pdp_batcher_next";
    int64_t k;
    if (n) *n = 0;
    if (!b || !x) {
        pdp_status st = pdp__err(PDP_ERR_INVALID, "%s: NULL batcher or tensor", fn);
        if (b) b->st = st;
        return false;
    }
    if (labels && !b->labels) {
        b->st = pdp__err(PDP_ERR_INVALID, "%s: %s is a regression set, with %lld float targets "
                         "a sample and no labels: take its batches with "
                         "pdp_batcher_next_target", fn, b->ds->source,
                         (long long)b->ds->target_features);
        return false;
    }
    if (!(k = pdp__batcher_take(b, x, NULL, fn))) return false;
    if (labels) *labels = b->labels;
    if (n) *n = k;
    return true;
}

PDP_API bool pdp_batcher_next_target(pdp_batcher *b, pdp_tensor *x, pdp_tensor *target,
                                     int64_t *n)
{
    static const char fn[] = "pdp_batcher_next_target";
    int64_t k;
    if (n) *n = 0;
    if (!b || !x) {
        pdp_status st = pdp__err(PDP_ERR_INVALID, "%s: NULL batcher or tensor", fn);
        if (b) b->st = st;
        return false;
    }
    if (!(k = pdp__batcher_take(b, x, target, fn))) return false;
    if (n) *n = k;
    return true;
}

PDP_API pdp_status pdp_batcher_status(const pdp_batcher *b)
{
    return b ? b->st : PDP_ERR_INVALID;
}

PDP_API int64_t pdp_batcher_num_batches(const pdp_batcher *b)
{
    if (!b) return 0;
    return b->desc.drop_last ? b->len / b->desc.batch_size
                             : (b->len + b->desc.batch_size - 1) / b->desc.batch_size;
}

PDP_API const int64_t *pdp_batcher_order(const pdp_batcher *b, int64_t *count)
{
    if (count) *count = b ? b->len : 0;
    return b ? b->order : NULL;
}

/* ---- token data ---- */

#define PDP__TOKEN_SYNTHETIC_BYTES ((int64_t)1 << 20) /* desc.max_tokens 0, synthetic */

/* d = *in with the defaults filled, or PDP_ERR_INVALID naming the field. */
PDP__PRIVATE pdp_status pdp__token_desc_defaults(const pdp_token_dataset_desc *in,
                                                 pdp_token_dataset_desc *d, const char *fn)
{
    if (in) *d = *in;
    else memset(d, 0, sizeof *d);
    if (d->context < 1 || d->context >= PDP__COUNT_MAX)
        return pdp__err(PDP_ERR_INVALID, "%s: desc.context is %lld (required, in [1, %lld))",
                        fn, (long long)d->context, (long long)PDP__COUNT_MAX);
    if (!(d->val_fraction >= 0.0 && d->val_fraction < 1.0)) /* NaN too */
        return pdp__err(PDP_ERR_INVALID, "%s: desc.val_fraction is %g (must be in (0, 1); 0 "
                        "means 0.1)", fn, d->val_fraction);
    if (d->no_validation && d->val_fraction != 0.0)
        return pdp__err(PDP_ERR_INVALID, "%s: desc.no_validation is set and desc.val_fraction "
                        "is %g", fn, d->val_fraction);
    if (d->max_tokens < 0 || d->max_tokens > PDP__COUNT_MAX)
        return pdp__err(PDP_ERR_INVALID, "%s: desc.max_tokens is %lld (must be >= 0)", fn,
                        (long long)d->max_tokens);
    if (!d->no_validation) d->val_fraction = PDP__DEF(d->val_fraction, 0.1);
    return PDP_OK;
}

/* Cuts ds's stream into the two splits and their windows; fails, naming what (the path)
   and the lengths, when a split has fewer than T + 1 tokens. */
PDP__PRIVATE pdp_status pdp__token_split(pdp_token_dataset *ds, const char *what, const char *fn)
{
    int64_t T = ds->desc.context, train, val;
    ds->vocab = 256;
    ds->context = T;
    /* nanoGPT's int(n * 0.9): 1 - 0.1 is the double 0.9, so the cut is the same token */
    ds->split_at = ds->desc.no_validation
                       ? ds->count
                       : (int64_t)((double)ds->count * (1.0 - ds->desc.val_fraction));
    train = ds->split_at;
    val = ds->count - ds->split_at;
    if (ds->desc.no_validation && train < T + 1)
        return pdp__err(PDP_ERR_INVALID, "%s: %s: %lld tokens (all training, no_validation) "
                        "are fewer than context + 1 = %lld", fn, what, (long long)ds->count,
                        (long long)(T + 1));
    if (!ds->desc.no_validation && (train < T + 1 || val < T + 1))
        return pdp__err(PDP_ERR_INVALID, "%s: %s: %lld tokens split into %lld for training "
                        "and %lld for validation (val_fraction %g); each split needs at least "
                        "context + 1 = %lld", fn, what, (long long)ds->count, (long long)train,
                        (long long)val, ds->desc.val_fraction, (long long)(T + 1));
    ds->windows[PDP_SPLIT_TRAIN] = (train - 1) / T;
    ds->windows[PDP_SPLIT_VAL] = val > T ? (val - 1) / T : 0;
    return PDP_OK;
}

PDP__PRIVATE int pdp__by_path(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

PDP__PRIVATE void pdp__free_paths(char **paths, int64_t n)
{
    int64_t i;
    for (i = 0; paths && i < n; i++) pdp__dealloc(paths[i]);
    pdp__dealloc(paths);
}

/* The paths of dir's regular files (links are skipped) whose names do not end in
   ".dat", sorted bytewise: *n of them in *paths (each and the list PDP_MALLOC'd). */
PDP__PRIVATE pdp_status pdp__text_dir(const char *dir, char ***paths, int64_t *n, const char *fn)
{
    size_t dlen = strlen(dir);
    const char *sep = dlen && pdp__is_sep(dir[dlen - 1]) ? "" : "/", *name;
    char **list = NULL;
    int64_t len = 0, cap = 0;
    pdp_status st = PDP_OK;
    pdp__dir d;
    *paths = NULL;
    *n = 0;
    if (pdp__dir_open(&d, dir) != 0)
        return pdp__err(PDP_ERR_IO, "%s: cannot list %s: %s", fn, dir, strerror(errno));
    for (;;) {
        size_t nlen, bytes;
        int kind;
        char *p;
        if (!(name = pdp__dir_next(&d))) {
            if (errno)
                st = pdp__err(PDP_ERR_IO, "%s: cannot list %s: %s", fn, dir, strerror(errno));
            break;
        }
        nlen = strlen(name);
        if (nlen >= 4 && strcmp(name + nlen - 4, ".dat") == 0) continue;
        if (len == cap) { /* the list doubles */
            char **grown;
            cap = cap ? 2 * cap : 64;
            if (!(grown = (char **)pdp__alloc((size_t)cap * sizeof *grown))) {
                st = pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory to list %s", fn, dir);
                break;
            }
            if (len) memcpy(grown, list, (size_t)len * sizeof *list);
            pdp__dealloc(list);
            list = grown;
        }
        bytes = dlen + strlen(sep) + nlen + 1;
        if (!(p = (char *)pdp__alloc(bytes))) {
            st = pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory to list %s", fn, dir);
            break;
        }
        snprintf(p, bytes, "%s%s%s", dir, sep, name);
        if ((kind = pdp__path_kind(p, false)) < 0) {
            st = pdp__err(PDP_ERR_IO, "%s: cannot stat %s: %s", fn, p, strerror(errno));
            pdp__dealloc(p);
            break;
        }
        if (kind != PDP__PATH_FILE) { /* ".", "..", subdirectories, links, devices */
            pdp__dealloc(p);
            continue;
        }
        list[len++] = p;
    }
    pdp__dir_close(&d);
    if (st != PDP_OK) {
        pdp__free_paths(list, len);
        return st;
    }
    if (len) qsort((void *)list, (size_t)len, sizeof *list, pdp__by_path); /* same dir prefix */
    *paths = list;
    *n = len;
    return PDP_OK;
}

/* Reads paths[0..n) until max bytes (0 = all) and concatenates them into ds->tokens,
   ds->count; ds->files counts the files read. One file is kept as read (no copy). */
PDP__PRIVATE pdp_status pdp__text_read(pdp_token_dataset *ds, const char *const *paths,
                                       int64_t n, int64_t max, const char *fn)
{
    uint8_t **data;
    size_t *bytes, total = 0, at = 0;
    int64_t i, nread = 0;
    pdp_status st = PDP_OK;
    if (n == 0) return PDP_OK;
    data = (uint8_t **)pdp__calloc((size_t)n * sizeof *data);
    bytes = (size_t *)pdp__calloc((size_t)n * sizeof *bytes);
    if (!data || !bytes) {
        st = pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory for a list of %lld files", fn,
                      (long long)n);
        goto done;
    }
    for (i = 0; i < n && (max == 0 || total < (size_t)max); i++, nread++) {
        if ((st = pdp__read_file(paths[i], &data[i], &bytes[i], NULL, NULL, fn)) != PDP_OK)
            goto done;
        if (bytes[i] > (size_t)PDP__COUNT_MAX - total) {
            st = pdp__err(PDP_ERR_INVALID, "%s: %s: the text passes %lld bytes", fn, paths[i],
                          (long long)PDP__COUNT_MAX);
            goto done;
        }
        total += bytes[i];
    }
    if (max && total > (size_t)max) total = (size_t)max;
    ds->files = nread;
    ds->count = (int64_t)total;
    if (nread == 1) { /* the file's buffer is the stream */
        ds->tokens = data[0];
        data[0] = NULL;
        goto done;
    }
    if (!(ds->tokens = (uint8_t *)pdp__alloc(total))) {
        st = pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory for %lld bytes of text", fn,
                      (long long)total);
        goto done;
    }
    for (i = 0; i < nread && at < total; i++) {
        size_t take = PDP__MIN(bytes[i], total - at);
        memcpy(ds->tokens + at, data[i], take);
        at += take;
    }
done:
    for (i = 0; data && i < n; i++) pdp__dealloc(data[i]);
    pdp__dealloc(data);
    pdp__dealloc(bytes);
    return st;
}

PDP_API pdp_status pdp_token_dataset_load(pdp_token_dataset **out, const char *path,
                                          const pdp_token_dataset_desc *desc)
{
    static const char fn[] = "pdp_token_dataset_load";
    pdp_token_dataset *ds;
    pdp_token_dataset_desc d;
    char **paths = NULL;
    const char *one = path;
    int64_t n = 0;
    int kind;
    bool dir;
    pdp_status st;
    if (!out) return pdp__err(PDP_ERR_INVALID, "%s: out is NULL", fn);
    *out = NULL;
    if (!path) return pdp__err(PDP_ERR_INVALID, "%s: path is NULL", fn);
    if ((st = pdp__token_desc_defaults(desc, &d, fn)) != PDP_OK) return st;
    if ((kind = pdp__path_kind(path, true)) < 0) {
        int err = errno;
        bool missing = err == ENOENT || err == ENOTDIR;
        if (missing && d.synthetic_fallback) {
            if ((st = pdp_token_dataset_synthetic(out, &d)) != PDP_OK)
                return pdp__err_wrap(st, "%s", fn);
            snprintf((*out)->source, sizeof (*out)->source, "synthetic (no text at %s: "
                     "apt-get install fortunes for %s, or name a text file or a directory)",
                     path, PDP_FORTUNES_DIR);
            return PDP_OK;
        }
        return pdp__err(PDP_ERR_IO, "%s: cannot open %s: %s%s", fn, path, strerror(err),
                        missing ? " (name a text file or a directory of them; apt-get install "
                                  "fortunes gives " PDP_FORTUNES_DIR ")" : "");
    }
    dir = kind == PDP__PATH_DIR;
    if (!dir && kind != PDP__PATH_FILE)
        return pdp__err(PDP_ERR_IO, "%s: %s is neither a regular file nor a directory", fn, path);
    if (!(ds = (pdp_token_dataset *)pdp__calloc(sizeof *ds)))
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory", fn);
    ds->desc = d;
    if (dir) st = pdp__text_dir(path, &paths, &n, fn);
    else n = 1;
    if (st == PDP_OK)
        st = pdp__text_read(ds, dir ? (const char *const *)paths : &one, n, d.max_tokens, fn);
    if (st == PDP_OK && ds->count == 0)
        st = !dir ? pdp__err(PDP_ERR_INVALID, "%s: %s is empty (a file is read to the size it "
                             "reports: /proc's report 0)", fn, path)
             : n ? pdp__err(PDP_ERR_INVALID, "%s: %s: its %lld files hold no text (0 bytes)",
                            fn, path, (long long)n)
                 : pdp__err(PDP_ERR_INVALID, "%s: %s holds no text file (a regular file not "
                            "named *.dat)", fn, path);
    if (st == PDP_OK) st = pdp__token_split(ds, path, fn);
    if (dir) pdp__free_paths(paths, n);
    if (st != PDP_OK) {
        pdp_token_dataset_free(ds);
        return st;
    }
    if (dir)
        snprintf(ds->source, sizeof ds->source, "%s (%lld files)", path, (long long)ds->files);
    else
        snprintf(ds->source, sizeof ds->source, "%s", path);
    *out = ds;
    return PDP_OK;
}

/* The synthetic text's writer: bytes up to cap, the next letter capitalised when asked. */
typedef struct pdp__text_writer {
    uint8_t *p;
    int64_t n, cap;
    bool capital;
} pdp__text_writer;

PDP__PRIVATE void pdp__text_put(pdp__text_writer *w, const char *s)
{
    for (; *s && w->n < w->cap; s++) {
        char c = *s;
        if (w->capital && c >= 'a' && c <= 'z') c = (char)(c - 'a' + 'A');
        w->capital = false;
        w->p[w->n++] = (uint8_t)c;
    }
}

#define PDP__PICK(r, words)                                                                    \
    ((words)[pdp_rng_below((r), (uint32_t)(sizeof(words) / sizeof *(words)))])

/* determiner [adjective] noun: "the quiet fox" (every adjective and noun starts with a
   consonant, so "a" always reads) */
PDP__PRIVATE void pdp__text_noun_phrase(pdp__text_writer *w, pdp_rng *r)
{
    static const char *const det[] = {"the", "a", "one", "my", "your", "every", "this", "that"};
    static const char *const adj[] = {"small", "quick", "grey", "green", "happy", "quiet",
                                      "bright", "lazy", "clever", "brave", "young", "tired"};
    static const char *const noun[] = {"cat", "dog", "bird", "fox", "child", "farmer", "river",
                                       "garden", "teacher", "robot", "king", "ship", "baker",
                                       "wolf"};
    pdp__text_put(w, PDP__PICK(r, det));
    pdp__text_put(w, " ");
    if (pdp_rng_below(r, 2)) {
        pdp__text_put(w, PDP__PICK(r, adj));
        pdp__text_put(w, " ");
    }
    pdp__text_put(w, PDP__PICK(r, noun));
}

PDP_API pdp_status pdp_token_dataset_synthetic(pdp_token_dataset **out,
                                               const pdp_token_dataset_desc *desc)
{
    static const char fn[] = "pdp_token_dataset_synthetic";
    static const char *const verb[] = {"sees", "likes", "follows", "finds", "watches", "helps",
                                       "carries", "paints", "remembers", "visits", "calls",
                                       "hears"};
    static const char *const tail[] = {"today", "again", "slowly", "at night", "in the rain",
                                       "with care", "by the sea", "every morning"};
    pdp_token_dataset *ds;
    pdp_token_dataset_desc d;
    pdp__text_writer w;
    pdp_rng r;
    pdp_status st;
    if (!out) return pdp__err(PDP_ERR_INVALID, "%s: out is NULL", fn);
    *out = NULL;
    if ((st = pdp__token_desc_defaults(desc, &d, fn)) != PDP_OK) return st;
    d.max_tokens = PDP__DEF(d.max_tokens, PDP__TOKEN_SYNTHETIC_BYTES);
    if (!(ds = (pdp_token_dataset *)pdp__calloc(sizeof *ds)) ||
        !(ds->tokens = (uint8_t *)pdp__alloc((size_t)d.max_tokens))) {
        pdp_token_dataset_free(ds);
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory for %lld bytes of text", fn,
                        (long long)d.max_tokens);
    }
    ds->desc = d;
    w.p = ds->tokens;
    w.n = 0;
    w.cap = d.max_tokens;
    pdp_rng_seed(&r, d.seed, 0);
    while (w.n < w.cap) { /* a sentence: noun phrase, verb, noun phrase [, adverbial]. */
        w.capital = true;
        pdp__text_noun_phrase(&w, &r);
        pdp__text_put(&w, " ");
        pdp__text_put(&w, PDP__PICK(&r, verb));
        pdp__text_put(&w, " ");
        pdp__text_noun_phrase(&w, &r);
        if (pdp_rng_below(&r, 3) == 0) {
            pdp__text_put(&w, " ");
            pdp__text_put(&w, PDP__PICK(&r, tail));
        }
        pdp__text_put(&w, pdp_rng_below(&r, 4) == 0 ? ".\n" : ". ");
    }
    ds->count = w.n;
    if ((st = pdp__token_split(ds, "the synthetic text", fn)) != PDP_OK) {
        pdp_token_dataset_free(ds);
        return st;
    }
    snprintf(ds->source, sizeof ds->source, "synthetic");
    *out = ds;
    return PDP_OK;
}

#undef PDP__PICK

PDP_API void pdp_token_dataset_free(pdp_token_dataset *ds)
{
    if (!ds) return;
    pdp__dealloc(ds->tokens);
    pdp__dealloc(ds);
}

/* The split's first token and its length. */
PDP__PRIVATE void pdp__token_range(const pdp_token_dataset *ds, pdp_split split, int64_t *first,
                                   int64_t *len)
{
    *first = split == PDP_SPLIT_VAL ? ds->split_at : 0;
    *len = split == PDP_SPLIT_VAL ? ds->count - ds->split_at : ds->split_at;
}

/* Writes the T + 1 tokens from w as x[0..T) and y[0..T) (either may be NULL). */
PDP__PRIVATE void pdp__token_window(const uint8_t *w, int64_t T, int32_t *x, int32_t *y)
{
    int64_t t;
    if (x)
        for (t = 0; t < T; t++) x[t] = w[t];
    if (y)
        for (t = 0; t < T; t++) y[t] = w[t + 1];
}

PDP__PRIVATE const char *pdp__split_name(pdp_split split)
{
    return split == PDP_SPLIT_VAL ? "validation" : "training";
}

/* The checks both batch functions share. */
PDP__PRIVATE pdp_status pdp__token_batch_check(const pdp_token_dataset *ds, pdp_split split,
                                               int64_t count, const char *fn)
{
    int64_t cells;
    if (!ds) return pdp__err(PDP_ERR_INVALID, "%s: dataset is NULL", fn);
    if (split != PDP_SPLIT_TRAIN && split != PDP_SPLIT_VAL)
        return pdp__err(PDP_ERR_INVALID, "%s: split is %d (PDP_SPLIT_TRAIN or PDP_SPLIT_VAL)",
                        fn, (int)split);
    if (count < 0 || !pdp__mul_ok(count, ds->context, &cells))
        return pdp__err(PDP_ERR_INVALID, "%s: count is %lld (windows of %lld tokens)", fn,
                        (long long)count, (long long)ds->context);
    return PDP_OK;
}

PDP_API pdp_status pdp_token_dataset_batch(const pdp_token_dataset *ds, pdp_split split,
                                           const int64_t *windows, int64_t count, int32_t *x,
                                           int32_t *y)
{
    static const char fn[] = "pdp_token_dataset_batch";
    int64_t i, first, len, T;
    pdp_status st;
    if ((st = pdp__token_batch_check(ds, split, count, fn)) != PDP_OK) return st;
    if (count > 0 && !windows) return pdp__err(PDP_ERR_INVALID, "%s: windows is NULL", fn);
    for (i = 0; i < count; i++)
        if (windows[i] < 0 || windows[i] >= ds->windows[split])
            return pdp__err(PDP_ERR_INVALID, "%s: windows[%lld] = %lld is outside the %s "
                            "split's [0, %lld)", fn, (long long)i, (long long)windows[i],
                            pdp__split_name(split), (long long)ds->windows[split]);
    pdp__token_range(ds, split, &first, &len);
    T = ds->context;
    for (i = 0; i < count; i++)
        pdp__token_window(ds->tokens + first + windows[i] * T, T, x ? x + i * T : NULL,
                          y ? y + i * T : NULL);
    return PDP_OK;
}

PDP_API pdp_status pdp_token_dataset_sample(const pdp_token_dataset *ds, pdp_split split,
                                            pdp_rng *r, int64_t count, int32_t *x, int32_t *y)
{
    static const char fn[] = "pdp_token_dataset_sample";
    int64_t i, first, len, T;
    pdp_status st;
    if ((st = pdp__token_batch_check(ds, split, count, fn)) != PDP_OK) return st;
    if (!r) return pdp__err(PDP_ERR_INVALID, "%s: r is NULL", fn);
    pdp__token_range(ds, split, &first, &len);
    T = ds->context;
    if (len < T + 1)
        return pdp__err(PDP_ERR_INVALID, "%s: the %s split has %lld tokens, fewer than context "
                        "+ 1 = %lld", fn, pdp__split_name(split), (long long)len,
                        (long long)(T + 1));
    for (i = 0; i < count; i++) { /* nanoGPT: torch.randint(len(data) - block_size) */
        int64_t at = (int64_t)pdp__rng_below64(r, (uint64_t)(len - T));
        pdp__token_window(ds->tokens + first + at, T, x ? x + i * T : NULL,
                          y ? y + i * T : NULL);
    }
    return PDP_OK;
}

/* ---- evaluation ---- */

PDP_API pdp_status pdp_model_accuracy(pdp_model *m, pdp_batcher *b, double *accuracy)
{
    static const char fn[] = "pdp_model_accuracy";
    int64_t correct = 0, seen = 0, c, n;
    bool training;
    pdp_tensor x;
    const pdp_tensor *logits;
    const int32_t *y;
    pdp_status st = PDP_OK;
    if (accuracy) *accuracy = 0.0;
    if (!m || !b || !accuracy) return pdp__err(PDP_ERR_INVALID, "%s: NULL argument", fn);
    if (!b->ds->labels)
        return pdp__err(PDP_ERR_INVALID, "%s: %s is a regression set: accuracy needs class labels",
                        fn, b->ds->source);
    training = pdp_model_is_training(m);
    pdp_model_set_training(m, false);
    pdp_batcher_reset(b, 0);
    while (st == PDP_OK && pdp_batcher_next(b, &x, &y, &n)) {
        if ((st = pdp_model_forward(m, &x, &logits)) == PDP_OK &&
            (st = pdp_count_correct(logits, y, &c)) == PDP_OK) {
            correct += c;
            seen += n;
        }
    }
    pdp_model_set_training(m, training);
    if (st == PDP_OK) st = pdp_batcher_status(b); /* a failed device copy ends the epoch */
    if (st != PDP_OK) return pdp__err_wrap(st, "%s", fn);
    if (seen == 0) return pdp__err(PDP_ERR_INVALID, "%s: the batcher has no samples", fn);
    *accuracy = (double)correct / (double)seen;
    return PDP_OK;
}
