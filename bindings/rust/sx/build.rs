// sx-sys found libsx (it `links = "sx"`) and reports its directory as DEP_SX_LIB_DIR;
// link arguments do not reach dependants, so the rpath for this crate's tests and
// doctests is set here.
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_SX_LIB_DIR");
    if let Ok(dir) = std::env::var("DEP_SX_LIB_DIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir);
    }
}
