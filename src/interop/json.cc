#include "interop/json.h"

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "interop/json_value.h"

namespace sx {
namespace interop {

size_t utf8_sequence(const std::string &s, size_t i) {
    const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
    const unsigned char c = byte(i);
    size_t n;
    unsigned char lo = 0x80, hi = 0xBF;  // the range of the second byte
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) n = 2;
    else if (c >= 0xE0 && c <= 0xEF) n = 3, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    else if (c >= 0xF0 && c <= 0xF4) n = 4, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    else return 0;
    if (i + n > s.size() || byte(i + 1) < lo || byte(i + 1) > hi) return 0;
    for (size_t k = 2; k < n; ++k)
        if ((byte(i + k) & 0xC0) != 0x80) return 0;
    return n;
}

void append_json_string(std::string *out, const std::string &s) {
    out->push_back('"');
    for (size_t i = 0; i < s.size();) {
        const unsigned char c = static_cast<unsigned char>(s[i]);
        const size_t n = utf8_sequence(s, i);
        if (n == 0) {
            *out += "\\ufffd";  // not UTF-8, which JSON text must be
            ++i;
            continue;
        }
        if (n > 1) {
            out->append(s, i, n);
            i += n;
            continue;
        }
        switch (c) {
            case '"': *out += "\\\""; break;
            case '\\': *out += "\\\\"; break;
            case '\b': *out += "\\b"; break;
            case '\f': *out += "\\f"; break;
            case '\n': *out += "\\n"; break;
            case '\r': *out += "\\r"; break;
            case '\t': *out += "\\t"; break;
            default:
                if (c < 0x20) {
                    char buf[8];
                    std::snprintf(buf, sizeof buf, "\\u%04x", c);
                    *out += buf;
                } else {
                    out->push_back(static_cast<char>(c));
                }
        }
        ++i;
    }
    out->push_back('"');
}

std::string json_quoted(const std::string &s) {
    std::string out;
    append_json_string(&out, s);
    return out;
}

std::string shortest_double(double v) {
    if (std::isnan(v)) return "nan";
    if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
    // 17 significant digits always read back exactly (IEEE 754 binary64); fewer
    // usually do, and read better.
    char buf[40];
    for (int precision = 1; precision <= 17; ++precision) {
        std::snprintf(buf, sizeof buf, "%.*g", precision, v);
        if (std::strtod(buf, nullptr) == v) break;
    }
    return buf;
}

void JsonWriter::before_value() {
    if (after_key_) {
        after_key_ = false;
        return;
    }
    if (!first_.empty()) {
        if (!first_.back()) out_.push_back(',');
        first_.back() = false;
    }
}

void JsonWriter::begin_object() {
    before_value();
    out_.push_back('{');
    first_.push_back(true);
}

void JsonWriter::end_object() {
    out_.push_back('}');
    first_.pop_back();
}

void JsonWriter::begin_array() {
    before_value();
    out_.push_back('[');
    first_.push_back(true);
}

void JsonWriter::end_array() {
    out_.push_back(']');
    first_.pop_back();
}

void JsonWriter::key(const std::string &k) {
    before_value();
    append_json_string(&out_, k);
    out_.push_back(':');
    after_key_ = true;
}

void JsonWriter::string(const std::string &s) {
    before_value();
    append_json_string(&out_, s);
}

void JsonWriter::number(uint64_t v) {
    before_value();
    char buf[24];
    std::snprintf(buf, sizeof buf, "%" PRIu64, v);
    out_ += buf;
}

void JsonWriter::number(int64_t v) {
    before_value();
    char buf[24];
    std::snprintf(buf, sizeof buf, "%" PRId64, v);
    out_ += buf;
}

void JsonWriter::number(double v) {
    if (!std::isfinite(v)) return null();
    before_value();
    out_ += shortest_double(v);
}

void JsonWriter::boolean(bool v) {
    before_value();
    out_ += v ? "true" : "false";
}

void JsonWriter::raw_number(const std::string &text) {
    before_value();
    out_ += text;
}

void JsonWriter::value_of(const JsonValue &v) {
    switch (v.kind) {
        case JsonValue::Kind::kNull: return null();
        case JsonValue::Kind::kBool: return boolean(v.boolean);
        case JsonValue::Kind::kNumber: return raw_number(v.text);
        case JsonValue::Kind::kString: return string(v.text);
        case JsonValue::Kind::kArray:
            begin_array();
            for (const JsonValue &item : v.items) value_of(item);
            return end_array();
        case JsonValue::Kind::kObject:
            begin_object();
            for (const auto &m : v.members) key(m.first), value_of(m.second);
            return end_object();
    }
}

void JsonWriter::null() {
    before_value();
    out_ += "null";
}

}  // namespace interop
}  // namespace sx
