#include "core/memory_copies.h"

#include <algorithm>
#include <cstring>
#include <sstream>

#include "base/log.h"

namespace sx {
namespace core {

uint64_t ShardCopy::bytes() const {
    uint64_t b = 0;
    for (const std::vector<uint8_t> &u : units) b += u.size();
    return b;
}

const ShardCopy *KeptCopies::find(uint64_t seq, bool own_copy) const {
    for (const ShardCopy &c : own_copy ? own : peer)
        if (c.seq == seq) return &c;
    return nullptr;
}

uint64_t KeptCopies::bytes() const {
    uint64_t b = 0;
    for (const std::vector<ShardCopy> *set : {&own, &peer})
        for (const ShardCopy &c : *set) b += c.bytes();
    return b;
}

std::string describe_holdings(const std::vector<CopyHolding> &h) {
    std::string out;
    for (const CopyHolding &c : h)
        out += format("%s %d %llu %d %d;", c.own ? "own" : "peer", c.epoch, static_cast<unsigned long long>(c.seq),
                      c.shard, c.shards);
    return out;
}

Status parse_holdings(const std::string &text, std::vector<CopyHolding> *out) {
    out->clear();
    std::istringstream in(text);
    std::string item;
    while (std::getline(in, item, ';')) {
        if (item.empty()) continue;
        std::istringstream f(item);
        std::string kind;
        CopyHolding c;
        f >> kind >> c.epoch >> c.seq >> c.shard >> c.shards;
        SX_CHECK(f && (kind == "own" || kind == "peer") && c.shards > 0 && c.shard >= 0 && c.shard < c.shards,
                 SX_ERR_CORRUPT,
                 "a survivor's list of memory copies in the rendezvous store is unreadable: '%s'", text.c_str());
        c.own = kind == "own";
        out->push_back(c);
    }
    return Status::Ok();
}

CopyChoice choose_copies(const std::vector<std::vector<CopyHolding>> &holdings) {
    CopyChoice choice;
    auto holds = [&](size_t m, int epoch, uint64_t seq, bool own, int shard) {
        for (const CopyHolding &c : holdings[m])
            if (c.own == own && c.epoch == epoch && c.seq == seq && (shard < 0 || c.shard == shard)) return true;
        return false;
    };
    // Every copy some member holds its own of, newest first: the latest group's, then
    // the highest number.
    struct Candidate {
        int epoch;
        uint64_t seq;
        int shards;
    };
    std::vector<Candidate> candidates;
    for (const std::vector<CopyHolding> &h : holdings)
        for (const CopyHolding &c : h)
            if (c.own) candidates.push_back({c.epoch, c.seq, c.shards});
    std::sort(candidates.begin(), candidates.end(), [](const Candidate &a, const Candidate &b) {
        return a.epoch != b.epoch ? a.epoch > b.epoch : a.seq > b.seq;
    });
    choice.why_not = "no survivor keeps memory copies";
    bool explained = false;  // why_not says why the newest copy cannot be taken
    for (size_t k = 0; k < candidates.size(); ++k) {
        const Candidate &cand = candidates[k];
        if (k > 0 && candidates[k - 1].epoch == cand.epoch && candidates[k - 1].seq == cand.seq) continue;
        // Each shard from an own copy where one is held (its holder took it), else a peer's.
        std::vector<int> provider(static_cast<size_t>(cand.shards), -1);
        std::vector<bool> own(static_cast<size_t>(cand.shards), true);
        int missing = -1;
        for (int i = 0; i < cand.shards && missing < 0; ++i) {
            for (int pass = 0; pass < 2 && provider[i] < 0; ++pass)
                for (size_t m = 0; m < holdings.size() && provider[i] < 0; ++m)
                    if (holds(m, cand.epoch, cand.seq, pass == 0, i)) {
                        provider[i] = static_cast<int>(m);
                        own[i] = pass == 0;
                    }
            if (provider[i] < 0) missing = i;
        }
        if (missing >= 0) {
            if (!explained)
                choice.why_not = format("no survivor holds shard %d of copy %llu of epoch %d's group (the lost ranks "
                                        "held its every copy)",
                                        missing, static_cast<unsigned long long>(cand.seq), cand.epoch);
            explained = true;
            continue;
        }
        choice.found = true;
        choice.epoch = cand.epoch;
        choice.seq = cand.seq;
        choice.shards = cand.shards;
        choice.provider = provider;
        choice.provider_own = own;
        for (size_t m = 0; m < holdings.size() && choice.progress_from < 0; ++m)
            if (holds(m, cand.epoch, cand.seq, true, -1)) choice.progress_from = static_cast<int>(m);
        choice.why_not.clear();
        return choice;
    }
    return choice;
}

namespace {

template <typename T>
void put(std::string *out, const T &v) {
    out->append(reinterpret_cast<const char *>(&v), sizeof v);
}
template <typename T>
void put_vector(std::string *out, const std::vector<T> &v) {
    put(out, static_cast<uint64_t>(v.size()));
    if (!v.empty()) out->append(reinterpret_cast<const char *>(v.data()), v.size() * sizeof(T));
}

class Reader {
  public:
    explicit Reader(const std::string &s) : s_(s) {}
    template <typename T>
    bool get(T *v) {
        if (s_.size() - at_ < sizeof *v) return false;
        std::memcpy(v, s_.data() + at_, sizeof *v);
        at_ += sizeof *v;
        return true;
    }
    template <typename T>
    bool get_vector(std::vector<T> *v) {
        uint64_t n = 0;
        if (!get(&n) || n > (s_.size() - at_) / sizeof(T)) return false;
        v->resize(static_cast<size_t>(n));
        if (n) std::memcpy(v->data(), s_.data() + at_, n * sizeof(T));
        at_ += n * sizeof(T);
        return true;
    }
    bool done() const { return at_ == s_.size(); }

  private:
    const std::string &s_;
    size_t at_ = 0;
};

}  // namespace

std::string pack_progress(const std::vector<int> &slots, const ShardProgress &p) {
    std::string out;
    put_vector(&out, slots);
    put(&out, p.steps_taken);
    put(&out, static_cast<uint64_t>(p.params.size()));
    for (const ParamProgress &q : p.params) {
        put(&out, q.step);
        put(&out, q.momentum_steps);
        put(&out, q.mu_product);
        put_vector(&out, q.row_var);
        put_vector(&out, q.col_var);
    }
    put_vector(&out, p.hypers);  // plain values: every rank runs the same library
    put_vector(&out, p.group_steps);
    put(&out, p.scaler);
    return out;
}

Status unpack_progress(const std::string &bytes, std::vector<int> *slots, ShardProgress *p) {
    Reader r(bytes);
    uint64_t params = 0;
    bool ok = r.get_vector(slots) && r.get(&p->steps_taken) && r.get(&params) && params <= bytes.size();
    p->params.assign(ok ? static_cast<size_t>(params) : 0, ParamProgress());
    for (ParamProgress &q : p->params)
        ok = ok && r.get(&q.step) && r.get(&q.momentum_steps) && r.get(&q.mu_product) && r.get_vector(&q.row_var) &&
             r.get_vector(&q.col_var);
    ok = ok && r.get_vector(&p->hypers) && r.get_vector(&p->group_steps) && r.get(&p->scaler) && r.done();
    SX_CHECK(ok, SX_ERR_CORRUPT, "the state's progress sent to a joining rank is truncated (%zu bytes)", bytes.size());
    return Status::Ok();
}

MemoryCopies::MemoryCopies(const Settings &s, DeviceOps &ops, std::unique_ptr<comm::Communicator> comm)
    : s_(s), ops_(ops), comm_(std::move(comm)) {
    thread_ = std::thread([this] { run(); });
}

MemoryCopies::~MemoryCopies() {
    {
        std::unique_lock<std::mutex> lock(mu_);
        // A sending in flight is one the peers take part in: it gets a moment to end.
        cv_.wait_for(lock, std::chrono::seconds(2), [this] { return !busy_; });
    }
    if (comm_) comm_->abort();
    {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
}

void MemoryCopies::take(std::vector<UnitShard> units, ShardProgress progress, std::unique_ptr<ShardFence::Hold> hold,
                        bool send) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return !busy_; });
    if (broken_ || stop_ || stop_taking_) return;  // the hold goes: nothing is copied
    std::unique_ptr<Job> job(new Job());
    // The slot that does not hold the newest copy every rank has.
    job->slot = newest_ < 0 ? 0 : 1 - newest_;
    own_[job->slot].valid = false;
    peer_[job->slot].valid = false;
    own_[job->slot].seq = next_seq_++;
    job->units = std::move(units);
    job->progress = std::move(progress);
    job->hold = std::move(hold);
    job->send = send;
    job_ = std::move(job);
    busy_ = true;
    dirty_ = false;
    lock.unlock();
    cv_.notify_all();
}

Status MemoryCopies::wait_sent() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return !busy_; });
    SX_CHECK(!broken_, SX_ERR_COMM, "rank %d: this step's memory copy did not reach the next rank (a peer is lost); "
             "the step is taken again after a regroup", s_.rank);
    return Status::Ok();
}

void MemoryCopies::reset() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return !busy_; });
    for (ShardCopy *copy : {&own_[0], &own_[1], &peer_[0], &peer_[1]}) *copy = ShardCopy();
    newest_ = -1;
    dirty_ = true;
    bytes_.store(0);
}

void MemoryCopies::abort() {
    if (comm_) comm_->abort();
    std::lock_guard<std::mutex> lock(mu_);
    broken_ = true;
}

void MemoryCopies::finish(Millis grace) {
    {
        std::unique_lock<std::mutex> lock(mu_);
        if (cv_.wait_for(lock, grace, [this] { return !busy_; })) return;
    }
    abort();
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return !busy_; });
}

std::vector<CopyHolding> MemoryCopies::holdings() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<CopyHolding> out;
    for (const ShardCopy *c : {&own_[0], &own_[1], &peer_[0], &peer_[1]})
        if (c->valid) out.push_back({c == &own_[0] || c == &own_[1], s_.epoch, c->seq, c->shard, s_.shards});
    return out;
}

bool MemoryCopies::settled() const {
    std::lock_guard<std::mutex> lock(mu_);
    return s_.peers ? newest_ >= 0 : completed_ >= 2;
}

std::shared_ptr<const KeptCopies> MemoryCopies::release() {
    std::lock_guard<std::mutex> lock(mu_);
    stop_taking_ = true;
    std::shared_ptr<KeptCopies> kept(new KeptCopies());
    kept->epoch = s_.epoch;
    kept->shards = s_.shards;
    for (ShardCopy *c : {&own_[0], &own_[1]})
        if (c->valid) kept->own.push_back(std::move(*c));
    for (ShardCopy *c : {&peer_[0], &peer_[1]})
        if (c->valid) kept->peer.push_back(std::move(*c));
    for (ShardCopy *c : {&own_[0], &own_[1], &peer_[0], &peer_[1]}) *c = ShardCopy();
    bytes_.store(0);
    return kept;
}

const ShardCopy *MemoryCopies::find(uint64_t seq, bool own) const {
    std::lock_guard<std::mutex> lock(mu_);
    const ShardCopy *set = own ? own_ : peer_;
    for (int k = 0; k < 2; ++k)
        if (set[k].valid && set[k].seq == seq) return &set[k];
    return nullptr;
}

uint64_t MemoryCopies::bytes() const { return bytes_.load(); }

void MemoryCopies::run() {
    for (;;) {
        std::unique_ptr<Job> job;
        {
            std::unique_lock<std::mutex> lock(mu_);
            cv_.wait(lock, [this] { return stop_ || job_ != nullptr; });
            if (!job_) return;
            job = std::move(job_);
        }
        Status s = copy_out(*job);
        job->hold.reset();  // the live shard may change again
        if (s.ok() && s_.peers && job->send) s = send(job->slot);
        // Only this thread resizes the slots (reset() waits for it to be idle).
        bytes_.store(own_[0].bytes() + own_[1].bytes() + peer_[0].bytes() + peer_[1].bytes());
        {
            std::lock_guard<std::mutex> lock(mu_);
            if (s.ok()) {
                newest_ = job->slot;
                ++completed_;
            } else if (!broken_) {
                broken_ = true;
                log(SX_LOG_WARN, "sx: rank %d: memory copy %llu: %s; no later copy is taken", s_.rank,
                    static_cast<unsigned long long>(own_[job->slot].seq), s.message().c_str());
            }
            busy_ = false;
        }
        cv_.notify_all();
    }
}

// The live shard into the job's own slot: on a device, on its copy engine to the host (a
// stream of its own), apart from the step's work, and waited for at the end.
Status MemoryCopies::copy_out(Job &job) {
    uint64_t last = 0;
    ShardCopy &c = own_[job.slot];
    c.units.resize(job.units.size());
    c.slots.resize(job.units.size());
    for (size_t u = 0; u < job.units.size(); ++u) {
        const UnitShard &us = job.units[u];
        // A bf16_stochastic_round unit's bf16 params, never a checkpoint's fp32 copy of them.
        const void *values = us.bf16_params ? static_cast<const void *>(us.bf16_params) : us.values;
        const CopiedUnit at(us.shard_numel, us.bf16_params ? sizeof(uint16_t) : sizeof(float), us.state_slots,
                            us.slot_bytes, us.slot_scales);
        c.slots[u] = us.state_slots;
        c.units[u].resize(static_cast<size_t>(at.bytes()));
        uint8_t *to = c.units[u].data();
        if (us.shard_numel == 0) continue;
        SX_TRY(ops_.to_host_async(to, values, at.values_bytes, &last));
        for (int k = 0; k < us.state_slots; ++k) {
            if (at.slot_bytes) SX_TRY(ops_.to_host_async(to + at.slot_at(k), us.state[k], at.slot_bytes, &last));
            if (at.scale_bytes) SX_TRY(ops_.to_host_async(to + at.scales_at(k), us.scales[k], at.scale_bytes, &last));
        }
    }
    SX_TRY(ops_.wait_copy(last));  // and every copy before it
    c.progress = std::move(job.progress);
    c.shard = s_.shard;
    std::lock_guard<std::mutex> lock(mu_);
    c.valid = true;
    return Status::Ok();
}

// The own copy in `slot` to the next rank, the previous rank's into peer_[slot]: per
// receiving rank one gather of the units' sizes (a shard of packed state takes as many
// bytes as its pieces: another rank's may differ from this one's) and one of the bytes,
// then the barrier that tells every rank each received.
Status MemoryCopies::send(int slot) {
    const int W = s_.world_size, r = s_.rank;
    const ShardCopy &mine = own_[slot];
    ShardCopy &theirs = peer_[slot];
    const size_t units = mine.units.size();
    std::vector<uint64_t> my_sizes(units), their_sizes(units);
    for (size_t u = 0; u < units; ++u) my_sizes[u] = mine.units[u].size();
    theirs.units.resize(units);
    auto pieces = [](const std::vector<std::vector<uint8_t>> &bytes) {
        std::vector<comm::Piece> out;
        for (const std::vector<uint8_t> &u : bytes) out.push_back({const_cast<uint8_t *>(u.data()), u.size()});
        return out;
    };
    for (int root = 0; root < W; ++root) {
        const int sender = (root + W - 1) % W;
        std::vector<comm::Piece> send;
        std::vector<std::vector<comm::Piece>> receive(r == root ? static_cast<size_t>(W) : 0);
        if (r == sender) send = {{my_sizes.data(), units * sizeof(uint64_t)}};
        if (r == root) receive[static_cast<size_t>(sender)] = {{their_sizes.data(), units * sizeof(uint64_t)}};
        SX_TRY(comm_->gather_pieces(send, receive, root));
        if (r == root) {
            for (size_t u = 0; u < units; ++u) theirs.units[u].resize(static_cast<size_t>(their_sizes[u]));
            receive[static_cast<size_t>(sender)] = pieces(theirs.units);
        }
        if (r == sender) send = pieces(mine.units);
        SX_TRY(comm_->gather_pieces(send, receive, root));
        if (r == root) {
            // Held from now: it arrived whole, whatever happens to the barrier.
            std::lock_guard<std::mutex> lock(mu_);
            theirs.slots = mine.slots;
            theirs.seq = mine.seq;
            theirs.shard = sender;  // flat: the predecessor's shard index is its rank
            theirs.valid = true;
        }
    }
    return comm_->barrier();
}

}  // namespace core
}  // namespace sx
