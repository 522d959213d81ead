// Entry points: the survivors of a lost rank regroup (sx_regroup; docs/recovery.md).
#include <cstring>

#include "api/guard.h"
#include "api/handles.h"
#include "ckpt/directory.h"
#include "io/file_ops.h"
#include "recovery/recovery.h"

using sx::Status;
using sx::api::guard;
using sx::api::resolve;

namespace {

// What sx_regroup decided, into the caller's result.
void write_result(const sx::recovery::RegroupInfo &info, uint64_t step, sx_regroup_result_t *result) {
    sx_regroup_result_t r;
    std::memset(&r, 0, sizeof r);
    r.struct_size = sizeof r;
    r.epoch = info.epoch;
    r.rank = info.rank;
    r.world_size = info.world_size;
    r.shard_size = info.shard_size;
    r.previous_rank = info.previous_rank;
    r.previous_world_size = info.previous_world_size;
    r.step = step;
    r.from_memory = info.from_memory ? 1 : 0;
    sx::api::write_output(result, r);
}

}  // namespace

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
        sx::recovery::Recovery recovery(*g);
        // Without a checkpoint the state must come from memory: copies kept (of this group
        // or of those before it), or the shards of a sound group (one that admits joiners),
        // or the members' (a joining group).
        SX_CHECK_ARG(have_checkpoint || recovery.joining() || recovery.sound() || recovery.holds_copies(),
                     "options->checkpoint is empty, and the group keeps no memory copies "
                     "(config->memory_copy_interval): the lost ranks' shards exist nowhere else");
        sx::ckpt::LoadOptions lo;
        if (have_checkpoint) SX_TRY(sx::api::load_options(o.checkpoint, o.load_flags, "options->load_flags", &lo));
        SX_CHECK_ARG(o.join_window_ms >= 0, "options->join_window_ms is %d; it must be >= 0 (0 = 1000 ms)",
                     o.join_window_ms);
        SX_CHECK_ARG(o.admit >= 0, "options->admit is %d; it must be >= 0", o.admit);
        sx::recovery::RegroupSpec spec;
        spec.join_window = sx::Millis(o.join_window_ms == 0 ? 1000 : o.join_window_ms);
        spec.expected_world_size = o.expected_world_size;
        spec.admit = o.admit;
        spec.have_checkpoint = have_checkpoint;

        SX_TRY(recovery.check_regroup(spec));
        if (have_checkpoint) {
            // A checkpoint that cannot be loaded is refused before the group breaks up.
            sx::ckpt::Manifest manifest;
            SX_TRY(sx::ckpt::check_checkpoint_name(o.checkpoint, "load"));
            SX_TRY(sx::ckpt::read_manifest(*sx::io::posix_file_ops(), o.checkpoint, &manifest));
        }
        SX_TRY(recovery.copy_if_sound());
        // The broken group's calls end now; a save in flight ends within a fraction of a
        // second (aborted: it commits nothing), and its checkpointer goes, as it reads the
        // broken group.
        g->abort();
        group->checkpointer.reset();
        std::unique_ptr<sx::core::RecoveryAccess> formed;
        sx::recovery::RegroupInfo info;
        SX_TRY(recovery.regroup(spec, &formed, &info));
        // A group forms groups of its own kind: the handle's is a ShardGroup.
        std::unique_ptr<sx::core::ShardGroup> fresh(dynamic_cast<sx::core::ShardGroup *>(formed.get()));
        SX_CHECK(fresh != nullptr, SX_ERR_INTERNAL, "the regroup formed a group of another kind");
        formed.release();
        // The new group replaces the broken one only with its state: where it did not come
        // from the memory copies, the checkpoint's is loaded into it first.
        std::unique_ptr<sx::ckpt::Checkpointer> ck(
            new sx::ckpt::Checkpointer(fresh.get(), sx::io::posix_file_ops()));
        Status loaded = info.from_memory ? Status::Ok() : ck->load(lo, nullptr);
        if (!loaded.ok()) {
            fresh->abort();  // its peers' load fails at once, if it has not yet
            return SX_ERROR(loaded.code(), "the survivors formed the group of epoch %d (this rank would be %d of %d), "
                            "but loading %s into it failed: %s; the group is still the broken one: call sx_regroup "
                            "again (it tries epoch %d)",
                            info.epoch, info.rank, info.world_size, o.checkpoint, loaded.message().c_str(),
                            info.epoch + 1);
        }
        group->impl = std::move(fresh);  // the broken group goes: its threads and connections end
        group->checkpointer = std::move(ck);
        if (result != nullptr) write_result(info, group->impl->steps_taken(), result);
        return Status::Ok();
    });
}

SX_API sx_status_t sx_get_lost_ranks(const sx_shard_group_t *group, int32_t *ranks, int32_t capacity,
                                     int32_t *count) {
    return guard(__func__, [&]() -> Status {
        sx::core::ShardGroup *g;
        SX_TRY(resolve(group, &g));
        SX_CHECK_ARG(count != nullptr, "count is NULL");
        SX_CHECK_ARG(capacity >= 0, "capacity is %d; it must be >= 0", capacity);
        SX_CHECK_ARG(ranks != nullptr || capacity == 0, "ranks is NULL but capacity is %d", capacity);
        const std::vector<int> lost = sx::recovery::Recovery(*g).lost_ranks();
        for (size_t k = 0; k < lost.size() && k < static_cast<size_t>(capacity); ++k) ranks[k] = lost[k];
        *count = static_cast<int32_t>(lost.size());
        return Status::Ok();
    });
}

SX_API sx_status_t sx_poll_joiners(sx_shard_group_t *group, int32_t *waiting) {
    return guard(__func__, [&]() -> Status {
        sx::core::ShardGroup *g;
        SX_TRY(resolve(group, &g));
        SX_CHECK_ARG(waiting != nullptr, "waiting is NULL");
        int count = 0;
        SX_TRY(sx::recovery::Recovery(*g).poll_joiners(&count));
        *waiting = count;
        return Status::Ok();
    });
}

}  // extern "C"
