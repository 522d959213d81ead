// The rendezvous store's guard without sockets: SHA-256 and HMAC-SHA256 against FIPS
// 180-4's and RFC 4231's vectors; StoreCore (tcp_store_core.h) driven by hand with a fake
// transport and clock: admission (HELLO, the token's challenge-response, requests before
// it refused), the small frame limit before admission, handshakes and idle incomplete
// requests dropped at their time (not before), the caps on keys, bytes held and bytes
// buffered, each refusal leaving the core's invariants (audit()) intact.
#include <map>
#include <set>

#include "rdzv/hmac_sha256.h"
#include "rdzv/tcp_store_core.h"
#include "comm_test_util.h"

using sx::rdzv::StoreCore;
using sx::rdzv::StoreLimits;
using sx::rdzv::StorePeer;
namespace wire = sx::rdzv::wire;

namespace {

std::string hex(const std::string &bytes) {
    static const char digits[] = "0123456789abcdef";
    std::string out;
    for (unsigned char c : bytes) {
        out.push_back(digits[c >> 4]);
        out.push_back(digits[c & 15]);
    }
    return out;
}

std::string unhex(const std::string &text) {
    std::string out;
    for (size_t i = 0; i + 1 < text.size(); i += 2) out.push_back(static_cast<char>(std::stoi(text.substr(i, 2), nullptr, 16)));
    return out;
}

void test_sha256_vectors(void **) {
    // FIPS 180-4 examples (csrc.nist.gov, SHA256.pdf and SHA2_Additional.pdf).
    assert_string_equal(hex(sx::rdzv::sha256("")).c_str(),
                        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    assert_string_equal(hex(sx::rdzv::sha256("abc")).c_str(),
                        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    assert_string_equal(hex(sx::rdzv::sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")).c_str(),
                        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    assert_string_equal(hex(sx::rdzv::sha256(std::string(1000000, 'a'))).c_str(),
                        "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    // Lengths around the padding's block boundary (55, 56, 64 bytes), against the digest
    // of the same bytes given in two ways (one call; a one-byte-longer input differs).
    for (size_t n : {55u, 56u, 63u, 64u, 65u, 119u, 120u}) {
        const std::string a(n, 'x');
        assert_int_equal(sx::rdzv::sha256(a).size(), 32);
        assert_true(sx::rdzv::sha256(a) != sx::rdzv::sha256(a + "x"));
    }
    assert_string_equal(hex(sx::rdzv::sha256(std::string(64, 'a'))).c_str(),
                        "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb");
}

void test_hmac_rfc4231(void **) {
    struct Case {
        std::string key, data, mac;
    };
    const Case cases[] = {
        {std::string(20, '\x0b'), "Hi There", "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"},
        {"Jefe", "what do ya want for nothing?", "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"},
        {std::string(20, '\xaa'), std::string(50, '\xdd'),
         "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"},
        {unhex("0102030405060708090a0b0c0d0e0f10111213141516171819"), std::string(50, '\xcd'),
         "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"},
        {std::string(131, '\xaa'), "Test Using Larger Than Block-Size Key - Hash Key First",
         "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"},
        {std::string(131, '\xaa'),
         "This is a test using a larger than block-size key and a larger than block-size data. The key needs to be "
         "hashed before being used by the HMAC algorithm.",
         "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2"},
    };
    for (const Case &c : cases) assert_string_equal(hex(sx::rdzv::hmac_sha256(c.key, c.data)).c_str(), c.mac.c_str());
    // Case 5 truncates to 128 bits.
    assert_string_equal(hex(sx::rdzv::hmac_sha256(std::string(20, '\x0c'), "Test With Truncation")).substr(0, 32).c_str(),
                        "a3b6167473100ee06e0c796c2955552b");
}

void test_constant_time_compare(void **) {
    using sx::rdzv::equal_in_constant_time;
    assert_true(equal_in_constant_time("", ""));
    assert_true(equal_in_constant_time(std::string("a\0b", 3), std::string("a\0b", 3)));
    assert_false(equal_in_constant_time(std::string("a\0b", 3), std::string("a\0c", 3)));
    assert_false(equal_in_constant_time("abc", "abcd"));
    assert_false(equal_in_constant_time("xbc", "abc"));
    assert_false(equal_in_constant_time("abx", "abc"));
}

// The transport of the tests: frames sent to each peer, the peers it was told to close.
struct Fake final : StoreCore::Transport {
    std::map<StorePeer *, std::vector<std::string>> sent;
    std::set<StorePeer *> closed;
    void send(StorePeer *p, std::string frame) override { sent[p].push_back(frame.substr(4)); }
    void close(StorePeer *p) override { closed.insert(p); }
    // The last frame body sent to p: status byte and payload.
    std::string last(StorePeer *p) { return sent[p].empty() ? std::string() : sent[p].back(); }
};

struct Core {
    explicit Core(const std::string &token = "", StoreLimits limits = StoreLimits())
        : core(7, token, limits, &fake) {}
    Fake fake;
    StoreCore core;
    int64_t now = 1000;
    std::vector<std::unique_ptr<StorePeer>> peers;

    StorePeer *open() {
        peers.emplace_back(new StorePeer());
        core.open(peers.back().get(), now);
        return peers.back().get();
    }
    void send(StorePeer *p, const std::string &bytes) { core.receive(p, bytes.data(), bytes.size(), now); }
    void audit() {
        std::string a = core.audit();
        if (!a.empty()) {
            print_error("audit: %s\n", a.c_str());
            fail();
        }
    }
    // HELLO; returns the nonce.
    std::string hello(StorePeer *p) {
        send(p, wire::Writer().u8(wire::kHello).frame());
        const std::string reply = fake.last(p);
        wire::Reader r(reply.data(), reply.size());
        assert_int_equal(r.u8(), wire::kOk);
        assert_int_equal(r.u64(), 7);
        r.u8();
        std::string nonce = r.str();
        assert_true(r.done());
        return nonce;
    }
    void set(StorePeer *p, const std::string &k, const std::string &v) {
        send(p, wire::Writer().u8(wire::kSet).str(k).str(v).frame());
    }
};

bool is_error(const std::string &reply, const char *part) {
    wire::Reader r(reply.data(), reply.size());
    if (r.u8() != wire::kError) return false;
    return sxtest::contains(r.str(), part);
}

bool is_ok(const std::string &reply) { return !reply.empty() && static_cast<uint8_t>(reply[0]) == wire::kOk; }

void test_admission_without_token(void **) {
    Core c;
    StorePeer *p = c.open();
    // A request before HELLO is refused and the connection closed.
    c.set(p, "k", "v");
    assert_true(is_error(c.fake.last(p), "before HELLO"));
    assert_true(c.fake.closed.count(p));
    assert_int_equal(c.core.stats().keys, 0);
    StorePeer *q = c.open();
    assert_true(c.hello(q).empty());  // no token: no challenge, admitted
    c.set(q, "k", "v");
    assert_true(is_ok(c.fake.last(q)));
    assert_int_equal(c.core.stats().keys, 1);
    // HELLO twice is malformed.
    c.send(q, wire::Writer().u8(wire::kHello).frame());
    assert_true(c.fake.closed.count(q));
    c.audit();
}

void test_admission_with_token(void **) {
    const std::string token = "s3cret-token";
    Core c(token);
    // Right proof: admitted, and the server's proof checks out.
    StorePeer *p = c.open();
    std::string nonce = c.hello(p);
    assert_int_equal(nonce.size(), wire::kNonceBytes);
    c.set(p, "early", "v");  // before AUTH: refused
    assert_true(is_error(c.fake.last(p), "requires a token"));
    assert_true(c.fake.closed.count(p));
    assert_int_equal(c.core.stats().keys, 0);

    StorePeer *q = c.open();
    nonce = c.hello(q);
    const std::string mine(wire::kNonceBytes, 'c');
    c.send(q, wire::Writer().u8(wire::kAuth).str(mine).str(wire::client_proof(token, nonce, mine)).frame());
    const std::string reply = c.fake.last(q);
    wire::Reader r(reply.data(), reply.size());
    assert_int_equal(r.u8(), wire::kOk);
    assert_true(r.str() == wire::server_proof(token, nonce, mine));
    c.set(q, "k", "v");
    assert_true(is_ok(c.fake.last(q)));

    // Wrong token, a proof for another nonce (a replay), a short nonce: refused, closed,
    // and the error never shows the token.
    const std::string wrong[] = {wire::client_proof("another", "", mine), "", std::string(32, '\0')};
    for (const std::string &proof : wrong) {
        StorePeer *w = c.open();
        c.hello(w);
        c.send(w, wire::Writer().u8(wire::kAuth).str(mine).str(proof.empty() ? wire::client_proof(token, nonce, mine) : proof).frame());
        assert_true(is_error(c.fake.last(w), "does not match"));
        assert_false(sxtest::contains(c.fake.last(w), token.c_str()));
        assert_true(c.fake.closed.count(w));
    }
    StorePeer *s = c.open();
    std::string n = c.hello(s);
    c.send(s, wire::Writer().u8(wire::kAuth).str("short").str(wire::client_proof(token, n, "short")).frame());
    assert_true(is_error(c.fake.last(s), "does not match"));
    // AUTH without HELLO.
    StorePeer *t = c.open();
    c.send(t, wire::Writer().u8(wire::kAuth).str(mine).str(mine).frame());
    assert_true(is_error(c.fake.last(t), "unexpected AUTH"));
    // The admitted peer is still served.
    c.send(q, wire::Writer().u8(wire::kGet).str("k").frame());
    assert_true(is_ok(c.fake.last(q)));
    assert_int_equal(c.core.stats().keys, 1);
    c.audit();
}

void test_frame_limits(void **) {
    StoreLimits limits;
    Core c("tok", limits);
    // Before admission, a frame longer than pre_admission_frame is dropped as soon as
    // its header arrives, before its body is buffered.
    StorePeer *p = c.open();
    c.send(p, std::string("\x00\x10\x00\x00", 4));  // 4096 bytes announced
    assert_true(c.fake.closed.count(p));
    assert_int_equal(c.core.stats().buffered_bytes, 0);
    // A zero-length frame is malformed.
    StorePeer *z = c.open();
    c.send(z, std::string(4, '\0'));
    assert_true(c.fake.closed.count(z));
    // More than one request's worth at once.
    StorePeer *f = c.open();
    c.send(f, std::string(limits.pre_admission_frame + 9, 'x'));
    assert_true(c.fake.closed.count(f));
    // An admitted peer (no token) may send up to max_frame, not more.
    Core open;
    StorePeer *a = open.open();
    open.hello(a);
    uint32_t big = limits.max_frame + 1;
    std::string header(4, '\0');
    for (int i = 0; i < 4; ++i) header[i] = static_cast<char>(big >> (8 * i));
    open.send(a, header);
    assert_true(open.fake.closed.count(a));
    assert_int_equal(open.core.stats().refused, 1);
    c.audit();
    open.audit();
}

void test_handshake_and_idle_timeouts(void **) {
    StoreLimits limits;
    limits.handshake_ms = 500;
    limits.idle_frame_ms = 300;
    Core c("tok", limits);
    StorePeer *silent = c.open();
    StorePeer *half = c.open();
    c.send(half, std::string("\x20\x00\x00\x00" "abc", 7));  // 32 bytes announced, 3 sent
    c.now += 499;
    c.core.sweep(c.now);
    assert_true(c.fake.closed.empty());
    c.now += 1;
    c.core.sweep(c.now);
    assert_true(c.fake.closed.count(silent) && c.fake.closed.count(half));
    assert_int_equal(c.core.stats().peers, 0);
    assert_int_equal(c.core.stats().buffered_bytes, 0);

    // Admitted (no token): an incomplete request idle for idle_frame_ms is dropped; one
    // that keeps coming, and an idle peer with nothing half-sent, are not.
    Core o("", limits);
    StorePeer *slow = o.open(), *idle = o.open(), *trickle = o.open();
    for (StorePeer *p : {slow, idle, trickle}) o.hello(p);
    o.send(slow, std::string("\x20\x00\x00\x00" "ab", 6));
    o.send(trickle, std::string("\x20\x00\x00\x00" "ab", 6));
    for (int i = 0; i < 5; ++i) {
        o.now += 100;
        o.send(trickle, "x");
        o.core.sweep(o.now);
    }
    assert_true(o.fake.closed.count(slow));
    assert_false(o.fake.closed.count(trickle));
    assert_false(o.fake.closed.count(idle));
    o.now += 10 * limits.idle_frame_ms;
    o.core.sweep(o.now);
    assert_false(o.fake.closed.count(idle));
    o.audit();
}

void test_caps_on_what_is_held(void **) {
    StoreLimits limits;
    limits.max_keys = 3;
    limits.max_bytes = 100;
    Core c("", limits);
    StorePeer *p = c.open();
    c.hello(p);
    c.set(p, "a", std::string(40, 'x'));
    c.set(p, "b", std::string(40, 'x'));
    assert_true(is_ok(c.fake.last(p)));
    c.set(p, "c", std::string(40, 'x'));  // 123 bytes: over
    assert_true(is_error(c.fake.last(p), "full"));
    assert_int_equal(c.core.stats().stored_bytes, 82);
    c.set(p, "a", std::string(10, 'x'));  // replacing shrinks
    c.set(p, "c", std::string(10, 'x'));
    assert_true(is_ok(c.fake.last(p)));
    c.send(p, wire::Writer().u8(wire::kAdd).str("d").i64(1).frame());  // a 4th key
    assert_true(is_error(c.fake.last(p), "keys"));
    c.send(p, wire::Writer().u8(wire::kErase).str("b").frame());
    c.send(p, wire::Writer().u8(wire::kAdd).str("d").i64(5).frame());
    assert_true(is_ok(c.fake.last(p)));
    assert_int_equal(c.core.stats().keys, 3);
    assert_int_equal(c.core.stats().stored_bytes, 11 + 11 + 2);
    // A refused set does not wake a waiter; the connection stays open.
    StorePeer *w = c.open();
    c.hello(w);
    c.send(w, wire::Writer().u8(wire::kGet).str("e").frame());
    const size_t answers = c.fake.sent[w].size();
    c.set(p, "e", std::string(200, 'x'));
    assert_int_equal(c.fake.sent[w].size(), answers);
    assert_false(c.fake.closed.count(p));
    c.send(p, wire::Writer().u8(wire::kErase).str("c").frame());
    c.set(p, "e", "small");
    assert_int_equal(c.fake.sent[w].size(), answers + 1);
    c.audit();
}

void test_buffered_bytes_cap(void **) {
    StoreLimits limits;
    limits.max_buffered = 1000;
    Core c("", limits);
    std::vector<StorePeer *> ps;
    for (int i = 0; i < 4; ++i) {
        ps.push_back(c.open());
        c.hello(ps.back());
        // 400 bytes of a 500-byte SET each: the third would pass 1000.
        wire::Writer w;
        std::string f = w.u8(wire::kSet).str("k").str(std::string(500 - 10, 'v')).frame();
        c.send(ps.back(), f.substr(0, 400));
    }
    assert_false(c.fake.closed.count(ps[0]) || c.fake.closed.count(ps[1]));
    assert_true(c.fake.closed.count(ps[2]) && c.fake.closed.count(ps[3]));
    assert_true(c.core.stats().peak_buffered_bytes <= limits.max_buffered);
    assert_int_equal(c.core.stats().buffered_bytes, 800);
    c.audit();
}

// A held GET is answered when its key comes, and a closed waiter is forgotten.
void test_held_requests(void **) {
    Core c;
    StorePeer *a = c.open(), *b = c.open(), *gone = c.open();
    for (StorePeer *p : {a, b, gone}) c.hello(p);
    c.send(a, wire::Writer().u8(wire::kWait).u32(2).str("x").str("y").frame());
    c.send(gone, wire::Writer().u8(wire::kGet).str("x").frame());
    c.core.forget(gone);
    c.audit();
    c.set(b, "x", "1");
    c.audit();
    const size_t before = c.fake.sent[a].size();
    c.set(b, "y", "2");
    assert_int_equal(c.fake.sent[a].size(), before + 1);
    assert_true(is_ok(c.fake.last(a)));
    c.audit();
}

}  // namespace

int main() {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sha256_vectors),
        cmocka_unit_test(test_hmac_rfc4231),
        cmocka_unit_test(test_constant_time_compare),
        cmocka_unit_test(test_admission_without_token),
        cmocka_unit_test(test_admission_with_token),
        cmocka_unit_test(test_frame_limits),
        cmocka_unit_test(test_handshake_and_idle_timeouts),
        cmocka_unit_test(test_caps_on_what_is_held),
        cmocka_unit_test(test_buffered_bytes_cap),
        cmocka_unit_test(test_held_requests),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
