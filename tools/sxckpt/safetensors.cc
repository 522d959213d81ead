#include "safetensors.h"

#include <cinttypes>

#include "checkpoint_dir.h"
#include "json.h"

namespace sx {
namespace tool {

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
        j.key("dtype"), j.string(dtype_name(t.dtype));
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

}  // namespace tool
}  // namespace sx
