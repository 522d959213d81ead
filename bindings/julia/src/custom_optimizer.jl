# Part of module SX (src/SX.jl includes it): custom optimizers.

# ----------------------------------------------------------------------------------
# Custom optimizers (sx 1.6)
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
                                   "ns_a", "ns_b", "ns_c", "ns_steps", "adjust_lr", "beta2_decay", "eps2", "d",
                                   "beta3", "t_alpha_beta3", "state_dtype",
                                   "bf16_stochastic_round")

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
