//! `slabtop [--once] [--sort o|c|n|m] [--delay MS] [--lines N]`: a live
//! view of the caches (Linux `slabtop(1)`'s columns, plus magazine hits,
//! misses and depot contention per interval), refreshed until `q` (or
//! Ctrl-C); `o`, `c`, `n`, `m` re-sort it at once, as in Linux slabtop.
//! A frame fits the terminal: the summary on top, then the rows that fit
//! in `--lines` lines (24, a terminal's default height: the serial console
//! cannot tell its size), the busiest by the sort key. The frame is
//! `magpie_slab::reports::slabtop`; this file keeps the two row buffers
//! (reserved at boot), cuts the frame to the screen and runs the refresh
//! loop.

use core::fmt::{self, Write};

use magpie_slab::reports::{self, EMPTY_SLABTOP_ROW, SlabtopRow, SlabtopSample, SlabtopSort};
use spin::Mutex;

use super::line::CTRL_C;
use super::{Command, Result, Shell, ShellError, parse_number, shell_error};
use crate::dev::console;
use crate::kmem::SLAB;
use crate::tracing::event_stream::ticks_to_ns;

pub(super) const SLABTOP: Command = Command {
    name: "slabtop",
    help: &[(
        "slabtop [--once] [--sort o|c|n|m] [--delay MS] [--lines N]",
        "live cache view (Linux slabtop + magazine hits/misses/contention): q quits, o c n m sort",
    )],
    context: "shell",
    run: cmd_slabtop,
};

/// Caches a frame shows (the kernel has about 180: 152 size classes).
pub const MAX_ROWS: usize = 256;
/// Default time between frames (Linux slabtop: 3 s).
const DEFAULT_DELAY_MS: u64 = 3000;
/// Longest delay accepted.
const MAX_DELAY_MS: u64 = 60_000;
/// Lines a live frame takes by default (a terminal's default height).
pub const DEFAULT_LINES: usize = 24;
/// Lines of a frame before its rows (summary, blank line, column header).
const HEADER_LINES: usize = 8;
/// Fewest `--lines`: the header, one row and the footer.
const MIN_LINES: usize = HEADER_LINES + 2;
/// Most `--lines`.
const MAX_LINES: usize = 1000;

/// This frame's rows and the previous frame's, reserved at boot.
struct Frames {
    rows: [SlabtopRow; MAX_ROWS],
    previous: [SlabtopRow; MAX_ROWS],
}

static FRAMES: Mutex<Frames> = Mutex::new(Frames {
    rows: [EMPTY_SLABTOP_ROW; MAX_ROWS],
    previous: [EMPTY_SLABTOP_ROW; MAX_ROWS],
});

/// Passes the first `max_lines` lines to `out` and drops the rest.
struct FirstLines<'o> {
    out: &'o mut dyn Write,
    max_lines: usize,
    nr_lines: usize,
}

impl Write for FirstLines<'_> {
    fn write_str(&mut self, mut s: &str) -> fmt::Result {
        while !s.is_empty() && self.nr_lines < self.max_lines {
            match s.find('\n') {
                Some(end) => {
                    self.out.write_str(&s[..=end])?;
                    self.nr_lines += 1;
                    s = &s[end + 1..];
                }
                None => return self.out.write_str(s),
            }
        }
        Ok(())
    }
}

/// The sort a key pressed in the live view asks for (Linux slabtop's keys).
fn sort_of_key(byte: u8) -> Option<SlabtopSort> {
    match byte {
        b'o' | b'O' => Some(SlabtopSort::Objects),
        b'c' | b'C' => Some(SlabtopSort::CacheSize),
        b'n' | b'N' => Some(SlabtopSort::Name),
        b'm' | b'M' => Some(SlabtopSort::Misses),
        _ => None,
    }
}

fn cmd_slabtop<'a>(_: &mut Shell, args: &[&'a str], out: &mut dyn Write) -> Result<'a> {
    let mut once = false;
    let mut sort = SlabtopSort::Objects;
    let mut delay_ms = DEFAULT_DELAY_MS;
    let mut lines = None;
    let mut words = args.iter();
    while let Some(&word) = words.next() {
        match word {
            "--once" => once = true,
            "--sort" | "-s" => {
                let key = words
                    .next()
                    .ok_or(ShellError::MissingValue(word, &SLABTOP))?;
                sort = SlabtopSort::from_key(key).ok_or_else(|| {
                    shell_error!("unknown sort key '{key}'; expected o, c, n or m")
                })?;
            }
            "--delay" | "-d" => {
                let value = words
                    .next()
                    .ok_or(ShellError::MissingValue(word, &SLABTOP))?;
                delay_ms = parse_number(value)? as u64;
                if !(1..=MAX_DELAY_MS).contains(&delay_ms) {
                    return Err(shell_error!(
                        "delay {delay_ms} ms out of range: give 1 to {MAX_DELAY_MS}"
                    ));
                }
            }
            "--lines" | "-l" => {
                let value = words
                    .next()
                    .ok_or(ShellError::MissingValue(word, &SLABTOP))?;
                let value = parse_number(value)?;
                if !(MIN_LINES..=MAX_LINES).contains(&value) {
                    return Err(shell_error!(
                        "--lines {value} out of range: give {MIN_LINES} to {MAX_LINES}"
                    ));
                }
                lines = Some(value);
            }
            option if option.starts_with('-') => {
                return Err(ShellError::UnknownOption(option, &SLABTOP));
            }
            word => {
                return Err(shell_error!(
                    "unexpected '{word}'; usage: {}",
                    super::Usage(&SLABTOP)
                ));
            }
        }
    }
    let mut frames = FRAMES.lock();
    let Frames { rows, previous } = &mut *frames;
    if once {
        // --once prints every cache, as `slabtop --once` does, unless
        // --lines cuts it.
        let lines = lines.unwrap_or(usize::MAX);
        let nr_rows = frame(out, rows, None, sort, lines)?;
        let _ = reports::write_slabtop_hits_note(out, &rows[..nr_rows]);
        return Ok(());
    }
    let lines = lines.unwrap_or(DEFAULT_LINES);
    let mut nr_previous = None;
    let mut taken_at = crate::arch::rdtsc();
    loop {
        let now = crate::arch::rdtsc();
        let sample = nr_previous.map(|nr| SlabtopSample {
            rows: &previous[..nr],
            elapsed_ns: ticks_to_ns(now.wrapping_sub(taken_at)),
        });
        // Home and clear, as slabtop's curses screen.
        let _ = out.write_str("\x1b[H\x1b[2J");
        let nr_rows = frame(out, rows, sample, sort, lines - 1)?;
        let _ = writeln!(
            out,
            "(every {delay_ms} ms, sorted by {}; q quits, o c n m sort)",
            sort_name(sort)
        );
        previous[..nr_rows].copy_from_slice(&rows[..nr_rows]);
        nr_previous = Some(nr_rows);
        taken_at = now;
        // Wait for the next frame, or a key.
        loop {
            let waited = ticks_to_ns(crate::arch::rdtsc().wrapping_sub(now));
            let Some(left) = (delay_ms * 1_000_000).checked_sub(waited) else {
                break;
            };
            match console::read_byte_timeout(Some(left), &mut || {}) {
                None => break,
                Some(b'q' | b'Q' | CTRL_C) => return Ok(()),
                Some(key) => {
                    if let Some(new_sort) = sort_of_key(key) {
                        sort = new_sort;
                        break;
                    }
                }
            }
        }
    }
}

/// Writes one frame of at most `max_lines` lines (the summary, then the
/// rows that fit, sorted by `sort`) and, when rows were left out, a line
/// saying how many. Returns the number of rows taken.
fn frame<'a>(
    out: &mut dyn Write,
    rows: &mut [SlabtopRow],
    sample: Option<SlabtopSample<'_>>,
    sort: SlabtopSort,
    max_lines: usize,
) -> Result<'a, usize> {
    let mut cut = FirstLines {
        out,
        // One line for the count of rows left out.
        max_lines: max_lines.saturating_sub(1),
        nr_lines: 0,
    };
    let nr_rows = reports::slabtop(&mut cut, &SLAB, rows, sample, sort)
        .map_err(|_| shell_error!("slabtop: the console refused the frame"))?;
    let nr_shown = cut.nr_lines.saturating_sub(HEADER_LINES).min(nr_rows);
    if nr_shown < nr_rows {
        let _ = writeln!(
            out,
            "({} of {} caches shown, by {}; --lines N for more)",
            nr_shown,
            nr_rows,
            sort_name(sort)
        );
    }
    Ok(nr_rows)
}

/// What a sort key sorts by, in words.
fn sort_name(sort: SlabtopSort) -> &'static str {
    match sort {
        SlabtopSort::Objects => "objects",
        SlabtopSort::CacheSize => "cache size",
        SlabtopSort::Name => "name",
        SlabtopSort::Misses => "misses",
    }
}
