// Runs from the build tree without LD_LIBRARY_PATH: rpath to where sx-sys found libsx.
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_SX_LIB_DIR");
    if let Ok(dir) = std::env::var("DEP_SX_LIB_DIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir);
    }
}
