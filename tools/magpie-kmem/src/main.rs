//! `magpie-kmem`: the command line (see the crate documentation of
//! `magpie_kmem` and the README's "Analysing a kmemtrace dump").
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use magpie_kmem::analysis::{self, Issue, Severity};
use magpie_kmem::dump::Dump;
use magpie_kmem::graphs;
use magpie_kmem::report::{self, StatOptions};
use magpie_kmem::symbols::{self, KernelChoice, Symbolizer};
use magpie_kmem::{diff, export};

mod replay;

/// Offline analysis of Magpie kmemtrace dumps (target/kmemtrace/latest.kmt).
#[derive(Parser)]
#[command(name = "magpie-kmem", version)]
struct Cli {
    /// Kernel ELF to symbolize with (default: the build under target/
    /// whose GNU build id matches the dump's).
    #[arg(long, global = true, value_name = "PATH")]
    kernel: Option<PathBuf>,
    /// Print raw addresses; do not look for the kernel ELF.
    #[arg(long, global = true)]
    no_symbols: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The allocator's reports from a memory image (QEMU core): see docs/VMCORE.md.
    Core(magpie_kmem::core::CoreArgs),
    /// Validate a dump: framing, checksum, sequence gaps (overruns),
    /// timestamp order, unknown frees, double allocs, kernel ELF match.
    /// Exit 1 on an error.
    Check {
        /// The dump file.
        file: PathBuf,
    },
    /// perf-kmem-style statistics per call site, pointer and cache.
    Stat {
        /// Per call site (default when no table is chosen).
        #[arg(long)]
        caller: bool,
        /// Per pointer.
        #[arg(long)]
        alloc: bool,
        /// Per cache (default when no table is chosen).
        #[arg(long)]
        cache: bool,
        /// Sort keys, comma-separated: ptr, callsite, bytes, req, hit,
        /// pingpong, frag (perf kmem's default is frag,hit,bytes).
        #[arg(
            long,
            short = 's',
            value_name = "KEYS",
            default_value = "bytes,hit,frag"
        )]
        sort: String,
        /// Rows per table.
        #[arg(long, short = 'l', value_name = "N")]
        top: Option<usize>,
        /// JSON instead of tables.
        #[arg(long)]
        json: bool,
        /// The dump file.
        file: PathBuf,
    },
    /// Objects still live (outstanding) at the end of the record, by
    /// cache and call site (and stack), largest first. Live is not
    /// leaked: the objects the shell holds and the kernel's permanent
    /// allocations are live too; `kmem findleaks` in the shell finds
    /// the unreachable ones.
    Live {
        /// JSON instead of text.
        #[arg(long)]
        json: bool,
        /// List every buffer.
        #[arg(long, short = 'v')]
        verbose: bool,
        /// The dump file.
        file: PathBuf,
    },
    /// Renamed `live`: it lists outstanding objects, not leaks.
    #[command(hide = true)]
    Leaks {
        /// Whatever was given (refused with the new name).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Flamegraph SVG of bytes allocated by stack.
    Flamegraph {
        /// Bytes still live at the end instead of all bytes allocated.
        #[arg(long)]
        live: bool,
        /// The cache as a label of the site's frame (label, the default:
        /// one box per site) or as a leaf frame under it (leaf).
        #[arg(long, value_name = "label|leaf", default_value = "label")]
        caches: String,
        /// Keep the allocation plumbing frames (Rust's collections and
        /// `alloc`, the allocator's glue) instead of folding each run into
        /// the call the caller made.
        #[arg(long)]
        keep_plumbing: bool,
        /// The dump file.
        file: PathBuf,
        /// Output SVG.
        #[arg(short = 'o', long = "output", value_name = "OUT.svg")]
        output: PathBuf,
    },
    /// Export for other viewers: Chrome trace-event JSON (Perfetto UI),
    /// speedscope JSON, or folded stacks (`frame;frame BYTES`).
    Export {
        /// chrome (Perfetto), speedscope or folded.
        #[arg(long, value_name = "FORMAT")]
        format: String,
        /// Bytes still live at the end instead of all bytes allocated
        /// (speedscope, folded).
        #[arg(long)]
        live: bool,
        /// The dump file.
        file: PathBuf,
        /// Output file (default: standard output).
        #[arg(short = 'o', long = "output", value_name = "OUT")]
        output: Option<PathBuf>,
    },
    /// What grew from dump A to dump B: live bytes and objects at the end
    /// of each record, per call site and per cache (`allocinfo diff` layout).
    Diff {
        /// Rows per table.
        #[arg(long, value_name = "N")]
        top: Option<usize>,
        /// The earlier dump.
        a: PathBuf,
        /// The later dump.
        b: PathBuf,
    },
    /// Replay the dump's allocations and frees through magpie and the
    /// peer allocators: instructions per operation, peak pages, failures,
    /// checked (runs `magpie-bench replay`; docs/BENCHMARKS.md).
    Replay {
        /// JSON instead of the table.
        #[arg(long)]
        json: bool,
        /// No instruction counts (no valgrind runs).
        #[arg(long)]
        no_callgrind: bool,
        /// Allocators to run, comma-separated (default: all).
        #[arg(long, value_name = "A,B,...")]
        allocators: Option<String>,
        /// Heap of each allocator in MiB (default: from the dump).
        #[arg(long, value_name = "MIB")]
        heap_mib: Option<usize>,
        /// The dump file.
        file: PathBuf,
    },
    /// Timeline SVG of live bytes over time for the top caches.
    Timeline {
        /// One line per cache (default) or per call site.
        #[arg(long, value_name = "cache|site", default_value = "cache")]
        by: String,
        /// Start of the window drawn: a time since `record start` (1.5s,
        /// 250ms, 40us, 1000ns) or a shell command of the record
        /// (`stress`). Default: the first event.
        #[arg(long, value_name = "TIME|COMMAND")]
        from: Option<String>,
        /// End of the window drawn, as --from. Default: the last event.
        #[arg(long, value_name = "TIME|COMMAND")]
        to: Option<String>,
        /// The dump file.
        file: PathBuf,
        /// Output SVG.
        #[arg(short = 'o', long = "output", value_name = "OUT.svg")]
        output: PathBuf,
    },
}

/// The answer to the old `leaks` command.
const LEAKS_RENAMED: &str = "`leaks` is now `live`: it lists the objects outstanding at the end \
of the record, which are not all leaks (the shell's held objects, the kernel's permanent \
allocations); a leak is an object nothing points to: run `kmem findleaks` in the shell";

fn load(file: &Path) -> Result<Dump, String> {
    let bytes = std::fs::read(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let dump = Dump::parse(&bytes).map_err(|e| format!("{}: {e}", file.display()))?;
    if dump.nr_earlier_dumps > 0 {
        eprintln!(
            "magpie-kmem: note: {}: {}",
            file.display(),
            report::earlier_dumps_note(&dump)
        );
    }
    Ok(dump)
}

/// The symbolizer for reports: errors on an ELF mismatch, warns (stderr)
/// when it falls back to raw addresses.
fn symbolizer(cli: &Cli, dump: &Dump) -> Result<Symbolizer, String> {
    if cli.no_symbols {
        return Ok(Symbolizer::raw());
    }
    match symbols::find_kernel(&dump.header, cli.kernel.as_deref())? {
        KernelChoice::Elf(path) => Symbolizer::from_elf(&path),
        KernelChoice::Raw(reason) => {
            eprintln!("magpie-kmem: warning: {reason}; printing raw addresses");
            Ok(Symbolizer::raw())
        }
    }
}

fn write_output(path: &Path, bytes: &[u8]) -> Result<(), String> {
    std::fs::write(path, bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    eprintln!(
        "magpie-kmem: wrote {} ({} bytes)",
        path.display(),
        bytes.len()
    );
    Ok(())
}

fn run(cli: &Cli) -> Result<ExitCode, String> {
    match &cli.command {
        Command::Core(args) => magpie_kmem::core::main(args, cli.kernel.as_deref()),
        Command::Check { file } => {
            let dump = load(file)?;
            let mut replay = analysis::replay(&dump);
            let kernel = if cli.no_symbols {
                "not checked (--no-symbols)".to_string()
            } else {
                match symbols::find_kernel(&dump.header, cli.kernel.as_deref()) {
                    Ok(KernelChoice::Elf(path)) => {
                        if dump.header.has_build_id() {
                            format!("{} (build id matches)", path.display())
                        } else {
                            format!(
                                "{} (not verified: the dump has no build id)",
                                path.display()
                            )
                        }
                    }
                    Ok(KernelChoice::Raw(reason)) => {
                        replay.issues.push(Issue {
                            severity: Severity::Warning,
                            class: "kernel",
                            message: reason.clone(),
                        });
                        "none".to_string()
                    }
                    Err(message) => {
                        replay.issues.push(Issue {
                            severity: Severity::Error,
                            class: "kernel",
                            message,
                        });
                        "MISMATCH".to_string()
                    }
                }
            };
            emit(&report::check_text(
                &file.display().to_string(),
                &dump,
                &replay,
                &kernel,
            ))?;
            Ok(if replay.has_errors() {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            })
        }
        Command::Stat {
            caller,
            alloc,
            cache,
            sort,
            top,
            json,
            file,
        } => {
            let sort = report::parse_sort_keys(sort)?;
            let none = !caller && !alloc && !cache;
            let opts = StatOptions {
                caller: *caller || none,
                alloc: *alloc,
                cache: *cache || none,
                sort,
                top: *top,
            };
            let dump = load(file)?;
            let sym = symbolizer(cli, &dump)?;
            let replay = analysis::replay(&dump);
            if *json {
                let value = report::stat_json(&dump, &replay, &sym, &opts);
                emit_json(&value)?;
            } else {
                emit(&report::stat_text(&dump, &replay, &sym, &opts))?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Leaks { .. } => Err(LEAKS_RENAMED.to_string()),
        Command::Live {
            json,
            verbose,
            file,
        } => {
            let dump = load(file)?;
            let sym = symbolizer(cli, &dump)?;
            let replay = analysis::replay(&dump);
            if *json {
                let value = report::live_json(&dump, &replay, &sym);
                emit_json(&value)?;
            } else {
                let mut text = String::new();
                for note in report::live_caveats(&dump, &replay) {
                    text.push_str(&format!("note: {note}\n"));
                }
                text.push_str(&report::live_text(&dump, &replay, &sym, *verbose));
                emit(&text)?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Flamegraph {
            live,
            caches,
            keep_plumbing,
            file,
            output,
        } => {
            let caches = match caches.as_str() {
                "leaf" => graphs::CacheFrames::Leaf,
                "label" => graphs::CacheFrames::Label,
                other => return Err(format!("--caches {other}: leaf or label")),
            };
            let dump = load(file)?;
            let sym = symbolizer(cli, &dump)?;
            let replay = analysis::replay(&dump);
            let options = graphs::StackOptions {
                caches,
                keep_plumbing: *keep_plumbing,
            };
            let svg = graphs::flamegraph(&dump, &replay, &sym, *live, options)?;
            write_output(output, &svg)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Export {
            format,
            live,
            file,
            output,
        } => {
            let format = export::Format::parse(format)?;
            let dump = load(file)?;
            let sym = symbolizer(cli, &dump)?;
            if format == export::Format::Chrome {
                return export_chrome(&dump, &sym, output.as_deref());
            }
            let replay = analysis::replay(&dump);
            let bytes = export::export(&dump, &replay, &sym, format, *live)?;
            match output {
                Some(path) => write_output(path, &bytes)?,
                None => emit(&String::from_utf8_lossy(&bytes))?,
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Diff { top, a, b } => {
            let mut sides = Vec::new();
            for file in [a, b] {
                let dump = load(file)?;
                let sym = symbolizer(cli, &dump)?;
                let replay = analysis::replay(&dump);
                sides.push(diff::Side::of(
                    &file.display().to_string(),
                    &dump,
                    &replay,
                    &sym,
                ));
            }
            emit(&diff::diff_text(&sides[0], &sides[1], *top))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Replay {
            json,
            no_callgrind,
            allocators,
            heap_mib,
            file,
        } => replay::run(&replay::ReplayArgs {
            file,
            json: *json,
            no_callgrind: *no_callgrind,
            allocators: allocators.as_deref(),
            heap_mib: *heap_mib,
        }),
        Command::Timeline {
            by,
            from,
            to,
            file,
            output,
        } => {
            let dump = load(file)?;
            let marks = graphs::markers(&dump);
            let when = |value: &Option<String>, option: &str| {
                value
                    .as_deref()
                    .map(|text| graphs::parse_when(text, &marks))
                    .transpose()
                    .map_err(|error| format!("{option}: {error}"))
            };
            let window = graphs::Window {
                from_ns: when(from, "--from")?,
                to_ns: when(to, "--to")?,
            };
            let (series, by) = match by.as_str() {
                "cache" => {
                    let replay = analysis::replay_with_timeline(&dump);
                    (
                        graphs::timeline_series(&dump, &replay),
                        graphs::TimelineBy::Cache,
                    )
                }
                "site" => {
                    let sym = symbolizer(cli, &dump)?;
                    (
                        graphs::timeline_series_by_site(&dump, &sym),
                        graphs::TimelineBy::Site,
                    )
                }
                other => return Err(format!("--by {other}: cache or site")),
            };
            let svg = graphs::timeline(&series, by, &marks, window)?;
            write_output(output, svg.as_bytes())?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `export --format chrome`: streamed to `output` (standard output when
/// `None`), with a progress line on stderr every tenth of a large dump.
fn export_chrome(dump: &Dump, sym: &Symbolizer, output: Option<&Path>) -> Result<ExitCode, String> {
    use std::io::Write;
    let mut progress = |done: usize, total: usize| {
        eprintln!(
            "magpie-kmem: chrome export: {done}/{total} events ({}%)",
            done * 100 / total.max(1)
        );
    };
    match output {
        Some(path) => {
            let file =
                std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
            let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
            export::write_chrome(dump, sym, &mut out, &mut progress)
                .and_then(|()| out.flush())
                .map_err(|e| format!("{}: {e}", path.display()))?;
            let bytes = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
            eprintln!("magpie-kmem: wrote {} ({bytes} bytes)", path.display());
        }
        None => {
            let stdout = std::io::stdout().lock();
            let mut out = std::io::BufWriter::with_capacity(1 << 20, stdout);
            match export::write_chrome(dump, sym, &mut out, &mut progress)
                .and_then(|()| out.flush())
            {
                Err(error) if error.kind() != std::io::ErrorKind::BrokenPipe => {
                    return Err(format!("writing the export: {error}"));
                }
                _ => {}
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Write a report to standard output. A reader that stops early (`| head`)
/// closes the pipe: that ends the output quietly, as it does for `grep`
/// or `cat`, instead of a panic with a backtrace (`print!` panics on
/// `EPIPE`, and Rust ignores `SIGPIPE`).
fn emit(text: &str) -> Result<(), String> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(error) if error.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(format!("writing the report: {error}"))
        }
        _ => Ok(()),
    }
}

/// [`emit`] a JSON value, pretty-printed, with a final newline.
fn emit_json(value: &serde_json::Value) -> Result<(), String> {
    let mut text = serde_json::to_string_pretty(value).map_err(|e| e.to_string())?;
    text.push('\n');
    emit(&text)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(code) => code,
        Err(message) => {
            eprintln!("magpie-kmem: error: {message}");
            ExitCode::FAILURE
        }
    }
}
