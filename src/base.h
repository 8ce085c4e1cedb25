/* base: version, linkage, status codes, errors, allocation overrides.

   Every public symbol is declared with PDP_API. Functions that can fail return a
   pdp_status (PDP_OK = 0, errors negative, in ranges by area) and leave a message
   in a thread-local buffer, read with pdp_last_error(). Option structs are plain
   structs whose zero value means "default". */

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#define PDP_VERSION_MAJOR 0
#define PDP_VERSION_MINOR 1
#define PDP_VERSION_PATCH 0
#define PDP__STR2(x) #x
#define PDP__STR(x) PDP__STR2(x)
#define PDP_VERSION_STRING                                                            \
    PDP__STR(PDP_VERSION_MAJOR) "." PDP__STR(PDP_VERSION_MINOR) "." PDP__STR(PDP_VERSION_PATCH)

#ifndef PDP_API
#  if defined(PDP_STATIC) && (defined(__GNUC__) || defined(__clang__))
#    define PDP_API static __attribute__((unused))
#  elif defined(PDP_STATIC)
#    define PDP_API static
#  else
#    define PDP_API extern
#  endif
#endif

/* Status codes: one X-macro list gives the enum and pdp_status_name().
   Ranges: -1..-99 general, -100s shape and numerics, -200s files, -300s CUDA,
   -400s communicators. */
#define PDP_STATUS_LIST(X)                                                            \
    X(PDP_OK, 0, "ok")                                                                \
    X(PDP_ERR_INVALID, -1, "invalid argument")                                        \
    X(PDP_ERR_OUT_OF_MEMORY, -2, "out of memory")                                     \
    X(PDP_ERR_UNSUPPORTED, -3, "not compiled in or not supported")                    \
    X(PDP_ERR_STATE, -4, "call out of order")                                         \
    X(PDP_ERR_WORKER, -5, "a worker thread failed")                                   \
    X(PDP_ERR_SHAPE, -100, "shape mismatch")                                          \
    X(PDP_ERR_DEVICE, -101, "device mismatch")                                        \
    X(PDP_ERR_NUMERIC, -102, "NaN or Inf")                                            \
    X(PDP_ERR_IO, -200, "file I/O failed")                                            \
    X(PDP_ERR_FORMAT, -201, "corrupt or foreign file")                                \
    X(PDP_ERR_CUDA, -300, "CUDA, cuBLAS or NCCL call failed")                         \
    X(PDP_ERR_NO_DEVICE, -301, "no CUDA device")                                      \
    X(PDP_ERR_COMM, -400, "communicator failed")                                      \
    X(PDP_ERR_TIMEOUT, -401, "timed out")

typedef enum pdp_status {
#define PDP__STATUS_ENUM(name, value, text) name = value,
    PDP_STATUS_LIST(PDP__STATUS_ENUM)
#undef PDP__STATUS_ENUM
    PDP__STATUS_FORCE_INT = -0x7fffffff
} pdp_status;

/* "PDP_ERR_SHAPE" for PDP_ERR_SHAPE; "PDP_UNKNOWN_STATUS" for anything else. */
PDP_API const char *pdp_status_name(pdp_status s);
/* The message of the last failure on this thread ("" if none). It starts with the
   public function's name and names the layer, shape, file or rank involved. */
PDP_API const char *pdp_last_error(void);
PDP_API void pdp_clear_error(void);
PDP_API const char *pdp_version_string(void);

/* Log levels for the optional log callbacks in descs; the library prints only
   through them. */
typedef enum pdp_log_level {
    PDP_LOG_ERROR = 0,
    PDP_LOG_WARN = 1,
    PDP_LOG_INFO = 2
} pdp_log_level;
typedef void (*pdp_log_fn)(pdp_log_level level, const char *message, void *user);

/* Intra-op threads: large GEMMs on the calling thread are split over a pool of
   persistent workers. n <= 0 means one per online core. The setting is per
   calling thread (a DP worker or a thread-rank sets its own; default 1); the
   workers are shared by the process, created on first use and reused. */
PDP_API pdp_status pdp_set_num_threads(int n);
PDP_API int pdp_get_num_threads(void);
/* Joins the pool's workers and frees the caller's scratch (for leak checkers and
   before unloading). The pool is process-wide (the manual's THREADS AND
   DETERMINISM lists all of pdp's process-wide state); the next call that needs it
   starts it again. Call it when no other thread is in pdp. */
PDP_API void pdp_shutdown_threads(void);

/* Profile: where the calling thread's time goes (bench/train prints it per step).
   pdp_profile_start zeroes the calling thread's counters and turns them on;
   pdp_profile_read fills *out with what they counted since the start and leaves them on;
   pdp_profile_stop turns them off and reads them (a later read gives the same). The calling
   thread's pdp calls count, as wall time on that thread (intra-op workers' share included): the
   layers' forward and backward, by kind of layer, the built-in losses and the optimizer. While on,
   a counted call reads the clock twice; while off it costs one test of a thread-local flag. */
typedef struct pdp_profile {
    double wall_s;       /* since pdp_profile_start */
    double gemm_layers_s;  /* layers with weights (Linear, Conv2d, the TP linears), forward
                              and backward: their GEMMs, with bias, im2col and bf16 packing */
    double other_layers_s; /* the other layers: element-wise (ReLU, ...), pooling, views */
    double loss_s;       /* built-in losses (cross-entropy, MSE), with their gradient */
    double optim_s;      /* optimizer steps and zero_grad */
    double other_s;      /* wall_s minus the above: the caller's own code, data, waits */
    int threads;         /* the intra-op setting at the start (pdp_get_num_threads) */
    double idle_s;       /* thread-seconds the (threads - 1) intra-op workers sat idle:
                            (threads - 1) x wall_s minus their busy time, plus the time
                            the calling thread waited for them at the end of a parallel
                            part; 0 with one thread */
} pdp_profile;
PDP_API void pdp_profile_start(void);
PDP_API void pdp_profile_read(pdp_profile *out);
PDP_API void pdp_profile_stop(pdp_profile *out); /* out may be NULL */

/* Tracing: with PDP_TRACE=path in the environment, DDP and the communicators
   record a Chrome trace (open it in ui.perfetto.dev or chrome://tracing); a
   process that is one rank of several writes path.rank<r>.<ext>. The file is
   written when the last traced object is freed and whenever the in-memory
   buffer fills; this writes it now (a valid JSON file afterwards). PDP_OK when
   tracing is off. */
PDP_API pdp_status pdp_trace_flush(void);
