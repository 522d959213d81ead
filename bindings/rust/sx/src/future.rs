//! Save futures. A completion callback is a Rust closure kept in a table here; C gets
//! only the closure's number as its `user` pointer, never Rust-owned memory.
use std::collections::HashMap;
use std::os::raw::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use sx_sys as sys;

use crate::error::{check, cstr_lossy, Error, Result};

type Callback = Box<dyn FnOnce(Result<()>) + Send + 'static>;

static NEXT_ID: AtomicUsize = AtomicUsize::new(1);
static CALLBACKS: Mutex<Option<HashMap<usize, Callback>>> = Mutex::new(None);

pub(crate) fn register(cb: Callback) -> usize {
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    CALLBACKS.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert_with(HashMap::new).insert(id, cb);
    id
}

pub(crate) fn unregister(id: usize) -> Option<Callback> {
    CALLBACKS.lock().unwrap_or_else(|p| p.into_inner()).as_mut().and_then(|m| m.remove(&id))
}

pub(crate) unsafe extern "C" fn trampoline(future: *mut sys::sx_future_t, status: sys::sx_status_t, user: *mut c_void) {
    if let Some(cb) = unregister(user as usize) {
        let result = if status == sys::SX_OK {
            Ok(())
        } else {
            Err(Error::new(status, cstr_lossy(sys::sx_future_error_message(future))))
        };
        // A panic must not unwind into C; the callback's panic is dropped here.
        let _ = catch_unwind(AssertUnwindSafe(move || cb(result)));
    }
}

/// A save in progress. Dropping it waits for the save to finish and releases it.
/// Poll, cancel and progress may be called from any thread.
pub struct SaveFuture {
    raw: *mut sys::sx_future_t,
    callback_id: usize,
}

// sx_future_* functions may be called from any thread.
unsafe impl Send for SaveFuture {}
unsafe impl Sync for SaveFuture {}

impl SaveFuture {
    pub(crate) fn from_raw(raw: *mut sys::sx_future_t, callback_id: usize) -> SaveFuture {
        SaveFuture { raw, callback_id }
    }

    fn outcome(&self, status: sys::sx_status_t) -> Result<()> {
        if status == sys::SX_OK {
            Ok(())
        } else {
            let text = cstr_lossy(unsafe { sys::sx_future_error_message(self.raw) });
            let text = if text.is_empty() { cstr_lossy(unsafe { sys::sx_last_error_message() }) } else { text };
            Err(Error::new(status, text))
        }
    }

    /// Waits until the save completes; its own error if it failed.
    pub fn wait(&self) -> Result<()> {
        self.outcome(unsafe { sys::sx_future_wait(self.raw, -1) })
    }

    /// Waits at most `timeout`: Ok(false) if the save is still running, Ok(true) if it
    /// completed successfully, its error if it failed.
    pub fn wait_timeout(&self, timeout: Duration) -> Result<bool> {
        let ms = timeout.as_millis().min(i64::MAX as u128) as i64;
        match self.outcome(unsafe { sys::sx_future_wait(self.raw, ms) }) {
            Ok(()) => Ok(true),
            Err(e) if e.status() == sys::SX_ERR_TIMEOUT && !self.poll()? => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Waits until the snapshot has been copied out of the group's memory: after that,
    /// params may be written through views again without reaching this checkpoint.
    pub fn wait_staged(&self) -> Result<()> {
        check(unsafe { sys::sx_future_wait_staged(self.raw, -1) })
    }

    /// Whether the save has completed (successfully or not).
    pub fn poll(&self) -> Result<bool> {
        let mut done = 0;
        check(unsafe { sys::sx_future_poll(self.raw, &mut done) })?;
        Ok(done != 0)
    }

    /// Asks a running save to stop; it then fails with SX_ERR_CANCELLED and commits nothing.
    pub fn cancel(&self) -> Result<()> {
        check(unsafe { sys::sx_future_cancel(self.raw) })
    }

    /// Bytes of this rank's files written so far, and in all.
    pub fn progress(&self) -> Result<(u64, u64)> {
        let (mut done, mut total) = (0u64, 0u64);
        check(unsafe { sys::sx_future_progress(self.raw, &mut done, &mut total) })?;
        Ok((done, total))
    }

    /// The raw handle, valid while this future lives.
    pub fn as_raw(&self) -> *mut sys::sx_future_t {
        self.raw
    }
}

impl Drop for SaveFuture {
    fn drop(&mut self) {
        unsafe { sys::sx_future_destroy(self.raw) };
        if self.callback_id != 0 {
            // Normally the callback ran and removed itself already.
            unregister(self.callback_id);
        }
    }
}
