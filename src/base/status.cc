#include "base/status.h"

#include <cstdarg>
#include <cstdio>

namespace sx {

namespace {

// Made at load time, so that no allocation is needed when memory has run out.
const std::shared_ptr<const std::string> kNoMemoryText =
    std::make_shared<const std::string>("out of memory while describing the error");

}  // namespace

Status::Status(sx_status_t code, std::string message, const char *file, int line) noexcept
    : code_(code), file_(file), line_(line) {
    try {
        message_ = std::make_shared<const std::string>(std::move(message));
    } catch (...) {
        message_ = kNoMemoryText;
    }
}

const std::string &Status::no_message() noexcept {
    static const std::string empty;
    return empty;
}

Status &Status::prefix(const std::string &context) noexcept {
    try {
        message_ = std::make_shared<const std::string>(context + message());
    } catch (...) {  // no memory for the longer words: the shorter ones stay
    }
    return *this;
}

std::string format(const char *fmt, ...) noexcept {
    va_list ap;
    va_start(ap, fmt);
    va_list ap2;
    va_copy(ap2, ap);
    int n = std::vsnprintf(nullptr, 0, fmt, ap);
    va_end(ap);
    std::string out;
    try {
        if (n > 0) {
            out.resize(static_cast<size_t>(n));
            std::vsnprintf(&out[0], out.size() + 1, fmt, ap2);
        }
    } catch (...) {
        out = std::string();
    }
    va_end(ap2);
    return out;
}

Status status_of_exception(const std::exception *e, bool out_of_memory) {
    // "out of memory" fits std::string's inline buffer: no allocation where none is left.
    if (out_of_memory) return SX_ERROR(SX_ERR_OUT_OF_MEMORY, "out of memory");
    try {
        if (e) return SX_ERROR(SX_ERR_INTERNAL, "unexpected exception: %s", e->what());
        return SX_ERROR(SX_ERR_INTERNAL, "unexpected exception");
    } catch (...) {  // no memory for the text: this must not throw
        return SX_ERROR(SX_ERR_OUT_OF_MEMORY, "out of memory");
    }
}

}  // namespace sx
