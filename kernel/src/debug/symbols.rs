//! Kernel symbols and frame-pointer backtraces.
//!
//! The runner passes the kernel ELF itself as the PVH boot module; [`init`]
//! finds it, checks it is the running image (the address of
//! `kernel_entry`), and builds a sorted index of its function symbols from
//! `.symtab`/`.strtab`, in frames from the frame allocator (the module's own
//! frames stay reserved, as the names point into it).
//!
//! [`backtrace`] walks the frame-pointer chain (the kernel is built with
//! frame pointers in every non-leaf function) and checks every frame pointer before reading it,
//! so it never faults. [`Symbolized`] prints `function+0xoff` demangled.

use core::fmt;

use spin::Once;

use crate::mm::boot_info::BootInfo;
use crate::mm::layout::{is_kernel_text, phys_to_virt};
use crate::mm::paging::is_readable;

/// One function symbol in the index.
#[derive(Clone, Copy)]
#[repr(C)]
struct Entry {
    address: u64,
    size: u32,
    name_offset: u32,
}

struct Table {
    entries: &'static [Entry],
    strtab: &'static [u8],
}

static TABLE: Once<Table> = Once::new();

const SHT_SYMTAB: u32 = 2;
const STT_FUNC: u8 = 2;
const STT_NOTYPE: u8 = 0;

fn u16_at(bytes: &[u8], offset: usize) -> Option<u16> {
    Some(u16::from_le_bytes(
        bytes.get(offset..offset + 2)?.try_into().ok()?,
    ))
}
fn u32_at(bytes: &[u8], offset: usize) -> Option<u32> {
    Some(u32::from_le_bytes(
        bytes.get(offset..offset + 4)?.try_into().ok()?,
    ))
}
fn u64_at(bytes: &[u8], offset: usize) -> Option<u64> {
    Some(u64::from_le_bytes(
        bytes.get(offset..offset + 8)?.try_into().ok()?,
    ))
}

fn name_at(strtab: &[u8], offset: usize) -> Option<&str> {
    let tail = strtab.get(offset..)?;
    let len = tail.iter().position(|&byte| byte == 0)?;
    core::str::from_utf8(&tail[..len]).ok()
}

/// Finds `.symtab` and its string table in an ELF64 image.
fn symtab_of(elf: &'static [u8]) -> Option<(&'static [u8], &'static [u8])> {
    if elf.get(..4)? != b"\x7fELF" || elf[4] != 2 {
        return None;
    }
    let section_offset = u64_at(elf, 0x28)? as usize;
    let section_size = u16_at(elf, 0x3a)? as usize;
    let nr_sections = u16_at(elf, 0x3c)? as usize;
    let section = |index: usize| -> Option<(u32, u32, usize, usize)> {
        let header = section_offset.checked_add(index.checked_mul(section_size)?)?;
        let kind = u32_at(elf, header + 4)?;
        let offset = u64_at(elf, header + 0x18)? as usize;
        let size = u64_at(elf, header + 0x20)? as usize;
        let link = u32_at(elf, header + 0x28)?;
        Some((kind, link, offset, size))
    };
    let (_, link, offset, size) = (0..nr_sections)
        .filter_map(section)
        .find(|&(kind, ..)| kind == SHT_SYMTAB)?;
    let (_, _, strtab_offset, strtab_size) = section(link as usize)?;
    Some((
        elf.get(offset..offset.checked_add(size)?)?,
        elf.get(strtab_offset..strtab_offset.checked_add(strtab_size)?)?,
    ))
}

/// Builds the symbol index from the boot module holding the kernel ELF.
pub(crate) fn init(boot: &BootInfo) {
    for module in boot.modules {
        // SAFETY: boot modules are RAM reserved by the frame allocator for
        // the kernel's lifetime and mapped by the direct map.
        let elf: &'static [u8] = unsafe {
            core::slice::from_raw_parts(
                phys_to_virt(module.start) as *const u8,
                module.size as usize,
            )
        };
        let Some((symtab, strtab)) = symtab_of(elf) else {
            continue;
        };
        if let Some(table) = build(symtab, strtab) {
            log::debug!(
                "{} functions from module at {:#x}",
                table.entries.len(),
                module.start
            );
            TABLE.call_once(|| table);
            return;
        }
    }
    log::warn!("no kernel ELF module (run through boot/run-qemu.sh); backtraces are unsymbolized");
}

#[expect(
    clippy::cast_ptr_alignment,
    reason = "frame::alloc_zeroed returns page-aligned memory"
)]
fn build(symtab: &'static [u8], strtab: &'static [u8]) -> Option<Table> {
    const SYMBOL_SIZE: usize = 24;
    let symbols = || {
        symtab.chunks_exact(SYMBOL_SIZE).filter_map(|symbol| {
            let name_offset = u32_at(symbol, 0)?;
            let kind = symbol[4] & 0xf;
            let address = u64_at(symbol, 8)?;
            let size = u64_at(symbol, 16)?;
            ((kind == STT_FUNC || kind == STT_NOTYPE)
                && name_offset != 0
                && is_kernel_text(address as usize))
            .then_some(Entry {
                address,
                size: size.min(u32::MAX as u64) as u32,
                name_offset,
            })
        })
    };
    // Is this the running kernel? Its `kernel_entry` must be where ours is.
    let entry_point = crate::kernel_entry as *const () as u64;
    let matches = symbols().any(|entry| {
        entry.address == entry_point
            && name_at(strtab, entry.name_offset as usize) == Some("kernel_entry")
    });
    if !matches {
        log::warn!("boot module is not this kernel's ELF; ignoring it");
        return None;
    }
    let nr_entries = symbols().count();
    let nr_pages = (nr_entries * size_of::<Entry>())
        .div_ceil(crate::mm::frame::PAGE_SIZE)
        .max(1);
    let memory = crate::mm::frame::alloc_zeroed(nr_pages)?.cast::<Entry>();
    // SAFETY: freshly allocated, zeroed frames big enough for nr_entries
    // entries, owned by the index forever; Entry is plain data (zero is valid).
    let entries: &'static mut [Entry] =
        unsafe { core::slice::from_raw_parts_mut(memory, nr_entries) };
    for (slot, entry) in entries.iter_mut().zip(symbols()) {
        *slot = entry;
    }
    // Among symbols at one address the largest (a sized function) sorts last and wins.
    entries.sort_unstable_by_key(|entry| (entry.address, entry.size));
    Some(Table { entries, strtab })
}

/// The function containing `address`: its (mangled) name and the offset of
/// `address` from its start. `None` outside kernel text or without symbols.
pub fn lookup(address: usize) -> Option<(&'static str, usize)> {
    let table = TABLE.get()?;
    if !is_kernel_text(address) {
        return None;
    }
    let address = address as u64;
    let index = table
        .entries
        .partition_point(|entry| entry.address <= address)
        .checked_sub(1)?;
    let entry = &table.entries[index];
    // `<=`: a return address after a call to a function that never returns
    // is one past the end of its caller.
    if entry.size != 0 && address > entry.address + u64::from(entry.size) {
        return None;
    }
    Some((
        name_at(table.strtab, entry.name_offset as usize)?,
        (address - entry.address) as usize,
    ))
}

/// The start address of the function named `name` (mangled or demangled
/// without hash), if any. Linear search: for tests and debugging.
pub fn address_of(name: &str) -> Option<usize> {
    let table = TABLE.get()?;
    table.entries.iter().find_map(|entry| {
        let symbol = name_at(table.strtab, entry.name_offset as usize)?;
        let matches = symbol == name || {
            let mut buffer = NameBuffer::new();
            let _ = fmt::write(
                &mut buffer,
                format_args!("{:#}", rustc_demangle::demangle(symbol)),
            );
            buffer.as_str() == name
        };
        matches.then_some(entry.address as usize)
    })
}

/// Whether symbols were loaded.
pub fn available() -> bool {
    TABLE.get().is_some()
}

/// Displays an address as `function+0xoff` (demangled, without the hash), or
/// `?` when it is not in a known function.
#[derive(Clone, Copy)]
pub struct Symbolized(pub usize);

impl fmt::Display for Symbolized {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match lookup(self.0) {
            Some((name, offset)) => write!(f, "{:#}+{:#x}", rustc_demangle::demangle(name), offset),
            None => f.write_str("?"),
        }
    }
}

/// A demangled symbol name (without hash) for display.
pub fn demangled(name: &str) -> impl fmt::Display + '_ {
    struct Demangled<'a>(&'a str);
    impl fmt::Display for Demangled<'_> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "{:#}", rustc_demangle::demangle(self.0))
        }
    }
    Demangled(name)
}

struct NameBuffer {
    bytes: [u8; 256],
    len: usize,
}

impl NameBuffer {
    fn new() -> Self {
        Self {
            bytes: [0; 256],
            len: 0,
        }
    }
    fn as_str(&self) -> &str {
        core::str::from_utf8(&self.bytes[..self.len]).unwrap_or("")
    }
}

impl fmt::Write for NameBuffer {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let room = self.bytes.len() - self.len;
        if s.len() > room {
            return Err(fmt::Error);
        }
        self.bytes[self.len..self.len + s.len()].copy_from_slice(s.as_bytes());
        self.len += s.len();
        Ok(())
    }
}

/// Reads the word at `address` if it is readable kernel memory and aligned.
pub fn read_frame_word(address: usize) -> Option<usize> {
    if address == 0 || !address.is_multiple_of(8) || !is_readable(address, 8) {
        return None;
    }
    // SAFETY: the address is aligned and is_readable checked it is mapped kernel memory.
    Some(unsafe { core::ptr::read_volatile(address as *const usize) })
}

/// Fills `out` with return addresses, walking frame pointers from `frame_pointer`.
/// Stops at a null, unaligned, unreadable or non-increasing frame pointer,
/// or a return address outside kernel text. Never faults.
pub fn backtrace_from(frame_pointer: usize, out: &mut [usize]) -> usize {
    magpie_slab::reports::backtrace::walk_frames(
        frame_pointer,
        out,
        &read_frame_word,
        &is_kernel_text,
    )
}

/// Captures the caller's backtrace into `out` (return addresses, innermost
/// first: `out[0]` is in the function that called `backtrace`). Returns the
/// number of entries written.
#[inline(never)]
pub fn backtrace(out: &mut [usize]) -> usize {
    let frame_pointer: usize;
    // SAFETY: reads RBP, this function's own frame pointer (it calls out,
    // so it has one: `-C force-frame-pointers=non-leaf`).
    unsafe {
        core::arch::asm!("mov {}, rbp", out(reg) frame_pointer, options(nomem, nostack, preserves_flags))
    };
    backtrace_from(frame_pointer, out)
}

/// Prints a symbolized backtrace of the caller to `out`, one frame per line.
///
/// # Errors
///
/// The error of `out` (`fmt::Error`), as is.
pub fn write_backtrace(out: &mut dyn fmt::Write, indent: &str) -> fmt::Result {
    let mut trace = [0usize; 32];
    let depth = backtrace(&mut trace);
    write_trace(out, indent, 0, &trace[..depth])
}

/// Prints `trace` symbolized, one frame per line numbered from
/// `first_index`; runs of one repeated address (recursion) are collapsed.
///
/// # Errors
///
/// The error of `out` (`fmt::Error`), as is.
pub fn write_trace(
    out: &mut dyn fmt::Write,
    indent: &str,
    first_index: usize,
    trace: &[usize],
) -> fmt::Result {
    let mut index = 0;
    while index < trace.len() {
        let address = trace[index];
        writeln!(
            out,
            "{indent}#{:<2} {address:#018x} {}",
            first_index + index,
            Symbolized(address)
        )?;
        let repeats = trace[index + 1..]
            .iter()
            .take_while(|&&next| next == address)
            .count();
        if repeats > 1 {
            writeln!(out, "{indent}    ... the same frame {repeats} more times")?;
            index += repeats;
        }
        index += 1;
    }
    Ok(())
}
