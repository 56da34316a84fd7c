//! `slabtop [--once] [--sort o|c|n|m] [--delay MS]`: a live view of the
//! caches (Linux `slabtop(1)`'s columns, plus magazine hits, misses and
//! depot contention per interval), refreshed until a key is pressed. The
//! frame is `magpie_slab::reports::slabtop`; this file keeps the two row
//! buffers (reserved at boot) and the refresh loop.

use core::fmt::Write;

use magpie_slab::reports::{self, EMPTY_SLABTOP_ROW, SlabtopRow, SlabtopSample, SlabtopSort};
use spin::Mutex;

use super::{Command, Result, Shell, ShellError, parse_number, shell_error};
use crate::dev::console;
use crate::kmem::SLAB;
use crate::tracing::event_stream::ticks_to_ns;

pub(super) const SLABTOP: Command = Command {
    name: "slabtop",
    help: &[(
        "slabtop [--once] [--sort o|c|n|m] [--delay MS]",
        "live cache view (Linux slabtop + magazine hits/misses/contention), until a key",
    )],
    context: "shell",
    run: cmd_slabtop,
};

/// Caches a frame shows (the kernel has about 70).
pub const MAX_ROWS: usize = 128;
/// Default time between frames (Linux slabtop: 3 s).
const DEFAULT_DELAY_MS: u64 = 3000;
/// Longest delay accepted.
const MAX_DELAY_MS: u64 = 60_000;

/// This frame's rows and the previous frame's, reserved at boot.
struct Frames {
    rows: [SlabtopRow; MAX_ROWS],
    previous: [SlabtopRow; MAX_ROWS],
}

static FRAMES: Mutex<Frames> = Mutex::new(Frames {
    rows: [EMPTY_SLABTOP_ROW; MAX_ROWS],
    previous: [EMPTY_SLABTOP_ROW; MAX_ROWS],
});

fn cmd_slabtop<'a>(_: &mut Shell, args: &[&'a str], out: &mut dyn Write) -> Result<'a> {
    let mut once = false;
    let mut sort = SlabtopSort::Objects;
    let mut delay_ms = DEFAULT_DELAY_MS;
    let mut words = args.iter();
    while let Some(&word) = words.next() {
        match word {
            "--once" => once = true,
            "--sort" | "-s" => {
                let key = words
                    .next()
                    .ok_or(ShellError::MissingValue(word, &SLABTOP))?;
                sort = SlabtopSort::from_key(key).ok_or(ShellError::Usage(&SLABTOP))?;
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
            option if option.starts_with('-') => {
                return Err(ShellError::UnknownOption(option, &SLABTOP));
            }
            _ => return Err(ShellError::Usage(&SLABTOP)),
        }
    }
    let mut frames = FRAMES.lock();
    let Frames { rows, previous } = &mut *frames;
    if once {
        let _ = reports::slabtop(out, &SLAB, rows, None, sort);
        return Ok(());
    }
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
        let Ok(nr_rows) = reports::slabtop(out, &SLAB, rows, sample, sort) else {
            return Ok(());
        };
        let _ = writeln!(out, "(refresh every {delay_ms} ms; press any key to stop)");
        previous[..nr_rows].copy_from_slice(&rows[..nr_rows]);
        nr_previous = Some(nr_rows);
        taken_at = now;
        // Wait for the next frame, or a key.
        while ticks_to_ns(crate::arch::rdtsc().wrapping_sub(now)) < delay_ms * 1_000_000 {
            if console::read_byte().is_some() {
                return Ok(());
            }
            core::hint::spin_loop();
        }
    }
}
