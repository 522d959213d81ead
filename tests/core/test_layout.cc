// Layout: alignment, padding, shard and segment boundaries for many shapes and world
// sizes 1..8.
#include "sx_cmocka.h"

#include <cstring>
#include <random>
#include <vector>

#include "core/layout.h"

using sx::core::Layout;
using sx::core::ParamShape;
using sx::core::ShardPiece;

namespace {

// Checks every invariant of a layout against the params it was built from.
void check_layout(const std::vector<ParamShape> &params, int world, uint64_t align) {
    Layout l;
    sx::Status s = Layout::build(params, world, align * 4, &l);
    assert_true(s.ok());
    assert_int_equal(l.num_params(), params.size());
    int last_unit = -1;
    for (const sx::core::UnitLayout &u : l.units()) {
        // Units in increasing id order, each padded to a multiple of world * align.
        assert_true(u.unit_id > last_unit);
        last_unit = u.unit_id;
        assert_int_equal(u.padded_numel % (align * static_cast<uint64_t>(world)), 0);
        assert_true(u.padded_numel >= u.numel);
        assert_true(u.padded_numel - u.numel < align * static_cast<uint64_t>(world) + align);
        assert_int_equal(u.shard_numel * static_cast<uint64_t>(world), u.padded_numel);
        // Params in registration order, aligned, not overlapping, gaps < align.
        uint64_t cursor = 0;
        int32_t last_param = -1;
        for (int32_t p : u.params) {
            assert_true(p > last_param);
            last_param = p;
            assert_int_equal(params[p].unit, u.unit_id);
            const uint64_t off = l.placement(p).offset;
            assert_int_equal(off % align, 0);
            assert_true(off >= cursor);
            assert_true(off - cursor < align);
            cursor = off + params[p].numel;
        }
        assert_int_equal(cursor, u.numel);
    }
    // Every param is covered exactly once by the shards' pieces, in order, and each
    // piece sits where the flat layout says.
    for (size_t p = 0; p < params.size(); ++p) {
        const auto &u = l.units()[l.placement(static_cast<int32_t>(p)).unit_index];
        uint64_t covered = 0;
        for (int r = 0; r < world; ++r) {
            ShardPiece piece = l.piece(static_cast<int32_t>(p), r);
            if (piece.begin == piece.end) continue;
            assert_int_equal(piece.begin, covered);
            assert_true(piece.end > piece.begin);
            assert_true(piece.shard_offset + (piece.end - piece.begin) <= u.shard_numel);
            assert_int_equal(static_cast<uint64_t>(r) * u.shard_numel + piece.shard_offset,
                             l.placement(static_cast<int32_t>(p)).offset + piece.begin);
            covered = piece.end;
        }
        assert_int_equal(covered, params[p].numel);
    }
}

void test_random_shapes_all_world_sizes(void **) {
    std::mt19937_64 rng(12345);
    for (int world = 1; world <= 8; ++world) {
        for (uint64_t align : {1ull, 16ull, 64ull}) {
            for (int trial = 0; trial < 25; ++trial) {
                std::vector<ParamShape> params(1 + rng() % 12);
                for (ParamShape &p : params) {
                    p.unit = static_cast<int32_t>(rng() % 4) * 3;  // sparse unit ids
                    // Mostly small (often smaller than the world size), sometimes large.
                    p.numel = rng() % 4 == 0 ? 1 + rng() % 100000 : 1 + rng() % 9;
                }
                check_layout(params, world, align);
            }
        }
    }
}

void test_small_params_smaller_than_world(void **) {
    // Three scalars in one unit over 8 ranks with 16-element alignment: everything lives
    // in rank 0's and 1's shards, the others hold only padding.
    std::vector<ParamShape> params = {{0, 1}, {0, 1}, {0, 1}};
    check_layout(params, 8, 16);
    Layout l;
    assert_true(Layout::build(params, 8, 64, &l).ok());
    assert_int_equal(l.units()[0].padded_numel, 128);
    assert_int_equal(l.units()[0].shard_numel, 16);
    assert_int_equal(l.placement(1).offset, 16);
    assert_int_equal(l.placement(2).offset, 32);
    ShardPiece p2 = l.piece(2, 2);
    assert_int_equal(p2.begin, 0);
    assert_int_equal(p2.end, 1);
    ShardPiece p2_other = l.piece(2, 1);
    assert_int_equal(p2_other.end - p2_other.begin, 0);
}

void test_one_huge_param(void **) {
    // 2^40 elements: laid out without allocation; 7 ranks split it evenly after padding.
    std::vector<ParamShape> params = {{0, 1ull << 40}};
    check_layout(params, 7, 16);
    Layout l;
    assert_true(Layout::build(params, 7, 64, &l).ok());
    const uint64_t granule = 7 * 16;
    assert_int_equal(l.units()[0].padded_numel, ((1ull << 40) + granule - 1) / granule * granule);
}

void test_unit_too_large_is_rejected(void **) {
    std::vector<ParamShape> params = {{0, UINT64_MAX - 10}, {0, 100}};
    Layout l;
    sx::Status s = Layout::build(params, 3, 64, &l);
    assert_int_equal(s.code(), SX_ERR_INVALID_ARGUMENT);
}

void test_exact_boundaries(void **) {
    // Two params of 24 and 40 elements, align 8, world 4: offsets 0 and 24, unit of 64
    // elements (already a multiple of 32) → shards of 16. Param 0 spans shards 0 and 1,
    // param 1 spans shards 1, 2 and 3.
    std::vector<ParamShape> params = {{5, 24}, {5, 40}};
    Layout l;
    assert_true(Layout::build(params, 4, 32, &l).ok());
    assert_int_equal(l.units()[0].padded_numel, 64);
    assert_int_equal(l.units()[0].shard_numel, 16);
    ShardPiece a = l.piece(0, 1);
    assert_int_equal(a.begin, 16);
    assert_int_equal(a.end, 24);
    assert_int_equal(a.shard_offset, 0);
    ShardPiece b = l.piece(1, 1);
    assert_int_equal(b.begin, 0);
    assert_int_equal(b.end, 8);
    assert_int_equal(b.shard_offset, 8);
    ShardPiece c = l.piece(1, 3);
    assert_int_equal(c.begin, 24);
    assert_int_equal(c.end, 40);
    assert_int_equal(c.shard_offset, 0);
}

void test_two_byte_units_align_in_bytes(void **) {
    // 64-byte alignment is 16 fp32 or 32 bf16 elements; every unit pads to its own granule.
    std::vector<ParamShape> params = {{0, 3, 2}, {0, 5, 2}, {1, 3, 4}, {1, 5, 4}};
    Layout l;
    assert_true(Layout::build(params, 2, 64, &l).ok());
    assert_int_equal(l.units()[0].elem_bytes, 2);
    assert_int_equal(l.units()[0].align_elems, 32);
    assert_int_equal(l.placement(1).offset, 32);
    assert_int_equal(l.units()[0].padded_numel, 64);
    assert_int_equal(l.units()[1].align_elems, 16);
    assert_int_equal(l.placement(3).offset, 16);
    assert_int_equal(l.units()[1].padded_numel, 32);
}

void test_an_alignment_below_the_element_packs(void **) {
    // Alignments of 1 and 2 bytes: each param starts where the one before ends, in fp32
    // (4-byte elements) and bf16 alike; the unit pads only to a multiple of the ranks.
    std::vector<ParamShape> params = {{0, 3, 4}, {0, 5, 4}, {1, 3, 2}, {1, 6, 2}};
    for (uint64_t align : {1u, 2u}) {
        Layout l;
        assert_true(Layout::build(params, 3, align, &l).ok());
        assert_int_equal(l.units()[0].align_elems, 1);
        assert_int_equal(l.placement(1).offset, 3);
        assert_int_equal(l.units()[0].padded_numel, 9);
        assert_int_equal(l.placement(3).offset, 3);
        assert_int_equal(l.units()[1].padded_numel, 9);
    }
    Layout l;
    assert_int_equal(Layout::build(params, 3, 3, &l).code(), SX_ERR_INVALID_ARGUMENT);  // not a power of two
}

// Params with blocks (8-bit state's) start on a block and every shard holds whole blocks
// of them, at any world size; their neighbours without blocks stay packed as before.
void test_blocks_follow_shards(void **) {
    const uint32_t block = 256;
    for (int world = 1; world <= 7; ++world) {
        std::vector<ParamShape> params = {{0, 300, 4, 1}, {0, 4096 + 3 * block, 4, block}, {0, 17, 4, 1},
                                          {0, 8 * block, 4, block}, {1, 5 * block, 4, block}};
        Layout l;
        assert_int_equal(Layout::build(params, world, 64, &l).code(), SX_OK);
        for (int32_t p = 0; p < static_cast<int32_t>(params.size()); ++p) {
            if (params[p].block == 1) continue;
            assert_int_equal(l.placement(p).offset % block, 0);
            uint64_t covered = 0;
            for (int r = 0; r < world; ++r) {
                const ShardPiece s = l.piece(p, r);
                assert_int_equal(s.begin % block, 0);
                if (s.end != params[p].numel) assert_int_equal(s.end % block, 0);
                covered += s.end - s.begin;
            }
            assert_int_equal(covered, params[p].numel);
        }
        for (const auto &u : l.units()) assert_int_equal(u.shard_numel % block, 0);
        // A block that is no power of two is refused.
        params[1].block = 384;
        assert_int_equal(Layout::build(params, world, 64, &l).code(), SX_ERR_INVALID_ARGUMENT);
    }
}

void test_mixed_element_sizes_in_a_unit_are_rejected(void **) {
    std::vector<ParamShape> params = {{0, 3, 2}, {0, 5, 4}};
    Layout l;
    sx::Status s = Layout::build(params, 2, 64, &l);
    assert_int_equal(s.code(), SX_ERR_INVALID_ARGUMENT);
    assert_non_null(std::strstr(s.message().c_str(), "mixes element sizes"));
}

}  // namespace

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_shapes_all_world_sizes),
        cmocka_unit_test(test_small_params_smaller_than_world),
        cmocka_unit_test(test_one_huge_param),
        cmocka_unit_test(test_an_alignment_below_the_element_packs),
        cmocka_unit_test(test_unit_too_large_is_rejected),
        cmocka_unit_test(test_exact_boundaries),
        cmocka_unit_test(test_two_byte_units_align_in_bytes),
        cmocka_unit_test(test_mixed_element_sizes_in_a_unit_are_rejected),
        cmocka_unit_test(test_blocks_follow_shards),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
