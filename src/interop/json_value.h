// Reading JSON (RFC 8259): a safetensors header, a Hugging Face checkpoint's index, and
// `sxckpt import`'s optimizer JSON of docs/format.md. A small strict parser of its own
// rather than a library: libsx takes no new dependency for it, and what it reads needs things a general library
// does not all give: numbers kept as their text (so that a double reads back exactly,
// through strtod, and an integer past 2^53 exactly, as an integer), duplicate keys
// refused rather than one silently dropped, and errors that give the byte offset.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"

namespace sx {
namespace interop {

struct JsonValue {
    enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };
    Kind kind = Kind::kNull;
    bool boolean = false;
    std::string text;  // a string's value (UTF-8), or a number as written
    std::vector<JsonValue> items;                             // an array's
    std::vector<std::pair<std::string, JsonValue>> members;   // an object's, in order, keys unique
    size_t offset = 0;  // where the value begins in the text, for messages

    bool is_object() const { return kind == Kind::kObject; }
    bool is_array() const { return kind == Kind::kArray; }
    bool is_string() const { return kind == Kind::kString; }
    // The member named `key`, or nullptr (also when this is not an object).
    const JsonValue *find(const std::string &key) const;
};

// "an object", "a number", ... for messages.
const char *json_kind_name(JsonValue::Kind kind);

// Parses `text`, which must hold exactly one JSON value (whitespace around it allowed).
// Strings must be valid UTF-8; \u escapes (surrogate pairs included) become UTF-8;
// containers nest at most 64 deep; an object may not repeat a key. Errors:
// SX_ERR_INVALID_ARGUMENT saying what is wrong and at which byte offset.
Status parse_json(const std::string &text, JsonValue *out);

// Conversions of a value, each failing (SX_ERR_INVALID_ARGUMENT) with "WHAT is ..., not
// ..." when the value is not of its kind. as_int64 takes integers only (no fraction, no
// exponent) in [INT64_MIN, INT64_MAX]; as_double any number, read as strtod reads it
// (exactly, for the shortest text of a double), and finite.
Status json_int64(const JsonValue &v, const std::string &what, int64_t *out);
Status json_double(const JsonValue &v, const std::string &what, double *out);
Status json_bool(const JsonValue &v, const std::string &what, bool *out);
Status json_string(const JsonValue &v, const std::string &what, std::string *out);
// v must be of `kind`.
Status json_expect(const JsonValue &v, JsonValue::Kind kind, const std::string &what);

}  // namespace interop
}  // namespace sx
