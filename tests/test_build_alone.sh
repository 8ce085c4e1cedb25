#!/bin/sh
# As a user builds them: each example alone (make test links them to one
# implementation object instead), and the README's quick start, compiled alone and
# trained.
. "$(dirname "$0")/build_checks.sh"

# ---- each example builds alone, as its top comment says (make test links them to one
# implementation object instead) ----
for e in examples/*.c; do
    check "example_builds_alone_$(basename "$e" .c)" gcc $STRICT -fsyntax-only "$e"
done

# ---- the README's quick start compiles alone and trains ----
# (make test hands in IMPL_OBJ, the implementation it compiled once at -O2; the quick start
# links it instead of compiling the implementation again. Alone, this script builds it whole.)
awk '/^```c$/{f=1;next}/^```$/{f=0}f' README.md > "$B/readme.c"
check "readme_quick_start_compiles_alone" gcc $STRICT -fsyntax-only "$B/readme.c"
if [ -n "$IMPL_OBJ" ] && [ -f "$IMPL_OBJ" ]; then
    readme_build="gcc $STRICT -O2 -DPDP__IMPLEMENTATION_INCLUDED $B/readme.c $IMPL_OBJ -o $B/readme -lm -lpthread"
else
    readme_build="gcc $STRICT -O2 $B/readme.c -o $B/readme -lm -lpthread"
fi
check "readme_quick_start_trains" sh -c "$readme_build && $B/readme | grep -q 'last batch loss'"

summary
