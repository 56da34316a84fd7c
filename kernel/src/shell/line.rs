//! The line editor: console bytes in, command lines out, with a history.
//!
//! It refuses rather than drops: every byte typed is kept (up to
//! [`MAX_LINE`]) and either ends up in the line or makes the line an error.
//! The editing keys are those of a readline prompt:
//!
//! | bytes | what happens |
//! | --- | --- |
//! | CR, LF, CR LF | ends the line (a good, non-empty line goes into the history) |
//! | backspace (0x08), DEL (0x7f) | removes the byte before the cursor |
//! | Ctrl-C (0x03) | cancels the line: `^C`, a new prompt, nothing run |
//! | Ctrl-U (0x15) | removes everything before the cursor |
//! | Up, Down (`ESC [ A`, `ESC [ B`; `ESC O A/B` too) | the previous / next line of the history ([`HISTORY_LEN`] lines); Down past the newest gives back the line being typed |
//! | Left, Right (`ESC [ D`, `ESC [ C`), Home, End (`ESC [ H/F`, `ESC [ 1~/4~`), Delete (`ESC [ 3~`) | move the cursor; delete the byte under it |
//! | tab | completes the word before the cursor when its candidates ([`Completer`]: command names first, cache names after) share more than it holds: the whole name and a space when one matches, else their common prefix; otherwise kept, a word separator like a space (echoed as a space) |
//! | printable ASCII | inserted at the cursor and echoed |
//! | any other (other control bytes and escape sequences, non-ASCII / UTF-8) | kept and echoed as `?`; the line is then refused with [`Edit::Invalid`] naming the first such byte and its column |
//!
//! The echo redraws with backspaces, `ESC [ n D` and `ESC [ K` only: the
//! prompt is never printed again, so a transcript has one prompt a line.

use core::fmt::{self, Write};

use super::{MAX_LINE, is_line_byte};
use crate::dev::console;

/// Lines the history keeps (the oldest goes first).
pub const HISTORY_LEN: usize = 32;

/// Ctrl-C.
pub const CTRL_C: u8 = 0x03;
/// Ctrl-U.
const CTRL_U: u8 = 0x15;
/// Escape, the start of a cursor key's sequence.
const ESC: u8 = 0x1b;
/// Bytes of an escape sequence kept while it is read (`ESC [ 1 ; 5 A`).
const MAX_SEQUENCE: usize = 8;

/// Where the editor is in an escape sequence.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Escape {
    /// Not in one.
    None,
    /// After `ESC`.
    Start,
    /// After `ESC [` or `ESC O`: parameter bytes until the final byte.
    Sequence,
}

/// A cursor key, decoded.
#[derive(Clone, Copy)]
enum Key {
    Up,
    Down,
    Left,
    Right,
    Home,
    End,
    Delete,
}

/// Tab completion's candidates: called with the index of the word being
/// completed (0: the command) and the word so far; hands every candidate
/// that starts with it to `each`.
pub type Completer = fn(usize, &str, &mut dyn FnMut(&str));

/// Collects a command line from console bytes: echo, cursor keys, history,
/// overlong lines, bytes the shell does not take. Feeds on bytes, so it is
/// testable without a console.
pub struct LineEditor {
    completer: Option<Completer>,
    buffer: [u8; MAX_LINE],
    len: usize,
    /// Where the next byte goes, `0..=len`.
    cursor: usize,
    too_long: bool,
    last_was_cr: bool,
    escape: Escape,
    sequence: [u8; MAX_SEQUENCE],
    sequence_len: usize,
    /// Good lines entered, oldest first, as a ring of `nr_history` lines
    /// ending before `history_next`.
    history: [[u8; MAX_LINE]; HISTORY_LEN],
    history_lens: [u8; HISTORY_LEN],
    history_next: usize,
    nr_history: usize,
    /// The history line shown (1: the newest), 0 while typing a new line.
    browsing: usize,
    /// The line being typed when Up was first pressed.
    draft: [u8; MAX_LINE],
    draft_len: usize,
}

// History lines are at most MAX_LINE bytes: their lengths fit a u8.
const _: () = assert!(MAX_LINE <= u8::MAX as usize);

/// What a byte fed to the [`LineEditor`] completed.
#[derive(Debug, PartialEq, Eq)]
pub enum Edit<'a> {
    /// Nothing yet.
    Pending,
    /// A whole line (without the newline).
    Line(&'a str),
    /// Ctrl-C: the line was dropped (`^C` echoed); nothing to run.
    Cancelled,
    /// A line that exceeded [`MAX_LINE`]; it was discarded.
    TooLong,
    /// A line holding a byte that is not printable ASCII or a tab: the
    /// first such byte and its column (from 1). The line was discarded.
    Invalid {
        /// The byte.
        byte: u8,
        /// Its column, from 1.
        column: usize,
    },
}

/// What the terminal shows for a byte of the line.
fn shown(byte: &u8) -> &[u8] {
    match byte {
        b'\t' => b" ",
        b' '..=b'~' => core::slice::from_ref(byte),
        _ => b"?",
    }
}

/// Echoes `ESC [ n D` (cursor `n` columns left), nothing for 0.
fn echo_left(n: usize, echo: &mut dyn FnMut(&[u8])) {
    if n == 0 {
        return;
    }
    let mut text = [0u8; 8];
    let mut cursor = Cursor {
        bytes: &mut text,
        len: 0,
    };
    let _ = write!(cursor, "\x1b[{n}D");
    let len = cursor.len;
    echo(&text[..len]);
}

/// A `fmt::Write` into a byte array (for the cursor sequences).
struct Cursor<'b> {
    bytes: &'b mut [u8],
    len: usize,
}

impl Write for Cursor<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let end = self.len + s.len();
        self.bytes
            .get_mut(self.len..end)
            .ok_or(fmt::Error)?
            .copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

impl LineEditor {
    /// An empty line and an empty history.
    pub const fn new() -> Self {
        Self {
            completer: None,
            buffer: [0; MAX_LINE],
            len: 0,
            cursor: 0,
            too_long: false,
            last_was_cr: false,
            escape: Escape::None,
            sequence: [0; MAX_SEQUENCE],
            sequence_len: 0,
            history: [[0; MAX_LINE]; HISTORY_LEN],
            history_lens: [0; HISTORY_LEN],
            history_next: 0,
            nr_history: 0,
            browsing: 0,
            draft: [0; MAX_LINE],
            draft_len: 0,
        }
    }

    /// An editor whose Tab completes words with `completer`.
    pub const fn with_completer(completer: Completer) -> Self {
        let mut editor = Self::new();
        editor.completer = Some(completer);
        editor
    }

    /// Takes one byte; `echo` receives what should be echoed to the terminal.
    pub fn feed(&mut self, byte: u8, echo: &mut dyn FnMut(&[u8])) -> Edit<'_> {
        match self.escape {
            Escape::Start => {
                if matches!(byte, b'[' | b'O') {
                    self.sequence[1] = byte;
                    self.sequence_len = 2;
                    self.escape = Escape::Sequence;
                    return Edit::Pending;
                }
                // A lone ESC: a byte the shell does not take.
                self.escape = Escape::None;
                self.insert_refused(&[ESC], echo);
            }
            Escape::Sequence => {
                let room = self.sequence_len < MAX_SEQUENCE;
                if room && (0x40..=0x7e).contains(&byte) {
                    // The final byte.
                    self.sequence[self.sequence_len] = byte;
                    self.sequence_len += 1;
                    self.escape = Escape::None;
                    let sequence = self.sequence;
                    let sequence = &sequence[..self.sequence_len];
                    match Self::key(sequence) {
                        Some(key) => self.key_pressed(key, echo),
                        None => self.insert_refused(sequence, echo),
                    }
                    return Edit::Pending;
                }
                if room && (0x20..=0x3f).contains(&byte) {
                    self.sequence[self.sequence_len] = byte;
                    self.sequence_len += 1;
                    return Edit::Pending;
                }
                // Not a sequence after all: keep what came, refused, and
                // take this byte as itself.
                self.escape = Escape::None;
                let sequence = self.sequence;
                self.insert_refused(&sequence[..self.sequence_len], echo);
            }
            Escape::None => {}
        }
        let was_cr = core::mem::replace(&mut self.last_was_cr, byte == b'\r');
        match byte {
            b'\n' if was_cr => Edit::Pending,
            b'\r' | b'\n' => {
                echo(b"\n");
                let (len, too_long) = (self.len, self.too_long);
                self.clear();
                if too_long {
                    return Edit::TooLong;
                }
                if let Some(index) = self.buffer[..len]
                    .iter()
                    .position(|&byte| !is_line_byte(byte))
                {
                    return Edit::Invalid {
                        byte: self.buffer[index],
                        column: index + 1,
                    };
                }
                self.remember(len);
                // Only printable ASCII and tabs are left: valid UTF-8.
                Edit::Line(core::str::from_utf8(&self.buffer[..len]).unwrap_or(""))
            }
            CTRL_C => {
                echo(b"^C\n");
                self.clear();
                Edit::Cancelled
            }
            CTRL_U => {
                if !self.too_long && self.cursor > 0 {
                    let old_cursor = self.cursor;
                    self.buffer.copy_within(self.cursor..self.len, 0);
                    self.len -= self.cursor;
                    self.cursor = 0;
                    self.redraw(old_cursor, echo);
                }
                Edit::Pending
            }
            b'\t' if self.complete(echo) => Edit::Pending,
            ESC => {
                self.sequence[0] = ESC;
                self.escape = Escape::Start;
                Edit::Pending
            }
            0x7f | 0x08 => {
                if self.cursor > 0 && !self.too_long {
                    self.remove(self.cursor - 1);
                    self.cursor -= 1;
                    if self.cursor == self.len {
                        echo(b"\x08 \x08");
                    } else {
                        self.redraw(self.cursor + 1, echo);
                    }
                }
                Edit::Pending
            }
            _ => {
                self.insert(byte, echo);
                Edit::Pending
            }
        }
    }

    /// Tab: completes the word before the cursor if its candidates add
    /// something to it (see [`Completer`]); returns whether it did (if not,
    /// the tab is kept as a separator).
    fn complete(&mut self, echo: &mut dyn FnMut(&[u8])) -> bool {
        let Some(completer) = self.completer else {
            return false;
        };
        if self.too_long {
            return false;
        }
        let before = &self.buffer[..self.cursor];
        let start = before
            .iter()
            .rposition(|&byte| byte == b' ' || byte == b'\t')
            .map_or(0, |at| at + 1);
        let Ok(word) = core::str::from_utf8(&before[start..]) else {
            return false;
        };
        if word.is_empty() || !word.bytes().all(is_line_byte) {
            return false;
        }
        let index = core::str::from_utf8(&before[..start])
            .map_or(0, |head| head.split_whitespace().count());
        // The candidates' longest common prefix, and whether there was one
        // candidate only.
        let mut common = [0u8; MAX_LINE];
        let mut common_len = None::<usize>;
        let mut nr_candidates = 0;
        completer(index, word, &mut |candidate| {
            if !candidate.starts_with(word) || candidate.len() > MAX_LINE {
                return;
            }
            nr_candidates += 1;
            match common_len {
                None => {
                    common[..candidate.len()].copy_from_slice(candidate.as_bytes());
                    common_len = Some(candidate.len());
                }
                Some(len) => {
                    let shared = common[..len]
                        .iter()
                        .zip(candidate.as_bytes())
                        .take_while(|(a, b)| a == b)
                        .count();
                    common_len = Some(shared);
                }
            }
        });
        let Some(common_len) = common_len else {
            return false;
        };
        let mut added = common_len - word.len();
        if nr_candidates == 1 {
            // The whole name, then a separator.
            common[common_len] = b' ';
            added += 1;
        }
        if added == 0 || self.len + added > MAX_LINE {
            return false;
        }
        for &byte in &common[word.len()..word.len() + added] {
            self.insert(byte, echo);
        }
        true
    }

    /// The key an escape sequence names, if it is one the editor uses.
    fn key(sequence: &[u8]) -> Option<Key> {
        match &sequence[1..] {
            b"[A" | b"OA" => Some(Key::Up),
            b"[B" | b"OB" => Some(Key::Down),
            b"[C" | b"OC" => Some(Key::Right),
            b"[D" | b"OD" => Some(Key::Left),
            b"[H" | b"OH" | b"[1~" | b"[7~" => Some(Key::Home),
            b"[F" | b"OF" | b"[4~" | b"[8~" => Some(Key::End),
            b"[3~" => Some(Key::Delete),
            _ => None,
        }
    }

    fn key_pressed(&mut self, key: Key, echo: &mut dyn FnMut(&[u8])) {
        if self.too_long {
            return;
        }
        match key {
            Key::Up => {
                if self.browsing < self.nr_history {
                    if self.browsing == 0 {
                        self.draft[..self.len].copy_from_slice(&self.buffer[..self.len]);
                        self.draft_len = self.len;
                    }
                    self.browsing += 1;
                    self.show_history(echo);
                }
            }
            Key::Down => {
                if self.browsing > 0 {
                    self.browsing -= 1;
                    self.show_history(echo);
                }
            }
            Key::Left => {
                if self.cursor > 0 {
                    self.cursor -= 1;
                    echo(b"\x08");
                }
            }
            Key::Right => {
                if self.cursor < self.len {
                    echo(shown(&self.buffer[self.cursor]));
                    self.cursor += 1;
                }
            }
            Key::Home => {
                echo_left(self.cursor, echo);
                self.cursor = 0;
            }
            Key::End => {
                for byte in &self.buffer[self.cursor..self.len] {
                    echo(shown(byte));
                }
                self.cursor = self.len;
            }
            Key::Delete => {
                if self.cursor < self.len {
                    self.remove(self.cursor);
                    self.redraw(self.cursor, echo);
                }
            }
        }
    }

    /// Replaces the line with history line `browsing` (0: the draft).
    fn show_history(&mut self, echo: &mut dyn FnMut(&[u8])) {
        let old_cursor = self.cursor;
        if self.browsing == 0 {
            self.buffer[..self.draft_len].copy_from_slice(&self.draft[..self.draft_len]);
            self.len = self.draft_len;
        } else {
            let slot = (self.history_next + HISTORY_LEN - self.browsing) % HISTORY_LEN;
            let len = usize::from(self.history_lens[slot]);
            self.buffer[..len].copy_from_slice(&self.history[slot][..len]);
            self.len = len;
        }
        self.cursor = self.len;
        self.redraw(old_cursor, echo);
    }

    /// Redraws the line after an edit: back from `old_cursor` to its
    /// start, the whole line, erase to the end of the screen line, back to
    /// the cursor.
    fn redraw(&self, old_cursor: usize, echo: &mut dyn FnMut(&[u8])) {
        echo_left(old_cursor, echo);
        for byte in &self.buffer[..self.len] {
            echo(shown(byte));
        }
        echo(b"\x1b[K");
        echo_left(self.len - self.cursor, echo);
    }

    fn insert(&mut self, byte: u8, echo: &mut dyn FnMut(&[u8])) {
        if self.len == MAX_LINE {
            self.too_long = true;
            return;
        }
        if self.too_long {
            return;
        }
        self.buffer
            .copy_within(self.cursor..self.len, self.cursor + 1);
        self.buffer[self.cursor] = byte;
        self.len += 1;
        self.cursor += 1;
        if self.cursor == self.len {
            echo(shown(&byte));
        } else {
            self.redraw(self.cursor - 1, echo);
        }
    }

    /// Keeps the bytes of an escape sequence the editor does not use: they
    /// make the line an error naming the `ESC`.
    fn insert_refused(&mut self, bytes: &[u8], echo: &mut dyn FnMut(&[u8])) {
        for &byte in bytes {
            self.insert(byte, echo);
        }
    }

    fn remove(&mut self, at: usize) {
        self.buffer.copy_within(at + 1..self.len, at);
        self.len -= 1;
    }

    /// Starts an empty line (the buffer's bytes stay until overwritten).
    fn clear(&mut self) {
        self.len = 0;
        self.cursor = 0;
        self.too_long = false;
        self.browsing = 0;
        self.escape = Escape::None;
    }

    /// Puts the good line `buffer[..len]` into the history: not an empty
    /// line, nor one equal to the newest.
    fn remember(&mut self, len: usize) {
        let line = &self.buffer[..len];
        if line.iter().all(|&byte| byte == b' ' || byte == b'\t') {
            return;
        }
        if self.nr_history > 0 {
            let newest = (self.history_next + HISTORY_LEN - 1) % HISTORY_LEN;
            if &self.history[newest][..usize::from(self.history_lens[newest])] == line {
                return;
            }
        }
        let slot = self.history_next;
        self.history[slot][..len].copy_from_slice(line);
        self.history_lens[slot] = len as u8;
        self.history_next = (slot + 1) % HISTORY_LEN;
        self.nr_history = (self.nr_history + 1).min(HISTORY_LEN);
    }
}

impl Default for LineEditor {
    fn default() -> Self {
        Self::new()
    }
}

/// Writes straight to the serial console (no allocation).
pub struct ConsoleWriter;

impl Write for ConsoleWriter {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        console::write_bytes(s.as_bytes());
        Ok(())
    }
}
