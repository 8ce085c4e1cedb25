/* bench/bench.h: what the CPU benchmarks in bench/ share - clocks, the median of
   repeated measurements, the load average with a warning when the machine is
   loaded, the CHECK macro and the two training workloads.

   SHARED HEADER: bench/dp.c, bench/ddp.c and bench/gemm.c use it, and
   bench/train.c is to adopt it (its owner is converting it); change a helper's
   behaviour only with every user in mind. It is not part of pdp.h and not for
   examples/, which stay standalone copyable programs.

   Include it after pdp.h (with PDP_IMPLEMENTATION, so _POSIX_C_SOURCE is set for
   the clocks and sysconf). Everything is static inline: a bench that does not
   use a helper draws no unused-function warning. Methodology (see each bench's
   opening comment): peers are measured in the same run, interleaved round by
   round, and a figure is the median over rounds, so that a noisy neighbour on
   a shared machine hits every peer alike; the load average says how noisy. */

#ifndef PDP_BENCH_H
#define PDP_BENCH_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Exits with the status and pdp's message when a pdp call fails. */
#define CHECK(call)                                                                         \
    do {                                                                                    \
        pdp_status st_ = (call);                                                            \
        if (st_ != PDP_OK) {                                                                \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, pdp_status_name(st_),    \
                    pdp_last_error());                                                      \
            exit(1);                                                                        \
        }                                                                                   \
    } while (0)

/* ---- bench: clocks ---- */

static inline double bench_clock(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Wall seconds, monotonic. */
static inline double bench_now(void) { return bench_clock(CLOCK_MONOTONIC); }
/* CPU seconds of the calling thread. */
static inline double bench_thread_cpu(void) { return bench_clock(CLOCK_THREAD_CPUTIME_ID); }
/* CPU seconds of the whole process (every thread). */
static inline double bench_process_cpu(void) { return bench_clock(CLOCK_PROCESS_CPUTIME_ID); }

/* ---- bench: statistics ---- */

static inline int bench_cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* Median of v[0, n) (n >= 1); sorts v in place. Even n: the mean of the middle two. */
static inline double bench_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* ---- bench: load average ---- */

/* The 1-, 5- and 15-minute load averages from /proc/loadavg; false when unknown. */
static inline bool bench_loadavg(double load[3])
{
    FILE *f = fopen("/proc/loadavg", "r");
    bool ok = f && fscanf(f, "%lf %lf %lf", &load[0], &load[1], &load[2]) == 3;
    if (f) fclose(f);
    return ok;
}

/* Prints "load average at the <when>: ..." and, when the 1-minute figure is above
   half a core per core plus `own` (the cores this benchmark itself kept busy in the
   last minute, which the figure at the end includes), a WARNING line: other work
   shares the cores, so wall-clock figures are unreliable. Returns 1 when it warned. */
/* `own` for the figure at the end of a benchmark whose configurations alternate one
   and two busy threads (or ranks): the cores it kept busy on average. */
#define BENCH_OWN_LOAD_1_2 1.5

static inline int bench_print_load(const char *when, double own)
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    double load[3], limit;
    if (!bench_loadavg(load)) {
        printf("load average at the %s: unknown (no /proc/loadavg)\n", when);
        return 0;
    }
    printf("load average at the %s: %.2f %.2f %.2f (%ld cores)\n", when, load[0], load[1],
           load[2], cores);
    limit = 0.5 * (double)cores + own;
    if (cores > 0 && load[0] > limit) {
        printf("WARNING: load %.2f is above %.1f (half a core per core%s): other work shares "
               "the cores and wall-clock figures are unreliable\n", load[0], limit,
               own > 0 ? ", plus this benchmark's own" : "");
        return 1;
    }
    return 0;
}

/* ---- bench: the core's peak ----
   bench_peak_gflops(BENCH_PEAK_FP32): one core's fp32 FMA peak in GFLOP/s, measured
   with 12 independent chains of AVX-512 FMAs (16 lanes x 2 flops; 12 chains cover the
   latency times the pipes of current cores), or of AVX2 FMAs on a CPU without AVX-512.
   BENCH_PEAK_BF16_DOT: the same with AVX512-BF16's vdpbf16ps (16 lanes x 2 products x
   2 flops), the instruction pdp_gemm_bf16's avx512 path runs on. The best of 7 runs of
   about 40 ms on the calling thread (a peak: a neighbour can only lower a run); 0 when the CPU lacks the instructions (or the
   build is not x86-64 gcc/clang). The benches divide what a step or a GEMM reached by
   this figure times its threads: "the fraction of the measured peak".
   BENCH_PEAK_AMX_BF16: AMX's tdpbf16ps on tiles that never leave the registers: six
   16 x 16 fp32 accumulators (tmm0-5), each step tmm_i += tmm6 tmm7 (16 rows x 32 bf16
   of A, 16 pairs x 16 columns of B: 16 x 16 x 32 products, 16384 flops), six independent
   chains against the instruction's latency. Only where CPUID has AMX-TILE and AMX-BF16,
   XCR0 enables the tile state and Linux grants it (arch_prctl ARCH_REQ_XCOMP_PERM, as
   src/gemm_bf16.c asks); else 0. */
enum { BENCH_PEAK_FP32 = 0, BENCH_PEAK_BF16_DOT = 1, BENCH_PEAK_AMX_BF16 = 2 };

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#  include <cpuid.h>
#  include <immintrin.h>
#  define BENCH_PEAK_CHAINS(T, INIT, OP)                                                    \
    T a0 = INIT(1), a1 = INIT(2), a2 = INIT(3), a3 = INIT(4), a4 = INIT(5), a5 = INIT(6),    \
      a6 = INIT(7), a7 = INIT(8), a8 = INIT(9), a9 = INIT(10), a10 = INIT(11),              \
      a11 = INIT(12); /* distinct, or the compiler merges the chains */                    \
    for (i = 0; i < iters; i++) {                                                           \
        a0 = OP(a0); a1 = OP(a1); a2 = OP(a2); a3 = OP(a3); a4 = OP(a4); a5 = OP(a5);       \
        a6 = OP(a6); a7 = OP(a7); a8 = OP(a8); a9 = OP(a9); a10 = OP(a10); a11 = OP(a11);   \
    }
#  define BENCH_SET512(k) _mm512_set1_ps((float)(k))
#  define BENCH_SET256(k) _mm256_set1_ps((float)(k))
/* The chains' sum, so that none of them is dead code. */
__attribute__((target("avx512f"))) static inline float bench_peak_sum512(
    __m512 a0, __m512 a1, __m512 a2, __m512 a3, __m512 a4, __m512 a5, __m512 a6, __m512 a7,
    __m512 a8, __m512 a9, __m512 a10, __m512 a11)
{
    __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                             _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));
    return _mm512_reduce_add_ps(
        _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11))));
}
__attribute__((target("avx512f"))) static inline float bench_peak_run_avx512(long iters)
{
    __m512 x = _mm512_set1_ps(0.999999f), y = _mm512_set1_ps(1e-7f);
    long i;
#  define BENCH_FMA512(a) _mm512_fmadd_ps(a, x, y)
    BENCH_PEAK_CHAINS(__m512, BENCH_SET512, BENCH_FMA512)
#  undef BENCH_FMA512
    return bench_peak_sum512(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11);
}
__attribute__((target("avx2,fma"))) static inline float bench_peak_run_avx2(long iters)
{
    __m256 x = _mm256_set1_ps(0.999999f), y = _mm256_set1_ps(1e-7f), s;
    float out[8];
    long i;
#  define BENCH_FMA256(a) _mm256_fmadd_ps(a, x, y)
    BENCH_PEAK_CHAINS(__m256, BENCH_SET256, BENCH_FMA256)
#  undef BENCH_FMA256
    s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                                    _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7))),
                      _mm256_add_ps(_mm256_add_ps(a8, a9), _mm256_add_ps(a10, a11)));
    _mm256_storeu_ps(out, s);
    return out[0];
}
__attribute__((target("avx512f,avx512bf16"))) static inline float bench_peak_run_bf16(long iters)
{
    __m512bh x = (__m512bh)_mm512_set1_epi32(0x3f7f3f7f), y = x; /* pairs of 0.996 */
    long i;
#  define BENCH_DOT(a) _mm512_dpbf16_ps(a, x, y)
    BENCH_PEAK_CHAINS(__m512, BENCH_SET512, BENCH_DOT)
#  undef BENCH_DOT
    return bench_peak_sum512(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11);
}
/* AMX: x86-64 Linux (the permission is an arch_prctl) and a compiler with the AMX
   intrinsics (gcc 11, clang 12), as src/gemm_bf16.c's PDP__BF16_AMX */
#  if defined(__x86_64__) && defined(__linux__) && \
      (__GNUC__ >= 11 || (defined(__clang__) && __clang_major__ >= 12))
/* AMX usable by this process: CPUID.7.0:EDX AMX-BF16 (bit 22) and AMX-TILE (24),
   XCR0's XTILECFG and XTILEDATA (bits 17, 18), and Linux's permission (the raw
   syscall 158, arch_prctl(ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18):
   syscall(2) is not declared under strict C99). */
static inline int bench_amx_usable(void)
{
    unsigned a, b, c, d, lo, hi;
    long ret;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return 0; /* OSXSAVE */
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 22)) || !(d & (1u << 24)))
        return 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    (void)hi;
    if ((lo & 0x60000u) != 0x60000u) return 0;
    __asm__ volatile("syscall" : "=a"(ret) : "0"(158L), "D"(0x1023L), "S"(18L)
                     : "rcx", "r11", "memory");
    return ret == 0;
}
__attribute__((target("amx-tile,amx-bf16"))) static inline float bench_peak_run_amx(long iters)
{
    struct { /* LDTILECFG's operand: palette 1, 8 tiles of 16 rows x 64 bytes */
        unsigned char palette, start_row, reserved[14];
        unsigned short colsb[16];
        unsigned char rows[16];
    } cfg;
    static unsigned short ones[16 * 32]; /* 1.0 in bf16: each step adds 32, exact in fp32 */
    float out[16 * 16];
    long i;
    int t;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (t = 0; t < 8; t++) cfg.colsb[t] = 64, cfg.rows[t] = 16;
    for (t = 0; t < 16 * 32; t++) ones[t] = 0x3f80;
    _tile_loadconfig(&cfg);
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3); _tile_zero(4); _tile_zero(5);
    _tile_loadd(6, ones, 64);
    _tile_loadd(7, ones, 64);
    for (i = 0; i < iters; i++) {
        _tile_dpbf16ps(0, 6, 7); _tile_dpbf16ps(1, 6, 7); _tile_dpbf16ps(2, 6, 7);
        _tile_dpbf16ps(3, 6, 7); _tile_dpbf16ps(4, 6, 7); _tile_dpbf16ps(5, 6, 7);
    }
    _tile_stored(5, out, 64);
    _tile_release();
    return out[0];
}
#  else
static inline int bench_amx_usable(void) { return 0; }
static inline float bench_peak_run_amx(long iters) { return (float)iters; }
#  endif
#  undef BENCH_PEAK_CHAINS
#  undef BENCH_SET512
#  undef BENCH_SET256

static inline double bench_peak_gflops(int kind)
{
    static volatile float sink;
    double best = 0.0, flops_per_iter, t;
    float (*run)(long);
    long iters = 1000000;
    int r;
    __builtin_cpu_init();
    if (kind == BENCH_PEAK_AMX_BF16) {
        if (!bench_amx_usable()) return 0.0;
        run = bench_peak_run_amx, flops_per_iter = 6.0 * 16 * 16 * 32 * 2, iters = 20000;
    } else if (kind == BENCH_PEAK_BF16_DOT) {
        if (!__builtin_cpu_supports("avx512bf16")) return 0.0;
        run = bench_peak_run_bf16, flops_per_iter = 12.0 * 64;
    } else if (__builtin_cpu_supports("avx512f")) {
        run = bench_peak_run_avx512, flops_per_iter = 12.0 * 32;
    } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        run = bench_peak_run_avx2, flops_per_iter = 12.0 * 16;
    } else {
        return 0.0;
    }
    t = bench_now();
    sink = run(iters); /* warm-up, and the length of 40 ms */
    iters = (long)((double)iters * 0.04 / (bench_now() - t)) + 1;
    for (r = 0; r < 7; r++) {
        double rate;
        t = bench_now();
        sink = run(iters);
        rate = flops_per_iter * (double)iters / (bench_now() - t) / 1e9;
        best = rate > best ? rate : best;
    }
    (void)sink;
    return best;
}
#else
static inline double bench_peak_gflops(int kind)
{
    (void)kind;
    return 0.0;
}
#endif

/* ---- bench: the CPU's name ---- */

/* The first "model name" of /proc/cpuinfo with its "cpu family" and "model" numbers
   into buf, for the output's heading: a figure means something only with the CPU that
   made it, and a virtual machine's model name can be as vague as "Intel(R) Xeon(R)
   Processor"; "unknown CPU" without /proc/cpuinfo. */
static inline const char *bench_cpu_name(char *buf, size_t size)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512], name[256] = "unknown CPU";
    int family = -1, model = -1;
    while (f && fgets(line, sizeof line, f)) {
        char *v = strchr(line, ':');
        if (!v) continue;
        if (!strncmp(line, "cpu family", 10) && family < 0) family = atoi(v + 1);
        else if (!strncmp(line, "model\t", 6) && model < 0) model = atoi(v + 1);
        else if (!strncmp(line, "model name", 10) && !strcmp(name, "unknown CPU")) {
            v += v[1] == ' ' ? 2 : 1;
            v[strcspn(v, "\n")] = '\0';
            snprintf(name, sizeof name, "%s", v);
        } else if (line[0] == '\n' && family >= 0) break; /* the first processor's block */
    }
    if (f) fclose(f);
    if (family >= 0 && model >= 0)
        snprintf(buf, size, "%s (family %d, model %d)", name, family, model);
    else
        snprintf(buf, size, "%s", name);
    return buf;
}

/* ---- bench: workloads ---- */

/* The benches' models, seed 1: the MLP 784-512-512-10 (ReLU), or the CNN on 1x28x28
   (Conv 16 k5 p2, ReLU, MaxPool 2, Conv 32 k5 p2, ReLU, MaxPool 2, Flatten, Linear 10). */
static inline pdp_model *bench_make_model(bool cnn)
{
    pdp_model_desc md;
    pdp_model *m;
    memset(&md, 0, sizeof md);
    md.seed = 1;
    md.input_shape[0] = cnn ? 1 : 784;
    md.input_shape[1] = cnn ? 28 : 0;
    md.input_shape[2] = cnn ? 28 : 0;
    CHECK(pdp_model_create(&m, &md));
    if (cnn) {
        CHECK(pdp_model_add_conv2d(m, 16, 5, 1, 2));
        CHECK(pdp_model_add_relu(m));
        CHECK(pdp_model_add_maxpool2d(m, 2, 0));
        CHECK(pdp_model_add_conv2d(m, 32, 5, 1, 2));
        CHECK(pdp_model_add_relu(m));
        CHECK(pdp_model_add_maxpool2d(m, 2, 0));
        CHECK(pdp_model_add_flatten(m));
        CHECK(pdp_model_add_linear(m, 10));
    } else {
        CHECK(pdp_model_add_linear(m, 512));
        CHECK(pdp_model_add_relu(m));
        CHECK(pdp_model_add_linear(m, 512));
        CHECK(pdp_model_add_relu(m));
        CHECK(pdp_model_add_linear(m, 10));
    }
    return m;
}

#endif /* PDP_BENCH_H */
