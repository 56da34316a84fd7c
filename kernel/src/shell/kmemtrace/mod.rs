//! The shell's `kmemtrace` command: its table row and dispatch. Two
//! mechanisms share the name (the tool names Linux and Akaros gave them):
//!
//! * [`trace_table`]: `kmemtrace start|stop|print|reset [CACHE|all]`, the
//!   per-cache table of outstanding objects (Akaros `kmem_trace`);
//! * [`event_stream`]: `kmemtrace record start|stop|status` and
//!   `kmemtrace dump`, every alloc and free as an event in per-CPU rings
//!   (Linux kmemtrace), sent to the host.

mod event_stream;
mod trace_table;

use core::fmt::Write;

pub use self::trace_table::write_record;
use super::{Command, Result, Shell};

/// The `kmemtrace` row of the command table.
pub(super) const KMEMTRACE: Command = Command {
    name: "kmemtrace",
    help: &[
        (
            "kmemtrace start|stop|print|reset [CACHE|all]",
            "trace a cache's outstanding objects",
        ),
        (
            "kmemtrace record start [--force] [--stacks [DEPTH]] [CACHE|all]",
            "record every alloc and free as events (per-CPU rings); --force drops an undumped one",
        ),
        (
            "kmemtrace record stop|status",
            "stop recording; events, overruns and fill per CPU",
        ),
        (
            "kmemtrace dump",
            "send the events to the host (target/kmemtrace/latest.kmt)",
        ),
    ],
    context: "shell kmemtrace",
    run: cmd_kmemtrace,
};

fn cmd_kmemtrace<'a>(_: &mut Shell, args: &[&'a str], out: &mut dyn Write) -> Result<'a> {
    match args {
        ["record", rest @ ..] => event_stream::cmd_record(rest, out),
        ["dump", rest @ ..] => event_stream::cmd_dump(rest, out),
        _ => trace_table::cmd_trace_table(args, out),
    }
}
