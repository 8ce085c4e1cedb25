/* platform: the system calls behind platform.h's declarations, POSIX then Win32 in
   each section. Nothing here is on a hot path (the lock and wait wrappers are inline
   in platform.h); each function is a few lines over the system's own. */

#include "internal.h"
#ifdef PDP__POSIX
#  include <dirent.h>
#  include <sched.h>
#  include <sys/stat.h>
#  include <fcntl.h>
#  include <signal.h>
#  include <sys/stat.h>
#  include <netdb.h>
#  include <poll.h>
#  include <sys/socket.h>
#  include <netinet/in.h>
#  include <netinet/tcp.h>
#  include <arpa/inet.h>
#  ifndef MSG_NOSIGNAL
#    define MSG_NOSIGNAL 0 /* BSD and macOS: SO_NOSIGPIPE is set on every socket instead */
#  endif
#endif
#if defined(PDP__X86_CPUID) && !defined(_MSC_VER)
#  include <cpuid.h>
#endif

/* ---- platform: condition variables, threads, once, keys ---- */

#ifdef PDP__POSIX
PDP__PRIVATE int pdp__cond_init(pdp__cond *c)
{
#  if defined(__APPLE__)
    return pthread_cond_init(c, NULL); /* no pthread_condattr_setclock: a relative wait below */
#  else
    pthread_condattr_t ca;
    int rc;
    if ((rc = pthread_condattr_init(&ca)) != 0) return rc;
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    rc = pthread_cond_init(c, &ca);
    pthread_condattr_destroy(&ca);
    return rc;
#  endif
}

PDP__PRIVATE int pdp__cond_timedwait(pdp__cond *c, pdp__mutex *m, double deadline)
{
    struct timespec ts;
    double whole;
#  if defined(__APPLE__)
    double left = deadline - pdp__now();
    if (left <= 0) return ETIMEDOUT;
    whole = floor(left);
    ts.tv_sec = (time_t)whole;
    ts.tv_nsec = (long)((left - whole) * 1e9);
    return pthread_cond_timedwait_relative_np(c, m, &ts);
#  else
    whole = floor(deadline);
    ts.tv_sec = (time_t)whole;
    ts.tv_nsec = (long)((deadline - whole) * 1e9);
    if (ts.tv_nsec >= 1000000000L) ts.tv_nsec = 999999999L;
    return pthread_cond_timedwait(c, m, &ts);
#  endif
}

PDP__PRIVATE int pdp__thread_create(pdp__thread *t, void *(*fn)(void *), void *arg)
{
    return pthread_create(t, NULL, fn, arg);
}

PDP__PRIVATE void pdp__thread_join(pdp__thread *t) { pthread_join(*t, NULL); }

PDP__PRIVATE int pdp__tls_key_create(pdp__tls_key *k, void (*dtor)(void *))
{
    return pthread_key_create(k, dtor);
}
#else
PDP__PRIVATE int pdp__cond_init(pdp__cond *c)
{
    InitializeConditionVariable(c);
    return 0;
}

PDP__PRIVATE int pdp__cond_timedwait(pdp__cond *c, pdp__mutex *m, double deadline)
{
    double left = deadline - pdp__now();
    DWORD ms;
    if (left <= 0) return ETIMEDOUT;
    ms = left >= 4e6 ? (DWORD)4000000000u : (DWORD)ceil(left * 1000.0);
    if (SleepConditionVariableSRW(c, m, ms, 0)) return 0;
    return GetLastError() == ERROR_TIMEOUT ? ETIMEDOUT : EINVAL;
}

PDP__PRIVATE DWORD WINAPI pdp__thread_entry(LPVOID p)
{
    pdp__thread *t = (pdp__thread *)p;
    t->fn(t->arg);
    return 0;
}

PDP__PRIVATE int pdp__thread_create(pdp__thread *t, void *(*fn)(void *), void *arg)
{
    t->fn = fn;
    t->arg = arg;
    t->handle = CreateThread(NULL, 0, pdp__thread_entry, t, 0, NULL);
    return t->handle ? 0 : EAGAIN;
}

PDP__PRIVATE void pdp__thread_join(pdp__thread *t)
{
    WaitForSingleObject(t->handle, INFINITE);
    CloseHandle(t->handle);
    t->handle = NULL;
}

typedef struct pdp__once_box {
    void (*fn)(void);
} pdp__once_box;

PDP__PRIVATE BOOL CALLBACK pdp__once_entry(PINIT_ONCE once, PVOID box, PVOID *ctx)
{
    (void)once;
    (void)ctx;
    ((pdp__once_box *)box)->fn();
    return TRUE;
}

PDP__PRIVATE void pdp__once_run(pdp__once *o, void (*fn)(void))
{
    pdp__once_box box;
    box.fn = fn;
    InitOnceExecuteOnce(o, pdp__once_entry, &box, NULL);
}

PDP__PRIVATE int pdp__tls_key_create(pdp__tls_key *k, void (WINAPI *dtor)(void *))
{
    *k = FlsAlloc(dtor);
    return *k == FLS_OUT_OF_INDEXES ? EAGAIN : 0;
}
#endif

#ifdef PDP__FENCE_BY_LOCK
/* PDP__LOAD_ACQ and PDP__STORE_REL without atomic builtins (platform.h) */
static pdp__mutex pdp__fence_lock = PDP__MUTEX_INIT;

PDP__PRIVATE long long pdp__fence(long long loaded)
{
    pdp__mutex_lock(&pdp__fence_lock);
    pdp__mutex_unlock(&pdp__fence_lock);
    return loaded;
}
#endif

/* ---- platform: time, CPUs, processes ---- */

#ifdef PDP__POSIX
PDP__PRIVATE double pdp__now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

PDP__PRIVATE uint64_t pdp__wall_ns(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0) return 0;
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

PDP__PRIVATE double pdp__thread_cpu_s(void)
{
#  if defined(CLOCK_THREAD_CPUTIME_ID)
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return 0.0;
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
#  else
    return 0.0;
#  endif
}

PDP__PRIVATE void pdp__sleep_s(double seconds)
{
    struct timespec ts;
    if (seconds <= 0) return;
    ts.tv_sec = (time_t)seconds;
    ts.tv_nsec = (long)((seconds - (double)ts.tv_sec) * 1e9);
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

PDP__PRIVATE void pdp__yield(void) { sched_yield(); }

PDP__PRIVATE int pdp__cpu_count(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)PDP__MIN(n, (long)INT32_MAX) : 1;
}

PDP__PRIVATE long pdp__pid(void) { return (long)getpid(); }

PDP__PRIVATE int pdp__at_fork_child(void (*fn)(void)) { return pthread_atfork(NULL, NULL, fn); }

PDP__PRIVATE bool pdp__pid_alive(long pid)
{
    if (pid <= 0 || (long)(pid_t)pid != pid) return true;
    return kill((pid_t)pid, 0) == 0 || errno != ESRCH; /* EPERM: alive, someone else's */
}

/* strerror without its shared buffer: glibc's strerror_r is the GNU variant under
   _GNU_SOURCE (as seen when <string.h> was first included) and XSI otherwise. */
PDP__PRIVATE const char *pdp__errstr(int e, char *buf, size_t cap)
{
#  if defined(__GLIBC__) && defined(__USE_GNU) /* what <features.h> saw, not what is defined now */
    return strerror_r(e, buf, cap);
#  else
    if (strerror_r(e, buf, cap) != 0) snprintf(buf, cap, "errno %d", e);
    return buf;
#  endif
}
#else
PDP__PRIVATE double pdp__now(void)
{
    LARGE_INTEGER freq, t; /* the frequency is fixed at boot and read from user memory */
    QueryPerformanceFrequency(&freq);
    QueryPerformanceCounter(&t);
    return (double)(t.QuadPart / freq.QuadPart) +
           (double)(t.QuadPart % freq.QuadPart) / (double)freq.QuadPart;
}

PDP__PRIVATE uint64_t pdp__wall_ns(void)
{
    FILETIME ft; /* 100 ns ticks since 1601 */
    uint64_t t;
    GetSystemTimeAsFileTime(&ft);
    t = ((uint64_t)ft.dwHighDateTime << 32) | ft.dwLowDateTime;
    return (t - UINT64_C(116444736000000000)) * 100u;
}

PDP__PRIVATE double pdp__thread_cpu_s(void)
{
    FILETIME c, e, k, u;
    if (!GetThreadTimes(GetCurrentThread(), &c, &e, &k, &u)) return 0.0;
    return 1e-7 * (double)((((uint64_t)k.dwHighDateTime << 32) | k.dwLowDateTime) +
                           (((uint64_t)u.dwHighDateTime << 32) | u.dwLowDateTime));
}

PDP__PRIVATE void pdp__sleep_s(double seconds)
{
    if (seconds > 0) Sleep(seconds >= 4e6 ? 4000000000u : (DWORD)ceil(seconds * 1000.0));
}

PDP__PRIVATE void pdp__yield(void) { SwitchToThread(); }

PDP__PRIVATE int pdp__cpu_count(void)
{
    DWORD n = GetActiveProcessorCount(ALL_PROCESSOR_GROUPS);
    return n > 0 ? (int)PDP__MIN(n, (DWORD)INT32_MAX) : 1;
}

PDP__PRIVATE long pdp__pid(void) { return (long)GetCurrentProcessId(); }

PDP__PRIVATE int pdp__at_fork_child(void (*fn)(void))
{
    (void)fn; /* no fork() */
    return 0;
}

PDP__PRIVATE bool pdp__pid_alive(long pid)
{
    HANDLE h;
    DWORD code = 0;
    bool alive;
    if (pid <= 0) return true;
    h = OpenProcess(PROCESS_QUERY_LIMITED_INFORMATION, FALSE, (DWORD)pid);
    if (!h) return GetLastError() != ERROR_INVALID_PARAMETER; /* no such process */
    alive = !GetExitCodeProcess(h, &code) || code == STILL_ACTIVE;
    CloseHandle(h);
    return alive;
}

PDP__PRIVATE const char *pdp__errstr(int e, char *buf, size_t cap)
{
    if (!cap) return buf;
    if (strerror_s(buf, cap, e) != 0 || strncmp(buf, "Unknown error", 13) == 0)
        snprintf(buf, cap, "errno %d", e);
    return buf;
}
#endif

/* ---- platform: files ---- */

#ifdef PDP__POSIX
PDP__PRIVATE int pdp__file_sync(FILE *f)
{
    if (fflush(f) != 0) return -1;
    return fsync(fileno(f));
}

PDP__PRIVATE int pdp__file_replace(const char *from, const char *to) { return rename(from, to); }

PDP__PRIVATE int pdp__file_size(FILE *f, uint64_t *bytes)
{
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) return -1;
    *bytes = (uint64_t)sb.st_size;
    return 0;
}

PDP__PRIVATE int pdp__dir_sync(const char *dir)
{
    int fd = open(dir, O_RDONLY), rc;
    if (fd < 0) return -1;
    rc = fsync(fd);
    if (rc != 0 && (errno == EINVAL || errno == EROFS)) rc = 0; /* not supported there */
    close(fd);
    return rc;
}

PDP__PRIVATE int pdp__dir_open(pdp__dir *d, const char *path)
{
    d->d = opendir(path);
    return d->d ? 0 : -1;
}

PDP__PRIVATE const char *pdp__dir_next(pdp__dir *d)
{
    struct dirent *e;
    errno = 0;
    e = readdir((DIR *)d->d);
    return e ? e->d_name : NULL;
}

PDP__PRIVATE void pdp__dir_close(pdp__dir *d)
{
    if (d->d) closedir((DIR *)d->d);
    d->d = NULL;
}

PDP__PRIVATE int pdp__path_kind(const char *path, bool follow)
{
    struct stat sb;
    if ((follow ? stat(path, &sb) : lstat(path, &sb)) != 0) return -1;
    return S_ISREG(sb.st_mode) ? PDP__PATH_FILE : S_ISDIR(sb.st_mode) ? PDP__PATH_DIR
                                                                      : PDP__PATH_OTHER;
}
#else
/* errno for the Win32 errors a file operation meets */
PDP__PRIVATE int pdp__win_errno(DWORD e)
{
    switch (e) {
    case ERROR_FILE_NOT_FOUND:
    case ERROR_PATH_NOT_FOUND: return ENOENT;
    case ERROR_ACCESS_DENIED:
    case ERROR_SHARING_VIOLATION:
    case ERROR_LOCK_VIOLATION: return EACCES;
    case ERROR_NOT_ENOUGH_MEMORY:
    case ERROR_OUTOFMEMORY: return ENOMEM;
    case ERROR_DISK_FULL:
    case ERROR_HANDLE_DISK_FULL: return ENOSPC;
    case ERROR_INVALID_NAME:
    case ERROR_INVALID_PARAMETER: return EINVAL;
    default: return EIO;
    }
}

PDP__PRIVATE int pdp__file_sync(FILE *f)
{
    HANDLE h;
    if (fflush(f) != 0) return -1;
    h = (HANDLE)_get_osfhandle(_fileno(f));
    if (h == INVALID_HANDLE_VALUE) {
        errno = EBADF;
        return -1;
    }
    if (!FlushFileBuffers(h)) {
        errno = pdp__win_errno(GetLastError());
        return -1;
    }
    return 0;
}

PDP__PRIVATE int pdp__file_replace(const char *from, const char *to)
{
    DWORD e = 0;
    int tries;
    /* the A form reads paths in the ANSI code page, as fopen does. Replacing a file that
       another handle holds (another thread's rename over the same path, a reader) fails
       with a sharing or access error while that handle lives: tried again for up to about
       a second, as such a handle is brief */
    for (tries = 0; tries < 100; tries++) {
        if (MoveFileExA(from, to, MOVEFILE_REPLACE_EXISTING | MOVEFILE_WRITE_THROUGH)) return 0;
        e = GetLastError();
        if (e != ERROR_ACCESS_DENIED && e != ERROR_SHARING_VIOLATION && e != ERROR_LOCK_VIOLATION)
            break;
        Sleep(10);
    }
    errno = pdp__win_errno(e);
    return -1;
}

PDP__PRIVATE int pdp__dir_sync(const char *dir)
{
    (void)dir;
    return 0;
}

PDP__PRIVATE int pdp__file_size(FILE *f, uint64_t *bytes)
{
    HANDLE h = (HANDLE)_get_osfhandle(_fileno(f));
    LARGE_INTEGER size;
    if (h == INVALID_HANDLE_VALUE || GetFileType(h) != FILE_TYPE_DISK ||
        !GetFileSizeEx(h, &size) || size.QuadPart < 0)
        return -1;
    *bytes = (uint64_t)size.QuadPart;
    return 0;
}

PDP__PRIVATE int pdp__dir_open(pdp__dir *d, const char *path)
{
    char pattern[MAX_PATH + 8];
    size_t n = strlen(path);
    d->h = INVALID_HANDLE_VALUE;
    if (n + 3 > sizeof pattern) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(pattern, path, n);
    if (n && !pdp__is_sep(path[n - 1])) pattern[n++] = '\\';
    memcpy(pattern + n, "*", 2);
    d->h = FindFirstFileA(pattern, &d->data);
    if (d->h == INVALID_HANDLE_VALUE) {
        errno = pdp__win_errno(GetLastError());
        return -1;
    }
    d->first = true;
    return 0;
}

PDP__PRIVATE const char *pdp__dir_next(pdp__dir *d)
{
    DWORD e;
    errno = 0;
    if (d->first) {
        d->first = false;
        return d->data.cFileName;
    }
    if (FindNextFileA(d->h, &d->data)) return d->data.cFileName;
    if ((e = GetLastError()) != ERROR_NO_MORE_FILES) errno = pdp__win_errno(e);
    return NULL;
}

PDP__PRIVATE void pdp__dir_close(pdp__dir *d)
{
    if (d->h != INVALID_HANDLE_VALUE) FindClose(d->h);
    d->h = INVALID_HANDLE_VALUE;
}

PDP__PRIVATE int pdp__path_kind(const char *path, bool follow)
{
    DWORD a = GetFileAttributesA(path), type;
    HANDLE h;
    if (a == INVALID_FILE_ATTRIBUTES) {
        errno = pdp__win_errno(GetLastError());
        return -1;
    }
    if (!follow && (a & FILE_ATTRIBUTE_REPARSE_POINT)) return PDP__PATH_OTHER;
    if (a & FILE_ATTRIBUTE_DIRECTORY) return PDP__PATH_DIR;
    /* a device name ("NUL", "CON", "COM1") has a file's attributes: its handle's type
       tells (no access asked; a path that will not open is left to the caller's open) */
    h = CreateFileA(path, 0, FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE, NULL,
                    OPEN_EXISTING, 0, NULL);
    if (h == INVALID_HANDLE_VALUE) return PDP__PATH_FILE;
    type = GetFileType(h);
    CloseHandle(h);
    return type == FILE_TYPE_DISK ? PDP__PATH_FILE : PDP__PATH_OTHER;
}
#endif

/* ---- platform: sockets ---- */

#ifdef PDP__POSIX
PDP__PRIVATE int pdp__sock_startup(void) { return 0; }
PDP__PRIVATE int pdp__sock_error(void) { return errno; }
PDP__PRIVATE void pdp__sock_close(pdp__sock s) { close(s); }

PDP__PRIVATE void pdp__sock_tune(pdp__sock s, bool tcp)
{
    int one = 1;
    fcntl(s, F_SETFL, fcntl(s, F_GETFL) | O_NONBLOCK);
    fcntl(s, F_SETFD, fcntl(s, F_GETFD) | FD_CLOEXEC);
#  ifdef SO_NOSIGPIPE
    setsockopt(s, SOL_SOCKET, SO_NOSIGPIPE, &one, sizeof one);
#  endif
    if (tcp) setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

PDP__PRIVATE long pdp__sock_send(pdp__sock s, const void *buf, size_t bytes)
{
    return (long)send(s, buf, bytes, MSG_NOSIGNAL);
}

PDP__PRIVATE long pdp__sock_recv(pdp__sock s, void *buf, size_t bytes)
{
    return (long)recv(s, buf, bytes, 0);
}

PDP__PRIVATE int pdp__sock_poll(struct pollfd *fds, int n, int timeout_ms)
{
    return poll(fds, (nfds_t)n, timeout_ms);
}

PDP__PRIVATE int pdp__wake_open(pdp__wake *w)
{
    int p[2];
    if (pipe(p) != 0) {
        w->rd = w->wr = -1;
        return errno;
    }
    w->rd = p[0];
    w->wr = p[1];
    pdp__sock_tune(w->rd, false);
    pdp__sock_tune(w->wr, false);
    return 0;
}

PDP__PRIVATE void pdp__wake_signal(pdp__wake *w)
{
    char byte = 1;
    while (write(w->wr, &byte, 1) < 0 && errno == EINTR) {
    }
}

PDP__PRIVATE void pdp__wake_close(pdp__wake *w)
{
    if (w->rd >= 0) close(w->rd);
    if (w->wr >= 0) close(w->wr);
    w->rd = w->wr = -1;
}
#else
static pdp__once pdp__wsa_once = PDP__ONCE_INIT;
static int pdp__wsa_status = -1;

PDP__PRIVATE void pdp__wsa_start(void)
{
    WSADATA data;
    pdp__wsa_status = WSAStartup(MAKEWORD(2, 2), &data);
}

/* WSACleanup is left to process exit: a library cannot know the program's last socket */
PDP__PRIVATE int pdp__sock_startup(void)
{
    pdp__once_run(&pdp__wsa_once, pdp__wsa_start);
    return pdp__wsa_status == 0 ? 0 : EIO;
}

PDP__PRIVATE int pdp__sock_error(void)
{
    switch (WSAGetLastError()) {
    case WSAEWOULDBLOCK: return EWOULDBLOCK;
    case WSAEINPROGRESS: return EINPROGRESS;
    case WSAEINTR: return EINTR;
    case WSAECONNABORTED: return ECONNABORTED;
    case WSAECONNRESET: return ECONNRESET;
    case WSAECONNREFUSED: return ECONNREFUSED;
    case WSAETIMEDOUT: return ETIMEDOUT;
    case WSAEADDRINUSE: return EADDRINUSE;
    case WSAEADDRNOTAVAIL: return EADDRNOTAVAIL;
    case WSAENETUNREACH: return ENETUNREACH;
    case WSAEHOSTUNREACH: return EHOSTUNREACH;
    case WSAEMFILE: return EMFILE;
    case WSAENOBUFS: return ENOBUFS;
    case WSAENOTCONN: return ENOTCONN;
    case WSAEAFNOSUPPORT: return EAFNOSUPPORT;
    case WSAEACCES: return EACCES;
    case WSAEINVAL: return EINVAL;
    default: return EIO;
    }
}

PDP__PRIVATE void pdp__sock_close(pdp__sock s) { closesocket(s); }

PDP__PRIVATE void pdp__sock_tune(pdp__sock s, bool tcp)
{
    u_long on = 1;
    int one = 1;
    ioctlsocket(s, FIONBIO, &on);
    SetHandleInformation((HANDLE)s, HANDLE_FLAG_INHERIT, 0); /* close-on-exec */
    if (tcp) setsockopt(s, IPPROTO_TCP, TCP_NODELAY, (const char *)&one, sizeof one);
}

PDP__PRIVATE long pdp__sock_send(pdp__sock s, const void *buf, size_t bytes)
{
    return (long)send(s, (const char *)buf, (int)PDP__MIN(bytes, (size_t)INT32_MAX), 0);
}

PDP__PRIVATE long pdp__sock_recv(pdp__sock s, void *buf, size_t bytes)
{
    return (long)recv(s, (char *)buf, (int)PDP__MIN(bytes, (size_t)INT32_MAX), 0);
}

PDP__PRIVATE int pdp__sock_poll(struct pollfd *fds, int n, int timeout_ms)
{
    return WSAPoll(fds, (ULONG)n, timeout_ms);
}

PDP__PRIVATE int pdp__wake_open(pdp__wake *w)
{
    struct sockaddr_in a;
    int len = sizeof a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    w->rd = socket(AF_INET, SOCK_DGRAM, IPPROTO_UDP);
    if (w->rd == INVALID_SOCKET) return pdp__sock_error();
    if (bind(w->rd, (struct sockaddr *)&a, sizeof a) != 0 ||
        getsockname(w->rd, (struct sockaddr *)&a, &len) != 0 ||
        connect(w->rd, (struct sockaddr *)&a, sizeof a) != 0) { /* to itself */
        int e = pdp__sock_error();
        pdp__wake_close(w);
        return e;
    }
    pdp__sock_tune(w->rd, false);
    return 0;
}

PDP__PRIVATE void pdp__wake_signal(pdp__wake *w)
{
    char byte = 1;
    send(w->rd, &byte, 1, 0);
}

PDP__PRIVATE void pdp__wake_close(pdp__wake *w)
{
    if (w->rd != INVALID_SOCKET) closesocket(w->rd);
    w->rd = INVALID_SOCKET;
}
#endif

PDP__PRIVATE bool pdp__sock_retry(int err)
{
    return err == EAGAIN || err == EWOULDBLOCK || err == EINTR || err == EINPROGRESS;
}

PDP__PRIVATE pdp__sock pdp__sock_open(int family, int type, int protocol, bool tcp)
{
    pdp__sock s;
    if (pdp__sock_startup() != 0) return PDP__SOCK_NONE;
    s = socket(family, type, protocol);
    if (s != PDP__SOCK_NONE) pdp__sock_tune(s, tcp);
    return s;
}

PDP__PRIVATE int pdp__sock_wait(pdp__sock s, bool out, double deadline)
{
    for (;;) {
        double left = deadline - pdp__now();
        int r;
#ifdef PDP__POSIX
        struct pollfd p;
        if (left <= 0) return 0;
        p.fd = s;
        p.events = out ? POLLOUT : POLLIN;
        p.revents = 0;
        r = poll(&p, 1, left > 1e6 ? 1000000000 : (int)ceil(left * 1000.0));
#else
        /* select, not WSAPoll: WSAPoll does not report a failed connect on Windows
           before 10 2004; a failed connect shows in the exception set */
        fd_set rw, ex;
        struct timeval tv;
        if (left <= 0) return 0;
        FD_ZERO(&rw);
        FD_ZERO(&ex);
        FD_SET(s, &rw);
        FD_SET(s, &ex);
        tv.tv_sec = left > 1e6 ? 1000000 : (long)left;
        tv.tv_usec = left > 1e6 ? 0 : (long)((left - (double)tv.tv_sec) * 1e6) + 1;
        if (tv.tv_usec >= 1000000) {
            tv.tv_sec++;
            tv.tv_usec -= 1000000;
        }
        r = select(0, out ? NULL : &rw, out ? &rw : NULL, &ex, &tv);
#endif
        if (r > 0) return 1;
        if (r < 0 && pdp__sock_error() != EINTR) return -1;
    }
}

PDP__PRIVATE pdp__sock pdp__sock_connect(const struct addrinfo *ai, double deadline, char *why,
                                         size_t cap)
{
    pdp__sock s = pdp__sock_open(ai->ai_family, ai->ai_socktype, ai->ai_protocol, true);
    int err = 0, r, e;
    socklen_t len = sizeof err;
    if (s == PDP__SOCK_NONE) {
        pdp__errstr(pdp__sock_error(), why, cap);
        return PDP__SOCK_NONE;
    }
    if (connect(s, ai->ai_addr, (socklen_t)ai->ai_addrlen) == 0) return s;
    e = pdp__sock_error();
    if (!pdp__sock_retry(e)) {
        pdp__errstr(e, why, cap);
        pdp__sock_close(s);
        return PDP__SOCK_NONE;
    }
    r = pdp__sock_wait(s, true, deadline);
    if (r == 1 && getsockopt(s, SOL_SOCKET, SO_ERROR, (char *)&err, &len) == 0 && err == 0)
        return s;
#ifdef PDP__WIN32
    if (r == 1 && err) {
        WSASetLastError(err);
        err = pdp__sock_error();
    }
#endif
    pdp__errstr(r == 0 ? ETIMEDOUT : r < 0 ? pdp__sock_error() : err, why, cap);
    pdp__sock_close(s);
    return PDP__SOCK_NONE;
}

PDP__PRIVATE int pdp__sock_port(pdp__sock s)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (getsockname(s, (struct sockaddr *)&ss, &len) != 0) return -1;
    if (ss.ss_family == AF_INET) return ntohs(((struct sockaddr_in *)&ss)->sin_port);
    if (ss.ss_family == AF_INET6) return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    return -1;
}

/* ---- platform: CPU features ---- */

#ifdef PDP__X86_CPUID
PDP__PRIVATE bool pdp__cpuid(unsigned leaf, unsigned subleaf, unsigned r[4])
{
#  if defined(_MSC_VER)
    int max[4], v[4];
    __cpuid(max, (int)(leaf & 0x80000000u));
    if ((unsigned)max[0] < leaf) return false;
    __cpuidex(v, (int)leaf, (int)subleaf);
    r[0] = (unsigned)v[0];
    r[1] = (unsigned)v[1];
    r[2] = (unsigned)v[2];
    r[3] = (unsigned)v[3];
    return true;
#  else
    return __get_cpuid_count(leaf, subleaf, &r[0], &r[1], &r[2], &r[3]) != 0;
#  endif
}

PDP__PRIVATE uint64_t pdp__xgetbv0(void)
{
#  if defined(_MSC_VER)
    return (uint64_t)_xgetbv(0);
#  else
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
#  endif
}
#endif

#ifdef PDP__HAVE_AMX_PERMIT
/* Linux's arch_prctl(ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18): lets this
   process use the AMX tile data (Linux 5.16 and later; before, or refused: an error).
   The raw syscall (158 on x86-64): syscall(2) is not declared under strict C99's
   _POSIX_C_SOURCE. */
PDP__PRIVATE bool pdp__amx_permit(void)
{
    long ret;
    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "0"(158L), "D"(0x1023L), "S"(18L)
                     : "rcx", "r11", "memory");
    return ret == 0;
}
#endif
