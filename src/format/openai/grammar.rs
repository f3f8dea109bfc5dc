//! The JSON grammar of the walker: whitespace, strings, numbers, literals, objects and arrays,
//! read exactly as serde_json reads them, and skipped where the chunk's fields are not named.
//!
//! Nothing here knows the OpenAI chunk; `walker.rs` names the fields, and the template checks its
//! new text with the same string rules (`string_close`).

use super::walker::Walker;

/// Nesting the walker follows; deeper chunks go to serde (whose own limit is 128).
const MAX_DEPTH: u32 = 64;

/// A raw value's place in the chunk: `start..end`.
pub(super) type Span = (usize, usize);

/// The index of the closing quote of the string whose opening quote is at `open`, by the
/// walker's string rules; `None` if the string is not valid or does not close.
pub(super) fn string_close(bytes: &[u8], open: usize) -> Option<usize> {
    scan_string(bytes, open + 1).map(|(close, _)| close)
}

/// Reads string contents from `start`: the index of the closing quote and whether there were
/// escapes. Escapes are checked as serde_json checks them; a control character is refused.
fn scan_string(bytes: &[u8], start: usize) -> Option<(usize, bool)> {
    let mut i = start;
    let mut escaped = false;
    loop {
        // Eight bytes at a time up to the first that ends or escapes the string or is a
        // control character: most of a chunk is the inside of strings.
        if let Some(word) = bytes.get(i..i + 8) {
            let special = specials(u64::from_le_bytes(word.try_into().ok()?));
            if special == 0 {
                i += 8;
                continue;
            }
            i += (special.trailing_zeros() / 8) as usize;
        }
        match *bytes.get(i)? {
            b'"' => return Some((i, escaped)),
            b'\\' => {
                escaped = true;
                match *bytes.get(i + 1)? {
                    b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => i += 2,
                    b'u' => {
                        let hex = bytes.get(i + 2..i + 6)?;
                        if !hex.iter().all(u8::is_ascii_hexdigit) {
                            return None;
                        }
                        i += 6;
                    }
                    _ => return None,
                }
            }
            0..=0x1f => return None,
            _ => i += 1,
        }
    }
}

// === impl Walker ===

impl<'a> Walker<'a> {
    pub(super) fn whitespace(&mut self) {
        while let Some(b' ' | b'\n' | b'\t' | b'\r') = self.bytes.get(self.at) {
            self.at += 1;
        }
    }

    /// The next byte after whitespace, not consumed.
    pub(super) fn peek(&mut self) -> Option<u8> {
        self.whitespace();
        self.bytes.get(self.at).copied()
    }

    fn expect(&mut self, byte: u8) -> Option<()> {
        (self.peek()? == byte).then(|| self.at += 1)
    }

    fn literal(&mut self, literal: &[u8]) -> Option<()> {
        let end = self.at + literal.len();
        (self.bytes.get(self.at..end)? == literal).then(|| self.at = end)
    }

    /// A string whose opening quote is next: its contents' span and whether it has escapes.
    fn string(&mut self) -> Option<(Span, bool)> {
        let start = self.at + 1;
        let (close, escaped) = scan_string(self.bytes, start)?;
        self.at = close + 1;
        Some(((start, close), escaped))
    }

    /// A number, by the JSON grammar: `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`.
    fn number(&mut self) -> Option<()> {
        let b = self.bytes;
        let digit = |i: usize| b.get(i).is_some_and(u8::is_ascii_digit);
        let mut i = self.at;
        if b.get(i) == Some(&b'-') {
            i += 1;
        }
        match *b.get(i)? {
            b'0' => {
                i += 1;
                if digit(i) {
                    return None;
                }
            }
            b'1'..=b'9' => {
                while digit(i) {
                    i += 1;
                }
            }
            _ => return None,
        }
        if b.get(i) == Some(&b'.') {
            i += 1;
            let first = i;
            while digit(i) {
                i += 1;
            }
            if i == first {
                return None;
            }
        }
        if let Some(b'e' | b'E') = b.get(i) {
            i += 1;
            if let Some(b'+' | b'-') = b.get(i) {
                i += 1;
            }
            let first = i;
            while digit(i) {
                i += 1;
            }
            if i == first {
                return None;
            }
        }
        self.at = i;
        Some(())
    }

    /// Any value, skipped; its span.
    pub(super) fn value(&mut self) -> Option<Span> {
        let first = self.peek()?;
        let start = self.at;
        match first {
            b'"' => {
                self.string()?;
            }
            b'{' => self.object(|w, _| w.value().map(drop))?,
            b'[' => self.array(|w| w.value().map(drop))?,
            b't' => self.literal(b"true")?,
            b'f' => self.literal(b"false")?,
            b'n' => self.literal(b"null")?,
            b'-' | b'0'..=b'9' => self.number()?,
            _ => return None,
        }
        Some((start, self.at))
    }

    /// An `Option<&RawValue>`: `null` is `None`, anything else its span.
    pub(super) fn optional(&mut self) -> Option<Option<Span>> {
        if self.peek()? == b'n' {
            self.literal(b"null")?;
            return Some(None);
        }
        self.value().map(Some)
    }

    /// `null`, or else an object read by `read`, or else not for the walker.
    pub(super) fn null_or_object(
        &mut self,
        read: impl FnOnce(&mut Self) -> Option<()>,
    ) -> Option<()> {
        match self.peek()? {
            b'n' => self.literal(b"null"),
            b'{' => read(self),
            _ => None,
        }
    }

    /// `null`, or else an array whose elements `element` reads, or else not for the walker.
    pub(super) fn null_or_array(
        &mut self,
        element: impl FnMut(&mut Self) -> Option<()>,
    ) -> Option<()> {
        match self.peek()? {
            b'n' => self.literal(b"null"),
            b'[' => self.array(element),
            _ => None,
        }
    }

    /// An object: `member` gets each field name (without escapes) and reads its value.
    pub(super) fn object(
        &mut self,
        mut member: impl FnMut(&mut Self, &'a [u8]) -> Option<()>,
    ) -> Option<()> {
        self.expect(b'{')?;
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return None;
        }
        if self.peek()? == b'}' {
            self.at += 1;
            self.depth -= 1;
            return Some(());
        }
        loop {
            if self.peek()? != b'"' {
                return None;
            }
            let ((start, end), escaped) = self.string()?;
            if escaped {
                return None;
            }
            self.expect(b':')?;
            let bytes = self.bytes;
            member(self, &bytes[start..end])?;
            match self.peek()? {
                b',' => self.at += 1,
                b'}' => {
                    self.at += 1;
                    self.depth -= 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// An array: `element` reads each element.
    pub(super) fn array(&mut self, mut element: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        self.expect(b'[')?;
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return None;
        }
        if self.peek()? == b']' {
            self.at += 1;
            self.depth -= 1;
            return Some(());
        }
        loop {
            element(self)?;
            match self.peek()? {
                b',' => self.at += 1,
                b']' => {
                    self.at += 1;
                    self.depth -= 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    pub(super) fn raw(&self, (start, end): Span) -> &'a [u8] {
        &self.bytes[start..end]
    }
}

/// The bytes of `word` (little-endian) that end or escape a string or are control
/// characters, as the high bit of each: the classic zero-byte test on `word ^ '"'` and
/// `word ^ '\\'`, and the less-than test on `word < 0x20`. Borrows only run upwards, so the
/// lowest bit set marks the first such byte exactly (higher ones may be false alarms).
fn specials(word: u64) -> u64 {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let zero = |v: u64| v.wrapping_sub(ONES) & !v;
    let quote = zero(word ^ (ONES * u64::from(b'"')));
    let backslash = zero(word ^ (ONES * u64::from(b'\\')));
    let control = word.wrapping_sub(ONES * 0x20) & !word;
    (quote | backslash | control) & HIGH
}

/// As `json::plain_string` on the raw text: a string without escapes, unquoted.
pub(super) fn plain_string(raw: &str) -> Option<&str> {
    let inner = raw.strip_prefix('"')?.strip_suffix('"')?;
    (!inner.contains('\\')).then_some(inner)
}

/// As `json::non_empty_string` on the raw text.
pub(super) fn non_empty_string(raw: &[u8]) -> bool {
    raw.len() > 2 && raw[0] == b'"'
}
