#!/bin/sh
# A user's build is quiet: the implementation compiled as C++ by g++ (at -O2, the level the
# manual's build lines give, and at -Og, gcc's debugging level: the warnings that need the
# optimiser, -Wmaybe-uninitialized first, depend on the level) and clang++, and by nvcc as
# host code in a .cu file, at -Wall -Wextra with no warning; the README's C++ quick start
# compiled as C++ and trained; the bf16 paths of a build without -march against the naive
# loop; the layer table read the same in C++ (no array designators there) as in C; both
# include orders (a system header before pdp.h: one clear error, or none); clang -Weverything
# with only the classes listed below off. A compiler that is missing is skipped, by name.
# (tests/build_checks.sh: the helpers.)
. "$(dirname "$0")/build_checks.sh"

QUIET="-Wall -Wextra -Werror -I."
have() { command -v "$1" > /dev/null; }

# ---- the implementation as C++ (the longest check first: its compile takes 9.5 s of CPU, the
# README's training 0.7 s on 6432 samples, 6.7 s on the 60000 of one epoch) ----
# One object at -O2 (the README's flags, -std=c++11 -pedantic, and no -march, as users on
# other machines build), linked by the README's C++ quick start, which trains, and by
# tu_bf16_paths.c: every bf16 path this CPU has against the naive loop. gcc 12's
# _tile_loadconfig lost the tile configuration in a build without -march (at -O2 and -O3, C
# and C++ alike), which the -march=native tests never saw. (These two compiled the
# implementation each, the bf16 paths at -O3: 26 s of CPU in all, now 13. -O3 is no level the
# manual gives; make test builds the C implementation at -O2 -march=native, -Werror, into
# build/pdp_impl.o.)
awk '/^```c\+\+$/{f=1;next}/^```$/{f=0}f' README.md > "$B/readme_cxx.cc"
if have g++; then
    printf '#define PDP_IMPLEMENTATION\n#include "pdp.h"\n' > "$B/impl.cc"
    CXX_O2="g++ -std=c++11 -O2 $QUIET -pedantic"
    # (-DPDP__IMPLEMENTATION_INCLUDED: the programs' own `#define PDP_IMPLEMENTATION` adds nothing)
    # (trained on 6432 samples: build_checks.sh's short_readme)
    cxx_readme() {
        short_readme "$B/readme_cxx.cc" "$B/readme_cxx_short.cc" &&
            $CXX_O2 -c "$B/impl.cc" -o "$B/impl_cxx.o" &&
            $CXX_O2 -DPDP__IMPLEMENTATION_INCLUDED "$B/readme_cxx_short.cc" "$B/impl_cxx.o" \
                -o "$B/readme_cxx" -lm -lpthread && trains "$B/readme_cxx"
    }
    check gxx_O2_quiet_readme_cxx_quick_start_trains cxx_readme
    # -Og, linked: it prints every layer kind's name, by value; so does the C build, made
    # beside it in strict C99 (pdp.h first, then a system header: that include order; by
    # $FAST_CC, 0.7 s of CPU where gcc took 2.5; gcc builds that order in
    # test_build_alone.sh's example_builds_alone_train_mnist), and cxx_layer_table_matches_c
    # compares the two below
    kinds() {
        $FAST_CC $STRICT -O0 tests/compile/tu_kinds.c -o "$B/kinds_c" -lm -lpthread > "$B/kinds_c.log" 2>&1 & c=$!
        g++ -x c++ -Og $QUIET tests/compile/tu_kinds.c -o "$B/kinds_cxx" -lm -lpthread; rc=$?
        wait $c && return $rc
        echo "the C build (pdp.h first, then <stdio.h>, strict C99) failed:"; cat "$B/kinds_c.log"; return 1
    }
    check gxx_Og_quiet_and_c99_with_pdp_h_first kinds
else skip "gxx_quiet" "g++ not found (apt-get install g++)"; fi
if have clang++; then
    # clang's warnings come from its front end: -fsyntax-only sees them all
    check clangxx_quiet sh -c "clang++ -std=c++11 -fsyntax-only $QUIET -pedantic $B/readme_cxx.cc && clang++ -x c++ -fsyntax-only $QUIET tests/compile/tu_kinds.c"
else skip "clangxx_quiet" "clang++ not found (apt-get install clang)"; fi

# ---- nvcc: the implementation as host code of a .cu file. What nvcc adds to g++ is its own
# front end (cudafe++, cicc: diagnostics such as #550-D, which -Werror on the host compiler does
# not catch, so the log must hold no "warning" at all) and the host compiler's front end on the
# code cudafe++ writes (-Wall -Wextra). Warnings that need the optimiser (-Wmaybe-uninitialized)
# are g++'s on the same code, at -O2 and -Og above, so here the host compiler only parses
# (-fsyntax-only: 2 s of CPU, where compiling at -O2 took 8). Injected into pdp.h: an unused
# variable (#177-D) and one set but never used (#550-D) fail this check; a read that may be
# uninitialised through an inlined helper passes it and fails gxx_O2_quiet (only -O2 sees it) ----
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
if [ -x "$NVCC" ]; then
    cp tests/compile/tu_kinds.c "$B/impl.cu"
    nvcc_quiet() {
        "$NVCC" -Xcompiler -Wall,-Wextra,-fsyntax-only -I. -c "$B/impl.cu" -o "$B/impl_cu.o" > "$B/nvcc.out" 2>&1
        rc=$?; cat "$B/nvcc.out"
        [ $rc -eq 0 ] && ! grep -qi "warning" "$B/nvcc.out"
    }
    check nvcc_host_quiet nvcc_quiet
else skip "nvcc_host_quiet" "nvcc not found (CUDA toolkit; or NVCC=/path/to/nvcc)"; fi

# ---- include order ----
# pdp.h first, then system headers, in strict C99 as it is: tu_kinds.c (the C build of gxx_Og_quiet_and_c99_with_pdp_h_first)
# a system header first: in strict C99 on glibc, ONE error (not a cascade) that says what to do
one_error() {
    gcc $STRICT -fsyntax-only tests/compile/tu_stdlib_first.c > "$B/$name.out" 2>&1; rc=$?
    cat "$B/$name.out"; n=$(grep -c "error:" "$B/$name.out")
    echo "exit $rc, $n error lines"
    [ $rc -ne 0 ] && [ "$n" -eq 1 ] && grep -q "#define _POSIX_C_SOURCE 200809L above" "$B/$name.out"
}
check include_order_system_header_first_is_one_error one_error
# ... and each fix it names works; C++ and GNU mode need none (which declarations the system
# headers make is glibc's feature macros, not the compiler's: $FAST_CC)
check include_order_system_header_first_with_posix_define $FAST_CC $STRICT -D_POSIX_C_SOURCE=200809L -fsyntax-only tests/compile/tu_stdlib_first.c
check include_order_system_header_first_gnu_mode $FAST_CC -std=gnu99 -Wall -Wextra -Werror -I. -fsyntax-only tests/compile/tu_stdlib_first.c
if have g++; then
    check include_order_system_header_first_cxx g++ -x c++ $QUIET -fsyntax-only tests/compile/tu_stdlib_first.c
else skip "include_order_system_header_first_cxx" "g++ not found (apt-get install g++)"; fi

# ---- clang -Weverything on the implementation (C99), with these classes off, and why:
#   -Wpadded                  struct layout is not a defect: the compiler pads as the ABI says
#   -Wcomma                   comma expressions are the house style in for-increments and in
#                             paired assignments (t0 = ..., t1 = ...)
#   -Wused-but-marked-unused  math.h's shared helpers are marked unused because a translation
#                             unit that uses part of the library leaves some unused
#   -Wcast-align              casts of scratch and arena bytes (pdp__alloc, 64-byte aligned) to
#                             float or struct pointers; clang cannot see the allocator's alignment
#   -Wdouble-promotion        float to double is deliberate: printf's varargs, double accumulators
#   -Wfloat-equal             exact comparisons are deliberate: zero means default, bit-exact
#                             paths (Adam's bias correction at 1, a scale of exactly 1)
#   -Wformat-nonliteral       pdp__err and the log helpers forward their caller's format with a
#                             va_list; the callers' literals are checked through the format
#                             attribute
#   -Wbad-function-cast       (int)floor(x) and (double)strlen(s)-style casts of a call's value
#   -Wswitch-enum             switches with a default: cover the remaining values on purpose
#   -Wcast-qual               tensor views over const data (pdp_tensor's data is not const;
#                             the library only reads through those views)
# Every other class, any new one included, is an error here: fix it, or add it above with why.
EVERYTHING_OFF="-Wno-padded -Wno-comma -Wno-used-but-marked-unused -Wno-cast-align \
-Wno-double-promotion -Wno-float-equal -Wno-format-nonliteral -Wno-bad-function-cast \
-Wno-switch-enum -Wno-cast-qual"
if have clang; then
    check clang_weverything_only_the_listed_classes clang -std=c99 -fsyntax-only -Weverything -Werror $EVERYTHING_OFF -I. tests/compile/tu_impl.c
else skip "clang_weverything_only_the_listed_classes" "clang not found (apt-get install clang)"; fi

# ---- what reads the files the checks above wrote: the layer table in C++ and in C
# (gxx_Og_quiet built both), the bf16 paths against gxx_O2_quiet's object ----
checks_wait
if [ -x "$B/kinds_cxx" ]; then
    check cxx_layer_table_matches_c sh -c "cat $B/kinds_c.log && $B/kinds_c > $B/kinds_c.txt && $B/kinds_cxx > $B/kinds_cxx.txt && diff $B/kinds_c.txt $B/kinds_cxx.txt"
elif have g++; then skip "cxx_layer_table_matches_c" "the g++ build failed"; fi
if [ -f "$B/impl_cxx.o" ]; then
    check gxx_O2_quiet_bf16_paths_match_naive sh -c "g++ -x c++ -O2 $QUIET -DPDP__IMPLEMENTATION_INCLUDED tests/compile/tu_bf16_paths.c -x none $B/impl_cxx.o -o $B/bf16_paths -lm -lpthread && $B/bf16_paths"
elif have g++; then skip "gxx_O2_quiet_bf16_paths_match_naive" "the g++ -O2 build failed"; fi

summary
