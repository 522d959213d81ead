# Part of module SX (src/SX.jl includes it): the step, and loss scaling.

"""Collective: folds this micro-batch's gradients into the step's accumulation."""
function accumulate_grads!(g::ShardGroup)
    h = _handle(g)
    check(@blocking @ccall libsx.sx_accumulate_grads(h::Ptr{Cvoid})::Int32)
end

"""
    step!(g; max_grad_norm=0.0, keep_grads=false, defer_gather=false, weight=nothing, nonfinite=:default)

Collective: averages gradients over ranks, clips, updates, gathers (with `defer_gather`,
at stages 1 and 2, in the background: `gather_unit!` waits for a unit's). Returns
`(grad_norm, step, skipped, loss_scale, nonfinite)`: `skipped` when inf/NaN gradients
were found where they were checked (or every rank weighed 0), `loss_scale` what to
multiply the next losses by, `nonfinite` whether the gradients' norm was inf or NaN.

`nonfinite`: `:default` (where the norm is needed first, for clipping or dynamic loss
scaling, inf/NaN gradients skip the step on every rank; otherwise they reach the params,
as in torch), `:skip` (always checked, and skipped) or `:error` (as `:skip`, then throws
an `SXError` with `SX_ERR_NONFINITE`). Every rank passes the same.

Uneven inputs: with `weight`, the gradients are sums over this rank's `weight` samples
(or tokens), and the step divides their sum over the ranks by the sum of every rank's
weight, so that the update is the one a single process would make over the union of the
data. A rank whose data ran out passes 0 and leaves its gradients at zero; if every rank
passes 0 the step is skipped and nothing changes. Either every rank passes a weight
(finite, >= 0) or none does (`nothing`: each rank's gradients are its mean, averaged over
the ranks).
"""
const _NONFINITE_MODES = Dict(:default => SX_NONFINITE_DEFAULT, :skip => SX_NONFINITE_SKIP,
                              :error => SX_NONFINITE_ERROR)

function step!(g::ShardGroup; max_grad_norm::Real=0.0, keep_grads::Bool=false, defer_gather::Bool=false,
               weight::Union{Nothing,Real}=nothing, nonfinite::Symbol=:default)
    haskey(_NONFINITE_MODES, nonfinite) ||
        throw(SXError(SX_ERR_INVALID_ARGUMENT, "nonfinite must be one of $(sort(collect(keys(_NONFINITE_MODES)))), not :$nonfinite"))
    o, r = _blank(StepOptions), _blank(StepResult)
    check(@ccall libsx.sx_step_options_init(o::Ref{StepOptions}, sizeof(StepOptions)::Csize_t)::Int32)
    check(@ccall libsx.sx_step_result_init(r::Ref{StepResult}, sizeof(StepResult)::Csize_t)::Int32)
    o.max_grad_norm, o.keep_grads, o.defer_gather = max_grad_norm, keep_grads, defer_gather
    if weight !== nothing
        o.weighted, o.weight = 1, weight
    end
    o.nonfinite = _NONFINITE_MODES[nonfinite]
    h = _handle(g)
    GC.@preserve o r begin
        op, rp = _ptr(o), _ptr(r)
        check(@blocking @ccall libsx.sx_step(h::Ptr{Cvoid}, op::Ptr{StepOptions}, rp::Ptr{StepResult})::Int32)
    end
    (grad_norm=r.grad_norm, step=Int(r.step), skipped=r.skipped != 0, loss_scale=r.loss_scale,
     nonfinite=r.nonfinite != 0)
end

const _LOSS_SCALING_MODES = Dict(:none => SX_LOSS_SCALING_NONE, :dynamic => SX_LOSS_SCALING_DYNAMIC,
                                 :static => SX_LOSS_SCALING_STATIC)

"""
    set_loss_scaling!(g, mode=:dynamic; init_scale, growth_factor, backoff_factor, growth_interval)

Loss scaling with torch.cuda.amp.GradScaler's semantics: `:dynamic` skips steps with
inf/NaN gradients and multiplies the scale by `backoff_factor` then, and by
`growth_factor` after `growth_interval` good steps in a row; `:static` divides by
`init_scale` and never skips; `:none`. Options left 0 take GradScaler's defaults
(init_scale 65536, growth_factor 2, backoff_factor 0.5, growth_interval 2000). Resets the
scale to `init_scale`. Between steps; every rank the same.
"""
function set_loss_scaling!(g::ShardGroup, mode::Symbol=:dynamic; init_scale::Real=0, growth_factor::Real=0,
                           backoff_factor::Real=0, growth_interval::Integer=0)
    haskey(_LOSS_SCALING_MODES, mode) ||
        throw(SXError(SX_ERR_INVALID_ARGUMENT, "loss scaling mode must be one of $(keys(_LOSS_SCALING_MODES)), not $mode"))
    s = _blank(LossScaling)
    check(@ccall libsx.sx_loss_scaling_init(s::Ref{LossScaling}, sizeof(LossScaling)::Csize_t)::Int32)
    s.mode, s.growth_interval = _LOSS_SCALING_MODES[mode], growth_interval
    s.init_scale, s.growth_factor, s.backoff_factor = init_scale, growth_factor, backoff_factor
    check(@ccall libsx.sx_set_loss_scaling(_handle(g)::Ptr{Cvoid}, s::Ref{LossScaling})::Int32)
end

"""What the next losses are to be multiplied by before backward (1.0 without loss
scaling); `step!` divides the gradients by it."""
function loss_scale(g::ShardGroup)
    v = Ref{Float64}(0)
    check(@ccall libsx.sx_get_loss_scale(_handle(g)::Ptr{Cvoid}, v::Ref{Float64})::Int32)
    v[]
end
