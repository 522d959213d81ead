// Status: the one error-propagation idiom of sx. A Status is a code from sx.h plus a
// message a user can act on and the file:line where it was made.
#pragma once

#include <exception>
#include <memory>
#include <new>
#include <string>
#include <utility>

#include "sx/sx.h"

namespace sx {

// Copying, moving and destroying a Status never allocate nor throw (its message is
// shared), and neither does making one or prefixing it: where no memory is left for the
// words, they become "out of memory while describing the error" and the code stays. So a
// Status may be kept, copied or handed on anywhere, in destructors and on threads
// outside catching() too.
class Status {
  public:
    Status() noexcept = default;
    Status(sx_status_t code, std::string message, const char *file, int line) noexcept;

    static Status Ok() noexcept { return Status(); }
    bool ok() const noexcept { return code_ == SX_OK; }
    sx_status_t code() const noexcept { return code_; }
    const std::string &message() const noexcept { return message_ ? *message_ : no_message(); }
    const char *file() const noexcept { return file_; }
    int line() const noexcept { return line_; }

    // Prepends context ("loading unit 3: ") to the message, keeping code and place.
    Status &prefix(const std::string &context) noexcept;

  private:
    static const std::string &no_message() noexcept;
    sx_status_t code_ = SX_OK;
    std::shared_ptr<const std::string> message_;
    const char *file_ = "";
    int line_ = 0;
};

// printf-style formatting into a std::string.
// printf into a std::string; an empty one where no memory is left (it never throws).
std::string format(const char *fmt, ...) noexcept __attribute__((format(printf, 1, 2)));

Status status_of_exception(const std::exception *e, bool out_of_memory);

// Runs fn (returning Status) and returns its Status, or an exception it threw turned
// into one: SX_ERR_OUT_OF_MEMORY for std::bad_alloc, SX_ERR_INTERNAL for anything else.
// For the C entry points and the bodies of threads, where an exception must not go on.
template <typename F>
Status catching(F &&fn) {
    try {
        return fn();
    } catch (const std::bad_alloc &e) {
        return status_of_exception(&e, true);
    } catch (const std::exception &e) {
        return status_of_exception(&e, false);
    } catch (...) {
        return status_of_exception(nullptr, false);
    }
}

}  // namespace sx

// SX_ERROR(SX_ERR_..., "fmt", args...) makes a Status recording file:line.
#define SX_ERROR(code, ...) ::sx::Status((code), ::sx::format(__VA_ARGS__), __FILE__, __LINE__)

// Returns from the enclosing function if `expr` (a Status) is not ok.
#define SX_TRY(expr)                                   \
    do {                                               \
        ::sx::Status sx_try_status_ = (expr);          \
        if (!sx_try_status_.ok()) return sx_try_status_; \
    } while (0)

// Returns SX_ERR_INVALID_ARGUMENT with the message if `cond` is false.
#define SX_CHECK_ARG(cond, ...)                                          \
    do {                                                                 \
        if (!(cond)) return SX_ERROR(SX_ERR_INVALID_ARGUMENT, __VA_ARGS__); \
    } while (0)

// Returns `code` with the message if `cond` is false.
#define SX_CHECK(cond, code, ...)                           \
    do {                                                    \
        if (!(cond)) return SX_ERROR((code), __VA_ARGS__);  \
    } while (0)
