/* test_launch.c - pdp_launch: every rank runs once with its own communicator, statuses and
   messages come back naming the first rank that failed, a process that a launcher started
   (RANK/WORLD_SIZE) runs one rank, and bad input is refused with a message before any rank
   starts. The collectives inside are checked against a naive sum over the ranks. The
   programs' helpers: pdp_args_parse against values written out by hand, pdp_print_by_rank
   against ranks that arrive in reverse order. */

#define PDP_IMPLEMENTATION
#include "pdp.h"
#include "pdp_test.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "test_platform.h"
#include "child_process.h"

#define MAXR 8

typedef struct launch_rec {
    int calls[MAXR];          /* fn calls per rank */
    int world_size[MAXR];
    int local_rank[MAXR];
    bool process[MAXR];
    pdp_device_kind kind[MAXR];
    float sum[MAXR];          /* all-reduce of rank + 1 */
    pdp_status st[MAXR];      /* what fn returned */
    int fail_rank;            /* -1: none */
    int fail_mode;            /* 0: a failing API call, 1: a status without a message */
    double t0, elapsed[MAXR];
} launch_rec;

static const char *env_names[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                  "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                                  "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"};

static void clear_env(void)
{
    size_t i;
    for (i = 0; i < sizeof env_names / sizeof env_names[0]; i++) unsetenv(env_names[i]);
}

static pdp_status record_fn(const pdp_launch_ctx *ctx, void *user)
{
    launch_rec *r = (launch_rec *)user;
    int k = ctx->rank;
    float v = (float)(k + 1);
    pdp_status st = PDP_OK;
    r->calls[k]++;
    r->world_size[k] = ctx->world_size;
    r->local_rank[k] = ctx->local_rank;
    r->process[k] = ctx->process;
    r->kind[k] = ctx->device.kind;
    if (k == r->fail_rank) {
        if (r->fail_mode == 0) st = pdp_comm_broadcast(ctx->world, &v, 1, 99, NULL); /* bad root */
        else st = PDP_ERR_NUMERIC;
    } else {
        st = pdp_comm_allreduce(ctx->world, &v, 1, PDP_REDUCE_SUM, NULL);
        r->sum[k] = v;
    }
    r->st[k] = st;
    r->elapsed[k] = pdp_seconds() - r->t0;
    return st;
}

static void rec_init(launch_rec *r)
{
    memset(r, 0, sizeof *r);
    r->fail_rank = -1;
    r->t0 = pdp_seconds();
}

TEST launch_runs_every_rank_once(void)
{
    int np, k;
    clear_env();
    for (np = 1; np <= 4; np++) {
        launch_rec r;
        float want = 0.0f;
        rec_init(&r);
        for (k = 0; k < np; k++) want += (float)(k + 1); /* naive sum in rank order */
        ASSERT_EQ(PDP_OK, pdp_launch(np, NULL, record_fn, &r));
        for (k = 0; k < MAXR; k++) ASSERT_EQ(k < np ? 1 : 0, r.calls[k]);
        for (k = 0; k < np; k++) {
            ASSERT_EQ(np, r.world_size[k]);
            ASSERT_EQ(k, r.local_rank[k]);
            ASSERT(!r.process[k]);
            ASSERT_EQ(PDP_DEVICE_CPU, r.kind[k]);
            ASSERT_EQ(want, r.sum[k]);
        }
    }
    PASS();
}

TEST launch_returns_the_first_failing_rank(void)
{
    launch_rec r;
    pdp_launch_desc d = {PDP_BACKEND_LOCAL, 30.0, NULL, NULL, NULL, NULL};
    pdp_status st;
    int k;
    clear_env();
    rec_init(&r);
    r.fail_rank = 2;
    st = pdp_launch(4, &d, record_fn, &r);
    ASSERT_EQ(PDP_ERR_INVALID, st); /* rank 2's bad root, not its peers' PDP_ERR_COMM */
    ASSERT_EQ(0, strncmp(pdp_last_error(), "pdp_launch: rank 2 of 4: pdp_comm_broadcast",
                         strlen("pdp_launch: rank 2 of 4: pdp_comm_broadcast")));
    for (k = 0; k < 4; k++) {
        ASSERT_EQ(1, r.calls[k]);
        if (k == 2) continue;
        ASSERT_EQ(PDP_ERR_COMM, r.st[k]); /* rank 2 left: its peers fail ... */
        ASSERT(r.elapsed[k] < 10.0);      /* ... at once, not after the 30 s timeout */
    }
    /* a status without a message: the launcher says so */
    rec_init(&r);
    r.fail_rank = 1;
    r.fail_mode = 1;
    st = pdp_launch(2, NULL, record_fn, &r);
    ASSERT_EQ(PDP_ERR_NUMERIC, st);
    ASSERT_STR_EQ("pdp_launch: rank 1 of 2: (no message)", pdp_last_error());
    /* rank 0 fails on the calling thread */
    rec_init(&r);
    r.fail_rank = 0;
    st = pdp_launch(3, NULL, record_fn, &r);
    ASSERT_EQ(PDP_ERR_INVALID, st);
    ASSERT_EQ(0, strncmp(pdp_last_error(), "pdp_launch: rank 0 of 3: ", 25));
    PASS();
}

/* A rank that fails because another did (a constructor's agreement that every rank
   succeeded) points at that rank; pdp_launch reports the cause, rank 1's own message, though
   rank 0 returned first (rank 1 waits 100 ms after the agreement). */
static pdp_status agree_fn(const pdp_launch_ctx *ctx, void *user)
{
    struct timespec ts = {0, 100 * 1000 * 1000};
    pdp_status st = ctx->rank == 1 ? pdp__err(PDP_ERR_INVALID, "rank 1's own reason") : PDP_OK;
    (void)user;
    st = pdp__comm_agree(ctx->world, st, "agree_fn");
    if (ctx->rank == 1) nanosleep(&ts, NULL);
    return st;
}

TEST launch_reports_the_cause_not_a_pointer_to_it(void)
{
    pdp_status st;
    clear_env();
    st = pdp_launch(2, NULL, agree_fn, NULL);
    ASSERT_EQ(PDP_ERR_INVALID, st);
    ASSERT_STR_EQ("pdp_launch: rank 1 of 2: rank 1's own reason", pdp_last_error());
    PASS();
}

TEST launch_env_single_rank(void)
{
    launch_rec r;
    pdp_status st;
    clear_env();
    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "1", 1);
    rec_init(&r);
    st = pdp_launch(4, NULL, record_fn, &r); /* the launcher's world of one wins over np */
    ASSERT_EQ_FMT(PDP_OK, st, "%d");
    ASSERT_EQ(1, r.calls[0]);
    ASSERT_EQ(0, r.calls[1]);
    ASSERT_EQ(1, r.world_size[0]);
    ASSERT_EQ(1.0f, r.sum[0]);
    /* rank 1 of 2 on the local backend: refused, naming the rank and what to use */
    setenv("RANK", "1", 1);
    setenv("WORLD_SIZE", "2", 1);
    rec_init(&r);
    st = pdp_launch(2, NULL, record_fn, &r);
    ASSERT_EQ(PDP_ERR_INVALID, st);
    ASSERT(strstr(pdp_last_error(), "pdp_launch: ") == pdp_last_error());
    ASSERT(strstr(pdp_last_error(), "rank 1 of 2"));
    ASSERT(strstr(pdp_last_error(), "mpi or nccl"));
    ASSERT_EQ(0, r.calls[0] + r.calls[1]);
    /* the same under mpirun's names */
    clear_env();
    setenv("OMPI_COMM_WORLD_RANK", "0", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "3", 1);
    ASSERT_EQ(PDP_ERR_INVALID, pdp_launch(3, NULL, record_fn, &r));
    ASSERT(strstr(pdp_last_error(), "rank 0 of 3"));
    clear_env();
    PASS();
}

TEST launch_refuses_bad_input(void)
{
    launch_rec r;
    pdp_launch_desc d;
    clear_env();
    rec_init(&r);
    ASSERT_EQ(PDP_ERR_INVALID, pdp_launch(2, NULL, NULL, &r));
    ASSERT_STR_EQ("pdp_launch: fn is NULL", pdp_last_error());
    ASSERT_EQ(PDP_ERR_INVALID, pdp_launch(0, NULL, record_fn, &r));
    ASSERT(strstr(pdp_last_error(), "pdp_launch: np 0 outside 1..256"));
    ASSERT_EQ(PDP_ERR_INVALID, pdp_launch(257, NULL, record_fn, &r));
    ASSERT(strstr(pdp_last_error(), "np 257"));
    memset(&d, 0, sizeof d);
    d.backend = (pdp_backend)7;
    ASSERT_EQ(PDP_ERR_INVALID, pdp_launch(2, &d, record_fn, &r));
    ASSERT(strstr(pdp_last_error(), "pdp_launch: desc.backend 7"));
    d.backend = PDP_BACKEND_LOCAL;
    d.timeout_s = -1.0; /* the communicator's check, prefixed */
    ASSERT_EQ(PDP_ERR_INVALID, pdp_launch(2, &d, record_fn, &r));
    ASSERT(strstr(pdp_last_error(), "pdp_launch: ") == pdp_last_error());
    ASSERT(strstr(pdp_last_error(), "timeout"));
    setenv("RANK", "x", 1); /* pdp_env_read's refusal, prefixed */
    setenv("WORLD_SIZE", "2", 1);
    ASSERT_EQ(PDP_ERR_INVALID, pdp_launch(2, NULL, record_fn, &r));
    ASSERT(strstr(pdp_last_error(), "pdp_launch: ") == pdp_last_error());
    ASSERT(strstr(pdp_last_error(), "RANK"));
    clear_env();
    ASSERT_EQ(0, r.calls[0] + r.calls[1]);
#ifndef PDP_CUDA
    d.timeout_s = 0;
    d.backend = PDP_BACKEND_NCCL;
    ASSERT_EQ(PDP_ERR_UNSUPPORTED, pdp_launch(2, &d, record_fn, &r));
    ASSERT(strstr(pdp_last_error(), "pdp_launch: ") == pdp_last_error());
    ASSERT(strstr(pdp_last_error(), "PDP_CUDA"));
    ASSERT_EQ(PDP_ERR_INVALID, pdp_launch(65, &d, record_fn, &r));
    ASSERT(strstr(pdp_last_error(), "np 65 outside 1..64"));
#endif
#ifndef PDP_MPI
    d.backend = PDP_BACKEND_MPI;
    ASSERT_EQ(PDP_ERR_UNSUPPORTED, pdp_launch(2, &d, record_fn, &r));
    ASSERT(strstr(pdp_last_error(), "pdp_launch: rank 0 of 1: ") == pdp_last_error());
    ASSERT(strstr(pdp_last_error(), "PDP_MPI"));
#endif
    ASSERT_EQ(0, r.calls[0] + r.calls[1]);
    PASS();
}

static pdp_status try_fn(int fail)
{
    PDP_TRY(fail ? pdp_comm_allreduce(NULL, NULL, 1, PDP_REDUCE_SUM, NULL) : PDP_OK);
    return PDP_ERR_STATE; /* reached only when the call succeeded */
}

TEST launch_helpers(void)
{
    double a = pdp_seconds(), b = pdp_seconds();
    ASSERT(a > 0.0 && b >= a);
    ASSERT_EQ(PDP_ERR_STATE, try_fn(0));
    ASSERT(try_fn(1) != PDP_OK && try_fn(1) != PDP_ERR_STATE);
    PDP_CHECK(PDP_OK); /* returns: nothing printed, no exit */
    PASS();
}

TEST launch_backend_from_name(void)
{
    pdp_backend b = PDP_BACKEND_DEFAULT;
    ASSERT_ENUM_EQ(PDP_OK, pdp_backend_from_name("local", &b), pdp_status_name);
    ASSERT_EQ(PDP_BACKEND_LOCAL, b);
    ASSERT_ENUM_EQ(PDP_OK, pdp_backend_from_name("mpi", &b), pdp_status_name);
    ASSERT_EQ(PDP_BACKEND_MPI, b);
    ASSERT_ENUM_EQ(PDP_OK, pdp_backend_from_name("nccl", &b), pdp_status_name);
    ASSERT_EQ(PDP_BACKEND_NCCL, b);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_backend_from_name("gloo", &b), pdp_status_name);
    ASSERT_EQ(PDP_BACKEND_NCCL, b); /* untouched on failure */
    ASSERT(strstr(pdp_last_error(), "pdp_backend_from_name") == pdp_last_error());
    ASSERT(strstr(pdp_last_error(), "'gloo'") && strstr(pdp_last_error(), "local, mpi or nccl"));
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_backend_from_name("NCCL", &b), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_backend_from_name(NULL, &b), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_backend_from_name("local", NULL), pdp_status_name);
    PASS();
}

/* pdp_args_parse against the values written out by hand: each type, a range, choices, and
   every refusal naming the option and the value, with the usage (the defaults) after it. */
TEST launch_args_parse(void)
{
    int np = 2, stage = 3;
    int64_t batch = 256;
    double lr = 0.001;
    const char *backend = "local";
    const pdp_arg args[] = {
        {"-np", PDP_ARG_INT, &np, 1, 8, NULL},
        {"-stage", PDP_ARG_INT, &stage, 0, 0, NULL}, /* any int */
        {"-batch", PDP_ARG_INT64, &batch, 1, 1e6, NULL},
        {"-lr", PDP_ARG_DOUBLE, &lr, 1e-9, 10, NULL},
        {"-backend", PDP_ARG_STRING, &backend, 0, 0, "local|mpi|nccl"},
    };
    char *ok[] = {"prog", "-np", "4", "-batch", "1000000", "-lr", "2.5e-3", "-backend", "mpi",
                  "-stage", "-7"};
    char *none[] = {"prog"};
    char *bad[][3] = {{"prog", "-np", "9"},      {"prog", "-np", "3x"},
                      {"prog", "-np", ""},       {"prog", "-lr", "0"},
                      {"prog", "-batch", "1.5"}, {"prog", "-backend", "mp"},
                      {"prog", "-stage", "3000000000"}, {"prog", "-lr", "nan"}};
    char *unknown[] = {"prog", "-nq", "4"}, *novalue[] = {"prog", "-np"};
    size_t i;
    ASSERT_ENUM_EQ(PDP_OK, pdp_args_parse(1, none, args, 5), pdp_status_name);
    ASSERT(np == 2 && stage == 3 && batch == 256 && lr == 0.001 && !strcmp(backend, "local"));
    ASSERT_ENUM_EQ(PDP_OK, pdp_args_parse(11, ok, args, 5), pdp_status_name);
    ASSERT(np == 4 && stage == -7 && batch == 1000000 && lr == 2.5e-3 && !strcmp(backend, "mpi"));
    for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_args_parse(3, bad[i], args, 5), pdp_status_name);
        ASSERT(strstr(pdp_last_error(), "pdp_args_parse: prog: ") == pdp_last_error());
        ASSERT(strstr(pdp_last_error(), bad[i][1]) && strstr(pdp_last_error(), bad[i][2]));
    }
    ASSERT(np == 4 && stage == -7 && batch == 1000000 && lr == 2.5e-3 && !strcmp(backend, "mpi"));
    ASSERT_STR_EQ("pdp_args_parse: prog: -lr 'nan' is not a number in 1e-09..10\nusage: prog "
                  "[-np 4 (1..8)] [-stage -7] [-batch 1000000 (1..1000000)] [-lr 0.0025 "
                  "(1e-09..10)] [-backend mpi (local|mpi|nccl)]", pdp_last_error());
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_args_parse(3, bad[0], args, 5), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), ": -np '9' is outside 1..8\n")); /* a number, out of range */
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_args_parse(3, bad[1], args, 5), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), ": -np '3x' is not an integer in 1..8\n"));
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_args_parse(3, bad[5], args, 5), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), ": -backend 'mp' is not one of local|mpi|nccl\n"));
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_args_parse(3, bad[6], args, 5), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), ": -stage '3000000000' is not an integer\n"));
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_args_parse(3, unknown, args, 5), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "unknown option '-nq'"));
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_args_parse(2, novalue, args, 5), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "-np needs a value"));
    for (i = 0; i < 3; i++) { /* -h, -help, --help: the usage, not "unknown option" */
        char *help[] = {"prog", "-np", "3", i == 0 ? "-h" : i == 1 ? "-help" : "--help"};
        ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_args_parse(4, help, args, 5), pdp_status_name);
        ASSERT(strstr(pdp_last_error(), ": the options, each with its default\nusage: prog "));
        ASSERT(strstr(pdp_last_error(), help[3]) && !strstr(pdp_last_error(), "unknown"));
    }
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_args_parse(3, unknown, NULL, 5), pdp_status_name);
    PASS();
}

/* An int64 option's range is exact past 2^53, where the value's double rounds onto the
   bound: max 2^53 refused 2^53 + 1 only after the integers were compared (and min alike). */
TEST launch_args_int64_range_is_exact_past_2_53(void)
{
    int64_t n = 1;
    const pdp_arg hi[] = {{"-n", PDP_ARG_INT64, &n, 1, 9007199254740992.0, NULL}};
    const pdp_arg lo[] = {{"-n", PDP_ARG_INT64, &n, -9007199254740992.0, -1, NULL}};
    char *over[] = {"prog", "-n", "9007199254740993"}, *at[] = {"prog", "-n", "9007199254740992"};
    char *under[] = {"prog", "-n", "-9007199254740993"};
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_args_parse(3, over, hi, 1), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "-n '9007199254740993' is outside 1.."));
    ASSERT_EQ(1, n);
    ASSERT_ENUM_EQ(PDP_OK, pdp_args_parse(3, at, hi, 1), pdp_status_name);
    ASSERT_EQ((int64_t)9007199254740992, n);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_args_parse(3, under, lo, 1), pdp_status_name);
    ASSERT_EQ((int64_t)9007199254740992, n);
    PASS();
}

/* pdp_args_parse_or_exit, a program's: it returns when the options parse; -h exits with 0
   (the usage on stdout), a mistake with 2 (on stderr). In a child process (this binary with
   --args-child: its exit status). */
static int args_child_status(const char *a1, const char *a2)
{
    char *argv[5] = {"test_launch", "--args-child", (char *)a1, (char *)a2, NULL};
    child c;
    if (child_spawn(&c, argv) != 0) return -100;
    return child_wait(&c);
}

TEST launch_args_parse_or_exit_exits_0_for_help_2_for_a_mistake(void)
{
    ASSERT_EQm("-np 3 parses: it returns", 7, args_child_status("-np", "3"));
    ASSERT_EQm("-h: the usage, exit 0", 0, args_child_status("-h", NULL));
    ASSERT_EQm("--help after an option", 0, args_child_status("-np", "3") == 7 ?
               args_child_status("--help", NULL) : -1);
    ASSERT_EQm("-np 9: out of range, exit 2", 2, args_child_status("-np", "9"));
    ASSERT_EQm("-nq 3: unknown, exit 2", 2, args_child_status("-nq", "3"));
    PASS();
}

/* An option table's own mistakes (no name, no variable, a type of none of the five) are
   PDP_ERR_INVALID naming the entry, before the usage line reads any variable. */
TEST launch_args_refuse_malformed_options(void)
{
    int v = 0;
    char *argv[] = {"prog", "-n", "3"};
    pdp_arg args[2] = {{"-n", PDP_ARG_INT, &v, 0, 0, NULL}, {"-m", PDP_ARG_INT, NULL, 0, 0, NULL}};
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_args_parse(3, argv, args, 2), pdp_status_name);
    ASSERT_STR_EQ("pdp_args_parse: args[1] (-m): value is NULL (the variable that holds the "
                  "default)", pdp_last_error());
    args[1].value = &v, args[1].name = NULL;
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_args_parse(3, argv, args, 2), pdp_status_name);
    ASSERT_STR_EQ("pdp_args_parse: args[1] (NULL): name is NULL", pdp_last_error());
    args[1].name = "-m", args[1].type = (pdp_arg_type)(PDP_ARG_CHOICE + 1);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_args_parse(3, argv, args, 2), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "args[1] (-m): type is none of PDP_ARG_INT"));
    ASSERT_EQ(0, v); /* nothing parsed */
    args[1].type = PDP_ARG_INT;
    ASSERT_ENUM_EQ(PDP_OK, pdp_args_parse(3, argv, args, 2), pdp_status_name);
    ASSERT_EQ(3, v);
    PASS();
}

/* PDP_ARG_CHOICE: the index of the choice given (the first, a middle one, the last; a
   prefix and a longer name are refused, the variable untouched), the default printed by
   name in the usage, and a default that names no choice refused before parsing. */
TEST launch_args_choice(void)
{
    int strategy = 0, schedule = 1;
    const pdp_arg args[] = {
        {"-strategy", PDP_ARG_CHOICE, &strategy, 0, 0, "single|dp|ddp|zero1|zero2|zero3"},
        {"-schedule", PDP_ARG_CHOICE, &schedule, 0, 0, "1f1b|gpipe|interleaved"},
    };
    const char *names[] = {"single", "dp", "ddp", "zero1", "zero2", "zero3"};
    char *bad[][3] = {{"prog", "-strategy", "zero"}, {"prog", "-strategy", "zero33"},
                      {"prog", "-strategy", ""}, {"prog", "-schedule", "1f1b|gpipe"}};
    char *argv[] = {"prog", "-strategy", NULL, "-schedule", "interleaved"};
    char *unknown[] = {"prog", "-x", "1"};
    pdp_arg broken = {"-x", PDP_ARG_CHOICE, &schedule, 0, 0, "a|b"};
    size_t i;
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_args_parse(3, unknown, args, 2), pdp_status_name);
    ASSERT_STR_EQ("pdp_args_parse: prog: unknown option '-x'\nusage: prog [-strategy single "
                  "(single|dp|ddp|zero1|zero2|zero3)] [-schedule gpipe (1f1b|gpipe|interleaved)]",
                  pdp_last_error()); /* the defaults by name */
    for (i = 0; i < 6; i++) { /* each name gives its index, in any order of the calls */
        argv[2] = (char *)names[(i * 5) % 6];
        ASSERT_ENUM_EQ(PDP_OK, pdp_args_parse(5, argv, args, 2), pdp_status_name);
        ASSERT_EQ((int)((i * 5) % 6), strategy);
        ASSERT_EQ(2, schedule);
    }
    for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_args_parse(3, bad[i], args, 2), pdp_status_name);
        ASSERT(strstr(pdp_last_error(), " is not one of "));
        ASSERT(strstr(pdp_last_error(), bad[i][2]));
        ASSERT(strategy == 1 && schedule == 2); /* the last good value, "dp" */
    }
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_args_parse(3, bad[0], args, 2), pdp_status_name);
    ASSERT_STR_EQ("pdp_args_parse: prog: -strategy 'zero' is not one of "
                  "single|dp|ddp|zero1|zero2|zero3\nusage: prog [-strategy dp "
                  "(single|dp|ddp|zero1|zero2|zero3)] [-schedule interleaved "
                  "(1f1b|gpipe|interleaved)]", pdp_last_error());
    schedule = 2; /* "a|b" has no choice 2 */
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_args_parse(1, argv, &broken, 1), pdp_status_name);
    ASSERT_STR_EQ("pdp_args_parse: -x's default 2 is not the index of one of its choices (a|b)",
                  pdp_last_error());
    schedule = -1;
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_args_parse(1, argv, &broken, 1), pdp_status_name);
    broken.choices = NULL, schedule = 0;
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_args_parse(1, argv, &broken, 1), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "(NULL)"));
    PASS();
}

/* pdp_print_by_rank: the ranks call it in reverse rank order in time (rank r sleeps
   (n-1-r) x 20 ms), so printing as each arrives would give "rank 2, 1, 0"; stdout, taken
   into a file, must read 0, 1, 2 and hold nothing from the other ranks but rank 0's print. */
static pdp_status print_fn(const pdp_launch_ctx *ctx, void *user)
{
    struct timespec ts = {0, (long)(ctx->world_size - 1 - ctx->rank) * 20000000L};
    (void)user;
    nanosleep(&ts, NULL);
    return pdp_print_by_rank(ctx->world, "rank %d of %d%s\n", ctx->rank, ctx->world_size,
                             ctx->rank == 1 ? " (one)" : "");
}

TEST launch_print_by_rank(void)
{
    char path[512], got[256] = "";
    int fd = test_temp_file(path, sizeof path, "pdp_test_print"), saved;
    FILE *f;
    size_t len;
    pdp_status st;
    ASSERT(fd >= 0);
    fflush(stdout);
    saved = dup(1);
    dup2(fd, 1);
    st = pdp_launch(3, NULL, print_fn, NULL);
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    close(fd);
    f = fopen(path, "r"); /* text: Windows's stdout may have written "\r\n" */
    ASSERT(f != NULL);
    len = fread(got, 1, sizeof got - 1, f);
    got[len] = '\0';
    fclose(f);
    remove(path);
    ASSERT_ENUM_EQ(PDP_OK, st, pdp_status_name);
    ASSERT_STR_EQ("rank 0 of 3\nrank 1 of 3 (one)\nrank 2 of 3\n", got);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_print_by_rank(NULL, "x"), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "pdp_print_by_rank") == pdp_last_error());
    PASS();
}

SUITE(launch)
{
    RUN_TEST(launch_runs_every_rank_once);
    RUN_TEST(launch_returns_the_first_failing_rank);
    RUN_TEST(launch_reports_the_cause_not_a_pointer_to_it);
    RUN_TEST(launch_env_single_rank);
    RUN_TEST(launch_refuses_bad_input);
    RUN_TEST(launch_helpers);
    RUN_TEST(launch_backend_from_name);
    RUN_TEST(launch_args_parse);
    RUN_TEST(launch_args_int64_range_is_exact_past_2_53);
    RUN_TEST(launch_args_parse_or_exit_exits_0_for_help_2_for_a_mistake);
    RUN_TEST(launch_args_choice);
    RUN_TEST(launch_args_refuse_malformed_options);
    RUN_TEST(launch_print_by_rank);
}

GREATEST_MAIN_DEFS();

/* test_launch --args-child ARGS...: pdp_args_parse_or_exit on ARGS with launch_args_exit's
   table; exits 7 when it returns (the options parsed). */
static int args_child(int argc, char **argv)
{
    int np = 2;
    const pdp_arg args[] = {{"-np", PDP_ARG_INT, &np, 1, 8, NULL}};
#ifdef _WIN32
    const char *null_device = "NUL";
#else
    const char *null_device = "/dev/null";
#endif
    if (!freopen(null_device, "w", stdout) || !freopen(null_device, "w", stderr)) return 1;
    pdp_args_parse_or_exit(argc, argv, args, 1);
    return np == 3 ? 7 : 1;
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "--args-child")) return args_child(argc - 1, argv + 1);
    GREATEST_MAIN_BEGIN();
    RUN_SUITE(launch);
    GREATEST_MAIN_END();
}
