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
#      PDP_ERR_TIMEOUT at the 2 s timeout;
#   5. mpirun --enable-recovery, rank 1 all-reduces half the others' count: every rank
#      returns a status (MPI's fatal handler aborted the job: OpenMPI reports a
#      non-blocking collective's error on MPI_COMM_WORLD's handler);
#   6. two processes started torchrun's way (RANK, WORLD_SIZE, MASTER_PORT), no mpirun:
#      each is an MPI world of one, and both refuse, naming their RANK and MPI's rank
#      (each trained alone with PDP_OK);
#   7. PDP_STORE_PORT=abc: refused at once, naming it (atoi read port 0, and the ranks timed
#      out naming each other).
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

timeout -k 5 60 "$@" --enable-recovery -np 3 "$bin" --mismatch >"$out" 2>&1
for r in 0 1 2; do
    check "a collective's count that differs on rank 1: rank $r returns a status" \
        "mismatch: rank $r: PDP_ERR_"
done

port=$((port + 1))
for r in 0 1; do
    RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout 60 "$bin" --startup 9 0 \
        >"$out.$r" 2>&1 &
done
wait
cat "$out.0" "$out.1" >"$out"
for r in 0 1; do
    check "processes started without mpirun: RANK=$r refuses" \
        "PDP_ERR_INVALID.*the environment makes this process rank $r of 2 (RANK/WORLD_SIZE), but MPI_COMM_WORLD makes it rank 0 of 1"
done

PDP_STORE_PORT=abc timeout 60 "$@" -x PDP_STORE_PORT -np 2 "$bin" --startup 9 0 >"$out" 2>&1
check "PDP_STORE_PORT that is no number: refused at once" \
    "startup: rank 1: PDP_ERR_INVALID after 0\.[0-9] s: .*PDP_STORE_PORT='abc' is not an integer"

rm -f "$out" "$out.0" "$out.1"
exit $fail
