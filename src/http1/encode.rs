//! Writing HTTP/1.1 framing (RFC 9112 §7.1): chunk-size lines, the last chunk, and header
//! fields, with no formatter and no allocation of their own.
//!
//! A streamed frame passes through the chunk-size line encoder on its way to the client (the
//! server) and a request body's chunk on its way upstream (the client): its digits are written
//! into a small array on the stack, not formatted into a `String`.

use http::{HeaderName, HeaderValue};

/// The CRLF that ends a chunk's data.
pub const CHUNK_END: &[u8] = b"\r\n";
/// The last chunk of a chunked body with no trailers, and the empty line after it.
pub const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

/// A chunk-size line: upper-case hexadecimal digits and CRLF, held inline (at most 16 digits
/// for a 64-bit size, and 2 for the CRLF), so a chunk costs no allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkSize {
    line: [u8; 18],
    len: u8,
}

// === impl ChunkSize ===

impl ChunkSize {
    /// The chunk-size line for a chunk of `n` bytes.
    #[inline]
    pub fn new(n: usize) -> ChunkSize {
        let mut line = [0u8; 18];
        let digits = (usize::BITS - n.leading_zeros()).div_ceil(4).max(1) as usize;
        for (i, slot) in line[..digits].iter_mut().enumerate() {
            let nibble = (n >> (4 * (digits - 1 - i))) & 0xF;
            *slot = b"0123456789ABCDEF"[nibble];
        }
        line[digits] = b'\r';
        line[digits + 1] = b'\n';
        ChunkSize {
            line,
            len: (digits + 2) as u8,
        }
    }

    /// The line's bytes, CRLF included.
    #[inline]
    pub fn as_bytes(&self) -> &[u8] {
        &self.line[..usize::from(self.len)]
    }
}

/// Appends header fields to a head being written, one `name: value` line each.
pub fn write_fields<'a>(
    out: &mut Vec<u8>,
    fields: impl IntoIterator<Item = (&'a HeaderName, &'a HeaderValue)>,
) {
    for (name, value) in fields {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderMap;

    #[test]
    fn chunk_size_lines_are_uppercase_hex() {
        for (n, text) in [
            (1, "1\r\n"),
            (15, "F\r\n"),
            (16, "10\r\n"),
            (255, "FF\r\n"),
            (4096, "1000\r\n"),
            (0x1234_ABCD, "1234ABCD\r\n"),
        ] {
            assert_eq!(ChunkSize::new(n).as_bytes(), text.as_bytes(), "{n}");
        }
        assert_eq!(ChunkSize::new(usize::MAX).as_bytes().len(), 16 + 2);
    }

    #[test]
    fn fields_are_written_one_line_each_in_order() {
        let mut headers = HeaderMap::new();
        headers.append("x-a", HeaderValue::from_static("1"));
        headers.append("x-a", HeaderValue::from_static("2"));
        headers.append("host", HeaderValue::from_static("b"));
        let mut out = Vec::new();
        write_fields(&mut out, &headers);
        assert_eq!(out, b"x-a: 1\r\nx-a: 2\r\nhost: b\r\n");
    }
}
