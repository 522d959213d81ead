#include "comm/nccl/nccl_api.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <string>

namespace sx {
namespace comm {
namespace nccl {
namespace {

template <typename F>
bool resolve(void *lib, const char *name, F *out, std::string *missing) {
    *out = reinterpret_cast<F>(dlsym(lib, name));
    if (*out == nullptr && missing->empty()) *missing = name;
    return *out != nullptr;
}

Status open_library(Api *api) {
    const char *env = std::getenv("NCCL_LIBRARY");
    const std::string file = env && *env ? env : "libnccl.so.2";
    // RTLD_LOCAL: NCCL's symbols stay out of the global namespace of the trainer,
    // which may load a different NCCL itself (through torch, for instance).
    void *lib = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
        const char *why = dlerror();
        return SX_ERROR(SX_ERR_UNSUPPORTED, "cannot open NCCL (%s): %s; install NCCL or set NCCL_LIBRARY to its path",
                        file.c_str(), why ? why : "unknown error");
    }
    std::string missing;
    resolve(lib, "ncclGetVersion", &api->GetVersion, &missing);
    resolve(lib, "ncclGetUniqueId", &api->GetUniqueId, &missing);
    resolve(lib, "ncclCommInitRankConfig", &api->CommInitRankConfig, &missing);
    resolve(lib, "ncclCommFinalize", &api->CommFinalize, &missing);
    resolve(lib, "ncclCommDestroy", &api->CommDestroy, &missing);
    resolve(lib, "ncclCommAbort", &api->CommAbort, &missing);
    resolve(lib, "ncclCommGetAsyncError", &api->CommGetAsyncError, &missing);
    resolve(lib, "ncclGetErrorString", &api->GetErrorString, &missing);
    resolve(lib, "ncclGetLastError", &api->GetLastError, &missing);
    resolve(lib, "ncclReduceScatter", &api->ReduceScatter, &missing);
    resolve(lib, "ncclAllGather", &api->AllGather, &missing);
    resolve(lib, "ncclAllReduce", &api->AllReduce, &missing);
    resolve(lib, "ncclBroadcast", &api->Broadcast, &missing);
    resolve(lib, "ncclSend", &api->Send, &missing);
    resolve(lib, "ncclRecv", &api->Recv, &missing);
    resolve(lib, "ncclGroupStart", &api->GroupStart, &missing);
    resolve(lib, "ncclGroupEnd", &api->GroupEnd, &missing);
    if (!missing.empty()) {
        dlclose(lib);
        return SX_ERROR(SX_ERR_UNSUPPORTED, "%s lacks %s; sx needs NCCL 2.14 or newer", file.c_str(), missing.c_str());
    }
    if (api->GetVersion(&api->version) != ncclSuccess || api->version < 21400) {
        const int v = api->version;
        dlclose(lib);
        return SX_ERROR(SX_ERR_UNSUPPORTED, "%s is NCCL version code %d; sx needs 2.14 or newer (non-blocking "
                        "communicators)", file.c_str(), v);
    }
    return Status::Ok();  // the library stays open for the life of the process
}

}  // namespace

Status load(const Api **out) {
    static std::once_flag once;
    static Api api;
    static Status status;
    std::call_once(once, [] { status = open_library(&api); });
    if (!status.ok()) return status;
    *out = &api;
    return Status::Ok();
}

}  // namespace nccl
}  // namespace comm
}  // namespace sx
