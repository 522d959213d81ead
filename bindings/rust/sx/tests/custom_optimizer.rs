//! Custom optimizers written in Rust: Lion against the built-in Lion bit for bit (world 1
//! and 2, and registered in place at world 2), an optimizer's own hyperparameters and slot initial values, failing and
//! panicking updates (and their messages in the step's error), and bad descriptions. Registration is per process and the tests of
//! this binary run concurrently in it: each optimizer is registered once, behind a lock.
mod common;

use std::sync::Mutex;

use sx::status::{SX_ERR_ALREADY_EXISTS, SX_ERR_INVALID_ARGUMENT, SX_ERR_OPTIMIZER};
use sx::{register_optimizer, Hyperparameter, Optimizer, OptimizerDesc, Param, ParamGroup, Piece, StepOptions};

/// Lion as sx's built-in computes it (f32, one rounding per operation).
fn lion(p: &mut Piece) -> Result<(), i32> {
    let hp = p.hyperparameters;
    let (lr, beta1, beta2, wd) = (hp[0], hp[1], hp[2], hp[3]);
    let decay = (1.0 - lr * wd) as f32;
    let (b1, omb1) = (beta1 as f32, (1.0 - beta1) as f32);
    let (b2, omb2) = (beta2 as f32, (1.0 - beta2) as f32);
    let neg_lr = (-lr) as f32;
    let scale = p.grad_scale;
    let m = &mut *p.state[0];
    for ((x, &gr), mi) in p.param.iter_mut().zip(p.grad).zip(m.iter_mut()) {
        let g = gr * scale;
        let decayed = *x * decay;
        let c = *mi * b1 + omb1 * g;
        let u = if c > 0.0 {
            1.0
        } else if c < 0.0 {
            -1.0
        } else {
            0.0
        };
        *x = decayed + neg_lr * u;
        *mi = *mi * b2 + omb2 * g;
    }
    Ok(())
}

fn lion_desc(name: &str) -> OptimizerDesc {
    OptimizerDesc::new(name, lion)
        .slot("exp_avg")
        .hyperparameter("lr", 1e-4)
        .hyperparameter("beta1", 0.9)
        .hyperparameter("beta2", 0.99)
        .hyperparameter("weight_decay", 0.0)
}

fn lion_optimizer() -> Optimizer {
    static LION: Mutex<Option<Optimizer>> = Mutex::new(None);
    let mut slot = LION.lock().unwrap_or_else(|p| p.into_inner());
    *slot.get_or_insert_with(|| register_optimizer(lion_desc("rust_test_lion")).expect("registering Lion"))
}

/// The same Lion, updating in place (SX_OPTIMIZER_IN_PLACE): no double buffers.
fn lion_in_place_optimizer() -> Optimizer {
    static LION: Mutex<Option<Optimizer>> = Mutex::new(None);
    let mut slot = LION.lock().unwrap_or_else(|p| p.into_inner());
    *slot.get_or_insert_with(|| {
        register_optimizer(lion_desc("rust_test_lion_in_place").in_place(true)).expect("registering Lion in place")
    })
}

/// SGD scaled by an own hyperparameter ("scale", SX_HP_CUSTOM + 0), a slot that starts at
/// 1.5 and counts updates, and an own "mode" (SX_HP_CUSTOM + 1): 1 fails with 7, 2 panics.
fn probe(p: &mut Piece) -> Result<(), i32> {
    let (lr, scale, mode) = (p.hyperparameters[0] as f32, p.hyperparameters[1] as f32, p.hyperparameters[2]);
    for i in 0..p.param.len() {
        p.param[i] -= lr * scale * (p.grad[i] * p.grad_scale);
        p.state[0][i] += 1.0;
    }
    if mode == 1.0 {
        return Err(7);
    }
    if mode == 2.0 {
        panic!("the probe was told to panic (this panic is expected by the test)");
    }
    Ok(())
}

fn probe_optimizer() -> Optimizer {
    static PROBE: Mutex<Option<Optimizer>> = Mutex::new(None);
    let mut slot = PROBE.lock().unwrap_or_else(|p| p.into_inner());
    *slot.get_or_insert_with(|| {
        register_optimizer(
            OptimizerDesc::new("rust_test_probe", probe)
                .slot_with_initial_value("count", 1.5)
                .hyperparameter("lr", 0.1)
                .hyperparameter_in("scale", 2.0, 0.0, 10.0)
                .hyperparameter("mode", 0.0),
        )
        .expect("registering the probe")
    })
}

const SHAPES: [[i64; 2]; 2] = [[37, 53], [1, 7]];
const STEPS: usize = 20;

fn grad_at(step: usize, k: usize, rank: i32) -> f32 {
    ((k as f64 * 0.37 + step as f64 * 1.3 + rank as f64 * 0.5).sin() * (1 + step % 3) as f64) as f32
}

/// Every param twice in one group, under the built-in Lion and under the Rust one
/// (`custom`, registered in place or not), with the same values and gradients; after the
/// steps both copies hold the same bits. An in-place optimizer's unit holds one exp_avg
/// buffer, as the built-in's does; a double-buffered one holds more.
fn lion_matches_builtin(world: i32, custom: Optimizer, in_place: bool) {
    assert!(custom.id() >= sx::sys::SX_OPTIM_CUSTOM_FIRST);
    let test = format!("custom-lion-{}{}", world, if in_place { "-in-place" } else { "" });
    common::run_ranks(&test, world, move |rank, mut g| {
        let builtin =
            g.add_param_group(&ParamGroup::new(Optimizer::Lion).lr(3e-3).betas(0.8, 0.95).weight_decay(0.1))?;
        let mine = g.add_param_group(&ParamGroup::new(custom).lr(3e-3).betas(0.8, 0.95).weight_decay(0.1))?;
        let mut pairs = Vec::new();
        for (k, shape) in SHAPES.iter().enumerate() {
            let a = g.add_param(&Param::new(&format!("p{}.builtin", k), shape).param_group(builtin).unit(0))?;
            let b = g.add_param(&Param::new(&format!("p{}.custom", k), shape).param_group(mine).unit(1))?;
            pairs.push((a, b));
        }
        g.finalize()?;
        for &(a, b) in &pairs {
            for &i in &[a, b] {
                g.param_mut(i)?.iter_mut().enumerate().for_each(|(k, x)| *x = (k as f32).cos());
            }
        }
        for s in 0..STEPS {
            if s == 10 {
                g.set_lr(builtin, 1e-3)?;
                g.set_lr(mine, 1e-3)?;
            }
            for &(a, b) in &pairs {
                for &i in &[a, b] {
                    g.grad_mut(i)?.iter_mut().enumerate().for_each(|(k, x)| *x = grad_at(s, k, rank));
                }
            }
            g.step(Some(&StepOptions::new().max_grad_norm(5.0)))?;
        }
        for &(a, b) in &pairs {
            let (x, y) = (g.param(a)?, g.param(b)?);
            assert!(x.iter().enumerate().any(|(k, v)| *v != (k as f32).cos()), "the built-in Lion changed nothing");
            let differ = x.iter().zip(y).filter(|(u, v)| u.to_bits() != v.to_bits()).count();
            assert_eq!(differ, 0, "rank {}: {} of {} values differ from the built-in Lion", rank, differ, x.len());
        }
        // The slot is the built-in's exp_avg, in this rank's shard.
        for &(a, b) in &pairs {
            let (ia, ib) = (g.param_info(a)?, g.param_info(b)?);
            if ia.shard == ib.shard && !ib.shard.is_empty() {
                assert_eq!(g.state(a, "exp_avg")?, g.state(b, "exp_avg")?);
            }
        }
        // The state bytes: fp32 params (no masters), one exp_avg per unit when in place.
        let one_slot: u64 = (0..2).map(|u| g.unit_info(u).map(|i| i.shard_numel * 4)).sum::<sx::Result<u64>>()?;
        let held = g.memory_stats()?.optimizer_bytes;
        if in_place {
            assert_eq!(held, one_slot, "rank {}: an in-place optimizer holds no second buffers", rank);
        } else {
            assert!(held > one_slot, "rank {}: {} bytes, no double buffers", rank, held);
        }
        Ok(())
    });
}

#[test]
fn lion_matches_the_builtin_on_one_rank() {
    lion_matches_builtin(1, lion_optimizer(), false);
}

#[test]
fn lion_matches_the_builtin_on_two_ranks() {
    lion_matches_builtin(2, lion_optimizer(), false);
}

#[test]
fn lion_in_place_matches_the_builtin_on_two_ranks() {
    let in_place = lion_in_place_optimizer();
    assert_ne!(in_place, lion_optimizer());
    lion_matches_builtin(2, in_place, true);
}

#[test]
fn own_hyperparameters_slot_initial_values_and_failures() {
    let probe = probe_optimizer();
    common::run_ranks("custom-probe", 2, move |_rank, mut g| {
        let pg = g.add_param_group(&ParamGroup::new(probe))?;
        assert_eq!(g.hyperparameter(pg, Hyperparameter::Lr)?, 0.1);
        assert_eq!(g.hyperparameter(pg, Hyperparameter::Custom(0))?, 2.0);
        g.set_hyperparameter(pg, Hyperparameter::Custom(0), 3.0)?;
        let e = g.set_hyperparameter(pg, Hyperparameter::Custom(0), 11.0).unwrap_err();
        assert_eq!(e.status(), SX_ERR_INVALID_ARGUMENT, "{}", e);
        let w = g.add_param(&Param::new("w", &[37, 53]).param_group(pg))?;
        g.finalize()?;
        g.grad_mut(w)?.iter_mut().for_each(|x| *x = 1.0);
        g.step(None)?;
        let after: Vec<f32> = g.param(w)?.to_vec();
        assert!(after.iter().all(|&x| (x + 0.3).abs() < 1e-6), "{:?}", &after[..4]);
        let info = g.param_info(w)?;
        let counts = g.state(w, "count")?.to_vec();
        assert_eq!(counts.len() as u64, info.shard.end - info.shard.start);
        assert!(counts.iter().all(|&c| c == 2.5), "{:?}", &counts[..counts.len().min(4)]);
        // A failing update fails the step on every rank and changes nothing; so does a panic.
        // (The codes, 7 and UPDATE_PANICKED, are in sx's message.)
        for mode in [1.0, 2.0] {
            g.set_hyperparameter(pg, Hyperparameter::Custom(1), mode)?;
            g.grad_mut(w)?.iter_mut().for_each(|x| *x = 1.0);
            let e = g.step(None).unwrap_err();
            assert_eq!(e.status(), SX_ERR_OPTIMIZER, "{}", e);
            assert!(e.message().contains("rust_test_probe"), "{}", e);
            assert_eq!(g.param(w)?, &after[..]);
            assert!(g.state(w, "count")?.iter().all(|&c| c == 2.5));
        }
        Ok(())
    });
}

/// Fails as its "mode" says: 1 returns Err(9), 2 panics with a `&str`, 3 panics with a
/// `String` longer than sx's error buffer (2-byte UTF-8 characters); 0 does nothing.
fn message_update(p: &mut Piece) -> Result<(), i32> {
    match p.hyperparameters[0] as i32 {
        1 => Err(9),
        2 => panic!("the message test's update panicked on purpose (this panic is expected by the test)"),
        3 => panic!("{}", "\u{e9}".repeat(300)),
        _ => Ok(()),
    }
}

fn message_optimizer() -> Optimizer {
    static MESSAGE: Mutex<Option<Optimizer>> = Mutex::new(None);
    let mut slot = MESSAGE.lock().unwrap_or_else(|p| p.into_inner());
    *slot.get_or_insert_with(|| {
        register_optimizer(OptimizerDesc::new("rust_test_error_message", message_update).hyperparameter("mode", 0.0))
            .expect("registering the message test's optimizer")
    })
}

#[test]
fn a_failing_updates_message_reaches_the_step_error() {
    let opt = message_optimizer();
    // The buffer holds SX_OPTIMIZER_ERROR_BYTES with its NUL: an odd number of bytes for
    // the 2-byte characters, so the cut falls inside one and whole ones are kept.
    let kept = (sx::sys::SX_OPTIMIZER_ERROR_BYTES - 1) / 2;
    let long = format!(": {}: the step", "\u{e9}".repeat(kept));
    for world in [1, 2] {
        let long = long.clone();
        common::run_ranks(&format!("custom-message-{}", world), world, move |_rank, mut g| {
            let pg = g.add_param_group(&ParamGroup::new(opt))?;
            let w = g.add_param(&Param::new("w", &[4, 8]).param_group(pg))?;
            g.finalize()?;
            g.step(None)?; // mode 0 succeeds
            // sx's message: "... updating param 'w' on rank R: <the update's words>: the step ...".
            for (mode, text) in
                [(1.0, ": update returned error 9: "), (2.0, ": the message test's update panicked on purpose"), (3.0, &long[..])]
            {
                g.set_hyperparameter(pg, Hyperparameter::Custom(0), mode)?;
                g.grad_mut(w)?.iter_mut().for_each(|x| *x = 1.0);
                let e = g.step(None).unwrap_err();
                assert_eq!(e.status(), SX_ERR_OPTIMIZER, "{}", e);
                assert!(e.message().contains("rust_test_error_message"), "{}", e);
                assert!(e.message().contains(text), "mode {}: {}", mode, e);
                assert!(!e.message().contains('\u{fffd}'), "{}", e);
            }
            Ok(())
        });
    }
}

#[test]
fn bad_descriptions_are_refused() {
    let e = register_optimizer(OptimizerDesc::new("rust_bad_slots", lion).slot("m").slot("m")).unwrap_err();
    assert_eq!(e.status(), SX_ERR_INVALID_ARGUMENT, "{}", e);
    assert!(e.message().contains("m"), "{}", e);
    let e = register_optimizer(OptimizerDesc::new("rust_bad_many", lion).slot("a").slot("b").slot("c").slot("d"))
        .unwrap_err();
    assert_eq!(e.status(), SX_ERR_INVALID_ARGUMENT, "{}", e);
    let e = register_optimizer(OptimizerDesc::new("bad name!", lion)).unwrap_err();
    assert_eq!(e.status(), SX_ERR_INVALID_ARGUMENT, "{}", e);
    let e = register_optimizer(OptimizerDesc::new("", lion)).unwrap_err();
    assert_eq!(e.status(), SX_ERR_INVALID_ARGUMENT, "{}", e);
    let e = register_optimizer(OptimizerDesc::new("rust_bad_range", lion).hyperparameter_in("k", 5.0, 0.0, 1.0))
        .unwrap_err();
    assert_eq!(e.status(), SX_ERR_INVALID_ARGUMENT, "{}", e);
    let e = register_optimizer(OptimizerDesc::new("rust_bad\0nul", lion)).unwrap_err();
    assert_eq!(e.status(), SX_ERR_INVALID_ARGUMENT, "{}", e);
    // A taken name: a new closure is another description.
    lion_optimizer();
    let e = register_optimizer(OptimizerDesc::new("rust_test_lion", lion).slot("exp_avg")).unwrap_err();
    assert_eq!(e.status(), SX_ERR_ALREADY_EXISTS, "{}", e);
}
