//! Links the example with Magpie's PVH boot path (boot/linker.ld, with
//! boot/entry.S assembled by src/main.rs): QEMU boots it with `-kernel`.

fn main() {
    let manifest_dir = std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR");
    let boot = std::path::Path::new(&manifest_dir).join("../../boot");
    if std::env::var("TARGET").as_deref() == Ok("x86_64-unknown-none") {
        println!(
            "cargo:rustc-link-arg=-T{}",
            boot.join("linker.ld").display()
        );
        println!("cargo:rustc-link-arg=--no-pie");
        println!("cargo:rustc-link-arg=--undefined=_start32");
    }
    println!(
        "cargo:rerun-if-changed={}",
        boot.join("linker.ld").display()
    );
    println!("cargo:rerun-if-changed={}", boot.join("entry.S").display());
    println!("cargo:rerun-if-changed=build.rs");
}
