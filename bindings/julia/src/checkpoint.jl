# Part of module SX (src/SX.jl includes it): checkpoints and futures.

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
