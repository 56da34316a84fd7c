//! The code tags' descriptor in an image (`magpie_codetag::descriptor`,
//! docs/VMCORE.md): the allocation tags (file, line, the function from
//! the kernel ELF's symbols), their per-CPU counters and the profiling
//! switch, read with every figure bounded.

use magpie_codetag::alloc_tag::AllocTagCounts;
use magpie_codetag::descriptor::{
    CODETAG_DESCRIPTOR_MAGIC, CODETAG_DESCRIPTOR_VERSION, CodetagDescriptor,
};

use super::image::Memory;
use super::trace::KernelSymbols;

/// The fields of [`CodetagDescriptor`] a reader uses.
#[derive(Debug, Clone, Copy)]
struct CodetagDescriptorFields {
    tags: u64,
    nr_tags: u64,
    tag_size: u64,
    tag_file: u64,
    tag_line: u64,
    tag_flags: u64,
    tag_function_path: u64,
    untagged_flag: u64,
    counter_size: u64,
}

/// Read the code tags' descriptor at `addr`.
///
/// # Errors
///
/// Unreadable, wrong magic or version, or corrupt figures.
pub fn read_codetag_descriptor(
    mem: &dyn Memory,
    addr: u64,
) -> Result<CodetagDescriptorRead, String> {
    let mut bytes = vec![0u8; size_of::<CodetagDescriptor>()];
    mem.read(addr, &mut bytes)
        .map_err(|e| format!("the code tags' descriptor: {e}"))?;
    if bytes[..16] != CODETAG_DESCRIPTOR_MAGIC {
        return Err(format!(
            "no code tags' descriptor at {addr:#x} (wrong magic)"
        ));
    }
    let version = u32::from_le_bytes(bytes[16..20].try_into().unwrap_or_default());
    if version != CODETAG_DESCRIPTOR_VERSION {
        return Err(format!(
            "the code tags' descriptor has version {version}; this magpie-kmem reads version {CODETAG_DESCRIPTOR_VERSION}"
        ));
    }
    let word = |offset: usize| {
        u64::from_le_bytes(bytes[offset..offset + 8].try_into().unwrap_or_default())
    };
    macro_rules! at {
        ($field:ident) => {
            word(std::mem::offset_of!(CodetagDescriptor, $field))
        };
    }
    let read = CodetagDescriptorRead {
        counters: at!(counters),
        fields: CodetagDescriptorFields {
            tags: at!(tags),
            nr_tags: at!(nr_tags),
            tag_size: at!(tag_size),
            tag_file: at!(tag_file),
            tag_line: at!(tag_line),
            tag_flags: at!(tag_flags),
            tag_function_path: at!(tag_function_path),
            untagged_flag: at!(untagged_flag),
            counter_size: at!(counter_size),
        },
        counters_blocks: at!(counters_blocks),
        counters_nr_cpus: at!(counters_nr_cpus),
        counters_block_bytes: at!(counters_block_bytes),
        counters_nr_tags: at!(counters_nr_tags),
        counter_bytes: at!(counter_bytes),
        counter_calls: at!(counter_calls),
        switch: at!(switch),
        switch_state: at!(switch_state),
        switch_inaccurate: at!(switch_inaccurate),
        switch_on: at!(switch_on),
        switch_never: at!(switch_never),
    };
    let f = &read.fields;
    if f.tag_size == 0
        || f.tag_size > 1 << 12
        || f.nr_tags > 1 << 20
        || f.counter_size == 0
        || f.counter_size > 1 << 8
        || [f.tag_file, f.tag_line, f.tag_flags, f.tag_function_path]
            .iter()
            .any(|&offset| offset >= f.tag_size)
    {
        return Err("the code tags' descriptor is corrupt".into());
    }
    Ok(read)
}

/// The code tags' descriptor as read ([`read_codetag_descriptor`]).
#[derive(Debug, Clone, Copy)]
pub struct CodetagDescriptorRead {
    /// The described counters (0: none initialised).
    pub counters: u64,
    fields: CodetagDescriptorFields,
    /// Offsets in the counters and a counter (see [`CodetagDescriptor`]).
    pub counters_blocks: u64,
    /// See above.
    pub counters_nr_cpus: u64,
    /// See above.
    pub counters_block_bytes: u64,
    /// See above.
    pub counters_nr_tags: u64,
    /// See above.
    pub counter_bytes: u64,
    /// See above.
    pub counter_calls: u64,
    /// The profiling switch (0: none described) and its layout.
    pub switch: u64,
    /// See above.
    pub switch_state: u64,
    /// See above.
    pub switch_inaccurate: u64,
    /// See above.
    pub switch_on: u64,
    /// See above.
    pub switch_never: u64,
}

/// The profiling switch, read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SwitchRead {
    /// Tagging now.
    pub on: bool,
    /// Off for good (`mem_profiling=never`).
    pub never: bool,
    /// Counts may have missed allocations.
    pub inaccurate: bool,
}

impl CodetagDescriptorRead {
    /// The switch's state (on and accurate when none was described).
    ///
    /// # Errors
    ///
    /// Unreadable.
    pub fn switch(&self, mem: &dyn Memory) -> Result<SwitchRead, String> {
        if self.switch == 0 {
            return Ok(SwitchRead {
                on: true,
                never: false,
                inaccurate: false,
            });
        }
        let byte = |offset: u64| {
            mem.read_uint(self.switch.wrapping_add(offset), 1)
                .map_err(|e| format!("the profiling switch: {e}"))
        };
        let state = byte(self.switch_state)?;
        Ok(SwitchRead {
            on: state == self.switch_on,
            never: state == self.switch_never,
            inaccurate: byte(self.switch_inaccurate)? != 0,
        })
    }

    /// Every tag's live counts, summed over CPUs as
    /// `AllocTagCounters::read` sums them (a negative sum reads 0), by tag
    /// index; zeros for tags past the counters' (none before init).
    ///
    /// # Errors
    ///
    /// The counters are corrupt or cannot be read.
    pub fn counts(&self, mem: &dyn Memory) -> Result<Vec<AllocTagCounts>, String> {
        let nr_tags = self.fields.nr_tags as usize;
        let mut counts = vec![AllocTagCounts::default(); nr_tags];
        if self.counters == 0 {
            return Ok(counts);
        }
        let word = |offset: u64| {
            mem.read_uint(self.counters.wrapping_add(offset), 8)
                .map_err(|e| format!("the allocation tag counters: {e}"))
        };
        let blocks = word(self.counters_blocks)?;
        let nr_cpus = word(self.counters_nr_cpus)?;
        let block_bytes = word(self.counters_block_bytes)?;
        let counted = word(self.counters_nr_tags)?.min(nr_tags as u64);
        let size = self.fields.counter_size;
        if nr_cpus > 4096 || block_bytes > 1 << 24 || counted * size > block_bytes {
            return Err(format!(
                "the allocation tag counters are corrupt ({nr_cpus} CPUs, {block_bytes}-byte blocks, {counted} tags)"
            ));
        }
        let mut block = vec![0u8; block_bytes as usize];
        let mut sums = vec![(0u64, 0u64); counted as usize];
        for cpu in 0..nr_cpus {
            mem.read(blocks.wrapping_add(cpu * block_bytes), &mut block)
                .map_err(|e| format!("the allocation tag counters of CPU {cpu}: {e}"))?;
            for (index, sum) in sums.iter_mut().enumerate() {
                let at = index as u64 * size;
                let field = |offset: u64| {
                    let at = (at + offset) as usize;
                    block
                        .get(at..at + 8)
                        .map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap_or_default()))
                };
                sum.0 = sum.0.wrapping_add(field(self.counter_bytes));
                sum.1 = sum.1.wrapping_add(field(self.counter_calls));
            }
        }
        for (count, (bytes, calls)) in counts.iter_mut().zip(sums) {
            *count = AllocTagCounts {
                bytes: (bytes as i64).max(0) as u64,
                calls: (calls as i64).max(0) as u64,
            };
        }
        Ok(counts)
    }
}

impl CodetagDescriptorRead {
    /// The first tag's address and the number of tags.
    pub fn tags(&self) -> (u64, u64) {
        (self.fields.tags, self.fields.nr_tags)
    }

    /// Bytes per counter.
    pub fn counter_size(&self) -> u64 {
        self.fields.counter_size
    }
}

/// One allocation tag, read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TagRead {
    /// Source file.
    pub file: String,
    /// Line.
    pub line: u32,
    /// The function the tag is in (`?` without the kernel's symbols).
    pub function: String,
    /// The `untagged` bucket.
    pub untagged: bool,
}

impl CodetagDescriptorRead {
    /// Tag reference `tag_ref` (index plus one), read.
    ///
    /// # Errors
    ///
    /// Out of range, or unreadable.
    pub fn tag(
        &self,
        mem: &dyn Memory,
        symbols: &KernelSymbols,
        tag_ref: u64,
    ) -> Result<TagRead, String> {
        let f = &self.fields;
        if tag_ref == 0 || tag_ref > f.nr_tags {
            return Err(format!(
                "tag reference {tag_ref} is past the {} tags",
                f.nr_tags
            ));
        }
        let tag = f.tags.wrapping_add((tag_ref - 1) * f.tag_size);
        let word = |offset: u64| {
            mem.read_uint(tag.wrapping_add(offset), 8)
                .map_err(|e| e.to_string())
        };
        let (a, b) = (word(f.tag_file)?, word(f.tag_file + 8)?);
        // A `&str` is a pointer and a length: the pointer is the larger.
        let (ptr, len) = if a > b { (a, b) } else { (b, a) };
        if len > 4096 {
            return Err(format!("tag {tag_ref}: file name of {len} bytes"));
        }
        let mut file = vec![0u8; len as usize];
        mem.read(ptr, &mut file).map_err(|e| e.to_string())?;
        let line = mem
            .read_uint(tag.wrapping_add(f.tag_line), 4)
            .map_err(|e| e.to_string())? as u32;
        let flags = mem
            .read_uint(tag.wrapping_add(f.tag_flags), 4)
            .map_err(|e| e.to_string())?;
        let untagged = flags & f.untagged_flag != 0;
        // The untagged bucket's function path is a plain function
        // returning its name, not a call site's marker.
        let function = if untagged {
            Some("untagged".to_string())
        } else {
            symbols.function_at(word(f.tag_function_path)?)
        };
        let function = function
            .map(|path| {
                let path: &'static str = Box::leak(path.into_boxed_str());
                magpie_codetag::function_name_from_path(path).to_string()
            })
            .unwrap_or_else(|| "?".into());
        Ok(TagRead {
            file: String::from_utf8_lossy(&file).into_owned(),
            line,
            function,
            untagged,
        })
    }
}
