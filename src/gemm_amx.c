/* gemm_amx: pdp_gemm_bf16's AMX path (PDP_BF16_PATH_AMX, gemm.h), the product run on
   Intel AMX tiles (TDPBF16PS), and an emulation of those tiles that runs the same driver
   on any CPU for the tests (PDP__AMX_EMULATE).

   Layout. Every tile is 16 rows x 64 bytes (palette 1). A tile of A is 16 rows of op(A)
   x 16 pair words (32 bf16 along k: row-major [row][pair]); a tile of B is 16 pairs x
   16 columns of pair words ([pair][column], AMX's pair or "VNNI" layout); a pair word
   holds (x[2p] low, x[2p+1] high), as gemm_bf16.c's packing makes it. k is padded with
   zero pairs to a multiple of 16 pairs (one "k step"), rows and columns past m and n
   with zero words. A part of the product cuts its columns into blocks whose packed B
   fits PDP__AMX_NC_BYTES (1 MiB: L2's share; one block at k <= 512 up to 1024 columns),
   packs a block's B columns once ([pair][column] panels of 32 columns, or 16 when
   n <= 16) and then, per block of 32 rows of A (64 when n <= 16), packs that block
   straight into tile order ([step][row][pair]: each tile 1 KiB, contiguous) or, A stored
   along k with AVX512-BF16, into rows ([row][step][pair]: the tiles loaded with the rows'
   stride, the rows written as they are read). The fp32 -> bf16 rounding is fused into the packing: with
   AVX512-BF16, vcvtne2ps2bf16 under gemm_bf16.c's subnormal rule (pdp__bf16_cvt2), the
   operands read along their stored rows (rows of B along n interleaved by vpermw; rows
   of op(A) across k and of op(B) along k as 16 x 16 words transposed in registers);
   otherwise, and for a gathered B, pdp__bf16_bits and gemm_bf16.c's panel packing. The
   words are the same up to subnormals, which every kernel reads as zero.

   Streaming. Where one side of C is at most 16 and, with AVX512-BF16, the other operand
   is stored along the rows its tiles take (n <= 16 and op(A) stored along k; m <= 16 and
   op(B) stored k x n), each of its values meets one tile product, so it is not packed:
   pdp__amx_kernel41_stream and pdp__amx_kernel12_stream convert it one k step at a time
   into two 4 KiB buffers that stay in L1, among the tile operations, over all of k (no
   cache blocks: the packed side is one panel or one block of rows). bench/gemm bf16 (one
   thread, operands 64-byte aligned, medians of 3 runs, a loaded 2-core Sapphire Rapids):
   512 x 512 x 10 NT 27 -> 20 us a call, 10 x 512 x 512 TN 39 -> 27 us.

   Kernel. A block of C is 2 x 2 tiles (32 x 32: tmm0-3 accumulate, tmm4-5 hold two
   tiles of A, tmm6-7 two of B; per k step two A and two B tile loads feed four
   TDPBF16PS) or, when n <= 16, 4 x 1 (64 x 16: tmm0-3 accumulate, four A tiles in
   tmm5-7 in turn, one B tile in tmm4), so that the 10-class layer does not pay for 16
   zero columns in 32, or, when m <= 16 < n, 1 x 2 (16 x 32: tmm0-1 accumulate, one A
   tile in tmm4, two of B in tmm6-7), so that its dW (10 x 512 x 512 TN) does not pay for
   16 zero rows in 32 (one thread, a loaded 2-core Sapphire Rapids: 51.5-52.8 -> 44.9-47.8
   us a call). k is cut into cache blocks of at most PDP__AMX_KC steps (the A
   block's share, 24 KiB at 12 steps, stays in L1 while the B panels pass); between blocks the
   accumulators are stored to an fp32 buffer and loaded back, exactly, so each
   element's chain is one chain over the pairs from 0. After the last block a whole
   block with alpha 1 and beta 0 is stored straight into C (C = acc, the same bits);
   any other goes through the epilogue, C = alpha acc + beta C (pdp__bf16_out's rule:
   beta C rounded before the sum, C not read when beta == 0), then the bias and the
   ReLU where a Linear asks (pdp__gemm_bf16_bias: one pass over C), with AVX-512 where it
   exists, masked at edges, one panel after its tile stores (reading them back at once
   stalled: 12% of a 512^3 product). A fused GELU (gemm_bf16.c's pdp__bf16_gelu_tile) runs
   once a block of rows has all its panels written, over the block's rows of C (in L2): run
   on each panel after its epilogue, among the tile operations, it made bench/gpt's c_fc
   (2048 x 1536 x 384, one thread, cached operands) take 5.7 ms against 4.3 ms for the
   product (2.7 ms) and a GELU pass after it; per block of rows 4.6 ms; on 2 threads 2.5 ms
   against 3.1 ms (the GELU pass is bound by memory there).
   The tile configuration is loaded once per part (thread) per call and released at
   its end.

   Invariants:
   - Per element of C, one sequence of TDPBF16PS over the k steps in order from 0, each
     step's 16 pairs added to the fp32 accumulator (the cache blocks continue it exactly),
     then alpha acc + beta C. That sequence depends on nothing but k, so the bits do not
     depend on the thread count, the block shapes or how the parts are cut. The zero
     pairs that pad k add +0: they can turn a final -0 into +0, nothing else.
   - What one TDPBF16PS computes. Intel's pseudo-code (SDM vol. 2, TDPBF16PS): for each
     pair in order, acc += a[2p] b[2p], then acc += a[2p+1] b[2p+1], each an FMA of the
     exact product rounded to nearest even, subnormal bf16 inputs read as zero (DAZ),
     subnormal results flushed to zero (FTZ), MXCSR not consulted. The emulation below
     implements exactly that. The hardware, measured on an Intel Xeon (Sapphire Rapids
     class) with one instruction on random data: a pair alone gives fl(acc + fl(a[2p]
     b[2p] + a[2p+1] b[2p+1])) in every element (not the pseudo-code's two roundings);
     with two or more pairs no sequential or tree order of fp32 roundings tried matched
     every element. So the hardware is held to the fp32 summation bound around the
     emulation (tests/test_bf16.c states it and counts the elements that agree bit for
     bit), and the emulation is held to the pseudo-code bit for bit.
   - The emulation (PDP__AMX_EMULATE, a test define) runs this file's driver, packing
     and kernels on tiles held in memory (LDTILECFG, TILEZERO, TILELOADD, TILESTORED,
     TDPBF16PS), on any CPU, with or without SIMD.
   - Memory: a part's panels and accumulators live in its thread scratch
     (pdp__thread_scratch); nothing is allocated per call. If the scratch cannot grow,
     the part computes each element by the pseudo-code's chain, unpacked (the
     emulation's bits).
   References: Intel SDM vol. 2 (LDTILECFG, TILELOADD, TDPBF16PS); Intel Optimization
   Reference Manual, ch. "Intel AMX" (TDPBF16PS: 16 cycles per tile op throughput, two
   A and two B tiles feeding four accumulators); oneDNN's brgemm AMX kernels. */

#include "internal.h"

#if defined(PDP__AMX_EMULATE)
#  define PDP__AMX_EMU 1
#else
#  define PDP__AMX_EMU 0
#endif

#if PDP__BF16_AMX || PDP__AMX_EMU

#define PDP__AMX_KT 16 /* pairs per k step: one 64-byte row of an A tile */
#define PDP__AMX_TW 256 /* words per tile: 16 rows x 16 words */
/* k steps per cache block, at most: 2 A tiles x 12 steps = 24 KiB of A reused across the
   panels. CPU time per call (perf stat task-clock, 1000 calls, 3 runs, one thread, a
   loaded 2-core Sapphire Rapids): 512x512x784 NT 446-451 us at 12 (blocks 9, 9, 7),
   486-502 at 8, 487-627 at 16; 512^3 NN and 512x784x512 TN the same within the noise;
   at 4, 10% slower. */
#ifndef PDP__AMX_KC
#  define PDP__AMX_KC 12
#endif
/* Bytes of packed B per column block, at most: a part's columns are cut into blocks
   whose panels (all of k) stay in L2 while every row block of A passes them. 1024^3 NN
   (2 MiB of panels as one block): 725 -> 827 GFLOP/s at 1 MiB (medians of 7 alternated
   runs), 512 KiB slower than one block (one thread, CPU time, a loaded 2-core Sapphire
   Rapids); at k <= 512 one block holds 1024 columns: the MLP's batch-512 products are
   unchanged. */
#ifndef PDP__AMX_NC_BYTES
#  define PDP__AMX_NC_BYTES (1 << 20)
#endif

typedef struct pdp__amx_tilecfg { /* LDTILECFG's 64-byte operand */
    uint8_t palette;              /* 1 */
    uint8_t start_row;            /* 0 */
    uint8_t reserved[14];         /* zero */
    uint16_t colsb[16];           /* bytes per row of tile i (unused tiles 0) */
    uint8_t rows[16];             /* rows of tile i */
} pdp__amx_tilecfg;

/* Tiles held in memory (the emulation); the hardware path passes NULL. */
typedef struct pdp__amx_tiles pdp__amx_tiles;

/* ---- gemm_amx: tile emulation ---- */
#  if PDP__AMX_EMU
struct pdp__amx_tiles {
    pdp__amx_tilecfg cfg;
    unsigned char t[8][16][64];
};

PDP__PRIVATE void pdp__amx_emu_config(pdp__amx_tiles *e, const pdp__amx_tilecfg *cfg)
{
    e->cfg = *cfg;
    memset(e->t, 0, sizeof e->t); /* LDTILECFG zeroes the tiles */
}

PDP__PRIVATE void pdp__amx_emu_zero(pdp__amx_tiles *e, int t)
{
    memset(e->t[t], 0, sizeof e->t[t]);
}

/* TILELOADD: rows[t] rows of colsb[t] bytes from base + r stride; the rest zero. */
PDP__PRIVATE void pdp__amx_emu_load(pdp__amx_tiles *e, int t, const void *base, int64_t stride)
{
    int r;
    memset(e->t[t], 0, sizeof e->t[t]);
    for (r = 0; r < e->cfg.rows[t]; r++)
        memcpy(e->t[t][r], (const char *)base + r * stride, e->cfg.colsb[t]);
}

PDP__PRIVATE void pdp__amx_emu_store(pdp__amx_tiles *e, int t, void *base, int64_t stride)
{
    int r;
    for (r = 0; r < e->cfg.rows[t]; r++)
        memcpy((char *)base + r * stride, e->t[t][r], e->cfg.colsb[t]);
}

/* acc + a b for bf16 a, b: DAZ inputs, one rounding to nearest even (FMA; the product
   of two bf16 values is exact unless below 2^-126), FTZ result. */
static inline float pdp__amx_emu_fma(uint32_t a, uint32_t b, float acc)
{
    float r = fmaf(pdp__bf16_daz((uint16_t)a), pdp__bf16_daz((uint16_t)b), acc);
    return (r < 1.17549435e-38f && r > -1.17549435e-38f) ? r * 0.0f : r;
}

/* TDPBF16PS c, a, b by the SDM's pseudo-code: for each row m of c, for each pair k of
   a's row, for each column n of c: c[m][n] += a[m].bf16[2k] b[k].bf16[2n], then
   += a[m].bf16[2k+1] b[k].bf16[2n+1]. */
PDP__PRIVATE void pdp__amx_emu_dp(pdp__amx_tiles *e, int c, int a, int b)
{
    int m, k, n, pairs = e->cfg.colsb[a] / 4, cols = e->cfg.colsb[c] / 4;
    for (m = 0; m < e->cfg.rows[c]; m++) {
        float acc[16];
        memcpy(acc, e->t[c][m], sizeof acc);
        for (k = 0; k < pairs; k++) {
            uint32_t aw, bw;
            memcpy(&aw, e->t[a][m] + 4 * k, 4);
            for (n = 0; n < cols; n++) {
                memcpy(&bw, e->t[b][k] + 4 * n, 4);
                acc[n] = pdp__amx_emu_fma(aw & 0xffffu, bw & 0xffffu, acc[n]);
                acc[n] = pdp__amx_emu_fma(aw >> 16, bw >> 16, acc[n]);
            }
        }
        memcpy(e->t[c][m], acc, sizeof acc);
    }
}
#  endif

/* One tile operation: on the emulated tiles when e is not NULL, else the instruction. */
#  if PDP__BF16_AMX && PDP__AMX_EMU
#    define PDP__AMX_OP(e, emu, hw)                                                           \
        do {                                                                                   \
            if (e)                                                                             \
                emu;                                                                           \
            else                                                                               \
                hw;                                                                            \
        } while (0)
#  elif PDP__BF16_AMX
#    define PDP__AMX_OP(e, emu, hw)                                                           \
        do {                                                                                   \
            (void)(e);                                                                         \
            hw;                                                                                \
        } while (0)
#  else
#    define PDP__AMX_OP(e, emu, hw) emu
#  endif
#  if PDP__BF16_AMX
#    define PDP__AMX_TARGET PDP__TARGET("amx-tile,amx-bf16")
#  else
#    define PDP__AMX_TARGET
#  endif
#  define PDP__AMX_ZERO(e, t) PDP__AMX_OP(e, pdp__amx_emu_zero(e, t), _tile_zero(t))
#  define PDP__AMX_LOAD(e, t, p, s)                                                           \
      PDP__AMX_OP(e, pdp__amx_emu_load(e, t, p, s), _tile_loadd(t, p, s))
#  define PDP__AMX_STORE(e, t, p, s)                                                          \
      PDP__AMX_OP(e, pdp__amx_emu_store(e, t, p, s), _tile_stored(t, p, s))
#define PDP__AMX_DP(e, c, a, b) PDP__AMX_OP(e, pdp__amx_emu_dp(e, c, a, b), _tile_dpbf16ps(c, a, b))

/* Where a block's packed A puts its tiles: tile i of step s at a + s step + i tile words,
   its rows stride bytes apart. Tile order: step 16 height, tile 256, stride 64; rows
   (pdp__amx_pack_a_rows_avx512, PDP__AMX_AROW words per row): step 16, tile 16 rows,
   stride 4 rows. */
#define PDP__AMX_AROW(steps) (((steps) + 1) * PDP__AMX_KT)
typedef struct pdp__amx_alay {
    int64_t step, tile, stride;
} pdp__amx_alay;

/* ---- gemm_amx: kernels ----
   steps k steps from a (the block's A tiles: step s, tile i at a + s al->step + i
   al->tile words, row stride al->stride bytes) and b (a panel of w = 16 nb columns: step s, tile j at
   b + s 16 w + 16 j, row stride w words) into the accumulators, which start at zero
   (in == NULL) or from in (an fp32 block, row stride w: tile (i, j) at in + 16 i w +
   16 j), and are stored to out (row stride ldo floats: the same buffer, or C itself). */

PDP__AMX_TARGET PDP__PRIVATE void pdp__amx_kernel22(pdp__amx_tiles *e, int64_t steps,
                                                    const uint32_t *a, const pdp__amx_alay *al,
                                                    const uint32_t *b, const float *in,
                                                    float *out, int64_t ldo)
{
    const int64_t so = ldo * 4;
    int64_t s;
    if (in) {
        PDP__AMX_LOAD(e, 0, in, 128);
        PDP__AMX_LOAD(e, 1, in + 16, 128);
        PDP__AMX_LOAD(e, 2, in + 512, 128);
        PDP__AMX_LOAD(e, 3, in + 528, 128);
    } else {
        PDP__AMX_ZERO(e, 0);
        PDP__AMX_ZERO(e, 1);
        PDP__AMX_ZERO(e, 2);
        PDP__AMX_ZERO(e, 3);
    }
    for (s = 0; s < steps; s++, a += al->step, b += 16 * 32) {
        PDP__AMX_LOAD(e, 4, a, al->stride);
        PDP__AMX_LOAD(e, 6, b, 128);
        PDP__AMX_LOAD(e, 7, b + 16, 128);
        PDP__AMX_DP(e, 0, 4, 6);
        PDP__AMX_DP(e, 1, 4, 7);
        PDP__AMX_LOAD(e, 5, a + al->tile, al->stride);
        PDP__AMX_DP(e, 2, 5, 6);
        PDP__AMX_DP(e, 3, 5, 7);
    }
    PDP__AMX_STORE(e, 0, out, so);
    PDP__AMX_STORE(e, 1, out + 16, so);
    PDP__AMX_STORE(e, 2, out + 16 * ldo, so);
    PDP__AMX_STORE(e, 3, out + 16 * ldo + 16, so);
}

/* 1 x 2 tiles (16 x 32: tmm0-1 accumulate, tmm4 holds the A tile, tmm6-7 two of B), for
   m <= 16, where 2 x 2 spends half its tile operations on zero rows (the 10-class layer's
   dW, 10 x 512 x 512). The same sequence per element as kernel22. */
PDP__AMX_TARGET PDP__PRIVATE void pdp__amx_kernel12(pdp__amx_tiles *e, int64_t steps,
                                                    const uint32_t *a, const pdp__amx_alay *al,
                                                    const uint32_t *b, const float *in,
                                                    float *out, int64_t ldo)
{
    const int64_t so = ldo * 4;
    int64_t s;
    if (in) {
        PDP__AMX_LOAD(e, 0, in, 128);
        PDP__AMX_LOAD(e, 1, in + 16, 128);
    } else {
        PDP__AMX_ZERO(e, 0);
        PDP__AMX_ZERO(e, 1);
    }
    for (s = 0; s < steps; s++, a += al->step, b += 16 * 32) {
        PDP__AMX_LOAD(e, 4, a, al->stride);
        PDP__AMX_LOAD(e, 6, b, 128);
        PDP__AMX_LOAD(e, 7, b + 16, 128);
        PDP__AMX_DP(e, 0, 4, 6);
        PDP__AMX_DP(e, 1, 4, 7);
    }
    PDP__AMX_STORE(e, 0, out, so);
    PDP__AMX_STORE(e, 1, out + 16, so);
}

PDP__AMX_TARGET PDP__PRIVATE void pdp__amx_kernel41(pdp__amx_tiles *e, int64_t steps,
                                                    const uint32_t *a, const pdp__amx_alay *al,
                                                    const uint32_t *b, const float *in,
                                                    float *out, int64_t ldo)
{
    const int64_t so = ldo * 4;
    int64_t s;
    if (in) {
        PDP__AMX_LOAD(e, 0, in, 64);
        PDP__AMX_LOAD(e, 1, in + 256, 64);
        PDP__AMX_LOAD(e, 2, in + 512, 64);
        PDP__AMX_LOAD(e, 3, in + 768, 64);
    } else {
        PDP__AMX_ZERO(e, 0);
        PDP__AMX_ZERO(e, 1);
        PDP__AMX_ZERO(e, 2);
        PDP__AMX_ZERO(e, 3);
    }
    for (s = 0; s < steps; s++, a += al->step, b += 16 * 16) {
        PDP__AMX_LOAD(e, 4, b, 64);
        PDP__AMX_LOAD(e, 5, a, al->stride);
        PDP__AMX_LOAD(e, 6, a + al->tile, al->stride);
        PDP__AMX_DP(e, 0, 5, 4);
        PDP__AMX_LOAD(e, 7, a + 2 * al->tile, al->stride);
        PDP__AMX_DP(e, 1, 6, 4);
        PDP__AMX_LOAD(e, 5, a + 3 * al->tile, al->stride);
        PDP__AMX_DP(e, 2, 7, 4);
        PDP__AMX_DP(e, 3, 5, 4);
    }
    PDP__AMX_STORE(e, 0, out, so);
    PDP__AMX_STORE(e, 1, out + 16 * ldo, so);
    PDP__AMX_STORE(e, 2, out + 32 * ldo, so);
    PDP__AMX_STORE(e, 3, out + 48 * ldo, so);
}

#  if PDP__BF16_AMX
/* LDTILECFG of the whole 64-byte operand. Not gcc 12's _tile_loadconfig: its asm names an
   8-byte operand (a pointer's size), so gcc -O2 without -mamx-tile dropped the stores of
   rows and colsb as dead and loaded a configuration of empty tiles; the first
   TILEZERO then faulted (SIGILL; -march=native builds happened to keep the stores). */
PDP__AMX_TARGET PDP__PRIVATE void pdp__amx_loadconfig(const pdp__amx_tilecfg *cfg)
{
    __asm__ volatile("ldtilecfg %0" : : "m"(*cfg));
}
#  endif

PDP__AMX_TARGET PDP__PRIVATE void pdp__amx_config(pdp__amx_tiles *e)
{
    pdp__amx_tilecfg cfg;
    int t;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (t = 0; t < 8; t++) {
        cfg.rows[t] = 16;
        cfg.colsb[t] = 64;
    }
    PDP__AMX_OP(e, pdp__amx_emu_config(e, &cfg), pdp__amx_loadconfig(&cfg));
}

PDP__AMX_TARGET PDP__PRIVATE void pdp__amx_release(pdp__amx_tiles *e)
{
    (void)e;
    PDP__AMX_OP(e, (void)0, _tile_release());
}

/* ---- gemm_amx: packing A into tiles and the epilogue ---- */

/* Rows [r0, r0 + rows) of op(A) as `height` rows (the rest zero) in tile order: word q
   of row i in step s at dst[(s height + i) 16 + q] = pair 16 s + q (zero past k). */
PDP__PRIVATE void pdp__amx_pack_a(const pdp__bf16_args *g, int64_t r0, int rows, int height,
                                  int64_t steps, uint32_t *dst)
{
    int64_t s, p;
    int i, q;
    for (s = 0; s < steps; s++)
        for (i = 0; i < height; i++) {
            uint32_t *d = dst + (s * height + i) * 16;
            for (q = 0; q < 16; q++) {
                p = 2 * (16 * s + q);
                d[q] = i >= rows || p >= g->k ? 0u
                       : (uint32_t)pdp__bf16_aword(g, r0 + i, p) |
                             (p + 1 < g->k ? (uint32_t)pdp__bf16_aword(g, r0 + i, p + 1) << 16
                                           : 0u);
            }
        }
}

/* Columns [n0, n1) of op(B) as panels of w columns (panel j at dst + j w 16 steps:
   [pair][column], the pairs padded with zeros to whole steps, columns past n1 zero):
   gemm_bf16.c's packing (the path's), one panel at a time. */
PDP__PRIVATE void pdp__amx_pack_b(const pdp__bf16_args *g, int64_t n0, int64_t n1, int w,
                                  int64_t steps, uint32_t *dst)
{
    pdp_trans tbt = g->tb == PDP_NO_TRANS ? PDP_TRANS : PDP_NO_TRANS; /* op(B)^T, n x k */
    int64_t pairs = (g->k + 1) / 2, padded = steps * PDP__AMX_KT, j0;
    for (j0 = n0; j0 < n1; j0 += w, dst += w * padded) {
        int cols = (int)PDP__MIN((int64_t)w, n1 - j0);
        if (g->bh)
            g->pack_h(g->bh, g->brow, tbt, j0, cols, g->k, w, dst);
        else
            g->pack(g->b, g->ldb, tbt, j0, cols, g->k, w, dst);
        memset(dst + pairs * w, 0, (size_t)((padded - pairs) * w) * 4);
    }
}

/* C[0, mr) x [0, nr) = alpha acc + beta C (acc's row stride w), then + bias[j] (bias not
   NULL) and the ReLU (relu != 0): pdp__bf16_bias_relu. */
PDP__PRIVATE void pdp__amx_out(const float *acc, int w, float *c, int64_t ldc, int mr, int nr,
                               float alpha, float beta, const float *bias, int relu)
{
    int i, j;
    for (i = 0; i < mr; i++)
        for (j = 0; j < nr; j++)
            c[i * ldc + j] = pdp__bf16_bias_relu(
                pdp__bf16_out(acc[i * w + j], alpha, beta, c + i * ldc + j),
                bias ? bias + j : NULL, relu);
}

#  if PDP__BF16_X86
/* 16 values of x(., 2p) (lo) and x(., 2p + 1) (hi) as 16 pair words (lo_i | hi_i << 16):
   vcvtne2ps2bf16 (pdp__bf16_cvt2) and one vpermw. */
PDP__BF16_TARGET static inline __m512i pdp__amx_pairs16(__m512 lo, __m512 hi)
{
    const __m512i pair = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9,
                                          24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1,
                                          16, 0);
    return _mm512_permutexvar_epi16(pair, pdp__bf16_cvt2(lo, hi));
}

/* v, 16 x 16 words, transposed in place: four rounds of interleaving the 32-bit lanes of
   v[r] and v[r + 8] (each round rotates the 8 index bits, row then column, by one). */
PDP__BF16_TARGET static inline void pdp__amx_transpose16(__m512i *v)
{
    const __m512i lo = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const __m512i hi = _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9,
                                        24, 8);
    __m512i u[16];
    int r, q;
    for (r = 0; r < 2; r++) { /* two rounds v -> u -> v */
        for (q = 0; q < 8; q++) {
            u[2 * q] = _mm512_permutex2var_epi32(v[q], lo, v[q + 8]);
            u[2 * q + 1] = _mm512_permutex2var_epi32(v[q], hi, v[q + 8]);
        }
        for (q = 0; q < 8; q++) {
            v[2 * q] = _mm512_permutex2var_epi32(u[q], lo, u[q + 8]);
            v[2 * q + 1] = _mm512_permutex2var_epi32(u[q], hi, u[q + 8]);
        }
    }
}

/* pdp__amx_pack_a with vcvtne2ps2bf16 (pdp__bf16_cvt2: gemm_bf16.c's words): a row along
   k is 32 values per step, converted in one instruction and stored as a tile row; rows
   across k (t == PDP_TRANS) come 16 rows x 16 pairs at a time as gemm_bf16.c's
   [pair][row] words, transposed in registers (four rounds of interleaving the 32-bit
   lanes of registers r and r + 8: each rotates the 8 index bits by one). A gathered A
   (bf16 words through arow, not transposed) is copied 32 words at a time. */
PDP__BF16_TARGET PDP__PRIVATE void pdp__amx_pack_a_avx512(const pdp__bf16_args *g, int64_t r0,
                                                          int rows, int height, int64_t steps,
                                                          uint32_t *dst)
{
    const int64_t k = g->k;
    int64_t s;
    int i, q, r;
    if (g->ah && g->ta != PDP_NO_TRANS) {
        pdp__amx_pack_a(g, r0, rows, height, steps, dst);
        return;
    }
    if (g->ta == PDP_NO_TRANS) { /* row by row, along k */
        for (i = 0; i < height; i++)
            for (s = 0; s < steps; s++) {
                int64_t vals = k - 32 * s;
                __mmask16 mlo = (__mmask16)(vals >= 16 ? 0xffff : (1u << vals) - 1);
                __mmask16 mhi =
                    (__mmask16)(vals >= 32 ? 0xffff : vals <= 16 ? 0 : (1u << (vals - 16)) - 1);
                __mmask32 mh = (__mmask32)(vals >= 32 ? 0xffffffffu : (1u << vals) - 1);
                __m512i w = _mm512_setzero_si512();
                if (i < rows && g->ah) {
                    w = _mm512_maskz_loadu_epi16(mh, g->ah + g->arow[r0 + i] + 32 * s);
                } else if (i < rows) {
                    const float *x = g->a + (r0 + i) * g->lda + 32 * s;
                    w = pdp__bf16_cvt2(_mm512_maskz_loadu_ps(mlo, x),
                                       _mm512_maskz_loadu_ps(mhi, x + 16));
                }
                _mm512_storeu_si512((void *)(dst + (s * height + i) * 16), w);
            }
        return;
    }
    for (s = 0; s < steps; s++) { /* t == PDP_TRANS: op(A)(i, p) = a[p lda + i] */
        int i0;
        for (i0 = 0; i0 < height; i0 += 16) { /* the step's k rows, read once for all i0 */
            int left = rows - i0;
            __mmask16 m = (__mmask16)(left >= 16 ? 0xffff : left <= 0 ? 0 : (1u << left) - 1);
            const float *x = g->a + r0 + (left > 0 ? i0 : 0);
            __m512i v[16];
            for (q = 0; q < 16; q++) { /* v[q]: pair 16 s + q of the 16 rows */
                int64_t p = 2 * (16 * s + q);
                __m512 a0 = p < k ? _mm512_maskz_loadu_ps(m, x + p * g->lda) : _mm512_setzero_ps();
                __m512 a1 = p + 1 < k ? _mm512_maskz_loadu_ps(m, x + (p + 1) * g->lda)
                                      : _mm512_setzero_ps();
                v[q] = pdp__amx_pairs16(a0, a1);
            }
            pdp__amx_transpose16(v);
            for (r = 0; r < 16; r++)
                _mm512_storeu_si512((void *)(dst + (s * height + i0 + r) * 16), v[r]);
        }
    }
}

/* pdp__amx_pack_a for op(A) stored along k (ta == PDP_NO_TRANS), as rows: word q of row i
   in step s at dst[i PDP__AMX_AROW(steps) + 16 s + q] (16 steps + 16 words a row: the
   spare 64-byte line keeps rows a multiple of 4 KiB long out of a single L1 set); the
   kernels load the tiles from these rows (pdp__amx_alay). The words of
   pdp__amx_pack_a_avx512, written in the order they are read: one stream per row, where
   tile order scatters a row's steps 64 height bytes apart. 512 x 512 x 10 NT (one thread,
   a loaded 2-core Sapphire Rapids): 134 -> 160 GFLOP/s. */
PDP__BF16_TARGET PDP__PRIVATE void pdp__amx_pack_a_rows_avx512(const pdp__bf16_args *g,
                                                               int64_t r0, int rows, int height,
                                                               int64_t steps, uint32_t *dst)
{
    const int64_t k = g->k, ld = PDP__AMX_AROW(steps), full = k / 32;
    const int64_t vals = k - 32 * full;
    const __mmask16 mlo = (__mmask16)(vals >= 16 ? 0xffff : (1u << vals) - 1);
    const __mmask16 mhi = (__mmask16)(vals <= 16 ? 0 : (1u << (vals - 16)) - 1);
    const __mmask32 mh = (__mmask32)((1u << vals) - 1);
    int64_t s;
    int i;
    for (i = 0; i < height; i++) {
        uint32_t *d = dst + i * ld;
        s = 0;
        if (i < rows && g->ah) {
            const uint16_t *x = g->ah + g->arow[r0 + i];
            for (; s < full; s++)
                _mm512_storeu_si512((void *)(d + 16 * s), _mm512_loadu_si512(x + 32 * s));
            if (vals)
                _mm512_storeu_si512((void *)(d + 16 * s++),
                                    _mm512_maskz_loadu_epi16(mh, x + 32 * full));
        } else if (i < rows) {
            const float *x = g->a + (r0 + i) * g->lda;
            for (; s < full; s++)
                _mm512_storeu_si512((void *)(d + 16 * s),
                                    pdp__bf16_cvt2(_mm512_loadu_ps(x + 32 * s),
                                                   _mm512_loadu_ps(x + 32 * s + 16)));
            if (vals)
                _mm512_storeu_si512((void *)(d + 16 * s++),
                                    pdp__bf16_cvt2(_mm512_maskz_loadu_ps(mlo, x + 32 * full),
                                                   _mm512_maskz_loadu_ps(mhi, x + 32 * full + 16)));
        }
        for (; s < steps; s++) _mm512_storeu_si512((void *)(d + 16 * s), _mm512_setzero_si512());
    }
}

/* pdp__amx_pack_b with AVX-512 for B as floats: op(B) k x n stored row-major (tb ==
   PDP_NO_TRANS) is read a pair of rows at a time along n, 16 columns converted and
   interleaved per instruction pair, so the rows stream; stored n x k (PDP_TRANS), 16
   columns x 32 values of k are converted as rows and transposed in registers. Gathered
   B: gemm_bf16.c's packing per panel. */
PDP__BF16_TARGET PDP__PRIVATE void pdp__amx_pack_b_avx512(const pdp__bf16_args *g, int64_t n0,
                                                          int64_t n1, int w, int64_t steps,
                                                          uint32_t *dst)
{
    const int64_t k = g->k, pairs = (k + 1) / 2, padded = steps * PDP__AMX_KT;
    const int64_t panels = (n1 - n0 + w - 1) / w, span = panels * w;
    int64_t p, j, s;
    int q;
    if (g->bh) {
        pdp__amx_pack_b(g, n0, n1, w, steps, dst);
        return;
    }
    if (g->tb == PDP_NO_TRANS) {
        for (p = 0; p < padded; p++)
            for (j = 0; j < span; j += 16) {
                int64_t left = n1 - n0 - j;
                __mmask16 m = (__mmask16)(left >= 16 ? 0xffff : left <= 0 ? 0 : (1u << left) - 1);
                __m512i v = _mm512_setzero_si512();
                if (p < pairs) {
                    const float *x = g->b + 2 * p * g->ldb + n0 + j;
                    v = pdp__amx_pairs16(_mm512_maskz_loadu_ps(m, x),
                                         2 * p + 1 < k ? _mm512_maskz_loadu_ps(m, x + g->ldb)
                                                       : _mm512_setzero_ps());
                }
                _mm512_storeu_si512((void *)(dst + j / w * w * padded + p * w + j % w), v);
            }
        return;
    }
    for (j = 0; j < span; j += 16) { /* PDP_TRANS: op(B)(p, j) = b[j ldb + p] */
        int64_t left = n1 - n0 - j;
        uint32_t *d = dst + j / w * w * padded + j % w;
        for (s = 0; s < steps; s++) {
            int64_t vals = k - 32 * s;
            __mmask16 mlo = (__mmask16)(vals >= 16 ? 0xffff : (1u << vals) - 1);
            __mmask16 mhi =
                (__mmask16)(vals >= 32 ? 0xffff : vals <= 16 ? 0 : (1u << (vals - 16)) - 1);
            __m512i v[16];
            for (q = 0; q < 16; q++) { /* v[q]: column j + q, pairs 16 s .. 16 s + 15 */
                const float *x = g->b + (n0 + j + PDP__MIN(q, left - 1)) * g->ldb + 32 * s;
                v[q] = q < left ? pdp__bf16_cvt2(_mm512_maskz_loadu_ps(mlo, x),
                                                 _mm512_maskz_loadu_ps(mhi, x + 16))
                                : _mm512_setzero_si512();
            }
            pdp__amx_transpose16(v);
            for (q = 0; q < 16; q++)
                _mm512_storeu_si512((void *)(d + (16 * s + q) * w), v[q]);
        }
    }
}

/* pdp__amx_out with AVX-512: the same roundings (no fused multiply-add: the products are
   the _round_ forms, which the compiler does not contract; their zero-masking forms with
   every lane kept, for gemm_bf16.c's PDP__BF16_UNPACKLO32 reason; the mask made by
   _cvtu32_mask16, since nvcc's front end warns (#68-D) when a constant 0xffff becomes the
   builtin's signed mask argument). The ReLU keeps the lanes where !(r <= 0) (_CMP_NLE_UQ:
   NaN kept, -0 to +0), pdp__relu's rule. */
#    define PDP__AMX_RNE (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
PDP__BF16_TARGET PDP__PRIVATE void pdp__amx_out_avx512(const float *acc, int w, float *c,
                                                       int64_t ldc, int mr, int nr, float alpha,
                                                       float beta, const float *bias, int relu)
{
    const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
    const __m512 zero = _mm512_setzero_ps();
    const __mmask16 all = _cvtu32_mask16(0xffffu);
    int i, j;
    for (i = 0; i < mr; i++)
        for (j = 0; j < nr; j += 16) {
            int left = nr - j;
            __mmask16 m = (__mmask16)(left >= 16 ? 0xffff : (1u << left) - 1);
            float *ci = c + i * ldc + j;
            __m512 r = _mm512_maskz_mul_round_ps(all, va, _mm512_loadu_ps(acc + i * w + j),
                                                 PDP__AMX_RNE);
            if (beta != 0.0f)
                r = _mm512_maskz_add_round_ps(
                    all,
                    _mm512_maskz_mul_round_ps(all, vb, _mm512_maskz_loadu_ps(m, ci), PDP__AMX_RNE),
                    r, PDP__AMX_RNE);
            if (bias)
                r = _mm512_maskz_add_round_ps(all, _mm512_maskz_loadu_ps(m, bias + j), r,
                                              PDP__AMX_RNE);
            if (relu) r = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(r, zero, _CMP_NLE_UQ), r);
            _mm512_mask_storeu_ps(ci, m, r);
        }
}
#    undef PDP__AMX_RNE
#  endif

/* ---- gemm_amx: streaming kernels ----
   Where one side of C is at most 16 (n <= 16: 4 x 1 blocks, one panel; m <= 16: 1 x 2
   blocks, one row block), each value of the other operand meets one tile product only, so
   packing it first buys no reuse: it would be converted, written out, then read back by
   the tile loads (512 x 512 x 10 NT, one thread: packing A was 63% of the call). These
   kernels convert it one k step at a time into two 4 KiB buffers that stay in L1, the
   next step's conversion issued after this step's tile products (whose tile loads read
   the other buffer, stored a step earlier), so the vector conversion runs beside the
   tile unit. The words and the sequence of TDPBF16PS per element are those of
   pdp__amx_kernel41 and pdp__amx_kernel12 on packed operands. */
#  if PDP__BF16_X86
#    if PDP__BF16_AMX
#      define PDP__AMX_SIMD_TARGET                                                          \
          PDP__TARGET("avx512f,avx512bw,avx512dq,avx512bf16,amx-tile,amx-bf16")
#    else
#      define PDP__AMX_SIMD_TARGET PDP__BF16_TARGET
#    endif

/* One k step of rows [0, rows) of op(A) stored along k (x: row 0's first value of the
   step, rows ld floats apart; vals: the values of k left from the step's first, the step
   holds min(32, vals)) as tile rows, row i at d + 16 i: pdp__amx_pack_a_rows_avx512's
   words. */
PDP__BF16_TARGET static inline PDP__ALWAYS_INLINE void
pdp__amx_cvt_rows(const float *x, int64_t ld, int rows, int64_t vals, uint32_t *d)
{
    int i;
    if (vals >= 32) {
        for (i = 0; i < rows; i++, x += ld)
            _mm512_storeu_si512((void *)(d + 16 * i),
                                pdp__bf16_cvt2(_mm512_loadu_ps(x), _mm512_loadu_ps(x + 16)));
    } else {
        __mmask16 mlo = (__mmask16)(vals >= 16 ? 0xffff : (1u << vals) - 1);
        __mmask16 mhi = (__mmask16)(vals <= 16 ? 0 : (1u << (vals - 16)) - 1);
        for (i = 0; i < rows; i++, x += ld)
            _mm512_storeu_si512((void *)(d + 16 * i),
                                pdp__bf16_cvt2(_mm512_maskz_loadu_ps(mlo, x),
                                               _mm512_maskz_loadu_ps(mhi, x + 16)));
    }
}

/* One k step of columns [0, 32) of op(B) stored k x n (x: the step's first row, rows ld
   floats apart; cols of the 32 inside n, the rest zero; vals as above) as two tiles of
   [pair][column] words, the second at d + 256: pdp__amx_pack_b_avx512's words. */
PDP__BF16_TARGET static inline PDP__ALWAYS_INLINE void
pdp__amx_cvt_pairs(const float *x, int64_t ld, int cols, int64_t vals, uint32_t *d)
{
    const __mmask16 m0 = (__mmask16)(cols >= 16 ? 0xffff : (1u << cols) - 1);
    const __mmask16 m1 = (__mmask16)(cols >= 32 ? 0xffff : cols <= 16 ? 0 : (1u << (cols - 16)) - 1);
    const __m512 zero = _mm512_setzero_ps();
    int p, pairs = (int)PDP__MIN((int64_t)16, (vals + 1) / 2);
    for (p = 0; p < pairs; p++, x += 2 * ld) {
        int odd = 2 * p + 1 < vals;
        _mm512_storeu_si512((void *)(d + 16 * p),
                            pdp__amx_pairs16(_mm512_maskz_loadu_ps(m0, x),
                                             odd ? _mm512_maskz_loadu_ps(m0, x + ld) : zero));
        _mm512_storeu_si512((void *)(d + 256 + 16 * p),
                            pdp__amx_pairs16(_mm512_maskz_loadu_ps(m1, x + 16),
                                             odd ? _mm512_maskz_loadu_ps(m1, x + ld + 16) : zero));
    }
    for (; p < 16; p++) {
        _mm512_storeu_si512((void *)(d + 16 * p), _mm512_setzero_si512());
        _mm512_storeu_si512((void *)(d + 256 + 16 * p), _mm512_setzero_si512());
    }
}

/* pdp__amx_kernel41 over all k steps, A converted as it goes: rows [0, rows) of op(A)
   stored along k from a (lda floats apart), the B panel packed at b, the accumulators
   from zero stored to out (row stride ldo floats); buf: 2 x 1024 words of scratch. The
   buffers' rows past `rows` are left as they are: only their own accumulator rows, never
   stored, read them. */
PDP__AMX_SIMD_TARGET PDP__PRIVATE void pdp__amx_kernel41_stream(pdp__amx_tiles *e,
                                                                const float *a, int64_t lda,
                                                                int rows, int64_t k,
                                                                const uint32_t *b, uint32_t *buf,
                                                                float *out, int64_t ldo)
{
    const int64_t so = ldo * 4, steps = (k + 31) / 32;
    int64_t s;
    pdp__amx_cvt_rows(a, lda, rows, k, buf);
    PDP__AMX_ZERO(e, 0);
    PDP__AMX_ZERO(e, 1);
    PDP__AMX_ZERO(e, 2);
    PDP__AMX_ZERO(e, 3);
    for (s = 0; s < steps; s++, b += 16 * 16) {
        const uint32_t *t = buf + (s & 1) * 1024;
        PDP__AMX_LOAD(e, 4, b, 64);
        PDP__AMX_LOAD(e, 5, t, 64);
        PDP__AMX_LOAD(e, 6, t + 256, 64);
        PDP__AMX_DP(e, 0, 5, 4);
        PDP__AMX_LOAD(e, 7, t + 512, 64);
        PDP__AMX_DP(e, 1, 6, 4);
        PDP__AMX_LOAD(e, 5, t + 768, 64);
        PDP__AMX_DP(e, 2, 7, 4);
        PDP__AMX_DP(e, 3, 5, 4);
        if (s + 1 < steps)
            pdp__amx_cvt_rows(a + 32 * (s + 1), lda, rows, k - 32 * (s + 1),
                              buf + ((s + 1) & 1) * 1024);
    }
    PDP__AMX_STORE(e, 0, out, so);
    PDP__AMX_STORE(e, 1, out + 16 * ldo, so);
    PDP__AMX_STORE(e, 2, out + 32 * ldo, so);
    PDP__AMX_STORE(e, 3, out + 48 * ldo, so);
}

/* pdp__amx_kernel12 over all k steps, B converted as it goes: columns [0, cols) of op(B)
   stored k x n from b (ldb floats a row), the block's A packed at a (al), the
   accumulators from zero stored to out; buf: 2 x 512 words of scratch. */
PDP__AMX_SIMD_TARGET PDP__PRIVATE void pdp__amx_kernel12_stream(pdp__amx_tiles *e,
                                                                const uint32_t *a,
                                                                const pdp__amx_alay *al,
                                                                const float *b, int64_t ldb,
                                                                int cols, int64_t k,
                                                                uint32_t *buf, float *out,
                                                                int64_t ldo)
{
    const int64_t so = ldo * 4, steps = (k + 31) / 32;
    int64_t s;
    pdp__amx_cvt_pairs(b, ldb, cols, k, buf);
    PDP__AMX_ZERO(e, 0);
    PDP__AMX_ZERO(e, 1);
    for (s = 0; s < steps; s++, a += al->step) {
        const uint32_t *t = buf + (s & 1) * 512;
        PDP__AMX_LOAD(e, 4, a, al->stride);
        PDP__AMX_LOAD(e, 6, t, 64);
        PDP__AMX_LOAD(e, 7, t + 256, 64);
        PDP__AMX_DP(e, 0, 4, 6);
        PDP__AMX_DP(e, 1, 4, 7);
        if (s + 1 < steps)
            pdp__amx_cvt_pairs(b + 32 * (s + 1) * ldb, ldb, cols, k - 32 * (s + 1),
                               buf + ((s + 1) & 1) * 512);
    }
    PDP__AMX_STORE(e, 0, out, so);
    PDP__AMX_STORE(e, 1, out + 16, so);
}
#    undef PDP__AMX_SIMD_TARGET
#  endif

/* ---- gemm_amx: driver ---- */

typedef void (*pdp__amx_pack_a_fn)(const pdp__bf16_args *g, int64_t r0, int rows, int height,
                                   int64_t steps, uint32_t *dst);
typedef void (*pdp__amx_pack_b_fn)(const pdp__bf16_args *g, int64_t n0, int64_t n1, int w,
                                   int64_t steps, uint32_t *dst);
typedef void (*pdp__amx_out_fn)(const float *acc, int w, float *c, int64_t ldc, int mr, int nr,
                                float alpha, float beta, const float *bias, int relu);

typedef struct pdp__amx_ctx {
    const pdp__bf16_args *g;
    int emulate;     /* run on pdp__amx_tiles in memory (PDP__AMX_EMULATE builds) */
    int mb, nb;      /* tiles per block of C: 2 x 2; 4 x 1 when n <= 16; 1 x 2 when m <= 16 */
    int split_n;     /* parts split the column panels (else the row blocks) */
    int a_rows;      /* pack_a writes rows (pdp__amx_pack_a_rows_avx512), not tile order */
    int stream;      /* 1: A converted in the kernel (n <= 16); 2: B (m <= 16); 0: neither */
    pdp__amx_pack_a_fn pack_a;
    pdp__amx_pack_b_fn pack_b;
    pdp__amx_out_fn out;
} pdp__amx_ctx;

/* Element (i, j) of C by the pseudo-code's chain (the emulated tiles' bits), unpacked:
   the fallback without scratch. */
PDP__PRIVATE void pdp__amx_element(const pdp__bf16_args *g, int64_t i, int64_t j)
{
    float acc = 0.0f;
    int64_t p;
    for (p = 0; p < g->k; p += 2) {
        uint32_t a0 = pdp__bf16_aword(g, i, p), b0 = pdp__bf16_bword(g, p, j);
        uint32_t a1 = p + 1 < g->k ? pdp__bf16_aword(g, i, p + 1) : 0u;
        uint32_t b1 = p + 1 < g->k ? pdp__bf16_bword(g, p + 1, j) : 0u;
        float r = fmaf(pdp__bf16_daz((uint16_t)a0), pdp__bf16_daz((uint16_t)b0), acc);
        acc = (r < 1.17549435e-38f && r > -1.17549435e-38f) ? r * 0.0f : r;
        r = fmaf(pdp__bf16_daz((uint16_t)a1), pdp__bf16_daz((uint16_t)b1), acc);
        acc = (r < 1.17549435e-38f && r > -1.17549435e-38f) ? r * 0.0f : r;
    }
    if (((g->k + 1) / 2) % PDP__AMX_KT) acc += 0.0f; /* padding pairs add +0: -0 becomes +0 */
    g->c[i * g->ldc + j] = pdp__bf16_bias_relu(
        pdp__bf16_out(acc, g->alpha, g->beta, g->c + i * g->ldc + j), g->bias ? g->bias + j : NULL,
        g->relu);
    if (g->gelu) pdp__bf16_gelu_tile(g, i, j, 1, 1);
}

#  if PDP__BF16_X86
/* pdp__amx_block with the streamed operand (x->stream; the streaming kernels say why):
   1, n <= 16 and op(A) stored along k: B's one panel packed, each block of 64 rows of A
   converted inside pdp__amx_kernel41_stream; 2, m <= 16 and op(B) stored k x n: the one
   block of A packed, each panel of B converted inside pdp__amx_kernel12_stream. No k
   cache blocks: the packed operand is one panel or one block of rows, in L1 or L2. A
   block's epilogue runs after the next block's kernel, as in pdp__amx_block. */
PDP__PRIVATE void pdp__amx_block_stream(const pdp__amx_ctx *x, pdp__amx_tiles *e, int64_t m0,
                                        int64_t m1, int64_t n0, int64_t n1)
{
    const pdp__bf16_args *g = x->g;
    const int height = 16 * x->mb, w = 16 * x->nb, along_a = x->stream == 1;
    const int64_t steps = (g->k + 31) / 32, count = along_a ? m1 - m0 : n1 - n0;
    const int64_t unit = along_a ? height : w; /* rows or columns per kernel call */
    size_t packed = (size_t)(along_a ? w * steps * PDP__AMX_KT
                                     : height * (x->a_rows ? PDP__AMX_AROW(steps)
                                                           : steps * PDP__AMX_KT));
    uint32_t *pk = (uint32_t *)pdp__thread_scratch((packed + 2048 + 2 * (size_t)(height * w)) * 4);
    uint32_t *buf;
    float *accbuf;
    pdp__amx_alay al;
    int64_t u, i, j;
    int prev = 0; /* the previous call's rows or columns, its epilogue still to run */
    if (!pk) {
        for (i = m0; i < m1; i++)
            for (j = n0; j < n1; j++) pdp__amx_element(g, i, j);
        return;
    }
    buf = pk + packed;
    accbuf = (float *)(void *)(buf + 2048);
    al.step = x->a_rows ? PDP__AMX_KT : height * 16;
    al.tile = x->a_rows ? 16 * PDP__AMX_AROW(steps) : PDP__AMX_TW;
    al.stride = x->a_rows ? 4 * PDP__AMX_AROW(steps) : 64;
    if (along_a)
        x->pack_b(g, n0, n1, w, steps, pk);
    else
        x->pack_a(g, m0, (int)(m1 - m0), height, steps, pk);
    for (u = 0; u < count; u += unit) {
        int64_t i0 = along_a ? m0 + u : m0, j0 = along_a ? n0 : n0 + u;
        int rows = (int)(along_a ? PDP__MIN(unit, m1 - i0) : m1 - m0);
        int cols = (int)(along_a ? n1 - n0 : PDP__MIN(unit, n1 - j0));
        float *acc = accbuf + (u / unit % 2) * height * w, *c = g->c + i0 * g->ldc + j0;
        int direct = g->alpha == 1.0f && g->beta == 0.0f && !g->bias && !g->relu && !g->gelu &&
                     rows == height && cols == w;
        if (along_a)
            pdp__amx_kernel41_stream(e, g->a + i0 * g->lda, g->lda, rows, g->k, pk, buf,
                                     direct ? c : acc, direct ? g->ldc : w);
        else
            pdp__amx_kernel12_stream(e, pk, &al, g->b + j0, g->ldb, cols, g->k, buf,
                                     direct ? c : acc, direct ? g->ldc : w);
        if (prev) { /* the previous call's block: acc's other half */
            int64_t pi = along_a ? i0 - unit : i0, pj = along_a ? j0 : j0 - unit;
            x->out(accbuf + ((u / unit + 1) % 2) * height * w, w, g->c + pi * g->ldc + pj,
                   g->ldc, along_a ? (int)unit : rows, along_a ? cols : (int)unit, g->alpha,
                   g->beta, g->bias ? g->bias + pj : NULL, g->relu);
        }
        prev = !direct;
        if (prev && u + unit >= count) { /* the last block: nothing left to overlap */
            x->out(acc, w, c, g->ldc, rows, cols, g->alpha, g->beta,
                   g->bias ? g->bias + j0 : NULL, g->relu);
            prev = 0;
        }
    }
    if (g->gelu) pdp__bf16_gelu_tile(g, m0, n0, (int)(m1 - m0), (int)(n1 - n0));
}
#  endif

/* C[m0, m1) x [n0, n1) (m0, n0 on the block grid), tiles on e (NULL: the hardware's,
   configured by the caller). */
PDP__PRIVATE void pdp__amx_block(const pdp__amx_ctx *x, pdp__amx_tiles *e, int64_t m0, int64_t m1,
                                 int64_t n0, int64_t n1)
{
    const pdp__bf16_args *g = x->g;
    int height = 16 * x->mb, w = 16 * x->nb;
    int64_t pairs = (g->k + 1) / 2, steps = (pairs + PDP__AMX_KT - 1) / PDP__AMX_KT;
    int64_t padded = steps * PDP__AMX_KT, panels = (n1 - n0 + w - 1) / w;
    /* cache blocks of at most PDP__AMX_KC steps, as even as they come (25 steps at 12:
       9, 9, 7) */
    int64_t kc = (steps + (steps + PDP__AMX_KC - 1) / PDP__AMX_KC - 1) /
                 ((steps + PDP__AMX_KC - 1) / PDP__AMX_KC);
    int64_t jp, ib, s0, i, j;
    const float *bias = g->bias ? g->bias + n0 : NULL; /* the block's first column's */
    size_t bwords = (size_t)(panels * w * padded);
    size_t awords = (size_t)(height * (x->a_rows ? PDP__AMX_AROW(steps) : padded));
    size_t accs = (size_t)(panels * height * w);
    uint32_t *bp, *ap;
    float *accbuf;
    pdp__amx_alay al;
#  if PDP__BF16_X86
    if (x->stream) {
        pdp__amx_block_stream(x, e, m0, m1, n0, n1);
        return;
    }
#  endif
    bp = (uint32_t *)pdp__thread_scratch((bwords + awords + accs) * 4);
    al.step = x->a_rows ? PDP__AMX_KT : height * 16;
    al.tile = x->a_rows ? 16 * PDP__AMX_AROW(steps) : PDP__AMX_TW;
    al.stride = x->a_rows ? 4 * PDP__AMX_AROW(steps) : 64;
    if (!bp) {
        for (i = m0; i < m1; i++)
            for (j = n0; j < n1; j++) pdp__amx_element(g, i, j);
        return;
    }
    ap = bp + bwords;
    accbuf = (float *)(void *)(ap + awords);
    x->pack_b(g, n0, n1, w, steps, bp);
    for (ib = m0; ib < m1; ib += height) {
        int rows = (int)PDP__MIN((int64_t)height, m1 - ib);
        x->pack_a(g, ib, rows, height, steps, ap);
        for (s0 = 0; s0 < steps; s0 += kc) {
            int64_t n = PDP__MIN(kc, steps - s0), last = s0 + n == steps;
            const uint32_t *a = ap + s0 * al.step;
            int pending = 0; /* the previous panel's epilogue is still to run */
            for (jp = 0; jp < panels; jp++) {
                float *acc = accbuf + jp * height * w, *c = g->c + ib * g->ldc + n0 + jp * w;
                const uint32_t *b = bp + jp * w * padded + s0 * 16 * w;
                int cols = (int)PDP__MIN((int64_t)w, n1 - n0 - jp * w);
                /* after the last cache block: straight into C where C = acc exactly,
                   else to acc, written by the epilogue after the next panel's tile
                   operations are issued (reading the tile stores back at once stalls) */
                int direct = last && g->alpha == 1.0f && g->beta == 0.0f && !g->bias &&
                             !g->relu && !g->gelu && rows == height && cols == w;
                if (x->mb == 1)
                    pdp__amx_kernel12(e, n, a, &al, b, s0 ? acc : NULL, direct ? c : acc,
                                      direct ? g->ldc : w);
                else if (x->nb == 2)
                    pdp__amx_kernel22(e, n, a, &al, b, s0 ? acc : NULL, direct ? c : acc,
                                      direct ? g->ldc : w);
                else
                    pdp__amx_kernel41(e, n, a, &al, b, s0 ? acc : NULL, direct ? c : acc,
                                      direct ? g->ldc : w);
                if (pending) {
                    x->out(acc - height * w, w, c - w, g->ldc, rows, w, g->alpha, g->beta,
                           bias ? bias + (jp - 1) * w : NULL, g->relu);
                }
                pending = last && !direct;
                if (pending && jp + 1 == panels) {
                    x->out(acc, w, c, g->ldc, rows, cols, g->alpha, g->beta,
                           bias ? bias + jp * w : NULL, g->relu);
                }
            }
        }
        if (g->gelu) pdp__bf16_gelu_tile(g, ib, n0, rows, (int)(n1 - n0));
    }
}

/* Part i of n: an equal share of the column panels or row blocks; the tiles are
   configured at its start and released at its end. */
PDP__PRIVATE void pdp__amx_part(void *arg, int i, int n)
{
    const pdp__amx_ctx *x = (const pdp__amx_ctx *)arg;
    int64_t step = x->split_n ? 16 * x->nb : 16 * x->mb;
    int64_t len = x->split_n ? x->g->n : x->g->m;
    int64_t units = (len + step - 1) / step;
    int64_t lo = PDP__MIN(len, units * i / n * step);
    int64_t hi = PDP__MIN(len, units * (i + 1) / n * step);
#  if PDP__AMX_EMU
    pdp__amx_tiles tiles, *e = x->emulate ? &tiles : NULL;
#  else
    pdp__amx_tiles *e = NULL;
#  endif
    int64_t w = 16 * x->nb, n0 = x->split_n ? lo : 0, n1 = x->split_n ? hi : x->g->n, nc, j;
    int64_t padded = (x->g->k + 2 * PDP__AMX_KT - 1) / (2 * PDP__AMX_KT) * PDP__AMX_KT;
    if (lo >= hi) return;
    nc = PDP__MAX(w, PDP__AMX_NC_BYTES / (4 * padded) / w * w); /* packed B's columns */
    pdp__amx_config(e);
    for (j = n0; j < n1; j += nc)
        pdp__amx_block(x, e, x->split_n ? 0 : lo, x->split_n ? x->g->m : hi, j,
                       PDP__MIN(n1, j + nc));
    pdp__amx_release(e);
}

/* The product of g (filled by pdp__bf16_run, its pack and pack_h the path's) on the
   tiles: the hardware's (emulate == 0) or the emulation's (1: the path's packing and
   epilogue; 2: the portable ones). */
PDP__PRIVATE void pdp__amx_run(const pdp__bf16_args *g, int emulate)
{
    pdp__amx_ctx x;
    int threads;
    int64_t cols, rows;
    x.g = g;
    x.emulate = emulate;
    x.nb = g->n <= 16 ? 1 : 2;
    x.mb = g->m <= 16 && x.nb == 2 ? 1 : 4 / x.nb;
    x.a_rows = 0;
    x.stream = 0;
    x.pack_a = pdp__amx_pack_a;
    x.pack_b = pdp__amx_pack_b;
    x.out = pdp__amx_out;
#  if PDP__BF16_X86
    if (emulate != 2 && pdp_bf16_path_available(PDP_BF16_PATH_AVX512)) {
        x.a_rows = g->ta == PDP_NO_TRANS;
        x.pack_a = x.a_rows ? pdp__amx_pack_a_rows_avx512 : pdp__amx_pack_a_avx512;
        x.pack_b = pdp__amx_pack_b_avx512;
        x.out = pdp__amx_out_avx512;
        /* one panel (n <= 16) or one block of rows (m <= 16): the other operand streams */
        x.stream = x.nb == 1 && g->ta == PDP_NO_TRANS && !g->ah   ? 1
                   : x.mb == 1 && g->tb == PDP_NO_TRANS && !g->bh ? 2 : 0;
    }
#  endif
    threads = pdp__threads_for_caller();
    if (2.0 * (double)g->m * (double)g->n * (double)g->k < PDP__BF16_PAR_FLOPS) threads = 1;
    cols = (g->n + 16 * x.nb - 1) / (16 * x.nb);
    rows = (g->m + 16 * x.mb - 1) / (16 * x.mb);
    /* along C's longer side unless it has fewer units than threads and the other more:
       gemm.c's rule and reason (a part packs all of the operand along the side it does
       not split). Packing is most of an AMX product's time: GPT's 2048 x 384 x 1152
       went from 1.37x one thread's speed on 2 threads split by columns to 1.87x by rows. */
    x.split_n = cols * x.nb >= rows * x.mb ? cols >= (int64_t)threads || cols >= rows
                                           : rows < (int64_t)threads && cols > rows;
    pdp__parallel_for((int)PDP__MIN((int64_t)threads, x.split_n ? cols : rows), pdp__amx_part, &x);
}

#  if PDP__AMX_EMU
/* pdp__bf16_run's AMX path on emulated tiles, on any CPU (a test entry: PDP__AMX_EMULATE):
   portable != 0 packs and writes C with the portable C code even where AVX-512 exists;
   _bias adds bias and the ReLU or GELU in the epilogue as pdp__gemm_bf16_bias does (m, n,
   k > 0). */
PDP__PRIVATE void pdp__amx_gemm_emulated_bias(int portable, pdp_trans ta, pdp_trans tb, int64_t m,
                                              int64_t n, int64_t k, float alpha, const float *a,
                                              const uint16_t *ah, int64_t lda, const int64_t *arow,
                                              const float *b, const uint16_t *bh, int64_t ldb,
                                              const int64_t *brow, float beta, const float *bias,
                                              int relu, float *gelu, float *c, int64_t ldc)
{
    pdp__bf16_args g;
    if (!pdp__bf16_args_init(&g, ta, tb, m, n, k, alpha, a, ah, lda, arow, b, bh, ldb, brow,
                             beta, c, ldc))
        return;
    g.bias = bias;
    g.relu = relu;
    g.gelu = gelu;
#    if PDP__BF16_X86
    if (!portable && pdp_bf16_path_available(PDP_BF16_PATH_AVX512)) {
        g.pack = pdp__bf16_pack_avx512;
        g.pack_h = pdp__bf16_pack_h_avx512;
    }
#    endif
    pdp__amx_run(&g, portable ? 2 : 1);
}

PDP__PRIVATE void pdp__amx_gemm_emulated(int portable, pdp_trans ta, pdp_trans tb, int64_t m,
                                         int64_t n, int64_t k, float alpha, const float *a,
                                         const uint16_t *ah, int64_t lda, const int64_t *arow,
                                         const float *b, const uint16_t *bh, int64_t ldb,
                                         const int64_t *brow, float beta, float *c, int64_t ldc)
{
    pdp__amx_gemm_emulated_bias(portable, ta, tb, m, n, k, alpha, a, ah, lda, arow, b, bh, ldb,
                                brow, beta, NULL, 0, NULL, c, ldc);
}
#  endif

#  undef PDP__AMX_OP
#  undef PDP__AMX_ZERO
#  undef PDP__AMX_LOAD
#  undef PDP__AMX_STORE
#  undef PDP__AMX_DP
#endif
