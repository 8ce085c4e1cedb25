#!/bin/sh
# Generator and compile tests: amalgamate.py (--check, byte-identical output, a
# stale copy names its module), and pdp.h built every way a user builds it:
# gcc and clang in strict C99, the API as C++, two translation units, PDP_STATIC
# twice in one program, allocation overrides, misuse that must not compile,
# and each option macro whose toolchain is installed (PDP_CBLAS, PDP_MPI).
cd "$(dirname "$0")/.." || exit 1
B=${B:-build}/buildtest
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

# ---- the generator (python3; pdp.h is committed, so a machine without python3 still builds) ----
if command -v python3 > /dev/null; then
    check "amalgamate_check_passes" python3 amalgamate.py --check
    python3 amalgamate.py --output "$B/one.h" && python3 amalgamate.py --output "$B/two.h"
    check "amalgamate_output_is_byte_identical" cmp "$B/one.h" "$B/two.h"
    check "amalgamate_has_no_absolute_paths" sh -c "! grep -q '$(pwd)' '$B/one.h'"
    sed 's/^PDP_API pdp_status pdp_tensor_fill(/PDP_API pdp_status pdp_tensor_fill_stale(/' pdp.h > "$B/stale.h"
    python3 amalgamate.py --check --output "$B/stale.h" > "$B/log" 2>&1; rc=$?
    if [ $rc -eq 1 ] && grep -q "src/tensor.h differs" "$B/log"; then ok "amalgamate_check_names_stale_module"
    else bad "amalgamate_check_names_stale_module (exit $rc)"; fi
    rm -rf "$B/order" && mkdir -p "$B/order" && cp -r src amalgamate.py "$B/order/"
    sed -i 's/^    "cuda_host.c",$/    "CUDA_HOST_LATER",/; s/^    "ddp.c",$/    "ddp.c",\n    "cuda_host.c",/; /"CUDA_HOST_LATER"/d' "$B/order/amalgamate.py"
    python3 "$B/order/amalgamate.py" --order > "$B/log" 2>&1; rc=$?
    if [ $rc -eq 1 ] && grep -q "src/tensor.c:[0-9]*: uses pdp__dev_alloc, defined in src/cuda_host.c" "$B/log"; then
        ok "amalgamate_order_check_names_caller_and_module"
    else bad "amalgamate_order_check_names_caller_and_module (exit $rc)"; fi
    python3 amalgamate.py --bogus > "$B/log" 2>&1; rc=$?
    if [ $rc -eq 2 ]; then ok "amalgamate_unknown_option_exits_2"; else bad "amalgamate_unknown_option_exits_2 (exit $rc)"; fi
    python3 amalgamate.py --line-directives --output "$B/dev.h" > "$B/log" 2>&1
    check "amalgamate_line_directives_point_into_src" grep -q '^#line 1 "src/tensor.c"' "$B/dev.h"
    check "header_line_one_names_version" sh -c "head -n 1 pdp.h | grep -q \"pdp.h - v\$(sed -n 's/#define PDP_VERSION_MAJOR //p' src/base.h)\""
else skip "amalgamate_checks" "python3 not found (apt-get install python3)"; fi

# ---- compilers ----
check "gcc_c99_two_translation_units" sh -c "gcc $STRICT -c tests/compile/tu_impl.c -o $B/impl.o && gcc $STRICT -c tests/compile/tu_api.c -o $B/api.o && gcc $B/impl.o $B/api.o -o $B/two -lm -lpthread && $B/two"
if command -v clang > /dev/null; then
    check "clang_c99_two_translation_units" sh -c "clang $STRICT -c tests/compile/tu_impl.c -o $B/cimpl.o && clang $STRICT -c tests/compile/tu_api.c -o $B/capi.o && clang $B/cimpl.o $B/capi.o -o $B/ctwo -lm -lpthread && $B/ctwo"
else skip "clang_c99_two_translation_units" "clang not found (apt-get install clang)"; fi
if command -v g++ > /dev/null; then
    check "cxx_api_section_links_with_c_impl" sh -c "g++ -x c++ -std=c++11 -Wall -Wextra -pedantic -Werror -I. -c tests/compile/tu_api.c -o $B/xapi.o && g++ $B/impl.o $B/xapi.o -o $B/xtwo -lm -lpthread && $B/xtwo"
else skip "cxx_api_section_links_with_c_impl" "g++ not found (apt-get install g++)"; fi
# what a user's translation unit sees (the API and the math block) is quiet under the
# warnings careful projects turn on
check "api_quiet_under_wconversion_wfloat_equal" gcc $STRICT -Wconversion -Wsign-conversion -Wfloat-equal -Wshadow -c tests/compile/tu_api.c -o "$B/wconv.o"
# the README's C++ desc snippet compiles (C++ has no compound literals)
if command -v g++ > /dev/null; then
    awk '/^```c\+\+$/{f=1;next}/^```$/{f=0}f' README.md > "$B/readme_cxx.inc"
    printf '#include "pdp.h"\n#include <cstdio>\nint main() {\n#include "readme_cxx.inc"\n    if (!m) return 1;\n    pdp_model_free(m);\n    return 0;\n}\n' > "$B/readme_cxx.cc"
    check "readme_cxx_desc_snippet_compiles_and_runs" sh -c "g++ -std=c++11 -Wall -Wextra -pedantic -Werror -Wconversion -Wfloat-equal -I. -I$B -c $B/readme_cxx.cc -o $B/readme_cxx.o && g++ $B/impl.o $B/readme_cxx.o -o $B/readme_cxx -lm -lpthread && $B/readme_cxx"
else skip "readme_cxx_desc_snippet_compiles_and_runs" "g++ not found (apt-get install g++)"; fi
check "static_twice_in_one_program" sh -c "gcc $STRICT -c tests/compile/tu_static.c -o $B/sa.o -DTU_MAIN && gcc $STRICT -c tests/compile/tu_static.c -o $B/sb.o -DTU_NAME=tu_static_b && gcc $B/sa.o $B/sb.o -o $B/static2 -lm -lpthread && $B/static2"
check "malloc_free_overrides_count_every_allocation" sh -c "gcc $STRICT tests/compile/tu_alloc.c -o $B/alloc -lm -lpthread && $B/alloc"
fails "malloc_without_free_is_an_error" "define both PDP_MALLOC and PDP_FREE" gcc $STRICT -c tests/compile/tu_half_alloc.c -o "$B/x.o"
fails "late_posix_define_is_an_error_with_hint" "define _POSIX_C_SOURCE 200809L" gcc $STRICT -c tests/compile/tu_late_posix.c -o "$B/x.o"
check "gnu_mode_needs_no_posix_define" gcc -std=gnu11 -Wall -Wextra -Werror -I. -fsyntax-only tests/compile/tu_late_posix.c

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

# ---- option macros whose toolchains may be missing ----
# PDP_CBLAS needs cblas.h AND a library to link: a probe program calls cblas_sgemm and links it
# with $CBLAS_LIBS (PDP_TEST_CBLAS_LIBS overrides -lopenblas; a bogus name fakes its absence).
# cblas_missing LIBS prints why PDP_CBLAS cannot be tested here, or nothing when it can.
CBLAS_LIBS=${PDP_TEST_CBLAS_LIBS:--lopenblas}
cblas_missing() {
    printf '#include <cblas.h>\nint main(void) { float a = 1, b = 2, c = 0;\n'\
'    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 1, 1, 1, 1, &a, 1, &b, 1, 0, &c, 1);\n'\
'    return c == 2 ? 0 : 1; }\n' > "$B/cblas_probe.c"
    if ! gcc -c "$B/cblas_probe.c" -o "$B/cblas_probe.o" > /dev/null 2>&1; then
        echo "no cblas.h (apt-get install libopenblas-dev)"
    elif ! gcc "$B/cblas_probe.o" -o "$B/cblas_probe" $1 > /dev/null 2>&1; then
        echo "cblas.h found but linking $1 failed (apt-get install libopenblas-dev)"
    elif ! "$B/cblas_probe"; then
        echo "a program linked with $1 does not run (apt-get install libopenblas-dev)"
    fi
}
why=$(cblas_missing "-lpdp_no_such_blas")
case $why in
    "no cblas.h"*|*"linking -lpdp_no_such_blas failed"*) ok "option_pdp_cblas_detection_skips_without_the_library" ;;
    *) bad "option_pdp_cblas_detection_skips_without_the_library (got: ${why:-no reason})" ;;
esac
why=$(cblas_missing "$CBLAS_LIBS")
if [ -z "$why" ]; then
    check "option_pdp_cblas" sh -c "gcc $STRICT -DPDP_CBLAS -c tests/compile/tu_impl.c -o $B/cblas.o && gcc $B/cblas.o tests/compile/tu_api.c -I. -o $B/cblas $CBLAS_LIBS -lm -lpthread && $B/cblas"
else skip "option_pdp_cblas" "$why"; fi
if command -v mpicc > /dev/null; then
    check "option_pdp_mpi" mpicc $STRICT -DPDP_MPI -fsyntax-only tests/compile/tu_impl.c
else skip "option_pdp_mpi" "mpicc not found (apt-get install libopenmpi-dev)"; fi

echo "$p passed, $f failed, $s skipped"
[ $f -eq 0 ]
