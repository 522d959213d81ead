//! Finds libsx: SX_LIBRARY (the library file itself: libsx.so, libsx.so.1 or
//! libsx.so.1.6.0), SX_LIB_DIR (a directory holding one of those), or the pkg-config
//! program (`pkg-config --libs sx`). The directory found goes into the rpath of this
//! crate's tests, and is handed on as DEP_SX_LIB_DIR (the sx crate re-exports it to its
//! own dependants as DEP_SX_BINDING_LIB_DIR, for their rpath).
//!
//! The linker's `-lsx` finds only a file named exactly libsx.so (the development link an
//! install or a build tree makes). Where the library has only its versioned names, this
//! script links through a `libsx.so` symbolic link of its own in OUT_DIR; the binary
//! still needs the library's soname (libsx.so.1) at run time, from the directory given.
use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The major version whose library this binding declares (libsx.so.1).
const MAJOR: &str = "1";

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

/// `dir` made absolute (an rpath relative to the binary's working directory is no use).
fn absolute(dir: &Path) -> PathBuf {
    std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf())
}

/// Whether `name` is libsx.so or a versioned name of this major (libsx.so.1, libsx.so.1.6.0).
fn is_library_name(name: &str) -> bool {
    match name.strip_prefix("libsx.so") {
        Some("") => true,
        Some(rest) => {
            rest == format!(".{}", MAJOR) || rest.starts_with(&format!(".{}.", MAJOR))
        }
        None => false,
    }
}

/// The library file in `dir`: libsx.so, else libsx.so.1, else the first libsx.so.1.*
/// (sorted, so the choice does not depend on the directory's order).
fn library_in(dir: &Path) -> Option<PathBuf> {
    for name in ["libsx.so".to_string(), format!("libsx.so.{}", MAJOR)] {
        let p = dir.join(&name);
        if p.is_file() {
            return Some(p);
        }
    }
    let mut versioned: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.is_file() && p.file_name().and_then(|n| n.to_str()).map_or(false, is_library_name))
        .collect();
    versioned.sort();
    versioned.into_iter().next()
}

/// What `dir` holds that looks like libsx, for an error message.
fn sx_files_in(dir: &Path) -> String {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().to_str().map(str::to_string))
                .filter(|n| n.starts_with("libsx"))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    if names.is_empty() {
        "no libsx* file".to_string()
    } else {
        names.join(", ")
    }
}

/// Emits the link arguments for `lib` (a file in `dir`).
fn link(lib: &Path, dir: &Path) {
    if lib.file_name().map_or(false, |n| n == "libsx.so") {
        println!("cargo:rustc-link-search=native={}", dir.display());
    } else {
        // -lsx wants libsx.so: a link of that name to the versioned file, in a directory
        // of our own (rustc-link-lib, unlike rustc-link-arg, reaches the dependants' link,
        // and `+verbatim` needs Rust 1.67).
        let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
        let link_dir = out.join("link");
        std::fs::create_dir_all(&link_dir)
            .unwrap_or_else(|e| panic!("creating {}: {}", link_dir.display(), e));
        let target = std::fs::canonicalize(lib).unwrap_or_else(|_| lib.to_path_buf());
        let name = link_dir.join("libsx.so");
        let _ = std::fs::remove_file(&name);
        std::os::unix::fs::symlink(&target, &name)
            .unwrap_or_else(|e| panic!("linking {} to {}: {}", name.display(), target.display(), e));
        println!("cargo:rustc-link-search=native={}", link_dir.display());
        // Still the real directory for the linker's search of libsx's own dependencies.
        println!("cargo:rustc-link-search=native={}", dir.display());
    }
    let soname = dir.join(format!("libsx.so.{}", MAJOR));
    if !soname.exists() {
        println!(
            "cargo:warning={} does not hold libsx.so.{} (the name a binary asks for at run time): \
             make that link, or the binary will not find libsx",
            dir.display(),
            MAJOR
        );
    }
}

fn main() {
    println!("cargo:rerun-if-env-changed=SX_LIBRARY");
    println!("cargo:rerun-if-env-changed=SX_LIB_DIR");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");

    let (lib, dirs): (PathBuf, Vec<PathBuf>) = if let Ok(lib) = env::var("SX_LIBRARY") {
        let lib = PathBuf::from(lib);
        if !lib.is_file() {
            panic!(
                "SX_LIBRARY={} is not a file; point it at the library (libsx.so, libsx.so.{} or libsx.so.{}.x.y), \
                 or set SX_LIB_DIR to its directory",
                lib.display(),
                MAJOR,
                MAJOR
            );
        }
        let name = lib.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if !is_library_name(name) {
            panic!(
                "SX_LIBRARY={}: the file must be named libsx.so, libsx.so.{} or libsx.so.{}.x.y \
                 (this binding declares sx {}.x)",
                lib.display(),
                MAJOR,
                MAJOR,
                MAJOR
            );
        }
        let dir = match lib.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        (lib, vec![absolute(&dir)])
    } else if let Ok(dir) = env::var("SX_LIB_DIR") {
        let dir = PathBuf::from(dir);
        if !dir.is_dir() {
            panic!("SX_LIB_DIR={} is not a directory; set it to the directory holding libsx.so", dir.display());
        }
        match library_in(&dir) {
            Some(lib) => (lib, vec![absolute(&dir)]),
            None => panic!(
                "SX_LIB_DIR={} holds no libsx.so, libsx.so.{} or libsx.so.{}.x.y (it holds {}); \
                 set it to the directory of the build's src/ or of an install's lib/",
                dir.display(),
                MAJOR,
                MAJOR,
                sx_files_in(&dir)
            ),
        }
    } else {
        let dirs = from_pkg_config().unwrap_or_else(|e| {
            panic!(
                "cannot find libsx: set SX_LIB_DIR to the directory holding libsx.so \
                 (or SX_LIBRARY to the file), or install sx where pkg-config finds it ({})",
                e
            )
        });
        match dirs.iter().find_map(|d| library_in(d).map(|l| (l, d.clone()))) {
            Some((lib, dir)) => {
                let mut rest: Vec<PathBuf> = dirs.into_iter().filter(|d| *d != dir).collect();
                rest.insert(0, dir);
                (lib, rest)
            }
            // pkg-config's default directories (-L omitted): let the linker search them.
            None => {
                for dir in &dirs {
                    println!("cargo:rustc-link-search=native={}", dir.display());
                }
                println!("cargo:rustc-link-lib=dylib=sx");
                if let Some(dir) = dirs.first() {
                    println!("cargo:lib_dir={}", dir.display());
                }
                return;
            }
        }
    };
    link(&lib, &dirs[0]);
    for dir in &dirs[1..] {
        println!("cargo:rustc-link-search=native={}", dir.display());
    }
    for dir in &dirs {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
    }
    println!("cargo:rustc-link-lib=dylib=sx");
    // Visible to dependants' build scripts as DEP_SX_LIB_DIR.
    println!("cargo:lib_dir={}", dirs[0].display());
}
