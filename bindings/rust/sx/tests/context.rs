//! Contexts over local:// with ranks as threads: two groups made in one by name, each
//! finalized and stepped; the context's stats; a duplicate live name refused; and the
//! lifetime of the handle against its groups.
mod common;

use std::sync::Arc;
use std::thread;

use sx::{Backend, Context, ContextConfig, GroupConfig, Optimizer, Param, ParamGroup, Result, ShardGroup};

const WORLD: i32 = 2;

fn context(rendezvous: &str, rank: i32) -> Result<Context> {
    Context::new(
        &ContextConfig::new(rendezvous).rank(rank).world_size(WORLD).backend(Backend::Cpu).num_threads(1).timeout_ms(60_000),
    )
}

/// Registers `w` of `n` values under SGD (lr 1), finalizes, writes 1 into every gradient
/// and steps once: the step count and w's values after it.
fn train_once(g: &mut ShardGroup, n: i64) -> Result<(u64, Vec<f32>)> {
    g.add_param_group(&ParamGroup::new(Optimizer::Sgd).lr(1.0))?;
    g.add_param(&Param::new("w", &[n]))?;
    g.finalize()?;
    g.grad_mut(0)?.iter_mut().for_each(|x| *x = 1.0);
    let step = g.step(None)?.step;
    Ok((step, g.param(0)?.to_vec()))
}

/// Runs `f(rank, rendezvous)` on WORLD threads; panics with the first rank's error.
fn run<F>(test: &str, f: F)
where
    F: Fn(i32, &str) -> Result<()> + Send + Sync + 'static,
{
    let name = common::rendezvous(test);
    let f = Arc::new(f);
    let handles: Vec<_> = (0..WORLD)
        .map(|rank| {
            let (f, name) = (f.clone(), name.clone());
            thread::spawn(move || f(rank, &name))
        })
        .collect();
    for (rank, h) in handles.into_iter().enumerate() {
        if let Err(e) = h.join().expect("rank thread panicked") {
            panic!("rank {}: {}", rank, e);
        }
    }
}

#[test]
fn two_groups_in_a_context() {
    run("context-two", |rank, rendezvous| {
        let ctx = context(rendezvous, rank)?;
        let mut a = ShardGroup::new(&GroupConfig::in_context(&ctx, "tenant-a"))?;
        let mut b = ShardGroup::new(&GroupConfig::in_context(&ctx, "tenant-b").stage(1))?;
        assert_eq!((a.rank()?, a.world_size()?), (rank, WORLD));
        assert_eq!((b.stage()?, b.world_size()?), (1, WORLD));
        assert_eq!(train_once(&mut a, 16)?, (1, vec![-1.0; 16]));
        assert_eq!(train_once(&mut b, 8)?, (1, vec![-1.0; 8]));
        let s = ctx.stats()?;
        assert_eq!((s.groups, s.groups_created), (2, 2), "{:?}", s);
        assert!(s.shared_memory, "{:?}", s);
        assert_eq!(s.transport_bytes, 0, "no Gloo channels in shared memory: {:?}", s);
        assert!(s.memory_bytes > 0, "{:?}", s);
        assert!(s.channels >= 2, "{:?}", s);
        // A live group's name is refused on every rank, and nothing is made.
        let e = ShardGroup::new(&GroupConfig::in_context(&ctx, "tenant-a")).err().expect("a duplicate name was accepted");
        assert_eq!(e.status(), sx::status::SX_ERR_INVALID_STATE, "{}", e);
        assert_eq!(ctx.stats()?.groups, 2);
        drop(a);
        b.close()?;
        let s = ctx.stats()?;
        assert_eq!((s.groups, s.memory_bytes, s.groups_created), (0, 0, 2), "{:?}", s);
        // A gone group's name may be used again.
        let mut again = ShardGroup::new(&GroupConfig::in_context(&ctx, "tenant-a"))?;
        assert_eq!(train_once(&mut again, 4)?, (1, vec![-1.0; 4]));
        ctx.close()
    });
}

#[test]
fn groups_outlive_the_handle() {
    run("context-outlive", |rank, rendezvous| {
        let ctx = Context::new(
            &ContextConfig::new(rendezvous)
                .rank(rank)
                .world_size(WORLD)
                .backend(Backend::Cpu)
                .num_threads(1)
                .timeout_ms(60_000)
                .memory_budget_bytes(1 << 20),
        )?;
        assert_eq!(ctx.stats()?.memory_budget_bytes, 1 << 20);
        let mut g = ShardGroup::new(&GroupConfig::in_context(&ctx, "kept"))?;
        // A config that names the context holds the handle; once it and the Context are
        // gone, the handle is released and the group goes on in the context.
        let later = GroupConfig::in_context(&ctx, "later");
        ctx.close()?;
        let mut h = ShardGroup::new(&later)?;
        drop(later);
        assert_eq!(train_once(&mut g, 4)?, (1, vec![-1.0; 4]));
        assert_eq!(train_once(&mut h, 4)?, (1, vec![-1.0; 4]));
        Ok(())
    });
}

#[test]
fn context_arguments() {
    let ctx = Context::new(
        &ContextConfig::new(&common::rendezvous("context-args")).rank(0).world_size(1).backend(Backend::Cpu).num_threads(1),
    )
    .unwrap();
    // A group in a context needs a name; the fields the context owns must match it.
    let e = ShardGroup::new(&GroupConfig::in_context(&ctx, "")).err().expect("no name was accepted");
    assert_eq!(e.status(), sx::status::SX_ERR_INVALID_ARGUMENT, "{}", e);
    assert!(e.message().contains("name"), "{}", e);
    let e = ShardGroup::new(&GroupConfig::new("local://elsewhere").context(&ctx).name("x"))
        .err()
        .expect("another rendezvous was accepted");
    assert_eq!(e.status(), sx::status::SX_ERR_INVALID_ARGUMENT, "{}", e);
    assert!(e.message().contains("rendezvous"), "{}", e);
    assert_eq!(ctx.stats().unwrap().groups_created, 0);
    // A name without a context is refused too.
    let e = ShardGroup::new(&common::config(&common::rendezvous("context-args-none"), 0, 1).name("x"))
        .err()
        .expect("a name without a context was accepted");
    assert_eq!(e.status(), sx::status::SX_ERR_INVALID_ARGUMENT, "{}", e);
    ctx.close().unwrap();
}
