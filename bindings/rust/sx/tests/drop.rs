//! Dropping a group releases what it holds: its threads end. One test in this binary,
//! so that no other test's threads move the count.
mod common;

use std::time::{Duration, Instant};

use sx::{Optimizer, Param, ParamGroup, SaveOptions, ShardGroup};

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").expect("reading /proc/self/task").count()
}

fn wait_for_threads(n: usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = threads();
        if now <= n || Instant::now() > deadline {
            return now;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn make_group(test: &str) -> ShardGroup {
    let mut g = ShardGroup::new(&common::config(&common::rendezvous(test), 0, 1).num_threads(3)).unwrap();
    g.add_param_group(&ParamGroup::new(Optimizer::Adam)).unwrap();
    g.add_param(&Param::new("w", &[1000])).unwrap();
    g.finalize().unwrap();
    g.grad_mut(0).unwrap().iter_mut().for_each(|x| *x = 1.0);
    g.step(None).unwrap();
    g
}

#[test]
fn drop_and_close_release_the_group() {
    let dir = common::TempDir::new("drop");
    // libuv's process-wide thread pool starts with the first save and stays: count
    // from after one whole cycle.
    let mut warm = make_group("warm");
    warm.save(SaveOptions::new(&dir.join("warm"))).unwrap().wait().unwrap();
    drop(warm);
    std::thread::sleep(Duration::from_millis(100));
    let baseline = threads();

    let mut g = make_group("drop");
    let fut = g.save(SaveOptions::new(&dir.join("c"))).unwrap();
    assert!(threads() > baseline, "a group with a thread pool and a save added no thread");
    drop(g);
    // The future outlives the group and still reports the save's outcome.
    fut.wait().unwrap();
    drop(fut);
    let after = wait_for_threads(baseline);
    assert_eq!(after, baseline, "threads left after dropping the group");

    let g = make_group("close");
    assert!(threads() > baseline);
    g.close().unwrap();
    assert_eq!(wait_for_threads(baseline), baseline, "threads left after closing the group");
}

#[test]
fn finalize_reserves_the_checkpoint_staging_when_asked() {
    for reserve in [false, true] {
        let name = if reserve { "reserve" } else { "no-reserve" };
        let cfg = common::config(&common::rendezvous(name), 0, 1).reserve_checkpoint_staging(reserve);
        let mut g = ShardGroup::new(&cfg).unwrap();
        g.add_param_group(&ParamGroup::new(Optimizer::Adam)).unwrap();
        g.add_param(&Param::new("w", &[1000])).unwrap();
        g.finalize().unwrap();
        // Adam's values and two states, 4000 bytes each, each on a 4 KiB boundary.
        let staged = g.memory_stats().unwrap().staging_bytes;
        assert_eq!(staged, if reserve { 2 * 4096 + 4000 } else { 0 }, "reserve {}", reserve);
    }
}
