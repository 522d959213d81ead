// What a trace file (sx_group_config_t.trace_path, docs/tracing.md) says of its spans, read
// as text: the tests and bench_sx that count a step's exchanges from it.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

namespace sxtest {

// The sum of the "bytes" args of the spans named `name` in the trace file at `path`; -1
// where it cannot be read.
inline double span_bytes(const std::string &path, const char *name) {
    FILE *f = std::fopen(path.c_str(), "r");
    if (!f) return -1.0;
    std::string text;
    char buf[65536];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) text.append(buf, n);
    std::fclose(f);
    const std::string key = std::string("\"name\":\"") + name + "\"";
    double bytes = 0.0;
    for (size_t at = text.find(key); at != std::string::npos; at = text.find(key, at + 1)) {
        const size_t b = text.find("\"bytes\":", at), end = text.find('}', at);
        if (b != std::string::npos && b < end) bytes += std::atof(text.c_str() + b + 8);
    }
    return bytes;
}

}  // namespace sxtest
