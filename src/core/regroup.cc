// Regrouping after a lost rank (sx_regroup in sx.h; docs/recovery.md): the ranks still
// alive agree, through the rendezvous store, on who forms the group of the next epoch,
// and each builds that group (a new mesh on the same store, the same params and param
// groups) beside the broken one, which the caller then drops.
//
// Who is in. Each survivor draws an arrival number from the counter
// "regroup/E/arrived" and writes its previous rank under "regroup/E/member/<n>". The
// group closes when the previous world has arrived whole (sx_abort on every rank, or
// a regroup to the same ranks) or, else, when the first survivor's join window ends:
// that survivor (the first to draw "regroup/E/closer") writes how many had arrived
// under "regroup/E/closed", and everyone reads it. A survivor that arrives after the
// group closed is told so and is not in it. New ranks follow the previous ranks'
// order, so the survivors keep their relative places.
//
// The store. Everything goes through the group's key space on the rendezvous; the new
// group's keys are under "e<E>/" inside it. The store must outlive the lost rank: the
// sx-rendezvous command (tcp://HOST:PORT?server=external), file://, or torchrun's agent
// store. With tcp:// served by rank 0, losing rank 0 loses the store, and the survivors'
// regroup fails naming it.
#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "base/log.h"
#include "core/group.h"
#include "rdzv/rendezvous.h"

namespace sx {
namespace core {
namespace {

// The members of epoch `epoch`'s group as the store lists them: their previous ranks in
// order, what each asked to admit, and the memory copies each holds.
Status read_members(rdzv::Store &store, int epoch, int64_t count, Clock::time_point deadline,
                    std::vector<int> *members, std::vector<int> *admits,
                    std::vector<std::vector<CopyHolding>> *holdings) {
    const std::string base = format("regroup/%d/", epoch);
    std::vector<std::pair<int, int>> listed;
    for (int64_t k = 1; k <= count; ++k) {
        std::string value;
        SX_TRY(store.get(base + "member/" + std::to_string(k), &value, time_left(deadline)));
        int previous = -1, admit = 0;
        SX_CHECK(std::sscanf(value.c_str(), "%d %d", &previous, &admit) == 2, SX_ERR_CORRUPT,
                 "the rendezvous store's entry of a member of epoch %d is unreadable: '%s'", epoch, value.c_str());
        listed.push_back({previous, admit});
    }
    std::sort(listed.begin(), listed.end());
    members->clear();
    admits->clear();
    holdings->assign(listed.size(), {});
    for (size_t m = 0; m < listed.size(); ++m) {
        members->push_back(listed[m].first);
        admits->push_back(listed[m].second);
        std::string text;
        SX_TRY(store.get(base + "copies/" + std::to_string(listed[m].first), &text, time_left(deadline)));
        SX_TRY(parse_holdings(text, &(*holdings)[m]));
    }
    return Status::Ok();
}

// The previous ranks of epoch `epoch`'s members, in order (this rank among them, or
// SX_ERR_INVALID_STATE if it came after the group closed), and the memory copies each
// holds (`mine`: this rank's, published before it arrives).
Status agree_members(rdzv::Store &store, int epoch, int rank, int world, const RegroupSpec &spec,
                     const std::vector<CopyHolding> &mine, Clock::time_point deadline, std::vector<int> *members,
                     std::vector<std::vector<CopyHolding>> *holdings) {
    const std::string base = format("regroup/%d/", epoch);
    // The counter first: a store that is gone fails it at once, where a set is retried
    // (the others read the keys below with waits, so their order does not matter).
    int64_t arrival = 0;
    SX_TRY(store.add(base + "arrived", 1, &arrival));
    SX_TRY(store.set(base + "copies/" + std::to_string(rank), describe_holdings(mine)));
    SX_TRY(store.set(base + "member/" + std::to_string(arrival), format("%d %d", rank, spec.admit)));
    const int expected = spec.expected_world_size > 0 ? spec.expected_world_size : world;
    std::string closed;
    Status waited = Status::Ok();
    if (arrival < expected) {
        waited = store.get(base + "closed", &closed, std::min(spec.join_window, time_left(deadline)));
        if (!waited.ok() && waited.code() != SX_ERR_TIMEOUT) return waited;
    }
    if (arrival >= expected || !waited.ok()) {
        // Everyone expected is here, or this survivor's window ended first: close it, once.
        int64_t closer = 0;
        SX_TRY(store.add(base + "closer", 1, &closer));
        if (closer == 1) {
            int64_t count = 0;
            SX_TRY(store.add(base + "arrived", 0, &count));
            SX_TRY(store.set(base + "closed", std::to_string(count)));
        }
        SX_TRY(store.get(base + "closed", &closed, time_left(deadline)));
    }
    const int64_t count = std::stoll(closed);
    SX_CHECK(arrival <= count, SX_ERR_INVALID_STATE,
             "rank %d reached the regroup of epoch %d after the survivors had closed it with %lld of the %d ranks "
             "(they waited %lld ms from the first arrival: options->join_window_ms)",
             rank, epoch, static_cast<long long>(count), world, static_cast<long long>(spec.join_window.count()));
    std::vector<int> admits;
    SX_TRY(read_members(store, epoch, count, deadline, members, &admits, holdings));
    for (size_t m = 0; m < admits.size(); ++m)
        SX_CHECK(admits[m] == spec.admit, SX_ERR_MISMATCH,
                 "the members disagree on how many joining processes to admit (options->admit): %d on rank %d, %d "
                 "on rank %d", admits[m], (*members)[m], spec.admit, rank);
    return Status::Ok();
}

// What a joining process reads in the lobby: where and as what it enters.
struct Admission {
    int epoch = 0, world_size = 0, rank = 0, shard_size = 0, previous_shards = 0;
    int memory_copy_interval = 0;  // the members' (a joiner keeps copies as they do)
    std::string path;  // the new group's key space below the first epoch's
};

std::string describe(const Admission &a) {
    return format("%d %d %d %d %d %d %s", a.epoch, a.world_size, a.rank, a.shard_size, a.previous_shards,
                  a.memory_copy_interval, a.path.c_str());
}

Status parse(const std::string &text, Admission *a) {
    char path[512] = {0};
    SX_CHECK(std::sscanf(text.c_str(), "%d %d %d %d %d %d %511s", &a->epoch, &a->world_size, &a->rank,
                         &a->shard_size, &a->previous_shards, &a->memory_copy_interval, path) == 7,
             SX_ERR_CORRUPT, "the admission in the rendezvous store is unreadable: '%s'", text.c_str());
    a->path = path;
    return Status::Ok();
}

// Calls fn(u, k, from, to, n) for every run of n elements that shard `from_shard` of
// `from` and shard `to_shard` of `to` have in common: state tensor k (0: the values,
// then each slot of slots[u]) of unit u, at element `from` of the one's unit shard
// (tensors one after another) and `to` of the other's. The same order on every rank.
template <typename Fn>
void for_each_overlap(const Layout &from, int from_shard, const Layout &to, int to_shard, const std::vector<int> &slots,
                      Fn fn) {
    for (size_t u = 0; u < to.units().size(); ++u) {
        const uint64_t n_from = from.units()[u].shard_numel, n_to = to.units()[u].shard_numel;
        for (int32_t p : to.units()[u].params) {
            const ShardPiece a = from.piece(p, from_shard), b = to.piece(p, to_shard);
            const uint64_t lo = std::max(a.begin, b.begin), hi = std::min(a.end, b.end);
            if (lo >= hi) continue;
            for (int k = 0; k <= slots[u]; ++k)
                fn(u, k, n_from * k + a.shard_offset + (lo - a.begin), n_to * k + b.shard_offset + (lo - b.begin),
                   hi - lo);
        }
    }
}

}  // namespace

Status ShardGroup::check_regroup(const RegroupSpec &spec) const {
    SX_CHECK(table_.finalized() && !table_.pending(), SX_ERR_INVALID_STATE,
             "sx_regroup needs a finalized group with nothing added since sx_finalize");
    SX_CHECK_ARG(spec.join_window.count() > 0, "the join window %lld ms must be > 0",
                 static_cast<long long>(spec.join_window.count()));
    SX_CHECK_ARG(spec.expected_world_size >= 0 && spec.expected_world_size <= world_size(),
                 "expected_world_size %d is not in [0, the previous world size %d]", spec.expected_world_size,
                 world_size());
    SX_CHECK_ARG(spec.admit >= 0 && spec.admit <= SX_MAX_WORLD_SIZE - world_size(),
                 "admit %d is not in [0, %d]", spec.admit, SX_MAX_WORLD_SIZE - world_size());
    SX_CHECK_ARG(!joining_ || spec.admit == 0, "a joining group admits nobody (admit is %d)", spec.admit);
    return Status::Ok();
}

// A member whose group is sound (a regroup that admits joiners, or shrinks without a
// loss) is at a step boundary: it copies its shard as it is now, so that the new group
// starts from this step where every member is sound (no copy is sent: the members all
// hold theirs). A group without memory copies keeps this one alone.
bool ShardGroup::sound() const {
    // (CPU groups: the copies are exchanged through host memory.)
    return !joining_ && config_.backend != SX_BACKEND_CUDA && check_usable().ok() && !round_->open() &&
           micro_batches_ == 0 && table_.finalized();
}

Status ShardGroup::copy_if_sound() {
    if (!sound()) return Status::Ok();
    if (!copies_) {
        MemoryCopies::Settings cs;
        cs.interval = 1;
        cs.rank = rank();
        cs.world_size = world_size();
        cs.shard = shard_rank();
        copies_.reset(new MemoryCopies(cs, *ops_, nullptr));
    }
    SX_TRY(settle());
    return keep_copy(false);
}

// How many processes wait in the lobby and have not been admitted: rank 0 reads it, and
// every member gets rank 0's count (a joiner arriving meanwhile waits for the next).
Status ShardGroup::poll_joiners(int *waiting) {
    SX_TRY(check_usable());
    SX_TRY(check_finalized());
    SX_TRY(agree_call("sx_poll_joiners", {}));
    int64_t count = 0;
    if (rank() == 0) {
        int64_t arrived = 0, cursor = 0;
        Status s = root_store_->add("lobby/arrived", 0, &arrived);
        if (s.ok()) s = root_store_->add("lobby/cursor", 0, &cursor);
        if (!s.ok()) return fail(s.prefix("reading the processes waiting to join: "));
        count = arrived - cursor;  // (one that gave up meanwhile is not admitted)
    }
    if (world_size() > 1)
        SX_TRY(collective([&](comm::Communicator &c) { return c.broadcast(&count, sizeof count, 0); }));
    *waiting = static_cast<int>(count);
    return Status::Ok();
}

// The members' part of admitting up to `admit` joiners into epoch `epoch`: the claimer
// (new rank 0) claims the next places of the lobby whose joiner has not given up (a claim
// is a counter: the joiner's own claim, as it gives up, and this one exclude each other)
// into *chosen, and says through the store how many it got; every member reads *admitted.
Status ShardGroup::claim_joiners(int epoch, int admit, bool claimer, Clock::time_point deadline,
                                 std::vector<int64_t> *chosen, int *admitted) {
    const std::string key = format("regroup/%d/admitted", epoch);
    if (!claimer) {
        std::string text;
        SX_TRY(mesh_.store().get(key, &text, time_left(deadline)));
        *admitted = std::stoi(text);
        return Status::Ok();
    }
    int64_t cursor = 0, arrived = 0;
    SX_TRY(root_store_->add("lobby/cursor", 0, &cursor));
    SX_TRY(root_store_->add("lobby/arrived", 0, &arrived));
    int64_t k = cursor + 1;
    for (; k <= arrived && static_cast<int>(chosen->size()) < admit; ++k) {
        int64_t claims = 0;
        SX_TRY(root_store_->add(format("lobby/claim/%lld", static_cast<long long>(k)), 1, &claims));
        if (claims == 1) chosen->push_back(k);
    }
    SX_TRY(root_store_->add("lobby/cursor", (k - 1) - cursor, &cursor));
    SX_TRY(mesh_.store().set(key, std::to_string(chosen->size())));
    *admitted = static_cast<int>(chosen->size());
    return Status::Ok();
}

Status ShardGroup::regroup(const RegroupSpec &spec, std::unique_ptr<ShardGroup> *out, RegroupInfo *info) {
    SX_TRY(check_regroup(spec));
    if (joining_) return join(spec, out, info);
    SX_TRACE_SPAN(tracer(), "group", "sx_regroup");
    // The broken group's collectives end now (a survivor may still be inside one), and no
    // later call of this group runs.
    abort();
    const Clock::time_point deadline = Clock::now() + Millis(config_.timeout_ms);
    const int epoch = epoch_ + 1;
    std::vector<int> members;
    std::vector<std::vector<CopyHolding>> holdings;
    std::vector<CopyHolding> mine;
    if (copies_) {
        copies_->finish(spec.join_window);  // a copy still being sent may complete
        mine = copies_->holdings();
    }
    Status s = agree_members(mesh_.store(), epoch, rank(), world_size(), spec, mine, deadline, &members, &holdings);
    if (!s.ok()) {
        return SX_ERROR(s.code(), "the survivors could not agree on the group of epoch %d through the rendezvous %s: "
                        "%s (the store must outlive every rank: the sx-rendezvous command, file:// or torchrun's "
                        "agent store, not rank 0's)",
                        epoch, config_.rendezvous.c_str(), s.message().c_str());
    }
    // The survivors keep their order; the admitted joiners come after them.
    const int new_rank = static_cast<int>(std::find(members.begin(), members.end(), rank()) - members.begin());
    std::vector<int64_t> chosen;
    int admitted = 0;
    if (spec.admit > 0) SX_TRY(claim_joiners(epoch, spec.admit, new_rank == 0, deadline, &chosen, &admitted));
    const int new_world = static_cast<int>(members.size()) + admitted;

    GroupConfig c = config_;
    c.rank = new_rank;
    c.world_size = new_world;
    // A mesh keeps its shard groups' size where the ranks still fill whole shard groups
    // of it; else the new group is flat.
    const bool flat = shard_size() == world_size();
    c.shard_size = !flat && new_world % shard_size() == 0 ? shard_size() : new_world;
    const std::string path = epoch_path_ + format("e%d/", epoch);
    for (int j = 0; j < static_cast<int>(chosen.size()); ++j) {  // each admitted joiner told its place
        Admission a;
        a.epoch = epoch;
        a.world_size = new_world;
        a.rank = static_cast<int>(members.size()) + j;
        a.shard_size = c.shard_size;
        a.previous_shards = shard_size();
        a.memory_copy_interval = config_.memory_copy_interval;
        a.path = path;
        SX_TRY(root_store_->set(format("lobby/admit/%lld", static_cast<long long>(chosen[j])), describe(a)));
    }
    const std::string trace_path = config_.trace_path.empty() ? "" : config_.trace_path + format(".epoch%d", epoch);
    std::shared_ptr<rdzv::Store> store = rdzv::make_prefix_store(root_store_, path);
    std::unique_ptr<ShardGroup> g;
    SX_TRY(assemble(c, trace_path, deadline,
                    [&](std::shared_ptr<rdzv::Store> *opened) {
                        *opened = store;
                        return Status::Ok();
                    },
                    &g));
    g->epoch_ = epoch;
    g->root_store_ = root_store_;
    g->epoch_path_ = path;
    SX_TRY(g->replay_table(*this));
    // The state from the memory copies where every shard of one boundary is still held.
    const CopyChoice choice = choose_copies(holdings, shard_size());
    if (choice.found) {
        SX_TRY(g->restore_copies(layout_, copies_.get(), choice));
        info->from_memory = true;
    } else if (copies_) {
        info->why_not_memory = choice.why_not;
        log(SX_LOG_WARN, "sx: epoch %d: rank %d: the memory copies cannot restore the state: %s", epoch, new_rank,
            choice.why_not.c_str());
    }
    log(SX_LOG_INFO, "sx: epoch %d: rank %d of %d is rank %d of %d (mesh %d x %d)", epoch, rank(), world_size(),
        new_rank, new_world, g->shard_size(), new_world / g->shard_size());
    info->epoch = epoch;
    info->rank = new_rank;
    info->world_size = new_world;
    info->shard_size = g->shard_size();
    info->previous_rank = rank();
    info->previous_world_size = world_size();
    info->members = members;
    *out = std::move(g);
    return Status::Ok();
}

// A joining process enters a running group: it waits in the lobby of the group's first
// key space until the members admit it (sx_poll_joiners, then sx_regroup with
// options->admit), reads where and as which rank, and builds the new group with them;
// its state comes from the members' memory copies as theirs does, or from the checkpoint
// the caller loads.
Status ShardGroup::join(const RegroupSpec &spec, std::unique_ptr<ShardGroup> *out, RegroupInfo *info) {
    (void)spec;
    SX_TRACE_SPAN(tracer(), "group", "sx_regroup (joining)");
    const GroupConfig &jc = join_config_;
    const Millis timeout(jc.timeout_ms);
    rdzv::Rendezvous rv;
    SX_TRY(rdzv::parse_rendezvous(jc.rendezvous.c_str(), 0, 1, &rv));
    SX_TRY(rdzv::apply_rendezvous_guard(jc.rendezvous_token.c_str(), jc.rendezvous_bind.c_str(), &rv));
    rv.joining = true;
    std::shared_ptr<rdzv::Store> root;
    SX_TRY(rdzv::open_store(rv, timeout, &root));
    int64_t place = 0;
    SX_TRY(root->add("lobby/arrived", 1, &place));
    std::string text;
    const std::string admission = format("lobby/admit/%lld", static_cast<long long>(place));
    Status waited = root->get(admission, &text, timeout);
    if (waited.code() == SX_ERR_TIMEOUT) {
        // Giving up: this place is claimed, so that no member admits it later; where a
        // member claimed it first, it was admitted just now.
        int64_t claims = 0;
        SX_TRY(root->add(format("lobby/claim/%lld", static_cast<long long>(place)), 1, &claims));
        if (claims > 1) waited = root->get(admission, &text, timeout);
    }
    if (!waited.ok()) {
        return SX_ERROR(waited.code(), "no member of the group on %s admitted this process within %d ms (the members "
                        "admit the processes waiting with sx_poll_joiners and sx_regroup's options->admit): %s",
                        jc.rendezvous.c_str(), jc.timeout_ms, waited.message().c_str());
    }
    Admission a;
    SX_TRY(parse(text, &a));
    const Clock::time_point deadline = Clock::now() + timeout;
    // The members' list and copies, in the key space of the group they leave.
    const std::string last = format("e%d/", a.epoch);
    SX_CHECK(a.path.size() >= last.size() && a.path.compare(a.path.size() - last.size(), last.size(), last) == 0,
             SX_ERR_CORRUPT, "the admission names the key space '%s', not one of epoch %d", a.path.c_str(), a.epoch);
    std::shared_ptr<rdzv::Store> before = rdzv::make_prefix_store(root, a.path.substr(0, a.path.size() - last.size()));
    std::string closed;
    SX_TRY(before->get(format("regroup/%d/closed", a.epoch), &closed, time_left(deadline)));
    std::vector<int> members, admits;
    std::vector<std::vector<CopyHolding>> holdings;
    SX_TRY(read_members(*before, a.epoch, std::stoll(closed), deadline, &members, &admits, &holdings));

    GroupConfig c = jc;
    c.backend = config_.backend;  // as resolved for this process
    c.rank = a.rank;
    c.world_size = a.world_size;
    c.shard_size = a.shard_size;
    c.memory_copy_interval = a.memory_copy_interval;
    if (c.bind_address.empty() && (rv.scheme == rdzv::Rendezvous::Scheme::kLocal || rv.host == "localhost" ||
                                   rv.host.compare(0, 4, "127.") == 0))
        c.bind_address = "127.0.0.1";
    c.rendezvous_token.clear();
    std::unique_ptr<ShardGroup> g;
    SX_TRY(assemble(c, jc.trace_path, deadline,
                    [&](std::shared_ptr<rdzv::Store> *opened) {
                        *opened = rdzv::make_prefix_store(root, a.path);
                        return Status::Ok();
                    },
                    &g));
    g->epoch_ = a.epoch;
    g->root_store_ = root;
    g->epoch_path_ = a.path;
    SX_TRY(g->replay_table(*this));  // the members' table must be this one (sx_finalize's agreement)
    const CopyChoice choice = choose_copies(holdings, a.previous_shards);
    if (choice.found) {
        Layout old;
        SX_TRY(build_layout(a.previous_shards, &old));
        SX_TRY(g->restore_copies(old, nullptr, choice));
        info->from_memory = true;
    } else {
        info->why_not_memory = choice.why_not;
    }
    log(SX_LOG_INFO, "sx: epoch %d: a joining process is rank %d of %d (mesh %d x %d)", a.epoch, a.rank,
        a.world_size, g->shard_size(), a.world_size / g->shard_size());
    info->epoch = a.epoch;
    info->rank = a.rank;
    info->world_size = a.world_size;
    info->shard_size = g->shard_size();
    info->previous_rank = -1;
    info->previous_world_size = static_cast<int>(members.size());
    info->members = members;
    *out = std::move(g);
    return Status::Ok();
}

// This (new) group takes `from`'s param groups, params (units, dtypes), trainable flags
// and counters, and lays them out (collective: every member does it).
Status ShardGroup::replay_table(const ShardGroup &from) {
    for (const ParamGroup &pg : from.table_.groups()) {
        int32_t index = 0;
        SX_TRY(table_.add_group(pg.hyper, &index));
    }
    for (size_t i = 0; i < from.table_.params().size(); ++i) {
        const ParamSpec &p = from.table_.params()[i];
        int32_t index = 0;
        SX_TRY(table_.add_param(p.name.c_str(), static_cast<int32_t>(p.shape.size()), p.shape.data(), p.dtype,
                                p.group, p.unit, !from.table_.trainable(static_cast<int32_t>(i)), &index));
    }
    scaler_.configure(from.scaler_.settings());
    SX_TRY(finalize());
    for (size_t i = 0; i < from.table_.params().size(); ++i) {
        const ParamSpec &p = from.table_.params()[i];
        ParamSpec &q = table_.params()[i];
        q.step = p.step;
        q.momentum_steps = p.momentum_steps;
        q.mu_product = p.mu_product;
        q.row_var = p.row_var;
        q.col_var = p.col_var;
    }
    for (size_t k = 0; k < from.table_.groups().size(); ++k) table_.groups()[k].steps = from.table_.groups()[k].steps;
    steps_ = from.steps_;
    scaler_.restore(from.scaler_.state());
    return Status::Ok();
}

}  // namespace core
}  // namespace sx

namespace sx {
namespace core {

// Copies out of the live shard at a step boundary (memory_copies.h), holding the fence
// until they are out, so that the next update waits for them.
Status ShardGroup::keep_copy(bool send) {
    SX_TRACE_SPAN(tracer(), "step", "memory_copy");
    SX_TRY(ops_->wait_for(nullptr));
    {
        Status s = units_.ensure_masters();
        if (!s.ok()) return fail(s);
    }
    std::vector<UnitShard> shards;
    for (size_t u = 0; u < units_.size(); ++u) shards.push_back(unit_shard(u));
    std::unique_ptr<ShardFence::Hold> hold(new ShardFence::Hold(fence_));
    copies_->take(std::move(shards), progress(), std::move(hold), send);
    return Status::Ok();
}

// This (new) group's state from the memory copies of the group before, as `choice` says
// (collective): for each shard index of `old`, the layout before, the member holding it
// sends every rank the pieces of it that rank owns now. `copies`: this rank's (null for a
// joining rank, which holds none). Then the params are gathered, as after a load.
Status ShardGroup::restore_copies(const Layout &old, const MemoryCopies *copies, const CopyChoice &choice) {
    SX_TRACE_SPAN(tracer(), "group", "restore_memory_copies");
    const int W = world_size(), S = shard_size(), me = rank();
    // The slots and progress of the copy: every member holds them in its own copy; new
    // rank 0, a member, sends them to all, so that a joining rank has them too.
    std::string packed;
    if (me == 0) {
        const ShardCopy *own = copies ? copies->find(choice.seq, true) : nullptr;
        SX_CHECK(own != nullptr && own->units.size() == units_.size(), SX_ERR_INTERNAL,
                 "rank %d holds no copy %llu of its own shard for %zu units", me,
                 static_cast<unsigned long long>(choice.seq), units_.size());
        packed = pack_progress(own->slots, own->progress);
    }
    if (W > 1) {
        uint64_t bytes = packed.size();
        SX_TRY(collective([&](comm::Communicator &c) { return c.broadcast(&bytes, sizeof bytes, 0); }));
        packed.resize(static_cast<size_t>(bytes));
        SX_TRY(collective([&](comm::Communicator &c) { return c.broadcast(&packed[0], packed.size(), 0); }));
    }
    std::vector<int> slots;
    ShardProgress progress;
    SX_TRY(unpack_progress(packed, &slots, &progress));
    SX_CHECK(slots.size() == units_.size(), SX_ERR_INTERNAL, "the copy has %zu units, the group %zu", slots.size(),
             units_.size());
    // Where each unit's tensors go (host memory: the copies are CPU groups'): the values
    // (fp32 masters of 16-bit units) in place, each state slot into a new buffer that a
    // restore then swaps in with the progress.
    SX_CHECK(ops_->device() == SX_DEVICE_CPU, SX_ERR_UNSUPPORTED, "memory copies restore CPU groups only");
    Status s = units_.ensure_masters();  // valid from here: the values below replace them
    std::vector<std::array<Buffer, 3>> state(units_.size());
    std::vector<std::array<float *, 4>> into(units_.size());
    for (size_t u = 0; u < units_.size() && s.ok(); ++u) {
        const uint64_t n = layout_.units()[u].shard_numel;
        into[u][0] = unit_shard(u).values;
        if (n == 0) continue;  // no piece lies in it
        for (int k = 0; k < slots[u] && s.ok(); ++k) {
            s = ops_->allocate(n * sizeof(float), "optimizer state restored from memory copies", &state[u][k]);
            into[u][k + 1] = state[u][k].as<float>();
        }
    }
    if (!s.ok()) return fail(s);
    for (int i = 0; i < static_cast<int>(choice.provider.size()); ++i) {
        const int root = choice.provider[i];  // a member's index is its new rank
        const ShardCopy *src = me == root && copies ? copies->find(choice.seq, choice.provider_own[i]) : nullptr;
        SX_CHECK(me != root || (src != nullptr && src->shard == i), SX_ERR_INTERNAL,
                 "rank %d was chosen to send shard %d of copy %llu, which it does not hold", me, i,
                 static_cast<unsigned long long>(choice.seq));
        std::vector<comm::Piece> mine;
        std::vector<std::vector<comm::Piece>> theirs(me == root ? static_cast<size_t>(W) : 0);
        for (int r = 0; r < W; ++r) {
            if (r != me && me != root) continue;
            const std::vector<UnitLayout> &to_units = layout_.units();
            for_each_overlap(old, i, layout_, r % S, slots,
                             [&](size_t u, int k, uint64_t at_from, uint64_t at_to, uint64_t n) {
                                 const uint64_t n_to = to_units[u].shard_numel;
                                 float *to = into[u][k] + (at_to - static_cast<uint64_t>(k) * n_to);
                                 const float *there = src ? src->units[u].data() + at_from : nullptr;
                                 if (r == me && me == root)
                                     std::memcpy(to, there, n * sizeof(float));
                                 else if (r == me)
                                     mine.push_back({to, n * sizeof(float)});
                                 else
                                     theirs[r].push_back({const_cast<float *>(there), n * sizeof(float)});
                             });
        }
        if (W > 1) SX_TRY(collective([&](comm::Communicator &c) { return c.scatter_pieces(theirs, mine, root); }));
    }
    ShardRestore r;
    r.state = &state;
    r.slots = slots;
    r.progress = &progress;
    SX_TRY(restore_shard(r));
    return gather_params();
}

}  // namespace core
}  // namespace sx
