//! Reading a dump: the header, the framing of every record up to the
//! trailer, the checksum and the record count, then the records one by one.

use crate::{
    DumpFormatError, HEADER_SIZE, KmemtraceHeader, RECORD_HEADER_SIZE, RECORD_TRAILER, Record,
    RecordHeader, Trailer, le_u16, le_u32,
};

/// A dump whose header, record framing, trailer, checksum and record count
/// are checked; its record bodies are decoded on demand
/// ([`Self::records`], [`Record::decode`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DumpLayout<'a> {
    /// The header.
    pub header: KmemtraceHeader,
    /// The trailer.
    pub trailer: Trailer,
    /// Offset of the trailer record.
    pub trailer_offset: usize,
    /// The dump's bytes, header to trailer.
    bytes: &'a [u8],
}

impl<'a> DumpLayout<'a> {
    /// Check the dump at the start of `bytes` (which may go on with the
    /// next dump of the file): header, then each record header up to the
    /// trailer, then the trailer's body, checksum and record count.
    ///
    /// # Errors
    /// The [`DumpFormatError`] of the first fault, offset from the start
    /// of `bytes`: see [`KmemtraceHeader::from_bytes`],
    /// [`RecordHeader::read`] and [`Trailer::decode`];
    /// [`DumpFormatError::Checksum`], [`DumpFormatError::RecordCount`].
    pub fn parse(bytes: &'a [u8]) -> Result<Self, DumpFormatError> {
        let header = KmemtraceHeader::from_bytes(bytes)?;
        let mut offset = HEADER_SIZE;
        let mut nr_records = 0u64;
        let trailer_header = loop {
            let record = RecordHeader::read(bytes, offset, nr_records)?;
            if record.kind == RECORD_TRAILER {
                break record;
            }
            nr_records += 1;
            offset += record.length as usize;
        };
        let trailer_offset = offset;
        let end = trailer_offset + trailer_header.length as usize;
        let body_offset = trailer_offset + RECORD_HEADER_SIZE;
        let trailer = Trailer::decode(&bytes[body_offset..end], trailer_offset)?;
        let computed = crc32fast::hash(&bytes[..trailer_offset]);
        if computed != trailer.checksum {
            return Err(DumpFormatError::Checksum {
                offset: body_offset + 24,
                stored: trailer.checksum,
                computed,
                covered: trailer_offset,
            });
        }
        if trailer.nr_records != nr_records {
            return Err(DumpFormatError::RecordCount {
                offset: body_offset + 16,
                stored: trailer.nr_records,
                found: nr_records,
            });
        }
        Ok(DumpLayout {
            header,
            trailer,
            trailer_offset,
            bytes: &bytes[..end],
        })
    }

    /// Bytes of the dump, trailer included: where the next dump of a file
    /// starts.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Always false: a dump has at least a header and a trailer.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The records before the trailer, in file order (their framing is
    /// checked already).
    pub fn records(&self) -> Records<'a> {
        Records {
            bytes: &self.bytes[..self.trailer_offset],
            offset: HEADER_SIZE,
        }
    }
}

/// The records of a [`DumpLayout`], before the trailer.
#[derive(Debug, Clone)]
pub struct Records<'a> {
    /// The dump up to the trailer.
    bytes: &'a [u8],
    /// Offset of the next record.
    offset: usize,
}

impl<'a> Iterator for Records<'a> {
    type Item = Record<'a>;

    fn next(&mut self) -> Option<Record<'a>> {
        if self.offset >= self.bytes.len() {
            return None;
        }
        let offset = self.offset;
        let kind = le_u16(self.bytes, offset);
        let length = le_u32(self.bytes, offset + 4) as usize;
        self.offset += length;
        Some(Record {
            kind,
            offset,
            body: &self.bytes[offset + RECORD_HEADER_SIZE..offset + length],
        })
    }
}
