/* launch: pdp_launch runs a function on every rank (launch.h), PDP_CHECK's failure path and
   pdp_seconds. Thread ranks: one group (pdp_local_group or pdp_nccl_group) and one thread per
   rank beyond the caller's rank 0; each rank records its status and message (thread-local,
   so copied here) and the order in which ranks failed, under one mutex, BEFORE it frees its
   communicator: the first failure is then the cause, and the peers' failures that its
   departure provokes come after it. Process ranks: pdp_comm_init_env and one call. Built
   only on the public API of comm.h, rendezvous.h and cuda.h. Then pdp_args_parse, a
   program's "-name value" options. */

#include "internal.h"

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

PDP__PRIVATE void pdp__launch_fail(pdp__launch_rank *r, pdp_status st)
{
    const char *m = pdp_last_error();
    pdp__mutex_lock(&r->L->mu);
    r->st = st;
    r->order = r->L->failures++;
    r->peer = pdp__err_is_peer();
    snprintf(r->msg, sizeof r->msg, "%s", m[0] ? m : "(no message)");
    pdp__mutex_unlock(&r->L->mu);
}

PDP__PRIVATE void pdp__launch_run(pdp__launch_rank *r)
{
    pdp__launch *L = r->L;
    pdp_comm *c = NULL;
    pdp_status st;
    pdp_clear_error();
    st = L->ngroup ? pdp_comm_create_nccl(&c, L->ngroup, r->rank)
                   : pdp_comm_create_local(&c, L->group, r->rank);
    if (st == PDP_OK) {
        pdp_launch_ctx ctx;
        memset(&ctx, 0, sizeof ctx);
        ctx.world = c;
        ctx.rank = r->rank;
        ctx.world_size = L->np;
        ctx.local_rank = r->rank;
        ctx.device = !L->ngroup ? pdp_cpu() : L->devices ? L->devices[r->rank] : pdp_cuda(r->rank);
        ctx.backend = L->backend;
        ctx.process = false;
        st = L->fn(&ctx, L->user);
    }
    if (st != PDP_OK) pdp__launch_fail(r, st); /* before the free: it makes peers fail */
    pdp_comm_free(c);
}

PDP__PRIVATE void *pdp__launch_thread(void *arg)
{
    pdp__launch_run((pdp__launch_rank *)arg);
    return NULL;
}

/* The first rank to fail for a reason of its own (not because a peer did: the peer's
   message holds the cause, whichever returned first), else the first to fail; its message
   prefixed; PDP_OK when none did. */
PDP__PRIVATE pdp_status pdp__launch_result(const pdp__launch_rank *ranks, int n)
{
    int i, first = -1;
    for (i = 0; i < n; i++)
        if (ranks[i].st != PDP_OK &&
            (first < 0 || ranks[i].peer < ranks[first].peer ||
             (ranks[i].peer == ranks[first].peer && ranks[i].order < ranks[first].order)))
            first = i;
    if (first < 0) return PDP_OK;
    return pdp__err(ranks[first].st, "pdp_launch: rank %d of %d: %s", first, n, ranks[first].msg);
}

PDP__PRIVATE pdp_status pdp__launch_threads(int np, const pdp_launch_desc *d,
                                            const pdp_comm_desc *cd, pdp_launch_fn fn, void *user)
{
    static const char fn_name[] = "pdp_launch";
    pdp__launch L;
    pdp_status st;
    int i;
    memset(&L, 0, sizeof L);
    L.np = np;
    L.backend = d->backend == PDP_BACKEND_DEFAULT ? PDP_BACKEND_LOCAL : d->backend;
    L.devices = d->devices;
    L.fn = fn;
    L.user = user;
    if (L.backend == PDP_BACKEND_NCCL) {
        pdp_device devs[64];
        for (i = 0; i < np; i++) devs[i] = d->devices ? d->devices[i] : pdp_cuda(i);
        st = pdp_nccl_group_create(&L.ngroup, np, devs, cd);
    } else {
        st = pdp_local_group_create(&L.group, np, cd);
    }
    if (st != PDP_OK) return pdp__err_wrap(st, "%s: %d thread ranks", fn_name, np);
    L.ranks = (pdp__launch_rank *)pdp__calloc((size_t)np * sizeof *L.ranks);
    if (!L.ranks) {
        pdp_local_group_free(L.group);
        pdp_nccl_group_free(L.ngroup);
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "%s: no memory for %d ranks", fn_name, np);
    }
    pdp__mutex_init(&L.mu);
    for (i = 0; i < np; i++) {
        L.ranks[i].L = &L;
        L.ranks[i].rank = i;
    }
    for (i = 1; i < np; i++) {
        int err = pdp__thread_create(&L.ranks[i].thread, pdp__launch_thread, &L.ranks[i]);
        if (err) { /* this rank joins and leaves at once: its peers fail instead of waiting */
            pdp_comm *c = NULL;
            pdp__err(PDP_ERR_WORKER, "%s: could not start the thread of rank %d: %s", fn_name,
                     i, strerror(err));
            pdp__launch_fail(&L.ranks[i], PDP_ERR_WORKER);
            if (L.group && pdp_comm_create_local(&c, L.group, i) == PDP_OK) pdp_comm_free(c);
            continue;
        }
        L.ranks[i].started = true;
    }
    pdp__launch_run(&L.ranks[0]);
    for (i = 1; i < np; i++)
        if (L.ranks[i].started) pdp__thread_join(&L.ranks[i].thread);
    st = pdp__launch_result(L.ranks, np);
    pdp__mutex_destroy(&L.mu);
    pdp__dealloc(L.ranks);
    pdp_local_group_free(L.group);
    pdp_nccl_group_free(L.ngroup);
    return st;
}

PDP_API pdp_status pdp_launch(int np, const pdp_launch_desc *desc, pdp_launch_fn fn, void *user)
{
    static const char fn_name[] = "pdp_launch";
    pdp_launch_desc d;
    pdp_comm_desc cd;
    pdp_env_info env;
    pdp_status st;
    bool process;
    if (desc) d = *desc;
    else memset(&d, 0, sizeof d);
    if (!fn) return pdp__err(PDP_ERR_INVALID, "%s: fn is NULL", fn_name);
    if (d.backend != PDP_BACKEND_DEFAULT && d.backend != PDP_BACKEND_LOCAL &&
        d.backend != PDP_BACKEND_MPI && d.backend != PDP_BACKEND_NCCL)
        return pdp__err(PDP_ERR_INVALID, "%s: desc.backend %d is not a pdp_backend", fn_name,
                        (int)d.backend);
    if ((st = pdp_env_read(&env)) != PDP_OK) return pdp__err_wrap(st, "%s", fn_name);
    memset(&cd, 0, sizeof cd);
    cd.backend = d.backend;
    cd.timeout_s = d.timeout_s;
    cd.name = d.name ? d.name : "world";
    cd.log = d.log;
    cd.log_user = d.log_user;
    process = d.backend == PDP_BACKEND_MPI || (d.backend == PDP_BACKEND_NCCL && env.from_env);
    if (!process && env.from_env && env.world_size > 1) /* local under a launcher */
        return pdp__err(PDP_ERR_INVALID, "%s: the local backend's ranks are threads of one "
                        "process, but the environment makes this process rank %d of %d "
                        "(RANK/WORLD_SIZE or OMPI_COMM_WORLD_*): use the mpi or nccl backend",
                        fn_name, env.rank, env.world_size);
    if (!process && env.from_env) np = 1; /* the launcher's world of one */
    if (!process) {
        int max = d.backend == PDP_BACKEND_NCCL ? 64 : 256;
        if (np < 1 || np > max)
            return pdp__err(PDP_ERR_INVALID, "%s: np %d outside 1..%d (%s thread ranks)", fn_name,
                            np, max, d.backend == PDP_BACKEND_NCCL ? "nccl" : "local");
        return pdp__launch_threads(np, &d, &cd, fn, user);
    }
    {
        pdp_comm *c = NULL;
        pdp_launch_ctx ctx;
        int rank, size;
        if ((st = pdp_comm_init_env(&c, &cd)) != PDP_OK)
            return pdp__err_wrap(st, "%s: rank %d of %d", fn_name, env.rank, env.world_size);
        rank = pdp_comm_rank(c);
        size = pdp_comm_size(c);
        memset(&ctx, 0, sizeof ctx);
        ctx.world = c;
        ctx.rank = rank;
        ctx.world_size = size;
        ctx.local_rank = env.from_env ? env.local_rank : rank;
        ctx.device = d.backend == PDP_BACKEND_NCCL ? pdp_cuda(ctx.local_rank) : pdp_cpu();
        ctx.backend = d.backend;
        ctx.process = true;
        pdp_clear_error();
        st = fn(&ctx, user);
        if (st == PDP_OK) {
            pdp_comm_free(c);
            return PDP_OK;
        }
        {
            char msg[1024];
            const char *m = pdp_last_error();
            snprintf(msg, sizeof msg, "%s", m[0] ? m : "(no message)");
            pdp_comm_free(c);
            return pdp__err(st, "%s: rank %d of %d: %s", fn_name, rank, size, msg);
        }
    }
}

PDP_API void pdp_check_fail(pdp_status status, const char *file, int line)
{
    fprintf(stderr, "%s:%d: %s: %s\n", file ? file : "?", line, pdp_status_name(status),
            pdp_last_error());
    exit(1);
}

PDP_API pdp_status pdp_backend_from_name(const char *name, pdp_backend *out)
{
    static const char *const names[] = {"local", "mpi", "nccl"};
    static const pdp_backend values[] = {PDP_BACKEND_LOCAL, PDP_BACKEND_MPI, PDP_BACKEND_NCCL};
    int i;
    if (!out) return pdp__err(PDP_ERR_INVALID, "pdp_backend_from_name: out is NULL");
    for (i = 0; name && i < 3; i++)
        if (!strcmp(name, names[i])) {
            *out = values[i];
            return PDP_OK;
        }
    return pdp__err(PDP_ERR_INVALID, "pdp_backend_from_name: '%s' is not a backend (local, mpi "
                    "or nccl)", name ? name : "(null)");
}

PDP_API double pdp_seconds(void) { return pdp__now(); }

PDP_API pdp_status pdp_print_by_rank(pdp_comm *c, const char *fmt, ...)
{
    char text[1024], line[1024];
    int r, n, me;
    va_list ap;
    pdp_status st;
    if (!c || !fmt) return pdp__err(PDP_ERR_INVALID, "pdp_print_by_rank: c or fmt is NULL");
    n = pdp_comm_size(c);
    me = pdp_comm_rank(c);
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    for (r = 0; r < n; r++) { /* rank r's text to every rank (a broadcast: the simplest) */
        if (r == me) memcpy(line, text, sizeof line);
        st = pdp_comm_broadcast_bytes(c, line, sizeof line, r);
        if (st != PDP_OK) return pdp__err_wrap(st, "pdp_print_by_rank: rank %d's text", r);
        if (me == 0) fputs(line, stdout);
    }
    if (me == 0) fflush(stdout);
    return PDP_OK;
}

/* ---- pdp_args_parse: a program's "-name value" options ---- */

/* The index of text among choices, "a|b|c" (0 for "a"), or -1. */
PDP__PRIVATE int pdp__arg_choice_index(const char *choices, const char *text)
{
    size_t n = strlen(text);
    int k;
    for (k = 0;; k++) {
        size_t len = strcspn(choices, "|");
        if (len == n && !strncmp(choices, text, n)) return k;
        if (!choices[len]) return -1;
        choices += len + 1;
    }
}

/* Choice k of choices, "a|b|c", into buf; NULL when there is no choice k. */
PDP__PRIVATE const char *pdp__arg_choice_name(const char *choices, int k, char *buf, size_t cap)
{
    for (; choices && k > 0; k--)
        if ((choices = strchr(choices, '|')) != NULL) choices++;
    if (!choices || k < 0) return NULL;
    snprintf(buf, cap, "%.*s", (int)strcspn(choices, "|"), choices);
    return buf;
}

/* What a accepts, "1..8" or "local|mpi|nccl", into buf ("" when anything of its type). */
PDP__PRIVATE const char *pdp__arg_accepts(const pdp_arg *a, char *buf, size_t cap)
{
    bool text = a->type == PDP_ARG_STRING || a->type == PDP_ARG_CHOICE;
    buf[0] = '\0';
    if (text && a->choices)
        snprintf(buf, cap, "%s", a->choices);
    else if (!text && (a->min != 0.0 || a->max != 0.0))
        snprintf(buf, cap, "%.15g..%.15g", a->min, a->max);
    return buf;
}

/* Stores text in a's variable, or returns false (the variable untouched) when a refuses
   it: not a whole number of a's type, outside a's range, not one of a's choices. */
PDP__PRIVATE bool pdp__arg_set(const pdp_arg *a, const char *text)
{
    bool ranged = a->min != 0.0 || a->max != 0.0;
    char *end;
    double v;
    long long i = 0;
    if (a->type == PDP_ARG_STRING) {
        if (a->choices && pdp__arg_choice_index(a->choices, text) < 0) return false;
        *(const char **)a->value = text;
        return true;
    }
    if (a->type == PDP_ARG_CHOICE) {
        int k = pdp__arg_choice_index(a->choices, text);
        if (k >= 0) *(int *)a->value = k;
        return k >= 0;
    }
    errno = 0;
    if (a->type == PDP_ARG_DOUBLE) {
        v = strtod(text, &end);
    } else {
        i = strtoll(text, &end, 10);
        v = (double)i;
    }
    if (end == text || *end || errno || !isfinite(v) || (ranged && (v < a->min || v > a->max)))
        return false;
    /* an integer past 2^53 rounds to a double that may equal the bound it passes (max
       2^53 took 2^53 + 1): at a bound, compare the integers (a bound of 2^63 or more is past
       every int64 already) */
    if (a->type != PDP_ARG_DOUBLE && ranged &&
        ((v == a->max && fabs(v) < 9223372036854775808.0 && i > (long long)a->max) ||
         (v == a->min && fabs(v) < 9223372036854775808.0 && i < (long long)a->min)))
        return false;
    if (a->type == PDP_ARG_INT && (i < INT_MIN || i > INT_MAX)) return false;
    if (a->type == PDP_ARG_INT) *(int *)a->value = (int)i;
    else if (a->type == PDP_ARG_INT64) *(int64_t *)a->value = (int64_t)i;
    else *(double *)a->value = v;
    return true;
}

/* Appends " [-name value]" (the variable's value now, a choice's by name) and " (what it
   accepts)" to buf; false, appending nothing, for a choice whose value names no choice. */
PDP__PRIVATE bool pdp__arg_usage(const pdp_arg *a, char *buf, size_t cap)
{
    size_t n = strlen(buf);
    char value[64], accepts[128], paren[136] = "";
    const char *str = a->type == PDP_ARG_STRING ? *(const char *const *)a->value : NULL;
    if (a->type == PDP_ARG_CHOICE &&
        !(str = pdp__arg_choice_name(a->choices, *(const int *)a->value, value, sizeof value)))
        return false;
    if (a->type == PDP_ARG_INT) snprintf(value, sizeof value, "%d", *(const int *)a->value);
    if (a->type == PDP_ARG_INT64)
        snprintf(value, sizeof value, "%lld", (long long)*(const int64_t *)a->value);
    if (a->type == PDP_ARG_DOUBLE) snprintf(value, sizeof value, "%g", *(const double *)a->value);
    if (pdp__arg_accepts(a, accepts, sizeof accepts)[0])
        snprintf(paren, sizeof paren, " (%s)", accepts);
    snprintf(buf + n, cap - n, " [%s %s%s]", a->name,
             str ? str : a->type == PDP_ARG_STRING ? "" : value, paren);
    return true;
}

/* "-h", "-help" or "--help", when no option has that name. */
PDP__PRIVATE bool pdp__arg_is_help(const char *name)
{
    return !strcmp(name, "-h") || !strcmp(name, "-help") || !strcmp(name, "--help");
}

PDP_API pdp_status pdp_args_parse(int argc, char **argv, const pdp_arg *args, int count)
{
    const char *prog = argc > 0 && argv && argv[0] ? argv[0] : "program";
    char why[320] = "", usage[640], accepts[128];
    int i, k;
    if (argc < 0 || (argc > 0 && !argv) || count < 0 || (count > 0 && !args))
        return pdp__err(PDP_ERR_INVALID, "pdp_args_parse: argv or args is NULL (argc %d, count "
                        "%d)", argc, count);
    for (k = 0; k < count; k++) /* a program's mistakes, before anything is read or written */
        if (!args[k].name || !args[k].value || (int)args[k].type < (int)PDP_ARG_INT ||
            (int)args[k].type > (int)PDP_ARG_CHOICE)
            return pdp__err(PDP_ERR_INVALID, "pdp_args_parse: args[%d] (%s): %s", k,
                            args[k].name ? args[k].name : "NULL", !args[k].name ? "name is NULL"
                            : !args[k].value ? "value is NULL (the variable that holds the default)"
                            : "type is none of PDP_ARG_INT, _INT64, _DOUBLE, _STRING, _CHOICE");
    snprintf(usage, sizeof usage, "usage: %s", prog); /* before parsing: the defaults */
    for (k = 0; k < count; k++)
        if (!pdp__arg_usage(&args[k], usage, sizeof usage)) /* a program's mistake */
            return pdp__err(PDP_ERR_INVALID, "pdp_args_parse: %s's default %d is not the index of "
                            "one of its choices (%s)", args[k].name, *(const int *)args[k].value,
                            args[k].choices ? args[k].choices : "NULL");
    for (i = 1; i < argc && !why[0]; i += 2) {
        for (k = 0; k < count && strcmp(argv[i], args[k].name); k++) {}
        if (k == count && pdp__arg_is_help(argv[i])) /* the usage alone: not a mistake */
            snprintf(why, sizeof why, "%s: the options, each with its default", argv[i]);
        else if (k == count)
            snprintf(why, sizeof why, "unknown option '%s'", argv[i]);
        else if (i + 1 == argc)
            snprintf(why, sizeof why, "%s needs a value", argv[i]);
        else if (!pdp__arg_set(&args[k], argv[i + 1])) {
            /* "-np '9' is outside 1..8", "-np '3x' is not an integer in 1..8",
               "-backend 'x' is not one of local|mpi" */
            bool str = args[k].type == PDP_ARG_STRING || args[k].type == PDP_ARG_CHOICE;
            const char *kind = str ? "one of" : args[k].type == PDP_ARG_DOUBLE ? "a number"
                                                                               : "an integer";
            pdp_arg whole = args[k]; /* the value's type without the range, into a scratch */
            union { int i; int64_t l; double d; } scratch;
            pdp__arg_accepts(&args[k], accepts, sizeof accepts);
            whole.min = whole.max = 0.0, whole.value = &scratch;
            if (!str && accepts[0] && pdp__arg_set(&whole, argv[i + 1]))
                snprintf(why, sizeof why, "%s '%s' is outside %s", argv[i], argv[i + 1], accepts);
            else
                snprintf(why, sizeof why, "%s '%s' is not %s%s%s", argv[i], argv[i + 1], kind,
                         !accepts[0] ? "" : str ? " " : " in ", accepts);
        }
    }
    if (!why[0]) return PDP_OK;
    return pdp__err(PDP_ERR_INVALID, "pdp_args_parse: %s: %s\n%s", prog, why, usage);
}

PDP_API void pdp_args_parse_or_exit(int argc, char **argv, const pdp_arg *args, int count)
{
    const char *m, *usage;
    if (pdp_args_parse(argc, argv, args, count) == PDP_OK) return;
    m = pdp_last_error();
    usage = strstr(m, ": the options, each with its default\nusage: "); /* -h (launch.c) */
    if (usage) {
        printf("%s\n", strchr(usage, '\n') + 1);
        exit(0);
    }
    fprintf(stderr, "%s\n", m);
    exit(2);
}
