//! Norm domains over local:// with ranks as threads: two slices (each a group of one rank)
//! of a tensor split in halves, joined to one domain, take the norm of the whole tensor
//! (a replicated param counted once) and clip by it alike; a bad placement is refused.
mod common;

use std::thread;

use sx::{GroupConfig, NormDomain, Optimizer, Param, ParamGroup, Result, ShardGroup, StepOptions};

fn slice(rank: i32, domain: String, group: String) -> Result<(f64, Vec<f32>)> {
    let mut g = ShardGroup::new(&common::config(&group, 0, 1))?;
    g.add_param_group(&ParamGroup::new(Optimizer::Sgd).lr(1.0))?;
    g.add_param(&Param::new("w", &[2]).split(&[4], 0, 2 * rank as i64))?;
    g.add_param(&Param::new("b", &[1]).replica(rank, 2))?;
    g.finalize()?;
    {
        let d = NormDomain::new(&GroupConfig::new(&domain).rank(rank).world_size(2).timeout_ms(60_000))?;
        g.join_norm_domain(&d, rank)?;
    } // the group keeps the domain alive
    g.grad_mut(0)?.copy_from_slice(if rank == 0 { &[3.0, 0.0] } else { &[0.0, 4.0] });
    g.grad_mut(1)?[0] = 1.0;
    let r = g.step(Some(&StepOptions::new().max_grad_norm(1.0)))?;
    Ok((r.grad_norm, g.param(0)?.to_vec()))
}

#[test]
fn two_slices_clip_by_the_whole_norm() {
    let domain = common::rendezvous("norm-domain");
    let handles: Vec<_> = (0..2)
        .map(|rank| {
            let (d, g) = (domain.clone(), common::rendezvous(&format!("norm-domain-g{}", rank)));
            thread::spawn(move || slice(rank, d, g))
        })
        .collect();
    let out: Vec<_> = handles.into_iter().map(|h| h.join().unwrap().unwrap()).collect();
    let norm = 26f64.sqrt(); // 9 + 16, and b's 1 once
    assert_eq!(out[0].0.to_bits(), out[1].0.to_bits());
    assert!((out[0].0 - norm).abs() < 1e-12);
    let coef = 1.0 / (norm + 1e-6);
    assert!((out[0].1[0] as f64 + 3.0 * coef).abs() < 1e-6);
    assert!((out[1].1[1] as f64 + 4.0 * coef).abs() < 1e-6);
}

#[test]
fn a_bad_placement_is_refused() {
    let mut g = ShardGroup::new(&common::config(&common::rendezvous("bad-placement"), 0, 1)).unwrap();
    g.add_param_group(&ParamGroup::new(Optimizer::Sgd)).unwrap();
    let e = g.add_param(&Param::new("w", &[4, 5]).split(&[8, 5], 0, 6)).unwrap_err();
    assert!(e.to_string().contains("does not fit"), "{}", e);
    assert_eq!(g.add_param(&Param::new("w", &[4, 5]).split(&[8, 5], 0, 4)).unwrap(), 0);
}
