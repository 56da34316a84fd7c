//! The Magpie shell on the serial console.
//!
//! One command per line at the `magpie> ` prompt, with echo, a line
//! history on the arrow keys, Tab completion of command and cache names
//! ([`complete`]) and Ctrl-C to drop a line ([`line`](mod@line)).
//! Every command writes to a `fmt::Write` sink, so tests can run commands
//! and read their output without a console ([`Shell::execute`]). Errors are
//! one line starting with `error:`; the shell always returns to its prompt.
//!
//! # Layout
//!
//! * this file: the [`COMMANDS`] table (from which both `help` and dispatch
//!   come), the one error type [`ShellError`], the argument parsers, and the
//!   console loop [`run`];
//! * [`line`](mod@line): the line editor (bytes in, lines out);
//! * one file per area: `kmem` (kmemstat, slabinfo, kmalloc, kfree, leak, reap), `slabtop`
//!   (the live view), `kmem_debug` (kmem verify, whatis, errors, cache, findleaks), `kmemtrace/`
//!   (the trace table in `trace_table`, the event stream in `event_stream`), `profiling`
//!   (allocinfo, timestats), `smp` (cpus, stress), `fault` (fault injection), `lkdtm` (heap
//!   bugs on purpose), `system` (help, poweroff), `vmcore` (a core for `magpie-kmem core`).
//!
//! Commands parse and print; the mechanisms stay in their modules
//! (`kmem`, `profiling`, `tracing`, `smp`, `debug`, the slab library).
//!
//! # Adding a command
//!
//! One row in [`COMMANDS`] and one function in an area file:
//!
//! ```ignore
//! // shell/kmem.rs
//! pub(super) fn cmd_frob(shell: &mut Shell, args: &[&str], out: &mut dyn Write) -> Result {
//!     let [count] = args else { return Err(ShellError::Usage(&FROB)) };
//!     let count = parse_number(count)?;
//!     ...
//! }
//! // shell/mod.rs, in COMMANDS:
//! Command { name: "frob", help: &[("frob COUNT", "frobnicate COUNT objects")],
//!           context: "shell", run: kmem::cmd_frob },
//! ```
//!
//! A command returns `Err` for bad input (printed as one `error:` line); it
//! must not change anything before its arguments are checked.
//!
//! Output formats follow the tools kernel developers know:
//!
//! * `kmemstat` — Akaros `kmemstat` (`kern/drivers/dev/mem.c`): arenas with
//!   the slabs that import from them indented beneath.
//! * `slabinfo` — Linux `/proc/slabinfo` version 2.1. Magazine size is shown
//!   as `limit` and `batchcount` (rounds moved per depot exchange); `slabdata
//!   <sharedavail>` is the rounds held in the depot.
//! * `kmemtrace print` — Akaros `kmem_trace_print`, one block per outstanding
//!   object with its backtrace as `#NN [<address>] function+0xoff`.
//! * `allocinfo` — Linux `/proc/allocinfo` version 1.0 (2.0 when rows
//!   carry `accurate:no`).
//! * `slabtop` — Linux `slabtop(1)`'s summary and columns, plus the
//!   magazine layer's hits, misses and depot contention per interval.
//!
//! The formats are written by `magpie_slab::reports` (the library's
//! reports); the shell parses, holds the buffers and calls them.

// A ShellError carries its message (a `Message`, 320 bytes) so that reporting
// an error allocates nothing, even out of memory; one is returned per line.
#![allow(
    clippy::result_large_err,
    reason = "ShellError holds its message in place (no allocation); one per command line"
)]

mod fault;
mod kmem;
mod kmem_debug;
mod kmemtrace;
mod line;
mod lkdtm;
mod profiling;
mod slabtop;
mod smp;
mod system;
mod vmcore;

use alloc::vec::Vec;
use core::fmt::{self, Write};

pub use self::kmem::Held;
pub use self::kmemtrace::write_record;
pub use self::line::{Completer, ConsoleWriter, Edit, LineEditor};
use crate::dev::console;
use crate::kmem as kernel_kmem;

/// Longest command line accepted, in bytes.
pub const MAX_LINE: usize = 200;
/// Most objects one `kmalloc`/`leak` command may allocate.
pub const MAX_COUNT: usize = 100_000;
/// Largest size `kmalloc`/`leak` accept, in bytes.
pub const MAX_SIZE: usize = 64 << 20;
/// Most words on a line (a word and a separator take at least two bytes).
pub const MAX_WORDS: usize = MAX_LINE.div_ceil(2);

const PROMPT: &str = "magpie> ";

/// How often the idle shell runs the slab allocator's working-set tick
/// (`kmem_update`), in nanoseconds (illumos `kmem_reap_interval`: 15 s).
pub const KMEM_UPDATE_INTERVAL_NS: u64 = 5_000_000_000;

/// A command's function: parses `args` (the words after the command name)
/// and prints to `out`.
pub type CommandFn = for<'a> fn(&mut Shell, &[&'a str], &mut dyn Write) -> Result<'a>;

/// One row of the command table.
pub struct Command {
    /// The first word of the line.
    pub name: &'static str,
    /// `help` lines: (usage, what it does). The usage lines joined by ` | `
    /// are the command's usage in errors.
    pub help: &'static [(&'static str, &'static str)],
    /// The context string recorded in traces while the command runs.
    pub context: &'static str,
    /// Runs the command.
    pub run: CommandFn,
}

impl fmt::Debug for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Command").field("name", &self.name).finish()
    }
}

/// Every command, in `help` order.
pub static COMMANDS: &[Command] = &[
    system::HELP,
    kmem::KMEMSTAT,
    kmem::SLABINFO,
    slabtop::SLABTOP,
    kmemtrace::KMEMTRACE,
    kmem::KMALLOC,
    kmem::KFREE,
    kmem::LEAK,
    kmem::REAP,
    kmem_debug::KMEM,
    profiling::ALLOCINFO,
    profiling::TIMESTATS,
    smp::CPUS,
    smp::STRESS,
    fault::FAULT,
    lkdtm::LKDTM,
    vmcore::VMCORE,
    system::POWEROFF,
];

/// The table row of `name`.
pub fn find_command(name: &str) -> Option<&'static Command> {
    COMMANDS.iter().find(|command| command.name == name)
}

/// The usage of a command, as in its error messages: its help usages
/// joined by ` | `.
pub struct Usage(pub &'static Command);

impl fmt::Display for Usage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_usages(f, self.0, &[])
    }
}

/// The usage of the subcommand the words `args` name: the help usages of
/// `command` whose leading words match the most of `args` (a usage word
/// matches an argument equal to it or to one of its `|` alternatives);
/// `-`-options match the usage that takes options; with no match, every
/// usage.
pub struct SubUsage<'w>(pub &'static Command, pub &'w [&'w str]);

impl fmt::Display for SubUsage<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_usages(f, self.0, self.1)
    }
}

/// How many of `args` the usage line `usage` names, word for word after
/// the command's name.
fn usage_match(usage: &str, args: &[&str]) -> usize {
    let words = usage.split_whitespace().skip(1);
    let mut nr_matched = 0;
    for (word, arg) in words.zip(args) {
        if word.split('|').any(|alternative| alternative == *arg) {
            nr_matched += 1;
        } else if nr_matched == 0 && arg.starts_with('-') && word.starts_with("[-") {
            // An option: the usage that takes options.
            return 1;
        } else {
            break;
        }
    }
    nr_matched
}

fn write_usages(f: &mut fmt::Formatter<'_>, command: &Command, args: &[&str]) -> fmt::Result {
    let best = command
        .help
        .iter()
        .map(|(usage, _)| usage_match(usage, args))
        .max()
        .unwrap_or(0);
    let mut first = true;
    for (usage, _) in command.help {
        if usage_match(usage, args) != best {
            continue;
        }
        if !first {
            f.write_str(" | ")?;
        }
        first = false;
        f.write_str(usage)?;
    }
    Ok(())
}

/// An error with the words of the command it came from: usages narrowed
/// to the subcommand the words name ([`SubUsage`]).
pub struct ErrorIn<'e, 'w>(pub &'e ShellError<'e>, pub &'w [&'w str]);

impl fmt::Display for ErrorIn<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let args = self.1;
        match self.0 {
            ShellError::Usage(command) => write!(f, "usage: {}", SubUsage(command, args)),
            ShellError::UnknownOption(option, command) => write!(
                f,
                "unknown option '{option}'; usage: {}",
                SubUsage(command, args)
            ),
            ShellError::MissingValue(option, command) => write!(
                f,
                "{option} needs a value; usage: {}",
                SubUsage(command, args)
            ),
            ShellError::Unexpected(word, command) => {
                write!(f, "unexpected '{word}'; usage: {}", SubUsage(command, args))
            }
            error => fmt::Display::fmt(error, f),
        }
    }
}

/// A shell error: printed as one `error: ...` line. Borrows from the line,
/// so reporting bad input allocates nothing.
#[derive(Debug)]
pub enum ShellError<'a> {
    /// No command by that name.
    UnknownCommand(&'a str),
    /// No cache by that name.
    UnknownCache(&'a str),
    /// A number did not parse (`[0-9]+` or `0x[0-9a-f]+`).
    NotANumber(&'a str),
    /// A well-formed number too large for its type.
    NumberTooLarge(&'a str),
    /// A byte the shell does not take (a control byte or non-ASCII);
    /// `column` counts bytes from 1.
    BadByte {
        /// The byte.
        byte: u8,
        /// Its position in the line, from 1.
        column: usize,
    },
    /// A command could not get memory; the text says what it wanted.
    OutOfMemory(Message),
    /// A size range `A-B` did not parse.
    NotASizeRange(&'a str),
    /// Wrong arguments: the command's usage (the subcommand's, when
    /// printed by the shell: [`ErrorIn`]).
    Usage(&'static Command),
    /// A word the command does not take there, and the command.
    Unexpected(&'a str, &'static Command),
    /// A size outside 1..=MAX_SIZE.
    BadSize(usize),
    /// A count outside 1..=MAX_COUNT.
    BadCount(usize),
    /// `kfree N` with fewer objects held.
    NotHeld {
        /// Objects the command asked to free.
        asked: usize,
        /// Objects the shell holds.
        held: usize,
    },
    /// Tracing refused (NOTRACE cache).
    Trace(&'static str, magpie_slab::TraceError),
    /// The line was longer than [`MAX_LINE`].
    LineTooLong,
    /// An option the command does not know.
    UnknownOption(&'a str, &'static Command),
    /// An option given without its value.
    MissingValue(&'a str, &'static Command),
    /// No allocation tag (call site) at that `FILE:LINE`.
    NoAllocTag(&'a str),
    /// No fault point matches that `FILE:LINE` or pattern.
    NoFaultPoint(&'a str),
    /// `lkdtm` does not know that type.
    UnknownLkdtmType(&'a str),
    /// Any other message, formatted into a fixed buffer.
    Message(Message),
}

impl fmt::Display for ShellError<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ShellError::UnknownCommand(name) => {
                write!(f, "unknown command '{name}' (type 'help' for the list)")
            }
            ShellError::UnknownCache(name) => {
                write!(f, "no cache named '{name}' (see 'slabinfo' for names)")
            }
            ShellError::NotANumber(text) => write!(f, "'{text}' is not a number"),
            ShellError::NumberTooLarge(text) => write!(f, "'{text}' is too large"),
            ShellError::BadByte { byte, column } => write!(
                f,
                "byte {byte:#04x} at column {column} is not printable ASCII; line ignored"
            ),
            ShellError::OutOfMemory(what) => write!(f, "out of memory ({})", what.as_str()),
            ShellError::NotASizeRange(text) => write!(f, "'{text}' is not a size range A-B"),
            ShellError::Usage(command) => write!(f, "usage: {}", Usage(command)),
            ShellError::BadSize(size) => {
                write!(f, "size {size} out of range: give 1 to {MAX_SIZE} bytes")
            }
            ShellError::BadCount(count) => {
                write!(f, "count {count} out of range: give 1 to {MAX_COUNT}")
            }
            ShellError::NotHeld { asked, held } => {
                write!(f, "cannot free {asked}: the shell holds {held} object(s)")
            }
            ShellError::Trace(name, error) => write!(f, "cannot trace {name}: {error}"),
            ShellError::LineTooLong => {
                write!(f, "line too long (at most {MAX_LINE} characters); ignored")
            }
            ShellError::UnknownOption(option, command) => {
                write!(f, "unknown option '{option}'; usage: {}", Usage(command))
            }
            ShellError::MissingValue(option, command) => {
                write!(f, "{option} needs a value; usage: {}", Usage(command))
            }
            ShellError::Unexpected(word, command) => {
                write!(f, "unexpected '{word}'; usage: {}", Usage(command))
            }
            ShellError::NoAllocTag(location) => write!(
                f,
                "no allocation tag at '{location}' (see 'allocinfo' for FILE:LINE)"
            ),
            ShellError::NoFaultPoint(pattern) => write!(
                f,
                "no fault point matches '{pattern}' (see 'fault list' for FILE:LINE)"
            ),
            ShellError::UnknownLkdtmType(name) => {
                write!(f, "unknown lkdtm type '{name}' (see 'lkdtm list')")
            }
            ShellError::Message(message) => f.write_str(message.as_str()),
        }
    }
}

/// What a command returns.
pub type Result<'a, T = ()> = core::result::Result<T, ShellError<'a>>;

/// An error message formatted without allocating, into
/// [`Message::CAPACITY`] bytes: room for the longest message the shell
/// writes (a host path and a remedy included). A longer one is cut at a
/// character boundary and ends in `...`: never silently.
#[derive(Clone)]
pub struct Message {
    bytes: [u8; Message::CAPACITY],
    len: u16,
    cut: bool,
}

impl Message {
    /// Longest message kept, in bytes (the shell's longest is about 160).
    pub const CAPACITY: usize = 320;
    /// What ends a message that was cut.
    pub const ELLIPSIS: &'static str = "...";

    /// Formats `args`.
    pub fn new(args: fmt::Arguments<'_>) -> Self {
        let mut message = Self {
            bytes: [0; Self::CAPACITY],
            len: 0,
            cut: false,
        };
        let _ = message.write_fmt(args);
        message
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        // Only whole `str`s (cut at a char boundary) are copied in.
        core::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or("")
    }

    /// Whether the text was cut (it then ends in [`Message::ELLIPSIS`]).
    pub fn is_cut(&self) -> bool {
        self.cut
    }
}

impl Write for Message {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        if self.cut {
            return Ok(());
        }
        let len = usize::from(self.len);
        if s.len() <= Self::CAPACITY - len {
            self.bytes[len..len + s.len()].copy_from_slice(s.as_bytes());
            self.len += s.len() as u16;
            return Ok(());
        }
        // Cut: keep what fits before the ellipsis, at a char boundary.
        let room = Self::CAPACITY - Self::ELLIPSIS.len();
        let mut take = room.saturating_sub(len).min(s.len());
        while !s.is_char_boundary(take) {
            take -= 1;
        }
        let mut end = len.min(room) + take;
        self.bytes[len.min(room)..end].copy_from_slice(&s.as_bytes()[..take]);
        // The bytes kept before may end inside a character: back off.
        while core::str::from_utf8(&self.bytes[..end]).is_err() {
            end -= 1;
        }
        self.bytes[end..end + Self::ELLIPSIS.len()].copy_from_slice(Self::ELLIPSIS.as_bytes());
        self.len = (end + Self::ELLIPSIS.len()) as u16;
        self.cut = true;
        Ok(())
    }
}

impl fmt::Debug for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

/// `ShellError::Message` from a format string: `shell_error!("bad {x}")`.
macro_rules! shell_error {
    ($($arg:tt)*) => {
        $crate::shell::ShellError::Message($crate::shell::Message::new(format_args!($($arg)*)))
    };
}
pub(crate) use shell_error;

/// `ShellError::OutOfMemory` from a format string saying what was wanted:
/// `out_of_memory!("{n} bytes for ...")` prints `error: out of memory (...)`.
macro_rules! out_of_memory {
    ($($arg:tt)*) => {
        $crate::shell::ShellError::OutOfMemory($crate::shell::Message::new(format_args!($($arg)*)))
    };
}
pub(crate) use out_of_memory;

/// Shell state: the objects `kmalloc` allocated and `kfree` has not freed.
#[derive(Default)]
pub struct Shell {
    held: Vec<Held>,
}

impl Shell {
    /// A shell holding nothing.
    pub const fn new() -> Self {
        Self { held: Vec::new() }
    }

    /// Number of objects `kmalloc` allocated and `kfree` has not freed.
    pub fn nr_held(&self) -> usize {
        self.held.len()
    }

    /// Runs one command line, writing its output (or one error line) to `out`.
    pub fn execute(&mut self, line: &str, out: &mut dyn Write) {
        crate::tracing::event_stream::mark(line);
        // A Ctrl-C typed before this command is not for it.
        crate::dev::console::clear_interrupt();
        let mut words = [""; MAX_WORDS];
        let nr_words = match split_words(line, &mut words) {
            Ok(nr_words) => nr_words,
            Err(error) => {
                let _ = writeln!(out, "error: {error}");
                return;
            }
        };
        let words = &words[..nr_words];
        if let Err(error) = self.dispatch(words, out) {
            let args = words.get(1..).unwrap_or(&[]);
            let _ = writeln!(out, "error: {}", ErrorIn(&error, args));
        }
    }

    fn dispatch<'a>(&mut self, words: &[&'a str], out: &mut dyn Write) -> Result<'a> {
        let Some((&name, args)) = words.split_first() else {
            return Ok(());
        };
        let command = find_command(name).ok_or(ShellError::UnknownCommand(name))?;
        let _tag = crate::alloc_tag_scope!();
        let _context = crate::tracing::context::enter_context(command.context);
        let _frames = crate::debug::findleaks::CommandFrames::enter();
        (command.run)(self, args, out)
    }
}

/// Checks `line` ([`check_line`]) and splits it into `words`; returns how
/// many.
fn split_words<'a>(line: &'a str, words: &mut [&'a str; MAX_WORDS]) -> Result<'a, usize> {
    check_line(line.as_bytes())?;
    let mut nr_words = 0;
    for word in line.split_whitespace() {
        // A line of at most MAX_LINE bytes has at most MAX_WORDS words.
        let Some(slot) = words.get_mut(nr_words) else {
            return Err(ShellError::LineTooLong);
        };
        *slot = word;
        nr_words += 1;
    }
    Ok(nr_words)
}

/// Whether the shell takes `byte` in a line: printable ASCII, or a tab
/// (a word separator).
pub fn is_line_byte(byte: u8) -> bool {
    matches!(byte, b' '..=b'~' | b'\t')
}

/// Refuses a line the shell would otherwise misread: longer than
/// [`MAX_LINE`], or holding a byte that is not printable ASCII or a tab.
///
/// # Errors
///
/// `ShellError::LineTooLong`, or the error for the first byte that is not
/// printable ASCII or a tab.
pub fn check_line(line: &[u8]) -> Result<'static> {
    if let Some(index) = line.iter().position(|&byte| !is_line_byte(byte)) {
        return Err(ShellError::BadByte {
            byte: line[index],
            column: index + 1,
        });
    }
    if line.len() > MAX_LINE {
        return Err(ShellError::LineTooLong);
    }
    Ok(())
}

/// `Err(Unexpected)` unless `args` is empty.
///
/// # Errors
///
/// `ShellError::Unexpected(first word, command)` when `args` is not empty.
pub fn no_args<'a>(args: &[&'a str], command: &'static Command) -> Result<'a> {
    match args.first() {
        None => Ok(()),
        Some(word) => Err(ShellError::Unexpected(word, command)),
    }
}

/// Parses a number: decimal `[0-9]+` or hexadecimal `0x[0-9a-f]+`, nothing
/// else (no sign, no spaces, no upper-case hex, no `_`).
///
/// # Errors
///
/// `ShellError::NotANumber(text)` for anything but the two forms,
/// `ShellError::NumberTooLarge(text)` above `u64::MAX`.
pub fn parse_u64(text: &str) -> Result<'_, u64> {
    let (digits, radix) = match text.strip_prefix("0x") {
        Some(hex) => (hex, 16),
        None => (text, 10),
    };
    let valid = |byte: &u8| match radix {
        16 => matches!(byte, b'0'..=b'9' | b'a'..=b'f'),
        _ => byte.is_ascii_digit(),
    };
    if digits.is_empty() || !digits.as_bytes().iter().all(valid) {
        return Err(ShellError::NotANumber(text));
    }
    u64::from_str_radix(digits, radix).map_err(|_| ShellError::NumberTooLarge(text))
}

/// [`parse_u64`] as a `usize`.
///
/// # Errors
///
/// Those of [`parse_u64`]; `ShellError::NumberTooLarge(text)` above
/// `usize::MAX`.
pub fn parse_number(text: &str) -> Result<'_, usize> {
    usize::try_from(parse_u64(text)?).map_err(|_| ShellError::NumberTooLarge(text))
}

// ---------------------------------------------------------------------------
// The console loop

/// Tab completion's candidates: command names for the first word, cache
/// names after it.
pub fn complete(index: usize, word: &str, each: &mut dyn FnMut(&str)) {
    if index == 0 {
        for command in COMMANDS {
            each(command.name);
        }
    } else if word.starts_with(|c: char| c.is_ascii_alphabetic()) {
        kernel_kmem::SLAB.for_each_cache(|cache| each(cache.name()));
    }
}

/// Runs the shell on the serial console forever.
pub fn run() -> ! {
    let mut shell = Shell::new();
    let mut editor = LineEditor::with_completer(complete);
    let mut out = ConsoleWriter;
    let _ = out.write_str(PROMPT);
    let mut last_update = crate::arch::rdtsc();
    // Waiting for input is the kernel's idle time: run the slab
    // allocator's working-set tick every KMEM_UPDATE_INTERVAL_NS there
    // (idle depot magazines and empty slabs go back to the pages).
    let mut on_idle = || {
        let now = crate::arch::rdtsc();
        if crate::tracing::event_stream::ticks_to_ns(now.wrapping_sub(last_update))
            >= KMEM_UPDATE_INTERVAL_NS
        {
            last_update = now;
            kernel_kmem::SLAB.kmem_update();
        }
    };
    loop {
        let Some(byte) = console::read_byte_timeout(None, &mut on_idle) else {
            continue;
        };
        match editor.feed(byte, &mut |bytes| console::write_bytes(bytes)) {
            Edit::Pending => continue,
            Edit::Cancelled => {}
            Edit::Line(line) => {
                let mut copy = [0u8; MAX_LINE];
                let len = line.len();
                copy[..len].copy_from_slice(line.as_bytes());
                let line = core::str::from_utf8(&copy[..len]).unwrap_or("");
                shell.execute(line, &mut out);
            }
            Edit::TooLong => {
                let _ = writeln!(out, "error: {}", ShellError::LineTooLong);
            }
            Edit::Invalid { byte, column } => {
                let _ = writeln!(out, "error: {}", ShellError::BadByte { byte, column });
            }
        }
        let _ = out.write_str(PROMPT);
    }
}
