//! Link options of the `asyncd` binary.

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=link-order.txt");
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    if var("CARGO_CFG_TARGET_OS") == "linux" && var("CARGO_CFG_TARGET_ENV") == "gnu" {
        // Relative relocations packed (DT_RELR; GNU ld 2.38+, glibc 2.36+): the loader
        // reads a table of about 20 KiB instead of 2 MiB of `.rela.dyn` at start-up,
        // which then stayed resident in every asyncd process. The executable stays
        // position-independent, its address randomised.
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
    if var("PROFILE") == "release" && links_with_rust_lld(&var("TARGET")) {
        // The functions start-up and the idle loops run, laid out together
        // (e2e/link-order.sh writes the list): an idle process's resident code is the
        // pages those functions lie on, plus the 64 KiB the kernel maps around each
        // fault. A name the binary no longer defines (the toolchain or a dependency
        // changed) is skipped without a warning; the test command's
        // `link-order.sh check` says when the list needs writing again.
        let list = std::path::Path::new(&var("CARGO_MANIFEST_DIR")).join("link-order.txt");
        println!(
            "cargo:rustc-link-arg-bins=-Wl,--symbol-ordering-file={}",
            list.display()
        );
        println!("cargo:rustc-link-arg-bins=-Wl,--no-warn-symbol-ordering");
    }
}

/// Whether rustc links for `target` with its own copy of LLD, which reads a symbol
/// ordering file (GNU ld refuses the option): the default on x86_64 Linux with glibc
/// since Rust 1.90, unless the build names a linker of its own.
fn links_with_rust_lld(target: &str) -> bool {
    if target != "x86_64-unknown-linux-gnu" {
        return false;
    }
    println!("cargo:rerun-if-env-changed=CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER");
    let flags = std::env::var("CARGO_ENCODED_RUSTFLAGS").unwrap_or_default();
    if flags.contains("linker")
        || flags.contains("fuse-ld")
        || std::env::var_os("CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER").is_some()
    {
        return false;
    }
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let Ok(out) = Command::new(rustc).arg("-V").output() else {
        return false;
    };
    // "rustc 1.95.0 (59807616e 2026-04-14)"
    let version = String::from_utf8_lossy(&out.stdout);
    let mut numbers = version
        .split_whitespace()
        .nth(1)
        .unwrap_or_default()
        .split('.')
        .map(|n| n.parse::<u32>().unwrap_or(0));
    let (major, minor) = (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0));
    (major, minor) >= (1, 90)
}
