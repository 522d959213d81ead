// Channels on a context's one Gloo mesh (comm/gloo/channels.h), ranks as threads over
// local://:
//  - channels over all 5 ranks and over subsets ({4, 3, 1} in small segments, {2, 0}: a
//    rank map), each
//    run from a thread of its own at once on every rank, pass every collective check;
//  - a channel whose call passes its timeout fails alone (SX_ERR_TIMEOUT), as does one
//    aborted in a call: the other channels go on, and new ones open;
//  - a broken transport ends every channel's waits at once, on the rank that found it
//    broken as at its peers;
//  - a call that ended early on one rank (its receive or its send), and that its peer
//    answers after, leaves the pair working for the other channels;
//  - on a sparse mesh (9 ranks), channels over all ranks and over subsets pass every
//    collective check, each rank holding exactly the mesh's pairs and those its channels'
//    rings and trees use; and a channel's failure on one rank reaches, relayed, the ranks
//    it has no pair with, whose calls then fail at once.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <set>
#include <thread>

#include "collective_checks.h"
#include "comm/gloo/channels.h"
#include "rdzv/rendezvous.h"
#include "rdzv/stores.h"
#include "run_ranks.h"
#include "sx_cmocka.h"

using sx::Millis;
using sx::Status;
using sx::comm::Communicator;

namespace {

// Rank r's store on `url`, and its context's channels.
Status open_context(const std::string &url, int r, int p, std::shared_ptr<sx::rdzv::Store> *store,
                    std::shared_ptr<sx::comm::GlooChannels> *out,
                    sx::comm::GlooOptions::Mesh mesh = sx::comm::GlooOptions::Mesh::kAuto) {
    sx::rdzv::Rendezvous rv;
    SX_TRY(sx::rdzv::parse_rendezvous(url.c_str(), r, p, &rv));
    SX_TRY(sx::rdzv::open_store(rv, Millis(20000), store));
    sx::comm::GlooOptions o;
    o.bind_address = "127.0.0.1";
    o.timeout = Millis(20000);
    o.mesh = mesh;
    return sx::comm::open_gloo_channels(sx::rdzv::make_prefix_store(*store, "context/"), r, p, o, out);
}

// The channel `name` over `ranks` (the context's, in channel order), or null where this
// rank is not one of them.
Status channel(const std::shared_ptr<sx::comm::GlooChannels> &ch, const std::shared_ptr<sx::rdzv::Store> &store,
               const std::string &name, const std::vector<int> &ranks, Millis timeout,
               std::unique_ptr<Communicator> *out, size_t segment_bytes = 0) {
    int mine = -1;
    for (size_t i = 0; i < ranks.size(); ++i)
        if (ranks[i] == ch->rank()) mine = static_cast<int>(i);
    if (mine < 0) return Status::Ok();
    sx::comm::GlooOptions o;
    o.timeout = timeout;
    o.segment_bytes = segment_bytes;
    return sx::comm::create_gloo_channel(ch, sx::rdzv::make_prefix_store(store, name + "/"), mine,
                                         static_cast<int>(ranks.size()), o, out);
}

// Channel "c<g>" over groups[g] for each g (the second in segments of 64 KiB); null where
// this rank is not in it.
Status open_channels(const std::shared_ptr<sx::comm::GlooChannels> &ch, const std::shared_ptr<sx::rdzv::Store> &store,
                     const std::vector<std::vector<int>> &groups, std::vector<std::unique_ptr<Communicator>> *comms) {
    comms->resize(groups.size());
    for (size_t g = 0; g < groups.size(); ++g)
        SX_TRY(channel(ch, store, "c" + std::to_string(g), groups[g], Millis(30000), &(*comms)[g], g == 1 ? 65536 : 0)
                   .prefix("channel " + std::to_string(g) + ": "));
    return Status::Ok();
}

// Every collective check on each of this rank's channels, each from a thread of its own, at once.
std::string check_at_once(const std::vector<std::vector<int>> &groups,
                          const std::vector<std::unique_ptr<Communicator>> &comms) {
    std::vector<std::string> errs(groups.size());
    std::vector<std::thread> threads;
    for (size_t g = 0; g < groups.size(); ++g)
        if (comms[g]) threads.emplace_back([&, g] { errs[g] = sxtest::check_all_collectives(*comms[g]); });
    for (auto &t : threads) t.join();
    for (size_t g = 0; g < groups.size(); ++g)
        if (!errs[g].empty()) return "channel " + std::to_string(g) + ": " + errs[g];
    return "";
}

void test_channels_at_once(void **) {
    const int world = 5;
    const std::vector<std::vector<int>> groups = {{0, 1, 2, 3, 4}, {4, 3, 1}, {2, 0}};
    const std::string err = sxtest::run_ranks(world, [&](int r) -> std::string {
        std::shared_ptr<sx::rdzv::Store> store;
        std::shared_ptr<sx::comm::GlooChannels> ch;
        Status s = open_context("local://gloo-channels-at-once", r, world, &store, &ch);
        if (!s.ok()) return "context: " + s.message();
        std::vector<std::unique_ptr<Communicator>> comms;
        if (!(s = open_channels(ch, store, groups, &comms)).ok()) return s.message();
        const std::string e = check_at_once(groups, comms);
        if (!e.empty()) return e;
        if (sx::comm::gloo_channels_open(*ch) != 2)  // every rank is in 2 of the 3
            return "channels open: " + std::to_string(sx::comm::gloo_channels_open(*ch));
        return "";
    });
    if (!err.empty()) fail_msg("%s", err.c_str());
}

// Channel "late": rank 1 never calls, so rank 0's all-reduce times out; channel "gone":
// rank 1 waits in a barrier that rank 0 never joins, aborted from another thread. Channel
// "on" goes on through both, and a new channel opens after.
void test_a_channels_failure_stays_in_it(void **) {
    const int world = 2;
    const std::string err = sxtest::run_ranks(world, [&](int r) -> std::string {
        std::shared_ptr<sx::rdzv::Store> store;
        std::shared_ptr<sx::comm::GlooChannels> ch;
        Status s = open_context("local://gloo-channels-failure", r, world, &store, &ch);
        if (!s.ok()) return "context: " + s.message();
        std::unique_ptr<Communicator> late, gone, on, after;
        if (!(s = channel(ch, store, "late", {0, 1}, Millis(500), &late)).ok()) return s.message();
        if (!(s = channel(ch, store, "gone", {0, 1}, Millis(30000), &gone)).ok()) return s.message();
        if (!(s = channel(ch, store, "on", {0, 1}, Millis(30000), &on)).ok()) return s.message();
        std::string e;
        if (r == 0) {
            double v = 1;
            s = late->all_reduce_sum(&v, 1);
            if (s.code() != SX_ERR_TIMEOUT) return "the late channel gave " + s.message();
        } else {
            std::thread aborter([&] {
                std::this_thread::sleep_for(Millis(300));
                gone->abort();
            });
            s = gone->barrier();
            aborter.join();
            if (s.code() != SX_ERR_ABORTED) return "the aborted channel gave " + s.message();
        }
        if (!(e = sxtest::check_all_reduce(*on, 1000)).empty()) return "after: " + e;
        if (!(e = sxtest::check_reduce_scatter(*on, 1000, false)).empty()) return "after: " + e;
        if (!(s = channel(ch, store, "after", {1, 0}, Millis(30000), &after)).ok()) return "a new channel: " + s.message();
        if (!(e = sxtest::check_all_gather(*after, 333, 3)).empty()) return "new channel: " + e;
        return "";
    });
    if (!err.empty()) fail_msg("%s", err.c_str());
}

// A connection of the context broke (GlooChannels::fail, as a channel's call that Gloo
// throws in calls it): every channel's waits end at once, not at their timeouts. Rank 0
// waits in channel "here" for rank 1, which never comes, while another thread of it fails
// the transport; rank 1 waits in channel "there" for rank 0, which never comes.
void test_a_broken_transport_ends_every_wait(void **) {
    const int world = 2;
    const std::string err = sxtest::run_ranks(world, [&](int r) -> std::string {
        std::shared_ptr<sx::rdzv::Store> store;
        std::shared_ptr<sx::comm::GlooChannels> ch;
        Status s = open_context("local://gloo-channels-broken", r, world, &store, &ch);
        if (!s.ok()) return "context: " + s.message();
        std::unique_ptr<Communicator> here, there;
        if (!(s = channel(ch, store, "here", {0, 1}, Millis(30000), &here)).ok()) return s.message();
        if (!(s = channel(ch, store, "there", {0, 1}, Millis(30000), &there)).ok()) return s.message();
        const auto start = std::chrono::steady_clock::now();
        if (r == 0) {
            std::thread breaker([&] {
                std::this_thread::sleep_for(Millis(300));
                (ch->fail)(SX_ERROR(SX_ERR_COMM, "a connection broke (the test says so)"));  // cmocka has a fail()
            });
            s = here->barrier();
            breaker.join();
        } else {
            s = there->barrier();
        }
        const auto took = std::chrono::duration_cast<Millis>(std::chrono::steady_clock::now() - start).count();
        if (s.ok() || took > 10000)
            return "rank " + std::to_string(r) + "'s wait ended after " + std::to_string(took) + " ms: " +
                   (s.ok() ? "ok" : s.message());
        if (r == 0 && s.message().find("the test says so") == std::string::npos)
            return "rank 0's error does not say why the transport failed: " + s.message();
        return "";
    });
    if (!err.empty()) fail_msg("%s", err.c_str());
}

// A call that ends early on one rank while its peer still answers it leaves the pair
// between them working for every other channel. Channel "a": rank 1's broadcast receive
// is aborted, then rank 0 sends it (Gloo then delivers a payload for a receive that ended
// here). Channel "c": rank 1's broadcast send is aborted, then rank 0 posts its receive
// (Gloo then asks for a send that ended here, and sends what the root's call had copied).
// After each, channel "b"'s all-reduce must go through at once, not wait behind what the
// pair could not deliver; and each rank keeps what its call ended early left.
void test_a_call_ended_early_leaves_the_pairs_working(void **) {
    const int world = 2;
    std::atomic<int> phase{0};
    auto await = [&](int p) {
        while (phase.load() < p) std::this_thread::sleep_for(Millis(2));
    };
    const std::string err = sxtest::run_ranks(world, [&](int r) -> std::string {
        std::shared_ptr<sx::rdzv::Store> store;
        std::shared_ptr<sx::comm::GlooChannels> ch;
        Status s = open_context("local://gloo-channels-ended-early", r, world, &store, &ch);
        if (!s.ok()) return "context: " + s.message();
        std::unique_ptr<Communicator> a, b, c;
        if (!(s = channel(ch, store, "a", {0, 1}, Millis(30000), &a)).ok()) return s.message();
        if (!(s = channel(ch, store, "b", {0, 1}, Millis(5000), &b)).ok()) return s.message();
        if (!(s = channel(ch, store, "c", {0, 1}, Millis(30000), &c)).ok()) return s.message();
        std::vector<char> data(4096, static_cast<char>(r + 1));
        auto aborted_alone = [&](Communicator &comm, int root) -> std::string {
            std::thread aborter([&] {
                std::this_thread::sleep_for(Millis(300));
                comm.abort();
            });
            Status t = comm.broadcast(data.data(), data.size(), root);
            aborter.join();
            return t.code() == SX_ERR_ABORTED ? "" : "the aborted broadcast gave " + (t.ok() ? "ok" : t.message());
        };
        std::string e;
        if (r == 1) {
            if (!(e = aborted_alone(*a, 0)).empty()) return e;
            phase.store(1);
        } else {
            await(1);
            if (!(s = a->broadcast(data.data(), data.size(), 0)).ok()) return "rank 0's broadcast: " + s.message();
        }
        if (!(e = sxtest::check_all_reduce(*b, 1000)).empty()) return "after a receive ended early: " + e;
        if (r == 1) {
            if (!(e = aborted_alone(*c, 1)).empty()) return e;
            phase.store(2);
        } else {
            await(2);
            // The root's copy of its data outlived its call: the receive gets it.
            if (!(s = c->broadcast(data.data(), data.size(), 1)).ok())
                return "rank 0's receive from the aborted root: " + s.message();
            if (data != std::vector<char>(data.size(), 2)) return "rank 0 did not receive the aborted root's data";
        }
        if (!(e = sxtest::check_all_reduce(*b, 1000)).empty()) return "after a send ended early: " + e;
        const size_t kept = ch->remains().bytes();
        if (r == 1 ? kept < 2 * data.size() : kept != 0)
            return "rank " + std::to_string(r) + " keeps " + std::to_string(kept) + " bytes of calls ended early";
        // The channels' blocks kept for their next calls are counted beside, and go with them.
        const uint64_t with_spares = sx::comm::gloo_channels_kept_bytes(*ch);
        if (with_spares < kept + data.size()) return "kept bytes with the channels' spares: " + std::to_string(with_spares);
        a.reset();
        b.reset();
        c.reset();
        if (sx::comm::gloo_channels_kept_bytes(*ch) != kept)
            return "kept bytes once the channels went: " + std::to_string(sx::comm::gloo_channels_kept_bytes(*ch));
        return "";
    });
    if (!err.empty()) fail_msg("%s", err.c_str());
}

constexpr sx::comm::GlooOptions::Mesh kSparse = sx::comm::GlooOptions::Mesh::kSparse;

// The context ranks rank r of a sparse context of `world` is paired with once its channels
// over `groups` are made: the mesh's, and each channel's ranks a power of two away in the
// channel's order.
size_t expected_pairs(int r, int world, const std::vector<std::vector<int>> &groups) {
    std::set<int> pairs;
    for (int q : sx::comm::sparse_peers(r, world)) pairs.insert(q);
    for (const auto &g : groups) {
        const auto at = std::find(g.begin(), g.end(), r);
        if (at == g.end()) continue;
        for (int q : sx::comm::sparse_peers(static_cast<int>(at - g.begin()), static_cast<int>(g.size())))
            pairs.insert(g[static_cast<size_t>(q)]);
    }
    return pairs.size();
}

void test_sparse_channels_at_once(void **) {
    const int world = 9;
    const std::vector<std::vector<int>> groups = {{0, 1, 2, 3, 4, 5, 6, 7, 8}, {8, 3, 1, 6, 5}, {2, 0, 7}, {4}};
    const std::string err = sxtest::run_ranks(world, [&](int r) -> std::string {
        std::shared_ptr<sx::rdzv::Store> store;
        std::shared_ptr<sx::comm::GlooChannels> ch;
        Status s = open_context("local://gloo-channels-sparse", r, world, &store, &ch, kSparse);
        if (!s.ok()) return "context: " + s.message();
        if (!ch->sparse()) return "the context's mesh is not sparse";
        std::vector<std::unique_ptr<Communicator>> comms;
        if (!(s = open_channels(ch, store, groups, &comms)).ok()) return s.message();
        const size_t want = expected_pairs(r, world, groups);
        if (ch->pairs() != want)
            return "rank " + std::to_string(r) + " holds " + std::to_string(ch->pairs()) + " pairs, not " +
                   std::to_string(want);
        const std::string e = check_at_once(groups, comms);
        if (!e.empty()) return e;
        return "";
    });
    if (!err.empty()) fail_msg("%s", err.c_str());
}

// Rank 0's call on channel "late" passes its 500 ms timeout (the others never call): its
// notice reaches every other rank, those without a pair with rank 0 (3 and 6 at 9 ranks)
// included, within 10 s, and then their calls on the channel fail at once, naming rank 0;
// channel "on" goes on. The others wait for the notice (a listener) rather than call and
// be stopped by it: a call of theirs that posted a receive would leave it pending on a
// pair that rank 0, stopped, never answers (see channels.h on calls that end early).
void test_a_sparse_channels_failure_is_relayed(void **) {
    const int world = 9;
    std::atomic<bool> failed{false};
    const std::string err = sxtest::run_ranks(world, [&](int r) -> std::string {
        std::shared_ptr<sx::rdzv::Store> store;
        std::shared_ptr<sx::comm::GlooChannels> ch;
        Status s = open_context("local://gloo-channels-relayed", r, world, &store, &ch, kSparse);
        if (!s.ok()) return "context: " + s.message();
        const std::vector<int> all = {0, 1, 2, 3, 4, 5, 6, 7, 8};
        std::unique_ptr<Communicator> late, on;
        if (!(s = channel(ch, store, "late", all, Millis(r == 0 ? 500 : 60000), &late)).ok()) return s.message();
        if (!(s = channel(ch, store, "on", all, Millis(30000), &on)).ok()) return s.message();
        std::atomic<bool> noticed{false};
        sx::comm::listen_for_notice(late.get(), [&](const Status &) { noticed.store(true); });
        if (r == 0) {
            double v = 1;
            s = late->all_reduce_sum(&v, 1);
            failed.store(true);
            if (s.code() != SX_ERR_TIMEOUT) return "rank 0's late call gave " + s.message();
        } else {
            while (!failed.load()) std::this_thread::sleep_for(Millis(5));
            const auto start = std::chrono::steady_clock::now();
            while (!noticed.load() && std::chrono::steady_clock::now() < start + Millis(10000))
                std::this_thread::sleep_for(Millis(2));
            const auto took = std::chrono::duration_cast<Millis>(std::chrono::steady_clock::now() - start).count();
            if (!noticed.load()) return "no notice came within " + std::to_string(took) + " ms";
            s = late->barrier();
            if (s.ok() || s.message().find("(rank 0 of the context) failed first") == std::string::npos)
                return "rank " + std::to_string(r) + "'s barrier gave " + (s.ok() ? "ok" : s.message());
        }
        sx::comm::listen_for_notice(late.get(), nullptr);
        const std::string e = sxtest::check_all_reduce(*on, 1000);
        return e.empty() ? "" : "channel on: " + e;
    });
    if (!err.empty()) fail_msg("%s", err.c_str());
}

}  // namespace

int main() {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_channels_at_once),
        cmocka_unit_test(test_a_channels_failure_stays_in_it),
        cmocka_unit_test(test_a_broken_transport_ends_every_wait),
        cmocka_unit_test(test_a_call_ended_early_leaves_the_pairs_working),
        cmocka_unit_test(test_sparse_channels_at_once),
        cmocka_unit_test(test_a_sparse_channels_failure_is_relayed),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
