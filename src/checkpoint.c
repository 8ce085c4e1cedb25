/* checkpoint: safetensors files for a model's parameters and its optimizer
   state; the header is read by json.c's strict parser.

   Format (https://github.com/huggingface/safetensors, "Format"): 8 bytes
   little-endian u64 N, then N bytes of JSON, then the data (json.c checks the
   JSON and the tiling of the data section).

   Invariants. Save never exposes a half-written file: it writes
   "<path>.tmp.<pid>.<thread>", flush and sync it, rename it over path, sync the directory
   (platform.h: fsync and rename on POSIX; FlushFileBuffers and MoveFileExA with
   MOVEFILE_REPLACE_EXISTING | MOVEFILE_WRITE_THROUGH on Win32);
   first it removes the temporaries of path whose pid is no live process (a
   writer killed mid-save), never a live writer's.
   Load never half-applies a file: it reads the header (at most
   PDP__CKPT_MAX_HEADER bytes, and no more than the file holds), parses and
   validates every entry, reads every expected tensor into one staging buffer,
   and only then copies into the model and the optimizer (pdp__ckpt_load's
   steps, under "checkpoint: load, step by step"). The extra tensors a nanoGPT
   file may hold (checkpoint.h) are checked there too, before the commit: the
   tied head's alias "lm_head.weight" against the parameter it names, the
   "<prefix>.attn.bias" causal masks element by element; both are streamed through
   a 64 KB chunk, so they cost no memory of their size.

   Checksums (safetensors has none): __metadata__ "crc32c.<tensor>" is the
   CRC-32C of the tensor's data bytes as stored, "crc32c.header" that of the
   header's parsed content (pdp__ckpt_header_crc says exactly what), so a file
   Python rewrote with our metadata still verifies. Save writes the header with
   placeholder digits, streams the data computing each tensor's CRC, then
   rewrites the sealed header in place (same length: 8 digits each). Load
   verifies a file that has any "crc32c.*" key completely (all keys present,
   the header, every tensor it reads, whole) and loads one without any
   unverified: other tools write no checksums.

   Ranges (ZeRO): pdp__checkpoint_save_range writes one rank's range [lo, hi)
   of the flat block as a shard file: flat F32 tensors "params" and
   "optim.<state>" ([hi - lo] each, either may be left out), __metadata__
   "format": "pdp-shard", "shard.lo", "shard.hi", "shard.count" (the model's
   parameter count), "shard.run" when the caller names the save it belongs to
   (pdp__checkpoint_save_run: 16 hex digits, every shard of one ZeRO save and
   its marker carry the same) and the same model and optimizer keys as a full
   file. pdp__checkpoint_load_range reads a shard file of exactly that range, or
   the slice [lo, hi) of a full checkpoint (every tensor still checked; the ones
   the slice touches are read whole to verify their checksums);
   pdp__checkpoint_load_run reads only a shard file of that range and that run.
   The public load refuses a shard file; the public save and load refuse a range
   optimizer. */

#include "internal.h"
#include <limits.h>

#ifndef PDP__CKPT_MAX_HEADER
#  define PDP__CKPT_MAX_HEADER ((uint64_t)100 * 1000 * 1000) /* bytes */
#endif

PDP__PRIVATE bool pdp__little_endian(void)
{
    const uint32_t one = 1;
    unsigned char b;
    memcpy(&b, &one, 1);
    return b == 1;
}

PDP__PRIVATE void pdp__bswap32(void *data, int64_t count)
{
    unsigned char *p = (unsigned char *)data, t;
    int64_t i;
    for (i = 0; i < count; i++, p += 4) {
        t = p[0]; p[0] = p[3]; p[3] = t;
        t = p[1]; p[1] = p[2]; p[2] = t;
    }
}

/* ---- checkpoint: checksums ---- */

/* CRC-32C (Castagnoli: polynomial 0x1EDC6F41, reflected 0x82F63B78, initial
   value and final xor 0xffffffff; "123456789" gives e3069283), computed by
   slicing by 8: eight 256-entry tables, built once per save or load. */
typedef struct pdp__crc32c {
    uint32_t t[8][256];
} pdp__crc32c;

PDP__PRIVATE void pdp__crc32c_init(pdp__crc32c *c)
{
    uint32_t i, v;
    int j, k;
    for (i = 0; i < 256; i++) {
        v = i;
        for (j = 0; j < 8; j++) v = (v >> 1) ^ (0x82F63B78u & (0u - (v & 1u)));
        c->t[0][i] = v;
    }
    for (k = 1; k < 8; k++)
        for (i = 0; i < 256; i++)
            c->t[k][i] = (c->t[k - 1][i] >> 8) ^ c->t[0][c->t[k - 1][i] & 0xff];
}

/* crc continued over bytes (start with 0). */
PDP__PRIVATE uint32_t pdp__crc32c_update(const pdp__crc32c *c, uint32_t crc, const void *data,
                                         size_t bytes)
{
    const unsigned char *p = (const unsigned char *)data;
    crc = ~crc;
    for (; bytes >= 8; p += 8, bytes -= 8) {
        uint32_t a = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                            (uint32_t)p[3] << 24);
        uint32_t b = (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 |
                     (uint32_t)p[7] << 24;
        crc = c->t[7][a & 0xff] ^ c->t[6][(a >> 8) & 0xff] ^ c->t[5][(a >> 16) & 0xff] ^
              c->t[4][a >> 24] ^ c->t[3][b & 0xff] ^ c->t[2][(b >> 8) & 0xff] ^
              c->t[1][(b >> 16) & 0xff] ^ c->t[0][b >> 24];
    }
    for (; bytes; p++, bytes--) crc = (crc >> 8) ^ c->t[0][(crc ^ *p) & 0xff];
    return ~crc;
}

/* The 8 lowercase hex digits of v (no NUL). */
PDP__PRIVATE void pdp__ckpt_hex8(char *dst, uint32_t v)
{
    static const char digits[] = "0123456789abcdef";
    int i;
    for (i = 0; i < 8; i++) dst[i] = digits[(v >> (28 - 4 * i)) & 15];
}

/* Exactly 8 lowercase hex digits: a flipped case is corruption, not the same value. */
PDP__PRIVATE bool pdp__ckpt_unhex8(const char *s, uint32_t *out)
{
    uint32_t v = 0;
    int i;
    for (i = 0; i < 8; i++) {
        char c = s[i];
        if (c >= '0' && c <= '9') v = v << 4 | (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f') v = v << 4 | (uint32_t)(c - 'a' + 10);
        else return false;
    }
    if (s[8] != '\0') return false;
    *out = v;
    return true;
}

PDP__PRIVATE int pdp__ckpt_by_meta_key(const void *a, const void *b)
{
    const char *const *x = *(const char *const *const *)a;
    const char *const *y = *(const char *const *const *)b;
    int c = strcmp(x[0], y[0]);
    return c ? c : strcmp(x[1], y[1]);
}

/* The header checksum ("crc32c.header"): CRC-32C of the parsed header, not of
   its bytes, so that a tool that rewrites the file with the same metadata
   (its own key order, spacing, escapes and data order) keeps it valid:
     for every __metadata__ entry but "crc32c.header", in strcmp order of the
       keys: key NUL value NUL;
     then for every tensor, in strcmp order of the names: name NUL dtype NUL,
       each dimension in decimal followed by ',', NUL.
   Strings as decoded (escapes resolved). data_offsets are left out: the tiling
   check pins them, and a tensor read from elsewhere fails its own checksum.
   sorted: the tensors by name (pdp__st_validate). A key twice is an error. */
PDP__PRIVATE pdp_status pdp__ckpt_header_crc(const pdp__st_parser *p, pdp__st_entry *const *sorted,
                                             const pdp__crc32c *c, uint32_t *out)
{
    const char ***keys;
    char num[24];
    uint32_t crc = 0;
    int i, d, n = 0;
    keys = (const char ***)pdp__alloc((size_t)PDP__MAX(1, p->nmeta / 2) * sizeof *keys);
    if (!keys) return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: %s: no memory", p->fn, p->file);
    for (i = 0; i < p->nmeta; i += 2)
        if (strcmp(p->meta[i], "crc32c.header") != 0) keys[n++] = &p->meta[i];
    qsort((void *)keys, (size_t)n, sizeof *keys, pdp__ckpt_by_meta_key);
    for (i = 0; i < n; i++) {
        if (i && strcmp(keys[i - 1][0], keys[i][0]) == 0) {
            pdp_status st = pdp__err(PDP_ERR_FORMAT, "%s: %s: __metadata__ key \"%s\" appears "
                                     "twice", p->fn, p->file, keys[i][0]);
            pdp__dealloc((void *)keys);
            return st;
        }
        crc = pdp__crc32c_update(c, crc, keys[i][0], strlen(keys[i][0]) + 1);
        crc = pdp__crc32c_update(c, crc, keys[i][1], strlen(keys[i][1]) + 1);
    }
    pdp__dealloc((void *)keys);
    for (i = 0; i < p->nentries; i++) {
        const pdp__st_entry *e = sorted[i];
        crc = pdp__crc32c_update(c, crc, e->name, strlen(e->name) + 1);
        crc = pdp__crc32c_update(c, crc, e->dtype, strlen(e->dtype) + 1);
        for (d = 0; d < e->ndim; d++) {
            snprintf(num, sizeof num, "%lld,", (long long)e->shape[d]);
            crc = pdp__crc32c_update(c, crc, num, strlen(num));
        }
        crc = pdp__crc32c_update(c, crc, "", 1);
    }
    *out = crc;
    return PDP_OK;
}

/* ---- checkpoint: save ---- */

/* "optim.decay_params" by pdp_decay_params value */
static const char *const pdp__ckpt_decay_names[] = {"all", "matrices"};

/* Appends printf output to a bounded buffer; *ok turns false on overflow. */
PDP__PRIVATE void pdp__ckpt_put(char *buf, size_t cap, size_t *len, bool *ok, const char *fmt, ...)
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

/* One tensor of a file, in data order. shard: "params" (when with_params),
   then "optim.<state>", each the flat range [lo, hi); otherwise every
   parameter by its state_dict name, then per state "optim.<param>.<state>". */
typedef struct pdp__ckpt_tensor {
    char name[96];
    int state;                          /* -1: parameters; else o's state index */
    int64_t offset, count;              /* elements [offset, offset + count) of the block */
    const pdp__param_entry *param;      /* its parameter; NULL in a shard file */
} pdp__ckpt_tensor;

PDP__PRIVATE int pdp__ckpt_ntensors(const pdp_model *m, const pdp_optim *o, bool with_params,
                                    bool shard)
{
    int ns = o ? o->nstate : 0;
    return shard ? (with_params ? 1 : 0) + ns : m->nparams * (1 + ns);
}

PDP__PRIVATE void pdp__ckpt_tensor_at(const pdp_model *m, const pdp_optim *o, bool with_params,
                                      int64_t lo, int64_t hi, bool shard, int t,
                                      pdp__ckpt_tensor *r)
{
    if (shard) {
        r->state = with_params ? t - 1 : t;
        r->offset = lo;
        r->count = hi - lo;
        r->param = NULL;
        if (r->state < 0) snprintf(r->name, sizeof r->name, "params");
        else snprintf(r->name, sizeof r->name, "optim.%s", pdp__optim_state_name(o, r->state));
        return;
    }
    r->state = t / m->nparams - 1;
    r->param = &m->params[t % m->nparams];
    r->offset = r->param->offset;
    r->count = r->param->count;
    if (r->state < 0) snprintf(r->name, sizeof r->name, "%s", r->param->name);
    else snprintf(r->name, sizeof r->name, "optim.%s.%s", r->param->name,
                  pdp__optim_state_name(o, r->state));
}

/* The header JSON, padded with spaces to a multiple of 8 bytes, its checksums
   "00000000" placeholders: crc_at[0] gets the offset of the header checksum's
   digits, crc_at[1 + t] those of tensor t's. Parameter names are
   "<layer>.<weight|bias>": nothing in them needs escaping. */
PDP__PRIVATE pdp_status pdp__ckpt_header(const pdp_model *m, const pdp_optim *o, bool with_params,
                                         int64_t lo, int64_t hi, bool shard, const char *run,
                                         char **out, size_t *len, size_t *crc_at)
{
    int nt = pdp__ckpt_ntensors(m, o, with_params, shard), t, d;
    size_t cap = 2048 + (size_t)nt * 384, n = 0;
    char *h = (char *)pdp__alloc(cap);
    pdp__ckpt_tensor r;
    bool ok = true;
    uint64_t at = 0;
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
    if (shard && run) pdp__ckpt_put(h, cap, &n, &ok, ",\"shard.run\":\"%s\"", run);
    if (o) {
        const pdp_optim_desc *dd = &o->desc;
        pdp__ckpt_put(h, cap, &n, &ok,
                      ",\"optim.kind\":\"%s\",\"optim.steps\":\"%lld\",\"optim.lr\":\"%.17g\","
                      "\"optim.momentum\":\"%.17g\",\"optim.dampening\":\"%.17g\","
                      "\"optim.nesterov\":\"%s\",\"optim.weight_decay\":\"%.17g\","
                      "\"optim.decay_params\":\"%s\","
                      "\"optim.beta1\":\"%.17g\",\"optim.beta2\":\"%.17g\","
                      "\"optim.eps\":\"%.17g\"",
                      pdp_optim_kind_name(dd->kind), (long long)o->steps, dd->lr, dd->momentum,
                      dd->dampening, dd->nesterov ? "true" : "false", dd->weight_decay,
                      pdp__ckpt_decay_names[dd->decay_params == PDP_DECAY_MATRICES], dd->beta1,
                      dd->beta2, dd->eps);
    }
    for (t = -1; t < nt; t++) {
        if (t < 0) {
            pdp__ckpt_put(h, cap, &n, &ok, ",\"crc32c.header\":\"");
        } else {
            pdp__ckpt_tensor_at(m, o, with_params, lo, hi, shard, t, &r);
            pdp__ckpt_put(h, cap, &n, &ok, ",\"crc32c.%s\":\"", r.name);
        }
        crc_at[1 + t] = n;
        pdp__ckpt_put(h, cap, &n, &ok, "00000000\"");
    }
    pdp__ckpt_put(h, cap, &n, &ok, "}");
    for (t = 0; t < nt; t++) {
        pdp__ckpt_tensor_at(m, o, with_params, lo, hi, shard, t, &r);
        pdp__ckpt_put(h, cap, &n, &ok, ",\"%s\":{\"dtype\":\"F32\",\"shape\":[", r.name);
        if (r.param)
            for (d = 0; d < r.param->ndim; d++)
                pdp__ckpt_put(h, cap, &n, &ok, "%s%lld", d ? "," : "",
                              (long long)r.param->shape[d]);
        else
            pdp__ckpt_put(h, cap, &n, &ok, "%lld", (long long)r.count);
        pdp__ckpt_put(h, cap, &n, &ok, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)at,
                      (unsigned long long)(at + (uint64_t)r.count * 4));
        at += (uint64_t)r.count * 4;
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

/* Fills in the header's checksums: tensor t's from crcs[t], then the header's
   own, computed from the header as pdp__ckpt_header_crc reads it back. */
PDP__PRIVATE pdp_status pdp__ckpt_header_seal(char *h, size_t len, const size_t *crc_at,
                                              const uint32_t *crcs, int nt, uint64_t data_bytes,
                                              const pdp__crc32c *c, const char *fn,
                                              const char *path)
{
    pdp__st_parser p;
    pdp__st_entry **sorted = NULL;
    uint32_t hcrc = 0;
    pdp_status st;
    int t;
    for (t = 0; t < nt; t++) pdp__ckpt_hex8(h + crc_at[1 + t], crcs[t]);
    memset(&p, 0, sizeof p);
    p.s = h;
    p.n = len;
    p.file = path;
    p.fn = fn;
    if ((st = pdp__st_parse(&p)) == PDP_OK) {
        sorted = (pdp__st_entry **)pdp__alloc((size_t)PDP__MAX(1, p.nentries) * sizeof *sorted);
        if (!sorted) st = pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: %s: no memory", fn, path);
    }
    if (st == PDP_OK) st = pdp__st_validate(&p, data_bytes, sorted);
    if (st == PDP_OK) st = pdp__ckpt_header_crc(&p, sorted, c, &hcrc);
    if (st == PDP_OK) pdp__ckpt_hex8(h + crc_at[0], hcrc);
    pdp__dealloc(sorted);
    pdp__st_parser_free(&p);
    return st;
}

/* Writes count floats from dev memory, staging through host (when the data is
   not on the CPU or the host is big-endian); *crc gets the bytes' CRC-32C. */
PDP__PRIVATE bool pdp__ckpt_write_floats(FILE *f, pdp_device dev, const float *data, int64_t count,
                                         float *host, const pdp__crc32c *c, uint32_t *crc)
{
    *crc = 0;
    if (!count) return true;
    if (dev.kind == PDP_DEVICE_CPU && !host) {
        *crc = pdp__crc32c_update(c, 0, data, (size_t)count * 4);
        return fwrite(data, 4, (size_t)count, f) == (size_t)count;
    }
    if (pdp__dev_copy(pdp_cpu(), host, dev, data, (size_t)count * 4) != PDP_OK) return false;
    if (!pdp__little_endian()) pdp__bswap32(host, count);
    *crc = pdp__crc32c_update(c, 0, host, (size_t)count * 4);
    return fwrite(host, 4, (size_t)count, f) == (size_t)count;
}

/* The last separator in path, or NULL. */
PDP__PRIVATE const char *pdp__ckpt_last_sep(const char *path)
{
    const char *p, *sep = NULL;
    for (p = path; *p; p++)
        if (pdp__is_sep(*p)) sep = p;
    return sep;
}

/* The directory part of path ("." for none); false when it does not fit. */
PDP__PRIVATE bool pdp__ckpt_dirname(const char *path, char *dir, size_t cap)
{
    const char *slash = pdp__ckpt_last_sep(path);
    size_t n;
    if (!slash) {
        strcpy(dir, ".");
    } else {
        n = (size_t)(slash - path);
        if (n == 0) n = 1; /* "/file" */
        if (n >= cap) return false;
        memcpy(dir, path, n);
        dir[n] = '\0';
    }
    return true;
}

/* Syncs the directory holding path, so the rename itself is durable. */
PDP__PRIVATE int pdp__ckpt_sync_dir(const char *path)
{
    char dir[4096];
    if (!pdp__ckpt_dirname(path, dir, sizeof dir)) return 0;
    return pdp__dir_sync(dir);
}

/* Removes the temporaries "<path>.tmp.<pid>" and "<path>.tmp.<pid>.<thread>" that writers
   of path killed mid-save left behind: only those whose pid names no live process
   (pdp__pid_alive), never another live writer's, nor ours.
   Best effort: what cannot be listed or removed stays. (A pid is a local
   name: on a filesystem shared between machines, writers of one path on two
   machines are not told apart; ranks write their own paths.) */
PDP__PRIVATE void pdp__ckpt_remove_stale(const char *path)
{
    char dir[4096], victim[4096 + 300];
    const char *base = pdp__ckpt_last_sep(path), *name, *s;
    size_t blen;
    pdp__dir d;
    base = base ? base + 1 : path;
    blen = strlen(base);
    if (!blen || !pdp__ckpt_dirname(path, dir, sizeof dir) || pdp__dir_open(&d, dir) != 0) return;
    while ((name = pdp__dir_next(&d)) != NULL) {
        long pid = 0;
        if (strncmp(name, base, blen) != 0 || strncmp(name + blen, ".tmp.", 5) != 0) continue;
        for (s = name + blen + 5; *s >= '0' && *s <= '9' && pid <= INT_MAX / 10; s++)
            pid = pid * 10 + (*s - '0');
        if (*s == '.' && s > name + blen + 5) /* ".<thread>" (a save's own name) */
            for (s++; (*s >= '0' && *s <= '9') || (*s >= 'a' && *s <= 'f'); s++) continue;
        if (*s || s == name + blen + 5 || pid <= 0 || pid > INT_MAX || pid == pdp__pid() ||
            pdp__pid_alive(pid))
            continue;
        if ((size_t)snprintf(victim, sizeof victim, "%s/%s", dir, name) < sizeof victim)
            remove(victim);
    }
    pdp__dir_close(&d);
}

/* Writes the parameters [lo, hi) (params holds them; skipped unless
   with_params) and o's state for [lo, hi) (o may be NULL) as a full
   checkpoint (shard false: lo = 0, hi = param_count) or a shard file: the
   header with placeholder checksums, the data (each tensor's CRC-32C taken
   from the bytes written), then the sealed header over the first. */
PDP__PRIVATE pdp_status pdp__ckpt_save(const char *path, const pdp_model *m, const float *params,
                                       bool with_params, const pdp_optim *o, int64_t lo, int64_t hi,
                                       bool shard, const char *run, const char *fn)
{
    int nt = pdp__ckpt_ntensors(m, o, with_params, shard);
    bool staged = m->device.kind != PDP_DEVICE_CPU || !pdp__little_endian();
    char *header = NULL, *tmp = NULL;
    unsigned char len8[8];
    size_t hlen = 0, tmp_bytes, *crc_at = NULL;
    uint32_t *crcs = NULL;
    uint64_t data_bytes = 0;
    pdp__crc32c *crc = NULL;
    pdp__ckpt_tensor r;
    float *host = NULL;
    FILE *f = NULL;
    const char *failed = NULL;
    int k, t, err = 0;
    pdp_status st;
    crc_at = (size_t *)pdp__alloc((size_t)(nt + 1) * sizeof *crc_at);
    crcs = (uint32_t *)pdp__alloc((size_t)PDP__MAX(1, nt) * sizeof *crcs);
    crc = (pdp__crc32c *)pdp__alloc(sizeof *crc);
    tmp_bytes = strlen(path) + 48;
    tmp = (char *)pdp__alloc(tmp_bytes);
    if (staged) host = (float *)pdp__alloc((size_t)PDP__MAX(1, hi - lo) * 4);
    if (!crc_at || !crcs || !crc || !tmp || (staged && !host)) {
        st = pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: %s: no memory", fn, path);
        goto done;
    }
    if ((st = pdp__ckpt_header(m, o, with_params, lo, hi, shard, run, &header, &hlen,
                               crc_at)) != PDP_OK) {
        st = pdp__err_wrap(st, "%s: %s", fn, path);
        goto done;
    }
    pdp__crc32c_init(crc);
    pdp__ckpt_remove_stale(path);
    /* the pid and, in hex, the address of this thread's message buffer: threads of one
       process (thread ranks) saving one path at once each write a temporary of their own */
    snprintf(tmp, tmp_bytes, "%s.tmp.%ld.%llx", path, pdp__pid(),
             (unsigned long long)(uintptr_t)pdp_last_error());
    for (k = 0; k < 8; k++) len8[k] = (unsigned char)((uint64_t)hlen >> (8 * k));

    if (!(f = fopen(tmp, "wb"))) {
        failed = "fopen";
        goto io_error;
    }
    if (fwrite(len8, 1, 8, f) != 8 || fwrite(header, 1, hlen, f) != hlen) {
        failed = "write";
        goto io_error;
    }
    for (t = 0; t < nt; t++) {
        const float *src;
        pdp__ckpt_tensor_at(m, o, with_params, lo, hi, shard, t, &r);
        src = r.state < 0 ? params + (r.offset - lo) : o->state[r.state] + (r.offset - o->lo);
        if (!pdp__ckpt_write_floats(f, m->device, src, r.count, host, crc, &crcs[t])) {
            failed = "write";
            goto io_error;
        }
        data_bytes += (uint64_t)r.count * 4;
    }
    if ((st = pdp__ckpt_header_seal(header, hlen, crc_at, crcs, nt, data_bytes, crc, fn,
                                    path)) != PDP_OK) {
        fclose(f);
        remove(tmp);
        goto done;
    }
    if (fseek(f, 8, SEEK_SET) != 0 || fwrite(header, 1, hlen, f) != hlen) {
        failed = "write";
        goto io_error;
    }
    if (pdp__file_sync(f) != 0) {
        failed = "flush and sync";
        goto io_error;
    }
    k = fclose(f);
    f = NULL;
    if (k != 0) {
        failed = "fclose";
        goto io_error;
    }
    if (pdp__file_replace(tmp, path) != 0) {
        failed = "rename";
        goto io_error;
    }
    st = PDP_OK;
    if (pdp__ckpt_sync_dir(path) != 0)
        st = pdp__err(PDP_ERR_IO, "%s: %s: written, but syncing its directory failed: %s", fn,
                      path, strerror(errno));
    goto done;
io_error:
    err = errno;
    if (f) fclose(f);
    remove(tmp);
    st = pdp__err(PDP_ERR_IO, "%s: %s: %s of %s failed: %s (the previous file, if any, is "
                  "unchanged)", fn, path, failed, tmp, err ? strerror(err) : "short write");
done:
    pdp__dealloc(header);
    pdp__dealloc(host);
    pdp__dealloc(tmp);
    pdp__dealloc(crc_at);
    pdp__dealloc(crcs);
    pdp__dealloc(crc);
    return st;
}

/* The whole-model calls' arguments: a plain model (not TP slices) and an optimizer
   holding the state of every parameter. fn ends in _save or _load, which names the
   TP function to call instead. */
PDP__PRIVATE pdp_status pdp__ckpt_whole_args(const char *path, const pdp_model *m,
                                             const pdp_optim *o, const char *fn)
{
    if (!path || !m) return pdp__err(PDP_ERR_INVALID, "%s: NULL argument", fn);
    /* ZeRO: a load must reach the shards that train (and every rank); a save needs the
       full parameters in the model's block (stages 1-2, or stage 3 after
       pdp_zero_gather_params(z, NULL): what consolidate saves through) */
    if (m->wrapped == PDP__WRAP_ZERO && !strstr(fn, "_save"))
        return pdp__err(PDP_ERR_STATE, "%s: %s: the model is wrapped by %s, whose shards hold "
                        "what trains; load with pdp_zero_checkpoint_load_full (a full file) or "
                        "pdp_zero_checkpoint_load (a shard set), both collective", fn, path,
                        pdp__model_wrapper(m));
    if (m->wrapped == PDP__WRAP_ZERO && !m->param_block)
        return pdp__err(PDP_ERR_STATE, "%s: %s: the model is wrapped by %s, which keeps only "
                        "this rank's slices of the parameters; save with "
                        "pdp_zero_checkpoint_consolidate (one full file) or "
                        "pdp_zero_checkpoint_save (a shard set), both collective", fn, path,
                        pdp__model_wrapper(m));
    if (m->tp.nlayers)
        return pdp__err(PDP_ERR_STATE, "%s: %s: the model has %d tensor-parallel layers, so its "
                        "parameters are this rank's slices; use pdp_tp_checkpoint_%s "
                        "(collective) for the full tensors", fn, path, m->tp.nlayers,
                        strstr(fn, "_save") ? "save" : "load");
    if (o && o->count != m->param_count)
        return pdp__err(PDP_ERR_SHAPE, "%s: %s: the optimizer holds state for %lld parameters, "
                        "the model has %lld", fn, path, (long long)o->count,
                        (long long)m->param_count);
    if (o && o->model != m) /* its moments are another model's, whatever the count */
        return pdp__err(PDP_ERR_INVALID, "%s: %s: the optimizer was created on another model "
                        "(of %lld parameters too)", fn, path, (long long)m->param_count);
    if (o && !pdp__optim_is_full(o))
        return pdp__err(PDP_ERR_STATE, "%s: %s: the optimizer holds state for [%lld, %lld) of "
                        "the %lld parameters only (a ZeRO shard: pdp_zero_checkpoint_%s)", fn,
                        path, (long long)o->lo, (long long)o->hi, (long long)o->count,
                        strstr(fn, "_save") ? "consolidate or _save" : "load_full or _load");
    return PDP_OK;
}

PDP_API pdp_status pdp_checkpoint_save(const char *path, const pdp_model *m, const pdp_optim *o)
{
    const char *fn = "pdp_checkpoint_save";
    pdp_status st;
    if ((st = pdp__ckpt_whole_args(path, m, o, fn)) != PDP_OK) return st;
    if ((st = pdp__model_check_whole(m, fn)) != PDP_OK) return st;
    return pdp__ckpt_save(path, m, m->param_block, true, o, 0, m->param_count, false, NULL, fn);
}

/* Checks a range call's arguments: [lo, hi) inside the model, o's range
   containing it, something to save or load. */
PDP__PRIVATE pdp_status pdp__ckpt_range_args(const char *path, const pdp_model *m,
                                             const float *params, const pdp_optim *o, int64_t lo,
                                             int64_t hi, const char *fn)
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

PDP__PRIVATE pdp_status pdp__checkpoint_save_run(const char *path, const pdp_model *m,
                                                 const float *params, const pdp_optim *o,
                                                 int64_t lo, int64_t hi, const char *run,
                                                 const char *fn)
{
    pdp_status st = pdp__ckpt_range_args(path, m, params, o, lo, hi, fn);
    if (st != PDP_OK) return st;
    return pdp__ckpt_save(path, m, params, params != NULL, o, lo, hi, true, run, fn);
}

PDP__PRIVATE pdp_status pdp__checkpoint_save_range(const char *path, const pdp_model *m,
                                                   const float *params, const pdp_optim *o,
                                                   int64_t lo, int64_t hi, const char *fn)
{
    return pdp__checkpoint_save_run(path, m, params, o, lo, hi, NULL, fn);
}

/* ---- checkpoint: load ---- */

/* A hyper-parameter from a metadata string: a double, "%.17g" on save (the exact
   double back); an older pdp's file has "%.9g" of a float, read as that decimal. False
   when absent or not a finite number. */
PDP__PRIVATE bool pdp__ckpt_meta_double(const pdp__st_parser *p, const char *key, double *out)
{
    const char *s = pdp__st_meta(p, key);
    char *end;
    double v;
    if (!s || !*s) return false;
    v = strtod(s, &end);
    if (*end || !isfinite(v)) return false;
    *out = v;
    return true;
}

/* The optimizer part of the metadata: o's kind, steps and hyper-parameters. */
PDP__PRIVATE pdp_status pdp__ckpt_read_optim(const pdp__st_parser *p, const pdp_optim *o,
                                             pdp_optim_desc *desc, int64_t *steps)
{
    const char *fn = p->fn, *kind = pdp__st_meta(p, "optim.kind");
    const char *s = pdp__st_meta(p, "optim.steps"), *nest = pdp__st_meta(p, "optim.nesterov");
    const char *decay = pdp__st_meta(p, "optim.decay_params");
    static const char *const keys[] = {"optim.lr", "optim.momentum", "optim.dampening",
                                       "optim.weight_decay", "optim.beta1", "optim.beta2",
                                       "optim.eps"};
    double *fields[7];
    pdp_optim_desc d, resolved;
    char *end = NULL, where[512]; /* read only when s is set (clang cannot see it) */
    long long n;
    int i;
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
        if (!pdp__ckpt_meta_double(p, keys[i], fields[i]))
            return pdp__err(PDP_ERR_FORMAT, "%s: %s: __metadata__ \"%s\" is missing or not a "
                            "finite number", fn, p->file, keys[i]);
    if (!nest || (strcmp(nest, "true") != 0 && strcmp(nest, "false") != 0))
        return pdp__err(PDP_ERR_FORMAT, "%s: %s: __metadata__ \"optim.nesterov\" must be \"true\" "
                        "or \"false\"", fn, p->file);
    d.nesterov = strcmp(nest, "true") == 0;
    /* absent: a file written before the field, when every parameter decayed */
    d.decay_params = PDP_DECAY_ALL;
    if (decay && strcmp(decay, pdp__ckpt_decay_names[PDP_DECAY_ALL]) != 0) {
        if (strcmp(decay, pdp__ckpt_decay_names[PDP_DECAY_MATRICES]) != 0)
            return pdp__err(PDP_ERR_FORMAT, "%s: %s: __metadata__ \"optim.decay_params\" is "
                            "\"%s\", not \"all\" or \"matrices\"", fn, p->file, decay);
        d.decay_params = PDP_DECAY_MATRICES;
    }
    errno = 0;
    n = s ? strtoll(s, &end, 10) : -1;
    if (!s || !*s || *end || errno || n < 0)
        return pdp__err(PDP_ERR_FORMAT, "%s: %s: __metadata__ \"optim.steps\" is missing or not a "
                        "count", fn, p->file);
    /* resolve's message then starts with where, and so with fn */
    snprintf(where, sizeof where, "%s: %s: __metadata__", fn, p->file);
    if (pdp__optim_desc_resolve(&d, &resolved, where) != PDP_OK) return PDP_ERR_FORMAT;
    if (pdp__optim_nstate(&resolved) != o->nstate)
        return pdp__err(PDP_ERR_FORMAT, "%s: %s: the file's %s (momentum %g) keeps %d state "
                        "tensors per parameter, the optimizer %d", fn, p->file, kind,
                        d.momentum, pdp__optim_nstate(&resolved), o->nstate);
    resolved.lr = d.lr; /* 0 is a valid learning rate (e.g. the end of a schedule) */
    *desc = resolved;
    *steps = (int64_t)n;
    return PDP_OK;
}

/* An optional unsigned metadata count ("model.seed", "model.step"): *present
   tells whether the key exists; false when it exists but is not a count. */
PDP__PRIVATE bool pdp__ckpt_meta_u64(const pdp__st_parser *p, const char *key, uint64_t *out,
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
PDP__PRIVATE bool pdp__ckpt_expected(const pdp_model *m, const pdp_optim *o, const char *name)
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

/* nanoGPT's two extra tensors (checkpoint.h): "lm_head.weight", the alias of the tied
   head's weight, and "<prefix>.attn.bias", a causal-mask buffer (pdp__ckpt_load_extra). */
#define PDP__CKPT_HEAD_ALIAS "lm_head.weight"
#define PDP__CKPT_MASK_SUFFIX ".attn.bias"

/* The registry index of the parameter PDP__CKPT_HEAD_ALIAS stands for: the weight of the
   model's last TiedLinear (its LM head), when it has one and no parameter of that name;
   else -1. */
PDP__PRIVATE int pdp__ckpt_alias_param(const pdp_model *m)
{
    int i;
    for (i = 0; i < m->nparams; i++)
        if (strcmp(m->params[i].name, PDP__CKPT_HEAD_ALIAS) == 0) return -1;
    for (i = m->nlayers - 1; i >= 0; i--)
        if (pdp__model_flag(m, i, PDP__LAYER_TIED)) return m->layers[i].tied_param;
    return -1;
}

/* Whether name is "<prefix>.attn.bias" and the model has parameters "<prefix>.attn.*":
   the attention whose causal-mask buffer nanoGPT keeps under that name. */
PDP__PRIVATE bool pdp__ckpt_mask_name(const pdp_model *m, const char *name)
{
    size_t len = strlen(name), suffix = strlen(PDP__CKPT_MASK_SUFFIX);
    int i;
    if (len < suffix || strcmp(name + len - suffix, PDP__CKPT_MASK_SUFFIX) != 0) return false;
    for (i = 0; i < m->nparams; i++) /* "<prefix>.attn." */
        if (strncmp(m->params[i].name, name, len - strlen("bias")) == 0) return true;
    return false;
}

PDP__PRIVATE void pdp__shape_text(char *buf, size_t cap, int ndim, const int64_t *shape)
{
    size_t n = 0;
    int d;
    n += (size_t)snprintf(buf, cap, "[");
    for (d = 0; d < ndim && n < cap; d++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

/* The checksums of a file being loaded: the tables and a chunk for reading a
   tensor of which only a slice is loaded (it is verified whole). */
#define PDP__CKPT_CHUNK 65536 /* bytes */
typedef struct pdp__ckpt_sums {
    pdp__crc32c crc;
    unsigned char chunk[PDP__CKPT_CHUNK];
} pdp__ckpt_sums;

/* A file with checksums (any __metadata__ key "crc32c.*": written by pdp)
   must have them all: "crc32c.header", matching the header, and one
   "crc32c.<name>" for every tensor, none for anything else; each value 8
   lowercase hex digits. Sets the entries' crc; *has tells whether the file has
   checksums (a file of another tool has none and is loaded unverified). */
PDP__PRIVATE pdp_status pdp__ckpt_check_sums(pdp__st_parser *p, pdp__st_entry *const *sorted,
                                             const pdp__crc32c *c, bool *has)
{
    const char *fn = p->fn, *hs = pdp__st_meta(p, "crc32c.header");
    uint32_t want, got;
    pdp__st_entry *e;
    pdp_status st;
    int i;
    *has = false;
    for (i = 0; i < p->nmeta && !*has; i += 2) *has = strncmp(p->meta[i], "crc32c.", 7) == 0;
    if (!*has) return PDP_OK;
    if (!hs)
        return pdp__err(PDP_ERR_FORMAT, "%s: %s: the header is corrupt: __metadata__ has tensor "
                        "checksums but no \"crc32c.header\"", fn, p->file);
    if (!pdp__ckpt_unhex8(hs, &want))
        return pdp__err(PDP_ERR_FORMAT, "%s: %s: the header is corrupt: __metadata__ "
                        "\"crc32c.header\" is \"%s\", not 8 lowercase hex digits", fn, p->file,
                        hs);
    if ((st = pdp__ckpt_header_crc(p, sorted, c, &got)) != PDP_OK) return st;
    if (got != want)
        return pdp__err(PDP_ERR_FORMAT, "%s: %s: the header is corrupt: its checksum is %08lx, "
                        "__metadata__ \"crc32c.header\" says %08lx", fn, p->file,
                        (unsigned long)got, (unsigned long)want);
    for (i = 0; i < p->nmeta; i += 2) {
        const char *key = p->meta[i];
        if (strncmp(key, "crc32c.", 7) != 0 || strcmp(key, "crc32c.header") == 0) continue;
        if (!(e = (pdp__st_entry *)pdp__st_find(sorted, p->nentries, key + 7)))
            return pdp__err(PDP_ERR_FORMAT, "%s: %s: __metadata__ \"%s\" is the checksum of a "
                            "tensor the file does not have", fn, p->file, key);
        if (e->has_crc || !pdp__ckpt_unhex8(p->meta[i + 1], &e->crc))
            return pdp__err(PDP_ERR_FORMAT, "%s: %s: tensor \"%s\": __metadata__ \"%s\" is "
                            "repeated or not 8 lowercase hex digits", fn, p->file, e->name, key);
        e->has_crc = true;
    }
    for (i = 0; i < p->nentries; i++)
        if (!p->entries[i].has_crc)
            return pdp__err(PDP_ERR_FORMAT, "%s: %s: tensor \"%s\" has no checksum (no "
                            "\"crc32c.%s\" in __metadata__)", fn, p->file, p->entries[i].name,
                            p->entries[i].name);
    return PDP_OK;
}

PDP__PRIVATE pdp_status pdp__ckpt_crc_check(const char *fn, const char *file,
                                            const pdp__st_entry *e, uint32_t crc)
{
    if (crc == e->crc) return PDP_OK;
    return pdp__err(PDP_ERR_FORMAT, "%s: %s: tensor \"%s\" is corrupt: its data's checksum is "
                    "%08lx, __metadata__ \"crc32c.%s\" says %08lx", fn, file, e->name,
                    (unsigned long)crc, e->name, (unsigned long)e->crc);
}

PDP__PRIVATE pdp_status pdp__ckpt_read_error(FILE *f, const char *fn, const char *file,
                                             const pdp__st_entry *e)
{
    return pdp__err(PDP_ERR_IO, "%s: %s: tensor \"%s\": read failed (%s)", fn, file, e->name,
                    ferror(f) ? strerror(errno) : "file shorter than its header");
}

/* Reads elements [first, first + count) of tensor e of the file f (data at
   data_start) into dst. With sums, the whole tensor is read and checked
   against its checksum (through sums->chunk when only a slice is wanted). */
PDP__PRIVATE pdp_status pdp__ckpt_read_tensor(FILE *f, const char *fn, const char *file,
                                              uint64_t data_start, const pdp__st_entry *e,
                                              int64_t first, float *dst, int64_t count,
                                              pdp__ckpt_sums *sums)
{
    uint64_t bytes = e->end - e->begin, want_lo = (uint64_t)first * 4;
    uint64_t want_hi = want_lo + (uint64_t)count * 4, at = data_start + e->begin, done, n, a, b;
    uint32_t crc = 0;
    pdp_status st;
    bool whole = !sums || (want_lo == 0 && want_hi == bytes);
    if (whole) at += want_lo;
    if (at > (uint64_t)LONG_MAX || fseek(f, (long)at, SEEK_SET) != 0) goto read_error;
    if (whole) {
        if (fread(dst, 4, (size_t)count, f) != (size_t)count) goto read_error;
        if (sums) crc = pdp__crc32c_update(&sums->crc, 0, dst, (size_t)count * 4);
    } else {
        for (done = 0; done < bytes; done += n) {
            n = PDP__MIN(bytes - done, (uint64_t)PDP__CKPT_CHUNK);
            if (fread(sums->chunk, 1, (size_t)n, f) != (size_t)n) goto read_error;
            crc = pdp__crc32c_update(&sums->crc, crc, sums->chunk, (size_t)n);
            a = PDP__MAX(done, want_lo);
            b = PDP__MIN(done + n, want_hi);
            if (a < b)
                memcpy((unsigned char *)dst + (a - want_lo), sums->chunk + (a - done), b - a);
        }
    }
    if (sums && (st = pdp__ckpt_crc_check(fn, file, e, crc)) != PDP_OK) return st;
    if (!pdp__little_endian()) pdp__bswap32(dst, count);
    return PDP_OK;
read_error:
    return pdp__ckpt_read_error(f, fn, file, e);
}

/* Whether a tensor name of a shard file is one load expects (or may ignore). */
PDP__PRIVATE bool pdp__ckpt_shard_expected(const pdp_optim *o, const char *name)
{
    int k;
    if (strcmp(name, "params") == 0) return true; /* ignored when not loading parameters */
    if (strncmp(name, "optim.", 6) != 0) return false;
    if (!o) return true; /* ignored */
    for (k = 0; k < o->nstate; k++)
        if (strcmp(name + 6, pdp__optim_state_name(o, k)) == 0) return true;
    return false;
}

/* ---- checkpoint: load, step by step ----
   pdp__ckpt_load runs the steps below in order; each returns a status, the first failure
   ends the load (the message is that step's), and the clean-up runs either way. Nothing
   reaches the model or the optimizer before the commit, the last step, and the commit
   runs only when every check before it passed. */

/* One load: its arguments and what one step hands to the next. */
typedef struct pdp__ckpt_loader {
    const char *path, *fn, *run; /* run: the ZeRO save a shard must belong to, or NULL */
    pdp_model *m;
    pdp_optim *o;                /* NULL: parameters only */
    float *params;               /* the destination of [lo, hi), when with_params */
    bool with_params, allow_shard;
    int64_t lo, hi, count;       /* count = hi - lo */
    int nstate;                  /* o's state tensors (0 without o) */
    FILE *f;
    uint64_t file_bytes, data_start;
    char *header;
    pdp__st_parser p;
    pdp__st_entry **sorted;
    pdp__ckpt_sums *sums, *check; /* check: sums when the file has checksums, else NULL */
    bool shard;                  /* a shard file ("format": "pdp-shard") */
    int alias;                   /* the parameter "lm_head.weight" stands for, or -1
                                    (pdp__ckpt_alias_param) */
    pdp_optim_desc desc;         /* the file's optimizer (with o) */
    int64_t steps;
    uint64_t seed, mstep;        /* "model.seed", "model.step", when have_seed, have_step */
    bool have_seed, have_step;
    float *staging;              /* count (1 + nstate) floats: params, then each state */
} pdp__ckpt_loader;

/* Opens the file and reads, parses and validates its header (the data's tiling too). */
PDP__PRIVATE pdp_status pdp__ckpt_load_open(pdp__ckpt_loader *L)
{
    const char *fn = L->fn, *path = L->path;
    unsigned char len8[8];
    uint64_t hlen = 0;
    pdp_status st;
    int k;
    if (!(L->f = fopen(path, "rb"))) {
        int err = errno;
        if (pdp__path_kind(path, true) == PDP__PATH_DIR) /* Windows opens no directory */
            return pdp__err(PDP_ERR_IO, "%s: %s: not a regular file", fn, path);
        return pdp__err(PDP_ERR_IO, "%s: %s: %s", fn, path, strerror(err));
    }
    if (pdp__file_size(L->f, &L->file_bytes) != 0)
        return pdp__err(PDP_ERR_IO, "%s: %s: not a regular file", fn, path);
    if (L->file_bytes < 8 || fread(len8, 1, 8, L->f) != 8)
        return pdp__err(PDP_ERR_FORMAT, "%s: %s: %llu bytes, shorter than the 8-byte header "
                        "length", fn, path, (unsigned long long)L->file_bytes);
    for (k = 7; k >= 0; k--) hlen = (hlen << 8) | len8[k];
    if (hlen < 2 || hlen > PDP__CKPT_MAX_HEADER || hlen > L->file_bytes - 8)
        return pdp__err(PDP_ERR_FORMAT, "%s: %s: header length %llu is impossible (file %llu "
                        "bytes, limit %llu): not a safetensors file, or truncated", fn, path,
                        (unsigned long long)hlen, (unsigned long long)L->file_bytes,
                        (unsigned long long)PDP__CKPT_MAX_HEADER);
    L->data_start = 8 + hlen;
    if (!(L->header = (char *)pdp__alloc((size_t)hlen)))
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: %s: no memory for the header", fn, path);
    if (fread(L->header, 1, (size_t)hlen, L->f) != (size_t)hlen)
        return pdp__err(PDP_ERR_IO, "%s: %s: reading the header failed", fn, path);
    L->p.s = L->header;
    L->p.n = (size_t)hlen;
    L->p.file = path;
    L->p.fn = fn;
    if ((st = pdp__st_parse(&L->p)) != PDP_OK) return st;
    L->sorted = (pdp__st_entry **)pdp__alloc((size_t)PDP__MAX(1, L->p.nentries) *
                                             sizeof *L->sorted);
    if (!L->sorted) return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: %s: no memory", fn, path);
    return pdp__st_validate(&L->p, L->file_bytes - L->data_start, L->sorted);
}

/* Verifies the header's checksum and takes each tensor's (a file without any: unverified). */
PDP__PRIVATE pdp_status pdp__ckpt_load_sums(pdp__ckpt_loader *L)
{
    bool has_sums = false;
    pdp_status st;
    if (!(L->sums = (pdp__ckpt_sums *)pdp__alloc(sizeof *L->sums)))
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: %s: no memory", L->fn, L->path);
    pdp__crc32c_init(&L->sums->crc);
    if ((st = pdp__ckpt_check_sums(&L->p, L->sorted, &L->sums->crc, &has_sums)) != PDP_OK)
        return st;
    L->check = has_sums ? L->sums : NULL;
    return PDP_OK;
}

/* Reads the optimizer's metadata (with o) and the model's seed and step. */
PDP__PRIVATE pdp_status pdp__ckpt_load_meta(pdp__ckpt_loader *L)
{
    pdp_status st;
    if (L->o && (st = pdp__ckpt_read_optim(&L->p, L->o, &L->desc, &L->steps)) != PDP_OK)
        return st;
    if (!pdp__ckpt_meta_u64(&L->p, "model.seed", &L->seed, &L->have_seed) ||
        !pdp__ckpt_meta_u64(&L->p, "model.step", &L->mstep, &L->have_step))
        return pdp__err(PDP_ERR_FORMAT, "%s: %s: __metadata__ \"model.seed\" or \"model.step\" "
                        "is not a count", L->fn, L->path);
    return PDP_OK;
}

/* A full file or a shard file, as the call allows; a shard's range and run are the call's. */
PDP__PRIVATE pdp_status pdp__ckpt_load_kind(pdp__ckpt_loader *L)
{
    const char *fn = L->fn, *path = L->path, *run = L->run;
    const char *format = pdp__st_meta(&L->p, "format"), *srun;
    uint64_t slo = 0, shi = 0, scount = 0;
    bool have[3];
    L->shard = format && strcmp(format, "pdp-shard") == 0;
    if (L->shard && !L->allow_shard)
        return pdp__err(PDP_ERR_FORMAT, "%s: %s: a shard file (one rank's range of a ZeRO run), "
                        "not a checkpoint of the whole model", fn, path);
    if (run && !L->shard)
        return pdp__err(PDP_ERR_FORMAT, "%s: %s: not a shard file (\"format\" is \"%s\"), where "
                        "the shard of run %s belongs", fn, path, format ? format : "absent", run);
    if (!L->shard) return PDP_OK;
    if (!pdp__ckpt_meta_u64(&L->p, "shard.lo", &slo, &have[0]) ||
        !pdp__ckpt_meta_u64(&L->p, "shard.hi", &shi, &have[1]) ||
        !pdp__ckpt_meta_u64(&L->p, "shard.count", &scount, &have[2]) || !have[0] || !have[1] ||
        !have[2])
        return pdp__err(PDP_ERR_FORMAT, "%s: %s: __metadata__ \"shard.lo\", \"shard.hi\" or "
                        "\"shard.count\" is missing or not a count", fn, path);
    if (slo != (uint64_t)L->lo || shi != (uint64_t)L->hi ||
        scount != (uint64_t)L->m->param_count)
        return pdp__err(PDP_ERR_SHAPE, "%s: %s: the file holds [%llu, %llu) of %llu parameters, "
                        "this rank loads [%lld, %lld) of %lld", fn, path,
                        (unsigned long long)slo, (unsigned long long)shi,
                        (unsigned long long)scount, (long long)L->lo, (long long)L->hi,
                        (long long)L->m->param_count);
    srun = pdp__st_meta(&L->p, "shard.run");
    if (run && (!srun || strcmp(srun, run) != 0))
        return pdp__err(PDP_ERR_FORMAT, "%s: %s: a shard of run %s, the set's is run %s (a "
                        "file of another save)", fn, path, srun ? srun : "(none: no "
                        "\"shard.run\")", run);
    return PDP_OK;
}

/* A shard file's tensors ("params", "optim.<state>"): each present, F32 [count], read into
   its part of the staging buffer and checked against its checksum. */
PDP__PRIVATE pdp_status pdp__ckpt_load_shard_tensors(pdp__ckpt_loader *L)
{
    const char *fn = L->fn, *path = L->path;
    char name[96], a[128];
    pdp_status st;
    int k;
    for (k = L->with_params ? -1 : 0; k < L->nstate; k++) {
        const pdp__st_entry *e;
        if (k < 0) snprintf(name, sizeof name, "params");
        else snprintf(name, sizeof name, "optim.%s", pdp__optim_state_name(L->o, k));
        if (!(e = pdp__st_find(L->sorted, L->p.nentries, name)))
            return pdp__err(PDP_ERR_SHAPE, "%s: %s: tensor \"%s\" is missing", fn, path, name);
        if (strcmp(e->dtype, "F32") != 0 || e->ndim != 1 || e->shape[0] != L->count) {
            pdp__shape_text(a, sizeof a, e->ndim, e->shape);
            return pdp__err(PDP_ERR_SHAPE, "%s: %s: tensor \"%s\" is %s %s, expected F32 [%lld]",
                            fn, path, name, e->dtype, a, (long long)L->count);
        }
        if ((st = pdp__ckpt_read_tensor(L->f, fn, path, L->data_start, e, 0,
                                        L->staging + (k + 1) * L->count, L->count,
                                        L->check)) != PDP_OK)
            return st;
    }
    return PDP_OK;
}

/* A full file's tensors (the model's names, "optim.<name>.<state>"): each present, F32, the
   model's shape; the part inside [lo, hi) read into the staging buffer (the whole tensor
   checked against its checksum). A tied head's weight the file lacks is read from its
   alias "lm_head.weight" when the file has that. */
PDP__PRIVATE pdp_status pdp__ckpt_load_full_tensors(pdp__ckpt_loader *L)
{
    const char *fn = L->fn, *path = L->path;
    char name[96], a[128], b[128];
    pdp_status st;
    int i, k, d;
    for (k = L->with_params ? -1 : 0; k < L->nstate; k++) {
        for (i = 0; i < L->m->nparams; i++) {
            const pdp__param_entry *pe = &L->m->params[i];
            const pdp__st_entry *e;
            int64_t from = PDP__MAX(L->lo, pe->offset);
            int64_t to = PDP__MIN(L->hi, pe->offset + pe->count);
            bool same = true;
            if (k < 0) snprintf(name, sizeof name, "%s", pe->name);
            else snprintf(name, sizeof name, "optim.%s.%s", pe->name,
                          pdp__optim_state_name(L->o, k));
            e = pdp__st_find(L->sorted, L->p.nentries, name);
            if (!e && k < 0 && i == L->alias &&
                (e = pdp__st_find(L->sorted, L->p.nentries, PDP__CKPT_HEAD_ALIAS)) != NULL)
                snprintf(name, sizeof name, "%s", e->name); /* the messages name the alias */
            if (!e)
                return pdp__err(PDP_ERR_SHAPE, "%s: %s: tensor \"%s\" is missing%s", fn, path,
                                name, k < 0 && i == L->alias ? " (and so is its alias \""
                                PDP__CKPT_HEAD_ALIAS "\")" : "");
            if (strcmp(e->dtype, "F32") != 0)
                return pdp__err(PDP_ERR_FORMAT, "%s: %s: tensor \"%s\" is %s, expected F32", fn,
                                path, name, e->dtype);
            same = e->ndim == pe->ndim;
            for (d = 0; same && d < pe->ndim; d++) same = e->shape[d] == pe->shape[d];
            if (!same) {
                pdp__shape_text(a, sizeof a, e->ndim, e->shape);
                pdp__shape_text(b, sizeof b, pe->ndim, pe->shape);
                return pdp__err(PDP_ERR_SHAPE, "%s: %s: tensor \"%s\" has shape %s in the file, "
                                "the model's is %s", fn, path, name, a, b);
            }
            if (from < to &&
                (st = pdp__ckpt_read_tensor(L->f, fn, path, L->data_start, e, from - pe->offset,
                                            L->staging + (k + 1) * L->count + (from - L->lo),
                                            to - from, L->check)) != PDP_OK)
                return st;
        }
    }
    return PDP_OK;
}

/* Every expected tensor checked against the model and read (CRC-checked) into staging. */
PDP__PRIVATE pdp_status pdp__ckpt_load_tensors(pdp__ckpt_loader *L)
{
    int64_t floats = L->count * (1 + L->nstate);
    L->staging = (float *)pdp__alloc((size_t)PDP__MAX(1, floats) * sizeof(float));
    if (!L->staging)
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: %s: no memory to stage %lld floats", L->fn,
                        L->path, (long long)floats);
    return L->shard ? pdp__ckpt_load_shard_tensors(L) : pdp__ckpt_load_full_tensors(L);
}

/* Reads bytes [at, at + n) of tensor e's data, as stored, into dst and continues *crc over
   them: a whole tensor streamed in pieces, then checked with pdp__ckpt_crc_check. */
PDP__PRIVATE pdp_status pdp__ckpt_read_bytes(const pdp__ckpt_loader *L, const pdp__st_entry *e,
                                             uint64_t at, unsigned char *dst, size_t n,
                                             uint32_t *crc)
{
    at += L->data_start + e->begin;
    if (at > (uint64_t)LONG_MAX || fseek(L->f, (long)at, SEEK_SET) != 0 ||
        fread(dst, 1, n, L->f) != n)
        return pdp__ckpt_read_error(L->f, L->fn, L->path, e);
    *crc = pdp__crc32c_update(&L->sums->crc, *crc, dst, n);
    return PDP_OK;
}

/* The bits of the little-endian float32 at p, on any host, and that float. */
PDP__PRIVATE uint32_t pdp__ckpt_u32le(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

PDP__PRIVATE double pdp__ckpt_f32le(const unsigned char *p)
{
    uint32_t u = pdp__ckpt_u32le(p);
    float v;
    memcpy(&v, &u, 4);
    return (double)v;
}

/* "[i, j, ...]": the multi-index of element at (row-major) of a tensor of that shape. */
PDP__PRIVATE void pdp__ckpt_index_text(char *buf, size_t cap, int ndim, const int64_t *shape,
                                       int64_t at)
{
    int64_t idx[PDP__CKPT_MAX_DIMS];
    int d;
    for (d = ndim - 1; d >= 0; d--) {
        idx[d] = shape[d] ? at % shape[d] : 0;
        at = shape[d] ? at / shape[d] : 0;
    }
    pdp__shape_text(buf, cap, ndim, idx);
}

/* "lm_head.weight" in a file whose model ties its head (L->alias): F32 of the tied
   parameter's shape and, when the file has that parameter too, equal to it bit for bit
   (streamed through the loader's chunk, half each; both checksums verified when the file
   has them). When the file has only the alias, pdp__ckpt_load_full_tensors read it. */
PDP__PRIVATE pdp_status pdp__ckpt_load_alias(const pdp__ckpt_loader *L, const pdp__st_entry *e)
{
    const char *fn = L->fn, *path = L->path;
    const pdp__param_entry *pe = &L->m->params[L->alias];
    const pdp__st_entry *own = pdp__st_find(L->sorted, L->p.nentries, pe->name);
    unsigned char *a = L->sums->chunk, *b = a + PDP__CKPT_CHUNK / 2;
    uint64_t bytes = e->end - e->begin, done, n, j, first = UINT64_MAX;
    uint32_t crc_a = 0, crc_b = 0;
    unsigned char va[4], vb[4];
    char sa[128], sb[128];
    pdp_status st;
    bool same = e->ndim == pe->ndim;
    int d;
    for (d = 0; same && d < pe->ndim; d++) same = e->shape[d] == pe->shape[d];
    if (strcmp(e->dtype, "F32") != 0 || !same) {
        pdp__shape_text(sa, sizeof sa, e->ndim, e->shape);
        pdp__shape_text(sb, sizeof sb, pe->ndim, pe->shape);
        return pdp__err(strcmp(e->dtype, "F32") != 0 ? PDP_ERR_FORMAT : PDP_ERR_SHAPE,
                        "%s: %s: tensor \"%s\" (the tied head, an alias of "
                        "\"%s\") is %s %s, expected F32 %s", fn, path, e->name, pe->name,
                        e->dtype, sa, sb);
    }
    if (!own) return PDP_OK;
    if (own->end - own->begin != bytes)
        return pdp__err(PDP_ERR_FORMAT, "%s: %s: tensor \"%s\" and \"%s\" (one tied "
                        "parameter) differ in size", fn, path, e->name, own->name);
    for (done = 0; done < bytes; done += n) {
        n = PDP__MIN(bytes - done, (uint64_t)PDP__CKPT_CHUNK / 2);
        if ((st = pdp__ckpt_read_bytes(L, e, done, a, (size_t)n, &crc_a)) != PDP_OK ||
            (st = pdp__ckpt_read_bytes(L, own, done, b, (size_t)n, &crc_b)) != PDP_OK)
            return st;
        if (first == UINT64_MAX && memcmp(a, b, (size_t)n) != 0) {
            for (j = 0; a[j] == b[j]; j++) continue;
            j -= j % 4; /* the first differing element */
            first = (done + j) / 4;
            memcpy(va, a + j, 4);
            memcpy(vb, b + j, 4);
        }
    }
    if (L->check && ((st = pdp__ckpt_crc_check(fn, path, e, crc_a)) != PDP_OK ||
                     (st = pdp__ckpt_crc_check(fn, path, own, crc_b)) != PDP_OK))
        return st; /* corruption first: it would explain a difference */
    if (first == UINT64_MAX) return PDP_OK;
    pdp__ckpt_index_text(sa, sizeof sa, pe->ndim, pe->shape, (int64_t)first);
    return pdp__err(PDP_ERR_FORMAT, "%s: %s: tensor \"%s\" differs from \"%s\" at %s (%.9g, "
                    "%.9g): the head is tied to that parameter, so the two must be equal", fn,
                    path, e->name, own->name, sa, pdp__ckpt_f32le(va), pdp__ckpt_f32le(vb));
}

/* A "<prefix>.attn.bias" the model lacks (pdp__ckpt_mask_name): F32 [1, 1, S, S] holding
   exactly the causal mask, 1 on and below the diagonal and 0 above (+0, bit for bit), as
   nanoGPT's torch.tril(torch.ones(S, S)); streamed through the loader's chunk, its checksum
   verified when the file has them. Anything else is an extra tensor (PDP_ERR_SHAPE). */
PDP__PRIVATE pdp_status pdp__ckpt_check_mask(const pdp__ckpt_loader *L, const pdp__st_entry *e)
{
    const char *fn = L->fn, *path = L->path;
    unsigned char *c = L->sums->chunk;
    uint64_t bytes = e->end - e->begin, done, n, j;
    int64_t S = e->ndim == 4 ? e->shape[3] : 0, i, bad = -1;
    uint32_t crc = 0, one = 0x3f800000u; /* 1.0f */
    char why[256], at[128];
    pdp_status st;
    double v = 0.0;
    if (strcmp(e->dtype, "F32") != 0 || e->ndim != 4 || e->shape[0] != 1 || e->shape[1] != 1 ||
        e->shape[2] != S || S < 1) {
        pdp__shape_text(at, sizeof at, e->ndim, e->shape);
        snprintf(why, sizeof why, "it is %s %s", e->dtype, at);
    } else {
        for (done = 0; done < bytes; done += n) {
            n = PDP__MIN(bytes - done, (uint64_t)PDP__CKPT_CHUNK);
            if ((st = pdp__ckpt_read_bytes(L, e, done, c, (size_t)n, &crc)) != PDP_OK)
                return st;
            for (j = 0; j < n && bad < 0; j += 4) { /* element i: row i / S, column i % S */
                i = (int64_t)((done + j) / 4);
                if (pdp__ckpt_u32le(c + j) != (i % S <= i / S ? one : 0u)) {
                    bad = i;
                    v = pdp__ckpt_f32le(c + j);
                }
            }
        }
        if (L->check && (st = pdp__ckpt_crc_check(fn, path, e, crc)) != PDP_OK) return st;
        if (bad < 0) return PDP_OK;
        pdp__ckpt_index_text(at, sizeof at, e->ndim, e->shape, bad);
        snprintf(why, sizeof why, "element %s is %.9g, the mask's is %d", at, v,
                 bad % S <= bad / S);
    }
    return pdp__err(PDP_ERR_SHAPE, "%s: %s: tensor \"%s\" is not in the model and is not the "
                    "causal mask nanoGPT keeps under that name (F32 [1, 1, S, S], 1 on and below "
                    "the diagonal, 0 above): %s", fn, path, e->name, why);
}

/* No tensor in the file that the model (or the optimizer) does not have, but nanoGPT's
   two (checkpoint.h): the tied head's alias (checked against the parameter) and
   causal-mask buffers (checked, then skipped). */
PDP__PRIVATE pdp_status pdp__ckpt_load_extra(const pdp__ckpt_loader *L)
{
    pdp_status st;
    int i;
    for (i = 0; i < L->p.nentries; i++) {
        const pdp__st_entry *e = &L->p.entries[i];
        const char *name = e->name;
        if (L->shard ? pdp__ckpt_shard_expected(L->o, name)
                     : pdp__ckpt_expected(L->m, L->o, name))
            continue;
        if (!L->shard && L->alias >= 0 && strcmp(name, PDP__CKPT_HEAD_ALIAS) == 0)
            st = pdp__ckpt_load_alias(L, e);
        else if (!L->shard && pdp__ckpt_mask_name(L->m, name))
            st = pdp__ckpt_check_mask(L, e);
        else
            st = pdp__err(PDP_ERR_SHAPE, "%s: %s: tensor \"%s\" is not in the %s", L->fn,
                          L->path, name,
                          strncmp(name, "optim.", 6) == 0 ? "optimizer's state" : "model");
        if (st != PDP_OK) return st;
    }
    return PDP_OK;
}

/* All checks passed: the staged parameters and state onto the model's device, the
   model's seed and step, the optimizer's hyper-parameters and step count. */
PDP__PRIVATE pdp_status pdp__ckpt_load_commit(pdp__ckpt_loader *L)
{
    pdp_model *m = L->m;
    pdp_optim *o = L->o;
    int64_t count = L->count;
    pdp_status st;
    int k;
    if (L->with_params && count &&
        (st = pdp__dev_copy(m->device, L->params, pdp_cpu(), L->staging, (size_t)count * 4)) !=
            PDP_OK)
        return pdp__err_wrap(st, "%s: %s: copying the parameters to the device failed; they "
                             "may be partly loaded", L->fn, L->path);
    if (L->with_params && L->have_seed) m->seed = L->seed; /* the dropout stream, exact resume */
    if (L->with_params && L->have_step) m->step = L->mstep;
    if (!o) return PDP_OK;
    for (k = 0; k < L->nstate; k++)
        if (count && (st = pdp__dev_copy(m->device, o->state[k] + (L->lo - o->lo), pdp_cpu(),
                                         L->staging + (k + 1) * count, (size_t)count * 4)) !=
                         PDP_OK)
            return pdp__err_wrap(st, "%s: %s: copying the optimizer state to the device "
                                 "failed; the parameters are loaded, the state may be partly "
                                 "loaded", L->fn, L->path);
    o->desc = L->desc;
    o->steps = L->steps;
    return PDP_OK;
}

/* Closes the file and frees what the steps allocated (after a failure too). */
PDP__PRIVATE void pdp__ckpt_load_close(pdp__ckpt_loader *L)
{
    if (L->f) fclose(L->f);
    pdp__st_parser_free(&L->p);
    pdp__dealloc(L->header);
    pdp__dealloc(L->sorted);
    pdp__dealloc(L->staging);
    pdp__dealloc(L->sums);
}

/* Loads the parameters [lo, hi) into params (when with_params) and o's state
   for [lo, hi) (o may be NULL) from a full checkpoint (its slice) or, when
   allow_shard, from a shard file of exactly [lo, hi); with run, only from a
   shard file of exactly [lo, hi) whose "shard.run" is run. */
PDP__PRIVATE pdp_status pdp__ckpt_load(const char *path, pdp_model *m, float *params,
                                       bool with_params, pdp_optim *o, int64_t lo, int64_t hi,
                                       bool allow_shard, const char *run, const char *fn)
{
    pdp__ckpt_loader L;
    pdp_status st;
    memset(&L, 0, sizeof L);
    L.path = path;
    L.fn = fn;
    L.run = run;
    L.m = m;
    L.o = o;
    L.params = params;
    L.with_params = with_params;
    L.allow_shard = allow_shard;
    L.lo = lo;
    L.hi = hi;
    L.count = hi - lo;
    L.nstate = o ? o->nstate : 0;
    L.alias = pdp__ckpt_alias_param(m);
    if ((st = pdp__ckpt_load_open(&L)) == PDP_OK &&    /* the header, parsed and validated */
        (st = pdp__ckpt_load_sums(&L)) == PDP_OK &&    /* its checksums */
        (st = pdp__ckpt_load_meta(&L)) == PDP_OK &&    /* the optimizer, seed and step */
        (st = pdp__ckpt_load_kind(&L)) == PDP_OK &&    /* full or shard; the shard's range */
        (st = pdp__ckpt_load_tensors(&L)) == PDP_OK && /* checked, read and CRC'd into staging */
        (st = pdp__ckpt_load_extra(&L)) == PDP_OK)     /* nothing the model lacks */
        st = pdp__ckpt_load_commit(&L);                /* into the model and the optimizer */
    pdp__ckpt_load_close(&L);
    return st;
}

PDP_API pdp_status pdp_checkpoint_load(const char *path, pdp_model *m, pdp_optim *o)
{
    const char *fn = "pdp_checkpoint_load";
    pdp_status st;
    if ((st = pdp__ckpt_whole_args(path, m, o, fn)) != PDP_OK) return st;
    if ((st = pdp__ckpt_load(path, m, m->param_block, true, o, 0, m->param_count, false, NULL,
                             fn)) == PDP_OK)
        m->sliced_world = m->sliced_rank = 0; /* every parameter written: whole again */
    return st;
}

PDP__PRIVATE pdp_status pdp__checkpoint_load_run(const char *path, pdp_model *m, float *params,
                                                 pdp_optim *o, int64_t lo, int64_t hi,
                                                 const char *run, const char *fn)
{
    pdp_status st = pdp__ckpt_range_args(path, m, params, o, lo, hi, fn);
    if (st != PDP_OK) return st;
    return pdp__ckpt_load(path, m, params, params != NULL, o, lo, hi, true, run, fn);
}

PDP__PRIVATE pdp_status pdp__checkpoint_load_range(const char *path, pdp_model *m, float *params,
                                                   pdp_optim *o, int64_t lo, int64_t hi,
                                                   const char *fn)
{
    return pdp__checkpoint_load_run(path, m, params, o, lo, hi, NULL, fn);
}
