/* gemm_bf16: the bf16 mixed-precision matrix product behind pdp_gemm_bf16 (gemm.h),
   C = alpha * op(A) * op(B) + beta * C with op(A), op(B) rounded to bf16 and fp32
   everywhere else, as torch.autocast("cpu", dtype=torch.bfloat16) runs a Linear.

   Packing rounds both operands to bf16 (pdp__bf16_bits, src/math.h) and lays k out in
   pairs, the operand format of AVX512-BF16's vdpbf16ps: one 32-bit word holds
   (x[2p] low, x[2p+1] high); an odd k gets a zero pair half. A is packed in MR-row
   panels ([pair][row]), B in NR-column panels ([pair][column]). A part of the product
   packs an MC-row block of A at a time; in the first block it packs each NR-column
   panel of B as it reaches it, and the later blocks reuse those panels; the
   micro-kernel runs over the block's MR-row panels and keeps an MR x NR tile of C in
   registers over the whole k (k is not blocked: at the MLP's k <= 1024 a B panel,
   pairs x NR words, stays in L2). The AMX path has its own driver, kernels and tile-order
   packing (src/gemm_amx.c, called from pdp__bf16_run; it reuses this file's rounding,
   panels and pdp__bf16_args). The avx512 path and AMX's packing use vcvtne2ps2bf16
   (16 values per instruction; rows along k transposed in registers, rows across k
   interleaved with vpermw), the emulation with pdp__bf16_bits; the words are the same
   but where a subnormal input becomes a zero or a subnormal bf16, read as zero by every
   kernel (the corner where they differ otherwise is handled: pdp__bf16_cvt2).

   Gathered operands (Conv2d's implicit GEMM, section "gathered operands"): one operand
   given as bf16 words (pdp__gemm_bf16_convert, which writes the words the path's
   packing would make, in place if asked) whose storage rows may sit anywhere, row s
   at h + off[s] (an offset table, as gemm.c's pdp__sgemm_rows): the packing reads
   them through the table and converts nothing; the panels, and so the bits, are those
   of the materialised operand.

   A Linear's bias and ReLU or GELU (pdp__gemm_bf16_bias): on the chain paths they are
   added where C is written, fl(alpha acc + b), then the ReLU: on each MR x NR tile of C
   right after its kernel writes it (still in L1), in the AMX epilogue; the bits of the
   product followed by a pass over C, in one pass. A GELU keeps C = fl(alpha acc + b),
   its input, which its backward reads, and writes G = gelu(C) beside it with layers.c's
   kernel (pdp__layers_gelu_simd_rows, the GELU layer's), read from the tile just
   written: the bits of the product, then the bias, then the GELU layer.

   Paths, and the path choice (section "path choice"): the emulation, AVX512-BF16 and
   AMX run the chain gemm.h states on packed bf16 pairs; sgemm-rounded is gemm.c's
   pdp__sgemm_bf16, pdp_sgemm with its packed panels rounded to bf16 (the same exact
   products summed in pdp_sgemm's order: gemm.h's bound). PDP_BF16_PATH_AUTO takes, per
   product, the path a table of CPU families names for the product's shape class,
   measured by bench/bf16_paths: a bf16 instruction path only where it beat
   sgemm-rounded, whose speed is near fp32's (the table's rows say how near).

   Invariants:
   - Two arithmetics (gemm.h states both): on the emulated, AVX512 and AMX paths, per
     element of C one chain of fp32 sums over the pairs, in order, from 0, flushing
     subnormals (DAZ/FTZ, as vdpbf16ps); on sgemm-rounded pdp_sgemm's FMA chain. The
     tile grid, the pairs and the chain depend on nothing but k, so the bits do not
     depend on the thread count or on how the parts are cut. The emulation's AVX-512F
     and AVX2 kernels (FMAs under MXCSR DAZ/FTZ) gave the AVX512 path's bits on every
     input tried; its portable kernel gives them except for products below 2^-126.
   - Paths are chosen by CPUID (checked once, pdp__once_run) and the OS's XCR0: the
     AVX512 kernel needs AVX512F, AVX512BW (the packing's vpermw), AVX512DQ (its
     vfpclassps), AVX512-BF16 and the zmm state enabled; the AMX
     kernel AMX-TILE, AMX-BF16, the tile state in XCR0 (bits 17, 18) and Linux's
     permission to use it (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), asked
     once; refused: AVX512 or the emulation). Both are compiled under target
     attributes, so a plain x86-64 build has them; -DPDP_NO_SIMD or a non-x86 target
     leaves only the emulation (and AMX needs x86-64 Linux).
   - AMX's arithmetic (TDPBF16PS; gemm_amx.c states it and what the hardware was
     measured to do): the same exact products summed in fp32 with DAZ/FTZ, but not in
     the AVX512 path's order, so the AMX path is held to the bound (both are fp32 sums
     of the same exact products), not to the emulation's bits. It is still
     deterministic: its chain, too, depends on nothing but k.
   - Memory: packed panels live in the part's thread scratch (pdp__thread_scratch),
     reused from call to call; if it cannot grow, the emulated arithmetic runs
     unpacked, element by element, with the same bits as the emulated path. */

#include "internal.h"

#define PDP__BF16_MR 8  /* rows of a C tile */
#define PDP__BF16_NR 32 /* columns of a C tile: two zmm of fp32 */
#define PDP__BF16_MC 256 /* rows of A packed at once */
/* Smaller products stay on the calling thread: as pdp_sgemm's PDP__GEMM_PAR_FLOPS (at
   1e6 rather than 2e6 the bf16 MLP step at batch 128 on 2 threads was faster in 5 of 6
   alternating runs, median +12%). */
#ifndef PDP__BF16_PAR_FLOPS
#  define PDP__BF16_PAR_FLOPS 1.0e6
#endif

#if !defined(PDP_NO_SIMD) && defined(PDP__X86_CPUID) && defined(PDP__HAVE_TARGET)
#  define PDP__BF16_X86 1
#  include <immintrin.h>
#else
#  define PDP__BF16_X86 0
#endif
/* AMX: where platform.h can ask the OS's permission (x86-64 Linux's arch_prctl) and
   the compiler has the AMX intrinsics (gcc 11, clang 12) */
#if PDP__BF16_X86 && defined(PDP__HAVE_AMX_PERMIT)
#  define PDP__BF16_AMX 1
#else
#  define PDP__BF16_AMX 0
#endif

/* ---- gemm_bf16: rounding and the element chain ---- */

PDP_API float pdp_bf16_round(float x) { return pdp__bf16_round(x); }

/* A bf16 as an fp32, subnormals as zero of the same sign (DAZ). */
static inline float pdp__bf16_daz(uint16_t h)
{
    return (h & 0x7f80u) ? pdp__bf16_float(h) : pdp__bf16_float((uint16_t)(h & 0x8000u));
}

/* acc + p with a subnormal result flushed to zero of its sign (FTZ). */
static inline float pdp__bf16_ftz_add(float acc, float p)
{
    float r = acc + p;
    return (r < 1.17549435e-38f && r > -1.17549435e-38f) ? r * 0.0f : r;
}

/* alpha acc + beta c, as every path writes it (beta c rounded, then the sum). */
static inline float pdp__bf16_out(float acc, float alpha, float beta, const float *c)
{
    float r = alpha * acc;
    if (beta != 0.0f) {
        float bc = beta * *c;
        r = bc + r;
    }
    return r;
}

/* The Linear's last steps, after pdp__bf16_out (pdp__gemm_bf16_bias): r + bias (the bias
   first, as beta C with C = bias adds it), then the ReLU when asked. */
static inline float pdp__bf16_bias_relu(float r, const float *bias, int relu)
{
    if (bias) r = *bias + r;
    return relu ? pdp__relu(r) : r;
}

/* ---- gemm_bf16: CPU features ---- */

/* What the path choice reads of a CPU: CPUID's vendor, family and model (the display
   values: family plus extended family, model plus extended model << 4 for families 6
   and 15) and the features each path needs. */
typedef struct pdp__bf16_cpu {
    int vendor;  /* PDP__BF16_INTEL, PDP__BF16_AMD, or 0 */
    int family, model;
    int avx512;  /* the AVX512 path: AVX512F, BW, DQ, BF16 and the zmm state */
    int amx;     /* the AMX path: AMX-TILE, AMX-BF16, the tile state and Linux's permission */
    int emul512; /* the emulation's AVX-512F kernel: AVX512F and the zmm state */
    int emul256; /* its AVX2 kernel: AVX2, FMA and the ymm state */
} pdp__bf16_cpu;
#define PDP__BF16_INTEL 1
#define PDP__BF16_AMD 2

static pdp__once pdp__bf16_once = PDP__ONCE_INIT;
/* written once under pdp__bf16_once (each member named: C++ warns of a missing one) */
PDP__PRIVATE pdp__bf16_cpu pdp__bf16_this = {0, 0, 0, 0, 0, 0, 0};

PDP__PRIVATE void pdp__bf16_detect(void)
{
#if PDP__BF16_X86
    pdp__bf16_cpu *cpu = &pdp__bf16_this;
    unsigned r[4], a, b, c, d;
    unsigned b7 = 0, d7 = 0, a71 = 0;
    int fma;
    uint64_t xcr0;
    if (!pdp__cpuid(0, 0, r)) return;
    b = r[1], c = r[2], d = r[3];
    if (b == 0x756e6547u && d == 0x49656e69u && c == 0x6c65746eu) cpu->vendor = PDP__BF16_INTEL;
    if (b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u) cpu->vendor = PDP__BF16_AMD;
    if (!pdp__cpuid(1, 0, r)) return;
    a = r[0], c = r[2];
    cpu->family = (int)((a >> 8) & 0xfu);
    cpu->model = (int)((a >> 4) & 0xfu);
    if (cpu->family == 6 || cpu->family == 15) cpu->model += (int)((a >> 12) & 0xf0u);
    if (cpu->family == 15) cpu->family += (int)((a >> 20) & 0xffu);
    if (!(c & (1u << 27))) return; /* OSXSAVE */
    fma = (c & (1u << 12)) != 0;
    xcr0 = pdp__xgetbv0();
    if (pdp__cpuid(7, 0, r)) {
        b7 = r[1], d7 = r[3];
        if (r[0] >= 1 && pdp__cpuid(7, 1, r)) a71 = r[0];
    }
    /* XCR0: SSE, AVX state; AVX2 */
    cpu->emul256 = (xcr0 & 0x6u) == 0x6u && (b7 & (1u << 5)) && fma;
    /* XCR0: SSE, AVX, opmask, ZMM_Hi256, Hi16_ZMM enabled by the OS; AVX512F */
    cpu->emul512 = (xcr0 & 0xe6u) == 0xe6u && (b7 & (1u << 16));
    cpu->avx512 = cpu->emul512 && (b7 & (1u << 17)) && (b7 & (1u << 30)) &&
                  (a71 & (1u << 5)); /* AVX512DQ, AVX512BW, AVX512-BF16 */
#  if PDP__BF16_AMX
    /* CPUID.7.0 EDX: AMX-BF16 (bit 22), AMX-TILE (24); XCR0: XTILECFG (17), XTILEDATA
       (18); then the kernel's permission, asked once for the process */
    cpu->amx = (d7 & (1u << 22)) && (d7 & (1u << 24)) && (xcr0 & 0x60000u) == 0x60000u &&
               pdp__amx_permit();
#  else
    (void)d7;
#  endif
#endif
}

/* The pdp__sgemm_bf16 path: gemm.c's own kernels (with -DPDP_CBLAS the product goes to
   the CBLAS linked in, which cannot round at packing). */
#if defined(PDP_CBLAS)
#  define PDP__BF16_HAS_SGEMM 0
#else
#  define PDP__BF16_HAS_SGEMM 1
#endif

PDP__PRIVATE bool pdp__bf16_cpu_has(const pdp__bf16_cpu *cpu, pdp_bf16_path path)
{
    switch (path) {
    case PDP_BF16_PATH_AUTO:
    case PDP_BF16_PATH_EMULATED: return true;
    case PDP_BF16_PATH_AVX512: return cpu->avx512 != 0;
    case PDP_BF16_PATH_AMX: return cpu->amx != 0;
    case PDP_BF16_PATH_SGEMM: return PDP__BF16_HAS_SGEMM != 0;
    }
    return false;
}

PDP_API bool pdp_bf16_path_available(pdp_bf16_path path)
{
    pdp__once_run(&pdp__bf16_once, pdp__bf16_detect);
    return pdp__bf16_cpu_has(&pdp__bf16_this, path);
}

PDP_API const char *pdp_bf16_path_name(pdp_bf16_path path)
{
    switch (path) {
    case PDP_BF16_PATH_AUTO: return "auto";
    case PDP_BF16_PATH_EMULATED: return "emulated";
    case PDP_BF16_PATH_AVX512: return "avx512-bf16";
    case PDP_BF16_PATH_AMX: return "amx-bf16";
    case PDP_BF16_PATH_SGEMM: return "sgemm-rounded";
    }
    return "unknown";
}

/* ---- gemm_bf16: the path choice ----
   PDP_BF16_PATH_AUTO runs, per product, the path a table of CPU families names for the
   product's shape class, never a timing taken at run time (a noisy machine would then
   change the bits). Classes: the layout (ta, tb: the packing differs) times the size:
   k < 32 (packing and C's traffic dominate: the 10-class layer's dX = dY W), min(m, n)
   < 32 (a partial tile row or column: its forward and dW), else large. The rows are
   bench/bf16_paths's output on the CPUs named, pasted: each cell sgemm-rounded
   (pdp__sgemm_bf16, pdp_sgemm plus the rounding at packing: near fp32's speed, the
   figures in the table's rows) unless
   AVX512-BF16 or AMX was faster by the bench's margin. A CPU no row names, or a cell's
   path it lacks: AMX, else AVX512-BF16 on AMD (the Zen 4 row's choice), else
   sgemm-rounded, else AVX512-BF16 (a -DPDP_CBLAS build), else the emulation. */
enum { PDP__BF16_LARGE, PDP__BF16_SMALL_MN, PDP__BF16_SMALL_K, PDP__BF16_SIZES };
#define PDP__BF16_CLASSES (4 * PDP__BF16_SIZES)

PDP__PRIVATE int pdp__bf16_class(pdp_trans ta, pdp_trans tb, int64_t m, int64_t n, int64_t k)
{
    int size = k < 32 ? PDP__BF16_SMALL_K
                      : PDP__MIN(m, n) < 32 ? PDP__BF16_SMALL_MN : PDP__BF16_LARGE;
    return (2 * (ta == PDP_TRANS) + (tb == PDP_TRANS)) * PDP__BF16_SIZES + size;
}

typedef struct pdp__bf16_row {
    int vendor, family, model_lo, model_hi; /* models model_lo .. model_hi; -1: any */
    int avx512, amx; /* features every CPU the row names has */
    /* per class, layouts NN NT TN TT (spaces between), each large, small m or n,
       small k: E emulated, B avx512-bf16, A amx-bf16, S sgemm-rounded */
    const char *cells;
} pdp__bf16_row;

#define PDP__BF16_SPR_ROW(model) {PDP__BF16_INTEL, 6, model, model, 1, 1, "AAS AAS AAS AAS"}
PDP__PRIVATE const pdp__bf16_row pdp__bf16_table[] = {
    /* AMD Zen 4 (family 0x19 with AVX512-BF16): bench/bf16_paths on model 0x11, an EPYC
       core (one thread, chrt -f 1, 3 runs, load 0.2-1.4): AVX512-BF16 1.90-1.98x
       pdp_sgemm on large products, 1.57-2.04x at small m or n, 1.23-1.47x at small k;
       sgemm-rounded 0.90-1.04x, the emulation 0.27-0.91x. Steps: MLP batch 512 1.77-1.80x
       fp32, CNN batch 128 1.37x. The other Zen 4 models (client cores, Bergamo), not
       measured: the same core. Zen 3, also family 0x19, has no AVX-512, so the row does
       not apply (its cells need AVX512-BF16): the default, sgemm-rounded, which
       bench/bf16_paths measured on a Zen 3 core (model 1, AVX2 and FMA; 3 runs) at
       0.90-1.05x pdp_sgemm on large products and 0.73-1.00x at small m or n. */
    {PDP__BF16_AMD, 0x19, -1, -1, 1, 0, "BBB BBB BBB BBB"},
    /* Intel Xeon, Sapphire Rapids class (AMX): bench/bf16_paths on family 6 model 0xa7 as
       a VM reports such a Xeon (2 cores; one thread, chrt -f 1, 3 runs, load 0.3-0.9),
       with gemm_amx.c's driver and sgemm-rounded rounding as it packs, against
       pdp_sgemm: AMX 4.9-5.7x on large products and 2.2-2.9x at small m or n, but
       0.46-0.53x at small k (packing a k < 32 panel costs more than its few tile
       products), where sgemm-rounded is 0.97-1.02x (0.98-1.01x large, 0.88-0.97x small
       m or n); AVX512-BF16 0.61-0.96x everywhere (the vdpbf16ps peak is about half the
       FMA peak on this core). The same cells for model 0x8f (Sapphire Rapids) and 0xcf
       (Emerald Rapids), not measured: the same cores. */
    PDP__BF16_SPR_ROW(0x8f),
    PDP__BF16_SPR_ROW(0xa7),
    PDP__BF16_SPR_ROW(0xcf),
};
PDP__PRIVATE const size_t pdp__bf16_rows = sizeof pdp__bf16_table / sizeof pdp__bf16_table[0];

PDP__PRIVATE pdp_bf16_path pdp__bf16_cell(const char *cells, int cls)
{
    int i;
    for (i = 0; *cells; cells++) {
        if (*cells == ' ') continue;
        if (i++ < cls) continue;
        return *cells == 'A' ? PDP_BF16_PATH_AMX
             : *cells == 'B' ? PDP_BF16_PATH_AVX512
             : *cells == 'S' ? PDP_BF16_PATH_SGEMM : PDP_BF16_PATH_EMULATED;
    }
    return PDP_BF16_PATH_AUTO; /* a short row: the default */
}

/* The row of pdp__bf16_table naming cpu, or NULL. */
PDP__PRIVATE const pdp__bf16_row *pdp__bf16_row_of(const pdp__bf16_cpu *cpu)
{
    size_t i;
    for (i = 0; i < pdp__bf16_rows; i++) {
        const pdp__bf16_row *r = &pdp__bf16_table[i];
        if (r->vendor == cpu->vendor && r->family == cpu->family &&
            (r->model_lo < 0 || (cpu->model >= r->model_lo && cpu->model <= r->model_hi)))
            return r;
    }
    return NULL;
}

/* The path AUTO takes on cpu for this shape: a pure function of both. */
PDP__PRIVATE pdp_bf16_path pdp__bf16_choose(const pdp__bf16_cpu *cpu, pdp_trans ta, pdp_trans tb,
                                            int64_t m, int64_t n, int64_t k)
{
    const pdp__bf16_row *row = pdp__bf16_row_of(cpu);
    if (row) {
        pdp_bf16_path p = pdp__bf16_cell(row->cells, pdp__bf16_class(ta, tb, m, n, k));
        if (p != PDP_BF16_PATH_AUTO && pdp__bf16_cpu_has(cpu, p)) return p;
    }
    if (cpu->amx) return PDP_BF16_PATH_AMX;
    if (cpu->avx512 && cpu->vendor == PDP__BF16_AMD) return PDP_BF16_PATH_AVX512;
    if (PDP__BF16_HAS_SGEMM) return PDP_BF16_PATH_SGEMM;
    return cpu->avx512 ? PDP_BF16_PATH_AVX512 : PDP_BF16_PATH_EMULATED;
}

PDP_API pdp_bf16_path pdp_bf16_path_for(pdp_trans ta, pdp_trans tb, int64_t m, int64_t n,
                                        int64_t k)
{
    pdp__once_run(&pdp__bf16_once, pdp__bf16_detect);
    return pdp__bf16_choose(&pdp__bf16_this, ta, tb, m, n, k);
}

PDP_API pdp_bf16_path pdp_bf16_best_path(void)
{
    return pdp_bf16_path_for(PDP_NO_TRANS, PDP_TRANS, 512, 512, 512);
}

/* The fastest path that takes operands in bf16 words (the gathered operands below):
   AMX, else AVX512, else the emulation. */
PDP__PRIVATE pdp_bf16_path pdp__bf16_best_word_path(void)
{
    if (pdp_bf16_path_available(PDP_BF16_PATH_AMX)) return PDP_BF16_PATH_AMX;
    return pdp_bf16_path_available(PDP_BF16_PATH_AVX512) ? PDP_BF16_PATH_AVX512
                                                         : PDP_BF16_PATH_EMULATED;
}

/* ---- gemm_bf16: packing ---- */

/* op(X)(r, p) of an operand stored row-major with stride ld. */
static inline float pdp__bf16_at(const float *x, int64_t ld, pdp_trans t, int64_t r, int64_t p)
{
    return t == PDP_NO_TRANS ? x[r * ld + p] : x[p * ld + r];
}

/* Rows [r0, r0 + rows) of op(X) (rows x k) into pair words, `width` words per pair
   (width >= rows; the rest zero): dst[p * width + i] = (x(r0+i, 2p), x(r0+i, 2p+1)). */
PDP__PRIVATE void pdp__bf16_pack_panel(const float *x, int64_t ld, pdp_trans t, int64_t r0,
                                       int rows, int64_t k, int width, uint32_t *dst)
{
    int64_t p, pairs = (k + 1) / 2;
    int i;
    for (p = 0; p < pairs; p++) {
        uint32_t *d = dst + p * width;
        for (i = 0; i < rows; i++) {
            uint32_t lo = pdp__bf16_bits(pdp__bf16_at(x, ld, t, r0 + i, 2 * p));
            uint32_t hi = 2 * p + 1 < k ? pdp__bf16_bits(pdp__bf16_at(x, ld, t, r0 + i, 2 * p + 1))
                                        : 0u;
            d[i] = lo | hi << 16;
        }
        for (; i < width; i++) d[i] = 0u;
    }
}

/* Rows [r0, r0 + rows) of op(X) as ceil(rows / width) panels of `width` rows, panel j
   at dst + j * pairs * width (the last one zero-padded). */
PDP__PRIVATE void pdp__bf16_pack(const float *x, int64_t ld, pdp_trans t, int64_t r0, int rows,
                                 int64_t k, int width, uint32_t *dst)
{
    int64_t pairs = (k + 1) / 2;
    int j;
    for (j = 0; j < rows; j += width)
        pdp__bf16_pack_panel(x, ld, t, r0 + j, PDP__MIN(width, rows - j), k, width,
                             dst + j / width * pairs * width);
}

/* op(X)(r, p) of an operand already in bf16 words, storage row s at h + off[s]. */
static inline uint32_t pdp__bf16_hat(const uint16_t *h, const int64_t *off, pdp_trans t,
                                     int64_t r, int64_t p)
{
    return t == PDP_NO_TRANS ? h[off[r] + p] : h[off[p] + r];
}

/* pdp__bf16_pack for an operand already in bf16 words (pdp__gemm_bf16_convert's), its
   storage rows through off: the same panels, nothing to round. */
PDP__PRIVATE void pdp__bf16_pack_h(const uint16_t *h, const int64_t *off, pdp_trans t, int64_t r0,
                                   int rows, int64_t k, int width, uint32_t *dst)
{
    int64_t p, pairs = (k + 1) / 2;
    int i, j;
    for (j = 0; j < rows; j += width) {
        int n = PDP__MIN(width, rows - j);
        for (p = 0; p < pairs; p++) {
            uint32_t *d = dst + j / width * pairs * width + p * width;
            for (i = 0; i < n; i++)
                d[i] = pdp__bf16_hat(h, off, t, r0 + j + i, 2 * p) |
                       (2 * p + 1 < k ? pdp__bf16_hat(h, off, t, r0 + j + i, 2 * p + 1) << 16
                                      : 0u);
            for (; i < width; i++) d[i] = 0u;
        }
    }
}

/* x[0, n) as bf16 words (pdp__bf16_bits) into h. h may be x's own memory (h == (uint16_t
   *)x): word i is written after float i is read, at byte 2i, where float i / 2 was. */
PDP__PRIVATE void pdp__bf16_convert_emul(const float *x, uint16_t *h, int64_t n)
{
    int64_t i;
    for (i = 0; i < n; i++) {
        float f;
        uint16_t w;
        memcpy(&f, (const char *)x + 4 * i, sizeof f); /* bytes: h may alias x */
        w = pdp__bf16_bits(f);
        memcpy((char *)h + 2 * i, &w, sizeof w);
    }
}

#if PDP__BF16_X86
#  define PDP__BF16_TARGET PDP__TARGET("avx512f,avx512bw,avx512dq,avx512bf16")
/* The zero-masking forms, with every lane kept, of the unpacks and extracts the packing
   uses: GCC's headers write the plain forms with _mm*_undefined_*() as the merge source
   (`__m512i __Y = __Y;`), which g++ and nvcc's host pass (not gcc) report as
   -Wmaybe-uninitialized at every inlined call (99 to 102 warnings at -Og/-O2/-O3). The
   instructions are the same: gcc folds the full mask away (vpunpckldq, vextracti64x4). */
#  define PDP__BF16_UNPACKLO32(a, b) _mm512_maskz_unpacklo_epi32((__mmask16)0xffff, a, b)
#  define PDP__BF16_UNPACKHI32(a, b) _mm512_maskz_unpackhi_epi32((__mmask16)0xffff, a, b)
#  define PDP__BF16_UNPACKLO64(a, b) _mm512_maskz_unpacklo_epi64((__mmask8)0xff, a, b)
#  define PDP__BF16_UNPACKHI64(a, b) _mm512_maskz_unpackhi_epi64((__mmask8)0xff, a, b)
#  define PDP__BF16_HALF(w, L) _mm512_maskz_extracti64x4_epi64((__mmask8)0xf, w, L)
#  define PDP__BF16_LANE(w, L) _mm512_maskz_extracti32x4_epi32((__mmask8)0xf, w, L)
#  define PDP__BF16_SHL16(w) _mm512_maskz_slli_epi32((__mmask16)0xffff, w, 16) /* vpslld */

/* pdp__bf16_cvt2 where some lane is subnormal. */
PDP__BF16_TARGET PDP__PRIVATE __m512i pdp__bf16_cvt2_subnormal(__m512 lo, __m512 hi)
{
    const __m512i absm = _mm512_set1_epi32(0x7fffffff), least = _mm512_set1_epi32(0x00800000);
    const __m512i base = _mm512_set1_epi32(0x007f8000), span = _mm512_set1_epi32(0x8000);
    __m512i l = _mm512_castps_si512(lo), h = _mm512_castps_si512(hi);
    __m512i la = _mm512_and_si512(l, absm), ha = _mm512_and_si512(h, absm);
    __mmask16 lk = _mm512_cmplt_epu32_mask(_mm512_sub_epi32(la, base), span);
    __mmask16 hk = _mm512_cmplt_epu32_mask(_mm512_sub_epi32(ha, base), span);
    l = _mm512_mask_or_epi32(l, lk, _mm512_xor_si512(l, la), least);
    h = _mm512_mask_or_epi32(h, hk, _mm512_xor_si512(h, ha), least);
    return (__m512i)_mm512_cvtne2ps_pbh(_mm512_castsi512_ps(h), _mm512_castsi512_ps(l));
}

/* x rounded to bf16 by vcvtne2ps2bf16 (round to nearest even, a NaN quieted with its
   sign and top payload, as pdp__bf16_bits), 16 lanes at a time: lo's in words 0-15, hi's
   in 16-31. The instruction flushes subnormal inputs to zero of their sign (Intel SDM),
   where pdp__bf16_bits rounds them; the kernels read a subnormal bf16 as that zero
   (DAZ), so the two differ only where a subnormal fp32 rounds up to the least normal
   bf16 (|x| in [0x007f8000, 0x00800000) as bits): those lanes are set to that value
   (sign | 0x00800000) first, in a branch taken only when some lane is subnormal
   (vfpclassps, AVX512DQ). */
PDP__BF16_TARGET static inline __m512i pdp__bf16_cvt2(__m512 lo, __m512 hi)
{
    if (_kortestz_mask16_u8(_mm512_fpclass_ps_mask(lo, 0x20), /* denormals */
                            _mm512_fpclass_ps_mask(hi, 0x20)))
        return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
    return pdp__bf16_cvt2_subnormal(lo, hi);
}

/* 16 rows from `at` (mask m: those below rows) of x(., 2p) and x(., 2p + 1) for every
   pair p, as pair words to d + p width (wide: width >= 16; else width 8, rows 8-15 to
   d + panel + p width when two: both halves are in the padded rows); inlined with wide
   and two constant, so that the loop has no branch but the subnormal one. */
PDP__BF16_TARGET static inline PDP__ALWAYS_INLINE void pdp__bf16_pack_rows16(
    const float *x, int64_t ld, int64_t at, __mmask16 m, int64_t k, int width, int64_t panel,
    const int wide, const int two, uint32_t *d)
{
    const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9,
                                         24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1,
                                         16, 0);
    int64_t p, pairs = (k + 1) / 2;
    for (p = 0; p < pairs; p++, d += width) {
        __m512 vlo = _mm512_maskz_loadu_ps(m, x + 2 * p * ld + at);
        __m512 vhi = 2 * p + 1 < k ? _mm512_maskz_loadu_ps(m, x + (2 * p + 1) * ld + at)
                                   : _mm512_setzero_ps();
        __m512i w = _mm512_permutexvar_epi16(idx, pdp__bf16_cvt2(vlo, vhi));
        if (wide) {
            _mm512_storeu_si512((void *)d, w);
        } else { /* width 8: rows i .. i + 7 and i + 8 .. i + 15 in two panels */
            _mm256_storeu_si256((__m256i *)d, PDP__BF16_HALF(w, 0));
            if (two) _mm256_storeu_si256((__m256i *)(d + panel), PDP__BF16_HALF(w, 1));
        }
    }
}

/* pdp__bf16_pack for an operand whose rows are contiguous (t == PDP_TRANS: x(r, p) =
   x[p * ld + r]): per pair, 16 rows of x(., 2p) and x(., 2p + 1) converted together and
   interleaved (word i = lo_i | hi_i << 16) by one vpermw, then stored to one panel
   (width a multiple of 16) or two (width 8). */
PDP__BF16_TARGET PDP__PRIVATE void pdp__bf16_pack_rows(const float *x, int64_t ld, int64_t r0,
                                                       int rows, int64_t k, int width,
                                                       uint32_t *dst)
{
    int64_t panel = (k + 1) / 2 * width;
    int i, padded = (rows + width - 1) / width * width;
    for (i = 0; i < padded; i += 16) { /* 16 rows at a time, all pairs: no division inside */
        int left = rows - i, two = i + 8 < padded;
        __mmask16 m = (__mmask16)(left >= 16 ? 0xffff : left <= 0 ? 0 : (1u << left) - 1);
        int64_t at = r0 + (left > 0 ? i : 0);
        uint32_t *d = dst + i / width * panel + i % width;
        if (width >= 16)
            pdp__bf16_pack_rows16(x, ld, at, m, k, width, panel, 1, 0, d);
        else if (two)
            pdp__bf16_pack_rows16(x, ld, at, m, k, width, panel, 0, 1, d);
        else
            pdp__bf16_pack_rows16(x, ld, at, m, k, width, panel, 0, 0, d);
    }
}

/* row i of the block: its 32 values from pair p0 as 16 pair words (zero past rows):
   converted, or from bf16 words (hrow) as they are */
#  define PDP__BF16_ROWW(i)                                                                   \
    (i0 + (i) >= rows ? _mm512_setzero_si512()                                                 \
     : hrow[0]        ? _mm512_maskz_loadu_epi16(mh, hrow[i] + 2 * p0)                          \
                      : pdp__bf16_cvt2(_mm512_maskz_loadu_ps(mlo, row[i] + 2 * p0),            \
                                       _mm512_maskz_loadu_ps(mhi, row[i] + 2 * p0 + 16)))
/* lane L of lo (rows 0-3) and hi (rows 4-7): pair 4L + q, stored if below np */
#  define PDP__BF16_PUT4(q, L, lo, hi)                                                        \
    do {                                                                                       \
        if (4 * (L) + (q) < np) {                                                              \
            uint32_t *dq = d + (4 * (L) + (q)) * (int64_t)width;                               \
            _mm_storeu_si128((__m128i *)dq, PDP__BF16_LANE(lo, L));                           \
            _mm_storeu_si128((__m128i *)(dq + 4), PDP__BF16_LANE(hi, L));                     \
        }                                                                                      \
    } while (0)
#  define PDP__BF16_PUT(q, lo, hi)                                                            \
    do {                                                                                       \
        __m512i ulo = (lo), uhi = (hi);                                                        \
        PDP__BF16_PUT4(q, 0, ulo, uhi);                                                        \
        PDP__BF16_PUT4(q, 1, ulo, uhi);                                                        \
        PDP__BF16_PUT4(q, 2, ulo, uhi);                                                        \
        PDP__BF16_PUT4(q, 3, ulo, uhi);                                                        \
    } while (0)

/* pairs P, P + 1 (P = 4 L + q, q even) of the block from the q-th and (q + 1)-th
   quarters lo_q, hi_q (rows 0-3, 4-7; 128-bit lane L: pair 4 L + q) as one zmm of two
   8-word pair rows: [lo_q[L], hi_q[L], lo_q1[L], hi_q1[L]]; v, w: lo_q, lo_q1 and hi_q,
   hi_q1 with lanes L, L' interleaved */
#  define PDP__BF16_FULL2(q, lo0, hi0, lo1, hi1)                                              \
    do {                                                                                       \
        __m512i v = _mm512_permutex2var_epi64(lo0, i01, lo1);                                  \
        __m512i w = _mm512_permutex2var_epi64(hi0, i01, hi1);                                  \
        _mm512_storeu_si512((void *)(d + (q) * 8), _mm512_permutex2var_epi64(v, i01, w));      \
        _mm512_storeu_si512((void *)(d + (q + 4) * 8), _mm512_permutex2var_epi64(v, i23, w));  \
        v = _mm512_permutex2var_epi64(lo0, i23, lo1);                                          \
        w = _mm512_permutex2var_epi64(hi0, i23, hi1);                                          \
        _mm512_storeu_si512((void *)(d + (q + 8) * 8), _mm512_permutex2var_epi64(v, i01, w));  \
        _mm512_storeu_si512((void *)(d + (q + 12) * 8), _mm512_permutex2var_epi64(v, i23, w)); \
    } while (0)

/* pdp__bf16_pack for an operand whose rows run along k (t == PDP_NO_TRANS): blocks of 8
   rows x 16 pairs converted row by row (or, from bf16 words h, loaded: a pair is two
   adjacent words) and transposed in registers. A block of 16 whole pairs in a panel of
   width 8 is stored as 8 zmm of two pair rows each; the others lane by lane. Inlined
   with x or h NULL: x's rows at x + r ld, h's at h + off[r]. */
PDP__BF16_TARGET static inline PDP__ALWAYS_INLINE void pdp__bf16_pack_k_core(
    const float *x, const uint16_t *h, int64_t ld, const int64_t *off, int64_t r0, int rows,
    int64_t k, int width, uint32_t *dst)
{
    /* qword indices of vpermt2q: 128-bit lanes 0, 1 (i01) or 2, 3 (i23) of the first
       source interleaved with the same lanes of the second */
    const __m512i i01 = _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0);
    const __m512i i23 = _mm512_set_epi64(15, 14, 7, 6, 13, 12, 5, 4);
    int64_t p0, pairs = (k + 1) / 2;
    int i0, i;
    for (i0 = 0; i0 < width; i0 += 8) {
        const float *row[8];     /* the block's rows (past rows: unread) */
        const uint16_t *hrow[8]; /* or its rows of bf16 words (hrow[0] NULL: none) */
        for (i = 0; i < 8; i++) {
            int in = i0 + i < rows;
            row[i] = x && in ? x + (r0 + i0 + i) * ld : x;
            hrow[i] = h ? h + (in ? off[r0 + i0 + i] : off[r0]) : NULL;
        }
        for (p0 = 0; p0 < pairs; p0 += 16) {
            int64_t vals = k - 2 * p0;
            int np = (int)PDP__MIN((int64_t)16, pairs - p0);
            __mmask16 mlo = (__mmask16)(vals >= 16 ? 0xffff : (1u << vals) - 1);
            __mmask16 mhi =
                (__mmask16)(vals >= 32 ? 0xffff : vals <= 16 ? 0 : (1u << (vals - 16)) - 1);
            __mmask32 mh = (__mmask32)(vals >= 32 ? 0xffffffffu : (1u << vals) - 1);
            __m512i w0, w1, w2, w3, w4, w5, w6, w7, t0, t1, t2, t3, t4, t5, t6, t7;
            __m512i l0, l1, l2, l3, h0, h1, h2, h3;
            uint32_t *d = dst + p0 * width + i0;
            w0 = PDP__BF16_ROWW(0), w1 = PDP__BF16_ROWW(1), w2 = PDP__BF16_ROWW(2);
            w3 = PDP__BF16_ROWW(3), w4 = PDP__BF16_ROWW(4), w5 = PDP__BF16_ROWW(5);
            w6 = PDP__BF16_ROWW(6), w7 = PDP__BF16_ROWW(7);
            t0 = PDP__BF16_UNPACKLO32(w0, w1), t1 = PDP__BF16_UNPACKHI32(w0, w1);
            t2 = PDP__BF16_UNPACKLO32(w2, w3), t3 = PDP__BF16_UNPACKHI32(w2, w3);
            t4 = PDP__BF16_UNPACKLO32(w4, w5), t5 = PDP__BF16_UNPACKHI32(w4, w5);
            t6 = PDP__BF16_UNPACKLO32(w6, w7), t7 = PDP__BF16_UNPACKHI32(w6, w7);
            l0 = PDP__BF16_UNPACKLO64(t0, t2), h0 = PDP__BF16_UNPACKLO64(t4, t6);
            l1 = PDP__BF16_UNPACKHI64(t0, t2), h1 = PDP__BF16_UNPACKHI64(t4, t6);
            l2 = PDP__BF16_UNPACKLO64(t1, t3), h2 = PDP__BF16_UNPACKLO64(t5, t7);
            l3 = PDP__BF16_UNPACKHI64(t1, t3), h3 = PDP__BF16_UNPACKHI64(t5, t7);
            if (width == 8 && np == 16) {
                PDP__BF16_FULL2(0, l0, h0, l1, h1);
                PDP__BF16_FULL2(2, l2, h2, l3, h3);
                continue;
            }
            PDP__BF16_PUT(0, l0, h0);
            PDP__BF16_PUT(1, l1, h1);
            PDP__BF16_PUT(2, l2, h2);
            PDP__BF16_PUT(3, l3, h3);
        }
    }
}
#  undef PDP__BF16_FULL2

PDP__BF16_TARGET PDP__PRIVATE void pdp__bf16_pack_k_panel(const float *x, int64_t ld, int64_t r0,
                                                          int rows, int64_t k, int width,
                                                          uint32_t *dst)
{
    pdp__bf16_pack_k_core(x, NULL, ld, NULL, r0, rows, k, width, dst);
}

PDP__BF16_TARGET PDP__PRIVATE void pdp__bf16_pack_k_panel_h(const uint16_t *h, const int64_t *off,
                                                            int64_t r0, int rows, int64_t k,
                                                            int width, uint32_t *dst)
{
    pdp__bf16_pack_k_core(NULL, h, 0, off, r0, rows, k, width, dst);
}
#  undef PDP__BF16_ROWW
#  undef PDP__BF16_PUT
#  undef PDP__BF16_PUT4

/* pdp__bf16_pack with AVX512-BF16's conversion: the same words, but for subnormal
   values (zero of their sign here, rounded there), which every kernel reads as zero. */
PDP__BF16_TARGET PDP__PRIVATE void pdp__bf16_pack_avx512(const float *x, int64_t ld, pdp_trans t,
                                                         int64_t r0, int rows, int64_t k, int width,
                                                         uint32_t *dst)
{
    int64_t pairs = (k + 1) / 2;
    int j;
    if (t == PDP_TRANS) {
        pdp__bf16_pack_rows(x, ld, r0, rows, k, width, dst);
        return;
    }
    for (j = 0; j < rows; j += width)
        pdp__bf16_pack_k_panel(x, ld, r0 + j, PDP__MIN(width, rows - j), k, width,
                               dst + j / width * pairs * width);
}

/* pdp__bf16_pack_h of t == PDP_TRANS into one NR-column panel (cols <= NR = 32 rows of
   op(X) from c0), 32 columns of a pair at a time: two loads of 32 words, interleaved by
   two vpermt2w. */
PDP__BF16_TARGET PDP__PRIVATE void pdp__bf16_pack_h_cols(const uint16_t *h, const int64_t *off,
                                                         int64_t c0, int cols, int64_t k,
                                                         uint32_t *dst)
{
    /* word i of the first (second) half: lo[i] | hi[i] << 16 (lo[16 + i] | hi[16 + i] << 16) */
    const __m512i i0 = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9,
                                        40, 8, 39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1,
                                        32, 0);
    const __m512i i1 = _mm512_set_epi16(63, 31, 62, 30, 61, 29, 60, 28, 59, 27, 58, 26, 57, 25,
                                        56, 24, 55, 23, 54, 22, 53, 21, 52, 20, 51, 19, 50, 18,
                                        49, 17, 48, 16);
    __mmask32 m = (__mmask32)(cols >= 32 ? 0xffffffffu : (1u << cols) - 1);
    int64_t p, pairs = (k + 1) / 2;
    for (p = 0; p < pairs; p++) {
        uint32_t *d = dst + p * PDP__BF16_NR;
        __m512i lo = _mm512_maskz_loadu_epi16(m, h + off[2 * p] + c0);
        __m512i hi = 2 * p + 1 < k ? _mm512_maskz_loadu_epi16(m, h + off[2 * p + 1] + c0)
                                   : _mm512_setzero_si512();
        _mm512_storeu_si512((void *)d, _mm512_permutex2var_epi16(lo, i0, hi));
        _mm512_storeu_si512((void *)(d + 16), _mm512_permutex2var_epi16(lo, i1, hi));
    }
}

/* pdp__bf16_pack_h with AVX512: the same words. */
PDP__BF16_TARGET PDP__PRIVATE void pdp__bf16_pack_h_avx512(const uint16_t *h, const int64_t *off,
                                                           pdp_trans t, int64_t r0, int rows,
                                                           int64_t k, int width, uint32_t *dst)
{
    int64_t pairs = (k + 1) / 2;
    int j;
    if (t == PDP_TRANS && width == PDP__BF16_NR) {
        for (j = 0; j < rows; j += width)
            pdp__bf16_pack_h_cols(h, off, r0 + j, PDP__MIN(width, rows - j), k,
                                  dst + j / width * pairs * width);
        return;
    }
    if (t == PDP_TRANS) {
        pdp__bf16_pack_h(h, off, t, r0, rows, k, width, dst);
        return;
    }
    for (j = 0; j < rows; j += width)
        pdp__bf16_pack_k_panel_h(h, off, r0 + j, PDP__MIN(width, rows - j), k, width,
                                 dst + j / width * pairs * width);
}

/* pdp__bf16_convert_emul by vcvtne2ps2bf16 (pdp__bf16_cvt2: the words the avx512 packing
   makes), 32 floats at a time; the same in-place rule (a block's 32 words go to bytes
   its own floats or earlier ones held, after they are read). */
PDP__BF16_TARGET PDP__PRIVATE void pdp__bf16_convert_avx512(const float *x, uint16_t *h, int64_t n)
{
    int64_t i;
    for (i = 0; i < n; i += 32) {
        int64_t left = n - i;
        __mmask16 mlo = (__mmask16)(left >= 16 ? 0xffff : (1u << left) - 1);
        __mmask16 mhi = (__mmask16)(left >= 32 ? 0xffff : left <= 16 ? 0 : (1u << (left - 16)) - 1);
        __mmask32 m = (__mmask32)(left >= 32 ? 0xffffffffu : (1u << left) - 1);
        __m512i w = pdp__bf16_cvt2(_mm512_maskz_loadu_ps(mlo, x + i),
                                   _mm512_maskz_loadu_ps(mhi, x + i + 16));
        _mm512_mask_storeu_epi16(h + i, m, w);
    }
}
#endif

/* ---- gemm_bf16: micro-kernels ----
   Contract: pairs >= 1; ap holds pairs groups of MR words, bp pairs groups of NR
   words; writes the top-left mr x nr of the tile to c (row stride ldc). */

PDP__PRIVATE void pdp__bf16_kernel_emul(int64_t pairs, const uint32_t *ap, const uint32_t *bp,
                                        float *c, int64_t ldc, int mr, int nr, float alpha,
                                        float beta)
{
    float acc[PDP__BF16_MR][PDP__BF16_NR];
    int64_t p;
    int i, j;
    for (i = 0; i < PDP__BF16_MR; i++)
        for (j = 0; j < PDP__BF16_NR; j++) acc[i][j] = 0.0f;
    for (p = 0; p < pairs; p++) {
        const uint32_t *a = ap + p * PDP__BF16_MR, *b = bp + p * PDP__BF16_NR;
        for (i = 0; i < mr; i++) {
            float a0 = pdp__bf16_daz((uint16_t)a[i]), a1 = pdp__bf16_daz((uint16_t)(a[i] >> 16));
            for (j = 0; j < nr; j++) {
                float b0 = pdp__bf16_daz((uint16_t)b[j]),
                      b1 = pdp__bf16_daz((uint16_t)(b[j] >> 16));
                float s = pdp__bf16_ftz_add(acc[i][j], a1 * b1);
                acc[i][j] = pdp__bf16_ftz_add(s, a0 * b0);
            }
        }
    }
    for (i = 0; i < mr; i++)
        for (j = 0; j < nr; j++)
            c[i * ldc + j] = pdp__bf16_out(acc[i][j], alpha, beta, c + i * ldc + j);
}

#if PDP__BF16_X86
/* The emulation vectorised, for CPUs with AVX-512F but no AVX512-BF16 (Skylake-X to Ice
   Lake; the AVX2 kernel below for the others): vdpbf16ps's chain as two FMAs per pair,
   acc = fma(a_odd, b_odd, acc), then acc = fma(a_even, b_even, acc), on the bf16 halves
   widened in registers (a word's high half masked, its low half shifted up), with
   MXCSR's DAZ and FTZ set (and rounding to nearest) for the loop: DAZ reads a subnormal
   bf16 as zero, FTZ flushes a subnormal sum, and an FMA, like vdpbf16ps, adds the exact
   product without rounding it first, even where it falls below 2^-126 (the portable
   kernel's corner). MXCSR is restored before C is written, so alpha and beta see the
   caller's modes as on the other paths. The bits equal the AVX512 path's on every input
   test_bf16 tries, subnormal-heavy ones included. */
#  define PDP__BF16_EMUL_TARGET PDP__TARGET("avx512f")
#  define PDP__BF16_EROW(i)                                                                   \
    do {                                                                                       \
        __m512i w = _mm512_set1_epi32((int)a[i]);                                             \
        __m512 a1 = _mm512_castsi512_ps(_mm512_and_si512(w, high));                           \
        __m512 a0 = _mm512_castsi512_ps(PDP__BF16_SHL16(w));                                  \
        c##i##0 = _mm512_fmadd_ps(a1, b10, c##i##0);                                          \
        c##i##1 = _mm512_fmadd_ps(a1, b11, c##i##1);                                          \
        c##i##0 = _mm512_fmadd_ps(a0, b00, c##i##0);                                          \
        c##i##1 = _mm512_fmadd_ps(a0, b01, c##i##1);                                          \
    } while (0)

/* The AVX-512 kernels' epilogue: C = alpha acc + beta C for the MR x NR tile in acc
   (pdp__bf16_out's rule, 16 columns at a time, masked at nr; C not read when beta == 0),
   then, before the store, the bias (bias[j] + C, when bias is not NULL) and the ReLU (x
   <= 0 ? 0 : x, when relu): pdp__bf16_bias_tile's operations on the same values. */
PDP__BF16_EMUL_TARGET static inline PDP__ALWAYS_INLINE void pdp__bf16_store_tile512(
    __m512 acc[PDP__BF16_MR][2], float *c, int64_t ldc, int mr, int nr, float alpha, float beta,
    const float *bias, int relu)
{
    const __m512 zero = _mm512_setzero_ps();
    __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
    __mmask16 mask[2];
    int i, v;
    for (v = 0; v < 2; v++) {
        int left = nr - 16 * v;
        mask[v] = (__mmask16)(left >= 16 ? 0xffff : left <= 0 ? 0 : (1u << left) - 1);
    }
    for (i = 0; i < mr; i++)
        for (v = 0; v < 2; v++) {
            float *ci = c + i * ldc + 16 * v;
            __m512 r = _mm512_mul_ps(va, acc[i][v]);
            if (!mask[v]) continue;
            if (beta != 0.0f)
                r = _mm512_add_ps(_mm512_mul_ps(vb, _mm512_maskz_loadu_ps(mask[v], ci)), r);
            if (bias) r = _mm512_add_ps(_mm512_maskz_loadu_ps(mask[v], bias + 16 * v), r);
            if (relu) r = _mm512_mask_mov_ps(r, _mm512_cmp_ps_mask(r, zero, _CMP_LE_OQ), zero);
            _mm512_mask_storeu_ps(ci, mask[v], r);
        }
}

PDP__BF16_EMUL_TARGET PDP__PRIVATE void pdp__bf16_kernel_emul512(int64_t pairs, const uint32_t *ap,
                                                                 const uint32_t *bp, float *c,
                                                                 int64_t ldc, int mr, int nr,
                                                                 float alpha, float beta)
{
    __m512 acc[PDP__BF16_MR][2];
    __m512 c00 = _mm512_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
    __m512 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00, c60 = c00;
    __m512 c61 = c00, c70 = c00, c71 = c00;
    const __m512i high = _mm512_set1_epi32((int)0xffff0000u);
    unsigned csr = _mm_getcsr();
    int64_t p;
    _mm_setcsr((csr & ~0x6000u) | 0x8040u); /* round to nearest, FTZ (bit 15), DAZ (bit 6) */
    for (p = 0; p < pairs; p++) {
        const uint32_t *a = ap + p * PDP__BF16_MR;
        __m512i w0 = _mm512_loadu_si512((const void *)(bp + p * PDP__BF16_NR));
        __m512i w1 = _mm512_loadu_si512((const void *)(bp + p * PDP__BF16_NR + 16));
        __m512 b00 = _mm512_castsi512_ps(PDP__BF16_SHL16(w0));
        __m512 b01 = _mm512_castsi512_ps(PDP__BF16_SHL16(w1));
        __m512 b10 = _mm512_castsi512_ps(_mm512_and_si512(w0, high));
        __m512 b11 = _mm512_castsi512_ps(_mm512_and_si512(w1, high));
        PDP__BF16_EROW(0);
        PDP__BF16_EROW(1);
        PDP__BF16_EROW(2);
        PDP__BF16_EROW(3);
        PDP__BF16_EROW(4);
        PDP__BF16_EROW(5);
        PDP__BF16_EROW(6);
        PDP__BF16_EROW(7);
    }
    acc[0][0] = c00, acc[0][1] = c01, acc[1][0] = c10, acc[1][1] = c11;
    acc[2][0] = c20, acc[2][1] = c21, acc[3][0] = c30, acc[3][1] = c31;
    acc[4][0] = c40, acc[4][1] = c41, acc[5][0] = c50, acc[5][1] = c51;
    acc[6][0] = c60, acc[6][1] = c61, acc[7][0] = c70, acc[7][1] = c71;
    _mm_setcsr(csr);
    pdp__bf16_store_tile512(acc, c, ldc, mr, nr, alpha, beta, NULL, 0);
}
#  undef PDP__BF16_EROW

/* The same chain with AVX2 and FMA (Zen 2 and 3, Intel's client cores since Haswell):
   16 ymm registers hold a quarter of the 8 x 32 tile at a time (4 rows x 16 columns: 8
   accumulators, B's 4 widened vectors, A's two halves), so the tile is four passes over
   the pairs, each element's chain the same. MXCSR as above; the results go through acc
   to pdp__bf16_out (alpha acc + beta c, as the portable kernel writes them). */
#  define PDP__BF16_EMUL2_TARGET PDP__TARGET("avx2,fma")
#  define PDP__BF16_EROW2(i)                                                                  \
    do {                                                                                       \
        __m256i w = _mm256_set1_epi32((int)a[i]);                                             \
        __m256 a1 = _mm256_castsi256_ps(_mm256_and_si256(w, high));                           \
        __m256 a0 = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));                            \
        c##i##0 = _mm256_fmadd_ps(a1, b10, c##i##0);                                          \
        c##i##1 = _mm256_fmadd_ps(a1, b11, c##i##1);                                          \
        c##i##0 = _mm256_fmadd_ps(a0, b00, c##i##0);                                          \
        c##i##1 = _mm256_fmadd_ps(a0, b01, c##i##1);                                          \
    } while (0)

PDP__BF16_EMUL2_TARGET PDP__PRIVATE void pdp__bf16_kernel_emul256(int64_t pairs, const uint32_t *ap,
                                                                  const uint32_t *bp, float *c,
                                                                  int64_t ldc, int mr, int nr,
                                                                  float alpha, float beta)
{
    float acc[PDP__BF16_MR][PDP__BF16_NR];
    const __m256i high = _mm256_set1_epi32((int)0xffff0000u);
    unsigned csr = _mm_getcsr();
    int64_t p;
    int i0, j0, i, j;
    _mm_setcsr((csr & ~0x6000u) | 0x8040u); /* round to nearest, FTZ, DAZ */
    for (i0 = 0; i0 < PDP__BF16_MR; i0 += 4)
        for (j0 = 0; j0 < PDP__BF16_NR; j0 += 16) {
            __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00;
            __m256 c20 = c00, c21 = c00, c30 = c00, c31 = c00;
            for (p = 0; p < pairs; p++) {
                const uint32_t *a = ap + p * PDP__BF16_MR + i0;
                const uint32_t *b = bp + p * PDP__BF16_NR + j0;
                __m256i w0 = _mm256_loadu_si256((const __m256i *)b);
                __m256i w1 = _mm256_loadu_si256((const __m256i *)(b + 8));
                __m256 b00 = _mm256_castsi256_ps(_mm256_slli_epi32(w0, 16));
                __m256 b01 = _mm256_castsi256_ps(_mm256_slli_epi32(w1, 16));
                __m256 b10 = _mm256_castsi256_ps(_mm256_and_si256(w0, high));
                __m256 b11 = _mm256_castsi256_ps(_mm256_and_si256(w1, high));
                PDP__BF16_EROW2(0);
                PDP__BF16_EROW2(1);
                PDP__BF16_EROW2(2);
                PDP__BF16_EROW2(3);
            }
            _mm256_storeu_ps(&acc[i0][j0], c00), _mm256_storeu_ps(&acc[i0][j0 + 8], c01);
            _mm256_storeu_ps(&acc[i0 + 1][j0], c10), _mm256_storeu_ps(&acc[i0 + 1][j0 + 8], c11);
            _mm256_storeu_ps(&acc[i0 + 2][j0], c20), _mm256_storeu_ps(&acc[i0 + 2][j0 + 8], c21);
            _mm256_storeu_ps(&acc[i0 + 3][j0], c30), _mm256_storeu_ps(&acc[i0 + 3][j0 + 8], c31);
        }
    _mm_setcsr(csr);
    for (i = 0; i < mr; i++)
        for (j = 0; j < nr; j++)
            c[i * ldc + j] = pdp__bf16_out(acc[i][j], alpha, beta, c + i * ldc + j);
}
#  undef PDP__BF16_EROW2
#endif

#if PDP__BF16_X86
/* One row of the tile: acc_i0, acc_i1 += a[i] (broadcast) . b0, b1 (one vdpbf16ps per
   16 columns). The 16 accumulators are named so that they stay in registers. */
#  define PDP__BF16_ROW(i)                                                                    \
    do {                                                                                       \
        __m512bh ai = (__m512bh)_mm512_set1_epi32((int)a[i]);                                 \
        c##i##0 = _mm512_dpbf16_ps(c##i##0, ai, b0);                                          \
        c##i##1 = _mm512_dpbf16_ps(c##i##1, ai, b1);                                          \
    } while (0)
#  define PDP__BF16_ROW1(i) /* the first 16 columns only */                                 \
    do {                                                                                       \
        c##i##0 = _mm512_dpbf16_ps(c##i##0, (__m512bh)_mm512_set1_epi32((int)a[i]), b0);      \
    } while (0)
/* The k loop over a tile's pairs with ROW (the two vectors) or ROW1 (the first), wide and
   rows constants: b1 loaded when wide, rows 4 .. 7 run when rows is 8. */
#  define PDP__BF16_LOOP(ROW, wide, rows)                                                     \
    do {                                                                                      \
        for (p = 0; p < pairs; p++) {                                                         \
            const uint32_t *a = ap + p * PDP__BF16_MR;                                        \
            const uint32_t *b = bp + p * PDP__BF16_NR;                                        \
            __m512bh b0 = (__m512bh)_mm512_loadu_si512((const void *)b);                      \
            __m512bh b1 = wide ? (__m512bh)_mm512_loadu_si512((const void *)(b + 16)) : b0;   \
            (void)b1;                                                                         \
            ROW(0);                                                                           \
            ROW(1);                                                                           \
            ROW(2);                                                                           \
            ROW(3);                                                                           \
            if (rows > 4) {                                                                   \
                ROW(4);                                                                       \
                ROW(5);                                                                       \
                ROW(6);                                                                       \
                ROW(7);                                                                       \
            }                                                                                 \
        }                                                                                     \
    } while (0)

/* the kernel below names MR = 8 rows of accumulators */
typedef char pdp__bf16_avx512_shape_ok[PDP__BF16_MR == 8 && PDP__BF16_NR == 32 ? 1 : -1];

/* The kernel with Linear's epilogue fused (pdp__bf16_store_tile512's bias and relu: the
   tile stored once, where pdp__bf16_bias_tile read it back). */
PDP__BF16_TARGET PDP__PRIVATE void pdp__bf16_kernel_avx512_epi(int64_t pairs, const uint32_t *ap,
                                                               const uint32_t *bp, float *c,
                                                               int64_t ldc, int mr, int nr,
                                                               float alpha, float beta,
                                                               const float *bias, int relu)
{
    __m512 acc[PDP__BF16_MR][2];
    __m512 c00 = _mm512_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
    __m512 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00, c60 = c00;
    __m512 c61 = c00, c70 = c00, c71 = c00;
    int64_t p;
    /* a tile of at most 16 columns (a classifier's 10) or 4 rows (its dW's last panel):
       the loop of its vectors and rows alone, each element's chain the full tile's */
    if (mr > 4 && nr > 16)
        PDP__BF16_LOOP(PDP__BF16_ROW, 1, 8);
    else if (mr > 4)
        PDP__BF16_LOOP(PDP__BF16_ROW1, 0, 8);
    else if (nr > 16)
        PDP__BF16_LOOP(PDP__BF16_ROW, 1, 4);
    else
        PDP__BF16_LOOP(PDP__BF16_ROW1, 0, 4);
    acc[0][0] = c00, acc[0][1] = c01, acc[1][0] = c10, acc[1][1] = c11;
    acc[2][0] = c20, acc[2][1] = c21, acc[3][0] = c30, acc[3][1] = c31;
    acc[4][0] = c40, acc[4][1] = c41, acc[5][0] = c50, acc[5][1] = c51;
    acc[6][0] = c60, acc[6][1] = c61, acc[7][0] = c70, acc[7][1] = c71;
    pdp__bf16_store_tile512(acc, c, ldc, mr, nr, alpha, beta, bias, relu);
}
#  undef PDP__BF16_ROW
#  undef PDP__BF16_ROW1
#  undef PDP__BF16_LOOP
#endif

typedef void (*pdp__bf16_kernel_fn)(int64_t pairs, const uint32_t *ap, const uint32_t *bp,
                                    float *c, int64_t ldc, int mr, int nr, float alpha,
                                    float beta);
/* A kernel that adds the bias and applies the ReLU as it stores (Linear's epilogue). */
typedef void (*pdp__bf16_kernel_epi_fn)(int64_t pairs, const uint32_t *ap, const uint32_t *bp,
                                        float *c, int64_t ldc, int mr, int nr, float alpha,
                                        float beta, const float *bias, int relu);

typedef void (*pdp__bf16_pack_fn)(const float *x, int64_t ld, pdp_trans t, int64_t r0, int rows,
                                  int64_t k, int width, uint32_t *dst);

typedef void (*pdp__bf16_pack_h_fn)(const uint16_t *h, const int64_t *off, pdp_trans t,
                                    int64_t r0, int rows, int64_t k, int width, uint32_t *dst);

/* ---- gemm_bf16: driver ---- */

/* pdp__bf16_run's paths for the emulation on one kernel, whatever the CPU has beside
   (pdp__gemm_bf16_emul: the tests'): portable C, AVX2, AVX-512F. */
#define PDP__BF16_PATH_PORTABLE ((pdp_bf16_path)16)
#define PDP__BF16_PATH_EMUL256 ((pdp_bf16_path)17)
#define PDP__BF16_PATH_EMUL512 ((pdp_bf16_path)18)

typedef struct pdp__bf16_args {
    pdp_trans ta, tb;
    int64_t m, n, k;
    float alpha, beta;
    const float *a, *b;
    int64_t lda, ldb, ldc;
    const uint16_t *ah, *bh;    /* not NULL: A (B) in bf16 words instead of a (b) */
    const int64_t *arow, *brow; /* storage row r at ah + arow[r] (bh + brow[r]) */
    float *c;
    pdp__bf16_kernel_fn kernel;
    pdp__bf16_pack_fn pack;
    pdp__bf16_pack_h_fn pack_h;
    int split_n;       /* parts split the NR-column panels (else the MR-row panels) */
    const float *bias; /* not NULL: C(i, j) += bias[j] after alpha acc + beta C */
    int relu;          /* then C = pdp__relu(C) */
    float *gelu;       /* not NULL: then G = gelu(C) here (C's ldc), C kept */
    int gelu_simd;     /* its kernel's width: pdp__layers_simd's */
    pdp__bf16_kernel_epi_fn kernel_epi; /* not NULL: it runs instead of kernel, with the bias
                                           and ReLU (a GELU follows as a pass) */
} pdp__bf16_args;

/* layers.c's GELU kernel (out = gelu(x), or dy gelu'(x) when dy is not NULL, on rows of n
   floats ld apart, each element alone) and the width the GELU layer runs it on: a fused
   GELU's epilogue runs it. */
PDP__PRIVATE int pdp__layers_simd(void);
PDP__PRIVATE void pdp__layers_gelu_simd_rows(int simd, const float *x, const float *dy, float *out,
                                             int64_t n, int64_t rows, int64_t ld);

/* G = gelu(C) over C[i0, i0 + mr) x [j0, j0 + nr) (g->gelu: a Linear's fused GELU), by
   the GELU layer's kernel on the width it runs (each element alone, whatever the cut). */
PDP__PRIVATE void pdp__bf16_gelu_tile(const pdp__bf16_args *g, int64_t i0, int64_t j0, int mr,
                                      int nr)
{
    int64_t at = i0 * g->ldc + j0;
    pdp__layers_gelu_simd_rows(g->gelu_simd, g->c + at, NULL, g->gelu + at, nr, mr, g->ldc);
}

/* C[i0, i0 + mr) x [j0, j0 + nr) through pdp__bf16_bias_relu, then the GELU, where a
   kernel has just written it (the tile is in L1): the gemm_bf16.c kernels' epilogue. */
PDP__PRIVATE void pdp__bf16_bias_tile(const pdp__bf16_args *g, int64_t i0, int64_t j0, int mr,
                                      int nr)
{
    const float *b = g->bias ? g->bias + j0 : NULL;
    int i, j;
    for (i = 0; i < mr; i++) {
        float *c = g->c + (i0 + i) * g->ldc + j0;
        if (b)
            for (j = 0; j < nr; j++) c[j] = b[j] + c[j];
        if (g->relu)
            for (j = 0; j < nr; j++) c[j] = pdp__relu(c[j]);
    }
    if (g->gelu) pdp__bf16_gelu_tile(g, i0, j0, mr, nr);
}

/* op(A)(i, p) and op(B)(p, j) as bf16 words. */
PDP__PRIVATE uint16_t pdp__bf16_aword(const pdp__bf16_args *g, int64_t i, int64_t p)
{
    if (g->ah) return (uint16_t)pdp__bf16_hat(g->ah, g->arow, g->ta, i, p);
    return pdp__bf16_bits(pdp__bf16_at(g->a, g->lda, g->ta, i, p));
}
PDP__PRIVATE uint16_t pdp__bf16_bword(const pdp__bf16_args *g, int64_t p, int64_t j)
{
    pdp_trans tbt = g->tb == PDP_NO_TRANS ? PDP_TRANS : PDP_NO_TRANS;
    if (g->bh) return (uint16_t)pdp__bf16_hat(g->bh, g->brow, tbt, j, p);
    return pdp__bf16_bits(pdp__bf16_at(g->b, g->ldb, tbt, j, p));
}

/* Element (i, j) of C by the emulated chain, unpacked (the fallback without scratch). */
PDP__PRIVATE void pdp__bf16_element(const pdp__bf16_args *g, int64_t i, int64_t j)
{
    float acc = 0.0f;
    int64_t p;
    for (p = 0; p < g->k; p += 2) {
        float a0 = pdp__bf16_daz(pdp__bf16_aword(g, i, p));
        float b0 = pdp__bf16_daz(pdp__bf16_bword(g, p, j));
        if (p + 1 < g->k) {
            float a1 = pdp__bf16_daz(pdp__bf16_aword(g, i, p + 1));
            float b1 = pdp__bf16_daz(pdp__bf16_bword(g, p + 1, j));
            acc = pdp__bf16_ftz_add(acc, a1 * b1);
        } else {
            acc = pdp__bf16_ftz_add(acc, 0.0f);
        }
        acc = pdp__bf16_ftz_add(acc, a0 * b0);
    }
    g->c[i * g->ldc + j] = pdp__bf16_bias_relu(
        pdp__bf16_out(acc, g->alpha, g->beta, g->c + i * g->ldc + j), g->bias ? g->bias + j : NULL,
        g->relu);
    if (g->gelu) pdp__bf16_gelu_tile(g, i, j, 1, 1);
}

/* C[m0, m1) x [n0, n1) (m0, n0 on the tile grid). B's panels for [n0, n1) are packed
   once, in the first MC block, and reused by the others. */
PDP__PRIVATE void pdp__bf16_block(const pdp__bf16_args *g, int64_t m0, int64_t m1, int64_t n0,
                                  int64_t n1)
{
    int64_t pairs = (g->k + 1) / 2, mc, ir, jr, i, j;
    /* op(B) as a row-major n x k matrix for packing: op(B)^T(j, p) = op(B)(p, j) */
    pdp_trans tbt = g->tb == PDP_NO_TRANS ? PDP_TRANS : PDP_NO_TRANS;
    int64_t mrows = PDP__MIN(PDP__BF16_MC, m1 - m0);
    int64_t arows = (mrows + PDP__BF16_MR - 1) / PDP__BF16_MR * PDP__BF16_MR;
    int64_t bcols = (n1 - n0 + PDP__BF16_NR - 1) / PDP__BF16_NR * PDP__BF16_NR;
    size_t words = (size_t)pairs * (size_t)(arows + bcols);
    uint32_t *ap = (uint32_t *)pdp__thread_scratch(words * sizeof(uint32_t)), *bp;
    if (!ap) {
        for (i = m0; i < m1; i++)
            for (j = n0; j < n1; j++) pdp__bf16_element(g, i, j);
        return;
    }
    bp = ap + (size_t)pairs * (size_t)arows;
    for (mc = m0; mc < m1; mc += PDP__BF16_MC) {
        int64_t mend = PDP__MIN(m1, mc + PDP__BF16_MC);
        if (g->ah)
            g->pack_h(g->ah, g->arow, g->ta, mc, (int)(mend - mc), g->k, PDP__BF16_MR, ap);
        else
            g->pack(g->a, g->lda, g->ta, mc, (int)(mend - mc), g->k, PDP__BF16_MR, ap);
        for (jr = n0; jr < n1; jr += PDP__BF16_NR) {
            int nr = (int)PDP__MIN(PDP__BF16_NR, n1 - jr);
            uint32_t *bj = bp + (jr - n0) * pairs;
            if (mc == m0 && g->bh)
                g->pack_h(g->bh, g->brow, tbt, jr, nr, g->k, PDP__BF16_NR, bj);
            else if (mc == m0)
                g->pack(g->b, g->ldb, tbt, jr, nr, g->k, PDP__BF16_NR, bj);
            for (ir = mc; ir < mend; ir += PDP__BF16_MR) {
                int mr = (int)PDP__MIN(PDP__BF16_MR, mend - ir);
                float *c = g->c + ir * g->ldc + jr;
                if (g->kernel_epi) {
                    g->kernel_epi(pairs, ap + (ir - mc) * pairs, bj, c, g->ldc, mr, nr,
                                  g->alpha, g->beta, g->bias ? g->bias + jr : NULL, g->relu);
                    if (g->gelu) pdp__bf16_gelu_tile(g, ir, jr, mr, nr);
                    continue;
                }
                g->kernel(pairs, ap + (ir - mc) * pairs, bj, c, g->ldc, mr, nr, g->alpha,
                          g->beta);
                if (g->bias || g->relu || g->gelu) pdp__bf16_bias_tile(g, ir, jr, mr, nr);
            }
        }
    }
}

/* Part i of n: an equal share of the column or row panels. */
PDP__PRIVATE void pdp__bf16_part(void *arg, int i, int n)
{
    const pdp__bf16_args *g = (const pdp__bf16_args *)arg;
    int64_t step = g->split_n ? PDP__BF16_NR : PDP__BF16_MR;
    int64_t len = g->split_n ? g->n : g->m;
    int64_t panels = (len + step - 1) / step;
    int64_t lo = PDP__MIN(len, panels * i / n * step);
    int64_t hi = PDP__MIN(len, panels * (i + 1) / n * step);
    if (lo >= hi) return;
    if (g->split_n)
        pdp__bf16_block(g, 0, g->m, lo, hi);
    else
        pdp__bf16_block(g, lo, hi, 0, g->n);
}

#if PDP__BF16_AMX || defined(PDP__AMX_EMULATE)
PDP__PRIVATE void pdp__amx_run(const pdp__bf16_args *g, int emulate); /* gemm_amx.c */
#endif

/* *g for C = alpha op(A) op(B) + beta C, the operands as pdp__bf16_run takes them, with
   the portable kernel and packing (a path swaps its own in); 0 when nothing is left to
   compute (C empty; or k or alpha zero, and C scaled by beta here). */
PDP__PRIVATE int pdp__bf16_args_init(pdp__bf16_args *g, pdp_trans ta, pdp_trans tb, int64_t m,
                                     int64_t n, int64_t k, float alpha, const float *a,
                                     const uint16_t *ah, int64_t lda, const int64_t *arow,
                                     const float *b, const uint16_t *bh, int64_t ldb,
                                     const int64_t *brow, float beta, float *c, int64_t ldc)
{
    if (m <= 0 || n <= 0) return 0;
    PDP_ASSERT(ldc >= n);
    if (k <= 0 || alpha == 0.0f) {
        pdp__gemm_scale_c(m, n, beta, c, ldc);
        return 0;
    }
    PDP_ASSERT(arow || lda >= (ta == PDP_NO_TRANS ? k : m));
    PDP_ASSERT(brow || ldb >= (tb == PDP_NO_TRANS ? n : k));
    PDP_ASSERT(!ah == !arow && !bh == !brow);
    memset(g, 0, sizeof *g);
    g->ta = ta;
    g->tb = tb;
    g->m = m;
    g->n = n;
    g->k = k;
    g->alpha = alpha;
    g->beta = beta;
    g->a = a;
    g->b = b;
    g->lda = lda;
    g->ldb = ldb;
    g->arow = arow;
    g->brow = brow;
    g->ah = ah;
    g->bh = bh;
    g->c = c;
    g->ldc = ldc;
    g->kernel = pdp__bf16_kernel_emul;
    g->pack = pdp__bf16_pack;
    g->pack_h = pdp__bf16_pack_h;
    g->gelu_simd = pdp__layers_simd();
    return 1;
}

/* pdp_gemm_bf16_on on an available path (not AUTO); A (B) as bf16 words at ah (bh)
   when given, storage row r at ah + arow[r] (bh + brow[r]), else as floats at a (b). */
PDP__PRIVATE void pdp__bf16_run(pdp_bf16_path path, pdp_trans ta, pdp_trans tb, int64_t m,
                                int64_t n, int64_t k, float alpha, const float *a,
                                const uint16_t *ah, int64_t lda, const int64_t *arow,
                                const float *b, const uint16_t *bh, int64_t ldb,
                                const int64_t *brow, float beta, const float *bias, int relu,
                                float *gelu, float *c, int64_t ldc)
{
    pdp__bf16_args g;
    int threads, parts;
    int64_t npan, mpan;
    /* the emulation's kernel: the widest the CPU has, or the one asked for */
    int simd = path == PDP__BF16_PATH_PORTABLE ? 0
             : path == PDP__BF16_PATH_EMUL256  ? 256
             : path == PDP__BF16_PATH_EMUL512  ? 512
             : pdp__bf16_this.emul512          ? 512
             : pdp__bf16_this.emul256          ? 256 : 0;
    g.gelu_simd = pdp__layers_simd(); /* for the epilogue of an empty product below */
    if (path >= PDP__BF16_PATH_PORTABLE) path = PDP_BF16_PATH_EMULATED;
    (void)path, (void)simd; /* PDP_NO_SIMD: one path, one kernel */
#if PDP__BF16_HAS_SGEMM
    if (path == PDP_BF16_PATH_SGEMM) {
        PDP_ASSERT(!ah && !bh && !bias && !relu && !gelu); /* the chain paths below */
        pdp__sgemm_bf16(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        return;
    }
#endif
    if (!pdp__bf16_args_init(&g, ta, tb, m, n, k, alpha, a, ah, lda, arow, b, bh, ldb, brow,
                             beta, c, ldc)) {
        if (m > 0 && n > 0 && (bias || relu || gelu)) { /* C = beta C (acc 0), then the bias */
            int64_t i;
            g.c = c, g.ldc = ldc, g.bias = bias, g.relu = relu, g.gelu = gelu;
            for (i = 0; i < m; i++) pdp__bf16_bias_tile(&g, i, 0, 1, (int)n);
        }
        return;
    }
    g.bias = bias;
    g.relu = relu;
    g.gelu = gelu;
#if PDP__BF16_X86
    if (path == PDP_BF16_PATH_EMULATED && simd == 512) g.kernel = pdp__bf16_kernel_emul512;
    if (path == PDP_BF16_PATH_EMULATED && simd == 256) g.kernel = pdp__bf16_kernel_emul256;
    if (path == PDP_BF16_PATH_AVX512) g.kernel_epi = pdp__bf16_kernel_avx512_epi;
    /* the emulation keeps the portable packing; AMX implies AVX512-BF16 on every CPU
       that has it, but is not assumed to */
    if (path != PDP_BF16_PATH_EMULATED && pdp__bf16_this.avx512) {
        g.pack = pdp__bf16_pack_avx512;
        g.pack_h = pdp__bf16_pack_h_avx512;
    }
#endif
#if PDP__BF16_AMX
    if (path == PDP_BF16_PATH_AMX) { /* its own driver: gemm_amx.c */
        pdp__amx_run(&g, 0);
        return;
    }
#endif
    threads = pdp__threads_for_caller();
    if (2.0 * (double)m * (double)n * (double)k < PDP__BF16_PAR_FLOPS) threads = 1;
    npan = (n + PDP__BF16_NR - 1) / PDP__BF16_NR;
    mpan = (m + PDP__BF16_MR - 1) / PDP__BF16_MR;
    /* along C's longer side, as pdp_sgemm splits (gemm.c says why) */
    g.split_n = npan * PDP__BF16_NR >= mpan * PDP__BF16_MR
                    ? npan >= (int64_t)threads || npan >= mpan
                    : mpan < (int64_t)threads && npan > mpan;
    parts = (int)PDP__MIN((int64_t)threads, g.split_n ? npan : mpan);
    pdp__parallel_for(parts, pdp__bf16_part, &g);
}

PDP_API pdp_status pdp_gemm_bf16_on(pdp_bf16_path path, pdp_trans ta, pdp_trans tb, int64_t m,
                                    int64_t n, int64_t k, float alpha, const float *a,
                                    int64_t lda, const float *b, int64_t ldb, float beta,
                                    float *c, int64_t ldc)
{
    if (path == PDP_BF16_PATH_AUTO) path = pdp_bf16_path_for(ta, tb, m, n, k);
    if (!pdp_bf16_path_available(path))
        return pdp__err(PDP_ERR_UNSUPPORTED, "pdp_gemm_bf16_on: path %s is not available on "
                        "this CPU or build", pdp_bf16_path_name(path));
    pdp__bf16_run(path, ta, tb, m, n, k, alpha, a, NULL, lda, NULL, b, NULL, ldb, NULL, beta, NULL,
                  0, NULL, c, ldc);
    return PDP_OK;
}

PDP_API void pdp_gemm_bf16(pdp_trans ta, pdp_trans tb, int64_t m, int64_t n, int64_t k,
                           float alpha, const float *a, int64_t lda, const float *b, int64_t ldb,
                           float beta, float *c, int64_t ldc)
{
    (void)pdp_gemm_bf16_on(PDP_BF16_PATH_AUTO, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c,
                           ldc);
}

/* pdp_gemm_bf16_on(PDP_BF16_PATH_EMULATED, ...) on one kernel of the emulation, simd: 0
   portable C, 256 AVX2, 512 AVX-512F (one this CPU lacks: the caller's bug); the tests
   check each against the others and against vdpbf16ps. */
PDP__PRIVATE void pdp__gemm_bf16_emul(int simd, pdp_trans ta, pdp_trans tb, int64_t m, int64_t n,
                                      int64_t k, float alpha, const float *a, int64_t lda,
                                      const float *b, int64_t ldb, float beta, float *c,
                                      int64_t ldc)
{
    pdp_bf16_path_available(PDP_BF16_PATH_AUTO); /* CPUID read */
    PDP_ASSERT(simd == 0 || (simd == 256 && pdp__bf16_this.emul256) ||
               (simd == 512 && pdp__bf16_this.emul512));
    pdp__bf16_run(simd == 512   ? PDP__BF16_PATH_EMUL512
                  : simd == 256 ? PDP__BF16_PATH_EMUL256
                                : PDP__BF16_PATH_PORTABLE,
                  ta, tb, m, n, k, alpha, a, NULL, lda, NULL, b, NULL, ldb, NULL, beta, NULL, 0,
                  NULL, c, ldc);
}

/* C = op(A) op(B) + bias, then the ReLU where relu != 0 (bias: one value per column of C,
   NULL for none): a Linear's forward x W^T + b in one pass over C, the bias and the ReLU
   added in the product's epilogue to alpha acc (alpha 1, beta 0), so the bits of
   pdp_gemm_bf16_on with beta 0 followed by a pass C = relu(bias + C) (or of C = bias
   then beta 1: fl(acc + b) either way). gelu not NULL (ldc its row stride too): C as
   without it, and gelu = the GELU layer's output on C, in the same pass (no ReLU with it).
   On `path` (AUTO: pdp_bf16_path_for's choice; one the CPU lacks is the caller's bug;
   PDP__BF16_PATH_PORTABLE, _EMUL256, _EMUL512: one kernel of the emulation, as
   pdp__gemm_bf16_emul). False, C untouched, on sgemm-rounded, which adds beta C to its
   first k block's partial sum: the caller sets C = bias, runs the product with beta 1 and
   its ReLU or GELU after. */
PDP__PRIVATE bool pdp__gemm_bf16_bias(pdp_bf16_path path, pdp_trans ta, pdp_trans tb, int64_t m,
                                      int64_t n, int64_t k, const float *a, int64_t lda,
                                      const float *b, int64_t ldb, const float *bias, int relu,
                                      float *gelu, float *c, int64_t ldc)
{
    pdp_bf16_path_available(PDP_BF16_PATH_AUTO); /* CPUID read */
    if (path == PDP_BF16_PATH_AUTO) path = pdp_bf16_path_for(ta, tb, m, n, k);
    if (path == PDP_BF16_PATH_SGEMM) return false;
    PDP_ASSERT(path == PDP__BF16_PATH_PORTABLE ||
               (path == PDP__BF16_PATH_EMUL256 && pdp__bf16_this.emul256) ||
               (path == PDP__BF16_PATH_EMUL512 && pdp__bf16_this.emul512) ||
               (path < PDP__BF16_PATH_PORTABLE && pdp_bf16_path_available(path)));
    PDP_ASSERT(!(relu && gelu));
    pdp__bf16_run(path, ta, tb, m, n, k, 1.0f, a, NULL, lda, NULL, b, NULL, ldb, NULL, 0.0f, bias,
                  relu, gelu, c, ldc);
    return true;
}

/* path with AUTO resolved to the best that takes bf16 words; one the CPU lacks, or
   sgemm-rounded (which takes floats: Conv2d rounds them and calls pdp__sgemm_rows), is
   the caller's bug. */
PDP__PRIVATE pdp_bf16_path pdp__bf16_resolve(pdp_bf16_path path)
{
    if (path == PDP_BF16_PATH_AUTO) path = pdp__bf16_best_word_path();
    PDP_ASSERT(path != PDP_BF16_PATH_SGEMM && pdp_bf16_path_available(path));
    return path;
}

/* ---- gemm_bf16: gathered operands ----
   gemm.c's pdp__sgemm_rows and pdp__sgemm_arows in bf16, on `path` (AUTO: the best;
   one the CPU lacks: the caller's bug, asserted), with the gathered operand already in
   bf16 words as pdp__gemm_bf16_convert on the same path wrote them (Conv2d converts its
   padded image once, where packing floats would convert each value k k times): the
   packing reads the storage rows through the offset table and converts nothing, a pair
   is two loads and two vpermt2w per 32 columns, or two adjacent words. Same tiles,
   chains and bits as pdp_gemm_bf16_on on the materialised floats, on the same path.
   rows_h:  B's storage row r at bh + brow[r]: op(B)(p, j) = bh[brow[p] + j] (tb ==
            PDP_NO_TRANS) or bh[brow[j] + p] (PDP_TRANS).
   arows_h: A not transposed, row i at ah + arow[i]: A(i, p) = ah[arow[i] + p]. */
PDP__PRIVATE void pdp__gemm_bf16_rows_h(pdp_bf16_path path, pdp_trans ta, pdp_trans tb, int64_t m,
                                        int64_t n, int64_t k, float alpha, const float *a,
                                        int64_t lda, const uint16_t *bh, const int64_t *brow,
                                        float beta, float *c, int64_t ldc)
{
    pdp__bf16_run(pdp__bf16_resolve(path), ta, tb, m, n, k, alpha, a, NULL, lda, NULL, NULL, bh,
                  0, brow, beta, NULL, 0, NULL, c, ldc);
}

PDP__PRIVATE void pdp__gemm_bf16_arows_h(pdp_bf16_path path, pdp_trans tb, int64_t m, int64_t n,
                                         int64_t k, float alpha, const uint16_t *ah,
                                         const int64_t *arow, const float *b, int64_t ldb,
                                         float beta, float *c, int64_t ldc)
{
    pdp__bf16_run(pdp__bf16_resolve(path), PDP_NO_TRANS, tb, m, n, k, alpha, NULL, ah, 0, arow,
                  b, NULL, ldb, NULL, beta, NULL, 0, NULL, c, ldc);
}

/* x[0, n) as the bf16 words `path`'s packing makes (AUTO: the best path's) into h,
   which may be x's own memory (h == (uint16_t *)x, converted in place to its first half). */
PDP__PRIVATE void pdp__gemm_bf16_convert(pdp_bf16_path path, const float *x, uint16_t *h, int64_t n)
{
    path = pdp__bf16_resolve(path);
#if PDP__BF16_X86
    if (path != PDP_BF16_PATH_EMULATED && pdp_bf16_path_available(PDP_BF16_PATH_AVX512)) {
        pdp__bf16_convert_avx512(x, h, n);
        return;
    }
#endif
    pdp__bf16_convert_emul(x, h, n);
}
