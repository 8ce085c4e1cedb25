/* rendezvous: who this process is, the way torchrun and mpirun say it.

   pdp_env_read() tells a process who it is: RANK, WORLD_SIZE, LOCAL_RANK,
   LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT as torchrun exports them, or
   OpenMPI's OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE} under mpirun.
   MASTER_ADDR and MASTER_PORT say where rank 0 serves the TCP store (store.h)
   through which a backend hands out its unique id (pdp_comm_init_env). */

/* Who this process is. Defaults when nothing is set: rank 0 of 1, local rank 0
   of 1, 127.0.0.1:29500, from_env false. */
typedef struct pdp_env_info {
    int rank;              /* RANK, else OMPI_COMM_WORLD_RANK; 0 */
    int world_size;        /* WORLD_SIZE, else OMPI_COMM_WORLD_SIZE; 1 */
    int local_rank;        /* LOCAL_RANK, else OMPI_COMM_WORLD_LOCAL_RANK; else rank */
    int local_world_size;  /* LOCAL_WORLD_SIZE, else OMPI_COMM_WORLD_LOCAL_SIZE; else world */
    char master_addr[256]; /* MASTER_ADDR; "127.0.0.1" */
    int master_port;       /* MASTER_PORT; 29500 */
    bool from_env;         /* true when RANK/WORLD_SIZE or OMPI_COMM_WORLD_* were set */
} pdp_env_info;

/* Fills *out from the environment (torchrun's variables win over OpenMPI's; an
   empty variable counts as unset). PDP_ERR_INVALID, naming the variable and its
   value, for a non-integer, rank >= world size, a port outside 1..65535, or only
   one of RANK and WORLD_SIZE set. *out holds the defaults on failure. */
PDP_API pdp_status pdp_env_read(pdp_env_info *out);
