#!/bin/sh
# mpi_startup.sh BIN MPIRUN [FLAGS...]: MPI start-up and a killed rank under mpirun
# (`make mpi-test` runs it after the test_mpi runs). BIN is build/mpi/test_mpi; its
# --startup and --killed modes print one line per rank, checked here (comm.h, "MPI start-up"):
#   1. rank 2 of 3 never starts, PDP_STORE_PORT set: ranks 0 and 1 fail with PDP_ERR_TIMEOUT
#      after the 2 s timeout naming rank 2, without entering MPI_Init_thread;
#   2. rank 0 (the store's server) never starts: rank 1 fails the same way naming rank 0;
#   3. no store port: the watchdog reports through desc.log after 2 s that MPI_Init_thread has
#      not returned (the rank then stays in it until mpirun ends the job);
#   4. mpirun --enable-recovery, rank 1 SIGKILLed: rank 0's all-reduce fails with
#      PDP_ERR_TIMEOUT at the 2 s timeout.
# Every mpirun is wrapped in `timeout` (mpirun sometimes never exits after its ranks did).
bin=$1
shift
out=$(mktemp)
fail=0
check() { # description, pattern
    if grep -q -- "$2" "$out"; then
        echo "ok   $1"
    else
        echo "FAIL $1: no line matches '$2' in:"
        sed 's/^/    /' "$out"
        fail=1
    fi
}
port=$((20000 + $$ % 20000))

PDP_STORE_PORT=$port timeout 60 "$@" -x PDP_STORE_PORT -np 3 "$bin" --startup 2 6 >"$out" 2>&1
check "start-up check: rank 0 names missing rank 2" \
    "startup: rank 0: PDP_ERR_TIMEOUT after [23]\.[0-9] s: .*missing rank 2: it did not call"
check "start-up check: rank 1 names missing rank 2" \
    "startup: rank 1: PDP_ERR_TIMEOUT after [23]\.[0-9] s: .*missing rank 2: it did not call"

port=$((port + 1))
PDP_STORE_PORT=$port timeout 60 "$@" -x PDP_STORE_PORT -np 2 "$bin" --startup 0 6 >"$out" 2>&1
check "start-up check: rank 1 names missing rank 0" \
    "startup: rank 1: PDP_ERR_TIMEOUT after [2-4]\.[0-9] s: .*missing rank 0"

env -u PDP_STORE_PORT -u MASTER_PORT timeout 60 "$@" -np 2 "$bin" --startup 1 6 >"$out" 2>&1
check "watchdog: rank 0 reports MPI_Init_thread still blocked" \
    "startup-log: pdp_comm_init_env: rank 0 of 2: MPI_Init_thread has not returned after 2 s"

timeout 60 "$@" --enable-recovery -np 2 "$bin" --killed >"$out" 2>&1
check "mpirun --enable-recovery: the survivor of a SIGKILL times out" \
    "killed: rank 0: PDP_ERR_TIMEOUT after [23]\.[0-9] s"

rm -f "$out"
exit $fail
