//! Lion written in Rust as an sx custom optimizer, checked bit for bit against sx's
//! built-in Lion (SX_OPTIM_LION) over 20 steps of a tiny model, on a world of 1 and of 2
//! ranks (threads of this process over local://).
//!
//! Every param is registered twice in one group: once under the built-in Lion, once
//! under this one, with the same initial values and the same gradients at every step;
//! after the steps both copies must hold the same bits.
//!
//!     SX_LIB_DIR=build/release/src cargo run --offline --manifest-path bindings/rust/Cargo.toml --example custom_lion
use std::sync::Arc;
use std::thread;

use sx::{
    register_optimizer, Backend, GroupConfig, Optimizer, OptimizerDesc, Param, ParamGroup, Piece, ShardGroup,
    StepOptions,
};

/// Lion as sx's built-in computes it: f32 arithmetic, one rounding per operation (Rust
/// never fuses a multiply and an add by itself). The hyperparameters are in the order
/// they were registered: lr, beta1, beta2, weight_decay.
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

const SHAPES: [(&str, [i64; 2]); 2] = [("w", [37, 53]), ("b", [1, 7])];
const STEPS: usize = 20;

fn grad_at(step: usize, k: usize, rank: i32) -> f32 {
    ((k as f64 * 0.37 + step as f64 * 1.3 + rank as f64 * 0.5).sin() * (1 + step % 3) as f64) as f32
}

/// One rank: returns (name, built-in values, custom values) per param.
/// (name, built-in values, custom values) of each param.
type Pairs = Vec<(String, Vec<f32>, Vec<f32>)>;

fn rank_main(rank: i32, world: i32, rendezvous: &str, custom: Optimizer) -> sx::Result<Pairs> {
    let cfg = GroupConfig::new(rendezvous)
        .rank(rank)
        .world_size(world)
        .backend(Backend::Cpu)
        .num_threads(2)
        .timeout_ms(60_000);
    let mut g = ShardGroup::new(&cfg)?;
    let builtin = g.add_param_group(&ParamGroup::new(Optimizer::Lion).lr(3e-3).betas(0.8, 0.95).weight_decay(0.1))?;
    let mine = g.add_param_group(&ParamGroup::new(custom).lr(3e-3).betas(0.8, 0.95).weight_decay(0.1))?;
    let mut pairs = Vec::new();
    for (name, shape) in SHAPES.iter() {
        let a = g.add_param(&Param::new(&format!("{}.builtin", name), shape).param_group(builtin).unit(0))?;
        let b = g.add_param(&Param::new(&format!("{}.custom", name), shape).param_group(mine).unit(1))?;
        pairs.push((name.to_string(), a, b));
    }
    g.finalize()?;
    for (_, a, b) in &pairs {
        for &i in &[*a, *b] {
            for (k, x) in g.param_mut(i)?.iter_mut().enumerate() {
                *x = (k as f32).cos();
            }
        }
    }
    for s in 0..STEPS {
        if s == 10 {
            g.set_lr(builtin, 1e-3)?;
            g.set_lr(mine, 1e-3)?;
        }
        for (_, a, b) in &pairs {
            for &i in &[*a, *b] {
                for (k, x) in g.grad_mut(i)?.iter_mut().enumerate() {
                    *x = grad_at(s, k, rank);
                }
            }
        }
        g.step(Some(&StepOptions::new().max_grad_norm(5.0)))?;
    }
    pairs.iter().map(|(name, a, b)| Ok((name.clone(), g.param(*a)?.to_vec(), g.param(*b)?.to_vec()))).collect()
}

fn run(world: i32, custom: Optimizer) -> Result<(), String> {
    let rendezvous = Arc::new(format!("local://rust-custom-lion-{}-{}", std::process::id(), world));
    let handles: Vec<_> = (0..world)
        .map(|rank| {
            let rendezvous = rendezvous.clone();
            thread::spawn(move || rank_main(rank, world, &rendezvous, custom))
        })
        .collect();
    for (rank, h) in handles.into_iter().enumerate() {
        let params =
            h.join().map_err(|_| format!("rank {} panicked", rank))?.map_err(|e| format!("rank {}: {}", rank, e))?;
        for (name, builtin, mine) in params {
            let differ = builtin.iter().zip(&mine).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
            if differ > 0 || builtin.len() != mine.len() {
                return Err(format!(
                    "world {}, rank {}, param {}: {} of {} values differ",
                    world,
                    rank,
                    name,
                    differ,
                    builtin.len()
                ));
            }
            if rank == 0 {
                println!(
                    "world {}: {} ({} values) identical to the built-in Lion after {} steps",
                    world,
                    name,
                    builtin.len(),
                    STEPS
                );
            }
        }
    }
    Ok(())
}

fn main() {
    let custom = register_optimizer(
        OptimizerDesc::new("rust_lion", lion)
            .slot("exp_avg")
            .hyperparameter("lr", 1e-4)
            .hyperparameter("beta1", 0.9)
            .hyperparameter("beta2", 0.99)
            .hyperparameter("weight_decay", 0.0),
    )
    .unwrap_or_else(|e| {
        eprintln!("register_optimizer: {}", e);
        std::process::exit(1)
    });
    for world in [1, 2] {
        if let Err(e) = run(world, custom) {
            eprintln!("custom_lion: {}", e);
            std::process::exit(1);
        }
    }
    println!("custom_lion: the Rust Lion matches sx's built-in Lion bit for bit");
}
