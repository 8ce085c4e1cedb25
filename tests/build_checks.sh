# build_checks.sh: what the build tests (tests/test_build*.sh) share, sourced by each.
# Every script runs from the repository root with its own scratch folder $B
# (build/buildtest/<script>) and prints one line per check, "ok   NAME",
# "FAIL NAME" (with the end of its log) or "skip NAME (REASON)", then the summary
# line tests/run_all.sh reads: "P passed, F failed, S skipped". The checks are cut
# into scripts so that make runs them side by side: test_build.sh (the
# generator and the compilers), test_build_options.sh (PDP_STATIC, allocation
# overrides, misuse that must not compile, option macros), test_build_alone.sh
# (each example and the README's quick start, as a user builds them),
# test_build_docs.sh (the manual against the code: its reading map, names, snippets).
cd "$(dirname "$0")/.." || exit 1
B=${B:-build}/buildtest/$(basename "$0" .sh)
mkdir -p "$B"
STRICT="-std=c99 -Wall -Wextra -pedantic -Werror -I."
p=0; f=0; s=0
ok()   { echo "ok   $1"; p=$((p + 1)); }
bad()  { echo "FAIL $1"; [ -f "$B/log" ] && tail -n 15 "$B/log"; f=$((f + 1)); }
skip() { echo "skip $1 ($2)"; s=$((s + 1)); }
check() { name=$1; shift; if "$@" > "$B/log" 2>&1; then ok "$name"; else bad "$name"; fi; }
fails() { name=$1; want=$2; shift 2
    if "$@" > "$B/log" 2>&1; then bad "$name (compiled, must not)";
    elif grep -q "$want" "$B/log"; then ok "$name"; else bad "$name (no \"$want\" in the error)"; fi; }
summary() { echo "$p passed, $f failed, $s skipped"; [ $f -eq 0 ]; }
