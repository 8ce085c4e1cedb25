/* comm_conformance.h - one suite of collective and point-to-point cases for every
   communicator backend (comm.h), written once and run by test_comm.c (local: thread
   ranks), test_mpi.c (MPI: this process's rank, under `make mpi-test` on 1-4 ranks) and
   test_cuda.c (NCCL: a thread per GPU; `make emu-cuda-test` runs it on the CPU emulation).

   A backend is driven by a rank factory (conf_factory, below), which the including test
   fills: run a function on every rank of a fresh communicator of n ranks with a given
   timeout (thread ranks: n threads; MPI: this process, n = the world size), allocate and
   copy buffers on the communicator's device, and meet the other ranks outside the
   communicator (conf_sync). Each case runs at every world size the factory allows
   (min_ranks..max_ranks); every rank checks its own results against a naive loop over
   every rank's inputs (which it can compute) and records the first failure in its
   conf_rank; the case fails when any rank failed (under MPI the includer's CONF_AGREE
   makes the verdict agree over ranks).

   Inputs are small integers, so every sum is exact in any order and the float cases
   compare bits on every backend. What differs by backend, as comm.h documents it, is
   stated in the case that meets it (search "backend differs"):
     - rounding: local reduces in rank order (awkward inputs give the same bits as a naive
       rank-order loop; conf_rank_order_bits) and rounds 16-bit sums once; MPI and NCCL
       round 16-bit partial sums N - 1 times in an order they choose; NCCL's AVG may
       scale before summing (within 1e-6 relative);
     - timeouts: local names the missing rank; MPI and NCCL cannot know which rank is
       missing and name this rank; after a timed-out message NCCL has aborted the
       communicator (later calls fail), local and MPI have withdrawn it (MPI may leave a
       timed-out send deliverable: OpenMPI never cancels one);
     - tags: NCCL has none: a receive with another tag takes the send (which completes) and
       fails with PDP_ERR_INVALID naming both tags; local and MPI time both out;
     - a count mismatch fails the receiver on every backend, the sender too on local.
   Every case can fail, and each backend's run was seen to catch a deliberately broken
   backend (CHANGELOG, issue 22: an all-reduce off by one element on local, MPI and NCCL,
   NCCL's tag check skipped). */

#ifndef COMM_CONFORMANCE_H
#define COMM_CONFORMANCE_H

#include <pthread.h>
#include <stdarg.h>
#include <time.h>

#define CONF_MAXR 8

typedef struct conf_factory conf_factory;
typedef struct conf_rank conf_rank;
typedef void (*conf_fn)(conf_rank *rk, pdp_comm *c);

/* One rank's run of a case: what the case passes in, what the rank found. */
struct conf_rank {
    const conf_factory *f;
    int rank, size;
    int64_t arg;            /* the case's parameter */
    double timeout_s;       /* the communicator's */
    void *world;            /* the factory's, for conf_sync */
    bool freed;             /* the case freed its communicator (the factory must not) */
    pdp_status st;          /* PDP_OK, or the first failure */
    char msg[1400];
};

struct conf_factory {
    const char *name;       /* "local", "mpi", "nccl" */
    pdp_backend backend;
    int min_ranks, max_ranks;
    /* Runs fn on every rank of a fresh communicator of n ranks (name "conf", timeout_s):
       fills ranks[] with this process's ranks (st, msg, rank, size) and returns how many
       (thread ranks n, MPI 1), or 0 when it could not make them (pdp_last_error says why). */
    int (*run)(const conf_factory *f, int n, double timeout_s, conf_fn fn, int64_t arg,
               conf_rank *ranks);
    /* Buffers on c's device: alloc returns NULL on failure; put/get copy host <-> device. */
    void *(*alloc)(pdp_comm *c, size_t bytes);
    void (*release)(pdp_comm *c, void *p);
    pdp_status (*put)(pdp_comm *c, void *dev, const void *host, size_t bytes);
    pdp_status (*get)(pdp_comm *c, void *host, const void *dev, size_t bytes);
    /* Every rank of the run meets here, outside the communicator. */
    void (*sync)(conf_rank *rk);
    double timeout_s;       /* the timeout of the cases that time out (short: they wait it) */
};

#ifndef CONF_AGREE
#define CONF_AGREE(r) (r)
#endif

/* ---- helpers ----
   A rank that finds a wrong value records it and goes on issuing the case's collectives,
   so that its peers (other processes under MPI) are not left waiting for the timeout. */

static double conf_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Records the first failure of this rank. Returns false. */
static bool conf_fail(conf_rank *rk, const char *fmt, ...)
{
    va_list ap;
    int k;
    if (rk->st != PDP_OK) return false;
    rk->st = PDP_ERR_STATE;
    k = snprintf(rk->msg, sizeof rk->msg, "%s, rank %d of %d: ", rk->f->name, rk->rank, rk->size);
    va_start(ap, fmt);
    vsnprintf(rk->msg + k, sizeof rk->msg - (size_t)k, fmt, ap);
    va_end(ap);
    return false;
}

/* true when st is PDP_OK; otherwise records it with the library's message. */
static bool conf_ok(conf_rank *rk, pdp_status st, const char *what)
{
    if (st == PDP_OK) return true;
    conf_fail(rk, "%s: %s: %.1200s", what, pdp_status_name(st), pdp_last_error());
    if (rk->st == PDP_ERR_STATE) rk->st = st;
    return false;
}

/* true when st is want and the message holds every non-NULL string of subs. */
static bool conf_expect(conf_rank *rk, pdp_status st, pdp_status want, const char *what,
                        const char *s1, const char *s2, const char *s3)
{
    const char *m = pdp_last_error(), *subs[3];
    int k;
    subs[0] = s1;
    subs[1] = s2;
    subs[2] = s3;
    if (st != want)
        return conf_fail(rk, "%s: %s, want %s: %.1100s", what, pdp_status_name(st),
                         pdp_status_name(want), st == PDP_OK ? "" : m);
    for (k = 0; k < 3; k++)
        if (subs[k] && !strstr(m, subs[k]))
            return conf_fail(rk, "%s: the message lacks \"%s\": %.1100s", what, subs[k], m);
    return true;
}

/* Rank r's value at i: a small integer, so sums are exact in any order. */
static float conf_val(int r, int64_t i)
{
    return (float)((r + 1) * (int)(i % 251) - 3 * r + (int)(i % 7));
}

/* Awkward magnitudes, so that the order of summation shows in the bits. */
static float conf_awk(int r, int64_t i)
{
    uint32_t h = (uint32_t)(i * 2654435761u) ^ (uint32_t)(r * 40503u + 17u);
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    return ((float)(h & 0xffffff) / 16777216.0f - 0.5f) * (r % 2 ? 1e3f : 1e-2f);
}

static float conf_sum(int n, int64_t i)
{
    float s = 0.0f;
    int r;
    for (r = 0; r < n; r++) s += conf_val(r, i);
    return s;
}

/* A device buffer of count elements of es bytes, filled from host (or not, when NULL). */
static void *conf_dev(conf_rank *rk, pdp_comm *c, const void *host, int64_t count, size_t es)
{
    size_t bytes = (size_t)(count > 0 ? count : 1) * es;
    void *p = rk->f->alloc(c, bytes);
    if (!p) {
        conf_fail(rk, "allocating %zu bytes on the device: %s", bytes, pdp_last_error());
        return NULL;
    }
    if (host && count > 0 && !conf_ok(rk, rk->f->put(c, p, host, (size_t)count * es), "upload")) {
        rk->f->release(c, p);
        return NULL;
    }
    return p;
}

static bool conf_back(conf_rank *rk, pdp_comm *c, void *host, const void *dev, int64_t count,
                      size_t es)
{
    return count <= 0 || conf_ok(rk, rk->f->get(c, host, dev, (size_t)count * es), "download");
}

static float *conf_host(int64_t count) { return (float *)malloc((size_t)(count + 1) * 4); }

/* Stats: the collective count and bytes_sent moved by exactly (dcoll, dbytes). */
static bool conf_stats_moved(conf_rank *rk, pdp_comm *c, const pdp_comm_stats *before,
                             int64_t dcoll, double dbytes, int64_t dp2p, const char *what)
{
    pdp_comm_stats s;
    pdp_comm_get_stats(c, &s);
    if (s.collectives - before->collectives != dcoll || s.p2p - before->p2p != dp2p ||
        s.bytes_sent - before->bytes_sent != (int64_t)dbytes || s.busy_s < before->busy_s)
        return conf_fail(rk, "%s: stats moved by %lld collectives, %lld messages, %lld bytes; "
                         "want %lld, %lld, %lld", what,
                         (long long)(s.collectives - before->collectives),
                         (long long)(s.p2p - before->p2p),
                         (long long)(s.bytes_sent - before->bytes_sent), (long long)dcoll,
                         (long long)dp2p, (long long)(int64_t)dbytes);
    return true;
}

/* backend differs: NCCL's AVG may scale each input by 1/N before summing (ncclAvg), so
   its AVG is within 1e-6 relative, not the exact sum divided */
static bool conf_avg_scales(const conf_factory *f) { return f->backend == PDP_BACKEND_NCCL; }

/* The bytes comm.c counts for one call (it truncates each call's figure). */
static double conf_b(double bytes) { return (double)(int64_t)bytes; }

/* Runs fn at world size n and turns the ranks' records into the case's verdict. */
static enum greatest_test_res conf_check(const conf_factory *f, int n, double timeout_s,
                                         conf_fn fn, int64_t arg)
{
    static char failed[1500];
    conf_rank ranks[CONF_MAXR];
    int k, got;
    memset(ranks, 0, sizeof ranks);
    got = f->run(f, n, timeout_s, fn, arg, ranks);
    if (got <= 0) {
        snprintf(failed, sizeof failed, "%s: could not make %d ranks: %s", f->name, n,
                 pdp_last_error());
        FAILm(failed);
    }
    for (k = 0; k < got; k++)
        if (ranks[k].st != PDP_OK) {
            snprintf(failed, sizeof failed, "%s (%s)", ranks[k].msg,
                     pdp_status_name(ranks[k].st));
            fprintf(stderr, "  %s\n", failed);
            FAILm(failed);
        }
    PASS();
}

#define CONF_CASE(name)                                                                      \
    static enum greatest_test_res name##_body(const conf_factory *f);                         \
    static enum greatest_test_res name(const conf_factory *f) { return CONF_AGREE(name##_body(f)); } \
    static enum greatest_test_res name##_body(const conf_factory *f)

/* every world size the factory allows */
#define CONF_EACH_SIZE(n) for ((n) = f->min_ranks; (n) <= f->max_ranks; (n)++)
/* the smallest world size of at least 2 ranks (the cases that wait for timeouts run there) */
#define CONF_PAIR(f) ((f)->min_ranks > 2 ? (f)->min_ranks : 2)

/* ---- thread ranks (local, NCCL): one thread per rank, conf_sync a bounded barrier ----
   (a process-rank includer, test_mpi.c, defines CONF_NO_THREADS) */
#ifndef CONF_NO_THREADS

typedef pdp_status (*conf_make_fn)(void *group, int rank, pdp_comm **out);

typedef struct conf_threads_world {
    void *group;
    conf_make_fn make;
    conf_fn fn;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n, arrived;
    unsigned gen;
} conf_threads_world;

static void *conf_thread_main(void *arg)
{
    conf_rank *rk = (conf_rank *)arg;
    conf_threads_world *w = (conf_threads_world *)rk->world;
    pdp_comm *c = NULL;
    if (!conf_ok(rk, w->make(w->group, rk->rank, &c), "creating the communicator")) return NULL;
    w->fn(rk, c);
    if (!rk->freed) pdp_comm_free(c);
    return NULL;
}

/* Runs fn on n threads, rank r's communicator from make(group, r); returns n. */
static int conf_threads(const conf_factory *f, int n, double timeout_s, conf_fn fn, int64_t arg,
                        conf_rank *ranks, void *group, conf_make_fn make)
{
    static conf_threads_world w; /* one run at a time */
    pthread_t t[CONF_MAXR];
    int r;
    memset(&w, 0, sizeof w);
    w.group = group;
    w.make = make;
    w.fn = fn;
    w.n = n;
    pthread_mutex_init(&w.mu, NULL);
    pthread_cond_init(&w.cv, NULL);
    for (r = 0; r < n; r++) {
        ranks[r].f = f;
        ranks[r].rank = r;
        ranks[r].size = n;
        ranks[r].arg = arg;
        ranks[r].timeout_s = timeout_s;
        ranks[r].world = &w;
        pthread_create(&t[r], NULL, conf_thread_main, &ranks[r]);
    }
    for (r = 0; r < n; r++) pthread_join(t[r], NULL);
    pthread_mutex_destroy(&w.mu);
    pthread_cond_destroy(&w.cv);
    return n;
}

/* conf_sync for conf_threads: a barrier that gives up after 120 s (failing the case). */
static void conf_threads_sync(conf_rank *rk)
{
    conf_threads_world *w = (conf_threads_world *)rk->world;
    unsigned gen;
    double t0 = conf_now();
    pthread_mutex_lock(&w->mu);
    gen = w->gen;
    if (++w->arrived == w->n) {
        w->arrived = 0;
        w->gen++;
        pthread_cond_broadcast(&w->cv);
    }
    while (w->gen == gen && conf_now() - t0 < 120.0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 1;
        pthread_cond_timedwait(&w->cv, &w->mu, &ts);
    }
    if (w->gen == gen) conf_fail(rk, "conf_sync: the other ranks never came (120 s)");
    pthread_mutex_unlock(&w->mu);
}
#endif /* CONF_NO_THREADS */

/* ---- all-reduce ---- */

static const int64_t conf_counts[] = {0, 1, 7, 1001, 1000003}; /* MPI chunks the last */

/* SUM and AVG on odd counts against the exact sum, the same bits on every rank; the
   stats count one collective and the ring figure 2 (N - 1) / N x bytes each. */
static void conf_rank_allreduce(conf_rank *rk, pdp_comm *c)
{
    int n = rk->size, op;
    size_t k;
    for (k = 0; k < sizeof conf_counts / sizeof *conf_counts; k++)
        for (op = 0; op < 2; op++) {
            int64_t cnt = conf_counts[k], i;
            float *h = conf_host(cnt), *d;
            pdp_comm_stats s0;
            for (i = 0; i < cnt; i++) h[i] = conf_val(rk->rank, i);
            pdp_comm_get_stats(c, &s0);
            if ((d = (float *)conf_dev(rk, c, h, cnt, 4)) &&
                conf_ok(rk, pdp_comm_allreduce(c, d, cnt, (pdp_reduce_op)op, NULL), "allreduce") &&
                conf_back(rk, c, h, d, cnt, 4) &&
                conf_stats_moved(rk, c, &s0, 1, 2.0 * (n - 1.0) / n * (double)cnt * 4.0, 0,
                                 "allreduce"))
                for (i = 0; i < cnt; i++) {
                    float want = op ? conf_sum(n, i) / (float)n : conf_sum(n, i);
                    double tol = op && conf_avg_scales(rk->f) ? 1e-6 * fabs((double)want) : 0.0;
                    if (fabs((double)h[i] - want) > tol) {
                        conf_fail(rk, "allreduce %s count %lld: element %lld is %.9g, want %.9g",
                                  op ? "AVG" : "SUM", (long long)cnt, (long long)i,
                                  (double)h[i], (double)want);
                        break;
                    }
                }
            if (d) rk->f->release(c, d);
            free(h);
        }
}

CONF_CASE(conf_allreduce_sum_avg_odd_counts)
{
    int n;
    CONF_EACH_SIZE(n) CHECK_CALL(conf_check(f, n, 60.0, conf_rank_allreduce, 0));
    PASS();
}

/* backend differs: only local promises an order (rank r reduces slice r of every rank's
   buffer in rank order), so only there do awkward inputs give a naive loop's bits. */
static void conf_rank_order(conf_rank *rk, pdp_comm *c)
{
    const int64_t cnt = 5003;
    int n = rk->size, r;
    int64_t i;
    float *h = conf_host(cnt), *d;
    for (i = 0; i < cnt; i++) h[i] = conf_awk(rk->rank, i);
    if ((d = (float *)conf_dev(rk, c, h, cnt, 4)) &&
        conf_ok(rk, pdp_comm_allreduce(c, d, cnt, PDP_REDUCE_SUM, NULL), "allreduce") &&
        conf_back(rk, c, h, d, cnt, 4))
        for (i = 0; i < cnt; i++) {
            float s = conf_awk(0, i);
            for (r = 1; r < n; r++) s += conf_awk(r, i);
            if (h[i] != s) {
                conf_fail(rk, "element %lld is %.9g, the rank-order sum %.9g", (long long)i,
                          (double)h[i], (double)s);
                break;
            }
        }
    if (d) rk->f->release(c, d);
    free(h);
}

CONF_CASE(conf_rank_order_bits)
{
    int n;
    if (f->backend != PDP_BACKEND_LOCAL) SKIPm("only the local backend promises rank order");
    CONF_EACH_SIZE(n) CHECK_CALL(conf_check(f, n, 60.0, conf_rank_order, 0));
    PASS();
}

/* ---- broadcast (floats and host bytes) from every root ---- */

static void conf_rank_broadcast(conf_rank *rk, pdp_comm *c)
{
    int n = rk->size, root;
    size_t k;
    for (root = 0; root < n; root++) {
        unsigned char bytes[37];
        pdp_comm_stats s0;
        for (k = 0; k < sizeof conf_counts / sizeof *conf_counts; k++) {
            int64_t cnt = conf_counts[k], i;
            float *h = conf_host(cnt), *d;
            for (i = 0; i < cnt; i++) h[i] = conf_val(rk->rank, i);
            pdp_comm_get_stats(c, &s0);
            if ((d = (float *)conf_dev(rk, c, h, cnt, 4)) &&
                conf_ok(rk, pdp_comm_broadcast(c, d, cnt, root, NULL), "broadcast") &&
                conf_back(rk, c, h, d, cnt, 4) &&
                conf_stats_moved(rk, c, &s0, 1, (n - 1.0) / n * (double)cnt * 4.0, 0,
                                 "broadcast"))
                for (i = 0; i < cnt; i++)
                    if (h[i] != conf_val(root, i)) {
                        conf_fail(rk, "broadcast from %d, count %lld: element %lld is %g, want "
                                  "%g", root, (long long)cnt, (long long)i, (double)h[i],
                                  (double)conf_val(root, i));
                        break;
                    }
            if (d) rk->f->release(c, d);
            free(h);
        }
        for (k = 0; k < sizeof bytes; k++)
            bytes[k] = (unsigned char)(rk->rank == root ? k * 3 + (size_t)root : 0xee);
        pdp_comm_get_stats(c, &s0);
        if (conf_ok(rk, pdp_comm_broadcast_bytes(c, bytes, sizeof bytes, root),
                    "broadcast_bytes") &&
            conf_stats_moved(rk, c, &s0, 1, (n - 1.0) / n * 37.0, 0, "broadcast_bytes"))
            for (k = 0; k < sizeof bytes; k++)
                if (bytes[k] != (unsigned char)(k * 3 + (size_t)root)) {
                    conf_fail(rk, "broadcast_bytes from %d: byte %zu is %d", root, k, bytes[k]);
                    break;
                }
    }
}

CONF_CASE(conf_broadcast_from_every_root)
{
    int n;
    CONF_EACH_SIZE(n) CHECK_CALL(conf_check(f, n, 60.0, conf_rank_broadcast, 0));
    PASS();
}

/* ---- reduce-scatter and all-gather: odd and zero counts, out of place and in place ---- */

static const int64_t conf_small[] = {0, 1, 7, 1001};

static void conf_rank_reduce_scatter(conf_rank *rk, pdp_comm *c)
{
    int n = rk->size, op, inplace;
    size_t k;
    for (k = 0; k < sizeof conf_small / sizeof *conf_small; k++)
        for (inplace = 0; inplace < 2; inplace++)
            for (op = 0; op < 2; op++) {
                int64_t cnt = conf_small[k], i;
                float *h = conf_host(cnt * n), *send, *recv = NULL, *out;
                pdp_comm_stats s0;
                for (i = 0; i < cnt * n; i++) h[i] = conf_val(rk->rank, i);
                send = (float *)conf_dev(rk, c, h, cnt * n, 4);
                if (send && !inplace) recv = (float *)conf_dev(rk, c, NULL, cnt, 4);
                out = inplace ? (send ? send + (int64_t)rk->rank * cnt : NULL) : recv;
                pdp_comm_get_stats(c, &s0);
                if (out &&
                    conf_ok(rk, pdp_comm_reduce_scatter(c, send, out, cnt, (pdp_reduce_op)op,
                                                        NULL), "reduce_scatter") &&
                    conf_back(rk, c, h, out, cnt, 4) &&
                    conf_stats_moved(rk, c, &s0, 1, (n - 1.0) * (double)cnt * 4.0, 0,
                                     "reduce_scatter"))
                    for (i = 0; i < cnt; i++) {
                        int64_t at = (int64_t)rk->rank * cnt + i;
                        float want = op ? conf_sum(n, at) / (float)n : conf_sum(n, at);
                        double tol = op && conf_avg_scales(rk->f) ? 1e-6 * fabs((double)want) : 0.0;
                        if (fabs((double)h[i] - want) > tol) {
                            conf_fail(rk, "reduce_scatter %s count %lld%s: element %lld is %.9g, "
                                      "want %.9g", op ? "AVG" : "SUM", (long long)cnt,
                                      inplace ? " in place" : "", (long long)i, (double)h[i],
                                      (double)want);
                            break;
                        }
                    }
                if (send) rk->f->release(c, send);
                if (recv) rk->f->release(c, recv);
                free(h);
            }
}

CONF_CASE(conf_reduce_scatter_odd_and_zero_counts)
{
    int n;
    CONF_EACH_SIZE(n) CHECK_CALL(conf_check(f, n, 60.0, conf_rank_reduce_scatter, 0));
    PASS();
}

static void conf_rank_allgather(conf_rank *rk, pdp_comm *c)
{
    int n = rk->size, inplace, q;
    size_t k;
    for (k = 0; k < sizeof conf_small / sizeof *conf_small; k++)
        for (inplace = 0; inplace < 2; inplace++) {
            int64_t cnt = conf_small[k], i;
            float *h = conf_host(cnt * n), *send = NULL, *recv, *src;
            pdp_comm_stats s0;
            for (i = 0; i < cnt * n; i++) h[i] = -1.0f;
            for (i = 0; i < cnt; i++) h[(inplace ? rk->rank * cnt : 0) + i] =
                                          conf_val(rk->rank, i) + 0.125f;
            recv = (float *)conf_dev(rk, c, inplace ? h : NULL, cnt * n, 4);
            if (recv && !inplace) send = (float *)conf_dev(rk, c, h, cnt, 4);
            src = inplace ? (recv ? recv + (int64_t)rk->rank * cnt : NULL) : send;
            pdp_comm_get_stats(c, &s0);
            if (src && conf_ok(rk, pdp_comm_allgather(c, src, recv, cnt, NULL), "allgather") &&
                conf_back(rk, c, h, recv, cnt * n, 4) &&
                conf_stats_moved(rk, c, &s0, 1, (n - 1.0) * (double)cnt * 4.0, 0, "allgather"))
                for (q = 0; q < n; q++)
                    for (i = 0; i < cnt; i++)
                        if (h[q * cnt + i] != conf_val(q, i) + 0.125f) {
                            conf_fail(rk, "allgather count %lld%s: block %d element %lld is %g",
                                      (long long)cnt, inplace ? " in place" : "", q,
                                      (long long)i, (double)h[q * cnt + i]);
                            q = n;
                            break;
                        }
            if (send) rk->f->release(c, send);
            if (recv) rk->f->release(c, recv);
            free(h);
        }
}

CONF_CASE(conf_allgather_odd_and_zero_counts)
{
    int n;
    CONF_EACH_SIZE(n) CHECK_CALL(conf_check(f, n, 60.0, conf_rank_allgather, 0));
    PASS();
}

/* ---- 16-bit all-reduce and reduce-scatter (bf16, fp16) ---- */

static float conf_w16(int dt, uint16_t h) { return pdp__dt16_float(dt, h); }
static uint16_t conf_r16(int dt, float v) { return pdp__dt16_bits(dt, v); }

static uint16_t conf_val16(int dt, int r, int64_t i)
{
    return conf_r16(dt, conf_awk(r, i) * (dt == PDP_DTYPE_F16 ? 0.03f : 1.0f));
}

/* Whether got is the stated rounding of element k's reduction (backend differs):
   local   widened, summed in fp32 in rank order, AVG divided, rounded once: exact;
   others  N - 1 roundings of partial sums in an order the backend chooses (MPI, NCCL):
           2 ranks exact, 3 ranks one of the three pairings, more within (N - 1) u sum|x|;
           AVG divides the rounded sum and rounds again (NCCL may scale first: bound). */
static bool conf_is_stated16(const conf_factory *f, int dt, int n, int64_t k, uint16_t got,
                             int avg)
{
    uint16_t x[CONF_MAXR], want[3];
    int r, nw = 1, j;
    double sabs = 0.0, exact = 0.0, u = dt == PDP_DTYPE_BF16 ? 0x1p-8 : 0x1p-11;
    float once = 0.0f;
    for (r = 0; r < n; r++) {
        x[r] = conf_val16(dt, r, k);
        sabs += fabs(conf_w16(dt, x[r]));
        exact += conf_w16(dt, x[r]);
        once += conf_w16(dt, x[r]);
    }
    if (f->backend == PDP_BACKEND_LOCAL) return got == conf_r16(dt, avg ? once / (float)n : once);
    if (n == 1) want[0] = x[0];
    else if (n == 2) want[0] = conf_r16(dt, conf_w16(dt, x[0]) + conf_w16(dt, x[1]));
    else if (n == 3) {
        for (j = 0; j < 3; j++) { /* (a + b) + c over the three pairs */
            int a = j == 2 ? 1 : 0, b = j == 0 ? 1 : 2, cc = 3 - a - b;
            want[j] = conf_r16(dt, conf_w16(dt, conf_r16(dt, conf_w16(dt, x[a]) +
                                                                 conf_w16(dt, x[b]))) +
                                       conf_w16(dt, x[cc]));
        }
        nw = 3;
    } else nw = 0;
    if (avg && conf_avg_scales(f)) nw = 0;
    for (j = 0; j < nw; j++) {
        uint16_t w = avg ? conf_r16(dt, conf_w16(dt, want[j]) / (float)n) : want[j];
        if (got == w) return true;
    }
    if (nw == 0) {
        double e = avg ? exact / n : exact;
        double bound = ((n - 1) * u * sabs + 2 * u * fabs(e) * n) / (avg ? n : 1);
        return fabs(conf_w16(dt, got) - e) <= bound;
    }
    return false;
}

static void conf_rank_16bit(conf_rank *rk, pdp_comm *c)
{
    const int64_t cnts[] = {0, 1, 1001};
    int n = rk->size, dt, avg;
    size_t k;
    for (dt = PDP_DTYPE_BF16; dt <= PDP_DTYPE_F16; dt++)
        for (avg = 0; avg < 2; avg++)
            for (k = 0; k < 3; k++) {
                int64_t cnt = cnts[k], i;
                uint16_t *a = (uint16_t *)malloc((size_t)(cnt * n + 1) * 2);
                uint16_t *s = (uint16_t *)malloc((size_t)(cnt * n + 1) * 2);
                void *da, *ds = NULL, *dr = NULL;
                pdp_comm_stats s0;
                for (i = 0; i < cnt; i++) a[i] = conf_val16(dt, rk->rank, i);
                for (i = 0; i < cnt * n; i++) s[i] = conf_val16(dt, rk->rank, i);
                pdp_comm_get_stats(c, &s0);
                if ((da = conf_dev(rk, c, a, cnt, 2)) && (ds = conf_dev(rk, c, s, cnt * n, 2)) &&
                    (dr = conf_dev(rk, c, NULL, cnt, 2)) &&
                    conf_ok(rk, pdp_comm_allreduce_ex(c, da, cnt, (pdp_dtype)dt,
                                                      (pdp_reduce_op)avg, NULL), "allreduce_ex") &&
                    conf_ok(rk, pdp_comm_reduce_scatter_ex(c, ds, dr, cnt, (pdp_dtype)dt,
                                                           (pdp_reduce_op)avg, NULL),
                            "reduce_scatter_ex") &&
                    conf_back(rk, c, a, da, cnt, 2) && conf_back(rk, c, s, dr, cnt, 2) &&
                    conf_stats_moved(rk, c, &s0, 2, conf_b(2.0 * (n - 1.0) / n * (double)cnt * 2.0) +
                                     conf_b((n - 1.0) * (double)cnt * 2.0), 0, "16-bit"))
                    for (i = 0; i < cnt; i++) {
                        int64_t at = (int64_t)rk->rank * cnt + i;
                        if (!conf_is_stated16(rk->f, dt, n, i, a[i], avg) ||
                            !conf_is_stated16(rk->f, dt, n, at, s[i], avg)) {
                            conf_fail(rk, "%s %s count %lld element %lld: allreduce_ex %04x, "
                                      "reduce_scatter_ex %04x: not the stated rounding",
                                      dt == PDP_DTYPE_BF16 ? "bf16" : "fp16", avg ? "AVG" : "SUM",
                                      (long long)cnt, (long long)i, a[i], s[i]);
                            break;
                        }
                    }
                if (da) rk->f->release(c, da);
                if (ds) rk->f->release(c, ds);
                if (dr) rk->f->release(c, dr);
                free(a);
                free(s);
            }
}

CONF_CASE(conf_16bit_follow_the_stated_rounding)
{
    int n;
    CONF_EACH_SIZE(n) CHECK_CALL(conf_check(f, n, 60.0, conf_rank_16bit, 0));
    PASS();
}

/* ---- asynchronous: many in flight, waited out of order; progress without a wait ---- */

enum { CONF_ASYNC = 24 };

static void conf_rank_async(conf_rank *rk, pdp_comm *c)
{
    int n = rk->size, k, q;
    pdp_work *w[CONF_ASYNC];
    float *h[CONF_ASYNC], *d[CONF_ASYNC], *r2[CONF_ASYNC];
    int64_t cnt[CONF_ASYNC], i;
    double t0;
    memset(d, 0, sizeof d);
    memset(r2, 0, sizeof r2);
    memset(w, 0, sizeof w);
    for (k = 0; k < CONF_ASYNC; k++) {
        cnt[k] = 1 + k * 37;
        h[k] = conf_host(cnt[k] * n);
        for (i = 0; i < cnt[k] * n; i++) h[k][i] = conf_val(rk->rank, i + k);
    }
    /* kinds by k % 4: all-reduce, broadcast from k % n, reduce-scatter, all-gather */
    for (k = 0; k < CONF_ASYNC; k++) {
        int kind = k % 4;
        if (!(d[k] = (float *)conf_dev(rk, c, h[k], kind == 2 ? cnt[k] * n : cnt[k], 4))) break;
        if (kind >= 2 && !(r2[k] = (float *)conf_dev(rk, c, NULL, kind == 3 ? cnt[k] * n : cnt[k],
                                                     4)))
            break;
        conf_ok(rk, kind == 0 ? pdp_comm_allreduce(c, d[k], cnt[k], PDP_REDUCE_SUM, &w[k])
                    : kind == 1 ? pdp_comm_broadcast(c, d[k], cnt[k], k % n, &w[k])
                    : kind == 2 ? pdp_comm_reduce_scatter(c, d[k], r2[k], cnt[k],
                                                          PDP_REDUCE_SUM, &w[k])
                                : pdp_comm_allgather(c, d[k], r2[k], cnt[k], &w[k]),
                "launch");
    }
    for (k = CONF_ASYNC - 1; k >= 0; k--) /* in reverse order */
        if (w[k] && !conf_ok(rk, pdp_work_wait(w[k]), "pdp_work_wait (reverse order)")) w[k] = 0;
    for (k = 0; k < CONF_ASYNC && rk->st == PDP_OK; k++) {
        int kind = k % 4;
        int64_t m = kind == 3 ? cnt[k] * n : cnt[k];
        if (!conf_back(rk, c, h[k], kind >= 2 ? r2[k] : d[k], m, 4)) break;
        for (i = 0; i < m; i++) {
            float want = kind == 0 ? conf_sum(n, i + k)
                       : kind == 1 ? conf_val(k % n, i + k)
                       : kind == 2 ? conf_sum(n, rk->rank * cnt[k] + i + k)
                                   : conf_val((int)(i / cnt[k]), i % cnt[k] + k);
            if (h[k][i] != want) {
                conf_fail(rk, "collective %d (kind %d, count %lld), waited out of order: element "
                          "%lld is %g, want %g", k, kind, (long long)cnt[k], (long long)i,
                          (double)h[k][i], (double)want);
                break;
            }
        }
    }
    for (k = 0; k < CONF_ASYNC; k++) {
        if (d[k]) rk->f->release(c, d[k]);
        if (r2[k]) rk->f->release(c, r2[k]);
        free(h[k]);
    }
    /* an all-reduce completes while its rank only asks pdp_work_done */
    {
        float v[3] = {1.0f, 2.0f, 3.0f}, *dv = (float *)conf_dev(rk, c, v, 3, 4);
        pdp_work *x = NULL;
        if (dv && conf_ok(rk, pdp_comm_allreduce(c, dv, 3, PDP_REDUCE_SUM, &x), "allreduce")) {
            t0 = conf_now();
            while (!pdp_work_done(x) && conf_now() - t0 < 20.0) {
                struct timespec ts = {0, 1000000};
                nanosleep(&ts, NULL);
            }
            q = pdp_work_done(x);
            if (conf_ok(rk, pdp_work_wait(x), "wait after done") && !q)
                conf_fail(rk, "pdp_work_done never became true in 20 s");
            if (conf_back(rk, c, v, dv, 3, 4) && v[2] != 3.0f * (float)n)
                conf_fail(rk, "all-reduce completed by polling: %g, want %g", (double)v[2],
                          3.0 * n);
        }
        if (dv) rk->f->release(c, dv);
    }
}

CONF_CASE(conf_async_handles_waited_out_of_order)
{
    int n;
    CONF_EACH_SIZE(n) CHECK_CALL(conf_check(f, n, 60.0, conf_rank_async, 0));
    PASS();
}

/* ---- barrier ---- */

/* Rank 0 arrives 100 ms late: no rank leaves the barrier before rank 0 entered it. Each
   rank times from its own start, which a loaded machine may delay after rank 0's (a rank
   left after 85 ms of a correct barrier there): a barrier that waits for no one returns in
   well under a millisecond, so leaving after less than half the delay fails. */
static void conf_rank_barrier(conf_rank *rk, pdp_comm *c)
{
    double t0;
    rk->f->sync(rk);
    t0 = conf_now();
    if (rk->rank == 0) {
        struct timespec ts = {0, 100000000};
        nanosleep(&ts, NULL);
    }
    if (conf_ok(rk, pdp_comm_barrier(c, NULL), "barrier") && conf_now() - t0 < 0.05)
        conf_fail(rk, "left the barrier after %.3f s, before rank 0 arrived (0.1 s)",
                  conf_now() - t0);
}

CONF_CASE(conf_barrier_waits_for_every_rank)
{
    int n;
    CONF_EACH_SIZE(n) CHECK_CALL(conf_check(f, n, 60.0, conf_rank_barrier, 0));
    PASS();
}

/* ---- point-to-point ---- */

#define CONF_P2P 1001

/* Every rank sends to the next (tag 7) and to itself (tag 3), and receives both, all
   four posted before any wait (sends first); round 1 then issues an all-reduce after the
   messages and waits it first. Stats: p2p counts messages, bytes_sent the sends' bytes. */
static void conf_rank_ring(conf_rank *rk, pdp_comm *c)
{
    int r = rk->rank, n = rk->size, next = (r + 1) % n, prev = (r + n - 1) % n, round, k;
    float *h = conf_host(CONF_P2P), *s7, *s3, *r7, *r3, *ar;
    pdp_comm_stats s0;
    int64_t i;
    pdp_work *w[5];
    pdp_comm_get_stats(c, &s0);
    for (i = 0; i < CONF_P2P; i++) h[i] = conf_val(r, i);
    s7 = (float *)conf_dev(rk, c, h, CONF_P2P, 4);
    s3 = (float *)conf_dev(rk, c, h, CONF_P2P, 4);
    r7 = (float *)conf_dev(rk, c, NULL, CONF_P2P, 4);
    r3 = (float *)conf_dev(rk, c, NULL, CONF_P2P, 4);
    h[0] = 1.0f;
    ar = (float *)conf_dev(rk, c, h, 1, 4);
    for (round = 0; round < 2 && s7 && s3 && r7 && r3 && ar; round++) {
        memset(w, 0, sizeof w);
        if (!conf_ok(rk, pdp_comm_send(c, s7, CONF_P2P, next, 7, &w[0]), "send to next") ||
            !conf_ok(rk, pdp_comm_send(c, s3, CONF_P2P, r, 3, &w[1]), "send to self") ||
            !conf_ok(rk, pdp_comm_recv(c, r7, CONF_P2P, prev, 7, &w[2]), "recv from prev") ||
            !conf_ok(rk, pdp_comm_recv(c, r3, CONF_P2P, r, 3, &w[3]), "recv from self"))
            break;
        if (round == 1 &&
            (!conf_ok(rk, pdp_comm_allreduce(c, ar, 1, PDP_REDUCE_SUM, &w[4]), "allreduce") ||
             !conf_ok(rk, pdp_work_wait(w[4]), "allreduce after the messages")))
            break;
        for (k = 0; k < 4; k++) conf_ok(rk, pdp_work_wait(w[k]), "message wait");
        if (!conf_back(rk, c, h, r7, CONF_P2P, 4)) break;
        for (i = 0; i < CONF_P2P; i++)
            if (h[i] != conf_val(prev, i)) {
                conf_fail(rk, "round %d: from rank %d element %lld is %g", round, prev,
                          (long long)i, (double)h[i]);
                break;
            }
        if (!conf_back(rk, c, h, r3, CONF_P2P, 4)) break;
        for (i = 0; i < CONF_P2P; i++)
            if (h[i] != conf_val(r, i)) {
                conf_fail(rk, "round %d: from self element %lld is %g", round, (long long)i,
                          (double)h[i]);
                break;
            }
    }
    if (rk->st == PDP_OK && conf_back(rk, c, h, ar, 1, 4) && h[0] != (float)n)
        conf_fail(rk, "the all-reduce among the messages gave %g", (double)h[0]);
    if (rk->st == PDP_OK) conf_stats_moved(rk, c, &s0, 1, 4.0 * CONF_P2P * 4.0 +
                                           conf_b(2.0 * (n - 1.0) / n * 4.0), 8, "ring");
    if (s7) rk->f->release(c, s7);
    if (s3) rk->f->release(c, s3);
    if (r7) rk->f->release(c, r7);
    if (r3) rk->f->release(c, r3);
    if (ar) rk->f->release(c, ar);
    free(h);
}

CONF_CASE(conf_p2p_ring_and_self_send)
{
    int n;
    CONF_EACH_SIZE(n) CHECK_CALL(conf_check(f, n, 60.0, conf_rank_ring, 0));
    PASS();
}

/* A batch (pdp_comm_sendrecv) both ways round the ring: every rank sends to the next (tag
   7, its handle kept) and to the previous (tag 8, work NULL: waited by the call) and receives
   from both (from the previous NULL, from the next kept), all in one call; twice. On NCCL,
   messages started one by one in that order would each wait on the one stream for a receive
   queued behind a send. Every rank checks both buffers against its neighbours' values and
   the stats (4 messages a batch, the two sends' bytes). Refused before anything is posted: a
   batch above PDP_COMM_BATCH_MAX, and a bad peer in its second message (the first message's
   handle stays NULL). */
static void conf_rank_batch(conf_rank *rk, pdp_comm *c)
{
    int r = rk->rank, n = rk->size, next = (r + 1) % n, prev = (r + n - 1) % n, round;
    float *h = conf_host(CONF_P2P), *s7, *s8, *r7, *r8;
    pdp_comm_stats s0;
    pdp_work *w7 = NULL, *w8 = NULL;
    pdp_p2p ops[PDP_COMM_BATCH_MAX + 1];
    int64_t i;
    pdp_comm_get_stats(c, &s0);
    for (i = 0; i < CONF_P2P; i++) h[i] = conf_val(r, i);
    s7 = (float *)conf_dev(rk, c, h, CONF_P2P, 4);
    for (i = 0; i < CONF_P2P; i++) h[i] = conf_val(r + n, i);
    s8 = (float *)conf_dev(rk, c, h, CONF_P2P, 4);
    r7 = (float *)conf_dev(rk, c, NULL, CONF_P2P, 4);
    r8 = (float *)conf_dev(rk, c, NULL, CONF_P2P, 4);
    memset(ops, 0, sizeof ops);
    ops[0].send = true, ops[0].buf = s7, ops[0].peer = next, ops[0].tag = 7, ops[0].work = &w7;
    ops[1].send = true, ops[1].buf = s8, ops[1].peer = prev, ops[1].tag = 8;
    ops[2].buf = r7, ops[2].peer = prev, ops[2].tag = 7;
    ops[3].buf = r8, ops[3].peer = next, ops[3].tag = 8, ops[3].work = &w8;
    for (i = 0; i < 4; i++) ops[i].count = CONF_P2P;
    for (round = 0; round < 2 && s7 && s8 && r7 && r8; round++) {
        if (!conf_ok(rk, pdp_comm_sendrecv(c, ops, 4), "the batch") ||
            !conf_ok(rk, pdp_work_wait(w7), "the send to next") ||
            !conf_ok(rk, pdp_work_wait(w8), "the recv from next") ||
            !conf_back(rk, c, h, r7, CONF_P2P, 4))
            break;
        for (i = 0; i < CONF_P2P && h[i] == conf_val(prev, i); i++) continue;
        if (i < CONF_P2P || !conf_back(rk, c, h, r8, CONF_P2P, 4)) {
            conf_fail(rk, "round %d: from rank %d (tag 7) element %lld is %g", round, prev,
                      (long long)i, (double)h[i]);
            break;
        }
        for (i = 0; i < CONF_P2P && h[i] == conf_val(next + n, i); i++) continue;
        if (i < CONF_P2P) {
            conf_fail(rk, "round %d: from rank %d (tag 8) element %lld is %g", round, next,
                      (long long)i, (double)h[i]);
            break;
        }
    }
    if (rk->st == PDP_OK)
        conf_stats_moved(rk, c, &s0, 0, 2.0 * 2.0 * CONF_P2P * 4.0, 8, "batch");
    if (rk->st == PDP_OK && s7) {
        for (i = 0; i <= PDP_COMM_BATCH_MAX; i++) ops[i] = ops[2];
        ops[0] = ops[1]; /* a send to prev: never posted */
        ops[0].work = &w7, w7 = (pdp_work *)&w7;
        conf_expect(rk, pdp_comm_sendrecv(c, ops, PDP_COMM_BATCH_MAX + 1), PDP_ERR_INVALID,
                    "a batch of 17", "pdp_comm_sendrecv: 17 messages", NULL, NULL);
        ops[1].peer = n;
        w7 = (pdp_work *)&w7;
        conf_expect(rk, pdp_comm_sendrecv(c, ops, 2), PDP_ERR_INVALID, "a bad peer",
                    "pdp_comm_sendrecv: peer", "outside", NULL);
        if (w7 != NULL) conf_fail(rk, "a refused batch left the first message's handle set");
    }
    if (s7) rk->f->release(c, s7);
    if (s8) rk->f->release(c, s8);
    if (r7) rk->f->release(c, r7);
    if (r8) rk->f->release(c, r8);
    free(h);
}

CONF_CASE(conf_p2p_batch_both_ways_round_the_ring)
{
    int n;
    CONF_EACH_SIZE(n) CHECK_CALL(conf_check(f, n, 60.0, conf_rank_batch, 0));
    PASS();
}

/* After a timed-out message: local and MPI withdrew it, so c still carries a self-send;
   NCCL aborted the communicator, so the self-send fails (backend differs). */
static void conf_still_usable(conf_rank *rk, pdp_comm *c, bool timed_out)
{
    float *b = (float *)conf_dev(rk, c, NULL, 4, 4);
    pdp_work *w = NULL;
    pdp_status st;
    if (!b) return;
    st = pdp_comm_send(c, b, 4, rk->rank, 1, &w);
    if (st == PDP_OK) st = pdp_comm_recv(c, b, 4, rk->rank, 1, NULL);
    if (w) {
        pdp_status s2 = pdp_work_wait(w);
        if (st == PDP_OK) st = s2;
    }
    if (rk->f->backend == PDP_BACKEND_NCCL && timed_out) {
        if (st == PDP_OK) conf_fail(rk, "a self-send after a timed-out message succeeded on an "
                                        "aborted NCCL communicator");
    } else conf_ok(rk, st, "a self-send after the failure (the communicator stays usable)");
    rk->f->release(c, b);
}

/* arg 0: rank 0 sends 7 floats with tag 5, rank 1 receives 5: both counts named, on the
   receiver everywhere; the sender: local fails the same way, MPI's synchronous send is
   matched and truncated on the receiver (PDP_OK on the sender), NCCL's hangs until the
   timeout and aborts. */
static void conf_rank_count_mismatch(conf_rank *rk, pdp_comm *c)
{
    float *b = (float *)conf_dev(rk, c, NULL, 8, 4);
    pdp_status st;
    if (b && rk->rank == 0) {
        st = pdp_comm_send(c, b, 7, 1, 5, NULL);
        if (rk->f->backend == PDP_BACKEND_LOCAL)
            conf_expect(rk, st, PDP_ERR_INVALID, "sender", "pdp_comm_send",
                        "rank 0 sends 7 floats", "rank 1 receives 5");
        else if (rk->f->backend == PDP_BACKEND_MPI) conf_ok(rk, st, "sender");
        else if (st == PDP_OK) conf_fail(rk, "the NCCL sender of a count mismatch succeeded");
    } else if (b && rk->rank == 1) {
        st = pdp_comm_recv(c, b, 5, 0, 5, NULL);
        conf_expect(rk, st, PDP_ERR_INVALID, "receiver", "rank 0 sends 7 floats",
                    "rank 1 receives 5", "tag 5");
    }
    rk->f->sync(rk);
    if (b) rk->f->release(c, b);
}

CONF_CASE(conf_p2p_count_mismatch_names_both_counts)
{
    int n;
    if (f->max_ranks < 2) SKIPm("needs 2 ranks");
    n = CONF_PAIR(f);
    CHECK_CALL(conf_check(f, n, f->timeout_s, conf_rank_count_mismatch, 0));
    PASS();
}

/* A message the other side never matches (timeout T = 1 s):
   arg 0  mismatched tags: rank 0 sends tag 11, rank 1 receives tag 13. local, MPI: both
          time out naming peer and tag (the send also "no matching recv"); NCCL (no tags):
          the receive takes the send, which completes, and fails with PDP_ERR_INVALID
          naming both tags;
   arg 1  an unmatched send: rank 0 sends tag 12, rank 1 posts nothing;
   arg 2  an unmatched receive: rank 1 receives tag 9, rank 0 sends nothing.
   Every timed-out wait fails with PDP_ERR_TIMEOUT naming the peer and the tag, after T
   (MPI's sends: up to T + its 1 s cancel grace). Afterwards local and MPI stay usable,
   NCCL is aborted (conf_still_usable). MPI leaves a timed-out send deliverable (OpenMPI
   never cancels one): rank 1 then receives it (or times out, where an MPI cancels). */
static void conf_rank_unmatched(conf_rank *rk, pdp_comm *c)
{
    const conf_factory *f = rk->f;
    int sc = rk->arg, tag = sc == 0 ? 11 : 12;
    float *b = (float *)conf_dev(rk, c, NULL, 4, 4);
    double t0 = conf_now(), T = rk->timeout_s, el, grace = f->backend == PDP_BACKEND_MPI ? 1.0 : 0.0;
    bool timed_out = false;
    char peer_tag[64], late[64];
    pdp_status st;
    if (b && rk->rank == 0 && sc <= 1) {
        pdp_work *w = NULL;
        snprintf(peer_tag, sizeof peer_tag, "send #0 (count 4) to rank 1 with tag %d", tag);
        snprintf(late, sizeof late, "no matching recv from rank 1 within %g s", T);
        st = pdp_comm_send(c, b, 4, 1, tag, &w);
        if (st == PDP_OK) st = pdp_work_wait(w);
        el = conf_now() - t0;
        if (sc == 0 && f->backend == PDP_BACKEND_NCCL) conf_ok(rk, st, "NCCL send, tag ignored");
        else {
            timed_out = conf_expect(rk, st, PDP_ERR_TIMEOUT, "unmatched send", "pdp_work_wait",
                                    peer_tag, late);
            if (timed_out && (el < 0.9 * T || el > T + grace + 2.0))
                conf_fail(rk, "the send timed out after %.2f s (timeout %g s)", el, T);
        }
    }
    if (b && rk->rank == 1 && sc != 1) {
        int rtag = sc == 0 ? 13 : 9;
        snprintf(peer_tag, sizeof peer_tag, "(count 4) from rank 0 with tag %d", rtag);
        snprintf(late, sizeof late, "no matching send from rank 0 within %g s", T);
        st = pdp_comm_recv(c, b, 4, 0, rtag, NULL);
        el = conf_now() - t0;
        if (sc == 0 && f->backend == PDP_BACKEND_NCCL)
            conf_expect(rk, st, PDP_ERR_INVALID, "NCCL recv of another tag", peer_tag,
                        "tag mismatch: rank 0 sent tag 11", NULL);
        else {
            timed_out = conf_expect(rk, st, PDP_ERR_TIMEOUT, "unmatched recv", peer_tag, late,
                                    NULL);
            if (timed_out && (el < 0.9 * T || el > T + 2.0))
                conf_fail(rk, "the receive timed out after %.2f s (timeout %g s)", el, T);
        }
    }
    rk->f->sync(rk); /* every wait is over before anyone frees or drains */
    if (b && f->backend == PDP_BACKEND_MPI && sc <= 1 && rk->rank == 1) {
        st = pdp_comm_recv(c, b, 4, 0, tag, NULL); /* the abandoned send, still deliverable */
        if (st != PDP_OK && st != PDP_ERR_TIMEOUT) conf_ok(rk, st, "receiving the abandoned send");
    }
    /* backend differs: an NCCL rank whose peer aborted may find the communicator aborted
       too (tests/fake_cuda aborts every rank's; a real peer would hang on it): after a
       timeout only the rank that timed out is checked there */
    if (b && rk->rank <= 1 && rk->st == PDP_OK &&
        (f->backend != PDP_BACKEND_NCCL || sc == 0 || timed_out))
        conf_still_usable(rk, c, timed_out);
    rk->f->sync(rk);
    if (b) rk->f->release(c, b);
}

CONF_CASE(conf_p2p_mismatched_tags_and_unmatched_messages_time_out)
{
    int n, sc;
    if (f->max_ranks < 2) SKIPm("needs 2 ranks");
    n = CONF_PAIR(f);
    for (sc = 0; sc < 3; sc++) CHECK_CALL(conf_check(f, n, f->timeout_s, conf_rank_unmatched, sc));
    PASS();
}

/* ---- process groups ---- */

/* mp: colour rank / 2 (ranks in order); dp: colour rank % 2 with keys reversed; none: the
   last rank joins nothing. All-reduces and a broadcast from group rank 0 in each group
   equal naive loops over its members, a message inside mp uses mp's ranks, each group
   counts only its own, and the communicators are freed parent first. */
static void conf_rank_split(conf_rank *rk, pdp_comm *c)
{
    pdp_comm *mp = NULL, *dp = NULL, *none = c;
    int r = rk->rank, n = rk->size, q, mps = 0, dps = 0, dprank = 0;
    float h[3], *d = NULL;
    pdp_comm_stats s;
    if (!conf_ok(rk, pdp_comm_split(c, r / 2, r, &mp), "split mp") ||
        !conf_ok(rk, pdp_comm_split(c, r % 2, -r, &dp), "split dp") ||
        !conf_ok(rk, pdp_comm_split(c, r == n - 1 ? PDP_COMM_SPLIT_NONE : 0, 0, &none),
                 "split none"))
        goto out;
    for (q = 0; q < n; q++) {
        mps += q / 2 == r / 2;
        if (q % 2 == r % 2) {
            dps++;
            dprank += q > r; /* keys -q: higher old ranks first */
        }
    }
    if (pdp_comm_size(mp) != mps || pdp_comm_rank(mp) != r % 2 || pdp_comm_size(dp) != dps ||
        pdp_comm_rank(dp) != dprank || (r == n - 1) != (none == NULL) ||
        (none && (pdp_comm_size(none) != n - 1 || pdp_comm_rank(none) != r))) {
        conf_fail(rk, "mp %d/%d (want %d/%d), dp %d/%d (want %d/%d), none %p",
                  pdp_comm_rank(mp), pdp_comm_size(mp), r % 2, mps, pdp_comm_rank(dp),
                  pdp_comm_size(dp), dprank, dps, (void *)none);
        goto out;
    }
    for (q = 0; q < 3; q++) {
        pdp_comm *g = q == 0 ? mp : q == 1 ? dp : none;
        float want = 0.0f, bwant = 0.0f, sum[2];
        int k, first = -1;
        if (!g) continue;
        for (k = 0; k < n; k++) {
            bool in = q == 0 ? k / 2 == r / 2 : q == 1 ? k % 2 == r % 2 : k != n - 1;
            if (!in) continue;
            want += conf_val(k, 5);
            if (q == 1 ? first < k : first < 0) first = k; /* group rank 0 */
        }
        bwant = conf_val(first, 9);
        h[0] = conf_val(r, 5);
        h[1] = conf_val(r, 9);
        if (!(d = (float *)conf_dev(rk, c, h, 2, 4))) break;
        if (conf_ok(rk, pdp_comm_allreduce(g, d, 1, PDP_REDUCE_SUM, NULL), "group allreduce") &&
            conf_ok(rk, pdp_comm_broadcast(g, d + 1, 1, 0, NULL), "group broadcast") &&
            conf_back(rk, c, sum, d, 2, 4) && (sum[0] != want || sum[1] != bwant))
            conf_fail(rk, "group %d: all-reduce %g want %g, broadcast %g want %g", q,
                      (double)sum[0], (double)want, (double)sum[1], (double)bwant);
        rk->f->release(c, d);
        d = NULL;
    }
    if (mps == 2) { /* by mp's ranks */
        h[0] = (float)r;
        if ((d = (float *)conf_dev(rk, c, h, 1, 4))) {
            if (pdp_comm_rank(mp) == 0) conf_ok(rk, pdp_comm_send(mp, d, 1, 1, 0, NULL), "mp send");
            else if (conf_ok(rk, pdp_comm_recv(mp, d, 1, 0, 0, NULL), "mp recv") &&
                     conf_back(rk, c, h, d, 1, 4) && h[0] != (float)(r - 1))
                conf_fail(rk, "mp recv got %g, want %d", (double)h[0], r - 1);
            rk->f->release(c, d);
        }
    }
    pdp_comm_get_stats(mp, &s);
    if (rk->st == PDP_OK && (s.collectives != 2 || s.p2p != (mps == 2)))
        conf_fail(rk, "mp's stats: %lld collectives, %lld messages", (long long)s.collectives,
                  (long long)s.p2p);
out:
    pdp_comm_free(c); /* any order: the parent first */
    rk->freed = true;
    pdp_comm_free(dp);
    pdp_comm_free(none == c ? NULL : none);
    pdp_comm_free(mp);
}

CONF_CASE(conf_split_groups_match_naive)
{
    int n;
    CONF_EACH_SIZE(n) CHECK_CALL(conf_check(f, n, 60.0, conf_rank_split, 0));
    PASS();
}

/* ---- count bounds and bad arguments: refused before the backend moves anything ---- */

static void conf_rank_bounds(conf_rank *rk, pdp_comm *c)
{
    const int64_t huge = (int64_t)1 << 62, over = (int64_t)INT32_MAX + 1;
    float *x = (float *)conf_dev(rk, c, NULL, 2, 4);
    pdp_work *w = (pdp_work *)&w;
    pdp_comm *o = c;
    char want[120], limit[120];
    int n = rk->size;
    if (!x) return;
    snprintf(want, sizeof want, "count %lld is too large", (long long)huge);
#define CONF_REFUSED(call, name, s)                                                          \
    do {                                                                                     \
        conf_expect(rk, (call), PDP_ERR_INVALID, name, name ": ", s, "(comm 'conf', rank");   \
        if (strstr(pdp_last_error(), name ": ") != pdp_last_error())                         \
            conf_fail(rk, "%s: the message does not start with the call: %s", name,          \
                      pdp_last_error());                                                     \
    } while (0)
    CONF_REFUSED(pdp_comm_allreduce(c, x, huge, PDP_REDUCE_SUM, &w), "pdp_comm_allreduce", want);
    if (w != NULL) conf_fail(rk, "a refused call left *work set");
    CONF_REFUSED(pdp_comm_allreduce_ex(c, x, huge, PDP_DTYPE_BF16, PDP_REDUCE_SUM, NULL),
                 "pdp_comm_allreduce_ex", want);
    CONF_REFUSED(pdp_comm_broadcast(c, x, huge, 0, NULL), "pdp_comm_broadcast", want);
    CONF_REFUSED(pdp_comm_reduce_scatter(c, x, x + 1, huge, PDP_REDUCE_SUM, NULL),
                 "pdp_comm_reduce_scatter", want);
    CONF_REFUSED(pdp_comm_reduce_scatter_ex(c, x, x + 1, huge, PDP_DTYPE_F16, PDP_REDUCE_AVG,
                                            NULL), "pdp_comm_reduce_scatter_ex", want);
    CONF_REFUSED(pdp_comm_allgather(c, x, x + 1, huge, NULL), "pdp_comm_allgather", want);
    CONF_REFUSED(pdp_comm_send(c, x, huge, rk->rank, 1, NULL), "pdp_comm_send", want);
    CONF_REFUSED(pdp_comm_recv(c, x + 1, huge, rk->rank, 1, NULL), "pdp_comm_recv", want);
    /* the bound is the bytes of the largest buffer: world size x count for these two */
    if (n > 1) {
        int64_t most = (int64_t)(PTRDIFF_MAX / (4 * n));
        snprintf(limit, sizeof limit, "count %lld is too large: %d ranks x", (long long)most + 1,
                 n);
        CONF_REFUSED(pdp_comm_reduce_scatter(c, x, x + 1, most + 1, PDP_REDUCE_SUM, NULL),
                     "pdp_comm_reduce_scatter", limit);
        CONF_REFUSED(pdp_comm_allgather(c, x, x + 1, most + 1, NULL), "pdp_comm_allgather",
                     limit);
    }
    /* backend differs: MPI counts are int; local and NCCL take what the address space does */
    if (rk->f->backend == PDP_BACKEND_MPI) {
        snprintf(limit, sizeof limit, "count %lld is more than the MPI backend takes",
                 (long long)over);
        CONF_REFUSED(pdp_comm_send(c, x, over, rk->rank, 1, NULL), "pdp_comm_send", limit);
        CONF_REFUSED(pdp_comm_recv(c, x, over, rk->rank, 1, NULL), "pdp_comm_recv", limit);
        CONF_REFUSED(pdp_comm_reduce_scatter(c, x, x + 1, over, PDP_REDUCE_SUM, NULL),
                     "pdp_comm_reduce_scatter", limit);
        CONF_REFUSED(pdp_comm_allgather(c, x, x + 1, over, NULL), "pdp_comm_allgather", limit);
    }
    /* the other arguments, by the same rule */
    CONF_REFUSED(pdp_comm_allreduce(c, NULL, 4, PDP_REDUCE_SUM, NULL), "pdp_comm_allreduce",
                 "buf is NULL with count 4");
    CONF_REFUSED(pdp_comm_allreduce(c, x, -1, PDP_REDUCE_SUM, NULL), "pdp_comm_allreduce",
                 "count -1 < 0");
    CONF_REFUSED(pdp_comm_allreduce(c, x, 1, (pdp_reduce_op)7, NULL), "pdp_comm_allreduce",
                 "unknown reduce op 7");
    CONF_REFUSED(pdp_comm_allreduce_ex(c, x, 1, (pdp_dtype)7, PDP_REDUCE_SUM, NULL),
                 "pdp_comm_allreduce_ex", "unknown dtype 7");
    snprintf(limit, sizeof limit, "root %d outside 0..%d", n, n - 1);
    CONF_REFUSED(pdp_comm_broadcast(c, x, 1, n, NULL), "pdp_comm_broadcast", limit);
    snprintf(limit, sizeof limit, "peer %d outside 0..%d", n, n - 1);
    CONF_REFUSED(pdp_comm_send(c, x, 1, n, 0, NULL), "pdp_comm_send", limit);
    CONF_REFUSED(pdp_comm_recv(c, x, 1, 0, -1, NULL), "pdp_comm_recv", "tag -1 outside 0..32767");
#undef CONF_REFUSED
    if (pdp_comm_split(c, -2, 0, &o) != PDP_ERR_INVALID || o != NULL ||
        !strstr(pdp_last_error(), "pdp_comm_split: colour -2"))
        conf_fail(rk, "split with colour -2: %s", pdp_last_error());
    /* nothing was left behind: no handle taken, no message queued, the ranks still agree */
    {
        float one[2] = {1.0f, 2.0f};
        if (conf_ok(rk, rk->f->put(c, x, one, 8), "upload") &&
            conf_ok(rk, pdp_comm_allreduce(c, x, 2, PDP_REDUCE_SUM, NULL), "allreduce after") &&
            conf_back(rk, c, one, x, 2, 4) && one[1] != 2.0f * (float)n)
            conf_fail(rk, "the all-reduce after the refusals gave %g", (double)one[1]);
    }
    rk->f->release(c, x);
}

CONF_CASE(conf_count_bounds_and_bad_arguments)
{
    int n;
    CONF_EACH_SIZE(n) CHECK_CALL(conf_check(f, n, 60.0, conf_rank_bounds, 0));
    PASS();
}

/* ---- a rank that does not arrive ---- */

/* The last rank skips the second all-reduce: the others fail with PDP_ERR_TIMEOUT after
   about T = timeout_s, naming the collective, its sequence number and the communicator,
   and (backend differs) the missing rank on local; MPI and NCCL cannot know which rank is
   missing and name this one. The communicator is then broken: a barrier fails at once.
   The missing rank then arrives late (MPI completes the orphaned requests that way so
   every rank frees cleanly; its result is not checked: local fails it at once), except
   on NCCL, where the others have aborted the collective and it could only hang. */
static void conf_rank_missing(conf_rank *rk, pdp_comm *c)
{
    int n = rk->size, late = rk->rank == n - 1;
    float h[4] = {1, 2, 3, 4}, *d = (float *)conf_dev(rk, c, h, 4, 4);
    double T = rk->timeout_s, t0, el;
    char who[64];
    pdp_status st;
    if (d) conf_ok(rk, pdp_comm_allreduce(c, d, 4, PDP_REDUCE_SUM, NULL), "the first allreduce");
    if (!late && d) {
        t0 = conf_now();
        st = pdp_comm_allreduce(c, d, 4, PDP_REDUCE_SUM, NULL);
        el = conf_now() - t0;
        if (rk->f->backend == PDP_BACKEND_LOCAL)
            snprintf(who, sizeof who, "rank %d", n - 1);
        else snprintf(who, sizeof who, "rank %d of %d", rk->rank, n);
        /* backend differs: at 3 or more NCCL ranks, a peer that timed out first may have
           aborted the communicator under this rank (PDP_ERR_COMM naming the abort) */
        if (rk->f->backend == PDP_BACKEND_NCCL && n > 2 && st == PDP_ERR_COMM)
            conf_expect(rk, st, PDP_ERR_COMM, "a missing rank", "allreduce #1", "'conf'",
                        "aborted");
        else if (conf_expect(rk, st, PDP_ERR_TIMEOUT, "a missing rank", "allreduce #1",
                             "'conf'", who) &&
                 (el < 0.9 * T || el > T + 2.0))
            conf_fail(rk, "timed out after %.2f s (timeout %g s)", el, T);
        t0 = conf_now();
        st = pdp_comm_barrier(c, NULL);
        if (st == PDP_OK || conf_now() - t0 > 0.5)
            conf_fail(rk, "a barrier on the broken communicator: %s after %.2f s",
                      pdp_status_name(st), conf_now() - t0);
    }
    rk->f->sync(rk);
    if (late && d && rk->f->backend != PDP_BACKEND_NCCL) /* NCCL: the others aborted */
        (void)pdp_comm_allreduce(c, d, 4, PDP_REDUCE_SUM, NULL);
    rk->f->sync(rk);
    if (d) rk->f->release(c, d);
}

CONF_CASE(conf_missing_rank_times_out_naming_it)
{
    if (f->max_ranks < 2) SKIPm("needs 2 ranks");
    CHECK_CALL(conf_check(f, CONF_PAIR(f), f->timeout_s, conf_rank_missing, 0));
    if (f->max_ranks > CONF_PAIR(f)) /* and the most ranks */
        CHECK_CALL(conf_check(f, f->max_ranks, f->timeout_s, conf_rank_missing, 0));
    PASS();
}

/* Every case, on factory f. */
static void conf_run_suite(const conf_factory *f)
{
    RUN_TEST1(conf_allreduce_sum_avg_odd_counts, f);
    RUN_TEST1(conf_rank_order_bits, f);
    RUN_TEST1(conf_broadcast_from_every_root, f);
    RUN_TEST1(conf_reduce_scatter_odd_and_zero_counts, f);
    RUN_TEST1(conf_allgather_odd_and_zero_counts, f);
    RUN_TEST1(conf_16bit_follow_the_stated_rounding, f);
    RUN_TEST1(conf_async_handles_waited_out_of_order, f);
    RUN_TEST1(conf_barrier_waits_for_every_rank, f);
    RUN_TEST1(conf_p2p_ring_and_self_send, f);
    RUN_TEST1(conf_p2p_batch_both_ways_round_the_ring, f);
    RUN_TEST1(conf_p2p_count_mismatch_names_both_counts, f);
    RUN_TEST1(conf_p2p_mismatched_tags_and_unmatched_messages_time_out, f);
    RUN_TEST1(conf_split_groups_match_naive, f);
    RUN_TEST1(conf_count_bounds_and_bad_arguments, f);
    RUN_TEST1(conf_missing_rank_times_out_naming_it, f);
}

#endif /* COMM_CONFORMANCE_H */
