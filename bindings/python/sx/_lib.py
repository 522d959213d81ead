"""The C ABI of libsx as ctypes sees it: loading, the version check, the struct
mirrors, the constants and the prototype of every function in include/sx/sx.h.

Everything here is a one-to-one transcription of sx.h; the Pythonic layer lives in
the other modules. The library is opened with ``ctypes.CDLL`` (never ``PyDLL``), so
the GIL is released during every call: collective calls of several ranks that are
threads of one process run concurrently, and sx's I/O thread can run Python
callbacks while a caller waits.
"""
import ctypes
import ctypes.util
import os

# The ABI version this binding was written against. The runtime's major must match
# and its minor must not be older (docs/conventions.md, "The C ABI", rule 11).
BINDING_VERSION = (1, 6)

# ----------------------------------------------------------------------------------
# Constants (sx.h #defines); tests/test_layout.py checks each against sx_layout.json.
# ----------------------------------------------------------------------------------
SX_VERSION_MAJOR = 1
SX_VERSION_MINOR = 6
SX_VERSION_PATCH = 0
SX_VERSION_NUMBER = SX_VERSION_MAJOR * 10000 + SX_VERSION_MINOR * 100 + SX_VERSION_PATCH

SX_OK = 0
SX_ERR_INVALID_ARGUMENT = 1
SX_ERR_INVALID_HANDLE = 2
SX_ERR_INVALID_STATE = 3
SX_ERR_OUT_OF_MEMORY = 4
SX_ERR_NOT_FOUND = 5
SX_ERR_ALREADY_EXISTS = 6
SX_ERR_UNSUPPORTED = 7
SX_ERR_TIMEOUT = 8
SX_ERR_COMM = 9
SX_ERR_GROUP_FAILED = 10
SX_ERR_IO = 11
SX_ERR_CORRUPT = 12
SX_ERR_VERSION = 13
SX_ERR_ABORTED = 14
SX_ERR_MISMATCH = 15
SX_ERR_INTERNAL = 16
SX_ERR_CANCELLED = 17
SX_ERR_NONFINITE = 18
SX_ERR_OPTIMIZER = 19

SX_LOG_ERROR = 1
SX_LOG_WARN = 2
SX_LOG_INFO = 3
SX_LOG_DEBUG = 4

SX_DTYPE_F32 = 1
SX_DTYPE_F16 = 2
SX_DTYPE_BF16 = 3
SX_DTYPE_U8 = 4

SX_PREFETCH_NONE = -1

SX_PLACEMENT_WHOLE = 0
SX_PLACEMENT_REPLICATED = 1
SX_PLACEMENT_SPLIT = 2
SX_TRANSPORT_AUTO = 0
SX_TRANSPORT_TCP = 1

SX_BACKEND_AUTO = 0
SX_BACKEND_CPU = 1
SX_BACKEND_CUDA = 2

SX_DEVICE_CPU = 0
SX_DEVICE_CUDA = 1

SX_OFFLOAD_NONE = 0
SX_OFFLOAD_STATE = 1

SX_OPTIM_SGD = 1
SX_OPTIM_ADAM = 2
SX_OPTIM_ADAMW = 3
SX_OPTIM_ADAGRAD = 4
SX_OPTIM_RMSPROP = 5
SX_OPTIM_ADAMAX = 6
SX_OPTIM_NADAM = 7
SX_OPTIM_RADAM = 8
SX_OPTIM_LION = 9
SX_OPTIM_LAMB = 10
SX_OPTIM_MUON = 11
SX_OPTIM_ADAFACTOR = 12
SX_OPTIM_ADEMAMIX = 13

SX_OPTIM_CUSTOM_FIRST = 1000
SX_HP_CUSTOM = 1000
SX_MAX_CUSTOM_SLOTS = 3
SX_MAX_CUSTOM_HYPERPARAMETERS = 8
SX_MAX_CUSTOM_OPTIMIZERS = 64
SX_OPTIMIZER_ERROR_BYTES = 256  # sx_optimizer_piece_t.error_size
SX_OPTIMIZER_IN_PLACE = 0x1  # sx_optimizer_desc_t.flags

SX_HP_LR = 1
SX_HP_WEIGHT_DECAY = 2
SX_HP_BETA1 = 3
SX_HP_BETA2 = 4
SX_HP_EPS = 5
SX_HP_MOMENTUM = 6
SX_HP_DAMPENING = 7
SX_HP_NESTEROV = 8
SX_HP_MAXIMIZE = 9
SX_HP_AMSGRAD = 10
SX_HP_LR_DECAY = 11
SX_HP_INITIAL_ACCUMULATOR_VALUE = 12
SX_HP_ALPHA = 13
SX_HP_CENTERED = 14
SX_HP_MOMENTUM_DECAY = 15
SX_HP_DECOUPLED_WEIGHT_DECAY = 16
SX_HP_NS_A = 17
SX_HP_NS_B = 18
SX_HP_NS_C = 19
SX_HP_NS_STEPS = 20
SX_HP_ADJUST_LR = 21
SX_HP_BETA2_DECAY = 22
SX_HP_EPS2 = 23
SX_HP_D = 24
SX_HP_BETA3 = 25
SX_HP_T_ALPHA_BETA3 = 26
SX_HP_STATE_DTYPE = 27
SX_HP_BF16_STOCHASTIC_ROUND = 28

SX_STATE_FP32 = 0
SX_STATE_BF16 = 1
SX_STATE_8BIT = 2

SX_MUON_ADJUST_LR_ORIGINAL = 0
SX_MUON_ADJUST_LR_MATCH_RMS_ADAMW = 1
SX_MUON_ADJUST_LR_SPECTRAL_UNCLAMPED = 2

SX_GROUP_NO_TRAINABLE_AUTODETECT = 0x1
SX_GROUP_RESERVE_CHECKPOINT_STAGING = 0x2
SX_GROUP_JOIN = 0x4
SX_GROUP_MEMORY_COPY_WAIT = 0x8
SX_GROUP_OPENMP_THREADS = 0x10

SX_MAX_NDIM = 8
SX_MAX_WORLD_SIZE = 65536
SX_MAX_NAME_BYTES = 1024

SX_LOAD_PARAMS_ONLY = 0x1
SX_LOAD_ALLOW_MISSING = 0x2
SX_LOAD_ALLOW_EXTRA = 0x4

SX_LOSS_SCALING_NONE = 0
SX_LOSS_SCALING_DYNAMIC = 1
SX_LOSS_SCALING_STATIC = 2
SX_REDUCE_SUM = 1
SX_REDUCE_MEAN = 2
SX_REDUCE_MAX = 3
SX_REDUCE_MIN = 4
SX_MAX_ALL_REDUCE = 64
SX_NONFINITE_DEFAULT = 0
SX_NONFINITE_SKIP = 1
SX_NONFINITE_ERROR = 2

# ----------------------------------------------------------------------------------
# Struct mirrors
# ----------------------------------------------------------------------------------
c_status = ctypes.c_int32


# The handles are opaque; a distinct pointer type keeps each from being mixed up with
# the others.
class sx_future(ctypes.Structure):
    pass


class sx_shard_group(ctypes.Structure):
    pass


class sx_context(ctypes.Structure):
    pass


sx_future_p = ctypes.POINTER(sx_future)
sx_shard_group_p = ctypes.POINTER(sx_shard_group)
sx_context_p = ctypes.POINTER(sx_context)


class sx_norm_domain(ctypes.Structure):
    pass


sx_norm_domain_p = ctypes.POINTER(sx_norm_domain)


class sx_group_config_t(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("rendezvous", ctypes.c_char_p),
                ("rank", ctypes.c_int32), ("world_size", ctypes.c_int32),
                ("stage", ctypes.c_int32), ("backend", ctypes.c_int32),
                ("num_threads", ctypes.c_int32), ("alignment", ctypes.c_int32),
                ("timeout_ms", ctypes.c_int32), ("flags", ctypes.c_uint32),
                ("bind_address", ctypes.c_char_p), ("device_ordinal", ctypes.c_int32),
                ("reserved0", ctypes.c_int32), ("grad_dtype", ctypes.c_int32),
                ("reduce_dtype", ctypes.c_int32), ("prefetch_depth", ctypes.c_int32),
                ("shard_size", ctypes.c_int32), ("grad_predivide_factor", ctypes.c_double),
                ("trace_path", ctypes.c_char_p), ("trace_events", ctypes.c_int32),
                ("transport", ctypes.c_int32), ("rendezvous_token", ctypes.c_char_p),
                ("rendezvous_bind", ctypes.c_char_p), ("memory_copy_interval", ctypes.c_int32),
                ("offload", ctypes.c_int32), ("reserved1", ctypes.c_int32),
                ("context", sx_context_p), ("name", ctypes.c_char_p)]


class sx_param_group_desc_t(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("optimizer", ctypes.c_int32),
                ("nesterov", ctypes.c_int32), ("maximize", ctypes.c_int32),
                ("amsgrad", ctypes.c_int32), ("lr", ctypes.c_double),
                ("weight_decay", ctypes.c_double), ("beta1", ctypes.c_double),
                ("beta2", ctypes.c_double), ("eps", ctypes.c_double),
                ("momentum", ctypes.c_double), ("dampening", ctypes.c_double),
                ("centered", ctypes.c_int32), ("decoupled_weight_decay", ctypes.c_int32),
                ("lr_decay", ctypes.c_double), ("initial_accumulator_value", ctypes.c_double),
                ("alpha", ctypes.c_double), ("momentum_decay", ctypes.c_double),
                ("ns_a", ctypes.c_double), ("ns_b", ctypes.c_double), ("ns_c", ctypes.c_double),
                ("ns_steps", ctypes.c_int32), ("adjust_lr", ctypes.c_int32),
                ("beta2_decay", ctypes.c_double), ("eps2", ctypes.c_double), ("d", ctypes.c_double),
                ("beta3", ctypes.c_double), ("t_alpha_beta3", ctypes.c_double),
                ("state_dtype", ctypes.c_int32), ("bf16_stochastic_round", ctypes.c_int32)]


class sx_param_desc_t(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("name", ctypes.c_char_p),
                ("ndim", ctypes.c_int32), ("dtype", ctypes.c_int32),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("param_group", ctypes.c_int32),
                ("unit", ctypes.c_int32), ("frozen", ctypes.c_int32),
                ("reserved0", ctypes.c_int32), ("placement", ctypes.c_int32),
                ("split_dim", ctypes.c_int32), ("global_shape", ctypes.POINTER(ctypes.c_int64)),
                ("split_offset", ctypes.c_int64), ("replica", ctypes.c_int32),
                ("replicas", ctypes.c_int32)]


class sx_view_t(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("data", ctypes.c_void_p),
                ("numel", ctypes.c_uint64), ("dtype", ctypes.c_int32),
                ("device", ctypes.c_int32)]


class sx_step_options_t(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("max_grad_norm", ctypes.c_double),
                ("stream", ctypes.c_void_p), ("keep_grads", ctypes.c_int32),
                ("defer_gather", ctypes.c_int32), ("weighted", ctypes.c_int32),
                ("reserved0", ctypes.c_int32), ("weight", ctypes.c_double),
                ("nonfinite", ctypes.c_int32), ("reserved1", ctypes.c_int32)]


class sx_param_state_t(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("param", ctypes.c_int32),
                ("param_group", ctypes.c_int32), ("name", ctypes.c_char_p),
                ("numel", ctypes.c_uint64), ("step", ctypes.c_int64),
                ("momentum_steps", ctypes.c_int64), ("num_tensors", ctypes.c_int32),
                ("reserved0", ctypes.c_int32),
                ("tensor_names", ctypes.POINTER(ctypes.c_char_p)),
                ("tensors", ctypes.POINTER(ctypes.POINTER(ctypes.c_float))), ("mu_product", ctypes.c_double),
                ("tensor_numels", ctypes.POINTER(ctypes.c_uint64))]


class sx_step_result_t(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("grad_norm", ctypes.c_double),
                ("step", ctypes.c_uint64), ("skipped", ctypes.c_int32),
                ("reserved0", ctypes.c_int32), ("loss_scale", ctypes.c_double),
                ("nonfinite", ctypes.c_int32), ("reserved1", ctypes.c_int32)]


class sx_loss_scaling_t(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("mode", ctypes.c_int32),
                ("growth_interval", ctypes.c_int32), ("init_scale", ctypes.c_double),
                ("growth_factor", ctypes.c_double), ("backoff_factor", ctypes.c_double)]


class sx_memory_stats_t(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("param_bytes", ctypes.c_uint64),
                ("grad_bytes", ctypes.c_uint64), ("optimizer_bytes", ctypes.c_uint64),
                ("staging_bytes", ctypes.c_uint64),
                ("unsharded_optimizer_bytes", ctypes.c_uint64),
                ("peak_param_bytes", ctypes.c_uint64), ("memory_copy_bytes", ctypes.c_uint64),
                ("device_bytes", ctypes.c_uint64)]


class sx_unit_ready_options_t(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("accumulate", ctypes.c_int32),
                ("reserved0", ctypes.c_int32), ("stream", ctypes.c_void_p)]


class sx_param_info_t(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("name", ctypes.c_char_p),
                ("ndim", ctypes.c_int32), ("dtype", ctypes.c_int32),
                ("shape", ctypes.c_int64 * SX_MAX_NDIM), ("numel", ctypes.c_uint64),
                ("param_group", ctypes.c_int32), ("unit", ctypes.c_int32),
                ("trainable", ctypes.c_int32), ("reserved0", ctypes.c_int32),
                ("offset_in_unit", ctypes.c_uint64), ("shard_begin", ctypes.c_uint64),
                ("shard_end", ctypes.c_uint64)]


class sx_unit_info_t(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("unit", ctypes.c_int32),
                ("num_params", ctypes.c_int32), ("numel", ctypes.c_uint64),
                ("padded_numel", ctypes.c_uint64), ("shard_numel", ctypes.c_uint64),
                ("shard_begin", ctypes.c_uint64), ("trainable", ctypes.c_int32),
                ("has_optimizer_state", ctypes.c_int32), ("shard_size", ctypes.c_int32),
                ("shard_rank", ctypes.c_int32), ("replicas", ctypes.c_int32),
                ("replica_rank", ctypes.c_int32)]


class sx_context_config_t(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("rendezvous", ctypes.c_char_p),
                ("rank", ctypes.c_int32), ("world_size", ctypes.c_int32),
                ("backend", ctypes.c_int32), ("num_threads", ctypes.c_int32),
                ("timeout_ms", ctypes.c_int32), ("transport", ctypes.c_int32),
                ("bind_address", ctypes.c_char_p), ("rendezvous_token", ctypes.c_char_p),
                ("rendezvous_bind", ctypes.c_char_p), ("device_ordinal", ctypes.c_int32),
                ("reserved0", ctypes.c_int32), ("memory_budget_bytes", ctypes.c_uint64)]


class sx_context_stats_t(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("groups", ctypes.c_int64),
                ("groups_created", ctypes.c_int64), ("channels", ctypes.c_int64),
                ("memory_bytes", ctypes.c_uint64), ("memory_budget_bytes", ctypes.c_uint64),
                ("shared_memory", ctypes.c_int32), ("reserved0", ctypes.c_int32),
                ("transport_bytes", ctypes.c_uint64)]


sx_log_fn = ctypes.CFUNCTYPE(None, ctypes.c_int32, ctypes.c_char_p, ctypes.c_void_p)
sx_future_callback = ctypes.CFUNCTYPE(None, sx_future_p, c_status, ctypes.c_void_p)
sx_param_state_fn = ctypes.CFUNCTYPE(c_status, ctypes.POINTER(sx_param_state_t), ctypes.c_void_p)


class sx_save_options_t(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("path", ctypes.c_char_p),
                ("user_blob", ctypes.c_void_p), ("user_blob_size", ctypes.c_uint64),
                ("keep_last", ctypes.c_int32), ("synchronous", ctypes.c_int32),
                ("callback", sx_future_callback), ("callback_user", ctypes.c_void_p)]


class sx_load_options_t(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("path", ctypes.c_char_p),
                ("flags", ctypes.c_uint32), ("reserved0", ctypes.c_int32)]


class sx_regroup_options_t(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("checkpoint", ctypes.c_char_p),
                ("load_flags", ctypes.c_uint32), ("join_window_ms", ctypes.c_int32),
                ("expected_world_size", ctypes.c_int32), ("admit", ctypes.c_int32)]


class sx_regroup_result_t(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("epoch", ctypes.c_int32), ("rank", ctypes.c_int32),
                ("world_size", ctypes.c_int32), ("shard_size", ctypes.c_int32),
                ("previous_rank", ctypes.c_int32), ("previous_world_size", ctypes.c_int32),
                ("step", ctypes.c_uint64), ("from_memory", ctypes.c_int32), ("reserved0", ctypes.c_int32)]


# Custom optimizers (1.5). The piece is filled by the library only, for the update; its
# pointers (float *, const float *, float *[3], const double *, char *) are read as plain
# addresses (c_void_p: an int), which is what building arrays over them (or writing the
# error message with memmove) needs, and cheaper.
class sx_optimizer_piece_t(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("param", ctypes.c_void_p),
                ("grad", ctypes.c_void_p), ("state", ctypes.c_void_p * SX_MAX_CUSTOM_SLOTS),
                ("n", ctypes.c_size_t), ("grad_scale", ctypes.c_float),
                ("param_index", ctypes.c_int32), ("param_group", ctypes.c_int32),
                ("offset", ctypes.c_uint64), ("step", ctypes.c_int64),
                ("hyperparameters", ctypes.c_void_p), ("user_data", ctypes.c_void_p),
                ("num_slots", ctypes.c_int32), ("num_hyperparameters", ctypes.c_int32),
                ("error", ctypes.c_void_p), ("error_size", ctypes.c_size_t)]


sx_optimizer_update_fn = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.POINTER(sx_optimizer_piece_t))


class sx_optimizer_hyperparameter_t(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("default_value", ctypes.c_double),
                ("min", ctypes.c_double), ("max", ctypes.c_double)]


class sx_optimizer_desc_t(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("name", ctypes.c_char_p),
                ("num_slots", ctypes.c_int32), ("slot_names", ctypes.POINTER(ctypes.c_char_p)),
                ("slot_initial_values", ctypes.POINTER(ctypes.c_float)),
                ("num_hyperparameters", ctypes.c_int32),
                ("hyperparameters", ctypes.POINTER(sx_optimizer_hyperparameter_t)),
                ("update", sx_optimizer_update_fn), ("user_data", ctypes.c_void_p),
                ("flags", ctypes.c_uint32), ("reserved0", ctypes.c_int32)]


class sx_hf_export_options_t(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("root", ctypes.c_int32), ("dtype", ctypes.c_int32),
                ("max_shard_bytes", ctypes.c_uint64), ("num_names", ctypes.c_int32),
                ("only_named", ctypes.c_int32), ("sx_names", ctypes.POINTER(ctypes.c_char_p)),
                ("file_names", ctypes.POINTER(ctypes.c_char_p))]


class sx_peft_config_t(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("base_model_name_or_path", ctypes.c_char_p),
                ("task_type", ctypes.c_char_p), ("bias", ctypes.c_char_p), ("extra_json", ctypes.c_char_p),
                ("target_modules", ctypes.POINTER(ctypes.c_char_p)), ("num_target_modules", ctypes.c_int32),
                ("r", ctypes.c_int32), ("lora_alpha", ctypes.c_double), ("lora_dropout", ctypes.c_double),
                ("use_rslora", ctypes.c_int32), ("fan_in_fan_out", ctypes.c_int32)]


class sx_hf_import_options_t(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("root", ctypes.c_int32), ("num_names", ctypes.c_int32),
                ("only_named", ctypes.c_int32), ("allow_missing", ctypes.c_int32),
                ("allow_unexpected", ctypes.c_int32), ("reserved0", ctypes.c_int32),
                ("sx_names", ctypes.POINTER(ctypes.c_char_p)), ("file_names", ctypes.POINTER(ctypes.c_char_p))]


class sx_hf_import_report_t(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("num_loaded", ctypes.c_int32),
                ("num_missing", ctypes.c_int32), ("num_unexpected", ctypes.c_int32),
                ("reserved0", ctypes.c_int32), ("missing", ctypes.POINTER(ctypes.c_char_p)),
                ("missing_keys", ctypes.POINTER(ctypes.c_char_p)), ("unexpected", ctypes.POINTER(ctypes.c_char_p))]


# Every public struct, by its C typedef name (the keys of sx_layout.json's "structs").
STRUCTS = {cls.__name__: cls for cls in (
    sx_group_config_t, sx_param_group_desc_t, sx_param_desc_t, sx_view_t, sx_step_options_t,
    sx_step_result_t, sx_loss_scaling_t, sx_memory_stats_t, sx_param_info_t, sx_unit_info_t,
    sx_save_options_t, sx_load_options_t, sx_unit_ready_options_t, sx_param_state_t,
    sx_optimizer_piece_t, sx_optimizer_hyperparameter_t, sx_optimizer_desc_t, sx_regroup_options_t,
    sx_regroup_result_t, sx_context_config_t, sx_context_stats_t, sx_hf_export_options_t, sx_peft_config_t,
    sx_hf_import_options_t, sx_hf_import_report_t)}

# ----------------------------------------------------------------------------------
# Prototypes: name -> (restype, argtypes)
# ----------------------------------------------------------------------------------
_P = ctypes.POINTER
_c = ctypes
PROTOTYPES = {
    "sx_hf_export_options_init": (c_status, [_P(sx_hf_export_options_t), _c.c_size_t]),
    "sx_export_hf": (c_status, [sx_shard_group_p, _c.c_char_p, _P(sx_hf_export_options_t)]),
    "sx_peft_config_init": (c_status, [_P(sx_peft_config_t), _c.c_size_t]),
    "sx_export_peft": (c_status, [sx_shard_group_p, _c.c_char_p, _P(sx_hf_export_options_t),
                                  _P(sx_peft_config_t)]),
    "sx_hf_import_options_init": (c_status, [_P(sx_hf_import_options_t), _c.c_size_t]),
    "sx_hf_import_report_init": (c_status, [_P(sx_hf_import_report_t), _c.c_size_t]),
    "sx_import_hf": (c_status, [sx_shard_group_p, _c.c_char_p, _P(sx_hf_import_options_t),
                                _P(sx_hf_import_report_t)]),
    "sx_version": (_c.c_uint32, []),
    "sx_status_string": (_c.c_char_p, [c_status]),
    "sx_last_error_message": (_c.c_char_p, []),
    "sx_set_log_callback": (c_status, [sx_log_fn, _c.c_void_p, _c.c_int32]),
    "sx_group_config_init": (c_status, [_P(sx_group_config_t), _c.c_size_t]),
    "sx_create_shard_group": (c_status, [_P(sx_group_config_t), _P(sx_shard_group_p)]),
    "sx_destroy_shard_group": (c_status, [sx_shard_group_p]),
    "sx_abort": (c_status, [sx_shard_group_p]),
    "sx_regroup_options_init": (c_status, [_P(sx_regroup_options_t), _c.c_size_t]),
    "sx_regroup_result_init": (c_status, [_P(sx_regroup_result_t), _c.c_size_t]),
    "sx_regroup": (c_status, [sx_shard_group_p, _P(sx_regroup_options_t), _P(sx_regroup_result_t)]),
    "sx_poll_joiners": (c_status, [sx_shard_group_p, _P(ctypes.c_int32)]),
    "sx_get_lost_ranks": (c_status, [sx_shard_group_p, _P(_c.c_int32), _c.c_int32, _P(_c.c_int32)]),
    "sx_trace_flush": (c_status, [sx_shard_group_p]),
    "sx_context_config_init": (c_status, [_P(sx_context_config_t), _c.c_size_t]),
    "sx_context_stats_init": (c_status, [_P(sx_context_stats_t), _c.c_size_t]),
    "sx_create_context": (c_status, [_P(sx_context_config_t), _P(sx_context_p)]),
    "sx_create_norm_domain": (c_status, [_P(sx_group_config_t), _P(sx_norm_domain_p)]),
    "sx_destroy_norm_domain": (c_status, [sx_norm_domain_p]),
    "sx_join_norm_domain": (c_status, [sx_shard_group_p, sx_norm_domain_p, _c.c_int32]),
    "sx_destroy_context": (c_status, [sx_context_p]),
    "sx_get_context_stats": (c_status, [sx_context_p, _P(sx_context_stats_t)]),
    "sx_param_group_desc_init": (c_status, [_P(sx_param_group_desc_t), _c.c_size_t, _c.c_int32]),
    "sx_optimizer_desc_init": (c_status, [_P(sx_optimizer_desc_t), _c.c_size_t]),
    "sx_register_optimizer": (c_status, [_P(sx_optimizer_desc_t), _P(_c.c_int32)]),
    "sx_add_param_group": (c_status, [sx_shard_group_p, _P(sx_param_group_desc_t), _P(_c.c_int32)]),
    "sx_set_hyperparameter": (c_status, [sx_shard_group_p, _c.c_int32, _c.c_int32, _c.c_double]),
    "sx_get_hyperparameter": (c_status, [sx_shard_group_p, _c.c_int32, _c.c_int32, _P(_c.c_double)]),
    "sx_set_lr": (c_status, [sx_shard_group_p, _c.c_int32, _c.c_double]),
    "sx_get_param_group_steps": (c_status, [sx_shard_group_p, _c.c_int32, _P(_c.c_int64)]),
    "sx_param_desc_init": (c_status, [_P(sx_param_desc_t), _c.c_size_t]),
    "sx_add_param": (c_status, [sx_shard_group_p, _P(sx_param_desc_t), _P(_c.c_int32)]),
    "sx_finalize": (c_status, [sx_shard_group_p]),
    "sx_broadcast_params": (c_status, [sx_shard_group_p, _c.c_int32]),
    "sx_all_reduce": (c_status, [sx_shard_group_p, _P(_c.c_double), _c.c_int32, _c.c_int32]),
    "sx_unit_view": (c_status, [sx_shard_group_p, _c.c_int32, _c.c_int32, _P(sx_view_t)]),
    "sx_view_init": (c_status, [_P(sx_view_t), _c.c_size_t]),
    "sx_param_view": (c_status, [sx_shard_group_p, _c.c_int32, _P(sx_view_t)]),
    "sx_grad_view": (c_status, [sx_shard_group_p, _c.c_int32, _P(sx_view_t)]),
    "sx_find_param": (c_status, [sx_shard_group_p, _c.c_char_p, _P(_c.c_int32)]),
    "sx_set_trainable": (c_status, [sx_shard_group_p, _c.c_int32, _c.c_int32]),
    "sx_get_trainable": (c_status, [sx_shard_group_p, _c.c_int32, _P(_c.c_int32)]),
    "sx_trainable_mask": (c_status, [sx_shard_group_p, _P(_P(_c.c_uint8)), _P(_c.c_int32)]),
    "sx_refresh_trainable": (c_status, [sx_shard_group_p]),
    "sx_accumulate_grads": (c_status, [sx_shard_group_p]),
    "sx_step_options_init": (c_status, [_P(sx_step_options_t), _c.c_size_t]),
    "sx_step_result_init": (c_status, [_P(sx_step_result_t), _c.c_size_t]),
    "sx_step": (c_status, [sx_shard_group_p, _P(sx_step_options_t), _P(sx_step_result_t)]),
    "sx_unit_ready_options_init": (c_status, [_P(sx_unit_ready_options_t), _c.c_size_t]),
    "sx_unit_grads_ready": (c_status, [sx_shard_group_p, _c.c_int32, _P(sx_unit_ready_options_t)]),
    "sx_unit_gather": (c_status, [sx_shard_group_p, _c.c_int32]),
    "sx_unit_release": (c_status, [sx_shard_group_p, _c.c_int32]),
    "sx_loss_scaling_init": (c_status, [_P(sx_loss_scaling_t), _c.c_size_t]),
    "sx_set_loss_scaling": (c_status, [sx_shard_group_p, _P(sx_loss_scaling_t)]),
    "sx_get_loss_scale": (c_status, [sx_shard_group_p, _P(_c.c_double)]),
    "sx_get_rank": (c_status, [sx_shard_group_p, _P(_c.c_int32)]),
    "sx_get_world_size": (c_status, [sx_shard_group_p, _P(_c.c_int32)]),
    "sx_get_stage": (c_status, [sx_shard_group_p, _P(_c.c_int32)]),
    "sx_get_num_params": (c_status, [sx_shard_group_p, _P(_c.c_int32)]),
    "sx_get_num_units": (c_status, [sx_shard_group_p, _P(_c.c_int32)]),
    "sx_get_num_param_groups": (c_status, [sx_shard_group_p, _P(_c.c_int32)]),
    "sx_memory_stats_init": (c_status, [_P(sx_memory_stats_t), _c.c_size_t]),
    "sx_get_memory_stats": (c_status, [sx_shard_group_p, _P(sx_memory_stats_t)]),
    "sx_param_info_init": (c_status, [_P(sx_param_info_t), _c.c_size_t]),
    "sx_get_param_info": (c_status, [sx_shard_group_p, _c.c_int32, _P(sx_param_info_t)]),
    "sx_unit_info_init": (c_status, [_P(sx_unit_info_t), _c.c_size_t]),
    "sx_get_unit_info": (c_status, [sx_shard_group_p, _c.c_int32, _P(sx_unit_info_t)]),
    "sx_save_options_init": (c_status, [_P(sx_save_options_t), _c.c_size_t]),
    "sx_save_optim_state": (c_status, [sx_shard_group_p, _P(sx_save_options_t), _P(sx_future_p)]),
    "sx_future_poll": (c_status, [sx_future_p, _P(_c.c_int32)]),
    "sx_future_wait": (c_status, [sx_future_p, _c.c_int64]),
    "sx_future_wait_staged": (c_status, [sx_future_p, _c.c_int64]),
    "sx_future_cancel": (c_status, [sx_future_p]),
    "sx_future_error_message": (_c.c_char_p, [sx_future_p]),
    "sx_future_progress": (c_status, [sx_future_p, _P(_c.c_uint64), _P(_c.c_uint64)]),
    "sx_future_destroy": (c_status, [sx_future_p]),
    "sx_load_optim_state_options_init": (c_status, [_P(sx_load_options_t), _c.c_size_t]),
    "sx_load_optim_state": (c_status, [sx_shard_group_p, _P(sx_load_options_t)]),
    "sx_read_user_blob": (c_status, [_c.c_char_p, _c.c_void_p, _c.c_uint64, _P(_c.c_uint64)]),
    "sx_gather_optim_state": (c_status, [sx_shard_group_p, _c.c_int32, sx_param_state_fn, _c.c_void_p]),
    "sx_scatter_optim_state": (c_status, [sx_shard_group_p, _c.c_int32, sx_param_state_fn, _c.c_void_p]),
    "sx_state_view": (c_status, [sx_shard_group_p, _c.c_int32, _c.c_char_p, _P(sx_view_t)]),
}


class LibraryError(ImportError):
    """libsx could not be found or opened, or its version does not fit this binding."""


def _candidates():
    path = os.environ.get("SX_LIBRARY")
    if path:
        return [path]  # an explicit choice: no silent fallback to another copy
    # `pip install .` puts the library it built inside the package.
    here = os.path.dirname(os.path.abspath(__file__))
    bundled = [os.path.join(here, name) for name in ("libsx.so.1", "libsx.so")]
    found = ctypes.util.find_library("sx")
    return [p for p in bundled if os.path.exists(p)] + ([found] if found else []) + ["libsx.so.1", "libsx.so"]


def _open():
    tried = []
    for name in _candidates():
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError as e:
            tried.append(f"{name}: {e}")
    else:
        raise LibraryError("cannot load libsx (install the package with `pip install .` from sx's "
                           "source tree, which builds it, or set SX_LIBRARY to the path of libsx.so): "
                           + "; ".join(tried))
    for name, (restype, argtypes) in PROTOTYPES.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    return lib


def check_version(number, binding=BINDING_VERSION):
    """Raises LibraryError unless runtime version `number` (MAJOR*10000+MINOR*100+PATCH)
    has the binding's major and a minor at least the binding's."""
    major, minor = number // 10000, number // 100 % 100
    if major != binding[0] or minor < binding[1]:
        raise LibraryError(
            f"libsx {major}.{minor}.{number % 100} does not fit this binding, which needs "
            f"{binding[0]}.x with x >= {binding[1]} (set SX_LIBRARY to a matching libsx.so)")


lib = _open()
check_version(lib.sx_version())


def init_struct(cls, *extra):
    """A `cls` filled by its sx_*_init function (struct_size and every default)."""
    obj = cls()
    status = getattr(lib, INIT_FUNCTIONS[cls.__name__])(ctypes.byref(obj), ctypes.sizeof(cls), *extra)
    if status != SX_OK:  # only a binding bug gets here: the arguments are the binding's own
        raise RuntimeError(f"{INIT_FUNCTIONS[cls.__name__]} failed with status {status}: "
                           f"{lib.sx_last_error_message().decode('utf-8', 'replace')}")
    return obj


# The structs callers fill, each with its init function (sx_param_state_t and
# sx_optimizer_piece_t are only ever filled by the library, for a callback;
# sx_optimizer_hyperparameter_t is an array element without struct_size).
INIT_FUNCTIONS = {
    "sx_group_config_t": "sx_group_config_init",
    "sx_param_group_desc_t": "sx_param_group_desc_init",
    "sx_param_desc_t": "sx_param_desc_init",
    "sx_view_t": "sx_view_init",
    "sx_step_options_t": "sx_step_options_init",
    "sx_step_result_t": "sx_step_result_init",
    "sx_unit_ready_options_t": "sx_unit_ready_options_init",
    "sx_loss_scaling_t": "sx_loss_scaling_init",
    "sx_memory_stats_t": "sx_memory_stats_init",
    "sx_param_info_t": "sx_param_info_init",
    "sx_unit_info_t": "sx_unit_info_init",
    "sx_save_options_t": "sx_save_options_init",
    "sx_load_options_t": "sx_load_optim_state_options_init",
    "sx_optimizer_desc_t": "sx_optimizer_desc_init",
    "sx_regroup_options_t": "sx_regroup_options_init",
    "sx_regroup_result_t": "sx_regroup_result_init",
    "sx_context_config_t": "sx_context_config_init",
    "sx_context_stats_t": "sx_context_stats_init",
    "sx_hf_export_options_t": "sx_hf_export_options_init",
    "sx_peft_config_t": "sx_peft_config_init",
    "sx_hf_import_options_t": "sx_hf_import_options_init",
    "sx_hf_import_report_t": "sx_hf_import_report_init",
}
