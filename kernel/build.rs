//! Links every kernel artifact (the binary and each QEMU test) with
//! boot/linker.ld as a non-PIE higher-half image.

fn main() {
    let manifest_dir = std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR");
    let boot = std::path::Path::new(&manifest_dir).join("../boot");
    let script = boot.join("linker.ld");
    // Only for the bare-metal target: host builds (e.g. clippy on the host) must not get it.
    if std::env::var("TARGET").as_deref() == Ok("x86_64-unknown-none") {
        println!("cargo:rustc-link-arg=-T{}", script.display());
        println!("cargo:rustc-link-arg=--no-pie");
        // A GNU build id, kept by the linker script: kmemtrace dumps name
        // the kernel they came from.
        println!("cargo:rustc-link-arg=--build-id=sha1");
        println!("cargo:rustc-link-arg=--undefined=_start32");
    }
    println!("cargo:rerun-if-changed={}", script.display());
    println!("cargo:rerun-if-changed={}", boot.join("entry.S").display());
    println!("cargo:rerun-if-changed=build.rs");
}
