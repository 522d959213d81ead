# Part of module SX (src/SX.jl includes it): queries, and the whole optimizer state.

function _query(f::Function, g::ShardGroup)
    v = Ref{Int32}(0)
    check(f(_handle(g), v))
    Int(v[])
end
rank(g::ShardGroup) = _query((h, v) -> @ccall(libsx.sx_get_rank(h::Ptr{Cvoid}, v::Ref{Int32})::Int32), g)
world_size(g::ShardGroup) = _query((h, v) -> @ccall(libsx.sx_get_world_size(h::Ptr{Cvoid}, v::Ref{Int32})::Int32), g)
stage(g::ShardGroup) = _query((h, v) -> @ccall(libsx.sx_get_stage(h::Ptr{Cvoid}, v::Ref{Int32})::Int32), g)
num_params(g::ShardGroup) = _query((h, v) -> @ccall(libsx.sx_get_num_params(h::Ptr{Cvoid}, v::Ref{Int32})::Int32), g)
num_units(g::ShardGroup) = _query((h, v) -> @ccall(libsx.sx_get_num_units(h::Ptr{Cvoid}, v::Ref{Int32})::Int32), g)
num_param_groups(g::ShardGroup) = _query((h, v) -> @ccall(libsx.sx_get_num_param_groups(h::Ptr{Cvoid}, v::Ref{Int32})::Int32), g)

"""Bytes this rank holds per category, as a NamedTuple. `device_bytes`: of those (but
staging and memory copies), the ones in a CUDA device's memory; 0 for CPU groups."""
function memory_stats(g::ShardGroup)
    s = _blank(MemoryStats)
    check(@ccall libsx.sx_memory_stats_init(s::Ref{MemoryStats}, sizeof(MemoryStats)::Csize_t)::Int32)
    check(@ccall libsx.sx_get_memory_stats(_handle(g)::Ptr{Cvoid}, s::Ref{MemoryStats})::Int32)
    (param_bytes=Int(s.param_bytes), grad_bytes=Int(s.grad_bytes),
     optimizer_bytes=Int(s.optimizer_bytes), staging_bytes=Int(s.staging_bytes),
     unsharded_optimizer_bytes=Int(s.unsharded_optimizer_bytes),
     peak_param_bytes=Int(s.peak_param_bytes), memory_copy_bytes=Int(s.memory_copy_bytes),
     device_bytes=Int(s.device_bytes))
end

# ----------------------------------------------------------------------------------
# Whole optimizer state
# ----------------------------------------------------------------------------------
"""
    ParamState

One param's whole optimizer state (ZeroRedundancyOptimizer's consolidated state): its
0-based `index`, `name`, `param_group`, `numel`, step counts (`step`: torch's
state["step"] of Adam and AdamW; `momentum_steps`: SGD's updates that used
momentum_buffer, 0 = never initialised), `mu_product` (NAdam: torch's
state["mu_product"], the product of the param's momentum coefficients, in (0, 1]; 0 for
other optimizers; a scatter may leave it 0 to have sx derive it from `step` with the
group's beta1 and momentum_decay) and `tensors`, a `Dict` from torch's names
("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer"; "master" for 16-bit
params) to `Vector{Float32}`s of the param's `numel` values in sx's (row-major) order,
but Adafactor's factored moments of a param of shape [..., R, C]: "row_var",
prod(shape[:-1]) values (torch's shape [..., R, 1]), and "col_var", prod(shape[:-2]) * C
(torch's [..., 1, C]).
One handed to a callback of `gather_optim_state` or `scatter_optim_state!` lends sx's
memory: its vectors are valid only during that call (`copy` what you keep).
"""
mutable struct ParamState
    index::Int
    name::String
    param_group::Int
    numel::Int
    step::Int
    momentum_steps::Int
    mu_product::Float64
    tensors::Dict{String,Vector{Float32}}
end

_field_offset(T, name) = fieldoffset(T, findfirst(==(name), fieldnames(T)))
const _STEP_OFFSET = _field_offset(RawParamState, :step)
const _MOMENTUM_STEPS_OFFSET = _field_offset(RawParamState, :momentum_steps)
const _MU_PRODUCT_OFFSET = _field_offset(RawParamState, :mu_product)

# What a gather's or a scatter's callback reaches through its `user` pointer: the Julia
# function, and the exception it threw, for the caller once sx has returned.
mutable struct _StateCall
    f::Any
    scatter::Bool
    failure::Any
end

# sx calls this on the calling thread, during the gather or scatter. Nothing may unwind
# into C: an exception is kept, ends the call on every rank (with an SXError's own
# status, else SX_ERR_CANCELLED) and is thrown again once sx has returned.
function _state_trampoline(raw::Ptr{RawParamState}, user::Ptr{Cvoid})::Int32
    call = unsafe_pointer_to_objref(user)::_StateCall
    try
        st = unsafe_load(raw)
        n = Int(st.numel)
        # Each tensor's own length (Adafactor's row_var and col_var are not the param's
        # numel); numel where sx gives none.
        numels = st.struct_size >= sizeof(RawParamState) ? st.tensor_numels : Ptr{UInt64}(C_NULL)
        tensors = Dict{String,Vector{Float32}}()
        for t in 1:Int(st.num_tensors)
            name = unsafe_string(unsafe_load(st.tensor_names, t))
            len = numels == C_NULL ? n : Int(unsafe_load(numels, t))
            tensors[name] = len == 0 ? Float32[] : unsafe_wrap(Array, unsafe_load(st.tensors, t), len; own=false)
        end
        state = ParamState(Int(st.param), unsafe_string(st.name), Int(st.param_group), n, Int(st.step),
                           Int(st.momentum_steps), Float64(st.mu_product), tensors)
        call.f(state)
        if call.scatter  # what the callback set goes back into sx's struct
            unsafe_store!(Ptr{Int64}(raw + _STEP_OFFSET), Int64(state.step))
            unsafe_store!(Ptr{Int64}(raw + _MOMENTUM_STEPS_OFFSET), Int64(state.momentum_steps))
            unsafe_store!(Ptr{Float64}(raw + _MU_PRODUCT_OFFSET), Float64(state.mu_product))
        end
        return SX_OK
    catch e
        call.failure = e
        return e isa SXError && e.status != SX_OK ? e.status : SX_ERR_CANCELLED
    end
end

# A missing `f` on the root fails through a callback, so that every rank learns of it (sx
# alone would refuse it on the root only, before the other ranks could know).
function _whole_state(g::ShardGroup, f, root::Integer, scatter::Bool)
    if f === nothing && rank(g) == root
        f = _ -> throw(SXError(SX_ERR_INVALID_ARGUMENT, "no callback or states were given on the root (rank $root)"))
    end
    call = _StateCall(f, scatter, nothing)
    fn = f === nothing ? C_NULL : @cfunction(_state_trampoline, Int32, (Ptr{RawParamState}, Ptr{Cvoid}))
    h, r = _handle(g), Int32(root)
    # GC-safe while sx waits for the other ranks; the callback's @cfunction wrapper makes
    # the thread GC-unsafe again for as long as Julia code runs in it.
    status = GC.@preserve call begin
        user = f === nothing ? C_NULL : pointer_from_objref(call)
        if scatter
            @blocking @ccall libsx.sx_scatter_optim_state(h::Ptr{Cvoid}, r::Int32, fn::Ptr{Cvoid}, user::Ptr{Cvoid})::Int32
        else
            @blocking @ccall libsx.sx_gather_optim_state(h::Ptr{Cvoid}, r::Int32, fn::Ptr{Cvoid}, user::Ptr{Cvoid})::Int32
        end
    end
    err = status == SX_OK ? nothing : SXError(status, last_error_message())  # read before any other sx call
    call.failure === nothing || throw(call.failure)
    err === nothing || throw(err)
    nothing
end

"""
    gather_optim_state(f, g; root=0)
    gather_optim_state(g; root=0)

Collective (every rank, the same `root`): every param's whole optimizer state onto rank
`root`, one param at a time, in index order; no rank holds more than its shard, and the
root one param's state besides. With `f` (a do-block), the root calls `f(state)` with a
[`ParamState`](@ref) whose vectors are sx's memory, valid only during the call; other
ranks never call it (they may pass `nothing`, which on the root is an error on every
rank). Without, the root returns a
`Vector{ParamState}` of copies; the other ranks return `nothing`. Every param is
delivered: one without optimizer state yet (never trainable) has only its "master"
(16-bit) or no tensor. An exception in `f` ends the gather on every rank: the root throws
it, the others an `SXError` with its status (an SXError's own, else SX_ERR_CANCELLED).
"""
gather_optim_state(f, g::ShardGroup; root::Integer=0) = _whole_state(g, f, root, false)

function gather_optim_state(g::ShardGroup; root::Integer=0)
    states = ParamState[]
    gather_optim_state(g; root=root) do st
        push!(states, ParamState(st.index, st.name, st.param_group, st.numel, st.step, st.momentum_steps,
                                 st.mu_product, Dict{String,Vector{Float32}}(k => copy(v) for (k, v) in st.tensors)))
    end
    rank(g) == root ? states : nothing
end

"""
    scatter_optim_state!(f, g; root=0)
    scatter_optim_state!(g, states; root=0)

Collective (every rank, the same `root`), the reverse of `gather_optim_state`: on rank
`root`, `f(state)` fills each param's whole state (its `tensors`, zero on entry, to write
into in place, `state.step`, `state.momentum_steps` to set, and NAdam's
`state.mu_product`, which may stay 0 to be derived from `step`), in index order, and
every rank's shard takes its part, at any world size and stage; 16-bit params then take
their values from the new masters on every rank. A tensor left zero is zero state, as
torch's when it has none. `f` runs only on the root (`nothing` is fine elsewhere).
Nothing changes unless every rank and every call of `f` succeeded; an exception in `f`
ends the scatter as for a gather. Views from `state_view` are invalid afterwards.

`states` (on the root; `nothing` elsewhere, and on the root an error on every rank) maps
param names to `ParamState`s, as `gather_optim_state` returns them, or to anything with
`step`, `momentum_steps` and `tensors` properties (and `mu_product`; without it, 0:
derived from `step`). A param absent from it gets zero state and step counts; tensors
its optimizer does not keep are ignored; a tensor of another length is an error, and
then nothing changes.
"""
scatter_optim_state!(f, g::ShardGroup; root::Integer=0) = _whole_state(g, f, root, true)

function scatter_optim_state!(g::ShardGroup, states::Union{Nothing,AbstractDict}; root::Integer=0)
    states === nothing && return _whole_state(g, nothing, root, true)
    scatter_optim_state!(g; root=root) do st
        given = get(states, st.name, nothing)
        given === nothing && return nothing
        for (name, values) in given.tensors
            if haskey(st.tensors, name) && length(values) != length(st.tensors[name])
                throw(SXError(SX_ERR_INVALID_ARGUMENT, "param '$(st.name)': tensor '$name' has " *
                                                       "$(length(values)) values; sx keeps $(length(st.tensors[name]))"))
            end
        end
        st.step, st.momentum_steps = given.step, given.momentum_steps
        st.mu_product = hasproperty(given, :mu_product) ? given.mu_product : 0.0
        for (name, values) in given.tensors
            haskey(st.tensors, name) && copyto!(st.tensors[name], values)
        end
        nothing
    end
end

"""
    state_view(g, p, tensor)

This rank's own part of a param's optimizer-state tensor (`tensor`: "exp_avg", ...,
"master"; `p` a name or 0-based index) as a zero-copy vector over sx's memory: the
param's elements `shard_begin+1:shard_end` of `param_info` (empty where this rank holds
none of it). `Vector{Float32}` for fp32 state; packed state in its own type: a bf16
slot's raw bits as `Vector{UInt16}`, an 8-bit slot's codes as `Vector{UInt8}`, whose
block scales (one per 256 elements) are the `Float32` tensor "<slot>.scale". Read it, or write it between steps to seed the state. Invalid after
`close(g)`, `load!` or `scatter_optim_state!`. Errors: a tensor the param's optimizer
does not keep (SX_ERR_INVALID_ARGUMENT, listing those it keeps), a param without
optimizer state yet (SX_ERR_INVALID_STATE: its unit gets it once one of its params is
trainable).
"""
function state_view(g::ShardGroup, p, tensor::AbstractString)
    i = _index(g, p)
    v = _blank(View)
    check(@ccall libsx.sx_view_init(v::Ref{View}, sizeof(View)::Csize_t)::Int32)
    check(@ccall libsx.sx_state_view(_handle(g)::Ptr{Cvoid}, i::Int32, tensor::Cstring, v::Ref{View})::Int32)
    v.device == SX_DEVICE_CPU ||
        throw(SXError(SX_ERR_UNSUPPORTED, "the state of param $i lives in device memory, which cannot be wrapped as an Array"))
    T = _ELTYPES[v.dtype]
    v.numel == 0 && return T[]
    _lend(g, unsafe_wrap(Array, Ptr{T}(v.data), Int(v.numel); own=false))
end
