#include "interop/json_value.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <unordered_set>

#include "interop/json.h"

namespace sx {
namespace interop {

namespace {

constexpr int kMaxDepth = 64;

class Parser {
  public:
    explicit Parser(const std::string &text) : s_(text) {}

    Status document(JsonValue *out) {
        space();
        SX_TRY(value(out, 0));
        space();
        SX_CHECK(at_ == s_.size(), SX_ERR_INVALID_ARGUMENT, "JSON: unexpected %s at byte %zu after the value",
                 what_is_here().c_str(), at_);
        return Status::Ok();
    }

  private:
    void space() {
        while (at_ < s_.size() && (s_[at_] == ' ' || s_[at_] == '\t' || s_[at_] == '\n' || s_[at_] == '\r')) ++at_;
    }

    bool at(char c) const { return at_ < s_.size() && s_[at_] == c; }

    std::string what_is_here() const {
        if (at_ >= s_.size()) return "end of text";
        const unsigned char c = static_cast<unsigned char>(s_[at_]);
        return c >= 0x20 && c < 0x7F ? format("'%c'", c) : format("byte 0x%02x", c);
    }

    Status expected(const char *what) const {
        return SX_ERROR(SX_ERR_INVALID_ARGUMENT, "JSON: expected %s at byte %zu, found %s", what, at_,
                        what_is_here().c_str());
    }

    bool literal(const char *word) {
        const std::string w(word);
        if (s_.compare(at_, w.size(), w) != 0) return false;
        at_ += w.size();
        return true;
    }

    Status value(JsonValue *v, int depth) {
        v->offset = at_;
        if (at_ >= s_.size()) return expected("a value");
        const char c = s_[at_];
        if (c == '{' || c == '[') {
            SX_CHECK(depth < kMaxDepth, SX_ERR_INVALID_ARGUMENT, "JSON: nested deeper than %d at byte %zu",
                     kMaxDepth, at_);
            return c == '{' ? object(v, depth + 1) : array(v, depth + 1);
        }
        if (c == '"') {
            v->kind = JsonValue::Kind::kString;
            return string(&v->text);
        }
        if (c == '-' || (c >= '0' && c <= '9')) return number(v);
        if (literal("true") || literal("false")) {
            v->kind = JsonValue::Kind::kBool;
            v->boolean = c == 't';
            return Status::Ok();
        }
        if (literal("null")) {
            v->kind = JsonValue::Kind::kNull;
            return Status::Ok();
        }
        return expected("a value");
    }

    // A container's elements up to `close`, each read by element(), comma-separated;
    // at_ is on the opening bracket.
    template <typename Element>
    Status elements(char close, Element element) {
        ++at_;
        space();
        if (!at(close)) {
            for (;;) {
                SX_TRY(element());
                space();
                if (!at(',')) break;
                ++at_;
                space();
            }
        }
        if (!at(close)) return expected(close == '}' ? "',' or '}'" : "',' or ']'");
        ++at_;
        return Status::Ok();
    }

    Status object(JsonValue *v, int depth) {
        v->kind = JsonValue::Kind::kObject;
        std::unordered_set<std::string> keys;
        return elements('}', [&]() -> Status {
            if (!at('"')) return expected("a key (a string)");
            const size_t key_at = at_;
            std::string key;
            SX_TRY(string(&key));
            SX_CHECK(keys.insert(key).second, SX_ERR_INVALID_ARGUMENT,
                     "JSON: the key %s at byte %zu is already in its object", json_quoted(key).c_str(), key_at);
            space();
            if (!at(':')) return expected("':'");
            ++at_;
            space();
            v->members.emplace_back(std::move(key), JsonValue());
            return value(&v->members.back().second, depth);
        });
    }

    Status array(JsonValue *v, int depth) {
        v->kind = JsonValue::Kind::kArray;
        return elements(']', [&]() -> Status {
            v->items.emplace_back();
            return value(&v->items.back(), depth);
        });
    }

    // RFC 8259's grammar: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
    Status number(JsonValue *v) {
        const size_t begin = at_;
        const auto digits = [&] {
            const size_t from = at_;
            while (at_ < s_.size() && s_[at_] >= '0' && s_[at_] <= '9') ++at_;
            return at_ > from;
        };
        if (s_[at_] == '-') ++at_;
        if (at('0')) {
            ++at_;
        } else if (!digits()) {
            return expected("a digit");
        }
        if (at('.')) {
            ++at_;
            if (!digits()) return expected("a digit after '.'");
        }
        if (at('e') || at('E')) {
            ++at_;
            if (at('+') || at('-')) ++at_;
            if (!digits()) return expected("a digit in the exponent");
        }
        v->kind = JsonValue::Kind::kNumber;
        v->text = s_.substr(begin, at_ - begin);
        return Status::Ok();
    }

    Status hex4(uint32_t *out) {
        uint32_t v = 0;
        for (int i = 0; i < 4; ++i, ++at_) {
            if (at_ >= s_.size()) return expected("4 hex digits after \\u");
            const char c = s_[at_];
            const int d = c >= '0' && c <= '9' ? c - '0'
                          : c >= 'a' && c <= 'f' ? c - 'a' + 10
                          : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                                 : -1;
            if (d < 0) return expected("4 hex digits after \\u");
            v = v << 4 | static_cast<uint32_t>(d);
        }
        *out = v;
        return Status::Ok();
    }

    static void append_utf8(uint32_t cp, std::string *out) {
        if (cp < 0x80) {
            out->push_back(static_cast<char>(cp));
        } else if (cp < 0x800) {
            out->push_back(static_cast<char>(0xC0 | cp >> 6));
            out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
        } else if (cp < 0x10000) {
            out->push_back(static_cast<char>(0xE0 | cp >> 12));
            out->push_back(static_cast<char>(0x80 | (cp >> 6 & 0x3F)));
            out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
        } else {
            out->push_back(static_cast<char>(0xF0 | cp >> 18));
            out->push_back(static_cast<char>(0x80 | (cp >> 12 & 0x3F)));
            out->push_back(static_cast<char>(0x80 | (cp >> 6 & 0x3F)));
            out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
        }
    }

    Status escape(std::string *out) {
        const size_t begin = at_ - 1;  // the backslash
        if (at_ >= s_.size()) return expected("an escape");
        const char c = s_[at_++];
        switch (c) {
            case '"': case '\\': case '/': out->push_back(c); return Status::Ok();
            case 'b': out->push_back('\b'); return Status::Ok();
            case 'f': out->push_back('\f'); return Status::Ok();
            case 'n': out->push_back('\n'); return Status::Ok();
            case 'r': out->push_back('\r'); return Status::Ok();
            case 't': out->push_back('\t'); return Status::Ok();
            case 'u': break;
            default: --at_; return expected("an escape (one of \"\\/bfnrtu)");
        }
        uint32_t cp = 0;
        SX_TRY(hex4(&cp));
        if (cp >= 0xD800 && cp <= 0xDBFF) {
            uint32_t low = 0;
            SX_CHECK(s_.compare(at_, 2, "\\u") == 0, SX_ERR_INVALID_ARGUMENT,
                     "JSON: the escape at byte %zu is half of a surrogate pair", begin);
            at_ += 2;
            SX_TRY(hex4(&low));
            SX_CHECK(low >= 0xDC00 && low <= 0xDFFF, SX_ERR_INVALID_ARGUMENT,
                     "JSON: the escape at byte %zu is half of a surrogate pair", begin);
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
        } else {
            SX_CHECK(cp < 0xDC00 || cp > 0xDFFF, SX_ERR_INVALID_ARGUMENT,
                     "JSON: the escape at byte %zu is half of a surrogate pair", begin);
        }
        append_utf8(cp, out);
        return Status::Ok();
    }

    Status string(std::string *out) {
        ++at_;  // the opening quote
        out->clear();
        for (;;) {
            if (at_ >= s_.size()) return expected("the string's closing '\"'");
            const unsigned char c = static_cast<unsigned char>(s_[at_]);
            if (c == '"') {
                ++at_;
                return Status::Ok();
            }
            if (c == '\\') {
                ++at_;
                SX_TRY(escape(out));
                continue;
            }
            SX_CHECK(c >= 0x20, SX_ERR_INVALID_ARGUMENT,
                     "JSON: control byte 0x%02x at byte %zu inside a string (it must be escaped)", c, at_);
            const size_t n = utf8_sequence(s_, at_);
            SX_CHECK(n > 0, SX_ERR_INVALID_ARGUMENT, "JSON: byte %zu is not valid UTF-8", at_);
            out->append(s_, at_, n);
            at_ += n;
        }
    }

    const std::string &s_;
    size_t at_ = 0;
};

}  // namespace

const JsonValue *JsonValue::find(const std::string &key) const {
    for (const auto &m : members)
        if (m.first == key) return &m.second;
    return nullptr;
}

const char *json_kind_name(JsonValue::Kind kind) {
    switch (kind) {
        case JsonValue::Kind::kNull: return "null";
        case JsonValue::Kind::kBool: return "a boolean";
        case JsonValue::Kind::kNumber: return "a number";
        case JsonValue::Kind::kString: return "a string";
        case JsonValue::Kind::kArray: return "an array";
        case JsonValue::Kind::kObject: return "an object";
    }
    return "?";
}

Status parse_json(const std::string &text, JsonValue *out) {
    JsonValue v;
    SX_TRY(Parser(text).document(&v));
    *out = std::move(v);
    return Status::Ok();
}

Status json_expect(const JsonValue &v, JsonValue::Kind kind, const std::string &what) {
    SX_CHECK(v.kind == kind, SX_ERR_INVALID_ARGUMENT, "%s is %s, not %s", what.c_str(), json_kind_name(v.kind),
             json_kind_name(kind));
    return Status::Ok();
}

Status json_int64(const JsonValue &v, const std::string &what, int64_t *out) {
    SX_TRY(json_expect(v, JsonValue::Kind::kNumber, what));
    SX_CHECK(v.text.find_first_of(".eE") == std::string::npos, SX_ERR_INVALID_ARGUMENT,
             "%s is %s; it must be an integer", what.c_str(), v.text.c_str());
    errno = 0;
    const long long n = std::strtoll(v.text.c_str(), nullptr, 10);
    SX_CHECK(errno == 0, SX_ERR_INVALID_ARGUMENT, "%s is %s, outside the range of a 64-bit integer", what.c_str(),
             v.text.c_str());
    *out = static_cast<int64_t>(n);
    return Status::Ok();
}

Status json_double(const JsonValue &v, const std::string &what, double *out) {
    SX_TRY(json_expect(v, JsonValue::Kind::kNumber, what));
    const double d = std::strtod(v.text.c_str(), nullptr);
    SX_CHECK(std::isfinite(d), SX_ERR_INVALID_ARGUMENT, "%s is %s, too large for a double", what.c_str(),
             v.text.c_str());
    *out = d;
    return Status::Ok();
}

Status json_bool(const JsonValue &v, const std::string &what, bool *out) {
    SX_TRY(json_expect(v, JsonValue::Kind::kBool, what));
    *out = v.boolean;
    return Status::Ok();
}

Status json_string(const JsonValue &v, const std::string &what, std::string *out) {
    SX_TRY(json_expect(v, JsonValue::Kind::kString, what));
    *out = v.text;
    return Status::Ok();
}

}  // namespace interop
}  // namespace sx
