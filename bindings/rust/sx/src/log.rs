//! The process-wide log callback. The closure stays in a static here; C gets a plain
//! function and a NULL user pointer.
use std::ffi::CStr;
use std::os::raw::{c_char, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};

use sx_sys as sys;

use crate::error::{check, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    Error = 1,
    Warn = 2,
    Info = 3,
    Debug = 4,
}

type LogFn = Arc<dyn Fn(LogLevel, &str) + Send + Sync + 'static>;

static LOGGER: Mutex<Option<LogFn>> = Mutex::new(None);

unsafe extern "C" fn trampoline(level: i32, message: *const c_char, _user: *mut c_void) {
    let f = LOGGER.lock().unwrap_or_else(|p| p.into_inner()).clone();
    if let Some(f) = f {
        let level = match level {
            sys::SX_LOG_ERROR => LogLevel::Error,
            sys::SX_LOG_WARN => LogLevel::Warn,
            sys::SX_LOG_INFO => LogLevel::Info,
            _ => LogLevel::Debug,
        };
        let text = if message.is_null() { Default::default() } else { CStr::from_ptr(message).to_string_lossy() };
        let _ = catch_unwind(AssertUnwindSafe(|| f(level, &text)));
    }
}

/// Sends sx's log messages up to `max_level` to `f`. It may be called from any thread,
/// sx's own included, concurrently.
pub fn set_log_callback<F: Fn(LogLevel, &str) + Send + Sync + 'static>(f: F, max_level: LogLevel) -> Result<()> {
    *LOGGER.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(f));
    check(unsafe { sys::sx_set_log_callback(Some(trampoline), std::ptr::null_mut(), max_level as i32) })
}

/// Turns logging off.
pub fn clear_log_callback() -> Result<()> {
    let r = check(unsafe { sys::sx_set_log_callback(None, std::ptr::null_mut(), 0) });
    *LOGGER.lock().unwrap_or_else(|p| p.into_inner()) = None;
    r
}
