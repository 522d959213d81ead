//! The bindings' sample in Rust: a linear regression trained by 4 ranks (threads of
//! this process) with ZeRO-2 AdamW. samples/LINREG.md specifies every number; the
//! output matches samples/c/train_linreg.c bit for bit.
//!
//! usage: train_linreg [--steps N] [--save DIR] [--load DIR]
use std::io::Write;
use std::process::exit;
use std::sync::Arc;
use std::thread;

use sx::{Backend, GroupConfig, LoadOptions, Optimizer, Param, ParamGroup, SaveOptions, ShardGroup};

const RANKS: i32 = 4;
const OUT: usize = 8;
const IN: usize = 16;
const BATCH: usize = 4;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 11) as f64 * (1.0 / (1u64 << 53) as f64) * 2.0 - 1.0
    }
}

struct Args {
    steps: u64,
    save: Option<String>,
    load: Option<String>,
    rendezvous: String,
}

fn run_rank(rank: i32, args: &Args) -> sx::Result<()> {
    let mut teacher = Rng(7);
    let mut tw = [[0.0f64; IN]; OUT];
    let mut tb = [0.0f64; OUT];
    for row in tw.iter_mut() {
        for v in row.iter_mut() {
            *v = teacher.next();
        }
    }
    for v in tb.iter_mut() {
        *v = teacher.next();
    }

    let cfg = GroupConfig::new(&args.rendezvous).rank(rank).world_size(RANKS).stage(2).backend(Backend::Cpu).num_threads(1);
    let mut g = ShardGroup::new(&cfg)?;
    g.add_param_group(&ParamGroup::new(Optimizer::AdamW).lr(0.05))?;
    g.add_param(&Param::new("w", &[OUT as i64, IN as i64]).unit(0))?;
    g.add_param(&Param::new("b", &[OUT as i64]).unit(1))?;
    g.finalize()?;

    let mut step: u64 = 0;
    if let Some(dir) = &args.load {
        g.load(&LoadOptions::new(dir))?;
        let blob = sx::read_user_blob(dir)?;
        if blob.len() != 8 {
            return Err(sx::Error::new(
                sx::status::SX_ERR_CORRUPT,
                format!("{}: user blob is {} bytes, expected 8", dir, blob.len()),
            ));
        }
        let mut b = [0u8; 8];
        b.copy_from_slice(&blob);
        step = u64::from_le_bytes(b);
    } else {
        let mut init = Rng(1);
        let mut t = g.tensors_mut()?;
        for v in t.params[0].iter_mut() {
            *v = (0.1 * init.next()) as f32;
        }
        for v in t.params[1].iter_mut() {
            *v = (0.1 * init.next()) as f32;
        }
    }

    for _ in 0..args.steps {
        let mut gw = [[0.0f64; IN]; OUT];
        let mut gb = [0.0f64; OUT];
        let mut loss = 0.0f64;
        let mut data = Rng(step.wrapping_mul(4096).wrapping_add(rank as u64 * 64).wrapping_add(1));
        let t = g.tensors_mut()?;
        let (w, b) = (&t.params[0], &t.params[1]);
        for _ in 0..BATCH {
            let mut x = [0.0f64; IN];
            for v in x.iter_mut() {
                *v = data.next();
            }
            for i in 0..OUT {
                let mut y = b[i] as f64;
                let mut tt = tb[i];
                for j in 0..IN {
                    y += w[i * IN + j] as f64 * x[j];
                    tt += tw[i][j] * x[j];
                }
                let diff = y - tt;
                loss += diff * diff / (OUT * BATCH) as f64;
                let d = 2.0 * diff / (OUT * BATCH) as f64;
                for j in 0..IN {
                    gw[i][j] += d * x[j];
                }
                gb[i] += d;
            }
        }
        let mut grads = t.grads;
        for i in 0..OUT {
            for j in 0..IN {
                grads[0][i * IN + j] = gw[i][j] as f32;
            }
            grads[1][i] = gb[i] as f32;
        }
        if rank == 0 {
            let out = std::io::stdout();
            let mut out = out.lock();
            let _ = writeln!(out, "step {} loss {:.6} bits {:016x}", step, loss, loss.to_bits());
            let _ = out.flush();
        }
        g.step(None)?;
        step += 1;
    }

    if let Some(dir) = &args.save {
        let fut = g.save(SaveOptions::new(dir).user_blob(&step.to_le_bytes()))?;
        fut.wait()?;
        if rank == 0 {
            println!("saved {}", dir);
        }
    }
    Ok(())
}

fn usage(prog: &str) -> ! {
    eprintln!("usage: {} [--steps N] [--save DIR] [--load DIR]", prog);
    exit(2)
}

fn main() {
    let argv: Vec<String> = std::env::args().collect();
    let prog = argv.first().cloned().unwrap_or_else(|| "train_linreg".to_string());
    let mut args = Args { steps: 20, save: None, load: None, rendezvous: format!("local://linreg-{}", std::process::id()) };
    let mut i = 1;
    while i < argv.len() {
        let value = argv.get(i + 1);
        match (argv[i].as_str(), value) {
            ("--steps", Some(v)) => {
                args.steps = v.parse().unwrap_or_else(|_| {
                    eprintln!("{}: --steps takes a non-negative integer, not {:?}", prog, v);
                    usage(&prog)
                })
            }
            ("--save", Some(v)) => args.save = Some(v.clone()),
            ("--load", Some(v)) => args.load = Some(v.clone()),
            _ => usage(&prog),
        }
        i += 2;
    }
    let args = Arc::new(args);
    let handles: Vec<_> = (0..RANKS)
        .map(|rank| {
            let args = args.clone();
            thread::spawn(move || run_rank(rank, &args))
        })
        .collect();
    let mut failed = false;
    for (rank, h) in handles.into_iter().enumerate() {
        match h.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                eprintln!("rank {}: {}", rank, e);
                failed = true;
            }
            Err(_) => {
                eprintln!("rank {}: panicked", rank);
                failed = true;
            }
        }
    }
    exit(if failed { 1 } else { 0 })
}
