/* fuzz_args.c - libFuzzer harness for pdp_args_parse (src/launch.c). The input, split at
   NUL bytes, is argv (argv[0] the program); the options are a table like the examples'
   (every type; ranged and unranged numbers; strings with and without choices; choices).
   The last byte, when the input ends with "\0\1" + byte, picks defaults that vary the
   table (a choice default that is no choice: the program's mistake). */
#define _POSIX_C_SOURCE 200809L
#define PDP_IMPLEMENTATION
#include "pdp.h"
#include <stdio.h>
#include <stdlib.h>

#define MAXARGS 64

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *buf, *argv[MAXARGS + 1];
    int argc = 0, np = 2, strategy = 0, seed_choice = 1, variant = 0;
    int64_t steps = 1000, seed = -1;
    double lr = 0.1, eps = 1e-8;
    const char *backend = "local", *name = NULL, *empty = "";
    size_t i, start = 0;
    pdp_status st;
    if (size >= 3 && data[size - 3] == 0 && data[size - 2] == 1) {
        variant = data[size - 1];
        size -= 3;
    }
    buf = (char *)malloc(size + 1); /* exactly: ASan sees a read past the last argument */
    if (!buf) abort();
    memcpy(buf, data, size);
    buf[size] = '\0';
    for (i = 0; i <= size && argc < MAXARGS; i++)
        if (i == size || buf[i] == '\0') {
            argv[argc++] = buf + start;
            start = i + 1;
        }
    argv[argc] = NULL;
    strategy = (variant & 7) - 1; /* -1 and 3..6 are no choice: refused before parsing */
    if (variant & 8) np = 100;     /* a default outside its range: kept, as documented */
    {
        pdp_arg args[] = {
            {"-np", PDP_ARG_INT, &np, 1, 8, NULL},
            {"-backend", PDP_ARG_STRING, &backend, 0, 0, "local|mpi|nccl"},
            {"-name", PDP_ARG_STRING, &name, 0, 0, NULL},
            {"-lr", PDP_ARG_DOUBLE, &lr, 0, 0, NULL},
            {"-eps", PDP_ARG_DOUBLE, &eps, 1e-12, 1.0, NULL},
            {"-steps", PDP_ARG_INT64, &steps, 0, 0, NULL},
            {"-seed", PDP_ARG_INT64, &seed, -1, 9e18, NULL},
            {"-strategy", PDP_ARG_CHOICE, &strategy, 0, 0, "single|dp|ddp"},
            {"-mode", PDP_ARG_CHOICE, &seed_choice, 0, 0, "|a||b"},
            {"", PDP_ARG_STRING, &empty, 0, 0, "|"},
            {"-h", PDP_ARG_INT, &np, 0, 0, NULL}, /* an option named like help */
        };
        int count = (int)(sizeof args / sizeof args[0]) - ((variant & 16) ? 0 : 1);
        pdp_clear_error();
        st = pdp_args_parse(argc, argv, args, count);
        if (st != PDP_OK) {
            const char *e = pdp_last_error();
            if (!e || strncmp(e, "pdp_args_parse: ", 16) != 0) abort();
        } else {
            volatile size_t sink = strlen(backend) + (name ? strlen(name) : 0) + strlen(empty);
            (void)sink;
            if (!(variant & 16) && (np < 1 || (np > 8 && !(variant & 8)))) abort();
            if (strategy < 0 || strategy > 2) abort();
            if (!(eps >= 1e-12 && eps <= 1.0)) abort();
        }
    }
    free(buf);
    return 0;
}
