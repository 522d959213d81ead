// The param table of a shard group, a part of it: the param groups and params the trainer
// registered (name, shape, dtype, param group, unit; each param's step counts), the
// groups' hyperparameters, the trainer's trainable flags and those the last step applied,
// and how much of the table sx_finalize laid out. Registration is local (every rank
// registers the same; sx_finalize compares).
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "core/params.h"
#include "optim/optimizer.h"

namespace sx {
namespace core {

class ParamTable {
  public:
    // --- registration (sx_add_param_group, sx_add_param; see sx.h) ---
    Status add_group(const optim::Hyper &hyper, int32_t *index);
    // After sx_finalize, a param goes in a new unit, with an id above every laid-out one.
    Status add_param(const char *name, int32_t ndim, const int64_t *shape, int32_t dtype, int32_t group,
                     int32_t unit, bool frozen, int32_t *index, const Placement &placement = Placement());
    Status get_hyperparameter(int32_t group, int32_t key, double *value) const;
    Status check_group(int32_t group) const;  // exists (SX_ERR_INVALID_ARGUMENT otherwise)

    // --- params ---
    int32_t num_params() const { return static_cast<int32_t>(params_.size()); }
    int32_t num_groups() const { return static_cast<int32_t>(groups_.size()); }
    Status check_param(int32_t param) const;  // in range (SX_ERR_INVALID_ARGUMENT otherwise)
    Status find(const char *name, int32_t *index) const;
    // The param exists and is laid out (SX_ERR_INVALID_STATE naming it otherwise).
    Status check_laid_out(int32_t param) const;

    // --- trainability: the trainer's flags (may be written through mask()) ---
    Status set_trainable(int32_t param, bool trainable);
    bool trainable(int32_t param) const { return mask_[param] != 0; }
    uint8_t *mask() { return mask_.data(); }
    const std::vector<uint8_t> &flags() const { return mask_; }

    // --- what sx_finalize laid out ---
    bool finalized() const { return finalized_; }
    // Params or param groups were added after sx_finalize and wait for the next one.
    bool pending() const {
        return finalized_ && (params_.size() > laid_out_params_ || groups_.size() > laid_out_groups_);
    }
    size_t pending_params() const { return params_.size() - laid_out_params_; }
    size_t pending_groups() const { return groups_.size() - laid_out_groups_; }
    // sx_finalize laid out everything registered, units up to id `last_unit`.
    void laid_out(int32_t last_unit);
    void set_finalized(bool finalized) { finalized_ = finalized; }

    // The group's access to the table (its layout, its step and its checkpoints).
    std::deque<ParamSpec> &params() { return params_; }
    const std::deque<ParamSpec> &params() const { return params_; }
    std::vector<ParamGroup> &groups() { return groups_; }
    const std::vector<ParamGroup> &groups() const { return groups_; }
    std::vector<uint8_t> &applied() { return applied_; }  // per param: what the last step used
    const std::vector<uint8_t> &applied() const { return applied_; }

  private:
    std::vector<ParamGroup> groups_;
    std::deque<ParamSpec> params_;  // a deque: names handed out stay where they are as params are added
    std::unordered_map<std::string, int32_t> by_name_;
    std::vector<uint8_t> mask_;     // the trainer's (may be written through a pointer)
    std::vector<uint8_t> applied_;  // what the last step used
    bool finalized_ = false;
    size_t laid_out_params_ = 0, laid_out_groups_ = 0;  // by the last finalize
    int32_t last_unit_ = -1;  // the largest unit id laid out
};

}  // namespace core
}  // namespace sx
