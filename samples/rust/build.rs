// Runs from the build tree without LD_LIBRARY_PATH: rpath to where sx-sys found libsx,
// which the sx crate hands on as DEP_SX_BINDING_LIB_DIR (bindings/rust/README.md).
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_SX_BINDING_LIB_DIR");
    if let Ok(dir) = std::env::var("DEP_SX_BINDING_LIB_DIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir);
    }
}
