// The names (resolve_keys), and HfReader: a Hugging Face checkpoint or a PEFT adapter
// opened, checked and matched to the group's params before any value moves (hf_files.h).
#include <algorithm>
#include <cstdlib>
#include <unordered_map>
#include <unordered_set>

#include "interop/hf_files.h"
#include "interop/json.h"
#include "interop/json_value.h"

namespace sx {
namespace interop {

namespace {

// "'a', 'b', 'c' and 7 more": at most `shown` names of a list, for messages.
template <typename T, typename F>
std::string listed(const std::vector<T> &items, F text, size_t shown = 20) {
    std::string out;
    for (size_t i = 0; i < items.size() && i < shown; ++i) out += (i ? ", " : "") + text(items[i]);
    if (items.size() > shown) out += format(" and %zu more", items.size() - shown);
    return out;
}

bool ends_with(const std::string &s, const char *suffix) {
    const std::string t(suffix);
    return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
}

std::string dir_of(const std::string &path) {
    const size_t slash = path.find_last_of('/');
    return slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

Status resolve_keys(const std::vector<ParamEntry> &params, const NameMap &map, std::vector<std::string> *keys) {
    std::unordered_map<std::string, size_t> index;
    for (size_t p = 0; p < params.size(); ++p) index.emplace(params[p].name, p);
    std::vector<std::string> out(params.size());
    std::vector<uint8_t> named(params.size(), 0);
    for (const auto &pair : map.pairs) {
        const auto it = index.find(pair.first);
        SX_CHECK_ARG(it != index.end(), "the name map names %s, which is no param of the group",
                     json_quoted(pair.first).c_str());
        SX_CHECK_ARG(!named[it->second], "the name map names param %s twice", json_quoted(pair.first).c_str());
        SX_CHECK_ARG(!pair.second.empty(), "the name map gives param %s an empty name",
                     json_quoted(pair.first).c_str());
        named[it->second] = 1;
        out[it->second] = pair.second;
    }
    std::unordered_map<std::string, size_t> taken;
    bool any = false;
    for (size_t p = 0; p < params.size(); ++p) {
        if (!named[p]) out[p] = map.only_named ? std::string() : params[p].name;
        if (out[p].empty()) continue;
        any = true;
        const auto ins = taken.emplace(out[p], p);
        SX_CHECK_ARG(ins.second, "params %s and %s both take the name %s", json_quoted(params[ins.first->second].name).c_str(),
                     json_quoted(params[p].name).c_str(), json_quoted(out[p]).c_str());
    }
    SX_CHECK_ARG(any, "no param takes part: the name map names none%s", map.only_named ? " (only_named is set)" : "");
    *keys = std::move(out);
    return Status::Ok();
}

std::string encode_report(const KeyReport &r) {
    std::string out = 'l' + std::to_string(r.loaded) + '\0';
    for (const auto &m : r.missing) out += 'm' + m.first + '\0' + m.second + '\0';
    for (const std::string &u : r.unexpected) out += 'u' + u + '\0';
    return out;
}

KeyReport decode_report(const std::string &bytes) {
    KeyReport r;
    size_t at = 0;
    const auto next = [&]() {
        const size_t end = std::min(bytes.find('\0', at), bytes.size());
        std::string s = bytes.substr(at, end - at);
        at = end + 1;
        return s;
    };
    while (at < bytes.size()) {
        const char kind = bytes[at++];
        if (kind == 'l') {
            r.loaded = static_cast<int32_t>(std::strtol(next().c_str(), nullptr, 10));
        } else if (kind == 'm') {
            std::string name = next();
            r.missing.emplace_back(name, next());
        } else {
            r.unexpected.push_back(next());
        }
    }
    return r;
}

HfReader::~HfReader() {
    for (size_t f = 0; f < fds_.size(); ++f)
        if (fds_[f] >= 0) ops_.close(fds_[f], files_[f].path);
}

// An index: {"metadata": {...}, "weight_map": {key: file name in the index's directory}}.
Status HfReader::open_index(const std::string &path) {
    std::string text;
    SX_TRY(io::read_file(ops_, path, 256u << 20, &text, true));
    JsonValue index;
    Status s = parse_json(text, &index);
    SX_CHECK(s.ok(), SX_ERR_CORRUPT, "%s is not valid JSON: %s", printable(path).c_str(), s.message().c_str());
    const JsonValue *map = index.find("weight_map");
    SX_CHECK(map && map->is_object(), SX_ERR_CORRUPT, "%s has no \"weight_map\" object", printable(path).c_str());
    std::unordered_map<std::string, size_t> file_of_name;
    std::vector<std::pair<std::string, std::string>> entries;
    for (const auto &m : map->members) {
        SX_CHECK(m.second.is_string(), SX_ERR_CORRUPT, "%s: weight_map's %s is not a file name",
                 printable(path).c_str(), json_quoted(m.first).c_str());
        const std::string &file = m.second.text;
        // A file beside the index, never elsewhere.
        SX_CHECK(!file.empty() && file.find('/') == std::string::npos && file != "." && file != "..", SX_ERR_CORRUPT,
                 "%s: weight_map's %s names %s, not a file beside the index", printable(path).c_str(),
                 json_quoted(m.first).c_str(), json_quoted(file).c_str());
        if (file_of_name.emplace(file, files_.size()).second) {
            StFile f;
            SX_TRY(read_safetensors(ops_, dir_of(path) + "/" + file, &f, true));
            files_.push_back(std::move(f));
        }
        entries.emplace_back(m.first, file);
    }
    for (const auto &e : entries) {
        const size_t f = file_of_name[e.second];
        const StTensor *t = files_[f].find(e.first);
        SX_CHECK(t != nullptr, SX_ERR_CORRUPT, "%s: weight_map puts %s in %s, which does not hold it",
                 printable(path).c_str(), json_quoted(e.first).c_str(), json_quoted(e.second).c_str());
        keys_.push_back({e.first, Key{f, t}});
    }
    return Status::Ok();
}

Status HfReader::open_files(const std::string &path) {
    bool is_dir = false;
    SX_TRY(ops_.is_directory(path, &is_dir));
    std::string file = path;
    if (is_dir) {
        file.clear();
        for (const char *name : {kModelIndex, kAdapterFile, kModelFile}) {
            bool there = false;
            SX_TRY(ops_.exists(path + "/" + name, &there));
            if (there) {
                file = path + "/" + name;
                break;
            }
        }
        SX_CHECK(!file.empty(), SX_ERR_NOT_FOUND, "%s holds none of %s, %s and %s", printable(path).c_str(),
                 kModelIndex, kAdapterFile, kModelFile);
    }
    if (ends_with(file, ".json")) SX_TRY(open_index(file));
    else {
        StFile f;
        SX_TRY(read_safetensors(ops_, file, &f, true));
        files_.push_back(std::move(f));
        for (const StTensor &t : files_[0].tensors) keys_.push_back({t.name, Key{0, &t}});
    }
    fds_.assign(files_.size(), -1);
    return Status::Ok();
}

Status HfReader::check_tensor(const ParamEntry &param, const std::string &key, const Key &k) const {
    const StTensor &t = *k.tensor;
    const std::string where = format("param %s (key %s in %s)", json_quoted(param.name).c_str(),
                                     json_quoted(key).c_str(), printable(files_[k.file].path).c_str());
    SX_CHECK(t.dtype == SX_DTYPE_F32 || t.dtype == SX_DTYPE_F16 || t.dtype == SX_DTYPE_BF16, SX_ERR_UNSUPPORTED,
             "%s: the tensor is %s; sx imports F32, F16 and BF16 tensors", where.c_str(), t.dtype_text.c_str());
    SX_CHECK_ARG(t.shape == param.shape, "%s: the tensor's shape is %s, the param's %s", where.c_str(),
                 shape_text(t.shape).c_str(), shape_text(param.shape).c_str());
    return Status::Ok();
}

Status HfReader::plan(const std::string &path, const std::vector<ParamEntry> &params,
                      const std::vector<std::string> &keys, bool allow_missing, bool allow_unexpected,
                      std::vector<uint8_t> *selected, KeyReport *report) {
    SX_TRY(open_files(path));
    std::unordered_map<std::string, size_t> key_index;
    for (size_t i = 0; i < keys_.size(); ++i) key_index.emplace(keys_[i].first, i);
    std::vector<uint8_t> used(keys_.size(), 0);
    selected->assign(params.size(), 0);
    of_param_.assign(params.size(), Key());
    *report = KeyReport();
    for (size_t p = 0; p < params.size(); ++p) {
        if (keys[p].empty()) continue;
        const auto it = key_index.find(keys[p]);
        if (it == key_index.end()) {
            report->missing.emplace_back(params[p].name, keys[p]);
            continue;
        }
        SX_TRY(check_tensor(params[p], keys[p], keys_[it->second].second));
        used[it->second] = 1;
        (*selected)[p] = 1;
        ++report->loaded;
        of_param_[p] = keys_[it->second].second;
    }
    for (size_t i = 0; i < keys_.size(); ++i)
        if (!used[i]) report->unexpected.push_back(keys_[i].first);
    const std::string missing = listed(report->missing, [](const std::pair<std::string, std::string> &m) {
        return m.first == m.second ? json_quoted(m.first) : json_quoted(m.first) + " (key " + json_quoted(m.second) + ")";
    });
    const std::string unexpected = listed(report->unexpected, [](const std::string &k) { return json_quoted(k); });
    const bool miss = !report->missing.empty() && !allow_missing;
    const bool extra = !report->unexpected.empty() && !allow_unexpected;
    SX_CHECK(!miss, SX_ERR_NOT_FOUND, "%s has no tensor for %zu param%s: %s%s%s", printable(path).c_str(),
             report->missing.size(), report->missing.size() == 1 ? "" : "s", missing.c_str(),
             extra ? format("; and %zu of its tensors match no param: %s", report->unexpected.size(),
                            unexpected.c_str()).c_str()
                   : "",
             " (allow_missing takes what is there)");
    SX_CHECK_ARG(!extra, "%zu tensor%s of %s match no param: %s (a name map pair names a param's key; "
                 "allow_unexpected leaves them)",
                 report->unexpected.size(), report->unexpected.size() == 1 ? "" : "s", printable(path).c_str(),
                 unexpected.c_str());
    return Status::Ok();
}

Status HfReader::read(int32_t p, float *values, uint64_t n) {
    const Key &k = of_param_[static_cast<size_t>(p)];
    SX_CHECK(k.tensor != nullptr && k.tensor->numel() == n, SX_ERR_INTERNAL, "param %d was not planned", p);
    int &fd = fds_[k.file];
    if (fd < 0) SX_TRY(ops_.open_read_named(files_[k.file].path, &fd));
    constexpr uint64_t kPiece = 1u << 20;  // elements per read: memory stays bounded
    for (uint64_t i = 0; i < n; i += kPiece)
        SX_TRY(read_f32(ops_, fd, files_[k.file], *k.tensor, i, std::min(kPiece, n - i), values + i, &scratch_));
    return Status::Ok();
}

}  // namespace interop
}  // namespace sx
