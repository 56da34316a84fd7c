//! Restartable magazine hits: no in-use flag, no interrupt-off section.
//!
//! With [`Platform::RESTARTABLE_HITS`](crate::Platform::RESTARTABLE_HITS)
//! (x86-64), the plain alloc and free hits are *restartable sequences*
//! (Bershad, Redell & Ellis, "Fast Mutual Exclusion for Uniprocessors",
//! ASPLOS 1992; Linux's `rseq`, whose per-CPU operations SLUB-like
//! allocators such as tcmalloc's run on): each is one `asm!` block that
//! reads this CPU's per-CPU cache and ends in a single store, the
//! *commit* (the new `top`). Everything before the commit only reads the
//! per-CPU cache, or writes what no one else reads until the commit
//! publishes it (the slot above `top`, the freed object's key word). An
//! interrupt that lands before the commit is finished sends the
//! interrupted code back to the sequence's first instruction when the
//! handler returns: the platform's interrupt entry asks [`restart_ip`]
//! about the interrupted instruction pointer and moves it. The handler
//! itself can then allocate and free on this CPU as it likes (its own
//! hits, misses, magazine exchanges): the interrupted hit starts again
//! and reads the per-CPU cache as the handler left it.
//!
//! Cost on the hit: nothing. Each side drops the flag's take and give
//! back (3 instructions; the kernel's pair 61 → 55, `tests/kernel_hit.rs`).
//! Cost on an interrupt: one scan of the ranges table (one 8-byte entry
//! per inlined copy of a hit; a few dozen in the kernel) in the handlers
//! that need it (those that can run allocator code).
//!
//! Every other access to the per-CPU cache that runs with interrupts on
//! (the recorded hits, whose events go into this CPU's ring inside the
//! section) disables interrupts instead of taking the flag, so nothing
//! but a restartable hit ever touches a per-CPU cache with interrupts on.
//!
//! The ranges live in the linker section `magpie_restart` (entries of two
//! 32-bit offsets, each relative to its own address, so the table needs no
//! relocation in a position-independent image), found through the
//! linker's `__start_magpie_restart` / `__stop_magpie_restart`; the section
//! is marked retained (`R`), so `--gc-sections` keeps it. This module puts
//! one empty range there itself, so the section exists in every image that
//! links it.
//!
//! Exceptions (`#DB` single-stepping in `tests/kernel_hit.rs`, a `#PF`
//! KFENCE handles) must not restart: their handlers run no allocator code
//! on the per-CPU caches and a trap flag would never get past a restart.

/// Whether this build has the restartable hits at all (feature `nightly`,
/// for `asm_goto_with_outputs`; x86-64 ELF targets: bare metal and Linux,
/// whose linkers define the section's `__start_`/`__stop_` symbols; not
/// under Miri or the loom models):
/// elsewhere the flag and interrupt-off hits are used whatever the
/// platform says.
pub(crate) const SUPPORTED: bool = cfg!(all(
    feature = "nightly",
    target_arch = "x86_64",
    any(target_os = "none", target_os = "linux"),
    not(miri),
    not(all(test, loom))
));

/// Where an interrupted instruction pointer `ip` must resume: `Some(start)`
/// if `ip` is inside a restartable hit that has not committed (from its
/// first instruction up to, not including, the one after its commit), else
/// `None` (resume at `ip`).
///
/// A platform with [`Platform::RESTARTABLE_HITS`](crate::Platform::RESTARTABLE_HITS)
/// calls this from every interrupt handler that can run allocator code
/// (device interrupts, timer, the cross-CPU call's IPI), before that code
/// runs, with the instruction pointer the CPU saved, and writes `start`
/// back into the saved frame. Linear in the number of ranges
/// (the `magpie_restart` linker section); nothing else.
#[must_use]
pub fn restart_ip(ip: usize) -> Option<usize> {
    ranges().find_map(|(start, end)| (start..end).contains(&ip).then_some(start))
}

/// The restartable ranges in this image, as `(start, end)` instruction
/// addresses (end exclusive), the empty anchor included: one per inlined
/// copy of a hit. Empty where [`restart_ip`] is unsupported (not an x86-64
/// ELF target).
pub(crate) fn ranges() -> impl Iterator<Item = (usize, usize)> {
    imp::ranges()
}

/// The restartable alloc hit ([`restart_ip`]'s sequence `pop`) and free
/// hit of a keyed cache (the sequence `push`), or, where they are not
/// built, stand-ins never called.
pub(crate) use imp::{pop, push};

/// Where the per-CPU array starts, in bytes from the base address the
/// sequences are given ([`pop`], [`push`]): a constant of the owner's
/// type (a cache's array follows its struct), so the sequences address
/// the line with one displacement and load no pointer to it.
pub(crate) trait ArrayAt {
    /// The array's offset from the base, in bytes.
    const AT: usize;
    /// Byte offset of `top` (the slot above `loaded`'s top round) in a
    /// per-CPU cache.
    const TOP: usize;
    /// Byte offset of `limit` (`loaded`'s end) in a per-CPU cache.
    const LIMIT: usize;
    /// Byte offset of the allocation count in a per-CPU cache.
    const NR_ALLOCS: usize;
    /// Byte offset of the free key in a per-CPU cache.
    const FREE_KEY: usize;
}

/// Whether `P`'s plain magazine hits are restartable sequences (its
/// [`Platform::RESTARTABLE_HITS`](crate::Platform::RESTARTABLE_HITS), in a
/// build that has them).
#[inline(always)]
pub(crate) const fn enabled<P: crate::Platform>() -> bool {
    SUPPORTED && P::RESTARTABLE_HITS
}

#[cfg(all(
    feature = "nightly",
    target_arch = "x86_64",
    any(target_os = "none", target_os = "linux"),
    not(miri),
    not(all(test, loom))
))]
/// The sequences, their ranges table and its reader, where they are
/// built ([`SUPPORTED`]).
mod imp {
    // The table's anchor: an empty range (start == end, never matched), so
    // that `__start_`/`__stop_magpie_restart` exist in every image.
    core::arch::global_asm!(
        ".pushsection magpie_restart, \"aR\", @progbits",
        ".balign 4",
        "1:",
        ".long 1b - .",
        ".long 1b - .",
        ".popsection",
    );

    unsafe extern "C" {
        /// The first entry of the ranges table (linker-defined).
        static __start_magpie_restart: [i32; 2];
        /// One past its last entry (linker-defined).
        static __stop_magpie_restart: [i32; 2];
    }

    /// The table, as (start, end) addresses.
    pub(super) fn ranges() -> impl Iterator<Item = (usize, usize)> {
        let first = (&raw const __start_magpie_restart).cast::<[i32; 2]>();
        let end = (&raw const __stop_magpie_restart).cast::<[i32; 2]>();
        // SAFETY: both symbols bound the one `magpie_restart` section, an
        // array of `[i32; 2]` entries (each written by `.long` pairs,
        // 4-aligned, 8 bytes): `end` is `first` plus a whole number of
        // entries.
        let len = unsafe { end.offset_from(first) } as usize;
        (0..len).map(move |i| {
            // SAFETY: entry `i` of the section (i < len, above).
            let entry = unsafe { first.add(i) };
            let field = entry.cast::<i32>();
            // SAFETY: as above; read-only data.
            let (start, stop) = unsafe { (field.read(), field.add(1).read()) };
            let start = (field as usize).wrapping_add_signed(start as isize);
            let stop = (field.wrapping_add(1) as usize).wrapping_add_signed(stop as isize);
            (start, stop)
        })
    }

    /// The ranges-table entry of the sequence between the local labels `2:`
    /// (its first instruction) and `3:` (the one after its commit), for an
    /// `asm!` template.
    macro_rules! restart_range {
        () => {
            concat!(
                ".pushsection magpie_restart, \"aR\", @progbits\n",
                ".balign 4\n",
                ".long 2b - .\n",
                ".long 3b - .\n",
                ".popsection",
            )
        };
    }

    /// A field of this CPU's per-CPU cache as an `asm!` memory operand:
    /// `[{base} + {offset} + {FIELD}]` (`indexed`), or `[{base} + {FIELD}]`
    /// (`plain`: the CPU's offset is a constant 0, one CPU, and no register
    /// is spent on it: an `xor` a side of the hit pair).
    macro_rules! line {
        (indexed, $field:literal) => {
            concat!("[{base} + {offset} + {", $field, "}]")
        };
        (plain, $field:literal) => {
            concat!("[{base} + {", $field, "}]")
        };
    }

    /// Whether the sequences may address the line without the offset
    /// register (`line!`'s `plain`): `offset` is 0 and the compiler knows
    /// it (a one-CPU platform's `cpu_offset`). A several-CPU kernel's
    /// offset is a load: `indexed`, with nothing tested on the hit.
    #[inline(always)]
    fn plain(offset: usize) -> bool {
        core::intrinsics::is_val_statically_known(offset) && offset == 0
    }

    /// [`pop`]'s keyed sequence, addressing the line as `$mode` (`line!`);
    /// `$offset`: the offset operand (`indexed`) or nothing.
    macro_rules! pop_keyed {
        ($mode:ident, $base:expr, $round:ident, [$($offset:tt)*]) => {
            core::arch::asm!(
                "2:",
                concat!("mov {top}, qword ptr ", line!($mode, "top_at")),
                "mov {round}, qword ptr [{top} - 8]",
                "test {round}, {round}",
                "jz {empty}",
                concat!("mov {key}, qword ptr ", line!($mode, "key_at")),
                "cmp qword ptr [{round}], {key}",
                "jne {empty}",
                "sub {top}, 8",
                concat!("mov qword ptr ", line!($mode, "top_at"), ", {top}"),
                "3:",
                restart_range!(),
                concat!("inc qword ptr ", line!($mode, "nr_at")),
                "mov qword ptr [{round}], 0",
                base = in(reg) $base,
                $($offset)*
                top_at = const A::AT + A::TOP,
                nr_at = const A::AT + A::NR_ALLOCS,
                key_at = const A::AT + A::FREE_KEY,
                top = out(reg) _,
                key = out(reg) _,
                round = out(reg) $round,
                empty = label { return None; },
                options(nostack),
            )
        };
    }

    /// [`pop`]'s keyless sequence, as [`pop_keyed`].
    macro_rules! pop_keyless {
        ($mode:ident, $base:expr, $round:ident, [$($offset:tt)*]) => {
            core::arch::asm!(
                "2:",
                concat!("mov {top}, qword ptr ", line!($mode, "top_at")),
                "mov {round}, qword ptr [{top} - 8]",
                "test {round}, {round}",
                "jz {empty}",
                "sub {top}, 8",
                concat!("mov qword ptr ", line!($mode, "top_at"), ", {top}"),
                "3:",
                restart_range!(),
                concat!("inc qword ptr ", line!($mode, "nr_at")),
                base = in(reg) $base,
                $($offset)*
                top_at = const A::AT + A::TOP,
                nr_at = const A::AT + A::NR_ALLOCS,
                top = out(reg) _,
                round = out(reg) $round,
                empty = label { return None; },
                options(nostack),
            )
        };
    }

    /// [`push`]'s sequence, as [`pop_keyed`].
    macro_rules! push_keyed {
        ($mode:ident, $base:expr, $obj:expr, [$($offset:tt)*]) => {
            core::arch::asm!(
                "2:",
                concat!("mov {top}, qword ptr ", line!($mode, "top_at")),
                concat!("cmp {top}, qword ptr ", line!($mode, "limit_at")),
                "jae {no}",
                concat!("mov {key}, qword ptr ", line!($mode, "key_at")),
                // The key's low byte first (a one-byte load is forwarded
                // from any store of the caller's: `double_free::holds_key`),
                // the word only if it matches.
                "cmp byte ptr [{obj}], {key:l}",
                "jne 4f",
                "cmp qword ptr [{obj}], {key}",
                "je {no}",
                "4:",
                "mov qword ptr [{obj}], {key}",
                "mov qword ptr [{top}], {obj}",
                "add {top}, 8",
                concat!("mov qword ptr ", line!($mode, "top_at"), ", {top}"),
                "3:",
                restart_range!(),
                base = in(reg) $base,
                $($offset)*
                obj = in(reg) $obj,
                top_at = const A::AT + A::TOP,
                limit_at = const A::AT + A::LIMIT,
                key_at = const A::AT + A::FREE_KEY,
                top = out(reg) _,
                key = out(reg) _,
                no = label { return false; },
                options(nostack),
            )
        };
    }

    /// The restartable alloc hit: pop the round below this CPU's `top` (the
    /// per-CPU cache at `base + A::AT + offset`), move `top` down (the commit)
    /// and count the allocation; `None` (nothing changed) if the word below
    /// `top` is null (an empty or absent magazine).
    ///
    /// `A::AT` is where the per-CPU array starts, in bytes from `base` (a
    /// constant, so that a cache's array placed after its struct costs no
    /// load: it and the field's offset become one displacement); `A::TOP`
    /// and `A::NR_ALLOCS` are the byte offsets of `top` and `nr_allocs` in
    /// the per-CPU cache.
    ///
    /// `KEYED` (a keyed cache's hit: `cache/double_free.rs`): the round
    /// must hold the free key (`A::FREE_KEY`'s word), tested before the
    /// commit (a read) and cleared after it; a round without it changes
    /// nothing (`None`: the miss pops it again, reports it and keeps it
    /// from every caller). +3 instructions: the key's load, its compare
    /// and branch (the clear was there already).
    ///
    /// # Safety
    /// `base + A::AT + offset` is the running CPU's per-CPU cache, alive
    /// for the call;
    /// the platform restarts the sequence as [`restart_ip`](super::restart_ip)
    /// says on every interrupt that can run allocator code, and no other
    /// code on this CPU
    /// touches the per-CPU cache with interrupts on
    /// ([`Platform::RESTARTABLE_HITS`](crate::Platform::RESTARTABLE_HITS));
    /// `KEYED` only for a keyed cache's per-CPU cache.
    #[inline(always)]
    pub(crate) unsafe fn pop<A: super::ArrayAt, const KEYED: bool>(
        base: *const u8,
        offset: usize,
    ) -> Option<core::ptr::NonNull<u8>> {
        let round: *mut u8;
        if KEYED {
            // SAFETY: as below; the key test only reads (the round, a free
            // object of the keyed cache: its first word), and the clear
            // after the commit writes the round, ours from the commit on.
            unsafe {
                if plain(offset) {
                    pop_keyed!(plain, base, round, []);
                } else {
                    pop_keyed!(indexed, base, round, [offset = in(reg) offset,]);
                }
            }
            // SAFETY: the jump above leaves on a null round.
            return Some(unsafe { core::ptr::NonNull::new_unchecked(round) });
        }
        // SAFETY: `[base + offset + A::AT + A::TOP]` is this CPU's `top`, a pointer at or
        // above slot 0 of `loaded` (or of the absent magazine, whose word
        // below is its null `next`): the word below it is readable. Up to the
        // commit (the store of the new `top`) the block only reads, so an
        // interrupt there is undone by starting again at `2:` (the range
        // registered in `magpie_restart`), with `base` and `offset` unchanged
        // (inputs, never written: `out` registers are never an input's). The
        // count after the commit is one read-modify-write instruction, which
        // an interrupt on this CPU cannot split. No stack; the flags are
        // clobbered (no `preserves_flags`). (`plain`: `offset` is 0.)
        unsafe {
            if plain(offset) {
                pop_keyless!(plain, base, round, []);
            } else {
                pop_keyless!(indexed, base, round, [offset = in(reg) offset,]);
            }
        }
        // SAFETY: the jump above leaves on a null round.
        Some(unsafe { core::ptr::NonNull::new_unchecked(round) })
    }

    /// The restartable free hit of a keyed cache: if this CPU's `loaded` has
    /// room (`top` below `limit`) and `obj` does not hold the free key, write
    /// the key into `obj`'s first word, `obj` into the slot at `top`, and move
    /// `top` up (the commit); true. False otherwise, with nothing changed but,
    /// after a restart, the key already in `obj` (the miss then confirms the
    /// apparent double free, finds the object nowhere free, and frees it:
    /// [`crate::cache`]'s `is_double_free`).
    ///
    /// `A` as for [`pop`]; `A::TOP`, `A::LIMIT` and `A::FREE_KEY` are the byte offsets of
    /// `top`, `limit` and `free_key` in the per-CPU cache.
    ///
    /// # Safety
    /// As for [`pop`]; `obj` is a busy object of the keyed cache this per-CPU
    /// cache belongs to, given up by the caller if this returns true.
    #[inline(always)]
    pub(crate) unsafe fn push<A: super::ArrayAt>(
        base: *const u8,
        offset: usize,
        obj: core::ptr::NonNull<u8>,
    ) -> bool {
        // SAFETY: `top` and `limit` are this CPU's `loaded` slots' top and end
        // (equal for a full or absent magazine): below `limit`, the slot at
        // `top` is free and ours to write. Before the commit the block writes
        // only that slot (above `top`: nothing reads it until the commit
        // publishes it, and a restart writes it again) and `obj`'s first word
        // (the caller's object, given up): an interrupt there is undone by
        // starting again at `2:`, inputs unchanged (early-clobber outputs).
        // No stack; the flags are clobbered. (`plain`: `offset` is 0.)
        unsafe {
            if plain(offset) {
                push_keyed!(plain, base, obj.as_ptr(), []);
            } else {
                push_keyed!(indexed, base, obj.as_ptr(), [offset = in(reg) offset,]);
            }
        }
        true
    }
}

#[cfg(not(all(
    feature = "nightly",
    target_arch = "x86_64",
    any(target_os = "none", target_os = "linux"),
    not(miri),
    not(all(test, loom))
)))]
/// Stand-ins where the sequences are not built ([`SUPPORTED`] is false):
/// no ranges, and sequences never called.
mod imp {
    /// No ranges.
    pub(super) fn ranges() -> impl Iterator<Item = (usize, usize)> {
        core::iter::empty()
    }

    /// Never called: [`SUPPORTED`](super::SUPPORTED) is false in this build.
    ///
    /// # Safety
    /// None needed; it panics.
    pub(crate) unsafe fn pop<A: super::ArrayAt, const KEYED: bool>(
        _base: *const u8,
        _offset: usize,
    ) -> Option<core::ptr::NonNull<u8>> {
        let _ = (A::AT, A::TOP, A::LIMIT, A::NR_ALLOCS, A::FREE_KEY);
        unreachable!("restartable hits are not supported in this build")
    }

    /// Never called: [`SUPPORTED`](super::SUPPORTED) is false in this build.
    ///
    /// # Safety
    /// None needed; it panics.
    pub(crate) unsafe fn push<A: super::ArrayAt>(
        _base: *const u8,
        _offset: usize,
        _obj: core::ptr::NonNull<u8>,
    ) -> bool {
        let _ = (A::AT, A::TOP, A::LIMIT, A::NR_ALLOCS, A::FREE_KEY);
        unreachable!("restartable hits are not supported in this build")
    }
}
