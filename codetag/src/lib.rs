//! Code tags: a static descriptor per instrumented code location, gathered
//! by the linker into one section so that every tag can be walked as a slice.
//!
//! This is the framework from Kent Overstreet and Suren Baghdasaryan's *code
//! tagging* proposal (LSFMM 2022, `../shared/reference/000_…`), which became
//! Linux's `include/linux/codetag.h` and `lib/codetag.c`. A [`CodeTag`] names
//! a place in the source: module, function, file, line and flags. It is never
//! used alone: an *application* embeds one in its own static type (an
//! allocation tag with byte and call counters, a fault-injection point, a
//! latency statistic) and declares a section for its tags with
//! [`codetag_section!`]. Tags are placed by [`linkme`] (`#[distributed_slice]`,
//! the linker's `__start_`/`__stop_` bounds), so no registration runs at boot
//! and walking the tags costs nothing until someone asks.
//!
//! ```
//! use core::sync::atomic::AtomicBool;
//! use magpie_codetag::{codetag, codetag_section, CodeTag, TaggedWith};
//!
//! pub struct FaultPoint { pub tag: CodeTag, pub armed: AtomicBool }
//! impl TaggedWith for FaultPoint { fn codetag(&self) -> &CodeTag { &self.tag } }
//!
//! codetag_section!(pub static FAULT_POINTS: [FaultPoint]);
//!
//! fn open_file() {
//!     #[magpie_codetag::linkme::distributed_slice(FAULT_POINTS)]
//!     #[linkme(crate = magpie_codetag::linkme)]
//!     static HERE: FaultPoint = FaultPoint { tag: codetag!(), armed: AtomicBool::new(false) };
//!     // ...
//! }
//! for point in FAULT_POINTS.iter() { println!("{}", point.codetag()); }
//! ```
//!
//! Function names are the *real* enclosing function's name, found from the
//! type name of a function item nested at the call site (Rust has no
//! `__func__`); they are computed on first use, not stored, because
//! `core::any::type_name` is not usable in a `static` initializer on stable
//! Rust.
//!
//! ## Applications in this crate
//!
//! - [`alloc_tag`](mod@alloc_tag): allocation tags ([`alloc_tag::AllocTag`], the
//!   [`alloc_tag!`] macro, per-CPU [`alloc_tag::AllocTagCounters`], the
//!   runtime [`alloc_tag::ProfilingSwitch`] and the `/proc/allocinfo`
//!   printer). The allocator stores a 4-byte `Option<`[`alloc_tag::AllocTagRef`]`>`
//!   with each object; this crate turns references back into tags, and
//!   counts them at a per-CPU base a platform keeps in its per-CPU area
//!   ([`alloc_tag::AllocTagCounters::add_at`]: one `add` per counter; or
//!   with a charge token checked once, [`alloc_tag::AllocTagCounters::token`]
//!   and `charge_token_at` / `uncharge_at`, no check per update).
//! - [`time_stats`](mod@time_stats): latency statistics at a code location
//!   ([`time_stats!`]): count, average, maximum, quantiles.
//! - [`fault`]: fault injection ([`fault::FaultTag`], [`dynamic_fault!`]):
//!   any tagged site can be made to fail once, every N times or with a
//!   probability; a disabled point costs one branch.
//!
//! ## Sections and the linker
//!
//! Each section is `linkme_<NAME>` with `__start_linkme_<NAME>` and
//! `__stop_linkme_<NAME>` bounds, which ELF linkers define for any section
//! whose name is a C identifier. Host test binaries get them from the
//! default linker script; the kernel's `boot/linker.ld` leaves these
//! sections as orphans, which the linker places among the writable data.
#![no_std]
#![deny(unsafe_code)]
// Stricter than the workspace (Cargo.toml): each unsafe operation in its
// own block with its own SAFETY comment.
#![deny(clippy::multiple_unsafe_ops_per_block)]

#[allow(
    unsafe_code,
    reason = "unsafe is confined to handing per-CPU counter memory to alloc_tag"
)]
pub mod alloc_tag;
pub mod descriptor;
pub mod fault;
pub mod time_stats;

use core::fmt;

/// Re-exported so that applications' macros can name it as
/// `$crate::linkme` without a direct dependency.
pub use linkme;

/// What kind of place a tag marks, and application-defined bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct CodeTagFlags(pub u32);

impl CodeTagFlags {
    /// No flags.
    pub const NONE: Self = Self(0);
    /// The tag was defined by an explicit call-site macro (`kmalloc!`).
    pub const EXPLICIT: Self = Self(1 << 0);
    /// The tag belongs to a scoped guard that attributes a whole scope.
    pub const SCOPE: Self = Self(1 << 1);

    /// Whether every bit of `other` is set in `self`.
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }
}

/// One instrumented code location.
///
/// Build it with [`codetag!`] at the location it describes; the fields are
/// public so that applications can build tags in `const` contexts of their own.
pub struct CodeTag {
    /// `module_path!()` at the call site, e.g. `magpie::shell`.
    pub module: &'static str,
    /// File relative to the workspace root, `file!()`.
    pub file: &'static str,
    /// Line, `line!()` (1-based).
    pub line: u32,
    /// Application-defined flags.
    pub flags: CodeTagFlags,
    /// Returns the full type path of a function item nested in the enclosing
    /// function; [`CodeTag::function`] trims it to the function's name.
    pub function_path: fn() -> &'static str,
}

impl CodeTag {
    /// Name of the function that contains the tag, e.g. `cmd_kmalloc`;
    /// closures and nested blocks are attributed to the function around them.
    pub fn function(&self) -> &'static str {
        function_name_from_path((self.function_path)())
    }

    /// `file:line`, the key Linux uses in `/proc/allocinfo`.
    pub fn location(&self) -> Location {
        Location {
            file: self.file,
            line: self.line,
        }
    }

    /// Whether this tag's `file:line` equals `spec` (the form users type,
    /// e.g. `kernel/src/shell/kmem.rs:122`).
    pub fn matches_location(&self, spec: &str) -> bool {
        let Some((file, line)) = spec.rsplit_once(':') else {
            return false;
        };
        file == self.file && line.parse::<u32>() == Ok(self.line)
    }
}

impl fmt::Debug for CodeTag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CodeTag")
            .field("module", &self.module)
            .field("function", &self.function())
            .field("file", &self.file)
            .field("line", &self.line)
            .field("flags", &self.flags)
            .finish()
    }
}

/// Prints `file:line module func:name`, the tag info of `/proc/allocinfo`.
impl fmt::Display for CodeTag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} func:{}",
            self.location(),
            self.module,
            self.function()
        )
    }
}

/// `file:line` of a tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Location {
    /// Source file.
    pub file: &'static str,
    /// Line in it.
    pub line: u32,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.file, self.line)
    }
}

/// Implemented by every application type that embeds a [`CodeTag`].
pub trait TaggedWith {
    /// The embedded tag.
    fn codetag(&self) -> &CodeTag;
}

/// Trims a nested function item's type path to the enclosing function name.
///
/// `magpie::shell::cmd_kmalloc::{{closure}}::HERE::__codetag_fn` becomes
/// `cmd_kmalloc`: the helper function and the `static` holding the tag are
/// upper-case or start with `__`, closures and constants are `{{…}}`
/// (`core::any::type_name`) or `{closure#N}` (a v0 symbol demangled, as
/// `magpie-kmem` reads the function from a core).
pub fn function_name_from_path(path: &'static str) -> &'static str {
    path.rsplit("::")
        .find(|segment| {
            !segment.is_empty()
                && !segment.starts_with('{')
                && !segment.starts_with("__")
                && !segment.starts_with('_')
                && !segment
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        })
        .unwrap_or("?")
}

/// Builds a [`CodeTag`] for the place where it is written.
///
/// `codetag!()` has no flags; `codetag!(CodeTagFlags::EXPLICIT)` sets some.
/// It is a constant expression, usable in a `static` initializer.
#[macro_export]
macro_rules! codetag {
    () => {
        $crate::codetag!($crate::CodeTagFlags::NONE)
    };
    ($flags:expr) => {
        $crate::CodeTag {
            module: ::core::module_path!(),
            file: ::core::file!(),
            line: ::core::line!(),
            flags: $flags,
            function_path: {
                fn __codetag_fn() -> &'static str {
                    fn __codetag_marker() {}
                    ::core::any::type_name_of_val(&__codetag_marker)
                }
                __codetag_fn
            },
        }
    };
}

/// Declares the section that holds one application's tags, walkable as a
/// `&'static [T]` (`FAULT_POINTS.iter()`, `.len()`).
#[macro_export]
macro_rules! codetag_section {
    ($(#[$meta:meta])* $vis:vis static $name:ident : [$ty:ty]) => {
        $(#[$meta])*
        #[$crate::linkme::distributed_slice]
        #[linkme(crate = $crate::linkme)]
        $vis static $name: [$ty];
    };
}
