// The agreement part (agreement.h): call headers, their facts in words, and the
// explanation of a disagreement.
#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "core/agreement.h"
#include "optim/custom.h"

namespace sx {
namespace core {
namespace {

// The bytes of one rank's fact in the exchange that explains a disagreement.
constexpr size_t kFactBytes = 512;
// Ranks named in an explanation, per value; the rest are counted.
constexpr size_t kRanksNamed = 8;

const char *dtype_text(int32_t dtype) {
    return dtype == SX_DTYPE_F32 ? "fp32" : dtype == SX_DTYPE_F16 ? "fp16" : dtype == SX_DTYPE_BF16 ? "bf16" : "0";
}

// The shortest of %.15g and %.17g that reads back as v.
std::string number_text(double v) {
    std::string s = format("%.15g", v);
    return std::strtod(s.c_str(), nullptr) == v ? s : format("%.17g", v);
}

// The units whose byte is set, as "{0, 3}".
std::string unit_set_text(const std::vector<uint8_t> &bytes) {
    std::string s = "{";
    bool first = true;
    for (size_t u = 0; u < bytes.size(); ++u) {
        if (!bytes[u]) continue;
        s += (first ? "" : ", ") + std::to_string(u);
        first = false;
    }
    return s + "}";
}

uint64_t fact_hash(const Fact &f) {
    uint64_t h = fnv1a(f.what.data(), f.what.size());
    h = fnv1a("", 1, h);
    return fnv1a(f.value.data(), f.value.size(), h);
}

// "ranks 0, 2" / "rank 1" / "ranks 0, 1, ... (12 ranks)".
std::string rank_list(const std::vector<int> &ranks) {
    std::string s = ranks.size() == 1 ? "rank " : "ranks ";
    for (size_t i = 0; i < ranks.size() && i < kRanksNamed; ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
    if (ranks.size() > kRanksNamed) s += format(", ... (%zu ranks)", ranks.size());
    return s;
}

// A custom optimizer's own hyperparameters' values in param group g (those the fixed
// members do not hold).
void custom_hyper_facts(const optim::Hyper &h, size_t g, std::vector<Fact> *f) {
    const optim::CustomOptimizer *c =
        optim::is_custom(h.kind) ? optim::find_custom(static_cast<int32_t>(h.kind)) : nullptr;
    if (!c) return;
    for (const optim::CustomHyper &ch : c->hypers)
        if (ch.key >= SX_HP_CUSTOM)
            f->push_back({format("param group %zu %s", g, ch.name.c_str()), number_text(optim::hyper_value(h, ch.key))});
}

// What a custom optimizer was registered with on this rank (its name alone says nothing:
// each process registers its own): slots, their initial values, hyperparameters with
// their defaults and ranges, whether it updates in place.
void custom_optimizer_facts(const optim::CustomOptimizer &c, std::vector<Fact> *f) {
    const std::string who = "custom optimizer '" + c.name + "'";
    std::string slots;
    for (size_t k = 0; k < c.slot_names.size(); ++k) slots += (k ? ", " : "") + ("'" + c.slot_names[k] + "'");
    f->push_back({who + " slots", slots.empty() ? "none" : slots});
    for (size_t k = 0; k < c.slot_names.size(); ++k)
        f->push_back({who + " slot '" + c.slot_names[k] + "' initial value", number_text(c.initial[k])});
    std::string names;
    for (size_t i = 0; i < c.hypers.size(); ++i) names += (i ? ", " : "") + ("'" + c.hypers[i].name + "'");
    f->push_back({who + " hyperparameters", names.empty() ? "none" : names});
    for (const optim::CustomHyper &h : c.hypers) {
        f->push_back({who + " hyperparameter '" + h.name + "' default", number_text(h.dflt)});
        f->push_back({who + " hyperparameter '" + h.name + "' range",
                      h.min == 0.0 && h.max == 0.0 ? "any finite value"
                                                   : "[" + number_text(h.min) + ", " + number_text(h.max) + "]"});
    }
    f->push_back({who + " updates in place", c.in_place ? "yes" : "no"});
}

}  // namespace

uint64_t agreement_fingerprint(const Agreement &a) {
    uint64_t h = fnv1a(a.call, std::strlen(a.call));
    h = fnv1a(a.mask.data(), a.mask.size(), h);
    for (const optim::Hyper &hyper : a.hypers) h = hyper_fingerprint(hyper, h);
    h = fnv1a(&a.max_grad_norm, sizeof a.max_grad_norm, h);
    const double scaling[5] = {static_cast<double>(a.loss_scaling_mode), a.loss_scale, a.growth_factor,
                               a.backoff_factor, static_cast<double>(a.growth_interval)};
    h = fnv1a(scaling, sizeof scaling, h);
    h = fnv1a(&a.micro_batches, sizeof a.micro_batches, h);
    h = fnv1a(a.signalled.data(), a.signalled.size(), h);
    h = fnv1a(&a.defer_gather, sizeof a.defer_gather, h);
    h = fnv1a(a.gathered.data(), a.gathered.size(), h);
    const uint8_t weighted = a.weighted ? 1 : 0;
    h = fnv1a(&weighted, 1, h);
    return fnv1a(&a.nonfinite, sizeof a.nonfinite, h);
}

std::vector<Fact> agreement_facts(const Agreement &a, const std::deque<ParamSpec> &params) {
    std::vector<Fact> f;
    f.push_back({"the call", a.call});
    for (size_t p = 0; p < a.mask.size() && p < params.size(); ++p)
        f.push_back({"param '" + params[p].name + "' trainable", a.mask[p] ? "yes" : "no"});
    for (size_t g = 0; g < a.hypers.size(); ++g) {
        const optim::Hyper &h = a.hypers[g];
        f.push_back({format("param group %zu optimizer", g), optim::optimizer_name(h.kind)});
#define SX_HYPER_FACT(name, type, dflt, key, applies) \
    f.push_back({format("param group %zu %s", g, #name), number_text(static_cast<double>(h.name))});
        SX_HYPERPARAMETERS(SX_HYPER_FACT)
#undef SX_HYPER_FACT
        custom_hyper_facts(h, g, &f);
    }
    f.push_back({"max_grad_norm", number_text(a.max_grad_norm)});
    f.push_back({"loss scaling mode", std::to_string(a.loss_scaling_mode)});
    f.push_back({"loss scale", number_text(a.loss_scale)});
    f.push_back({"loss scaling growth_factor", number_text(a.growth_factor)});
    f.push_back({"loss scaling backoff_factor", number_text(a.backoff_factor)});
    f.push_back({"loss scaling growth_interval", std::to_string(a.growth_interval)});
    f.push_back({"sx_accumulate_grads calls since the last step", std::to_string(a.micro_batches)});
    if (!a.signalled.empty()) f.push_back({"the units signalled ready", unit_set_text(a.signalled)});
    if (a.defer_gather >= 0) f.push_back({"defer_gather", std::to_string(a.defer_gather)});
    if (!a.gathered.empty()) f.push_back({"the units gathered (stage 3)", unit_set_text(a.gathered)});
    f.push_back({"weighted", a.weighted ? "1" : "0"});
    if (a.nonfinite >= 0) f.push_back({"nonfinite", std::to_string(a.nonfinite)});
    return f;
}

std::vector<Fact> table_facts(const TableSettings &settings, const std::vector<optim::Hyper> &groups,
                              const std::deque<ParamSpec> &params, const std::vector<uint8_t> &mask) {
    std::vector<Fact> f;
    f.push_back({"stage", std::to_string(settings.stage)});
    f.push_back({"grad_dtype", std::to_string(settings.grad_dtype)});
    f.push_back({"reduce_dtype", std::to_string(settings.reduce_dtype)});
    f.push_back({"grad_predivide_factor", number_text(settings.grad_predivide_factor)});
    f.push_back({"the number of param groups", std::to_string(groups.size())});
    std::vector<int32_t> described;  // the custom optimizers whose registration is stated
    for (size_t g = 0; g < groups.size(); ++g) {
        const optim::Hyper &h = groups[g];
        f.push_back({format("param group %zu optimizer", g), optim::optimizer_name(h.kind)});
        const int32_t id = static_cast<int32_t>(h.kind);
        const optim::CustomOptimizer *c = optim::is_custom(h.kind) ? optim::find_custom(id) : nullptr;
        if (c && std::find(described.begin(), described.end(), id) == described.end()) {
            described.push_back(id);
            custom_optimizer_facts(*c, &f);
        }
        custom_hyper_facts(h, g, &f);
    }
    f.push_back({"the number of params", std::to_string(params.size())});
    for (size_t i = 0; i < params.size(); ++i) {
        const ParamSpec &p = params[i];
        const std::string name = "param '" + p.name + "'";
        f.push_back({format("param %zu name", i), "'" + p.name + "'"});
        f.push_back({name + " shape", shape_text(p.shape)});
        f.push_back({name + " dtype", dtype_text(p.dtype)});
        f.push_back({name + " param group", std::to_string(p.group)});
        f.push_back({name + " unit", std::to_string(p.unit)});
        f.push_back({name + " frozen", mask[i] ? "no" : "yes"});
        f.push_back({name + " placement", placement_text(p.placement)});
    }
    return f;
}

uint64_t facts_fingerprint(const std::vector<Fact> &facts) {
    uint64_t h = fnv1a("facts", 5);
    for (const Fact &f : facts) {
        const uint64_t fh = fact_hash(f);
        h = fnv1a(&fh, sizeof fh, h);
    }
    return h;
}

Status CallHeaders::explain(const char *intro, const std::vector<Fact> &mine, comm::Communicator &c) const {
    const size_t W = static_cast<size_t>(c.world_size());
    const size_t me = static_cast<size_t>(c.rank());
    // c's ranks are a run of the world's (the world, or a mesh's shard group): named as
    // the world's.
    const int first_rank = world_rank_ - c.rank();
    // How many facts each rank has, and each fact's hash up to the fewest.
    std::vector<uint64_t> counts(W, 0);
    counts[me] = mine.size();
    Status s = c.all_gather(counts.data(), sizeof(uint64_t));
    if (!s.ok()) return fail_(s);
    const size_t common = static_cast<size_t>(*std::min_element(counts.begin(), counts.end()));
    size_t first = common;  // the first fact that differs (common: the lists differ in length)
    if (common > 0) {
        std::vector<uint64_t> hashes(W * common, 0);
        for (size_t i = 0; i < common; ++i) hashes[me * common + i] = fact_hash(mine[i]);
        s = c.all_gather(hashes.data(), common * sizeof(uint64_t));
        if (!s.ok()) return fail_(s);
        for (size_t i = 0; i < common && first == common; ++i)
            for (size_t r = 1; r < W; ++r)
                if (hashes[r * common + i] != hashes[i]) {
                    first = i;
                    break;
                }
    }
    // Every rank's words for that fact ("(none)" where its list has ended).
    std::vector<char> text(W * kFactBytes, 0);
    const std::string what = first < mine.size() ? mine[first].what : "";
    const std::string value = first < mine.size() ? mine[first].value : "(none)";
    std::snprintf(text.data() + me * kFactBytes, kFactBytes, "%.300s%c%s", what.c_str(), '\0', value.c_str());
    text[me * kFactBytes + kFactBytes - 1] = '\0';
    s = c.all_gather(text.data(), kFactBytes);
    if (!s.ok()) return fail_(s);
    std::vector<std::string> whats(W), values(W);
    for (size_t r = 0; r < W; ++r) {
        const char *t = text.data() + r * kFactBytes;
        whats[r].assign(t, strnlen(t, kFactBytes - 1));
        const size_t at = whats[r].size() + 1;
        if (at < kFactBytes) values[r].assign(t + at, strnlen(t + at, kFactBytes - at));
    }
    std::string named;
    for (size_t r = 0; r < W && named.empty(); ++r) named = whats[r];
    if (first == common && named.empty()) named = "the number of facts compared";
    // Ranks grouped by value, in the order of their first rank.
    std::vector<std::pair<std::string, std::vector<int>>> groups;
    for (size_t r = 0; r < W; ++r) {
        auto it = std::find_if(groups.begin(), groups.end(), [&](const auto &g) { return g.first == values[r]; });
        if (it == groups.end()) {
            groups.push_back({values[r], {first_rank + static_cast<int>(r)}});
        } else {
            it->second.push_back(first_rank + static_cast<int>(r));
        }
    }
    std::string detail;
    for (size_t k = 0; k < groups.size() && k < kRanksNamed; ++k)
        detail += (k ? ", " : "") + groups[k].first + " on " + rank_list(groups[k].second);
    if (groups.size() > kRanksNamed) detail += format(" (and %zu other values)", groups.size() - kRanksNamed);
    return SX_ERROR(SX_ERR_MISMATCH, "%s: %s: %s", intro, named.c_str(), detail.c_str());
}

Status CallHeaders::exchange(comm::Communicator &c, const char *call, CallHeader mine, const FactsFn &facts,
                             std::vector<CallHeader> *all, const char *intro) const {
    mine.call = fnv1a(call, std::strlen(call));
    if (c.world_size() == 1) {  // nothing to compare
        if (all) all->assign(1, mine);
        return Status::Ok();
    }
    // The first collective of a call: a rank that arrives early waits here for its peers.
    SX_TRACE_SPAN(tracer_, "step", "agreement");
    static_assert(sizeof(CallHeader) == 5 * sizeof(uint64_t), "a header is five words");
    const size_t W = static_cast<size_t>(c.world_size());
    std::vector<CallHeader> headers(W);
    headers[static_cast<size_t>(c.rank())] = mine;
    Status s = c.all_gather(headers.data(), sizeof(CallHeader));
    // A peer whose agreement rides on a collective of its call (Stepper::reduce_agreeing)
    // meets this exchange in another call: the transport turns both back, nothing moved,
    // and that peer comes here next.
    if (s.code() == SX_ERR_MISMATCH) {
        headers.assign(W, CallHeader());
        headers[static_cast<size_t>(c.rank())] = mine;
        s = c.all_gather(headers.data(), sizeof(CallHeader));
    }
    if (!s.ok()) return fail_(s);
    // Another call first (whatever else differs follows from it), then a rank's refusal,
    // then any other difference.
    for (const CallHeader &h : headers)
        if (h.call != mine.call) return explain(intro, facts(), c);
    for (size_t r = 0; r < W; ++r)
        if (headers[r].refused != 0 && mine.refused == 0)
            return SX_ERROR(headers[r].refused, "%s failed on rank %zu before anything changed (%s; see that rank's "
                            "error)", call, r, sx_status_string(headers[r].refused));
    if (mine.refused != 0) return SX_ERROR(mine.refused, "refused");  // the caller returns its own error
    for (const CallHeader &h : headers)
        if (h.fingerprint != mine.fingerprint) return explain(intro, facts(), c);
    if (all) *all = std::move(headers);
    return Status::Ok();
}

}  // namespace core
}  // namespace sx
