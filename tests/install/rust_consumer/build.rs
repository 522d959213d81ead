// The documented way to run a binary that links an installed sx without LD_LIBRARY_PATH
// (bindings/rust/README.md, "Your own crate"): sx hands on where sx-sys found libsx as
// DEP_SX_BINDING_LIB_DIR, and the binary's own build script puts that directory in its
// rpath (a dependency's link arguments do not reach a binary).
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_SX_BINDING_LIB_DIR");
    if let Ok(dir) = std::env::var("DEP_SX_BINDING_LIB_DIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir);
    }
}
