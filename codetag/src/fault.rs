//! Fault injection: the third code-tag application (the slides'
//! `dynamic_fault(class)`, from the code tagging RFC; Linux never merged it).
//!
//! A [`FaultTag`] is a [`CodeTag`] for one place whose error path can be
//! exercised on demand: every `kmalloc!` / `kmem_cache_alloc!` site of the
//! kernel, and any site a developer marks with [`dynamic_fault!`](crate::dynamic_fault). The tags
//! live in the [`FAULT_TAGS`] section, so a tool can walk every fault point
//! of the program and arm them one at a time.
//!
//! ```
//! # #[derive(Debug)] enum AllocError { OutOfMemory }
//! # fn alloc() -> Result<(), AllocError> {
//! if magpie_codetag::dynamic_fault!(Memory) {
//!     return Err(AllocError::OutOfMemory); // the error path under test
//! }
//! # Ok(())
//! # }
//! # alloc().unwrap();
//! ```
//!
//! Each point is in one [`FaultMode`]: disabled (the default), enabled
//! (fail every time), oneshot (fail the next time, then disable), every N
//! (fail every N-th time) or probability P (fail with probability P, drawn
//! from a per-CPU pseudo-random generator). While armed, a point counts its
//! *hits* (times reached) and *injected* faults; a disabled point counts
//! nothing.
//!
//! # Cost
//!
//! A disabled point is one byte load, a compare and a predicted-not-taken
//! branch ([`FaultTag::should_fail`]): everything else is in a cold,
//! out-of-line function. Measured with callgrind on the host
//! (`magpie-bench fault`, see `docs/BENCHMARKS.md`).
//!
//! # Output
//!
//! [`write_fault_row`] prints the slides' layout plus the counts:
//!
//! ```text
//! kernel/src/shell/kmem.rs:122 module:magpie::shell::kmem func:cmd_kmalloc class:memory disabled hits:0 injected:0
//! kernel/src/shell/kmem.rs:122 module:magpie::shell::kmem func:cmd_kmalloc class:memory enabled:every=10 hits:20 injected:2
//! ```

use core::fmt;
use core::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering};

use crate::{CodeTag, TaggedWith, codetag_section};

/// What kind of failure a point stands for (the slides' `class`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultClass {
    /// An allocation that can fail (`class:memory`).
    Memory,
    /// An I/O or device operation (`class:io`).
    Io,
    /// Anything else (`class:other`).
    Other,
}

impl FaultClass {
    /// The name printed after `class:`.
    pub const fn name(self) -> &'static str {
        match self {
            FaultClass::Memory => "memory",
            FaultClass::Io => "io",
            FaultClass::Other => "other",
        }
    }
}

impl fmt::Display for FaultClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Parts per million: the unit of [`FaultMode::Probability`].
pub const PPM: u32 = 1_000_000;

/// When an armed point injects a fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultMode {
    /// Never (the default). Costs one branch.
    Disabled,
    /// Every time the point is reached.
    Enabled,
    /// The next time only; the point then disables itself. Exactly one
    /// fault is injected even if several CPUs reach the point at once.
    Oneshot,
    /// Every N-th time (1 = every time), counted from when the mode was set.
    Every(u32),
    /// With this probability, in parts per million (1..=[`PPM`]).
    Probability(u32),
}

impl FaultMode {
    /// Parses the words users type: `enable`, `disable`, `oneshot`,
    /// `every N` (N >= 1), `probability P` (P in percent, 0 < P <= 100,
    /// up to four decimals: `0.0001` is one in a million).
    ///
    /// # Errors
    ///
    /// A message naming what is wrong.
    pub fn parse(words: &[&str]) -> Result<Self, FaultParseError> {
        match words {
            ["enable"] => Ok(FaultMode::Enabled),
            ["disable"] => Ok(FaultMode::Disabled),
            ["oneshot"] => Ok(FaultMode::Oneshot),
            ["every", n] => match parse_count(n) {
                Some(n) if n >= 1 => Ok(FaultMode::Every(n)),
                _ => Err(FaultParseError::BadEvery),
            },
            ["probability", p] => parse_percent(p)
                .filter(|&ppm| ppm > 0 && ppm <= PPM)
                .map(FaultMode::Probability)
                .ok_or(FaultParseError::BadProbability),
            _ => Err(FaultParseError::UnknownMode),
        }
    }
}

/// Why [`FaultMode::parse`] refused its words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultParseError {
    /// Not one of the modes.
    UnknownMode,
    /// `every N` without a whole N >= 1 (below 2^32).
    BadEvery,
    /// `probability P` without 0 < P <= 100 (percent, at most 4 decimals).
    BadProbability,
}

impl fmt::Display for FaultParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FaultParseError::UnknownMode => {
                "expected enable, disable, oneshot, every N or probability P"
            }
            FaultParseError::BadEvery => "every N: N is a whole number from 1 to 4294967295",
            FaultParseError::BadProbability => {
                "probability P: P is a percentage above 0 and at most 100, at most 4 decimals"
            }
        })
    }
}

/// A count as the shell reads numbers: decimal digits, or `0x` and
/// lower-case hex digits (as the shell prints addresses); no sign, no
/// spaces. `None` if malformed or above `u32::MAX`.
fn parse_count(text: &str) -> Option<u32> {
    let (digits, radix) = match text.strip_prefix("0x") {
        Some(hex) => (hex, 16),
        None => (text, 10),
    };
    let valid = |b: u8| b.is_ascii_digit() || (radix == 16 && matches!(b, b'a'..=b'f'));
    if digits.is_empty() || !digits.bytes().all(valid) {
        return None;
    }
    u32::from_str_radix(digits, radix).ok()
}

/// `12.5` (percent) as parts per million; `None` if malformed. Digits on
/// both sides of a point, as written in the shell's other numbers: `0.5`,
/// not `.5` or `50.`.
fn parse_percent(text: &str) -> Option<u32> {
    let (whole, fraction) = match text.split_once('.') {
        Some((whole, fraction)) if !fraction.is_empty() => (whole, fraction),
        Some(_) => return None,
        None => (text, ""),
    };
    if whole.is_empty() {
        return None;
    }
    if fraction.len() > 4
        || !whole.bytes().all(|b| b.is_ascii_digit())
        || !fraction.bytes().all(|b| b.is_ascii_digit())
        || whole.len() > 3
    {
        return None;
    }
    let whole: u32 = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    let mut fraction_ppm = 0u32;
    let mut scale = 1000; // one percent is 10_000 ppm; its first decimal 1_000
    for digit in fraction.bytes() {
        fraction_ppm += u32::from(digit - b'0') * scale;
        scale /= 10;
    }
    whole.checked_mul(10_000)?.checked_add(fraction_ppm)
}

/// Prints parts per million as a percentage: `2.5%`, `100%`, `0.0001%`.
struct Percent(u32);

impl fmt::Display for Percent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let whole = self.0 / 10_000;
        let mut fraction = self.0 % 10_000;
        if fraction == 0 {
            return write!(f, "{whole}%");
        }
        let mut digits = 4;
        while fraction.is_multiple_of(10) {
            fraction /= 10;
            digits -= 1;
        }
        write!(f, "{whole}.{fraction:0digits$}%")
    }
}

/// `disabled`, `enabled`, `enabled:oneshot`, `enabled:every=N`,
/// `enabled:probability=P%`: one word, as `fault list` prints it.
impl fmt::Display for FaultMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            FaultMode::Disabled => f.write_str("disabled"),
            FaultMode::Enabled => f.write_str("enabled"),
            FaultMode::Oneshot => f.write_str("enabled:oneshot"),
            FaultMode::Every(n) => write!(f, "enabled:every={n}"),
            FaultMode::Probability(ppm) => write!(f, "enabled:probability={}", Percent(ppm)),
        }
    }
}

const MODE_DISABLED: u8 = 0;
const MODE_ENABLED: u8 = 1;
const MODE_ONESHOT: u8 = 2;
const MODE_EVERY: u8 = 3;
const MODE_PROBABILITY: u8 = 4;

/// One fault-injection point.
pub struct FaultTag {
    /// Where the point is.
    pub tag: CodeTag,
    /// What failing here stands for.
    pub class: FaultClass,
    /// `MODE_*`; the only field a disabled point reads.
    mode: AtomicU8,
    /// N of `every N`, or parts per million of `probability P`.
    parameter: AtomicU32,
    /// Hits since the mode was set (drives `every N`).
    nr_hits_in_mode: AtomicU64,
    /// Hits while armed, since boot or the last reset.
    nr_hits: AtomicU64,
    /// Faults injected, since boot or the last reset.
    nr_injected: AtomicU64,
}

impl TaggedWith for FaultTag {
    fn codetag(&self) -> &CodeTag {
        &self.tag
    }
}

codetag_section!(
    /// Every fault point, walkable as a slice.
    pub static FAULT_TAGS: [FaultTag]
);

impl FaultTag {
    /// A disabled point (used by [`dynamic_fault!`](crate::dynamic_fault)).
    pub const fn new(tag: CodeTag, class: FaultClass) -> Self {
        Self {
            tag,
            class,
            mode: AtomicU8::new(MODE_DISABLED),
            parameter: AtomicU32::new(0),
            nr_hits_in_mode: AtomicU64::new(0),
            nr_hits: AtomicU64::new(0),
            nr_injected: AtomicU64::new(0),
        }
    }

    /// Every fault point of the program, in section order.
    pub fn all() -> &'static [FaultTag] {
        FAULT_TAGS.static_slice()
    }

    /// Whether the code at this point should fail now. A disabled point
    /// returns false after one load and one branch; an armed one counts the
    /// hit and decides by its mode (out of line).
    #[inline(always)]
    pub fn should_fail(&self) -> bool {
        if self.mode.load(Ordering::Relaxed) == MODE_DISABLED {
            return false;
        }
        self.armed_hit()
    }

    #[cold]
    #[inline(never)]
    fn armed_hit(&self) -> bool {
        let mode = self.mode.load(Ordering::Acquire);
        let inject = match mode {
            MODE_DISABLED => return false,
            MODE_ENABLED => true,
            // One winner even if several CPUs race here; a loser found the
            // point disarmed and, as at a disabled point, counts nothing
            // (so a oneshot always reads `hits:1 injected:1`).
            MODE_ONESHOT => {
                let lost = self
                    .mode
                    .compare_exchange(
                        MODE_ONESHOT,
                        MODE_DISABLED,
                        Ordering::AcqRel,
                        Ordering::Relaxed,
                    )
                    .is_err();
                if lost {
                    return false;
                }
                true
            }
            MODE_EVERY => {
                let n = u64::from(self.parameter.load(Ordering::Relaxed).max(1));
                let hit = self.nr_hits_in_mode.fetch_add(1, Ordering::Relaxed) + 1;
                hit.is_multiple_of(n)
            }
            MODE_PROBABILITY => {
                let ppm = self.parameter.load(Ordering::Relaxed);
                random_below_ppm(ppm)
            }
            _ => false,
        };
        self.nr_hits.fetch_add(1, Ordering::Relaxed);
        if inject {
            self.nr_injected.fetch_add(1, Ordering::Relaxed);
        }
        inject
    }

    /// The point's mode now.
    pub fn mode(&self) -> FaultMode {
        let parameter = self.parameter.load(Ordering::Relaxed);
        match self.mode.load(Ordering::Acquire) {
            MODE_ENABLED => FaultMode::Enabled,
            MODE_ONESHOT => FaultMode::Oneshot,
            MODE_EVERY => FaultMode::Every(parameter),
            MODE_PROBABILITY => FaultMode::Probability(parameter),
            _ => FaultMode::Disabled,
        }
    }

    /// Sets the mode (and restarts the `every N` count). A zero `every`
    /// or probability is taken as 1 (every time / one in a million); a
    /// probability above [`PPM`] as [`PPM`].
    pub fn set_mode(&self, mode: FaultMode) {
        // Disable first so that no CPU sees the new parameter with the old
        // mode; the new mode is published last (release).
        self.mode.store(MODE_DISABLED, Ordering::Release);
        let (code, parameter) = match mode {
            FaultMode::Disabled => return,
            FaultMode::Enabled => (MODE_ENABLED, 0),
            FaultMode::Oneshot => (MODE_ONESHOT, 0),
            FaultMode::Every(n) => (MODE_EVERY, n.max(1)),
            FaultMode::Probability(ppm) => (MODE_PROBABILITY, ppm.clamp(1, PPM)),
        };
        self.parameter.store(parameter, Ordering::Relaxed);
        self.nr_hits_in_mode.store(0, Ordering::Relaxed);
        self.mode.store(code, Ordering::Release);
    }

    /// Hits while armed and faults injected.
    pub fn counts(&self) -> FaultCounts {
        FaultCounts {
            nr_hits: self.nr_hits.load(Ordering::Relaxed),
            nr_injected: self.nr_injected.load(Ordering::Relaxed),
        }
    }

    /// Zeroes the counts (the mode stays).
    pub fn reset_counts(&self) {
        self.nr_hits.store(0, Ordering::Relaxed);
        self.nr_injected.store(0, Ordering::Relaxed);
    }

    /// Whether `pattern` selects this point: `FILE:LINE` exactly (as
    /// `fault list` prints it), `all`, or else whole path components: of
    /// the file (`shell`, `kmem.rs`, `kernel/src/shell`), of the module
    /// (`stress`, `magpie::smp::stress`), or the function's name. A part
    /// of a component (`:`, `she`) selects nothing.
    pub fn matches(&self, pattern: &str) -> bool {
        if pattern == "all" {
            return true;
        }
        if let Some((_, line)) = pattern.rsplit_once(':')
            && !line.is_empty()
            && line.bytes().all(|b| b.is_ascii_digit())
        {
            return self.tag.matches_location(pattern);
        }
        has_components(self.tag.file, "/", pattern)
            || has_components(self.tag.module, "::", pattern)
            || self.tag.function() == pattern
    }
}

/// Whether `pattern` is a run of whole components of `path` (separated by
/// `separator`): it occurs in `path` starting and ending at component
/// boundaries, and has no empty component itself.
fn has_components(path: &str, separator: &str, pattern: &str) -> bool {
    if pattern.split(separator).any(str::is_empty) {
        return false;
    }
    path.match_indices(pattern).any(|(at, _)| {
        let end = at + pattern.len();
        (at == 0 || path[..at].ends_with(separator))
            && (end == path.len() || path[end..].starts_with(separator))
    })
}

/// A point's counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultCounts {
    /// Times the point was reached while armed.
    pub nr_hits: u64,
    /// Faults it injected.
    pub nr_injected: u64,
}

/// Defines a [`FaultTag`] at the place where it is written and evaluates
/// to whether that place should fail now (`bool`). `dynamic_fault!()` is
/// class `other`; `dynamic_fault!(Memory)` / `(Io)` / `(Other)` choose.
#[macro_export]
macro_rules! dynamic_fault {
    () => {
        $crate::dynamic_fault!(Other)
    };
    ($class:ident) => {
        $crate::fault_tag!($class).should_fail()
    };
}

/// Defines a [`FaultTag`] at the place where it is written and evaluates
/// to `&'static FaultTag` (for callers that consult it later or name it in
/// tests). Same classes as [`dynamic_fault!`](crate::dynamic_fault).
#[macro_export]
macro_rules! fault_tag {
    ($class:ident) => {{
        #[$crate::linkme::distributed_slice($crate::fault::FAULT_TAGS)]
        #[linkme(crate = $crate::linkme)]
        static __FAULT_TAG: $crate::fault::FaultTag =
            $crate::fault::FaultTag::new($crate::codetag!(), $crate::fault::FaultClass::$class);
        &__FAULT_TAG
    }};
}

/// Writes one `fault list` row:
/// `file:line module:M func:F class:C STATE hits:N injected:N`.
///
/// # Errors
///
/// The error of `out` (`fmt::Error`), as is.
pub fn write_fault_row(out: &mut dyn fmt::Write, point: &FaultTag) -> fmt::Result {
    let counts = point.counts();
    writeln!(
        out,
        "{} module:{} func:{} class:{} {} hits:{} injected:{}",
        point.tag.location(),
        point.tag.module,
        point.tag.function(),
        point.class,
        point.mode(),
        counts.nr_hits,
        counts.nr_injected
    )
}

// ---------------------------------------------------------------------------
// The per-CPU pseudo-random generator of `probability P`

/// CPUs with a generator of their own; higher ids share (id modulo this).
pub const MAX_RNG_CPUS: usize = 64;

/// One CPU's splitmix64 state, alone on its cache line.
#[repr(align(64))]
struct RngState(AtomicU64);

static RNG: [RngState; MAX_RNG_CPUS] = [const { RngState(AtomicU64::new(0)) }; MAX_RNG_CPUS];

/// The platform's "which CPU am I on" (none: everything uses CPU 0's state).
static CPU_ID: spin::Once<fn() -> usize> = spin::Once::new();

/// Tells fault injection how to find the running CPU, so that each CPU
/// draws from its own generator (no shared cache line). Set once; later
/// calls are ignored.
pub fn set_cpu_id_fn(cpu_id: fn() -> usize) {
    CPU_ID.call_once(|| cpu_id);
}

/// Seeds every CPU's generator from `seed` (each CPU gets a different
/// stream). Without a seed the streams start from fixed values, so a boot
/// is reproducible.
pub fn seed_rng(seed: u64) {
    for (cpu, state) in RNG.iter().enumerate() {
        state.0.store(
            seed ^ (cpu as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15),
            Ordering::Relaxed,
        );
    }
}

/// splitmix64 (Steele, Lea & Flood 2014): one add, three xor-shift-multiply
/// rounds. The state update is a load and a store, not a locked
/// read-modify-write: an interrupt on the same CPU may reuse a value, which
/// only repeats a draw.
fn next_random() -> u64 {
    let cpu = CPU_ID.get().map_or(0, |cpu_id| cpu_id()) % MAX_RNG_CPUS;
    let state = &RNG[cpu].0;
    let next = state
        .load(Ordering::Relaxed)
        .wrapping_add(0x9E37_79B9_7F4A_7C15);
    state.store(next, Ordering::Relaxed);
    let mut z = next;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// True with probability `ppm` parts per million.
fn random_below_ppm(ppm: u32) -> bool {
    // Lemire's multiply-shift maps 32 random bits onto 0..PPM.
    let draw = ((next_random() >> 32) * u64::from(PPM)) >> 32;
    draw < u64::from(ppm)
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::format;

    #[test]
    fn counts_parse_as_the_shells_numbers() {
        for (text, n) in [
            ("1", 1),
            ("10", 10),
            ("0x10", 16),
            ("0xff", 255),
            ("4294967295", u32::MAX),
        ] {
            assert_eq!(parse_count(text), Some(n), "{text}");
        }
        for bad in [
            "",
            "+5",
            "-1",
            " 5",
            "5 ",
            "0x",
            "0xFF",
            "0X10",
            "1_000",
            "4294967296",
            "1.0",
        ] {
            assert_eq!(parse_count(bad), None, "{bad}");
        }
        assert_eq!(
            FaultMode::parse(&["every", "0x10"]),
            Ok(FaultMode::Every(16))
        );
        assert_eq!(
            FaultMode::parse(&["every", "+5"]),
            Err(FaultParseError::BadEvery)
        );
        assert_eq!(
            FaultMode::parse(&["probability", ".5"]),
            Err(FaultParseError::BadProbability)
        );
    }

    #[test]
    fn patterns_match_whole_components() {
        let file = "kernel/src/shell/kmem.rs";
        for pattern in [
            "kernel",
            "shell",
            "kmem.rs",
            "kernel/src/shell",
            "src/shell/kmem.rs",
            file,
        ] {
            assert!(has_components(file, "/", pattern), "{pattern}");
        }
        for pattern in [
            ":",
            "",
            "/",
            "she",
            "kmem",
            "shell/",
            "/shell",
            "src//shell",
            "l/src",
        ] {
            assert!(!has_components(file, "/", pattern), "{pattern}");
        }
        let module = "magpie::smp::stress";
        for pattern in ["magpie", "smp::stress", module] {
            assert!(has_components(module, "::", pattern), "{pattern}");
        }
        for pattern in [":", "::", "magpie::", "smp:", "stres", "gpie::smp"] {
            assert!(!has_components(module, "::", pattern), "{pattern}");
        }
    }

    #[test]
    fn percent_parses_and_prints_back() {
        for (text, ppm) in [
            ("100", PPM),
            ("50", 500_000),
            ("2.5", 25_000),
            ("0.0001", 1),
            ("0.5", 5_000),
        ] {
            assert_eq!(parse_percent(text), Some(ppm), "{text}");
        }
        // As the shell's other numbers: digits on both sides of a point.
        for bad in [
            "", ".", "-1", "1e3", "0.00001", "abc", "1.2.3", "1000000", ".5", "50.", "+5",
        ] {
            assert_eq!(parse_percent(bad).filter(|&p| p <= PPM), None, "{bad}");
        }
        for (ppm, printed) in [
            (PPM, "100%"),
            (25_000, "2.5%"),
            (1, "0.0001%"),
            (10_500, "1.05%"),
        ] {
            assert_eq!(format!("{}", Percent(ppm)), printed);
        }
    }
}
