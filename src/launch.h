/* launch: run one function on every rank, as torch.multiprocessing.spawn and torchrun do.

   pdp_launch(np, &desc, fn, user) makes the world communicator and calls
   fn(&ctx, user) once per rank with it:
     thread ranks   desc.backend local (the default) or nccl, in a process that no launcher
                    started as one of several: np ranks, rank 0 on the calling thread and
                    ranks 1..np-1 on threads of their own; over NCCL rank r drives
                    desc.devices[r] (default GPU r), one thread per GPU. Per-thread
                    settings (pdp_set_num_threads) of the caller apply to rank 0 only; the
                    other ranks' threads start with the defaults.
     process ranks  desc.backend mpi (always), or nccl in a process that mpirun
                    (OMPI_COMM_WORLD_*) or torchrun (RANK, WORLD_SIZE, LOCAL_RANK, ...)
                    started: this process is one rank, fn runs once, and the communicator
                    comes from pdp_comm_init_env. The launcher decides the world size (as
                    torchrun's --nproc-per-node does, not the script), so np is not used;
                    ctx.world_size says what it is. The local backend in such a process runs
                    one rank when the launcher's world size is 1, and otherwise fails with
                    PDP_ERR_INVALID (its ranks are threads of one process).
   ctx.device is where the rank's model and batches belong: the CPU, or its GPU under
   NCCL (desc.devices[r], or LOCAL_RANK's GPU for process ranks).
   Bad input fails before anything starts, with PDP_ERR_INVALID naming it: fn NULL, np
   outside 1..256 for thread ranks (1..64 over NCCL), an unknown backend, or variables
   that pdp_env_read refuses.

   Returns PDP_OK when fn returned PDP_OK on every rank. Otherwise the status of the
   first rank to fail (in time: a rank that fails first makes its peers' collectives fail
   after it, and their messages only repeat that), with that rank's message prefixed by
   "pdp_launch: rank R of N: ". A thread rank's communicator is freed as soon as its fn
   returns, so over the local backend a peer still waiting in a collective for it fails at
   once (PDP_ERR_COMM) instead of timing out; over NCCL it waits its timeout_s. fn must not
   free ctx.world; a thread rank must not exit the process (PDP_CHECK below does: use it
   in main, return statuses from fn). */

typedef struct pdp_launch_ctx {
    pdp_comm *world;    /* every rank; freed by pdp_launch after fn returns */
    int rank;           /* pdp_comm_rank(world) */
    int world_size;     /* pdp_comm_size(world) */
    int local_rank;     /* the rank among this machine's ranks (thread ranks: rank) */
    pdp_device device;  /* the CPU, or this rank's GPU (NCCL) */
    pdp_backend backend;
    bool process;       /* true when each rank is a process (mpirun, torchrun) */
} pdp_launch_ctx;

typedef pdp_status (*pdp_launch_fn)(const pdp_launch_ctx *ctx, void *user);

typedef struct pdp_launch_desc {
    pdp_backend backend;        /* default local */
    double timeout_s;           /* the communicator's (pdp_comm_desc); default 300 */
    const char *name;           /* the communicator's name; default "world" */
    const pdp_device *devices;  /* NCCL thread ranks: rank r's GPU; NULL = pdp_cuda(r) */
    pdp_log_fn log;             /* passed to pdp_comm_desc.log; NULL */
    void *log_user;
} pdp_launch_desc;

/* np: thread ranks to start (see above); desc may be NULL (local backend). */
PDP_API pdp_status pdp_launch(int np, const pdp_launch_desc *desc, pdp_launch_fn fn, void *user);
/* The backend named "local", "mpi" or "nccl" (a program's -backend argument), into *out;
   any other name (or NULL) fails with PDP_ERR_INVALID naming it and the three. */
PDP_API pdp_status pdp_backend_from_name(const char *name, pdp_backend *out);

/* ---- for programs (the examples) ----
   PDP_CHECK(call): on a status other than PDP_OK, prints "file:line: STATUS: message" to
   stderr and exits with 1. For a program's main; the library itself never exits. */
#define PDP_CHECK(call)                                                                   \
    do {                                                                                  \
        pdp_status pdp_check_st_ = (call);                                                \
        if (pdp_check_st_ != PDP_OK) pdp_check_fail(pdp_check_st_, __FILE__, __LINE__);  \
    } while (0)
#if defined(__GNUC__) || defined(__clang__)
#  define PDP__NORETURN __attribute__((noreturn)) /* callers' flow analysis knows it exits */
#elif defined(_MSC_VER)
#  define PDP__NORETURN __declspec(noreturn)
#else
#  define PDP__NORETURN
#endif
PDP_API PDP__NORETURN void pdp_check_fail(pdp_status status, const char *file, int line);
/* PDP_TRY(call): returns the status from the calling function when it is not PDP_OK
   (a launched rank's fn returns it to pdp_launch). */
#define PDP_TRY(call)                                                                     \
    do {                                                                                  \
        pdp_status pdp_try_st_ = (call);                                                  \
        if (pdp_try_st_ != PDP_OK) return pdp_try_st_;                                    \
    } while (0)
/* Monotonic seconds (CLOCK_MONOTONIC; QueryPerformanceCounter on Windows), for timing a step. */
PDP_API double pdp_seconds(void);
/* Each rank's line, in rank order: collective over c (every rank calls it, with its own
   printf-style text); rank 0 prints the texts to stdout in rank order and flushes, so the
   ranks' figures read in order whether they are threads or processes (whose stdouts would
   interleave). Each text is cut at 1023 bytes. Fails as pdp_comm_broadcast_bytes does, or
   with PDP_ERR_INVALID for a NULL c or fmt. */
PDP_API pdp_status pdp_print_by_rank(pdp_comm *c, const char *fmt, ...);

/* A program's options, "-name value" pairs (the examples' command lines): one pdp_arg per
   option, whose value points at a variable that holds the default and receives the value
   given. pdp_args_parse reads argv[1..argc-1]; a number must parse whole and lie in
   [min, max] (both 0: any value of its type); a string with choices ("local|mpi|nccl") must
   be one of them; a choice (PDP_ARG_CHOICE) must be one of its choices, and its int
   variable receives the choice's index: with "single|dp|ddp", "-strategy ddp" sets 2, so a
   choices string in an enum's order gives the enum's value. On an unknown name, a name
   without a value or a value refused, it returns PDP_ERR_INVALID and a message that names
   the option, the value and what it accepts, then the usage: "usage: PROG [-np 2 (1..8)]
   [-backend local (local|mpi|nccl)] ...", each option with its default (a choice's by
   name). "-h", "-help" or "--help" (unless an option has that name) returns
   PDP_ERR_INVALID with "pdp_args_parse: PROG: -h: the options, each with its default"
   and the usage (pdp_args_parse_or_exit prints that usage and exits 0).
   Variables already set stay set. A choice whose default is not the index of one
   of its choices (or whose choices are NULL), an option without a name or a value, or one
   of no type above fails before anything is parsed, naming it. */
typedef enum pdp_arg_type {
    PDP_ARG_INT,     /* value: int * */
    PDP_ARG_INT64,   /* value: int64_t * */
    PDP_ARG_DOUBLE,  /* value: double * */
    PDP_ARG_STRING,  /* value: const char ** (points into argv) */
    PDP_ARG_CHOICE   /* value: int *, the index of the choice given among choices */
} pdp_arg_type;

typedef struct pdp_arg {
    const char *name;     /* "-np" */
    pdp_arg_type type;
    void *value;          /* the default in, the value given out */
    double min, max;      /* numbers: the accepted range, inclusive (both 0: any) */
    const char *choices;  /* the accepted values, "a|b|c": strings' (NULL: any), choices' */
} pdp_arg;

PDP_API pdp_status pdp_args_parse(int argc, char **argv, const pdp_arg *args, int count);
/* pdp_args_parse for a program's main, as PDP_CHECK: returns when the options parse; on
   -h, -help or --help prints the usage to stdout and exits with 0; on a mistake prints the
   message and the usage to stderr and exits with 2 (a command line's mistake, as getopt
   programs do). The library itself never exits. */
PDP_API void pdp_args_parse_or_exit(int argc, char **argv, const pdp_arg *args, int count);
