#include "core/context.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "base/log.h"
#include "comm/communicator.h"
#include "comm/shm/hierarchical.h"
#include "comm/shm/segment.h"
#include "rdzv/stores.h"

namespace sx {
namespace core {
bool valid_group_name(const std::string &name) {
    if (name.empty() || name.size() > 128) return false;
    return std::all_of(name.begin(), name.end(), [](char ch) {
        return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '-' ||
               ch == '_' || ch == '.';
    });
}

// Ranks on several hosts of the same number each: the shared memory of this host's ranks,
// under "shm/host<h>/" of the context's key space, which every rank of the context then
// learns each host could make ("shm-made/<rank>"), so that all decide alike whether its
// groups' channels share memory within the hosts (else every channel is on the Gloo mesh).
Status Context::open_hosts_memory(Context &c, const std::shared_ptr<rdzv::Store> &own, const comm::HostPlacement &p,
                                  Clock::time_point deadline) {
    const GroupConfig &b = c.base_;
    Status s = comm::SharedChannels::open(*rdzv::make_prefix_store(own, "shm/host" + std::to_string(p.host) + "/"),
                                          p.local, p.per_host, deadline, &c.channels_);
    if (!s.ok() && s.code() != SX_ERR_UNSUPPORTED) {
        own->set("shm-made/" + std::to_string(b.rank), "failed");  // the other hosts' ranks fail at once, too
        return s;
    }
    // "1": made; "0": it cannot be (SX_ERR_UNSUPPORTED: Gloo then).
    std::vector<std::string> made;
    SX_TRY(rdzv::gather_values(*own, "shm-made/", b.rank, b.world_size, s.ok() ? "1" : "0", deadline, &made));
    bool every = true;
    for (int q = 0; q < b.world_size; ++q) {
        SX_CHECK(made[static_cast<size_t>(q)] != "failed", SX_ERR_COMM,
                 "the context's rank %d could not open its host's shared memory (its own error says why)", q);
        every = every && made[static_cast<size_t>(q)] == "1";
    }
    if (!every) {
        if (!s.ok()) log(SX_LOG_WARN, "sx: rank %d: %s; the context's groups take channels on Gloo", b.rank,
                         s.message().c_str());
        c.channels_.reset();
    }
    return Status::Ok();
}

// The one Gloo full mesh of a CPU context without shared memory, under "gloo/" of its own
// key space (the channels' ids are counted there).
Status Context::open_gloo(Context &c, const std::shared_ptr<rdzv::Store> &own, Clock::time_point deadline) {
    comm::GlooOptions o;
    o.timeout = Millis(c.base_.timeout_ms);
    o.deadline = deadline;
    o.bind_address = c.base_.bind_address;
    return comm::open_gloo_channels(rdzv::make_prefix_store(own, "gloo-mesh/"), c.base_.rank, c.base_.world_size, o,
                                    &c.gloo_channels_);
}

Status Context::create(const GroupConfig &cfg, uint64_t budget, std::shared_ptr<Context> *out) {
    const Millis timeout(cfg.timeout_ms);
    const Clock::time_point deadline = Clock::now() + timeout;
    std::shared_ptr<Context> c(new Context());
    rdzv::Rendezvous rv;
    SX_TRY(resolve_config(cfg, &rv, &c->base_));
    GroupConfig &b = c->base_;
    SX_TRY(rdzv::open_store(rv, timeout, &c->store_));
    std::shared_ptr<rdzv::Store> own = rdzv::make_prefix_store(c->store_, "context/");
    SX_TRY(rdzv::await_ranks(*own, b.rank, b.world_size, deadline));
    b.num_threads = pool_threads(b);
    c->pool_ = std::make_shared<optim::ThreadPool>(b.num_threads);
    c->budget_ = std::make_shared<MemoryBudget>(budget);
    // SX_TRANSPORT_TCP, or SX_SHARED_MEMORY=0, keeps the groups on their own connections.
    const char *shm = std::getenv("SX_SHARED_MEMORY");
    const bool may_share = b.backend == SX_BACKEND_CPU && b.transport != SX_TRANSPORT_TCP &&
                           !(shm && std::strcmp(shm, "0") == 0);
    // Every CPU rank says where it runs, or (empty) that it keeps off shared memory: where
    // one does, none shares it.
    std::vector<std::string> hosts;
    if (b.backend == SX_BACKEND_CPU)
        SX_TRY(comm::exchange_host_identities(*own, b.rank, b.world_size, may_share ? comm::host_identity() : "",
                                              deadline, &hosts));
    const auto off = std::find(hosts.begin(), hosts.end(), std::string());
    if (may_share && off != hosts.end())
        log(SX_LOG_WARN, "sx: rank %d: rank %d of the context keeps off shared memory (SX_SHARED_MEMORY=0 or "
            "SX_TRANSPORT_TCP), so its groups take channels on Gloo", b.rank, static_cast<int>(off - hosts.begin()));
    const bool shares = may_share && off == hosts.end();
    const bool one_host =
        shares && std::all_of(hosts.begin(), hosts.end(), [&](const std::string &h) { return h == hosts[0]; });
    comm::HostPlacement placement;
    if (one_host) {
        Status s = comm::SharedChannels::open(*rdzv::make_prefix_store(own, "shm/"), b.rank, b.world_size, deadline,
                                              &c->channels_);
        if (s.code() != SX_ERR_UNSUPPORTED) SX_TRY(s);
        // Every rank learns it alike (rank 0 could not make the segment).
        if (!s.ok()) log(SX_LOG_WARN, "sx: rank %d: %s; the context's groups take channels on Gloo", b.rank,
                         s.message().c_str());
    } else if (shares && comm::place_hosts(hosts, &placement) && comm::locate_rank(&placement, b.rank)) {
        SX_TRY(open_hosts_memory(*c, own, placement, deadline));
    }
    // Several hosts, with shared memory within each or without: the Gloo mesh between them.
    if (b.backend == SX_BACKEND_CPU && b.world_size > 1 && !(one_host && c->channels_))
        SX_TRY(open_gloo(*c, own, deadline));
    log(SX_LOG_INFO, "sx: rank %d of %d made a context on %s (%d threads, %s%s)", b.rank, b.world_size,
        b.rendezvous.c_str(), b.num_threads,
        c->channels_ && c->gloo_channels_ ? "its groups' channels in shared memory on each host and on one Gloo mesh between"
        : c->channels_                    ? "its groups' channels in shared memory"
        : c->gloo_channels_               ? "its groups' channels on one Gloo mesh"
                                          : "its groups connect on their own",
        budget ? format(", a budget of %llu bytes", static_cast<unsigned long long>(budget)).c_str() : "");
    *out = std::move(c);
    return Status::Ok();
}

Context::~Context() = default;

Status Context::claim(const std::string &name, std::string *key_space) {
    SX_CHECK_ARG(valid_group_name(name),
                 "the group's name '%s' in its context must be 1 to 128 letters, digits, '-', '_' or '.'",
                 name.c_str());
    forget_released();
    std::lock_guard<std::mutex> lock(mu_);
    SX_CHECK(!closed_, SX_ERR_INVALID_STATE,
             "the context was destroyed (sx_destroy_context): no group may be made in it any more");
    SX_CHECK(live_.count(name) == 0, SX_ERR_INVALID_STATE,
             "a live group of the context is named '%s' already: each group of a context has a name of its own",
             name.c_str());
    const int64_t n = made_[name]++;
    ++created_;
    *key_space = format("groups/%s/%lld/", name.c_str(), static_cast<long long>(n));
    live_[name] = *key_space;
    return Status::Ok();
}

void Context::release(const std::string &name, bool erasable) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(name);
    if (it == live_.end()) return;
    if (erasable) released_.push_back(it->second);
    live_.erase(it);
}

// Each gone group's key space: this rank counts itself out ("__sx/left"), and the last of
// the context's ranks to do so erases the space. A request that fails leaves the keys
// where they are (the claim that follows meets the store's trouble itself).
void Context::forget_released() {
    std::vector<std::string> gone;
    {
        std::lock_guard<std::mutex> lock(mu_);
        gone.swap(released_);
    }
    for (const std::string &space : gone) {
        int64_t left = 0;
        Status s = store_->add(space + "__sx/left", 1, &left);
        if (s.ok() && left == base_.world_size) s = store_->erase_prefix(space);
        if (!s.ok())
            log(SX_LOG_DEBUG, "sx: rank %d: the keys of a gone group stay in the store (%s): %s", base_.rank,
                space.c_str(), s.message().c_str());
    }
}

void Context::close() {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
}

Context::Stats Context::stats() const {
    Stats s;
    {
        std::lock_guard<std::mutex> lock(mu_);
        s.groups = static_cast<int64_t>(live_.size());
        s.groups_created = created_;
    }
    s.channels = (channels_ ? channels_->channels_open() : 0) +
                 (gloo_channels_ ? comm::gloo_channels_open(*gloo_channels_) : 0);
    s.memory_bytes = budget_->used();
    s.memory_budget_bytes = budget_->limit();
    s.shared_memory = !channels_ ? 0 : gloo_channels_ ? 2 : 1;
    s.transport_bytes = gloo_channels_ ? comm::gloo_channels_kept_bytes(*gloo_channels_) : 0;
    return s;
}

}  // namespace core
}  // namespace sx
