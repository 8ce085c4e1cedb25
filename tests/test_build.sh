#!/bin/sh
# Generator and compiler tests: amalgamate.py (--check, byte-identical output, a
# stale copy names its module, the module order), and pdp.h's two halves built the
# ways a user builds them: gcc and clang in strict C99 as two translation units, and in C11,
# the API as C++, the API quiet under -Wconversion (the implementation as C++ and by
# nvcc, the README's C++ quick start, include order: test_build_cxx.sh).
# (tests/build_checks.sh: the helpers; test_build_options.sh, test_build_alone.sh:
# the other build tests.)
. "$(dirname "$0")/build_checks.sh"

# ---- the generator (python3; pdp.h is committed, so a machine without python3 still builds) ----
exits() { # exits CODE WANT CMD...: CMD exits with CODE and says WANT (grep -E; "" for anything)
    code=$1; want=$2; shift 2
    "$@" > "$B/$name.out" 2>&1; rc=$?
    cat "$B/$name.out"
    [ $rc -eq "$code" ] || { echo "exit $rc, want $code"; return 1; }
    [ -z "$want" ] || grep -qE "$want" "$B/$name.out" || { echo "no \"$want\" in the output"; return 1; }
}
amalgamate_twice() { # two runs give the same bytes: this one and the one that wrote pdp.h
    # (make's, or the committer's; amalgamate_check_passes holds pdp.h to src/)
    python3 amalgamate.py --output "$B/one.h" && cmp "$B/one.h" pdp.h
}
if command -v python3 > /dev/null; then
    check amalgamate_check_passes python3 amalgamate.py --check
    check amalgamate_output_is_byte_identical amalgamate_twice
    # a copy of pdp.h with one line changed: --check exits 1 and names the module
    sed 's/^PDP_API pdp_status pdp_tensor_fill(/PDP_API pdp_status pdp_tensor_fill_stale(/' pdp.h > "$B/stale.h"
    check amalgamate_check_names_stale_module \
        exits 1 "src/tensor.h differs" python3 amalgamate.py --check --output "$B/stale.h"
    # cuda_host.c moved after its first caller: --order exits 1 and names both
    rm -rf "$B/order" && mkdir -p "$B/order" && cp -r src amalgamate.py "$B/order/"
    sed -i 's/^    "cuda_host.c",$/    "CUDA_HOST_LATER",/; s/^    "ddp.c",$/    "ddp.c",\n    "cuda_host.c",/; /"CUDA_HOST_LATER"/d' "$B/order/amalgamate.py"
    check amalgamate_order_check_names_caller_and_module \
        exits 1 "src/tensor.c:[0-9]*: uses pdp__dev_alloc, defined in src/cuda_host.c" python3 "$B/order/amalgamate.py" --order
    check amalgamate_unknown_option_exits_2 exits 2 "" python3 amalgamate.py --bogus
    check amalgamate_line_directives_point_into_src sh -c "python3 amalgamate.py --line-directives --output $B/dev.h && grep -q '^#line 1 \"src/tensor.c\"' $B/dev.h"
    check header_line_one_names_version sh -c "head -n 1 pdp.h | grep -q \"pdp.h - v\$(sed -n 's/#define PDP_VERSION_MAJOR //p' src/base.h)\""
else skip "amalgamate_checks" "python3 not found (apt-get install python3)"; fi

# ---- a fresh clone without python3: src/ looks newer than pdp.h (clone timestamps), and make
# keeps the committed pdp.h instead of failing (PATH holds make's tools, not python3) ----
rm -rf "$B/clone" "$B/nopy" && mkdir -p "$B/clone" "$B/nopy" && cp -r Makefile amalgamate.py pdp.h src "$B/clone/"
for t in make sh nproc touch; do ln -s "$(command -v $t)" "$B/nopy/$t"; done
touch "$B/clone/src/"*
make_without_python() {
    nopy=$(cd "$B/nopy" && pwd)
    (cd "$B/clone" && PATH=$nopy make -s pdp.h) > "$B/$name.out" 2>&1; cat "$B/$name.out"
    grep -q "python3 not found, so the committed pdp.h is used" "$B/$name.out" &&
        cmp pdp.h "$B/clone/pdp.h" && (cd "$B/clone" && PATH=$nopy make -q pdp.h)
}
check make_without_python_keeps_committed_header make_without_python

# ---- compilers ----
# Two translation units, the implementation in one, the API in the other, linked and run: by
# clang in strict C99, and by gcc with the implementation in strict C11 (its API unit in C99;
# C11 as well as C99, with each compiler, -pedantic -Werror: c11_gcc_and_clang_quiet below).
# gcc's object at -O0 is what no -fsyntax-only pass sees: -Wreturn-type, -Wunused-function on
# the private functions (static here, external in make test's objects) and C99's inline rule
# (an `inline` definition without an external one links at -O0 only). gcc parses the
# implementation in C99 with the same flags (pdp.h first, no PDP_* macro) in
# test_build_alone.sh's example_builds_alone_train_mnist, and compiles it in C99 into make
# test's build/pdp_impl.o; one compile in C11 here where there were two (C99 -O0 and C11
# -fsyntax-only: 1.6 s of CPU saved).
C11="-std=c11 -Wall -Wextra -pedantic -Werror -I."
check gcc_c11_impl_c99_api_two_translation_units sh -c "gcc $C11 -c tests/compile/tu_impl.c -o $B/impl.o && gcc $STRICT -c tests/compile/tu_api.c -o $B/api.o && gcc $B/impl.o $B/api.o -o $B/two -lm -lpthread && $B/two"
if command -v clang > /dev/null; then
    check clang_c99_two_translation_units sh -c "clang $STRICT -c tests/compile/tu_impl.c -o $B/cimpl.o && clang $STRICT -c tests/compile/tu_api.c -o $B/capi.o && clang $B/cimpl.o $B/capi.o -o $B/ctwo -lm -lpthread && $B/ctwo"
else skip "clang_c99_two_translation_units" "clang not found (apt-get install clang)"; fi
# C11 as well as C99, with each compiler: the implementation (gcc's: above) and the API
c11_quiet() {
    gcc $C11 -fsyntax-only tests/compile/tu_api.c &&
        { ! command -v clang > /dev/null || clang $C11 -fsyntax-only tests/compile/tu_impl.c; }
}
check c11_gcc_and_clang_quiet c11_quiet
# what a user's translation unit sees (the API and the math block) is quiet under the
# warnings careful projects turn on
check api_quiet_under_wconversion_wfloat_equal gcc $STRICT -Wconversion -Wsign-conversion -Wfloat-equal -Wshadow -c tests/compile/tu_api.c -o "$B/wconv.o"
# (the README's C++ quick start: tests/test_build_cxx.sh)

# ---- what reads the files the checks above wrote ----
checks_wait
if command -v python3 > /dev/null; then
    check amalgamate_has_no_absolute_paths sh -c "! grep -q '$(pwd)' '$B/one.h'"
fi
if command -v g++ > /dev/null; then  # the C++ API against gcc_c11_impl_c99_api_two_translation_units's impl.o
    check cxx_api_section_links_with_c_impl sh -c "g++ -x c++ -std=c++11 -Wall -Wextra -pedantic -Werror -I. -c tests/compile/tu_api.c -o $B/xapi.o && g++ $B/impl.o $B/xapi.o -o $B/xtwo -lm -lpthread && $B/xtwo"
else skip "cxx_api_section_links_with_c_impl" "g++ not found (apt-get install g++)"; fi

summary
