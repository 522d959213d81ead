# Part of module SX (src/SX.jl includes it): contexts, many groups on one rendezvous, one
# transport and one thread pool (include/sx/sx_context.h).

"""
    Context(rendezvous, rank, world_size; backend=SX_BACKEND_AUTO, num_threads=0,
            timeout_ms=0, transport=:auto, bind_address=nothing, rendezvous_token=nothing,
            rendezvous_bind=nothing, device_ordinal=0, memory_budget_bytes=0)

This rank's handle of a context: what the groups made in it on the same ranks share (the
rendezvous, the transport and the thread pool), as a fine-tune service runs many tenants'
jobs on the same ranks. Creating one is collective, as a `ShardGroup` is; the arguments are
`ShardGroup`'s of the same names. `memory_budget_bytes` (0: none) caps what the context's
groups may hold on this rank: a `finalize!` that would exceed it throws an `SXError` with
`SX_ERR_OUT_OF_MEMORY` before anything is allocated.

Make groups in it with `ShardGroup(ctx, name; kw...)`: `name` is the same on every rank,
and no two live groups of a context share one (`SX_ERR_INVALID_STATE` otherwise). A group
takes the context's rendezvous, ranks, backend, pool, timeout and transport, and keeps its
failures, checkpoints and memory to itself.

Lifetime: the context lives while any group made in it does. `close(ctx)` (or the
`with_context` do-block, or a finalizer as a safety net) releases this handle only: the
groups already made go on, and the context closes with the last of them; no new group can
be made in it. `context_stats` may be called from any thread.
"""
mutable struct Context
    handle::Ptr{Cvoid}
    function Context(rendezvous::AbstractString, rank::Integer, world_size::Integer;
                     backend::Integer=SX_BACKEND_AUTO, num_threads::Integer=0, timeout_ms::Integer=0,
                     transport::Union{Symbol,AbstractString}=:auto,
                     bind_address::Union{Nothing,AbstractString}=nothing,
                     rendezvous_token::Union{Nothing,AbstractString}=nothing,
                     rendezvous_bind::Union{Nothing,AbstractString}=nothing,
                     device_ordinal::Integer=0, memory_budget_bytes::Integer=0)
        transport_value = _transport(transport)
        cfg = _blank(ContextConfig)
        check(@ccall libsx.sx_context_config_init(cfg::Ref{ContextConfig}, sizeof(ContextConfig)::Csize_t)::Int32)
        rdv = _c_string("rendezvous", rendezvous)
        bind = bind_address === nothing ? nothing : _c_string("bind_address", bind_address)
        token = rendezvous_token === nothing ? nothing : _c_string("rendezvous_token", rendezvous_token)
        rbind = rendezvous_bind === nothing ? nothing : _c_string("rendezvous_bind", rendezvous_bind)
        out = Ref{Ptr{Cvoid}}(C_NULL)
        GC.@preserve rdv bind token rbind cfg out begin
            cfg.rendezvous = pointer(rdv)
            cfg.bind_address = bind === nothing ? C_NULL : pointer(bind)
            cfg.rendezvous_token = token === nothing ? C_NULL : pointer(token)
            cfg.rendezvous_bind = rbind === nothing ? C_NULL : pointer(rbind)
            cfg.rank, cfg.world_size, cfg.backend = rank, world_size, backend
            cfg.num_threads, cfg.timeout_ms, cfg.transport = num_threads, timeout_ms, transport_value
            cfg.device_ordinal = device_ordinal
            cfg.memory_budget_bytes = memory_budget_bytes
            cp, op = _ptr(cfg), Base.unsafe_convert(Ptr{Ptr{Cvoid}}, out)
            check(@blocking @ccall libsx.sx_create_context(cp::Ptr{ContextConfig}, op::Ptr{Ptr{Cvoid}})::Int32)
        end
        finalizer(_finalize_context, new(out[]))
    end
end

"""Releases this handle (idempotent). The groups made in the context go on; no new group
can be made in it."""
function Base.close(ctx::Context)
    h, ctx.handle = ctx.handle, C_NULL
    h == C_NULL || @ccall libsx.sx_destroy_context(h::Ptr{Cvoid})::Int32
    nothing
end

# The safety net run by the GC (a plain call: destroying a context's handle does not block).
_finalize_context(ctx::Context) = close(ctx)

Base.isopen(ctx::Context) = ctx.handle != C_NULL

function _handle(ctx::Context)
    ctx.handle == C_NULL && throw(SXError(SX_ERR_INVALID_HANDLE, "the Context is closed"))
    ctx.handle
end

"""`with_context(f, args...; kw...)`: `f(ctx)` with a new context, closed afterwards."""
function with_context(f, args...; kw...)
    ctx = Context(args...; kw...)
    try
        f(ctx)
    finally
        close(ctx)
    end
end

"""
    context_stats(ctx)

What the context holds on this rank now, as a NamedTuple: `groups` alive, `groups_created`
since its creation, `channels` open on its transport (a group has 1 or more), `memory_bytes`
its groups hold as the budget counts them, `memory_budget_bytes` (0: none), and
`shared_memory` (its channels share memory: every rank on this host, or within each of
several hosts of as many ranks), and `transport_bytes` (what its Gloo channels keep on this
rank between their calls: blocks their calls reuse, and what calls that ended early left;
not in `memory_bytes`). Any thread.
"""
function context_stats(ctx::Context)
    s = _blank(ContextStats)
    check(@ccall libsx.sx_context_stats_init(s::Ref{ContextStats}, sizeof(ContextStats)::Csize_t)::Int32)
    check(@ccall libsx.sx_get_context_stats(_handle(ctx)::Ptr{Cvoid}, s::Ref{ContextStats})::Int32)
    (groups=Int(s.groups), groups_created=Int(s.groups_created), channels=Int(s.channels),
     memory_bytes=Int(s.memory_bytes), memory_budget_bytes=Int(s.memory_budget_bytes),
     shared_memory=s.shared_memory != 0, transport_bytes=Int(s.transport_bytes))
end
