// JSON text (RFC 8259) for safetensors headers, Hugging Face and PEFT files, and
// `sxckpt inspect --json`: strings
// escaped, numbers that read back exactly, commas placed by the writer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace sx {
namespace interop {

struct JsonValue;  // json_value.h

// Length of the valid UTF-8 sequence at s[i] (RFC 3629: no overlong forms, no
// surrogates, nothing above U+10FFFF), or 0 if the bytes there are not one. i < s.size().
size_t utf8_sequence(const std::string &s, size_t i);

// Appends s as a quoted JSON string. '"', '\\' and the control characters U+0000..U+001F
// are escaped (\" \\ \b \f \n \r \t, else \u00XX); valid UTF-8 is copied as it is.
// A byte that is not part of valid UTF-8 becomes \ufffd, so the text is always valid
// JSON; that never happens to a param name (sx_add_param and the MANIFEST's decoder
// accept only UTF-8), only to odd paths.
void append_json_string(std::string *out, const std::string &s);
// s as a quoted JSON string (append_json_string's), for messages about JSON text.
std::string json_quoted(const std::string &s);

// The shortest decimal text that reads back (strtod) as exactly v: 0.01, not
// 0.010000000000000000208. Infinities and NaN are "inf", "-inf", "nan".
std::string shortest_double(double v);

// Builds one compact JSON value. Calls must nest properly (begin/end pairs, a key
// before every value inside an object); the writer inserts the commas.
class JsonWriter {
  public:
    void begin_object();
    void end_object();
    void begin_array();
    void end_array();
    void key(const std::string &k);
    void string(const std::string &s);
    void number(uint64_t v);
    void number(int64_t v);
    void number(int32_t v) { number(static_cast<int64_t>(v)); }
    void number(uint32_t v) { number(static_cast<uint64_t>(v)); }
    // A finite double as shortest_double writes it; null for infinities and NaN,
    // which JSON cannot represent.
    void number(double v);
    void boolean(bool v);
    // A hyperparameter's value: a number, or a flag as true/false.
    void value(double v) { number(v); }
    void value(bool v) { boolean(v); }
    void null();
    // A number exactly as `text` spells it (a JSON number parse_json kept as written).
    void raw_number(const std::string &text);
    // A parsed value as it was (numbers as written, members in order).
    void value_of(const JsonValue &v);

    const std::string &text() const { return out_; }

  private:
    void before_value();
    std::string out_;
    std::vector<bool> first_;  // per open container: no member written yet
    bool after_key_ = false;
};

}  // namespace interop
}  // namespace sx
