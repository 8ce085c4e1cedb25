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

   bf16 section: pdp_gemm_bf16 (its best path) on the MLP's products at batch 512
   (784-512-512-10) in the layouts its Linear layers use: forward NT (x W^T), dW TN
   (dy^T x), dX NN (dy W); one thread, beside pdp_sgemm on the same shape, each as a
   fraction of its own measured peak (vdpbf16ps, fp32 FMA).

   make bench        (links OpenBLAS and defines PDP_BENCH_OPENBLAS when pkg-config
                      finds it; without it only our figures are printed)
   ./build/bench_gemm [quick|bf16]   quick: fewer shapes, for a smoke run; bf16: only the
                                     bf16 section, all its shapes */

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

/* Operands of p->s filled with the same values as the fp32 section; 0 when out of memory. */
static int problem_alloc(problem *p)
{
    int64_t arows = p->s.ta == PDP_NO_TRANS ? p->s.m : p->s.k;
    int64_t brows = p->s.tb == PDP_NO_TRANS ? p->s.k : p->s.n;
    size_t j;
    p->lda = p->s.ta == PDP_NO_TRANS ? p->s.k : p->s.m;
    p->ldb = p->s.tb == PDP_NO_TRANS ? p->s.n : p->s.k;
    p->a = (float *)malloc(sizeof(float) * (size_t)(arows * p->lda));
    p->b = (float *)malloc(sizeof(float) * (size_t)(brows * p->ldb));
    p->c = (float *)malloc(sizeof(float) * (size_t)(p->s.m * p->s.n));
    if (!p->a || !p->b || !p->c) return 0;
    for (j = 0; j < (size_t)(arows * p->lda); j++) p->a[j] = (float)((j * 7 + 3) % 13) * 0.1f - 0.6f;
    for (j = 0; j < (size_t)(brows * p->ldb); j++) p->b[j] = (float)((j * 5 + 1) % 11) * 0.1f - 0.5f;
    return 1;
}

static const char *layout(const shape *s);

/* The bf16 section (top comment); quick: the two largest products only. */
static void bench_bf16(int quick)
{
    static const shape mlp[] = {
        {512, 784, 512, PDP_NO_TRANS, PDP_TRANS},    {512, 512, 512, PDP_NO_TRANS, PDP_TRANS},
        {512, 512, 10, PDP_NO_TRANS, PDP_TRANS},     {512, 512, 784, PDP_TRANS, PDP_NO_TRANS},
        {512, 512, 512, PDP_TRANS, PDP_NO_TRANS},    {10, 512, 512, PDP_TRANS, PDP_NO_TRANS},
        {512, 10, 512, PDP_NO_TRANS, PDP_NO_TRANS},  {512, 512, 512, PDP_NO_TRANS, PDP_NO_TRANS},
    };
    double peak16 = bench_peak_gflops(BENCH_PEAK_BF16_DOT), peak32 = bench_peak_gflops(BENCH_PEAK_FP32);
    double t16 = 0.0, t32 = 0.0;
    size_t i, count = quick ? 2 : sizeof mlp / sizeof mlp[0];
    printf("\npdp_gemm_bf16, path %s, 1 thread: the MLP 784-512-512-10's products at batch 512\n",
           pdp_bf16_path_name(pdp_bf16_best_path()));
    printf("vdpbf16ps peak measured: %.1f GFLOP/s per core; fp32 FMA peak %.1f\n", peak16, peak32);
    printf("%-16s %-3s | %8s %5s | %8s %5s | %6s\n", "shape", "op", "bf16", "peak", "fp32", "peak",
           "bf16 x");
    pdp_set_num_threads(1);
    for (i = 0; i < count; i++) {
        problem p;
        double r16, r32, flops;
        char name[32];
        p.s = mlp[i];
        if (!problem_alloc(&p)) {
            fprintf(stderr, "bench_gemm: out of memory\n");
            exit(1);
        }
        flops = 2.0 * (double)p.s.m * (double)p.s.n * (double)p.s.k;
        r16 = measure_one(run_bf16, &p);
        r32 = measure_one(run_ours, &p);
        t16 += flops / (r16 * 1e9);
        t32 += flops / (r32 * 1e9);
        snprintf(name, sizeof name, "%dx%dx%d", (int)p.s.m, (int)p.s.k, (int)p.s.n);
        printf("%-16s %-3s | %8.1f %4.0f%% | %8.1f %4.0f%% | %6.2f\n", name, layout(&p.s), r16,
               peak16 > 0 ? 100.0 * r16 / peak16 : 0.0, r32, 100.0 * r32 / peak32, r16 / r32);
        fflush(stdout);
        free(p.a);
        free(p.b);
        free(p.c);
    }
    if (!quick)
        printf("the step's products: bf16 %.2f ms, fp32 %.2f ms (sum of the medians)\n",
               t16 * 1e3, t32 * 1e3);
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
        bench_bf16(0);
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
        free(problems[i].a);
        free(problems[i].b);
        free(problems[i].c);
    }
    printf("ratio: ours / OpenBLAS at the same thread count; peak: ours / (threads x the measured "
           "peak); ours x: our 2-thread speed-up. %.0f s\n", bench_now() - start);
    bench_bf16(quick);
    bench_print_load("end", BENCH_OWN_LOAD_1_2);
    pdp_shutdown_threads();
    return 0;
}
