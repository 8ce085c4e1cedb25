/* json: the reader of a safetensors header, a small strict JSON parser.

   Format (https://github.com/huggingface/safetensors, "Format"): the header is
   one JSON object: tensor name -> {"dtype": "F32", "shape": [..],
   "data_offsets": [begin, end]} with offsets relative to the data start, plus
   an optional "__metadata__" object of string -> string. Names are unique; the
   tensors' byte ranges must tile the data section exactly (no gap, no
   overlap); trailing spaces pad the header.

   Invariants: the parser accepts only what the format needs (objects, strings,
   non-negative integers, arrays of them), holds no recursion, and bounds every
   count by the header length; decoded strings live in one arena no longer than
   the header. Messages start with the caller's public function (fn) and name
   the file and the header byte. Used by checkpoint.c. */

#include "internal.h"

#define PDP__CKPT_MAX_DIMS 16

/* ---- json: header parser ---- */

typedef struct pdp__st_entry {
    const char *name;           /* decoded, NUL-terminated, in the parser's arena */
    const char *dtype;
    int ndim;
    int64_t shape[PDP__CKPT_MAX_DIMS];
    uint64_t begin, end;        /* data_offsets */
    uint32_t crc;               /* its checksum, when has_crc (set by checkpoint.c) */
    bool has_crc;
} pdp__st_entry;

typedef struct pdp__st_parser {
    const char *s;              /* the header */
    size_t n, pos;
    char *arena;                /* decoded strings; never longer than their source */
    size_t arena_used;
    pdp__st_entry *entries;
    int nentries, cap_entries;
    const char **meta;          /* key, value, key, value, ... */
    int nmeta, cap_meta;
    const char *file;           /* for messages */
    const char *fn;             /* the public caller, for messages */
} pdp__st_parser;

PDP__PRIVATE pdp_status pdp__st_fail(const pdp__st_parser *p, const char *what)
{
    return pdp__err(PDP_ERR_FORMAT, "%s: %s: header byte %zu: %s", p->fn, p->file, p->pos, what);
}

PDP__PRIVATE void pdp__st_ws(pdp__st_parser *p)
{
    while (p->pos < p->n && (p->s[p->pos] == ' ' || p->s[p->pos] == '\t' ||
                             p->s[p->pos] == '\n' || p->s[p->pos] == '\r'))
        p->pos++;
}

/* Skips whitespace, then consumes c or fails. */
PDP__PRIVATE bool pdp__st_expect(pdp__st_parser *p, char c)
{
    pdp__st_ws(p);
    if (p->pos < p->n && p->s[p->pos] == c) {
        p->pos++;
        return true;
    }
    return false;
}

PDP__PRIVATE int pdp__st_hex(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* A JSON string, decoded into the arena as UTF-8 (\uXXXX escapes, surrogate
   pairs included). */
PDP__PRIVATE pdp_status pdp__st_string(pdp__st_parser *p, const char **out)
{
    char *o = p->arena + p->arena_used;
    size_t len = 0;
    if (!pdp__st_expect(p, '"')) return pdp__st_fail(p, "expected a string");
    for (;;) {
        unsigned char c;
        if (p->pos >= p->n) return pdp__st_fail(p, "unterminated string");
        c = (unsigned char)p->s[p->pos++];
        if (c == '"') break;
        if (c < 0x20) return pdp__st_fail(p, "control character in a string");
        if (c != '\\') {
            o[len++] = (char)c;
            continue;
        }
        if (p->pos >= p->n) return pdp__st_fail(p, "unterminated escape");
        c = (unsigned char)p->s[p->pos++];
        switch (c) {
        case '"': case '\\': case '/': o[len++] = (char)c; break;
        case 'b': o[len++] = '\b'; break;
        case 'f': o[len++] = '\f'; break;
        case 'n': o[len++] = '\n'; break;
        case 'r': o[len++] = '\r'; break;
        case 't': o[len++] = '\t'; break;
        case 'u': {
            uint32_t cp = 0;
            int i, h, pair;
            for (pair = 0; pair < 2; pair++) {
                uint32_t u = 0;
                if (p->n - p->pos < 4) return pdp__st_fail(p, "short \\u escape");
                for (i = 0; i < 4; i++) {
                    if ((h = pdp__st_hex(p->s[p->pos++])) < 0)
                        return pdp__st_fail(p, "bad \\u escape");
                    u = u * 16 + (uint32_t)h;
                }
                if (pair == 0) {
                    cp = u;
                    if (u >= 0xdc00 && u <= 0xdfff) return pdp__st_fail(p, "lone low surrogate");
                    if (u < 0xd800 || u > 0xdbff) break;
                    if (p->n - p->pos < 2 || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u')
                        return pdp__st_fail(p, "lone high surrogate");
                    p->pos += 2;
                } else {
                    if (u < 0xdc00 || u > 0xdfff) return pdp__st_fail(p, "bad surrogate pair");
                    cp = 0x10000 + ((cp - 0xd800) << 10) + (u - 0xdc00);
                }
            }
            if (cp == 0) return pdp__st_fail(p, "NUL in a string");
            /* at most 4 output bytes for at least 6 (12 for a pair) input bytes */
            if (cp < 0x80) {
                o[len++] = (char)cp;
            } else if (cp < 0x800) {
                o[len++] = (char)(0xc0 | (cp >> 6));
                o[len++] = (char)(0x80 | (cp & 0x3f));
            } else if (cp < 0x10000) {
                o[len++] = (char)(0xe0 | (cp >> 12));
                o[len++] = (char)(0x80 | ((cp >> 6) & 0x3f));
                o[len++] = (char)(0x80 | (cp & 0x3f));
            } else {
                o[len++] = (char)(0xf0 | (cp >> 18));
                o[len++] = (char)(0x80 | ((cp >> 12) & 0x3f));
                o[len++] = (char)(0x80 | ((cp >> 6) & 0x3f));
                o[len++] = (char)(0x80 | (cp & 0x3f));
            }
            break;
        }
        default: return pdp__st_fail(p, "unknown escape");
        }
    }
    o[len] = '\0';
    p->arena_used += len + 1;
    *out = o;
    return PDP_OK;
}

/* A non-negative integer without sign, fraction, exponent or leading zeros. */
PDP__PRIVATE pdp_status pdp__st_uint(pdp__st_parser *p, uint64_t *out)
{
    uint64_t v = 0;
    size_t start;
    pdp__st_ws(p);
    start = p->pos;
    while (p->pos < p->n && p->s[p->pos] >= '0' && p->s[p->pos] <= '9') {
        unsigned d = (unsigned)(p->s[p->pos] - '0');
        if (v > (UINT64_MAX - d) / 10) return pdp__st_fail(p, "integer overflows 64 bits");
        v = v * 10 + d;
        p->pos++;
    }
    if (p->pos == start) return pdp__st_fail(p, "expected a non-negative integer");
    if (p->s[start] == '0' && p->pos - start > 1) return pdp__st_fail(p, "leading zero");
    if (p->pos < p->n && (p->s[p->pos] == '.' || p->s[p->pos] == 'e' || p->s[p->pos] == 'E'))
        return pdp__st_fail(p, "expected an integer");
    *out = v;
    return PDP_OK;
}

/* [u, u, ...] with at most max elements. */
PDP__PRIVATE pdp_status pdp__st_uint_array(pdp__st_parser *p, uint64_t *out, int max, int *count)
{
    pdp_status st;
    *count = 0;
    if (!pdp__st_expect(p, '[')) return pdp__st_fail(p, "expected '['");
    if (pdp__st_expect(p, ']')) return PDP_OK;
    for (;;) {
        if (*count == max) return pdp__st_fail(p, "array too long");
        if ((st = pdp__st_uint(p, &out[(*count)++])) != PDP_OK) return st;
        if (pdp__st_expect(p, ']')) return PDP_OK;
        if (!pdp__st_expect(p, ',')) return pdp__st_fail(p, "expected ',' or ']'");
    }
}

/* {"dtype": s, "shape": [..], "data_offsets": [b, e]}, each key exactly once. */
PDP__PRIVATE pdp_status pdp__st_tensor(pdp__st_parser *p, pdp__st_entry *e)
{
    bool have_dtype = false, have_shape = false, have_offsets = false;
    uint64_t v[PDP__CKPT_MAX_DIMS];
    const char *key;
    int i, n;
    pdp_status st;
    if (!pdp__st_expect(p, '{')) return pdp__st_fail(p, "expected '{' (tensor info)");
    if (pdp__st_expect(p, '}')) return pdp__st_fail(p, "empty tensor info");
    for (;;) {
        if ((st = pdp__st_string(p, &key)) != PDP_OK) return st;
        if (!pdp__st_expect(p, ':')) return pdp__st_fail(p, "expected ':'");
        if (strcmp(key, "dtype") == 0 && !have_dtype) {
            if ((st = pdp__st_string(p, &e->dtype)) != PDP_OK) return st;
            have_dtype = true;
        } else if (strcmp(key, "shape") == 0 && !have_shape) {
            if ((st = pdp__st_uint_array(p, v, PDP__CKPT_MAX_DIMS, &n)) != PDP_OK) return st;
            for (i = 0; i < n; i++) {
                if (v[i] > (uint64_t)INT64_MAX) return pdp__st_fail(p, "dimension too large");
                e->shape[i] = (int64_t)v[i];
            }
            e->ndim = n;
            have_shape = true;
        } else if (strcmp(key, "data_offsets") == 0 && !have_offsets) {
            if ((st = pdp__st_uint_array(p, v, 2, &n)) != PDP_OK) return st;
            if (n != 2) return pdp__st_fail(p, "data_offsets needs 2 integers");
            e->begin = v[0];
            e->end = v[1];
            have_offsets = true;
        } else {
            return pdp__st_fail(p, "unknown or repeated key in tensor info");
        }
        if (pdp__st_expect(p, '}')) break;
        if (!pdp__st_expect(p, ',')) return pdp__st_fail(p, "expected ',' or '}'");
    }
    if (!have_dtype || !have_shape || !have_offsets)
        return pdp__st_fail(p, "tensor info needs dtype, shape and data_offsets");
    return PDP_OK;
}

/* {"key": "value", ...} */
PDP__PRIVATE pdp_status pdp__st_metadata(pdp__st_parser *p)
{
    pdp_status st;
    if (p->meta) return pdp__st_fail(p, "__metadata__ twice");
    p->cap_meta = (int)(p->n / 6 + 1) * 2; /* "k":"v", takes at least 6 bytes */
    p->meta = (const char **)pdp__alloc((size_t)p->cap_meta * sizeof *p->meta);
    if (!p->meta)
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: %s: no memory for the metadata", p->fn,
                        p->file);
    if (!pdp__st_expect(p, '{')) return pdp__st_fail(p, "expected '{' (__metadata__)");
    if (pdp__st_expect(p, '}')) return PDP_OK;
    for (;;) {
        PDP_ASSERT(p->nmeta + 2 <= p->cap_meta);
        if ((st = pdp__st_string(p, &p->meta[p->nmeta])) != PDP_OK) return st;
        if (!pdp__st_expect(p, ':')) return pdp__st_fail(p, "expected ':'");
        if ((st = pdp__st_string(p, &p->meta[p->nmeta + 1])) != PDP_OK) return st;
        p->nmeta += 2;
        if (pdp__st_expect(p, '}')) return PDP_OK;
        if (!pdp__st_expect(p, ',')) return pdp__st_fail(p, "expected ',' or '}'");
    }
}

/* The whole header. Allocations (arena, entries, metadata) are freed by
   pdp__st_parser_free, also after a failure. */
PDP__PRIVATE pdp_status pdp__st_parse(pdp__st_parser *p)
{
    const char *key;
    pdp_status st;
    p->arena = (char *)pdp__alloc(p->n + 1);
    /* the shortest entry, "":{"dtype":"","shape":[],"data_offsets":[0,0]}, has 45 bytes */
    p->cap_entries = (int)(p->n / 45 + 1);
    p->entries = (pdp__st_entry *)pdp__calloc((size_t)p->cap_entries * sizeof *p->entries);
    if (!p->arena || !p->entries)
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: %s: no memory for a %zu-byte header", p->fn,
                        p->file, p->n);
    if (!pdp__st_expect(p, '{')) return pdp__st_fail(p, "expected '{' (not a safetensors file?)");
    if (!pdp__st_expect(p, '}')) {
        for (;;) {
            if ((st = pdp__st_string(p, &key)) != PDP_OK) return st;
            if (!pdp__st_expect(p, ':')) return pdp__st_fail(p, "expected ':'");
            if (strcmp(key, "__metadata__") == 0) {
                if ((st = pdp__st_metadata(p)) != PDP_OK) return st;
            } else {
                pdp__st_entry *e;
                if (p->nentries == p->cap_entries) return pdp__st_fail(p, "too many tensors");
                e = &p->entries[p->nentries++];
                e->name = key;
                if ((st = pdp__st_tensor(p, e)) != PDP_OK) return st;
            }
            if (pdp__st_expect(p, '}')) break;
            if (!pdp__st_expect(p, ',')) return pdp__st_fail(p, "expected ',' or '}'");
        }
    }
    pdp__st_ws(p);
    if (p->pos != p->n) return pdp__st_fail(p, "bytes after the header object");
    return PDP_OK;
}

PDP__PRIVATE void pdp__st_parser_free(pdp__st_parser *p)
{
    pdp__dealloc(p->arena);
    pdp__dealloc(p->entries);
    pdp__dealloc((void *)p->meta);
}

PDP__PRIVATE const char *pdp__st_meta(const pdp__st_parser *p, const char *key)
{
    int i;
    for (i = 0; i < p->nmeta; i += 2)
        if (strcmp(p->meta[i], key) == 0) return p->meta[i + 1];
    return NULL;
}

/* Bytes per element of a safetensors dtype; 0 when unknown. */
PDP__PRIVATE int pdp__st_dtype_bytes(const char *d)
{
    static const char *const names[] = {"F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8",
                                        "U64", "U32", "U16", "U8", "BOOL", "F8_E4M3", "F8_E5M2"};
    static const int bytes[] = {8, 4, 2, 2, 8, 4, 2, 1, 8, 4, 2, 1, 1, 1, 1};
    size_t i;
    for (i = 0; i < sizeof bytes / sizeof bytes[0]; i++)
        if (strcmp(d, names[i]) == 0) return bytes[i];
    return 0;
}

PDP__PRIVATE int pdp__st_by_begin(const void *a, const void *b)
{
    const pdp__st_entry *x = *(const pdp__st_entry *const *)a;
    const pdp__st_entry *y = *(const pdp__st_entry *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

PDP__PRIVATE int pdp__st_by_name(const void *a, const void *b)
{
    const pdp__st_entry *x = *(const pdp__st_entry *const *)a;
    const pdp__st_entry *y = *(const pdp__st_entry *const *)b;
    return strcmp(x->name, y->name);
}

/* Per-entry checks (known dtype, byte count = elements * size, inside the data),
   unique names, and exact tiling of the data section. sorted gets the entries
   by name. */
PDP__PRIVATE pdp_status pdp__st_validate(const pdp__st_parser *p, uint64_t data_bytes,
                                         pdp__st_entry **sorted)
{
    const char *fn = p->fn;
    uint64_t at = 0;
    int i, d;
    for (i = 0; i < p->nentries; i++) {
        const pdp__st_entry *e = &p->entries[i];
        uint64_t bytes = (uint64_t)pdp__st_dtype_bytes(e->dtype);
        if (!bytes)
            return pdp__err(PDP_ERR_FORMAT, "%s: %s: tensor \"%s\": unknown dtype \"%s\"", fn,
                            p->file, e->name, e->dtype);
        for (d = 0; d < e->ndim; d++) {
            if (e->shape[d] && bytes > UINT64_MAX / (uint64_t)e->shape[d])
                return pdp__err(PDP_ERR_FORMAT, "%s: %s: tensor \"%s\": shape overflows", fn,
                                p->file, e->name);
            bytes *= (uint64_t)e->shape[d];
        }
        if (e->end < e->begin || e->end > data_bytes)
            return pdp__err(PDP_ERR_FORMAT,
                            "%s: %s: tensor \"%s\": data_offsets [%llu, %llu] outside the %llu "
                            "data bytes (truncated file?)", fn, p->file, e->name,
                            (unsigned long long)e->begin, (unsigned long long)e->end,
                            (unsigned long long)data_bytes);
        if (e->end - e->begin != bytes)
            return pdp__err(PDP_ERR_FORMAT,
                            "%s: %s: tensor \"%s\": data_offsets hold %llu bytes, its dtype and "
                            "shape need %llu", fn, p->file, e->name,
                            (unsigned long long)(e->end - e->begin), (unsigned long long)bytes);
        sorted[i] = &p->entries[i];
    }
    /* a name twice first: its two entries would otherwise be reported as an overlap */
    qsort(sorted, (size_t)p->nentries, sizeof *sorted, pdp__st_by_name);
    for (i = 1; i < p->nentries; i++)
        if (strcmp(sorted[i - 1]->name, sorted[i]->name) == 0)
            return pdp__err(PDP_ERR_FORMAT, "%s: %s: tensor \"%s\" appears twice", fn, p->file,
                            sorted[i]->name);
    qsort(sorted, (size_t)p->nentries, sizeof *sorted, pdp__st_by_begin);
    for (i = 0; i < p->nentries; i++) {
        if (sorted[i]->begin != at)
            return pdp__err(PDP_ERR_FORMAT, "%s: %s: tensor \"%s\" starts at data byte %llu, "
                            "expected %llu (overlap or gap)", fn, p->file, sorted[i]->name,
                            (unsigned long long)sorted[i]->begin, (unsigned long long)at);
        at = sorted[i]->end;
    }
    if (at != data_bytes)
        return pdp__err(PDP_ERR_FORMAT, "%s: %s: tensors cover %llu of the %llu data bytes", fn,
                        p->file, (unsigned long long)at, (unsigned long long)data_bytes);
    qsort(sorted, (size_t)p->nentries, sizeof *sorted, pdp__st_by_name);
    return PDP_OK;
}

PDP__PRIVATE const pdp__st_entry *pdp__st_find(pdp__st_entry *const *sorted, int n,
                                               const char *name)
{
    int lo = 0, hi = n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2, c = strcmp(sorted[mid]->name, name);
        if (c == 0) return sorted[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    return NULL;
}

