#include "interop/safetensors.h"

#include <algorithm>
#include <cinttypes>

#include "base/half.h"
#include "interop/json.h"
#include "interop/json_value.h"

namespace sx {
namespace interop {

namespace {

// The tensors' dtypes sx reads: its own (fp32), the 16-bit ones, and bytes (torchao's
// 8-bit state's codes, SX_DTYPE_U8).
int32_t dtype_of(const std::string &name) {
    if (name == "F32") return SX_DTYPE_F32;
    if (name == "F16") return SX_DTYPE_F16;
    if (name == "BF16") return SX_DTYPE_BF16;
    if (name == "U8") return SX_DTYPE_U8;
    return 0;
}

// The element size of every other dtype the format defines (safetensors' Dtype), so that
// a file holding them can be read for the tensors sx takes: 0 for a name it does not define.
uint64_t other_dtype_bytes(const std::string &name) {
    static const char *const one[] = {"BOOL", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0"};
    static const char *const two[] = {"I16", "U16"};
    static const char *const four[] = {"I32", "U32"};
    static const char *const eight[] = {"I64", "U64", "F64"};
    for (const char *n : one)
        if (name == n) return 1;
    for (const char *n : two)
        if (name == n) return 2;
    for (const char *n : four)
        if (name == n) return 4;
    for (const char *n : eight)
        if (name == n) return 8;
    return 0;
}

// A header value of the wrong kind is damage to the file, not a wrong argument.
Status as_corrupt(const Status &s) {
    return s.ok() ? s : Status(SX_ERR_CORRUPT, s.message(), s.file(), s.line());
}

// One header entry: {"dtype": ..., "shape": [...], "data_offsets": [begin, end]}.
Status parse_entry(const std::string &name, const JsonValue &v, uint64_t data_bytes, bool any_dtype, StTensor *t) {
    const std::string what = "tensor " + json_quoted(name);
    SX_CHECK(v.is_object(), SX_ERR_CORRUPT, "%s: its entry is %s, not an object", what.c_str(),
             json_kind_name(v.kind));
    for (const auto &m : v.members)
        SX_CHECK(m.first == "dtype" || m.first == "shape" || m.first == "data_offsets", SX_ERR_CORRUPT,
                 "%s: unknown key %s (an entry holds dtype, shape and data_offsets)", what.c_str(),
                 json_quoted(m.first).c_str());
    const JsonValue *dtype = v.find("dtype"), *shape = v.find("shape"), *offsets = v.find("data_offsets");
    SX_CHECK(dtype && shape && offsets, SX_ERR_CORRUPT, "%s: its entry lacks %s", what.c_str(),
             !dtype ? "dtype" : !shape ? "shape" : "data_offsets");
    t->name = name;
    std::string dtype_text;
    SX_TRY(as_corrupt(json_string(*dtype, what + ": dtype", &dtype_text)));
    t->dtype = dtype_of(dtype_text);
    t->dtype_text = dtype_text;
    t->elem_bytes = t->dtype != 0 ? st_dtype_bytes(t->dtype) : any_dtype ? other_dtype_bytes(dtype_text) : 0;
    SX_CHECK(t->elem_bytes != 0, SX_ERR_UNSUPPORTED,
             "%s has dtype %s; sx imports F32, F16 and BF16 tensors, and U8 ones as 8-bit optimizer state's "
             "codes only",
             what.c_str(), json_quoted(dtype_text).c_str());
    SX_CHECK(shape->is_array(), SX_ERR_CORRUPT, "%s: shape is %s, not an array", what.c_str(),
             json_kind_name(shape->kind));
    uint64_t numel = 1;
    for (const JsonValue &e : shape->items) {
        int64_t extent = 0;
        SX_TRY(as_corrupt(json_int64(e, what + ": an extent of its shape", &extent)));
        SX_CHECK(extent >= 0, SX_ERR_CORRUPT, "%s: an extent of its shape is %" PRId64, what.c_str(), extent);
        SX_CHECK(!__builtin_mul_overflow(numel, static_cast<uint64_t>(extent), &numel), SX_ERR_CORRUPT,
                 "%s: its shape has more than 2^64 elements", what.c_str());
        t->shape.push_back(extent);
    }
    SX_CHECK(offsets->is_array() && offsets->items.size() == 2, SX_ERR_CORRUPT,
             "%s: data_offsets is not [begin, end]", what.c_str());
    int64_t begin = 0, end = 0;
    SX_TRY(as_corrupt(json_int64(offsets->items[0], what + ": data_offsets' begin", &begin)));
    SX_TRY(as_corrupt(json_int64(offsets->items[1], what + ": data_offsets' end", &end)));
    SX_CHECK(0 <= begin && begin <= end && static_cast<uint64_t>(end) <= data_bytes, SX_ERR_CORRUPT,
             "%s: data_offsets [%" PRId64 ", %" PRId64 "] lie outside the file's %" PRIu64
             " bytes of data (is the file truncated?)",
             what.c_str(), begin, end, data_bytes);
    t->begin = static_cast<uint64_t>(begin);
    t->end = static_cast<uint64_t>(end);
    uint64_t bytes = 0;
    SX_CHECK(!__builtin_mul_overflow(numel, t->elem_bytes, &bytes) && bytes == t->end - t->begin,
             SX_ERR_CORRUPT, "%s: shape %s of %s needs %" PRIu64 " bytes, data_offsets give %" PRIu64,
             what.c_str(), shape_text(t->shape).c_str(), dtype_text.c_str(), bytes, t->end - t->begin);
    return Status::Ok();
}

Status check_metadata(const JsonValue &v) {
    SX_CHECK(v.is_object(), SX_ERR_CORRUPT, "__metadata__ is %s, not an object", json_kind_name(v.kind));
    for (const auto &m : v.members)
        SX_CHECK(m.second.is_string(), SX_ERR_CORRUPT, "__metadata__: %s is %s, not a string",
                 json_quoted(m.first).c_str(), json_kind_name(m.second.kind));
    return Status::Ok();
}

Status read_header(io::FileOps &ops, int fd, const std::string &path, bool any_dtype, StFile *f) {
    uint64_t size = 0;
    SX_TRY(ops.file_size(fd, &size, path));
    SX_CHECK(size >= 8, SX_ERR_CORRUPT, "the file has %" PRIu64 " bytes, too few for a safetensors header", size);
    unsigned char head[8];
    SX_TRY(ops.pread_all(fd, head, 8, 0, path));
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = n << 8 | head[i];
    SX_CHECK(n <= kMaxSafetensorsHeaderBytes, SX_ERR_CORRUPT,
             "its header length field says %" PRIu64 " bytes, more than safetensors allows (%" PRIu64
             "): not a safetensors file?",
             n, kMaxSafetensorsHeaderBytes);
    SX_CHECK(8 + n <= size, SX_ERR_CORRUPT,
             "its header length field says %" PRIu64 " bytes, but the file has only %" PRIu64
             " after it (truncated?)",
             n, size - 8);
    std::string text(n, '\0');
    SX_TRY(ops.pread_all(fd, &text[0], n, 8, path));
    JsonValue header;
    Status s = parse_json(text, &header);
    if (!s.ok()) return SX_ERROR(SX_ERR_CORRUPT, "its header is not valid JSON: %s", s.message().c_str());
    SX_CHECK(header.is_object(), SX_ERR_CORRUPT, "its header is %s, not a JSON object",
             json_kind_name(header.kind));
    f->data_start = 8 + n;
    const uint64_t data_bytes = size - f->data_start;
    for (const auto &m : header.members) {
        if (m.first == kMetadataKey) {
            SX_TRY(check_metadata(m.second));
            continue;
        }
        StTensor t;
        SX_TRY(parse_entry(m.first, m.second, data_bytes, any_dtype, &t));
        f->tensors.push_back(std::move(t));
    }
    // Back to back from 0 to the end: then no two tensors share bytes, and a file cut
    // short (or with bytes appended) does not pass.
    std::stable_sort(f->tensors.begin(), f->tensors.end(),
                     [](const StTensor &a, const StTensor &b) { return a.begin < b.begin; });
    uint64_t cursor = 0;
    for (const StTensor &t : f->tensors) {
        SX_CHECK(t.begin == cursor, SX_ERR_CORRUPT,
                 "tensor %s begins at data byte %" PRIu64 ", where %" PRIu64
                 " was expected (the tensors' bytes must be back to back)",
                 json_quoted(t.name).c_str(), t.begin, cursor);
        cursor = t.end;
    }
    SX_CHECK(cursor == data_bytes, SX_ERR_CORRUPT,
             "its tensors take %" PRIu64 " bytes of data, but the file holds %" PRIu64 " after the header%s",
             cursor, data_bytes, cursor > data_bytes ? " (truncated?)" : "");
    for (size_t i = 0; i < f->tensors.size(); ++i) f->index.emplace(f->tensors[i].name, i);
    return Status::Ok();
}

}  // namespace

std::string st_dtype_name(int32_t dtype) {
    switch (dtype) {
        case SX_DTYPE_F32: return "F32";
        case SX_DTYPE_F16: return "F16";
        case SX_DTYPE_BF16: return "BF16";
        case SX_DTYPE_U8: return "U8";
        default: return format("dtype %d", dtype);
    }
}

uint64_t st_dtype_bytes(int32_t dtype) {
    return dtype == SX_DTYPE_F32 ? 4 : dtype == SX_DTYPE_F16 || dtype == SX_DTYPE_BF16 ? 2 : 1;
}

std::string shape_text(const std::vector<int64_t> &shape) {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + format("%" PRId64, shape[i]);
    return s + "]";
}

std::string printable(const std::string &s) {
    std::string out;
    for (const char ch : s) {
        const unsigned char c = static_cast<unsigned char>(ch);
        if (c < 0x20 || c == 0x7F)
            out += format("\\x%02x", c);
        else
            out.push_back(ch);
    }
    return out;
}

uint64_t StTensor::numel() const {
    uint64_t n = 1;
    for (int64_t e : shape) n *= static_cast<uint64_t>(e);
    return n;
}

Status safetensors_header(const std::vector<std::pair<std::string, std::string>> &metadata,
                          const std::vector<StTensor> &tensors, std::string *out) {
    JsonWriter j;
    j.begin_object();
    j.key(kMetadataKey);
    j.begin_object();
    for (const auto &m : metadata) j.key(m.first), j.string(m.second);
    j.end_object();
    for (const StTensor &t : tensors) {
        j.key(t.name);
        j.begin_object();
        j.key("dtype"), j.string(t.dtype != 0 ? st_dtype_name(t.dtype) : t.dtype_text);
        j.key("shape");
        j.begin_array();
        for (int64_t e : t.shape) j.number(e);
        j.end_array();
        j.key("data_offsets");
        j.begin_array();
        j.number(t.begin);
        j.number(t.end);
        j.end_array();
        j.end_object();
    }
    j.end_object();
    std::string header = j.text();
    header.append((8 - header.size() % 8) % 8, ' ');
    SX_CHECK(header.size() <= kMaxSafetensorsHeaderBytes, SX_ERR_INVALID_ARGUMENT,
             "the safetensors header would be %zu bytes; safetensors readers refuse headers over %" PRIu64
             " bytes",
             header.size(), kMaxSafetensorsHeaderBytes);
    std::string bytes(8, '\0');
    for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((header.size() >> (8 * i)) & 0xFF);
    *out = bytes + header;
    return Status::Ok();
}

const StTensor *StFile::find(const std::string &name) const {
    const auto it = index.find(name);
    return it == index.end() ? nullptr : &tensors[it->second];
}

Status read_safetensors(io::FileOps &ops, const std::string &path, StFile *out, bool any_dtype) {
    int fd = -1;
    SX_TRY(ops.open_read_named(path, &fd));
    StFile f;
    f.path = path;
    Status s = read_header(ops, fd, path, any_dtype, &f);
    ops.close(fd, path);
    if (!s.ok()) return s.prefix(printable(path) + ": ");
    *out = std::move(f);
    return Status::Ok();
}

Status read_raw(io::FileOps &ops, int fd, const StFile &file, const StTensor &t, uint64_t first, uint64_t n,
                void *dst) {
    const uint64_t elem = t.elem_bytes;
    Status s = ops.pread_all(fd, dst, n * elem, file.data_start + t.begin + first * elem, file.path);
    if (s.code() == SX_ERR_CORRUPT)
        return SX_ERROR(SX_ERR_CORRUPT, "%s: the file ends inside tensor %s (did it change while it was read?)",
                        printable(file.path).c_str(), json_quoted(t.name).c_str());
    return s;
}

Status read_f32(io::FileOps &ops, int fd, const StFile &file, const StTensor &t, uint64_t first, uint64_t n,
                float *dst, std::vector<char> *scratch) {
    SX_CHECK(t.dtype == SX_DTYPE_F32 || t.dtype == SX_DTYPE_F16 || t.dtype == SX_DTYPE_BF16, SX_ERR_INVALID_ARGUMENT,
             "%s: tensor %s holds %s values; sx reads F32, F16 and BF16 tensors as numbers",
             printable(file.path).c_str(), json_quoted(t.name).c_str(), t.dtype_text.c_str());
    if (t.dtype == SX_DTYPE_F32) return read_raw(ops, fd, file, t, first, n, dst);
    scratch->resize(n * t.elem_bytes);
    SX_TRY(read_raw(ops, fd, file, t, first, n, scratch->data()));
    half::to_f32(t.dtype, reinterpret_cast<const uint16_t *>(scratch->data()), dst, n);
    return Status::Ok();
}

}  // namespace interop
}  // namespace sx
