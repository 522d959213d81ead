// The rendezvous store's state machine (tcp_store_core.h).
#include "rdzv/tcp_store_core.h"

#include <sys/random.h>

#include <cerrno>

#include "base/log.h"
#include "rdzv/hmac_sha256.h"
#include "rdzv/stores.h"

namespace sx {
namespace rdzv {

namespace wire {

std::string client_proof(const std::string &token, const std::string &server_nonce, const std::string &client_nonce) {
    return hmac_sha256(token, "sx rendezvous client\n" + server_nonce + client_nonce);
}

std::string server_proof(const std::string &token, const std::string &server_nonce, const std::string &client_nonce) {
    return hmac_sha256(token, "sx rendezvous server\n" + server_nonce + client_nonce);
}

// A nonce must never repeat or be guessed, or a recorded answer could be replayed.
std::string random_nonce() {
    std::string n(wire::kNonceBytes, '\0');
    size_t got = 0;
    while (got < n.size()) {
        ssize_t k = ::getrandom(&n[got], n.size() - got, 0);
        if (k > 0) got += static_cast<size_t>(k);
        else if (errno != EINTR) break;
    }
    return got == n.size() ? n : std::string();
}

}  // namespace wire

namespace {

std::vector<std::string> read_keys(wire::Reader &r) {
    uint32_t n = r.u32();
    std::vector<std::string> keys;
    for (uint32_t i = 0; i < n && r.ok(); ++i) keys.push_back(r.str());
    return keys;
}

std::string error_frame(const std::string &message) {
    return wire::Writer().u8(wire::kError).str(message).frame();
}

}  // namespace

StoreCore::StoreCore(uint64_t id, std::string token, StoreLimits limits, Transport *transport)
    : id_(id), token_(std::move(token)), limits_(limits), transport_(transport) {}

void StoreCore::open(StorePeer *p, int64_t now_ms) {
    p->open = true;
    p->opened_ms = p->last_byte_ms = now_ms;
    peers_.insert(p);
}

void StoreCore::forget(StorePeer *p) {
    if (!p->open) return;
    p->open = false;
    unwatch(p);
    buffered_bytes_ -= p->in.size();
    std::string().swap(p->in);
    peers_.erase(p);
}

void StoreCore::unwatch(StorePeer *p) {
    for (const std::string &k : p->held_keys) {
        auto it = watchers_.find(k);
        if (it == watchers_.end()) continue;
        it->second.erase(p);
        if (it->second.empty()) watchers_.erase(it);
    }
    p->held_keys.clear();
    p->held = false;
}

void StoreCore::drop(StorePeer *p, const std::string &why) {
    log(SX_LOG_WARN, "sx: rendezvous server: closing the connection from %s: %s", p->name.c_str(), why.c_str());
    ++refused_;
    forget(p);
    transport_->close(p);
}

// Answers an error the client will show, then closes.
void StoreCore::refuse(StorePeer *p, const std::string &message) {
    transport_->send(p, error_frame(message));
    drop(p, message);
}

void StoreCore::receive(StorePeer *p, const char *data, size_t n, int64_t now_ms) {
    if (!p->open || n == 0) return;
    const uint32_t limit = p->admitted ? limits_.max_frame : limits_.pre_admission_frame;
    // One request and the header of the next is all a client has in flight (it sends the
    // next after the answer); anything more is a stranger's flood.
    if (p->in.size() + n > size_t(limit) + 8) {
        drop(p, format("%zu bytes sent ahead, more than one request's worth", p->in.size() + n));
        return;
    }
    if (buffered_bytes_ + n > limits_.max_buffered) {
        drop(p, format("the server already buffers %zu bytes of incomplete requests (limit %zu)", buffered_bytes_,
                       limits_.max_buffered));
        return;
    }
    p->in.append(data, n);
    p->last_byte_ms = now_ms;
    buffered_bytes_ += n;
    if (buffered_bytes_ > peak_buffered_) peak_buffered_ = buffered_bytes_;
    process(p);
}

// Parses and answers complete frames until the input runs out or a request is held.
void StoreCore::process(StorePeer *p) {
    size_t pos = 0;
    while (p->open && !p->held && p->in.size() - pos >= 4) {
        const uint32_t n = wire::frame_length(p->in.data() + pos);
        const uint32_t limit = p->admitted ? limits_.max_frame : limits_.pre_admission_frame;
        if (n == 0 || n > limit) {
            drop(p, format("a frame of %u bytes (limit %u%s)", n, limit, p->admitted ? "" : " before admission"));
            return;
        }
        if (p->in.size() - pos - 4 < n) break;
        const std::string body = p->in.substr(pos + 4, n);
        pos += 4 + static_cast<size_t>(n);
        if (!handle(p, body)) {
            if (p->open) drop(p, "a malformed request");
            return;
        }
    }
    if (!p->open) return;
    p->in.erase(0, pos);
    buffered_bytes_ -= pos;
    // A large request's buffer is given back once it has been handled.
    if (p->in.capacity() > 4096 && p->in.size() < 1024) std::string(p->in).swap(p->in);
}

bool StoreCore::all_present(const std::vector<std::string> &keys) const {
    for (const std::string &k : keys)
        if (data_.find(k) == data_.end()) return false;
    return true;
}

bool StoreCore::handle_hello(StorePeer *p, wire::Reader &r) {
    if (!r.done() || p->said_hello) return false;
    p->said_hello = true;
    if (!token_.empty()) {
        p->nonce = wire::random_nonce();
        if (p->nonce.empty()) {
            refuse(p, "the rendezvous server could not draw a random challenge");
            return true;
        }
    } else {
        p->admitted = true;
    }
    transport_->send(p, wire::Writer().u8(wire::kOk).u64(id_).u8(token_.empty() ? 0 : 1).str(p->nonce).frame());
    return true;
}

bool StoreCore::handle_auth(StorePeer *p, wire::Reader &r) {
    const std::string client_nonce = r.str(), proof = r.str();
    if (!r.done()) return false;
    if (!p->said_hello || p->admitted || token_.empty()) {
        refuse(p, "unexpected AUTH: it follows HELLO, once, on a server that has a token");
        return true;
    }
    // The expected proof is computed whatever the nonce's length, and compared in
    // constant time, so the answer's timing tells nothing of the token.
    const bool ok = client_nonce.size() == wire::kNonceBytes &&
                    equal_in_constant_time(proof, wire::client_proof(token_, p->nonce, client_nonce));
    if (!ok) {
        refuse(p, "the rendezvous token does not match the server's (every rank needs the token rank 0 has: "
                  "sx_group_config_t.rendezvous_token or SX_RENDEZVOUS_TOKEN)");
        return true;
    }
    p->admitted = true;
    transport_->send(p, wire::Writer().u8(wire::kOk).str(wire::server_proof(token_, p->nonce, client_nonce)).frame());
    return true;
}

// Stores key = value if the limits allow; otherwise answers an error. Returns whether it
// stored.
bool StoreCore::store(StorePeer *p, const std::string &key, std::string value) {
    auto it = data_.find(key);
    const size_t old = it == data_.end() ? 0 : key.size() + it->second.size();
    const size_t add = key.size() + value.size();
    if (it == data_.end() && data_.size() >= limits_.max_keys) {
        transport_->send(p, error_frame(format("the rendezvous store is full: it holds %zu keys, its limit", data_.size())));
        return false;
    }
    if (stored_bytes_ - old + add > limits_.max_bytes) {
        transport_->send(p, error_frame(format("the rendezvous store is full: it holds %zu bytes, and key '%s' of %zu "
                                               "bytes would pass its limit of %zu",
                                               stored_bytes_, key.c_str(), value.size(), limits_.max_bytes)));
        return false;
    }
    stored_bytes_ = stored_bytes_ - old + add;
    if (it == data_.end()) {
        data_.emplace(key, std::move(value));
    } else {
        it->second = std::move(value);
    }
    return true;
}

// Handles one request; false if it is malformed.
bool StoreCore::handle(StorePeer *p, const std::string &body) {
    wire::Reader r(body.data(), body.size());
    const uint8_t op = r.u8();
    if (op == wire::kHello) return handle_hello(p, r);
    if (op == wire::kAuth) return handle_auth(p, r);
    if (!p->admitted) {
        refuse(p, !p->said_hello ? "a request before HELLO"
                                 : "this rendezvous server requires a token, and the client sent none (set "
                                   "sx_group_config_t.rendezvous_token or SX_RENDEZVOUS_TOKEN on every rank)");
        return true;
    }
    switch (op) {
    case wire::kSet: {
        std::string key = r.str(), value = r.str();
        if (!r.done()) return false;
        if (store(p, key, std::move(value))) {
            transport_->send(p, wire::Writer().u8(wire::kOk).frame());
            notify(key);
        }
        return true;
    }
    case wire::kGet:
    case wire::kWait: {
        std::vector<std::string> keys;
        if (op == wire::kGet) {
            keys.push_back(r.str());
        } else {
            keys = read_keys(r);
        }
        if (!r.done()) return false;
        p->held = true;
        p->held_op = op;
        p->held_keys = std::move(keys);
        examine(p);
        return true;
    }
    case wire::kAdd: {
        std::string key = r.str();
        int64_t delta = r.i64();
        if (!r.done()) return false;
        auto it = data_.find(key);
        int64_t value = 0;
        Status s = apply_add(key, it == data_.end() ? nullptr : &it->second, delta, &value);
        if (!s.ok()) {
            transport_->send(p, error_frame(s.message()));
            return true;
        }
        if (store(p, key, std::to_string(value))) {
            transport_->send(p, wire::Writer().u8(wire::kOk).i64(value).frame());
            notify(key);
        }
        return true;
    }
    case wire::kCheck: {
        std::vector<std::string> keys = read_keys(r);
        if (!r.done()) return false;
        transport_->send(p, wire::Writer().u8(wire::kOk).u8(all_present(keys) ? 1 : 0).frame());
        return true;
    }
    case wire::kErase:
    case wire::kErasePrefix:
        return handle_erase(p, r, op == wire::kErasePrefix);
    default:
        return false;
    }
}

// ERASE (the key) and ERASE_PREFIX (every key that begins with it); false if malformed.
bool StoreCore::handle_erase(StorePeer *p, wire::Reader &r, bool prefix) {
    const std::string key = r.str();
    if (!r.done()) return false;
    auto it = prefix ? data_.lower_bound(key) : data_.find(key);
    while (it != data_.end() && it->first.compare(0, key.size(), key) == 0 && (prefix || it->first == key)) {
        stored_bytes_ -= it->first.size() + it->second.size();
        it = data_.erase(it);
    }
    transport_->send(p, wire::Writer().u8(wire::kOk).frame());
    return true;
}

// Answers p's held request if its keys are all present; otherwise (re)registers p as a
// watcher of each missing key. Returns whether it was answered.
bool StoreCore::examine(StorePeer *p) {
    bool ready = true;
    for (const std::string &k : p->held_keys) {
        if (data_.find(k) != data_.end()) continue;
        ready = false;
        watchers_[k].insert(p);
    }
    if (!ready) return false;
    if (p->held_op == wire::kGet) {
        transport_->send(p, wire::Writer().u8(wire::kOk).str(data_[p->held_keys[0]]).frame());
    } else {
        transport_->send(p, wire::Writer().u8(wire::kOk).frame());
    }
    unwatch(p);
    return true;
}

// Key k was just written: re-examines the peers waiting for it.
void StoreCore::notify(const std::string &k) {
    auto it = watchers_.find(k);
    if (it == watchers_.end()) return;
    std::vector<StorePeer *> waiting(it->second.begin(), it->second.end());
    watchers_.erase(it);
    std::vector<StorePeer *> answered;
    for (StorePeer *p : waiting)
        if (p->open && p->held && examine(p)) answered.push_back(p);
    // Requests the answered clients sent meanwhile (none, for sx's client) come next.
    for (StorePeer *p : answered) process(p);
}

void StoreCore::sweep(int64_t now_ms) {
    std::vector<StorePeer *> late;
    for (StorePeer *p : peers_) {
        if (!p->said_hello && now_ms - p->opened_ms >= limits_.first_frame_ms) {
            late.push_back(p);
        } else if (!p->admitted && now_ms - p->opened_ms >= limits_.handshake_ms) {
            late.push_back(p);
        } else if (p->admitted && !p->held && !p->in.empty() && now_ms - p->last_byte_ms >= limits_.idle_frame_ms) {
            late.push_back(p);
        }
    }
    for (StorePeer *p : late)
        drop(p, p->admitted     ? format("an incomplete request idle for %lld ms", static_cast<long long>(limits_.idle_frame_ms))
                : !p->said_hello ? format("no HELLO within %lld ms", static_cast<long long>(limits_.first_frame_ms))
                                 : format("not admitted within %lld ms", static_cast<long long>(limits_.handshake_ms)));
}

StoreCore::Stats StoreCore::stats() const {
    Stats s;
    s.peers = peers_.size();
    for (const StorePeer *p : peers_) s.admitted += p->admitted ? 1 : 0;
    s.keys = data_.size();
    s.stored_bytes = stored_bytes_;
    s.buffered_bytes = buffered_bytes_;
    s.peak_buffered_bytes = peak_buffered_;
    s.refused = refused_;
    return s;
}

std::string StoreCore::audit() const {
    size_t stored = 0;
    for (const auto &kv : data_) stored += kv.first.size() + kv.second.size();
    if (stored != stored_bytes_) return format("stored_bytes %zu, but the keys and values add up to %zu", stored_bytes_, stored);
    if (stored_bytes_ > limits_.max_bytes) return format("stored_bytes %zu > limit %zu", stored_bytes_, limits_.max_bytes);
    if (data_.size() > limits_.max_keys) return format("%zu keys > limit %zu", data_.size(), limits_.max_keys);
    size_t buffered = 0;
    for (const StorePeer *p : peers_) {
        if (!p->open) return "a closed peer is still listed";
        buffered += p->in.size();
        if (p->held && p->held_keys.empty()) return "a held peer waits for no key";
        const uint32_t limit = p->admitted ? limits_.max_frame : limits_.pre_admission_frame;
        if (p->in.size() > size_t(limit) + 8) return format("a peer buffers %zu bytes", p->in.size());
    }
    if (buffered != buffered_bytes_) return format("buffered_bytes %zu, but the peers hold %zu", buffered_bytes_, buffered);
    if (buffered_bytes_ > limits_.max_buffered) return "buffered_bytes over its limit";
    for (const auto &w : watchers_)
        for (const StorePeer *p : w.second) {
            if (peers_.count(const_cast<StorePeer *>(p)) == 0) return "a forgotten peer watches key '" + w.first + "'";
            if (!p->held) return "a peer that holds no request watches key '" + w.first + "'";
            if (data_.count(w.first) != 0) return "a peer watches key '" + w.first + "', which is present";
        }
    return "";
}

}  // namespace rdzv
}  // namespace sx
