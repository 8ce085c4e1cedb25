/* bench/bf16_paths.c: every pdp_gemm_bf16 path this CPU has, per shape class, against
   pdp_sgemm on the same shapes; prints the row of gemm_bf16.c's path table
   (pdp__bf16_table) for this CPU, to paste there.

   Classes are gemm_bf16.c's (pdp__bf16_class): the layout (NN, NT, TN, TT) times the
   size: large, small m or n (< 32), small k (< 32). Each size class is timed on the MLP
   784-512-512-10's products at batch 512, as C[m, n] with depth k: large 512 x 512 x 784,
   512 x 784 x 512 and 512 x 512 x 512; small m or n 512 x 10 x 512 and 10 x 512 x 512;
   small k 512 x 512 x 10 (a class's time is the sum over its shapes, in every layout, so
   that a cell does not depend on which layout the MLP happens to use a shape in). One
   thread (the table is per core: the parts of a threaded product run the same kernels).

   Per class, the paths and fp32 run in turn, round by round (15 rounds); a round times
   each for one repetition of about 10 ms (the call looped) after a warm-up, and a
   figure is the median over rounds. The chosen cell is sgemm-rounded (pdp_sgemm plus the
   rounding at packing: the fp32 speed) unless AVX512-BF16 or AMX is faster by MARGIN,
   so a cell never names a bf16 path slower than fp32's. The emulated path is timed for the
   record (its vectorised kernel on a CPU with AVX-512F) but the choice skips it.

   Then the goal the table serves: a training step (forward, loss, backward, SGD) of the
   MLP at batch 512 and of bench.h's CNN at batch 128, one thread, fp32 beside bf16
   (pdp_model_set_precision: AUTO's paths, per product), in pairs, each round's pair back to
   back (fp32 first in every other round): the ratio printed is the median of the pairs'
   ratios, with its quartiles, so that a machine whose speed drifts between rounds (shared
   hosts drift by a third) moves both sides of a ratio alike.

   sgemm: as a CPU without bf16 instructions runs (the CPUID record's AVX512-BF16 and AMX
   cleared, so AUTO takes sgemm-rounded for every product): the bf16 step against fp32
   there.

   make build/bench_bf16_paths && nice -n -10 ./build/bench_bf16_paths [quick] [sgemm] */

#define PDP_IMPLEMENTATION
#include "pdp.h"

#include "bench.h"

enum { NPATHS = 5 }; /* fp32 (index 0) and the bf16 paths 1 .. 4 */
/* A cell names AVX512-BF16 or AMX only when its median time is below this fraction of
   sgemm-rounded's: on a shared machine two paths within a few percent swap places from
   run to run, and sgemm-rounded is the one whose speed is fp32's by construction. */
#define MARGIN 0.95
static const char letters[NPATHS] = {'-', 'E', 'B', 'A', 'S'};

typedef struct shape {
    int64_t m, n, k;
} shape;

static const shape large[] = {{512, 512, 784}, {512, 784, 512}, {512, 512, 512}};
static const shape small_mn[] = {{512, 10, 512}, {10, 512, 512}};
static const shape small_k[] = {{512, 512, 10}};

static float *a_buf, *b_buf, *c_buf;

/* One call of path p (0: pdp_sgemm) on every shape of a class in layout (ta, tb). */
static void run_class(int p, pdp_trans ta, pdp_trans tb, const shape *s, int ns)
{
    int i;
    for (i = 0; i < ns; i++) {
        int64_t lda = ta == PDP_NO_TRANS ? s[i].k : s[i].m;
        int64_t ldb = tb == PDP_NO_TRANS ? s[i].n : s[i].k;
        if (p == 0)
            pdp_sgemm(ta, tb, s[i].m, s[i].n, s[i].k, 1.0f, a_buf, lda, b_buf, ldb, 0.0f, c_buf,
                      s[i].n);
        else
            CHECK(pdp_gemm_bf16_on((pdp_bf16_path)p, ta, tb, s[i].m, s[i].n, s[i].k, 1.0f, a_buf,
                                   lda, b_buf, ldb, 0.0f, c_buf, s[i].n));
    }
}

/* Seconds per class call: the call looped for about `budget` seconds. */
static double time_class(int p, pdp_trans ta, pdp_trans tb, const shape *s, int ns, double budget)
{
    double t0 = bench_now(), t;
    int reps = 0;
    do {
        run_class(p, ta, tb, s, ns);
        reps++;
        t = bench_now() - t0;
    } while (t < budget);
    return t / reps;
}

/* Samples/s of `steps` training steps of m at batch `batch` (fp32 or bf16). */
static double step_rate(pdp_model *m, pdp_optim *o, const pdp_tensor *x, const int32_t *y,
                        int64_t batch, int steps)
{
    double t0 = bench_now();
    float loss;
    int i;
    for (i = 0; i < steps; i++) {
        CHECK(pdp_model_forward_backward(m, x, y, &loss));
        CHECK(pdp_optim_step(o));
        pdp_optim_zero_grad(o);
    }
    return (double)(batch * steps) / (bench_now() - t0);
}

/* fp32 and bf16 steps of the MLP (batch 512) and the CNN (batch 128), in pairs: rounds of
   `steps` steps each (at most STEP_ROUNDS). Many short pairs: on the shared Zen 3 machine
   15 pairs of 10 steps gave quartiles up to 30% apart and medians from 0.89x to 1.13x
   between runs (five runs); 41 pairs of 5 steps, medians 0.98-1.03x (four runs). */
enum { STEP_ROUNDS = 41 };
static void bench_steps(int rounds, int steps)
{
    int cnn, r, bf;
    for (cnn = 0; cnn < 2; cnn++) {
        int64_t batch = cnn ? 128 : 512, shape[4] = {batch, 784, 1, 1}, i;
        pdp_model *m[2];
        pdp_optim *o[2];
        pdp_optim_desc od;
        pdp_tensor *x;
        int32_t y[512];
        double rate[2][STEP_ROUNDS], ratio[STEP_ROUNDS], mid;
        pdp_rng rng;
        memset(&od, 0, sizeof od);
        od.kind = PDP_OPTIM_SGD;
        od.lr = 0.01f;
        if (cnn) shape[1] = 1, shape[2] = 28, shape[3] = 28;
        CHECK(pdp_tensor_create(&x, pdp_cpu(), cnn ? 4 : 2, shape));
        pdp_rng_seed(&rng, 7, 0);
        CHECK(pdp_tensor_uniform(x, &rng, 0.0f, 1.0f));
        for (i = 0; i < batch; i++) y[i] = (int32_t)pdp_rng_below(&rng, 10);
        for (bf = 0; bf < 2; bf++) {
            m[bf] = bench_make_model(cnn != 0);
            if (bf) CHECK(pdp_model_set_precision(m[bf], PDP_PRECISION_BF16));
            CHECK(pdp_optim_create(&o[bf], m[bf], &od));
            step_rate(m[bf], o[bf], x, y, batch, 2); /* warm-up */
        }
        for (r = 0; r < rounds; r++) { /* a pair a round, fp32 first in every other one */
            for (bf = 0; bf < 2; bf++) {
                int which = bf ^ (r & 1);
                rate[which][r] = step_rate(m[which], o[which], x, y, batch, steps);
            }
            ratio[r] = rate[1][r] / rate[0][r]; /* a pair runs back to back: the machine's */
        }                                       /* drift between rounds cancels in it */
        mid = bench_median(ratio, rounds);      /* (sorts ratio: the quartiles below) */
        printf("%s step, batch %d: fp32 %.0f samples/s, bf16 %.0f; bf16 / fp32 %.3fx "
               "(median of %d rounds' ratios; quartiles %.3f-%.3f)\n", cnn ? "CNN" : "MLP",
               (int)batch, bench_median(rate[0], rounds), bench_median(rate[1], rounds), mid,
               rounds, ratio[rounds / 4], ratio[(3 * rounds) / 4]);
        for (bf = 0; bf < 2; bf++) {
            pdp_optim_free(o[bf]);
            pdp_model_free(m[bf]);
        }
        pdp_tensor_free(x);
    }
}

int main(int argc, char **argv)
{
    static const char *layouts[4] = {"NN", "NT", "TN", "TT"};
    static const char *sizes[3] = {"large", "small m/n", "small k"};
    const shape *cls[3] = {large, small_mn, small_k};
    int ncls[3] = {3, 2, 1};
    int quick = 0, sgemm = 0, rounds, l, z, p, r, i;
    double budget;
    char cells[4 * 4];
    int avail[NPATHS];
    size_t big = 784 * 784;
    for (i = 1; i < argc; i++) {
        quick |= strcmp(argv[i], "quick") == 0;
        sgemm |= strcmp(argv[i], "sgemm") == 0;
    }
    rounds = quick ? 3 : 15;
    budget = quick ? 0.005 : 0.01;
    pdp_bf16_path_available(PDP_BF16_PATH_AUTO); /* CPUID read */
    if (sgemm) pdp__bf16_this.avx512 = pdp__bf16_this.amx = 0;
    a_buf = (float *)malloc(big * sizeof(float));
    b_buf = (float *)malloc(big * sizeof(float));
    c_buf = (float *)malloc(big * sizeof(float));
    if (!a_buf || !b_buf || !c_buf) return 1;
    for (i = 0; i < (int)big; i++) {
        a_buf[i] = (float)((int)(((int64_t)i * 7919) % 2001) - 1000) / 1000.0f;
        b_buf[i] = (float)((int)(((int64_t)i * 104729) % 2001) - 1000) / 1000.0f;
    }
    pdp_set_num_threads(1);
    avail[0] = 1;
    for (p = 1; p < NPATHS; p++) avail[p] = pdp_bf16_path_available((pdp_bf16_path)p);
    printf("bf16 paths per shape class, one thread, median of %d rounds (GFLOP/s; x: of "
           "pdp_sgemm fp32)\nCPU: vendor %d family 0x%x model 0x%x; paths:", rounds,
           pdp__bf16_this.vendor, pdp__bf16_this.family, pdp__bf16_this.model);
    for (p = 1; p < NPATHS; p++)
        if (avail[p]) printf(" %s", pdp_bf16_path_name((pdp_bf16_path)p));
    printf("\n");
    bench_print_load("start", 0.0);
    printf("%-6s %-10s %9s", "layout", "size", "fp32");
    for (p = 1; p < NPATHS; p++)
        if (avail[p]) printf(" %20s", pdp_bf16_path_name((pdp_bf16_path)p));
    printf("  cell\n");
    memset(cells, 0, sizeof cells);
    for (l = 0; l < 4; l++) {
        pdp_trans ta = (pdp_trans)(l >> 1), tb = (pdp_trans)(l & 1);
        for (z = 0; z < 3; z++) {
            double t[NPATHS][15], med[NPATHS], flops = 0.0, best = 0.0;
            int win = PDP_BF16_PATH_SGEMM, hw = 0;
            for (i = 0; i < ncls[z]; i++)
                flops += 2.0 * (double)cls[z][i].m * (double)cls[z][i].n * (double)cls[z][i].k;
            for (p = 0; p < NPATHS; p++)
                if (avail[p]) time_class(p, ta, tb, cls[z], ncls[z], budget / 2); /* warm-up */
            for (r = 0; r < rounds; r++)
                for (p = 0; p < NPATHS; p++)
                    if (avail[p]) t[p][r] = time_class(p, ta, tb, cls[z], ncls[z], budget);
            printf("%-6s %-10s", layouts[l], sizes[z]);
            for (p = 0; p < NPATHS; p++) {
                if (!avail[p]) continue;
                med[p] = bench_median(t[p], rounds);
                if (p == 0)
                    printf(" %9.1f", flops / med[p] * 1e-9);
                else
                    printf(" %13.1f %5.2fx", flops / med[p] * 1e-9, med[0] / med[p]);
                if (p == PDP_BF16_PATH_AVX512 || p == PDP_BF16_PATH_AMX)
                    if (best == 0.0 || med[p] < best) best = med[p], hw = p;
            }
            /* a bf16 instruction path only when it beats sgemm-rounded by MARGIN */
            if (hw && (!avail[PDP_BF16_PATH_SGEMM] || best < MARGIN * med[PDP_BF16_PATH_SGEMM]))
                win = hw;
            printf("  %c\n", letters[win]);
            cells[l * 4 + z] = letters[win];
        }
        cells[l * 4 + 3] = l < 3 ? ' ' : '\0';
    }
    printf("row for gemm_bf16.c's pdp__bf16_table (cells: %s):\n", "NN NT TN TT x large, "
           "small m/n, small k");
    printf("    {%s, 0x%x, 0x%x, 0x%x, %d, %d, \"%s\"},\n",
           pdp__bf16_this.vendor == PDP__BF16_INTEL ? "PDP__BF16_INTEL"
           : pdp__bf16_this.vendor == PDP__BF16_AMD ? "PDP__BF16_AMD"
                                                     : "0",
           pdp__bf16_this.family, pdp__bf16_this.model, pdp__bf16_this.model,
           pdp__bf16_this.avx512, pdp__bf16_this.amx, cells);
    bench_steps(quick ? 5 : STEP_ROUNDS, quick ? 3 : 5);
    bench_print_load("end", 1.0);
    free(a_buf);
    free(b_buf);
    free(c_buf);
    return 0;
}
