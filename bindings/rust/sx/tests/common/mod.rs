#![allow(dead_code)]
use std::path::PathBuf;
use std::sync::Arc;
use std::thread;

use sx::{Backend, GroupConfig, Result, ShardGroup};

/// A local:// rendezvous name unique to this process and test.
pub fn rendezvous(test: &str) -> String {
    format!("local://rust-{}-{}", std::process::id(), test)
}

pub fn config(rendezvous: &str, rank: i32, world: i32) -> GroupConfig {
    GroupConfig::new(rendezvous).rank(rank).world_size(world).stage(2).backend(Backend::Cpu).num_threads(1).timeout_ms(60_000)
}

/// Runs `f` on `world` ranks, one thread each, over one local:// rendezvous; returns
/// each rank's result in rank order.
pub fn run_ranks<T, F>(test: &str, world: i32, f: F) -> Vec<T>
where
    T: Send + 'static,
    F: Fn(i32, ShardGroup) -> Result<T> + Send + Sync + 'static,
{
    let name = rendezvous(test);
    let f = Arc::new(f);
    let handles: Vec<_> = (0..world)
        .map(|rank| {
            let (f, name) = (f.clone(), name.clone());
            thread::spawn(move || {
                let g = ShardGroup::new(&config(&name, rank, world))?;
                f(rank, g)
            })
        })
        .collect();
    handles
        .into_iter()
        .enumerate()
        .map(|(r, h)| match h.join().expect("rank thread panicked") {
            Ok(v) => v,
            Err(e) => panic!("rank {}: {}", r, e),
        })
        .collect()
}

/// A fresh empty directory under the system temp dir, removed when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(test: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("sx-rust-{}-{}", std::process::id(), test));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    pub fn join(&self, name: &str) -> String {
        self.0.join(name).to_str().unwrap().to_string()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
