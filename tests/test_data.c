/* test_data.c - the IDX reader, the gzip/DEFLATE decoder, the synthetic task and the batcher.

   The decoder is checked against independent encoders: streams built here bit by bit (stored
   and fixed-Huffman blocks, gzip headers with every flag), the gzip tool and Python's zlib at
   several levels and strategies. Corrupt input (every truncation, flipped bytes, bad CRCs,
   hostile code tables) must fail with PDP_ERR_FORMAT and never touch memory it should not
   (run under `make sanitize`). The real Fashion-MNIST files are checked when installed. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>

/* count allocations to prove the batcher allocates nothing per batch; the largest, to prove
   a prefix decode reserves only its prefix */
static long g_allocs;
static size_t g_alloc_max;
static void *counting_malloc(size_t n)
{
    g_allocs++;
    if (n > g_alloc_max) g_alloc_max = n;
    return malloc(n);
}
#define PDP_MALLOC(n) counting_malloc(n)
#define PDP_FREE(p) free(p)
#define PDP_IMPLEMENTATION
#include "pdp.h"
#include "pdp_test.h"

#include <unistd.h>
#include <sys/stat.h>
#include <errno.h>
#include <ctype.h>
#include <math.h>
#include "test_platform.h"

static char g_dir[256];

static const char *tmp_path(const char *name)
{
    static char buf[4][512];
    static int k;
    k = (k + 1) & 3;
    snprintf(buf[k], sizeof buf[k], "%s/%s", g_dir, name);
    return buf[k];
}

static int write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    if (fwrite(data, 1, n, f) != n) { fclose(f); return -1; }
    return fclose(f);
}

static bool have_tool(const char *cmd) { return system(cmd) == 0; }

/* Decodes a whole file with the library's reader (gunzipping when it is gzip). */
static pdp_status read_back(const char *path, uint8_t **data, size_t *n)
{
    return pdp__read_file(path, data, n, NULL, NULL, "test");
}

/* ---- independent encoders ---- */

/* bitwise CRC-32, no table */
static uint32_t ref_crc32(const uint8_t *p, size_t n)
{
    uint32_t c = 0xffffffffu;
    size_t i;
    int k;
    for (i = 0; i < n; i++) {
        c ^= p[i];
        for (k = 0; k < 8; k++) c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1u)));
    }
    return ~c;
}

typedef struct bitw {
    uint8_t buf[4096];
    size_t n;   /* bytes */
    int bit;    /* bits used in buf[n] */
} bitw;

static void put_bits(bitw *w, uint32_t v, int n) /* LSB first */
{
    int i;
    for (i = 0; i < n; i++) {
        if (w->bit == 0) w->buf[w->n] = 0;
        w->buf[w->n] |= (uint8_t)(((v >> i) & 1u) << w->bit);
        if (++w->bit == 8) { w->bit = 0; w->n++; }
    }
}

static void put_code(bitw *w, uint32_t code, int len) /* Huffman codes go MSB first */
{
    int i;
    for (i = len - 1; i >= 0; i--) put_bits(w, (code >> i) & 1u, 1);
}

static void put_fixed_lit(bitw *w, int sym) /* RFC 1951 3.2.6 */
{
    if (sym < 144) put_code(w, 0x30u + (uint32_t)sym, 8);
    else if (sym < 256) put_code(w, 0x190u + (uint32_t)(sym - 144), 9);
    else if (sym < 280) put_code(w, (uint32_t)(sym - 256), 7);
    else put_code(w, 0xc0u + (uint32_t)(sym - 280), 8);
}

static size_t flush_bits(bitw *w) { if (w->bit) { w->bit = 0; w->n++; } return w->n; }

/* Wraps a raw DEFLATE stream in a gzip member; flags adds FEXTRA/FNAME/FCOMMENT/FHCRC. */
static size_t gzip_wrap(uint8_t *out, const uint8_t *deflate, size_t dn, const uint8_t *plain,
                        size_t pn, int flags)
{
    size_t n = 0, i;
    uint32_t crc = ref_crc32(plain, pn);
    uint8_t head[10] = {0x1f, 0x8b, 8, 0, 1, 2, 3, 4, 0, 3};
    head[3] = (uint8_t)flags;
    memcpy(out, head, 10);
    n = 10;
    if (flags & 4) { out[n++] = 5; out[n++] = 0; memcpy(out + n, "AB\0xy", 5); n += 5; }
    if (flags & 8) { memcpy(out + n, "name.idx", 9); n += 9; }
    if (flags & 16) { memcpy(out + n, "a comment", 10); n += 10; }
    if (flags & 2) {
        uint32_t h = ref_crc32(out, n);
        out[n++] = (uint8_t)h;
        out[n++] = (uint8_t)(h >> 8);
    }
    memcpy(out + n, deflate, dn);
    n += dn;
    for (i = 0; i < 4; i++) out[n++] = (uint8_t)(crc >> (8 * i));
    for (i = 0; i < 4; i++) out[n++] = (uint8_t)(pn >> (8 * i));
    return n;
}

/* Decodes a gzip image held in memory through the public reader (via a file). */
static pdp_status gunzip_mem(const uint8_t *gz, size_t n, uint8_t **out, size_t *out_n)
{
    const char *p = tmp_path("mem.gz");
    if (write_file(p, gz, n) != 0) return PDP_ERR_IO;
    return read_back(p, out, out_n);
}

/* ---- inflate ---- */

TEST data_inflate_stored_blocks(void)
{
    static const char text[] = "stored block one|two";
    uint8_t defl[64], gz[256], *out;
    size_t n = 0, out_n, gn;
    /* block 1: not final, stored, 16 bytes; block 2: final, stored, 4 bytes; block 3 empty
       stored blocks are legal too, so put an empty non-final one in between */
    defl[n++] = 0x00; defl[n++] = 16; defl[n++] = 0; defl[n++] = 0xef; defl[n++] = 0xff;
    memcpy(defl + n, text, 16); n += 16;
    defl[n++] = 0x00; defl[n++] = 0; defl[n++] = 0; defl[n++] = 0xff; defl[n++] = 0xff;
    defl[n++] = 0x01; defl[n++] = 4; defl[n++] = 0; defl[n++] = 0xfb; defl[n++] = 0xff;
    memcpy(defl + n, text + 16, 4); n += 4;
    gn = gzip_wrap(gz, defl, n, (const uint8_t *)text, 20, 0);
    ASSERT_ENUM_EQ(PDP_OK, gunzip_mem(gz, gn, &out, &out_n), pdp_status_name);
    ASSERT_EQ(20, (int)out_n);
    ASSERT_MEM_EQ(text, out, 20);
    pdp__dealloc(out);
    /* an empty member: one final stored block of length 0 */
    {
        static const uint8_t empty[5] = {0x01, 0, 0, 0xff, 0xff};
        uint8_t egz[64];
        size_t en = gzip_wrap(egz, empty, 5, (const uint8_t *)"", 0, 0);
        ASSERT_ENUM_EQ(PDP_OK, gunzip_mem(egz, en, &out, &out_n), pdp_status_name);
        ASSERT_EQ(0, (int)out_n);
        pdp__dealloc(out);
    }
    /* LEN and NLEN disagree */
    gz[10 + 3] ^= 1;
    ASSERT_ENUM_EQ(PDP_ERR_FORMAT, gunzip_mem(gz, gn, &out, &out_n), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "complement") != NULL);
    ASSERT(strstr(pdp_last_error(), "mem.gz") != NULL);
    PASS();
}

/* "abcabcabcabcabcXYZ..." with overlapping matches and extra bits, in one fixed block. */
TEST data_inflate_fixed_huffman(void)
{
    bitw w;
    uint8_t gz[512], *out;
    char want[128];
    size_t n, gn, out_n;
    int i;
    memset(&w, 0, sizeof w);
    put_bits(&w, 1, 1); /* BFINAL */
    put_bits(&w, 1, 2); /* BTYPE 01 */
    put_fixed_lit(&w, 'a'); put_fixed_lit(&w, 'b'); put_fixed_lit(&w, 'c');
    put_fixed_lit(&w, 263); put_code(&w, 2, 5);                 /* len 9, dist 3 */
    put_fixed_lit(&w, 0xe9); put_fixed_lit(&w, 200);             /* 9-bit literals */
    put_fixed_lit(&w, 266); put_bits(&w, 1, 1);                  /* len 13 + 1 = 14 */
    put_code(&w, 4, 5); put_bits(&w, 1, 1);                      /* dist 5 + 1 = 6 */
    put_fixed_lit(&w, 285);                                      /* len 258 */
    put_code(&w, 0, 5);                                          /* dist 1 */
    put_fixed_lit(&w, 256);
    n = flush_bits(&w);
    strcpy(want, "abcabcabcabc");
    want[12] = (char)0xe9; want[13] = (char)200;
    for (i = 0; i < 14; i++) want[14 + i] = want[8 + i];
    {
        char full[28 + 258];
        memcpy(full, want, 28);
        memset(full + 28, full[27], 258);
        gn = gzip_wrap(gz, w.buf, n, (const uint8_t *)full, sizeof full, 0);
        ASSERT_ENUM_EQ(PDP_OK, gunzip_mem(gz, gn, &out, &out_n), pdp_status_name);
        ASSERT_EQ((int)sizeof full, (int)out_n);
        ASSERT_MEM_EQ(full, out, sizeof full);
        pdp__dealloc(out);
    }
    PASS();
}

TEST data_inflate_rejects_hostile_streams(void)
{
    struct { const char *why, *msg; } cases[] = {
        {"distance before the start", "distance too far back"},
        {"reserved block type", "reserved block type"},
        {"too many length codes", "too many"},
        {"fixed code symbol 286", "invalid length symbol"},
        {"fixed distance 30", "invalid distance code"},
        {"repeat with nothing before", "no previous length"},
        {"over-subscribed code lengths", "code-length code"},
    };
    int c;
    for (c = 0; c < (int)(sizeof cases / sizeof cases[0]); c++) {
        bitw w;
        uint8_t gz[512], *out = NULL;
        size_t gn, out_n;
        const uint8_t plain[1] = {0};
        memset(&w, 0, sizeof w);
        put_bits(&w, 1, 1);
        switch (c) {
        case 0: put_bits(&w, 1, 2); put_fixed_lit(&w, 'a'); put_fixed_lit(&w, 257);
                put_code(&w, 1, 5); put_fixed_lit(&w, 256); break;          /* dist 2 > 1 */
        case 1: put_bits(&w, 3, 2); break;
        case 2: put_bits(&w, 2, 2); put_bits(&w, 30, 5); put_bits(&w, 0, 5); put_bits(&w, 0, 4);
                break;                                                      /* HLIT 287 */
        case 3: put_bits(&w, 1, 2); put_fixed_lit(&w, 286); break;
        case 4: put_bits(&w, 1, 2); put_fixed_lit(&w, 'a'); put_fixed_lit(&w, 257);
                put_code(&w, 30, 5); break;
        case 5: /* dynamic: code-length code with symbols 16 and 0..: lengths 1 each for 16, 17 */
            put_bits(&w, 2, 2); put_bits(&w, 0, 5); put_bits(&w, 0, 5); put_bits(&w, 0, 4);
            /* order 16, 17, 18, 0: lengths 1, 1, 0, 0 -> 16 is code 0, 17 is code 1 */
            put_bits(&w, 1, 3); put_bits(&w, 1, 3); put_bits(&w, 0, 3); put_bits(&w, 0, 3);
            put_code(&w, 0, 1); put_bits(&w, 0, 2);                   /* 16 first: error */
            break;
        case 6: /* three code-length codes of length 1: over-subscribed */
            put_bits(&w, 2, 2); put_bits(&w, 0, 5); put_bits(&w, 0, 5); put_bits(&w, 0, 4);
            put_bits(&w, 1, 3); put_bits(&w, 1, 3); put_bits(&w, 1, 3); put_bits(&w, 0, 3);
            break;
        }
        put_bits(&w, 0, 16);
        gn = gzip_wrap(gz, w.buf, flush_bits(&w), plain, 1, 0);
        ASSERT_ENUM_EQm(cases[c].why, PDP_ERR_FORMAT, gunzip_mem(gz, gn, &out, &out_n),
                        pdp_status_name);
        ASSERTm(pdp_last_error(), strstr(pdp_last_error(), cases[c].msg) != NULL);
        ASSERT(out == NULL);
    }
    PASS();
}

TEST data_gzip_header_flags(void)
{
    static const char text[] = "header flags";
    uint8_t defl[64], gz[256], *out;
    size_t n = 0, gn, out_n;
    int flags;
    defl[n++] = 0x01; defl[n++] = 12; defl[n++] = 0; defl[n++] = 0xf3; defl[n++] = 0xff;
    memcpy(defl + n, text, 12); n += 12;
    for (flags = 0; flags < 32; flags += 2) {
        gn = gzip_wrap(gz, defl, n, (const uint8_t *)text, 12, flags);
        ASSERT_ENUM_EQm("flags", PDP_OK, gunzip_mem(gz, gn, &out, &out_n), pdp_status_name);
        ASSERT_EQ(12, (int)out_n);
        ASSERT_MEM_EQ(text, out, 12);
        pdp__dealloc(out);
    }
    gn = gzip_wrap(gz, defl, n, (const uint8_t *)text, 12, 2 | 8);
    gz[10 + 9] ^= 0x55; /* header CRC no longer matches */
    ASSERT_ENUM_EQ(PDP_ERR_FORMAT, gunzip_mem(gz, gn, &out, &out_n), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "header CRC") != NULL);
    gn = gzip_wrap(gz, defl, n, (const uint8_t *)text, 12, 0x20); /* reserved flag */
    ASSERT_ENUM_EQ(PDP_ERR_FORMAT, gunzip_mem(gz, gn, &out, &out_n), pdp_status_name);
    /* two members concatenated decode to both texts, as gzip does */
    gn = gzip_wrap(gz, defl, n, (const uint8_t *)text, 12, 8);
    memcpy(gz + gn, gz, gn);
    ASSERT_ENUM_EQ(PDP_OK, gunzip_mem(gz, 2 * gn, &out, &out_n), pdp_status_name);
    ASSERT_EQ(24, (int)out_n);
    ASSERT_MEM_EQ(text, out + 12, 12);
    pdp__dealloc(out);
    /* trailing garbage */
    gz[gn] = 'x';
    ASSERT_ENUM_EQ(PDP_ERR_FORMAT, gunzip_mem(gz, gn + 20, &out, &out_n), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "trailing") != NULL);
    PASS();
}

/* Compressible but not trivial: words, runs and noise. */
static uint8_t *sample_bytes(size_t n, uint32_t seed)
{
    uint8_t *p = (uint8_t *)malloc(n);
    static const char *words[] = {"tensor ", "gradient ", "all-reduce ", "bucket ", "rank "};
    pdp_rng r;
    size_t i = 0;
    pdp_rng_seed(&r, seed, 7);
    while (i < n) {
        uint32_t k = pdp_rng_below(&r, 10), j, len;
        if (k < 5) {
            for (j = 0; words[k][j] && i < n; j++) p[i++] = (uint8_t)words[k][j];
        } else if (k < 7) {
            len = pdp_rng_below(&r, 300);
            for (j = 0; j < len && i < n; j++) p[i++] = (uint8_t)k;
        } else {
            len = pdp_rng_below(&r, 40);
            for (j = 0; j < len && i < n; j++) p[i++] = (uint8_t)pdp_rng_u32(&r);
        }
    }
    return p;
}

TEST data_gzip_matches_gzip_and_zlib(void)
{
    static const int py[][2] = {{0, 0}, {1, 0}, {6, 0}, {9, 0}, {6, 2}, {6, 3}, {6, 4}, {9, 1}};
    const size_t n = 300000;
    uint8_t *plain = sample_bytes(n, 1), *out;
    size_t out_n;
    char cmd[1024];
    int i, ran = 0;
    ASSERT_EQ(0, write_file(tmp_path("plain.bin"), plain, n));
    if (have_tool("gzip --version >/dev/null 2>&1")) {
        for (i = 1; i <= 9; i += 4) {
            snprintf(cmd, sizeof cmd, "gzip -%d -c %s > %s", i, tmp_path("plain.bin"),
                     tmp_path("plain.gz"));
            ASSERT_EQ(0, system(cmd));
            ASSERT_ENUM_EQ(PDP_OK, read_back(tmp_path("plain.gz"), &out, &out_n), pdp_status_name);
            ASSERT_EQ(n, out_n);
            ASSERT_MEM_EQ(plain, out, n);
            pdp__dealloc(out);
            ran++;
        }
    }
    /* level, strategy: 0 default, 1 filtered, 2 Huffman only, 3 RLE, 4 fixed */
    if (pdp_test_python("zlib")) {
        for (i = 0; i < (int)(sizeof py / sizeof py[0]); i++) {
            snprintf(cmd, sizeof cmd, "\"%s\" -c \"import zlib,sys; d=open('%s','rb').read(); "
                     "c=zlib.compressobj(%d, zlib.DEFLATED, 31, 8, %d); "
                     "open('%s','wb').write(c.compress(d)+c.flush())\"", pdp_test_python("zlib"),
                     tmp_path("plain.bin"),
                     py[i][0], py[i][1], tmp_path("py.gz"));
            ASSERT_EQ(0, system(cmd));
            ASSERT_ENUM_EQm(cmd, PDP_OK, read_back(tmp_path("py.gz"), &out, &out_n),
                            pdp_status_name);
            ASSERT_EQ(n, out_n);
            ASSERT_MEM_EQ(plain, out, n);
            pdp__dealloc(out);
            ran++;
        }
    }
    free(plain);
    if (!ran) SKIPm("neither gzip nor a Python with zlib is available (apt-get install gzip)");
    PASS();
}

/* Every prefix of a gzip file, and many single-byte corruptions, fail cleanly. */
TEST data_gzip_corrupt_and_truncated(void)
{
    const size_t n = 5000;
    uint8_t *plain = sample_bytes(n, 2), *gz, *out, *bad;
    size_t gn, out_n, cut;
    FILE *f;
    pdp_rng r;
    int i, detected = 0;
    if (!have_tool("gzip --version >/dev/null 2>&1")) {
        free(plain);
        SKIPm("no gzip tool (apt-get install gzip)");
    }
    ASSERT_EQ(0, write_file(tmp_path("c.bin"), plain, n));
    {
        char cmd[600];
        snprintf(cmd, sizeof cmd, "gzip -9 -c %s > %s", tmp_path("c.bin"), tmp_path("c.gz"));
        ASSERT_EQ(0, system(cmd));
    }
    f = fopen(tmp_path("c.gz"), "rb");
    ASSERT(f != NULL);
    gz = (uint8_t *)malloc(n + 1000);
    gn = fread(gz, 1, n + 1000, f);
    fclose(f);
    bad = (uint8_t *)malloc(gn);
    for (cut = 2; cut < gn; cut++) {
        pdp_status st = gunzip_mem(gz, cut, &out, &out_n);
        ASSERT_ENUM_EQm("truncated", PDP_ERR_FORMAT, st, pdp_status_name);
        ASSERT(strstr(pdp_last_error(), "c.gz") || strstr(pdp_last_error(), "mem.gz"));
        if (cut >= 3) /* a cut header too: its magic is there */
            ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "truncated") != NULL);
    }
    memcpy(bad, gz, gn); /* the stored CRC */
    bad[gn - 6] ^= 1;
    ASSERT_ENUM_EQ(PDP_ERR_FORMAT, gunzip_mem(bad, gn, &out, &out_n), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "CRC-32 mismatch") != NULL);
    memcpy(bad, gz, gn); /* ISIZE */
    bad[gn - 2] ^= 1;
    ASSERT_ENUM_EQ(PDP_ERR_FORMAT, gunzip_mem(bad, gn, &out, &out_n), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "length mismatch") != NULL);
    pdp_rng_seed(&r, 3, 0);
    for (i = 0; i < 400; i++) { /* flip bytes of the compressed data */
        size_t at = 10 + pdp_rng_below(&r, (uint32_t)(gn - 18));
        pdp_status st;
        memcpy(bad, gz, gn);
        bad[at] ^= (uint8_t)(1 + pdp_rng_below(&r, 255));
        st = gunzip_mem(bad, gn, &out, &out_n);
        if (st == PDP_OK) { /* can only happen if the data is still right */
            ASSERT_EQ(n, out_n);
            ASSERT_MEM_EQ(plain, out, n);
            pdp__dealloc(out);
        } else {
            ASSERT_ENUM_EQ(PDP_ERR_FORMAT, st, pdp_status_name);
            detected++;
        }
    }
    ASSERT_GT(detected, 390);
    for (i = 0; i < 300; i++) { /* random DEFLATE bodies behind a valid header */
        size_t at;
        memcpy(bad, gz, gn);
        for (at = 10; at < gn; at++) bad[at] = (uint8_t)pdp_rng_u32(&r);
        ASSERT_ENUM_EQ(PDP_ERR_FORMAT, gunzip_mem(bad, gn, &out, &out_n), pdp_status_name);
    }
    free(plain);
    free(gz);
    free(bad);
    PASS();
}

/* pdp__gunzip with a caller's rule stops once the rule has its prefix: the bytes it got are
   the file's (every call of the rule sees the decoded bytes so far), no more than one match
   past the want (the gzip -9 stream has no stored blocks), its largest allocation sized by
   the want, not by the whole file, and a CRC-32 or a tail the prefix does not reach is not
   read; asking for everything checks them as before. */
static size_t want_fixed(const uint8_t *out, size_t len, const void *ctx)
{
    (void)out;
    (void)len;
    return *(const size_t *)ctx;
}
typedef struct stepper {
    const uint8_t *plain;
    size_t target, calls, wrong;
} stepper;
static size_t want_steps(const uint8_t *out, size_t len, const void *ctx)
{
    stepper *q = (stepper *)ctx; /* the rule's own state: gunzip passes ctx through */
    q->calls++;
    if (len && memcmp(out, q->plain, len) != 0) q->wrong++;
    return len >= q->target ? len : len + 1000;
}

TEST data_gzip_prefix_stops_at_the_callers_rule(void)
{
    static const size_t wants[] = {0, 1, 100, 4999, 123457, 299999, 300000, SIZE_MAX};
    const size_t n = 300000;
    uint8_t *plain = sample_bytes(n, 4), *gz, *bad, *out;
    size_t gn, out_n, i;
    stepper q;
    FILE *f;
    char cmd[600];
    if (!have_tool("gzip --version >/dev/null 2>&1")) {
        free(plain);
        SKIPm("no gzip tool (apt-get install gzip)");
    }
    ASSERT_EQ(0, write_file(tmp_path("p.bin"), plain, n));
    snprintf(cmd, sizeof cmd, "gzip -9 -c %s > %s", tmp_path("p.bin"), tmp_path("p.gz"));
    ASSERT_EQ(0, system(cmd));
    f = fopen(tmp_path("p.gz"), "rb");
    ASSERT(f != NULL);
    gz = (uint8_t *)malloc(n);
    gn = fread(gz, 1, n, f);
    fclose(f);
    bad = (uint8_t *)malloc(gn);
    for (i = 0; i < sizeof wants / sizeof wants[0]; i++) {
        size_t w = wants[i], room = PDP__MAX(w + 258, (size_t)4096);
        g_alloc_max = 0;
        ASSERT_ENUM_EQ(PDP_OK, pdp__gunzip(gz, gn, &out, &out_n, want_fixed, &w, "test", "p.gz"),
                       pdp_status_name);
        if (w >= n) ASSERT_EQ(n, out_n);
        else ASSERT(out_n >= w && out_n <= w + 258);
        /* the output buffer (pdp__alloc adds its alignment) or the decoder's state */
        if (w < n) ASSERT_GTE(PDP__MAX(room, sizeof(pdp__inflate)) + 128, g_alloc_max);
        ASSERT_MEM_EQ(plain, out, out_n);
        pdp__dealloc(out);
    }
    memset(&q, 0, sizeof q);
    q.plain = plain;
    q.target = 50000;
    ASSERT_ENUM_EQ(PDP_OK, pdp__gunzip(gz, gn, &out, &out_n, want_steps, &q, "test", "p.gz"),
                   pdp_status_name);
    ASSERT(out_n >= 50000 && out_n < 60000);
    ASSERT_EQ(0, (int)q.wrong);
    ASSERT_GT((int)q.calls, 40);
    pdp__dealloc(out);
    for (i = 0; i < 2; i++) { /* the stored CRC flipped; the file cut before CRC and ISIZE */
        size_t w = 1000, len = i ? gn - 8 : gn;
        memcpy(bad, gz, gn);
        if (!i) bad[gn - 6] ^= 1;
        ASSERT_ENUM_EQ(PDP_OK, pdp__gunzip(bad, len, &out, &out_n, want_fixed, &w, "test", "p.gz"),
                       pdp_status_name);
        ASSERT_MEM_EQ(plain, out, 1000);
        pdp__dealloc(out);
        ASSERT_ENUM_EQ(PDP_ERR_FORMAT, pdp__gunzip(bad, len, &out, &out_n, NULL, NULL, "test",
                                                   "p.gz"), pdp_status_name);
        ASSERT(strstr(pdp_last_error(), i ? "truncated" : "CRC-32 mismatch") != NULL);
    }
    free(plain);
    free(gz);
    free(bad);
    PASS();
}

/* ---- idx ---- */

static size_t make_idx_images(uint8_t *buf, uint32_t count, uint32_t rows, uint32_t cols,
                              uint32_t seed)
{
    uint32_t i, dims[3] = {count, rows, cols};
    size_t n = 0;
    pdp_rng r;
    buf[n++] = 0; buf[n++] = 0; buf[n++] = 8; buf[n++] = 3;
    for (i = 0; i < 3; i++) {
        buf[n++] = (uint8_t)(dims[i] >> 24); buf[n++] = (uint8_t)(dims[i] >> 16);
        buf[n++] = (uint8_t)(dims[i] >> 8); buf[n++] = (uint8_t)dims[i];
    }
    pdp_rng_seed(&r, seed, 0);
    for (i = 0; i < count * rows * cols; i++) buf[n++] = (uint8_t)pdp_rng_u32(&r);
    return n;
}

static size_t make_idx_labels(uint8_t *buf, uint32_t count)
{
    uint32_t i;
    size_t n = 0;
    buf[n++] = 0; buf[n++] = 0; buf[n++] = 8; buf[n++] = 1;
    buf[n++] = (uint8_t)(count >> 24); buf[n++] = (uint8_t)(count >> 16);
    buf[n++] = (uint8_t)(count >> 8); buf[n++] = (uint8_t)count;
    for (i = 0; i < count; i++) buf[n++] = (uint8_t)((i * 7) % 10);
    return n;
}

TEST data_idx_round_trip(void)
{
    static uint8_t img[16 + 37 * 28 * 28], lab[8 + 37];
    size_t ni = make_idx_images(img, 37, 28, 28, 5), nl = make_idx_labels(lab, 37);
    pdp_dataset_desc flat = {0}, norm = {0};
    pdp_dataset *ds;
    int64_t i;
    int pass;
    ASSERT_EQ(0, write_file(tmp_path("i.idx"), img, ni));
    ASSERT_EQ(0, write_file(tmp_path("l.idx"), lab, nl));
    flat.flat = true;
    norm.mean = 0.25f;
    norm.std = 0.5f;
    norm.max_samples = 20;
    for (pass = 0; pass < 2; pass++) {
        const char *ip = tmp_path(pass ? "i.idx.gz" : "i.idx");
        const char *lp = tmp_path(pass ? "l.idx.gz" : "l.idx");
        if (pass) {
            char cmd[1200];
            if (!have_tool("gzip --version >/dev/null 2>&1")) break;
            snprintf(cmd, sizeof cmd, "gzip -c %s > %s && gzip -c %s > %s", tmp_path("i.idx"), ip,
                     tmp_path("l.idx"), lp);
            ASSERT_EQ(0, system(cmd));
        }
        ASSERT_ENUM_EQ(PDP_OK, pdp_dataset_load_idx(&ds, ip, lp, NULL), pdp_status_name);
        ASSERT_EQ(37, (int)ds->count);
        ASSERT_EQ(3, ds->ndim);
        ASSERT_EQ(1, (int)ds->shape[0]);
        ASSERT_EQ(28, (int)ds->shape[1]);
        ASSERT_EQ(784, (int)ds->features);
        ASSERT_EQ(10, ds->classes);
        for (i = 0; i < 37 * 784; i++) ASSERT_EQ((float)img[16 + i] / 255.0f, ds->images[i]);
        for (i = 0; i < 37; i++) ASSERT_EQ((int)lab[8 + i], ds->labels[i]);
        pdp_dataset_free(ds);
        ASSERT_ENUM_EQ(PDP_OK, pdp_dataset_load_idx(&ds, ip, lp, &flat), pdp_status_name);
        ASSERT_EQ(1, ds->ndim);
        ASSERT_EQ(784, (int)ds->shape[0]);
        pdp_dataset_free(ds);
        ASSERT_ENUM_EQ(PDP_OK, pdp_dataset_load_idx(&ds, ip, lp, &norm), pdp_status_name);
        ASSERT_EQ(20, (int)ds->count);
        for (i = 0; i < 20 * 784; i++)
            ASSERT_IN_RANGE(((float)img[16 + i] / 255.0f - 0.25f) / 0.5f, ds->images[i], 1e-6);
        pdp_dataset_free(ds);
        norm.std = 0; /* a mean alone would be dropped: refused */
        ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_dataset_load_idx(&ds, ip, lp, &norm),
                       pdp_status_name);
        ASSERT(strstr(pdp_last_error(), "desc.mean 0.25 without desc.std"));
        norm.std = 0.5f;
    }
    PASS();
}

/* max_samples: the file need hold only the samples kept. A gzipped file is decoded only
   that far, so a fault past them (the stored CRC-32, the tail cut off) loads with
   max_samples and fails without; a plain file cut after them loads, one cut inside them
   fails naming the file, and one longer than its header says fails either way. */
TEST data_idx_max_samples_reads_only_those(void)
{
    static uint8_t img[16 + 37 * 28 * 28 + 1], lab[8 + 37];
    size_t ni = make_idx_images(img, 37, 28, 28, 9), nl = make_idx_labels(lab, 37), gn;
    const char *ip = tmp_path("m_img.idx"), *lp = tmp_path("m_lab.idx");
    pdp_dataset_desc d20 = {0}, d21 = {0}, d37 = {0};
    pdp_dataset *ds = NULL;
    uint8_t *gz;
    int64_t i;
    int pass;
    FILE *f;
    d20.max_samples = 20;
    d21.max_samples = 21;
    d37.max_samples = 37;
    ASSERT_EQ(0, write_file(lp, lab, nl));
    ASSERT_EQ(0, write_file(ip, img, 16 + 20 * 784)); /* plain, cut after sample 20 */
    ASSERT_ENUM_EQ(PDP_OK, pdp_dataset_load_idx(&ds, ip, lp, &d20), pdp_status_name);
    ASSERT_EQ(20, (int)ds->count);
    for (i = 0; i < 20 * 784; i++) ASSERT_EQ((float)img[16 + i] / 255.0f, ds->images[i]);
    pdp_dataset_free(ds);
    ASSERT_ENUM_EQ(PDP_ERR_FORMAT, pdp_dataset_load_idx(&ds, ip, lp, &d21), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), ip) && strstr(pdp_last_error(), "truncated"));
    ASSERT_ENUM_EQ(PDP_ERR_FORMAT, pdp_dataset_load_idx(&ds, ip, lp, NULL), pdp_status_name);
    img[ni] = 7; /* one byte more than the header says */
    ASSERT_EQ(0, write_file(ip, img, ni + 1));
    ASSERT_ENUM_EQ(PDP_ERR_FORMAT, pdp_dataset_load_idx(&ds, ip, lp, &d20), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "size mismatch"));
    if (!have_tool("gzip --version >/dev/null 2>&1"))
        SKIPm("the plain files pass; the gzipped ones need the gzip tool (apt-get install gzip)");
    ASSERT_EQ(0, write_file(ip, img, ni));
    {
        char cmd[1200];
        snprintf(cmd, sizeof cmd, "gzip -c %s > %s.gz && gzip -c %s > %s.gz", ip, ip, lp, lp);
        ASSERT_EQ(0, system(cmd));
    }
    f = fopen(tmp_path("m_img.idx.gz"), "rb");
    ASSERT(f != NULL);
    gz = (uint8_t *)malloc(sizeof img + 4096);
    gn = fread(gz, 1, sizeof img + 4096, f);
    fclose(f);
    for (pass = 0; pass < 2; pass++) { /* the CRC flipped; the last 8 bytes cut off */
        uint8_t *g = (uint8_t *)malloc(gn);
        memcpy(g, gz, gn);
        if (!pass) g[gn - 6] ^= 1;
        ASSERT_EQ(0, write_file(tmp_path("m_img.idx.gz"), g, pass ? gn - 8 : gn));
        free(g);
        ASSERT_ENUM_EQ(PDP_OK, pdp_dataset_load_idx(&ds, tmp_path("m_img.idx.gz"),
                                                    tmp_path("m_lab.idx.gz"), &d20),
                       pdp_status_name);
        ASSERT_EQ(20, (int)ds->count);
        for (i = 0; i < 20 * 784; i++) ASSERT_EQ((float)img[16 + i] / 255.0f, ds->images[i]);
        for (i = 0; i < 20; i++) ASSERT_EQ((int)lab[8 + i], ds->labels[i]);
        pdp_dataset_free(ds);
        ASSERT_ENUM_EQ(PDP_ERR_FORMAT, pdp_dataset_load_idx(&ds, tmp_path("m_img.idx.gz"),
                                                            tmp_path("m_lab.idx.gz"), NULL),
                       pdp_status_name);
        ASSERT(strstr(pdp_last_error(), pass ? "truncated" : "CRC-32 mismatch"));
        /* max_samples at or past the count keeps every sample: the whole file is checked */
        ASSERT_ENUM_EQ(PDP_ERR_FORMAT, pdp_dataset_load_idx(&ds, tmp_path("m_img.idx.gz"),
                                                            tmp_path("m_lab.idx.gz"), &d37),
                       pdp_status_name);
        ASSERT(strstr(pdp_last_error(), pass ? "truncated" : "CRC-32 mismatch"));
    }
    free(gz);
    PASS();
}

/* A gzipped IDX file whose header claims far more than it holds: a max_samples load asks the
   decoder for the header's prefix (here 65535 x 65535 bytes, 4 GB, for one sample), but the
   decoder reserves no more than its few hundred input bytes can decode to (found by
   fuzzing: the whole prefix was allocated at once). */
TEST data_idx_max_samples_hostile_header_reserves_little(void)
{
    static uint8_t plain[16 + 5000], defl[sizeof plain + 64], gz[sizeof defl + 64];
    const char *ip = tmp_path("h_img.idx.gz"), *lp = tmp_path("h_lab.idx");
    uint8_t lab[8 + 2];
    pdp_dataset_desc d = {0};
    pdp_dataset *ds = NULL;
    size_t n = 0, gn, i;
    uint32_t dims[4] = {0x803, 2, 65535, 65535};
    for (i = 0; i < 16; i++) plain[i] = (uint8_t)(dims[i / 4] >> (24 - 8 * (i % 4)));
    for (i = 16; i < sizeof plain; i++) plain[i] = (uint8_t)i;
    /* two stored blocks: the header, then the pixels (decoded once the rule has sized the
       prefix from the header) */
    defl[n++] = 0x00; defl[n++] = 16; defl[n++] = 0; defl[n++] = 0xef; defl[n++] = 0xff;
    memcpy(defl + n, plain, 16); n += 16;
    defl[n++] = 0x01; defl[n++] = (uint8_t)(5000 & 0xff); defl[n++] = (uint8_t)(5000 >> 8);
    defl[n++] = (uint8_t)~(5000 & 0xff); defl[n++] = (uint8_t)~(5000 >> 8);
    memcpy(defl + n, plain + 16, 5000); n += 5000;
    gn = gzip_wrap(gz, defl, n, plain, sizeof plain, 0);
    ASSERT_EQ(0, write_file(ip, gz, gn));
    ASSERT_EQ(0, write_file(lp, lab, make_idx_labels(lab, 2)));
    d.max_samples = 1;
    g_alloc_max = 0;
    ASSERT_ENUM_EQ(PDP_ERR_FORMAT, pdp_dataset_load_idx(&ds, ip, lp, &d), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), ip) && strstr(pdp_last_error(), "truncated"));
    ASSERT(ds == NULL);
    ASSERT_GTE(gn * 1032 + 1024 + 128, g_alloc_max); /* was 4294836499 */
    PASS();
}

TEST data_idx_errors_name_the_file(void)
{
    static uint8_t img[16 + 5 * 4 * 4], lab[8 + 6];
    size_t ni = make_idx_images(img, 5, 4, 4, 1), nl = make_idx_labels(lab, 5);
    pdp_dataset *ds = (pdp_dataset *)&ds;
    const char *ip = tmp_path("e_img.idx"), *lp = tmp_path("e_lab.idx");
    ASSERT_EQ(0, write_file(lp, lab, nl));
    /* bad magic: a label file given as images */
    ASSERT_EQ(0, write_file(ip, lab, nl));
    ASSERT_ENUM_EQ(PDP_ERR_FORMAT, pdp_dataset_load_idx(&ds, ip, lp, NULL), pdp_status_name);
    ASSERT(ds == NULL);
    ASSERT(strstr(pdp_last_error(), "pdp_dataset_load_idx") == pdp_last_error());
    ASSERT(strstr(pdp_last_error(), ip) && strstr(pdp_last_error(), "magic 0x00000801"));
    /* truncated image data */
    ASSERT_EQ(0, write_file(ip, img, ni - 3));
    ASSERT_ENUM_EQ(PDP_ERR_FORMAT, pdp_dataset_load_idx(&ds, ip, lp, NULL), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), ip) && strstr(pdp_last_error(), "truncated"));
    /* truncated header */
    ASSERT_EQ(0, write_file(ip, img, 9));
    ASSERT_ENUM_EQ(PDP_ERR_FORMAT, pdp_dataset_load_idx(&ds, ip, lp, NULL), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "header"));
    /* counts disagree */
    ASSERT_EQ(0, write_file(ip, img, ni));
    nl = make_idx_labels(lab, 6);
    ASSERT_EQ(0, write_file(lp, lab, nl));
    ASSERT_ENUM_EQ(PDP_ERR_FORMAT, pdp_dataset_load_idx(&ds, ip, lp, NULL), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "5 images") && strstr(pdp_last_error(), "6 labels"));
    ASSERT(strstr(pdp_last_error(), ip) && strstr(pdp_last_error(), lp));
    /* dimensions that overflow 64 bits */
    memset(img + 4, 0xff, 12);
    ASSERT_EQ(0, write_file(ip, img, ni));
    ASSERT_ENUM_EQ(PDP_ERR_FORMAT, pdp_dataset_load_idx(&ds, ip, lp, NULL), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "overflow"));
    /* missing file */
    ASSERT_ENUM_EQ(PDP_ERR_IO, pdp_dataset_load_idx(&ds, tmp_path("nope"), lp, NULL),
                   pdp_status_name);
    ASSERT(strstr(pdp_last_error(), tmp_path("nope")));
    /* a directory (fopen opens one on POSIX, and its size read as LONG_MAX bytes) */
    ASSERT_ENUM_EQ(PDP_ERR_IO, pdp_dataset_load_idx(&ds, g_dir, lp, NULL), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "is a directory, not a file"));
    /* no images, no labels: refused as pdp_dataset_from_arrays refuses a count of 0 */
    ni = make_idx_images(img, 0, 4, 4, 1), nl = make_idx_labels(lab, 0);
    ASSERT_EQ(0, write_file(ip, img, ni));
    ASSERT_EQ(0, write_file(lp, lab, nl));
    ASSERT_ENUM_EQ(PDP_ERR_FORMAT, pdp_dataset_load_idx(&ds, ip, lp, NULL), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "holds 0 images") && strstr(pdp_last_error(), ip));
    PASS();
}

/* ---- fashion-mnist ---- */

TEST data_fashion_mnist_real_files(void)
{
    pdp_dataset *tr, *te;
    int64_t per_class[10] = {0}, i;
    float lo = 1, hi = 0;
    pdp_dataset_desc first = {0};
    pdp_dataset *head;
    pdp_status st;
    PDP_TEST_SKIP_UNDER_TSAN("decoding 55 MB of gzip");
    st = pdp_dataset_load_fashion_mnist(&tr, true, NULL);
    if (st == PDP_ERR_IO) SKIPm("Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)");
    ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, st, pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_dataset_load_fashion_mnist(&te, false, NULL), pdp_status_name);
    ASSERT_EQ(60000, (int)tr->count);
    ASSERT_EQ(10000, (int)te->count);
    ASSERT_EQ(10, tr->classes);
    ASSERT_EQ(9, tr->labels[0]); /* the first training image is an ankle boot */
    ASSERT_EQ(0, tr->labels[1]);
    ASSERT_EQ(9, te->labels[0]);
    for (i = 0; i < tr->count; i++) per_class[tr->labels[i]]++;
    for (i = 0; i < 10; i++) ASSERT_EQ(6000, (int)per_class[i]);
    for (i = 0; i < tr->count * tr->features; i++) {
        lo = PDP__MIN(lo, tr->images[i]);
        hi = PDP__MAX(hi, tr->images[i]);
    }
    ASSERT_EQ(0.0f, lo);
    ASSERT_EQ(1.0f, hi);
    first.max_samples = 1000; /* decoded only that far: the same samples */
    ASSERT_ENUM_EQ(PDP_OK, pdp_dataset_load_fashion_mnist(&head, true, &first), pdp_status_name);
    ASSERT_EQ(1000, (int)head->count);
    ASSERT_MEM_EQ(tr->images, head->images, sizeof(float) * 1000 * 784);
    ASSERT_MEM_EQ(tr->labels, head->labels, sizeof(int32_t) * 1000);
    pdp_dataset_free(head);
    pdp_dataset_free(tr);
    pdp_dataset_free(te);
    PASS();
}

TEST data_fashion_mnist_missing_says_how_to_get_it(void)
{
    const char *old = getenv("PDP_DATA");
    char saved[512] = "";
    pdp_dataset *ds;
    pdp_status st;
    if (old) snprintf(saved, sizeof saved, "%s", old);
    setenv("PDP_DATA", tmp_path("empty"), 1);
    st = pdp_dataset_load_fashion_mnist(&ds, false, NULL);
    if (old) setenv("PDP_DATA", saved, 1);
    else unsetenv("PDP_DATA");
    ASSERT_ENUM_EQ(PDP_ERR_IO, st, pdp_status_name);
    ASSERT(ds == NULL);
    ASSERT(strstr(pdp_last_error(), "pdp_dataset_load_fashion_mnist") == pdp_last_error());
    ASSERT(strstr(pdp_last_error(), "empty/t10k-images-idx3-ubyte.gz"));
    ASSERT(strstr(pdp_last_error(), "empty/t10k-labels-idx1-ubyte,"));
    ASSERT(strstr(pdp_last_error(), "apt-get install dataset-fashion-mnist"));
    ASSERT(strstr(pdp_last_error(), "PDP_DATA"));
    PASS();
}

/* Loads Fashion-MNIST from dir (PDP_DATA) with desc, PDP_DATA restored after. */
static pdp_status load_from(const char *dir, pdp_dataset **ds, bool train,
                            const pdp_dataset_desc *desc)
{
    const char *old = getenv("PDP_DATA");
    char saved[512] = "";
    pdp_status st;
    if (old) snprintf(saved, sizeof saved, "%s", old);
    setenv("PDP_DATA", dir, 1);
    st = pdp_dataset_load_fashion_mnist(ds, train, desc);
    if (old) setenv("PDP_DATA", saved, 1);
    else unsetenv("PDP_DATA");
    return st;
}

TEST data_fashion_mnist_synthetic_fallback(void)
{
    static uint8_t img[16 + 30 * 28 * 28], lab[8 + 30];
    size_t ni = make_idx_images(img, 30, 28, 28, 3), nl = make_idx_labels(lab, 30);
    pdp_dataset_desc d = {0};
    pdp_dataset *ds, *ref;
    char dir[600];
    d.synthetic_fallback = true;
    d.max_samples = 40;
    d.seed = 5;
    d.flat = true;
    /* no files: the synthetic task of the same desc, and the source says where to put them */
    ASSERT_ENUM_EQ(PDP_OK, load_from(tmp_path("empty"), &ds, false, &d), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_dataset_synthetic(&ref, false, &d), pdp_status_name);
    ASSERT_EQ(40, (int)ds->count);
    ASSERT_EQ(1, ds->ndim);
    ASSERT_MEM_EQ(ref->images, ds->images, 40 * 784 * sizeof(float));
    ASSERT_MEM_EQ(ref->labels, ds->labels, 40 * sizeof(int32_t));
    ASSERT_STR_EQ("synthetic", ref->source);
    ASSERT(strstr(ds->source, "synthetic (no Fashion-MNIST in ") == ds->source);
    ASSERT(strstr(ds->source, tmp_path("empty")) && strstr(ds->source, "PDP_DATA"));
    pdp_dataset_free(ds);
    pdp_dataset_free(ref);
    /* the training files only: without the fallback they load, with it both halves are
       synthetic (never one half of each) */
    snprintf(dir, sizeof dir, "%s", tmp_path("half"));
    ASSERT_EQ(0, mkdir(dir, 0700) == 0 || errno == EEXIST ? 0 : -1);
    ASSERT_EQ(0, write_file(tmp_path("half/train-images-idx3-ubyte"), img, ni));
    ASSERT_EQ(0, write_file(tmp_path("half/train-labels-idx1-ubyte"), lab, nl));
    d.synthetic_fallback = false;
    ASSERT_ENUM_EQ(PDP_OK, load_from(dir, &ds, true, &d), pdp_status_name);
    ASSERT_EQ(30, (int)ds->count);
    ASSERT_STR_EQ("Fashion-MNIST", ds->source);
    ASSERT_EQ((float)img[16 + 100] / 255.0f, ds->images[100]);
    pdp_dataset_free(ds);
    d.synthetic_fallback = true;
    ASSERT_ENUM_EQ(PDP_OK, load_from(dir, &ds, true, &d), pdp_status_name);
    ASSERT_EQ(40, (int)ds->count);
    ASSERT(strstr(ds->source, "synthetic") == ds->source);
    pdp_dataset_free(ds);
    /* a directory where a file should be is no file: the fallback */
    ASSERT_EQ(0, mkdir(tmp_path("dirs"), 0700) == 0 || errno == EEXIST ? 0 : -1);
    ASSERT_EQ(0, mkdir(tmp_path("dirs/train-images-idx3-ubyte"), 0700) == 0 || errno == EEXIST
                     ? 0 : -1);
    ASSERT_EQ(0, write_file(tmp_path("dirs/train-labels-idx1-ubyte"), lab, nl));
    ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, load_from(tmp_path("dirs"), &ds, true, &d),
                    pdp_status_name);
    ASSERT(strstr(ds->source, "synthetic") == ds->source);
    pdp_dataset_free(ds);
    /* all four there but one bad: the error, not the fallback */
    ASSERT_EQ(0, write_file(tmp_path("half/t10k-images-idx3-ubyte"), img, ni));
    ASSERT_EQ(0, write_file(tmp_path("half/t10k-labels-idx1-ubyte"), img, 20));
    ASSERT_ENUM_EQ(PDP_ERR_FORMAT, load_from(dir, &ds, false, &d), pdp_status_name);
    ASSERT(ds == NULL);
    ASSERT(strstr(pdp_last_error(), "t10k-labels-idx1-ubyte"));
    ASSERT_EQ(0, write_file(tmp_path("half/t10k-labels-idx1-ubyte"), lab, nl));
    ASSERT_ENUM_EQ(PDP_OK, load_from(dir, &ds, false, &d), pdp_status_name);
    ASSERT_STR_EQ("Fashion-MNIST", ds->source);
    pdp_dataset_free(ds);
    /* pdp_dataset_load_idx names the images file */
    ASSERT_ENUM_EQ(PDP_OK, pdp_dataset_load_idx(&ds, tmp_path("half/t10k-images-idx3-ubyte"),
                                                tmp_path("half/t10k-labels-idx1-ubyte"), NULL),
                   pdp_status_name);
    ASSERT_STR_EQ(tmp_path("half/t10k-images-idx3-ubyte"), ds->source);
    pdp_dataset_free(ds);
    PASS();
}

/* ---- synthetic ---- */

TEST data_synthetic_is_seeded_and_learnable(void)
{
    pdp_dataset_desc d = {0};
    pdp_dataset *a, *b, *te;
    double *mean, count[10] = {0};
    int64_t i, j, right = 0;
    int c;
    d.max_samples = 3000;
    d.seed = 11;
    ASSERT_ENUM_EQ(PDP_OK, pdp_dataset_synthetic(&a, true, &d), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_dataset_synthetic(&b, true, &d), pdp_status_name);
    ASSERT_EQ(3000, (int)a->count);
    ASSERT_EQ(10, a->classes);
    ASSERT_MEM_EQ(a->images, b->images, 3000 * 784 * sizeof(float));
    ASSERT_MEM_EQ(a->labels, b->labels, 3000 * sizeof(int32_t));
    pdp_dataset_free(b);
    d.seed = 12;
    ASSERT_ENUM_EQ(PDP_OK, pdp_dataset_synthetic(&b, true, &d), pdp_status_name);
    ASSERT(memcmp(a->images, b->images, 784 * sizeof(float)) != 0);
    pdp_dataset_free(b);
    d.seed = 11;
    d.max_samples = 1000;
    ASSERT_ENUM_EQ(PDP_OK, pdp_dataset_synthetic(&te, false, &d), pdp_status_name);
    ASSERT(memcmp(a->images, te->images, 784 * sizeof(float)) != 0);
    for (i = 0; i < a->count * 784; i++) ASSERT(a->images[i] >= 0 && a->images[i] <= 1);
    /* nearest class mean, fitted on train, scored on test: far above chance */
    mean = (double *)calloc(10 * 784, sizeof *mean);
    for (i = 0; i < a->count; i++)
    {
        count[a->labels[i]] += 1;
        for (j = 0; j < 784; j++) mean[a->labels[i] * 784 + j] += a->images[i * 784 + j];
    }
    for (i = 0; i < te->count; i++) {
        double best = 1e300;
        int arg = -1;
        for (c = 0; c < 10; c++) {
            double dist = 0;
            for (j = 0; j < 784; j++) {
                double v = te->images[i * 784 + j] - mean[c * 784 + j] / count[c];
                dist += v * v;
            }
            if (dist < best) { best = dist; arg = c; }
        }
        right += arg == te->labels[i];
    }
    ASSERT_GT(right, 600);
    ASSERT_LT(right, 1000); /* and not trivial */
    free(mean);
    pdp_dataset_free(a);
    pdp_dataset_free(te);
    PASS();
}

/* ---- permutation and batcher ---- */

TEST data_permutation_is_seeded_permutation(void)
{
    int64_t a[1000], b[1000];
    char seen[1000];
    int i;
    pdp_permutation(a, 1000, 42, 3);
    pdp_permutation(b, 1000, 42, 3);
    ASSERT_MEM_EQ(a, b, sizeof a);
    memset(seen, 0, sizeof seen);
    for (i = 0; i < 1000; i++) {
        ASSERT(a[i] >= 0 && a[i] < 1000 && !seen[a[i]]);
        seen[a[i]] = 1;
    }
    pdp_permutation(b, 1000, 42, 4);
    ASSERT(memcmp(a, b, sizeof a) != 0);
    pdp_permutation(b, 1000, 43, 3);
    ASSERT(memcmp(a, b, sizeof a) != 0);
    PASS();
}

static pdp_dataset *small_dataset(int64_t count)
{
    pdp_dataset_desc d = {0};
    pdp_dataset *ds = NULL;
    d.max_samples = count;
    pdp_dataset_synthetic(&ds, true, &d);
    return ds;
}

TEST data_batcher_covers_each_sample_once(void)
{
    pdp_dataset *ds = small_dataset(103);
    pdp_batcher_desc bd = {0};
    pdp_batcher *b;
    pdp_tensor x;
    const int32_t *y;
    int64_t n, seen[103], first_order[103], order_count, batches;
    const int64_t *order;
    int epoch, i;
    ASSERT(ds != NULL);
    bd.batch_size = 10;
    bd.shuffle = true;
    bd.seed = 5;
    ASSERT_ENUM_EQ(PDP_OK, pdp_batcher_create(&b, ds, &bd), pdp_status_name);
    ASSERT_EQ(11, (int)pdp_batcher_num_batches(b));
    for (epoch = 0; epoch < 3; epoch++) {
        int64_t pos = 0;
        pdp_batcher_reset(b, (uint64_t)epoch);
        order = pdp_batcher_order(b, &order_count);
        ASSERT_EQ(103, (int)order_count);
        if (epoch == 0) memcpy(first_order, order, sizeof first_order);
        else ASSERT(memcmp(first_order, order, sizeof first_order) != 0);
        memset(seen, 0, sizeof seen);
        batches = 0;
        while (pdp_batcher_next(b, &x, &y, &n)) {
            ASSERT_EQ(batches < 10 ? 10 : 3, (int)n);
            ASSERT_EQ(4, x.ndim);
            ASSERT_EQ(n, x.shape[0]);
            ASSERT_EQ(28, (int)x.shape[3]);
            for (i = 0; i < n; i++) { /* the copy is the sample the order names */
                int64_t s = order[pos + i];
                seen[s]++;
                ASSERT_EQ(ds->labels[s], y[i]);
                ASSERT_MEM_EQ(ds->images + s * 784, x.data + i * 784, 784 * sizeof(float));
            }
            pos += n;
            batches++;
        }
        ASSERT_EQ(0, (int)n);
        ASSERT_EQ(11, (int)batches);
        for (i = 0; i < 103; i++) ASSERT_EQ(1, (int)seen[i]);
    }
    pdp_batcher_reset(b, 0); /* an epoch can be replayed */
    ASSERT_MEM_EQ(first_order, pdp_batcher_order(b, NULL), sizeof first_order);
    pdp_batcher_free(b);
    /* drop_last, in order, no shuffle */
    bd.shuffle = false;
    bd.drop_last = true;
    ASSERT_ENUM_EQ(PDP_OK, pdp_batcher_create(&b, ds, &bd), pdp_status_name);
    ASSERT_EQ(10, (int)pdp_batcher_num_batches(b));
    batches = 0;
    while (pdp_batcher_next(b, &x, &y, &n)) {
        ASSERT_EQ(ds->labels[batches * 10], y[0]);
        batches++;
    }
    ASSERT_EQ(10, (int)batches);
    pdp_batcher_free(b);
    /* drop_last with a batch larger than the data: no batch at all (PDP_OK, then an epoch
       that yields nothing), refused instead, as num_indices 0 is */
    bd.batch_size = 104;
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_batcher_create(&b, ds, &bd), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "desc.batch_size 104 with drop_last over 103 samples: an "
                                    "epoch of no batch"));
    bd.batch_size = 103; /* one batch */
    ASSERT_ENUM_EQ(PDP_OK, pdp_batcher_create(&b, ds, &bd), pdp_status_name);
    ASSERT_EQ(1, (int)pdp_batcher_num_batches(b));
    pdp_batcher_free(b);
    pdp_dataset_free(ds);
    PASS();
}

TEST data_batcher_index_lists_and_no_allocation(void)
{
    pdp_dataset *ds = small_dataset(50);
    int64_t idx[7] = {3, 49, 0, 3, 17, 22, 8}, bad[2] = {1, 50}, n, k = 0;
    pdp_batcher_desc bd = {0};
    pdp_batcher *b = NULL;
    pdp_tensor x;
    const int32_t *y;
    long before;
    float buf[2 * 784];
    int32_t lab[2];
    bd.batch_size = 3;
    bd.indices = idx;
    bd.num_indices = 7;
    ASSERT_ENUM_EQ(PDP_OK, pdp_batcher_create(&b, ds, &bd), pdp_status_name);
    before = g_allocs;
    while (pdp_batcher_next(b, &x, &y, &n)) {
        int i;
        for (i = 0; i < n; i++, k++) {
            ASSERT_EQ(ds->labels[idx[k]], y[i]);
            ASSERT_EQ(ds->images[idx[k] * 784 + 400], x.data[i * 784 + 400]);
        }
    }
    pdp_batcher_reset(b, 1);
    while (pdp_batcher_next(b, &x, &y, &n)) {}
    ASSERT_EQ(before, g_allocs);
    ASSERT_EQ(7, (int)k);
    pdp_batcher_free(b);
    bd.indices = bad;
    bd.num_indices = 2;
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_batcher_create(&b, ds, &bd), pdp_status_name);
    ASSERT(b == NULL);
    ASSERT(strstr(pdp_last_error(), "indices[1] = 50"));
    bd.num_indices = 0; /* a list of nothing: an epoch without a batch */
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_batcher_create(&b, ds, &bd), pdp_status_name);
    ASSERT(b == NULL && strstr(pdp_last_error(), "an epoch of no batch"));
    /* gather serves the same lists */
    ASSERT_ENUM_EQ(PDP_OK, pdp_dataset_gather(ds, idx + 1, 2, buf, lab), pdp_status_name);
    ASSERT_EQ(ds->labels[49], lab[0]);
    ASSERT_MEM_EQ(ds->images + 784 * 0, buf + 784, 784 * sizeof(float));
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_dataset_gather(ds, bad, 2, buf, lab), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "indices[1] = 50"));
    ASSERT_ENUM_EQ(PDP_OK, pdp_dataset_view(ds, 10, 5, &x), pdp_status_name);
    ASSERT_EQ(5, (int)x.shape[0]);
    ASSERT(x.data == ds->images + 10 * 784);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_dataset_view(ds, 48, 5, &x), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "pdp_dataset_view: samples [48, 53) outside [0, 50)"));
    pdp_dataset_free(ds);
    PASS();
}

/* Issue 13, item 2: sizes computed from user input that used to wrap around. */
TEST data_batcher_takes_a_samplers_epochs(void)
{
    pdp_dataset *ds = small_dataset(50);
    pdp_dist_sampler_desc sd = {0};
    pdp_dist_sampler *s, *ref, *big;
    pdp_batcher_desc bd = {0}, rd = {0};
    pdp_batcher *b, *r;
    pdp_tensor x, xr;
    const int32_t *y, *yr;
    const int64_t *idx;
    int64_t n, nr, m, k;
    long before;
    int e;
    sd.dataset_size = 50;
    sd.world_size = 3; /* 17 a rank, the last padded */
    sd.rank = 2;
    sd.seed = 6;
    ASSERT_ENUM_EQ(PDP_OK, pdp_dist_sampler_create(&s, &sd), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_dist_sampler_create(&ref, &sd), pdp_status_name);
    bd.batch_size = 4;
    bd.sampler = s;
    ASSERT_ENUM_EQ(PDP_OK, pdp_batcher_create(&b, ds, &bd), pdp_status_name);
    for (e = 2; e >= 0; e--) { /* the reference: a batcher per epoch over the indices */
        pdp_batcher_reset(b, (uint64_t)e);
        pdp_dist_sampler_set_epoch(ref, (uint64_t)e);
        idx = pdp_dist_sampler_indices(ref, &m);
        ASSERT_EQ(17, (int)m);
        rd.batch_size = 4;
        rd.indices = idx;
        rd.num_indices = m;
        ASSERT_ENUM_EQ(PDP_OK, pdp_batcher_create(&r, ds, &rd), pdp_status_name);
        for (k = 0; pdp_batcher_next(b, &x, &y, &n); k += n) {
            ASSERT(pdp_batcher_next(r, &xr, &yr, &nr));
            ASSERT_EQ(nr, n);
            ASSERT_MEM_EQ(yr, y, (size_t)n * sizeof *y);
            ASSERT_MEM_EQ(xr.data, x.data, (size_t)n * 784 * sizeof(float));
        }
        ASSERT_EQ(17, (int)k);
        ASSERT(!pdp_batcher_next(r, &xr, &yr, &nr));
        ASSERT_ENUM_EQ(PDP_OK, pdp_batcher_status(b), pdp_status_name);
        pdp_batcher_free(r);
    }
    pdp_batcher_reset(b, 7); /* only the reference batchers allocated: none here */
    before = g_allocs;
    while (pdp_batcher_next(b, &x, &y, &n)) {}
    pdp_batcher_reset(b, 8);
    ASSERT_EQ(before, g_allocs);
    /* indices and a sampler: refused */
    rd.sampler = s;
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_batcher_create(&r, ds, &rd), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "indices and desc.sampler"));
    pdp_batcher_free(b);
    /* a sampler made for a larger dataset: refused at create, or at the epoch that leaves */
    sd.dataset_size = 60;
    sd.world_size = 1;
    sd.rank = 0;
    ASSERT_ENUM_EQ(PDP_OK, pdp_dist_sampler_create(&big, &sd), pdp_status_name);
    bd.sampler = big;
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_batcher_create(&b, ds, &bd), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "sampler's indices[") && strstr(pdp_last_error(), "[0, 50)"));
    pdp_dist_sampler_free(big);
    /* ... or at the epoch that leaves it: a seed whose epoch 0 fits and a later epoch not */
    sd.dataset_size = 52;
    sd.world_size = 4;
    for (sd.seed = 0, e = -1; e < 0 && sd.seed < 200; sd.seed++) {
        int f;
        ASSERT_ENUM_EQ(PDP_OK, pdp_dist_sampler_create(&big, &sd), pdp_status_name);
        for (f = 0; f < 20; f++) {
            bool out = false;
            pdp_dist_sampler_set_epoch(big, (uint64_t)f);
            idx = pdp_dist_sampler_indices(big, &m);
            for (k = 0; k < m; k++) out = out || idx[k] >= 50;
            if (f == 0 && out) break;
            if (out) { e = f; break; }
        }
        if (e < 0) pdp_dist_sampler_free(big);
    }
    ASSERT(e > 0);
    bd.sampler = big;
    ASSERT_ENUM_EQ(PDP_OK, pdp_batcher_create(&b, ds, &bd), pdp_status_name);
    pdp_batcher_reset(b, (uint64_t)e);
    ASSERT(!pdp_batcher_next(b, &x, &y, &n));
    ASSERT_EQ(0, (int)n);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_batcher_status(b), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "pdp_batcher_reset: the sampler's index 5"));
    pdp_batcher_reset(b, 0); /* back in range */
    ASSERT(pdp_batcher_next(b, &x, &y, &n));
    ASSERT_ENUM_EQ(PDP_OK, pdp_batcher_status(b), pdp_status_name);
    pdp_batcher_free(b);
    pdp_dist_sampler_free(big);
    pdp_dist_sampler_free(ref);
    pdp_dist_sampler_free(s);
    pdp_dataset_free(ds);
    PASS();
}

/* ---- a user's arrays ---- */

/* A user's data where every value names its place: x[i][j] = i + j / 64, target[i][t] =
   -(i + t / 8 + 0.5) (j < 64, t < 8), so a batch row that is not sample s's cannot pass. */
static void fill_arrays(float *x, int64_t count, int64_t f, float *y, int64_t tf)
{
    int64_t i, j;
    for (i = 0; i < count; i++) {
        for (j = 0; j < f; j++) x[i * f + j] = (float)i + (float)j / 64.0f;
        for (j = 0; y && j < tf; j++) y[i * tf + j] = -((float)i + (float)j / 8.0f + 0.5f);
    }
}

/* Batches of b, one epoch, against the user's arrays xr [count, f] and yr [count, tf] (or
   labels lr [count]) by the sample each position of the epoch's order names; every batch
   full but a smaller last one of `last`. */
static enum greatest_test_res check_target_epoch(pdp_batcher *b, const float *xr, int64_t f,
                                                 const float *yr, int64_t tf, const int32_t *lr,
                                                 int64_t bs, int64_t last)
{
    pdp_tensor x, t;
    int64_t n, pos = 0, count, batches = pdp_batcher_num_batches(b), k = 0, i;
    const int64_t *order = pdp_batcher_order(b, &count);
    while (pdp_batcher_next_target(b, &x, &t, &n)) {
        ASSERT_EQ(++k < batches ? bs : last, n);
        ASSERT_EQ(PDP_DTYPE_F32, x.dtype);
        ASSERT_EQ(n, x.shape[0]);
        ASSERT_EQ(n * f, x.count);
        ASSERT_EQ(PDP_DEVICE_CPU, t.device.kind);
        if (yr) { /* float32 [n, target_features] */
            ASSERT_EQ(PDP_DTYPE_F32, t.dtype);
            ASSERT_EQ(2, t.ndim);
            ASSERT_EQ(n, t.shape[0]);
            ASSERT_EQ(tf, t.shape[1]);
            ASSERT(pdp_tensor_ids(&t) == NULL);
        } else { /* int32 [n] */
            ASSERT_EQ(PDP_DTYPE_I32, t.dtype);
            ASSERT_EQ(1, t.ndim);
            ASSERT_EQ(n, t.shape[0]);
            ASSERT(pdp_tensor_ids(&t) != NULL);
        }
        ASSERT_EQ(t.shape[0] * (yr ? tf : 1), t.count);
        for (i = 0; i < n; i++) {
            int64_t s = order[pos + i];
            ASSERT_MEM_EQ(xr + s * f, x.data + i * f, (size_t)f * sizeof(float));
            if (yr) ASSERT_MEM_EQ(yr + s * tf, t.data + i * tf, (size_t)tf * sizeof(float));
            else ASSERT_EQ(lr[s], pdp_tensor_ids(&t)[i]);
        }
        pos += n;
    }
    ASSERT_EQ(0, n);
    ASSERT_EQ(batches, k);
    ASSERT_EQ(pdp_batcher_get_desc(b).drop_last ? batches * bs : count, pos);
    ASSERT_ENUM_EQ(PDP_OK, pdp_batcher_status(b), pdp_status_name);
    PASS();
}

TEST data_arrays_regression_batches_are_the_arrays(void)
{
    enum { COUNT = 37, F = 24, TF = 3 };
    static float x[COUNT * F], y[COUNT * TF], xr[COUNT * F], yr[COUNT * TF];
    int64_t idx[5] = {5, 36, 0, 5, 20}, seen[COUNT] = {0}, n, m, k, i;
    pdp_dataset_arrays a;
    pdp_dataset *ds;
    pdp_batcher_desc bd;
    pdp_batcher *b;
    pdp_dist_sampler_desc sd;
    pdp_dist_sampler *s, *ref;
    pdp_tensor xt, t;
    const int64_t *order;
    long before;
    int e;
    fill_arrays(x, COUNT, F, y, TF);
    fill_arrays(xr, COUNT, F, yr, TF);
    memset(&a, 0, sizeof a);
    a.x = x;
    a.count = COUNT;
    a.shape[0] = 2; /* ndim 0: counted, 3 */
    a.shape[1] = 3;
    a.shape[2] = 4;
    a.targets = y;
    a.target_features = TF;
    ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_dataset_from_arrays(&ds, &a), pdp_status_name);
    memset(x, 0, sizeof x); /* the dataset holds copies */
    memset(y, 0, sizeof y);
    ASSERT_EQ(COUNT, ds->count);
    ASSERT_EQ(3, ds->ndim);
    ASSERT(ds->shape[0] == 2 && ds->shape[1] == 3 && ds->shape[2] == 4);
    ASSERT_EQ(F, ds->features);
    ASSERT_EQ(TF, ds->target_features);
    ASSERT_EQ(0, ds->classes);
    ASSERT(ds->labels == NULL);
    ASSERT_MEM_EQ(xr, ds->images, sizeof xr);
    ASSERT_MEM_EQ(yr, ds->targets, sizeof yr);
    ASSERT_STR_EQ("arrays", ds->source);
    /* shuffled epochs: 4 batches of 8 and one of 5, each sample once, nothing allocated */
    memset(&bd, 0, sizeof bd);
    bd.batch_size = 8;
    bd.shuffle = true;
    bd.seed = 3;
    ASSERT_ENUM_EQ(PDP_OK, pdp_batcher_create(&b, ds, &bd), pdp_status_name);
    ASSERT_EQ(5, pdp_batcher_num_batches(b));
    before = g_allocs;
    for (e = 0; e < 2; e++) {
        pdp_batcher_reset(b, (uint64_t)e);
        CHECK_CALL(check_target_epoch(b, xr, F, yr, TF, NULL, 8, 5));
    }
    ASSERT_EQ(before, g_allocs);
    order = pdp_batcher_order(b, &n);
    for (i = 0; i < n; i++) seen[order[i]]++;
    for (i = 0; i < COUNT; i++) ASSERT_EQ(1, seen[i]);
    pdp_batcher_reset(b, 1);
    ASSERT(pdp_batcher_next_target(b, &xt, &t, &n)); /* the order is not the identity */
    ASSERT(memcmp(xr, xt.data, 8 * F * sizeof(float)) != 0);
    ASSERT(pdp_batcher_next_target(b, &xt, NULL, &n)); /* target may be NULL */
    pdp_batcher_free(b);
    /* drop_last: the 5 left over are not handed out */
    bd.drop_last = true;
    ASSERT_ENUM_EQ(PDP_OK, pdp_batcher_create(&b, ds, &bd), pdp_status_name);
    ASSERT_EQ(4, pdp_batcher_num_batches(b));
    CHECK_CALL(check_target_epoch(b, xr, F, yr, TF, NULL, 8, 8));
    pdp_batcher_free(b);
    /* an index list, repeats included: batches of 2, 2, 1 */
    memset(&bd, 0, sizeof bd);
    bd.batch_size = 2;
    bd.indices = idx;
    bd.num_indices = 5;
    ASSERT_ENUM_EQ(PDP_OK, pdp_batcher_create(&b, ds, &bd), pdp_status_name);
    CHECK_CALL(check_target_epoch(b, xr, F, yr, TF, NULL, 2, 1));
    ASSERT_MEM_EQ(idx, pdp_batcher_order(b, NULL), sizeof idx);
    pdp_batcher_free(b);
    /* a DistributedSampler's epochs (3 ranks, this one's 13 padded): rows by its indices */
    memset(&sd, 0, sizeof sd);
    sd.dataset_size = COUNT;
    sd.world_size = 3;
    sd.rank = 2;
    sd.seed = 9;
    ASSERT_ENUM_EQ(PDP_OK, pdp_dist_sampler_create(&s, &sd), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_dist_sampler_create(&ref, &sd), pdp_status_name);
    memset(&bd, 0, sizeof bd);
    bd.batch_size = 4;
    bd.sampler = s;
    ASSERT_ENUM_EQ(PDP_OK, pdp_batcher_create(&b, ds, &bd), pdp_status_name);
    for (e = 0; e < 3; e++) {
        const int64_t *ri;
        pdp_batcher_reset(b, (uint64_t)e);
        pdp_dist_sampler_set_epoch(ref, (uint64_t)e);
        ri = pdp_dist_sampler_indices(ref, &m);
        ASSERT_EQ(13, m);
        for (k = 0; pdp_batcher_next_target(b, &xt, &t, &n); k += n)
            for (i = 0; i < n; i++) {
                ASSERT_MEM_EQ(yr + ri[k + i] * TF, t.data + i * TF, TF * sizeof(float));
                ASSERT_MEM_EQ(xr + ri[k + i] * F, xt.data + i * F, F * sizeof(float));
            }
        ASSERT_EQ(13, k);
    }
    pdp_batcher_free(b);
    pdp_dist_sampler_free(ref);
    pdp_dist_sampler_free(s);
    pdp_dataset_free(ds);
    PASS();
}

TEST data_arrays_classification_labels_are_an_int32_tensor(void)
{
    enum { COUNT = 23, F = 5 };
    float x[COUNT * F];
    int32_t lab[COUNT];
    const int32_t *y;
    pdp_dataset_arrays a;
    pdp_dataset *ds;
    pdp_batcher_desc bd;
    pdp_batcher *b, *b2;
    pdp_tensor xt, xt2, t;
    int64_t n, n2, i;
    fill_arrays(x, COUNT, F, NULL, 0);
    for (i = 0; i < COUNT; i++) lab[i] = (int32_t)((i * 7) % 4); /* 0..3 */
    memset(&a, 0, sizeof a);
    a.x = x;
    a.count = COUNT;
    a.shape[0] = F;
    a.labels = lab;
    a.name = "my labelled set";
    ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_dataset_from_arrays(&ds, &a), pdp_status_name);
    ASSERT_EQ(1, ds->ndim);
    ASSERT(ds->shape[0] == F && ds->shape[1] == 1 && ds->shape[2] == 1);
    ASSERT_EQ(4, ds->classes);
    ASSERT(ds->targets == NULL);
    ASSERT_EQ(0, ds->target_features);
    ASSERT_MEM_EQ(lab, ds->labels, sizeof lab);
    ASSERT_STR_EQ("my labelled set", ds->source);
    /* shuffled: 3 batches of 6 and one of 5; next_target and next give the same batches */
    memset(&bd, 0, sizeof bd);
    bd.batch_size = 6;
    bd.shuffle = true;
    bd.seed = 2;
    ASSERT_ENUM_EQ(PDP_OK, pdp_batcher_create(&b, ds, &bd), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_batcher_create(&b2, ds, &bd), pdp_status_name);
    CHECK_CALL(check_target_epoch(b, x, F, NULL, 0, lab, 6, 5));
    pdp_batcher_reset(b, 0);
    while (pdp_batcher_next_target(b, &xt, &t, &n)) {
        ASSERT(pdp_batcher_next(b2, &xt2, &y, &n2));
        ASSERT_EQ(n, n2);
        ASSERT_MEM_EQ(y, pdp_tensor_ids(&t), (size_t)n * sizeof *y);
        ASSERT_MEM_EQ(xt2.data, xt.data, (size_t)(n * F) * sizeof(float));
    }
    ASSERT(!pdp_batcher_next(b2, &xt2, &y, &n2));
    pdp_batcher_free(b2);
    pdp_batcher_free(b);
    pdp_dataset_free(ds);
    /* classes given (a subset missing the last classes); a (T, C) sample */
    a.classes = 10;
    a.shape[0] = 1;
    a.shape[1] = F;
    a.name = NULL;
    ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_dataset_from_arrays(&ds, &a), pdp_status_name);
    ASSERT_EQ(10, ds->classes);
    ASSERT_EQ(2, ds->ndim);
    ASSERT_EQ(F, ds->features);
    ASSERT_STR_EQ("arrays", ds->source);
    bd.shuffle = false;
    ASSERT_ENUM_EQ(PDP_OK, pdp_batcher_create(&b, ds, &bd), pdp_status_name);
    ASSERT(pdp_batcher_next_target(b, &xt, &t, &n));
    ASSERT(xt.ndim == 3 && xt.shape[0] == 6 && xt.shape[1] == 1 && xt.shape[2] == F);
    pdp_batcher_free(b);
    pdp_dataset_free(ds);
    PASS();
}

/* pdp_dataset_from_arrays(a) fails with status, *out NULL, the message naming the function
   and holding text. */
static enum greatest_test_res arrays_fail(const pdp_dataset_arrays *a, pdp_status status,
                                          const char *text)
{
    static pdp_dataset stale;
    pdp_dataset *ds = &stale;
    ASSERT_ENUM_EQm(text, status, pdp_dataset_from_arrays(&ds, a), pdp_status_name);
    ASSERT(ds == NULL);
    ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "pdp_dataset_from_arrays: ") ==
                                  pdp_last_error());
    ASSERTm(pdp_last_error(), strstr(pdp_last_error(), text) != NULL);
    PASS();
}

TEST data_arrays_bad_input_names_the_field(void)
{
    enum { COUNT = 6, F = 4, TF = 2 };
    float x[COUNT * F], y[COUNT * TF], bad[COUNT * F];
    int32_t lab[COUNT] = {0, 1, 2, 1, 0, 2};
    pdp_dataset_arrays g, a;
    pdp_dataset *ds;
    long before;
    fill_arrays(x, COUNT, F, y, TF);
    memset(&g, 0, sizeof g); /* a good regression set; every case breaks one thing */
    g.x = x;
    g.count = COUNT;
    g.shape[0] = F;
    g.targets = y;
    g.target_features = TF;
    ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_dataset_from_arrays(&ds, &g), pdp_status_name);
    pdp_dataset_free(ds);
    before = g_allocs;
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_dataset_from_arrays(NULL, &g), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "pdp_dataset_from_arrays: out is NULL"));
    CHECK_CALL(arrays_fail(NULL, PDP_ERR_INVALID, "arrays is NULL"));
    a = g; a.x = NULL;
    CHECK_CALL(arrays_fail(&a, PDP_ERR_INVALID, "arrays.x is NULL"));
    a = g; a.count = 0;
    CHECK_CALL(arrays_fail(&a, PDP_ERR_INVALID, "arrays.count is 0 (must be >= 1)"));
    a = g; a.count = -3;
    CHECK_CALL(arrays_fail(&a, PDP_ERR_INVALID, "arrays.count is -3"));
    /* shapes */
    a = g; a.ndim = 4;
    CHECK_CALL(arrays_fail(&a, PDP_ERR_SHAPE, "arrays.ndim is 4"));
    a = g; a.ndim = -1;
    CHECK_CALL(arrays_fail(&a, PDP_ERR_SHAPE, "arrays.ndim is -1"));
    a = g; a.shape[0] = 0;
    CHECK_CALL(arrays_fail(&a, PDP_ERR_SHAPE, "arrays.shape is empty"));
    a = g; a.shape[0] = -4;
    CHECK_CALL(arrays_fail(&a, PDP_ERR_SHAPE, "arrays.shape[0] is -4 (must be >= 1)"));
    a = g; a.ndim = 2;
    CHECK_CALL(arrays_fail(&a, PDP_ERR_SHAPE, "arrays.shape[1] is 0 (must be >= 1)"));
    a = g; a.shape[2] = 3; /* counted: one dimension, then a size after the gap */
    CHECK_CALL(arrays_fail(&a, PDP_ERR_SHAPE, "arrays.shape[2] is 3, past the sample's 1 "
                                              "dimension (arrays.ndim 0)"));
    a = g; a.ndim = 1; a.shape[1] = 2;
    CHECK_CALL(arrays_fail(&a, PDP_ERR_SHAPE, "arrays.shape[1] is 2, past the sample's 1 "
                                              "dimension (arrays.ndim 1)"));
    a = g; a.shape[0] = (int64_t)1 << 40; a.shape[1] = (int64_t)1 << 40;
    CHECK_CALL(arrays_fail(&a, PDP_ERR_SHAPE, "arrays.shape's 2 dimensions overflow"));
    a = g; a.count = (int64_t)1 << 40; a.shape[0] = (int64_t)1 << 30; /* x is never read */
    CHECK_CALL(arrays_fail(&a, PDP_ERR_INVALID, "arrays.count 1099511627776 x 1073741824 "
                                                "features"));
    a = g; a.target_features = INT64_MAX;
    CHECK_CALL(arrays_fail(&a, PDP_ERR_INVALID, "x 9223372036854775807 target_features) "
                                                "exceed"));
    a = g; a.target_features = -2;
    CHECK_CALL(arrays_fail(&a, PDP_ERR_SHAPE, "arrays.target_features is -2"));
    /* the kind of target: one, and only its fields */
    a = g; a.labels = lab;
    CHECK_CALL(arrays_fail(&a, PDP_ERR_INVALID, "arrays.labels and arrays.targets are both "
                                                "set"));
    a = g; a.targets = NULL;
    CHECK_CALL(arrays_fail(&a, PDP_ERR_INVALID, "neither arrays.labels nor arrays.targets"));
    a = g; a.targets = NULL; a.labels = lab;
    CHECK_CALL(arrays_fail(&a, PDP_ERR_INVALID, "arrays.target_features is 2 with labels"));
    a = g; a.classes = 3;
    CHECK_CALL(arrays_fail(&a, PDP_ERR_INVALID, "arrays.classes is 3 with targets"));
    /* labels */
    memset(&a, 0, sizeof a);
    a.x = x;
    a.count = COUNT;
    a.shape[0] = F;
    a.labels = lab;
    a.classes = -1;
    CHECK_CALL(arrays_fail(&a, PDP_ERR_INVALID, "arrays.classes is -1"));
    a.classes = 2; /* lab[2] is 2 */
    CHECK_CALL(arrays_fail(&a, PDP_ERR_INVALID, "arrays.labels[2] is 2, not below "
                                                "arrays.classes = 2"));
    a.classes = 0;
    lab[4] = -1;
    CHECK_CALL(arrays_fail(&a, PDP_ERR_INVALID, "arrays.labels[4] is -1 (a class label is "
                                                ">= 0)"));
    lab[4] = INT32_MAX;
    CHECK_CALL(arrays_fail(&a, PDP_ERR_INVALID, "arrays.labels[4] is 2147483647"));
    lab[4] = 0;
    /* values that are not numbers: sample and feature named */
    memcpy(bad, x, sizeof bad);
    bad[2 * F + 1] = NAN;
    a = g; a.x = bad;
    CHECK_CALL(arrays_fail(&a, PDP_ERR_INVALID, "arrays.x[9] (sample 2, feature 1) is NaN"));
    bad[2 * F + 1] = x[2 * F + 1];
    bad[COUNT * F - 1] = -INFINITY;
    CHECK_CALL(arrays_fail(&a, PDP_ERR_INVALID, "arrays.x[23] (sample 5, feature 3) is "
                                                "infinite"));
    bad[COUNT * F - 1] = x[COUNT * F - 1];
    memcpy(bad, y, sizeof y);
    bad[3 * TF + 1] = INFINITY;
    a = g; a.targets = bad;
    CHECK_CALL(arrays_fail(&a, PDP_ERR_INVALID, "arrays.targets[7] (sample 3, feature 1) is "
                                                "infinite"));
    bad[3 * TF + 1] = NAN;
    CHECK_CALL(arrays_fail(&a, PDP_ERR_INVALID, "arrays.targets[7] (sample 3, feature 1) is "
                                                "NaN"));
    ASSERT_EQ(before, g_allocs); /* every failure came before an allocation */
    PASS();
}

TEST data_arrays_gather_next_and_accuracy_per_kind(void)
{
    enum { COUNT = 10, F = 3, TF = 2 };
    float x[COUNT * F], y[COUNT * TF], xb[3 * F], yb[3 * TF];
    int32_t lab[COUNT], lb[3];
    int64_t idx[3] = {9, 0, 4}, bad[2] = {1, 10}, n, i;
    pdp_dataset_arrays a;
    pdp_dataset *reg, *cls;
    pdp_batcher_desc bd;
    pdp_batcher *b;
    pdp_model_desc md;
    pdp_model *m;
    pdp_tensor xt, t;
    const int32_t *yl;
    double acc = -1;
    fill_arrays(x, COUNT, F, y, TF);
    for (i = 0; i < COUNT; i++) lab[i] = (int32_t)(i % 3);
    memset(&a, 0, sizeof a);
    a.x = x;
    a.count = COUNT;
    a.shape[0] = F;
    a.targets = y;
    a.target_features = TF;
    ASSERT_ENUM_EQ(PDP_OK, pdp_dataset_from_arrays(&reg, &a), pdp_status_name);
    a.targets = NULL;
    a.target_features = 0;
    a.labels = lab;
    ASSERT_ENUM_EQ(PDP_OK, pdp_dataset_from_arrays(&cls, &a), pdp_status_name);
    /* gather: each kind its own targets; asking for the other kind's fails */
    ASSERT_ENUM_EQ(PDP_OK, pdp_dataset_gather_targets(reg, idx, 3, xb, yb), pdp_status_name);
    for (i = 0; i < 3; i++) {
        ASSERT_MEM_EQ(x + idx[i] * F, xb + i * F, F * sizeof(float));
        ASSERT_MEM_EQ(y + idx[i] * TF, yb + i * TF, TF * sizeof(float));
    }
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_dataset_gather_targets(reg, bad, 2, xb, yb),
                   pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "pdp_dataset_gather_targets: indices[1] = 10 is outside"));
    ASSERT_ENUM_EQ(PDP_OK, pdp_dataset_gather(reg, idx, 3, xb, NULL), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_dataset_gather(reg, idx, 3, xb, lb), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "pdp_dataset_gather: arrays is a regression set") &&
           strstr(pdp_last_error(), "pdp_dataset_gather_targets"));
    ASSERT_ENUM_EQ(PDP_OK, pdp_dataset_gather(cls, idx, 3, NULL, lb), pdp_status_name);
    for (i = 0; i < 3; i++) ASSERT_EQ(lab[idx[i]], lb[i]);
    ASSERT_ENUM_EQ(PDP_OK, pdp_dataset_gather_targets(cls, idx, 3, xb, NULL), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_dataset_gather_targets(cls, idx, 3, xb, yb),
                   pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "arrays is a classification set"));
    /* pdp_batcher_next on a regression set: the samples alone, or a failure that says where
       the targets are */
    memset(&bd, 0, sizeof bd);
    bd.batch_size = 4;
    ASSERT_ENUM_EQ(PDP_OK, pdp_batcher_create(&b, reg, &bd), pdp_status_name);
    ASSERT(!pdp_batcher_next(b, &xt, &yl, &n));
    ASSERT_EQ(0, n);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_batcher_status(b), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "pdp_batcher_next: arrays is a regression set, with 2 "
                                    "float targets a sample and no labels: take its batches "
                                    "with pdp_batcher_next_target"));
    ASSERT(pdp_batcher_next(b, &xt, NULL, &n)); /* the epoch had not moved */
    ASSERT_EQ(4, n);
    ASSERT_MEM_EQ(x, xt.data, 4 * F * sizeof(float));
    ASSERT(!pdp_batcher_next_target(b, NULL, &t, &n));
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_batcher_status(b), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "pdp_batcher_next_target: NULL"));
    pdp_batcher_reset(b, 0);
    ASSERT_ENUM_EQ(PDP_OK, pdp_batcher_status(b), pdp_status_name);
    /* accuracy needs labels */
    memset(&md, 0, sizeof md);
    md.input_shape[0] = F;
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_create(&m, &md), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_linear(m, 3), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_model_accuracy(m, b, &acc), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "pdp_model_accuracy: arrays is a regression set"));
    ASSERT_EQ(0.0, acc);
    pdp_batcher_free(b);
    ASSERT_ENUM_EQ(PDP_OK, pdp_batcher_create(&b, cls, &bd), pdp_status_name);
    ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_model_accuracy(m, b, &acc), pdp_status_name);
    ASSERT(acc >= 0.0 && acc <= 1.0);
    pdp_batcher_free(b);
    pdp_model_free(m);
    pdp_dataset_free(cls);
    pdp_dataset_free(reg);
    PASS();
}

/* The target tensor is what pdp_loss_mse takes: the loss of a fixed prediction on each
   batch, smaller last batch included, equals a naive loop over the user's arrays. */
TEST data_arrays_mse_of_a_batch_matches_a_naive_loop(void)
{
    enum { COUNT = 13, F = 4, TF = 3, BS = 5 };
    float x[COUNT * F], y[COUNT * TF], pred[BS * TF];
    int64_t n, pos = 0, i, j;
    const int64_t *order;
    pdp_dataset_arrays a;
    pdp_dataset *ds;
    pdp_batcher_desc bd;
    pdp_batcher *b;
    pdp_tensor xt, t, p;
    fill_arrays(x, COUNT, F, y, TF);
    memset(&a, 0, sizeof a);
    a.x = x;
    a.count = COUNT;
    a.shape[0] = F;
    a.targets = y;
    a.target_features = TF;
    ASSERT_ENUM_EQ(PDP_OK, pdp_dataset_from_arrays(&ds, &a), pdp_status_name);
    memset(&bd, 0, sizeof bd);
    bd.batch_size = BS;
    bd.shuffle = true;
    bd.seed = 1;
    ASSERT_ENUM_EQ(PDP_OK, pdp_batcher_create(&b, ds, &bd), pdp_status_name);
    order = pdp_batcher_order(b, NULL);
    for (i = 0; i < BS * TF; i++) pred[i] = 0.25f * (float)i - 7.0f;
    while (pdp_batcher_next_target(b, &xt, &t, &n)) {
        const int64_t shape[2] = {n, TF};
        double sum = 0.0, want;
        float loss = -1;
        ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_wrap(pred, pdp_cpu(), 2, shape, &p), pdp_status_name);
        ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_loss_mse(&p, &t, &loss, NULL),
                        pdp_status_name);
        for (i = 0; i < n; i++)
            for (j = 0; j < TF; j++) {
                double d = (double)pred[i * TF + j] - (double)y[order[pos + i] * TF + j];
                sum += d * d;
            }
        want = sum / (double)(n * TF);
        ASSERT_IN_RANGE(want, loss, 1e-6 * want);
        pos += n;
    }
    ASSERT_EQ(COUNT, pos);
    pdp_batcher_free(b);
    pdp_dataset_free(ds);
    PASS();
}

/* ---- token data ---- */

/* A corpus directory written in an order that is not the name order: files "c.txt", "a",
   "B", an empty "e", and what a load must skip: two *.dat files, a link to "a", a
   subdirectory with a file in it. Returns the directory; *expect gets the stream a load
   must give, its files in bytewise name order ("B" < "a" < "c.txt" < "e"), built here
   from the contents, not from a listing. */
static const char *token_corpus(char *expect, size_t cap, size_t *n)
{
    static const char *const c = "c: the third file, longer than the others so that windows "
                                 "cross from one file into the next.\n";
    static const char *const a = "a: after B, lowercase sorts after uppercase\n";
    static const char *const B = "B: first\n";
    static char dir[600];
    char link[700];
    snprintf(dir, sizeof dir, "%s", tmp_path("corpus"));
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) return NULL;
    if (mkdir(tmp_path("corpus/sub"), 0700) != 0 && errno != EEXIST) return NULL;
    if (write_file(tmp_path("corpus/c.txt"), c, strlen(c)) ||
        write_file(tmp_path("corpus/z.dat"), "ZZZZ", 4) ||
        write_file(tmp_path("corpus/a"), a, strlen(a)) ||
        write_file(tmp_path("corpus/sub/inner"), "inner", 5) ||
        write_file(tmp_path("corpus/B"), B, strlen(B)) ||
        write_file(tmp_path("corpus/a.dat"), "DAT", 3) ||
        write_file(tmp_path("corpus/e"), "", 0))
        return NULL;
    snprintf(link, sizeof link, "%s", tmp_path("corpus/a.u8"));
#ifndef _WIN32 /* no link on Windows: CreateSymbolicLink needs a privilege tests lack */
    if (symlink("a", link) != 0 && errno != EEXIST) return NULL;
#endif
    *n = (size_t)snprintf(expect, cap, "%s%s%s", B, a, c);
    return dir;
}

/* Every window of split against slicing the stream by hand: window w of a split that
   starts at token s is bytes [s + wT, s + wT + T + 1); x the first T, y the last T. */
static enum greatest_test_res check_windows(const pdp_token_dataset *ds, pdp_split split,
                                            const uint8_t *stream, int64_t first, int64_t len)
{
    int64_t T = ds->context, w, t, nw = 0, *idx;
    int32_t *x, *y;
    while ((nw + 1) * T + 1 <= len) nw++; /* windows that fit, counted one by one */
    ASSERT_EQ(nw, ds->windows[split]);
    idx = (int64_t *)calloc((size_t)(nw + 1), sizeof *idx);
    x = (int32_t *)calloc((size_t)(nw * T + 1), sizeof *x);
    y = (int32_t *)calloc((size_t)(nw * T + 1), sizeof *y);
    for (w = 0; w < nw; w++) idx[w] = nw - 1 - w; /* any order: reversed */
    ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK,
                    pdp_token_dataset_batch(ds, split, idx, nw, x, y), pdp_status_name);
    for (w = 0; w < nw; w++)
        for (t = 0; t < T; t++) {
            int64_t at = first + idx[w] * T + t;
            ASSERT_EQ((int32_t)stream[at], x[w * T + t]);
            ASSERT_EQ((int32_t)stream[at + 1], y[w * T + t]);
            ASSERT(at + 1 < first + len); /* the target is in the split */
        }
    free(idx);
    free(x);
    free(y);
    PASS();
}

TEST data_tokens_directory_windows_and_split(void)
{
    char expect[512];
    size_t n = 0;
    const char *dir = token_corpus(expect, sizeof expect, &n);
    pdp_token_dataset_desc d = {0};
    pdp_token_dataset *ds;
    int64_t T;
    ASSERT(dir != NULL);
    for (T = 1; T <= 9; T += 4) {
        d.context = T;
        ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_token_dataset_load(&ds, dir, &d),
                        pdp_status_name);
        ASSERT_EQ((int64_t)n, ds->count);
        ASSERT_MEM_EQ(expect, ds->tokens, n);
        ASSERT_EQ(256, ds->vocab);
        ASSERT_EQ(T, ds->context);
        ASSERT_EQ(4, (int)ds->files); /* B, a, c.txt, e */
        ASSERT_EQ(0.1, ds->desc.val_fraction);
        ASSERT_STR_EQ(tmp_path("corpus (4 files)"), ds->source);
        /* nanoGPT's cut: train = data[:int(n * 0.9)], as Python computes it (n = 146) */
        ASSERT_EQ(146, (int)n);
        ASSERT_EQ(131, (int)ds->split_at);
        CHECK_CALL(check_windows(ds, PDP_SPLIT_TRAIN, ds->tokens, 0, ds->split_at));
        CHECK_CALL(check_windows(ds, PDP_SPLIT_VAL, ds->tokens, ds->split_at,
                                 ds->count - ds->split_at));
        pdp_token_dataset_free(ds);
    }
    /* T = 5 puts the last training window flush against the cut: 131 = 1 + 26 * 5 */
    d.context = 5;
    ASSERT_ENUM_EQ(PDP_OK, pdp_token_dataset_load(&ds, dir, &d), pdp_status_name);
    ASSERT_EQ(26, (int)ds->windows[PDP_SPLIT_TRAIN]);
    ASSERT_EQ(2, (int)ds->windows[PDP_SPLIT_VAL]); /* 15 tokens: (15 - 1) / 5 */
    CHECK_CALL(check_windows(ds, PDP_SPLIT_TRAIN, ds->tokens, 0, ds->split_at));
    pdp_token_dataset_free(ds);
    /* val_fraction, no_validation, max_tokens (mid-way through the second file: the third is
       not read) and a single file */
    d.val_fraction = 0.5;
    ASSERT_ENUM_EQ(PDP_OK, pdp_token_dataset_load(&ds, dir, &d), pdp_status_name);
    ASSERT_EQ(73, (int)ds->split_at);
    CHECK_CALL(check_windows(ds, PDP_SPLIT_VAL, ds->tokens, 73, 73));
    pdp_token_dataset_free(ds);
    d.val_fraction = 0;
    d.no_validation = true;
    d.max_tokens = 20;
    ASSERT_ENUM_EQ(PDP_OK, pdp_token_dataset_load(&ds, dir, &d), pdp_status_name);
    ASSERT_EQ(20, (int)ds->count);
    ASSERT_EQ(20, (int)ds->split_at);
    ASSERT_EQ(2, (int)ds->files);
    ASSERT_EQ(0, (int)ds->windows[PDP_SPLIT_VAL]);
    ASSERT_MEM_EQ(expect, ds->tokens, 20);
    CHECK_CALL(check_windows(ds, PDP_SPLIT_TRAIN, ds->tokens, 0, 20));
    pdp_token_dataset_free(ds);
    d.max_tokens = 0;
    ASSERT_ENUM_EQ(PDP_OK, pdp_token_dataset_load(&ds, tmp_path("corpus/c.txt"), &d),
                   pdp_status_name);
    ASSERT_EQ((int64_t)n - 53, ds->count); /* c.txt alone: after B's 9 and a's 44 */
    ASSERT_MEM_EQ(expect + 53, ds->tokens, (size_t)ds->count);
    ASSERT_STR_EQ(tmp_path("corpus/c.txt"), ds->source);
    pdp_token_dataset_free(ds);
    PASS();
}

TEST data_tokens_fortunes_as_cat_reads_it(void)
{
    char cmd[1400];
    const char *ref = tmp_path("fortunes.cat");
    pdp_token_dataset_desc d = {0};
    pdp_token_dataset *ds;
    uint8_t *want;
    size_t n;
    struct stat sb;
    if (stat(PDP_FORTUNES_DIR, &sb) != 0)
        SKIPm("no " PDP_FORTUNES_DIR " (apt-get install fortunes)");
#ifdef _WIN32
    SKIPm("no POSIX shell on Windows (find, sort, cat build the reference)");
#endif
    /* the reference: find's regular files (links not followed), C-locale sort, cat */
    snprintf(cmd, sizeof cmd, "cd %s && find . -maxdepth 1 -type f ! -name '*.dat' | "
             "LC_ALL=C sort | xargs cat > %s", PDP_FORTUNES_DIR, ref);
    ASSERT_EQ(0, system(cmd));
    ASSERT_ENUM_EQ(PDP_OK, read_back(ref, &want, &n), pdp_status_name);
    d.context = 256;
    ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_token_dataset_load(&ds, PDP_FORTUNES_DIR, &d),
                    pdp_status_name);
    ASSERT_EQ((int64_t)n, ds->count);
    ASSERT_MEM_EQ(want, ds->tokens, n);
    ASSERT(strstr(ds->source, PDP_FORTUNES_DIR " (") == ds->source);
    pdp__dealloc(want);
    pdp_token_dataset_free(ds);
    PASS();
}

TEST data_tokens_distributed_sampler_covers_each_window(void)
{
    enum { RANKS = 3 };
    pdp_token_dataset_desc d = {0};
    pdp_token_dataset *ds;
    pdp_dist_sampler *s[RANKS];
    pdp_dist_sampler_desc sd = {0};
    int *hits, *target_hits, e, r;
    int32_t *x, *y;
    int64_t W, T, k, m, i, t, epoch0[16];
    d.context = 11;
    d.max_tokens = 30000;
    d.seed = 3;
    ASSERT_ENUM_EQ(PDP_OK, pdp_token_dataset_synthetic(&ds, &d), pdp_status_name);
    W = ds->windows[PDP_SPLIT_TRAIN];
    T = ds->context;
    ASSERT_EQ(2454, (int)W); /* 27000 training tokens: (27000 - 1) / 11, 818 a rank */
    sd.dataset_size = W;
    sd.world_size = RANKS;
    sd.seed = 9;
    for (r = 0; r < RANKS; r++) {
        sd.rank = r;
        ASSERT_ENUM_EQ(PDP_OK, pdp_dist_sampler_create(&s[r], &sd), pdp_status_name);
    }
    hits = (int *)malloc((size_t)W * sizeof *hits);
    target_hits = (int *)malloc((size_t)ds->split_at * sizeof *target_hits);
    x = (int32_t *)malloc((size_t)(W * T) * sizeof *x);
    y = (int32_t *)malloc((size_t)(W * T) * sizeof *y);
    for (e = 0; e < 2; e++) {
        memset(hits, 0, (size_t)W * sizeof *hits);
        memset(target_hits, 0, (size_t)ds->split_at * sizeof *target_hits);
        for (r = 0; r < RANKS; r++) {
            const int64_t *idx;
            pdp_dist_sampler_set_epoch(s[r], (uint64_t)e);
            idx = pdp_dist_sampler_indices(s[r], &m);
            ASSERT_EQ(W / RANKS, m);
            if (r == 0 && e == 0) memcpy(epoch0, idx, sizeof epoch0);
            if (r == 0 && e == 1) ASSERT(memcmp(epoch0, idx, sizeof epoch0) != 0);
            ASSERT_ENUM_EQ(PDP_OK, pdp_token_dataset_batch(ds, PDP_SPLIT_TRAIN, idx, m, x, y),
                           pdp_status_name);
            for (k = 0; k < m; k++) {
                hits[idx[k]]++;
                for (t = 0; t < T; t++) { /* the rows are the windows the sampler named */
                    int64_t at = idx[k] * T + t;
                    ASSERT_EQ((int32_t)ds->tokens[at], x[k * T + t]);
                    ASSERT_EQ((int32_t)ds->tokens[at + 1], y[k * T + t]);
                    target_hits[at + 1]++;
                }
            }
        }
        for (i = 0; i < W; i++) ASSERT_EQ(1, hits[i]); /* each window once across ranks */
        for (i = 0; i < ds->split_at; i++) /* each token a target once, but the first and tail */
            ASSERT_EQ(i >= 1 && i <= W * T ? 1 : 0, target_hits[i]);
    }
    for (r = 0; r < RANKS; r++) pdp_dist_sampler_free(s[r]);
    free(hits);
    free(target_hits);
    free(x);
    free(y);
    pdp_token_dataset_free(ds);
    PASS();
}

TEST data_tokens_synthetic_is_seeded_and_learnable(void)
{
    pdp_token_dataset_desc d = {0};
    pdp_token_dataset *a, *b, *fb;
    static double uni[64], tri[64 * 64][64];
    double h1 = 0, h3 = 0, total;
    int64_t i;
    int p, q, letter[256], nletters = 0;
    d.context = 16;
    d.seed = 7;
    ASSERT_ENUM_EQ(PDP_OK, pdp_token_dataset_synthetic(&a, &d), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_token_dataset_synthetic(&b, &d), pdp_status_name);
    ASSERT_EQ(1048576, (int)a->count); /* the default */
    ASSERT_EQ(1048576, (int)a->desc.max_tokens);
    ASSERT_EQ(0, (int)a->files);
    ASSERT_STR_EQ("synthetic", a->source);
    ASSERT_MEM_EQ(a->tokens, b->tokens, (size_t)a->count);
    pdp_token_dataset_free(b);
    d.seed = 8;
    ASSERT_ENUM_EQ(PDP_OK, pdp_token_dataset_synthetic(&b, &d), pdp_status_name);
    ASSERT(memcmp(a->tokens, b->tokens, 4096) != 0);
    pdp_token_dataset_free(b);
    /* the fallback of a missing path: the same text, and a source that says why */
    d.seed = 7;
    d.synthetic_fallback = true;
    ASSERT_ENUM_EQ(PDP_OK, pdp_token_dataset_load(&fb, tmp_path("no/such/corpus"), &d),
                   pdp_status_name);
    ASSERT_MEM_EQ(a->tokens, fb->tokens, (size_t)a->count);
    ASSERT(strstr(fb->source, "synthetic (no text at ") == fb->source);
    ASSERT(strstr(fb->source, tmp_path("no/such/corpus")));
    ASSERT(strstr(fb->source, "apt-get install fortunes"));
    pdp_token_dataset_free(fb);
    /* English-like: letters, spaces, periods, newlines; a capital after each sentence */
    ASSERT(a->tokens[0] >= 'A' && a->tokens[0] <= 'Z');
    for (i = 0; i < a->count; i++) {
        int c = a->tokens[i];
        ASSERT(isalpha(c) || c == ' ' || c == '.' || c == '\n');
        if (i >= 2 && a->tokens[i - 2] == '.') ASSERT(isupper(c));
        if (i >= 1 && isupper(c)) ASSERT(a->tokens[i - 1] == ' ' || a->tokens[i - 1] == '\n');
    }
    /* learnable: the next byte is far more certain given the two before it than alone
       (entropies of the counts, in bits; letters mapped to a small alphabet first) */
    for (p = 0; p < 256; p++) letter[p] = -1;
    for (i = 0; i < a->count; i++)
        if (letter[a->tokens[i]] < 0) letter[a->tokens[i]] = nletters++;
    ASSERT(nletters <= 64);
    for (i = 2; i < a->count; i++) {
        uni[letter[a->tokens[i]]] += 1;
        tri[letter[a->tokens[i - 2]] * 64 + letter[a->tokens[i - 1]]][letter[a->tokens[i]]] += 1;
    }
    total = (double)(a->count - 2);
    for (p = 0; p < 64 * 64; p++) {
        double row = 0;
        if (p < 64 && uni[p] > 0) h1 -= uni[p] / total * log2(uni[p] / total);
        for (q = 0; q < 64; q++) row += tri[p][q];
        for (q = 0; q < 64; q++)
            if (tri[p][q] > 0) h3 -= tri[p][q] / total * log2(tri[p][q] / row);
    }
    ASSERT_GT(h1, 3.5);     /* 4.39 bits a byte alone at seed 7 */
    ASSERT_LT(h3, 0.4 * h1); /* 1.28 given the two before */
    pdp_token_dataset_free(a);
    PASS();
}

TEST data_tokens_sample_draws_every_offset_of_its_split(void)
{
    uint8_t text[200];
    pdp_token_dataset_desc d = {0};
    pdp_token_dataset *ds;
    pdp_rng r, r2;
    int32_t x[400 * 5], y[400 * 5], x2[400 * 5];
    int seen[200] = {0}, i, t;
    for (i = 0; i < 200; i++) text[i] = (uint8_t)i; /* a byte names its position */
    ASSERT_EQ(0, write_file(tmp_path("ramp"), text, sizeof text));
    d.context = 5;
    ASSERT_ENUM_EQ(PDP_OK, pdp_token_dataset_load(&ds, tmp_path("ramp"), &d), pdp_status_name);
    ASSERT_EQ(180, (int)ds->split_at); /* 200 x 0.9 */
    pdp_rng_seed(&r, 4, 0);
    r2 = r;
    ASSERT_ENUM_EQ(PDP_OK, pdp_token_dataset_sample(ds, PDP_SPLIT_VAL, &r, 400, x, y),
                   pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_token_dataset_sample(ds, PDP_SPLIT_VAL, &r2, 400, x2, NULL),
                   pdp_status_name);
    ASSERT_MEM_EQ(x, x2, sizeof x); /* the generator decides */
    for (i = 0; i < 400; i++) {
        int o = x[i * 5];
        ASSERT(o >= 180 && o + 5 < 200 + 0 + 1); /* x and y inside the validation split */
        for (t = 0; t < 5; t++) {
            ASSERT_EQ(o + t, x[i * 5 + t]);
            ASSERT_EQ(o + t + 1, y[i * 5 + t]);
        }
        seen[o]++;
    }
    for (i = 180; i < 195; i++) ASSERT_GT(seen[i], 0); /* all 20 - 5 starts drawn */
    for (i = 195; i < 200; i++) ASSERT_EQ(0, seen[i]);
    pdp_token_dataset_free(ds);
    PASS();
}

TEST data_tokens_batch_allocates_nothing(void)
{
    pdp_token_dataset_desc d = {0};
    pdp_token_dataset *ds;
    int64_t idx[32];
    int32_t x[32 * 16], y[32 * 16];
    pdp_rng r;
    long before;
    int i, k;
    d.context = 16;
    d.max_tokens = 4096;
    ASSERT_ENUM_EQ(PDP_OK, pdp_token_dataset_synthetic(&ds, &d), pdp_status_name);
    pdp_rng_seed(&r, 1, 0);
    before = g_allocs;
    for (k = 0; k < 20; k++) {
        for (i = 0; i < 32; i++) idx[i] = (k * 32 + i) % ds->windows[PDP_SPLIT_TRAIN];
        ASSERT_ENUM_EQ(PDP_OK, pdp_token_dataset_batch(ds, PDP_SPLIT_TRAIN, idx, 32, x, y),
                       pdp_status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp_token_dataset_sample(ds, PDP_SPLIT_VAL, &r, 32, x, y),
                       pdp_status_name);
    }
    ASSERT_EQ(before, g_allocs);
    pdp_token_dataset_free(ds);
    PASS();
}

/* got is want, and the message starts with "fn: " and holds s1, s2 and s3. */
static enum greatest_test_res check_error(pdp_status got, pdp_status want, const char *fn,
                                          const char *s1, const char *s2, const char *s3)
{
    const char *msg = pdp_last_error();
    ASSERT_ENUM_EQm(msg, want, got, pdp_status_name);
    ASSERTm(msg, strncmp(msg, fn, strlen(fn)) == 0 && msg[strlen(fn)] == ':');
    ASSERTm(msg, strstr(msg, s1) && strstr(msg, s2) && strstr(msg, s3));
    PASS();
}

TEST data_tokens_errors_name_the_path_and_lengths(void)
{
    static const char ld[] = "pdp_token_dataset_load", sy[] = "pdp_token_dataset_synthetic",
                      ba[] = "pdp_token_dataset_batch", sa[] = "pdp_token_dataset_sample";
    pdp_token_dataset_desc d = {0};
    pdp_token_dataset *ds = NULL, *ok;
    int64_t idx[3] = {0, 1, 2};
    int32_t x[3 * 4], y[3 * 4];
    pdp_rng r;
    int i;
    char buf[120], dir[600];
    snprintf(dir, sizeof dir, "%s", tmp_path("dats")); /* tmp_path's buffers rotate */
    d.context = 4;
    /* a path that is not there */
    ds = (pdp_token_dataset *)&d;
    CHECK_CALL(check_error(pdp_token_dataset_load(&ds, tmp_path("missing"), &d), PDP_ERR_IO, ld,
                           tmp_path("missing"), "No such file", "apt-get install fortunes"));
    ASSERT(ds == NULL);
    /* empty: a file, a directory with only *.dat files and a subdirectory, one whose only
       text file is empty */
    ASSERT_EQ(0, write_file(tmp_path("empty.txt"), "", 0));
    CHECK_CALL(check_error(pdp_token_dataset_load(&ds, tmp_path("empty.txt"), &d),
                           PDP_ERR_INVALID, ld, tmp_path("empty.txt"), "is empty", ""));
    ASSERT(mkdir(dir, 0700) == 0 || errno == EEXIST);
    ASSERT(mkdir(tmp_path("dats/sub"), 0700) == 0 || errno == EEXIST);
    ASSERT_EQ(0, write_file(tmp_path("dats/x.dat"), "index", 5));
    ASSERT_EQ(0, write_file(tmp_path("dats/sub/text"), "hidden text", 11));
    CHECK_CALL(check_error(pdp_token_dataset_load(&ds, dir, &d), PDP_ERR_INVALID, ld, dir,
                           "holds no text file", ""));
    ASSERT_EQ(0, write_file(tmp_path("dats/y"), "", 0));
    CHECK_CALL(check_error(pdp_token_dataset_load(&ds, dir, &d), PDP_ERR_INVALID, ld, dir,
                           "its 1 files hold no text", ""));
    ASSERT(ds == NULL);
    /* too short for T + 1 in each split: 20 bytes, 18 and 2; 5 and no_validation: 5 < 6 */
    ASSERT_EQ(0, write_file(tmp_path("short.txt"), "twenty bytes of text", 20));
    CHECK_CALL(check_error(pdp_token_dataset_load(&ds, tmp_path("short.txt"), &d),
                           PDP_ERR_INVALID, ld, tmp_path("short.txt"),
                           "20 tokens split into 18 for training and 2 for validation",
                           "context + 1 = 5"));
    d.context = 5;
    d.no_validation = true;
    d.max_tokens = 5;
    CHECK_CALL(check_error(pdp_token_dataset_load(&ds, tmp_path("short.txt"), &d),
                           PDP_ERR_INVALID, ld, tmp_path("short.txt"), "5 tokens",
                           "context + 1 = 6"));
    d.max_tokens = 6; /* one window exactly */
    ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK,
                    pdp_token_dataset_load(&ok, tmp_path("short.txt"), &d), pdp_status_name);
    ASSERT_EQ(1, (int)ok->windows[PDP_SPLIT_TRAIN]);
    pdp_token_dataset_free(ok);
    d.max_tokens = 5;
    CHECK_CALL(check_error(pdp_token_dataset_synthetic(&ds, &d), PDP_ERR_INVALID, sy,
                           "the synthetic text: 5 tokens", "context + 1 = 6", ""));
    /* not a file or a directory */
    d.max_tokens = 0;
    CHECK_CALL(check_error(pdp_token_dataset_load(&ds, TEST_NULL_DEVICE, &d), PDP_ERR_IO, ld,
                           TEST_NULL_DEVICE, "neither a regular file nor a directory", ""));
    /* the desc */
    d.no_validation = false;
    for (i = 0; i < 3; i++) { /* 0, negative, too large for a window's count */
        d.context = i == 2 ? INT64_MAX : i ? -3 : 0;
        snprintf(buf, sizeof buf, "desc.context is %lld (required, in [1, ", (long long)d.context);
        CHECK_CALL(check_error(pdp_token_dataset_load(&ds, tmp_path("short.txt"), &d),
                               PDP_ERR_INVALID, ld, buf, "", ""));
        CHECK_CALL(check_error(pdp_token_dataset_synthetic(&ds, &d), PDP_ERR_INVALID, sy, buf,
                               "", ""));
    }
    CHECK_CALL(check_error(pdp_token_dataset_load(&ds, tmp_path("short.txt"), NULL),
                           PDP_ERR_INVALID, ld, "desc.context is 0", "", ""));
    d.context = 4;
    d.val_fraction = 1.0;
    CHECK_CALL(check_error(pdp_token_dataset_synthetic(&ds, &d), PDP_ERR_INVALID, sy,
                           "desc.val_fraction is 1", "", ""));
    d.val_fraction = -0.25;
    CHECK_CALL(check_error(pdp_token_dataset_synthetic(&ds, &d), PDP_ERR_INVALID, sy,
                           "desc.val_fraction is -0.25", "", ""));
    d.val_fraction = 0.2;
    d.no_validation = true;
    CHECK_CALL(check_error(pdp_token_dataset_synthetic(&ds, &d), PDP_ERR_INVALID, sy,
                           "desc.no_validation is set and desc.val_fraction is 0.2", "", ""));
    d.val_fraction = 0;
    d.no_validation = false;
    d.max_tokens = -1;
    CHECK_CALL(check_error(pdp_token_dataset_synthetic(&ds, &d), PDP_ERR_INVALID, sy,
                           "desc.max_tokens is -1", "", ""));
    CHECK_CALL(check_error(pdp_token_dataset_load(NULL, dir, &d), PDP_ERR_INVALID, ld,
                           "out is NULL", "", ""));
    CHECK_CALL(check_error(pdp_token_dataset_load(&ds, NULL, &d), PDP_ERR_INVALID, ld,
                           "path is NULL", "", ""));
    /* batches: a window outside the split fails before anything is written */
    d.max_tokens = 100; /* 90 and 10 tokens: 22 and 2 windows of 4 */
    ASSERT_ENUM_EQ(PDP_OK, pdp_token_dataset_synthetic(&ok, &d), pdp_status_name);
    ASSERT_EQ(2, (int)ok->windows[PDP_SPLIT_VAL]);
    memset(x, 0x5a, sizeof x);
    CHECK_CALL(check_error(pdp_token_dataset_batch(ok, PDP_SPLIT_VAL, idx, 3, x, y),
                           PDP_ERR_INVALID, ba, "windows[2] = 2", "the validation split's [0, 2)",
                           ""));
    for (i = 0; i < 12; i++) ASSERT_EQ(0x5a5a5a5a, x[i]);
    idx[0] = -1;
    CHECK_CALL(check_error(pdp_token_dataset_batch(ok, PDP_SPLIT_TRAIN, idx, 1, x, y),
                           PDP_ERR_INVALID, ba, "windows[0] = -1", "training split's [0, 22)",
                           ""));
    CHECK_CALL(check_error(pdp_token_dataset_batch(ok, PDP_SPLIT_TRAIN, NULL, 1, x, y),
                           PDP_ERR_INVALID, ba, "windows is NULL", "", ""));
    CHECK_CALL(check_error(pdp_token_dataset_batch(ok, PDP_SPLIT_TRAIN, idx, -1, x, y),
                           PDP_ERR_INVALID, ba, "count is -1", "", ""));
    CHECK_CALL(check_error(pdp_token_dataset_batch(ok, (pdp_split)2, idx, 1, x, y),
                           PDP_ERR_INVALID, ba, "split is 2", "", ""));
    CHECK_CALL(check_error(pdp_token_dataset_batch(NULL, PDP_SPLIT_TRAIN, idx, 1, x, y),
                           PDP_ERR_INVALID, ba, "dataset is NULL", "", ""));
    CHECK_CALL(check_error(pdp_token_dataset_sample(ok, PDP_SPLIT_TRAIN, NULL, 1, x, y),
                           PDP_ERR_INVALID, sa, "r is NULL", "", ""));
    pdp_token_dataset_free(ok);
    d.no_validation = true; /* no validation split to sample */
    ASSERT_ENUM_EQ(PDP_OK, pdp_token_dataset_synthetic(&ok, &d), pdp_status_name);
    pdp_rng_seed(&r, 1, 0);
    CHECK_CALL(check_error(pdp_token_dataset_sample(ok, PDP_SPLIT_VAL, &r, 1, x, y),
                           PDP_ERR_INVALID, sa, "the validation split has 0 tokens",
                           "context + 1 = 5", ""));
    pdp_token_dataset_free(ok);
    PASS();
}

/* ---- evaluation ---- */

TEST data_model_accuracy_matches_a_naive_count(void)
{
    pdp_dataset_desc d = {0};
    pdp_model_desc md = {0};
    pdp_batcher_desc bd = {0};
    pdp_dataset *ds;
    pdp_model *m, *bad;
    pdp_batcher *b;
    pdp_tensor all;
    const pdp_tensor *logits;
    double acc = -1;
    int64_t i, right = 0;
    int c;
    d.flat = true;
    d.max_samples = 103;
    d.seed = 2;
    ASSERT_ENUM_EQ(PDP_OK, pdp_dataset_synthetic(&ds, false, &d), pdp_status_name);
    md.input_shape[0] = 784;
    md.seed = 9;
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_create(&m, &md), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_linear(m, 10), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_reserve(m, 103), pdp_status_name);
    /* the reference: the whole set in one forward, argmax by hand (first largest wins) */
    ASSERT_ENUM_EQ(PDP_OK, pdp_dataset_view(ds, 0, 103, &all), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward(m, &all, &logits), pdp_status_name);
    for (i = 0; i < 103; i++) {
        const float *row = (const float *)logits->data + i * 10;
        int arg = 0;
        for (c = 1; c < 10; c++)
            if (row[c] > row[arg]) arg = c;
        right += arg == ds->labels[i];
    }
    ASSERT(right > 0 && right < 103); /* an untrained model: neither extreme */
    bd.batch_size = 10; /* 10 batches of 10 and one of 3 */
    bd.shuffle = true;
    bd.seed = 4;
    ASSERT_ENUM_EQ(PDP_OK, pdp_batcher_create(&b, ds, &bd), pdp_status_name);
    pdp_batcher_reset(b, 7);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_accuracy(m, b, &acc), pdp_status_name);
    ASSERT_EQ((double)right / 103.0, acc);
    ASSERT(pdp_model_is_training(m)); /* back in the mode it was in */
    pdp_model_set_training(m, false);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_accuracy(m, b, &acc), pdp_status_name);
    ASSERT_EQ((double)right / 103.0, acc);
    ASSERT(!pdp_model_is_training(m));
    /* a model that does not take these samples: the forward's error, named */
    md.input_shape[0] = 100;
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_create(&bad, &md), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_linear(bad, 10), pdp_status_name);
    ASSERT(pdp_model_accuracy(bad, b, &acc) != PDP_OK);
    ASSERT(strstr(pdp_last_error(), "pdp_model_accuracy: ") == pdp_last_error());
    ASSERT(strstr(pdp_last_error(), "784"));
    ASSERT_EQ(0.0, acc);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_model_accuracy(m, NULL, &acc), pdp_status_name);
    pdp_model_free(bad);
    pdp_batcher_free(b);
    pdp_model_free(m);
    pdp_dataset_free(ds);
    PASS();
}

TEST data_sizes_that_overflow_fail(void)
{
    pdp_dataset_desc d;
    pdp_dataset *ds;
    pdp_dist_sampler *s = NULL;
    pdp_dist_sampler_desc sd;
    pdp_batcher *b;
    pdp_batcher_desc bd;
    pdp_tensor x;
    memset(&d, 0, sizeof d);
    d.max_samples = 5;
    ASSERT_ENUM_EQ(PDP_OK, pdp_dataset_synthetic(&ds, true, &d), pdp_status_name);
    /* first + n overflowed in the message (a signed overflow that UBSan reports) */
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_dataset_view(ds, INT64_MAX, 2, &x), pdp_status_name);
    ASSERT(strstr(pdp_last_error(),
                  "pdp_dataset_view: 2 samples from sample 9223372036854775807 outside [0, 5)"));
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_dataset_view(ds, 2, INT64_MAX, &x), pdp_status_name);
    /* a batch whose floats overflow */
    memset(&bd, 0, sizeof bd);
    bd.batch_size = INT64_MAX;
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_batcher_create(&b, ds, &bd), pdp_status_name);
    pdp_dataset_free(ds);
    /* max_samples x 784 floats wrapped: a small buffer, then writes past it */
    d.max_samples = (int64_t)1 << 60;
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_dataset_synthetic(&ds, true, &d), pdp_status_name);
    ASSERT(ds == NULL);
    ASSERT(strstr(pdp_last_error(), "pdp_dataset_synthetic: 1152921504606846976 samples of "
                                    "28x28 exceed"));
    /* the sampler's dataset_size + world_size - 1 overflowed */
    memset(&sd, 0, sizeof sd);
    sd.dataset_size = INT64_MAX;
    sd.world_size = 2;
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_dist_sampler_create(&s, &sd), pdp_status_name);
    ASSERT(s == NULL);
    ASSERT(strstr(pdp_last_error(), "pdp_dist_sampler_create: dataset_size 9223372036854775807"));
    PASS();
}

SUITE(data)
{
    RUN_TEST(data_inflate_stored_blocks);
    RUN_TEST(data_inflate_fixed_huffman);
    RUN_TEST(data_inflate_rejects_hostile_streams);
    RUN_TEST(data_gzip_header_flags);
    RUN_TEST(data_gzip_matches_gzip_and_zlib);
    RUN_TEST(data_gzip_corrupt_and_truncated);
    RUN_TEST(data_gzip_prefix_stops_at_the_callers_rule);
    RUN_TEST(data_idx_round_trip);
    RUN_TEST(data_idx_errors_name_the_file);
    RUN_TEST(data_idx_max_samples_reads_only_those);
    RUN_TEST(data_idx_max_samples_hostile_header_reserves_little);
    RUN_TEST(data_fashion_mnist_real_files);
    RUN_TEST(data_fashion_mnist_missing_says_how_to_get_it);
    RUN_TEST(data_fashion_mnist_synthetic_fallback);
    RUN_TEST(data_synthetic_is_seeded_and_learnable);
    RUN_TEST(data_permutation_is_seeded_permutation);
    RUN_TEST(data_batcher_covers_each_sample_once);
    RUN_TEST(data_batcher_index_lists_and_no_allocation);
    RUN_TEST(data_batcher_takes_a_samplers_epochs);
    RUN_TEST(data_arrays_regression_batches_are_the_arrays);
    RUN_TEST(data_arrays_classification_labels_are_an_int32_tensor);
    RUN_TEST(data_arrays_bad_input_names_the_field);
    RUN_TEST(data_arrays_gather_next_and_accuracy_per_kind);
    RUN_TEST(data_arrays_mse_of_a_batch_matches_a_naive_loop);
    RUN_TEST(data_model_accuracy_matches_a_naive_count);
    RUN_TEST(data_sizes_that_overflow_fail);
    RUN_TEST(data_tokens_directory_windows_and_split);
    RUN_TEST(data_tokens_fortunes_as_cat_reads_it);
    RUN_TEST(data_tokens_distributed_sampler_covers_each_window);
    RUN_TEST(data_tokens_synthetic_is_seeded_and_learnable);
    RUN_TEST(data_tokens_sample_draws_every_offset_of_its_split);
    RUN_TEST(data_tokens_batch_allocates_nothing);
    RUN_TEST(data_tokens_errors_name_the_path_and_lengths);
}

GREATEST_MAIN_DEFS();

int main(int argc, char **argv)
{
    if (test_temp_dir(g_dir, sizeof g_dir, "pdp_test_data") != 0) { perror("mkdtemp"); return 1; }
    GREATEST_MAIN_BEGIN();
    RUN_SUITE(data);
    (void)test_remove_tree(g_dir);
    GREATEST_MAIN_END();
}
