/* pdp_test.h - v1.0 - a greatest-compatible unit test harness for pdp, one header - MIT licence
 * (our own code; it reproduces the API and output of greatest 1.5.0, see reference section 9)
 *
 * WRITING A TEST FILE
 *
 *     #include "pdp_test.h"
 *
 *     TEST gemm_identity(void) {
 *         ASSERT_EQ(4, 2 + 2);                      expected first, actual second
 *         ASSERT_IN_RANGE(1.0, 1.0 + 1e-9, 1e-6);   |exp - got| <= tol, compared as double
 *         ASSERT_STR_EQm("names differ", "0.weight", name);
 *         PASS();
 *     }
 *
 *     SUITE(gemm) {
 *         SET_SETUP(my_setup, &fixture);            void my_setup(void *udata); per test
 *         RUN_TEST(gemm_identity);
 *         RUN_TEST1(gemm_with_arg, &shape);         TEST gemm_with_arg(void *arg)
 *     }
 *
 *     GREATEST_MAIN_DEFS();                         once per program, at file scope
 *
 *     int main(int argc, char **argv) {             these exact parameter names
 *         GREATEST_MAIN_BEGIN();
 *         RUN_SUITE(gemm);
 *         GREATEST_MAIN_END();                      returns EXIT_FAILURE if any test failed
 *     }
 *
 * A TEST returns its result: PASS(), FAIL(), SKIP() and every failing ASSERT* `return` from the
 * test function (no longjmp). Helpers returning `enum greatest_test_res` chain with CHECK_CALL.
 * A suite defined in another file is declared with `SUITE_EXTERN(name);` and run as usual.
 *
 * ASSERTIONS (each has an `m` form taking a message first: ASSERTm(msg, c), ASSERT_EQm(msg, e, g))
 *     ASSERT(c)  ASSERT_FALSE(c)  ASSERT_EQ(e, g)  ASSERT_NEQ  ASSERT_GT  ASSERT_GTE  ASSERT_LT
 *     ASSERT_LTE  ASSERT_EQ_FMT(e, g, "%d")  ASSERT_IN_RANGE(e, g, tol)  ASSERT_STR_EQ(e, g)
 *     ASSERT_STRN_EQ(e, g, n)  ASSERT_MEM_EQ(e, g, bytes)  ASSERT_ENUM_EQ(e, g, name_fn)
 * The default message is the source text, e.g. `1 != two()`; a failing EQ_FMT, IN_RANGE,
 * STR*, MEM and ENUM assertion first prints "Expected: ..." / "     Got: ...". ASSERT_EQ_FMT
 * evaluates its arguments again to print them: keep side effects out of them. name_fn has
 * type `const char *fn(int)`. Every ASSERT* counts one assertion, pass or fail.
 * Results: PASS() FAIL() SKIP() PASSm(msg) FAILm(msg) SKIPm(msg); the message (and an
 * assertion's) is copied, so it may live in the test's own stack or in memory the teardown
 * frees; one over PDP_TEST_MSG_COPY_SIZE - 1 bytes (1023) is cut to end in "...", unlike
 * greatest, which keeps the pointer. Others: RUN_TESTp(t, ...)
 * (C99), IGNORE_TEST(t), greatest_set_test_suffix("129") (next RUN_TEST* reports
 * `name_129`), SET_TEARDOWN(fn, udata). Setup and teardown run around every selected test,
 * also a failing one, and are cleared when a suite starts and ends.
 *
 * GPU TESTS
 *     SKIP_NO_CUDA();  SKIP_NO_CUDAm("no CUDA device");  PDP_TEST_SKIP_OR_FAIL("ENV", msg);
 * skip the test, unless the environment variable (PDP_TEST_REQUIRE_CUDA for the first two)
 * is set to anything but "" or "0" (pdp_test_env_on(name) tests that): then the skip is a
 * failure, whose message says so, and a GPU run cannot pass by skipping.
 *
 * COMMAND LINE (parsed by GREATEST_MAIN_BEGIN)
 *     -h, --help   usage, exit 0              -l   list matching suites and tests, run nothing
 *     -v           verbose; -vv or -v -v: 2   -f   stop at the first failing test
 *     -s SUITE     only suites containing SUITE        -a   abort() at the first failure
 *     -t TEST      only tests containing TEST          -e   -s and -t match whole names
 *     -x EXCLUDE   not tests containing EXCLUDE (wins over -t)     --   stop reading options
 * Unknown or combined options (-z, -fv, --verbose) and a missing value print usage and exit 1.
 * Arguments not starting with '-' are ignored.
 *
 * OUTPUT is greatest's, line for line: `* Suite name:` headers, `.`/`s`/`F` per test (or one
 * `PASS|SKIP|FAIL name: msg` line each with -v), `FAIL name: msg (file:line)`, a summary per
 * suite, then `Total: ...` and `Pass: P, fail: F, skip: S.`.
 * THE ONE DIVERGENCE: after greatest's report comes one more, final line
 *     P passed, F failed, S skipped
 * (e.g. `12 passed, 0 failed, 1 skipped`), which tests/run_all.sh adds up. It is not printed
 * with -l or -h. The exit status is EXIT_FAILURE exactly when a test failed.
 * Also different from greatest: ASSERT_IN_RANGE fails on NaN (greatest passes it), and
 * ASSERT_ENUM_EQ counts as an assertion. Shuffling, ASSERT_EQUAL_T and the longjmp family are
 * left out: code using them does not compile.
 *
 * OPTIONS (define before including): GREATEST_USE_ABBREVS 1 (short names), GREATEST_STDOUT
 * stdout, GREATEST_FPRINTF fprintf, GREATEST_DEFAULT_WIDTH 72, GREATEST_FLOAT double,
 * GREATEST_FLOAT_FMT "%g", GREATEST_USE_TIME 1 (clock() timings), GREATEST_TESTNAME_BUF_SIZE 128.
 *
 * LIBRARY USE: GREATEST_INIT(); run suites; GREATEST_PRINT_REPORT(); greatest_all_passed(),
 * greatest_get_report(&r), greatest_set_{suite,test}_filter, greatest_set_test_exclude,
 * greatest_set_exact_name_match, greatest_stop_at_first_fail, greatest_abort_on_fail,
 * greatest_list_only, greatest_{get,set}_verbosity.
 *
 * Every function is `static inline`: include this header from any number of files; exactly
 * one defines the runner state with GREATEST_MAIN_DEFS(). Standard C only; C89 to C++.
 */
#ifndef PDP_TEST_H_INCLUDED
#define PDP_TEST_H_INCLUDED

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define GREATEST_VERSION_MAJOR 1
#define GREATEST_VERSION_MINOR 5
#define GREATEST_VERSION_PATCH 0

#ifndef GREATEST_USE_ABBREVS
#define GREATEST_USE_ABBREVS 1
#endif
#ifndef GREATEST_STDOUT
#define GREATEST_STDOUT stdout
#endif
#ifndef GREATEST_FPRINTF
#define GREATEST_FPRINTF fprintf
#endif
#ifndef GREATEST_DEFAULT_WIDTH
#define GREATEST_DEFAULT_WIDTH 72
#endif
#ifndef GREATEST_FLOAT
#define GREATEST_FLOAT double
#endif
#ifndef GREATEST_FLOAT_FMT
#define GREATEST_FLOAT_FMT "%g"
#endif
#ifndef GREATEST_USE_TIME
#define GREATEST_USE_TIME 1
#endif
#ifndef GREATEST_TESTNAME_BUF_SIZE
#define GREATEST_TESTNAME_BUF_SIZE 128
#endif
#define PDP_TEST_MSG_BUF_SIZE 256
#ifndef PDP_TEST_MSG_COPY_SIZE
#define PDP_TEST_MSG_COPY_SIZE 1024    /* a result message is copied into this many bytes */
#endif

#if defined(__cplusplus) || (defined(__STDC_VERSION__) && __STDC_VERSION__ >= 199901L)
#define PDP_TEST__FN static inline
#elif defined(__GNUC__)
#define PDP_TEST__FN static __inline__
#else
#define PDP_TEST__FN static
#endif

/* ---- types and the runner state ---- */

enum greatest_test_res {
    GREATEST_TEST_RES_PASS = 0,
    GREATEST_TEST_RES_FAIL = -1,
    GREATEST_TEST_RES_SKIP = 1
};

typedef void greatest_setup_cb(void *udata);
typedef void greatest_teardown_cb(void *udata);
typedef void greatest_suite_cb(void);
typedef const char *greatest_enum_str_fun(int value);

struct greatest_report_t {
    unsigned int passed, failed, skipped, assertions;
};

struct greatest_suite_info {         /* counters of the running suite, folded in at its end */
    unsigned int tests_run, passed, failed, skipped;
    clock_t pre_suite, post_suite, pre_test, post_test;
};

struct greatest_run_info {
    unsigned int verbosity;          /* -v count */
    unsigned int width, col;         /* quiet mode wraps after `width` results */
    int list_only, first_fail, abort_on_fail, exact_match;
    int running_test;                /* catches RUN_TEST inside a test */
    unsigned int tests_run, passed, failed, skipped, assertions;    /* finished suites */
    struct greatest_suite_info suite;
    const char *suite_filter, *test_filter, *test_exclude, *name_suffix;
    const char *msg;                 /* set by PASSm/FAILm/SKIPm, NULL prints as "" */
    char msg_copy[PDP_TEST_MSG_COPY_SIZE];    /* what msg points to after PASSm/FAILm/SKIPm */
    const char *fail_file;
    unsigned int fail_line;
    greatest_setup_cb *setup;
    void *setup_udata;
    greatest_teardown_cb *teardown;
    void *teardown_udata;
    clock_t begin, end;
    char name_buf[GREATEST_TESTNAME_BUF_SIZE];
    char msg_buf[PDP_TEST_MSG_BUF_SIZE];
};

#ifdef __cplusplus
extern "C" {
#endif
extern struct greatest_run_info greatest_info;      /* defined by GREATEST_MAIN_DEFS() */
#ifdef __cplusplus
}
#endif

/* ---- definitions and running ---- */

#define GREATEST_TEST static enum greatest_test_res
#define GREATEST_SUITE(NAME) void NAME(void); void NAME(void)
#define GREATEST_SUITE_EXTERN(NAME) void NAME(void)
#define GREATEST_RUN_SUITE(S) greatest_run_suite(S, #S)
#define GREATEST_RUN_TEST(T) \
    do { if (greatest_test_pre(#T) == 1) { greatest_test_post(T()); } } while (0)
#define GREATEST_RUN_TEST1(T, ENV) \
    do { if (greatest_test_pre(#T) == 1) { greatest_test_post(T(ENV)); } } while (0)
#if defined(__cplusplus) || (defined(__STDC_VERSION__) && __STDC_VERSION__ >= 199901L)
#define GREATEST_RUN_TESTp(T, ...) \
    do { if (greatest_test_pre(#T) == 1) { greatest_test_post(T(__VA_ARGS__)); } } while (0)
#endif
#define GREATEST_IGNORE_TEST(T) do { (void)(T); } while (0)
#define GREATEST_SET_SETUP_CB(CB, UDATA) \
    do { greatest_info.setup = (CB); greatest_info.setup_udata = (UDATA); } while (0)
#define GREATEST_SET_TEARDOWN_CB(CB, UDATA) \
    do { greatest_info.teardown = (CB); greatest_info.teardown_udata = (UDATA); } while (0)
#define GREATEST_CHECK_CALL(RES) \
    do { \
        enum greatest_test_res greatest_RES = (RES); \
        if (greatest_RES != GREATEST_TEST_RES_PASS) { return greatest_RES; } \
    } while (0)

/* ---- results ---- */

/* The message is copied (pdp_test__keep_msg): a test may pass a buffer of its own stack, or
 * one it frees or rewrites in a teardown, since the line is printed after the test returned. */
#define GREATEST_PASSm(MSG) \
    do { greatest_info.msg = pdp_test__keep_msg(MSG); return GREATEST_TEST_RES_PASS; } while (0)
#define GREATEST_SKIPm(MSG) \
    do { greatest_info.msg = pdp_test__keep_msg(MSG); return GREATEST_TEST_RES_SKIP; } while (0)
#define GREATEST_FAILm(MSG) \
    do { \
        greatest_info.fail_file = __FILE__; \
        greatest_info.fail_line = (unsigned int)__LINE__; \
        greatest_info.msg = pdp_test__keep_msg(MSG); \
        if (greatest_info.abort_on_fail) { fflush(GREATEST_STDOUT); abort(); } \
        return GREATEST_TEST_RES_FAIL; \
    } while (0)
#define GREATEST_PASS() GREATEST_PASSm(NULL)
#define GREATEST_SKIP() GREATEST_SKIPm(NULL)
#define GREATEST_FAIL() GREATEST_FAILm(NULL)

#define PDP_TEST_SKIP_OR_FAIL(ENVVAR, MSG) \
    do { \
        if (pdp_test_env_on(ENVVAR)) { GREATEST_FAILm(pdp_test__required(ENVVAR, MSG)); } \
        GREATEST_SKIPm(MSG); \
    } while (0)
#define PDP_TEST_SKIP_NO_CUDAm(MSG) PDP_TEST_SKIP_OR_FAIL("PDP_TEST_REQUIRE_CUDA", MSG)
#define PDP_TEST_SKIP_NO_CUDA() PDP_TEST_SKIP_NO_CUDAm("no CUDA device")

/* A timeout that a test waits out on purpose (an absent rank, a stalled peer): short, so the
   suite does not sleep, and 4 times longer under a sanitizer (ASan, UBSan's builds with it,
   TSan), where the ranks that are present take that much longer to reach the wait. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define PDP_TEST_TIMEOUT(S) (4.0 * (S))
#else
#define PDP_TEST_TIMEOUT(S) (S)
#endif

/* Under ThreadSanitizer (make tsan), which checks how threads order their accesses, work
   done on one thread checks nothing and runs 5-30 times slower: a test skips it there
   (PDP_TEST_SKIP_UNDER_TSAN, for a test that is all one thread's), or starts its thread
   counts at 2 (PDP_TEST_FIRST_THREADS). make test and make sanitize run it all. */
#if defined(__SANITIZE_THREAD__)
#define PDP_TEST_UNDER_TSAN 1
#else
#define PDP_TEST_UNDER_TSAN 0
#endif
#define PDP_TEST_FIRST_THREADS (PDP_TEST_UNDER_TSAN ? 2 : 1)
#define PDP_TEST_SKIP_UNDER_TSAN(WHAT) \
    do { \
        if (PDP_TEST_UNDER_TSAN) \
            GREATEST_SKIPm("one thread's work (" WHAT "): nothing for ThreadSanitizer to " \
                           "check; make test and make sanitize run it"); \
    } while (0)

/* ---- assertions ---- */

#define PDP_TEST__CHECKm(MSG, OK) \
    do { greatest_info.assertions++; if (!(OK)) { GREATEST_FAILm(MSG); } } while (0)

#define GREATEST_ASSERTm(MSG, C) PDP_TEST__CHECKm(MSG, (C))
#define GREATEST_ASSERT_FALSEm(MSG, C) PDP_TEST__CHECKm(MSG, !(C))
#define GREATEST_ASSERT_EQm(MSG, E, G) PDP_TEST__CHECKm(MSG, (E) == (G))
#define GREATEST_ASSERT_NEQm(MSG, E, G) PDP_TEST__CHECKm(MSG, (E) != (G))
#define GREATEST_ASSERT_GTm(MSG, E, G) PDP_TEST__CHECKm(MSG, (E) > (G))
#define GREATEST_ASSERT_GTEm(MSG, E, G) PDP_TEST__CHECKm(MSG, (E) >= (G))
#define GREATEST_ASSERT_LTm(MSG, E, G) PDP_TEST__CHECKm(MSG, (E) < (G))
#define GREATEST_ASSERT_LTEm(MSG, E, G) PDP_TEST__CHECKm(MSG, (E) <= (G))
#define GREATEST_ASSERT_IN_RANGEm(MSG, E, G, TOL) \
    PDP_TEST__CHECKm(MSG, pdp_test__in_range((GREATEST_FLOAT)(E), (GREATEST_FLOAT)(G), \
                                             (GREATEST_FLOAT)(TOL)))
#define GREATEST_ASSERT_STR_EQm(MSG, E, G) PDP_TEST__CHECKm(MSG, pdp_test__str_eq(E, G, 0, 0))
#define GREATEST_ASSERT_STRN_EQm(MSG, E, G, N) \
    PDP_TEST__CHECKm(MSG, pdp_test__str_eq(E, G, (size_t)(N), 1))
#define GREATEST_ASSERT_MEM_EQm(MSG, E, G, SIZE) \
    PDP_TEST__CHECKm(MSG, pdp_test__mem_eq(E, G, (size_t)(SIZE)))
#define GREATEST_ASSERT_ENUM_EQm(MSG, E, G, NAME_FN) \
    PDP_TEST__CHECKm(MSG, pdp_test__enum_eq((int)(E), (int)(G), NAME_FN))
#define GREATEST_ASSERT_EQ_FMTm(MSG, E, G, FMT) \
    do { \
        greatest_info.assertions++; \
        if ((E) != (G)) { \
            GREATEST_FPRINTF(GREATEST_STDOUT, "\nExpected: "); \
            GREATEST_FPRINTF(GREATEST_STDOUT, FMT, E); \
            GREATEST_FPRINTF(GREATEST_STDOUT, "\n     Got: "); \
            GREATEST_FPRINTF(GREATEST_STDOUT, FMT, G); \
            GREATEST_FPRINTF(GREATEST_STDOUT, "\n"); \
            GREATEST_FAILm(MSG); \
        } \
    } while (0)

#define GREATEST_ASSERT(C) GREATEST_ASSERTm(#C, C)
#define GREATEST_ASSERT_FALSE(C) GREATEST_ASSERT_FALSEm(#C, C)
#define GREATEST_ASSERT_EQ(E, G) GREATEST_ASSERT_EQm(#E " != " #G, E, G)
#define GREATEST_ASSERT_NEQ(E, G) GREATEST_ASSERT_NEQm(#E " == " #G, E, G)
#define GREATEST_ASSERT_GT(E, G) GREATEST_ASSERT_GTm(#E " <= " #G, E, G)
#define GREATEST_ASSERT_GTE(E, G) GREATEST_ASSERT_GTEm(#E " < " #G, E, G)
#define GREATEST_ASSERT_LT(E, G) GREATEST_ASSERT_LTm(#E " >= " #G, E, G)
#define GREATEST_ASSERT_LTE(E, G) GREATEST_ASSERT_LTEm(#E " > " #G, E, G)
#define GREATEST_ASSERT_EQ_FMT(E, G, FMT) GREATEST_ASSERT_EQ_FMTm(#E " != " #G, E, G, FMT)
#define GREATEST_ASSERT_IN_RANGE(E, G, TOL) \
    GREATEST_ASSERT_IN_RANGEm(#E " != " #G " +/- " #TOL, E, G, TOL)
#define GREATEST_ASSERT_STR_EQ(E, G) GREATEST_ASSERT_STR_EQm(#E " != " #G, E, G)
#define GREATEST_ASSERT_STRN_EQ(E, G, N) GREATEST_ASSERT_STRN_EQm(#E " != " #G, E, G, N)
#define GREATEST_ASSERT_MEM_EQ(E, G, SIZE) GREATEST_ASSERT_MEM_EQm(#E " != " #G, E, G, SIZE)
#define GREATEST_ASSERT_ENUM_EQ(E, G, NAME_FN) \
    GREATEST_ASSERT_ENUM_EQm(#E " != " #G, E, G, NAME_FN)

/* ---- main ---- */

#define GREATEST_MAIN_DEFS() struct greatest_run_info greatest_info
#define GREATEST_INIT() pdp_test__init()
#define GREATEST_PRINT_REPORT() pdp_test__report()
#define GREATEST_MAIN_BEGIN() \
    do { GREATEST_INIT(); pdp_test__parse_options(argc, argv); } while (0)
#define GREATEST_MAIN_END() \
    do { \
        GREATEST_PRINT_REPORT(); \
        return greatest_all_passed() ? EXIT_SUCCESS : EXIT_FAILURE; \
    } while (0)

/* ---- runner ---- */

#if GREATEST_USE_TIME
#define PDP_TEST__NOW(T) ((T) = clock())
#else
#define PDP_TEST__NOW(T) ((void)0)
#endif

PDP_TEST__FN void pdp_test__clock_diff(clock_t from, clock_t to)
{
#if GREATEST_USE_TIME
    GREATEST_FPRINTF(GREATEST_STDOUT, " (%lu ticks, %.3f sec)", (unsigned long)(to - from),
                     (double)(to - from) / (double)CLOCKS_PER_SEC);
#else
    (void)from;
    (void)to;
#endif
}

PDP_TEST__FN int pdp_test__match(const char *name, const char *filter, int exact, int if_none)
{
    if (filter == NULL || filter[0] == '\0') return if_none;
    return exact ? strcmp(name, filter) == 0 : strstr(name, filter) != NULL;
}

/* Copies a result message into greatest_info.msg_copy and returns the copy (NULL stays NULL).
 * A longer message is cut at a character boundary of the buffer and ends in "...". */
PDP_TEST__FN const char *pdp_test__keep_msg(const char *msg)
{
    char *copy = greatest_info.msg_copy;
    size_t n, cap = sizeof greatest_info.msg_copy;
    if (msg == NULL) return NULL;
    if (msg == copy) return copy;
    for (n = 0; n < cap - 1 && msg[n] != '\0'; n++) copy[n] = msg[n];    /* byte by byte: */
    copy[n] = '\0';                       /* msg may be shorter than the buffer, or overlap it */
    if (msg[n] != '\0') {
        for (n = cap - 4; n < cap - 1; n++) copy[n] = '.';
    }
    return copy;
}

PDP_TEST__FN void pdp_test__init(void)
{
    memset(&greatest_info, 0, sizeof greatest_info);
    greatest_info.width = GREATEST_DEFAULT_WIDTH;
    PDP_TEST__NOW(greatest_info.begin);
}

/* Folds the running suite's counters into the totals; clears hooks and the column. */
PDP_TEST__FN void pdp_test__end_suite(void)
{
    struct greatest_run_info *g = &greatest_info;
    g->setup = NULL;
    g->setup_udata = NULL;
    g->teardown = NULL;
    g->teardown_udata = NULL;
    g->tests_run += g->suite.tests_run;
    g->passed += g->suite.passed;
    g->failed += g->suite.failed;
    g->skipped += g->suite.skipped;
    memset(&g->suite, 0, sizeof g->suite);
    g->col = 0;
}

PDP_TEST__FN unsigned int pdp_test__failed(void)
{
    return greatest_info.failed + greatest_info.suite.failed;
}

PDP_TEST__FN void greatest_run_suite(greatest_suite_cb *suite, const char *name)
{
    struct greatest_run_info *g = &greatest_info;
    struct greatest_suite_info *s = &g->suite;
    FILE *out = GREATEST_STDOUT;
    if (!pdp_test__match(name, g->suite_filter, g->exact_match, 1)) return;
    if (g->first_fail && pdp_test__failed() > 0) return;
    pdp_test__end_suite();
    GREATEST_FPRINTF(out, "\n* Suite %s:\n", name);
    PDP_TEST__NOW(s->pre_suite);
    suite();
    PDP_TEST__NOW(s->post_suite);
    if (s->tests_run > 0) {
        GREATEST_FPRINTF(out, "\n%u test%s - %u passed, %u failed, %u skipped", s->tests_run,
                         s->tests_run == 1 ? "" : "s", s->passed, s->failed, s->skipped);
        pdp_test__clock_diff(s->pre_suite, s->post_suite);
        GREATEST_FPRINTF(out, "\n");
    }
    g->setup = NULL;
    g->teardown = NULL;
}

PDP_TEST__FN void greatest_set_test_suffix(const char *suffix)
{
    greatest_info.name_suffix = suffix;
}

/* Name into name_buf (with "_suffix"), truncated to the buffer. */
PDP_TEST__FN void pdp_test__set_name(const char *name)
{
    char *buf = greatest_info.name_buf;
    const char *suffix = greatest_info.name_suffix;
    size_t cap = sizeof greatest_info.name_buf - 1, n = strlen(name), k;
    if (n > cap) n = cap;
    memcpy(buf, name, n);
    if (suffix != NULL && n < cap) {
        buf[n++] = '_';
        k = strlen(suffix);
        if (k > cap - n) k = cap - n;
        memcpy(buf + n, suffix, k);
        n += k;
    }
    buf[n] = '\0';
}

/* Returns 1 when the test should run; then it has run setup and started the clock. */
PDP_TEST__FN int greatest_test_pre(const char *name)
{
    struct greatest_run_info *g = &greatest_info;
    FILE *out = GREATEST_STDOUT;
    int match;
    if (g->running_test) {
        fprintf(stderr, "Error: Test run inside another test.\n");
        g->name_suffix = NULL;
        return 0;
    }
    pdp_test__set_name(name);
    g->name_suffix = NULL;
    match = pdp_test__match(g->name_buf, g->test_filter, g->exact_match, 1) &&
            !pdp_test__match(g->name_buf, g->test_exclude, 0, 0);
    if (g->list_only) {
        if (match) GREATEST_FPRINTF(out, "  %s\n", g->name_buf);
        return 0;
    }
    if (!match || (g->first_fail && pdp_test__failed() > 0)) return 0;
    g->msg = NULL;
    g->fail_file = NULL;
    g->fail_line = 0;
    g->running_test = 1;
    PDP_TEST__NOW(g->suite.pre_test);
    if (g->setup != NULL) g->setup(g->setup_udata);
    return 1;
}

PDP_TEST__FN void greatest_test_post(int res)
{
    struct greatest_run_info *g = &greatest_info;
    const char *msg = g->msg != NULL ? g->msg : "";
    int verbose = g->verbosity > 0;
    FILE *out = GREATEST_STDOUT;
    PDP_TEST__NOW(g->suite.post_test);
    if (g->teardown != NULL) g->teardown(g->teardown_udata);
    g->running_test = 0;
    if (res <= GREATEST_TEST_RES_FAIL) {
        const char *file = g->fail_file != NULL ? g->fail_file : "";
        if (verbose) {
            GREATEST_FPRINTF(out, "FAIL %s: %s (%s:%u)", g->name_buf, msg, file, g->fail_line);
        } else {
            GREATEST_FPRINTF(out, "F\nFAIL %s: %s (%s:%u)\n", g->name_buf, msg, file, g->fail_line);
            g->col = 0;
        }
        g->suite.failed++;
    } else if (res >= GREATEST_TEST_RES_SKIP) {
        GREATEST_FPRINTF(out, verbose ? "SKIP %s: %s" : "s", g->name_buf, msg);
        g->suite.skipped++;
    } else {
        GREATEST_FPRINTF(out, verbose ? "PASS %s: %s" : ".", g->name_buf, msg);
        g->suite.passed++;
    }
    g->suite.tests_run++;
    g->col++;
    if (verbose) {
        pdp_test__clock_diff(g->suite.pre_test, g->suite.post_test);
        GREATEST_FPRINTF(out, "\n");
    } else if (g->width > 0 && g->col % g->width == 0) {
        GREATEST_FPRINTF(out, "\n");
        g->col = 0;
    }
    fflush(GREATEST_STDOUT);
}

/* greatest's report, then the one extra line `P passed, F failed, S skipped`. */
PDP_TEST__FN void pdp_test__report(void)
{
    struct greatest_run_info *g = &greatest_info;
    FILE *out = GREATEST_STDOUT;
    if (g->list_only) return;
    pdp_test__end_suite();
    PDP_TEST__NOW(g->end);
    GREATEST_FPRINTF(out, "\nTotal: %u test%s", g->tests_run, g->tests_run == 1 ? "" : "s");
    pdp_test__clock_diff(g->begin, g->end);
    GREATEST_FPRINTF(out, ", %u assertion%s\n", g->assertions, g->assertions == 1 ? "" : "s");
    GREATEST_FPRINTF(out, "Pass: %u, fail: %u, skip: %u.\n", g->passed, g->failed, g->skipped);
    GREATEST_FPRINTF(out, "%u passed, %u failed, %u skipped\n", g->passed, g->failed, g->skipped);
    fflush(GREATEST_STDOUT);
}

/* ---- assertion helpers: return 1 when equal, else print Expected/Got and return 0 ---- */

PDP_TEST__FN int pdp_test__in_range(GREATEST_FLOAT exp, GREATEST_FLOAT got, GREATEST_FLOAT tol)
{
    GREATEST_FLOAT diff = exp > got ? exp - got : got - exp;
    FILE *out = GREATEST_STDOUT;
    if (exp == got || diff <= tol) return 1;      /* NaN anywhere fails */
    GREATEST_FPRINTF(out, "\nExpected: " GREATEST_FLOAT_FMT " +/- " GREATEST_FLOAT_FMT
                     "\n     Got: " GREATEST_FLOAT_FMT "\n", exp, tol, got);
    return 0;
}

PDP_TEST__FN int pdp_test__str_eq(const char *exp, const char *got, size_t n, int bounded)
{
    int width = n > 0x7fffffff ? 0x7fffffff : (int)n;
    FILE *out = GREATEST_STDOUT;
    if (exp == got) return 1;
    if (exp != NULL && got != NULL && (bounded ? strncmp(exp, got, n) : strcmp(exp, got)) == 0) {
        return 1;
    }
    if (!bounded) width = 0x7fffffff;
    GREATEST_FPRINTF(out, "\nExpected: %.*s", width, exp != NULL ? exp : "(null)");
    GREATEST_FPRINTF(out, "\n     Got: %.*s\n", width, got != NULL ? got : "(null)");
    return 0;
}

/* One side as a hexdump: 16 bytes a row, X marks a differing row, < a differing byte. */
PDP_TEST__FN void pdp_test__hexdump(const unsigned char *buf, const unsigned char *other,
                                    size_t size)
{
    FILE *out = GREATEST_STDOUT;
    size_t row, i, len;
    for (row = 0; row < size; row += 16) {
        len = size - row < 16 ? size - row : 16;
        GREATEST_FPRINTF(out, "\n%04lx %c ", (unsigned long)row,
                         memcmp(buf + row, other + row, len) != 0 ? 'X' : ' ');
        for (i = row; i < row + len; i++) {
            GREATEST_FPRINTF(out, "%02x%c", buf[i], buf[i] == other[i] ? ' ' : '<');
        }
        for (i = len; i < 16; i++) GREATEST_FPRINTF(out, "   ");
        GREATEST_FPRINTF(out, " ");
        for (i = row; i < row + len; i++) {
            GREATEST_FPRINTF(out, "%c", buf[i] >= 0x20 && buf[i] < 0x7f ? buf[i] : '.');
        }
    }
    GREATEST_FPRINTF(out, "\n");
}

PDP_TEST__FN int pdp_test__mem_eq(const void *exp, const void *got, size_t size)
{
    const unsigned char *e = (const unsigned char *)exp, *g = (const unsigned char *)got;
    FILE *out = GREATEST_STDOUT;
    if (size == 0 || exp == got) return 1;
    if (e != NULL && g != NULL && memcmp(e, g, size) == 0) return 1;
    if (e == NULL || g == NULL) {
        GREATEST_FPRINTF(out, "\nExpected: %s\n     Got: %s\n", e ? "(memory)" : "(null)",
                         g ? "(memory)" : "(null)");
        return 0;
    }
    GREATEST_FPRINTF(out, "\nExpected: ");
    pdp_test__hexdump(e, g, size);
    GREATEST_FPRINTF(out, "\n     Got: ");
    pdp_test__hexdump(g, e, size);
    GREATEST_FPRINTF(out, "\n");
    return 0;
}

PDP_TEST__FN int pdp_test__enum_eq(int exp, int got, greatest_enum_str_fun *name)
{
    FILE *out = GREATEST_STDOUT;
    if (exp == got) return 1;
    GREATEST_FPRINTF(out, "\nExpected: %s", name(exp));
    GREATEST_FPRINTF(out, "\n     Got: %s\n", name(got));
    return 0;
}

/* ---- environment knob for GPU tests ---- */

/* 1 when the environment variable is set to anything but "" or "0". */
PDP_TEST__FN int pdp_test_env_on(const char *var)
{
    const char *v = getenv(var);
    return v != NULL && v[0] != '\0' && strcmp(v, "0") != 0;
}

PDP_TEST__FN const char *pdp_test__required(const char *var, const char *msg)
{
    sprintf(greatest_info.msg_buf, "%.*s (a failure, not a skip: %.64s is set)",
            PDP_TEST_MSG_BUF_SIZE - 120, msg != NULL ? msg : "skipped", var);
    return greatest_info.msg_buf;
}

/* ---- library-mode API and command line ---- */

PDP_TEST__FN int greatest_all_passed(void) { return pdp_test__failed() == 0; }
PDP_TEST__FN void greatest_set_suite_filter(const char *f) { greatest_info.suite_filter = f; }
PDP_TEST__FN void greatest_set_test_filter(const char *f) { greatest_info.test_filter = f; }
PDP_TEST__FN void greatest_set_test_exclude(const char *f) { greatest_info.test_exclude = f; }
PDP_TEST__FN void greatest_set_exact_name_match(void) { greatest_info.exact_match = 1; }
PDP_TEST__FN void greatest_stop_at_first_fail(void) { greatest_info.first_fail = 1; }
PDP_TEST__FN void greatest_list_only(void) { greatest_info.list_only = 1; }
PDP_TEST__FN unsigned int greatest_get_verbosity(void) { return greatest_info.verbosity; }
PDP_TEST__FN void greatest_set_verbosity(unsigned int v) { greatest_info.verbosity = v; }

PDP_TEST__FN void greatest_abort_on_fail(void)
{
    greatest_info.abort_on_fail = 1;
    greatest_info.first_fail = 1;
}

PDP_TEST__FN void greatest_get_report(struct greatest_report_t *report)
{
    const struct greatest_run_info *g = &greatest_info;
    report->passed = g->passed + g->suite.passed;
    report->failed = g->failed + g->suite.failed;
    report->skipped = g->skipped + g->suite.skipped;
    report->assertions = g->assertions;
}

PDP_TEST__FN void pdp_test__usage(const char *prog)
{
    FILE *out = GREATEST_STDOUT;
    GREATEST_FPRINTF(out, "Usage: %s [-hlfavex] [-s SUITE] [-t TEST] [-x EXCLUDE]\n"
                     "  -h, --help  print this help and exit\n"
                     "  -l          list the suites and tests that would run; run nothing\n"
                     "  -f          stop at the first failing test\n"
                     "  -a          abort() at the first failure (implies -f)\n"
                     "  -v          verbose: one line per test (-vv or -v -v counts twice)\n",
                     prog);
    GREATEST_FPRINTF(out,
                     "  -s SUITE    run only suites whose name contains SUITE\n"
                     "  -t TEST     run only tests whose name contains TEST\n"
                     "  -e          -s and -t match whole names exactly\n"
                     "  -x EXCLUDE  leave out tests whose name contains EXCLUDE\n"
                     "  --          stop reading options\n");
}

/* Exits on -h (EXIT_SUCCESS) and on a usage error (EXIT_FAILURE), as greatest does. */
PDP_TEST__FN void pdp_test__parse_options(int argc, char **argv)
{
    struct greatest_run_info *g = &greatest_info;
    const char *prog = argc > 0 && argv[0] != NULL ? argv[0] : "test";
    const char **value;
    int i;
    for (i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (a[0] != '-') continue;
        if (strcmp(a, "--") == 0) break;
        value = NULL;
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            pdp_test__usage(prog);
            exit(EXIT_SUCCESS);
        } else if (strcmp(a, "-l") == 0) {
            greatest_list_only();
        } else if (strcmp(a, "-f") == 0) {
            greatest_stop_at_first_fail();
        } else if (strcmp(a, "-a") == 0) {
            greatest_abort_on_fail();
        } else if (strcmp(a, "-e") == 0) {
            greatest_set_exact_name_match();
        } else if (strcmp(a, "-s") == 0) {
            value = &g->suite_filter;
        } else if (strcmp(a, "-t") == 0) {
            value = &g->test_filter;
        } else if (strcmp(a, "-x") == 0) {
            value = &g->test_exclude;
        } else if (a[1] == 'v' && strspn(a + 1, "v") == strlen(a + 1)) {
            g->verbosity += (unsigned int)strlen(a + 1);
        } else {
            GREATEST_FPRINTF(GREATEST_STDOUT, "Unknown argument '%s'\n", a);
            pdp_test__usage(prog);
            exit(EXIT_FAILURE);
        }
        if (value != NULL) {
            if (i + 1 >= argc) {
                pdp_test__usage(prog);
                exit(EXIT_FAILURE);
            }
            *value = argv[++i];
        }
    }
}

/* ---- short names ---- */

#if GREATEST_USE_ABBREVS
#define TEST GREATEST_TEST
#define SUITE GREATEST_SUITE
#define SUITE_EXTERN GREATEST_SUITE_EXTERN
#define RUN_TEST GREATEST_RUN_TEST
#define RUN_TEST1 GREATEST_RUN_TEST1
#define RUN_SUITE GREATEST_RUN_SUITE
#define IGNORE_TEST GREATEST_IGNORE_TEST
#define CHECK_CALL GREATEST_CHECK_CALL
#define SET_SETUP GREATEST_SET_SETUP_CB
#define SET_TEARDOWN GREATEST_SET_TEARDOWN_CB
#define PASS GREATEST_PASS
#define FAIL GREATEST_FAIL
#define SKIP GREATEST_SKIP
#define PASSm GREATEST_PASSm
#define FAILm GREATEST_FAILm
#define SKIPm GREATEST_SKIPm
#define ASSERT GREATEST_ASSERT
#define ASSERTm GREATEST_ASSERTm
#define ASSERT_FALSE GREATEST_ASSERT_FALSE
#define ASSERT_FALSEm GREATEST_ASSERT_FALSEm
#define ASSERT_EQ GREATEST_ASSERT_EQ
#define ASSERT_EQm GREATEST_ASSERT_EQm
#define ASSERT_NEQ GREATEST_ASSERT_NEQ
#define ASSERT_NEQm GREATEST_ASSERT_NEQm
#define ASSERT_GT GREATEST_ASSERT_GT
#define ASSERT_GTm GREATEST_ASSERT_GTm
#define ASSERT_GTE GREATEST_ASSERT_GTE
#define ASSERT_GTEm GREATEST_ASSERT_GTEm
#define ASSERT_LT GREATEST_ASSERT_LT
#define ASSERT_LTm GREATEST_ASSERT_LTm
#define ASSERT_LTE GREATEST_ASSERT_LTE
#define ASSERT_LTEm GREATEST_ASSERT_LTEm
#define ASSERT_EQ_FMT GREATEST_ASSERT_EQ_FMT
#define ASSERT_EQ_FMTm GREATEST_ASSERT_EQ_FMTm
#define ASSERT_IN_RANGE GREATEST_ASSERT_IN_RANGE
#define ASSERT_IN_RANGEm GREATEST_ASSERT_IN_RANGEm
#define ASSERT_STR_EQ GREATEST_ASSERT_STR_EQ
#define ASSERT_STR_EQm GREATEST_ASSERT_STR_EQm
#define ASSERT_STRN_EQ GREATEST_ASSERT_STRN_EQ
#define ASSERT_STRN_EQm GREATEST_ASSERT_STRN_EQm
#define ASSERT_MEM_EQ GREATEST_ASSERT_MEM_EQ
#define ASSERT_MEM_EQm GREATEST_ASSERT_MEM_EQm
#define ASSERT_ENUM_EQ GREATEST_ASSERT_ENUM_EQ
#define ASSERT_ENUM_EQm GREATEST_ASSERT_ENUM_EQm
#define SKIP_NO_CUDA PDP_TEST_SKIP_NO_CUDA
#define SKIP_NO_CUDAm PDP_TEST_SKIP_NO_CUDAm
#if defined(__cplusplus) || (defined(__STDC_VERSION__) && __STDC_VERSION__ >= 199901L)
#define RUN_TESTp GREATEST_RUN_TESTp
#endif
#endif

/* ---- pdp's own helper, not greatest's: a Python for the interop tests ----
 * pdp_test_python(modules): the first of $PDP_PYTHON, the PATH's python3 and /usr/bin/python3
 * that has every module in `modules` (an import list, "numpy, safetensors.numpy"), to be
 * run as `"<it>" -c ...`; NULL when none does. The PATH's python3 may lack numpy while the
 * system's has it: tests that took the first python3 skipped there. "Has" is
 * importlib.util.find_spec, which finds a module (importing its parent packages) without
 * running it: importing torch to ask took 0.9 s of CPU, and the test's own script imports it
 * again (a module found that does not import fails that test, by its script's output). Found
 * once per list (8 lists cached). pdp_test_python_missing(modules) is the skip message naming
 * what was tried. system() runs a shell: POSIX hosts only (so do the tests that call it). */
PDP_TEST__FN const char *pdp_test_python_candidate(int i)
{
    const char *env = getenv("PDP_PYTHON");
    if (env && *env) {
        if (i == 0) return env;
        i--;
    }
    return i == 0 ? "python3" : i == 1 ? "/usr/bin/python3" : NULL;
}

PDP_TEST__FN const char *pdp_test_python(const char *modules)
{
    static struct { char modules[128]; const char *python; } cache[8];
    static int cached;
    char cmd[512];
    const char *py;
    int i;
    for (i = 0; i < cached; i++)
        if (strcmp(cache[i].modules, modules) == 0) return cache[i].python;
    for (i = 0; (py = pdp_test_python_candidate(i)) != NULL; i++) {
        if (strlen(py) + strlen(modules) + 160 > sizeof cmd) continue;
        sprintf(cmd, "\"%s\" -c 'import importlib.util as u; raise SystemExit(not all("
                     "u.find_spec(m.strip()) for m in \"%s\".split(\",\")))' > /dev/null 2>&1",
                py, modules);
        if (system(cmd) == 0) break;
    }
    if (cached < 8 && strlen(modules) < sizeof cache[0].modules) {
        strcpy(cache[cached].modules, modules);
        cache[cached++].python = py;
    }
    return py;
}

PDP_TEST__FN const char *pdp_test_python_missing(const char *modules)
{
    static char why[512];
    const char *env = getenv("PDP_PYTHON");
    sprintf(why, "no Python imports %.100s (tried %s%.200s%spython3 on the PATH, "
            "/usr/bin/python3; set PDP_PYTHON to one that does)", modules,
            env && *env ? "$PDP_PYTHON=" : "", env && *env ? env : "", env && *env ? ", " : "");
    return why;
}

#endif /* PDP_TEST_H_INCLUDED */

/* Licence: MIT, the same text as pdp's LICENSE file (Copyright (c) 2026 the pdp authors). */
