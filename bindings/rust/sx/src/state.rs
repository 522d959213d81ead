//! Whole optimizer state: every param's unsharded state gathered onto one rank, param by
//! param, or scattered from one rank into every rank's shard, at any world size and stage
//! (ZeroRedundancyOptimizer's consolidate_state_dict and load_state_dict), and this
//! rank's own part of it in place.
//!
//! sx calls the closures on the calling thread, during the call: C gets a plain function
//! made for the closure's type and a pointer to a frame on this stack. Nothing unwinds
//! into C: a panic in a closure is caught there, ends the operation on every rank, and is
//! resumed once sx has returned.
use std::any::Any;
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::ffi::CStr;
use std::os::raw::{c_char, c_void};
use std::panic::{self, AssertUnwindSafe};
use std::ptr;

use sx_sys as sys;

use crate::error::{check, invalid_argument, Error, Result};
use crate::group::{host_slice, ShardGroup};
use crate::options::{c_string, init};

/// One param's whole optimizer state, lent by sx to a gather's closure for one call:
/// the slices are sx's host memory, valid only during the call (the closure cannot keep
/// them). Tensors carry torch's names: "exp_avg", "exp_avg_sq", "max_exp_avg_sq" (Adam
/// and AdamW, the last with amsgrad), "momentum_buffer" (SGD with momentum), "master"
/// (the fp32 master weights of a 16-bit param); each holds the param's `numel` values,
/// but Adafactor's factored moments of a param of shape [..., R, C]: "row_var",
/// prod(shape[..-1]) values (torch's shape [..., R, 1]), and "col_var",
/// prod(shape[..-2]) * C (torch's [..., 1, C]).
#[derive(Debug)]
pub struct ParamStateRef<'a> {
    /// The param's index.
    pub param: i32,
    pub name: Cow<'a, str>,
    pub param_group: i32,
    /// The param's elements, and so each tensor's but Adafactor's "row_var" and
    /// "col_var" (row-major, in the param's own index space).
    pub numel: usize,
    /// Updates applied to the param (torch's state["step"] of Adam and AdamW).
    pub step: i64,
    /// SGD with momentum: updates that used momentum_buffer (0: never initialised).
    pub momentum_steps: i64,
    /// NAdam: torch's state["mu_product"], the product of the param's momentum
    /// coefficients (in (0, 1]); 0 for other optimizers.
    pub mu_product: f64,
    tensors: Vec<(&'a str, &'a [f32])>,
}

/// One param's whole optimizer state for a scatter's closure to fill: the tensors the
/// param's optimizer keeps (see [`ParamStateRef`] for their names), zero on entry, and
/// the step counts, which the closure sets. A tensor left zero is zero state, as torch's
/// when it has none. The slices are valid only during the call.
#[derive(Debug)]
pub struct ParamStateMut<'a> {
    pub param: i32,
    pub name: Cow<'a, str>,
    pub param_group: i32,
    pub numel: usize,
    /// Set by the closure (>= 0).
    pub step: i64,
    /// Set by the closure (>= 0; 0: momentum_buffer is not initialised).
    pub momentum_steps: i64,
    /// May be set by the closure: NAdam's mu_product, in [0, 1] (0 on entry: sx derives it
    /// from `step` with the group's beta1 and momentum_decay). Ignored for other
    /// optimizers.
    pub mu_product: f64,
    tensors: Vec<(&'a str, &'a mut [f32])>,
}

/// One param's whole optimizer state, owned: what [`ShardGroup::gather_optim_state`]
/// returns and [`ShardGroup::scatter_optim_state`] takes. `tensors` maps torch's names to
/// their values (the param's numel of them, but Adafactor's "row_var" and "col_var": see
/// [`ParamStateRef`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ParamState {
    pub param: i32,
    pub name: String,
    pub param_group: i32,
    pub step: i64,
    pub momentum_steps: i64,
    /// NAdam's mu_product (0 for other optimizers; 0 in a scatter: derived from `step`).
    pub mu_product: f64,
    pub tensors: BTreeMap<String, Vec<f32>>,
}

/// The name and the (name, data, length) tensors of an sx_param_state_t, for both views.
/// A null array means no tensors; a tensor of zero elements gets a dangling, aligned
/// pointer, as a Rust slice needs. Each tensor's length is its tensor_numels entry
/// (Adafactor's row_var and col_var are not the param's numel), numel where sx gives none.
unsafe fn raw_parts<'a>(st: &'a sys::sx_param_state_t) -> (Cow<'a, str>, Vec<(&'a str, *mut f32, usize)>) {
    let name = if st.name.is_null() { Cow::Borrowed("") } else { CStr::from_ptr(st.name).to_string_lossy() };
    let count = if st.tensors.is_null() || st.tensor_names.is_null() { 0 } else { st.num_tensors.max(0) as usize };
    let has_numels = st.struct_size >= std::mem::size_of::<sys::sx_param_state_t>() && !st.tensor_numels.is_null();
    let mut tensors = Vec::with_capacity(count);
    for t in 0..count {
        let tname: *const c_char = *st.tensor_names.add(t);
        let tname = if tname.is_null() { "" } else { CStr::from_ptr(tname).to_str().unwrap_or("") };
        let n = if has_numels { *st.tensor_numels.add(t) } else { st.numel } as usize;
        let data = *st.tensors.add(t);
        let data = if n == 0 || data.is_null() { ptr::NonNull::<f32>::dangling().as_ptr() } else { data };
        tensors.push((tname, data, n));
    }
    (name, tensors)
}

impl<'a> ParamStateRef<'a> {
    unsafe fn from_raw(st: &'a sys::sx_param_state_t) -> ParamStateRef<'a> {
        let (name, tensors) = raw_parts(st);
        let numel = st.numel as usize;
        ParamStateRef {
            param: st.param,
            name,
            param_group: st.param_group,
            numel,
            step: st.step,
            momentum_steps: st.momentum_steps,
            mu_product: st.mu_product,
            tensors: tensors.into_iter().map(|(n, p, len)| (n, std::slice::from_raw_parts(p as *const f32, len))).collect(),
        }
    }

    /// Every tensor, in sx's order, as (name, values).
    pub fn tensors(&self) -> &[(&'a str, &'a [f32])] {
        &self.tensors
    }

    /// The tensor called `name`, if the param has it.
    pub fn tensor(&self, name: &str) -> Option<&'a [f32]> {
        self.tensors.iter().find(|(n, _)| *n == name).map(|(_, t)| *t)
    }

    /// A copy that outlives the call.
    pub fn to_param_state(&self) -> ParamState {
        ParamState {
            param: self.param,
            name: self.name.to_string(),
            param_group: self.param_group,
            step: self.step,
            momentum_steps: self.momentum_steps,
            mu_product: self.mu_product,
            tensors: self.tensors.iter().map(|(n, t)| (n.to_string(), t.to_vec())).collect(),
        }
    }
}

impl<'a> ParamStateMut<'a> {
    unsafe fn from_raw(st: &'a sys::sx_param_state_t) -> ParamStateMut<'a> {
        let (name, tensors) = raw_parts(st);
        let numel = st.numel as usize;
        ParamStateMut {
            param: st.param,
            name,
            param_group: st.param_group,
            numel,
            step: st.step,
            momentum_steps: st.momentum_steps,
            mu_product: st.mu_product,
            tensors: tensors.into_iter().map(|(n, p, len)| (n, std::slice::from_raw_parts_mut(p, len))).collect(),
        }
    }

    /// The names of the tensors to fill, in sx's order.
    pub fn tensor_names(&self) -> Vec<&'a str> {
        self.tensors.iter().map(|(n, _)| *n).collect()
    }

    /// The tensor called `name` to write into, if the param's optimizer keeps it.
    pub fn tensor_mut(&mut self, name: &str) -> Option<&mut [f32]> {
        self.tensors.iter_mut().find(|(n, _)| *n == name).map(|(_, t)| &mut **t)
    }

    /// Every tensor as (name, values to write into).
    pub fn tensors_mut(&mut self) -> impl Iterator<Item = (&'a str, &mut [f32])> + '_ {
        self.tensors.iter_mut().map(|(n, t)| (*n, &mut **t))
    }

    /// Fills this param's state from `given`: its step counts, its mu_product and each of
    /// its tensors the param's optimizer keeps (others are ignored); a tensor of another
    /// length than sx's is an error.
    pub fn fill_from(&mut self, given: &ParamState) -> Result<()> {
        for (name, values) in &given.tensors {
            if let Some((_, t)) = self.tensors.iter().find(|(n, _)| *n == name.as_str()) {
                if values.len() != t.len() {
                    return Err(invalid_argument(format!(
                        "param '{}': tensor '{}' has {} values; sx keeps {}",
                        self.name,
                        name,
                        values.len(),
                        t.len()
                    )));
                }
            }
        }
        self.step = given.step;
        self.momentum_steps = given.momentum_steps;
        self.mu_product = given.mu_product;
        for (name, values) in &given.tensors {
            if let Some(t) = self.tensor_mut(name) {
                t.copy_from_slice(values);
            }
        }
        Ok(())
    }
}

/// What a closure left behind: its error (returned on the root) or its panic (resumed
/// there), once sx has returned.
struct Frame<F> {
    f: F,
    error: Option<Error>,
    panic: Option<Box<dyn Any + Send + 'static>>,
}

impl<F> Frame<F> {
    fn new(f: F) -> Frame<F> {
        Frame { f, error: None, panic: None }
    }

    /// The status sx gets for a closure's outcome: the closure's own error status (an
    /// error without one is SX_ERR_CANCELLED), SX_ERR_CANCELLED for a panic.
    fn settle(&mut self, outcome: std::thread::Result<Result<()>>) -> sys::sx_status_t {
        match outcome {
            Ok(Ok(())) => sys::SX_OK,
            Ok(Err(e)) => {
                let status = if e.status() == sys::SX_OK { sys::SX_ERR_CANCELLED } else { e.status() };
                self.error = Some(e);
                status
            }
            Err(p) => {
                self.panic = Some(p);
                sys::SX_ERR_CANCELLED
            }
        }
    }

    /// The call's result: the closure's panic is resumed, its error returned, else sx's
    /// status (whose message was read on this thread before anything else ran).
    fn finish(self, result: Result<()>) -> Result<()> {
        if let Some(p) = self.panic {
            panic::resume_unwind(p);
        }
        match self.error {
            Some(e) => Err(e),
            None => result,
        }
    }
}

unsafe extern "C" fn gather_trampoline<F>(st: *mut sys::sx_param_state_t, user: *mut c_void) -> sys::sx_status_t
where
    F: FnMut(&ParamStateRef<'_>) -> Result<()>,
{
    let frame = &mut *(user as *mut Frame<F>);
    let f = &mut frame.f;
    let outcome = panic::catch_unwind(AssertUnwindSafe(|| f(&ParamStateRef::from_raw(&*st))));
    frame.settle(outcome)
}

unsafe extern "C" fn scatter_trampoline<F>(st: *mut sys::sx_param_state_t, user: *mut c_void) -> sys::sx_status_t
where
    F: FnMut(&mut ParamStateMut<'_>) -> Result<()>,
{
    let frame = &mut *(user as *mut Frame<F>);
    let f = &mut frame.f;
    let outcome = panic::catch_unwind(AssertUnwindSafe(|| {
        let mut view = ParamStateMut::from_raw(&*st);
        let r = f(&mut view);
        let (step, momentum_steps, mu_product) = (view.step, view.momentum_steps, view.mu_product);
        drop(view);
        (*st).step = step;
        (*st).momentum_steps = momentum_steps;
        (*st).mu_product = mu_product;
        r
    }));
    frame.settle(outcome)
}

impl ShardGroup {
    /// Collective (every rank, the same `root`): gathers every param's whole optimizer
    /// state onto rank `root`, where `f` sees one param at a time, in index order; no rank
    /// ever holds more than its shard and the root one param's state besides. `f` runs
    /// only on the root. Every param is delivered: one without optimizer state yet (never
    /// trainable at a step) has only its "master" (16-bit) or no tensor. An error or a
    /// panic of `f` ends the gather on every rank: the root returns that error (or
    /// resumes the panic), the others an error with its status (SX_ERR_CANCELLED for a
    /// panic).
    ///
    /// The slices live only for one call of `f`:
    ///
    /// ```compile_fail
    /// # fn f(g: &mut sx::ShardGroup) -> sx::Result<()> {
    /// let mut kept: Vec<&[f32]> = Vec::new();
    /// g.gather_optim_state_with(0, |st| {
    ///     kept.push(st.tensor("exp_avg").unwrap());
    ///     Ok(())
    /// })?;
    /// # Ok(()) }
    /// ```
    pub fn gather_optim_state_with<F>(&mut self, root: i32, f: F) -> Result<()>
    where
        F: FnMut(&ParamStateRef<'_>) -> Result<()>,
    {
        let mut frame = Frame::new(f);
        let user = &mut frame as *mut Frame<F> as *mut c_void;
        let result = check(unsafe { sys::sx_gather_optim_state(self.raw, root, Some(gather_trampoline::<F>), user) });
        frame.finish(result)
    }

    /// Collective: every param's whole optimizer state, copied, in index order, on rank
    /// `root` (`Some`); `None` on the other ranks. The root holds the whole unsharded
    /// state at the end: use [`ShardGroup::gather_optim_state_with`] to write it out param
    /// by param instead.
    pub fn gather_optim_state(&mut self, root: i32) -> Result<Option<Vec<ParamState>>> {
        let mut all = Vec::new();
        self.gather_optim_state_with(root, |st| {
            all.push(st.to_param_state());
            Ok(())
        })?;
        Ok(if self.rank()? == root { Some(all) } else { None })
    }

    /// Collective (every rank, the same `root`), the reverse of a gather: on rank `root`,
    /// `f` fills each param's whole state (zero tensors on entry, and the step counts), in
    /// index order, and every rank's shard takes its part, at any world size and stage;
    /// 16-bit params then take their values from the new masters on every rank. `f` runs
    /// only on the root. Nothing changes unless every rank and every call of `f`
    /// succeeded: an error or a panic of `f` ends the scatter on every rank as for a
    /// gather. The state slices of [`ShardGroup::state`] do not outlive it (it borrows
    /// the group mutably), and it is what replaces the state they showed.
    pub fn scatter_optim_state_with<F>(&mut self, root: i32, f: F) -> Result<()>
    where
        F: FnMut(&mut ParamStateMut<'_>) -> Result<()>,
    {
        let mut frame = Frame::new(f);
        let user = &mut frame as *mut Frame<F> as *mut c_void;
        let result = check(unsafe { sys::sx_scatter_optim_state(self.raw, root, Some(scatter_trampoline::<F>), user) });
        frame.finish(result)
    }

    /// Collective: scatters `states` (on the root: param name to state, as
    /// [`ShardGroup::gather_optim_state`] returns them; `None` on the other ranks). A
    /// param absent from the map gets zero state and step counts; tensors its optimizer
    /// does not keep are ignored; a tensor of the wrong length is an error, and then
    /// nothing changes. `None` on the root is an error on every rank (sx alone would
    /// refuse it on the root only, before the others could learn of it).
    ///
    /// ```compile_fail
    /// # fn f(g: &mut sx::ShardGroup) -> sx::Result<()> {
    /// let m = g.state(0, "exp_avg")?;
    /// g.scatter_optim_state(0, None)?;   // replaces the state m shows
    /// let _ = m[0];
    /// # Ok(()) }
    /// ```
    pub fn scatter_optim_state(&mut self, root: i32, states: Option<&HashMap<String, ParamState>>) -> Result<()> {
        match states {
            Some(states) => self.scatter_optim_state_with(root, |st| match states.get(st.name.as_ref()) {
                Some(given) => st.fill_from(given),
                None => Ok(()),
            }),
            None if self.rank()? == root => self.scatter_optim_state_with(root, |_| {
                Err(invalid_argument(format!("scatter_optim_state: no states were given on the root (rank {})", root)))
            }),
            None => check(unsafe { sys::sx_scatter_optim_state(self.raw, root, None, ptr::null_mut()) }),
        }
    }

    /// The raw view (pointer, length, fp32, device) of this rank's part of one of a
    /// param's optimizer-state tensors (`tensor`: "exp_avg", ..., "master"): the param's
    /// elements `ParamInfo::shard` (empty where this rank holds none of it).
    pub fn state_view(&self, param: i32, tensor: &str) -> Result<sys::sx_view_t> {
        let name = c_string("tensor name", tensor)?;
        let mut v: sys::sx_view_t = init(sys::sx_view_init);
        check(unsafe { sys::sx_state_view(self.raw, param, name.as_ptr(), &mut v) })?;
        Ok(v)
    }

    /// This rank's part of a param's optimizer-state tensor, zero-copy (host memory):
    /// the param's elements `ParamInfo::shard`. Errors: a tensor the param's optimizer
    /// does not keep (SX_ERR_INVALID_ARGUMENT, listing those it keeps), a param without
    /// optimizer state yet (SX_ERR_INVALID_STATE: its unit gets it at the first step at
    /// which one of its params is trainable).
    pub fn state(&self, param: i32, tensor: &str) -> Result<&[f32]> {
        let (p, n) = host_slice::<f32>(self.state_view(param, tensor)?, "state", param)?;
        Ok(unsafe { std::slice::from_raw_parts(p, n) })
    }

    /// This rank's part of a state tensor, writable: between steps, to seed the state.
    pub fn state_mut(&mut self, param: i32, tensor: &str) -> Result<&mut [f32]> {
        let (p, n) = host_slice::<f32>(self.state_view(param, tensor)?, "state", param)?;
        Ok(unsafe { std::slice::from_raw_parts_mut(p, n) })
    }

    /// This rank's part of a bf16 slot (a param group of `StateDtype::Bf16`), as raw bits.
    pub fn state_u16(&self, param: i32, tensor: &str) -> Result<&[u16]> {
        let (p, n) = host_slice::<u16>(self.state_view(param, tensor)?, "state", param)?;
        Ok(unsafe { std::slice::from_raw_parts(p, n) })
    }

    /// This rank's part of a bf16 slot, writable.
    pub fn state_u16_mut(&mut self, param: i32, tensor: &str) -> Result<&mut [u16]> {
        let (p, n) = host_slice::<u16>(self.state_view(param, tensor)?, "state", param)?;
        Ok(unsafe { std::slice::from_raw_parts_mut(p, n) })
    }

    /// This rank's part of an 8-bit slot's codes (a param group of `StateDtype::EightBit`);
    /// its block scales, one per 256 codes, are the f32 tensor "<slot>.scale" (`state`).
    pub fn state_u8(&self, param: i32, tensor: &str) -> Result<&[u8]> {
        let (p, n) = host_slice::<u8>(self.state_view(param, tensor)?, "state", param)?;
        Ok(unsafe { std::slice::from_raw_parts(p, n) })
    }

    /// This rank's part of an 8-bit slot's codes, writable.
    pub fn state_u8_mut(&mut self, param: i32, tensor: &str) -> Result<&mut [u8]> {
        let (p, n) = host_slice::<u8>(self.state_view(param, tensor)?, "state", param)?;
        Ok(unsafe { std::slice::from_raw_parts_mut(p, n) })
    }
}
