//! Puts the target's memory map (`memory/<target>.x`) on the linker's search path as `memory.x`,
//! where the runtime crates' `link.x` includes it.
use std::{env, fs, path::PathBuf};

fn main() {
    let target = env::var("TARGET").unwrap();
    let map = format!("memory/{target}.x");
    println!("cargo:rerun-if-changed={map}");
    println!("cargo:rerun-if-changed=build.rs");
    let Ok(text) = fs::read(&map) else {
        // Host builds (for example `cargo fmt` helpers) need no memory map.
        return;
    };
    let out = PathBuf::from(env::var_os("OUT_DIR").unwrap());
    fs::write(out.join("memory.x"), text).unwrap();
    println!("cargo:rustc-link-search={}", out.display());
}
