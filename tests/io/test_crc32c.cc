// CRC32C through ISA-L against the published vectors and against a bitwise reference
// written from the definition, on awkward lengths, unaligned starts and random splits.
//
// Buffers longer than INT_MAX (which ISA-L cannot take in one call) would need more
// than 2 GiB of memory here; the piecewise path they take is the same code as
// detail::crc32c_extend_in_pieces with a small piece size, which is tested instead.
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "base/vector_state.h"
#include "io/crc32c.h"
#include "sx_cmocka.h"
#include "vector_state_check.h"

using sx::io::crc32c;
using sx::io::crc32c_extend;
using sx::io::detail::crc32c_extend_in_pieces;

namespace {

// The definition, one bit at a time: reflected polynomial 0x82F63B78 (0x1EDC6F41
// bit-reversed), register preset to all ones, result inverted.
uint32_t reference_extend(uint32_t crc, const uint8_t *p, size_t n) {
    uint32_t reg = ~crc;
    for (size_t i = 0; i < n; ++i) {
        reg ^= p[i];
        for (int b = 0; b < 8; ++b) reg = (reg >> 1) ^ (0x82F63B78u & (0u - (reg & 1u)));
    }
    return ~reg;
}

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<uint8_t> v(n);
    for (auto &b : v) b = static_cast<uint8_t>(rng());
    return v;
}

// ISA-L's folding code uses wide registers where the processor has them; the caller's
// thread gets them back clean, so that its SSE code is not slowed down.
void test_leaves_the_vector_state_clean(void **) {
    sx::leave_vector_state_clean();
    const int before = sxtest::upper_halves_in_use();
    if (before < 0) {
        print_message("this processor cannot report its vector state (XGETBV with ECX = 1)\n");
        skip();
    }
    assert_int_equal(before, 0);
    const std::vector<uint8_t> data = random_bytes(1 << 20, 7);
    const uint32_t crc = crc32c(data.data(), data.size());
    assert_int_equal(sxtest::upper_halves_in_use(), 0);
    assert_int_equal(crc, reference_extend(0, data.data(), data.size()));
}

// RFC 3720 (iSCSI) appendix B.4, and the "check" value of the CRC catalogue.
void test_known_vectors(void **) {
    uint8_t buf[32];
    std::memset(buf, 0, sizeof buf);
    assert_int_equal(crc32c(buf, 32), 0x8A9136AAu);
    std::memset(buf, 0xFF, sizeof buf);
    assert_int_equal(crc32c(buf, 32), 0x62A8AB43u);
    for (int i = 0; i < 32; ++i) buf[i] = static_cast<uint8_t>(i);
    assert_int_equal(crc32c(buf, 32), 0x46DD794Eu);
    for (int i = 0; i < 32; ++i) buf[i] = static_cast<uint8_t>(31 - i);
    assert_int_equal(crc32c(buf, 32), 0x113FDB5Cu);
    assert_int_equal(crc32c("123456789", 9), 0xE3069283u);
    assert_int_equal(reference_extend(0, reinterpret_cast<const uint8_t *>("123456789"), 9), 0xE3069283u);
}

// No bytes: 0 from the start, and the value unchanged when extending (a null pointer
// with n = 0 is allowed).
void test_empty(void **) {
    assert_int_equal(crc32c(nullptr, 0), 0u);
    assert_int_equal(crc32c_extend(0xE3069283u, nullptr, 0), 0xE3069283u);
    assert_int_equal(crc32c_extend(0x12345678u, "", 0), 0x12345678u);
}

// Every length 0..300 from every start offset 0..15 (ISA-L's vector paths switch on
// length and alignment), plus a few large odd lengths.
void test_matches_reference_on_awkward_sizes(void **) {
    const std::vector<uint8_t> data = random_bytes((1 << 20) + 64, 1);
    for (size_t start = 0; start < 16; ++start) {
        for (size_t n = 0; n <= 300; ++n) {
            const uint32_t got = crc32c(data.data() + start, n);
            const uint32_t want = reference_extend(0, data.data() + start, n);
            if (got != want) fail_msg("length %zu at offset %zu: 0x%08X, reference 0x%08X", n, start, got, want);
        }
    }
    for (size_t n : {size_t{4095}, size_t{4097}, size_t{65537}, size_t{(1 << 20) + 61}}) {
        assert_int_equal(crc32c(data.data() + 3, n), reference_extend(0, data.data() + 3, n));
    }
}

// Splitting anywhere and extending piece by piece equals one call.
void test_piecewise_extension(void **) {
    const std::vector<uint8_t> data = random_bytes(100000, 2);
    const uint32_t whole = crc32c(data.data(), data.size());
    std::mt19937 rng(3);
    for (int trial = 0; trial < 200; ++trial) {
        uint32_t crc = 0;
        size_t pos = 0;
        while (pos < data.size()) {
            // Mostly short pieces, sometimes empty, sometimes long.
            const size_t left = data.size() - pos;
            size_t piece = rng() % 4 == 0 ? rng() % (left + 1) : rng() % 97;
            if (piece > left) piece = left;
            crc = crc32c_extend(crc, data.data() + pos, piece);
            pos += piece;
        }
        if (crc != whole) fail_msg("trial %d: piecewise 0x%08X, whole 0x%08X", trial, crc, whole);
    }
}

// The path buffers longer than INT_MAX take (several library calls), with small
// pieces; max_piece 0 and oversized values fall back to the real limit.
void test_forced_piece_limit(void **) {
    const std::vector<uint8_t> data = random_bytes(10007, 4);
    const uint32_t whole = reference_extend(0, data.data(), data.size());
    for (size_t piece : {size_t{1}, size_t{3}, size_t{7}, size_t{64}, size_t{4095}, size_t{10006}, size_t{10007},
                         size_t{0}, sx::io::detail::kCrc32cMaxPiece, ~size_t{0}}) {
        const uint32_t got = crc32c_extend_in_pieces(0, data.data(), data.size(), piece);
        if (got != whole) fail_msg("piece %zu: 0x%08X, reference 0x%08X", piece, got, whole);
    }
    // Chaining through the seam too.
    const uint32_t head = crc32c_extend_in_pieces(0, data.data(), 5000, 9);
    assert_int_equal(crc32c_extend_in_pieces(head, data.data() + 5000, data.size() - 5000, 11), whole);
}

}  // namespace

int main() {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_known_vectors),
        cmocka_unit_test(test_empty),
        cmocka_unit_test(test_matches_reference_on_awkward_sizes),
        cmocka_unit_test(test_piecewise_extension),
        cmocka_unit_test(test_forced_piece_limit),
        cmocka_unit_test(test_leaves_the_vector_state_clean),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
