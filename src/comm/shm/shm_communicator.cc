// The Communicator of ranks on one host (communicator.h, create_shm_communicator): every
// collective through one shared segment (segment.h), the ranks meeting at barriers of
// their own.
//
// The segment holds a line of 64 bytes per rank (the barriers it reached, whether it
// left), two call lines per rank (the call it is in, used by its calls in turn, each with
// room for a small all-reduce's values) and a slot of `slot_bytes` per rank. A collective moves its
// data in chunks that fit the slots: each rank copies its part of a chunk into its own
// slot, the ranks meet at a barrier, each reads what it needs from the others' slots
// (sums in rank order: the same bits for any chunking), and they meet again before the
// slots are reused. At the first barrier of a call the ranks compare what they were
// called for: ranks in different collectives fail with SX_ERR_MISMATCH before anyone
// reads a peer's slot; they all leave that call together and the communicator stays
// usable. A call may carry a rider (communicator.h): its tag is compared there too, and
// its value read from the lines after it. A collective of one chunk is thus one barrier at which every rank
// brings its data and one after which nobody reads it: a rank whose group is destroyed
// once it has brought its data (a prefetch in flight) does not fail its peers. A small
// all-reduce (at most 8 KiB) is one barrier: its values go in the call's line, which the
// rank's next call but one reuses, by when every rank has read them.
//
// The large exchanges (reduce-scatter, all-gather, broadcast) skip the slots where the
// ranks can read each other's buffers: each leaves where its buffer is in its line (ranks
// that are threads of one process: its address; processes: its offset in the process's
// shared arena, base/shared_arena.h, which every rank mapped at setup), and after the
// first barrier the others read that buffer where it is (a reduce-scatter sums its slice
// of every rank's buffer, an all-gather or a broadcast copies from the owner's), then a
// barrier frees the buffers. Whether they can is decided by every rank alike from the
// lines after that first barrier; where some buffers are not in an arena, those ranks
// have brought their first chunk to their slots already, the others bring theirs, and all
// meet once more before the chunks move through the slots.
//
// Waiting: a rank spins on a peer's barrier count for 100 µs (yielding), then sleeps on it
// (a futex on the shared word, woken by the peer's arrival), checking every millisecond
// or so for its deadline (SX_ERR_TIMEOUT), abort() (SX_ERR_ABORTED), a peer that left (it
// failed, aborted or was destroyed: SX_ERR_COMM, or SX_ERR_TIMEOUT where that peer timed
// out) and a peer process that no longer exists (SX_ERR_COMM). No wait is without a
// deadline. After any failure this rank leaves too, so that its peers fail at once. A
// context's channel also posts its first failure (or fail_channel's reason) in the
// channel's notice, which every wait looks at with its peer: the peers waiting on other
// ranks, and every later call, fail at once too, naming the rank that failed first.
#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <mutex>

#include "base/half.h"
#include "base/log.h"
#include "comm/communicator.h"
#include "base/shared_arena.h"
#include "comm/shm/segment.h"
#include "rdzv/stores.h"

namespace sx {
namespace comm {
namespace {

// The calls, as ranks compare them.
enum Op : uint32_t {
    kReduceScatter = 1,
    kReduceScatter16,
    kAllGather,
    kAllReduceSum,
    kAllReduceSumF32,
    kAllReduceMax,
    kBroadcast,
    kGatherPieces,
    kScatterPieces,
    kBarrier,
};

const char *op_name(uint32_t op) {
    switch (op) {
        case kReduceScatter: return "reduce_scatter_sum";
        case kReduceScatter16: return "reduce_scatter_sum_16";
        case kAllGather: return "all_gather";
        case kAllReduceSum: return "all_reduce_sum";
        case kAllReduceSumF32: return "all_reduce_sum_f32";
        case kAllReduceMax: return "all_reduce_max";
        case kBroadcast: return "broadcast";
        case kGatherPieces: return "gather_pieces";
        case kScatterPieces: return "scatter_pieces";
        case kBarrier: return "barrier";
        default: return "an unknown call";
    }
}

// One rank's line of the segment. Lock-free atomics are address-free, so they work
// between processes mapping the same memory.
struct alignas(64) Line {
    std::atomic<uint32_t> arrived;  // the last barrier it reached (a futex word)
    std::atomic<uint32_t> waiters;  // ranks asleep on `arrived`
    std::atomic<uint32_t> left;     // 0, or the sx_status_t with which it left
    std::atomic<int32_t> pid;
    std::atomic<uint64_t> bytes;    // gather/scatter_pieces: the bytes it sends or receives
    std::atomic<uint64_t> buffer;   // its buffer in this call: the address (ranks of one process),
                                    // or 1 + its offset in the rank's arena (0: none)
};
static_assert(sizeof(Line) == 64, "one cache line per rank");

// What a rank's call is, as the ranks compare it at the call's first barrier. Each rank
// has two, used by its calls in turn (by the parity of the call's number), followed by
// room for a small all-reduce's values: a rank writes call k + 2's only once every rank
// has reached call k + 1's first barrier, and so has done with call k's, which lets a
// small all-reduce end at its one barrier.
struct alignas(64) CallLine {
    std::atomic<uint32_t> op;           // the call (Op) ...
    std::atomic<int32_t> root;          // ... its root (-1 where none)
    std::atomic<uint64_t> size;         // ... and size (elements or bytes, as the call counts)
    std::atomic<uint64_t> rider_tag;    // the call's rider (0: none) ...
    std::atomic<uint64_t> rider_value;  // ... and its value's bits
};
static_assert(sizeof(CallLine) == 64, "one cache line per call");
static_assert(std::atomic<uint32_t>::is_always_lock_free && std::atomic<uint64_t>::is_always_lock_free,
              "shared-memory atomics must be lock-free");

// The most ranks of one host's communicator: a machine's cores (512 hardware threads on
// two of today's largest CPUs), one rank each. Each rank has one slot of the region, and
// the barriers scan every rank's line.
constexpr int kMaxRanks = 512;
// The lines, one per rank, padded to whole pages (4 KiB, 64 ranks, at the least).
size_t header_bytes(int world_size) { return (static_cast<size_t>(world_size) * sizeof(Line) + 4095) / 4096 * 4096; }
// After the lines, per rank: why it left, in words (NUL-terminated; written before
// `left`), so that the peers it leaves waiting say what went wrong where it did.
constexpr size_t kReasonBytes = 256;
// Then the channel's notice (a context's channels: fail_channel): the first rank to fail a
// call, or to fail the channel with a reason, says so here, once; every other rank's waits
// (which look at it as they look at their peers) and later calls then fail with it, not at
// their own timeouts. Its reason follows it.
struct alignas(64) Notice {
    std::atomic<uint32_t> state;  // 0: none; 1: its one writer is writing; 2: published
    std::atomic<int32_t> rank;    // who failed first
    std::atomic<uint32_t> code;   // and why (sx_status_t)
};
constexpr size_t kNoticeBytes = sizeof(Notice) + kReasonBytes;
constexpr size_t kDefaultSlotBytes = 8 << 20;
constexpr size_t kBlock = 4096;  // elements summed in a stack buffer at a time
constexpr size_t kSmall = 1024;  // an all-reduce of at most this many values per chunk: two barriers
// An all-reduce of at most this many bytes goes through its call's line: one barrier.
constexpr size_t kSmallBytes = 8192;
constexpr size_t kCallBytes = sizeof(CallLine) + kSmallBytes;  // per rank and parity
constexpr std::chrono::microseconds kSpin(100);  // a wait spins (yielding) this long, then sleeps
constexpr std::chrono::microseconds kCheck(500);  // how often a wait looks at its peer and deadline

// ThreadSanitizer ties a release to an acquire by address, but ranks that are threads of
// one process each map the segment at an address of their own: under it, every barrier
// also releases and acquires one key of this process, so that it sees the order the
// barrier gives (and reports no race on the data a barrier hands over).
#if defined(__SANITIZE_THREAD__)
extern "C" void __tsan_acquire(void *addr);
extern "C" void __tsan_release(void *addr);
char tsan_barrier_key;
inline void barrier_released() { __tsan_release(&tsan_barrier_key); }
inline void barrier_acquired() { __tsan_acquire(&tsan_barrier_key); }
#else
inline void barrier_released() {}
inline void barrier_acquired() {}
#endif

long futex(std::atomic<uint32_t> *word, int op, uint32_t value, const struct timespec *timeout) {
    return ::syscall(SYS_futex, reinterpret_cast<uint32_t *>(word), op, value, timeout, nullptr, 0);
}

// Whether barrier count `have` has reached `want` (counts wrap around).
bool reached(uint32_t have, uint32_t want) { return static_cast<int32_t>(have - want) >= 0; }

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

// A cursor over a list of pieces, read or written as one stream of bytes.
struct Stream {
    const std::vector<Piece> &pieces;
    size_t index = 0, offset = 0;
    explicit Stream(const std::vector<Piece> &p) : pieces(p) {}
    // Copies n bytes between the stream and `at` (out: from the stream into at).
    void move(char *at, size_t n, bool out) {
        while (n > 0 && index < pieces.size()) {
            const Piece &p = pieces[index];
            const size_t m = std::min(n, p.bytes - offset);
            char *here = static_cast<char *>(p.data) + offset;
            if (m > 0) std::memcpy(out ? at : here, out ? here : at, m);
            at += m, n -= m, offset += m;
            if (offset == p.bytes) ++index, offset = 0;
        }
    }
};

size_t total_bytes(const std::vector<Piece> &pieces) {
    size_t n = 0;
    for (const Piece &p : pieces) n += p.bytes;
    return n;
}

class ShmCommunicator final : public Communicator {
  public:
    ShmCommunicator(std::unique_ptr<SharedSegment> segment, int rank, int world_size, Millis timeout,
                    size_t slot_bytes)
        : segment_(std::move(segment)), rank_(rank), world_size_(world_size), timeout_(timeout),
          slot_bytes_(slot_bytes) {
        line(rank_).pid.store(static_cast<int32_t>(::getpid()));
        watch_peers();
    }

    // Peers waiting on this rank learn that it has gone.
    ~ShmCommunicator() override {
        leave(SX_ERR_COMM);
        for (int fd : exits_)
            if (fd >= 0) ::close(fd);
    }

    int rank() const override { return rank_; }
    int world_size() const override { return world_size_; }

    std::vector<int> exited_peers() const override {
        std::vector<int> out;
        for (int q = 0; q < world_size_; ++q) {
            const int32_t pid = segment_->peer(q).pid;
            if (q != rank_ && pid > 0 && pid != ::getpid() && exited(q, pid)) out.push_back(q);
        }
        return out;
    }

    // Collective, once, before any call: every rank's pid is in its line, and whether it
    // mapped every other rank's arena (in `bytes`, before any call uses it).
    Status start() {
        line(rank_).bytes.store(segment_->arenas_mapped() ? 1 : 0, std::memory_order_relaxed);
        SX_TRY(barrier());
        one_process_ = true;
        in_place_ = true;
        for (int q = 0; q < world_size_; ++q) {
            one_process_ = one_process_ && line(q).pid.load(std::memory_order_relaxed) == ::getpid();
            in_place_ = in_place_ && line(q).bytes.load(std::memory_order_relaxed) == 1;
        }
        in_place_ = in_place_ && !one_process_;
        // Where this process's arena lies, once: publish() then takes no lock.
        int fd = -1;
        if (in_place_ && !arena::describe(&fd, &arena_bytes_, &arena_base_)) arena_base_ = nullptr;
        // Nobody may reuse `bytes` (a gather's) before every rank has read the flags.
        return barrier();
    }

    bool reads_in_place() const override { return in_place_; }

    Status reduce_scatter_sum(float *buf, size_t shard_elems, float *out, bool accumulate) override {
        if (shard_elems == 0) return empty_call("reduce_scatter_sum");
        SX_TRY(check_reduce_scatter_args(*this, buf, shard_elems, out, accumulate));
        publish(buf, static_cast<size_t>(world_size_) * shard_elems * sizeof(float));
        return run(kReduceScatter, shard_elems, -1, [&](Clock::time_point deadline) -> Status {
            return scatter_chunks(buf, shard_elems, deadline, [&](const float *const *parts, size_t m, size_t out_at) {
                // In rank order: ((p0 + p1) + p2) + ..., the first two in one pass.
                float sum[kBlock];
                const float *a = parts[0], *b = parts[1 % world_size_];
                if (world_size_ == 1)
                    std::memcpy(sum, a, m * sizeof(float));
                else
                    for (size_t k = 0; k < m; ++k) sum[k] = a[k] + b[k];
                for (int p = 2; p < world_size_; ++p)
                    for (size_t k = 0; k < m; ++k) sum[k] += parts[p][k];
                float *o = out + out_at;
                if (accumulate)
                    for (size_t k = 0; k < m; ++k) o[k] += sum[k];
                else
                    std::memcpy(o, sum, m * sizeof(float));
            });
        });
    }

    Status reduce_scatter_sum_16(uint16_t *buf, int32_t dtype, size_t shard_elems, float *out, float out_scale,
                                 bool accumulate) override {
        if (shard_elems == 0) return empty_call("reduce_scatter_sum_16");
        SX_TRY(check_reduce_scatter_16_args(*this, buf, dtype, shard_elems, out));
        publish(buf, static_cast<size_t>(world_size_) * shard_elems * sizeof(uint16_t));
        return run(kReduceScatter16, shard_elems, dtype, [&](Clock::time_point deadline) -> Status {
            return scatter_chunks(buf, shard_elems, deadline, [&](const uint16_t *const *parts, size_t m, size_t out_at) {
                // Every addition rounds to the dtype, in rank order, as a 16-bit reduction.
                uint16_t sum[kBlock];
                float wide[kBlock];
                std::memcpy(sum, parts[0], m * sizeof(uint16_t));
                for (int p = 1; p < world_size_; ++p) half::add_into(dtype, sum, parts[p], m);
                half::to_f32(dtype, sum, wide, m);
                float *o = out + out_at;
                for (size_t k = 0; k < m; ++k) o[k] = (accumulate ? o[k] : 0.0f) + wide[k] * out_scale;
            });
        });
    }

    Status all_gather(void *buf, size_t shard_bytes) override {
        if (shard_bytes == 0) return empty_call("all_gather");
        SX_CHECK_ARG(buf != nullptr, "all_gather: buf must not be NULL");
        char *b = static_cast<char *>(buf);
        const size_t extent = static_cast<size_t>(world_size_) * shard_bytes;
        publish(buf, extent);
        return run(kAllGather, shard_bytes, -1, [&](Clock::time_point deadline) -> Status {
            const bool mine = readable(rank_, extent);
            char *own = b + static_cast<size_t>(rank_) * shard_bytes;
            for (size_t off = 0; off < shard_bytes; off += slot_bytes_) {
                const size_t n = std::min(slot_bytes_, shard_bytes - off);
                if (off > 0 || !mine) std::memcpy(slot(rank_), own + off, n);
                SX_TRY(meet(deadline));
                if (off == 0) {
                    Path path;
                    SX_TRY(after_first_meeting(extent, mine, [&] { std::memcpy(slot(rank_), own, n); }, deadline,
                                               &path));
                    if (path == Path::kInPlace) {
                        for (int q = 0; q < world_size_; ++q)
                            if (q != rank_) {
                                const size_t at = static_cast<size_t>(q) * shard_bytes;
                                std::memcpy(b + at, peer_buffer<char>(q) + at, shard_bytes);
                            }
                        return meet(deadline, kConsumed);
                    }
                }
                for (int q = 0; q < world_size_; ++q)
                    if (q != rank_) std::memcpy(b + static_cast<size_t>(q) * shard_bytes + off, slot(q), n);
                SX_TRY(meet(deadline, kConsumed));
            }
            return Status::Ok();
        });
    }

    // Every element of an all-reduce is combined in rank order (all_reduce, below).
    bool sums_in_rank_order() const override { return true; }

    Status all_reduce_sum(double *data, size_t n) override {
        return all_reduce(kAllReduceSum, data, n, [](double a, double b) { return a + b; });
    }
    Status all_reduce_sum_f32(float *data, size_t n) override {
        return all_reduce(kAllReduceSumF32, data, n, [](float a, float b) { return a + b; });
    }
    Status all_reduce_max(uint64_t *data, size_t n) override {
        return all_reduce(kAllReduceMax, data, n, [](uint64_t a, uint64_t b) { return std::max(a, b); });
    }

    Status broadcast(void *data, size_t bytes, int root) override {
        SX_CHECK_ARG(root >= 0 && root < world_size(), "broadcast: root %d is not in [0, %d)", root, world_size());
        if (bytes == 0) return empty_call("broadcast");
        SX_CHECK_ARG(data != nullptr, "broadcast: data must not be NULL");
        char *d = static_cast<char *>(data);
        publish(data, bytes);
        return run(kBroadcast, bytes, root, [&](Clock::time_point deadline) -> Status {
            // Only root's buffer is read: in place for every rank or for none (root knows
            // which before the first barrier, the others after it).
            const bool root_in_place = rank_ == root && readable(root, bytes);
            for (size_t off = 0; off < bytes; off += slot_bytes_) {
                const size_t n = std::min(slot_bytes_, bytes - off);
                if (rank_ == root && !(off == 0 && root_in_place)) std::memcpy(slot(root), d + off, n);
                SX_TRY(meet(deadline));
                if (off == 0 && choose_path(bytes, root) == Path::kInPlace) {
                    if (rank_ != root) std::memcpy(d, peer_buffer<char>(root), bytes);
                    return meet(deadline, kConsumed);
                }
                if (rank_ != root) std::memcpy(d + off, slot(root), n);
                SX_TRY(meet(deadline, kConsumed));
            }
            return Status::Ok();
        });
    }

    // Rank q's stream goes through slot q: each sender fills its own (gather), or root
    // fills the receivers' (scatter); rounds enough for the longest stream, which every
    // rank learns from the lines at the first barrier.
    Status gather_pieces(const std::vector<Piece> &mine, const std::vector<std::vector<Piece>> &theirs,
                         int root) override {
        SX_TRY(check_pieces_args(*this, "gather_pieces", theirs, root));
        return pieces(kGatherPieces, mine, theirs, root);
    }
    Status scatter_pieces(const std::vector<std::vector<Piece>> &theirs, const std::vector<Piece> &mine,
                          int root) override {
        SX_TRY(check_pieces_args(*this, "scatter_pieces", theirs, root));
        return pieces(kScatterPieces, mine, theirs, root);
    }

    Status barrier() override {
        return run(kBarrier, 0, -1, [&](Clock::time_point deadline) -> Status {
            SX_TRY(meet(deadline));
            return meet(deadline, kConsumed);
        });
    }

    bool carries_riders() const override { return true; }

    Status attach_rider(const Rider &mine, std::vector<Rider> *all) override {
        SX_CHECK_ARG(mine.tag != 0 && all != nullptr, "attach_rider: the tag must be nonzero and all not NULL");
        SX_TRY(usable("attach_rider"));
        rider_ = mine;
        rider_all_ = all;
        rider_pending_ = true;
        return Status::Ok();
    }

    // A context's channel: failures are told to every rank (the notice), as `label`'s.
    void tell_peers(const std::string &label) {
        tells_ = true;
        label_ = label;
    }

    void abort() override { abort_because(Status::Ok()); }
    void fail_channel(const Status &why) override {
        if (!tells_ || why.ok()) return abort();
        post_notice(why);
        abort_because(why);
    }
    void abort_because(const Status &why) override {
        if (aborted_.exchange(true)) return;
        leave(why.ok() ? SX_ERR_ABORTED : why.code(), why.ok() ? "" : why.message());
        log(SX_LOG_INFO, "sx: rank %d: communicator aborted", rank_);
    }

  private:
    Line &line(int r) const { return reinterpret_cast<Line *>(segment_->data())[r]; }

    // Says where this rank's buffer of the call lies (`extent` bytes), so that the peers
    // read it in place where they can: its address where every rank is a thread of this
    // process, else 1 + its offset in this process's arena where it lies in it.
    void publish(const void *p, size_t extent) {
        uint64_t where = 0, offset = 0;
        if (one_process_)
            where = reinterpret_cast<uintptr_t>(p);
        else if (in_place_ && in_arena(p, extent, &offset))
            where = offset + 1;
        line(rank_).buffer.store(where, std::memory_order_relaxed);
    }
    // Whether [p, p + extent) lies wholly in this process's arena, and at which offset.
    bool in_arena(const void *p, size_t extent, uint64_t *offset) const {
        const uintptr_t b = reinterpret_cast<uintptr_t>(arena_base_), q = reinterpret_cast<uintptr_t>(p);
        if (arena_base_ == nullptr || q < b || q - b > arena_bytes_ || extent > arena_bytes_ - (q - b)) return false;
        *offset = q - b;
        return true;
    }
    // Whether rank q's buffer of the call (`extent` bytes) can be read in place: for this
    // rank, at once; for the others, once the call's first barrier has passed. Every rank
    // gives the same answer for q.
    bool readable(int q, size_t extent) const {
        if (one_process_) return true;
        const uint64_t where = line(q).buffer.load(std::memory_order_relaxed);
        const SharedSegment::Peer &p = segment_->peer(q);
        return where != 0 && p.arena != nullptr && where - 1 <= p.arena_bytes && extent <= p.arena_bytes - (where - 1);
    }
    // How a call's data moves, decided by every rank alike after the call's first barrier
    // from the buffers it reads (every rank's, or root's alone where root >= 0):
    //   kInPlace   read where they lie;
    //   kSlots     every rank brought its first chunk to its slot before the barrier;
    //   kSlotsLate some did not (their buffers were in place): they bring it now, and the
    //              ranks meet once more before reading the slots.
    enum class Path { kInPlace, kSlots, kSlotsLate };
    Path choose_path(size_t extent, int root) const {
        bool all = true, none = true;
        for (int q = 0; q < world_size_; ++q) {
            if (root >= 0 && q != root) continue;
            const bool r = readable(q, extent);
            all = all && r;
            none = none && !r;
        }
        if (all && !one_process_) count_in_place();
        return all ? Path::kInPlace : none ? Path::kSlots : Path::kSlotsLate;
    }
    // After the first barrier of a call that reads every rank's buffer (extent bytes each):
    // *path, and on the late path this rank's first chunk brought (`bring_first`) where it
    // was not, and the ranks met once more.
    template <class Bring>
    Status after_first_meeting(size_t extent, bool mine, Bring bring_first, Clock::time_point deadline, Path *path) {
        *path = choose_path(extent, -1);
        if (*path != Path::kSlotsLate) return Status::Ok();
        if (mine) bring_first();
        return meet(deadline);
    }
    // Rank q's buffer in this call, where readable(q).
    template <class T>
    T *peer_buffer(int q) const {
        const uint64_t where = line(q).buffer.load(std::memory_order_relaxed);
        if (one_process_) return reinterpret_cast<T *>(static_cast<uintptr_t>(where));
        return reinterpret_cast<T *>(const_cast<char *>(segment_->peer(q).arena) + (where - 1));
    }
    Notice &notice() const { return *reinterpret_cast<Notice *>(segment_->data() + header_bytes(world_size_)); }
    char *notice_reason() const { return segment_->data() + header_bytes(world_size_) + sizeof(Notice); }
    char *reason(int r) const { return body() + static_cast<size_t>(r) * kReasonBytes; }
    char *body() const { return segment_->data() + header_bytes(world_size_) + kNoticeBytes; }
    // Rank r's line of the current call (its parity's), and the small values after it.
    char *call_area(int r) const {
        return body() + static_cast<size_t>(world_size_) * kReasonBytes +
               (parity_ * static_cast<size_t>(world_size_) + static_cast<size_t>(r)) * kCallBytes;
    }
    CallLine &call_line(int r) const { return *reinterpret_cast<CallLine *>(call_area(r)); }
    template <class T>
    T *small_as(int r) const {
        return reinterpret_cast<T *>(call_area(r) + sizeof(CallLine));
    }
    char *slot(int r) const {
        return body() + static_cast<size_t>(world_size_) * (kReasonBytes + 2 * kCallBytes) +
               static_cast<size_t>(r) * slot_bytes_;
    }
    template <class T>
    T *slot_as(int r) const {
        return reinterpret_cast<T *>(slot(r));
    }

    // A reduce-scatter's chunks: each rank copies its parts for the other ranks into its
    // slot (rank q's at q * n; its own part stays where it is, read by itself alone),
    // meets, and combine(parts, m, out_at) reduces m elements of each rank's part
    // (parts[p], in rank order) into the output at out_at, block by block. Where every
    // buffer can be read in place, there are no chunks: every rank's slice where it lies.
    template <class T, class Combine>
    Status scatter_chunks(const T *buf, size_t shard, Clock::time_point deadline, Combine combine) {
        std::vector<const T *> parts(static_cast<size_t>(world_size_));
        const size_t extent = static_cast<size_t>(world_size_) * shard * sizeof(T);
        const bool mine = readable(rank_, extent);
        const size_t part = std::max<size_t>(1, slot_bytes_ / (sizeof(T) * world_size_));
        auto bring = [&](size_t off, size_t n) {
            T *slot_part = slot_as<T>(rank_);
            for (int q = 0; q < world_size_; ++q)
                if (q != rank_)
                    std::memcpy(slot_part + static_cast<size_t>(q) * n, buf + static_cast<size_t>(q) * shard + off,
                                n * sizeof(T));
        };
        for (size_t off = 0; off < shard; off += part) {
            const size_t n = std::min(part, shard - off);
            if (off > 0 || !mine) bring(off, n);
            SX_TRY(meet(deadline));
            if (off == 0) {
                Path path;
                SX_TRY(after_first_meeting(extent, mine, [&] { bring(0, n); }, deadline, &path));
                if (path == Path::kInPlace) {
                    const size_t at = static_cast<size_t>(rank_) * shard;
                    for (size_t i = 0; i < shard; i += kBlock) {
                        for (int p = 0; p < world_size_; ++p)
                            parts[static_cast<size_t>(p)] = peer_buffer<T>(p) + at + i;
                        combine(parts.data(), std::min(kBlock, shard - i), i);
                    }
                    return meet(deadline, kConsumed);
                }
            }
            for (size_t i = 0; i < n; i += kBlock) {
                for (int p = 0; p < world_size_; ++p)
                    parts[static_cast<size_t>(p)] = p == rank_ ? buf + static_cast<size_t>(rank_) * shard + off + i
                                                               : slot_as<T>(p) + static_cast<size_t>(rank_) * n + i;
                combine(parts.data(), std::min(kBlock, n - i), off + i);
            }
            SX_TRY(meet(deadline, kConsumed));
        }
        return Status::Ok();
    }

    template <class T, class Op>
    Status all_reduce(uint32_t op, T *data, size_t n, Op combine) {
        const char *what = op_name(op);
        if (n == 0) return empty_call(what);
        SX_CHECK_ARG(data != nullptr, "%s: data must not be NULL", what);
        return run(op, n, -1, [&](Clock::time_point deadline) -> Status {
            if (n * sizeof(T) <= kSmallBytes) {
                // Through the call's line: every rank combines all the values in rank
                // order (the same bits everywhere) after the one barrier; nobody writes
                // them again before every rank has reached the next call.
                std::memcpy(small_as<T>(rank_), data, n * sizeof(T));
                SX_TRY(meet(deadline));
                for (size_t i = 0; i < n; ++i) {
                    T v = small_as<T>(0)[i];
                    for (int p = 1; p < world_size_; ++p) v = combine(v, small_as<T>(p)[i]);
                    data[i] = v;
                }
                return Status::Ok();
            }
            const size_t chunk = std::max<size_t>(1, slot_bytes_ / sizeof(T));
            for (size_t off = 0; off < n; off += chunk) {
                const size_t m = std::min(chunk, n - off);
                std::memcpy(slot(rank_), data + off, m * sizeof(T));
                SX_TRY(meet(deadline));
                if (m <= kSmall) {
                    // Few values: every rank combines them all, in rank order (the same
                    // bits everywhere), and one barrier frees the slots.
                    for (size_t i = 0; i < m; ++i) {
                        T v = slot_as<T>(0)[i];
                        for (int p = 1; p < world_size_; ++p) v = combine(v, slot_as<T>(p)[i]);
                        data[off + i] = v;
                    }
                    SX_TRY(meet(deadline, kConsumed));
                    continue;
                }
                // Rank q combines part q of the chunk, in rank order, into its own slot
                // (nobody else reads that part of it); then every rank copies every part.
                // Every rank ends with the same bits.
                const size_t per = (m + world_size_ - 1) / world_size_;
                const size_t lo = std::min(m, per * static_cast<size_t>(rank_)), hi = std::min(m, lo + per);
                for (size_t i = lo; i < hi; ++i) {
                    T v = slot_as<T>(0)[i];
                    for (int p = 1; p < world_size_; ++p) v = combine(v, slot_as<T>(p)[i]);
                    slot_as<T>(rank_)[i] = v;
                }
                SX_TRY(meet(deadline));
                for (int q = 0; q < world_size_; ++q) {
                    const size_t a = std::min(m, per * static_cast<size_t>(q)), b = std::min(m, a + per);
                    if (b > a) std::memcpy(data + off + a, slot_as<T>(q) + a, (b - a) * sizeof(T));
                }
                SX_TRY(meet(deadline, kConsumed));
            }
            return Status::Ok();
        });
    }

    Status pieces(uint32_t op, const std::vector<Piece> &mine, const std::vector<std::vector<Piece>> &theirs,
                  int root) {
        const bool gather = op == kGatherPieces;
        // What this rank moves: its own stream, or (root) the longest of the others'.
        size_t bytes = rank_ == root ? 0 : total_bytes(mine);
        if (rank_ == root)
            for (int q = 0; q < world_size_; ++q)
                if (q != root) bytes = std::max(bytes, total_bytes(theirs[static_cast<size_t>(q)]));
        line(rank_).bytes.store(bytes, std::memory_order_relaxed);
        return run(op, 0, root, [&](Clock::time_point deadline) -> Status {
            std::vector<Stream> streams;
            if (rank_ == root)
                for (int q = 0; q < world_size_; ++q) streams.emplace_back(theirs[static_cast<size_t>(q)]);
            Stream own(mine);
            // Each stream moves min(slot, what it has left) bytes a round (both its ends know
            // its length); the rounds go on until the longest is done, which every rank
            // reads from the lines once the first barrier has passed.
            size_t longest = 0;
            for (size_t off = 0, round = 0; round == 0 || off < longest; off += slot_bytes_, ++round) {
                if (gather && rank_ != root) own.move(slot(rank_), slot_bytes_, true);
                if (!gather && rank_ == root)
                    for (int q = 0; q < world_size_; ++q)
                        if (q != root) streams[static_cast<size_t>(q)].move(slot(q), slot_bytes_, true);
                SX_TRY(meet(deadline));
                if (round == 0)
                    for (int q = 0; q < world_size_; ++q) longest = std::max<size_t>(longest, line(q).bytes.load());
                if (gather && rank_ == root)
                    for (int q = 0; q < world_size_; ++q)
                        if (q != root) streams[static_cast<size_t>(q)].move(slot(q), slot_bytes_, false);
                if (!gather && rank_ != root) own.move(slot(rank_), slot_bytes_, false);
                SX_TRY(meet(deadline, kConsumed));
            }
            return Status::Ok();
        });
    }

    // The frame of every call: fail fast if unusable, say what the call is (op, size,
    // root: the ranks compare them at its first barrier), run the body. Every body brings
    // its first chunk into its slot, meets, and ends with a kConsumed barrier, after which
    // nobody reads the lines' calls or the slots: the next call may change them.
    // A pending rider goes with this call. Ranks found in different calls at the first
    // barrier meet once more (nobody may change its line before every rank has compared)
    // and return SX_ERR_MISMATCH, the communicator still usable.
    template <class Body>
    Status run(uint32_t op, uint64_t size, int32_t root, Body body) {
        const char *what = op_name(op);
        const bool ride = rider_pending_;
        rider_pending_ = false;
        SX_TRY(usable(what));
        count_collective();
        const Clock::time_point deadline = Clock::now() + timeout_;
        parity_ = calls_++ & 1u;
        CallLine &me = call_line(rank_);
        me.op.store(op, std::memory_order_relaxed);
        me.size.store(size, std::memory_order_relaxed);
        me.root.store(root, std::memory_order_relaxed);
        uint64_t value_bits = 0;
        std::memcpy(&value_bits, &rider_.value, sizeof(value_bits));
        me.rider_tag.store(ride ? rider_.tag : 0, std::memory_order_relaxed);
        me.rider_value.store(ride ? value_bits : 0, std::memory_order_relaxed);
        riders_out_ = ride ? rider_all_ : nullptr;
        compare_call_ = true;
        different_calls_ = false;
        Status s = body(deadline);
        if (!s.ok() && different_calls_) {
            Status parted = meet(deadline, kConsumed);
            if (parted.ok()) {
                s.prefix(format("%s on rank %d of %d: ", what, rank_, world_size_));
                return s;
            }
            s = parted;
        }
        if (!s.ok()) {
            s.prefix(format("%s on rank %d of %d: ", what, rank_, world_size_));
            record_failure(s);
        }
        return s;
    }

    // A call without data meets nobody: fine, unless a rider waited for it.
    Status empty_call(const char *what) {
        if (rider_pending_) {
            rider_pending_ = false;
            return SX_ERROR(SX_ERR_INVALID_ARGUMENT, "%s: a call without data carries no rider", what);
        }
        return usable(what);
    }

    // The barriers of a call are of two kinds. At one the ranks need each other's data
    // (their parts are in their slots: the call cannot go on without every rank). At a
    // kConsumed one they only make sure that nobody still reads a slot before its rank
    // writes it again: a peer that has left (its group failed or was destroyed, maybe
    // from another thread while this call ran) will not, and counts as arrived; should the
    // call need its data again, the next barrier fails.
    static constexpr bool kConsumed = true;

    // The next barrier: this rank arrives, and waits for every other.
    Status meet(Clock::time_point deadline, bool consumed = false) {
        const uint32_t k = ++barriers_;
        Line &me = line(rank_);
        barrier_released();
        me.arrived.store(k, std::memory_order_release);
        if (me.waiters.load(std::memory_order_seq_cst) != 0) futex(&me.arrived, FUTEX_WAKE, INT_MAX, nullptr);
        for (int q = 0; q < world_size_; ++q)
            if (q != rank_) SX_TRY(wait_for(q, k, deadline, consumed));
        return compare_call_ ? compare_call() : Status::Ok();
    }

    // At a call's first barrier: whether every rank is in the same call with the same
    // rider's tag (every rank finds a difference if any rank does); then the riders.
    Status compare_call() {
        compare_call_ = false;
        const CallLine &me = call_line(rank_);
        const uint32_t op = me.op.load(std::memory_order_relaxed);
        const uint64_t size = me.size.load(std::memory_order_relaxed);
        const int32_t root = me.root.load(std::memory_order_relaxed);
        const uint64_t tag = me.rider_tag.load(std::memory_order_relaxed);
        for (int q = 0; q < world_size_; ++q) {
            const CallLine &l = call_line(q);
            const uint32_t their = l.op.load(std::memory_order_relaxed);
            const uint64_t their_size = l.size.load(std::memory_order_relaxed);
            const int32_t their_root = l.root.load(std::memory_order_relaxed);
            const uint64_t their_tag = l.rider_tag.load(std::memory_order_relaxed);
            if (their != op || their_size != size || their_root != root) {
                different_calls_ = true;
                return SX_ERROR(SX_ERR_MISMATCH,
                                "ranks called different collectives: rank %d %s (size %llu, root %d), rank %d %s (size "
                                "%llu, root %d)",
                                rank_, op_name(op), static_cast<unsigned long long>(size), root, q, op_name(their),
                                static_cast<unsigned long long>(their_size), their_root);
            }
            if (their_tag != tag) {
                different_calls_ = true;
                return SX_ERROR(SX_ERR_MISMATCH, "ranks carry different riders: rank %d %016llx, rank %d %016llx",
                                rank_, static_cast<unsigned long long>(tag), q,
                                static_cast<unsigned long long>(their_tag));
            }
        }
        if (riders_out_) {
            riders_out_->resize(static_cast<size_t>(world_size_));
            for (int q = 0; q < world_size_; ++q) {
                const uint64_t bits = call_line(q).rider_value.load(std::memory_order_relaxed);
                Rider &r = (*riders_out_)[static_cast<size_t>(q)];
                r.tag = tag;
                std::memcpy(&r.value, &bits, sizeof(bits));
            }
        }
        return Status::Ok();
    }

    Status wait_for(int q, uint32_t k, Clock::time_point deadline, bool consumed) {
        Line &peer = line(q);
        Clock::time_point spin_until{}, checked{};
        for (unsigned spins = 0;; ++spins) {
            const uint32_t have = peer.arrived.load(std::memory_order_acquire);
            if (reached(have, k)) {
                barrier_acquired();
                return Status::Ok();
            }
            if (spins < 64) {
                cpu_relax();
                continue;
            }
            // Then spin for kSpin (a peer a few microseconds behind is met without a
            // sleep and a wake-up, which cost tens of microseconds), yielding the
            // processor each time (the peer may be waiting for it), looking at the
            // peer's state and the deadline every kCheck.
            const Clock::time_point now = Clock::now();
            if (spins == 64) spin_until = now + kSpin;
            if (now >= checked) {
                if (consumed && peer.left.load(std::memory_order_acquire) != 0) return Status::Ok();
                if (Status why = check_waiting(q, deadline); !why.ok()) {
                    // The peer may have arrived, finished the call and left (destroyed its
                    // group) since `have` was read: it arrived before it left, so a look
                    // now sees its arrival, and the barrier was met.
                    if (!reached(peer.arrived.load(std::memory_order_acquire), k)) return why;
                    barrier_acquired();
                    return Status::Ok();
                }
                checked = now + kCheck;
            }
            if (now < spin_until) {
                ::sched_yield();
                continue;
            }
            // Asleep on the peer's word until it arrives, or for a millisecond.
            peer.waiters.fetch_add(1, std::memory_order_seq_cst);
            if (!reached(peer.arrived.load(std::memory_order_seq_cst), k)) {
                const struct timespec ms = {0, 1000000};
                futex(&peer.arrived, FUTEX_WAIT, have, &ms);
            }
            peer.waiters.fetch_sub(1, std::memory_order_seq_cst);
        }
    }

    // A pidfd per peer of another process (-1: none), readable once it has exited, even
    // while its parent has not reaped it: kill(pid, 0) still finds a zombie, so a peer
    // killed under a launcher that waits for another child first would only be noticed
    // at the timeout. Kernels before 5.3 have no pidfd: kill(pid, 0) alone then.
    void watch_peers() {
        exits_.assign(static_cast<size_t>(world_size_), -1);
#ifdef SYS_pidfd_open
        for (int q = 0; q < world_size_; ++q) {
            const int32_t pid = segment_->peer(q).pid;
            if (pid > 0 && pid != ::getpid()) exits_[q] = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
        }
#endif
    }

    // Whether peer q's process (`pid`, another than this one) has exited: its pidfd,
    // or else kill(pid, 0).
    bool exited(int q, int32_t pid) const {
        const int fd = q < static_cast<int>(exits_.size()) ? exits_[q] : -1;
        if (fd < 0) return ::kill(pid, 0) != 0 && errno == ESRCH;
        struct pollfd p = {fd, POLLIN, 0};
        return ::poll(&p, 1, 0) == 1 && (p.revents & POLLIN) != 0;
    }

    // Why a wait for peer q cannot go on, if it cannot.
    Status check_waiting(int q, Clock::time_point deadline) {
        if (aborted_.load()) return SX_ERROR(SX_ERR_ABORTED, "the communicator was aborted");
        SX_TRY(noticed());
        if (const uint32_t code = line(q).left.load(std::memory_order_acquire)) {
            const char *why = reason(q);
            return SX_ERROR(code == SX_ERR_TIMEOUT ? SX_ERR_TIMEOUT : SX_ERR_COMM,
                            "rank %d left the communicator (%s%s%.*s)", q,
                            sx_status_string(static_cast<sx_status_t>(code)), why[0] ? ": " : "",
                            static_cast<int>(strnlen(why, kReasonBytes)), why);
        }
        const int32_t pid = segment_->peer(q).pid;
        if (pid > 0 && pid != ::getpid() && exited(q, pid))
            return SX_ERROR(SX_ERR_COMM, "rank %d (process %d) has exited", q, pid);
        if (Clock::now() >= deadline)
            return SX_ERROR(SX_ERR_TIMEOUT, "rank %d did not come within the timeout (%lld ms)", q,
                            static_cast<long long>(timeout_.count()));
        return Status::Ok();
    }

    // This rank leaves with `code` (and `why`, in words): peers waiting on it fail at once.
    void leave(sx_status_t code, const std::string &why = "") {
        Line &me = line(rank_);
        if (me.left.load(std::memory_order_relaxed) == 0 && !why.empty()) {
            // Before `left`, which publishes it (release); cut to fit, NUL-terminated.
            const size_t n = std::min(why.size(), kReasonBytes - 1);
            std::memcpy(reason(rank_), why.data(), n);
            reason(rank_)[n] = '\0';
        }
        uint32_t none = 0;
        me.left.compare_exchange_strong(none, static_cast<uint32_t>(code), std::memory_order_release);
        for (int q = 0; q < world_size_; ++q) futex(&line(q).arrived, FUTEX_WAKE, INT_MAX, nullptr);
    }

    Status usable(const char *what) {
        if (aborted_.load()) return SX_ERROR(SX_ERR_ABORTED, "%s: the communicator was aborted", what);
        SX_TRY(failure_.check(what));
        Status told = noticed();
        return told.ok() ? told : told.prefix(format("%s on rank %d of %d: ", what, rank_, world_size_));
    }

    void record_failure(const Status &s) {
        failure_.record(s);
        if (tells_) post_notice(s);
        leave(s.code(), s.message());
    }

    // The first failure of the channel, told to every rank: this rank's, unless another
    // rank's came first.
    void post_notice(const Status &why) {
        Notice &n = notice();
        uint32_t none = 0;
        if (!n.state.compare_exchange_strong(none, 1, std::memory_order_acq_rel)) return;
        n.rank.store(rank_, std::memory_order_relaxed);
        n.code.store(static_cast<uint32_t>(why.code()), std::memory_order_relaxed);
        const size_t len = std::min(why.message().size(), kReasonBytes - 1);
        std::memcpy(notice_reason(), why.message().data(), len);
        notice_reason()[len] = '\0';
        n.state.store(2, std::memory_order_release);
        for (int q = 0; q < world_size_; ++q) futex(&line(q).arrived, FUTEX_WAKE, INT_MAX, nullptr);
    }

    // Another rank's notice, as this rank's failure: SX_ERR_TIMEOUT where that rank timed
    // out, else SX_ERR_COMM.
    Status noticed() const {
        if (!tells_) return Status::Ok();
        const Notice &n = notice();
        if (n.state.load(std::memory_order_acquire) != 2) return Status::Ok();
        const int32_t r = n.rank.load(std::memory_order_relaxed);
        if (r == rank_) return Status::Ok();
        const uint32_t code = n.code.load(std::memory_order_relaxed);
        return SX_ERROR(code == SX_ERR_TIMEOUT ? SX_ERR_TIMEOUT : SX_ERR_COMM,
                        "%s: its rank %d failed first, and every rank's calls on this channel fail with it (%s: %.*s)",
                        label_.c_str(), r, sx_status_string(static_cast<sx_status_t>(code)),
                        static_cast<int>(strnlen(notice_reason(), kReasonBytes)), notice_reason());
    }

    std::unique_ptr<SharedSegment> segment_;
    const int rank_, world_size_;
    const Millis timeout_;
    const size_t slot_bytes_;
    uint32_t barriers_ = 0;
    uint32_t calls_ = 0;   // calls run so far (the same count on every rank)
    size_t parity_ = 0;    // the current call's: which of its two call lines a rank uses
    bool compare_call_ = false;    // the next barrier is a call's first
    bool different_calls_ = false; // this call's first barrier found ranks in other calls
    bool rider_pending_ = false;   // attach_rider: the next call carries rider_
    Rider rider_;
    std::vector<Rider> *rider_all_ = nullptr;   // ... and writes every rank's here
    std::vector<Rider> *riders_out_ = nullptr;  // the current call's

    bool one_process_ = false;  // every rank is a thread of this process (known after start())
    bool in_place_ = false;     // processes that mapped each other's arenas (known after start())
    char *arena_base_ = nullptr;  // where in_place_: this process's arena, and its size
    size_t arena_bytes_ = 0;
    std::atomic<bool> aborted_{false};
    FailureLatch failure_;
    std::vector<int> exits_;  // per peer: its pidfd (watch_peers)
    bool tells_ = false;      // a context's channel: failures go in the notice (tell_peers)
    std::string label_;
};

}  // namespace

Status create_shm_communicator(std::shared_ptr<rdzv::Store> store, int rank, int world_size, const ShmOptions &options,
                               std::unique_ptr<Communicator> *out) {
    SX_CHECK_ARG(store != nullptr && out != nullptr, "create_shm_communicator: store and out must not be NULL");
    SX_CHECK_ARG(world_size >= 1 && world_size <= kMaxRanks && rank >= 0 && rank < world_size,
                 "create_shm_communicator: rank %d of %d (shared memory takes 1 to %d ranks per host)", rank,
                 world_size, kMaxRanks);
    const size_t slot = options.slot_bytes ? (options.slot_bytes + 63) / 64 * 64 : kDefaultSlotBytes;
    const Clock::time_point deadline =
        options.deadline == Clock::time_point() ? Clock::now() + options.timeout : options.deadline;
    std::unique_ptr<SharedSegment> segment;
    const size_t bytes =
        header_bytes(world_size) + kNoticeBytes + (kReasonBytes + 2 * kCallBytes + slot) * static_cast<size_t>(world_size);
    if (options.channels)
        SX_TRY(options.channels->open_channel(*store, rank, world_size, bytes, deadline, &segment));
    else
        SX_TRY(SharedSegment::open(*store, rank, world_size, bytes, deadline, &segment, options.in_place));
    std::unique_ptr<ShmCommunicator> c(new ShmCommunicator(std::move(segment), rank, world_size, options.timeout, slot));
    if (options.channels) c->tell_peers(options.label.empty() ? "the communicator" : options.label);
    SX_TRY(c->start());
    *out = std::move(c);
    return Status::Ok();
}

}  // namespace comm
}  // namespace sx
