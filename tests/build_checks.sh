# build_checks.sh: what the build tests (tests/test_build*.sh) share, sourced by each.
# Every script runs from the repository root with its own scratch folder $B
# (build/buildtest/<script>) and prints one line per check, "ok   NAME",
# "FAIL NAME" (with the end of its log) or "skip NAME (REASON)", then the summary
# line tests/run_all.sh reads: "P passed, F failed, S skipped". The checks are cut
# into scripts so that make runs them side by side: test_build.sh (the
# generator and the compilers), test_build_options.sh (PDP_STATIC, allocation
# overrides, misuse that must not compile, option macros), test_build_alone.sh
# (each example and the README's quick start, as a user builds them),
# test_build_cxx.sh (the implementation as C++ and by nvcc, include order, clang
# -Weverything), test_build_docs.sh (the manual against the code: its reading map,
# names, snippets).
#
# Most checks are compiles of the whole implementation (a second or more each), independent
# of one another, so `check` runs them in the background, $JOBS at a time (one per core):
# a script then takes about its longest compile, not the sum of them.
#   check NAME CMD...      runs CMD in the background, its output in $B/NAME.log;
#                          NAME passes when CMD exits 0
#   check NAME must_fail WANT CMD...   passes when CMD fails and its output holds WANT
#   checks_wait            waits for every check started and prints their results, in the
#                          order they were started; call it before a step that reads what
#                          an earlier check wrote (summary calls it last)
#   ok NAME, bad NAME [LOG], skip NAME REASON   report a result at once (inline checks)
#   trains PROG            runs the README's quick start built as PROG: it exits 0 (it trained
#                          at least one step) and prints its last batch loss
#   short_readme IN OUT    the quick start IN on 6432 samples instead of 60000, into OUT
# CMD may be a shell function of the script: it sees the script's variables.
cd "$(dirname "$0")/.." || exit 1
B=${B:-build}/buildtest/$(basename "$0" .sh)
rm -rf "$B" && mkdir -p "$B/done"  # done/NAME: a finished check's exit status
STRICT="-std=c99 -Wall -Wextra -pedantic -Werror -I."
# The checks whose subject is not the compiler (a build option, an include order, a program's
# output) use clang where it is installed: it parses the implementation in a quarter of gcc's
# time (0.3 s of CPU to 1.2, -fsyntax-only; 0.3 to 2.4 for an object at -O0). gcc's warnings on
# the same code are those of make test's gcc builds (strict C99, -Werror: the implementation
# object, the tests that compile it themselves with PDP_STATIC and their own PDP_MALLOC) and
# of the checks named for gcc.
FAST_CC=$(command -v clang > /dev/null && echo clang || echo gcc)
JOBS=$(nproc 2>/dev/null || echo 2)  # checks at once
p=0; f=0; s=0
started=""  # the checks started since the last checks_wait, in order
ok()   { echo "ok   $1"; p=$((p + 1)); }
bad()  { echo "FAIL $1"; [ -f "${2:-$B/log}" ] && tail -n 15 "${2:-$B/log}"; f=$((f + 1)); }
skip() { echo "skip $1 ($2)"; s=$((s + 1)); }
running() { n=0; for c in $started; do [ -f "$B/done/$c" ] || n=$((n + 1)); done; echo $n; }
check() {
    while [ "$(running)" -ge "$JOBS" ]; do sleep 0.1; done
    name=$1; shift
    ( "$@" > "$B/$name.log" 2>&1; echo $? > "$B/done/$name" ) &
    started="$started $name"
}
checks_wait() {
    wait
    for c in $started; do
        if [ "$(cat "$B/done/$c")" = 0 ]; then ok "$c"; else bad "$c" "$B/$c.log"; fi
    done
    started=""
}
must_fail() { # must_fail WANT CMD...: CMD fails, and its output holds WANT
    want=$1; shift
    if "$@" > "$B/$name.out" 2>&1; then echo "compiled, must not"; return 1; fi
    cat "$B/$name.out"
    grep -q "$want" "$B/$name.out" || { echo "no \"$want\" in the error"; return 1; }
}
trains() { # trains PROG: the README's quick start ran to its end (its exit status: steps > 0)
    "$1" > "$1.out" 2>&1; rc=$?
    cat "$1.out"; [ $rc -eq 0 ] && grep -q 'last batch loss' "$1.out"
}
# short_readme IN OUT: the README's quick start (C or C++) on a synthetic dataset of 6432
# samples (pdp_dataset_desc.max_samples) instead of 60000: 101 steps, the last a partial batch of 32, where one epoch of the 60000 was 938
# steps (2.4 s of CPU in C at -O2 -march=native, 6.7 s in C++ without -march). The one line
# added sets max_samples beside the desc's .flat; a README whose quick start no longer sets
# .flat fails here, by name.
short_readme() {
    sed 's/{\.flat = true}/{.flat = true, .max_samples = 6432}/; s/dd\.flat = true;/dd.flat = true;  dd.max_samples = 6432;/' "$1" > "$2"
    grep -q 'max_samples = 6432' "$2" || { echo "short_readme: no .flat = true in $1 (the README's quick start changed: update short_readme)"; return 1; }
}
summary() { checks_wait; echo "$p passed, $f failed, $s skipped"; [ $f -eq 0 ]; }
