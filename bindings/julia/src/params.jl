# Part of module SX (src/SX.jl includes it): param groups, params, views, trainability and units.

const _OPTIMIZERS = Dict(:sgd => SX_OPTIM_SGD, :adam => SX_OPTIM_ADAM, :adamw => SX_OPTIM_ADAMW,
                         :adagrad => SX_OPTIM_ADAGRAD, :rmsprop => SX_OPTIM_RMSPROP,
                         :adamax => SX_OPTIM_ADAMAX, :nadam => SX_OPTIM_NADAM,
                         :radam => SX_OPTIM_RADAM, :lion => SX_OPTIM_LION, :lamb => SX_OPTIM_LAMB,
                         :muon => SX_OPTIM_MUON, :adafactor => SX_OPTIM_ADAFACTOR,
                         :ademamix => SX_OPTIM_ADEMAMIX)
# Keywords of add_param_group! that are flags (Int32 fields of the descriptor), numbers
# and integers.
const _FLAG_FIELDS = (:nesterov, :maximize, :amsgrad, :centered, :decoupled_weight_decay, :bf16_stochastic_round)
const _FLOAT_FIELDS = (:lr, :weight_decay, :beta1, :beta2, :eps, :momentum, :dampening,
                       :lr_decay, :initial_accumulator_value, :alpha, :momentum_decay,
                       :ns_a, :ns_b, :ns_c, :beta2_decay, :eps2, :d, :beta3, :t_alpha_beta3)
const _INT_FIELDS = (:ns_steps,)
# Adafactor's eps1 where torch's is None: fp32's machine epsilon (sx's masters are fp32).
const _ADAFACTOR_EPS1 = 2.0^-23
# Muon's adjust_lr by torch's adjust_lr_fn names (its `nothing` is :original).
const _ADJUST_LR = Dict(:original => SX_MUON_ADJUST_LR_ORIGINAL,
                        :match_rms_adamw => SX_MUON_ADJUST_LR_MATCH_RMS_ADAMW,
                        :spectral_unclamped => SX_MUON_ADJUST_LR_SPECTRAL_UNCLAMPED)

_adjust_lr(::Nothing) = SX_MUON_ADJUST_LR_ORIGINAL
_adjust_lr(f::AbstractString) = _adjust_lr(Symbol(f))
function _adjust_lr(f::Symbol)
    haskey(_ADJUST_LR, f) ||
        throw(SXError(SX_ERR_INVALID_ARGUMENT, "adjust_lr must be one of $(sort(collect(keys(_ADJUST_LR)))), not :$f"))
    _ADJUST_LR[f]
end
function _adjust_lr(f::Integer)
    f in values(_ADJUST_LR) ||
        throw(SXError(SX_ERR_INVALID_ARGUMENT, "adjust_lr $f is not an SX_MUON_ADJUST_LR_* value"))
    Int32(f)
end

# How a param group keeps its optimizer state slots, by name or SX_STATE_* value.
const _STATE_DTYPE = Dict(:fp32 => SX_STATE_FP32, :float32 => SX_STATE_FP32,
                          :bf16 => SX_STATE_BF16, :bfloat16 => SX_STATE_BF16,
                          Symbol("8bit") => SX_STATE_8BIT)

_state_dtype(f::AbstractString) = _state_dtype(Symbol(f))
function _state_dtype(f::Symbol)
    haskey(_STATE_DTYPE, f) ||
        throw(SXError(SX_ERR_INVALID_ARGUMENT,
                      "state_dtype must be one of $(sort(String.(collect(keys(_STATE_DTYPE))))), not \"$f\""))
    _STATE_DTYPE[f]
end
function _state_dtype(f::Integer)
    f in values(_STATE_DTYPE) ||
        throw(SXError(SX_ERR_INVALID_ARGUMENT, "state_dtype $f is not an SX_STATE_* value"))
    Int32(f)
end

"""
    add_param_group!(g, optimizer=:adamw; lr, weight_decay, betas, eps, momentum, ...)

Adds a param group and returns its 0-based index. `optimizer` is one of `:sgd`, `:adam`,
`:adamw`, `:adagrad`, `:rmsprop`, `:adamax`, `:nadam`, `:radam`, `:lion`, `:lamb`, `:muon`,
`:adafactor` (the last three: CPU groups, or CUDA groups with `offload`; Muon takes 2-D
params only); what is not
given takes the optimizer's defaults (torch.optim's; lion-pytorch's for Lion;
pytorch-optimizer's for LAMB). Keywords: `lr`, `weight_decay`, `betas=(beta1, beta2)` or
`beta1`/`beta2`, `eps`, `momentum`, `dampening`, `nesterov`, `maximize`, `amsgrad`
(Adam/AdamW), `lr_decay` and `initial_accumulator_value` (Adagrad), `alpha` and `centered`
(RMSprop), `momentum_decay` (NAdam), `decoupled_weight_decay` (NAdam, RAdam, LAMB; LAMB's
is on by default, pytorch-optimizer's weight_decouple), `ns_coefficients=(a, b, c)` or
`ns_a`/`ns_b`/`ns_c`, `ns_steps` and `adjust_lr_fn` (Muon, as torch names them:
`adjust_lr_fn` `nothing`, `:original`, `:match_rms_adamw` or `:spectral_unclamped`, or
`adjust_lr` as an `SX_MUON_ADJUST_LR_*` value), `beta2_decay`, `eps=(eps1, eps2)` or
`eps`/`eps2`, and `d` (Adafactor, as torch names them; an eps1 of `nothing` is fp32's
machine epsilon, 2^-23), `beta3` and `t_alpha_beta3` (AdEMAMix), and `state_dtype`
(`"fp32"`, `"bf16"` or `"8bit"`, as a string or symbol, or an `SX_STATE_*` value: how the
elementwise optimizers keep their state slots; `"8bit"` is torchao's AdamW8bit's
block-wise quantization), and `bf16_stochastic_round` (`true` or `false`, torchao's: the
group's params, all bf16, keep no fp32 masters and each update is rounded stochastically
into them; elementwise optimizers, on CPU and CUDA groups). One that does not apply to the optimizer must keep its default
or be 0, which means the default (else an `SXError` with SX_ERR_INVALID_ARGUMENT).
Before `finalize!`, or between steps after it (torch's add_param_group): the group and the
params added with it then wait for the next `finalize!`, which every rank calls after
adding the same.
"""
function add_param_group!(g::ShardGroup, optimizer::Symbol=:adamw; kw...)
    haskey(_OPTIMIZERS, optimizer) && return _add_param_group!(g, _OPTIMIZERS[optimizer], nothing; kw...)
    custom = _custom_optimizer(String(optimizer))
    custom === nothing || return _add_param_group!(g, custom.id, custom; kw...)
    throw(SXError(SX_ERR_INVALID_ARGUMENT, "optimizer must be one of $(keys(_OPTIMIZERS)) or a registered " *
                                           "custom optimizer, not $optimizer"))
end

# A custom optimizer by its id (what register_optimizer returned), or a built-in by its SX_OPTIM_* value.
function add_param_group!(g::ShardGroup, optimizer::Integer; kw...)
    custom = _custom_optimizer(Int32(optimizer))
    custom === nothing && !(optimizer in values(_OPTIMIZERS)) &&
        throw(SXError(SX_ERR_INVALID_ARGUMENT, "optimizer $optimizer is neither an SX_OPTIM_* value nor a registered custom optimizer"))
    _add_param_group!(g, Int32(optimizer), custom; kw...)
end

function _add_param_group!(g::ShardGroup, kind::Int32, custom; betas=nothing, ns_coefficients=nothing, kw...)
    desc = _blank(ParamGroupDesc)
    check(@ccall libsx.sx_param_group_desc_init(desc::Ref{ParamGroupDesc}, sizeof(ParamGroupDesc)::Csize_t, kind::Int32)::Int32)
    betas === nothing || ((desc.beta1, desc.beta2) = betas)
    ns_coefficients === nothing || ((desc.ns_a, desc.ns_b, desc.ns_c) = ns_coefficients)
    own = Pair{Int32,Float64}[]  # a custom optimizer's own hyperparameters: set once the group exists
    for (k, v) in kw
        if k === :eps && v isa Tuple  # torch.optim.Adafactor's (eps1, eps2)
            desc.eps = v[1] === nothing ? _ADAFACTOR_EPS1 : Float64(v[1])
            desc.eps2 = Float64(v[2])
        elseif k in _FLAG_FIELDS
            setfield!(desc, k, Int32(v))
        elseif k in _FLOAT_FIELDS
            setfield!(desc, k, Float64(v))
        elseif k in _INT_FIELDS
            setfield!(desc, k, Int32(v))
        elseif k === :adjust_lr || k === :adjust_lr_fn
            desc.adjust_lr = _adjust_lr(v)
        elseif k === :state_dtype
            desc.state_dtype = _state_dtype(v)
        elseif custom !== nothing && String(k) in custom.own_names
            push!(own, (SX_HP_CUSTOM + Int32(findfirst(==(String(k)), custom.own_names) - 1)) => Float64(v))
        else
            throw(SXError(SX_ERR_INVALID_ARGUMENT, "add_param_group!: unknown hyperparameter $k"))
        end
    end
    index = Ref{Int32}(0)
    check(@ccall libsx.sx_add_param_group(_handle(g)::Ptr{Cvoid}, desc::Ref{ParamGroupDesc}, index::Ref{Int32})::Int32)
    for (key, value) in own
        set_hyperparameter!(g, index[], key, value)
    end
    Int(index[])
end

set_hyperparameter!(g::ShardGroup, group::Integer, key::Integer, value::Real) =
    check(@ccall libsx.sx_set_hyperparameter(_handle(g)::Ptr{Cvoid}, group::Int32, key::Int32, value::Float64)::Int32)

function get_hyperparameter(g::ShardGroup, group::Integer, key::Integer)
    value = Ref{Float64}(0)
    check(@ccall libsx.sx_get_hyperparameter(_handle(g)::Ptr{Cvoid}, group::Int32, key::Int32, value::Ref{Float64})::Int32)
    value[]
end

"""
    param_group_steps(g, group)

The steps param group `group` (0-based, as sx counts) took since it was added (LAMB's and
AdEMAMix's bias corrections count them; a skipped step does not).
"""
function param_group_steps(g::ShardGroup, group::Integer)
    steps = Ref{Int64}(0)
    check(@ccall libsx.sx_get_param_group_steps(_handle(g)::Ptr{Cvoid}, group::Int32, steps::Ref{Int64})::Int32)
    steps[]
end

set_lr!(g::ShardGroup, group::Integer, lr::Real) =
    check(@ccall libsx.sx_set_lr(_handle(g)::Ptr{Cvoid}, group::Int32, lr::Float64)::Int32)

"""
    add_param!(g, name, shape; param_group=0, unit=0, dtype=SX_DTYPE_F32, frozen=false)

Registers a param; `shape` is in sx's (row-major) order, e.g. `(8, 16)`. Returns its
0-based index. `SX_DTYPE_BF16` and `SX_DTYPE_F16` params (all params of a unit share a
dtype) get fp32 master weights and optimizer state. After `finalize!` (between steps), a
param goes in a new unit, whose id is above every unit laid out so far, and has no views
until the next `finalize!` lays it out.
"""
function add_param!(g::ShardGroup, name::AbstractString, shape; param_group::Integer=0,
                    unit::Integer=0, dtype::Integer=SX_DTYPE_F32, frozen::Bool=false,
                    split=nothing, replica=nothing)
    desc = _blank(ParamDesc)
    check(@ccall libsx.sx_param_desc_init(desc::Ref{ParamDesc}, sizeof(ParamDesc)::Csize_t)::Int32)
    s, dims = _c_string("name", name), _dims(name, shape)
    # Placement (docs/model-parallel.md): split = (global_shape, dim, offset), replica = (index, count).
    global_dims = split === nothing ? Int64[] : Int64.(collect(split[1]))
    index = Ref{Int32}(0)
    GC.@preserve s dims global_dims begin  # borrowed for the call; sx copies them
        desc.name, desc.shape, desc.ndim = pointer(s), pointer(dims), length(dims)
        desc.dtype, desc.param_group, desc.unit, desc.frozen = dtype, param_group, unit, frozen
        if split !== nothing
            desc.placement, desc.global_shape = SX_PLACEMENT_SPLIT, pointer(global_dims)
            desc.split_dim, desc.split_offset = split[2], split[3]
        end
        if replica !== nothing
            desc.placement, desc.replica, desc.replicas = SX_PLACEMENT_REPLICATED, replica[1], replica[2]
        end
        check(@ccall libsx.sx_add_param(_handle(g)::Ptr{Cvoid}, desc::Ref{ParamDesc}, index::Ref{Int32})::Int32)
    end
    Int(index[])
end

"""Collective: checks every rank agrees, lays out and allocates the flat buffers. Called
again after params were added, it lays out only those, in new units; the params laid out
before keep their values, state and step counts. Ranks that disagree get
`SX_ERR_MISMATCH` naming the first differing fact."""
function finalize!(g::ShardGroup)
    h = _handle(g)
    check(@blocking @ccall libsx.sx_finalize(h::Ptr{Cvoid})::Int32)
end

function broadcast_params!(g::ShardGroup, root::Integer=0)
    h, r = _handle(g), Int32(root)
    check(@blocking @ccall libsx.sx_broadcast_params(h::Ptr{Cvoid}, r::Int32)::Int32)
end

const _REDUCE_OPS = Dict(:sum => SX_REDUCE_SUM, :mean => SX_REDUCE_MEAN, :max => SX_REDUCE_MAX, :min => SX_REDUCE_MIN)

"""
    all_reduce!(g, values::Vector{Float64}, op=:sum)

Collective: the trainer's own numbers (a loss, token counts) combined over the ranks in
place, element by element: `:sum`, `:mean`, `:max` or `:min` (sums in rank order: the same
on every rank; NaN wins). At most `SX_MAX_ALL_REDUCE` values; every rank passes the same op
and count. On an error the values are left as they were. Returns `values`.
"""
function all_reduce!(g::ShardGroup, values::Vector{Float64}, op::Symbol=:sum)
    haskey(_REDUCE_OPS, op) ||
        throw(SXError(SX_ERR_INVALID_ARGUMENT, "op must be one of $(sort(collect(keys(_REDUCE_OPS)))), not :$op"))
    h, n, r = _handle(g), Int32(length(values)), _REDUCE_OPS[op]
    GC.@preserve values begin
        p = pointer(values)
        check(@blocking @ccall libsx.sx_all_reduce(h::Ptr{Cvoid}, p::Ptr{Float64}, n::Int32, r::Int32)::Int32)
    end
    values
end

"""0-based index of the param called `name`."""
function param_index(g::ShardGroup, name::AbstractString)
    index = Ref{Int32}(0)
    check(@ccall libsx.sx_find_param(_handle(g)::Ptr{Cvoid}, name::Cstring, index::Ref{Int32})::Int32)
    Int(index[])
end
_index(g::ShardGroup, p::Integer) = Int(p)
_index(g::ShardGroup, p::AbstractString) = param_index(g, p)

"""A param's description and (after finalize) layout, as a NamedTuple; shape in sx's order."""
function param_info(g::ShardGroup, p)
    i = _index(g, p)
    info = _blank(ParamInfo)
    check(@ccall libsx.sx_param_info_init(info::Ref{ParamInfo}, sizeof(ParamInfo)::Csize_t)::Int32)
    check(@ccall libsx.sx_get_param_info(_handle(g)::Ptr{Cvoid}, i::Int32, info::Ref{ParamInfo})::Int32)
    (index=i, name=unsafe_string(info.name), shape=Tuple(info.shape[1:info.ndim]),
     dtype=info.dtype, numel=Int(info.numel), param_group=Int(info.param_group),
     unit=Int(info.unit), trainable=info.trainable != 0, offset_in_unit=Int(info.offset_in_unit),
     shard_begin=Int(info.shard_begin), shard_end=Int(info.shard_end))
end

"""Unit number `index` (0-based, by unit id): its flat buffer and this rank's shard."""
function unit_info(g::ShardGroup, index::Integer)
    info = _blank(UnitInfo)
    check(@ccall libsx.sx_unit_info_init(info::Ref{UnitInfo}, sizeof(UnitInfo)::Csize_t)::Int32)
    check(@ccall libsx.sx_get_unit_info(_handle(g)::Ptr{Cvoid}, index::Int32, info::Ref{UnitInfo})::Int32)
    (unit=Int(info.unit), num_params=Int(info.num_params), numel=Int(info.numel),
     padded_numel=Int(info.padded_numel), shard_numel=Int(info.shard_numel),
     shard_begin=Int(info.shard_begin), trainable=info.trainable != 0,
     has_optimizer_state=info.has_optimizer_state != 0, shard_size=Int(info.shard_size),
     shard_rank=Int(info.shard_rank), replicas=Int(info.replicas),
     replica_rank=Int(info.replica_rank))
end

const _ELTYPES = Dict(SX_DTYPE_F32 => Float32, SX_DTYPE_F16 => Float16, SX_DTYPE_BF16 => UInt16,
                     SX_DTYPE_U8 => UInt8)

function _view(g::ShardGroup, p, grad::Bool)
    i = _index(g, p)
    v = _blank(View)
    check(@ccall libsx.sx_view_init(v::Ref{View}, sizeof(View)::Csize_t)::Int32)
    h = _handle(g)
    check(grad ? @ccall(libsx.sx_grad_view(h::Ptr{Cvoid}, i::Int32, v::Ref{View})::Int32) :
                 @ccall(libsx.sx_param_view(h::Ptr{Cvoid}, i::Int32, v::Ref{View})::Int32))
    v.device == SX_DEVICE_CPU ||
        throw(SXError(SX_ERR_UNSUPPORTED, "param $i lives in device memory, which cannot be wrapped as an Array"))
    dims = reverse(param_info(g, i).shape)  # row-major in sx, column-major here
    _lend(g, unsafe_wrap(Array, Ptr{_ELTYPES[v.dtype]}(v.data), dims; own=false))
end

"""
    unit_view(g, unit; grad=false)

Unit `unit`'s whole flat buffer (a 0-based index, as `gather_unit!`'s) as one zero-copy
`Vector`: its params, or with `grad` its gradients; `padded_numel` elements, each param at
its `offset_in_unit`. With `alignment=1` the params are packed: one block, as a trainer
that keeps all its params in one array has them. The rules of `param_view` and
`grad_view` hold.
"""
function unit_view(g::ShardGroup, unit::Integer; grad::Bool=false)
    v = _blank(View)
    check(@ccall libsx.sx_view_init(v::Ref{View}, sizeof(View)::Csize_t)::Int32)
    h, u, gr = _handle(g), Int32(unit), Int32(grad)
    check(@ccall libsx.sx_unit_view(h::Ptr{Cvoid}, u::Int32, gr::Int32, v::Ref{View})::Int32)
    v.device == SX_DEVICE_CPU ||
        throw(SXError(SX_ERR_UNSUPPORTED, "unit $unit lives in device memory, which cannot be wrapped as an Array"))
    _lend(g, unsafe_wrap(Array, Ptr{_ELTYPES[v.dtype]}(v.data), (Int(v.numel),); own=false))
end

"""
    param_view(g, p)

The values of param `p` (name or 0-based index) as a zero-copy `Array` over sx's memory,
dims reversed (see the module docs). Invalid after `close(g)`. The element type follows
the view's dtype: `Float32`, `Float16`, or `UInt16` (the raw bits of bf16), for
gradients too. A 16-bit param is overwritten by each step with its fp32 masters rounded.
At stage 3 only while the param's unit is gathered, and invalid after its release.
"""
param_view(g::ShardGroup, p) = _view(g, p, false)

"""The gradient of param `p`, zero-copy: backward adds into it; sx zeroes it after a step."""
grad_view(g::ShardGroup, p) = _view(g, p, true)

set_trainable!(g::ShardGroup, p, trainable::Bool) =
    check(@ccall libsx.sx_set_trainable(_handle(g)::Ptr{Cvoid}, _index(g, p)::Int32, trainable::Int32)::Int32)

function is_trainable(g::ShardGroup, p)
    t = Ref{Int32}(0)
    check(@ccall libsx.sx_get_trainable(_handle(g)::Ptr{Cvoid}, _index(g, p)::Int32, t::Ref{Int32})::Int32)
    t[] != 0
end

"""The group-owned mask (one UInt8 per param, 1 = trainable), zero-copy. Adding params
after `finalize!` may move it: take it again then."""
function trainable_mask(g::ShardGroup)
    mask, count = Ref{Ptr{UInt8}}(C_NULL), Ref{Int32}(0)
    check(@ccall libsx.sx_trainable_mask(_handle(g)::Ptr{Cvoid}, mask::Ref{Ptr{UInt8}}, count::Ref{Int32})::Int32)
    _lend(g, unsafe_wrap(Array, mask[], Int(count[]); own=false))
end

refresh_trainable!(g::ShardGroup) = check(@ccall libsx.sx_refresh_trainable(_handle(g)::Ptr{Cvoid})::Int32)

"""
    unit_grads_ready!(g, unit; accumulate=false)

Says that unit `unit`'s (0-based index) gradients are complete for this micro-batch; sx
reduces them on its own thread while the backward goes on. `accumulate`: an intermediate
micro-batch (`accumulate_grads!` ends it).
"""
function unit_grads_ready!(g::ShardGroup, unit::Integer; accumulate::Bool=false)
    o = _blank(UnitReadyOptions)
    check(@ccall libsx.sx_unit_ready_options_init(o::Ref{UnitReadyOptions}, sizeof(UnitReadyOptions)::Csize_t)::Int32)
    o.accumulate = accumulate
    h = _handle(g)
    GC.@preserve o begin
        op = _ptr(o)
        check(@blocking @ccall libsx.sx_unit_grads_ready(h::Ptr{Cvoid}, unit::Int32, op::Ptr{UnitReadyOptions})::Int32)
    end
end

"""Stage 3 (collective): makes unit `unit`'s params present until `release_unit!`.
Stages 1 and 2: waits for its gather after a step with `defer_gather`."""
function gather_unit!(g::ShardGroup, unit::Integer)
    h = _handle(g)
    check(@blocking @ccall libsx.sx_unit_gather(h::Ptr{Cvoid}, unit::Int32)::Int32)
end

"""Stage 3: ends a `gather_unit!` (this rank keeps only its shard). Else nothing."""
release_unit!(g::ShardGroup, unit::Integer) =
    check(@ccall libsx.sx_unit_release(_handle(g)::Ptr{Cvoid}, unit::Int32)::Int32)

"""`with_unit(f, g, unit)`: `f()` with unit `unit` gathered, released afterwards."""
function with_unit(f, g::ShardGroup, unit::Integer)
    gather_unit!(g, unit)
    try
        f()
    finally
        release_unit!(g, unit)
    end
end
