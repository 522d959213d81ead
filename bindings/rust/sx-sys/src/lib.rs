//! Raw declarations of libsx's C ABI, written by hand from `include/sx/sx.h`. Every
//! `#[repr(C)]` struct here is checked field by field against the layout the C compiler
//! reports (sx_layout.json) by `tests/layout.rs` of the `sx` crate. Use the safe `sx`
//! crate unless you need the raw calls.
#![allow(non_camel_case_types)]

use std::os::raw::{c_char, c_void};

pub const SX_VERSION_MAJOR: u32 = 1;
pub const SX_VERSION_MINOR: u32 = 6;
pub const SX_VERSION_PATCH: u32 = 0;
pub const SX_VERSION_NUMBER: u32 = SX_VERSION_MAJOR * 10000 + SX_VERSION_MINOR * 100 + SX_VERSION_PATCH;

pub type sx_status_t = i32;

pub const SX_OK: sx_status_t = 0;
pub const SX_ERR_INVALID_ARGUMENT: sx_status_t = 1;
pub const SX_ERR_INVALID_HANDLE: sx_status_t = 2;
pub const SX_ERR_INVALID_STATE: sx_status_t = 3;
pub const SX_ERR_OUT_OF_MEMORY: sx_status_t = 4;
pub const SX_ERR_NOT_FOUND: sx_status_t = 5;
pub const SX_ERR_ALREADY_EXISTS: sx_status_t = 6;
pub const SX_ERR_UNSUPPORTED: sx_status_t = 7;
pub const SX_ERR_TIMEOUT: sx_status_t = 8;
pub const SX_ERR_COMM: sx_status_t = 9;
pub const SX_ERR_GROUP_FAILED: sx_status_t = 10;
pub const SX_ERR_IO: sx_status_t = 11;
pub const SX_ERR_CORRUPT: sx_status_t = 12;
pub const SX_ERR_VERSION: sx_status_t = 13;
pub const SX_ERR_ABORTED: sx_status_t = 14;
pub const SX_ERR_MISMATCH: sx_status_t = 15;
pub const SX_ERR_INTERNAL: sx_status_t = 16;
pub const SX_ERR_CANCELLED: sx_status_t = 17;
pub const SX_ERR_NONFINITE: sx_status_t = 18;
pub const SX_ERR_OPTIMIZER: sx_status_t = 19;

pub const SX_LOG_ERROR: i32 = 1;
pub const SX_LOG_WARN: i32 = 2;
pub const SX_LOG_INFO: i32 = 3;
pub const SX_LOG_DEBUG: i32 = 4;

pub const SX_DTYPE_F32: i32 = 1;
pub const SX_DTYPE_F16: i32 = 2;
pub const SX_DTYPE_BF16: i32 = 3;
/// Unsigned bytes: the codes of 8-bit optimizer state as `sx_state_view` shows them.
pub const SX_DTYPE_U8: i32 = 4;

pub const SX_BACKEND_AUTO: i32 = 0;
pub const SX_BACKEND_CPU: i32 = 1;
pub const SX_BACKEND_CUDA: i32 = 2;

pub const SX_DEVICE_CPU: i32 = 0;
pub const SX_DEVICE_CUDA: i32 = 1;

pub const SX_OFFLOAD_NONE: i32 = 0;
pub const SX_OFFLOAD_STATE: i32 = 1;

pub const SX_OPTIM_SGD: i32 = 1;
pub const SX_OPTIM_ADAM: i32 = 2;
pub const SX_OPTIM_ADAMW: i32 = 3;
pub const SX_OPTIM_ADAGRAD: i32 = 4;
pub const SX_OPTIM_RMSPROP: i32 = 5;
pub const SX_OPTIM_ADAMAX: i32 = 6;
pub const SX_OPTIM_NADAM: i32 = 7;
pub const SX_OPTIM_RADAM: i32 = 8;
pub const SX_OPTIM_LION: i32 = 9;
pub const SX_OPTIM_LAMB: i32 = 10;
pub const SX_OPTIM_MUON: i32 = 11;
pub const SX_OPTIM_ADAFACTOR: i32 = 12;
pub const SX_OPTIM_ADEMAMIX: i32 = 13;

pub const SX_OPTIM_CUSTOM_FIRST: i32 = 1000;
pub const SX_HP_CUSTOM: i32 = 1000;
pub const SX_MAX_CUSTOM_SLOTS: usize = 3;
pub const SX_MAX_CUSTOM_HYPERPARAMETERS: i32 = 8;
pub const SX_MAX_CUSTOM_OPTIMIZERS: i32 = 64;
/// [`sx_optimizer_piece_t::error_size`]: the bytes of a failing update's message buffer.
pub const SX_OPTIMIZER_ERROR_BYTES: usize = 256;
/// [`sx_optimizer_desc_t::flags`]: update params and slots in place, without the double
/// buffers that let a failed update change nothing (a failure then fails the group).
pub const SX_OPTIMIZER_IN_PLACE: u32 = 0x1;

pub const SX_HP_LR: i32 = 1;
pub const SX_HP_WEIGHT_DECAY: i32 = 2;
pub const SX_HP_BETA1: i32 = 3;
pub const SX_HP_BETA2: i32 = 4;
pub const SX_HP_EPS: i32 = 5;
pub const SX_HP_MOMENTUM: i32 = 6;
pub const SX_HP_DAMPENING: i32 = 7;
pub const SX_HP_NESTEROV: i32 = 8;
pub const SX_HP_MAXIMIZE: i32 = 9;
pub const SX_HP_AMSGRAD: i32 = 10;
pub const SX_HP_LR_DECAY: i32 = 11;
pub const SX_HP_INITIAL_ACCUMULATOR_VALUE: i32 = 12;
pub const SX_HP_ALPHA: i32 = 13;
pub const SX_HP_CENTERED: i32 = 14;
pub const SX_HP_MOMENTUM_DECAY: i32 = 15;
pub const SX_HP_DECOUPLED_WEIGHT_DECAY: i32 = 16;
pub const SX_HP_NS_A: i32 = 17;
pub const SX_HP_NS_B: i32 = 18;
pub const SX_HP_NS_C: i32 = 19;
pub const SX_HP_NS_STEPS: i32 = 20;
pub const SX_HP_ADJUST_LR: i32 = 21;
pub const SX_HP_BETA2_DECAY: i32 = 22;
pub const SX_HP_EPS2: i32 = 23;
pub const SX_HP_D: i32 = 24;
pub const SX_HP_BETA3: i32 = 25;
pub const SX_HP_T_ALPHA_BETA3: i32 = 26;
pub const SX_HP_STATE_DTYPE: i32 = 27;
pub const SX_HP_BF16_STOCHASTIC_ROUND: i32 = 28;

/// [`sx_param_group_desc_t::state_dtype`]: how a param group keeps its optimizer state slots.
pub const SX_STATE_FP32: i32 = 0;
pub const SX_STATE_BF16: i32 = 1;
pub const SX_STATE_8BIT: i32 = 2;

pub const SX_MUON_ADJUST_LR_ORIGINAL: i32 = 0;
pub const SX_MUON_ADJUST_LR_MATCH_RMS_ADAMW: i32 = 1;
pub const SX_MUON_ADJUST_LR_SPECTRAL_UNCLAMPED: i32 = 2;

pub const SX_GROUP_NO_TRAINABLE_AUTODETECT: u32 = 0x1;
pub const SX_GROUP_RESERVE_CHECKPOINT_STAGING: u32 = 0x2;
pub const SX_GROUP_JOIN: u32 = 0x4;
pub const SX_GROUP_MEMORY_COPY_WAIT: u32 = 0x8;
pub const SX_GROUP_OPENMP_THREADS: u32 = 0x10;

pub const SX_MAX_NDIM: usize = 8;
pub const SX_MAX_WORLD_SIZE: i32 = 65536;
pub const SX_MAX_NAME_BYTES: usize = 1024;

pub const SX_LOAD_PARAMS_ONLY: u32 = 0x1;
pub const SX_LOAD_ALLOW_MISSING: u32 = 0x2;
pub const SX_LOAD_ALLOW_EXTRA: u32 = 0x4;

pub const SX_LOSS_SCALING_NONE: i32 = 0;
pub const SX_LOSS_SCALING_DYNAMIC: i32 = 1;
pub const SX_LOSS_SCALING_STATIC: i32 = 2;

pub const SX_REDUCE_SUM: i32 = 1;
pub const SX_REDUCE_MEAN: i32 = 2;
pub const SX_REDUCE_MAX: i32 = 3;
pub const SX_REDUCE_MIN: i32 = 4;
pub const SX_MAX_ALL_REDUCE: i32 = 64;

pub const SX_NONFINITE_DEFAULT: i32 = 0;
pub const SX_NONFINITE_SKIP: i32 = 1;
pub const SX_NONFINITE_ERROR: i32 = 2;

#[repr(C)]
pub struct sx_shard_group_t {
    _opaque: [u8; 0],
}

#[repr(C)]
pub struct sx_future_t {
    _opaque: [u8; 0],
}

/// A context (sx_context.h): what groups on the same ranks share.
#[repr(C)]
pub struct sx_context_t {
    _opaque: [u8; 0],
}

/// A norm domain (sx_step.h): groups whose steps take one gradient norm.
#[repr(C)]
pub struct sx_norm_domain_t {
    _opaque: [u8; 0],
}

pub type sx_log_fn = Option<unsafe extern "C" fn(level: i32, message: *const c_char, user: *mut c_void)>;
pub type sx_future_callback =
    Option<unsafe extern "C" fn(future: *mut sx_future_t, status: sx_status_t, user: *mut c_void)>;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct sx_group_config_t {
    pub struct_size: usize,
    pub rendezvous: *const c_char,
    pub rank: i32,
    pub world_size: i32,
    pub stage: i32,
    pub backend: i32,
    pub num_threads: i32,
    pub alignment: i32,
    pub timeout_ms: i32,
    pub flags: u32,
    pub bind_address: *const c_char,
    pub device_ordinal: i32,
    pub reserved0: i32,
    pub grad_dtype: i32,
    pub reduce_dtype: i32,
    pub prefetch_depth: i32,
    pub shard_size: i32,
    pub grad_predivide_factor: f64,
    pub trace_path: *const c_char,
    pub trace_events: i32,
    pub transport: i32,
    pub rendezvous_token: *const c_char,
    pub rendezvous_bind: *const c_char,
    pub memory_copy_interval: i32,
    pub offload: i32,
    /// Must be 0.
    pub reserved1: i32,
    /// Appended in 1.7: the context to make the group in (borrowed for the call); NULL = none.
    pub context: *mut sx_context_t,
    /// Appended in 1.7: the group's name in its context (copied); required with a context.
    pub name: *const c_char,
}

pub const SX_PREFETCH_NONE: i32 = -1;

pub const SX_PLACEMENT_WHOLE: i32 = 0;
pub const SX_PLACEMENT_REPLICATED: i32 = 1;
pub const SX_PLACEMENT_SPLIT: i32 = 2;
pub const SX_TRANSPORT_AUTO: i32 = 0;
pub const SX_TRANSPORT_TCP: i32 = 1;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct sx_param_group_desc_t {
    pub struct_size: usize,
    pub optimizer: i32,
    pub nesterov: i32,
    pub maximize: i32,
    pub amsgrad: i32,
    pub lr: f64,
    pub weight_decay: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub momentum: f64,
    pub dampening: f64,
    pub centered: i32,
    pub decoupled_weight_decay: i32,
    pub lr_decay: f64,
    pub initial_accumulator_value: f64,
    pub alpha: f64,
    pub momentum_decay: f64,
    pub ns_a: f64,
    pub ns_b: f64,
    pub ns_c: f64,
    pub ns_steps: i32,
    pub adjust_lr: i32,
    pub beta2_decay: f64,
    pub eps2: f64,
    pub d: f64,
    pub beta3: f64,
    pub t_alpha_beta3: f64,
    pub state_dtype: i32,
    pub bf16_stochastic_round: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct sx_param_desc_t {
    pub struct_size: usize,
    pub name: *const c_char,
    pub ndim: i32,
    pub dtype: i32,
    pub shape: *const i64,
    pub param_group: i32,
    pub unit: i32,
    pub frozen: i32,
    pub reserved0: i32,
    pub placement: i32,
    pub split_dim: i32,
    pub global_shape: *const i64,
    pub split_offset: i64,
    pub replica: i32,
    pub replicas: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct sx_view_t {
    pub struct_size: usize,
    pub data: *mut c_void,
    pub numel: u64,
    pub dtype: i32,
    pub device: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct sx_step_options_t {
    pub struct_size: usize,
    pub max_grad_norm: f64,
    pub stream: *mut c_void,
    pub keep_grads: i32,
    pub defer_gather: i32,
    pub weighted: i32,
    pub reserved0: i32,
    pub weight: f64,
    pub nonfinite: i32,
    pub reserved1: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct sx_unit_ready_options_t {
    pub struct_size: usize,
    pub accumulate: i32,
    pub reserved0: i32,
    pub stream: *mut c_void,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct sx_step_result_t {
    pub struct_size: usize,
    pub grad_norm: f64,
    pub step: u64,
    pub skipped: i32,
    pub reserved0: i32,
    pub loss_scale: f64,
    pub nonfinite: i32,
    pub reserved1: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct sx_loss_scaling_t {
    pub struct_size: usize,
    pub mode: i32,
    pub growth_interval: i32,
    pub init_scale: f64,
    pub growth_factor: f64,
    pub backoff_factor: f64,
}

/// Filled by the library only, for a [`sx_param_state_fn`] (no init function).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct sx_param_state_t {
    pub struct_size: usize,
    pub param: i32,
    pub param_group: i32,
    pub name: *const c_char,
    pub numel: u64,
    pub step: i64,
    pub momentum_steps: i64,
    pub num_tensors: i32,
    pub reserved0: i32,
    pub tensor_names: *const *const c_char,
    pub tensors: *const *mut f32,
    /// Appended in 1.5: NAdam's mu_product (0 for other optimizers; a scatter may leave
    /// it 0 to have sx derive it from the step).
    pub mu_product: f64,
    /// Appended in 1.5: each tensor's element count, num_tensors of them (owned by sx):
    /// numel, but Adafactor's "row_var" (prod(shape[..-1])) and "col_var"
    /// (prod(shape[..-2]) * C) of a param of two or more dimensions.
    pub tensor_numels: *const u64,
}

pub type sx_param_state_fn = Option<unsafe extern "C" fn(state: *mut sx_param_state_t, user: *mut c_void) -> sx_status_t>;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct sx_memory_stats_t {
    pub struct_size: usize,
    pub param_bytes: u64,
    pub grad_bytes: u64,
    pub optimizer_bytes: u64,
    pub staging_bytes: u64,
    pub unsharded_optimizer_bytes: u64,
    pub peak_param_bytes: u64,
    pub memory_copy_bytes: u64,
    pub device_bytes: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct sx_param_info_t {
    pub struct_size: usize,
    pub name: *const c_char,
    pub ndim: i32,
    pub dtype: i32,
    pub shape: [i64; SX_MAX_NDIM],
    pub numel: u64,
    pub param_group: i32,
    pub unit: i32,
    pub trainable: i32,
    pub reserved0: i32,
    pub offset_in_unit: u64,
    pub shard_begin: u64,
    pub shard_end: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct sx_unit_info_t {
    pub struct_size: usize,
    pub unit: i32,
    pub num_params: i32,
    pub numel: u64,
    pub padded_numel: u64,
    pub shard_numel: u64,
    pub shard_begin: u64,
    pub trainable: i32,
    pub has_optimizer_state: i32,
    pub shard_size: i32,
    pub shard_rank: i32,
    pub replicas: i32,
    pub replica_rank: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct sx_save_options_t {
    pub struct_size: usize,
    pub path: *const c_char,
    pub user_blob: *const c_void,
    pub user_blob_size: u64,
    pub keep_last: i32,
    pub synchronous: i32,
    pub callback: sx_future_callback,
    pub callback_user: *mut c_void,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct sx_load_options_t {
    pub struct_size: usize,
    pub path: *const c_char,
    pub flags: u32,
    pub reserved0: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct sx_regroup_options_t {
    pub struct_size: usize,
    pub checkpoint: *const c_char,
    pub load_flags: u32,
    pub join_window_ms: i32,
    pub expected_world_size: i32,
    pub admit: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct sx_regroup_result_t {
    pub struct_size: usize,
    pub epoch: i32,
    pub rank: i32,
    pub world_size: i32,
    pub shard_size: i32,
    pub previous_rank: i32,
    pub previous_world_size: i32,
    pub step: u64,
    pub from_memory: i32,
    pub reserved0: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct sx_context_config_t {
    pub struct_size: usize,
    pub rendezvous: *const c_char,
    pub rank: i32,
    pub world_size: i32,
    pub backend: i32,
    pub num_threads: i32,
    pub timeout_ms: i32,
    pub transport: i32,
    pub bind_address: *const c_char,
    pub rendezvous_token: *const c_char,
    pub rendezvous_bind: *const c_char,
    pub device_ordinal: i32,
    /// Must be 0.
    pub reserved0: i32,
    /// The most bytes the context's groups may hold on this rank; 0 = no budget.
    pub memory_budget_bytes: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct sx_context_stats_t {
    pub struct_size: usize,
    pub groups: i64,
    pub groups_created: i64,
    pub channels: i64,
    pub memory_bytes: u64,
    pub memory_budget_bytes: u64,
    pub shared_memory: i32,
    pub reserved0: i32,
    pub transport_bytes: u64,
}

/// sx_interop.h (1.7): Hugging Face checkpoints and PEFT adapters.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct sx_hf_export_options_t {
    pub struct_size: usize,
    pub root: i32,
    pub dtype: i32,
    pub max_shard_bytes: u64,
    pub num_names: i32,
    pub only_named: i32,
    pub sx_names: *const *const c_char,
    pub file_names: *const *const c_char,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct sx_peft_config_t {
    pub struct_size: usize,
    pub base_model_name_or_path: *const c_char,
    pub task_type: *const c_char,
    pub bias: *const c_char,
    pub extra_json: *const c_char,
    pub target_modules: *const *const c_char,
    pub num_target_modules: i32,
    pub r: i32,
    pub lora_alpha: f64,
    pub lora_dropout: f64,
    pub use_rslora: i32,
    pub fan_in_fan_out: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct sx_hf_import_options_t {
    pub struct_size: usize,
    pub root: i32,
    pub num_names: i32,
    pub only_named: i32,
    pub allow_missing: i32,
    pub allow_unexpected: i32,
    pub reserved0: i32,
    pub sx_names: *const *const c_char,
    pub file_names: *const *const c_char,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct sx_hf_import_report_t {
    pub struct_size: usize,
    pub num_loaded: i32,
    pub num_missing: i32,
    pub num_unexpected: i32,
    pub reserved0: i32,
    pub missing: *const *const c_char,
    pub missing_keys: *const *const c_char,
    pub unexpected: *const *const c_char,
}

/// One piece of a param's elements in this rank's shard, filled by the library for a
/// custom optimizer's [`sx_optimizer_update_fn`] (no init function); borrowed for the call.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct sx_optimizer_piece_t {
    pub struct_size: usize,
    pub param: *mut f32,
    pub grad: *const f32,
    pub state: [*mut f32; SX_MAX_CUSTOM_SLOTS],
    pub n: usize,
    pub grad_scale: f32,
    pub param_index: i32,
    pub param_group: i32,
    pub offset: u64,
    pub step: i64,
    pub hyperparameters: *const f64,
    pub user_data: *mut c_void,
    /// The optimizer's slots (`state[..num_slots]`).
    pub num_slots: i32,
    /// Values in `hyperparameters`.
    pub num_hyperparameters: i32,
    /// An update that fails may write a NUL-terminated message here (`error_size` bytes,
    /// empty on entry); sx puts it in the step's SX_ERR_OPTIMIZER message.
    pub error: *mut c_char,
    pub error_size: usize,
}

/// Returns 0, or any other value to fail the step (SX_ERR_OPTIMIZER on every rank).
/// Called concurrently from sx's worker threads; it must not unwind.
pub type sx_optimizer_update_fn = Option<unsafe extern "C" fn(piece: *const sx_optimizer_piece_t) -> i32>;

/// An element of [`sx_optimizer_desc_t::hyperparameters`] (no struct_size: never grows).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct sx_optimizer_hyperparameter_t {
    pub name: *const c_char,
    pub default_value: f64,
    pub min: f64,
    pub max: f64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct sx_optimizer_desc_t {
    pub struct_size: usize,
    pub name: *const c_char,
    pub num_slots: i32,
    pub slot_names: *const *const c_char,
    pub slot_initial_values: *const f32,
    pub num_hyperparameters: i32,
    pub hyperparameters: *const sx_optimizer_hyperparameter_t,
    pub update: sx_optimizer_update_fn,
    pub user_data: *mut c_void,
    /// `SX_OPTIMIZER_*` bits.
    pub flags: u32,
    /// Must be 0.
    pub reserved0: i32,
}

extern "C" {
    pub fn sx_version() -> u32;
    pub fn sx_status_string(status: sx_status_t) -> *const c_char;
    pub fn sx_last_error_message() -> *const c_char;
    pub fn sx_set_log_callback(f: sx_log_fn, user: *mut c_void, max_level: i32) -> sx_status_t;

    pub fn sx_group_config_init(config: *mut sx_group_config_t, size: usize) -> sx_status_t;
    pub fn sx_create_shard_group(config: *const sx_group_config_t, out: *mut *mut sx_shard_group_t) -> sx_status_t;
    pub fn sx_destroy_shard_group(group: *mut sx_shard_group_t) -> sx_status_t;
    pub fn sx_abort(group: *mut sx_shard_group_t) -> sx_status_t;
    pub fn sx_regroup_options_init(options: *mut sx_regroup_options_t, size: usize) -> sx_status_t;
    pub fn sx_hf_export_options_init(options: *mut sx_hf_export_options_t, size: usize) -> sx_status_t;
    pub fn sx_export_hf(group: *mut sx_shard_group_t, dir: *const c_char, options: *const sx_hf_export_options_t)
        -> sx_status_t;
    pub fn sx_peft_config_init(config: *mut sx_peft_config_t, size: usize) -> sx_status_t;
    pub fn sx_export_peft(
        group: *mut sx_shard_group_t,
        dir: *const c_char,
        options: *const sx_hf_export_options_t,
        config: *const sx_peft_config_t,
    ) -> sx_status_t;
    pub fn sx_hf_import_options_init(options: *mut sx_hf_import_options_t, size: usize) -> sx_status_t;
    pub fn sx_hf_import_report_init(report: *mut sx_hf_import_report_t, size: usize) -> sx_status_t;
    pub fn sx_import_hf(
        group: *mut sx_shard_group_t,
        path: *const c_char,
        options: *const sx_hf_import_options_t,
        report: *mut sx_hf_import_report_t,
    ) -> sx_status_t;
    pub fn sx_regroup_result_init(result: *mut sx_regroup_result_t, size: usize) -> sx_status_t;
    pub fn sx_regroup(
        group: *mut sx_shard_group_t,
        options: *const sx_regroup_options_t,
        result: *mut sx_regroup_result_t,
    ) -> sx_status_t;
    pub fn sx_poll_joiners(group: *mut sx_shard_group_t, waiting: *mut i32) -> sx_status_t;
    pub fn sx_get_lost_ranks(group: *const sx_shard_group_t, ranks: *mut i32, capacity: i32, count: *mut i32)
        -> sx_status_t;
    pub fn sx_trace_flush(group: *mut sx_shard_group_t) -> sx_status_t;

    pub fn sx_context_config_init(config: *mut sx_context_config_t, size: usize) -> sx_status_t;
    pub fn sx_context_stats_init(stats: *mut sx_context_stats_t, size: usize) -> sx_status_t;
    pub fn sx_create_context(config: *const sx_context_config_t, out: *mut *mut sx_context_t) -> sx_status_t;
    pub fn sx_destroy_context(context: *mut sx_context_t) -> sx_status_t;
    pub fn sx_create_norm_domain(config: *const sx_group_config_t, out: *mut *mut sx_norm_domain_t) -> sx_status_t;
    pub fn sx_destroy_norm_domain(domain: *mut sx_norm_domain_t) -> sx_status_t;
    pub fn sx_join_norm_domain(group: *mut sx_shard_group_t, domain: *mut sx_norm_domain_t, slice: i32) -> sx_status_t;
    pub fn sx_get_context_stats(context: *const sx_context_t, out: *mut sx_context_stats_t) -> sx_status_t;

    pub fn sx_param_group_desc_init(desc: *mut sx_param_group_desc_t, size: usize, optimizer: i32) -> sx_status_t;
    pub fn sx_optimizer_desc_init(desc: *mut sx_optimizer_desc_t, size: usize) -> sx_status_t;
    pub fn sx_register_optimizer(desc: *const sx_optimizer_desc_t, optimizer: *mut i32) -> sx_status_t;
    pub fn sx_add_param_group(
        group: *mut sx_shard_group_t,
        desc: *const sx_param_group_desc_t,
        index_out: *mut i32,
    ) -> sx_status_t;
    pub fn sx_set_hyperparameter(group: *mut sx_shard_group_t, param_group: i32, key: i32, value: f64) -> sx_status_t;
    pub fn sx_get_hyperparameter(
        group: *const sx_shard_group_t,
        param_group: i32,
        key: i32,
        value: *mut f64,
    ) -> sx_status_t;
    pub fn sx_set_lr(group: *mut sx_shard_group_t, param_group: i32, lr: f64) -> sx_status_t;
    pub fn sx_get_param_group_steps(group: *const sx_shard_group_t, param_group: i32, steps: *mut i64) -> sx_status_t;

    pub fn sx_param_desc_init(desc: *mut sx_param_desc_t, size: usize) -> sx_status_t;
    pub fn sx_add_param(group: *mut sx_shard_group_t, desc: *const sx_param_desc_t, index_out: *mut i32) -> sx_status_t;
    pub fn sx_finalize(group: *mut sx_shard_group_t) -> sx_status_t;
    pub fn sx_broadcast_params(group: *mut sx_shard_group_t, root: i32) -> sx_status_t;
    pub fn sx_all_reduce(group: *mut sx_shard_group_t, values: *mut f64, count: i32, op: i32) -> sx_status_t;
    pub fn sx_unit_view(group: *const sx_shard_group_t, unit: i32, grad: i32, out: *mut sx_view_t) -> sx_status_t;

    pub fn sx_view_init(view: *mut sx_view_t, size: usize) -> sx_status_t;
    pub fn sx_param_view(group: *const sx_shard_group_t, param: i32, out: *mut sx_view_t) -> sx_status_t;
    pub fn sx_grad_view(group: *const sx_shard_group_t, param: i32, out: *mut sx_view_t) -> sx_status_t;
    pub fn sx_find_param(group: *const sx_shard_group_t, name: *const c_char, index: *mut i32) -> sx_status_t;

    pub fn sx_set_trainable(group: *mut sx_shard_group_t, param: i32, trainable: i32) -> sx_status_t;
    pub fn sx_get_trainable(group: *const sx_shard_group_t, param: i32, trainable: *mut i32) -> sx_status_t;
    pub fn sx_trainable_mask(group: *mut sx_shard_group_t, mask: *mut *mut u8, count: *mut i32) -> sx_status_t;
    pub fn sx_refresh_trainable(group: *mut sx_shard_group_t) -> sx_status_t;

    pub fn sx_accumulate_grads(group: *mut sx_shard_group_t) -> sx_status_t;
    pub fn sx_step_options_init(options: *mut sx_step_options_t, size: usize) -> sx_status_t;
    pub fn sx_step_result_init(result: *mut sx_step_result_t, size: usize) -> sx_status_t;
    pub fn sx_step(
        group: *mut sx_shard_group_t,
        options: *const sx_step_options_t,
        result: *mut sx_step_result_t,
    ) -> sx_status_t;

    pub fn sx_unit_ready_options_init(options: *mut sx_unit_ready_options_t, size: usize) -> sx_status_t;
    pub fn sx_unit_grads_ready(
        group: *mut sx_shard_group_t,
        unit: i32,
        options: *const sx_unit_ready_options_t,
    ) -> sx_status_t;
    pub fn sx_unit_gather(group: *mut sx_shard_group_t, unit: i32) -> sx_status_t;
    pub fn sx_unit_release(group: *mut sx_shard_group_t, unit: i32) -> sx_status_t;

    pub fn sx_loss_scaling_init(scaling: *mut sx_loss_scaling_t, size: usize) -> sx_status_t;
    pub fn sx_set_loss_scaling(group: *mut sx_shard_group_t, scaling: *const sx_loss_scaling_t) -> sx_status_t;
    pub fn sx_get_loss_scale(group: *const sx_shard_group_t, scale: *mut f64) -> sx_status_t;

    pub fn sx_gather_optim_state(
        group: *mut sx_shard_group_t,
        root: i32,
        f: sx_param_state_fn,
        user: *mut c_void,
    ) -> sx_status_t;
    pub fn sx_scatter_optim_state(
        group: *mut sx_shard_group_t,
        root: i32,
        f: sx_param_state_fn,
        user: *mut c_void,
    ) -> sx_status_t;
    pub fn sx_state_view(
        group: *const sx_shard_group_t,
        param: i32,
        tensor: *const c_char,
        out: *mut sx_view_t,
    ) -> sx_status_t;

    pub fn sx_get_rank(group: *const sx_shard_group_t, rank: *mut i32) -> sx_status_t;
    pub fn sx_get_world_size(group: *const sx_shard_group_t, world_size: *mut i32) -> sx_status_t;
    pub fn sx_get_stage(group: *const sx_shard_group_t, stage: *mut i32) -> sx_status_t;
    pub fn sx_get_num_params(group: *const sx_shard_group_t, count: *mut i32) -> sx_status_t;
    pub fn sx_get_num_units(group: *const sx_shard_group_t, count: *mut i32) -> sx_status_t;
    pub fn sx_get_num_param_groups(group: *const sx_shard_group_t, count: *mut i32) -> sx_status_t;

    pub fn sx_memory_stats_init(stats: *mut sx_memory_stats_t, size: usize) -> sx_status_t;
    pub fn sx_get_memory_stats(group: *const sx_shard_group_t, out: *mut sx_memory_stats_t) -> sx_status_t;
    pub fn sx_param_info_init(info: *mut sx_param_info_t, size: usize) -> sx_status_t;
    pub fn sx_get_param_info(group: *const sx_shard_group_t, param: i32, out: *mut sx_param_info_t) -> sx_status_t;
    pub fn sx_unit_info_init(info: *mut sx_unit_info_t, size: usize) -> sx_status_t;
    pub fn sx_get_unit_info(group: *const sx_shard_group_t, index: i32, out: *mut sx_unit_info_t) -> sx_status_t;

    pub fn sx_save_options_init(options: *mut sx_save_options_t, size: usize) -> sx_status_t;
    pub fn sx_save_optim_state(
        group: *mut sx_shard_group_t,
        options: *const sx_save_options_t,
        out: *mut *mut sx_future_t,
    ) -> sx_status_t;
    pub fn sx_future_poll(future: *const sx_future_t, done: *mut i32) -> sx_status_t;
    pub fn sx_future_wait(future: *mut sx_future_t, timeout_ms: i64) -> sx_status_t;
    pub fn sx_future_wait_staged(future: *mut sx_future_t, timeout_ms: i64) -> sx_status_t;
    pub fn sx_future_cancel(future: *mut sx_future_t) -> sx_status_t;
    pub fn sx_future_error_message(future: *const sx_future_t) -> *const c_char;
    pub fn sx_future_progress(future: *const sx_future_t, done_bytes: *mut u64, total_bytes: *mut u64) -> sx_status_t;
    pub fn sx_future_destroy(future: *mut sx_future_t) -> sx_status_t;

    pub fn sx_load_optim_state_options_init(options: *mut sx_load_options_t, size: usize) -> sx_status_t;
    pub fn sx_load_optim_state(group: *mut sx_shard_group_t, options: *const sx_load_options_t) -> sx_status_t;
    pub fn sx_read_user_blob(path: *const c_char, buf: *mut c_void, capacity: u64, size: *mut u64) -> sx_status_t;
}
