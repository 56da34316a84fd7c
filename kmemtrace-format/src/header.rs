//! The 64-byte dump header.

use crate::{
    DumpFormatError, EVENT_SIZE, HEADER_FLAG_FROM_BOOT, HEADER_FLAG_STACKS, HEADER_SIZE,
    KMEMTRACE_ABI_VERSION, KMEMTRACE_MAGIC, le_array, le_u32, le_u64,
};

/// The 64-byte dump header: magic (offset 0), `abi_version` u32 (8),
/// `header_size` u32 (12), `event_size` u32 (16), then these fields at
/// offsets 20, 24, 44, 48 and 56; 4 reserved bytes at 60. The constant
/// fields are written by [`Self::to_bytes`] and checked by
/// [`Self::from_bytes`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct KmemtraceHeader {
    /// CPUs the kernel runs (ids `0..nr_cpus`, at most `u16::MAX`).
    pub nr_cpus: u32,
    /// The kernel ELF's GNU build id (`NT_GNU_BUILD_ID`, SHA-1), zero if
    /// none.
    pub build_id: [u8; 20],
    /// [`HEADER_FLAG_STACKS`], [`HEADER_FLAG_FROM_BOOT`].
    pub flags: u32,
    /// When recording started, nanoseconds since boot.
    pub record_start_ns: u64,
    /// Most frames per stack (0: no stacks).
    pub stack_depth: u32,
}

impl KmemtraceHeader {
    /// The header's bytes: magic, ABI version, sizes, then the fields.
    pub fn to_bytes(&self) -> [u8; HEADER_SIZE] {
        let mut out = [0u8; HEADER_SIZE];
        out[0..8].copy_from_slice(&KMEMTRACE_MAGIC);
        out[8..12].copy_from_slice(&KMEMTRACE_ABI_VERSION.to_le_bytes());
        out[12..16].copy_from_slice(&(HEADER_SIZE as u32).to_le_bytes());
        out[16..20].copy_from_slice(&(EVENT_SIZE as u32).to_le_bytes());
        out[20..24].copy_from_slice(&self.nr_cpus.to_le_bytes());
        out[24..44].copy_from_slice(&self.build_id);
        out[44..48].copy_from_slice(&self.flags.to_le_bytes());
        out[48..56].copy_from_slice(&self.record_start_ns.to_le_bytes());
        out[56..60].copy_from_slice(&self.stack_depth.to_le_bytes());
        out
    }

    /// Parse the header at the start of `bytes` (which may go on with the
    /// records).
    ///
    /// # Errors
    /// In the order checked: [`DumpFormatError::BadMagic`] (the bytes that
    /// are there do not begin the magic), [`DumpFormatError::Truncated`]
    /// (fewer than [`HEADER_SIZE`] bytes), [`DumpFormatError::AbiVersion`],
    /// [`DumpFormatError::HeaderSize`], [`DumpFormatError::EventSize`],
    /// [`DumpFormatError::NrCpus`].
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, DumpFormatError> {
        let magic_len = bytes.len().min(KMEMTRACE_MAGIC.len());
        if bytes[..magic_len] != KMEMTRACE_MAGIC[..magic_len] {
            return Err(DumpFormatError::BadMagic);
        }
        let bytes = bytes.get(..HEADER_SIZE).ok_or(DumpFormatError::Truncated)?;
        let abi_version = le_u32(bytes, 8);
        if abi_version != KMEMTRACE_ABI_VERSION {
            return Err(DumpFormatError::AbiVersion(abi_version));
        }
        let header_size = le_u32(bytes, 12);
        if header_size as usize != HEADER_SIZE {
            return Err(DumpFormatError::HeaderSize(header_size));
        }
        let event_size = le_u32(bytes, 16);
        if event_size as usize != EVENT_SIZE {
            return Err(DumpFormatError::EventSize(event_size));
        }
        let nr_cpus = le_u32(bytes, 20);
        if nr_cpus == 0 || nr_cpus > u32::from(u16::MAX) {
            return Err(DumpFormatError::NrCpus(nr_cpus));
        }
        Ok(KmemtraceHeader {
            nr_cpus,
            build_id: le_array(&bytes[24..44]),
            flags: le_u32(bytes, 44),
            record_start_ns: le_u64(bytes, 48),
            stack_depth: le_u32(bytes, 56),
        })
    }

    /// Whether events carry stack ids ([`HEADER_FLAG_STACKS`]).
    pub fn has_stacks(&self) -> bool {
        self.flags & HEADER_FLAG_STACKS != 0
    }

    /// Whether recording began at boot ([`HEADER_FLAG_FROM_BOOT`]).
    pub fn from_boot(&self) -> bool {
        self.flags & HEADER_FLAG_FROM_BOOT != 0
    }

    /// Whether the build id is set (not all zero).
    pub fn has_build_id(&self) -> bool {
        self.build_id.iter().any(|&byte| byte != 0)
    }
}
