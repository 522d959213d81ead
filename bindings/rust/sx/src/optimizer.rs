//! Custom optimizers (sx 1.5): an elementwise optimizer written in Rust, which sx
//! allocates, shards, steps, checkpoints (by slot name), reshards and gathers exactly as
//! it does its own.
//!
//! ```no_run
//! use sx::{register_optimizer, OptimizerDesc, ParamGroup, Piece};
//! // Plain SGD with a velocity slot: v = 0.9 v + g; p -= lr v.
//! fn momentum(p: &mut Piece) -> Result<(), i32> {
//!     let lr = p.hyperparameters[0] as f32;
//!     let v = &mut *p.state[0];
//!     for ((x, &g), v) in p.param.iter_mut().zip(p.grad).zip(v.iter_mut()) {
//!         *v = *v * 0.9 + g * p.grad_scale;
//!         *x -= lr * *v;
//!     }
//!     Ok(())
//! }
//! let opt = register_optimizer(OptimizerDesc::new("my_momentum", momentum).slot("velocity").hyperparameter("lr", 0.01))?;
//! let group = ParamGroup::new(opt).lr(0.05);
//! # Ok::<(), sx::Error>(())
//! ```
//!
//! Registration is per process and lasts as long as the process: the closure is boxed and
//! the box is leaked on purpose (sx may call it for as long as a group uses the optimizer,
//! and never forgets a registration), so register each optimizer once, before the groups
//! that use it, and share the returned [`Optimizer`] (it is `Copy`). C gets one plain
//! function (a trampoline) and the leaked box's address as its `user_data`.
use std::ffi::CString;
use std::os::raw::{c_char, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::{self, NonNull};

use sx_sys as sys;

use crate::error::{check, Result};
use crate::options::{c_string, init, Optimizer};

/// What an update that panicked reports to sx (the step then fails with
/// SX_ERR_OPTIMIZER naming it, and with the panic message when it is a `&str` or a
/// `String`; the panic hook also saw it, stderr by default).
pub const UPDATE_PANICKED: i32 = -1;

/// A registered custom optimizer's id (>= `SX_OPTIM_CUSTOM_FIRST`), inside
/// [`Optimizer::Custom`]; only [`register_optimizer`] makes one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CustomOptimizer {
    id: i32,
}

impl CustomOptimizer {
    /// The id sx gave it, usable wherever an `SX_OPTIM_*` value is.
    pub fn id(self) -> i32 {
        self.id
    }
}

/// One contiguous piece of a param's elements in this rank's shard, lent to an update for
/// the call: the slices are sx's memory.
#[derive(Debug)]
pub struct Piece<'a> {
    /// The n fp32 values (the fp32 masters of 16-bit params), to update in place.
    pub param: &'a mut [f32],
    /// The n reduced gradients, summed over the ranks: use `grad[i] * grad_scale`.
    pub grad: &'a [f32],
    /// The slots, in registration order, n values each, to update in place.
    pub state: &'a mut [&'a mut [f32]],
    /// The param group's values, in registration order.
    pub hyperparameters: &'a [f64],
    /// The average over ranks, the loss scale and the clipping coefficient in one factor.
    pub grad_scale: f32,
    /// The param the elements belong to (its index) and its param group.
    pub param_index: i32,
    pub param_group: i32,
    /// `param[0]`'s element offset in the param (row-major).
    pub offset: u64,
    /// The param's step count including this update (1 for its first).
    pub step: i64,
}

impl<'a> Piece<'a> {
    /// Elements in this piece (>= 1).
    pub fn len(&self) -> usize {
        self.param.len()
    }

    pub fn is_empty(&self) -> bool {
        self.param.is_empty()
    }
}

type UpdateFn = dyn Fn(&mut Piece<'_>) -> std::result::Result<(), i32> + Send + Sync + 'static;

/// A custom optimizer to register: its name, slots, hyperparameters and update, builder
/// style.
///
/// `update` is called on sx's worker threads, several pieces at once (pieces never
/// overlap), and must not call sx. `Ok(())` is success; `Err(code)` fails the step on
/// every rank with SX_ERR_OPTIMIZER naming the optimizer, the param and the code (0 is
/// reported as 1) and saying "update returned error N", and then no param or slot has
/// changed (unless it is registered [`in_place`](OptimizerDesc::in_place)). A panic is
/// caught before it reaches C and reported as [`UPDATE_PANICKED`], its message (a `&str`
/// or `String` payload) in sx's.
pub struct OptimizerDesc {
    name: String,
    slots: Vec<(String, f32)>,
    initial_values: bool,
    hyperparameters: Vec<(String, f64, f64, f64)>,
    in_place: bool,
    update: Box<UpdateFn>,
}

impl std::fmt::Debug for OptimizerDesc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OptimizerDesc")
            .field("name", &self.name)
            .field("slots", &self.slots)
            .field("hyperparameters", &self.hyperparameters)
            .field("in_place", &self.in_place)
            .finish()
    }
}

impl OptimizerDesc {
    /// `name`: unique in the process, 1-63 of [A-Za-z0-9_.-].
    pub fn new<F>(name: &str, update: F) -> OptimizerDesc
    where
        F: Fn(&mut Piece<'_>) -> std::result::Result<(), i32> + Send + Sync + 'static,
    {
        OptimizerDesc {
            name: name.to_string(),
            slots: Vec::new(),
            initial_values: false,
            hyperparameters: Vec::new(),
            in_place: false,
            update: Box::new(update),
        }
    }

    /// A state slot (at most `SX_MAX_CUSTOM_SLOTS`, distinct names of [A-Za-z0-9_]),
    /// zero before a param's first update. Checkpoints and whole-state gathers name the
    /// slot's tensor so.
    pub fn slot(self, name: &str) -> Self {
        self.slot_with_initial_value(name, 0.0)
    }

    /// A state slot that holds `value` before a param's first update.
    pub fn slot_with_initial_value(mut self, name: &str, value: f32) -> Self {
        self.initial_values |= value != 0.0;
        self.slots.push((name.to_string(), value));
        self
    }

    /// A hyperparameter with its default, any finite value allowed. A name of sx's own
    /// ("lr", "weight_decay", "beta1", "beta2", "eps", "momentum", ...) is that
    /// hyperparameter: set through [`crate::ParamGroup`]'s builders, its `Hyperparameter`
    /// key and `set_lr`, within sx's range for it. Any other name is the optimizer's own:
    /// [`crate::Hyperparameter::Custom`]`(i)`, i counting its own in order.
    /// [`Piece::hyperparameters`] holds them all in the order they are added here.
    pub fn hyperparameter(self, name: &str, default: f64) -> Self {
        self.hyperparameter_in(name, default, 0.0, 0.0)
    }

    /// A hyperparameter whose values must lie in [min, max] (both 0: any finite value).
    pub fn hyperparameter_in(mut self, name: &str, default: f64, min: f64, max: f64) -> Self {
        self.hyperparameters.push((name.to_string(), default, min, max));
        self
    }

    /// `true`: sx updates the params and slots in place (`SX_OPTIMIZER_IN_PLACE`), without
    /// the second slot buffers and the copy of the params that let a failed update change
    /// nothing: half the update's memory traffic and no extra memory. An `Err` or a panic
    /// then leaves the step half done and fails the group (only dropping it is left), so
    /// this is for an update that cannot fail. Default `false`.
    pub fn in_place(mut self, in_place: bool) -> Self {
        self.in_place = in_place;
        self
    }
}

/// What the leaked box holds: the closure and the sizes of the piece's arrays.
struct Registration {
    update: Box<UpdateFn>,
    num_slots: usize,
    num_hyperparameters: usize,
}

/// A slice over sx's memory (a dangling, aligned pointer for an empty or missing one, as a
/// Rust slice needs).
unsafe fn slice_mut<'a>(p: *mut f32, len: usize) -> &'a mut [f32] {
    if p.is_null() || len == 0 {
        std::slice::from_raw_parts_mut(NonNull::dangling().as_ptr(), 0)
    } else {
        std::slice::from_raw_parts_mut(p, len)
    }
}

unsafe fn slice<'a>(p: *const f32, len: usize) -> &'a [f32] {
    if p.is_null() || len == 0 {
        &[]
    } else {
        std::slice::from_raw_parts(p, len)
    }
}

/// Writes `message` into the piece's error buffer, which sx puts in the step's
/// SX_ERR_OPTIMIZER message: at most `error_size - 1` bytes, cut at a character boundary,
/// then a NUL. Nothing when the library's piece has no buffer.
///
/// # Safety
/// `raw` is a piece sx hands to an update, during the call.
unsafe fn write_error(raw: *const sys::sx_optimizer_piece_t, message: &str) {
    let raw = &*raw;
    if raw.struct_size < std::mem::size_of::<sys::sx_optimizer_piece_t>() || raw.error.is_null() || raw.error_size == 0
    {
        return;
    }
    let mut n = message.len().min(raw.error_size - 1);
    while !message.is_char_boundary(n) {
        n -= 1;
    }
    ptr::copy_nonoverlapping(message.as_ptr(), raw.error as *mut u8, n);
    *raw.error.add(n) = 0;
}

/// A panic's message: its payload when that is a `&str` or a `String`.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s
    } else {
        "update panicked"
    }
}

/// Builds a [`Piece`] over the C piece and calls the registration's closure. Nothing
/// unwinds into C: an `Err(code)` or a panic is described in the piece's error buffer.
///
/// # Safety
/// `raw` is a piece sx hands to an optimizer registered by [`register_optimizer`] (its
/// `user_data` is that registration's leaked box).
unsafe extern "C" fn trampoline(raw: *const sys::sx_optimizer_piece_t) -> i32 {
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        let raw = &*raw;
        let reg = &*(raw.user_data as *const Registration);
        let n = raw.n;
        let mut slots: [&mut [f32]; sys::SX_MAX_CUSTOM_SLOTS] = [&mut [], &mut [], &mut []];
        let num_slots = reg.num_slots.min(sys::SX_MAX_CUSTOM_SLOTS);
        for (k, slot) in slots.iter_mut().enumerate().take(num_slots) {
            *slot = slice_mut(raw.state[k], n);
        }
        let hyperparameters: &[f64] = if raw.hyperparameters.is_null() || reg.num_hyperparameters == 0 {
            &[]
        } else {
            std::slice::from_raw_parts(raw.hyperparameters, reg.num_hyperparameters)
        };
        let mut piece = Piece {
            param: slice_mut(raw.param, n),
            grad: slice(raw.grad, n),
            state: &mut slots[..num_slots],
            hyperparameters,
            grad_scale: raw.grad_scale,
            param_index: raw.param_index,
            param_group: raw.param_group,
            offset: raw.offset,
            step: raw.step,
        };
        (reg.update)(&mut piece)
    }));
    match outcome {
        Ok(Ok(())) => 0,
        Ok(Err(code)) => {
            write_error(raw, &format!("update returned error {}", code));
            if code == 0 {
                1
            } else {
                code
            }
        }
        Err(payload) => {
            write_error(raw, panic_message(&*payload));
            UPDATE_PANICKED
        }
    }
}

/// Registers a custom optimizer for this process and returns it as an
/// [`Optimizer::Custom`], for [`crate::ParamGroup::new`] on every rank. The closure is
/// leaked deliberately: a registration lasts as long as the process. Each call registers
/// a new closure, so registering a name twice is SX_ERR_ALREADY_EXISTS: register once,
/// before the ranks' threads start (or behind a `std::sync::Once`), and share the result.
/// Errors (nothing registered, nothing leaked): SX_ERR_INVALID_ARGUMENT for a bad name,
/// slot or hyperparameter name, a repeated one, too many, or a default outside its range;
/// SX_ERR_ALREADY_EXISTS; and more than `SX_MAX_CUSTOM_OPTIMIZERS` registrations.
pub fn register_optimizer(desc: OptimizerDesc) -> Result<Optimizer> {
    let name = c_string("optimizer name", &desc.name)?;
    let slot_names: Vec<CString> = desc.slots.iter().map(|(s, _)| c_string("slot name", s)).collect::<Result<_>>()?;
    let slot_ptrs: Vec<*const c_char> = slot_names.iter().map(|s| s.as_ptr()).collect();
    let initial: Vec<f32> = desc.slots.iter().map(|(_, v)| *v).collect();
    let hp_names: Vec<CString> =
        desc.hyperparameters.iter().map(|h| c_string("hyperparameter name", &h.0)).collect::<Result<_>>()?;
    let hps: Vec<sys::sx_optimizer_hyperparameter_t> = desc
        .hyperparameters
        .iter()
        .zip(&hp_names)
        .map(|(h, n)| sys::sx_optimizer_hyperparameter_t { name: n.as_ptr(), default_value: h.1, min: h.2, max: h.3 })
        .collect();
    let reg = Box::into_raw(Box::new(Registration {
        update: desc.update,
        num_slots: desc.slots.len(),
        num_hyperparameters: desc.hyperparameters.len(),
    }));
    let mut raw: sys::sx_optimizer_desc_t = init(sys::sx_optimizer_desc_init);
    raw.name = name.as_ptr();
    raw.num_slots = desc.slots.len() as i32;
    raw.slot_names = if slot_ptrs.is_empty() { ptr::null() } else { slot_ptrs.as_ptr() };
    raw.slot_initial_values = if desc.initial_values { initial.as_ptr() } else { ptr::null() };
    raw.num_hyperparameters = hps.len() as i32;
    raw.hyperparameters = if hps.is_empty() { ptr::null() } else { hps.as_ptr() };
    raw.update = Some(trampoline);
    raw.user_data = reg as *mut c_void;
    raw.flags = if desc.in_place { sys::SX_OPTIMIZER_IN_PLACE } else { 0 };
    let mut id = -1;
    // sx copies the strings and arrays during the call; only `reg` must outlive it.
    if let Err(e) = check(unsafe { sys::sx_register_optimizer(&raw, &mut id) }) {
        // SAFETY: nothing was registered, so sx holds no pointer to the box.
        drop(unsafe { Box::from_raw(reg) });
        return Err(e);
    }
    Ok(Optimizer::Custom(CustomOptimizer { id }))
}
