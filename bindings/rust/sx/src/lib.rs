//! Safe Rust binding of sx, a training runtime with ZeRO-sharded optimizer state, flat
//! parameter and gradient buffers and fused optimizer steps, over `libsx.so`'s C ABI.
//!
//! ```no_run
//! use sx::{GroupConfig, Optimizer, Param, ParamGroup, ShardGroup};
//! let mut g = ShardGroup::new(&GroupConfig::new("local://demo").rank(0).world_size(1))?;
//! g.add_param_group(&ParamGroup::new(Optimizer::AdamW).lr(1e-3))?;
//! g.add_param(&Param::new("w", &[4, 4]))?;
//! g.finalize()?;
//! g.grad_mut(0)?.iter_mut().for_each(|x| *x = 1.0);
//! g.step(None)?;
//! # Ok::<(), sx::Error>(())
//! ```
mod context;
mod error;
mod future;
mod group;
mod interop;
mod log;
mod norm_domain;
mod optimizer;
mod options;
mod state;

pub use context::{Context, ContextConfig, ContextStats};
pub use error::{status_string, Error, Result};
pub use future::SaveFuture;
pub use interop::{HfExportOptions, HfImportOptions, HfImportReport, PeftConfig};
pub use group::{MemoryStats, ParamInfo, RegroupResult, ShardGroup, StepResult, Tensors, UnitInfo, UnitTensors};
pub use log::{clear_log_callback, set_log_callback, LogLevel};
pub use norm_domain::NormDomain;
pub use optimizer::{register_optimizer, CustomOptimizer, OptimizerDesc, Piece, UPDATE_PANICKED};
pub use options::{
    Backend, Dtype, GroupConfig, Hyperparameter, LoadOptions, LossScaling, LossScalingMode, MuonAdjustLr, NonFinite,
    Optimizer, Param, ParamGroup, ReduceOp, SaveOptions, StateDtype, StepOptions, Transport, UnitReadyOptions,
};
pub use state::{ParamState, ParamStateMut, ParamStateRef};

pub use sx_sys as sys;

/// The `SX_ERR_*` status codes carried by [`Error::status`].
pub mod status {
    pub use sx_sys::{
        SX_ERR_ABORTED, SX_ERR_ALREADY_EXISTS, SX_ERR_CANCELLED, SX_ERR_COMM, SX_ERR_CORRUPT, SX_ERR_GROUP_FAILED,
        SX_ERR_INTERNAL, SX_ERR_INVALID_ARGUMENT, SX_ERR_INVALID_HANDLE, SX_ERR_INVALID_STATE, SX_ERR_IO,
        SX_ERR_MISMATCH, SX_ERR_NONFINITE, SX_ERR_NOT_FOUND, SX_ERR_OPTIMIZER, SX_ERR_OUT_OF_MEMORY, SX_ERR_TIMEOUT, SX_ERR_UNSUPPORTED,
        SX_ERR_VERSION, SX_OK,
    };
}

/// The runtime's version as (major, minor, patch).
pub fn version() -> (u32, u32, u32) {
    let v = unsafe { sys::sx_version() };
    (v / 10000, v / 100 % 100, v % 100)
}

/// Checks that the loaded runtime can serve this binding: the same major version and a
/// minor version not older than the one this binding was written against.
pub fn check_version() -> Result<()> {
    check_runtime_version(version())
}

pub(crate) fn check_runtime_version(runtime: (u32, u32, u32)) -> Result<()> {
    let (major, minor, patch) = runtime;
    if major != sys::SX_VERSION_MAJOR || minor < sys::SX_VERSION_MINOR {
        return Err(Error::new(
            sys::SX_ERR_VERSION,
            format!(
                "the loaded libsx is version {}.{}.{}; this binding needs {}.x with x >= {}",
                major,
                minor,
                patch,
                sys::SX_VERSION_MAJOR,
                sys::SX_VERSION_MINOR
            ),
        ));
    }
    Ok(())
}

/// Reads the user blob stored in the checkpoint at `path` (after verifying its manifest).
pub fn read_user_blob(path: &str) -> Result<Vec<u8>> {
    let c_path = options::c_string("path", path)?;
    // First ask for the size: with capacity 0 the call fails (saying how much is
    // needed) unless the blob is empty.
    let mut size = 0u64;
    let first = error::check(unsafe { sys::sx_read_user_blob(c_path.as_ptr(), std::ptr::null_mut(), 0, &mut size) });
    match first {
        Ok(()) => return Ok(Vec::new()),
        Err(e) if e.status() == sys::SX_ERR_INVALID_ARGUMENT && size > 0 => {}
        Err(e) => return Err(e),
    }
    let mut buf = vec![0u8; size as usize];
    let mut got = 0u64;
    error::check(unsafe {
        sys::sx_read_user_blob(c_path.as_ptr(), buf.as_mut_ptr() as *mut _, buf.len() as u64, &mut got)
    })?;
    buf.truncate(got as usize);
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_check_rejects_other_major_and_older_minor() {
        assert!(check_runtime_version((sys::SX_VERSION_MAJOR, sys::SX_VERSION_MINOR, 0)).is_ok());
        assert!(check_runtime_version((sys::SX_VERSION_MAJOR, sys::SX_VERSION_MINOR + 1, 0)).is_ok());
        let e = check_runtime_version((sys::SX_VERSION_MAJOR + 1, 0, 0)).unwrap_err();
        assert_eq!(e.status(), sys::SX_ERR_VERSION);
        assert!(e.message().contains("needs"), "{}", e);
        // checked_sub, not `MINOR > 0 && MINOR - 1`: rustc 1.63 rejects the constant
        // `0 - 1` (deny(arithmetic_overflow)) even in a branch that cannot run.
        if let Some(older) = sys::SX_VERSION_MINOR.checked_sub(1) {
            assert!(check_runtime_version((sys::SX_VERSION_MAJOR, older, 0)).is_err());
        }
        assert!(check_version().is_ok());
    }
}
