//! Memory images: what `magpie-kmem core` reads kernel virtual memory
//! from. [`ElfCore`] is a QEMU `dump-guest-memory` ELF core (physical
//! memory in `PT_LOAD` segments by physical address, each CPU's state
//! in `QEMU` notes), read through the x86-64 page tables the first CPU's
//! CR3 names, as `crash` reads a kdump. [`ProcessMemory`] is this
//! process (`/proc/self/mem`): the host tests read an allocator they
//! built themselves through the same reader.
//!
//! Every read is checked: an address outside the image, a page not
//! mapped, a segment cut short by a truncated file are an error of that
//! read ([`ReadError`]), never a panic.

use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use object::elf;
use object::read::elf::{ElfFile64, FileHeader, ProgramHeader};
use object::{Endianness, FileKind};

/// A read the image cannot serve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadError {
    /// The virtual address asked for.
    pub addr: u64,
    /// Bytes asked for.
    pub len: usize,
    /// Why (not mapped, outside the image, ...).
    pub why: String,
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cannot read {} bytes at {:#x}: {}",
            self.len, self.addr, self.why
        )
    }
}

impl std::error::Error for ReadError {}

/// Kernel virtual memory, read-only.
pub trait Memory {
    /// Fill `buf` from virtual address `addr`.
    ///
    /// # Errors
    ///
    /// Any byte of the range not in the image.
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), ReadError>;

    /// A little-endian unsigned integer of `size` bytes (1, 2, 4 or 8).
    ///
    /// # Errors
    ///
    /// As [`Memory::read`]; a `size` above 8.
    fn read_uint(&self, addr: u64, size: usize) -> Result<u64, ReadError> {
        if size == 0 || size > 8 {
            return Err(ReadError {
                addr,
                len: size,
                why: format!("a field of {size} bytes is not an integer"),
            });
        }
        let mut bytes = [0u8; 8];
        self.read(addr, &mut bytes[..size])?;
        Ok(u64::from_le_bytes(bytes))
    }
}

/// One CPU's registers from the core's `QEMU` note (QEMUCPUState).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuState {
    /// rax, rbx, rcx, rdx, rsi, rdi, rsp, rbp, r8 ... r15, in that order.
    pub gprs: [u64; 16],
    /// Instruction pointer.
    pub rip: u64,
    /// CR3: the page-table root.
    pub cr3: u64,
}

impl CpuState {
    /// The stack pointer.
    pub fn rsp(&self) -> u64 {
        self.gprs[6]
    }
}

/// A QEMU `dump-guest-memory` ELF core (taken without `paging`: physical
/// addresses).
pub struct ElfCore {
    data: Vec<u8>,
    /// (physical start, physical end, file offset), by start.
    segments: Vec<(u64, u64, u64)>,
    cpus: Vec<CpuState>,
    /// Page-walk results: virtual page -> physical page (or why not).
    walks: RefCell<HashMap<u64, Result<u64, String>>>,
}

/// QEMUCPUState (QEMU `target/i386/arch_dump.c`): offsets of rip and
/// cr[0] in the note's descriptor.
const QEMU_STATE_RIP: usize = 8 + 16 * 8;
const QEMU_STATE_CR0: usize = QEMU_STATE_RIP + 16 + 10 * 24;

impl ElfCore {
    /// Open a core.
    ///
    /// # Errors
    ///
    /// The file cannot be read, is not a 64-bit ELF core, or has no
    /// memory or no CPU state.
    pub fn open(path: &Path) -> Result<ElfCore, String> {
        let data = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        ElfCore::parse(data).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Parse a core held in memory.
    ///
    /// # Errors
    ///
    /// As [`ElfCore::open`].
    pub fn parse(data: Vec<u8>) -> Result<ElfCore, String> {
        if FileKind::parse(&*data).ok() != Some(FileKind::Elf64) {
            return Err("not a 64-bit ELF file (a QEMU dump-guest-memory core?)".into());
        }
        let (segments, cpus) = {
            let file = ElfFile64::<Endianness, _>::parse(&*data)
                .map_err(|e| format!("not a readable ELF core: {e}"))?;
            let endian = file.endian();
            if file.elf_header().e_type(endian) != elf::ET_CORE {
                return Err("an ELF file but not a core (e_type is not ET_CORE)".into());
            }
            let mut segments = Vec::new();
            let mut cpus = Vec::new();
            for header in file.elf_program_headers() {
                match header.p_type(endian) {
                    elf::PT_LOAD => {
                        let start = header.p_paddr(endian);
                        let size = header.p_filesz(endian);
                        let offset = header.p_offset(endian);
                        // A truncated core: keep what the file holds.
                        let held = (data.len() as u64).saturating_sub(offset).min(size);
                        if held > 0 {
                            segments.push((start, start + held, offset));
                        }
                    }
                    elf::PT_NOTE => {
                        let Ok(Some(mut notes)) = header.notes(endian, &*data) else {
                            continue;
                        };
                        while let Ok(Some(note)) = notes.next() {
                            if note.name() == b"QEMU"
                                && let Some(state) = parse_qemu_state(note.desc())
                            {
                                cpus.push(state);
                            }
                        }
                    }
                    _ => {}
                }
            }
            (segments, cpus)
        };
        if segments.is_empty() {
            return Err("the core holds no memory (no PT_LOAD segment)".into());
        }
        if cpus.is_empty() {
            return Err(
                "the core holds no CPU state (no QEMU note): take it with QEMU's dump-guest-memory"
                    .into(),
            );
        }
        let mut segments = segments;
        segments.sort_unstable();
        Ok(ElfCore {
            data,
            segments,
            cpus,
            walks: RefCell::new(HashMap::new()),
        })
    }

    /// Each CPU's registers, in CPU order.
    pub fn cpus(&self) -> &[CpuState] {
        &self.cpus
    }

    /// Bytes of physical memory in the core.
    pub fn physical_bytes(&self) -> u64 {
        self.segments
            .iter()
            .map(|(start, end, _)| end - start)
            .sum()
    }

    /// The physical ranges held, `(start, end)`.
    pub fn physical_ranges(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.segments.iter().map(|&(start, end, _)| (start, end))
    }

    /// Bytes at physical address `addr`, as far as its segment goes.
    pub fn physical(&self, addr: u64) -> Option<&[u8]> {
        let index = self
            .segments
            .partition_point(|&(start, _, _)| start <= addr)
            .checked_sub(1)?;
        let (start, end, offset) = self.segments[index];
        if addr >= end {
            return None;
        }
        let from = usize::try_from(offset + (addr - start)).ok()?;
        let to = usize::try_from(offset + (end - start)).ok()?;
        self.data.get(from..to)
    }

    fn physical_u64(&self, addr: u64) -> Result<u64, String> {
        let bytes = self
            .physical(addr)
            .and_then(|b| b.get(..8))
            .ok_or_else(|| format!("page-table entry at physical {addr:#x} not in the core"))?;
        Ok(u64::from_le_bytes(bytes.try_into().unwrap_or_default()))
    }

    /// The x86-64 4-level walk of virtual page `page` (its address with
    /// the low 12 bits clear) from the first CPU's CR3.
    fn walk(&self, page: u64) -> Result<u64, String> {
        const PRESENT: u64 = 1;
        const HUGE: u64 = 1 << 7;
        const ADDR: u64 = 0x000f_ffff_ffff_f000;
        let mut table = self.cpus[0].cr3 & ADDR;
        for level in (0..4).rev() {
            let shift = 12 + 9 * level;
            let index = (page >> shift) & 511;
            let entry = self.physical_u64(table + index * 8)?;
            if entry & PRESENT == 0 {
                return Err("not mapped".into());
            }
            if level == 0 || (level <= 2 && entry & HUGE != 0) {
                let size = 1u64 << shift;
                let frame = entry & ADDR & !(size - 1);
                return Ok(frame + (page & (size - 1)));
            }
            table = entry & ADDR;
        }
        Err("not mapped".into())
    }

    /// The physical address of virtual `addr`.
    ///
    /// # Errors
    ///
    /// Not mapped by the page tables, or the tables are not in the core.
    pub fn translate(&self, addr: u64) -> Result<u64, String> {
        let page = addr & !0xfff;
        let cached = self.walks.borrow().get(&page).cloned();
        let physical = match cached {
            Some(result) => result,
            None => {
                let result = self.walk(page);
                self.walks.borrow_mut().insert(page, result.clone());
                result
            }
        }?;
        Ok(physical + (addr & 0xfff))
    }
}

fn parse_qemu_state(desc: &[u8]) -> Option<CpuState> {
    let word = |at: usize| -> Option<u64> {
        Some(u64::from_le_bytes(desc.get(at..at + 8)?.try_into().ok()?))
    };
    let mut gprs = [0u64; 16];
    for (index, slot) in gprs.iter_mut().enumerate() {
        *slot = word(8 + index * 8)?;
    }
    Some(CpuState {
        gprs,
        rip: word(QEMU_STATE_RIP)?,
        cr3: word(QEMU_STATE_CR0 + 3 * 8)?,
    })
}

impl Memory for ElfCore {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), ReadError> {
        let mut done = 0;
        while done < buf.len() {
            let at = addr.wrapping_add(done as u64);
            let error = |why: String| ReadError {
                addr,
                len: buf.len(),
                why,
            };
            let physical = self
                .translate(at)
                .map_err(|why| error(format!("{at:#x} {why}")))?;
            let in_page = (0x1000 - (at & 0xfff)) as usize;
            let want = in_page.min(buf.len() - done);
            let bytes = self
                .physical(physical)
                .and_then(|b| b.get(..want))
                .ok_or_else(|| error(format!("physical {physical:#x} not in the core")))?;
            buf[done..done + want].copy_from_slice(bytes);
            done += want;
        }
        Ok(())
    }
}

/// This process's memory, through `/proc/self/mem` (a read of an
/// unmapped address fails instead of faulting).
pub struct ProcessMemory {
    file: File,
}

impl ProcessMemory {
    /// Open `/proc/self/mem`.
    ///
    /// # Errors
    ///
    /// The file cannot be opened (not Linux, or no procfs).
    pub fn open() -> Result<ProcessMemory, String> {
        let file = File::open("/proc/self/mem").map_err(|e| format!("/proc/self/mem: {e}"))?;
        Ok(ProcessMemory { file })
    }
}

impl Memory for ProcessMemory {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), ReadError> {
        self.file.read_exact_at(buf, addr).map_err(|e| ReadError {
            addr,
            len: buf.len(),
            why: e.to_string(),
        })
    }
}
