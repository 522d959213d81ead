// Entry points: saving and loading checkpoints, futures, the user blob.
#include <unistd.h>

#include <chrono>

#include "api/guard.h"
#include "api/handles.h"
#include "ckpt/directory.h"
#include "io/file_ops.h"

using sx::Status;
using sx::api::guard;
using sx::api::resolve;

namespace sx {
namespace api {

sx::ckpt::Checkpointer &checkpointer_of(sx_shard_group_t *group) {
    if (!group->checkpointer)
        group->checkpointer.reset(new sx::ckpt::Checkpointer(group->impl.get(), sx::io::posix_file_ops()));
    return *group->checkpointer;
}

Status load_options(const char *path, uint32_t flags, const char *what, sx::ckpt::LoadOptions *out) {
    const uint32_t known = SX_LOAD_PARAMS_ONLY | SX_LOAD_ALLOW_MISSING | SX_LOAD_ALLOW_EXTRA;
    SX_CHECK_ARG((flags & ~known) == 0, "%s has unknown bits 0x%x", what, flags & ~known);
    out->path = path;
    out->params_only = (flags & SX_LOAD_PARAMS_ONLY) != 0;
    out->allow_missing = (flags & SX_LOAD_ALLOW_MISSING) != 0;
    out->allow_extra = (flags & SX_LOAD_ALLOW_EXTRA) != 0;
    return Status::Ok();
}

}  // namespace api
}  // namespace sx

using sx::api::checkpointer_of;

extern "C" {

SX_API sx_status_t sx_save_options_init(sx_save_options_t *options, size_t size) {
    return guard(__func__, [&] {
        sx_save_options_t o;
        std::memset(&o, 0, sizeof o);
        return sx::api::init_struct(options, size, o, "options");
    });
}

SX_API sx_status_t sx_save_optim_state(sx_shard_group_t *group, const sx_save_options_t *options,
                                       sx_future_t **out) {
    return guard(__func__, [&]() -> Status {
        sx::core::ShardGroup *g;
        SX_TRY(resolve(group, &g));
        SX_CHECK_ARG(out != nullptr, "out is NULL");
        sx_save_options_t o;
        std::memset(&o, 0, sizeof o);
        SX_TRY(sx::api::read_input(options, "options", offsetof(sx_save_options_t, path) + sizeof(char *), &o));
        SX_CHECK_ARG(o.path != nullptr && o.path[0] != '\0', "options->path is empty");
        SX_CHECK_ARG(o.user_blob != nullptr || o.user_blob_size == 0,
                     "options->user_blob is NULL but options->user_blob_size is %llu",
                     static_cast<unsigned long long>(o.user_blob_size));
        SX_CHECK_ARG(o.user_blob_size <= sx::ckpt::kMaxUserBlobBytes,
                     "options->user_blob_size is %llu; at most %llu bytes",
                     static_cast<unsigned long long>(o.user_blob_size),
                     static_cast<unsigned long long>(sx::ckpt::kMaxUserBlobBytes));
        SX_CHECK_ARG(o.keep_last >= 0, "options->keep_last is %d; it must be >= 0", o.keep_last);
        SX_CHECK_ARG(o.synchronous == 0 || o.synchronous == 1, "options->synchronous is %d; it must be 0 or 1",
                     o.synchronous);
        sx::ckpt::SaveOptions so;
        so.path = o.path;
        if (o.user_blob_size) so.user_blob.assign(static_cast<const char *>(o.user_blob), o.user_blob_size);
        so.keep_last = o.keep_last;

        std::unique_ptr<sx_future> f(new sx_future());
        f->magic = sx::api::kFutureMagic;
        f->owner = ::getpid();
        sx_future *handle = f.get();
        sx::ckpt::SaveFuture::Callback cb;
        if (o.callback) {
            const sx_future_callback fn = o.callback;
            void *user = o.callback_user;
            cb = [fn, user, handle](const Status &s) { fn(handle, s.code(), user); };
        }
        sx::ckpt::Checkpointer &ck = checkpointer_of(group);
        if (o.synchronous) {
            // An invalid call fails here, as an asynchronous one does; the save's own
            // outcome is the future's.
            Status outcome;
            SX_TRY(ck.save_checked(so, &outcome));
            f->impl = std::make_shared<sx::ckpt::SaveFuture>(std::move(cb));
            sx::api::register_handle(handle);
            f->impl->complete(outcome);
        } else {
            SX_TRY(ck.save_async(so, std::move(cb), &f->impl));
            sx::api::register_handle(handle);
        }
        *out = f.release();
        return Status::Ok();
    });
}

SX_API sx_status_t sx_future_poll(const sx_future_t *future, int32_t *done) {
    return guard(__func__, [&]() -> Status {
        SX_TRY(sx::api::resolve_future(future));
        SX_CHECK_ARG(done != nullptr, "done is NULL");
        *done = future->impl->done() ? 1 : 0;
        return Status::Ok();
    });
}

SX_API sx_status_t sx_future_wait(sx_future_t *future, int64_t timeout_ms) {
    return guard(__func__, [&]() -> Status {
        SX_TRY(sx::api::resolve_future(future));
        if (!future->impl->wait(std::chrono::milliseconds(timeout_ms < 0 ? -1 : timeout_ms)))
            return SX_ERROR(SX_ERR_TIMEOUT, "the operation is still running after %lld ms",
                            static_cast<long long>(timeout_ms));
        return future->impl->status();
    });
}

SX_API sx_status_t sx_future_wait_staged(sx_future_t *future, int64_t timeout_ms) {
    return guard(__func__, [&]() -> Status {
        SX_TRY(sx::api::resolve_future(future));
        if (!future->impl->wait_staged(std::chrono::milliseconds(timeout_ms < 0 ? -1 : timeout_ms)))
            return SX_ERROR(SX_ERR_TIMEOUT, "the snapshot is still being copied after %lld ms",
                            static_cast<long long>(timeout_ms));
        return Status::Ok();
    });
}

SX_API sx_status_t sx_future_cancel(sx_future_t *future) {
    return guard(__func__, [&]() -> Status {
        SX_TRY(sx::api::resolve_future(future));
        future->impl->request_cancel();
        return Status::Ok();
    });
}

SX_API const char *sx_future_error_message(const sx_future_t *future) {
    if (!sx::api::resolve_future(future).ok()) return "";
    sx_future *f = const_cast<sx_future *>(future);
    if (!f->impl->done()) return "";
    const Status s = f->impl->status();
    f->message = s.ok() ? std::string() : s.message();
    return f->message.c_str();
}

SX_API sx_status_t sx_future_progress(const sx_future_t *future, uint64_t *done_bytes, uint64_t *total_bytes) {
    return guard(__func__, [&]() -> Status {
        SX_TRY(sx::api::resolve_future(future));
        SX_CHECK_ARG(done_bytes != nullptr, "done_bytes is NULL");
        SX_CHECK_ARG(total_bytes != nullptr, "total_bytes is NULL");
        *done_bytes = future->impl->done_bytes();
        *total_bytes = future->impl->total_bytes();
        return Status::Ok();
    });
}

SX_API sx_status_t sx_future_destroy(sx_future_t *future) {
    return guard(__func__, [&]() -> Status {
        if (future == nullptr) return Status::Ok();
        if (sx::api::handle_live(future) && future->magic == sx::api::kFutureMagic &&
            sx::api::forked_from(future->owner)) {
            sx::api::unregister_handle(future);  // a fork's: forgotten (handles.h), never waited for
            sx::api::forget_in_fork(std::move(future->impl));
            future->magic = 0;
            delete future;
            return Status::Ok();
        }
        SX_TRY(sx::api::resolve_future(future));
        future->impl->wait(std::chrono::milliseconds(-1));
        sx::api::unregister_handle(future);
        future->magic = 0;
        delete future;
        return Status::Ok();
    });
}

SX_API sx_status_t sx_load_optim_state_options_init(sx_load_options_t *options, size_t size) {
    return guard(__func__, [&] {
        sx_load_options_t o;
        std::memset(&o, 0, sizeof o);
        return sx::api::init_struct(options, size, o, "options");
    });
}

SX_API sx_status_t sx_load_optim_state(sx_shard_group_t *group, const sx_load_options_t *options) {
    return guard(__func__, [&]() -> Status {
        sx::core::ShardGroup *g;
        SX_TRY(resolve(group, &g));
        sx_load_options_t o;
        std::memset(&o, 0, sizeof o);
        SX_TRY(sx::api::read_input(options, "options", offsetof(sx_load_options_t, path) + sizeof(char *), &o));
        SX_CHECK_ARG(o.path != nullptr && o.path[0] != '\0', "options->path is empty");
        sx::ckpt::LoadOptions lo;
        SX_TRY(sx::api::load_options(o.path, o.flags, "options->flags", &lo));
        SX_CHECK_ARG(o.reserved0 == 0, "options->reserved0 is %d; it must be 0", o.reserved0);
        return checkpointer_of(group).load(lo, nullptr);
    });
}

SX_API sx_status_t sx_read_user_blob(const char *path, void *buf, uint64_t capacity, uint64_t *size) {
    return guard(__func__, [&]() -> Status {
        SX_CHECK_ARG(path != nullptr && path[0] != '\0', "path is empty");
        SX_CHECK_ARG(size != nullptr, "size is NULL");
        SX_CHECK_ARG(buf != nullptr || capacity == 0, "buf is NULL but capacity is %llu",
                     static_cast<unsigned long long>(capacity));
        std::string blob;
        SX_TRY(sx::ckpt::read_user_blob(*sx::io::posix_file_ops(), path, &blob));
        *size = blob.size();
        SX_CHECK_ARG(capacity >= blob.size(), "the user blob has %zu bytes; capacity is %llu", blob.size(),
                     static_cast<unsigned long long>(capacity));
        if (!blob.empty()) std::memcpy(buf, blob.data(), blob.size());
        return Status::Ok();
    });
}

}  // extern "C"
