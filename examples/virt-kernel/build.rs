//! Links the example with the linker script of its architecture
//! (`riscv64.ld`: QEMU virt RAM at 0x8000_0000, `-bios none`;
//! `riscv64-smode.ld`, feature `smode`: 0x8020_0000, after OpenSBI;
//! `aarch64.ld`: RAM at 0x4000_0000, `-kernel`).

fn main() {
    let manifest_dir = std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR");
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").expect("CARGO_CFG_TARGET_ARCH");
    if arch == "riscv64" || arch == "aarch64" {
        let smode = std::env::var_os("CARGO_FEATURE_SMODE").is_some();
        let name = if arch == "riscv64" && smode {
            "riscv64-smode"
        } else {
            &arch
        };
        let script = std::path::Path::new(&manifest_dir).join(format!("{name}.ld"));
        println!("cargo:rustc-link-arg=-T{}", script.display());
        println!("cargo:rerun-if-changed={}", script.display());
    }
    println!("cargo:rerun-if-changed=build.rs");
}
