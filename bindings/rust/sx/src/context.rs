//! Contexts (include/sx/sx_context.h): many groups on one rendezvous, one transport and
//! one thread pool.
use std::ptr;
use std::sync::Arc;

use sx_sys as sys;

use crate::error::{check, Result};
use crate::options::{c_ptr, c_secret, c_string, c_string_opt, init, Backend, Secret, Transport};

/// The raw handle, shared by the [`Context`] and the [`GroupConfig`](crate::GroupConfig)s
/// that name it, and destroyed when the last of them goes.
#[derive(Debug)]
pub(crate) struct RawContext(*mut sys::sx_context_t);

// The handle is thread-safe: sx_get_context_stats may be called from any thread, and
// groups may be made in the context from several threads at once.
unsafe impl Send for RawContext {}
unsafe impl Sync for RawContext {}

impl RawContext {
    pub(crate) fn as_ptr(&self) -> *mut sys::sx_context_t {
        self.0
    }
}

impl Drop for RawContext {
    fn drop(&mut self) {
        if !self.0.is_null() {
            unsafe { sys::sx_destroy_context(self.0) };
        }
    }
}

/// How the ranks of a context meet, and what its groups share:
/// `ContextConfig::new("local://name").rank(r).world_size(n)`. The fields are
/// [`GroupConfig`](crate::GroupConfig)'s of the same names, with the same defaults.
#[derive(Clone, Debug)]
pub struct ContextConfig {
    raw: sys::sx_context_config_t,
    rendezvous: String,
    bind_address: Option<String>,
    rendezvous_token: Option<Secret>,
    rendezvous_bind: Option<String>,
}

impl ContextConfig {
    /// `rendezvous`: "local://NAME", "tcp://HOST:PORT", "file:///DIR" or "env://".
    pub fn new(rendezvous: &str) -> ContextConfig {
        ContextConfig {
            raw: init(sys::sx_context_config_init),
            rendezvous: rendezvous.to_string(),
            bind_address: None,
            rendezvous_token: None,
            rendezvous_bind: None,
        }
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
    /// The backend of every group in the context.
    pub fn backend(mut self, backend: Backend) -> Self {
        self.raw.backend = backend.raw();
        self
    }
    /// Threads of the pool the groups share (0: the cores divided by the ranks in this process).
    pub fn num_threads(mut self, n: i32) -> Self {
        self.raw.num_threads = n;
        self
    }
    /// The timeout of the context's creation and of its groups' collectives (0: 300000).
    pub fn timeout_ms(mut self, ms: i32) -> Self {
        self.raw.timeout_ms = ms;
        self
    }
    pub fn transport(mut self, transport: Transport) -> Self {
        self.raw.transport = transport.raw();
        self
    }
    pub fn bind_address(mut self, address: &str) -> Self {
        self.bind_address = Some(address.to_string());
        self
    }
    pub fn rendezvous_token(mut self, token: &str) -> Self {
        self.rendezvous_token = Some(Secret(token.to_string()));
        self
    }
    pub fn rendezvous_bind(mut self, address: &str) -> Self {
        self.rendezvous_bind = Some(address.to_string());
        self
    }
    pub fn device_ordinal(mut self, ordinal: i32) -> Self {
        self.raw.device_ordinal = ordinal;
        self
    }
    /// The most bytes the context's groups may hold on this rank (0: no budget): a
    /// finalize that would exceed it fails with SX_ERR_OUT_OF_MEMORY before anything is
    /// allocated. Each rank has its own.
    pub fn memory_budget_bytes(mut self, bytes: u64) -> Self {
        self.raw.memory_budget_bytes = bytes;
        self
    }
}

/// What a context holds on this rank now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContextStats {
    /// Groups of the context alive on this rank.
    pub groups: i64,
    /// Groups made in it since its creation.
    pub groups_created: i64,
    /// Channels open on its transport (a group has 1 or more).
    pub channels: i64,
    /// What its groups hold on this rank, as the budget counts it.
    pub memory_bytes: u64,
    /// The budget (0: none).
    pub memory_budget_bytes: u64,
    /// Its channels share memory: every rank on this host, or within each of several
    /// hosts of as many ranks (with its Gloo mesh between them).
    pub shared_memory: bool,
    /// What its Gloo channels keep on this rank between their calls (blocks their calls
    /// reuse, and what calls that ended early left); not in `memory_bytes`.
    pub transport_bytes: u64,
}

/// This rank's handle of a context: what the groups made in it on the same ranks share
/// (the rendezvous, the transport and the thread pool). Make groups in it with
/// [`GroupConfig::in_context`](crate::GroupConfig::in_context); each keeps its failures,
/// checkpoints and memory to itself.
///
/// Lifetime: the context lives while any group made in it does. Dropping the handle (or
/// [`Context::close`]) releases it only: the groups already made go on, and the context
/// closes with the last of them; no group can be made in it afterwards. A
/// [`GroupConfig`](crate::GroupConfig) that names the context holds the handle too, until
/// it is dropped.
///
/// It may be shared by threads (`Send + Sync`): stats are read from any thread, and
/// groups may be made in it from several threads at once.
pub struct Context {
    pub(crate) raw: Arc<RawContext>,
}

impl Context {
    /// Creates this rank's handle and connects to the other ranks (collective: blocks
    /// until every rank has joined or the timeout passes). Checks first that the loaded
    /// libsx has a compatible version.
    pub fn new(config: &ContextConfig) -> Result<Context> {
        crate::check_version()?;
        let rendezvous = c_string("rendezvous", &config.rendezvous)?;
        let bind = c_string_opt("bind_address", &config.bind_address)?;
        let token = c_secret(&config.rendezvous_token)?;
        let rendezvous_bind = c_string_opt("rendezvous_bind", &config.rendezvous_bind)?;
        let mut raw = config.raw;
        raw.rendezvous = rendezvous.as_ptr();
        raw.bind_address = c_ptr(&bind);
        raw.rendezvous_token = c_ptr(&token);
        raw.rendezvous_bind = c_ptr(&rendezvous_bind);
        let mut c = ptr::null_mut();
        check(unsafe { sys::sx_create_context(&raw, &mut c) })?;
        Ok(Context { raw: Arc::new(RawContext(c)) })
    }

    /// Releases the handle now, reporting the library's status (where a
    /// [`GroupConfig`](crate::GroupConfig) still names the context, the handle goes with
    /// the last of those instead).
    pub fn close(self) -> Result<()> {
        match Arc::try_unwrap(self.raw) {
            Ok(mut raw) => {
                let p = std::mem::replace(&mut raw.0, ptr::null_mut());
                check(unsafe { sys::sx_destroy_context(p) })
            }
            Err(_) => Ok(()),
        }
    }

    /// The raw handle, valid while this context lives.
    pub fn as_raw(&self) -> *mut sys::sx_context_t {
        self.raw.as_ptr()
    }

    /// What the context holds on this rank now. Any thread.
    pub fn stats(&self) -> Result<ContextStats> {
        let mut s: sys::sx_context_stats_t = init(sys::sx_context_stats_init);
        check(unsafe { sys::sx_get_context_stats(self.raw.as_ptr(), &mut s) })?;
        Ok(ContextStats {
            groups: s.groups,
            groups_created: s.groups_created,
            channels: s.channels,
            memory_bytes: s.memory_bytes,
            memory_budget_bytes: s.memory_budget_bytes,
            shared_memory: s.shared_memory != 0,
            transport_bytes: s.transport_bytes,
        })
    }
}
