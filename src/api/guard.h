// What every extern "C" entry point shares: catching everything at the boundary,
// recording the thread-local error text, and versioned struct handling
// (docs/conventions.md, "The C ABI").
#pragma once

#include <cstddef>
#include <cstring>
#include <utility>

#include "base/log.h"
#include "base/status.h"
#include "base/vector_state.h"
#include "optim/openmp_team.h"

namespace sx {
namespace api {

// Records `s` as this thread's last error (prefixed with the entry point's name) and
// returns its code. Never throws: without memory for the text the last error is empty.
sx_status_t report(const char *function, const Status &s);

// Runs fn (returning Status) so that nothing unwinds across the C boundary.
// Whatever wide-vector code ran on the caller's thread (sx's kernels, the libraries it
// calls), the caller gets its registers back clean (base/vector_state.h), and the OpenMP
// team that resolve() chose for the call's pool jobs is forgotten.
template <typename F>
sx_status_t guard(const char *function, F &&fn) {
    const Status s = catching(std::forward<F>(fn));
    optim::set_caller_openmp_team(nullptr);  // resolve() set it for this call alone
    leave_vector_state_clean();
    return s.ok() ? SX_OK : report(function, s);
}

// Structs larger than this are taken as garbage in struct_size.
constexpr size_t kMaxStructSize = 4096;

Status check_struct_size(size_t size, size_t min_size, const char *what, size_t ours);

// Fills *p (size bytes, the caller's sizeof) with `defaults` and sets struct_size.
template <typename T>
Status init_struct(T *p, size_t size, const T &defaults, const char *what) {
    SX_CHECK_ARG(p != nullptr, "%s is NULL", what);
    SX_TRY(check_struct_size(size, sizeof(size_t), what, sizeof(T)));
    std::memset(static_cast<void *>(p), 0, size);
    std::memcpy(static_cast<void *>(p), &defaults, size < sizeof(T) ? size : sizeof(T));
    p->struct_size = size;
    return Status::Ok();
}

// Reads the caller's input struct over `*out` (pre-filled with defaults): fields the
// caller's older struct lacks keep their defaults; a newer caller's unknown tail must
// be zero.
template <typename T>
Status read_input(const T *in, const char *what, size_t min_size, T *out) {
    SX_CHECK_ARG(in != nullptr, "%s is NULL", what);
    const size_t size = in->struct_size;
    SX_TRY(check_struct_size(size, min_size, what, sizeof(T)));
    const unsigned char *bytes = reinterpret_cast<const unsigned char *>(in);
    for (size_t i = sizeof(T); i < size; ++i)
        SX_CHECK_ARG(bytes[i] == 0,
                     "%s has %zu bytes beyond the %zu this library knows, and byte %zu is not zero "
                     "(was the caller built against a newer sx.h?)",
                     what, size - sizeof(T), sizeof(T), i);
    std::memcpy(static_cast<void *>(out), in, size < sizeof(T) ? size : sizeof(T));
    out->struct_size = sizeof(T);
    return Status::Ok();
}

// Checks an output struct's struct_size before anything is done.
template <typename T>
Status check_output(const T *out, const char *what) {
    SX_CHECK_ARG(out != nullptr, "%s is NULL", what);
    return check_struct_size(out->struct_size, sizeof(size_t), what, sizeof(T));
}

// Writes `value` into the caller's output struct, at most its struct_size bytes;
// bytes of a newer caller's struct beyond ours become zero.
template <typename T>
void write_output(T *out, const T &value) {
    const size_t size = out->struct_size;
    std::memcpy(static_cast<void *>(out), &value, size < sizeof(T) ? size : sizeof(T));
    if (size > sizeof(T)) std::memset(reinterpret_cast<char *>(out) + sizeof(T), 0, size - sizeof(T));
    out->struct_size = size;
}

}  // namespace api
}  // namespace sx
