/* platform: the operating system and the compiler, in one place.

   Every other module reaches the system only through the names below: threads,
   mutexes, condition variables, once, thread-local storage, the clocks, the CPU
   count, durable files (flush and sync, the replace-existing rename, the directory
   sync), process ids, directory listing, sockets (platform.c: the store's
   deadline-bounded helpers), CPU features, and the compiler's builtins (atomics,
   overflow checks, attributes, the pause instruction). Two implementations:
   - POSIX (PDP__POSIX): Linux, tested on x86-64 and, under QEMU, aarch64; macOS and
     the BSDs by the calls POSIX.1-2008 has (the manual, PLATFORMS, names the ones
     that differ on macOS, which is not tested here).
   - Win32 (PDP__WIN32): Windows 7 and later (_WIN32_WINNT 0x0601: SRW locks,
     condition variables, InitOnceExecuteOnce, fiber-local storage with a destructor,
     QueryPerformanceCounter, GetActiveProcessorCount, MoveFileExA, Winsock 2 with
     WSAPoll). Built with MinGW-w64 and tested under Wine (make cross-test); the
     MSVC forms of the compiler macros are written but not compiled here.
   The calls on hot paths (lock, unlock, wait, signal, the atomics, the pause) are
   static inline wrappers or macros over the system's own, so on POSIX with gcc or
   clang they compile to exactly the calls the modules made before this layer.

   Error codes are errno values on both systems (Win32's are mapped), so callers
   keep one vocabulary: 0 success, ETIMEDOUT for a timed wait that expired.

   This header is the implementation's first module (amalgamate.py lists it before
   internal.h): it picks the feature macros, includes the system headers and
   defines PDP__PRIVATE, the linkage of every private function.

   References: POSIX.1-2008 (pthreads, clock_gettime, fsync, rename, poll, sockets);
   Microsoft's Win32 documentation of the calls named above ("Slim Reader/Writer
   Locks", "Condition Variables", "InitOnceExecuteOnce", "FlsAlloc", "MoveFileExA",
   "FlushFileBuffers", "WSAPoll"); the GCC manual's "__atomic Builtins" and "Integer
   Overflow Builtins"; Intel's SDM for CPUID and XGETBV; Linux's
   Documentation/arch/x86/xstate.rst for ARCH_REQ_XCOMP_PERM. */

/* ---- platform: which system ---- */

#if defined(_WIN32)
#  define PDP__WIN32 1
#  ifndef _WIN32_WINNT
#    define _WIN32_WINNT 0x0601 /* Windows 7: SRW locks, InitOnce, GetActiveProcessorCount */
#  elif _WIN32_WINNT < 0x0601
#    error "pdp.h: needs _WIN32_WINNT >= 0x0601 (Windows 7); define it so before including <windows.h>"
#  endif
#  ifndef WIN32_LEAN_AND_MEAN
#    define WIN32_LEAN_AND_MEAN
#  endif
#  ifndef NOMINMAX
#    define NOMINMAX
#  endif
#  include <winsock2.h> /* before <windows.h>, which would bring the old winsock.h */
#  include <ws2tcpip.h>
#  include <windows.h>
#  include <io.h>
#else
#  define PDP__POSIX 1
#  include <pthread.h>
#  include <unistd.h>
#  include <sys/types.h>
#endif
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

/* Linkage of the private functions (pdp__*), SQLite's SQLITE_PRIVATE pattern: static in every
   user's build, so they stay out of the program's symbols and unused ones are dropped; empty
   when pdp's own tests compile the implementation once with PDP__TEST_LINKAGE
   (tests/pdp_impl.c) and link their internal tests against that object (the Makefile).
   tools/privatize.py writes it for `static` on every file-scope function of the .c modules
   and this file but `static inline` ones; its --check (run by amalgamate.py --check) fails
   on one it missed. */
#ifdef PDP__TEST_LINKAGE
#  define PDP__PRIVATE
#else
#  define PDP__PRIVATE static
#endif

/* ---- platform: the compiler ----
   PDP__THREAD_LOCAL    a thread-local variable (absent with PDP__TLS_KEY: tcc)
   PDP__UNUSED          no warning when a private helper is unused
   PDP__ALWAYS_INLINE   a kernel helper inlined even at -Og (the register tiles need it)
   PDP__KERNEL_UNSANITIZED  a register-tile micro-kernel under ASan (below)
   PDP__TARGET(s)       a function compiled for instruction set s ("avx512f"); defined
                        only where the compiler has it (gcc, clang), with PDP__HAVE_TARGET
   PDP__PAUSE()         the spin-wait hint (x86 pause, ARM yield), or nothing
   PDP__LOAD_ACQ(p)     an integer load with acquire order
   PDP__STORE_REL(p, v) an integer store with release order
   PDP__HAVE_OVERFLOW_BUILTINS  __builtin_mul_overflow and _add_overflow exist
   PDP__STDCALL         the calling convention of a function the system calls back */
#if defined(__GNUC__) || defined(__clang__)
#  define PDP__THREAD_LOCAL __thread
#  define PDP__UNUSED __attribute__((unused))
#  define PDP__ALWAYS_INLINE __attribute__((always_inline))
#  define PDP__NOINLINE __attribute__((noinline))
#  define PDP__TARGET(s) __attribute__((target(s)))
#  define PDP__HAVE_TARGET 1
#elif defined(_MSC_VER)
#  define PDP__THREAD_LOCAL __declspec(thread)
#  define PDP__UNUSED
#  define PDP__ALWAYS_INLINE __forceinline
#  define PDP__NOINLINE __declspec(noinline)
#elif defined(__TINYC__)
/* tcc has no thread-local storage: the per-thread state (error message, thread count,
   profile counters) lives in one struct a thread, under a key (base.c, pdp__tls) */
#  define PDP__TLS_KEY 1
#  define PDP__UNUSED
#  define PDP__ALWAYS_INLINE
#  define PDP__NOINLINE
#else
#  error "pdp.h: needs a thread-local storage keyword (__thread or __declspec(thread))"
#endif

/* MinGW-w64's GCC keeps Win64's 16-byte stack alignment yet spills AVX registers with
   aligned moves (GCC bug 54412): code compiled for AVX faults at its first such spill
   unless the assembler makes every vector move unaligned (-Wa,-muse-unaligned-vector-move,
   as fast on aligned data). A build cannot see that option, so PDP_MINGW_UNALIGNED_MOVES
   says it was given. Without it pdp compiles no target-attribute code there (bf16 takes
   the emulation or sgemm-rounded, GELU and the softmax's exp math.h: slower, never
   faulting; a plain x86-64 build of test_layers faulted under Wine on a Zen 4), and a
   build for AVX (-mavx2, -march=native: all of its code at risk) stops here. */
#if defined(__MINGW32__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(PDP_MINGW_UNALIGNED_MOVES)
#  if defined(__AVX__)
#    error "pdp.h: MinGW GCC builds for AVX fault on spills to a 16-byte aligned stack (GCC bug 54412): compile with -Wa,-muse-unaligned-vector-move -DPDP_MINGW_UNALIGNED_MOVES"
#  endif
#  undef PDP__HAVE_TARGET
#endif

/* PDP__KERNEL_UNSANITIZED: gemm.c's register-tile micro-kernels, left out of ASan and UBSan
   (make sanitize: GCC says so by __SANITIZE_ADDRESS__, clang 14 only by __has_feature). At
   the sanitizers' -O1 the instrumentation keeps a tile's accumulator array in memory,
   checked at every FMA: the short train_gpt run took 14.6 s under ASan, 2.1 s without the
   kernels' checks (Zen 3).
   What sizes a kernel's operands stays checked (the packing, the drivers), and test_gemm
   holds every tile edge to a naive loop with C's padding checked. The always-inlined
   helpers of those kernels carry it too: GCC marks an inlined helper's arrays poisoned
   when their scope ends, while the uninstrumented kernel never clears its frame's marks
   as it returns, so a later frame at those addresses failed with a false
   stack-use-after-scope (test_gemm under make sanitize, on an AVX-512 CPU: the runs
   kernel's segment arrays). Nothing else uses it. */
#if defined(__SANITIZE_ADDRESS__) && (defined(__GNUC__) || defined(__clang__))
#  define PDP__KERNEL_UNSANITIZED __attribute__((no_sanitize("address", "undefined")))
#elif defined(__clang__) && defined(__has_feature)
#  if __has_feature(address_sanitizer)
#    define PDP__KERNEL_UNSANITIZED __attribute__((no_sanitize("address", "undefined")))
#  endif
#endif
#ifndef PDP__KERNEL_UNSANITIZED
#  define PDP__KERNEL_UNSANITIZED
#endif

#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
#  define PDP__PAUSE() __builtin_ia32_pause()
#elif (defined(__GNUC__) || defined(__clang__)) && defined(__aarch64__)
#  define PDP__PAUSE() __asm__ __volatile__("yield")
#elif defined(_MSC_VER) && (defined(_M_X64) || defined(_M_IX86))
#  include <intrin.h>
#  define PDP__PAUSE() _mm_pause()
#elif defined(_MSC_VER) && defined(_M_ARM64)
#  include <intrin.h>
#  define PDP__PAUSE() __yield()
#else
#  define PDP__PAUSE() ((void)0)
#endif

/* GCC/Clang atomics: valid C99 and C++, so a flag read outside a lock needs no
   <stdatomic.h> (the trace's enabled flag, the pool's generation while a worker spins).
   MSVC: a volatile access between compiler barriers is acquire/release on x86 and x64
   (their loads and stores are ordered, /volatile:iso or not); on ARM64 a full barrier
   (__dmb) orders it. tcc has neither: there a process-wide mutex's lock and unlock order
   memory (POSIX.1 section 4.12), after the load and before the store (base.c,
   pdp__fence); tcc keeps no value in a register across a call. The values are integers. */
#if defined(__GNUC__) || defined(__clang__)
#  define PDP__LOAD_ACQ(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#  define PDP__STORE_REL(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
#elif defined(_MSC_VER)
#  include <intrin.h>
#  if defined(_M_ARM64)
#    define PDP__MSVC_FENCE() __dmb(0xB) /* ISH */
#  else
#    define PDP__MSVC_FENCE() _ReadWriteBarrier()
#  endif
static __forceinline long long pdp__msvc_acquire(long long v)
{
    PDP__MSVC_FENCE();
    return v;
}
/* the load is the argument, so it happens before the barrier; the barrier in a loop
   forces the next iteration to load again */
#  define PDP__LOAD_ACQ(p) pdp__msvc_acquire((long long)*(p))
#  define PDP__STORE_REL(p, v) (PDP__MSVC_FENCE(), *(p) = (v), PDP__MSVC_FENCE())
#else
#  define PDP__FENCE_BY_LOCK 1
PDP__PRIVATE long long pdp__fence(long long loaded);
#  define PDP__LOAD_ACQ(p) pdp__fence((long long)*(p))
#  define PDP__STORE_REL(p, v) ((void)pdp__fence(0), *(p) = (v))
#endif

#if defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 5)
#  define PDP__HAVE_OVERFLOW_BUILTINS 1
#endif

#ifdef PDP__WIN32
#  define PDP__STDCALL WINAPI
#else
#  define PDP__STDCALL
#endif

/* ---- platform: mutexes and condition variables ----
   Plain (not recursive) mutexes; PDP__MUTEX_INIT initialises a static one. Every
   condition variable measures timed waits on the monotonic clock (pdp__now()), so a
   deadline is a pdp__now() value; pdp__cond_timedwait returns 0, or ETIMEDOUT once it
   has passed. init returns 0 or an errno value; destroy on an initialised object. */
#ifdef PDP__POSIX
typedef pthread_mutex_t pdp__mutex;
typedef pthread_cond_t pdp__cond;
#  define PDP__MUTEX_INIT PTHREAD_MUTEX_INITIALIZER
static inline int pdp__mutex_init(pdp__mutex *m) { return pthread_mutex_init(m, NULL); }
static inline void pdp__mutex_destroy(pdp__mutex *m) { pthread_mutex_destroy(m); }
static inline void pdp__mutex_lock(pdp__mutex *m) { pthread_mutex_lock(m); }
static inline void pdp__mutex_unlock(pdp__mutex *m) { pthread_mutex_unlock(m); }
/* true when it took the lock */
static inline bool pdp__mutex_trylock(pdp__mutex *m) { return pthread_mutex_trylock(m) == 0; }
static inline void pdp__cond_destroy(pdp__cond *c) { pthread_cond_destroy(c); }
static inline void pdp__cond_wait(pdp__cond *c, pdp__mutex *m) { pthread_cond_wait(c, m); }
static inline void pdp__cond_signal(pdp__cond *c) { pthread_cond_signal(c); }
static inline void pdp__cond_broadcast(pdp__cond *c) { pthread_cond_broadcast(c); }
#else
typedef SRWLOCK pdp__mutex;
typedef CONDITION_VARIABLE pdp__cond;
#  define PDP__MUTEX_INIT SRWLOCK_INIT
static inline int pdp__mutex_init(pdp__mutex *m)
{
    InitializeSRWLock(m);
    return 0;
}
static inline void pdp__mutex_destroy(pdp__mutex *m) { (void)m; }
static inline void pdp__mutex_lock(pdp__mutex *m) { AcquireSRWLockExclusive(m); }
static inline void pdp__mutex_unlock(pdp__mutex *m) { ReleaseSRWLockExclusive(m); }
static inline bool pdp__mutex_trylock(pdp__mutex *m) { return TryAcquireSRWLockExclusive(m) != 0; }
static inline void pdp__cond_destroy(pdp__cond *c) { (void)c; }
static inline void pdp__cond_wait(pdp__cond *c, pdp__mutex *m)
{
    SleepConditionVariableSRW(c, m, INFINITE, 0);
}
static inline void pdp__cond_signal(pdp__cond *c) { WakeConditionVariable(c); }
static inline void pdp__cond_broadcast(pdp__cond *c) { WakeAllConditionVariable(c); }
#endif
/* (platform.c) */
PDP__PRIVATE int pdp__cond_init(pdp__cond *c);
PDP__PRIVATE int pdp__cond_timedwait(pdp__cond *c, pdp__mutex *m, double deadline);

/* ---- platform: threads, once, thread-local keys ----
   pdp__thread_create starts fn(arg) and returns 0 or an errno value; the pdp__thread
   must stay where it is until pdp__thread_join (Win32 keeps fn and arg in it for the
   thread's start). pdp__once_run runs fn exactly once per PDP__ONCE_INIT object, the
   other callers waiting for it. A key holds one pointer per thread; the destructor
   given at its creation runs on a thread's non-NULL value when that thread exits
   (Win32: fiber-local storage, whose callback runs at thread exit; PDP__STDCALL). */
#ifdef PDP__POSIX
typedef pthread_t pdp__thread;
typedef pthread_once_t pdp__once;
typedef pthread_key_t pdp__tls_key;
#  define PDP__ONCE_INIT PTHREAD_ONCE_INIT
static inline void pdp__once_run(pdp__once *o, void (*fn)(void)) { pthread_once(o, fn); }
static inline void *pdp__tls_get_value(pdp__tls_key k) { return pthread_getspecific(k); }
static inline int pdp__tls_set_value(pdp__tls_key k, void *v) { return pthread_setspecific(k, v); }
#else
typedef struct pdp__thread {
    HANDLE handle;
    void *(*fn)(void *);
    void *arg;
} pdp__thread;
typedef INIT_ONCE pdp__once;
typedef DWORD pdp__tls_key;
#  define PDP__ONCE_INIT INIT_ONCE_STATIC_INIT
PDP__PRIVATE void pdp__once_run(pdp__once *o, void (*fn)(void));
static inline void *pdp__tls_get_value(pdp__tls_key k) { return FlsGetValue(k); }
static inline int pdp__tls_set_value(pdp__tls_key k, void *v)
{
    return FlsSetValue(k, v) ? 0 : ENOMEM;
}
#endif
/* (platform.c) */
PDP__PRIVATE int pdp__thread_create(pdp__thread *t, void *(*fn)(void *), void *arg);
PDP__PRIVATE void pdp__thread_join(pdp__thread *t);
PDP__PRIVATE int pdp__tls_key_create(pdp__tls_key *k, void (PDP__STDCALL *dtor)(void *));

/* ---- platform: time, CPUs, processes (platform.c) ---- */

/* Monotonic seconds. */
PDP__PRIVATE double pdp__now(void);
/* Wall-clock nanoseconds since 1970 (for seeds; 0 when unknown). */
PDP__PRIVATE uint64_t pdp__wall_ns(void);
/* CPU seconds the calling thread has used (0 when unknown). */
PDP__PRIVATE double pdp__thread_cpu_s(void);
/* Sleeps at least `seconds`; gives the core to another ready thread. */
PDP__PRIVATE void pdp__sleep_s(double seconds);
PDP__PRIVATE void pdp__yield(void);
/* Online logical CPUs (at least 1). */
PDP__PRIVATE int pdp__cpu_count(void);
/* This process's id; whether a process with id pid exists (true when it cannot tell). */
PDP__PRIVATE long pdp__pid(void);
PDP__PRIVATE bool pdp__pid_alive(long pid);
/* Has fn run in the child of every later fork(), on its one thread (pthread_atfork's child
   handler); 0 or an errno. Windows has no fork: 0 and nothing. */
PDP__PRIVATE int pdp__at_fork_child(void (*fn)(void));
/* strerror(e) into buf, without strerror's shared buffer; returns buf. */
PDP__PRIVATE const char *pdp__errstr(int e, char *buf, size_t cap);

/* ---- platform: files (platform.c) ----
   Durable replacement (checkpoint.c, zero_ckpt.c): write a temporary, pdp__file_sync it,
   fclose, pdp__file_replace it over the target, pdp__dir_sync the directory. Each
   returns 0, or -1 with errno set. */
/* fflush, then the data to the device: fsync (POSIX; macOS's fsync leaves the drive's
   cache, see the manual) or FlushFileBuffers (Win32). */
PDP__PRIVATE int pdp__file_sync(FILE *f);
/* Renames from over to, atomically replacing to when it exists: rename (POSIX),
   MoveFileExA with MOVEFILE_REPLACE_EXISTING | MOVEFILE_WRITE_THROUGH (Win32, which
   returns once the rename is on disk). */
PDP__PRIVATE int pdp__file_replace(const char *from, const char *to);
/* Makes the directory's entries durable (a rename in it): open + fsync on POSIX (0 where
   the filesystem cannot sync a directory); nothing to do on Win32 (above). */
PDP__PRIVATE int pdp__dir_sync(const char *dir);
/* The size of the regular file f is open on: 0, or -1 when f is not one (a pipe, a
   device, a directory) or its size cannot be read. */
PDP__PRIVATE int pdp__file_size(FILE *f, uint64_t *bytes);
/* A path separator: '/' (and '\\' on Win32). */
static inline bool pdp__is_sep(char c)
{
#ifdef PDP__WIN32
    return c == '/' || c == '\\';
#else
    return c == '/';
#endif
}
/* The names in a directory, "." and ".." included. The caller holds the pdp__dir (no
   allocation of pdp's: a listing cannot fail for want of memory where a caller's
   allocator is counted); pdp__dir_open gives 0, or -1 with errno set when the directory
   cannot be opened; pdp__dir_next NULL at the end (errno 0) or on an error. */
typedef struct pdp__dir {
#ifdef PDP__WIN32
    HANDLE h;
    WIN32_FIND_DATAA data;
    bool first; /* data holds an entry not yet returned */
#else
    void *d; /* the DIR * */
#endif
} pdp__dir;
PDP__PRIVATE int pdp__dir_open(pdp__dir *d, const char *path);
PDP__PRIVATE const char *pdp__dir_next(pdp__dir *d);
PDP__PRIVATE void pdp__dir_close(pdp__dir *d);
/* What path names: PDP__PATH_FILE (a regular file), PDP__PATH_DIR, PDP__PATH_OTHER (a
   device, or a symbolic link when follow is false), or -1 with errno set (ENOENT: none). */
#define PDP__PATH_FILE 1
#define PDP__PATH_DIR 2
#define PDP__PATH_OTHER 3
PDP__PRIVATE int pdp__path_kind(const char *path, bool follow);

/* ---- platform: sockets (platform.c) ----
   Stream sockets for the TCP store (store.c) and any later backend: non-blocking,
   close-on-exec, no SIGPIPE, every wait bounded by a deadline (pdp__now() seconds).
   Errors are errno values (pdp__sock_error(): Win32's WSA codes mapped). */
#ifdef PDP__POSIX
typedef int pdp__sock;
#  define PDP__SOCK_NONE (-1)
#else
typedef SOCKET pdp__sock;
#  define PDP__SOCK_NONE INVALID_SOCKET
#endif
struct addrinfo;
/* Winsock's WSAStartup, once per process (nothing on POSIX); 0 or an errno value. */
PDP__PRIVATE int pdp__sock_startup(void);
/* The last socket call's error as an errno value. */
PDP__PRIVATE int pdp__sock_error(void);
/* A would-block, in-progress or interrupted error: the call may be retried. */
PDP__PRIVATE bool pdp__sock_retry(int err);
/* socket() tuned as above (TCP_NODELAY with tcp); PDP__SOCK_NONE on failure. */
PDP__PRIVATE pdp__sock pdp__sock_open(int family, int type, int protocol, bool tcp);
PDP__PRIVATE void pdp__sock_tune(pdp__sock s, bool tcp);
PDP__PRIVATE void pdp__sock_close(pdp__sock s);
/* send/recv of up to bytes: the count, 0 for EOF (recv), -1 (pdp__sock_error()). */
PDP__PRIVATE long pdp__sock_send(pdp__sock s, const void *buf, size_t bytes);
PDP__PRIVATE long pdp__sock_recv(pdp__sock s, void *buf, size_t bytes);
/* Waits until s is readable (out false) or writable (out true), or deadline: 1 ready,
   0 timed out, -1 error (pdp__sock_error()). */
PDP__PRIVATE int pdp__sock_wait(pdp__sock s, bool out, double deadline);
/* One non-blocking connect to ai bounded by deadline: the socket, or PDP__SOCK_NONE with
   the reason in why. */
PDP__PRIVATE pdp__sock pdp__sock_connect(const struct addrinfo *ai, double deadline, char *why,
                                         size_t cap);
/* The local port s is bound to, or -1. */
PDP__PRIVATE int pdp__sock_port(pdp__sock s);
/* poll() over n sockets (WSAPoll on Win32), timeout_ms < 0 forever: as poll. */
struct pollfd;
PDP__PRIVATE int pdp__sock_poll(struct pollfd *fds, int n, int timeout_ms);
/* A wake-up channel a poll loop watches beside its sockets: pdp__wake_fd(w) is what to
   poll for reading; pdp__wake_signal makes it readable (from any thread). A pipe on POSIX,
   a loopback UDP socket sending to itself on Win32. */
typedef struct pdp__wake {
    pdp__sock rd;
#ifdef PDP__POSIX
    int wr;
#endif
} pdp__wake;
PDP__PRIVATE int pdp__wake_open(pdp__wake *w); /* 0 or an errno value */
PDP__PRIVATE void pdp__wake_signal(pdp__wake *w);
PDP__PRIVATE void pdp__wake_close(pdp__wake *w);

/* ---- platform: CPU features (platform.c) ----
   x86 only (PDP__X86_CPUID): CPUID leaf/subleaf into r[0..3] = eax, ebx, ecx, edx
   (false when the leaf is beyond the maximum), XCR0 (call only when CPUID says
   OSXSAVE), and the operating system's permission for the AMX tile data: Linux asks
   arch_prctl(ARCH_REQ_XCOMP_PERM) once; elsewhere no AMX path is compiled (false). */
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#  define PDP__X86_CPUID 1
#elif defined(_MSC_VER) && (defined(_M_X64) || defined(_M_IX86))
#  define PDP__X86_CPUID 1
#endif
#ifdef PDP__X86_CPUID
PDP__PRIVATE bool pdp__cpuid(unsigned leaf, unsigned subleaf, unsigned r[4]);
PDP__PRIVATE uint64_t pdp__xgetbv0(void);
#endif
/* AMX: x86-64 Linux (the permission is an arch_prctl) and a compiler with the AMX
   intrinsics (gcc 11, clang 12) */
#if defined(__x86_64__) && defined(__linux__) && \
    (__GNUC__ >= 11 || (defined(__clang__) && __clang_major__ >= 12))
#  define PDP__HAVE_AMX_PERMIT 1
PDP__PRIVATE bool pdp__amx_permit(void);
#endif
