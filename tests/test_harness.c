/* test_harness.c - proves tests/pdp_test.h can fail, counts right and reads its command line.
 *
 * One binary, two roles. Run normally, it is an ordinary test program. Run with
 * PDP_TEST_HARNESS_INNER=<scenario> in the environment, it runs a deliberately failing "inner"
 * program instead. The outer tests re-run argv[0] through popen() with that variable and some
 * flags, capture stdout and stderr, and check the lines and the exit status. argv[0] must be
 * a path (./build/test_harness), not a name looked up in PATH.
 *
 *     cc -std=c99 -Wall -Wextra -pedantic -Werror -Itests tests/test_harness.c -o test_harness
 *     ./test_harness            ./test_harness -v -t harness_filter
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifndef _WIN32
#include <sys/wait.h>
#endif

#include "pdp_test.h"
#include "test_platform.h"

/* ---- the inner program: scenarios that fail on purpose ---- */

enum color { COLOR_RED, COLOR_BLUE };

static const char *color_name(int c)
{
    return c == COLOR_RED ? "COLOR_RED" : c == COLOR_BLUE ? "COLOR_BLUE" : "?";
}

static int two(void) { return 2; }

TEST inner_pass(void) { ASSERT(two() == 2); PASS(); }
TEST inner_fail(void) { ASSERT_EQ_FMT(1, two(), "%d"); PASS(); }
TEST inner_skip(void) { SKIPm("not today"); }
TEST inner_other_pass(void) { PASS(); }
TEST inner_needs_cuda(void) { SKIP_NO_CUDA(); }

SUITE(inner_basic)
{
    RUN_TEST(inner_pass);
    RUN_TEST(inner_fail);
    RUN_TEST(inner_skip);
}

SUITE(inner_other) { RUN_TEST(inner_other_pass); }
SUITE(inner_cuda) { RUN_TEST(inner_needs_cuda); }

SUITE(inner_suffix)
{
    greatest_set_test_suffix("7");
    RUN_TEST(inner_pass);
    RUN_TEST(inner_skip);    /* the suffix applies to one RUN_TEST only */
}

static enum greatest_test_res helper_fails(void) { ASSERT_EQm("helper", 1, two()); PASS(); }

TEST fail_assert(void) { ASSERT(1 == two()); PASS(); }
TEST fail_false(void) { ASSERT_FALSE(two() == 2); PASS(); }
TEST fail_eq(void) { ASSERT_EQ(1, two()); PASS(); }
TEST fail_neq(void) { ASSERT_NEQ(2, two()); PASS(); }
TEST fail_gt(void) { ASSERT_GT(1, two()); PASS(); }
TEST fail_gte(void) { ASSERT_GTE(1, two()); PASS(); }
TEST fail_lt(void) { ASSERT_LT(3, two()); PASS(); }
TEST fail_lte(void) { ASSERT_LTE(3, two()); PASS(); }
TEST fail_in_range(void) { ASSERT_IN_RANGE(1.0, 1.5, 0.25); PASS(); }
TEST fail_nan(void) { ASSERT_IN_RANGEm("nan", 0.0, strtod("nan", NULL), 1e9); PASS(); }
TEST fail_str_eq(void) { ASSERT_STR_EQ("abc", "abd"); PASS(); }
TEST fail_strn_eq(void) { ASSERT_STRN_EQ("abcx", "abdx", 3); PASS(); }
TEST fail_mem_eq(void) { ASSERT_MEM_EQ("abc", "abd", 3); PASS(); }
TEST fail_enum_eq(void) { ASSERT_ENUM_EQ(COLOR_RED, COLOR_BLUE, color_name); PASS(); }
TEST fail_assertm(void) { ASSERTm("custom assert", two() == 3); PASS(); }
TEST fail_failm(void) { FAILm("custom message"); }
TEST fail_fail(void) { FAIL(); }
TEST fail_check_call(void) { CHECK_CALL(helper_fails()); PASS(); }

SUITE(inner_asserts)
{
    RUN_TEST(fail_assert);
    RUN_TEST(fail_false);
    RUN_TEST(fail_eq);
    RUN_TEST(fail_neq);
    RUN_TEST(fail_gt);
    RUN_TEST(fail_gte);
    RUN_TEST(fail_lt);
    RUN_TEST(fail_lte);
    RUN_TEST(fail_in_range);
    RUN_TEST(fail_nan);
    RUN_TEST(fail_str_eq);
    RUN_TEST(fail_strn_eq);
    RUN_TEST(fail_mem_eq);
    RUN_TEST(fail_enum_eq);
    RUN_TEST(fail_assertm);
    RUN_TEST(fail_failm);
    RUN_TEST(fail_fail);
    RUN_TEST(fail_check_call);
}

static int hook_setups, hook_teardowns;

static void hook_setup(void *udata)
{
    (void)udata;
    printf("setup %d\n", ++hook_setups);
}

static void hook_teardown(void *udata)
{
    int *count = (int *)udata;
    printf("teardown %d\n", ++*count);
}

TEST hooked_fail(void) { FAILm("hooked failure"); }
TEST hooked_nested(void) { RUN_TEST(inner_pass); PASS(); }

SUITE(inner_hooks)
{
    SET_SETUP(hook_setup, NULL);
    SET_TEARDOWN(hook_teardown, &hook_teardowns);
    RUN_TEST(hooked_fail);
    RUN_TEST(hooked_nested);
}

SUITE(inner_hooks_cleared) { RUN_TEST(inner_pass); }

/* Messages whose memory is gone by the time the result line prints (after the teardown): the
 * harness must have copied them. A kept pointer would print the teardown's scribble. */
static char scratch_msg[64];
static char *heap_msg;

static void scribble_teardown(void *udata)
{
    (void)udata;
    strcpy(scratch_msg, "scribbled by teardown");
    if (heap_msg != NULL) {
        memset(heap_msg, 'x', strlen(heap_msg));
        free(heap_msg);
        heap_msg = NULL;
    }
}

TEST msg_rewritten_fail(void)
{
    strcpy(scratch_msg, "the original failure");
    FAILm(scratch_msg);
}

TEST msg_rewritten_assert(void)
{
    strcpy(scratch_msg, "the original assertion");
    ASSERTm(scratch_msg, two() == 3);
    PASS();
}

TEST msg_freed_skip(void)
{
    heap_msg = (char *)malloc(32);
    if (heap_msg == NULL) FAILm("out of memory");
    strcpy(heap_msg, "the freed skip");
    SKIPm(heap_msg);
}

TEST msg_too_long(void)
{
    static char longmsg[3000];
    memset(longmsg, 'y', sizeof longmsg - 1);
    longmsg[sizeof longmsg - 1] = '\0';
    FAILm(longmsg);
}

SUITE(inner_messages)
{
    SET_TEARDOWN(scribble_teardown, NULL);
    RUN_TEST(msg_rewritten_fail);
    RUN_TEST(msg_rewritten_assert);
    RUN_TEST(msg_freed_skip);
    RUN_TEST(msg_too_long);
}

static void run_inner(const char *scenario)
{
    if (strcmp(scenario, "basic") == 0) {
        RUN_SUITE(inner_basic);
        RUN_SUITE(inner_other);
    } else if (strcmp(scenario, "asserts") == 0) {
        RUN_SUITE(inner_asserts);
    } else if (strcmp(scenario, "cuda") == 0) {
        RUN_SUITE(inner_cuda);
    } else if (strcmp(scenario, "suffix") == 0) {
        RUN_SUITE(inner_suffix);
    } else if (strcmp(scenario, "messages") == 0) {
        RUN_SUITE(inner_messages);
    } else if (strcmp(scenario, "hooks") == 0) {
        RUN_SUITE(inner_hooks);
        RUN_SUITE(inner_hooks_cleared);
    } else {
        fprintf(stderr, "unknown scenario '%s'\n", scenario);
        exit(2);
    }
}

/* ---- the outer program: run the inner one and read what it printed ---- */

static const char *self_path;
static char out[32768];    /* the last inner run's stdout and stderr */
static char last[256];     /* its last non-empty line */

/* Runs `ENV PDP_TEST_HARNESS_INNER=scenario argv[0] args 2>&1`; returns its exit status
 * (128 + signal when killed), or -1 when it could not be started. */
static int inner(const char *env, const char *scenario, const char *args)
{
    char cmd[4096];
    size_t n = 0, got, end;
    const char *p, *start;
    FILE *f;
    int status;
#ifdef _WIN32
    /* cmd.exe runs the line, "VAR=value prog" it has not: the variables go through this
       process's environment, which the child inherits, and out again; the outer quotes
       are the pair cmd.exe /c takes off */
    char self[MAX_PATH], name[128] = "";
    const char *eq = strchr(env, '=');
    (void)p;
    if (!GetModuleFileNameA(NULL, self, sizeof self)) return -1;
    if (strlen(self) + strlen(args) > sizeof cmd - 16) return -1;
    sprintf(cmd, "\"\"%s\" %s 2>&1\"", self, args);
    if (eq && (size_t)(eq - env) < sizeof name) {
        memcpy(name, env, (size_t)(eq - env));
        name[eq - env] = '\0';
        setenv(name, eq + 1, 1);
    }
    setenv("PDP_TEST_HARNESS_INNER", scenario, 1);
    out[0] = last[0] = '\0';
    f = popen(cmd, "r");
    unsetenv("PDP_TEST_HARNESS_INNER");
    if (name[0]) unsetenv(name);
    if (f == NULL) return -1;
#else
    const char *emu = getenv("PDP_TEST_EXEC"); /* an emulator to run it (make cross-test) */
    n += (size_t)sprintf(cmd, "%s PDP_TEST_HARNESS_INNER=%s %s '", env, scenario, emu ? emu : "");
    for (p = self_path; *p != '\0' && n < sizeof cmd - 64; p++) {
        if (*p == '\'') n += (size_t)sprintf(cmd + n, "'\\''");
        else cmd[n++] = *p;
    }
    if (strlen(args) > sizeof cmd - n - 16) return -1;
    sprintf(cmd + n, "' %s 2>&1", args);
    out[0] = last[0] = '\0';
    if ((f = popen(cmd, "r")) == NULL) return -1;
#endif
    n = 0;
    while (n < sizeof out - 1 && (got = fread(out + n, 1, sizeof out - 1 - n, f)) > 0) n += got;
    out[n] = '\0';
    status = pclose(f);
    for (end = n; end > 0 && out[end - 1] == '\n'; end--) {
    }
    for (start = out + end; start > out && start[-1] != '\n'; start--) {
    }
    n = (size_t)(out + end - start) < sizeof last - 1 ? (size_t)(out + end - start) : 0;
    memcpy(last, start, n);
    last[n] = '\0';
    if (status == -1) return -1;
#ifdef _WIN32
    return status; /* the exit code cmd.exe passes on */
#else
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
#endif
}

/* 1 when the last inner output contains `needle`; else shows that output and returns 0. */
static int has(const char *needle)
{
    if (strstr(out, needle) != NULL) return 1;
    printf("\n---- inner output lacks [%s]:\n%s---- end of inner output\n", needle, out);
    return 0;
}

#define ASSERT_HAS(NEEDLE) ASSERTm("inner output lacks " #NEEDLE, has(NEEDLE))
#define ASSERT_LACKS(NEEDLE) ASSERTm("inner output has " #NEEDLE, strstr(out, NEEDLE) == NULL)

TEST harness_failure_is_reported_and_exits_nonzero(void)
{
    ASSERT_NEQ(0, inner("", "basic", ""));
    ASSERT_HAS("\n* Suite inner_basic:\n.\nExpected: 1\n     Got: 2\n"
               "F\nFAIL inner_fail: 1 != two() (");
    ASSERT_HAS("test_harness.c:");
    ASSERT_HAS("s\n3 tests - 1 passed, 1 failed, 1 skipped (");
    ASSERT_HAS("\n* Suite inner_other:\n.\n1 test - 1 passed, 0 failed, 0 skipped (");
    ASSERT_HAS("\nTotal: 4 tests (");
    ASSERT_HAS(" sec), 2 assertions\nPass: 2, fail: 1, skip: 1.\n");
    ASSERT_STR_EQ("2 passed, 1 failed, 1 skipped", last);
    PASS();
}

TEST harness_test_filter_selects_by_substring(void)
{
    ASSERT_EQ(0, inner("", "basic", "-t inner_pass"));
    ASSERT_STR_EQ("1 passed, 0 failed, 0 skipped", last);
    ASSERT_EQ(0, inner("", "basic", "-t pass"));
    ASSERT_STR_EQ("2 passed, 0 failed, 0 skipped", last);
    ASSERT_HAS("\n* Suite inner_basic:\n");     /* a suite that runs nothing keeps its header */
    ASSERT_EQ(0, inner("", "basic", "-e -t inner_pass"));
    ASSERT_STR_EQ("1 passed, 0 failed, 0 skipped", last);
    ASSERT_EQ(0, inner("", "basic", "-e -t inner"));
    ASSERT_STR_EQ("0 passed, 0 failed, 0 skipped", last);
    ASSERT_HAS("\nTotal: 0 tests (");
    PASS();
}

TEST harness_exclude_and_suite_filter(void)
{
    ASSERT_EQ(0, inner("", "basic", "-x fail"));
    ASSERT_STR_EQ("2 passed, 0 failed, 1 skipped", last);
    ASSERT_EQ(0, inner("", "basic", "-t inner_fail -x fail"));    /* exclusion wins */
    ASSERT_STR_EQ("0 passed, 0 failed, 0 skipped", last);
    ASSERT_EQ(0, inner("", "basic", "-s other"));
    ASSERT_STR_EQ("1 passed, 0 failed, 0 skipped", last);
    ASSERT_LACKS("inner_basic");
    ASSERT_NEQ(0, inner("", "basic", "-s basic"));
    ASSERT_LACKS("inner_other");
    PASS();
}

TEST harness_skip_is_counted_and_passes(void)
{
    ASSERT_EQ(0, inner("", "basic", "-v -t skip"));
    ASSERT_HAS("\nSKIP inner_skip: not today (");
    ASSERT_HAS(" ticks, ");
    ASSERT_STR_EQ("0 passed, 0 failed, 1 skipped", last);
    PASS();
}

TEST harness_verbose_prints_one_line_per_test(void)
{
    ASSERT_NEQ(0, inner("", "basic", "-v"));
    ASSERT_HAS("\n* Suite inner_basic:\nPASS inner_pass:  (");
    ASSERT_HAS("\nExpected: 1\n     Got: 2\nFAIL inner_fail: 1 != two() (");
    ASSERT_HAS("\n\n3 tests - 1 passed, 1 failed, 1 skipped (");
    ASSERT_NEQ(0, inner("", "basic", "-vv"));
    ASSERT_HAS("PASS inner_pass:  (");
    PASS();
}

TEST harness_first_fail_stops_the_run(void)
{
    ASSERT_NEQ(0, inner("", "basic", "-f"));
    ASSERT_STR_EQ("1 passed, 1 failed, 0 skipped", last);
    ASSERT_LACKS("inner_other");
    PASS();
}

TEST harness_abort_on_fail_dies(void)
{
    int rc = inner("", "basic", "-a");
    ASSERT(rc != 0 && rc != 1);
    ASSERT_LACKS(" passed, ");
    PASS();
}

TEST harness_list_only_runs_nothing(void)
{
    ASSERT_EQ(0, inner("", "basic", "-l"));
    ASSERT_HAS("\n* Suite inner_basic:\n  inner_pass\n  inner_fail\n  inner_skip\n");
    ASSERT_HAS("\n* Suite inner_other:\n  inner_other_pass\n");
    ASSERT_LACKS("passed");
    ASSERT_LACKS("Total:");
    ASSERT_EQ(0, inner("", "basic", "-l -t fail"));
    ASSERT_STR_EQ("* Suite inner_other:", last);
    PASS();
}

TEST harness_usage_and_bad_arguments(void)
{
    ASSERT_EQ(0, inner("", "basic", "-h"));
    ASSERT_HAS("Usage: ");
    ASSERT_HAS(" [-hlfavex] [-s SUITE] [-t TEST] [-x EXCLUDE]\n");
    ASSERT_LACKS("passed");
    ASSERT_EQ(0, inner("", "basic", "--help"));
    ASSERT_NEQ(0, inner("", "basic", "--helpme"));
    ASSERT_HAS("Unknown argument '--helpme'");
    ASSERT_NEQ(0, inner("", "basic", "-z"));
    ASSERT_HAS("Unknown argument '-z'\nUsage: ");
    ASSERT_NEQ(0, inner("", "basic", "-fv"));
    ASSERT_HAS("Unknown argument '-fv'");
    ASSERT_NEQ(0, inner("", "basic", "-t"));
    ASSERT_HAS("Usage: ");
    ASSERT_LACKS("* Suite");
    ASSERT_EQ(0, inner("", "basic", "-t inner_pass -- -z"));    /* -- ends the options */
    ASSERT_EQ(0, inner("", "basic", "words -t inner_pass"));    /* non-options are ignored */
    PASS();
}

TEST harness_assertions_fail_with_greatest_messages(void)
{
    ASSERT_NEQ(0, inner("", "asserts", "-v"));
    ASSERT_HAS("\nFAIL fail_assert: 1 == two() (");
    ASSERT_HAS("\nFAIL fail_false: two() == 2 (");
    ASSERT_HAS("\nFAIL fail_eq: 1 != two() (");
    ASSERT_HAS("\nFAIL fail_neq: 2 == two() (");
    ASSERT_HAS("\nFAIL fail_gt: 1 <= two() (");
    ASSERT_HAS("\nFAIL fail_gte: 1 < two() (");
    ASSERT_HAS("\nFAIL fail_lt: 3 >= two() (");
    ASSERT_HAS("\nFAIL fail_lte: 3 > two() (");
    ASSERT_HAS("\nExpected: 1 +/- 0.25\n     Got: 1.5\nFAIL fail_in_range: 1.0 != 1.5 +/- 0.25 (");
    ASSERT_HAS("\nFAIL fail_nan: nan (");
    ASSERT_HAS("\nExpected: abc\n     Got: abd\nFAIL fail_str_eq: \"abc\" != \"abd\" (");
    ASSERT_HAS("\nExpected: abc\n     Got: abd\nFAIL fail_strn_eq: \"abcx\" != \"abdx\" (");
    ASSERT_HAS("\nExpected: \n0000 X 61 62 63< ");
    ASSERT_HAS(" abc\n\n     Got: \n0000 X 61 62 64< ");
    ASSERT_HAS("\nFAIL fail_mem_eq: \"abc\" != \"abd\" (");
    ASSERT_HAS("\nExpected: COLOR_RED\n     Got: COLOR_BLUE\n"
               "FAIL fail_enum_eq: COLOR_RED != COLOR_BLUE (");
    ASSERT_HAS("\nFAIL fail_assertm: custom assert (");
    ASSERT_HAS("\nFAIL fail_failm: custom message (");
    ASSERT_HAS("\nFAIL fail_fail:  (");
    ASSERT_HAS("\nFAIL fail_check_call: helper (");
    ASSERT_HAS(" sec), 16 assertions\nPass: 0, fail: 18, skip: 0.\n");
    ASSERT_STR_EQ("0 passed, 18 failed, 0 skipped", last);
    PASS();
}

TEST harness_require_cuda_turns_skip_into_failure(void)
{
    ASSERT_EQ(0, inner("PDP_TEST_REQUIRE_CUDA=0", "cuda", "-v"));
    ASSERT_HAS("SKIP inner_needs_cuda: no CUDA device (");
    ASSERT_STR_EQ("0 passed, 0 failed, 1 skipped", last);
    ASSERT_NEQ(0, inner("PDP_TEST_REQUIRE_CUDA=1", "cuda", ""));
    ASSERT_HAS("FAIL inner_needs_cuda: no CUDA device (a failure, not a skip: "
               "PDP_TEST_REQUIRE_CUDA is set) (");
    ASSERT_STR_EQ("0 passed, 1 failed, 0 skipped", last);
    PASS();
}

TEST harness_hooks_run_around_failures_and_are_cleared(void)
{
    ASSERT_NEQ(0, inner("", "hooks", ""));
    ASSERT_HAS("setup 1\nteardown 1\nF\nFAIL hooked_fail: hooked failure (");
    ASSERT_HAS("setup 2\n");
    ASSERT_HAS("teardown 2\n");
    ASSERT_LACKS("setup 3");
    ASSERT_HAS("Error: Test run inside another test.\n");
    ASSERT_STR_EQ("2 passed, 1 failed, 0 skipped", last);
    PASS();
}

TEST harness_suffix_names_one_test(void)
{
    ASSERT_EQ(0, inner("", "suffix", "-v"));
    ASSERT_HAS("\nPASS inner_pass_7:  (");
    ASSERT_HAS("\nSKIP inner_skip: not today (");
    ASSERT_EQ(0, inner("", "suffix", "-t _7"));
    ASSERT_STR_EQ("1 passed, 0 failed, 0 skipped", last);
    PASS();
}

TEST harness_copies_the_message(void)
{
    static char cut[1100];
    ASSERT_NEQ(0, inner("", "messages", "-v"));
    ASSERT_HAS("\nFAIL msg_rewritten_fail: the original failure (");
    ASSERT_HAS("\nFAIL msg_rewritten_assert: the original assertion (");
    ASSERT_HAS("\nSKIP msg_freed_skip: the freed skip (");
    ASSERT_LACKS("scribbled");
    ASSERT_LACKS("xxxx");
    memset(cut, 'y', 1020);                     /* 1023 bytes in all: 1020 of it, then ... */
    strcpy(cut + 1020, "... (");
    ASSERT_HAS("\nFAIL msg_too_long: ");
    ASSERT_HAS(cut);
    cut[1020] = 'y';                            /* and no more of it */
    cut[1021] = '\0';
    ASSERT_LACKS(cut);
    ASSERT_STR_EQ("0 passed, 3 failed, 1 skipped", last);
    PASS();
}

SUITE(harness_selftest)
{
    RUN_TEST(harness_failure_is_reported_and_exits_nonzero);
    RUN_TEST(harness_test_filter_selects_by_substring);
    RUN_TEST(harness_exclude_and_suite_filter);
    RUN_TEST(harness_skip_is_counted_and_passes);
    RUN_TEST(harness_verbose_prints_one_line_per_test);
    RUN_TEST(harness_first_fail_stops_the_run);
    RUN_TEST(harness_abort_on_fail_dies);
    RUN_TEST(harness_list_only_runs_nothing);
    RUN_TEST(harness_usage_and_bad_arguments);
    RUN_TEST(harness_assertions_fail_with_greatest_messages);
    RUN_TEST(harness_require_cuda_turns_skip_into_failure);
    RUN_TEST(harness_hooks_run_around_failures_and_are_cleared);
    RUN_TEST(harness_suffix_names_one_test);
    RUN_TEST(harness_copies_the_message);
}

/* ---- in-process: every assertion passes when it should ---- */

struct hook_count {
    int setups;
};

static void count_setup(void *udata) { ((struct hook_count *)udata)->setups++; }

static enum greatest_test_res helper_passes(int x) { ASSERT_EQ(2, x); PASS(); }

TEST harness_assertions_pass(void)
{
    unsigned char a[20], b[20];
    memset(a, 7, sizeof a);
    memcpy(b, a, sizeof b);
    ASSERT(1);
    ASSERT_FALSE(0);
    ASSERT_EQ(2, two());
    ASSERT_NEQ(3, two());
    ASSERT_GT(3, two());
    ASSERT_GTE(2, two());
    ASSERT_LT(1, two());
    ASSERT_LTE(2, two());
    ASSERT_EQ_FMT(2, two(), "%d");
    ASSERT_IN_RANGE(1.0, 1.0 + 1e-9, 1e-6);
    ASSERT_IN_RANGE(1.0f, 1.0f, 0);
    ASSERT_IN_RANGE(strtod("inf", NULL), strtod("inf", NULL), 0.0);
    ASSERT_STR_EQ("0.weight", "0.weight");
    ASSERT_STRN_EQ("0.weight", "0.bias", 2);
    ASSERT_MEM_EQ(a, b, sizeof a);
    ASSERT_MEM_EQ(NULL, NULL, 0);
    ASSERT_ENUM_EQ(COLOR_BLUE, COLOR_BLUE, color_name);
    ASSERTm("message form", two() == 2);
    ASSERT_EQm("message form", 2, two());
    CHECK_CALL(helper_passes(two()));
    PASSm("every assertion held");
}

TEST harness_setup_ran_before_test(void *arg)
{
    ASSERT_EQ(1, ((struct hook_count *)arg)->setups);
    PASS();
}

TEST harness_takes_arguments(int a, const char *b)
{
    ASSERT_EQ(2, a);
    ASSERT_STR_EQ("b", b);
    PASS();
}

TEST harness_report_counts_so_far(void)
{
    struct greatest_report_t r;
    greatest_get_report(&r);
    ASSERT_GT(r.assertions, 0u);
    ASSERT_EQ(0u, r.failed);
    PASS();
}

TEST harness_never_run(void) { FAILm("IGNORE_TEST must not run this"); }

SUITE(harness_in_process)
{
    static struct hook_count hooks;
    hooks.setups = 0;
    SET_SETUP(count_setup, &hooks);
    RUN_TEST1(harness_setup_ran_before_test, &hooks);
    SET_SETUP(NULL, NULL);
    RUN_TEST(harness_assertions_pass);
    RUN_TESTp(harness_takes_arguments, 2, "b");
    RUN_TEST(harness_report_counts_so_far);
    IGNORE_TEST(harness_never_run);
}

GREATEST_MAIN_DEFS();

int main(int argc, char **argv)
{
    const char *scenario = getenv("PDP_TEST_HARNESS_INNER");
    self_path = argv[0];
    GREATEST_MAIN_BEGIN();
    if (scenario != NULL && scenario[0] != '\0') {
        run_inner(scenario);
    } else {
        RUN_SUITE(harness_in_process);
        RUN_SUITE(harness_selftest);
    }
    GREATEST_MAIN_END();
}
