/* base: status names, the thread-local error message, aligned allocation, the clock
   (pdp__now). */

#include "internal.h"

static PDP__THREAD_LOCAL char pdp__errbuf[1024];

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
PDP_API void pdp_clear_error(void) { pdp__errbuf[0] = '\0'; }
PDP_API const char *pdp_version_string(void) { return PDP_VERSION_STRING; }

PDP__PRIVATE pdp_status pdp__err(pdp_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pdp__errbuf, sizeof pdp__errbuf, fmt, ap);
    va_end(ap);
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

PDP__PRIVATE double pdp__now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
