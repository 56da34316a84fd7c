//! A small kmemtrace dump writer for the tests (ABI version 1, written
//! from docs/KMEMTRACE-ABI.md independently of the reader), and helpers to
//! run the `magpie-kmem` binary.
#![allow(
    dead_code,
    unused_imports,
    reason = "shared by several test binaries; each uses a part"
)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub const ALLOC: u8 = 1;
pub const FREE: u8 = 2;
pub const FAILED: u8 = 3;
pub const BAD_FREE: u8 = 4;
pub const KMALLOC: u8 = 1;
pub const CACHE: u8 = 2;
pub const PAGES: u8 = 3;

pub use magpie_kmemtrace_format::{
    HEADER_FLAG_FROM_BOOT as FLAG_FROM_BOOT, HEADER_FLAG_STACKS as FLAG_STACKS,
};

/// One event, field by field as in the ABI table.
#[derive(Clone, Copy, Debug)]
pub struct Ev {
    pub event: u8,
    pub ty: u8,
    pub cpu: u16,
    pub cache_id: u32,
    pub ts: u64,
    pub seq: u64,
    pub call_site: u64,
    pub ptr: u64,
    pub req: u64,
    pub alloc: u64,
    pub flags: u32,
    pub stack_id: u32,
}

impl Ev {
    pub fn bytes(&self) -> [u8; 64] {
        let mut b = [0u8; 64];
        b[0] = self.event;
        b[1] = self.ty;
        b[2..4].copy_from_slice(&self.cpu.to_le_bytes());
        b[4..8].copy_from_slice(&self.cache_id.to_le_bytes());
        b[8..16].copy_from_slice(&self.ts.to_le_bytes());
        b[16..24].copy_from_slice(&self.seq.to_le_bytes());
        b[24..32].copy_from_slice(&self.call_site.to_le_bytes());
        b[32..40].copy_from_slice(&self.ptr.to_le_bytes());
        b[40..48].copy_from_slice(&self.req.to_le_bytes());
        b[48..56].copy_from_slice(&self.alloc.to_le_bytes());
        b[56..60].copy_from_slice(&self.flags.to_le_bytes());
        b[60..64].copy_from_slice(&self.stack_id.to_le_bytes());
        b
    }
    pub fn stack(mut self, id: u32) -> Ev {
        self.stack_id = id;
        self
    }
    pub fn ty(mut self, ty: u8) -> Ev {
        self.ty = ty;
        self
    }
}

/// A kmalloc alloc on `cpu` at `ts` ns, sequence `seq`.
#[allow(
    clippy::too_many_arguments,
    reason = "one argument per field of the ABI's alloc record"
)]
pub fn alloc(
    cpu: u16,
    ts: u64,
    seq: u64,
    site: u64,
    ptr: u64,
    req: u64,
    size: u64,
    cache: u32,
) -> Ev {
    Ev {
        event: ALLOC,
        ty: KMALLOC,
        cpu,
        cache_id: cache,
        ts,
        seq,
        call_site: site,
        ptr,
        req,
        alloc: size,
        flags: 0,
        stack_id: 0,
    }
}

/// A kmalloc free.
pub fn free(cpu: u16, ts: u64, seq: u64, site: u64, ptr: u64, size: u64, cache: u32) -> Ev {
    Ev {
        event: FREE,
        ..alloc(cpu, ts, seq, site, ptr, 0, size, cache)
    }
}

fn record(kind: u16, body: &[u8]) -> Vec<u8> {
    let len = (8 + body.len()).div_ceil(8) * 8;
    let mut r = Vec::with_capacity(len);
    r.extend_from_slice(&kind.to_le_bytes());
    r.extend_from_slice(&0u16.to_le_bytes());
    r.extend_from_slice(&(len as u32).to_le_bytes());
    r.extend_from_slice(body);
    r.resize(len, 0);
    r
}

/// Builds a dump: header, records in the order added, trailer.
pub struct DumpBuilder {
    pub abi_version: u32,
    pub nr_cpus: u32,
    pub build_id: [u8; 20],
    pub flags: u32,
    pub record_start_ns: u64,
    pub stack_depth: u32,
    records: Vec<Vec<u8>>,
    nr_events: u64,
    nr_overruns: u64,
}

impl DumpBuilder {
    pub fn new(nr_cpus: u32) -> DumpBuilder {
        DumpBuilder {
            abi_version: 1,
            nr_cpus,
            build_id: [0; 20],
            flags: 0,
            record_start_ns: 0,
            stack_depth: 0,
            records: Vec::new(),
            nr_events: 0,
            nr_overruns: 0,
        }
    }

    pub fn cache(&mut self, id: u32, obj_size: u32, name: &str) -> &mut Self {
        let mut body = Vec::new();
        for v in [id, obj_size, 8, 0, name.len() as u32, 0] {
            body.extend_from_slice(&v.to_le_bytes());
        }
        body.extend_from_slice(name.as_bytes());
        self.records.push(record(1, &body));
        self
    }

    pub fn stack(&mut self, id: u32, frames: &[u64]) -> &mut Self {
        let mut body = Vec::new();
        body.extend_from_slice(&id.to_le_bytes());
        body.extend_from_slice(&(frames.len() as u32).to_le_bytes());
        for f in frames {
            body.extend_from_slice(&f.to_le_bytes());
        }
        self.records.push(record(2, &body));
        self
    }

    pub fn cpu(&mut self, cpu: u32, nr_overruns: u64, events: &[Ev]) -> &mut Self {
        let mut body = Vec::new();
        body.extend_from_slice(&cpu.to_le_bytes());
        body.extend_from_slice(&(events.len() as u32).to_le_bytes());
        body.extend_from_slice(&nr_overruns.to_le_bytes());
        body.extend_from_slice(&0u64.to_le_bytes());
        for e in events {
            body.extend_from_slice(&e.bytes());
        }
        self.records.push(record(3, &body));
        self.nr_events += events.len() as u64;
        self.nr_overruns += nr_overruns;
        self
    }

    pub fn raw_record(&mut self, kind: u16, body: &[u8]) -> &mut Self {
        self.records.push(record(kind, body));
        self
    }

    pub fn build(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(b"MAGPKMT\0");
        out.extend_from_slice(&self.abi_version.to_le_bytes());
        out.extend_from_slice(&64u32.to_le_bytes());
        out.extend_from_slice(&64u32.to_le_bytes());
        out.extend_from_slice(&self.nr_cpus.to_le_bytes());
        out.extend_from_slice(&self.build_id);
        out.extend_from_slice(&self.flags.to_le_bytes());
        out.extend_from_slice(&self.record_start_ns.to_le_bytes());
        out.extend_from_slice(&self.stack_depth.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        assert_eq!(out.len(), 64);
        for r in &self.records {
            out.extend_from_slice(r);
        }
        let checksum = crc32fast::hash(&out);
        let mut body = Vec::new();
        body.extend_from_slice(&self.nr_events.to_le_bytes());
        body.extend_from_slice(&self.nr_overruns.to_le_bytes());
        body.extend_from_slice(&(self.records.len() as u64).to_le_bytes());
        body.extend_from_slice(&checksum.to_le_bytes());
        body.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&record(0xFFFF, &body));
        out
    }
}

/// A fresh directory for one test's files.
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir()
        .join(format!("magpie-kmem-test-{}", std::process::id()))
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Writes `bytes` as `dir/name` and returns the path.
pub fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// Runs magpie-kmem with `args` in `dir`.
pub fn run(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_magpie-kmem"))
        .args(args)
        .current_dir(dir)
        .env_remove("CARGO_TARGET_DIR")
        .output()
        .expect("run magpie-kmem")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).unwrap()
}
