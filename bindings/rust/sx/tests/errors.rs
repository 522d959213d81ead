mod common;

use sx::status::*;
use sx::{LossScaling, Optimizer, Param, ParamGroup, ShardGroup};

fn one_rank(test: &str) -> ShardGroup {
    ShardGroup::new(&common::config(&common::rendezvous(test), 0, 1)).unwrap()
}

#[test]
fn bad_arguments_carry_status_and_message() {
    let mut g = one_rank("badargs");
    let e = g.add_param(&Param::new("w", &[4])).unwrap_err();
    // No param group 0 exists yet.
    assert_eq!(e.status(), SX_ERR_INVALID_ARGUMENT, "{}", e);
    assert!(!e.message().is_empty());
    g.add_param_group(&ParamGroup::new(Optimizer::Sgd)).unwrap();

    let e = g.add_param(&Param::new("", &[4])).unwrap_err();
    assert_eq!(e.status(), SX_ERR_INVALID_ARGUMENT);
    assert!(e.message().contains("name"), "{}", e.message());
    let text = e.to_string();
    assert!(text.starts_with("SX_ERR_INVALID_ARGUMENT: "), "{}", text);
    assert!(text.ends_with(e.message()), "{}", text);
    let boxed: Box<dyn std::error::Error> = Box::new(e);
    assert!(boxed.to_string().contains("SX_ERR_INVALID_ARGUMENT"));

    let e = g.add_param(&Param::new("a\0b", &[4])).unwrap_err();
    assert_eq!(e.status(), SX_ERR_INVALID_ARGUMENT);
    assert!(e.message().contains("NUL"), "{}", e.message());

    let e = g.add_param(&Param::new("neg", &[4, -1])).unwrap_err();
    assert_eq!(e.status(), SX_ERR_INVALID_ARGUMENT, "{}", e);

    g.add_param(&Param::new("w", &[4])).unwrap();
    assert_eq!(g.add_param(&Param::new("w", &[4])).unwrap_err().status(), SX_ERR_ALREADY_EXISTS);
    // Views before finalize are a state error.
    assert_eq!(g.param(0).unwrap_err().status(), SX_ERR_INVALID_STATE);
    g.finalize().unwrap();
    // After finalize, params go in new units: unit 0 is laid out already.
    assert_eq!(g.add_param(&Param::new("late", &[1])).unwrap_err().status(), SX_ERR_INVALID_ARGUMENT);
    let e = g.find_param("nope").unwrap_err();
    assert_eq!(e.status(), SX_ERR_NOT_FOUND);
    assert!(e.message().contains("nope"), "{}", e.message());
    assert_eq!(g.param(7).unwrap_err().status(), SX_ERR_INVALID_ARGUMENT);
    assert_eq!(g.set_lr(0, -1.0).unwrap_err().status(), SX_ERR_INVALID_ARGUMENT);
    // A failed call leaves the error of another thread alone: messages are per thread.
    let other = std::thread::spawn(|| sx::status_string(SX_ERR_TIMEOUT)).join().unwrap();
    assert!(other.starts_with("SX_ERR_TIMEOUT"));
}

#[test]
fn paths_holding_a_nul_are_refused() {
    // C would read them only up to the NUL: another path than the one given.
    let mut g = one_rank("nulpaths");
    g.add_param_group(&ParamGroup::new(Optimizer::Sgd)).unwrap();
    g.add_param(&Param::new("w", &[4])).unwrap();
    g.finalize().unwrap();
    let dir = common::TempDir::new("nulpaths");
    let bad = dir.join("a\0b");
    let e = match g.save(sx::SaveOptions::new(&bad)) {
        Err(e) => e,
        Ok(_) => panic!("a save path with a NUL was taken"),
    };
    assert_eq!(e.status(), SX_ERR_INVALID_ARGUMENT, "{}", e);
    assert!(e.message().contains("NUL"), "{}", e.message());
    assert_eq!(g.load(&sx::LoadOptions::new(&bad)).unwrap_err().status(), SX_ERR_INVALID_ARGUMENT);
    assert_eq!(sx::read_user_blob(&bad).unwrap_err().status(), SX_ERR_INVALID_ARGUMENT);
    assert_eq!(std::fs::read_dir(&dir.0).unwrap().count(), 0);
}

#[test]
fn bad_loss_scaling_is_refused_and_changes_nothing() {
    let mut g = one_rank("badscaling");
    g.add_param_group(&ParamGroup::new(Optimizer::Sgd)).unwrap();
    g.add_param(&Param::new("w", &[4])).unwrap();
    g.finalize().unwrap();
    let e = g.set_loss_scaling(&LossScaling::dynamic().backoff_factor(1.5)).unwrap_err();
    assert_eq!(e.status(), SX_ERR_INVALID_ARGUMENT, "{}", e);
    assert!(e.message().contains("backoff_factor") && e.message().contains("1.5"), "{}", e.message());
    assert_eq!(g.loss_scale().unwrap(), 1.0);
}

#[test]
fn bad_rendezvous_fails_to_create() {
    let e = ShardGroup::new(&common::config("nosuch://x", 0, 1)).err().expect("group created from a bad rendezvous");
    assert_eq!(e.status(), SX_ERR_INVALID_ARGUMENT, "{}", e);
    assert!(e.message().contains("nosuch"), "{}", e.message());
    let e = ShardGroup::new(&common::config(&common::rendezvous("badrank"), 3, 2)).err().unwrap();
    assert_eq!(e.status(), SX_ERR_INVALID_ARGUMENT, "{}", e);
}

#[test]
fn read_user_blob_of_missing_checkpoint() {
    let e = sx::read_user_blob("/nonexistent/sx/ckpt").unwrap_err();
    assert_ne!(e.status(), SX_OK);
    assert!(e.message().contains("/nonexistent/sx/ckpt"), "{}", e.message());
}

/// A free TCP port on 127.0.0.1 (bound to port 0, read back, released).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[test]
fn rendezvous_token_refuses_a_wrong_one_and_admits_the_right_one() {
    let port = free_port();
    let url = format!("tcp://127.0.0.1:{}", port);
    let rank0 = {
        let url = url.clone();
        std::thread::spawn(move || {
            ShardGroup::new(&common::config(&url, 0, 2).rendezvous_token("rust-secret").rendezvous_bind("*"))
                .and_then(|g| g.world_size())
        })
    };
    // "localhost": another spelling of the address, so that this refused attempt does not
    // count as one of this process's groups on the URL of the others (key_space.cc).
    let wrong = format!("tcp://localhost:{}", port);
    let e = ShardGroup::new(&common::config(&wrong, 1, 2).rendezvous_token("not-it")).err().expect("refused");
    assert_eq!(e.status(), SX_ERR_INVALID_ARGUMENT, "{}", e);
    assert!(e.message().contains("does not match"), "{}", e.message());
    assert!(!e.message().contains("rust-secret") && !e.message().contains("not-it"));
    let g = ShardGroup::new(&common::config(&url, 1, 2).rendezvous_token("rust-secret")).unwrap();
    assert_eq!(g.world_size().unwrap(), 2);
    assert_eq!(rank0.join().unwrap().unwrap(), 2);
    // A token never shows in the config's Debug text, and one with a NUL is refused
    // without being shown.
    let c = common::config(&url, 0, 1).rendezvous_token("rust-secret");
    assert!(!format!("{:?}", c).contains("rust-secret"));
    let e = ShardGroup::new(&common::config(&url, 0, 1).rendezvous_token("a\0secret")).err().expect("refused");
    assert_eq!(e.status(), SX_ERR_INVALID_ARGUMENT);
    assert!(!e.message().contains("secret"), "{}", e.message());
}

#[test]
fn world_size_beyond_the_maximum_is_refused() {
    let e = ShardGroup::new(&common::config(&common::rendezvous("maxworld"), 0, sx::sys::SX_MAX_WORLD_SIZE + 1))
        .err()
        .expect("refused");
    assert_eq!(e.status(), SX_ERR_INVALID_ARGUMENT);
    assert!(e.message().contains("SX_MAX_WORLD_SIZE"), "{}", e.message());
}
