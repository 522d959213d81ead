// Recovery on its own interface (recovery/recovery.h): what a regroup refuses before
// anything changes, when a group is sound and holds copies, and a regroup of a lone rank
// on its own group: from its memory copies (the new group at the next epoch takes the
// params, the optimizer state, the counters and the table bit for bit), and, with no
// copy held, refused unless a checkpoint is to be loaded, each try an epoch of its own.
// And the survivors' agreement on their own (recovery/agreement.h): 16 and 48 survivors
// as threads on one store agree on the same members, and each one's requests and bytes
// grow as the number of survivors, not its square.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "api/handles.h"
#include "core/group.h"
#include "rdzv/stores.h"
#include "recovery/agreement.h"
#include "recovery/recovery.h"
#include "sx/sx.h"
// Last: CMocka defines a fail() macro.
#include "sx_cmocka.h"

namespace {

using sx::recovery::RegroupInfo;
using sx::recovery::RegroupSpec;
using sx::recovery::Recovery;

// A lone CPU rank on `rv`: AdamW over two units (params 0 and 1 of 300 and 77 elements),
// not finalized.
sx_shard_group_t *make_group(const std::string &rv, int memory_copy_interval) {
    sx_group_config_t cfg;
    sx_group_config_init(&cfg, sizeof cfg);
    cfg.backend = SX_BACKEND_CPU;
    cfg.rendezvous = rv.c_str();
    cfg.rank = 0;
    cfg.world_size = 1;
    cfg.num_threads = 1;
    cfg.timeout_ms = 20000;
    cfg.memory_copy_interval = memory_copy_interval;
    sx_shard_group_t *g = nullptr;
    assert_int_equal(sx_create_shard_group(&cfg, &g), SX_OK);
    sx_param_group_desc_t a;
    sx_param_group_desc_init(&a, sizeof a, SX_OPTIM_ADAMW);
    assert_int_equal(sx_add_param_group(g, &a, nullptr), SX_OK);
    for (int p = 0; p < 2; ++p) {
        const int64_t shape[1] = {p == 0 ? 300 : 77};
        const std::string name = "p" + std::to_string(p);
        sx_param_desc_t d;
        sx_param_desc_init(&d, sizeof d);
        d.name = name.c_str();
        d.ndim = 1;
        d.shape = shape;
        d.unit = p;
        assert_int_equal(sx_add_param(g, &d, nullptr), SX_OK);
    }
    return g;
}

sx::core::ShardGroup *group_of(sx_shard_group_t *h) {
    sx::core::ShardGroup *g = nullptr;
    assert_true(sx::api::resolve(h, &g).ok());
    return g;
}

// Finalizes, sets the params, and takes `steps` steps on gradients of the element.
void train(sx_shard_group_t *h, int steps) {
    assert_int_equal(sx_finalize(h), SX_OK);
    for (int32_t p = 0; p < 2; ++p) {
        sx_view_t v;
        sx_view_init(&v, sizeof v);
        assert_int_equal(sx_param_view(h, p, &v), SX_OK);
        for (uint64_t i = 0; i < v.numel; ++i) static_cast<float *>(v.data)[i] = 0.01f * static_cast<float>(i % 17);
    }
    for (int s = 0; s < steps; ++s) {
        for (int32_t p = 0; p < 2; ++p) {
            sx_view_t v;
            sx_view_init(&v, sizeof v);
            assert_int_equal(sx_grad_view(h, p, &v), SX_OK);
            for (uint64_t i = 0; i < v.numel; ++i)
                static_cast<float *>(v.data)[i] = 0.1f * static_cast<float>((i + s) % 5) - 0.2f;
        }
        assert_int_equal(sx_step(h, nullptr, nullptr), SX_OK);
    }
}

std::vector<float> tensor(sx::core::ShardGroup *g, int32_t p, const char *name) {
    void *data = nullptr;
    uint64_t numel = 0;
    if (name == nullptr) {
        data = g->param_data(p);
        numel = static_cast<uint64_t>(g->param(p).numel);
    } else {
        assert_true(g->state_view(p, name, &data, &numel).ok());
    }
    const float *f = static_cast<const float *>(data);
    return std::vector<float>(f, f + numel);
}

RegroupSpec lone_spec(bool have_checkpoint) {
    RegroupSpec spec;
    spec.join_window = sx::Millis(200);
    spec.expected_world_size = 1;
    spec.have_checkpoint = have_checkpoint;
    return spec;
}

std::string rendezvous(const char *name) { return std::string("local://recovery-") + name + "-" + std::to_string(getpid()); }

void test_refusals_and_soundness(void **) {
    sx_shard_group_t *h = make_group(rendezvous("refusals"), 0);
    Recovery r(*group_of(h));
    // Not finalized: refused, and not sound.
    assert_int_equal(r.check_regroup(lone_spec(true)).code(), SX_ERR_INVALID_STATE);
    assert_false(r.sound());
    train(h, 1);
    assert_true(r.sound());
    assert_false(r.joining());
    assert_int_equal(r.epoch(), 0);
    assert_true(r.lost_ranks().empty());  // a lone rank loses nobody
    assert_true(r.check_regroup(lone_spec(true)).ok());
    RegroupSpec bad = lone_spec(true);
    bad.join_window = sx::Millis(0);
    assert_int_equal(r.check_regroup(bad).code(), SX_ERR_INVALID_ARGUMENT);
    bad = lone_spec(true);
    bad.expected_world_size = 2;  // more than the group had
    assert_int_equal(r.check_regroup(bad).code(), SX_ERR_INVALID_ARGUMENT);
    bad = lone_spec(true);
    bad.admit = SX_MAX_WORLD_SIZE;
    assert_int_equal(r.check_regroup(bad).code(), SX_ERR_INVALID_ARGUMENT);
    // Without memory copies it holds none until a sound group copies its shard.
    assert_false(r.holds_copies());
    assert_true(r.copy_if_sound().ok());
    assert_true(r.holds_copies());
    // An aborted group is not sound.
    group_of(h)->abort();
    assert_false(r.sound());
    assert_int_equal(sx_destroy_shard_group(h), SX_OK);
}

void test_regroup_from_memory(void **) {
    sx_shard_group_t *h = make_group(rendezvous("memory"), 1);
    train(h, 3);
    sx::core::ShardGroup *old = group_of(h);
    Recovery r(*old);
    assert_true(r.holds_copies());  // every step keeps one
    std::unique_ptr<sx::core::RecoveryAccess> formed;
    RegroupInfo info;
    sx::Status s = r.regroup(lone_spec(false), &formed, &info);
    assert_true(s.ok());
    assert_int_equal(info.epoch, 1);
    assert_int_equal(info.rank, 0);
    assert_int_equal(info.world_size, 1);
    assert_int_equal(info.previous_world_size, 1);
    assert_true(info.from_memory);
    auto *fresh = dynamic_cast<sx::core::ShardGroup *>(formed.get());
    assert_non_null(fresh);
    assert_int_equal(Recovery(*fresh).epoch(), 1);
    assert_int_equal(fresh->steps_taken(), 3);
    assert_int_equal(fresh->num_params(), 2);
    assert_int_equal(fresh->param(1).numel, 77);
    for (int32_t p = 0; p < 2; ++p) {
        assert_int_equal(fresh->param(p).step, 3);
        for (const char *t : {static_cast<const char *>(nullptr), "exp_avg", "exp_avg_sq"}) {
            const std::vector<float> a = tensor(old, p, t), b = tensor(fresh, p, t);
            assert_int_equal(a.size(), b.size());
            assert_memory_equal(a.data(), b.data(), a.size() * sizeof(float));
        }
    }
    // The old group was aborted as the regroup began.
    assert_int_equal(old->check_usable().code(), SX_ERR_GROUP_FAILED);
    formed.reset();
    assert_int_equal(sx_destroy_shard_group(h), SX_OK);
}

void test_no_state_is_refused_and_each_try_is_an_epoch(void **) {
    sx_shard_group_t *h = make_group(rendezvous("no-state"), 0);
    train(h, 2);
    Recovery r(*group_of(h));
    std::unique_ptr<sx::core::RecoveryAccess> formed;
    RegroupInfo info;
    // No memory copy anywhere and no checkpoint: nothing is built.
    sx::Status s = r.regroup(lone_spec(false), &formed, &info);
    assert_int_equal(s.code(), SX_ERR_NOT_FOUND);
    assert_true(s.message().find("epoch 1") != std::string::npos);
    assert_null(formed.get());
    // With a checkpoint to load, the next try (epoch 2) forms a group with zero state.
    s = r.regroup(lone_spec(true), &formed, &info);
    assert_true(s.ok());
    assert_int_equal(info.epoch, 2);
    assert_false(info.from_memory);
    assert_false(info.why_not_memory.empty());
    auto *fresh = dynamic_cast<sx::core::ShardGroup *>(formed.get());
    assert_non_null(fresh);
    assert_int_equal(fresh->steps_taken(), 2);  // the counters come along; the state is the checkpoint's
    assert_int_equal(Recovery(*fresh).epoch(), 2);
    formed.reset();
    assert_int_equal(sx_destroy_shard_group(h), SX_OK);
}

// A survivor's view of the store that counts its requests and the bytes it receives.
class CountingStore final : public sx::rdzv::Store {
  public:
    explicit CountingStore(std::shared_ptr<sx::rdzv::Store> inner) : inner_(std::move(inner)) {}
    sx::Status set(const std::string &key, const std::string &value) override {
        ++requests;
        return inner_->set(key, value);
    }
    sx::Status get(const std::string &key, std::string *value, sx::Millis timeout) override {
        ++requests;
        sx::Status s = inner_->get(key, value, timeout);
        if (s.ok()) received += value->size();
        return s;
    }
    sx::Status wait(const std::vector<std::string> &keys, sx::Millis timeout) override {
        ++requests;
        return inner_->wait(keys, timeout);
    }
    sx::Status add(const std::string &key, int64_t delta, int64_t *result) override {
        ++requests;
        received += 8;
        return inner_->add(key, delta, result);
    }
    sx::Status check(const std::vector<std::string> &keys, bool *present) override {
        ++requests;
        return inner_->check(keys, present);
    }
    sx::Status erase(const std::string &key) override {
        ++requests;
        return inner_->erase(key);
    }
    int64_t requests = 0, received = 0;

  private:
    std::shared_ptr<sx::rdzv::Store> inner_;
};

struct AgreementTraffic {
    int64_t most_requests = 0, most_received = 0, all_requests = 0;
};

// W survivors of a group of W + 1 (identities 0..W; W never comes) agree as threads on one
// store: survivor 0 learns of W's exit while it waits (a lost report), which completes the
// group. Every survivor must see the same W members in identity order.
AgreementTraffic agree(int W) {
    std::shared_ptr<sx::rdzv::Store> store = sx::rdzv::open_local_store("agreement-" + std::to_string(W) + "-" +
                                                                        std::to_string(::getpid()));
    std::vector<std::shared_ptr<CountingStore>> views;
    for (int r = 0; r < W; ++r) views.push_back(std::make_shared<CountingStore>(store));
    std::vector<uint64_t> ids;
    for (int r = 0; r <= W; ++r) ids.push_back(static_cast<uint64_t>(r));
    std::vector<std::string> errors(static_cast<size_t>(W));
    std::atomic<int> asked{0};
    std::vector<std::thread> threads;
    for (int r = 0; r < W; ++r)
        threads.emplace_back([&, r] {
            sx::recovery::Arrival me;
            me.id = static_cast<uint64_t>(r);
            me.rank = r;
            me.epoch = 0;
            me.world = W + 1;
            me.members = ids;
            RegroupSpec spec;
            spec.join_window = sx::Millis(20000);
            // Survivor 0 learns of the exit once it has asked a few times.
            auto lost = [&, r]() -> std::vector<uint64_t> {
                if (r != 0 || asked.fetch_add(1) < 3) return {};
                return {static_cast<uint64_t>(W)};
            };
            std::vector<sx::recovery::Arrival> members;
            std::vector<std::vector<sx::core::CopyHolding>> holdings;
            sx::Status s = sx::recovery::agree_members(*views[static_cast<size_t>(r)], 1, me, spec, {}, lost,
                                                       sx::Clock::now() + sx::Millis(60000), &members, &holdings);
            if (!s.ok()) {
                errors[static_cast<size_t>(r)] = s.message();
                return;
            }
            if (members.size() != static_cast<size_t>(W)) errors[static_cast<size_t>(r)] = "wrong member count";
            for (size_t m = 0; m < members.size() && errors[static_cast<size_t>(r)].empty(); ++m)
                if (members[m].id != m || members[m].rank != static_cast<int>(m))
                    errors[static_cast<size_t>(r)] = "members out of order";
        });
    for (std::thread &t : threads) t.join();
    AgreementTraffic t;
    for (int r = 0; r < W; ++r) {
        if (!errors[static_cast<size_t>(r)].empty()) print_error("survivor %d: %s\n", r, errors[static_cast<size_t>(r)].c_str());
        assert_true(errors[static_cast<size_t>(r)].empty());
        t.most_requests = std::max(t.most_requests, views[static_cast<size_t>(r)]->requests);
        t.most_received = std::max(t.most_received, views[static_cast<size_t>(r)]->received);
        t.all_requests += views[static_cast<size_t>(r)]->requests;
    }
    return t;
}

// 16 and then 48 survivors: each one's bytes grow at most 4x for 3x the survivors (they
// grew as W^2, 9x, when every entry held its group's ranks), its requests stay within two
// per survivor plus its polls (three requests each, every 50 ms), and all survivors'
// requests together grow at most 4x too (every survivor read every entry: 9x).
void test_agreement_traffic_grows_as_the_survivors(void **) {
    const AgreementTraffic small = agree(16), large = agree(48);
    print_message("16 survivors: at most %lld requests, %lld bytes, %lld requests in all; 48: %lld requests, %lld "
                  "bytes, %lld in all\n",
                  static_cast<long long>(small.most_requests), static_cast<long long>(small.most_received),
                  static_cast<long long>(small.all_requests), static_cast<long long>(large.most_requests),
                  static_cast<long long>(large.most_received), static_cast<long long>(large.all_requests));
    assert_true(large.all_requests <= 4 * small.all_requests);
    assert_true(large.most_received <= 4 * small.most_received);
    assert_true(large.most_requests <= 2 * 48 + 3 * 100 + 20);
}

}  // namespace

int main() {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refusals_and_soundness),
        cmocka_unit_test(test_regroup_from_memory),
        cmocka_unit_test(test_no_state_is_refused_and_each_try_is_an_epoch),
        cmocka_unit_test(test_agreement_traffic_grows_as_the_survivors),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
