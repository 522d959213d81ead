//! Whole optimizer state through the binding (gathered onto one rank, scattered into
//! another world size, this rank's part in place), a closure's error and panic, weighted
//! steps for uneven inputs, and params added after finalize.
mod common;

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use sx::status::*;
use sx::{Error, Optimizer, Param, ParamGroup, ParamState, ShardGroup, StateDtype, StepOptions};

const NAMES: [&str; 4] = ["w", "b", "s", "n"];

/// AdamW with amsgrad (w and the scalar s), SGD with momentum (b) and NAdam (n), in two
/// units.
fn setup(g: &mut ShardGroup) -> sx::Result<()> {
    g.add_param_group(&ParamGroup::new(Optimizer::AdamW).lr(0.01).amsgrad(true))?;
    g.add_param_group(&ParamGroup::new(Optimizer::Sgd).lr(0.1).momentum(0.9))?;
    g.add_param_group(&ParamGroup::new(Optimizer::Nadam).lr(0.01))?;
    g.add_param(&Param::new("w", &[7, 11]).param_group(0).unit(0))?;
    g.add_param(&Param::new("b", &[13]).param_group(1).unit(1))?;
    g.add_param(&Param::new("s", &[]).param_group(0).unit(1))?;
    g.add_param(&Param::new("n", &[5]).param_group(2).unit(1))?;
    g.finalize()
}

/// `steps` steps with gradients that differ per rank (`seed`), step and param.
fn train(g: &mut ShardGroup, steps: i32, seed: i32) -> sx::Result<()> {
    for s in 0..steps {
        let t = g.tensors_mut()?;
        for (i, grad) in t.grads.into_iter().enumerate() {
            for (k, x) in grad.iter_mut().enumerate() {
                *x = ((k as i32 * 7 + s * 3 + seed + i as i32) % 11 - 5) as f32 / 8.0;
            }
        }
        g.step(Some(&StepOptions::new().max_grad_norm(2.0)))?;
    }
    Ok(())
}

fn by_name(states: &[ParamState]) -> HashMap<String, ParamState> {
    states.iter().map(|s| (s.name.clone(), s.clone())).collect()
}

#[test]
fn gather_and_scatter_round_trip_from_three_ranks_to_two() {
    let saved = common::run_ranks("whole-save3", 3, |rank, mut g| {
        setup(&mut g)?;
        train(&mut g, 3, rank)?;
        let states = g.gather_optim_state(0)?;
        let values: Vec<Vec<f32>> =
            (0..NAMES.len() as i32).map(|i| g.param(i).map(|p| p.to_vec())).collect::<sx::Result<_>>()?;
        Ok((states, values))
    });
    assert!(saved[1].0.is_none() && saved[2].0.is_none(), "a rank other than the root got states");
    let mut states = saved[0].0.clone().expect("the root got no states");
    let names: Vec<&str> = states.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, NAMES);
    assert_eq!(states.iter().map(|s| s.param).collect::<Vec<_>>(), vec![0, 1, 2, 3]);
    let keys = |s: &ParamState| s.tensors.keys().cloned().collect::<Vec<_>>();
    assert_eq!(keys(&states[0]), vec!["exp_avg", "exp_avg_sq", "max_exp_avg_sq"]);
    assert_eq!(keys(&states[1]), vec!["momentum_buffer"]);
    assert_eq!(keys(&states[3]), vec!["exp_avg", "exp_avg_sq"]);
    assert_eq!((states[0].step, states[1].momentum_steps, states[1].param_group), (3, 3, 1));
    // NAdam's mu_product after 3 steps: a product of coefficients below 1; 0 elsewhere.
    assert!(states[3].mu_product > 0.0 && states[3].mu_product < 1.0, "{}", states[3].mu_product);
    assert!(states[..3].iter().all(|s| s.mu_product == 0.0), "{:?}", states);
    assert_eq!(states[0].tensors["exp_avg"].len(), 77);
    assert_eq!(states[2].tensors["exp_avg"].len(), 1);
    assert!(states[0].tensors["exp_avg"].iter().any(|&x| x != 0.0));

    // A mu_product other than the one sx would derive from the step, so that the scatter
    // shows it was carried (a float32 value, which comes back exactly).
    states[3].mu_product = 0.5;
    let (states, values) = (Arc::new(states), Arc::new(saved[0].1.clone()));
    let given = states.clone();
    let back = common::run_ranks("whole-load2", 2, move |rank, mut g| {
        setup(&mut g)?;
        for (i, v) in values.iter().enumerate() {
            g.param_mut(i as i32)?.copy_from_slice(v);
        }
        let map = by_name(&given);
        g.scatter_optim_state(1, if rank == 1 { Some(&map) } else { None })?;
        // This rank's part, in place, is the slice of the whole that its shard covers.
        let shard = g.param_info(0)?.shard;
        let part = g.state(0, "exp_avg")?;
        assert_eq!(part, &given[0].tensors["exp_avg"][shard.start as usize..shard.end as usize]);
        let b = g.param_info(1)?.shard;
        assert_eq!(g.state(1, "momentum_buffer")?, &given[1].tensors["momentum_buffer"][b.start as usize..b.end as usize]);
        let back = g.gather_optim_state(0)?;
        train(&mut g, 1, rank)?; // the scattered state steps on
        Ok(back)
    });
    assert!(back[1].is_none());
    assert_eq!(back[0].as_ref().unwrap(), &*states, "the state came back changed");
}

#[test]
fn a_closure_sees_each_param_and_its_error_or_panic_changes_nothing() {
    common::run_ranks("whole-callback", 2, |rank, mut g| {
        setup(&mut g)?;
        train(&mut g, 2, rank)?;
        let mut seen = Vec::new();
        g.gather_optim_state_with(1, |st| {
            let names: Vec<&str> = st.tensors().iter().map(|(n, _)| *n).collect();
            assert!(st.tensors().iter().all(|(_, t)| t.len() == st.numel));
            seen.push((st.name.to_string(), st.param_group, names.join(",")));
            Ok(())
        })?;
        if rank == 1 {
            let want = [("w", 0, "exp_avg,exp_avg_sq,max_exp_avg_sq"), ("b", 1, "momentum_buffer"),
                        ("s", 0, "exp_avg,exp_avg_sq,max_exp_avg_sq"), ("n", 2, "exp_avg,exp_avg_sq")];
            let want: Vec<_> = want.iter().map(|(n, p, t)| (n.to_string(), *p, t.to_string())).collect();
            assert_eq!(seen, want);
        } else {
            assert!(seen.is_empty(), "the closure ran on a rank that is not the root");
        }
        let before = g.gather_optim_state(0)?;

        // An error of the root's closure: the root gets it back, the other rank its
        // status; no state changed.
        let r = g.scatter_optim_state_with(0, |st| {
            if st.name == "b" {
                return Err(Error::new(SX_ERR_NOT_FOUND, "no state for b here"));
            }
            for (_, t) in st.tensors_mut() {
                t.iter_mut().for_each(|x| *x = 1.0);
            }
            st.step = 99;
            Ok(())
        });
        let e = r.expect_err("a failed scatter succeeded");
        assert_eq!(e.status(), SX_ERR_NOT_FOUND, "rank {}: {}", rank, e);
        if rank == 0 {
            assert_eq!(e.message(), "no state for b here");
        } else {
            assert!(e.message().contains("rank 0") && e.message().contains("'b'"), "{}", e);
        }
        assert_eq!(g.gather_optim_state(0)?, before, "a failed scatter changed the state");

        // A panic: resumed on the root once sx has returned, SX_ERR_CANCELLED elsewhere.
        if rank == 0 {
            let caught = catch_unwind(AssertUnwindSafe(|| {
                g.scatter_optim_state_with(0, |st| if st.param == 1 { panic!("boom in the closure") } else { Ok(()) })
            }));
            let payload = caught.expect_err("the closure's panic was not resumed");
            assert_eq!(payload.downcast_ref::<&str>(), Some(&"boom in the closure"));
        } else {
            let e = g.scatter_optim_state_with(0, |_| Ok(())).expect_err("a scatter whose closure panicked succeeded");
            assert_eq!(e.status(), SX_ERR_CANCELLED, "{}", e);
        }
        assert_eq!(g.gather_optim_state(0)?, before, "a scatter whose closure panicked changed the state");
        // The group goes on.
        train(&mut g, 1, rank)
    });
}

#[test]
fn a_scatter_map_must_fit_and_a_missing_param_is_zero_state() {
    common::run_ranks("whole-map", 2, |rank, mut g| {
        setup(&mut g)?;
        train(&mut g, 1, rank)?;
        let all = g.gather_optim_state(0)?;
        let mut map = if rank == 0 { by_name(&all.unwrap()) } else { HashMap::new() };
        if rank == 0 {
            map.get_mut("w").unwrap().tensors.get_mut("exp_avg").unwrap().pop();
        }
        let e = g.scatter_optim_state(0, if rank == 0 { Some(&map) } else { None }).unwrap_err();
        assert_eq!(e.status(), SX_ERR_INVALID_ARGUMENT, "{}", e);
        if rank == 0 {
            assert!(e.message().contains("'exp_avg' has 76 values; sx keeps 77"), "{}", e);
            map.remove("w");
        }
        // No states on the root: every rank is told, none waits for the others in vain.
        let e = g.scatter_optim_state(0, None).unwrap_err();
        assert_eq!(e.status(), SX_ERR_INVALID_ARGUMENT, "{}", e);
        assert!(rank != 0 || e.message().contains("no states were given on the root"), "{}", e);
        g.scatter_optim_state(0, if rank == 0 { Some(&map) } else { None })?;
        let back = g.gather_optim_state(0)?;
        if let Some(back) = back {
            assert_eq!(back[0].step, 0);
            assert!(back[0].tensors.values().all(|t| t.iter().all(|&x| x == 0.0)), "w's state is not zero");
            assert_eq!(back[1], map["b"]);
        }
        Ok(())
    });
}

/// Adafactor: factored moments for [6, 5] and [2, 3, 4] (rows split between ranks), a
/// variance per element for [7].
fn setup_adafactor(g: &mut ShardGroup) -> sx::Result<()> {
    g.add_param_group(&ParamGroup::new(Optimizer::Adafactor).lr(0.01))?;
    g.add_param(&Param::new("m", &[6, 5]).unit(0))?;
    g.add_param(&Param::new("t", &[2, 3, 4]).unit(0))?;
    g.add_param(&Param::new("v", &[7]).unit(1))?;
    g.finalize()
}

#[test]
fn adafactor_factored_moments_have_their_own_lengths() {
    let saved = common::run_ranks("whole-adafactor3", 3, |rank, mut g| {
        setup_adafactor(&mut g)?;
        train(&mut g, 3, rank)?;
        let mut seen = Vec::new();
        g.gather_optim_state_with(0, |st| {
            seen.extend(st.tensors().iter().map(|(n, t)| (st.name.to_string(), n.to_string(), t.len())));
            Ok(())
        })?;
        Ok((seen, g.gather_optim_state(0)?))
    });
    // torch's row_var [..., R, 1] and col_var [..., 1, C], flat.
    let want = [("m", "row_var", 6), ("m", "col_var", 5), ("t", "row_var", 6), ("t", "col_var", 8), ("v", "variance", 7)];
    let want: Vec<_> = want.iter().map(|(p, n, l)| (p.to_string(), n.to_string(), *l)).collect();
    assert_eq!(saved[0].0, want);
    let states = Arc::new(saved[0].1.clone().expect("the root got no states"));
    assert!(states.iter().all(|s| s.step == 3 && s.tensors.values().all(|t| t.iter().any(|&x| x > 0.0))), "{:?}", states);

    // Scattered into 2 ranks, whole on each: it comes back the same, and a row_var of
    // the param's numel is refused.
    let given = states.clone();
    let back = common::run_ranks("whole-adafactor2", 2, move |rank, mut g| {
        setup_adafactor(&mut g)?;
        let (map, mut wrong) = (by_name(&given), by_name(&given));
        wrong.get_mut("m").unwrap().tensors.insert("row_var".to_string(), vec![1.0; 30]);
        let e = g.scatter_optim_state(1, if rank == 1 { Some(&wrong) } else { None }).unwrap_err();
        assert_eq!(e.status(), SX_ERR_INVALID_ARGUMENT, "{}", e);
        assert!(rank != 1 || e.message().contains("'row_var' has 30 values; sx keeps 6"), "{}", e);
        g.scatter_optim_state(1, if rank == 1 { Some(&map) } else { None })?;
        let back = g.gather_optim_state(0)?;
        train(&mut g, 1, rank)?;
        Ok(back)
    });
    assert_eq!(back[0].as_ref().unwrap(), &*states, "the state came back changed");
}

#[test]
fn state_views_are_this_ranks_part_and_seed_the_state() {
    common::run_ranks("whole-views", 2, |rank, mut g| {
        setup(&mut g)?;
        let (w, b) = (g.find_param("w")?, g.find_param("b")?);
        // A trainable param's unit has its state from finalize on: zero until a step.
        assert!(g.state(b, "momentum_buffer")?.iter().all(|&x| x == 0.0));
        train(&mut g, 1, rank)?;
        let e = g.state(b, "exp_avg").unwrap_err();
        assert_eq!(e.status(), SX_ERR_INVALID_ARGUMENT);
        assert!(e.message().contains("momentum_buffer"), "{}", e);
        // Seeds written through each rank's part show in the whole.
        g.state_mut(w, "exp_avg")?.iter_mut().for_each(|x| *x = rank as f32 + 1.0);
        let shard = g.param_info(w)?.shard;
        let raw = g.state_view(w, "exp_avg")?;
        assert_eq!((raw.numel, raw.device, raw.dtype), (shard.end - shard.start, sx::sys::SX_DEVICE_CPU, sx::sys::SX_DTYPE_F32));
        assert!(raw.numel > 0 && raw.numel < 77, "each rank holds part of w: {:?}", shard);
        if let Some(all) = g.gather_optim_state(0)? {
            let m = &all[w as usize].tensors["exp_avg"];
            assert!(m[shard.start as usize..shard.end as usize].iter().all(|&x| x == 1.0));
            assert!(m[shard.end as usize..].iter().all(|&x| x == 2.0), "{:?}", m);
        }
        Ok(())
    });
}

#[test]
fn packed_state_views_are_codes_with_scales_and_bf16_bits() {
    common::run_ranks("whole-packed", 2, |rank, mut g| {
        g.add_param_group(&ParamGroup::new(Optimizer::AdamW).lr(0.01).state_dtype(StateDtype::EightBit))?;
        g.add_param_group(&ParamGroup::new(Optimizer::AdamW).lr(0.01).state_dtype(StateDtype::Bf16))?;
        let w = g.add_param(&Param::new("w", &[64, 128]).param_group(0))?;
        let c = g.add_param(&Param::new("c", &[48, 100]).param_group(1))?;
        g.finalize()?;
        train(&mut g, 2, rank)?;
        let shard = g.param_info(w)?.shard;
        let e = g.state(w, "exp_avg").unwrap_err();
        assert_eq!(e.status(), SX_ERR_UNSUPPORTED);
        assert!(e.message().contains("state_u8"), "{}", e);
        let codes = g.state_u8(w, "exp_avg")?.to_vec();
        assert_eq!(codes.len() as u64, shard.end - shard.start);
        let scales = g.state(w, "exp_avg.scale")?.to_vec();
        assert_eq!(scales.len(), codes.len() / 256);
        let c_shard = g.param_info(c)?.shard;
        assert_eq!(g.state_u16(c, "exp_avg_sq")?.len() as u64, c_shard.end - c_shard.start);
        if let Some(all) = g.gather_optim_state(0)? {
            // Rank 0's part starts the param: each block decodes its extreme to exactly its
            // scale times an end of the signed map (1.0, or its lowest entry).
            let lowest = -0.99296874f32;
            let m = &all[w as usize].tensors["exp_avg"];
            for (b, &s) in scales.iter().enumerate() {
                let block = &m[b * 256..(b + 1) * 256];
                let hi = block.iter().fold(f32::NEG_INFINITY, |a, &x| a.max(x));
                let lo = block.iter().fold(f32::INFINITY, |a, &x| a.min(x));
                assert!((hi == s || lo == lowest * s) && s > 0.0, "block {}: [{}, {}] and scale {}", b, lo, hi, s);
            }
        }
        Ok(())
    });
}

#[test]
fn a_param_never_trainable_has_no_state_but_is_delivered() {
    common::run_ranks("whole-frozen", 1, |_rank, mut g| {
        g.add_param_group(&ParamGroup::new(Optimizer::Adam))?;
        g.add_param(&Param::new("w", &[5]).unit(0))?;
        g.add_param(&Param::new("f", &[3]).unit(1).frozen(true))?;
        g.finalize()?;
        let e = g.state(1, "exp_avg").unwrap_err();
        assert_eq!(e.status(), SX_ERR_INVALID_STATE, "{}", e);
        let all = g.gather_optim_state(0)?.unwrap();
        assert_eq!(all.len(), 2);
        assert_eq!(all[0].tensors.len(), 2);
        assert!(all[1].tensors.is_empty(), "{:?}", all[1]);
        Ok(())
    });
}

#[test]
fn a_weighted_step_averages_over_the_samples() {
    // Ranks hold 3, 2 and 0 samples; each adds the sum of its samples' gradients. SGD
    // with lr 1 from zero: the params become minus the mean over the 5 samples.
    let got = common::run_ranks("weighted", 3, |rank, mut g| {
        let samples: &[f32] = match rank {
            0 => &[1.0, 2.0, 3.0],
            1 => &[10.0, 20.0],
            _ => &[],
        };
        g.add_param_group(&ParamGroup::new(Optimizer::Sgd).lr(1.0))?;
        g.add_param(&Param::new("w", &[4]))?;
        g.finalize()?;
        let sum: f32 = samples.iter().sum();
        g.grad_mut(0)?.iter_mut().for_each(|x| *x = sum);
        let r = g.step(Some(&StepOptions::new().weight(samples.len() as f64)))?;
        assert!(!r.skipped);
        let w = g.param(0)?.to_vec();
        // Nobody has data: the step is skipped and nothing changes.
        let r = g.step(Some(&StepOptions::new().weight(0.0)))?;
        assert!(r.skipped);
        assert_eq!(g.param(0)?, &w[..]);
        Ok(w)
    });
    for w in got {
        for x in w {
            assert!((x - -36.0f32 / 5.0).abs() < 1e-5, "{}", x);
        }
    }
}

#[test]
fn every_rank_weighs_or_none_does() {
    common::run_ranks("weighted-mismatch", 2, |rank, mut g| {
        g.add_param_group(&ParamGroup::new(Optimizer::Sgd))?;
        g.add_param(&Param::new("w", &[4]))?;
        g.finalize()?;
        let o = if rank == 0 { StepOptions::new().weight(1.0) } else { StepOptions::new() };
        let e = g.step(Some(&o)).unwrap_err();
        assert_eq!(e.status(), SX_ERR_MISMATCH, "{}", e);
        assert!(e.message().contains("weighted: 1 on rank 0, 0 on rank 1"), "{}", e);
        Ok(())
    });
}

#[test]
fn params_added_after_finalize_are_laid_out_by_finalize_again() {
    let got = common::run_ranks("late-params", 2, |_rank, mut g| {
        g.add_param_group(&ParamGroup::new(Optimizer::Sgd).lr(1.0))?;
        g.add_param(&Param::new("w", &[4]).unit(0))?;
        g.finalize()?;
        g.grad_mut(0)?.iter_mut().for_each(|x| *x = 1.0);
        g.step(None)?;
        let late = g.add_param_group(&ParamGroup::new(Optimizer::Sgd).lr(0.5))?;
        let v = g.add_param(&Param::new("v", &[3]).param_group(late).unit(1))?;
        assert_eq!(g.param(v).unwrap_err().status(), SX_ERR_INVALID_STATE, "a view before it is laid out");
        let e = g.step(None).unwrap_err();
        assert_eq!(e.status(), SX_ERR_INVALID_STATE);
        assert!(e.message().contains("call sx_finalize again"), "{}", e);
        g.finalize()?;
        g.grad_mut(v)?.iter_mut().for_each(|x| *x = 2.0);
        g.step(None)?;
        Ok((g.param(0)?.to_vec(), g.param(v)?.to_vec()))
    });
    for (w, v) in got {
        assert_eq!(w, vec![-1.0; 4]);
        assert_eq!(v, vec![-1.0; 3]);
    }
}

#[test]
fn ranks_that_add_different_params_are_told_what_differs() {
    common::run_ranks("late-mismatch", 2, |rank, mut g| {
        g.add_param_group(&ParamGroup::new(Optimizer::Sgd))?;
        g.add_param(&Param::new("w", &[4]).unit(0))?;
        g.finalize()?;
        g.add_param(&Param::new("v", &[4, 4 + rank as i64]).unit(1))?;
        let e = g.finalize().unwrap_err();
        assert_eq!(e.status(), SX_ERR_MISMATCH, "{}", e);
        assert!(e.message().contains("param 'v' shape: [4, 4] on rank 0, [4, 5] on rank 1"), "{}", e);
        Ok(())
    });
}
