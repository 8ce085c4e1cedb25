#!/bin/sh
# As a user builds them: each example alone (make test links them to one
# implementation object instead), and the README's quick start, compiled alone and
# trained.
. "$(dirname "$0")/build_checks.sh"

# ---- each example builds alone, as its top comment says. make test compiles every
# example's own code (linked to one implementation object), so what building alone adds is
# the implementation compiled after the example's first lines. Every example starts with
# the same two, `#define PDP_IMPLEMENTATION` and `#include "pdp.h"`, before any other
# header or macro, and calls no private pdp__ function: then the implementation compiles the
# same in each, and one compile alone (train_mnist, the README's example) stands for all.
# A check costs a grep here instead of a parse of the implementation (about 1.2 s of CPU
# each). ----
for e in examples/*.c; do
    name="example_starts_with_the_implementation_$(basename "$e" .c)"
    first=$(grep -m 2 '^[[:space:]]*#' "$e" | tr -s ' ' | tr '\n' '|')
    if [ "$first" != '#define PDP_IMPLEMENTATION|#include "pdp.h"|' ]; then
        bad "$name"; echo "  its first preprocessor lines: $first"
    elif grep -n 'pdp__[A-Za-z0-9_]*[[:space:]]*(' "$e"; then
        bad "$name"; echo "  calls a private pdp__ function (above): examples use the public API only"
    else ok "$name"; fi
done
check example_builds_alone_train_mnist gcc $STRICT -fsyntax-only examples/train_mnist.c

awk '/^```c$/{f=1;next}/^```$/{f=0}f' README.md > "$B/readme.c"
check "readme_quick_start_compiles_alone" gcc $STRICT -fsyntax-only "$B/readme.c"
if [ -n "$IMPL_OBJ" ] && [ -f "$IMPL_OBJ" ]; then
    readme_build="gcc $STRICT -O2 -DPDP__IMPLEMENTATION_INCLUDED $B/readme.c $IMPL_OBJ -o $B/readme -lm -lpthread"
else
    readme_build="gcc $STRICT -O2 $B/readme.c -o $B/readme -lm -lpthread"
fi
check "readme_quick_start_trains" sh -c "$readme_build && $B/readme | grep -q 'last batch loss'"

summary
