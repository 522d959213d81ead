//! ParamGroup::bf16_stochastic_round: a group of bf16 params without fp32 masters reads the
//! key back, steps, and counts only its bf16 moments as optimizer bytes (two slots of 2
//! bytes per element); an fp32 param in such a group is refused at finalize, named.
mod common;

use sx::{Dtype, Hyperparameter, Optimizer, Param, ParamGroup, StateDtype};

const N: i64 = 4096;

#[test]
fn a_group_without_masters_steps_and_counts_only_its_moments() {
    let stats = common::run_ranks("stochastic-round", 1, |_, mut g| {
        g.add_param_group(
            &ParamGroup::new(Optimizer::AdamW).state_dtype(StateDtype::Bf16).bf16_stochastic_round(true),
        )?;
        g.add_param(&Param::new("w", &[N]).dtype(Dtype::Bf16))?;
        g.finalize()?;
        let on = g.hyperparameter(0, Hyperparameter::Bf16StochasticRound)?;
        g.step(None)?;
        Ok((on, g.memory_stats()?))
    });
    assert_eq!(stats[0].0, 1.0);
    assert_eq!(stats[0].1.optimizer_bytes, 4 * N as u64);
}

#[test]
fn an_fp32_param_is_refused() {
    let errors = common::run_ranks("stochastic-round-fp32", 1, |_, mut g| {
        g.add_param_group(&ParamGroup::new(Optimizer::AdamW).bf16_stochastic_round(true))?;
        g.add_param(&Param::new("fp32_w", &[8]))?;
        Ok(g.finalize().err().map(|e| (e.status(), e.to_string())))
    });
    let (status, message) = errors[0].clone().expect("finalize took an fp32 param");
    assert_eq!(status, sx::sys::SX_ERR_INVALID_ARGUMENT);
    assert!(message.contains("fp32_w"), "{}", message);
}
