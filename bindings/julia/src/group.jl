# Part of module SX (src/SX.jl includes it): shard groups: creating, closing, aborting, the trace.

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
`regroup!` restores the survivors without a checkpoint; 0 = none. Any backend (a CUDA
group's copies are in host memory too).
`memory_copy_wait=true`: a step that takes a copy returns once the next rank holds it, so
that no step that returned is taken again after a loss (SX_GROUP_MEMORY_COPY_WAIT).
`openmp_threads=true`: in a process that runs an OpenMP runtime of its own, the optimizer
work of this group's calls runs on the calling thread's OpenMP team instead of the group's
own pool (SX_GROUP_OPENMP_THREADS; without such a runtime loaded, an SxError with
SX_ERR_UNSUPPORTED).

`offload=true` (SX_OFFLOAD_STATE): a CUDA group keeps its fp32 masters and optimizer state
in pinned host memory, where sx's CPU kernels update them, so that every optimizer runs on
it (`memory_stats(g).device_bytes` says what stays on the device); `false`
(SX_OFFLOAD_NONE): on its device. CPU groups ignore it.

`context`, `name`: the group is made in a `Context` under a name every rank passes (see
`ShardGroup(ctx, name; kw...)`, which passes them); it takes the context's rendezvous,
ranks, backend, pool, timeout and transport, so those arguments stay "", 0 or their
defaults (or equal the context's).

`join=true`: this process joins a running group on `rendezvous` (SX_GROUP_JOIN): it
connects to nobody (`rank` and `world_size` are ignored); register the params and param
groups as the members have them, `finalize!`, then `regroup!` waits until the members admit
it (their `poll_joiners`, then `regroup!(g; admit=n)`). With `name` (and no `context`): it
joins the group of that name made in the context on `rendezvous`.
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
                        memory_copy_interval::Integer=0, memory_copy_wait::Bool=false, join::Bool=false,
                        offload::Bool=false, context::Union{Nothing,Context}=nothing,
                        name::Union{Nothing,AbstractString}=nothing, openmp_threads::Bool=false)
        transport_value = _transport(transport)
        cfg = _blank(GroupConfig)
        check(@ccall libsx.sx_group_config_init(cfg::Ref{GroupConfig}, sizeof(GroupConfig)::Csize_t)::Int32)
        rdv = context !== nothing && isempty(rendezvous) ? nothing : _c_string("rendezvous", rendezvous)
        # The context's handle, borrowed for the call (the context lives while its groups do).
        ctx_handle = context === nothing ? C_NULL : _handle(context)
        group_name = name === nothing ? nothing : _c_string("name", name)
        bind = bind_address === nothing ? nothing : _c_string("bind_address", bind_address)
        trace = trace_path === nothing ? nothing : _c_string("trace_path", trace_path)
        token = rendezvous_token === nothing ? nothing : _c_string("rendezvous_token", rendezvous_token)
        rbind = rendezvous_bind === nothing ? nothing : _c_string("rendezvous_bind", rendezvous_bind)
        out = Ref{Ptr{Cvoid}}(C_NULL)
        GC.@preserve rdv bind trace token rbind group_name context cfg out begin
            cfg.rendezvous = rdv === nothing ? C_NULL : pointer(rdv)
            cfg.context = ctx_handle
            cfg.name = group_name === nothing ? C_NULL : pointer(group_name)
            cfg.bind_address = bind === nothing ? C_NULL : pointer(bind)
            cfg.trace_path = trace === nothing ? C_NULL : pointer(trace)
            cfg.trace_events = trace_events
            cfg.rendezvous_token = token === nothing ? C_NULL : pointer(token)
            cfg.rendezvous_bind = rbind === nothing ? C_NULL : pointer(rbind)
            cfg.rank, cfg.world_size, cfg.stage, cfg.backend = rank, world_size, stage, backend
            cfg.transport = transport_value
            cfg.memory_copy_interval = memory_copy_interval
            cfg.offload = offload ? SX_OFFLOAD_STATE : SX_OFFLOAD_NONE
            cfg.num_threads, cfg.alignment, cfg.timeout_ms = num_threads, alignment, timeout_ms
            cfg.flags = (trainable_autodetect ? UInt32(0) : SX_GROUP_NO_TRAINABLE_AUTODETECT) |
                        (reserve_checkpoint_staging ? SX_GROUP_RESERVE_CHECKPOINT_STAGING : UInt32(0)) |
                        (join ? SX_GROUP_JOIN : UInt32(0)) |
                        (memory_copy_wait ? SX_GROUP_MEMORY_COPY_WAIT : UInt32(0)) |
                        (openmp_threads ? SX_GROUP_OPENMP_THREADS : UInt32(0))
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

"""
    ShardGroup(ctx::Context, name; stage=0, ...)

A group made in the context `ctx` under `name` (collective; see `Context`). The keywords
are the other constructor's, but those the context owns (backend, num_threads, timeout_ms,
transport, the addresses, the token, device_ordinal), which stay at their defaults.
"""
ShardGroup(ctx::Context, name::AbstractString; kw...) = ShardGroup("", 0, 0; context=ctx, name=name, kw...)

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
    flush_trace(g)

Writes this rank's trace file now (replaced atomically) with every event the ring holds;
nothing without a trace. An `SXError` (SX_ERR_IO) naming the file if it cannot be written.
"""
flush_trace(g::ShardGroup) = check(@ccall libsx.sx_trace_flush(_handle(g)::Ptr{Cvoid})::Int32)
