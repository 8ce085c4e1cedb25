#!/bin/sh
# Runs every test binary and test script, then every example in short mode (PDP_SHORT=1), and
# prints the five longest runs, one overall line, "total: P passed, F failed, S skipped", then
# the skipped tests, each with its reason.
# Usage: run_all.sh TEST... -- EXAMPLE...            run them one after another, then report
#        run_all.sh --run-one TEST                   run one test into $B/run/NAME.log and .rc
#        run_all.sh --run-example EXAMPLE            the same for an example, in short mode
#        run_all.sh --saved TEST... -- EXAMPLE...    report what --run-one/--run-example saved
# `make test` runs each program with --run-one or --run-example as soon as it is built (so
# runs overlap with the other builds), then --saved. Binaries run with -v, which makes the
# harness print one line per test: the log keeps them all, the report shows the non-PASS ones.
R=${B:-build}/run

now() { date +%s.%N 2>/dev/null || date +%s; }
run_one() { # kind prog: writes $R/NAME.log, $R/NAME.rc and $R/NAME.time (wall seconds)
    name=${2##*/}
    mkdir -p "$R"
    rm -f "$R/$name.rc" "$R/$name.time"
    t0=$(now)
    case $1 in
        example) PDP_SHORT=1 "./$2" > "$R/$name.log" 2>&1 ;;
        *.sh) sh "$2" > "$R/$name.log" 2>&1 ;;
        *) "./$2" -v > "$R/$name.log" 2>&1 ;;
    esac
    rc=$?
    awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%.1f\n", b - a }' > "$R/$name.time"
    echo $rc > "$R/$name.rc"
}

case $1 in
    --run-one) run_one "$2" "$2"; exit 0 ;;
    --run-example) run_one example "$2"; exit 0 ;;
    --saved) shift ;;
    *) in_examples=0
       for a in "$@"; do
           if [ "$a" = "--" ]; then in_examples=1; continue; fi
           if [ $in_examples = 1 ]; then run_one example "$a"; else run_one "$a" "$a"; fi
       done ;;
esac

p=0; f=0; s=0; bad=""; skips=""
tests=""; examples=""; in_examples=0
for a in "$@"; do
    if [ "$a" = "--" ]; then in_examples=1; continue; fi
    if [ $in_examples = 1 ]; then examples="$examples $a"; else tests="$tests $a"; fi
done
nl='
'
for t in $tests; do
    name=${t##*/}
    if [ ! -f "$R/$name.rc" ]; then
        echo "$t: did not run (no $R/$name.rc)"; f=$((f + 1)); bad="$bad $t"; continue
    fi
    rc=$(cat "$R/$name.rc")
    grep -v '^PASS ' "$R/$name.log"
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped$' "$R/$name.log" | tail -n 1)
    # the harness's "SKIP name: reason (ticks)" and the build tests' "skip name (reason)"
    found=$(sed -n -e '/^SKIP /{s/ *([0-9]* ticks, [0-9.]* sec)$//;s/^SKIP \([^:]*\): */\1: /p;}' \
                   -e 's/^skip \([^ ]*\) (\(.*\))$/\1: \2/p' "$R/$name.log" |
            sed 's/: $/: (no reason given)/')
    if [ -n "$found" ]; then
        skips="$skips$(printf '%s\n' "$found" | sed "s|^|  $name: |")$nl"
    fi
    if [ -z "$line" ]; then
        echo "$t: no summary line (exit $rc)"; f=$((f + 1)); bad="$bad $t"; continue
    fi
    set -- $line
    p=$((p + $1)); f=$((f + $3)); s=$((s + $5))
    if [ "$rc" -ne 0 ] && [ $3 -eq 0 ]; then f=$((f + 1)); fi
    if [ "$rc" -ne 0 ]; then bad="$bad $t"; fi
done
for e in $examples; do
    name=${e##*/}
    if [ -f "$R/$name.rc" ] && [ "$(cat "$R/$name.rc")" -eq 0 ]; then
        echo "example $e: ok"; p=$((p + 1))
    else
        echo "example $e: FAILED (output in $R/$name.log)"; tail -n 20 "$R/$name.log" 2>/dev/null
        f=$((f + 1)); bad="$bad $e"
    fi
done
[ -n "$bad" ] && echo "failing:$bad"
# the five longest runs (wall seconds, while the other builds and runs went on beside them)
slow=$(for t in $tests $examples; do
           name=${t##*/}
           [ -f "$R/$name.time" ] && echo "$(cat "$R/$name.time") $name"
       done | sort -rn | head -n 5 | awk '{ printf " %s %ss", $2, $1 }')
[ -n "$slow" ] && echo "longest runs:$slow"
echo "total: $p passed, $f failed, $s skipped"
if [ -n "$skips" ]; then
    echo "skipped:"
    printf '%s' "$skips"
fi
[ $f -eq 0 ]
