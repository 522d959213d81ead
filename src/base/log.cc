#include "base/log.h"

#include "base/vector_state.h"

#include <pthread.h>

#include <atomic>
#include <cctype>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace sx {
namespace {

struct LogSink {
    std::mutex mu;
    sx_log_fn fn = nullptr;
    void *user = nullptr;
    // SX_LOG_LEVEL's sink: stderr, until a program sets (or clears) a callback. The
    // library prints only here, because the user asked for it without code, as
    // NCCL_DEBUG does; otherwise it never prints (docs/conventions.md, "The C ABI", 7).
    bool to_stderr = false;
    std::atomic<int> max_level{0};
    // A bad SX_LOG_LEVEL's complaint, until a sink takes it (log() or set_log_callback()).
    std::string pending;
    std::atomic<bool> has_pending{false};
};

const char *level_name(int level) {
    switch (level) {
        case SX_LOG_ERROR: return "ERROR";
        case SX_LOG_WARN: return "WARN";
        case SX_LOG_INFO: return "INFO";
        default: return "DEBUG";
    }
}

void read_environment(LogSink &s) {
    const char *v = std::getenv("SX_LOG_LEVEL");
    if (v == nullptr) return;
    int level = 0;
    std::string error;
    if (parse_log_level(v, &level, &error)) {
        s.to_stderr = level > 0;
        s.max_level.store(level);
        return;
    }
    // Not ignored in silence: the complaint goes to the first sink there is, and stderr
    // carries errors meanwhile (the user asked for messages).
    s.to_stderr = true;
    s.max_level.store(SX_LOG_ERROR);
    s.pending = error;
    s.has_pending.store(true);
}

LogSink &sink() {
    static LogSink s;
    static std::once_flag once;
    std::call_once(once, [] {
        read_environment(s);
        // A fork copies only its caller's thread: the sink's lock, held by another thread
        // at that moment, would never be released in the child (as handles.cc's).
        ::pthread_atfork([] { s.mu.lock(); }, [] { s.mu.unlock(); }, [] { s.mu.unlock(); });
    });
    return s;
}

// Hands `message` to the current sink, whatever its level.
void emit(LogSink &s, int level, const char *message) {
    sx_log_fn fn;
    void *user;
    bool to_stderr;
    {
        std::lock_guard<std::mutex> lock(s.mu);
        fn = s.fn;
        user = s.user;
        to_stderr = s.to_stderr;
    }
    if (fn) {
        leave_vector_state_clean();  // the trainer's callback runs on clean registers
        fn(level, message, user);
    } else if (to_stderr) {
        std::fprintf(stderr, "[sx %s] %s\n", level_name(level), message);
    }
}

void deliver_pending(LogSink &s) {
    if (!s.has_pending.load(std::memory_order_acquire) || !s.has_pending.exchange(false)) return;
    emit(s, SX_LOG_ERROR, s.pending.c_str());
}

}  // namespace

bool parse_log_level(const char *text, int *level, std::string *error) {
    std::string v = text ? text : "";
    const size_t b = v.find_first_not_of(" \t\r\n"), e = v.find_last_not_of(" \t\r\n");
    v = b == std::string::npos ? "" : v.substr(b, e - b + 1);
    std::string upper;
    for (char c : v) upper.push_back(static_cast<char>(std::toupper(static_cast<unsigned char>(c))));
    static const struct {
        const char *name;
        int level;
    } kNames[] = {{"OFF", 0},    {"NONE", 0},          {"ERROR", SX_LOG_ERROR}, {"WARN", SX_LOG_WARN},
                  {"WARNING", SX_LOG_WARN}, {"INFO", SX_LOG_INFO}, {"DEBUG", SX_LOG_DEBUG}, {"TRACE", SX_LOG_DEBUG},
                  {"0", 0},      {"1", SX_LOG_ERROR},  {"2", SX_LOG_WARN},      {"3", SX_LOG_INFO},
                  {"4", SX_LOG_DEBUG}};
    for (const auto &n : kNames)
        if (upper == n.name) {
            *level = n.level;
            return true;
        }
    *error = "SX_LOG_LEVEL='" + std::string(text ? text : "") +
             "' is not a log level: expected OFF, ERROR, WARN, INFO, DEBUG or TRACE (in any case) or a number "
             "0-4; only errors are logged";
    return false;
}

void set_log_callback(sx_log_fn fn, void *user, int max_level) {
    LogSink &s = sink();
    {
        std::lock_guard<std::mutex> lock(s.mu);
        s.fn = fn;
        s.user = user;
        s.to_stderr = false;  // the program's choice replaces SX_LOG_LEVEL's
        s.max_level.store(fn ? max_level : 0, std::memory_order_release);
    }
    deliver_pending(s);
}

bool log_enabled(int level) { return level <= sink().max_level.load(std::memory_order_acquire); }

void log(int level, const char *fmt, ...) {
    LogSink &s = sink();
    deliver_pending(s);
    if (!log_enabled(level)) return;
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    emit(s, level, buf);
}

}  // namespace sx
