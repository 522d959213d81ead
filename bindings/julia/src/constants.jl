# Part of module SX (src/SX.jl includes it): the constants of include/sx/*.h (check_static.py and bindings_constants check them).

# ----------------------------------------------------------------------------------
# Constants (include/sx/*.h #defines; bindings_constants checks each against the headers)
# ----------------------------------------------------------------------------------
const SX_OK = Int32(0)
const SX_ERR_INVALID_ARGUMENT = Int32(1)
const SX_ERR_INVALID_HANDLE = Int32(2)
const SX_ERR_INVALID_STATE = Int32(3)
const SX_ERR_OUT_OF_MEMORY = Int32(4)
const SX_ERR_NOT_FOUND = Int32(5)
const SX_ERR_ALREADY_EXISTS = Int32(6)
const SX_ERR_UNSUPPORTED = Int32(7)
const SX_ERR_TIMEOUT = Int32(8)
const SX_ERR_COMM = Int32(9)
const SX_ERR_GROUP_FAILED = Int32(10)
const SX_ERR_IO = Int32(11)
const SX_ERR_CORRUPT = Int32(12)
const SX_ERR_VERSION = Int32(13)
const SX_ERR_ABORTED = Int32(14)
const SX_ERR_MISMATCH = Int32(15)
const SX_ERR_INTERNAL = Int32(16)
const SX_ERR_CANCELLED = Int32(17)
const SX_ERR_NONFINITE = Int32(18)
const SX_ERR_OPTIMIZER = Int32(19)
const SX_LOG_ERROR, SX_LOG_WARN, SX_LOG_INFO, SX_LOG_DEBUG = Int32.(1:4)
const SX_DTYPE_F32, SX_DTYPE_F16, SX_DTYPE_BF16 = Int32.(1:3)
const SX_DTYPE_U8 = Int32(4)  # 8-bit optimizer state's codes, as state_view shows them
const SX_BACKEND_AUTO, SX_BACKEND_CPU, SX_BACKEND_CUDA = Int32.(0:2)
const SX_DEVICE_CPU, SX_DEVICE_CUDA = Int32.(0:1)
# Where a CUDA group keeps its fp32 masters and optimizer state (ShardGroup's `offload`).
const SX_OFFLOAD_NONE, SX_OFFLOAD_STATE = Int32.(0:1)
const SX_OPTIM_SGD, SX_OPTIM_ADAM, SX_OPTIM_ADAMW, SX_OPTIM_ADAGRAD, SX_OPTIM_RMSPROP,
      SX_OPTIM_ADAMAX, SX_OPTIM_NADAM, SX_OPTIM_RADAM, SX_OPTIM_LION, SX_OPTIM_LAMB,
      SX_OPTIM_MUON, SX_OPTIM_ADAFACTOR, SX_OPTIM_ADEMAMIX = Int32.(1:13)
const SX_HP_LR, SX_HP_WEIGHT_DECAY, SX_HP_BETA1, SX_HP_BETA2, SX_HP_EPS, SX_HP_MOMENTUM,
      SX_HP_DAMPENING, SX_HP_NESTEROV, SX_HP_MAXIMIZE, SX_HP_AMSGRAD, SX_HP_LR_DECAY,
      SX_HP_INITIAL_ACCUMULATOR_VALUE, SX_HP_ALPHA, SX_HP_CENTERED, SX_HP_MOMENTUM_DECAY,
      SX_HP_DECOUPLED_WEIGHT_DECAY, SX_HP_NS_A, SX_HP_NS_B, SX_HP_NS_C, SX_HP_NS_STEPS,
      SX_HP_ADJUST_LR, SX_HP_BETA2_DECAY, SX_HP_EPS2, SX_HP_D, SX_HP_BETA3,
      SX_HP_T_ALPHA_BETA3, SX_HP_STATE_DTYPE, SX_HP_BF16_STOCHASTIC_ROUND = Int32.(1:28)
# How a param group keeps its optimizer state slots (add_param_group!'s `state_dtype`).
const SX_STATE_FP32, SX_STATE_BF16, SX_STATE_8BIT = Int32.(0:2)
const SX_MUON_ADJUST_LR_ORIGINAL, SX_MUON_ADJUST_LR_MATCH_RMS_ADAMW,
      SX_MUON_ADJUST_LR_SPECTRAL_UNCLAMPED = Int32.(0:2)
const SX_OPTIM_CUSTOM_FIRST = Int32(1000)
const SX_HP_CUSTOM = Int32(1000)
const SX_MAX_CUSTOM_SLOTS = 3
const SX_MAX_CUSTOM_HYPERPARAMETERS = 8
const SX_MAX_CUSTOM_OPTIMIZERS = 64
const SX_OPTIMIZER_ERROR_BYTES = 256  # sx_optimizer_piece_t.error_size
const SX_OPTIMIZER_IN_PLACE = UInt32(0x1)  # sx_optimizer_desc_t.flags
const SX_GROUP_NO_TRAINABLE_AUTODETECT = UInt32(0x1)
const SX_GROUP_RESERVE_CHECKPOINT_STAGING = UInt32(0x2)
const SX_GROUP_JOIN = UInt32(0x4)
const SX_GROUP_MEMORY_COPY_WAIT = UInt32(0x8)
const SX_MAX_NDIM = 8
const SX_MAX_NAME_BYTES = 1024
const SX_MAX_WORLD_SIZE = Int32(65536)
const SX_LOAD_PARAMS_ONLY, SX_LOAD_ALLOW_MISSING, SX_LOAD_ALLOW_EXTRA = UInt32.((0x1, 0x2, 0x4))
const SX_LOSS_SCALING_NONE, SX_LOSS_SCALING_DYNAMIC, SX_LOSS_SCALING_STATIC = Int32.(0:2)
const SX_PREFETCH_NONE = Int32(-1)
const SX_TRANSPORT_AUTO, SX_TRANSPORT_TCP = Int32.(0:1)
const SX_PLACEMENT_WHOLE, SX_PLACEMENT_REPLICATED, SX_PLACEMENT_SPLIT = Int32.(0:2)
const SX_NONFINITE_DEFAULT, SX_NONFINITE_SKIP, SX_NONFINITE_ERROR = Int32.(0:2)
const SX_REDUCE_SUM, SX_REDUCE_MEAN, SX_REDUCE_MAX, SX_REDUCE_MIN = Int32.(1:4)
const SX_MAX_ALL_REDUCE = Int32(64)
