// NCCL, opened at run time. libsx does not link libnccl: a machine without NCCL (or
// without a GPU) loads libsx and runs its CPU path; the CUDA backend opens
// libnccl.so.2 when a group asks for it (NCCL_LIBRARY, if set, names the file).
// Built only with SX_HAVE_CUDA.
#pragma once

#include <nccl.h>

#include "base/status.h"

namespace sx {
namespace comm {
namespace nccl {

// The entry points the communicator calls, resolved from the library.
struct Api {
    ncclResult_t (*GetVersion)(int *version);
    ncclResult_t (*GetUniqueId)(ncclUniqueId *id);
    ncclResult_t (*CommInitRankConfig)(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t *config);
    ncclResult_t (*CommFinalize)(ncclComm_t comm);
    ncclResult_t (*CommDestroy)(ncclComm_t comm);
    ncclResult_t (*CommAbort)(ncclComm_t comm);
    ncclResult_t (*CommGetAsyncError)(ncclComm_t comm, ncclResult_t *error);
    const char *(*GetErrorString)(ncclResult_t result);
    const char *(*GetLastError)(ncclComm_t comm);
    ncclResult_t (*ReduceScatter)(const void *send, void *recv, size_t recvcount, ncclDataType_t type, ncclRedOp_t op,
                                  ncclComm_t comm, cudaStream_t stream);
    ncclResult_t (*AllGather)(const void *send, void *recv, size_t sendcount, ncclDataType_t type, ncclComm_t comm,
                              cudaStream_t stream);
    ncclResult_t (*AllReduce)(const void *send, void *recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                              ncclComm_t comm, cudaStream_t stream);
    ncclResult_t (*Broadcast)(const void *send, void *recv, size_t count, ncclDataType_t type, int root,
                              ncclComm_t comm, cudaStream_t stream);
    ncclResult_t (*Send)(const void *send, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                         cudaStream_t stream);
    ncclResult_t (*Recv)(void *recv, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                         cudaStream_t stream);
    ncclResult_t (*GroupStart)();
    ncclResult_t (*GroupEnd)();
    int version = 0;  // NCCL_VERSION_CODE of the library, e.g. 22805
};

// The library's entry points, opened once per process. SX_ERR_UNSUPPORTED with the
// loader's words where libnccl.so.2 cannot be opened, lacks one of them, or is older
// than 2.14 (the first with non-blocking communicators). Any thread.
Status load(const Api **out);

}  // namespace nccl
}  // namespace comm
}  // namespace sx
