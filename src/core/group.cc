#include "core/group.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "base/log.h"
#include "comm/rendezvous.h"

namespace sx {
namespace core {
namespace {

bool is_power_of_two(int v) { return v > 0 && (v & (v - 1)) == 0; }

size_t dtype_size(int32_t dtype) { return dtype == SX_DTYPE_F32 ? 4 : 2; }

}  // namespace

Status ShardGroup::create(const GroupConfig &cfg, std::unique_ptr<ShardGroup> *out) {
    SX_CHECK_ARG(cfg.stage == 1 || cfg.stage == 2, "stage %d is not 1 or 2", cfg.stage);
    SX_CHECK_ARG(cfg.backend == SX_BACKEND_AUTO || cfg.backend == SX_BACKEND_CPU ||
                     cfg.backend == SX_BACKEND_CUDA,
                 "backend %d is not SX_BACKEND_AUTO, SX_BACKEND_CPU or SX_BACKEND_CUDA", cfg.backend);
    SX_CHECK(cfg.backend != SX_BACKEND_CUDA, SX_ERR_UNSUPPORTED,
             "backend SX_BACKEND_CUDA is not available in this build");
    SX_CHECK_ARG(is_power_of_two(cfg.alignment) && cfg.alignment >= 64 && cfg.alignment <= (1 << 20),
                 "alignment %d is not a power of two in [64, 2^20] bytes", cfg.alignment);
    SX_CHECK_ARG(cfg.timeout_ms > 0, "timeout_ms %d must be > 0", cfg.timeout_ms);
    SX_CHECK_ARG(cfg.num_threads >= 0 && cfg.num_threads <= 1024, "num_threads %d is not in [0, 1024]",
                 cfg.num_threads);
    SX_CHECK_ARG(cfg.world_size >= 0, "world_size %d must be >= 0 (0 = from the environment)",
                 cfg.world_size);

    comm::Rendezvous rv;
    SX_TRY(comm::parse_rendezvous(cfg.rendezvous.c_str(), cfg.rank, cfg.world_size, &rv));
    const comm::Millis timeout(cfg.timeout_ms);

    std::unique_ptr<ShardGroup> g(new ShardGroup());
    g->config_ = cfg;
    g->config_.backend = SX_BACKEND_CPU;
    g->rank_ = rv.rank;
    g->world_size_ = rv.world_size;
    g->config_.rank = rv.rank;
    g->config_.world_size = rv.world_size;

    SX_TRY(comm::open_store(rv, timeout, &g->store_));
    comm::GlooOptions gopt;
    gopt.timeout = timeout;
    gopt.bind_address = cfg.bind_address;
    if (gopt.bind_address.empty()) {
        const bool loopback = rv.scheme == comm::Rendezvous::Scheme::kLocal || rv.host == "localhost" ||
                              rv.host.compare(0, 4, "127.") == 0;
        if (loopback) gopt.bind_address = "127.0.0.1";
    }
    SX_TRY(comm::create_gloo_communicator(g->store_, rv.rank, rv.world_size, gopt, &g->comm_));

    int threads = cfg.num_threads;
    if (threads == 0) {
        int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
        threads = rv.scheme == comm::Rendezvous::Scheme::kLocal ? std::max(1, hw / rv.world_size) : hw;
    }
    g->pool_.reset(new optim::ThreadPool(threads));
    g->config_.num_threads = threads;
    log(SX_LOG_INFO, "sx: rank %d of %d joined %s (stage %d, %d threads)", g->rank_, g->world_size_,
        cfg.rendezvous.c_str(), cfg.stage, threads);
    *out = std::move(g);
    return Status::Ok();
}

ShardGroup::~ShardGroup() {
    // Wait for an abort() in progress on another thread (see abort_mu_).
    std::lock_guard<std::mutex> lock(abort_mu_);
}

Status ShardGroup::fail(Status s) {
    if (!failed_.exchange(true)) failure_ = s.message();
    return s;
}

void ShardGroup::abort() {
    std::lock_guard<std::mutex> lock(abort_mu_);
    aborted_.store(true);
    if (comm_) comm_->abort();
}

Status ShardGroup::check_usable() const {
    // sx.h: after sx_abort, collectives in flight return SX_ERR_ABORTED (from the
    // communicator); later calls return SX_ERR_GROUP_FAILED.
    if (aborted_.load())
        return SX_ERROR(SX_ERR_GROUP_FAILED,
                        "the group was aborted with sx_abort() and can only be destroyed");
    if (failed_.load())
        return SX_ERROR(SX_ERR_GROUP_FAILED,
                        "the group failed earlier and can only be destroyed; the first error was: %s",
                        failure_.c_str());
    return Status::Ok();
}

Status ShardGroup::check_finalized() const {
    SX_CHECK(finalized_, SX_ERR_INVALID_STATE, "the group is not finalized yet; call sx_finalize first");
    return Status::Ok();
}

// ---------------------------------------------------------------------------------
// Registration

Status ShardGroup::add_param_group(const optim::Hyper &hyper, int32_t *index) {
    SX_TRY(check_usable());
    SX_CHECK(!finalized_, SX_ERR_INVALID_STATE, "param groups must be added before sx_finalize");
    SX_TRY(validate_hyper(hyper));
    ParamGroup g;
    g.hyper = hyper;
    groups_.push_back(g);
    if (index) *index = static_cast<int32_t>(groups_.size() - 1);
    return Status::Ok();
}

Status ShardGroup::add_param(const char *name, int32_t ndim, const int64_t *shape, int32_t dtype,
                             int32_t param_group, int32_t unit, bool frozen, int32_t *index) {
    SX_TRY(check_usable());
    SX_CHECK(!finalized_, SX_ERR_INVALID_STATE, "params must be added before sx_finalize");
    SX_TRY(validate_param_name(name));
    ParamSpec p;
    SX_TRY(validate_shape(ndim, shape, &p.numel));
    if (dtype == 0) dtype = SX_DTYPE_F32;
    SX_CHECK_ARG(dtype == SX_DTYPE_F32 || dtype == SX_DTYPE_F16 || dtype == SX_DTYPE_BF16,
                 "dtype %d of param '%s' is not an SX_DTYPE_*", dtype, name);
    SX_CHECK(dtype == SX_DTYPE_F32, SX_ERR_UNSUPPORTED,
             "param '%s': only SX_DTYPE_F32 params are supported on the CPU backend", name);
    SX_CHECK_ARG(param_group >= 0 && param_group < num_param_groups(),
                 "param '%s': param group %d does not exist (%d added)", name, param_group,
                 num_param_groups());
    SX_CHECK_ARG(unit >= 0, "param '%s': unit %d must be >= 0", name, unit);
    SX_CHECK(by_name_.find(name) == by_name_.end(), SX_ERR_ALREADY_EXISTS,
             "a param named '%s' is already registered", name);
    p.name = name;
    p.shape.assign(shape, shape + ndim);
    p.dtype = dtype;
    p.group = param_group;
    p.unit = unit;
    by_name_.emplace(p.name, static_cast<int32_t>(params_.size()));
    params_.push_back(std::move(p));
    mask_.push_back(frozen ? 0 : 1);
    if (index) *index = static_cast<int32_t>(params_.size() - 1);
    return Status::Ok();
}

Status ShardGroup::finalize() {
    SX_TRY(check_usable());
    SX_CHECK(!finalized_, SX_ERR_INVALID_STATE, "the group is already finalized");
    SX_CHECK(!params_.empty(), SX_ERR_INVALID_STATE, "no params were added before sx_finalize");

    // Every rank must have registered the same table; compare fingerprints.
    uint64_t h = fnv1a(&config_.stage, sizeof config_.stage);
    for (const ParamGroup &g : groups_) h = fnv1a(&g.hyper.kind, sizeof g.hyper.kind, h);
    for (size_t i = 0; i < params_.size(); ++i) {
        const ParamSpec &p = params_[i];
        h = fnv1a(p.name.data(), p.name.size() + 1, h);
        h = fnv1a(p.shape.data(), p.shape.size() * sizeof(int64_t), h);
        int32_t fields[4] = {static_cast<int32_t>(p.shape.size()), p.dtype, p.group, p.unit};
        h = fnv1a(fields, sizeof fields, h);
        h = fnv1a(&mask_[i], 1, h);
    }
    if (world_size_ > 1) {
        uint64_t v[2] = {h, ~h};
        Status s = comm_->all_reduce_max(v, 2);
        if (!s.ok()) return fail(s);
        SX_CHECK(v[0] == h && v[1] == ~h, SX_ERR_MISMATCH,
                 "ranks registered different param tables (names, shapes, dtypes, param groups, "
                 "units, frozen flags or optimizer kinds differ)");
    }

    std::vector<ParamShape> shapes(params_.size());
    for (size_t i = 0; i < params_.size(); ++i) shapes[i] = {params_[i].unit, params_[i].numel};
    Layout layout;
    const uint64_t align_elems = static_cast<uint64_t>(config_.alignment) / dtype_size(SX_DTYPE_F32);
    SX_TRY(Layout::build(shapes, world_size_, align_elems, &layout));

    std::vector<Unit> units(layout.units().size());
    for (size_t u = 0; u < units.size(); ++u) {
        // Elements are bounded (2^62 per param) but a unit's byte size may still not fit
        // in 64 bits; wrapped around, it would allocate a tiny buffer behind a huge view.
        const uint64_t numel = layout.units()[u].padded_numel;
        SX_CHECK(numel <= SIZE_MAX / sizeof(float), SX_ERR_OUT_OF_MEMORY,
                 "unit %d holds %llu elements, more bytes than this machine can address",
                 layout.units()[u].unit_id, static_cast<unsigned long long>(numel));
        const uint64_t bytes = numel * sizeof(float);
        SX_TRY(units[u].params.allocate(bytes, "a flat param buffer"));
        SX_TRY(units[u].grads.allocate(bytes, "a flat grad buffer"));
    }
    // Commit, then allocate optimizer state for the trainable units; on failure undo.
    layout_ = std::move(layout);
    units_ = std::move(units);
    applied_mask_.assign(mask_.size(), 0);
    finalized_ = true;
    Status s = prepare(mask_);
    if (!s.ok()) {
        finalized_ = false;
        units_.clear();
        layout_ = Layout();
        return s;
    }
    return Status::Ok();
}

// ---------------------------------------------------------------------------------
// Hyperparameters

Status ShardGroup::set_hyperparameter(int32_t group, int32_t key, double value) {
    SX_TRY(check_usable());
    SX_CHECK_ARG(group >= 0 && group < num_param_groups(), "param group %d does not exist (%d added)",
                 group, num_param_groups());
    SX_CHECK(!(key == SX_HP_AMSGRAD && steps_ > 0), SX_ERR_INVALID_STATE,
             "amsgrad can only change before the first step");
    return core::set_hyperparameter(&groups_[group].hyper, key, value);
}

Status ShardGroup::get_hyperparameter(int32_t group, int32_t key, double *value) const {
    SX_CHECK_ARG(group >= 0 && group < num_param_groups(), "param group %d does not exist (%d added)",
                 group, num_param_groups());
    return core::get_hyperparameter(groups_[group].hyper, key, value);
}

// ---------------------------------------------------------------------------------
// Params and views

Status ShardGroup::check_param(int32_t param) const {
    SX_CHECK_ARG(param >= 0 && param < num_params(), "param index %d is out of range (%d params)",
                 param, num_params());
    return Status::Ok();
}

Status ShardGroup::find_param(const char *name, int32_t *index) const {
    SX_CHECK_ARG(name != nullptr, "name is NULL");
    auto it = by_name_.find(name);
    SX_CHECK(it != by_name_.end(), SX_ERR_NOT_FOUND, "no param named '%s'", name);
    *index = it->second;
    return Status::Ok();
}

float *ShardGroup::param_data(int32_t param) const {
    const ParamPlacement &pl = layout_.placement(param);
    return units_[pl.unit_index].params.as<float>() + pl.offset;
}

float *ShardGroup::grad_data(int32_t param) const {
    const ParamPlacement &pl = layout_.placement(param);
    return units_[pl.unit_index].grads.as<float>() + pl.offset;
}

Status ShardGroup::broadcast_params(int root) {
    SX_TRY(check_usable());
    SX_TRY(check_finalized());
    SX_CHECK_ARG(root >= 0 && root < world_size_, "root rank %d is outside [0, %d)", root, world_size_);
    if (world_size_ == 1) return Status::Ok();
    fence_.wait_readers();
    for (Unit &u : units_) {
        Status s = comm_->broadcast(u.params.data(), u.params.size(), root);
        if (!s.ok()) return fail(s);
    }
    return Status::Ok();
}

void ShardFence::hold() {
    std::lock_guard<std::mutex> lock(mu_);
    ++holds_;
}

void ShardFence::release() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        --holds_;
    }
    cv_.notify_all();
}

void ShardFence::wait_readers() const {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return holds_ == 0; });
}

// ---------------------------------------------------------------------------------
// Trainability and optimizer state

Status ShardGroup::set_trainable(int32_t param, bool trainable) {
    SX_TRY(check_usable());
    SX_TRY(check_param(param));
    mask_[param] = trainable ? 1 : 0;
    return Status::Ok();
}

Status ShardGroup::refresh_trainable() {
    SX_TRY(check_usable());
    SX_TRY(check_finalized());
    return prepare(mask_);
}

int ShardGroup::required_slots(size_t u, const std::vector<uint8_t> &mask) const {
    int slots = 0;
    for (int32_t p : layout_.units()[u].params)
        if (mask[p]) slots = std::max(slots, optim::state_slots(groups_[params_[p].group].hyper));
    return slots;
}

Status ShardGroup::prepare(const std::vector<uint8_t> &mask) {
    // Allocate everything first into temporaries, so that a failed allocation
    // changes nothing.
    struct Pending {
        size_t unit;
        int slots;
        HostBuffer state[3];
        HostBuffer accum;
    };
    std::vector<Pending> pending;
    for (size_t u = 0; u < units_.size(); ++u) {
        bool trainable = false;
        for (int32_t p : layout_.units()[u].params) trainable |= mask[p] != 0;
        if (!trainable) continue;
        const int need = required_slots(u, mask);
        const bool need_accum = config_.stage == 2 && units_[u].accum.empty();
        if (need <= units_[u].state_slots && !need_accum) continue;
        pending.emplace_back();
        Pending &pd = pending.back();
        pd.unit = u;
        pd.slots = std::max(need, units_[u].state_slots);
        const uint64_t bytes = layout_.units()[u].shard_numel * sizeof(float);
        for (int k = units_[u].state_slots; k < need; ++k)
            SX_TRY(pd.state[k].allocate(bytes, "optimizer state"));
        if (need_accum) SX_TRY(pd.accum.allocate(bytes, "the sharded gradient accumulator"));
    }
    for (Pending &pd : pending) {
        Unit &unit = units_[pd.unit];
        for (int k = unit.state_slots; k < pd.slots; ++k) unit.state[k] = std::move(pd.state[k]);
        unit.state_slots = pd.slots;
        if (!pd.accum.empty()) unit.accum = std::move(pd.accum);
    }
    for (size_t u = 0; u < units_.size(); ++u) {
        bool trainable = false;
        for (int32_t p : layout_.units()[u].params) trainable |= mask[p] != 0;
        units_[u].trainable = trainable;
    }
    for (size_t i = 0; i < mask.size(); ++i) applied_mask_[i] = mask[i] ? 1 : 0;
    return Status::Ok();
}

ShardGroup::UnitView ShardGroup::unit_view(size_t u) const {
    const Unit &unit = units_[u];
    UnitView v;
    v.params = unit.params.as<float>();
    for (int k = 0; k < 3; ++k) v.state[k] = k < unit.state_slots ? unit.state[k].as<float>() : nullptr;
    v.state_slots = unit.state_slots;
    v.shard_numel = layout_.units()[u].shard_numel;
    return v;
}

Status ShardGroup::collective(const std::function<Status(comm::Communicator &)> &fn) {
    SX_TRY(check_usable());
    Status s = fn(*comm_);
    return s.ok() ? s : fail(s);
}

Status ShardGroup::reserve_state(size_t u, int slots) {
    Unit &unit = units_[u];
    if (slots <= unit.state_slots) return Status::Ok();
    HostBuffer fresh[3];
    const uint64_t bytes = layout_.units()[u].shard_numel * sizeof(float);
    for (int k = unit.state_slots; k < slots; ++k) SX_TRY(fresh[k].allocate(bytes, "optimizer state"));
    for (int k = unit.state_slots; k < slots; ++k) unit.state[k] = std::move(fresh[k]);
    unit.state_slots = slots;
    return Status::Ok();
}

Status ShardGroup::swap_state(size_t u, int k, HostBuffer *other) {
    HostBuffer &mine = units_[u].state[k];
    SX_CHECK(k < units_[u].state_slots && other->size() == mine.size(), SX_ERR_INTERNAL,
             "swapping state slot %d of unit %zu: %zu bytes for a slot of %zu", k, u, other->size(), mine.size());
    std::swap(mine, *other);
    return Status::Ok();
}

MemoryStats ShardGroup::memory_stats() const {
    MemoryStats m;
    for (size_t u = 0; u < units_.size(); ++u) {
        const Unit &unit = units_[u];
        m.param_bytes += unit.params.size();
        m.grad_bytes += unit.grads.size() + unit.accum.size();
        for (int k = 0; k < unit.state_slots; ++k) m.optimizer_bytes += unit.state[k].size();
        m.unsharded_optimizer_bytes +=
            static_cast<uint64_t>(unit.state_slots) * layout_.units()[u].numel * sizeof(float);
    }
    return m;
}

}  // namespace core
}  // namespace sx
