//! The HTTP/1.1 message body decoder (RFC 9112 §6 and §7.1), for either role: the server reads
//! a client's request body with it ([`Decoder::strict`]), the client an upstream's response body
//! ([`Decoder::new`]). It takes the body's bytes out of the connection's read buffer as they
//! arrive, without copying them, and says where the message ends, so the connection can read the
//! next message (the server's next request, the client's connection back to its pool).
//!
//! Each call yields at most one piece of data, split off the read buffer: with chunked coding a
//! piece never spans two chunks (as hyper's decoder gives them), so a frame the client gets is
//! the upstream's chunk, or the part of it that has arrived.

use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue};

/// How long a message body is, from its head (RFC 9112 §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyLength {
    /// No body at all (a request without one; a `HEAD` answer, 204, 304).
    Empty,
    /// `content-length` bytes.
    Length(u64),
    /// `transfer-encoding: chunked`.
    Chunked,
    /// Until the peer closes the connection (a response only: a request has no such body).
    UntilClose,
}

/// What one step of decoding gave.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded {
    /// The next piece of the body, split off the read buffer.
    Data(Bytes),
    /// The body's end, with the trailers of a chunked body (empty when there were none).
    End(HeaderMap),
    /// The read buffer holds no more of the body: read more.
    NeedMore,
}

/// Why a message body could not be read: the peer broke HTTP/1.1's framing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// A chunk-size line that is not hexadecimal, or too large.
    #[error("invalid chunk size line")]
    ChunkSize,
    /// A chunk-size line, or a trailer section, longer than the decoder keeps.
    #[error("chunk size line or trailers longer than {0} bytes")]
    TooLong(usize),
    /// A chunk's data not followed by CRLF.
    #[error("chunk data not followed by CRLF")]
    ChunkEnd,
    /// A trailer field that is not `name: value`.
    #[error("invalid trailer field")]
    Trailer,
    /// A chunk-size line or a chunk's data ended by a bare LF (refused in a request body).
    #[error("chunk framing line ended by a bare LF")]
    BareLf,
    /// A CR or NUL inside a chunk extension (refused in a request body).
    #[error("CR or NUL in a chunk extension")]
    ChunkExtension,
}

/// The longest chunk-size line (with its extensions) the decoder waits for.
pub const MAX_CHUNK_LINE: usize = 4096;
/// The longest trailer section the decoder keeps.
pub const MAX_TRAILERS: usize = 16 * 1024;

/// Where a chunked body's decoding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunked {
    /// Expecting a chunk-size line.
    Size,
    /// Inside a chunk: this many data bytes to go.
    Data(u64),
    /// After a chunk's data: expecting its CRLF.
    DataEnd,
    /// After the last chunk: the trailer section, up to its empty line.
    Trailers,
}

/// Reads one message body out of the connection's read buffer.
#[derive(Debug)]
pub struct Decoder {
    kind: Kind,
    /// Request-body strictness ([`Decoder::strict`]).
    strict: bool,
}

#[derive(Debug)]
enum Kind {
    Length(u64),
    Chunked(Chunked),
    UntilClose,
    Done,
}

// === impl Decoder ===

impl Decoder {
    /// A decoder for a body of this length.
    pub fn new(length: BodyLength) -> Self {
        let kind = match length {
            BodyLength::Empty | BodyLength::Length(0) => Kind::Done,
            BodyLength::Length(n) => Kind::Length(n),
            BodyLength::Chunked => Kind::Chunked(Chunked::Size),
            BodyLength::UntilClose => Kind::UntilClose,
        };
        Decoder {
            kind,
            strict: false,
        }
    }

    /// A decoder for a client's request body: chunked framing as RFC 9112 §7.1 writes it, with
    /// no leniency a proxy behind or in front of metronome might read differently (a bare LF
    /// ending a chunk-size line or a chunk's data, whitespace before a chunk size, a CR or NUL
    /// in a chunk extension). Upstream responses keep the lenient reading ([`Decoder::new`]).
    pub fn strict(length: BodyLength) -> Self {
        Decoder {
            strict: true,
            ..Decoder::new(length)
        }
    }

    /// Whether the body has ended.
    pub fn is_done(&self) -> bool {
        matches!(self.kind, Kind::Done)
    }

    /// Bytes of the body still to come, when that is known (for the size hint).
    pub fn remaining(&self) -> Option<u64> {
        match self.kind {
            Kind::Length(n) => Some(n),
            Kind::Done => Some(0),
            _ => None,
        }
    }

    /// Takes the next piece of the body, or its end, out of `buf`.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Decoded, DecodeError> {
        loop {
            match &mut self.kind {
                Kind::Done => return Ok(Decoded::End(HeaderMap::new())),
                Kind::UntilClose => {
                    if buf.is_empty() {
                        return Ok(Decoded::NeedMore);
                    }
                    return Ok(Decoded::Data(buf.split().freeze()));
                }
                Kind::Length(remaining) => {
                    if buf.is_empty() {
                        return Ok(Decoded::NeedMore);
                    }
                    let take = take_up_to(buf.len(), *remaining);
                    *remaining -= take as u64;
                    if *remaining == 0 {
                        self.kind = Kind::Done;
                    }
                    return Ok(Decoded::Data(buf.split_to(take).freeze()));
                }
                Kind::Chunked(state) => match *state {
                    Chunked::Size => {
                        let Some((size, used)) = size_line(buf, self.strict)? else {
                            return Ok(Decoded::NeedMore);
                        };
                        // Read in place and skipped: no split of the buffer per chunk line.
                        buf.advance(used);
                        *state = if size == 0 {
                            Chunked::Trailers
                        } else {
                            Chunked::Data(size)
                        };
                    }
                    Chunked::Data(remaining) => {
                        if buf.is_empty() {
                            return Ok(Decoded::NeedMore);
                        }
                        let take = take_up_to(buf.len(), remaining);
                        let left = remaining - take as u64;
                        *state = if left == 0 {
                            Chunked::DataEnd
                        } else {
                            Chunked::Data(left)
                        };
                        return Ok(Decoded::Data(buf.split_to(take).freeze()));
                    }
                    Chunked::DataEnd => {
                        // CR LF, or a bare LF.
                        match (buf.first(), buf.get(1)) {
                            (None, _) | (Some(b'\r'), None) => return Ok(Decoded::NeedMore),
                            (Some(b'\n'), _) if self.strict => return Err(DecodeError::BareLf),
                            (Some(b'\n'), _) => buf.advance(1),
                            (Some(b'\r'), Some(b'\n')) => buf.advance(2),
                            _ => return Err(DecodeError::ChunkEnd),
                        }
                        *state = Chunked::Size;
                    }
                    Chunked::Trailers => {
                        let Some(trailers) = take_trailers(buf)? else {
                            return Ok(Decoded::NeedMore);
                        };
                        self.kind = Kind::Done;
                        return Ok(Decoded::End(trailers));
                    }
                },
            }
        }
    }

    /// What the connection's end means for the body: the end of a body read until close, an
    /// error for any other body not yet complete.
    pub fn eof(&mut self) -> Result<(), Incomplete> {
        match self.kind {
            Kind::Done => Ok(()),
            Kind::UntilClose => {
                self.kind = Kind::Done;
                Ok(())
            }
            _ => Err(Incomplete),
        }
    }
}

/// The peer closed the connection before the body's end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the upstream closed the connection before the body's end")]
pub struct Incomplete;

/// `available` bytes, at most `remaining`.
fn take_up_to(available: usize, remaining: u64) -> usize {
    usize::try_from(remaining).map_or(available, |r| r.min(available))
}

/// The chunk-size line at the start of `buf`: its size and its length with the line end;
/// `None` while it is not whole. `strict` reads it as a request body's ([`Decoder::strict`]).
/// Public so that the fuzz targets can hold it against httparse's `parse_chunk_size`.
#[inline]
pub fn size_line(buf: &[u8], strict: bool) -> Result<Option<(u64, usize)>, DecodeError> {
    if let Some(plain) = plain_size_line(buf) {
        return Ok(Some(plain));
    }
    let Some(end) = line_end(buf, MAX_CHUNK_LINE)? else {
        return Ok(None);
    };
    let size = if strict {
        strict_chunk_size(&buf[..end])?
    } else {
        chunk_size(without_cr(&buf[..end]))?
    };
    Ok(Some((size, end + 1)))
}

/// A chunk-size line as servers write it, hexadecimal digits and CRLF: its size and length, read
/// in one pass. `None` for anything else (extensions, spaces, a bare LF, a line not yet whole),
/// which the general path reads or refuses.
fn plain_size_line(buf: &[u8]) -> Option<(u64, usize)> {
    let mut size: u64 = 0;
    for (i, &b) in buf.iter().enumerate().take(17) {
        let digit = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            b'A'..=b'F' => b - b'A' + 10,
            b'\r' if i > 0 => return (buf.get(i + 1) == Some(&b'\n')).then_some((size, i + 2)),
            _ => return None,
        };
        size = (size << 4) | u64::from(digit);
    }
    None
}

/// Where the line at the start of `buf` ends (the index of its LF); `None` while the line is not
/// complete, an error once it is longer than `max` without its end.
fn line_end(buf: &[u8], max: usize) -> Result<Option<usize>, DecodeError> {
    match memchr::memchr(b'\n', buf) {
        Some(end) if end <= max => Ok(Some(end)),
        Some(_) => Err(DecodeError::TooLong(max)),
        None if buf.len() > max => Err(DecodeError::TooLong(max)),
        None => Ok(None),
    }
}

/// A line without the CR of its CR LF.
fn without_cr(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// The size of a chunk-size line, extensions ignored (`1a;name=value`).
fn chunk_size(line: &[u8]) -> Result<u64, DecodeError> {
    let digits = line
        .iter()
        .position(|&b| b == b';')
        .map_or(line, |semicolon| &line[..semicolon]);
    let digits = trim_ows(digits);
    if digits.is_empty() || digits.len() > 16 {
        return Err(DecodeError::ChunkSize);
    }
    let mut size: u64 = 0;
    for &b in digits {
        let digit = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            b'A'..=b'F' => b - b'A' + 10,
            _ => return Err(DecodeError::ChunkSize),
        };
        size = (size << 4) | u64::from(digit);
    }
    Ok(size)
}

/// The size of a request body's chunk-size line (`line` up to its LF, excluded): it must end in
/// CR LF, start with a hex digit, and carry no CR or NUL in its extensions.
fn strict_chunk_size(line: &[u8]) -> Result<u64, DecodeError> {
    let Some(line) = line.strip_suffix(b"\r") else {
        return Err(DecodeError::BareLf);
    };
    if !line.first().is_some_and(u8::is_ascii_hexdigit) {
        return Err(DecodeError::ChunkSize);
    }
    if let Some(semicolon) = memchr::memchr(b';', line) {
        if memchr::memchr2(b'\r', 0, &line[semicolon..]).is_some() {
            return Err(DecodeError::ChunkExtension);
        }
    }
    chunk_size(line)
}

/// `bytes` without spaces and tabs at either end.
fn trim_ows(bytes: &[u8]) -> &[u8] {
    let start = bytes
        .iter()
        .position(|b| !matches!(b, b' ' | b'\t'))
        .unwrap_or(bytes.len());
    let end = bytes
        .iter()
        .rposition(|b| !matches!(b, b' ' | b'\t'))
        .map_or(start, |p| p + 1);
    &bytes[start..end]
}

/// Takes the trailer section (fields up to an empty line) off `buf` once all of it is there.
fn take_trailers(buf: &mut BytesMut) -> Result<Option<HeaderMap>, DecodeError> {
    // The section ends at the first empty line: LF at the start, or LF (CR) LF.
    let mut end = None;
    let mut line_start = 0;
    for (i, &b) in buf.iter().enumerate() {
        if b == b'\n' {
            let line = &buf[line_start..i];
            if line.is_empty() || line == b"\r" {
                end = Some(i + 1);
                break;
            }
            line_start = i + 1;
        }
        if i >= MAX_TRAILERS {
            return Err(DecodeError::TooLong(MAX_TRAILERS));
        }
    }
    let Some(end) = end else {
        return if buf.len() > MAX_TRAILERS {
            Err(DecodeError::TooLong(MAX_TRAILERS))
        } else {
            Ok(None)
        };
    };
    let section = buf.split_to(end);
    let mut trailers = HeaderMap::new();
    for line in section[..line_start].split(|&b| b == b'\n') {
        let line = without_cr(line);
        if line.is_empty() {
            continue;
        }
        let colon = line
            .iter()
            .position(|&b| b == b':')
            .ok_or(DecodeError::Trailer)?;
        let name = HeaderName::from_bytes(&line[..colon]).map_err(|_| DecodeError::Trailer)?;
        let value = HeaderValue::from_bytes(trim_ows(&line[colon + 1..]))
            .map_err(|_| DecodeError::Trailer)?;
        trailers.append(name, value);
    }
    Ok(Some(trailers))
}

/// Drops what is left of `buf` (used by tests to show nothing was left).
#[cfg(test)]
fn rest(buf: &mut BytesMut) -> Bytes {
    buf.copy_to_bytes(buf.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Feeds `wire` in the given pieces; the body's data, its trailers and the bytes after it.
    fn decode_in_pieces(
        length: BodyLength,
        pieces: &[&[u8]],
    ) -> Result<(Vec<u8>, Option<HeaderMap>, Bytes), DecodeError> {
        let mut decoder = Decoder::new(length);
        let mut buf = BytesMut::new();
        let mut body = Vec::new();
        let mut trailers = None;
        for (i, piece) in pieces.iter().enumerate() {
            buf.extend_from_slice(piece);
            loop {
                match decoder.decode(&mut buf)? {
                    Decoded::Data(d) => {
                        assert!(!d.is_empty(), "no empty data piece");
                        body.extend_from_slice(&d)
                    }
                    Decoded::End(t) => {
                        trailers = Some(t);
                        for later in &pieces[i + 1..] {
                            buf.extend_from_slice(later);
                        }
                        return Ok((body, trailers, rest(&mut buf)));
                    }
                    Decoded::NeedMore => break,
                }
            }
        }
        if decoder.eof().is_ok() && trailers.is_none() {
            trailers = Some(HeaderMap::new());
        }
        Ok((body, trailers, rest(&mut buf)))
    }

    #[test]
    fn plain_size_lines_are_read_in_one_pass_and_others_left_to_the_general_path() {
        assert_eq!(plain_size_line(b"1a\r\ndata"), Some((26, 4)));
        assert_eq!(plain_size_line(b"0\r\n\r\n"), Some((0, 3)));
        assert_eq!(
            plain_size_line(b"FFFFFFFFFFFFFFFF\r\n"),
            Some((u64::MAX, 18))
        );
        for other in [
            &b"1a;x=y\r\n"[..],
            b"1a \r\n",
            b"1a\n",
            b"1a\r",
            b"1a",
            b"\r\n",
            b"10000000000000000\r\n",
            b"g\r\n",
        ] {
            assert_eq!(plain_size_line(other), None, "{other:?}");
        }
    }

    #[test]
    fn a_chunked_body_with_extensions_and_trailers_is_decoded() {
        let wire = b"5;ext=1\r\nhello\r\n7\r\n, world\r\n0\r\nx-usage: 12\r\n\r\nNEXT";
        let (body, trailers, rest) = decode_in_pieces(BodyLength::Chunked, &[wire]).unwrap();
        assert_eq!(body, b"hello, world");
        assert_eq!(trailers.unwrap()["x-usage"], "12");
        assert_eq!(&rest[..], b"NEXT");
    }

    #[test]
    fn each_chunk_is_its_own_piece() {
        let mut decoder = Decoder::new(BodyLength::Chunked);
        let mut buf = BytesMut::from(&b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"[..]);
        assert_eq!(
            decoder.decode(&mut buf),
            Ok(Decoded::Data(Bytes::from("abc")))
        );
        assert_eq!(
            decoder.decode(&mut buf),
            Ok(Decoded::Data(Bytes::from("de")))
        );
        assert_eq!(decoder.decode(&mut buf), Ok(Decoded::End(HeaderMap::new())));
        assert!(decoder.is_done());
        assert!(buf.is_empty());
    }

    #[test]
    fn bare_lf_line_ends_and_upper_case_hex_are_read() {
        let (body, trailers, _) =
            decode_in_pieces(BodyLength::Chunked, &[b"A\nabcdefghij\n0\n\n"]).unwrap();
        assert_eq!(body, b"abcdefghij");
        assert!(trailers.unwrap().is_empty());
    }

    #[test]
    fn broken_chunk_framing_is_an_error() {
        for (wire, expected) in [
            (&b"zz\r\n"[..], DecodeError::ChunkSize),
            (b"\r\n", DecodeError::ChunkSize),
            (b"11111111111111111\r\n", DecodeError::ChunkSize),
            (b"3\r\nabcX\r\n", DecodeError::ChunkEnd),
            (b"0\r\nno colon\r\n\r\n", DecodeError::Trailer),
        ] {
            assert_eq!(
                decode_in_pieces(BodyLength::Chunked, &[wire]).unwrap_err(),
                expected,
                "{}",
                String::from_utf8_lossy(wire)
            );
        }
        let endless = vec![b'1'; MAX_CHUNK_LINE + 2];
        assert_eq!(
            decode_in_pieces(BodyLength::Chunked, &[&endless]).unwrap_err(),
            DecodeError::TooLong(MAX_CHUNK_LINE)
        );
        let mut trailers = b"0\r\n".to_vec();
        trailers.extend(std::iter::repeat_n(b"x-a: b\r\n", MAX_TRAILERS / 8 + 1).flatten());
        assert_eq!(
            decode_in_pieces(BodyLength::Chunked, &[&trailers]).unwrap_err(),
            DecodeError::TooLong(MAX_TRAILERS)
        );
    }

    #[test]
    fn a_strict_decoder_refuses_what_the_lenient_one_reads() {
        let strict = |wire: &[u8]| {
            let mut decoder = Decoder::strict(BodyLength::Chunked);
            let mut buf = BytesMut::from(wire);
            loop {
                match decoder.decode(&mut buf) {
                    Ok(Decoded::Data(_)) => {}
                    Ok(Decoded::End(_)) => return Ok(()),
                    Ok(Decoded::NeedMore) => return Err(None),
                    Err(e) => return Err(Some(e)),
                }
            }
        };
        for (wire, expected) in [
            (&b"3\nabc\r\n0\r\n\r\n"[..], DecodeError::BareLf),
            (b"3;a=b\nabc\r\n0\r\n\r\n", DecodeError::BareLf),
            (b"3\r\nabc\n0\r\n\r\n", DecodeError::BareLf),
            (b" 3\r\nabc\r\n0\r\n\r\n", DecodeError::ChunkSize),
            (b"\t3\r\nabc\r\n0\r\n\r\n", DecodeError::ChunkSize),
            (b"3;a\rb\r\nabc\r\n0\r\n\r\n", DecodeError::ChunkExtension),
            (b"3;a\0b\r\nabc\r\n0\r\n\r\n", DecodeError::ChunkExtension),
            (b"3\r\r\nabc\r\n0\r\n\r\n", DecodeError::ChunkSize),
        ] {
            let shown = String::from_utf8_lossy(wire);
            assert_eq!(strict(wire), Err(Some(expected.clone())), "{shown:?}");
            let lenient = decode_in_pieces(BodyLength::Chunked, &[wire]);
            if expected == DecodeError::BareLf {
                assert!(lenient.is_ok(), "the lenient decoder reads {shown:?}");
            }
        }
        for good in [
            &b"3\r\nabc\r\n0\r\n\r\n"[..],
            b"3;a=b;c=\"d e\"\r\nabc\r\n0\r\n\r\n",
            b"3 ;a=b\r\nabc\r\n0\r\nx-t: 1\r\n\r\n",
        ] {
            assert_eq!(strict(good), Ok(()), "{:?}", String::from_utf8_lossy(good));
        }
    }

    #[test]
    fn a_body_cut_short_is_incomplete_unless_it_runs_until_close() {
        for length in [BodyLength::Chunked, BodyLength::Length(10)] {
            let mut decoder = Decoder::new(length);
            let mut buf = BytesMut::from(&b"5\r\nab"[..]);
            while let Ok(Decoded::Data(_)) = decoder.decode(&mut buf) {}
            assert_eq!(decoder.eof(), Err(Incomplete), "{length:?}");
        }
        let (body, end, _) = decode_in_pieces(BodyLength::UntilClose, &[b"ab", b"cd"]).unwrap();
        assert_eq!(body, b"abcd");
        assert!(end.is_some(), "the close ends it");
    }

    #[test]
    fn a_content_length_body_stops_at_its_length() {
        let (body, end, rest) =
            decode_in_pieces(BodyLength::Length(4), &[b"ab", b"cdEXTRA"]).unwrap();
        assert_eq!(body, b"abcd");
        assert!(end.is_some());
        assert_eq!(&rest[..], b"EXTRA");
        let (body, end, _) = decode_in_pieces(BodyLength::Empty, &[b""]).unwrap();
        assert!(body.is_empty() && end.is_some());
    }

    /// A body as chunks (sizes, extensions, trailers chosen at random) and where its wire is cut.
    fn chunked_wire() -> impl Strategy<Value = (Vec<Vec<u8>>, Vec<u8>, Vec<usize>)> {
        (
            prop::collection::vec(prop::collection::vec(any::<u8>(), 1..300), 0..12),
            any::<bool>(),
            any::<bool>(),
            prop::collection::vec(any::<prop::sample::Index>(), 0..20),
        )
            .prop_map(|(chunks, extensions, trailers, cuts)| {
                let mut wire = Vec::new();
                for (i, chunk) in chunks.iter().enumerate() {
                    // The encoder's line without its CRLF, in lower case every other chunk.
                    let line = crate::http1::encode::ChunkSize::new(chunk.len());
                    let digits = line.as_bytes().strip_suffix(b"\r\n").unwrap();
                    if i % 2 == 0 {
                        wire.extend(digits.iter().map(u8::to_ascii_lowercase));
                    } else {
                        wire.extend_from_slice(digits);
                    }
                    if extensions {
                        wire.extend_from_slice(b"; name=\"v\"");
                    }
                    wire.extend_from_slice(b"\r\n");
                    wire.extend_from_slice(chunk);
                    wire.extend_from_slice(b"\r\n");
                }
                wire.extend_from_slice(b"0\r\n");
                if trailers {
                    wire.extend_from_slice(b"x-one: 1\r\nx-two: 2\r\n");
                }
                wire.extend_from_slice(b"\r\n");
                let len = wire.len();
                let mut cuts: Vec<usize> = cuts.iter().map(|c| c.index(len + 1)).collect();
                cuts.sort_unstable();
                (chunks, wire, cuts)
            })
    }

    /// `wire` cut at `cuts`.
    fn pieces<'a>(wire: &'a [u8], cuts: &[usize]) -> Vec<&'a [u8]> {
        let mut pieces = Vec::new();
        let mut start = 0;
        for &cut in cuts.iter().chain(std::iter::once(&wire.len())) {
            pieces.push(&wire[start..cut]);
            start = cut;
        }
        pieces
    }

    proptest! {
        /// However the upstream's bytes are cut into reads, the body decoded is the body sent,
        /// its end is found exactly, and a chunk's data never comes merged with the next's.
        #[test]
        fn a_chunked_body_decodes_the_same_however_it_is_cut((chunks, wire, cuts) in chunked_wire()) {
            let mut with_next = wire.clone();
            with_next.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
            let (body, trailers, rest) =
                decode_in_pieces(BodyLength::Chunked, &pieces(&with_next, &cuts)).unwrap();
            prop_assert_eq!(body, chunks.concat());
            prop_assert!(trailers.is_some(), "the end was found");
            prop_assert_eq!(&rest[..], b"HTTP/1.1 200 OK\r\n");

            // Pieces never cross a chunk boundary.
            let mut decoder = Decoder::new(BodyLength::Chunked);
            let mut buf = BytesMut::from(&wire[..]);
            let mut starts = vec![0usize];
            let mut total = 0;
            for c in &chunks { total += c.len(); starts.push(total); }
            let mut at = 0;
            while let Ok(Decoded::Data(d)) = decoder.decode(&mut buf) {
                let chunk_end = starts.iter().copied().find(|&s| s > at).unwrap();
                prop_assert!(at + d.len() <= chunk_end);
                at += d.len();
            }
        }

        /// A content-length body stops at its length however it is cut.
        #[test]
        fn a_content_length_body_decodes_the_same_however_it_is_cut(
            body in prop::collection::vec(any::<u8>(), 0..2000),
            cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..10),
        ) {
            let mut wire = body.clone();
            wire.extend_from_slice(b"NEXT");
            let mut cuts: Vec<usize> = cuts.iter().map(|c| c.index(wire.len() + 1)).collect();
            cuts.sort_unstable();
            let (decoded, end, rest) =
                decode_in_pieces(BodyLength::Length(body.len() as u64), &pieces(&wire, &cuts)).unwrap();
            prop_assert_eq!(decoded, body);
            prop_assert!(end.is_some());
            prop_assert_eq!(&rest[..], b"NEXT");
        }
    }
}
