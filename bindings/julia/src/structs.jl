# Part of module SX (src/SX.jl includes it): the struct mirrors (check_static.py checks them against sx_layout.json).

# ----------------------------------------------------------------------------------
# Struct mirrors. Mutable, so that a `Ref{T}` argument passes a pointer to the object
# itself and sx fills it in place. bindings/julia/check_static.py checks every field's
# offset and size against sx_layout.json, using the C-compatible layout Julia gives
# structs of isbits fields.
# ----------------------------------------------------------------------------------
mutable struct GroupConfig  # sx_group_config_t
    struct_size::Csize_t
    rendezvous::Ptr{UInt8}
    rank::Int32
    world_size::Int32
    stage::Int32
    backend::Int32
    num_threads::Int32
    alignment::Int32
    timeout_ms::Int32
    flags::UInt32
    bind_address::Ptr{UInt8}
    device_ordinal::Int32
    reserved0::Int32
    grad_dtype::Int32
    reduce_dtype::Int32
    prefetch_depth::Int32
    shard_size::Int32
    grad_predivide_factor::Float64
    trace_path::Ptr{UInt8}
    trace_events::Int32
    transport::Int32
    rendezvous_token::Ptr{UInt8}
    rendezvous_bind::Ptr{UInt8}
    memory_copy_interval::Int32
    offload::Int32
    reserved1::Int32
    context::Ptr{Cvoid}
    name::Ptr{UInt8}
end

mutable struct ParamGroupDesc  # sx_param_group_desc_t
    struct_size::Csize_t
    optimizer::Int32
    nesterov::Int32
    maximize::Int32
    amsgrad::Int32
    lr::Float64
    weight_decay::Float64
    beta1::Float64
    beta2::Float64
    eps::Float64
    momentum::Float64
    dampening::Float64
    centered::Int32
    decoupled_weight_decay::Int32
    lr_decay::Float64
    initial_accumulator_value::Float64
    alpha::Float64
    momentum_decay::Float64
    ns_a::Float64
    ns_b::Float64
    ns_c::Float64
    ns_steps::Int32
    adjust_lr::Int32
    beta2_decay::Float64
    eps2::Float64
    d::Float64
    beta3::Float64
    t_alpha_beta3::Float64
    state_dtype::Int32
    bf16_stochastic_round::Int32
end

mutable struct ParamDesc  # sx_param_desc_t
    struct_size::Csize_t
    name::Ptr{UInt8}
    ndim::Int32
    dtype::Int32
    shape::Ptr{Int64}
    param_group::Int32
    unit::Int32
    frozen::Int32
    reserved0::Int32
    placement::Int32
    split_dim::Int32
    global_shape::Ptr{Int64}
    split_offset::Int64
    replica::Int32
    replicas::Int32
end

mutable struct View  # sx_view_t
    struct_size::Csize_t
    data::Ptr{Cvoid}
    numel::UInt64
    dtype::Int32
    device::Int32
end

mutable struct StepOptions  # sx_step_options_t
    struct_size::Csize_t
    max_grad_norm::Float64
    stream::Ptr{Cvoid}
    keep_grads::Int32
    defer_gather::Int32
    weighted::Int32
    reserved0::Int32
    weight::Float64
    nonfinite::Int32
    reserved1::Int32
end

mutable struct UnitReadyOptions  # sx_unit_ready_options_t
    struct_size::Csize_t
    accumulate::Int32
    reserved0::Int32
    stream::Ptr{Cvoid}
end

mutable struct StepResult  # sx_step_result_t
    struct_size::Csize_t
    grad_norm::Float64
    step::UInt64
    skipped::Int32
    reserved0::Int32
    loss_scale::Float64
    nonfinite::Int32
    reserved1::Int32
end

mutable struct LossScaling  # sx_loss_scaling_t
    struct_size::Csize_t
    mode::Int32
    growth_interval::Int32
    init_scale::Float64
    growth_factor::Float64
    backoff_factor::Float64
end

mutable struct MemoryStats  # sx_memory_stats_t
    struct_size::Csize_t
    param_bytes::UInt64
    grad_bytes::UInt64
    optimizer_bytes::UInt64
    staging_bytes::UInt64
    unsharded_optimizer_bytes::UInt64
    peak_param_bytes::UInt64
    memory_copy_bytes::UInt64
    device_bytes::UInt64
end

mutable struct ParamInfo  # sx_param_info_t
    struct_size::Csize_t
    name::Ptr{UInt8}
    ndim::Int32
    dtype::Int32
    shape::NTuple{8,Int64}
    numel::UInt64
    param_group::Int32
    unit::Int32
    trainable::Int32
    reserved0::Int32
    offset_in_unit::UInt64
    shard_begin::UInt64
    shard_end::UInt64
end

mutable struct UnitInfo  # sx_unit_info_t
    struct_size::Csize_t
    unit::Int32
    num_params::Int32
    numel::UInt64
    padded_numel::UInt64
    shard_numel::UInt64
    shard_begin::UInt64
    trainable::Int32
    has_optimizer_state::Int32
    shard_size::Int32
    shard_rank::Int32
    replicas::Int32
    replica_rank::Int32
end

mutable struct SaveOptions  # sx_save_options_t
    struct_size::Csize_t
    path::Ptr{UInt8}
    user_blob::Ptr{Cvoid}
    user_blob_size::UInt64
    keep_last::Int32
    synchronous::Int32
    callback::Ptr{Cvoid}
    callback_user::Ptr{Cvoid}
end

mutable struct LoadOptions  # sx_load_options_t
    struct_size::Csize_t
    path::Ptr{UInt8}
    flags::UInt32
    reserved0::Int32
end

mutable struct RegroupOptions  # sx_regroup_options_t
    struct_size::Csize_t
    checkpoint::Ptr{UInt8}
    load_flags::UInt32
    join_window_ms::Int32
    expected_world_size::Int32
    admit::Int32
end

mutable struct RegroupResult  # sx_regroup_result_t
    struct_size::Csize_t
    epoch::Int32
    rank::Int32
    world_size::Int32
    shard_size::Int32
    previous_rank::Int32
    previous_world_size::Int32
    step::UInt64
    from_memory::Int32
    reserved0::Int32
end

mutable struct ContextConfig  # sx_context_config_t
    struct_size::Csize_t
    rendezvous::Ptr{UInt8}
    rank::Int32
    world_size::Int32
    backend::Int32
    num_threads::Int32
    timeout_ms::Int32
    transport::Int32
    bind_address::Ptr{UInt8}
    rendezvous_token::Ptr{UInt8}
    rendezvous_bind::Ptr{UInt8}
    device_ordinal::Int32
    reserved0::Int32
    memory_budget_bytes::UInt64
end

mutable struct ContextStats  # sx_context_stats_t
    struct_size::Csize_t
    groups::Int64
    groups_created::Int64
    channels::Int64
    memory_bytes::UInt64
    memory_budget_bytes::UInt64
    shared_memory::Int32
    reserved0::Int32
    transport_bytes::UInt64
end

# Filled by sx only, for a gather's or a scatter's callback (read with unsafe_load).
struct RawParamState  # sx_param_state_t
    struct_size::Csize_t
    param::Int32
    param_group::Int32
    name::Ptr{UInt8}
    numel::UInt64
    step::Int64
    momentum_steps::Int64
    num_tensors::Int32
    reserved0::Int32
    tensor_names::Ptr{Ptr{UInt8}}
    tensors::Ptr{Ptr{Float32}}
    mu_product::Float64
    tensor_numels::Ptr{UInt64}
end

# Filled by sx only, for a custom optimizer's update (read with unsafe_load).
struct RawOptimizerPiece  # sx_optimizer_piece_t
    struct_size::Csize_t
    param::Ptr{Float32}
    grad::Ptr{Float32}
    state::NTuple{3,Ptr{Float32}}
    n::Csize_t
    grad_scale::Float32
    param_index::Int32
    param_group::Int32
    offset::UInt64
    step::Int64
    hyperparameters::Ptr{Float64}
    user_data::Ptr{Cvoid}
    num_slots::Int32
    num_hyperparameters::Int32
    error::Ptr{UInt8}  # a failing update's message: NUL-terminated, error_size bytes
    error_size::Csize_t
end

# An element of OptimizerDesc.hyperparameters (an array: isbits, no struct_size).
struct OptimizerHyperparameter  # sx_optimizer_hyperparameter_t
    name::Ptr{UInt8}
    default_value::Float64
    min::Float64
    max::Float64
end

mutable struct OptimizerDesc  # sx_optimizer_desc_t
    struct_size::Csize_t
    name::Ptr{UInt8}
    num_slots::Int32
    slot_names::Ptr{Ptr{UInt8}}
    slot_initial_values::Ptr{Float32}
    num_hyperparameters::Int32
    hyperparameters::Ptr{OptimizerHyperparameter}
    update::Ptr{Cvoid}
    user_data::Ptr{Cvoid}
    flags::UInt32
    reserved0::Int32
end

mutable struct HFExportOptions  # sx_hf_export_options_t
    struct_size::Csize_t
    root::Int32
    dtype::Int32
    max_shard_bytes::UInt64
    num_names::Int32
    only_named::Int32
    sx_names::Ptr{Ptr{UInt8}}
    file_names::Ptr{Ptr{UInt8}}
end

mutable struct PEFTConfig  # sx_peft_config_t
    struct_size::Csize_t
    base_model_name_or_path::Ptr{UInt8}
    task_type::Ptr{UInt8}
    bias::Ptr{UInt8}
    extra_json::Ptr{UInt8}
    target_modules::Ptr{Ptr{UInt8}}
    num_target_modules::Int32
    r::Int32
    lora_alpha::Float64
    lora_dropout::Float64
    use_rslora::Int32
    fan_in_fan_out::Int32
end

mutable struct HFImportOptions  # sx_hf_import_options_t
    struct_size::Csize_t
    root::Int32
    num_names::Int32
    only_named::Int32
    allow_missing::Int32
    allow_unexpected::Int32
    reserved0::Int32
    sx_names::Ptr{Ptr{UInt8}}
    file_names::Ptr{Ptr{UInt8}}
end

mutable struct HFImportReport  # sx_hf_import_report_t
    struct_size::Csize_t
    num_loaded::Int32
    num_missing::Int32
    num_unexpected::Int32
    reserved0::Int32
    missing::Ptr{Ptr{UInt8}}
    missing_keys::Ptr{Ptr{UInt8}}
    unexpected::Ptr{Ptr{UInt8}}
end

_zero(::Type{T}) where {T<:Number} = zero(T)
_zero(::Type{Ptr{T}}) where {T} = Ptr{T}(C_NULL)
_zero(::Type{NTuple{N,T}}) where {N,T} = ntuple(_ -> zero(T), N)
_blank(::Type{T}) where {T} = T((_zero(fieldtype(T, i)) for i in 1:fieldcount(T))...)
# The address of a mirror's fields, for calls made GC-safe (see @blocking); the caller
# holds the object under GC.@preserve.
_ptr(x::T) where {T} = Ptr{T}(pointer_from_objref(x))
