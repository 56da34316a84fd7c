//! The kernel log: a [`log`] crate backend writing to the serial console.
//!
//! Use the `log` macros (`log::error!`, `warn!`, `info!`, `debug!`,
//! `trace!`) anywhere, including in libraries such as `magpie-slab`. The
//! level comes from the boot argument `loglevel=error|warn|info|debug|trace`
//! (or `off`); the default is `info`.
//!
//! Lines look like `[    1.234567] WARN  cpu0 frame: message` — seconds are
//! TSC cycles divided by a nominal 1 GHz (TCG has no stable TSC frequency).

use log::{LevelFilter, Log, Metadata, Record};

use crate::dev::console;

struct KernelLog;

static LOGGER: KernelLog = KernelLog;

impl Log for KernelLog {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let ticks = crate::arch::rdtsc();
        let (seconds, micros) = (ticks / 1_000_000_000, (ticks % 1_000_000_000) / 1000);
        let target = record.target();
        let target = target.strip_prefix("magpie::").unwrap_or(target);
        console::write_fmt(format_args!(
            "[{seconds:5}.{micros:06}] {:<5} cpu{} {}: {}\n",
            record.level(),
            crate::arch::cpu_id(),
            target,
            record.args()
        ));
    }

    fn flush(&self) {}
}

/// Parses a `loglevel=` value.
pub fn parse_level(value: &str) -> Option<LevelFilter> {
    Some(match value {
        "off" | "0" => LevelFilter::Off,
        "error" | "1" => LevelFilter::Error,
        "warn" | "2" => LevelFilter::Warn,
        "info" | "3" => LevelFilter::Info,
        "debug" | "4" => LevelFilter::Debug,
        "trace" | "5" => LevelFilter::Trace,
        _ => return None,
    })
}

/// Installs the logger with the level from the command line's `loglevel=`.
pub(crate) fn init(cmdline: &str) {
    let requested = crate::mm::boot_info::cmdline_arg(cmdline, "loglevel");
    let level = requested.and_then(parse_level).unwrap_or(LevelFilter::Info);
    // A second call (never made by the kernel) would keep the first logger.
    let _ = log::set_logger(&LOGGER);
    log::set_max_level(level);
    if let Some(value) = requested.filter(|value| parse_level(value).is_none()) {
        log::warn!("unknown loglevel={value:?}; using info");
    }
}

/// Changes the log level at run time.
pub fn set_level(level: LevelFilter) {
    log::set_max_level(level);
}
