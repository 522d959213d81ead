#include "base/status.h"

#include <cstdarg>
#include <cstdio>

namespace sx {

std::string format(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    va_list ap2;
    va_copy(ap2, ap);
    int n = std::vsnprintf(nullptr, 0, fmt, ap);
    va_end(ap);
    std::string out;
    if (n > 0) {
        out.resize(static_cast<size_t>(n));
        std::vsnprintf(&out[0], out.size() + 1, fmt, ap2);
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
