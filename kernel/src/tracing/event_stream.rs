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
//!   (`MAGPIE_KMEMTRACE=FILE`). Its queue and bounce buffer are set up at
//!   boot ([`init`]) and, if that failed, again when recording starts
//!   ([`start`]), never at the moment of the dump: a dump taken when memory
//!   has run out still goes out. Without the device (`MAGPIE_KMEMTRACE=none`,
//!   or a QEMU started by hand) there is no channel and [`dump`] refuses,
//!   sending nothing and keeping the record. Earlier versions fell back to
//!   QEMU's `isa-debugcon`, which the runner never connected, so such a
//!   dump vanished while the shell reported it sent. Measured with a
//!   5,500-event dump (354 KiB) into a file chardev under TCG: a second
//!   16550 (line-status read per byte) 196 KiB/s, debugcon 358 KiB/s, the
//!   virtio console 32–63 MiB/s (it hands QEMU 64 KiB per notification).
//!   1,000,000 events: about 2 s over virtio.

use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use magpie_slab::kmemtrace::{DumpInfo, DumpSummary, KmemtraceConfig, KmemtraceError};

use crate::arch::tsc;
use crate::kmem::SLAB;
use crate::mm::boot_info::BootInfo;

/// Sub-buffers per CPU from `kmemtrace.subbufs`; 0: sized to memory
/// (`kmemtrace::Kmemtrace::default_subbufs`).
static SUBBUFS: AtomicUsize = AtomicUsize::new(0);
static FROM_BOOT: AtomicBool = AtomicBool::new(false);

/// Sets up the dump channel (the virtio console, when QEMU has one), reads
/// `kmemtrace=on|off` and `kmemtrace.subbufs=N`, and starts recording if
/// asked. Call once, right after the slab allocator is up.
pub fn init(boot: &BootInfo) {
    if !crate::dev::virtio_console::init() {
        log::info!(
            "kmemtrace: no virtio console, so no dump channel ('kmemtrace dump' will refuse)"
        );
    }
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
        0 => SLAB.kmemtrace().default_subbufs(),
        nr => nr,
    }
}

/// Starts (or restarts) recording: every cache (`cache_id` `None`) or one,
/// with `stack_depth` frames per event (0: call sites only).
///
/// Sets up the dump channel first if boot could not (see [`dump_channel`]
/// for whether there is one).
///
/// # Errors
/// As [`magpie_slab::kmemtrace::Kmemtrace::start`]: no memory for the rings
/// (nothing kept), a stack depth above the maximum.
pub fn start(stack_depth: usize, cache_id: Option<u32>) -> Result<(), KmemtraceError> {
    crate::dev::virtio_console::init();
    // The rings' memory comes from kpages inside the allocator: this call
    // site is its fault point, failing as the allocator does when kpages
    // runs out (nothing kept).
    if crate::alloc_fault!() {
        let bytes = crate::arch::max_cpus()
            * nr_subbufs()
            * magpie_slab::kmemtrace::SUBBUF_PAGES
            * crate::mm::frame::PAGE_SIZE;
        return Err(KmemtraceError::OutOfMemory { bytes });
    }
    let config = KmemtraceConfig {
        nr_subbufs: nr_subbufs(),
        stack_depth,
        cache_id,
        // Only a whole-kernel record begun at boot sees every allocation.
        from_boot: FROM_BOOT.swap(false, Ordering::Relaxed) && cache_id.is_none(),
    };
    SLAB.kmemtrace().start(config)
}

/// Marks `line` (a shell command) in the record, if one is being made:
/// the dump's MARK records, drawn by `magpie-kmem` as markers.
pub fn mark(line: &str) {
    let line = line.trim();
    if !line.is_empty() {
        SLAB.kmemtrace().mark(line);
    }
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

/// The channel a dump goes out on, when there is one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Channel {
    /// The legacy virtio console ([`crate::dev::virtio_console`]): bulk.
    VirtioConsole,
}

impl core::fmt::Display for Channel {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Channel::VirtioConsole => f.write_str("virtio console"),
        }
    }
}

/// The dump channel set up at boot or at the last `start`, if any.
pub fn dump_channel() -> Option<Channel> {
    crate::dev::virtio_console::is_present().then_some(Channel::VirtioConsole)
}

/// Why a dump did not reach the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DumpError {
    /// No dump channel (no virtio console): nothing was sent, the record
    /// is kept.
    NoChannel,
    /// The virtio console stopped taking data part way: the host file ends
    /// in a truncated dump (readers report it); the record is kept.
    ChannelFailed {
        /// What the dump would have been.
        summary: DumpSummary,
    },
}

impl core::fmt::Display for DumpError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            DumpError::NoChannel => f.write_str(
                "no dump channel: QEMU has no virtio console (boot/run-qemu.sh connects one \
                 to MAGPIE_KMEMTRACE, default target/kmemtrace/latest.kmt); nothing sent, \
                 the record is kept",
            ),
            DumpError::ChannelFailed { summary } => write!(
                f,
                "the virtio console stopped answering: the host file holds a truncated dump \
                 (of {} bytes); the record is kept, dump again",
                summary.nr_bytes
            ),
        }
    }
}

/// Sends a dump of the record to the host over the dump channel set up
/// at boot or at `start`; allocates nothing. Returns what was sent and
/// how.
///
/// # Errors
/// [`DumpError::NoChannel`] (nothing sent) and
/// [`DumpError::ChannelFailed`] (part sent); the record stays either way.
pub fn dump() -> Result<(DumpSummary, Channel), DumpError> {
    let channel = dump_channel().ok_or(DumpError::NoChannel)?;
    let info = DumpInfo {
        build_id: build_id(),
        ticks_to_ns: &ticks_to_ns,
    };
    let mut ok = true;
    let summary = SLAB.kmemtrace().dump(&info, &mut |bytes| {
        ok = ok && crate::dev::virtio_console::write(bytes);
    });
    if ok && crate::dev::virtio_console::flush() {
        Ok((summary, channel))
    } else {
        Err(DumpError::ChannelFailed { summary })
    }
}
