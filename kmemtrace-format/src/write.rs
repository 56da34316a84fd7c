//! Writing a dump: one pass into a sink, nothing buffered.

use crate::{
    CacheRecord, CpuRecord, KmemtraceEvent, KmemtraceHeader, MarkRecord, StackRecord, TRAILER_SIZE,
    Trailer,
};

/// What a dump wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DumpSummary {
    /// Events written.
    pub nr_events: u64,
    /// Overruns reported (all CPUs).
    pub nr_overruns: u64,
    /// Records before the trailer.
    pub nr_records: u64,
    /// Bytes written, trailer included.
    pub nr_bytes: u64,
    /// The trailer's CRC-32.
    pub checksum: u32,
}

/// Streams one dump into a sink: [`Self::new`] writes the header, then
/// CACHE, STACK and CPU records in any order, then [`Self::finish`] the
/// trailer with the counts and the checksum of every byte before it.
pub struct DumpWriter<'a> {
    sink: &'a mut dyn FnMut(&[u8]),
    crc: crc32fast::Hasher,
    summary: DumpSummary,
}

impl<'a> DumpWriter<'a> {
    /// Start a dump with `header`.
    pub fn new(header: &KmemtraceHeader, sink: &'a mut dyn FnMut(&[u8])) -> Self {
        let mut writer = DumpWriter {
            sink,
            crc: crc32fast::Hasher::new(),
            summary: DumpSummary::default(),
        };
        writer.write(&header.to_bytes());
        writer
    }

    fn write(&mut self, bytes: &[u8]) {
        self.crc.update(bytes);
        (self.sink)(bytes);
        self.summary.nr_bytes += bytes.len() as u64;
    }

    /// Calls `encode` with this writer's output and counts one record.
    fn record(&mut self, encode: impl FnOnce(&mut dyn FnMut(&[u8]))) {
        encode(&mut |bytes: &[u8]| self.write(bytes));
        self.summary.nr_records += 1;
    }

    /// A CACHE record.
    pub fn cache<Name: AsRef<str>>(&mut self, cache: &CacheRecord<Name>) {
        self.record(|out| cache.encode(out));
    }

    /// A MARK record.
    pub fn mark<Text: AsRef<str>>(&mut self, mark: &MarkRecord<Text>) {
        self.record(|out| mark.encode(out));
    }

    /// A STACK record (stack `id`, frames innermost first).
    pub fn stack(&mut self, id: u32, frames: &[u64]) {
        self.record(|out| StackRecord::encode(id, frames, out));
    }

    /// A CPU record: `events` of `cpu`, and the overruns it reports.
    pub fn cpu(
        &mut self,
        cpu: u32,
        nr_overruns: u64,
        events: impl ExactSizeIterator<Item = KmemtraceEvent>,
    ) {
        self.summary.nr_events += events.len() as u64;
        self.summary.nr_overruns += nr_overruns;
        self.record(|out| CpuRecord::encode(cpu, nr_overruns, events, out));
    }

    /// Write the trailer and say what the dump holds.
    pub fn finish(mut self) -> DumpSummary {
        let trailer = Trailer {
            nr_events: self.summary.nr_events,
            nr_overruns: self.summary.nr_overruns,
            nr_records: self.summary.nr_records,
            checksum: self.crc.clone().finalize(),
        };
        let bytes: [u8; TRAILER_SIZE] = trailer.to_bytes();
        self.write(&bytes);
        DumpSummary {
            checksum: trailer.checksum,
            ..self.summary
        }
    }
}
