//! Finding the kernel ELF a dump came from, and symbolizing addresses with
//! its symbol table (`function+0xoff`) and DWARF (`file:line`, inlined
//! frames).
//!
//! The dump header carries the kernel's GNU build id (`NT_GNU_BUILD_ID`).
//! Without `--kernel`, [`find_kernel`] looks at the kernels cargo built —
//! `target/x86_64-unknown-none/{debug,release}/magpie` and the test kernels
//! in `deps/` — and takes the one whose build id matches. A kernel given
//! with `--kernel` that does not match is an error: its addresses would
//! name the wrong functions.

use std::fs::File;
use std::path::{Path, PathBuf};

use object::{Object, read::ReadCache};

use crate::dump::{KmemtraceHeader, hex};

/// Reads the GNU build id of an ELF file without reading all of it.
/// `Ok(None)`: a valid object file without a build id.
///
/// # Errors
///
/// A message with the path when the file cannot be read or is not an
/// object file.
pub fn read_build_id(path: &Path) -> Result<Option<Vec<u8>>, String> {
    let file = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let cache = ReadCache::new(file);
    let object = object::File::parse(&cache)
        .map_err(|e| format!("{}: not an ELF file: {e}", path.display()))?;
    let id = object
        .build_id()
        .map_err(|e| format!("{}: bad build id note: {e}", path.display()))?;
    Ok(id.map(<[u8]>::to_vec))
}

/// How the reports name addresses.
pub enum KernelChoice {
    /// Symbolize with this ELF (its build id matches the dump's, or the
    /// dump has none and the ELF was given explicitly).
    Elf(PathBuf),
    /// Print raw addresses; the reason is given as a warning.
    Raw(String),
}

/// The cargo target directories to search: `$CARGO_TARGET_DIR`, the
/// `target/` of the workspace around the current directory, and the one
/// this executable was built into.
pub fn target_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(d) = std::env::var_os("CARGO_TARGET_DIR") {
        dirs.push(PathBuf::from(d));
    }
    if let Ok(cwd) = std::env::current_dir() {
        for dir in cwd.ancestors() {
            let target = dir.join("target");
            if target.join("x86_64-unknown-none").is_dir() {
                dirs.push(target);
                break;
            }
        }
    }
    if let Ok(exe) = std::env::current_exe() {
        // target/x86_64-unknown-linux-gnu/debug/magpie-kmem (or deps/...)
        for dir in exe.ancestors().skip(1) {
            if dir.join("x86_64-unknown-none").is_dir() {
                dirs.push(dir.to_path_buf());
                break;
            }
        }
    }
    let mut unique: Vec<PathBuf> = Vec::new();
    for d in dirs {
        let canonical = d.canonicalize().unwrap_or(d);
        if !unique.contains(&canonical) {
            unique.push(canonical);
        }
    }
    unique
}

/// Kernel ELF candidates under one target directory: the `magpie` binary
/// of each profile first, then the test kernels in `deps/`.
pub fn candidates(target: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for profile in ["debug", "release"] {
        let dir = target.join("x86_64-unknown-none").join(profile);
        let kernel = dir.join("magpie");
        if kernel.is_file() {
            out.push(kernel);
        }
        if let Ok(entries) = std::fs::read_dir(dir.join("deps")) {
            let mut deps: Vec<PathBuf> = entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.is_file() && p.extension().is_none())
                .collect();
            deps.sort();
            out.extend(deps);
        }
    }
    out
}

/// Chooses the ELF to symbolize with (see the module doc).
///
/// # Errors
///
/// `explicit` is given and its build id differs from the dump's;
/// or no ELF was given, kernels were found, and none matches.
pub fn find_kernel(
    header: &KmemtraceHeader,
    explicit: Option<&Path>,
) -> Result<KernelChoice, String> {
    let want = header.build_id.to_vec();
    if let Some(path) = explicit {
        let got = read_build_id(path)?;
        if !header.has_build_id() {
            return Ok(KernelChoice::Elf(path.to_path_buf()));
        }
        return match got {
            Some(id) if id == want => Ok(KernelChoice::Elf(path.to_path_buf())),
            Some(id) => Err(format!(
                "kernel ELF mismatch: {} has build id {}, the dump was written by build id {}",
                path.display(),
                hex(&id),
                hex(&header.build_id)
            )),
            None => Err(format!(
                "kernel ELF mismatch: {} has no GNU build id, the dump was written by build id {}",
                path.display(),
                hex(&header.build_id)
            )),
        };
    }
    if !header.has_build_id() {
        return Ok(KernelChoice::Raw(
            "the dump has no build id; pass --kernel PATH to symbolize".into(),
        ));
    }
    let dirs = target_dirs();
    let mut searched = Vec::new();
    for dir in &dirs {
        for candidate in candidates(dir) {
            if let Ok(Some(id)) = read_build_id(&candidate)
                && id == want
            {
                return Ok(KernelChoice::Elf(candidate));
            }
            searched.push(candidate);
        }
    }
    if searched.is_empty() {
        return Ok(KernelChoice::Raw(format!(
            "no kernel ELF found to match build id {} (searched {}); pass --kernel PATH",
            hex(&header.build_id),
            if dirs.is_empty() {
                "no target directory".to_string()
            } else {
                dirs.iter()
                    .map(|d| d.join("x86_64-unknown-none").display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        )));
    }
    Err(format!(
        "kernel ELF mismatch: no kernel among {} ELF files in {} has build id {} \
         (rebuilt since the dump?); pass --kernel PATH, or --no-symbols",
        searched.len(),
        dirs.iter()
            .map(|d| d.join("x86_64-unknown-none").display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
        hex(&header.build_id)
    ))
}

/// A call site, named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Site {
    /// `function+0xoff`, or `0xaddress` when unknown.
    pub name: String,
    /// `file:line` of the call (the instruction before the return
    /// address), when DWARF knows it: the line in the innermost inlined
    /// function of the workspace (the `kmalloc!` line of a tagged site,
    /// which is its code tag's `file:line`), else the outermost frame's.
    pub location: Option<String>,
    /// The function that line is in (last path segment, as a code tag's
    /// `func:` names it), when it is a workspace function.
    pub function: Option<String>,
}

impl Site {
    /// `FILE:LINE func:NAME` (the code-tag layout of `allocinfo`), or as
    /// much of it as is known; the raw name without symbols.
    pub fn tag_info(&self) -> String {
        match (&self.location, &self.function) {
            (Some(location), Some(function)) => format!("{location} func:{function}"),
            (Some(location), None) => location.clone(),
            _ => self.name.clone(),
        }
    }

    /// The report's Source column: `FILE:LINE func:NAME` when the line is
    /// in a workspace function, `FILE:LINE` otherwise, empty without DWARF.
    pub fn source(&self) -> String {
        match &self.location {
            Some(_) => self.tag_info(),
            None => String::new(),
        }
    }
}

/// The last path segment of a demangled function name, generic arguments
/// and closures dropped: `<magpie::smp::stress::Worker>::alloc` → `alloc`,
/// `magpie::smp::stress::run::{closure#2}` → `run`.
pub fn bare_function_name(name: &str) -> String {
    let short = short_function_name(name);
    short
        .rsplit("::")
        .find(|segment| !segment.starts_with('{') && !segment.is_empty())
        .unwrap_or(&short)
        .trim_start_matches('<')
        .trim_end_matches('>')
        .to_string()
}

/// Names addresses: with an ELF, or raw.
pub struct Symbolizer {
    loader: Option<addr2line::Loader>,
    strip: Vec<String>,
    /// The ELF used, if any.
    pub elf: Option<PathBuf>,
}

impl Symbolizer {
    /// A symbolizer that prints raw addresses.
    pub fn raw() -> Symbolizer {
        Symbolizer {
            loader: None,
            strip: Vec::new(),
            elf: None,
        }
    }

    /// Loads an ELF's symbol table and DWARF.
    ///
    /// # Errors
    ///
    /// A message with the path when the file cannot be read or is not an
    /// ELF with symbols.
    pub fn from_elf(path: &Path) -> Result<Symbolizer, String> {
        let loader = addr2line::Loader::new(path)
            .map_err(|e| format!("{}: cannot load symbols: {e}", path.display()))?;
        // Paths in reports are relative to the workspace that built the
        // kernel (the directory above `target/`) or to the current one.
        let mut strip = Vec::new();
        let absolute = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
        for dir in absolute.ancestors() {
            if dir.file_name().is_some_and(|n| n == "target") {
                if let Some(root) = dir.parent() {
                    strip.push(format!("{}/", root.display()));
                }
                break;
            }
        }
        if let Ok(cwd) = std::env::current_dir() {
            strip.push(format!("{}/", cwd.display()));
        }
        Ok(Symbolizer {
            loader: Some(loader),
            strip,
            elf: Some(path.to_path_buf()),
        })
    }

    /// Whether a DWARF file path is in the workspace that built the
    /// kernel (not the Rust library, not a crates.io dependency).
    fn in_workspace(&self, file: &str) -> bool {
        self.strip
            .first()
            .is_some_and(|root| file.starts_with(root.as_str()) && !file.contains("/registry/src/"))
    }

    /// Whether a source file is the allocator library's own (`slab/src/`):
    /// its entry points are `#[inline(always)]` into their callers, so a
    /// call site's inlined frames start in it; the caller's line is the
    /// next frame out.
    fn in_allocator(&self, file: &str) -> bool {
        self.short_path(file).starts_with("slab/src/")
    }

    /// A source path as people read it: relative to the workspace;
    /// `core/src/...` for the Rust library; `crate-x.y.z/src/...` for a
    /// crates.io dependency.
    fn short_path(&self, file: &str) -> String {
        for prefix in &self.strip {
            if let Some(rest) = file.strip_prefix(prefix.as_str()) {
                return rest.to_string();
            }
        }
        for marker in ["/rustlib/src/rust/library/", "/rustc/"] {
            if let Some(at) = file.find(marker) {
                let rest = &file[at + marker.len()..];
                // `/rustc/<commit>/library/core/...`
                return match rest.find("/library/") {
                    Some(library) if marker == "/rustc/" => rest[library + 9..].to_string(),
                    _ => rest.to_string(),
                };
            }
        }
        if let Some(at) = file.find("/registry/src/") {
            let rest = &file[at + "/registry/src/".len()..];
            if let Some(slash) = rest.find('/') {
                return rest[slash + 1..].to_string();
            }
        }
        file.to_string()
    }

    /// The function (symbol table) a return address belongs to and the
    /// offset into it.
    pub fn function(&self, addr: u64) -> Option<(String, u64)> {
        let loader = self.loader.as_ref()?;
        // A return address may be one past the end of its function (a call
        // to a function that never returns is its last instruction): look
        // up the call itself, count the offset from the return address.
        let symbol = loader.find_symbol_info(addr.saturating_sub(1))?;
        let name = format!("{:#}", rustc_demangle::demangle(symbol.name()));
        Some((name, addr - symbol.address()))
    }

    /// Names a call site (a return address).
    pub fn site(&self, addr: u64) -> Site {
        let name = match self.function(addr) {
            Some((function, offset)) => {
                format!("{}+{offset:#x}", short_function_name(&function))
            }
            None => format!("{addr:#x}"),
        };
        let mut function = None;
        let location = self.loader.as_ref().and_then(|loader| {
            // The return address follows the call; the call is the line.
            // Of the inlined frames there (innermost first), the innermost
            // one in the workspace outside the allocator library (`slab/src/`,
            // whose entry points are inlined into their callers) holds the allocation call (a
            // `kmalloc!` line, or a `Vec::with_capacity` in kernel code);
            // when every frame is in a library, the outermost one's line
            // is in the function named above.
            let probe = addr.saturating_sub(1);
            let mut outermost = None;
            let mut ours = None;
            if let Ok(mut frames) = loader.find_frames(probe) {
                while let Ok(Some(frame)) = frames.next() {
                    if let Some(location) = frame.location {
                        if ours.is_none()
                            && location.file.is_some_and(|file| {
                                self.in_workspace(file) && !self.in_allocator(file)
                            })
                        {
                            ours = Some((location.file, location.line));
                            function = frame
                                .function
                                .as_ref()
                                .and_then(|f| f.demangle().ok())
                                .map(|name| bare_function_name(&name));
                        }
                        outermost = Some((location.file, location.line));
                    }
                }
            }
            let (file, line) = match ours.or(outermost) {
                Some(found) => found,
                None => {
                    let location = loader.find_location(probe).ok()??;
                    (location.file, location.line)
                }
            };
            let file = self.short_path(file?);
            Some(match line {
                Some(line) => format!("{file}:{line}"),
                None => file,
            })
        });
        Site {
            name,
            location,
            function,
        }
    }

    /// The functions at a return address, outermost first, with inlined
    /// callees expanded (for flamegraph frames). Raw: the address.
    pub fn frames(&self, addr: u64) -> Vec<String> {
        let Some(loader) = self.loader.as_ref() else {
            return vec![format!("{addr:#x}")];
        };
        let mut names = Vec::new();
        if let Ok(mut frames) = loader.find_frames(addr.saturating_sub(1)) {
            while let Ok(Some(frame)) = frames.next() {
                if let Some(Ok(name)) = frame.function.as_ref().map(|f| f.demangle()) {
                    names.push(short_function_name(&name));
                }
            }
        }
        if names.is_empty() {
            return match self.function(addr) {
                Some((function, _)) => vec![short_function_name(&function)],
                None => vec![format!("{addr:#x}")],
            };
        }
        names.reverse();
        names
    }
}

/// Longest function name a report prints (longer ones keep their head and
/// tail around `...`).
const MAX_FUNCTION_NAME: usize = 90;

/// A demangled Rust name as a report prints it: generic arguments dropped
/// (`Vec<T>::push` → `Vec::push`), the type and trait of a leading
/// qualified path cut to their last segment
/// (`<alloc::vec::Vec<T> as core::ops::Drop>::drop` → `<Vec as Drop>::drop`),
/// and at most `MAX_FUNCTION_NAME` (90) characters.
pub fn short_function_name(name: &str) -> String {
    let chars: Vec<char> = name.chars().collect();
    let mut out = String::with_capacity(name.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let previous = out.chars().last();
        let generic = c == '<'
            && previous.is_some_and(|p| p.is_alphanumeric() || p == '_' || p == ':' || p == '}');
        if generic {
            // Skip to the matching '>' ("->" inside is not one).
            let mut depth = 0usize;
            while i < chars.len() {
                match chars[i] {
                    '<' => depth += 1,
                    '>' if i == 0 || chars[i - 1] != '-' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
            if out.ends_with("::") {
                out.truncate(out.len() - 2);
            }
        } else {
            out.push(c);
        }
        i += 1;
    }
    let mut out = shorten_qualified_path(&out);
    if out.chars().count() > MAX_FUNCTION_NAME {
        let chars: Vec<char> = out.chars().collect();
        let head: String = chars[..40].iter().collect();
        let tail: String = chars[chars.len() - (MAX_FUNCTION_NAME - 43)..]
            .iter()
            .collect();
        out = format!("{head}...{tail}");
    }
    out
}

/// `<a::B as c::D>::f` → `<B as D>::f` (the leading qualified path only).
fn shorten_qualified_path(name: &str) -> String {
    if !name.starts_with('<') {
        return name.to_string();
    }
    let mut depth = 0usize;
    let mut end = None;
    for (i, c) in name.char_indices() {
        match c {
            '<' => depth += 1,
            '>' => {
                depth -= 1;
                if depth == 0 {
                    end = Some(i);
                    break;
                }
            }
            _ => {}
        }
    }
    let Some(end) = end else {
        return name.to_string();
    };
    let inner = &name[1..end];
    if inner.contains('<') {
        return name.to_string();
    }
    let last = |path: &str| path.rsplit("::").next().unwrap_or(path).to_string();
    let short: Vec<String> = inner.split(" as ").map(last).collect();
    format!("<{}>{}", short.join(" as "), &name[end + 1..])
}

#[cfg(test)]
mod tests {
    use super::short_function_name;

    #[test]
    fn rust_names_lose_generics_and_qualified_paths() {
        assert_eq!(
            short_function_name(
                "<alloc::vec::Vec<magpie::stress::CpuReport> as alloc::vec::spec_from_iter_nested::SpecFromIterNested<magpie::stress::CpuReport, core::iter::adapters::map::Map<core::slice::iter::Iter<spin::mutex::Mutex<magpie::stress::CpuReport>>, magpie::stress::run::{closure#3}>>>::from_iter"
            ),
            "<Vec as SpecFromIterNested>::from_iter"
        );
        assert_eq!(
            short_function_name("magpie::shell::kmem::cmd_kmalloc"),
            "magpie::shell::kmem::cmd_kmalloc"
        );
        assert_eq!(
            short_function_name("magpie::stress::run::{closure#2}"),
            "magpie::stress::run::{closure#2}"
        );
        assert_eq!(
            short_function_name(
                "core::ptr::drop_in_place::<alloc::boxed::Box<dyn core::ops::Fn(u8) -> u8>>"
            ),
            "core::ptr::drop_in_place"
        );
        assert_eq!(
            short_function_name("alloc::vec::Vec<T,A>::push"),
            "alloc::vec::Vec::push"
        );
        let long = format!("a::{}", "b".repeat(200));
        let short = short_function_name(&long);
        assert_eq!(short.chars().count(), 90);
        assert!(short.starts_with("a::bbb") && short.contains("..."));
    }
}
