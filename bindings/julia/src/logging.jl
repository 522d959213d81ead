# Part of module SX (src/SX.jl includes it): logging.

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
