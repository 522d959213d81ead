use std::os::raw::c_void;
use std::ptr;

use sx_sys as sys;

use crate::error::{check, cstr_lossy, invalid_argument, Error, Result};
use crate::future::{self, SaveFuture};
use crate::options::{
    c_string, init, Dtype, GroupConfig, Hyperparameter, LoadOptions, LossScaling, Param, ParamGroup, SaveOptions,
    StepOptions, UnitReadyOptions,
};

/// This rank's handle of a shard group. Released when dropped (or by [`ShardGroup::close`]).
///
/// It may move to another thread (`Send`) but not be shared by threads (not `Sync`):
/// sx lets one thread use a group at a time.
///
/// ```compile_fail
/// fn shared<T: Sync>() {}
/// shared::<sx::ShardGroup>();
/// ```
///
/// Every slice it hands out (params, grads, optimizer state, the trainable mask)
/// borrows it, so none outlives the group, and none is held across a call that may move
/// or replace what it shows (those take `&mut self`: a step, a load, a scatter, adding
/// params) or across [`ShardGroup::close`] (which takes `self`):
///
/// ```compile_fail
/// # fn f(mut g: sx::ShardGroup) -> sx::Result<()> {
/// let w = g.param(0)?;
/// g.step(None)?;
/// let _ = w[0];
/// # Ok(()) }
/// ```
///
/// ```compile_fail
/// # fn f(g: sx::ShardGroup) -> sx::Result<()> {
/// let m = g.state(0, "exp_avg")?;
/// g.close()?;
/// let _ = m[0];
/// # Ok(()) }
/// ```
pub struct ShardGroup {
    pub(crate) raw: *mut sys::sx_shard_group_t,
}

// One thread at a time may use a group, any thread may destroy it.
unsafe impl Send for ShardGroup {}

/// The outcome of a step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepResult {
    /// Global L2 norm of the averaged gradients before clipping.
    pub grad_norm: f64,
    /// Steps taken by the group, this one included.
    pub step: u64,
    /// The step was skipped: inf/NaN gradients where they were checked (see
    /// [`crate::NonFinite`]), or no rank had data.
    pub skipped: bool,
    /// The loss scale to multiply the next losses by (1 without loss scaling).
    pub loss_scale: f64,
    /// The gradients' global norm was inf or NaN.
    pub nonfinite: bool,
}

/// What [`ShardGroup::regroup`] decided: the new epoch, this rank's place before and
/// after, the new mesh's shard size, the step the restored state is at, and where it
/// came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegroupResult {
    pub epoch: i32,
    pub rank: i32,
    pub world_size: i32,
    pub shard_size: i32,
    pub previous_rank: i32,
    pub previous_world_size: i32,
    /// The trainer goes on from the step after this one.
    pub step: u64,
    /// The ranks' memory copies (else the checkpoint).
    pub from_memory: bool,
}

/// Bytes held by this rank, per category.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryStats {
    pub param_bytes: u64,
    pub grad_bytes: u64,
    pub optimizer_bytes: u64,
    pub staging_bytes: u64,
    pub unsharded_optimizer_bytes: u64,
    /// The most param bytes held at once (stage 3: shards plus gathered units).
    pub peak_param_bytes: u64,
    /// Memory copies of the state (GroupConfig::memory_copy_interval) held.
    pub memory_copy_bytes: u64,
    /// Of the bytes above (but staging and memory copies), those in a CUDA device's
    /// memory (GroupConfig::offload keeps the masters and optimizer state off it); 0 for
    /// CPU groups.
    pub device_bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamInfo {
    pub name: String,
    pub dtype: Option<Dtype>,
    pub shape: Vec<i64>,
    pub numel: u64,
    pub param_group: i32,
    pub unit: i32,
    pub trainable: bool,
    pub offset_in_unit: u64,
    /// The part of the param, in its own index space, that this rank's shard covers.
    pub shard: std::ops::Range<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnitInfo {
    pub unit: i32,
    pub num_params: i32,
    pub numel: u64,
    pub padded_numel: u64,
    pub shard_numel: u64,
    pub shard_begin: u64,
    pub trainable: bool,
    pub has_optimizer_state: bool,
    /// The mesh: this rank is `shard_rank` of its shard group's `shard_size` ranks, and
    /// `replica_rank` of the `replicas` groups that hold the same shards.
    pub shard_size: i32,
    pub shard_rank: i32,
    pub replicas: i32,
    pub replica_rank: i32,
}

/// Every param's values and gradient at once, as disjoint mutable slices (index = param index).
pub struct Tensors<'a> {
    pub params: Vec<&'a mut [f32]>,
    pub grads: Vec<&'a mut [f32]>,
}

/// A unit's whole flat buffers of params and of gradients at once, as disjoint mutable
/// slices ([`ShardGroup::unit_tensors_mut`]).
#[derive(Debug)]
pub struct UnitTensors<'a> {
    pub params: &'a mut [f32],
    pub grads: &'a mut [f32],
}

type ViewFn = unsafe extern "C" fn(*const sys::sx_shard_group_t, i32, *mut sys::sx_view_t) -> sys::sx_status_t;

/// An element type a view can be seen as, and the dtypes whose elements it holds.
pub(crate) trait Element {
    const DTYPES: &'static [i32];
    /// For error messages: the Rust type, and the dtypes it holds in words.
    const NAME: &'static str;
    const HOLDS: &'static str;
}

impl Element for f32 {
    const DTYPES: &'static [i32] = &[sys::SX_DTYPE_F32];
    const NAME: &'static str = "f32";
    const HOLDS: &'static str = "fp32";
}

/// fp16 and bf16 elements as their raw bits.
impl Element for u16 {
    const DTYPES: &'static [i32] = &[sys::SX_DTYPE_F16, sys::SX_DTYPE_BF16];
    const NAME: &'static str = "u16";
    const HOLDS: &'static str = "fp16 or bf16";
}

/// 8-bit optimizer state's codes.
impl Element for u8 {
    const DTYPES: &'static [i32] = &[sys::SX_DTYPE_U8];
    const NAME: &'static str = "u8";
    const HOLDS: &'static str = "u8";
}

fn dtype_name(dtype: i32) -> String {
    if dtype == sys::SX_DTYPE_U8 {
        return "u8".to_string();
    }
    match Dtype::from_raw(dtype) {
        Some(Dtype::F32) => "fp32".to_string(),
        Some(Dtype::F16) => "fp16".to_string(),
        Some(Dtype::Bf16) => "bf16".to_string(),
        None => format!("dtype {}", dtype),
    }
}

/// The pointer and length of a view seen as `&[T]`, if it is host memory of a dtype `T`
/// holds; else an error naming `what` of `param` ("param", "grad", "state": the calls
/// so named) and the call to use instead.
pub(crate) fn host_slice<T: Element>(v: sys::sx_view_t, what: &str, param: i32) -> Result<(*mut T, usize)> {
    if !T::DTYPES.contains(&v.dtype) || v.device != sys::SX_DEVICE_CPU {
        let host = v.device == sys::SX_DEVICE_CPU;
        let instead = match Dtype::from_raw(v.dtype) {
            Some(Dtype::F32) if host => format!("{0} or {0}_mut", what),
            Some(Dtype::F16) | Some(Dtype::Bf16) if host => format!("{0}_u16 or {0}_u16_mut", what),
            None if host && v.dtype == sys::SX_DTYPE_U8 => format!("{0}_u8 or {0}_u8_mut", what),
            _ => format!("{}_view for the raw view", what),
        };
        return Err(Error::new(
            sys::SX_ERR_UNSUPPORTED,
            format!(
                "the {} of param {} is {} in {} memory; only {} host memory can be viewed as &[{}] (use {})",
                what,
                param,
                dtype_name(v.dtype),
                if host { "host" } else { "device" },
                T::HOLDS,
                T::NAME,
                instead
            ),
        ));
    }
    let data = if v.numel == 0 { ptr::NonNull::<T>::dangling().as_ptr() } else { v.data as *mut T };
    Ok((data, v.numel as usize))
}

impl ShardGroup {
    /// Creates this rank's handle and connects to the other ranks (collective: blocks
    /// until every rank has joined or the timeout passes). Checks first that the loaded
    /// libsx has a compatible version.
    pub fn new(config: &GroupConfig) -> Result<ShardGroup> {
        crate::check_version()?;
        let mut g = ptr::null_mut();
        config.with_raw(|raw| check(unsafe { sys::sx_create_shard_group(raw, &mut g) }))?;
        Ok(ShardGroup { raw: g })
    }

    /// Releases the group now, reporting the library's status.
    pub fn close(mut self) -> Result<()> {
        let raw = std::mem::replace(&mut self.raw, ptr::null_mut());
        check(unsafe { sys::sx_destroy_shard_group(raw) })
    }

    /// The raw handle, valid while this group lives.
    pub fn as_raw(&self) -> *mut sys::sx_shard_group_t {
        self.raw
    }

    /// Writes this rank's trace file now (replaced atomically) with every event the ring
    /// holds; nothing without a trace. SX_ERR_IO naming the file if it cannot be written.
    pub fn flush_trace(&self) -> Result<()> {
        check(unsafe { sys::sx_trace_flush(self.raw) })
    }

    /// Makes the group fail: later calls return SX_ERR_GROUP_FAILED.
    pub fn abort(&self) -> Result<()> {
        check(unsafe { sys::sx_abort(self.raw) })
    }

    /// Collective over the ranks still alive, after a call failed because a peer was lost
    /// (or after [`abort`](Self::abort)): they form a new group of themselves at the next
    /// epoch, on the same rendezvous, and this handle becomes it. Its state comes from the
    /// ranks' memory copies where the group keeps them
    /// ([`GroupConfig::memory_copy_interval`]) and they still hold every shard, else from
    /// `options`' checkpoint (resharded; an empty path: none). The survivors wait for each
    /// other until `expected_world_size` arrived, or (0) every rank arrived or is known to
    /// be lost, or `join_window_ms` (0: 1000) passed. Where it fails, the handle is still
    /// the broken group, and the survivors may regroup again (a new epoch). Views taken before
    /// are invalid afterwards (the borrow of `&mut self` ends them). The rendezvous store
    /// must outlive the lost ranks: the sx-rendezvous command
    /// (`tcp://HOST:PORT?server=external`), `file://`, or torchrun's agent store.
    pub fn regroup(&mut self, options: &LoadOptions, join_window_ms: i32, expected_world_size: i32)
        -> Result<RegroupResult> {
        self.regroup_admitting(options, join_window_ms, expected_world_size, 0)
    }

    /// The ranks (ascending) whose process is known to have exited: a peer on this host
    /// whose process has gone. Peers on other hosts are known only through the errors
    /// their loss causes. After a failure, `expected_world_size = world_size -
    /// lost_ranks().len()` lets [`regroup`](Self::regroup) close without waiting for its
    /// window. A failed group answers too.
    pub fn lost_ranks(&self) -> Result<Vec<i32>> {
        let mut count = 0;
        check(unsafe { sys::sx_get_lost_ranks(self.raw, ptr::null_mut(), 0, &mut count) })?;
        loop {
            // (Another may be lost between the two calls: then again, with room for it.)
            let mut ranks = vec![0i32; count.max(0) as usize];
            check(unsafe { sys::sx_get_lost_ranks(self.raw, ranks.as_mut_ptr(), ranks.len() as i32, &mut count) })?;
            if count as usize <= ranks.len() {
                ranks.truncate(count.max(0) as usize);
                return Ok(ranks);
            }
        }
    }

    /// Collective: how many processes wait to join the group (GroupConfig::join on its
    /// rendezvous) and were not admitted yet, the same number on every rank.
    pub fn poll_joiners(&mut self) -> Result<i32> {
        let mut waiting = 0;
        check(unsafe { sys::sx_poll_joiners(self.raw, &mut waiting) })?;
        Ok(waiting)
    }

    /// [`regroup`](Self::regroup), admitting `admit` joining processes (what
    /// [`poll_joiners`](Self::poll_joiners) returned, on every member), which take the
    /// ranks after the members'.
    pub fn regroup_admitting(&mut self, options: &LoadOptions, join_window_ms: i32, expected_world_size: i32,
                             admit: i32) -> Result<RegroupResult> {
        let path = c_string("checkpoint path", &options.path)?;
        let mut o: sys::sx_regroup_options_t = init(sys::sx_regroup_options_init);
        o.checkpoint = if options.path.is_empty() { ptr::null() } else { path.as_ptr() };
        o.load_flags = options.flags;
        o.join_window_ms = join_window_ms;
        o.expected_world_size = expected_world_size;
        o.admit = admit;
        let mut r: sys::sx_regroup_result_t = init(sys::sx_regroup_result_init);
        check(unsafe { sys::sx_regroup(self.raw, &o, &mut r) })?;
        Ok(RegroupResult {
            epoch: r.epoch,
            rank: r.rank,
            world_size: r.world_size,
            shard_size: r.shard_size,
            previous_rank: r.previous_rank,
            previous_world_size: r.previous_world_size,
            step: r.step,
            from_memory: r.from_memory != 0,
        })
    }

    /// Adds a param group; returns its index. Before [`ShardGroup::finalize`], or between
    /// steps after it (torch's add_param_group): the group and the params added with it
    /// then wait for the next `finalize`, which every rank calls after adding the same.
    pub fn add_param_group(&mut self, desc: &ParamGroup) -> Result<i32> {
        let mut index = -1;
        check(unsafe { sys::sx_add_param_group(self.raw, &desc.raw, &mut index) })?;
        Ok(index)
    }

    /// Sets a hyperparameter (an `f32` converts exactly; README.md, "Precision").
    pub fn set_hyperparameter(&mut self, param_group: i32, key: Hyperparameter, value: impl Into<f64>) -> Result<()> {
        check(unsafe { sys::sx_set_hyperparameter(self.raw, param_group, key.raw(), value.into()) })
    }

    pub fn hyperparameter(&self, param_group: i32, key: Hyperparameter) -> Result<f64> {
        let mut v = 0.0;
        check(unsafe { sys::sx_get_hyperparameter(self.raw, param_group, key.raw(), &mut v) })?;
        Ok(v)
    }

    /// The steps a param group took since it was added (LAMB's and AdEMAMix's bias
    /// corrections count them; a skipped step does not).
    pub fn param_group_steps(&self, param_group: i32) -> Result<i64> {
        let mut steps = 0i64;
        check(unsafe { sys::sx_get_param_group_steps(self.raw, param_group, &mut steps) })?;
        Ok(steps)
    }

    pub fn set_lr(&mut self, param_group: i32, lr: impl Into<f64>) -> Result<()> {
        check(unsafe { sys::sx_set_lr(self.raw, param_group, lr.into()) })
    }

    /// Registers a param; returns its index. After [`ShardGroup::finalize`] (between
    /// steps), a param goes in a new unit, whose id is above every unit laid out so far,
    /// and has no views until the next `finalize` lays it out.
    pub fn add_param(&mut self, p: &Param) -> Result<i32> {
        let name = c_string("param name", &p.name)?;
        if let Some(bad) = &p.bad_dim {
            return Err(invalid_argument(format!("param {:?}: {}", p.name, bad)));
        }
        let ndim = i32::try_from(p.shape.len())
            .map_err(|_| invalid_argument(format!("param {:?} has {} dimensions", p.name, p.shape.len())))?;
        let mut d: sys::sx_param_desc_t = init(sys::sx_param_desc_init);
        d.name = name.as_ptr();
        d.ndim = ndim;
        d.dtype = p.dtype.raw();
        d.shape = if p.shape.is_empty() { ptr::null() } else { p.shape.as_ptr() };
        d.param_group = p.param_group;
        d.unit = p.unit;
        d.frozen = p.frozen as i32;
        d.placement = p.placement;
        d.global_shape = if p.global_shape.is_empty() { ptr::null() } else { p.global_shape.as_ptr() };
        d.split_dim = p.split_dim;
        d.split_offset = p.split_offset;
        d.replica = p.replica;
        d.replicas = p.replicas;
        let mut index = -1;
        check(unsafe { sys::sx_add_param(self.raw, &d, &mut index) })?;
        Ok(index)
    }

    /// Collective over the domain: joins this group to `domain` as model-parallel slice
    /// `slice`; from then on each step's gradient norm, non-finite check and loss-scale
    /// decision are taken over every group of the domain (docs/model-parallel.md). The
    /// group keeps the domain alive.
    pub fn join_norm_domain(&mut self, domain: &crate::NormDomain, slice: i32) -> Result<()> {
        check(unsafe { sys::sx_join_norm_domain(self.raw, domain.as_ptr(), slice) })
    }

    /// Collective: checks every rank registered the same params, lays out and allocates.
    /// Called again after params were added, it lays out only those, in new units; the
    /// params laid out before keep their values, state and step counts. Ranks that
    /// disagree get [`crate::status::SX_ERR_MISMATCH`] naming the first differing fact.
    pub fn finalize(&mut self) -> Result<()> {
        check(unsafe { sys::sx_finalize(self.raw) })
    }

    /// Collective: copies every param of rank `root` to all ranks.
    pub fn broadcast_params(&mut self, root: i32) -> Result<()> {
        check(unsafe { sys::sx_broadcast_params(self.raw, root) })
    }

    /// Collective: the trainer's own numbers (a loss, token counts) combined over the
    /// ranks in place, element by element (sums in rank order: the same on every rank;
    /// NaN wins). At most `SX_MAX_ALL_REDUCE` values; every rank passes the same op and
    /// count. On an error the values are left as they were.
    pub fn all_reduce(&mut self, values: &mut [f64], op: crate::ReduceOp) -> Result<()> {
        let count = i32::try_from(values.len())
            .map_err(|_| invalid_argument(format!("all_reduce: {} values are too many", values.len())))?;
        check(unsafe { sys::sx_all_reduce(self.raw, values.as_mut_ptr(), count, op.raw()) })
    }

    /// The raw view (pointer, length, dtype, device) of a param's values.
    pub fn param_view(&self, param: i32) -> Result<sys::sx_view_t> {
        self.view(sys::sx_param_view, param)
    }

    /// The raw view of a param's gradient.
    pub fn grad_view(&self, param: i32) -> Result<sys::sx_view_t> {
        self.view(sys::sx_grad_view, param)
    }

    /// The raw view of unit `unit`'s whole flat buffer (an index, as `gather_unit`'s): its
    /// params, or with `grad` its gradients; `padded_numel` elements, each param at its
    /// `offset_in_unit`. With `GroupConfig::alignment(1)` the params are packed: one block.
    pub fn unit_view(&self, unit: i32, grad: bool) -> Result<sys::sx_view_t> {
        let mut v: sys::sx_view_t = init(sys::sx_view_init);
        check(unsafe { sys::sx_unit_view(self.raw, unit, grad as i32, &mut v) })?;
        Ok(v)
    }

    /// Unit `unit`'s params (or with `grad` its gradients) as one writable fp32 slice of
    /// host memory: a trainer that keeps all its params in one array points it here.
    pub fn unit_mut(&mut self, unit: i32, grad: bool) -> Result<&mut [f32]> {
        let (data, len) = self.unit_slice(unit, grad)?;
        Ok(unsafe { std::slice::from_raw_parts_mut(data, len) })
    }

    /// Unit `unit`'s params and gradients together, as two disjoint writable fp32 slices
    /// of host memory (`padded_numel` elements each, every param at its `offset_in_unit`):
    /// one borrow of the group gives both, for a trainer whose forward reads all its params
    /// from one array and whose backward adds into one array of gradients (llm.c's
    /// `params_memory` and `grads_memory`; with `GroupConfig::alignment(1)` and one unit
    /// they are exactly those arrays). Take them again after each step (one C call each):
    /// the step takes `&mut self`, so no view outlives it (README.md, "A model that owns its
    /// group").
    ///
    /// ```compile_fail
    /// # fn f(mut g: sx::ShardGroup) -> sx::Result<()> {
    /// let t = g.unit_tensors_mut(0)?;
    /// g.step(None)?;
    /// t.grads[0] = 1.0;
    /// # Ok(()) }
    /// ```
    pub fn unit_tensors_mut(&mut self, unit: i32) -> Result<UnitTensors<'_>> {
        let (p, np) = self.unit_slice(unit, false)?;
        let (g, ng) = self.unit_slice(unit, true)?;
        // Two buffers of the group (sx_unit_view): the params and the gradients never
        // share memory, and `&mut self` keeps every other view away while these live.
        Ok(UnitTensors {
            params: unsafe { std::slice::from_raw_parts_mut(p, np) },
            grads: unsafe { std::slice::from_raw_parts_mut(g, ng) },
        })
    }

    fn unit_slice(&self, unit: i32, grad: bool) -> Result<(*mut f32, usize)> {
        let v = self.unit_view(unit, grad)?;
        if v.dtype != sys::SX_DTYPE_F32 || v.device != sys::SX_DEVICE_CPU {
            return Err(Error::new(
                sys::SX_ERR_UNSUPPORTED,
                format!(
                    "unit {} holds {} {} in {} memory; only fp32 host memory can be viewed as &mut [f32] (use unit_view)",
                    unit,
                    if grad { "gradients" } else { "params" },
                    dtype_name(v.dtype),
                    if v.device == sys::SX_DEVICE_CPU { "host" } else { "device" }
                ),
            ));
        }
        let data = if v.numel == 0 { ptr::NonNull::<f32>::dangling().as_ptr() } else { v.data as *mut f32 };
        Ok((data, v.numel as usize))
    }

    fn view(&self, f: ViewFn, param: i32) -> Result<sys::sx_view_t> {
        let mut v: sys::sx_view_t = init(sys::sx_view_init);
        check(unsafe { f(self.raw, param, &mut v) })?;
        Ok(v)
    }

    fn typed_slice<T: Element>(&self, f: ViewFn, what: &str, param: i32) -> Result<(*mut T, usize)> {
        host_slice::<T>(self.view(f, param)?, what, param)
    }

    fn slice<T: Element>(&self, f: ViewFn, what: &str, param: i32) -> Result<&[T]> {
        let (p, n) = self.typed_slice::<T>(f, what, param)?;
        Ok(unsafe { std::slice::from_raw_parts(p, n) })
    }

    fn slice_mut<T: Element>(&mut self, f: ViewFn, what: &str, param: i32) -> Result<&mut [T]> {
        let (p, n) = self.typed_slice::<T>(f, what, param)?;
        Ok(unsafe { std::slice::from_raw_parts_mut(p, n) })
    }

    /// A param's values: a zero-copy slice of sx's flat buffer (fp32, host memory).
    pub fn param(&self, param: i32) -> Result<&[f32]> {
        self.slice(sys::sx_param_view, "param", param)
    }

    /// A param's values, writable (between steps: initial values, loaded weights).
    pub fn param_mut(&mut self, param: i32) -> Result<&mut [f32]> {
        self.slice_mut(sys::sx_param_view, "param", param)
    }

    /// A param's gradient.
    pub fn grad(&self, param: i32) -> Result<&[f32]> {
        self.slice(sys::sx_grad_view, "grad", param)
    }

    /// A param's gradient, writable: the trainer adds its gradient into it.
    pub fn grad_mut(&mut self, param: i32) -> Result<&mut [f32]> {
        self.slice_mut(sys::sx_grad_view, "grad", param)
    }

    /// A 16-bit (fp16 or bf16) param's values as their raw bits, zero-copy; its dtype
    /// is in [`ShardGroup::param_info`]. The step overwrites them with the fp32 masters
    /// rounded, so write them only before the first step or before a broadcast.
    pub fn param_u16(&self, param: i32) -> Result<&[u16]> {
        self.slice(sys::sx_param_view, "param", param)
    }

    /// A 16-bit param's values as raw bits, writable.
    pub fn param_u16_mut(&mut self, param: i32) -> Result<&mut [u16]> {
        self.slice_mut(sys::sx_param_view, "param", param)
    }

    /// A 16-bit gradient (a 16-bit param's, unless the group has fp32 grads) as raw bits.
    pub fn grad_u16(&self, param: i32) -> Result<&[u16]> {
        self.slice(sys::sx_grad_view, "grad", param)
    }

    /// A 16-bit gradient as raw bits, writable: the trainer adds its gradient into it.
    pub fn grad_u16_mut(&mut self, param: i32) -> Result<&mut [u16]> {
        self.slice_mut(sys::sx_grad_view, "grad", param)
    }

    /// Every param's values and gradient as mutable slices at once (params never
    /// overlap each other, and values never overlap gradients).
    pub fn tensors_mut(&mut self) -> Result<Tensors<'_>> {
        let n = self.num_params()?;
        let mut t = Tensors { params: Vec::with_capacity(n as usize), grads: Vec::with_capacity(n as usize) };
        for i in 0..n {
            let (p, len) = self.typed_slice::<f32>(sys::sx_param_view, "param", i)?;
            t.params.push(unsafe { std::slice::from_raw_parts_mut(p, len) });
            let (g, len) = self.typed_slice::<f32>(sys::sx_grad_view, "grad", i)?;
            t.grads.push(unsafe { std::slice::from_raw_parts_mut(g, len) });
        }
        Ok(t)
    }

    pub fn find_param(&self, name: &str) -> Result<i32> {
        let c = c_string("param name", name)?;
        let mut index = -1;
        check(unsafe { sys::sx_find_param(self.raw, c.as_ptr(), &mut index) })?;
        Ok(index)
    }

    pub fn set_trainable(&mut self, param: i32, trainable: bool) -> Result<()> {
        check(unsafe { sys::sx_set_trainable(self.raw, param, trainable as i32) })
    }

    pub fn trainable(&self, param: i32) -> Result<bool> {
        let mut t = 0;
        check(unsafe { sys::sx_get_trainable(self.raw, param, &mut t) })?;
        Ok(t != 0)
    }

    /// The group-owned trainable byte of every param (1 = trainable, 0 = frozen); the
    /// next step picks up changes made through it.
    pub fn trainable_mask_mut(&mut self) -> Result<&mut [u8]> {
        let mut mask = ptr::null_mut();
        let mut count = 0;
        check(unsafe { sys::sx_trainable_mask(self.raw, &mut mask, &mut count) })?;
        if count == 0 || mask.is_null() {
            return Ok(&mut []);
        }
        Ok(unsafe { std::slice::from_raw_parts_mut(mask, count as usize) })
    }

    pub fn refresh_trainable(&mut self) -> Result<()> {
        check(unsafe { sys::sx_refresh_trainable(self.raw) })
    }

    /// Collective: folds the current gradients into the step's accumulation.
    pub fn accumulate_grads(&mut self) -> Result<()> {
        check(unsafe { sys::sx_accumulate_grads(self.raw) })
    }

    /// Collective: averages gradients over ranks, clips, updates, gathers.
    pub fn step(&mut self, options: Option<&StepOptions>) -> Result<StepResult> {
        let mut r: sys::sx_step_result_t = init(sys::sx_step_result_init);
        let o = options.map_or(ptr::null(), |o| &o.raw as *const _);
        check(unsafe { sys::sx_step(self.raw, o, &mut r) })?;
        Ok(StepResult {
            grad_norm: r.grad_norm,
            step: r.step,
            skipped: r.skipped != 0,
            loss_scale: r.loss_scale,
            nonfinite: r.nonfinite != 0,
        })
    }

    /// Says that unit `unit`'s gradients are complete for this micro-batch; sx reduces
    /// them on its own thread while the backward goes on. Any unit order.
    pub fn unit_grads_ready(&mut self, unit: i32, options: Option<&UnitReadyOptions>) -> Result<()> {
        let o = options.map_or(ptr::null(), |o| &o.raw as *const _);
        check(unsafe { sys::sx_unit_grads_ready(self.raw, unit, o) })
    }

    /// Stage 3 (collective): makes unit `unit`'s params present until `release_unit`.
    /// Stages 1 and 2: waits for the unit's gather after a step with `defer_gather`.
    pub fn gather_unit(&mut self, unit: i32) -> Result<()> {
        check(unsafe { sys::sx_unit_gather(self.raw, unit) })
    }

    /// Stage 3: ends a `gather_unit` (this rank keeps only its shard). Else nothing.
    pub fn release_unit(&mut self, unit: i32) -> Result<()> {
        check(unsafe { sys::sx_unit_release(self.raw, unit) })
    }

    /// Sets loss scaling (between steps; every rank the same) and resets the scale to
    /// its init_scale.
    pub fn set_loss_scaling(&mut self, scaling: &LossScaling) -> Result<()> {
        check(unsafe { sys::sx_set_loss_scaling(self.raw, &scaling.raw) })
    }

    /// The current loss scale: what the next losses are to be multiplied by before
    /// backward (1 without loss scaling); the step divides the gradients by it.
    pub fn loss_scale(&self) -> Result<f64> {
        let mut v = 0.0;
        check(unsafe { sys::sx_get_loss_scale(self.raw, &mut v) })?;
        Ok(v)
    }

    fn query(&self, f: unsafe extern "C" fn(*const sys::sx_shard_group_t, *mut i32) -> sys::sx_status_t) -> Result<i32> {
        let mut v = 0;
        check(unsafe { f(self.raw, &mut v) })?;
        Ok(v)
    }

    pub fn rank(&self) -> Result<i32> {
        self.query(sys::sx_get_rank)
    }
    pub fn world_size(&self) -> Result<i32> {
        self.query(sys::sx_get_world_size)
    }
    pub fn stage(&self) -> Result<i32> {
        self.query(sys::sx_get_stage)
    }
    pub fn num_params(&self) -> Result<i32> {
        self.query(sys::sx_get_num_params)
    }
    pub fn num_units(&self) -> Result<i32> {
        self.query(sys::sx_get_num_units)
    }
    pub fn num_param_groups(&self) -> Result<i32> {
        self.query(sys::sx_get_num_param_groups)
    }

    pub fn memory_stats(&self) -> Result<MemoryStats> {
        let mut s: sys::sx_memory_stats_t = init(sys::sx_memory_stats_init);
        check(unsafe { sys::sx_get_memory_stats(self.raw, &mut s) })?;
        Ok(MemoryStats {
            param_bytes: s.param_bytes,
            grad_bytes: s.grad_bytes,
            optimizer_bytes: s.optimizer_bytes,
            staging_bytes: s.staging_bytes,
            unsharded_optimizer_bytes: s.unsharded_optimizer_bytes,
            peak_param_bytes: s.peak_param_bytes,
            memory_copy_bytes: s.memory_copy_bytes,
            device_bytes: s.device_bytes,
        })
    }

    pub fn param_info(&self, param: i32) -> Result<ParamInfo> {
        let mut i: sys::sx_param_info_t = init(sys::sx_param_info_init);
        check(unsafe { sys::sx_get_param_info(self.raw, param, &mut i) })?;
        let ndim = (i.ndim.max(0) as usize).min(sys::SX_MAX_NDIM);
        Ok(ParamInfo {
            name: cstr_lossy(i.name),
            dtype: Dtype::from_raw(i.dtype),
            shape: i.shape[..ndim].to_vec(),
            numel: i.numel,
            param_group: i.param_group,
            unit: i.unit,
            trainable: i.trainable != 0,
            offset_in_unit: i.offset_in_unit,
            shard: i.shard_begin..i.shard_end,
        })
    }

    /// `index` is 0..num_units, in increasing order of unit id.
    pub fn unit_info(&self, index: i32) -> Result<UnitInfo> {
        let mut u: sys::sx_unit_info_t = init(sys::sx_unit_info_init);
        check(unsafe { sys::sx_get_unit_info(self.raw, index, &mut u) })?;
        Ok(UnitInfo {
            unit: u.unit,
            num_params: u.num_params,
            numel: u.numel,
            padded_numel: u.padded_numel,
            shard_numel: u.shard_numel,
            shard_begin: u.shard_begin,
            trainable: u.trainable != 0,
            has_optimizer_state: u.has_optimizer_state != 0,
            shard_size: u.shard_size,
            shard_rank: u.shard_rank,
            replicas: u.replicas,
            replica_rank: u.replica_rank,
        })
    }

    /// Collective: saves the group's state at this step boundary. Returns once this
    /// rank's shard is staged; the files are written and committed in the background.
    pub fn save(&mut self, options: SaveOptions) -> Result<SaveFuture> {
        let path = c_string("checkpoint path", &options.path)?;
        let mut o: sys::sx_save_options_t = init(sys::sx_save_options_init);
        o.path = path.as_ptr();
        if !options.user_blob.is_empty() {
            o.user_blob = options.user_blob.as_ptr() as *const c_void;
            o.user_blob_size = options.user_blob.len() as u64;
        }
        o.keep_last = options.keep_last;
        o.synchronous = options.synchronous as i32;
        let callback_id = match options.callback {
            Some(cb) => {
                let id = future::register(cb);
                o.callback = Some(future::trampoline);
                o.callback_user = id as *mut c_void;
                id
            }
            None => 0,
        };
        let mut raw = ptr::null_mut();
        let status = unsafe { sys::sx_save_optim_state(self.raw, &o, &mut raw) };
        if let Err(e) = check(status) {
            if callback_id != 0 {
                future::unregister(callback_id);
            }
            return Err(e);
        }
        Ok(SaveFuture::from_raw(raw, callback_id))
    }

    /// Collective: loads a checkpoint saved at any world size into this group.
    pub fn load(&mut self, options: &LoadOptions) -> Result<()> {
        let path = c_string("checkpoint path", &options.path)?;
        let mut o: sys::sx_load_options_t = init(sys::sx_load_optim_state_options_init);
        o.path = path.as_ptr();
        o.flags = options.flags;
        check(unsafe { sys::sx_load_optim_state(self.raw, &o) })
    }
}

impl Drop for ShardGroup {
    fn drop(&mut self) {
        if !self.raw.is_null() {
            unsafe { sys::sx_destroy_shard_group(self.raw) };
        }
    }
}
