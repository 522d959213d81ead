//! Finds libsx: SX_LIBRARY (the library file itself), SX_LIB_DIR (the directory that
//! holds libsx.so), or the pkg-config program (`pkg-config --libs sx`). The directory
//! found goes into the rpath of the test and sample binaries too, so they run from the
//! build tree without LD_LIBRARY_PATH.
use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

fn from_pkg_config() -> Result<Vec<PathBuf>, String> {
    let out = Command::new("pkg-config")
        .args(["--libs-only-L", "sx"])
        .output()
        .map_err(|e| format!("running pkg-config: {}", e))?;
    if !out.status.success() {
        return Err(format!(
            "pkg-config --libs-only-L sx failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    Ok(text
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("-L"))
        .map(PathBuf::from)
        .collect())
}

fn main() {
    println!("cargo:rerun-if-env-changed=SX_LIBRARY");
    println!("cargo:rerun-if-env-changed=SX_LIB_DIR");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");

    let dirs: Vec<PathBuf> = if let Ok(lib) = env::var("SX_LIBRARY") {
        let lib = PathBuf::from(lib);
        if !lib.is_file() {
            panic!("SX_LIBRARY={} is not a file; point it at libsx.so", lib.display());
        }
        vec![lib.parent().unwrap_or_else(|| Path::new(".")).to_path_buf()]
    } else if let Ok(dir) = env::var("SX_LIB_DIR") {
        let dir = PathBuf::from(dir);
        if !dir.join("libsx.so").exists() {
            panic!("SX_LIB_DIR={} holds no libsx.so", dir.display());
        }
        vec![dir]
    } else {
        match from_pkg_config() {
            Ok(d) => d,
            Err(e) => panic!(
                "cannot find libsx: set SX_LIB_DIR to the directory holding libsx.so \
                 (or SX_LIBRARY to the file), or install sx where pkg-config finds it ({})",
                e
            ),
        }
    };
    for dir in &dirs {
        println!("cargo:rustc-link-search=native={}", dir.display());
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
    }
    println!("cargo:rustc-link-lib=dylib=sx");
    if let Some(dir) = dirs.first() {
        // Visible to dependants' build scripts as DEP_SX_LIB_DIR.
        println!("cargo:lib_dir={}", dir.display());
    }
}
