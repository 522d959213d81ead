//! Configuration structs, builder style. Each holds the C struct filled by its
//! `sx_*_init` function (so defaults come from the library) plus the Rust-owned data
//! its pointers refer to.
use std::ffi::CString;
use std::mem::MaybeUninit;
use std::os::raw::c_void;

use sx_sys as sys;

use crate::error::{invalid_argument, Result};

pub(crate) fn c_string(what: &str, s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| invalid_argument(format!("{} {:?} contains a NUL byte", what, s)))
}

/// An optional string as an optional C string (None stays None).
pub(crate) fn c_string_opt(what: &str, s: &Option<String>) -> Result<Option<CString>> {
    s.as_ref().map(|s| c_string(what, s)).transpose()
}

/// A rendezvous token as a C string: its own text stays out of the error (c_string would
/// show it).
pub(crate) fn c_secret(s: &Option<Secret>) -> Result<Option<CString>> {
    s.as_ref()
        .map(|t| CString::new(t.0.as_str()).map_err(|_| invalid_argument("rendezvous_token contains a NUL byte".to_string())))
        .transpose()
}

/// The pointer C reads for an optional C string: NULL for None.
pub(crate) fn c_ptr(s: &Option<CString>) -> *const std::os::raw::c_char {
    s.as_ref().map_or(std::ptr::null(), |c| c.as_ptr())
}

/// Calls an `sx_*_init(p, size)` function on a fresh struct. The init functions only
/// fail on a NULL pointer or a too-small size, neither possible here.
pub(crate) fn init<T>(f: unsafe extern "C" fn(*mut T, usize) -> sys::sx_status_t) -> T {
    let mut v = MaybeUninit::<T>::zeroed();
    let s = unsafe { f(v.as_mut_ptr(), std::mem::size_of::<T>()) };
    assert_eq!(s, sys::SX_OK, "sx init function failed on a struct of its own size");
    unsafe { v.assume_init() }
}

/// How [`crate::ShardGroup::all_reduce`] combines the ranks' values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    /// The sum divided by the world size.
    Mean,
    Max,
    Min,
}

impl ReduceOp {
    pub(crate) fn raw(self) -> i32 {
        match self {
            ReduceOp::Sum => sys::SX_REDUCE_SUM,
            ReduceOp::Mean => sys::SX_REDUCE_MEAN,
            ReduceOp::Max => sys::SX_REDUCE_MAX,
            ReduceOp::Min => sys::SX_REDUCE_MIN,
        }
    }
}

/// What gradients holding inf or NaN do at a step ([`StepOptions::nonfinite`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NonFinite {
    /// Where the step needs the global norm first (clipping, dynamic loss scaling), a
    /// non-finite norm skips the step on every rank; otherwise the update runs and inf/NaN
    /// reach the params, as in torch.
    Default,
    /// The norm is always taken first, and a non-finite one skips the step.
    Skip,
    /// As `Skip`, and the step then returns an error with `SX_ERR_NONFINITE`.
    Error,
}

/// Where buffers live and which collectives run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// CUDA where libsx has CUDA and finds a device, else the CPU. Views wrapped as
    /// slices need host memory: ask for `Cpu`.
    Auto,
    Cpu,
    Cuda,
}

impl Backend {
    pub(crate) fn raw(self) -> i32 {
        match self {
            Backend::Auto => sys::SX_BACKEND_AUTO,
            Backend::Cpu => sys::SX_BACKEND_CPU,
            Backend::Cuda => sys::SX_BACKEND_CUDA,
        }
    }
}

/// How CPU ranks exchange ([`GroupConfig::transport`]). CUDA groups use NCCL whatever it
/// says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// Through shared memory where every rank of a communicator runs on this host
    /// (processes or threads; the ranks compare their hosts' identities), else Gloo's TCP.
    /// The environment variable SX_SHARED_MEMORY=0 has it act as `Tcp`.
    Auto,
    /// Gloo's TCP always.
    Tcp,
}

impl Transport {
    pub(crate) fn raw(self) -> i32 {
        match self {
            Transport::Auto => sys::SX_TRANSPORT_AUTO,
            Transport::Tcp => sys::SX_TRANSPORT_TCP,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dtype {
    F32,
    F16,
    Bf16,
}

impl Dtype {
    pub(crate) fn raw(self) -> i32 {
        match self {
            Dtype::F32 => sys::SX_DTYPE_F32,
            Dtype::F16 => sys::SX_DTYPE_F16,
            Dtype::Bf16 => sys::SX_DTYPE_BF16,
        }
    }

    pub(crate) fn from_raw(v: i32) -> Option<Dtype> {
        match v {
            sys::SX_DTYPE_F32 => Some(Dtype::F32),
            sys::SX_DTYPE_F16 => Some(Dtype::F16),
            sys::SX_DTYPE_BF16 => Some(Dtype::Bf16),
            _ => None,
        }
    }
}

/// How ranks meet and what the group is: `GroupConfig::new("local://name").rank(r).world_size(n)`,
/// or, for a group made in a [`Context`](crate::Context), `GroupConfig::in_context(&ctx, "name")`.
#[derive(Clone, Debug)]
pub struct GroupConfig {
    pub(crate) raw: sys::sx_group_config_t,
    pub(crate) rendezvous: String,
    pub(crate) bind_address: Option<String>,
    pub(crate) trace_path: Option<String>,
    pub(crate) rendezvous_token: Option<Secret>,
    pub(crate) rendezvous_bind: Option<String>,
    pub(crate) context: Option<std::sync::Arc<crate::context::RawContext>>,
    pub(crate) name: Option<String>,
}

/// A rendezvous token: its Debug shows that there is one, never what it is.
#[derive(Clone)]
pub(crate) struct Secret(pub(crate) String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl GroupConfig {
    /// Calls `f` with the C struct, its strings in C memory and its context's handle
    /// borrowed for the call (config holds the handle meanwhile).
    pub(crate) fn with_raw<R>(&self, f: impl FnOnce(&sys::sx_group_config_t) -> Result<R>) -> Result<R> {
        let rendezvous = c_string("rendezvous", &self.rendezvous)?;
        let bind = c_string_opt("bind_address", &self.bind_address)?;
        let trace = c_string_opt("trace_path", &self.trace_path)?;
        let token = c_secret(&self.rendezvous_token)?;
        let rendezvous_bind = c_string_opt("rendezvous_bind", &self.rendezvous_bind)?;
        let name = c_string_opt("name", &self.name)?;
        let mut raw = self.raw;
        raw.rendezvous =
            if self.rendezvous.is_empty() && self.context.is_some() { std::ptr::null() } else { rendezvous.as_ptr() };
        raw.bind_address = c_ptr(&bind);
        raw.trace_path = c_ptr(&trace);
        raw.rendezvous_token = c_ptr(&token);
        raw.rendezvous_bind = c_ptr(&rendezvous_bind);
        raw.name = c_ptr(&name);
        raw.context = self.context.as_ref().map_or(std::ptr::null_mut(), |c| c.as_ptr());
        f(&raw)
    }

    /// `rendezvous`: "local://NAME", "tcp://HOST:PORT", "file:///DIR" or "env://".
    pub fn new(rendezvous: &str) -> GroupConfig {
        GroupConfig {
            raw: init(sys::sx_group_config_init),
            rendezvous: rendezvous.to_string(),
            bind_address: None,
            trace_path: None,
            rendezvous_token: None,
            rendezvous_bind: None,
            context: None,
            name: None,
        }
    }
    /// A group made in `context` under `name` (the same on every rank; no two live groups
    /// of a context share one, SX_ERR_INVALID_STATE otherwise). It takes the context's
    /// rendezvous, ranks, backend, pool, timeout and transport: leave those unset (or set
    /// them to the context's). The config holds the context's handle until it is dropped.
    pub fn in_context(context: &crate::Context, name: &str) -> GroupConfig {
        GroupConfig::new("").context(context).name(name)
    }
    /// The context to make the group in (see [`GroupConfig::in_context`]).
    pub fn context(mut self, context: &crate::Context) -> Self {
        self.context = Some(context.raw.clone());
        self
    }
    /// The group's name in its context: at most 128 bytes of letters, digits and "-_.".
    /// Without a context, only with [`GroupConfig::join`]: the context's group (on the
    /// rendezvous) that this process joins.
    pub fn name(mut self, name: &str) -> Self {
        self.name = Some(name.to_string());
        self
    }
    pub fn rank(mut self, rank: i32) -> Self {
        self.raw.rank = rank;
        self
    }
    /// 0 takes rank and world size from the environment (env://).
    pub fn world_size(mut self, world_size: i32) -> Self {
        self.raw.world_size = world_size;
        self
    }
    /// ZeRO stage 1 or 2 (0 = 2).
    pub fn stage(mut self, stage: i32) -> Self {
        self.raw.stage = stage;
        self
    }
    pub fn backend(mut self, backend: Backend) -> Self {
        self.raw.backend = backend.raw();
        self
    }
    /// How CPU ranks exchange (default `Transport::Auto`: shared memory between ranks of
    /// one host, else TCP). Every rank passes the same.
    pub fn transport(mut self, transport: Transport) -> Self {
        self.raw.transport = transport.raw();
        self
    }
    pub fn num_threads(mut self, n: i32) -> Self {
        self.raw.num_threads = n;
        self
    }
    pub fn alignment(mut self, bytes: i32) -> Self {
        self.raw.alignment = bytes;
        self
    }
    pub fn timeout_ms(mut self, ms: i32) -> Self {
        self.raw.timeout_ms = ms;
        self
    }
    /// `SX_GROUP_*` flags.
    pub fn flags(mut self, flags: u32) -> Self {
        self.raw.flags = flags;
        self
    }
    /// Finalize reserves the memory checkpoint saves stage this rank's shard in, so that
    /// the first save blocks no longer than later ones (SX_GROUP_RESERVE_CHECKPOINT_STAGING).
    pub fn reserve_checkpoint_staging(mut self, on: bool) -> Self {
        if on {
            self.raw.flags |= sys::SX_GROUP_RESERVE_CHECKPOINT_STAGING;
        } else {
            self.raw.flags &= !sys::SX_GROUP_RESERVE_CHECKPOINT_STAGING;
        }
        self
    }
    /// This process joins a running group on the rendezvous (SX_GROUP_JOIN): it connects
    /// to nobody (rank and world size are ignored); register the params and param groups
    /// as the members have them, finalize, then
    /// [`ShardGroup::regroup`](crate::ShardGroup::regroup) waits until the members admit
    /// it ([`ShardGroup::poll_joiners`](crate::ShardGroup::poll_joiners), then their
    /// [`ShardGroup::regroup_admitting`](crate::ShardGroup::regroup_admitting)).
    pub fn join(mut self, on: bool) -> Self {
        if on {
            self.raw.flags |= sys::SX_GROUP_JOIN;
        } else {
            self.raw.flags &= !sys::SX_GROUP_JOIN;
        }
        self
    }
    pub fn bind_address(mut self, address: &str) -> Self {
        self.bind_address = Some(address.to_string());
        self
    }
    pub fn device_ordinal(mut self, ordinal: i32) -> Self {
        self.raw.device_ordinal = ordinal;
        self
    }
    /// Mixed precision: `Dtype::F32` gives every param an fp32 gradient whatever its
    /// dtype (default: each param's own dtype).
    pub fn grad_dtype(mut self, dtype: Dtype) -> Self {
        self.raw.grad_dtype = dtype.raw();
        self
    }
    /// Mixed precision: `Dtype::F32` sums 16-bit gradients over ranks in fp32 (default:
    /// in the gradients' own dtype, divided by the pre-divide factor before the sum).
    pub fn reduce_dtype(mut self, dtype: Dtype) -> Self {
        self.raw.reduce_dtype = dtype.raw();
        self
    }
    /// Stage 3: how many units sx gathers ahead of the trainer's `gather_unit` calls, in
    /// the previous step's order (`None`: none; default 1).
    pub fn prefetch_depth(mut self, depth: Option<i32>) -> Self {
        self.raw.prefetch_depth = depth.unwrap_or(sys::SX_PREFETCH_NONE);
        self
    }
    /// HSDP: `size` ranks (a divisor of the world size; 0: all of them) shard the model,
    /// and the world size / `size` groups of them replicate it.
    pub fn shard_size(mut self, size: i32) -> Self {
        self.raw.shard_size = size;
        self
    }
    /// 16-bit gradients are divided by `factor` (>= 1) before their sum and multiplied
    /// back in fp32 after (0: FSDP's factor for the shard group).
    pub fn grad_predivide_factor(mut self, factor: impl Into<f64>) -> Self {
        self.raw.grad_predivide_factor = factor.into();
        self
    }
    /// The step timeline (docs/tracing.md): the Chrome trace-event JSON file this rank
    /// writes ("%r" becomes the rank; without one, ".rank<N>" goes before ".json").
    /// Default: the SX_TRACE environment variable's, if set. Written by
    /// [`ShardGroup::flush_trace`](crate::ShardGroup::flush_trace) and when the group is dropped.
    pub fn trace_path(mut self, path: &str) -> Self {
        self.trace_path = Some(path.to_string());
        self
    }
    /// The most events the trace keeps (the oldest go first; 0: 65536).
    pub fn trace_events(mut self, events: i32) -> Self {
        self.raw.trace_events = events;
        self
    }
    /// The secret every rank proves it holds to sx's TCP rendezvous server (tcp://, and
    /// env:// where rank 0 serves); unset, SX_RENDEZVOUS_TOKEN. A wrong or missing one
    /// fails `ShardGroup::new` with SX_ERR_INVALID_ARGUMENT.
    pub fn rendezvous_token(mut self, token: &str) -> Self {
        self.rendezvous_token = Some(Secret(token.to_string()));
        self
    }
    /// Where rank 0's rendezvous server listens: unset, SX_RENDEZVOUS_BIND or the
    /// rendezvous host's address; "*" = every interface.
    pub fn rendezvous_bind(mut self, address: &str) -> Self {
        self.rendezvous_bind = Some(address.to_string());
        self
    }
    /// Every `steps` steps each rank keeps a copy of its shard of the state in host
    /// memory (a flat group's ranks send theirs to the next rank too), from which
    /// [`ShardGroup::regroup`](crate::ShardGroup::regroup) restores the survivors without
    /// a checkpoint; 0 = none. Any backend (a CUDA group's copies are in host memory too).
    pub fn memory_copy_interval(mut self, steps: i32) -> Self {
        self.raw.memory_copy_interval = steps;
        self
    }
    /// A step that takes a memory copy returns once the next rank holds it, so that no
    /// step that returned is taken again after a loss (SX_GROUP_MEMORY_COPY_WAIT).
    pub fn memory_copy_wait(mut self, on: bool) -> Self {
        if on {
            self.raw.flags |= sys::SX_GROUP_MEMORY_COPY_WAIT;
        } else {
            self.raw.flags &= !sys::SX_GROUP_MEMORY_COPY_WAIT;
        }
        self
    }
    /// In a process that runs an OpenMP runtime of its own, the optimizer work of this
    /// group's calls runs on the calling thread's OpenMP team instead of the group's own
    /// pool (SX_GROUP_OPENMP_THREADS; without such a runtime loaded, creation fails with
    /// an error whose code is `SX_ERR_UNSUPPORTED`).
    pub fn openmp_threads(mut self, on: bool) -> Self {
        if on {
            self.raw.flags |= sys::SX_GROUP_OPENMP_THREADS;
        } else {
            self.raw.flags &= !sys::SX_GROUP_OPENMP_THREADS;
        }
        self
    }
    /// `true` (SX_OFFLOAD_STATE): a CUDA group keeps its fp32 masters and optimizer state in
    /// pinned host memory, where sx's CPU kernels update them, so that every optimizer runs
    /// on it ([`MemoryStats::device_bytes`](crate::MemoryStats::device_bytes) says what stays
    /// on the device); `false` (default, SX_OFFLOAD_NONE): on its device. CPU groups ignore it.
    pub fn offload(mut self, on: bool) -> Self {
        self.raw.offload = if on { sys::SX_OFFLOAD_STATE } else { sys::SX_OFFLOAD_NONE };
        self
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Optimizer {
    Sgd,
    Adam,
    AdamW,
    Adagrad,
    Rmsprop,
    Adamax,
    Nadam,
    Radam,
    /// Lion (Chen et al. 2023), as the lion-pytorch package's.
    Lion,
    /// LAMB (You et al. 2020), as the pytorch-optimizer package's Lamb. CPU groups, and CUDA
    /// groups with [`GroupConfig::offload`].
    Lamb,
    /// Muon, as torch.optim.Muon: 2-D params only (give others a group of another
    /// optimizer, AdamW as usual). CPU groups, and CUDA groups with [`GroupConfig::offload`].
    Muon,
    /// Adafactor, as torch.optim.Adafactor: factored second moments for params of two
    /// or more dimensions. CPU groups, and CUDA groups with [`GroupConfig::offload`].
    Adafactor,
    /// AdEMAMix (Pagliardini et al. 2024), as the pytorch-optimizer package's AdEMAMix.
    Ademamix,
    /// A custom optimizer, as [`crate::register_optimizer`] returned it.
    Custom(crate::CustomOptimizer),
}

impl Optimizer {
    /// The optimizer's id: an `SX_OPTIM_*` value, or a custom optimizer's.
    pub fn id(self) -> i32 {
        self.raw()
    }

    fn raw(self) -> i32 {
        match self {
            Optimizer::Custom(c) => c.id(),
            Optimizer::Sgd => sys::SX_OPTIM_SGD,
            Optimizer::Adam => sys::SX_OPTIM_ADAM,
            Optimizer::AdamW => sys::SX_OPTIM_ADAMW,
            Optimizer::Adagrad => sys::SX_OPTIM_ADAGRAD,
            Optimizer::Rmsprop => sys::SX_OPTIM_RMSPROP,
            Optimizer::Adamax => sys::SX_OPTIM_ADAMAX,
            Optimizer::Nadam => sys::SX_OPTIM_NADAM,
            Optimizer::Radam => sys::SX_OPTIM_RADAM,
            Optimizer::Lion => sys::SX_OPTIM_LION,
            Optimizer::Lamb => sys::SX_OPTIM_LAMB,
            Optimizer::Muon => sys::SX_OPTIM_MUON,
            Optimizer::Adafactor => sys::SX_OPTIM_ADAFACTOR,
            Optimizer::Ademamix => sys::SX_OPTIM_ADEMAMIX,
        }
    }
}

/// An optimizer and its hyperparameters, starting from the optimizer's defaults
/// (torch.optim's; lion-pytorch's for Lion; pytorch-optimizer's for LAMB). A
/// hyperparameter that does not apply to the optimizer must keep its default (or be 0,
/// which means the default), else `add_param_group` fails with SX_ERR_INVALID_ARGUMENT.
#[derive(Clone, Copy, Debug)]
pub struct ParamGroup {
    pub(crate) raw: sys::sx_param_group_desc_t,
}

impl ParamGroup {
    /// A custom optimizer ([`Optimizer::Custom`]) starts from its registered defaults.
    pub fn new(optimizer: Optimizer) -> ParamGroup {
        let mut raw = MaybeUninit::<sys::sx_param_group_desc_t>::zeroed();
        let s = unsafe {
            sys::sx_param_group_desc_init(raw.as_mut_ptr(), std::mem::size_of_val(&raw), optimizer.raw())
        };
        assert_eq!(s, sys::SX_OK, "sx_param_group_desc_init failed for a known optimizer");
        ParamGroup { raw: unsafe { raw.assume_init() } }
    }
    pub fn lr(mut self, v: impl Into<f64>) -> Self {
        self.raw.lr = v.into();
        self
    }
    pub fn weight_decay(mut self, v: impl Into<f64>) -> Self {
        self.raw.weight_decay = v.into();
        self
    }
    pub fn betas(mut self, beta1: impl Into<f64>, beta2: impl Into<f64>) -> Self {
        self.raw.beta1 = beta1.into();
        self.raw.beta2 = beta2.into();
        self
    }
    pub fn eps(mut self, v: impl Into<f64>) -> Self {
        self.raw.eps = v.into();
        self
    }
    pub fn momentum(mut self, v: impl Into<f64>) -> Self {
        self.raw.momentum = v.into();
        self
    }
    pub fn dampening(mut self, v: impl Into<f64>) -> Self {
        self.raw.dampening = v.into();
        self
    }
    pub fn nesterov(mut self, on: bool) -> Self {
        self.raw.nesterov = on as i32;
        self
    }
    pub fn maximize(mut self, on: bool) -> Self {
        self.raw.maximize = on as i32;
        self
    }
    /// Adam, AdamW.
    pub fn amsgrad(mut self, on: bool) -> Self {
        self.raw.amsgrad = on as i32;
        self
    }
    /// Adagrad.
    pub fn lr_decay(mut self, v: impl Into<f64>) -> Self {
        self.raw.lr_decay = v.into();
        self
    }
    /// Adagrad.
    pub fn initial_accumulator_value(mut self, v: impl Into<f64>) -> Self {
        self.raw.initial_accumulator_value = v.into();
        self
    }
    /// RMSprop's smoothing constant.
    pub fn alpha(mut self, v: impl Into<f64>) -> Self {
        self.raw.alpha = v.into();
        self
    }
    /// RMSprop.
    pub fn centered(mut self, on: bool) -> Self {
        self.raw.centered = on as i32;
        self
    }
    /// NAdam.
    pub fn momentum_decay(mut self, v: impl Into<f64>) -> Self {
        self.raw.momentum_decay = v.into();
        self
    }
    /// NAdam, RAdam, LAMB: AdamW-style (decoupled) weight decay (LAMB's default: on,
    /// pytorch-optimizer's weight_decouple).
    pub fn decoupled_weight_decay(mut self, on: bool) -> Self {
        self.raw.decoupled_weight_decay = on as i32;
        self
    }
    /// Muon: the Newton-Schulz coefficients (a, b, c), torch's ns_coefficients.
    pub fn ns_coefficients(mut self, a: impl Into<f64>, b: impl Into<f64>, c: impl Into<f64>) -> Self {
        self.raw.ns_a = a.into();
        self.raw.ns_b = b.into();
        self.raw.ns_c = c.into();
        self
    }
    /// Muon: Newton-Schulz iterations, 1 to 99.
    pub fn ns_steps(mut self, n: i32) -> Self {
        self.raw.ns_steps = n;
        self
    }
    /// Muon: the lr each param is updated with, torch's adjust_lr_fn.
    pub fn adjust_lr(mut self, f: MuonAdjustLr) -> Self {
        self.raw.adjust_lr = f.value();
        self
    }
    /// Adafactor: the second moments' decay, (1 - beta2_t) = step^beta2_decay, <= 0.
    pub fn beta2_decay(mut self, v: impl Into<f64>) -> Self {
        self.raw.beta2_decay = v.into();
        self
    }
    /// Adafactor: the floor of a param's RMS in its step size, the second of torch's eps
    /// (its first is [`ParamGroup::eps`]; torch's None is 2^-23, the default).
    pub fn eps2(mut self, v: impl Into<f64>) -> Self {
        self.raw.eps2 = v.into();
        self
    }
    /// Adafactor: the update's RMS is clipped to d, >= 1.
    pub fn d(mut self, v: impl Into<f64>) -> Self {
        self.raw.d = v.into();
        self
    }
    /// AdEMAMix: the slow moment's decay, in [0, 1) (its alpha is [`ParamGroup::alpha`]).
    pub fn beta3(mut self, v: impl Into<f64>) -> Self {
        self.raw.beta3 = v.into();
        self
    }
    /// AdEMAMix: the steps alpha and beta3 warm up over; 0 (the default): no warmup.
    pub fn t_alpha_beta3(mut self, v: impl Into<f64>) -> Self {
        self.raw.t_alpha_beta3 = v.into();
        self
    }
    /// How the group keeps its optimizer state slots (the default: [`StateDtype::Fp32`]).
    pub fn state_dtype(mut self, dtype: StateDtype) -> Self {
        self.raw.state_dtype = dtype.value();
        self
    }
    /// torchao's bf16_stochastic_round: the group's params, every one bf16, keep no fp32
    /// master weights; each update is computed in fp32 and rounded stochastically into
    /// them, with random bits that depend on the param, its step and the element only (the
    /// same at any world size and stage). Elementwise optimizers, on CPU and CUDA groups; checkpoints
    /// and the whole-state calls carry its params as fp32 (widened, and rounded to nearest
    /// back); a state view of "master" is the bf16 params; memory copies and regroup carry
    /// them as bf16.
    pub fn bf16_stochastic_round(mut self, on: bool) -> Self {
        self.raw.bf16_stochastic_round = on as i32;
        self
    }
    /// The C description as filled so far.
    pub fn raw(&self) -> &sys::sx_param_group_desc_t {
        &self.raw
    }
}

/// Muon's adjust_lr ([`ParamGroup::adjust_lr`], [`Hyperparameter::AdjustLr`]), torch's
/// adjust_lr_fn: the lr a param of shape [A, B] is updated with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MuonAdjustLr {
    /// lr * sqrt(max(1, A / B)) (torch's None or "original"; the default).
    Original,
    /// lr * 0.2 * sqrt(max(A, B)) ("match_rms_adamw").
    MatchRmsAdamW,
    /// lr * sqrt(A / B) ("spectral_unclamped").
    SpectralUnclamped,
}

impl MuonAdjustLr {
    /// The `SX_MUON_ADJUST_LR_*` value (as [`Hyperparameter::AdjustLr`] takes it, as f64).
    pub fn value(self) -> i32 {
        match self {
            MuonAdjustLr::Original => sys::SX_MUON_ADJUST_LR_ORIGINAL,
            MuonAdjustLr::MatchRmsAdamW => sys::SX_MUON_ADJUST_LR_MATCH_RMS_ADAMW,
            MuonAdjustLr::SpectralUnclamped => sys::SX_MUON_ADJUST_LR_SPECTRAL_UNCLAMPED,
        }
    }
}

/// How a param group keeps its optimizer state slots ([`ParamGroup::state_dtype`],
/// [`Hyperparameter::StateDtype`]). Every update is computed in fp32 whatever the slots
/// hold. Bf16 and 8-bit slots apply to the elementwise optimizers (SGD, Adam, AdamW,
/// Adagrad, RMSprop, Adamax, NAdam, RAdam, Lion, AdEMAMix); LAMB's, Muon's, Adafactor's
/// and custom optimizers' slots stay fp32.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateDtype {
    /// fp32 slots (the default).
    Fp32,
    /// bf16 slots, rounded to nearest even after each update.
    Bf16,
    /// 8-bit block-wise slots, torchao's AdamW8bit quantization: blocks of 256 elements,
    /// each a scale and 256 codes; a param of fewer than 4096 elements, or not a multiple
    /// of 256, keeps fp32 slots.
    EightBit,
}

impl StateDtype {
    /// The `SX_STATE_*` value (as [`Hyperparameter::StateDtype`] takes it, as f64).
    pub fn value(self) -> i32 {
        match self {
            StateDtype::Fp32 => sys::SX_STATE_FP32,
            StateDtype::Bf16 => sys::SX_STATE_BF16,
            StateDtype::EightBit => sys::SX_STATE_8BIT,
        }
    }
}

/// Keys of [`crate::ShardGroup::set_hyperparameter`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hyperparameter {
    Lr,
    WeightDecay,
    Beta1,
    Beta2,
    Eps,
    Momentum,
    Dampening,
    Nesterov,
    Maximize,
    Amsgrad,
    LrDecay,
    InitialAccumulatorValue,
    Alpha,
    Centered,
    MomentumDecay,
    DecoupledWeightDecay,
    /// Muon: the Newton-Schulz coefficients a, b and c.
    NsA,
    NsB,
    NsC,
    /// Muon: Newton-Schulz iterations, 1 to 99.
    NsSteps,
    /// Muon: a [`MuonAdjustLr`] value.
    AdjustLr,
    /// Adafactor: the second moments' decay (<= 0), the floor of a param's RMS in its
    /// step size (the second of torch's eps), and the update's RMS clip (>= 1).
    Beta2Decay,
    Eps2,
    D,
    /// AdEMAMix: the slow moment's decay, in [0, 1), and the steps alpha and beta3 warm
    /// up over (0: none).
    Beta3,
    TAlphaBeta3,
    /// A [`StateDtype`] value; only before sx_finalize lays its group out.
    StateDtype,
    /// 0 or 1 ([`ParamGroup::bf16_stochastic_round`]); only before sx_finalize lays its
    /// group out.
    Bf16StochasticRound,
    /// A custom optimizer's own hyperparameter i (counting only its own, in registration
    /// order): key `SX_HP_CUSTOM + i`.
    Custom(u32),
}

impl Hyperparameter {
    pub(crate) fn raw(self) -> i32 {
        match self {
            Hyperparameter::Lr => sys::SX_HP_LR,
            Hyperparameter::WeightDecay => sys::SX_HP_WEIGHT_DECAY,
            Hyperparameter::Beta1 => sys::SX_HP_BETA1,
            Hyperparameter::Beta2 => sys::SX_HP_BETA2,
            Hyperparameter::Eps => sys::SX_HP_EPS,
            Hyperparameter::Momentum => sys::SX_HP_MOMENTUM,
            Hyperparameter::Dampening => sys::SX_HP_DAMPENING,
            Hyperparameter::Nesterov => sys::SX_HP_NESTEROV,
            Hyperparameter::Maximize => sys::SX_HP_MAXIMIZE,
            Hyperparameter::Amsgrad => sys::SX_HP_AMSGRAD,
            Hyperparameter::LrDecay => sys::SX_HP_LR_DECAY,
            Hyperparameter::InitialAccumulatorValue => sys::SX_HP_INITIAL_ACCUMULATOR_VALUE,
            Hyperparameter::Alpha => sys::SX_HP_ALPHA,
            Hyperparameter::Centered => sys::SX_HP_CENTERED,
            Hyperparameter::MomentumDecay => sys::SX_HP_MOMENTUM_DECAY,
            Hyperparameter::DecoupledWeightDecay => sys::SX_HP_DECOUPLED_WEIGHT_DECAY,
            Hyperparameter::NsA => sys::SX_HP_NS_A,
            Hyperparameter::NsB => sys::SX_HP_NS_B,
            Hyperparameter::NsC => sys::SX_HP_NS_C,
            Hyperparameter::NsSteps => sys::SX_HP_NS_STEPS,
            Hyperparameter::AdjustLr => sys::SX_HP_ADJUST_LR,
            Hyperparameter::Beta2Decay => sys::SX_HP_BETA2_DECAY,
            Hyperparameter::Eps2 => sys::SX_HP_EPS2,
            Hyperparameter::D => sys::SX_HP_D,
            Hyperparameter::Beta3 => sys::SX_HP_BETA3,
            Hyperparameter::TAlphaBeta3 => sys::SX_HP_T_ALPHA_BETA3,
            Hyperparameter::StateDtype => sys::SX_HP_STATE_DTYPE,
            Hyperparameter::Bf16StochasticRound => sys::SX_HP_BF16_STOCHASTIC_ROUND,
            Hyperparameter::Custom(i) => sys::SX_HP_CUSTOM.saturating_add(i.min(i32::MAX as u32) as i32),
        }
    }
}

/// A param to register: `Param::new("w", &[8, 16]).unit(0)`; `&[]` for a scalar.
/// A shape of `usize` (a Rust model's dimensions): `Param::new_usize("w", &[c, 4 * c])`.
#[derive(Clone, Debug)]
pub struct Param {
    pub(crate) name: String,
    pub(crate) shape: Vec<i64>,
    /// A dimension that does not fit in i64, reported by add_param.
    pub(crate) bad_dim: Option<String>,
    pub(crate) dtype: Dtype,
    pub(crate) param_group: i32,
    pub(crate) unit: i32,
    pub(crate) frozen: bool,
    /// Placement (docs/model-parallel.md): SX_PLACEMENT_*, and its fields.
    pub(crate) placement: i32,
    pub(crate) global_shape: Vec<i64>,
    pub(crate) split_dim: i32,
    pub(crate) split_offset: i64,
    pub(crate) replica: i32,
    pub(crate) replicas: i32,
}

impl Param {
    pub fn new(name: &str, shape: &[i64]) -> Param {
        Param {
            name: name.to_string(),
            shape: shape.to_vec(),
            bad_dim: None,
            dtype: Dtype::F32,
            param_group: 0,
            unit: 0,
            frozen: false,
            placement: sys::SX_PLACEMENT_WHOLE,
            global_shape: Vec::new(),
            split_dim: 0,
            split_offset: 0,
            replica: 0,
            replicas: 0,
        }
    }
    /// [`Param::new`] with a shape of `usize`; a dimension above `i64::MAX` fails
    /// `add_param` with SX_ERR_INVALID_ARGUMENT.
    pub fn new_usize(name: &str, shape: &[usize]) -> Param {
        let mut p = Param::new(name, &[]);
        for (i, &d) in shape.iter().enumerate() {
            p.shape.push(i64::try_from(d).unwrap_or_else(|_| {
                p.bad_dim = Some(format!("dimension {} is {}, above i64::MAX", i, d));
                -1
            }));
        }
        p
    }
    pub fn dtype(mut self, dtype: Dtype) -> Self {
        self.dtype = dtype;
        self
    }
    pub fn param_group(mut self, index: i32) -> Self {
        self.param_group = index;
        self
    }
    pub fn unit(mut self, unit: i32) -> Self {
        self.unit = unit;
        self
    }
    pub fn frozen(mut self, frozen: bool) -> Self {
        self.frozen = frozen;
        self
    }
    /// The piece `[offset, offset + shape[dim])` on dimension `dim` of a logical tensor of
    /// `global_shape` (a tensor-parallel slice's part of a weight).
    pub fn split(mut self, global_shape: &[i64], dim: i32, offset: i64) -> Self {
        self.placement = sys::SX_PLACEMENT_SPLIT;
        self.global_shape = global_shape.to_vec();
        self.split_dim = dim;
        self.split_offset = offset;
        self
    }
    /// Copy `index` of `count` identical copies (a layer norm on every tensor-parallel
    /// rank): copy 0 alone counts in a norm domain's gradient norm.
    pub fn replica(mut self, index: i32, count: i32) -> Self {
        self.placement = sys::SX_PLACEMENT_REPLICATED;
        self.replica = index;
        self.replicas = count;
        self
    }
}

/// Options of [`crate::ShardGroup::step`].
#[derive(Clone, Copy, Debug)]
pub struct StepOptions {
    pub(crate) raw: sys::sx_step_options_t,
}

impl StepOptions {
    pub fn new() -> StepOptions {
        StepOptions { raw: init(sys::sx_step_options_init) }
    }
    /// Clip the global gradient norm to this value (0 = no clipping).
    pub fn max_grad_norm(mut self, v: impl Into<f64>) -> Self {
        self.raw.max_grad_norm = v.into();
        self
    }
    /// Leave the grads as they are after the step instead of zeroing them.
    pub fn keep_grads(mut self, keep: bool) -> Self {
        self.raw.keep_grads = keep as i32;
        self
    }
    /// A CUDA stream (cudaStream_t) to order the step on.
    pub fn stream(mut self, stream: *mut c_void) -> Self {
        self.raw.stream = stream;
        self
    }
    /// Stages 1 and 2: return after the update and gather the params in the background;
    /// [`crate::ShardGroup::gather_unit`] waits for a unit's.
    pub fn defer_gather(mut self, defer: bool) -> Self {
        self.raw.defer_gather = defer as i32;
        self
    }
    /// Uneven inputs: this step's gradients are sums over this rank's `weight` samples
    /// (or tokens), and the step divides their sum over the ranks by the sum of every
    /// rank's weight, so that the update is the one a single process would make over the
    /// union of the data. A rank whose data ran out passes 0 and leaves its gradients at
    /// zero; if every rank passes 0, the step is skipped ([`crate::StepResult::skipped`])
    /// and nothing changes. Either every rank sets a weight (finite, >= 0) or none does
    /// (the default: each rank's gradients are its mean, averaged over the ranks).
    pub fn weight(mut self, weight: impl Into<f64>) -> Self {
        self.raw.weighted = 1;
        self.raw.weight = weight.into();
        self
    }
    /// What gradients holding inf or NaN do (every rank passes the same).
    pub fn nonfinite(mut self, mode: NonFinite) -> Self {
        self.raw.nonfinite = match mode {
            NonFinite::Default => sys::SX_NONFINITE_DEFAULT,
            NonFinite::Skip => sys::SX_NONFINITE_SKIP,
            NonFinite::Error => sys::SX_NONFINITE_ERROR,
        };
        self
    }
}

/// Options of [`crate::ShardGroup::unit_grads_ready`].
#[derive(Clone, Copy, Debug)]
pub struct UnitReadyOptions {
    pub(crate) raw: sys::sx_unit_ready_options_t,
}

impl UnitReadyOptions {
    pub fn new() -> UnitReadyOptions {
        UnitReadyOptions { raw: init(sys::sx_unit_ready_options_init) }
    }
    /// An intermediate micro-batch (`accumulate_grads` ends it); default: the last.
    pub fn accumulate(mut self, accumulate: bool) -> Self {
        self.raw.accumulate = accumulate as i32;
        self
    }
    /// The CUDA stream (cudaStream_t) the gradients were written on.
    pub fn stream(mut self, stream: *mut c_void) -> Self {
        self.raw.stream = stream;
        self
    }
}

impl Default for UnitReadyOptions {
    fn default() -> Self {
        UnitReadyOptions::new()
    }
}

impl Default for StepOptions {
    fn default() -> Self {
        StepOptions::new()
    }
}

/// How [`LossScaling`] treats the gradients.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LossScalingMode {
    /// Gradients are used as they are (the default).
    None,
    /// Skip steps whose gradients hold inf/NaN and back the scale off; grow it after
    /// `growth_interval` good steps in a row.
    Dynamic,
    /// Divide the gradients by `init_scale`, never skip.
    Static,
}

impl LossScalingMode {
    fn raw(self) -> i32 {
        match self {
            LossScalingMode::None => sys::SX_LOSS_SCALING_NONE,
            LossScalingMode::Dynamic => sys::SX_LOSS_SCALING_DYNAMIC,
            LossScalingMode::Static => sys::SX_LOSS_SCALING_STATIC,
        }
    }
}

/// Loss scaling for [`crate::ShardGroup::set_loss_scaling`], with
/// torch.cuda.amp.GradScaler's semantics and defaults (init_scale 65536, growth_factor 2,
/// backoff_factor 0.5, growth_interval 2000): `LossScaling::dynamic().init_scale(1024.0)`.
#[derive(Clone, Copy, Debug)]
pub struct LossScaling {
    pub(crate) raw: sys::sx_loss_scaling_t,
}

impl LossScaling {
    /// Fields not set take the library's defaults.
    pub fn new(mode: LossScalingMode) -> LossScaling {
        let mut raw: sys::sx_loss_scaling_t = init(sys::sx_loss_scaling_init);
        raw.mode = mode.raw();
        LossScaling { raw }
    }
    pub fn dynamic() -> LossScaling {
        LossScaling::new(LossScalingMode::Dynamic)
    }
    /// The first scale (finite, > 0), and the only one under `LossScalingMode::Static`.
    pub fn init_scale(mut self, v: impl Into<f64>) -> Self {
        self.raw.init_scale = v.into();
        self
    }
    /// > 1.
    pub fn growth_factor(mut self, v: impl Into<f64>) -> Self {
        self.raw.growth_factor = v.into();
        self
    }
    /// In (0, 1).
    pub fn backoff_factor(mut self, v: impl Into<f64>) -> Self {
        self.raw.backoff_factor = v.into();
        self
    }
    /// Steps in a row without inf/NaN before the scale grows (> 0).
    pub fn growth_interval(mut self, steps: i32) -> Self {
        self.raw.growth_interval = steps;
        self
    }
    /// The C struct as filled so far.
    pub fn raw(&self) -> &sys::sx_loss_scaling_t {
        &self.raw
    }
}

/// What to save and how: `SaveOptions::new("ckpt/step-100").user_blob(bytes)`.
pub struct SaveOptions {
    pub(crate) path: String,
    pub(crate) user_blob: Vec<u8>,
    pub(crate) keep_last: i32,
    pub(crate) synchronous: bool,
    pub(crate) callback: Option<Box<dyn FnOnce(crate::Result<()>) + Send + 'static>>,
}

impl SaveOptions {
    pub fn new(path: &str) -> SaveOptions {
        SaveOptions { path: path.to_string(), user_blob: Vec::new(), keep_last: 0, synchronous: false, callback: None }
    }
    /// Opaque bytes stored in the manifest (at most 64 MiB).
    pub fn user_blob(mut self, blob: &[u8]) -> Self {
        self.user_blob = blob.to_vec();
        self
    }
    pub fn keep_last(mut self, n: i32) -> Self {
        self.keep_last = n;
        self
    }
    /// Do all the work in the call.
    pub fn synchronous(mut self, on: bool) -> Self {
        self.synchronous = on;
        self
    }
    /// Called once when the save completes, on sx's I/O thread: it must return quickly
    /// and must not use the group.
    pub fn on_complete<F: FnOnce(crate::Result<()>) + Send + 'static>(mut self, f: F) -> Self {
        self.callback = Some(Box::new(f));
        self
    }
}

/// Options of [`crate::ShardGroup::load`].
#[derive(Clone, Debug)]
pub struct LoadOptions {
    pub(crate) path: String,
    pub(crate) flags: u32,
}

impl LoadOptions {
    pub fn new(path: &str) -> LoadOptions {
        LoadOptions { path: path.to_string(), flags: 0 }
    }
    /// Values only: no optimizer state, steps or hyperparameters.
    pub fn params_only(self, on: bool) -> Self {
        self.set(sys::SX_LOAD_PARAMS_ONLY, on)
    }
    /// Group params absent from the checkpoint keep their values.
    pub fn allow_missing(self, on: bool) -> Self {
        self.set(sys::SX_LOAD_ALLOW_MISSING, on)
    }
    /// Checkpoint params absent from the group are ignored.
    pub fn allow_extra(self, on: bool) -> Self {
        self.set(sys::SX_LOAD_ALLOW_EXTRA, on)
    }
    fn set(mut self, flag: u32, on: bool) -> Self {
        if on {
            self.flags |= flag
        } else {
            self.flags &= !flag
        }
        self
    }
}
