# Hugging Face checkpoints and PEFT adapters out of and into a group's params
# (include/sx/sx_interop.h, docs/interop.md). Every call is collective: every rank calls
# it with the same path and root; only the root reads the other arguments and touches
# the files.

const _EXPORT_DTYPES = Dict(:f32 => SX_DTYPE_F32, :bf16 => SX_DTYPE_BF16, :f16 => SX_DTYPE_F16)

"""What `import_hf!` matched: `missing` holds (sx name, key looked for) pairs."""
struct ImportReport
    loaded::Int
    missing::Vector{Tuple{String,String}}
    unexpected::Vector{String}
end

# (strings, pointers) of a name map given as a Dict or pairs; the strings stay alive as
# long as the caller holds them (GC.@preserve).
function _name_pointers(names)
    pairs = [(String(a), String(b)) for (a, b) in names]
    sx_names = [_c_string("a name map's sx name", p[1]) for p in pairs]
    file_names = [_c_string("a name map's key", p[2]) for p in pairs]
    sx_names, file_names, Ptr{UInt8}[pointer(s) for s in sx_names], Ptr{UInt8}[pointer(s) for s in file_names]
end

function _export_options(root, dtype, max_shard_bytes, count, only_named)
    o = _blank(HFExportOptions)
    check(@ccall libsx.sx_hf_export_options_init(o::Ref{HFExportOptions}, sizeof(HFExportOptions)::Csize_t)::Int32)
    haskey(_EXPORT_DTYPES, dtype) || throw(SXError(SX_ERR_INVALID_ARGUMENT, "dtype $dtype: the files take :f32, :bf16 or :f16"))
    o.root, o.dtype, o.max_shard_bytes = root, _EXPORT_DTYPES[dtype], max_shard_bytes
    o.num_names, o.only_named = count, only_named
    o
end

"""
    export_hf(g, dir; names=(), only_named=false, dtype=:f32, max_shard_bytes=0, root=0)

Collective: writes the params into the new directory `dir` as a Hugging Face checkpoint
(model.safetensors, or model-0000K-of-0000N.safetensors with model.safetensors.index.json).
`names`: sx name => key pairs.
"""
function export_hf(g::ShardGroup, dir::AbstractString; names=(), only_named::Bool=false, dtype::Symbol=:f32,
                   max_shard_bytes::Integer=0, root::Integer=0)
    d = _c_string("dir", dir)
    a, b, ap, bp = _name_pointers(names)
    o = _export_options(root, dtype, max_shard_bytes, length(ap), only_named)
    h = _handle(g)
    status = GC.@preserve d a b ap bp o begin
        o.sx_names, o.file_names = isempty(ap) ? C_NULL : pointer(ap), isempty(bp) ? C_NULL : pointer(bp)
        op = _ptr(o)
        @blocking @ccall libsx.sx_export_hf(h::Ptr{Cvoid}, d::Cstring, op::Ptr{HFExportOptions})::Int32
    end
    check(status)
end

"""
    export_peft(g, dir, names; target_modules, base_model_name_or_path=nothing, r=8, lora_alpha=8,
                lora_dropout=0.0, task_type=nothing, bias="none", use_rslora=false,
                fan_in_fan_out=false, extra_json=nothing, dtype=:f32, root=0)

Collective: writes a PEFT LoRA adapter into the new directory `dir`: the params `names`
names (sx name => peft key) into adapter_model.safetensors and the rest into
adapter_config.json.
"""
function export_peft(g::ShardGroup, dir::AbstractString, names; target_modules, base_model_name_or_path=nothing, r::Integer=8, lora_alpha::Real=8, lora_dropout::Real=0.0, task_type=nothing,
                     bias::AbstractString="none", use_rslora::Bool=false, fan_in_fan_out::Bool=false,
                     extra_json=nothing, dtype::Symbol=:f32, root::Integer=0)
    d = _c_string("dir", dir)
    a, b, ap, bp = _name_pointers(names)
    o = _export_options(root, dtype, 0, length(ap), true)
    c = _blank(PEFTConfig)
    check(@ccall libsx.sx_peft_config_init(c::Ref{PEFTConfig}, sizeof(PEFTConfig)::Csize_t)::Int32)
    bs = _c_string("bias", bias)
    base = base_model_name_or_path === nothing ? nothing : _c_string("base_model_name_or_path", base_model_name_or_path)
    task = task_type === nothing ? nothing : _c_string("task_type", task_type)
    extra = extra_json === nothing ? nothing : _c_string("extra_json", extra_json)
    modules = [_c_string("a target module", m) for m in target_modules]
    mp = Ptr{UInt8}[pointer(m) for m in modules]
    h = _handle(g)
    status = GC.@preserve d a b ap bp o c base bs task extra modules mp begin
        o.sx_names, o.file_names = isempty(ap) ? C_NULL : pointer(ap), isempty(bp) ? C_NULL : pointer(bp)
        c.base_model_name_or_path = base === nothing ? C_NULL : pointer(base)
        c.bias = pointer(bs)
        c.task_type = task === nothing ? C_NULL : pointer(task)
        c.extra_json = extra === nothing ? C_NULL : pointer(extra)
        c.target_modules, c.num_target_modules = isempty(mp) ? C_NULL : pointer(mp), length(mp)
        c.r, c.lora_alpha, c.lora_dropout = r, lora_alpha, lora_dropout
        c.use_rslora, c.fan_in_fan_out = use_rslora, fan_in_fan_out
        op, cp = _ptr(o), _ptr(c)
        @blocking @ccall libsx.sx_export_peft(h::Ptr{Cvoid}, d::Cstring, op::Ptr{HFExportOptions},
                                              cp::Ptr{PEFTConfig})::Int32
    end
    check(status)
end

_strings(p::Ptr{Ptr{UInt8}}, n) = String[unsafe_string(unsafe_load(p, i)) for i in 1:n]

"""
    import_hf!(g, path; names=(), only_named=false, allow_missing=false, allow_unexpected=false, root=0)

Collective: reads a Hugging Face checkpoint (a directory with model.safetensors.index.json
or model.safetensors, an index, or a .safetensors file) or a PEFT adapter directory into
the params by name; returns an `ImportReport`. Missing params and tensors no param takes
are errors unless allowed (the message names them). A failed import changes no param.
"""
function import_hf!(g::ShardGroup, path::AbstractString; names=(), only_named::Bool=false,
                    allow_missing::Bool=false, allow_unexpected::Bool=false, root::Integer=0)
    p = _c_string("path", path)
    a, b, ap, bp = _name_pointers(names)
    o = _blank(HFImportOptions)
    check(@ccall libsx.sx_hf_import_options_init(o::Ref{HFImportOptions}, sizeof(HFImportOptions)::Csize_t)::Int32)
    r = _blank(HFImportReport)
    check(@ccall libsx.sx_hf_import_report_init(r::Ref{HFImportReport}, sizeof(HFImportReport)::Csize_t)::Int32)
    h = _handle(g)
    status, report = GC.@preserve p a b ap bp o r begin
        o.root, o.num_names, o.only_named = root, length(ap), only_named
        o.allow_missing, o.allow_unexpected = allow_missing, allow_unexpected
        o.sx_names, o.file_names = isempty(ap) ? C_NULL : pointer(ap), isempty(bp) ? C_NULL : pointer(bp)
        op, rp = _ptr(o), _ptr(r)
        s = @blocking @ccall libsx.sx_import_hf(h::Ptr{Cvoid}, p::Cstring, op::Ptr{HFImportOptions},
                                                rp::Ptr{HFImportReport})::Int32
        # The names live until this thread's next import: copied at once (before check
        # reads the error message, which no sx call in between changes).
        names_ = _strings(r.missing, r.num_missing)
        keys_ = _strings(r.missing_keys, r.num_missing)
        s, ImportReport(r.num_loaded, collect(zip(names_, keys_)), _strings(r.unexpected, r.num_unexpected))
    end
    check(status)
    report
end
