#include "core/group.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <thread>

#include <unistd.h>

#include "base/log.h"
#include "comm/abort_at_deadline.h"
#include "core/context.h"
#include "rdzv/rendezvous.h"
#include "rdzv/stores.h"
#include "optim/custom.h"

namespace sx {
namespace core {
namespace {

// A unit's params update in one pass per kind of optimizer: a custom optimizer's
// (double-buffered: undone everywhere if any rank fails) and one that looks at whole
// params (updated in two passes around an exchange) cannot share a unit. An optimizer
// whose row names a number of dimensions (param_ndim: 2 for a matrix) takes those only.
Status check_unit_optimizers(const std::deque<ParamSpec> &params, const std::vector<ParamGroup> &groups) {
    for (size_t i = 0; i < params.size(); ++i) {
        const optim::Kind kind = groups[params[i].group].hyper.kind;
        const optim::OptimizerSpec &row = optim::spec_of(kind);
        if (row.param_ndim != 0) {
            std::string dims;
            for (int64_t d : params[i].shape) dims += (dims.empty() ? "" : ", ") + std::to_string(d);
            SX_CHECK_ARG(static_cast<int32_t>(params[i].shape.size()) == row.param_ndim,
                         "param '%s' has %zu dimensions ([%s]); %s orthogonalises %d-D params only (as "
                         "%s): give it a param group of another optimizer (AdamW, as is usual)",
                         params[i].name.c_str(), params[i].shape.size(), dims.c_str(), row.name,
                         static_cast<int>(row.param_ndim), row.reference);
        }
        if (!optim::is_custom(kind)) continue;
        for (size_t j = 0; j < params.size(); ++j)
            SX_CHECK_ARG(params[j].unit != params[i].unit ||
                             optim::spec_of(groups[params[j].group].hyper.kind).needs == optim::Needs::kElementwise,
                         "unit %d holds param '%s' of the custom optimizer '%s' and param '%s' of %s, whose update "
                         "looks at the whole param; put them in different units",
                         params[i].unit, params[i].name.c_str(), optim::optimizer_name(groups[params[i].group].hyper.kind).c_str(),
                         params[j].name.c_str(), optim::optimizer_name(groups[params[j].group].hyper.kind).c_str());
    }
    return Status::Ok();
}

bool is_power_of_two(int v) { return v > 0 && (v & (v - 1)) == 0; }

// Every setting of a group's configuration in its range (SX_ERR_INVALID_ARGUMENT naming
// the first that is not).
Status validate_config(const GroupConfig &cfg) {
    SX_CHECK_ARG(cfg.stage >= 1 && cfg.stage <= 3, "stage %d is not 1, 2 or 3", cfg.stage);
    SX_CHECK_ARG(cfg.prefetch_depth >= 0 && cfg.prefetch_depth <= 64, "prefetch_depth %d is not in [0, 64]",
                 cfg.prefetch_depth);
    SX_CHECK_ARG(cfg.backend == SX_BACKEND_AUTO || cfg.backend == SX_BACKEND_CPU ||
                     cfg.backend == SX_BACKEND_CUDA,
                 "backend %d is not SX_BACKEND_AUTO, SX_BACKEND_CPU or SX_BACKEND_CUDA", cfg.backend);
    SX_CHECK_ARG(is_power_of_two(cfg.alignment) && cfg.alignment <= (1 << 20),
                 "alignment %d is not a power of two in [1, 2^20] bytes", cfg.alignment);
    SX_CHECK_ARG(cfg.timeout_ms > 0, "timeout_ms %d must be > 0", cfg.timeout_ms);
    SX_CHECK_ARG(cfg.num_threads >= 0 && cfg.num_threads <= 1024, "num_threads %d is not in [0, 1024]",
                 cfg.num_threads);
    SX_CHECK_ARG(cfg.world_size >= 0 && cfg.world_size <= SX_MAX_WORLD_SIZE,
                 "world_size %d is not in [0, SX_MAX_WORLD_SIZE = %d] (0 = from the environment)", cfg.world_size,
                 SX_MAX_WORLD_SIZE);
    SX_CHECK_ARG(cfg.grad_dtype == 0 || cfg.grad_dtype == SX_DTYPE_F32,
                 "grad_dtype %d is not 0 (each param's dtype) or SX_DTYPE_F32", cfg.grad_dtype);
    SX_CHECK_ARG(cfg.reduce_dtype == 0 || cfg.reduce_dtype == SX_DTYPE_F32,
                 "reduce_dtype %d is not 0 (the gradients' dtype) or SX_DTYPE_F32", cfg.reduce_dtype);
    SX_CHECK_ARG(cfg.shard_size >= 0, "shard_size %d must be >= 0 (0 = the world size)", cfg.shard_size);
    SX_CHECK_ARG(std::isfinite(cfg.grad_predivide_factor) && cfg.grad_predivide_factor >= 0 &&
                     (cfg.grad_predivide_factor == 0 || cfg.grad_predivide_factor >= 1),
                 "grad_predivide_factor %g must be finite and >= 1 (0 = FSDP's factor)", cfg.grad_predivide_factor);
    SX_CHECK_ARG(cfg.offload == SX_OFFLOAD_NONE || cfg.offload == SX_OFFLOAD_STATE,
                 "offload %d is not SX_OFFLOAD_NONE or SX_OFFLOAD_STATE", cfg.offload);
    SX_CHECK_ARG(cfg.trace_capacity <= trace::kMaxCapacity, "trace_events %zu is above the most a trace keeps, %zu",
                 cfg.trace_capacity, trace::kMaxCapacity);

    return Status::Ok();
}

// The mesh's settings for a group of `cfg` (resolved: its backend and bind address) on
// `device` (its buffers' DeviceOps).
Mesh::Settings mesh_settings(const GroupConfig &cfg, DeviceOps *device) {
    Mesh::Settings ms;
    ms.backend = cfg.backend;
    ms.device = device;
    ms.simulated_device = cfg.simulated_device;
    ms.simulated_nccl = cfg.simulated_nccl;
    ms.device_ordinal = cfg.device_ordinal;
    ms.timeout_ms = cfg.timeout_ms;
    ms.bind_address = cfg.bind_address;
    // SX_TRANSPORT_TCP, or SX_SHARED_MEMORY=0, keeps ranks on one host on Gloo's TCP.
    const char *shm = std::getenv("SX_SHARED_MEMORY");
    ms.shared_memory = cfg.transport != SX_TRANSPORT_TCP && !(shm && std::strcmp(shm, "0") == 0);
    if (cfg.context) {
        ms.channels = cfg.context->channels();
        ms.gloo_channels = cfg.context->gloo_channels();
        ms.label = "group '" + cfg.name + "'";
    }
    return ms;
}

}  // namespace

// The host thread pool's size: num_threads, or every core (shared among the ranks that
// are threads of one process); 1 for a CUDA group, whose work runs on its device, but where
// it offloads its state to the host, whose kernels update it.
int pool_threads(const GroupConfig &cfg) {
    int threads = cfg.backend == SX_BACKEND_CUDA && cfg.offload == SX_OFFLOAD_NONE ? 1 : cfg.num_threads;
    if (threads == 0) {
        int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
        const bool threads_of_one_process = cfg.rendezvous.compare(0, 8, "local://") == 0;
        threads = threads_of_one_process ? std::max(1, hw / cfg.world_size) : hw;
    }
    return threads;
}

namespace {

// Where a group of `cfg` runs, in words for its log line.
std::string where_it_runs(const GroupConfig &cfg, int threads) {
    if (cfg.backend != SX_BACKEND_CUDA) return format("%d threads", threads);
    return format("%s device %d, %s%s", cfg.simulated_device ? "simulated" : "CUDA", cfg.device_ordinal,
                  cfg.simulated_device ? "CPU transports" : "NCCL",
                  cfg.offload == SX_OFFLOAD_STATE ? format(", state offloaded to the host (%d threads)", threads).c_str()
                                                  : "");
}

// The units' settings for a group of `cfg` on the opened mesh `mesh`.
Units::Settings unit_settings(const GroupConfig &cfg, const Mesh &mesh) {
    Units::Settings us;
    us.stage = cfg.stage;
    us.shard_rank = mesh.shard_rank();
    us.shard_size = mesh.shard_size();
    us.grad_dtype = cfg.grad_dtype;
    us.reduce_dtype = cfg.reduce_dtype;
    us.exchanged = cfg.backend != SX_BACKEND_CUDA && mesh.shard().reads_in_place();
    us.offload = cfg.offload == SX_OFFLOAD_STATE;
    // The ranks whose gradients are summed in 16 bits are a shard group's (GroupConfig).
    us.predivide = cfg.grad_predivide_factor > 0 ? cfg.grad_predivide_factor : fsdp_predivide_factor(mesh.shard_size());
    return us;
}

// The memory copies' settings for a group of `cfg` on the opened mesh `mesh`.
MemoryCopies::Settings copy_settings(const GroupConfig &cfg, const Mesh &mesh) {
    MemoryCopies::Settings cs;
    cs.interval = cfg.memory_copy_interval;
    cs.rank = cfg.rank;
    cs.world_size = cfg.world_size;
    cs.shard = mesh.shard_rank();
    cs.shards = mesh.shard_size();
    cs.epoch = cfg.epoch;
    // A mesh's other replicas hold each shard; a flat group's ranks send theirs on.
    cs.peers = mesh.replicas() == 1 && cfg.world_size > 1;
    return cs;
}

}  // namespace

// cfg with its rendezvous read (*rv: rank and world size from the environment where
// asked), its backend decided (AUTO: CUDA where there is a device), a simulated device
// taken from the environment, and its bind address chosen. A group's creation and a
// context's (context.h) resolve alike.
Status resolve_config(const GroupConfig &cfg, rdzv::Rendezvous *rv, GroupConfig *out) {
    SX_TRY(rdzv::parse_rendezvous(cfg.rendezvous.c_str(), cfg.rank, cfg.world_size, rv));
    SX_TRY(rdzv::apply_rendezvous_guard(cfg.rendezvous_token.c_str(), cfg.rendezvous_bind.c_str(), rv));

    // SX_BACKEND_AUTO: the CUDA backend where this build has CUDA and there is a device.
    const bool cuda =
        cfg.backend == SX_BACKEND_CUDA || (cfg.backend == SX_BACKEND_AUTO && cuda_device_present());
    GroupConfig c = cfg;
    c.rendezvous_token.clear();  // the store's client keeps it; nothing else needs it
    c.backend = cuda ? SX_BACKEND_CUDA : SX_BACKEND_CPU;
    // A CPU group's state is on the host already.
    if (!cuda) c.offload = SX_OFFLOAD_NONE;
    if (cuda) {
        SimulatedDevice sim;
        simulated_device_from_env(&c.simulated_device, &sim);
        c.simulated_copy_delay_us = sim.copy_delay_us;
        c.simulated_nccl = sim.nccl;
        if (c.simulated_device)
            log(SX_LOG_WARN, "sx: SX_SIMULATED_DEVICE is set: this CUDA group runs on a simulated device in host memory "
                "(for testing sx without a GPU)");
    }
    c.rank = rv->rank;
    c.world_size = rv->world_size;
    c.shard_size = cfg.shard_size ? cfg.shard_size : rv->world_size;  // checked by the mesh
    if (c.bind_address.empty()) {
        // Loopback for ranks of one machine; else where the store is reached from, which
        // the peers on other hosts reach too (this host's name may resolve to a loopback
        // address, as Debian's does, or to none bound in this network namespace).
        const bool loopback = rv->scheme == rdzv::Rendezvous::Scheme::kLocal || rv->host == "localhost" ||
                              rv->host.compare(0, 4, "127.") == 0;
        c.bind_address = loopback ? "127.0.0.1" : rdzv::address_towards(*rv);
    }
    *out = std::move(c);
    return Status::Ok();
}

Status ShardGroup::create(const GroupConfig &cfg, std::unique_ptr<ShardGroup> *out) {
    SX_TRY(validate_config(cfg));
    if (cfg.context) return create_in_context(cfg, out);
    if (cfg.joining) {
        // Until a regroup admits it: a group of this rank alone on a rendezvous of its own,
        // where its params are registered and laid out as the members' are.
        static std::atomic<int> joins{0};
        GroupConfig own = cfg;
        own.rendezvous = format("local://sx-joining-%d-%d", static_cast<int>(getpid()), ++joins);
        own.rank = 0;
        own.world_size = 1;
        own.shard_size = 0;
        own.memory_copy_interval = 0;
        own.trace_path.clear();
        own.name.clear();  // that of the context's group it joins, if any
        own.joining = false;
        std::unique_ptr<ShardGroup> g;
        SX_TRY(create(own, &g));
        g->lineage_.joining = true;
        g->lineage_.join_config = cfg;
        g->lineage_.join_config.joining = false;
        *out = std::move(g);
        return Status::Ok();
    }

    // Every phase below (the store, the ranks' arrival, the transport, the mesh's
    // communicators) counts against this one deadline.
    const Millis timeout(cfg.timeout_ms);
    const Clock::time_point deadline = Clock::now() + timeout;
    rdzv::Rendezvous rv;
    GroupConfig c;
    SX_TRY(resolve_config(cfg, &rv, &c));
    std::unique_ptr<ShardGroup> g;
    std::shared_ptr<rdzv::Store> root;
    SX_TRY(assemble(c, cfg.trace_path, deadline, [&](std::shared_ptr<rdzv::Store> *store) {
        Status s = rdzv::open_store(rv, timeout, store);
        root = *store;
        return s;
    }, &g));
    g->lineage_.root_store = std::move(root);
    for (int r = 0; r < g->world_size(); ++r) g->lineage_.member_ids.push_back(static_cast<uint64_t>(r));
    *out = std::move(g);
    return Status::Ok();
}

Status ShardGroup::create_in_context(const GroupConfig &cfg, std::unique_ptr<ShardGroup> *out) {
    const std::shared_ptr<Context> ctx = cfg.context;
    SX_CHECK_ARG(!cfg.joining, "SX_GROUP_JOIN is not for a group made in a context: a process that joins a "
                 "context's group makes its group without one, on the context's rendezvous, with the group's name");
    // The context's rendezvous, ranks, backend, pool and transport; the group's own
    // settings for the rest.
    GroupConfig c = ctx->base();
    c.stage = cfg.stage;
    c.alignment = cfg.alignment;
    c.flags = cfg.flags;
    c.grad_dtype = cfg.grad_dtype;
    c.reduce_dtype = cfg.reduce_dtype;
    c.prefetch_depth = cfg.prefetch_depth;
    c.shard_size = cfg.shard_size ? cfg.shard_size : c.world_size;
    c.grad_predivide_factor = cfg.grad_predivide_factor;
    c.trace_path = cfg.trace_path;
    c.trace_capacity = cfg.trace_capacity;
    c.memory_copy_interval = cfg.memory_copy_interval;
    c.offload = c.backend == SX_BACKEND_CUDA ? cfg.offload : SX_OFFLOAD_NONE;
    c.context = ctx;
    c.name = cfg.name;
    std::string key_space;
    SX_TRY(ctx->claim(cfg.name, &key_space));
    const std::shared_ptr<rdzv::Store> store = rdzv::make_prefix_store(ctx->store(), key_space);
    std::unique_ptr<ShardGroup> g;
    Status s = assemble(c, cfg.trace_path, Clock::now() + Millis(c.timeout_ms),
                        [&](std::shared_ptr<rdzv::Store> *opened) {
                            *opened = store;
                            return Status::Ok();
                        },
                        &g);
    if (!s.ok()) {
        ctx->release(cfg.name, true);
        return s;
    }
    // A regroup's rendezvous lies in the group's key space too; its group is made out of the
    // context (recovery/regroup.cc). Joining processes find the space by the group's name.
    if (c.rank == 0) {
        s = ctx->store()->set(group_space_key(cfg.name), key_space);
        if (!s.ok()) return s;
    }
    g->lineage_.root_store = store;
    for (int r = 0; r < g->world_size(); ++r) g->lineage_.member_ids.push_back(static_cast<uint64_t>(r));
    *out = std::move(g);
    return Status::Ok();
}

// The group's device, pool and DeviceOps (assemble's first step): a context's groups share
// its pool and charge their memory to its budget.
Status ShardGroup::make_device() {
    const GroupConfig &cfg = config_;
    const bool cuda = cfg.backend == SX_BACKEND_CUDA;
    std::unique_ptr<DeviceOps> device_ops;
    std::shared_ptr<HostAllocator> host_memory;  // an offloaded group's state: pinned
    const bool real_device = cuda && !cfg.simulated_device, offload = cuda && cfg.offload == SX_OFFLOAD_STATE;
    if (real_device) SX_TRY(make_cuda_ops(cfg.device_ordinal, &device_ops));
    if (real_device && offload) SX_TRY(make_pinned_allocator(cfg.device_ordinal, &host_memory));
    // A context's groups share its pool, and charge their memory to its budget.
    pool_ = cfg.context ? cfg.context->pool() : std::make_shared<optim::ThreadPool>(pool_threads(cfg));
    if (cuda && cfg.simulated_device)
        device_ops = make_simulated_ops(pool_.get(), SimulatedDevice{cfg.simulated_copy_delay_us}, &host_memory);
    ops_ = cuda ? std::move(device_ops) : make_host_ops(pool_.get());
    if (offload) state_ops_ = make_host_ops(pool_.get(), host_memory);
    if (cfg.context) {
        ops_->set_budget(cfg.context->budget());
        if (state_ops_) state_ops_->set_budget(cfg.context->budget());
    }
    return Status::Ok();
}

Status ShardGroup::assemble(const GroupConfig &config, const std::string &trace_path, Clock::time_point deadline,
                            const std::function<Status(std::shared_ptr<rdzv::Store> *)> &open_store,
                            std::unique_ptr<ShardGroup> *out) {
    const GroupConfig &cfg = config;
    std::unique_ptr<ShardGroup> g(new ShardGroup());
    g->config_ = cfg;
    g->lineage_.epoch = g->lineage_.attempted_epoch = cfg.epoch;
    if (!trace_path.empty()) {
        // From the start, so that the connections and the mesh's agreement are on it too.
        g->config_.trace_capacity = cfg.trace_capacity ? cfg.trace_capacity : trace::kDefaultCapacity;
        g->tracer_.reset(new trace::Tracer(trace::rank_path(trace_path, cfg.rank), cfg.rank, cfg.world_size,
                                           g->config_.trace_capacity));
    }
    SX_TRACE_SPAN(g->tracer(), "group", "sx_create_shard_group");
    ShardGroup *self = g.get();
    g->headers_.reset(new CallHeaders(cfg.rank, g->tracer(), [self](Status s) { return self->fail(s); }));

    // The device first: a group that cannot have it fails before it connects.
    SX_TRY(g->make_device());
    const int threads = g->pool_->size();
    std::shared_ptr<rdzv::Store> store;
    SX_TRY(open_store(&store));
    // Every rank must be there before any binds a socket per peer (Gloo's full mesh),
    // which for a large world takes longer than the wait: a missing rank then fails the
    // group at its deadline, not after the binding.
    SX_TRY(rdzv::await_ranks(*store, cfg.rank, cfg.world_size, deadline));
    g->mesh_.place(mesh_settings(cfg, g->ops_.get()), cfg.rank, cfg.world_size);
    SX_TRY(g->mesh_.open(std::move(store), g->config_.shard_size, *g->headers_, deadline));

    Units::Settings us = unit_settings(cfg, g->mesh_);
    us.widen_in_update = g->ops_->reads_16bit_grads() && !us.offload && g->mesh_.replicas() == 1;
    g->units_.configure(us, g->ops_.get(), g->state_ops_.get(), g->tracer(),
                        {&g->layout_, &g->table_.params(), &g->table_.groups(), &g->table_.applied()});
    g->round_.reset(new ReductionRound(g->pipeline_, g->tracer(), cfg.stage, g->mesh_.replicas() > 1));
    Gathers::Settings gs;
    gs.stage = cfg.stage;
    gs.shard_rank = g->mesh_.shard_rank();
    gs.shard_size = g->mesh_.shard_size();
    gs.prefetch_depth = cfg.prefetch_depth;
    gs.exchanged = us.exchanged;
    gs.own_on_host = g->units_.own_on_host();
    g->gathers_.reset(new Gathers(
        gs, *g->ops_, g->tracer(), *g->headers_, [self](Status s) { return self->fail(s); },
        [self] { return self->check_usable().ok(); },
        [self](std::unique_ptr<comm::Communicator> *out) {
            // Inside the shard group, through a key space of its own.
            const Mesh &m = self->mesh_;
            return m.connect(rdzv::make_prefix_store(m.store_ptr(), format("gather/%d/", m.replica_rank())),
                             m.shard_rank(), m.shard_size(), out);
        }));
    g->config_.num_threads = threads;
    if (cfg.memory_copy_interval > 0 && !cfg.joining) {
        const MemoryCopies::Settings cs = copy_settings(cfg, g->mesh_);
        std::unique_ptr<comm::Communicator> comm;
        if (cs.peers)
            SX_TRY(g->mesh_.connect(rdzv::make_prefix_store(g->mesh_.store_ptr(), "copies/"), cfg.rank, cfg.world_size,
                                    &comm, deadline));
        g->copies_.reset(new MemoryCopies(cs, g->state_ops(), std::move(comm)));
    }
    log(SX_LOG_INFO, "sx: rank %d of %d joined %s (stage %d, mesh %d x %d, %s)", g->mesh_.rank(), g->mesh_.world_size(),
        cfg.rendezvous.c_str(), cfg.stage, g->mesh_.shard_size(), g->mesh_.replicas(), where_it_runs(cfg, threads).c_str());
    if (g->tracer_)
        log(SX_LOG_INFO, "sx: rank %d traces its timeline into %s (written at sx_trace_flush and when the group is "
            "destroyed; open it in https://ui.perfetto.dev)", g->mesh_.rank(), g->tracer_->path().c_str());
    *out = std::move(g);
    return Status::Ok();
}

Status ShardGroup::flush_trace() {
    if (!tracer_) return Status::Ok();
    return tracer_->flush();
}

int fsdp_predivide_factor(int n) {
    // FSDP's rule (torch.distributed.algorithms._comm_hooks.default_hooks, DefaultState.
    // _get_gradient_predivide_factor): double f while it divides
    // n and n / f > f (32 for 1024 ranks), so that neither the divided gradients
    // underflow nor their sum overflows.
    int factor = 1;
    while (n % factor == 0 && n / factor > factor) factor *= 2;
    return factor;
}

ShardGroup::~ShardGroup() {
    // Wait for an abort() in progress on another thread (see abort_mu_).
    std::lock_guard<std::mutex> lock(abort_mu_);
    // Collectives still in flight on the channels (a prefetch the last call started) may
    // be ones the peers are about to join, and need this rank for: they get a moment to
    // finish (a healthy group's peers come within it). Those still in flight then would
    // wait for peers that may never join them: they are cut short, so that the channels'
    // threads end at once.
    auto busy = [this] { return (round_ && round_->busy()) || (gathers_ && gathers_->busy()); };
    const auto grace = std::chrono::steady_clock::now() + std::chrono::milliseconds(std::min(config_.timeout_ms, 1000));
    while (failure_.check().ok() && busy() && std::chrono::steady_clock::now() < grace)
        std::this_thread::sleep_for(std::chrono::microseconds(200));
    if (busy()) abort_communicators();
    round_.reset();    // its channels stopped
    gathers_.reset();  // its channel stopped, then its buffers and communicator
    // Every thread that records has ended: the file holds everything the ring kept. A
    // trace that cannot be written fails nothing.
    if (tracer_) {
        Status s = tracer_->flush();
        if (!s.ok()) log(SX_LOG_WARN, "sx: rank %d: %s", mesh_.rank(), s.message().c_str());
    }
    // A group a regroup was tried from may have a successor on its key space (lineage.h).
    if (config_.context) config_.context->release(config_.name, lineage_.attempted_epoch == 0);
}

// A regroup's new group (lineage.h): assembled like create's, on the store the regroup
// opened for its epoch.
Status ShardGroup::form(const GroupConfig &c, const std::string &trace_path, Clock::time_point deadline,
                        std::shared_ptr<rdzv::Store> store, std::unique_ptr<RecoveryAccess> *out) const {
    std::unique_ptr<ShardGroup> g;
    SX_TRY(assemble(c, trace_path, deadline,
                    [&](std::shared_ptr<rdzv::Store> *opened) {
                        *opened = store;
                        return Status::Ok();
                    },
                    &g));
    *out = std::move(g);
    return Status::Ok();
}

// ---------------------------------------------------------------------------------
// Registration

// Whether what sx_finalize would lay out fits the context's budget (each rank has its own,
// so the answer goes into the call's agreement): asked before anything is allocated, and
// every allocation is charged to it too (DeviceOps::allocate).
Status ShardGroup::fits_budget() {
    if (!config_.context) return Status::Ok();
    Layout probe;
    if (!build_layout(mesh_.shard_size(), &probe).ok()) return Status::Ok();  // the agreed checks say why
    std::vector<uint8_t> trainable;
    for (const auto &f : table_.flags()) trainable.push_back(f ? 1 : 0);
    return config_.context->budget()->check(units_.planned_bytes(probe, units_.size(), trainable),
                                            "the params, gradients and optimizer state that sx_finalize lays out");
}

Status ShardGroup::finalize() {
    SX_TRY(check_usable());
    SX_TRACE_SPAN(tracer(), "group", "sx_finalize");
    SX_CHECK(!table_.finalized() || table_.pending(), SX_ERR_INVALID_STATE,
             "the group is already finalized, and nothing was added since");
    SX_CHECK(!table_.params().empty(), SX_ERR_INVALID_STATE, "no params were added before sx_finalize");
    if (table_.finalized()) {
        // Units laid out before stay where they are; nothing of theirs may be in flight.
        SX_TRY(settle());
        SX_CHECK(stepper_.between_steps(), SX_ERR_INVALID_STATE,
                 "params and param groups added after sx_finalize are laid out between steps, not while "
                 "gradients are being reduced or accumulated");
    }

    // Every rank must have registered the same table.
    TableSettings table{config_.stage, config_.grad_dtype, config_.reduce_dtype, config_.grad_predivide_factor};
    std::vector<optim::Hyper> hypers;
    for (const ParamGroup &pg : table_.groups()) hypers.push_back(pg.hyper);
    SX_TRY(agree_call("sx_finalize", table_facts(table, hypers, table_.params(), table_.flags()), fits_budget(),
                      "ranks registered different param tables"));
    // Copies of the layout before cannot be restored into the one after: the next step
    // keeps the first of the new layout.
    if (copies_) copies_->reset();

    SX_TRY(units_.check_dtypes());
    SX_TRY(check_unit_optimizers(table_.params(), table_.groups()));
    Layout layout;
    SX_TRY(build_layout(mesh_.shard_size(), &layout));
    // The units laid out before come first, unchanged (new params are in new units with
    // larger ids).
    const size_t old_units = units_.size();
    for (size_t u = 0; u < old_units; ++u) {
        const UnitLayout &a = layout_.units()[u], &b = layout.units()[u];
        SX_CHECK(a.unit_id == b.unit_id && a.params == b.params && a.padded_numel == b.padded_numel, SX_ERR_INTERNAL,
                 "laying out added params moved unit %d", a.unit_id);
    }

    std::vector<Unit> added;
    SX_TRY(units_.allocate(layout, old_units, &added));
    // Commit, then allocate optimizer state for the trainable new units (the laid-out ones
    // keep the mask they were stepped with); on failure undo.
    Layout old_layout = std::move(layout_);
    layout_ = std::move(layout);
    units_.append(&added);
    const size_t old_params = table_.applied().size();
    std::vector<uint8_t> mask = table_.applied();
    for (size_t i = old_params; i < table_.flags().size(); ++i) mask.push_back(table_.flags()[i] ? 1 : 0);
    table_.applied().resize(table_.flags().size(), 0);
    const bool first = !table_.finalized();
    table_.set_finalized(true);
    Status s = stepper_.prepare(mask);
    // Stage 3 gathers on a channel of its own from the start.
    if (s.ok() && config_.stage == 3) s = gathers_->open();
    if (!s.ok()) {
        table_.set_finalized(!first);
        units_.truncate(old_units);
        layout_ = std::move(old_layout);
        table_.applied().resize(old_params);
        return s;
    }
    std::vector<int32_t> ids;
    for (size_t u = old_units; u < units_.size(); ++u) ids.push_back(layout_.units()[u].unit_id);
    round_->add_units(ids);
    uint64_t bytes = 0;
    for (size_t u = old_units; u < units_.size(); ++u) {
        Unit &unit = units_[u];
        const UnitLayout &ul = layout_.units()[u];
        gathers_->add_unit({ul.unit_id, ul.shard_numel, ul.padded_numel, dtype_size(unit.dtype), unit.params.data(),
                            unit.own.data()});
        bytes += unit.params.size() + unit.own.size();
    }
    gathers_->count_bytes(static_cast<int64_t>(bytes));
    table_.laid_out(layout_.units().back().unit_id);
    return Status::Ok();
}

// ---------------------------------------------------------------------------------
// Hyperparameters

Status ShardGroup::set_hyperparameter(int32_t group, int32_t key, double value) {
    SX_TRY(check_usable());
    SX_TRY(table_.check_group(group));
    optim::Hyper &h = table_.groups()[group].hyper;
    optim::Hyper changed = h;
    SX_TRY(core::set_hyperparameter(&changed, key, value));
    // The layout follows the state dtype (8-bit blocks never straddle shards): it is
    // fixed once sx_finalize laid the group out.
    const bool laid_out = table_.finalized() && static_cast<size_t>(group) < table_.groups().size() - table_.pending_groups();
    SX_CHECK(key != SX_HP_STATE_DTYPE || changed.state_dtype == h.state_dtype || !laid_out, SX_ERR_INVALID_STATE,
             "state_dtype of param group %d is %s and can only change before sx_finalize lays the group out "
             "(set it in its descriptor)",
             group, optim::state_dtype_name(h.state_dtype));
    SX_CHECK(key != SX_HP_BF16_STOCHASTIC_ROUND || changed.bf16_stochastic_round == h.bf16_stochastic_round ||
                 !laid_out,
             SX_ERR_INVALID_STATE,
             "bf16_stochastic_round of param group %d is %d and can only change before sx_finalize lays the group "
             "out (set it in its descriptor)",
             group, h.bf16_stochastic_round ? 1 : 0);
    if (record_.steps() > 0) {
        // A change that adds or moves a state slot (amsgrad's max_exp_avg_sq,
        // RMSprop's grad_avg) would start it from nothing, as torch cannot either.
        const optim::OptimizerSpec &spec = optim::spec_of(h.kind);
        double was = 0.0;
        SX_TRY(core::get_hyperparameter(h, key, &was));
        SX_CHECK(key > optim::kMaxHyperKey || !(spec.fixed_keys & (1u << key)) || was == value, SX_ERR_INVALID_STATE,
                 "%s of a %s group can only change before the first step", hyperparameter_name(h, key), spec.name);
        const int before = optim::state_slots(h), after = optim::state_slots(changed);
        for (int k = 0; k < std::min(before, after); ++k)
            SX_CHECK(std::strcmp(optim::state_slot_name(h, k), optim::state_slot_name(changed, k)) == 0,
                     SX_ERR_INVALID_STATE,
                     "setting %s = %g after the first step would move the %s group's state slot '%s'; "
                     "set it before the first step",
                     hyperparameter_name(h, key), value, spec.name, optim::state_slot_name(h, k));
    }
    h = changed;
    return Status::Ok();
}

// ---------------------------------------------------------------------------------
// Params and views

char *ShardGroup::params_base(size_t u) const {
    return static_cast<char *>(config_.stage == 3 ? gathers_->whole(u) : units_[u].params.data());
}

void *ShardGroup::param_data(int32_t param) const {
    const ParamPlacement &pl = layout_.placement(param);
    return params_base(static_cast<size_t>(pl.unit_index)) + pl.offset * dtype_size(units_[pl.unit_index].dtype);
}

void *ShardGroup::grad_data(int32_t param) const {
    const ParamPlacement &pl = layout_.placement(param);
    const Unit &u = units_[pl.unit_index];
    return u.grads.as<char>() + pl.offset * dtype_size(u.grad_dtype);
}

Status ShardGroup::unit_buffer(int32_t u, bool grad, void **data, uint64_t *numel, int32_t *dtype) const {
    SX_CHECK(table_.finalized(), SX_ERR_INVALID_STATE,
             "the group is not finalized yet: units are laid out in the flat buffers by sx_finalize");
    const int32_t n = static_cast<int32_t>(units_.size());
    SX_CHECK_ARG(u >= 0 && u < n, "unit index %d is out of range (%d units laid out)", u, n);
    const Unit &unit = units_[u];
    SX_CHECK(grad || config_.stage != 3 || gathers_->pins(static_cast<size_t>(u)) > 0, SX_ERR_INVALID_STATE,
             "unit %d is not gathered: at stage 3 a unit's params exist only between sx_unit_gather and "
             "sx_unit_release",
             u);
    *data = grad ? unit.grads.data() : params_base(static_cast<size_t>(u));
    *numel = layout_.units()[u].padded_numel;
    *dtype = grad ? unit.grad_dtype : unit.dtype;
    return Status::Ok();
}

int32_t ShardGroup::grad_dtype(int32_t param) const {
    return units_[layout_.placement(param).unit_index].grad_dtype;
}

Status ShardGroup::broadcast_params(int root) {
    SX_TRY(check_usable());
    SX_TRY(check_finalized());
    SX_TRACE_SPAN(tracer(), "group", "sx_broadcast_params");
    const Status local = root >= 0 && root < mesh_.world_size()
                             ? Status::Ok()
                             : SX_ERROR(SX_ERR_INVALID_ARGUMENT, "root rank %d is outside [0, %d)", root, mesh_.world_size());
    SX_TRY(agree_call("sx_broadcast_params", {{"the root", std::to_string(root)}}, local));
    if (copies_) copies_->mark_dirty();  // the next step keeps a copy of the new values
    fence_.wait_readers();
    {
        Status s = ops_->wait_for(nullptr);  // the trainer's writes into the param views
        if (!s.ok()) return fail(s);
    }
    if (config_.stage == 3) return broadcast_gathered(root);
    if (mesh_.world_size() == 1) {
        for (Unit &u : units_) u.values_valid = false;
        return Status::Ok();
    }
    for (Unit &u : units_) {
        u.values_valid = false;  // the next step takes the masters from the new values
        Status s = mesh_.world().broadcast(u.params.data(), u.params.size(), root);
        if (!s.ok()) return fail(s);
    }
    return Status::Ok();
}

Status ShardGroup::all_reduce(double *values, int32_t count, int32_t op) {
    SX_TRY(check_usable());
    static const char *const kOps[] = {"", "sum", "mean", "max", "min"};
    const bool op_ok = op >= SX_REDUCE_SUM && op <= SX_REDUCE_MIN;
    const Status local = !op_ok ? SX_ERROR(SX_ERR_INVALID_ARGUMENT,
                                           "op %d is not SX_REDUCE_SUM, SX_REDUCE_MEAN, SX_REDUCE_MAX or SX_REDUCE_MIN",
                                           op)
                         : count < 1 || count > SX_MAX_ALL_REDUCE
                             ? SX_ERROR(SX_ERR_INVALID_ARGUMENT, "count %d is not in [1, SX_MAX_ALL_REDUCE = %d]",
                                        count, SX_MAX_ALL_REDUCE)
                             : Status::Ok();
    SX_TRY(agree_call("sx_all_reduce", {{"op", op_ok ? kOps[op] : std::to_string(op)}, {"count", std::to_string(count)}},
                      local));
    const size_t n = static_cast<size_t>(count), W = static_cast<size_t>(mesh_.world_size());
    std::vector<double> all(W * n);
    std::copy(values, values + n, all.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(mesh_.rank()) * n));
    if (mesh_.world_size() > 1) {
        Status s = mesh_.world().all_gather(all.data(), n * sizeof(double));
        if (!s.ok()) return fail(s);
    }
    // In rank order, on every rank: the same bits everywhere. NaN wins every op.
    for (size_t i = 0; i < n; ++i) {
        double r = all[i];
        for (size_t k = 1; k < W; ++k) {
            const double v = all[k * n + i];
            if (std::isnan(r) || std::isnan(v)) {
                r = std::nan("");
            } else if (op == SX_REDUCE_SUM || op == SX_REDUCE_MEAN) {
                r += v;
            } else if (op == SX_REDUCE_MAX) {
                r = std::max(r, v);
            } else {
                r = std::min(r, v);
            }
        }
        values[i] = op == SX_REDUCE_MEAN ? r / static_cast<double>(W) : r;
    }
    return Status::Ok();
}

// ---------------------------------------------------------------------------------
// Trainability and optimizer state

Status ShardGroup::refresh_trainable() {
    SX_TRY(check_usable());
    SX_TRY(check_finalized());
    return stepper_.prepare(table_.flags());
}

// ---------------------------------------------------------------------------------
// The shard as checkpoints see it

Status ShardGroup::export_shard(ShardState *out) {
    ShardState st;
    st.sequence = ++checkpoints_;  // first: every rank draws it, whatever fails below
    SX_TRY(settle());  // deferred or prefetched gathers read the shard
    SX_TRY(ops_->wait_for(nullptr));
    SX_TRY(units_.ensure_masters(true));  // bf16_stochastic_round units: an fp32 copy
    for (size_t u = 0; u < units_.size(); ++u) st.units.push_back(unit_shard(u));
    st.trainable.resize(table_.params().size());
    for (size_t p = 0; p < table_.params().size(); ++p) st.trainable[p] = table_.flags()[p] ? 1 : 0;
    st.progress = stepper_.progress();
    *out = std::move(st);
    return Status::Ok();
}

// Stage 3's broadcast: the units gathered on `root` go to every rank, each keeping its
// shard of them.
Status ShardGroup::broadcast_gathered(int root) {
    // Which units root holds gathered: only those have values of root's to send.
    std::vector<uint64_t> on_root(units_.size(), 0);
    for (size_t u = 0; u < units_.size(); ++u) on_root[u] = mesh_.rank() == root && gathers_->pins(u) > 0 ? 1 : 0;
    if (mesh_.world_size() > 1) SX_TRY(collective([&](comm::Communicator &c) { return c.all_reduce_max(on_root.data(), on_root.size()); }));
    for (size_t u = 0; u < units_.size(); ++u) {
        if (!on_root[u]) continue;
        Unit &unit = units_[u];
        const uint64_t S = layout_.units()[u].shard_numel;
        const size_t es = dtype_size(unit.dtype);
        // Into the unit's own buffer where this rank holds it gathered too, else a scratch one.
        Buffer scratch;
        const bool held = gathers_->pins(u) > 0;
        if (!held) SX_TRY(ops_->allocate(layout_.units()[u].padded_numel * es, "a broadcast unit", &scratch, true));
        void *full = held ? gathers_->whole(u) : scratch.data();
        if (mesh_.world_size() > 1)
            SX_TRY(collective([&](comm::Communicator &c) { return c.broadcast(full, layout_.units()[u].padded_numel * es, root); }));
        const char *mine = static_cast<char *>(full) + static_cast<uint64_t>(mesh_.shard_rank()) * S * es;
        Status s = units_.own_on_host() ? ops_->to_host(unit.own.data(), mine, S * es)
                                        : ops_->copy(unit.own.data(), mine, S * es);
        if (!s.ok()) return fail(s);
        unit.values_valid = false;  // the next step takes the masters from the new values
    }
    return Status::Ok();
}

Status ShardGroup::gather_params() {
    SX_TRACE_SPAN(tracer(), "ckpt", "load.gather_params");
    SX_TRY(units_.masters_to_params());
    if (config_.stage == 3) {  // the gathered units, again
        SX_TRY(pipeline_.gather_after_update(false));
        return gathers_->drop_spares();
    }
    if (mesh_.shard_size() == 1) return Status::Ok();
    for (size_t u = 0; u < units_.size(); ++u) {
        const uint64_t bytes = layout_.units()[u].shard_numel * dtype_size(units_[u].dtype);
        SX_TRY(check_usable());
        SX_TRACE_SPAN(tracer(), "step", "all_gather", layout_.units()[u].unit_id, units_[u].params.size());
        Status s = mesh_.shard().all_gather(units_[u].params.data(), bytes);
        if (!s.ok()) return fail(s);
    }
    return Status::Ok();
}

MemoryStats ShardGroup::memory_stats() const {
    MemoryStats m;
    units_.count_bytes(&m.param_bytes, &m.grad_bytes, &m.optimizer_bytes, &m.unsharded_optimizer_bytes,
                       &m.device_bytes);
    for (size_t u = 0; u < units_.size(); ++u) {
        m.param_bytes += gathers_->whole_bytes(u);
        if (ops_->device() != SX_DEVICE_CPU) m.device_bytes += gathers_->whole_bytes(u);
    }
    m.peak_param_bytes = gathers_->peak_bytes();
    m.memory_copy_bytes = copies_ ? copies_->bytes() : 0;
    for (const std::shared_ptr<const KeptCopies> &k : lineage_.kept) m.memory_copy_bytes += k->bytes();
    return m;
}

// ---------------------------------------------------------------------------------
// What the ranks agree on (the agreement part: agreement.h)

// ShardAccess::agree_call; it settles the channels first (nothing of theirs may share the
// communicator), and at stage 3 meets the gathers (Gathers::meet).
Status ShardGroup::agree_call(const char *call, std::vector<Fact> facts, const Status &local, const char *intro) {
    SX_TRY(check_usable());
    SX_TRY(settle());
    SX_TRY(gathers_->meet(call));
    facts.insert(facts.begin(), Fact{"the call", call});
    CallHeader mine;
    mine.fingerprint = facts_fingerprint(facts);
    mine.refused = local.code();
    Status s = headers_->exchange(mesh_.world(), call, mine, [&] { return facts; }, nullptr, intro);
    // A rank that refused the call returns its own error, unless the ranks were in
    // different calls (which is what each is told).
    if (!local.ok() && (s.ok() || s.code() == local.code())) return local;
    return s;
}

Status ShardGroup::set_loss_scaling(const LossScaling &s) {
    SX_TRY(check_usable());
    SX_TRY(LossScaler::validate(s));
    scaler_.configure(s);
    return Status::Ok();
}

}  // namespace core
}  // namespace sx
