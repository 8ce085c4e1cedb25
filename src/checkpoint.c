/* checkpoint: safetensors files for a model's parameters and its optimizer
   state; the header is read by json.c's strict parser.

   Format (https://github.com/huggingface/safetensors, "Format"): 8 bytes
   little-endian u64 N, then N bytes of JSON, then the data (json.c checks the
   JSON and the tiling of the data section).

   Invariants. Save never exposes a half-written file: it writes
   "<path>.tmp.<pid>", fflush + fsync, rename over path, fsync the directory.
   Load never half-applies a file: it reads the header (at most
   PDP__CKPT_MAX_HEADER bytes, and no more than the file holds), parses and
   validates every entry, reads every expected tensor into one staging buffer,
   and only then copies into the model and the optimizer.

   Ranges (ZeRO): pdp__checkpoint_save_range writes one rank's range [lo, hi)
   of the flat block as a shard file: flat F32 tensors "params" and
   "optim.<state>" ([hi - lo] each, either may be left out), __metadata__
   "format": "pdp-shard", "shard.lo", "shard.hi", "shard.count" (the model's
   parameter count) and the same model and optimizer keys as a full file.
   pdp__checkpoint_load_range reads a shard file of exactly that range, or the
   slice [lo, hi) of a full checkpoint (every tensor still checked). The public
   load refuses a shard file; the public save and load refuse a range
   optimizer. */

#include "internal.h"
#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#ifndef PDP__CKPT_MAX_HEADER
#  define PDP__CKPT_MAX_HEADER ((uint64_t)100 * 1000 * 1000) /* bytes */
#endif

static bool pdp__little_endian(void)
{
    const uint32_t one = 1;
    unsigned char b;
    memcpy(&b, &one, 1);
    return b == 1;
}

static void pdp__bswap32(void *data, int64_t count)
{
    unsigned char *p = (unsigned char *)data, t;
    int64_t i;
    for (i = 0; i < count; i++, p += 4) {
        t = p[0]; p[0] = p[3]; p[3] = t;
        t = p[1]; p[1] = p[2]; p[2] = t;
    }
}

/* ---- checkpoint: save ---- */

/* Appends printf output to a bounded buffer; *ok turns false on overflow. */
static void pdp__ckpt_put(char *buf, size_t cap, size_t *len, bool *ok, const char *fmt, ...)
{
    va_list ap;
    int n;
    if (!*ok) return;
    va_start(ap, fmt);
    n = vsnprintf(buf + *len, cap - *len, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= cap - *len) *ok = false;
    else *len += (size_t)n;
}

/* The header JSON, padded with spaces to a multiple of 8 bytes. Parameter names
   are "<layer>.<weight|bias>": nothing in them needs escaping. shard: a shard
   file of [lo, hi) (flat "params" when with_params, flat "optim.<state>");
   otherwise every parameter and state tensor of the model (with_params is
   then true, lo = 0, hi = param_count). */
static pdp_status pdp__ckpt_header(const pdp_model *m, const pdp_optim *o, bool with_params,
                                   int64_t lo, int64_t hi, bool shard, char **out, size_t *len)
{
    size_t cap = 2048 + (size_t)m->nparams * (1 + (o ? (size_t)o->nstate : 0)) * 320, n = 0;
    char *h = (char *)pdp__alloc(cap);
    bool ok = true;
    uint64_t at = 0;
    int k, i, d;
    if (!h) return pdp__err(PDP_ERR_OUT_OF_MEMORY, "no memory for the header");
    pdp__ckpt_put(h, cap, &n, &ok,
                  "{\"__metadata__\":{\"format\":\"%s\",\"pdp_version\":\"%s\","
                  "\"model.seed\":\"%llu\",\"model.step\":\"%llu\"",
                  shard ? "pdp-shard" : "pdp", PDP_VERSION_STRING, (unsigned long long)m->seed,
                  (unsigned long long)m->step);
    if (shard)
        pdp__ckpt_put(h, cap, &n, &ok, ",\"shard.lo\":\"%lld\",\"shard.hi\":\"%lld\","
                      "\"shard.count\":\"%lld\"", (long long)lo, (long long)hi,
                      (long long)m->param_count);
    if (o) {
        const pdp_optim_desc *dd = &o->desc;
        pdp__ckpt_put(h, cap, &n, &ok,
                      ",\"optim.kind\":\"%s\",\"optim.steps\":\"%lld\",\"optim.lr\":\"%.9g\","
                      "\"optim.momentum\":\"%.9g\",\"optim.dampening\":\"%.9g\","
                      "\"optim.nesterov\":\"%s\",\"optim.weight_decay\":\"%.9g\","
                      "\"optim.beta1\":\"%.9g\",\"optim.beta2\":\"%.9g\",\"optim.eps\":\"%.9g\"",
                      pdp_optim_kind_name(dd->kind), (long long)o->steps, (double)dd->lr,
                      (double)dd->momentum, (double)dd->dampening, dd->nesterov ? "true" : "false",
                      (double)dd->weight_decay, (double)dd->beta1, (double)dd->beta2,
                      (double)dd->eps);
    }
    pdp__ckpt_put(h, cap, &n, &ok, "}");
    for (k = shard && !with_params ? 0 : -1; shard && k < (o ? o->nstate : 0); k++) {
        if (k < 0)
            pdp__ckpt_put(h, cap, &n, &ok, ",\"params\":{\"dtype\":\"F32\",\"shape\":[%lld],",
                          (long long)(hi - lo));
        else
            pdp__ckpt_put(h, cap, &n, &ok, ",\"optim.%s\":{\"dtype\":\"F32\",\"shape\":[%lld],",
                          pdp__optim_state_name(o, k), (long long)(hi - lo));
        pdp__ckpt_put(h, cap, &n, &ok, "\"data_offsets\":[%llu,%llu]}", (unsigned long long)at,
                      (unsigned long long)(at + (uint64_t)(hi - lo) * 4));
        at += (uint64_t)(hi - lo) * 4;
    }
    for (k = -1; !shard && k < (o ? o->nstate : 0); k++) {
        for (i = 0; i < m->nparams; i++) {
            const pdp__param_entry *e = &m->params[i];
            if (k < 0)
                pdp__ckpt_put(h, cap, &n, &ok, ",\"%s\":{\"dtype\":\"F32\",\"shape\":[", e->name);
            else
                pdp__ckpt_put(h, cap, &n, &ok, ",\"optim.%s.%s\":{\"dtype\":\"F32\",\"shape\":[",
                              e->name, pdp__optim_state_name(o, k));
            for (d = 0; d < e->ndim; d++)
                pdp__ckpt_put(h, cap, &n, &ok, "%s%lld", d ? "," : "", (long long)e->shape[d]);
            pdp__ckpt_put(h, cap, &n, &ok, "],\"data_offsets\":[%llu,%llu]}",
                          (unsigned long long)at,
                          (unsigned long long)(at + (uint64_t)e->count * 4));
            at += (uint64_t)e->count * 4;
        }
    }
    pdp__ckpt_put(h, cap, &n, &ok, "}");
    while (ok && n % 8) pdp__ckpt_put(h, cap, &n, &ok, " ");
    if (!ok) {
        pdp__dealloc(h);
        return pdp__err(PDP_ERR_INVALID, "header longer than %zu bytes", cap);
    }
    *out = h;
    *len = n;
    return PDP_OK;
}

/* Writes count floats from dev memory, staging through host (when the data is
   not on the CPU or the host is big-endian). */
static bool pdp__ckpt_write_floats(FILE *f, pdp_device dev, const float *data, int64_t count,
                                   float *host)
{
    if (!count) return true;
    if (dev.kind == PDP_DEVICE_CPU && !host)
        return fwrite(data, 4, (size_t)count, f) == (size_t)count;
    if (pdp__dev_copy(pdp_cpu(), host, dev, data, (size_t)count * 4) != PDP_OK) return false;
    if (!pdp__little_endian()) pdp__bswap32(host, count);
    return fwrite(host, 4, (size_t)count, f) == (size_t)count;
}

/* fsyncs the directory holding path, so the rename itself is durable. */
static int pdp__ckpt_sync_dir(const char *path)
{
    char dir[4096];
    const char *slash = strrchr(path, '/');
    size_t n;
    int fd, rc;
    if (!slash) {
        strcpy(dir, ".");
    } else {
        n = (size_t)(slash - path);
        if (n == 0) n = 1; /* "/file" */
        if (n >= sizeof dir) return 0;
        memcpy(dir, path, n);
        dir[n] = '\0';
    }
    fd = open(dir, O_RDONLY);
    if (fd < 0) return -1;
    rc = fsync(fd);
    if (rc != 0 && (errno == EINVAL || errno == EROFS)) rc = 0; /* not supported there */
    close(fd);
    return rc;
}

/* Writes the parameters [lo, hi) (params holds them; skipped unless
   with_params) and o's state for [lo, hi) (o may be NULL) as a full
   checkpoint (shard false: lo = 0, hi = param_count) or a shard file. */
static pdp_status pdp__ckpt_save(const char *path, const pdp_model *m, const float *params,
                                 bool with_params, const pdp_optim *o, int64_t lo, int64_t hi,
                                 bool shard, const char *fn)
{
    char *header = NULL, *tmp = NULL;
    unsigned char len8[8];
    size_t hlen = 0, tmp_bytes;
    float *host = NULL;
    FILE *f = NULL;
    const char *failed = NULL;
    int k, err = 0;
    pdp_status st;
    if ((st = pdp__ckpt_header(m, o, with_params, lo, hi, shard, &header, &hlen)) != PDP_OK)
        return pdp__err_wrap(st, "%s: %s", fn, path);
    if (m->device.kind != PDP_DEVICE_CPU || !pdp__little_endian()) {
        host = (float *)pdp__alloc((size_t)PDP__MAX(1, hi - lo) * 4);
        if (!host) {
            pdp__dealloc(header);
            return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: %s: no staging memory", fn, path);
        }
    }
    tmp_bytes = strlen(path) + 32;
    tmp = (char *)pdp__alloc(tmp_bytes);
    if (!tmp) {
        pdp__dealloc(header);
        pdp__dealloc(host);
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: %s: no memory", fn, path);
    }
    snprintf(tmp, tmp_bytes, "%s.tmp.%ld", path, (long)getpid());
    for (k = 0; k < 8; k++) len8[k] = (unsigned char)((uint64_t)hlen >> (8 * k));

    if (!(f = fopen(tmp, "wb"))) {
        failed = "fopen";
        goto io_error;
    }
    if (fwrite(len8, 1, 8, f) != 8 || fwrite(header, 1, hlen, f) != hlen ||
        (with_params && !pdp__ckpt_write_floats(f, m->device, params, hi - lo, host))) {
        failed = "write";
        goto io_error;
    }
    for (k = 0; o && k < o->nstate; k++)
        if (!pdp__ckpt_write_floats(f, m->device, o->state[k] + (lo - o->lo), hi - lo, host)) {
            failed = "write";
            goto io_error;
        }
    if (fflush(f) != 0) {
        failed = "fflush";
        goto io_error;
    }
    if (fsync(fileno(f)) != 0) {
        failed = "fsync";
        goto io_error;
    }
    k = fclose(f);
    f = NULL;
    if (k != 0) {
        failed = "fclose";
        goto io_error;
    }
    if (rename(tmp, path) != 0) {
        failed = "rename";
        goto io_error;
    }
    pdp__dealloc(header);
    pdp__dealloc(host);
    pdp__dealloc(tmp);
    if (pdp__ckpt_sync_dir(path) != 0)
        return pdp__err(PDP_ERR_IO, "%s: %s: written, but fsync of its directory failed: %s", fn,
                        path, strerror(errno));
    return PDP_OK;
io_error:
    err = errno;
    if (f) fclose(f);
    remove(tmp);
    st = pdp__err(PDP_ERR_IO, "%s: %s: %s of %s failed: %s (the previous file, if any, is "
                  "unchanged)", fn, path, failed, tmp, err ? strerror(err) : "short write");
    pdp__dealloc(header);
    pdp__dealloc(host);
    pdp__dealloc(tmp);
    return st;
}

PDP_API pdp_status pdp_checkpoint_save(const char *path, const pdp_model *m, const pdp_optim *o)
{
    const char *fn = "pdp_checkpoint_save";
    if (!path || !m) return pdp__err(PDP_ERR_INVALID, "%s: NULL argument", fn);
    if (o && o->count != m->param_count)
        return pdp__err(PDP_ERR_SHAPE, "%s: %s: the optimizer holds state for %lld parameters, "
                        "the model has %lld", fn, path, (long long)o->count,
                        (long long)m->param_count);
    if (o && !pdp__optim_is_full(o))
        return pdp__err(PDP_ERR_STATE, "%s: %s: the optimizer holds state for [%lld, %lld) of "
                        "the %lld parameters only (a ZeRO shard)", fn, path, (long long)o->lo,
                        (long long)o->hi, (long long)o->count);
    return pdp__ckpt_save(path, m, m->param_block, true, o, 0, m->param_count, false, fn);
}

/* Checks a range call's arguments: [lo, hi) inside the model, o's range
   containing it, something to save or load. */
static pdp_status pdp__ckpt_range_args(const char *path, const pdp_model *m, const float *params,
                                       const pdp_optim *o, int64_t lo, int64_t hi, const char *fn)
{
    if (!path || !m) return pdp__err(PDP_ERR_INVALID, "%s: NULL argument", fn);
    if (!params && !o)
        return pdp__err(PDP_ERR_INVALID, "%s: %s: neither parameters nor an optimizer", fn, path);
    if (!(0 <= lo && lo <= hi && hi <= m->param_count))
        return pdp__err(PDP_ERR_INVALID, "%s: %s: range [%lld, %lld) is not inside the model's "
                        "%lld parameters", fn, path, (long long)lo, (long long)hi,
                        (long long)m->param_count);
    if (o && (o->count != m->param_count || lo < o->lo || hi > o->hi))
        return pdp__err(PDP_ERR_SHAPE, "%s: %s: the optimizer holds state for [%lld, %lld) of "
                        "%lld parameters, not for [%lld, %lld) of %lld", fn, path,
                        (long long)o->lo, (long long)o->hi, (long long)o->count, (long long)lo,
                        (long long)hi, (long long)m->param_count);
    return PDP_OK;
}

static pdp_status pdp__checkpoint_save_range(const char *path, const pdp_model *m,
                                             const float *params, const pdp_optim *o,
                                             int64_t lo, int64_t hi, const char *fn)
{
    pdp_status st = pdp__ckpt_range_args(path, m, params, o, lo, hi, fn);
    if (st != PDP_OK) return st;
    return pdp__ckpt_save(path, m, params, params != NULL, o, lo, hi, true, fn);
}

/* ---- checkpoint: load ---- */

/* A float from a metadata string ("%.9g" on save); false when absent or bad. */
static bool pdp__ckpt_meta_float(const pdp__st_parser *p, const char *key, float *out)
{
    const char *s = pdp__st_meta(p, key);
    char *end;
    double v;
    if (!s || !*s) return false;
    v = strtod(s, &end);
    if (*end || !isfinite(v) || fabs(v) > FLT_MAX) return false;
    *out = (float)v;
    return true;
}

/* The optimizer part of the metadata: o's kind, steps and hyper-parameters. */
static pdp_status pdp__ckpt_read_optim(const pdp__st_parser *p, const pdp_optim *o,
                                       pdp_optim_desc *desc, int64_t *steps)
{
    const char *fn = p->fn, *kind = pdp__st_meta(p, "optim.kind");
    const char *s = pdp__st_meta(p, "optim.steps"), *nest = pdp__st_meta(p, "optim.nesterov");
    static const char *const keys[] = {"optim.lr", "optim.momentum", "optim.dampening",
                                       "optim.weight_decay", "optim.beta1", "optim.beta2",
                                       "optim.eps"};
    float *fields[7];
    pdp_optim_desc d, resolved;
    char *end;
    long long n;
    int i;
    pdp_status st;
    if (!kind)
        return pdp__err(PDP_ERR_FORMAT, "%s: %s: no optimizer state in the file (no \"optim.kind\" "
                        "in __metadata__)", fn, p->file);
    if (strcmp(kind, pdp_optim_kind_name(o->desc.kind)) != 0)
        return pdp__err(PDP_ERR_FORMAT, "%s: %s: the file holds %s state, the optimizer is %s", fn,
                        p->file, kind, pdp_optim_kind_name(o->desc.kind));
    d = o->desc;
    fields[0] = &d.lr; fields[1] = &d.momentum; fields[2] = &d.dampening;
    fields[3] = &d.weight_decay; fields[4] = &d.beta1; fields[5] = &d.beta2; fields[6] = &d.eps;
    for (i = 0; i < 7; i++)
        if (!pdp__ckpt_meta_float(p, keys[i], fields[i]))
            return pdp__err(PDP_ERR_FORMAT, "%s: %s: __metadata__ \"%s\" is missing or not a "
                            "finite number", fn, p->file, keys[i]);
    if (!nest || (strcmp(nest, "true") != 0 && strcmp(nest, "false") != 0))
        return pdp__err(PDP_ERR_FORMAT, "%s: %s: __metadata__ \"optim.nesterov\" must be \"true\" "
                        "or \"false\"", fn, p->file);
    d.nesterov = strcmp(nest, "true") == 0;
    errno = 0;
    n = s ? strtoll(s, &end, 10) : -1;
    if (!s || !*s || *end || errno || n < 0)
        return pdp__err(PDP_ERR_FORMAT, "%s: %s: __metadata__ \"optim.steps\" is missing or not a "
                        "count", fn, p->file);
    if ((st = pdp__optim_desc_resolve(&d, &resolved, fn)) != PDP_OK)
        return pdp__err_wrap(PDP_ERR_FORMAT, "%s: __metadata__", p->file);
    if (pdp__optim_nstate(&resolved) != o->nstate)
        return pdp__err(PDP_ERR_FORMAT, "%s: %s: the file's %s (momentum %g) keeps %d state "
                        "tensors per parameter, the optimizer %d", fn, p->file, kind,
                        (double)d.momentum, pdp__optim_nstate(&resolved), o->nstate);
    resolved.lr = d.lr; /* 0 is a valid learning rate (e.g. the end of a schedule) */
    *desc = resolved;
    *steps = (int64_t)n;
    return PDP_OK;
}

/* An optional unsigned metadata count ("model.seed", "model.step"): *present
   tells whether the key exists; false when it exists but is not a count. */
static bool pdp__ckpt_meta_u64(const pdp__st_parser *p, const char *key, uint64_t *out,
                               bool *present)
{
    const char *s = pdp__st_meta(p, key);
    char *end;
    unsigned long long v;
    *present = s != NULL;
    if (!s) return true;
    if (*s < '0' || *s > '9') return false;
    errno = 0;
    v = strtoull(s, &end, 10);
    if (*end || errno) return false;
    *out = (uint64_t)v;
    return true;
}

/* Whether a tensor name of the file is one load expects (or may ignore). */
static bool pdp__ckpt_expected(const pdp_model *m, const pdp_optim *o, const char *name)
{
    int i, k;
    size_t len;
    if (strncmp(name, "optim.", 6) == 0) {
        if (!o) return true; /* ignored */
        name += 6;
        for (i = 0; i < m->nparams; i++) {
            len = strlen(m->params[i].name);
            if (strncmp(name, m->params[i].name, len) != 0 || name[len] != '.') continue;
            for (k = 0; k < o->nstate; k++)
                if (strcmp(name + len + 1, pdp__optim_state_name(o, k)) == 0) return true;
        }
        return false;
    }
    for (i = 0; i < m->nparams; i++)
        if (strcmp(name, m->params[i].name) == 0) return true;
    return false;
}

static void pdp__shape_text(char *buf, size_t cap, int ndim, const int64_t *shape)
{
    size_t n = 0;
    int d;
    n += (size_t)snprintf(buf, cap, "[");
    for (d = 0; d < ndim && n < cap; d++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

/* Reads elements [first, first + count) of tensor e of the file f (data at
   data_start) into dst. */
static pdp_status pdp__ckpt_read_tensor(FILE *f, const char *fn, const char *file,
                                        uint64_t data_start, const pdp__st_entry *e,
                                        int64_t first, float *dst, int64_t count)
{
    uint64_t at = data_start + e->begin + (uint64_t)first * 4;
    if (at > (uint64_t)LONG_MAX || fseek(f, (long)at, SEEK_SET) != 0 ||
        fread(dst, 4, (size_t)count, f) != (size_t)count)
        return pdp__err(PDP_ERR_IO, "%s: %s: tensor \"%s\": read failed (%s)", fn, file, e->name,
                        ferror(f) ? strerror(errno) : "file shorter than its header");
    if (!pdp__little_endian()) pdp__bswap32(dst, count);
    return PDP_OK;
}

/* Whether a tensor name of a shard file is one load expects (or may ignore). */
static bool pdp__ckpt_shard_expected(const pdp_optim *o, const char *name)
{
    int k;
    if (strcmp(name, "params") == 0) return true; /* ignored when not loading parameters */
    if (strncmp(name, "optim.", 6) != 0) return false;
    if (!o) return true; /* ignored */
    for (k = 0; k < o->nstate; k++)
        if (strcmp(name + 6, pdp__optim_state_name(o, k)) == 0) return true;
    return false;
}

/* Loads the parameters [lo, hi) into params (when with_params) and o's state
   for [lo, hi) (o may be NULL) from a full checkpoint (its slice) or, when
   allow_shard, from a shard file of exactly [lo, hi). */
static pdp_status pdp__ckpt_load(const char *path, pdp_model *m, float *params, bool with_params,
                                 pdp_optim *o, int64_t lo, int64_t hi, bool allow_shard,
                                 const char *fn)
{
    pdp__st_parser p;
    pdp__st_entry **sorted = NULL;
    unsigned char len8[8];
    uint64_t hlen = 0, file_bytes, data_start;
    float *staging = NULL;
    char *header = NULL, name[96], a[128], b[128];
    pdp_optim_desc desc;
    int64_t steps = 0, count;
    uint64_t seed = 0, mstep = 0;
    bool have_seed = false, have_step = false;
    struct stat sb;
    const char *format;
    bool shard;
    FILE *f;
    int i, k, nstate;
    pdp_status st = PDP_OK;

    memset(&p, 0, sizeof p);
    memset(&desc, 0, sizeof desc);
    count = hi - lo;
    nstate = o ? o->nstate : 0;
    if (!(f = fopen(path, "rb")))
        return pdp__err(PDP_ERR_IO, "%s: %s: %s", fn, path, strerror(errno));
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        fclose(f);
        return pdp__err(PDP_ERR_IO, "%s: %s: not a regular file", fn, path);
    }
    file_bytes = (uint64_t)sb.st_size;
    if (file_bytes < 8 || fread(len8, 1, 8, f) != 8) {
        st = pdp__err(PDP_ERR_FORMAT, "%s: %s: %llu bytes, shorter than the 8-byte header length",
                      fn, path, (unsigned long long)file_bytes);
        goto done;
    }
    for (k = 7; k >= 0; k--) hlen = (hlen << 8) | len8[k];
    if (hlen < 2 || hlen > PDP__CKPT_MAX_HEADER || hlen > file_bytes - 8) {
        st = pdp__err(PDP_ERR_FORMAT, "%s: %s: header length %llu is impossible (file %llu bytes, "
                      "limit %llu): not a safetensors file, or truncated", fn, path,
                      (unsigned long long)hlen, (unsigned long long)file_bytes,
                      (unsigned long long)PDP__CKPT_MAX_HEADER);
        goto done;
    }
    data_start = 8 + hlen;
    header = (char *)pdp__alloc((size_t)hlen);
    if (!header) {
        st = pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: %s: no memory for the header", fn, path);
        goto done;
    }
    if (fread(header, 1, (size_t)hlen, f) != (size_t)hlen) {
        st = pdp__err(PDP_ERR_IO, "%s: %s: reading the header failed", fn, path);
        goto done;
    }
    p.s = header;
    p.n = (size_t)hlen;
    p.file = path;
    p.fn = fn;
    if ((st = pdp__st_parse(&p)) != PDP_OK) goto done;
    sorted = (pdp__st_entry **)pdp__alloc((size_t)PDP__MAX(1, p.nentries) * sizeof *sorted);
    if (!sorted) {
        st = pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: %s: no memory", fn, path);
        goto done;
    }
    if ((st = pdp__st_validate(&p, file_bytes - data_start, sorted)) != PDP_OK) goto done;
    if (o && (st = pdp__ckpt_read_optim(&p, o, &desc, &steps)) != PDP_OK) goto done;
    if (!pdp__ckpt_meta_u64(&p, "model.seed", &seed, &have_seed) ||
        !pdp__ckpt_meta_u64(&p, "model.step", &mstep, &have_step)) {
        st = pdp__err(PDP_ERR_FORMAT, "%s: %s: __metadata__ \"model.seed\" or \"model.step\" is "
                      "not a count", fn, path);
        goto done;
    }
    format = pdp__st_meta(&p, "format");
    shard = format && strcmp(format, "pdp-shard") == 0;
    if (shard && !allow_shard) {
        st = pdp__err(PDP_ERR_FORMAT, "%s: %s: a shard file (one rank's range of a ZeRO run), "
                      "not a checkpoint of the whole model", fn, path);
        goto done;
    }
    if (shard) {
        uint64_t slo = 0, shi = 0, scount = 0;
        bool have[3];
        if (!pdp__ckpt_meta_u64(&p, "shard.lo", &slo, &have[0]) ||
            !pdp__ckpt_meta_u64(&p, "shard.hi", &shi, &have[1]) ||
            !pdp__ckpt_meta_u64(&p, "shard.count", &scount, &have[2]) || !have[0] || !have[1] ||
            !have[2]) {
            st = pdp__err(PDP_ERR_FORMAT, "%s: %s: __metadata__ \"shard.lo\", \"shard.hi\" or "
                          "\"shard.count\" is missing or not a count", fn, path);
            goto done;
        }
        if (slo != (uint64_t)lo || shi != (uint64_t)hi || scount != (uint64_t)m->param_count) {
            st = pdp__err(PDP_ERR_SHAPE, "%s: %s: the file holds [%llu, %llu) of %llu parameters, "
                          "this rank loads [%lld, %lld) of %lld", fn, path,
                          (unsigned long long)slo, (unsigned long long)shi,
                          (unsigned long long)scount, (long long)lo, (long long)hi,
                          (long long)m->param_count);
            goto done;
        }
    }

    /* every expected tensor: present, F32, same shape */
    staging = (float *)pdp__alloc((size_t)PDP__MAX(1, count * (1 + nstate)) * sizeof(float));
    if (!staging) {
        st = pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: %s: no memory to stage %lld floats", fn, path,
                      (long long)(count * (1 + nstate)));
        goto done;
    }
    for (k = with_params ? -1 : 0; shard && k < nstate; k++) {
        const pdp__st_entry *e;
        if (k < 0) snprintf(name, sizeof name, "params");
        else snprintf(name, sizeof name, "optim.%s", pdp__optim_state_name(o, k));
        if (!(e = pdp__st_find(sorted, p.nentries, name))) {
            st = pdp__err(PDP_ERR_SHAPE, "%s: %s: tensor \"%s\" is missing", fn, path, name);
            goto done;
        }
        if (strcmp(e->dtype, "F32") != 0 || e->ndim != 1 || e->shape[0] != count) {
            pdp__shape_text(a, sizeof a, e->ndim, e->shape);
            st = pdp__err(PDP_ERR_SHAPE, "%s: %s: tensor \"%s\" is %s %s, expected F32 [%lld]", fn,
                          path, name, e->dtype, a, (long long)count);
            goto done;
        }
        if ((st = pdp__ckpt_read_tensor(f, fn, path, data_start, e, 0, staging + (k + 1) * count,
                                        count)) != PDP_OK)
            goto done;
    }
    for (k = with_params ? -1 : 0; !shard && k < nstate; k++) {
        for (i = 0; i < m->nparams; i++) {
            const pdp__param_entry *pe = &m->params[i];
            const pdp__st_entry *e;
            int64_t from = PDP__MAX(lo, pe->offset), to = PDP__MIN(hi, pe->offset + pe->count);
            bool same = true;
            int d;
            if (k < 0) snprintf(name, sizeof name, "%s", pe->name);
            else snprintf(name, sizeof name, "optim.%s.%s", pe->name, pdp__optim_state_name(o, k));
            if (!(e = pdp__st_find(sorted, p.nentries, name))) {
                st = pdp__err(PDP_ERR_SHAPE, "%s: %s: tensor \"%s\" is missing", fn, path, name);
                goto done;
            }
            if (strcmp(e->dtype, "F32") != 0) {
                st = pdp__err(PDP_ERR_FORMAT, "%s: %s: tensor \"%s\" is %s, expected F32", fn,
                              path, name, e->dtype);
                goto done;
            }
            same = e->ndim == pe->ndim;
            for (d = 0; same && d < pe->ndim; d++) same = e->shape[d] == pe->shape[d];
            if (!same) {
                pdp__shape_text(a, sizeof a, e->ndim, e->shape);
                pdp__shape_text(b, sizeof b, pe->ndim, pe->shape);
                st = pdp__err(PDP_ERR_SHAPE, "%s: %s: tensor \"%s\" has shape %s in the file, "
                              "the model's is %s", fn, path, name, a, b);
                goto done;
            }
            if (from < to &&
                (st = pdp__ckpt_read_tensor(f, fn, path, data_start, e, from - pe->offset,
                                            staging + (k + 1) * count + (from - lo), to - from)) !=
                    PDP_OK)
                goto done;
        }
    }
    for (i = 0; i < p.nentries; i++)
        if (shard ? !pdp__ckpt_shard_expected(o, p.entries[i].name)
                  : !pdp__ckpt_expected(m, o, p.entries[i].name)) {
            st = pdp__err(PDP_ERR_SHAPE, "%s: %s: tensor \"%s\" is not in the %s", fn, path,
                          p.entries[i].name,
                          strncmp(p.entries[i].name, "optim.", 6) == 0 ? "optimizer's state"
                                                                       : "model");
            goto done;
        }

    /* all checks passed: apply */
    if (with_params && count &&
        (st = pdp__dev_copy(m->device, params, pdp_cpu(), staging, (size_t)count * 4)) != PDP_OK) {
        st = pdp__err_wrap(st, "%s: %s: copying the parameters to the device failed; they "
                           "may be partly loaded", fn, path);
        goto done;
    }
    if (with_params && have_seed) m->seed = seed; /* the dropout stream, for an exact resume */
    if (with_params && have_step) m->step = mstep;
    if (o) {
        for (k = 0; k < nstate; k++)
            if (count && (st = pdp__dev_copy(m->device, o->state[k] + (lo - o->lo), pdp_cpu(),
                                             staging + (k + 1) * count, (size_t)count * 4)) !=
                             PDP_OK) {
                st = pdp__err_wrap(st, "%s: %s: copying the optimizer state to the device "
                                   "failed; the parameters are loaded, the state may be partly "
                                   "loaded", fn, path);
                goto done;
            }
        o->desc = desc;
        o->steps = steps;
    }
done:
    fclose(f);
    pdp__st_parser_free(&p);
    pdp__dealloc(header);
    pdp__dealloc(sorted);
    pdp__dealloc(staging);
    return st;
}

PDP_API pdp_status pdp_checkpoint_load(const char *path, pdp_model *m, pdp_optim *o)
{
    const char *fn = "pdp_checkpoint_load";
    if (!path || !m) return pdp__err(PDP_ERR_INVALID, "%s: NULL argument", fn);
    if (o && o->count != m->param_count)
        return pdp__err(PDP_ERR_SHAPE, "%s: %s: the optimizer holds state for %lld parameters, "
                        "the model has %lld", fn, path, (long long)o->count,
                        (long long)m->param_count);
    if (o && !pdp__optim_is_full(o))
        return pdp__err(PDP_ERR_STATE, "%s: %s: the optimizer holds state for [%lld, %lld) of "
                        "the %lld parameters only (a ZeRO shard)", fn, path, (long long)o->lo,
                        (long long)o->hi, (long long)o->count);
    return pdp__ckpt_load(path, m, m->param_block, true, o, 0, m->param_count, false, fn);
}

static pdp_status pdp__checkpoint_load_range(const char *path, pdp_model *m, float *params,
                                             pdp_optim *o, int64_t lo, int64_t hi,
                                             const char *fn)
{
    pdp_status st = pdp__ckpt_range_args(path, m, params, o, lo, hi, fn);
    if (st != PDP_OK) return st;
    return pdp__ckpt_load(path, m, params, params != NULL, o, lo, hi, true, fn);
}
