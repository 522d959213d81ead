# Part of module SX (src/SX.jl includes it): losing a rank: regroup!, poll_joiners, lost_ranks.

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
