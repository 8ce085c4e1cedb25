/* bench/gemm.c: GFLOP/s of pdp_sgemm against OpenBLAS's cblas_sgemm, same run, same data.

   Shapes are written M x K x N as the issue does: C[M,N] = op(A)[M,K] * op(B)[K,N].
   NN is A*B, TN is A^T*B, NT is A*B^T (row-major, as pdp_sgemm takes them). The
   128-row shapes are the MLP's (batch 128, layers 784->512 and 512->512).
   Each figure is the median over 3 rounds (each shape once per round) of the median
   of 7 timed repetitions after 50 ms of warm-up; a repetition loops the call for
   about 25 ms. Per shape and thread count the two libraries run
   one after the other, each after a 200 ms pause: OpenBLAS's workers keep spinning
   for a while after each call and steal the second core from whatever runs next,
   so alternating them repetition by repetition measured the spinning, not ours.
   1 and 2 threads: pdp_set_num_threads for ours, openblas_set_num_threads for
   OpenBLAS. "of peak": ours as a fraction of the fp32 FMA peak measured at the start
   (bench.h's bench_peak_gflops: one core's, times the threads).

   Peers section (one thread, same run; `./build/bench_gemm bf16` prints it alone): per
   shape - the MLP 784-512-512-10's products at batch 512 in the three layouts a Linear
   uses (forward NT: x W^T, dW TN: dY^T X, dX NN: dY W; the 512 x 512 x 512 NN is also the
   square 512) and the squares 1024 and 2048 - two tables. fp32: pdp_sgemm, OpenBLAS, and PyTorch's torch.matmul and oneDNN inner
   product (bench/gemm_torch.py under /usr/bin/python3, one child per round, after ours).
   bf16: PyTorch's torch.matmul in bf16 (oneDNN on a CPU with AVX512-BF16 or AMX) twice:
   on tensors already in bf16, and from fp32 tensors converted to bf16 with the product
   (a.bfloat16(), as autocast casts a Linear's fp32 inputs; pdp_gemm_bf16 takes fp32 and
   converts as it packs, so this is its like-for-like peer), then
   pdp_gemm_bf16 (the path it chooses) and pdp_gemm_bf16_on on each path pdp names
   (the enum from PDP_BF16_PATH_EMULATED on while pdp_bf16_path_name knows it;
   "absent" where the CPU or build lacks it). Ratios against the peers, and fractions of
   the peaks (bench.h: fp32 FMA, vdpbf16ps, AMX tdpbf16ps on tiles that stay in
   registers; the best of a measurement at the start and one at the end). Each figure is the median over 3 rounds of
   measure_one's median (a path slower than a second per call is timed once, in the
   first round). The CPU is named (bench.h's bench_cpu_name). Ends with the MLP step's
   eight products summed at each side's speed: the GEMM time a step cannot go below.

   Operands start on a 64-byte boundary, as pdp's tensors and PyTorch's do (the MLP's
   case); PDP_BENCH_MISALIGN=16 starts them 16 bytes past one, where glibc's malloc put
   them before (a 64-byte load of a row then spans two cache lines: pdp_gemm_bf16 on the
   AMX path took 13-30% longer a call there on 512^3 NT and NN and 512 x 512 x 10 NT, one
   thread, one run each, on an Intel Xeon, Sapphire Rapids class; oneDNN's tensors stay
   aligned).

   make bench        (links OpenBLAS and defines PDP_BENCH_OPENBLAS when pkg-config
                      finds it; without it only our figures are printed)
   ./build/bench_gemm [quick|bf16]   quick: fewer shapes, one round, for a smoke run; bf16:
                                     only the peers section, all its shapes
   ./build/bench_gemm bf16 [auto] [M:K:N:OP ...]
                                     the peers section on these shapes only (at most 10);
                                     auto: pdp_gemm_bf16 alone, no column per path */

#define PDP_IMPLEMENTATION
#include "pdp.h"

#include "bench.h"

#ifdef PDP_BENCH_OPENBLAS
#  include <cblas.h>
#endif

#define REPS 7
#define ROUNDS 3

typedef struct shape {
    int64_t m, k, n;
    pdp_trans ta, tb;
} shape;

typedef struct problem {
    shape s;
    float *a, *b, *c;
    void *mem[3]; /* the allocations a, b and c lie in */
    int64_t lda, ldb;
} problem;

static void run_ours(const problem *p)
{
    pdp_sgemm(p->s.ta, p->s.tb, p->s.m, p->s.n, p->s.k, 1.0f, p->a, p->lda, p->b, p->ldb, 0.0f,
              p->c, p->s.n);
}

static void run_bf16(const problem *p)
{
    pdp_gemm_bf16(p->s.ta, p->s.tb, p->s.m, p->s.n, p->s.k, 1.0f, p->a, p->lda, p->b, p->ldb,
                  0.0f, p->c, p->s.n);
}

#ifdef PDP_BENCH_OPENBLAS
static void run_openblas(const problem *p)
{
    cblas_sgemm(CblasRowMajor, p->s.ta == PDP_TRANS ? CblasTrans : CblasNoTrans,
                p->s.tb == PDP_TRANS ? CblasTrans : CblasNoTrans, (int)p->s.m, (int)p->s.n,
                (int)p->s.k, 1.0f, p->a, (int)p->lda, p->b, (int)p->ldb, 0.0f, p->c, (int)p->s.n);
}
#endif

/* Calls per repetition so that one lasts about 25 ms, after about 50 ms of warm-up
   calls: the pool, scratch, caches, and the second core, whose first 2-thread
   figure (right after the pool starts) came out at 1-thread speed in two of three
   runs with a single warm-up call. */
static int calibrate(void (*fn)(const problem *), const problem *p)
{
    double t, t0 = bench_now();
    do fn(p); while (bench_now() - t0 < 0.05);
    t = bench_now();
    fn(p);
    t = bench_now() - t;
    return t < 0.025 ? (int)(0.025 / (t > 1e-6 ? t : 1e-6)) + 1 : 1;
}

static double time_reps(void (*fn)(const problem *), const problem *p, int iters)
{
    double t = bench_now();
    int i;
    for (i = 0; i < iters; i++) fn(p);
    return (bench_now() - t) / iters;
}

/* Median GFLOP/s of ours (rate[0]) and, when built with it, OpenBLAS (rate[1]) over
   REPS repetitions each. The libraries run in separate blocks, each after a pause:
   OpenBLAS's workers keep spinning a while after a call, and ours would lose the
   second core to them if the two alternated rep by rep. */
static void measure(const problem *p, double rate[2])
{
    double flops = 2.0 * (double)p->s.m * (double)p->s.n * (double)p->s.k;
    double r[REPS];
    struct timespec park = {0, 200000000};
    void (*fn[2])(const problem *) = {run_ours, NULL};
    int rep, lib, libs = 1, iters;
#ifdef PDP_BENCH_OPENBLAS
    fn[1] = run_openblas;
    libs = 2;
#endif
    for (lib = 0; lib < 2; lib++) {
        rate[lib] = 0.0;
        if (lib >= libs) continue;
        nanosleep(&park, NULL);
        iters = calibrate(fn[lib], p);
        for (rep = 0; rep < REPS; rep++) r[rep] = flops / time_reps(fn[lib], p, iters) * 1e-9;
        rate[lib] = bench_median(r, REPS);
    }
}

/* Median GFLOP/s of fn over REPS repetitions, after a pause. */
static double measure_one(void (*fn)(const problem *), const problem *p)
{
    double flops = 2.0 * (double)p->s.m * (double)p->s.n * (double)p->s.k;
    double r[REPS];
    struct timespec park = {0, 200000000};
    int rep, iters;
    nanosleep(&park, NULL);
    iters = calibrate(fn, p);
    for (rep = 0; rep < REPS; rep++) r[rep] = flops / time_reps(fn, p, iters) * 1e-9;
    return bench_median(r, REPS);
}

/* count floats at a 64-byte boundary, as pdp's tensors and PyTorch's are (the MLP's
   operands), plus PDP_BENCH_MISALIGN bytes when set (16: where glibc's malloc puts a
   large block, each 64-byte load of a row then spans two cache lines); *mem: the
   allocation to free; NULL when out of memory. */
static float *operand(void **mem, size_t count)
{
    const char *env = getenv("PDP_BENCH_MISALIGN");
    size_t off = env ? (size_t)atoi(env) / 4 * 4 % 64 : 0;
    if (posix_memalign(mem, 64, sizeof(float) * count + 64)) return *mem = NULL;
    return (float *)(void *)((char *)*mem + off);
}

/* Operands of p->s filled with the same values as the fp32 section; 0 when out of memory. */
static int problem_alloc(problem *p)
{
    int64_t arows = p->s.ta == PDP_NO_TRANS ? p->s.m : p->s.k;
    int64_t brows = p->s.tb == PDP_NO_TRANS ? p->s.k : p->s.n;
    size_t j;
    p->lda = p->s.ta == PDP_NO_TRANS ? p->s.k : p->s.m;
    p->ldb = p->s.tb == PDP_NO_TRANS ? p->s.n : p->s.k;
    p->a = operand(&p->mem[0], (size_t)(arows * p->lda));
    p->b = operand(&p->mem[1], (size_t)(brows * p->ldb));
    p->c = operand(&p->mem[2], (size_t)(p->s.m * p->s.n));
    if (!p->a || !p->b || !p->c) return 0;
    for (j = 0; j < (size_t)(arows * p->lda); j++) p->a[j] = (float)((j * 7 + 3) % 13) * 0.1f - 0.6f;
    for (j = 0; j < (size_t)(brows * p->ldb); j++) p->b[j] = (float)((j * 5 + 1) % 11) * 0.1f - 0.5f;
    return 1;
}

static const char *layout(const shape *s);

/* ---- bench: the peers section (top comment) ---- */

#define PEER_SHAPES 10
#define PEER_PATHS 8 /* room for paths pdp_bf16_path_name will learn to name */
#define PEAK_MAX(a, b) ((a) > (b) ? (a) : (b))

/* pdp_gemm_bf16_on on one path (peer_path), the hook measure_one calls. */
static pdp_bf16_path peer_path;
static void run_bf16_on(const problem *p)
{
    (void)pdp_gemm_bf16_on(peer_path, p->s.ta, p->s.tb, p->s.m, p->s.n, p->s.k, 1.0f, p->a,
                           p->lda, p->b, p->ldb, 0.0f, p->c, p->s.n);
}

/* GFLOP/s of fn on p: measure_one, except that a call of over a second (the emulated
   path on the large squares) is timed once, not calibrated and repeated. */
static double measure_capped(void (*fn)(const problem *), const problem *p)
{
    double flops = 2.0 * (double)p->s.m * (double)p->s.n * (double)p->s.k;
    double t = bench_now();
    fn(p);
    t = bench_now() - t;
    return t > 1.0 ? flops / t * 1e-9 : measure_one(fn, p);
}

/* PyTorch's figures for every shape, one child process (bench/gemm_torch.py under
   /usr/bin/python3, one thread): torch[i][0..3] = matmul fp32, oneDNN fp32, matmul bf16
   on bf16 tensors, matmul bf16 from fp32 tensors (the conversions timed with it); 0 when
   torch is absent or the child failed. */
static int torch_peer(const shape *sh, int count, double torch[][4])
{
    char cmd[2048], line[256], key[64];
    const char *script = access("bench/gemm_torch.py", R_OK) == 0 ? "bench/gemm_torch.py"
                                                                   : "../bench/gemm_torch.py";
    size_t used;
    double r[4];
    FILE *f;
    int i, got = 0;
    memset(torch, 0, sizeof(double) * 4 * (size_t)count);
    used = (size_t)snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s --threads 1 --reps 5 "
                            "--rep-s 0.08", script);
    for (i = 0; i < count && used < sizeof cmd; i++)
        used += (size_t)snprintf(cmd + used, sizeof cmd - used, " %d:%d:%d:%s", (int)sh[i].m,
                                 (int)sh[i].k, (int)sh[i].n, layout(&sh[i]));
    if (!(f = popen(cmd, "r"))) return 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "%63s %lf %lf %lf %lf", key, &r[0], &r[1], &r[2], &r[3]) == 5)
            for (i = 0; i < count; i++) {
                char want[64];
                snprintf(want, sizeof want, "%d:%d:%d:%s", (int)sh[i].m, (int)sh[i].k,
                         (int)sh[i].n, layout(&sh[i]));
                if (strcmp(want, key)) continue;
                memcpy(torch[i], r, sizeof r);
                got++;
            }
    return pclose(f) == 0 && got == count;
}

/* The peak a bf16 path runs against: AMX's tdpbf16ps, vdpbf16ps, or the fp32 FMA the
   emulation runs on; 0 for a path this bench does not know. */
static double path_peak(pdp_bf16_path path, double fp32, double dot, double amx)
{
    return path == PDP_BF16_PATH_AMX        ? amx
           : path == PDP_BF16_PATH_AVX512   ? dot
           : path == PDP_BF16_PATH_EMULATED ? fp32 : 0.0;
}

static const char *pct(char *buf, double x, double peak)
{
    if (peak > 0 && x > 0) snprintf(buf, 8, "%4.0f%%", 100.0 * x / peak);
    else snprintf(buf, 8, "%5s", "-");
    return buf;
}

/* The peers section: quick, the first two shapes and one round; sel, when not NULL, the
   shapes to run instead of the table (nsel of them, at most PEER_SHAPES); paths == 0
   leaves out the per-path columns. */
static void bench_peers(int quick, const shape *sel, int nsel, int paths)
{
    static const shape table[PEER_SHAPES] = {
        {512, 784, 512, PDP_NO_TRANS, PDP_TRANS},    {512, 512, 512, PDP_NO_TRANS, PDP_TRANS},
        {512, 512, 10, PDP_NO_TRANS, PDP_TRANS},     {512, 512, 784, PDP_TRANS, PDP_NO_TRANS},
        {512, 512, 512, PDP_TRANS, PDP_NO_TRANS},    {10, 512, 512, PDP_TRANS, PDP_NO_TRANS},
        {512, 10, 512, PDP_NO_TRANS, PDP_NO_TRANS},  {512, 512, 512, PDP_NO_TRANS, PDP_NO_TRANS},
        {1024, 1024, 1024, PDP_NO_TRANS, PDP_NO_TRANS},
        {2048, 2048, 2048, PDP_NO_TRANS, PDP_NO_TRANS},
    };
    const shape *sh = sel ? sel : table;
    enum { MLP_SHAPES = 8 };
    /* [shape][round]: pdp fp32, OpenBLAS, torch matmul fp32, oneDNN fp32, oneDNN bf16 on
       bf16 tensors, oneDNN bf16 from fp32 tensors, pdp_gemm_bf16 (auto), then one per path */
    enum { C_PDP, C_OB, C_TM, C_DNN, C_DNN16, C_DNNCV, C_AUTO, C_PATH,
           NCOL = C_PATH + PEER_PATHS };
    static double v[PEER_SHAPES][NCOL][ROUNDS];
    double med[PEER_SHAPES][NCOL], torch[PEER_SHAPES][4], sum[NCOL];
    double peak32 = bench_peak_gflops(BENCH_PEAK_FP32), peakdot = bench_peak_gflops(BENCH_PEAK_BF16_DOT);
    double peakamx = bench_peak_gflops(BENCH_PEAK_AMX_BF16);
    pdp_bf16_path best = pdp_bf16_best_path();
    int count = sel ? nsel : quick ? 2 : PEER_SHAPES, rounds = quick ? 1 : ROUNDS, npath = 0;
    int have_torch = system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") == 0;
    int torch_failed = 0;
    int i, c, r, q;
    char cpu[320], b1[8], b2[8], name[32];
    problem p[PEER_SHAPES];

    /* the paths pdp names: the enum from EMULATED on, while pdp_bf16_path_name knows it */
    while (paths && npath < PEER_PATHS &&
           strcmp(pdp_bf16_path_name((pdp_bf16_path)(PDP_BF16_PATH_EMULATED + npath)),
                  "unknown") != 0)
        npath++;
    memset(v, 0, sizeof v);
    for (i = 0; i < count; i++) {
        p[i].s = sh[i];
        if (!problem_alloc(&p[i])) {
            fprintf(stderr, "bench_gemm: out of memory\n");
            exit(1);
        }
    }
    pdp_set_num_threads(1);
#ifdef PDP_BENCH_OPENBLAS
    openblas_set_num_threads(1);
#endif
    printf("\n== pdp beside OpenBLAS and PyTorch (oneDNN), one thread, on %s ==\n",
           bench_cpu_name(cpu, sizeof cpu));
    printf("GFLOP/s, the median over %d round%s; shapes M x K x N; the MLP 784-512-512-10 at "
           "batch 512: forward NT (x W^T), dW TN (dY^T X), dX NN (dY W)\n", rounds,
           rounds > 1 ? "s" : "");
    fflush(stdout);
    for (r = 0; r < rounds; r++) {
        for (i = 0; i < count; i++) {
            v[i][C_PDP][r] = measure_one(run_ours, &p[i]);
#ifdef PDP_BENCH_OPENBLAS
            v[i][C_OB][r] = measure_one(run_openblas, &p[i]);
#endif
            v[i][C_AUTO][r] = measure_one(run_bf16, &p[i]);
            for (q = 0; q < npath; q++) {
                peer_path = (pdp_bf16_path)(PDP_BF16_PATH_EMULATED + q);
                if (!pdp_bf16_path_available(peer_path)) continue;
                /* a path slower than a second a call: its first round's figure stands */
                if (r > 0 && 2.0 * (double)sh[i].m * (double)sh[i].n * (double)sh[i].k /
                                     (v[i][C_PATH + q][0] * 1e9) > 1.0) {
                    v[i][C_PATH + q][r] = v[i][C_PATH + q][0];
                    continue;
                }
                v[i][C_PATH + q][r] = measure_capped(run_bf16_on, &p[i]);
            }
        }
        if (have_torch && !torch_peer(sh, count, torch)) have_torch = 0, torch_failed = 1;
        for (i = 0; have_torch && i < count; i++) {
            v[i][C_TM][r] = torch[i][0];
            v[i][C_DNN][r] = torch[i][1] > 0 ? torch[i][1] : 0.0;
            v[i][C_DNN16][r] = torch[i][2];
            v[i][C_DNNCV][r] = torch[i][3];
        }
        fprintf(stderr, "  peers: round %d of %d done\n", r + 1, rounds);
    }
    /* the peaks again, kept at their best: a loaded machine lowers every run of one
       measurement, which would inflate the fractions */
    peak32 = PEAK_MAX(peak32, bench_peak_gflops(BENCH_PEAK_FP32));
    peakdot = PEAK_MAX(peakdot, bench_peak_gflops(BENCH_PEAK_BF16_DOT));
    peakamx = PEAK_MAX(peakamx, bench_peak_gflops(BENCH_PEAK_AMX_BF16));
    pdp_shutdown_threads();
    memset(sum, 0, sizeof sum);
    for (i = 0; i < count; i++)
        for (c = 0; c < NCOL; c++) {
            med[i][c] = bench_median(v[i][c], rounds);
            if (i < MLP_SHAPES && med[i][c] > 0)
                sum[c] += 2.0 * (double)sh[i].m * (double)sh[i].n * (double)sh[i].k /
                          (med[i][c] * 1e9);
        }

    printf("peaks measured on one core (the best of the start's and the end's): fp32 FMA %.0f "
           "GFLOP/s, AVX512-BF16 vdpbf16ps %.0f, AMX tdpbf16ps %.0f (0: the CPU or OS lacks "
           "it)\n", peak32, peakdot, peakamx);
    printf("\nfp32: pdp_sgemm | OpenBLAS cblas_sgemm | torch.matmul (this torch's BLAS) | "
           "oneDNN inner product (torch mkldnn_linear)\n");
    printf("%-14s %-2s | %7s %8s %7s %7s | %8s %8s | %5s\n", "shape", "op", "pdp", "OpenBLAS",
           "matmul", "oneDNN", "pdp/OB", "pdp/oDNN", "%FMA");
    for (i = 0; i < count; i++) {
        snprintf(name, sizeof name, "%dx%dx%d", (int)sh[i].m, (int)sh[i].k, (int)sh[i].n);
        printf("%-14s %-2s | %7.1f %8.1f %7.1f %7.1f | %8.2f %8.2f | %s\n", name, layout(&sh[i]),
               med[i][C_PDP], med[i][C_OB], med[i][C_TM], med[i][C_DNN],
               med[i][C_OB] > 0 ? med[i][C_PDP] / med[i][C_OB] : 0.0,
               med[i][C_DNN] > 0 ? med[i][C_PDP] / med[i][C_DNN] : 0.0,
               pct(b1, med[i][C_PDP], peak32));
    }
    printf("pdp/OB: pdp / OpenBLAS; pdp/oDNN: pdp / oneDNN fp32; %%FMA: pdp / the fp32 FMA "
           "peak\n");
    printf("\nbf16 (inputs rounded to bf16, fp32 sums): oneDNN (torch.matmul in bf16) on two "
           "inputs - oD(bf16): tensors already in bf16 (half the bytes read, nothing "
           "converted); oD(fp32): fp32 tensors, a.bfloat16() and b.bfloat16() timed with the "
           "product (autocast's Linear on fp32 inputs) | pdp_gemm_bf16 (auto: %s; takes fp32 "
           "and converts as it packs, as oD(fp32) does) | pdp_gemm_bf16_on each path\n",
           pdp_bf16_path_name(best));
    printf("%-14s %-2s | %8s %8s | %7s", "shape", "op", "oD(bf16)", "oD(fp32)", "pdp");
    for (q = 0; q < npath; q++)
        printf(" %11.11s", pdp_bf16_path_name((pdp_bf16_path)(PDP_BF16_PATH_EMULATED + q)));
    printf(" | %12s %12s %6s %6s | %8s\n", "pdp/oD(bf16)", "pdp/oD(fp32)", "pdp%pk", "oDNN%A",
           "pdp16/32");
    for (i = 0; i < count; i++) {
        double auto_peak = path_peak(best, peak32, peakdot, peakamx);
        snprintf(name, sizeof name, "%dx%dx%d", (int)sh[i].m, (int)sh[i].k, (int)sh[i].n);
        printf("%-14s %-2s | %8.1f %8.1f | %7.1f", name, layout(&sh[i]), med[i][C_DNN16],
               med[i][C_DNNCV], med[i][C_AUTO]);
        for (q = 0; q < npath; q++) {
            if (med[i][C_PATH + q] > 0) printf(" %11.1f", med[i][C_PATH + q]);
            else printf(" %11s", "absent");
        }
        printf(" | %12.2f %12.2f %6s %6s | %8.2f\n",
               med[i][C_DNN16] > 0 ? med[i][C_AUTO] / med[i][C_DNN16] : 0.0,
               med[i][C_DNNCV] > 0 ? med[i][C_AUTO] / med[i][C_DNNCV] : 0.0,
               pct(b1, med[i][C_AUTO], auto_peak), pct(b2, med[i][C_DNN16], peakamx),
               med[i][C_AUTO] / med[i][C_PDP]);
    }
    printf("pdp/oD(bf16): pdp_gemm_bf16 / oneDNN on bf16 tensors (the issue's target: >= 1.0 "
           "on the MLP's shapes, one thread; oneDNN converts nothing there, pdp converts its "
           "fp32 operands); pdp/oD(fp32): pdp_gemm_bf16 / oneDNN with the conversions, both "
           "sides starting from fp32; pdp%%pk: pdp_gemm_bf16 / the peak of the path it took "
           "(AMX tdpbf16ps, vdpbf16ps, or the fp32 FMA for the emulation); oDNN%%A: oD(bf16) "
           "/ the AMX peak; pdp16/32: pdp_gemm_bf16 / pdp_sgemm\n");
    if (!sel && count >= MLP_SHAPES)
        printf("the MLP step's eight products, batch 512, at these speeds: pdp fp32 %.2f ms, "
               "pdp bf16 %.2f ms, oneDNN bf16 on bf16 tensors %.2f ms, from fp32 tensors "
               "%.2f ms, oneDNN fp32 %.2f ms\n", 1e3 * sum[C_PDP], 1e3 * sum[C_AUTO],
               have_torch ? 1e3 * sum[C_DNN16] : 0.0, have_torch ? 1e3 * sum[C_DNNCV] : 0.0,
               have_torch ? 1e3 * sum[C_DNN] : 0.0);
    if (torch_failed)
        printf("PyTorch: /usr/bin/python3 bench/gemm_torch.py failed: its columns are 0\n");
    else if (!have_torch)
        printf("PyTorch: skipped, /usr/bin/python3 cannot import torch (apt-get install "
               "python3-torch): its columns are 0\n");
#ifndef PDP_BENCH_OPENBLAS
    printf("OpenBLAS: absent from this build (its column is 0)\n");
#endif
    for (i = 0; i < count; i++) {
        free(p[i].mem[0]);
        free(p[i].mem[1]);
        free(p[i].mem[2]);
    }
}

static const char *layout(const shape *s)
{
    static const char *names[2][2] = {{"NN", "NT"}, {"TN", "TT"}};
    return names[s->ta][s->tb];
}

int main(int argc, char **argv)
{
    static const shape all[] = {
        {128, 784, 512, PDP_NO_TRANS, PDP_TRANS},    {128, 784, 512, PDP_TRANS, PDP_NO_TRANS},
        {128, 784, 512, PDP_NO_TRANS, PDP_NO_TRANS}, {128, 512, 512, PDP_NO_TRANS, PDP_TRANS},
        {128, 512, 512, PDP_TRANS, PDP_NO_TRANS},    {128, 512, 512, PDP_NO_TRANS, PDP_NO_TRANS},
        {512, 512, 512, PDP_NO_TRANS, PDP_NO_TRANS}, {512, 512, 512, PDP_TRANS, PDP_NO_TRANS},
        {512, 512, 512, PDP_NO_TRANS, PDP_TRANS},    {1024, 1024, 1024, PDP_NO_TRANS, PDP_NO_TRANS},
        {1024, 1024, 1024, PDP_TRANS, PDP_NO_TRANS}, {1024, 1024, 1024, PDP_NO_TRANS, PDP_TRANS},
    };
    int quick = argc > 1 && strcmp(argv[1], "quick") == 0;
    int bf16_only = argc > 1 && strcmp(argv[1], "bf16") == 0;
    size_t count = quick ? 2 : sizeof all / sizeof all[0], i;
    int rounds = quick ? 1 : ROUNDS, r, t;
    problem problems[sizeof all / sizeof all[0]];
    double rates[sizeof all / sizeof all[0]][2][2][ROUNDS]; /* shape, threads - 1, lib, round */
    double start = bench_now();
    const char *coretype = getenv("OPENBLAS_CORETYPE");
    double peak;

    if (bf16_only) {
        shape sel[PEER_SHAPES];
        int nsel = 0, paths = 1, a;
        for (a = 2; a < argc; a++) {
            int m, k, n;
            char op[3];
            shape *s = &sel[nsel];
            if (strcmp(argv[a], "auto") == 0) {
                paths = 0;
                continue;
            }
            if (nsel == PEER_SHAPES || sscanf(argv[a], "%d:%d:%d:%2[NT]", &m, &k, &n, op) != 4 ||
                m <= 0 || k <= 0 || n <= 0 || strlen(op) != 2) {
                fprintf(stderr, "bench_gemm: bad shape '%s' (M:K:N:OP, OP one of NN NT TN TT; "
                        "at most %d)\n", argv[a], PEER_SHAPES);
                return 1;
            }
            s->m = m, s->k = k, s->n = n;
            s->ta = op[0] == 'T' ? PDP_TRANS : PDP_NO_TRANS;
            s->tb = op[1] == 'T' ? PDP_TRANS : PDP_NO_TRANS;
            nsel++;
        }
        bench_peers(0, nsel ? sel : NULL, nsel, paths);
        bench_print_load("end", 1.0); /* one busy thread */
        pdp_shutdown_threads();
        return 0;
    }
    peak = bench_peak_gflops(BENCH_PEAK_FP32);

    printf("pdp_sgemm %s, kernel %s; shapes M x K x N; GFLOP/s, the median over %d round%s of "
           "the median of %d\n", pdp_version_string(), PDP__GEMM_KERNEL, rounds,
           rounds > 1 ? "s" : "", REPS);
    printf("fp32 FMA peak measured: %.1f GFLOP/s per core\n", peak);
#ifdef PDP_BENCH_OPENBLAS
    printf("OpenBLAS: %s (core %s), OPENBLAS_CORETYPE=%s\n", openblas_get_config(),
           openblas_get_corename(), coretype ? coretype : "(unset)");
    printf("%-16s %-3s | %8s %8s %6s %5s | %8s %8s %6s %5s | %7s\n", "shape", "op", "ours 1t",
           "oblas 1t", "ratio", "peak", "ours 2t", "oblas 2t", "ratio", "peak", "ours x");
#else
    (void)coretype;
    printf("OpenBLAS: absent (build with it installed for the comparison)\n");
    printf("%-16s %-3s | %8s %5s | %8s %5s | %7s\n", "shape", "op", "ours 1t", "peak", "ours 2t",
           "peak", "ours x");
#endif
    /* every shape once per round, the table from the medians over the rounds: the
       host's noise (a second core taken away for a few seconds) hits one round of a
       shape, not its figure */
    for (i = 0; i < count; i++) {
        problems[i].s = all[i];
        if (!problem_alloc(&problems[i])) {
            fprintf(stderr, "bench_gemm: out of memory\n");
            return 1;
        }
    }
    for (r = 0; r < rounds; r++)
        for (i = 0; i < count; i++)
            for (t = 0; t < 2; t++) {
                double rate[2];
                pdp_set_num_threads(t + 1);
#ifdef PDP_BENCH_OPENBLAS
                openblas_set_num_threads(t + 1);
#endif
                measure(&problems[i], rate);
                rates[i][t][0][r] = rate[0];
                rates[i][t][1][r] = rate[1];
            }
    for (i = 0; i < count; i++) {
        const problem *p = &problems[i];
        double ours[2], ob[2];
        int t;
        char name[32];
        for (t = 0; t < 2; t++) {
            ours[t] = bench_median(rates[i][t][0], rounds);
            ob[t] = bench_median(rates[i][t][1], rounds);
        }
        snprintf(name, sizeof name, "%dx%dx%d", (int)p->s.m, (int)p->s.k, (int)p->s.n);
#ifdef PDP_BENCH_OPENBLAS
        printf("%-16s %-3s | %8.1f %8.1f %6.2f %4.0f%% | %8.1f %8.1f %6.2f %4.0f%% | %7.2f\n", name,
               layout(&p->s), ours[0], ob[0], ours[0] / ob[0], 100.0 * ours[0] / peak, ours[1],
               ob[1], ours[1] / ob[1], 50.0 * ours[1] / peak, ours[1] / ours[0]);
#else
        (void)ob;
        printf("%-16s %-3s | %8.1f %4.0f%% | %8.1f %4.0f%% | %7.2f\n", name, layout(&p->s),
               ours[0], 100.0 * ours[0] / peak, ours[1], 50.0 * ours[1] / peak,
               ours[1] / ours[0]);
#endif
        free(problems[i].mem[0]);
        free(problems[i].mem[1]);
        free(problems[i].mem[2]);
    }
    printf("ratio: ours / OpenBLAS at the same thread count; peak: ours / (threads x the measured "
           "peak); ours x: our 2-thread speed-up. %.0f s\n", bench_now() - start);
    bench_peers(quick, NULL, 0, 1);
    bench_print_load("end", BENCH_OWN_LOAD_1_2);
    pdp_shutdown_threads();
    return 0;
}
