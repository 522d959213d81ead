//! Norm domains (include/sx/sx_step.h, docs/model-parallel.md): the groups of every
//! model-parallel slice joined, so that each step's gradient norm, non-finite check and
//! loss-scale decision are taken over all of them.
use std::ptr;

use sx_sys as sys;

use crate::error::{check, Result};
use crate::options::GroupConfig;

/// This rank's handle of a norm domain over every rank of a model-parallel trainer.
/// Made collectively from a [`GroupConfig`] whose rendezvous, rank, world size, timeout
/// and transport (or context and name) say how the domain's ranks meet; each rank then
/// joins its own group with [`crate::ShardGroup::join_norm_domain`]. The groups joined
/// keep the domain alive: dropping this releases the handle only.
#[derive(Debug)]
pub struct NormDomain {
    raw: *mut sys::sx_norm_domain_t,
}

// One thread uses a domain at a time; it may move between threads.
unsafe impl Send for NormDomain {}

impl NormDomain {
    /// Collective over the domain's ranks: blocks until every rank has joined or the
    /// timeout passes.
    pub fn new(config: &GroupConfig) -> Result<NormDomain> {
        crate::check_version()?;
        let mut d = ptr::null_mut();
        config.with_raw(|raw| check(unsafe { sys::sx_create_norm_domain(raw, &mut d) }))?;
        Ok(NormDomain { raw: d })
    }

    pub(crate) fn as_ptr(&self) -> *mut sys::sx_norm_domain_t {
        self.raw
    }
}

impl Drop for NormDomain {
    fn drop(&mut self) {
        unsafe { sys::sx_destroy_norm_domain(self.raw) };
    }
}
