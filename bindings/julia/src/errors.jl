# Part of module SX (src/SX.jl includes it): errors, calls that block, and the runtime's version checked when the module loads.

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
