/* inflate: the gzip (RFC 1952) and DEFLATE (RFC 1951) decoder behind the data loaders.

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
   Entry points: pdp__is_gzip (the magic) and pdp__gunzip (every member, into
   one pdp__alloc'd buffer, or, with a caller's `enough` rule, only a prefix: the
   decoder stops once the rule says it has the bytes it needs, and then, not having
   read the whole member, checks no CRC-32 or ISIZE); messages name the caller's
   public function and path. */

#include "internal.h"

/* Largest file (after decompression) the loaders accept. */
#ifndef PDP_MAX_FILE_BYTES
#  define PDP_MAX_FILE_BYTES ((size_t)0xffffffffu)
#endif

#define PDP__FAST_BITS 10

/* ---- crc32 ---- */

/* CRC-32 of ISO 3309 / ITU-T V.42 (reflected polynomial 0xEDB88320), as gzip
   stores it. The table is built by the caller, once per decode. */
PDP__PRIVATE void pdp__crc32_table(uint32_t table[256])
{
    uint32_t i, c;
    int k;
    for (i = 0; i < 256; i++) {
        c = i;
        for (k = 0; k < 8; k++) c = (c & 1) ? 0xedb88320u ^ (c >> 1) : c >> 1;
        table[i] = c;
    }
}

PDP__PRIVATE uint32_t pdp__crc32(const uint32_t table[256], uint32_t crc, const uint8_t *p,
                                 size_t n)
{
    size_t i;
    crc = ~crc;
    for (i = 0; i < n; i++) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
    return ~crc;
}

/* ---- inflate: state and bit input ---- */

/* A caller's rule for a prefix decode: given the first len decoded bytes (len 0 at the
   start), how many it needs in all; decoding stops once it has that many (a return of
   at most len stops at once). SIZE_MAX: everything. */
typedef size_t (*pdp__gunzip_enough)(const uint8_t *out, size_t len, const void *ctx);

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
    size_t want;     /* decode until out_len reaches it (SIZE_MAX: all), then ask again */
    size_t hint;     /* the whole output's likely size (the gzip trailer's ISIZE) */
    size_t bound;    /* the most the input can decode to: DEFLATE expands at most 1032:1 */
    pdp__gunzip_enough enough; /* NULL: decode everything */
    const void *enough_ctx;
    bool stopped;    /* enough said the prefix is complete: decoding ended early */
    const char *fn, *path; /* for messages */
} pdp__inflate;

PDP__PRIVATE pdp_status pdp__inf_corrupt(const pdp__inflate *s, const char *what)
{
    return pdp__err(PDP_ERR_FORMAT, "%s: %s: corrupt gzip data (%s at byte %zu)", s->fn, s->path,
                    what, s->pos - (size_t)(s->nbits / 8));
}

/* Tops the bit buffer up to at least 57 bits; fails once the stream has consumed
   any of the zero bytes that stand in for input past the end. */
PDP__PRIVATE pdp_status pdp__inf_refill(pdp__inflate *s)
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
PDP__PRIVATE uint32_t pdp__inf_bits(pdp__inflate *s, int n)
{
    uint32_t v = (uint32_t)(s->bits & ((1ull << n) - 1));
    s->bits >>= n;
    s->nbits -= n;
    return v;
}

/* Makes room for `more` output bytes: at once for what the decode is expected to write (the
   prefix the caller's rule wants and one match past it, else the whole output's hint; never
   more than the input can decode to, whatever size a hostile header makes the rule ask
   for), doubling past that. */
PDP__PRIVATE pdp_status pdp__inf_room(pdp__inflate *s, size_t more)
{
    size_t need, cap, expect = s->want >= SIZE_MAX - 258 ? s->hint : s->want + 258;
    uint8_t *bigger;
    if (s->out_cap - s->out_len >= more) return PDP_OK;
    if (expect > s->bound) expect = s->bound;
    need = s->out_len + more;
    if (need > PDP_MAX_FILE_BYTES || need < s->out_len)
        return pdp__err(PDP_ERR_FORMAT, "%s: %s: decompresses to more than %zu bytes", s->fn,
                        s->path, (size_t)PDP_MAX_FILE_BYTES);
    cap = s->out_cap > PDP_MAX_FILE_BYTES / 2 ? PDP_MAX_FILE_BYTES : PDP__MAX(s->out_cap * 2, 4096);
    if (expect > need && expect <= PDP_MAX_FILE_BYTES && s->out_cap < expect) cap = expect;
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

/* Called once out_len has reached want: asks the caller's rule again; true (and
   s->stopped) when the prefix it needs is complete. */
PDP__PRIVATE bool pdp__inf_enough(pdp__inflate *s)
{
    s->want = s->enough ? s->enough(s->out, s->out_len, s->enough_ctx) : SIZE_MAX;
    s->stopped = s->want <= s->out_len;
    return s->stopped;
}

/* ---- inflate: Huffman codes ---- */

/* Builds the code for lens[0..n). Returns 0 for a complete code, 1 for an
   incomplete one that is allowed (no code at all, or one code of length 1, as
   zlib allows), -1 for an over-subscribed or otherwise incomplete set. */
PDP__PRIVATE int pdp__huff_build(pdp__huff *h, const uint8_t *lens, int n)
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
PDP__PRIVATE int pdp__huff_decode(pdp__inflate *s, const pdp__huff *h)
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

PDP__PRIVATE pdp_status pdp__inf_stored(pdp__inflate *s)
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
    if (s->out_len >= s->want) pdp__inf_enough(s);
    return PDP_OK;
}

/* Literals and matches until end-of-block, with the codes in s->lencode/distcode. */
PDP__PRIVATE pdp_status pdp__inf_codes(pdp__inflate *s)
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
            if (s->out_len >= s->want && pdp__inf_enough(s)) return PDP_OK;
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
        if (s->out_len >= s->want && pdp__inf_enough(s)) return PDP_OK;
    }
}

PDP__PRIVATE pdp_status pdp__inf_fixed(pdp__inflate *s)
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

PDP__PRIVATE pdp_status pdp__inf_dynamic(pdp__inflate *s)
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
PDP__PRIVATE pdp_status pdp__inflate_stream(pdp__inflate *s)
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
        if (s->stopped) return PDP_OK; /* the caller has its prefix; s->pos is not moved on */
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

PDP__PRIVATE uint32_t pdp__le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

PDP__PRIVATE bool pdp__is_gzip(const uint8_t *p, size_t n)
{
    return n >= 2 && p[0] == 0x1f && p[1] == 0x8b;
}

/* Decodes every gzip member of in[0..n) into *out (pdp__alloc'd, *out_len bytes); with
   enough (may be NULL), only until that rule has its prefix (*out_len may be more). */
PDP__PRIVATE pdp_status pdp__gunzip(const uint8_t *in, size_t n, uint8_t **out, size_t *out_len,
                                    pdp__gunzip_enough enough, const void *enough_ctx,
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
    s->enough = enough;
    s->enough_ctx = enough_ctx;
    pdp__crc32_table(crc_table);
    /* the last member's ISIZE is the whole size for a one-member file: a good first guess
       (a prefix decode reserves only what its rule wants: pdp__inf_room) */
    hint = n >= 4 ? pdp__le32(in + n - 4) : 0;
    s->bound = n > (SIZE_MAX - 1024) / 1032 ? SIZE_MAX : n * 1032 + 1024;
    s->hint = hint > s->bound ? n * 4 : hint;
    pdp__inf_enough(s); /* the first want */
    if ((st = pdp__inf_room(s, 1)) != PDP_OK) goto done; /* out never NULL */
    while (p < n && !s->stopped) {
        size_t start = p, first = s->out_len;
        uint8_t flg;
        if (n - p < 18 && pdp__is_gzip(in + p, n - p)) goto truncated; /* a cut header */
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
        if (s->stopped) break; /* a prefix: the member's CRC-32 covers bytes not decoded */
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
