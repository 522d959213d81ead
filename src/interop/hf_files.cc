// HfWriter: a Hugging Face checkpoint or a PEFT adapter, written into a temporary
// directory and renamed into place (hf_files.h).
#include "interop/hf_files.h"

#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <map>

#include "base/half.h"
#include "interop/json.h"

namespace sx {
namespace interop {

namespace {

std::string parent_of(const std::string &dir) {
    const size_t slash = dir.find_last_of('/');
    if (slash == std::string::npos) return ".";
    return slash == 0 ? "/" : dir.substr(0, slash);
}

}  // namespace

uint64_t ParamEntry::numel() const {
    uint64_t n = 1;
    for (int64_t e : shape) n *= static_cast<uint64_t>(e);
    return n;
}

HfWriter::~HfWriter() {
    if (fd_ >= 0) ops_.close(fd_, tmp_);
    if (!tmp_.empty() && !committed_) ops_.remove_tree(tmp_);
}

Status HfWriter::plan(const std::string &dir, const std::vector<ParamEntry> &params,
                      const std::vector<std::string> &keys, int32_t dtype, uint64_t max_shard_bytes,
                      const std::string &peft_config) {
    std::string target = dir;
    while (target.size() > 1 && target.back() == '/') target.pop_back();
    SX_CHECK_ARG(!target.empty(), "the directory is an empty path");
    bool exists = false, parent_is_dir = false;
    SX_TRY(ops_.exists(target, &exists));
    SX_CHECK(!exists, SX_ERR_ALREADY_EXISTS, "%s exists already; sx writes a new directory (remove it, or name another)",
             printable(target).c_str());
    SX_TRY(ops_.is_directory(parent_of(target), &parent_is_dir));
    SX_CHECK(parent_is_dir, SX_ERR_NOT_FOUND, "%s: its parent directory %s does not exist", printable(target).c_str(),
             printable(parent_of(target)).c_str());
    dir_ = target;
    dtype_ = dtype;
    peft_config_ = peft_config;
    const uint64_t elem = st_dtype_bytes(dtype);
    const uint64_t limit = max_shard_bytes ? max_shard_bytes : kDefaultMaxShardBytes;
    // transformers' sharding: tensors in order, a new file where the next would pass the
    // limit (a tensor larger than the limit has a file of its own).
    std::vector<std::vector<int32_t>> groups;
    uint64_t in_group = 0;
    planned_.assign(params.size(), Planned());
    taking_.assign(params.size(), 0);
    for (size_t p = 0; p < params.size(); ++p) {
        if (keys[p].empty()) continue;
        taking_[p] = 1;
        const uint64_t bytes = params[p].numel() * elem;
        if (groups.empty() || (peft_config.empty() && in_group > 0 && in_group + bytes > limit)) {
            groups.emplace_back();
            in_group = 0;
        }
        groups.back().push_back(static_cast<int32_t>(p));
        in_group += bytes;
    }
    for (size_t f = 0; f < groups.size(); ++f) {
        File file;
        file.name = !peft_config.empty() ? kAdapterFile
                    : groups.size() == 1 ? kModelFile
                                         : format("model-%05zu-of-%05zu.safetensors", f + 1, groups.size());
        uint64_t at = 0;
        for (int32_t p : groups[f]) {
            Planned &pl = planned_[static_cast<size_t>(p)];
            pl.file = f;
            pl.tensor.name = keys[static_cast<size_t>(p)];
            pl.tensor.dtype = dtype;
            pl.tensor.shape = params[static_cast<size_t>(p)].shape;
            pl.tensor.begin = at;
            at += params[static_cast<size_t>(p)].numel() * elem;
            pl.tensor.end = at;
            file.last_param = p;
        }
        files_.push_back(file);
    }
    tmp_ = format("%s.sx-partial-%ld", target.c_str(), static_cast<long>(::getpid()));
    bool stale = false;
    SX_TRY(ops_.exists(tmp_, &stale));
    if (stale) SX_TRY(ops_.remove_tree(tmp_));  // a crashed export of this process id
    Status s = ops_.mkdir(tmp_);
    if (!s.ok()) tmp_.clear();
    return s;
}

Status HfWriter::open_file(size_t f) {
    std::vector<StTensor> tensors;
    for (size_t p = 0; p < planned_.size(); ++p)
        if (taking_[p] && planned_[p].file == f) tensors.push_back(planned_[p].tensor);
    std::string header;
    SX_TRY(safetensors_header({{"format", "pt"}}, tensors, &header));
    const std::string path = tmp_ + "/" + files_[f].name;
    SX_TRY(ops_.open_write(path, &fd_));
    open_ = f;
    files_[f].data_start = header.size();
    return ops_.pwrite_all(fd_, header.data(), header.size(), 0, path);
}

Status HfWriter::close_file() {
    const std::string path = tmp_ + "/" + files_[open_].name;
    Status s = ops_.fsync(fd_, path);
    Status c = ops_.close(fd_, path);
    fd_ = -1;
    return s.ok() ? c : s;
}

Status HfWriter::write(int32_t p, const float *values, uint64_t n) {
    const Planned &pl = planned_[static_cast<size_t>(p)];
    SX_CHECK(taking_[static_cast<size_t>(p)] && n == pl.tensor.numel(), SX_ERR_INTERNAL,
             "param %d was not planned with %" PRIu64 " elements", p, n);
    if (fd_ < 0 || open_ != pl.file) {
        if (fd_ >= 0) SX_TRY(close_file());
        SX_TRY(open_file(pl.file));
    }
    const std::string path = tmp_ + "/" + files_[pl.file].name;
    const uint64_t at = files_[pl.file].data_start + pl.tensor.begin;
    if (dtype_ == SX_DTYPE_F32) {
        SX_TRY(ops_.pwrite_all(fd_, values, n * sizeof(float), at, path));
    } else {
        // 16-bit: converted in pieces of 1 Mi elements, so memory stays bounded.
        constexpr uint64_t kPiece = 1u << 20;
        half_.resize(std::min<uint64_t>(n, kPiece));
        for (uint64_t i = 0; i < n; i += kPiece) {
            const uint64_t k = std::min(kPiece, n - i);
            half::from_f32(dtype_, values + i, half_.data(), k);
            SX_TRY(ops_.pwrite_all(fd_, half_.data(), k * 2, at + i * 2, path));
        }
    }
    if (p == files_[pl.file].last_param) SX_TRY(close_file());
    return Status::Ok();
}

Status HfWriter::write_small(const std::string &name, const std::string &text) {
    const std::string path = tmp_ + "/" + name;
    int fd = -1;
    SX_TRY(ops_.open_write(path, &fd));
    Status s = ops_.pwrite_all(fd, text.data(), text.size(), 0, path);
    if (s.ok()) s = ops_.fsync(fd, path);
    Status c = ops_.close(fd, path);
    return s.ok() ? c : s;
}

Status HfWriter::commit() {
    if (fd_ >= 0) SX_TRY(close_file());
    for (size_t f = 0; f < files_.size(); ++f)  // a file whose tensors are all empty (none written yet)
        if (files_[f].data_start == 0) {
            SX_TRY(open_file(f));
            SX_TRY(close_file());
        }
    if (!peft_config_.empty()) SX_TRY(write_small(kAdapterConfig, peft_config_));
    if (peft_config_.empty() && files_.size() > 1) {
        uint64_t total = 0;
        std::map<std::string, std::string> weight_map;  // sorted by key, as transformers writes it
        for (size_t p = 0; p < planned_.size(); ++p) {
            if (!taking_[p]) continue;
            total += planned_[p].tensor.end - planned_[p].tensor.begin;
            weight_map[planned_[p].tensor.name] = files_[planned_[p].file].name;
        }
        JsonWriter j;
        j.begin_object();
        j.key("metadata"), j.begin_object(), j.key("total_size"), j.number(total), j.end_object();
        j.key("weight_map"), j.begin_object();
        for (const auto &m : weight_map) j.key(m.first), j.string(m.second);
        j.end_object();
        j.end_object();
        SX_TRY(write_small(kModelIndex, j.text() + "\n"));
    }
    SX_TRY(ops_.fsync_dir(tmp_));
    SX_TRY(ops_.rename(tmp_, dir_));
    committed_ = true;
    return ops_.fsync_dir(parent_of(dir_));
}

}  // namespace interop
}  // namespace sx
