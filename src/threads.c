/* threads: the intra-op thread pool behind pdp_set_num_threads, and per-thread scratch.

   The thread count is a per-thread setting (a thread-local int, default 1): each
   DP worker or thread-rank chooses its own, and nothing a thread sets is seen by
   another. The workers themselves are shared: one process-wide pool of persistent
   POSIX threads, the single piece of process-wide state in pdp (OpenBLAS and every
   OpenMP runtime keep the same kind of pool). It is created lazily by the first
   pdp__parallel_for that needs it, grows when a caller asks for more threads than
   it has, is reused by every later call, and is joined by pdp_shutdown_threads
   (after which the next call starts it again).

   Handing off work: a caller that wins pool.busy (pthread_mutex_trylock) writes the
   job under pool.lock, bumps the generation and broadcasts pool.wake; worker w runs
   index w + 1, the caller runs index 0 itself, then waits until the pending count
   reaches zero. Waking a sleeping thread costs tens of microseconds (more than a
   small GEMM's share on a VM), and a training step hands off work every few
   microseconds to milliseconds, so both sides spin a little before they sleep: a
   worker that finished a job watches the generation for PDP__SPIN_S before it
   sleeps on pool.wake, and the caller watches pending for as long before it sleeps
   on pool.done (OpenMP runtimes and OpenBLAS spin the same way, longer). The two
   values watched outside the lock, generation and pending (and stop), are only
   ever written with atomic stores, under the lock; everything else is read under
   it, so the pool is TSan clean. A caller that loses the trylock (another thread is
   using the pool, e.g. two DP workers in GEMM at once, or a nested call from inside
   a job) runs every index itself, in order. Which thread runs an index never
   changes what the index computes, so results do not depend on who won.

   Profile: while the caller's counters are on (pdp_profile_start), the job carries a
   pointer to them; each worker adds the seconds it spent in its index under the lock
   it takes anyway to report, and the caller adds the time it waited for them.

   Scratch: pdp__thread_scratch() gives each thread one growing 64-byte aligned
   buffer (GEMM packs its panels there), kept in a pthread key whose destructor
   frees it when the thread exits; pdp_shutdown_threads frees the caller's. */

#include "internal.h"
#include <unistd.h>

#define PDP__MAX_THREADS 256
#ifndef PDP__SPIN_S
#  define PDP__SPIN_S 100e-6
#endif

/* ---- threads: the per-thread setting ---- */

static PDP__THREAD_LOCAL int pdp__num_threads; /* 0: never set, which means 1 */

PDP_API pdp_status pdp_set_num_threads(int n)
{
    if (n <= 0) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        n = cores > 0 ? (int)PDP__MIN(cores, (long)PDP__MAX_THREADS) : 1;
    }
    if (n > PDP__MAX_THREADS)
        return pdp__err(PDP_ERR_INVALID, "pdp_set_num_threads: n = %d exceeds the maximum of %d",
                        n, PDP__MAX_THREADS);
    pdp__num_threads = n;
    return PDP_OK;
}

PDP_API int pdp_get_num_threads(void) { return pdp__num_threads > 0 ? pdp__num_threads : 1; }

PDP__PRIVATE int pdp__threads_for_caller(void) { return pdp_get_num_threads(); }

/* ---- threads: the profile counters (pdp_profile_*) ---- */

static PDP__THREAD_LOCAL pdp__profile_state pdp__prof;

PDP_API void pdp_profile_start(void)
{
    memset(&pdp__prof, 0, sizeof pdp__prof);
    pdp__prof.threads = pdp_get_num_threads();
    pdp__prof.t_start = pdp__now();
    pdp__prof.on = true;
}

PDP_API void pdp_profile_read(pdp_profile *out)
{
    const pdp__profile_state *s = &pdp__prof;
    double counted;
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (s->t_start == 0.0) return; /* never started */
    out->wall_s = (s->on ? pdp__now() : s->t_stop) - s->t_start;
    out->gemm_layers_s = s->gemm_layers_s;
    out->other_layers_s = s->other_layers_s;
    out->loss_s = s->loss_s;
    out->optim_s = s->optim_s;
    counted = s->gemm_layers_s + s->other_layers_s + s->loss_s + s->optim_s;
    out->other_s = PDP__MAX(0.0, out->wall_s - counted);
    out->threads = s->threads;
    out->idle_s = s->threads > 1 ? PDP__MAX(0.0, (double)(s->threads - 1) * out->wall_s -
                                                     s->worker_busy_s + s->join_wait_s)
                                 : 0.0;
}

PDP_API void pdp_profile_stop(pdp_profile *out)
{
    if (pdp__prof.on) pdp__prof.t_stop = pdp__now();
    pdp__prof.on = false;
    pdp_profile_read(out);
}

/* ---- threads: per-thread scratch ---- */

typedef struct pdp__scratch_hdr {
    size_t bytes; /* usable bytes after the header */
} pdp__scratch_hdr;

static pthread_once_t pdp__scratch_once = PTHREAD_ONCE_INIT;
static pthread_key_t pdp__scratch_key;
static int pdp__scratch_key_ok;

PDP__PRIVATE void pdp__scratch_free(void *p) { pdp__dealloc(p); }

PDP__PRIVATE void pdp__scratch_init(void)
{
    pdp__scratch_key_ok = pthread_key_create(&pdp__scratch_key, pdp__scratch_free) == 0;
}

/* This thread's scratch buffer of at least `bytes` bytes (64-byte aligned), or NULL
   when out of memory. Valid until the next call on the same thread; its contents
   are not kept when it grows. Only leaf routines (GEMM) use it, never nested. */
PDP__PRIVATE void *pdp__thread_scratch(size_t bytes)
{
    pdp__scratch_hdr *h;
    pthread_once(&pdp__scratch_once, pdp__scratch_init);
    if (!pdp__scratch_key_ok) return NULL;
    h = (pdp__scratch_hdr *)pthread_getspecific(pdp__scratch_key);
    if (!h || h->bytes < bytes) {
        size_t grown = bytes + bytes / 4 + 4096;
        pdp__dealloc(h);
        pthread_setspecific(pdp__scratch_key, NULL);
        h = (pdp__scratch_hdr *)pdp__alloc(PDP__ALIGN + grown);
        if (!h) return NULL;
        h->bytes = grown;
        pthread_setspecific(pdp__scratch_key, h);
    }
    return (unsigned char *)h + PDP__ALIGN;
}

/* ---- threads: the pool ---- */

PDP__PRIVATE void pdp__spin_while(bool (*still)(const void *ctx), const void *ctx)
{
    double t0 = pdp__now();
    int i;
    while (still(ctx) && pdp__now() - t0 <= PDP__SPIN_S)
        for (i = 0; i < 16; i++) {
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#endif
        }
}

/* The pool. busy is held by the one caller that owns the pool for a job; lock
   guards every field of pdp__the_pool; wake tells workers about a new generation
   (or stop); done tells the caller that pending reached 0. */
static pthread_mutex_t pdp__pool_busy = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t pdp__pool_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pdp__pool_wake = PTHREAD_COND_INITIALIZER;
static pthread_cond_t pdp__pool_done = PTHREAD_COND_INITIALIZER;

typedef struct pdp__pool {
    pthread_t tid[PDP__MAX_THREADS - 1];
    unsigned long start_gen[PDP__MAX_THREADS - 1]; /* generation when worker w was made */
    int nworkers;
    int stop;                 /* atomic stores only (read while spinning) */
    unsigned long generation; /* bumped once per job; atomic stores only */
    void (*fn)(void *arg, int i, int n);
    void *arg;
    int n;       /* indices of the current job; worker w runs index w + 1 */
    int pending; /* workers that have not finished the current job; atomic stores only */
    pdp__profile_state *prof; /* the caller's counters while they are on, else NULL */
} pdp__pool;

static pdp__pool pdp__the_pool; /* zero: no workers yet */

/* pdp__spin_while's conditions: a worker waits for a new generation (or stop), the
   caller for its workers. */
PDP__PRIVATE bool pdp__pool_no_new_job(const void *seen)
{
    return PDP__LOAD_ACQ(&pdp__the_pool.generation) == *(const unsigned long *)seen &&
           !PDP__LOAD_ACQ(&pdp__the_pool.stop);
}

PDP__PRIVATE bool pdp__pool_jobs_pending(const void *unused)
{
    (void)unused;
    return PDP__LOAD_ACQ(&pdp__the_pool.pending) > 0;
}

PDP__PRIVATE void *pdp__worker_main(void *p)
{
    pdp__pool *pool = &pdp__the_pool;
    int w = (int)(intptr_t)p;
    unsigned long seen;
    pthread_mutex_lock(&pdp__pool_lock);
    seen = pool->start_gen[w];
    for (;;) {
        void (*fn)(void *, int, int);
        void *arg;
        pdp__profile_state *prof;
        double t0 = 0.0;
        int n;
        if (pool->generation == seen && !pool->stop) { /* spin a while, then sleep */
            pthread_mutex_unlock(&pdp__pool_lock);
            pdp__spin_while(pdp__pool_no_new_job, &seen);
            pthread_mutex_lock(&pdp__pool_lock);
        }
        while (pool->generation == seen && !pool->stop) pthread_cond_wait(&pdp__pool_wake, &pdp__pool_lock);
        if (pool->stop) break;
        seen = pool->generation;
        fn = pool->fn;
        arg = pool->arg;
        n = pool->n;
        prof = pool->prof;
        if (w + 1 >= n) continue; /* not part of this job */
        pthread_mutex_unlock(&pdp__pool_lock);
        if (prof) t0 = pdp__now();
        fn(arg, w + 1, n);
        pthread_mutex_lock(&pdp__pool_lock);
        if (prof) prof->worker_busy_s += pdp__now() - t0;
        PDP__STORE_REL(&pool->pending, pool->pending - 1);
        if (pool->pending == 0) pthread_cond_signal(&pdp__pool_done);
    }
    pthread_mutex_unlock(&pdp__pool_lock);
    return NULL;
}

/* Makes sure the pool has `want` workers (called with busy held, no job running).
   Stops at the first pthread_create failure: the caller then runs the missing
   indices itself. */
PDP__PRIVATE void pdp__pool_grow(pdp__pool *pool, int want)
{
    want = PDP__MIN(want, PDP__MAX_THREADS - 1);
    while (pool->nworkers < want) {
        int w = pool->nworkers;
        pthread_mutex_lock(&pdp__pool_lock);
        pool->start_gen[w] = pool->generation;
        pthread_mutex_unlock(&pdp__pool_lock);
        if (pthread_create(&pool->tid[w], NULL, pdp__worker_main, (void *)(intptr_t)w) != 0) break;
        pthread_mutex_lock(&pdp__pool_lock);
        pool->nworkers++;
        pthread_mutex_unlock(&pdp__pool_lock);
    }
}

PDP__PRIVATE void pdp__parallel_for(int n, void (*fn)(void *arg, int i, int n), void *arg)
{
    pdp__pool *pool = &pdp__the_pool;
    int i, helpers;
    double t0;
    if (n <= 1) {
        if (n == 1) fn(arg, 0, 1);
        return;
    }
    if (pthread_mutex_trylock(&pdp__pool_busy) != 0) { /* in use: run it all here */
        for (i = 0; i < n; i++) fn(arg, i, n);
        return;
    }
    pdp__pool_grow(pool, n - 1);
    pthread_mutex_lock(&pdp__pool_lock);
    helpers = PDP__MIN(n - 1, pool->nworkers);
    pool->fn = fn;
    pool->arg = arg;
    pool->n = n;
    PDP__STORE_REL(&pool->pending, helpers);
    pool->prof = pdp__prof.on ? &pdp__prof : NULL;
    PDP__STORE_REL(&pool->generation, pool->generation + 1);
    pthread_cond_broadcast(&pdp__pool_wake);
    pthread_mutex_unlock(&pdp__pool_lock);

    fn(arg, 0, n);
    for (i = helpers + 1; i < n; i++) fn(arg, i, n); /* only if workers could not be made */

    t0 = pdp__prof.on ? pdp__now() : 0.0;
    pdp__spin_while(pdp__pool_jobs_pending, NULL); /* a while, then sleep */
    pthread_mutex_lock(&pdp__pool_lock);
    while (pool->pending > 0) pthread_cond_wait(&pdp__pool_done, &pdp__pool_lock);
    pool->prof = NULL;
    pthread_mutex_unlock(&pdp__pool_lock);
    pthread_mutex_unlock(&pdp__pool_busy);
    if (pdp__prof.on) pdp__prof.join_wait_s += pdp__now() - t0;
}

PDP_API void pdp_shutdown_threads(void)
{
    pdp__pool *pool = &pdp__the_pool;
    int w, nworkers;
    pthread_mutex_lock(&pdp__pool_busy); /* waits for a job in flight to finish */
    pthread_mutex_lock(&pdp__pool_lock);
    PDP__STORE_REL(&pool->stop, 1);
    nworkers = pool->nworkers;
    pthread_cond_broadcast(&pdp__pool_wake);
    pthread_mutex_unlock(&pdp__pool_lock);
    for (w = 0; w < nworkers; w++) pthread_join(pool->tid[w], NULL);
    pthread_mutex_lock(&pdp__pool_lock);
    PDP__STORE_REL(&pool->stop, 0);
    pool->nworkers = 0;
    pthread_mutex_unlock(&pdp__pool_lock);
    pthread_mutex_unlock(&pdp__pool_busy);

    pthread_once(&pdp__scratch_once, pdp__scratch_init);
    if (pdp__scratch_key_ok) {
        pdp__dealloc(pthread_getspecific(pdp__scratch_key));
        pthread_setspecific(pdp__scratch_key, NULL);
    }
}
