#!/bin/sh
# Build options: PDP_STATIC twice in one program, allocation overrides, misuse
# that must not compile (half an override, a late _POSIX_C_SOURCE), and
# each option macro whose toolchain is installed (PDP_CBLAS, PDP_MPI).
. "$(dirname "$0")/build_checks.sh"

# PDP_STATIC in two translation units of one program, the second (tu_alloc.c) with its own
# PDP_MALLOC / PDP_FREE, whose counts it checks: they compile side by side, then link and run
# ($FAST_CC: 0.7 s of CPU where gcc took 5; gcc compiles PDP_STATIC with its own PDP_MALLOC in
# make test: test_gemm_nosimd, counting_alloc.h's, with PDP_NO_SIMD.) The second unit is built
# with -march=native, as make test builds: the kernels that need it (gemm.c's AVX-512 and AVX2
# ones) under PDP_STATIC and an own PDP_MALLOC too (test_layers compiled them so, by gcc,
# until it linked build/pdp_impl.o).
static_twice() {
    $FAST_CC $STRICT -DTU_MAIN -c tests/compile/tu_static.c -o "$B/sa.o" & a=$!
    $FAST_CC $STRICT -march=native -c tests/compile/tu_alloc.c -o "$B/sb.o" && wait $a &&
        $FAST_CC "$B/sa.o" "$B/sb.o" -o "$B/static2" -lm -lpthread && "$B/static2"
}
check static_twice_in_one_program_malloc_free_overrides_count_every_allocation static_twice
# misuse stops at its first error (-Wfatal-errors: the rest of the implementation unparsed)
check malloc_without_free_is_an_error must_fail "define both PDP_MALLOC and PDP_FREE" gcc $STRICT -Wfatal-errors -c tests/compile/tu_half_alloc.c -o "$B/half.o"
check late_posix_define_is_an_error_with_hint must_fail "define _POSIX_C_SOURCE 200809L" gcc $STRICT -Wfatal-errors -c tests/compile/tu_late_posix.c -o "$B/late.o"
# (GNU mode needing no define: test_build_cxx.sh's include_order_system_header_first_gnu_mode;
# the bf16 paths in a build without -march: its gxx_O3_quiet_bf16_paths_match_naive)

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
    # ($FAST_CC: the subject is the option, not the compiler; 0.7 s of CPU where gcc took 3)
    check option_pdp_cblas sh -c "$FAST_CC $STRICT -DPDP_CBLAS -c tests/compile/tu_impl.c -o $B/cblas.o && $FAST_CC $B/cblas.o tests/compile/tu_api.c -I. -o $B/cblas $CBLAS_LIBS -lm -lpthread && $B/cblas"
else skip "option_pdp_cblas" "$why"; fi
if command -v mpicc > /dev/null; then
    check option_pdp_mpi mpicc $STRICT -DPDP_MPI -fsyntax-only tests/compile/tu_impl.c
else skip "option_pdp_mpi" "mpicc not found (apt-get install libopenmpi-dev)"; fi

summary
