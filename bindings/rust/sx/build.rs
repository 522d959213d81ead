// sx-sys found libsx (it `links = "sx"`) and reports its directory as DEP_SX_LIB_DIR.
// Link arguments reach no other package's link, so:
// - the rpath for this crate's tests, doctests and examples is set here;
// - the directory is handed on (this crate `links = "sx-binding"`) as
//   DEP_SX_BINDING_LIB_DIR, so that a crate depending on sx alone can put it in its
//   binaries' rpath from a build script of its own (README.md, "Your own crate").
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_SX_LIB_DIR");
    if let Ok(dir) = std::env::var("DEP_SX_LIB_DIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir);
        println!("cargo:lib_dir={}", dir);
    }
}
