#include "base/trace.h"

#include <fcntl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <system_error>

namespace sx {
namespace trace {
namespace {

int64_t clock_ns(clockid_t id) {
    timespec t;
    clock_gettime(id, &t);
    return static_cast<int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec;
}

// CLOCK_REALTIME - CLOCK_MONOTONIC, taken once per process (see now_ns()).
int64_t realtime_offset() {
    static const int64_t offset = clock_ns(CLOCK_REALTIME) - clock_ns(CLOCK_MONOTONIC);
    return offset;
}

struct ThisThread {
    int32_t tid = static_cast<int32_t>(syscall(SYS_gettid));
    std::string name;
};

ThisThread &this_thread() {
    thread_local ThisThread t;
    return t;
}

void append_escaped(std::string *out, const std::string &s) {
    out->push_back('"');
    for (unsigned char c : s) {
        if (c == '"' || c == '\\') {
            out->push_back('\\');
            out->push_back(static_cast<char>(c));
        } else if (c < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\u%04x", c);
            out->append(buf);
        } else {
            out->push_back(static_cast<char>(c));
        }
    }
    out->push_back('"');
}

// Whole microseconds since the Unix epoch (what the format counts in). Both ends of a span
// are truncated alike, so that spans nested or disjoint in nanoseconds stay so: a parser
// reads these as doubles, exact for integers up to 2^53, where nanosecond decimals of
// today's epoch times would be rounded to a quarter of a microsecond, ends and starts
// independently, and could make a nested span stick out of its parent.
int64_t whole_us(int64_t ns) { return ns >= 0 ? ns / 1000 : -((-ns + 999) / 1000); }

std::string errno_text(int e) { return std::error_code(e, std::generic_category()).message(); }

}  // namespace

int64_t now_ns() { return clock_ns(CLOCK_MONOTONIC) + realtime_offset(); }

void name_this_thread(const std::string &name) { this_thread().name = name; }

std::string rank_path(const std::string &templ, int rank) {
    const std::string r = std::to_string(rank);
    std::string out;
    bool substituted = false;
    for (size_t i = 0; i < templ.size(); ++i) {
        if (templ[i] == '%' && i + 1 < templ.size() && templ[i + 1] == 'r') {
            out += r;
            ++i;
            substituted = true;
        } else {
            out.push_back(templ[i]);
        }
    }
    if (substituted) return out;
    const std::string ext = ".json";
    if (out.size() > ext.size() && out.compare(out.size() - ext.size(), ext.size(), ext) == 0)
        return out.substr(0, out.size() - ext.size()) + ".rank" + r + ext;
    return out + ".rank" + r + ext;
}

Tracer::Tracer(std::string path, int rank, int world_size, size_t capacity)
    : path_(std::move(path)), rank_(rank), world_size_(world_size), capacity_(capacity) {
    realtime_offset();  // taken now, before the first span
}

void Tracer::record(const char *cat, const char *name, int64_t begin_ns, int64_t end_ns, int64_t unit,
                    uint64_t bytes, const char *detail) {
    ThisThread &me = this_thread();
    std::lock_guard<std::mutex> lock(mu_);
    Event *e;
    if (ring_.size() < capacity_) {
        ring_.emplace_back();
        e = &ring_.back();
    } else {
        e = &ring_[next_];
        next_ = (next_ + 1) % capacity_;
    }
    e->cat = cat;
    e->name = name;
    e->begin_ns = begin_ns;
    e->end_ns = end_ns;
    e->tid = me.tid;
    e->unit = unit;
    e->bytes = bytes;
    if (detail) {
        e->detail = detail;
    } else {
        e->detail.clear();
    }
    ++recorded_;
    for (const Thread &t : threads_)
        if (t.tid == me.tid) return;
    threads_.push_back({me.tid, me.name.empty() ? "caller" : me.name});
}

uint64_t Tracer::recorded() const {
    std::lock_guard<std::mutex> lock(mu_);
    return recorded_;
}

uint64_t Tracer::dropped() const {
    std::lock_guard<std::mutex> lock(mu_);
    return recorded_ - ring_.size();
}

std::string Tracer::to_json(const std::vector<Event> &events, const std::vector<Thread> &threads,
                            uint64_t dropped) const {
    std::string out;
    out.reserve(160 * (events.size() + threads.size() + 4));
    const std::string pid = std::to_string(rank_);
    out += "{\"displayTimeUnit\":\"ms\",\n\"otherData\":{\"producer\":\"sx\",\"sx_version\":\"";
    out += std::to_string(SX_VERSION_MAJOR) + "." + std::to_string(SX_VERSION_MINOR) + "." +
           std::to_string(SX_VERSION_PATCH);
    out += "\",\"rank\":" + pid + ",\"world_size\":" + std::to_string(world_size_) +
           ",\"clock\":\"microseconds since the Unix epoch (CLOCK_MONOTONIC shifted to CLOCK_REALTIME at "
           "process start)\"" +
           ",\"capacity\":" + std::to_string(capacity_) + ",\"events\":" + std::to_string(events.size()) +
           ",\"dropped_events\":" + std::to_string(dropped) + "},\n\"traceEvents\":[\n";
    // Metadata first: the rank as a process (sorted by rank), its threads' names, and
    // what the ring dropped, where Perfetto shows it (the process's labels).
    out += "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":" + pid + ",\"tid\":0,\"args\":{\"name\":\"sx rank " +
           pid + " of " + std::to_string(world_size_) + "\"}},\n";
    out += "{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":" + pid + ",\"tid\":0,\"args\":{\"sort_index\":" +
           pid + "}},\n";
    out += "{\"ph\":\"M\",\"name\":\"process_labels\",\"pid\":" + pid + ",\"tid\":0,\"args\":{\"labels\":\"" +
           (dropped ? std::to_string(dropped) + " older events dropped (ring of " + std::to_string(capacity_) + ")"
                    : std::string("no events dropped")) +
           "\"}}";
    for (const Thread &t : threads) {
        out += ",\n{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":" + pid + ",\"tid\":" + std::to_string(t.tid) +
               ",\"args\":{\"name\":";
        append_escaped(&out, t.name);
        out += "}}";
    }
    for (const Event &e : events) {
        out += ",\n{\"ph\":\"X\",\"cat\":\"";
        out += e.cat;
        out += "\",\"name\":\"";
        out += e.name;
        out += "\",\"pid\":" + pid + ",\"tid\":" + std::to_string(e.tid) +
               ",\"ts\":" + std::to_string(whole_us(e.begin_ns)) +
               ",\"dur\":" + std::to_string(whole_us(e.end_ns) - whole_us(e.begin_ns));
        out += ",\"args\":{";
        bool first = true;
        auto sep = [&] {
            if (!first) out.push_back(',');
            first = false;
        };
        if (e.unit != kNoUnit) {
            sep();
            out += "\"unit\":" + std::to_string(e.unit);
        }
        if (e.bytes != kNoBytes) {
            sep();
            out += "\"bytes\":" + std::to_string(e.bytes);
        }
        if (!e.detail.empty()) {
            sep();
            out += "\"detail\":";
            append_escaped(&out, e.detail);
        }
        out += "}}";
    }
    out += "\n]}\n";
    return out;
}

Status Tracer::flush() {
    std::vector<Event> events;
    std::vector<Thread> threads;
    uint64_t dropped;
    {
        std::lock_guard<std::mutex> lock(mu_);
        events.reserve(ring_.size());
        // Oldest first: from next_ once the ring has wrapped.
        for (size_t i = 0; i < ring_.size(); ++i) events.push_back(ring_[(next_ + i) % ring_.size()]);
        threads = threads_;
        dropped = recorded_ - ring_.size();
    }
    const std::string text = to_json(events, threads, dropped);
    const std::string tmp = path_ + ".partial";
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return SX_ERROR(SX_ERR_IO, "writing the trace %s: cannot create %s: %s", path_.c_str(), tmp.c_str(),
                        errno_text(errno).c_str());
    size_t done = 0;
    int err = 0;
    while (done < text.size()) {
        const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            err = n < 0 ? errno : EIO;
            break;
        }
        done += static_cast<size_t>(n);
    }
    if (::close(fd) != 0 && err == 0) err = errno;
    if (err == 0 && ::rename(tmp.c_str(), path_.c_str()) != 0) err = errno;
    if (err != 0) {
        ::unlink(tmp.c_str());
        return SX_ERROR(SX_ERR_IO, "writing the trace %s: %s", path_.c_str(), errno_text(err).c_str());
    }
    return Status::Ok();
}

}  // namespace trace
}  // namespace sx
