//! GroupConfig::offload: 2 ranks (threads over local://) of a CUDA group on the simulated
//! device (SX_SIMULATED_DEVICE=1: host memory behind a device's calls) keep LAMB's state on
//! the host (a CUDA group that does not offload keeps it, and runs LAMB, on the device).
//! Two steps change the param; the memory stats' device_bytes count the params and
//! gradients on the device but not the optimizer state (all of it without offload), and
//! are 0 for a CPU group.
//!
//! A test binary of its own: SX_SIMULATED_DEVICE is set in the process (once, before any
//! group of this binary is made) and must not reach the other tests' groups.
mod common;

use std::sync::{Arc, Once};
use std::thread;

use sx::{Backend, MemoryStats, Optimizer, Param, ParamGroup, ShardGroup};

const ROWS: i64 = 6;
const COLS: i64 = 4;
const N: usize = (ROWS * COLS) as usize;

/// Sets SX_SIMULATED_DEVICE before the first group: every test calls it first.
fn simulated_device() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| std::env::set_var("SX_SIMULATED_DEVICE", "1"));
}

/// The fp32 elements behind a view: the simulated device's memory is host memory, which
/// the slice accessors (host memory only) do not wrap.
fn floats<'a>(v: sx::sys::sx_view_t) -> &'a mut [f32] {
    assert_eq!((v.dtype, v.numel), (sx::sys::SX_DTYPE_F32, N as u64));
    unsafe { std::slice::from_raw_parts_mut(v.data as *mut f32, N) }
}

/// Runs `f` on 2 ranks of a group of `backend` with `offload`.
fn run_ranks<T, F>(test: &str, backend: Backend, offload: bool, f: F) -> Vec<T>
where
    T: Send + 'static,
    F: Fn(i32, ShardGroup) -> sx::Result<T> + Send + Sync + 'static,
{
    simulated_device();
    let name = common::rendezvous(test);
    let f = Arc::new(f);
    let handles: Vec<_> = (0..2)
        .map(|rank| {
            let (f, name) = (f.clone(), name.clone());
            thread::spawn(move || {
                let config = common::config(&name, rank, 2).backend(backend).offload(offload);
                f(rank, ShardGroup::new(&config)?)
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

/// w before, w after two LAMB steps, the memory stats, and the view's device.
fn train(test: &str, backend: Backend, offload: bool) -> Vec<(Vec<f32>, Vec<f32>, MemoryStats, i32)> {
    run_ranks(test, backend, offload, |rank, mut g| {
        g.add_param_group(&ParamGroup::new(Optimizer::Lamb).lr(0.01))?;
        g.add_param(&Param::new("w", &[ROWS, COLS]))?;
        g.finalize()?;
        for (k, x) in floats(g.param_view(0)?).iter_mut().enumerate() {
            *x = ((k % 7) as f32 - 3.0) / 8.0;
        }
        let before = floats(g.param_view(0)?).to_vec();
        for step in 0..2 {
            for (k, x) in floats(g.grad_view(0)?).iter_mut().enumerate() {
                *x = (((k * 5 + step + rank as usize) % 9) as f32 - 4.0) / 16.0;
            }
            g.step(None)?;
        }
        let after = floats(g.param_view(0)?).to_vec();
        Ok((before, after, g.memory_stats()?, g.param_view(0)?.device))
    })
}

#[test]
fn an_offloaded_cuda_group_steps_lamb_with_its_state_on_the_host() {
    let results = train("offload-lamb", Backend::Cuda, true);
    for (before, after, stats, device) in &results {
        assert_eq!(*device, sx::sys::SX_DEVICE_CUDA);
        assert_ne!(before, after, "two steps left the param as it was");
        assert!(stats.optimizer_bytes > 0);
        // The params and their flat gradient buffer (fp32: as large) are on the device;
        // the masters, LAMB's state and the reduced gradient shard are not.
        assert_eq!(stats.device_bytes, 2 * stats.param_bytes, "{:?}", stats);
        assert!(stats.device_bytes > 0, "{:?}", stats);
        assert!(stats.device_bytes < stats.param_bytes + stats.grad_bytes + stats.optimizer_bytes, "{:?}", stats);
    }
    assert_eq!(results[0].1, results[1].1, "the ranks' replicated params differ");
}

#[test]
fn a_cuda_group_that_keeps_its_state_on_the_device_steps_lamb_there() {
    let results = train("offload-none", Backend::Cuda, false);
    for (before, after, stats, device) in &results {
        assert_eq!(*device, sx::sys::SX_DEVICE_CUDA);
        assert_ne!(before, after, "two steps left the param as it was");
        assert!(stats.optimizer_bytes > 0, "{:?}", stats);
        assert_eq!(stats.device_bytes, stats.param_bytes + stats.grad_bytes + stats.optimizer_bytes, "{:?}", stats);
    }
    assert_eq!(results[0].1, results[1].1, "the ranks' replicated params differ");
}

#[test]
fn a_cpu_group_has_no_device_bytes() {
    for (before, after, stats, device) in train("offload-cpu", Backend::Cpu, true) {
        assert_eq!(device, sx::sys::SX_DEVICE_CPU);
        assert_ne!(before, after, "two steps left the param as it was");
        assert_eq!(stats.device_bytes, 0, "{:?}", stats);
        assert!(stats.param_bytes > 0);
    }
}
