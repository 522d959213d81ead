mod common;

use sx::status::{SX_ERR_NONFINITE, SX_ERR_UNSUPPORTED};
use sx::{
    Dtype, Hyperparameter, LoadOptions, LossScaling, NonFinite, Optimizer, Param, ParamGroup, ReduceOp, SaveOptions,
    ShardGroup, StepOptions, Transport, UnitReadyOptions,
};

const N: usize = 37;

fn target(k: usize) -> f32 {
    (k as f32 * 0.37).sin()
}

/// Loss 0.5 * |w - target|^2 per rank, gradient (w - target) scaled per rank, so that the
/// ranks' gradients differ and only their average drives w to the target.
fn grads(rank: i32, w: &[f32], g: &mut [f32]) -> f64 {
    let scale = 0.5 + rank as f32 * 0.25;
    let mut loss = 0.0f64;
    for k in 0..w.len() {
        let d = w[k] - target(k);
        loss += 0.5 * (d * d) as f64;
        g[k] += scale * d;
    }
    loss
}

fn setup(g: &mut ShardGroup, lr: f64) -> sx::Result<()> {
    g.add_param_group(&ParamGroup::new(Optimizer::AdamW).lr(lr))?;
    g.add_param(&Param::new("w", &[N as i64]).unit(0))?;
    g.add_param(&Param::new("frozen", &[3, 5]).unit(1).frozen(true))?;
    g.finalize()
}

#[test]
fn four_ranks_train_and_the_loss_falls() {
    let losses = common::run_ranks("train4", 4, |rank, mut g| {
        setup(&mut g, 0.05)?;
        assert_eq!((g.rank()?, g.world_size()?, g.stage()?), (rank, 4, 2));
        assert_eq!((g.num_params()?, g.num_units()?, g.num_param_groups()?), (2, 2, 1));
        let frozen0: Vec<f32> = g.param(1)?.to_vec();
        let mut losses = Vec::new();
        for s in 0..30 {
            let mut t = g.tensors_mut()?;
            losses.push(grads(rank, t.params[0], t.grads[0]));
            t.grads[1].iter_mut().for_each(|x| *x = 1.0);
            let r = g.step(Some(&StepOptions::new().max_grad_norm(100.0)))?;
            assert_eq!(r.step, s + 1);
            assert!(r.grad_norm > 0.0 && !r.skipped);
            // Grads are zeroed after the step.
            assert!(g.grad(0)?.iter().all(|&x| x == 0.0));
        }
        assert_eq!(g.param(1)?, &frozen0[..], "a frozen param changed");
        assert_eq!(g.param_group_steps(0)?, 30);
        assert!(g.param_group_steps(1).is_err(), "a param group index out of range");
        let info = g.param_info(0)?;
        assert_eq!((info.name.as_str(), info.shape.clone(), info.numel), ("w", vec![N as i64], N as u64));
        let unit = g.unit_info(0)?;
        assert_eq!(unit.padded_numel % 4, 0);
        assert!(unit.has_optimizer_state);
        assert!(!g.unit_info(1)?.has_optimizer_state);
        let m = g.memory_stats()?;
        assert!(m.optimizer_bytes < m.unsharded_optimizer_bytes, "{:?}", m);
        Ok((losses, g.param(0)?.to_vec()))
    });
    let (l0, w0) = &losses[0];
    assert!(l0[29] < 0.1 * l0[0], "loss did not fall: {:?}", l0);
    for (_, w) in &losses[1..] {
        assert_eq!(w, w0, "ranks hold different params after the steps");
    }
}

#[test]
fn freezing_and_unfreezing_are_picked_up() {
    common::run_ranks("freeze", 2, |rank, mut g| {
        g.add_param_group(&ParamGroup::new(Optimizer::Sgd).lr(0.1))?;
        g.add_param(&Param::new("a", &[5]).unit(0))?;
        g.add_param(&Param::new("b", &[6]).unit(0))?;
        g.finalize()?;
        let step_with_ones = |g: &mut ShardGroup| -> sx::Result<()> {
            let t = g.tensors_mut()?;
            t.grads.into_iter().for_each(|gr| gr.iter_mut().for_each(|x| *x = 1.0));
            g.step(None).map(|_| ())
        };
        g.set_trainable(1, false)?;
        assert!(!g.trainable(1)? && g.trainable(0)?);
        step_with_ones(&mut g)?;
        assert!(g.param(0)?.iter().all(|&x| (x + 0.1).abs() < 1e-6), "rank {}: {:?}", rank, g.param(0)?);
        assert!(g.param(1)?.iter().all(|&x| x == 0.0), "frozen b moved: {:?}", g.param(1)?);
        // Through the group-owned mask: freeze a, unfreeze b.
        {
            let mask = g.trainable_mask_mut()?;
            assert_eq!(mask, &[1u8, 0][..]);
            mask[0] = 0;
            mask[1] = 1;
        }
        step_with_ones(&mut g)?;
        assert!(g.param(0)?.iter().all(|&x| (x + 0.1).abs() < 1e-6));
        assert!(g.param(1)?.iter().all(|&x| (x + 0.1).abs() < 1e-6), "unfrozen b did not move: {:?}", g.param(1)?);
        assert!(!g.trainable(0)?);
        Ok(())
    });
}

#[test]
fn save_and_load_reshard_four_to_two_with_the_user_blob() {
    let dir = common::TempDir::new("reshard");
    let path = dir.join("ckpt-1");
    let blob: Vec<u8> = (0..300u32).map(|i| (i * 7 % 251) as u8).collect();
    let (p, b) = (path.clone(), blob.clone());
    let saved = common::run_ranks("save4", 4, move |rank, mut g| {
        setup(&mut g, 0.05)?;
        for _ in 0..3 {
            let mut t = g.tensors_mut()?;
            grads(rank, t.params[0], t.grads[0]);
            g.step(None)?;
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let fut = g.save(SaveOptions::new(&p).user_blob(&b).on_complete(move |r| tx.send(r).unwrap()))?;
        fut.wait_staged()?;
        fut.wait()?;
        assert!(fut.poll()?);
        let (done, total) = fut.progress()?;
        // A rank whose shard holds no element of a param writes no bytes.
        assert_eq!(done, total, "progress of a completed save");
        rx.recv_timeout(std::time::Duration::from_secs(60)).expect("save callback never ran")?;
        // One more step after the save: the checkpoint must hold the state before it.
        let before = g.param(0)?.to_vec();
        let mut t = g.tensors_mut()?;
        grads(rank, t.params[0], t.grads[0]);
        g.step(None)?;
        assert_ne!(g.param(0)?, &before[..]);
        Ok((before, total))
    });
    assert!(saved.iter().map(|s| s.1).sum::<u64>() > 0, "the save wrote no bytes");
    let saved: Vec<Vec<f32>> = saved.into_iter().map(|s| s.0).collect();
    assert!(std::path::Path::new(&path).join("MANIFEST").is_file());
    assert_eq!(sx::read_user_blob(&path).unwrap(), blob);

    let p = path.clone();
    let loaded = common::run_ranks("load2", 2, move |_rank, mut g| {
        setup(&mut g, 0.5)?;
        g.load(&LoadOptions::new(&p))?;
        Ok((g.param(0)?.to_vec(), g.hyperparameter(0, Hyperparameter::Lr)?, g.unit_info(0)?.shard_numel))
    });
    for (w, lr, _) in &loaded {
        assert_eq!(w, &saved[0], "params loaded into 2 ranks differ from those saved by 4");
        assert_eq!(*lr, 0.05, "the param group's lr was not restored");
    }

    // A load that names a missing checkpoint fails on every rank with the path in the message.
    let missing = dir.join("nope");
    let errors = common::run_ranks("loadmissing", 2, move |_rank, mut g| {
        setup(&mut g, 0.5)?;
        Ok(g.load(&LoadOptions::new(&missing)).unwrap_err())
    });
    for e in errors {
        assert!(e.message().contains("nope"), "{}", e);
    }
}

#[test]
fn saving_over_an_existing_directory_fails_in_the_call_or_the_future() {
    let dir = common::TempDir::new("exists");
    let path = dir.join("taken");
    std::fs::create_dir(&path).unwrap();
    let results = common::run_ranks("exists", 2, move |_rank, mut g| {
        setup(&mut g, 0.05)?;
        Ok(match g.save(SaveOptions::new(&path)) {
            Err(e) => e,
            Ok(f) => f.wait().expect_err("saved over an existing directory"),
        })
    });
    for e in results {
        assert!(e.message().contains("taken"), "{}", e);
    }
}

#[test]
fn bf16_params_step_with_fp32_grads_under_dynamic_loss_scaling() {
    let config = common::config(&common::rendezvous("bf16"), 0, 1).grad_dtype(Dtype::F32);
    let mut g = ShardGroup::new(&config).unwrap();
    g.add_param_group(&ParamGroup::new(Optimizer::Sgd).lr(0.5)).unwrap();
    g.add_param(&Param::new("w", &[2, 3]).dtype(Dtype::Bf16)).unwrap();
    g.finalize().unwrap();
    assert_eq!(g.param_info(0).unwrap().dtype, Some(Dtype::Bf16));
    let (pv, gv) = (g.param_view(0).unwrap(), g.grad_view(0).unwrap());
    assert_eq!((pv.dtype, pv.numel, gv.dtype), (sx::sys::SX_DTYPE_BF16, 6, sx::sys::SX_DTYPE_F32));
    // A view of the wrong element type is refused, saying what the memory holds.
    let e = g.param(0).unwrap_err();
    assert_eq!(e.status(), SX_ERR_UNSUPPORTED);
    assert!(e.message().contains("bf16") && e.message().contains("&[f32]"), "{}", e);
    let e = g.grad_u16(0).unwrap_err();
    assert!(e.message().contains("fp32") && e.message().contains("&[u16]"), "{}", e);

    // bf16 1.0 is 0x3f80, the top half of fp32 1.0's bits. The masters start from it.
    g.param_u16_mut(0).unwrap().iter_mut().for_each(|x| *x = 0x3f80);
    assert_eq!(g.loss_scale().unwrap(), 1.0);
    g.set_loss_scaling(&LossScaling::dynamic().init_scale(1024.0)).unwrap();
    assert_eq!(g.loss_scale().unwrap(), 1024.0);
    // Gradients of the loss times 1024; the step divides them by it: SGD, lr 0.5 takes
    // 1.0 to 0.5 (bf16 0x3f00).
    g.grad_mut(0).unwrap().iter_mut().for_each(|x| *x = 1024.0);
    let r = g.step(None).unwrap();
    assert!(!r.skipped && r.step == 1 && r.loss_scale == 1024.0, "{:?}", r);
    assert_eq!(g.param_u16(0).unwrap(), &[0x3f00u16; 6][..]);
    // An inf gradient: the step is skipped and the scale backs off by half.
    g.grad_mut(0).unwrap()[4] = f32::INFINITY;
    let r = g.step(None).unwrap();
    assert!(r.skipped && r.step == 1 && r.loss_scale == 512.0, "{:?}", r);
    assert_eq!(g.loss_scale().unwrap(), 512.0);
    assert_eq!(g.param_u16(0).unwrap(), &[0x3f00u16; 6][..]);
}

#[test]
fn all_reduce_combines_the_trainers_numbers() {
    let results = common::run_ranks("allreduce", 3, |rank, mut g| -> sx::Result<Vec<Vec<f64>>> {
        let mut out = Vec::new();
        for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min] {
            let mut v = [rank as f64, -(rank as f64), 0.5];
            g.all_reduce(&mut v, op)?;
            out.push(v.to_vec());
        }
        // Different ops: told, and the values stay.
        let mut v = [1.0];
        let e = g.all_reduce(&mut v, if rank == 2 { ReduceOp::Max } else { ReduceOp::Sum }).unwrap_err();
        assert_eq!(e.status(), sx::status::SX_ERR_MISMATCH, "{}", e);
        assert!(e.message().contains("op: sum on ranks 0, 1, max on rank 2"), "{}", e);
        assert_eq!(v, [1.0]);
        Ok(out)
    });
    for r in results {
        assert_eq!(r[0], vec![3.0, -3.0, 1.5]);
        assert_eq!(r[1], vec![1.0, -1.0, 0.5]);
        assert_eq!(r[2], vec![2.0, 0.0, 0.5]);
        assert_eq!(r[3], vec![0.0, -2.0, 0.5]);
    }
}

#[test]
fn a_packed_unit_is_one_block_behind_one_slice() {
    let config = common::config(&common::rendezvous("packed"), 0, 1).alignment(1);
    let mut g = ShardGroup::new(&config).unwrap();
    g.add_param_group(&ParamGroup::new(Optimizer::Sgd).lr(0.5)).unwrap();
    g.add_param(&Param::new("a", &[2, 3])).unwrap();
    g.add_param(&Param::new("b", &[5])).unwrap();
    g.finalize().unwrap();
    assert_eq!(g.param_info(1).unwrap().offset_in_unit, 6);
    let block = g.unit_mut(0, false).unwrap();
    assert_eq!(block.len(), 11);
    block.iter_mut().for_each(|x| *x = 1.0);
    assert_eq!(g.param(1).unwrap(), &[1.0f32; 5][..]); // the same memory
    g.unit_mut(0, true).unwrap().iter_mut().for_each(|x| *x = 2.0);
    g.step(None).unwrap();
    assert_eq!(g.unit_mut(0, false).unwrap(), &[0.0f32; 11][..]);
    assert_eq!(g.unit_view(1, false).unwrap_err().status(), sx::status::SX_ERR_INVALID_ARGUMENT);
}

#[test]
fn a_units_params_and_grads_are_lent_together() {
    let config = common::config(&common::rendezvous("unit-tensors"), 0, 1).alignment(1);
    let mut g = ShardGroup::new(&config).unwrap();
    g.add_param_group(&ParamGroup::new(Optimizer::Sgd).lr(0.5f32)).unwrap();
    g.add_param(&Param::new_usize("a", &[2usize, 3])).unwrap();
    g.add_param(&Param::new("b", &[5])).unwrap();
    g.finalize().unwrap();
    for step in 1..=3u64 {
        let sx::UnitTensors { params, grads } = g.unit_tensors_mut(0).unwrap();
        assert_eq!((params.len(), grads.len()), (11, 11));
        // The step zeroed the gradients: the backward adds into zeros.
        assert!(grads.iter().all(|&x| x == 0.0), "step {}: {:?}", step, grads);
        for (k, (p, gr)) in params.iter().zip(grads.iter_mut()).enumerate() {
            *gr += *p + k as f32; // params and grads at once, from one borrow
        }
        assert_eq!(g.step(None).unwrap().step, step);
    }
    // p' = p - 0.5 * (p + k) = p / 2 - k / 2 from p = 0: -k/2, then -3k/4, then -7k/8.
    let t = g.unit_tensors_mut(0).unwrap();
    let want: Vec<f32> = (0..11).map(|k| -7.0 * k as f32 / 8.0).collect();
    assert_eq!(t.params, &want[..]);
    assert_eq!(g.unit_tensors_mut(1).unwrap_err().status(), sx::status::SX_ERR_INVALID_ARGUMENT);
}

#[test]
fn a_group_moves_to_another_thread_and_reports_its_errors_there() {
    let mut g = ShardGroup::new(&common::config(&common::rendezvous("send"), 0, 1)).unwrap();
    g.add_param_group(&ParamGroup::new(Optimizer::Sgd).lr(0.5)).unwrap();
    g.add_param(&Param::new("w", &[4])).unwrap();
    g.finalize().unwrap();
    let g = std::thread::spawn(move || {
        // The error's text is read on the thread that made the call (it is thread-local in C).
        let e = g.param(7).unwrap_err();
        assert_eq!(e.status(), sx::status::SX_ERR_INVALID_ARGUMENT);
        assert!(e.message().contains('7'), "{}", e);
        g
    })
    .join()
    .unwrap();
    // Shared between threads behind a Mutex.
    let shared = std::sync::Arc::new(std::sync::Mutex::new(g));
    let other = shared.clone();
    std::thread::spawn(move || {
        let mut g = other.lock().unwrap();
        g.grad_mut(0).unwrap().iter_mut().for_each(|x| *x = 1.0);
        g.step(None).unwrap();
    })
    .join()
    .unwrap();
    assert_eq!(shared.lock().unwrap().param(0).unwrap(), &[-0.5f32; 4][..]);
}

#[test]
fn nonfinite_gradients_skip_the_step_or_fail_it() {
    let mut g = ShardGroup::new(&common::config(&common::rendezvous("nonfinite"), 0, 1)).unwrap();
    g.add_param_group(&ParamGroup::new(Optimizer::Sgd).lr(0.5)).unwrap();
    g.add_param(&Param::new("w", &[4])).unwrap();
    g.finalize().unwrap();
    g.param_mut(0).unwrap().iter_mut().for_each(|x| *x = 1.0);
    // Clipping checks the norm: a NaN skips the step, and says so.
    g.grad_mut(0).unwrap().copy_from_slice(&[1.0, f32::NAN, 1.0, 1.0]);
    let r = g.step(Some(&StepOptions::new().max_grad_norm(1.0))).unwrap();
    assert!(r.skipped && r.nonfinite && r.step == 0, "{:?}", r);
    assert_eq!(g.param(0).unwrap(), &[1.0f32; 4][..]);
    // Error: skipped, then an error.
    g.grad_mut(0).unwrap().copy_from_slice(&[f32::INFINITY, 1.0, 1.0, 1.0]);
    let e = g.step(Some(&StepOptions::new().nonfinite(NonFinite::Error))).unwrap_err();
    assert_eq!(e.status(), SX_ERR_NONFINITE, "{}", e);
    assert_eq!(g.param(0).unwrap(), &[1.0f32; 4][..]);
    g.grad_mut(0).unwrap().iter_mut().for_each(|x| *x = 1.0);
    let r = g.step(Some(&StepOptions::new().nonfinite(NonFinite::Skip))).unwrap();
    assert!(!r.skipped && !r.nonfinite && r.step == 1, "{:?}", r);
    assert_eq!(g.param(0).unwrap(), &[0.5f32; 4][..]);
}

/// Three units trained for three steps on `world` ranks (shard groups of `shard_size`; 0:
/// flat); overlap: each unit's gradients are signalled ready in the backward and the
/// step's gather is deferred; at stage 3 every unit is gathered around its use. Returns
/// each rank's params and its peak param bytes.
fn pipeline_run(test: &str, world: i32, shard_size: i32, stage: i32, overlap: bool) -> Vec<(Vec<Vec<f32>>, u64)> {
    let name = common::rendezvous(test);
    let handles: Vec<_> = (0..world)
        .map(|rank| {
            let name = name.clone();
            std::thread::spawn(move || -> sx::Result<(Vec<Vec<f32>>, u64)> {
                let cfg = common::config(&name, rank, world).stage(stage).prefetch_depth(Some(1)).shard_size(shard_size);
                let mut g = ShardGroup::new(&cfg)?;
                g.add_param_group(&ParamGroup::new(Optimizer::AdamW).lr(0.01))?;
                for u in 0..3 {
                    g.add_param(&Param::new(&format!("p{}", u), &[40 + 13 * u as i64]).unit(u))?;
                }
                g.finalize()?;
                let s = if shard_size == 0 { world } else { shard_size };
                let info = g.unit_info(0)?;
                assert_eq!(
                    (info.shard_size, info.shard_rank, info.replicas, info.replica_rank),
                    (s, rank % s, world / s, rank / s)
                );
                for u in 0..3 {
                    g.gather_unit(u)?;
                    g.param_mut(u)?.iter_mut().enumerate().for_each(|(k, x)| *x = k as f32 * 0.01);
                    g.release_unit(u)?;
                }
                for s in 0..3 {
                    for u in (0..3).rev() {
                        g.gather_unit(u)?;
                        let grad = g.grad_mut(u)?;
                        grad.iter_mut().enumerate().for_each(|(k, x)| *x += ((k * 7 + s + rank as usize) % 11) as f32 / 8.0 - 0.625);
                        g.release_unit(u)?;
                        if overlap {
                            g.unit_grads_ready(u, Some(&UnitReadyOptions::new()))?;
                        }
                    }
                    g.step(Some(&StepOptions::new().defer_gather(overlap)))?;
                }
                let mut out = Vec::new();
                for u in 0..3 {
                    g.gather_unit(u)?;
                    out.push(g.param(u)?.to_vec());
                    g.release_unit(u)?;
                }
                Ok((out, g.memory_stats()?.peak_param_bytes))
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().expect("rank thread panicked").expect("rank failed")).collect()
}

#[test]
fn overlap_and_stage3_give_the_params_of_the_plain_step() {
    let plain = pipeline_run("pipe-plain", 2, 0, 2, false);
    for (stage, overlap) in [(2, true), (1, true), (3, false), (3, true)] {
        let got = pipeline_run(&format!("pipe-{}-{}", stage, overlap), 2, 0, stage, overlap);
        for r in 0..2 {
            assert_eq!(got[r].0, plain[r].0, "stage {} overlap {}: rank {} differs", stage, overlap, r);
        }
        if stage == 3 {
            // Shards of 3 units plus at most 2 gathered (one held, one prefetched).
            assert!(got[0].1 > 0 && got[0].1 < plain[0].1 * 2, "peak {}", got[0].1);
        }
    }
}

/// HSDP: 4 ranks as 2 shard groups of 2 (and as 4 of 1) train as the flat group of 4,
/// bit for bit; a shard size that does not divide the world size is refused.
#[test]
fn a_mesh_trains_as_the_flat_group() {
    let flat = pipeline_run("mesh-flat", 4, 0, 2, false);
    for (shard, stage, overlap) in [(2, 2, true), (2, 3, true), (1, 1, false)] {
        let got = pipeline_run(&format!("mesh-{}-{}", shard, stage), 4, shard, stage, overlap);
        for r in 0..4 {
            assert_eq!(got[r].0, flat[r].0, "shard size {} stage {}: rank {} differs", shard, stage, r);
        }
    }
    match ShardGroup::new(&common::config(&common::rendezvous("mesh-bad"), 0, 1).shard_size(2)) {
        Ok(_) => panic!("a shard size of 2 at world size 1 was accepted"),
        Err(e) => assert!(e.to_string().contains("shard_size 2 does not divide the world size 1"), "{}", e),
    }
}

/// How many sockets this process has open (Linux; 0 without /proc).
fn open_sockets() -> usize {
    let entries = match std::fs::read_dir("/proc/self/fd") {
        Ok(e) => e,
        Err(_) => return 0,
    };
    entries
        .filter_map(|e| e.ok())
        .filter(|e| std::fs::read_link(e.path()).map_or(false, |l| l.to_string_lossy().starts_with("socket:")))
        .count()
}

/// Two ranks train three AdamW steps with clipping over `transport`; returns each rank's
/// params, its last grad norm and the sockets the process held as its group had just
/// connected.
fn transport_run(test: &str, transport: Transport) -> Vec<(Vec<Vec<f32>>, f64, usize)> {
    let name = common::rendezvous(test);
    let handles: Vec<_> = (0..2)
        .map(|rank| {
            let name = name.clone();
            std::thread::spawn(move || -> sx::Result<(Vec<Vec<f32>>, f64, usize)> {
                let mut g = ShardGroup::new(&common::config(&name, rank, 2).transport(transport))?;
                let sockets = open_sockets(); // this rank's connections are open now
                g.add_param_group(&ParamGroup::new(Optimizer::AdamW).lr(0.01))?;
                g.add_param(&Param::new("w", &[7, 9]).unit(0))?;
                g.add_param(&Param::new("b", &[9]).unit(1))?;
                g.finalize()?;
                g.param_mut(0)?.iter_mut().enumerate().for_each(|(k, x)| *x = k as f32 * 0.01);
                let mut norm = 0.0;
                for s in 0..3 {
                    for p in 0..2 {
                        let grad = g.grad_mut(p)?;
                        grad.iter_mut().enumerate().for_each(|(k, x)| *x = ((k * 7 + s + rank as usize) % 11) as f32 / 8.0 - 0.625);
                    }
                    norm = g.step(Some(&StepOptions::new().max_grad_norm(1.0)))?.grad_norm;
                }
                Ok((vec![g.param(0)?.to_vec(), g.param(1)?.to_vec()], norm, sockets))
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().expect("rank thread panicked").expect("rank failed")).collect()
}

/// Transport::Tcp (Gloo's TCP between ranks that are threads of this process) trains as
/// Transport::Auto (shared memory here), bit for bit.
#[test]
fn tcp_transport_trains_as_auto() {
    let auto = transport_run("transport-auto", Transport::Auto);
    let tcp = transport_run("transport-tcp", Transport::Tcp);
    assert_eq!((&auto[0].0, auto[0].1), (&auto[1].0, auto[1].1), "the ranks differ");
    assert!(auto[0].0[0].iter().enumerate().any(|(k, &x)| x != k as f32 * 0.01), "nothing trained");
    for r in 0..2 {
        assert_eq!(tcp[r].0, auto[r].0, "rank {}: params differ", r);
        assert_eq!(tcp[r].1.to_bits(), auto[r].1.to_bits(), "rank {}: grad norms differ", r);
    }
    if std::path::Path::new("/proc/self/fd").is_dir() {
        // Tcp reached the library: each rank saw Gloo's connections open.
        assert!(tcp[0].2 > 0 && tcp[1].2 > 0, "no sockets open under Transport::Tcp: {:?}", (tcp[0].2, tcp[1].2));
    }
}

/// A transport value the library does not know (7, through the raw struct: the enum cannot
/// express it) fails sx_create_shard_group, naming the field.
#[test]
fn an_unknown_raw_transport_is_refused() {
    use sx::sys;
    let name = std::ffi::CString::new(common::rendezvous("transport-bad")).unwrap();
    let mut cfg: sys::sx_group_config_t = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<sys::sx_group_config_t>();
    assert_eq!(unsafe { sys::sx_group_config_init(&mut cfg, size) }, sys::SX_OK);
    assert_eq!(cfg.transport, sys::SX_TRANSPORT_AUTO);
    cfg.rendezvous = name.as_ptr();
    cfg.world_size = 1;
    cfg.backend = sys::SX_BACKEND_CPU;
    cfg.transport = 7;
    let mut g = std::ptr::null_mut();
    assert_eq!(unsafe { sys::sx_create_shard_group(&cfg, &mut g) }, sys::SX_ERR_INVALID_ARGUMENT);
    assert!(g.is_null());
    let message = unsafe { std::ffi::CStr::from_ptr(sys::sx_last_error_message()) }.to_string_lossy().into_owned();
    assert!(message.contains("transport"), "{}", message);
}

#[test]
fn ranks_write_their_traces() {
    let dir = common::TempDir::new("trace");
    let template = dir.join("t-%r.json");
    let name = common::rendezvous("trace");
    let handles: Vec<_> = (0..2)
        .map(|rank| {
            let (name, template) = (name.clone(), template.clone());
            std::thread::spawn(move || -> sx::Result<bool> {
                let mut g = ShardGroup::new(&common::config(&name, rank, 2).trace_path(&template).trace_events(1000))?;
                g.add_param_group(&ParamGroup::new(Optimizer::Sgd).lr(0.1))?;
                g.add_param(&Param::new("w", &[3, 5]).unit(4))?;
                g.finalize()?;
                g.step(None)?;
                g.flush_trace()?;
                let flushed = std::path::Path::new(&template.replace("%r", &rank.to_string())).exists();
                g.step(None)?;
                Ok(flushed)
            })
        })
        .collect();
    for h in handles {
        assert!(h.join().unwrap().unwrap(), "flush_trace wrote no file");
    }
    for rank in 0..2 {
        let text = std::fs::read_to_string(dir.join(&format!("t-{}.json", rank))).unwrap();
        assert!(text.starts_with('{') && text.trim_end().ends_with('}'), "{}", text);
        assert!(text.contains(&format!("\"rank\":{},", rank)), "{}", text);
        assert!(text.contains("\"capacity\":1000,"), "{}", text);
        assert_eq!(text.matches("\"name\":\"sx_step\"").count(), 2, "{}", text);
        // Each step's reduce-scatter, named by the unit's id, with its buffer's bytes
        // (15 floats padded to 2 x 16).
        assert_eq!(text.matches("\"name\":\"reduce_scatter\"").count(), 2, "{}", text);
        assert_eq!(text.matches("\"unit\":4,\"bytes\":128}").count(), 4, "{}", text);
    }
    let mut g = ShardGroup::new(&common::config(&common::rendezvous("trace-bad"), 0, 1).trace_path("/nonexistent-sx-dir/t.json"))
        .unwrap();
    g.add_param_group(&ParamGroup::new(Optimizer::Sgd)).unwrap();
    g.add_param(&Param::new("w", &[2])).unwrap();
    g.finalize().unwrap();
    let e = g.flush_trace().unwrap_err();
    assert_eq!(e.status(), sx::status::SX_ERR_IO);
    assert!(e.message().contains("/nonexistent-sx-dir/t.rank0.json"), "{}", e);
    match ShardGroup::new(&common::config(&common::rendezvous("trace-neg"), 0, 1).trace_events(-1)) {
        Ok(_) => panic!("trace_events -1 was accepted"),
        Err(e) => assert!(e.to_string().contains("trace_events"), "{}", e),
    }
}

#[test]
fn stage3_views_need_a_gather_and_signals_are_checked() {
    let mut g = ShardGroup::new(&common::config(&common::rendezvous("pipe-misuse"), 0, 1).stage(3)).unwrap();
    g.add_param_group(&ParamGroup::new(Optimizer::Sgd).lr(0.1)).unwrap();
    g.add_param(&Param::new("w", &[4]).unit(0)).unwrap();
    g.finalize().unwrap();
    let invalid_state = sx::status::SX_ERR_INVALID_STATE;
    assert_eq!(g.param(0).unwrap_err().status(), invalid_state);
    g.gather_unit(0).unwrap();
    assert_eq!(g.param(0).unwrap().len(), 4);
    g.release_unit(0).unwrap();
    assert_eq!(g.release_unit(0).unwrap_err().status(), invalid_state);
    g.unit_grads_ready(0, None).unwrap();
    assert_eq!(g.unit_grads_ready(0, None).unwrap_err().status(), invalid_state);
    g.step(None).unwrap();
}

#[test]
fn adagrad_and_rmsprop_groups_take_their_defaults() {
    use Hyperparameter as H;
    let mut g = ShardGroup::new(&common::config(&common::rendezvous("adagrad"), 0, 1)).unwrap();
    assert_eq!(g.add_param_group(&ParamGroup::new(Optimizer::Adagrad)).unwrap(), 0);
    assert_eq!(g.add_param_group(&ParamGroup::new(Optimizer::Rmsprop).centered(true).momentum(0.5)).unwrap(), 1);
    // RMSprop's alpha does not apply to Adagrad.
    let e = g.add_param_group(&ParamGroup::new(Optimizer::Adagrad).alpha(0.5)).unwrap_err();
    assert_eq!(e.status(), sx::status::SX_ERR_INVALID_ARGUMENT);
    g.add_param(&Param::new("w", &[4]).param_group(0)).unwrap();
    g.add_param(&Param::new("v", &[4]).param_group(1)).unwrap();
    g.finalize().unwrap();
    let hp = |i, keys: &[H]| keys.iter().map(|&k| g.hyperparameter(i, k).unwrap()).collect::<Vec<f64>>();
    assert_eq!(hp(0, &[H::Lr, H::Eps, H::LrDecay, H::InitialAccumulatorValue]), [1e-2, 1e-10, 0.0, 0.0]);
    assert_eq!(hp(1, &[H::Lr, H::Alpha, H::Eps, H::Centered, H::Momentum]), [1e-2, 0.99, 1e-8, 1.0, 0.5]);
}

/// Three ranks save, step on and abort; rank 2 leaves and ranks 0 and 1 regroup into two
/// from the checkpoint: the result names the new places and the checkpoint's step, and
/// the params are the checkpoint's, as two fresh ranks loading it have them.
#[test]
fn two_survivors_of_three_regroup_from_a_checkpoint() {
    let dir = common::TempDir::new("regroup");
    let path = dir.join("step-2");
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(3));
    let p = path.clone();
    let results = common::run_ranks("regroup3", 3, move |rank, mut g| {
        setup(&mut g, 0.05)?;
        for _ in 0..2 {
            let mut t = g.tensors_mut()?;
            grads(rank, t.params[0], t.grads[0]);
            g.step(None)?;
        }
        g.save(SaveOptions::new(&p).synchronous(true))?.wait()?;
        let mut t = g.tensors_mut()?;
        grads(rank, t.params[0], t.grads[0]);
        g.step(None)?; // a step the regroup takes back
        g.abort()?;
        barrier.wait();
        if rank == 2 {
            return Ok(None); // lost
        }
        // Threads of one process: no process is known to have exited.
        assert_eq!(g.lost_ranks()?, Vec::<i32>::new());
        let r = g.regroup(&LoadOptions::new(&p), 0, 2)?;
        Ok(Some((r, g.world_size()?, g.param(0)?.to_vec())))
    });
    let p = path.clone();
    let fresh = common::run_ranks("regroupref", 2, move |_rank, mut g| {
        setup(&mut g, 0.05)?;
        g.load(&LoadOptions::new(&p))?;
        Ok(g.param(0)?.to_vec())
    });
    for rank in 0..2 {
        let (r, world, w) = results[rank].clone().expect("a survivor returned nothing");
        assert_eq!(
            r,
            sx::RegroupResult {
                epoch: 1,
                rank: rank as i32,
                world_size: 2,
                shard_size: 2,
                previous_rank: rank as i32,
                previous_world_size: 3,
                step: 2,
                from_memory: false
            }
        );
        assert_eq!(world, 2);
        assert_eq!(w, fresh[rank], "a survivor's params differ from the checkpoint's");
    }
    assert!(results[2].is_none());
}

/// The same with memory copies kept every step and no checkpoint for the regroup: the
/// two survivors' state comes from their copies (and rank 2's shard from rank 0, its
/// successor), as two fresh ranks loading a checkpoint of that step have it.
#[test]
fn two_survivors_of_three_regroup_from_memory_copies() {
    let dir = common::TempDir::new("regroup-memory");
    let path = dir.join("step-2");
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(3));
    let name = common::rendezvous("regroupmem");
    let handles: Vec<_> = (0..3)
        .map(|rank| {
            let (barrier, name, p) = (barrier.clone(), name.clone(), path.clone());
            std::thread::spawn(move || -> sx::Result<Option<(sx::RegroupResult, Vec<f32>)>> {
                let mut g = ShardGroup::new(&common::config(&name, rank, 3).memory_copy_interval(1))?;
                setup(&mut g, 0.05)?;
                for _ in 0..2 {
                    let mut t = g.tensors_mut()?;
                    grads(rank, t.params[0], t.grads[0]);
                    g.step(None)?;
                }
                g.save(SaveOptions::new(&p).synchronous(true))?.wait()?; // the reference's
                assert!(g.memory_stats()?.memory_copy_bytes > 0);
                g.abort()?;
                barrier.wait();
                if rank == 2 {
                    return Ok(None);
                }
                let r = g.regroup(&LoadOptions::new(""), 0, 2)?;
                Ok(Some((r, g.param(0)?.to_vec())))
            })
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().expect("rank panicked").expect("rank failed")).collect();
    let p = path.clone();
    let fresh = common::run_ranks("regroupmemref", 2, move |_rank, mut g| {
        setup(&mut g, 0.05)?;
        g.load(&LoadOptions::new(&p))?;
        Ok(g.param(0)?.to_vec())
    });
    for rank in 0..2 {
        let (r, w) = results[rank].clone().expect("a survivor returned nothing");
        assert!(r.from_memory && r.step == 2 && r.world_size == 2 && r.rank == rank as i32, "{:?}", r);
        assert_eq!(w, fresh[rank], "a survivor's params differ from the checkpoint of the same step");
    }
    assert!(results[2].is_none());
}

/// A 4th process (a thread with GroupConfig::join) joins 3 ranks: they poll until they see
/// it and admit it; the 4 then hold the 3 ranks' state, as 4 fresh ranks loading a
/// checkpoint of that step have it.
#[test]
fn a_process_joins_three_ranks() {
    let dir = common::TempDir::new("join");
    let path = dir.join("step-2");
    let name = common::rendezvous("join");
    let handles: Vec<_> = (0..4)
        .map(|rank| {
            let (name, p) = (name.clone(), path.clone());
            std::thread::spawn(move || -> sx::Result<(sx::RegroupResult, Vec<f32>)> {
                if rank == 3 {
                    let mut g = ShardGroup::new(&common::config(&name, 0, 1).join(true))?;
                    setup(&mut g, 0.05)?;
                    let r = g.regroup(&LoadOptions::new(""), 0, 0)?;
                    return Ok((r, g.param(0)?.to_vec()));
                }
                let mut g = ShardGroup::new(&common::config(&name, rank, 3))?;
                setup(&mut g, 0.05)?;
                for _ in 0..2 {
                    let mut t = g.tensors_mut()?;
                    grads(rank, t.params[0], t.grads[0]);
                    g.step(None)?;
                }
                let mut waiting = 0;
                for _ in 0..3000 {
                    waiting = g.poll_joiners()?;
                    if waiting > 0 {
                        break;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                g.save(SaveOptions::new(&p).synchronous(true))?.wait()?; // the reference's
                let r = g.regroup_admitting(&LoadOptions::new(""), 0, 0, waiting)?;
                Ok((r, g.param(0)?.to_vec()))
            })
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().expect("rank panicked").expect("rank failed")).collect();
    let p = path.clone();
    let fresh = common::run_ranks("joinref", 4, move |_rank, mut g| {
        setup(&mut g, 0.05)?;
        g.load(&LoadOptions::new(&p))?;
        Ok(g.param(0)?.to_vec())
    });
    for rank in 0..4 {
        let (r, w) = &results[rank];
        assert!(r.world_size == 4 && r.rank == rank as i32 && r.step == 2 && r.from_memory, "{:?}", r);
        assert_eq!(r.previous_rank, if rank == 3 { -1 } else { rank as i32 });
        assert_eq!(w, &fresh[rank], "rank {}'s params differ from the checkpoint of the step it joined at", rank);
    }
}
