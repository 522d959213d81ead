// The param table part (param_table.h).
#include "core/param_table.h"

namespace sx {
namespace core {

Status ParamTable::add_group(const optim::Hyper &hyper, int32_t *index) {
    SX_TRY(optim::validate(hyper));
    ParamGroup g;
    g.hyper = hyper;
    groups_.push_back(g);
    if (index) *index = static_cast<int32_t>(groups_.size() - 1);
    return Status::Ok();
}

Status ParamTable::add_param(const char *name, int32_t ndim, const int64_t *shape, int32_t dtype, int32_t group,
                             int32_t unit, bool frozen, int32_t *index, const Placement &placement) {
    SX_TRY(validate_param_name(name));
    ParamSpec p;
    Status shaped = validate_shape(ndim, shape, &p.numel);
    if (!shaped.ok()) return shaped.prefix("param '" + std::string(name) + "': ");
    if (dtype == 0) dtype = SX_DTYPE_F32;
    SX_CHECK_ARG(dtype == SX_DTYPE_F32 || dtype == SX_DTYPE_F16 || dtype == SX_DTYPE_BF16,
                 "dtype %d of param '%s' is not an SX_DTYPE_*", dtype, name);
    SX_CHECK_ARG(group >= 0 && group < num_groups(), "param '%s': param group %d does not exist (%d added)", name,
                 group, num_groups());
    SX_CHECK_ARG(unit >= 0, "param '%s': unit %d must be >= 0", name, unit);
    SX_CHECK(by_name_.find(name) == by_name_.end(), SX_ERR_ALREADY_EXISTS,
             "a param named '%s' is already registered", name);
    // After sx_finalize, new params go in new units after every laid-out one, so that the
    // laid-out units keep their buffers and their indices.
    if (finalized_)
        SX_CHECK_ARG(unit > last_unit_,
                     "param '%s': unit %d is laid out already, or precedes one that is; params added after "
                     "sx_finalize go in new units, with ids above %d (the largest laid out)",
                     name, unit, last_unit_);
    p.shape.assign(shape, shape + ndim);
    SX_TRY(validate_placement(name, p.shape, placement));
    p.placement = placement;
    p.name = name;
    p.dtype = dtype;
    p.group = group;
    p.unit = unit;
    by_name_.emplace(p.name, static_cast<int32_t>(params_.size()));
    params_.push_back(std::move(p));
    mask_.push_back(frozen ? 0 : 1);
    if (index) *index = static_cast<int32_t>(params_.size() - 1);
    return Status::Ok();
}

Status ParamTable::check_group(int32_t group) const {
    SX_CHECK_ARG(group >= 0 && group < num_groups(), "param group %d does not exist (%d added)", group, num_groups());
    return Status::Ok();
}

Status ParamTable::get_hyperparameter(int32_t group, int32_t key, double *value) const {
    SX_TRY(check_group(group));
    return core::get_hyperparameter(groups_[group].hyper, key, value);
}

Status ParamTable::check_param(int32_t param) const {
    SX_CHECK_ARG(param >= 0 && param < num_params(), "param index %d is out of range (%d params)", param,
                 num_params());
    return Status::Ok();
}

Status ParamTable::find(const char *name, int32_t *index) const {
    SX_CHECK_ARG(name != nullptr, "name is NULL");
    auto it = by_name_.find(name);
    SX_CHECK(it != by_name_.end(), SX_ERR_NOT_FOUND, "no param named '%s'", name);
    *index = it->second;
    return Status::Ok();
}

Status ParamTable::check_laid_out(int32_t param) const {
    SX_TRY(check_param(param));
    SX_CHECK(finalized_, SX_ERR_INVALID_STATE,
             "the group is not finalized yet: params are laid out in the flat buffers by sx_finalize");
    SX_CHECK(static_cast<size_t>(param) < laid_out_params_, SX_ERR_INVALID_STATE,
             "param '%s' was added after sx_finalize; it is laid out by the next sx_finalize",
             params_[param].name.c_str());
    return Status::Ok();
}

Status ParamTable::set_trainable(int32_t param, bool trainable) {
    SX_TRY(check_param(param));
    mask_[param] = trainable ? 1 : 0;
    return Status::Ok();
}

void ParamTable::laid_out(int32_t last_unit) {
    laid_out_params_ = params_.size();
    laid_out_groups_ = groups_.size();
    last_unit_ = last_unit;
}

}  // namespace core
}  // namespace sx
