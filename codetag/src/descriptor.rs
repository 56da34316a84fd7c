//! The code tags' debug descriptor: where a post-mortem reader finds the
//! allocation tags and their counters in a memory image (after Linux's
//! `vmcoreinfo`; `magpie-kmem core CORE allocinfo` and `findleaks` read
//! it, docs/VMCORE.md), as `magpie_slab::descriptor` does for the slab
//! allocator.
//!
//! One `#[used]`, `repr(C)` static, [`MAGPIE_CODETAG_DESCRIPTOR`] (an
//! unmangled symbol of that name, or found by its 16-byte magic): the
//! layout of [`AllocTag`] and of the per-CPU counters, computed when the
//! crate is compiled, and, written by the first
//! [`AllocTagCounters::init`] that succeeds, where the tag section and
//! those counters are. A program that never initialises counters has an
//! empty one (`counters` 0).
//!
//! All fields are little-endian `u64`s after the 24-byte header; a
//! reader checks the magic and the version and bounds every figure.

use core::mem::{offset_of, size_of};
use core::sync::atomic::{AtomicU64, Ordering};

use crate::CodeTag;
use crate::alloc_tag::{
    AllocTag, AllocTagCounters, ProfilingSwitch, SWITCH_NEVER, SWITCH_ON, TagCounter, UNTAGGED_FLAG,
};

/// The descriptor's first 16 bytes.
pub const CODETAG_DESCRIPTOR_MAGIC: [u8; 16] = *b"MAGPIE-CODETAG-D";

/// The format version (docs/VMCORE.md).
pub const CODETAG_DESCRIPTOR_VERSION: u32 = 1;

/// The descriptor's symbol in a kernel ELF.
pub const CODETAG_DESCRIPTOR_SYMBOL: &str = "MAGPIE_CODETAG_DESCRIPTOR";

/// The descriptor (see the module docs; docs/VMCORE.md gives the format).
#[repr(C)]
#[derive(Debug)]
pub struct CodetagDescriptor {
    /// [`CODETAG_DESCRIPTOR_MAGIC`].
    pub magic: [u8; 16],
    /// [`CODETAG_DESCRIPTOR_VERSION`].
    pub version: u32,
    /// Bytes of the descriptor.
    pub size: u32,
    /// The described counters' address; 0 until their `init`.
    pub counters: AtomicU64,
    /// The first allocation tag (the section's start).
    pub tags: AtomicU64,
    /// Tags in the section.
    pub nr_tags: AtomicU64,
    /// Bytes per tag ([`AllocTag`]).
    pub tag_size: u64,
    /// A tag's source file (`&str`: a pointer and a length, 16 bytes, in
    /// the order the compiler chose: the pointer is the larger word).
    pub tag_file: u64,
    /// A tag's module path (`&str`).
    pub tag_module: u64,
    /// A tag's line (`u32`).
    pub tag_line: u64,
    /// A tag's flags (`u32`).
    pub tag_flags: u64,
    /// A tag's function-path function (a code address: its symbol names
    /// the function the tag sits in).
    pub tag_function_path: u64,
    /// The flag bit of the `untagged` bucket.
    pub untagged_flag: u64,
    /// Bytes per counter; a charge token is the tag reference times this
    /// (the tag reference is the tag's index plus one).
    pub counter_size: u64,
    /// A counter's live bytes (`u64`, wrapping per CPU).
    pub counter_bytes: u64,
    /// A counter's live calls (`u64`, wrapping per CPU).
    pub counter_calls: u64,
    /// The counters' per-CPU blocks (a pointer).
    pub counters_blocks: u64,
    /// The counters' CPUs (`usize`).
    pub counters_nr_cpus: u64,
    /// Bytes per CPU block (`usize`): CPU `c`'s counter of tag reference
    /// `r` is at `blocks + c * block_bytes + (r - 1) * counter_size`.
    pub counters_block_bytes: u64,
    /// Tags the counters count (`usize`; 0 until init).
    pub counters_nr_tags: u64,
    /// The described profiling switch's address ([`describe_switch`]); 0:
    /// none (a reader takes profiling as on, the counts as accurate).
    pub switch: AtomicU64,
    /// The switch's state byte: [`CodetagDescriptor::switch_on`],
    /// [`CodetagDescriptor::switch_never`] or off.
    pub switch_state: u64,
    /// The switch's byte that is 1 once counts may have missed
    /// allocations (profiling turned on after being off).
    pub switch_inaccurate: u64,
    /// The state byte of a switch that is on.
    pub switch_on: u64,
    /// The state byte of a switch that is off for good (`never`).
    pub switch_never: u64,
}

/// The descriptor of this program's allocation tags.
#[used]
#[allow(
    unsafe_code,
    reason = "an unmangled symbol, so that a reader finds it in the ELF"
)]
#[unsafe(no_mangle)]
pub static MAGPIE_CODETAG_DESCRIPTOR: CodetagDescriptor = CodetagDescriptor {
    magic: CODETAG_DESCRIPTOR_MAGIC,
    version: CODETAG_DESCRIPTOR_VERSION,
    size: size_of::<CodetagDescriptor>() as u32,
    counters: AtomicU64::new(0),
    tags: AtomicU64::new(0),
    nr_tags: AtomicU64::new(0),
    tag_size: size_of::<AllocTag>() as u64,
    tag_file: (offset_of!(AllocTag, tag) + offset_of!(CodeTag, file)) as u64,
    tag_module: (offset_of!(AllocTag, tag) + offset_of!(CodeTag, module)) as u64,
    tag_line: (offset_of!(AllocTag, tag) + offset_of!(CodeTag, line)) as u64,
    tag_flags: (offset_of!(AllocTag, tag) + offset_of!(CodeTag, flags)) as u64,
    tag_function_path: (offset_of!(AllocTag, tag) + offset_of!(CodeTag, function_path)) as u64,
    untagged_flag: UNTAGGED_FLAG.0 as u64,
    counter_size: size_of::<TagCounter>() as u64,
    counter_bytes: offset_of!(TagCounter, bytes) as u64,
    counter_calls: offset_of!(TagCounter, calls) as u64,
    counters_blocks: offset_of!(AllocTagCounters, blocks) as u64,
    counters_nr_cpus: offset_of!(AllocTagCounters, nr_cpus) as u64,
    counters_block_bytes: offset_of!(AllocTagCounters, block_bytes) as u64,
    counters_nr_tags: offset_of!(AllocTagCounters, nr_tags) as u64,
    switch: AtomicU64::new(0),
    switch_state: offset_of!(ProfilingSwitch, state) as u64,
    switch_inaccurate: offset_of!(ProfilingSwitch, inaccurate) as u64,
    switch_on: SWITCH_ON as u64,
    switch_never: SWITCH_NEVER as u64,
};

/// Describe the kernel's profiling switch (`mem_profiling`, `allocinfo
/// on|off`), so that a reader of a memory image prints what the kernel's
/// `allocinfo` prints: whether counts are accurate, whether profiling is
/// off. A later call replaces it.
pub fn describe_switch(switch: &'static ProfilingSwitch) {
    MAGPIE_CODETAG_DESCRIPTOR
        .switch
        .store(core::ptr::from_ref(switch) as u64, Ordering::Release);
}

/// Describe `counters` and the tag section (called by
/// [`AllocTagCounters::init`] once it gave them memory): the first
/// counters initialised are the ones described.
pub(crate) fn register(counters: &AllocTagCounters) {
    let descriptor = &MAGPIE_CODETAG_DESCRIPTOR;
    if descriptor.counters.load(Ordering::Acquire) != 0 {
        return;
    }
    let tags = AllocTag::all();
    descriptor
        .tags
        .store(tags.as_ptr() as u64, Ordering::Relaxed);
    descriptor
        .nr_tags
        .store(tags.len() as u64, Ordering::Relaxed);
    // Published last: a reader that sees the counters sees the rest.
    let _ = descriptor.counters.compare_exchange(
        0,
        core::ptr::from_ref(counters) as u64,
        Ordering::Release,
        Ordering::Relaxed,
    );
}

// docs/VMCORE.md gives these offsets.
const _: () = assert!(offset_of!(CodetagDescriptor, counters) == 24);
const _: () = assert!(offset_of!(CodetagDescriptor, counters_nr_tags) == 152);
const _: () = assert!(offset_of!(CodetagDescriptor, switch_never) == 192);
