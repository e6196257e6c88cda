//! Link options of the `asyncd` binary.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    if os == "linux" && env == "gnu" {
        // Relative relocations packed (DT_RELR; GNU ld 2.38+, glibc 2.36+): the loader
        // reads a table of about 20 KiB instead of 2 MiB of `.rela.dyn` at start-up,
        // which then stayed resident in every asyncd process. The executable stays
        // position-independent, its address randomised.
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
}
