#!/bin/sh
# Build options: PDP_STATIC twice in one program, allocation overrides, misuse
# that must not compile (half an override, a late _POSIX_C_SOURCE), GNU mode, and
# each option macro whose toolchain is installed (PDP_CBLAS, PDP_MPI).
. "$(dirname "$0")/build_checks.sh"

static_twice() { # the two translation units compile side by side, then link and run
    gcc $STRICT -DTU_MAIN -c tests/compile/tu_static.c -o "$B/sa.o" & a=$!
    gcc $STRICT -DTU_NAME=tu_static_b -c tests/compile/tu_static.c -o "$B/sb.o" && wait $a &&
        gcc "$B/sa.o" "$B/sb.o" -o "$B/static2" -lm -lpthread && "$B/static2"
}
check static_twice_in_one_program static_twice
check malloc_free_overrides_count_every_allocation sh -c "gcc $STRICT tests/compile/tu_alloc.c -o $B/alloc -lm -lpthread && $B/alloc"
check malloc_without_free_is_an_error must_fail "define both PDP_MALLOC and PDP_FREE" gcc $STRICT -c tests/compile/tu_half_alloc.c -o "$B/half.o"
check late_posix_define_is_an_error_with_hint must_fail "define _POSIX_C_SOURCE 200809L" gcc $STRICT -c tests/compile/tu_late_posix.c -o "$B/late.o"
check bf16_paths_match_naive_in_a_plain_O2_build sh -c "gcc $STRICT -O2 tests/compile/tu_bf16_paths.c -o $B/bf16_paths -lm -lpthread && $B/bf16_paths"
check gnu_mode_needs_no_posix_define gcc -std=gnu11 -Wall -Wextra -Werror -I. -fsyntax-only tests/compile/tu_late_posix.c

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
    check option_pdp_cblas sh -c "gcc $STRICT -DPDP_CBLAS -c tests/compile/tu_impl.c -o $B/cblas.o && gcc $B/cblas.o tests/compile/tu_api.c -I. -o $B/cblas $CBLAS_LIBS -lm -lpthread && $B/cblas"
else skip "option_pdp_cblas" "$why"; fi
if command -v mpicc > /dev/null; then
    check option_pdp_mpi mpicc $STRICT -DPDP_MPI -fsyntax-only tests/compile/tu_impl.c
else skip "option_pdp_mpi" "mpicc not found (apt-get install libopenmpi-dev)"; fi

summary
