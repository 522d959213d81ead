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
       register_optimizer, OptimizerPiece, regroup!, poll_joiners, lost_ranks, param_group_steps,
       Context, context_stats, with_context, NormDomain, join_norm_domain!,
       export_hf, export_peft, import_hf!, ImportReport

# The ABI version this binding was written against (sx.h's SX_VERSION_*): the runtime's
# major must match and its minor must not be older.
const SX_VERSION_MAJOR = 1
const SX_VERSION_MINOR = 6
const SX_VERSION_PATCH = 0
const SX_VERSION_NUMBER = SX_VERSION_MAJOR * 10000 + SX_VERSION_MINOR * 100 + SX_VERSION_PATCH
const BINDING_VERSION = (SX_VERSION_MAJOR, SX_VERSION_MINOR)

# The library name every @ccall uses; __init__ makes it resolve to $SX_LIBRARY.
const libsx = "libsx"

# The module by topic, in this order: later files use what earlier ones define.
include("constants.jl")
include("structs.jl")
include("errors.jl")
include("logging.jl")
include("context.jl")
include("group.jl")
include("recovery.jl")
include("params.jl")
include("step.jl")
include("norm_domain.jl")
include("state.jl")
include("custom_optimizer.jl")
include("checkpoint.jl")
include("interop.jl")

end # module
