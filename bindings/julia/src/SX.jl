"""
    SX

Julia bindings of sx, a training runtime with ZeRO-sharded optimizer state, flat
parameter/gradient buffers, fused optimizers and resharding checkpoints, over the C ABI
of `include/sx/sx.h` (`@ccall` into `libsx`; set `SX_LIBRARY` to the library's path).

Layout note: sx stores params row-major (C order). A view of a param of shape
`[8, 16]` is a Julia `Array` of size `(16, 8)` (the dims reversed), so that
`w[j, i]` is the C element `w[i][j]`; no data is copied or transposed.
"""
module SX

using Libdl

export ShardGroup, SXError, Future, add_param_group!, add_param!, finalize!, param_view, all_reduce!, unit_view,
       grad_view, step!, save, load!, read_user_blob, set_trainable!, is_trainable,
       trainable_mask, param_info, unit_info, memory_stats, with_group, wait_staged,
       set_loss_scaling!, loss_scale, unit_grads_ready!, gather_unit!, release_unit!, with_unit,
       ParamState, gather_optim_state, scatter_optim_state!, state_view, flush_trace,
       register_optimizer, OptimizerPiece, regroup!, poll_joiners, lost_ranks

# The ABI version this binding was written against (sx.h's SX_VERSION_*): the runtime's
# major must match and its minor must not be older.
const SX_VERSION_MAJOR = 1
const SX_VERSION_MINOR = 5
const SX_VERSION_PATCH = 0
const SX_VERSION_NUMBER = SX_VERSION_MAJOR * 10000 + SX_VERSION_MINOR * 100 + SX_VERSION_PATCH
const BINDING_VERSION = (SX_VERSION_MAJOR, SX_VERSION_MINOR)

# The library name every @ccall uses; __init__ makes it resolve to $SX_LIBRARY.
const libsx = "libsx"

# ----------------------------------------------------------------------------------
# Constants (include/sx/*.h #defines; bindings_constants checks each against the headers)
# ----------------------------------------------------------------------------------
const SX_OK = Int32(0)
const SX_ERR_INVALID_ARGUMENT = Int32(1)
const SX_ERR_INVALID_HANDLE = Int32(2)
const SX_ERR_INVALID_STATE = Int32(3)
const SX_ERR_OUT_OF_MEMORY = Int32(4)
const SX_ERR_NOT_FOUND = Int32(5)
const SX_ERR_ALREADY_EXISTS = Int32(6)
const SX_ERR_UNSUPPORTED = Int32(7)
const SX_ERR_TIMEOUT = Int32(8)
const SX_ERR_COMM = Int32(9)
const SX_ERR_GROUP_FAILED = Int32(10)
const SX_ERR_IO = Int32(11)
const SX_ERR_CORRUPT = Int32(12)
const SX_ERR_VERSION = Int32(13)
const SX_ERR_ABORTED = Int32(14)
const SX_ERR_MISMATCH = Int32(15)
const SX_ERR_INTERNAL = Int32(16)
const SX_ERR_CANCELLED = Int32(17)
const SX_ERR_NONFINITE = Int32(18)
const SX_ERR_OPTIMIZER = Int32(19)
const SX_LOG_ERROR, SX_LOG_WARN, SX_LOG_INFO, SX_LOG_DEBUG = Int32.(1:4)
const SX_DTYPE_F32, SX_DTYPE_F16, SX_DTYPE_BF16 = Int32.(1:3)
const SX_BACKEND_AUTO, SX_BACKEND_CPU, SX_BACKEND_CUDA = Int32.(0:2)
const SX_DEVICE_CPU, SX_DEVICE_CUDA = Int32.(0:1)
const SX_OPTIM_SGD, SX_OPTIM_ADAM, SX_OPTIM_ADAMW, SX_OPTIM_ADAGRAD, SX_OPTIM_RMSPROP,
      SX_OPTIM_ADAMAX, SX_OPTIM_NADAM, SX_OPTIM_RADAM, SX_OPTIM_LION, SX_OPTIM_LAMB,
      SX_OPTIM_MUON, SX_OPTIM_ADAFACTOR = Int32.(1:12)
const SX_HP_LR, SX_HP_WEIGHT_DECAY, SX_HP_BETA1, SX_HP_BETA2, SX_HP_EPS, SX_HP_MOMENTUM,
      SX_HP_DAMPENING, SX_HP_NESTEROV, SX_HP_MAXIMIZE, SX_HP_AMSGRAD, SX_HP_LR_DECAY,
      SX_HP_INITIAL_ACCUMULATOR_VALUE, SX_HP_ALPHA, SX_HP_CENTERED, SX_HP_MOMENTUM_DECAY,
      SX_HP_DECOUPLED_WEIGHT_DECAY, SX_HP_NS_A, SX_HP_NS_B, SX_HP_NS_C, SX_HP_NS_STEPS,
      SX_HP_ADJUST_LR, SX_HP_BETA2_DECAY, SX_HP_EPS2, SX_HP_D = Int32.(1:24)
const SX_MUON_ADJUST_LR_ORIGINAL, SX_MUON_ADJUST_LR_MATCH_RMS_ADAMW,
      SX_MUON_ADJUST_LR_SPECTRAL_UNCLAMPED = Int32.(0:2)
const SX_OPTIM_CUSTOM_FIRST = Int32(1000)
const SX_HP_CUSTOM = Int32(1000)
const SX_MAX_CUSTOM_SLOTS = 3
const SX_MAX_CUSTOM_HYPERPARAMETERS = 8
const SX_MAX_CUSTOM_OPTIMIZERS = 64
const SX_OPTIMIZER_ERROR_BYTES = 256  # sx_optimizer_piece_t.error_size
const SX_OPTIMIZER_IN_PLACE = UInt32(0x1)  # sx_optimizer_desc_t.flags
const SX_GROUP_NO_TRAINABLE_AUTODETECT = UInt32(0x1)
const SX_GROUP_RESERVE_CHECKPOINT_STAGING = UInt32(0x2)
const SX_GROUP_JOIN = UInt32(0x4)
const SX_GROUP_MEMORY_COPY_WAIT = UInt32(0x8)
const SX_MAX_NDIM = 8
const SX_MAX_NAME_BYTES = 1024
const SX_MAX_WORLD_SIZE = Int32(65536)
const SX_LOAD_PARAMS_ONLY, SX_LOAD_ALLOW_MISSING, SX_LOAD_ALLOW_EXTRA = UInt32.((0x1, 0x2, 0x4))
const SX_LOSS_SCALING_NONE, SX_LOSS_SCALING_DYNAMIC, SX_LOSS_SCALING_STATIC = Int32.(0:2)
const SX_PREFETCH_NONE = Int32(-1)
const SX_TRANSPORT_AUTO, SX_TRANSPORT_TCP = Int32.(0:1)
const SX_NONFINITE_DEFAULT, SX_NONFINITE_SKIP, SX_NONFINITE_ERROR = Int32.(0:2)
const SX_REDUCE_SUM, SX_REDUCE_MEAN, SX_REDUCE_MAX, SX_REDUCE_MIN = Int32.(1:4)
const SX_MAX_ALL_REDUCE = Int32(64)

# ----------------------------------------------------------------------------------
# Struct mirrors. Mutable, so that a `Ref{T}` argument passes a pointer to the object
# itself and sx fills it in place. bindings/julia/check_static.py checks every field's
# offset and size against sx_layout.json, using the C-compatible layout Julia gives
# structs of isbits fields.
# ----------------------------------------------------------------------------------
mutable struct GroupConfig  # sx_group_config_t
    struct_size::Csize_t
    rendezvous::Ptr{UInt8}
    rank::Int32
    world_size::Int32
    stage::Int32
    backend::Int32
    num_threads::Int32
    alignment::Int32
    timeout_ms::Int32
    flags::UInt32
    bind_address::Ptr{UInt8}
    device_ordinal::Int32
    reserved0::Int32
    grad_dtype::Int32
    reduce_dtype::Int32
    prefetch_depth::Int32
    shard_size::Int32
    grad_predivide_factor::Float64
    trace_path::Ptr{UInt8}
    trace_events::Int32
    transport::Int32
    rendezvous_token::Ptr{UInt8}
    rendezvous_bind::Ptr{UInt8}
    memory_copy_interval::Int32
end

mutable struct ParamGroupDesc  # sx_param_group_desc_t
    struct_size::Csize_t
    optimizer::Int32
    nesterov::Int32
    maximize::Int32
    amsgrad::Int32
    lr::Float64
    weight_decay::Float64
    beta1::Float64
    beta2::Float64
    eps::Float64
    momentum::Float64
    dampening::Float64
    centered::Int32
    decoupled_weight_decay::Int32
    lr_decay::Float64
    initial_accumulator_value::Float64
    alpha::Float64
    momentum_decay::Float64
    ns_a::Float64
    ns_b::Float64
    ns_c::Float64
    ns_steps::Int32
    adjust_lr::Int32
    beta2_decay::Float64
    eps2::Float64
    d::Float64
end

mutable struct ParamDesc  # sx_param_desc_t
    struct_size::Csize_t
    name::Ptr{UInt8}
    ndim::Int32
    dtype::Int32
    shape::Ptr{Int64}
    param_group::Int32
    unit::Int32
    frozen::Int32
    reserved0::Int32
end

mutable struct View  # sx_view_t
    struct_size::Csize_t
    data::Ptr{Cvoid}
    numel::UInt64
    dtype::Int32
    device::Int32
end

mutable struct StepOptions  # sx_step_options_t
    struct_size::Csize_t
    max_grad_norm::Float64
    stream::Ptr{Cvoid}
    keep_grads::Int32
    defer_gather::Int32
    weighted::Int32
    reserved0::Int32
    weight::Float64
    nonfinite::Int32
    reserved1::Int32
end

mutable struct UnitReadyOptions  # sx_unit_ready_options_t
    struct_size::Csize_t
    accumulate::Int32
    reserved0::Int32
    stream::Ptr{Cvoid}
end

mutable struct StepResult  # sx_step_result_t
    struct_size::Csize_t
    grad_norm::Float64
    step::UInt64
    skipped::Int32
    reserved0::Int32
    loss_scale::Float64
    nonfinite::Int32
    reserved1::Int32
end

mutable struct LossScaling  # sx_loss_scaling_t
    struct_size::Csize_t
    mode::Int32
    growth_interval::Int32
    init_scale::Float64
    growth_factor::Float64
    backoff_factor::Float64
end

mutable struct MemoryStats  # sx_memory_stats_t
    struct_size::Csize_t
    param_bytes::UInt64
    grad_bytes::UInt64
    optimizer_bytes::UInt64
    staging_bytes::UInt64
    unsharded_optimizer_bytes::UInt64
    peak_param_bytes::UInt64
    memory_copy_bytes::UInt64
end

mutable struct ParamInfo  # sx_param_info_t
    struct_size::Csize_t
    name::Ptr{UInt8}
    ndim::Int32
    dtype::Int32
    shape::NTuple{8,Int64}
    numel::UInt64
    param_group::Int32
    unit::Int32
    trainable::Int32
    reserved0::Int32
    offset_in_unit::UInt64
    shard_begin::UInt64
    shard_end::UInt64
end

mutable struct UnitInfo  # sx_unit_info_t
    struct_size::Csize_t
    unit::Int32
    num_params::Int32
    numel::UInt64
    padded_numel::UInt64
    shard_numel::UInt64
    shard_begin::UInt64
    trainable::Int32
    has_optimizer_state::Int32
    shard_size::Int32
    shard_rank::Int32
    replicas::Int32
    replica_rank::Int32
end

mutable struct SaveOptions  # sx_save_options_t
    struct_size::Csize_t
    path::Ptr{UInt8}
    user_blob::Ptr{Cvoid}
    user_blob_size::UInt64
    keep_last::Int32
    synchronous::Int32
    callback::Ptr{Cvoid}
    callback_user::Ptr{Cvoid}
end

mutable struct LoadOptions  # sx_load_options_t
    struct_size::Csize_t
    path::Ptr{UInt8}
    flags::UInt32
    reserved0::Int32
end

mutable struct RegroupOptions  # sx_regroup_options_t
    struct_size::Csize_t
    checkpoint::Ptr{UInt8}
    load_flags::UInt32
    join_window_ms::Int32
    expected_world_size::Int32
    admit::Int32
end

mutable struct RegroupResult  # sx_regroup_result_t
    struct_size::Csize_t
    epoch::Int32
    rank::Int32
    world_size::Int32
    shard_size::Int32
    previous_rank::Int32
    previous_world_size::Int32
    step::UInt64
    from_memory::Int32
    reserved0::Int32
end

# Filled by sx only, for a gather's or a scatter's callback (read with unsafe_load).
struct RawParamState  # sx_param_state_t
    struct_size::Csize_t
    param::Int32
    param_group::Int32
    name::Ptr{UInt8}
    numel::UInt64
    step::Int64
    momentum_steps::Int64
    num_tensors::Int32
    reserved0::Int32
    tensor_names::Ptr{Ptr{UInt8}}
    tensors::Ptr{Ptr{Float32}}
    mu_product::Float64
    tensor_numels::Ptr{UInt64}
end

# Filled by sx only, for a custom optimizer's update (read with unsafe_load).
struct RawOptimizerPiece  # sx_optimizer_piece_t
    struct_size::Csize_t
    param::Ptr{Float32}
    grad::Ptr{Float32}
    state::NTuple{3,Ptr{Float32}}
    n::Csize_t
    grad_scale::Float32
    param_index::Int32
    param_group::Int32
    offset::UInt64
    step::Int64
    hyperparameters::Ptr{Float64}
    user_data::Ptr{Cvoid}
    num_slots::Int32
    num_hyperparameters::Int32
    error::Ptr{UInt8}  # a failing update's message: NUL-terminated, error_size bytes
    error_size::Csize_t
end

# An element of OptimizerDesc.hyperparameters (an array: isbits, no struct_size).
struct OptimizerHyperparameter  # sx_optimizer_hyperparameter_t
    name::Ptr{UInt8}
    default_value::Float64
    min::Float64
    max::Float64
end

mutable struct OptimizerDesc  # sx_optimizer_desc_t
    struct_size::Csize_t
    name::Ptr{UInt8}
    num_slots::Int32
    slot_names::Ptr{Ptr{UInt8}}
    slot_initial_values::Ptr{Float32}
    num_hyperparameters::Int32
    hyperparameters::Ptr{OptimizerHyperparameter}
    update::Ptr{Cvoid}
    user_data::Ptr{Cvoid}
    flags::UInt32
    reserved0::Int32
end

_zero(::Type{T}) where {T<:Number} = zero(T)
_zero(::Type{Ptr{T}}) where {T} = Ptr{T}(C_NULL)
_zero(::Type{NTuple{N,T}}) where {N,T} = ntuple(_ -> zero(T), N)
_blank(::Type{T}) where {T} = T((_zero(fieldtype(T, i)) for i in 1:fieldcount(T))...)
# The address of a mirror's fields, for calls made GC-safe (see @blocking); the caller
# holds the object under GC.@preserve.
_ptr(x::T) where {T} = Ptr{T}(pointer_from_objref(x))

# ----------------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------------
"""
    SXError(status, message)

A failed sx call: `status` (an SX_ERR_* value), `name` ("SX_ERR_TIMEOUT") and sx's
`message`, which names the function, the argument and the value.
"""
struct SXError <: Exception
    status::Int32
    name::String
    message::String
end
SXError(status::Integer, message::AbstractString) =
    SXError(Int32(status), first(split(status_string(status), ':')), String(message))
Base.showerror(io::IO, e::SXError) = print(io, "SXError ", e.name, ": ", e.message)

"""Static text naming a status ("SX_ERR_TIMEOUT: ...")."""
status_string(status::Integer) = unsafe_string(@ccall libsx.sx_status_string(status::Int32)::Cstring)

last_error_message() = unsafe_string(@ccall libsx.sx_last_error_message()::Cstring)

# Must run on the thread (task) that made the call, before any other sx call: the
# message is thread-local. Calls are not interrupted by task switches (no yield point).
check(status::Int32) = status == SX_OK ? nothing : throw(SXError(status, last_error_message()))

# `s` as a String for C, refused where it holds a NUL (C would read only up to it: another
# name or path than the one given).
function _c_string(what::AbstractString, s::AbstractString)
    t = String(s)
    occursin('\0', t) && throw(SXError(SX_ERR_INVALID_ARGUMENT, "$what $(repr(t)) holds a NUL character"))
    t
end

# A param's shape as Int64s: each dimension an Integer, never a Bool, a float or the
# characters of a string, which Int64 would quietly turn into another shape.
function _dims(name::AbstractString, shape)
    ok = !(shape isa AbstractString) && applicable(iterate, shape) &&
         all(d -> d isa Integer && !(d isa Bool), shape)
    ok || throw(SXError(SX_ERR_INVALID_ARGUMENT, "add_param!: shape of $(repr(name)) must be integers, not $(repr(shape))"))
    Int64[d for d in shape]
end

# A call that may block for long (a collective, a wait): the thread is marked GC-safe
# for its duration, so that other threads (the other ranks of a local:// group) can
# collect garbage meanwhile instead of waiting for this one. Its arguments must be
# plain values and pointers computed beforehand (under GC.@preserve): nothing may
# allocate or touch Julia objects between enter and leave.
macro blocking(call)
    quote
        local gc_state = @ccall jl_gc_safe_enter()::Int8
        local status = $(esc(call))
        @ccall jl_gc_safe_leave(gc_state::Int8)::Cvoid
        status
    end
end

"""The runtime's version as a `VersionNumber`."""
function version()
    n = @ccall libsx.sx_version()::UInt32
    VersionNumber(n ÷ 10000, n ÷ 100 % 100, n % 100)
end

function check_version(v::VersionNumber, binding=BINDING_VERSION)
    if v.major != binding[1] || v.minor < binding[2]
        error("libsx $v does not fit this binding, which needs $(binding[1]).x with x >= " *
              "$(binding[2]) (set SX_LIBRARY to a matching libsx.so)")
    end
end

function __init__()
    path = get(ENV, "SX_LIBRARY", "")
    if !isempty(path)
        pushfirst!(Libdl.DL_LOAD_PATH, dirname(abspath(path)))
        Libdl.dlopen(abspath(path))
    end
    check_version(version())
end

# ----------------------------------------------------------------------------------
# Logging
# ----------------------------------------------------------------------------------
const _log_callback = Ref{Any}(nothing)

function _log_trampoline(level::Int32, message::Cstring, ::Ptr{Cvoid})::Cvoid
    f = _log_callback[]
    f === nothing || try
        f(Int(level), unsafe_string(message))
    catch e
        @error "sx log callback failed" exception = e
    end
    nothing
end

"""
    set_log_callback(f; max_level=SX_LOG_INFO)

Routes sx's messages to `f(level, message)`; `nothing` turns logging off. `f` may run
on sx's own threads (this needs Julia >= 1.9, which adopts foreign threads).
"""
function set_log_callback(f; max_level::Integer=SX_LOG_INFO)
    _log_callback[] = f
    fn = f === nothing ? C_NULL : @cfunction(_log_trampoline, Cvoid, (Int32, Cstring, Ptr{Cvoid}))
    check(@ccall libsx.sx_set_log_callback(fn::Ptr{Cvoid}, C_NULL::Ptr{Cvoid}, max_level::Int32)::Int32)
end

# ----------------------------------------------------------------------------------
# Shard groups
# ----------------------------------------------------------------------------------
"""
    ShardGroup(rendezvous, rank, world_size; stage=0, backend=SX_BACKEND_AUTO, ...)

This rank's handle of a shard group (collective: blocks until every rank joined).
`backend=SX_BACKEND_AUTO` is CUDA where libsx has CUDA and finds a device, else the CPU;
views wrapped as Arrays need host memory: ask for `SX_BACKEND_CPU`.

`transport`: how CPU ranks exchange. `:auto`: through shared memory where every rank of a
communicator runs on this host (processes or threads), else Gloo's TCP (the environment
variable SX_SHARED_MEMORY=0 has `:auto` act as `:tcp`); `:tcp`: Gloo's TCP always (a
String names them too). Every rank passes the same; CUDA groups use NCCL whatever it says.
Anything else throws an `SXError` with `SX_ERR_INVALID_ARGUMENT`.

Release it with `close(g)` or the `with_group` do-block; a finalizer closes a forgotten
one as a safety net. Views into it are invalid after `close`. Every view keeps the group
from its finalizer while the view is alive (the group is only destroyed by the garbage
collector once no view over its memory is left), but an explicit `close` releases the
memory at once: do not use a view after it.

Mixed precision: `grad_dtype=SX_DTYPE_F32` gives every param an fp32 gradient (default
0: the param's own dtype); `reduce_dtype=SX_DTYPE_F32` sums 16-bit gradients over ranks
in fp32 (default 0: in their own dtype).

Stage 3 shards the params too: a unit's params exist only between `gather_unit!` and
`release_unit!`; `prefetch_depth` units are gathered ahead (0: 1; `SX_PREFETCH_NONE`:
none).

HSDP: `shard_size` ranks (a divisor of `world_size`; 0: all of them) shard the model, and
the `world_size ÷ shard_size` groups of them replicate it; `grad_predivide_factor`
divides 16-bit gradients before their sum (0: FSDP's factor).

The step timeline (docs/tracing.md): `trace_path` names the Chrome trace-event JSON file
this rank writes ("%r" becomes the rank; without one, ".rank<N>" goes before ".json");
`nothing`: the SX_TRACE environment variable's, if set. `trace_events` is the most events
kept (0: 65536). The file is written by `flush_trace` and by `close`.

Rendezvous security (tcp://, and env:// where rank 0 serves sx's store):
`rendezvous_token` is the secret every rank proves it holds before the store serves it
(`nothing`: the SX_RENDEZVOUS_TOKEN environment variable); a wrong or missing one throws
an `SXError` with `SX_ERR_INVALID_ARGUMENT`. `rendezvous_bind` is where rank 0's server
listens (`nothing`: SX_RENDEZVOUS_BIND, or the rendezvous host's address; "*": every
interface).

`memory_copy_interval=N`: every N steps each rank keeps a copy of its shard of the state
in host memory (a flat group's ranks send theirs to the next rank too), from which
`regroup!` restores the survivors without a checkpoint; 0 = none. CPU groups only.
`memory_copy_wait=true`: a step that takes a copy returns once the next rank holds it, so
that no step that returned is taken again after a loss (SX_GROUP_MEMORY_COPY_WAIT).

`join=true`: this process joins a running group on `rendezvous` (SX_GROUP_JOIN): it
connects to nobody (`rank` and `world_size` are ignored); register the params and param
groups as the members have them, `finalize!`, then `regroup!` waits until the members admit
it (their `poll_joiners`, then `regroup!(g; admit=n)`).
"""
mutable struct ShardGroup
    handle::Ptr{Cvoid}
    # Arrays over the group's memory that are still alive (see _lend).
    loans::Threads.Atomic{Int}
    function ShardGroup(rendezvous::AbstractString, rank::Integer, world_size::Integer;
                        stage::Integer=0, backend::Integer=SX_BACKEND_AUTO,
                        num_threads::Integer=0, alignment::Integer=0, timeout_ms::Integer=0,
                        trainable_autodetect::Bool=true, reserve_checkpoint_staging::Bool=false,
                        bind_address::Union{Nothing,AbstractString}=nothing,
                        device_ordinal::Integer=0, grad_dtype::Integer=0, reduce_dtype::Integer=0,
                        prefetch_depth::Integer=0, shard_size::Integer=0,
                        grad_predivide_factor::Real=0.0,
                        trace_path::Union{Nothing,AbstractString}=nothing, trace_events::Integer=0,
                        rendezvous_token::Union{Nothing,AbstractString}=nothing,
                        rendezvous_bind::Union{Nothing,AbstractString}=nothing,
                        transport::Union{Symbol,AbstractString}=:auto,
                        memory_copy_interval::Integer=0, memory_copy_wait::Bool=false, join::Bool=false)
        transport_value = _transport(transport)
        cfg = _blank(GroupConfig)
        check(@ccall libsx.sx_group_config_init(cfg::Ref{GroupConfig}, sizeof(GroupConfig)::Csize_t)::Int32)
        rdv = _c_string("rendezvous", rendezvous)
        bind = bind_address === nothing ? nothing : _c_string("bind_address", bind_address)
        trace = trace_path === nothing ? nothing : _c_string("trace_path", trace_path)
        token = rendezvous_token === nothing ? nothing : _c_string("rendezvous_token", rendezvous_token)
        rbind = rendezvous_bind === nothing ? nothing : _c_string("rendezvous_bind", rendezvous_bind)
        out = Ref{Ptr{Cvoid}}(C_NULL)
        GC.@preserve rdv bind trace token rbind cfg out begin
            cfg.rendezvous = pointer(rdv)
            cfg.bind_address = bind === nothing ? C_NULL : pointer(bind)
            cfg.trace_path = trace === nothing ? C_NULL : pointer(trace)
            cfg.trace_events = trace_events
            cfg.rendezvous_token = token === nothing ? C_NULL : pointer(token)
            cfg.rendezvous_bind = rbind === nothing ? C_NULL : pointer(rbind)
            cfg.rank, cfg.world_size, cfg.stage, cfg.backend = rank, world_size, stage, backend
            cfg.transport = transport_value
            cfg.memory_copy_interval = memory_copy_interval
            cfg.num_threads, cfg.alignment, cfg.timeout_ms = num_threads, alignment, timeout_ms
            cfg.flags = (trainable_autodetect ? UInt32(0) : SX_GROUP_NO_TRAINABLE_AUTODETECT) |
                        (reserve_checkpoint_staging ? SX_GROUP_RESERVE_CHECKPOINT_STAGING : UInt32(0)) |
                        (join ? SX_GROUP_JOIN : UInt32(0)) |
                        (memory_copy_wait ? SX_GROUP_MEMORY_COPY_WAIT : UInt32(0))
            cfg.device_ordinal = device_ordinal
            cfg.grad_dtype, cfg.reduce_dtype = grad_dtype, reduce_dtype
            cfg.prefetch_depth = prefetch_depth
            cfg.shard_size, cfg.grad_predivide_factor = shard_size, grad_predivide_factor
            cp, op = _ptr(cfg), Base.unsafe_convert(Ptr{Ptr{Cvoid}}, out)
            check(@blocking @ccall libsx.sx_create_shard_group(cp::Ptr{GroupConfig}, op::Ptr{Ptr{Cvoid}})::Int32)
        end
        g = new(out[], Threads.Atomic{Int}(0))
        finalizer(_finalize_group, g)
    end
end

const _TRANSPORTS = Dict(:auto => SX_TRANSPORT_AUTO, :tcp => SX_TRANSPORT_TCP)

_transport(t::AbstractString) = _transport(Symbol(t))
function _transport(t::Symbol)
    haskey(_TRANSPORTS, t) ||
        throw(SXError(SX_ERR_INVALID_ARGUMENT, "transport must be one of $(sort(collect(keys(_TRANSPORTS)))), not :$t"))
    _TRANSPORTS[t]
end

"""Releases the group (idempotent). Views obtained from it are invalid afterwards."""
function Base.close(g::ShardGroup)
    h, g.handle = g.handle, C_NULL
    h == C_NULL || @blocking @ccall libsx.sx_destroy_shard_group(h::Ptr{Cvoid})::Int32
    nothing
end

# The safety net run by the GC: a plain call, since a finalizer must not change the
# thread's GC state. While arrays over the group's memory are alive, it waits for a
# later collection: a finalizer that refers to the group (the arrays' own, see _lend)
# does not keep the GC from scheduling the group's finalizer, so the group is kept by
# registering this finalizer again.
function _finalize_group(g::ShardGroup)
    if g.loans[] > 0
        finalizer(_finalize_group, g)
        return nothing
    end
    h, g.handle = g.handle, C_NULL
    h == C_NULL || @ccall libsx.sx_destroy_shard_group(h::Ptr{Cvoid})::Int32
    nothing
end

Base.isopen(g::ShardGroup) = g.handle != C_NULL

# An array over the group's memory (a view) keeps the group from its finalizer: the
# array's own finalizer holds the group and counts the loan back.
struct _Loan
    group::ShardGroup
end
(loan::_Loan)(_) = (Threads.atomic_sub!(loan.group.loans, 1); nothing)

function _lend(g::ShardGroup, a::Array)
    Threads.atomic_add!(g.loans, 1)
    finalizer(_Loan(g), a)
end

"""How many arrays over the group's memory (views) are alive."""
loans(g::ShardGroup) = g.loans[]

function _handle(g::ShardGroup)
    g.handle == C_NULL && throw(SXError(SX_ERR_INVALID_HANDLE, "the ShardGroup is closed"))
    g.handle
end

"""`with_group(f, args...; kw...)`: `f(g)` with a new group, closed afterwards."""
function with_group(f, args...; kw...)
    g = ShardGroup(args...; kw...)
    try
        f(g)
    finally
        close(g)
    end
end

abort!(g::ShardGroup) = check(@ccall libsx.sx_abort(_handle(g)::Ptr{Cvoid})::Int32)

"""
    regroup!(g, checkpoint=nothing; join_window_ms=0, expected_world_size=0, admit=0, params_only=false,
             allow_missing=false, allow_extra=false)

Collective over the ranks still alive, after a call failed because a peer was lost (or
after `abort!`): they form a new group of themselves at the next epoch, on the same
rendezvous, and `g` becomes it. Its state comes from the ranks' memory copies where the
group keeps them (`memory_copy_interval`) and they still hold every shard, else from
`checkpoint` (resharded; `nothing`: there is none). The survivors wait for each other
until `expected_world_size` arrived, or (0) every rank arrived or is known to be lost
(`lost_ranks`), or `join_window_ms` (0: 1000) passed. Where it fails, `g` is still the
broken group, and the survivors may regroup again (a new epoch). Every view taken before
is invalid afterwards. The rendezvous store must outlive
the lost ranks: the sx-rendezvous command (`tcp://HOST:PORT?server=external`), `file://`,
or torchrun's. Returns `(epoch, rank, world_size, shard_size, previous_rank,
previous_world_size, step, from_memory)`; go on from the step after `step`.
"""
function regroup!(g::ShardGroup, checkpoint::Union{Nothing,AbstractString}=nothing; join_window_ms::Integer=0,
                  expected_world_size::Integer=0, admit::Integer=0, params_only::Bool=false, allow_missing::Bool=false,
                  allow_extra::Bool=false)
    o, r = _blank(RegroupOptions), _blank(RegroupResult)
    check(@ccall libsx.sx_regroup_options_init(o::Ref{RegroupOptions}, sizeof(RegroupOptions)::Csize_t)::Int32)
    check(@ccall libsx.sx_regroup_result_init(r::Ref{RegroupResult}, sizeof(RegroupResult)::Csize_t)::Int32)
    o.load_flags = (params_only ? SX_LOAD_PARAMS_ONLY : 0x0) | (allow_missing ? SX_LOAD_ALLOW_MISSING : 0x0) |
                   (allow_extra ? SX_LOAD_ALLOW_EXTRA : 0x0)
    o.join_window_ms = Int32(join_window_ms)
    o.expected_world_size = Int32(expected_world_size)
    o.admit = Int32(admit)
    p = checkpoint === nothing ? nothing : _c_string("checkpoint", checkpoint)
    h = _handle(g)
    GC.@preserve p o r begin
        o.checkpoint = p === nothing ? C_NULL : pointer(p)
        op, rp = _ptr(o), _ptr(r)
        check(@blocking @ccall libsx.sx_regroup(h::Ptr{Cvoid}, op::Ptr{RegroupOptions}, rp::Ptr{RegroupResult})::Int32)
    end
    (epoch=Int(r.epoch), rank=Int(r.rank), world_size=Int(r.world_size), shard_size=Int(r.shard_size),
     previous_rank=Int(r.previous_rank), previous_world_size=Int(r.previous_world_size), step=Int(r.step),
     from_memory=r.from_memory != 0)
end

"""
    poll_joiners(g)

Collective: how many processes wait to join the group (`join=true` on its rendezvous) and
were not admitted yet, the same on every rank. Admit them with `regroup!(g; admit=n)` on
every member at the same step.
"""
function poll_joiners(g::ShardGroup)
    n, h = Int32[0], _handle(g)
    GC.@preserve n begin
        p = pointer(n)
        check(@blocking @ccall libsx.sx_poll_joiners(h::Ptr{Cvoid}, p::Ptr{Int32})::Int32)
    end
    Int(n[1])
end

"""
    lost_ranks(g)

The ranks (ascending) whose process is known to have exited: a peer on this host whose
process has gone. Peers on other hosts are known only through the errors their loss
causes. After a failure, `expected_world_size = world_size(g) - length(lost_ranks(g))`
lets `regroup!` close without waiting for its window. A failed group answers too.
"""
function lost_ranks(g::ShardGroup)
    count, h = Int32[0], _handle(g)
    GC.@preserve count begin
        check(@ccall libsx.sx_get_lost_ranks(h::Ptr{Cvoid}, C_NULL::Ptr{Int32}, 0::Int32,
                                             pointer(count)::Ptr{Int32})::Int32)
    end
    while true  # (another may be lost between the two calls: then again, with room for it)
        ranks = zeros(Int32, count[1] + 1)
        GC.@preserve ranks count begin
            check(@ccall libsx.sx_get_lost_ranks(h::Ptr{Cvoid}, pointer(ranks)::Ptr{Int32},
                                                 Int32(length(ranks))::Int32, pointer(count)::Ptr{Int32})::Int32)
        end
        count[1] <= length(ranks) && return Int.(ranks[1:count[1]])
    end
end

"""
    flush_trace(g)

Writes this rank's trace file now (replaced atomically) with every event the ring holds;
nothing without a trace. An `SXError` (SX_ERR_IO) naming the file if it cannot be written.
"""
flush_trace(g::ShardGroup) = check(@ccall libsx.sx_trace_flush(_handle(g)::Ptr{Cvoid})::Int32)

const _OPTIMIZERS = Dict(:sgd => SX_OPTIM_SGD, :adam => SX_OPTIM_ADAM, :adamw => SX_OPTIM_ADAMW,
                         :adagrad => SX_OPTIM_ADAGRAD, :rmsprop => SX_OPTIM_RMSPROP,
                         :adamax => SX_OPTIM_ADAMAX, :nadam => SX_OPTIM_NADAM,
                         :radam => SX_OPTIM_RADAM, :lion => SX_OPTIM_LION, :lamb => SX_OPTIM_LAMB,
                         :muon => SX_OPTIM_MUON, :adafactor => SX_OPTIM_ADAFACTOR)
# Keywords of add_param_group! that are flags (Int32 fields of the descriptor), numbers
# and integers.
const _FLAG_FIELDS = (:nesterov, :maximize, :amsgrad, :centered, :decoupled_weight_decay)
const _FLOAT_FIELDS = (:lr, :weight_decay, :beta1, :beta2, :eps, :momentum, :dampening,
                       :lr_decay, :initial_accumulator_value, :alpha, :momentum_decay,
                       :ns_a, :ns_b, :ns_c, :beta2_decay, :eps2, :d)
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

"""
    add_param_group!(g, optimizer=:adamw; lr, weight_decay, betas, eps, momentum, ...)

Adds a param group and returns its 0-based index. `optimizer` is one of `:sgd`, `:adam`,
`:adamw`, `:adagrad`, `:rmsprop`, `:adamax`, `:nadam`, `:radam`, `:lion`, `:lamb`, `:muon`,
`:adafactor` (the last three: CPU groups only; Muon takes 2-D params only); what is not
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
machine epsilon, 2^-23). One that does not apply to the optimizer must keep its default or
be 0, which means the default (else an `SXError` with SX_ERR_INVALID_ARGUMENT).
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
                    unit::Integer=0, dtype::Integer=SX_DTYPE_F32, frozen::Bool=false)
    desc = _blank(ParamDesc)
    check(@ccall libsx.sx_param_desc_init(desc::Ref{ParamDesc}, sizeof(ParamDesc)::Csize_t)::Int32)
    s, dims = _c_string("name", name), _dims(name, shape)
    index = Ref{Int32}(0)
    GC.@preserve s dims begin  # borrowed for the call; sx copies both
        desc.name, desc.shape, desc.ndim = pointer(s), pointer(dims), length(dims)
        desc.dtype, desc.param_group, desc.unit, desc.frozen = dtype, param_group, unit, frozen
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

const _ELTYPES = Dict(SX_DTYPE_F32 => Float32, SX_DTYPE_F16 => Float16, SX_DTYPE_BF16 => UInt16)

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

"""Bytes this rank holds per category, as a NamedTuple."""
function memory_stats(g::ShardGroup)
    s = _blank(MemoryStats)
    check(@ccall libsx.sx_memory_stats_init(s::Ref{MemoryStats}, sizeof(MemoryStats)::Csize_t)::Int32)
    check(@ccall libsx.sx_get_memory_stats(_handle(g)::Ptr{Cvoid}, s::Ref{MemoryStats})::Int32)
    (param_bytes=Int(s.param_bytes), grad_bytes=Int(s.grad_bytes),
     optimizer_bytes=Int(s.optimizer_bytes), staging_bytes=Int(s.staging_bytes),
     unsharded_optimizer_bytes=Int(s.unsharded_optimizer_bytes),
     peak_param_bytes=Int(s.peak_param_bytes), memory_copy_bytes=Int(s.memory_copy_bytes))
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
"master"; `p` a name or 0-based index) as a zero-copy `Vector{Float32}` over sx's memory:
the param's elements `shard_begin+1:shard_end` of `param_info` (empty where this rank
holds none of it). Read it, or write it between steps to seed the state. Invalid after
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
    v.numel == 0 && return Float32[]
    _lend(g, unsafe_wrap(Array, Ptr{Float32}(v.data), Int(v.numel); own=false))
end

# ----------------------------------------------------------------------------------
# Custom optimizers (sx 1.5)
# ----------------------------------------------------------------------------------
"""
    OptimizerPiece

One contiguous piece of a param's elements in this rank's shard, as sx hands it to a
custom optimizer's update, lent for the call (keep none of its arrays): `param` (the n
fp32 values, the fp32 masters of 16-bit params, to update in place), `grad` (the n
reduced gradients, summed over the ranks: use `grad[i] * grad_scale`; do not write it),
`state` (one `Vector{Float32}` per slot, in registration order, to update in place),
`hyperparameters` (the param group's values in registration order), `grad_scale` (the
average over ranks, the loss scale and the clipping coefficient in one factor),
`param_index` and `param_group` (0-based), `offset` (param[1]'s 0-based element offset in
the param, row-major) and `step` (the param's step count including this update).
"""
struct OptimizerPiece
    param::Vector{Float32}
    grad::Vector{Float32}
    state::Vector{Vector{Float32}}
    hyperparameters::Vector{Float64}
    grad_scale::Float32
    param_index::Int
    param_group::Int
    offset::Int
    step::Int
end

# A registration: what the update callback reaches through its user_data. Kept in
# _custom_optimizers for the life of the process (sx never forgets a registration).
mutable struct _CustomOptimizer
    id::Int32
    name::String
    slots::Vector{String}
    names::Vector{String}      # every hyperparameter, in registration order
    own_names::Vector{String}  # its own ones: key SX_HP_CUSTOM + i
    update::Any
    failure::Any               # what the update last threw, or nothing
end

const _custom_optimizers = _CustomOptimizer[]
const _custom_lock = ReentrantLock()

function _custom_optimizer(key)
    lock(_custom_lock) do
        i = findfirst(c -> key isa AbstractString ? c.name == key : c.id == key, _custom_optimizers)
        i === nothing ? nothing : _custom_optimizers[i]
    end
end

# sx's own hyperparameter names (a custom optimizer's other names are its own).
const _STANDARD_HYPERPARAMETERS = ("lr", "weight_decay", "beta1", "beta2", "eps", "momentum", "dampening",
                                   "nesterov", "maximize", "amsgrad", "lr_decay", "initial_accumulator_value",
                                   "alpha", "centered", "momentum_decay", "decoupled_weight_decay",
                                   "ns_a", "ns_b", "ns_c", "ns_steps", "adjust_lr", "beta2_decay", "eps2", "d")

# Writes `message` into the piece's error buffer, which sx puts in the step's
# SX_ERR_OPTIMIZER message: at most error_size - 1 bytes, cut at a UTF-8 character
# boundary, then a NUL. Nothing when the library's piece has no buffer.
function _write_piece_error(pc::RawOptimizerPiece, message::AbstractString)
    (pc.struct_size < sizeof(RawOptimizerPiece) || pc.error == C_NULL || pc.error_size == 0) && return
    s = String(message)
    bytes = codeunits(s)
    n = min(length(bytes), Int(pc.error_size) - 1)
    while 0 < n < length(bytes) && (bytes[n+1] & 0xc0) == 0x80  # n+1 continues a character
        n -= 1
    end
    GC.@preserve s unsafe_copyto!(pc.error, pointer(s), n)
    unsafe_store!(pc.error, 0x00, n + 1)
    nothing
end

# sx calls this on its own worker threads, concurrently (Julia >= 1.9 adopts them). Nothing
# may unwind into C: an exception is kept (last_update_failure), described in the piece's
# error buffer (sprint(showerror, e)) and reported as -1.
function _optimizer_trampoline(raw::Ptr{RawOptimizerPiece})::Int32
    pc = unsafe_load(raw)
    reg = unsafe_pointer_to_objref(pc.user_data)::_CustomOptimizer
    try
        n = Int(pc.n)
        state = Vector{Vector{Float32}}(undef, length(reg.slots))
        for k in eachindex(state)
            state[k] = unsafe_wrap(Array, pc.state[k], n; own=false)
        end
        nh = length(reg.names)
        hps = nh == 0 ? Float64[] : unsafe_wrap(Array, pc.hyperparameters, nh; own=false)
        piece = OptimizerPiece(unsafe_wrap(Array, pc.param, n; own=false), unsafe_wrap(Array, pc.grad, n; own=false),
                               state, hps, pc.grad_scale, Int(pc.param_index), Int(pc.param_group), Int(pc.offset),
                               Int(pc.step))
        r = reg.update(piece)
        if r isa Integer && !(r isa Bool) && r != 0
            code = Int32(r)
            _write_piece_error(pc, "update returned $code")
            return code
        end
        return Int32(0)
    catch e
        reg.failure = e
        try
            _write_piece_error(pc, sprint(showerror, e))
        catch
        end
        return Int32(-1)
    end
end

"""
    register_optimizer(update, name, slots; hyperparameters=(), slot_initial_values=nothing, in_place=false)
    register_optimizer(name, slots; hyperparameters=...) do piece ... end

Registers a custom optimizer for this process and returns its id (an `Int32` >=
`SX_OPTIM_CUSTOM_FIRST`), which `add_param_group!(g, id; ...)` takes like a built-in
(as does `add_param_group!(g, Symbol(name))`). `name`: unique, 1-63 of [A-Za-z0-9_.-].
`slots`: its state slots' names (at most `SX_MAX_CUSTOM_SLOTS`, distinct, of
[A-Za-z0-9_]), which checkpoints and `gather_optim_state` use. `hyperparameters`: pairs
`name => default` or tuples `(name, default, min, max)` (both 0: any finite value), in the
order `piece.hyperparameters` holds them; a name of sx's own ("lr", "beta1", ...) is that
hyperparameter (its keyword, key and range), any other is the optimizer's own, with key
`SX_HP_CUSTOM + i` (i counting its own from 0), and an `add_param_group!` keyword.
`slot_initial_values`: what each slot holds before a param's first update (`nothing`: 0).
`in_place=true` registers it `SX_OPTIMIZER_IN_PLACE`: sx updates params and slots in place,
without the second slot buffers and the copy of the params that let a failed update change
nothing (half the update's memory traffic, no extra memory); a failure then leaves the step
half done and fails the group (only `close` is left), so it is for an update that cannot fail.

`update(piece::OptimizerPiece)` updates `piece.param` and `piece.state` in place and
returns `nothing` (a nonzero integer reports failure with that value; an exception is
kept, see `last_update_failure`, and reported as -1). A failure fails the step on every
rank with `SX_ERR_OPTIMIZER`, whose message ends with `sprint(showerror, e)` (or "update
returned N"), and changes nothing (unless `in_place`).

**Threads.** sx calls `update` from its own worker threads, several pieces at once, while
`step!` waits (GC-safe) on the calling thread: this needs Julia >= 1.9, which adopts
foreign threads, and is untested here (no Julia where the bindings are built: only the
static checks ran). Keep the update free of task switches and I/O (no `@spawn`, locks or
printing), allocate little (every piece allocates its array wrappers), and never call sx
from it. A trainer that cannot accept this writes its optimizer in C, Rust or Go.

Registration lasts as long as the process: the callback and its closure stay referenced
here. Registering a name again is `SX_ERR_ALREADY_EXISTS` (the same description with
the same `update` function included, since sx compares the registration's own pointer):
register once per process, before the ranks' tasks start, and share the id.
"""
function register_optimizer(update, name::AbstractString, slots::AbstractVector=String[];
                            hyperparameters=(), slot_initial_values=nothing, in_place::Bool=false)
    n = _c_string("name", name)
    slot_strs = String[_c_string("slot name", s) for s in slots]
    hps = Tuple{String,Float64,Float64,Float64}[]
    for h in hyperparameters
        if h isa Pair
            push!(hps, (_c_string("hyperparameter name", String(h.first)), Float64(h.second), 0.0, 0.0))
        elseif h isa Tuple && length(h) in (2, 4)
            push!(hps, (_c_string("hyperparameter name", String(h[1])), Float64.(length(h) == 2 ? (h[2], 0, 0) : h[2:4])...))
        else
            throw(SXError(SX_ERR_INVALID_ARGUMENT, "register_optimizer: a hyperparameter is name => default or " *
                                                   "(name, default, min, max), not $(repr(h))"))
        end
    end
    init = slot_initial_values === nothing ? Float32[] : Float32[Float32(v) for v in slot_initial_values]
    if slot_initial_values !== nothing && length(init) != length(slot_strs)
        throw(SXError(SX_ERR_INVALID_ARGUMENT, "register_optimizer: $(length(init)) slot_initial_values for " *
                                               "$(length(slot_strs)) slot(s)"))
    end
    names = String[h[1] for h in hps]
    reg = _CustomOptimizer(Int32(0), String(name), slot_strs, names,
                           filter(x -> !(x in _STANDARD_HYPERPARAMETERS), names), update, nothing)
    desc = _blank(OptimizerDesc)
    check(@ccall libsx.sx_optimizer_desc_init(desc::Ref{OptimizerDesc}, sizeof(OptimizerDesc)::Csize_t)::Int32)
    id = Ref{Int32}(0)
    slot_ptrs = Ptr{UInt8}[pointer(s) for s in slot_strs]
    chps = OptimizerHyperparameter[OptimizerHyperparameter(pointer(h[1]), h[2], h[3], h[4]) for h in hps]
    status = GC.@preserve n slot_strs hps slot_ptrs chps init reg desc begin  # sx copies all but reg
        desc.name = pointer(n)
        desc.num_slots = length(slot_strs)
        desc.slot_names = isempty(slot_ptrs) ? C_NULL : pointer(slot_ptrs)
        desc.slot_initial_values = slot_initial_values === nothing ? C_NULL : pointer(init)
        desc.num_hyperparameters = length(chps)
        desc.hyperparameters = isempty(chps) ? C_NULL : pointer(chps)
        desc.update = update === nothing ? C_NULL :
                      @cfunction(_optimizer_trampoline, Int32, (Ptr{RawOptimizerPiece},))
        desc.user_data = pointer_from_objref(reg)
        desc.flags = in_place ? SX_OPTIMIZER_IN_PLACE : UInt32(0)
        @ccall libsx.sx_register_optimizer(desc::Ref{OptimizerDesc}, id::Ref{Int32})::Int32
    end
    check(status)  # no yield point since the call: the message is still this thread's
    reg.id = id[]
    lock(() -> push!(_custom_optimizers, reg), _custom_lock)  # rooted for the process
    id[]
end

register_optimizer(name::AbstractString, slots::AbstractVector=String[]; kw...) =
    throw(SXError(SX_ERR_INVALID_ARGUMENT, "register_optimizer: no update function (pass it first, or as a do-block)"))

"""The exception a custom optimizer's update (by id or name) last threw, or `nothing`."""
function last_update_failure(optimizer)
    c = _custom_optimizer(optimizer isa Symbol ? String(optimizer) : optimizer isa Integer ? Int32(optimizer) : optimizer)
    c === nothing ? nothing : c.failure
end

"""The key of a custom optimizer's own hyperparameter `i` (0-based, counting its own)."""
custom_hyperparameter(i::Integer) = SX_HP_CUSTOM + Int32(i)

# ----------------------------------------------------------------------------------
# Checkpoints
# ----------------------------------------------------------------------------------
"""
A save in progress. `wait(f; timeout)`, `poll(f)`, `cancel(f)`, `progress(f)`; release
it with `close(f)` (waits for the save) or a do-block; a finalizer is the safety net.
"""
mutable struct Future
    handle::Ptr{Cvoid}
    callback::Any
    status::Int32
end

# Futures whose callback sx may still call; the C side holds a pointer to them.
const _pending = Set{Future}()
const _pending_lock = ReentrantLock()

function _future_trampoline(::Ptr{Cvoid}, status::Int32, user::Ptr{Cvoid})::Cvoid
    f = unsafe_pointer_to_objref(user)::Future
    f.status = status
    try
        f.callback(f, Int(status))
    catch e
        @error "sx save callback failed" exception = e
    end
    nothing
end

function Base.close(f::Future)
    h, f.handle = f.handle, C_NULL
    h == C_NULL || @blocking @ccall libsx.sx_future_destroy(h::Ptr{Cvoid})::Int32
    lock(() -> delete!(_pending, f), _pending_lock)  # no callback can come any more
    nothing
end

function _finalize_future(f::Future)  # see _finalize_group
    h, f.handle = f.handle, C_NULL
    h == C_NULL || @ccall libsx.sx_future_destroy(h::Ptr{Cvoid})::Int32
    nothing
end

function _fhandle(f::Future)
    f.handle == C_NULL && throw(SXError(SX_ERR_INVALID_HANDLE, "the Future is closed"))
    f.handle
end

"""Waits for the save (`timeout` in seconds, `nothing` = forever); throws SXError on failure."""
function Base.wait(f::Future; timeout::Union{Nothing,Real}=nothing)
    ms = timeout === nothing ? Int64(-1) : Int64(round(timeout * 1000))
    h = _fhandle(f)
    status = @blocking @ccall libsx.sx_future_wait(h::Ptr{Cvoid}, ms::Int64)::Int32
    status == SX_OK && return nothing
    msg = unsafe_string(@ccall libsx.sx_future_error_message(h::Ptr{Cvoid})::Cstring)
    throw(SXError(status, isempty(msg) ? last_error_message() : msg))
end

"""Waits until the snapshot has been copied out of the group's memory (after that,
params may be written through views without reaching this checkpoint)."""
function wait_staged(f::Future; timeout::Union{Nothing,Real}=nothing)
    ms = timeout === nothing ? Int64(-1) : Int64(round(timeout * 1000))
    h = _fhandle(f)
    check(@blocking @ccall libsx.sx_future_wait_staged(h::Ptr{Cvoid}, ms::Int64)::Int32)
end

"""True once the save has completed."""
function poll(f::Future)
    done = Ref{Int32}(0)
    check(@ccall libsx.sx_future_poll(_fhandle(f)::Ptr{Cvoid}, done::Ref{Int32})::Int32)
    done[] != 0
end

cancel(f::Future) = check(@ccall libsx.sx_future_cancel(_fhandle(f)::Ptr{Cvoid})::Int32)

"""(bytes written so far, bytes in all) of this rank's files."""
function progress(f::Future)
    done, total = Ref{UInt64}(0), Ref{UInt64}(0)
    check(@ccall libsx.sx_future_progress(_fhandle(f)::Ptr{Cvoid}, done::Ref{UInt64}, total::Ref{UInt64})::Int32)
    (Int(done[]), Int(total[]))
end

"""
    save(g, path; user_blob=UInt8[], keep_last=0, synchronous=false, callback=nothing)

Collective: saves this step boundary to the new directory `path`; returns a `Future`.
`callback(future, status)` runs once on sx's I/O thread when the save completes.
With a do-block, `save(g, path) do f ... end` closes the future afterwards.
"""
function save(g::ShardGroup, path::AbstractString; user_blob::AbstractVector{UInt8}=UInt8[],
              keep_last::Integer=0, synchronous::Bool=false, callback=nothing)
    o = _blank(SaveOptions)
    check(@ccall libsx.sx_save_options_init(o::Ref{SaveOptions}, sizeof(SaveOptions)::Csize_t)::Int32)
    p, blob = _c_string("path", path), Vector{UInt8}(user_blob)
    f = Future(C_NULL, callback, Int32(-1))
    out = Ref{Ptr{Cvoid}}(C_NULL)
    h = _handle(g)
    if callback !== nothing
        lock(() -> push!(_pending, f), _pending_lock)  # keeps f alive while sx holds it
        o.callback = @cfunction(_future_trampoline, Cvoid, (Ptr{Cvoid}, Int32, Ptr{Cvoid}))
        o.callback_user = pointer_from_objref(f)
    end
    status = GC.@preserve p blob f o out begin  # path and blob are copied during the call
        o.path, o.user_blob, o.user_blob_size = pointer(p), pointer(blob), length(blob)
        o.keep_last, o.synchronous = keep_last, synchronous
        sp, op = _ptr(o), Base.unsafe_convert(Ptr{Ptr{Cvoid}}, out)
        @blocking @ccall libsx.sx_save_optim_state(h::Ptr{Cvoid}, sp::Ptr{SaveOptions}, op::Ptr{Ptr{Cvoid}})::Int32
    end
    if status != SX_OK
        err = SXError(status, last_error_message())
        lock(() -> delete!(_pending, f), _pending_lock)
        throw(err)
    end
    f.handle = out[]
    finalizer(_finalize_future, f)
end

function save(body::Function, g::ShardGroup, path::AbstractString; kw...)
    f = save(g, path; kw...)
    try
        body(f)
    finally
        close(f)
    end
end

"""
    load!(g, path; params_only=false, allow_missing=false, allow_extra=false)

Collective: loads a checkpoint saved at any world size into `g`.
"""
function load!(g::ShardGroup, path::AbstractString; params_only::Bool=false,
               allow_missing::Bool=false, allow_extra::Bool=false)
    o = _blank(LoadOptions)
    check(@ccall libsx.sx_load_optim_state_options_init(o::Ref{LoadOptions}, sizeof(LoadOptions)::Csize_t)::Int32)
    o.flags = (params_only ? SX_LOAD_PARAMS_ONLY : 0x0) | (allow_missing ? SX_LOAD_ALLOW_MISSING : 0x0) |
              (allow_extra ? SX_LOAD_ALLOW_EXTRA : 0x0)
    p = _c_string("path", path)
    h = _handle(g)
    GC.@preserve p o begin
        o.path = pointer(p)
        lp = _ptr(o)
        check(@blocking @ccall libsx.sx_load_optim_state(h::Ptr{Cvoid}, lp::Ptr{LoadOptions})::Int32)
    end
end

"""The user blob stored in the checkpoint at `path`, as a `Vector{UInt8}`."""
function read_user_blob(path::AbstractString)
    path = _c_string("path", path)
    size = Ref{UInt64}(0)
    buf = Vector{UInt8}(undef, 4096)
    while true
        status = GC.@preserve buf @ccall libsx.sx_read_user_blob(path::Cstring, buf::Ptr{UInt8}, length(buf)::UInt64, size::Ref{UInt64})::Int32
        if status == SX_ERR_INVALID_ARGUMENT && size[] > length(buf)
            resize!(buf, Int(size[]))  # too small: sx said how much is needed
            continue
        end
        check(status)
        return resize!(buf, Int(size[]))
    end
end

end # module
