// Status: copies share the message (no allocation, so none can fail), and making or
// prefixing one where memory has run out keeps the code with words that say so, without
// throwing.
#include "sx_cmocka.h"

#include <atomic>
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

#include "base/status.h"

namespace {

// While armed, every allocation of this program fails (throws std::bad_alloc).
std::atomic<bool> g_no_memory{false};

}  // namespace

void *operator new(std::size_t n) {
    if (g_no_memory.load()) throw std::bad_alloc();
    if (void *p = std::malloc(n ? n : 1)) return p;
    throw std::bad_alloc();
}
void operator delete(void *p) noexcept { std::free(p); }
void operator delete(void *p, std::size_t) noexcept { std::free(p); }

namespace {

void test_copies_share_the_message(void **) {
    const sx::Status s = SX_ERROR(SX_ERR_CORRUPT, "manifest: param '%s' is %d bytes long", "w", 12);
    std::vector<sx::Status> kept(1);
    g_no_memory = true;
    const sx::Status copy = s;  // would throw were it to allocate
    kept[0] = copy;
    g_no_memory = false;
    assert_ptr_equal(copy.message().c_str(), s.message().c_str());
    assert_int_equal(kept[0].code(), SX_ERR_CORRUPT);
    assert_string_equal(kept[0].message().c_str(), "manifest: param 'w' is 12 bytes long");
    assert_true(sx::Status::Ok().message().empty());
}

void test_no_memory_keeps_the_code(void **) {
    sx::Status prefixed = SX_ERROR(SX_ERR_IO, "write failed");
    const int line = prefixed.line();
    g_no_memory = true;
    const sx::Status made = SX_ERROR(SX_ERR_CORRUPT, "a long message that cannot be kept: %s %d", "text", 42);
    prefixed.prefix("saving: ");
    g_no_memory = false;
    assert_int_equal(made.code(), SX_ERR_CORRUPT);
    assert_string_equal(made.message().c_str(), "out of memory while describing the error");
    // The prefix could not be added: the words it had stay, and its code and place.
    assert_int_equal(prefixed.code(), SX_ERR_IO);
    assert_string_equal(prefixed.message().c_str(), "write failed");
    assert_int_equal(prefixed.line(), line);
    prefixed.prefix("saving: ");
    assert_string_equal(prefixed.message().c_str(), "saving: write failed");
}

}  // namespace

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_copies_share_the_message),
        cmocka_unit_test(test_no_memory_keeps_the_code),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
