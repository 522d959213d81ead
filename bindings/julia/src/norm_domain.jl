# Part of module SX (src/SX.jl includes it): norm domains, the groups of every
# model-parallel slice joined so that each step's gradient norm, non-finite check and
# loss-scale decision are taken over all of them (include/sx/sx_step.h,
# docs/model-parallel.md).

"""
    NormDomain(rendezvous, rank, world_size; timeout_ms=0, transport=:auto)

This rank's handle of a norm domain over every rank of a model-parallel trainer
(tensor-parallel x pipeline x data-parallel ranks). Creating one is collective, as a
`ShardGroup` is. Each rank then joins its own group with `join_norm_domain!(g, domain,
slice)`. The groups joined keep the domain alive: `close(domain)` (or a finalizer)
releases this handle only.
"""
mutable struct NormDomain
    handle::Ptr{Cvoid}
    function NormDomain(rendezvous::AbstractString, rank::Integer, world_size::Integer;
                        timeout_ms::Integer=0, transport::Union{Symbol,AbstractString}=:auto)
        transport_value = _transport(transport)
        cfg = _blank(GroupConfig)
        check(@ccall libsx.sx_group_config_init(cfg::Ref{GroupConfig}, sizeof(GroupConfig)::Csize_t)::Int32)
        rdv = _c_string("rendezvous", rendezvous)
        out = Ref{Ptr{Cvoid}}(C_NULL)
        GC.@preserve rdv cfg out begin
            cfg.rendezvous = pointer(rdv)
            cfg.rank, cfg.world_size = rank, world_size
            cfg.timeout_ms, cfg.transport = timeout_ms, transport_value
            cp, op = _ptr(cfg), Base.unsafe_convert(Ptr{Ptr{Cvoid}}, out)
            check(@blocking @ccall libsx.sx_create_norm_domain(cp::Ptr{GroupConfig}, op::Ptr{Ptr{Cvoid}})::Int32)
        end
        finalizer(close, new(out[]))
    end
end

"""Releases this handle (idempotent); the groups joined go on."""
function Base.close(d::NormDomain)
    h, d.handle = d.handle, C_NULL
    h == C_NULL || @ccall libsx.sx_destroy_norm_domain(h::Ptr{Cvoid})::Int32
    nothing
end

Base.isopen(d::NormDomain) = d.handle != C_NULL

"""Collective over the domain: joins `g` to `domain` as model-parallel slice `slice`. From
then on each `step!`'s gradient norm, non-finite check and loss-scale decision are taken
over every group of the domain. The group keeps the domain alive."""
function join_norm_domain!(g::ShardGroup, domain::NormDomain, slice::Integer)
    domain.handle == C_NULL && throw(SXError(SX_ERR_INVALID_HANDLE, "the NormDomain is closed"))
    h, d, s = _handle(g), domain.handle, Int32(slice)
    GC.@preserve domain check(@blocking @ccall libsx.sx_join_norm_domain(h::Ptr{Cvoid}, d::Ptr{Cvoid}, s::Int32)::Int32)
end
