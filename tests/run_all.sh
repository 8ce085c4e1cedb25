#!/bin/sh
# Runs every test binary, then every example in short mode (PDP_SHORT=1), and
# prints one overall line: "total: P passed, F failed, S skipped".
# Usage: run_all.sh TEST... -- EXAMPLE...
p=0; f=0; s=0; bad=""
tests=""; examples=""; in_examples=0
for a in "$@"; do
    if [ "$a" = "--" ]; then in_examples=1; continue; fi
    if [ $in_examples = 1 ]; then examples="$examples $a"; else tests="$tests $a"; fi
done
for t in $tests; do
    case $t in
        *.sh) out=$(sh "$t" 2>&1); rc=$? ;;
        *) out=$("./$t" 2>&1); rc=$? ;;
    esac
    printf '%s\n' "$out"
    line=$(printf '%s\n' "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped$' | tail -n 1)
    if [ -z "$line" ]; then
        echo "$t: no summary line (exit $rc)"; f=$((f + 1)); bad="$bad $t"; continue
    fi
    set -- $line
    p=$((p + $1)); f=$((f + $3)); s=$((s + $5))
    if [ $rc -ne 0 ] && [ $3 -eq 0 ]; then f=$((f + 1)); fi
    if [ $rc -ne 0 ]; then bad="$bad $t"; fi
done
for e in $examples; do
    if PDP_SHORT=1 "./$e" > "$e.out" 2>&1; then
        echo "example $e: ok"; p=$((p + 1))
    else
        echo "example $e: FAILED (output in $e.out)"; tail -n 20 "$e.out"; f=$((f + 1)); bad="$bad $e"
    fi
done
[ -n "$bad" ] && echo "failing:$bad"
echo "total: $p passed, $f failed, $s skipped"
[ $f -eq 0 ]
