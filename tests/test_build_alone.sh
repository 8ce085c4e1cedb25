#!/bin/sh
# As a user builds them: each example alone (make test links them to one
# implementation object instead), and the README's quick start, compiled and trained.
. "$(dirname "$0")/build_checks.sh"

# ---- each example and the README's quick start build alone, as their top comments say.
# make test compiles every example's own code (linked to one implementation object) and
# readme_quick_start_trains the README's, so what building alone adds is the implementation
# compiled after the program's first lines. Every example and the quick start start with the
# same two, `#define PDP_IMPLEMENTATION` and `#include "pdp.h"`, before any other header or
# macro, and call no private pdp__ function: then the implementation compiles the same in
# each, and one compile alone (train_mnist, which includes system headers after pdp.h) stands
# for all. A check costs a grep here instead of a parse of the implementation (about 1.3 s of
# CPU each). ----
awk '/^```c$/{f=1;next}/^```$/{f=0}f' README.md > "$B/readme.c"
starts_with_the_implementation() { # NAME FILE
    first=$(grep -m 2 '^[[:space:]]*#' "$2" | tr -s ' ' | tr '\n' '|')
    if [ "$first" != '#define PDP_IMPLEMENTATION|#include "pdp.h"|' ]; then
        bad "$1"; echo "  its first preprocessor lines: $first"
    elif grep -n 'pdp__[A-Za-z0-9_]*[[:space:]]*(' "$2"; then
        bad "$1"; echo "  calls a private pdp__ function (above): users call the public API only"
    else ok "$1"; fi
}
for e in examples/*.c; do
    starts_with_the_implementation "example_starts_with_the_implementation_$(basename "$e" .c)" "$e"
done
starts_with_the_implementation readme_quick_start_starts_with_the_implementation "$B/readme.c"
check example_builds_alone_train_mnist gcc $STRICT -fsyntax-only examples/train_mnist.c

# (trained on 6432 samples: build_checks.sh's short_readme)
if [ -n "$IMPL_OBJ" ] && [ -f "$IMPL_OBJ" ]; then
    readme_build="gcc $STRICT -O2 -DPDP__IMPLEMENTATION_INCLUDED $B/readme_short.c $IMPL_OBJ -o $B/readme -lm -lpthread"
else
    readme_build="gcc $STRICT -O2 $B/readme_short.c -o $B/readme -lm -lpthread"
fi
readme_trains() { short_readme "$B/readme.c" "$B/readme_short.c" && $readme_build && trains "$B/readme"; }
check readme_quick_start_trains readme_trains

summary
