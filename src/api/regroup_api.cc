// Entry points: the survivors of a lost rank regroup (sx_regroup; docs/recovery.md).
#include <cstring>

#include "api/guard.h"
#include "api/handles.h"
#include "ckpt/directory.h"
#include "io/file_ops.h"

using sx::Status;
using sx::api::guard;
using sx::api::resolve;

extern "C" {

SX_API sx_status_t sx_regroup_options_init(sx_regroup_options_t *options, size_t size) {
    return guard(__func__, [&] {
        sx_regroup_options_t o;
        std::memset(&o, 0, sizeof o);
        return sx::api::init_struct(options, size, o, "options");
    });
}

SX_API sx_status_t sx_regroup_result_init(sx_regroup_result_t *result, size_t size) {
    return guard(__func__, [&] {
        sx_regroup_result_t r;
        std::memset(&r, 0, sizeof r);
        return sx::api::init_struct(result, size, r, "result");
    });
}

SX_API sx_status_t sx_regroup(sx_shard_group_t *group, const sx_regroup_options_t *options,
                              sx_regroup_result_t *result) {
    return guard(__func__, [&]() -> Status {
        sx::core::ShardGroup *g;
        SX_TRY(resolve(group, &g));
        sx_regroup_options_t o;
        std::memset(&o, 0, sizeof o);
        SX_TRY(sx::api::read_input(options, "options", offsetof(sx_regroup_options_t, checkpoint) + sizeof(char *),
                                   &o));
        if (result != nullptr) SX_TRY(sx::api::check_output(result, "result"));
        const bool have_checkpoint = o.checkpoint != nullptr && o.checkpoint[0] != '\0';
        // Without a checkpoint the state must come from memory: copies kept, or the shards
        // of a sound group (one that admits joiners), or the members' (a joining group).
        SX_CHECK_ARG(have_checkpoint || g->joining() || g->sound() || g->config().memory_copy_interval > 0,
                     "options->checkpoint is empty, and the group keeps no memory copies "
                     "(config->memory_copy_interval): the lost ranks' shards exist nowhere else");
        sx::ckpt::LoadOptions lo;
        if (have_checkpoint) SX_TRY(sx::api::load_options(o.checkpoint, o.load_flags, "options->load_flags", &lo));
        SX_CHECK_ARG(o.join_window_ms >= 0, "options->join_window_ms is %d; it must be >= 0 (0 = 1000 ms)",
                     o.join_window_ms);
        SX_CHECK_ARG(o.admit >= 0, "options->admit is %d; it must be >= 0", o.admit);
        sx::core::RegroupSpec spec;
        spec.join_window = sx::Millis(o.join_window_ms == 0 ? 1000 : o.join_window_ms);
        spec.expected_world_size = o.expected_world_size;
        spec.admit = o.admit;

        SX_TRY(g->check_regroup(spec));
        if (have_checkpoint) {
            // A checkpoint that cannot be loaded is refused before the group breaks up.
            sx::ckpt::Manifest manifest;
            SX_TRY(sx::ckpt::check_checkpoint_name(o.checkpoint, "load"));
            SX_TRY(sx::ckpt::read_manifest(*sx::io::posix_file_ops(), o.checkpoint, &manifest));
        }
        SX_TRY(g->copy_if_sound());
        // The broken group's calls end now; a save in flight ends within a fraction of a
        // second (aborted: it commits nothing), and its checkpointer goes, as it reads the
        // broken group.
        g->abort();
        group->checkpointer.reset();
        std::unique_ptr<sx::core::ShardGroup> fresh;
        sx::core::RegroupInfo info;
        SX_TRY(g->regroup(spec, &fresh, &info));
        group->impl = std::move(fresh);  // the broken group goes: its threads and connections end
        if (!info.from_memory && !have_checkpoint) {
            return SX_ERROR(SX_ERR_NOT_FOUND, "the survivors formed the group of epoch %d (this rank is %d of %d), but "
                            "its state cannot come from the memory copies (%s) and options->checkpoint is empty; its "
                            "state is zero: load a checkpoint before stepping",
                            info.epoch, info.rank, info.world_size, info.why_not_memory.c_str());
        }
        Status loaded = info.from_memory ? Status::Ok() : sx::api::checkpointer_of(group).load(lo, nullptr);
        if (!loaded.ok()) {
            return SX_ERROR(loaded.code(), "the survivors formed the group of epoch %d (this rank is %d of %d), but "
                            "loading %s into it failed: %s; its state is zero: load a checkpoint before stepping",
                            info.epoch, info.rank, info.world_size, o.checkpoint, loaded.message().c_str());
        }
        if (result != nullptr) {
            sx_regroup_result_t r;
            std::memset(&r, 0, sizeof r);
            r.struct_size = sizeof r;
            r.epoch = info.epoch;
            r.rank = info.rank;
            r.world_size = info.world_size;
            r.shard_size = info.shard_size;
            r.previous_rank = info.previous_rank;
            r.previous_world_size = info.previous_world_size;
            r.step = group->impl->steps_taken();
            r.from_memory = info.from_memory ? 1 : 0;
            sx::api::write_output(result, r);
        }
        return Status::Ok();
    });
}

SX_API sx_status_t sx_poll_joiners(sx_shard_group_t *group, int32_t *waiting) {
    return guard(__func__, [&]() -> Status {
        sx::core::ShardGroup *g;
        SX_TRY(resolve(group, &g));
        SX_CHECK_ARG(waiting != nullptr, "waiting is NULL");
        int count = 0;
        SX_TRY(g->poll_joiners(&count));
        *waiting = count;
        return Status::Ok();
    });
}

}  // extern "C"
