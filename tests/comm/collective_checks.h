// Every collective of a Communicator against a locally computed expectation, for the
// Gloo tests with ranks as threads and as processes. Values are small integers so that
// float sums are exact whatever the order of summation.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "base/half.h"
#include "base/memory.h"
#include "base/status.h"
#include "comm/communicator.h"

namespace sxtest {

// Where the checks' buffers of the large collectives come from in this process: private
// memory (the default), or the process's shared arena, as a group's flat buffers do.
inline sx::HostBuffer::Placement &check_placement() {
    static sx::HostBuffer::Placement p = sx::HostBuffer::kPrivate;
    return p;
}

// count values of T, each `fill`, placed as check_placement() says.
template <class T>
class Placed {
  public:
    explicit Placed(size_t count, T fill = T()) : n_(count) {
        if (!mem_.allocate(std::max<size_t>(1, count) * sizeof(T), "a test buffer", sx::HostBuffer::kPopulate,
                           check_placement())
                 .ok())
            std::abort();
        std::fill(data(), data() + n_, fill);
    }
    T *data() const { return mem_.as<T>(); }
    size_t size() const { return n_; }
    T &operator[](size_t i) const { return data()[i]; }

  private:
    sx::HostBuffer mem_;
    size_t n_;
};

// This rank's input element i of a reduce-scatter.
inline float rs_input(int rank, size_t i) { return static_cast<float>((rank + 1) * static_cast<int>(i % 7 + 1)); }
// The 16-bit reduce-scatter's: 1 or 2, so that every partial sum over up to 128 ranks is an
// integer of at most 256, exact in bf16's 8 bits (and fp16's 11), whatever the order.
inline float rs_input_16(int rank, size_t i) { return (static_cast<size_t>(rank) + i) % 3 == 0 ? 2.0f : 1.0f; }

// Byte i of rank r's part in an all-gather or of a broadcast from r.
inline uint8_t pattern_byte(int r, size_t i, int salt) {
    return static_cast<uint8_t>((static_cast<size_t>(r) * 31 + i * 7 + static_cast<size_t>(salt)) & 0xff);
}

inline std::string check_reduce_scatter(sx::comm::Communicator &c, size_t shard, bool accumulate) {
    const int p = c.world_size(), r = c.rank();
    Placed<float> buf(shard * static_cast<size_t>(p));
    for (size_t i = 0; i < buf.size(); ++i) buf[i] = rs_input(r, i);
    std::vector<float> out(shard, accumulate ? 5.0f : -1.0f);
    sx::Status s = c.reduce_scatter_sum(buf.data(), shard, out.data(), accumulate);
    if (!s.ok()) return "reduce_scatter_sum: " + s.message();
    for (size_t i = 0; i < shard; ++i) {
        float want = accumulate ? 5.0f : 0.0f;
        for (int q = 0; q < p; ++q) want += rs_input(q, static_cast<size_t>(r) * shard + i);
        if (out[i] != want) {
            return "reduce_scatter_sum(shard " + std::to_string(shard) + ", accumulate " +
                   std::to_string(accumulate) + "): out[" + std::to_string(i) + "] = " + std::to_string(out[i]) +
                   ", expected " + std::to_string(want);
        }
    }
    if (accumulate) return "";
    // In place: out is this rank's own chunk of buf.
    for (size_t i = 0; i < buf.size(); ++i) buf[i] = rs_input(r, i);
    float *own = buf.data() + static_cast<size_t>(r) * shard;
    s = c.reduce_scatter_sum(buf.data(), shard, own, false);
    if (!s.ok()) return "reduce_scatter_sum in place: " + s.message();
    for (size_t i = 0; i < shard; ++i)
        if (own[i] != out[i])
            return "reduce_scatter_sum in place (shard " + std::to_string(shard) + "): element " + std::to_string(i) +
                   " = " + std::to_string(own[i]) + ", expected " + std::to_string(out[i]);
    return "";
}

// The 16-bit reduce-scatter: inputs are 1 or 2 (rs_input_16: exact in fp16 and bf16, and
// so are their sums over up to 128 ranks), the result widened and times 2.
inline std::string check_reduce_scatter_16(sx::comm::Communicator &c, int32_t dtype, size_t shard, bool accumulate) {
    const int p = c.world_size(), r = c.rank();
    Placed<uint16_t> buf(shard * static_cast<size_t>(p));
    for (size_t i = 0; i < buf.size(); ++i) {
        const float x = rs_input_16(r, i);
        buf[i] = dtype == SX_DTYPE_F16 ? sx::half::f32_to_f16(x) : sx::half::f32_to_bf16(x);
    }
    std::vector<float> out(shard, accumulate ? 5.0f : -1.0f);
    sx::Status s = c.reduce_scatter_sum_16(buf.data(), dtype, shard, out.data(), 2.0f, accumulate);
    if (!s.ok()) return "reduce_scatter_sum_16: " + s.message();
    for (size_t i = 0; i < shard; ++i) {
        float sum = 0.0f;
        for (int q = 0; q < p; ++q) sum += rs_input_16(q, static_cast<size_t>(r) * shard + i);
        const float want = (accumulate ? 5.0f : 0.0f) + 2.0f * sum;
        if (out[i] != want) {
            return "reduce_scatter_sum_16(dtype " + std::to_string(dtype) + ", shard " + std::to_string(shard) +
                   ", accumulate " + std::to_string(accumulate) + "): out[" + std::to_string(i) +
                   "] = " + std::to_string(out[i]) + ", expected " + std::to_string(want);
        }
    }
    return "";
}

inline std::string check_all_gather(sx::comm::Communicator &c, size_t shard_bytes, int salt) {
    const int p = c.world_size(), r = c.rank();
    Placed<uint8_t> buf(shard_bytes * static_cast<size_t>(p), 0xEE);
    for (size_t i = 0; i < shard_bytes; ++i) buf[static_cast<size_t>(r) * shard_bytes + i] = pattern_byte(r, i, salt);
    sx::Status s = c.all_gather(buf.data(), shard_bytes);
    if (!s.ok()) return "all_gather: " + s.message();
    for (int q = 0; q < p; ++q) {
        for (size_t i = 0; i < shard_bytes; ++i) {
            if (buf[static_cast<size_t>(q) * shard_bytes + i] != pattern_byte(q, i, salt)) {
                std::string head;  // the buffer's first bytes, to see which part went where
                for (size_t j = 0; j < buf.size() && j < 16; ++j) head += std::to_string(buf[j]) + " ";
                return "all_gather(shard " + std::to_string(shard_bytes) + "): part " + std::to_string(q) +
                       " byte " + std::to_string(i) + " is wrong; buffer starts " + head;
            }
        }
    }
    return "";
}

inline std::string check_all_reduce(sx::comm::Communicator &c, size_t n) {
    const int p = c.world_size(), r = c.rank();
    std::vector<double> sum(n);
    std::vector<uint64_t> mx(n);
    for (size_t i = 0; i < n; ++i) {
        sum[i] = r + 0.5 * static_cast<double>(i);
        mx[i] = (static_cast<uint64_t>(r) * 1000003u + i * 7u) % 1000u + (uint64_t(1) << 40);
    }
    sx::Status s = c.all_reduce_sum(sum.data(), n);
    if (!s.ok()) return "all_reduce_sum: " + s.message();
    std::vector<float> f(n);
    for (size_t i = 0; i < n; ++i) f[i] = static_cast<float>((r + 1) * static_cast<int>(i % 11));
    s = c.all_reduce_sum_f32(f.data(), n);
    if (!s.ok()) return "all_reduce_sum_f32: " + s.message();
    for (size_t i = 0; i < n; ++i)
        if (f[i] != static_cast<float>(p * (p + 1) / 2 * static_cast<int>(i % 11)))
            return "all_reduce_sum_f32(" + std::to_string(n) + "): element " + std::to_string(i) + " = " +
                   std::to_string(f[i]);
    s = c.all_reduce_max(mx.data(), n);
    if (!s.ok()) return "all_reduce_max: " + s.message();
    for (size_t i = 0; i < n; ++i) {
        double want = p * (p - 1) / 2.0 + p * 0.5 * static_cast<double>(i);
        uint64_t want_max = 0;
        for (int q = 0; q < p; ++q)
            want_max = std::max(want_max, (static_cast<uint64_t>(q) * 1000003u + i * 7u) % 1000u + (uint64_t(1) << 40));
        if (sum[i] != want) return "all_reduce_sum: element " + std::to_string(i) + " wrong";
        if (mx[i] != want_max) return "all_reduce_max: element " + std::to_string(i) + " wrong";
    }
    return "";
}

inline std::string check_broadcast(sx::comm::Communicator &c, size_t bytes, int root) {
    Placed<uint8_t> buf(bytes, 0x11);
    if (c.rank() == root)
        for (size_t i = 0; i < bytes; ++i) buf[i] = pattern_byte(root, i, 3);
    sx::Status s = c.broadcast(buf.data(), bytes, root);
    if (!s.ok()) return "broadcast: " + s.message();
    for (size_t i = 0; i < bytes; ++i)
        if (buf[i] != pattern_byte(root, i, 3))
            return "broadcast(" + std::to_string(bytes) + " bytes from " + std::to_string(root) + "): byte " +
                   std::to_string(i) + " wrong";
    return "";
}

// All collectives at sizes that cover one-element shards, ragged segment tails and
// several pipeline segments (at the default segment sizes, 1 MiB and 4 MiB; more with
// a small GlooOptions::segment_bytes), interleaved so that consecutive calls must
// keep apart.
// gather_pieces to `root`, then scatter_pieces back from it: rank q sends (q + k) % 3
// pieces of q * 100 + k * 7 bytes (some ranks none, some pieces empty, one large), the
// root receives each into place; then the root sends every rank other bytes back.
inline std::string check_pieces(sx::comm::Communicator &c, int root) {
    const int p = c.world_size(), r = c.rank();
    auto count = [](int q) { return static_cast<size_t>(q % 3); };
    auto bytes = [](int q, size_t k) { return k == 1 && q == 1 ? size_t(3u << 20) : static_cast<size_t>(q) * 100 + k * 7; };
    std::vector<std::vector<uint8_t>> store(count(r));
    std::vector<sx::comm::Piece> mine;
    for (size_t k = 0; k < count(r); ++k) {
        store[k].resize(bytes(r, k));
        for (size_t i = 0; i < store[k].size(); ++i) store[k][i] = pattern_byte(r, i + k, 40);
        mine.push_back({store[k].data(), store[k].size()});
    }
    std::vector<std::vector<std::vector<uint8_t>>> got(static_cast<size_t>(p));
    std::vector<std::vector<sx::comm::Piece>> theirs;
    if (r == root) {
        theirs.resize(static_cast<size_t>(p));
        for (int q = 0; q < p; ++q) {
            if (q == root) continue;
            got[q].resize(count(q));
            for (size_t k = 0; k < count(q); ++k) {
                got[q][k].assign(bytes(q, k), 0xEE);
                theirs[q].push_back({got[q][k].data(), got[q][k].size()});
            }
        }
    }
    sx::Status s = c.gather_pieces(mine, theirs, root);
    if (!s.ok()) return "gather_pieces: " + s.message();
    for (int q = 0; q < p && r == root; ++q)
        for (size_t k = 0; k < got[q].size(); ++k)
            for (size_t i = 0; i < got[q][k].size(); ++i)
                if (got[q][k][i] != pattern_byte(q, i + k, 40))
                    return "gather_pieces: rank " + std::to_string(q) + "'s piece " + std::to_string(k) +
                           " differs at byte " + std::to_string(i);
    // Back: the root fills the same pieces with new bytes, each rank receives its own.
    for (int q = 0; q < p && r == root; ++q)
        for (size_t k = 0; k < got[q].size(); ++k)
            for (size_t i = 0; i < got[q][k].size(); ++i) got[q][k][i] = pattern_byte(q, i + k, 41);
    for (auto &piece : store) std::fill(piece.begin(), piece.end(), 0xEE);
    s = c.scatter_pieces(theirs, mine, root);
    if (!s.ok()) return "scatter_pieces: " + s.message();
    for (size_t k = 0; k < store.size() && r != root; ++k)
        for (size_t i = 0; i < store[k].size(); ++i)
            if (store[k][i] != pattern_byte(r, i + k, 41))
                return "scatter_pieces: rank " + std::to_string(r) + "'s piece " + std::to_string(k) +
                       " differs at byte " + std::to_string(i);
    return "";
}

inline std::string check_all_collectives(sx::comm::Communicator &c) {
    std::string e;
    const size_t rs_sizes[] = {1, 3, 1000, 300001};  // 300001 floats: 2 segments of 1 MiB, ragged
    for (size_t shard : rs_sizes) {
        for (bool acc : {false, true}) {
            if (!(e = check_reduce_scatter(c, shard, acc)).empty()) return e;
            for (int32_t dtype : {SX_DTYPE_F16, SX_DTYPE_BF16})
                if (!(e = check_reduce_scatter_16(c, dtype, shard, acc)).empty()) return e;
        }
        if (!(e = check_all_gather(c, shard * 4 + 1, static_cast<int>(shard))).empty()) return e;
    }
    if (!(e = check_all_gather(c, (9u << 20) / 2 + 77, 9)).empty()) return e;  // 2 segments of 4 MiB
    for (size_t n : {size_t(1), size_t(5), size_t(100000)})
        if (!(e = check_all_reduce(c, n)).empty()) return e;
    for (int root = 0; root < c.world_size(); ++root)
        if (!(e = check_broadcast(c, root == 0 ? 300000 : 17, root)).empty()) return e;
    for (int root = 0; root < c.world_size(); ++root)
        if (!(e = check_pieces(c, root)).empty()) return e;
    sx::Status s = c.barrier();
    if (!s.ok()) return "barrier: " + s.message();
    // Many small calls back to back.
    for (int i = 0; i < 20; ++i) {
        if (!(e = check_reduce_scatter(c, 1 + static_cast<size_t>(i) * 13, i % 2 == 0)).empty()) return e;
        if (!(e = check_all_gather(c, 1 + static_cast<size_t>(i) * 5, i)).empty()) return e;
    }
    return "";
}

}  // namespace sxtest
