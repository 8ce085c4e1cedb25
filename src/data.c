/* data: the IDX reader, gzip and DEFLATE decoding, the synthetic task, the
   batcher.

   The inflater decodes a whole DEFLATE stream (RFC 1951: stored, fixed-Huffman
   and dynamic-Huffman blocks) from memory into one growing output buffer, so a
   back-reference is checked against everything written so far instead of a
   32 KiB window. Huffman codes decode through a 2^PDP__FAST_BITS-entry table for
   short codes and the canonical count/symbol walk (as in zlib's puff.c) for the
   rest. Bits come LSB-first from a 64-bit buffer that is topped up before each
   symbol; past the end of the input it is filled with zeros, and consuming any
   of those zeros is reported as a truncated stream. Every length, distance and
   code set is checked before use: hostile input yields PDP_ERR_FORMAT, never an
   out-of-bounds access, and the output is capped at PDP_MAX_FILE_BYTES. The
   gzip wrapper (RFC 1952) parses FEXTRA, FNAME, FCOMMENT and FHCRC, verifies
   CRC-32 and ISIZE per member, and accepts concatenated members as gzip does.

   IDX (LeCun et al., "The MNIST database"): a big-endian magic 0x0000TTDD (type
   TT = 0x08 unsigned byte, DD dimensions), DD big-endian 32-bit sizes, then the
   bytes. A dataset keeps pixels as floats, [count, features]. */

#include "internal.h"

/* Largest file (after decompression) the loaders accept. */
#ifndef PDP_MAX_FILE_BYTES
#  define PDP_MAX_FILE_BYTES ((size_t)0xffffffffu)
#endif

#define PDP__FAST_BITS 10

/* ---- crc32 ---- */

/* CRC-32 of ISO 3309 / ITU-T V.42 (reflected polynomial 0xEDB88320), as gzip
   stores it. The table is built by the caller, once per decode. */
static void pdp__crc32_table(uint32_t table[256])
{
    uint32_t i, c;
    int k;
    for (i = 0; i < 256; i++) {
        c = i;
        for (k = 0; k < 8; k++) c = (c & 1) ? 0xedb88320u ^ (c >> 1) : c >> 1;
        table[i] = c;
    }
}

static uint32_t pdp__crc32(const uint32_t table[256], uint32_t crc, const uint8_t *p, size_t n)
{
    size_t i;
    crc = ~crc;
    for (i = 0; i < n; i++) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
    return ~crc;
}

/* ---- inflate: state and bit input ---- */

typedef struct pdp__huff {
    uint16_t fast[1 << PDP__FAST_BITS]; /* symbol | length << 9 for codes of at most
                                           PDP__FAST_BITS bits, by bit-reversed code; 0 = none */
    uint16_t count[16];                 /* number of codes of each length */
    uint16_t symbol[288];               /* symbols in canonical code order */
} pdp__huff;

typedef struct pdp__inflate {
    const uint8_t *in;
    size_t in_len;
    size_t pos;      /* next input byte to load; bytes past in_len are loaded as zeros */
    uint64_t bits;   /* unconsumed bits, next bit in bit 0 */
    int nbits;
    uint8_t *out;    /* pdp__alloc'd, out_cap bytes, out_len used */
    size_t out_len, out_cap;
    pdp__huff lencode, distcode;
    const char *fn, *path; /* for messages */
} pdp__inflate;

static pdp_status pdp__inf_corrupt(const pdp__inflate *s, const char *what)
{
    return pdp__err(PDP_ERR_FORMAT, "%s: %s: corrupt gzip data (%s at byte %zu)", s->fn, s->path,
                    what, s->pos - (size_t)(s->nbits / 8));
}

/* Tops the bit buffer up to at least 57 bits; fails once the stream has consumed
   any of the zero bytes that stand in for input past the end. */
static pdp_status pdp__inf_refill(pdp__inflate *s)
{
    while (s->nbits <= 56) {
        uint64_t byte = s->pos < s->in_len ? s->in[s->pos] : 0;
        s->pos++;
        s->bits |= byte << s->nbits;
        s->nbits += 8;
    }
    if (s->pos > s->in_len && (s->pos - s->in_len) * 8 > (size_t)s->nbits)
        return pdp__err(PDP_ERR_FORMAT, "%s: %s: truncated gzip data (the DEFLATE stream ends "
                        "early)", s->fn, s->path);
    return PDP_OK;
}

/* n <= 32 bits, LSB first; the caller has refilled enough. */
static uint32_t pdp__inf_bits(pdp__inflate *s, int n)
{
    uint32_t v = (uint32_t)(s->bits & ((1ull << n) - 1));
    s->bits >>= n;
    s->nbits -= n;
    return v;
}

/* Makes room for `more` output bytes, doubling the buffer. */
static pdp_status pdp__inf_room(pdp__inflate *s, size_t more)
{
    size_t need, cap;
    uint8_t *bigger;
    if (s->out_cap - s->out_len >= more) return PDP_OK;
    need = s->out_len + more;
    if (need > PDP_MAX_FILE_BYTES || need < s->out_len)
        return pdp__err(PDP_ERR_FORMAT, "%s: %s: decompresses to more than %zu bytes", s->fn,
                        s->path, (size_t)PDP_MAX_FILE_BYTES);
    cap = s->out_cap > PDP_MAX_FILE_BYTES / 2 ? PDP_MAX_FILE_BYTES : PDP__MAX(s->out_cap * 2, 4096);
    if (cap < need) cap = need;
    if (!(bigger = (uint8_t *)pdp__alloc(cap)))
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: %s: no memory for %zu decompressed bytes",
                        s->fn, s->path, cap);
    if (s->out_len) memcpy(bigger, s->out, s->out_len);
    pdp__dealloc(s->out);
    s->out = bigger;
    s->out_cap = cap;
    return PDP_OK;
}

/* ---- inflate: Huffman codes ---- */

/* Builds the code for lens[0..n). Returns 0 for a complete code, 1 for an
   incomplete one that is allowed (no code at all, or one code of length 1, as
   zlib allows), -1 for an over-subscribed or otherwise incomplete set. */
static int pdp__huff_build(pdp__huff *h, const uint8_t *lens, int n)
{
    uint16_t offs[16], next[16];
    int len, sym, left = 1, codes = 0;
    uint32_t code = 0;
    memset(h->count, 0, sizeof h->count);
    memset(h->fast, 0, sizeof h->fast);
    for (sym = 0; sym < n; sym++) h->count[lens[sym]]++;
    h->count[0] = 0;
    for (len = 1; len <= 15; len++) {
        left = (left << 1) - h->count[len];
        codes += h->count[len];
        if (left < 0) return -1;
    }
    offs[1] = 0;
    for (len = 1; len < 15; len++) offs[len + 1] = (uint16_t)(offs[len] + h->count[len]);
    for (sym = 0; sym < n; sym++)
        if (lens[sym]) h->symbol[offs[lens[sym]]++] = (uint16_t)sym;
    /* canonical codes (RFC 1951 3.2.2), bit-reversed into the fast table */
    for (len = 1; len <= 15; len++) {
        code = (code + h->count[len - 1]) << 1;
        next[len] = (uint16_t)code;
    }
    for (sym = 0; sym < n; sym++) {
        uint32_t c, rev = 0;
        int i;
        len = lens[sym];
        if (!len) continue;
        c = next[len]++;
        if (len > PDP__FAST_BITS) continue;
        for (i = 0; i < len; i++) rev |= ((c >> i) & 1u) << (len - 1 - i);
        for (; rev < (1u << PDP__FAST_BITS); rev += 1u << len)
            h->fast[rev] = (uint16_t)(sym | len << 9);
    }
    if (left == 0) return 0;
    return (codes == 0 || (codes == 1 && h->count[1] == 1)) ? 1 : -1;
}

/* The next symbol, or -1 for a bit pattern that is no code. Needs 15 bits. */
static int pdp__huff_decode(pdp__inflate *s, const pdp__huff *h)
{
    uint32_t e = h->fast[s->bits & ((1u << PDP__FAST_BITS) - 1)];
    int len, code = 0, first = 0, index = 0;
    if (e) {
        pdp__inf_bits(s, (int)(e >> 9));
        return (int)(e & 511);
    }
    for (len = 1; len <= 15; len++) { /* canonical walk, one bit at a time */
        int count = h->count[len];
        code |= (int)((s->bits >> (len - 1)) & 1);
        if (code - first < count) {
            pdp__inf_bits(s, len);
            return h->symbol[index + code - first];
        }
        index += count;
        first = (first + count) << 1;
        code <<= 1;
    }
    return -1;
}

/* ---- inflate: blocks ---- */

static const uint16_t pdp__len_base[29] = {3,  4,  5,  6,  7,  8,  9,  10, 11,  13,
                                           15, 17, 19, 23, 27, 31, 35, 43, 51,  59,
                                           67, 83, 99, 115, 131, 163, 195, 227, 258};
static const uint8_t pdp__len_extra[29] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2,
                                           2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0};
static const uint16_t pdp__dist_base[30] = {1,    2,    3,    4,    5,    7,     9,     13,
                                            17,   25,   33,   49,   65,   97,    129,   193,
                                            257,  385,  513,  769,  1025, 1537,  2049,  3073,
                                            4097, 6145, 8193, 12289, 16385, 24577};
static const uint8_t pdp__dist_extra[30] = {0, 0, 0, 0, 1, 1, 2, 2,  3,  3,  4,  4,  5,  5,  6,
                                            6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13};

static pdp_status pdp__inf_stored(pdp__inflate *s)
{
    size_t p, len;
    pdp_status st;
    pdp__inf_bits(s, s->nbits & 7); /* to a byte boundary */
    p = s->pos - (size_t)(s->nbits / 8);
    s->bits = 0;
    s->nbits = 0;
    if (p > s->in_len || s->in_len - p < 4) {
        s->pos = PDP__MIN(p, s->in_len);
        return pdp__err(PDP_ERR_FORMAT, "%s: %s: truncated gzip data (stored block header)",
                        s->fn, s->path);
    }
    len = (size_t)s->in[p] | (size_t)s->in[p + 1] << 8;
    if ((len ^ 0xffffu) != ((size_t)s->in[p + 2] | (size_t)s->in[p + 3] << 8)) {
        s->pos = p;
        return pdp__inf_corrupt(s, "stored block length and its complement disagree");
    }
    p += 4;
    s->pos = p;
    if (s->in_len - p < len)
        return pdp__err(PDP_ERR_FORMAT, "%s: %s: truncated gzip data (stored block of %zu bytes)",
                        s->fn, s->path, len);
    if ((st = pdp__inf_room(s, len)) != PDP_OK) return st;
    memcpy(s->out + s->out_len, s->in + p, len);
    s->out_len += len;
    s->pos = p + len;
    return PDP_OK;
}

/* Literals and matches until end-of-block, with the codes in s->lencode/distcode. */
static pdp_status pdp__inf_codes(pdp__inflate *s)
{
    pdp_status st;
    for (;;) {
        int sym;
        size_t len, dist;
        if ((st = pdp__inf_refill(s)) != PDP_OK) return st;
        sym = pdp__huff_decode(s, &s->lencode);
        if (sym < 256) {
            if (sym < 0) return pdp__inf_corrupt(s, "invalid literal/length code");
            if (s->out_len == s->out_cap && (st = pdp__inf_room(s, 1)) != PDP_OK) return st;
            s->out[s->out_len++] = (uint8_t)sym;
            continue;
        }
        if (sym == 256) return PDP_OK;
        sym -= 257;
        if (sym >= 29) return pdp__inf_corrupt(s, "invalid length symbol");
        len = pdp__len_base[sym] + pdp__inf_bits(s, pdp__len_extra[sym]);
        sym = pdp__huff_decode(s, &s->distcode);
        if (sym < 0 || sym >= 30) return pdp__inf_corrupt(s, "invalid distance code");
        dist = pdp__dist_base[sym] + pdp__inf_bits(s, pdp__dist_extra[sym]);
        if (dist > s->out_len) return pdp__inf_corrupt(s, "distance too far back");
        if ((st = pdp__inf_room(s, len)) != PDP_OK) return st;
        {
            uint8_t *d = s->out + s->out_len;
            const uint8_t *from = d - dist;
            size_t i;
            if (dist >= len) memcpy(d, from, len);
            else for (i = 0; i < len; i++) d[i] = from[i]; /* overlapping: repeats */
            s->out_len += len;
        }
    }
}

static pdp_status pdp__inf_fixed(pdp__inflate *s)
{
    uint8_t lens[288];
    int i;
    for (i = 0; i < 144; i++) lens[i] = 8;
    for (; i < 256; i++) lens[i] = 9;
    for (; i < 280; i++) lens[i] = 7;
    for (; i < 288; i++) lens[i] = 8;
    pdp__huff_build(&s->lencode, lens, 288);
    for (i = 0; i < 30; i++) lens[i] = 5;
    pdp__huff_build(&s->distcode, lens, 30);
    return pdp__inf_codes(s);
}

static pdp_status pdp__inf_dynamic(pdp__inflate *s)
{
    static const uint8_t order[19] = {16, 17, 18, 0, 8, 7, 9, 6, 10, 5,
                                      11, 4, 12, 3, 13, 2, 14, 1, 15};
    uint8_t lens[286 + 30];
    int nlen, ndist, ncode, i, n;
    pdp_status st;
    if ((st = pdp__inf_refill(s)) != PDP_OK) return st;
    nlen = (int)pdp__inf_bits(s, 5) + 257;
    ndist = (int)pdp__inf_bits(s, 5) + 1;
    ncode = (int)pdp__inf_bits(s, 4) + 4;
    if (nlen > 286 || ndist > 30) return pdp__inf_corrupt(s, "too many length or distance codes");
    memset(lens, 0, sizeof lens);
    for (i = 0; i < ncode; i++) {
        if ((st = pdp__inf_refill(s)) != PDP_OK) return st;
        lens[order[i]] = (uint8_t)pdp__inf_bits(s, 3);
    }
    if (pdp__huff_build(&s->lencode, lens, 19) != 0)
        return pdp__inf_corrupt(s, "incomplete code-length code");
    for (i = 0; i < nlen + ndist;) {
        int sym, rep;
        uint8_t val = 0;
        if ((st = pdp__inf_refill(s)) != PDP_OK) return st;
        sym = pdp__huff_decode(s, &s->lencode);
        if (sym < 0) return pdp__inf_corrupt(s, "invalid code-length code");
        if (sym < 16) {
            lens[i++] = (uint8_t)sym;
            continue;
        }
        if (sym == 16) {
            if (i == 0) return pdp__inf_corrupt(s, "length repeat with no previous length");
            val = lens[i - 1];
            rep = 3 + (int)pdp__inf_bits(s, 2);
        } else if (sym == 17) {
            rep = 3 + (int)pdp__inf_bits(s, 3);
        } else {
            rep = 11 + (int)pdp__inf_bits(s, 7);
        }
        if (i + rep > nlen + ndist) return pdp__inf_corrupt(s, "code lengths overrun");
        for (n = 0; n < rep; n++) lens[i++] = val;
    }
    if (lens[256] == 0) return pdp__inf_corrupt(s, "no end-of-block code");
    if (pdp__huff_build(&s->lencode, lens, nlen) < 0)
        return pdp__inf_corrupt(s, "bad literal/length code lengths");
    if (pdp__huff_build(&s->distcode, lens + nlen, ndist) < 0)
        return pdp__inf_corrupt(s, "bad distance code lengths");
    return pdp__inf_codes(s);
}

/* One DEFLATE stream starting at byte s->pos; leaves s->pos on the byte after it. */
static pdp_status pdp__inflate_stream(pdp__inflate *s)
{
    int final, type;
    size_t p;
    pdp_status st;
    s->bits = 0;
    s->nbits = 0;
    do {
        if ((st = pdp__inf_refill(s)) != PDP_OK) return st;
        final = (int)pdp__inf_bits(s, 1);
        type = (int)pdp__inf_bits(s, 2);
        if (type == 0) st = pdp__inf_stored(s);
        else if (type == 1) st = pdp__inf_fixed(s);
        else if (type == 2) st = pdp__inf_dynamic(s);
        else return pdp__inf_corrupt(s, "reserved block type 3");
        if (st != PDP_OK) return st;
    } while (!final);
    pdp__inf_bits(s, s->nbits & 7);
    p = s->pos - (size_t)(s->nbits / 8); /* hand unread whole bytes back */
    if (p > s->in_len)
        return pdp__err(PDP_ERR_FORMAT, "%s: %s: truncated gzip data", s->fn, s->path);
    s->pos = p;
    s->bits = 0;
    s->nbits = 0;
    return PDP_OK;
}

/* ---- gzip ---- */

static uint32_t pdp__le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint32_t pdp__be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static bool pdp__is_gzip(const uint8_t *p, size_t n) { return n >= 2 && p[0] == 0x1f && p[1] == 0x8b; }

/* Decodes every gzip member of in[0..n) into *out (pdp__alloc'd, *out_len bytes). */
static pdp_status pdp__gunzip(const uint8_t *in, size_t n, uint8_t **out, size_t *out_len,
                              const char *fn, const char *path)
{
    pdp__inflate *s;
    uint32_t crc_table[256];
    size_t p = 0, hint;
    int member = 0;
    pdp_status st = PDP_OK;
    *out = NULL;
    *out_len = 0;
    if (!(s = (pdp__inflate *)pdp__calloc(sizeof *s)))
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: %s: no memory", fn, path);
    s->in = in;
    s->in_len = n;
    s->fn = fn;
    s->path = path;
    pdp__crc32_table(crc_table);
    /* the last member's ISIZE is the whole size for a one-member file: a good first guess */
    hint = n >= 4 ? pdp__le32(in + n - 4) : 0;
    if (hint > n * 1032 + 1024) hint = n * 4;
    if ((st = pdp__inf_room(s, PDP__MAX(hint, 1))) != PDP_OK) goto done; /* out never NULL */
    while (p < n) {
        size_t start = p, first = s->out_len;
        uint8_t flg;
        if (n - p < 18 || !pdp__is_gzip(in + p, n - p)) {
            st = pdp__err(PDP_ERR_FORMAT, "%s: %s: %s at byte %zu", fn, path,
                          member ? "trailing bytes after the gzip data" : "not a gzip file", p);
            goto done;
        }
        if (in[p + 2] != 8 || (in[p + 3] & 0xe0)) {
            st = pdp__err(PDP_ERR_FORMAT, "%s: %s: unsupported gzip method %d or flags 0x%02x",
                          fn, path, in[p + 2], in[p + 3]);
            goto done;
        }
        flg = in[p + 3];
        p += 10;
        if (flg & 4) { /* FEXTRA */
            size_t xlen = n - p >= 2 ? (size_t)in[p] | (size_t)in[p + 1] << 8 : n;
            if (n - p < 2 || n - p - 2 < xlen) goto truncated;
            p += 2 + xlen;
        }
        if (flg & 8) { /* FNAME */
            const uint8_t *z = (const uint8_t *)memchr(in + p, 0, n - p);
            if (!z) goto truncated;
            p = (size_t)(z - in) + 1;
        }
        if (flg & 16) { /* FCOMMENT */
            const uint8_t *z = (const uint8_t *)memchr(in + p, 0, n - p);
            if (!z) goto truncated;
            p = (size_t)(z - in) + 1;
        }
        if (flg & 2) { /* FHCRC: the low 16 bits of the header's CRC-32 */
            if (n - p < 2) goto truncated;
            if ((pdp__crc32(crc_table, 0, in + start, p - start) & 0xffffu) !=
                ((uint32_t)in[p] | (uint32_t)in[p + 1] << 8)) {
                st = pdp__err(PDP_ERR_FORMAT, "%s: %s: gzip header CRC mismatch", fn, path);
                goto done;
            }
            p += 2;
        }
        s->pos = p;
        if ((st = pdp__inflate_stream(s)) != PDP_OK) goto done;
        p = s->pos;
        if (n - p < 8) goto truncated;
        if (pdp__crc32(crc_table, 0, s->out + first, s->out_len - first) != pdp__le32(in + p)) {
            st = pdp__err(PDP_ERR_FORMAT, "%s: %s: gzip CRC-32 mismatch (member %d): the data is "
                          "corrupt", fn, path, member);
            goto done;
        }
        if ((uint32_t)(s->out_len - first) != pdp__le32(in + p + 4)) {
            st = pdp__err(PDP_ERR_FORMAT, "%s: %s: gzip length mismatch (member %d: %zu bytes, "
                          "ISIZE says %u)", fn, path, member, s->out_len - first,
                          (unsigned)pdp__le32(in + p + 4));
            goto done;
        }
        p += 8;
        member++;
    }
    *out = s->out;
    *out_len = s->out_len;
    s->out = NULL;
    goto done;
truncated:
    st = pdp__err(PDP_ERR_FORMAT, "%s: %s: truncated gzip file (%zu bytes)", fn, path, n);
done:
    pdp__dealloc(s->out);
    pdp__dealloc(s);
    return st;
}

/* ---- files ---- */

/* Reads a whole file, gunzipping it when it starts with the gzip magic. */
static pdp_status pdp__read_file(const char *path, uint8_t **data, size_t *bytes, const char *fn)
{
    FILE *f;
    long size;
    uint8_t *raw;
    size_t got;
    pdp_status st;
    *data = NULL;
    *bytes = 0;
    if (!(f = fopen(path, "rb")))
        return pdp__err(PDP_ERR_IO, "%s: cannot open %s: %s", fn, path, strerror(errno));
    if (fseek(f, 0, SEEK_END) != 0 || (size = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return pdp__err(PDP_ERR_IO, "%s: cannot size %s: %s", fn, path, strerror(errno));
    }
    if ((unsigned long)size > PDP_MAX_FILE_BYTES) {
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
    st = pdp__gunzip(raw, got, data, bytes, fn, path);
    pdp__dealloc(raw);
    return st;
}

/* ---- idx ---- */

/* Checks an IDX header of unsigned bytes with ndim dimensions against the file
   size; fills dims and the payload pointer. */
static pdp_status pdp__idx_parse(const uint8_t *d, size_t n, int ndim, uint64_t dims[3],
                                 const uint8_t **payload, const char *fn, const char *path)
{
    uint32_t magic, want = 0x800u | (uint32_t)ndim;
    uint64_t need = 1;
    size_t head = 4 + 4 * (size_t)ndim;
    int i;
    if (n < 4)
        return pdp__err(PDP_ERR_FORMAT, "%s: %s: truncated IDX header (%zu bytes)", fn, path, n);
    magic = pdp__be32(d);
    if (magic != want)
        return pdp__err(PDP_ERR_FORMAT, "%s: %s: bad magic 0x%08x (expected 0x%08x, an IDX %s file)",
                        fn, path, (unsigned)magic, (unsigned)want, ndim == 3 ? "image" : "label");
    if (n < head)
        return pdp__err(PDP_ERR_FORMAT, "%s: %s: truncated IDX header (%zu bytes)", fn, path, n);
    for (i = 0; i < ndim; i++) {
        dims[i] = pdp__be32(d + 4 + 4 * i);
        if (i > 0 && dims[i] == 0)
            return pdp__err(PDP_ERR_FORMAT, "%s: %s: dimension %d is 0", fn, path, i);
        if (dims[i] && need > UINT64_MAX / dims[i])
            return pdp__err(PDP_ERR_FORMAT, "%s: %s: dimensions overflow", fn, path);
        need *= dims[i];
    }
    if (need != n - head) {
        if (ndim == 3)
            return pdp__err(PDP_ERR_FORMAT, "%s: %s: %s: %llu x %llu x %llu needs %llu bytes of data, "
                            "the file has %zu", fn, path, need > n - head ? "truncated" : "size mismatch",
                            (unsigned long long)dims[0], (unsigned long long)dims[1],
                            (unsigned long long)dims[2], (unsigned long long)need, n - head);
        return pdp__err(PDP_ERR_FORMAT, "%s: %s: %s: %llu labels, the file has %zu bytes of them",
                        fn, path, need > n - head ? "truncated" : "size mismatch",
                        (unsigned long long)dims[0], n - head);
    }
    *payload = d + head;
    return PDP_OK;
}

/* An empty dataset of count samples with the given per-sample shape. */
static pdp_status pdp__dataset_new(pdp_dataset **out, int64_t count, int64_t h, int64_t w,
                                   const pdp_dataset_desc *desc, const char *fn)
{
    pdp_dataset *ds = (pdp_dataset *)pdp__calloc(sizeof *ds);
    bool flat = desc && desc->flat;
    *out = NULL;
    if (!ds) return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory", fn);
    ds->count = count;
    ds->features = h * w;
    ds->ndim = flat ? 1 : 3;
    ds->shape[0] = flat ? h * w : 1;
    ds->shape[1] = flat ? 1 : h;
    ds->shape[2] = flat ? 1 : w;
    ds->images = (float *)pdp__alloc((size_t)(count * ds->features + 1) * sizeof(float));
    ds->labels = (int32_t *)pdp__alloc((size_t)(count + 1) * sizeof(int32_t));
    if (!ds->images || !ds->labels) {
        pdp_dataset_free(ds);
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory for %lld samples of %lld floats",
                        fn, (long long)count, (long long)(h * w));
    }
    *out = ds;
    return PDP_OK;
}

static pdp_status pdp__check_desc(const pdp_dataset_desc *desc, const char *fn)
{
    if (!desc) return PDP_OK;
    if (desc->max_samples < 0)
        return pdp__err(PDP_ERR_INVALID, "%s: desc.max_samples is %lld (must be >= 0)", fn,
                        (long long)desc->max_samples);
    if (!(desc->std >= 0.0f) || !isfinite(desc->mean) || !isfinite(desc->std))
        return pdp__err(PDP_ERR_INVALID, "%s: desc.mean %g, desc.std %g (std must be >= 0)", fn,
                        (double)desc->mean, (double)desc->std);
    return PDP_OK;
}

static pdp_status pdp__load_idx(pdp_dataset **out, const char *images_path,
                                const char *labels_path, const pdp_dataset_desc *desc,
                                const char *fn)
{
    uint8_t *img = NULL, *lab = NULL;
    size_t img_bytes, lab_bytes;
    const uint8_t *px, *lb;
    uint64_t idims[3], ldims[3];
    int64_t count, features, i;
    float lut[256];
    int maxlab = -1;
    pdp_dataset *ds = NULL;
    pdp_status st;
    if ((st = pdp__read_file(images_path, &img, &img_bytes, fn)) != PDP_OK) goto done;
    if ((st = pdp__idx_parse(img, img_bytes, 3, idims, &px, fn, images_path)) != PDP_OK) goto done;
    if ((st = pdp__read_file(labels_path, &lab, &lab_bytes, fn)) != PDP_OK) goto done;
    if ((st = pdp__idx_parse(lab, lab_bytes, 1, ldims, &lb, fn, labels_path)) != PDP_OK) goto done;
    if (idims[0] != ldims[0]) {
        st = pdp__err(PDP_ERR_FORMAT, "%s: %s has %llu images but %s has %llu labels", fn,
                      images_path, (unsigned long long)idims[0], labels_path,
                      (unsigned long long)ldims[0]);
        goto done;
    }
    count = (int64_t)idims[0];
    if (desc && desc->max_samples && desc->max_samples < count) count = desc->max_samples;
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
    return pdp__load_idx(out, images_path, labels_path, desc, fn);
}

/* ---- fashion-mnist ---- */

/* Looks for dir/name, then dir/name.gz; appends each path tried to `tried`. */
static bool pdp__find_file(const char *dir, const char *name, char *path, size_t cap,
                           char *tried, size_t tried_cap)
{
    static const char *const ext[2] = {"", ".gz"};
    int i;
    for (i = 0; i < 2; i++) {
        FILE *f;
        size_t used = strlen(tried);
        snprintf(path, cap, "%s/%s%s", dir, name, ext[i]);
        snprintf(tried + used, tried_cap - used, "%s%s", used ? ", " : "", path);
        if ((f = fopen(path, "rb")) != NULL) {
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
    snprintf(name, sizeof name, "%s-images-idx3-ubyte", split);
    found = pdp__find_file(dir, name, images, sizeof images, tried, sizeof tried);
    snprintf(name, sizeof name, "%s-labels-idx1-ubyte", split);
    found = pdp__find_file(dir, name, labels, sizeof labels, tried, sizeof tried) && found;
    if (!found)
        return pdp__err(PDP_ERR_IO, "%s: Fashion-MNIST not found (tried %s); apt-get install "
                        "dataset-fashion-mnist or set PDP_DATA to the directory that holds the "
                        "files", fn, tried);
    return pdp__load_idx(out, images, labels, desc, fn);
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
    pdp__dealloc(proto);
    *out = ds;
    return PDP_OK;
}

PDP_API void pdp_dataset_free(pdp_dataset *ds)
{
    if (!ds) return;
    pdp__dealloc(ds->images);
    pdp__dealloc(ds->labels);
    pdp__dealloc(ds);
}

/* ---- gather, view, permutation ---- */

PDP_API pdp_status pdp_dataset_gather(const pdp_dataset *ds, const int64_t *indices, int64_t n,
                                      float *x_out, int32_t *labels_out)
{
    int64_t i;
    if (!ds || (n > 0 && !indices) || n < 0)
        return pdp__err(PDP_ERR_INVALID, "pdp_dataset_gather: NULL dataset or indices, or n < 0");
    for (i = 0; i < n; i++)
        if (indices[i] < 0 || indices[i] >= ds->count)
            return pdp__err(PDP_ERR_INVALID, "pdp_dataset_gather: indices[%lld] = %lld is outside "
                            "[0, %lld)", (long long)i, (long long)indices[i], (long long)ds->count);
    for (i = 0; i < n; i++) {
        if (x_out)
            memcpy(x_out + i * ds->features, ds->images + indices[i] * ds->features,
                   (size_t)ds->features * sizeof(float));
        if (labels_out) labels_out[i] = ds->labels[indices[i]];
    }
    return PDP_OK;
}

/* Wraps data as [n, the dataset's sample shape...]. */
static pdp_status pdp__dataset_wrap(const pdp_dataset *ds, float *data, int64_t n, pdp_tensor *x)
{
    int64_t shape[4];
    shape[0] = n;
    memcpy(shape + 1, ds->shape, 3 * sizeof *shape);
    return pdp_tensor_wrap(data, pdp_cpu(), ds->ndim + 1, shape, x);
}

PDP_API pdp_status pdp_dataset_view(const pdp_dataset *ds, int64_t first, int64_t n,
                                    pdp_tensor *x)
{
    if (!ds || !x) return pdp__err(PDP_ERR_INVALID, "pdp_dataset_view: NULL argument");
    if (first < 0 || n < 1 || first > ds->count - n)
        return pdp__err(PDP_ERR_INVALID, "pdp_dataset_view: samples [%lld, %lld) outside [0, %lld)",
                        (long long)first, (long long)(first + n), (long long)ds->count);
    return pdp__dataset_wrap(ds, ds->images + first * ds->features, n, x);
}

/* Uniform in [0, n), unbiased, for n up to 2^63. */
static uint64_t pdp__rng_below64(pdp_rng *r, uint64_t n)
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
    int32_t *labels;       /* [batch_size] */
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
    if (d.batch_size < 1 || d.batch_size > ((int64_t)1 << 40) / PDP__MAX(ds->features, 1))
        return pdp__err(PDP_ERR_INVALID, "%s: desc.batch_size is %lld", fn, (long long)d.batch_size);
    if (d.num_indices < 0 || (d.num_indices > 0 && !d.indices))
        return pdp__err(PDP_ERR_INVALID, "%s: desc.num_indices is %lld with indices %s", fn,
                        (long long)d.num_indices, d.indices ? "set" : "NULL");
    for (i = 0; d.indices && i < d.num_indices; i++)
        if (d.indices[i] < 0 || d.indices[i] >= ds->count)
            return pdp__err(PDP_ERR_INVALID, "%s: desc.indices[%lld] = %lld is outside [0, %lld)",
                            fn, (long long)i, (long long)d.indices[i], (long long)ds->count);
    if (!(b = (pdp_batcher *)pdp__calloc(sizeof *b)))
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory", fn);
    b->ds = ds;
    b->len = d.indices ? d.num_indices : ds->count;
    b->base = (int64_t *)pdp__alloc((size_t)(b->len + 1) * sizeof(int64_t));
    b->order = (int64_t *)pdp__alloc((size_t)(b->len + 1) * sizeof(int64_t));
    b->x = (float *)pdp__alloc((size_t)(d.batch_size * ds->features) * sizeof(float));
    b->labels = (int32_t *)pdp__alloc((size_t)d.batch_size * sizeof(int32_t));
    if (!b->base || !b->order || !b->x || !b->labels) {
        pdp_batcher_free(b);
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory for %lld indices and a batch of "
                        "%lld", fn, (long long)b->len, (long long)d.batch_size);
    }
    for (i = 0; i < b->len; i++) b->base[i] = d.indices ? d.indices[i] : i;
    d.indices = b->base;
    d.num_indices = b->len;
    b->desc = d;
    pdp_batcher_reset(b, 0);
    *out = b;
    return PDP_OK;
}

PDP_API void pdp_batcher_free(pdp_batcher *b)
{
    if (!b) return;
    pdp__dealloc(b->base);
    pdp__dealloc(b->order);
    pdp__dealloc(b->x);
    pdp__dealloc(b->labels);
    pdp__dealloc(b);
}

PDP_API void pdp_batcher_reset(pdp_batcher *b, uint64_t epoch)
{
    int64_t i;
    if (!b) return;
    b->epoch = epoch;
    b->next = 0;
    if (!b->desc.shuffle) {
        memcpy(b->order, b->base, (size_t)b->len * sizeof(int64_t));
        return;
    }
    pdp_permutation(b->order, b->len, b->desc.seed, epoch); /* positions, then indices */
    for (i = 0; i < b->len; i++) b->order[i] = b->base[b->order[i]];
}

PDP_API bool pdp_batcher_next(pdp_batcher *b, pdp_tensor *x, const int32_t **labels, int64_t *n)
{
    int64_t k, i;
    if (n) *n = 0;
    if (!b || !x) {
        pdp__err(PDP_ERR_INVALID, "pdp_batcher_next: NULL batcher or tensor");
        return false;
    }
    k = PDP__MIN(b->desc.batch_size, b->len - b->next);
    if (k <= 0 || (b->desc.drop_last && k < b->desc.batch_size)) return false;
    for (i = 0; i < k; i++) { /* indices were checked at create */
        int64_t s = b->order[b->next + i];
        memcpy(b->x + i * b->ds->features, b->ds->images + s * b->ds->features,
               (size_t)b->ds->features * sizeof(float));
        b->labels[i] = b->ds->labels[s];
    }
    b->next += k;
    pdp__dataset_wrap(b->ds, b->x, k, x);
    if (labels) *labels = b->labels;
    if (n) *n = k;
    return true;
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
