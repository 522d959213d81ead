// Regrouping after a lost rank (sx_regroup in sx.h; docs/recovery.md): the ranks still
// alive agree, through the rendezvous store, on who forms the group of the next epoch,
// and each builds that group (a new mesh on the same store, the same params and param
// groups) beside the broken one, which the caller then drops.
//
// Epochs. Every try is an epoch of its own: a regroup that fails (a second loss inside
// it, a joiner that broke it, no state to restore) leaves its epoch behind, and the next
// try on the same handle is the epoch after the last one tried. A survivor whose try
// formed a group and one whose try failed meet again at the same next epoch.
//
// Who is in. Each survivor draws an arrival number from the counter
// "regroup/E/arrived" and says under "regroup/E/member/<n>" who it is: its identity
// (kept across regroups: its first rank, or its place in the lobby for a process that
// joined), its rank and group (epoch, size, mesh), the hash of the identities of that
// group's ranks (themselves under "regroup/E/group/<hash>", once per group) and those of
// them it knows to have exited (a process watched through shared memory); those it learns
// of later go under "regroup/E/lost/<n>" (n from "regroup/E/lost-reports"). The first
// survivor to arrive (arrival 1) reads each of these keys once and decides when the group
// closes; the others wait, and take its part over where its beat stands still for 3 s.
// The group closes once this many have arrived where the caller said how many to expect
// (options->expected_world_size), else once every rank of the arrived survivors' groups
// has arrived or is known to have exited, and at the latest when the first survivor's
// join window ends, unless a survivor not yet arrived still beats (a survivor inside
// sx_regroup says so every 200 ms, so that one still failing out of an earlier try is
// waited for, up to the timeout, instead of being left to form a group of its own): the
// survivor that finds it complete (the first to draw "regroup/E/closer") writes how many
// had arrived under "regroup/E/closed", then every member's entry and copies as one table
// ("regroup/E/table"), which every survivor (and a joiner) reads once: each one's work
// grows as W at most, and all of theirs together too, not as W^2. A survivor that arrives after the group closed is told who formed it and is
// not in it. New ranks follow the identities' order, so the survivors keep their
// relative places and the admitted joiners come after them.
//
// The state. Before anything is built the survivors choose, from what each says it holds
// (regroup/E/copies/<identity>), the newest memory copy of which every shard is held; where
// there is none and the caller has no checkpoint to load, every survivor fails here, at
// once, and nothing is built. A handle's group changes only when a regroup succeeds.
//
// The store. Everything goes through the key space of the group's first epoch on the
// rendezvous (the lobby, every regroup's agreement); the group of epoch E has its keys
// under "eE/" inside it. The store must outlive the lost rank: the sx-rendezvous command
// (tcp://HOST:PORT?server=external), file://, or torchrun's agent store. With tcp://
// served by rank 0, losing rank 0 loses the store, and the survivors' regroup fails
// naming it.
#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <sstream>
#include <string>
#include <vector>

#include "base/log.h"
#include "rdzv/rendezvous.h"
#include "recovery/agreement.h"
#include "recovery/recovery.h"
#include "recovery/restore.h"

namespace sx {
namespace recovery {

using namespace core;

namespace {

// A process that joined has an identity above every first rank.
constexpr uint64_t kJoinerIds = uint64_t(1) << 32;

std::string join_ids(const std::vector<uint64_t> &ids) {
    std::string out;
    for (uint64_t id : ids) out += format(" %llu", static_cast<unsigned long long>(id));
    return out;
}

// FNV-1a of a group's ranks' identities, as written.
uint64_t group_hash(const std::string &ids) {
    uint64_t h = 1469598103934665603ull;
    for (unsigned char c : ids) h = (h ^ c) * 1099511628211ull;
    return h;
}

std::string group_key(int epoch, uint64_t hash) {
    return format("regroup/%d/group/%016llx", epoch, static_cast<unsigned long long>(hash));
}

std::vector<uint64_t> parse_ids(const std::string &text) {
    std::vector<uint64_t> ids;
    std::istringstream in(text);
    for (unsigned long long v; in >> v;) ids.push_back(v);
    return ids;
}

std::string describe(const Arrival &a) {
    return format("%llu %d %d %d %d %d;%016llx;%s", static_cast<unsigned long long>(a.id), a.rank, a.admit, a.epoch,
                  a.world, a.shard_size, static_cast<unsigned long long>(a.group), join_ids(a.lost).c_str());
}

Status parse(const std::string &text, Arrival *a) {
    std::istringstream in(text);
    std::string head, group, lost;
    std::getline(in, head, ';');
    std::getline(in, group, ';');
    std::getline(in, lost, ';');
    unsigned long long id = 0, hash = 0;
    SX_CHECK(std::sscanf(head.c_str(), "%llu %d %d %d %d %d", &id, &a->rank, &a->admit, &a->epoch, &a->world,
                         &a->shard_size) == 6 &&
                 std::sscanf(group.c_str(), "%llx", &hash) == 1,
             SX_ERR_CORRUPT, "the rendezvous store's entry of a survivor is unreadable: '%s'", text.c_str());
    a->id = id;
    a->group = hash;
    a->members.clear();
    a->lost = parse_ids(lost);
    return Status::Ok();
}

std::string ranks_of(const std::vector<Arrival> &arrivals) {
    std::string out;
    for (const Arrival &a : arrivals)
        out += format("%s%d (epoch %d)", out.empty() ? "" : ", ", a.rank, a.epoch);
    return out.empty() ? "none" : out;
}

// The entries of epoch `epoch`'s arrivals from out->size() + 1 to `count`, appended in
// arrival order (an entry does not change once written).
Status read_arrivals(rdzv::Store &store, int epoch, int64_t count, Clock::time_point deadline,
                     std::vector<Arrival> *out) {
    for (int64_t k = static_cast<int64_t>(out->size()) + 1; k <= count; ++k) {
        std::string value;
        SX_TRY(store.get(format("regroup/%d/member/%lld", epoch, static_cast<long long>(k)), &value,
                         time_left(deadline)));
        out->emplace_back();
        SX_TRY(parse(value, &out->back()));
    }
    return Status::Ok();
}

// What a survivor has read of an epoch's agreement so far, each key once: the arrivals'
// entries, their groups' ranks, and the reports of survivors lost since ("regroup/E/lost/<n>",
// numbered by the counter "regroup/E/lost-reports").
struct Arrived {
    std::vector<Arrival> arrivals;                     // in arrival order
    std::map<uint64_t, std::vector<uint64_t>> groups;  // each group's ranks, by their hash
    std::set<uint64_t> lost;                           // identities known to have exited
    int64_t reports = 0;                               // lost reports read

    // Reads what came since the last call: the first `count` arrivals' entries in all.
    Status update(rdzv::Store &store, int epoch, int64_t count, Clock::time_point deadline) {
        const size_t before = arrivals.size();
        SX_TRY(read_arrivals(store, epoch, count, deadline, &arrivals));
        for (size_t k = before; k < arrivals.size(); ++k) {
            lost.insert(arrivals[k].lost.begin(), arrivals[k].lost.end());
            if (groups.count(arrivals[k].group)) continue;
            std::string text;
            SX_TRY(store.get(group_key(epoch, arrivals[k].group), &text, time_left(deadline)));
            groups[arrivals[k].group] = parse_ids(text);
        }
        int64_t n = 0;
        SX_TRY(store.add(format("regroup/%d/lost-reports", epoch), 0, &n));
        for (; reports < n; ++reports) {
            std::string text;
            SX_TRY(store.get(format("regroup/%d/lost/%lld", epoch, static_cast<long long>(reports + 1)), &text,
                             time_left(deadline)));
            for (uint64_t id : parse_ids(text)) lost.insert(id);
        }
        return Status::Ok();
    }

    // The ranks of the arrived survivors' groups (identities) that have neither arrived nor
    // are known to have exited: the group is complete when there is none.
    std::vector<uint64_t> pending() const {
        std::set<uint64_t> known(lost), everyone;
        for (const Arrival &a : arrivals) {
            known.insert(a.id);
            const std::vector<uint64_t> &ranks = groups.at(a.group);
            everyone.insert(ranks.begin(), ranks.end());
        }
        std::vector<uint64_t> out;
        for (uint64_t id : everyone)
            if (!known.count(id)) out.push_back(id);
        return out;
    }
};

std::string beat_key(uint64_t id) { return format("regroup/beat/%llu", static_cast<unsigned long long>(id)); }

// While a survivor is inside sx_regroup it says so every 200 ms (a counter under
// "regroup/beat/<identity>"), so that the others wait for one still busy with an earlier
// try (one whose group lost a member before it connected fails only at its timeout)
// instead of closing the next epoch without it.
class Heartbeat {
  public:
    Heartbeat(std::shared_ptr<rdzv::Store> store, uint64_t id) : store_(std::move(store)), key_(beat_key(id)) {
        thread_ = std::thread([this] { run(); });
    }
    ~Heartbeat() {
        {
            std::lock_guard<std::mutex> lock(mu_);
            stop_ = true;
        }
        cv_.notify_all();
        thread_.join();
    }

  private:
    void run() {
        std::unique_lock<std::mutex> lock(mu_);
        while (!stop_) {
            lock.unlock();
            int64_t beats = 0;
            store_->add(key_, 1, &beats);  // a store that is gone fails the regroup itself
            lock.lock();
            cv_.wait_for(lock, std::chrono::milliseconds(200), [this] { return stop_; });
        }
    }
    std::shared_ptr<rdzv::Store> store_;
    const std::string key_;
    std::mutex mu_;
    std::condition_variable cv_;
    bool stop_ = false;
    std::thread thread_;
};

// Which survivors still beat: sampled every poll (at most every 100 ms), a survivor whose
// counter moved within the last 2 s is alive; one whose counter stood still for 3 s since
// it was first sampled is not.
class Beats {
  public:
    Status sample(rdzv::Store &store, const std::vector<uint64_t> &ids) {
        const Clock::time_point now = Clock::now();
        if (now - sampled_ < std::chrono::milliseconds(100)) return Status::Ok();
        sampled_ = now;
        for (uint64_t id : ids) {
            int64_t value = 0;
            SX_TRY(store.add(beat_key(id), 0, &value));
            auto it = seen_.find(id);
            if (it == seen_.end())
                seen_[id] = {value, now, false};
            else if (value != it->second.value)
                it->second = {value, now, true};
        }
        return Status::Ok();
    }
    bool any_alive(const std::vector<uint64_t> &ids) const {
        for (uint64_t id : ids) {
            auto it = seen_.find(id);
            if (it != seen_.end() && it->second.moved && Clock::now() - it->second.since < std::chrono::seconds(2))
                return true;
        }
        return false;
    }
    // The first of `ids` whose counter stood still for 3 s; -1 if none.
    int stalled(const std::vector<uint64_t> &ids) const {
        for (size_t k = 0; k < ids.size(); ++k) {
            auto it = seen_.find(ids[k]);
            if (it != seen_.end() && Clock::now() - it->second.since >= std::chrono::seconds(3))
                return static_cast<int>(k);
        }
        return -1;
    }

  private:
    struct Seen {
        int64_t value = 0;
        Clock::time_point since;  // of this value
        bool moved = false;       // since it was first sampled
    };
    Clock::time_point sampled_;
    std::map<uint64_t, Seen> seen_;
};

// What the new group's forming waits watch (rdzv::make_watched_store): the members
// (`ids`, new rank order; this one at `me`) are still there: none known to have exited
// (`lost`: identities), none whose beat stood still. Disarmed when the regroup returns.
// The beats read are those of the members a power of two away round the ring of new
// ranks (every other member up to 5; 2 log2 W at most), not every member's every 100 ms
// (W^2 reads in all): a member that stops is seen by those, whose forming then fails and
// whose own beats stop with their regroup, so that the rest see it a hop or two later.
std::shared_ptr<rdzv::StoreWatch> watch_members(std::shared_ptr<rdzv::Store> root, std::vector<uint64_t> ids, int me,
                                                std::function<std::vector<uint64_t>()> lost) {
    std::shared_ptr<Beats> beats(new Beats());
    const int W = static_cast<int>(ids.size());
    std::set<int> near;
    for (int64_t d = 1; d < W; d <<= 1) {
        near.insert(static_cast<int>((me + d) % W));
        near.insert(static_cast<int>((me + W - d) % W));
    }
    near.erase(me);
    std::vector<int> ranks(near.begin(), near.end());
    std::vector<uint64_t> watched;
    for (int r : ranks) watched.push_back(ids[static_cast<size_t>(r)]);
    return std::make_shared<rdzv::StoreWatch>([=]() -> Status {
        for (uint64_t id : lost()) {
            const auto at = std::find(ids.begin(), ids.end(), id);
            SX_CHECK(at == ids.end(), SX_ERR_COMM, "rank %d of the group being formed has exited (it was lost after "
                     "it arrived)", static_cast<int>(at - ids.begin()));
        }
        SX_TRY(beats->sample(*root, watched));
        const int k = beats->stalled(watched);
        SX_CHECK(k < 0, SX_ERR_COMM, "rank %d of the group being formed stopped answering (its regroup has not "
                 "said it is alive for 3 s)", k < 0 ? -1 : ranks[static_cast<size_t>(k)]);
        return Status::Ok();
    });
}

// Disarms a watch when the regroup returns, so that nothing the watch refers to is asked
// afterwards.
struct Disarm {
    std::shared_ptr<rdzv::StoreWatch> watch;
    ~Disarm() { watch->disarm(); }
};

// The closer's table of epoch `epoch`'s `count` members ("regroup/E/table"): for each, in
// arrival order, its entry and what it said it holds, each as its length and its bytes.
// `arrived` holds the first arrivals already (as read before); the rest are read here.
Status publish_table(rdzv::Store &store, int epoch, int64_t count, Clock::time_point deadline,
                     std::vector<Arrival> arrived) {
    SX_TRY(read_arrivals(store, epoch, count, deadline, &arrived));
    std::string table;
    for (int64_t k = 0; k < count; ++k) {
        std::string copies;
        SX_TRY(store.get(format("regroup/%d/copies/%llu", epoch,
                                static_cast<unsigned long long>(arrived[static_cast<size_t>(k)].id)),
                         &copies, time_left(deadline)));
        for (const std::string &part : {describe(arrived[static_cast<size_t>(k)]), copies})
            table += std::to_string(part.size()) + ":" + part;
    }
    return store.set(format("regroup/%d/table", epoch), table);
}

// The members of epoch `epoch`'s group in identity order (the new ranks' order) and the
// memory copies each holds, from the closer's table: one request, whatever the size.
Status read_members(rdzv::Store &store, int epoch, Clock::time_point deadline, std::vector<Arrival> *members,
                    std::vector<std::vector<CopyHolding>> *holdings) {
    std::string table;
    SX_TRY(store.get(format("regroup/%d/table", epoch), &table, time_left(deadline)));
    std::vector<std::pair<Arrival, std::vector<CopyHolding>>> rows;
    for (size_t at = 0; at < table.size();) {
        std::string parts[2];
        for (std::string &part : parts) {
            const size_t colon = table.find(':', at);
            SX_CHECK(colon != std::string::npos, SX_ERR_CORRUPT, "epoch %d's table of members is cut short", epoch);
            const size_t n = std::strtoull(table.c_str() + at, nullptr, 10);
            SX_CHECK(colon + 1 + n <= table.size(), SX_ERR_CORRUPT, "epoch %d's table of members is cut short",
                     epoch);
            part = table.substr(colon + 1, n);
            at = colon + 1 + n;
        }
        rows.emplace_back();
        SX_TRY(parse(parts[0], &rows.back().first));
        SX_TRY(parse_holdings(parts[1], &rows.back().second));
    }
    std::sort(rows.begin(), rows.end(), [](const auto &a, const auto &b) { return a.first.id < b.first.id; });
    members->clear();
    holdings->clear();
    for (auto &row : rows) {
        members->push_back(row.first);
        holdings->push_back(std::move(row.second));
    }
    return Status::Ok();
}

// Draws this survivor's arrival number (*arrival) and writes its copies, its group's
// ranks (unless a survivor of the same group put them there first) and its entry.
Status arrive(rdzv::Store &store, int epoch, Arrival *me, const std::vector<CopyHolding> &mine, int64_t *arrival) {
    const std::string base = format("regroup/%d/", epoch);
    // The counter first: a store that is gone fails it at once, where a set is retried
    // (the others read the keys below with waits, so their order does not matter).
    SX_TRY(store.add(base + "arrived", 1, arrival));
    SX_TRY(store.set(base + format("copies/%llu", static_cast<unsigned long long>(me->id)), describe_holdings(mine)));
    const std::string ranks = join_ids(me->members);
    me->group = group_hash(ranks);
    bool listed = false;
    SX_TRY(store.check({group_key(epoch, me->group)}, &listed));
    if (!listed) SX_TRY(store.set(group_key(epoch, me->group), ranks));
    return store.set(base + format("member/%lld", static_cast<long long>(*arrival)), describe(*me));
}

// Reports the identities of `now_lost` that `me` had not reported before, as a report of
// their own ("regroup/E/lost/<n>"), and keeps them in me->lost.
Status report_lost(rdzv::Store &store, int epoch, const std::vector<uint64_t> &now_lost, Arrival *me) {
    std::vector<uint64_t> fresh;
    for (uint64_t id : now_lost)
        if (std::find(me->lost.begin(), me->lost.end(), id) == me->lost.end()) fresh.push_back(id);
    me->lost = now_lost;
    int64_t report = 0;
    SX_TRY(store.add(format("regroup/%d/lost-reports", epoch), 1, &report));
    return store.set(format("regroup/%d/lost/%lld", epoch, static_cast<long long>(report)), join_ids(fresh));
}

// The evaluator's part (the first survivor to arrive, or one that took over from it):
// reads the arrivals, the reports and the beats until the group is complete or the window
// has ended, and closes it (the first to draw "regroup/E/closer" writes "closed" and the
// table). Returns once "closed" is there.
Status evaluate(rdzv::Store &store, int epoch, Arrival *me, const RegroupSpec &spec,
                const std::function<std::vector<uint64_t>()> &lost, Clock::time_point window_end,
                Clock::time_point deadline) {
    const std::string base = format("regroup/%d/", epoch);
    int64_t evaluated = 0;  // the arrivals counted when the group was last found incomplete
    Arrived arrived;
    std::vector<uint64_t> waiting_for;
    Beats beats;
    // The beats matter once the join window ends (a survivor counts as alive where its
    // counter moved within 2 s): they are sampled from 2.5 s before it, not all along.
    const Clock::time_point beats_from = window_end - std::chrono::milliseconds(2500);
    for (;;) {
        bool present = false;
        SX_TRY(store.check({base + "closed"}, &present));
        if (present) return Status::Ok();
        int64_t count = 0;
        SX_TRY(store.add(base + "arrived", 0, &count));
        std::vector<uint64_t> now_lost = lost();
        const bool more_lost = now_lost.size() > me->lost.size();
        if (more_lost) SX_TRY(report_lost(store, epoch, now_lost, me));
        const int64_t reports_seen = arrived.reports;
        SX_TRY(arrived.update(store, epoch, count, deadline));
        if (count != evaluated || more_lost || arrived.reports != reports_seen) {
            waiting_for = arrived.pending();
            evaluated = count;
        }
        if (Clock::now() >= beats_from) SX_TRY(beats.sample(store, waiting_for));
        bool close = spec.expected_world_size > 0 ? count >= spec.expected_world_size : waiting_for.empty();
        // The window ended: the group closes as it is, unless a survivor still beats.
        close = close || Clock::now() >= deadline || (Clock::now() >= window_end && !beats.any_alive(waiting_for));
        if (!close) {
            std::this_thread::sleep_for(std::min(Millis(50), time_left(deadline)));
            continue;
        }
        int64_t closer = 0;
        SX_TRY(store.add(base + "closer", 1, &closer));
        if (closer == 1) {
            SX_TRY(store.add(base + "arrived", 0, &count));
            SX_TRY(store.set(base + "closed", std::to_string(count)));
            SX_TRY(publish_table(store, epoch, count, deadline, arrived.arrivals));
        }
    }
}

// Every other survivor's part: it reports the survivors it learns have exited, and waits
// for "closed"; it takes the evaluator's part over where the first survivor (whose entry
// is "regroup/E/member/1") stops beating for 3 s before the group closed.
Status await_close(rdzv::Store &store, int epoch, Arrival *me, const RegroupSpec &spec,
                   const std::function<std::vector<uint64_t>()> &lost, Clock::time_point window_end,
                   Clock::time_point deadline) {
    const std::string base = format("regroup/%d/", epoch);
    std::vector<Arrival> first;
    SX_TRY(read_arrivals(store, epoch, 1, deadline, &first));
    Beats beats;
    for (;;) {
        bool present = false;
        SX_TRY(store.check({base + "closed"}, &present));
        if (present) return Status::Ok();
        std::vector<uint64_t> now_lost = lost();
        if (now_lost.size() > me->lost.size()) SX_TRY(report_lost(store, epoch, now_lost, me));
        SX_TRY(beats.sample(store, {first[0].id}));
        if (beats.stalled({first[0].id}) >= 0 || Clock::now() >= deadline) {
            log(SX_LOG_WARN, "sx: rank %d: the first survivor at epoch %d's regroup (rank %d) stopped answering; "
                "this one decides when the group closes", me->rank, epoch, first[0].rank);
            return evaluate(store, epoch, me, spec, lost, window_end, deadline);
        }
        std::this_thread::sleep_for(std::min(Millis(50), time_left(deadline)));
    }
}

}  // namespace

Status agree_members(rdzv::Store &store, int epoch, Arrival me, const RegroupSpec &spec,
                     const std::vector<CopyHolding> &mine, const std::function<std::vector<uint64_t>()> &lost,
                     Clock::time_point deadline, std::vector<Arrival> *members,
                     std::vector<std::vector<CopyHolding>> *holdings) {
    const std::string base = format("regroup/%d/", epoch);
    int64_t arrival = 0;
    SX_TRY(arrive(store, epoch, &me, mine, &arrival));
    const Clock::time_point window_end = std::min(deadline, Clock::now() + spec.join_window);
    if (arrival == 1)
        SX_TRY(evaluate(store, epoch, &me, spec, lost, window_end, deadline));
    else
        SX_TRY(await_close(store, epoch, &me, spec, lost, window_end, deadline));
    std::string closed;
    SX_TRY(store.get(base + "closed", &closed, time_left(deadline)));
    const int64_t count = std::stoll(closed);
    SX_TRY(read_members(store, epoch, deadline, members, holdings));
    SX_CHECK(static_cast<int64_t>(members->size()) == count, SX_ERR_CORRUPT,
             "epoch %d's table names %zu members, its count %lld", epoch, members->size(), static_cast<long long>(count));
    SX_CHECK(arrival <= count, SX_ERR_INVALID_STATE,
             "rank %d (of epoch %d's group) reached the regroup of epoch %d after it closed: the survivors that were "
             "there (ranks %s) formed it without this rank, once every rank of their groups had arrived or was known "
             "to be lost, or at the end of the join window (options->join_window_ms = %lld ms from the first "
             "arrival); this process may join them as a new one (SX_GROUP_JOIN)",
             me.rank, me.epoch, epoch, ranks_of(*members).c_str(), static_cast<long long>(spec.join_window.count()));
    for (const Arrival &m : *members)
        SX_CHECK(m.admit == spec.admit, SX_ERR_MISMATCH,
                 "the members disagree on how many joining processes to admit (options->admit): %d on rank %d, %d "
                 "on rank %d", m.admit, m.rank, spec.admit, me.rank);
    return Status::Ok();
}

namespace {

// What a joining process reads in the lobby: where and as what it enters.
struct Admission {
    int epoch = 0, world_size = 0, rank = 0, shard_size = 0;
    int memory_copy_interval = 0;  // the members' (a joiner keeps copies as they do)
    unsigned long long id = 0;     // its identity from now on
};

std::string describe(const Admission &a) {
    return format("%d %d %d %d %d %llu", a.epoch, a.world_size, a.rank, a.shard_size, a.memory_copy_interval, a.id);
}

Status parse(const std::string &text, Admission *a) {
    SX_CHECK(std::sscanf(text.c_str(), "%d %d %d %d %d %llu", &a->epoch, &a->world_size, &a->rank, &a->shard_size,
                         &a->memory_copy_interval, &a->id) == 6,
             SX_ERR_CORRUPT, "the admission in the rendezvous store is unreadable: '%s'", text.c_str());
    return Status::Ok();
}

// The identities of the processes admitted at epoch `epoch`, in their ranks' order
// (the claimer writes them under "regroup/E/admitted").
Status read_admitted(rdzv::Store &store, int epoch, Clock::time_point deadline, std::vector<uint64_t> *ids) {
    std::string text;
    SX_TRY(store.get(format("regroup/%d/admitted", epoch), &text, time_left(deadline)));
    ids->clear();
    std::istringstream in(text);
    for (unsigned long long v; in >> v;) ids->push_back(v);
    return Status::Ok();
}

std::string no_state(int epoch, const std::vector<Arrival> &members, const CopyChoice &choice) {
    return format("the survivors (ranks %s) agreed on the group of epoch %d, but its state can come neither from the "
                  "memory copies (%s) nor from a checkpoint (options->checkpoint is empty); nothing changed: call "
                  "sx_regroup again with options->checkpoint (it tries epoch %d)",
                  ranks_of(members).c_str(), epoch, choice.why_not.c_str(), epoch + 1);
}

// The new group's shard size: a mesh keeps its shard groups' size where the ranks still
// fill whole shard groups of it, else the new group is flat. The newest group among the
// survivors' says which mesh that was (survivors of a failed try may hold an older one).
int shard_size_after(const std::vector<Arrival> &members, int new_world) {
    const Arrival &newest = *std::max_element(members.begin(), members.end(),
                                              [](const Arrival &a, const Arrival &b) { return a.epoch < b.epoch; });
    const bool flat = newest.shard_size == newest.world;
    return !flat && new_world % newest.shard_size == 0 ? newest.shard_size : new_world;
}

// The claimer's part of admitting: each admitted joiner (`admitted`, after the `members`
// survivors) told its place in the new group `c` through its lobby place's key.
Status tell_joiners(rdzv::Store &root, const GroupConfig &c, size_t members, const std::vector<uint64_t> &admitted) {
    for (size_t j = 0; j < admitted.size(); ++j) {
        Admission a;
        a.epoch = c.epoch;
        a.world_size = c.world_size;
        a.rank = static_cast<int>(members + j);
        a.shard_size = c.shard_size;
        a.memory_copy_interval = c.memory_copy_interval;
        a.id = admitted[j];
        SX_TRY(root.set(format("lobby/admit/%llu", static_cast<unsigned long long>(admitted[j] - kJoinerIds)),
                        describe(a)));
    }
    return Status::Ok();
}

// A joining process's wait in the lobby (`root`: the group's first key space): it takes
// the next place, and waits up to the timeout for a member to admit it there (*a).
Status wait_in_lobby(rdzv::Store &root, const GroupConfig &jc, Admission *a) {
    const Millis timeout(jc.timeout_ms);
    int64_t place = 0;
    SX_TRY(root.add("lobby/arrived", 1, &place));
    std::string text;
    const std::string admission = format("lobby/admit/%lld", static_cast<long long>(place));
    Status waited = root.get(admission, &text, timeout);
    if (waited.code() == SX_ERR_TIMEOUT) {
        // Giving up: this place is claimed, so that no member admits it later; where a
        // member claimed it first, it was admitted just now.
        int64_t claims = 0;
        SX_TRY(root.add(format("lobby/claim/%lld", static_cast<long long>(place)), 1, &claims));
        if (claims > 1) waited = root.get(admission, &text, timeout);
    }
    if (!waited.ok()) {
        return SX_ERROR(waited.code(), "no member of the group on %s admitted this process within %d ms (the members "
                        "admit the processes waiting with sx_poll_joiners and sx_regroup's options->admit): %s",
                        jc.rendezvous.c_str(), jc.timeout_ms, waited.message().c_str());
    }
    return parse(text, a);
}

// A process joining a context's group (jc.name): *root becomes that group's key space in the
// context's store, where its rank 0 said it lies when it was made.
Status find_context_group(const GroupConfig &jc, std::shared_ptr<rdzv::Store> *root) {
    std::string space;
    Status s = (*root)->get(core::group_space_key(jc.name), &space, Millis(jc.timeout_ms));
    if (!s.ok())
        return SX_ERROR(s.code(), "no group named '%s' was made in a context on %s within %d ms (a joining process "
                        "names a live group of the context whose rendezvous it gives): %s",
                        jc.name.c_str(), jc.rendezvous.c_str(), jc.timeout_ms, s.message().c_str());
    *root = rdzv::make_prefix_store(*root, space);
    return Status::Ok();
}

// The config of the group a joining process enters: the one it was created to join
// (`jc`, on the rendezvous `rv`), at the place and mesh its admission `a` says, on the
// backend this process resolved.
GroupConfig admitted_config(const GroupConfig &jc, int backend, const rdzv::Rendezvous &rv, const Admission &a) {
    GroupConfig c = jc;
    c.backend = backend;
    c.rank = a.rank;
    c.world_size = a.world_size;
    c.shard_size = a.shard_size;
    c.memory_copy_interval = a.memory_copy_interval;
    c.epoch = a.epoch;
    if (c.bind_address.empty()) {  // as create() chooses it
        const bool loopback = rv.scheme == rdzv::Rendezvous::Scheme::kLocal || rv.host == "localhost" ||
                              rv.host.compare(0, 4, "127.") == 0;
        c.bind_address = loopback ? "127.0.0.1" : rdzv::address_towards(rv);
    }
    c.rendezvous_token.clear();
    return c;
}

}  // namespace

Status Recovery::check_regroup(const RegroupSpec &spec) const {
    const int world_size = g_.world_size();
    SX_CHECK(g_.table().finalized() && !g_.table().pending(), SX_ERR_INVALID_STATE,
             "sx_regroup needs a finalized group with nothing added since sx_finalize");
    SX_CHECK_ARG(spec.join_window.count() > 0, "the join window %lld ms must be > 0",
                 static_cast<long long>(spec.join_window.count()));
    SX_CHECK_ARG(spec.expected_world_size >= 0 && spec.expected_world_size <= world_size,
                 "expected_world_size %d is not in [0, the previous world size %d]", spec.expected_world_size,
                 world_size);
    SX_CHECK_ARG(spec.admit >= 0 && spec.admit <= SX_MAX_WORLD_SIZE - world_size,
                 "admit %d is not in [0, %d]", spec.admit, SX_MAX_WORLD_SIZE - world_size);
    SX_CHECK_ARG(!joining() || spec.admit == 0, "a joining group admits nobody (admit is %d)", spec.admit);
    return Status::Ok();
}

// How many processes wait in the lobby and have not been admitted: rank 0 reads it, and
// every member gets rank 0's count (a joiner arriving meanwhile waits for the next).
Status Recovery::poll_joiners(int *waiting) {
    SX_TRY(g_.check_usable());
    SX_TRY(g_.check_finalized());
    SX_TRY(g_.agree_call("sx_poll_joiners", {}));
    int64_t count = 0;
    if (g_.rank() == 0) {
        rdzv::Store &root = *g_.lineage().root_store;
        int64_t arrived = 0, cursor = 0;
        Status s = root.add("lobby/arrived", 0, &arrived);
        if (s.ok()) s = root.add("lobby/cursor", 0, &cursor);
        if (!s.ok()) return g_.fail(s.prefix("reading the processes waiting to join: "));
        count = arrived - cursor;  // (one that gave up meanwhile is not admitted)
    }
    if (g_.world_size() > 1)
        SX_TRY(g_.collective([&](comm::Communicator &c) { return c.broadcast(&count, sizeof count, 0); }));
    *waiting = static_cast<int>(count);
    return Status::Ok();
}

// The members' part of admitting up to `admit` joiners into epoch `epoch`: the claimer
// (new rank 0) claims the next places of the lobby whose joiner has not given up (a claim
// is a counter: the joiner's own claim, as it gives up, and this one exclude each other),
// and writes the identities it admitted under "regroup/E/admitted"; every member reads
// them into *ids (a joiner's identity is kJoinerIds + its place).
Status Recovery::claim_joiners(int epoch, int admit, bool claimer, Clock::time_point deadline,
                               std::vector<uint64_t> *ids) {
    rdzv::Store &root = *g_.lineage().root_store;
    if (!claimer) return read_admitted(root, epoch, deadline, ids);
    int64_t cursor = 0, arrived = 0;
    SX_TRY(root.add("lobby/cursor", 0, &cursor));
    SX_TRY(root.add("lobby/arrived", 0, &arrived));
    int64_t k = cursor + 1;
    ids->clear();
    for (; k <= arrived && static_cast<int>(ids->size()) < admit; ++k) {
        int64_t claims = 0;
        SX_TRY(root.add(format("lobby/claim/%lld", static_cast<long long>(k)), 1, &claims));
        if (claims == 1) ids->push_back(kJoinerIds + static_cast<uint64_t>(k));
    }
    SX_TRY(root.add("lobby/cursor", (k - 1) - cursor, &cursor));
    return root.set(format("regroup/%d/admitted", epoch), join_ids(*ids));
}

// The identities of this group's ranks known to have exited.
std::vector<uint64_t> Recovery::lost_ids() const {
    std::vector<uint64_t> ids;
    for (int r : lost_ranks()) ids.push_back(g_.lineage().member_ids[static_cast<size_t>(r)]);
    return ids;
}

Status Recovery::regroup(const RegroupSpec &spec, std::unique_ptr<RecoveryAccess> *out, RegroupInfo *info) {
    SX_TRY(check_regroup(spec));
    if (joining()) return join(out, info);
    SX_TRACE_SPAN(g_.tracer(), "group", "sx_regroup");
    // The broken group's collectives end now (a survivor may still be inside one), and no
    // later call of this group runs; its copies are kept for the groups after it.
    g_.abort();
    Lineage &line = g_.lineage();
    const GroupConfig &config = g_.config();
    const uint64_t my_id = line.member_ids[static_cast<size_t>(g_.rank())];
    Heartbeat beat(line.root_store, my_id);
    keep_copies_for_regroup(g_, spec.join_window);
    const Clock::time_point deadline = Clock::now() + Millis(config.timeout_ms);
    const int epoch = std::max(line.epoch, line.attempted_epoch) + 1;
    line.attempted_epoch = epoch;
    const Arrival me{my_id, g_.rank(), spec.admit, line.epoch, g_.world_size(), g_.shard_size(), line.member_ids,
                     lost_ids()};
    std::vector<Arrival> members;
    std::vector<std::vector<CopyHolding>> holdings;
    Status s = agree_members(*line.root_store, epoch, me, spec, held_copies(g_), [this] { return lost_ids(); },
                             deadline, &members, &holdings);
    if (!s.ok()) {
        return SX_ERROR(s.code(), "the survivors could not agree on the group of epoch %d through the rendezvous %s: "
                        "%s (the store must outlive every rank: the sx-rendezvous command, file:// or torchrun's "
                        "agent store, not rank 0's)",
                        epoch, config.rendezvous.c_str(), s.message().c_str());
    }
    // Where the state comes from, decided alike by every survivor before anything is built.
    const CopyChoice choice = choose_copies(holdings);
    SX_CHECK(choice.found || spec.have_checkpoint, SX_ERR_NOT_FOUND, "%s", no_state(epoch, members, choice).c_str());
    // The survivors keep their order; the admitted joiners come after them.
    std::vector<uint64_t> ids;
    for (const Arrival &m : members) ids.push_back(m.id);
    const int new_rank = static_cast<int>(std::find(ids.begin(), ids.end(), my_id) - ids.begin());
    std::vector<uint64_t> admitted;
    if (spec.admit > 0) SX_TRY(claim_joiners(epoch, spec.admit, new_rank == 0, deadline, &admitted));
    ids.insert(ids.end(), admitted.begin(), admitted.end());
    GroupConfig c = config;
    // A context's group regroups out of it: the context's transport and pool are those of
    // the ranks it was made with.
    c.context.reset();
    c.name.clear();
    c.rank = new_rank;
    c.world_size = static_cast<int>(ids.size());
    c.epoch = epoch;
    c.shard_size = shard_size_after(members, c.world_size);
    if (new_rank == 0) SX_TRY(tell_joiners(*line.root_store, c, members.size(), admitted));
    const std::string trace_path = config.trace_path.empty() ? "" : config.trace_path + format(".epoch%d", epoch);
    Disarm watching{watch_members(line.root_store, ids, new_rank, [this] { return lost_ids(); })};
    std::unique_ptr<RecoveryAccess> g;
    SX_TRY(g_.form(c, trace_path, deadline,
                   rdzv::make_watched_store(rdzv::make_prefix_store(line.root_store, format("e%d/", epoch)),
                                            watching.watch),
                   &g));
    g->lineage().root_store = line.root_store;
    g->lineage().member_ids = ids;
    g->lineage().kept = line.kept;
    SX_TRY(settle_state(*g, choice, epoch, info));
    log(SX_LOG_INFO, "sx: epoch %d: rank %d of %d is rank %d of %d (mesh %d x %d)", epoch, g_.rank(),
        g_.world_size(), new_rank, c.world_size, g->shard_size(), c.world_size / g->shard_size());
    *info = RegroupInfo{epoch,         new_rank,          c.world_size,        g->shard_size(), g_.rank(),
                        g_.world_size(), info->from_memory, info->why_not_memory};
    *out = std::move(g);
    return Status::Ok();
}

// The new group `g` of epoch `epoch` takes this group's table and counters, and its state
// from the memory copies where `choice` found every shard of one boundary still held.
Status Recovery::settle_state(RecoveryAccess &g, const CopyChoice &choice, int epoch, RegroupInfo *info) {
    SX_TRY(replay_table(g, g_));  // a joiner's: the members' table must be this one (sx_finalize's agreement)
    if (choice.found) {
        SX_TRY(restore_copies(g, choice));
        info->from_memory = true;
    } else {
        info->why_not_memory = choice.why_not;
        if (!joining())
            log(SX_LOG_WARN, "sx: epoch %d: rank %d: the memory copies cannot restore the state: %s", epoch,
                g.rank(), choice.why_not.c_str());
    }
    return Status::Ok();
}

// A joining process enters a running group: it waits in the lobby of the group's first
// key space until the members admit it (sx_poll_joiners, then sx_regroup with
// options->admit), reads where and as which rank, and builds the new group with them;
// its state comes from the members' memory copies as theirs does, or from the checkpoint
// the caller loads.
Status Recovery::join(std::unique_ptr<RecoveryAccess> *out, RegroupInfo *info) {
    SX_TRACE_SPAN(g_.tracer(), "group", "sx_regroup (joining)");
    const GroupConfig &jc = g_.lineage().join_config;
    rdzv::Rendezvous rv;
    SX_TRY(rdzv::parse_rendezvous(jc.rendezvous.c_str(), 0, 1, &rv));
    SX_TRY(rdzv::apply_rendezvous_guard(jc.rendezvous_token.c_str(), jc.rendezvous_bind.c_str(), &rv));
    rv.joining = true;
    std::shared_ptr<rdzv::Store> root;
    SX_TRY(rdzv::open_store(rv, Millis(jc.timeout_ms), &root));
    if (!jc.name.empty()) SX_TRY(find_context_group(jc, &root));
    Admission a;
    SX_TRY(wait_in_lobby(*root, jc, &a));
    const Clock::time_point deadline = Clock::now() + Millis(jc.timeout_ms);
    // The members and their copies, as they said them at the regroup that admitted this one.
    std::string closed;
    SX_TRY(root->get(format("regroup/%d/closed", a.epoch), &closed, time_left(deadline)));
    std::vector<Arrival> members;
    std::vector<std::vector<CopyHolding>> holdings;
    SX_TRY(read_members(*root, a.epoch, deadline, &members, &holdings));
    std::vector<uint64_t> ids, admitted;
    for (const Arrival &m : members) ids.push_back(m.id);
    SX_TRY(read_admitted(*root, a.epoch, deadline, &admitted));
    ids.insert(ids.end(), admitted.begin(), admitted.end());
    SX_CHECK(static_cast<int>(ids.size()) == a.world_size && a.rank < a.world_size && ids[a.rank] == a.id,
             SX_ERR_CORRUPT, "the admission (rank %d of %d) does not match the %zu members and joiners of epoch %d",
             a.rank, a.world_size, ids.size(), a.epoch);
    const GroupConfig c = admitted_config(jc, g_.config().backend, rv, a);
    std::unique_ptr<RecoveryAccess> g;
    Heartbeat beat(root, a.id);
    Disarm watching{watch_members(root, ids, a.rank, [] { return std::vector<uint64_t>(); })};
    SX_TRY(g_.form(c, jc.trace_path, deadline,
                   rdzv::make_watched_store(rdzv::make_prefix_store(root, format("e%d/", a.epoch)), watching.watch),
                   &g));
    g->lineage().root_store = root;
    g->lineage().member_ids = ids;
    SX_TRY(settle_state(*g, choose_copies(holdings), a.epoch, info));
    log(SX_LOG_INFO, "sx: epoch %d: a joining process is rank %d of %d (mesh %d x %d)", a.epoch, a.rank,
        a.world_size, g->shard_size(), a.world_size / g->shard_size());
    info->epoch = a.epoch;
    info->rank = a.rank;
    info->world_size = a.world_size;
    info->shard_size = g->shard_size();
    info->previous_rank = -1;
    info->previous_world_size = static_cast<int>(members.size());
    *out = std::move(g);
    return Status::Ok();
}

}  // namespace recovery
}  // namespace sx
