use std::ffi::CStr;
use std::fmt;
use std::os::raw::c_char;

use sx_sys as sys;

/// A failed sx call: the status code (one of the `SX_ERR_*` values, re-exported in
/// [`crate::status`]) and the library's message saying what was wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    status: i32,
    message: String,
}

impl Error {
    pub fn new(status: i32, message: impl Into<String>) -> Error {
        Error { status, message: message.into() }
    }

    /// The `SX_ERR_*` status.
    pub fn status(&self) -> i32 {
        self.status
    }

    /// What was wrong, in the library's words.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The status's static name and description ("SX_ERR_TIMEOUT: ...").
    pub fn status_name(&self) -> String {
        status_string(self.status)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = self.status_name();
        let name = name.split(':').next().unwrap_or("");
        if self.message.is_empty() {
            write!(f, "{}", name)
        } else {
            write!(f, "{}: {}", name, self.message)
        }
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

pub(crate) fn cstr_lossy(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: sx hands out NUL-terminated strings that outlive this copy.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// Text naming a status ("SX_ERR_TIMEOUT: ...").
pub fn status_string(status: i32) -> String {
    cstr_lossy(unsafe { sys::sx_status_string(status) })
}

/// Turns a status into a Result, reading the thread-local message on the thread that
/// made the call (it is still the calling thread: nothing ran in between).
pub(crate) fn check(status: sys::sx_status_t) -> Result<()> {
    if status == sys::SX_OK {
        Ok(())
    } else {
        Err(Error::new(status, cstr_lossy(unsafe { sys::sx_last_error_message() })))
    }
}

pub(crate) fn invalid_argument(message: String) -> Error {
    Error::new(sys::SX_ERR_INVALID_ARGUMENT, message)
}
