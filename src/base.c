/* base: the tests' knobs, status names, the thread-local error message, aligned allocation. */

#include "internal.h"

/* Test knobs: sizes pdp's tests make small, so that their small shapes take the paths big
   ones take (test_layers: Conv2d chunks, element-wise splits, row-sum chunks), and the
   Conv2d bf16 path test_bf16 forces. PDP__TEST_KNOB(name, value) is the constant value in
   every user's build; in the tests' implementation object (PDP__TEST_LINKAGE, the Makefile)
   it is pdp__test_knobs.name when the test has set it (its main thread, between calls into
   the library), value while it is 0. Each use sits where a call sets up its work, outside
   the loops. */
#ifdef PDP__TEST_LINKAGE
typedef struct pdp__test_knob_set {
    int64_t conv_chunk_floats, conv_implicit_chunk, elemwise_par_min, sum_chunk_floats;
    int64_t conv_bf16_path; /* a pdp_bf16_path */
} pdp__test_knob_set;
PDP__PRIVATE pdp__test_knob_set pdp__test_knobs = {0};
#  define PDP__TEST_KNOB(name, value) (pdp__test_knobs.name ? pdp__test_knobs.name : (value))
#else
#  define PDP__TEST_KNOB(name, value) (value)
#endif

#ifndef PDP__TLS_KEY
static PDP__THREAD_LOCAL char pdp__errbuf[1024];
static PDP__THREAD_LOCAL bool pdp__errpeer; /* the message points at another rank's */
#else
/* ---- base: per-thread state without a TLS keyword (tcc) ----
   One struct a thread under a key (platform.h), allocated on the thread's first use and freed
   when it exits; a thread whose struct cannot be allocated shares the static one. The
   thread-local variables of base.c and threads.c name its fields. */
typedef struct pdp__tls {
    char errbuf[1024];
    bool errpeer;
    int num_threads;
    pdp__profile_state prof;
} pdp__tls;

static pdp__once pdp__tls_once = PDP__ONCE_INIT;
static pdp__tls_key pdp__tls_key_;

PDP__PRIVATE void PDP__STDCALL pdp__tls_free(void *p) { PDP_FREE(p); }
PDP__PRIVATE void pdp__tls_init(void) { (void)pdp__tls_key_create(&pdp__tls_key_, pdp__tls_free); }

PDP__PRIVATE pdp__tls *pdp__tls_get(void)
{
    static pdp__tls shared;
    pdp__tls *t;
    pdp__once_run(&pdp__tls_once, pdp__tls_init);
    t = (pdp__tls *)pdp__tls_get_value(pdp__tls_key_);
    if (t) return t;
    t = (pdp__tls *)PDP_MALLOC(sizeof *t);
    if (!t) return &shared;
    memset(t, 0, sizeof *t);
    if (pdp__tls_set_value(pdp__tls_key_, t) != 0) {
        PDP_FREE(t);
        return &shared;
    }
    return t;
}

#  define pdp__errbuf (pdp__tls_get()->errbuf)
#  define pdp__errpeer (pdp__tls_get()->errpeer)
#endif

PDP_API const char *pdp_status_name(pdp_status s)
{
    switch (s) {
#define PDP__STATUS_CASE(name, value, text) case name: return #name;
        PDP_STATUS_LIST(PDP__STATUS_CASE)
#undef PDP__STATUS_CASE
    default: return "PDP_UNKNOWN_STATUS";
    }
}

PDP_API const char *pdp_last_error(void) { return pdp__errbuf; }
PDP_API void pdp_clear_error(void)
{
    pdp__errbuf[0] = '\0';
    pdp__errpeer = false;
}
PDP_API const char *pdp_version_string(void) { return PDP_VERSION_STRING; }

PDP__PRIVATE pdp_status pdp__err_set(pdp_status status, bool peer, const char *fmt, va_list ap)
{
    vsnprintf(pdp__errbuf, sizeof pdp__errbuf, fmt, ap);
    pdp__errpeer = peer;
    return status;
}

PDP__PRIVATE pdp_status pdp__err(pdp_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    status = pdp__err_set(status, false, fmt, ap);
    va_end(ap);
    return status;
}

/* pdp__err for a rank that fails because another did ("rank 1 could not load it"): the
   cause is that rank's message, so pdp_launch reports that one (pdp__err_is_peer), whichever
   rank returned first. pdp__err_wrap keeps the mark. */
PDP__PRIVATE pdp_status pdp__err_peer(pdp_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    status = pdp__err_set(status, true, fmt, ap);
    va_end(ap);
    return status;
}

PDP__PRIVATE bool pdp__err_is_peer(void) { return pdp__errpeer; }

PDP__PRIVATE void pdp__err_keep(pdp__err_kept *k)
{
    snprintf(k->msg, sizeof k->msg, "%s", pdp__errbuf);
    k->peer = pdp__errpeer;
}

PDP__PRIVATE pdp_status pdp__err_restore(pdp_status status, const pdp__err_kept *k)
{
    snprintf(pdp__errbuf, sizeof pdp__errbuf, "%s", k->msg);
    pdp__errpeer = k->peer;
    return status;
}

PDP__PRIVATE pdp_status pdp__err_wrap(pdp_status status, const char *fmt, ...)
{
    char prefix[256];
    size_t n, old = strlen(pdp__errbuf), cap = sizeof pdp__errbuf;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    n = strlen(prefix);
    if (n + 2 >= cap) n = cap - 3;
    if (old > cap - 1 - n - 2) old = cap - 1 - n - 2;
    memmove(pdp__errbuf + n + 2, pdp__errbuf, old); /* "prefix: " + old message */
    memcpy(pdp__errbuf, prefix, n);
    pdp__errbuf[n] = ':';
    pdp__errbuf[n + 1] = ' ';
    pdp__errbuf[n + 2 + old] = '\0';
    return status;
}

PDP__PRIVATE void *pdp__alloc(size_t bytes)
{
    unsigned char *raw = (unsigned char *)PDP_MALLOC(bytes + PDP__ALIGN + sizeof(void *));
    uintptr_t p;
    if (!raw) return NULL;
    p = ((uintptr_t)(raw + sizeof(void *)) + PDP__ALIGN - 1) & ~(uintptr_t)(PDP__ALIGN - 1);
    ((void **)p)[-1] = raw;
    return (void *)p;
}

PDP__PRIVATE void *pdp__calloc(size_t bytes)
{
    void *p = pdp__alloc(bytes);
    if (p) memset(p, 0, bytes);
    return p;
}

PDP__PRIVATE void pdp__dealloc(void *p)
{
    if (p) PDP_FREE(((void **)p)[-1]);
}
