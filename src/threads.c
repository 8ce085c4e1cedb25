/* threads: the worker team, the intra-op thread pool behind pdp_set_num_threads, and
   per-thread scratch.

   The team (pdp__team, declared in internal.h) is the one hand-off between a caller
   and persistent worker threads; the pool below and DataParallel's workers (dp.c)
   are both built on it. The caller writes the job under team.lock, bumps the
   generation and broadcasts team.wake; member i runs index i, the caller runs index
   0 itself (and any index no member exists for), then waits until the pending count
   reaches zero. Waking a sleeping thread costs tens of microseconds (more than a
   small GEMM's share on a VM), and a training step hands off work every few
   microseconds to milliseconds, so both sides spin a little before they sleep: a
   member that finished a job watches the generation for PDP__SPIN_S before it
   sleeps on team.wake, and the caller watches pending for as long before it sleeps
   on team.done (OpenMP runtimes and OpenBLAS spin the same way, longer). The values
   watched outside the lock, generation and pending (and stop), are only ever
   written with atomic stores, under the lock; everything else is read under it, so
   the team is TSan clean.

   The thread count is a per-thread setting (a thread-local int, default 1): each
   DP worker or thread-rank chooses its own, and nothing a thread sets is seen by
   another. The pool's workers themselves are shared: one process-wide team of
   persistent threads (platform.h: POSIX or Win32) (OpenBLAS and every OpenMP runtime keep the same kind of
   pool). The pool and the scratch key below are two of pdp's few pieces of
   process-wide state; the manual lists them all (THREADS AND DETERMINISM: also the
   trace sink, the bf16 path's CPU features and AMX permission, MPI's ownership record
   and each CUDA device's stream, handle and caches). It is started lazily by the first
   pdp__parallel_for that needs it, grows when a caller asks for more threads than it has, is reused
   by every later call, and is joined by pdp_shutdown_threads (after which the next
   call starts it again). A caller that wins pool.busy (pdp__mutex_trylock) owns
   the team for one job; a caller that loses it (another thread is using the pool,
   e.g. two DP workers in GEMM at once, or a nested call from inside a job) runs
   every index itself, in order. Which thread runs an index never changes what the
   index computes, so results do not depend on who won.

   Profile: while the caller's counters are on (pdp_profile_start), the job is
   wrapped so that each member times its index in its own slot; after the join the
   caller adds those to worker_busy_s, and the time it waited for them (from the end
   of its own indices) to join_wait_s.

   Scratch: pdp__thread_scratch() gives each thread one growing 64-byte aligned
   buffer (GEMM packs its panels there), kept in a thread-local key (platform.h) whose destructor
   frees it when the thread exits; pdp_shutdown_threads frees the caller's. */

#include "internal.h"

#define PDP__MAX_THREADS 256
#ifndef PDP__SPIN_S
#  define PDP__SPIN_S 100e-6
#endif

/* ---- threads: the per-thread setting ---- */

#ifndef PDP__TLS_KEY
static PDP__THREAD_LOCAL int pdp__num_threads; /* 0: never set, which means 1 */
#else
#  define pdp__num_threads (pdp__tls_get()->num_threads)
#endif

PDP_API pdp_status pdp_set_num_threads(int n)
{
    if (n <= 0) {
        n = PDP__MIN(pdp__cpu_count(), PDP__MAX_THREADS);
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

#ifndef PDP__TLS_KEY
static PDP__THREAD_LOCAL pdp__profile_state pdp__prof;
#else
#  define pdp__prof (pdp__tls_get()->prof)
#endif

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

static pdp__once pdp__scratch_once = PDP__ONCE_INIT;
static pdp__tls_key pdp__scratch_key;
static int pdp__scratch_key_ok;

PDP__PRIVATE void PDP__STDCALL pdp__scratch_free(void *p) { pdp__dealloc(p); }

PDP__PRIVATE void pdp__scratch_init(void)
{
    pdp__scratch_key_ok = pdp__tls_key_create(&pdp__scratch_key, pdp__scratch_free) == 0;
}

/* This thread's scratch buffer of at least `bytes` bytes (64-byte aligned), or NULL
   when out of memory. Valid until the next call on the same thread; its contents
   are not kept when it grows. Only leaf routines (GEMM) use it, never nested. */
PDP__PRIVATE void *pdp__thread_scratch(size_t bytes)
{
    pdp__scratch_hdr *h;
    pdp__once_run(&pdp__scratch_once, pdp__scratch_init);
    if (!pdp__scratch_key_ok) return NULL;
    h = (pdp__scratch_hdr *)pdp__tls_get_value(pdp__scratch_key);
    if (!h || h->bytes < bytes) {
        size_t grown = bytes + bytes / 4 + 4096;
        pdp__dealloc(h);
        pdp__tls_set_value(pdp__scratch_key, NULL);
        h = (pdp__scratch_hdr *)pdp__alloc(PDP__ALIGN + grown);
        if (!h) return NULL;
        h->bytes = grown;
        pdp__tls_set_value(pdp__scratch_key, h);
    }
    return (unsigned char *)h + PDP__ALIGN;
}

/* ---- threads: the pool ---- */

PDP__PRIVATE void pdp__spin_while(bool (*still)(const void *ctx), const void *ctx)
{
    double t0 = pdp__now();
    int i;
    while (still(ctx) && pdp__now() - t0 <= PDP__SPIN_S)
        for (i = 0; i < 16; i++) PDP__PAUSE();
}

/* ---- threads: the worker team ---- */

/* pdp__spin_while's conditions: a member waits for a new generation (or stop), the
   caller for its members. */
typedef struct pdp__team_wait {
    const pdp__team *team;
    unsigned long seen;
} pdp__team_wait;

PDP__PRIVATE bool pdp__team_no_new_job(const void *ctx)
{
    const pdp__team_wait *c = (const pdp__team_wait *)ctx;
    return PDP__LOAD_ACQ(&c->team->generation) == c->seen && !PDP__LOAD_ACQ(&c->team->stop);
}

PDP__PRIVATE bool pdp__team_pending(const void *team)
{
    return PDP__LOAD_ACQ(&((const pdp__team *)team)->pending) > 0;
}

PDP__PRIVATE void *pdp__team_main(void *p)
{
    const pdp__team_member *me = (const pdp__team_member *)p;
    pdp__team *t = me->team;
    pdp__team_wait c;
    c.team = t;
    pdp__mutex_lock(&t->lock);
    c.seen = me->start_gen;
    for (;;) {
        void (*fn)(void *, int, int);
        void *arg;
        int n;
        if (t->generation == c.seen && !t->stop) { /* spin a while, then sleep */
            pdp__mutex_unlock(&t->lock);
            pdp__spin_while(pdp__team_no_new_job, &c);
            pdp__mutex_lock(&t->lock);
        }
        while (t->generation == c.seen && !t->stop) pdp__cond_wait(&t->wake, &t->lock);
        if (t->stop) break;
        c.seen = t->generation;
        fn = t->fn;
        arg = t->arg;
        n = t->n;
        if (me->index >= n) continue; /* not part of this job */
        pdp__mutex_unlock(&t->lock);
        fn(arg, me->index, n);
        pdp__mutex_lock(&t->lock);
        PDP__STORE_REL(&t->pending, t->pending - 1);
        if (t->pending == 0) pdp__cond_signal(&t->done);
    }
    pdp__mutex_unlock(&t->lock);
    return NULL;
}

PDP__PRIVATE int pdp__team_init(pdp__team *t)
{
    int rc;
    memset(t, 0, sizeof *t);
    if ((rc = pdp__mutex_init(&t->lock)) != 0) return rc;
    if ((rc = pdp__cond_init(&t->wake)) != 0) {
        pdp__mutex_destroy(&t->lock);
        return rc;
    }
    if ((rc = pdp__cond_init(&t->done)) != 0) {
        pdp__cond_destroy(&t->wake);
        pdp__mutex_destroy(&t->lock);
        return rc;
    }
    t->ok = true;
    return 0;
}

PDP__PRIVATE int pdp__team_grow(pdp__team *t, int workers)
{
    int rc = 0;
    if (!t->ok) return EINVAL;
    workers = PDP__MIN(workers, PDP__TEAM_MAX - 1);
    while (t->nworkers < workers) {
        int w = t->nworkers;
        pdp__team_member *m = &t->member[w];
        pdp__mutex_lock(&t->lock);
        m->team = t;
        m->index = w + 1;
        m->start_gen = t->generation;
        pdp__mutex_unlock(&t->lock);
        if ((rc = pdp__thread_create(&t->tid[w], pdp__team_main, m)) != 0) break;
        pdp__mutex_lock(&t->lock);
        t->nworkers++;
        pdp__mutex_unlock(&t->lock);
    }
    return rc;
}

PDP__PRIVATE void pdp__team_run(pdp__team *t, int n, void (*fn)(void *arg, int i, int n), void *arg)
{
    int i, helpers;
    if (n <= 1 || !t->ok) { /* nothing to hand off (or no team): all on this thread */
        for (i = 0; i < n; i++) fn(arg, i, n);
        return;
    }
    pdp__mutex_lock(&t->lock);
    helpers = PDP__MIN(n - 1, t->nworkers);
    t->fn = fn;
    t->arg = arg;
    t->n = n;
    PDP__STORE_REL(&t->pending, helpers);
    PDP__STORE_REL(&t->generation, t->generation + 1);
    pdp__cond_broadcast(&t->wake);
    pdp__mutex_unlock(&t->lock);

    fn(arg, 0, n);
    for (i = helpers + 1; i < n; i++) fn(arg, i, n); /* only if members could not be made */

    pdp__spin_while(pdp__team_pending, t); /* a while, then sleep */
    pdp__mutex_lock(&t->lock);
    while (t->pending > 0) pdp__cond_wait(&t->done, &t->lock);
    pdp__mutex_unlock(&t->lock);
}

PDP__PRIVATE void pdp__team_free(pdp__team *t)
{
    int w, nworkers;
    if (!t->ok) return;
    pdp__mutex_lock(&t->lock);
    PDP__STORE_REL(&t->stop, 1);
    nworkers = t->nworkers;
    pdp__cond_broadcast(&t->wake);
    pdp__mutex_unlock(&t->lock);
    for (w = 0; w < nworkers; w++) pdp__thread_join(&t->tid[w]);
    pdp__cond_destroy(&t->done);
    pdp__cond_destroy(&t->wake);
    pdp__mutex_destroy(&t->lock);
    t->ok = false;
    t->nworkers = 0;
}

/* ---- threads: the pool ---- */

/* The pool: one team, grown on demand. busy is held by the one caller that owns the
   pool for a job (and by pdp_shutdown_threads); it guards every field below. */
static pdp__mutex pdp__pool_busy = PDP__MUTEX_INIT;

typedef struct pdp__pool {
    pdp__team team;            /* team.ok false: not started (or shut down) */
    /* the job while the caller's profile counters are on: */
    void (*fn)(void *arg, int i, int n);
    void *arg;
    int helpers;               /* indices 1..helpers run on members, the rest on the caller */
    double busy_s[PDP__MAX_THREADS]; /* index i's seconds inside fn, written by its member */
    double caller_done;        /* when the caller finished its last index */
} pdp__pool;

static pdp__pool pdp__the_pool;

/* fork(): the child has the calling thread only, not the pool's workers, and busy or the
   team's lock may have been held, at the fork, by threads the child does not have. Its
   first job then waited forever for members that did not exist (pending never reached 0),
   and pdp_shutdown_threads joined threads that were not its own. In the child the pool is
   forgotten (its lock and conditions are not destroyed: they may be held) and busy made
   free, so that the child's first job starts a team of its own. */
static pdp__once pdp__pool_fork_once = PDP__ONCE_INIT;

PDP__PRIVATE void pdp__pool_after_fork(void)
{
    memset(&pdp__the_pool, 0, sizeof pdp__the_pool);
    pdp__mutex_init(&pdp__pool_busy);
}

PDP__PRIVATE void pdp__pool_fork_init(void) { (void)pdp__at_fork_child(pdp__pool_after_fork); }

/* The job under a profile: a member times its index in its own slot, the caller
   notes when it finished its own; the caller reads both once pdp__team_run has
   returned (which orders the members' writes before it). */
PDP__PRIVATE void pdp__pool_timed(void *p, int i, int n)
{
    pdp__pool *pool = (pdp__pool *)p;
    double t0 = pdp__now();
    pool->fn(pool->arg, i, n);
    if (i == 0 || i > pool->helpers)
        pool->caller_done = pdp__now();
    else
        pool->busy_s[i] = pdp__now() - t0;
}

PDP__PRIVATE void pdp__parallel_for(int n, void (*fn)(void *arg, int i, int n), void *arg)
{
    pdp__pool *pool = &pdp__the_pool;
    int i;
    if (n <= 1) {
        if (n == 1) fn(arg, 0, 1);
        return;
    }
    if (!pdp__mutex_trylock(&pdp__pool_busy)) { /* in use: run it all here */
        for (i = 0; i < n; i++) fn(arg, i, n);
        return;
    }
    /* a team that cannot start, or threads that cannot be made: pdp__team_run has the
       caller run the indices no member runs */
    if (!pool->team.ok) pdp__once_run(&pdp__pool_fork_once, pdp__pool_fork_init);
    if (pool->team.ok || pdp__team_init(&pool->team) == 0) pdp__team_grow(&pool->team, n - 1);
    if (!pdp__prof.on) {
        pdp__team_run(&pool->team, n, fn, arg);
    } else {
        pool->fn = fn;
        pool->arg = arg;
        pool->helpers = pool->team.ok ? PDP__MIN(n - 1, pool->team.nworkers) : 0;
        pdp__team_run(&pool->team, n, pdp__pool_timed, pool);
        for (i = 1; i <= pool->helpers; i++) pdp__prof.worker_busy_s += pool->busy_s[i];
        pdp__prof.join_wait_s += pdp__now() - pool->caller_done;
    }
    pdp__mutex_unlock(&pdp__pool_busy);
}

PDP_API void pdp_shutdown_threads(void)
{
    pdp__mutex_lock(&pdp__pool_busy); /* waits for a job in flight to finish */
    pdp__team_free(&pdp__the_pool.team);
    pdp__mutex_unlock(&pdp__pool_busy);

    pdp__once_run(&pdp__scratch_once, pdp__scratch_init);
    if (pdp__scratch_key_ok) {
        pdp__dealloc(pdp__tls_get_value(pdp__scratch_key));
        pdp__tls_set_value(pdp__scratch_key, NULL);
    }
}
