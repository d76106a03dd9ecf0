// Host emulation of the NCCL subset that executor/cuda/nccl.cu uses, so that it compiles with the
// host compiler and runs in CI (test infrastructure, like cuda_emu.hpp). A communicator's ranks
// are threads of one process; the types, values and calls are NCCL's (nccl.h, NCCL 2.x), and so
// are its rules, each refused with NCCL's error code:
// - buffers must be device memory (cudaPointerGetAttributes) and hold the call's elements
//   (ncclInvalidArgument);
// - every rank of a communicator makes the same calls in the same order, with the same count,
//   type and operation (ncclInvalidUsage, on every rank of the call);
// - ncclCommInitRank is collective: it returns when all nranks ranks have joined the id, each
//   rank once; the communicator takes device memory for its buffers, as NCCL does;
// - between ncclGroupStart and ncclGroupEnd calls are queued and run, in order, at the outermost
//   ncclGroupEnd;
// - point to point: a rank's ncclSend to a peer is matched by that peer's ncclRecv from it, in
//   the order each makes them, with the same count and type (ncclInvalidUsage). Inside a group
//   every send is posted before anything else runs, so a group may send to and receive from the
//   same peers (NCCL's all-to-all); outside one a send completes only once its receive is made,
//   so two ranks sending to each other first wait for each other, as they hang on a GPU
//   (ncclRemoteError when the patience runs out);
// - a call is ordered on its stream: the emulated streams run work as it is issued, so the call
//   completes (every rank's outputs written) before it returns.
// Sums run in rank order, bf16 rounded after each addition (NCCL's ring reduces pairwise in bf16
// arithmetic; its order is not promised, nor is it here).
#pragma once
#include <cstddef>

#include "executor/cuda/emu/cuda_emu.hpp"

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
} ncclResult_t;

typedef enum {
  ncclInt8 = 0,
  ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclHalf = 6,
  ncclFloat32 = 7,
  ncclFloat = 7,
  ncclFloat64 = 8,
  ncclDouble = 8,
  ncclBfloat16 = 9,
} ncclDataType_t;

typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 } ncclRedOp_t;

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;
typedef struct np_emu_nccl_comm* ncclComm_t;

ncclResult_t ncclGetUniqueId(ncclUniqueId* id);
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommCount(const ncclComm_t comm, int* count);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank);
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream);
ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream);
ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclGroupStart();
ncclResult_t ncclGroupEnd();
const char* ncclGetErrorString(ncclResult_t result);

namespace np::emu {
// Device memory each emulated communicator takes at ncclCommInitRank (a stand-in for NCCL's
// buffers, so that a measurement around the initialisation sees them).
constexpr size_t kNcclCommBytes = size_t{4} << 20;
}  // namespace np::emu
