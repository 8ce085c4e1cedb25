/* nccl.h (cuda_emu): the NCCL subset pdp_cuda.cu uses; tests/cuda_emu/cuda_emu.cc
   implements it for the ranks of ONE process. Enum values are the real ones. */
#ifndef PDP_CUDA_EMU_NCCL_H
#define PDP_CUDA_EMU_NCCL_H

#include "cuda_runtime.h"

#include <climits>

#define NCCL_VERSION(X, Y, Z) ((X) * 10000 + (Y) * 100 + (Z))
#define NCCL_VERSION_CODE NCCL_VERSION(2, 18, 0) /* the API level emulated (ncclCommSplit) */
#define NCCL_SPLIT_NOCOLOR (-1)

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
    char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef struct pdp_emu_comm *ncclComm_t;

typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7
} ncclResult_t;

typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 } ncclRedOp_t;

typedef enum {
    ncclInt8 = 0, ncclUint8 = 1, ncclInt32 = 2, ncclUint32 = 3, ncclInt64 = 4, ncclUint64 = 5,
    ncclFloat16 = 6, ncclFloat32 = 7, ncclFloat64 = 8, ncclBfloat16 = 9
} ncclDataType_t;

typedef struct {
    size_t size;
    unsigned magic;
    unsigned version;
    int blocking; /* 0: non-blocking (calls may return ncclInProgress) */
} ncclConfig_t;
#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_INITIALIZER {sizeof(ncclConfig_t), 0xcafebeef, 0, NCCL_CONFIG_UNDEF_INT}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id);
ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t *config);
ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist);
ncclResult_t ncclCommFinalize(ncclComm_t comm);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *async_error);
const char *ncclGetErrorString(ncclResult_t r);
ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t type,
                           int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t recvcount,
                               ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream);
ncclResult_t ncclAllGather(const void *send, void *recv, size_t sendcount, ncclDataType_t type,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);
ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                           ncclConfig_t *config);

#endif
