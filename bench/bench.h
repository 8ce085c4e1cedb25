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
   half a core per core, a WARNING line (other work shares the cores, so wall-clock
   figures are unreliable). Returns 1 when it warned. */
static inline int bench_print_load(const char *when)
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    double load[3];
    if (!bench_loadavg(load)) {
        printf("load average at the %s: unknown (no /proc/loadavg)\n", when);
        return 0;
    }
    printf("load average at the %s: %.2f %.2f %.2f (%ld cores)\n", when, load[0], load[1],
           load[2], cores);
    if (cores > 0 && load[0] > 0.5 * (double)cores) {
        printf("WARNING: load %.2f is above %.1f (half a core per core): other work shares the "
               "cores and wall-clock figures are unreliable\n", load[0], 0.5 * (double)cores);
        return 1;
    }
    return 0;
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
