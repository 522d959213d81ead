//! A Rust program built against an installed sx: sx-sys finds libsx through pkg-config
//! (PKG_CONFIG_PATH names the install's lib/pkgconfig; no SX_LIB_DIR), and the binary runs
//! without LD_LIBRARY_PATH (its build script's rpath). One rank takes one SGD step.
use sx::{Backend, GroupConfig, Optimizer, Param, ParamGroup, ShardGroup};

fn main() -> Result<(), sx::Error> {
    let mut g = ShardGroup::new(&GroupConfig::new("local://rust-install-check").world_size(1).backend(Backend::Cpu))?;
    g.add_param_group(&ParamGroup::new(Optimizer::Sgd).lr(1.0))?;
    g.add_param(&Param::new("w", &[3]))?;
    g.finalize()?;
    g.grad_mut(0)?.iter_mut().for_each(|x| *x = 2.0);
    g.step(None)?;
    let w = g.param(0)?;
    if w != [-2.0, -2.0, -2.0] {
        eprintln!("rust consumer: after the step w = {:?}, expected -2", w);
        std::process::exit(1);
    }
    println!("rust consumer: trained against the installed sx through pkg-config, without LD_LIBRARY_PATH");
    Ok(())
}
