/* pdp_internal.h - GENERATED from src/ by amalgamate.py: edit src/, then run
   `python3 amalgamate.py`. For pdp's own tests only; not part of the library.

   The implementation's declarations without its definitions: every IMPL module of
   amalgamate.py with its function bodies taken out (see declarations() there). pdp.h
   includes this file (by tests/pdp_linked.h) when PDP__INTERNAL_API is defined, after the
   public API: an internal test compiled that way reads the private structs and calls
   pdp__ functions of the one implementation object it links (tests/pdp_impl.c, compiled
   with PDP__TEST_LINKAGE, so PDP__PRIVATE functions have external linkage there). */
#ifndef PDP_INTERNAL_H_INCLUDED
#define PDP_INTERNAL_H_INCLUDED
#if defined(__GNUC__) || defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wunused-variable"
#endif
/* ---- src/platform.h ---- */
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

/* ---- src/internal.h ---- */
/* internal: what the implementation modules share and the API does not show.

   The platform layer first (platform.h: the system headers, threads, clocks, files,
   sockets and the compiler's macros), then the C library's headers, the allocation and
   assert overrides, the error helper
   pdp__err() that formats the thread-local message and returns the status, the
   aligned allocator, timers and small utilities; then, in sections, the private
   structs and prototypes that cross modules: devices, the model and its layer
   kinds (with the executor seam), tensor parallelism's state, losses, CUDA
   dispatch, gradient norms, optimizer internals, checkpoint ranges, the
   communicator contract every backend fills, and the trace sink. Nothing here is
   public. */

/* #include "platform.h" (above) */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <float.h>
#include <errno.h>
#include <time.h>

#if defined(PDP_MALLOC) != defined(PDP_FREE)
#  error "pdp.h: define both PDP_MALLOC and PDP_FREE, or neither"
#endif
#ifndef PDP_MALLOC
#  define PDP_MALLOC(bytes) malloc(bytes)
#  define PDP_FREE(ptr) free(ptr)
#endif
#ifndef PDP_ASSERT
#  include <assert.h>
#  define PDP_ASSERT(c) assert(c)
#endif

/* Hot element loops. gcc -O2 (its "very cheap" vectoriser) skips a loop of unknown
   length, which would need an epilogue, and any loop whose pointers may alias; so
   hot loops take PDP__RESTRICT pointers and run in blocks of PDP__VEC floats with a
   constant trip count, then the rest one by one. PDP__FOR_BLOCKED(i, n, body)
   writes that shape: body sees int64_t i. */
#if defined(__cplusplus) && defined(_MSC_VER)
#  define PDP__RESTRICT __restrict
#elif defined(__cplusplus)
#  define PDP__RESTRICT __restrict__
#else
#  define PDP__RESTRICT restrict
#endif
#define PDP__VEC 16
#define PDP__FOR_BLOCKED(i, n, ...)                                                            \
    do {                                                                                       \
        int64_t pdp__b_ = 0, pdp__n_ = (n);                                                    \
        int pdp__k_;                                                                           \
        for (; pdp__b_ + PDP__VEC <= pdp__n_; pdp__b_ += PDP__VEC)                             \
            for (pdp__k_ = 0; pdp__k_ < PDP__VEC; pdp__k_++) {                                 \
                int64_t i = pdp__b_ + pdp__k_;                                                 \
                __VA_ARGS__                                                                    \
            }                                                                                  \
        for (; pdp__b_ < pdp__n_; pdp__b_++) {                                                 \
            int64_t i = pdp__b_;                                                               \
            __VA_ARGS__                                                                        \
        }                                                                                      \
    } while (0)

#define PDP__MIN(a, b) ((a) < (b) ? (a) : (b))
#define PDP__MAX(a, b) ((a) > (b) ? (a) : (b))
#define PDP__DEF(val, def) ((val) != 0 ? (val) : (def)) /* != 0: a double is no truth value */
#define PDP__ALIGN 64

/* ---- checked size arithmetic ----
   Every element count, byte count or offset computed from user input (shapes, batch sizes,
   feature counts, padding, first + n) goes through these. Each writes *out and returns 1 when
   a and b are >= 0 and the result is at most PDP__COUNT_MAX; else it returns 0 and leaves *out
   alone, and the caller fails with a message naming its function. PDP__COUNT_MAX is the most
   elements any buffer may have: at 8 bytes each (float, double, int64_t) its byte count still
   fits in int64_t and size_t, so a count that passed may be multiplied by an element size. */
#define PDP__COUNT_MAX                                                                         \
    ((int64_t)(((uint64_t)INT64_MAX < (uint64_t)SIZE_MAX ? (uint64_t)INT64_MAX                 \
                                                         : (uint64_t)SIZE_MAX) / 8u))
PDP__PRIVATE PDP__UNUSED int pdp__mul_ok(int64_t a, int64_t b, int64_t *out);
PDP__PRIVATE PDP__UNUSED int pdp__add_ok(int64_t a, int64_t b, int64_t *out);
/* a * b * c, checked as above (a convolution's C * k * k, a batch's n * h * w). */
PDP__PRIVATE PDP__UNUSED int pdp__mul3_ok(int64_t a, int64_t b, int64_t c, int64_t *out);

/* Formats the thread-local message and returns status: a failing branch is one
   line, `return pdp__err(PDP_ERR_SHAPE, "pdp_x: layer %d ...", ...)`. */
PDP__PRIVATE pdp_status pdp__err(pdp_status status, const char *fmt, ...);
/* Prepends "context: " to the current message (for errors passed up a level). */
PDP__PRIVATE pdp_status pdp__err_wrap(pdp_status status, const char *fmt, ...);
/* The thread's error (its message and its mark of a peer's failure, pdp__err_peer) kept
   across clean-up whose own calls would replace it: pdp__err_keep, then the waits and frees,
   then return pdp__err_restore(status, &kept). */
typedef struct pdp__err_kept {
    char msg[1024]; /* the thread-local message's size */
    bool peer;
} pdp__err_kept;

/* PDP_MALLOC'd memory aligned to 64 bytes (the original pointer is stored just
   before the block). Returns NULL on failure; bytes == 0 gives a valid block. */
PDP__PRIVATE void *pdp__alloc(size_t bytes);
PDP__PRIVATE void *pdp__calloc(size_t bytes);
PDP__PRIVATE void pdp__dealloc(void *p);

/* Waking a sleeping thread costs tens of microseconds on a VM, more than a small
   GEMM's share, so a thread that hands work off (the intra-op pool, DataParallel's
   workers) spins a while before it sleeps on a condition, as OpenMP runtimes and
   OpenBLAS do (longer): pdp__spin_while pauses while still(ctx) holds, for at most
   PDP__SPIN_S seconds. still() may read only values written with PDP__STORE_REL, and
   through PDP__LOAD_ACQ (threads.c). */
PDP__PRIVATE void pdp__spin_while(bool (*still)(const void *ctx), const void *ctx);

/* A worker team (threads.c): the one hand-off behind the intra-op pool and
   DataParallel's workers. Members 1..nworkers are persistent threads (created by
   pdp__team_grow, joined by pdp__team_free); member 0 is whoever calls
   pdp__team_run, which publishes fn/arg/n as a new generation, runs index 0 itself,
   then every index no member exists for, and returns when members 1..n-1 are done.
   Member i runs index i; a member with i >= n sits the job out. Both sides spin
   (pdp__spin_while) before they sleep. generation, pending and stop are written
   only with PDP__STORE_REL under lock (the spinners read them outside it); every
   other field is read and written under lock, so what the caller wrote before
   pdp__team_run is visible to the members, and what a member wrote in its index is
   visible to the caller after it (TSan clean). One caller at a time per team: the
   pool serialises callers with its busy mutex, a pdp_dp has one owner. */
#define PDP__TEAM_MAX 256 /* members, the caller included */
typedef struct pdp__team pdp__team;
typedef struct pdp__team_member {
    pdp__team *team;
    int index;               /* the index this thread runs: 1..PDP__TEAM_MAX-1 */
    unsigned long start_gen; /* the generation when the thread was made */
} pdp__team_member;
struct pdp__team {
    pdp__mutex lock;
    pdp__cond wake, done; /* wake: a new generation (or stop); done: pending hit 0 */
    bool ok;                   /* lock, wake and done are initialised */
    int nworkers;              /* threads started: members 1..nworkers */
    unsigned long generation;  /* bumped once per job; atomic stores only */
    int pending;               /* members still running the job; atomic stores only */
    int stop;                  /* atomic stores only */
    void (*fn)(void *arg, int i, int n); /* the current job */
    void *arg;
    int n;
    pdp__thread tid[PDP__TEAM_MAX - 1];
    pdp__team_member member[PDP__TEAM_MAX - 1];
};
/* Initialises a zeroed team with no threads; 0, or an errno value. */
PDP__PRIVATE int pdp__team_init(pdp__team *t);
/* Starts threads until the team has `workers` (at most PDP__TEAM_MAX - 1); no job may
   be running. 0, or the first pdp__thread_create error (the threads made so far stay). */
PDP__PRIVATE int pdp__team_grow(pdp__team *t, int workers);
/* Runs fn(arg, i, n) for i in [0, n) as described above; n may exceed the members. */
PDP__PRIVATE void pdp__team_run(pdp__team *t, int n, void (*fn)(void *arg, int i, int n),
                                void *arg);
/* Stops and joins every thread and releases the team (a zeroed team is fine); the
   team may be initialised again. */
PDP__PRIVATE void pdp__team_free(pdp__team *t);

/* The intra-op setting of the calling thread (see pdp_set_num_threads). */
PDP__PRIVATE int pdp__threads_for_caller(void);
/* Runs fn(arg, i, n) for i in [0, n) on the intra-op pool plus the calling thread
   (n <= the caller's thread count); returns when all are done. */
PDP__PRIVATE void pdp__parallel_for(int n, void (*fn)(void *arg, int i, int n), void *arg);
/* The calling thread's profile counters (pdp_profile_start; src/threads.c). A counted
   call does `double t0 = pdp__prof.on ? pdp__now() : 0;` and, at its end,
   `if (pdp__prof.on) pdp__prof.<counter> += pdp__now() - t0;`. */
typedef struct pdp__profile_state {
    bool on;
    int threads;
    double t_start, t_stop;
    double gemm_layers_s, other_layers_s, loss_s, optim_s;
    double join_wait_s;   /* the caller waiting for its workers at a part's end */
    double worker_busy_s; /* the workers' seconds inside this caller's parts */
} pdp__profile_state;
/* This thread's growing scratch buffer (64-byte aligned, freed at thread exit), or
   NULL when out of memory; valid until the next call on this thread. Leaf use only. */
PDP__PRIVATE void *pdp__thread_scratch(size_t bytes);

/* ---- devices (cuda_host.c) ----
   Memory on a device other than the CPU goes through these; without PDP_CUDA a
   CUDA device fails with PDP_ERR_UNSUPPORTED naming the macro. */
PDP__PRIVATE pdp_status pdp__dev_alloc(pdp_device d, size_t bytes, void **out);
PDP__PRIVATE void pdp__dev_free(pdp_device d, void *p);
PDP__PRIVATE pdp_status pdp__dev_memset0(pdp_device d, void *p, size_t bytes);
PDP__PRIVATE pdp_status pdp__dev_fill(pdp_device d, float *p, int64_t count, float value);
PDP__PRIVATE pdp_status pdp__dev_copy(pdp_device dst_dev, void *dst, pdp_device src_dev,
                                      const void *src, size_t bytes);

/* ---- model internals (model.c, layers.c, loss.c and the executors) ---- */

typedef enum pdp__layer_kind {
    PDP__LINEAR,
    PDP__RELU,
    PDP__GELU,
    PDP__TANH,
    PDP__SIGMOID,
    PDP__DROPOUT,
    PDP__LAYERNORM,
    PDP__CONV2D,
    PDP__MAXPOOL2D,
    PDP__FLATTEN,
    PDP__TP_COPY,                /* tensor parallel (tp.c): f, g and the split Linears */
    PDP__COLUMN_PARALLEL_LINEAR,
    PDP__ROW_PARALLEL_LINEAR,
    PDP__TP_REDUCE,
    PDP__SILU,
    PDP__EMBEDDING,              /* a GPT's kinds (layers_gpt.c) */
    PDP__CAUSAL_SELF_ATTENTION,
    PDP__RESIDUAL,
    PDP__RESIDUAL_ADD,
    PDP__TIED_LINEAR,
    PDP__SEQ_SCATTER,            /* sequence parallel (tp.c): the sequence split and gathered */
    PDP__SEQ_GATHER,
    PDP__SEQ_REDUCE_SCATTER,
    PDP__GELU_ERF,               /* a new kind goes here: earlier values stay as they were */
    PDP__LAYER_KIND_COUNT
} pdp__layer_kind;

/* A layer's definition: immutable once added, shared by replicas. */
typedef struct pdp__layer {
    pdp__layer_kind kind;
    int index;                           /* position in the model ("3" of "3.weight") */
    int mask_index;                      /* what keys its random masks (Dropout, attention
                                            dropout): its place among the layers that are not
                                            TP's f and g, so a TP model draws the single-device
                                            model's masks; index on a model without TP */
    int in_ndim, out_ndim;               /* per-sample shapes: (F) or (C, H, W) */
    int64_t in_shape[3], out_shape[3];
    int64_t in_count, out_count;         /* per-sample element counts */
    int param_first, nparams;            /* registry indices (weight, then bias) */
    int64_t out_features;                /* Linear; Conv2d out channels */
    int64_t kernel, stride, padding;     /* Conv2d, MaxPool2d */
    float p;                             /* Dropout; CausalSelfAttention's attention dropout */
    float eps;                           /* LayerNorm */
    int64_t positions;                   /* Linear, LayerNorm on a [T, C] sample: T rows, each
                                            acted on alone (PyTorch's per-position Linear,
                                            LayerNorm(C)); 1 (or 0) for a 1-D sample */
    int64_t vocab, context;              /* Embedding: token ids [0, vocab), positions table
                                            rows */
    int64_t heads;                       /* CausalSelfAttention */
    int recompute;                       /* the model's recomputation is selective (set at
                                            the add): a CausalSelfAttention keeps no att */
    int residual_from;                   /* ResidualAdd: the index of its region's Residual */
    int tied_param;                      /* TiedLinear: the registry index of its weight (a
                                            parameter another layer owns) */
    int64_t tied_in;                     /* TiedLinear: that weight is [out_features, tied_in] */
    int64_t saved_per_sample;            /* floats kept from forward for backward */
    int64_t work_per_sample;             /* floats of temporary workspace */
    struct pdp__tp_state *tp;            /* TP kinds: the model's TP state (tp.c); else NULL */
    int64_t tp_lo, tp_full;              /* TP Linears: this rank holds [tp_lo, tp_lo + local)
                                            of the split dimension, tp_full wide (of each
                                            part); a CausalSelfAttention on a TP shard: its
                                            first head and the full head count */
    int64_t tp_parts;                    /* ColumnParallelLinear: the output is tp_parts
                                            blocks split alike (3: a GPT's q | k | v, so a
                                            rank holds q, k and v of its heads); 0 or 1:
                                            one */
    bool tp_skip_dx;                     /* ColumnParallelLinear after an f that is layer 0: no
                                            input gradient is needed */
    bool tp_seq;                         /* sequence parallel (tp.h): the layer acts on this
                                            rank's T / N positions of each [T, C] sample, from
                                            position tp_seq_lo (a LayerNorm, Dropout or residual
                                            between TP blocks; tp is the model's TP state); its
                                            parameters are whole on every rank and the slices'
                                            gradients are summed over TP in backward
                                            (layers_tp.c) */
    int64_t tp_seq_lo;                   /* tp_seq and the sequence-parallel kinds: this rank's
                                            first position */
    bool tp_sum_dy;                      /* GatherFromSequenceParallelRegion: its output gradient
                                            is a partial sum (a TP block follows) and backward
                                            reduce-scatters it; else it is replicated and
                                            backward keeps this rank's slice */
    int64_t mask_first;                  /* Dropout on a slice of a sample (tp_seq): the full
                                            sample's index of the slice's first element, so the
                                            slice draws the full sample's masks; else 0 */
} pdp__layer;

/* What one layer call sees. Pointers are on the model's device. */
typedef struct pdp__layer_io {
    int64_t batch;
    const float *x;      /* [batch, in_count] */
    float *y;            /* [batch, out_count] */
    const float *dy;     /* backward: [batch, out_count] */
    float *dx;           /* backward: [batch, in_count], NULL when not needed (first layer) */
    float *w, *b;        /* parameters (NULL when absent) */
    float *dw, *db;      /* their gradients, accumulated into (+=) */
    float *saved;        /* [batch, saved_per_sample] written by forward, read by backward */
    float *work;         /* [batch, work_per_sample] scratch, shared by all layers */
    pdp_device device;   /* where every pointer above lives */
    bool training;
    bool bf16;           /* the model's precision is PDP_PRECISION_BF16: GEMM inputs in bf16 */
    bool fused_relu;     /* Conv2d, Linear on the CPU: a ReLU follows and is applied here (forward:
                            y = relu(.); backward: dy masked by y > 0); model.c aliases it */
    const float *skip;   /* Residual, ResidualAdd (PDP__LAYER_SKIP): forward, the residual
                            region's input [batch, in_count] */
    float *dskip;        /* backward: the gradient the region's end sends around the branch
                            (ResidualAdd writes it, Residual adds it) */
    float *gelu_y;       /* Linear on the CPU, non-NULL: a GELU follows and is applied here:
                            forward keeps y = x W^T + b (the GELU's input, which its
                            backward reads) and writes gelu_y = gelu(y), the GELU's output;
                            backward gets the GELU's dy and takes dy gelu'(y) as its own
                            (model.c skips the GELU) */
    float *pool_y;       /* Conv2d on the CPU, non-NULL: that ReLU is followed by a 2x2
                            stride-2 MaxPool2d over an even H and W, also applied here:
                            forward writes the pool's output and winners (its y and saved,
                            pool_y and pool_arg) and no y of its own (y is NULL); backward
                            gets the pool's dy, and dy at each winner, masked by the pooled
                            value > 0, is the convolution's (model.c skips the MaxPool2d) */
    int32_t *pool_arg;
    uint64_t seed;       /* dropout: mask = f(seed, layer, step, sample_base + i, j) */
    uint64_t step;
    int64_t sample_base;
} pdp__layer_io;

/* Shapes of a layer's parameters, weight then bias; ndim 0: none. */
typedef struct pdp__param_shapes {
    int wndim, bndim;
    int64_t wshape[4], bshape[4];
    const char *wname, *bname; /* their names after "<number>."; NULL: "weight", "bias" */
} pdp__param_shapes;

/* Flags of a layer kind: every decision outside a kind's own code that depends on
   what a kind is (model.c's views and fusions, tp.c's TP block, state_dict numbering)
   reads these, never the kind's value. */
#define PDP__LAYER_VIEW 1u       /* output = input seen again (Flatten): model.c aliases it
                                    and never calls forward or backward */
#define PDP__LAYER_FUSES_RELU 2u /* on the CPU, applies a following ReLU itself when
                                    io->fused_relu (model.c then makes the ReLU a view) */
#define PDP__LAYER_COLLECTIVE 4u /* runs a collective (TP's f and g): its CPU entries run on
                                    every device (the communicator moves the device's
                                    buffers) */
#define PDP__LAYER_UNNUMBERED 8u /* not a module of the state_dict numbering (TP's f and g,
                                    functions in Megatron-LM): the layers after it are named
                                    as if it were absent ("0.weight", "2.weight", ...) */
#define PDP__LAYER_FUSES_POOL 16u /* with its fused ReLU, applies a following 2x2 stride-2
                                     max pool (PDP__LAYER_FUSABLE_POOL) itself (io->pool_y;
                                     model.c skips it) */
#define PDP__LAYER_ELEMENTWISE 32u /* each output element is a fixed function of its input
                                      element alone (no parameters, position or random
                                      draw): it may sit on a TP shard, between a
                                      ColumnParallelLinear and a RowParallelLinear (tp.c) */
#define PDP__LAYER_FUSABLE_RELU 64u /* the ReLU a PDP__LAYER_FUSES_RELU kind applies when it
                                       follows it (model.c: pdp__model_relu_fused) */
#define PDP__LAYER_TAKES_IDS 256u /* its input is int32 token ids (Embedding): only a model's
                                     first layer, on a model whose input_dtype is
                                     PDP_DTYPE_I32; it has no input gradient */
#define PDP__LAYER_FORWARD_VIEW 512u /* forward: output = input, aliased and never called (as
                                        PDP__LAYER_VIEW); backward runs (Residual: it adds
                                        the gradient sent around the branch) */
#define PDP__LAYER_SKIP 1024u /* model.c hands it its residual region's skip (io->skip,
                                 io->dskip): a Residual or its ResidualAdd */
#define PDP__LAYER_TIED 2048u /* its weight is another layer's parameter (l->tied_param: a
                                 GPT's head tied to the token embedding); it owns none */
#define PDP__LAYER_HEADWISE 4096u /* acts on each attention head's q, k, v alone: after a
                                     ColumnParallelLinear split by heads (tp_parts 3) it is
                                     the attention of this rank's heads (tp.c) */
#define PDP__LAYER_FUSABLE_POOL 128u /* a max pool (kernel, stride) that a
                                        PDP__LAYER_FUSES_POOL kind applies after its fused
                                        ReLU when it is 2x2 stride 2 over an even H and W */
#define PDP__LAYER_FUSES_GELU 8192u /* on the CPU, applies a following GELU
                                       (PDP__LAYER_FUSABLE_GELU) itself, writing the GELU's
                                       output too (io->gelu_y; model.c skips the GELU) */
#define PDP__LAYER_FUSABLE_GELU 16384u /* the GELU a PDP__LAYER_FUSES_GELU kind applies when
                                          it follows it (model.c: pdp__model_gelu_fused) */

/* One layer kind: an entry of layers_table.c's pdp__layer_kinds, indexed by kind.
   setup fills out_*, saved_per_sample, work_per_sample and *ps from the
   configuration and in_* (in: the input shape as text, for messages); init
   (NULL: no parameters) fills host memory w, b from r; forward and backward run on
   the CPU and return PDP_OK, or a status whose message (pdp__err) says what is wrong
   with the input without naming the layer (model.c prefixes "pdp_model_forward:
   layer 3 (Linear): "); they allocate nothing, so a check costs a compare; the CUDA
   entries (NULL: none) return pdp_cuda.cu's status; cuda_work (NULL: none) is the
   workspace floats per sample pdp_cuda.cu's kernels need; flops (NULL: none, a view or
   a collective) estimates the forward + backward FLOPs per sample from the shapes, the
   input gradient's share only when input_grad (layers_table.c, "work estimates"). */
typedef struct pdp__layer_kind_info {
    const char *name; /* PyTorch's class name, for messages and pdp_model_layer_name */
    pdp_status (*setup)(pdp__layer *l, pdp__param_shapes *ps, const char *in);
    void (*init)(const pdp__layer *l, float *w, float *b, pdp_rng *r);
    pdp_status (*forward)(const pdp__layer *l, const pdp__layer_io *io);
    pdp_status (*backward)(const pdp__layer *l, const pdp__layer_io *io);
    pdp_status (*cuda_forward)(const pdp__layer *l, const pdp__layer_io *io);
    pdp_status (*cuda_backward)(const pdp__layer *l, const pdp__layer_io *io);
    int64_t (*cuda_work)(const pdp__layer *l);
    unsigned flags; /* PDP__LAYER_* */
    double (*flops)(const pdp__layer *l, bool input_grad);
} pdp__layer_kind_info;

/* layers_table.c: dispatch through the table. pdp__layer_setup: shape inference and
   validation; pdp__layer_init_params: parameter initialisation; forward and
   backward on io->device (backward of a tp_seq layer with parameters: through
   pdp__tp_seq_backward, its gradients summed over TP); the workspace floats per sample
   on device d; the FLOPs estimate (0 for a kind without one). */
PDP__PRIVATE const pdp__layer_kind_info *pdp__layer_kind_of(pdp__layer_kind k);
PDP__PRIVATE pdp_status pdp__layer_setup(pdp__layer *l, pdp__param_shapes *ps);
PDP__PRIVATE void pdp__layer_init_params(const pdp__layer *l, float *w, float *b, pdp_rng *r);
PDP__PRIVATE pdp_status pdp__layer_forward(const pdp__layer *l, const pdp__layer_io *io);
PDP__PRIVATE pdp_status pdp__layer_backward(const pdp__layer *l, const pdp__layer_io *io);
PDP__PRIVATE const char *pdp__layer_kind_name(pdp__layer_kind k);
PDP__PRIVATE const char *pdp__layer_kinds_with(unsigned flag, char *buf, size_t cap);
PDP__PRIVATE int64_t pdp__layer_work_per_sample(const pdp__layer *l, pdp_device d);
PDP__PRIVATE double pdp__layer_flops(const pdp__layer *l, bool input_grad);

typedef struct pdp__param_entry {
    char name[64]; /* "3.weight", or a builder's ("transformer.h.0.attn.c_attn.weight") */
    int layer;
    int ndim;
    int64_t shape[4];
    int64_t offset, count;
} pdp__param_entry;

/* ---- tensor parallel (tp.c) ----
   A model's TP state: the communicator its TP layers all-reduce on (NULL: none), this
   rank's place in it, and the counters. Embedded in the model, pointed at by its TP
   layers (and by a replica's, which share it). The TP kinds' table entries follow. */
typedef struct pdp__tp_state {
    pdp_comm *comm;
    int rank, size;
    int nlayers;          /* TP layers added */
    int checked;          /* TP layers the last passing width check covered: f's forward
                             runs the check (collective) while it differs from nlayers */
    pdp_model *model;     /* the model holding this state (the check reads its layers) */
    /* tp.c's pdp__tp_check_widths, set by pdp_model_set_tp (f's forward, layers_tp.c,
       comes before tp.c in the amalgamation) */
    pdp_status (*check_widths)(struct pdp__tp_state *tp);
    float scalar;         /* clipping's all-reduced squared norm (pdp_clip_grad_norm) */
    float *dscalar;       /* a CUDA model's device copy of it (NCCL reduces device memory
                             only): allocated by pdp_model_set_tp, freed by pdp_model_free */
    pdp_tp_stats stats;
} pdp__tp_state;

/* Every TP rank's TP layers against TP rank 0's (kinds, places, full widths), collective
   over tp->comm: all ranks return PDP_ERR_INVALID naming the first difference, or PDP_OK
   and tp->checked = tp->nlayers. f's forward calls it (tp->check_widths) while checked
   != nlayers. */
PDP__PRIVATE pdp_status pdp__tp_check_widths(pdp__tp_state *tp);
/* The layer owning parameter p of m (a pipeline stage's too: layers_tp.c). */
PDP__PRIVATE const pdp__layer *pdp__tp_param_layer(const pdp_model *m, int p);
/* Whether parameter p of m is a TP slice (layers_tp.c; else whole on every TP rank). */
PDP__PRIVATE bool pdp__tp_is_split(const pdp_model *m, int p);

PDP__PRIVATE pdp_status pdp__tp_copy_setup(pdp__layer *l, pdp__param_shapes *ps, const char *in);
PDP__PRIVATE pdp_status pdp__tp_copy_forward(const pdp__layer *l, const pdp__layer_io *io);
PDP__PRIVATE pdp_status pdp__tp_copy_backward(const pdp__layer *l, const pdp__layer_io *io);
PDP__PRIVATE pdp_status pdp__tp_reduce_setup(pdp__layer *l, pdp__param_shapes *ps, const char *in);
PDP__PRIVATE pdp_status pdp__tp_reduce_forward(const pdp__layer *l, const pdp__layer_io *io);
PDP__PRIVATE pdp_status pdp__tp_reduce_backward(const pdp__layer *l, const pdp__layer_io *io);
PDP__PRIVATE pdp_status pdp__tp_column_setup(pdp__layer *l, pdp__param_shapes *ps, const char *in);
PDP__PRIVATE void pdp__tp_column_init(const pdp__layer *l, float *w, float *b, pdp_rng *r);
PDP__PRIVATE pdp_status pdp__tp_column_backward(const pdp__layer *l, const pdp__layer_io *io);
PDP__PRIVATE pdp_status pdp__tp_row_setup(pdp__layer *l, pdp__param_shapes *ps, const char *in);
PDP__PRIVATE void pdp__tp_row_init(const pdp__layer *l, float *w, float *b, pdp_rng *r);
PDP__PRIVATE pdp_status pdp__tp_row_forward(const pdp__layer *l, const pdp__layer_io *io);
PDP__PRIVATE pdp_status pdp__tp_seq_setup(pdp__layer *l, pdp__param_shapes *ps, const char *in);
PDP__PRIVATE pdp_status pdp__tp_seq_scatter_forward(const pdp__layer *l, const pdp__layer_io *io);
PDP__PRIVATE pdp_status pdp__tp_seq_scatter_backward(const pdp__layer *l, const pdp__layer_io *io);
PDP__PRIVATE pdp_status pdp__tp_seq_gather_forward(const pdp__layer *l, const pdp__layer_io *io);
PDP__PRIVATE pdp_status pdp__tp_seq_gather_backward(const pdp__layer *l, const pdp__layer_io *io);
PDP__PRIVATE pdp_status pdp__tp_seq_reduce_scatter_forward(const pdp__layer *l,
                                                           const pdp__layer_io *io);
/* Backward of a tp_seq layer with parameters (a LayerNorm under sequence parallelism):
   backward (the kind's entry on io's device) into the workspace, the slices' sum over TP,
   added to io->dw and io->db (layers_table.c's pdp__layer_backward calls it). */
PDP__PRIVATE pdp_status pdp__tp_seq_backward(const pdp__layer *l, const pdp__layer_io *io,
                                             pdp_status (*backward)(const pdp__layer *,
                                                                    const pdp__layer_io *));
#ifdef PDP_CUDA
PDP__PRIVATE pdp_status pdp__tp_column_cuda_backward(const pdp__layer *l, const pdp__layer_io *io);
PDP__PRIVATE pdp_status pdp__tp_row_cuda_forward(const pdp__layer *l, const pdp__layer_io *io);
#endif
/* The executor seam (DDP, ZeRO): events of a pass, and where a layer's parameters
   and gradients live. The event function (NULL: off) is called before the forward
   of each layer with parameters, its own or another layer's (PDP__LAYER_TIED)
   (FORWARD_LAYER), when pdp_model_backward starts (BACKWARD_BEGIN: a failure refuses
   the backward, its message stands), before the backward of each such layer
   (BACKWARD_LAYER), before the forward of each such layer of a region that FULL
   recomputation runs again inside backward (RECOMPUTE_LAYER: the region's, in forward
   order, before the BACKWARD_LAYER of its ResidualAdd and of its layers), and after the
   last layer or the failing one (BACKWARD_END, st = the pass's status, return ignored), and
   when pdp_model_zero_grad runs, before it zeroes the model's gradient block (ZERO_GRAD,
   layer -1, return ignored: the executor waits for collectives still writing gradients and
   zeroes those it holds itself, ZeRO's buffers and shard). */
typedef enum pdp__model_event {
    PDP__EV_FORWARD_LAYER,
    PDP__EV_BACKWARD_BEGIN,
    PDP__EV_BACKWARD_LAYER,
    PDP__EV_RECOMPUTE_LAYER,
    PDP__EV_BACKWARD_END,
    PDP__EV_ZERO_GRAD
} pdp__model_event;
typedef pdp_status (*pdp__model_event_fn)(void *user, pdp_model *m, pdp__model_event ev,
                                          int layer, pdp_status st);

/* Who holds a model ("wrapped" in the docs): a DP master, a DDP or ZeRO executor, or a
   pipeline (its stage model). A wrapped model refuses what would change its layout, and
   calls whose answer the executor changes name the executor's call instead. */
typedef enum pdp__wrap {
    PDP__WRAP_NONE = 0,
    PDP__WRAP_DP,
    PDP__WRAP_DDP,
    PDP__WRAP_ZERO,
    PDP__WRAP_PP
} pdp__wrap;

/* A wrapped model's parameter views where its executor holds the blocks (ZeRO):
   adjusts out->value, out->grad and their ranges for parameter index (model.c has
   filled out with the views of the model's own blocks, or empty ones where a block is
   gone), or refuses, the message starting with fn. */
typedef pdp_status (*pdp__model_views_fn)(void *user, const pdp_model *m, int index,
                                          pdp_param *out, const char *fn);

struct pdp_model {
    pdp_device device;
    uint64_t seed;
    pdp_rng init_rng;
    int in_ndim;
    int64_t in_shape[3], in_count;
    pdp_dtype in_dtype;      /* float32, or int32 token ids for an Embedding first */
    pdp_recompute recompute; /* activation recomputation (pdp_model_desc.recompute) */
    int open_residual;       /* the Residual of a region not yet closed; -1: none */
    pdp__layer *layers;
    int nlayers, cap_layers;
    pdp__param_entry *params;
    int nparams, cap_params;
    int64_t param_count;
    float *param_block;      /* param_count floats in use (borrowed when params_shared) */
    float *grad_block;       /* param_count floats in use */
    /* The blocks pdp__model_add allocated hold param_cap floats (more than param_count
       while a builder's pdp__model_reserve_params room is filling) while they are
       cap_param_block and cap_grad_block (an executor or a pipeline may swap in blocks of
       its own, of param_count floats). */
    int64_t param_cap;
    float *cap_param_block, *cap_grad_block;
    bool params_shared;      /* a DP replica reading its master's parameters */
    /* activations: act[i] is the output of layer i, [max_batch, out_count] */
    int64_t max_batch, batch;
    float **act;
    float *act_block, *saved_block, *work_block, *grad_a, *grad_b;
    float *grad_skip;        /* residual regions: the gradient sent around the branch, [max_batch,
                                widest] (NULL when the model has none) */
    int64_t *saved_off;      /* per layer, floats per sample before it in saved_block */
    pdp_tensor out_view;
    bool training;
    pdp_precision precision; /* of Linear and Conv2d products (pdp_model_set_precision) */
    bool have_forward;       /* a forward ran since the last backward */
    bool in_backward;        /* pdp_model_backward is running (its grad hooks may call in):
                                a pass, a re-plan or a new layer is refused until it returns
                                (pdp__model_check_idle) */
    uint64_t step;           /* training forwards so far (keys dropout masks) */
    int64_t sample_base;     /* global index of this model's first sample (DP replicas) */
    pdp_grad_hook hook;        /* the user's (pdp_model_set_grad_hook) */
    void *hook_user;
    pdp_grad_hook exec_hook;   /* the executor's (DDP's and ZeRO's reducer), called after the
                                  user's: a user's hook never replaces it */
    void *exec_hook_user;
    int trace_pid, trace_tid;  /* trace forward/backward per layer on this track (tid 0: off);
                                  set by the DDP reducer when PDP_TRACE is on */
    pdp__tp_state tp;          /* tensor parallel: the TP communicator (pdp_model_set_tp) */
    pdp__wrap wrapped;         /* the executor holding the model (PDP__WRAP_NONE: none); set
                                  by its create, cleared by its free (pdp__model_wrap) */
    int wrap_stage;            /* ZeRO's stage while wrapped by ZeRO; else 0 */
    const char *grads_reducing; /* not NULL while DDP's or ZeRO's reducer has collectives in
                                  flight on the gradients (reducer.c, REDUCING): the calls that
                                  wait for them; pdp_clip_grad_norm and pdp_optim_step refuse
                                  the model until then (the progress thread writes them) */
    int sliced_rank, sliced_world; /* sliced_world > 1: ZeRO stage 3 was freed without
                                  gathering (pdp_zero_free), so the parameter block holds rank
                                  sliced_rank's slices and zeros elsewhere: a forward, a save
                                  and a new executor refuse it (pdp__model_check_whole) until a
                                  whole checkpoint loads (pdp_checkpoint_load,
                                  pdp_tp_checkpoint_load) */
    pdp__model_views_fn views; /* pdp_model_param's views (above); NULL: the blocks' */
    void *views_user;
    pdp__model_event_fn event; /* the executor seam (above); NULL: off */
    void *event_user;
    float **layer_w, **layer_dw; /* per layer (NULL array or entry: the blocks at the
                                    weight's offset): where the executor put the layer's
                                    weight (its bias follows it) and their gradients */
    /* pipeline stages (pp.c; defaults 0/NULL leave a model as it was) */
    int nslots, slot;        /* activation sets kept (0 = 1) and the one forward/backward use */
    int64_t act_stride, saved_stride; /* floats from one set of act_block/saved_block to the next */
    float *input_grad;       /* not NULL: backward writes d(loss)/d(input) here [batch, in] */
    double *layer_s;         /* not NULL: forward and backward add each layer's seconds */
};

/* Executors holding a model (model.c). pdp__model_wrap: marks m as held by kind (stage:
   ZeRO's, else 0), or refuses with PDP_ERR_STATE, the message starting with fn, a model
   another executor holds (one executor per model: two would both own its gradients),
   naming both. pdp__model_unwrap: held by none again (the executor's free).
   pdp__model_wrapper: "ZeRO stage 3 (pdp_zero_create)", the holder for messages.
   pdp__model_check_layout: PDP_ERR_STATE for a call fn that would change the layout or
   the parameter block of a wrapped model (or a DP replica), naming the executor; what:
   the advice ("add layers before wrapping it"). */
PDP__PRIVATE pdp_status pdp__model_wrap(pdp_model *m, pdp__wrap kind, int stage, const char *fn);
/* A builder that knows its model's size: room for count floats in both blocks before the
   layers come, so none of them copies the blocks; then, built, before anyone holds a view,
   the blocks cut to param_count floats (a no-op when they are). pdp_gpt_create's. */
PDP__PRIVATE pdp_status pdp__model_reserve_params(pdp_model *m, int64_t count);
PDP__PRIVATE pdp_status pdp__model_fit_params(pdp_model *m);
PDP__PRIVATE void pdp__model_unwrap(pdp_model *m);
/* PDP_OK, or PDP_ERR_STATE (the message starting with fn) for a model whose parameter block
   holds one rank's ZeRO-3 slices only (sliced_world above). */
PDP__PRIVATE pdp_status pdp__model_check_whole(const pdp_model *m, const char *fn);
PDP__PRIVATE const char *pdp__model_wrapper(const pdp_model *m);
PDP__PRIVATE pdp_status pdp__model_check_layout(const pdp_model *m, const char *what,
                                                const char *fn);
/* A parameter view for pdp_model_param (model.c): e's shape over data when full, else 1-d
   of count floats; data NULL: empty (count 0). */
PDP__PRIVATE void pdp__model_view(float *data, pdp_device d, const pdp__param_entry *e, bool full,
                                  int64_t count, pdp_tensor *out);

/* A model with the same layers and a fresh set of buffers. share_params: the
   clone reads src's parameter block (CPU DP replicas); otherwise it gets its own
   copy of the parameter values. */
PDP__PRIVATE pdp_status pdp__model_clone(const pdp_model *src, pdp_device device, bool share_params,
                                         pdp_model **out);
/* Pipeline stages (model.c, for pp.c). pdp__model_stage: a new model holding layers [lo, hi)
   of full, with their parameters copied (names, layer indices and dropout keys stay full's:
   "3.weight" stays "3.weight"), zeroed gradients, input shape (and dtype) that of layer lo.
   A TiedLinear whose weight an earlier stage owns gets a copy of it as the stage's last
   parameter (pp.c keeps the two equal); a cut inside a residual region is
   PDP_ERR_UNSUPPORTED naming the region.
   pdp__model_set_slots: keep nslots sets of activations and saved tensors (buffers are
   re-planned on the next reserve). pdp__model_use_slot: the next forward writes set slot;
   with forwarded, the next backward reads set slot, whose forward ran on input x of batch
   rows (x must be the input that forward was given, still alive). */
PDP__PRIVATE pdp_status pdp__model_stage(const pdp_model *full, int lo, int hi, pdp_model **out);
/* A model with full's layers and parameter registry, no gradients and no executor, and a
   zeroed parameter block when with_block (model.c; pp.c's staging for full checkpoints). */
PDP__PRIVATE pdp_status pdp__model_layout(const pdp_model *full, bool with_block, pdp_model **out);
/* Renames parameter p (model.c; a builder's names, pdp_gpt_create's). */
PDP__PRIVATE pdp_status pdp__model_rename_param(pdp_model *m, int p, const char *name);
PDP__PRIVATE pdp_status pdp__model_set_slots(pdp_model *m, int nslots);
PDP__PRIVATE void pdp__model_use_slot(pdp_model *m, int slot, const float *x, int64_t batch,
                                      bool forwarded);

/* ---- losses (loss.c) ----
   Softmax cross-entropy over integer labels: *loss_sum gets the sum over the
   batch of -log softmax(logits)[label] (double accumulation), and when dlogits
   is not NULL it gets (softmax - onehot) * grad_scale. The public loss uses
   grad_scale = 1/batch; DP replicas use 1/global_batch so that the reduced
   gradients equal those of the whole batch. fn names the public caller. */
PDP__PRIVATE pdp_status pdp__cross_entropy(const float *logits, const int32_t *labels,
                                           int64_t batch, int64_t classes, float grad_scale,
                                           double *loss_sum, float *dlogits, const char *fn);

/* ---- CUDA dispatch (cuda_host.c) ----
   loss.c and optim.c hand work on a CUDA device to these; without
   PDP_CUDA they fail with PDP_ERR_UNSUPPORTED naming the macro. Same contracts
   as the CPU functions they stand in for (pointers on device d or io->device;
   labels in host memory). pdp__dev_add: dst += src on d (DP's reduce). */
/* Per-step scalars of the element loop (optim.c's CPU loop, cuda_host.c's kernels),
   taken once per update by pdp__optim_scalars_of from the desc's doubles: 1 - beta,
   1 - dampening, step_size = lr / (1 - beta1^t), bc2_sqrt = sqrt(1 - beta2^t) and
   decay = 1 - lr weight_decay computed in double (as PyTorch does in Python), then each
   rounded to float, as PyTorch's fp32 kernels round a double scalar argument. */
typedef struct pdp__optim_scalars {
    pdp_optim_kind kind;
    float lr, momentum, one_minus_damp, weight_decay;
    int nesterov, first;
    float beta1, one_minus_beta1, beta2, one_minus_beta2, step_size, bc2_sqrt, eps, l2, decay;
} pdp__optim_scalars;

PDP__PRIVATE pdp_status pdp__cuda_cross_entropy(pdp_device d, const float *logits,
                                                const int32_t *labels, int64_t batch,
                                                int64_t classes, float grad_scale, double *loss_sum,
                                                float *dlogits, const char *fn) PDP__UNUSED;
PDP__PRIVATE pdp_status pdp__cuda_cross_entropy_rows(pdp_device d, const float *logits,
                                                     const int32_t *labels, int64_t rows,
                                                     int64_t classes, float grad_scale,
                                                     double *loss_sum, float *dlogits,
                                                     const char *fn) PDP__UNUSED;
PDP__PRIVATE pdp_status pdp__cuda_mse(pdp_device d, const float *pred, const float *target,
                                      int64_t count, float scale, double *sum, float *dpred,
                                      const char *fn) PDP__UNUSED;
PDP__PRIVATE pdp_status pdp__cuda_optim_update(pdp_device d, const struct pdp__optim_scalars *s,
                                               float *p, const float *g, float *s0, float *s1,
                                               int64_t n) PDP__UNUSED;
PDP__PRIVATE pdp_status pdp__dev_add(pdp_device d, float *dst, const float *src,
                                     int64_t count) PDP__UNUSED;
/* Gradient clipping on d: *sum = sum of x^2 (double, fixed order); x *= s. */
PDP__PRIVATE pdp_status pdp__cuda_sumsq(pdp_device d, const float *x, int64_t count, double *sum,
                                        const char *fn) PDP__UNUSED;
PDP__PRIVATE pdp_status pdp__cuda_scale(pdp_device d, float *x, int64_t count, float s,
                                        const char *fn) PDP__UNUSED;

/* ---- gradient norms (optim.c): the local pieces every clipping call is made of ----
   pdp__grad_sumsq: *sum += the sum of squares of g[0, n) (on m's device; double, fixed
   order). pdp__grad_scale: g[0, n) *= coef. fn names the public caller in errors. */
PDP__PRIVATE pdp_status pdp__grad_sumsq(const pdp_model *m, const float *g, int64_t n, double *sum,
                                        const char *fn);
PDP__PRIVATE pdp_status pdp__grad_scale(const pdp_model *m, float *g, int64_t n, float coef,
                                        const char *fn);
/* *sum += the squares of gradient elements [lo, hi) of m's flat block, held at g[0, hi -
   lo), as a TP group counts them: on a TP model a slice's elements on every TP rank and
   a replicated tensor's on TP rank 0 only, so that the sum over the TP group is the full
   model's; on any other model every element (pdp__grad_sumsq). */
PDP__PRIVATE pdp_status pdp__grad_sumsq_range(const pdp_model *m, const float *g, int64_t lo,
                                              int64_t hi, double *sum, const char *fn);
/* The one rule for max_norm of every clipping call (pdp_clip_grad_norm,
   pdp_zero_clip_grad_norm, pdp_pp_clip_grad_norm): finite and >= 0, else
   PDP_ERR_INVALID "fn: max_norm ...". */
PDP__PRIVATE pdp_status pdp__check_max_norm(float max_norm, const char *fn);
/* torch.nn.utils.clip_grad_norm_'s coefficient max_norm / (norm + 1e-6), in double,
   rounded to float; >= 1 means no clipping. */
PDP__PRIVATE float pdp__clip_coef(float max_norm, double norm);
/* *sum <- the sum over c's ranks of *sum (a float all-reduce: every rank gets the same
   bits). host: a float that outlives the call (the executor's); dev: its copy on c's
   device for a CUDA communicator (NCCL reduces device memory only), else NULL. The
   message names the failing collective; the caller prefixes its own. */
PDP__PRIVATE pdp_status pdp__grad_allreduce_sum(pdp_comm *c, float *host, float *dev, double *sum);

/* ---- optimizer internals (optim.c) ----
   Updates parameters [lo, hi) of the flat blocks (all of them for a normal
   step; one rank's shard under ZeRO). The step counter is advanced by the
   caller-visible pdp_optim_step only. */
PDP__PRIVATE pdp_status pdp__optim_step_range(pdp_optim *o, float *params, const float *grads,
                                              int64_t lo, int64_t hi);
/* pdp_optim_step's checks (model changed since create, ZeRO shard, sharded blocks),
   with its messages; changes nothing. */
PDP__PRIVATE pdp_status pdp__optim_check_step(const pdp_optim *o);
/* The scalars of o's next update (learning rate, Adam's bias corrections). */
PDP__PRIVATE void pdp__optim_scalars_of(const pdp_optim *o, pdp__optim_scalars *s);
/* Parameters [lo, hi) updated on the calling thread with scalars s from
   pdp__optim_scalars_of (a CPU optimizer; nothing is checked or counted). */
PDP__PRIVATE void pdp__optim_update_range(const pdp_optim *o, const pdp__optim_scalars *s,
                                          float *params, const float *grads, int64_t lo,
                                          int64_t hi);
/* Counts an update done range by range (pdp__optim_step_range,
   pdp__optim_update_range) as one step. */
PDP__PRIVATE void pdp__optim_finish_step(pdp_optim *o);
/* An optimizer holding state for [lo, hi) of the flat block only (ZeRO: one
   rank's range; pdp_optim_create is [0, param_count)). pdp_optim_step on it
   updates [lo, hi) only, with the bits a full optimizer gives that range.
   fn names the public caller. */
PDP__PRIVATE pdp_status pdp__optim_create_range(pdp_optim **out, pdp_model *m,
                                                const pdp_optim_desc *desc, int64_t lo, int64_t hi,
                                                const char *fn);

/* ---- checkpoint ranges (checkpoint.c) ----
   One rank's part of a checkpoint under ZeRO: the parameters and/or optimizer
   state of [lo, hi) of the flat block. params: hi - lo floats on m's device
   holding elements [lo, hi) (m->param_block + lo when the rank keeps the whole
   block), or NULL for none; o: an optimizer whose range contains [lo, hi), or
   NULL for none. Save writes a shard file (flat tensors, see checkpoint.c);
   load reads a shard file of exactly [lo, hi) or the slice [lo, hi) of a full
   checkpoint, validating everything before it copies. fn names the public
   caller in messages. */
PDP__PRIVATE pdp_status pdp__checkpoint_save_range(const char *path, const pdp_model *m,
                                                   const float *params, const pdp_optim *o,
                                                   int64_t lo, int64_t hi, const char *fn);
PDP__PRIVATE pdp_status pdp__checkpoint_load_range(const char *path, pdp_model *m, float *params,
                                                   pdp_optim *o, int64_t lo, int64_t hi,
                                                   const char *fn);
/* The same for the shards of one ZeRO save: save writes run (16 lowercase hex
   digits, the save's id) as the shard file's "shard.run"; load accepts only a
   shard file of exactly [lo, hi) whose "shard.run" is run, and fails with
   PDP_ERR_FORMAT naming the file and both runs otherwise. */
PDP__PRIVATE pdp_status pdp__checkpoint_save_run(const char *path, const pdp_model *m,
                                                 const float *params, const pdp_optim *o,
                                                 int64_t lo, int64_t hi, const char *run,
                                                 const char *fn);
PDP__PRIVATE pdp_status pdp__checkpoint_load_run(const char *path, pdp_model *m, float *params,
                                                 pdp_optim *o, int64_t lo, int64_t hi,
                                                 const char *run, const char *fn);

/* ---- ZeRO internals (zero.c, for zero_ckpt.c) ----
   zero_ckpt.c comes after zero.c and reads struct pdp_zero and its units directly;
   these are the two functions of zero.c it calls. fn names the public caller. */
/* Stage 3: every gather slot free (FSDP's reshard), after the all-gathers in flight. */
PDP__PRIVATE pdp_status pdp__zero_release_params(pdp_zero *z);
/* Stages 1-2: every rank's slices of the full block into dst (the model's param_count
   floats, on its device), unit by unit; collective. */
PDP__PRIVATE pdp_status pdp__zero_gather_full(pdp_zero *z, float *dst, const char *fn);

/* ---- communicator internals (comm.c and its backends: comm_local.c, comm_mpi.c,
   comm_nccl.c; comm_queue.c) ----
   Each backend fills one table; the public pdp_comm_* functions (comm.c) validate
   their arguments, then call it. A backend keeps a fixed handle pool so that a
   training step allocates nothing: the local and MPI backends share comm_queue.c's
   collective queue (pdp__workq: pool, FIFO, progress thread, wait/done);
   NCCL's stream orders its collectives, with a pool of event slots. */
typedef struct pdp__comm_ops {
    /* the reductions take any pdp_dtype (comm.c validated it; count is elements) */
    pdp_status (*allreduce)(pdp_comm *c, void *buf, int64_t count, pdp_dtype dt, pdp_reduce_op op,
                            pdp_work **w);
    pdp_status (*broadcast)(pdp_comm *c, float *buf, int64_t count, int root, pdp_work **w);
    pdp_status (*reduce_scatter)(pdp_comm *c, const void *send, void *recv, int64_t recv_count,
                                 pdp_dtype dt, pdp_reduce_op op, pdp_work **w);
    pdp_status (*allgather)(pdp_comm *c, const float *send, float *recv, int64_t send_count,
                            pdp_work **w);
    pdp_status (*barrier)(pdp_comm *c, pdp_work **w);
    pdp_status (*broadcast_bytes)(pdp_comm *c, void *buf, size_t bytes, int root);
    /* point-to-point (comm.c validated peer, tag and count) */
    pdp_status (*send)(pdp_comm *c, const float *buf, int64_t count, int peer, int tag,
                       pdp_work **w);
    pdp_status (*recv)(pdp_comm *c, float *buf, int64_t count, int peer, int tag, pdp_work **w);
    /* a batch that progresses together (comm.h's pdp_comm_sendrecv; comm.c validated it):
       w[i] gets message i's handle; on failure the ones posted before keep theirs, the rest
       are NULL */
    pdp_status (*sendrecv)(pdp_comm *c, const pdp_p2p *ops, int n, pdp_work **w);
    /* collective over c: comm.c has exchanged every rank's (colour, key) and computed this
       rank's place (new_rank of new_size; leader: the old rank of new rank 0) and the new
       communicator's name (cut to PDP__COMM_NAME_CAP); colour < 0 joins nothing (*out
       stays NULL) but takes part */
    pdp_status (*split)(pdp_comm *c, int colour, int key, int new_rank, int new_size, int leader,
                        const char *name, pdp_comm **out);
    pdp_status (*wait)(pdp_work *w);
    bool (*done)(pdp_work *w);
    void (*destroy)(pdp_comm *c);
} pdp__comm_ops;

/* A communicator's name with its NUL (desc.name, a split's "<parent>.<colour>", a mesh
   group's "<world>.TP(DP 1, PP 0)"): a longer one is cut. */
#define PDP__COMM_NAME_CAP 64

/* Common head of every communicator; a backend keeps its state behind impl. */
struct pdp_comm {
    const pdp__comm_ops *ops;
    pdp_backend backend;
    int rank, size;
    int trace_pid;          /* this rank's process lane in the trace: its rank in the world it
                               was split from (MPI: the world rank), so groups do not merge */
    double timeout_s;
    pdp_device device;
    char name[PDP__COMM_NAME_CAP];
    pdp_comm_stats stats;
    void *impl;
};

/* Common head of every handle; a backend's handle struct begins with it.
   Contract between comm.c's public layer and a backend:
   - a collective op always gets a non-NULL w (comm.c makes work == NULL calls
     synchronous) and fills comm, op_name and seq; comm.c sets t_launch;
   - before the handle reports done, the backend sets t_start (execution began,
     after any queueing) and t_done (completed, or failed);
   - ops->wait completes the collective, leaves a failure's message WITHOUT a
     function-name prefix (the public caller adds it) and returns the handle to
     the backend's pool; the head fields stay readable until the next collective
     is issued on that communicator (comm.c reads t_start/t_done after wait). */
struct pdp_work {
    pdp_comm *comm;
    const char *op_name;  /* "allreduce", for messages and the trace */
    int64_t seq;          /* collective number on this communicator */
    double t_launch;      /* pdp__now() at launch */
    double t_start;       /* pdp__now() when the backend began executing it */
    double t_done;        /* pdp__now() at completion */
};

/* The collectives and their names (messages, the trace); pdp_cudak_coll (cuda.h)
   follows the first four. */
typedef enum pdp__coll_kind {
    PDP__COLL_ALLREDUCE,
    PDP__COLL_BROADCAST,
    PDP__COLL_REDUCE_SCATTER,
    PDP__COLL_ALLGATHER,
    PDP__COLL_BARRIER,
    PDP__COLL_BROADCAST_BYTES,
    PDP__COLL_SEND,            /* point-to-point: not collectives, but the same handles */
    PDP__COLL_RECV,
    PDP__COLL_SPLIT
} pdp__coll_kind;

/* A 16-bit element of the reducing collectives (dt: PDP_DTYPE_BF16 or PDP_DTYPE_F16) as
   an fp32, and an fp32 rounded to it (to nearest even): math.h's conversions. */
static inline size_t pdp__dtype_size(int dt) { return dt == PDP_DTYPE_F32 ? 4 : 2; }
static inline float pdp__dt16_float(int dt, uint16_t h)
{
    return dt == PDP_DTYPE_BF16 ? pdp__bf16_float(h) : pdp__f16_float(h);
}
static inline uint16_t pdp__dt16_bits(int dt, float x)
{
    return dt == PDP_DTYPE_BF16 ? pdp__bf16_bits(x) : pdp__f16_bits(x);
}

static const char *pdp__op_names[] = {"allreduce", "broadcast", "reduce_scatter", "allgather",
                                      "barrier", "broadcast_bytes", "send", "recv", "split"};

/* A backend's entry in comm.c's dispatcher (pdp_comm_init_env), defined by its
   module, which comes before comm.c: under its macro it creates the communicator
   from the environment; without it, it fails with PDP_ERR_UNSUPPORTED naming the
   macro. Errors start with "pdp_comm_init_env". */
PDP__PRIVATE pdp_status pdp__comm_init_mpi_env(pdp_comm **out, const pdp_comm_desc *desc);
PDP__PRIVATE pdp_status pdp__comm_init_nccl_env(pdp_comm **out, const pdp_comm_desc *desc);

/* ---- trace (trace.c) ----
   Chrome trace JSON (Perfetto, chrome://tracing) when PDP_TRACE=path is set.
   One process-wide, mutex-guarded sink (one of the exceptions to "no globals"
   that the manual lists, THREADS AND DETERMINISM), reference counted by open/close; PDP_TRACE is
   read by each open while no trace file is open. process_rank >= 0 (this process is one rank of
   several) writes path with ".rank<r>" inserted before the extension. Events take pdp__now()
   seconds; pid = rank, tid = a track from pdp__trace_track; cat is a string
   literal; args NULL or a JSON object body ("\"bytes\":64"). Recording copies
   a fixed-size record and never allocates. Everything is a no-op when off. */
PDP__PRIVATE pdp_status pdp__trace_open(int process_rank);
PDP__PRIVATE void pdp__trace_close(void);
PDP__PRIVATE bool pdp__trace_enabled(void);
PDP__PRIVATE int pdp__trace_track(int pid, const char *name);
PDP__PRIVATE void pdp__trace_complete(int pid, int tid, const char *cat, const char *name,
                                      double t0, double t1, const char *args);
PDP__PRIVATE void pdp__trace_async(int pid, int tid, const char *cat, const char *name, uint64_t id,
                                   double t0, double t1, const char *args);

/* ---- src/platform.c ---- */
/* platform: the system calls behind platform.h's declarations, POSIX then Win32 in
   each section. Nothing here is on a hot path (the lock and wait wrappers are inline
   in platform.h); each function is a few lines over the system's own. */

/* #include "internal.h" (above) */
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
PDP__PRIVATE int pdp__cond_init(pdp__cond *c);

PDP__PRIVATE int pdp__cond_timedwait(pdp__cond *c, pdp__mutex *m, double deadline);

PDP__PRIVATE int pdp__thread_create(pdp__thread *t, void *(*fn)(void *), void *arg);

PDP__PRIVATE void pdp__thread_join(pdp__thread *t);

PDP__PRIVATE int pdp__tls_key_create(pdp__tls_key *k, void (*dtor)(void *));
#else
PDP__PRIVATE int pdp__cond_init(pdp__cond *c);

PDP__PRIVATE int pdp__cond_timedwait(pdp__cond *c, pdp__mutex *m, double deadline);

PDP__PRIVATE DWORD WINAPI pdp__thread_entry(LPVOID p);

PDP__PRIVATE int pdp__thread_create(pdp__thread *t, void *(*fn)(void *), void *arg);

PDP__PRIVATE void pdp__thread_join(pdp__thread *t);

typedef struct pdp__once_box {
    void (*fn)(void);
} pdp__once_box;

PDP__PRIVATE BOOL CALLBACK pdp__once_entry(PINIT_ONCE once, PVOID box, PVOID *ctx);

PDP__PRIVATE void pdp__once_run(pdp__once *o, void (*fn)(void));

PDP__PRIVATE int pdp__tls_key_create(pdp__tls_key *k, void (WINAPI *dtor)(void *));
#endif

#ifdef PDP__FENCE_BY_LOCK
/* PDP__LOAD_ACQ and PDP__STORE_REL without atomic builtins (platform.h) */

PDP__PRIVATE long long pdp__fence(long long loaded);
#endif

/* ---- platform: time, CPUs, processes ---- */

#ifdef PDP__POSIX
PDP__PRIVATE double pdp__now(void);

PDP__PRIVATE uint64_t pdp__wall_ns(void);

PDP__PRIVATE double pdp__thread_cpu_s(void);

PDP__PRIVATE void pdp__sleep_s(double seconds);

PDP__PRIVATE void pdp__yield(void);

PDP__PRIVATE int pdp__cpu_count(void);

PDP__PRIVATE long pdp__pid(void);

PDP__PRIVATE int pdp__at_fork_child(void (*fn)(void));

PDP__PRIVATE bool pdp__pid_alive(long pid);

/* strerror without its shared buffer: glibc's strerror_r is the GNU variant under
   _GNU_SOURCE (as seen when <string.h> was first included) and XSI otherwise. */
PDP__PRIVATE const char *pdp__errstr(int e, char *buf, size_t cap);
#else
PDP__PRIVATE double pdp__now(void);

PDP__PRIVATE uint64_t pdp__wall_ns(void);

PDP__PRIVATE double pdp__thread_cpu_s(void);

PDP__PRIVATE void pdp__sleep_s(double seconds);

PDP__PRIVATE void pdp__yield(void);

PDP__PRIVATE int pdp__cpu_count(void);

PDP__PRIVATE long pdp__pid(void);

PDP__PRIVATE int pdp__at_fork_child(void (*fn)(void));

PDP__PRIVATE bool pdp__pid_alive(long pid);

PDP__PRIVATE const char *pdp__errstr(int e, char *buf, size_t cap);
#endif

/* ---- platform: files ---- */

#ifdef PDP__POSIX
PDP__PRIVATE int pdp__file_sync(FILE *f);

PDP__PRIVATE int pdp__file_replace(const char *from, const char *to);

PDP__PRIVATE int pdp__file_size(FILE *f, uint64_t *bytes);

PDP__PRIVATE int pdp__dir_sync(const char *dir);

PDP__PRIVATE int pdp__dir_open(pdp__dir *d, const char *path);

PDP__PRIVATE const char *pdp__dir_next(pdp__dir *d);

PDP__PRIVATE void pdp__dir_close(pdp__dir *d);

PDP__PRIVATE int pdp__path_kind(const char *path, bool follow);
#else
/* errno for the Win32 errors a file operation meets */
PDP__PRIVATE int pdp__win_errno(DWORD e);

PDP__PRIVATE int pdp__file_sync(FILE *f);

PDP__PRIVATE int pdp__file_replace(const char *from, const char *to);

PDP__PRIVATE int pdp__dir_sync(const char *dir);

PDP__PRIVATE int pdp__file_size(FILE *f, uint64_t *bytes);

PDP__PRIVATE int pdp__dir_open(pdp__dir *d, const char *path);

PDP__PRIVATE const char *pdp__dir_next(pdp__dir *d);

PDP__PRIVATE void pdp__dir_close(pdp__dir *d);

PDP__PRIVATE int pdp__path_kind(const char *path, bool follow);
#endif

/* ---- platform: sockets ---- */

#ifdef PDP__POSIX
PDP__PRIVATE int pdp__sock_startup(void);
PDP__PRIVATE int pdp__sock_error(void);
PDP__PRIVATE void pdp__sock_close(pdp__sock s);

PDP__PRIVATE void pdp__sock_tune(pdp__sock s, bool tcp);

PDP__PRIVATE long pdp__sock_send(pdp__sock s, const void *buf, size_t bytes);

PDP__PRIVATE long pdp__sock_recv(pdp__sock s, void *buf, size_t bytes);

PDP__PRIVATE int pdp__sock_poll(struct pollfd *fds, int n, int timeout_ms);

PDP__PRIVATE int pdp__wake_open(pdp__wake *w);

PDP__PRIVATE void pdp__wake_signal(pdp__wake *w);

PDP__PRIVATE void pdp__wake_close(pdp__wake *w);
#else

PDP__PRIVATE void pdp__wsa_start(void);

/* WSACleanup is left to process exit: a library cannot know the program's last socket */
PDP__PRIVATE int pdp__sock_startup(void);

PDP__PRIVATE int pdp__sock_error(void);

PDP__PRIVATE void pdp__sock_close(pdp__sock s);

PDP__PRIVATE void pdp__sock_tune(pdp__sock s, bool tcp);

PDP__PRIVATE long pdp__sock_send(pdp__sock s, const void *buf, size_t bytes);

PDP__PRIVATE long pdp__sock_recv(pdp__sock s, void *buf, size_t bytes);

PDP__PRIVATE int pdp__sock_poll(struct pollfd *fds, int n, int timeout_ms);

PDP__PRIVATE int pdp__wake_open(pdp__wake *w);

PDP__PRIVATE void pdp__wake_signal(pdp__wake *w);

PDP__PRIVATE void pdp__wake_close(pdp__wake *w);
#endif

PDP__PRIVATE bool pdp__sock_retry(int err);

PDP__PRIVATE pdp__sock pdp__sock_open(int family, int type, int protocol, bool tcp);

PDP__PRIVATE int pdp__sock_wait(pdp__sock s, bool out, double deadline);

PDP__PRIVATE pdp__sock pdp__sock_connect(const struct addrinfo *ai, double deadline, char *why,
                                         size_t cap);

PDP__PRIVATE int pdp__sock_port(pdp__sock s);

/* ---- platform: CPU features ---- */

#ifdef PDP__X86_CPUID
PDP__PRIVATE bool pdp__cpuid(unsigned leaf, unsigned subleaf, unsigned r[4]);

PDP__PRIVATE uint64_t pdp__xgetbv0(void);
#endif

#ifdef PDP__HAVE_AMX_PERMIT
/* Linux's arch_prctl(ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18): lets this
   process use the AMX tile data (Linux 5.16 and later; before, or refused: an error).
   The raw syscall (158 on x86-64): syscall(2) is not declared under strict C99's
   _POSIX_C_SOURCE. */
PDP__PRIVATE bool pdp__amx_permit(void);
#endif

/* ---- src/base.c ---- */
/* base: the tests' knobs, status names, the thread-local error message, aligned allocation. */

/* #include "internal.h" (above) */

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
extern pdp__test_knob_set pdp__test_knobs;
#  define PDP__TEST_KNOB(name, value) (pdp__test_knobs.name ? pdp__test_knobs.name : (value))
#else
#  define PDP__TEST_KNOB(name, value) (value)
#endif

#ifndef PDP__TLS_KEY

 /* the message points at another rank's */
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

PDP__PRIVATE void PDP__STDCALL pdp__tls_free(void *p);
PDP__PRIVATE void pdp__tls_init(void);

PDP__PRIVATE pdp__tls *pdp__tls_get(void);

#  define pdp__errbuf (pdp__tls_get()->errbuf)
#  define pdp__errpeer (pdp__tls_get()->errpeer)
#endif

/* PDP_API const char *pdp_status_name(pdp_status s) */

/* PDP_API const char *pdp_last_error(void) */
/* PDP_API void pdp_clear_error(void) */
/* PDP_API const char *pdp_version_string(void) */

PDP__PRIVATE pdp_status pdp__err_set(pdp_status status, bool peer, const char *fmt, va_list ap);

PDP__PRIVATE pdp_status pdp__err(pdp_status status, const char *fmt, ...);

/* pdp__err for a rank that fails because another did ("rank 1 could not load it"): the
   cause is that rank's message, so pdp_launch reports that one (pdp__err_is_peer), whichever
   rank returned first. pdp__err_wrap keeps the mark. */
PDP__PRIVATE pdp_status pdp__err_peer(pdp_status status, const char *fmt, ...);

PDP__PRIVATE bool pdp__err_is_peer(void);

PDP__PRIVATE void pdp__err_keep(pdp__err_kept *k);

PDP__PRIVATE pdp_status pdp__err_restore(pdp_status status, const pdp__err_kept *k);

PDP__PRIVATE pdp_status pdp__err_wrap(pdp_status status, const char *fmt, ...);

PDP__PRIVATE void *pdp__alloc(size_t bytes);

PDP__PRIVATE void *pdp__calloc(size_t bytes);

PDP__PRIVATE void pdp__dealloc(void *p);

/* ---- src/threads.c ---- */
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

/* #include "internal.h" (above) */

#define PDP__MAX_THREADS 256
#ifndef PDP__SPIN_S
#  define PDP__SPIN_S 100e-6
#endif

/* ---- threads: the per-thread setting ---- */

#ifndef PDP__TLS_KEY
 /* 0: never set, which means 1 */
#else
#  define pdp__num_threads (pdp__tls_get()->num_threads)
#endif

/* PDP_API pdp_status pdp_set_num_threads(int n) */

/* PDP_API int pdp_get_num_threads(void) */

PDP__PRIVATE int pdp__threads_for_caller(void);

/* ---- threads: the profile counters (pdp_profile_*) ---- */

#ifndef PDP__TLS_KEY

#else
#  define pdp__prof (pdp__tls_get()->prof)
#endif

/* PDP_API void pdp_profile_start(void) */

/* PDP_API void pdp_profile_read(pdp_profile *out) */

/* PDP_API void pdp_profile_stop(pdp_profile *out) */

/* ---- threads: per-thread scratch ---- */

typedef struct pdp__scratch_hdr {
    size_t bytes; /* usable bytes after the header */
} pdp__scratch_hdr;

PDP__PRIVATE void PDP__STDCALL pdp__scratch_free(void *p);

PDP__PRIVATE void pdp__scratch_init(void);

/* This thread's scratch buffer of at least `bytes` bytes (64-byte aligned), or NULL
   when out of memory. Valid until the next call on the same thread; its contents
   are not kept when it grows. Only leaf routines (GEMM) use it, never nested. */
PDP__PRIVATE void *pdp__thread_scratch(size_t bytes);

/* ---- threads: the pool ---- */

PDP__PRIVATE void pdp__spin_while(bool (*still)(const void *ctx), const void *ctx);

/* ---- threads: the worker team ---- */

/* pdp__spin_while's conditions: a member waits for a new generation (or stop), the
   caller for its members. */
typedef struct pdp__team_wait {
    const pdp__team *team;
    unsigned long seen;
} pdp__team_wait;

PDP__PRIVATE bool pdp__team_no_new_job(const void *ctx);

PDP__PRIVATE bool pdp__team_pending(const void *team);

PDP__PRIVATE void *pdp__team_main(void *p);

PDP__PRIVATE int pdp__team_init(pdp__team *t);

PDP__PRIVATE int pdp__team_grow(pdp__team *t, int workers);

PDP__PRIVATE void pdp__team_run(pdp__team *t, int n, void (*fn)(void *arg, int i, int n), void *arg);

PDP__PRIVATE void pdp__team_free(pdp__team *t);

/* ---- threads: the pool ---- */

/* The pool: one team, grown on demand. busy is held by the one caller that owns the
   pool for a job (and by pdp_shutdown_threads); it guards every field below. */

typedef struct pdp__pool {
    pdp__team team;            /* team.ok false: not started (or shut down) */
    /* the job while the caller's profile counters are on: */
    void (*fn)(void *arg, int i, int n);
    void *arg;
    int helpers;               /* indices 1..helpers run on members, the rest on the caller */
    double busy_s[PDP__MAX_THREADS]; /* index i's seconds inside fn, written by its member */
    double caller_done;        /* when the caller finished its last index */
} pdp__pool;

/* fork(): the child has the calling thread only, not the pool's workers, and busy or the
   team's lock may have been held, at the fork, by threads the child does not have. Its
   first job then waited forever for members that did not exist (pending never reached 0),
   and pdp_shutdown_threads joined threads that were not its own. In the child the pool is
   forgotten (its lock and conditions are not destroyed: they may be held) and busy made
   free, so that the child's first job starts a team of its own. */

PDP__PRIVATE void pdp__pool_after_fork(void);

PDP__PRIVATE void pdp__pool_fork_init(void);

/* The job under a profile: a member times its index in its own slot, the caller
   notes when it finished its own; the caller reads both once pdp__team_run has
   returned (which orders the members' writes before it). */
PDP__PRIVATE void pdp__pool_timed(void *p, int i, int n);

PDP__PRIVATE void pdp__parallel_for(int n, void (*fn)(void *arg, int i, int n), void *arg);

/* PDP_API void pdp_shutdown_threads(void) */

/* ---- src/trace.c ---- */
/* trace: a Chrome trace of what each rank did and when, for Perfetto
   (ui.perfetto.dev) and chrome://tracing.

   Set PDP_TRACE=path and every object that traces (the DDP reducer, the MPI
   communicator, ...) records events into one process-wide sink; the file is
   the JSON Object Format of the Trace Event Format:
       {"traceEvents":[ {...}, {...} ],"displayTimeUnit":"ms"}
   with complete events ("ph":"X", ts and dur in microseconds), nestable async
   begin/end pairs for collectives ("ph":"b"/"e", one id per collective) and
   metadata that names processes and threads ("ph":"M", process_name,
   thread_name, *_sort_index). "pid" is the rank, "tid" a track: one compute
   track per rank and one per communicator, handed out by pdp__trace_track.

   Why one process-wide sink, not an object: tracing is a process-level
   debugging switch (an environment variable, like NCCL_DEBUG), and thread-ranks
   of one process must share one file with pid = rank. The sink is one of the
   exceptions to "no hidden globals" that the manual lists (THREADS AND
   DETERMINISM, with the intra-op pool, the bf16 path, MPI's ownership record and
   the CUDA devices' state): a mutex-guarded struct that
   exists only between the first pdp__trace_open and the last pdp__trace_close
   (reference counted); PDP_TRACE is read by every open while tracing is off
   (the first open that finds it set starts the file; objects opened before
   stay silent), and the file is completed when the last reference closes, or
   brought up to date by pdp_trace_flush() before that. With PDP_STATIC
   and two copies of pdp in one program there are two sinks: give them
   different PDP_TRACE values or trace only one.

   Files: a process that is one rank of several (MPI, torchrun) passes its
   rank to pdp__trace_open and writes path with ".rank<r>" inserted before the
   extension (trace.json -> trace.rank1.json); otherwise path as given.
   Timestamps are pdp__now() (monotonic) microseconds, shared by every process of a
   machine, so the per-rank files of one machine line up: merge them with
       python3 -c 'import json,sys; print(json.dumps({"traceEvents": sum(
           (json.load(open(f))["traceEvents"] for f in sys.argv[1:]), [])}))' \
           trace.rank*.json > trace.json

   Invariants: events are fixed-size records in a buffer of
   PDP_TRACE_BUFFER_EVENTS allocated at the first open; recording copies one
   record under the mutex and never allocates. A full buffer is written out
   (the recording thread pays for that write, ~1 ms per 10^4 events) and
   reused. After every write the file ends with the closing "]}" (the next
   write seeks back over it), so the file is valid JSON after each flush and
   after close, and pdp_trace_flush() makes it current at any time. Names are
   copied (truncated to 47 bytes) and escaped when written; args are a JSON
   object body built by pdp code ("\"bytes\":4096,\"seq\":3"), copied as is.
   Reference: "Trace Event Format", Google, docs.google.com/document/d/
   1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU. */

/* #include "internal.h" (above) */

#ifndef PDP_TRACE_BUFFER_EVENTS
#  define PDP_TRACE_BUFFER_EVENTS 16384 /* records kept in memory between writes (160 B each) */
#endif
#define PDP__TRACE_MAX_PIDS 4096        /* ranks whose process gets a name */

/* ---- trace: records ---- */

typedef struct pdp__trace_ev {
    double ts, dur;   /* microseconds */
    uint64_t id;      /* async pair id */
    int pid, tid;
    char ph;          /* 'X' complete, 'A' async pair (written as "b" and "e"), 'M' metadata */
    const char *cat;  /* a string literal */
    char name[48];
    char args[88];    /* JSON object body, without braces; "" for none */
} pdp__trace_ev;

typedef struct pdp__trace_sink {
    int refs;                 /* open minus close calls */
    int enabled;              /* read with PDP__LOAD_ACQ on the hot path */
    FILE *f;
    char path[1024];
    char prev_path[1024];     /* the file completed last (reopen) */
    long data_end;            /* file offset where the closing trailer starts */
    int64_t written;          /* events written so far (for the separator) */
    pdp__trace_ev *ev;
    int n, cap;
    int next_tid;
    bool reopen;              /* a file of this process was completed at path: a later open
                                 appends to it instead of truncating it */
    pdp_status io_status;     /* first write error, reported by pdp_trace_flush */
    unsigned char named_pid[PDP__TRACE_MAX_PIDS / 8];
} pdp__trace_sink;

 /* process-wide, see above */

/* ---- trace: writing ---- */

PDP__PRIVATE void pdp__trace_put_escaped(FILE *f, const char *s);

PDP__PRIVATE void pdp__trace_put_one(FILE *f, const pdp__trace_ev *e, char ph, double ts, bool dur);

/* Appends the buffered records after the last one written, then the trailer.
   Called with the mutex held. */
PDP__PRIVATE void pdp__trace_write_locked(pdp__trace_sink *s);

/* The next free record (writing the buffer out when it is full). Mutex held. */
PDP__PRIVATE pdp__trace_ev *pdp__trace_slot_locked(pdp__trace_sink *s);

PDP__PRIVATE void pdp__trace_copy(char *dst, size_t cap, const char *src);

/* args = "\"name\":\"<escaped s>\"" for metadata records. */
PDP__PRIVATE void pdp__trace_name_arg(char *dst, size_t cap, const char *s);

PDP__PRIVATE void pdp__trace_meta_locked(pdp__trace_sink *s, int pid, int tid, const char *what,
                                         const char *name, int sort_index);

/* ---- trace: the private API ---- */

/* Opens (process_rank >= 0: this process is that rank of several) or joins
   the sink. Reads PDP_TRACE while no file is open; unset or empty means
   tracing stays off and every call below is a no-op. Each successful call
   must be matched by one pdp__trace_close. */
PDP__PRIVATE pdp_status pdp__trace_open(int process_rank);

/* The last close writes everything, closes the file and frees the buffer. */
PDP__PRIVATE void pdp__trace_close(void);

/* Cheap enough for every event site: one atomic load. */
PDP__PRIVATE bool pdp__trace_enabled(void);

/* A new track (tid) on process pid (a rank) named name ("compute", "comm world");
   the first track of a pid also names the process "rank <pid>". 0 when off. */
PDP__PRIVATE int pdp__trace_track(int pid, const char *name);

PDP__PRIVATE void pdp__trace_record(char ph, int pid, int tid, const char *cat, const char *name,
                                    uint64_t id, double t0, double t1, const char *args);

/* A complete event: name ran on track tid of rank pid from t0 to t1 (pdp__now()
   seconds). cat: a string literal ("compute", "comm"); args: NULL or a JSON
   object body. */
PDP__PRIVATE void pdp__trace_complete(int pid, int tid, const char *cat, const char *name,
                                      double t0, double t1, const char *args);

/* An async begin/end pair (a collective from launch to completion, which may
   overlap the compute track); id distinguishes concurrent pairs of one name. */
PDP__PRIVATE void pdp__trace_async(int pid, int tid, const char *cat, const char *name, uint64_t id,
                                   double t0, double t1, const char *args);

/* ---- trace: public ---- */

/* PDP_API pdp_status pdp_trace_flush(void) */

/* ---- src/store.c ---- */
/* store: a TCP key-value store, PyTorch's TCPStore in miniature (rendezvous.c reads
   who the ranks are and hands a unique id out through it).

   Server. One thread in the rank-0 process runs a poll() loop over a wake channel,
   the listening socket and every client connection; all sockets are non-blocking
   and only that thread touches the table of keys, so the server needs no lock and
   a slow, stuck or hostile peer cannot stall the others. Each connection carries
   one request at a time. A GET or WAIT for a missing key is parked on its
   connection with a deadline: the SET or ADD that creates the key answers it,
   otherwise the loop answers TIMEOUT when the deadline passes (poll sleeps until
   the nearest one). Timeouts are therefore decided by the server and the stream
   never falls out of step; a client only adds a grace period so that a server
   that vanished silently cannot hang it. pdp_store_free signals the wake channel
   (a pipe; a loopback datagram on Windows), joins the thread and closes what is
   left: clients still connected see EOF.

   Client. A blocking request/response on a non-blocking socket, every wait
   bounded by poll() against a deadline. Connecting retries (10 ms doubling to
   250 ms) until the timeout, so ranks may start before rank 0. Any I/O failure
   closes the connection and later calls fail with PDP_ERR_COMM; the store does
   not reconnect, since a request in flight could have been applied or not.

   Wire format (both ways, big-endian): a 24-byte header
       u32 magic 'PDPS' | u8 op or status | u8 version (1) | u16 0 |
       u32 key bytes | u32 value bytes | u64 arg
   then the key, then the value. arg is the timeout in ms for GET and WAIT, the
   delta (two's complement) for ADD, and ADD's new value in its reply. Replies
   carry no key; an ERROR reply carries a message as its value. The server checks
   every header before it allocates: a wrong magic is dropped at once, a bad
   version, op, key length (1..PDP_STORE_MAX_KEY) or value length (at most
   PDP_STORE_MAX_VALUE) gets an ERROR reply and then the connection is closed.

   Counters (ADD) are decimal text, as in PyTorch's TCPStore. A barrier's k-th call on
   a handle (the handle counts its calls by name) is an ADD on "pdp/barrier/<name>/<k>/n"
   plus a WAIT on "pdp/barrier/<name>/<k>", which the last rank of round k sets, so one
   name can be reused and a call that timed out, whose arrival stays counted, is not
   counted again by the retry. Keys live in
   a flat array searched linearly: a rendezvous store holds tens of keys, and
   every barrier generation adds one.

   Sockets go through platform.h (POSIX sockets, or Winsock 2 with WSAPoll): every
   send there uses MSG_NOSIGNAL (SO_NOSIGPIPE where that is missing), so process-wide
   signal handling is never touched. */

/* #include "internal.h" (above) */
#include <limits.h>
#ifdef PDP__POSIX
#  include <netdb.h>
#  include <poll.h>
#  include <sys/socket.h>
#endif

#define PDP__STORE_DEFAULT_HOST "127.0.0.1"
#define PDP__STORE_DEFAULT_PORT 29500
#define PDP__STORE_DEFAULT_TIMEOUT 300.0
#define PDP__STORE_GRACE_S 5.0          /* client waits this much past a server-side timeout */
#define PDP__STORE_MAX_CONNS 4096       /* further connections are accepted and closed */
#define PDP__STORE_MAX_TIMEOUT_MS 1000000000000ull

/* ---- wire protocol ---- */

#define PDP__STORE_MAGIC 0x50445053u /* "PDPS" */
#define PDP__STORE_VERSION 1
#define PDP__STORE_HDR 24

enum { PDP__STORE_SET = 1, PDP__STORE_GET = 2, PDP__STORE_WAIT = 3, PDP__STORE_ADD = 4 };
enum { PDP__STORE_OK = 0, PDP__STORE_TIMEOUT = 1, PDP__STORE_ERROR = 2 };

typedef struct pdp__store_hdr {
    uint32_t magic;
    int code; /* op in a request, status in a reply */
    int version;
    uint32_t key_bytes, value_bytes;
    uint64_t arg;
} pdp__store_hdr;

PDP__PRIVATE void pdp__store_put(unsigned char *p, uint64_t x, int bytes);

PDP__PRIVATE uint64_t pdp__store_take(const unsigned char *p, int bytes);

PDP__PRIVATE void pdp__store_pack(unsigned char *p, int code, uint32_t key_bytes,
                                  uint32_t value_bytes, uint64_t arg);

PDP__PRIVATE pdp__store_hdr pdp__store_unpack(const unsigned char *p);

PDP__PRIVATE uint64_t pdp__store_ms(double seconds);

/* ---- server: key table ---- */

typedef struct pdp__store_entry {
    unsigned char *data; /* key bytes then value bytes, one allocation */
    uint32_t key_bytes, value_bytes;
} pdp__store_entry;

typedef struct pdp__store_conn {
    pdp__sock fd;
    unsigned char hdr[PDP__STORE_HDR];
    size_t hdr_got;
    pdp__store_hdr req;       /* valid once hdr_got == PDP__STORE_HDR */
    unsigned char *body;      /* the request's key then value */
    size_t body_cap, body_got;
    unsigned char *out;       /* the reply being sent */
    size_t out_cap, out_len, out_sent;
    bool waiting;             /* a GET/WAIT parked until its key appears or deadline */
    double deadline;
    bool close_after_reply;   /* protocol error: hang up once the ERROR reply is out */
    bool dead;
} pdp__store_conn;

typedef struct pdp__store_server {
    pdp__sock listen_fd;
    pdp__wake wake;           /* pdp_store_free signals it, the loop wakes and stops */
    pdp__thread thread;
    pdp__store_conn **conns;
    int n_conns, cap_conns;
    struct pollfd *pfds;      /* wake, listen, then one per connection */
    int cap_pfds;
    pdp__store_entry *entries;
    int n_entries, cap_entries;
} pdp__store_server;

/* Returns an array of at least need elements of elem bytes holding p's *cap old
   ones: p itself when it is big enough, else a new block (p freed, *cap updated);
   NULL when out of memory, with p untouched. */
PDP__PRIVATE void *pdp__store_grow(void *p, int *cap, int need, size_t elem);

PDP__PRIVATE bool pdp__store_reserve(unsigned char **buf, size_t *cap, size_t need);

PDP__PRIVATE pdp__store_entry *pdp__store_find(pdp__store_server *srv, const unsigned char *key,
                                               uint32_t key_bytes);

/* Sets key to value (replacing), or returns false when out of memory. */
PDP__PRIVATE bool pdp__store_put_entry(pdp__store_server *srv, const unsigned char *key,
                                       uint32_t key_bytes, const void *value, uint32_t value_bytes);

/* ---- server: connections ---- */

/* Sends what it can of c's reply; the rest goes when poll reports POLLOUT. */
PDP__PRIVATE void pdp__store_flush(pdp__store_conn *c);

/* Queues a reply, ends the current request and starts sending. */
PDP__PRIVATE void pdp__store_reply(pdp__store_conn *c, int status, const void *value,
                                   uint32_t bytes, uint64_t arg);

PDP__PRIVATE void pdp__store_reply_error(pdp__store_conn *c, bool hang_up, const char *fmt, ...);

/* Answers a parked GET/WAIT from entry e. */
PDP__PRIVATE void pdp__store_answer(pdp__store_conn *c, const pdp__store_entry *e);

/* A key was created or changed: answer everyone waiting for it. */
PDP__PRIVATE void pdp__store_wake_waiters(pdp__store_server *srv, const pdp__store_entry *e);

/* Applies ADD: counters are decimal text; a value that is not one is an error. */
PDP__PRIVATE void pdp__store_add_op(pdp__store_server *srv, pdp__store_conn *c);

/* The request in c (header and body) is complete: carry it out. */
PDP__PRIVATE void pdp__store_execute(pdp__store_server *srv, pdp__store_conn *c);

/* A complete header arrived: validate it before anything is allocated. */
PDP__PRIVATE void pdp__store_check_header(pdp__store_conn *c);

/* Reads what is there for c's current request; executes it once complete. */
PDP__PRIVATE void pdp__store_read(pdp__store_server *srv, pdp__store_conn *c);

PDP__PRIVATE void pdp__store_conn_free(pdp__store_conn *c);

PDP__PRIVATE void pdp__store_accept(pdp__store_server *srv);

/* ---- server: the loop ---- */

PDP__PRIVATE void *pdp__store_serve(void *arg);

PDP__PRIVATE void pdp__store_server_free(pdp__store_server *srv);

/* Binds host:port, listens and starts the loop; *port gets the port bound. */
PDP__PRIVATE pdp_status pdp__store_server_start(pdp__store_server **out, const char *host,
                                                int *port);

PDP__PRIVATE void pdp__store_server_stop(pdp__store_server *srv);

/* ---- client ---- */

typedef struct pdp__store_round { /* a barrier name's calls on a handle so far */
    char *name;
    int64_t calls;
} pdp__store_round;

struct pdp_store {
    pdp__sock fd;               /* connection to the server; PDP__SOCK_NONE once it broke */
    pdp__mutex lock;       /* one request at a time on this handle */
    char host[256];             /* as given (the server's own client may use loopback) */
    int port;
    int world_size;
    double timeout_s;
    pdp__store_server *server;  /* on the serving rank only */
    pdp__store_round *rounds;   /* barriers: this handle's calls, by name */
    int n_rounds, cap_rounds;
};

/* Connects s->fd to host:s->port, retrying until timeout_s has passed. */
PDP__PRIVATE pdp_status pdp__store_connect(pdp_store *s, const char *host);

/* Sends out[0..bytes) or, with out NULL, receives into in[0..bytes), all of it by
   deadline: 0, or -1 with why filled. */
PDP__PRIVATE int pdp__store_io(pdp__sock fd, const unsigned char *out, unsigned char *in, size_t bytes,
                               double deadline, char *why, size_t cap);

PDP__PRIVATE int pdp__store_send_all(pdp__sock fd, const void *buf, size_t bytes, double deadline,
                                     char *why, size_t cap);

PDP__PRIVATE int pdp__store_recv_all(pdp__sock fd, void *buf, size_t bytes, double deadline, char *why,
                                     size_t cap);

/* Reads bytes from the connection into buf[0..cap) and throws away the rest. */
PDP__PRIVATE int pdp__store_recv_into(pdp__sock fd, void *buf, size_t cap, size_t bytes, double deadline,
                                      char *why, size_t why_cap);

/* One request and its reply (caller holds s->lock). wait_s is the server-side
   wait of GET/WAIT; the client itself gives up PDP__STORE_GRACE_S later. The
   reply's value goes to buf[0..cap) (its full length in *bytes), its arg to
   *arg. PDP_ERR_TIMEOUT without a message when the server reports a timeout (the
   caller words it); PDP_ERR_COMM with one when the connection or the server fails. */
PDP__PRIVATE pdp_status pdp__store_call(pdp_store *s, const char *fn, int op, const char *key,
                                        const void *value, size_t value_bytes, uint64_t arg,
                                        double wait_s, void *buf, size_t cap, size_t *bytes,
                                        uint64_t *reply_arg);

PDP__PRIVATE pdp_status pdp__store_check(const pdp_store *s, const char *fn, const char *key);

/* ---- public API ---- */

/* PDP_API pdp_status pdp_store_create(pdp_store **out, const pdp_store_desc *desc) */

/* PDP_API void pdp_store_free(pdp_store *s) */

/* PDP_API int pdp_store_port(const pdp_store *s) */

/* PDP_API pdp_status pdp_store_set(pdp_store *s, const char *key, const void *value, size_t bytes) */

/* PDP_API pdp_status pdp_store_get(pdp_store *s, const char *key, void *buf, size_t cap, size_t *bytes) */

/* PDP_API pdp_status pdp_store_wait(pdp_store *s, const char **keys, int n, double timeout_s) */

/* PDP_API pdp_status pdp_store_add(pdp_store *s, const char *key, int64_t delta, int64_t *result) */

/* The round this handle's call of barrier name joins: its k-th call joins round k,
   whatever became of the earlier ones (a round that timed out keeps this rank's arrival,
   so a retry must not count in it again). */
PDP__PRIVATE pdp_status pdp__store_next_round(pdp_store *s, const char *name, int64_t *round);

/* PDP_API pdp_status pdp_store_barrier(pdp_store *s, const char *name, int world_size, double timeout_s) */

/* ---- src/cuda_host.c ---- */
/* cuda_host: the host side of CUDA devices. Routes device memory, the losses and
   the optimizer updates to the plain C functions of pdp_cuda.cu (declared in
   cuda.h) when built with PDP_CUDA; without it, every CUDA request fails with
   PDP_ERR_UNSUPPORTED naming the macro, and the CPU paths are untouched. Each
   layer's CUDA entry lives beside its CPU code (layers*.c), NCCL in comm_nccl.c.

   Errors: a pdp_cudak_* function that fails leaves "<call> failed: <name>
   (<text>) at pdp_cuda.cu:<line>" in its own thread-local buffer; this module
   copies it into pdp's message as "pdp_cuda: ..." and the public caller
   prefixes its name and the layer ("pdp_model_forward: layer 0 (Linear):
   pdp_cuda: cublasSgemm failed: CUBLAS_STATUS_... at pdp_cuda.cu:123"). */

/* #include "internal.h" (above) */

#define PDP__NO_CUDA_MSG "built without PDP_CUDA (compile with -DPDP_CUDA and link pdp_cuda.o)"

#ifdef PDP_CUDA
/* ---- cuda_host: errors ---- */

/* Turns a failed pdp_cudak_* status into pdp's message. */
PDP__PRIVATE pdp_status pdp__cuda_fail(pdp_status st);

#define PDP__CUDA_TRY(call)                                                  \
    do {                                                                     \
        pdp_status pdp__cst = (call);                                        \
        if (pdp__cst != PDP_OK) return pdp__cuda_fail(pdp__cst);             \
    } while (0)

PDP__PRIVATE int pdp__cuda_ordinal(pdp_device d);
#endif

/* ---- cuda_host: memory ---- */

PDP__PRIVATE pdp_status pdp__dev_alloc(pdp_device d, size_t bytes, void **out);

PDP__PRIVATE void pdp__dev_free(pdp_device d, void *p);

PDP__PRIVATE pdp_status pdp__dev_memset0(pdp_device d, void *p, size_t bytes);

PDP__PRIVATE pdp_status pdp__dev_fill(pdp_device d, float *p, int64_t count, float value);

PDP__PRIVATE pdp_status pdp__dev_copy(pdp_device dst_dev, void *dst, pdp_device src_dev,
                                      const void *src, size_t bytes);

PDP__PRIVATE pdp_status pdp__dev_add(pdp_device d, float *PDP__RESTRICT dst,
                                     const float *PDP__RESTRICT src, int64_t count);

/* ---- cuda_host: public device functions ---- */

/* PDP_API pdp_status pdp_cuda_device_count(int *count) */

/* PDP_API pdp_status pdp_cuda_set_tf32(bool on) */

/* The common check of the public functions that take a CUDA device. */
PDP__PRIVATE pdp_status pdp__cuda_check_device(pdp_device d, const char *fn);

/* PDP_API pdp_status pdp_cuda_synchronize(pdp_device d) */

/* PDP_API pdp_status pdp_cuda_memory_stats_get(pdp_device d, pdp_cuda_memory_stats *out) */

/* PDP_API pdp_status pdp_cuda_empty_cache(pdp_device d) */

/* PDP_API pdp_status pdp_cuda_release(pdp_device d) */

/* ---- cuda_host: losses ----
   The same contract as loss.c's pdp__cross_entropy (and, ignore: its
   pdp__cross_entropy_rows, rows labelled -1 giving loss 0 and dlogits 0), logits and
   dlogits on device d: labels (host memory) are checked here in sample order, the
   device computes per-sample losses, and the host sums them in sample order. */

PDP__PRIVATE pdp_status pdp__cuda_cross_entropy_any(pdp_device d, const float *logits,
                                                    const int32_t *labels, int64_t batch,
                                                    int64_t classes, float grad_scale,
                                                    double *loss_sum, float *dlogits, bool ignore,
                                                    const char *fn);

PDP__PRIVATE pdp_status pdp__cuda_cross_entropy(pdp_device d, const float *logits,
                                                const int32_t *labels, int64_t batch,
                                                int64_t classes, float grad_scale, double *loss_sum,
                                                float *dlogits, const char *fn);

PDP__PRIVATE pdp_status pdp__cuda_cross_entropy_rows(pdp_device d, const float *logits,
                                                     const int32_t *labels, int64_t rows,
                                                     int64_t classes, float grad_scale,
                                                     double *loss_sum, float *dlogits,
                                                     const char *fn);

/* Sum of squared differences (double) and dpred = scale (pred - target), on d. */
PDP__PRIVATE pdp_status pdp__cuda_mse(pdp_device d, const float *pred, const float *target,
                                      int64_t count, float scale, double *sum, float *dpred,
                                      const char *fn);

/* ---- cuda_host: gradient clipping (optim.c's pdp_clip_grad_norm) ---- */

PDP__PRIVATE pdp_status pdp__cuda_sumsq(pdp_device d, const float *x, int64_t count, double *sum,
                                        const char *fn);

PDP__PRIVATE pdp_status pdp__cuda_scale(pdp_device d, float *x, int64_t count, float s,
                                        const char *fn);

/* Gradient compression on d (dt BF16 or F16): dst[i] = 16-bit(src[i] * scale), rounded
   to nearest even, and its inverse, dst[i] = widen(src[i]); CPU loops or pdp_cuda.cu's
   kernels (the same math.h conversions, so the same bits). */
PDP__PRIVATE pdp_status pdp__dev_to16(pdp_device d, void *dst, const float *src, int64_t count,
                                      float scale, int dt);

PDP__PRIVATE pdp_status pdp__dev_from16(pdp_device d, float *dst, const void *src, int64_t count,
                                        int dt);

/* ---- cuda_host: optimizer updates (optim.c's scalars, math.h's formulas) ---- */

PDP__PRIVATE pdp_status pdp__cuda_optim_update(pdp_device d, const struct pdp__optim_scalars *s,
                                               float *p, const float *g, float *s0, float *s1,
                                               int64_t n);

/* ---- src/tensor.c ---- */
/* tensor: creation, views, copies and initialisers; the PCG32 generator.

   Invariants: shape[i] >= 1 for i < ndim and 1 beyond; count is their product;
   owned data is 64-byte aligned and zero-filled at creation. CUDA tensors are
   allocated and copied by pdp_cuda.cu through the pdp__dev_* functions of the
   cuda_host module; without PDP_CUDA they fail with PDP_ERR_UNSUPPORTED. */

/* #include "internal.h" (above) */

/* ---- tensor: shapes ---- */

PDP__PRIVATE pdp_status pdp__check_shape(const char *fn, int ndim, const int64_t *shape,
                                         int64_t *count);

PDP__PRIVATE void pdp__set_shape(pdp_tensor *t, int ndim, const int64_t *shape, int64_t count);

/* "[128, 784]" into buf, for messages. */
PDP__PRIVATE const char *pdp__shape_str(const pdp_tensor *t, char *buf, size_t bytes);

/* Is a the device b is? (kind and ordinal) */
PDP__PRIVATE bool pdp__same_device(pdp_device a, pdp_device b);

/* Do a and b have one shape? (ndim and every dimension; dtype and device are not compared) */
PDP__PRIVATE bool pdp__same_shape(const pdp_tensor *a, const pdp_tensor *b);

/* A device pdp knows: the CPU (ordinal 0) or a CUDA device (ordinal >= 0, in a build with
   PDP_CUDA: PDP_ERR_UNSUPPORTED naming the macro otherwise; whether it exists is the CUDA
   calls' to say). */
PDP__PRIVATE pdp_status pdp__check_device(pdp_device d, const char *fn);

/* ---- tensor: lifecycle ---- */

/* pdp_tensor_create and pdp_tensor_create_ids: fn names the caller in messages; both element
   types take 4 bytes */
PDP__PRIVATE pdp_status pdp__tensor_create(const char *fn, pdp_tensor **out, pdp_device device,
                                           int ndim, const int64_t *shape, pdp_dtype dtype);

/* PDP_API pdp_status pdp_tensor_create(pdp_tensor **out, pdp_device device, int ndim, const int64_t *shape) */

/* PDP_API pdp_status pdp_tensor_create_ids(pdp_tensor **out, pdp_device device, int ndim, const int64_t *shape) */

/* PDP_API void pdp_tensor_free(pdp_tensor *t) */

/* ---- tensor: views ---- */

/* PDP_API pdp_status pdp_tensor_wrap(float *data, pdp_device device, int ndim, const int64_t *shape, pdp_tensor *view) */

/* PDP_API pdp_status pdp_tensor_wrap_ids(int32_t *data, pdp_device device, int ndim, const int64_t *shape, pdp_tensor *view) */

/* PDP_API pdp_status pdp_tensor_reshape_view(const pdp_tensor *t, int ndim, const int64_t *shape, pdp_tensor *view) */

/* PDP_API pdp_status pdp_tensor_rows_view(const pdp_tensor *t, int64_t first, int64_t rows, pdp_tensor *view) */

/* ---- tensor: contents ---- */

/* PDP_API pdp_status pdp_tensor_zeros(pdp_tensor *t) */

/* PDP_API pdp_status pdp_tensor_fill(pdp_tensor *t, float value) */

/* PDP_API size_t pdp_dtype_size(pdp_dtype dt) */

/* PDP_API pdp_status pdp_tensor_copy(pdp_tensor *dst, const pdp_tensor *src) */

/* PDP_API pdp_status pdp_tensor_upload(pdp_tensor *t, const void *host) */

/* PDP_API pdp_status pdp_tensor_download(const pdp_tensor *t, void *host) */

/* ---- rng: PCG32 ---- */

/* PDP_API void pdp_rng_seed(pdp_rng *r, uint64_t seed, uint64_t stream) */

/* PDP_API uint32_t pdp_rng_u32(pdp_rng *r) */

/* PDP_API float pdp_rng_uniform(pdp_rng *r) */

/* PDP_API uint32_t pdp_rng_below(pdp_rng *r, uint32_t n) */

/* PDP_API float pdp_rng_normal(pdp_rng *r) */

/* One draw in [lo, hi). In double, where the product of two floats is exact: a build that
   fuses the multiply and the add (gcc's GNU modes) rounds as one that does not, so a seed's
   initial parameters are the same bits in every build (pdp_tensor_normal likewise). */
PDP__PRIVATE float pdp__draw_uniform(pdp_rng *r, float lo, float hi);

/* Fills a CPU tensor directly, any other device through a host staging copy. */
PDP__PRIVATE pdp_status pdp__tensor_init(pdp_tensor *t, pdp_rng *r, int normal, float a, float b,
                                         const char *fn);

/* PDP_API pdp_status pdp_tensor_uniform(pdp_tensor *t, pdp_rng *r, float lo, float hi) */

/* PDP_API pdp_status pdp_tensor_normal(pdp_tensor *t, pdp_rng *r, float mean, float std) */

/* PDP_API pdp_status pdp_tensor_kaiming_uniform(pdp_tensor *t, pdp_rng *r, int64_t fan_in, float a) */

/* PDP_API pdp_status pdp_tensor_xavier_uniform(pdp_tensor *t, pdp_rng *r, int64_t fan_in, int64_t fan_out) */

/* ---- src/gemm.c ---- */
/* gemm: single-precision matrix product, C = alpha * op(A) * op(B) + beta * C.

   Row-major, op(X) = X or X^T, all four layouts. The structure is the one of
   Goto and van de Geijn, "Anatomy of high-performance matrix multiplication"
   (ACM TOMS 34(3), 2008) and of BLIS (Van Zee and van de Geijn, 2015):

     for each NC-wide block of columns       (jc)
       for each KC-deep block of k           (pc)   pack op(B) block, KC x NC  (L2/L3)
         for each MR-tall row panel          (ir)   pack op(A) panel, MR x KC  (L1)
           for each NR-wide column panel     (jr)   micro-kernel: MR x NR tile of C

   The A panel stays in L1 while the B block streams past it (128 bytes of B per
   16 FMAs on AVX-512, well within L2 or even L3 bandwidth), so the A panel is
   packed right before use and there is no MC level.
   The micro-kernel keeps an MR x NR tile of C in registers and adds one rank-1
   update per k: NR floats of packed B are loaded, MR floats of packed A are
   broadcast, MR * NR / VL fused multiply-adds. Kernels by instruction set:
   AVX-512F 8 x 32 (16 zmm accumulators), AVX2+FMA 6 x 16 (12 ymm), and portable
   C 4 x 16 (what -DPDP_NO_SIMD or a plain x86-64 target gets). Packing pads
   partial panels with zeros, so the kernel always runs full tiles and masks only
   its stores. Packing a source that is contiguous in k (A in NN and NT, B in NT
   and TT) is a transpose, done 8 x 8 in AVX registers when AVX is there. With
   -DPDP_CBLAS the whole call goes to cblas_sgemm instead.

   Invariants:
   - Determinism. Every element of C is computed by exactly one thread, as the
     same chain of FMAs over k (in KC blocks whose bounds depend only on k), and
     the tile grid is anchored at row 0 and column 0 whatever the split. So the
     bits do not depend on the thread count, and a caller that finds the pool
     busy (and runs everything itself) gets the same bits too.
   - beta == 0: C is written without being read (NaN in C does not leak); so is
     it when k == 0 or alpha == 0 (C = beta * C).
   - Memory: packed panels live in the calling thread's scratch buffer
     (pdp__thread_scratch), which grows on the first call of a given size and is
     reused afterwards; a training loop allocates nothing here after step one.
     If even that allocation fails, the same blocks are packed a panel at a time into a
     buffer on the stack (pdp__gemm_on_stack): slower, the same bits. */

/* #include "internal.h" (above) */

#if defined(__cplusplus)
#  define PDP__GEMM_RESTRICT PDP__RESTRICT
#else
#  define PDP__GEMM_RESTRICT restrict
#endif

/* C = beta C: a product with nothing to add (k == 0 or alpha == 0); with beta == 0, C
   is written without being read. pdp_gemm_bf16 shares it. */
PDP__PRIVATE void pdp__gemm_scale_c(int64_t m, int64_t n, float beta, float *c, int64_t ldc);

/* ---- gemm: bf16 rounding ----
   pdp__bf16_round_u32 on vectors: pdp__sgemm_bf16 rounds its operands with it as it packs
   them (section "packing"), and Conv2d rounds its padded image and dy with
   pdp__gemm_round16 (a pass, in every build: with PDP_CBLAS too). */

#if !defined(PDP_NO_SIMD) && (defined(__AVX__) || defined(__AVX512F__))
#  include <immintrin.h>
#endif

#if !defined(PDP_NO_SIMD) && defined(__AVX512F__)
/* pdp__bf16_round_u32 on 16 lanes, in 7 operations where its plain form takes 10: t = u +
   0x7fff, plus 1 where bit 16 (the kept half's last bit) is set; a NaN's t is u with the
   quiet bit; then the low half cleared. */

/* lo in the low half, hi in the high half (the masked form, its mask full: the plain one's
   undefined source trips gcc's -Wmaybe-uninitialized, as gemm_bf16.c's PDP__BF16_HALF). */

#endif

#if !defined(PDP_NO_SIMD) && defined(__AVX2__)
/* pdp__bf16_round_u32 on 8 lanes. */

#endif

/* p[0, n) rounded to bf16 in place (pdp__bf16_round_u32 on the bits: one select, so the
   loop vectorises). */
PDP__PRIVATE void pdp__gemm_round16(float *p, int64_t n);

/* d[0, n) = s[0, n), rounded to bf16 when round16 (pdp__bf16_round_u32's bits). */

#if defined(PDP_CBLAS)
#  include <cblas.h>

/* PDP_API void pdp_sgemm(pdp_trans ta, pdp_trans tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc) */

/* Plain loops: with PDP_CBLAS, Conv2d takes its im2col path and never calls this. */
PDP__PRIVATE void pdp__sgemm_rows(pdp_trans ta, pdp_trans tb, int64_t m, int64_t n, int64_t k,
                                  float alpha, const float *a, int64_t lda, const float *b,
                                  const int64_t *brow, float beta, float *c, int64_t ldc);

/* The work an m x n product does per k: m n here (see the other definition). */
PDP__PRIVATE int64_t pdp__gemm_tiles(int64_t m, int64_t n);

PDP__PRIVATE void pdp__sgemm_arows(pdp_trans tb, int64_t m, int64_t n, int64_t k, float alpha,
                                   const float *a, const int64_t *arow, const float *b, int64_t ldb,
                                   float beta, float *c, int64_t ldc);

#else /* our own */

/* ---- gemm: micro-kernels ---- */

/* Kernel contract: kc >= 1; ap holds kc groups of MR floats, bp kc groups of NR
   floats (both packed, 64-byte aligned). Writes the top-left mr x nr of the tile
   to c (row stride ldc) as alpha * acc + beta * c, not reading c when beta == 0. */

#if !defined(PDP_NO_SIMD) && defined(__AVX512F__)
#  include <immintrin.h>
#  define PDP__GEMM_KERNEL "avx512 8x32"
#  define PDP__GEMM_MR 8
#  define PDP__GEMM_NV 2
#  define PDP__GEMM_VL 16

/* Lane masks of a tile's nr valid columns, one per vector of a B row (nv of them). */

/* How every AVX-512 kernel ends: the top-left mr x nr of an MR x nv-vector tile of
   accumulators (acc[i nv + v], nv a constant after inlining) to c (row stride ldc)
   as alpha * acc + beta * c, reading c only when beta != 0; a full tile unmasked.
   Always inlined: a call would take acc's address and keep the accumulators in
   memory. */

/* The MR x NR tile of the packed kernels. */

/* The packed kernel on the first nv of the panel's NV vectors and its first `rows` rows
   (constants after inlining; mr <= rows). */

/* A tile of at most 16 columns (a classifier's 10: its forward, 512 x 10 over k 512) or 4
   rows (its dW's last panel, 10 = 8 + 2 rows) runs the loop of its vectors and rows alone:
   the full tile's spent half its FMAs or more on what is not stored. Each element's FMA
   chain is the full tile's (same bits). */
PDP__PRIVATE PDP__KERNEL_UNSANITIZED void pdp__gemm_kernel(
    int64_t kc, const float *PDP__GEMM_RESTRICT ap, const float *PDP__GEMM_RESTRICT bp, float *c,
    int64_t ldc, int mr, int nr, float alpha, float beta);

/* The same tile with B read in place instead of packed: row p of the tile's B is
   the nr floats at b + brow[p] (a gathered B, pdp__sgemm_rows without transpose,
   whose rows are runs of a small image that stays in cache). Packing such a B
   costs as much as a tenth of the product when m is small (Conv2d's O rows), and
   this skips it. Masked loads read no float past column nr; same FMA chain as the
   packed kernel, so the same bits. */
#  define PDP__GEMM_DIRECT_B 1
PDP__PRIVATE PDP__KERNEL_UNSANITIZED void pdp__gemm_kernel_rows(
    int64_t kc, const float *PDP__GEMM_RESTRICT ap, const float *b, const int64_t *brow, float *c,
    int64_t ldc, int mr, int nr, float alpha, float beta);

/* The same tile with A read in place: row i of the tile's A is a8[i] (a gathered
   A, pdp__sgemm_arows; rows past mr repeat row 0 and are never stored), each
   element broadcast straight from its row, as the packed kernel broadcasts it
   from the panel. Same FMA chain, so the same bits. */
PDP__PRIVATE PDP__KERNEL_UNSANITIZED void pdp__gemm_kernel_arows(
    int64_t kc, const float *const *a8, const float *PDP__GEMM_RESTRICT bp, float *c, int64_t ldc,
    int mr, int nr, float alpha, float beta);

#elif !defined(PDP_NO_SIMD) && defined(__AVX2__) && defined(__FMA__)
#  include <immintrin.h>
#  define PDP__GEMM_KERNEL "avx2 6x16"
#  define PDP__GEMM_MR 6
#  define PDP__GEMM_NV 2
#  define PDP__GEMM_VL 8

PDP__PRIVATE PDP__KERNEL_UNSANITIZED void pdp__gemm_kernel(
    int64_t kc, const float *PDP__GEMM_RESTRICT ap, const float *PDP__GEMM_RESTRICT bp, float *c,
    int64_t ldc, int mr, int nr, float alpha, float beta);

#else
#  define PDP__GEMM_KERNEL "portable 4x16"
#  define PDP__GEMM_MR 4
#  define PDP__GEMM_NV 1
#  define PDP__GEMM_VL 16

PDP__PRIVATE PDP__KERNEL_UNSANITIZED void pdp__gemm_kernel(
    int64_t kc, const float *PDP__GEMM_RESTRICT ap, const float *PDP__GEMM_RESTRICT bp, float *c,
    int64_t ldc, int mr, int nr, float alpha, float beta);
#endif

#define PDP__GEMM_NR (PDP__GEMM_NV * PDP__GEMM_VL)

/* Blocking. KC: depth of one packed block (k is cut into equal blocks of at most
   KC). NC: columns of packed B per block. Both fixed, so the summation order never
   depends on the thread count. 512 and 512 measured best on Zen 4 (384 and 256 are
   within noise; see bench/gemm.c). */
#ifndef PDP__GEMM_KC
#  define PDP__GEMM_KC 512
#endif
#ifndef PDP__GEMM_NC
#  define PDP__GEMM_NC 512
#endif
/* Products below this many flops stay on the calling thread. With the pool's spin a
   hand-off costs a few microseconds, less than half of a 1.3 MFLOP product (the MLP's
   10-class layer at batch 128, ~40 us on one core): at 1e6 rather than 4e6 the MLP
   784-512-512-10 step at batch 128 on 2 threads was faster in 11 of 14 alternating
   runs, either order first, by a median of 9% (Zen 4, a noisy host: -17% to +23%). */
#ifndef PDP__GEMM_PAR_FLOPS
#  define PDP__GEMM_PAR_FLOPS 1.0e6
#endif

/* ---- gemm: packing ---- */

/* Packing op(A) with A not transposed, and op(B) with B transposed, is a transpose
   (the source is contiguous in k, the panel wants k-major). With AVX it goes 8 x 8
   at a time through registers; the rest is plain loops.

   pdp__sgemm_bf16 (round16) rounds each value to bf16 as it is packed, with
   pdp__bf16_round_u32's bits (round to nearest even on the 16 bits dropped, a NaN made
   quiet, subnormals rounded like any value), in registers where AVX2 or AVX-512 is:
   the values pass through registers anyway, so the rounding costs a few integer
   operations per vector, where a pass over the packed panels after packing cost 2-22%
   of the MLP's products (one thread, Sapphire Rapids class; most where packing is a
   large share: 10 x 512 x 512, 512 x 10 x 512). */

/* x rounded to bf16 (as an fp32) when round16, else x. */

#if !defined(PDP_NO_SIMD) && defined(__AVX__)
#  define PDP__GEMM_T8 1

/* dst[q * ldd + r] = s[r][p + q] for r, q in [0, 8), rounded to bf16 when round16: on
   AVX-512 two rows of the block at a time in zmm (11 operations per 16 values, where ymm
   takes 20), stored as one zmm into an A panel (ldd 8: the two rows are 16 adjacent
   floats) or as its two halves into a B panel (ldd 32: 13 operations; rounding a
   512 x 512 op(B) of NT as it packs went from 17-19 us over pdp_sgemm's packing to 7-8,
   one Sapphire Rapids class thread, best of 200). */
PDP__PRIVATE void pdp__gemm_transpose8(const float *const *s, int64_t p, float *dst, int64_t ldd,
                                       int round16);
#else
#  define PDP__GEMM_T8 0
#endif

/* Source row r of a packing routine: src + off[r] with a row-offset table (the
   gathered B of pdp__sgemm_rows), else src + r * lds. */
PDP__PRIVATE const float *pdp__gemm_row(const float *src, int64_t lds, const int64_t *off,
                                        int64_t r);

/* rows x kc of a source contiguous in k (row r at pdp__gemm_row) into
   dst[p * ldd + r], rounded to bf16 when round16; the part of [0, ldd) past `rows` is
   zeroed. With AVX, groups of 8 rows go through pdp__gemm_transpose8, and so does a
   last partial group when the panel has room for 8, its missing rows read from a row of
   zeros (a ragged edge, N = 25 say, would otherwise be packed and zeroed one strided
   float at a time). */
#if PDP__GEMM_T8

#endif

PDP__PRIVATE void pdp__gemm_pack_t(const float *src, int64_t lds, const int64_t *off, int rows,
                                   int64_t kc, float *dst, int64_t ldd, int round16);

/* kc x cols of a source contiguous in the panel's fast index (row p at
   pdp__gemm_row) into dst[p * ldd + j], rounded to bf16 when round16; the part of
   [0, ldd) past `cols` is zeroed. Always inlined with a constant ldd (MR
   or NR), so that a full row is a fixed-size copy the compiler turns into vector
   moves: the plain loop of unknown length stays scalar at -O2 and cost a fifth of
   a 512^3 NN or TN product. */

/* op(A) rows [0, mr) x columns [0, kc) (a points at op(A)(0, 0)) into ap[p * MR + i],
   rounded to bf16 when round16. */
PDP__PRIVATE void pdp__gemm_pack_a(pdp_trans ta, const float *a, int64_t lda, int mr, int64_t kc,
                                   float *PDP__GEMM_RESTRICT ap, int round16);

/* op(B) rows [pc, pc + kc) x columns [jc, jc + nc) into panels of NR columns:
   bp[(j / NR) * kc * NR + p * NR + j % NR], rounded to bf16 when round16. B's storage
   row r starts at b + r * ldb, or at b + brow[r] when the caller gave a row-offset
   table. */
PDP__PRIVATE void pdp__gemm_pack_b(pdp_trans tb, const float *b, int64_t ldb, const int64_t *brow,
                                   int64_t pc, int64_t jc, int64_t kc, int64_t nc,
                                   float *PDP__GEMM_RESTRICT bp, int round16);

/* ---- gemm: the blocked product on one thread ---- */

enum { PDP__GEMM_ROUND_A = 1, PDP__GEMM_ROUND_B = 2 }; /* pdp__gemm_args.round16 */

typedef struct pdp__gemm_args {
    pdp_trans ta, tb;
    int64_t m, n, k;
    float alpha, beta;
    const float *a, *b;
    const int64_t *brow; /* B's row offsets (pdp__sgemm_rows), or NULL: row r at b + r ldb */
    const int64_t *arow; /* A's row offsets (pdp__sgemm_arows; A not transposed), or NULL */
    float *c;
    int64_t lda, ldb, ldc;
    int64_t kb;   /* depth of each k block (the last may be shorter) */
    int split_n;  /* 1: parts are column ranges; 0: row ranges */
    int round16;  /* pdp__sgemm_bf16: the operands rounded to bf16 as they are packed (never
                     gathered): PDP__GEMM_ROUND_A | PDP__GEMM_ROUND_B, or one of them */
} pdp__gemm_args;

PDP__PRIVATE int64_t pdp__gemm_round_up(int64_t x, int64_t to);

/* Floats of scratch one part of at most `cols` columns needs. */
PDP__PRIVATE size_t pdp__gemm_scratch_floats(const pdp__gemm_args *g, int64_t cols);

/* Rows [m0, m1) x columns [n0, n1) of C; m0 is a multiple of MR, n0 of NR. */
PDP__PRIVATE void pdp__gemm_block(const pdp__gemm_args *g, int64_t m0, int64_t m1, int64_t n0,
                                  int64_t n1, float *scratch);

/* When the thread's scratch cannot grow: the same blocked product, one NR-column panel at a
   time, packed into a buffer on this stack frame (KC x (NR + MR) floats: 80 KB for the
   AVX-512 kernel). Each element of C is the same chain as pdp__gemm_block's (the panel grid
   is anchored at column 0 either way, and the NC blocking only groups panels), so the bits
   are the ones a run with memory gets; only slower. Not inlined: the frame is this path's
   alone. */
PDP__PRIVATE PDP__NOINLINE void pdp__gemm_on_stack(const pdp__gemm_args *g, int64_t m0,
                                                   int64_t m1, int64_t n0, int64_t n1);

/* ---- gemm: threads ---- */

/* Part i of n: an equal share of the MR-row or NR-column panels. */
PDP__PRIVATE void pdp__gemm_part(void *arg, int i, int n);

/* pdp_sgemm with B's storage rows at b + brow[r] (brow non-NULL) or b + r ldb; round16:
   the operands rounded to bf16 as they are packed (pdp__sgemm_bf16, _bf16_b). */
PDP__PRIVATE void pdp__gemm_run(pdp_trans ta, pdp_trans tb, int64_t m, int64_t n, int64_t k,
                                float alpha, const float *a, int64_t lda, const int64_t *arow,
                                const float *b, int64_t ldb, const int64_t *brow, float beta,
                                float *c, int64_t ldc, int round16);

/* PDP_API void pdp_sgemm(pdp_trans ta, pdp_trans tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc) */

/* pdp_sgemm on op(A) and op(B) rounded to bf16 (pdp__bf16_round_u32: subnormals rounded
   like any value, not flushed), the rounding done on the packed panels (the operands
   are not written): pdp_gemm_bf16's path PDP_BF16_PATH_SGEMM. Products of two bf16
   values are exact in fp32 (unless they underflow), so each element is pdp_sgemm's
   FMA chain over the exact products: the same blocking, threads and bits rules. */
PDP__PRIVATE void pdp__sgemm_bf16(pdp_trans ta, pdp_trans tb, int64_t m, int64_t n, int64_t k,
                                  float alpha, const float *a, int64_t lda, const float *b,
                                  int64_t ldb, float beta, float *c, int64_t ldc);

/* pdp__sgemm_bf16 where op(A) holds bf16 values already (the caller rounded it, by
   construction: Linear's dY, rounded by its ReLU's backward pass): only op(B) is rounded
   as it is packed. Rounding is idempotent, so the bits are pdp__sgemm_bf16's; the
   packing of op(A) is pdp_sgemm's (a transpose in NN: rounding there cost 12-20 us per
   512 x 512 over fp32's packing, one Sapphire Rapids class thread). */
PDP__PRIVATE void pdp__sgemm_bf16_b(pdp_trans ta, pdp_trans tb, int64_t m, int64_t n, int64_t k,
                                    float alpha, const float *a, int64_t lda, const float *b,
                                    int64_t ldb, float beta, float *c, int64_t ldc);

/* ---- gemm: gathered B ----
   pdp_sgemm whose B rows are anywhere: storage row r of B starts at b + brow[r], so
   op(B)(p, j) = b[brow[p] + j] (tb == PDP_NO_TRANS) or b[brow[j] + p] (PDP_TRANS).
   Conv2d's implicit im2col: row (c, ki, kj) of a sample's column matrix is one
   contiguous run of the zero-padded input, so the B packing reads the input itself
   and the column matrix is never written. Same blocking, threads and bits as
   pdp_sgemm on the materialised B. */

PDP__PRIVATE void pdp__sgemm_rows(pdp_trans ta, pdp_trans tb, int64_t m, int64_t n, int64_t k,
                                  float alpha, const float *a, int64_t lda, const float *b,
                                  const int64_t *brow, float beta, float *c, int64_t ldc);

/* The work an m x n product does per k, padded to whole MR x NR tiles: what a
   caller that can compute C or C^T compares to pick the cheaper. */
PDP__PRIVATE int64_t pdp__gemm_tiles(int64_t m, int64_t n);

/* C = alpha A op(B) + beta C with A's storage rows anywhere: row i of A starts at
   a + arow[i] (A not transposed). Conv2d's dW as dW^T = col dy^T, whose A is the
   implicit column matrix: with AVX-512 the kernel broadcasts A straight from the
   padded image, no packing. */
PDP__PRIVATE void pdp__sgemm_arows(pdp_trans tb, int64_t m, int64_t n, int64_t k, float alpha,
                                   const float *a, const int64_t *arow, const float *b, int64_t ldb,
                                   float beta, float *c, int64_t ldc);

#if defined(PDP__GEMM_DIRECT_B)
/* ---- gemm: gathered B, columns in runs ----
   C [m, n] = A [m, k] B (alpha 1, beta 0, on the calling thread) where B is gathered
   as in pdp__sgemm_rows and only some of its columns are wanted: logical column
   L = (r runs + u) run + t, for r < rows, u < runs, t < run, is B's column
   r rstride + u ustride + t, and C holds the logical columns only. Conv2d's
   implicit GEMM: samples side by side with bands of padding between them, whose
   columns nobody reads. Each 16-lane vector of a tile is loaded as a few masked
   loads, one per run it meets, so no lane computes a band. Each C element is the
   same FMA chain over k, in the same k blocks, as in pdp__sgemm_rows. */
#  define PDP__GEMM_RUNS 1

/* Its tiles are MR x 48, not MR x 32: each vector of B costs this kernel one to
   three masked, unaligned loads, and three vectors spread them over 24 FMAs a k
   step instead of 16 (24 accumulators, 3 B vectors and a broadcast: 28 of the 32
   zmm registers). Conv2d's 16 -> 32 and 32 -> 16, 5 x 5 on 14 x 14, 8 samples:
   about 98-104 -> 106-109 GFLOP/s on one Zen 4 core (peak 117), best of 7 each. */
#  ifndef PDP__GEMM_RUNS_NV
#    define PDP__GEMM_RUNS_NV 3
#  endif
#  define PDP__GEMM_RUNS_NR (PDP__GEMM_RUNS_NV * PDP__GEMM_VL)

/* segs: the masked loads per vector (a constant after inlining, the rest of the
   masks zero when a vector has fewer), or 0: each vector's own count, nseg[v]. */

PDP__PRIVATE PDP__KERNEL_UNSANITIZED void pdp__gemm_kernel_runs(
    int64_t kc, const float *PDP__GEMM_RESTRICT ap, const float *b, const int64_t *brow,
    const int64_t *soff, const __mmask16 *smask, const int *nseg, float *c, int64_t ldc, int mr,
    int nr, float beta);

/* The masked loads of the tile of nr logical columns that starts at column (r, u, t),
   which it advances by nr: vector v's lanes as nseg[v] loads, load s of lane mask
   smask[v VL + s] at B column soff[v VL + s] (lane 0's column). A run is cut into
   vectors' pieces, so each piece is one load unless it continues the last (no
   band between two runs); a vector with no lane keeps one empty load. */
PDP__PRIVATE void pdp__gemm_runs_tile(int nr, int64_t run, int64_t runs, int64_t rstride,
                                      int64_t ustride, int64_t *t, int64_t *u, int64_t *r,
                                      int64_t *soff, __mmask16 *smask, int *nseg);

PDP__PRIVATE void pdp__sgemm_runs(int64_t m, int64_t k, const float *a, int64_t lda, const float *b,
                                  const int64_t *brow, int64_t rows, int64_t runs, int64_t run,
                                  int64_t rstride, int64_t ustride, float *c, int64_t ldc);
#endif

#endif /* PDP_CBLAS */

/* ---- gemm: small products as dot products ----
   C [m, n] = A B^T for an m x n too small to pay for packing and a long k (Conv2d's
   dW share of a layer with few weights: 16 x 25 over thousands of columns): row i of
   A at a + i lda, row j of B at b + brow[j]. Blocks of 4 x 5 dot products (20
   accumulators, 9 loads per 20 FMAs; 16 x 25 is 4 x 5 whole blocks, where 4 x 4
   blocks computed 28 columns for 25) run in 16-float lanes (AVX2: 4 x 3 blocks in 8)
   over k in slices of PDP__GEMM_DOTS_KC (A's and B's slices stay in L1), the lanes kept on
   the stack between slices, and are reduced at the end in a fixed order: the bits depend
   on m, n, k and the data only (not on the block shape). */
#if !defined(PDP_CBLAS) && !defined(PDP_NO_SIMD) && defined(__AVX512F__)
#  define PDP__GEMM_DOTS_VL 16
#  define PDP__GEMM_DOTS_MI 4 /* rows of A per block */
#  define PDP__GEMM_DOTS_NJ 5 /* rows of B per block */
#elif !defined(PDP_CBLAS) && !defined(PDP_NO_SIMD) && defined(__AVX2__) && defined(__FMA__)
/* AVX2 has 16 ymm registers: 4 x 3 blocks (12 accumulators and 4 rows of A; B from
   memory, as the FMA's operand). Scalar, these dots were half of bench.h's CNN step on a
   Zen 3 core. */
#  define PDP__GEMM_DOTS_VL 8
#  define PDP__GEMM_DOTS_MI 4
#  define PDP__GEMM_DOTS_NJ 3
#else
#  define PDP__GEMM_DOTS_VL 1
#  define PDP__GEMM_DOTS_MI 4
#  define PDP__GEMM_DOTS_NJ 5
#endif
#define PDP__GEMM_DOTS_MAX 512 /* lanes of the blocks, counted whole */
#define PDP__GEMM_DOTS_KC 512

PDP__PRIVATE int pdp__sgemm_dots_fits(int64_t m, int64_t n);

#if PDP__GEMM_DOTS_VL == 16
/* The sum of v's 16 lanes as gcc's _mm512_reduce_add_ps adds them (halves, then quarters,
   then pairs), from the zero-masking extract: gcc's header builds the reduction on
   _mm512_extractf64x4_pd, whose _mm256_undefined_pd() merge source g++ reports as
   -Wmaybe-uninitialized (see gemm_bf16.c's PDP__BF16_HALF) */

#  define PDP__GEMM_DOTS_V __m512
#  define PDP__GEMM_DOTS_ZERO() _mm512_setzero_ps()
#  define PDP__GEMM_DOTS_LOAD(x) _mm512_loadu_ps(x)
#  define PDP__GEMM_DOTS_MASK(left) ((__mmask16)((1u << (left)) - 1))
#  define PDP__GEMM_DOTS_MASK_T __mmask16
#  define PDP__GEMM_DOTS_LOADM(x, mk) _mm512_maskz_loadu_ps(mk, x)
#  define PDP__GEMM_DOTS_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#elif PDP__GEMM_DOTS_VL == 8
/* The sum of v's 8 lanes: halves, then pairs, as pdp__gemm_dots_sum's last three steps */

#  define PDP__GEMM_DOTS_V __m256
#  define PDP__GEMM_DOTS_ZERO() _mm256_setzero_ps()
#  define PDP__GEMM_DOTS_LOAD(x) _mm256_loadu_ps(x)
#  define PDP__GEMM_DOTS_MASK(left) \
      _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(left)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))
#  define PDP__GEMM_DOTS_MASK_T __m256i
#  define PDP__GEMM_DOTS_LOADM(x, mk) _mm256_maskload_ps(x, mk)
#  define PDP__GEMM_DOTS_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#endif

#if PDP__GEMM_DOTS_VL > 1
/* One block's MI x NJ accumulators over columns [p, p1), whole vectors (LOAD) or the
   last part of one (LOADM, the lanes past p1 zero in A and B: they add 0) */
#  define PDP__GEMM_DOTS_STEP(LOADA, LOADB)                                                    \
      do {                                                                                     \
          PDP__GEMM_DOTS_V va[MI];                                                             \
          _Pragma("GCC unroll 8") for (i = 0; i < MI; i++) va[i] = LOADA(ar[i] + p);           \
          _Pragma("GCC unroll 8") for (j = 0; j < NJ; j++) {                                   \
              PDP__GEMM_DOTS_V vb = LOADB(br[j] + p);                                          \
              _Pragma("GCC unroll 8") for (i = 0; i < MI; i++) {                               \
                  acc[i][j] = PDP__GEMM_DOTS_FMA(va[i], vb, acc[i][j]);                        \
              }                                                                                \
          }                                                                                    \
      } while (0)
#  define PDP__GEMM_DOTS_TAIL(x) PDP__GEMM_DOTS_LOADM(x, mk)

PDP__PRIVATE PDP__KERNEL_UNSANITIZED void pdp__sgemm_dots(int64_t m, int64_t n, int64_t k,
                                                          const float *a, int64_t lda,
                                                          const float *b, const int64_t *brow,
                                                          float *c, int64_t ldc);
#else
PDP__PRIVATE void pdp__sgemm_dots(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                                  const float *b, const int64_t *brow, float *c, int64_t ldc);
#endif

/* ---- src/gemm_bf16.c ---- */
/* gemm_bf16: the bf16 mixed-precision matrix product behind pdp_gemm_bf16 (gemm.h),
   C = alpha * op(A) * op(B) + beta * C with op(A), op(B) rounded to bf16 and fp32
   everywhere else, as torch.autocast("cpu", dtype=torch.bfloat16) runs a Linear.

   Packing rounds both operands to bf16 (pdp__bf16_bits, src/math.h) and lays k out in
   pairs, the operand format of AVX512-BF16's vdpbf16ps: one 32-bit word holds
   (x[2p] low, x[2p+1] high); an odd k gets a zero pair half. A is packed in MR-row
   panels ([pair][row]), B in NR-column panels ([pair][column]). A part of the product
   packs an MC-row block of A at a time; in the first block it packs each NR-column
   panel of B as it reaches it, and the later blocks reuse those panels; the
   micro-kernel runs over the block's MR-row panels and keeps an MR x NR tile of C in
   registers over the whole k (k is not blocked: at the MLP's k <= 1024 a B panel,
   pairs x NR words, stays in L2). The AMX path has its own driver, kernels and tile-order
   packing (src/gemm_amx.c, called from pdp__bf16_run; it reuses this file's rounding,
   panels and pdp__bf16_args). The avx512 path and AMX's packing use vcvtne2ps2bf16
   (16 values per instruction; rows along k transposed in registers, rows across k
   interleaved with vpermw), the emulation with pdp__bf16_bits; the words are the same
   but where a subnormal input becomes a zero or a subnormal bf16, read as zero by every
   kernel (the corner where they differ otherwise is handled: pdp__bf16_cvt2).

   Gathered operands (Conv2d's implicit GEMM, section "gathered operands"): one operand
   given as bf16 words (pdp__gemm_bf16_convert, which writes the words the path's
   packing would make, in place if asked) whose storage rows may sit anywhere, row s
   at h + off[s] (an offset table, as gemm.c's pdp__sgemm_rows): the packing reads
   them through the table and converts nothing; the panels, and so the bits, are those
   of the materialised operand.

   A Linear's bias and ReLU or GELU (pdp__gemm_bf16_bias): on the chain paths they are
   added where C is written, fl(alpha acc + b), then the ReLU: on each MR x NR tile of C
   right after its kernel writes it (still in L1), in the AMX epilogue; the bits of the
   product followed by a pass over C, in one pass. A GELU keeps C = fl(alpha acc + b),
   its input, which its backward reads, and writes G = gelu(C) beside it with layers.c's
   kernel (pdp__layers_gelu_simd_rows, the GELU layer's), read from the tile just
   written: the bits of the product, then the bias, then the GELU layer.

   Paths, and the path choice (section "path choice"): the emulation, AVX512-BF16 and
   AMX run the chain gemm.h states on packed bf16 pairs; sgemm-rounded is gemm.c's
   pdp__sgemm_bf16, pdp_sgemm with its packed panels rounded to bf16 (the same exact
   products summed in pdp_sgemm's order: gemm.h's bound). PDP_BF16_PATH_AUTO takes, per
   product, the path a table of CPU families names for the product's shape class,
   measured by bench/bf16_paths: a bf16 instruction path only where it beat
   sgemm-rounded, whose speed is near fp32's (the table's rows say how near).

   Invariants:
   - Two arithmetics (gemm.h states both): on the emulated, AVX512 and AMX paths, per
     element of C one chain of fp32 sums over the pairs, in order, from 0, flushing
     subnormals (DAZ/FTZ, as vdpbf16ps); on sgemm-rounded pdp_sgemm's FMA chain. The
     tile grid, the pairs and the chain depend on nothing but k, so the bits do not
     depend on the thread count or on how the parts are cut. The emulation's AVX-512F
     and AVX2 kernels (FMAs under MXCSR DAZ/FTZ) gave the AVX512 path's bits on every
     input tried; its portable kernel gives them except for products below 2^-126.
   - Paths are chosen by CPUID (checked once, pdp__once_run) and the OS's XCR0: the
     AVX512 kernel needs AVX512F, AVX512BW (the packing's vpermw), AVX512DQ (its
     vfpclassps), AVX512-BF16 and the zmm state enabled; the AMX
     kernel AMX-TILE, AMX-BF16, the tile state in XCR0 (bits 17, 18) and Linux's
     permission to use it (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), asked
     once; refused: AVX512 or the emulation). Both are compiled under target
     attributes, so a plain x86-64 build has them; -DPDP_NO_SIMD or a non-x86 target
     leaves only the emulation (and AMX needs x86-64 Linux).
   - AMX's arithmetic (TDPBF16PS; gemm_amx.c states it and what the hardware was
     measured to do): the same exact products summed in fp32 with DAZ/FTZ, but not in
     the AVX512 path's order, so the AMX path is held to the bound (both are fp32 sums
     of the same exact products), not to the emulation's bits. It is still
     deterministic: its chain, too, depends on nothing but k.
   - Memory: packed panels live in the part's thread scratch (pdp__thread_scratch),
     reused from call to call; if it cannot grow, the emulated arithmetic runs
     unpacked, element by element, with the same bits as the emulated path. */

/* #include "internal.h" (above) */

#define PDP__BF16_MR 8  /* rows of a C tile */
#define PDP__BF16_NR 32 /* columns of a C tile: two zmm of fp32 */
#define PDP__BF16_MC 256 /* rows of A packed at once */
/* Smaller products stay on the calling thread: as pdp_sgemm's PDP__GEMM_PAR_FLOPS (at
   1e6 rather than 2e6 the bf16 MLP step at batch 128 on 2 threads was faster in 5 of 6
   alternating runs, median +12%). */
#ifndef PDP__BF16_PAR_FLOPS
#  define PDP__BF16_PAR_FLOPS 1.0e6
#endif

#if !defined(PDP_NO_SIMD) && defined(PDP__X86_CPUID) && defined(PDP__HAVE_TARGET)
#  define PDP__BF16_X86 1
#  include <immintrin.h>
#else
#  define PDP__BF16_X86 0
#endif
/* AMX: where platform.h can ask the OS's permission (x86-64 Linux's arch_prctl) and
   the compiler has the AMX intrinsics (gcc 11, clang 12) */
#if PDP__BF16_X86 && defined(PDP__HAVE_AMX_PERMIT)
#  define PDP__BF16_AMX 1
#else
#  define PDP__BF16_AMX 0
#endif

/* ---- gemm_bf16: rounding and the element chain ---- */

/* PDP_API float pdp_bf16_round(float x) */

/* A bf16 as an fp32, subnormals as zero of the same sign (DAZ). */

/* acc + p with a subnormal result flushed to zero of its sign (FTZ). */

/* alpha acc + beta c, as every path writes it (beta c rounded, then the sum). */

/* The Linear's last steps, after pdp__bf16_out (pdp__gemm_bf16_bias): r + bias (the bias
   first, as beta C with C = bias adds it), then the ReLU when asked. */

/* ---- gemm_bf16: CPU features ---- */

/* What the path choice reads of a CPU: CPUID's vendor, family and model (the display
   values: family plus extended family, model plus extended model << 4 for families 6
   and 15) and the features each path needs. */
typedef struct pdp__bf16_cpu {
    int vendor;  /* PDP__BF16_INTEL, PDP__BF16_AMD, or 0 */
    int family, model;
    int avx512;  /* the AVX512 path: AVX512F, BW, DQ, BF16 and the zmm state */
    int amx;     /* the AMX path: AMX-TILE, AMX-BF16, the tile state and Linux's permission */
    int emul512; /* the emulation's AVX-512F kernel: AVX512F and the zmm state */
    int emul256; /* its AVX2 kernel: AVX2, FMA and the ymm state */
} pdp__bf16_cpu;
#define PDP__BF16_INTEL 1
#define PDP__BF16_AMD 2

/* written once under pdp__bf16_once (each member named: C++ warns of a missing one) */
extern pdp__bf16_cpu pdp__bf16_this;

PDP__PRIVATE void pdp__bf16_detect(void);

/* The pdp__sgemm_bf16 path: gemm.c's own kernels (with -DPDP_CBLAS the product goes to
   the CBLAS linked in, which cannot round at packing). */
#if defined(PDP_CBLAS)
#  define PDP__BF16_HAS_SGEMM 0
#else
#  define PDP__BF16_HAS_SGEMM 1
#endif

PDP__PRIVATE bool pdp__bf16_cpu_has(const pdp__bf16_cpu *cpu, pdp_bf16_path path);

/* PDP_API bool pdp_bf16_path_available(pdp_bf16_path path) */

/* PDP_API const char *pdp_bf16_path_name(pdp_bf16_path path) */

/* ---- gemm_bf16: the path choice ----
   PDP_BF16_PATH_AUTO runs, per product, the path a table of CPU families names for the
   product's shape class, never a timing taken at run time (a noisy machine would then
   change the bits). Classes: the layout (ta, tb: the packing differs) times the size:
   k < 32 (packing and C's traffic dominate: the 10-class layer's dX = dY W), min(m, n)
   < 32 (a partial tile row or column: its forward and dW), else large. The rows are
   bench/bf16_paths's output on the CPUs named, pasted: each cell sgemm-rounded
   (pdp__sgemm_bf16, pdp_sgemm plus the rounding at packing: near fp32's speed, the
   figures in the table's rows) unless
   AVX512-BF16 or AMX was faster by the bench's margin. A CPU no row names, or a cell's
   path it lacks: AMX, else AVX512-BF16 on AMD (the Zen 4 row's choice), else
   sgemm-rounded, else AVX512-BF16 (a -DPDP_CBLAS build), else the emulation. */
enum { PDP__BF16_LARGE, PDP__BF16_SMALL_MN, PDP__BF16_SMALL_K, PDP__BF16_SIZES };
#define PDP__BF16_CLASSES (4 * PDP__BF16_SIZES)

PDP__PRIVATE int pdp__bf16_class(pdp_trans ta, pdp_trans tb, int64_t m, int64_t n, int64_t k);

typedef struct pdp__bf16_row {
    int vendor, family, model_lo, model_hi; /* models model_lo .. model_hi; -1: any */
    int avx512, amx; /* features every CPU the row names has */
    /* per class, layouts NN NT TN TT (spaces between), each large, small m or n,
       small k: E emulated, B avx512-bf16, A amx-bf16, S sgemm-rounded */
    const char *cells;
} pdp__bf16_row;

#define PDP__BF16_SPR_ROW(model) {PDP__BF16_INTEL, 6, model, model, 1, 1, "AAS AAS AAS AAS"}
extern const pdp__bf16_row pdp__bf16_table[];
extern const size_t pdp__bf16_rows;

PDP__PRIVATE pdp_bf16_path pdp__bf16_cell(const char *cells, int cls);

/* The row of pdp__bf16_table naming cpu, or NULL. */
PDP__PRIVATE const pdp__bf16_row *pdp__bf16_row_of(const pdp__bf16_cpu *cpu);

/* The path AUTO takes on cpu for this shape: a pure function of both. */
PDP__PRIVATE pdp_bf16_path pdp__bf16_choose(const pdp__bf16_cpu *cpu, pdp_trans ta, pdp_trans tb,
                                            int64_t m, int64_t n, int64_t k);

/* PDP_API pdp_bf16_path pdp_bf16_path_for(pdp_trans ta, pdp_trans tb, int64_t m, int64_t n, int64_t k) */

/* PDP_API pdp_bf16_path pdp_bf16_best_path(void) */

/* The fastest path that takes operands in bf16 words (the gathered operands below):
   AMX, else AVX512, else the emulation. */
PDP__PRIVATE pdp_bf16_path pdp__bf16_best_word_path(void);

/* ---- gemm_bf16: packing ---- */

/* op(X)(r, p) of an operand stored row-major with stride ld. */

/* Rows [r0, r0 + rows) of op(X) (rows x k) into pair words, `width` words per pair
   (width >= rows; the rest zero): dst[p * width + i] = (x(r0+i, 2p), x(r0+i, 2p+1)). */
PDP__PRIVATE void pdp__bf16_pack_panel(const float *x, int64_t ld, pdp_trans t, int64_t r0,
                                       int rows, int64_t k, int width, uint32_t *dst);

/* Rows [r0, r0 + rows) of op(X) as ceil(rows / width) panels of `width` rows, panel j
   at dst + j * pairs * width (the last one zero-padded). */
PDP__PRIVATE void pdp__bf16_pack(const float *x, int64_t ld, pdp_trans t, int64_t r0, int rows,
                                 int64_t k, int width, uint32_t *dst);

/* op(X)(r, p) of an operand already in bf16 words, storage row s at h + off[s]. */

/* pdp__bf16_pack for an operand already in bf16 words (pdp__gemm_bf16_convert's), its
   storage rows through off: the same panels, nothing to round. */
PDP__PRIVATE void pdp__bf16_pack_h(const uint16_t *h, const int64_t *off, pdp_trans t, int64_t r0,
                                   int rows, int64_t k, int width, uint32_t *dst);

/* x[0, n) as bf16 words (pdp__bf16_bits) into h. h may be x's own memory (h == (uint16_t
   *)x): word i is written after float i is read, at byte 2i, where float i / 2 was. */
PDP__PRIVATE void pdp__bf16_convert_emul(const float *x, uint16_t *h, int64_t n);

#if PDP__BF16_X86
#  define PDP__BF16_TARGET PDP__TARGET("avx512f,avx512bw,avx512dq,avx512bf16")
/* The zero-masking forms, with every lane kept, of the unpacks and extracts the packing
   uses: GCC's headers write the plain forms with _mm*_undefined_*() as the merge source
   (`__m512i __Y = __Y;`), which g++ and nvcc's host pass (not gcc) report as
   -Wmaybe-uninitialized at every inlined call (99 to 102 warnings at -Og/-O2/-O3). The
   instructions are the same: gcc folds the full mask away (vpunpckldq, vextracti64x4). */
#  define PDP__BF16_UNPACKLO32(a, b) _mm512_maskz_unpacklo_epi32((__mmask16)0xffff, a, b)
#  define PDP__BF16_UNPACKHI32(a, b) _mm512_maskz_unpackhi_epi32((__mmask16)0xffff, a, b)
#  define PDP__BF16_UNPACKLO64(a, b) _mm512_maskz_unpacklo_epi64((__mmask8)0xff, a, b)
#  define PDP__BF16_UNPACKHI64(a, b) _mm512_maskz_unpackhi_epi64((__mmask8)0xff, a, b)
#  define PDP__BF16_HALF(w, L) _mm512_maskz_extracti64x4_epi64((__mmask8)0xf, w, L)
#  define PDP__BF16_LANE(w, L) _mm512_maskz_extracti32x4_epi32((__mmask8)0xf, w, L)
#  define PDP__BF16_SHL16(w) _mm512_maskz_slli_epi32((__mmask16)0xffff, w, 16) /* vpslld */

/* pdp__bf16_cvt2 where some lane is subnormal. */
PDP__BF16_TARGET PDP__PRIVATE __m512i pdp__bf16_cvt2_subnormal(__m512 lo, __m512 hi);

/* x rounded to bf16 by vcvtne2ps2bf16 (round to nearest even, a NaN quieted with its
   sign and top payload, as pdp__bf16_bits), 16 lanes at a time: lo's in words 0-15, hi's
   in 16-31. The instruction flushes subnormal inputs to zero of their sign (Intel SDM),
   where pdp__bf16_bits rounds them; the kernels read a subnormal bf16 as that zero
   (DAZ), so the two differ only where a subnormal fp32 rounds up to the least normal
   bf16 (|x| in [0x007f8000, 0x00800000) as bits): those lanes are set to that value
   (sign | 0x00800000) first, in a branch taken only when some lane is subnormal
   (vfpclassps, AVX512DQ). */

/* 16 rows from `at` (mask m: those below rows) of x(., 2p) and x(., 2p + 1) for every
   pair p, as pair words to d + p width (wide: width >= 16; else width 8, rows 8-15 to
   d + panel + p width when two: both halves are in the padded rows); inlined with wide
   and two constant, so that the loop has no branch but the subnormal one. */

/* pdp__bf16_pack for an operand whose rows are contiguous (t == PDP_TRANS: x(r, p) =
   x[p * ld + r]): per pair, 16 rows of x(., 2p) and x(., 2p + 1) converted together and
   interleaved (word i = lo_i | hi_i << 16) by one vpermw, then stored to one panel
   (width a multiple of 16) or two (width 8). */
PDP__BF16_TARGET PDP__PRIVATE void pdp__bf16_pack_rows(const float *x, int64_t ld, int64_t r0,
                                                       int rows, int64_t k, int width,
                                                       uint32_t *dst);

/* row i of the block: its 32 values from pair p0 as 16 pair words (zero past rows):
   converted, or from bf16 words (hrow) as they are */
#  define PDP__BF16_ROWW(i)                                                                   \
    (i0 + (i) >= rows ? _mm512_setzero_si512()                                                 \
     : hrow[0]        ? _mm512_maskz_loadu_epi16(mh, hrow[i] + 2 * p0)                          \
                      : pdp__bf16_cvt2(_mm512_maskz_loadu_ps(mlo, row[i] + 2 * p0),            \
                                       _mm512_maskz_loadu_ps(mhi, row[i] + 2 * p0 + 16)))
/* lane L of lo (rows 0-3) and hi (rows 4-7): pair 4L + q, stored if below np */
#  define PDP__BF16_PUT4(q, L, lo, hi)                                                        \
    do {                                                                                       \
        if (4 * (L) + (q) < np) {                                                              \
            uint32_t *dq = d + (4 * (L) + (q)) * (int64_t)width;                               \
            _mm_storeu_si128((__m128i *)dq, PDP__BF16_LANE(lo, L));                           \
            _mm_storeu_si128((__m128i *)(dq + 4), PDP__BF16_LANE(hi, L));                     \
        }                                                                                      \
    } while (0)
#  define PDP__BF16_PUT(q, lo, hi)                                                            \
    do {                                                                                       \
        __m512i ulo = (lo), uhi = (hi);                                                        \
        PDP__BF16_PUT4(q, 0, ulo, uhi);                                                        \
        PDP__BF16_PUT4(q, 1, ulo, uhi);                                                        \
        PDP__BF16_PUT4(q, 2, ulo, uhi);                                                        \
        PDP__BF16_PUT4(q, 3, ulo, uhi);                                                        \
    } while (0)

/* pairs P, P + 1 (P = 4 L + q, q even) of the block from the q-th and (q + 1)-th
   quarters lo_q, hi_q (rows 0-3, 4-7; 128-bit lane L: pair 4 L + q) as one zmm of two
   8-word pair rows: [lo_q[L], hi_q[L], lo_q1[L], hi_q1[L]]; v, w: lo_q, lo_q1 and hi_q,
   hi_q1 with lanes L, L' interleaved */
#  define PDP__BF16_FULL2(q, lo0, hi0, lo1, hi1)                                              \
    do {                                                                                       \
        __m512i v = _mm512_permutex2var_epi64(lo0, i01, lo1);                                  \
        __m512i w = _mm512_permutex2var_epi64(hi0, i01, hi1);                                  \
        _mm512_storeu_si512((void *)(d + (q) * 8), _mm512_permutex2var_epi64(v, i01, w));      \
        _mm512_storeu_si512((void *)(d + (q + 4) * 8), _mm512_permutex2var_epi64(v, i23, w));  \
        v = _mm512_permutex2var_epi64(lo0, i23, lo1);                                          \
        w = _mm512_permutex2var_epi64(hi0, i23, hi1);                                          \
        _mm512_storeu_si512((void *)(d + (q + 8) * 8), _mm512_permutex2var_epi64(v, i01, w));  \
        _mm512_storeu_si512((void *)(d + (q + 12) * 8), _mm512_permutex2var_epi64(v, i23, w)); \
    } while (0)

/* pdp__bf16_pack for an operand whose rows run along k (t == PDP_NO_TRANS): blocks of 8
   rows x 16 pairs converted row by row (or, from bf16 words h, loaded: a pair is two
   adjacent words) and transposed in registers. A block of 16 whole pairs in a panel of
   width 8 is stored as 8 zmm of two pair rows each; the others lane by lane. Inlined
   with x or h NULL: x's rows at x + r ld, h's at h + off[r]. */

#  undef PDP__BF16_FULL2

PDP__BF16_TARGET PDP__PRIVATE void pdp__bf16_pack_k_panel(const float *x, int64_t ld, int64_t r0,
                                                          int rows, int64_t k, int width,
                                                          uint32_t *dst);

PDP__BF16_TARGET PDP__PRIVATE void pdp__bf16_pack_k_panel_h(const uint16_t *h, const int64_t *off,
                                                            int64_t r0, int rows, int64_t k,
                                                            int width, uint32_t *dst);
#  undef PDP__BF16_ROWW
#  undef PDP__BF16_PUT
#  undef PDP__BF16_PUT4

/* pdp__bf16_pack with AVX512-BF16's conversion: the same words, but for subnormal
   values (zero of their sign here, rounded there), which every kernel reads as zero. */
PDP__BF16_TARGET PDP__PRIVATE void pdp__bf16_pack_avx512(const float *x, int64_t ld, pdp_trans t,
                                                         int64_t r0, int rows, int64_t k, int width,
                                                         uint32_t *dst);

/* pdp__bf16_pack_h of t == PDP_TRANS into one NR-column panel (cols <= NR = 32 rows of
   op(X) from c0), 32 columns of a pair at a time: two loads of 32 words, interleaved by
   two vpermt2w. */
PDP__BF16_TARGET PDP__PRIVATE void pdp__bf16_pack_h_cols(const uint16_t *h, const int64_t *off,
                                                         int64_t c0, int cols, int64_t k,
                                                         uint32_t *dst);

/* pdp__bf16_pack_h with AVX512: the same words. */
PDP__BF16_TARGET PDP__PRIVATE void pdp__bf16_pack_h_avx512(const uint16_t *h, const int64_t *off,
                                                           pdp_trans t, int64_t r0, int rows,
                                                           int64_t k, int width, uint32_t *dst);

/* pdp__bf16_convert_emul by vcvtne2ps2bf16 (pdp__bf16_cvt2: the words the avx512 packing
   makes), 32 floats at a time; the same in-place rule (a block's 32 words go to bytes
   its own floats or earlier ones held, after they are read). */
PDP__BF16_TARGET PDP__PRIVATE void pdp__bf16_convert_avx512(const float *x, uint16_t *h, int64_t n);
#endif

/* ---- gemm_bf16: micro-kernels ----
   Contract: pairs >= 1; ap holds pairs groups of MR words, bp pairs groups of NR
   words; writes the top-left mr x nr of the tile to c (row stride ldc). */

PDP__PRIVATE void pdp__bf16_kernel_emul(int64_t pairs, const uint32_t *ap, const uint32_t *bp,
                                        float *c, int64_t ldc, int mr, int nr, float alpha,
                                        float beta);

#if PDP__BF16_X86
/* The emulation vectorised, for CPUs with AVX-512F but no AVX512-BF16 (Skylake-X to Ice
   Lake; the AVX2 kernel below for the others): vdpbf16ps's chain as two FMAs per pair,
   acc = fma(a_odd, b_odd, acc), then acc = fma(a_even, b_even, acc), on the bf16 halves
   widened in registers (a word's high half masked, its low half shifted up), with
   MXCSR's DAZ and FTZ set (and rounding to nearest) for the loop: DAZ reads a subnormal
   bf16 as zero, FTZ flushes a subnormal sum, and an FMA, like vdpbf16ps, adds the exact
   product without rounding it first, even where it falls below 2^-126 (the portable
   kernel's corner). MXCSR is restored before C is written, so alpha and beta see the
   caller's modes as on the other paths. The bits equal the AVX512 path's on every input
   test_bf16 tries, subnormal-heavy ones included. */
#  define PDP__BF16_EMUL_TARGET PDP__TARGET("avx512f")
#  define PDP__BF16_EROW(i)                                                                   \
    do {                                                                                       \
        __m512i w = _mm512_set1_epi32((int)a[i]);                                             \
        __m512 a1 = _mm512_castsi512_ps(_mm512_and_si512(w, high));                           \
        __m512 a0 = _mm512_castsi512_ps(PDP__BF16_SHL16(w));                                  \
        c##i##0 = _mm512_fmadd_ps(a1, b10, c##i##0);                                          \
        c##i##1 = _mm512_fmadd_ps(a1, b11, c##i##1);                                          \
        c##i##0 = _mm512_fmadd_ps(a0, b00, c##i##0);                                          \
        c##i##1 = _mm512_fmadd_ps(a0, b01, c##i##1);                                          \
    } while (0)

/* The AVX-512 kernels' epilogue: C = alpha acc + beta C for the MR x NR tile in acc
   (pdp__bf16_out's rule, 16 columns at a time, masked at nr; C not read when beta == 0),
   then, before the store, the bias (bias[j] + C, when bias is not NULL) and the ReLU (x
   <= 0 ? 0 : x, when relu): pdp__bf16_bias_tile's operations on the same values. */

PDP__BF16_EMUL_TARGET PDP__PRIVATE void pdp__bf16_kernel_emul512(int64_t pairs, const uint32_t *ap,
                                                                 const uint32_t *bp, float *c,
                                                                 int64_t ldc, int mr, int nr,
                                                                 float alpha, float beta);
#  undef PDP__BF16_EROW

/* The same chain with AVX2 and FMA (Zen 2 and 3, Intel's client cores since Haswell):
   16 ymm registers hold a quarter of the 8 x 32 tile at a time (4 rows x 16 columns: 8
   accumulators, B's 4 widened vectors, A's two halves), so the tile is four passes over
   the pairs, each element's chain the same. MXCSR as above; the results go through acc
   to pdp__bf16_out (alpha acc + beta c, as the portable kernel writes them). */
#  define PDP__BF16_EMUL2_TARGET PDP__TARGET("avx2,fma")
#  define PDP__BF16_EROW2(i)                                                                  \
    do {                                                                                       \
        __m256i w = _mm256_set1_epi32((int)a[i]);                                             \
        __m256 a1 = _mm256_castsi256_ps(_mm256_and_si256(w, high));                           \
        __m256 a0 = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));                            \
        c##i##0 = _mm256_fmadd_ps(a1, b10, c##i##0);                                          \
        c##i##1 = _mm256_fmadd_ps(a1, b11, c##i##1);                                          \
        c##i##0 = _mm256_fmadd_ps(a0, b00, c##i##0);                                          \
        c##i##1 = _mm256_fmadd_ps(a0, b01, c##i##1);                                          \
    } while (0)

PDP__BF16_EMUL2_TARGET PDP__PRIVATE void pdp__bf16_kernel_emul256(int64_t pairs, const uint32_t *ap,
                                                                  const uint32_t *bp, float *c,
                                                                  int64_t ldc, int mr, int nr,
                                                                  float alpha, float beta);
#  undef PDP__BF16_EROW2
#endif

#if PDP__BF16_X86
/* One row of the tile: acc_i0, acc_i1 += a[i] (broadcast) . b0, b1 (one vdpbf16ps per
   16 columns). The 16 accumulators are named so that they stay in registers. */
#  define PDP__BF16_ROW(i)                                                                    \
    do {                                                                                       \
        __m512bh ai = (__m512bh)_mm512_set1_epi32((int)a[i]);                                 \
        c##i##0 = _mm512_dpbf16_ps(c##i##0, ai, b0);                                          \
        c##i##1 = _mm512_dpbf16_ps(c##i##1, ai, b1);                                          \
    } while (0)
#  define PDP__BF16_ROW1(i) /* the first 16 columns only */                                 \
    do {                                                                                       \
        c##i##0 = _mm512_dpbf16_ps(c##i##0, (__m512bh)_mm512_set1_epi32((int)a[i]), b0);      \
    } while (0)
/* The k loop over a tile's pairs with ROW (the two vectors) or ROW1 (the first), wide and
   rows constants: b1 loaded when wide, rows 4 .. 7 run when rows is 8. */
#  define PDP__BF16_LOOP(ROW, wide, rows)                                                     \
    do {                                                                                      \
        for (p = 0; p < pairs; p++) {                                                         \
            const uint32_t *a = ap + p * PDP__BF16_MR;                                        \
            const uint32_t *b = bp + p * PDP__BF16_NR;                                        \
            __m512bh b0 = (__m512bh)_mm512_loadu_si512((const void *)b);                      \
            __m512bh b1 = wide ? (__m512bh)_mm512_loadu_si512((const void *)(b + 16)) : b0;   \
            (void)b1;                                                                         \
            ROW(0);                                                                           \
            ROW(1);                                                                           \
            ROW(2);                                                                           \
            ROW(3);                                                                           \
            if (rows > 4) {                                                                   \
                ROW(4);                                                                       \
                ROW(5);                                                                       \
                ROW(6);                                                                       \
                ROW(7);                                                                       \
            }                                                                                 \
        }                                                                                     \
    } while (0)

/* the kernel below names MR = 8 rows of accumulators */
typedef char pdp__bf16_avx512_shape_ok[PDP__BF16_MR == 8 && PDP__BF16_NR == 32 ? 1 : -1];

/* The kernel with Linear's epilogue fused (pdp__bf16_store_tile512's bias and relu: the
   tile stored once, where pdp__bf16_bias_tile read it back). */
PDP__BF16_TARGET PDP__PRIVATE void pdp__bf16_kernel_avx512_epi(int64_t pairs, const uint32_t *ap,
                                                               const uint32_t *bp, float *c,
                                                               int64_t ldc, int mr, int nr,
                                                               float alpha, float beta,
                                                               const float *bias, int relu);
#  undef PDP__BF16_ROW
#  undef PDP__BF16_ROW1
#  undef PDP__BF16_LOOP
#endif

typedef void (*pdp__bf16_kernel_fn)(int64_t pairs, const uint32_t *ap, const uint32_t *bp,
                                    float *c, int64_t ldc, int mr, int nr, float alpha,
                                    float beta);
/* A kernel that adds the bias and applies the ReLU as it stores (Linear's epilogue). */
typedef void (*pdp__bf16_kernel_epi_fn)(int64_t pairs, const uint32_t *ap, const uint32_t *bp,
                                        float *c, int64_t ldc, int mr, int nr, float alpha,
                                        float beta, const float *bias, int relu);

typedef void (*pdp__bf16_pack_fn)(const float *x, int64_t ld, pdp_trans t, int64_t r0, int rows,
                                  int64_t k, int width, uint32_t *dst);

typedef void (*pdp__bf16_pack_h_fn)(const uint16_t *h, const int64_t *off, pdp_trans t,
                                    int64_t r0, int rows, int64_t k, int width, uint32_t *dst);

/* ---- gemm_bf16: driver ---- */

/* pdp__bf16_run's paths for the emulation on one kernel, whatever the CPU has beside
   (pdp__gemm_bf16_emul: the tests'): portable C, AVX2, AVX-512F. */
#define PDP__BF16_PATH_PORTABLE ((pdp_bf16_path)16)
#define PDP__BF16_PATH_EMUL256 ((pdp_bf16_path)17)
#define PDP__BF16_PATH_EMUL512 ((pdp_bf16_path)18)

typedef struct pdp__bf16_args {
    pdp_trans ta, tb;
    int64_t m, n, k;
    float alpha, beta;
    const float *a, *b;
    int64_t lda, ldb, ldc;
    const uint16_t *ah, *bh;    /* not NULL: A (B) in bf16 words instead of a (b) */
    const int64_t *arow, *brow; /* storage row r at ah + arow[r] (bh + brow[r]) */
    float *c;
    pdp__bf16_kernel_fn kernel;
    pdp__bf16_pack_fn pack;
    pdp__bf16_pack_h_fn pack_h;
    int split_n;       /* parts split the NR-column panels (else the MR-row panels) */
    const float *bias; /* not NULL: C(i, j) += bias[j] after alpha acc + beta C */
    int relu;          /* then C = pdp__relu(C) */
    float *gelu;       /* not NULL: then G = gelu(C) here (C's ldc), C kept */
    int gelu_simd;     /* its kernel's width: pdp__layers_simd's */
    pdp__bf16_kernel_epi_fn kernel_epi; /* not NULL: it runs instead of kernel, with the bias
                                           and ReLU (a GELU follows as a pass) */
} pdp__bf16_args;

/* layers.c's GELU kernel (out = gelu(x), or dy gelu'(x) when dy is not NULL, on rows of n
   floats ld apart, each element alone) and the width the GELU layer runs it on: a fused
   GELU's epilogue runs it. */
PDP__PRIVATE int pdp__layers_simd(void);
PDP__PRIVATE void pdp__layers_gelu_simd_rows(int simd, const float *x, const float *dy, float *out,
                                             int64_t n, int64_t rows, int64_t ld);

/* G = gelu(C) over C[i0, i0 + mr) x [j0, j0 + nr) (g->gelu: a Linear's fused GELU), by
   the GELU layer's kernel on the width it runs (each element alone, whatever the cut). */
PDP__PRIVATE void pdp__bf16_gelu_tile(const pdp__bf16_args *g, int64_t i0, int64_t j0, int mr,
                                      int nr);

/* C[i0, i0 + mr) x [j0, j0 + nr) through pdp__bf16_bias_relu, then the GELU, where a
   kernel has just written it (the tile is in L1): the gemm_bf16.c kernels' epilogue. */
PDP__PRIVATE void pdp__bf16_bias_tile(const pdp__bf16_args *g, int64_t i0, int64_t j0, int mr,
                                      int nr);

/* op(A)(i, p) and op(B)(p, j) as bf16 words. */
PDP__PRIVATE uint16_t pdp__bf16_aword(const pdp__bf16_args *g, int64_t i, int64_t p);
PDP__PRIVATE uint16_t pdp__bf16_bword(const pdp__bf16_args *g, int64_t p, int64_t j);

/* Element (i, j) of C by the emulated chain, unpacked (the fallback without scratch). */
PDP__PRIVATE void pdp__bf16_element(const pdp__bf16_args *g, int64_t i, int64_t j);

/* C[m0, m1) x [n0, n1) (m0, n0 on the tile grid). B's panels for [n0, n1) are packed
   once, in the first MC block, and reused by the others. */
PDP__PRIVATE void pdp__bf16_block(const pdp__bf16_args *g, int64_t m0, int64_t m1, int64_t n0,
                                  int64_t n1);

/* Part i of n: an equal share of the column or row panels. */
PDP__PRIVATE void pdp__bf16_part(void *arg, int i, int n);

#if PDP__BF16_AMX || defined(PDP__AMX_EMULATE)
PDP__PRIVATE void pdp__amx_run(const pdp__bf16_args *g, int emulate); /* gemm_amx.c */
#endif

/* *g for C = alpha op(A) op(B) + beta C, the operands as pdp__bf16_run takes them, with
   the portable kernel and packing (a path swaps its own in); 0 when nothing is left to
   compute (C empty; or k or alpha zero, and C scaled by beta here). */
PDP__PRIVATE int pdp__bf16_args_init(pdp__bf16_args *g, pdp_trans ta, pdp_trans tb, int64_t m,
                                     int64_t n, int64_t k, float alpha, const float *a,
                                     const uint16_t *ah, int64_t lda, const int64_t *arow,
                                     const float *b, const uint16_t *bh, int64_t ldb,
                                     const int64_t *brow, float beta, float *c, int64_t ldc);

/* pdp_gemm_bf16_on on an available path (not AUTO); A (B) as bf16 words at ah (bh)
   when given, storage row r at ah + arow[r] (bh + brow[r]), else as floats at a (b). */
PDP__PRIVATE void pdp__bf16_run(pdp_bf16_path path, pdp_trans ta, pdp_trans tb, int64_t m,
                                int64_t n, int64_t k, float alpha, const float *a,
                                const uint16_t *ah, int64_t lda, const int64_t *arow,
                                const float *b, const uint16_t *bh, int64_t ldb,
                                const int64_t *brow, float beta, const float *bias, int relu,
                                float *gelu, float *c, int64_t ldc);

/* PDP_API pdp_status pdp_gemm_bf16_on(pdp_bf16_path path, pdp_trans ta, pdp_trans tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc) */

/* PDP_API void pdp_gemm_bf16(pdp_trans ta, pdp_trans tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc) */

/* pdp_gemm_bf16_on(PDP_BF16_PATH_EMULATED, ...) on one kernel of the emulation, simd: 0
   portable C, 256 AVX2, 512 AVX-512F (one this CPU lacks: the caller's bug); the tests
   check each against the others and against vdpbf16ps. */
PDP__PRIVATE void pdp__gemm_bf16_emul(int simd, pdp_trans ta, pdp_trans tb, int64_t m, int64_t n,
                                      int64_t k, float alpha, const float *a, int64_t lda,
                                      const float *b, int64_t ldb, float beta, float *c,
                                      int64_t ldc);

/* C = op(A) op(B) + bias, then the ReLU where relu != 0 (bias: one value per column of C,
   NULL for none): a Linear's forward x W^T + b in one pass over C, the bias and the ReLU
   added in the product's epilogue to alpha acc (alpha 1, beta 0), so the bits of
   pdp_gemm_bf16_on with beta 0 followed by a pass C = relu(bias + C) (or of C = bias
   then beta 1: fl(acc + b) either way). gelu not NULL (ldc its row stride too): C as
   without it, and gelu = the GELU layer's output on C, in the same pass (no ReLU with it).
   On `path` (AUTO: pdp_bf16_path_for's choice; one the CPU lacks is the caller's bug;
   PDP__BF16_PATH_PORTABLE, _EMUL256, _EMUL512: one kernel of the emulation, as
   pdp__gemm_bf16_emul). False, C untouched, on sgemm-rounded, which adds beta C to its
   first k block's partial sum: the caller sets C = bias, runs the product with beta 1 and
   its ReLU or GELU after. */
PDP__PRIVATE bool pdp__gemm_bf16_bias(pdp_bf16_path path, pdp_trans ta, pdp_trans tb, int64_t m,
                                      int64_t n, int64_t k, const float *a, int64_t lda,
                                      const float *b, int64_t ldb, const float *bias, int relu,
                                      float *gelu, float *c, int64_t ldc);

/* path with AUTO resolved to the best that takes bf16 words; one the CPU lacks, or
   sgemm-rounded (which takes floats: Conv2d rounds them and calls pdp__sgemm_rows), is
   the caller's bug. */
PDP__PRIVATE pdp_bf16_path pdp__bf16_resolve(pdp_bf16_path path);

/* ---- gemm_bf16: gathered operands ----
   gemm.c's pdp__sgemm_rows and pdp__sgemm_arows in bf16, on `path` (AUTO: the best;
   one the CPU lacks: the caller's bug, asserted), with the gathered operand already in
   bf16 words as pdp__gemm_bf16_convert on the same path wrote them (Conv2d converts its
   padded image once, where packing floats would convert each value k k times): the
   packing reads the storage rows through the offset table and converts nothing, a pair
   is two loads and two vpermt2w per 32 columns, or two adjacent words. Same tiles,
   chains and bits as pdp_gemm_bf16_on on the materialised floats, on the same path.
   rows_h:  B's storage row r at bh + brow[r]: op(B)(p, j) = bh[brow[p] + j] (tb ==
            PDP_NO_TRANS) or bh[brow[j] + p] (PDP_TRANS).
   arows_h: A not transposed, row i at ah + arow[i]: A(i, p) = ah[arow[i] + p]. */
PDP__PRIVATE void pdp__gemm_bf16_rows_h(pdp_bf16_path path, pdp_trans ta, pdp_trans tb, int64_t m,
                                        int64_t n, int64_t k, float alpha, const float *a,
                                        int64_t lda, const uint16_t *bh, const int64_t *brow,
                                        float beta, float *c, int64_t ldc);

PDP__PRIVATE void pdp__gemm_bf16_arows_h(pdp_bf16_path path, pdp_trans tb, int64_t m, int64_t n,
                                         int64_t k, float alpha, const uint16_t *ah,
                                         const int64_t *arow, const float *b, int64_t ldb,
                                         float beta, float *c, int64_t ldc);

/* x[0, n) as the bf16 words `path`'s packing makes (AUTO: the best path's) into h,
   which may be x's own memory (h == (uint16_t *)x, converted in place to its first half). */
PDP__PRIVATE void pdp__gemm_bf16_convert(pdp_bf16_path path, const float *x, uint16_t *h, int64_t n);

/* ---- src/gemm_amx.c ---- */
/* gemm_amx: pdp_gemm_bf16's AMX path (PDP_BF16_PATH_AMX, gemm.h), the product run on
   Intel AMX tiles (TDPBF16PS), and an emulation of those tiles that runs the same driver
   on any CPU for the tests (PDP__AMX_EMULATE).

   Layout. Every tile is 16 rows x 64 bytes (palette 1). A tile of A is 16 rows of op(A)
   x 16 pair words (32 bf16 along k: row-major [row][pair]); a tile of B is 16 pairs x
   16 columns of pair words ([pair][column], AMX's pair or "VNNI" layout); a pair word
   holds (x[2p] low, x[2p+1] high), as gemm_bf16.c's packing makes it. k is padded with
   zero pairs to a multiple of 16 pairs (one "k step"), rows and columns past m and n
   with zero words. A part of the product cuts its columns into blocks whose packed B
   fits PDP__AMX_NC_BYTES (1 MiB: L2's share; one block at k <= 512 up to 1024 columns),
   packs a block's B columns once ([pair][column] panels of 32 columns, or 16 when
   n <= 16) and then, per block of 32 rows of A (64 when n <= 16), packs that block
   straight into tile order ([step][row][pair]: each tile 1 KiB, contiguous) or, A stored
   along k with AVX512-BF16, into rows ([row][step][pair]: the tiles loaded with the rows'
   stride, the rows written as they are read). The fp32 -> bf16 rounding is fused into the packing: with
   AVX512-BF16, vcvtne2ps2bf16 under gemm_bf16.c's subnormal rule (pdp__bf16_cvt2), the
   operands read along their stored rows (rows of B along n interleaved by vpermw; rows
   of op(A) across k and of op(B) along k as 16 x 16 words transposed in registers);
   otherwise, and for a gathered B, pdp__bf16_bits and gemm_bf16.c's panel packing. The
   words are the same up to subnormals, which every kernel reads as zero.

   Streaming. Where one side of C is at most 16 and, with AVX512-BF16, the other operand
   is stored along the rows its tiles take (n <= 16 and op(A) stored along k; m <= 16 and
   op(B) stored k x n), each of its values meets one tile product, so it is not packed:
   pdp__amx_kernel41_stream and pdp__amx_kernel12_stream convert it one k step at a time
   into two 4 KiB buffers that stay in L1, among the tile operations, over all of k (no
   cache blocks: the packed side is one panel or one block of rows). bench/gemm bf16 (one
   thread, operands 64-byte aligned, medians of 3 runs, a loaded 2-core Sapphire Rapids):
   512 x 512 x 10 NT 27 -> 20 us a call, 10 x 512 x 512 TN 39 -> 27 us.

   Kernel. A block of C is 2 x 2 tiles (32 x 32: tmm0-3 accumulate, tmm4-5 hold two
   tiles of A, tmm6-7 two of B; per k step two A and two B tile loads feed four
   TDPBF16PS) or, when n <= 16, 4 x 1 (64 x 16: tmm0-3 accumulate, four A tiles in
   tmm5-7 in turn, one B tile in tmm4), so that the 10-class layer does not pay for 16
   zero columns in 32, or, when m <= 16 < n, 1 x 2 (16 x 32: tmm0-1 accumulate, one A
   tile in tmm4, two of B in tmm6-7), so that its dW (10 x 512 x 512 TN) does not pay for
   16 zero rows in 32 (one thread, a loaded 2-core Sapphire Rapids: 51.5-52.8 -> 44.9-47.8
   us a call). k is cut into cache blocks of at most PDP__AMX_KC steps (the A
   block's share, 24 KiB at 12 steps, stays in L1 while the B panels pass); between blocks the
   accumulators are stored to an fp32 buffer and loaded back, exactly, so each
   element's chain is one chain over the pairs from 0. After the last block a whole
   block with alpha 1 and beta 0 is stored straight into C (C = acc, the same bits);
   any other goes through the epilogue, C = alpha acc + beta C (pdp__bf16_out's rule:
   beta C rounded before the sum, C not read when beta == 0), then the bias and the
   ReLU where a Linear asks (pdp__gemm_bf16_bias: one pass over C), with AVX-512 where it
   exists, masked at edges, one panel after its tile stores (reading them back at once
   stalled: 12% of a 512^3 product). A fused GELU (gemm_bf16.c's pdp__bf16_gelu_tile) runs
   once a block of rows has all its panels written, over the block's rows of C (in L2): run
   on each panel after its epilogue, among the tile operations, it made bench/gpt's c_fc
   (2048 x 1536 x 384, one thread, cached operands) take 5.7 ms against 4.3 ms for the
   product (2.7 ms) and a GELU pass after it; per block of rows 4.6 ms; on 2 threads 2.5 ms
   against 3.1 ms (the GELU pass is bound by memory there).
   The tile configuration is loaded once per part (thread) per call and released at
   its end.

   Invariants:
   - Per element of C, one sequence of TDPBF16PS over the k steps in order from 0, each
     step's 16 pairs added to the fp32 accumulator (the cache blocks continue it exactly),
     then alpha acc + beta C. That sequence depends on nothing but k, so the bits do not
     depend on the thread count, the block shapes or how the parts are cut. The zero
     pairs that pad k add +0: they can turn a final -0 into +0, nothing else.
   - What one TDPBF16PS computes. Intel's pseudo-code (SDM vol. 2, TDPBF16PS): for each
     pair in order, acc += a[2p] b[2p], then acc += a[2p+1] b[2p+1], each an FMA of the
     exact product rounded to nearest even, subnormal bf16 inputs read as zero (DAZ),
     subnormal results flushed to zero (FTZ), MXCSR not consulted. The emulation below
     implements exactly that. The hardware, measured on an Intel Xeon (Sapphire Rapids
     class) with one instruction on random data: a pair alone gives fl(acc + fl(a[2p]
     b[2p] + a[2p+1] b[2p+1])) in every element (not the pseudo-code's two roundings);
     with two or more pairs no sequential or tree order of fp32 roundings tried matched
     every element. So the hardware is held to the fp32 summation bound around the
     emulation (tests/test_bf16.c states it and counts the elements that agree bit for
     bit), and the emulation is held to the pseudo-code bit for bit.
   - The emulation (PDP__AMX_EMULATE, a test define) runs this file's driver, packing
     and kernels on tiles held in memory (LDTILECFG, TILEZERO, TILELOADD, TILESTORED,
     TDPBF16PS), on any CPU, with or without SIMD.
   - Memory: a part's panels and accumulators live in its thread scratch
     (pdp__thread_scratch); nothing is allocated per call. If the scratch cannot grow,
     the part computes each element by the pseudo-code's chain, unpacked (the
     emulation's bits).
   References: Intel SDM vol. 2 (LDTILECFG, TILELOADD, TDPBF16PS); Intel Optimization
   Reference Manual, ch. "Intel AMX" (TDPBF16PS: 16 cycles per tile op throughput, two
   A and two B tiles feeding four accumulators); oneDNN's brgemm AMX kernels. */

/* #include "internal.h" (above) */

#if defined(PDP__AMX_EMULATE)
#  define PDP__AMX_EMU 1
#else
#  define PDP__AMX_EMU 0
#endif

#if PDP__BF16_AMX || PDP__AMX_EMU

#define PDP__AMX_KT 16 /* pairs per k step: one 64-byte row of an A tile */
#define PDP__AMX_TW 256 /* words per tile: 16 rows x 16 words */
/* k steps per cache block, at most: 2 A tiles x 12 steps = 24 KiB of A reused across the
   panels. CPU time per call (perf stat task-clock, 1000 calls, 3 runs, one thread, a
   loaded 2-core Sapphire Rapids): 512x512x784 NT 446-451 us at 12 (blocks 9, 9, 7),
   486-502 at 8, 487-627 at 16; 512^3 NN and 512x784x512 TN the same within the noise;
   at 4, 10% slower. */
#ifndef PDP__AMX_KC
#  define PDP__AMX_KC 12
#endif
/* Bytes of packed B per column block, at most: a part's columns are cut into blocks
   whose panels (all of k) stay in L2 while every row block of A passes them. 1024^3 NN
   (2 MiB of panels as one block): 725 -> 827 GFLOP/s at 1 MiB (medians of 7 alternated
   runs), 512 KiB slower than one block (one thread, CPU time, a loaded 2-core Sapphire
   Rapids); at k <= 512 one block holds 1024 columns: the MLP's batch-512 products are
   unchanged. */
#ifndef PDP__AMX_NC_BYTES
#  define PDP__AMX_NC_BYTES (1 << 20)
#endif

typedef struct pdp__amx_tilecfg { /* LDTILECFG's 64-byte operand */
    uint8_t palette;              /* 1 */
    uint8_t start_row;            /* 0 */
    uint8_t reserved[14];         /* zero */
    uint16_t colsb[16];           /* bytes per row of tile i (unused tiles 0) */
    uint8_t rows[16];             /* rows of tile i */
} pdp__amx_tilecfg;

/* Tiles held in memory (the emulation); the hardware path passes NULL. */
typedef struct pdp__amx_tiles pdp__amx_tiles;

/* ---- gemm_amx: tile emulation ---- */
#  if PDP__AMX_EMU
struct pdp__amx_tiles {
    pdp__amx_tilecfg cfg;
    unsigned char t[8][16][64];
};

PDP__PRIVATE void pdp__amx_emu_config(pdp__amx_tiles *e, const pdp__amx_tilecfg *cfg);

PDP__PRIVATE void pdp__amx_emu_zero(pdp__amx_tiles *e, int t);

/* TILELOADD: rows[t] rows of colsb[t] bytes from base + r stride; the rest zero. */
PDP__PRIVATE void pdp__amx_emu_load(pdp__amx_tiles *e, int t, const void *base, int64_t stride);

PDP__PRIVATE void pdp__amx_emu_store(pdp__amx_tiles *e, int t, void *base, int64_t stride);

/* acc + a b for bf16 a, b: DAZ inputs, one rounding to nearest even (FMA; the product
   of two bf16 values is exact unless below 2^-126), FTZ result. */

/* TDPBF16PS c, a, b by the SDM's pseudo-code: for each row m of c, for each pair k of
   a's row, for each column n of c: c[m][n] += a[m].bf16[2k] b[k].bf16[2n], then
   += a[m].bf16[2k+1] b[k].bf16[2n+1]. */
PDP__PRIVATE void pdp__amx_emu_dp(pdp__amx_tiles *e, int c, int a, int b);
#  endif

/* One tile operation: on the emulated tiles when e is not NULL, else the instruction. */
#  if PDP__BF16_AMX && PDP__AMX_EMU
#    define PDP__AMX_OP(e, emu, hw)                                                           \
        do {                                                                                   \
            if (e)                                                                             \
                emu;                                                                           \
            else                                                                               \
                hw;                                                                            \
        } while (0)
#  elif PDP__BF16_AMX
#    define PDP__AMX_OP(e, emu, hw)                                                           \
        do {                                                                                   \
            (void)(e);                                                                         \
            hw;                                                                                \
        } while (0)
#  else
#    define PDP__AMX_OP(e, emu, hw) emu
#  endif
#  if PDP__BF16_AMX
#    define PDP__AMX_TARGET PDP__TARGET("amx-tile,amx-bf16")
#  else
#    define PDP__AMX_TARGET
#  endif
#  define PDP__AMX_ZERO(e, t) PDP__AMX_OP(e, pdp__amx_emu_zero(e, t), _tile_zero(t))
#  define PDP__AMX_LOAD(e, t, p, s)                                                           \
      PDP__AMX_OP(e, pdp__amx_emu_load(e, t, p, s), _tile_loadd(t, p, s))
#  define PDP__AMX_STORE(e, t, p, s)                                                          \
      PDP__AMX_OP(e, pdp__amx_emu_store(e, t, p, s), _tile_stored(t, p, s))
#define PDP__AMX_DP(e, c, a, b) PDP__AMX_OP(e, pdp__amx_emu_dp(e, c, a, b), _tile_dpbf16ps(c, a, b))

/* Where a block's packed A puts its tiles: tile i of step s at a + s step + i tile words,
   its rows stride bytes apart. Tile order: step 16 height, tile 256, stride 64; rows
   (pdp__amx_pack_a_rows_avx512, PDP__AMX_AROW words per row): step 16, tile 16 rows,
   stride 4 rows. */
#define PDP__AMX_AROW(steps) (((steps) + 1) * PDP__AMX_KT)
typedef struct pdp__amx_alay {
    int64_t step, tile, stride;
} pdp__amx_alay;

/* ---- gemm_amx: kernels ----
   steps k steps from a (the block's A tiles: step s, tile i at a + s al->step + i
   al->tile words, row stride al->stride bytes) and b (a panel of w = 16 nb columns: step s, tile j at
   b + s 16 w + 16 j, row stride w words) into the accumulators, which start at zero
   (in == NULL) or from in (an fp32 block, row stride w: tile (i, j) at in + 16 i w +
   16 j), and are stored to out (row stride ldo floats: the same buffer, or C itself). */

PDP__AMX_TARGET PDP__PRIVATE void pdp__amx_kernel22(pdp__amx_tiles *e, int64_t steps,
                                                    const uint32_t *a, const pdp__amx_alay *al,
                                                    const uint32_t *b, const float *in,
                                                    float *out, int64_t ldo);

/* 1 x 2 tiles (16 x 32: tmm0-1 accumulate, tmm4 holds the A tile, tmm6-7 two of B), for
   m <= 16, where 2 x 2 spends half its tile operations on zero rows (the 10-class layer's
   dW, 10 x 512 x 512). The same sequence per element as kernel22. */
PDP__AMX_TARGET PDP__PRIVATE void pdp__amx_kernel12(pdp__amx_tiles *e, int64_t steps,
                                                    const uint32_t *a, const pdp__amx_alay *al,
                                                    const uint32_t *b, const float *in,
                                                    float *out, int64_t ldo);

PDP__AMX_TARGET PDP__PRIVATE void pdp__amx_kernel41(pdp__amx_tiles *e, int64_t steps,
                                                    const uint32_t *a, const pdp__amx_alay *al,
                                                    const uint32_t *b, const float *in,
                                                    float *out, int64_t ldo);

#  if PDP__BF16_AMX
/* LDTILECFG of the whole 64-byte operand. Not gcc 12's _tile_loadconfig: its asm names an
   8-byte operand (a pointer's size), so gcc -O2 without -mamx-tile dropped the stores of
   rows and colsb as dead and loaded a configuration of empty tiles; the first
   TILEZERO then faulted (SIGILL; -march=native builds happened to keep the stores). */
PDP__AMX_TARGET PDP__PRIVATE void pdp__amx_loadconfig(const pdp__amx_tilecfg *cfg);
#  endif

PDP__AMX_TARGET PDP__PRIVATE void pdp__amx_config(pdp__amx_tiles *e);

PDP__AMX_TARGET PDP__PRIVATE void pdp__amx_release(pdp__amx_tiles *e);

/* ---- gemm_amx: packing A into tiles and the epilogue ---- */

/* Rows [r0, r0 + rows) of op(A) as `height` rows (the rest zero) in tile order: word q
   of row i in step s at dst[(s height + i) 16 + q] = pair 16 s + q (zero past k). */
PDP__PRIVATE void pdp__amx_pack_a(const pdp__bf16_args *g, int64_t r0, int rows, int height,
                                  int64_t steps, uint32_t *dst);

/* Columns [n0, n1) of op(B) as panels of w columns (panel j at dst + j w 16 steps:
   [pair][column], the pairs padded with zeros to whole steps, columns past n1 zero):
   gemm_bf16.c's packing (the path's), one panel at a time. */
PDP__PRIVATE void pdp__amx_pack_b(const pdp__bf16_args *g, int64_t n0, int64_t n1, int w,
                                  int64_t steps, uint32_t *dst);

/* C[0, mr) x [0, nr) = alpha acc + beta C (acc's row stride w), then + bias[j] (bias not
   NULL) and the ReLU (relu != 0): pdp__bf16_bias_relu. */
PDP__PRIVATE void pdp__amx_out(const float *acc, int w, float *c, int64_t ldc, int mr, int nr,
                               float alpha, float beta, const float *bias, int relu);

#  if PDP__BF16_X86
/* 16 values of x(., 2p) (lo) and x(., 2p + 1) (hi) as 16 pair words (lo_i | hi_i << 16):
   vcvtne2ps2bf16 (pdp__bf16_cvt2) and one vpermw. */

/* v, 16 x 16 words, transposed in place: four rounds of interleaving the 32-bit lanes of
   v[r] and v[r + 8] (each round rotates the 8 index bits, row then column, by one). */

/* pdp__amx_pack_a with vcvtne2ps2bf16 (pdp__bf16_cvt2: gemm_bf16.c's words): a row along
   k is 32 values per step, converted in one instruction and stored as a tile row; rows
   across k (t == PDP_TRANS) come 16 rows x 16 pairs at a time as gemm_bf16.c's
   [pair][row] words, transposed in registers (four rounds of interleaving the 32-bit
   lanes of registers r and r + 8: each rotates the 8 index bits by one). A gathered A
   (bf16 words through arow, not transposed) is copied 32 words at a time. */
PDP__BF16_TARGET PDP__PRIVATE void pdp__amx_pack_a_avx512(const pdp__bf16_args *g, int64_t r0,
                                                          int rows, int height, int64_t steps,
                                                          uint32_t *dst);

/* pdp__amx_pack_a for op(A) stored along k (ta == PDP_NO_TRANS), as rows: word q of row i
   in step s at dst[i PDP__AMX_AROW(steps) + 16 s + q] (16 steps + 16 words a row: the
   spare 64-byte line keeps rows a multiple of 4 KiB long out of a single L1 set); the
   kernels load the tiles from these rows (pdp__amx_alay). The words of
   pdp__amx_pack_a_avx512, written in the order they are read: one stream per row, where
   tile order scatters a row's steps 64 height bytes apart. 512 x 512 x 10 NT (one thread,
   a loaded 2-core Sapphire Rapids): 134 -> 160 GFLOP/s. */
PDP__BF16_TARGET PDP__PRIVATE void pdp__amx_pack_a_rows_avx512(const pdp__bf16_args *g,
                                                               int64_t r0, int rows, int height,
                                                               int64_t steps, uint32_t *dst);

/* pdp__amx_pack_b with AVX-512 for B as floats: op(B) k x n stored row-major (tb ==
   PDP_NO_TRANS) is read a pair of rows at a time along n, 16 columns converted and
   interleaved per instruction pair, so the rows stream; stored n x k (PDP_TRANS), 16
   columns x 32 values of k are converted as rows and transposed in registers. Gathered
   B: gemm_bf16.c's packing per panel. */
PDP__BF16_TARGET PDP__PRIVATE void pdp__amx_pack_b_avx512(const pdp__bf16_args *g, int64_t n0,
                                                          int64_t n1, int w, int64_t steps,
                                                          uint32_t *dst);

/* pdp__amx_out with AVX-512: the same roundings (no fused multiply-add: the products are
   the _round_ forms, which the compiler does not contract; their zero-masking forms with
   every lane kept, for gemm_bf16.c's PDP__BF16_UNPACKLO32 reason; the mask made by
   _cvtu32_mask16, since nvcc's front end warns (#68-D) when a constant 0xffff becomes the
   builtin's signed mask argument). The ReLU keeps the lanes where !(r <= 0) (_CMP_NLE_UQ:
   NaN kept, -0 to +0), pdp__relu's rule. */
#    define PDP__AMX_RNE (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
PDP__BF16_TARGET PDP__PRIVATE void pdp__amx_out_avx512(const float *acc, int w, float *c,
                                                       int64_t ldc, int mr, int nr, float alpha,
                                                       float beta, const float *bias, int relu);
#    undef PDP__AMX_RNE
#  endif

/* ---- gemm_amx: streaming kernels ----
   Where one side of C is at most 16 (n <= 16: 4 x 1 blocks, one panel; m <= 16: 1 x 2
   blocks, one row block), each value of the other operand meets one tile product only, so
   packing it first buys no reuse: it would be converted, written out, then read back by
   the tile loads (512 x 512 x 10 NT, one thread: packing A was 63% of the call). These
   kernels convert it one k step at a time into two 4 KiB buffers that stay in L1, the
   next step's conversion issued after this step's tile products (whose tile loads read
   the other buffer, stored a step earlier), so the vector conversion runs beside the
   tile unit. The words and the sequence of TDPBF16PS per element are those of
   pdp__amx_kernel41 and pdp__amx_kernel12 on packed operands. */
#  if PDP__BF16_X86
#    if PDP__BF16_AMX
#      define PDP__AMX_SIMD_TARGET                                                          \
          PDP__TARGET("avx512f,avx512bw,avx512dq,avx512bf16,amx-tile,amx-bf16")
#    else
#      define PDP__AMX_SIMD_TARGET PDP__BF16_TARGET
#    endif

/* One k step of rows [0, rows) of op(A) stored along k (x: row 0's first value of the
   step, rows ld floats apart; vals: the values of k left from the step's first, the step
   holds min(32, vals)) as tile rows, row i at d + 16 i: pdp__amx_pack_a_rows_avx512's
   words. */

/* One k step of columns [0, 32) of op(B) stored k x n (x: the step's first row, rows ld
   floats apart; cols of the 32 inside n, the rest zero; vals as above) as two tiles of
   [pair][column] words, the second at d + 256: pdp__amx_pack_b_avx512's words. */

/* pdp__amx_kernel41 over all k steps, A converted as it goes: rows [0, rows) of op(A)
   stored along k from a (lda floats apart), the B panel packed at b, the accumulators
   from zero stored to out (row stride ldo floats); buf: 2 x 1024 words of scratch. The
   buffers' rows past `rows` are left as they are: only their own accumulator rows, never
   stored, read them. */
PDP__AMX_SIMD_TARGET PDP__PRIVATE void pdp__amx_kernel41_stream(pdp__amx_tiles *e,
                                                                const float *a, int64_t lda,
                                                                int rows, int64_t k,
                                                                const uint32_t *b, uint32_t *buf,
                                                                float *out, int64_t ldo);

/* pdp__amx_kernel12 over all k steps, B converted as it goes: columns [0, cols) of op(B)
   stored k x n from b (ldb floats a row), the block's A packed at a (al), the
   accumulators from zero stored to out; buf: 2 x 512 words of scratch. */
PDP__AMX_SIMD_TARGET PDP__PRIVATE void pdp__amx_kernel12_stream(pdp__amx_tiles *e,
                                                                const uint32_t *a,
                                                                const pdp__amx_alay *al,
                                                                const float *b, int64_t ldb,
                                                                int cols, int64_t k,
                                                                uint32_t *buf, float *out,
                                                                int64_t ldo);
#    undef PDP__AMX_SIMD_TARGET
#  endif

/* ---- gemm_amx: driver ---- */

typedef void (*pdp__amx_pack_a_fn)(const pdp__bf16_args *g, int64_t r0, int rows, int height,
                                   int64_t steps, uint32_t *dst);
typedef void (*pdp__amx_pack_b_fn)(const pdp__bf16_args *g, int64_t n0, int64_t n1, int w,
                                   int64_t steps, uint32_t *dst);
typedef void (*pdp__amx_out_fn)(const float *acc, int w, float *c, int64_t ldc, int mr, int nr,
                                float alpha, float beta, const float *bias, int relu);

typedef struct pdp__amx_ctx {
    const pdp__bf16_args *g;
    int emulate;     /* run on pdp__amx_tiles in memory (PDP__AMX_EMULATE builds) */
    int mb, nb;      /* tiles per block of C: 2 x 2; 4 x 1 when n <= 16; 1 x 2 when m <= 16 */
    int split_n;     /* parts split the column panels (else the row blocks) */
    int a_rows;      /* pack_a writes rows (pdp__amx_pack_a_rows_avx512), not tile order */
    int stream;      /* 1: A converted in the kernel (n <= 16); 2: B (m <= 16); 0: neither */
    pdp__amx_pack_a_fn pack_a;
    pdp__amx_pack_b_fn pack_b;
    pdp__amx_out_fn out;
} pdp__amx_ctx;

/* Element (i, j) of C by the pseudo-code's chain (the emulated tiles' bits), unpacked:
   the fallback without scratch. */
PDP__PRIVATE void pdp__amx_element(const pdp__bf16_args *g, int64_t i, int64_t j);

#  if PDP__BF16_X86
/* pdp__amx_block with the streamed operand (x->stream; the streaming kernels say why):
   1, n <= 16 and op(A) stored along k: B's one panel packed, each block of 64 rows of A
   converted inside pdp__amx_kernel41_stream; 2, m <= 16 and op(B) stored k x n: the one
   block of A packed, each panel of B converted inside pdp__amx_kernel12_stream. No k
   cache blocks: the packed operand is one panel or one block of rows, in L1 or L2. A
   block's epilogue runs after the next block's kernel, as in pdp__amx_block. */
PDP__PRIVATE void pdp__amx_block_stream(const pdp__amx_ctx *x, pdp__amx_tiles *e, int64_t m0,
                                        int64_t m1, int64_t n0, int64_t n1);
#  endif

/* C[m0, m1) x [n0, n1) (m0, n0 on the block grid), tiles on e (NULL: the hardware's,
   configured by the caller). */
PDP__PRIVATE void pdp__amx_block(const pdp__amx_ctx *x, pdp__amx_tiles *e, int64_t m0, int64_t m1,
                                 int64_t n0, int64_t n1);

/* Part i of n: an equal share of the column panels or row blocks; the tiles are
   configured at its start and released at its end. */
PDP__PRIVATE void pdp__amx_part(void *arg, int i, int n);

/* The product of g (filled by pdp__bf16_run, its pack and pack_h the path's) on the
   tiles: the hardware's (emulate == 0) or the emulation's (1: the path's packing and
   epilogue; 2: the portable ones). */
PDP__PRIVATE void pdp__amx_run(const pdp__bf16_args *g, int emulate);

#  if PDP__AMX_EMU
/* pdp__bf16_run's AMX path on emulated tiles, on any CPU (a test entry: PDP__AMX_EMULATE):
   portable != 0 packs and writes C with the portable C code even where AVX-512 exists;
   _bias adds bias and the ReLU or GELU in the epilogue as pdp__gemm_bf16_bias does (m, n,
   k > 0). */
PDP__PRIVATE void pdp__amx_gemm_emulated_bias(int portable, pdp_trans ta, pdp_trans tb, int64_t m,
                                              int64_t n, int64_t k, float alpha, const float *a,
                                              const uint16_t *ah, int64_t lda, const int64_t *arow,
                                              const float *b, const uint16_t *bh, int64_t ldb,
                                              const int64_t *brow, float beta, const float *bias,
                                              int relu, float *gelu, float *c, int64_t ldc);

PDP__PRIVATE void pdp__amx_gemm_emulated(int portable, pdp_trans ta, pdp_trans tb, int64_t m,
                                         int64_t n, int64_t k, float alpha, const float *a,
                                         const uint16_t *ah, int64_t lda, const int64_t *arow,
                                         const float *b, const uint16_t *bh, int64_t ldb,
                                         const int64_t *brow, float beta, float *c, int64_t ldc);
#  endif

#  undef PDP__AMX_OP
#  undef PDP__AMX_ZERO
#  undef PDP__AMX_LOAD
#  undef PDP__AMX_STORE
#  undef PDP__AMX_DP
#endif

/* ---- src/rendezvous.c ---- */
/* rendezvous: who the ranks are and how they meet, the way torchrun does it.

   pdp_env_read reads the launcher's variables (torchrun's RANK, WORLD_SIZE,
   LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, else OpenMPI's
   OMPI_COMM_WORLD_*); every value is checked, and a bad one is PDP_ERR_INVALID
   naming the variable. It never talks to anyone.

   A backend whose library needs one blob made on rank 0 before it can start
   (NCCL's unique id) meets the other ranks through the TCP store (store.c):
     pdp__rendezvous_store   every rank opens the store at MASTER_ADDR: rank 0
                             serves it. The port is MASTER_PORT, or MASTER_PORT + 1
                             under torchrun (TORCHELASTIC_RUN_ID is set: torchrun's
                             own store holds MASTER_PORT), or PDP_STORE_PORT when
                             set. A world of one opens nothing (store NULL).
     pdp__rendezvous_share   rank 0 sets the blob at key, the others get it, and
                             all meet at the barrier "<key>_read", so every rank
                             holds the blob before rank 0's store may go away.
   The caller keeps the store open until its library's own, collective,
   initialisation has returned, then frees it: rank 0's server then outlives
   every rank's barrier reply. Every wait ends by the timeout (PDP_ERR_TIMEOUT
   naming the key); messages name the public caller, the library and the rank. */

/* #include "internal.h" (above) */
#include <limits.h>

/* ---- rendezvous: the environment ---- */

/* getenv, with an empty value counting as unset (`RANK= ./train`). */
PDP__PRIVATE const char *pdp__env_get(const char *name);

/* Parses the whole of value as a decimal integer in [lo, hi]; why says what the
   range means in the message. */
PDP__PRIVATE pdp_status pdp__env_int(const char *name, const char *value, long lo, long hi,
                                     const char *why, int *out);

/* PDP_API pdp_status pdp_env_read(pdp_env_info *out) */

/* ---- rendezvous: a blob from rank 0, through the TCP store ---- */

/* Opens env's store (*out NULL for a world of one); what names the library
   ("NCCL") and fn the public caller in messages. */
PDP__PRIVATE pdp_status pdp__rendezvous_store(pdp_store **out, const pdp_env_info *env,
                                              double timeout_s, const char *what, const char *fn);

/* Rank 0's blob[0..bytes) (made before the call) reaches every rank's blob through
   store (NULL: a world of one, nothing to do); then every rank meets at
   "<key>_read". */
PDP__PRIVATE pdp_status pdp__rendezvous_share(pdp_store *store, const pdp_env_info *env,
                                              const char *key, void *blob, size_t bytes,
                                              double timeout_s, const char *what, const char *fn);

/* ---- src/comm_queue.c ---- */
/* comm_queue: the collective queue that the local and MPI backends share (handle
   pool, FIFO, progress thread, wait/done); comm_local.c and comm_mpi.c supply only how
   one collective executes.

   What the local and MPI backends share: a fixed pool of handles, a FIFO of
   launched collectives and one progress thread per communicator that runs
   them in issue order through the backend's exec callback; the backend keeps
   only how one collective executes. A launch takes a handle from the free
   list (nothing is allocated per collective; an empty list fails with
   PDP_ERR_STATE naming the backend's PDP_*_MAX_INFLIGHT), queues it and
   returns. The progress thread stamps t_start when it dequeues a handle and
   t_done when exec returns. Wait blocks until done (exec enforces timeouts),
   leaves a failure's message as the thread's error and returns the handle to
   the free list; its head stays readable until the next launch (internal.h).
   Without a progress thread (threaded = false: a local group of one) a launch
   executes inline.

   Set by the backend before pdp__workq_init (the queue is zeroed memory):
     comm, exec  the communicator served and "run one collective";
     sticky      the first failure breaks the queue: queued and later
                 collectives fail at once with its status and message (MPI;
                 the local backend keeps that state in its group instead);
     idle        optional; called by the progress thread, mu held, when nothing
                 is queued: false sleeps until woken, true calls it again (MPI
                 keeps a timed-out request moving this way);
     trace_tid   a trace track (0: off): each collective is a complete event
                 (execution) and an async event (launch to done).
   An exec that polls (MPI) naps between polls with pdp__workq_nap, which a
   thread that begins to wait ends at once: a rank that computes keeps its core,
   a rank that waits is served at once.
   Locks: mu guards the queue, the free list, the handles' done/status/msg, the
   waiter count and the broken state; exec runs without it, and buffers pass to
   the progress thread and back across it. */

/* #include "internal.h" (above) */

#define PDP__MSG_CAP 512 /* bytes of a collective's failure message */

#define PDP__COMM_TIMEOUT_DEFAULT 300.0 /* seconds, when a desc's timeout_s is 0 */
#define PDP__COMM_TIMEOUT_MAX 1e9       /* seconds: beyond it a deadline overflows time_t math */

/* The one rule for a communicator desc's numeric fields (timeout_s is the only one):
   zero means the default; a negative, NaN or infinite value (or one above
   PDP__COMM_TIMEOUT_MAX) fails with PDP_ERR_INVALID naming the function and the
   field. Every communicator constructor calls it first (desc may be NULL). */
PDP__PRIVATE pdp_status pdp__comm_desc_timeout(const pdp_comm_desc *desc, double *out,
                                               const char *fn);

/* Bytes of count elements of es bytes. comm.c's bound (pdp__comm_check_bound: at most
   PTRDIFF_MAX bytes per buffer) keeps the product from wrapping in every backend. */
PDP__PRIVATE size_t pdp__comm_bytes(int64_t count, size_t es);

/* One collective's arguments, as one rank issued it. */
typedef struct pdp__coll_args {
    pdp__coll_kind kind;
    int64_t seq;
    int64_t count;        /* floats (bytes for BROADCAST_BYTES) */
    int op;               /* pdp_reduce_op or root */
    int dtype;            /* pdp_dtype of the reductions (F32 for the rest) */
    float *buf;           /* allreduce, broadcast (a 16-bit all-reduce: uint16_t elements) */
    const float *send;    /* reduce_scatter, allgather (the same) */
    float *recv;
    void *bytes_buf;      /* broadcast_bytes */
    int peer, tag;        /* send, recv */
    void *out;            /* split: where the backend leaves its result */
} pdp__coll_args;

typedef struct pdp__workq_item {
    pdp_work head;                 /* first member: a pdp_work * is a pdp__workq_item * */
    struct pdp__workq_item *next;  /* free list or queue */
    pdp__coll_args args;
    double t_queued;               /* launch, for the trace */
    bool p2p;                      /* a send or recv: never queued (see below) */
    struct pdp__workq_item *p2p_next; /* the backend's list of unmatched messages */
    bool done;
    pdp_status status;
    char msg[PDP__MSG_CAP];
} pdp__workq_item;

typedef struct pdp__workq pdp__workq;

/* Runs w to completion (progress thread, q->mu not held). On failure returns
   the status with the message, without a function-name prefix, in msg. */
typedef pdp_status (*pdp__workq_exec_fn)(pdp__workq *q, pdp__workq_item *w, char *msg, size_t cap);

struct pdp__workq {
    pdp_comm *comm;                /* its communicator: comm->impl points here */
    pdp__workq_exec_fn exec;
    bool (*idle)(pdp__workq *q);
    /* point-to-point (both set by a backend with send/recv): poll advances every
       pending message of the communicator (optional, q->mu not held); expire is
       called by a waiter past the deadline: it withdraws w if still unmatched and
       completes it with PDP_ERR_TIMEOUT, or starts to (MPI: a cancel, confirmed within
       a grace; the waiter calls it again every 100 us until w is done) (q->mu not held) */
    void (*p2p_poll)(pdp__workq *q);
    void (*p2p_expire)(pdp__workq *q, pdp__workq_item *w);
    bool sticky;
    int trace_tid;
    int trace_pid;                 /* the trace's process lane (MPI: the world rank) */
    const char *limit_macro;       /* "PDP_LOCAL_MAX_INFLIGHT": how to raise capacity */
    int capacity;
    pdp__mutex mu;
    pdp__cond wake;           /* queue not empty, or stopping */
    pdp__cond done;           /* a handle completed */
    pdp__thread thread;
    bool threaded;
    bool stopping;
    double stop_time;
    int waiters;                   /* threads blocked in pdp__workq_wait (their core is idle) */
    int p2p_live;                  /* messages taken and not yet finished */
    pdp__workq_item *free_list, *q_head, *q_tail;
    int64_t next_seq;
    bool broken;                   /* sticky: first failure wins; later collectives fail fast */
    pdp_status broken_status;
    char broken_msg[PDP__MSG_CAP];
};

PDP__PRIVATE void pdp__workq_trace(const pdp__workq *q, const pdp__workq_item *w, double t_start,
                                   double t_done, pdp_status st);

/* Executes w and completes it; q->mu held on entry and on return. */
PDP__PRIVATE void pdp__workq_run(pdp__workq *q, pdp__workq_item *w);

PDP__PRIVATE void *pdp__workq_progress(void *arg);

/* Threads pool[0, capacity) into the free list, creates the locks and, when
   threaded, starts the progress thread. On failure nothing is left to release;
   fn names the public caller. */
PDP__PRIVATE pdp_status pdp__workq_init(pdp__workq *q, pdp__workq_item *pool, int capacity,
                                        const char *limit_macro, bool threaded, const char *fn);

/* True once pdp__workq_shutdown began (*since: when); for an exec that polls. */
PDP__PRIVATE bool pdp__workq_stopping(pdp__workq *q, double *since);

/* For an exec that polls, between polls. With `eager` and a thread blocked in
   pdp__workq_wait (its core is idle), returns false at once: poll again. Otherwise
   sleeps up to `seconds` and returns true; a thread that begins to wait ends the
   sleep early (the check and the sleep are atomic under mu, so that wake-up is
   never lost). A rank that computes keeps its core; a rank that waits gets its
   collective's completion at once. */
PDP__PRIVATE bool pdp__workq_nap(pdp__workq *q, double seconds, bool eager);

/* Lets the progress thread run what is queued, joins it and destroys the locks. */
PDP__PRIVATE void pdp__workq_shutdown(pdp__workq *q);

/* Takes a handle, fills it and queues it (or runs it inline without a thread). */
PDP__PRIVATE pdp_status pdp__workq_submit(pdp_comm *c, const pdp__coll_args *args, pdp_work **out);

/* ---- comm_queue: point-to-point ----
   A send or receive is not queued behind the collectives (it would deadlock a
   ring, where every rank sends before it receives): the backend matches it
   itself (the local group's mailbox, MPI's own matching), taking its handle from
   the same pool with pdp__workq_take and completing it with pdp__workq_finish.
   Its wait is timed: timeout_s after the launch, p2p_expire withdraws an
   unmatched message and completes it with PDP_ERR_TIMEOUT. */

/* A handle for a message, t_start = launch; PDP_ERR_STATE when the pool is empty,
   the broken status when the queue is broken. */
PDP__PRIVATE pdp_status pdp__workq_take(pdp_comm *c, const pdp__coll_args *args,
                                        pdp__workq_item **out);

/* Returns a handle that was never handed out (its launch failed). */
PDP__PRIVATE void pdp__workq_untake(pdp__workq *q, pdp__workq_item *w);

/* Completes a message's handle (q->mu not held); msg without a function-name prefix. */
PDP__PRIVATE void pdp__workq_finish(pdp__workq *q, pdp__workq_item *w, pdp_status st,
                                    const char *msg);

/* "recv #4 (count 7) from rank 1 with tag 5 on comm 'comm', rank 0 of 2" */
PDP__PRIVATE void pdp__p2p_describe(const pdp__workq_item *w, char *out, size_t cap);

PDP__PRIVATE void pdp__workq_p2p_timeout_msg(const pdp__workq_item *w, char *msg, size_t cap);

/* Waits for a message (q->mu held on entry and return): polls, times out. */
PDP__PRIVATE void pdp__workq_p2p_block(pdp__workq *q, pdp__workq_item *w);

PDP__PRIVATE pdp_status pdp__workq_wait(pdp_work *work);

PDP__PRIVATE bool pdp__workq_done(pdp_work *work);

/* The pdp__comm_ops entries of a queue backend: pack the arguments, submit. */

PDP__PRIVATE pdp_status pdp__workq_coll(pdp_comm *c, pdp__coll_kind kind, int64_t count, int op,
                                        pdp_dtype dt, float *buf, const float *send, float *recv,
                                        pdp_work **w);

PDP__PRIVATE pdp_status pdp__workq_allreduce(pdp_comm *c, void *buf, int64_t count, pdp_dtype dt,
                                             pdp_reduce_op op, pdp_work **w);

PDP__PRIVATE pdp_status pdp__workq_broadcast(pdp_comm *c, float *buf, int64_t count, int root,
                                             pdp_work **w);

PDP__PRIVATE pdp_status pdp__workq_reduce_scatter(pdp_comm *c, const void *send, void *recv,
                                                  int64_t recv_count, pdp_dtype dt,
                                                  pdp_reduce_op op, pdp_work **w);

PDP__PRIVATE pdp_status pdp__workq_allgather(pdp_comm *c, const float *send, float *recv,
                                             int64_t send_count, pdp_work **w);

PDP__PRIVATE pdp_status pdp__workq_barrier(pdp_comm *c, pdp_work **w);

/* Synchronous, but queued like the others so that it keeps its place in the order. */
PDP__PRIVATE pdp_status pdp__workq_broadcast_bytes(pdp_comm *c, void *buf, size_t bytes, int root);

/* A batch (pdp_comm_sendrecv) on a queue backend: local and MPI messages start when posted
   and match by tag, so each is posted as pdp_comm_send/recv posts it; nothing to group. */
PDP__PRIVATE pdp_status pdp__workq_sendrecv(pdp_comm *c, const pdp_p2p *ops, int n, pdp_work **w);

/* ---- src/comm_local.c ---- */
/* comm_local: the local backend: N ranks are threads of one process, buffers in shared
   memory, no dependency; the default, and what the tests use.

   N ranks are threads of one process; a pdp_local_group is their shared
   meeting point. Each rank's communicator owns a collective queue (comm_queue.c,
   shared with the MPI backend) whose persistent progress thread runs the
   rank's collectives in issue order, so an asynchronous
   collective progresses while the rank's own thread computes (DDP overlaps a
   bucket's all-reduce with the rest of backward this way). One collective is:

     arrive    the progress thread publishes its arguments in the group's slot
               for its rank and enters barrier A. The last rank to arrive checks
               that all ranks issued the same collective (kind, count, op, root);
     work      rank r's progress thread handles slice r of the data: for an
               all-reduce it sums slice r of every rank's buffer in rank order
               0, 1, ..., N-1 (fixed, so every rank gets bit-identical sums)
               and writes the result into every rank's buffer; broadcast,
               reduce-scatter and all-gather split the same way;
     leave     barrier B: no rank's buffer is touched after it, so the handle
               completes and the rank may reuse its buffers and its slot.

   The work of one collective is therefore spread over the ranks (each moves
   about 2(N-1)/N of the buffer for an all-reduce, the ring figure), and a
   rank's buffers are only written by progress threads between A and B.

   Faults never hang: every wait in a barrier is a pdp__cond_timedwait on
   the monotonic clock against the group's timeout_s. A rank that does not arrive
   makes the others fail with PDP_ERR_TIMEOUT naming the collective, its
   sequence number and the missing rank; a rank whose communicator is freed
   marks itself as gone, and a rank waiting for it fails at once with
   PDP_ERR_COMM. Either way the group becomes broken: every later collective on
   any rank fails fast with the first failure's message (as an aborted NCCL
   communicator does).

   Locks: group->mu guards the barrier state, the slots and the broken flag;
   the queue's mu guards its queue, its handle pool and the handles' done
   flags. The progress thread never holds both. Buffer contents pass between
   threads only across these mutexes, so the backend is TSan clean. Handles
   come from a fixed pool per communicator: nothing is allocated per
   collective. */

/* #include "internal.h" (above) */

/* ---- comm_local: the group ---- */

#define PDP__LOCAL_MAX_RANKS 256  /* ranks are threads: more would only oversubscribe */
#ifndef PDP_LOCAL_MAX_INFLIGHT
#  define PDP_LOCAL_MAX_INFLIGHT 256 /* handles per local communicator */
#endif

struct pdp_local_group {
    int size;
    double timeout_s;
    pdp_device device;
    char name[PDP__COMM_NAME_CAP];
    pdp__mutex mu;
    pdp__cond cv;        /* barrier progress, departures, breakage */
    int arrived;              /* ranks in the current barrier */
    uint64_t gen;             /* barriers completed */
    int64_t *phase;           /* per rank: barriers entered */
    pdp__coll_args *slot;     /* per rank: the collective it is executing */
    bool *joined;             /* per rank: a communicator was created */
    bool *gone;               /* per rank: its communicator was freed */
    bool broken;
    pdp_status broken_status;
    char broken_msg[PDP__MSG_CAP];
    pdp__workq_item *p2p_head, *p2p_tail; /* unmatched sends and receives, in launch order */
    void *split_out;          /* pdp_comm_split: the group this rank made as a leader */
    int refs;                 /* made by a split: communicators yet to be freed; else 0 */
};

/* PDP_API pdp_status pdp_local_group_create(pdp_local_group **out, int world_size, const pdp_comm_desc *desc) */

/* PDP_API void pdp_local_group_free(pdp_local_group *g) */

/* Marks the group broken with a message (first failure wins); g->mu held. */
PDP__PRIVATE void pdp__group_break(pdp_local_group *g, pdp_status st, const char *msg);

/* "allreduce #7 (count 1024) on comm 'comm', rank 0 of 2" */
PDP__PRIVATE void pdp__coll_describe(const pdp_local_group *g, int rank, const pdp__coll_args *a,
                                     char *out, size_t cap);

/* The last rank into barrier A checks that everyone issued the same collective;
   g->mu held. Returns false (and breaks the group) on a mismatch. */
PDP__PRIVATE bool pdp__group_validate(pdp_local_group *g);

/* Barrier A (publish = true: also publishes *args in this rank's slot) or B.
   On failure returns the status and leaves the message in msg. */
PDP__PRIVATE pdp_status pdp__group_barrier(pdp_local_group *g, int rank, const pdp__coll_args *args,
                                           bool publish, char *msg, size_t cap);

/* ---- comm_local: the data movement ---- */

/* [lo, hi) of n items for part r of parts, with boundaries on 16 floats (one cache line)
   so that two ranks never write the same line. */
PDP__PRIVATE void pdp__slice(int64_t n, int r, int parts, int64_t *lo, int64_t *hi);

#define PDP__CHUNK 2048

/* acc[0..n) <- op over ranks of src[i][off..off+n), in rank order: ((s0 + s1) + s2) + ...,
   then / nsrc for AVG. acc is the caller's chunk, never one of the sources, so every
   loop is a restrict-qualified blocked loop that gcc -O2 vectorises (one pass per
   source; the chunk stays in L1). */
PDP__PRIVATE void pdp__reduce_chunk(float *PDP__RESTRICT acc, const float *const *src, int nsrc,
                                    int64_t off, int64_t n, pdp_reduce_op op);

/* The same for 16-bit elements (dt BF16 or F16): each widened to fp32, reduced in fp32
   in rank order, AVG divided, then rounded ONCE into out (to nearest even). */
PDP__PRIVATE void pdp__reduce_chunk16(uint16_t *out, float *PDP__RESTRICT acc,
                                      const uint16_t *const *src, int nsrc, int64_t off, int64_t n,
                                      pdp_reduce_op op, int dt);

/* Rank r's share of a 16-bit all-reduce or reduce-scatter (the float loops below). */
PDP__PRIVATE void pdp__local_execute16(pdp_local_group *g, int r);

/* Rank r's share of the collective whose arguments every rank published. */
PDP__PRIVATE void pdp__local_execute(pdp_local_group *g, int r);

typedef struct pdp__local_comm {
    pdp_comm head;                 /* first member */
    pdp__workq q;                  /* head.impl points here */
    pdp_local_group *g;
    pdp__workq_item pool[PDP_LOCAL_MAX_INFLIGHT];
} pdp__local_comm;

/* ---- comm_local: point-to-point ----
   The group's mailbox is one list of unmatched messages in launch order. A new
   send looks for the first receive its peer posted from this rank with the same
   tag (a new receive, for the first such send); found, the thread that launched
   the second half copies the floats and completes both handles; otherwise the
   message joins the list. Everything happens under g->mu (then the owners'
   queue locks: g->mu before q->mu, never the reverse), so no progress thread
   is involved and a ring where every rank sends first cannot deadlock. */

PDP__PRIVATE int pdp__p2p_owner(const pdp__workq_item *w);

/* Unlinks w from the mailbox; false when it is not there (matched or withdrawn). */
PDP__PRIVATE bool pdp__mailbox_remove(pdp_local_group *g, pdp__workq_item *w);

/* Completes a matched pair (g->mu held): copy, or a count mismatch on both sides. */
PDP__PRIVATE void pdp__p2p_match(pdp__workq_item *send, pdp__workq_item *recv);

PDP__PRIVATE pdp_status pdp__local_p2p(pdp_comm *c, pdp__coll_kind kind, float *buf, int64_t count,
                                       int peer, int tag, pdp_work **out);

PDP__PRIVATE pdp_status pdp__local_send(pdp_comm *c, const float *buf, int64_t count, int peer,
                                        int tag, pdp_work **w);

PDP__PRIVATE pdp_status pdp__local_recv(pdp_comm *c, float *buf, int64_t count, int peer, int tag,
                                        pdp_work **w);

PDP__PRIVATE void pdp__local_p2p_expire(pdp__workq *q, pdp__workq_item *w);

/* Rank r's communicator is going (g->mu held): its unmatched messages are withdrawn, and
   those of other ranks that name it fail with PDP_ERR_COMM. */
PDP__PRIVATE void pdp__mailbox_depart(pdp_local_group *g, int r);

/* ---- comm_local: communicators ---- */

/* The queue's exec: one collective for this rank, barrier A, its share of the
   work, barrier B. */
PDP__PRIVATE pdp_status pdp__local_exec(pdp__workq *q, pdp__workq_item *w, char *msg, size_t cap);

PDP__PRIVATE void pdp__local_destroy(pdp_comm *c);

/* ---- comm_local: split ----
   The member that becomes rank 0 of a colour creates its group (refs = its size: the
   group frees itself with the last of them) and every rank broadcasts the pointer of
   the group it made, or NULL, over c; each member then joins its leader's group. */
PDP__PRIVATE pdp_status pdp__local_split(pdp_comm *c, int colour, int key, int new_rank,
                                         int new_size, int leader, const char *name,
                                         pdp_comm **out);

/* PDP_API pdp_status pdp_comm_create_local(pdp_comm **out, pdp_local_group *g, int rank) */

/* ---- src/comm_mpi.c ---- */
/* comm_mpi: the MPI communicator backend (-DPDP_MPI), and its entry in comm.c's
   dispatcher, pdp__comm_init_mpi_env: pdp_comm_init_env with PDP_BACKEND_MPI
   creates the communicator below; without PDP_MPI it fails with
   PDP_ERR_UNSUPPORTED naming the macro.

   ---- the MPI backend ----
   Rank and size come from MPI_COMM_WORLD, which every process duplicates once
   (collective: every rank calls pdp_comm_init_env, in the same order as its
   other collectives on MPI_COMM_WORLD), so pdp's traffic never matches the
   application's own messages. The duplication is MPI_Comm_idup, polled
   against timeout_s: a rank that never creates its communicator makes the
   others fail with PDP_ERR_TIMEOUT instead of hanging; the orphaned request
   is kept, and completed (or given up) before MPI_Finalize. The duplicate
   reports errors (MPI_ERRORS_RETURN) instead of aborting the job: library
   code never calls MPI_Abort, and an MPI error becomes PDP_ERR_COMM with
   MPI's error string.

   One progress thread per communicator runs the collectives in issue order,
   as PyTorch's ProcessGroupMPI does (comm_queue.c's collective queue, shared with
   the local backend; this file supplies its exec, idle and destroy): a launch
   only queues a handle from a fixed pool (PDP_MPI_MAX_INFLIGHT, nothing is
   allocated per collective) and returns, so the calling rank keeps computing
   backward while the all-reduce runs. The thread posts the non-blocking call (MPI_Iallreduce,
   MPI_Ibcast, MPI_Ireduce_scatter_block, MPI_Iallgather, MPI_Ibarrier) and drives it with MPI_Test:
   spinning for a few hundred polls (small collectives finish there), then, while the rank's own
   thread is blocked in pdp_wait and its core is idle, yielding between polls for up to 2 ms;
   otherwise (the rank computes, or a peer is late) sleeping 200 us between polls (500 us once a
   collective has waited 20 ms), so that backward keeps its core and the poll latency hides under
   it. AVG is SUM followed by a division by the size on every element, as the local backend does.
   16-bit elements (pdp_comm_allreduce_ex and reduce_scatter_ex with BF16 or F16) travel as
   MPI_UINT16_T and are summed by one of two user-defined MPI_Ops created with the communicator
   (comm.h states their rounding). MPI counts are int: an all-reduce or broadcast is split into
   calls of PDP_MPI_CHUNK elements; reduce-scatter, all-gather and the messages take at most INT_MAX
   elements per rank (comm.c refuses more, naming the call and the count). In-place forms:
   all-gather with send == recv + rank * count, and reduce-scatter with recv == send + rank * count
   (NCCL's convention).

   Timeouts: MPI cannot time out, so the progress thread is the watchdog. A
   collective that has not completed timeout_s after the thread posted it fails
   with PDP_ERR_TIMEOUT naming the collective, its sequence number and the
   communicator (MPI cannot say which rank is missing). The communicator is
   then broken (the queue is sticky): queued and later collectives fail at
   once with the same status and message, as an aborted NCCL communicator
   does. The timed-out request
   cannot be cancelled (MPI forbids cancelling collectives); the thread keeps
   testing it, so a late rank still completes it and the communicator can be
   freed cleanly. pdp_comm_free gives an in-flight request one more second,
   then abandons it: the duplicate communicator and the request are leaked,
   and pdp will not call MPI_Finalize, because that may hang on them.

   MPI initialisation: if MPI is not initialised, the first pdp_comm_init_env
   calls MPI_Init_thread(MPI_THREAD_MULTIPLE), and pdp_comm_free of the last
   MPI communicator calls MPI_Finalize (MPI cannot be initialised twice, so a
   program that creates MPI communicators one after another, or uses MPI
   itself, calls MPI_Init_thread first and MPI_Finalize last; pdp then never
   finalises). MPI_THREAD_MULTIPLE is required: the progress thread calls MPI
   while the application's threads may. That ownership record (a count of
   live communicators and whether pdp initialised MPI) is process-wide,
   behind a mutex, because MPI's own initialisation is.

   Locks: the queue's mu guards the queue, the pool, the handles' done/status,
   the broken state and the orphan; the progress thread never holds it inside
   an MPI call.
   Buffers pass to the progress thread and back across that mutex (TSan finds
   nothing in this file; OpenMPI's own internals draw reports of their own).
   Reference: MPI 3.1, chapter 5.12 (non-blocking collectives). */

/* #include "internal.h" (above) */

#ifdef PDP_MPI
#include <mpi.h>

#ifndef PDP_MPI_MAX_INFLIGHT
#  define PDP_MPI_MAX_INFLIGHT 256 /* handles per MPI communicator */
#endif
#ifndef PDP_MPI_CHUNK
#  define PDP_MPI_CHUNK (1 << 30)  /* elements per MPI call of an all-reduce or broadcast */
#endif
#define PDP__MPI_FREE_GRACE_S 1.0  /* pdp_comm_free waits this long for an in-flight request */

/* ---- comm_mpi: process-wide MPI ownership ---- */

          /* MPI communicators alive */
      /* pdp called MPI_Init_thread, so it finalises */
      /* a request was abandoned: never call MPI_Finalize */
  /* a timed-out MPI_Comm_idup, completed before finalising */

/* ---- comm_mpi: state ---- */

/* A message in flight: its MPI request (and, for a receive, whether MPI has matched it). */
typedef struct pdp__mpi_p2p {
    bool active;        /* launched, not completed */
    bool posted;        /* a send: always; a receive: matched by MPI_Improbe, MPI_Imrecv posted */
    double cancel_by;   /* 0; once cancelled, when the cancel grace ends */
    MPI_Request req;
} pdp__mpi_p2p;

typedef struct pdp__mpi_comm {
    pdp_comm head;               /* first member */
    pdp__workq q;                /* head.impl points here; sticky, with an idle poll */
    MPI_Comm mcomm;              /* our duplicate of MPI_COMM_WORLD */
    MPI_Op op16[2];              /* the 16-bit sums (BF16, F16) over MPI_UINT16_T; MPI_OP_NULL
                                    until created */
    bool orphan;                 /* a timed-out request is still pending (q.mu) */
    MPI_Request orphan_req;
    bool traced;                 /* pdp__trace_open succeeded: close at free */
    pdp__mutex p2p_mu;      /* guards p2p[] and every MPI call on its requests */
    int p2p_active;              /* messages in flight */
    int n_abandoned;             /* timed-out requests MPI did not cancel (p2p_mu) */
    MPI_Request abandoned[PDP_MPI_MAX_INFLIGHT];
    pdp__workq_item pool[PDP_MPI_MAX_INFLIGHT];
    pdp__mpi_p2p p2p[PDP_MPI_MAX_INFLIGHT]; /* by pool index */
} pdp__mpi_comm;

/* ---- comm_mpi: executing a collective (the queue's exec and idle) ---- */

PDP__PRIVATE void pdp__mpi_errstr(int rc, char *out, size_t cap);

/* ---- comm_mpi: point-to-point ----
   A send is MPI_Issend, a synchronous send: it completes only once the receiver has
   matched it, so a send nobody receives (or received with another tag) fails with
   PDP_ERR_TIMEOUT, as on the local and NCCL backends (MPI_Isend would complete at once
   for a message under MPI's eager limit, the receiver never known; the handshake costs
   nothing measurable: on 2 ranks sharing 2 AMD EPYC (Zen 4) cores, OpenMPI 4.1.4, a pdp
   round trip of 1, 1024 or 65536 floats took 181, 176 and 217 us with it, 282, 182 and
   221 us with MPI_Isend, medians of 3 alternating runs, the polls' naps dominating). A receive is
   matched with MPI_Improbe first, so that a count mismatch names both counts (the
   message is then consumed with a zero-count MPI_Mrecv), then MPI_Imrecv. Every
   pending message of the communicator is advanced by whoever polls: a thread in
   pdp_work_wait or pdp_work_done on a message, and the progress thread while it
   drives a collective or idles, so a ring where every rank sends first completes.
   A message not complete timeout_s after its launch fails with PDP_ERR_TIMEOUT naming
   peer and tag: an unmatched receive is simply withdrawn; a send or a matched receive
   is cancelled (MPI_Cancel) at the first poll past its deadline and completes at a
   later poll, when MPI confirms the cancel, or when the cancel grace
   (PDP__MPI_FREE_GRACE_S) has passed: then it is abandoned. No one holds p2p_mu
   through a grace, so the graces of messages that expire together overlap (a pipeline
   whose peer died gets every error at about timeout_s + the grace, not one grace after
   another). OpenMPI never cancels a send: its timed-out sends are always abandoned. An
   abandoned request is kept (abandoned[]) and tested at each poll and at
   pdp_comm_free: if the peer receives it later it completes, and the communicator is
   freed cleanly; if it is still pending at the free, pdp never calls MPI_Finalize, as
   for a timed-out collective. */

PDP__PRIVATE void pdp__mpi_p2p_fail(pdp__mpi_comm *mc, pdp__workq_item *w, pdp_status st,
                                    const char *msg);

/* Keeps a request MPI would not cancel, to test later (p2p_mu held). */
PDP__PRIVATE void pdp__mpi_abandon(pdp__mpi_comm *mc, MPI_Request *req);

/* Advances one message at time now (p2p_mu held): matches, completes, or expires it. */
PDP__PRIVATE void pdp__mpi_p2p_step(pdp__mpi_comm *mc, pdp__workq_item *w, double now);

/* The queue's p2p_poll: every pending message, and the abandoned requests. */
PDP__PRIVATE void pdp__mpi_p2p_poll(pdp__workq *q);

/* The queue's p2p_expire: a poll past w's deadline cancels it (and every other overdue
   message); w completes at this or a later poll, within the cancel grace. */
PDP__PRIVATE void pdp__mpi_p2p_expire(pdp__workq *q, pdp__workq_item *w);

PDP__PRIVATE pdp_status pdp__mpi_p2p_launch(pdp_comm *c, pdp__coll_kind kind, float *buf,
                                            int64_t count, int peer, int tag, pdp_work **out);

PDP__PRIVATE pdp_status pdp__mpi_send(pdp_comm *c, const float *buf, int64_t count, int peer,
                                      int tag, pdp_work **w);

PDP__PRIVATE pdp_status pdp__mpi_recv(pdp_comm *c, float *buf, int64_t count, int peer, int tag,
                                      pdp_work **w);

/* Drives *req to completion: PDP_OK; PDP_ERR_TIMEOUT after deadline, or
   PDP_ERR_COMM when the communicator is being freed, with *req left pending
   (the caller records it as the orphan). */
PDP__PRIVATE pdp_status pdp__mpi_drive(pdp__mpi_comm *mc, const pdp__workq_item *w,
                                       MPI_Request *req, double deadline, char *msg, size_t cap);

/* Posts one MPI call; PDP_ERR_COMM with MPI's message when it fails. */
PDP__PRIVATE pdp_status pdp__mpi_posted(pdp__mpi_comm *mc, const pdp__workq_item *w, int rc,
                                        const char *call, char *msg, size_t cap);

PDP__PRIVATE void pdp__mpi_divide(void *buf, int64_t n, int size, int dt);

/* The 16-bit sums, MPI user functions over MPI_UINT16_T: both values widened, added in
   fp32 and rounded once to nearest even (commutative, so MPI may combine in any order). */
PDP__PRIVATE void pdp__mpi_sum16(const uint16_t *in, uint16_t *inout, int len, int dt);
PDP__PRIVATE void pdp__mpi_sum_bf16(void *in, void *inout, int *len, MPI_Datatype *type);
PDP__PRIVATE void pdp__mpi_sum_f16(void *in, void *inout, int *len, MPI_Datatype *type);

/* Runs one collective to completion on the progress thread. */
PDP__PRIVATE pdp_status pdp__mpi_run(pdp__mpi_comm *mc, const pdp__workq_item *w, MPI_Request *req,
                                     char *msg, size_t cap);

/* The queue's exec; a request posted but never completed becomes the orphan. */
PDP__PRIVATE pdp_status pdp__mpi_exec(pdp__workq *q, pdp__workq_item *w, char *msg, size_t cap);

/* Sleeps 1 ms, then tests the orphan once: true when it completed. */
PDP__PRIVATE bool pdp__mpi_orphan_test(MPI_Request *req);

/* The queue's idle hook (q->mu held): keep a timed-out request moving, so
   that a late rank completes it and the communicator can be freed cleanly. */
PDP__PRIVATE bool pdp__mpi_idle(pdp__workq *q);

/* ---- comm_mpi: the ops table ---- */

/* Tests *req until it completes (true) or deadline passes (false). */
PDP__PRIVATE bool pdp__mpi_poll_until(MPI_Request *req, double deadline);

/* Drops one reference to MPI; the last one finalises it if pdp initialised it
   (after completing a timed-out duplication, if its late rank came after all). */
PDP__PRIVATE void pdp__mpi_release(void);

PDP__PRIVATE void pdp__mpi_destroy(pdp_comm *c);

PDP__PRIVATE pdp_status pdp__mpi_split(pdp_comm *c, int colour, int key, int new_rank, int new_size,
                                       int leader, const char *name, pdp_comm **out);

/* ---- comm_mpi: bounded start-up ----
   MPI_Init_thread cannot be interrupted and has no timeout: a rank that never
   starts leaves the others inside it until the launcher gives up. pdp bounds
   what it can around it (comm.h states the contract):
     the start-up check  with a store port in the environment (PDP_STORE_PORT or
                         MASTER_PORT) and the ranks named by the launcher
                         (OMPI_COMM_WORLD_* or RANK/WORLD_SIZE), every rank checks
                         in at the TCP store (rendezvous.c; rank 0 serves it) BEFORE
                         calling MPI_Init_thread, and waits up to timeout_s for all
                         the others: a missing rank makes the others fail with
                         PDP_ERR_TIMEOUT naming it, and MPI_Init_thread is never
                         called, so nothing hangs. The store stays open until
                         MPI_Init_thread returned (rank 0 serves the latecomers);
     the watchdog        a thread started before MPI_Init_thread: when it has not
                         returned timeout_s later, the watchdog calls desc->log
                         (PDP_LOG_ERROR, from the watchdog thread) once, naming this
                         rank, what it waits for and, when the start-up check passed,
                         that every rank had checked in. It never exits or aborts:
                         the rank stays in MPI_Init_thread until MPI returns or the
                         launcher ends the job. */

typedef struct pdp__mpi_watch {
    pdp__mutex mu;
    pdp__cond cv;
    bool done;              /* MPI_Init_thread returned */
    double timeout_s;
    pdp_log_fn log;
    void *log_user;
    char msg[512];
} pdp__mpi_watch;

PDP__PRIVATE void *pdp__mpi_watchdog(void *arg);

/* The start-up check (above); *store is left open for the caller to free after
   MPI_Init_thread, NULL when no check ran. *checked: every rank checked in. */
PDP__PRIVATE pdp_status pdp__mpi_start_check(pdp_store **store, const pdp_env_info *env,
                                             double timeout_s, bool *checked, const char *fn);

/* MPI_Init_thread after the start-up check, under the watchdog; mpi_mu held. */
PDP__PRIVATE int pdp__mpi_init_bounded(const pdp_comm_desc *desc, double timeout_s, int *provided,
                                       pdp_status *st, const char *fn);

/* ---- comm_mpi: creation ---- */

/* Initialises MPI when nobody has (bounded as above) and takes one reference to it. */
PDP__PRIVATE pdp_status pdp__mpi_acquire(const pdp_comm_desc *desc, double timeout_s,
                                         const char *fn);

PDP__PRIVATE pdp_status pdp__mpi_wrap(pdp_comm **out, MPI_Comm mcomm, const char *name,
                                      double timeout_s, const char *fn);

PDP__PRIVATE pdp_status pdp__mpi_create(pdp_comm **out, const pdp_comm_desc *desc, const char *fn);

/* Wraps mcomm (errors returned, one reference to MPI taken by the caller; both given
   up on failure) as a communicator with its own queue, progress thread and p2p state. */
PDP__PRIVATE pdp_status pdp__mpi_wrap(pdp_comm **out, MPI_Comm mcomm, const char *name,
                                      double timeout_s, const char *fn);

/* pdp_comm_split: MPI_Comm_split runs on the progress thread, in order with the
   collectives (MPI forbids two threads in collectives on one communicator); comm.c's
   colour exchange has already proved every rank arrived, so it does not block long. */
PDP__PRIVATE pdp_status pdp__mpi_split(pdp_comm *c, int colour, int key, int new_rank, int new_size,
                                       int leader, const char *name, pdp_comm **out);
#endif /* PDP_MPI */

/* ---- comm_mpi: pdp_comm_init_env ---- */

PDP__PRIVATE pdp_status pdp__comm_init_mpi_env(pdp_comm **out, const pdp_comm_desc *desc);

/* ---- src/comm_nccl.c ---- */
/* comm_nccl: the NCCL communicator backend, host side (-DPDP_CUDA; the NCCL calls
   themselves are in pdp_cuda.cu, behind cuda.h's pdp_cudak_nccl_* functions), and
   its entry in comm.c's dispatcher, pdp__comm_init_nccl_env.

   The NCCL communicator is a pdp__comm_ops backend like local and mpi: its
   handles come from a fixed pool (one per completion-event slot), so a step
   allocates nothing; a collective is launched on the NCCL stream after an
   event recorded on the compute stream, and pdp_work_wait polls it against the
   communicator's timeout (pdp_cuda.cu aborts the NCCL communicator on failure).
   Thread ranks come from one pdp_nccl_group (ncclCommInitAll); process ranks
   (pdp_comm_init_env) rendezvous through the TCP store (rendezvous.c, store.c):
   rank 0 makes the unique id and sets "pdp/nccl_id", the others get it. Without PDP_CUDA,
   every entry point fails with PDP_ERR_UNSUPPORTED naming the macro.

   Point-to-point (section below) and split follow comm.h, with what NCCL imposes:
   - NCCL has no tags. A pair's messages match in the order they were issued; each
     carries a header (tag, count) and the receiver's wait fails with PDP_ERR_INVALID
     naming both when the tags or counts differ;
   - sends and receives are enqueued in batches (one ncclGroupStart/End) when one of
     them is waited or queried with pdp_work_done, or before a collective or split on
     the communicator: call pdp_work_done on a handle to start a batch early (overlap),
     or post it with pdp_comm_sendrecv, which enqueues it at once (pdp__nccl_sendrecv);
   - messages and collectives share the NCCL stream: every rank must issue them in
     an order that cannot deadlock (a send before a collective on one rank needs its
     receive before that collective on the other), as with NCCL itself;
   - a message not matched within timeout_s fails with PDP_ERR_TIMEOUT naming the
     peer and the tag, but NCCL cannot withdraw it: the communicator is aborted and
     every later call on it fails (PDP_ERR_COMM), as after a collective's timeout.
     A count mismatch usually hangs NCCL: the receiver then fails with
     PDP_ERR_INVALID naming both counts (from the header), the sender times out;
   - pdp_comm_split is ncclCommSplit (NCCL 2.18 or later), for thread ranks and
     process ranks alike. */

/* #include "internal.h" (above) */

/* the same text as cuda_host.c's (an identical redefinition is valid C) */
#define PDP__NO_CUDA_MSG "built without PDP_CUDA (compile with -DPDP_CUDA and link pdp_cuda.o)"

#ifndef PDP_CUDA
PDP__PRIVATE pdp_status pdp__comm_init_nccl_env(pdp_comm **out, const pdp_comm_desc *desc);
#endif

/* ---- comm_nccl: the communicator ---- */

struct pdp_nccl_group {
    int n;
    double timeout_s;
    char name[PDP__COMM_NAME_CAP];
    pdp_device *devices;
#ifdef PDP_CUDA
    pdp_cudak_nccl **handles; /* taken by pdp_comm_create_nccl (NULL once taken) */
#endif
};

#ifdef PDP_CUDA

typedef struct pdp__nccl_work {
    pdp_work head;
    int slot;
    bool busy;
    bool pending;           /* a message taken but not yet enqueued (see flush) */
    bool is_p2p, is_send;
    int peer, tag;
    int64_t count;
    float *buf;
    pdp_status err;         /* the flush that should have enqueued it failed: msg says why */
    char msg[256];
} pdp__nccl_work;

typedef struct pdp__nccl_comm {
    pdp_comm head;
    pdp_cudak_nccl *h;
    float *barrier_buf;     /* one float on the device */
    int next;               /* the pool entry of the next collective */
    int npending;           /* messages in pool[next - npending .. next - 1], not enqueued */
    int64_t seq;
    bool traced;
    bool traced_process;    /* a process rank: its trace file is per rank */
    int trace_tid;          /* 0: not traced */
    pdp__nccl_work pool[PDP_CUDAK_NCCL_SLOTS];
} pdp__nccl_comm;

/* ---- comm_nccl: point-to-point ----
   NCCL has no tags and matches a pair's messages in the order they were issued; a
   send waits (on the GPU) for its receive, so a ring where every rank sends first
   deadlocks unless each rank's send and receive are in one ncclGroupStart/End.
   So pdp_comm_send/recv only take a handle (pending); the pending messages are
   enqueued together, as one group, by the first of: a wait or done query on any of
   them, a collective or a split on this communicator. Each message carries a
   header (tag, count) that the receiver checks at its wait: a different tag or
   count is PDP_ERR_INVALID naming both (a count mismatch usually hangs NCCL
   first: then the receiver still names both counts once its wait times out). */

PDP__PRIVATE void pdp__nccl_describe(const pdp__nccl_work *wk, char *out, size_t cap);

/* Enqueues the pending messages as one group. On failure each of them keeps the
   error for its wait, and the error is also returned (with its message). */
PDP__PRIVATE pdp_status pdp__nccl_flush(pdp_comm *c);

PDP__PRIVATE pdp_status pdp__nccl_p2p(pdp_comm *c, bool is_send, float *buf, int64_t count,
                                      int peer, int tag, pdp_work **w);

PDP__PRIVATE pdp_status pdp__nccl_send(pdp_comm *c, const float *buf, int64_t count, int peer,
                                       int tag, pdp_work **w);

PDP__PRIVATE pdp_status pdp__nccl_recv(pdp_comm *c, float *buf, int64_t count, int peer, int tag,
                                       pdp_work **w);

/* A batch: its messages pending with those posted before, then enqueued as one group. */
PDP__PRIVATE pdp_status pdp__nccl_sendrecv(pdp_comm *c, const pdp_p2p *ops, int n, pdp_work **w);

/* A message's wait: its group's completion, then (a receive) the sender's header. */
PDP__PRIVATE pdp_status pdp__nccl_p2p_wait(pdp_comm *c, pdp__nccl_work *wk);

/* kind names the collective through internal.h's pdp__op_names, whose first four
   entries follow pdp_cudak_coll's order. */
PDP__PRIVATE pdp_status pdp__nccl_issue(pdp_comm *c, pdp_cudak_coll kind, const void *send,
                                        void *recv, int64_t count, int op, pdp_dtype dt,
                                        pdp_work **w);

PDP__PRIVATE pdp_status pdp__nccl_allreduce(pdp_comm *c, void *buf, int64_t count, pdp_dtype dt,
                                            pdp_reduce_op op, pdp_work **w);

PDP__PRIVATE pdp_status pdp__nccl_broadcast(pdp_comm *c, float *buf, int64_t count, int root,
                                            pdp_work **w);

PDP__PRIVATE pdp_status pdp__nccl_reduce_scatter(pdp_comm *c, const void *send, void *recv,
                                                 int64_t recv_count, pdp_dtype dt, pdp_reduce_op op,
                                                 pdp_work **w);

PDP__PRIVATE pdp_status pdp__nccl_allgather(pdp_comm *c, const float *send, float *recv,
                                            int64_t send_count, pdp_work **w);

PDP__PRIVATE pdp_status pdp__nccl_barrier(pdp_comm *c, pdp_work **w);

PDP__PRIVATE pdp_status pdp__nccl_broadcast_bytes(pdp_comm *c, void *buf, size_t bytes, int root);

PDP__PRIVATE pdp_status pdp__nccl_wait(pdp_work *w);

PDP__PRIVATE bool pdp__nccl_done(pdp_work *w);

PDP__PRIVATE void pdp__nccl_destroy(pdp_comm *c);

PDP__PRIVATE pdp_status pdp__nccl_wrap(pdp_comm **out, pdp_cudak_nccl *h, int dev, int rank,
                                       int size, int trace_pid, double timeout_s,
                                       const char *name, bool process_rank, const char *fn);

/* ---- comm_nccl: split ----
   ncclCommSplit over c (thread ranks and process ranks alike: it needs NCCL 2.18),
   after the messages pending on c are enqueued. comm.c has already exchanged the
   colours over c, so every rank is here; the key orders the new ranks as
   comm.c's new_rank does (ties by rank in c, as NCCL's). */
PDP__PRIVATE pdp_status pdp__nccl_split(pdp_comm *c, int colour, int key, int new_rank,
                                        int new_size, int leader, const char *name,
                                        pdp_comm **out);

/* Wraps an initialised handle h (taken over, freed on failure) as rank of size; trace_pid:
   its lane in the trace (a split's parent's, else -1: rank). */
PDP__PRIVATE pdp_status pdp__nccl_wrap(pdp_comm **out, pdp_cudak_nccl *h, int dev, int rank,
                                       int size, int trace_pid, double timeout_s,
                                       const char *name, bool process_rank, const char *fn);

/* pdp_comm_init_env for PDP_BACKEND_NCCL: one process per GPU. The unique id
   travels through rendezvous.c; the store stays open until ncclCommInitRank
   (collective) has returned on this rank. */
PDP__PRIVATE pdp_status pdp__comm_init_nccl_env(pdp_comm **out, const pdp_comm_desc *desc);

#endif /* PDP_CUDA */

/* ---- comm_nccl: thread ranks (pdp_nccl_group) ---- */

/* PDP_API pdp_status pdp_nccl_group_create(pdp_nccl_group **out, int ndev, const pdp_device *devices, const pdp_comm_desc *desc) */

/* PDP_API void pdp_nccl_group_free(pdp_nccl_group *g) */

/* PDP_API pdp_status pdp_comm_create_nccl(pdp_comm **out, pdp_nccl_group *g, int rank) */

/* ---- src/comm.c ---- */
/* comm: the public communicator API and the backend dispatcher. Each backend is
   one module that fills a pdp__comm_ops table (internal.h):
     comm_local.c   ranks are threads of one process (the default);
     comm_mpi.c     ranks are MPI processes (-DPDP_MPI);
     comm_nccl.c    ranks are GPUs, the host side of pdp_cuda.cu's NCCL (-DPDP_CUDA);
   the local and MPI backends share comm_queue.c's collective queue, and every
   backend shares internal.h's communicator contract (pdp_comm, pdp_work, the
   collective kinds and their names). This module comes after the backends in
   pdp.h, so nothing here is called before it is defined.

   ---- the public layer ----
   Every pdp_comm_* collective validates its arguments here (its count against one
   upper bound, below), stamps the handle's launch time, counts the collective and the
   bytes this rank moves in the bandwidth-optimal algorithm (ring all-reduce 2(N-1)/N x
   bytes, reduce-scatter and broadcast (N-1)/N x bytes, all-gather (N-1) x the sent
   bytes), then calls the backend. A call with work == NULL is made synchronous here, so backends
   always return a handle. pdp_work_wait adds the collective's execution time
   (t_done - t_start, queueing excluded) to the communicator's busy_s.

   ---- the dispatcher ----
   pdp_comm_init_env creates the communicator of a process launched by mpirun
   or torchrun: one line per backend calls its pdp__comm_init_<backend>_env,
   which every backend module defines, as a stub that fails with
   PDP_ERR_UNSUPPORTED naming the macro when the backend was not compiled in.
   DEFAULT and LOCAL fail with PDP_ERR_INVALID: thread-ranks have no
   environment to read; they need pdp_local_group_create. A new backend takes:
     - one new module: its pdp__comm_ops table (internal.h states the contract),
       its creation, and its pdp__comm_init_<backend>_env, a stub that fails with
       PDP_ERR_UNSUPPORTED naming the macro when the backend is not compiled in;
     - that module in amalgamate.py's IMPL list, before comm.c (after
       comm_queue.c if it uses the queue), and its build macro in the manual's
       BUILD and OPTIONS;
     - the prototype of its pdp__comm_init_<backend>_env in internal.h, beside
       the others;
     - its pdp_backend value in comm.h (and there, what it bounds and where its
       messages differ);
     - its line in the switch below, and in pdp__comm_count_max when it takes
       narrower counts than int64_t;
     - the collective and point-to-point tests run on it (tests/test_comm.c and
       tests/test_mpi.c drive the local and MPI backends). */

/* #include "internal.h" (above) */

/* ---- comm: public layer ---- */

PDP__PRIVATE pdp_status pdp__comm_check(const pdp_comm *c, const char *fn);

PDP__PRIVATE pdp_status pdp__comm_check_count(const pdp_comm *c, const void *p, int64_t count,
                                              const char *what, const char *fn);

/* ---- comm: the upper bound of a count ----
   One rule for every call, here and nowhere else: the largest buffer the call touches,
   parts x count elements of es bytes (parts = the world size for reduce-scatter's send and
   all-gather's recv buffers, else 1), must be addressable, at most PTRDIFF_MAX bytes (so
   count x es fits in size_t and every byte offset in ptrdiff_t: pdp__comm_bytes cannot
   wrap in a backend), and count must fit what the backend takes in one call
   (pdp__comm_count_max). Beyond either, the call fails with PDP_ERR_INVALID naming the call,
   the count and the limit, before the backend sees it. */

/* Elements per rank that one call of c's backend takes: MPI counts are int, so the MPI
   backend's reduce-scatter, all-gather, send and recv take at most INT32_MAX (its
   all-reduce and broadcasts are split into calls of PDP_MPI_CHUNK elements); local and
   NCCL (size_t counts) are bounded by the address space alone. */
PDP__PRIVATE int64_t pdp__comm_count_max(const pdp_comm *c, pdp__coll_kind kind);

PDP__PRIVATE pdp_status pdp__comm_check_bound(const pdp_comm *c, int64_t count, size_t es,
                                              int parts, pdp__coll_kind kind, const char *fn);

PDP__PRIVATE pdp_status pdp__comm_check_op(const pdp_comm *c, pdp_reduce_op op, const char *fn);

PDP__PRIVATE pdp_status pdp__comm_check_root(const pdp_comm *c, int root, const char *fn);

/* After the backend accepted a collective: stats, the launch stamp, and the
   synchronous form when the caller passed no handle pointer. */
PDP__PRIVATE pdp_status pdp__comm_launched(pdp_comm *c, pdp_status st, pdp_work *w, double t_launch,
                                           double bytes, pdp_work **work, const char *fn);

PDP__PRIVATE pdp_status pdp__comm_check_dtype(const pdp_comm *c, pdp_dtype dt, const char *fn);

/* The all-reduce of every dtype; fn names the public entry. */
PDP__PRIVATE pdp_status pdp__comm_allreduce(pdp_comm *c, void *buf, int64_t count, pdp_dtype dt,
                                            pdp_reduce_op op, pdp_work **work, const char *fn);

/* PDP_API pdp_status pdp_comm_allreduce(pdp_comm *c, float *buf, int64_t count, pdp_reduce_op op, pdp_work **work) */

/* PDP_API pdp_status pdp_comm_allreduce_ex(pdp_comm *c, void *buf, int64_t count, pdp_dtype dtype, pdp_reduce_op op, pdp_work **work) */

/* PDP_API pdp_status pdp_comm_broadcast(pdp_comm *c, float *buf, int64_t count, int root, pdp_work **work) */

PDP__PRIVATE pdp_status pdp__comm_reduce_scatter(pdp_comm *c, const void *send, void *recv,
                                                 int64_t recv_count, pdp_dtype dt, pdp_reduce_op op,
                                                 pdp_work **work, const char *fn);

/* PDP_API pdp_status pdp_comm_reduce_scatter(pdp_comm *c, const float *send, float *recv, int64_t recv_count, pdp_reduce_op op, pdp_work **work) */

/* PDP_API pdp_status pdp_comm_reduce_scatter_ex(pdp_comm *c, const void *send, void *recv, int64_t recv_count, pdp_dtype dtype, pdp_reduce_op op, pdp_work **work) */

/* PDP_API pdp_status pdp_comm_allgather(pdp_comm *c, const float *send, float *recv, int64_t send_count, pdp_work **work) */

/* PDP_API pdp_status pdp_comm_barrier(pdp_comm *c, pdp_work **work) */

/* ---- comm: point-to-point ---- */

PDP__PRIVATE pdp_status pdp__comm_check_p2p(const pdp_comm *c, int peer, int tag, const char *fn);

/* PDP_API pdp_status pdp_comm_send(pdp_comm *c, const float *buf, int64_t count, int peer, int tag, pdp_work **work) */

/* PDP_API pdp_status pdp_comm_recv(pdp_comm *c, float *buf, int64_t count, int peer, int tag, pdp_work **work) */

/* PDP_API pdp_status pdp_comm_sendrecv(pdp_comm *c, const pdp_p2p *ops, int n) */

/* ---- comm: agreement in a collective constructor ----
   A constructor that is collective over c (a split, a mesh, DDP, ZeRO, a pipeline, a
   trainer) can fail on one rank alone: a desc that rank got wrong, an allocation. Where
   that rank returns and the others go on into a collective, they wait there for it until
   the timeout; where it happens after the last collective, they return an object whose peer
   does not exist and learn of it at its first collective. So every such constructor passes
   each rank's status st through this one all-reduce (a count of failed ranks and the sum of
   their numbers) at each point where a rank-local stretch ends: before its first collective
   (pdp_ddp_create, pdp_zero_create, pdp_pp_create: their arguments, desc and plan) and after
   its last (what they allocate after it; pdp_comm_split and pdp_mesh_create too, whose
   checks before their first collective are of arguments every rank passes alike), a failed
   rank going straight there. A failed rank gets its own status and message back; a rank that
   succeeded fails with PDP_ERR_COMM naming the failed rank when there is one. */
/* The sum over c's ranks of n host floats v, in place (through device memory on a
   communicator of GPUs). */
PDP__PRIVATE pdp_status pdp__comm_sum_host(pdp_comm *c, float *v, int n);

/* Do all c's ranks hold this rank's n values (n <= 16)? Each value's sum over the ranks
   (rounded to float; sum[k] gets it) against size x this rank's: the first `exact` values
   are integers and compare within 0.5, the others within 1e-4 relative (float sums in any
   order). *differs: the first value that does not agree, or -1. Collective over c. */
PDP__PRIVATE pdp_status pdp__comm_same_values(pdp_comm *c, const double *mine, float *sum, int n,
                                              int exact, int *differs);

PDP__PRIVATE pdp_status pdp__comm_agree(pdp_comm *c, pdp_status st, const char *fn);

/* ---- comm: process groups ---- */

#define PDP__SPLIT_MAX_RANKS 4096 /* the (colour, key) table lives on the stack */

/* pdp_comm_split, with the new communicator's name (NULL: "<name of c>.<colour>"). */
PDP__PRIVATE pdp_status pdp__comm_split(pdp_comm *c, int colour, int key, const char *name,
                                        pdp_comm **out);

/* PDP_API pdp_status pdp_comm_split(pdp_comm *c, int colour, int key, pdp_comm **out) */

/* ---- comm: process meshes ----
   Dimension k's group is one split of world: its colour is the group's first rank (this
   rank with c_k = 0), the same for the ranks that differ in c_k alone and different for
   every other group; its key is c_k, so the group ranks its members by c_k. Its name says
   the dimension and the coordinates its members share: "<world>.TP(DP 1, PP 0)". */

struct pdp_mesh {
    int ndim, rank;                          /* rank: in world */
    int size[PDP_MESH_MAX_DIMS], coord[PDP_MESH_MAX_DIMS], stride[PDP_MESH_MAX_DIMS];
    char name[PDP_MESH_MAX_DIMS][16];
    pdp_comm *group[PDP_MESH_MAX_DIMS];
};

/* snprintf at buf + *n, where *n counts what the line needs so far, fitting or not */
PDP__PRIVATE void pdp__mesh_put(char *buf, size_t bytes, size_t *n, const char *fmt, ...);

/* Dimension k's name: names[k], or "dim<k>" (written into own) for an unnamed one, in its
   groups' names and pdp_mesh_format's line alike. */
PDP__PRIVATE const char *pdp__mesh_dim_name(const char *const *names, int k, char own[16]);

/* Dimension k's group name into buf: world's name (its first 24 characters), the
   dimension's name, then the other dimensions' names and this rank's coordinates along
   them, "world.TP(DP 1, PP 0)"; an unnamed dimension j is "dim<j>" here. A name that bytes
   cannot hold would lose coordinates at its end, and two groups their difference: it is
   then "world.TP(first rank 4)", the group's first world rank (its split's colour). */
PDP__PRIVATE void pdp__mesh_group_name(char *buf, size_t bytes, const pdp_comm *world, int ndim,
                                       const char *const *names, const int *coord, int k,
                                       int first_rank);

/* PDP_API pdp_status pdp_mesh_create(pdp_mesh **out, pdp_comm *world, int ndim, const int *sizes, const char *const *names) */

/* PDP_API void pdp_mesh_free(pdp_mesh *m) */

/* PDP_API pdp_comm *pdp_mesh_group(const pdp_mesh *m, int dim) */

/* PDP_API int pdp_mesh_coord(const pdp_mesh *m, int dim) */

/* The world rank of member i of dimension k's group: this rank with c_k = i */
PDP__PRIVATE int pdp__mesh_member(const pdp_mesh *m, int k, int i);

/* PDP_API int pdp_mesh_members(const pdp_mesh *m, int dim, int *ranks) */

/* PDP_API pdp_status pdp_mesh_format(const pdp_mesh *m, char *buf, size_t bytes) */

/* PDP_API pdp_status pdp_comm_broadcast_bytes(pdp_comm *c, void *buf, size_t bytes, int root) */

/* PDP_API pdp_status pdp_work_wait(pdp_work *w) */

/* PDP_API pdp_status pdp_wait(pdp_work *work) */

/* PDP_API bool pdp_work_done(pdp_work *w) */

/* PDP_API void pdp_comm_free(pdp_comm *c) */

/* PDP_API int pdp_comm_rank(const pdp_comm *c) */
/* PDP_API int pdp_comm_size(const pdp_comm *c) */
/* PDP_API pdp_backend pdp_comm_backend(const pdp_comm *c) */
/* PDP_API double pdp_comm_timeout(const pdp_comm *c) */

/* Built from the head every backend fills (its defaults: pdp__comm_desc_timeout and
   each backend's create); log is not kept by a communicator. */
/* PDP_API pdp_comm_desc pdp_comm_get_desc(const pdp_comm *c) */

/* PDP_API void pdp_comm_get_stats(const pdp_comm *c, pdp_comm_stats *out) */

/* ---- comm: pdp_comm_init_env, the dispatcher ---- */

/* PDP_API pdp_status pdp_comm_init_env(pdp_comm **out, const pdp_comm_desc *desc) */

/* ---- src/layers.c ---- */
/* layers: every layer kind's code, kind by kind: setup (shape inference and
   validation), parameter initialisation, forward and backward on the CPU, and the
   CUDA entries that hand a CUDA device's work to pdp_cuda.cu. layers_table.c lists
   them in one table of kinds; model.c drives them in order.

   Conventions (PyTorch's, so that state_dicts and results carry over):
   - Linear: y = x W^T + b, W [out, in], on 1-D samples.
   - Conv2d and MaxPool2d: in layers_conv.c.
   - LayerNorm: over all features of a sample, biased variance, y = (x - mean) *
     rstd * w + b with w, b of the sample's shape; mean and rstd are saved.
   - GELU is the tanh form (GELUErf the exact one, with erf); SiLU is x sigmoid(x); the
     element formulas live in math.h (shared with CUDA).
   - Dropout: the mask is a pure function of (seed, layer, step, global sample
     index, element) (math.h), so a batch split across DP replicas, each with its
     sample_base, draws exactly the masks one device draws (and a slice of a sample,
     sequence parallelism's, keys its elements from mask_first). Training: keep with
     probability 1 - p and scale by 1 / (1 - p); the scaled mask is saved for
     backward. Evaluation: identity.
   - Flatten is a view: model.c aliases its output to its input and never calls
     forward or backward for it (they copy, should anything else). So is a ReLU
     right after a Conv2d (layers_conv.c) or a Linear (below) on the CPU.

   Invariants: forward and backward allocate nothing (temporaries live in io->work,
   sized by work_per_sample) and return a status: PDP_OK, or an error whose message
   says what is wrong with the input (model.c names the layer: "pdp_model_forward:
   layer 3 (Linear): ..."); backward accumulates into dw and db (+=) and writes
   dx (=), and skips dx when it is NULL (the first layer). Every reduction runs
   in a fixed order that does not depend on the thread count, so results are
   bit-reproducible. A setup starts from the output shape = the input shape and no
   saved floats, workspace or parameters (layers_table.c's pdp__layer_setup), and
   its messages name what is wrong and the input shape `in`; pdp__model_add adds
   the function and the layer. A CUDA entry returns pdp_cuda.cu's status as it is
   (layers_table.c turns a failure into "pdp_cuda: <its message>"). */

/* #include "internal.h" (above) */

/* ---- layers: small helpers ---- */

/* "(1, 28, 28)" or "(784)": a sample's shape, for messages. */
PDP__PRIVATE const char *pdp__layers_dims_str(int ndim, const int64_t *shape, char *buf,
                                              size_t bytes);

/* Sum of n floats: 16 float lanes (which the compiler vectorises), combined in
   double. Fixed order, so the same bits on every run. */
PDP__PRIVATE double pdp__layers_sum(const float *PDP__RESTRICT x, int64_t n);

/* Sum of (x[i] - c)^2, same scheme. */
PDP__PRIVATE double pdp__layers_sumsq_dev(const float *PDP__RESTRICT x, float c, int64_t n);

/* Sum of a[i] * b[i], same scheme. */
PDP__PRIVATE double pdp__layers_dot(const float *PDP__RESTRICT a, const float *PDP__RESTRICT b,
                                    int64_t n);

/* Sum of a[i] * b[i] * (c[i] - m), same scheme. */
PDP__PRIVATE double pdp__layers_dot3(const float *PDP__RESTRICT a, const float *PDP__RESTRICT b,
                                     const float *PDP__RESTRICT c, float m, int64_t n);

/* Element passes over n floats. Each takes its arrays as restrict parameters and
   loads every operand before the select: gcc -O2's vectoriser passes over the same
   loop on restrict locals (io->x + lo) and over a conditional load (-fopt-info-vec,
   gcc 12). Element by element, so the bits are the scalar loop's. */
PDP__PRIVATE void pdp__layers_add(float *PDP__RESTRICT acc, const float *PDP__RESTRICT x, int64_t n);

/* out = a + b in one pass (the residual stream's add: the bits of out = a; out += b). */
PDP__PRIVATE void pdp__layers_add2(const float *PDP__RESTRICT a, const float *PDP__RESTRICT b,
                                   float *PDP__RESTRICT out, int64_t n);

PDP__PRIVATE void pdp__layers_relu(const float *PDP__RESTRICT x, float *PDP__RESTRICT y, int64_t n);

/* dx = dy where y > 0 (pdp__relu_grad), and its mirror for tanh, sigmoid (from y)
   and dropout (dy times the saved scaled mask). */
PDP__PRIVATE void pdp__layers_relu_grad(const float *PDP__RESTRICT dy, const float *PDP__RESTRICT y,
                                        float *PDP__RESTRICT dx, int64_t n);

PDP__PRIVATE void pdp__layers_tanh_grad(const float *PDP__RESTRICT dy, const float *PDP__RESTRICT y,
                                        float *PDP__RESTRICT dx, int64_t n);

PDP__PRIVATE void pdp__layers_sigmoid_grad(const float *PDP__RESTRICT dy,
                                           const float *PDP__RESTRICT y, float *PDP__RESTRICT dx,
                                           int64_t n);

PDP__PRIVATE void pdp__layers_mul(const float *PDP__RESTRICT a, const float *PDP__RESTRICT b,
                                  float *PDP__RESTRICT out, int64_t n);

/* ---- layers: GELU, vectorised ----
   math.h's pdp__gelu and pdp__gelu_grad (x / (1 + e), e = exp(-2u)) on 16 (AVX-512F)
   or 8 (AVX2 + FMA) lanes: the same operations in the same order, with an exp of
   their own (Cephes's expf: n = round(z log2 e), r = z - n ln 2 in two FMAs, e^r by
   its degree-7 polynomial, 2^n into the exponent bits; z clamped to [-87, 88]: the
   formula uses z = -2u in [-88, 88], and below -87 e only enters 1 + e and 2 x du e s
   beside 1, which e^-87 leaves unchanged in fp32). Both widths run the same instruction
   sequence lane by lane, so they give the same bits (tests/test_gpt_kernels.c holds
   them to that, and both, with the scalar helpers, to a double-precision reference).
   The tail of a range runs through the same vector code (masked loads and stores, or a
   zero-padded copy), so an element's bits do not depend on where a split falls. The
   width is chosen at run time from gemm_bf16.c's CPUID check (compiled under target
   attributes, so a plain x86-64 build has both); without them, math.h's helpers. */
#if PDP__BF16_X86
#  define PDP__GELU_512 PDP__TARGET("avx512f")
#  define PDP__GELU_256 PDP__TARGET("avx2,fma")
#  define PDP__GELU_EXP_CONSTANTS                                                            \
    const float lo = -87.0f, hi = 88.0f, log2e = 1.44269504088896341f;                     \
    const float ln2_hi = 0.693359375f, ln2_lo = -2.12194440e-4f;                            \
    const float p0 = 1.9875691500e-4f, p1 = 1.3981999507e-3f, p2 = 8.3334519073e-3f,       \
                p3 = 4.1665795894e-2f, p4 = 1.6666665459e-1f, p5 = 5.0000001201e-1f

/* e^z, z in [-87, 88] after the clamp; lane by lane. */
/* The zero-masking forms, every lane kept, of min, max, roundscale, cvtps and slli: GCC's
   headers give the plain forms an _mm512_undefined_*() merge source that g++ reports as
   -Wmaybe-uninitialized (as gemm_bf16.c's PDP__BF16_UNPACKLO32 says); the same
   instructions. */
#  define PDP__ALL16 ((__mmask16)0xffff)

/* GELU of 16 lanes (dy NULL: y = gelu(x)) or its gradient (out = dy gelu'(x)). */

/* rows of n floats ld apart (x, dy and out alike): one call per tile of a product's
   epilogue (the constants are set up once per call, not once per row) */
PDP__GELU_512 PDP__PRIVATE void pdp__gelu_avx512(const float *x, const float *dy,
                                                 float *out, int64_t n, int64_t rows, int64_t ld);

PDP__GELU_256 PDP__PRIVATE void pdp__gelu_avx2(const float *x, const float *dy,
                                               float *out, int64_t n, int64_t rows, int64_t ld);
/* out = exp(x - shift) for n floats, 0 where x - shift < -87 (the softmax's: its
   arguments are <= 0, and what falls below e^-87 is nothing beside the row's 1). */
PDP__GELU_512 PDP__PRIVATE void pdp__exp_shift_avx512(const float *x, float shift, float *out,
                                                      int64_t n);

PDP__GELU_256 PDP__PRIVATE void pdp__exp_shift_avx2(const float *x, float shift, float *out,
                                                    int64_t n);

#  undef PDP__GELU_EXP_CONSTANTS
#  undef PDP__ALL16
#  undef PDP__GELU_512
#  undef PDP__GELU_256
#endif

/* The width of the vectorised element kernels (the GELU, the softmax's exp): 512
   (AVX-512F), 256 (AVX2 + FMA) or 0 (scalar: math.h's helpers, expf), the widest the CPU
   has. */
PDP__PRIVATE int pdp__layers_simd(void);

/* out = gelu(x) (dy NULL) or out = dy gelu'(x) on rows of n floats ld apart (x, dy and
   out alike), on the kernel of width simd (pdp__layers_simd's, or one the CPU has: the
   tests compare them). Each element alone: the bits do not depend on the cut. */
PDP__PRIVATE void pdp__layers_gelu_simd_rows(int simd, const float *x, const float *dy, float *out,
                                             int64_t n, int64_t rows, int64_t ld);

/* pdp__layers_gelu_simd_rows on one row of n floats */
PDP__PRIVATE void pdp__layers_gelu_simd_run(int simd, const float *x, const float *dy, float *out,
                                            int64_t n);

/* out = exp(x - shift), n floats (out may be x), on the kernel of width simd as
   pdp__layers_gelu_simd_run; 0 below e^-87 on every width. */
PDP__PRIVATE void pdp__layers_exp_shift_run(int simd, const float *x, float shift, float *out,
                                            int64_t n);

/* Parts for a job split by sample: the caller's intra-op threads, at most one
   per sample. */
PDP__PRIVATE int pdp__layers_batch_parts(int64_t batch);

/* Parameters: the product of a shape. */
PDP__PRIVATE int64_t pdp__layers_count(int ndim, const int64_t *shape);

/* PyTorch's reset_parameters for Linear and Conv2d: weight Kaiming uniform with
   a = sqrt(5) (bound 1/sqrt(fan_in)), then bias U(-1/sqrt(fan_in), 1/sqrt(fan_in)),
   in that order from r. w and b are host memory. */
PDP__PRIVATE void pdp__layers_init_kaiming(float *w, int64_t nw, float *b, int64_t nb,
                                           int64_t fan_in, pdp_rng *r);

/* Setup of a layer whose output has its input's shape and that keeps nothing
   (the activations): nothing to check. */
PDP__PRIVATE pdp_status pdp__layers_setup_same(pdp__layer *l, pdp__param_shapes *ps, const char *in);

/* Element-wise layers split [0, batch * in_count) into equal ranges (multiples of
   16) over the intra-op threads when there is enough work to pay for the hand-off;
   every element is computed alone, so the split never changes a bit. The hand-off
   (waking a worker and waiting for it) costs more than a ReLU over 65536 floats:
   the MLP 784-512-512-10 at batch 128 on 2 threads spent 0.33-0.42 ms per step in
   its ReLUs split, 0.18-0.22 ms unsplit (pdp_profile, Zen 4); from 262144 floats on,
   the split pays. (Measured before the pool's workers spun between jobs; with the
   spin, a threshold of 16384 gained 1-3% on that step, inside the host's noise, so
   the threshold stayed.) */
#ifndef PDP__ELEMWISE_PAR_MIN
#  define PDP__ELEMWISE_PAR_MIN PDP__TEST_KNOB(elemwise_par_min, 262144)
#endif

/* Sums over a batch's rows (a LayerNorm's dw and db, a Linear's db) by chunks of rows. Each
   chunk sums its rows in row order into its own share; then the shares are added in chunk
   order. The chunk count depends on the shape only, never on the thread count, so neither
   do the bits. One chunk (under PDP__ELEMWISE_PAR_MIN floats, which run on one thread
   anyway) sums straight into the result. Otherwise the most chunks, a power of two (so
   that 2 or 4 threads get equal work) up to PDP__SUM_CHUNKS, of at least
   PDP__SUM_CHUNK_FLOATS floats each, so that adding a share (its row's length) costs little
   beside its chunk's pass; the shares live in io->work. At bench/gpt's machine-sized model
   (2048 rows of 384 to 1536): 32 chunks of 64 rows, 16 a thread on 2.
   Splitting the threads by rows, not by columns (each thread its columns of every row), is
   also what lets 2 threads go twice as fast on a 2-core Sapphire Rapids (Intel Xeon, 2
   cores; 64-byte aligned buffers, 2048 rows, medians of 100 calls): by columns, LayerNorm's
   dw and db over 384 took 0.22 ms on one thread and 0.31-0.32 ms on two, a fused GELU's
   backward over 1536 columns (with db) 2.22-2.35 and 1.75-1.89 ms; by rows, that GELU
   backward 2.25-2.41 and 1.08-1.09 ms. */
#ifndef PDP__SUM_CHUNKS
#  define PDP__SUM_CHUNKS 64
#endif
#ifndef PDP__SUM_CHUNK_FLOATS
#  define PDP__SUM_CHUNK_FLOATS PDP__TEST_KNOB(sum_chunk_floats, 16384)
#endif

/* The chunks of rows x n floats. */
PDP__PRIVATE int64_t pdp__layers_chunks(int64_t rows, int64_t n);

/* io->work's floats per sample for the shares of `share` floats each, for samples of
   `positions` rows of n: with k > 1 chunks, k <= rows n / CF <= rows / q for q = floor(CF /
   n) (at least 1: then k <= rows), so the k shares are at most batch positions share / q
   floats. */
PDP__PRIVATE int64_t pdp__layers_shares_work(int64_t n, int64_t positions, int64_t share);

/* Intra-op parts for rows x n floats in `items` pieces: 1 below PDP__ELEMWISE_PAR_MIN. */
PDP__PRIVATE int pdp__layers_parts(int64_t rows, int64_t n, int64_t items);

/* ---- layers: Linear ---- */

/* Rows a per-position kind acts on in a batch: batch x T for [T, C] samples. */
PDP__PRIVATE int64_t pdp__layer_rows(const pdp__layer *l, int64_t batch);

/* The features of one row: a 1-D sample's all, a [T, C] sample's C. */
PDP__PRIVATE int64_t pdp__layer_in_features(const pdp__layer *l);

/* A 1-D sample (F) is one row of F features; a [T, C] sample is T rows of C, each acted
   on alone, as PyTorch's Linear and LayerNorm(C) act on the last dimension. */
PDP__PRIVATE void pdp__layers_per_position(pdp__layer *l);

PDP__PRIVATE pdp_status pdp__linear_setup(pdp__layer *l, pdp__param_shapes *ps, const char *in);

PDP__PRIVATE void pdp__linear_init(const pdp__layer *l, float *w, float *b, pdp_rng *r);

/* The ReLU that a Linear applies when one follows it on the CPU (io->fused_relu;
   model.c then makes the ReLU a view, as after a Conv2d): forward, y = relu(y) in
   place once the GEMM has added x W^T to the bias (or in a bf16 product's epilogue:
   pdp__linear_forward); backward, dy masked by y > 0 into io->work (the ReLU's
   backward), db's column sums taken on the way, and the GEMMs read that. The ReLU's element code, and db's sums sample by sample as
   unfused: the bits of the two layers run apart (test_layers:
   layers_linear_relu_fused_matches_unfused).

   The GELU that a Linear applies when one follows it on the CPU (io->gelu_y; model.c then
   skips the GELU): forward, y = x W^T + b stays (the GELU's input, which its backward
   reads) and gelu_y = gelu(y), the GELU's output, is written beside it, in a bf16
   product's epilogue from the tile just written, else by a column pass after the GEMM;
   backward, dy (the GELU's output gradient) times gelu'(y) into io->work, db's column
   sums on the way, and the GEMMs read that. The GELU layer's kernel on its width
   (pdp__layers_gelu_simd_rows), each element alone, and db's sums sample by sample: the
   bits of the two layers run apart (test_layers: layers_linear_gelu_fused_matches_unfused).
   What it saves: the GELU's read of y in forward (12.6 MB a c_fc of bench/gpt's
   machine-sized model) and its hand-off to the threads, and in backward the Linear's read of
   the GELU's dx for db. The GELU's own arithmetic (an exp and a division an element) stays,
   and on bench/gpt's machine-sized model it is most of the GELU's time: its bf16 c_fc + GELU
   per step, the minimum of 15 steps in 6 alternated runs on a shared 2-core Sapphire
   Rapids, moved from 75-77 to 73-80 ms on 2 threads and from 132-138 to 132-136 ms on one
   (inside the runs' spread; an earlier, busier set gave 69-72 -> 64-68 ms on 2 threads).

   Row passes (pdp__linear_rows_run): the ReLU's and the GELU's, the bias copied into every
   row before the GEMM, db's sums without either. Large batches split the rows, in
   pdp__layers_chunks's chunks, over the intra-op threads; db is summed in each chunk's share
   of io->work (after the batch x out floats of the masked dy), the shares then added in
   chunk order, so the bits do not depend on the thread count. The bias and db passes write
   and read batch x out floats each (28 MB a block at bench/gpt's machine-sized model),
   which one thread alone would have to stream while the other waits. */
typedef struct pdp__linear_rows_job {
    const pdp__layer_io *io;
    int64_t out, chunks;
    float *shares; /* the chunks' db shares, out floats each; NULL: into io->db */
    void (*rows)(const pdp__layer_io *io, int64_t out, int64_t r0, int64_t r1, float *db);
} pdp__linear_rows_job;

PDP__PRIVATE void pdp__layers_relu_inplace(float *PDP__RESTRICT y, int64_t n);

/* dz = dy where y > 0 (pdp__relu_grad), db += dz. */
PDP__PRIVATE void pdp__layers_relu_grad_sum(const float *PDP__RESTRICT dy,
                                            const float *PDP__RESTRICT y, float *PDP__RESTRICT dz,
                                            float *PDP__RESTRICT db, int64_t n);

/* The same in bf16: dz rounded to bf16 (pdp__bf16_round_u32's bits) as it is stored, db
   summing the unrounded values (db is fp32: only the products' inputs are rounded); db
   NULL: no sums. The products read dz as their op(A), which is then bf16 by construction
   (pdp__linear_gemm_bf16). */
PDP__PRIVATE void pdp__layers_relu_grad16(const float *PDP__RESTRICT dy,
                                          const float *PDP__RESTRICT y, float *PDP__RESTRICT dz,
                                          float *PDP__RESTRICT db, int64_t n);

/* Rows [r0, r1) of each pass; db (a chunk's share or io->db) is NULL when io->db is. */
PDP__PRIVATE void pdp__linear_relu_forward_rows(const pdp__layer_io *io, int64_t out, int64_t r0,
                                                int64_t r1, float *db);

PDP__PRIVATE void pdp__linear_relu_backward_rows(const pdp__layer_io *io, int64_t out, int64_t r0,
                                                 int64_t r1, float *db);

/* pdp__linear_relu_backward_rows in bf16: work rounded (pdp__layers_relu_grad16) */
PDP__PRIVATE void pdp__linear_relu_backward_rows16(const pdp__layer_io *io, int64_t out,
                                                   int64_t r0, int64_t r1, float *db);

/* gelu_y = gelu(y) (after a product that did not apply it) */
PDP__PRIVATE void pdp__linear_gelu_forward_rows(const pdp__layer_io *io, int64_t out, int64_t r0,
                                                int64_t r1, float *db);

/* dz = dy gelu'(y) into work (the GELU's backward), db += dz, row by row */
PDP__PRIVATE void pdp__linear_gelu_backward_rows(const pdp__layer_io *io, int64_t out, int64_t r0,
                                                 int64_t r1, float *db);

/* y's rows = b (the GEMM adds x W^T next, beta 1) */
PDP__PRIVATE void pdp__linear_bias_rows(const pdp__layer_io *io, int64_t out, int64_t r0,
                                        int64_t r1, float *db);

/* db += dY's rows, row by row */
PDP__PRIVATE void pdp__linear_db_rows(const pdp__layer_io *io, int64_t out, int64_t r0,
                                      int64_t r1, float *db);

/* chunks [c0, c1) of the k: chunk c holds rows [batch c / k, batch (c + 1) / k) */
PDP__PRIVATE void pdp__linear_rows_part(void *arg, int i, int parts);

/* One pass over the rows; `sums`: the pass adds to db (then through the chunks' shares). */
PDP__PRIVATE void pdp__linear_rows_run(const pdp__layer *l, const pdp__layer_io *io,
                                       void (*rows)(const pdp__layer_io *, int64_t, int64_t,
                                                    int64_t, float *),
                                       bool sums);

/* io for the GEMMs: a [T, C] sample's T rows as rows of the batch */
PDP__PRIVATE const pdp__layer_io *pdp__linear_rows_io(const pdp__layer *l, const pdp__layer_io *io,
                                                      pdp__layer_io *rows);

PDP__PRIVATE pdp_status pdp__linear_forward(const pdp__layer *l, const pdp__layer_io *io_in);

/* pdp_gemm_bf16, told whether op(A) holds bf16 values already (a16: the ReLU's backward
   pass rounded dY): where the product runs sgemm-rounded, only op(B) is rounded as it is
   packed (pdp__sgemm_bf16_b; the bits of pdp_gemm_bf16, rounding being idempotent); the
   other paths round both, as always. */
PDP__PRIVATE void pdp__linear_gemm_bf16(bool a16, pdp_trans ta, pdp_trans tb, int64_t m,
                                        int64_t n, int64_t k, const float *a, int64_t lda,
                                        const float *b, int64_t ldb, float beta, float *c,
                                        int64_t ldc);

PDP__PRIVATE pdp_status pdp__linear_backward(const pdp__layer *l, const pdp__layer_io *io_in);

#ifdef PDP_CUDA
PDP__PRIVATE pdp_status pdp__linear_cuda_forward(const pdp__layer *l, const pdp__layer_io *io);

PDP__PRIVATE pdp_status pdp__linear_cuda_backward(const pdp__layer *l, const pdp__layer_io *io);
#endif

/* ---- layers: activations ---- */

typedef struct pdp__elem_job {
    const pdp__layer *l;
    const pdp__layer_io *io;
    int64_t n;
    void (*fn)(const pdp__layer *l, const pdp__layer_io *io, int64_t lo, int64_t hi);
} pdp__elem_job;

PDP__PRIVATE void pdp__elem_part(void *arg, int i, int parts);

PDP__PRIVATE void pdp__elem_run(const pdp__layer *l, const pdp__layer_io *io,
                                void (*fn)(const pdp__layer *, const pdp__layer_io *, int64_t,
                                           int64_t));

/* ReLU, GELU, Tanh, Sigmoid, SiLU: elements [lo, hi) of forward (y from x) and of
   backward (dx from dy and y, or x for GELU and SiLU). */
PDP__PRIVATE void pdp__relu_forward_range(const pdp__layer *l, const pdp__layer_io *io, int64_t lo,
                                          int64_t hi);

PDP__PRIVATE void pdp__relu_backward_range(const pdp__layer *l, const pdp__layer_io *io, int64_t lo,
                                           int64_t hi);

PDP__PRIVATE void pdp__gelu_forward_range(const pdp__layer *l, const pdp__layer_io *io, int64_t lo,
                                          int64_t hi);

PDP__PRIVATE void pdp__gelu_backward_range(const pdp__layer *l, const pdp__layer_io *io, int64_t lo,
                                           int64_t hi);

PDP__PRIVATE void pdp__tanh_forward_range(const pdp__layer *l, const pdp__layer_io *io, int64_t lo,
                                          int64_t hi);

PDP__PRIVATE void pdp__tanh_backward_range(const pdp__layer *l, const pdp__layer_io *io, int64_t lo,
                                           int64_t hi);

PDP__PRIVATE void pdp__sigmoid_forward_range(const pdp__layer *l, const pdp__layer_io *io,
                                             int64_t lo, int64_t hi);

PDP__PRIVATE void pdp__sigmoid_backward_range(const pdp__layer *l, const pdp__layer_io *io,
                                              int64_t lo, int64_t hi);

PDP__PRIVATE void pdp__silu_forward_range(const pdp__layer *l, const pdp__layer_io *io, int64_t lo,
                                          int64_t hi);

PDP__PRIVATE void pdp__silu_backward_range(const pdp__layer *l, const pdp__layer_io *io, int64_t lo,
                                           int64_t hi);

PDP__PRIVATE void pdp__gelu_erf_forward_range(const pdp__layer *l, const pdp__layer_io *io,
                                              int64_t lo, int64_t hi);

PDP__PRIVATE void pdp__gelu_erf_backward_range(const pdp__layer *l, const pdp__layer_io *io,
                                               int64_t lo, int64_t hi);

PDP__PRIVATE pdp_status pdp__relu_forward(const pdp__layer *l, const pdp__layer_io *io);

PDP__PRIVATE pdp_status pdp__relu_backward(const pdp__layer *l, const pdp__layer_io *io);

PDP__PRIVATE pdp_status pdp__gelu_forward(const pdp__layer *l, const pdp__layer_io *io);

PDP__PRIVATE pdp_status pdp__gelu_backward(const pdp__layer *l, const pdp__layer_io *io);

PDP__PRIVATE pdp_status pdp__tanh_forward(const pdp__layer *l, const pdp__layer_io *io);

PDP__PRIVATE pdp_status pdp__tanh_backward(const pdp__layer *l, const pdp__layer_io *io);

PDP__PRIVATE pdp_status pdp__sigmoid_forward(const pdp__layer *l, const pdp__layer_io *io);

PDP__PRIVATE pdp_status pdp__sigmoid_backward(const pdp__layer *l, const pdp__layer_io *io);

PDP__PRIVATE pdp_status pdp__silu_forward(const pdp__layer *l, const pdp__layer_io *io);

PDP__PRIVATE pdp_status pdp__silu_backward(const pdp__layer *l, const pdp__layer_io *io);

PDP__PRIVATE pdp_status pdp__gelu_erf_forward(const pdp__layer *l, const pdp__layer_io *io);

PDP__PRIVATE pdp_status pdp__gelu_erf_backward(const pdp__layer *l, const pdp__layer_io *io);

#ifdef PDP_CUDA
/* One kernel pair for the five, told which by pdp_cudak_act. */
PDP__PRIVATE pdp_status pdp__act_cuda_forward(const pdp__layer *l, const pdp__layer_io *io,
                                              pdp_cudak_act act);

PDP__PRIVATE pdp_status pdp__act_cuda_backward(const pdp__layer *l, const pdp__layer_io *io,
                                               pdp_cudak_act act);

PDP__PRIVATE pdp_status pdp__relu_cuda_forward(const pdp__layer *l, const pdp__layer_io *io);

PDP__PRIVATE pdp_status pdp__relu_cuda_backward(const pdp__layer *l, const pdp__layer_io *io);

PDP__PRIVATE pdp_status pdp__gelu_cuda_forward(const pdp__layer *l, const pdp__layer_io *io);

PDP__PRIVATE pdp_status pdp__gelu_cuda_backward(const pdp__layer *l, const pdp__layer_io *io);

PDP__PRIVATE pdp_status pdp__tanh_cuda_forward(const pdp__layer *l, const pdp__layer_io *io);

PDP__PRIVATE pdp_status pdp__tanh_cuda_backward(const pdp__layer *l, const pdp__layer_io *io);

PDP__PRIVATE pdp_status pdp__sigmoid_cuda_forward(const pdp__layer *l, const pdp__layer_io *io);

PDP__PRIVATE pdp_status pdp__sigmoid_cuda_backward(const pdp__layer *l, const pdp__layer_io *io);

PDP__PRIVATE pdp_status pdp__silu_cuda_forward(const pdp__layer *l, const pdp__layer_io *io);

PDP__PRIVATE pdp_status pdp__silu_cuda_backward(const pdp__layer *l, const pdp__layer_io *io);

PDP__PRIVATE pdp_status pdp__gelu_erf_cuda_forward(const pdp__layer *l, const pdp__layer_io *io);

PDP__PRIVATE pdp_status pdp__gelu_erf_cuda_backward(const pdp__layer *l, const pdp__layer_io *io);
#endif

/* ---- layers: Dropout ---- */

PDP__PRIVATE pdp_status pdp__dropout_setup(pdp__layer *l, pdp__param_shapes *ps, const char *in);

PDP__PRIVATE pdp_status pdp__dropout_forward(const pdp__layer *l, const pdp__layer_io *io);

PDP__PRIVATE pdp_status pdp__dropout_backward(const pdp__layer *l, const pdp__layer_io *io);

#ifdef PDP_CUDA
PDP__PRIVATE pdp_status pdp__dropout_cuda_forward(const pdp__layer *l, const pdp__layer_io *io);

PDP__PRIVATE pdp_status pdp__dropout_cuda_backward(const pdp__layer *l, const pdp__layer_io *io);
#endif

/* ---- layers: LayerNorm ---- */

/* A row's element passes, on restrict parameters so that gcc -O2 vectorises them (over
   restrict locals such as io->x + s * n it does not: see pdp__layers_add). Element by
   element, so the bits are the scalar loops'. y = (x - mean) rstd w + b: */
PDP__PRIVATE void pdp__layers_norm_row(const float *PDP__RESTRICT x, const float *PDP__RESTRICT w,
                                       const float *PDP__RESTRICT b, float mean, float rstd,
                                       float *PDP__RESTRICT y, int64_t n);

/* dw += dy xh, db += dy, xh = (x - mean) rstd */
PDP__PRIVATE void pdp__layers_norm_wgrad(const float *PDP__RESTRICT dy,
                                         const float *PDP__RESTRICT x, float mean, float rstd,
                                         float *PDP__RESTRICT dw, float *PDP__RESTRICT db,
                                         int64_t n);

/* dx = rstd (dy w - mg - xh mgx), and dw, db as pdp__layers_norm_wgrad, in one pass */
PDP__PRIVATE void pdp__layers_norm_dx_wgrad(const float *PDP__RESTRICT dy,
                                            const float *PDP__RESTRICT w,
                                            const float *PDP__RESTRICT x, float mean, float rstd,
                                            float mg, float mgx, float *PDP__RESTRICT dx,
                                            float *PDP__RESTRICT dw, float *PDP__RESTRICT db,
                                            int64_t n);

/* dw += share's first n floats, db += its next n */
PDP__PRIVATE void pdp__layers_norm_add_share(const float *PDP__RESTRICT share,
                                             float *PDP__RESTRICT dw, float *PDP__RESTRICT db,
                                             int64_t n);

/* io->work's floats per sample: backward's chunk shares (pdp__layers_chunks), 2 n each. */
PDP__PRIVATE int64_t pdp__layernorm_work(const pdp__layer *l);

PDP__PRIVATE pdp_status pdp__layernorm_setup(pdp__layer *l, pdp__param_shapes *ps, const char *in);

/* weight 1, bias 0 (PyTorch's) */
PDP__PRIVATE void pdp__layernorm_init(const pdp__layer *l, float *w, float *b, pdp_rng *r);

/* Rows [lo, hi) of the forward: mean and variance in fixed-order sums (pdp__layers_sum),
   then the row. */
PDP__PRIVATE void pdp__layernorm_forward_rows(const pdp__layer *l, const pdp__layer_io *io,
                                              int64_t n, int64_t lo, int64_t hi);

/* Rows [lo, hi), dw and db summed into dw, db (of n floats): with xh = (x - mean) rstd and
   g = dy w, dx = rstd (g - mean(g) - xh mean(g xh)), dw += dy xh, db += dy. */
PDP__PRIVATE void pdp__layernorm_backward_rows(const pdp__layer_io *io, int64_t n, int64_t lo,
                                               int64_t hi, float *dw, float *db);

/* The intra-op threads split the forward by rows (each row whole) and the backward by
   chunks of rows (pdp__layers_chunks: dx on the way, dw and db into the chunk's share, in
   one pass over dy and x), so the bits do not depend on the thread count; small layers
   (under PDP__ELEMWISE_PAR_MIN floats) stay on the caller. */
typedef struct pdp__ln_job {
    const pdp__layer *l;
    const pdp__layer_io *io;
    int64_t rows, n, chunks;
} pdp__ln_job;

PDP__PRIVATE void pdp__layernorm_forward_part(void *arg, int i, int parts);

/* chunks [c0, c1) of the k: chunk c holds rows [rows c / k, rows (c + 1) / k), and its share
   is io->work's 2 n floats from 2 n c (dw's, then db's) */
PDP__PRIVATE void pdp__layernorm_backward_part(void *arg, int i, int parts);

PDP__PRIVATE pdp_status pdp__layernorm_forward(const pdp__layer *l, const pdp__layer_io *io);

PDP__PRIVATE pdp_status pdp__layernorm_backward(const pdp__layer *l, const pdp__layer_io *io);

#ifdef PDP_CUDA
PDP__PRIVATE pdp_status pdp__layernorm_cuda_forward(const pdp__layer *l, const pdp__layer_io *io);

PDP__PRIVATE pdp_status pdp__layernorm_cuda_backward(const pdp__layer *l, const pdp__layer_io *io);
#endif

/* ---- layers: Flatten ----
   A view (PDP__LAYER_VIEW): model.c never calls these; they copy, should anything
   else. */

PDP__PRIVATE pdp_status pdp__flatten_setup(pdp__layer *l, pdp__param_shapes *ps, const char *in);

PDP__PRIVATE pdp_status pdp__flatten_forward(const pdp__layer *l, const pdp__layer_io *io);

PDP__PRIVATE pdp_status pdp__flatten_backward(const pdp__layer *l, const pdp__layer_io *io);

#ifdef PDP_CUDA
PDP__PRIVATE pdp_status pdp__flatten_cuda_forward(const pdp__layer *l, const pdp__layer_io *io);

PDP__PRIVATE pdp_status pdp__flatten_cuda_backward(const pdp__layer *l, const pdp__layer_io *io);
#endif

/* ---- src/layers_conv.c ---- */
/* layers_conv: the image layers, Conv2d and MaxPool2d, kind by kind as in
   layers.c (setup, init, CPU forward and backward, CUDA entries), listed in
   layers_table.c. Uses layers.c's helpers (sums, batch parts, Kaiming init).

   Conventions (PyTorch's):
   - Conv2d: samples (C, H, W), W [O, C, k, k], b [O], square kernel, zero
     padding, output (O, Ho, Wo) with Ho = (H + 2 pad - k) / stride + 1. Computed
     by im2col + GEMM (Chellapilla et al., "High performance convolutional neural
     networks for document processing", 2006) on cache-sized chunks of samples:
     forward y = W col, backward dW = dy col^T and dcol = W^T dy, then col2im
     (details in "layers: Conv2d").
   - MaxPool2d: square window, no padding, floor output size; the first maximum
     in row-major window order wins ties, NaN wins over numbers (as PyTorch's CPU
     kernel). The winning index is saved as an int32 in the saved floats' memory.
   - A ReLU right after a Conv2d on the CPU is a view (PDP__LAYER_FUSES_RELU): the
     Conv2d applies it (io->fused_relu: forward stores relu(y), backward masks dy
     by y > 0 as it gathers dy), which saves two passes over the largest
     activations and gives the same bits. When a 2x2 stride-2 MaxPool2d follows
     that ReLU (even H and W), the Conv2d applies it too (io->pool_y): forward
     pools two rows of products at a time, each value through the bias and the
     ReLU, into the pool's output and winners (pdp__conv_pool_2x2); backward
     gathers the pool's dy, masked by the pooled value > 0, at each window's
     winner and zeros elsewhere (pdp__conv_unpool_2x2). The full-size output is
     never written, nor read back by the pool, nor its gradient written and read
     (model.c skips the MaxPool2d; same bits).

   Invariants: layers.c's (nothing allocated; dw, db accumulated; dx written, or
   skipped when NULL; fixed reduction order whatever the thread count). */

/* #include "internal.h" (above) */

/* ---- layers: pooling rows (MaxPool2d, and Conv2d's fused pool) ----
   One output row at a time: y and the winner's index (an int32 in the saved
   floats' memory, an offset into the sample's channel plane) start at the
   window's first element and are updated element by element in PyTorch's order
   (ki, then kj): an element replaces the current one when it is greater or NaN,
   so ties keep the first maximum and a NaN wins. The loops run in blocks of 16,
   8 and 4 columns, the remainder as the last 4 columns once more (an update is
   idempotent): constant trip counts, which gcc -O2 vectorises (its cheap cost
   model skips loops that would need a scalar epilogue) into selects instead of
   the branches a scalar loop gets, which mispredict on the half zeros a ReLU
   leaves. (The conditions are spelled out in each select on purpose: gcc 12
   vectorises that form, not an int flag computed once; 10x here.) */
#define PDP__POOL_BLOCKS(...)                                                                  \
    do {                                                                                       \
        for (; ow + 16 <= n; ow += 16)                                                         \
            for (j = 0; j < 16; j++) __VA_ARGS__                                               \
        for (; ow + 8 <= n; ow += 8)                                                           \
            for (j = 0; j < 8; j++) __VA_ARGS__                                                \
        for (; ow + 4 <= n; ow += 4)                                                           \
            for (j = 0; j < 4; j++) __VA_ARGS__                                                \
        if (ow < n && n >= 4) /* the last 4 again: both bodies are idempotent */              \
            for (ow = n - 4, j = 0; j < 4; j++) __VA_ARGS__                                    \
        else                                                                                   \
            for (; ow < n; ow++)                                                               \
                for (j = 0; j < 1; j++) __VA_ARGS__                                            \
    } while (0)

/* Window element (ki, kj) against the running maximum of n outputs. */
PDP__PRIVATE void pdp__maxpool_update(const float *PDP__RESTRICT src, int32_t st, int64_t n,
                                      float *PDP__RESTRICT y, int32_t *PDP__RESTRICT arg,
                                      int32_t at);

/* The common 2 x 2 window with stride 2: the two elements of each input row,
   then the two rows. Same result as the element-by-element order: the second
   row's winner replaces the first's only when greater or NaN. The window of
   output o is (a, b) over (c, d); at is row 0's offset, w the row stride. */
#define PDP__POOL_2X2_WINDOW(a, b, c, d)                                                       \
    do {                                                                                       \
        float m0 = (b > a || b != b) ? b : a, m1 = (d > c || d != d) ? d : c;                  \
        int32_t i0 = (b > a || b != b) ? at + 2 * o + 1 : at + 2 * o;                          \
        int32_t i1 = (d > c || d != d) ? at + w + 2 * o + 1 : at + w + 2 * o;                  \
        int t = (m1 > m0 || m1 != m1);                                                         \
        y[o] = t ? m1 : m0;                                                                    \
        arg[o] = t ? i1 : i0;                                                                  \
    } while (0)

PDP__PRIVATE void pdp__maxpool_2x2(const float *PDP__RESTRICT r0, const float *PDP__RESTRICT r1,
                                   int64_t n, float *PDP__RESTRICT y, int32_t *PDP__RESTRICT arg,
                                   int32_t at, int32_t w);

/* Conv2d's fused pool: the windows of two rows of products, each value through the
   bias and the ReLU first; the bits of pdp__maxpool_2x2 on the stored rows. */
PDP__PRIVATE void pdp__conv_pool_2x2(const float *PDP__RESTRICT r0, const float *PDP__RESTRICT r1,
                                     float bo, int64_t n, float *PDP__RESTRICT y,
                                     int32_t *PDP__RESTRICT arg, int32_t at, int32_t w);

/* The common 2 x 2 window with stride 2 tiling the plane exactly: each window's
   four dx written at once, the output's gradient g at its winner and zeros elsewhere
   (no memset, no scatter; in PDP__POOL_BLOCKS, whose selects gcc vectorises); with
   keep false, zeros only. */
#define PDP__UNPOOL_2X2_WINDOW(g, keep)                                                        \
    do {                                                                                       \
        int32_t a = (keep) ? arg[o] - at - 2 * o : -1;                                         \
        d0[2 * o] = a == 0 ? g : 0.0f;                                                         \
        d0[2 * o + 1] = a == 1 ? g : 0.0f;                                                     \
        d1[2 * o] = a == w ? g : 0.0f;                                                         \
        d1[2 * o + 1] = a == w + 1 ? g : 0.0f;                                                 \
    } while (0)

PDP__PRIVATE void pdp__maxpool_2x2_backward(const float *PDP__RESTRICT dy,
                                            const int32_t *PDP__RESTRICT arg, int64_t n, int32_t at,
                                            int32_t w, float *PDP__RESTRICT d0,
                                            float *PDP__RESTRICT d1);

/* Conv2d's fused pool, backward: the pool's dy through the ReLU's backward (the
   ReLU's output at the winner is the pooled value yp), then to the winner. */
PDP__PRIVATE void pdp__conv_unpool_2x2(const float *PDP__RESTRICT dy, const float *PDP__RESTRICT yp,
                                       const int32_t *PDP__RESTRICT arg, int64_t n, int32_t at,
                                       int32_t w, float *PDP__RESTRICT d0, float *PDP__RESTRICT d1);

/* ---- layers: Conv2d ----
   Two paths, both cutting the batch into chunks of `per_chunk` samples, a number
   that depends on the layer's geometry only (so do the results). The intra-op
   threads take whole chunks, each thread reusing one scratch region; each chunk
   leaves its shares of dW and db apart, and backward adds them up in chunk order
   after all chunks are done.

   Implicit GEMM (stride 1, padding <= k - 1; the common case). The n samples of a
   chunk are laid side by side in one zero-padded image, rows of
   Wt = n (W + pad) + pad floats (sample j's columns start at pad + j (W + pad): one
   band of `pad` zeros between neighbours is enough for both of them). Output columns
   are counted on that wide grid, Ho x Wt, so that row (c, ki, kj) of the chunk's
   column matrix is ONE contiguous run of the padded image (Ho Wt floats from
   (c, ki, kj)), and the GEMM packs those runs straight from the image through a
   row-offset table (pdp__sgemm_rows): the column matrix is never written. Per chunk:
     forward   grid [O, Ho Wt] = W [O, C k k] col;  y = each sample's Wo columns + b
     dW share  = dy_grid [O, Ho Wt] col^T           (dy_grid zero in the other columns)
     dx        = the forward convolution of dy, zero-padded by q = k - 1 - pad (laid
                 out the same way, bands of q), with the flipped, transposed weights
                 W'[c, (o, qi, qj)] = W[o, c, k-1-qi, k-1-qj] (Dumoulin and Visin, "A
                 guide to convolution arithmetic for deep learning", 2016, section 4):
                 no col2im.
   For a "same" convolution (q == pad) the padded dy's interior is dy on the grid,
   so the dW share reads it in place. When it makes fewer padded GEMM tiles (O small
   next to C k k), the share is computed transposed, share^T = col dy^T, with the
   column matrix as a gathered A (pdp__sgemm_arows) and summed back transposed. With
   few weights (conv 1 -> 16, k 5: 400) it is O C k k dot products over the grid
   (pdp__sgemm_dots): nothing packed, where packing cost more than the products.
   The grid's columns over the bands compute values nobody reads: pad / (W + pad) more
   GEMM work (12% for a 5x5 "same" convolution on 14x14) for no copies at all. In the dW
   share their dy is 0, which a NaN or an infinity of x there turns into NaN: a share that
   is not finite is summed again over the samples' own columns (pdp__conv_implicit_dw_exact),
   so that it holds them where PyTorch's does and nowhere else.

   im2col (any other stride or padding, and PDP_CBLAS builds): the column matrix
   [C k k, n] of a chunk is materialised with exact Wo columns (Chellapilla et al.,
   "High performance convolutional neural networks for document processing",
   2006): forward y = W col; backward dW = dy col^T and dcol = W^T dy, then col2im.
   Chunks of about PDP__CONV_CHUNK_FLOATS column floats keep a chunk in L2.

   bf16 (io->bf16, pdp_model_desc.precision): the products' inputs are rounded to bf16
   and summed in fp32. im2col: its GEMMs are pdp_gemm_bf16. Implicit, on AVX512-BF16 or
   AMX (PDP__CONV_BF16_PATH: the path AUTO takes for the forward product,
   pdp_bf16_path_for; job->packed16): forward, dx and the dW share are
   pdp__gemm_bf16_rows_h / _arows_h (gemm_bf16.c) through the offset tables (band
   columns included: no _runs variant), on the padded image and padded dy first
   converted to bf16 words in place (pdp__gemm_bf16_convert: each value once, not once
   per kernel tap; the padded dy after the dW share, which reads it as floats in a
   "same" convolution); the packing rounds dy for the dW share and W, W'; only the dW
   dot products (dw_dots, conv 1 -> 16) stay fp32 kernels, on the padded image rounded
   as it is copied in and the grid's dy rounded in db's sum pass (db from the unrounded
   values). On the sgemm-rounded and the emulated paths the fp32 kernels multiply
   bf16-rounded inputs exactly and sum in fp32 (pdp_gemm_bf16's sgemm-rounded arithmetic;
   the emulated path's chain is not run here): the padded image is rounded as it is
   copied in (pdp__conv_copy2d_bf16), the grid's dy in db's sum pass (pdp__conv_sum_bf16:
   in a "same" convolution the grid is the padded dy's interior, which holds all of dy),
   the padded dy apart otherwise, W' when it is built, and W for forward into the
   workspace's fixed region (free in forward). Either way the bits depend on the geometry
   and the path, not on the thread count. */

#ifndef PDP__CONV_CHUNK_FLOATS
#  define PDP__CONV_CHUNK_FLOATS PDP__TEST_KNOB(conv_chunk_floats, 65536)
#endif
/* Samples per chunk on the implicit path: wide GEMMs and few dW shares, and still
   8 chunks for each of two threads at batch 128. */
#ifndef PDP__CONV_IMPLICIT_CHUNK
#  define PDP__CONV_IMPLICIT_CHUNK PDP__TEST_KNOB(conv_implicit_chunk, 8)
#endif

/* Implicit path in bf16: the pdp_bf16_path of the products, the one AUTO takes for the
   forward product's shape (test_bf16 sets its knob to run the emulated path on a CPU with
   a faster one). */
#ifndef PDP__CONV_BF16_PATH
#  define PDP__CONV_BF16_PATH()                                                               \
      ((pdp_bf16_path)PDP__TEST_KNOB(conv_bf16_path,                                           \
                                     pdp_bf16_path_for(PDP_NO_TRANS, PDP_NO_TRANS, job->g.O,   \
                                                       job->g.Ho * job->g.Wo, job->g.ckk)))
#endif

/* Implicit path: products of at least this depth (C k k forward, O k k for dx)
   skip the band columns (pdp__sgemm_runs); shallower ones (conv 1 -> 16, k 5: 25)
   cost less computing the bands than setting up the runs' masked loads. */
#ifndef PDP__CONV_RUNS_MIN_K
#  define PDP__CONV_RUNS_MIN_K 128
#endif

typedef struct pdp__conv_geom {
    int64_t C, H, W, O, k, stride, pad, Ho, Wo;
    int64_t ckk;            /* rows of the column matrix */
    int implicit;           /* the implicit-GEMM path */
    int64_t Hp, q, Hq;      /* implicit: padded heights of x (by pad) and of dy (by q) */
    int64_t cols;           /* im2col: output columns per sample, Ho Wo */
    int64_t fixed;          /* workspace floats before the shares: W' (implicit) */
    int64_t share;          /* floats of one chunk's dW and db shares */
    int64_t per_chunk;      /* samples per chunk */
    int dw_t;               /* implicit: the dW share is computed and kept transposed,
                               [C k k, O] (fewer padded GEMM tiles, A read in place) */
    int dw_dots;            /* implicit: few weights (conv 1 -> 16, k 5), the dW share as
                               O C k k dot products (pdp__sgemm_dots, nothing packed) */
} pdp__conv_geom;

/* Workspace regions start on 64-byte boundaries (the offset tables are int64). */
PDP__PRIVATE int64_t pdp__conv_round16(int64_t floats);

PDP__PRIVATE pdp__conv_geom pdp__conv_geom_of(const pdp__layer *l);

/* Implicit path, a chunk of n samples: row widths of the padded image and padded dy. */
PDP__PRIVATE int64_t pdp__conv_wt(const pdp__conv_geom *g, int64_t n);
PDP__PRIVATE int64_t pdp__conv_wqt(const pdp__conv_geom *g, int64_t n);

/* Floats of one part's scratch for chunks of at most n samples. Implicit: the two
   offset tables (int64), the padded image and padded dy (the last run of each starts
   at (C - 1, k - 1, k - 1) and ends k - 1 floats past it: + k), and the grid that
   holds the output, dy, then dx. im2col: the column matrix and O rows as long. */
PDP__PRIVATE int64_t pdp__conv_scratch(const pdp__conv_geom *g, int64_t n);

/* Per sample: W' (once is enough; simpler per sample), one share, and twice a
   one-sample scratch. Enough: chunks <= batch, and scratch(n) <= n scratch(1) (each
   term is affine with a non-negative constant, and the rounding keeps it), so the parts' scratch
   for chunks of cap samples is at most chunks cap scratch(1) <= (batch + cap - 1) scratch(1). */
PDP__PRIVATE int64_t pdp__conv_work_per_sample(const pdp__layer *l);

/* Output columns [*lo, *hi) whose input column ow * stride - pad + kj is inside
   [0, W). */
PDP__PRIVATE void pdp__conv_valid(int64_t W, int64_t Wo, int64_t stride, int64_t pad, int64_t kj,
                                  int64_t *lo, int64_t *hi);

/* One sample's columns into col (row stride ld): row (c, ki, kj), column
   oh * Wo + ow holds x[c, oh s - pad + ki, ow s - pad + kj], zero outside the
   input. */
PDP__PRIVATE void pdp__im2col(const pdp__conv_geom *g, const float *PDP__RESTRICT x,
                              float *PDP__RESTRICT col, int64_t ld);

/* dx of one sample = the sum of its columns' entries over the positions they were
   copied from, in row order (a fixed summation order). */
PDP__PRIVATE void pdp__col2im(const pdp__conv_geom *g, const float *PDP__RESTRICT col, int64_t ld,
                              float *PDP__RESTRICT dx);

/* planes x rows x n floats from src (plane stride sp, row stride sr) into dst
   (plane stride dp, row stride dr). */
PDP__PRIVATE void pdp__conv_copy2d(const float *src, int64_t sp, int64_t sr, float *dst, int64_t dp,
                                   int64_t dr, int64_t planes, int64_t rows, int64_t n);

/* The same, each value rounded to bf16 as it is copied (pdp__bf16_round_u32's bits; a row
   is one to two 16-lane vectors with AVX-512): the padded image in bf16 on the fp32
   kernels, without a pass over it (its bands and padding are zeros). */
PDP__PRIVATE void pdp__conv_copy2d_bf16(const float *src, int64_t sp, int64_t sr, float *dst,
                                        int64_t dp, int64_t dr, int64_t planes, int64_t rows,
                                        int64_t n);

/* `body` for j in [0, n) of a short row (an image row: 28, 14 or 7 floats) in
   blocks of 16, 8 and 4, the remainder as the last 4 once more: constant trip
   counts, which gcc -O2 vectorises where PDP__FOR_BLOCKED's scalar tail would
   carry most of such a row. The body must be idempotent (write what it reads
   elsewhere). */
#define PDP__CONV_ROW(j, n, ...)                                                               \
    do {                                                                                       \
        int64_t pdp__o_ = 0, pdp__n_ = (n);                                                    \
        int pdp__k_;                                                                           \
        for (; pdp__o_ + 16 <= pdp__n_; pdp__o_ += 16)                                         \
            for (pdp__k_ = 0; pdp__k_ < 16; pdp__k_++) {                                       \
                int64_t j = pdp__o_ + pdp__k_;                                                 \
                __VA_ARGS__                                                                    \
            }                                                                                  \
        for (; pdp__o_ + 8 <= pdp__n_; pdp__o_ += 8)                                           \
            for (pdp__k_ = 0; pdp__k_ < 8; pdp__k_++) {                                        \
                int64_t j = pdp__o_ + pdp__k_;                                                 \
                __VA_ARGS__                                                                    \
            }                                                                                  \
        for (; pdp__o_ + 4 <= pdp__n_; pdp__o_ += 4)                                           \
            for (pdp__k_ = 0; pdp__k_ < 4; pdp__k_++) {                                        \
                int64_t j = pdp__o_ + pdp__k_;                                                 \
                __VA_ARGS__                                                                    \
            }                                                                                  \
        if (pdp__o_ < pdp__n_ && pdp__n_ >= 4)                                                 \
            pdp__o_ = pdp__n_ - 4;                                                             \
        if (pdp__o_ < pdp__n_ && pdp__n_ >= 4)                                                 \
            for (pdp__k_ = 0; pdp__k_ < 4; pdp__k_++) {                                        \
                int64_t j = pdp__o_ + pdp__k_;                                                 \
                __VA_ARGS__                                                                    \
            }                                                                                  \
        else                                                                                   \
            for (; pdp__o_ < pdp__n_; pdp__o_++) {                                             \
                int64_t j = pdp__o_;                                                           \
                __VA_ARGS__                                                                    \
            }                                                                                  \
    } while (0)

/* d = dy masked by y > 0 (the fused ReLU's backward), one row. */
PDP__PRIVATE void pdp__conv_relu_grad_row(const float *PDP__RESTRICT g,
                                          const float *PDP__RESTRICT y, float *PDP__RESTRICT d,
                                          int64_t n);

/* One sample's dy, [O, Ho, Wo], into dst (plane stride dp, row stride dr); with a
   fused ReLU, masked by the layer's output y (same layout as dy): the ReLU's
   backward, done on the way. With a fused pool, dy is the pool's [O, Ho/2, Wo/2],
   masked by the pooled y > 0 and written at each window's winner, zeros elsewhere:
   the pool's backward and the ReLU's (pdp__conv_unpool_2x2). */
PDP__PRIVATE void pdp__conv_copy_dy(const pdp__layer_io *io, int64_t s, const pdp__layer *l,
                                    float *dst, int64_t dp, int64_t dr);

/* Row n of y = src + bias, through the fused ReLU when there is one. */
PDP__PRIVATE void pdp__conv_store_row(const float *PDP__RESTRICT src, float bo, bool relu,
                                      float *PDP__RESTRICT dst, int64_t n);

/* Channel plane o of sample s of y from the products (row oh at src + oh ldr) plus
   the bias, through the fused ReLU; with a fused pool, two rows at a time straight
   into the pool's output and winners (pdp__conv_pool_2x2). */
PDP__PRIVATE void pdp__conv_store_plane(const pdp__layer_io *io, const pdp__layer *l, int64_t s,
                                        int64_t o, const float *src, int64_t ldr);

typedef struct pdp__conv_job {
    const pdp__layer *l;
    const pdp__layer_io *io;
    pdp__conv_geom g;
    int64_t chunks;
    int64_t scratch;  /* floats of each part's scratch: pdp__conv_scratch(chunk size) */
    int parts;
    const float *wt;  /* implicit backward: W' [C, O k k] */
    const float *w;   /* implicit forward: W as the products see it (io->w, or in bf16 on
                         the emulated path its rounding in the fixed region) */
    pdp_bf16_path path16; /* bf16: PDP__CONV_BF16_PATH() */
    int packed16;     /* implicit bf16 on AVX512-BF16 or AMX: the products are
                         pdp__gemm_bf16_rows_h / _arows_h on the image and dy converted */
} pdp__conv_job;

/* bf16: pdp__layers_sum(x, n), the same bits (its 16 lanes, then its tail and the lanes
   into a double, in its order), with x rounded in place in the same pass, each value after
   the sum took it: Conv2d's db share from dy, then dy for the products, in one read. */
PDP__PRIVATE double pdp__conv_sum_bf16(float *x, int64_t n);

/* Chunk c: its samples [s0, s1), where its dW and db shares go ([O, C k k] then
   [O]), and the scratch of the part that runs it. Workspace: the fixed part, the
   chunks' shares, then one scratch region per part, reused by all of the part's
   chunks so that it stays in cache. Implicit: the padded input, the padded dy and
   the grid; im2col: the column matrix [C k k, n] and O rows of n columns. */
typedef struct pdp__conv_chunk {
    int64_t s0, s1, n;   /* n: im2col columns (samples x Ho Wo) */
    float *share;
    int64_t wt, wqt;     /* implicit: row widths of the padded image and padded dy */
    int64_t *offx, *offdy;
    float *xp, *dyp, *grid;
    float *col, *out;    /* im2col */
} pdp__conv_chunk;

PDP__PRIVATE pdp__conv_chunk pdp__conv_chunk_of(const pdp__conv_job *job, int64_t c, int part);

/* ---- layers: Conv2d, implicit GEMM ---- */

/* W' for backward, run by the caller before the parts start. */
PDP__PRIVATE void pdp__conv_implicit_setup(pdp__conv_job *job);

/* The chunk's samples into its zeroed padded image (and their dy into the padded
   dy when dy is not NULL), and the offset tables of both. In bf16 the image is
   rounded for the fp32 kernels: every product on the emulated path, the dW dot
   products (dw_dots) in backward on the packed path. */
PDP__PRIVATE void pdp__conv_implicit_load(const pdp__conv_job *job, const pdp__conv_chunk *k,
                                          const float *dy, bool backward);

PDP__PRIVATE void pdp__conv_implicit_forward_part(void *arg, int i, int parts);

/* Implicit path: the chunk's dW share again, over the samples' own output columns only,
   when the GEMM's is not finite. The GEMM also runs over the grid's band columns, where dy
   is 0, and those read a sample's edge pixels with taps that reach past it: a NaN or an
   infinity there made 0 x inf = NaN in taps where PyTorch's sum has no such term. Here in
   double, x and dy rounded to bf16 in bf16 (the GEMM's inputs); the grid (row stride wt,
   sample j's columns from j (W + pad)) holds dy as the GEMM read it. A slow path, taken
   only for inputs that are not finite. */
PDP__PRIVATE void pdp__conv_implicit_dw_exact(const pdp__conv_job *job, const pdp__conv_chunk *k,
                                              const float *grid, int64_t ldg);

PDP__PRIVATE void pdp__conv_implicit_backward_part(void *arg, int i, int parts);

/* ---- layers: Conv2d, im2col ---- */

/* Forward of the chunks of part i: im2col; out [O, n] = W col; y = out + b. */
PDP__PRIVATE void pdp__conv_forward_part(void *arg, int i, int parts);

/* Backward of the chunks of part i: im2col again; dy gathered into out [O, n]; the
   chunk's dW share dy col^T and db share; then dcol = W^T out over col, and col2im
   into dx. */
PDP__PRIVATE void pdp__conv_backward_part(void *arg, int i, int parts);

/* ---- layers: Conv2d, driver ---- */

/* Parts: the caller's threads, at most one per chunk (scratch regions are sized
   for as many parts as samples). A single part runs on the caller without taking
   the pool, so its GEMMs can still use the threads. */
PDP__PRIVATE void pdp__conv_job_init(pdp__conv_job *job, const pdp__layer *l,
                                     const pdp__layer_io *io, bool backward);

PDP__PRIVATE pdp_status pdp__conv_forward(const pdp__layer *l, const pdp__layer_io *io);

PDP__PRIVATE pdp_status pdp__conv_backward(const pdp__layer *l, const pdp__layer_io *io);

/* ---- layers: Conv2d, setup and CUDA ---- */

PDP__PRIVATE pdp_status pdp__conv_setup(pdp__layer *l, pdp__param_shapes *ps, const char *in);

PDP__PRIVATE void pdp__conv_init(const pdp__layer *l, float *w, float *b, pdp_rng *r);

/* Workspace floats per sample of pdp_cuda.cu's conv kernels: they unfold the whole
   sample and keep the output beside it, (C k k + O) Ho Wo (cuda.h). */
PDP__PRIVATE int64_t pdp__conv_cuda_work(const pdp__layer *l);

#ifdef PDP_CUDA
/* The geometry pdp_cuda.cu's Conv2d and MaxPool2d kernels take. */
PDP__PRIVATE pdp_cudak_conv pdp__conv_cuda_geom(const pdp__layer *l, int64_t batch, int64_t O,
                                                int64_t pad);

PDP__PRIVATE pdp_status pdp__conv_cuda_forward(const pdp__layer *l, const pdp__layer_io *io);

PDP__PRIVATE pdp_status pdp__conv_cuda_backward(const pdp__layer *l, const pdp__layer_io *io);
#endif

/* ---- layers: MaxPool2d ---- */

typedef struct pdp__pool_job {
    const pdp__layer *l;
    const pdp__layer_io *io;
} pdp__pool_job;

/* The channel planes of part i: first element of each window, then the rest. */
PDP__PRIVATE void pdp__maxpool_forward_part(void *argp, int i, int parts);

/* Split by channel plane over the intra-op threads. */
PDP__PRIVATE pdp_status pdp__maxpool_forward(const pdp__layer *l, const pdp__layer_io *io);

/* The channel planes of part i: zero, then scatter each output's gradient to its
   winner (planes are independent, so any split gives the same bits). */
PDP__PRIVATE void pdp__maxpool_backward_part(void *argp, int i, int parts);

PDP__PRIVATE pdp_status pdp__maxpool_backward(const pdp__layer *l, const pdp__layer_io *io);

PDP__PRIVATE pdp_status pdp__maxpool_setup(pdp__layer *l, pdp__param_shapes *ps, const char *in);

#ifdef PDP_CUDA
PDP__PRIVATE pdp_status pdp__maxpool_cuda_forward(const pdp__layer *l, const pdp__layer_io *io);

PDP__PRIVATE pdp_status pdp__maxpool_cuda_backward(const pdp__layer *l, const pdp__layer_io *io);
#endif

/* ---- src/layers_gpt.c ---- */
/* layers_gpt: the math of a GPT's layers, forward and backward side by side (llm.c's
   layout), as plain functions on row-major fp32 arrays, then the layer kinds that call
   them (shapes, parameters, saved buffers: the end of this file). The kernels allocate
   nothing: the caller passes every output, saved and work buffer.

   Shapes: B sequences of T positions, channels C, H heads of D = C / H channels,
   vocabulary V. References: Vaswani et al., "Attention Is All You Need" (2017), for
   scaled dot-product and multi-head attention; Radford et al., "Language Models are
   Unsupervised Multitask Learners" (GPT-2, 2019), for the pre-LayerNorm block, learned
   positions and the tanh GELU; Ba, Kiros and Hinton, "Layer Normalization" (2016);
   nanoGPT's model.py and llm.c's train_gpt2.c for the layouts followed here.

   - Embedding: out[b, t, :] = wte[id[b, t], :] + wpe[t, :]. Backward scatter-adds:
     dwte[id[b, t], :] += dout[b, t, :] and dwpe[t, :] += sum over b of dout[b, t, :],
     in (b, t) order for every channel; threads split the channels, so the bits do not
     depend on the thread count even when an id repeats.
   - Attention (causal, multi-head): qkv [B, T, 3C] is the c_attn Linear's output,
     q, k and v side by side along the last dimension (nanoGPT's qkv.split(C, dim=2));
     head h of q is columns [h D, h D + D) of the q part. For each (b, h):
         S = Q K^T / sqrt(D)            [T, T] scores
         S[t, s] = -inf for s > t       the causal mask: t attends to 0..t only
         P = softmax(S) row by row      the attention probabilities, saved as att
         Pd = P o M / (1 - p)           attention dropout (training, p > 0)
         Y = Pd V                       [T, D], written to y[b, :, h D .. h D + D)
     y [B, T, C] is the heads side by side again (PyTorch's transpose(1, 2).view(B,
     T, C)). Backward from dy and the saved att (the probabilities before dropout):
         dV = Pd^T dY,  dPd = dY V^T,  dP = dPd o M / (1 - p)
         dS = P o (dP - rowsum(dP o P))   (the softmax's Jacobian, row by row)
         dQ = dS K / sqrt(D),  dK = dS^T Q / sqrt(D)
     Masked entries have P = 0 and dS = 0, so they give nothing to any product.
     Computed per (b, h), the pairs split over threads, a step per formula: each product
     one pdp_sgemm on qkv's strided rows (the masked half too: cheaper than T^2 / 2
     separate dot products; inside a part it runs on that part's thread, as threads.c
     runs a nested job, with gemm.c's bits), the softmax and its backward row by row
     (layers.c's vectorised exp, pdp__layers_exp_shift_run, and its fixed-order sums).
   - LayerNorm over the last dimension: layers.c's LayerNorm, which acts on each row of a
     [T, C] sample (l->positions).
   - GELU, tanh form: already pdp's GELU (math.h's pdp__gelu and pdp__gelu_grad), and
     layers.c's element-wise kernel acts on every position of a [T, C] sample.
   - Cross-entropy over [N, V] rows with ignore_index -1: loss.c's
     (pdp__cross_entropy_ignore, which pdp_model_forward_backward calls).

   Invariants: nothing allocated; outputs written (not accumulated) unless the
   function says +=; every reduction in a fixed order, whatever the thread count. */

/* #include "internal.h" (above) */

/* ---- gpt: token and position embedding ---- */

/* Every id of [B, T] in [0, V), or PDP_ERR_INVALID naming the first that is not, its
   position and why (appended: "" in the forward). */
PDP__PRIVATE pdp_status pdp__embed_check_ids(const int32_t *ids, int64_t B, int64_t T, int64_t V,
                                             const char *fn, const char *why);

/* out[b, t, :] = wte[ids[b, t], :] + wpe[t, :] for ids [B, T] (int32), wte [V, C], wpe
   [context, C], out [B, T, C]. T > context, or an id outside [0, V), is PDP_ERR_INVALID
   naming fn, the lengths or the position (b, t) and the id; out is then unspecified. */
PDP__PRIVATE pdp_status pdp__embed_forward(const int32_t *ids, int64_t B, int64_t T,
                                           int64_t context, int64_t V, int64_t C,
                                           const float *wte, const float *wpe, float *out,
                                           const char *fn);

typedef struct pdp__embed_job {
    const int32_t *ids;
    int64_t B, T, C;
    const float *dout;
    float *dwte, *dwpe;
} pdp__embed_job;

/* Part i of n: channels [lo, hi) of every row, in (b, t) order. */
PDP__PRIVATE void pdp__embed_backward_part(void *arg, int i, int n);

/* dwte[ids[b, t], :] += dout[b, t, :] and dwpe[t, :] += dout[b, t, :] for every (b, t),
   in that order per channel (ids checked by the forward). */
PDP__PRIVATE void pdp__embed_backward(const int32_t *ids, int64_t B, int64_t T, int64_t C,
                                      const float *dout, float *dwte, float *dwpe);

/* ---- gpt: causal self-attention ----
   Attention dropout draws its mask as pdp's Dropout layer does (math.h: a counter-
   based hash, no state carried between elements): element (h, t, s) of sequence b is
   kept when pdp__dropout_bits(pdp__dropout_key(seed, layer, step, sample_base + b),
   (h T + t) T + s) >= pdp__dropout_threshold(p). So a batch split over DP replicas
   (sample_base) draws the masks one device draws, and the backward regenerates the
   mask from the same key instead of storing it: att keeps P before dropout. */
typedef struct pdp__attn_dropout {
    float p;              /* drop probability in [0, 1); 0 (or the struct NULL): none */
    uint64_t seed, step;  /* the model's dropout seed and step counter */
    int layer;            /* the layer index that keys this attention's masks */
    int64_t sample_base;  /* index of sequence 0 of this batch in the global batch */
    int64_t head_base;    /* the global index of head 0 (a TP rank's first head; else 0) */
} pdp__attn_dropout;

typedef struct pdp__attn_job {
    const float *qkv, *att, *dy;
    float *y, *att_out, *dqkv, *work;
    int64_t B, T, C, H, D;
    float scale;
    int simd; /* the softmax's exp: layers.c's pdp__layers_simd */
    const pdp__attn_dropout *drop;
} pdp__attn_job;

/* Attention dropout is on: training with p > 0. */
PDP__PRIVATE bool pdp__attn_dropping(const pdp__attn_job *j);

/* The kept-and-rescaled factor M / (1 - p) of row t of (b, h)'s dropout mask, written to
   keep[0..t]. */
PDP__PRIVATE void pdp__attn_keep_row(const pdp__attn_job *j, int64_t b, int64_t h, int64_t t,
                                     float *keep);

/* A row's passes, on restrict parameters so that gcc -O2 vectorises them (see layers.c's
   pdp__layers_add); the sums are layers.c's fixed-order ones. The largest of p[0, n): */
PDP__PRIVATE float pdp__attn_row_max(const float *PDP__RESTRICT p, int64_t n);

PDP__PRIVATE void pdp__attn_row_div(float *PDP__RESTRICT p, float d, int64_t n);

/* dS = P o (dP - rowsum) scale, in place over dP */
PDP__PRIVATE void pdp__attn_row_dsoftmax(const float *PDP__RESTRICT p, float rowsum, float scale,
                                         float *PDP__RESTRICT dp, int64_t n);

/* The causal products run in blocks of PDP__ATTN_BLOCK query rows: rows [r0, r1) see keys
   [0, r1) only, so each block's products stop at column r1 instead of T (at T = 256, 62%
   of the full T x T products; the masked entries inside a block's columns are 0 in P and
   dS and add nothing). */
#ifndef PDP__ATTN_BLOCK
#  define PDP__ATTN_BLOCK 64
#endif

/* One (b, h) pair, forward, block by block: S = Q K^T / sqrt(D) by one GEMM, P row by
   row, Y = Pd V by one GEMM. w: T (T + 1) floats of work (Pd with dropout, a row of the
   mask). */
PDP__PRIVATE void pdp__attn_forward_head(const pdp__attn_job *j, int64_t b, int64_t h, float *w);

/* One (b, h) pair, backward (see the module comment), block by block from the last (whose
   dV and dK products cover every key row and write them) to the first (adding onto rows
   [0, r1)): a fixed order. dqkv's q, k and v columns of this head are written. w: T (T + 1)
   floats of work (Pd, then dP and dS; a row of the mask). */
PDP__PRIVATE void pdp__attn_backward_head(const pdp__attn_job *j, int64_t b, int64_t h, float *w);

/* Part i of n: the (b, h) pairs [B H i / n, B H (i + 1) / n), each computed whole by
   one thread, so the bits do not depend on the split. */
PDP__PRIVATE void pdp__attn_forward_part(void *arg, int i, int n);

PDP__PRIVATE void pdp__attn_backward_part(void *arg, int i, int n);

/* Below this many multiply-adds (B H T^2 D) the pool is not woken. */
#ifndef PDP__ATTN_PAR_MIN
#  define PDP__ATTN_PAR_MIN 8192
#endif

PDP__PRIVATE int pdp__attn_parts(const pdp__attn_job *j);

PDP__PRIVATE void pdp__attn_job_init(pdp__attn_job *j, int64_t B, int64_t T, int64_t C, int64_t H,
                                     const pdp__attn_dropout *drop, float *work);

/* Causal self-attention, forward: qkv [B, T, 3C] -> y [B, T, C], saving att [B, H, T, T]
   (P before dropout; 0 above the diagonal). drop: NULL or p == 0 for none (evaluation).
   work: B H T (T + 1) floats. C % H == 0 (the caller's setup checks it). */
PDP__PRIVATE void pdp__attention_forward(const float *qkv, int64_t B, int64_t T, int64_t C,
                                         int64_t H, const pdp__attn_dropout *drop, float *y,
                                         float *att, float *work);

/* Causal self-attention, backward: dqkv [B, T, 3C] (written) from dy [B, T, C], the
   forward's qkv and att, and the same drop (its mask is drawn again). work: B H T (T + 1)
   floats (like llm.c's datt, one att-sized buffer; a model can share it between layers).
   dqkv must not overlap qkv, att or dy. */
PDP__PRIVATE void pdp__attention_backward(const float *qkv, const float *att, const float *dy,
                                          int64_t B, int64_t T, int64_t C, int64_t H,
                                          const pdp__attn_dropout *drop, float *dqkv, float *work);

/* ---- gpt: the layer kinds ----
   The table's entries (layers_table.c) for a GPT's own kinds, on the kernels above:
   - Embedding: a sample is T token ids (int32, the model's input), its output [T, C] =
     wte[id] + wpe[t]; parameters "token.weight" [vocab, C] and "position.weight"
     [context, C] (a GPT builder names them transformer.wte / transformer.wpe).
   - CausalSelfAttention: [T, 3C] (the c_attn Linear's q | k | v) -> [T, C]; no
     parameters (c_attn and c_proj are plain Linears around it); saves att [H, T, T].
   - Residual and ResidualAdd: a residual region (model.c). Residual's forward is its
     input seen again (model.c aliases it); ResidualAdd's forward is y = x + skip, the
     region's input. Backward: ResidualAdd passes dy on to the branch (dx is dy itself,
     not copied) and sends it around in dskip; Residual adds it: dx = dy + dskip, the two
     paths' gradients summed where they split.
   - TiedLinear: y = x W^T with no bias, W a parameter another layer owns (a GPT's head,
     W = wte): its gradient accumulates into that parameter's, so the embedding's rows
     and the head's product sum into one dW, as autograd sums a tied Parameter's uses. */

PDP__PRIVATE pdp_status pdp__embedding_setup(pdp__layer *l, pdp__param_shapes *ps, const char *in);

/* N(0, 1), as torch.nn.Embedding (a GPT builder draws its own, N(0, 0.02)) */
PDP__PRIVATE void pdp__embedding_init(const pdp__layer *l, float *w, float *b, pdp_rng *r);

PDP__PRIVATE pdp_status pdp__embedding_forward(const pdp__layer *l, const pdp__layer_io *io);

/* The backward reads the forward's ids again (model.c keeps the input's pointer, not a copy):
   a caller that changed them since (a loader refilling its buffer) would scatter into rows
   past dwte. Checked again here, before anything is added: B T compares. */
PDP__PRIVATE pdp_status pdp__embedding_backward(const pdp__layer *l, const pdp__layer_io *io);

PDP__PRIVATE pdp_status pdp__attention_setup(pdp__layer *l, pdp__param_shapes *ps, const char *in);

/* The work buffer of a selectively recomputed attention: the kernels' work (B H T (T + 1)),
   then att (B H T T), then a scratch output (B T C). */
PDP__PRIVATE void pdp__attention_scratch(const pdp__layer *l, const pdp__layer_io *io,
                                         float **att, float **y);

PDP__PRIVATE void pdp__attention_drop(const pdp__layer *l, const pdp__layer_io *io,
                                      pdp__attn_dropout *d);

PDP__PRIVATE pdp_status pdp__attention_layer_forward(const pdp__layer *l, const pdp__layer_io *io);

PDP__PRIVATE pdp_status pdp__attention_layer_backward(const pdp__layer *l, const pdp__layer_io *io);

/* Residual and ResidualAdd: element passes split over the intra-op threads as
   layers.c's activations are (pdp__elem_run: ranges of 16, each element alone, so the
   bits never depend on the split). */
PDP__PRIVATE void pdp__residual_backward_range(const pdp__layer *l, const pdp__layer_io *io,
                                               int64_t lo, int64_t hi);

PDP__PRIVATE void pdp__residual_add_forward_range(const pdp__layer *l, const pdp__layer_io *io,
                                                  int64_t lo, int64_t hi);

PDP__PRIVATE void pdp__residual_add_backward_range(const pdp__layer *l, const pdp__layer_io *io,
                                                   int64_t lo, int64_t hi);

/* Residual: a forward view (model.c never calls its forward); backward dx = dy + dskip */
PDP__PRIVATE pdp_status pdp__residual_forward(const pdp__layer *l, const pdp__layer_io *io);

PDP__PRIVATE pdp_status pdp__residual_backward(const pdp__layer *l, const pdp__layer_io *io);

/* ResidualAdd: y = x + skip; backward dskip = dy (and dx = dy when asked: model.c does
   not ask, it lets dy itself go on into the branch) */
PDP__PRIVATE pdp_status pdp__residual_add_forward(const pdp__layer *l, const pdp__layer_io *io);

PDP__PRIVATE pdp_status pdp__residual_add_backward(const pdp__layer *l, const pdp__layer_io *io);

PDP__PRIVATE pdp_status pdp__tied_linear_setup(pdp__layer *l, pdp__param_shapes *ps, const char *in);

/* ---- gpt: the kinds' CUDA entries ----
   pdp_cuda.cu's kernels for the same formulas (its "GPT" sections). Embedding's backward
   sorts the positions by id into its CUDA workspace (an int32 a position:
   pdp__embedding_cuda_work); the attention's needs B H T T floats, within the H T (T + 1)
   per sample the CPU's setup asks for (selective recomputation: att and the scratch
   output after those, pdp__attention_scratch, as on the CPU). TiedLinear runs Linear's entries: no bias, and its
   io->w and io->dw are the tied parameter's (model.c). */

PDP__PRIVATE int64_t pdp__embedding_cuda_work(const pdp__layer *l);

#ifdef PDP_CUDA
PDP__PRIVATE pdp_status pdp__embedding_cuda_forward(const pdp__layer *l, const pdp__layer_io *io);

PDP__PRIVATE pdp_status pdp__embedding_cuda_backward(const pdp__layer *l, const pdp__layer_io *io);

PDP__PRIVATE void pdp__attention_cuda_geometry(const pdp__layer *l, const pdp__layer_io *io,
                                               pdp_cudak_attn *g);

PDP__PRIVATE pdp_status pdp__attention_cuda_forward(const pdp__layer *l, const pdp__layer_io *io);

PDP__PRIVATE pdp_status pdp__attention_cuda_backward(const pdp__layer *l, const pdp__layer_io *io);

/* Residual: a forward view (never called); backward dx = dy + dskip */
PDP__PRIVATE pdp_status pdp__residual_cuda_forward(const pdp__layer *l, const pdp__layer_io *io);

PDP__PRIVATE pdp_status pdp__residual_cuda_backward(const pdp__layer *l, const pdp__layer_io *io);

/* ResidualAdd: y = x + skip; backward dskip = dy and dx = dy */
PDP__PRIVATE pdp_status pdp__residual_add_cuda_forward(const pdp__layer *l,
                                                       const pdp__layer_io *io);

PDP__PRIVATE pdp_status pdp__residual_add_cuda_backward(const pdp__layer *l,
                                                        const pdp__layer_io *io);
#endif

/* ---- src/layers_tp.c ---- */
/* layers_tp: the layer kinds of tensor parallelism (tp.h has the design): f and g, the
   conjugate operators, the column- and row-parallel Linears, and sequence parallelism's
   three collectives and the backward of a LayerNorm on a rank's positions, as entries of
   layers_table.c. The API around them (the model's TP communicator, constructors,
   statistics, full-tensor checkpoints) is tp.c.

   The split Linears ARE Linear (layers.c's kernels, CPU and CUDA) on this rank's
   slice: a ColumnParallelLinear is a Linear of n_r outputs, a RowParallelLinear a
   Linear of n_r inputs whose bias only TP rank 0 adds. What is theirs is the slice:
   setup computes it (pdp_tp_split), init draws the full tensors from the model's
   generator in the plain Linear's order and keeps the slice. f and g are collective
   kinds (PDP__LAYER_COLLECTIVE): one host entry for every device that copies the
   activation and all-reduces it on the TP communicator, synchronously.

   Invariants: every rank of the TP communicator has the same layers in the same order,
   so f and g issue the same all-reduces in the same order; after g every rank holds
   the same bits. Nothing here allocates after the first forward, whose f runs the width
   check (tp.c: every TP rank built the same TP layers). */

/* #include "internal.h" (above) */

/* ---- tp: splits ---- */

/* PDP_API void pdp_tp_split(int64_t full, int rank, int size, int64_t *lo, int64_t *count) */

/* The layer that owns parameter p of m. A pipeline stage's parameters keep the full model's
   layer numbers and its layers are consecutive; an interleaved stage's (pp.c's joined
   chunks) are runs with gaps between them, found by a search. */
PDP__PRIVATE const pdp__layer *pdp__tp_param_layer(const pdp_model *m, int p);

/* Whether parameter p of m is split across the TP ranks: the column-parallel weight and
   bias, the row-parallel weight; every other parameter (the row-parallel bias, every
   non-TP layer's) is whole on every TP rank. */
PDP__PRIVATE bool pdp__tp_is_split(const pdp_model *m, int p);

/* ---- tp: f and g, the conjugate operators ---- */

/* The TP all-reduce (sum, synchronous) of count floats at buf, counted in the stats;
   what: "g forward" or "f backward", for messages. */
PDP__PRIVATE pdp_status pdp__tp_allreduce(const pdp__layer *l, float *buf, int64_t batch,
                                          int64_t width, bool forward);

/* dst <- src, count floats on io's device. */
PDP__PRIVATE pdp_status pdp__tp_copy(const pdp__layer_io *io, float *dst, const float *src,
                                     int64_t count);

PDP__PRIVATE pdp_status pdp__tp_op_setup(pdp__layer *l, const char *in);

PDP__PRIVATE pdp_status pdp__tp_copy_setup(pdp__layer *l, pdp__param_shapes *ps, const char *in);

PDP__PRIVATE pdp_status pdp__tp_reduce_setup(pdp__layer *l, pdp__param_shapes *ps, const char *in);

/* f forward: identity. At the first forward (and after TP layers were added) the width
   check first: every TP rank built the same TP layers (f is the first TP layer of every
   block, so every rank reaches it before any other TP collective). */
PDP__PRIVATE pdp_status pdp__tp_copy_forward(const pdp__layer *l, const pdp__layer_io *io);

/* f backward: the input gradient is the sum of every rank's partial gradient (each rank's
   ColumnParallelLinear saw only its output slice). Nothing when no input gradient is
   needed (f is the first layer): every rank skips it alike. */
PDP__PRIVATE pdp_status pdp__tp_copy_backward(const pdp__layer *l, const pdp__layer_io *io);

/* g forward: the sum of every rank's partial output (RowParallelLinear's x_r W_r^T). */
PDP__PRIVATE pdp_status pdp__tp_reduce_forward(const pdp__layer *l, const pdp__layer_io *io);

/* g backward: identity (the output gradient is replicated). */
PDP__PRIVATE pdp_status pdp__tp_reduce_backward(const pdp__layer *l, const pdp__layer_io *io);

/* ---- tp: sequence parallelism's collectives ----
   Between the TP blocks each rank holds Tl = T / N positions of every [T, C] sample (from
   tp_seq_lo = rank x Tl): its batch is [B, Tl, C], the full one [B, T, C]. The
   communicator's all-gather and reduce-scatter concatenate the ranks' blocks, [N, B, Tl,
   C]; pdp__tp_seq_permute moves between that and [B, T, C] in the workspace (B = 1: the
   same layout, no copy). Megatron-LM keeps [T, B, C] so that it needs none. */

/* The floats of one sample's slice (Tl x C): the smaller side of the layer. */
PDP__PRIVATE int64_t pdp__tp_seq_slice(const pdp__layer *l);

/* to_ranks: dst [N, B, slice] <- src [B, N, slice]; else the reverse. */
PDP__PRIVATE pdp_status pdp__tp_seq_permute(const pdp__layer *l, const pdp__layer_io *io,
                                            float *dst, const float *src, bool to_ranks);

/* Counts one sequence collective of the full tensor (batch x T x width floats) in the stats,
   t0 its start. */
PDP__PRIVATE void pdp__tp_seq_count(const pdp__layer *l, int64_t batch, bool gather, double t0);

/* full [B, T, C] <- every rank's slice [B, Tl, C]; what names the step for messages. */
PDP__PRIVATE pdp_status pdp__tp_seq_allgather(const pdp__layer *l, const pdp__layer_io *io,
                                              const float *slice, float *full, const char *what);

/* slice [B, Tl, C] <- this rank's positions of the sum over the ranks of full [B, T, C]. */
PDP__PRIVATE pdp_status pdp__tp_seq_reduce_scatter(const pdp__layer *l, const pdp__layer_io *io,
                                                   const float *full, float *slice,
                                                   const char *what);

/* dst [B, Tl, C] <- this rank's positions of src [B, T, C] (replicated). */
PDP__PRIVATE pdp_status pdp__tp_seq_split(const pdp__layer *l, const pdp__layer_io *io,
                                          const float *src, float *dst);

/* The three kinds: a [T, C] sample in, [T / N, C] out (Scatter, ReduceScatter), or the
   reverse (Gather); T must divide by the TP size. The workspace holds the full tensor
   (the permutation). */
PDP__PRIVATE pdp_status pdp__tp_seq_setup(pdp__layer *l, pdp__param_shapes *ps, const char *in);

/* The width check (tp.c) before the first sequence collective of a forward, as f's. */
PDP__PRIVATE pdp_status pdp__tp_seq_check(const pdp__layer *l);

/* ScatterToSequenceParallelRegion (after the embedding): forward keeps this rank's
   positions of the replicated input; backward all-gathers the slices' gradients. A
   ReduceScatterToSequenceParallelRegion (g) has the same backward. */
PDP__PRIVATE pdp_status pdp__tp_seq_scatter_forward(const pdp__layer *l, const pdp__layer_io *io);

PDP__PRIVATE pdp_status pdp__tp_seq_scatter_backward(const pdp__layer *l, const pdp__layer_io *io);

/* GatherFromSequenceParallelRegion: forward all-gathers the sequence. Backward, as f
   (tp_sum_dy: a ColumnParallelLinear follows, whose input gradient is this rank's partial
   sum), reduce-scatters; before replicated layers (the head) it keeps this rank's slice of
   the replicated gradient. */
PDP__PRIVATE pdp_status pdp__tp_seq_gather_forward(const pdp__layer *l, const pdp__layer_io *io);

PDP__PRIVATE pdp_status pdp__tp_seq_gather_backward(const pdp__layer *l, const pdp__layer_io *io);

/* ReduceScatterToSequenceParallelRegion (g): forward sums the RowParallelLinear's partial
   outputs and keeps this rank's positions. */
PDP__PRIVATE pdp_status pdp__tp_seq_reduce_scatter_forward(const pdp__layer *l,
                                                           const pdp__layer_io *io);

/* A LayerNorm (any tp_seq layer with parameters) on this rank's positions: its weight and
   bias gradients over them go to the workspace, one all-reduce over TP sums the ranks'
   (Megatron-LM sums the same gradients, once a step), and the sum is added to dw and db,
   so every rank accumulates the full sequence's gradient, the same bits, before any
   executor hears that the gradient is ready. The layer's own workspace (LayerNorm's chunk
   shares) follows them (pdp__tp_mark_sequence sizes the sum). */
PDP__PRIVATE pdp_status pdp__tp_seq_backward(const pdp__layer *l, const pdp__layer_io *io,
                                             pdp_status (*backward)(const pdp__layer *,
                                                                    const pdp__layer_io *));

/* ---- tp: the column- and row-parallel Linears ---- */

/* parts (tp_parts) blocks of tp_full / parts outputs, each split alike: rank r holds
   [tp_lo, tp_lo + n) of every block, its out_features parts x n. */
PDP__PRIVATE pdp_status pdp__tp_column_setup(pdp__layer *l, pdp__param_shapes *ps, const char *in);

/* The input is the slice [tp_lo, tp_lo + in_count) of tp_full features (pdp_model_add_
   row_parallel_linear took both from the ColumnParallelLinear before it). */
PDP__PRIVATE pdp_status pdp__tp_row_setup(pdp__layer *l, pdp__param_shapes *ps, const char *in);

/* `count` draws of pdp__layers_init_kaiming's generator for the tensor U(lo, hi) with the
   formula of pdp_tensor_uniform; element k is kept in dst[map(k)] when keep(k). The
   slice draws exactly what the full tensor would, in the same order. */
typedef struct pdp__tp_slice2d {
    int64_t cols;         /* the full tensor's row length */
    int64_t c0, c1;       /* kept columns [c0, c1) */
    int64_t r0, r1;       /* kept rows [r0, r1) of each of the parts blocks of rows */
    int64_t parts;        /* blocks of rows split alike (0 or 1: one) */
} pdp__tp_slice2d;

PDP__PRIVATE void pdp__tp_draw(float *dst, int64_t rows, pdp__tp_slice2d s, float lo, float hi,
                               pdp_rng *r);

/* The bounds pdp__layers_init_kaiming uses for fan_in (Kaiming uniform with a = sqrt(5),
   then the bias's 1/sqrt(fan_in)), computed as pdp_tensor_kaiming_uniform does. */
PDP__PRIVATE void pdp__tp_bounds(int64_t fan_in, float *wb, float *bb);

/* W1 [tp_full, in]: rows [tp_lo, tp_lo + n) of each part and the same entries of b1. */
PDP__PRIVATE void pdp__tp_column_init(const pdp__layer *l, float *w, float *b, pdp_rng *r);

/* W2 [d, tp_full]: columns [tp_lo, tp_lo + n); b2 whole. fan_in is the full width. */
PDP__PRIVATE void pdp__tp_row_init(const pdp__layer *l, float *w, float *b, pdp_rng *r);

/* Backward of Linear, without the input gradient when f is the first layer. */
PDP__PRIVATE pdp_status pdp__tp_column_backward(const pdp__layer *l, const pdp__layer_io *io);

/* x_r W_r^T, plus the bias on TP rank 0 only: g's sum then adds it once. */
PDP__PRIVATE pdp_status pdp__tp_row_forward(const pdp__layer *l, const pdp__layer_io *io);

#ifdef PDP_CUDA
PDP__PRIVATE pdp_status pdp__tp_column_cuda_backward(const pdp__layer *l, const pdp__layer_io *io);

PDP__PRIVATE pdp_status pdp__tp_row_cuda_forward(const pdp__layer *l, const pdp__layer_io *io);
#endif

/* ---- src/layers_table.c ---- */
/* layers_table: the table of layer kinds and the dispatch through it. One entry per
   kind (KANN's op table, kad_op_list, is the model): its name, setup (shape
   inference and validation, parameter shapes, saved and workspace floats),
   parameter initialisation, CPU forward and backward, CUDA forward and backward
   (pdp_cuda.cu's kernels), extra workspace on CUDA, flags (internal.h's
   PDP__LAYER_*: a view, element-wise, fuses a following ReLU, GELU or pool or is the one
   fused, collective, unnumbered, takes token ids, a view only forward, holds a residual
   skip, ties another layer's weight) and an estimate of its work in FLOPs (pp.c balances
   a pipeline's stages by it).

   This table is the only place that knows what each kind is. Every decision elsewhere
   that depends on it reads the flags: model.c's views and fusions, tp.c's element-wise
   kinds between the split Linears, the state_dict numbering (and pp.c's balance by work
   reads the FLOPs estimate, pdp__layer_flops); and model.c, dp.c and the
   executors run a layer through pdp__layer_setup, pdp__layer_forward and the other
   functions below, once per layer call (never per element). A kind's value is named
   elsewhere only by its own code: its constructor (model.c's pdp_model_add_*, tp.c's
   for the TP kinds, whose order rules name the kinds they follow), the TP kinds' slices
   (layers_tp.c, tp.c's checkpoints and width check), and the tests and
   tests/fake_cuda, which build layers of a kind.

   Adding a layer kind takes (the commit that added SiLU shows every step):
   1. math: a formula that the CPU and the CUDA kernels both compute goes into math.h as
      `static inline PDP__HOSTDEV` helpers (forward and its gradient), so the CPU tests
      cover the very code the kernels run;
   2. its code in layers.c (or a file of its own, listed in amalgamate.py before this
      one, as layers_conv.c): setup (pdp__layers_setup_same for a kind that keeps the
      shape and checks nothing), init when it has parameters, CPU forward and backward
      (they return PDP_OK, or a status whose message says what is wrong with the input;
      model.c names the layer), and its CUDA entries under #ifdef PDP_CUDA (see
      layers.c's conventions, and add the kind's to them when it has its own);
   3. its value in pdp__layer_kind (internal.h), appended before
      PDP__LAYER_KIND_COUNT, and its entry at the end of the table below (in the enum's
      order: C++ has no designators), with its flags and its FLOPs estimate (a
      pdp__flops_* function of the section "work estimates"; internal.h says what
      each promises: an element-wise kind gets PDP__LAYER_ELEMENTWISE and is then
      accepted inside a TP block with no edit to tp.c);
   4. its public constructor pdp_model_add_<kind> (model.h, with a comment naming the
      PyTorch module it equals; model.c, through pdp__layer_of and pdp__model_add);
   5. CUDA: its kernels and their plain C functions in pdp_cuda.cu (an activation is a
      pdp_cudak_act value in cuda.h and a case in pdp__act_fwd and pdp__act_bwd), declared
      in cuda.h; the same functions in tests/fake_cuda/fake_cuda.c, where each is a few
      lines that rebuild the layer and run pdp's CPU entry through fake__layer (an
      activation: its kind in fake__act_kind). tests/cuda_emu needs no edit: it runs
      pdp_cuda.cu as written (make emu-cuda-test runs the new kernels on the CPU);
      make cuda compiles them with nvcc;
   6. tests: in tests/test_layers.c, gradients against finite differences and the
      forward against a naive loop (layers_activation_grads_match_finite_differences
      and layers_linear_and_activations_match_naive take an activation; a kind of
      another shape gets tests of its own), and its name in
      layers_model_layer_name_names_every_layer (the table test covers the entry); a
      PyTorch fixture: a line in tools/gen_fixtures.py, run as
      `/usr/bin/python3 tools/gen_fixtures.py --out /tmp/fx`, copying only the new file
      into tests/fixtures/ (the others were written by torch 1.13: keep their bytes),
      and its case in tests/test_fixtures.c; in tests/test_cuda.c, a layer_case in
      build() and case_name (cuda_layers_match_cpu: the GPU against the CPU, on emulated
      GPUs under make emu-cuda-test and on real ones under tests/gpu/run.sh);
   7. docs: the constructor's comment (model.h); wherever src/manual.txt, README.md and
      the module comments list kinds (tp.h's table lists the element-wise ones); a line
      in CHANGELOG.md; then python3 amalgamate.py.
   A kind without CUDA entries (NULL) works on the CPU; on a CUDA device its calls
   fail with PDP_ERR_UNSUPPORTED naming the layer.

   Invariants: every kind has an entry (tests/test_layers.c checks the name, setup,
   forward and backward of each); a setup starts from output = input shape and
   nothing saved, workspace 0, no parameters. */

/* #include "internal.h" (above) */

#ifdef PDP_CUDA
#  define PDP__CUDA_ENTRY(fn) fn
#else
#  define PDP__CUDA_ENTRY(fn) NULL
#endif

/* ---- layers_table: work estimates ----
   Forward + backward FLOPs per sample from a layer's shapes: an estimate to balance a
   pipeline's stages by (pp.c, PDP_PP_BALANCE_WORK), not a measurement. A GEMM of
   (rows x k) by (k x n) counts 2 k n a row; an element-wise formula its operations as
   math.h writes them, a transcendental (expf, tanhf) counted as one. input_grad: the
   backward also computes the input's gradient (every layer but a model's first). */

/* in_count floats, each fwd operations forward, dparam for the parameters' gradients,
   dinput for the input's */
PDP__PRIVATE double pdp__flops_each(const pdp__layer *l, bool input_grad, double fwd,
                                    double dparam, double dinput);
/* y = x W^T + b: one GEMM forward, one for dW, one for dx; the bias's add and sum (each
   of a [T, C] sample's T rows is one row of the GEMMs: in_count = T C) */
PDP__PRIVATE double pdp__flops_linear(const pdp__layer *l, bool input_grad);
/* the same GEMMs without a bias */
PDP__PRIVATE double pdp__flops_tied_linear(const pdp__layer *l, bool input_grad);
/* a row gathered and a position added; backward scatter-adds each into two tables */
PDP__PRIVATE double pdp__flops_embedding(const pdp__layer *l, bool input_grad);
/* per head: S = Q K^T and Y = P V, 2 T^2 D each, so 4 T^2 C forward over the heads; the
   backward's four products twice that; the softmax and its gradient ~8 a score */
PDP__PRIVATE double pdp__flops_attention(const pdp__layer *l, bool input_grad);
/* the residual's add forward (ResidualAdd) and backward (Residual) */
PDP__PRIVATE double pdp__flops_residual(const pdp__layer *l, bool g);
PDP__PRIVATE double pdp__flops_residual_add(const pdp__layer *l, bool g);
/* the same GEMMs over im2col: out_count outputs, each a dot of C k k */
PDP__PRIVATE double pdp__flops_conv(const pdp__layer *l, bool input_grad);
/* k k compares an output; the backward adds each output's gradient at its winner */
PDP__PRIVATE double pdp__flops_maxpool(const pdp__layer *l, bool input_grad);
/* the element-wise kinds: math.h's forward, then its gradient */
PDP__PRIVATE double pdp__flops_relu(const pdp__layer *l, bool g);
PDP__PRIVATE double pdp__flops_gelu(const pdp__layer *l, bool g);
PDP__PRIVATE double pdp__flops_tanh(const pdp__layer *l, bool g);
PDP__PRIVATE double pdp__flops_sigmoid(const pdp__layer *l, bool g);
PDP__PRIVATE double pdp__flops_silu(const pdp__layer *l, bool g);
PDP__PRIVATE double pdp__flops_gelu_erf(const pdp__layer *l, bool g);
/* the mask's compare and scale; the backward's scale */
PDP__PRIVATE double pdp__flops_dropout(const pdp__layer *l, bool g);
/* mean, variance, normalise, affine; the affine's gradients, then the input's */
PDP__PRIVATE double pdp__flops_layernorm(const pdp__layer *l, bool g);

/* ---- layers_table: the table ---- */

/* C++ (the implementation compiled as C++, or by nvcc) has no array designators: there
   the entries go by their order, which must be pdp__layer_kind's (tests/test_build_cxx.sh
   compares every kind's name in a C++ build with a C build's) */
#ifdef __cplusplus
#  define PDP__KIND(k)
#else
#  define PDP__KIND(k) [k] =
#endif

/* name, setup, init, forward, backward, cuda_forward, cuda_backward, cuda_work, flags, flops */
extern const pdp__layer_kind_info pdp__layer_kinds[PDP__LAYER_KIND_COUNT];

/* The entry of kind k; NULL for a value outside the table. */
PDP__PRIVATE const pdp__layer_kind_info *pdp__layer_kind_of(pdp__layer_kind k);

PDP__PRIVATE const char *pdp__layer_kind_name(pdp__layer_kind k);

/* "ReLU, GELU, Tanh, Sigmoid": the names of the kinds with flag, in table order, for
   messages that say which kinds a place accepts. */
PDP__PRIVATE const char *pdp__layer_kinds_with(unsigned flag, char *buf, size_t cap);

/* ---- layers_table: setup and initialisation ---- */

PDP__PRIVATE pdp_status pdp__layer_setup(pdp__layer *l, pdp__param_shapes *ps);

PDP__PRIVATE void pdp__layer_init_params(const pdp__layer *l, float *w, float *b, pdp_rng *r);

/* Workspace floats per sample a layer needs on device d: the CPU's algorithm sizes
   its own (setup); on CUDA the larger of that and the kind's CUDA kernels' need. */
PDP__PRIVATE int64_t pdp__layer_work_per_sample(const pdp__layer *l, pdp_device d);

/* The kind's FLOPs estimate per sample (work estimates, above); 0 without one. */
PDP__PRIVATE double pdp__layer_flops(const pdp__layer *l, bool input_grad);

/* ---- layers_table: forward and backward ---- */

/* A CUDA entry's call: pdp_cuda.cu's message on failure; without the entry (or
   without PDP_CUDA), PDP_ERR_UNSUPPORTED. */
PDP__PRIVATE pdp_status pdp__layer_cuda(const pdp__layer *l, const pdp__layer_io *io,
                                        pdp_status (*fn)(const pdp__layer *, const pdp__layer_io *));

/* CUDA memory goes to the kind's CUDA entry (pdp_cuda.cu's kernels); the rest is
   CPU memory. A collective kind's host entry runs on every device. Either entry's
   status comes back as it is (the caller names the layer). */
PDP__PRIVATE pdp_status pdp__layer_forward(const pdp__layer *l, const pdp__layer_io *io);

PDP__PRIVATE pdp_status pdp__layer_backward_on(const pdp__layer *l, const pdp__layer_io *io);

/* A layer with parameters on a slice of the sequence (sequence parallel: a LayerNorm
   between TP blocks) has its gradients summed over the TP ranks' slices (layers_tp.c). */
PDP__PRIVATE pdp_status pdp__layer_backward(const pdp__layer *l, const pdp__layer_io *io);

/* ---- src/model.c ---- */
/* model: the sequential container. Owns the layer list, the parameter registry
   and the flat parameter and gradient blocks, sizes the activation buffers, and
   drives forward and backward over the layers through the table of kinds
   (layers_table.c).

   Invariants: params[i].offset is the sum of the counts before it (registration
   order, no gaps), so the gradient of parameters j..k is one contiguous range;
   act[i] holds layer i's output from the last forward (Flatten aliases its
   input instead of copying, and so does a ReLU after a Conv2d on the CPU, which the
   Conv2d applies itself; when a 2x2 stride-2 MaxPool2d follows that ReLU, the Conv2d
   applies it too, writes the pool's act, and its own act is NULL; a GELU after a Linear
   on the CPU is applied by the Linear, which writes both acts); backward needs
   the forward's input to stay alive, as in PyTorch's autograd. A residual region
   (pdp_model_residual_begin/end) is the one place the sequence is not a chain: its
   ResidualAdd reads the output of its Residual (a forward view, so act[] of the region's
   input), and in backward sends its dy around the branch in grad_skip, which the
   Residual adds back; regions do not nest, so one skip buffer serves them all. A
   TiedLinear's weight is another layer's parameter (pdp__model_io). After
   pdp_model_reserve (or the first step at the largest batch), forward and backward
   allocate nothing.

   The executor seam (internal.h): an executor may listen to the pass's events
   (m->event: before each layer that computes with parameters, its own or a tied one,
   forward, backward and in a region FULL recomputation runs again inside backward, and
   at the start and end of every backward: DDP and ZeRO synchronise any backward this
   way, ZeRO-3 gathers each layer's parameters) and point a layer's weight/bias and
   their gradients at buffers of its own (m->layer_w, m->layer_dw: ZeRO's per-unit
   buffers). Both are off (NULL) by default: one pointer test per layer. */

/* #include "internal.h" (above) */

/* ---- model: lifecycle ---- */

/* PDP_API pdp_status pdp_model_create(pdp_model **out, const pdp_model_desc *desc) */

/* The desc the model was made by, as in use: input_ndim and input_shape resolved,
   precision the current one (pdp_model_set_precision may change it). */
/* PDP_API pdp_model_desc pdp_model_get_desc(const pdp_model *m) */

PDP__PRIVATE void pdp__model_free_buffers(pdp_model *m);

/* PDP_API void pdp_model_free(pdp_model *m) */

/* ---- model: the executor holding it ---- */

/* "ZeRO stage 3 (pdp_zero_create)": an executor, for messages. */
PDP__PRIVATE const char *pdp__wrap_name(pdp__wrap kind, int stage);

PDP__PRIVATE const char *pdp__model_wrapper(const pdp_model *m);

PDP__PRIVATE pdp_status pdp__model_wrap(pdp_model *m, pdp__wrap kind, int stage, const char *fn);

PDP__PRIVATE pdp_status pdp__model_check_whole(const pdp_model *m, const char *fn);

/* PDP_ERR_STATE while the model's backward runs: a grad hook (model.h) that calls fn on the
   model it was called for would overwrite (a forward: the activations and the input backward
   still reads) or free (a larger batch's re-plan, a new layer) what that backward goes on to
   read. */
PDP__PRIVATE pdp_status pdp__model_check_idle(const pdp_model *m, const char *fn);

PDP__PRIVATE void pdp__model_unwrap(pdp_model *m);

PDP__PRIVATE pdp_status pdp__model_check_layout(const pdp_model *m, const char *what,
                                                const char *fn);

/* ---- model: adding layers ---- */

/* Grows an array of n used elements to hold one more; *cap doubles. */
PDP__PRIVATE pdp_status pdp__grow(void **arr, int n, int *cap, size_t elem);

/* The state_dict number of the next layer: layers so far, less the unnumbered ones
   (PDP__LAYER_UNNUMBERED: TP's f and g). */
PDP__PRIVATE int pdp__model_next_number(const pdp_model *m);

PDP__PRIVATE pdp_status pdp__model_register(pdp_model *m, int layer, const char *what, int ndim,
                                            const int64_t *shape);

/* Token ids enter a model once, at its first layer: a kind that takes ids
   (PDP__LAYER_TAKES_IDS: Embedding) only as layer 0 of a model whose input is int32, and a
   model whose input is int32 only with such a kind first. */
PDP__PRIVATE pdp_status pdp__model_check_ids(const pdp_model *m, const pdp__layer *l);

/* The floats the parameter and gradient blocks hold (internal.h: param_cap). */
PDP__PRIVATE int64_t pdp__model_param_cap(const pdp_model *m);

/* A block's first bytes: src's, or zeros where src is absent (an executor's free that
   could not restore it). */
PDP__PRIVATE pdp_status pdp__model_keep(pdp_device d, float *dst, const float *src, size_t bytes);

/* Both blocks reallocated to cap floats, their first keep floats kept. */
PDP__PRIVATE pdp_status pdp__model_resize_params(pdp_model *m, int64_t keep, int64_t cap);

PDP__PRIVATE pdp_status pdp__model_reserve_params(pdp_model *m, int64_t count);

PDP__PRIVATE pdp_status pdp__model_fit_params(pdp_model *m);

/* The new layer's parameters, [first, param_count) of the block, drawn by its init (on
   the host, then copied, for a device's block) and their gradients zeroed. */
PDP__PRIVATE pdp_status pdp__model_init_new(pdp_model *m, const pdp__layer *l,
                                            const pdp__param_shapes *ps, int64_t first);

/* Appends layer l (kind and configuration filled in by the caller): infers its
   shapes, registers and initialises its parameters, and moves the parameter and
   gradient blocks to their new size. On failure the model is unchanged. */
PDP__PRIVATE pdp_status pdp__model_add(pdp_model *m, pdp__layer l, const char *fn);

PDP__PRIVATE pdp__layer pdp__layer_of(pdp__layer_kind kind);

/* PDP_API pdp_status pdp_model_add_linear(pdp_model *m, int64_t out_features) */

/* PDP_API pdp_status pdp_model_add_relu(pdp_model *m) */

/* PDP_API pdp_status pdp_model_add_gelu(pdp_model *m) */

/* PDP_API pdp_status pdp_model_add_tanh(pdp_model *m) */

/* PDP_API pdp_status pdp_model_add_sigmoid(pdp_model *m) */

/* PDP_API pdp_status pdp_model_add_silu(pdp_model *m) */

/* PDP_API pdp_status pdp_model_add_gelu_erf(pdp_model *m) */

/* PDP_API pdp_status pdp_model_add_dropout(pdp_model *m, float p) */

/* PDP_API pdp_status pdp_model_add_layernorm(pdp_model *m, float eps) */

/* PDP_API pdp_status pdp_model_add_conv2d(pdp_model *m, int64_t out_channels, int64_t kernel, int64_t stride, int64_t padding) */

/* PDP_API pdp_status pdp_model_add_maxpool2d(pdp_model *m, int64_t kernel, int64_t stride) */

/* ---- model: a GPT's layers ---- */

/* PDP_API pdp_status pdp_model_add_embedding(pdp_model *m, int64_t vocab, int64_t dim, int64_t context) */

/* tp.c: an attention after a ColumnParallelLinear split by heads becomes the attention of
   this rank's heads (l->heads local, l->tp_lo its first global head, l->tp_full every
   head); else l is left as it is. */
PDP__PRIVATE pdp_status pdp__tp_headwise(const pdp_model *m, pdp__layer *l, const char *fn);

/* PDP_API pdp_status pdp_model_add_causal_self_attention(pdp_model *m, int64_t heads, float dropout) */

/* A residual region: a Residual layer opens it (its forward is its input seen again), a
   ResidualAdd closes it (y = x + the Residual's input). Backward, the ResidualAdd sends its
   dy around the branch in grad_skip and the Residual adds it to the branch's gradient. */
/* PDP_API pdp_status pdp_model_residual_begin(pdp_model *m) */

/* PDP_API pdp_status pdp_model_residual_end(pdp_model *m) */

/* PDP_API pdp_status pdp_model_add_tied_linear(pdp_model *m, const char *param) */

/* PDP_API pdp_status pdp_model_add_flatten(pdp_model *m) */

/* ---- model: buffers ---- */

/* Whether layer i's kind has flag (PDP__LAYER_*). */
PDP__PRIVATE bool pdp__model_flag(const pdp_model *m, int i, unsigned flag);

/* Layer i is a ReLU (PDP__LAYER_FUSABLE_RELU) that the layer before it (a Conv2d or a
   Linear: PDP__LAYER_FUSES_RELU) applies in its own forward and backward (CPU only; never the
   last layer, whose output the caller reads): the ReLU is then a view, as Flatten, and
   is skipped. Same bits as running it. */
PDP__PRIVATE bool pdp__model_relu_fused(const pdp_model *m, int i);

/* Layer i is a 2x2 stride-2 max pool (PDP__LAYER_FUSABLE_POOL: MaxPool2d) over an even
   H and W after a fused ReLU, which the Conv2d before that (PDP__LAYER_FUSES_POOL)
   applies too: the Conv2d writes this layer's output and saved winners, and takes its
   output's gradient; this layer is skipped, and the Conv2d's own output never exists.
   Same bits. */
PDP__PRIVATE bool pdp__model_pool_fused(const pdp_model *m, int i);

/* Layer i is a GELU (PDP__LAYER_FUSABLE_GELU) that the layer before it (a Linear:
   PDP__LAYER_FUSES_GELU) applies in its own forward and backward (CPU only): the Linear
   writes this layer's output beside its own (the GELU's input, which the GELU's backward
   reads) and takes this layer's output gradient; this layer is skipped. Same bits. */
PDP__PRIVATE bool pdp__model_gelu_fused(const pdp_model *m, int i);

/* Layer i is applied by a layer before it, which writes its output (a fused pool or
   GELU): skipped in forward and backward. */
PDP__PRIVATE bool pdp__model_applied_before(const pdp_model *m, int i);

/* Layer i is the Conv2d that applies the pool two layers on (pdp__model_pool_fused). */
PDP__PRIVATE bool pdp__model_pools(const pdp_model *m, int i);

/* Layer i's output is its input seen again (PDP__LAYER_VIEW: Flatten; a fused ReLU):
   no buffer, no call. */
PDP__PRIVATE bool pdp__model_is_view(const pdp_model *m, int i);

/* Layer i runs in backward: not a view, or a view whose backward has work
   (PDP__LAYER_FORWARD_VIEW: a Residual), and not a pool a Conv2d applied or a GELU a
   Linear applied. */
PDP__PRIVATE bool pdp__model_runs_backward(const pdp_model *m, int i);

/* The model has a residual region (a kind that needs grad_skip). */
PDP__PRIVATE bool pdp__model_has_skip(const pdp_model *m);

/* Layer i's output needs a buffer: not a view, and not a Conv2d whose pool is fused. */
PDP__PRIVATE bool pdp__model_has_output(const pdp_model *m, int i);

/* Per-sample floats of the activation buffers (one plan for pdp_model_reserve and for
   DP's memory accounting): outputs of the layers that are not views, what forward
   keeps for backward, the largest workspace, and the widest activation (the two
   gradient ping-pong buffers). saved_off, when not NULL, gets each layer's offset. */
typedef struct pdp__model_plan {
    int64_t act, saved, work, widest;
    int64_t kept_act, kept_saved; /* of act and saved, what outlives a forward; the rest is
                                     the scratch of recomputed regions (FULL) */
} pdp__model_plan;

/* *acc += v, or INT64_MAX (which stays) past PDP__COUNT_MAX: reserve then fails. */
PDP__PRIVATE void pdp__model_plan_add(int64_t *acc, int64_t v);

/* Layer i is inside a residual region that FULL recomputation runs again in backward:
   after its Residual, before its ResidualAdd. */
PDP__PRIVATE bool pdp__model_recomputed(const pdp_model *m, int i);

/* FULL: the first layer of the region whose forward backward runs again before layer i's
   backward (i its ResidualAdd; the region is layers [that, i)), or -1. */
PDP__PRIVATE int pdp__model_recompute_from(const pdp_model *m, int i);

PDP__PRIVATE pdp__model_plan pdp__model_plan_of(const pdp_model *m, int64_t *saved_off);

/* Points the outputs of the layers that are not views at activation set m->slot. */
PDP__PRIVATE void pdp__model_bind_acts(pdp_model *m);

/* PDP_API pdp_status pdp_model_reserve(pdp_model *m, int64_t max_batch) */

/* ---- model: forward and backward ---- */

/* What layer i's forward keeps for its backward, in the current activation set. */
PDP__PRIVATE float *pdp__model_saved(const pdp_model *m, int i);

/* Fills the per-call part of io for layer i. */
PDP__PRIVATE void pdp__model_io(const pdp_model *m, int i, pdp__layer_io *io);

/* Layer i computes with parameters: its own, or another layer's (PDP__LAYER_TIED). The
   executor seam's per-layer events fire for these layers. */
PDP__PRIVATE bool pdp__model_uses_params(const pdp_model *m, int i);

/* A trace event "forward 3 Linear" on the model's track (DDP sets it), t0 to now. */
PDP__PRIVATE void pdp__model_trace(const pdp_model *m, const char *what, int i, double t0);

/* The profile's split (pdp_profile): a layer with weights counts as GEMM work. */
PDP__PRIVATE void pdp__model_profile(const pdp__layer *l, double t0);

/* Forward through layers [lo, hi) from in (layer lo's input), firing ev before each layer
   with parameters: FORWARD_LAYER in a forward, RECOMPUTE_LAYER when FULL recomputation runs
   a region again inside backward. */
PDP__PRIVATE pdp_status pdp__model_forward_layers(pdp_model *m, int lo, int hi, const float *in,
                                                  pdp__model_event ev);

/* PDP_API pdp_status pdp_model_forward(pdp_model *m, const pdp_tensor *x, const pdp_tensor **y) */

/* PDP_API pdp_status pdp_model_backward(pdp_model *m, const pdp_tensor *dy) */

/* PDP_API pdp_status pdp_model_backward_dx(pdp_model *m, const pdp_tensor *dy, pdp_tensor *dx) */

/* A hash (FNV-1a over 32-bit words) of m's parameters but those skip(m, p) names (NULL:
   none), for ranks that must hold the same bits (a TP group's replicated tensors, every
   rank's copy of a pipeline's model); 0 when the parameters are not here (ZeRO-3 holds
   them as shards). A GPU model's tensors are copied to the host one at a time. */
PDP__PRIVATE pdp_status pdp__model_param_hash(const pdp_model *m,
                                              bool (*skip)(const pdp_model *, int),
                                              uint64_t *out);

/* PDP_API void pdp_model_zero_grad(pdp_model *m) */

/* PDP_API void pdp_model_set_training(pdp_model *m, bool training) */

/* PDP_API bool pdp_model_is_training(const pdp_model *m) */

/* PDP_API pdp_status pdp_model_set_precision(pdp_model *m, pdp_precision precision) */

/* PDP_API pdp_precision pdp_model_precision(const pdp_model *m) */

/* PDP_API void pdp_model_set_grad_hook(pdp_model *m, pdp_grad_hook fn, void *user) */

/* ---- model: queries ---- */

/* PDP_API int pdp_model_num_layers(const pdp_model *m) */

/* PDP_API const char *pdp_model_layer_name(const pdp_model *m, int layer) */

/* PDP_API int pdp_model_output_shape(const pdp_model *m, int64_t shape[3]) */

/* PDP_API int64_t pdp_model_param_count(const pdp_model *m) */
/* PDP_API int pdp_model_num_params(const pdp_model *m) */
/* PDP_API pdp_device pdp_model_device(const pdp_model *m) */

/* A view of count floats at data (1-d; the parameter's shape when full), or an empty
   one (data NULL, count 0) where data is NULL: a block the executor took away. */
PDP__PRIVATE void pdp__model_view(float *data, pdp_device d, const pdp__param_entry *e, bool full,
                                  int64_t count, pdp_tensor *out);

/* PDP_API pdp_status pdp_model_param(const pdp_model *m, int index, pdp_param *out) */

/* PDP_API pdp_status pdp_model_find_param(const pdp_model *m, const char *name, pdp_param *out) */

/* PDP_API pdp_status pdp_model_flat(const pdp_model *m, pdp_tensor *params, pdp_tensor *grads) */

/* ---- model: memory ---- */

/* PDP_API int64_t pdp_model_activation_bytes(const pdp_model *m, int lo, int hi, int64_t batch) */

/* Renames parameter p (a builder's names: pdp_gpt_create's nanoGPT ones). A name that is
   empty, too long or already another parameter's is PDP_ERR_INVALID. */
PDP__PRIVATE pdp_status pdp__model_rename_param(pdp_model *m, int p, const char *name);

/* ---- model: replicas ---- */

PDP__PRIVATE pdp_status pdp__model_clone(const pdp_model *src, pdp_device device, bool share_params,
                                         pdp_model **out);

/* A model with full's layers and parameter registry and a zeroed parameter block, no
   gradients, no executor: the staging copy pp.c saves and loads the full model's
   checkpoint through (with_block false: the layout alone, which a pipeline keeps). */
PDP__PRIVATE pdp_status pdp__model_layout(const pdp_model *full, bool with_block, pdp_model **out);

/* ---- model: pipeline stages ---- */

PDP__PRIVATE pdp_status pdp__model_stage(const pdp_model *full, int lo, int hi, pdp_model **out);

PDP__PRIVATE pdp_status pdp__model_set_slots(pdp_model *m, int nslots);

PDP__PRIVATE void pdp__model_use_slot(pdp_model *m, int slot, const float *x, int64_t batch,
                                      bool forwarded);

/* ---- src/loss.c ---- */
/* loss: softmax cross-entropy over integer labels and mean squared error, as
   torch.nn.functional.cross_entropy and mse_loss with reduction='mean'; the
   one-call training pass pdp_model_forward_backward; and accuracy counting.

   Cross-entropy per sample is logsumexp(z) - z[label], computed stably as
   m + log(sum exp(z - m)) with m = max(z) and the sum in double; the batch sum
   is accumulated in double in sample order. Its gradient is
   (softmax(z) - onehot(label)) * grad_scale. A label outside [0, classes) is
   PDP_ERR_INVALID and a non-finite loss PDP_ERR_NUMERIC, both naming the sample,
   so a diverging run stops where it diverged instead of training on NaN. On a
   CUDA device the same formulas run in pdp_cuda.cu (cuda_host.c dispatches);
   the per-sample losses come back and are summed here in sample order.

   Threads: the rows split over the intra-op threads (contiguous ranges), each row's
   loss kept in the caller's scratch (pdp__thread_scratch, grown once) and summed
   afterwards in row order; each part keeps its row's exp(z - m) there too, so that
   exp runs once per logit, not twice. Every row is computed alone and the sum's order
   is fixed, so the bits do not depend on the thread count, and they are those of the
   one-row-at-a-time loop (a double's exp is the same whether kept or recomputed).
   GPT-2's 256 rows of 50257 logits: 101 ms on one thread before, 61 ms on one thread
   and 31 ms on two after (Sapphire Rapids, 2 cores). */

/* #include "internal.h" (above) */

/* Logits below which the cross-entropy stays on one thread: each costs an exp (double),
   several times an element pass's work per float, so a sixteenth of layers.c's
   PDP__ELEMWISE_PAR_MIN. */
#ifndef PDP__CE_PAR_MIN
#  define PDP__CE_PAR_MIN 16384
#endif

/* ---- loss: cross-entropy ---- */

/* One row: returns logsumexp(z) - z[label] and, dlogits not NULL, writes d = (softmax(z) -
   onehot(label)) * grad_scale. e: room for V doubles (exp(z - m), computed once), or NULL
   (computed twice: the same values). */
PDP__PRIVATE double pdp__cross_entropy_row(const float *z, int32_t label, int64_t V,
                                           float grad_scale, float *d, double *e);

typedef struct pdp__ce_job {
    const float *logits;
    const int32_t *labels;
    int64_t rows, V;
    float grad_scale;
    float *dlogits;  /* or NULL */
    double *loss;    /* [rows]: each row's loss (0 for an ignored row) */
    double *e;       /* [parts, V]: each part's exp(z - m), or NULL */
} pdp__ce_job;

/* Part i of n: rows [rows i / n, rows (i + 1) / n). Label -1: an ignored row (loss 0,
   dlogits 0; the caller checked every other label). */
PDP__PRIVATE void pdp__ce_part(void *arg, int i, int n);

/* Rows [0, rows) (labels checked by the caller, -1 ignored) over the intra-op threads;
   *loss_sum the sum of the rows' losses in row order. A non-finite loss: *bad its row,
   *loss_sum that loss, and PDP_ERR_NUMERIC (the caller names it); else *bad = -1. Out
   of memory for the losses: one row at a time, as before there were threads. */
PDP__PRIVATE pdp_status pdp__cross_entropy_run(const float *logits, const int32_t *labels,
                                               int64_t rows, int64_t V, float grad_scale,
                                               double *loss_sum, float *dlogits, int64_t *bad);

PDP__PRIVATE pdp_status pdp__cross_entropy(const float *logits, const int32_t *labels,
                                           int64_t batch, int64_t classes, float grad_scale,
                                           double *loss_sum, float *dlogits, const char *fn);

/* pdp__cross_entropy with logits and dlogits on device d (CUDA: cuda_host.c). */
PDP__PRIVATE pdp_status pdp__cross_entropy_on(pdp_device d, const float *logits,
                                              const int32_t *labels, int64_t batch, int64_t classes,
                                              float grad_scale, double *loss_sum, float *dlogits,
                                              const char *fn);

/* ---- loss: cross-entropy with ignored rows ----
   loss = mean over the rows whose label is not -1 of logsumexp(z) - z[label] (PyTorch's
   cross_entropy(ignore_index=-1, reduction='mean')); dlogits = (softmax(z) -
   onehot(label)) / count on those rows, 0 on ignored ones. Every row ignored: PyTorch
   returns NaN (0 / 0); here the loss is 0 and dlogits 0, a batch that teaches nothing,
   and *count says so. A label outside [0, V) other than -1 is PDP_ERR_INVALID naming
   fn, the row and the label, checked before anything is written. */

/* The rows whose label is not -1, checking the others are in [0, V): *count. */
PDP__PRIVATE pdp_status pdp__cross_entropy_count(const int32_t *labels, int64_t N, int64_t V,
                                                 int64_t *count, const char *fn);

/* The sum over rows not ignored of the row losses (into *loss_sum, in double, in row
   order), dlogits = (softmax - onehot) x grad_scale on them and 0 on ignored rows: the
   part of a batch's loss that one replica or rank holds (grad_scale = 1 / the whole
   batch's count). Labels checked first (pdp__cross_entropy_count). */
PDP__PRIVATE pdp_status pdp__cross_entropy_rows(const float *logits, const int32_t *labels,
                                                int64_t N, int64_t V, float grad_scale,
                                                double *loss_sum, float *dlogits, const char *fn);

/* pdp__cross_entropy_rows with logits and dlogits on device d (CUDA: cuda_host.c's). */
PDP__PRIVATE pdp_status pdp__cross_entropy_rows_on(pdp_device d, const float *logits,
                                                   const int32_t *labels, int64_t N, int64_t V,
                                                   float grad_scale, double *loss_sum,
                                                   float *dlogits, const char *fn);

PDP__PRIVATE pdp_status pdp__cross_entropy_ignore(const float *logits, const int32_t *labels,
                                                  int64_t N, int64_t V, float *loss,
                                                  int64_t *count, float *dlogits, const char *fn);

PDP__PRIVATE bool pdp__loss_same_device(const pdp_tensor *a, const pdp_tensor *b);

/* A tensor the losses read or write as floats (an int32 tensor's bits are not). */
PDP__PRIVATE pdp_status pdp__loss_check_floats(const pdp_tensor *t, const char *what,
                                               const char *fn);

/* Shared argument checks of the public losses: a 2-D float tensor [batch, classes]. */
PDP__PRIVATE pdp_status pdp__loss_check_logits(const pdp_tensor *t, const char *what,
                                               const char *fn);

/* Shape equality for messages "dlogits is [3, 4], logits is [3, 5]". */
PDP__PRIVATE bool pdp__loss_same_shape(const pdp_tensor *a, const pdp_tensor *b);

/* PDP_API pdp_status pdp_loss_cross_entropy(const pdp_tensor *logits, const int32_t *labels, float *loss, pdp_tensor *dlogits) */

/* ---- loss: mean squared error ---- */

/* PDP_API pdp_status pdp_loss_mse(const pdp_tensor *pred, const pdp_tensor *target, float *loss, pdp_tensor *dpred) */

/* ---- loss: training pass and accuracy ---- */

/* Cross-entropy of the model's output y against labels, one a row of y's last dimension
   ([B, K]: one a sample; [B, T, V]: one a position), -1 ignored; dy into the model's own
   grad_a, which backward accepts as dy (it ping-pongs between grad_a and grad_b):
   nothing is allocated. */
PDP__PRIVATE pdp_status pdp__model_cross_entropy(pdp_model *m, const pdp_tensor *y,
                                                 const int32_t *labels, float *loss,
                                                 const char *fn);

/* The output a loss can read: [batch, classes] or [batch, T, vocab]. */
PDP__PRIVATE pdp_status pdp__model_check_logits(pdp_model *m, const pdp_tensor *y, const char *fn);

/* PDP_API pdp_status pdp_model_forward_backward(pdp_model *m, const pdp_tensor *x, const int32_t *labels, float *loss) */

/* PDP_API pdp_status pdp_model_forward_backward_target(pdp_model *m, const pdp_tensor *x, const pdp_tensor *target, float *loss) */

/* PDP_API pdp_status pdp_count_correct(const pdp_tensor *logits, const int32_t *labels, int64_t *correct) */

/* ---- src/optim.c ---- */
/* optim: torch.optim.SGD, Adam and AdamW on the flat parameter block, gradient
   clipping by global norm (torch.nn.utils.clip_grad_norm_), and llm.c's
   warm-up + cosine learning-rate schedule.

   Invariants: the optimizer belongs to one model and to that model's parameter
   count at creation; it holds state for one range [lo, hi) of the flat block
   (all of it, [0, count), for pdp_optim_create), flat with the parameter
   block's offsets (state[k][i - lo] belongs to parameter element i), on the
   model's device:
     SGD, momentum > 0:  state[0] = momentum_buffer
     Adam, AdamW:        state[0] = exp_avg, state[1] = exp_avg_sq
   pdp_optim_create allocates it (zeroed), so a step allocates nothing. steps
   counts completed updates; the update in flight uses t = steps + 1 (Adam's bias
   corrections) and "first" = (steps == 0) (SGD's momentum buffer is the first
   d_p, as PyTorch's clone). The element formulas are the PDP__HOSTDEV helpers of
   math.h, shared with the CUDA kernels.

   ZeRO: pdp__optim_create_range allocates state for one rank's range only, and
   pdp_optim_step on such an optimizer updates that range only (checkpoint.c
   saves and loads it with pdp__checkpoint_save_range/load_range). The element
   code is the same, so a range optimizer stepping its range gives the bits of
   a full optimizer on that range. pdp__optim_step_range updates any sub-range
   of the held range; whoever calls it directly advances steps with
   pdp__optim_finish_step once every range of the step is done.

   References: torch/optim/sgd.py, adam.py, adamw.py (PyTorch 1.13 single-tensor
   path); Kingma and Ba, "Adam", ICLR 2015; Loshchilov and Hutter, "Decoupled
   Weight Decay Regularization", ICLR 2019. */

/* #include "internal.h" (above) */

#if !defined(PDP_NO_SIMD) && (defined(__AVX__) || defined(__SSE2__))
#  include <immintrin.h>
#endif

/* Below this many elements per thread (a step's or zero_grad's), one thread is faster
   than waking more. */
#define PDP__OPTIM_MIN_PER_THREAD 32768

struct pdp_optim {
    pdp_model *model;
    pdp_device device;     /* the model's at creation: pdp_optim_free needs no model */
    pdp_optim_desc desc;   /* defaults filled in, validated */
    int64_t count;         /* the model's param_count at creation */
    int64_t lo, hi;        /* the range of the flat block the state covers */
    int64_t steps;         /* completed updates */
    int nstate;            /* state buffers in use: 0, 1 or 2 */
    float *state[2];       /* hi - lo floats each, on the model's device */
    bool shard;            /* ZeRO's layout (pdp__optim_create_shard): hi floats of state
                              addressed by the executor's offsets, not the flat block's;
                              only pdp__optim_step_at steps it */
};

/* ---- optim: desc ---- */

/* PDP_API const char *pdp_optim_kind_name(pdp_optim_kind kind) */

/* x in [0, FLT_MAX]: finite, not negative, and a float once rounded where it meets a
   float tensor. Written as !(x in range) by its callers, so NaN fails. */
PDP__PRIVATE bool pdp__optim_nonneg(double x);

/* Fills zeros with defaults and validates; fn names the public caller. NaNs fail
   every range check because each is written as !(x in range). The defaults are
   PyTorch's, as doubles (0.999, not 0.999f). */
PDP__PRIVATE pdp_status pdp__optim_desc_resolve(const pdp_optim_desc *in, pdp_optim_desc *out,
                                                const char *fn);

/* How many state buffers the resolved desc d needs. */
PDP__PRIVATE int pdp__optim_nstate(const pdp_optim_desc *d);

/* The state_dict key of state buffer k ("momentum_buffer", "exp_avg", "exp_avg_sq"). */
PDP__PRIVATE const char *pdp__optim_state_name(const pdp_optim *o, int k);

/* ---- optim: lifecycle ---- */

/* The optimizer of m for desc, holding hi - lo floats of zeroed state per buffer (the
   range [lo, hi) of the flat block; a shard: hi floats in the executor's layout). out,
   m and the range are checked by the callers. On failure *out stays NULL and
   everything allocated is freed; the message is composed before the free. */
PDP__PRIVATE pdp_status pdp__optim_alloc(pdp_optim **out, pdp_model *m, const pdp_optim_desc *desc,
                                         int64_t lo, int64_t hi, bool shard, const char *fn);

PDP__PRIVATE pdp_status pdp__optim_create_range(pdp_optim **out, pdp_model *m,
                                                const pdp_optim_desc *desc, int64_t lo, int64_t hi,
                                                const char *fn);

/* ZeRO: state for count floats in the executor's shard layout (zero.c), stepped
   by pdp__optim_step_at only; pdp_optim_step and the full checkpoints refuse it. */
PDP__PRIVATE pdp_status pdp__optim_create_shard(pdp_optim **out, pdp_model *m,
                                                const pdp_optim_desc *desc, int64_t count,
                                                const char *fn);

/* Does every rank step by the same rule (ZeRO's shards, DDP's replicas)? The resolved desc's
   fields, compared over c's ranks (pdp__comm_same_values: the integers exactly, the doubles
   within 1e-4 relative): an optimizer that differs on one rank (Adam here, SGD there; another
   lr) would update its parameters by another rule, silently. Collective over c. */
PDP__PRIVATE pdp_status pdp__optim_agree(pdp_comm *c, const pdp_optim_desc *d, const char *fn);

/* PDP_API pdp_status pdp_optim_create(pdp_optim **out, pdp_model *m, const pdp_optim_desc *desc) */

/* Whether o holds state for the whole block (the public functions' optimizer). */
PDP__PRIVATE bool pdp__optim_is_full(const pdp_optim *o);

/* PDP_API void pdp_optim_free(pdp_optim *o) */

/* pdp_optim_zero_grad on the CPU: the gradient block's memset split over the intra-op
   threads (ranges of 16 floats) once each thread has PDP__OPTIM_MIN_PER_THREAD floats;
   a serial memset of GPT-2 124M's 497 MB was a pass the second thread did not share. */
typedef struct pdp__zero_job {
    float *g;
    int64_t n;
} pdp__zero_job;

PDP__PRIVATE void pdp__optim_zero_part(void *arg, int part, int nparts);

/* PDP_API void pdp_optim_zero_grad(pdp_optim *o) */

/* PDP_API pdp_status pdp_optim_set_lr(pdp_optim *o, double lr) */

/* PDP_API double pdp_optim_lr(const pdp_optim *o) */
/* PDP_API int64_t pdp_optim_steps(const pdp_optim *o) */

/* PDP_API pdp_optim_desc pdp_optim_get_desc(const pdp_optim *o) */

/* ---- optim: the update ---- */

/* What torch/optim/sgd.py, adam.py and adamw.py (_single_tensor_*) do with their
   Python-float (double) hyper-parameters: 1 - dampening, 1 - beta, the bias corrections
   (beta ** step, step a float), step_size = lr / bias_correction1, sqrt(bias_correction2)
   and AdamW's 1 - lr * weight_decay are computed in double; each result, and each
   hyper-parameter used as it is, is rounded to float once, where it meets a float tensor
   as a scalar argument (alpha=, value=, mul_(x), add_(eps), / x: ATen's CPU and CUDA
   kernels take a float tensor's scalars as float). */
PDP__PRIVATE void pdp__optim_scalars_of(const pdp_optim *o, pdp__optim_scalars *s);

/* The CPU loops: the math.h helpers per element, in blocks of 16 with a
   fixed-count inner loop (which GCC's -O2 cost model vectorises; a loop of
   unknown count it leaves scalar), then a scalar tail. Adam takes the square
   roots of a block between its two halves with SIMD sqrt where available
   (IEEE sqrt is correctly rounded: the same bits as sqrtf). */
#define PDP__OPTIM_BLOCK 16

PDP__PRIVATE void pdp__sqrt_block(float *out, const float *in);

PDP__PRIVATE void pdp__sgd_loop(float *PDP__RESTRICT p, const float *PDP__RESTRICT g,
                                float *PDP__RESTRICT buf, int64_t n, const pdp__optim_scalars *s);

PDP__PRIVATE void pdp__adam_loop(float *PDP__RESTRICT p, const float *PDP__RESTRICT g,
                                 float *PDP__RESTRICT m, float *PDP__RESTRICT v, int64_t n,
                                 const pdp__optim_scalars *s);

typedef struct pdp__optim_job {
    const pdp__optim_scalars *s;
    float *params;
    const float *grads;
    float *state[2];     /* state[k][i - state_lo] belongs to element i */
    int64_t state_lo;
    int64_t lo, hi;
} pdp__optim_job;

/* Elements [lo, hi) of the job, part i of n (ranges aligned to 16 floats). */
PDP__PRIVATE void pdp__optim_part(void *arg, int part, int nparts);

/* The job of n elements, params[i] from grads[i] with state element state_off + i of
   o's buffers, by the update scalars s. */
PDP__PRIVATE void pdp__optim_job_of(const pdp_optim *o, const pdp__optim_scalars *s, float *params,
                                    const float *grads, int64_t state_off, int64_t n,
                                    pdp__optim_job *job);

/* ---- optim: which tensors decay ----
   PDP_DECAY_MATRICES leaves the 1-D tensors (biases, LayerNorm) undecayed: the update
   runs over the flat block in runs of tensors under one rule, the undecayed ones with the
   scalars of weight_decay 0 (torch.optim's second group: the same element code, and so the
   same bits as a separate optimizer with weight_decay 0 on them). */

/* Does o decay some tensors and not others? */
PDP__PRIVATE bool pdp__optim_split_decay(const pdp_optim *o);

/* The scalars of s with the weight decay taken out (SGD's and Adam's L2, AdamW's factor). */
PDP__PRIVATE void pdp__optim_scalars_no_decay(const pdp__optim_scalars *s,
                                              pdp__optim_scalars *out);

/* From flat element at (< end) of m's block: the end of the run of elements whose tensors
   share one rule, and the rule (*decay: the tensor has 2 or more dimensions). Elements
   past the last tensor (ZeRO's padding) take the last tensor's rule. */
PDP__PRIVATE int64_t pdp__optim_decay_run(const pdp_model *m, int64_t at, int64_t end,
                                          bool *decay);

/* n elements under the scalars s, on o's device (CPU: the caller's intra-op threads). */
PDP__PRIVATE pdp_status pdp__optim_run(const pdp_optim *o, const pdp__optim_scalars *s,
                                       float *params, const float *grads, int64_t state_off,
                                       int64_t n);

/* The state-offset step: n elements, params[i] from grads[i] with state element
   state_off + i of o's buffers, element i being flat element flat_off + i of the model's
   block (ZeRO: a unit's slice, the parameters in the model's block or the shard, the
   gradients in the executor's buffer). Does not advance steps (pdp__optim_finish_step). */
PDP__PRIVATE pdp_status pdp__optim_step_at(pdp_optim *o, float *params, const float *grads,
                                           int64_t state_off, int64_t n, int64_t flat_off);

/* Elements [lo, hi) of the flat blocks on the calling thread, with the scalars of
   the update in flight (pdp__optim_scalars_of, taken once per update): a CPU
   optimizer stepped in many small ranges (DataParallel's fused step) without
   recomputing them per range or taking the pool. */
PDP__PRIVATE void pdp__optim_update_range(const pdp_optim *o, const pdp__optim_scalars *s,
                                          float *params, const float *grads, int64_t lo, int64_t hi);

/* params and grads are full-size blocks: element i of each is parameter
   element i; [lo, hi) lies inside the range o holds state for. */
PDP__PRIVATE pdp_status pdp__optim_step_range(pdp_optim *o, float *params, const float *grads,
                                              int64_t lo, int64_t hi);

/* Marks the update in flight as done (after every range of it). */
PDP__PRIVATE void pdp__optim_finish_step(pdp_optim *o);

/* What pdp_optim_step checks before it changes anything (its messages). */
PDP__PRIVATE pdp_status pdp__optim_check_step(const pdp_optim *o);

/* PDP_API pdp_status pdp_optim_step(pdp_optim *o) */

/* ---- optim: gradient clipping ---- */

PDP__PRIVATE pdp_status pdp__grad_sumsq(const pdp_model *m, const float *g, int64_t n, double *sum,
                                        const char *fn);

PDP__PRIVATE pdp_status pdp__grad_scale(const pdp_model *m, float *g, int64_t n, float coef,
                                        const char *fn);

PDP__PRIVATE pdp_status pdp__grad_sumsq_range(const pdp_model *m, const float *g, int64_t lo,
                                              int64_t hi, double *sum, const char *fn);

PDP__PRIVATE pdp_status pdp__check_max_norm(float max_norm, const char *fn);

PDP__PRIVATE float pdp__clip_coef(float max_norm, double norm);

PDP__PRIVATE pdp_status pdp__grad_allreduce_sum(pdp_comm *c, float *host, float *dev, double *sum);

/* On a TP model (a TP communicator attached) a collective over the TP group: every rank
   adds its slices and TP rank 0 the replicated tensors (pdp__grad_sumsq_range), one
   all-reduce gives every rank the full model's norm, so every rank scales by the same
   coefficient and the replicated tensors stay the same bits. */
/* PDP_API pdp_status pdp_clip_grad_norm(pdp_model *m, float max_norm, float *total_norm) */

/* ---- optim: learning-rate schedule ---- */

/* PDP_API double pdp_lr_warmup_cosine(int64_t step, int64_t warmup, int64_t total, double base_lr, double min_lr) */

/* ---- src/inflate.c ---- */
/* inflate: the gzip (RFC 1952) and DEFLATE (RFC 1951) decoder behind the data loaders.

   The inflater decodes a whole DEFLATE stream (RFC 1951: stored, fixed-Huffman
   and dynamic-Huffman blocks) from memory into one growing output buffer, so a
   back-reference is checked against everything written so far instead of a
   32 KiB window. Huffman codes decode through a 2^PDP__FAST_BITS-entry table for
   short codes and the canonical count/symbol walk (as in zlib's puff.c) for the
   rest. Bits come LSB-first from a 64-bit buffer that is topped up before each
   symbol; past the end of the input it is filled with zeros, and consuming any
   of those zeros is reported as a truncated stream. Every length, distance and
   code set is checked before use: hostile input yields PDP_ERR_FORMAT, never an
   out-of-bounds access, and the output is capped at PDP_MAX_FILE_BYTES. The
   gzip wrapper (RFC 1952) parses FEXTRA, FNAME, FCOMMENT and FHCRC, verifies
   CRC-32 and ISIZE per member, and accepts concatenated members as gzip does.
   Entry points: pdp__is_gzip (the magic) and pdp__gunzip (every member, into
   one pdp__alloc'd buffer, or, with a caller's `enough` rule, only a prefix: the
   decoder stops once the rule says it has the bytes it needs, and then, not having
   read the whole member, checks no CRC-32 or ISIZE); messages name the caller's
   public function and path. */

/* #include "internal.h" (above) */

/* Largest file (after decompression) the loaders accept. */
#ifndef PDP_MAX_FILE_BYTES
#  define PDP_MAX_FILE_BYTES ((size_t)0xffffffffu)
#endif

#define PDP__FAST_BITS 10

/* ---- crc32 ---- */

/* CRC-32 of ISO 3309 / ITU-T V.42 (reflected polynomial 0xEDB88320), as gzip
   stores it. The table is built by the caller, once per decode. */
PDP__PRIVATE void pdp__crc32_table(uint32_t table[256]);

PDP__PRIVATE uint32_t pdp__crc32(const uint32_t table[256], uint32_t crc, const uint8_t *p,
                                 size_t n);

/* ---- inflate: state and bit input ---- */

/* A caller's rule for a prefix decode: given the first len decoded bytes (len 0 at the
   start), how many it needs in all; decoding stops once it has that many (a return of
   at most len stops at once). SIZE_MAX: everything. */
typedef size_t (*pdp__gunzip_enough)(const uint8_t *out, size_t len, const void *ctx);

typedef struct pdp__huff {
    uint16_t fast[1 << PDP__FAST_BITS]; /* symbol | length << 9 for codes of at most
                                           PDP__FAST_BITS bits, by bit-reversed code; 0 = none */
    uint16_t count[16];                 /* number of codes of each length */
    uint16_t symbol[288];               /* symbols in canonical code order */
} pdp__huff;

typedef struct pdp__inflate {
    const uint8_t *in;
    size_t in_len;
    size_t pos;      /* next input byte to load; bytes past in_len are loaded as zeros */
    uint64_t bits;   /* unconsumed bits, next bit in bit 0 */
    int nbits;
    uint8_t *out;    /* pdp__alloc'd, out_cap bytes, out_len used */
    size_t out_len, out_cap;
    pdp__huff lencode, distcode;
    size_t want;     /* decode until out_len reaches it (SIZE_MAX: all), then ask again */
    size_t hint;     /* the whole output's likely size (the gzip trailer's ISIZE) */
    size_t bound;    /* the most the input can decode to: DEFLATE expands at most 1032:1 */
    pdp__gunzip_enough enough; /* NULL: decode everything */
    const void *enough_ctx;
    bool stopped;    /* enough said the prefix is complete: decoding ended early */
    const char *fn, *path; /* for messages */
} pdp__inflate;

PDP__PRIVATE pdp_status pdp__inf_corrupt(const pdp__inflate *s, const char *what);

/* Tops the bit buffer up to at least 57 bits; fails once the stream has consumed
   any of the zero bytes that stand in for input past the end. */
PDP__PRIVATE pdp_status pdp__inf_refill(pdp__inflate *s);

/* n <= 32 bits, LSB first; the caller has refilled enough. */
PDP__PRIVATE uint32_t pdp__inf_bits(pdp__inflate *s, int n);

/* Makes room for `more` output bytes: at once for what the decode is expected to write (the
   prefix the caller's rule wants and one match past it, else the whole output's hint; never
   more than the input can decode to, whatever size a hostile header makes the rule ask
   for), doubling past that. */
PDP__PRIVATE pdp_status pdp__inf_room(pdp__inflate *s, size_t more);

/* Called once out_len has reached want: asks the caller's rule again; true (and
   s->stopped) when the prefix it needs is complete. */
PDP__PRIVATE bool pdp__inf_enough(pdp__inflate *s);

/* ---- inflate: Huffman codes ---- */

/* Builds the code for lens[0..n). Returns 0 for a complete code, 1 for an
   incomplete one that is allowed (no code at all, or one code of length 1, as
   zlib allows), -1 for an over-subscribed or otherwise incomplete set. */
PDP__PRIVATE int pdp__huff_build(pdp__huff *h, const uint8_t *lens, int n);

/* The next symbol, or -1 for a bit pattern that is no code. Needs 15 bits. */
PDP__PRIVATE int pdp__huff_decode(pdp__inflate *s, const pdp__huff *h);

/* ---- inflate: blocks ---- */

PDP__PRIVATE pdp_status pdp__inf_stored(pdp__inflate *s);

/* Literals and matches until end-of-block, with the codes in s->lencode/distcode. */
PDP__PRIVATE pdp_status pdp__inf_codes(pdp__inflate *s);

PDP__PRIVATE pdp_status pdp__inf_fixed(pdp__inflate *s);

PDP__PRIVATE pdp_status pdp__inf_dynamic(pdp__inflate *s);

/* One DEFLATE stream starting at byte s->pos; leaves s->pos on the byte after it. */
PDP__PRIVATE pdp_status pdp__inflate_stream(pdp__inflate *s);

/* ---- gzip ---- */

PDP__PRIVATE uint32_t pdp__le32(const uint8_t *p);

PDP__PRIVATE bool pdp__is_gzip(const uint8_t *p, size_t n);

/* Decodes every gzip member of in[0..n) into *out (pdp__alloc'd, *out_len bytes); with
   enough (may be NULL), only until that rule has its prefix (*out_len may be more). */
PDP__PRIVATE pdp_status pdp__gunzip(const uint8_t *in, size_t n, uint8_t **out, size_t *out_len,
                                    pdp__gunzip_enough enough, const void *enough_ctx,
                                    const char *fn, const char *path);

/* ---- src/sampler.c ---- */
/* sampler: pdp_permutation (data.h), the order behind every shuffle, and
   torch.utils.data.DistributedSampler (declared in ddp.h).

   The permutation of epoch e is pdp_permutation(seed, e) (0..n-1 with
   no_shuffle), padded by repeating from its start (or cut with drop_last) to a
   multiple of the world size N, and rank r takes every N-th entry from r.
   Invariants: every rank with the same seed and epoch computes the same
   permutation without communicating; indices[] holds num_samples entries and is
   rewritten only by set_epoch. */

/* #include "internal.h" (above) */

/* ---- sampler: the permutation (the batcher's shuffle too, data.c) ---- */

/* Uniform in [0, n), unbiased, for n up to 2^63. */
PDP__PRIVATE uint64_t pdp__rng_below64(pdp_rng *r, uint64_t n);

/* PDP_API void pdp_permutation(int64_t *out, int64_t n, uint64_t seed, uint64_t epoch) */

/* ---- sampler ---- */

struct pdp_dist_sampler {
    pdp_dist_sampler_desc desc;
    int64_t num_samples, total;
    int64_t *perm;      /* dataset_size */
    int64_t *indices;   /* num_samples: this rank's */
};

/* PDP_API pdp_status pdp_dist_sampler_create(pdp_dist_sampler **out, const pdp_dist_sampler_desc *desc) */

/* PDP_API void pdp_dist_sampler_free(pdp_dist_sampler *s) */

/* PDP_API void pdp_dist_sampler_set_epoch(pdp_dist_sampler *s, uint64_t epoch) */

/* PDP_API int64_t pdp_dist_sampler_num_samples(const pdp_dist_sampler *s) */

/* PDP_API const int64_t *pdp_dist_sampler_indices(const pdp_dist_sampler *s, int64_t *count) */

/* ---- src/data.c ---- */
/* data: the IDX reader, the synthetic task (and Fashion-MNIST's fallback to it), datasets
   from a user's arrays (class labels or float targets, checked and copied), the batcher
   (over an index list or a DistributedSampler's epochs; its targets a tensor of the
   dataset's kind), token data (a text file or
   a directory read into one byte stream, a generated text, batches of windows), the
   accuracy of a model over a batcher. Files that start with the gzip magic are decoded by
   src/inflate.c (pdp__gunzip).

   IDX (LeCun et al., "The MNIST database"): a big-endian magic 0x0000TTDD (type
   TT = 0x08 unsigned byte, DD dimensions), DD big-endian 32-bit sizes, then the
   bytes. A dataset keeps pixels as floats, [count, features]. */

/* #include "internal.h" (above) */

/* ---- files ---- */

/* Reads a whole file, gunzipping it when it starts with the gzip magic: all of it, or with
   enough (may be NULL) the prefix that rule asks for (pdp__gunzip). */
PDP__PRIVATE pdp_status pdp__read_file(const char *path, uint8_t **data, size_t *bytes,
                                       pdp__gunzip_enough enough, const void *enough_ctx,
                                       const char *fn);

/* ---- idx ---- */

PDP__PRIVATE uint32_t pdp__be32(const uint8_t *p);

/* Checks an IDX header of unsigned bytes with ndim dimensions against the data's size;
   fills dims and the payload pointer. With keep (> 0), the data need hold only the first
   keep items (a file read up to them: pdp__idx_enough), and no more than the header says. */
PDP__PRIVATE pdp_status pdp__idx_parse(const uint8_t *d, size_t n, int ndim, int64_t keep,
                                       uint64_t dims[3], const uint8_t **payload, const char *fn,
                                       const char *path);

/* What pdp__idx_enough reads to the end of: an IDX file of ndim dimensions, of which the
   first keep items are used. */
typedef struct pdp__idx_prefix {
    int ndim;
    int64_t keep;
} pdp__idx_prefix;

/* pdp__gunzip's rule for an IDX file read for its first keep items: the header, then the
   header and those items' bytes. A file of no more than keep items is read to its end (and
   its CRC-32 checked), and so is one whose header it cannot size: pdp__idx_parse says what
   is wrong. */
PDP__PRIVATE size_t pdp__idx_enough(const uint8_t *out, size_t len, const void *ctx);

/* An empty dataset of count samples with the given per-sample shape. */
PDP__PRIVATE pdp_status pdp__dataset_new(pdp_dataset **out, int64_t count, int64_t h, int64_t w,
                                         const pdp_dataset_desc *desc, const char *fn);

PDP__PRIVATE pdp_status pdp__check_desc(const pdp_dataset_desc *desc, const char *fn);

PDP__PRIVATE pdp_status pdp__load_idx(pdp_dataset **out, const char *images_path,
                                      const char *labels_path, const pdp_dataset_desc *desc,
                                      const char *fn);

/* PDP_API pdp_status pdp_dataset_load_idx(pdp_dataset **out, const char *images_path, const char *labels_path, const pdp_dataset_desc *desc) */

/* ---- fashion-mnist ---- */

/* Looks for dir/name, then dir/name.gz; appends each path tried to `tried`. */
PDP__PRIVATE bool pdp__find_file(const char *dir, const char *name, char *path, size_t cap,
                                 char *tried, size_t tried_cap);

/* PDP_API pdp_status pdp_dataset_load_fashion_mnist(pdp_dataset **out, bool train, const pdp_dataset_desc *desc) */

/* ---- synthetic ---- */

/* PDP_API pdp_status pdp_dataset_synthetic(pdp_dataset **out, bool train, const pdp_dataset_desc *desc) */

/* ---- a user's arrays ---- */

/* One sample's dimensions and features from a->ndim and a->shape, or PDP_ERR_SHAPE naming
   the field. */
PDP__PRIVATE pdp_status pdp__arrays_shape(const pdp_dataset_arrays *a, int *ndim,
                                          int64_t *features, const char *fn);

/* PDP_OK when v[0..n) are finite, else PDP_ERR_INVALID naming the element, its sample and
   its feature (v holds rows of `row` values). */
PDP__PRIVATE pdp_status pdp__arrays_finite(const float *v, int64_t n, int64_t row,
                                           const char *field, const char *fn);

/* PDP_API pdp_status pdp_dataset_from_arrays(pdp_dataset **out, const pdp_dataset_arrays *a) */

/* PDP_API void pdp_dataset_free(pdp_dataset *ds) */

/* ---- gather, view, permutation ---- */

/* Both gathers: samples to x_out, labels to labels_out, float targets to targets_out (each
   may be NULL; the caller checked that the dataset has what it asks for). */
PDP__PRIVATE pdp_status pdp__gather(const pdp_dataset *ds, const int64_t *indices, int64_t n,
                                    float *x_out, int32_t *labels_out, float *targets_out,
                                    const char *fn);

/* PDP_API pdp_status pdp_dataset_gather(const pdp_dataset *ds, const int64_t *indices, int64_t n, float *x_out, int32_t *labels_out) */

/* PDP_API pdp_status pdp_dataset_gather_targets(const pdp_dataset *ds, const int64_t *indices, int64_t n, float *x_out, float *targets_out) */

/* Wraps data as [n, the dataset's sample shape...]. */
PDP__PRIVATE pdp_status pdp__dataset_wrap(const pdp_dataset *ds, float *data, int64_t n,
                                          pdp_tensor *x);

/* PDP_API pdp_status pdp_dataset_view(const pdp_dataset *ds, int64_t first, int64_t n, pdp_tensor *x) */

/* ---- batcher ---- */

struct pdp_batcher {
    const pdp_dataset *ds;
    pdp_batcher_desc desc; /* defaults filled; desc.indices points at base */
    int64_t *base;         /* the index list: the caller's copy, or 0..count-1 */
    int64_t *order;        /* this epoch's order of base */
    int64_t len;           /* entries in base and order */
    int64_t next;          /* position in order of the next batch */
    uint64_t epoch;
    float *x;              /* [batch_size, features] */
    int32_t *labels;       /* [batch_size]; NULL for a regression set */
    float *targets;        /* [batch_size, target_features]; NULL for a classification set */
    pdp_tensor *xdev;      /* [batch_size, sample shape] on desc.device; NULL on the CPU */
    pdp_tensor *tdev;      /* [batch_size, target_features] on desc.device for a regression
                              set; else NULL */
    pdp_status st;         /* the last pdp_batcher_next's failure, else PDP_OK */
};

/* PDP_API pdp_status pdp_batcher_create(pdp_batcher **out, const pdp_dataset *ds, const pdp_batcher_desc *desc) */

/* PDP_API pdp_batcher_desc pdp_batcher_get_desc(const pdp_batcher *b) */

/* PDP_API void pdp_batcher_free(pdp_batcher *b) */

/* PDP_API void pdp_batcher_reset(pdp_batcher *b, uint64_t epoch) */

/* *t, a view of the first k rows of a host buffer, becomes the same rows of dev, copied
   there. */
PDP__PRIVATE pdp_status pdp__batch_to_device(pdp_tensor *dev, int64_t k, pdp_tensor *t);

/* The next batch of the epoch, copied into the batcher's buffers: *x its samples and, when
   target is not NULL, *target its labels or float targets, on desc.device where they go
   there. Returns the batch's size; 0 at the epoch's end, or on a failed device copy
   (b->st says why). */
PDP__PRIVATE int64_t pdp__batcher_take(pdp_batcher *b, pdp_tensor *x, pdp_tensor *target,
                                       const char *fn);

/* PDP_API bool pdp_batcher_next(pdp_batcher *b, pdp_tensor *x, const int32_t **labels, int64_t *n) */

/* PDP_API bool pdp_batcher_next_target(pdp_batcher *b, pdp_tensor *x, pdp_tensor *target, int64_t *n) */

/* PDP_API pdp_status pdp_batcher_status(const pdp_batcher *b) */

/* PDP_API int64_t pdp_batcher_num_batches(const pdp_batcher *b) */

/* PDP_API const int64_t *pdp_batcher_order(const pdp_batcher *b, int64_t *count) */

/* ---- token data ---- */

#define PDP__TOKEN_SYNTHETIC_BYTES ((int64_t)1 << 20) /* desc.max_tokens 0, synthetic */

/* d = *in with the defaults filled, or PDP_ERR_INVALID naming the field. */
PDP__PRIVATE pdp_status pdp__token_desc_defaults(const pdp_token_dataset_desc *in,
                                                 pdp_token_dataset_desc *d, const char *fn);

/* Cuts ds's stream into the two splits and their windows; fails, naming what (the path)
   and the lengths, when a split has fewer than T + 1 tokens. */
PDP__PRIVATE pdp_status pdp__token_split(pdp_token_dataset *ds, const char *what, const char *fn);

PDP__PRIVATE int pdp__by_path(const void *a, const void *b);

PDP__PRIVATE void pdp__free_paths(char **paths, int64_t n);

/* The paths of dir's regular files (links are skipped) whose names do not end in
   ".dat", sorted bytewise: *n of them in *paths (each and the list PDP_MALLOC'd). */
PDP__PRIVATE pdp_status pdp__text_dir(const char *dir, char ***paths, int64_t *n, const char *fn);

/* Reads paths[0..n) until max bytes (0 = all) and concatenates them into ds->tokens,
   ds->count; ds->files counts the files read. One file is kept as read (no copy). */
PDP__PRIVATE pdp_status pdp__text_read(pdp_token_dataset *ds, const char *const *paths,
                                       int64_t n, int64_t max, const char *fn);

/* PDP_API pdp_status pdp_token_dataset_load(pdp_token_dataset **out, const char *path, const pdp_token_dataset_desc *desc) */

/* The synthetic text's writer: bytes up to cap, the next letter capitalised when asked. */
typedef struct pdp__text_writer {
    uint8_t *p;
    int64_t n, cap;
    bool capital;
} pdp__text_writer;

PDP__PRIVATE void pdp__text_put(pdp__text_writer *w, const char *s);

#define PDP__PICK(r, words)                                                                    \
    ((words)[pdp_rng_below((r), (uint32_t)(sizeof(words) / sizeof *(words)))])

/* determiner [adjective] noun: "the quiet fox" (every adjective and noun starts with a
   consonant, so "a" always reads) */
PDP__PRIVATE void pdp__text_noun_phrase(pdp__text_writer *w, pdp_rng *r);

/* PDP_API pdp_status pdp_token_dataset_synthetic(pdp_token_dataset **out, const pdp_token_dataset_desc *desc) */

#undef PDP__PICK

/* PDP_API void pdp_token_dataset_free(pdp_token_dataset *ds) */

/* The split's first token and its length. */
PDP__PRIVATE void pdp__token_range(const pdp_token_dataset *ds, pdp_split split, int64_t *first,
                                   int64_t *len);

/* Writes the T + 1 tokens from w as x[0..T) and y[0..T) (either may be NULL). */
PDP__PRIVATE void pdp__token_window(const uint8_t *w, int64_t T, int32_t *x, int32_t *y);

PDP__PRIVATE const char *pdp__split_name(pdp_split split);

/* The checks both batch functions share. */
PDP__PRIVATE pdp_status pdp__token_batch_check(const pdp_token_dataset *ds, pdp_split split,
                                               int64_t count, const char *fn);

/* PDP_API pdp_status pdp_token_dataset_batch(const pdp_token_dataset *ds, pdp_split split, const int64_t *windows, int64_t count, int32_t *x, int32_t *y) */

/* PDP_API pdp_status pdp_token_dataset_sample(const pdp_token_dataset *ds, pdp_split split, pdp_rng *r, int64_t count, int32_t *x, int32_t *y) */

/* ---- evaluation ---- */

/* PDP_API pdp_status pdp_model_accuracy(pdp_model *m, pdp_batcher *b, double *accuracy) */

/* ---- src/json.c ---- */
/* json: the reader of a safetensors header, a small strict JSON parser.

   Format (https://github.com/huggingface/safetensors, "Format"): the header is
   one JSON object: tensor name -> {"dtype": "F32", "shape": [..],
   "data_offsets": [begin, end]} with offsets relative to the data start, plus
   an optional "__metadata__" object of string -> string. Names are unique; the
   tensors' byte ranges must tile the data section exactly (no gap, no
   overlap); trailing spaces pad the header.

   Invariants: the parser accepts only what the format needs (objects, strings,
   non-negative integers, arrays of them), holds no recursion, and bounds every
   count by the header length; decoded strings live in one arena no longer than
   the header. Messages start with the caller's public function (fn) and name
   the file and the header byte. Used by checkpoint.c. */

/* #include "internal.h" (above) */

#define PDP__CKPT_MAX_DIMS 16

/* ---- json: header parser ---- */

typedef struct pdp__st_entry {
    const char *name;           /* decoded, NUL-terminated, in the parser's arena */
    const char *dtype;
    int ndim;
    int64_t shape[PDP__CKPT_MAX_DIMS];
    uint64_t begin, end;        /* data_offsets */
    uint32_t crc;               /* its checksum, when has_crc (set by checkpoint.c) */
    bool has_crc;
} pdp__st_entry;

typedef struct pdp__st_parser {
    const char *s;              /* the header */
    size_t n, pos;
    char *arena;                /* decoded strings; never longer than their source */
    size_t arena_used;
    pdp__st_entry *entries;
    int nentries, cap_entries;
    const char **meta;          /* key, value, key, value, ... */
    int nmeta, cap_meta;
    const char *file;           /* for messages */
    const char *fn;             /* the public caller, for messages */
} pdp__st_parser;

PDP__PRIVATE pdp_status pdp__st_fail(const pdp__st_parser *p, const char *what);

PDP__PRIVATE void pdp__st_ws(pdp__st_parser *p);

/* Skips whitespace, then consumes c or fails. */
PDP__PRIVATE bool pdp__st_expect(pdp__st_parser *p, char c);

PDP__PRIVATE int pdp__st_hex(char c);

/* A JSON string, decoded into the arena as UTF-8 (\uXXXX escapes, surrogate
   pairs included). */
PDP__PRIVATE pdp_status pdp__st_string(pdp__st_parser *p, const char **out);

/* A non-negative integer without sign, fraction, exponent or leading zeros. */
PDP__PRIVATE pdp_status pdp__st_uint(pdp__st_parser *p, uint64_t *out);

/* [u, u, ...] with at most max elements. */
PDP__PRIVATE pdp_status pdp__st_uint_array(pdp__st_parser *p, uint64_t *out, int max, int *count);

/* {"dtype": s, "shape": [..], "data_offsets": [b, e]}, each key exactly once. */
PDP__PRIVATE pdp_status pdp__st_tensor(pdp__st_parser *p, pdp__st_entry *e);

/* {"key": "value", ...} */
PDP__PRIVATE pdp_status pdp__st_metadata(pdp__st_parser *p);

/* The whole header. Allocations (arena, entries, metadata) are freed by
   pdp__st_parser_free, also after a failure. */
PDP__PRIVATE pdp_status pdp__st_parse(pdp__st_parser *p);

PDP__PRIVATE void pdp__st_parser_free(pdp__st_parser *p);

PDP__PRIVATE const char *pdp__st_meta(const pdp__st_parser *p, const char *key);

/* Bytes per element of a safetensors dtype; 0 when unknown. */
PDP__PRIVATE int pdp__st_dtype_bytes(const char *d);

PDP__PRIVATE int pdp__st_by_begin(const void *a, const void *b);

PDP__PRIVATE int pdp__st_by_name(const void *a, const void *b);

/* Per-entry checks (known dtype, byte count = elements * size, inside the data),
   unique names, and exact tiling of the data section. sorted gets the entries
   by name. */
PDP__PRIVATE pdp_status pdp__st_validate(const pdp__st_parser *p, uint64_t data_bytes,
                                         pdp__st_entry **sorted);

PDP__PRIVATE const pdp__st_entry *pdp__st_find(pdp__st_entry *const *sorted, int n,
                                               const char *name);

/* ---- src/checkpoint.c ---- */
/* checkpoint: safetensors files for a model's parameters and its optimizer
   state; the header is read by json.c's strict parser.

   Format (https://github.com/huggingface/safetensors, "Format"): 8 bytes
   little-endian u64 N, then N bytes of JSON, then the data (json.c checks the
   JSON and the tiling of the data section).

   Invariants. Save never exposes a half-written file: it writes
   "<path>.tmp.<pid>.<thread>", flush and sync it, rename it over path, sync the directory
   (platform.h: fsync and rename on POSIX; FlushFileBuffers and MoveFileExA with
   MOVEFILE_REPLACE_EXISTING | MOVEFILE_WRITE_THROUGH on Win32);
   first it removes the temporaries of path whose pid is no live process (a
   writer killed mid-save), never a live writer's.
   Load never half-applies a file: it reads the header (at most
   PDP__CKPT_MAX_HEADER bytes, and no more than the file holds), parses and
   validates every entry, reads every expected tensor into one staging buffer,
   and only then copies into the model and the optimizer (pdp__ckpt_load's
   steps, under "checkpoint: load, step by step"). The extra tensors a nanoGPT
   file may hold (checkpoint.h) are checked there too, before the commit: the
   tied head's alias "lm_head.weight" against the parameter it names, the
   "<prefix>.attn.bias" causal masks element by element; both are streamed through
   a 64 KB chunk, so they cost no memory of their size.

   Checksums (safetensors has none): __metadata__ "crc32c.<tensor>" is the
   CRC-32C of the tensor's data bytes as stored, "crc32c.header" that of the
   header's parsed content (pdp__ckpt_header_crc says exactly what), so a file
   Python rewrote with our metadata still verifies. Save writes the header with
   placeholder digits, streams the data computing each tensor's CRC, then
   rewrites the sealed header in place (same length: 8 digits each). Load
   verifies a file that has any "crc32c.*" key completely (all keys present,
   the header, every tensor it reads, whole) and loads one without any
   unverified: other tools write no checksums.

   Ranges (ZeRO): pdp__checkpoint_save_range writes one rank's range [lo, hi)
   of the flat block as a shard file: flat F32 tensors "params" and
   "optim.<state>" ([hi - lo] each, either may be left out), __metadata__
   "format": "pdp-shard", "shard.lo", "shard.hi", "shard.count" (the model's
   parameter count), "shard.run" when the caller names the save it belongs to
   (pdp__checkpoint_save_run: 16 hex digits, every shard of one ZeRO save and
   its marker carry the same) and the same model and optimizer keys as a full
   file. pdp__checkpoint_load_range reads a shard file of exactly that range, or
   the slice [lo, hi) of a full checkpoint (every tensor still checked; the ones
   the slice touches are read whole to verify their checksums);
   pdp__checkpoint_load_run reads only a shard file of that range and that run.
   The public load refuses a shard file; the public save and load refuse a range
   optimizer. */

/* #include "internal.h" (above) */
#include <limits.h>

#ifndef PDP__CKPT_MAX_HEADER
#  define PDP__CKPT_MAX_HEADER ((uint64_t)100 * 1000 * 1000) /* bytes */
#endif

PDP__PRIVATE bool pdp__little_endian(void);

PDP__PRIVATE void pdp__bswap32(void *data, int64_t count);

/* ---- checkpoint: checksums ---- */

/* CRC-32C (Castagnoli: polynomial 0x1EDC6F41, reflected 0x82F63B78, initial
   value and final xor 0xffffffff; "123456789" gives e3069283), computed by
   slicing by 8: eight 256-entry tables, built once per save or load. */
typedef struct pdp__crc32c {
    uint32_t t[8][256];
} pdp__crc32c;

PDP__PRIVATE void pdp__crc32c_init(pdp__crc32c *c);

/* crc continued over bytes (start with 0). */
PDP__PRIVATE uint32_t pdp__crc32c_update(const pdp__crc32c *c, uint32_t crc, const void *data,
                                         size_t bytes);

/* The 8 lowercase hex digits of v (no NUL). */
PDP__PRIVATE void pdp__ckpt_hex8(char *dst, uint32_t v);

/* Exactly 8 lowercase hex digits: a flipped case is corruption, not the same value. */
PDP__PRIVATE bool pdp__ckpt_unhex8(const char *s, uint32_t *out);

PDP__PRIVATE int pdp__ckpt_by_meta_key(const void *a, const void *b);

/* The header checksum ("crc32c.header"): CRC-32C of the parsed header, not of
   its bytes, so that a tool that rewrites the file with the same metadata
   (its own key order, spacing, escapes and data order) keeps it valid:
     for every __metadata__ entry but "crc32c.header", in strcmp order of the
       keys: key NUL value NUL;
     then for every tensor, in strcmp order of the names: name NUL dtype NUL,
       each dimension in decimal followed by ',', NUL.
   Strings as decoded (escapes resolved). data_offsets are left out: the tiling
   check pins them, and a tensor read from elsewhere fails its own checksum.
   sorted: the tensors by name (pdp__st_validate). A key twice is an error. */
PDP__PRIVATE pdp_status pdp__ckpt_header_crc(const pdp__st_parser *p, pdp__st_entry *const *sorted,
                                             const pdp__crc32c *c, uint32_t *out);

/* ---- checkpoint: save ---- */

/* "optim.decay_params" by pdp_decay_params value */

/* Appends printf output to a bounded buffer; *ok turns false on overflow. */
PDP__PRIVATE void pdp__ckpt_put(char *buf, size_t cap, size_t *len, bool *ok, const char *fmt, ...);

/* One tensor of a file, in data order. shard: "params" (when with_params),
   then "optim.<state>", each the flat range [lo, hi); otherwise every
   parameter by its state_dict name, then per state "optim.<param>.<state>". */
typedef struct pdp__ckpt_tensor {
    char name[96];
    int state;                          /* -1: parameters; else o's state index */
    int64_t offset, count;              /* elements [offset, offset + count) of the block */
    const pdp__param_entry *param;      /* its parameter; NULL in a shard file */
} pdp__ckpt_tensor;

PDP__PRIVATE int pdp__ckpt_ntensors(const pdp_model *m, const pdp_optim *o, bool with_params,
                                    bool shard);

PDP__PRIVATE void pdp__ckpt_tensor_at(const pdp_model *m, const pdp_optim *o, bool with_params,
                                      int64_t lo, int64_t hi, bool shard, int t,
                                      pdp__ckpt_tensor *r);

/* The header JSON, padded with spaces to a multiple of 8 bytes, its checksums
   "00000000" placeholders: crc_at[0] gets the offset of the header checksum's
   digits, crc_at[1 + t] those of tensor t's. Parameter names are
   "<layer>.<weight|bias>": nothing in them needs escaping. */
PDP__PRIVATE pdp_status pdp__ckpt_header(const pdp_model *m, const pdp_optim *o, bool with_params,
                                         int64_t lo, int64_t hi, bool shard, const char *run,
                                         char **out, size_t *len, size_t *crc_at);

/* Fills in the header's checksums: tensor t's from crcs[t], then the header's
   own, computed from the header as pdp__ckpt_header_crc reads it back. */
PDP__PRIVATE pdp_status pdp__ckpt_header_seal(char *h, size_t len, const size_t *crc_at,
                                              const uint32_t *crcs, int nt, uint64_t data_bytes,
                                              const pdp__crc32c *c, const char *fn,
                                              const char *path);

/* Writes count floats from dev memory, staging through host (when the data is
   not on the CPU or the host is big-endian); *crc gets the bytes' CRC-32C. */
PDP__PRIVATE bool pdp__ckpt_write_floats(FILE *f, pdp_device dev, const float *data, int64_t count,
                                         float *host, const pdp__crc32c *c, uint32_t *crc);

/* The last separator in path, or NULL. */
PDP__PRIVATE const char *pdp__ckpt_last_sep(const char *path);

/* The directory part of path ("." for none); false when it does not fit. */
PDP__PRIVATE bool pdp__ckpt_dirname(const char *path, char *dir, size_t cap);

/* Syncs the directory holding path, so the rename itself is durable. */
PDP__PRIVATE int pdp__ckpt_sync_dir(const char *path);

/* Removes the temporaries "<path>.tmp.<pid>" and "<path>.tmp.<pid>.<thread>" that writers
   of path killed mid-save left behind: only those whose pid names no live process
   (pdp__pid_alive), never another live writer's, nor ours.
   Best effort: what cannot be listed or removed stays. (A pid is a local
   name: on a filesystem shared between machines, writers of one path on two
   machines are not told apart; ranks write their own paths.) */
PDP__PRIVATE void pdp__ckpt_remove_stale(const char *path);

/* Writes the parameters [lo, hi) (params holds them; skipped unless
   with_params) and o's state for [lo, hi) (o may be NULL) as a full
   checkpoint (shard false: lo = 0, hi = param_count) or a shard file: the
   header with placeholder checksums, the data (each tensor's CRC-32C taken
   from the bytes written), then the sealed header over the first. */
PDP__PRIVATE pdp_status pdp__ckpt_save(const char *path, const pdp_model *m, const float *params,
                                       bool with_params, const pdp_optim *o, int64_t lo, int64_t hi,
                                       bool shard, const char *run, const char *fn);

/* The whole-model calls' arguments: a plain model (not TP slices) and an optimizer
   holding the state of every parameter. fn ends in _save or _load, which names the
   TP function to call instead. */
PDP__PRIVATE pdp_status pdp__ckpt_whole_args(const char *path, const pdp_model *m,
                                             const pdp_optim *o, const char *fn);

/* PDP_API pdp_status pdp_checkpoint_save(const char *path, const pdp_model *m, const pdp_optim *o) */

/* Checks a range call's arguments: [lo, hi) inside the model, o's range
   containing it, something to save or load. */
PDP__PRIVATE pdp_status pdp__ckpt_range_args(const char *path, const pdp_model *m,
                                             const float *params, const pdp_optim *o, int64_t lo,
                                             int64_t hi, const char *fn);

PDP__PRIVATE pdp_status pdp__checkpoint_save_run(const char *path, const pdp_model *m,
                                                 const float *params, const pdp_optim *o,
                                                 int64_t lo, int64_t hi, const char *run,
                                                 const char *fn);

PDP__PRIVATE pdp_status pdp__checkpoint_save_range(const char *path, const pdp_model *m,
                                                   const float *params, const pdp_optim *o,
                                                   int64_t lo, int64_t hi, const char *fn);

/* ---- checkpoint: load ---- */

/* A hyper-parameter from a metadata string: a double, "%.17g" on save (the exact
   double back); an older pdp's file has "%.9g" of a float, read as that decimal. False
   when absent or not a finite number. */
PDP__PRIVATE bool pdp__ckpt_meta_double(const pdp__st_parser *p, const char *key, double *out);

/* The optimizer part of the metadata: o's kind, steps and hyper-parameters. */
PDP__PRIVATE pdp_status pdp__ckpt_read_optim(const pdp__st_parser *p, const pdp_optim *o,
                                             pdp_optim_desc *desc, int64_t *steps);

/* An optional unsigned metadata count ("model.seed", "model.step"): *present
   tells whether the key exists; false when it exists but is not a count. */
PDP__PRIVATE bool pdp__ckpt_meta_u64(const pdp__st_parser *p, const char *key, uint64_t *out,
                                     bool *present);

/* Whether a tensor name of the file is one load expects (or may ignore). */
PDP__PRIVATE bool pdp__ckpt_expected(const pdp_model *m, const pdp_optim *o, const char *name);

/* nanoGPT's two extra tensors (checkpoint.h): "lm_head.weight", the alias of the tied
   head's weight, and "<prefix>.attn.bias", a causal-mask buffer (pdp__ckpt_load_extra). */
#define PDP__CKPT_HEAD_ALIAS "lm_head.weight"
#define PDP__CKPT_MASK_SUFFIX ".attn.bias"

/* The registry index of the parameter PDP__CKPT_HEAD_ALIAS stands for: the weight of the
   model's last TiedLinear (its LM head), when it has one and no parameter of that name;
   else -1. */
PDP__PRIVATE int pdp__ckpt_alias_param(const pdp_model *m);

/* Whether name is "<prefix>.attn.bias" and the model has parameters "<prefix>.attn.*":
   the attention whose causal-mask buffer nanoGPT keeps under that name. */
PDP__PRIVATE bool pdp__ckpt_mask_name(const pdp_model *m, const char *name);

PDP__PRIVATE void pdp__shape_text(char *buf, size_t cap, int ndim, const int64_t *shape);

/* The checksums of a file being loaded: the tables and a chunk for reading a
   tensor of which only a slice is loaded (it is verified whole). */
#define PDP__CKPT_CHUNK 65536 /* bytes */
typedef struct pdp__ckpt_sums {
    pdp__crc32c crc;
    unsigned char chunk[PDP__CKPT_CHUNK];
} pdp__ckpt_sums;

/* A file with checksums (any __metadata__ key "crc32c.*": written by pdp)
   must have them all: "crc32c.header", matching the header, and one
   "crc32c.<name>" for every tensor, none for anything else; each value 8
   lowercase hex digits. Sets the entries' crc; *has tells whether the file has
   checksums (a file of another tool has none and is loaded unverified). */
PDP__PRIVATE pdp_status pdp__ckpt_check_sums(pdp__st_parser *p, pdp__st_entry *const *sorted,
                                             const pdp__crc32c *c, bool *has);

PDP__PRIVATE pdp_status pdp__ckpt_crc_check(const char *fn, const char *file,
                                            const pdp__st_entry *e, uint32_t crc);

PDP__PRIVATE pdp_status pdp__ckpt_read_error(FILE *f, const char *fn, const char *file,
                                             const pdp__st_entry *e);

/* Reads elements [first, first + count) of tensor e of the file f (data at
   data_start) into dst. With sums, the whole tensor is read and checked
   against its checksum (through sums->chunk when only a slice is wanted). */
PDP__PRIVATE pdp_status pdp__ckpt_read_tensor(FILE *f, const char *fn, const char *file,
                                              uint64_t data_start, const pdp__st_entry *e,
                                              int64_t first, float *dst, int64_t count,
                                              pdp__ckpt_sums *sums);

/* Whether a tensor name of a shard file is one load expects (or may ignore). */
PDP__PRIVATE bool pdp__ckpt_shard_expected(const pdp_optim *o, const char *name);

/* ---- checkpoint: load, step by step ----
   pdp__ckpt_load runs the steps below in order; each returns a status, the first failure
   ends the load (the message is that step's), and the clean-up runs either way. Nothing
   reaches the model or the optimizer before the commit, the last step, and the commit
   runs only when every check before it passed. */

/* One load: its arguments and what one step hands to the next. */
typedef struct pdp__ckpt_loader {
    const char *path, *fn, *run; /* run: the ZeRO save a shard must belong to, or NULL */
    pdp_model *m;
    pdp_optim *o;                /* NULL: parameters only */
    float *params;               /* the destination of [lo, hi), when with_params */
    bool with_params, allow_shard;
    int64_t lo, hi, count;       /* count = hi - lo */
    int nstate;                  /* o's state tensors (0 without o) */
    FILE *f;
    uint64_t file_bytes, data_start;
    char *header;
    pdp__st_parser p;
    pdp__st_entry **sorted;
    pdp__ckpt_sums *sums, *check; /* check: sums when the file has checksums, else NULL */
    bool shard;                  /* a shard file ("format": "pdp-shard") */
    int alias;                   /* the parameter "lm_head.weight" stands for, or -1
                                    (pdp__ckpt_alias_param) */
    pdp_optim_desc desc;         /* the file's optimizer (with o) */
    int64_t steps;
    uint64_t seed, mstep;        /* "model.seed", "model.step", when have_seed, have_step */
    bool have_seed, have_step;
    float *staging;              /* count (1 + nstate) floats: params, then each state */
} pdp__ckpt_loader;

/* Opens the file and reads, parses and validates its header (the data's tiling too). */
PDP__PRIVATE pdp_status pdp__ckpt_load_open(pdp__ckpt_loader *L);

/* Verifies the header's checksum and takes each tensor's (a file without any: unverified). */
PDP__PRIVATE pdp_status pdp__ckpt_load_sums(pdp__ckpt_loader *L);

/* Reads the optimizer's metadata (with o) and the model's seed and step. */
PDP__PRIVATE pdp_status pdp__ckpt_load_meta(pdp__ckpt_loader *L);

/* A full file or a shard file, as the call allows; a shard's range and run are the call's. */
PDP__PRIVATE pdp_status pdp__ckpt_load_kind(pdp__ckpt_loader *L);

/* A shard file's tensors ("params", "optim.<state>"): each present, F32 [count], read into
   its part of the staging buffer and checked against its checksum. */
PDP__PRIVATE pdp_status pdp__ckpt_load_shard_tensors(pdp__ckpt_loader *L);

/* A full file's tensors (the model's names, "optim.<name>.<state>"): each present, F32, the
   model's shape; the part inside [lo, hi) read into the staging buffer (the whole tensor
   checked against its checksum). A tied head's weight the file lacks is read from its
   alias "lm_head.weight" when the file has that. */
PDP__PRIVATE pdp_status pdp__ckpt_load_full_tensors(pdp__ckpt_loader *L);

/* Every expected tensor checked against the model and read (CRC-checked) into staging. */
PDP__PRIVATE pdp_status pdp__ckpt_load_tensors(pdp__ckpt_loader *L);

/* Reads bytes [at, at + n) of tensor e's data, as stored, into dst and continues *crc over
   them: a whole tensor streamed in pieces, then checked with pdp__ckpt_crc_check. */
PDP__PRIVATE pdp_status pdp__ckpt_read_bytes(const pdp__ckpt_loader *L, const pdp__st_entry *e,
                                             uint64_t at, unsigned char *dst, size_t n,
                                             uint32_t *crc);

/* The bits of the little-endian float32 at p, on any host, and that float. */
PDP__PRIVATE uint32_t pdp__ckpt_u32le(const unsigned char *p);

PDP__PRIVATE double pdp__ckpt_f32le(const unsigned char *p);

/* "[i, j, ...]": the multi-index of element at (row-major) of a tensor of that shape. */
PDP__PRIVATE void pdp__ckpt_index_text(char *buf, size_t cap, int ndim, const int64_t *shape,
                                       int64_t at);

/* "lm_head.weight" in a file whose model ties its head (L->alias): F32 of the tied
   parameter's shape and, when the file has that parameter too, equal to it bit for bit
   (streamed through the loader's chunk, half each; both checksums verified when the file
   has them). When the file has only the alias, pdp__ckpt_load_full_tensors read it. */
PDP__PRIVATE pdp_status pdp__ckpt_load_alias(const pdp__ckpt_loader *L, const pdp__st_entry *e);

/* A "<prefix>.attn.bias" the model lacks (pdp__ckpt_mask_name): F32 [1, 1, S, S] holding
   exactly the causal mask, 1 on and below the diagonal and 0 above (+0, bit for bit), as
   nanoGPT's torch.tril(torch.ones(S, S)); streamed through the loader's chunk, its checksum
   verified when the file has them. Anything else is an extra tensor (PDP_ERR_SHAPE). */
PDP__PRIVATE pdp_status pdp__ckpt_check_mask(const pdp__ckpt_loader *L, const pdp__st_entry *e);

/* No tensor in the file that the model (or the optimizer) does not have, but nanoGPT's
   two (checkpoint.h): the tied head's alias (checked against the parameter) and
   causal-mask buffers (checked, then skipped). */
PDP__PRIVATE pdp_status pdp__ckpt_load_extra(const pdp__ckpt_loader *L);

/* All checks passed: the staged parameters and state onto the model's device, the
   model's seed and step, the optimizer's hyper-parameters and step count. */
PDP__PRIVATE pdp_status pdp__ckpt_load_commit(pdp__ckpt_loader *L);

/* Closes the file and frees what the steps allocated (after a failure too). */
PDP__PRIVATE void pdp__ckpt_load_close(pdp__ckpt_loader *L);

/* Loads the parameters [lo, hi) into params (when with_params) and o's state
   for [lo, hi) (o may be NULL) from a full checkpoint (its slice) or, when
   allow_shard, from a shard file of exactly [lo, hi); with run, only from a
   shard file of exactly [lo, hi) whose "shard.run" is run. */
PDP__PRIVATE pdp_status pdp__ckpt_load(const char *path, pdp_model *m, float *params,
                                       bool with_params, pdp_optim *o, int64_t lo, int64_t hi,
                                       bool allow_shard, const char *run, const char *fn);

/* PDP_API pdp_status pdp_checkpoint_load(const char *path, pdp_model *m, pdp_optim *o) */

PDP__PRIVATE pdp_status pdp__checkpoint_load_run(const char *path, pdp_model *m, float *params,
                                                 pdp_optim *o, int64_t lo, int64_t hi,
                                                 const char *run, const char *fn);

PDP__PRIVATE pdp_status pdp__checkpoint_load_range(const char *path, pdp_model *m, float *params,
                                                   pdp_optim *o, int64_t lo, int64_t hi,
                                                   const char *fn);

/* ---- src/dp.c ---- */
/* dp: DataParallel over persistent worker threads, parameter-server style.

   This is torch.nn.DataParallel (Li et al., "PyTorch Distributed", VLDB 2020,
   section 2; torch/nn/parallel/data_parallel.py) written so that each stage is
   one function: pdp__dp_replicate, pdp__dp_scatter, pdp__dp_parallel_apply,
   pdp__dp_gather, pdp__dp_reduce, pdp__dp_master_step. The master (device 0)
   sends parameters and shards, receives outputs and gradients, holds the
   optimizer state and runs the update: every byte passes through it, which is
   why the literature calls DP a parameter-server design that overloads device
   0, and why DDP (ddp.c) replaces the gather-reduce-step-replicate round trip
   with an all-reduce among equals.

   Threads. One worker per replica ("one host thread per device"): workers
   1..N-1 are persistent threads created by pdp_dp_create and reused by every
   step; worker 0, which runs the master's replica and the first slice of the
   reduce, is the calling thread itself. The workers are a pdp__team (threads.c),
   the hand-off the intra-op pool uses too: pdp__dp_run_job publishes the job as
   a new generation, runs worker 0's part, and returns when every worker has run
   its part; both sides spin a while before they sleep. Shards are written
   before the hand-off and results read after it, so the team's mutex orders
   every read (TSan clean). Each worker sets its own intra-op thread count
   (threads_per_worker, default 1), since that setting is per thread; the caller
   switches to it for its part and back.

   Invariants. (1) Shards are balanced and contiguous: replica i gets
   B/N + (i < B%N) samples starting after replica i-1's, so idle replicas
   (B < N) are always the last ones. (2) Replica i's loss gradient is scaled by
   1/B (the global batch), so the SUM of the replicas' gradients is the
   gradient of the global mean loss. (3) The reduce adds, for every element,
   g0 + g1 + g2 + ... in replica order whatever thread runs the slice, so the
   result does not depend on the slicing or on timing. (4) Dropout masks are
   keyed by (seed, layer, step, global sample index): before each forward a
   replica gets the master's step and sample_base = its first global sample,
   which positions it in the one counter-based random stream exactly where a
   single device would be - one seeded stream per replica, whose union is the
   single-device stream. Hence N workers reproduce one device on the same
   global batch to float rounding, and one worker reproduces it bit for bit.
   (5) After the first step at the largest batch nothing is allocated and no
   thread is created.

   Choices, and where they differ from PyTorch. torch's parallel_apply starts a
   thread per replica and the caller waits; here the master's shard runs on the
   calling thread itself: a caller that only dispatches and waits is one more
   thread to wake twice a step, competing with the workers for the cores (with 2
   workers on 2 cores, the MLP at batch 128 lost 0.3-0.5 ms of a 3.5 ms step to
   those hand-offs; bench/dp measures the step against its bound).
   torch.chunk gives every replica ceil(B/N) samples and the last one the rest;
   balanced shards keep the slowest replica, which sets the step time, at most
   one sample above the others. torch reduces on device 0 (reduce_add); on a
   CPU that would leave N-1 cores idle, so by default each worker sums one slice
   of the flat gradient (reduce_on_master restores torch's placement, with the
   same bits). On CPU replicas the master's step is fused into that reduce: each
   worker updates the parameters of the slice it has just summed, chunk by chunk
   while the chunk is in cache, instead of one thread stepping everything while
   the others wait (pdp__dp_fused_step).

   GPUs. With CUDA devices the stages are torch's own: replicate copies the
   master's parameters (device 0) into each replica's own parameter block on its
   device (a peer copy; a device-local copy for a replica on device 0); scatter
   copies each shard's rows to its replica's device (host -> device i or device
   0 -> device i) unless they already live there; each worker thread drives its
   GPU (pdp_cuda.cu makes the thread's device current on every call), so the
   apply of N GPUs runs at once; gather peer-copies the outputs to device 0; and
   reduce, on the calling thread, peer-copies replica r's gradients into one
   staging block on device 0 (allocated at create) and adds them into the
   master's, r = 1, 2, ... in order - torch's reduce_add. A replica on device 0
   is added straight from its own block. Several workers may share a GPU (more
   workers than devices): each has its own replica and buffers, their kernels
   interleave on that device's stream. All devices are CUDA or none is; without
   PDP_CUDA, CUDA devices fail with PDP_ERR_UNSUPPORTED naming the macro. */

/* #include "internal.h" (above) */

/* ---- dp: the object ---- */

typedef enum pdp__dp_job {
    PDP__DP_JOB_NONE = 0,
    PDP__DP_JOB_APPLY,   /* forward, loss, backward on this worker's shard */
    PDP__DP_JOB_REDUCE   /* sum one slice of the replicas' gradients into the master (and
                            step it, when step_opt is set) */
} pdp__dp_job;

typedef struct pdp__dp_worker {
    pdp_dp *dp;
    int index;
    pdp_device device;
    pdp_model *replica;  /* index 0: the master itself */
    /* written by scatter (caller), read by the worker */
    int64_t first, rows; /* global samples [first, first + rows) */
    pdp_tensor x;        /* those rows of the batch (a view, or xbuf on another device) */
    float *xbuf;         /* [cap_xbuf] the rows when the batch lives on another device */
    int64_t cap_xbuf;    /* floats */
    const int32_t *labels;
    float *dlogits;      /* [cap_rows, classes] loss gradient, on the replica's device */
    int64_t cap_rows;
    /* written by the worker, read by the caller after the handoff */
    double loss_sum;
    double apply_s;      /* wall seconds of this worker's apply */
    double cpu_s;        /* CPU seconds of this worker's last job */
    pdp_status status;
    char msg[512];
} pdp__dp_worker;

struct pdp_dp {
    pdp_model *master;
    pdp_dp_desc desc;    /* defaults filled (pdp__dp_desc_defaults); devices: a copy */
    pdp_device *devices; /* [n] the desc's devices, NULL when it gave none */
    int n;
    int threads_per_worker;
    bool copy_params;
    bool reduce_on_master;
    bool cuda;           /* the replicas are on CUDA devices */
    float *stage;        /* [param_count] on the master's device: one replica's gradients
                            in flight to the reduce (CUDA, replicas on other devices) */
    int64_t classes;     /* the output's last dimension: classes, or a GPT's vocabulary */
    int64_t positions;   /* label rows a sample: 1 ([B, classes]), T ([B, T, vocab]) */
    int64_t per_sample;  /* output floats a sample: positions x classes */
    int out_ndim;        /* a sample's output: 1 or 2 dimensions */
    int64_t out_shape[2];
    int64_t counted;     /* labels of this step's batch that count (not -1) */
    pdp__dp_worker *workers;
    pdp__team team;      /* members 1..n-1 are workers 1..n-1 (threads.c) */
    pdp__dp_job job;     /* the job pdp__dp_run_job hands to the team */
    /* this step, set by the caller before the handoff */
    int64_t batch;
    int active;          /* replicas with at least one sample */
    float grad_scale;    /* 1 / batch */
    bool zero_master;    /* replica 0 zeroes the master's gradients first */
    pdp_optim *step_opt; /* non-NULL: the reduce also steps each slice it sums */
    pdp__optim_scalars step_s; /* step_opt's update scalars, taken once per step */
    double jobs_cpu;     /* CPU seconds the caller spent in jobs this step: as worker 0,
                            and spinning for the others (their CPU time counts instead) */
    /* gathered outputs on the master's device */
    float *out_block;
    int64_t out_cap;     /* floats */
    pdp_tensor output;
    bool have_output;
    size_t optim_bytes;  /* the master's optimizer state, seen at the last step */
    pdp_dp_stats stats;
};

/* ---- dp: memory accounting ---- */

/* Bytes a model holds on its device, from the plan pdp_model_reserve allocates by. */
PDP__PRIVATE size_t pdp__dp_model_bytes(const pdp_model *m);

PDP__PRIVATE void pdp__dp_memory(pdp_dp *dp);

/* ---- dp: workers ---- */

/* CPU seconds used by the calling thread: unlike wall time, it does not count
   the time a busy machine keeps the thread waiting for a core. */
PDP__PRIVATE double pdp__dp_thread_cpu(void);

/* Parallel apply, one replica: forward, loss against its labels, backward. */
PDP__PRIVATE void pdp__dp_apply_one(pdp__dp_worker *w);

/* Reduce, one slice: master.grad[lo, hi) += replica[1..active-1].grad[lo, hi), in
   replica order. Slices are multiples of 16 floats (one cache line) so no two
   threads write the same line; chunks of 4096 floats keep the master's part in L1
   while each replica is added, and, when the step is fused (step_opt), while the
   optimizer updates the chunk's parameters from it: the update is element-wise, so
   stepping slice by slice gives the bits of one pdp_optim_step after the reduce. */
PDP__PRIVATE void pdp__dp_reduce_slice(pdp_dp *dp, int slice, int nslices);

/* One worker's part of a job: its replica's apply, or its slice of the reduce. */
PDP__PRIVATE void pdp__dp_do_job(pdp__dp_worker *w, pdp__dp_job job);

/* The team's job: worker i's part, with the workers' intra-op thread count (the
   caller switches to it for its part and back; a worker thread keeps it). */
PDP__PRIVATE void pdp__dp_team_job(void *arg, int i, int n);

/* Runs one job: hands it to workers 1..n-1 (the team), runs worker 0's part on the
   calling thread, and waits until all are done. */
PDP__PRIVATE void pdp__dp_run_job(pdp_dp *dp, pdp__dp_job job);

/* ---- dp: lifecycle ---- */

PDP__PRIVATE void pdp__dp_destroy(pdp_dp *dp);

/* The one place pdp_dp_desc's zeros become defaults (sokol's _def; pdp_dp_get_desc
   returns its result) and its numbers are checked; in may be NULL. The devices are
   checked against the master by pdp_dp_create. */
PDP__PRIVATE pdp_status pdp__dp_desc_defaults(const pdp_dp_desc *in, pdp_dp_desc *out);

/* PDP_API pdp_status pdp_dp_create(pdp_dp **out, pdp_model *master, const pdp_dp_desc *desc) */

/* PDP_API void pdp_dp_free(pdp_dp *dp) */

/* PDP_API int pdp_dp_num_workers(const pdp_dp *dp) */

/* PDP_API pdp_dp_desc pdp_dp_get_desc(const pdp_dp *dp) */

/* PDP_API const pdp_tensor *pdp_dp_output(const pdp_dp *dp) */

/* ---- dp: the stages ---- */

/* Replicate: master parameters -> replicas 1..active-1, and the state that keys
   dropout (training flag, step). A CPU replica that shares the master's memory
   only re-points at it; a copying replica (copy_params, or another device) gets
   a fresh copy, as torch's replicate() broadcasts the parameters every step. */
PDP__PRIVATE pdp_status pdp__dp_replicate(pdp_dp *dp, const char *fn);

/* Scatter: split x and labels along dimension 0 into balanced contiguous shards.
   On the CPU a shard is a view of the caller's batch (no copy); the bytes count
   what a multi-device DP sends. Grows the loss-gradient buffers (first step). */
PDP__PRIVATE pdp_status pdp__dp_scatter(pdp_dp *dp, const pdp_tensor *x, const int32_t *labels,
                                        const char *fn);

/* Parallel apply: every worker runs its replica at once; the first failure (lowest
   worker index, so the report does not depend on timing) comes back naming it. */
PDP__PRIVATE pdp_status pdp__dp_parallel_apply(pdp_dp *dp, bool zero_master, double *cpu,
                                               const char *fn);

/* Gather: outputs of every replica into one [batch, classes] tensor on the master,
   and the loss sums, added in replica order in double. */
PDP__PRIVATE pdp_status pdp__dp_gather(pdp_dp *dp, double *loss_sum, const char *fn);

/* Reduce: the replicas' gradients summed into the master's (which already holds
   replica 0's). Each worker sums one slice, or the master's worker sums it all
   (reduce_on_master, torch's reduce_add on device 0); same bits either way. With
   step_opt the workers also step the slices they sum (pdp__dp_fused_step). */
PDP__PRIVATE void pdp__dp_reduce(pdp_dp *dp, pdp_optim *step_opt, double *cpu);

/* Reduce on GPUs, on the calling thread (device 0): replica r's gradients are
   peer-copied into the staging block and added into the master's, r = 1, 2, ...
   in order, so every element is g0 + g1 + g2 + ... as on the CPU. The copy waits
   for replica r's backward; the adds queue on device 0's stream in order. */
PDP__PRIVATE pdp_status pdp__dp_reduce_device(pdp_dp *dp, const char *fn);

/* The optimizer the CPU reduce may run inside its slices, or NULL: on CPU replicas
   the master's step costs one core a pass over every parameter while the others
   wait; fused, each worker updates the slice it has just summed, still in cache.
   Only for a whole-model optimizer that pdp_optim_step would accept (its checks run
   first, so an error is reported before anything changes), and with 2+ workers
   active (one worker runs no reduce). */
PDP__PRIVATE pdp_status pdp__dp_fused_step(pdp_dp *dp, pdp_optim *opt, pdp_optim **out,
                                           const char *fn);

/* Step: the optimizer updates the master's parameters; replicas see them at the
   next replicate. */
PDP__PRIVATE pdp_status pdp__dp_master_step(pdp_optim *opt, const char *fn);

/* ---- dp: one step ---- */

PDP__PRIVATE pdp_status pdp__dp_run(pdp_dp *dp, pdp_optim *opt, const pdp_tensor *x,
                                    const int32_t *labels, float *loss, bool zero_and_step,
                                    const char *fn);

/* The master's optimizer, for its memory figure, when steps go through the optimizer and
   not pdp_dp_step (pdp_trainer's DP: pdp_dp_forward_backward, then pdp_optim_step). */
PDP__PRIVATE void pdp__dp_count_optim(pdp_dp *dp, const pdp_optim *opt);

/* PDP_API pdp_status pdp_dp_step(pdp_dp *dp, pdp_optim *opt, const pdp_tensor *x, const int32_t *labels, float *loss) */

/* PDP_API pdp_status pdp_dp_forward_backward(pdp_dp *dp, const pdp_tensor *x, const int32_t *labels, float *loss) */

/* ---- dp: stats ---- */

/* PDP_API pdp_status pdp_dp_get_stats(const pdp_dp *dp, pdp_dp_stats *out) */

/* PDP_API int pdp_dp_stats_format(const pdp_dp_stats *s, char *buf, size_t bytes) */

/* ---- src/reducer.c ---- */
/* reducer: the bucket reducer that DDP and ZeRO share, PyTorch's Reducer
   (torch/csrc/distributed/c10d/reducer.cpp) in miniature, with the collective
   of a bucket as a parameter.

   Buckets are planned once, at construction, walking the parameters in reverse
   registration order and closing a bucket as soon as it holds cap bytes or more
   (the first: first bytes), PyTorch's compute_bucket_assignment_by_size.
   Because the model keeps its gradients in one block in registration order, a
   bucket of consecutive parameters in reverse order is one contiguous range
   [offset, offset + count) of that block: the collective runs on the gradients
   themselves, with no flattening copy (PyTorch's gradient_as_bucket_view=True,
   here by construction).

   The executor hands in its collective, one function pointer called once per
   bucket per synchronised backward (the only indirection on the hot path):
   DDP all-reduces (average) the bucket in place; ZeRO reduce-scatters it into
   the part of the flat block its rank owns. An optional after_step hook runs
   after the optimizer step (ZeRO: all-gather the updated parameters); op_name
   names the collective in the trace ("allreduce bucket 3"). With whole_layers
   a bucket never splits a layer's weight from its bias (ZeRO's units, whose
   layers it points at per-unit buffers). bucket_done (optional) runs after a
   bucket's collective has completed successfully, whoever waited for it
   (pdp__reducer_wait_bucket: finish, or the executor reusing a buffer).

   A communication hook (ddp.h's pdp_ddp_comm_hook, PyTorch's register_comm_hook)
   replaces the collective: the executor's reduce builds the bucket's view (what
   its collective would reduce, and where the result goes) and hands it to
   pdp__reducer_hook_launch, which calls the hook's launch with the bucket's piece
   of the scratch memory allocated once at registration; pdp__reducer_wait_bucket
   calls the hook's finish after the wait, before bucket_done, and a failing
   finish is reported like a failed collective, naming the bucket. Registration
   is refused once a backward has run (the buckets' collectives must be the same
   on every rank from the first step on).

   Every backward of the wrapped model synchronises, whatever computed its
   output gradient (the built-in cross-entropy, pdp_loss_mse, a user's own
   loss): the reducer listens to the model's BACKWARD_BEGIN and BACKWARD_END
   events (the executor seam of internal.h), arms itself at the start of every
   pdp_model_backward unless no_sync is on, and launches the leftover buckets
   at its end. A backward while the last one's buckets are still being reduced
   is refused by BACKWARD_BEGIN with a message naming the executor's finish.
   The executor may listen to the events too (desc.event: ZeRO points the
   layers at its buffers there).

   Per synchronised backward: pending[b] starts at the number of parameters in
   bucket b; the model's grad hook, fired once per parameter right after its
   layer's backward, decrements it; at zero the bucket is ready. Ready buckets
   launch strictly in bucket order (a later bucket that is ready first waits for
   the earlier ones), so every rank issues the same collectives in the same
   order whatever order its hooks fire in. A bucket whose parameters never get
   a gradient (unused in this forward) launches at the end of backward, so no
   rank waits on it. pdp__reducer_finish waits for the buckets in order and
   reports the first failure naming the bucket and its parameters.

   Uneven shards: with batch_mean PDP_BATCH_MEAN_GLOBAL (ddp.h) the reducer's own
   backward entries weight each backward by this rank's share of the global batch
   (one all-reduce of the batch sizes, then the loss gradient scaled before
   backward: "the global-batch mean" below); a backward that bypasses them
   (pdp_model_backward on the model) is refused at BACKWARD_BEGIN.

   States: IDLE (nothing pending), LOCAL (gradients accumulated under no_sync,
   not reduced), REDUCING (a synchronised backward launched its buckets and
   finish has not run). The progress of a bucket's collective writes the
   gradient memory, so nothing else may touch the gradients while REDUCING: a
   second backward is refused and pdp__reducer_release waits first. Nothing on
   the per-step path allocates: buckets, handles (the backends' pools) and
   messages are fixed-size. Every function takes fn, the public function on
   whose behalf it runs, to start its messages. */

/* #include "internal.h" (above) */

/* ---- reducer: state ---- */

typedef enum pdp__red_state {
    PDP__RED_IDLE,
    PDP__RED_LOCAL,
    PDP__RED_REDUCING
} pdp__red_state;

typedef struct pdp__reducer pdp__reducer;

/* Launches bucket b's collective (asynchronously, handle in *w) on r->c; the
   bucket is r->buckets[b].info, the gradients r->m->grad_block. */
typedef pdp_status (*pdp__reduce_fn)(pdp__reducer *r, int b, pdp_work **w);
/* Runs after the optimizer step of pdp__reducer_step (ZeRO: all-gather). */
typedef pdp_status (*pdp__after_step_fn)(pdp__reducer *r, const char *fn);
/* Runs once bucket b's collective has completed successfully. */
typedef void (*pdp__bucket_done_fn)(pdp__reducer *r, int b);

typedef struct pdp__reducer_desc {
    double cap_bytes;              /* close a bucket at >= this many bytes */
    double first_bytes;            /* the same for bucket 0 */
    pdp__reduce_fn reduce;         /* required */
    pdp__after_step_fn after_step; /* NULL: nothing */
    const char *op_name;           /* the collective's name in the trace ("allreduce") */
    const char *finish_names;      /* for messages: "pdp_ddp_step or pdp_ddp_finish" */
    void *user;                    /* the executor, for reduce and after_step */
    bool whole_layers;             /* never split a layer between buckets */
    pdp__bucket_done_fn bucket_done;  /* NULL: nothing */
    pdp__model_event_fn event;        /* the model's events (BACKWARD_BEGIN/END after the
                                         reducer's own handling), user = the reducer */
    pdp_batch_mean batch_mean;        /* ddp.h; GLOBAL: each backward's weight (below) */
    int stage;                        /* ZeRO's stage, 0 under DDP: checked equal on every
                                         rank, as batch_mean and the caps are */
    const char *backward_names;       /* for messages: "pdp_ddp_forward_backward or
                                         pdp_ddp_backward" */
} pdp__reducer_desc;

typedef struct pdp__red_bucket {
    pdp_ddp_bucket info;
    int nparams;
    int pending;          /* parameters still to report in this backward */
    bool ready, launched;
    bool hook_pending;    /* the comm hook launched it: its finish is still to run */
    pdp_work *work;
    double t_launch;
    pdp_comm_hook_bucket view; /* what the comm hook was given (finish gets the same) */
} pdp__red_bucket;

struct pdp__reducer {
    pdp_model *m;
    pdp_comm *c;
    pdp__reducer_desc desc;
    pdp__red_bucket *buckets;
    int nbuckets;
    int *bucket_of;       /* per parameter */
    int next_launch;      /* the first bucket not launched yet */
    pdp__red_state state;
    bool no_sync;
    bool armed;           /* the hook reduces (a synchronised backward is running) */
    bool failed;          /* the last synchronised backward failed: gradients incomplete */
    pdp_status launch_status;
    char launch_msg[512];
    int twice_param;      /* a parameter reported twice in one backward, or -1 */
    int launched_in_backward; /* buckets launched by the grad hook (before backward ended) */
    pdp_status wait_status;   /* the first failed bucket wait of this backward */
    char wait_msg[832];
    double busy;              /* execution seconds of this backward's waited buckets */
    int64_t bytes_at_arm;
    double backward_acc;  /* forward + backward seconds since the last finish */
    pdp_ddp_stats stats;  /* grad_bytes is the executor's to set */
    bool traced;
    int trace_compute, trace_comm;
    bool backward_seen;   /* a backward has run: too late to register a comm hook */
    pdp_ddp_comm_hook hook; /* hook.launch NULL: none; the executor's own collective */
    void *scratch;        /* the hook's scratch memory on the model's device, or NULL */
    int64_t *scratch_off; /* per bucket: its piece of scratch, in floats of the gradient */
    /* batch_mean GLOBAL: the all-reduced batch size of the backward being prepared */
    float count;          /* this rank's batch size, then (after the wait) the global batch */
    float *dcount;        /* its copy on the communicator's device (NULL on the CPU) */
    pdp_work *count_work; /* the all-reduce in flight, or NULL */
    int64_t count_bytes;  /* bytes of those all-reduces since the last finish (stats) */
    bool weighted;        /* the backward running now had its weight applied */
};

/* ---- reducer: buckets ---- */

/* The plan (the header's rule): walks m's parameters in reverse, closing a bucket at
   >= cap bytes (the first at first; whole_layers: never between a layer's weight and
   bias). Fills buckets and bucket_of when not NULL; returns the number of buckets. */
PDP__PRIVATE int pdp__reducer_walk(const pdp_model *m, double cap, double first, bool whole_layers,
                                   pdp__red_bucket *buckets, int *bucket_of);

PDP__PRIVATE pdp_status pdp__reducer_plan(pdp__reducer *r);

/* ---- reducer: the bucket options of DDP's and ZeRO's descs ----
   One rule for both creates, checked before anything is allocated or communicated.
   bucket_cap_mb and first_bucket_mb (MiB): 0 (the default: 25, and min(1, cap)) or
   finite in (0, 1e12] (1e12 MiB, 2^60 bytes, is beyond any model and keeps every byte
   figure an exact int64). ZeRO's buffer counts (NULL: not an option of the caller):
   grad_buffers 0 (default 2) or 1..U and param_buffers 0 (default 2) or 2..max(2, U),
   U the number of units these bucket sizes give m: unit u takes gradient buffer
   u mod grad_buffers, so buffers beyond U would never be used, and two gather slots
   (the unit computing and the next one's prefetch) are the least stage 3 needs. Every
   failure names the field and its value. */
PDP__PRIVATE pdp_status pdp__bucket_opts_check(const pdp_model *m, double cap_mb, double first_mb,
                                               const int *gbufs, const int *pbufs, const char *fn);

/* "bucket 1 of 3 (0.weight..0.bias, 1.57 MiB)" */
PDP__PRIVATE void pdp__red_bucket_name(const pdp__reducer *r, int b, char *out, size_t cap);

PDP__PRIVATE void pdp__reducer_launch(pdp__reducer *r, int b);

/* Launches every ready bucket that has no unlaunched bucket before it. */
PDP__PRIVATE void pdp__reducer_launch_ready(pdp__reducer *r);

/* The model's grad hook: parameter p's gradient is final for this backward. */
PDP__PRIVATE void pdp__reducer_hook(void *user, pdp_model *m, int p);

PDP__PRIVATE void pdp__reducer_arm(pdp__reducer *r);

PDP__PRIVATE pdp_status pdp__reducer_finish(pdp__reducer *r, const char *fn); /* below */

/* The model's events. BACKWARD_BEGIN refuses a backward while the last one is
   being reduced and arms the reducer (unless no_sync); BACKWARD_END launches the
   buckets whose parameters got no gradient and records the state; ZERO_GRAD waits for the
   buckets in flight and forgets what no_sync accumulated. */
PDP__PRIVATE pdp_status pdp__reducer_event(void *user, pdp_model *m, pdp__model_event ev, int layer,
                                           pdp_status st);

/* ---- reducer: construction ---- */

/* One parameter as the construction check compares it. */
typedef struct pdp__red_sig {
    char name[64];
    int64_t ndim;
    int64_t shape[4];
} pdp__red_sig;

PDP__PRIVATE void pdp__red_sig_of(const pdp_model *m, int p, pdp__red_sig *s);

PDP__PRIVATE void pdp__red_sig_str(const pdp__red_sig *s, char *out, size_t cap);

/* All-gather of count host floats per rank. Collective buffers live on the
   communicator's device (NCCL reads GPU memory only), so a GPU communicator
   stages them through a small device buffer; used once, at construction. */
PDP__PRIVATE pdp_status pdp__reducer_allgather_host(pdp_comm *c, const float *send, float *recv,
                                                    int64_t count);

/* Every rank compares its registry with rank 0's; all learn the first
   difference of every rank through an all-gather, so all fail together. */
PDP__PRIVATE pdp_status pdp__reducer_check_params(const pdp_model *m, pdp_comm *c,
                                                  const pdp__reducer_desc *d, const char *fn);

/* Sets up r (zeroed memory, owned by the executor) on m and c, on this rank alone: checks
   that the model can take a reducer and plans the buckets. Then pdp__reducer_join. On
   failure of either the executor calls pdp__reducer_release(r). */
PDP__PRIVATE pdp_status pdp__reducer_init(pdp__reducer *r, pdp_model *m, pdp_comm *c,
                                          const pdp__reducer_desc *desc, const char *fn);

/* The collective half of the set-up, after pdp__reducer_init succeeded on every rank (the
   executor agrees on it first, pdp__comm_agree): checks that every rank has the same
   parameters, copies rank 0's parameters to every rank, zeroes the gradients, opens the
   trace and installs the grad hook. A failure here is every rank's (the check's verdicts
   are all-gathered; a failed broadcast fails everywhere or times out). */
PDP__PRIVATE pdp_status pdp__reducer_join(pdp__reducer *r, const char *fn);

/* Waits for buckets still in flight, removes the hook, frees the buckets. */
PDP__PRIVATE void pdp__reducer_release(pdp__reducer *r);

/* ---- reducer: communication hooks ---- */

/* Registers hook (fn names the public entry: pdp_ddp_register_comm_hook or
   pdp_zero_register_comm_hook). The scratch is total floats' worth of
   hook->scratch_bytes_per_float bytes on the model's device, allocated here once;
   bucket b's piece starts off[b] floats in (off NULL: at the bucket's offset in the
   flat block, total = the parameter count). */
PDP__PRIVATE pdp_status pdp__reducer_set_hook(pdp__reducer *r, const pdp_ddp_comm_hook *hook,
                                              const int64_t *off, int64_t total, const char *fn);

/* The executor's reduce with a hook registered: v holds the collective's part of the
   view (grad, count, reduce_scatter, recv, recv_count); the rest is filled here. */
PDP__PRIVATE pdp_status pdp__reducer_hook_launch(pdp__reducer *r, int b,
                                                 const pdp_comm_hook_bucket *v, pdp_work **w);

/* ---- reducer: the global-batch mean ----
   batch_mean PDP_BATCH_MEAN_GLOBAL (ddp.h): rank r's batch of n_r samples weighs
   w_r = N n_r / T in the average over ranks, T = sum of n_r (one all-reduce of
   one float per backward, exact up to 2^24 samples), so the averaged gradient is
   sum_r n_r g_r / T, that of the mean loss over the concatenated global batch.
   The weight multiplies the loss gradient dy before backward (backward is linear
   in dy): the built-in cross-entropy takes N / T as its grad_scale instead of
   1 / n_r, an own loss's dy is copied into the model's grad_a scaled by w_r. So
   each backward is weighted by its own global batch, and k accumulated backward
   passes sum k global-batch means, as k backward passes on one device. */

/* Starts the all-reduce (sum) of this rank's batch size n; its bytes go to the
   executor's stats. */
PDP__PRIVATE pdp_status pdp__reducer_count_launch(pdp__reducer *r, int64_t n, const char *fn);

/* Waits for it: *weight = N n / T for this rank's n, *scale = N / T (both 0 when T is 0:
   every label of the global batch ignored, a batch that teaches nothing). */
PDP__PRIVATE pdp_status pdp__reducer_count_wait(pdp__reducer *r, int64_t n, float *weight,
                                                float *scale, const char *fn);

/* The labels the built-in cross-entropy counts for x: its rows (a sample's one, a GPT's
   one a position: the last layer's per-sample rows) whose label is not -1. */
PDP__PRIVATE int64_t pdp__reducer_label_count(const pdp_model *m, const pdp_tensor *x,
                                              const int32_t *labels);

/* The built-in cross-entropy pass weighted by the global batch (loss.c's
   pdp_model_forward_backward with grad_scale N / T, T the labels that count on all
   ranks): the counts' all-reduce runs during the forward. *loss is this rank's mean. */
PDP__PRIVATE pdp_status pdp__reducer_forward_backward_global(pdp__reducer *r, const pdp_tensor *x,
                                                             const int32_t *labels, float *loss,
                                                             const char *fn);

/* An own loss's backward weighted by the global batch: dy x N n / T into the
   model's grad_a (which backward accepts as dy), then backward from it. */
PDP__PRIVATE pdp_status pdp__reducer_backward_global(pdp__reducer *r, const pdp_tensor *dy,
                                                     const char *fn);

/* ---- reducer: training ---- */

/* The global index of this rank's first sample, for the keys of its dropout masks: rank x
   its batch, as when every rank holds an equal shard of the global batch in rank order (a
   DistributedSampler's); the masks are then the single-device run's on the whole batch, and
   two ranks never draw the same masks for their i-th samples. */
PDP__PRIVATE void pdp__reducer_sample_base(pdp__reducer *r, const pdp_tensor *x);

/* Forward, loss and backward on this rank's shard; the buckets launch as their
   gradients become ready (unless no_sync): the model's events do it. */
PDP__PRIVATE pdp_status pdp__reducer_backward(pdp__reducer *r, const pdp_tensor *x,
                                              const int32_t *labels, float *loss, const char *fn);

/* A user's own loss: forward on this rank's shard (*y: the model's output). */
PDP__PRIVATE pdp_status pdp__reducer_forward(pdp__reducer *r, const pdp_tensor *x,
                                             const pdp_tensor **y, const char *fn);

/* ... and backward from dy, the gradient of the user's loss with respect to y. */
PDP__PRIVATE pdp_status pdp__reducer_backward_dy(pdp__reducer *r, const pdp_tensor *dy,
                                                 const char *fn);

/* The wait of bucket b's handle: records its time, its trace event and the first
   failure (named after the bucket). */
PDP__PRIVATE pdp_status pdp__reducer_wait_work(pdp__reducer *r, int b);

/* Waits for bucket b if it was launched and not waited yet, runs the comm hook's
   finish (a failure is recorded as the wait's, named after the bucket), then
   bucket_done on success. */
PDP__PRIVATE void pdp__reducer_wait_bucket(pdp__reducer *r, int b);

/* Waits for every bucket of the last synchronised backward, in bucket order;
   the first failure names its bucket and parameters. */
PDP__PRIVATE pdp_status pdp__reducer_finish(pdp__reducer *r, const char *fn);

/* After a successful finish: opt's step (a range optimizer steps its range
   only), zeroed gradients, then the executor's after_step. */
PDP__PRIVATE pdp_status pdp__reducer_step(pdp__reducer *r, pdp_optim *opt, const char *fn);

PDP__PRIVATE void pdp__reducer_reset_stats(pdp__reducer *r);

/* ---- src/ddp.c ---- */
/* ddp: DistributedDataParallel, the executor that runs reducer.c's bucket
   reducer with an all-reduce.

   Each bucket's collective is an all-reduce (average over ranks) in place on
   the bucket's range of the model's gradient block, so after pdp_ddp_finish
   every rank holds the averaged gradients of the whole block and steps a full
   optimizer on it; there is no after-step collective. Buckets are planned from
   bucket_cap_mb and first_bucket_mb (MiB, 2^20 bytes, as PyTorch's). The
   states, the ordering of launches and the failure reports are the reducer's
   (reducer.c). A registered comm hook (ddp.h) replaces the all-reduce; the
   built-in bf16/fp16 compression hooks live here and serve ZeRO too. */

/* #include "internal.h" (above) */

struct pdp_ddp {
    pdp__reducer r;       /* first: the grad hook's user pointer is &d->r */
    pdp_ddp_desc desc;
    pdp_model *held;      /* the model this executor wrapped (pdp__model_wrap) */
};

/* The DDP collective: bucket b's gradients, averaged in place (or the comm hook's). */
PDP__PRIVATE pdp_status pdp__ddp_allreduce(pdp__reducer *r, int b, pdp_work **w);

/* ---- ddp: the built-in compression hooks (ddp.h) ----
   launch: scratch <- 16-bit(grad / N), then a 16-bit SUM of the scratch (all-reduce in
   place, or reduce-scatter with this rank's slice in place); finish: the fp32 result
   widened back into grad (or recv). The hook's state points at its 16-bit type; the
   scratch is the bucket's own. */

PDP__PRIVATE pdp_status pdp__hook_compress_launch(void *state, pdp_comm *c,
                                                  const pdp_comm_hook_bucket *b, pdp_work **work);

PDP__PRIVATE pdp_status pdp__hook_compress_finish(void *state, const pdp_comm_hook_bucket *b);

PDP__PRIVATE pdp_ddp_comm_hook pdp__hook_compress(pdp_dtype *dt);

/* PDP_API pdp_ddp_comm_hook pdp_ddp_hook_bf16_compress(void) */

/* PDP_API pdp_ddp_comm_hook pdp_ddp_hook_fp16_compress(void) */

/* ---- ddp: construction ---- */

/* The one place pdp_ddp_desc's zeros become defaults (sokol's _def; pdp_ddp_get_desc
   returns its result); in may be NULL. The bucket sizes are checked by the rule DDP
   and ZeRO share (pdp__bucket_opts_check, reducer.c), whose message starts with fn. */
PDP__PRIVATE pdp_status pdp__ddp_desc_defaults(const pdp_model *m, const pdp_ddp_desc *in,
                                               pdp_ddp_desc *out, const char *fn);

/* pdp_ddp_create's half on this rank alone: the model, the desc, the wrap and the
   reducer's plan. *out gets what was built, on failure too (pdp_ddp_free takes it). */
PDP__PRIVATE pdp_status pdp__ddp_prepare(pdp_ddp **out, pdp_model *m, pdp_comm *c,
                                         const pdp_ddp_desc *desc, const char *fn);

/* Collective over c: this rank's half, then every rank learns whether every rank's half
   succeeded (one that failed alone would leave its peers waiting for it in the collectives
   that follow, until the timeout), then the reducer's collectives. */
/* PDP_API pdp_status pdp_ddp_create(pdp_ddp **out, pdp_model *m, pdp_comm *c, const pdp_ddp_desc *desc) */

/* PDP_API pdp_ddp_desc pdp_ddp_get_desc(const pdp_ddp *d) */

/* PDP_API void pdp_ddp_free(pdp_ddp *d) */

/* ---- ddp: training ---- */

/* PDP_API pdp_status pdp_ddp_forward_backward(pdp_ddp *d, const pdp_tensor *x, const int32_t *labels, float *loss) */

/* PDP_API pdp_status pdp_ddp_forward(pdp_ddp *d, const pdp_tensor *x, const pdp_tensor **y) */

/* PDP_API pdp_status pdp_ddp_backward(pdp_ddp *d, const pdp_tensor *dy) */

/* PDP_API pdp_status pdp_ddp_finish(pdp_ddp *d) */

/* PDP_API pdp_status pdp_ddp_step(pdp_ddp *d, pdp_optim *opt) */

/* PDP_API pdp_status pdp_ddp_register_comm_hook(pdp_ddp *d, const pdp_ddp_comm_hook *hook) */

/* PDP_API void pdp_ddp_set_no_sync(pdp_ddp *d, bool no_sync) */

/* PDP_API pdp_model *pdp_ddp_model(const pdp_ddp *d) */
/* PDP_API pdp_comm *pdp_ddp_comm(const pdp_ddp *d) */
/* PDP_API int pdp_ddp_num_buckets(const pdp_ddp *d) */

/* PDP_API pdp_status pdp_ddp_bucket_info(const pdp_ddp *d, int b, pdp_ddp_bucket *out) */

/* PDP_API void pdp_ddp_get_stats(const pdp_ddp *d, pdp_ddp_stats *out) */

/* PDP_API void pdp_ddp_reset_stats(pdp_ddp *d) */

/* ---- src/tp.c ---- */
/* tp: tensor parallelism (see tp.h for the design): the model's TP communicator, the
   constructors of the four TP layer kinds and of sequence parallelism's three (their
   kernels are layers_tp.c) with the marking of the layers between them, statistics, the
   check that every TP rank built the same TP layers (run by f's forward, or the first
   sequence collective's, at the first forward, through the TP state's pointer:
   layers_tp.c comes first), and
   full-tensor checkpoints, which map each rank's slice into the full tensor
   (pdp__tp_runs) through a staging copy of the full (single-device) model.

   Invariants: the model's TP state (comm, rank, size) is fixed once a TP layer exists.
   During training only the width check runs here, at the first forward. */

/* #include "internal.h" (above) */

/* ---- tp: the model's communicator and the constructors ---- */

/* PDP_API pdp_status pdp_model_set_tp(pdp_model *m, pdp_comm *tp) */

/* PDP_API pdp_comm *pdp_model_tp(const pdp_model *m) */

/* Appends TP layer l (kind and configuration set) to m. */
PDP__PRIVATE pdp_status pdp__tp_add(pdp_model *m, pdp__layer l, const char *fn);

/* The kind of m's last layer (-1: none). */
PDP__PRIVATE int pdp__tp_last_kind(const pdp_model *m);

/* PDP_API pdp_status pdp_model_add_tp_copy(pdp_model *m) */

/* A ColumnParallelLinear whose output is parts blocks split alike (3: q | k | v, each
   split by heads: pdp_gpt_create's c_attn). */
PDP__PRIVATE pdp_status pdp__tp_add_column(pdp_model *m, int64_t out_features, int parts,
                                           const char *fn);

/* PDP_API pdp_status pdp_model_add_column_parallel_linear(pdp_model *m, int64_t out_features) */

/* A CausalSelfAttention after a ColumnParallelLinear split by heads (q | k | v in three
   parts): the attention of this rank's heads, heads / TP size of them from head
   rank x heads / size (its dropout masks keyed by the global head, as on one device).
   heads must divide by the TP size. */
PDP__PRIVATE pdp_status pdp__tp_headwise(const pdp_model *m, pdp__layer *l, const char *fn);

/* PDP_API pdp_status pdp_model_add_row_parallel_linear(pdp_model *m, int64_t out_features) */

/* PDP_API pdp_status pdp_model_add_tp_reduce(pdp_model *m) */

/* Sequence parallelism's collectives (pdp_gpt_create's): kind PDP__SEQ_SCATTER (after
   the embedding), PDP__SEQ_GATHER (f before a block's ColumnParallelLinear: sum_dy; or
   before the replicated head) or PDP__SEQ_REDUCE_SCATTER (g, after a RowParallelLinear). */
PDP__PRIVATE pdp_status pdp__tp_add_sequence(pdp_model *m, pdp__layer_kind kind, bool sum_dy,
                                             const char *fn);

/* Marks the layers between a scatter (ScatterTo- or ReduceScatterToSequenceParallelRegion)
   and the next GatherFromSequenceParallelRegion as acting on this rank's positions
   (tp_seq, internal.h): their Dropout masks keyed from the slice's first element, their
   parameters' gradients summed over TP in backward, in the workspace ahead of what the
   layer itself uses there. Called by the builder once its last layer is added. */
PDP__PRIVATE void pdp__tp_mark_sequence(pdp_model *m);

/* PDP_API void pdp_tp_get_stats(const pdp_model *m, pdp_tp_stats *out) */

/* PDP_API void pdp_tp_reset_stats(pdp_model *m) */

/* ---- tp: full-tensor checkpoints ---- */

/* The single-device model of m: the same layers with f and g left out and the split
   Linears whole, on m's device (its parameters are overwritten by the caller). */
PDP__PRIVATE pdp_status pdp__tp_full_model(const pdp_model *m, pdp_model **out, const char *fn);

/* Copies between parameter p's slice (local, in m's block layout) and its full tensor
   (full), to_full or back, on device d: the contiguous runs of the slice. Replicated
   parameters are one run of the whole tensor. */
PDP__PRIVATE pdp_status pdp__tp_runs(const pdp_model *m, int p, pdp_device d, float *full,
                                     float *local, bool to_full);

/* ---- tp: the width check ---- */

/* A TP layer as the check compares it: its place, its kind and its full (unsplit)
   input and output features. */
typedef struct pdp__tp_sig {
    int64_t layer, kind, in, out;
    int64_t heads; /* a layer split by heads (attention): its heads on this rank; else 0 */
} pdp__tp_sig;

/* What a rank found: its TP layer count and, at the first TP layer that differs from TP
   rank 0's (at; -1: none), its own (zeros when it has none there). */
typedef struct pdp__tp_verdict {
    int64_t at, count;
    pdp__tp_sig sig;
    uint64_t replicated; /* pdp__tp_replicated_hash */
} pdp__tp_verdict;

PDP__PRIVATE bool pdp__tp_kind(pdp__layer_kind k);

/* The layers the width check compares: the TP kinds above and the layers split by heads
   (attention: the same widths hold 2 heads of 4 or 1 of 8, another model). */
PDP__PRIVATE bool pdp__tp_checked(const pdp__layer *l);

/* m's checked layers (a pipeline stage's tp.nlayers counts others too). */
PDP__PRIVATE int64_t pdp__tp_count(const pdp_model *m);

/* The signature of m's k-th TP layer; false when it has fewer. */
PDP__PRIVATE bool pdp__tp_sig_at(const pdp_model *m, int64_t k, pdp__tp_sig *s);

/* "layer 1 (ColumnParallelLinear) 6 -> 12" */
PDP__PRIVATE void pdp__tp_sig_str(const pdp__tp_sig *s, char *out, size_t cap);

/* A hash of the tensors every TP rank holds whole (embeddings, LayerNorms, the
   row-parallel Linears' biases), which must be the same bits on every TP rank: a rank built
   from another seed would train other weights there, silently. */
PDP__PRIVATE pdp_status pdp__tp_replicated_hash(const pdp_model *m, uint64_t *out);

/* As the DDP reducer checks its parameters (reducer.c): TP rank 0's count and table go
   to every rank, each rank compares, and every rank's verdict goes to every rank (one
   small broadcast from each), so all fail together with the same message. */
PDP__PRIVATE pdp_status pdp__tp_check_widths(pdp__tp_state *tp);

/* dst (full's layout) <- the full tensors from every rank's slices of src (m's layout):
   each rank writes its slices (rank 0 also the replicated tensors) into zeros, and one
   all-reduce sums them. */
PDP__PRIVATE pdp_status pdp__tp_gather(const pdp_model *m, const pdp_model *full, const float *src,
                                       float *dst);

/* dst (m's layout) <- this rank's slices of src (full's layout). */
PDP__PRIVATE pdp_status pdp__tp_scatter(const pdp_model *m, const pdp_model *full, const float *src,
                                        float *dst);

PDP__PRIVATE pdp_status pdp__tp_ckpt_args(const pdp_model *m, const pdp_optim *o, const char *fn);

/* PDP_API pdp_status pdp_tp_checkpoint_save(const char *path, const pdp_model *m, const pdp_optim *o) */

/* *failed <- the number of TP ranks passing failed = true (an all-reduce of one float on
   the communicator's device). On failure the message is set. */
PDP__PRIVATE pdp_status pdp__tp_count_failed(const pdp_model *m, bool failed, float *count);

/* PDP_API pdp_status pdp_tp_checkpoint_load(const char *path, pdp_model *m, pdp_optim *o) */

/* ---- src/gpt.c ---- */
/* gpt: pdp_gpt_create and pdp_gpt_generate (gpt.h). The builder only calls model.h's
   public constructors, then names and initialises what they made: a GPT is a model like
   any other, and every executor sees its layers one by one. */

/* #include "internal.h" (above) */

/* ---- gpt: the builder ---- */

/* Names parameter p (the next one the builder made), "transformer.h.3.attn.c_attn" +
   ".weight". */
PDP__PRIVATE pdp_status pdp__gpt_name(pdp_model *m, int p, const char *prefix, const char *what);

/* A Linear named prefix (weight, then bias). With desc.tp: column-parallel in split parts
   (3: q | k | v) or, for split -1, row-parallel. */
PDP__PRIVATE pdp_status pdp__gpt_linear(pdp_model *m, const pdp_gpt_desc *d, int64_t out,
                                        int split, const char *prefix);

PDP__PRIVATE pdp_status pdp__gpt_layernorm(pdp_model *m, const char *prefix);

/* Tensor parallel: f before a block's first split Linear, g after its last; with sequence
   parallelism f all-gathers the sequence (backward: reduce-scatter) and g reduce-scatters
   it (backward: all-gather). */
PDP__PRIVATE pdp_status pdp__gpt_f(pdp_model *m, const pdp_gpt_desc *d);
PDP__PRIVATE pdp_status pdp__gpt_g(pdp_model *m, const pdp_gpt_desc *d);

/* Sequence parallel: the embedding's output cut to this rank's positions (scatter), or the
   final LayerNorm's gathered for the replicated head (gather). */
PDP__PRIVATE pdp_status pdp__gpt_sequence(pdp_model *m, const pdp_gpt_desc *d,
                                          pdp__layer_kind kind);

PDP__PRIVATE pdp_status pdp__gpt_dropout(pdp_model *m, float p);

/* Block i: x = x + attn(ln_1(x)); x = x + mlp(ln_2(x)). */
PDP__PRIVATE pdp_status pdp__gpt_block(pdp_model *m, const pdp_gpt_desc *d, int i);

/* GPT-2's initialisation (nanoGPT's _init_weights): weights and embeddings N(0, 0.02),
   the c_proj weights N(0, 0.02 / sqrt(2 layers)) (the residual branches' last
   products), biases 0, LayerNorms as created (1 and 0). On a CUDA device each draw goes
   through a host copy (pdp_tensor_normal's staging), so the parameters are the CPU's. */
PDP__PRIVATE pdp_status pdp__gpt_init(pdp_model *m, const pdp_gpt_desc *d);

/* A TP GPT starts as the single-device GPT of the same desc: that one is built, drawn as
   pdp__gpt_init draws, and cut into this rank's slices (tp.c's scatter). */
PDP__PRIVATE pdp_status pdp__gpt_init_tp(pdp_model *m, const pdp_gpt_desc *d);

/* A rank's parameters in a GPT under TP over n ranks (n = 1: the whole model's): the
   embeddings, the LayerNorms and the row-parallel Linears' biases whole on every rank, the
   rest cut n ways: V C + context C + 2 C + layers (6 C + (12 C^2 + 7 C) / n). 0 when a
   count overflows (pdp__mul_ok's bound) or a size is below 1. pdp_gpt_create reserves it;
   test_gpt holds it to the built count. */
PDP__PRIVATE int64_t pdp__gpt_rank_param_count(const pdp_gpt_desc *d, int n);

/* *d = *desc with its defaults resolved (vocab 256, sequence = context), or PDP_ERR_INVALID
   prefixed fn for a field pdp_gpt_create refuses before it builds anything: what
   pdp_gpt_desc_format and pdp_gpt_create check alike. */
PDP__PRIVATE pdp_status pdp__gpt_check(const pdp_gpt_desc *desc, pdp_gpt_desc *d, const char *fn);

/* PDP_API int64_t pdp_gpt_param_count(const pdp_gpt_desc *desc) */

/* PDP_API pdp_status pdp_gpt_desc_format(const pdp_gpt_desc *desc, char *buf, size_t bytes) */

/* PDP_API pdp_status pdp_gpt_create(pdp_model **out, const pdp_gpt_desc *desc) */

/* ---- gpt: generation ---- */

/* The next token from logits z[0..V): greedy at temperature 0, else a draw from
   softmax(z / temperature) over the top_k largest (all when top_k is 0 or >= V). */
PDP__PRIVATE int32_t pdp__gpt_pick(const float *z, int64_t V, float temperature, int top_k,
                                   float *p, pdp_rng *r);

/* PDP_API pdp_status pdp_gpt_generate(pdp_model *m, int32_t *ids, int64_t n, int64_t n_new, float temperature, int top_k, pdp_rng *r) */

/* PDP_API pdp_status pdp_gpt_generate_text(pdp_model *m, const char *prompt, int64_t n_new, float temperature, int top_k, pdp_rng *r, char *buf, size_t bytes) */

/* ---- gpt: evaluation ---- */

/* PDP_API pdp_status pdp_gpt_evaluate(pdp_model *m, const pdp_token_dataset *ds, pdp_split split, int64_t batch, int batches, uint64_t seed, float *loss) */

/* ---- gpt: the activation report ---- */

/* Megatron-LM's tensors of one transformer layer (Korthikanti et al. 2022, sec. 4): bytes
   per s b h at 16 bits (masks 1 byte; per a s s b for the attention scores'). TP splits the
   block's inside (split), sequence parallelism the rest too; selective recomputation drops
   the scores'; the masks and the dropped scores exist only with dropout (Megatron's count
   assumes it). */

PDP__PRIVATE void pdp__gpt_term(char *buf, size_t size, double c, const char *unit);

/* Megatron's count of a layer in recomputation mode (0 none, 1 selective, 2 full: the
   layer's input, 2 in the paper's Table 2; under SP a rank holds its slice, 2/t), at 16 bits
   or (fp32) the same tensors at 4 bytes, masks 1 byte, masks and dropped scores only with
   dropout: its formula in bytes per sbh into f, its value at s, h, a, t as the result. */
PDP__PRIVATE double pdp__gpt_megatron(int mode, bool fp32, bool dropout, bool sp, double s,
                                      double h, double a, double t, char *f, size_t size);

/* PDP_API pdp_status pdp_gpt_activation_report(const pdp_model *m, const pdp_gpt_desc *desc, int64_t batch, char *buf, size_t bytes, int64_t *block_bytes) */

/* PDP_API pdp_status pdp_gpt_tp_report(const pdp_gpt_desc *desc, int64_t batch, const pdp_tp_stats *s, char *buf, size_t bytes, double *formula_bytes) */

/* PDP_API pdp_status pdp_gpt_memory_report(const pdp_model *m, const struct pdp_zero_memory *mm, int64_t batch, char *buf, size_t bytes) */

/* ---- src/zero.c ---- */
/* zero: the sharded executor, ZeRO stages 1-3 on reducer.c's bucket reducer
   with a reduce-scatter as its collective (the layout, the formulas and the
   reasons are in zero.h).

   Invariants: the units are the reducer's buckets (planned with whole_layers,
   so a layer's weight and bias share a unit and one pointer per layer places
   both); unit u's slice of rank r is elements [r s_u, r s_u + mine_u) of the
   unit (mine_u <= s_u real elements, the rest padding that stays zero in every
   buffer); shard offsets follow the flat block's order. The model's layers read
   their gradients (and at stage 3 their parameters) through m->layer_dw
   (m->layer_w), which this module sets: stage 1 once, stages 2-3 when a unit's
   backward starts (a gradient bucket buffer, taken round-robin: unit u uses
   buffer u mod grad_buffers, after the reduce-scatter of the unit that held it
   has completed and its slice was added to the shard), stage 3 also when its
   parameters are gathered (a gather slot, least recently used first, never the
   unit being computed). Nothing is allocated after construction: the buffers
   are fixed, the handles come from the backends' pools.

   Tied parameters (a GPT's head uses the Embedding's wte: model.c's PDP__LAYER_TIED).
   A tied layer computes with its owner's unit: unit_of_layer maps it there, and the
   model's events fire for it as for a layer of that unit, so stage 3 gathers the unit
   for it in forward and in backward (again, if the unit left its gather slot since),
   and stages 2-3 give the unit its gradient buffer at the tied layer's backward. A
   unit that a tied layer's backward reaches before its own layers' ("pinned": the
   head's contribution comes first, the embedding's last) keeps that buffer until the
   unit's reduce-scatter, which the reducer launches only once every parameter of the
   unit reported, after the owner's backward (model.c fires the grad hook for a
   parameter after its own layer only): the two contributions are summed in the
   buffer and reduced once. So a pinned unit owns a buffer of its own (the last ones)
   and the other units share the rest round-robin (gslot).

   FULL activation recomputation (model.h). Backward runs a residual region's forward
   again, from its kept input, just before the backward of its ResidualAdd, and model.c
   fires RECOMPUTE_LAYER before each of the region's layers with parameters. Stage 3
   gathers the layer's unit for it as for a forward, and its prefetch follows the
   backward pass's own order of needs, recompute included (next_bwd, next_rec: the layer
   before a region in backward prefetches the unit the recompute needs first). Of the
   parameters, what is resident during a recomputed block's backward is what stage 3
   ever holds: this rank's shard and the param_buffers gather slots (N s_max floats
   each), no more. The region's units stay in their slots from the recompute through the
   region's backward when param_buffers holds them all: then the backward's gathers are
   the recompute's, as many as without recomputation (and pdp__zero_formula holds). With
   fewer slots the recompute pushes the region's first units out and the backward
   gathers them again: more traffic, not in the formula, and the same memory. Stages 1-2
   hold every parameter and do nothing here. Tested equal to one device at stages 1-3
   with dropout, and the all-gathers counted (tests/test_gpt.c, tests/test_gpt_sp.c).

   Devices. Every buffer lives on the model's device and is moved with
   cuda_host.c's pdp__dev_* helpers (memcpy, memset and += on the CPU; copies and
   kernels on a CUDA device's compute stream), so one code path serves CPU models
   (local, MPI) and CUDA models (NCCL). The ordering between the compute stream
   and the NCCL stream is the backend's: a collective's launch waits for the work
   already queued on the compute stream (a slice copied into a gather slot, a
   layer still reading the slot being refilled), and its wait makes the compute
   stream wait for it (a buffer added to the shard, cleared or read by a layer).

   Tensor parallelism (DP x TP: pdp_zero_create on the DP group of a model built on a
   TP group, tp.h). Nothing here knows of TP: a TP rank's model is an ordinary model
   whose flat block holds its own slices (the column- and row-parallel weights, its
   heads' q, k and v) and the replicated tensors (LayerNorms, the row-parallel bias,
   the embeddings), and the ranks of one DP group hold the same slices. So each DP
   group shards its TP rank's block as any block: units of whole layers, and DP rank d
   owns slice d of every unit; the world's ranks (d, t) together hold each TP slice
   once per TP rank t and each replicated tensor once per TP rank (TP size copies, as
   Megatron's distributed optimizer). Under sequence parallelism a LayerNorm's weight
   and bias gradients are computed on a rank's positions only; layers_tp.c sums them
   over TP inside the LayerNorm's backward, into the buffer m->layer_dw points at (the
   unit's, or at stages 2-3 the bucket buffer it holds), before the grad hook fires,
   so the reduce-scatter over DP averages the full sequence's gradient, the same on
   every TP rank. Stage 3's all-gathers run over the DP group only, between the TP
   group's activation collectives, in the same order on every rank. Clipping counts the
   slices over TP (pdp_zero_clip_grad_norm). Tested equal to one device at stages 1-3,
   DP 2 x TP 2: the GPT with sequence parallelism under each recomputation mode
   (tests/test_gpt_sp.c) and Megatron's MLP blocks (tests/test_tp.c).

   The checkpoints of this executor are zero_ckpt.c's. */

/* #include "internal.h" (above) */

typedef struct pdp__zero_unit {
    int64_t off, count;  /* the unit's range of the flat block */
    int64_t s;           /* slice floats per rank, a multiple of 16 */
    int64_t shard_off;   /* this rank's slice in its shard (and optimizer state) */
    int64_t mine;        /* real elements of this rank's slice */
    int first_layer, last_layer;
    float *gbuf;         /* N s floats: stage 1 its own; stages 2-3 a held bucket buffer */
    int pslot;           /* stage 3: the gather slot holding its parameters, or -1 */
} pdp__zero_unit;

typedef struct pdp__zero_pslot {
    float *buf;          /* N s_max floats */
    int unit;            /* -1: free */
    pdp_work *work;      /* its all-gather, until waited */
    uint64_t used;       /* LRU stamp */
    double t_launch;
} pdp__zero_pslot;

struct pdp_zero {
    pdp__reducer r;      /* first: the reducer's user pointer is the executor */
    pdp_zero_desc desc;
    pdp_model *m;
    pdp_comm *c;
    int stage, rank, size, nunits;
    pdp__zero_unit *units;
    int *unit_of_layer;  /* the unit whose parameters layer l computes with (a tied layer:
                            its owner's); -1 for layers without parameters */
    int *next_fwd, *next_bwd, *next_rec; /* per layer: the next other unit forward
                                 (backward, FULL recomputation's forward inside backward)
                                 needs after it, -1 for none (stage 3's prefetch) */
    int *gslot;          /* stages 2-3: per unit, its gradient bucket buffer */
    int64_t pinned_s;    /* slice floats per rank of the pinned units (pdp__zero_pinned):
                            stage 3's byte formula */
    int64_t shard_count, padded_count, smax;
    float *grad_all;     /* stage 1: every unit's padded gradient buffer */
    float *grad_shard;   /* stages 2-3 */
    float *param_shard;  /* stage 3 */
    float *staging;      /* stages 1-2: the after-step all-gather */
    float **gbufs;       /* stages 2-3: grad_buffers bucket buffers */
    int *gbuf_unit;      /* the unit holding each, or -1 */
    pdp__zero_pslot *pslots;
    uint64_t clock;
    int trace_gather;    /* the all-gathers' trace lane ("allgather <comm name>"), 0: off */
    float **layer_w, **layer_dw;
    float scalar;        /* clipping's all-reduced squared norm */
    float *dscalar;      /* its copy on the model's device (the collective's buffer) */
    pdp_device dev;      /* the model's: every buffer below lives there */
    bool no_sync;
    bool sharded;        /* the model's blocks were handed over (free gives them back) */
    pdp_status deferred; /* a failure inside a no_sync backward (stages 2-3) */
    char deferred_msg[768];
    int64_t buffer_bytes, bytes_at_step, gathers, gathers_at_step;
    int64_t passes;      /* backward passes since the last step (k of the byte formula) */
    pdp_zero_stats stats;
    uint64_t saves;      /* checkpoint saves begun: one input of each save's run id */
};

PDP__PRIVATE int64_t pdp__zero_align(int64_t n);

/* "unit 1 of 3 (layers 2..4)" */
PDP__PRIVATE void pdp__zero_unit_name(const pdp_zero *z, int u, char *out, size_t cap);

/* Points unit u's layers' gradients (dw) or parameters (w) at buf, the unit's padded copy. */
PDP__PRIVATE void pdp__zero_point(pdp_zero *z, int u, float **ptrs, float *buf);

/* ---- zero: gradient buffers (stages 2-3) ---- */

/* Keeps the first failure of a step's device work that no caller can return
   (a bucket's completion, a no_sync backward): the next finish reports it. */
PDP__PRIVATE void pdp__zero_defer(pdp_zero *z, pdp_status st, const char *what, int u);

/* Releases unit u's bucket buffer after its reduce-scatter: its slice into the shard. */
PDP__PRIVATE void pdp__zero_bucket_done(pdp__reducer *r, int b);

/* Gives unit u a zeroed bucket buffer (gslot[u]), waiting for the reduce-scatter of the
   unit that held it (bucket_done then frees it). */
PDP__PRIVATE pdp_status pdp__zero_take_gbuf(pdp_zero *z, int u);

/* The collective of bucket (unit) b: reduce-scatter (average) in place. */
PDP__PRIVATE pdp_status pdp__zero_reduce(pdp__reducer *r, int b, pdp_work **w);

/* A comm hook's scratch: stage 1 one piece per unit (every unit's buffer may be in
   flight at once), laid out as grad_all; stages 2-3 one piece per bucket buffer
   (unit u uses piece gslot[u], as its bucket buffer: the unit that held it was
   waited, and its hook finished, before u's backward began). */
/* PDP_API pdp_status pdp_zero_register_comm_hook(pdp_zero *z, const pdp_ddp_comm_hook *hook) */

/* ---- zero: gathered parameters (stage 3) ---- */

/* Waits for slot i's all-gather; a failure names the unit. */
PDP__PRIVATE pdp_status pdp__zero_wait_slot(pdp_zero *z, int i);

/* Starts the all-gather of unit u's parameters into a slot: a free one, else the
   least recently used (whose gather has completed or is waited here) other than
   keep's. */
PDP__PRIVATE pdp_status pdp__zero_gather_launch(pdp_zero *z, int u, int keep);

/* Unit u's parameters gathered and its layers pointed at them; then the next
   unit's gather (next >= 0) launched, so it runs while u computes. */
PDP__PRIVATE pdp_status pdp__zero_need(pdp_zero *z, int u, int next);

/* Every slot free (FSDP's reshard): waits for gathers in flight first. */
PDP__PRIVATE pdp_status pdp__zero_release_params(pdp_zero *z);

/* ---- zero: the model's events ---- */

/* Zeroes the gradients this rank holds: the full block at stage 1, the shard at 2-3. */
PDP__PRIVATE pdp_status pdp__zero_clear_grads(pdp_zero *z);

PDP__PRIVATE pdp_status pdp__zero_event(void *user, pdp_model *m, pdp__model_event ev, int layer,
                                        pdp_status st);

/* ---- zero: construction ---- */

/* PDP_API void pdp_zero_free(pdp_zero *z) */

/* A zeroed buffer of count floats on the model's device, counted as a working
   buffer when work; NULL on failure (the message says why). */
PDP__PRIVATE float *pdp__zero_buf(pdp_zero *z, int64_t count, bool work);

/* pdp_model_param's views of a wrapped model (the seam of internal.h): this rank's part
   of parameter index is its overlap [lo, hi) with the rank's slice of the parameter's
   unit, one contiguous range (a unit holds whole layers, so the parameter lies in one
   unit, and the slice is contiguous). The gradient's part lives in the slice (stage 1:
   the unit's padded buffer; stages 2-3: the shard), and so do the values at stage 3;
   at stages 1-2 the values stay the full view of the model's block. */
PDP__PRIVATE pdp_status pdp__zero_views(void *user, const pdp_model *m, int index, pdp_param *out,
                                        const char *fn);

/* The one place pdp_zero_desc's zeros become defaults (sokol's _def; pdp_zero_get_desc
   returns its result, with grad_buffers cut to the units once they are known); in may
   be NULL. The bucket sizes and buffer counts are checked by the rule DDP and ZeRO
   share (pdp__bucket_opts_check, reducer.c). Buffer counts a stage does not use are 0. */
PDP__PRIVATE pdp_status pdp__zero_desc_defaults(const pdp_model *m, const pdp_zero_desc *in,
                                                pdp_zero_desc *out, const char *fn);

/* PDP_API pdp_zero_desc pdp_zero_get_desc(const pdp_zero *z) */

/* The pinned units of the units the reducer's walk planned (the header's "Tied
   parameters"): the unit of a tied layer's parameter when the tied layer comes after
   all of the unit's own layers, so backward reaches the unit first at the tied layer;
   none with one unit (no other unit wants a buffer). Sets mark[u] (zeroed by the caller)
   to 1 for each and *tied_at to the last such tied layer; returns how many. The
   executor and pdp_zero_memory_plan count them alike. */
PDP__PRIVATE int pdp__zero_pinned(const pdp_model *m, const pdp__red_bucket *units, int nunits,
                                  int *mark, int *tied_at);

/* The units' layers, once the units are planned: a tied layer computes with its owner's
   unit; each layer's next other unit in forward and backward order (stage 3 prefetches
   it); the pinned units and every unit's gradient buffer: the pinned ones the last
   buffers, one each, the others the rest round-robin. grad_buffers (asked: the desc's,
   0 for the default) must leave the others one: PDP_ERR_INVALID naming the tied layer
   otherwise; the default grows to what is needed. */
PDP__PRIVATE pdp_status pdp__zero_plan_layers(pdp_zero *z, int asked, const char *fn);

/* pdp_zero_create's first half on this rank alone: the model, the desc, the wrap and
   the reducer's plan. *out gets what was built, on failure too (pdp_zero_free takes it). */
PDP__PRIVATE pdp_status pdp__zero_prepare(pdp_zero **out, pdp_model *m, pdp_comm *c,
                                          const pdp_zero_desc *desc, const char *fn);

/* Collective over c: the first half on this rank, then every rank learns whether every
   rank's succeeded (one that failed alone would leave its peers waiting for it in the
   reducer's collectives, until the timeout), then those collectives; what follows them
   (the shards and buffers) is agreed on once more at the end. */
/* PDP_API pdp_status pdp_zero_create(pdp_zero **out, pdp_model *m, pdp_comm *c, const pdp_zero_desc *desc) */

/* PDP_API pdp_status pdp_zero_optim_create(pdp_optim **out, pdp_zero *z, const pdp_optim_desc *desc) */

/* ---- zero: training ---- */

/* PDP_API pdp_status pdp_zero_forward_backward(pdp_zero *z, const pdp_tensor *x, const int32_t *labels, float *loss) */

/* PDP_API pdp_status pdp_zero_forward(pdp_zero *z, const pdp_tensor *x, const pdp_tensor **y) */

/* PDP_API pdp_status pdp_zero_backward(pdp_zero *z, const pdp_tensor *dy) */

/* PDP_API pdp_status pdp_zero_finish(pdp_zero *z) */

/* Stage 1: the rank's slice of unit u in its padded buffer; stages 2-3: in the shard. */
PDP__PRIVATE float *pdp__zero_grad_slice(pdp_zero *z, int u);

/* This rank's slices of the averaged gradients, the ones its step reads, times coef
   (clipping; the trainer's accum_steps). */
PDP__PRIVATE pdp_status pdp__zero_grad_scale(pdp_zero *z, float coef, const char *fn);

/* The squared norm of this rank's slices, all-reduced over the DP group (every element of
   the flat block once); on a TP model the elements count as pdp__grad_sumsq_range counts
   them (a slice on every TP rank, a replicated tensor on TP rank 0 only) and a second
   all-reduce over the TP group adds the TP ranks' parts: the full model's norm, the same
   bits on every rank of both groups. */
/* PDP_API pdp_status pdp_zero_clip_grad_norm(pdp_zero *z, float max_norm, float *total_norm) */

/* Stages 1-2: every rank's updated slices into every rank's full parameters. */
PDP__PRIVATE pdp_status pdp__zero_gather_full(pdp_zero *z, float *dst, const char *fn);

/* The bytes a step of k backward passes sends (zero.h: "Communication per rank
   per step"), into st->micro_steps, formula_bytes and formula. V = 4 (N-1) S is
   one reduce-scatter or all-gather of every unit (S = shard_count: the bytes the
   backends count for a collective of S floats per rank); stage 3's later
   forwards skip the units the backward before them left gathered, the last
   param_buffers units of backward (the highest indices), and with more units than
   param_buffers a pinned unit (a tied head's) has left its slot before its tied
   layer's forward and before its own layers' backward: two more gathers per pass. */
PDP__PRIVATE void pdp__zero_formula(const pdp_zero *z, int64_t k, pdp_zero_stats *st);

/* PDP_API pdp_status pdp_zero_step(pdp_zero *z, pdp_optim *opt) */

/* PDP_API void pdp_zero_set_no_sync(pdp_zero *z, bool no_sync) */

/* PDP_API pdp_status pdp_zero_gather_params(pdp_zero *z, float *dst) */

/* ---- zero: queries ---- */

/* PDP_API pdp_model *pdp_zero_model(const pdp_zero *z) */
/* PDP_API int pdp_zero_stage(const pdp_zero *z) */
/* PDP_API int pdp_zero_num_units(const pdp_zero *z) */

/* ---- zero: memory ---- */

/* The plan of every stage for m on n ranks (d resolved; nstate optimizer floats per
   parameter) into out's counts and stages[], and out->stage's formulas: the units as
   pdp_zero_create plans them (reducer.c's walk), each padded to N s_u. */
PDP__PRIVATE pdp_status pdp__zero_plan(const pdp_model *m, int n, const pdp_zero_desc *d,
                                       int nstate, pdp_zero_memory *out, const char *fn);

/* PDP_API pdp_status pdp_zero_get_memory(const pdp_zero *z, const pdp_optim *opt, pdp_zero_memory *out) */

/* PDP_API pdp_status pdp_zero_memory_plan(const pdp_model *m, int world_size, int stage, const pdp_zero_desc *desc, const pdp_optim *opt, pdp_zero_memory *out) */

/* The smallest N >= 2 from which a stage that shards c x Psi bytes and adds b buffers of
   4 U_max saves memory over DDP, (1 - 1/N) c Psi > 4 b U_max (U_max taken as it is
   now); 0: never (a unit this large outweighs what the shards can save). */
PDP__PRIVATE int pdp__zero_saves_from(double psi, double umax, double c, double b);

/* snprintf at buf + len (the length so far, as snprintf counts it): the new length */
PDP__PRIVATE int pdp__zero_put(char *buf, size_t bytes, int len, const char *fmt, ...);

/* PDP_API int pdp_zero_memory_format(const pdp_zero_memory *m, char *buf, size_t bytes) */

/* PDP_API void pdp_zero_get_stats(const pdp_zero *z, pdp_zero_stats *out) */

/* ---- src/zero_ckpt.c ---- */
/* zero_ckpt: ZeRO's checkpoints on zero.c's executor: the sharded set
   (pdp_zero_checkpoint_save, pdp_zero_checkpoint_load), the one full file
   (pdp_zero_checkpoint_consolidate) and its re-sharding load at any world size
   (pdp_zero_checkpoint_load_full). Every call is collective.

   Invariants.
   - One save, one run id: rank 0 draws 64 bits per save and sends them to every
     rank inside the save's first agreement; every shard file ("shard.run") and the
     marker carry them, and a load accepts only shards whose id is the marker's.
   - The marker is atomic and last: rank 0 removes the old marker before any shard
     is written, and writes the new one (a temporary, sync, rename, sync of the
     directory) only after every rank has agreed that its shard file is on disk, so
     a set with a marker is complete.
   - Agreement before anything is changed: a load reads and validates into staging
     buffers on every rank, then the ranks agree (pdp__zero_agree: one all-reduce of
     per-rank flags); only when every rank succeeded does any rank commit, so a
     failure anywhere leaves every rank's parameters, optimizer state, seed and step
     as they were. Every rank reaches every agreement, failed or not, so a local
     failure cannot hang the others; a rank that never arrives makes them fail with
     the communicator's status.

   The files: a shard is checkpoint.c's range file (pdp__checkpoint_save_run, flat
   "params" and "optim.<state>"); the marker "P.done" is text, version 2 (see
   pdp__zero_marker_text); the consolidated file is pdp_checkpoint_save's. The set,
   its layout and the run id are described in the first section below and in zero.h.

   The seam with zero.c: amalgamate.py places this module after it; it reads
   struct pdp_zero and its units (pdp__zero_unit) directly and calls
   pdp__zero_release_params and pdp__zero_gather_full (declared in internal.h) and
   the public pdp_zero_gather_params. Of checkpoints zero.c keeps only the counter
   z->saves, an input of each run id.

   References: llm.c's write_checkpoint (karpathy/llm.c, train_gpt2.cu: every rank
   writes its state file, a barrier, then rank 0 writes DONE_<step>); ZeRO's
   partitioned optimizer state (Rajbhandari et al., "ZeRO: Memory Optimizations
   Toward Training Trillion Parameter Models", SC 2020); DeepSpeed's zero_to_fp32.py,
   which consolidates offline what consolidate writes in the run; safetensors
   (https://github.com/huggingface/safetensors). */

/* #include "internal.h" (above) */

/* ---- zero_ckpt: the set, the run id, the agreements ----
   A set under prefix P: rank r's shard file "P.rank<r>.safetensors" and the
   marker "P.done". The shard file is checkpoint.c's shard file of the range
   [r S, (r + 1) S) of the padded shard-order block (every rank's shard in rank
   order, N S floats, S = shard_count): "params" holds the rank's parameter
   slices and "optim.<state>" its optimizer state, both in the shard's layout
   (padding zeros), so shard.lo / shard.hi / shard.count name the rank, the world
   size and the shard size, optim.steps the step, and shard.run the save. The
   marker, written by rank 0 only after every rank's file is on disk, holds the
   plan (world size, stage, step, parameter and shard counts, each unit's offset,
   count and slice) that the load holds the run and every file to, and the save's
   run id, which every shard of the set must carry: two saves at the same step
   and world size write the same plan, and only the id tells their files apart.

   The run id: 64 bits that rank 0 draws at each save (/dev/urandom when it can
   be read, mixed with the wall and monotonic clocks in ns, the pid, the
   executor's address and its count of saves, so two saves never share one even
   without /dev/urandom), sent to every rank inside the first agreement, and
   written as 16 hex digits into every shard's __metadata__ and the marker.

   An agreement that fails itself (a rank stalled, exited or was killed) returns
   the collective's status and message, which name the ranks that did not arrive
   (PDP_ERR_TIMEOUT; PDP_ERR_COMM for a local rank that freed its communicator),
   after the call, the rank and what it was agreeing on. */

/* Every rank's verdict: bad[r] is true when rank r failed. Collective (a sum of
   one-hot flags, on the model's device as the backend wants). With run, rank 0's
   *run reaches every rank (as four 16-bit pieces that only rank 0 adds to the
   sum: exact in floats). On failure, the collective's status and message. */
PDP__PRIVATE pdp_status pdp__zero_agree(pdp_zero *z, bool ok, bool *bad, uint64_t *run);

/* A new run id (see above); rank 0 draws it once per save. */
PDP__PRIVATE uint64_t pdp__zero_run_id(pdp_zero *z);

PDP__PRIVATE void pdp__zero_shard_path(char *out, size_t cap, const char *prefix, int rank);

/* Checks the call; a step boundary (no backward waiting for its step). */
PDP__PRIVATE pdp_status pdp__zero_ckpt_args(pdp_zero *z, const pdp_optim *opt, const char *path,
                                            const char *fn);

/* The views checkpoint.c's range functions see: a model whose flat block is the
   padded shard-order block, and opt covering rank r's range of it, its state
   (or the given buffers) at the range's start. */
PDP__PRIVATE void pdp__zero_ckpt_views(const pdp_zero *z, const pdp_optim *opt, float *const *state,
                                       pdp_model *mv, pdp_optim *ov);

/* The rank's parameter slices in shard layout into dst (shard_count floats, on the
   model's device), from the parameter shard (stage 3) or the full block. */
PDP__PRIVATE pdp_status pdp__zero_pack_params(pdp_zero *z, float *dst);

/* ---- zero_ckpt: save ---- */

/* A run id as the files hold it: 16 lowercase hex digits. */
PDP__PRIVATE void pdp__zero_run_text(uint64_t run, char out[17]);

/* The marker's text for this executor at step steps of save run. */
PDP__PRIVATE void pdp__zero_marker_text(const pdp_zero *z, int64_t steps, const char *run,
                                        char *out, size_t cap);

/* Writes the marker atomically (temporary, sync, rename, sync of the directory), removing
   first the temporaries of writers killed mid-write as checkpoint.c's save does. */
PDP__PRIVATE pdp_status pdp__zero_write_marker(const char *path, const char *text, const char *fn);

/* PDP_API pdp_status pdp_zero_checkpoint_save(pdp_zero *z, const pdp_optim *opt, const char *prefix) */

/* ---- zero_ckpt: load (a shard set, or a full file at any world size) ---- */

/* Reads the marker and holds it to this run; *steps gets its step, run its
   run id (16 hex digits). */
PDP__PRIVATE pdp_status pdp__zero_read_marker(pdp_zero *z, const char *path, int64_t *steps,
                                              char run[17], const char *fn);

/* Commits a validated load: params (shard layout, on the device) into the shard
   or the full block (stages 1-2 then all-gather), state into opt. */
PDP__PRIVATE pdp_status pdp__zero_commit(pdp_zero *z, pdp_optim *opt, const pdp_optim *loaded,
                                         float *params, float *const *state, const char *fn);

/* params and nstate state buffers of shard_count floats each, on the device. */
PDP__PRIVATE pdp_status pdp__zero_ckpt_staging(pdp_zero *z, const pdp_optim *opt, float **params,
                                               float **state, const char *fn);

PDP__PRIVATE void pdp__zero_ckpt_staging_free(pdp_zero *z, float *params, float **state);

/* The agreement after a load's validation: every rank's verdict, then (all good)
   the commit. what(r) names rank r's file in the message of the ranks whose own
   file was fine. */
PDP__PRIVATE pdp_status pdp__zero_load_finish(pdp_zero *z, pdp_optim *opt, const pdp_optim *loaded,
                                              pdp_status st, float *params, float **state,
                                              const char *prefix, bool full, uint64_t seed,
                                              uint64_t mstep, const char *fn);

/* PDP_API pdp_status pdp_zero_checkpoint_load(pdp_zero *z, pdp_optim *opt, const char *prefix) */

/* PDP_API pdp_status pdp_zero_checkpoint_load_full(pdp_zero *z, pdp_optim *opt, const char *path) */

/* ---- zero_ckpt: consolidate (one full file) ---- */

/* PDP_API pdp_status pdp_zero_checkpoint_consolidate(pdp_zero *z, const pdp_optim *opt, const char *path) */

/* ---- src/trainer.c ---- */
/* trainer: the strategy-agnostic front of the data-parallel executors (trainer.h). A trainer
   holds at most one executor, the one its strategy names (the others stay NULL), and the
   optimizer made for it; each call is a switch over the strategy into the executors' own
   calls, so a trainer step is bit for bit the direct calls' step (tests/test_trainer.c holds
   every strategy at 1-3 ranks to one device). What it adds is desc.accum_steps: a count of
   the backward passes, no_sync set for the executor, and the sum scaled by 1/k once it is
   reduced (pdp__trainer_ready). */

struct pdp_trainer {
    pdp_trainer_desc desc; /* as given, with zero.stage the strategy's */
    pdp_model *m;
    pdp_optim *opt;
    pdp_dp *dp;     /* the strategy's executor: one of these, or none (single) */
    pdp_ddp *ddp;
    pdp_zero *z;
    pdp_device gpus[PDP_DP_MAX_WORKERS]; /* DP on a CUDA model without dp.devices */
    int micro;   /* accum_steps: forward_backward calls since the last step */
    bool scaled; /* accum_steps: this step's gradients have been averaged */
};

/* PDP_API const char *pdp_strategy_name(pdp_strategy s) */

/* PDP_API pdp_status pdp_strategy_from_name(const char *name, pdp_strategy *out) */

/* Every rank accumulates over the same number of backward passes: a rank reducing on another
   call than its peers would sum another step's gradients with theirs. */
PDP__PRIVATE pdp_status pdp__trainer_accum_agree(pdp_comm *c, int k, const char *fn);

/* The desc's own fields checked, zero.stage set to the strategy's; in may be NULL. */
PDP__PRIVATE pdp_status pdp__trainer_desc_defaults(const pdp_trainer_desc *in,
                                                   pdp_trainer_desc *out, const char *fn);

/* PDP_API pdp_status pdp_trainer_create(pdp_trainer **out, pdp_model *m, const pdp_trainer_desc *desc) */

/* PDP_API void pdp_trainer_free(pdp_trainer *t) */

/* PDP_API pdp_trainer_desc pdp_trainer_get_desc(const pdp_trainer *t) */

/* PDP_API pdp_status pdp_trainer_forward_backward(pdp_trainer *t, const pdp_tensor *x, const int32_t *labels, float *loss) */

/* Before clipping and stepping: the reduction finished (DDP, ZeRO) and, under accum_steps k,
   the k backward passes' sum times 1/k (every gradient this rank steps: ZeRO's shard), once. */
PDP__PRIVATE pdp_status pdp__trainer_ready(pdp_trainer *t, const char *fn);

/* PDP_API pdp_status pdp_trainer_clip_grad_norm(pdp_trainer *t, float max_norm, float *total_norm) */

/* PDP_API pdp_status pdp_trainer_step(pdp_trainer *t) */

/* PDP_API pdp_status pdp_trainer_get_memory(const pdp_trainer *t, pdp_zero_memory *out) */

/* PDP_API pdp_status pdp_trainer_memory_report(const pdp_trainer *t, int64_t batch, char *buf, size_t bytes) */

/* PDP_API pdp_status pdp_trainer_gather_params(pdp_trainer *t) */

/* PDP_API pdp_model *pdp_trainer_model(const pdp_trainer *t) */
/* PDP_API pdp_optim *pdp_trainer_optim(const pdp_trainer *t) */
/* PDP_API pdp_dp *pdp_trainer_dp(const pdp_trainer *t) */
/* PDP_API pdp_ddp *pdp_trainer_ddp(const pdp_trainer *t) */
/* PDP_API pdp_zero *pdp_trainer_zero(const pdp_trainer *t) */

/* ---- src/pp.c ---- */
/* pp: the pipeline-parallel executor (the design is pp.h's opening comment).

   Invariants: the schedule is fixed at creation, a list of actions per stage in
   which, on each chunk, micro-batch j's forward comes before its backward, and the
   forwards and the backwards each in micro-batch order. A stage runs v chunks (v = 1
   but for the interleaved schedule), each a model of consecutive layers (a piece of
   the full model, piece q = c p + s) with buffers of its own; everything below is per
   chunk. A chunk keeps S = nslots activation sets (model slots), the most micro-batches
   it holds at once in the list (GPipe: S = m; 1F1B: S = min(p - s, m) = warm-up + 1;
   interleaved: counted), set j % S for micro-batch j: its micro-batches in flight are
   consecutive, so a forward F(j) finds set j % S free because F(j - S)'s backward came
   before it. Received inputs (pieces after 0) live in S + 1 buffers, j % (S + 1), so
   the receive for the next forward can be posted while the chunk still holds S
   micro-batches (their inputs are read again by their backwards); received output
   gradients in 2 buffers (j % 2) and the input gradients sent back in 2 (j % 2, the
   send of j - 2 waited before reuse).
   Activations are sent straight from the model's output of set j % S, whose send
   is waited before F(j + S) overwrites it. Tags: a message crosses the boundary b
   between pieces b and b + 1; 2 (j v + b / p) for micro-batch j's activations and
   one more for its gradients, modulo PDP_COMM_TAG_MAX + 1 (v = 1: 2 j and 2 j + 1).
   Two ranks exchange over the boundaries b = c p + s (forward from s), one per chunk,
   so the tag and the direction name the message (p = 2: rank 1 sends rank 0 both
   activations, over odd b, and gradients, over even b; the last bit tells them apart).
   After the first pass at the largest batch nothing is allocated.

   Messages go out in steps, Megatron-LM's p2p grouping: a step is one action, or in the
   interleaved schedule's steady state a forward and the backward after it (printed
   F2c0+B0c1). After a step the runner issues one batch (pdp_comm_sendrecv): the step's
   sends with the next step's receives (at most 2 and 2, so at most one receive per kind
   is outstanding). Before an action it waits for its receive and for the send that last
   used the buffer it will send from. On NCCL a batch is one group, so its sends and
   receives progress together; a rank's batches run one after another on its one stream.
   That is why on NCCL the steady state's two actions share one batch: with a batch an action
   (Megatron's 1F1B grouping), stage 0's B0c1 sends stage 1 a gradient that stage 1
   receives for B0c0, a receive queued behind stage 1's B1c1 send of a gradient to stage
   0, whose receive, for stage 0's B1c1, is queued behind the first (p = 2, v = 2, m = 4):
   a deadlock for every m >= 2p. With the pair, each send of a step goes out with the
   receives the peer's matching step posts; the pair is safe because the interleaved
   warm-up's 2 (p - s - 1) extra forwards put the backward's gradient, on the next stage,
   before that stage needs the pair's forward. Local and MPI start a message when posted
   and match by tag, so a batch adds no order there: the pair's forward sends at once (its
   activations a backward sooner: train_gpt_3d -dp 1 -tp 1 -pp 2 -micro 4 -schedule
   interleaved, stage 1's bubble, medians of 5 alternated runs: 0.460 with the send held,
   0.435 sent at once, 0.436 before the pairs). 1F1B and GPipe keep a batch an action
   (Megatron's 1F1B grouping): they complete with it, and it sends a forward's activations
   without waiting for the backward after it.
   NCCL matches a pair of ranks' messages by order, which is safe: for every pair the
   sender's list posts its messages in the order the receiver's list posts their receives
   (the k-th forward is the same micro-batch and chunk on every stage; the wrap from the
   last stage to the first maps chunk c to c + 1, which keeps the order). Local and MPI
   match by (peer, tag) and start each message when posted; their only question is whether
   the waits form a cycle, and they do not: every message an action waits for is produced
   by an action its peer runs no later in Megatron's order (the k-th forward of every stage
   is the same micro-batch and chunk; the extra warm-up forwards let the last stage's
   backwards start before stage s needs them, and (v - 1) p lets a micro-batch group cross
   all v chunks), and a send buffer is reused only S forwards (2 backwards) later, when its
   receiver has posted that receive. Both claims were checked by a replay of every rank's
   list under each backend's rules (tests/test_pp.c, pp_schedules_cannot_deadlock: p =
   2..8, v = 1..4, m = p..4p, all complete; with a batch an action the interleaved lists
   deadlock under NCCL's rules for m >= 2p), and the schedules run in the tests on thread
   ranks and on NCCL's emulation.

   Clipping (pdp_pp_clip_grad_norm) needs every stage's gradients: each stage's sum of
   squares, a double, is all-gathered bit for bit over the pipeline (two floats per
   stage; through a device buffer on NCCL) and summed in stage order on every stage, so
   all stages clip by the same coefficient. With desc.dp it runs after the dp average,
   when every pipeline holds the global batch's gradients. A failed pass's clean-up
   (pdp__pp_drain) keeps the thread's message: its waits fail only as consequences. */

/* #include "internal.h" (above) */

typedef struct pdp__pp_action {
    char kind; /* 'F' or 'B' */
    int mb;
    int chunk;
    bool pair; /* a forward whose step goes on with the next action, a backward (interleaved,
                  steady state): their messages go out together after both */
} pdp__pp_action;

/* One chunk of a stage: piece q = chunk p + stage of the full model. */
typedef struct pdp__pp_chunk {
    pdp_model *m;                 /* layers [first[q], first[q + 1]); with v > 1 its blocks
                                     are views into the stage model's (pdp__pp_join) */
    int q, nslots;
    int64_t off;                  /* its parameters' offset in the stage model */
    int64_t in_count, out_count;  /* per-sample floats at its input and output */
    int64_t act_bytes;            /* one micro-batch's activations (the last pass) */
    int param0;                   /* its first parameter's index in the stage model */
    bool view;                    /* its blocks are the stage model's (v > 1) */
    pdp_model *stage_m;           /* v > 1: the stage model whose grad hook its backward calls
                                     (pdp__pp_sync_chunks) */
    float **in_buf;               /* nslots + 1: received inputs (pieces after 0) */
    float *dy_buf[2];             /* received output gradients (pieces before the last) */
    float *dx_buf[2];             /* input gradients sent back (pieces after 0) */
    pdp_work **send_fwd;          /* per slot */
    pdp_work *send_bwd[2];
} pdp__pp_chunk;

struct pdp_pp {
    pdp_model *m;                 /* this stage (with v > 1: its chunks' joined) */
    pdp_comm *c, *dp;
    pdp_pp_desc desc;
    int stage, p, mb, v, pieces;  /* stage, stages, micro-batches, chunks, p v */
    int *first;                   /* pieces + 1: piece q's first layer, then nlayers */
    pdp__pp_chunk *ck;            /* v */
    pdp__pp_action *acts;
    int nacts;
    int64_t cap_rows;             /* rows the chunks' buffers hold */
    int64_t messages;             /* activations and gradients sent in this pass */
    pdp_work *rwork[2];           /* the next step's receives: its forward's, its backward's */
    pdp_p2p batch[4];             /* the current step's sends, then the next step's receives */
    int nbatch;
    pdp_work *dp_work;            /* DP x PP: the gradients' all-reduce */
    float norm_host[2 * PDP_PP_MAX_STAGES + 2]; /* pdp_pp_clip_grad_norm: this stage's sum
                                                    of squares (a double's 8 bytes), then
                                                    every stage's, gathered */
    float *norm_dev;              /* its copy on the model's device (NCCL reduces device
                                     memory only); NULL on the CPU */
    int tied_param;               /* a weight tied across stages (a GPT's wte: the embedding
                                     on stage 0, the head's copy on a later one): its index in
                                     this stage's model, or -1 */
    int tied_peer;                /* the stage holding the other copy */
    bool tied_copy;               /* this stage holds the copy (its last parameter) */
    float *tied_buf;              /* the peer's gradient of it, received each pass */
    int64_t positions;            /* labels a row on the last stage: T for [B, T, V] */
    pdp_model *layout;            /* the full model's layers and registry (no values): the
                                     staging of pdp_pp_checkpoint_save/load */
    int64_t counted;              /* labels of this pass that count (not -1) */
    int64_t *mb_rows, *mb_first;  /* per micro-batch of the current pass */
    int64_t mb_cap;
    int64_t sample_base;          /* DP x PP: this pipeline's first row in the global batch */
    uint64_t steps;
    double t_compute;             /* when the current action's compute began (after its waits) */
    pdp_pp_stats stats;
    int64_t dp_sent;              /* bytes its gradients' averages sent over dp, all steps (a
                                     caller's own collectives on dp are not counted) */
    bool one_stream;              /* NCCL: a rank's batches run in order on one stream */
    bool traced;
    int trace_pid, trace_tid;
};

/* ---- pp: stage boundaries ---- */

/* A contiguous split of n layers of cost[] into p non-empty stages minimising the
   largest stage's cost (ties: the later cut, so a ReLU stays with its Linear; pp.h's
   pdp_pp_balance states the rule for the whole split). The linear-partition dynamic
   programme: best(k, i) = min over j of max(best(k - 1, j), cost of layers [j, i)). */
PDP__PRIVATE pdp_status pdp__pp_balance(const double *cost, const bool *cut_ok, int n, int p,
                                        int *first);

/* The pipeline's own loss, softmax cross-entropy on the last stage, counts as part of the
   last layer (pdp__pp_layer_costs, pdp__pp_time_layers): with a GPT's vocabulary it is a
   real share of the step. Its classes, and its rows a sample (T of [T, V]). */
PDP__PRIVATE int64_t pdp__pp_loss_rows(const pdp_model *full, int64_t *classes);

/* Forward + backward seconds of each layer of full (a copy of it) on rows samples, the least
   of 5 timed passes after a warm-up (a pass another process interrupted counts only where
   it was the fastest); with loss, the cross-entropy's added to the last layer's. */
PDP__PRIVATE pdp_status pdp__pp_time_layers(const pdp_model *full, int64_t rows, bool loss,
                                            double *cost);

/* ---- pp: schedules ---- */

/* The k-th forward (kind 'F') or backward of a stage in Megatron's order: micro-batches in
   groups of p, each group through chunk 0, 1, .., v - 1 (backwards through v - 1 first);
   with v = 1 it is micro-batch k. */
PDP__PRIVATE pdp__pp_action pdp__pp_kth(char kind, int k, int p, int v);

/* Stage s's actions (2 m v of them) into acts: w warm-up forwards, then a forward and a
   backward alternately, then the remaining backwards (pp.h states each schedule's w).
   Interleaved: m a multiple of p (pdp__pp_desc_defaults checks). Returns the count. */
PDP__PRIVATE int pdp__pp_build(pdp_pp_schedule sched, int p, int v, int m, int s,
                               pdp__pp_action *acts);

/* This stage's list, and each chunk's slots: the most micro-batches it holds at once. */
PDP__PRIVATE void pdp__pp_plan(pdp_pp *pp);

/* PDP_API const char *pdp_pp_schedule_str(const pdp_pp *pp, char *buf, size_t cap) */

/* ---- pp: construction ---- */

PDP__PRIVATE pdp_status pdp__pp_check_desc(const pdp_pp_desc *d, int nlayers, int p, const char *fn);

/* The one place pdp_pp_desc's zeros become defaults (sokol's _def), after
   pdp__pp_check_desc; in may be NULL. first_layer stays as given (NULL: balanced);
   pdp_pp_get_desc puts the split in use there. */
PDP__PRIVATE pdp_status pdp__pp_desc_defaults(const pdp_pp_desc *in, pdp_pp_desc *out, int nlayers,
                                              int p, const char *fn);

/* Each layer's cost for balancing: parameters, or estimated FLOPs per sample
   (layers_table.c's estimate; layer 0 computes no input gradient; with loss, the
   cross-entropy's 6 a logit on the last layer: its max, exp and sum, the gradient's
   division and scale, a transcendental counted as one as there). */
PDP__PRIVATE void pdp__pp_layer_costs(const pdp_model *full, pdp_pp_balance how, bool loss,
                                      double *cost);

/* cut_ok[i]: a stage may start at layer i (i in [0, n]): not inside a residual region,
   whose skip cannot cross stages. */
PDP__PRIVATE void pdp__pp_cut_points(const pdp_model *full, bool *cut_ok);

/* The split into pieces: given, or balanced (by time: rank 0 measures). first[pieces] =
   nlayers. */
PDP__PRIVATE pdp_status pdp__pp_split(pdp_pp *pp, const pdp_model *full, const char *fn);

/* Every rank checks its split, schedule and micro-batches against rank 0's (by
   time: takes rank 0's split). */
PDP__PRIVATE pdp_status pdp__pp_agree(pdp_pp *pp, const char *fn);

/* A split by time is stage 0's measurement of one pipeline; the other pipelines and the
   other TP ranks measured their own, and every copy of a stage must hold the same layers:
   all take TP rank 0's (after the pipelines agreed), then dp rank 0's, so every rank holds
   the split of pipeline 0's TP rank 0. */
PDP__PRIVATE pdp_status pdp__pp_agree_timed(pdp_pp *pp, const pdp_model *full, const char *fn);

/* Every rank keeps its stage of its own copy of the full model, so the copies must be one
   model: rank 0's parameter count and parameters' hash to every rank, each compares (ranks
   seeded apart would train a pipeline equal to no one device's model, silently; a TP
   model's pipeline ranks share a TP rank, so they hold the same slices). */
PDP__PRIVATE pdp_status pdp__pp_agree_model(pdp_pp *pp, const pdp_model *full, const char *fn);

/* PDP_API pdp_pp_desc pdp_pp_get_desc(const pdp_pp *pp) */

/* The piece holding layer i. */
PDP__PRIVATE int pdp__pp_piece_of(const pdp_pp *pp, int i);

/* The weight tied across stages, if any: a TiedLinear on piece q_use whose parameter's
   layer is on piece q_own < q_use (pdp__model_stage gave q_use's chunk a copy, its last
   parameter). Two chunks of one stage cannot share one (PDP_ERR_UNSUPPORTED). */
PDP__PRIVATE pdp_status pdp__pp_find_tied(pdp_pp *pp, const pdp_model *full, const char *fn);

/* With v > 1 chunks, the stage model: the chunks' layers and parameters one after the other
   in one model whose blocks hold every chunk's (the optimizer, clipping and checkpoints see
   one model, as with one chunk); each chunk's blocks become views into them. Its layers keep
   their indices into its own registry; they are not run (each chunk runs its own). With TP
   layers each chunk keeps its own TP state (its layers' and its width check's, pdp__model_
   stage), and the stage model holds the TP group too, for clipping: pdp__grad_sumsq_range
   counts its slices as on one chunk; pdp__pp_fold_tp_stats adds the chunks' counters to
   its own after each pass, for pdp_tp_get_stats. */
PDP__PRIVATE pdp_status pdp__pp_join(pdp_pp *pp);

/* pdp_pp_create's first half on this rank alone: the model, the desc and the split
   into stages (by time: measured on rank 0). *out gets what was built, on failure too
   (pdp_pp_free takes it). */
PDP__PRIVATE pdp_status pdp__pp_prepare(pdp_pp **out, const pdp_model *full, pdp_comm *c,
                                        const pdp_pp_desc *desc, const char *fn);

/* Collective over c: the first half on this rank, then every rank learns whether every
   rank's succeeded (one that failed alone would leave its peers waiting for it in the
   collectives that follow, until the timeout), then the checks of the split against rank
   0's; what follows them is agreed on once more at the end. */
/* PDP_API pdp_status pdp_pp_create(pdp_pp **out, const pdp_model *full, pdp_comm *c, const pdp_pp_desc *desc) */

PDP__PRIVATE void pdp__pp_free_buffers(pdp_pp *pp);

/* Waits every outstanding message and the dp average. Their errors are consequences of
   the pass's first error (or of one reported already), so the thread's message is kept:
   after a failed pass it is the one that names the call, the stage and the action. */
PDP__PRIVATE void pdp__pp_drain(pdp_pp *pp);

/* PDP_API void pdp_pp_free(pdp_pp *pp) */

/* Buffers for micro-batches of up to rows rows (grown, never shrunk). */
PDP__PRIVATE pdp_status pdp__pp_reserve(pdp_pp *pp, int64_t rows);

/* ---- pp: one pass ---- */

/* The tag of micro-batch j's message across the boundary b between pieces b and b + 1
   (dir 0: its activations, 1: its gradients); the opening comment says why it is unique. */
PDP__PRIVATE int pdp__pp_tag(const pdp_pp *pp, int j, int b, int dir);

/* Adds action k's receive, if it has one, to the batch: its input from piece q - 1 (a
   forward after piece 0), or its output's gradient from piece q + 1 (a backward before the
   last piece); the handle goes to rwork[0] or rwork[1]. */
PDP__PRIVATE void pdp__pp_add_recv(pdp_pp *pp, int k);

/* Adds a send of the current step to the batch. */
PDP__PRIVATE void pdp__pp_add_send(pdp_pp *pp, const float *buf, int64_t count, int peer, int tag,
                                   pdp_work **w);

/* After action k (k = -1: before the first): at a step's end, one batch of its sends and
   the next step's receives; within a step (a pair's forward) its send goes at once where
   messages start when posted and match by tag, on NCCL with the step's batch (the opening
   comment says why). */
PDP__PRIVATE pdp_status pdp__pp_issue(pdp_pp *pp, int k);

PDP__PRIVATE pdp_status pdp__pp_wait(pdp_work **w);

/* The input rows of micro-batch j on chunk ck. */
PDP__PRIVATE const float *pdp__pp_input(const pdp__pp_chunk *ck, const pdp_tensor *x,
                                        const int64_t *mb_first, int j);

PDP__PRIVATE pdp_status pdp__pp_forward(pdp_pp *pp, const pdp_tensor *x, int k);

PDP__PRIVATE pdp_status pdp__pp_backward(pdp_pp *pp, const pdp_tensor *x, const int32_t *labels,
                                         int k, double *loss_sum);

/* A weight tied across two stages (a GPT's wte: the embedding's on stage 0, chunk 0, the
   head's copy on the last, its last chunk): each stage sends its gradient of it to the
   other and adds the one it receives, a + b on one side and b + a on the other, the same
   bits, so the two copies get the same update and stay equal (Megatron's all-reduce over
   the embedding group). */
PDP__PRIVATE pdp_status pdp__pp_sum_tied(pdp_pp *pp);

/* With chunks on TP stages: each chunk's TP counters of the pass added to the stage model's
   (pdp_tp_get_stats(pdp_pp_model(pp)) reads them) and zeroed. */
PDP__PRIVATE void pdp__pp_fold_tp_stats(pdp_pp *pp);

/* Micro-batch sizes of a batch of rows rows (the first rows % m one larger). */
PDP__PRIVATE pdp_status pdp__pp_cut(pdp_pp *pp, int64_t rows);

/* With v > 1 the chunks' models run and the stage model (pdp_pp_model, the caller's handle)
   does not: its user grad hook runs through this, with the stage model and the parameter's
   index in it, as on one chunk. */
PDP__PRIVATE void pdp__pp_chunk_hook(void *user, pdp_model *m, int param_index);

/* What the caller set on the stage model (model.h: pdp_model_set_training, _set_precision,
   _set_grad_hook stay allowed on a wrapped model) reaches the chunks that run it. */
PDP__PRIVATE void pdp__pp_sync_chunks(pdp_pp *pp);

/* PDP_API pdp_status pdp_pp_forward_backward(pdp_pp *pp, const pdp_tensor *x, const int32_t *labels, float *loss) */

/* PDP_API pdp_status pdp_pp_finish(pdp_pp *pp) */

/* The gradients' global norm: each stage's sum of squares, a double, travels bit for bit
   (its 8 bytes as two floats of an all-gather, on the model's device for NCCL) and every
   stage adds the p sums in stage order, so all stages hold the same double and scale by
   the same coefficient (or all fail alike). */
/* PDP_API pdp_status pdp_pp_clip_grad_norm(pdp_pp *pp, float max_norm, float *total_norm) */

/* PDP_API pdp_status pdp_pp_step(pdp_pp *pp, pdp_optim *opt) */

/* ---- pp: checkpoints of the full model ----
   Piece q holds the full model's parameters [off(q), off(q + 1)) in the full block's order
   (a piece is a contiguous run of layers, so of registered parameters), then a tied weight's
   copy, which equals its owner's and is not written; a stage holds its chunks' runs one after
   the other (chunk c's at ck[c].off). Save: every stage sends each chunk's run (and each
   optimizer state's) to stage 0, which writes the full model's file through a staging model;
   load: every stage reads the file into its own staging model and keeps its runs (and the
   copy from its owner's tensor). */

/* The offset in the full block of piece q's first parameter (q = pieces: the count). */
PDP__PRIVATE int64_t pdp__pp_full_offset(const pdp_pp *pp, int q);

/* The checks of both calls: o this stage's full optimizer (or NULL). */
PDP__PRIVATE pdp_status pdp__pp_ckpt_args(const pdp_pp *pp, const pdp_optim *o, const char *path,
                                          const char *fn);

/* The staging full model (and optimizer, with o) of a save or a load. */
PDP__PRIVATE pdp_status pdp__pp_staging(const pdp_pp *pp, const pdp_optim *o, pdp_model **full,
                                        pdp_optim **fo);

/* PDP_API pdp_status pdp_pp_checkpoint_save(pdp_pp *pp, const pdp_optim *o, const char *path) */

/* PDP_API pdp_status pdp_pp_checkpoint_load(pdp_pp *pp, pdp_optim *o, const char *path) */

/* ---- pp: queries ---- */

/* PDP_API pdp_model *pdp_pp_model(const pdp_pp *pp) */
/* PDP_API int pdp_pp_stage(const pdp_pp *pp) */
/* PDP_API int pdp_pp_num_stages(const pdp_pp *pp) */

/* PDP_API pdp_status pdp_pp_stage_layers(const pdp_pp *pp, int s, int *first, int *last) */

/* PDP_API pdp_status pdp_pp_chunk_layers(const pdp_pp *pp, int s, int c, int *first, int *last) */

/* PDP_API void pdp_pp_get_stats(const pdp_pp *pp, pdp_pp_stats *out) */

/* PDP_API int pdp_pp_stats_format(const pdp_pp_stats *s, char *buf, size_t bytes) */

/* PDP_API pdp_status pdp_pp_report(const pdp_pp *pp, char *buf, size_t bytes) */

/* PDP_API pdp_status pdp_pp_rank_report(const pdp_pp *pp, const pdp_optim *o, char *buf, size_t bytes) */

/* ---- src/launch.c ---- */
/* launch: pdp_launch runs a function on every rank (launch.h), PDP_CHECK's failure path and
   pdp_seconds. Thread ranks: one group (pdp_local_group or pdp_nccl_group) and one thread per
   rank beyond the caller's rank 0; each rank records its status and message (thread-local,
   so copied here) and the order in which ranks failed, under one mutex, BEFORE it frees its
   communicator: the first failure is then the cause, and the peers' failures that its
   departure provokes come after it. Process ranks: pdp_comm_init_env and one call. Built
   only on the public API of comm.h, rendezvous.h and cuda.h. Then pdp_args_parse, a
   program's "-name value" options. */

/* #include "internal.h" (above) */

#include <limits.h>

typedef struct pdp__launch pdp__launch;

typedef struct pdp__launch_rank {
    pdp__launch *L;
    int rank;
    bool started;      /* its thread was created (ranks >= 1) */
    pdp__thread thread;
    pdp_status st;
    int order;         /* 0 = first to fail */
    bool peer;         /* it failed because another rank did (pdp__err_peer) */
    char msg[1024];
} pdp__launch_rank;

struct pdp__launch {
    int np;
    pdp_backend backend;
    pdp_local_group *group;
    pdp_nccl_group *ngroup;
    const pdp_device *devices;
    pdp_launch_fn fn;
    void *user;
    pdp__mutex mu;
    int failures;
    pdp__launch_rank *ranks;
};

PDP__PRIVATE void pdp__launch_fail(pdp__launch_rank *r, pdp_status st);

PDP__PRIVATE void pdp__launch_run(pdp__launch_rank *r);

PDP__PRIVATE void *pdp__launch_thread(void *arg);

/* The first rank to fail for a reason of its own (not because a peer did: the peer's
   message holds the cause, whichever returned first), else the first to fail; its message
   prefixed; PDP_OK when none did. */
PDP__PRIVATE pdp_status pdp__launch_result(const pdp__launch_rank *ranks, int n);

PDP__PRIVATE pdp_status pdp__launch_threads(int np, const pdp_launch_desc *d,
                                            const pdp_comm_desc *cd, pdp_launch_fn fn, void *user);

/* PDP_API pdp_status pdp_launch(int np, const pdp_launch_desc *desc, pdp_launch_fn fn, void *user) */

/* PDP_API void pdp_check_fail(pdp_status status, const char *file, int line) */

/* PDP_API pdp_status pdp_backend_from_name(const char *name, pdp_backend *out) */

/* PDP_API double pdp_seconds(void) */

/* PDP_API pdp_status pdp_print_by_rank(pdp_comm *c, const char *fmt, ...) */

/* ---- pdp_args_parse: a program's "-name value" options ---- */

/* The index of text among choices, "a|b|c" (0 for "a"), or -1. */
PDP__PRIVATE int pdp__arg_choice_index(const char *choices, const char *text);

/* Choice k of choices, "a|b|c", into buf; NULL when there is no choice k. */
PDP__PRIVATE const char *pdp__arg_choice_name(const char *choices, int k, char *buf, size_t cap);

/* What a accepts, "1..8" or "local|mpi|nccl", into buf ("" when anything of its type). */
PDP__PRIVATE const char *pdp__arg_accepts(const pdp_arg *a, char *buf, size_t cap);

/* Stores text in a's variable, or returns false (the variable untouched) when a refuses
   it: not a whole number of a's type, outside a's range, not one of a's choices. */
PDP__PRIVATE bool pdp__arg_set(const pdp_arg *a, const char *text);

/* Appends " [-name value]" (the variable's value now, a choice's by name) and " (what it
   accepts)" to buf; false, appending nothing, for a choice whose value names no choice. */
PDP__PRIVATE bool pdp__arg_usage(const pdp_arg *a, char *buf, size_t cap);

/* "-h", "-help" or "--help", when no option has that name. */
PDP__PRIVATE bool pdp__arg_is_help(const char *name);

/* PDP_API pdp_status pdp_args_parse(int argc, char **argv, const pdp_arg *args, int count) */

/* PDP_API void pdp_args_parse_or_exit(int argc, char **argv, const pdp_arg *args, int count) */

#if defined(__GNUC__) || defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif /* PDP_INTERNAL_H_INCLUDED */
