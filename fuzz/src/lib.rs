//! What the fuzz targets share: reading a scanner input (a small header, then the body), cutting
//! a body into frames, the list of token accountants to fuzz, and the upstream body decoder check.

use metronome::format::Accounting;
use metronome::scan::{scan_all, CollectedEvents, Framing, Scanner};

/// Bytes before the body in a scanner input: the bound (1), the seed of the cuts (8).
pub const SCAN_HEADER: usize = 9;

/// A scanner input: the bound on a partial event, where to cut the body, and the body.
#[derive(Debug)]
pub struct ScanInput<'a> {
    /// The scanner's `max_event_bytes`: 1 to 128, or 65536 (the default).
    pub max_event_bytes: usize,
    /// Frame boundaries, sorted and distinct, each inside the body.
    pub cuts: Vec<usize>,
    /// The stream.
    pub body: &'a [u8],
}

// === impl ScanInput ===

impl<'a> ScanInput<'a> {
    /// Reads the header; `None` for inputs shorter than it.
    pub fn parse(data: &'a [u8]) -> Option<Self> {
        if data.len() < SCAN_HEADER {
            return None;
        }
        let bound = data[0];
        let max_event_bytes = if bound & 0x80 == 0 {
            usize::from(bound) + 1
        } else {
            64 * 1024
        };
        let mut seed = u64::from_le_bytes(data[1..9].try_into().ok()?) | 1;
        let body = &data[SCAN_HEADER..];
        let mut next = move || {
            // xorshift64*: the fuzzer controls the seed, so it controls the cuts.
            seed ^= seed >> 12;
            seed ^= seed << 25;
            seed ^= seed >> 27;
            seed.wrapping_mul(0x2545_F491_4F6C_DD1D)
        };
        let count = (next() % 33) as usize;
        let mut cuts: Vec<usize> = (0..count)
            .map(|_| (next() % (body.len() as u64 + 1)) as usize)
            .filter(|c| *c > 0 && *c < body.len())
            .collect();
        cuts.sort_unstable();
        cuts.dedup();
        Some(ScanInput {
            max_event_bytes,
            cuts,
            body,
        })
    }

    /// The body cut into frames.
    pub fn frames(&self) -> Vec<&'a [u8]> {
        let mut frames = Vec::with_capacity(self.cuts.len() + 1);
        let mut start = 0;
        for &cut in &self.cuts {
            frames.push(&self.body[start..cut]);
            start = cut;
        }
        frames.push(&self.body[start..]);
        frames
    }
}

/// Feeds `frames` one by one to a new scanner and collects what it reports.
pub fn scan_frames(framing: Framing, frames: &[&[u8]], max_event_bytes: usize) -> CollectedEvents {
    let mut sink = CollectedEvents::default();
    let mut scanner = Scanner::new(framing, max_event_bytes);
    for frame in frames {
        scanner.feed(frame, &mut sink);
    }
    scanner.finish(&mut sink);
    sink
}

/// The scanner properties: however the body is cut (at the fuzzer's cuts, and byte by byte),
/// the events are those of a one-shot scan; nothing reported exceeds the bound.
pub fn check_scanner(framing: Framing, data: &[u8]) {
    let Some(input) = ScanInput::parse(data) else {
        return;
    };
    let max = input.max_event_bytes;
    let whole = scan_all(framing, input.body, max);
    let cut = scan_frames(framing, &input.frames(), max);
    assert_eq!(cut, whole, "cut at {:?}, bound {max}", input.cuts);
    if input.body.len() <= 2048 {
        let bytewise: Vec<&[u8]> = input.body.chunks(1).collect();
        assert_eq!(
            scan_frames(framing, &bytewise, max),
            whole,
            "byte by byte, bound {max}"
        );
    }
    for (kind, data, truncated) in &whole.events {
        assert!(
            data.len() <= max,
            "an event of {} bytes passed the bound {max}",
            data.len()
        );
        assert!(kind.len() <= 256, "an event type of {} bytes", kind.len());
        if !truncated {
            assert!(data.len() <= input.body.len());
        }
    }
    for (name, value) in &whole.unknown_fields {
        assert!(
            name.len() + value.len() <= max,
            "an unknown field passed the bound {max}"
        );
    }
}

/// Every accountant metronome has, each fresh: one per format, and the detector that picks one
/// from the first events (with and without a hint from the request path).
#[cfg(format_list)]
pub fn accountants() -> Vec<Accounting> {
    use metronome::format::Format;
    let mut all: Vec<Accounting> = Format::ALL
        .iter()
        .map(|f| Accounting::for_format(*f))
        .collect();
    for framing in [Framing::Sse, Framing::Ndjson] {
        all.push(Accounting::select(None, framing, None));
        for hint in Format::ALL {
            all.push(Accounting::select(None, framing, Some(hint)));
        }
    }
    all
}

/// Every accountant metronome has, each fresh: today the OpenAI-compatible one. (Once
/// `Format::ALL` and `Accounting::for_format` exist, build.rs switches to the list above.)
#[cfg(not(format_list))]
pub fn accountants() -> Vec<Accounting> {
    vec![Accounting::openai()]
}

/// The upstream body decoder: cut anywhere, it gives the same data, the same end (or the same
/// error) and leaves the same bytes after the body as when it reads the input whole; no piece of
/// data is empty; it never panics. Input: 1 byte choosing the body's length (chunked, a length,
/// or until close), 8 bytes of cut seed, then the wire.
pub fn check_decoder(data: &[u8]) {
    use metronome::http1::decode::BodyLength;
    let Some(input) = ScanInput::parse(data) else {
        return;
    };
    let length = match data[0] % 4 {
        0 | 1 => BodyLength::Chunked,
        2 => BodyLength::Length(u64::from(data[0]) * 3),
        _ => BodyLength::UntilClose,
    };
    let whole = decode_frames(length, &[input.body]);
    let cut = decode_frames(length, &input.frames());
    assert_eq!(whole, cut, "cut at {:?}", input.cuts);
}

/// The body's data, how it ended, and the bytes left after it.
fn decode_frames(
    length: metronome::http1::decode::BodyLength,
    frames: &[&[u8]],
) -> (Vec<u8>, String, Vec<u8>) {
    decode_frames_with(length, frames, false)
}

/// [`decode_frames`] with the upstream's (lenient) or a request body's (`strict`) decoder.
fn decode_frames_with(
    length: metronome::http1::decode::BodyLength,
    frames: &[&[u8]],
    strict: bool,
) -> (Vec<u8>, String, Vec<u8>) {
    use metronome::http1::decode::{Decoded, Decoder};
    let mut decoder = if strict {
        Decoder::strict(length)
    } else {
        Decoder::new(length)
    };
    let mut buf = bytes::BytesMut::new();
    let mut body = Vec::new();
    for (i, frame) in frames.iter().enumerate() {
        buf.extend_from_slice(frame);
        loop {
            match decoder.decode(&mut buf) {
                Ok(Decoded::Data(data)) => {
                    assert!(!data.is_empty(), "an empty piece of data");
                    body.extend_from_slice(&data);
                }
                Ok(Decoded::End(trailers)) => {
                    for later in &frames[i + 1..] {
                        buf.extend_from_slice(later);
                    }
                    return (
                        body,
                        format!("end, {} trailers", trailers.len()),
                        buf.to_vec(),
                    );
                }
                Ok(Decoded::NeedMore) => break,
                Err(e) => return (body, format!("error: {e}"), Vec::new()),
            }
        }
    }
    let end = match decoder.eof() {
        Ok(()) => "closed: the end".to_string(),
        Err(e) => format!("closed: {e}"),
    };
    (body, end, buf.to_vec())
}

/// The request head reader: never panics; an accepted head is within the input and the limit,
/// the same when read from its own bytes alone, and never framed until close.
pub fn check_request_head(data: &[u8]) {
    use metronome::http1::decode::BodyLength;
    use metronome::http1::server::head::parse_request;
    let Some((&choice, wire)) = data.split_first() else {
        return;
    };
    let max = if choice & 0x80 == 0 {
        usize::from(choice) * 4 + 16
    } else {
        64 * 1024
    };
    let Ok(Some((head, len))) = parse_request(wire, max) else {
        return;
    };
    assert!(len <= wire.len() && len <= max, "head of {len} bytes");
    assert_ne!(head.body, BodyLength::UntilClose);
    let (again, again_len) = parse_request(&wire[..len], max)
        .expect("its own bytes parse")
        .expect("its own bytes are whole");
    assert_eq!(again_len, len);
    assert_eq!(again.body, head.body);
    assert_eq!(again.uri, head.uri);
    assert_eq!(again.headers, head.headers);
}

/// The request body decoder: the strict decoder reads the same however the wire is cut, and
/// every chunk-size line it accepted ended in CRLF.
pub fn check_request_body(data: &[u8]) {
    use metronome::http1::decode::BodyLength;
    let Some(input) = ScanInput::parse(data) else {
        return;
    };
    let length = match data[0] % 4 {
        0..=2 => BodyLength::Chunked,
        _ => BodyLength::Length(u64::from(data[0]) * 3),
    };
    let whole = decode_frames_with(length, &[input.body], true);
    let cut = decode_frames_with(length, &input.frames(), true);
    assert_eq!(whole, cut, "cut at {:?}", input.cuts);
    if length == BodyLength::Chunked {
        check_strict_lines(input.body);
    }
}

/// Walks a chunked wire as the strict decoder reads it and checks each accepted size line.
fn check_strict_lines(mut wire: &[u8]) {
    use metronome::http1::decode::size_line;
    while let Ok(Some((size, used))) = size_line(wire, true) {
        assert!(wire[..used].ends_with(b"\r\n"), "a size line without CRLF");
        assert!(
            wire[0].is_ascii_hexdigit(),
            "a size line not starting with a digit"
        );
        let Some(end) = usize::try_from(size)
            .ok()
            .and_then(|s| s.checked_add(used + 2))
            .filter(|&end| end <= wire.len() && size > 0)
        else {
            return;
        };
        if &wire[end - 2..end] != b"\r\n" {
            return;
        }
        wire = &wire[end..];
    }
}

/// The native client's response head reader: never panics; what it accepts is consumed
/// exactly as httparse measures the head, and transfer-encoding drops content-length.
pub fn check_response_head(data: &[u8]) {
    use metronome::http1::client::parse_head;
    let Some((&choice, wire)) = data.split_first() else {
        return;
    };
    let mut buf = bytes::BytesMut::from(wire);
    let Ok(Some((response, _length, _keep_alive))) = parse_head(&mut buf, choice & 1 == 1) else {
        return;
    };
    let mut fields = [httparse::EMPTY_HEADER; 100];
    let mut reference = httparse::Response::new(&mut fields);
    let Ok(httparse::Status::Complete(len)) = reference.parse(wire) else {
        panic!("native accepted a head httparse does not");
    };
    assert_eq!(buf.len(), wire.len() - len, "consumed other than the head");
    assert_eq!(reference.code, Some(response.status().as_u16()));
    if response
        .headers()
        .contains_key(http::header::TRANSFER_ENCODING)
    {
        assert!(!response
            .headers()
            .contains_key(http::header::CONTENT_LENGTH));
    }
}

/// Native framing against httparse on the same bytes.
pub fn check_framing_differential(data: &[u8]) {
    use metronome::http1::decode::size_line;
    // Chunk-size lines: what the strict reader accepts, httparse reads as the same size and
    // length. (The reverse does not hold, by design: httparse takes an empty size as 0, a NUL
    // in an extension, and a bare LF inside one.)
    if let Ok(Some((size, used))) = size_line(data, true) {
        assert_eq!(
            httparse::parse_chunk_size(data),
            Ok(httparse::Status::Complete((used, size))),
            "{:?}",
            String::from_utf8_lossy(&data[..used])
        );
    }
    // The lenient (upstream) reader, on a CRLF-terminated line httparse accepts, agrees on the
    // size.
    if let (Ok(Some((size, used))), Ok(httparse::Status::Complete((hp_used, hp_size)))) =
        (size_line(data, false), httparse::parse_chunk_size(data))
    {
        if used == hp_used && data[0].is_ascii_hexdigit() {
            assert_eq!(size, hp_size);
        }
    }
    // Request heads: what the native reader accepts, httparse parses to the same length,
    // method, target and fields.
    use metronome::http1::server::head::parse_request;
    if let Ok(Some((head, len))) = parse_request(data, 64 * 1024) {
        let mut fields = [httparse::EMPTY_HEADER; 100];
        let mut reference = httparse::Request::new(&mut fields);
        assert_eq!(reference.parse(data), Ok(httparse::Status::Complete(len)));
        assert_eq!(reference.method, Some(head.method.as_str()));
        assert_eq!(reference.headers.len(), head.headers.len());
        let target = reference.path.and_then(|p| p.parse::<http::Uri>().ok());
        assert_eq!(target, Some(head.uri));
    }
}

/// The WebSocket frame reader: cut anywhere (at the fuzzer's cuts, and byte by byte), it reports
/// exactly what it reports reading the input whole; a message is never longer than the bound, an
/// uncompressed one that fits is as long as its payload on the wire, and every offset lies in
/// what was fed; it never panics. Input: 1 byte of settings (bit 0 the client's direction, bit 1
/// `permessage-deflate`, bit 2 without context takeover), then a scanner input (bound, cut seed,
/// the direction's bytes).
pub fn check_websocket_reader(data: &[u8]) {
    use metronome::websocket::{read_all, Collected, DeflateParams, Direction, Limits};
    let Some((&settings, rest)) = data.split_first() else {
        return;
    };
    let Some(input) = ScanInput::parse(rest) else {
        return;
    };
    let direction = if settings & 1 != 0 {
        Direction::ClientToServer
    } else {
        Direction::ServerToClient
    };
    let deflate = (settings & 2 != 0).then_some(DeflateParams {
        server_no_context_takeover: settings & 4 != 0,
        client_no_context_takeover: settings & 4 != 0,
        ..DeflateParams::default()
    });
    let limits = Limits {
        max_message_bytes: input.max_event_bytes,
        // A message inflating to more is a bomb the reader gives up on: small, so a run is fast.
        max_inflated_bytes: 1 << 20,
    };
    let whole = read_all(direction, deflate, limits, input.body);
    let read_frames = |frames: &[&[u8]]| {
        let mut reader = metronome::websocket::FrameReader::new(direction, deflate, limits);
        let mut sink = metronome::websocket::CollectedEvents::default();
        for frame in frames {
            reader.feed(frame, &mut sink);
        }
        assert_eq!(reader.offset(), input.body.len() as u64);
        sink
    };
    assert_eq!(read_frames(&input.frames()), whole, "cut at {:?}", input.cuts);
    if input.body.len() <= 2048 {
        let bytewise: Vec<&[u8]> = input.body.chunks(1).collect();
        assert_eq!(read_frames(&bytewise), whole, "byte by byte");
    }
    let fed = input.body.len() as u64;
    for event in &whole.events {
        match event {
            Collected::Message {
                data,
                oversize,
                compressed,
                wire_len,
                start,
                end,
                ..
            } => {
                assert!(data.len() <= limits.max_message_bytes);
                if !compressed && !oversize {
                    assert_eq!(data.len() as u64, *wire_len);
                }
                assert!(start < end && *end <= fed);
            }
            Collected::Stopped(_, at) => assert!(*at <= fed),
            _ => {}
        }
    }
    for frame in &whole.frames {
        assert!(frame.start < frame.end && frame.start < fed);
    }
}
