#include "api/guard.h"

#include <string>

namespace sx {
namespace api {
namespace {
thread_local std::string t_last_error;
}  // namespace

const char *last_error() { return t_last_error.c_str(); }

sx_status_t report(const char *function, const Status &s) {
    try {
        t_last_error = std::string(function) + ": " + s.message();
        log(SX_LOG_DEBUG, "%s [%s:%d]", t_last_error.c_str(), s.file(), s.line());
    } catch (...) {
        t_last_error.clear();  // no memory for the text: the code still tells what failed
    }
    return s.code();
}

Status check_struct_size(size_t size, size_t min_size, const char *what, size_t ours) {
    SX_CHECK_ARG(size >= min_size && size <= kMaxStructSize,
                 "%s->struct_size is %zu; it must be between %zu and %zu (sizeof in this "
                 "library: %zu; fill it with its sx_*_init function)",
                 what, size, min_size, kMaxStructSize, ours);
    return Status::Ok();
}

}  // namespace api
}  // namespace sx
