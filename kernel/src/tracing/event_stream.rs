//! kmemtrace's event stream in this kernel (`kmemtrace record ...`,
//! `kmemtrace dump`; not the per-cache trace table): the boot arguments,
//! the nanosecond clock, the build id, and the dump channel (the event
//! rings themselves are `magpie_slab::kmemtrace`).
//!
//! * `kmemtrace=on` records from boot (right after the slab allocator is
//!   up, before the other CPUs start); `kmemtrace.subbufs=N` sizes each
//!   CPU's ring (N sub-buffers of 64 KiB, from `kpages`; default 256).
//! * Timestamps: the TSC, calibrated once at boot (the ACPI PM timer here)
//!   ([`crate::arch::tsc`]), converted to nanoseconds at dump time.
//! * Call sites: [`caller_frames`](crate::tracing::call_site::caller_frames)
//!   walks frame pointers while the return address lies in the allocator's
//!   text, which `boot/linker.ld` gathers in one range
//!   (`__kmem_text_start`..`__kmem_text_end`).
//! * The dump goes to the host over a legacy virtio console
//!   ([`crate::dev::virtio_console`]; QEMU `virtio-serial-pci` + `virtconsole`),
//!   which `boot/run-qemu.sh` connects to `target/kmemtrace/latest.kmt`
//!   (`MAGPIE_KMEMTRACE=FILE`); without one, over QEMU's `isa-debugcon`
//!   (I/O port `0xe9`). Measured with a 5,500-event dump (354 KiB) into a
//!   file chardev under TCG: a second 16550 (line-status read per byte)
//!   196 KiB/s, debugcon 358 KiB/s, the virtio console 32–63 MiB/s. The
//!   byte-wide channels pay one host `write(2)` per byte (debugcon with no
//!   chardev behind it runs at 5.7 MiB/s); the virtio console hands QEMU
//!   64 KiB per notification. 1,000,000 events: about 2 s over virtio,
//!   3 minutes over debugcon.

use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use magpie_slab::{DumpInfo, DumpSummary, KmemtraceConfig, KmemtraceError};

use crate::arch::tsc;
use crate::kmem::SLAB;
use crate::mm::boot_info::BootInfo;

/// I/O port of QEMU's `isa-debugcon` (the dump channel).
pub const DEBUGCON_PORT: u16 = 0xe9;

/// Sub-buffers per CPU from `kmemtrace.subbufs`; 0: sized to memory
/// (`Allocator::kmemtrace_default_subbufs`).
static SUBBUFS: AtomicUsize = AtomicUsize::new(0);
static FROM_BOOT: AtomicBool = AtomicBool::new(false);

/// Reads `kmemtrace=on|off` and `kmemtrace.subbufs=N`; starts recording
/// if asked. Call once, right after the slab allocator is up.
pub fn init(boot: &BootInfo) {
    if let Some(value) = boot.arg("kmemtrace.subbufs") {
        match value.parse::<usize>() {
            Ok(nr) if (1..=1 << 16).contains(&nr) => SUBBUFS.store(nr, Ordering::Relaxed),
            _ => log::warn!(
                "kmemtrace.subbufs={value}: expected 1 to 65536; using {}",
                nr_subbufs()
            ),
        }
    }
    match boot.arg("kmemtrace") {
        None | Some("off") => {}
        Some("on") => {
            FROM_BOOT.store(true, Ordering::Relaxed);
            match start(0, None) {
                Ok(()) => log::info!(
                    "kmemtrace: recording from boot, {} sub-buffers per CPU",
                    nr_subbufs()
                ),
                Err(error) => log::error!("kmemtrace=on: {error}"),
            }
        }
        Some(other) => log::warn!("kmemtrace={other}: expected on or off; off"),
    }
}

/// Sub-buffers per CPU (boot argument `kmemtrace.subbufs`; without it,
/// `magpie_slab::kmemtrace::DEFAULT_SUBBUFS` or fewer, sized to memory).
pub fn nr_subbufs() -> usize {
    match SUBBUFS.load(Ordering::Relaxed) {
        0 => SLAB.kmemtrace_default_subbufs(),
        nr => nr,
    }
}

/// Starts (or restarts) recording: every cache (`cache_id` `None`) or one,
/// with `stack_depth` frames per event (0: call sites only).
///
/// # Errors
/// As [`magpie_slab::Allocator::kmemtrace_start`]: no memory for the rings
/// (nothing kept), a stack depth above the maximum.
pub fn start(stack_depth: usize, cache_id: Option<u32>) -> Result<(), KmemtraceError> {
    let config = KmemtraceConfig {
        nr_subbufs: nr_subbufs(),
        stack_depth,
        cache_id,
        // Only a whole-kernel record begun at boot sees every allocation.
        from_boot: FROM_BOOT.swap(false, Ordering::Relaxed) && cache_id.is_none(),
    };
    SLAB.kmemtrace_start(config)
}

/// Nanoseconds since boot for a TSC reading.
pub fn ticks_to_ns(ticks: u64) -> u64 {
    tsc::cycles_to_ns(ticks)
}

unsafe extern "C" {
    static __build_id_start: u8;
    static __build_id_end: u8;
}

/// The kernel ELF's GNU build id (SHA-1, 20 bytes) from its
/// `.note.gnu.build-id` (kept by `boot/linker.ld`); zeros if absent.
pub fn build_id() -> [u8; 20] {
    // SAFETY: linker-script symbols bracketing the note section, which is
    // mapped read-only with the kernel image.
    let note = unsafe {
        let start = &raw const __build_id_start;
        let end = &raw const __build_id_end;
        core::slice::from_raw_parts(start, (end as usize).saturating_sub(start as usize))
    };
    parse_build_id(note).unwrap_or([0; 20])
}

/// The descriptor of an `NT_GNU_BUILD_ID` note (namesz 4, "GNU\0", type 3,
/// descsz 20).
fn parse_build_id(note: &[u8]) -> Option<[u8; 20]> {
    let word = |at: usize| Some(u32::from_le_bytes(note.get(at..at + 4)?.try_into().ok()?));
    if word(0)? != 4 || word(4)? != 20 || word(8)? != 3 || note.get(12..16)? != b"GNU\0" {
        return None;
    }
    note.get(16..36)?.try_into().ok()
}

/// Writes bytes to the debugcon port: `rep outsb`.
fn debugcon_write(bytes: &[u8]) {
    // SAFETY: `rep outsb` reads `bytes.len()` bytes at `bytes` (valid) and
    // writes them to port 0xe9, QEMU's debugcon (ignored when absent); the
    // direction flag is clear (the ABI guarantees it).
    unsafe {
        core::arch::asm!(
            "rep outsb",
            in("dx") DEBUGCON_PORT,
            inout("rsi") bytes.as_ptr() => _,
            inout("rcx") bytes.len() => _,
            options(nostack, preserves_flags, readonly)
        );
    }
}

/// The channel a dump went out on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Channel {
    /// The legacy virtio console ([`crate::dev::virtio_console`]): bulk.
    VirtioConsole,
    /// QEMU's `isa-debugcon` at [`DEBUGCON_PORT`]: a byte per I/O access.
    Debugcon,
}

impl core::fmt::Display for Channel {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Channel::VirtioConsole => f.write_str("virtio console"),
            Channel::Debugcon => write!(f, "debugcon port {DEBUGCON_PORT:#x}"),
        }
    }
}

/// Sends a dump of the record to the host: over the virtio console when
/// QEMU has one (boot/run-qemu.sh adds it), else over debugcon. Returns
/// what was sent and how. If the virtio console stops answering, the whole
/// dump is sent again over debugcon (the virtio file then ends in a
/// truncated dump, which readers report).
pub fn dump() -> (DumpSummary, Channel) {
    let info = DumpInfo {
        build_id: build_id(),
        ticks_to_ns: &ticks_to_ns,
    };
    if crate::dev::virtio_console::init() {
        let mut ok = true;
        let summary = SLAB.kmemtrace_dump(&info, &mut |bytes| {
            ok = ok && crate::dev::virtio_console::write(bytes);
        });
        if ok && crate::dev::virtio_console::flush() {
            return (summary, Channel::VirtioConsole);
        }
        log::error!("kmemtrace dump: the virtio console stopped answering; dumping over debugcon");
    }
    // Batch the many small pieces (record headers, fields): one `rep
    // outsb` per 4 KiB.
    let mut buffer = [0u8; 4096];
    let mut len = 0;
    let summary = SLAB.kmemtrace_dump(&info, &mut |bytes| {
        if len + bytes.len() > buffer.len() {
            debugcon_write(&buffer[..len]);
            len = 0;
        }
        if bytes.len() > buffer.len() {
            debugcon_write(bytes);
        } else {
            buffer[len..len + bytes.len()].copy_from_slice(bytes);
            len += bytes.len();
        }
    });
    debugcon_write(&buffer[..len]);
    (summary, Channel::Debugcon)
}
